//! Settling runs (spec §2.19): the background-task adapter [`settle_run`] for one-shot runs, and
//! the never-failing result settlement and memoized run handle out-of-process providers build
//! their runs from.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::Arc;

use agent::jobs::{JobOutcome, JobStatus};
use agent::{CancelCause, ContentBlock, SessionId, Signal, content::visible_text};
use futures::future::{BoxFuture, Either, FutureExt, Shared, select};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::error::{SharedError, error_chain};
use crate::result::{StopReason, SubagentResult, cap_diagnostic};

/// How a one-shot background run ended, as the job registry records it (spec §2.19 `settleRun`).
/// Serialized as `{status: "completed", output}`, `{status: "killed"}` or
/// `{status: "failed", detail}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum RunOutcome {
    /// The child completed; `output` is the concatenated text of its output's text blocks.
    Completed {
        /// The final text.
        output: String,
    },
    /// The child was aborted.
    Killed,
    /// Anything else: a non-completed stop reason, a rejected result, or a failed disposal.
    Failed {
        /// What went wrong (see [`settle_run`]).
        detail: String,
    },
}

impl RunOutcome {
    /// Maps a result (spec §2.19): `completed` → [`Completed`](Self::Completed) with the
    /// concatenated text of the text blocks; `aborted` → [`Killed`](Self::Killed); every other
    /// reason, unknown ones included → [`Failed`](Self::Failed) with detail `<reason>`, or
    /// `<reason>; diagnostic: <diagnostic>` when the result carries one. The diagnostic is
    /// bounded by [`cap_diagnostic`] here: the field is public, so a provider may have set it
    /// without [`SubagentResult::with_diagnostic`], and the detail reaches a model.
    pub fn of_result(result: &SubagentResult) -> Self {
        match &result.stop_reason {
            StopReason::Completed => Self::Completed {
                output: visible_text(&result.output),
            },
            StopReason::Aborted => Self::Killed,
            reason => Self::Failed {
                detail: match &result.diagnostic {
                    Some(d) => format!("{reason}; diagnostic: {}", cap_diagnostic(d)),
                    None => reason.to_string(),
                },
            },
        }
    }

    /// The job status this outcome settles a job with.
    pub fn status(&self) -> JobStatus {
        match self {
            Self::Completed { .. } => JobStatus::Completed,
            Self::Killed => JobStatus::Killed,
            Self::Failed { .. } => JobStatus::Failed,
        }
    }

    fn detail(&self) -> Option<&str> {
        match self {
            Self::Failed { detail } => Some(detail),
            _ => None,
        }
    }
}

impl From<RunOutcome> for JobOutcome {
    fn from(outcome: RunOutcome) -> Self {
        let status = outcome.status();
        let (output, detail) = match outcome {
            RunOutcome::Completed { output } => (Some(output), None),
            RunOutcome::Killed => (None, None),
            RunOutcome::Failed { detail } => (None, Some(detail)),
        };
        JobOutcome {
            status,
            output,
            detail,
        }
    }
}

/// Settles a one-shot run into its background-task outcome (spec §2.19 `settleRun`): awaits
/// `result`, **always** disposes (by calling `dispose` and awaiting it) before returning, and
/// maps:
///
/// * a resolved result → [`RunOutcome::of_result`];
/// * a rejected result → `Failed` with the error's chain ([`error_chain`]) as detail;
/// * a failed disposal → `Failed` with `<previous detail>; dispose failed: <error>` (just
///   `dispose failed: <error>` when there was no detail), so both failures survive.
///
/// Never fails. `dispose` is called exactly once, after `result` settled.
pub async fn settle_run<R, E, D, DF, DE>(result: R, dispose: D) -> RunOutcome
where
    R: Future<Output = Result<SubagentResult, E>>,
    E: StdError + 'static,
    D: FnOnce() -> DF,
    DF: Future<Output = Result<(), DE>>,
    DE: StdError + 'static,
{
    let outcome = match result.await {
        Ok(result) => RunOutcome::of_result(&result),
        Err(error) => RunOutcome::Failed {
            detail: error_chain(&error),
        },
    };
    match dispose().await {
        Ok(()) => outcome,
        Err(error) => {
            let prefix = outcome.detail().map(|d| format!("{d}; ")).unwrap_or_default();
            RunOutcome::Failed {
                detail: format!("{prefix}dispose failed: {}", error_chain(&error)),
            }
        }
    }
}

