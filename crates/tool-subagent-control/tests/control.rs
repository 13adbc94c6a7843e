//! `send_message` and `interrupt_agent` end to end (`acp-and-tools.md` §4.1–§4.3, checklist
//! CTRL-1 … CTRL-14): the tools loaded over a real host with the seam's continuation manager,
//! called through the real tool registry.

mod common;

use agent::tools::ToolRegistryError;
use agent::{AgentStatus, SessionId, Signal};
use agent_loop::model::ScriptEntry;
use common::{PARENT, Rig, answer, error, live_log, ok_text, prompts, text, turn_end_reasons};
use serde_json::{Value, json};
use subagent::SubagentErrorCode;
use tool_subagent_control::{ControlToolError, DEPENDENCIES, PLUGIN_NAME, SubagentControlPlugin};

fn property_names(parameters: &Value) -> Vec<String> {
    let mut names: Vec<String> = parameters["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    names.sort();
    names
}

fn required(parameters: &Value) -> Vec<String> {
    let mut names: Vec<String> = parameters["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// The cancel of a turn by its parent (cause `parent`), as its `turn/end` records it.
fn stopped_by_parent() -> Value {
    json!({"kind": "aborted", "reason": {"kind": "parent"}})
}

fn send(id: &str, message: &str) -> Value {
    json!({"subagent_id": id, "message": message})
}

fn interrupt(id: &str) -> Value {
    json!({"agent_id": id})
}

// ---- registration -------------------------------------------------------------------------

/// spec: CTRL-1 — `send_message` is registered once, globally, with exactly `message` and
/// `subagent_id` (both required); its description lacks `job_output`/`job id` and mentions
/// `next turn`. "Once": a second load into the same host is refused and changes nothing.
#[tokio::test(start_paused = true)]
async fn ctrl_1_send_message_is_registered_once_with_two_parameters() {
    let rig = Rig::new(vec![]).await;
    assert_eq!(rig.tool_count("send_message"), 1);
    let parameters = rig.parameters("send_message");
    assert_eq!(property_names(&parameters), ["message", "subagent_id"]);
    assert_eq!(required(&parameters), ["message", "subagent_id"]);
    let description = rig.description("send_message");
    assert!(!description.contains("job_output"), "{description}");
    assert!(!description.contains("job id"), "{description}");
    assert!(description.contains("next turn"), "{description}");

    let again = SubagentControlPlugin::load(rig.rt.services(), rig.manager.clone())
        .expect_err("a second control plugin is refused");
    assert!(matches!(
        again,
        ControlToolError::Register(ToolRegistryError::Duplicate(ref name)) if name == "send_message"
    ));
    assert_eq!(rig.tool_count("send_message"), 1);
    assert_eq!(rig.tool_count("interrupt_agent"), 1);
    rig.finish().await;
}

/// spec: CTRL-7 — unloading the plugin removes both `send_message` and `interrupt_agent`
/// (and dropping it does the same); a later call is an unknown tool.
#[tokio::test(start_paused = true)]
async fn ctrl_7_unloading_removes_both_tools() {
    let mut rig = Rig::new(vec![]).await;
    let control = rig.control.take().expect("loaded");
    assert!(control.is_loaded());
    control.unload();
    assert!(!control.is_loaded());
    assert_eq!(rig.tool_count("send_message"), 0);
    assert_eq!(rig.tool_count("interrupt_agent"), 0);
    let (code, _) = error(&rig.call("interrupt_agent", PARENT, interrupt("x")).await);
    assert_eq!(code, "UNKNOWN_TOOL");
    control.unload();
    drop(control);

    let control = SubagentControlPlugin::load(rig.rt.services(), rig.manager.clone()).expect("reloads");
    assert_eq!(rig.tool_count("send_message"), 1);
    assert_eq!(rig.tool_count("interrupt_agent"), 1);
    drop(control);
    assert_eq!(rig.tool_count("send_message"), 0);
    assert_eq!(rig.tool_count("interrupt_agent"), 0);
    rig.finish().await;
}

/// spec: CTRL-8 — plugin shape: name `tool-subagent-control`, dependencies `tools` and
/// `subagents`. (Rust equivalent of the namespace export: the two constants; the subagent
/// service's follow-up and interrupt are the `ContinuationManager` the loader takes.)
#[test]
fn ctrl_8_plugin_shape() {
    assert_eq!(PLUGIN_NAME, "tool-subagent-control");
    assert_eq!(DEPENDENCIES, ["tools", "subagents"]);
}

/// spec: CTRL-9 — `interrupt_agent` has exactly `agent_id` (required); its description
/// mentions `current turn` and `send_message`.
#[tokio::test(start_paused = true)]
async fn ctrl_9_interrupt_agent_schema() {
    let rig = Rig::new(vec![]).await;
    assert_eq!(rig.tool_count("interrupt_agent"), 1);
    let parameters = rig.parameters("interrupt_agent");
    assert_eq!(property_names(&parameters), ["agent_id"]);
    assert_eq!(required(&parameters), ["agent_id"]);
    let description = rig.description("interrupt_agent");
    assert!(description.contains("current turn"), "{description}");
    assert!(description.contains("send_message"), "{description}");
    rig.finish().await;
}

// ---- send_message -------------------------------------------------------------------------

/// spec: CTRL-2 — a settled child is cold-resumed by `send_message`: the result renders
/// `message queued as the next turn for subagent <id>` with `{messageId}`, and the persisted
/// follow-up carries the source `{kind: coordinator, form: relay, senderSessionId: <parent>}`.
#[tokio::test(start_paused = true)]
async fn ctrl_2_a_settled_child_is_cold_resumed() {
    let rig = Rig::new(vec![answer("first answer"), answer("second answer")]).await;
    let child = rig.start(rig.parent(), "child", "child task", "child task").await;
    rig.until_released(&child).await;

    let result = rig.call("send_message", PARENT, send("child", "and then?")).await;
    assert_eq!(
        ok_text(&result),
        "message queued as the next turn for subagent child"
    );
    let value = result.value.clone().expect("a value");
    let message_id = value["messageId"].as_str().expect("messageId").to_owned();
    assert_eq!(value, json!({"messageId": message_id}));
    rig.until_released(&child).await;

    let log = rig.persisted(&child).await;
    assert_eq!(prompts(&log.events), ["child task", "and then?"]);
    let follow_up = log
        .events
        .iter()
        .rev()
        .find_map(|e| match &e.data {
            agent::EventData::UserMessage(m) if m.id.to_string() == message_id => Some(m.clone()),
            _ => None,
        })
        .expect("the follow-up is persisted under its message id");
    assert_eq!(
        serde_json::to_value(&follow_up.source).ok(),
        Some(json!({"kind": "coordinator", "form": "relay", "senderSessionId": PARENT}))
    );
    assert_eq!(rig.model.requests().len(), 2, "one model request per turn");
    rig.finish().await;
}

/// spec: CTRL-3 — a message sent while the child's turn is open becomes a separate later turn:
/// the persisted prompts are the original then the follow-up, each closing its own turn.
#[tokio::test(start_paused = true)]
async fn ctrl_3_a_message_during_an_open_turn_is_a_later_turn() {
    let mut rig = Rig::new(vec![answer("first"), answer("second")]).await;
    let gate = rig.gate("child");
    let child = rig.start(rig.parent(), "child", "long work", "long work").await;
    rig.yield_a_while().await;
    let agent = rig.agent("child").expect("the child is live");
    assert_eq!(agent.status(), AgentStatus::Running, "the first turn is open");
    assert!(rig.model.requests().is_empty(), "held before its first step");

    let result = rig
        .call("send_message", PARENT, send("child", "also consider Y"))
        .await;
    ok_text(&result);
    let queued: Vec<String> = agent.inbox().next_turn.iter().map(|m| m.text()).collect();
    assert_eq!(queued, ["also consider Y"], "queued, not steering the open turn");
    gate.send_replace(true);
    rig.until_released(&child).await;

    let log = rig.persisted(&child).await;
    assert_eq!(prompts(&log.events), ["long work", "also consider Y"]);
    let kinds: Vec<Value> = turn_end_reasons(&log.events)
        .into_iter()
        .map(|r| r["kind"].clone())
        .collect();
    assert_eq!(kinds, [json!("completed"), json!("completed")]);
    assert_eq!(rig.model.requests().len(), 2);
    rig.finish().await;
}

/// spec: CTRL-4 — an unknown child: an errored result containing `unavailable` (code
/// `NOT_RESUMABLE`); nothing is created.
#[tokio::test(start_paused = true)]
async fn ctrl_4_an_unknown_child_is_unavailable() {
    let rig = Rig::new(vec![]).await;
    let result = rig
        .call("send_message", PARENT, send("no-such-child", "hello?"))
        .await;
    let (code, message) = error(&result);
    assert_eq!(code, SubagentErrorCode::NotResumable.as_str());
    assert!(message.contains("unavailable"), "{message}");
    assert_eq!(message, "subagent \"no-such-child\" is unavailable");
    assert_eq!(rig.agents(), [PARENT]);
    assert!(rig.model.requests().is_empty());
    rig.finish().await;
}

/// spec: CTRL-5 — a caller that is not the child's durable direct parent is refused
/// (`another parent session`, `UNAUTHORIZED`); the child is not resumed and gets no message.
#[tokio::test(start_paused = true)]
async fn ctrl_5_a_non_parent_caller_is_refused() {
    let mut rig = Rig::new(vec![answer("first")]).await;
    let child = rig.start(rig.parent(), "child", "child task", "child task").await;
    rig.until_released(&child).await;
    rig.other_agent("stranger").await;

    let result = rig
        .call("send_message", "stranger", send("child", "mine now"))
        .await;
    let (code, message) = error(&result);
    assert_eq!(code, SubagentErrorCode::Unauthorized.as_str());
    assert!(message.contains("another parent session"), "{message}");
    assert!(rig.agent("child").is_none(), "the child was not resumed");
    assert_eq!(prompts(&rig.persisted(&child).await.events), ["child task"]);
    assert_eq!(rig.model.requests().len(), 1);
    rig.finish().await;
}

/// spec: CTRL-6 — `send_message` without a (live) calling agent fails `requires a calling
/// agent` and delivers nothing.
#[tokio::test(start_paused = true)]
async fn ctrl_6_send_message_requires_a_calling_agent() {
    let rig = Rig::new(vec![answer("first")]).await;
    let child = rig.start(rig.parent(), "child", "child task", "child task").await;
    rig.until_released(&child).await;
    let result = rig.call("send_message", "ghost", send("child", "y")).await;
    let (_, message) = error(&result);
    assert!(message.contains("requires a calling agent"), "{message}");
    assert_eq!(
        message,
        "send_message requires a calling agent (exec.agent was undefined)"
    );
    assert!(rig.agent("child").is_none(), "nothing was resumed");
    assert_eq!(prompts(&rig.persisted(&child).await.events), ["child task"]);
    rig.finish().await;
}

/// Malformed arguments are refused `INVALID_ARGS` naming the parameter, before any lookup:
/// nothing is delivered or resumed, and the child's stored log is unchanged.
#[tokio::test(start_paused = true)]
async fn malformed_send_message_arguments_change_nothing() {
    let rig = Rig::new(vec![answer("first")]).await;
    let child = rig.start(rig.parent(), "child", "child task", "child task").await;
    rig.until_released(&child).await;
    let before = rig.persisted(&child).await.events.len();
    for arguments in [
        json!({"subagent_id": "child"}),
        json!({"subagent_id": "child", "message": "   "}),
        json!({"subagent_id": "", "message": "m"}),
        json!({"subagent_id": ["child"], "message": "m"}),
        json!("child"),
    ] {
        let (code, _) = error(&rig.call("send_message", PARENT, arguments).await);
        assert_eq!(code, "INVALID_ARGS");
    }
    assert!(rig.agent("child").is_none());
    assert_eq!(rig.persisted(&child).await.events.len(), before);
    assert_eq!(rig.control.as_ref().map(|c| c.deliveries()), Some(0));
    rig.finish().await;
}

/// §4.2 — the call's token owns only the phase before acceptance: a call already cancelled
/// never reaches the body (the registry refuses it), and cancelling the token after the
/// message was accepted does not take the turn back.
#[tokio::test(start_paused = true)]
async fn the_token_owns_only_the_phase_before_acceptance() {
    let rig = Rig::new(vec![answer("first"), answer("second")]).await;
    let child = rig.start(rig.parent(), "child", "child task", "child task").await;
    rig.until_released(&child).await;

    let cancelled = Signal::new();
    cancelled.cancel(agent::CancelCause::User);
    let result = rig
        .call_with("send_message", PARENT, send("child", "never"), cancelled)
        .await;
    error(&result);
    assert!(rig.agent("child").is_none(), "a cancelled call resumes nothing");

    let signal = Signal::new();
    let result = rig
        .call_with("send_message", PARENT, send("child", "kept"), signal.clone())
        .await;
    ok_text(&result);
    signal.cancel(agent::CancelCause::User);
    rig.until_released(&child).await;
    let log = rig.persisted(&child).await;
    assert_eq!(prompts(&log.events), ["child task", "kept"]);
    let last = turn_end_reasons(&log.events).pop().expect("a turn end");
    assert_eq!(last["kind"], json!("completed"));
    rig.finish().await;
}

/// §4.2 — a call abandoned while its delivery is cold-resuming the child (the call's future
/// dropped, its signal never fired) cancels that delivery: the delivery still runs to its end on
/// its tracked task, rejects, and leaves nothing behind — no resident child, no live agent, no
/// new message in the child's log.
#[tokio::test(start_paused = true)]
async fn an_abandoned_call_cancels_its_delivery() {
    let (rig, held) = Rig::with_held_inspect(vec![answer("first")]).await;
    let child = rig.start(rig.parent(), "child", "child task", "child task").await;
    rig.until_released(&child).await;
    *held.held.lock() = Some(child.clone());
    let signal = Signal::new();
    let mut call = Box::pin(rig.call_with("send_message", PARENT, send("child", "lost"), signal.clone()));
    tokio::select! {
        result = &mut call => panic!("the call answered while resuming: {}", text(&result)),
        () = held.entered.notified() => {}
    }
    let control = rig.control.as_ref().expect("loaded");
    assert_eq!(control.deliveries(), 1, "the delivery is in flight");
    drop(call);
    rig.until("the abandoned delivery ended", |rig| {
        rig.control.as_ref().is_some_and(|c| c.deliveries() == 0)
    })
    .await;
    assert!(!signal.is_cancelled(), "the call's own signal never fired");
    assert!(!rig.manager.is_resident(&child));
    assert!(rig.agent("child").is_none());
    *held.held.lock() = None;
    assert_eq!(prompts(&rig.persisted(&child).await.events), ["child task"]);
    assert_eq!(rig.model.requests().len(), 1);
    rig.finish().await;
}

/// §4.2 — a delivery whose success the pipeline discards (the call's signal fired after the
/// child's inbox accepted the message, before the result was recorded: the model is told
/// `Error: tool call aborted`) is withdrawn from the child's inbox while still unclaimed, so the
/// failure the model sees means the message was NOT delivered — as the tool's description
/// promises — and a retry does not deliver it twice. Before, the message stayed queued and ran
/// as the child's next turn although the call had failed.
#[tokio::test(start_paused = true)]
async fn a_discarded_delivery_is_withdrawn_from_the_inbox() {
    let mut rig = Rig::new(vec![answer("first"), answer("never")]).await;
    let gate = rig.gate("child");
    let child = rig.start(rig.parent(), "child", "child task", "child task").await;
    rig.until("the child's turn is open", |rig| {
        rig.agent("child")
            .is_some_and(|agent| agent.status() == AgentStatus::Running)
    })
    .await;
    let signal = Signal::new();
    // Fires the call's signal once its body has returned, before the pipeline records the
    // result: the success is discarded.
    let fire = signal.clone();
    let late_cancel = rig.rt.services().tools.post_execute(
        Some(&SessionId::from(PARENT)),
        std::sync::Arc::new(
            move |execution: &agent::tools::ToolExecution, _: &agent::tools::ToolResult| {
                if execution.name == "send_message" {
                    fire.cancel(agent::CancelCause::User);
                }
                None
            },
        ),
    );
    let result = rig
        .call_with("send_message", PARENT, send("child", "follow-up"), signal)
        .await;
    drop(late_cancel);
    let (code, message) = error(&result);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("CANCELLED", "tool call aborted")
    );
    let agent = rig.agent("child").expect("the child is live");
    assert!(
        agent.inbox().next_turn.is_empty(),
        "the discarded follow-up is no longer queued"
    );
    gate.send_replace(true);
    rig.until_released(&child).await;
    assert_eq!(prompts(&rig.persisted(&child).await.events), ["child task"]);
    assert_eq!(rig.model.requests().len(), 1, "no turn for the withdrawn message");
    rig.finish().await;
}

/// §4.2 — a call whose future is dropped after the child's inbox accepted its delivery but
/// before the body observed the answer (the pipeline drops a body still pending once the call's
/// signal fired — on a multi-thread runtime the delivery task can accept in that window — or a
/// host abandons the call) withdraws the still-unclaimed message: nobody was told it was
/// delivered (the pipeline records the call as cancelled), so it must not run as the child's
/// next turn. Before, only a body that saw the answer could register the withdrawal, and the
/// message stayed queued and ran although the call was recorded as failed.
#[tokio::test(start_paused = true)]
async fn a_call_dropped_after_acceptance_withdraws_the_delivery() {
    let mut rig = Rig::new(vec![answer("first"), answer("never")]).await;
    let gate = rig.gate("child");
    let child = rig.start(rig.parent(), "child", "child task", "child task").await;
    rig.until("the child's turn is open", |rig| {
        rig.agent("child")
            .is_some_and(|agent| agent.status() == AgentStatus::Running)
    })
    .await;
    let agent = rig.agent("child").expect("the child is live");
    let handler = rig
        .rt
        .services()
        .tools
        .get("send_message", None)
        .expect("registered")
        .handler;
    let execution = agent::tools::ToolExecution {
        id: agent::tools::ExecutionId::next(),
        agent: SessionId::from(PARENT),
        call_id: "dropped".into(),
        name: "send_message".to_owned(),
        arguments: send("child", "follow-up"),
    };
    let ctx = agent::tools::ToolContext::new(std::sync::Arc::new(execution), Signal::new());
    let mut call = handler.execute(send("child", "follow-up"), ctx);
    // One poll: the delivery starts on its task and the body waits for its answer.
    tokio::select! {
        biased;
        result = &mut call => panic!("the call answered at once: {result:?}"),
        () = std::future::ready(()) => {}
    }
    rig.until("the delivery was accepted and its task ended", |rig| {
        agent.inbox().next_turn.len() == 1 && rig.control.as_ref().is_some_and(|c| c.deliveries() == 0)
    })
    .await;
    drop(call);
    assert!(
        agent.inbox().next_turn.is_empty(),
        "the follow-up nobody was told about is no longer queued"
    );
    gate.send_replace(true);
    rig.until_released(&child).await;
    assert_eq!(prompts(&rig.persisted(&child).await.events), ["child task"]);
    assert_eq!(rig.model.requests().len(), 1, "no turn for the withdrawn message");
    drop(handler);
    rig.finish().await;
}

/// §4.2 — the real race behind `a_call_dropped_after_acceptance_withdraws_the_delivery`, through
/// the real pipeline on a multi-thread runtime: the call's signal fires while the delivery task
/// is inside the child's inbox send (past the manager's last signal check). The pipeline polls
/// the body once more, finds it pending and drops it, recording the call as cancelled; the
/// delivery then completes. The delivery task, finding its body gone, withdraws the still
/// unclaimed message, so the failure the model read means "not delivered". Before, the message
/// stayed queued and ran as the child's next turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 3)]
async fn a_call_cancelled_while_its_delivery_is_accepted_withdraws_it() {
    let mut rig = Rig::new(vec![answer("first"), answer("never")]).await;
    let gate = rig.gate("child");
    rig.start(rig.parent(), "child", "child task", "child task").await;
    let agent = rig.agent("child").expect("the child is live");
    // Held at its first step by the gate: the child's driver leaves its inbox alone.
    while agent.status() != AgentStatus::Running
        || agent.inbox().next_turn.len() + agent.inbox().next_step.len() > 0
    {
        tokio::task::yield_now().await;
    }
    // Holds the delivery inside the child's inbox send, after the message was appended.
    let (entered_tx, entered) = std::sync::mpsc::channel::<()>();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = parking_lot::Mutex::new(release_rx);
    let hold = rig
        .rt
        .services()
        .agent_events
        .on_scoped(SessionId::from("child"), move |event| {
            if let agent::AgentEvent::InboxInserted { .. } = event {
                let _ = entered_tx.send(());
                let _ = release_rx.lock().recv();
            }
            Ok(())
        });
    let signal = Signal::new();
    let tools = rig.rt.services().tools.clone();
    let call = tokio::spawn({
        let signal = signal.clone();
        async move {
            let request = agent::tools::ToolCallRequest {
                call_id: "raced".into(),
                name: "send_message".to_owned(),
                arguments: send("child", "follow-up").to_string(),
            };
            tools
                .execute(&SessionId::from(PARENT), request, signal)
                .await
                .result
        }
    });
    entered
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the delivery reaches the child's inbox");
    signal.cancel(agent::CancelCause::User);
    // The pipeline drops the pending body and records the call as cancelled, while the
    // delivery is still held inside the send.
    let result = call.await.expect("the call task");
    let (code, _) = error(&result);
    assert_eq!(code, "CANCELLED");
    release.send(()).expect("the delivery is held");
    rig.control.take().expect("loaded").shutdown().await;
    drop(hold);
    assert!(
        agent.inbox().next_turn.is_empty(),
        "the follow-up of the cancelled call is no longer queued"
    );
    gate.send_replace(true);
    rig.finish().await;
}

/// §4.2 — a composition without a continuation manager: `send_message` fails
/// `CONTINUATION_UNAVAILABLE`, `interrupt_agent` from a live caller is an accepted no-op.
///
/// spec: SVC-6 (Rust equivalent) — "without a manager, `interrupt` does not throw": the Rust
/// service has no `interrupt` member (it is the manager's), so the interrupt a host without a
/// manager offers is this tool's, and it is accepted, never an error.
#[tokio::test(start_paused = true)]
async fn without_a_manager_delivery_is_unavailable_and_interrupts_are_no_ops() {
    let mut rig = Rig::new(vec![]).await;
    drop(rig.control.take());
    let control = SubagentControlPlugin::load_without_continuation(rig.rt.services()).expect("loads");
    let (code, message) = error(&rig.call("send_message", PARENT, send("child", "m")).await);
    assert_eq!(code, "CONTINUATION_UNAVAILABLE");
    assert_eq!(message, "continuable subagents require the agents service");
    let result = rig.call("interrupt_agent", PARENT, interrupt("child")).await;
    assert_eq!(ok_text(&result), "interrupt requested for agent child");
    let (_, message) = error(&rig.call("interrupt_agent", "ghost", interrupt("child")).await);
    assert!(message.contains("requires a calling agent"), "{message}");
    control.shutdown().await;
    rig.finish().await;
}

// ---- interrupt_agent ----------------------------------------------------------------------

/// spec: CTRL-10 — interrupting a running direct child renders `interrupt requested for agent
/// <id>` with `{accepted: true}` and stops its current turn exactly once, with cause `parent`
/// and keep-inbox: the follow-up queued behind it stays parked (no new model request, still in
/// the inbox) until a later waking `send_message`, after which the turns run in FIFO order
/// (original, parked, wake).
#[tokio::test(start_paused = true)]
async fn ctrl_10_interrupt_parks_the_queue_until_a_waking_send() {
    let rig = Rig::new(vec![
        ScriptEntry::hang(),
        answer("parked answer"),
        answer("waking answer"),
    ])
    .await;
    let child = rig.start(rig.parent(), "child", "long work", "long work").await;
    rig.until("the first model request", |rig| rig.model.requests().len() == 1)
        .await;
    let agent = rig.agent("child").expect("the child is live");
    ok_text(
        &rig.call("send_message", PARENT, send("child", "parked follow-up"))
            .await,
    );

    let result = rig.call("interrupt_agent", PARENT, interrupt("child")).await;
    assert_eq!(ok_text(&result), "interrupt requested for agent child");
    assert_eq!(result.value, Some(json!({"accepted": true})));
    agent.when_idle().await;
    rig.yield_a_while().await;
    assert_eq!(rig.model.requests().len(), 1, "parked: no new model request");
    assert_eq!(turn_end_reasons(&live_log(&agent)), [stopped_by_parent()]);
    let parked: Vec<String> = agent.inbox().next_turn.iter().map(|m| m.text()).collect();
    assert_eq!(parked, ["parked follow-up"], "keep-inbox");
    assert!(rig.manager.is_resident(&child), "the Activation stays");

    ok_text(&rig.call("send_message", PARENT, send("child", "wake up")).await);
    rig.until_released(&child).await;
    let log = rig.persisted(&child).await;
    assert_eq!(prompts(&log.events), ["long work", "parked follow-up", "wake up"]);
    let reasons = turn_end_reasons(&log.events);
    assert_eq!(reasons.len(), 3);
    assert_eq!(reasons[0], stopped_by_parent(), "cancelled once");
    assert!(reasons[1..].iter().all(|r| r["kind"] == json!("completed")));
    assert_eq!(rig.model.requests().len(), 3);
    rig.finish().await;
}

/// spec: CTRL-11 — a live grandparent interrupts a grandchild it did not create: the
/// grandchild's turn stops with cause `parent` and keep-inbox (a message its parent queued
/// stays parked), and the child in between keeps running.
#[tokio::test(start_paused = true)]
async fn ctrl_11_a_grandparent_interrupts_a_grandchild() {
    let rig = Rig::new(vec![ScriptEntry::hang(), ScriptEntry::hang()]).await;
    rig.start(rig.parent(), "child", "child", "child work").await;
    rig.until("the child's request", |rig| rig.model.requests().len() == 1)
        .await;
    let child = rig.agent("child").expect("the child is live");
    rig.start(&child, "grandchild", "grandchild", "grandchild work")
        .await;
    rig.until("the grandchild's request", |rig| rig.model.requests().len() == 2)
        .await;
    let grandchild = rig.agent("grandchild").expect("the grandchild is live");
    rig.manager
        .followup(
            &child,
            &SessionId::from("grandchild"),
            vec![agent::ContentBlock::text("queued by the child")],
        )
        .await
        .expect("the child queues work for its child");

    let result = rig.call("interrupt_agent", PARENT, interrupt("grandchild")).await;
    assert_eq!(ok_text(&result), "interrupt requested for agent grandchild");
    grandchild.when_idle().await;
    assert_eq!(turn_end_reasons(&live_log(&grandchild)), [stopped_by_parent()]);
    let parked: Vec<String> = grandchild.inbox().next_turn.iter().map(|m| m.text()).collect();
    assert_eq!(parked, ["queued by the child"]);
    assert_eq!(child.status(), AgentStatus::Running, "the child is untouched");
    assert!(turn_end_reasons(&live_log(&child)).is_empty());
    assert_eq!(rig.model.requests().len(), 2);
    rig.finish().await;
}

/// spec: CTRL-12 — the target itself (`cannot interrupt itself`), a sibling and a stranger
/// (`not a live descendant`, `UNAUTHORIZED`) are refused, and the target is never cancelled.
#[tokio::test(start_paused = true)]
async fn ctrl_12_self_sibling_and_stranger_are_refused() {
    let mut rig = Rig::new(vec![ScriptEntry::hang(), ScriptEntry::hang()]).await;
    rig.start(rig.parent(), "target", "target", "a").await;
    rig.start(rig.parent(), "sibling", "sibling", "b").await;
    rig.until("both requests", |rig| rig.model.requests().len() == 2)
        .await;
    rig.other_agent("stranger").await;
    let target = rig.agent("target").expect("the target is live");

    let (_, message) = error(&rig.call("interrupt_agent", "target", interrupt("target")).await);
    assert!(message.contains("cannot interrupt itself"), "{message}");
    for caller in ["sibling", "stranger"] {
        let (code, message) = error(&rig.call("interrupt_agent", caller, interrupt("target")).await);
        assert_eq!(code, SubagentErrorCode::Unauthorized.as_str());
        assert!(message.contains("not a live descendant"), "{caller}: {message}");
    }
    rig.yield_a_while().await;
    assert_eq!(target.status(), AgentStatus::Running, "never cancelled");
    assert!(turn_end_reasons(&live_log(&target)).is_empty());
    rig.finish().await;
}

/// spec: CTRL-13 — interrupting a settled child or an unknown id is accepted and does not
/// cold-resume anything.
#[tokio::test(start_paused = true)]
async fn ctrl_13_settled_and_unknown_targets_are_accepted_no_ops() {
    let rig = Rig::new(vec![answer("done")]).await;
    let child = rig
        .start(rig.parent(), "child", "settled child", "child work")
        .await;
    rig.until_released(&child).await;
    let before = rig.persisted(&child).await.events.len();

    let settled = rig.call("interrupt_agent", PARENT, interrupt("child")).await;
    assert_eq!(ok_text(&settled), "interrupt requested for agent child");
    let unknown = rig
        .call("interrupt_agent", PARENT, interrupt("no-such-agent"))
        .await;
    assert_eq!(ok_text(&unknown), "interrupt requested for agent no-such-agent");
    assert_eq!(unknown.value, Some(json!({"accepted": true})));
    rig.yield_a_while().await;
    assert!(rig.agent("child").is_none(), "no cold resume");
    assert!(!rig.manager.is_resident(&child));
    assert_eq!(rig.persisted(&child).await.events.len(), before);
    assert_eq!(rig.model.requests().len(), 1);
    rig.finish().await;
}

/// spec: CTRL-14 — `interrupt_agent` without a (live) calling agent fails `requires a calling
/// agent` and cancels nothing.
#[tokio::test(start_paused = true)]
async fn ctrl_14_interrupt_agent_requires_a_calling_agent() {
    let rig = Rig::new(vec![ScriptEntry::hang()]).await;
    rig.start(rig.parent(), "child", "child", "work").await;
    rig.until("the request", |rig| rig.model.requests().len() == 1)
        .await;
    let result = rig.call("interrupt_agent", "ghost", interrupt("child")).await;
    let (_, message) = error(&result);
    assert_eq!(
        message,
        "interrupt_agent requires a calling agent (exec.agent was undefined)"
    );
    let (code, _) = error(&rig.call("interrupt_agent", PARENT, json!({"agent_id": 1})).await);
    assert_eq!(code, "INVALID_ARGS");
    let child = rig.agent("child").expect("live");
    rig.yield_a_while().await;
    assert_eq!(child.status(), AgentStatus::Running);
    assert!(text(&result).starts_with("Error: "));
    rig.finish().await;
}

/// §4.3 and the tool-body contract ("bodies must observe `ctx.signal`") — a call whose signal
/// is already cancelled when its body runs (a pipeline other than the reference one, which
/// checks before dispatch) interrupts nothing: it fails `CANCELLED` and the target keeps
/// running its turn. The interrupt is synchronous and irreversible, so without this check the
/// target's turn was stopped while the caller was told its call was cancelled.
#[tokio::test(start_paused = true)]
async fn a_cancelled_interrupt_call_interrupts_nothing() {
    let rig = Rig::new(vec![ScriptEntry::hang()]).await;
    rig.start(rig.parent(), "child", "child", "work").await;
    rig.until("the request", |rig| rig.model.requests().len() == 1)
        .await;
    let child = rig.agent("child").expect("the child is live");
    let handler = rig
        .rt
        .services()
        .tools
        .get("interrupt_agent", None)
        .expect("registered")
        .handler;
    let execution = agent::tools::ToolExecution {
        id: agent::tools::ExecutionId::next(),
        agent: SessionId::from(PARENT),
        call_id: "direct".into(),
        name: "interrupt_agent".to_owned(),
        arguments: interrupt("child"),
    };
    let ctx = agent::tools::ToolContext::new(
        std::sync::Arc::new(execution),
        Signal::cancelled_with(agent::CancelCause::User),
    );
    let refused = handler
        .execute(interrupt("child"), ctx)
        .await
        .expect_err("a cancelled call is refused");
    assert_eq!(refused.code, "CANCELLED");
    assert_eq!(
        refused.message,
        "interrupt_agent was cancelled before the interrupt was requested; agent child was not interrupted"
    );
    rig.yield_a_while().await;
    assert_eq!(child.status(), AgentStatus::Running, "never interrupted");
    assert!(turn_end_reasons(&live_log(&child)).is_empty());
    assert_eq!(rig.model.requests().len(), 1);
    drop(handler);
    rig.finish().await;
}

/// §4.1/§4.2 — a `send_message` call resolved before the plugin's shutdown whose body runs
/// after it (the registry may still run a call resolved just before its registration was
/// dropped) starts no delivery: it fails, saying the message was not delivered, and the
/// settled child is not cold-resumed. Before, the delivery was spawned on the already closed
/// and awaited task set and cold-resumed the child after `shutdown` had returned.
#[tokio::test(start_paused = true)]
async fn a_call_running_after_shutdown_delivers_nothing() {
    let mut rig = Rig::new(vec![answer("first"), answer("late answer")]).await;
    let child = rig.start(rig.parent(), "child", "child task", "child task").await;
    rig.until_released(&child).await;
    let handler = rig
        .rt
        .services()
        .tools
        .get("send_message", None)
        .expect("registered")
        .handler;
    rig.control.take().expect("loaded").shutdown().await;
    let execution = agent::tools::ToolExecution {
        id: agent::tools::ExecutionId::next(),
        agent: SessionId::from(PARENT),
        call_id: "late".into(),
        name: "send_message".to_owned(),
        arguments: send("child", "late"),
    };
    let ctx = agent::tools::ToolContext::new(std::sync::Arc::new(execution), Signal::new());
    let refused = handler
        .execute(send("child", "late"), ctx)
        .await
        .expect_err("no delivery after shutdown");
    assert_eq!(refused.code, "FAILED");
    assert_eq!(
        refused.message,
        "send_message is shut down; the message was NOT delivered"
    );
    rig.yield_a_while().await;
    assert!(rig.agent("child").is_none(), "nothing was resumed");
    assert!(!rig.manager.is_resident(&child));
    assert_eq!(prompts(&rig.persisted(&child).await.events), ["child task"]);
    assert_eq!(rig.model.requests().len(), 1);
    drop(handler);
    rig.finish().await;
}
