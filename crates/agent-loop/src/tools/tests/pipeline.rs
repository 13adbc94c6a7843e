//! The execution pipeline (spec §11.4–11.5).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use agent::tools::{
    ExecutionId, PostExecuteDecision, PreExecuteDecision, ToolError, ToolExecution, ToolOutput, ToolResult,
    codes,
};
use agent::{CancelCause, ContentBlock, Message, Signal, Tools};

use super::super::{ApprovalOutcome, ToolApproval, codes as loop_codes};
use super::{Log, ToolRegistry, call, code, run, sid, text, tool, tool_with};

/// An approval service with a fixed answer.
pub(super) struct Approve(pub(super) ApprovalOutcome);

#[async_trait]
impl ToolApproval for Approve {
    async fn request(&self, _execution: &ToolExecution, _signal: &Signal) -> ApprovalOutcome {
        self.0
    }
}

/// An approval service that never answers.
struct NeverAnswers;

#[async_trait]
impl ToolApproval for NeverAnswers {
    async fn request(&self, _execution: &ToolExecution, _signal: &Signal) -> ApprovalOutcome {
        std::future::pending().await
    }
}

/// A tool counting its body invocations.
fn counted(name: &str, log: &Log) -> agent::ToolDefinition {
    let log = log.clone();
    let label = format!("body:{name}");
    let reply = format!("ran:{name}");
    tool_with(name, false, move |_, _| {
        log.push(label.clone());
        let reply = reply.clone();
        Box::pin(async move { Ok(ToolOutput::text(reply)) })
    })
}

/// spec: SPN-67 — scoped guards run after the whole pre-execute chain, deny only their own
/// agent's calls, cannot be overridden by a later pre-execute `Allow`, and lift independently.
#[tokio::test]
async fn scoped_guards_run_after_pre_execute_and_compose_monotonically() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let log = Log::default();
    let _t = reg.register(None, counted("t", &log)).unwrap();
    let guard = {
        let log = log.clone();
        Arc::new(move |exec: &ToolExecution| {
            log.push(format!("guard:{}", exec.agent));
            Some("terminal policy".to_owned())
        })
    };
    let lift_first = reg.guard(Some(&a), guard.clone());
    let lift_second = reg.guard(Some(&a), guard);
    // Registered after the guards: it forces the extensible decision to allow, but cannot
    // bypass the monotonic guard stage that follows the whole chain.
    let _force_allow = {
        let log = log.clone();
        reg.pre_execute(
            Some(&a),
            Arc::new(move |_, _| {
                log.push("pre:allow");
                PreExecuteDecision::Allow
            }),
        )
    };

    let denied = reg.execute(&a, call("c1", "t", "{}"), Signal::new()).await;
    assert_eq!(text(&denied), "Error: terminal policy");
    assert_eq!(code(&denied), codes::DENIED);
    assert_eq!(denied.result.error.as_ref().unwrap().message, "terminal policy");
    // Pre-execute first, then the first denying guard (the second is never consulted).
    assert_eq!(log.entries(), ["pre:allow", "guard:a"]);

    assert_eq!(run(&reg, "t", "other").await, "ran:t");
    assert_eq!(log.entries().iter().filter(|e| e.starts_with("body")).count(), 1);

    drop(lift_first);
    assert_eq!(run(&reg, "t", "a").await, "Error: terminal policy");
    drop(lift_second);
    assert_eq!(run(&reg, "t", "a").await, "ran:t");
    assert_eq!(log.entries().iter().filter(|e| e.starts_with("body")).count(), 2);
}

/// spec: SPN-67 — global guards compose monotonically: one abstains, a later one denies, and
/// the body never runs; a panicking guard fails closed.
#[tokio::test]
async fn global_guards_compose_monotonically() {
    let reg = ToolRegistry::new();
    let log = Log::default();
    let _t = reg.register(None, counted("t", &log)).unwrap();
    let _abstain = reg.guard(None, Arc::new(|_| None));
    let deny = reg.guard(None, Arc::new(|_| Some("global denial".to_owned())));
    assert_eq!(run(&reg, "t", "a").await, "Error: global denial");
    assert!(log.entries().is_empty());

    drop(deny);
    let _boom = reg.guard(None, Arc::new(|_| panic!("guard exploded")));
    let executed = reg.execute(&sid("a"), call("c1", "t", "{}"), Signal::new()).await;
    assert_eq!(text(&executed), "Error: tool guard failed: guard exploded");
    assert_eq!(code(&executed), codes::DENIED);
    assert!(log.entries().is_empty());
}

/// spec: SPN-67 — a pre-execute denial wins without consulting guards; a scoped pre-execute
/// policy gates only its own agent.
#[tokio::test]
async fn scoped_pre_execute_gates_only_its_agent() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let seen = Log::default();
    let _t = reg.register(None, tool("t")).unwrap();
    let _veto = {
        let seen = seen.clone();
        reg.pre_execute(
            Some(&a),
            Arc::new(move |exec, _| {
                seen.push(exec.agent.to_string());
                PreExecuteDecision::Deny("scoped veto".into())
            }),
        )
    };
    let guarded = Log::default();
    let _g = {
        let guarded = guarded.clone();
        reg.guard(
            None,
            Arc::new(move |_| {
                guarded.push("guard");
                None
            }),
        )
    };
    let vetoed = reg.execute(&a, call("c1", "t", "{}"), Signal::new()).await;
    assert_eq!(text(&vetoed), "Error: scoped veto");
    assert_eq!(code(&vetoed), codes::DENIED);
    assert!(guarded.entries().is_empty());
    assert_eq!(run(&reg, "t", "other").await, "ran:t");
    assert_eq!(seen.entries(), ["a"]);
    assert_eq!(guarded.entries(), ["guard"]);
}

