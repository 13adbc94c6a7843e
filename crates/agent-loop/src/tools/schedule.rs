//! Scheduling one step's tool calls (spec §11.6).

use std::future::Future;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use agent::tools::{ExecutedTool, ToolCallRequest, Tools};
use agent::{SessionId, Signal};

use super::pipeline::{CommittedTool, Dispatched, RaceCheck, error_result, new_execution};
use super::{ToolRegistry, codes, model_text};

/// Runs one assistant step's tool calls for `agent` and returns one result per call, in the
/// model's order.
///
/// * A call is **exclusive** unless the definition `agent` sees under its name is
///   `concurrency_safe` (unknown and restricted tools are exclusive: fail closed). An exclusive
///   call is a barrier: its whole pipeline, including the `tools/result` observers, completes
///   before the next call starts, and it starts only after every earlier call completed.
/// * A run of consecutive concurrency-safe calls executes in a rolling pool of `pool` calls
///   (`0` is treated as `1`): calls start in model order, and a slot is refilled with the next
///   call as soon as any running call's body settles, so one slow call never holds back later
///   starts while other slots are free.
/// * Model-order commit (spec §11.6: "pre/post policy, `tool/result` events and additional
///   contexts are committed in model order"): when `tools` is a [`ToolRegistry`] (recognised
///   through [`Tools::as_any`]), a parallel run's bodies may settle in any order, but each
///   call's post-execute policies, normalisation and `tools/result` observers run only after
///   every earlier call of the run was committed, so they see the calls in model order.
///   Pre-execute policies and guards run when a call starts, hence also in model order. A
///   success whose body settled before the step was cancelled stays a success even if its
///   commit waited for an earlier call past the cancellation.
/// * Cancellation (`signal`): each call gets its own [child](Signal::child) of `signal`, so a
///   body cancelling the signal it was handed cancels only itself, never its siblings or the
///   step (the reference hands tools a signal they cannot fire at all). A cancellation of the
///   step reaches every call: calls already started drain (their bodies observe their signals,
///   so they settle promptly as cancelled); calls not yet started receive a synthetic
///   error result — `tool call not started: the step was cancelled`, code `CANCELLED` — without
///   entering the pipeline (no policy, guard or observer sees them).
///
/// Modes are classified when a run of calls is formed, so a registration made by an exclusive
/// call is seen by the calls after it.
///
/// Limitation: for any other [`Tools`] implementation (whose [`Tools::as_any`] does not yield a
/// [`ToolRegistry`]) the scheduler can only call [`Tools::execute`], which runs the whole
/// pipeline; inside a parallel run its post-execute policies and result observers then run in
/// completion order, and only the returned results are re-ordered.
///
/// The results are handed over as delivered: a caller that may fail to pass a success on to the
/// model (its `tool/result` append can be refused) uses [`run_step_calls_armed`] instead.
pub async fn run_step_calls(
    tools: &dyn Tools,
    agent: &SessionId,
    calls: Vec<ToolCallRequest>,
    signal: &Signal,
    pool: usize,
) -> Vec<ExecutedTool> {
    run_step_calls_armed(tools, agent, calls, signal, pool)
        .await
        .into_iter()
        .map(CommittedTool::deliver)
        .collect()
}

