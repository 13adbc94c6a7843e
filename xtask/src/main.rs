//! `cargo xtask <command>`: workspace automation.
//!
//! * `check-invariants [--logs DIR]` — without `--logs`: run `cargo test --workspace` with
//!   session-log capture into `target/invariant-traces/` (kept afterwards), then replay every
//!   captured log. With `--logs DIR`: replay an existing directory without running tests.
//!   Prints `replayed <N> logs (<E> events): <V> violations` and fails when `V > 0` or `N == 0`.
//! * `ci` — what `.ci/run` runs.
//! * `bench [CARGO BENCH ARGS]` — the criterion benchmarks (`--workspace` without arguments),
//!   then every figure as a ratio to its floor measured in the same run, against its target.
//!
//! `--help` (or `-h`), alone or after a command, prints the usage and succeeds.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use invariants::{DirReport, RuleId, check_store};

mod bench;

/// The usage of `cargo xtask` as a whole.
const USAGE: &str = "usage: cargo xtask <check-invariants [--logs DIR] | ci | bench [CARGO BENCH ARGS]>";
/// The usage of `cargo xtask check-invariants`.
const CHECK_INVARIANTS_USAGE: &str = "usage: cargo xtask check-invariants [--logs DIR]";
/// The usage of `cargo xtask ci`.
const CI_USAGE: &str = "usage: cargo xtask ci";
/// The usage of `cargo xtask bench`.
const BENCH_USAGE: &str = "usage: cargo xtask bench [CARGO BENCH ARGS] (`cargo bench --help` lists them; \
                           arguments after `--` go to the benchmarks)";

/// What a command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Request<'a> {
    /// Print this usage and succeed (`--help` or `-h`).
    Help(&'static str),
    /// `check-invariants`: run the tests with capture (`None`) or replay a directory.
    CheckInvariants(Option<PathBuf>),
    /// `ci`.
    Ci,
    /// `bench` with these arguments for `cargo bench`.
    Bench(&'a [String]),
}

/// Whether `arg` asks for help.
fn is_help(arg: &str) -> bool {
    matches!(arg, "--help" | "-h")
}

/// Reads the command line (without the program name). `--help` or `-h` anywhere in a command's
/// own arguments asks for that command's usage (for `bench`: before a `--`, after which the
/// arguments are the benchmarks'); an unknown command or argument is an error carrying the
/// usage.
fn parse(args: &[String]) -> Result<Request<'_>, String> {
    let Some((command, rest)) = args.split_first() else {
        return Err(USAGE.to_owned());
    };
    match command.as_str() {
        "help" | "--help" | "-h" => Ok(Request::Help(USAGE)),
        "check-invariants" => match rest {
            _ if rest.iter().any(|a| is_help(a)) => Ok(Request::Help(CHECK_INVARIANTS_USAGE)),
            [] => Ok(Request::CheckInvariants(None)),
            [flag, dir] if flag == "--logs" => Ok(Request::CheckInvariants(Some(PathBuf::from(dir)))),
            _ => Err(CHECK_INVARIANTS_USAGE.to_owned()),
        },
        "ci" => match rest {
            [] => Ok(Request::Ci),
            _ if rest.iter().any(|a| is_help(a)) => Ok(Request::Help(CI_USAGE)),
            _ => Err(CI_USAGE.to_owned()),
        },
        "bench" if rest.iter().take_while(|a| *a != "--").any(|a| is_help(a)) => {
            Ok(Request::Help(BENCH_USAGE))
        }
        "bench" => Ok(Request::Bench(rest)),
        other => Err(format!("{USAGE} (unknown command {other:?})")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = parse(&args).and_then(|request| match request {
        Request::Help(usage) => {
            println!("{usage}");
            Ok(())
        }
        Request::CheckInvariants(logs) => check_invariants(logs),
        Request::Ci => ci(),
        Request::Bench(args) => bench::bench(&cargo(), &workspace_root(), args),
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_owned()
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

/// Without `logs`: runs the workspace's tests with session-log capture, then replays the
/// captured logs; with `logs`: replays that directory.
fn check_invariants(logs: Option<PathBuf>) -> Result<(), String> {
    let dir = match logs {
        Some(dir) => dir,
        None => {
            let dir = workspace_root().join("target").join("invariant-traces");
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
            }
            std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            run(Command::new(cargo())
                .current_dir(workspace_root())
                .args(["test", "--workspace"])
                .env("SUBAGENT_TRACE_DIR", &dir))?;
            dir
        }
    };
    let report = replay_tree(&dir)?;
    println!(
        "replayed {} logs ({} events): {} violations",
        report.logs,
        report.events,
        report.violations.len()
    );
    for v in report.violations.iter().take(50) {
        eprintln!("  {v}");
    }
    if report.violations.len() > 50 {
        eprintln!("  … and {} more", report.violations.len() - 50);
    }
    if !report.violations.is_empty() {
        return Err("session logs break the invariants".into());
    }
    if report.logs == 0 {
        return Err(format!("no session logs found under {}", dir.display()));
    }
    Ok(())
}

/// Whether a directory entry is itself a directory. A symbolic link is not one (even to a
/// directory): like `check_store`, the walk follows no link, so a link back to an ancestor
/// cannot make it revisit a store once per level of the loop.
fn is_real_dir(entry: &std::fs::DirEntry) -> Result<bool, String> {
    entry
        .file_type()
        .map(|t| t.is_dir())
        .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))
}

/// Replays every directory that directly holds `*.jsonl` logs as one store (one directory per
/// test, so session ids may repeat across tests without being duplicates). Symbolic links to
/// directories are not followed.
fn replay_tree(root: &Path) -> Result<DirReport, String> {
    let mut total = DirReport::default();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let mut has_logs = false;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
            let path = entry.path();
            if is_real_dir(&entry)? {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "jsonl") {
                has_logs = true;
            }
        }
        if has_logs {
            let report = check_store_flat(&dir)?;
            total.logs += report.logs;
            total.events += report.events;
            total.violations.extend(report.violations);
        }
    }
    Ok(total)
}