/// spec: SPN-67 — an ancestor scope's guard applies to calls of nested scopes.
#[tokio::test]
async fn ancestor_guards_reach_nested_scopes() {
    let reg = ToolRegistry::new();
    let (parent, child) = (sid("parent"), sid("child"));
    let _t = reg.register(None, tool("t")).unwrap();
    let _edge = reg.set_scope_parent(&child, &parent);
    let _g = reg.guard(Some(&parent), Arc::new(|_| Some("parent says no".into())));
    assert_eq!(run(&reg, "t", "child").await, "Error: parent says no");
    assert_eq!(run(&reg, "t", "parent").await, "Error: parent says no");
    assert_eq!(run(&reg, "t", "other").await, "ran:t");
}

/// spec: SPN-68 — every `tools/result` observer (global and the agent's own) receives the
/// frozen final outcome — the very result `execute` returns — exactly once per execution,
/// including denied, unknown and blocked ones; a panicking observer is contained and the next
/// observer still runs.
#[tokio::test]
async fn result_observers_receive_the_final_outcome_and_failures_are_contained() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let _t = reg.register(None, tool("t")).unwrap();
    let _blocked = reg.register(None, tool("blocked")).unwrap();
    let _block = reg.post_execute(
        None,
        Arc::new(|exec, _| {
            (exec.name == "blocked").then(|| PostExecuteDecision::Block("outer failure".into()))
        }),
    );
    let _deny = reg.pre_execute(
        None,
        Arc::new(|exec, d| {
            if exec.name == "denied" {
                PreExecuteDecision::Deny("no".into())
            } else {
                d
            }
        }),
    );
    let seen: Arc<parking_lot::Mutex<Vec<(String, ExecutionId, ToolResult)>>> = Arc::default();
    let scoped_seen = seen.clone();
    let _scoped = reg.on_result(
        Some(&a),
        Arc::new(move |exec, result| {
            scoped_seen
                .lock()
                .push(("scoped".into(), exec.id, result.clone()));
        }),
    );
    let _boom = reg.on_result(None, Arc::new(|_, _| panic!("observer failure")));
    let global_seen = seen.clone();
    let _global = reg.on_result(
        None,
        Arc::new(move |exec, result| {
            global_seen
                .lock()
                .push(("global".into(), exec.id, result.clone()));
        }),
    );
    let other_seen = seen.clone();
    let _other = reg.on_result(
        Some(&sid("b")),
        Arc::new(move |exec, result| {
            other_seen.lock().push(("b".into(), exec.id, result.clone()));
        }),
    );

    for name in ["t", "blocked", "denied", "missing"] {
        seen.lock().clear();
        let executed = reg.execute(&a, call("c1", name, "{}"), Signal::new()).await;
        let seen = seen.lock().clone();
        assert_eq!(seen.len(), 2, "{name}: {seen:?}");
        assert_eq!(seen[0].0, "scoped");
        assert_eq!(seen[1].0, "global");
        for (_, id, result) in &seen {
            assert_eq!(*id, executed.execution.id);
            assert_eq!(*result, executed.result);
        }
    }
    let blocked = reg.execute(&a, call("c2", "blocked", "{}"), Signal::new()).await;
    assert!(blocked.result.is_error);
    assert_eq!(blocked.result.content, vec![ContentBlock::text("outer failure")]);
}

