//! The foreground route (`acp-and-tools.md` §3.7): start on the call's token, await the
//! result, **always** dispose, and turn every non-`completed` ending into an errored result
//! that still carries the child's diagnostic and partial answer.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::task::{Context, Poll, Waker};

use futures::FutureExt;
use futures::future::BoxFuture;
use subagent::agent::bus::panic_message;
use subagent::agent::tools::{ToolError, codes};
use subagent::provider::SubagentStartRequest;
use subagent::run::{RunFailure, SubagentRun};
use subagent::service::StartError;
use subagent::service::SubagentService;
use subagent::{SubagentError, SubagentResult, cap_diagnostic, error_chain};

use crate::model_text;
use crate::value::DelegationValue;

/// A start on the subagent service that has already begun: see [`begin_start`].
pub(crate) type Starting = BoxFuture<'static, Result<Box<dyn SubagentRun>, StartError>>;

/// Begins `subagents.start(provider, request)` **now**: its future is polled once, here, so
/// that the start's synchronous prefix — the service's checks and the provider's own
/// synchronous start, where an in-process provider resolves the child's depth and captures the
/// parent's delegated policy (`subagent-seam.md` §2.15, "before the start's first suspension
/// point") — runs at the tool call, and a parent policy switch made after the call returns (or
/// while the rest of the start waits for a task) never reaches the child. The returned future,
/// awaited on a task, finishes the start.
///
/// The first poll uses a no-op waker; the task that awaits the future polls it again with its
/// own. A panic during that poll (the service contains the provider's) is a `PROVIDER_FAILED`
/// rejection, as the service words a provider panic.
pub(crate) fn begin_start(
    subagents: SubagentService,
    provider: String,
    request: SubagentStartRequest,
) -> Starting {
    let name = provider.clone();
    let mut starting: Starting = async move { subagents.start(&provider, request).await }.boxed();
    let mut cx = Context::from_waker(Waker::noop());
    match catch_unwind(AssertUnwindSafe(|| starting.as_mut().poll(&mut cx))) {
        Ok(Poll::Pending) => starting,
        Ok(Poll::Ready(started)) => futures::future::ready(started).boxed(),
        Err(payload) => {
            let error = SubagentError::provider_panicked(Some(&name), "start", &panic_message(&*payload));
            futures::future::ready(Err(StartError::Subagent(error))).boxed()
        }
    }
}

/// Runs one foreground delegation on provider `provider`, whose start `starting` has begun
/// ([`begin_start`]). The request's signal is a child of the call's token: it is the provider's
/// cancellation channel during startup and for the published run, cancelled with the call's
/// token and also when the call is abandoned (its body dropped before this future answered).
///
/// * A start rejection becomes `Error: <message>`; there is nothing to dispose.
/// * Otherwise the result and the disposal are awaited in that order, each outcome captured
///   independently; the run is disposed exactly once on every path.
/// * `completed` → [`DelegationValue::Foreground`] with the full output. Any other stop reason
///   → the headline, diagnostic (bounded, see [`run_result`]) and partial text of
///   [`model_text::stop_reason_failure`]. A
///   rejected result → its error chain. A panic in the run's `result()` / `dispose()` or their
///   futures is contained ([`contained`]) and counts as that call's failure; the run is still
///   disposed after a panicking result.
/// * Both the result and the disposal failed → one error naming both
///   ([`model_text::result_and_dispose_failed`]); only the disposal failed (even after
///   `completed`) → the disposal error.
/// * `structured` output is never requested and is ignored.
pub(crate) async fn run(provider: String, starting: Starting) -> Result<DelegationValue, ToolError> {
    let run = starting.await.map_err(start_failure)?;
    let result = run_result(&provider, run.as_ref()).await;
    let disposal = contained(&provider, RunCall::Dispose, || run.dispose()).await;
    let outcome = match result {
        Ok(result) => match model_text::stop_reason_failure(
            &result.stop_reason,
            result.diagnostic.as_deref(),
            &result.output,
        ) {
            Some(failure) => Err(failure),
            None => serde_json::to_value(&result.output)
                .ok()
                .and_then(|v| match v {
                    serde_json::Value::Array(blocks) => Some(blocks),
                    _ => None,
                })
                .ok_or_else(|| model_text::foreground_task_failed("its output is not representable as JSON"))
                .and_then(|output| {
                    Ok(DelegationValue::Foreground {
                        run_id: run_id(&provider, run.as_ref())?,
                        output,
                    })
                }),
        },
        Err(failure) => Err(error_chain(&failure)),
    };
    match (outcome, disposal) {
        (Ok(value), Ok(())) => Ok(value),
        (Err(failure), Ok(())) => Err(ToolError::failed(failure)),
        (Ok(_), Err(dispose)) => Err(ToolError::failed(error_chain(&dispose))),
        (Err(failure), Err(dispose)) => Err(ToolError::failed(model_text::result_and_dispose_failed(
            &failure,
            &error_chain(&dispose),
        ))),
    }
}

