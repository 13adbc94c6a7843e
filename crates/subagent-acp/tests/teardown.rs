//! The teardown ladder on real processes (spec `acp-and-tools.md` §1.11; checklist ACP-7..10).
//! Graces are upper bounds on real process teardown; no test sleeps to wait for a condition.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::*;
use subagent_acp::Graces;
use subagent_acp::env::child_environment;
use subagent_acp::process::{ChildProcess, SpawnSpec, TeardownReport, TeardownTier};

fn spec(command: &str, args: &[&str], cwd: &Path, extra: &[(&str, &str)]) -> SpawnSpec {
    let explicit: BTreeMap<String, String> = extra
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    SpawnSpec {
        command: command.into(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        cwd: cwd.to_path_buf(),
        env: child_environment(std::env::vars_os(), &explicit),
    }
}

fn graces(eof_ms: u64, term_ms: u64) -> Graces {
    Graces {
        eof: Duration::from_millis(eof_ms),
        terminate: Duration::from_millis(term_ms),
    }
}

fn exited(report: TeardownReport) -> (std::process::ExitStatus, TeardownTier) {
    match report {
        TeardownReport::Exited { status, tier } => (status.expect("status observed"), tier),
        TeardownReport::SpawnFailed(e) => panic!("spawn failed: {e}"),
    }
}

/// spec: ACP-7 — tier 1: a child that exits on stdin EOF exits with code 0 and no signal.
#[tokio::test]
async fn acp_7_tier_1_eof() {
    let dir = scratch();
    let (child, pipes) = ChildProcess::spawn(&spec("cat", &[], dir.path(), &[]));
    let pid = child.id().unwrap();
    drop(pipes); // EOF
    let (status, tier) = exited(child.teardown(graces(10_000, 10_000)).await);
    assert_eq!(tier, TeardownTier::Eof);
    assert_eq!(status.code(), Some(0));
    #[cfg(unix)]
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), None);
    assert!(!alive(pid));
}

/// spec: ACP-8 — tier 2: an EOF-deaf child ends by SIGTERM.
#[cfg(unix)]
#[tokio::test]
async fn acp_8_tier_2_sigterm() {
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch();
    let (child, pipes) = ChildProcess::spawn(&spec("sleep", &["60"], dir.path(), &[]));
    let pid = child.id().unwrap();
    drop(pipes);
    let (status, tier) = exited(child.teardown(graces(100, 10_000)).await);
    assert_eq!(tier, TeardownTier::Terminate);
    assert_eq!(status.signal(), Some(15));
    assert!(!alive(pid));
}

/// spec: ACP-9 — tier 3: a SIGTERM-trapping child ends by SIGKILL (after its trap is armed).
#[cfg(unix)]
#[tokio::test]
async fn acp_9_tier_3_sigkill() {
    use std::os::unix::process::ExitStatusExt;
    let dir = scratch();
    let ready = dir.path().join("armed");
    let ready_arg = path_str(&ready);
    let (child, pipes) = ChildProcess::spawn(&spec(
        MOCK,
        &[],
        dir.path(),
        &[("MOCK_TRAP_SIGTERM", "1"), ("MOCK_READY_FILE", &ready_arg)],
    ));
    let pid = child.id().unwrap();
    wait_for(&ready).await;
    drop(pipes);
    let (status, tier) = exited(child.teardown(graces(100, 100)).await);
    assert_eq!(tier, TeardownTier::Kill);
    assert_eq!(status.signal(), Some(9));
    assert!(!alive(pid));
}

/// spec: ACP-10 — teardown of a failed spawn returns cleanly and the spawn failure stays
/// observable.
#[tokio::test]
async fn acp_10_failed_spawn_teardown() {
    let dir = scratch();
    let (child, pipes) = ChildProcess::spawn(&spec("/nonexistent/acp-agent", &[], dir.path(), &[]));
    assert!(pipes.is_none());
    assert_eq!(child.id(), None);
    let kind = child.spawn_error().expect("spawn failure recorded").kind();
    assert_eq!(kind, std::io::ErrorKind::NotFound);
    match child.teardown(graces(100, 100)).await {
        TeardownReport::SpawnFailed(error) => assert_eq!(error.kind(), kind),
        other => panic!("expected the spawn failure, got {other:?}"),
    }
}

/// The ladder waits for the whole process group: a helper the child left behind keeps tier 1
/// from completing and is ended by the group SIGTERM.
#[cfg(unix)]
#[tokio::test]
async fn teardown_reaches_helpers_in_the_group() {
    let dir = scratch();
    let helper_pid = dir.path().join("helper.pid");
    let script = format!("sleep 60 & echo $! > '{}'; exec cat", helper_pid.display());
    let (child, pipes) = ChildProcess::spawn(&spec("sh", &["-c", &script], dir.path(), &[]));
    let pid = child.id().unwrap();
    wait_for(&helper_pid).await;
    drop(pipes);
    let (_, tier) = exited(child.teardown(graces(200, 10_000)).await);
    assert_eq!(
        tier,
        TeardownTier::Terminate,
        "the helper outlived the EOF window"
    );
    // `alive` probes the whole group (the helper is a member), not just the direct child.
    assert!(!alive(pid), "no member of the child's group is left");
}

/// Spawns `sh` running `body` after starting a `sleep 600` helper in the child's process group;
/// returns the child, its pipes and the helper's pid once the helper runs.
#[cfg(target_os = "linux")]
async fn child_with_helper(
    dir: &Path,
    body: &str,
) -> (ChildProcess, Option<subagent_acp::process::ChildPipes>, u32) {
    let helper_pid = dir.join("helper.pid");
    let script = format!("sleep 600 & echo $! > '{}'; exec {body}", helper_pid.display());
    let (child, pipes) = ChildProcess::spawn(&spec("sh", &["-c", &script], dir, &[]));
    wait_for(&helper_pid).await;
    let helper = std::fs::read_to_string(&helper_pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (child, pipes, helper)
}

/// spec: §1.5, §1.11 (Rust hint: "keep a last-resort `kill_on_drop`, signal the group") — a
/// child dropped without a teardown takes its **whole process group** down, not just the direct
/// child: a helper it started is not leaked.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn dropping_a_child_kills_its_whole_group() {
    let dir = scratch();
    let (child, pipes, helper) = child_with_helper(dir.path(), "cat").await;
    drop(child);
    drop(pipes);
    wait_ended(helper, "the dropped child's helper was leaked");
}

/// spec: §1.11 — a teardown cut short (its runtime shut down during the EOF window, as when a
/// host exits with a run still disposing) still ends the whole group: the last resort reaches
/// the helper the EOF window was waiting for.
#[cfg(target_os = "linux")]
#[test]
fn a_teardown_dropped_mid_ladder_kills_the_whole_group() {
    let dir = scratch();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let helper = runtime.block_on(async {
        // `cat` exits at EOF; the helper keeps the group — and so the EOF window — alive.
        let (child, pipes, helper) = child_with_helper(dir.path(), "cat").await;
        let pid = child.id().unwrap();
        drop(pipes);
        let hour = Duration::from_secs(3600);
        let teardown = tokio::spawn(child.teardown(Graces {
            eof: hour,
            terminate: hour,
        }));
        // Wait until `cat` saw EOF and exited: the ladder now waits on the helper alone.
        let deadline = std::time::Instant::now() + BOUND;
        while !process_ended(pid) {
            assert!(std::time::Instant::now() < deadline, "cat never saw EOF");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!teardown.is_finished());
        helper
    });
    drop(runtime);
    wait_ended(helper, "the helper outlived the abandoned teardown");
}
