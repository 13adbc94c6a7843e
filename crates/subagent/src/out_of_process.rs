//! Configuration checks for out-of-process providers (spec §2.19): timing bounds and the
//! child's working directory. A child process gets the deployment's configured `cwd` override
//! when there is one, else the delegating parent session's `cwd` — never the harness process's
//! own directory (one server process serves many sessions, each with its own workspace).
//!
//! The result settlement and run handle of such providers live in [`crate::settle`]; their
//! capability advertisement is [`NO_START_CAPABILITIES`](crate::NO_START_CAPABILITIES).

use std::path::{Component, Path, PathBuf};

/// A plain configuration error of the out-of-process kit. Its `Display` is the full message,
/// prefixed with the consuming provider's diagnostic prefix (`<prefix>: …`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct OutOfProcessError {
    /// The full message.
    pub message: String,
}

impl OutOfProcessError {
    fn new(message: String) -> Self {
        Self { message }
    }
}

/// Checks that a configured timing bound is a positive finite number (it bounds a teardown or
/// shutdown wait; zero, negative, NaN or infinite values would skip or wedge it). Fails with
/// `<prefix>: <name> must be a positive finite number`; returns `value` otherwise.
pub fn assert_positive_finite(prefix: &str, name: &str, value: f64) -> Result<f64, OutOfProcessError> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(OutOfProcessError::new(format!(
            "{prefix}: {name} must be a positive finite number"
        )))
    }
}

/// Whether `path` is an existing directory the process can enter (search permission). Resolving
/// `path/.` needs search permission on `path`, so a directory without it fails here rather than
/// as an ambiguous spawn error later.
fn is_enterable_directory(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_dir()) && std::fs::metadata(path.join(".")).is_ok()
}

/// Checks that `cwd` can host a child: it must be absolute (`<prefix>: <label> must be an
/// absolute path: <cwd>`) and an existing directory the process can enter (`<prefix>: <label>
/// is not an accessible directory: <cwd>`; a regular file fails too). `label` names the source
/// of the value (`config cwd`, `parent session cwd`). Returns `cwd`.
pub fn assert_usable_cwd(prefix: &str, label: &str, cwd: &Path) -> Result<PathBuf, OutOfProcessError> {
    if !cwd.is_absolute() {
        return Err(OutOfProcessError::new(format!(
            "{prefix}: {label} must be an absolute path: {}",
            cwd.display()
        )));
    }
    if !is_enterable_directory(cwd) {
        return Err(OutOfProcessError::new(format!(
            "{prefix}: {label} is not an accessible directory: {}",
            cwd.display()
        )));
    }
    Ok(cwd.to_path_buf())
}