/// One of the two calls the tool makes on a published run.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RunCall {
    /// `result()` and its future.
    Result,
    /// `dispose()` and its future.
    Dispose,
}

/// Awaits the future `make` returns — a published run's `result()` or `dispose()` — with the
/// provider's code contained: a panic in `make` or while the future is polled becomes a
/// [`RunFailure`] carrying the seam's `PROVIDER_FAILED` error, which names `provider`, the call
/// and the panic. The run is third-party code; unwinding out of here would skip its disposal
/// and report the runtime's task-panic text instead of an error the model can act on.
pub(crate) async fn contained<T, F>(
    provider: &str,
    call: RunCall,
    make: impl FnOnce() -> F,
) -> Result<T, RunFailure>
where
    F: Future<Output = Result<T, RunFailure>>,
{
    let (called, polled) = match call {
        RunCall::Result => ("result()", "its result future"),
        RunCall::Dispose => ("dispose()", "its dispose future"),
    };
    let panicked = |during: &str, payload: Box<dyn Any + Send>| {
        RunFailure::new(SubagentError::provider_panicked(
            Some(provider),
            during,
            &panic_message(&*payload),
        ))
    };
    match catch_unwind(AssertUnwindSafe(make)) {
        Ok(future) => AssertUnwindSafe(future)
            .catch_unwind()
            .await
            .unwrap_or_else(|payload| Err(panicked(polled, payload))),
        Err(payload) => Err(panicked(called, payload)),
    }
}

/// The published run's result as the tool reports it: awaited with the provider's code
/// [`contained`], and with a diagnostic longer than `MAX_DIAGNOSTIC_BYTES` bounded by
/// [`cap_diagnostic`]. Providers should set diagnostics through `with_diagnostic`, which
/// enforces the bound, but the field is public and the text reaches the model from here.
pub(crate) async fn run_result(provider: &str, run: &dyn SubagentRun) -> Result<SubagentResult, RunFailure> {
    let mut result = contained(provider, RunCall::Result, || run.result()).await?;
    if let Some(diagnostic) = &result.diagnostic {
        result.diagnostic = Some(cap_diagnostic(diagnostic));
    }
    Ok(result)
}

/// The run's id, read with the provider's code contained: the service read it once at
/// publication, but a later call is provider code again and may panic (then: the
/// `PROVIDER_FAILED` message naming the provider and the panic).
fn run_id(provider: &str, run: &dyn SubagentRun) -> Result<String, String> {
    catch_unwind(AssertUnwindSafe(|| run.id().to_string())).map_err(|payload| {
        SubagentError::provider_panicked(Some(provider), "run id()", &panic_message(&*payload)).to_string()
    })
}

/// A start rejection as a tool error: the message is the error chain, the code the seam's code
/// when there is one (`NO_PROVIDER`, `UNSUPPORTED_CAPABILITY`, …), else `FAILED`.
pub(crate) fn start_failure(error: StartError) -> ToolError {
    let code = seam_code(&error).map_or(codes::FAILED, |c| c.as_str());
    ToolError::new(code, error_chain(&error))
}

/// The seam error a start rejection carries: the rejection itself, or the nearest seam error
/// in its cause chain.
pub(crate) fn seam_error(error: &StartError) -> Option<&SubagentError> {
    if let StartError::Subagent(seam) = error {
        return Some(seam);
    }
    let mut current = std::error::Error::source(error);
    while let Some(e) = current {
        if let Some(seam) = e.downcast_ref::<SubagentError>() {
            return Some(seam);
        }
        current = e.source();
    }
    None
}

fn seam_code(error: &StartError) -> Option<subagent::SubagentErrorCode> {
    seam_error(error).map(SubagentError::code)
}
