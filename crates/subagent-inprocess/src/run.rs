//! [`LocalRun`]: the caller-owned run of one published in-process child (spec
//! `inprocess-providers.md` §3.2 steps 7–9, §3.4, §3.6–§3.8).

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use futures::FutureExt;
use parking_lot::Mutex;
use subagent::SubagentResult;
use subagent::agent::bus::panic_message;
use subagent::agent::{AgentHandle, AgentRef, CancelCause, CancelListener, CancelOptions, SessionId, Signal};
use subagent::run::{RunDisposeFuture, RunFailure, RunResultFuture, SettledCallback, SubagentRun};
use tokio_util::task::TaskTracker;

use crate::result::derive_result;
use crate::structured::StructuredCapture;

/// A handle-disposal failure: the host's teardown of the child panicked, either when
/// [`AgentHandle::dispose`] was called or while its future ran. (The spine's handle disposal is
/// otherwise infallible.)
#[derive(Debug, thiserror::Error)]
#[error("subagent child \"{id}\" handle disposal failed: {message}")]
pub struct HandleDisposalFailed {
    /// The child.
    pub id: SessionId,
    /// The panic's message.
    pub message: String,
}

/// State shared by the run, its result task and its disposal.
///
/// `armed` gates the request-signal listener: while set, the signal firing runs the cancel action
/// once. The action runs synchronously inside the `Signal::cancel` call (through `listener`), or
/// from the result task for a token cancelled behind the signal's back. `cancelled` is the
/// driver's cancellation flag (set by that action or by disposal) read when the result is
/// derived. Both are atomics; the action takes no lock.
pub(crate) struct RunState {
    /// Owns the child (its id is [`id`](Self::id), its agent [`child`](Self::child)).
    handle: AgentHandle,
    /// The runtime the run was launched on (its child's tasks run there): a run dropped
    /// undisposed outside any runtime — on a plain thread, or after its caller's `block_on`
    /// returned — still has its background disposal spawned there.
    runtime: tokio::runtime::Handle,
    armed: AtomicBool,
    cancelled: AtomicBool,
    /// The synchronous request-signal listener, until disarmed.
    listener: Mutex<Option<CancelListener>>,
    /// The observer registered by [`SubagentRun::on_settled`], until the result settles.
    settle: Mutex<Settle>,
}

/// Whether the result settled, and who to tell when it does.
enum Settle {
    Open(Option<SettledCallback>),
    Settled,
}

impl RunState {
    /// The state of a run owning `handle`. Called on a tokio runtime (the driver's start runs
    /// on one), which the run keeps for its background disposal.
    pub(crate) fn new(handle: AgentHandle) -> Arc<Self> {
        Arc::new(Self {
            handle,
            runtime: tokio::runtime::Handle::current(),
            armed: AtomicBool::new(true),
            cancelled: AtomicBool::new(false),
            listener: Mutex::new(None),
            settle: Mutex::new(Settle::Open(None)),
        })
    }

    /// The child's session id (the run's id).
    pub(crate) fn id(&self) -> &SessionId {
        self.handle.id()
    }

    /// The exact child agent.
    pub(crate) fn child(&self) -> &AgentRef {
        self.handle.agent()
    }

    /// Marks the result settled and calls the registered observer, if any, outside the lock.
    /// The call is contained: a panicking observer is logged and never becomes the run's
    /// outcome (every awaiter of the result still gets the child's own).
    fn settled(&self, outcome: &Result<SubagentResult, RunFailure>) {
        let observer = match std::mem::replace(&mut *self.settle.lock(), Settle::Settled) {
            Settle::Open(observer) => observer,
            Settle::Settled => None,
        };
        if let Some(observer) = observer
            && let Err(panic) = catch_unwind(AssertUnwindSafe(|| observer(outcome)))
        {
            tracing::warn!(
                child = %self.id(),
                message = %panic_message(&*panic),
                "subagent run's settled observer panicked; the result stands"
            );
        }
    }

