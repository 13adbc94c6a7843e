//! [`AcpRun`]: the caller-owned handle of one published ACP child (spec §1.6 step 9–10, §1.10,
//! §1.11, §1.14).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{CancelNotification, SessionId as AcpSessionId};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use parking_lot::Mutex;
use subagent::SubagentResult;
use subagent::agent::{AgentRef, SessionId};
use subagent::run::{RunDisposeFuture, RunFailure, RunResultFuture, SubagentRun};
use subagent::settle::{SubprocessRunHandle, share_error};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Graces;
use crate::connection::Connection;
use crate::process::{ChildProcess, TeardownReport};

/// The single idempotent `request_cancel` step (§1.10): settle locally at once, then send
/// `session/cancel` best-effort.
pub(crate) struct Canceller {
    local: CancellationToken,
    fired: AtomicBool,
    cx: ConnectionTo<agent_client_protocol::Agent>,
    session: AcpSessionId,
}

impl Canceller {
    /// `local` is the run's local cancellation (shared with the connection, whose permission
    /// answers it revokes).
    pub(crate) fn new(
        cx: ConnectionTo<agent_client_protocol::Agent>,
        session: AcpSessionId,
        local: CancellationToken,
    ) -> Self {
        Self {
            local,
            fired: AtomicBool::new(false),
            cx,
            session,
        }
    }

    /// The token that settles the result race locally.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.local
    }

    /// Marks the run cancelled (first call only) and tells the child; a send failure (child
    /// gone) is ignored.
    pub(crate) fn cancel(&self) {
        if self.fired.swap(true, Ordering::SeqCst) {
            return;
        }
        self.local.cancel();
        if let Err(error) = self
            .cx
            .send_notification(CancelNotification::new(self.session.clone()))
        {
            tracing::debug!(%error, "subagent-acp: session/cancel could not be sent");
        }
    }
}

/// What the teardown consumes: the process, its connection and the tasks to await afterwards.
pub(crate) struct TeardownInputs {
    pub(crate) process: ChildProcess,
    pub(crate) connection: Option<Connection>,
    pub(crate) graces: Graces,
    /// Work that must be quiescent before teardown completes (the turn, the abort watch).
    pub(crate) after: Vec<BoxFuture<'static, ()>>,
}

type SharedTeardown = Shared<BoxFuture<'static, Result<(), Arc<String>>>>;

/// One memoized teardown: the first [`start`](Self::start) spawns the ladder on the runtime the
/// run was started on (so it progresses even if nobody polls it, including from `Drop`); every
/// call returns the same completion.
pub(crate) struct TeardownCell {
    runtime: Handle,
    /// `(inputs not yet consumed, the shared completion once started)`; never held across an
    /// `.await`.
    state: Mutex<(Option<TeardownInputs>, Option<SharedTeardown>)>,
    report: Arc<Mutex<Option<TeardownReport>>>,
}

impl TeardownCell {
    pub(crate) fn new(runtime: Handle, inputs: TeardownInputs) -> Arc<Self> {
        Arc::new(Self {
            runtime,
            state: Mutex::new((Some(inputs), None)),
            report: Arc::new(Mutex::new(None)),
        })
    }

    pub(crate) fn is_started(&self) -> bool {
        self.state.lock().1.is_some()
    }

    pub(crate) fn report(&self) -> Option<TeardownReport> {
        self.report.lock().clone()
    }

    pub(crate) fn start(&self) -> SharedTeardown {
        let mut state = self.state.lock();
        if let Some(shared) = &state.1 {
            return shared.clone();
        }
        let shared = match state.0.take() {
            Some(inputs) => {
                let report = self.report.clone();
                let task = self.runtime.spawn(async move {
                    if let Some(connection) = &inputs.connection {
                        connection.close();
                    }
                    let outcome = inputs.process.teardown(inputs.graces).await;
                    if let Some(connection) = inputs.connection {
                        connection.finish().await;
                    }
                    for work in inputs.after {
                        work.await;
                    }
                    *report.lock() = Some(outcome);
                });
                join_shared(task)
            }
            None => futures::future::ready(Ok(())).boxed().shared(),
        };
        state.1 = Some(shared.clone());
        shared
    }
}