/// Text that is not JSON reaches the tool's own validation as a JSON string, which rejects it
/// with `INVALID_ARGS` (kept, so the model may retry); empty text means `{}`.
#[tokio::test]
async fn non_json_arguments_reach_the_tools_validation() {
    let reg = ToolRegistry::new();
    let received = Arc::new(parking_lot::Mutex::new(Vec::<Value>::new()));
    let r = received.clone();
    let _t = reg
        .register(
            None,
            tool_with("read", false, move |args, _| {
                r.lock().push(args.clone());
                Box::pin(async move {
                    match args.get("path").and_then(Value::as_str) {
                        Some(path) => Ok(ToolOutput::text(format!("read {path}"))),
                        None => Err(ToolError::invalid_args("expected an object with a string `path`")),
                    }
                })
            }),
        )
        .unwrap();
    let a = sid("a");

    let bad = reg
        .execute(&a, call("c1", "read", "not json{"), Signal::new())
        .await;
    assert!(bad.result.is_error);
    assert_eq!(code(&bad), codes::INVALID_ARGS);
    assert_eq!(text(&bad), "Error: expected an object with a string `path`");
    assert_eq!(bad.execution.arguments, json!("not json{"));

    let empty = reg.execute(&a, call("c2", "read", ""), Signal::new()).await;
    assert_eq!(code(&empty), codes::INVALID_ARGS);
    assert_eq!(empty.execution.arguments, json!({}));

    let good = reg
        .execute(&a, call("c3", "read", r#"{"path":"a.txt"}"#), Signal::new())
        .await;
    assert!(!good.result.is_error);
    assert_eq!(text(&good), "read a.txt");
    assert_eq!(
        *received.lock(),
        vec![json!("not json{"), json!({}), json!({"path": "a.txt"})]
    );
}

/// The execution record: agent, call id, parsed arguments, and a fresh identity per trip.
#[tokio::test]
async fn every_execution_gets_a_fresh_identity() {
    let reg = ToolRegistry::new();
    let _t = reg.register(None, tool("t")).unwrap();
    let a = sid("a");
    let first = reg
        .execute(&a, call("same", "t", r#"{"k":1}"#), Signal::new())
        .await;
    let second = reg
        .execute(&a, call("same", "t", r#"{"k":1}"#), Signal::new())
        .await;
    assert_ne!(first.execution.id, second.execution.id);
    assert_eq!(first.execution.agent, a);
    assert_eq!(first.execution.call_id.as_str(), "same");
    assert_eq!(first.execution.name, "t");
    assert_eq!(first.execution.arguments, json!({"k": 1}));
}

/// A success carries content, value, meta and `concludes_turn` from the body's context; a body
/// that concludes and then fails does not conclude; deferred contexts come back in order.
#[tokio::test]
async fn success_normalisation_and_deferred_contexts() {
    let reg = ToolRegistry::new();
    let _done = reg
        .register(
            None,
            tool_with("done", false, |_, ctx| {
                ctx.conclude_turn();
                ctx.defer_context(Message::user_text("first"));
                ctx.defer_context(Message::user_text("second"));
                Box::pin(async {
                    Ok(ToolOutput {
                        content: vec![ContentBlock::text("recorded")],
                        value: Some(json!({"recorded": true})),
                        meta: Some(json!({"m": 1})),
                    })
                })
            }),
        )
        .unwrap();
    let _fails = reg
        .register(
            None,
            tool_with("fails", false, |_, ctx| {
                ctx.conclude_turn();
                Box::pin(async { Err(ToolError::new("CUSTOM", "went wrong")) })
            }),
        )
        .unwrap();
    let a = sid("a");
    let done = reg.execute(&a, call("c1", "done", "{}"), Signal::new()).await;
    assert!(!done.result.is_error);
    assert!(done.result.concludes_turn);
    assert_eq!(done.result.value, Some(json!({"recorded": true})));
    assert_eq!(done.result.meta, Some(json!({"m": 1})));
    assert_eq!(text(&done), "recorded");
    assert_eq!(
        done.deferred.iter().map(Message::text).collect::<Vec<_>>(),
        ["first", "second"]
    );

    let fails = reg.execute(&a, call("c2", "fails", "{}"), Signal::new()).await;
    assert!(fails.result.is_error);
    assert!(!fails.result.concludes_turn);
    assert_eq!(code(&fails), "CUSTOM");
    assert_eq!(text(&fails), "Error: went wrong");
    assert_eq!(fails.result.value, None);
}

/// Post-execute: `Accept` may replace content or value; `Block` turns the outcome into an error
/// whose content is the feedback and discards deferred contexts; a value on a failure fails.
#[tokio::test]
async fn post_execute_accepts_replaces_and_blocks() {
    let reg = ToolRegistry::new();
    let _t = reg
        .register(
            None,
            tool_with("t", false, |_, ctx| {
                ctx.defer_context(Message::user_text("ctx"));
                Box::pin(async { Ok(ToolOutput::text("original")) })
            }),
        )
        .unwrap();
    let _e = reg
        .register(
            None,
            tool_with("e", false, |_, _| {
                Box::pin(async { Err(ToolError::failed("bad")) })
            }),
        )
        .unwrap();
    let a = sid("a");

    let replace = reg.post_execute(
        None,
        Arc::new(|_, r| {
            (!r.is_error).then(|| PostExecuteDecision::Accept {
                content: Some(vec![ContentBlock::text("replaced")]),
                value: Some(json!(7)),
            })
        }),
    );
    let seen_by_next = Log::default();
    let _next = {
        let seen = seen_by_next.clone();
        reg.post_execute(
            None,
            Arc::new(move |_, r| {
                if let Some(ContentBlock::Text { text }) = r.content.first() {
                    seen.push(text.clone());
                }
                None
            }),
        )
    };
    let accepted = reg.execute(&a, call("c1", "t", "{}"), Signal::new()).await;
    assert_eq!(text(&accepted), "replaced");
    assert_eq!(accepted.result.value, Some(json!(7)));
    assert_eq!(accepted.deferred.len(), 1);
    assert_eq!(seen_by_next.entries(), ["replaced"]);
    drop(replace);

    let _block = reg.post_execute(
        Some(&a),
        Arc::new(|exec, _| {
            (exec.name == "t").then(|| PostExecuteDecision::Block("use the other tool".into()))
        }),
    );
    let blocked = reg.execute(&a, call("c2", "t", "{}"), Signal::new()).await;
    assert!(blocked.result.is_error);
    assert_eq!(
        blocked.result.content,
        vec![ContentBlock::text("use the other tool")]
    );
    assert_eq!(
        blocked.result.error.as_ref().unwrap().message,
        "use the other tool"
    );
    assert_eq!(code(&blocked), codes::DENIED);
    assert!(blocked.deferred.is_empty());
    assert_eq!(run(&reg, "t", "other").await, "original");

    let _value_on_error = reg.post_execute(
        None,
        Arc::new(|exec, _| {
            (exec.name == "e").then(|| PostExecuteDecision::Accept {
                content: None,
                value: Some(json!(1)),
            })
        }),
    );
    let failed = reg.execute(&a, call("c3", "e", "{}"), Signal::new()).await;
    assert_eq!(
        text(&failed),
        "Error: tools/post-execute cannot replace the value of a failed result"
    );
    assert_eq!(code(&failed), codes::FAILED);
}

/// `Ask` is denied with a clear reason without an approval service, runs when approved once,
/// and is denied with distinct reasons otherwise.
#[tokio::test]
async fn ask_resolves_through_the_approval_service() {
    let reg = ToolRegistry::new();
    let log = Log::default();
    let _t = reg.register(None, counted("t", &log)).unwrap();
    let _ask = reg.pre_execute(None, Arc::new(|_, _| PreExecuteDecision::Ask));
    let a = sid("a");

    let unconfigured = reg.execute(&a, call("c1", "t", "{}"), Signal::new()).await;
    assert_eq!(
        text(&unconfigured),
        "Error: tool \"t\" requires approval, but no approval service is configured"
    );
    assert_eq!(code(&unconfigured), codes::DENIED);

    let cases = [
        (ApprovalOutcome::AllowedOnce, "ran:t"),
        (ApprovalOutcome::Rejected, "Error: the user rejected tool \"t\""),
        (
            ApprovalOutcome::Cancelled,
            "Error: approval for tool \"t\" was cancelled",
        ),
        (
            ApprovalOutcome::Unavailable,
            "Error: tool \"t\" requires approval, but no approval channel is available",
        ),
    ];
    for (outcome, expected) in cases {
        let _approval = reg.set_approval(Arc::new(Approve(outcome)));
        assert_eq!(run(&reg, "t", "a").await, expected, "{outcome:?}");
    }
    assert_eq!(log.entries(), ["body:t"]);

    // Approved calls still pass the guards.
    let _approval = reg.set_approval(Arc::new(Approve(ApprovalOutcome::AllowedOnce)));
    let _g = reg.guard(None, Arc::new(|_| Some("guarded".into())));
    assert_eq!(run(&reg, "t", "a").await, "Error: guarded");
}

/// A cancelled signal while waiting for approval resolves as aborted before dispatch.
#[tokio::test(start_paused = true)]
async fn cancellation_during_approval_aborts_before_dispatch() {
    let reg = ToolRegistry::new();
    let _t = reg.register(None, tool("t")).unwrap();
    let _ask = reg.pre_execute(None, Arc::new(|_, _| PreExecuteDecision::Ask));
    let _approval = reg.set_approval(Arc::new(NeverAnswers));
    let signal = Signal::new();
    let agent = sid("a");
    let (executed, ()) = tokio::join!(
        reg.execute(&agent, call("c1", "t", "{}"), signal.clone()),
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            signal.cancel(CancelCause::User);
        }
    );
    assert_eq!(text(&executed), "Error: tool call aborted before dispatch");
    assert_eq!(code(&executed), loop_codes::ABORTED_BEFORE_DISPATCH);
}

/// A call whose signal is already cancelled never reaches policies or the body, resolves as
/// `tool call aborted before dispatch` (code `TOOL_ABORTED_BEFORE_DISPATCH`), skips
/// post-execute, and still notifies the observers.
#[tokio::test]
async fn pre_cancelled_calls_abort_before_dispatch() {
    let reg = ToolRegistry::new();
    let log = Log::default();
    let _t = reg.register(None, counted("t", &log)).unwrap();
    let _pre = {
        let log = log.clone();
        reg.pre_execute(
            None,
            Arc::new(move |_, d| {
                log.push("pre");
                d
            }),
        )
    };
    let _post = {
        let log = log.clone();
        reg.post_execute(
            None,
            Arc::new(move |_, _| {
                log.push("post");
                None
            }),
        )
    };
    let _obs = {
        let log = log.clone();
        reg.on_result(
            None,
            Arc::new(move |_, r| log.push(format!("result:{}", r.is_error))),
        )
    };
    let signal = Signal::cancelled_with(CancelCause::User);
    let executed = reg.execute(&sid("a"), call("c1", "t", "{}"), signal).await;
    assert_eq!(text(&executed), "Error: tool call aborted before dispatch");
    assert_eq!(code(&executed), "TOOL_ABORTED_BEFORE_DISPATCH");
    assert_eq!(log.entries(), ["result:true"]);
}

/// Cancelling the signal while the body runs ends the body at once and records
/// `tool call aborted` (code `CANCELLED`); post-execute and observers still run.
#[tokio::test(start_paused = true)]
async fn cancellation_during_the_body_is_recorded_as_cancelled() {
    let reg = ToolRegistry::new();
    let log = Log::default();
    let _slow = {
        let log = log.clone();
        reg.register(
            None,
            tool_with("slow", false, move |_, _| {
                let log = log.clone();
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    log.push("finished");
                    Ok(ToolOutput::text("late"))
                })
            }),
        )
        .unwrap()
    };
    let _post = {
        let log = log.clone();
        reg.post_execute(
            None,
            Arc::new(move |_, r| {
                log.push(format!("post:{}", r.is_error));
                None
            }),
        )
    };
    let _obs = {
        let log = log.clone();
        reg.on_result(
            None,
            Arc::new(move |_, r| log.push(format!("result:{}", r.is_error))),
        )
    };
    let signal = Signal::new();
    let started = tokio::time::Instant::now();
    let agent = sid("a");
    let (executed, ()) = tokio::join!(
        reg.execute(&agent, call("c1", "slow", "{}"), signal.clone()),
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            signal.cancel(CancelCause::User);
        }
    );
    assert_eq!(started.elapsed(), Duration::from_secs(1));
    assert_eq!(text(&executed), "Error: tool call aborted");
    assert_eq!(code(&executed), codes::CANCELLED);
    assert_eq!(log.entries(), ["post:true", "result:true"]);
}

/// A success that settles after the signal was cancelled is recorded as cancelled; a tool's own
/// error in that window is kept.
#[tokio::test]
async fn success_racing_cancellation_becomes_cancelled() {
    let reg = ToolRegistry::new();
    let _ok = reg
        .register(
            None,
            tool_with("ok", false, |_, ctx| {
                ctx.signal.cancel(CancelCause::User);
                Box::pin(async { Ok(ToolOutput::text("done")) })
            }),
        )
        .unwrap();
    let _err = reg
        .register(
            None,
            tool_with("err", false, |_, ctx| {
                ctx.signal.cancel(CancelCause::User);
                Box::pin(async { Err(ToolError::invalid_args("bad")) })
            }),
        )
        .unwrap();
    let ok = reg
        .execute(&sid("a"), call("c1", "ok", "{}"), Signal::new())
        .await;
    assert_eq!(code(&ok), codes::CANCELLED);
    let err = reg
        .execute(&sid("a"), call("c2", "err", "{}"), Signal::new())
        .await;
    assert_eq!(code(&err), codes::INVALID_ARGS);
}

/// Panics in a body or a pre-execute policy become error results (`FAILED`); a panicking
/// pre-execute policy ends the pipeline before post-execute.
#[tokio::test]
async fn panics_become_error_results() {
    let reg = ToolRegistry::new();
    let _boom = reg
        .register(None, tool_with("boom", false, |_, _| panic!("body exploded")))
        .unwrap();
    let _t = reg.register(None, tool("t")).unwrap();
    let a = sid("a");
    let executed = reg.execute(&a, call("c1", "boom", "{}"), Signal::new()).await;
    assert_eq!(text(&executed), "Error: tool \"boom\" failed: body exploded");
    assert_eq!(code(&executed), codes::FAILED);

    let log = Log::default();
    let _pre = reg.pre_execute(
        None,
        Arc::new(|exec, d| {
            if exec.name == "t" {
                panic!("policy exploded")
            } else {
                d
            }
        }),
    );
    let _post = {
        let log = log.clone();
        reg.post_execute(
            None,
            Arc::new(move |_, _| {
                log.push("post");
                None
            }),
        )
    };
    let executed = reg.execute(&a, call("c2", "t", "{}"), Signal::new()).await;
    assert_eq!(
        text(&executed),
        "Error: tools/pre-execute policy failed: policy exploded"
    );
    assert_eq!(code(&executed), codes::FAILED);
    assert!(log.entries().is_empty());

    let _post_boom = reg.post_execute(None, Arc::new(|_, _| panic!("post exploded")));
    let executed = reg.execute(&a, call("c3", "other", "{}"), Signal::new()).await;
    assert_eq!(
        text(&executed),
        "Error: tools/post-execute policy failed: post exploded"
    );
}

/// Unknown tools reach the policies (they see every name) and resolve as `UNKNOWN_TOOL`.
#[tokio::test]
async fn unknown_tools_pass_policies_and_fail_at_dispatch() {
    let reg = ToolRegistry::new();
    let log = Log::default();
    let _pre = {
        let log = log.clone();
        reg.pre_execute(
            None,
            Arc::new(move |exec, d| {
                log.push(format!("pre:{}", exec.name));
                d
            }),
        )
    };
    let executed = reg
        .execute(&sid("a"), call("c1", "ghost", "{}"), Signal::new())
        .await;
    assert_eq!(code(&executed), codes::UNKNOWN_TOOL);
    assert_eq!(text(&executed), "Error: unknown tool \"ghost\"");
    assert_eq!(log.entries(), ["pre:ghost"]);
    assert!(executed.deferred.is_empty());
}

/// A tool body whose `execute` panics when called, before it returns a future (a hand-written
/// `ToolHandler` impl, without `#[async_trait]`'s deferral into the future).
struct PanicsAtCall;

impl agent::tools::ToolHandler for PanicsAtCall {
    fn execute<'life0, 'async_trait>(
        &'life0 self,
        _arguments: Value,
        _ctx: agent::tools::ToolContext,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<ToolOutput, ToolError>> + Send + 'async_trait>,
    >
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        panic!("exploded at call")
    }
}

/// An approval service whose `request` panics when called, before it returns a future.
struct ApprovalPanicsAtCall;

impl ToolApproval for ApprovalPanicsAtCall {
    fn request<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        _execution: &'life1 ToolExecution,
        _signal: &'life2 Signal,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ApprovalOutcome> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        panic!("approval exploded at call")
    }
}

/// A body that panics when *called* (not when polled) is contained exactly like one that
/// panics while polled: a `FAILED` error result naming the panic, post-execute and the result
/// observers still run, and the panic never unwinds into the caller (the agent's driver).
/// Likewise an approval service that panics at call denies the call.
#[tokio::test]
async fn panics_when_called_become_error_results() {
    let reg = ToolRegistry::new();
    let _boom = reg
        .register(
            None,
            agent::ToolDefinition {
                name: "boom".to_owned(),
                description: "panics at call".to_owned(),
                parameters: json!({"type": "object"}),
                concurrency_safe: false,
                handler: Arc::new(PanicsAtCall),
            },
        )
        .unwrap();
    let log = Log::default();
    let _observer = {
        let log = log.clone();
        reg.on_result(
            None,
            Arc::new(move |exec: &ToolExecution, _: &ToolResult| {
                log.push(format!("result:{}", exec.call_id))
            }),
        )
    };
    let executed = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(reg.execute(
        &sid("a"),
        call("c1", "boom", "{}"),
        Signal::new(),
    )))
    .await
    .expect("a body panicking at call must not unwind out of the pipeline");
    assert_eq!(text(&executed), "Error: tool \"boom\" failed: exploded at call");
    assert_eq!(code(&executed), codes::FAILED);
    assert_eq!(log.entries(), ["result:c1"]);

    let _t = reg.register(None, tool("t")).unwrap();
    let _ask = reg.pre_execute(None, Arc::new(|_, _| PreExecuteDecision::Ask));
    let _approval = reg.set_approval(Arc::new(ApprovalPanicsAtCall));
    let executed = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(reg.execute(
        &sid("a"),
        call("c2", "t", "{}"),
        Signal::new(),
    )))
    .await
    .expect("an approval service panicking at call must not unwind out of the pipeline");
    assert_eq!(code(&executed), codes::DENIED);
    assert!(
        text(&executed).contains("approval exploded at call"),
        "{}",
        text(&executed)
    );
    assert_eq!(log.entries(), ["result:c1", "result:c2"]);
}

