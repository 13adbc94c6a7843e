//! The turn/step driver (spec §8.6).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};

use agent::bus::panic_message;
use agent::event::{CallConfig, EpochHeader, RequestHeaderReason, ToolResultError};
use agent::model::ToolSchema;
use agent::session::now_ms;
use agent::tools::ToolCallRequest;
use agent::{
    AgentError, CallId, ContentBlock, EventData, FinishReason, GenerateOptions, InboxTarget, LlmFailure,
    Message, MessageList, MessageSource, PreStep, PreStepDecision, Signal, StreamChunk, SurfaceMeta,
    TurnEndReason,
};

use super::LoopAgent;
use super::assemble::BlockAssembler;
use crate::prompt::{self, PromptVariables, RetainedSnapshot};
use crate::tools::CommittedTool;

/// A turn whose synchronous prefix ran: `turn/start` is logged and the first batch claimed.
pub(crate) struct OpenTurn {
    pub(crate) turn: u64,
    pub(crate) signal: Signal,
    pub(crate) claimed: Result<Vec<Message>, TurnFailure>,
}

/// A turn whose `turn/end` the session refused, or whose last step's `step/end` it refused:
/// still open in the log, with the ending it was to be logged with.
#[derive(Debug)]
pub(crate) struct UnclosedTurn {
    turn: u64,
    /// The step still open in the log (its `step/end` was refused): closed before the turn.
    step: Option<u64>,
    reason: TurnEndReason,
}

/// The `agent/error` failure for a `step/end` of `turn`'s `step` the session refused: coded
/// [`STEP_END_REFUSED`](super::codes::STEP_END_REFUSED), with the refusal's error chain.
fn step_end_refused(agent: &agent::SessionId, turn: u64, step: u64, err: &agent::LogError) -> LlmFailure {
    LlmFailure::new(
        super::codes::STEP_END_REFUSED,
        format!(
            "agent \"{agent}\" could not log the end of step {step} of turn {turn}: {}; the step \
             and its turn stay open and no further step or turn opens until their ends are logged",
            failure_of(err).message
        ),
    )
}

/// The `agent/error` failure for a `turn/end` of `turn` the session refused: coded
/// [`TURN_END_REFUSED`](super::codes::TURN_END_REFUSED), with the refusal's error chain.
fn turn_end_refused(agent: &agent::SessionId, turn: u64, err: &agent::LogError) -> LlmFailure {
    LlmFailure::new(
        super::codes::TURN_END_REFUSED,
        format!(
            "agent \"{agent}\" could not log the end of turn {turn}: {}; the turn stays open \
             and no further turn opens until its end is logged",
            failure_of(err).message
        ),
    )
}

/// Why a turn stopped early.
///
/// The failure facts are boxed: every `Result` of the driver carries this type, and a small
/// error keeps the driver task (which holds several of them across suspensions) small.
#[derive(Debug)]
pub(crate) enum TurnFailure {
    /// The turn's signal was cancelled.
    Cancelled,
    /// Anything else, as structured failure facts.
    Failed(Box<LlmFailure>),
}

impl TurnFailure {
    pub(crate) fn from_error(err: &(dyn std::error::Error + 'static)) -> Self {
        Self::failed(failure_of(err))
    }

    /// A failure with these facts.
    pub(crate) fn failed(failure: LlmFailure) -> Self {
        Self::Failed(Box::new(failure))
    }
}

/// The structured failure of a non-model error: an [`LlmFailure`] itself as it is (so a hook
/// or tool layer can give its failure a code), anything else as its error chain text under
/// `UNKNOWN`.
pub(crate) fn failure_of(err: &(dyn std::error::Error + 'static)) -> LlmFailure {
    if let Some(failure) = err.downcast_ref::<LlmFailure>() {
        return failure.clone();
    }
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    LlmFailure::unknown(text)
}

impl From<AgentError> for TurnFailure {
    fn from(err: AgentError) -> Self {
        Self::from_error(&err)
    }
}

impl From<agent::LogError> for TurnFailure {
    fn from(err: agent::LogError) -> Self {
        Self::from_error(&err)
    }
}

fn check(signal: &Signal) -> Result<(), TurnFailure> {
    if signal.is_cancelled() {
        Err(TurnFailure::Cancelled)
    } else {
        Ok(())
    }
}

fn panicked(what: &str, payload: &(dyn std::any::Any + Send)) -> TurnFailure {
    TurnFailure::failed(LlmFailure::unknown(format!(
        "{what} panicked: {}",
        panic_message(payload)
    )))
}

/// What a step is built from, fixed at its pre-step.
pub(crate) struct AssembledPrompt {
    system: Option<String>,
    tools: Option<Vec<ToolSchema>>,
}

enum PreStepOutcome {
    Rejected,
    Enter(Vec<Message>, AssembledPrompt),
}

/// A pre-step whose synchronous part ran: its outcome, or the interceptor chain to await.
enum PreStepped<'a> {
    Ready(PreStepOutcome),
    Chain(futures::future::BoxFuture<'a, Result<PreStepOutcome, TurnFailure>>),
}

/// What a pre-step's interceptor chain borrows: the interceptors and the agent handle they see.
///
/// Kept by the pre-step rather than by the chain, so that a chain whose interceptors all complete
/// on their first poll (the common case) runs in the synchronous part of the pre-step, with no
/// boxed future; only an interceptor that is pending moves the rest of the chain into one,
/// which borrows from here. Dropped once the pre-step is decided.
#[derive(Default)]
struct PreStepHooks {
    hooks: agent::runtime::Hooks<dyn agent::PreStepInterceptor>,
    me: Option<agent::AgentRef>,
}

/// What one interceptor's call came to (its future wrapped in `catch_unwind`).
type PreStepCall = Result<Result<PreStepDecision, agent::bus::BoxError>, Box<dyn std::any::Any + Send>>;

/// The decision of one interceptor's call, or the turn's failure (a panic or an error).
#[inline(always)]
fn pre_step_decision(call: PreStepCall) -> Result<PreStepDecision, TurnFailure> {
    match call {
        Err(p) => Err(panicked("an agent/pre-step interceptor", &*p)),
        Ok(Err(e)) => Err(TurnFailure::from_error(&*e)),
        Ok(Ok(decision)) => Ok(decision),
    }
}

/// The pre-step outcome of the chain's final `decision`, with the step's assembled `prompt`.
fn entered(decision: PreStepDecision, prompt: AssembledPrompt) -> PreStepOutcome {
    match decision {
        PreStepDecision::Reject => PreStepOutcome::Rejected,
        PreStepDecision::Enter(messages) => PreStepOutcome::Enter(messages, prompt),
    }
}

/// The endings a turn body can record before its `turn/end` (the failure endings travel as
/// [`TurnFailure`]); one byte, where a [`TurnEndReason`] would enlarge the driver task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TurnEnd {
    Completed,
    Blocked,
    MaxTokens,
}

impl TurnEnd {
    fn reason(self) -> TurnEndReason {
        match self {
            Self::Completed => TurnEndReason::Completed,
            Self::Blocked => TurnEndReason::Blocked,
            Self::MaxTokens => TurnEndReason::MaxTokens,
        }
    }
}

/// How a step's stream closed.
enum StepClose {
    /// The step is over with this outcome.
    Ended(Option<TurnEnd>),
    /// The model asked for these tool calls.
    Tools(Vec<ToolCallRequest>),
}

/// A step's stream being drained, once its next chunk was not ready: the stream and what its
/// chunks came to so far.
struct Draining {
    stream: agent::ModelStream,
    assembly: Assembly,
}

/// What a step's logged chunks came to so far: the blocks assembled and the chunks' seqs.
///
/// Kept apart from the stream and handed on by reference, so that the synchronous path
/// (every chunk ready at once) closes the step without moving it.
struct Assembly {
    asm: BlockAssembler,
    seqs: Vec<u64>,
    /// The clock reading shared by the appends of the current synchronous batch: the step's
    /// opening, the chunks that were ready together and a close that follows them without
    /// waiting. Cleared whenever the stream is awaited.
    now: Option<u64>,
}

impl Assembly {
    /// The batch's timestamp: the clock is read by the batch's first append.
    fn now(&mut self) -> u64 {
        *self.now.get_or_insert_with(now_ms)
    }
}

/// What the synchronous part of a step's stream came to.
enum Streamed {
    /// The stream is over and the step closed.
    Closed(StepClose),
    /// The next chunk is not ready: the rest waits (boxed, off the driver task).
    Pending(Box<Draining>),
}

/// What the drain does after a turn (spine §8.6 step 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterTurn {
    /// The turn ended normally: go on while either list holds work.
    AnyPending,
    /// The turn failed: go on only for a queued prompt (`next-turn`), which was sent to the
    /// running driver and carries no wake of its own (§8.3 rule 1). Steering or context left
    /// in `next-step` stays pending until a wake (SPN-31).
    QueuedPrompt,
    /// Stop: the turn was blocked (§8.6 2.2) or aborted (SPN-15), its inbox claim failed, or
    /// its `turn/end` could not be logged.
    Stop,
}