/// A removable reaction to a request's cancellation: the Rust form of "the abort listener a
/// provider registers on the request token at start".
///
/// [`AbortListener::attach`] returns the listener and a *watch* future the provider must drive
/// (typically by spawning it). The watch runs `on_abort` once the signal is cancelled — including
/// when it already is (level-triggered, which closes the handoff race of checking the token
/// after attaching) — unless the listener was [removed](Self::remove) first; removal also ends
/// the watch. Clones share one registration; removal is idempotent.
#[derive(Clone, Debug, Default)]
pub struct AbortListener {
    removed: CancellationToken,
}

impl AbortListener {
    /// Attaches `on_abort` to `signal`. `on_abort` receives the signal's cause (or
    /// [`CancelCause::Disposed`] when the token was cancelled without one). The returned future
    /// completes once the listener fired or was removed; dropping it detaches the reaction.
    pub fn attach<F>(signal: &Signal, on_abort: F) -> (Self, impl Future<Output = ()> + Send + 'static)
    where
        F: FnOnce(CancelCause) + Send + 'static,
    {
        let listener = Self::default();
        let removed = listener.removed.clone();
        let signal = signal.clone();
        let watch = async move {
            let fired = {
                let cancelled = pin!(signal.cancelled());
                let detached = pin!(removed.cancelled());
                matches!(select(cancelled, detached).await, Either::Left(_))
            };
            if fired && !removed.is_cancelled() {
                on_abort(signal.cause().unwrap_or(CancelCause::Disposed));
            }
        };
        (listener, watch)
    }

    /// Removes the listener: a later cancellation no longer reaches it. Idempotent.
    pub fn remove(&self) {
        self.removed.cancel();
    }

    /// Whether the listener was removed.
    pub fn is_removed(&self) -> bool {
        self.removed.is_cancelled()
    }
}

/// Removes a listener when dropped (covers every exit path, including the settling future being
/// dropped).
struct RemoveOnDrop<'a>(&'a AbortListener);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        self.0.remove();
    }
}

/// The diagnostic sink of [`settle_run_result`]: told about a failure that was flattened into a
/// stop reason.
pub type ErrorSink<'a> = Box<dyn FnOnce(&(dyn StdError + 'static), &StopReason) + Send + 'a>;

/// The provider-side inputs of [`settle_run_result`].
pub struct RunSettlement<'a> {
    /// Snapshot of the output collected so far (used when cancellation or failure wins).
    pub collect_output: Box<dyn Fn() -> Vec<ContentBlock> + Send + 'a>,
    /// Snapshot of safe, provider-authored failure detail (used when a failure wins).
    pub collect_diagnostic: Option<Box<dyn Fn() -> Option<String> + Send + 'a>>,
    /// Whether local cancellation has settled the run.
    pub cancelled: Box<dyn Fn() -> bool + Send + 'a>,
    /// Optional diagnostic sink for a failure flattened to `error`; a panic inside it is
    /// contained.
    pub on_error: Option<ErrorSink<'a>>,
    /// The abort listener registered at start; removed on every path.
    pub listener: AbortListener,
}

impl fmt::Debug for RunSettlement<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunSettlement")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