/// Arguments that parse to non-lossless JSON (a negative zero) are refused before any stage
/// (`INVALID_ARGS`, the body never runs), and an output that is not lossless JSON — here a
/// post-execute `Accept` value — becomes a `FAILED` result: the observers see that final,
/// recordable outcome (spec §11.1, §11.5).
#[tokio::test]
async fn non_lossless_arguments_and_outputs_become_error_results() {
    let reg = ToolRegistry::new();
    let log = Log::default();
    let _t = reg.register(None, counted("t", &log)).unwrap();
    let _observer = {
        let log = log.clone();
        reg.on_result(
            None,
            Arc::new(move |exec: &ToolExecution, result: &ToolResult| {
                log.push(format!("result:{}:{}", exec.call_id, result.is_error))
            }),
        )
    };
    let a = sid("a");
    let executed = reg
        .execute(&a, call("c1", "t", "{\"x\": -0.0}"), Signal::new())
        .await;
    assert_eq!(code(&executed), codes::INVALID_ARGS);
    assert!(
        text(&executed).starts_with("Error: tool call arguments are not lossless JSON: "),
        "{}",
        text(&executed)
    );
    assert_eq!(log.entries(), ["result:c1:true"]);

    let _post = reg.post_execute(
        None,
        Arc::new(|_, _| {
            Some(PostExecuteDecision::Accept {
                content: None,
                value: Some(json!({"x": -0.0})),
            })
        }),
    );
    let executed = reg.execute(&a, call("c2", "t", "{}"), Signal::new()).await;
    assert_eq!(code(&executed), codes::FAILED);
    assert!(
        text(&executed).starts_with("Error: tool \"t\" returned output that is not lossless JSON: value: "),
        "{}",
        text(&executed)
    );
    assert!(executed.result.value.is_none());
    assert_eq!(log.entries(), ["result:c1:true", "body:t", "result:c2:true"]);
}

