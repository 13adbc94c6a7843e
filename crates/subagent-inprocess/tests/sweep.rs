//! Cancellation sweeps: one child run (two model steps around a tool call that itself yields)
//! is interrupted at **every** scheduling point of its life, once per point, by each of the
//! three ways a run can be stopped from outside: the request signal, the run's own disposal and
//! the parent's disposal. Every interleaving must end the same well-defined way:
//!
//! * the start either fulfils (the child is published) or rejects with a cancellation code and
//!   leaves nothing behind;
//! * a published run's result always resolves: `completed` (with the final text) when the
//!   child's turn had ended before the interruption; `aborted` when the request signal or the
//!   run's disposal landed while it still ran — both act at the call, so no later progress of
//!   the child can turn it into `completed` — with the turn's end naming the cause (`parent`,
//!   `disposed`). The parent's disposal drains its scope as its teardown runs, so there a child
//!   may still finish first;
//! * once an interruption point yields `completed`, every later point does too (the outcome is
//!   monotonic in the point, so no window reports a finished child as aborted or the reverse);
//! * with an output schema (the child's last step is the capture call), a structured value is
//!   reported exactly when its capture committed in the child's log;
//! * the child's log satisfies every online invariant, and the host ends quiescent (no agent,
//!   session, task or registration left) — both checked by `Host::finish`.
//!
//! The interruption point is counted in `yield_now` calls of the interrupting task on a
//! current-thread runtime with a paused clock, so each point is one deterministic interleaving.
//! The model's chunks arrive one scheduling point apart ([`agent_loop::model::Trickle`], through
//! `Host::trickled`) and the tool yields before answering, so the points fall between chunks,
//! inside the tool call and at every boundary of the child's turn, not only between whole
//! steps. A last test lets the same interruptions race for real on a multi-threaded runtime,
//! where only the timing-independent checks apply.

mod common;

use std::sync::Arc;

use agent::tools::{ToolContext, ToolDefinition, ToolError, ToolHandler, ToolOutput};
use agent::{AgentHandle, CancelCause, ContentBlock, Signal, TurnEndReason};
use agent_loop::ScriptedModel;
use agent_loop::model::chunks;
use async_trait::async_trait;
use common::*;
use subagent::run::SubagentRun;
use subagent::{StopReason, SubagentErrorCode};
use subagent_inprocess::InProcessRunOptions;
use subagent_inprocess::model_text::STRUCTURED_OUTPUT_TOOL;

/// A tool that yields to the scheduler a few times before answering, so the child's tool step
/// has interleaving points of its own.
struct Yielding;

#[async_trait]
impl ToolHandler for Yielding {
    async fn execute(&self, _: serde_json::Value, _: ToolContext) -> Result<ToolOutput, ToolError> {
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        Ok(ToolOutput::text("looked"))
    }
}

/// How the run is interrupted.
#[derive(Clone, Copy, Debug)]
enum Interrupt {
    /// The request signal is cancelled.
    Signal,
    /// The caller disposes the run (only once the start fulfilled).
    DisposeRun,
    /// The parent agent is disposed; its scope owns the child.
    DisposeParent,
}

/// What one interruption point produced.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// The start rejected: nothing was published.
    Rejected,
    /// The run settled with this stop reason.
    Settled(StopReason),
}

/// The captured value of the structured sweep.
fn answer() -> serde_json::Value {
    serde_json::json!({"answer": 42})
}

