//! [`SubagentRun`]: the caller-owned handle of one accepted delegation (spec §2.7).

use std::sync::Arc;

use agent::{AgentRef, SessionId};
use futures::future::{BoxFuture, Shared};

use crate::error::SharedError;
use crate::result::SubagentResult;

/// An infrastructure fault the seam cannot represent as a stop reason. Cheap to clone so a
/// memoized future can hand it to every awaiting caller.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{0}")]
pub struct RunFailure(pub SharedError);

impl RunFailure {
    /// Wraps any error.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Arc::new(error))
    }
}

/// The memoized result future of a run.
pub type RunResultFuture = Shared<BoxFuture<'static, Result<SubagentResult, RunFailure>>>;

/// The memoized disposal future of a run.
pub type RunDisposeFuture = Shared<BoxFuture<'static, Result<(), RunFailure>>>;

/// A one-time observer of a run's settled result, registered with
/// [`SubagentRun::on_settled`]. It runs synchronously on whatever task settles the result, so it
/// must be quick and must not block.
pub type SettledCallback = Box<dyn FnOnce(&Result<SubagentResult, RunFailure>) + Send>;

/// One accepted delegation.
///
/// # Contract
/// * **Ownership.** The caller owns the run from the moment `start` fulfils and must call
///   [`dispose`](SubagentRun::dispose) on every path, including after consuming the result.
///   The run owns the child; the child may have another owner too (an in-process child is owned
///   by its parent as well, so disposing the parent disposes it).
/// * **Drop.** Implementations that are dropped undisposed dispose in the background (the
///   in-process run on the tokio runtime it was started on, wherever it is dropped) and log a
///   warning. The in-process run logs only at debug level when
///   the request signal had already fired — the expected case of a cancelled caller dropping the
///   run mid-await. Dropping a run does not cancel the request signal.
/// * **`result`** can be awaited any number of times (a [`Shared`] future). It resolves for
///   every child-level ending (model failures resolve with `error`) and fails only for an
///   infrastructure fault.
/// * **`dispose`** is memoized: every call returns the same future. It cancels remaining work
///   and waits for both result settlement and child-resource quiescence. It fails only for an
///   independent resource-release failure; a result failure stays on `result`. The in-process
///   run cancels the child and starts its teardown at the call, and finishes it while the future
///   (or a clone) is polled: await it.
/// * **Cancellation** is the request signal only; there is no `cancel`, `steer` or follow-up.
///   Dropping a `result` or `dispose` future cancels nothing.
/// * **Concurrency.** Every method may be called from any thread, concurrently; the futures may
///   be cloned and awaited on different tasks.
/// * **Panics** fail the futures, not their callers: the in-process run reports a panicking
///   result derivation as a [`RunFailure`] on `result`, and a panicking child teardown as one on
///   `dispose`.
pub trait SubagentRun: Send + Sync + 'static {
    /// The run id (for a local run: the child session id).
    fn id(&self) -> &SessionId;

    /// The exact child agent, for local runs.
    fn local_agent(&self) -> Option<AgentRef>;

    /// The result future.
    fn result(&self) -> RunResultFuture;

    /// The disposal future.
    fn dispose(&self) -> RunDisposeFuture;

    /// Asks the run to call `callback` exactly once, with the settled result, from the task that
    /// settles it — so an observer (the service's `subagent/end` edge) needs no task of its own.
    ///
    /// Returns `Err(callback)`, untouched and uncalled, when the run cannot promise that (the
    /// default, and an implementation whose result already settled may answer so too): the
    /// caller then awaits [`result`](SubagentRun::result) itself. An implementation that
    /// accepts must call the callback on every path on which the result settles, and drop it
    /// uncalled only when the result can never settle (the callback's owner treats such a drop
    /// as a failed result).
    fn on_settled(&self, callback: SettledCallback) -> Result<(), SettledCallback> {
        Err(callback)
    }
}
