//! Provider configuration and its load-time validation (spec `acp-and-tools.md` §1.2, §1.4).
//!
//! A misconfiguration fails [`AcpConfig::load`] — the Rust form of "plugin load" — never the first
//! delegation. Validation order: the two graces, then an empty `cwd`, then `cwd` resolution (the
//! spec's order), then what the spec leaves to the implementation: the output bound
//! (`maxOutputBytes`), a `command`, `args` and `env` the operating system can pass to a process
//! (no empty command, no NUL byte anywhere, no `=` or empty variable name), then pinning a
//! relative command to the launch directory.
//!
//! `maxOutputBytes` is this crate's extension of the spec's keys (§1.7 sets no bound on the
//! collected text): without it a child that streams `agent_message_chunk` text forever would grow
//! the parent's memory until the run is cancelled. See
//! [`BoundedOutputFold`](crate::connection::BoundedOutputFold) for what happens at the bound.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use subagent::out_of_process::{assert_positive_finite, validate_configured_cwd};

use crate::error::AcpConfigError;

/// The registry name a provider uses when `providerName` is not configured.
pub const DEFAULT_PROVIDER_NAME: &str = "acp";

/// The diagnostic prefix of every message this crate authors.
pub const PREFIX: &str = "subagent-acp";

/// The largest accepted grace, in milliseconds (the largest single timer delay upstream).
pub const MAX_GRACE_MS: f64 = 2_147_483_647.0;

/// Default tier-1 teardown window after stdin EOF, in milliseconds.
pub const DEFAULT_DISPOSE_EOF_GRACE_MS: f64 = 6000.0;

/// Default POSIX wait between SIGTERM and SIGKILL, in milliseconds.
pub const DEFAULT_DISPOSE_GRACE_MS: f64 = 3000.0;

/// Default bound on the child's collected text, in UTF-8 bytes (16 MiB).
pub const DEFAULT_MAX_OUTPUT_BYTES: f64 = 16_777_216.0;

/// The largest accepted `maxOutputBytes` (the largest integer a JSON number holds exactly).
pub const MAX_OUTPUT_BYTES: f64 = 9_007_199_254_740_991.0;

/// How the provider answers the child's `session/request_permission` requests (§1.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PermissionPolicy {
    /// Always answer `cancelled` (the default): the child must not proceed.
    #[default]
    Reject,
    /// Select the first `allow_once`/`allow_always` option in list order; `cancelled` when there
    /// is none.
    Allow,
}

/// The raw, unvalidated configuration of one ACP provider instance, with the spec's key names
/// (`providerName`, `command`, `args`, `cwd`, `permission`, `env`, `disposeEofGraceMs`,
/// `disposeGraceMs`, and this crate's `maxOutputBytes`) when deserialized; an unknown key is
/// refused. Turn it into an [`AcpSettings`] with [`AcpConfig::load`].
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcpConfig {
    /// Registry name (default [`DEFAULT_PROVIDER_NAME`]).
    #[serde(default = "default_name")]
    pub provider_name: String,
    /// Executable spawned per run (required).
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Working-directory override for the child process and its ACP session.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Auto-answer policy for permission requests.
    #[serde(default)]
    pub permission: PermissionPolicy,
    /// Explicit child environment, layered after the credential scrub (§1.5).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Tier-1 teardown window after stdin EOF, in milliseconds.
    #[serde(default = "default_eof_grace")]
    pub dispose_eof_grace_ms: f64,
    /// POSIX wait between SIGTERM and SIGKILL, in milliseconds.
    #[serde(default = "default_grace")]
    pub dispose_grace_ms: f64,
    /// The most UTF-8 bytes of the child's `agent_message_chunk` text a run collects (default
    /// [`DEFAULT_MAX_OUTPUT_BYTES`]); further text is dropped and the output ends with
    /// [`OUTPUT_TRUNCATED_MARKER`](crate::connection::OUTPUT_TRUNCATED_MARKER). An integer from 1
    /// to [`MAX_OUTPUT_BYTES`], validated at load.
    #[serde(default = "default_max_output")]
    pub max_output_bytes: f64,
}

fn default_name() -> String {
    DEFAULT_PROVIDER_NAME.to_owned()
}

fn default_eof_grace() -> f64 {
    DEFAULT_DISPOSE_EOF_GRACE_MS
}

fn default_grace() -> f64 {
    DEFAULT_DISPOSE_GRACE_MS
}

fn default_max_output() -> f64 {
    DEFAULT_MAX_OUTPUT_BYTES
}

