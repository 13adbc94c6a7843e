//! The execution pipeline of spec §11.5 (see the [module docs](super#execution-pipeline)).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use futures::FutureExt;
use serde_json::Value;

use agent::bus::panic_message;
use agent::session::{check_inbox_insert_loggable, check_lossless_json, check_tool_result_loggable};
use agent::tools::{
    ExecutedTool, ExecutionId, PostExecuteDecision, PostExecutePolicy, PreExecuteDecision, PreExecutePolicy,
    ToolCallRequest, ToolContext, ToolExecution, ToolGuard, ToolResult, ToolResultError,
};
use agent::{ContentBlock, Message, SessionId, Signal};

use super::approval::ApprovalOutcome;
use super::{ToolRegistry, codes, model_text};

/// Parses a model's raw argument string: empty (or blank) → `{}`; valid JSON → that value;
/// anything else → the raw text as a JSON string, so the tool's own validation rejects it.
pub(super) fn parse_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(serde_json::Map::new());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

/// The execution record of a call, with a freshly minted identity.
pub(super) fn new_execution(agent: &SessionId, call: ToolCallRequest) -> Arc<ToolExecution> {
    Arc::new(ToolExecution {
        id: ExecutionId::next(),
        agent: agent.clone(),
        arguments: parse_arguments(&call.arguments),
        call_id: call.call_id,
        name: call.name,
    })
}

/// A failed result: model content `Error: <message>`, error facts `{message, code}`.
pub(super) fn error_result(code: &str, message: impl Into<String>) -> ToolResult {
    let message = message.into();
    ToolResult {
        is_error: true,
        content: vec![ContentBlock::text(model_text::error_content(&message))],
        value: None,
        error: Some(ToolResultError {
            message,
            code: code.to_owned(),
        }),
        meta: None,
        concludes_turn: false,
    }
}

fn aborted_before_dispatch() -> ToolResult {
    error_result(
        codes::ABORTED_BEFORE_DISPATCH,
        model_text::ABORTED_BEFORE_DISPATCH,
    )
}

fn cancellation(body_invoked: bool) -> ToolResult {
    if body_invoked {
        error_result(codes::CANCELLED, model_text::ABORTED)
    } else {
        aborted_before_dispatch()
    }
}

/// What the stages before post-execute produced.
enum Staged {
    /// Goes through post-execute (denials, unknown tools, body outcomes).
    Post { result: ToolResult, body_invoked: bool },
    /// Already final (pre-dispatch cancellation, pipeline failures): skips post-execute.
    Final(ToolResult),
}

/// The outcome of the post-execute chain.
enum PostOutcome {
    /// The outcome was kept (possibly with replaced content or value): deferred contexts survive.
    Kept(ToolResult),
    /// The outcome was blocked or a policy failed: deferred contexts are discarded.
    Replaced(ToolResult),
}

/// A call whose stages up to the body have run (spec §11.5 steps 1–3) and whose **commit** —
/// post-execute, normalisation and the `tools/result` observers (steps 4–6) — is still due.
///
/// The step scheduler runs the dispatch of a parallel group's calls concurrently and commits
/// them one by one in model order (spec §11.6); [`ToolRegistry::run`] commits directly.
///
/// Dropped uncommitted — the scheduler's future was dropped while this call awaited the commit
/// of an earlier call of its group — a body's success is never recorded: the drop runs the
/// execution's [`on_discarded`](ToolContext::on_discarded) hooks, as a discarding commit would.
pub(super) struct Dispatched {
    ctx: ToolContext,
    /// Taken by the commit; still here on drop only when the call was never committed.
    staged: Option<Staged>,
    /// Whether the call's signal was already cancelled when the body settled.
    cancelled_at_settle: bool,
}

impl Drop for Dispatched {
    fn drop(&mut self) {
        if let Some(Staged::Post { result, .. }) = &self.staged
            && !result.is_error
        {
            run_discard_hooks(&self.ctx);
        }
    }
}

