//! The one-shot background route (`acp-and-tools.md` §3.8): a one-shot run owned by a job in
//! the host's job registry.
//!
//! The job is registered synchronously; the registry runs its preflight (owner, controller,
//! capacity) **before** the starter, so a refused job never reaches the provider. The starter
//! gives the run its **own** cancellation token — once the job id is returned, the tool call's
//! token no longer owns the child; only `job_kill` (or owner disposal) cancels it. The starter
//! also begins the start (see `foreground::begin_start`), so the start's synchronous prefix —
//! the delegated policy capture among it — happens at the call, not when the registry's task
//! first polls the job.
//!
//! Until the call's result reaches the model, the job's settlement is **not announced**: its
//! `done` resolves only once the call lets go of its `AnnouncementHold` — when the pipeline
//! commits and delivers the result (the context's discard hooks are dropped unrun), or when it
//! discards it (after `kill_on_discard` has marked the job reported) — or once the job's own
//! token is cancelled (a kill, owner disposal, registry shutdown). A job that settles at once (a
//! start rejected synchronously) would otherwise emit its completion notice while the call's
//! success may still be discarded, naming a job id the model never received.

use std::pin::pin;
use std::sync::Arc;

use futures::FutureExt;
use futures::channel::oneshot;
use futures::future::select;
use subagent::agent::jobs::{JobHooks, JobId, JobOutcome, JobSpec, Jobs};
use subagent::agent::tools::{ToolContext, ToolError, codes};
use subagent::agent::{CancelCause, SessionId, Signal};
use subagent::provider::SubagentStartRequest;
use subagent::run::SubagentRun;
use subagent::service::StartError;
use subagent::service::SubagentService;
use subagent::{RunOutcome, SubagentErrorCode, error_chain, settle_run};

use crate::foreground::{RunCall, begin_start, contained, run_result, seam_error};
use crate::model_text;
use crate::value::DelegationValue;

/// The job kind of a one-shot background delegation (ids are `subagent-<n>`).
pub const JOB_KIND: &str = "subagent";

/// Holds back a background job's settlement — and so its completion notice — while the call
/// that started it may still have its success discarded (see the [module docs](self)).
/// Dropping it releases the job; the call hands it to [`kill_on_discard`], whose hook releases
/// it after the kill when the success is discarded, or drops it unrun with the call's context
/// once the success is committed and delivered.
#[must_use = "dropping the hold announces the job at once"]
pub(crate) struct AnnouncementHold {
    /// Dropped to release the job (it is never sent on).
    _release: oneshot::Sender<()>,
}

/// Starts one background delegation as a job owned by `owner`, labelled `label`, and returns
/// its id with the hold on its announcement. `request.signal` is replaced by the job's own
/// token.
pub(crate) fn start(
    jobs: &Arc<dyn Jobs>,
    subagents: SubagentService,
    provider: String,
    label: String,
    owner: SessionId,
    mut request: SubagentStartRequest,
) -> Result<(DelegationValue, AnnouncementHold), ToolError> {
    let (hold, held) = oneshot::channel::<()>();
    let spec = JobSpec {
        kind: JOB_KIND.to_owned(),
        label,
        owner,
        starter: Box::new(move || {
            let own = Signal::new();
            request.signal = own.clone();
            let cancel_token = own.clone();
            JobHooks {
                cancel: Box::new(move |reason: Option<String>| {
                    cancel_token.cancel(CancelCause::Other {
                        reason: reason.unwrap_or_else(|| model_text::DEFAULT_KILL_REASON.to_owned()),
                    });
                }),
                // Begun here, inside the starter (after the registry's preflight), not when the
                // registry first polls `done`: the start's synchronous prefix (the delegated
                // policy capture among it) belongs to the call.
                done: {
                    let starting = begin_start(subagents, provider.clone(), request);
                    async move {
                        let started = starting.await;
                        let outcome = settle_start(&provider, started, &own).await;
                        // Every resource is released; the settlement waits for the call's
                        // result to reach the model (or for a kill / teardown).
                        let cancelled = pin!(own.cancelled());
                        let _ = select(held, cancelled).await;
                        JobOutcome::from(outcome)
                    }
                    .boxed()
                },
            }
        }),
    };
    let id = jobs
        .start(spec)
        .map_err(|e| ToolError::new(codes::FAILED, model_text::job_start_refused(&e)))?;
    Ok((
        DelegationValue::Background { job_id: id.0 },
        AnnouncementHold { _release: hold },
    ))
}

