//! Scheduling one step's tool calls (spec §11.6).

use futures::StreamExt;
use futures::stream;

use agent::tools::{ExecutedTool, ToolCallRequest, Tools};
use agent::{SessionId, Signal};

use super::pipeline::{error_result, new_execution};
use super::{codes, model_text};

/// Runs one assistant step's tool calls for `agent` and returns one result per call, in the
/// model's order.
///
/// * A call is **exclusive** unless the definition `agent` sees under its name is
///   `concurrency_safe` (unknown and restricted tools are exclusive: fail closed). An exclusive
///   call is a barrier: its whole pipeline, including the `tools/result` observers, completes
///   before the next call starts, and it starts only after every earlier call completed.
/// * A run of consecutive concurrency-safe calls executes in a bounded pool of `pool` calls
///   (`0` is treated as `1`), started in model order; results come back in model order.
/// * Cancellation (`signal`): calls already started drain (their bodies observe the same
///   `signal`, so they settle promptly as cancelled); calls not yet started receive a synthetic
///   error result — `tool call not started: the step was cancelled`, code `CANCELLED` — without
///   entering the pipeline (no policy, guard or observer sees them).
///
/// Modes are classified when a run of calls is formed, so a registration made by an exclusive
/// call is seen by the calls after it.
///
/// Limitation: inside a parallel run, pre-execute policies and guards run in model order (each
/// call's pipeline is first polled in order and they are synchronous), but post-execute
/// policies and result observers run in completion order; only the returned results are
/// re-ordered. Tools whose observers need model order must stay exclusive.
pub async fn run_step_calls(
    tools: &dyn Tools,
    agent: &SessionId,
    calls: Vec<ToolCallRequest>,
    signal: &Signal,
    pool: usize,
) -> Vec<ExecutedTool> {
    let pool = pool.max(1);
    let mut results = Vec::with_capacity(calls.len());
    let mut pending = calls.into_iter().peekable();
    while let Some(call) = pending.next() {
        if signal.is_cancelled() {
            results.push(not_started(agent, call));
            results.extend(pending.by_ref().map(|call| not_started(agent, call)));
            break;
        }
        if !concurrency_safe(tools, agent, &call) {
            results.push(tools.execute(agent, call, signal.clone()).await);
            continue;
        }
        let mut group = vec![call];
        while let Some(call) = pending.next_if(|c| concurrency_safe(tools, agent, c)) {
            group.push(call);
        }
        let settled: Vec<ExecutedTool> = stream::iter(group)
            .map(|call| async move {
                if signal.is_cancelled() {
                    not_started(agent, call)
                } else {
                    tools.execute(agent, call, signal.clone()).await
                }
            })
            .buffered(pool)
            .collect()
            .await;
        results.extend(settled);
    }
    results
}

fn concurrency_safe(tools: &dyn Tools, agent: &SessionId, call: &ToolCallRequest) -> bool {
    tools
        .get(&call.name, Some(agent))
        .is_some_and(|d| d.concurrency_safe)
}

/// The synthetic result of a call a cancelled step never started.
fn not_started(agent: &SessionId, call: ToolCallRequest) -> ExecutedTool {
    ExecutedTool {
        execution: new_execution(agent, call),
        result: error_result(codes::CANCELLED, model_text::NOT_STARTED),
        deferred: Vec::new(),
    }
}