#[cfg(test)]
impl Dispatched {
    /// A call whose body returned `output` and whose signal was (`cancelled_at_settle`) or was
    /// not cancelled when it settled: the state a multi-thread race leaves between the body's
    /// return and [`ToolRegistry::dispatch`]'s check, made deterministic.
    pub(super) fn settled_success_for_test(
        ctx: ToolContext,
        output: agent::tools::ToolOutput,
        cancelled_at_settle: bool,
    ) -> Self {
        Self {
            ctx,
            staged: Some(Staged::Post {
                result: ToolResult::success(output, false),
                body_invoked: true,
            }),
            cancelled_at_settle,
        }
    }
}

/// A committed call on its way to the model: its final outcome, and the [`Delivery`] that
/// keeps a success's discard hooks armed until the outcome is logged.
#[derive(Debug)]
pub struct CommittedTool {
    /// The final outcome, as [`Tools::execute`](agent::Tools::execute) returns it.
    pub executed: ExecutedTool,
    /// Runs the execution's [`on_discarded`](ToolContext::on_discarded) hooks when dropped
    /// undelivered.
    pub delivery: Delivery,
}

impl CommittedTool {
    /// An outcome with no hooks to arm (an error, a synthetic or a foreign result).
    pub(super) fn unarmed(executed: ExecutedTool) -> Self {
        Self {
            executed,
            delivery: Delivery(None),
        }
    }

    /// The outcome reached its consumer: disarms the hooks (they never run) and hands the
    /// outcome over.
    pub fn deliver(self) -> ExecutedTool {
        self.delivery.delivered();
        self.executed
    }
}

/// The discard hooks of a committed **success**, armed until its outcome is delivered.
///
/// A committed success reaches the model only through the session log. The hooks stay armed
/// until the consumer reports the outcome [`delivered`](Self::delivered) (its `tool/result` was
/// appended); dropped undelivered — the log refused the append, the driver abandoned the step's
/// later results after such a refusal, or the scheduler's future was dropped holding it — the
/// success was never seen, so the drop runs the execution's
/// [`on_discarded`](ToolContext::on_discarded) hooks, once, as a discarding commit would (a
/// panicking hook is contained and logged). An error outcome arms nothing: the pipeline
/// already ran the hooks when it replaced the success, or the body never succeeded, or a
/// post-execute policy decided the outcome.
#[must_use = "dropping an undelivered success runs its discard hooks"]
pub struct Delivery(Option<ToolContext>);

impl Delivery {
    /// The outcome was delivered: the hooks never run.
    pub fn delivered(mut self) {
        self.0 = None;
    }

    /// Whether dropping this delivery would run discard hooks (the outcome is an undelivered
    /// success of the registry's pipeline).
    pub fn is_armed(&self) -> bool {
        self.0.is_some()
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("armed", &self.is_armed())
            .finish()
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let Some(ctx) = self.0.take() {
            run_discard_hooks(&ctx);
        }
    }
}

/// When a commit decides whether a successful outcome raced the call's cancellation (such a
/// success is recorded as cancelled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RaceCheck {
    /// At commit time, after post-execute: the commit directly follows the body.
    AtCommit,
    /// When the body settled: the commit waited for earlier calls of its group, and a
    /// cancellation that arrived meanwhile must not undo a success that had already settled.
    AtSettle,
}

impl ToolRegistry {
    /// Runs one call through the whole pipeline and notifies the result observers. The
    /// outcome is handed over as delivered (its consumer owns it, see [`Tools::execute`]).
    ///
    /// [`Tools::execute`]: agent::Tools::execute
    pub(super) async fn run(&self, agent: &SessionId, call: ToolCallRequest, signal: Signal) -> ExecutedTool {
        self.run_armed(agent, call, signal).await.deliver()
    }

    /// Runs one call through the whole pipeline and notifies the result observers; a success
    /// keeps its discard hooks armed until its consumer delivers it.
    pub(super) async fn run_armed(
        &self,
        agent: &SessionId,
        call: ToolCallRequest,
        signal: Signal,
    ) -> CommittedTool {
        let dispatched = self.dispatch(agent, call, signal).await;
        self.commit(dispatched, RaceCheck::AtCommit)
    }