    /// The request-signal listener's action: at most once, while armed, mark the run cancelled
    /// and cancel the child with cause `parent` (which clears its inbox and aborts its turn).
    ///
    /// It runs from the start (the handoff check), inside a `Signal::cancel` call, or from the
    /// result task, so a child whose `cancel` panics (a misbehaving host agent) is contained
    /// here and logged: the run stays cancelled and its result is derived as usual.
    pub(crate) fn fire(&self) {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.cancelled.store(true, Ordering::SeqCst);
            self.cancel_child();
        }
    }

    /// Called once the prompt is in the child's inbox: if the cancel action ran since the start
    /// last looked (another thread's `Signal::cancel` landing between that look and the
    /// delivery), it may have found nothing to cancel yet, so the child is cancelled again — the
    /// delivered prompt's turn is aborted instead of running for a cancelled request.
    ///
    /// Sound under any interleaving: the action stores `cancelled` before it cancels the child,
    /// and this load follows the delivery, so either this load sees the store (and cancels
    /// here) or the action's own cancel comes after the delivery (and aborts it).
    pub(crate) fn cancel_if_fired_during_delivery(&self) {
        if self.is_cancelled() {
            self.cancel_child();
        }
    }

    /// Called when the child is found no longer live — its owner drained it (the parent was
    /// disposed, or the runtime shut down) after publication — either at the prompt's delivery
    /// or when the result is derived. That is a cancellation of the run, so the run counts as
    /// cancelled: its result is `aborted` unless the child's turn completed (spec §3.7 step 4),
    /// never an infrastructure fault, and never `error` for a drain that landed before the
    /// child's turn claimed its prompt (no accounting turn in its log).
    pub(crate) fn drained(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    /// Cancels the child with cause `parent`, containing a panicking `cancel`.
    fn cancel_child(&self) {
        self.cancel_child_with(CancelCause::Parent);
    }

    /// Cancels the child with `cause`, containing a panicking `cancel`.
    fn cancel_child_with(&self, cause: CancelCause) {
        let cancel = || self.child().cancel(cause, CancelOptions::default());
        if let Err(panic) = catch_unwind(AssertUnwindSafe(cancel)) {
            tracing::warn!(
                child = %self.id(),
                message = %panic_message(&*panic),
                "subagent child's cancel panicked; the run stays cancelled"
            );
        }
    }

    /// Installs the request-signal listener (spec §3.2 step 7): a `cancel` of `signal` (or of an
    /// ancestor) runs [`fire`](Self::fire) synchronously, inside that call, so the child's turn
    /// is cancelled before that call returns (not when the result task next runs). The caller
    /// checks the signal once more afterwards: an already-cancelled signal runs no listener.
    pub(crate) fn listen(self: &Arc<Self>, signal: &Signal) {
        let state = Arc::downgrade(self);
        let listener = signal.on_cancel(move || {
            if let Some(state) = state.upgrade() {
                state.fire();
            }
        });
        *self.listener.lock() = Some(listener);
    }

    /// Removes the listener without running it.
    fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
        // Dropped outside the lock: unregistering takes the signal chain's locks.
        let listener = self.listener.lock().take();
        drop(listener);
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

/// What the result task needs besides the shared state.
pub(crate) struct Drive {
    pub(crate) state: Arc<RunState>,
    pub(crate) signal: Signal,
    /// Whether the prompt was delivered (`Ok(true)`), skipped because the run was already
    /// cancelled (`Ok(false)`), or delivery failed (an infrastructure fault).
    pub(crate) delivered: Result<bool, RunFailure>,
    pub(crate) boundary: usize,
    pub(crate) structured: Option<Arc<StructuredCapture>>,
}

/// The panic of a result task, reported as the run's infrastructure fault.
#[derive(Debug, thiserror::Error)]
#[error("subagent result task panicked: {0}")]
struct ResultTaskPanicked(String);

/// The result task: [`drive`], then the settled observer (on every path that settles, a panic
/// included).
async fn settle(d: Drive) -> Result<SubagentResult, RunFailure> {
    let state = d.state.clone();
    let outcome = match AssertUnwindSafe(drive(d)).catch_unwind().await {
        Ok(outcome) => outcome,
        Err(panic) => Err(RunFailure::new(ResultTaskPanicked(panic_message(&*panic)))),
    };
    state.settled(&outcome);
    outcome
}

/// Waits for the child to settle (racing the request signal), then derives the result from its
/// own events. The listener is removed on every path.
async fn drive(d: Drive) -> Result<SubagentResult, RunFailure> {
    let Drive {
        state,
        signal,
        delivered,
        boundary,
        structured,
    } = d;
    let outcome = async {
        if delivered? {
            let idle = state.child().when_idle();
            tokio::pin!(idle);
            // A `Signal::cancel` already ran the action through the listener; the signal branch
            // is the backstop for a token cancelled directly (no listener runs for that). A
            // child that already settled needs no wait on the signal (and no token for it): a
            // cancellation that also landed is handled by the level check below, with the same
            // outcome as the signal branch. So the child is polled once on its own first —
            // `select!` builds every branch's future before it polls any, and the signal's
            // future creates the signal's token.
            if futures::poll!(&mut idle).is_pending() {
                tokio::select! {
                    biased;
                    () = &mut idle => {}
                    () = signal.cancelled() => {
                        state.fire();
                        idle.await;
                    }
                }
            }
        }
        // The token is level-triggered: a cancellation that landed while the child was settling
        // still runs the (one-shot, armed-only) action before the result is read.
        if signal.is_cancelled() {
            state.fire();
        }
        // A child its owner drained was cancelled with the run, whatever its log shows: a drain
        // landing between the turn's start and its claim leaves no accounting turn, which alone
        // would read as `error`.
        if !state.child().is_live() {
            state.drained();
        }
        let events = state.child().session().events();
        let own = &events[boundary.min(events.len())..];
        Ok(derive_result(
            own,
            state.is_cancelled(),
            structured.as_ref().map(|s| s.captured()),
        ))
    }
    .await;
    state.disarm();
    outcome
}

/// The run of one published in-process child: a [`SubagentRun`] whose id is the child's session
/// id and whose local agent is the exact child.
///
/// # Ownership, drop and cancellation
/// * The caller owns the run from the moment the start fulfils and must call
///   [`dispose`](SubagentRun::dispose) on every path. The run owns the child's
///   [`AgentHandle`]; the child is also owned by the parent's scope, so disposing the parent
///   drains it. Unloading the provider does not revoke the run.
/// * **Result.** Derived once, by a task started at publication, from the child's own events
///   (see [`crate::result`]). It resolves for every child-level ending and fails only when the
///   prompt could not be delivered to a live child (an infrastructure fault; a child its owner
///   drained before the delivery — the parent disposed meanwhile — resolves `aborted`). Await
///   it any number of times.
/// * **Cancellation.** The request signal is the only channel: once it fires the child is
///   cancelled with cause `parent` and the result reports `aborted` (a turn that already
///   completed stays `completed`). A [`Signal::cancel`] of the request signal or of an ancestor
///   cancels the child inside that call, not when the result task next runs, so the child's
///   next look at its turn signal already sees it; a token cancelled directly (through
///   [`Signal::token`]) is noticed by the result task instead. A cancel from another thread
///   that lands while the start is delivering the prompt still aborts the delivered prompt's
///   turn. There is no steer, resume or follow-up.
/// * **Dispose** is memoized: at the call it removes the signal listener, marks the run
///   cancelled and starts the handle's quiescence transaction (the child is cancelled with cause
///   `disposed` at once); the rest of that transaction (wait for idle, unwind the child's scope,
///   unregister it and remove its session) runs while the returned future — or any clone of it —
///   is polled, like any Rust future, and that future resolves when both it and the result have
///   settled, each independently. Await it. It fails only when the handle's teardown failed
///   ([`HandleDisposalFailed`], also when the host's disposer panicked at the call or in its
///   future: `dispose` itself never panics, and the run then cancels the child itself, cause
///   `disposed`, so the result still settles); a result failure stays on
///   [`result`](SubagentRun::result).
/// * **Drop** without dispose starts the same disposal in the background (a task on the
///   driver's tracker, so [`InProcessDriver::wait`](crate::InProcessDriver::wait) awaits it,
///   spawned on the runtime the run was started on, even when the drop happens outside any
///   runtime) and logs a warning — unless the request signal had already fired: a caller that
///   drops the run because its own token was cancelled (a cancelled tool call's future is
///   dropped mid-await) made no mistake, so that drop is logged at debug level only. A failure
///   of that background disposal ([`HandleDisposalFailed`]) has no awaiter, so it is logged as
///   a warning.
pub struct LocalRun {
    state: Arc<RunState>,
    result: RunResultFuture,
    dispose: OnceLock<RunDisposeFuture>,
    /// The driver's tracker: the result task and a background disposal run on it.
    tasks: TaskTracker,
}

impl fmt::Debug for LocalRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalRun")
            .field("id", self.state.id())
            .field("cancelled", &self.state.is_cancelled())
            .field("disposed", &self.dispose.get().is_some())
            .finish()
    }
}