/// A call recorded as cancelled returns no deferred contexts, however the cancellation met it:
/// while the body ran, as the body settled, or (a success racing it) before the commit. Its
/// contexts belong to an outcome that was discarded; returned, they would reach the aborted
/// turn's inbox and leak into the next turn.
#[tokio::test(start_paused = true)]
async fn a_cancelled_call_returns_no_deferred_contexts() {
    let reg = ToolRegistry::new();
    let deferring = |name: &str, cancel_self: bool, hang: bool| {
        tool_with(name, false, move |_, ctx| {
            ctx.defer_context(Message::user_text("deferred"));
            if cancel_self {
                ctx.signal.cancel(CancelCause::User);
            }
            Box::pin(async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                Ok(ToolOutput::text("done"))
            })
        })
    };
    let _hangs = reg.register(None, deferring("hangs", false, true)).unwrap();
    let _settles = reg.register(None, deferring("settles", true, false)).unwrap();
    let _plain = reg.register(None, deferring("plain", false, false)).unwrap();
    let a = sid("a");

    let signal = Signal::new();
    let (executed, ()) = tokio::join!(
        reg.execute(&a, call("c1", "hangs", "{}"), signal.clone()),
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            signal.cancel(CancelCause::User);
        }
    );
    assert_eq!(code(&executed), codes::CANCELLED);
    assert!(executed.deferred.is_empty());

    let executed = reg.execute(&a, call("c2", "settles", "{}"), Signal::new()).await;
    assert_eq!(code(&executed), codes::CANCELLED);
    assert!(executed.deferred.is_empty());

    // The success races a cancellation that arrives after the body settled, before the commit.
    let signal = Signal::new();
    let post = {
        let signal = signal.clone();
        reg.post_execute(
            None,
            Arc::new(move |_, _| {
                signal.cancel(CancelCause::User);
                None
            }),
        )
    };
    let executed = reg.execute(&a, call("c3", "plain", "{}"), signal).await;
    assert_eq!(code(&executed), codes::CANCELLED);
    assert!(executed.deferred.is_empty());

    // Not cancelled: the contexts are returned.
    drop(post);
    let executed = reg.execute(&a, call("c4", "plain", "{}"), Signal::new()).await;
    assert_eq!(text(&executed), "done");
    assert_eq!(executed.deferred.len(), 1);
}