/// Per-turn bookkeeping.
struct TurnState {
    /// The outcome of the turn's last step (`None`: it asked to continue), or `Blocked`.
    end: Option<TurnEnd>,
    /// Whether a step of the turn finished at the output-token ceiling: the turn then ends
    /// `max-tokens` (sticky, spine §4.4) — kept apart from `end`, which decides whether the turn
    /// goes on, so a later step whose tool calls ran still continues.
    max_tokens: bool,
    /// The number of the last opened step.
    step: u64,
    /// Whether claiming the inbox failed (the claim's splice could not be logged): the turn
    /// consumed nothing, so the drain must not go on to the next turn (it would fail the same
    /// way, forever).
    claim_failed: bool,
    /// Whether the session refused the last step's `step/end`: that step is still open in the
    /// log, so the turn cannot end yet (providers §6.4 S5).
    step_open: bool,
}

/// The error facts logged beside a failed `tool/result`.
fn result_error_name(code: &str) -> &'static str {
    match code {
        agent::tools::codes::CANCELLED | crate::tools::codes::ABORTED_BEFORE_DISPATCH => "AbortError",
        _ => "ToolError",
    }
}

/// [`Signal::run`] that creates the signal's token only when `fut` does not complete on its first
/// poll (hooks usually do): a signal cancelled at the call wins at once, otherwise the future is
/// polled first, as `Signal::run` does.
async fn run_signalled<F: Future>(signal: &Signal, fut: F) -> Result<F::Output, agent::CancelCause> {
    if signal.is_cancelled() {
        return Err(signal.cause().unwrap_or(agent::CancelCause::Disposed));
    }
    let mut fut = std::pin::pin!(fut);
    if let std::task::Poll::Ready(output) = futures::poll!(fut.as_mut()) {
        return Ok(output);
    }
    signal.run(fut).await
}

/// The next chunk of `stream`, or `None` when `signal` is cancelled first (cancellation wins).
async fn next_or_cancelled(
    stream: &mut agent::ModelStream,
    signal: &Signal,
) -> Option<Option<Result<StreamChunk, LlmFailure>>> {
    tokio::select! {
        biased;
        _ = signal.cancelled() => None,
        next = stream.next() => Some(next),
    }
}

