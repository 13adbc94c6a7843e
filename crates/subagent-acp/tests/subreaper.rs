//! The teardown ladder in a process that adopts orphans: as PID 1 of a container without an
//! init, or as a child subreaper (which this test process makes itself, in its own test binary
//! so no other test's children are affected). A child that exits leaving a process it started
//! behind hands that orphan to this process; once the orphan exits it stays a zombie member of
//! the child's process group until reaped, so the teardown must reap it to see the group gone.

#![cfg(target_os = "linux")]

use std::collections::BTreeMap;
use std::time::Duration;

use subagent_acp::Graces;
use subagent_acp::env::child_environment;
use subagent_acp::process::{ChildProcess, SpawnSpec, TeardownReport, TeardownTier};

/// spec: ACP-7 — a child that exits on EOF ends at tier 1 even when it leaves an orphan that
/// was re-parented to this process: the orphan's zombie is reaped, the group vanishes and the
/// teardown returns (before the fix it waited on the zombie forever).
#[tokio::test]
async fn an_orphan_adopted_by_this_process_does_not_keep_the_teardown_waiting() {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).expect("subreaper");
    let dir = tempfile::tempdir().expect("scratch");
    // The shell starts a short-lived helper in its own process group and exits at once.
    let (child, pipes) = ChildProcess::spawn(&SpawnSpec {
        command: "sh".into(),
        args: vec!["-c".into(), "true & exit 0".into()],
        cwd: dir.path().to_path_buf(),
        env: child_environment(std::env::vars_os(), &BTreeMap::new()),
    });
    drop(pipes);
    let graces = Graces {
        eof: Duration::from_secs(3600),
        terminate: Duration::from_secs(3600),
    };
    // A failure guard only: the teardown either returns at tier 1 or waits for good.
    let report = tokio::time::timeout(Duration::from_secs(60), child.teardown(graces))
        .await
        .expect("the teardown does not wait on an adopted zombie");
    match report {
        TeardownReport::Exited { status, tier } => {
            assert_eq!(tier, TeardownTier::Eof);
            assert_eq!(status.and_then(|s| s.code()), Some(0));
        }
        TeardownReport::SpawnFailed(e) => panic!("spawn failed: {e}"),
    }
}