/// A tool whose body registers a discard hook that counts into `ran`, optionally cancels its own
/// call's signal (the cancellation arriving after the body's last check), then returns `output`
/// (or fails, with `fail`).
fn hooked(
    name: &str,
    ran: &Arc<std::sync::atomic::AtomicUsize>,
    cancel_self: bool,
    fail: bool,
    value: Option<Value>,
) -> agent::ToolDefinition {
    let ran = ran.clone();
    tool_with(name, false, move |_, ctx| {
        let ran = ran.clone();
        ctx.on_discarded(move || {
            ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        if cancel_self {
            ctx.signal.cancel(CancelCause::User);
        }
        let value = value.clone();
        Box::pin(async move {
            if fail {
                return Err(ToolError::failed("boom"));
            }
            Ok(ToolOutput {
                value,
                ..ToolOutput::text("done")
            })
        })
    })
}

fn count(ran: &Arc<std::sync::atomic::AtomicUsize>) -> usize {
    ran.load(std::sync::atomic::Ordering::SeqCst)
}

/// A success the pipeline itself replaces runs the body's discard hooks exactly once: the
/// signal fired after the body returned (stage 4), or before the commit (post-execute), or the
/// output cannot be recorded. A committed success, a body's own error, and a post-execute
/// `Block` (the policy decided what the model sees) run none.
#[tokio::test]
async fn a_discarded_success_runs_its_discard_hooks_once() {
    let reg = ToolRegistry::new();
    let a = sid("a");

    // The body's own call signal fires after it last checked it: recorded as cancelled.
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _t = reg
        .register(None, hooked("races", &ran, true, false, None))
        .unwrap();
    let executed = reg.execute(&a, call("c1", "races", "{}"), Signal::new()).await;
    assert_eq!(code(&executed), codes::CANCELLED);
    assert_eq!(count(&ran), 1, "the hook ran once");

    // Untouched signal: committed, the hook never runs.
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _t = reg
        .register(None, hooked("plain", &ran, false, false, None))
        .unwrap();
    let executed = reg.execute(&a, call("c2", "plain", "{}"), Signal::new()).await;
    assert!(!executed.result.is_error, "{:?}", executed.result);
    assert_eq!(text(&executed), "done");
    assert_eq!(count(&ran), 0, "a committed success runs no hook");

    // A body's own error is no success to discard.
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _t = reg
        .register(None, hooked("fails", &ran, true, true, None))
        .unwrap();
    let executed = reg.execute(&a, call("c3", "fails", "{}"), Signal::new()).await;
    assert_eq!(code(&executed), codes::FAILED);
    assert_eq!(count(&ran), 0);

    // An unrecordable output (a negative zero) becomes FAILED: the success is discarded.
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _t = reg
        .register(
            None,
            hooked("unloggable", &ran, false, false, Some(json!({"x": -0.0}))),
        )
        .unwrap();
    let executed = reg
        .execute(&a, call("c4", "unloggable", "{}"), Signal::new())
        .await;
    assert_eq!(code(&executed), codes::FAILED);
    assert_eq!(count(&ran), 1);

    // The signal fires after the body settled, before the commit's race check.
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _t = reg
        .register(None, hooked("late", &ran, false, false, None))
        .unwrap();
    let signal = Signal::new();
    let post = {
        let signal = signal.clone();
        reg.post_execute(
            None,
            Arc::new(move |exec: &ToolExecution, _: &ToolResult| {
                if exec.name == "late" {
                    signal.cancel(CancelCause::User);
                }
                None
            }),
        )
    };
    let executed = reg.execute(&a, call("c5", "late", "{}"), signal).await;
    assert_eq!(code(&executed), codes::CANCELLED);
    assert_eq!(count(&ran), 1);
    drop(post);

    // A post-execute block replaces the success by the policy's decision: no hook.
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _t = reg
        .register(None, hooked("blocked", &ran, false, false, None))
        .unwrap();
    let _block = reg.post_execute(
        None,
        Arc::new(|exec: &ToolExecution, _: &ToolResult| {
            (exec.name == "blocked").then(|| PostExecuteDecision::Block("no".to_owned()))
        }),
    );
    let executed = reg.execute(&a, call("c6", "blocked", "{}"), Signal::new()).await;
    assert_eq!(code(&executed), codes::DENIED);
    assert_eq!(count(&ran), 0);
}

/// The parallel-group commit (`RaceCheck::AtSettle`): a success whose signal had fired when the
/// body settled (a cross-thread cancellation between the body's return and the dispatch's
/// check, fixed here through a test constructor) is recorded as cancelled and runs its hooks
/// once; one that settled before the cancellation keeps its success and runs none.
#[tokio::test]
async fn a_parallel_commit_discarding_a_settled_success_runs_its_hooks() {
    use super::super::pipeline::{Dispatched, RaceCheck};
    use agent::tools::ToolContext;

    let reg = ToolRegistry::new();
    let context = |id: &str| {
        ToolContext::new(
            Arc::new(ToolExecution {
                id: ExecutionId::next(),
                agent: sid("a"),
                call_id: agent::CallId::from(id),
                name: "t".to_owned(),
                arguments: json!({}),
            }),
            Signal::new(),
        )
    };
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let hook = |ctx: &ToolContext| {
        let ran = ran.clone();
        ctx.on_discarded(move || {
            ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
    };

    let raced = context("c1");
    hook(&raced);
    raced.signal.cancel(CancelCause::User);
    let dispatched = Dispatched::settled_success_for_test(raced, ToolOutput::text("done"), true);
    let executed = reg.commit(dispatched, RaceCheck::AtSettle).deliver();
    assert_eq!(code(&executed), codes::CANCELLED);
    assert_eq!(count(&ran), 1);

    // Cancelled only while awaiting its commit: the settled success is kept.
    let kept = context("c2");
    hook(&kept);
    kept.signal.cancel(CancelCause::User);
    let dispatched = Dispatched::settled_success_for_test(kept, ToolOutput::text("done"), false);
    let executed = reg.commit(dispatched, RaceCheck::AtSettle).deliver();
    assert!(!executed.result.is_error, "{:?}", executed.result);
    assert_eq!(count(&ran), 1, "a committed success runs no hook");
}

/// A tool whose body registers a discard hook that panics, optionally cancels its own call's
/// signal after its last check, then returns `value` as its success.
fn panicking_discard(name: &str, cancel_self: bool, value: Option<Value>) -> agent::ToolDefinition {
    tool_with(name, false, move |_, ctx| {
        ctx.on_discarded(|| panic!("discard hook exploded"));
        if cancel_self {
            ctx.signal.cancel(CancelCause::User);
        }
        let value = value.clone();
        Box::pin(async move {
            Ok(ToolOutput {
                value,
                ..ToolOutput::text("done")
            })
        })
    })
}

/// Discard hooks are user code like every other pipeline hook: one that panics is contained.
/// `execute` still returns the replaced outcome (cancelled, or `FAILED` for an unrecordable
/// output) and every `tools/result` observer still receives it; the panic never unwinds into
/// the caller (the agent's driver). Before, the panic escaped `execute` from stage 4 and from
/// the commit, skipping the observers.
#[tokio::test]
async fn a_panicking_discard_hook_is_contained() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let log = Log::default();
    let _obs = {
        let log = log.clone();
        reg.on_result(
            None,
            Arc::new(move |exec, r| {
                let code = r.error.as_ref().map_or("", |e| e.code.as_str());
                log.push(format!("result:{}:{code}", exec.call_id));
            }),
        )
    };
    let _races = reg
        .register(None, panicking_discard("races", true, None))
        .unwrap();
    let _unloggable = reg
        .register(
            None,
            panicking_discard("unloggable", false, Some(json!({"x": -0.0}))),
        )
        .unwrap();

    let executed = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(reg.execute(
        &a,
        call("c1", "races", "{}"),
        Signal::new(),
    )))
    .await
    .expect("a discard hook's panic must not escape the pipeline (stage 4)");
    assert_eq!(code(&executed), codes::CANCELLED);
    assert_eq!(text(&executed), "Error: tool call aborted");

    let executed = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(reg.execute(
        &a,
        call("c2", "unloggable", "{}"),
        Signal::new(),
    )))
    .await
    .expect("a discard hook's panic must not escape the pipeline (commit)");
    assert_eq!(code(&executed), codes::FAILED);

    assert_eq!(
        log.entries(),
        ["result:c1:CANCELLED", "result:c2:FAILED"],
        "every observer still receives the final outcome"
    );
}