impl LoopAgent {
    /// Runs one opened turn to its `turn/end`. Returns what the drain does next (see
    /// [`close_turn`](Self::close_turn)).
    ///
    /// `open` is borrowed (its claimed batch is taken) so that the driver task keeps one copy,
    /// and its number and signal are read from it rather than copied into the task. (An `async`
    /// block over the arguments rather than an `async fn`, whose arguments would be stored
    /// twice.)
    #[allow(clippy::manual_async_fn)]
    pub(crate) fn run_turn<'a>(
        &'a self,
        open: &'a mut OpenTurn,
    ) -> impl Future<Output = AfterTurn> + Send + 'a {
        async move {
            let mut ts = TurnState {
                end: None,
                max_tokens: false,
                step: 0,
                claim_failed: false,
                step_open: false,
            };
            // The first batch stays in `open` until the body takes it (borrowed: the driver
            // task keeps one copy).
            let first = match &mut open.claimed {
                Ok(batch) => batch,
                Err(_) => {
                    ts.claim_failed = true;
                    let Err(failure) = std::mem::replace(&mut open.claimed, Ok(Vec::new())) else {
                        unreachable!("matched as a failure just above")
                    };
                    return self.close_turn(open.turn, &open.signal, Err(failure), ts);
                }
            };
            let body = AssertUnwindSafe(self.turn_body(open.turn, &open.signal, first, &mut ts))
                .catch_unwind()
                .await
                .unwrap_or_else(|p| Err(panicked("the agent loop", &*p)));
            self.close_turn(open.turn, &open.signal, body, ts)
        }
    }

    /// Logs `turn/end` for a turn body's outcome. Returns what the drain does next: after a
    /// turn that ended normally it goes on with any pending work; after a failed one (unless
    /// its inbox claim failed, which consumed nothing) with a queued prompt; after a blocked or
    /// aborted one it stops.
    fn close_turn(
        &self,
        turn: u64,
        signal: &Signal,
        body: Result<bool, TurnFailure>,
        ts: TurnState,
    ) -> AfterTurn {
        let (reason, after) = match body {
            Ok(normal) => (
                match ts.end {
                    Some(TurnEnd::Blocked) => TurnEndReason::Blocked,
                    _ if ts.max_tokens => TurnEndReason::MaxTokens,
                    end => end.map_or(TurnEndReason::Completed, TurnEnd::reason),
                },
                if normal {
                    AfterTurn::AnyPending
                } else {
                    AfterTurn::Stop
                },
            ),
            Err(_) if signal.is_cancelled() => (
                TurnEndReason::Aborted {
                    reason: signal.cause().unwrap_or(agent::CancelCause::Disposed),
                },
                AfterTurn::Stop,
            ),
            Err(TurnFailure::Cancelled) => (
                TurnEndReason::Aborted {
                    reason: agent::CancelCause::Disposed,
                },
                AfterTurn::Stop,
            ),
            Err(TurnFailure::Failed(failure)) => {
                let failure = *failure;
                self.report_error(failure.clone());
                let after = if ts.claim_failed {
                    AfterTurn::Stop
                } else {
                    AfterTurn::QueuedPrompt
                };
                (TurnEndReason::Error { error: failure }, after)
            }
        };
        if ts.step_open {
            // The last step is still open in the log: no `turn/end` may follow it (providers
            // §6.4 S5). The refusal was reported; the drain stops and the next wake retries the
            // step's end, then this turn's, before anything else.
            self.state.lock().unclosed = Some(UnclosedTurn {
                turn,
                step: Some(ts.step),
                reason,
            });
            return AfterTurn::Stop;
        }
        // Kept for a retry should the session refuse the end (cloned: the append consumes it).
        let unclosed = UnclosedTurn {
            turn,
            step: None,
            reason: reason.clone(),
        };
        if let Err(err) = self.session.record(EventData::TurnEnd { turn, reason }, None) {
            // The turn stays open in the log: no turn may open over it (providers §6.4 S2), so
            // the drain stops and the next wake retries this end before anything else.
            self.report_error(turn_end_refused(&self.id, turn, &err));
            self.state.lock().unclosed = Some(unclosed);
            return AfterTurn::Stop;
        }
        after
    }

    /// Logs the `step/end` and then the `turn/end` the session refused earlier (spec §8.6:
    /// `step/end` and `turn/end` are always appended), the turn's with its original reason.
    /// Refused again, reports it and hands the turn back (still unclosed, with its step still
    /// open if that end was the one refused).
    pub(crate) fn close_unclosed(&self, unclosed: UnclosedTurn) -> Result<(), UnclosedTurn> {
        let UnclosedTurn { turn, step, reason } = unclosed;
        if let Some(step) = step
            && let Err(err) = self.session.record(EventData::StepEnd { turn, step }, None)
        {
            self.report_error(step_end_refused(&self.id, turn, step, &err));
            return Err(UnclosedTurn {
                turn,
                step: Some(step),
                reason,
            });
        }
        let retry = UnclosedTurn {
            turn,
            step: None,
            reason: reason.clone(),
        };
        match self.session.record(EventData::TurnEnd { turn, reason }, None) {
            Ok(_) => Ok(()),
            Err(err) => {
                self.report_error(turn_end_refused(&self.id, turn, &err));
                Err(retry)
            }
        }
    }

    /// The step loop of one turn. `Ok(true)`: the turn closed normally (also after an empty
    /// first batch); `Ok(false)`: it closed and the driver must stop (blocked); `Err`: aborted
    /// or failed.
    ///
    /// (An `async` block over the arguments rather than an `async fn`, whose arguments would be
    /// stored twice in the driver task.)
    fn turn_body<'a>(
        &'a self,
        turn: u64,
        signal: &'a Signal,
        first: &'a mut Vec<Message>,
        ts: &'a mut TurnState,
    ) -> impl Future<Output = Result<bool, TurnFailure>> + Send + 'a {
        let mut first = Some(first);
        async move {
            let mut target = InboxTarget::NextTurn;
            loop {
                check(signal)?;
                let step = ts.step + 1;
                let claimed = match first.take() {
                    Some(batch) => std::mem::take(batch),
                    None => self
                        .inbox
                        .claim(target, turn)
                        .inspect_err(|_| ts.claim_failed = true)?,
                };
                // A block, so that the step's messages and prompt (consumed by its opening) are
                // not kept in the driver task while the step runs.
                let opened = {
                    // The interceptors and the handle they see, for this pre-step only (not
                    // kept in the driver task while the step runs).
                    let mut chain = PreStepHooks::default();
                    let outcome = 'pre: {
                        // Only the chain's future is kept across the await: the pre-step's
                        // result (and the `?` on it) ends with the `let` statement.
                        let rest = match self.pre_step(turn, step, claimed, signal, &mut chain)? {
                            PreStepped::Ready(outcome) => break 'pre outcome,
                            PreStepped::Chain(rest) => rest,
                        };
                        rest.await?
                    };
                    // The interceptors (and the handle they saw) are released once decided.
                    drop(chain);
                    let (messages, prompt) = match outcome {
                        PreStepOutcome::Rejected => {
                            ts.end = Some(TurnEnd::Blocked);
                            return Ok(false);
                        }
                        PreStepOutcome::Enter(messages, prompt) => (messages, prompt),
                    };
                    if ts.end.is_some() && messages.is_empty() {
                        break;
                    }
                    if ts.step == 0 && messages.is_empty() {
                        // Nothing to do (what woke the driver was taken back before the claim).
                        // The turn still ends normally: work sent *during* it found the agent
                        // running, so its wake was not latched, and only the driver's own
                        // check for pending work (`after_turn`) can still pick it up.
                        ts.end = Some(TurnEnd::Completed);
                        return Ok(true);
                    }
                    check(signal)?;
                    // One clock reading for the step's synchronous opening: `step/start`, the
                    // entered messages and the request header and context are appended
                    // together, without waiting in between.
                    let now = now_ms();
                    self.session
                        .record_at(EventData::StepStart { turn, step }, None, now)?;
                    ts.step = step;
                    // The step's synchronous opening (entered messages, request, stream) runs
                    // outside the step future, which keeps the driver task small; a panic in
                    // either part is the step's.
                    std::panic::catch_unwind(AssertUnwindSafe(|| {
                        for message in messages {
                            self.session.record_at(
                                EventData::UserMessage(message),
                                Some(SurfaceMeta::append()),
                                now,
                            )?;
                        }
                        // The stream's first drain follows without waiting, so it shares the
                        // opening's clock reading.
                        self.open_stream(prompt, signal, now).map(|stream| (stream, now))
                    }))
                    .unwrap_or_else(|p| Err(panicked("a model step", &*p)))
                };
                let ran = AssertUnwindSafe(self.step(turn, step, opened, signal))
                    .catch_unwind()
                    .await
                    .unwrap_or_else(|p| Err(panicked("a model step", &*p)));
                let step_end = match self.session.record(EventData::StepEnd { turn, step }, None) {
                    Ok(_) => ran?,
                    Err(err) => {
                        // The step stays open in the log: neither a step nor the turn's end may
                        // follow it (providers §6.4 S5, S7), so the turn stops here and its end
                        // waits for the step's (see `close_turn`).
                        ts.step_open = true;
                        let refused = step_end_refused(&self.id, turn, step, &err);
                        match ran {
                            // The refusal is the turn's failure (reported with its end).
                            Ok(_) if !signal.is_cancelled() => {
                                return Err(TurnFailure::failed(refused));
                            }
                            // The step's own failure (or the abort) ends the turn; the refusal
                            // is reported beside it.
                            ran => {
                                self.report_error(refused);
                                ran?;
                                return Err(TurnFailure::Cancelled);
                            }
                        }
                    }
                };
                ts.max_tokens |= step_end == Some(TurnEnd::MaxTokens);
                ts.end = step_end;
                check(signal)?;
                if ts.end.is_some() && self.inbox.next_step_is_empty() {
                    self.turn_stopping(turn, signal).await?;
                    check(signal)?;
                }
                if ts.end.is_some() && self.inbox.next_step_is_empty() {
                    break;
                }
                target = InboxTarget::NextStep;
            }
            Ok(true)
        }
    }

    /// Serial `agent/turn-stopping` hooks (they may steer).
    async fn turn_stopping(&self, turn: u64, signal: &Signal) -> Result<(), TurnFailure> {
        let hooks = self.services.turn_stopping.hooks_for(&self.id);
        if hooks.is_empty() {
            return Ok(());
        }
        // Boxed: the hook loop is off the common path and would otherwise enlarge every
        // driver task.
        Box::pin(self.run_turn_stopping(hooks, turn, signal)).await
    }

    async fn run_turn_stopping(
        &self,
        hooks: agent::runtime::Hooks<dyn agent::TurnStoppingHook>,
        turn: u64,
        signal: &Signal,
    ) -> Result<(), TurnFailure> {
        let me = self.agent_ref();
        for hook in hooks.as_slice() {
            let call = AssertUnwindSafe(hook.turn_stopping(&me, turn, signal)).catch_unwind();
            match run_signalled(signal, call).await {
                Err(_) => return Err(TurnFailure::Cancelled),
                Ok(Err(p)) => return Err(panicked("an agent/turn-stopping hook", &*p)),
                Ok(Ok(Err(e))) => return Err(TurnFailure::from_error(&*e)),
                Ok(Ok(Ok(()))) => {}
            }
        }
        Ok(())
    }

    /// Pre-step: prompt assembly, the runtime-context snapshot, the interceptor chain.
    ///
    /// Runs synchronously as far as it can: each interceptor is called and polled once here (a
    /// cancelled signal wins before each call, as with [`run_signalled`]). Only when one is
    /// pending does the rest of the chain become a boxed future (it is off the common path and
    /// would otherwise enlarge every driver task), borrowing the interceptors and the agent
    /// handle from `chain`, which the turn keeps.
    fn pre_step<'a>(
        &'a self,
        turn: u64,
        step: u64,
        claimed: Vec<Message>,
        signal: &'a Signal,
        chain: &'a mut PreStepHooks,
    ) -> Result<PreStepped<'a>, TurnFailure> {
        let (prompt, contexts) = self.assemble_prompt()?;
        check(signal)?;
        let mut messages = claimed;
        messages.extend(self.snapshot_message(contexts));
        let PreStepHooks { hooks, me } = chain;
        *hooks = self.services.pre_step.hooks_for(&self.id);
        if hooks.is_empty() {
            check(signal)?;
            return Ok(PreStepped::Ready(PreStepOutcome::Enter(messages, prompt)));
        }
        let me: &'a agent::AgentRef = me.insert(self.agent_ref());
        let hooks: &'a [Arc<dyn agent::PreStepInterceptor>] = hooks.as_slice();
        let mut decision = PreStepDecision::Enter(messages);
        for (at, hook) in hooks.iter().enumerate() {
            if signal.is_cancelled() {
                return Err(TurnFailure::Cancelled);
            }
            let view = PreStep {
                agent: me,
                turn,
                step,
                signal,
            };
            let mut call = AssertUnwindSafe(hook.pre_step(view, decision)).catch_unwind();
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            decision = match call.poll_unpin(&mut cx) {
                std::task::Poll::Ready(result) => pre_step_decision(result)?,
                std::task::Poll::Pending => {
                    let rest = &hooks[at + 1..];
                    return Ok(PreStepped::Chain(Box::pin(async move {
                        // Polled again here, with the driver task's waker.
                        let decision = match signal.run(call).await {
                            Err(_) => return Err(TurnFailure::Cancelled),
                            Ok(result) => pre_step_decision(result)?,
                        };
                        let decision = self
                            .run_pre_step_hooks(rest, me, turn, step, decision, signal)
                            .await?;
                        check(signal)?;
                        Ok(entered(decision, prompt))
                    })));
                }
            };
        }
        check(signal)?;
        Ok(PreStepped::Ready(entered(decision, prompt)))
    }

    /// The rest of an `agent/pre-step` interceptor chain, in order, from `decision`.
    async fn run_pre_step_hooks(
        &self,
        hooks: &[Arc<dyn agent::PreStepInterceptor>],
        me: &agent::AgentRef,
        turn: u64,
        step: u64,
        mut decision: PreStepDecision,
        signal: &Signal,
    ) -> Result<PreStepDecision, TurnFailure> {
        for hook in hooks {
            let view = PreStep {
                agent: me,
                turn,
                step,
                signal,
            };
            let call = AssertUnwindSafe(hook.pre_step(view, decision)).catch_unwind();
            decision = match run_signalled(signal, call).await {
                Err(_) => return Err(TurnFailure::Cancelled),
                Ok(result) => pre_step_decision(result)?,
            };
        }
        Ok(decision)
    }

    /// Renders the system text, collects tool schemas and renders the runtime contexts.
    fn assemble_prompt(
        &self,
    ) -> Result<(AssembledPrompt, Vec<agent::message::SnapshotSection>), TurnFailure> {
        let registry = &self.services.prompt;
        // The variables are only built when a persona section references them.
        let mut vars: Option<PromptVariables> = None;
        let system = prompt::render_sections(&registry.sections(Some(&self.id)), |section| {
            let vars = vars.get_or_insert_with(|| PromptVariables {
                model: self.options.model.as_deref().map(str::to_owned),
                cwd: self
                    .session
                    .header()
                    .cwd
                    .as_ref()
                    .map(|p| p.display().to_string()),
                provider: self.options.provider.as_deref().map(str::to_owned),
            });
            prompt::interpolate(&section.text, vars, &section.name)
        })
        .map_err(|e| TurnFailure::failed(LlmFailure::unknown(e.to_string())))?;
        let tools = self.services.tools.schemas(Some(&self.id));
        let contexts = prompt::render_contexts(registry.runtime_contexts(Some(&self.id)), &self.id);
        Ok((
            AssembledPrompt {
                system,
                tools: (!tools.is_empty()).then_some(tools),
            },
            contexts,
        ))
    }

    /// The snapshot message to enter for the rendered `contexts`, compared with the last
    /// runtime-context snapshot the log holds (scanned incrementally).
    fn snapshot_message(&self, contexts: Vec<agent::message::SnapshotSection>) -> Option<Message> {
        let text = {
            let events = self.session.events();
            let mut st = self.state.lock();
            let (scanned, retained) = &mut st.snapshot_scan;
            for event in events.iter().skip(*scanned) {
                if let EventData::UserMessage(m) = &event.data
                    && prompt::is_snapshot_message(m)
                {
                    *retained = RetainedSnapshot::Last(prompt::snapshot_message_text(m));
                }
            }
            *scanned = events.len();
            prompt::changed_snapshot_text(&contexts, retained)?
        };
        Some(prompt::snapshot_message_from(contexts, text))
    }

    /// Logs `request/header` (initial or resume first, change when it differs) and
    /// `request/context` when the route changed, both at `now` (the step opening's clock reading).
    fn log_request(&self, header: &EpochHeader, now: u64) -> Result<(), TurnFailure> {
        // Both decisions are taken on the log as it is now (the header append cannot change
        // the context decision), and the snapshot is released before appending: an
        // outstanding snapshot would make the append copy the whole log.
        let (reason, logged, context_changed) = {
            let events = self.session.events();
            // One backward scan finds the last header and the last context.
            let mut baseline = None;
            let mut previous = None;
            for event in events.iter().rev() {
                match &event.data {
                    EventData::RequestHeader { header, .. } if baseline.is_none() => {
                        baseline = Some(&**header)
                    }
                    EventData::RequestContext {
                        provider,
                        model,
                        context_window,
                    } if previous.is_none() => previous = Some((provider, model, context_window)),
                    _ => continue,
                }
                if baseline.is_some() && previous.is_some() {
                    break;
                }
            }
            let logged = std::mem::replace(&mut self.state.lock().request_header_logged, true);
            let reason = if !logged {
                Some(if self.resumed || baseline.is_some() {
                    RequestHeaderReason::Resume
                } else {
                    RequestHeaderReason::Initial
                })
            } else if baseline != Some(header) {
                Some(RequestHeaderReason::Change)
            } else {
                None
            };
            let changed = previous.is_none_or(|(p, m, w)| {
                *p != header.config.provider || *m != header.config.model || w.is_some()
            });
            (reason, logged, changed)
        };
        if let Some(reason) = reason {
            let appended = self.session.record_at(
                EventData::RequestHeader {
                    header: Box::new(header.clone()),
                    reason,
                },
                None,
                now,
            );
            if appended.is_err() && !logged {
                self.state.lock().request_header_logged = false;
            }
            appended?;
        }
        if context_changed {
            self.session.record_at(
                EventData::RequestContext {
                    provider: header.config.provider.clone(),
                    model: header.config.model.clone(),
                    context_window: None,
                },
                None,
                now,
            )?;
        }
        Ok(())
    }

    /// The derived history of the log as it is now (spec §4.6), kept incrementally.
    fn derived_history(&self) -> MessageList {
        let events = self.session.events();
        let mut st = self.state.lock();
        st.history.update(&events);
        st.history.message_list()
    }

    /// The synchronous opening of a step: the request header logged, the request built and the
    /// model stream opened. `now` is the step opening's clock reading.
    fn open_stream(
        &self,
        prompt: AssembledPrompt,
        signal: &Signal,
        now: u64,
    ) -> Result<agent::ModelStream, TurnFailure> {
        let (provider, model) = match (&self.options.provider, &self.options.model) {
            (Some(p), Some(m)) if !p.is_empty() && !m.is_empty() => (p, m),
            _ => {
                return Err(TurnFailure::failed(LlmFailure::unknown(format!(
                    "agent \"{}\" has no provider/model: set AgentOptions.provider and AgentOptions.model",
                    self.id
                ))));
            }
        };
        let header = EpochHeader {
            config: CallConfig {
                provider: provider.clone(),
                model: model.clone(),
                max_tokens: self.options.max_tokens,
                ..CallConfig::default()
            },
            adapter_defaults: None,
            system: prompt.system,
            tools: prompt.tools,
        };
        self.log_request(&header, now)?;
        check(signal)?;
        let adapter = self.services.models.adapter(provider).ok_or_else(|| {
            TurnFailure::failed(LlmFailure::new(
                "NO_ADAPTER",
                format!("no model adapter is registered for provider \"{provider}\""),
            ))
        })?;
        // The header is logged; the request takes its routes, system text and tools.
        let EpochHeader {
            config,
            system,
            tools,
            ..
        } = header;
        let request = Arc::new(GenerateOptions {
            provider: config.provider,
            model: config.model,
            messages: self.derived_history(),
            system,
            tools,
            temperature: None,
            max_tokens: config.max_tokens,
            stop: None,
            reasoning_effort: None,
            signal: signal.clone(),
            session_id: Some(self.id.clone()),
            loop_built: true,
            extra: serde_json::Map::new(),
        });
        Ok(adapter.stream(request))
    }

    /// One step over its `opened` stream and the opening's clock reading (or the failure opening
    /// it): chunks, assistant
    /// message, tool calls. Returns the step outcome (`None`: tool calls ran and none concluded
    /// the turn).
    ///
    /// Only waiting for a chunk and the tool calls are asynchronous, and both are boxed; the
    /// rest runs in synchronous helpers ([`open_stream`](Self::open_stream),
    /// [`stream_ready`](Self::stream_ready), [`close_step`](Self::close_step)), which keeps the
    /// driver task small. (An `async` block over the arguments rather than an `async fn`, whose
    /// arguments would be stored twice.)
    #[allow(clippy::manual_async_fn)]
    fn step<'a>(
        &'a self,
        turn: u64,
        step: u64,
        opened: Result<(agent::ModelStream, u64), TurnFailure>,
        signal: &'a Signal,
    ) -> impl Future<Output = Result<Option<TurnEnd>, TurnFailure>> + Send + 'a {
        async move {
            // A block, so that neither the stream's state nor its close is kept across the
            // tool calls.
            let calls = {
                let (stream, now) = opened?;
                let streamed = self.stream_ready(turn, step, stream, now, signal)?;
                let close = match streamed {
                    Streamed::Closed(close) => close,
                    // Boxed: waiting is the slow path, and the draining state (assembler, chunk
                    // seqs) would otherwise enlarge every driver task.
                    Streamed::Pending(draining) => {
                        Box::pin(self.stream_rest(turn, step, draining, signal)).await?
                    }
                };
                match close {
                    StepClose::Ended(end) => return Ok(end),
                    StepClose::Tools(calls) => calls,
                }
            };
            // Boxed: tool execution would otherwise enlarge every driver task.
            Box::pin(self.run_tools(turn, step, calls, signal)).await
        }
    }

    /// Drains the chunks of `stream` that are ready now; when the stream is over, closes the
    /// step, otherwise hands the draining state on for [`stream_rest`](Self::stream_rest).
    /// `now` is the clock reading of the step's opening, which ran without waiting since.
    fn stream_ready(
        &self,
        turn: u64,
        step: u64,
        mut stream: agent::ModelStream,
        now: u64,
        signal: &Signal,
    ) -> Result<Streamed, TurnFailure> {
        let mut assembly = Assembly {
            asm: BlockAssembler::default(),
            // Presized for a typical short stream, so it does not regrow chunk by chunk.
            seqs: Vec::with_capacity(8),
            now: Some(now),
        };
        if self.drain_ready(turn, step, &mut stream, &mut assembly, signal)? {
            // The stream is dropped before the step closes.
            drop(stream);
            return self
                .close_step(turn, step, &mut assembly, signal)
                .map(Streamed::Closed);
        }
        Ok(Streamed::Pending(Box::new(Draining { stream, assembly })))
    }

    /// The rest of a stream whose next chunk was not ready: waits for chunks (cancellation
    /// wins), then closes the step.
    async fn stream_rest(
        &self,
        turn: u64,
        step: u64,
        mut draining: Box<Draining>,
        signal: &Signal,
    ) -> Result<StepClose, TurnFailure> {
        let Draining { stream, assembly } = &mut *draining;
        loop {
            let next = next_or_cancelled(stream, signal).await;
            // The stream was awaited: a new batch, with its own clock reading.
            assembly.now = None;
            match next {
                None => break,
                Some(next) => {
                    if self.take_chunk(turn, step, assembly, next, signal)? {
                        break;
                    }
                }
            }
            if self.drain_ready(turn, step, stream, assembly, signal)? {
                break;
            }
        }
        let Draining { stream, mut assembly } = *draining;
        // The stream is dropped before the step closes.
        drop(stream);
        self.close_step(turn, step, &mut assembly, signal)
    }

    /// Takes the chunks that are ready now. Returns whether the stream is over (ended, finished,
    /// failed, or the signal cancelled — cancellation wins over a ready chunk); `false` when
    /// the next chunk is not ready.
    fn drain_ready(
        &self,
        turn: u64,
        step: u64,
        stream: &mut agent::ModelStream,
        assembly: &mut Assembly,
        signal: &Signal,
    ) -> Result<bool, TurnFailure> {
        // Polled directly (no `next()` future around the stream), with a waker that does
        // nothing: a pending stream is awaited again by `stream_rest`.
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            if signal.is_cancelled() {
                return Ok(true);
            }
            let std::task::Poll::Ready(next) = stream.as_mut().poll_next(&mut cx) else {
                return Ok(false);
            };
            if self.take_chunk(turn, step, assembly, next, signal)? {
                return Ok(true);
            }
        }
    }

    /// Logs one item of the stream. Returns whether the stream is over: its end, a finish
    /// chunk, or an adapter throw (logged as a terminal finish).
    #[inline(always)]
    fn take_chunk(
        &self,
        turn: u64,
        step: u64,
        assembly: &mut Assembly,
        next: Option<Result<StreamChunk, LlmFailure>>,
        signal: &Signal,
    ) -> Result<bool, TurnFailure> {
        match next {
            None => Ok(true),
            Some(Ok(chunk)) => {
                let finish = matches!(chunk, StreamChunk::Finish { .. });
                self.log_chunk(turn, step, assembly, chunk)?;
                Ok(finish)
            }
            Some(Err(failure)) => {
                // An adapter throw becomes a terminal finish.
                let reason = if signal.is_cancelled() || failure.code == "ABORTED" {
                    FinishReason::Aborted { failure }
                } else {
                    FinishReason::Error { failure }
                };
                self.log_chunk(
                    turn,
                    step,
                    assembly,
                    StreamChunk::Finish {
                        reason,
                        replay_state: None,
                    },
                )?;
                Ok(true)
            }
        }
    }

    /// Assembles and logs one chunk, keeping its seq.
    #[inline(always)]
    fn log_chunk(
        &self,
        turn: u64,
        step: u64,
        assembly: &mut Assembly,
        chunk: StreamChunk,
    ) -> Result<(), TurnFailure> {
        assembly.asm.push(&chunk);
        let now = assembly.now();
        let seq = self
            .session
            .record_at(EventData::AssistantChunk { turn, step, chunk }, None, now)?;
        assembly.seqs.push(seq);
        Ok(())
    }

    /// The synchronous close of a step's drained stream (already dropped): the assistant
    /// message logged (or the interrupted prefix on cancellation) and the tool calls to run.
    /// Takes what it logs out of `assembly`, which is spent afterwards.
    fn close_step(
        &self,
        turn: u64,
        step: u64,
        assembly: &mut Assembly,
        signal: &Signal,
    ) -> Result<StepClose, TurnFailure> {
        let Assembly { asm, seqs, now } = assembly;
        let seqs = std::mem::take(seqs);
        let now = *now;
        let (provider, model) = match (&self.options.provider, &self.options.model) {
            (Some(p), Some(m)) => (p, m),
            _ => unreachable!("open_stream checked the routes"),
        };
        if signal.is_cancelled() {
            let content = asm.interrupted_blocks();
            if !content.is_empty() {
                self.session.record_at(
                    EventData::AssistantMessage {
                        turn,
                        step,
                        message: Message::assistant(content, provider.clone(), model.clone()),
                        usage: asm.take_usage(),
                        interrupted: true,
                    },
                    Some(SurfaceMeta {
                        surface_op: Some(agent::SurfaceOp::Append),
                        source_event_seqs: Some(seqs),
                    }),
                    now.unwrap_or_else(now_ms),
                )?;
            }
            return Err(TurnFailure::Cancelled);
        }
        // Borrowed, not copied: the step goes on only for a finish that carries nothing.
        let finish = asm.finish();
        match finish {
            FinishReason::Error { failure } => return Err(TurnFailure::failed(failure.clone())),
            // An abort the turn's signal did not cause is a failure coded `ABORTED`.
            FinishReason::Aborted { failure } => {
                let mut failure = failure.clone();
                failure.code = "ABORTED".to_owned();
                return Err(TurnFailure::failed(failure));
            }
            // An open-union kind this runtime does not know is a failure (spine §13.3).
            FinishReason::Unknown { kind, .. } => {
                return Err(TurnFailure::failed(LlmFailure::new(
                    "UNKNOWN_FINISH",
                    format!("the model stream finished with unknown kind `{kind}`"),
                )));
            }
            _ => {}
        }
        let max_tokens = *finish == FinishReason::MaxTokens;
        let usage = asm.take_usage();
        let state = asm.take_replay_state();
        // The assembler's blocks are moved into the message, not copied.
        let mut blocks = asm.take_blocks();
        make_call_ids_unique(&mut blocks);
        let mut message = Message::assistant(blocks, provider.clone(), model.clone());
        if let (Some(state), MessageSource::Model { replay_state, .. }) = (state, &mut message.source) {
            *replay_state = Some(state);
        }
        let calls: Vec<ToolCallRequest> = message
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::ToolCall { id, name, arguments } => Some(ToolCallRequest {
                    call_id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                }),
                _ => None,
            })
            .collect();
        self.session.record_at(
            EventData::AssistantMessage {
                turn,
                step,
                message,
                usage,
                interrupted: false,
            },
            Some(SurfaceMeta {
                surface_op: Some(agent::SurfaceOp::Append),
                source_event_seqs: Some(seqs),
            }),
            now.unwrap_or_else(now_ms),
        )?;
        if max_tokens {
            return Ok(StepClose::Ended(Some(TurnEnd::MaxTokens)));
        }
        if calls.is_empty() {
            return Ok(StepClose::Ended(Some(TurnEnd::Completed)));
        }
        Ok(StepClose::Tools(calls))
    }

    /// Logs and executes one step's tool calls; results are logged in model order.
    async fn run_tools(
        &self,
        turn: u64,
        step: u64,
        calls: Vec<ToolCallRequest>,
        signal: &Signal,
    ) -> Result<Option<TurnEnd>, TurnFailure> {
        for call in &calls {
            self.session.record(
                EventData::ToolCall {
                    turn,
                    step,
                    call_id: call.call_id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                },
                None,
            )?;
        }
        // Each success keeps its discard hooks armed until its `tool/result` is logged: if the
        // log refuses one (an observer's veto, a failing persistence), the `?` below drops it
        // and every later result of the step undelivered, and each success the model will
        // never see undoes what it registered to undo (a `job_output` read gives its claim on
        // the job's report back, so the completion notice still delivers the output).
        let committed = crate::tools::run_step_calls_armed(
            &*self.services.tools,
            &self.id,
            calls,
            signal,
            self.config.tool_pool,
        )
        .await;
        let mut concluded = false;
        let mut deferred = Vec::new();
        for CommittedTool {
            executed: done,
            delivery,
        } in committed
        {
            let result = done.result;
            concluded |= !result.is_error && result.concludes_turn;
            deferred.extend(done.deferred);
            self.session.record(
                EventData::ToolResult {
                    turn,
                    step,
                    message: Message::tool_result(
                        done.execution.call_id.clone(),
                        result.content,
                        result.is_error,
                    ),
                    error: result.error.map(|e| {
                        Box::new(ToolResultError {
                            name: result_error_name(&e.code).to_owned(),
                            code: e.code,
                        })
                    }),
                    meta: result.meta.map(Box::new),
                },
                Some(SurfaceMeta::append()),
            )?;
            delivery.delivered();
        }
        if !deferred.is_empty() {
            // The deferred contexts are for the next step of this turn. A cancelled turn has
            // none: appended after `cancel` cleared the inbox, they would reach the next,
            // unrelated turn (or sit in a disposed agent's inbox). Decided under the inbox's
            // operation lock, like a `send`, so a `cancel` on another thread either cleared
            // them or is seen here (its `aborting` mark precedes the signal's cancellation).
            let _exclusive = self.inbox.exclusive();
            if !signal.is_cancelled() && !self.state.lock().phase.is_aborting() {
                for message in deferred {
                    self.inbox.append(InboxTarget::NextStep, message)?;
                }
            }
        }
        Ok((concluded).then_some(TurnEnd::Completed))
    }
}