    /// The concurrent half of the pipeline: mints the execution, then stages 1–4 of the
    /// [module docs](super#execution-pipeline)
    /// (cancellation check, pre-execute with approval, guards, body).
    pub(super) async fn dispatch(
        &self,
        agent: &SessionId,
        call: ToolCallRequest,
        signal: Signal,
    ) -> Dispatched {
        let execution = new_execution(agent, call);
        let ctx = ToolContext::new(execution, signal);
        let staged = self.prepare_and_dispatch(&ctx).await;
        let cancelled_at_settle = ctx.signal.is_cancelled();
        Dispatched {
            ctx,
            staged: Some(staged),
            cancelled_at_settle,
        }
    }

    /// The sequential half of the pipeline: post-execute, normalisation, then every result
    /// observer with the frozen outcome. Synchronous, so commits never interleave. A committed
    /// success keeps the execution's discard hooks armed in its [`Delivery`].
    pub(super) fn commit(&self, dispatched: Dispatched, race: RaceCheck) -> CommittedTool {
        let execution = dispatched.ctx.execution.clone();
        let ctx = dispatched.ctx.clone();
        let (result, deferred) = self.settle(dispatched, race);
        let (result, deferred) = match output_fault(&result, &deferred) {
            None => (result, deferred),
            Some(detail) => {
                if !result.is_error {
                    // The body's success (possibly amended by a policy) cannot be recorded.
                    run_discard_hooks(&ctx);
                }
                (
                    error_result(
                        codes::FAILED,
                        model_text::output_not_lossless(&execution.name, &detail),
                    ),
                    Vec::new(),
                )
            }
        };
        self.notify(&execution, &result);
        let armed = (!result.is_error).then_some(ctx);
        CommittedTool {
            executed: ExecutedTool {
                execution,
                result,
                deferred,
            },
            delivery: Delivery(armed),
        }
    }

    /// Stages 4–5: post-execute and normalisation into the final outcome.
    fn settle(&self, mut dispatched: Dispatched, race: RaceCheck) -> (ToolResult, Vec<Message>) {
        let staged = dispatched
            .staged
            .take()
            .expect("a dispatched call is committed once");
        let (ctx, cancelled_at_settle) = (&dispatched.ctx, dispatched.cancelled_at_settle);
        let (result, body_invoked) = match staged {
            Staged::Final(result) => return (result, Vec::new()),
            Staged::Post { result, body_invoked } => (result, body_invoked),
        };
        let policies = self.inner.state.lock().post_for(&ctx.execution.agent);
        match post_execute(&ctx.execution, result, &policies) {
            PostOutcome::Replaced(result) => (result, Vec::new()),
            PostOutcome::Kept(result) => {
                let deferred = ctx.take_deferred();
                let raced = match race {
                    RaceCheck::AtCommit => ctx.signal.is_cancelled(),
                    RaceCheck::AtSettle => cancelled_at_settle,
                };
                if raced && !result.is_error {
                    // Recorded as cancelled: the body's success is discarded, with its
                    // deferred contexts and the side effects it registered to undo.
                    run_discard_hooks(ctx);
                    return (cancellation(body_invoked), Vec::new());
                }
                (result, deferred)
            }
        }
    }

