//! Load-time command resolution when the launch directory is gone (spec `acp-and-tools.md`
//! §1.2, §1.4 Rust hint). This binary removes its own working directory, so it holds this one
//! test only: no other test shares the process-wide cwd it breaks.

#![cfg(target_os = "linux")]

use subagent_acp::AcpConfig;

/// spec: §1.4 (Rust hint), §1.2 — a relative command containing a separator is resolved at load
/// against the launch directory, so the child's cwd never decides which program runs. When the
/// launch directory is unavailable that resolution is impossible: load fails with a clear message
/// instead of keeping the relative path, which the spawn would resolve against the child's cwd —
/// the workspace — and so run a different program than configured. A bare name (a `PATH` search)
/// and an absolute path need no launch directory and still load.
#[test]
fn a_relative_command_without_a_launch_directory_fails_load() {
    let scratch = tempfile::tempdir().expect("scratch dir");
    let launch = scratch.path().join("launch");
    std::fs::create_dir(&launch).expect("launch dir");
    std::env::set_current_dir(&launch).expect("enter the launch dir");
    std::fs::remove_dir(&launch).expect("remove the launch dir");
    assert!(
        std::env::current_dir().is_err(),
        "the launch directory is unavailable"
    );

    let err = AcpConfig::new("bin/agent")
        .load()
        .expect_err("a relative command cannot be pinned without a launch directory");
    let message = err.to_string();
    assert!(
        message.starts_with(
            "subagent-acp: command bin/agent is relative and the launch directory is unavailable: "
        ),
        "{message}"
    );

    assert_eq!(
        AcpConfig::new("agent").load().expect("a bare name loads").command,
        std::path::PathBuf::from("agent")
    );
    assert_eq!(
        AcpConfig::new("/usr/bin/agent")
            .load()
            .expect("an absolute path loads")
            .command,
        std::path::PathBuf::from("/usr/bin/agent")
    );
}