/// Settles an out-of-process run's result under the seam contract (spec §2.19
/// `settleRunResult`): the result never fails after publication.
///
/// * The attempt succeeds → its result, unless local cancellation already settled, then
///   `{output: collect_output(), stopReason: aborted}`.
/// * The attempt fails and cancellation settled → the same aborted result.
/// * Any other failure → `on_error(error, error)` is called once (a panic in it is contained),
///   then `{output: collect_output(), diagnostic?, stopReason: error}` with the collected
///   diagnostic bounded by [`cap_diagnostic`].
///
/// The abort listener is removed on every path (also if this future is dropped).
pub async fn settle_run_result<A, E>(attempt: A, parts: RunSettlement<'_>) -> SubagentResult
where
    A: Future<Output = Result<SubagentResult, E>>,
    E: StdError + 'static,
{
    let _remove = RemoveOnDrop(&parts.listener);
    match attempt.await {
        Ok(result) if !(parts.cancelled)() => result,
        Ok(_) => SubagentResult::aborted((parts.collect_output)()),
        Err(_) if (parts.cancelled)() => SubagentResult::aborted((parts.collect_output)()),
        Err(error) => {
            if let Some(sink) = parts.on_error {
                let reason = StopReason::Error;
                if catch_unwind(AssertUnwindSafe(|| sink(&error, &reason))).is_err() {
                    tracing::warn!("subagent: the run's diagnostic sink panicked; the result stands");
                }
            }
            let mut result = SubagentResult::new((parts.collect_output)(), StopReason::Error);
            if let Some(diagnostic) = parts.collect_diagnostic.as_ref().and_then(|c| c()) {
                result.diagnostic = Some(cap_diagnostic(&diagnostic));
            }
            result
        }
    }
}

/// The memoized disposal future of a run: every caller shares it.
pub type SharedDisposal = Shared<BoxFuture<'static, Result<(), SharedError>>>;

/// The never-failing result future of an out-of-process run, shareable by any number of
/// awaiters.
pub type SharedResult = Shared<BoxFuture<'static, SubagentResult>>;

/// Starts the backend's teardown; called at most once, by the first [`SubprocessRunHandle::dispose`].
pub type Teardown = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), SharedError>> + Send>;

/// The inputs of [`SubprocessRunHandle::new`] (spec §2.19 `subprocessRunHandle`).
pub struct SubprocessRunParts {
    /// The run id, minted unique in the parent's namespace.
    pub id: SessionId,
    /// The flattened, never-failing result (see [`settle_run_result`]).
    pub result: BoxFuture<'static, SubagentResult>,
    /// The abort listener registered on the request signal at start.
    pub listener: AbortListener,
    /// Settles local cancellation so `result` resolves without the child's cooperation.
    pub request_cancel: Box<dyn FnOnce() + Send>,
    /// Tears the child process down to quiescence (the backend's own ladder).
    pub teardown: Teardown,
}

impl fmt::Debug for SubprocessRunParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubprocessRunParts")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

struct PendingDisposal {
    listener: AbortListener,
    request_cancel: Box<dyn FnOnce() + Send>,
    teardown: Teardown,
}

/// The run handle of an out-of-process child (spec §2.19 `subprocessRunHandle`): a **remote**
/// run — it has no local agent and no local session — whose disposal is memoized.
///
/// The first [`dispose`](Self::dispose) call, synchronously: removes the abort listener,
/// requests local cancellation (no assumption that the child cooperates), and starts the
/// teardown; every call (the first included) returns the same shared future, which completes
/// when the teardown reaches quiescence. A panic in `request_cancel` or `teardown` (at the call
/// or while the teardown runs) fails that future with `PROVIDER_FAILED`; it never unwinds into
/// the caller. The service wraps this handle as a `SubagentRun` whose
/// `local_agent()` is `None`.
pub struct SubprocessRunHandle {
    id: SessionId,
    result: SharedResult,
    /// Protects the one-time transition from "not disposed" (parts present) to "disposing"
    /// (shared future present). Never held across an `.await`, nor while provider code runs.
    disposal: Mutex<(Option<PendingDisposal>, Option<SharedDisposal>)>,
}

impl fmt::Debug for SubprocessRunHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubprocessRunHandle")
            .field("id", &self.id)
            .field("disposing", &self.disposal.lock().1.is_some())
            .finish()
    }
}

impl SubprocessRunHandle {
    /// Publishes the handle for an out-of-process child.
    pub fn new(parts: SubprocessRunParts) -> Self {
        Self {
            id: parts.id,
            result: parts.result.shared(),
            disposal: Mutex::new((
                Some(PendingDisposal {
                    listener: parts.listener,
                    request_cancel: parts.request_cancel,
                    teardown: parts.teardown,
                }),
                None,
            )),
        }
    }

    /// The run id.
    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// Whether the run has a local agent: never, for an out-of-process child.
    pub fn is_local(&self) -> bool {
        false
    }

    /// The result; may be awaited any number of times.
    pub fn result(&self) -> SharedResult {
        self.result.clone()
    }

