//! Scheduling one step's calls (spec §11.6).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;

use agent::tools::{ExecutedTool, PreExecuteDecision, ToolOutput, codes};
use agent::{CancelCause, Signal, Tools};

use super::super::{model_text, run_step_calls, run_step_calls_armed};
use super::{Log, ToolRegistry, call, code, sid, text, tool_with};

/// A tool that logs `start:<call>` / `end:<call>` around a sleep of `{"ms": n}` and tracks the
/// highest number of bodies running at once.
fn sleeper(
    name: &str,
    safe: bool,
    log: &Log,
    running: &Arc<AtomicUsize>,
    peak: &Arc<AtomicUsize>,
) -> agent::ToolDefinition {
    let (log, running, peak) = (log.clone(), running.clone(), peak.clone());
    tool_with(name, safe, move |args, ctx| {
        let (log, running, peak) = (log.clone(), running.clone(), peak.clone());
        Box::pin(async move {
            let id = ctx.execution.call_id.to_string();
            let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
            log.push(format!("start:{id}"));
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            struct Leave(Arc<AtomicUsize>);
            impl Drop for Leave {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let _leave = Leave(running);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            log.push(format!("end:{id}"));
            Ok(ToolOutput::text(format!("done:{id}")))
        })
    })
}

struct Fixture {
    reg: ToolRegistry,
    log: Log,
    peak: Arc<AtomicUsize>,
    _guards: Vec<agent::Registration>,
}

/// A registry with a parallel-safe `safe` tool, an exclusive `excl` tool, and an observer that
/// logs `result:<call>`.
fn fixture() -> Fixture {
    let reg = ToolRegistry::new();
    let log = Log::default();
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let observer_log = log.clone();
    let guards = vec![
        reg.register(None, sleeper("safe", true, &log, &running, &peak))
            .unwrap(),
        reg.register(None, sleeper("excl", false, &log, &running, &peak))
            .unwrap(),
        reg.on_result(
            None,
            Arc::new(move |exec, _| observer_log.push(format!("result:{}", exec.call_id))),
        ),
    ];
    Fixture {
        reg,
        log,
        peak,
        _guards: guards,
    }
}

fn ids(results: &[ExecutedTool]) -> Vec<String> {
    results.iter().map(|r| r.execution.call_id.to_string()).collect()
}

/// An exclusive call is a barrier: it starts only after every earlier call's whole pipeline
/// (observers included) completed, and the next call starts only after its own observers ran.
#[tokio::test(start_paused = true)]
async fn exclusive_calls_are_barriers() {
    let f = fixture();
    let calls = vec![
        call("s1", "safe", r#"{"ms": 30}"#),
        call("s2", "safe", r#"{"ms": 10}"#),
        call("x", "excl", r#"{"ms": 5}"#),
        call("s3", "safe", r#"{"ms": 1}"#),
        call("s4", "safe", r#"{"ms": 1}"#),
    ];
    let results = run_step_calls(&f.reg, &sid("a"), calls, &Signal::new(), 4).await;
    assert_eq!(ids(&results), ["s1", "s2", "x", "s3", "s4"]);
    assert!(results.iter().all(|r| !r.result.is_error));
    let log = &f.log;
    // The two safe calls overlap.
    assert!(log.index("start:s2") < log.index("end:s1"));
    // The barrier waits for both, observers included.
    assert!(log.index("result:s1") < log.index("start:x"));
    assert!(log.index("result:s2") < log.index("start:x"));
    // And nothing after it starts before its observers ran.
    assert!(log.index("result:x") < log.index("start:s3"));
    assert!(log.index("result:x") < log.index("start:s4"));
}

/// Consecutive safe calls run in a bounded pool, start in model order, and their results come
/// back in model order whatever order they finish in.
#[tokio::test(start_paused = true)]
async fn parallel_calls_use_a_bounded_pool_and_keep_model_order() {
    let f = fixture();
    let pre_order = Log::default();
    let _pre = {
        let pre_order = pre_order.clone();
        f.reg.pre_execute(
            None,
            Arc::new(move |exec, d| {
                pre_order.push(exec.call_id.to_string());
                d
            }),
        )
    };
    let durations = [50, 10, 40, 20, 30];
    let calls: Vec<_> = durations
        .iter()
        .enumerate()
        .map(|(i, ms)| call(&format!("c{i}"), "safe", &format!(r#"{{"ms": {ms}}}"#)))
        .collect();
    let started = tokio::time::Instant::now();
    let results = run_step_calls(&f.reg, &sid("a"), calls, &Signal::new(), 2).await;
    assert_eq!(ids(&results), ["c0", "c1", "c2", "c3", "c4"]);
    assert_eq!(
        results.iter().map(text).collect::<Vec<_>>(),
        ["done:c0", "done:c1", "done:c2", "done:c3", "done:c4"]
    );
    assert_eq!(f.peak.load(Ordering::SeqCst), 2);
    // Pre-execute runs in model order; bodies start in model order.
    assert_eq!(pre_order.entries(), ["c0", "c1", "c2", "c3", "c4"]);
    let starts: Vec<String> = f
        .log
        .entries()
        .into_iter()
        .filter(|e| e.starts_with("start:"))
        .collect();
    assert_eq!(
        starts,
        ["start:c0", "start:c1", "start:c2", "start:c3", "start:c4"]
    );
    let ends: Vec<String> = f
        .log
        .entries()
        .into_iter()
        .filter(|e| e.starts_with("end:"))
        .collect();
    assert_ne!(ends, ["end:c0", "end:c1", "end:c2", "end:c3", "end:c4"]);
    // Paused clock: the pool, not a serial run (150 ms), decides the makespan.
    assert!(started.elapsed() < Duration::from_millis(150));

    // A pool of one is serial.
    let f = fixture();
    let calls = vec![
        call("a", "safe", r#"{"ms": 5}"#),
        call("b", "safe", r#"{"ms": 5}"#),
    ];
    let results = run_step_calls(&f.reg, &sid("a"), calls, &Signal::new(), 0).await;
    assert_eq!(ids(&results), ["a", "b"]);
    assert_eq!(f.peak.load(Ordering::SeqCst), 1);
}

/// Cancellation mid-pool: started calls drain as cancelled, unstarted ones get synthetic
/// `CANCELLED` results without entering the pipeline (no observer hears them).
#[tokio::test(start_paused = true)]
async fn cancellation_drains_started_calls_and_fails_unstarted_ones() {
    let f = fixture();
    let calls: Vec<_> = (0..4)
        .map(|i| call(&format!("c{i}"), "safe", r#"{"ms": 100}"#))
        .collect();
    let signal = Signal::new();
    let agent = sid("a");
    let (results, ()) = tokio::join!(run_step_calls(&f.reg, &agent, calls, &signal, 2), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        signal.cancel(CancelCause::User);
    });
    assert_eq!(ids(&results), ["c0", "c1", "c2", "c3"]);
    for started in &results[..2] {
        assert_eq!(code(started), codes::CANCELLED);
        assert_eq!(text(started), "Error: tool call aborted");
    }
    for unstarted in &results[2..] {
        assert_eq!(code(unstarted), codes::CANCELLED);
        assert_eq!(
            text(unstarted),
            "Error: tool call not started: the step was cancelled"
        );
        assert_eq!(
            unstarted.result.error.as_ref().unwrap().message,
            model_text::NOT_STARTED
        );
    }
    let observed: Vec<String> = f
        .log
        .entries()
        .into_iter()
        .filter(|e| e.starts_with("result:"))
        .collect();
    assert_eq!(observed, ["result:c0", "result:c1"]);
    assert!(!f.log.entries().iter().any(|e| e.starts_with("end:")));
}

/// A body that cancels the signal it was handed cancels only its own call: the step's signal
/// stays live, and the calls after it — exclusive or in a parallel run — start and succeed. (Each call used to get the step's own signal, so one tool could
/// cancel its siblings and the rest of the step.)
#[tokio::test(start_paused = true)]
async fn a_call_cancelling_its_own_signal_cancels_nothing_else() {
    let f = fixture();
    let quitter = tool_with("quit", false, |_, ctx| {
        Box::pin(async move {
            ctx.signal.cancel(CancelCause::User);
            Ok(ToolOutput::text("gave up"))
        })
    });
    let _quitter = f.reg.register(None, quitter).unwrap();
    let calls = vec![
        call("q", "quit", "{}"),
        call("x", "excl", r#"{"ms": 1}"#),
        call("s1", "safe", r#"{"ms": 5}"#),
        call("s2", "safe", r#"{"ms": 5}"#),
    ];
    let signal = Signal::new();
    let results = run_step_calls(&f.reg, &sid("a"), calls, &signal, 4).await;
    assert!(!signal.is_cancelled(), "the step's signal is untouched");
    assert_eq!(ids(&results), ["q", "x", "s1", "s2"]);
    assert!(results[0].result.is_error, "the quitter's own call is cancelled");
    assert_eq!(code(&results[0]), codes::CANCELLED);
    for later in &results[1..] {
        assert!(
            !later.result.is_error,
            "{}: {}",
            later.execution.call_id,
            text(later)
        );
    }
}

/// Cancellation during an exclusive call: it drains as cancelled and nothing after it starts.
#[tokio::test(start_paused = true)]
async fn cancellation_during_an_exclusive_call_stops_the_step() {
    let f = fixture();
    let calls = vec![
        call("x1", "excl", r#"{"ms": 100}"#),
        call("x2", "excl", r#"{"ms": 1}"#),
        call("s", "safe", r#"{"ms": 1}"#),
    ];
    let signal = Signal::new();
    let agent = sid("a");
    let (results, ()) = tokio::join!(run_step_calls(&f.reg, &agent, calls, &signal, 4), async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        signal.cancel(CancelCause::User);
    });
    assert_eq!(ids(&results), ["x1", "x2", "s"]);
    assert_eq!(text(&results[0]), "Error: tool call aborted");
    assert_eq!(
        text(&results[1]),
        "Error: tool call not started: the step was cancelled"
    );
    assert_eq!(
        text(&results[2]),
        "Error: tool call not started: the step was cancelled"
    );
    assert_eq!(f.log.entries(), ["start:x1", "result:x1"]);

    // A step cancelled before it began starts nothing.
    let f = fixture();
    let calls = vec![call("a", "safe", "{}"), call("b", "excl", "{}")];
    let results = run_step_calls(
        &f.reg,
        &sid("a"),
        calls,
        &Signal::cancelled_with(CancelCause::User),
        4,
    )
    .await;
    assert!(results.iter().all(|r| code(r) == codes::CANCELLED));
    assert!(f.log.entries().is_empty());
}

/// Unknown and restricted tools are exclusive (fail closed) and resolve as `UNKNOWN_TOOL` in
/// place; a call that registers a tool is seen by the calls after it.
#[tokio::test(start_paused = true)]
async fn unknown_tools_resolve_in_place_and_registrations_affect_later_calls() {
    let f = fixture();
    let slot: Arc<parking_lot::Mutex<Vec<agent::Registration>>> = Arc::default();
    let reg = f.reg.clone();
    let s = slot.clone();
    let _installer = f
        .reg
        .register(
            None,
            tool_with("install", false, move |_, _| {
                s.lock().push(reg.register(None, super::tool("late")).unwrap());
                Box::pin(async { Ok(ToolOutput::text("installed")) })
            }),
        )
        .unwrap();
    let _deny = f.reg.pre_execute(
        None,
        Arc::new(|exec, d| {
            if exec.name == "forbidden" {
                PreExecuteDecision::Deny("not here".into())
            } else {
                d
            }
        }),
    );
    let calls = vec![
        call("u", "ghost", "{}"),
        call("l1", "late", "{}"),
        call("i", "install", "{}"),
        call("l2", "late", "{}"),
        call("f", "forbidden", "{}"),
    ];
    let results = run_step_calls(&f.reg, &sid("a"), calls, &Signal::new(), 4).await;
    assert_eq!(
        results.iter().map(text).collect::<Vec<_>>(),
        [
            "Error: unknown tool \"ghost\"",
            "Error: unknown tool \"late\"",
            "installed",
            "ran:late",
            "Error: not here",
        ]
    );
    assert_eq!(code(&results[0]), codes::UNKNOWN_TOOL);
}

/// Spec §11.6 ("pre/post policy, `tool/result` events and additional contexts are committed in
/// model order"): in a parallel run whose first call finishes last, the bodies still overlap and
/// settle in completion order, but post-execute policies and result observers see call 1
/// (with its whole commit) before call 2.
#[tokio::test(start_paused = true)]
async fn parallel_runs_commit_post_execute_and_observers_in_model_order() {
    let f = fixture();
    let _post = {
        let log = f.log.clone();
        f.reg.post_execute(
            None,
            Arc::new(move |exec, _| {
                log.push(format!("post:{}", exec.call_id));
                None
            }),
        )
    };
    let calls = vec![
        call("c1", "safe", r#"{"ms": 50}"#),
        call("c2", "safe", r#"{"ms": 10}"#),
    ];
    let results = run_step_calls(&f.reg, &sid("a"), calls, &Signal::new(), 4).await;
    assert_eq!(ids(&results), ["c1", "c2"]);
    assert_eq!(
        results.iter().map(text).collect::<Vec<_>>(),
        ["done:c1", "done:c2"]
    );
    assert_eq!(
        f.log.entries(),
        [
            "start:c1",
            "start:c2",
            "end:c2",
            "end:c1",
            "post:c1",
            "result:c1",
            "post:c2",
            "result:c2",
        ]
    );
}

/// A rolling pool: with a pool of two, a slow first call and three fast ones, the fast calls
/// take turns in the free slot — the third and fourth start (and finish) before the first ends —
/// and results and observers still follow model order.
#[tokio::test(start_paused = true)]
async fn a_slow_call_does_not_hold_back_later_starts() {
    let f = fixture();
    let calls = vec![
        call("c1", "safe", r#"{"ms": 100}"#),
        call("c2", "safe", r#"{"ms": 10}"#),
        call("c3", "safe", r#"{"ms": 10}"#),
        call("c4", "safe", r#"{"ms": 10}"#),
    ];
    let started = tokio::time::Instant::now();
    let results = run_step_calls(&f.reg, &sid("a"), calls, &Signal::new(), 2).await;
    assert_eq!(ids(&results), ["c1", "c2", "c3", "c4"]);
    assert!(results.iter().all(|r| !r.result.is_error));
    assert_eq!(f.peak.load(Ordering::SeqCst), 2);
    let log = &f.log;
    assert!(log.index("start:c3") < log.index("end:c1"));
    assert!(log.index("start:c4") < log.index("end:c1"));
    assert!(log.index("end:c4") < log.index("end:c1"));
    // Paused clock: the slow call alone decides the makespan.
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    let observed: Vec<String> = log
        .entries()
        .into_iter()
        .filter(|e| e.starts_with("result:"))
        .collect();
    assert_eq!(observed, ["result:c1", "result:c2", "result:c3", "result:c4"]);
}

/// A call whose body succeeded before the step was cancelled keeps its success even though its
/// commit waited (past the cancellation) for an earlier, slower call, which drains as cancelled.
#[tokio::test(start_paused = true)]
async fn a_settled_success_survives_a_cancellation_while_awaiting_its_commit() {
    let f = fixture();
    let calls = vec![
        call("c1", "safe", r#"{"ms": 100}"#),
        call("c2", "safe", r#"{"ms": 10}"#),
    ];
    let signal = Signal::new();
    let agent = sid("a");
    let (results, ()) = tokio::join!(run_step_calls(&f.reg, &agent, calls, &signal, 2), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        signal.cancel(CancelCause::User);
    });
    assert_eq!(ids(&results), ["c1", "c2"]);
    assert_eq!(text(&results[0]), "Error: tool call aborted");
    assert_eq!(code(&results[0]), codes::CANCELLED);
    assert_eq!(text(&results[1]), "done:c2");
    let observed: Vec<String> = f
        .log
        .entries()
        .into_iter()
        .filter(|e| e.starts_with("result:"))
        .collect();
    assert_eq!(observed, ["result:c1", "result:c2"]);
}

/// A parallel-safe tool whose body registers a discard hook counting into `ran`, then succeeds
/// after a sleep of `{"ms": n}`.
fn discard_counting(name: &str, ran: &Arc<AtomicUsize>) -> agent::ToolDefinition {
    let ran = ran.clone();
    tool_with(name, true, move |args, ctx| {
        let ran = ran.clone();
        ctx.on_discarded(move || {
            ran.fetch_add(1, Ordering::SeqCst);
        });
        let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(0);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(ToolOutput::text("done"))
        })
    })
}

/// A parallel call whose body succeeded while its commit awaits an earlier, slower call is
/// never recorded when the step's future is dropped (a host bounding the step, a runtime
/// shutting down): its `on_discarded` hooks run, exactly once, as for any discarded success
/// (a `job_output` read then gives its claim on the report back). A step that commits its
/// successes runs none. Before, the settled success was dropped silently with the step.
#[tokio::test(start_paused = true)]
async fn dropping_the_step_discards_settled_uncommitted_successes() {
    let reg = ToolRegistry::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let _t = reg.register(None, discard_counting("t", &ran)).unwrap();
    let agent = sid("a");
    let signal = Signal::new();

    let committed = run_step_calls(
        &reg,
        &agent,
        vec![call("c1", "t", r#"{"ms": 20}"#), call("c2", "t", "{}")],
        &signal,
        2,
    )
    .await;
    assert_eq!(ids(&committed), ["c1", "c2"]);
    assert!(committed.iter().all(|e| !e.result.is_error));
    assert_eq!(ran.load(Ordering::SeqCst), 0, "committed successes run no hook");

    let mut step = Box::pin(run_step_calls(
        &reg,
        &agent,
        vec![call("c3", "t", r#"{"ms": 100}"#), call("c4", "t", "{}")],
        &signal,
        2,
    ));
    tokio::select! {
        biased;
        _ = &mut step => panic!("c3 is still sleeping"),
        () = tokio::time::sleep(Duration::from_millis(10)) => {}
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0, "c4 settled and awaits c3's commit");
    drop(step);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "c4's settled success was dropped uncommitted: its hook ran once (c3's body was dropped)"
    );
}

/// An exclusive tool whose body registers a discard hook counting into `ran`, then succeeds,
/// or fails with `{"fail": true}`.
fn exclusive_discard_counting(name: &str, ran: &Arc<AtomicUsize>) -> agent::ToolDefinition {
    let ran = ran.clone();
    tool_with(name, false, move |args, ctx| {
        let ran = ran.clone();
        ctx.on_discarded(move || {
            ran.fetch_add(1, Ordering::SeqCst);
        });
        let fail = args.get("fail").and_then(Value::as_bool).unwrap_or(false);
        Box::pin(async move {
            if fail {
                Err(agent::tools::ToolError::invalid_args("told to fail"))
            } else {
                Ok(ToolOutput::text("done"))
            }
        })
    })
}

/// spec: TOOL-37 (§11.5) — the armed scheduler hands every committed success over with its
/// discard hooks armed, exclusive calls as well as parallel ones: a success delivered to the
/// model runs none, one dropped undelivered (the session log refused its `tool/result`) runs
/// them once, and an error arms nothing (its body never succeeded). The plain scheduler
/// hands its results over delivered.
#[tokio::test(start_paused = true)]
async fn armed_results_run_their_hooks_only_when_dropped_undelivered() {
    let reg = ToolRegistry::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let _t = reg.register(None, discard_counting("par", &ran)).unwrap();
    let _x = reg
        .register(None, exclusive_discard_counting("excl", &ran))
        .unwrap();
    let agent = sid("a");
    let signal = Signal::new();
    let calls = || {
        vec![
            call("c1", "par", "{}"),
            call("c2", "excl", "{}"),
            call("c3", "excl", r#"{"fail": true}"#),
            call("c4", "par", "{}"),
        ]
    };

    let plain = run_step_calls(&reg, &agent, calls(), &signal, 2).await;
    assert_eq!(ids(&plain), ["c1", "c2", "c3", "c4"]);
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the plain scheduler delivers");

    let armed = run_step_calls_armed(&reg, &agent, calls(), &signal, 2).await;
    assert_eq!(
        armed.iter().map(|c| c.delivery.is_armed()).collect::<Vec<_>>(),
        [true, true, false, true]
    );
    let mut armed = armed.into_iter();
    let first = armed.next().unwrap().deliver();
    assert!(!first.result.is_error);
    assert_eq!(ran.load(Ordering::SeqCst), 0, "a delivered success runs no hook");
    drop(armed.next());
    assert_eq!(
        ran.load(Ordering::SeqCst),
        1,
        "the undelivered exclusive success ran its hook"
    );
    drop(armed);
    assert_eq!(
        ran.load(Ordering::SeqCst),
        2,
        "the abandoned parallel success ran its hook; the failure ran none"
    );
}

/// A [`Tools`] implementation the scheduler does not recognise (it keeps the provided
/// `as_any`): it delegates every call to a registry.
struct Foreign(ToolRegistry);

#[async_trait::async_trait]
impl Tools for Foreign {
    fn register(
        &self,
        scope: Option<&agent::SessionId>,
        def: agent::ToolDefinition,
    ) -> Result<agent::Registration, agent::tools::ToolRegistryError> {
        self.0.register(scope, def)
    }

    fn restrict(
        &self,
        scope: Option<&agent::SessionId>,
        filter: agent::tools::ToolRestriction,
    ) -> Result<agent::Registration, agent::tools::ToolRegistryError> {
        self.0.restrict(scope, filter)
    }

    fn guard(&self, scope: Option<&agent::SessionId>, guard: agent::tools::ToolGuard) -> agent::Registration {
        self.0.guard(scope, guard)
    }

    fn pre_execute(
        &self,
        scope: Option<&agent::SessionId>,
        policy: agent::tools::PreExecutePolicy,
    ) -> agent::Registration {
        self.0.pre_execute(scope, policy)
    }

    fn post_execute(
        &self,
        scope: Option<&agent::SessionId>,
        policy: agent::tools::PostExecutePolicy,
    ) -> agent::Registration {
        self.0.post_execute(scope, policy)
    }

    fn on_result(
        &self,
        scope: Option<&agent::SessionId>,
        observer: agent::tools::ToolResultObserver,
    ) -> agent::Registration {
        self.0.on_result(scope, observer)
    }

    fn set_scope_parent(&self, scope: &agent::SessionId, parent: &agent::SessionId) -> agent::Registration {
        self.0.set_scope_parent(scope, parent)
    }

    fn get(&self, name: &str, scope: Option<&agent::SessionId>) -> Option<agent::ToolDefinition> {
        self.0.get(name, scope)
    }

    fn schemas(&self, scope: Option<&agent::SessionId>) -> Vec<agent::model::ToolSchema> {
        self.0.schemas(scope)
    }

    async fn execute(
        &self,
        scope: &agent::SessionId,
        call: agent::tools::ToolCallRequest,
        ctx_signal: Signal,
    ) -> ExecutedTool {
        self.0.execute(scope, call, ctx_signal).await
    }
}

/// An unrecognised implementation is scheduled through `Tools::execute` alone, in the same
/// rolling pool, with results in model order (its observers run in completion order).
#[tokio::test(start_paused = true)]
async fn foreign_implementations_use_the_rolling_pool_through_execute() {
    let f = fixture();
    let foreign = Foreign(f.reg.clone());
    assert!(foreign.as_any().is_none());
    let calls = vec![
        call("c1", "safe", r#"{"ms": 100}"#),
        call("c2", "safe", r#"{"ms": 10}"#),
        call("c3", "safe", r#"{"ms": 10}"#),
        call("x", "excl", r#"{"ms": 1}"#),
    ];
    let results = run_step_calls(&foreign, &sid("a"), calls, &Signal::new(), 2).await;
    assert_eq!(ids(&results), ["c1", "c2", "c3", "x"]);
    assert_eq!(
        results.iter().map(text).collect::<Vec<_>>(),
        ["done:c1", "done:c2", "done:c3", "done:x"]
    );
    let log = &f.log;
    assert!(log.index("start:c3") < log.index("end:c1"));
    assert!(log.index("result:c1") < log.index("start:x"));
    assert!(log.index("result:c2") < log.index("result:c1"));
}

/// An unrecognised implementation keeps its executions' contexts to itself
/// (`Tools::execute` consumes them): the armed scheduler arms none of its results, so dropping
/// them runs nothing.
#[tokio::test(start_paused = true)]
async fn foreign_implementations_arm_nothing() {
    let reg = ToolRegistry::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let _t = reg.register(None, discard_counting("par", &ran)).unwrap();
    let _x = reg
        .register(None, exclusive_discard_counting("excl", &ran))
        .unwrap();
    let foreign = Foreign(reg.clone());
    let calls = vec![call("c1", "par", "{}"), call("c2", "excl", "{}")];
    let armed = run_step_calls_armed(&foreign, &sid("a"), calls, &Signal::new(), 2).await;
    assert_eq!(armed.len(), 2);
    assert!(
        armed
            .iter()
            .all(|c| !c.executed.result.is_error && !c.delivery.is_armed())
    );
    drop(armed);
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// The scheduler's future is `Send` (the driver may run it on any worker).
#[test]
fn run_step_calls_is_send() {
    fn assert_send<T: Send>(_: &T) {}
    let reg = ToolRegistry::new();
    let agent = sid("a");
    let signal = Signal::new();
    let tools: &dyn Tools = &reg;
    let fut = run_step_calls(tools, &agent, Vec::new(), &signal, 1);
    assert_send(&fut);
    drop(fut);
    let fut = run_step_calls_armed(tools, &agent, Vec::new(), &signal, 1);
    assert_send(&fut);
    drop(fut);
}
