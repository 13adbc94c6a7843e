//! The child process boundary (spec §1.5) and the teardown ladder (§1.11).
//!
//! A [`ChildProcess`] is spawned as the root of its own process group (Unix), with an explicit
//! environment, piped stdin/stdout and inherited stderr. [`ChildProcess::teardown`] resolves only
//! once the **whole group** has exited: EOF window, then SIGTERM to the group, then SIGKILL.
//!
//! # Ownership and drop
//! The value owns the child and its process group. Dropping it — or dropping a
//! [`teardown`](ChildProcess::teardown) future before it proved the group gone (its task was
//! aborted, its runtime shut down) — is the last resort: SIGKILL to the **whole group** (plus
//! tokio's `kill_on_drop` for the direct child), with reaping left to tokio's orphan reaper and
//! the helpers' new parent. No EOF window or SIGTERM grace is given then. Always tear down.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::config::Graces;

/// How often group liveness is polled once the direct child has been reaped.
const GROUP_POLL: Duration = Duration::from_millis(10);

/// What to spawn.
#[derive(Clone, Debug)]
pub struct SpawnSpec {
    /// The executable.
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// The working directory (absolute).
    pub cwd: PathBuf,
    /// The complete environment (nothing else is inherited).
    pub env: Vec<(OsString, OsString)>,
}

/// The tier of the ladder that ended the child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeardownTier {
    /// The tree exited within the EOF window.
    Eof,
    /// The tree exited within the SIGTERM grace.
    Terminate,
    /// SIGKILL (or, off Unix, forced termination) ended it.
    Kill,
}

/// The outcome of a teardown.
#[derive(Clone, Debug)]
pub enum TeardownReport {
    /// There never was a process: the spawn failed (the failure stays observable here).
    SpawnFailed(Arc<io::Error>),
    /// The whole tree exited.
    Exited {
        /// The direct child's exit status (`None` only if waiting on it failed).
        status: Option<ExitStatus>,
        /// Which tier ended it.
        tier: TeardownTier,
    },
}

/// A spawned (or failed-to-spawn) child process.
#[derive(Debug)]
pub struct ChildProcess {
    state: State,
}

#[derive(Debug)]
enum State {
    Failed(Arc<io::Error>),
    Running {
        child: Child,
        /// The process group (id = the child's pid on Unix), killed if dropped while armed.
        group: GroupGuard,
    },
}

/// The last resort for a child's process group: SIGKILL to the whole group when dropped while
/// armed, so helpers the child started never outlive an abandoned child or teardown. Disarmed
/// only once the teardown proved the group gone; until then the group id cannot name another
/// group (the unreaped direct child, or a live member, keeps it reserved).
#[derive(Debug)]
struct GroupGuard {
    /// The process group id while armed (`None` off Unix, or once disarmed).
    group: Option<u32>,
}

impl GroupGuard {
    fn id(&self) -> Option<u32> {
        self.group
    }