impl LocalRun {
    /// Starts the result task on `tasks` (on the run's runtime) and wraps the run.
    pub(crate) fn launch(drive_inputs: Drive, tasks: &TaskTracker) -> Self {
        let state = drive_inputs.state.clone();
        let join = tasks.spawn_on(settle(drive_inputs), &state.runtime);
        let result = join
            .map(|joined| joined.unwrap_or_else(|e| Err(RunFailure::new(e))))
            .boxed()
            .shared();
        Self {
            state,
            result,
            dispose: OnceLock::new(),
            tasks: tasks.clone(),
        }
    }

    /// The child session id.
    pub fn id(&self) -> &SessionId {
        self.state.id()
    }

    /// The exact child agent.
    pub fn child(&self) -> &AgentRef {
        self.state.child()
    }

    /// Whether the run was cancelled (by its request signal or by disposal).
    pub fn is_cancelled(&self) -> bool {
        self.state.is_cancelled()
    }

    fn start_dispose(&self) -> RunDisposeFuture {
        self.dispose
            .get_or_init(|| {
                // Synchronous part: from now on the signal does nothing and the run counts as
                // cancelled; the handle's teardown starts now.
                self.state.disarm();
                self.state.cancelled.store(true, Ordering::SeqCst);
                // A host disposer may panic at the call as well as in its future: both are the
                // handle's failure, reported on this future, never unwound into the caller (nor
                // into `Drop`, where a panic while unwinding aborts the process).
                let teardown = catch_unwind(AssertUnwindSafe(|| self.state.handle.dispose()))
                    .map_err(|panic| panic_message(&*panic));
                if teardown.is_err() {
                    // A disposer that panicked at the call may not have cancelled the child: do
                    // it here, so its turn stops and the result (which this future also waits
                    // for) settles instead of hanging on a child nobody is tearing down.
                    self.state.cancel_child_with(CancelCause::Disposed);
                }
                let result = self.result.clone();
                let id = self.state.id().clone();
                let state = self.state.clone();
                async move {
                    let released = match teardown {
                        // A result that settled already (the caller awaited it first, as most
                        // do) leaves the teardown alone to wait for.
                        Ok(teardown) if result.peek().is_some() => AssertUnwindSafe(teardown)
                            .catch_unwind()
                            .await
                            .map_err(|panic| panic_message(&*panic)),
                        Ok(teardown) => {
                            // A teardown that panics in its future may have done so before it
                            // cancelled the child (a host disposer written as an `async` block
                            // does nothing at the call): cancel it here, as for a panic at the
                            // call, so the result settles instead of waiting on a child nobody
                            // is tearing down.
                            let teardown = async move {
                                let released = AssertUnwindSafe(teardown).catch_unwind().await;
                                if released.is_err() {
                                    state.cancel_child_with(CancelCause::Disposed);
                                }
                                released
                            };
                            let (released, ()) = futures::join!(teardown, settled(result));
                            released.map_err(|panic| panic_message(&*panic))
                        }
                        Err(message) => {
                            settled(result).await;
                            Err(message)
                        }
                    };
                    released.map_err(|message| RunFailure::new(HandleDisposalFailed { id, message }))
                }
                .boxed()
                .shared()
            })
            .clone()
    }
}