/// The validated settings a provider runs with. Immutable once loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct AcpSettings {
    /// Registry name.
    pub provider_name: String,
    /// The executable: resolved against the launch directory at load when it is a relative path
    /// containing a separator (so the child's cwd never changes which program runs); a bare name
    /// is searched on the child's `PATH`.
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// The validated absolute `cwd` override, when configured.
    pub cwd: Option<PathBuf>,
    /// Permission policy.
    pub permission: PermissionPolicy,
    /// Explicit child environment.
    pub env: BTreeMap<String, String>,
    /// Teardown graces.
    pub graces: Graces,
    /// The bound on the child's collected text, in UTF-8 bytes (at least 1).
    pub max_output_bytes: usize,
}

/// The two teardown windows of the ladder (§1.11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Graces {
    /// How long the whole tree may take to exit after stdin EOF.
    pub eof: Duration,
    /// How long the tree may take to exit after SIGTERM before SIGKILL.
    pub terminate: Duration,
}

impl Default for Graces {
    fn default() -> Self {
        Self {
            eof: Duration::from_millis(DEFAULT_DISPOSE_EOF_GRACE_MS as u64),
            terminate: Duration::from_millis(DEFAULT_DISPOSE_GRACE_MS as u64),
        }
    }
}

impl AcpConfig {
    /// A configuration with every key at its default and the given `command`.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            provider_name: default_name(),
            command: command.into(),
            args: Vec::new(),
            cwd: None,
            permission: PermissionPolicy::default(),
            env: BTreeMap::new(),
            dispose_eof_grace_ms: DEFAULT_DISPOSE_EOF_GRACE_MS,
            dispose_grace_ms: DEFAULT_DISPOSE_GRACE_MS,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        }
    }

    /// Validates the configuration (graces, then empty `cwd`, then `cwd` resolution against the
    /// launch directory, then `maxOutputBytes`, then a `command`, `args` and `env` a process can
    /// be given — no empty
    /// command, no NUL byte, no empty or `=`-containing variable name — then pinning a relative
    /// `command` path to the launch directory) and
    /// resolves it into settings. Touches the filesystem only to check the configured `cwd` and
    /// read the launch directory; spawns nothing.
    pub fn load(&self) -> Result<AcpSettings, AcpConfigError> {
        let eof = grace("disposeEofGraceMs", self.dispose_eof_grace_ms)?;
        let terminate = grace("disposeGraceMs", self.dispose_grace_ms)?;
        let cwd = validate_configured_cwd(PREFIX, self.cwd.as_deref()).map_err(AcpConfigError::from)?;
        let max_output_bytes = max_output(self.max_output_bytes)?;
        self.check_process_strings()?;
        let command = resolve_command(&self.command, std::env::current_dir())?;
        Ok(AcpSettings {
            provider_name: self.provider_name.clone(),
            command,
            args: self.args.clone(),
            cwd,
            permission: self.permission,
            env: self.env.clone(),
            graces: Graces { eof, terminate },
            max_output_bytes,
        })
    }
}

impl AcpConfig {
    /// The command, arguments and environment must be passable to a process: otherwise every
    /// spawn would fail (a NUL byte), or the child would see a different environment than the
    /// one configured (a name containing `=` splits into another name and value; an empty name
    /// is no variable at all). Reported at load, never at the first delegation.
    fn check_process_strings(&self) -> Result<(), AcpConfigError> {
        let nul =
            |what: &str| AcpConfigError::new(format!("{PREFIX}: config {what} must not contain a NUL byte"));
        if self.command.is_empty() {
            return Err(AcpConfigError::new(format!(
                "{PREFIX}: config command must not be empty"
            )));
        }
        if self.command.contains('\0') {
            return Err(nul("command"));
        }
        if let Some(i) = self.args.iter().position(|arg| arg.contains('\0')) {
            return Err(nul(&format!("args[{i}]")));
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains(['=', '\0']) {
                return Err(AcpConfigError::new(format!(
                    "{PREFIX}: config env name {name:?} must be non-empty and contain neither '=' nor a NUL byte"
                )));
            }
            if value.contains('\0') {
                return Err(nul(&format!("env {name} value")));
            }
        }
        Ok(())
    }
}

/// Validates one grace: positive and finite (the seam's check), and no greater than
/// [`MAX_GRACE_MS`]. Every failure carries the spec's single range message.
fn grace(name: &str, value: f64) -> Result<Duration, AcpConfigError> {
    let in_range = assert_positive_finite(PREFIX, name, value).is_ok() && value <= MAX_GRACE_MS;
    if !in_range {
        return Err(AcpConfigError::new(format!(
            "{PREFIX}: {name} must be a positive finite number no greater than 2147483647"
        )));
    }
    Ok(Duration::from_secs_f64(value / 1000.0))
}