    /// Stages 1–4: cancellation check, pre-execute (with approval), guards, body.
    async fn prepare_and_dispatch(&self, ctx: &ToolContext) -> Staged {
        let exec = &*ctx.execution;
        let signal = &ctx.signal;
        // Spec §11.5: the arguments are snapshotted as lossless JSON; failure is an error result.
        if let Err(detail) = check_lossless_json(&exec.arguments) {
            return Staged::Final(error_result(
                codes::INVALID_ARGS,
                model_text::arguments_not_lossless(&detail),
            ));
        }
        if signal.is_cancelled() {
            return Staged::Final(aborted_before_dispatch());
        }
        let policies = self.inner.state.lock().pre_for(&exec.agent);
        let decision = match pre_execute(exec, &policies) {
            Ok(decision) => decision,
            Err(detail) => {
                return Staged::Final(error_result(
                    codes::FAILED,
                    model_text::pre_execute_failed(&detail),
                ));
            }
        };
        let denial = match decision {
            PreExecuteDecision::Allow => None,
            PreExecuteDecision::Deny(reason) => Some(reason),
            PreExecuteDecision::Ask => match self.ask(exec, signal).await {
                Ok(denial) => denial,
                Err(()) => {
                    return Staged::Post {
                        result: aborted_before_dispatch(),
                        body_invoked: false,
                    };
                }
            },
        };
        let denial = denial.or_else(|| {
            let guards = self.inner.state.lock().guards_for(&exec.agent);
            guard_reason(exec, &guards)
        });
        if let Some(reason) = denial {
            return Staged::Post {
                result: error_result(codes::DENIED, reason),
                body_invoked: false,
            };
        }
        if signal.is_cancelled() {
            return Staged::Post {
                result: aborted_before_dispatch(),
                body_invoked: false,
            };
        }
        let definition = self.inner.state.lock().resolve(&exec.name, Some(&exec.agent));
        let Some(definition) = definition else {
            return Staged::Post {
                result: error_result(codes::UNKNOWN_TOOL, model_text::unknown_tool(&exec.name)),
                body_invoked: false,
            };
        };
        // The handler is *called* inside the caught future too: a hand-written `ToolHandler`
        // may panic before it returns its future, and that panic must not unwind into the driver.
        let handler = definition.handler.clone();
        let body =
            AssertUnwindSafe(async move { handler.execute(exec.arguments.clone(), ctx.clone()).await })
                .catch_unwind();
        let result = match signal.run(body).await {
            Err(_cause) => {
                // A cancelled execution's deferred contexts die with it: they would otherwise
                // outlive the aborted turn in the inbox and reach the next, unrelated one.
                drop(ctx.take_deferred());
                cancellation(true)
            }
            Ok(Err(panic)) => error_result(
                codes::FAILED,
                model_text::body_panicked(&exec.name, &panic_message(&*panic)),
            ),
            Ok(Ok(Err(error))) => error_result(&error.code, error.message),
            Ok(Ok(Ok(output))) if signal.is_cancelled() => {
                // The signal fired after the body returned (or after its last check): the
                // success is discarded, and so are the side effects it registered to undo.
                drop(output);
                drop(ctx.take_deferred());
                run_discard_hooks(ctx);
                cancellation(true)
            }
            Ok(Ok(Ok(output))) => ToolResult::success(output, ctx.concludes_turn()),
        };
        Staged::Post {
            result,
            body_invoked: true,
        }
    }

    /// Resolves an `Ask`: `Ok(None)` to run, `Ok(Some(reason))` to deny, `Err(())` when the
    /// call's signal was cancelled while waiting.
    async fn ask(&self, exec: &ToolExecution, signal: &Signal) -> Result<Option<String>, ()> {
        let approval = self.inner.state.lock().approval();
        let Some(approval) = approval else {
            return Ok(Some(model_text::approval_unconfigured(&exec.name)));
        };
        // Called inside the caught future: a service may panic before it returns its future.
        let request = AssertUnwindSafe(async { approval.request(exec, signal).await }).catch_unwind();
        let outcome = match signal.run(request).await {
            Err(_cause) => return Err(()),
            Ok(Err(panic)) => {
                return Ok(Some(model_text::approval_failed(
                    &exec.name,
                    &panic_message(&*panic),
                )));
            }
            Ok(Ok(outcome)) => outcome,
        };
        Ok(match outcome {
            ApprovalOutcome::AllowedOnce => None,
            ApprovalOutcome::Rejected => Some(model_text::approval_rejected(&exec.name)),
            ApprovalOutcome::Cancelled => Some(model_text::approval_cancelled(&exec.name)),
            ApprovalOutcome::Unavailable => Some(model_text::approval_unavailable(&exec.name)),
        })
    }

    /// Stage 6: every observer receives the frozen final outcome; failures are contained.
    fn notify(&self, exec: &ToolExecution, result: &ToolResult) {
        let observers = self.inner.state.lock().observers_for(&exec.agent);
        for observer in observers {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| observer(exec, result))) {
                tracing::warn!(
                    tool = %exec.name,
                    call_id = %exec.call_id,
                    message = %panic_message(&*panic),
                    "tools/result observer failed; delivery continues"
                );
            }
        }
    }
}