/// Resolves once `result` has settled. An already settled result is not awaited: awaiting a
/// shared result that other handles still hold clones its output, only to drop it here.
async fn settled(result: RunResultFuture) {
    if result.peek().is_none() {
        let _settled = result.await;
    }
}

impl SubagentRun for LocalRun {
    fn id(&self) -> &SessionId {
        self.state.id()
    }

    fn local_agent(&self) -> Option<AgentRef> {
        Some(self.state.child().clone())
    }

    fn result(&self) -> RunResultFuture {
        self.result.clone()
    }

    fn dispose(&self) -> RunDisposeFuture {
        self.start_dispose()
    }

    /// Accepted until the result settles; the result task then calls it (on every path that
    /// settles the result, a panicking derivation included). A second registration, or one
    /// after settlement, is handed back. A panicking callback is contained and logged; it does
    /// not change the result.
    fn on_settled(&self, callback: SettledCallback) -> Result<(), SettledCallback> {
        match &mut *self.state.settle.lock() {
            Settle::Open(slot @ None) => {
                *slot = Some(callback);
                Ok(())
            }
            _ => Err(callback),
        }
    }
}

impl Drop for LocalRun {
    fn drop(&mut self) {
        if self.dispose.get().is_some() {
            return;
        }
        if self.state.is_cancelled() {
            // The request signal fired (disposal returned above): the caller dropping the run
            // because its own token was cancelled — as a cancelled tool call does — is expected.
            tracing::debug!(child = %self.state.id(), "cancelled subagent run dropped; disposing in the background");
        } else {
            tracing::warn!(child = %self.state.id(), "subagent run dropped without dispose(); disposing in the background");
        }
        // On the runtime the run was launched on, wherever the drop happens. Once that runtime
        // has shut down nothing can run the disposal; its child's tasks went with it. Nobody
        // awaits this disposal, so a failure it returned would vanish: it is logged instead.
        let dispose = self.start_dispose();
        let child = self.state.id().clone();
        let background = async move {
            if let Err(failure) = dispose.await {
                tracing::warn!(
                    child = %child,
                    error = %failure,
                    "background disposal of a dropped subagent run failed"
                );
            }
        };
        drop(self.tasks.spawn_on(background, &self.state.runtime));
    }
}