/// `check_store` over one leaf directory. Capture writes logs only into leaf directories (one
/// per test); a directory holding both logs and sub-directories would mix stores, so it is
/// refused rather than guessed at. Capture names each file after a sanitized session id (any
/// character outside `[A-Za-z0-9._-]` becomes `_`), not after the id itself as a store does, so
/// `FILE-ID` — a store's naming rule — is not applied to captured logs.
fn check_store_flat(dir: &Path) -> Result<DirReport, String> {
    let mut has_subdirs = false;
    for entry in std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        has_subdirs |= is_real_dir(&entry)?;
    }
    if has_subdirs {
        return Err(format!(
            "{} holds logs and sub-directories; give each store its own leaf directory",
            dir.display()
        ));
    }
    let mut report = check_store(dir).map_err(|e| e.to_string())?;
    report.violations.retain(|v| v.rule != RuleId::FILE_ID);
    Ok(report)
}

fn ci() -> Result<(), String> {
    let root = workspace_root();
    let cargo_in_root = |args: &[&str]| {
        let mut cmd = Command::new(cargo());
        cmd.current_dir(&root).args(args);
        cmd
    };
    // `check-invariants` runs `cargo test --workspace` itself, with capture: the tests run once.
    check_invariants(None)?;
    run(&mut cargo_in_root(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    run(&mut cargo_in_root(&["fmt", "--all", "--", "--check"]))?;
    run(cargo_in_root(&["doc", "--workspace", "--no-deps"]).env("RUSTDOCFLAGS", "-D warnings"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use invariants::synthetic;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    /// `--help` and `-h` print the usage and succeed, for `cargo xtask` itself and for each
    /// command — instead of failing as a bad argument (`check-invariants`), being handed to
    /// `cargo bench` (`bench`), or being ignored so that the whole CI sequence runs (`ci`).
    #[test]
    fn help_flags_ask_for_the_usage() {
        for flag in ["--help", "-h"] {
            assert_eq!(parse(&args(flag)), Ok(Request::Help(USAGE)));
            for (command, usage) in [
                ("check-invariants", CHECK_INVARIANTS_USAGE),
                ("ci", CI_USAGE),
                ("bench", BENCH_USAGE),
            ] {
                assert_eq!(
                    parse(&args(&format!("{command} {flag}"))),
                    Ok(Request::Help(usage)),
                    "{command} {flag}"
                );
            }
            assert_eq!(
                parse(&args(&format!("check-invariants --logs dir {flag}"))),
                Ok(Request::Help(CHECK_INVARIANTS_USAGE))
            );
            assert_eq!(
                parse(&args(&format!("bench -p agent {flag}"))),
                Ok(Request::Help(BENCH_USAGE))
            );
        }
        assert_eq!(parse(&args("help")), Ok(Request::Help(USAGE)));
    }

    /// Everything else parses as before: a help flag after `--` is the benchmarks' own, and a
    /// bad argument is still an error carrying the usage.
    #[test]
    fn other_command_lines_are_unchanged() {
        assert_eq!(
            parse(&args("check-invariants")),
            Ok(Request::CheckInvariants(None))
        );
        assert_eq!(
            parse(&args("check-invariants --logs d")),
            Ok(Request::CheckInvariants(Some(PathBuf::from("d"))))
        );
        assert_eq!(parse(&args("ci")), Ok(Request::Ci));
        let bench = args("bench -p agent -- --help");
        assert_eq!(parse(&bench), Ok(Request::Bench(&bench[1..])));
        assert_eq!(parse(&args("bench")), Ok(Request::Bench(&[])));
        assert_eq!(
            parse(&args("check-invariants --bogus")),
            Err(CHECK_INVARIANTS_USAGE.to_owned())
        );
        assert_eq!(parse(&args("ci --bogus")), Err(CI_USAGE.to_owned()));
        assert!(parse(&args("frobnicate")).is_err_and(|e| e.contains("unknown command \"frobnicate\"")));
        assert_eq!(parse(&[]), Err(USAGE.to_owned()));
    }

    fn put_log(dir: &Path, id: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join(format!("{id}.jsonl")),
            synthetic::valid_log(id, 1, 1, 0).to_jsonl(),
        )
        .unwrap();
    }

    /// A symbolic link to a directory under `--logs` is not followed, as `check_store` follows
    /// none: a link back to an ancestor neither replays a store once per level of the loop (nor,
    /// with two such links, exponentially often) nor makes a leaf store look like it holds
    /// sub-directories.
    #[cfg(unix)]
    #[test]
    fn links_to_directories_are_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let store = root.path().join("t1");
        put_log(&store, "s");
        std::os::unix::fs::symlink(root.path(), root.path().join("loop")).unwrap();
        let report = replay_tree(root.path()).expect("the tree is readable");
        assert_eq!(report.logs, 1, "{report:?}");
        assert!(report.is_clean(), "{:#?}", report.violations);

        // A link inside a leaf store is not a sub-directory of it.
        std::os::unix::fs::symlink(root.path(), store.join("up")).unwrap();
        let report = replay_tree(root.path()).expect("a link is not a sub-directory");
        assert_eq!(report.logs, 1, "{report:?}");
        assert!(report.is_clean(), "{:#?}", report.violations);
    }
}