/// Runs the child once, interrupted after `point` yields of the interrupting task. With
/// `structured`, the request carries an output schema and the child's second step is the
/// capture call instead of a text answer. `exact` (a current-thread runtime, where nothing runs
/// between the look at the child's log and the interruption) also requires a child that was
/// still running to report `aborted`.
async fn run_once(interrupt: Interrupt, point: usize, structured: bool, exact: bool) -> Outcome {
    let last = if structured {
        chunks::tool_call("c2", STRUCTURED_OUTPUT_TOOL, answer())
    } else {
        chunks::text("done")
    };
    let script = ScriptedModel::new(vec![chunks::tool_call("c1", "look", serde_json::json!({})), last]);
    let mut host = Host::trickled(&script).await;
    let tool = global_tool(
        &host,
        ToolDefinition {
            name: "look".into(),
            description: "yields, then answers".into(),
            parameters: serde_json::json!({"type": "object"}),
            concurrency_safe: true,
            handler: Arc::new(Yielding),
        },
    );
    let signal = Signal::new();
    let mut request = request_from(&host.parent, signal.clone());
    if structured {
        request.output_schema = Some(serde_json::json!({
            "type": "object",
            "properties": {"answer": {"type": "number"}},
            "required": ["answer"]
        }));
    }
    let start = tokio::spawn(
        host.driver
            .start(resolve(request, "spawn"), InProcessRunOptions::fresh()),
    );
    let mut parent_handle: Option<AgentHandle> = host.parent_handle.take();
    let mut start = Some(start);
    let mut run = None;
    for _ in 0..point {
        tokio::task::yield_now().await;
        if start.as_ref().is_some_and(|s| s.is_finished()) {
            run = Some(
                start
                    .take()
                    .unwrap()
                    .await
                    .expect("start task")
                    .expect("published"),
            );
        }
    }
    // Whether the child's turn had already ended when the interruption lands.
    let settled_first = run.as_ref().is_some_and(|run: &subagent_inprocess::LocalRun| {
        run.local_agent()
            .expect("local")
            .session()
            .events()
            .iter()
            .any(|e| e.type_name() == "turn/end")
    });
    let mut parent_disposal = None;
    match interrupt {
        Interrupt::Signal => {
            signal.cancel(CancelCause::Other {
                reason: "sweep".into(),
            });
        }
        Interrupt::DisposeParent => {
            // The disposal begins at the call (the parent stops being live at once); its future
            // runs the rest of the teardown on its own task.
            let handle = parent_handle.take().expect("parent");
            parent_disposal = Some(tokio::spawn(handle.dispose()));
        }
        Interrupt::DisposeRun => {}
    }
    let run = match (run, start) {
        (Some(run), _) => run,
        (None, Some(start)) => match start.await.expect("start task") {
            Ok(run) => run,
            Err(error) => {
                let code = error.code();
                assert!(
                    matches!(interrupt, Interrupt::Signal | Interrupt::DisposeParent),
                    "only an interruption rejects a start, got {code:?}"
                );
                assert!(
                    matches!(
                        code,
                        SubagentErrorCode::Cancelled | SubagentErrorCode::ParentUnavailable
                    ),
                    "point {point}: unexpected start rejection {code:?}: {error}"
                );
                if let Some(disposal) = parent_disposal {
                    disposal.await.expect("parent disposal");
                }
                drop(tool);
                host.finish().await;
                return Outcome::Rejected;
            }
        },
        (None, None) => unreachable!("the start is either taken or pending"),
    };
    let dispose = matches!(interrupt, Interrupt::DisposeRun).then(|| run.dispose());
    let result = run
        .result()
        .await
        .expect("a published run's result always resolves");
    // A child whose turn ended first keeps `completed`. The request signal and the run's
    // disposal act at the call (the signal's listener and `dispose` cancel the child
    // synchronously), so a child still running then always reports `aborted`. The parent's
    // disposal drains its scope only as its teardown future runs, so a child may still finish
    // in between (the sweep's monotonic check covers that case).
    if settled_first {
        assert_eq!(
            result.stop_reason,
            StopReason::Completed,
            "{interrupt:?} at point {point}"
        );
    } else if exact && !matches!(interrupt, Interrupt::DisposeParent) {
        assert_eq!(
            result.stop_reason,
            StopReason::Aborted,
            "{interrupt:?} at point {point}: the child was still running when interrupted"
        );
    }
    match result.stop_reason {
        StopReason::Completed if structured => assert_eq!(result.structured, Some(answer())),
        StopReason::Completed => assert_eq!(result.output, vec![ContentBlock::text("done")]),
        StopReason::Aborted => {}
        ref other => panic!(
            "{interrupt:?} at point {point}: unexpected stop reason {other:?}: {result:?}; child log: {:?}",
            run.local_agent()
                .expect("local")
                .session()
                .events()
                .iter()
                .map(|e| format!("{} {:?}", e.type_name(), e.data))
                .collect::<Vec<_>>()
        ),
    }
    // A structured value is reported exactly when its capture committed: the capture call has a
    // successful result in the child's own log.
    let committed = tool_results(&run.local_agent().expect("local"))
        .iter()
        .any(|(id, is_error, _)| id == "c2" && !is_error);
    assert_eq!(
        result.structured.is_some(),
        committed,
        "{interrupt:?} at point {point}: structured {:?}",
        result.structured
    );
    // An aborted turn names who stopped it (spec §3.4: the request signal cancels with cause
    // `parent`; the run's disposal with `disposed`).
    let child = run.local_agent().expect("local");
    if result.stop_reason == StopReason::Aborted
        && let Some(reason) = last_turn_end(&child)
    {
        let cause = match interrupt {
            Interrupt::Signal => Some(CancelCause::Parent),
            Interrupt::DisposeRun => Some(CancelCause::Disposed),
            Interrupt::DisposeParent => None,
        };
        if let Some(cause) = cause {
            assert_eq!(
                reason,
                TurnEndReason::Aborted { reason: cause },
                "{interrupt:?} at point {point}"
            );
        }
    }
    match dispose {
        Some(dispose) => dispose.await.expect("disposed"),
        None => run.dispose().await.expect("disposed"),
    }
    if let Some(disposal) = parent_disposal {
        disposal.await.expect("parent disposal");
    }
    host.parent_handle = parent_handle;
    drop(tool);
    host.finish().await;
    Outcome::Settled(result.stop_reason)
}