    /// Disposes the run (idempotent; see the type's documentation).
    ///
    /// The provider's closures run after the handle's lock is released, so a closure that
    /// reaches this handle again (its `dispose`, say) gets the shared future instead of
    /// deadlocking.
    pub fn dispose(&self) -> SharedDisposal {
        let (pending, started, shared) = {
            let mut state = self.disposal.lock();
            if let Some(shared) = &state.1 {
                return shared.clone();
            }
            // The shared future is stored before any provider code runs; it drives the teardown
            // this call hands it once the closures below have returned.
            let (started, teardown) = futures::channel::oneshot::channel::<BoxFuture<'static, _>>();
            let shared = async move {
                match teardown.await {
                    Ok(running) => running.await,
                    // Only if this call unwound between storing the future and handing over the
                    // teardown, which the containment below rules out; never report success.
                    Err(_) => Err(teardown_panicked("its disposal", &"the disposal was abandoned")),
                }
            }
            .boxed()
            .shared();
            state.1 = Some(shared.clone());
            (state.0.take(), started, shared)
        };
        let running = match pending {
            Some(pending) => Self::start_teardown(pending),
            // Unreachable by construction (parts are taken exactly when the future is stored);
            // settle as already disposed rather than panic.
            None => futures::future::ready(Ok::<(), SharedError>(())).boxed(),
        };
        // The receiver lives in `shared`, which this call still holds: the send cannot fail.
        let _ = started.send(running);
        shared
    }

    /// The first disposal's synchronous steps: removes the abort listener, requests local
    /// cancellation and starts the teardown, returning the future that completes with it.
    fn start_teardown(pending: PendingDisposal) -> BoxFuture<'static, Result<(), SharedError>> {
        pending.listener.remove();
        // Provider code: a panic (at the call, or while the teardown runs) fails the disposal
        // future, for every caller, rather than unwinding into this caller and leaving the parts
        // taken with no teardown started — which later calls would report as a finished
        // teardown. A panicking cancellation request still starts the teardown.
        let cancel_panic = catch_unwind(AssertUnwindSafe(pending.request_cancel))
            .err()
            .map(|payload| teardown_panicked("its cancellation request", &*payload));
        let teardown = match catch_unwind(AssertUnwindSafe(pending.teardown)) {
            Ok(running) => AssertUnwindSafe(running)
                .catch_unwind()
                .map(|outcome| {
                    outcome.unwrap_or_else(|payload| Err(teardown_panicked("its teardown", &*payload)))
                })
                .boxed(),
            Err(payload) => futures::future::ready(Err(teardown_panicked("its teardown", &*payload))).boxed(),
        };
        match cancel_panic {
            None => teardown,
            Some(error) => async move {
                let _ = teardown.await;
                Err(error)
            }
            .boxed(),
        }
    }
}

/// `PROVIDER_FAILED` for an out-of-process run whose disposal step panicked.
fn teardown_panicked(during: &str, payload: &(dyn std::any::Any + Send)) -> SharedError {
    let message = agent::bus::panic_message(payload);
    tracing::warn!(panic = %message, "subagent: an out-of-process run panicked in {during}; its disposal fails");
    share_error(crate::error::SubagentError::provider_panicked(
        None,
        &format!("run disposal ({during})"),
        &message,
    ))
}