/// Kills job `job_id` of the call's agent if the pipeline discards the call's successful
/// result ([`ToolContext::on_discarded`]): the call's signal fired as the body returned, so the
/// call is recorded as cancelled and the model never learns the job id. The id was never
/// returned, so the call's cancellation still owns the child (§3.8 step 3: the call's token
/// stops owning it only "once the id is returned"); the kill (reason
/// [`model_text::CALL_DISCARDED_KILL_REASON`]) cancels the run, which the job still disposes
/// before it settles `killed`, and marks the job reported, so no completion notice names a job
/// the model never heard of.
///
/// The hook owns the job's `hold`: it releases it only after the kill has marked the job
/// reported, so a job that had already finished its work (a start rejected at once) settles
/// quietly too. When the success is committed and delivered, the hook is dropped unrun with
/// the call's context, and dropping the hold lets the job settle and announce itself.
pub(crate) fn kill_on_discard(ctx: &ToolContext, jobs: Arc<dyn Jobs>, job_id: &str, hold: AnnouncementHold) {
    let owner = ctx.agent().clone();
    let id = JobId(job_id.to_owned());
    ctx.on_discarded(move || {
        let reason = Some(model_text::CALL_DISCARDED_KILL_REASON.to_owned());
        if let Err(error) = jobs.kill(&owner, &id, reason) {
            tracing::warn!(job = %id, %error, "subagent tool: could not kill the job of a discarded call");
        }
        drop(hold);
    });
}

/// The job's settlement (never fails; disposal happens before the outcome is reported):
///
/// * published → [`settle_run`]: `completed` → completed with the output text, `aborted` →
///   killed, every other reason → failed with `<reason>` or `<reason>; diagnostic: <d>`, a
///   rejected result → failed with its error, a failed disposal → `…; dispose failed: <error>`;
///   a panic in the run's `result()` / `dispose()` or their futures is contained as that call's
///   failure (`PROVIDER_FAILED` text), so the run is still disposed before the job reports;
///   an oversized diagnostic is bounded first (see [`run_result`]);
/// * startup rejected after the job's own token was cancelled → killed, unless the rejection
///   reports that cleaning up the unpublished child failed too (see [`is_cleanup_failure`]);
/// * any other startup rejection → failed with the error chain as detail.
pub(crate) async fn settle_start(
    provider: &str,
    started: Result<Box<dyn SubagentRun>, StartError>,
    own: &Signal,
) -> RunOutcome {
    match started {
        Ok(run) => {
            settle_run(run_result(provider, run.as_ref()), || {
                contained(provider, RunCall::Dispose, || run.dispose())
            })
            .await
        }
        Err(error) if own.is_cancelled() && !is_cleanup_failure(&error) => RunOutcome::Killed,
        Err(error) => RunOutcome::Failed {
            detail: error_chain(&error),
        },
    }
}

/// Whether a startup rejection says the provider's rollback failed as well (the reference's
/// aggregate of startup and cleanup failures): its seam code is
/// [`ActivationTeardownFailed`](SubagentErrorCode::ActivationTeardownFailed) or
/// [`ActivationSetupReleaseFailed`](SubagentErrorCode::ActivationSetupReleaseFailed). Such a
/// failure is never reported as a clean kill.
pub fn is_cleanup_failure(error: &StartError) -> bool {
    seam_error(error).is_some_and(|e| {
        matches!(
            e.code(),
            SubagentErrorCode::ActivationTeardownFailed | SubagentErrorCode::ActivationSetupReleaseFailed
        )
    })
}