/// Sweeps every interruption point until the child has completed before the interruption twice
/// in a row, checking the outcome is monotonic. Returns the outcomes, one per point.
async fn sweep(interrupt: Interrupt, structured: bool) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for point in 0..500 {
        let outcome = run_once(interrupt, point, structured, true).await;
        if let Some(Outcome::Settled(StopReason::Completed)) = outcomes.last() {
            assert_eq!(
                outcome,
                Outcome::Settled(StopReason::Completed),
                "{interrupt:?}: point {point} regressed after an earlier point completed"
            );
        }
        let done = outcome == Outcome::Settled(StopReason::Completed)
            && outcomes.last() == Some(&Outcome::Settled(StopReason::Completed));
        outcomes.push(outcome);
        if done {
            return outcomes;
        }
    }
    panic!("{interrupt:?}: the child never completed within 500 interruption points");
}

/// Counts the points of each outcome, for the sweep's own sanity assertions.
fn count(outcomes: &[Outcome], wanted: &Outcome) -> usize {
    outcomes.iter().filter(|o| *o == wanted).count()
}

/// spec: DRV-16 — the request signal, cancelled at every scheduling point from
/// before the start to after the child settled: an early cancellation rejects the start
/// (`CANCELLED`, nothing published), any later one before the child settles reports `aborted`,
/// and one after it reports `completed` with the final text.
#[tokio::test(start_paused = true)]
async fn signal_at_every_point() {
    let outcomes = sweep(Interrupt::Signal, false).await;
    assert_eq!(
        outcomes[0],
        Outcome::Rejected,
        "a cancellation before any progress rejects"
    );
    assert!(
        count(&outcomes, &Outcome::Settled(StopReason::Aborted)) > 0,
        "{outcomes:?}"
    );
}

/// spec: DRV-16 — the run disposed at every scheduling point after publication: the result
/// resolves `aborted` until the child settled, `completed` after, and disposal always quiesces.
#[tokio::test(start_paused = true)]
async fn run_disposal_at_every_point() {
    let outcomes = sweep(Interrupt::DisposeRun, false).await;
    assert_eq!(
        count(&outcomes, &Outcome::Rejected),
        0,
        "disposal never rejects a start"
    );
    assert!(
        count(&outcomes, &Outcome::Settled(StopReason::Aborted)) > 0,
        "{outcomes:?}"
    );
}

/// spec: §3.6 — the parent disposed at every scheduling point: a start still in its creation
/// window rejects (`PARENT_UNAVAILABLE` or `CANCELLED`) and leaves nothing, a published child is
/// drained by the parent's scope and reports `aborted`, and a child that settled first keeps
/// `completed`.
#[tokio::test(start_paused = true)]
async fn parent_disposal_at_every_point() {
    let outcomes = sweep(Interrupt::DisposeParent, false).await;
    assert_eq!(outcomes[0], Outcome::Rejected, "{outcomes:?}");
    assert!(
        count(&outcomes, &Outcome::Settled(StopReason::Aborted)) > 0,
        "{outcomes:?}"
    );
}

/// spec: DRV-16 — structured output under cancellation: the request signal and the run's
/// disposal at every point of a child whose last step is the capture call. A completed run
/// carries the captured value; a structured value is reported exactly when the capture
/// committed in the child's log (never a value from a call that did not commit).
#[tokio::test(start_paused = true)]
async fn structured_capture_at_every_point() {
    for interrupt in [Interrupt::Signal, Interrupt::DisposeRun] {
        let outcomes = sweep(interrupt, true).await;
        assert!(
            count(&outcomes, &Outcome::Settled(StopReason::Aborted)) > 0,
            "{interrupt:?}: {outcomes:?}"
        );
    }
}

/// The same interruptions racing for real on a multi-threaded runtime (the child's driver, its
/// result task, the start and the interruption on different workers): whatever the timing, the
/// start fulfils or rejects cleanly, the result resolves `completed` or `aborted` consistently
/// with the child's log, the turn's end names the interruption's cause, and the host ends
/// quiescent with a clean invariant record. (Nothing here waits on time; timing only changes
/// which interleaving each iteration sees.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interruptions_race_on_a_multi_threaded_runtime() {
    for point in 0..24 {
        for interrupt in [Interrupt::Signal, Interrupt::DisposeRun, Interrupt::DisposeParent] {
            run_once(interrupt, point, point % 2 == 1, false).await;
        }
    }
}