/// Wraps any error as a [`SharedError`].
pub fn share_error(error: impl StdError + Send + Sync + 'static) -> SharedError {
    Arc::new(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Failure(&'static str);

    fn text(s: &str) -> Vec<ContentBlock> {
        vec![ContentBlock::text(s)]
    }

    async fn ok_dispose() -> Result<(), Failure> {
        Ok(())
    }

    /// spec: RUN-1 — completed → completed with the text; aborted → killed; error, max-tokens,
    /// refusal and an unknown reason → failed with the reason as detail.
    #[tokio::test]
    async fn run_1_outcome_mapping() {
        let cases = [
            (
                StopReason::Completed,
                RunOutcome::Completed {
                    output: "partial".into(),
                },
            ),
            (StopReason::Aborted, RunOutcome::Killed),
            (
                StopReason::Error,
                RunOutcome::Failed {
                    detail: "error".into(),
                },
            ),
            (
                StopReason::MaxTokens,
                RunOutcome::Failed {
                    detail: "max-tokens".into(),
                },
            ),
            (
                StopReason::Refusal,
                RunOutcome::Failed {
                    detail: "refusal".into(),
                },
            ),
            (
                StopReason::Other("paused".into()),
                RunOutcome::Failed {
                    detail: "paused".into(),
                },
            ),
        ];
        for (reason, expected) in cases {
            let result = SubagentResult::new(text("partial"), reason);
            let outcome = settle_run(async { Ok::<_, Failure>(result) }, ok_dispose).await;
            assert_eq!(outcome, expected);
        }
        // Only text blocks contribute to the completed output.
        let mixed = SubagentResult::new(
            vec![
                ContentBlock::text("a"),
                ContentBlock::reasoning("hidden"),
                ContentBlock::text("b"),
            ],
            StopReason::Completed,
        );
        assert_eq!(
            RunOutcome::of_result(&mixed),
            RunOutcome::Completed { output: "ab".into() }
        );
        assert_eq!(
            serde_json::to_value(RunOutcome::Failed { detail: "x".into() }).unwrap(),
            serde_json::json!({"status": "failed", "detail": "x"})
        );
        assert_eq!(
            serde_json::to_value(RunOutcome::Killed).unwrap(),
            serde_json::json!({"status": "killed"})
        );
        let job: JobOutcome = RunOutcome::Failed { detail: "x".into() }.into();
        assert_eq!(
            (job.status, job.output, job.detail),
            (JobStatus::Failed, None, Some("x".into()))
        );
        let job: JobOutcome = RunOutcome::Completed { output: "y".into() }.into();
        assert_eq!(
            (job.status, job.output, job.detail),
            (JobStatus::Completed, Some("y".into()), None)
        );
        assert_eq!(JobOutcome::from(RunOutcome::Killed).status, JobStatus::Killed);
    }

    /// A diagnostic set on the public field, past `with_diagnostic`'s bound, is still bounded
    /// in the outcome's detail (cut on a character boundary).
    #[test]
    fn an_unbounded_diagnostic_is_capped_in_the_detail() {
        let mut result = SubagentResult::new(text(""), StopReason::Error);
        result.diagnostic = Some("é".repeat(crate::MAX_DIAGNOSTIC_BYTES));
        let RunOutcome::Failed { detail } = RunOutcome::of_result(&result) else {
            panic!("an error is a failure");
        };
        let diagnostic = detail
            .strip_prefix("error; diagnostic: ")
            .expect("the diagnostic");
        assert!(
            diagnostic.len() <= crate::MAX_DIAGNOSTIC_BYTES,
            "{}",
            diagnostic.len()
        );
        assert!(diagnostic.ends_with(crate::result::DIAGNOSTIC_TRUNCATION_SUFFIX));
    }

    /// spec: RUN-2 — dispose happens before the outcome is reported; a rejected result is
    /// failed with the error after disposing; a failing dispose after success is `dispose
    /// failed: <error>`; both failing keep both details.
    #[tokio::test]
    async fn run_2_dispose_first_and_both_failures_survive() {
        let order = Arc::new(Mutex::new(Vec::<&str>::new()));
        let o = order.clone();
        let outcome = settle_run(
            async { Ok::<_, Failure>(SubagentResult::new(text("ok"), StopReason::Completed)) },
            move || {
                o.lock().push("dispose");
                ok_dispose()
            },
        )
        .await;
        order.lock().push("reported");
        assert_eq!(outcome, RunOutcome::Completed { output: "ok".into() });
        assert_eq!(*order.lock(), ["dispose", "reported"]);

        let disposed = Arc::new(AtomicUsize::new(0));
        let d = disposed.clone();
        let failed = settle_run(
            async { Err::<SubagentResult, _>(Failure("transport gone")) },
            move || {
                d.fetch_add(1, Ordering::SeqCst);
                ok_dispose()
            },
        )
        .await;
        assert_eq!(
            failed,
            RunOutcome::Failed {
                detail: "transport gone".into()
            }
        );
        assert_eq!(disposed.load(Ordering::SeqCst), 1);

        let dispose_failed = settle_run(
            async { Ok::<_, Failure>(SubagentResult::new(vec![], StopReason::Completed)) },
            || async { Err::<(), _>(Failure("reap failed")) },
        )
        .await;
        assert_eq!(
            dispose_failed,
            RunOutcome::Failed {
                detail: "dispose failed: reap failed".into()
            }
        );

        let both = settle_run(
            async { Err::<SubagentResult, _>(Failure("result failed")) },
            || async { Err::<(), _>(Failure("reap failed")) },
        )
        .await;
        assert_eq!(
            both,
            RunOutcome::Failed {
                detail: "result failed; dispose failed: reap failed".into()
            }
        );
    }

    /// spec: RUN-3 — a diagnostic is appended as `error; diagnostic: <text>`.
    #[tokio::test]
    async fn run_3_diagnostic_is_appended() {
        let result = SubagentResult::new(text("partial assistant text"), StopReason::Error)
            .with_diagnostic("the child denied a tool request");
        let outcome = settle_run(async { Ok::<_, Failure>(result) }, ok_dispose).await;
        assert_eq!(
            outcome,
            RunOutcome::Failed {
                detail: "error; diagnostic: the child denied a tool request".into()
            }
        );
    }

    fn settlement<'a>(
        cancelled: bool,
        output: &'a str,
        diagnostic: Option<String>,
    ) -> (RunSettlement<'a>, AbortListener) {
        let listener = AbortListener::default();
        let parts = RunSettlement {
            collect_output: Box::new(move || text(output)),
            collect_diagnostic: diagnostic
                .map(|d| Box::new(move || Some(d.clone())) as Box<dyn Fn() -> Option<String> + Send>),
            cancelled: Box::new(move || cancelled),
            on_error: None,
            listener: listener.clone(),
        };
        (parts, listener)
    }

    /// spec: RUN-4 — through the settlement: an exactly 4096-byte diagnostic is unchanged; an
    /// oversized multibyte one is bounded, marked, free of replacement characters, and the
    /// stop reason is `error`.
    #[tokio::test]
    async fn run_4_settlement_bounds_diagnostics() {
        let exact = "x".repeat(4096);
        let (parts, _) = settlement(false, "", Some(exact.clone()));
        let result = settle_run_result(
            async { Err::<SubagentResult, _>(Failure("provider failed")) },
            parts,
        )
        .await;
        assert_eq!(result.diagnostic.as_deref(), Some(exact.as_str()));

        let (parts, _) = settlement(false, "", Some("权限".repeat(4096)));
        let result = settle_run_result(
            async { Err::<SubagentResult, _>(Failure("provider failed")) },
            parts,
        )
        .await;
        let limited = result.diagnostic.unwrap();
        assert!(limited.len() <= 4096);
        assert!(limited.ends_with("[diagnostic truncated]"));
        assert!(!limited.contains('\u{FFFD}'));
        assert_eq!(result.stop_reason, StopReason::Error);
    }

    /// spec: OOP-8 — a successful attempt passes through and the abort listener is removed (a
    /// later cancellation never reaches it).
    #[tokio::test]
    async fn oop_8_success_passes_through_and_listener_is_removed() {
        let signal = Signal::new();
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let (listener, watch) = AbortListener::attach(&signal, move |_| {
            f.fetch_add(1, Ordering::SeqCst);
        });
        let parts = RunSettlement {
            collect_output: Box::new(Vec::new),
            collect_diagnostic: None,
            cancelled: Box::new(|| false),
            on_error: None,
            listener: listener.clone(),
        };
        let expected = SubagentResult::new(text("done"), StopReason::Completed);
        let e = expected.clone();
        let result = settle_run_result(async { Ok::<_, Failure>(e) }, parts).await;
        assert_eq!(result, expected);
        assert!(listener.is_removed());
        signal.cancel(CancelCause::User);
        watch.await;
        assert_eq!(fired.load(Ordering::SeqCst), 0);
    }

    /// spec: OOP-9 — a failure (or a success) observed after cancellation settled becomes
    /// `aborted` with the collected output.
    #[tokio::test]
    async fn oop_9_cancellation_settled_reads_as_aborted() {
        let (parts, listener) = settlement(true, "partial", None);
        let result = settle_run_result(
            async { Err::<SubagentResult, _>(Failure("pipe torn mid-cancel")) },
            parts,
        )
        .await;
        assert_eq!(result, SubagentResult::aborted(text("partial")));
        assert!(listener.is_removed());
        let (parts, _) = settlement(true, "partial", None);
        let done = SubagentResult::new(text("full"), StopReason::Completed);
        let result = settle_run_result(async { Ok::<_, Failure>(done) }, parts).await;
        assert_eq!(result, SubagentResult::aborted(text("partial")));
    }

    /// spec: OOP-10 — a failure becomes `error` after calling the sink exactly once, even when
    /// the sink panics.
    #[tokio::test]
    async fn oop_10_failure_calls_the_contained_sink_once() {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let s = seen.clone();
        let (mut parts, listener) = settlement(false, "", None);
        parts.on_error = Some(Box::new(move |error, reason| {
            s.lock().push(format!("{reason}:{error}"));
            panic!("sink failure must be contained");
        }));
        let result = settle_run_result(
            async { Err::<SubagentResult, _>(Failure("transport died")) },
            parts,
        )
        .await;
        assert_eq!(result.stop_reason, StopReason::Error);
        assert_eq!(*seen.lock(), ["error:transport died"]);
        assert!(listener.is_removed());
    }

    /// spec: OOP-11 — a failure without a sink becomes `error` (with the collected output and no
    /// diagnostic when none was collected).
    #[tokio::test]
    async fn oop_11_failure_without_sink_is_error() {
        let (parts, _) = settlement(false, "so far", None);
        let result = settle_run_result(
            async { Err::<SubagentResult, _>(Failure("no sink configured")) },
            parts,
        )
        .await;
        assert_eq!(result, SubagentResult::new(text("so far"), StopReason::Error));
    }

    /// spec: OOP-12 — the handle has no local agent, keeps its id, `dispose` is memoized (every
    /// call returns the same future), requests cancellation and teardown exactly once, and
    /// removes the abort listener before cancelling.
    #[tokio::test]
    async fn oop_12_subprocess_handle_disposes_once() {
        let signal = Signal::new();
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let (listener, watch) = AbortListener::attach(&signal, move |_| {
            f.fetch_add(1, Ordering::SeqCst);
        });
        let cancels = Arc::new(AtomicUsize::new(0));
        let teardowns = Arc::new(AtomicUsize::new(0));
        let (c, t, l) = (cancels.clone(), teardowns.clone(), listener.clone());
        let handle = SubprocessRunHandle::new(SubprocessRunParts {
            id: "run-1".into(),
            result: async { SubagentResult::new(vec![], StopReason::Completed) }.boxed(),
            listener,
            request_cancel: Box::new(move || {
                assert!(l.is_removed(), "the listener is removed before cancelling");
                c.fetch_add(1, Ordering::SeqCst);
            }),
            teardown: Box::new(move || {
                t.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }.boxed()
            }),
        });
        assert!(!handle.is_local());
        assert_eq!(handle.id().as_str(), "run-1");
        let first = handle.dispose();
        let second = handle.dispose();
        assert!(first.ptr_eq(&second));
        first.await.unwrap();
        second.await.unwrap();
        handle.dispose().await.unwrap();
        assert_eq!(cancels.load(Ordering::SeqCst), 1);
        assert_eq!(teardowns.load(Ordering::SeqCst), 1);
        signal.cancel(CancelCause::Parent);
        watch.await;
        assert_eq!(fired.load(Ordering::SeqCst), 0);
        assert_eq!(handle.result().await.stop_reason, StopReason::Completed);
        assert_eq!(handle.result().await.stop_reason, StopReason::Completed);
    }

    #[tokio::test]
    async fn teardown_failure_is_shared_by_every_caller() {
        let handle = SubprocessRunHandle::new(SubprocessRunParts {
            id: "run-2".into(),
            result: async { SubagentResult::aborted(vec![]) }.boxed(),
            listener: AbortListener::default(),
            request_cancel: Box::new(|| {}),
            teardown: Box::new(|| async { Err(share_error(Failure("reap failed"))) }.boxed()),
        });
        let a = handle.dispose().await.unwrap_err();
        let b = handle.dispose().await.unwrap_err();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.to_string(), "reap failed");
    }

    /// A panicking teardown — when it is started or while it runs — or a panicking
    /// cancellation request fails the disposal future, for every caller, instead of unwinding
    /// into the first caller and leaving later calls to report a teardown that never ran as a
    /// success. The teardown is still started when the cancellation request panicked.
    #[tokio::test]
    async fn a_panicking_teardown_or_cancel_fails_the_disposal() {
        let handle = |cancel: Box<dyn FnOnce() + Send>, teardown: Teardown| {
            SubprocessRunHandle::new(SubprocessRunParts {
                id: "run-p".into(),
                result: async { SubagentResult::aborted(vec![]) }.boxed(),
                listener: AbortListener::default(),
                request_cancel: cancel,
                teardown,
            })
        };
        // Panics when the teardown is started.
        let h = handle(Box::new(|| {}), Box::new(|| panic!("reaper exploded")));
        let first = std::panic::catch_unwind(AssertUnwindSafe(|| h.dispose()))
            .expect("dispose does not unwind into its caller");
        let err = first.await.unwrap_err();
        assert!(err.to_string().contains("reaper exploded"), "{err}");
        assert!(h.dispose().await.is_err(), "a later call does not report success");

        // Panics while the teardown runs.
        let h = handle(
            Box::new(|| {}),
            Box::new(|| async { panic!("reaper exploded later") }.boxed()),
        );
        let a = tokio::spawn(h.dispose())
            .await
            .expect("the disposal future does not panic");
        assert!(a.unwrap_err().to_string().contains("reaper exploded later"));
        assert!(h.dispose().await.is_err());

        // The cancellation request panics: the teardown still runs, and the disposal fails.
        let torn = Arc::new(AtomicUsize::new(0));
        let t = torn.clone();
        let h = handle(
            Box::new(|| panic!("cancel exploded")),
            Box::new(move || {
                t.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }.boxed()
            }),
        );
        let first = std::panic::catch_unwind(AssertUnwindSafe(|| h.dispose()))
            .expect("dispose does not unwind into its caller");
        assert!(first.await.unwrap_err().to_string().contains("cancel exploded"));
        assert!(h.dispose().await.is_err());
        assert_eq!(torn.load(Ordering::SeqCst), 1, "the teardown ran once");
    }

    /// The provider's closures run outside the handle's lock: a cancellation request or a
    /// teardown that reaches the same handle's `dispose` again (a backend that disposes of its
    /// run from its own cancellation path) gets the shared future, where it used to deadlock on
    /// the lock the first call held around them. A 10 s guard thread fails the test instead of
    /// hanging it.
    #[test]
    fn a_closure_disposing_of_its_own_handle_does_not_deadlock() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let me: Arc<std::sync::OnceLock<std::sync::Weak<SubprocessRunHandle>>> = Arc::default();
            let (from_cancel, from_teardown) = (me.clone(), me.clone());
            let inner = Arc::new(Mutex::new(Vec::new()));
            let (cancel_seen, teardown_seen) = (inner.clone(), inner.clone());
            let handle = Arc::new(SubprocessRunHandle::new(SubprocessRunParts {
                id: "run-r".into(),
                result: async { SubagentResult::aborted(vec![]) }.boxed(),
                listener: AbortListener::default(),
                request_cancel: Box::new(move || {
                    let handle = from_cancel.get().and_then(|w| w.upgrade()).expect("set");
                    cancel_seen.lock().push(handle.dispose());
                }),
                teardown: Box::new(move || {
                    let handle = from_teardown.get().and_then(|w| w.upgrade()).expect("set");
                    teardown_seen.lock().push(handle.dispose());
                    async { Ok(()) }.boxed()
                }),
            }));
            me.set(Arc::downgrade(&handle)).expect("set once");
            let first = handle.dispose();
            futures::executor::block_on(async {
                first.await.expect("the teardown succeeded");
                let reentrant = std::mem::take(&mut *inner.lock());
                assert_eq!(reentrant.len(), 2, "both closures reached the handle");
                for inner in reentrant {
                    inner.await.expect("the re-entrant calls share the same outcome");
                }
            });
            let _ = done.send(());
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("finished: no deadlock");
    }

    #[tokio::test]
    async fn listener_fires_with_the_cause_when_not_removed() {
        let signal = Signal::cancelled_with(CancelCause::Parent);
        let seen = Arc::new(Mutex::new(None));
        let s = seen.clone();
        let (listener, watch) = AbortListener::attach(&signal, move |cause| {
            *s.lock() = Some(cause);
        });
        watch.await;
        assert_eq!(*seen.lock(), Some(CancelCause::Parent));
        assert!(!listener.is_removed());
        // Removing before the signal fires ends the watch without running the reaction.
        let quiet = Signal::new();
        let (listener, watch) = AbortListener::attach(&quiet, |_| panic!("must not fire"));
        listener.remove();
        listener.remove();
        watch.await;
    }
}