fn join_shared(task: JoinHandle<()>) -> SharedTeardown {
    async move {
        task.await
            .map_err(|e| Arc::new(format!("subagent-acp: the teardown task failed: {e}")))
    }
    .boxed()
    .shared()
}

/// A teardown failure (only a panicking teardown task produces one).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TeardownFailed(Arc<String>);

/// One published ACP child run.
///
/// # Contract
/// * **Identity.** [`id`](SubagentRun::id) is a fresh UUID minted by the provider, never the
///   child's ACP session id; [`local_agent`](SubagentRun::local_agent) is always `None`.
/// * **Result.** The prompt was sent at publication on a task of its own; `result` can be
///   awaited any number of times and never fails: child failures resolve `error` (reported once
///   to the provider's failure sink), cancellation resolves `aborted` with the text streamed so
///   far, without waiting for the child.
/// * **Cancellation.** The request signal (or `dispose`) settles the result locally at once and
///   sends `session/cancel` best-effort; process teardown is the hard stop.
/// * **Dispose** is memoized (every call returns the same shared future) and resolves once the
///   child's whole process group has exited (EOF window → SIGTERM → SIGKILL) and the run's tasks
///   have ended. The teardown runs on a task of the runtime the run started on, so it proceeds
///   even if the future is never polled.
/// * **Drop.** A run dropped undisposed starts the same teardown in the background (logging a
///   warning): its child is still reaped.
/// * **Concurrency.** All methods may be called from any thread, concurrently.
pub struct AcpRun {
    handle: SubprocessRunHandle,
    result: RunResultFuture,
    disposal: Mutex<Option<RunDisposeFuture>>,
    teardown: Arc<TeardownCell>,
    pid: Option<u32>,
}

impl fmt::Debug for AcpRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcpRun")
            .field("id", self.handle.id())
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl AcpRun {
    pub(crate) fn new(handle: SubprocessRunHandle, teardown: Arc<TeardownCell>, pid: Option<u32>) -> Self {
        let result = handle
            .result()
            .map(Ok::<SubagentResult, RunFailure>)
            .boxed()
            .shared();
        Self {
            handle,
            result,
            disposal: Mutex::new(None),
            teardown,
            pid,
        }
    }

    /// The child's process id (also its process group id on Unix), when it was known at spawn.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// How the teardown ended the child, once it has completed.
    pub fn teardown_report(&self) -> Option<TeardownReport> {
        self.teardown.report()
    }
}

impl SubagentRun for AcpRun {
    fn id(&self) -> &SessionId {
        self.handle.id()
    }

    fn local_agent(&self) -> Option<AgentRef> {
        None
    }

    fn result(&self) -> RunResultFuture {
        self.result.clone()
    }

    fn dispose(&self) -> RunDisposeFuture {
        let mut disposal = self.disposal.lock();
        if let Some(future) = &*disposal {
            return future.clone();
        }
        let inner = self.handle.dispose();
        let future = async move { inner.await.map_err(RunFailure) }.boxed().shared();
        *disposal = Some(future.clone());
        future
    }
}

impl Drop for AcpRun {
    fn drop(&mut self) {
        if self.disposal.lock().is_none() && !self.teardown.is_started() {
            tracing::warn!(id = %self.handle.id(), "subagent-acp: a run was dropped undisposed; tearing its child down in the background");
            drop(self.handle.dispose());
        }
    }
}

/// Maps the cell's shared teardown into the seam's disposal error type.
pub(crate) fn seam_teardown(
    cell: Arc<TeardownCell>,
) -> BoxFuture<'static, Result<(), subagent::SharedError>> {
    let shared = cell.start();
    async move { shared.await.map_err(|e| share_error(TeardownFailed(e))) }.boxed()
}