/// Gives every tool call of one assistant response a distinct call id.
///
/// The session invariants key a step's pending calls by id (`inprocess-providers.md` §6.4
/// S11/S12: a `tool/result` answers a pending call of its step), and chat APIs pair each call
/// with the one result that names it, so two calls of one response under the same id (a
/// misbehaving server or adapter) could be answered only once: the second `tool/result` was
/// rejected and the model's conversation left a call without its result. The spec is silent on
/// this input; a later call that repeats an earlier id of the same response is re-keyed
/// `<id>_<n>` (the first `n ≥ 2` still free in the response; `_` and digits keep the id
/// within the `[A-Za-z0-9_-]` alphabet strict chat APIs accept), with a warning, so every call
/// runs and gets exactly one result. The first occurrence keeps its id. Linear in the number of
/// calls.
fn make_call_ids_unique(blocks: &mut [ContentBlock]) {
    let calls = blocks
        .iter()
        .filter(|b| matches!(b, ContentBlock::ToolCall { .. }))
        .count();
    if calls < 2 {
        return;
    }
    let mut seen: std::collections::HashSet<CallId> = std::collections::HashSet::new();
    let mut duplicates = Vec::new();
    for (at, block) in blocks.iter().enumerate() {
        if let ContentBlock::ToolCall { id, .. } = block
            && !seen.insert(id.clone())
        {
            duplicates.push(at);
        }
    }
    // The next suffix to try per repeated id, so many repeats of one id stay linear.
    let mut next: std::collections::HashMap<CallId, u64> = std::collections::HashMap::new();
    for at in duplicates {
        if let ContentBlock::ToolCall { id, name, .. } = &mut blocks[at] {
            let n = next.entry(id.clone()).or_insert(2);
            let fresh = loop {
                let candidate = CallId::new(format!("{id}_{n}"));
                *n += 1;
                if !seen.contains(&candidate) {
                    break candidate;
                }
            };
            tracing::warn!(tool = %name, call_id = %id, renamed = %fresh, "the model repeated a tool call id within one response; the repeat was re-keyed");
            seen.insert(fresh.clone());
            *id = fresh;
        }
    }
}