/// [`run_step_calls`], with every committed success's
/// [`on_discarded`](agent::tools::ToolContext::on_discarded) hooks still armed in its
/// [`Delivery`](super::Delivery): the caller [delivers](super::Delivery::delivered) each outcome once it reached the
/// model (its `tool/result` is logged), and one it drops undelivered — refused by the log,
/// abandoned with the rest of a failed step — runs its hooks, so a success the model never
/// saw undoes the side effects it registered (a `job_output` read gives its claim on the job's
/// report back). Exclusive calls are armed like parallel ones. Results of a [`Tools`]
/// implementation other than [`ToolRegistry`] arm nothing: [`Tools::execute`] keeps the
/// contexts to itself. Dropping this future drops the calls it committed so far undelivered.
pub async fn run_step_calls_armed(
    tools: &dyn Tools,
    agent: &SessionId,
    calls: Vec<ToolCallRequest>,
    signal: &Signal,
    pool: usize,
) -> Vec<CommittedTool> {
    let pool = pool.max(1);
    let registry = tools.as_any().and_then(|any| any.downcast_ref::<ToolRegistry>());
    let mut results = Vec::with_capacity(calls.len());
    let mut pending = calls.into_iter().peekable();
    while let Some(call) = pending.next() {
        if signal.is_cancelled() {
            results.push(not_started(agent, call));
            results.extend(pending.by_ref().map(|call| not_started(agent, call)));
            break;
        }
        if !concurrency_safe(tools, agent, &call) {
            let committed = match registry {
                Some(registry) => registry.run_armed(agent, call, signal.child()).await,
                None => CommittedTool::unarmed(tools.execute(agent, call, signal.child()).await),
            };
            results.push(committed);
            continue;
        }
        let mut group = vec![call];
        while let Some(call) = pending.next_if(|c| concurrency_safe(tools, agent, c)) {
            group.push(call);
        }
        match registry {
            Some(registry) => {
                let start = move |call: ToolCallRequest| async move {
                    if signal.is_cancelled() {
                        Slot::NotStarted(not_started(agent, call))
                    } else {
                        Slot::Dispatched(registry.dispatch(agent, call, signal.child()).await)
                    }
                };
                let commit = |slot| match slot {
                    Slot::NotStarted(executed) => executed,
                    Slot::Dispatched(dispatched) => registry.commit(dispatched, RaceCheck::AtSettle),
                };
                rolling_pool(group, pool, start, commit, &mut results).await;
            }
            None => {
                let start = move |call: ToolCallRequest| async move {
                    if signal.is_cancelled() {
                        not_started(agent, call)
                    } else {
                        CommittedTool::unarmed(tools.execute(agent, call, signal.child()).await)
                    }
                };
                rolling_pool(group, pool, start, |committed| committed, &mut results).await;
            }
        }
    }
    results
}

/// A parallel call of a [`ToolRegistry`] whose body phase is over, awaiting its commit.
enum Slot {
    /// The step was cancelled before the call started: a synthetic, already final result.
    NotStarted(CommittedTool),
    /// The call ran up to its body; post-execute, normalisation and observers are due.
    Dispatched(Dispatched),
}

/// Runs `calls` through `start` with at most `pool` in flight, refilling a slot as soon as any
/// call settles, and passes each settled call to `commit` in model order: a call is committed
/// once it and every earlier call settled. Committed results are appended to `results`.
async fn rolling_pool<S, Fut>(
    calls: Vec<ToolCallRequest>,
    pool: usize,
    start: impl Fn(ToolCallRequest) -> Fut,
    mut commit: impl FnMut(S) -> CommittedTool,
    results: &mut Vec<CommittedTool>,
) where
    Fut: Future<Output = S>,
{
    let mut settled: Vec<Option<S>> = calls.iter().map(|_| None).collect();
    let mut next_commit = 0;
    let mut queue = calls.into_iter().enumerate();
    let mut in_flight = FuturesUnordered::new();
    let launch = |(index, call)| {
        let fut = start(call);
        async move { (index, fut.await) }
    };
    in_flight.extend(queue.by_ref().take(pool).map(launch));
    while let Some((index, outcome)) = in_flight.next().await {
        settled[index] = Some(outcome);
        while let Some(outcome) = settled.get_mut(next_commit).and_then(Option::take) {
            results.push(commit(outcome));
            next_commit += 1;
        }
        if let Some(next) = queue.next() {
            in_flight.push(launch(next));
        }
    }
    debug_assert_eq!(next_commit, settled.len(), "every call of a run is committed");
}

fn concurrency_safe(tools: &dyn Tools, agent: &SessionId, call: &ToolCallRequest) -> bool {
    tools
        .get(&call.name, Some(agent))
        .is_some_and(|d| d.concurrency_safe)
}

/// The synthetic result of a call a cancelled step never started.
fn not_started(agent: &SessionId, call: ToolCallRequest) -> CommittedTool {
    CommittedTool::unarmed(ExecutedTool {
        execution: new_execution(agent, call),
        result: error_result(codes::CANCELLED, model_text::NOT_STARTED),
        deferred: Vec::new(),
    })
}