    /// The group is gone: nothing left to kill.
    fn disarm(&mut self) {
        self.group = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(group) = self.group.take() {
            signal_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// The pipes of a freshly spawned child.
#[derive(Debug)]
pub struct ChildPipes {
    /// The child's stdin (protocol out). Dropping it is the EOF signal.
    pub stdin: ChildStdin,
    /// The child's stdout (protocol in).
    pub stdout: ChildStdout,
}

impl ChildProcess {
    /// Spawns `spec`. A spawn-level failure (missing executable, unenterable cwd) is not an
    /// `Err`: it yields a process whose [`spawn_error`](Self::spawn_error) is set and whose
    /// teardown reports it, so callers run one cleanup path either way.
    pub fn spawn(spec: &SpawnSpec) -> (Self, Option<ChildPipes>) {
        let mut command = Command::new(&spec.command);
        command
            .args(&spec.args)
            .current_dir(&spec.cwd)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        #[cfg(unix)]
        command.process_group(0);
        match command.spawn() {
            Ok(mut child) => {
                let pipes = match (child.stdin.take(), child.stdout.take()) {
                    (Some(stdin), Some(stdout)) => Some(ChildPipes { stdin, stdout }),
                    _ => None,
                };
                let group = GroupGuard {
                    group: if cfg!(unix) { child.id() } else { None },
                };
                (
                    Self {
                        state: State::Running { child, group },
                    },
                    pipes,
                )
            }
            Err(error) => (
                Self {
                    state: State::Failed(Arc::new(error)),
                },
                None,
            ),
        }
    }

    /// The spawn failure, when there is no process.
    pub fn spawn_error(&self) -> Option<&Arc<io::Error>> {
        match &self.state {
            State::Failed(error) => Some(error),
            State::Running { .. } => None,
        }
    }

    /// The child's pid, while it has one.
    pub fn id(&self) -> Option<u32> {
        match &self.state {
            State::Running { child, .. } => child.id(),
            State::Failed(_) => None,
        }
    }

    /// The teardown ladder. The caller must have closed (or be closing) the child's stdin: the
    /// EOF window starts at the call. Then, if the tree is still alive, SIGTERM to the group,
    /// `graces.terminate`, SIGKILL, and an unbounded wait for the group to vanish (SIGKILL cannot
    /// be ignored). Off Unix the child is force-terminated right after the EOF window.
    ///
    /// Cancelling (dropping) this future before it completes kills the whole process group
    /// (SIGKILL, the last resort; see the module documentation).
    pub async fn teardown(self, graces: Graces) -> TeardownReport {
        let (mut child, mut guard) = match self.state {
            State::Failed(error) => return TeardownReport::SpawnFailed(error),
            State::Running { child, group } => (child, group),
        };
        let group = guard.id();
        if let Ok(status) = tokio::time::timeout(graces.eof, tree_exit(&mut child, group)).await {
            guard.disarm();
            return TeardownReport::Exited {
                status,
                tier: TeardownTier::Eof,
            };
        }
        #[cfg(unix)]
        if let Some(group) = group {
            signal_group(group, rustix::process::Signal::TERM);
            if let Ok(status) =
                tokio::time::timeout(graces.terminate, tree_exit(&mut child, Some(group))).await
            {
                guard.disarm();
                return TeardownReport::Exited {
                    status,
                    tier: TeardownTier::Terminate,
                };
            }
            signal_group(group, rustix::process::Signal::KILL);
        }
        let _ = child.start_kill();
        let status = tree_exit(&mut child, group).await;
        guard.disarm();
        TeardownReport::Exited {
            status,
            tier: TeardownTier::Kill,
        }
    }
}

/// Waits for the direct child to exit (reaping it), then for its whole process group to vanish.
async fn tree_exit(child: &mut Child, group: Option<u32>) -> Option<ExitStatus> {
    let status = child.wait().await.ok();
    if let Some(group) = group {
        loop {
            reap_adopted(group);
            if !group_alive(group) {
                break;
            }
            tokio::time::sleep(GROUP_POLL).await;
        }
    }
    status
}

/// Reaps the exited members of group `group` that became this process's own children: when
/// the direct child dies before a process it started (a wrapper's helper), the orphan is
/// re-parented to the nearest subreaper — this process when it runs as PID 1 (a container
/// without an init) or was made a child subreaper. Unreaped, such a zombie keeps the group
/// alive for `kill(-pgid, 0)` forever. Only called once the direct child was reaped (by its
/// `Child`), so no status a `Child` waits for is taken; the group is the child's own, so no
/// other child of this process is touched. Returns at once otherwise (`ECHILD`).
#[cfg(unix)]
fn reap_adopted(group: u32) {
    let Some(pgid) = rustix::process::Pid::from_raw(group as i32) else {
        return;
    };
    while let Ok(Some(_)) = rustix::process::waitpgid(pgid, rustix::process::WaitOptions::NOHANG) {}
}

#[cfg(not(unix))]
fn reap_adopted(_group: u32) {}

/// Whether any process of group `group` is still alive (`kill(-pgid, 0)` succeeds).
#[cfg(unix)]
pub fn group_alive(group: u32) -> bool {
    match rustix::process::Pid::from_raw(group as i32) {
        Some(pid) => rustix::process::test_kill_process_group(pid).is_ok(),
        None => false,
    }
}

/// Whether any process of group `group` is still alive (never, off Unix: groups are not used).
#[cfg(not(unix))]
pub fn group_alive(_group: u32) -> bool {
    false
}

#[cfg(unix)]
fn signal_group(group: u32, signal: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(group as i32) {
        // The group may already be gone (ESRCH): nothing to do then.
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}