#[cfg(test)]
mod run_signalled_tests {
    use super::*;
    use agent::CancelCause;

    /// A signal cancelled at the call wins over a ready future; a ready future completes; a
    /// pending one loses to a later cancellation (as with `Signal::run`).
    #[tokio::test(start_paused = true)]
    async fn matches_signal_run() {
        let cancelled = Signal::cancelled_with(CancelCause::Parent);
        assert_eq!(
            run_signalled(&cancelled, async { 1 }).await,
            Err(CancelCause::Parent)
        );
        let live = Signal::new();
        assert_eq!(run_signalled(&live, async { 2 }).await, Ok(2));
        let canceller = live.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            canceller.cancel(CancelCause::User);
        });
        assert_eq!(
            run_signalled(&live, futures::future::pending::<()>()).await,
            Err(CancelCause::User)
        );
        let slow = Signal::new();
        let later = run_signalled(&slow, async {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            3
        });
        assert_eq!(later.await, Ok(3));
    }
}

#[cfg(test)]
mod pre_step_chain_tests {
    use super::*;
    use crate::model::{ScriptedModel, chunks};
    use crate::runtime::testkit::*;

    /// An interceptor that appends `text` to the entered messages, after a wait (on the paused
    /// clock) when `slow`, and panics after its wait when `text` is `"panic"`.
    struct Append {
        text: &'static str,
        slow: bool,
    }