/// Validates `maxOutputBytes`: an integer from 1 to [`MAX_OUTPUT_BYTES`] (a fraction, zero, a
/// negative, NaN or an infinity fails with one range message). On a target whose `usize` is
/// narrower, the value saturates at `usize::MAX` (no larger text fits in memory anyway).
fn max_output(value: f64) -> Result<usize, AcpConfigError> {
    if !(value.is_finite() && value.fract() == 0.0 && (1.0..=MAX_OUTPUT_BYTES).contains(&value)) {
        return Err(AcpConfigError::new(format!(
            "{PREFIX}: maxOutputBytes must be a positive integer no greater than 9007199254740991"
        )));
    }
    // A float-to-integer `as` cast saturates; the value is a positive integer here.
    Ok(value as usize)
}

/// A relative command path containing a separator is pinned to `launch` (the launch directory);
/// bare names and absolute paths are kept as given. When such a command needs the launch
/// directory and it is unavailable, load fails: keeping the relative path would let the spawn
/// resolve it against the child's cwd and run a different program (spec §1.4 Rust hint).
fn resolve_command(command: &str, launch: std::io::Result<PathBuf>) -> Result<PathBuf, AcpConfigError> {
    let path = Path::new(command);
    if !(path.is_relative() && path.components().count() > 1) {
        return Ok(path.to_path_buf());
    }
    match launch {
        Ok(launch) => Ok(launch.join(path)),
        Err(error) => Err(AcpConfigError::new(format!(
            "{PREFIX}: command {command} is relative and the launch directory is unavailable: {error}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// spec: ACP-38 — graces of 0, −1, NaN, +∞ and max+1 (each field) fail load with the exact
    /// range message; the maximum itself is accepted.
    #[test]
    fn acp_38_grace_range() {
        for field in ["disposeEofGraceMs", "disposeGraceMs"] {
            for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_GRACE_MS + 1.0] {
                let mut config = AcpConfig::new("true");
                if field == "disposeEofGraceMs" {
                    config.dispose_eof_grace_ms = bad;
                } else {
                    config.dispose_grace_ms = bad;
                }
                let err = config.load().unwrap_err();
                assert_eq!(
                    err.to_string(),
                    format!(
                        "subagent-acp: {field} must be a positive finite number no greater than 2147483647"
                    )
                );
            }
        }
        let mut config = AcpConfig::new("true");
        config.dispose_eof_grace_ms = MAX_GRACE_MS;
        config.dispose_grace_ms = 1.0;
        assert!(config.load().is_ok());
    }

    /// `maxOutputBytes` (this crate's extension) must be an integer from 1 to 2^53 − 1: zero,
    /// a negative, a fraction, NaN, ±∞ and max+1 fail load with one range message; 1 and the
    /// maximum load. It is checked after the cwd (the spec's checks come first) and before the
    /// process strings.
    #[test]
    fn max_output_bytes_range() {
        for bad in [
            0.0,
            -1.0,
            0.5,
            1.5,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            MAX_OUTPUT_BYTES + 1.0,
        ] {
            let mut config = AcpConfig::new("true");
            config.max_output_bytes = bad;
            assert_eq!(
                config.load().unwrap_err().to_string(),
                "subagent-acp: maxOutputBytes must be a positive integer no greater than 9007199254740991",
                "{bad}"
            );
            config.cwd = Some(String::new());
            assert!(config.load().unwrap_err().to_string().contains("cwd"));
            config.cwd = None;
            config.command = String::new();
            assert!(config.load().unwrap_err().to_string().contains("maxOutputBytes"));
        }
        for good in [1.0, 1000.0, MAX_OUTPUT_BYTES] {
            let mut config = AcpConfig::new("true");
            config.max_output_bytes = good;
            assert_eq!(config.load().unwrap().max_output_bytes, good as usize);
        }
    }

    /// `maxOutputBytes` deserializes under its camelCase key; other unknown keys are still
    /// refused.
    #[test]
    fn max_output_bytes_key_deserializes() {
        let config: AcpConfig =
            serde_json::from_value(serde_json::json!({"command": "agent", "maxOutputBytes": 4096})).unwrap();
        assert_eq!(config.load().unwrap().max_output_bytes, 4096);
        let unknown = serde_json::from_value::<AcpConfig>(
            serde_json::json!({"command": "agent", "maxOutputByte": 4096}),
        );
        assert!(unknown.unwrap_err().to_string().contains("unknown field"));
    }

    /// Graces are validated before the cwd (spec §1.2 validation order).
    #[test]
    fn graces_are_checked_before_cwd() {
        let mut config = AcpConfig::new("true");
        config.cwd = Some(String::new());
        config.dispose_grace_ms = 0.0;
        assert!(config.load().unwrap_err().to_string().contains("disposeGraceMs"));
    }

    /// The spec's key names deserialize, with the documented defaults.
    #[test]
    fn deserializes_spec_keys_with_defaults() {
        let config: AcpConfig = serde_json::from_value(serde_json::json!({
            "command": "agent", "permission": "allow", "env": {"A": "1"}
        }))
        .unwrap();
        assert_eq!(config.provider_name, "acp");
        assert_eq!(config.permission, PermissionPolicy::Allow);
        assert_eq!(config.dispose_eof_grace_ms, 6000.0);
        assert_eq!(config.dispose_grace_ms, 3000.0);
        assert_eq!(config.max_output_bytes, 16_777_216.0);
        let settings = config.load().unwrap();
        assert_eq!(settings.graces, Graces::default());
        assert_eq!(settings.max_output_bytes, 16 << 20);
        assert_eq!(settings.cwd, None);
    }

    /// spec: §1.4 (Rust hint) — a relative command with a separator cannot be pinned without a
    /// launch directory: resolution fails with a clear message (never keeps the relative path,
    /// which the spawn would resolve against the child's cwd). Bare names and absolute paths need
    /// no launch directory.
    #[test]
    fn relative_command_without_launch_directory_is_an_error() {
        let gone = || Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        let err = resolve_command("bin/agent", gone()).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "subagent-acp: command bin/agent is relative and the launch directory is unavailable: "
            ),
            "{err}"
        );
        assert!(resolve_command("./agent", gone()).is_err());
        assert_eq!(resolve_command("agent", gone()).unwrap(), PathBuf::from("agent"));
        assert_eq!(
            resolve_command("/opt/agent", gone()).unwrap(),
            PathBuf::from("/opt/agent")
        );
        assert_eq!(
            resolve_command("bin/agent", Ok(PathBuf::from("/launch"))).unwrap(),
            PathBuf::from("/launch/bin/agent")
        );
    }

    /// A command, argument or environment entry no process can be given — an empty command, a
    /// NUL byte anywhere, an environment name that is empty or contains `=` — fails load with a
    /// message naming it (never the first delegation, spec §1.2); validated after the cwd.
    #[test]
    fn strings_no_process_can_take_fail_load() {
        type Break = fn(&mut AcpConfig);
        let cases: [(Break, &str); 7] = [
            (
                |c| c.command = String::new(),
                "subagent-acp: config command must not be empty",
            ),
            (
                |c| c.command = "age\0nt".into(),
                "subagent-acp: config command must not contain a NUL byte",
            ),
            (
                |c| c.args = vec!["ok".into(), "b\0d".into()],
                "subagent-acp: config args[1] must not contain a NUL byte",
            ),
            (
                |c| {
                    c.env.insert("A=B".into(), "1".into());
                },
                "subagent-acp: config env name \"A=B\" must be non-empty and contain neither '=' nor a NUL byte",
            ),
            (
                |c| {
                    c.env.insert(String::new(), "1".into());
                },
                "subagent-acp: config env name \"\" must be non-empty and contain neither '=' nor a NUL byte",
            ),
            (
                |c| {
                    c.env.insert("A\0".into(), "1".into());
                },
                "subagent-acp: config env name \"A\\0\" must be non-empty and contain neither '=' nor a NUL byte",
            ),
            (
                |c| {
                    c.env.insert("A".into(), "x\0y".into());
                },
                "subagent-acp: config env A value must not contain a NUL byte",
            ),
        ];
        for (break_it, message) in cases {
            let mut config = AcpConfig::new("agent");
            break_it(&mut config);
            assert_eq!(config.load().unwrap_err().to_string(), message);
            // The cwd is validated first.
            config.cwd = Some(String::new());
            assert!(
                config.load().unwrap_err().to_string().contains("cwd"),
                "{message}"
            );
        }
        // Values may hold `=` and be empty.
        let mut config = AcpConfig::new("agent");
        config.env.insert("A".into(), "b=c".into());
        config.env.insert("E".into(), String::new());
        assert!(config.load().is_ok());
    }

    /// A relative command with a separator is pinned to the launch directory.
    #[test]
    fn relative_command_is_resolved_at_load() {
        let settings = AcpConfig::new("bin/agent").load().unwrap();
        assert_eq!(
            settings.command,
            std::env::current_dir().unwrap().join("bin/agent")
        );
        assert_eq!(
            AcpConfig::new("agent").load().unwrap().command,
            PathBuf::from("agent")
        );
    }
}