/// Runs the execution's [`on_discarded`](ToolContext::on_discarded) hooks (the pipeline
/// replaced the body's success), containing a panicking hook like every other hook: it is
/// logged, and the pipeline goes on to record and deliver the replaced outcome. A panicking
/// hook does not keep the later ones from running ([`ToolContext::discard`] runs them all
/// first).
fn run_discard_hooks(ctx: &ToolContext) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(|| ctx.discard())) {
        tracing::warn!(
            tool = %ctx.execution.name,
            call_id = %ctx.execution.call_id,
            message = %panic_message(&*panic),
            "tool discard hook failed; the replaced outcome is recorded"
        );
    }
}

/// Why a final outcome cannot be recorded (spec §11.1: output values must be lossless JSON), if
/// it cannot: the first negative zero in its content, metadata, value or deferred contexts, or
/// the first container nested too deep to read back from where it is logged (content and
/// metadata in the `tool/result` event, deferred contexts in the inbox splice that queues
/// them), with its path. Without this check the outcome reached the log's append (or the
/// inbox's, for a deferred context), which refused it and ended the whole turn with an error.
fn output_fault(result: &ToolResult, deferred: &[Message]) -> Option<String> {
    check_tool_result_loggable(&result.content, result.meta.as_ref())
        .and_then(|()| {
            result
                .value
                .as_ref()
                .map_or(Ok(()), check_lossless_json)
                .map_err(|detail| format!("value: {detail}"))
        })
        .and_then(|()| {
            check_inbox_insert_loggable(deferred).map_err(|detail| format!("deferred context: {detail}"))
        })
        .err()
}

/// Folds the pre-execute chain from `Allow` in registration order. `Err` carries a panic text.
fn pre_execute(exec: &ToolExecution, policies: &[PreExecutePolicy]) -> Result<PreExecuteDecision, String> {
    let mut decision = PreExecuteDecision::Allow;
    for policy in policies {
        let current = decision.clone();
        decision =
            catch_unwind(AssertUnwindSafe(|| policy(exec, current))).map_err(|p| panic_message(&*p))?;
    }
    Ok(decision)
}

/// The first guard reason, if any guard denies. A panicking guard denies (fails closed).
fn guard_reason(exec: &ToolExecution, guards: &[ToolGuard]) -> Option<String> {
    guards
        .iter()
        .find_map(|guard| match catch_unwind(AssertUnwindSafe(|| guard(exec))) {
            Ok(reason) => reason,
            Err(panic) => Some(model_text::guard_failed(&panic_message(&*panic))),
        })
}

/// Runs the post-execute chain; each policy sees the outcome so far.
fn post_execute(exec: &ToolExecution, mut result: ToolResult, policies: &[PostExecutePolicy]) -> PostOutcome {
    for policy in policies {
        let decision = match catch_unwind(AssertUnwindSafe(|| policy(exec, &result))) {
            Ok(decision) => decision,
            Err(panic) => {
                return PostOutcome::Replaced(error_result(
                    codes::FAILED,
                    model_text::post_execute_failed(&panic_message(&*panic)),
                ));
            }
        };
        match decision {
            None => {}
            Some(PostExecuteDecision::Accept { content, value }) => {
                if value.is_some() && result.is_error {
                    return PostOutcome::Replaced(error_result(
                        codes::FAILED,
                        model_text::POST_VALUE_ON_FAILURE,
                    ));
                }
                if let Some(content) = content {
                    result.content = content;
                }
                if value.is_some() {
                    result.value = value;
                }
            }
            Some(PostExecuteDecision::Block(feedback)) => {
                let message = if feedback.is_empty() {
                    model_text::BLOCKED_WITHOUT_FEEDBACK.to_owned()
                } else {
                    feedback
                };
                return PostOutcome::Replaced(ToolResult {
                    is_error: true,
                    content: vec![ContentBlock::text(message.clone())],
                    value: None,
                    error: Some(ToolResultError {
                        message,
                        code: codes::DENIED.to_owned(),
                    }),
                    meta: None,
                    concludes_turn: false,
                });
            }
        }
    }
    PostOutcome::Kept(result)
}
