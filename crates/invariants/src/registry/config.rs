//! The registry's configuration: global switch and package filters.

use regex::Regex;

use super::error::{ConfigError, FilterList};

/// The registry's configuration (providers §6.1). [`Default`] is the reference's defaults:
/// enabled, both lists empty (admit every package, exclude none).
///
/// List entries are regular-expression sources in the `regex` crate's syntax, matched
/// **unanchored** and **case-sensitively** against the whole package name (write `^…$` to
/// anchor; `/re/flags` literals are not parsed — an inline `(?i)` group is the Rust way to ask
/// for case-insensitivity). A pattern may match no package yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryConfig {
    /// The global switch. A disabled registry still reserves names but runs no installer.
    pub enabled: bool,
    /// When non-empty, only packages matching at least one entry are selected.
    pub package_allowlist: Vec<String>,
    /// Packages matching any entry are never selected (this wins over the allowlist).
    pub package_blocklist: Vec<String>,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            package_allowlist: Vec::new(),
            package_blocklist: Vec::new(),
        }
    }
}

pub(super) fn compile(list: FilterList, entries: &[String]) -> Result<Vec<Regex>, ConfigError> {
    let mut out: Vec<Regex> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        if entry.trim().is_empty() {
            return Err(ConfigError::Blank {
                list,
                entry: entry.clone(),
            });
        }
        if entry.trim() != entry {
            return Err(ConfigError::Padded {
                list,
                entry: entry.clone(),
            });
        }
        if entries[..i].contains(entry) {
            return Err(ConfigError::Duplicate {
                list,
                entry: entry.clone(),
            });
        }
        let re = Regex::new(entry).map_err(|e| ConfigError::Invalid {
            list,
            entry: entry.clone(),
            reason: e.to_string(),
        })?;
        out.push(re);
    }
    Ok(out)
}

/// Whether `package` is a well-formed package name: non-empty, no whitespace anywhere.
pub(super) fn well_formed(package: &str) -> bool {
    !package.is_empty() && !package.chars().any(char::is_whitespace)
}