    #[async_trait::async_trait]
    impl agent::PreStepInterceptor for Append {
        async fn pre_step(
            &self,
            _step: PreStep<'_>,
            proposed: PreStepDecision,
        ) -> Result<PreStepDecision, agent::BoxError> {
            if self.slow {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert_ne!(self.text, "panic", "the interceptor panicked");
            Ok(match proposed {
                PreStepDecision::Enter(mut messages) => {
                    messages.push(user(self.text));
                    PreStepDecision::Enter(messages)
                }
                PreStepDecision::Reject => PreStepDecision::Reject,
            })
        }
    }

    fn add(rt: &crate::runtime::Runtime, text: &'static str, slow: bool) -> agent::Registration {
        rt.services().pre_step.add(None, Arc::new(Append { text, slow }))
    }

    /// spec: §8.7 — the `agent/pre-step` waterfall runs in order whether an interceptor
    /// completes at once or has to wait: the interceptors after a waiting one see its decision,
    /// and the step enters what the last one decided.
    #[tokio::test(start_paused = true)]
    async fn a_waiting_interceptor_hands_its_decision_on_down_the_chain() {
        let model = ScriptedModel::new([chunks::text("reply")]);
        let rt = runtime(&model);
        let hooks = [add(&rt, "a", false), add(&rt, "b", true), add(&rt, "c", false)];
        let handle = create(&rt, "x").await;
        let agent = handle.agent().clone();
        agent.followup(user("go")).unwrap();
        agent.when_idle().await;
        assert_eq!(user_texts(&*agent), ["go", "a", "b", "c"]);
        assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
        assert_eq!(model.requests().len(), 1);
        drop(hooks);
        finish(&rt, [handle]).await;
    }

    /// spec: SPN-31 — an interceptor that panics after waiting ends the turn with an error and
    /// no model call, as one that panics at once does.
    #[tokio::test(start_paused = true)]
    async fn an_interceptor_panicking_after_a_wait_ends_the_turn() {
        let model = ScriptedModel::new([chunks::text("reply")]);
        let rt = runtime(&model);
        let hooks = [
            add(&rt, "a", false),
            add(&rt, "panic", true),
            add(&rt, "c", false),
        ];
        let handle = create(&rt, "x").await;
        let agent = handle.agent().clone();
        agent.followup(user("go")).unwrap();
        agent.when_idle().await;
        assert!(model.requests().is_empty());
        assert_eq!(count(&*agent, "step/start"), 0);
        let ends = turn_ends(&*agent);
        assert!(
            matches!(&ends[..], [TurnEndReason::Error { error }] if error.message.starts_with("an agent/pre-step interceptor panicked")),
            "{ends:?}"
        );
        drop(hooks);
        finish(&rt, [handle]).await;
    }
}