/// Resolves `path` against `base` lexically: `.` components vanish, `..` removes the previous
/// component (never climbing above the root). No filesystem access, no symlink resolution.
fn resolve_lexically(base: &Path, path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in base.join(path).components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Validates a configured `cwd` override once, at provider load: `None` passes through; an
/// empty string fails (`<prefix>: config cwd must not be empty — omit the key to inherit the
/// parent session cwd`); a relative path is resolved lexically against the process's launch directory;
/// the result must pass [`assert_usable_cwd`] with label `config cwd`.
pub fn validate_configured_cwd(
    prefix: &str,
    cwd: Option<&str>,
) -> Result<Option<PathBuf>, OutOfProcessError> {
    let Some(cwd) = cwd else { return Ok(None) };
    if cwd.is_empty() {
        return Err(OutOfProcessError::new(format!(
            "{prefix}: config cwd must not be empty — omit the key to inherit the parent session cwd"
        )));
    }
    let path = Path::new(cwd);
    let resolved = if path.is_absolute() {
        resolve_lexically(Path::new("/"), path)
    } else {
        let launch = std::env::current_dir().map_err(|e| {
            OutOfProcessError::new(format!(
                "{prefix}: config cwd {cwd} is relative and the launch directory is unavailable: {e}"
            ))
        })?;
        resolve_lexically(&launch, path)
    };
    assert_usable_cwd(prefix, "config cwd", &resolved).map(Some)
}

/// The child's working directory at start: the validated `configured` override when present,
/// else the parent session's `cwd` checked with [`assert_usable_cwd`] (label `parent session
/// cwd`); with neither, fails with ``<prefix>: no working directory for the child — configure
/// `cwd` or delegate from a parent session that has one`` (the spec's wording). Never falls back
/// to the process cwd.
pub fn resolve_child_cwd(
    prefix: &str,
    configured: Option<&Path>,
    parent_cwd: Option<&Path>,
) -> Result<PathBuf, OutOfProcessError> {
    if let Some(configured) = configured {
        return Ok(configured.to_path_buf());
    }
    match parent_cwd {
        Some(parent) => assert_usable_cwd(prefix, "parent session cwd", parent),
        None => Err(OutOfProcessError::new(format!(
            "{prefix}: no working directory for the child — configure `cwd` or delegate from a \
             parent session that has one"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A scratch directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "subagent-oop-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o700));
            }
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// spec: OOP-2 — positive finite bounds pass; 0, negatives, NaN and infinity fail with
    /// `<prefix>: <name> must be a positive finite number`.
    #[test]
    fn oop_2_positive_finite_bounds() {
        assert_eq!(assert_positive_finite("p", "graceMs", 1.0), Ok(1.0));
        for bad in [0.0, -5.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0] {
            let err = assert_positive_finite("p", "graceMs", bad).unwrap_err();
            assert_eq!(err.to_string(), "p: graceMs must be a positive finite number");
        }
    }

    /// spec: OOP-3 — an absolute existing directory passes; relative ("must be an absolute
    /// path") and missing ("not an accessible directory") fail.
    #[test]
    fn oop_3_absolute_existing_directory() {
        let tmp = std::env::temp_dir();
        assert_eq!(assert_usable_cwd("p", "config cwd", &tmp), Ok(tmp.clone()));
        let err = assert_usable_cwd("p", "config cwd", Path::new("relative/path")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "p: config cwd must be an absolute path: relative/path"
        );
        let missing = tmp.join("subagent-no-such-dir-xyz");
        let err = assert_usable_cwd("p", "config cwd", &missing).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "p: config cwd is not an accessible directory: {}",
                missing.display()
            )
        );
    }

    /// spec: OOP-4 — a regular file fails as not an accessible directory.
    #[test]
    fn oop_4_regular_file_is_not_a_directory() {
        let scratch = Scratch::new("file");
        let file = scratch.0.join("plain.txt");
        std::fs::write(&file, "not a dir\n").unwrap();
        let err = assert_usable_cwd("p", "config cwd", &file).unwrap_err();
        assert!(
            err.to_string().contains("is not an accessible directory"),
            "{err}"
        );
    }

    /// spec: OOP-5 — a directory without search permission fails (POSIX only). When the test
    /// runs with privileges that bypass permission checks (root), the directory *is* enterable
    /// and the check rightly accepts it; the assertion then is that the check agrees with what
    /// the process can actually do.
    #[cfg(unix)]
    #[test]
    fn oop_5_directory_without_search_permission() {
        use std::os::unix::fs::PermissionsExt;
        let scratch = Scratch::new("noexec");
        std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o600)).unwrap();
        let can_enter = std::fs::read_dir(scratch.0.join(".")).is_ok();
        let verdict = assert_usable_cwd("p", "config cwd", &scratch.0);
        if can_enter {
            assert!(verdict.is_ok(), "an enterable directory must pass");
        } else {
            let err = verdict.unwrap_err();
            assert!(
                err.to_string().contains("is not an accessible directory"),
                "{err}"
            );
        }
    }

    /// spec: OOP-6 — configured cwd: none passes through, empty fails ("config cwd must not be
    /// empty"), a relative path resolves lexically against the launch directory.
    #[test]
    fn oop_6_configured_cwd() {
        assert_eq!(validate_configured_cwd("p", None), Ok(None));
        let err = validate_configured_cwd("p", Some("")).unwrap_err();
        assert!(
            err.to_string().starts_with("p: config cwd must not be empty"),
            "{err}"
        );

        let scratch = Scratch::new("rel");
        let launch = std::env::current_dir().unwrap();
        let ups = launch.components().count() - 1; // every component but the root
        let target = scratch.0.strip_prefix("/").unwrap();
        let relative = format!("{}{}", "../".repeat(ups), target.display());
        let resolved = validate_configured_cwd("p", Some(&relative)).unwrap().unwrap();
        assert_eq!(resolved, scratch.0);
        let dotted = format!("{}/./x/..", scratch.0.display());
        assert_eq!(
            validate_configured_cwd("p", Some(&dotted)).unwrap(),
            Some(scratch.0.clone())
        );
    }

    /// spec: OOP-7 — the override wins; else the parent cwd; neither fails ("no working
    /// directory for the child"); a relative parent cwd fails ("parent session cwd must be an
    /// absolute path").
    #[test]
    fn oop_7_child_cwd_resolution() {
        let tmp = std::env::temp_dir();
        assert_eq!(resolve_child_cwd("p", Some(&tmp), None), Ok(tmp.clone()));
        assert_eq!(
            resolve_child_cwd("p", Some(&tmp), Some(Path::new("/nonexistent"))),
            Ok(tmp.clone())
        );
        assert_eq!(resolve_child_cwd("p", None, Some(&tmp)), Ok(tmp.clone()));
        let err = resolve_child_cwd("p", None, None).unwrap_err();
        assert!(
            err.to_string().contains("no working directory for the child"),
            "{err}"
        );
        let err = resolve_child_cwd("p", None, Some(Path::new("relative/parent"))).unwrap_err();
        assert!(
            err.to_string()
                .contains("parent session cwd must be an absolute path"),
            "{err}"
        );
        insta::assert_snapshot!(format!(
            "{}\n{}",
            validate_configured_cwd("p", Some("")).unwrap_err(),
            resolve_child_cwd("p", None, None).unwrap_err()
        ));
    }

    #[test]
    fn lexical_resolution_never_climbs_above_root() {
        assert_eq!(
            resolve_lexically(Path::new("/a/b"), Path::new("../../../c")),
            PathBuf::from("/c")
        );
        assert_eq!(
            resolve_lexically(Path::new("/a"), Path::new("./b/./c/..")),
            PathBuf::from("/a/b")
        );
    }
}
