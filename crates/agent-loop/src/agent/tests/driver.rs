//! The turn/step driver, interception and prompt assembly (SPN-28…48).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use serde_json::json;

use agent::event::RequestHeaderReason;
use agent::tools::ToolOutput;
use agent::{
    AgentError, AgentEvent, AgentOptions, AgentRef, AgentRuntime, AgentStatus, CancelCause, CancelOptions,
    ContentBlock, CreateAgentOptions, EventData, FinishReason, LlmFailure, Message, PreStep, PreStepDecision,
    SessionMeta, StreamChunk, TurnEndReason,
};

use super::*;
use crate::model::{ScriptEntry, ScriptedModel, chunks};
use crate::runtime::testkit::*;

/// spec: SPN-28 — `steer()` while idle becomes a woken prompt turn.
#[tokio::test(start_paused = true)]
async fn spn_28_idle_steer_becomes_a_prompt_turn() {
    let model = ScriptedModel::new([chunks::text("reply")]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.steer(user("steered")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["steered"]);
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    assert_eq!(model.requests().len(), 1);
    finish(&rt, [handle]).await;
}

/// A tool that waits until `gate` is notified.
fn gated_tool(name: &str, gate: Arc<tokio::sync::Notify>) -> agent::ToolDefinition {
    tool(name, move |_args, _ctx| {
        let gate = gate.clone();
        async move {
            gate.notified().await;
            Ok(ToolOutput::text("done waiting"))
        }
    })
}

/// spec: SPN-29 — idle steering starts synchronously; steering sent while running enters at the
/// next step of the same turn.
#[tokio::test(start_paused = true)]
async fn spn_29_idle_steer_starts_synchronously_and_running_steer_joins_the_turn() {
    let model = ScriptedModel::new([chunks::tool_call("c1", "wait", json!({})), chunks::text("done")]);
    let rt = runtime(&model);
    let gate = Arc::new(tokio::sync::Notify::new());
    let _tool = rt
        .services()
        .tools
        .register(None, gated_tool("wait", gate.clone()))
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.steer(user("first")).unwrap();
    // Synchronous start: running, turn opened, first claim logged.
    assert_eq!(agent.status(), AgentStatus::Running);
    assert_eq!(
        types(&*agent),
        ["agent/inbox/spliced", "turn/start", "agent/inbox/spliced"]
    );
    assert!(splices(&*agent)[1].is_claim());
    settle().await;
    agent.steer(user("second")).unwrap();
    gate.notify_one();
    agent.when_idle().await;
    assert_eq!(count(&*agent, "turn/start"), 1, "one turn");
    assert_eq!(count(&*agent, "step/start"), 2);
    assert_eq!(user_texts(&*agent), ["first", "second"]);
    drop(_tool);
    finish(&rt, [handle]).await;
}

/// spec: SPN-30 — steering during tool execution is appended after the second `step/start`
/// and seen by the second request.
#[tokio::test(start_paused = true)]
async fn spn_30_steering_during_tools_enters_the_next_step() {
    let model = ScriptedModel::new([chunks::tool_call("c1", "wait", json!({})), chunks::text("done")]);
    let rt = runtime(&model);
    let gate = Arc::new(tokio::sync::Notify::new());
    let tool_guard = rt
        .services()
        .tools
        .register(None, gated_tool("wait", gate.clone()))
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    settle().await;
    agent.steer(user("steer")).unwrap();
    gate.notify_one();
    agent.when_idle().await;
    let t = types(&*agent);
    let second_step = t
        .iter()
        .enumerate()
        .filter(|(_, k)| *k == "step/start")
        .nth(1)
        .unwrap()
        .0;
    let steer_at = agent
        .session()
        .events()
        .iter()
        .position(|e| matches!(&e.data, EventData::UserMessage(m) if m.text() == "steer"))
        .unwrap();
    assert_eq!(steer_at, second_step + 1);
    let tool_result_at = t.iter().position(|k| k == "tool/result").unwrap();
    assert!(tool_result_at < second_step);
    let second = &model.requests()[1];
    assert_eq!(second.messages.last().unwrap().text(), "steer");
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    drop(tool_guard);
    finish(&rt, [handle]).await;
}

/// spec: SPN-31 — a throwing pre-step interceptor ends the turn without a model call and keeps
/// later steering pending until a wake.
#[tokio::test(start_paused = true)]
async fn spn_31_throwing_pre_step_ends_turn_and_keeps_steering_pending() {
    let model = ScriptedModel::new([chunks::text("recovered")]);
    let rt = runtime(&model);
    let (seen, guard) = record_events(&rt);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let hook = rt.services().pre_step.add(
        None,
        Arc::new(PreStepFn(move |step: &PreStep<'_>, proposed| {
            if c.fetch_add(1, Ordering::SeqCst) == 0 {
                step.agent.steer(user("later steering"))?;
                return Err("pre-step exploded".into());
            }
            Ok(proposed)
        })),
    );
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert!(model.requests().is_empty());
    assert_eq!(count(&*agent, "step/start"), 0);
    let ends = turn_ends(&*agent);
    assert!(
        matches!(&ends[..], [TurnEndReason::Error { error }] if error.code == "UNKNOWN" && error.message == "pre-step exploded")
    );
    assert_eq!(agent.inbox().next_step.len(), 1, "steering stays pending");
    assert_eq!(
        seen.lock()
            .iter()
            .filter(|e| matches!(e, AgentEvent::Error { .. }))
            .count(),
        1
    );
    agent.followup(user("wake")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["later steering", "wake"]);
    assert_eq!(model.requests().len(), 1);
    drop((hook, guard));
    finish(&rt, [handle]).await;
}

/// A pre-step interceptor that fails with an [`agent::LlmFailure`] gives the turn's error its
/// code and message as they are; any other error is its text under `UNKNOWN` (SPN-31).
#[tokio::test(start_paused = true)]
async fn a_pre_step_failure_with_a_code_keeps_it() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let hook = rt.services().pre_step.add(
        None,
        Arc::new(PreStepFn(|_: &PreStep<'_>, _| {
            Err(Box::new(agent::LlmFailure::new("STEP_LIMIT", "too many steps")) as agent::BoxError)
        })),
    );
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert!(model.requests().is_empty());
    let ends = turn_ends(&*agent);
    assert!(
        matches!(&ends[..], [TurnEndReason::Error { error }] if error.code == "STEP_LIMIT" && error.message == "too many steps"),
        "{ends:?}"
    );
    drop(hook);
    finish(&rt, [handle]).await;
}

/// spec: SPN-32 — `agent/turn-stopping` can steer extra steps.
#[tokio::test(start_paused = true)]
async fn spn_32_turn_stopping_can_steer_extra_steps() {
    let model = ScriptedModel::new([chunks::text("one"), chunks::text("two")]);
    let rt = runtime(&model);
    let hook = rt.services().turn_stopping.add(
        None,
        Arc::new(SteerOnStop {
            text: "keep going",
            left: AtomicUsize::new(1),
        }),
    );
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(count(&*agent, "turn/start"), 1);
    assert_eq!(count(&*agent, "step/start"), 2);
    assert_eq!(model.requests().len(), 2);
    assert_eq!(user_texts(&*agent), ["go", "keep going"]);
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    drop(hook);
    finish(&rt, [handle]).await;
}

/// spec: SPN-33 — a tool's `concludeTurn()` ends the turn without the follow-up request; its
/// result is still logged.
#[tokio::test(start_paused = true)]
async fn spn_33_concluding_tool_ends_the_turn() {
    let model = ScriptedModel::new([chunks::tool_call("c1", "finish", json!({}))]);
    let rt = runtime(&model);
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool("finish", |_args, ctx| async move {
                ctx.conclude_turn();
                Ok(ToolOutput::text("final"))
            }),
        )
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(model.requests().len(), 1);
    assert_eq!(count(&*agent, "tool/call"), 1);
    assert_eq!(count(&*agent, "tool/result"), 1);
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    drop(guard);
    finish(&rt, [handle]).await;
}

/// spec: SPN-34 — steering that arrives during a concluding tool step still runs another step
/// in the same turn.
#[tokio::test(start_paused = true)]
async fn spn_34_steering_during_concluding_step_runs_another_step() {
    let model = ScriptedModel::new([
        chunks::tool_call("c1", "finish", json!({})),
        chunks::text("after steering"),
    ]);
    let rt = runtime(&model);
    let slot: Arc<Mutex<Option<AgentRef>>> = Arc::default();
    let s = slot.clone();
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool("finish", move |_args, ctx| {
                let agent = s.lock().clone();
                async move {
                    agent.unwrap().steer(user("late steer")).unwrap();
                    ctx.conclude_turn();
                    Ok(ToolOutput::text("final"))
                }
            }),
        )
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    *slot.lock() = Some(agent.clone());
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(model.requests().len(), 2);
    assert_eq!(count(&*agent, "turn/start"), 1);
    assert_eq!(count(&*agent, "step/start"), 2);
    assert_eq!(user_texts(&*agent), ["go", "late steer"]);
    slot.lock().take();
    drop(guard);
    finish(&rt, [handle]).await;
}

/// A model stream that finishes with a kind this runtime does not know (the open union of
/// spine §13.3) ends the turn `error`, coded `UNKNOWN_FINISH`, instead of counting as a stop;
/// the logged finish keeps the kind and its fields.
#[tokio::test(start_paused = true)]
async fn an_unknown_finish_kind_fails_the_turn() {
    let mut fields = serde_json::Map::new();
    fields.insert("detail".into(), serde_json::json!({"policy": 7}));
    let unknown = FinishReason::Unknown {
        kind: "content-withheld".into(),
        fields,
    };
    let mut stream = chunks::text("partial");
    stream.pop();
    stream.push(chunks::finish_chunk(unknown.clone()));
    let model = ScriptedModel::new([ScriptEntry::Chunks(stream)]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    let ends = turn_ends(&*agent);
    assert!(
        matches!(&ends[..], [TurnEndReason::Error { error }] if error.code == "UNKNOWN_FINISH"),
        "{ends:?}"
    );
    let logged = agent.session().events().iter().find_map(|e| match &e.data {
        EventData::AssistantChunk {
            chunk: StreamChunk::Finish { reason, .. },
            ..
        } => Some(reason.clone()),
        _ => None,
    });
    assert_eq!(logged, Some(unknown));
    finish(&rt, [handle]).await;
}

/// spec: SPN-35 — a max-tokens final step ends the turn `max-tokens`.
#[tokio::test(start_paused = true)]
async fn spn_35_max_tokens_final_step() {
    let model = ScriptedModel::new([chunks::max_tokens_text("cut")]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(turn_ends(&*agent), [TurnEndReason::MaxTokens]);
    finish(&rt, [handle]).await;
}

/// spec: SPN-36 — `max-tokens` is sticky within a turn and does not leak into the next turn.
#[tokio::test(start_paused = true)]
async fn spn_36_max_tokens_is_sticky_within_a_turn_only() {
    let model = ScriptedModel::new([
        chunks::max_tokens_text("cut"),
        chunks::text("complete"),
        chunks::text("next turn"),
    ]);
    let rt = runtime(&model);
    let hook = rt.services().turn_stopping.add(
        None,
        Arc::new(SteerOnStop {
            text: "continue",
            left: AtomicUsize::new(1),
        }),
    );
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(count(&*agent, "step/start"), 2);
    assert_eq!(turn_ends(&*agent), [TurnEndReason::MaxTokens]);
    agent.followup(user("again")).unwrap();
    agent.when_idle().await;
    assert_eq!(
        turn_ends(&*agent),
        [TurnEndReason::MaxTokens, TurnEndReason::Completed]
    );
    drop(hook);
    finish(&rt, [handle]).await;
}

/// spec: SPN-36 (spine §8.6 step 2.5: a step's outcome is `completed`, `max-tokens` or
/// "continue") — `max-tokens` is sticky for the turn's *reason* only: a later step of the same
/// turn whose tool calls ran still continues, so the model sees their results in a follow-up
/// request, and the turn then ends `max-tokens`. (Before the fix the sticky reason was taken for
/// the later step's outcome: the turn ended right after the tools ran, their results never
/// answered by the model.)
#[tokio::test(start_paused = true)]
async fn a_tool_step_after_a_max_tokens_step_still_continues() {
    let model = ScriptedModel::new([
        chunks::max_tokens_text("cut"),
        chunks::tool_call("c1", "look", json!({})),
        chunks::text("seen"),
    ]);
    let rt = runtime(&model);
    let hook = rt.services().turn_stopping.add(
        None,
        Arc::new(SteerOnStop {
            text: "continue",
            left: AtomicUsize::new(1),
        }),
    );
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool(
                "look",
                |_args, _ctx| async move { Ok(ToolOutput::text("looked")) },
            ),
        )
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(count(&*agent, "tool/result"), 1);
    assert_eq!(count(&*agent, "step/start"), 3);
    assert_eq!(model.requests().len(), 3);
    assert_eq!(turn_ends(&*agent), [TurnEndReason::MaxTokens]);
    drop(guard);
    drop(hook);
    finish(&rt, [handle]).await;
}

/// spec: SPN-37 — tool calls of a max-tokens-truncated step are not dispatched; empty
/// completions still record an assistant message.
#[tokio::test(start_paused = true)]
async fn spn_37_truncated_calls_are_not_dispatched_and_empty_completions_are_recorded() {
    let model = ScriptedModel::new([
        chunks::max_tokens_tool_call("c1", "danger", "{\"pa"),
        chunks::empty(),
    ]);
    let rt = runtime(&model);
    let ran = Arc::new(AtomicUsize::new(0));
    let r = ran.clone();
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool("danger", move |_a, _c| {
                r.fetch_add(1, Ordering::SeqCst);
                async { Ok(ToolOutput::text("ran")) }
            }),
        )
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    agent.followup(user("empty please")).unwrap();
    agent.when_idle().await;
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(count(&*agent, "tool/call"), 0);
    let messages: Vec<_> = agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::AssistantMessage { message, usage, .. } => {
                Some((message.content.clone(), usage.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(messages.len(), 2);
    assert!(
        messages
            .iter()
            .all(|(content, usage)| content.is_empty() && usage.is_some())
    );
    assert_eq!(
        turn_ends(&*agent),
        [TurnEndReason::MaxTokens, TurnEndReason::Completed]
    );
    drop(guard);
    finish(&rt, [handle]).await;
}

/// spec: SPN-38 — an adapter throw becomes a structured turn error (`UNKNOWN`, message
/// preserved) and exactly one `agent/error`.
#[tokio::test(start_paused = true)]
async fn spn_38_adapter_throw_becomes_structured_turn_error() {
    let model = ScriptedModel::default(); // exhausted: the call throws
    let rt = runtime(&model);
    let (seen, guard) = record_events(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    let expected = LlmFailure::unknown("script exhausted");
    assert_eq!(
        turn_ends(&*agent),
        [TurnEndReason::Error {
            error: expected.clone()
        }]
    );
    let errors: Vec<LlmFailure> = seen
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Error { failure, .. } => Some(failure.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(errors, [expected]);
    assert_eq!(count(&*agent, "assistant/message"), 0);
    drop(guard);
    finish(&rt, [handle]).await;
}

/// spec: SPN-39 — this runtime has no maintenance tasks (a left-out reference feature); the
/// same latch governs its one non-turn window, the abort-to-idle convergence: a latched wake
/// replays at convergence, `cancel` drops it, and removing its message suppresses the replay.
#[tokio::test(start_paused = true)]
async fn spn_39_latched_wakes_replay_cancel_drops_remove_suppresses() {
    let model = ScriptedModel::new([
        ScriptEntry::hang(),
        chunks::text("replayed").into(),
        ScriptEntry::hang(),
        ScriptEntry::hang(),
    ]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    // Replay at convergence.
    agent.followup(user("one")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, keep());
    agent.followup(user("latched")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["one", "latched"]);
    // Cancel drops the latch with the inbox.
    agent.followup(user("two")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, keep());
    agent.followup(user("dropped")).unwrap();
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["one", "latched", "two"]);
    // Removing the latched message suppresses the replay.
    agent.followup(user("three")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, keep());
    let removed = user("removed");
    agent.followup(removed.clone()).unwrap();
    agent.remove_pending(&removed.id).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["one", "latched", "two", "three"]);
    assert_eq!(count(&*agent, "turn/start"), 4);
    finish(&rt, [handle]).await;
}

/// spec: SPN-40 — `maxTokens` from agent options seeds the first model request (and invalid
/// values reject creation before publication).
#[tokio::test(start_paused = true)]
async fn spn_40_max_tokens_seeds_the_first_request() {
    let model = ScriptedModel::new([chunks::text("bounded")]);
    let rt = runtime(&model);
    let mut options = CreateAgentOptions::new("a".into());
    options.agent_options = AgentOptions {
        max_tokens: Some(256),
        ..mock_options()
    };
    let handle = rt.create(options).await.unwrap();
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(model.requests()[0].max_tokens, Some(256));
    let header = agent
        .session()
        .events()
        .iter()
        .find_map(|e| match &e.data {
            EventData::RequestHeader { header, reason } => Some((header.clone(), *reason)),
            _ => None,
        })
        .unwrap();
    assert_eq!(header.0.config.max_tokens, Some(256));
    assert_eq!(header.1, RequestHeaderReason::Initial);
    let mut bad = CreateAgentOptions::new("bad".into());
    bad.agent_options = AgentOptions {
        max_tokens: Some(0),
        ..mock_options()
    };
    assert!(matches!(rt.create(bad).await, Err(AgentError::InvalidOptions(_))));
    assert!(AgentRuntime::get(&rt, &"bad".into()).is_none());
    assert!(agent::SessionStore::get(rt.sessions(), &"bad".into()).is_none());
    finish(&rt, [handle]).await;
}

/// spec: SPN-41 — pre-step `reject` closes the claimed turn as `blocked` with no step, no user
/// message, no model call.
#[tokio::test(start_paused = true)]
async fn spn_41_reject_blocks_the_turn() {
    let model = ScriptedModel::new([chunks::text("never")]);
    let rt = runtime(&model);
    let hook = rt.services().pre_step.add(
        None,
        Arc::new(PreStepFn(|_: &PreStep<'_>, _| Ok(PreStepDecision::Reject))),
    );
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("blocked prompt")).unwrap();
    agent.when_idle().await;
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Blocked]);
    assert_eq!(count(&*agent, "step/start"), 0);
    assert!(user_texts(&*agent).is_empty());
    assert!(model.requests().is_empty());
    let work = agent::fold_consumed_work(agent.session().events().iter());
    assert_eq!(work.end_reason(), Some(&TurnEndReason::Blocked));
    drop(hook);
    finish(&rt, [handle]).await;
}

/// spec: SPN-42 — a blocked prompt leaves adjacent queued prompts pending until another wake.
#[tokio::test(start_paused = true)]
async fn spn_42_blocked_prompt_leaves_queue_pending() {
    let model = ScriptedModel::new([chunks::text("B reply"), chunks::text("C reply")]);
    let rt = runtime(&model);
    let first = Arc::new(AtomicUsize::new(0));
    let f = first.clone();
    let hook = rt.services().pre_step.add(
        None,
        Arc::new(PreStepFn(move |_: &PreStep<'_>, proposed| {
            Ok(if f.fetch_add(1, Ordering::SeqCst) == 0 {
                PreStepDecision::Reject
            } else {
                proposed
            })
        })),
    );
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("A")).unwrap();
    agent.followup(user("B")).unwrap();
    agent.when_idle().await;
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Blocked]);
    assert_eq!(
        agent
            .inbox()
            .next_turn
            .iter()
            .map(Message::text)
            .collect::<Vec<_>>(),
        ["B"]
    );
    assert!(model.requests().is_empty());
    agent.followup(user("C")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["B", "C"]);
    assert_eq!(
        turn_ends(&*agent),
        [
            TurnEndReason::Blocked,
            TurnEndReason::Completed,
            TurnEndReason::Completed
        ]
    );
    drop(hook);
    finish(&rt, [handle]).await;
}

/// spec: SPN-43 — an empty entered batch closes a no-step `completed` turn.
#[tokio::test(start_paused = true)]
async fn spn_43_empty_enter_closes_a_no_step_turn() {
    let model = ScriptedModel::new([chunks::text("never")]);
    let rt = runtime(&model);
    let hook = rt.services().pre_step.add(
        None,
        Arc::new(PreStepFn(|_: &PreStep<'_>, _| {
            Ok(PreStepDecision::Enter(Vec::new()))
        })),
    );
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("rewritten away")).unwrap();
    agent.when_idle().await;
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    assert_eq!(count(&*agent, "step/start"), 0);
    assert!(model.requests().is_empty());
    let work = agent::fold_consumed_work(agent.session().events().iter());
    assert_eq!(work.end, None, "an emptied claim is not accounting work");
    drop(hook);
    finish(&rt, [handle]).await;
}

/// spec: SPN-44 — a forked (seeded) agent continues turn numbering after the seed, and never
/// inherits the seed's pending inbox work.
#[tokio::test(start_paused = true)]
async fn spn_44_seeded_agent_continues_turn_numbers() {
    let model = ScriptedModel::new([
        chunks::text("turn one"),
        chunks::text("turn two"),
        chunks::text("fork turn"),
    ]);
    let rt = runtime(&model);
    let parent = create(&rt, "parent").await;
    // "second" is queued while turn 1 runs: the balanced prefix through turn 1 holds its
    // pending insertion.
    parent.agent().followup(user("first")).unwrap();
    parent.agent().followup(user("second")).unwrap();
    parent.agent().when_idle().await;
    let events: Vec<_> = parent
        .agent()
        .session()
        .events()
        .iter()
        .map(|e| (**e).clone())
        .collect();
    let second_turn = events
        .iter()
        .position(|e| matches!(e.data, EventData::TurnStart { turn: 2 }))
        .unwrap();
    let seed = agent::balanced_completed_turn_prefix(&events[..second_turn]).to_vec();
    assert!(seed.iter().any(
        |e| matches!(&e.data, EventData::InboxSpliced(s) if s.inserted.iter().any(|m| m.text() == "second"))
    ));
    let mut options = CreateAgentOptions::new("fork".into());
    options.agent_options = mock_options();
    options.meta = SessionMeta {
        seed_length: Some(seed.len() as u64),
        ..SessionMeta::default()
    };
    options.seed = Some(seed.clone());
    let fork = rt.create(options).await.unwrap();
    let agent = fork.agent().clone();
    assert!(agent.inbox().is_empty(), "seeded splices are not replayed");
    assert_eq!(agent.session().first_live_seq(), seed.len() as u64);
    agent.followup(user("continue")).unwrap();
    agent.when_idle().await;
    let turns: Vec<u64> = agent.session().events()[seed.len()..]
        .iter()
        .filter_map(|e| match e.data {
            EventData::TurnStart { turn } => Some(turn),
            _ => None,
        })
        .collect();
    assert_eq!(turns, [2]);
    assert_eq!(user_texts(&*agent), ["first", "continue"]);
    finish(&rt, [fork, parent]).await;
}

/// spec: SPN-44 — a seeded (or resumed) log whose turn numbers reach the end of the range (a
/// hostile or corrupt log) does not make a wake panic or reuse a number: a turn whose number
/// would pass the safe-integer range is not opened, an `agent/error` says why, the message
/// stays pending, and the agent stays idle and disposable. (Before the fix the next turn was
/// logged as `turn/start` with the seed's own number again — `u64::MAX` saturated — and the
/// one after overflowed `last_turn + 1`, a panic in the caller's `followup`.) The runtime has no online
/// invariant checker: it would veto every append to a session whose numbering starts there.
#[tokio::test(start_paused = true)]
async fn exhausted_turn_numbering_refuses_the_turn_without_panicking() {
    let model = ScriptedModel::new([chunks::text("never")]);
    let rt = crate::runtime::Runtime::builder()
        .model(MOCK, model.adapter())
        .build();
    let (seen, recorder) = record_events(&rt);
    let event = |seq: u64, data: EventData| agent::SessionEvent {
        seq,
        time: 0,
        data,
        surface: None,
        ignorable: false,
    };
    let last = u64::MAX;
    let seed = vec![
        event(0, EventData::TurnStart { turn: last }),
        event(
            1,
            EventData::TurnEnd {
                turn: last,
                reason: TurnEndReason::Completed,
            },
        ),
    ];
    let mut options = CreateAgentOptions::new("a".into());
    options.agent_options = mock_options();
    options.seed = Some(seed.clone());
    let handle = rt.create(options).await.unwrap();
    let agent = handle.agent().clone();
    let before = agent.session().events().len();
    agent.followup(user("one more")).unwrap();
    agent.when_idle().await;
    agent.followup(user("and another")).unwrap();
    agent.when_idle().await;
    drop(recorder);
    assert_eq!(count(&*agent, "turn/start"), 1, "no turn opened after the seed");
    assert_eq!(
        agent.session().events().len(),
        before + 2,
        "only the insert splices"
    );
    assert_eq!(agent.inbox().next_turn.len(), 2, "the messages stay pending");
    assert!(model.requests().is_empty());
    assert_eq!(agent.status(), AgentStatus::Idle);
    let errors: Vec<LlmFailure> = seen
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Error { failure, .. } => Some(failure.clone()),
            _ => None,
        })
        .collect();
    assert!(
        errors.len() == 2 && errors.iter().all(|f| f.message.contains("turn number")),
        "{errors:?}"
    );
    finish(&rt, [handle]).await;
    // The seed is this test's hostile input, not a log a loop wrote (S3 would flag it).
    crate::trace::discard_capture("a");
}

/// spec: SPN-45 — an in-band `finish {error}` becomes a turn error with the failure verbatim;
/// `finish {aborted}` without a cancelled signal becomes a turn error coded `ABORTED`.
#[tokio::test(start_paused = true)]
async fn spn_45_in_band_finish_failures_become_turn_errors() {
    let failure = LlmFailure {
        message: "provider 401".into(),
        code: "AUTH".into(),
        status: Some(401),
        provider_retry_after_ms: Some(2000),
        request_id: Some("req-1".into()),
    };
    let aborted_failure = LlmFailure::new("ABORTED", "model stream aborted");
    let model = ScriptedModel::new([
        chunks::error(failure.clone()),
        chunks::aborted(aborted_failure.clone()),
        chunks::aborted(LlmFailure::new("STREAM_CUT", "stream cut")),
    ]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("one")).unwrap();
    agent.when_idle().await;
    agent.followup(user("two")).unwrap();
    agent.when_idle().await;
    agent.followup(user("three")).unwrap();
    agent.when_idle().await;
    assert_eq!(
        turn_ends(&*agent),
        [
            TurnEndReason::Error { error: failure },
            TurnEndReason::Error {
                error: aborted_failure
            },
            TurnEndReason::Error {
                error: LlmFailure::new("ABORTED", "stream cut")
            }
        ]
    );
    assert_eq!(count(&*agent, "assistant/message"), 0);
    finish(&rt, [handle]).await;
}

/// spec: SPN-38 (spine §8.6 step 4: after the turn, pending work starts the next turn) — a
/// follow-up queued while the running turn fails with a model error runs as the next turn of
/// the same drain. It was sent to a running, uncancelled driver, so it carried no wake of its
/// own (§8.3 rule 1); only a blocked turn (§8.6 2.2) or an aborted one (SPN-15) leaves queued
/// work parked. (Before the fix the error turn ended the drain and the follow-up stayed
/// pending with no wake.)
#[tokio::test(start_paused = true)]
async fn queued_followup_runs_after_an_error_turn() {
    let failure = LlmFailure::new("OVERLOADED", "provider overloaded");
    let model = ScriptedModel::new([chunks::error(failure.clone()), chunks::text("second reply")]);
    let rt = runtime(&model);
    let (seen, recorder) = record_events(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("one")).unwrap();
    agent.followup(user("two")).unwrap();
    agent.when_idle().await;
    drop(recorder);
    assert_eq!(
        turn_ends(&*agent),
        [TurnEndReason::Error { error: failure }, TurnEndReason::Completed]
    );
    assert_eq!(user_texts(&*agent), ["one", "two"]);
    assert_eq!(model.requests().len(), 2);
    assert!(agent.inbox().is_empty());
    let statuses: Vec<AgentStatus> = seen
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Status { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(statuses, [AgentStatus::Running, AgentStatus::Idle], "one drain");
    finish(&rt, [handle]).await;
}

/// spec: SPN-46 — a model-less agent fails its step with a clear provider/model error.
#[tokio::test(start_paused = true)]
async fn spn_46_model_less_agent_fails_clearly() {
    let model = ScriptedModel::new([chunks::text("never")]);
    let rt = runtime(&model);
    let handle = rt.create(CreateAgentOptions::new("a".into())).await.unwrap();
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    let ends = turn_ends(&*agent);
    let [TurnEndReason::Error { error }] = &ends[..] else {
        panic!("expected one error turn, got {ends:?}")
    };
    assert!(
        error.message.contains("has no provider/model"),
        "{}",
        error.message
    );
    assert!(error.message.contains("AgentOptions.provider"));
    assert!(error.message.contains("AgentOptions.model"));
    assert_eq!(error.code, "UNKNOWN");
    assert!(model.requests().is_empty());
    finish(&rt, [handle]).await;
}

/// spec: SPN-47 — disposal during a running turn ends it `aborted {disposed}`, balanced,
/// without an error.
#[tokio::test(start_paused = true)]
async fn spn_47_disposal_during_a_turn_aborts_it_balanced() {
    let model = ScriptedModel::new([ScriptEntry::hang()]);
    let rt = runtime(&model);
    let (seen, guard) = record_events(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    settle().await;
    handle.dispose().await;
    assert_eq!(turn_ends(&*agent), [aborted(CancelCause::Disposed)]);
    assert_eq!(count(&*agent, "step/start"), count(&*agent, "step/end"));
    assert!(!seen.lock().iter().any(|e| matches!(e, AgentEvent::Error { .. })));
    assert!(agent::prefix::is_balanced(agent.session().events().iter()));
    drop(guard);
    finish(&rt, []).await;
}

/// spec: SPN-48 — cancel or disposal during pre-step closes a no-step turn and never calls the
/// model.
#[tokio::test(start_paused = true)]
async fn spn_48_cancel_or_disposal_during_pre_step_closes_a_no_step_turn() {
    for dispose in [false, true] {
        let model = ScriptedModel::new([chunks::text("never")]);
        let rt = runtime(&model);
        let entered = Arc::new(AtomicUsize::new(0));
        let hook = rt
            .services()
            .pre_step
            .add(None, Arc::new(BlockUntilCancelled(entered.clone())));
        let handle = create(&rt, "a").await;
        let agent = handle.agent().clone();
        agent.followup(user("go")).unwrap();
        settle().await;
        assert_eq!(entered.load(Ordering::SeqCst), 1);
        if dispose {
            handle.dispose().await;
        } else {
            agent.cancel(CancelCause::User, CancelOptions::default());
            agent.when_idle().await;
        }
        let cause = if dispose {
            CancelCause::Disposed
        } else {
            CancelCause::User
        };
        assert_eq!(turn_ends(&*agent), [aborted(cause)]);
        assert_eq!(count(&*agent, "step/start"), 0);
        assert!(model.requests().is_empty());
        drop(hook);
        if dispose {
            finish(&rt, []).await;
        } else {
            finish(&rt, [handle]).await;
        }
    }
}

/// Runtime-context snapshots are entered once per change, after the claimed prompt, with the
/// prompt plugin source and snapshot form; the system text renders the persona strictly.
#[tokio::test(start_paused = true)]
async fn runtime_context_snapshot_and_persona_rendering() {
    use agent::prompt::{PROMPT_PLUGIN, Prompt, RuntimeContext};
    let model = ScriptedModel::new([chunks::text("1"), chunks::text("2"), chunks::text("3")]);
    let rt = builder(&model)
        .persona("You run on {{model}} via {{provider}}.")
        .build();
    let mode = Arc::new(Mutex::new("read-only".to_owned()));
    let m = mode.clone();
    let ctx_guard = rt.prompt().runtime_context(
        None,
        RuntimeContext {
            name: "policy".into(),
            order: 110,
            render: Arc::new(move |_| Some(format!("Mode: {}.", m.lock()))),
        },
    );
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    for text in ["first", "unchanged"] {
        agent.followup(user(text)).unwrap();
        agent.when_idle().await;
    }
    *mode.lock() = "danger".into();
    agent.followup(user("changed")).unwrap();
    agent.when_idle().await;
    let snapshots: Vec<Message> = agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) if crate::prompt::is_snapshot_message(m) => Some(m.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(snapshots.len(), 2);
    assert!(snapshots[0].text().ends_with("Mode: read-only."));
    assert!(snapshots[1].text().ends_with("Mode: danger."));
    assert!(matches!(
        &snapshots[0].source,
        agent::MessageSource::Plugin { plugin, form: Some(agent::PluginForm::Snapshot { sections }) }
            if plugin == PROMPT_PLUGIN && sections.len() == 1 && sections[0].name == "policy"
    ));
    // The snapshot is the last entered message of its step.
    assert_eq!(
        model.requests()[0].messages.last().map(Message::text).unwrap(),
        snapshots[0].text()
    );
    assert_eq!(
        model.requests()[0].system.as_deref(),
        Some("You run on mock via mock.")
    );
    assert!(model.requests()[0].tools.is_none());
    assert!(
        model
            .requests()
            .iter()
            .all(|r| r.loop_built && r.session_id.as_ref() == Some(agent.id()))
    );
    assert_eq!(count(&*agent, "request/header"), 1);
    assert_eq!(count(&*agent, "request/context"), 1);
    drop(ctx_guard);
    finish(&rt, [handle]).await;
}

/// A strict-variable render failure fails one turn (no request) and the loop keeps serving.
#[tokio::test(start_paused = true)]
async fn persona_render_failure_is_a_turn_error() {
    let model = ScriptedModel::new([chunks::text("ok")]);
    let rt = builder(&model).persona("In {{cwd}}.").build();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("hi")).unwrap();
    agent.when_idle().await;
    assert!(model.requests().is_empty());
    let ends = turn_ends(&*agent);
    let [TurnEndReason::Error { error }] = &ends[..] else {
        panic!("{ends:?}")
    };
    assert_eq!(
        error.message,
        "prompt variable \"{{cwd}}\" has no value for this assembly (section \"deployment:persona\")"
    );
    finish(&rt, [handle]).await;

    let model = ScriptedModel::new([chunks::text("ok")]);
    let rt = builder(&model).persona("In {{cwd}}.").build();
    let mut options = CreateAgentOptions::new("b".into());
    options.agent_options = mock_options();
    options.meta.cwd = Some("/work/space".into());
    let handle = rt.create(options).await.unwrap();
    handle.agent().followup(user("hi")).unwrap();
    handle.agent().when_idle().await;
    assert_eq!(model.requests()[0].system.as_deref(), Some("In /work/space."));
    finish(&rt, [handle]).await;
}

/// Tool round trip: `tool/call` then `tool/result` in the same step, the result in the next
/// request.
#[tokio::test(start_paused = true)]
async fn tool_round_trip() {
    let model = ScriptedModel::new([
        chunks::tool_call("c1", "echo", json!({"x": 1})),
        chunks::text("done"),
    ]);
    let rt = runtime(&model);
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool("echo", |args, _ctx| async move {
                Ok(ToolOutput::text(args.to_string()))
            }),
        )
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(
        types(&*agent)
            .into_iter()
            .filter(|t| !t.starts_with("agent/") && t != "assistant/chunk")
            .collect::<Vec<_>>(),
        [
            "turn/start",
            "step/start",
            "user/message",
            "request/header",
            "request/context",
            "assistant/message",
            "tool/call",
            "tool/result",
            "step/end",
            "step/start",
            "assistant/message",
            "step/end",
            "turn/end"
        ]
    );
    let second = &model.requests()[1];
    assert!(second.messages.iter().any(|m| matches!(
        m.content.as_slice(),
        [ContentBlock::ToolResult { tool_call_id, is_error: Some(false), .. }] if tool_call_id.as_str() == "c1"
    )));
    assert_eq!(second.tools.as_ref().map(|t| t.len()), Some(1));
    assert_eq!(texts(&second.messages[1].content), Vec::<String>::new());
    drop(guard);
    finish(&rt, [handle]).await;
}

/// Idle `inject()` durably stages context without opening a turn; inbox notifications name
/// exactly the inserted, claimed and discarded messages.
#[tokio::test(start_paused = true)]
async fn inject_stages_context_and_inbox_notifications_are_exact() {
    let model = ScriptedModel::new([chunks::text("ok")]);
    let rt = runtime(&model);
    let (seen, guard) = record_events(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let context = user("context");
    agent.inject(context.clone()).unwrap();
    settle().await;
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert_eq!(types(&*agent), ["agent/inbox/spliced"]);
    let prompt = user("prompt");
    agent.followup(prompt.clone()).unwrap();
    agent.when_idle().await;
    let dropped = user("dropped");
    agent.inject(dropped.clone()).unwrap();
    agent.cancel(CancelCause::User, CancelOptions::default());
    drop(guard);
    let inbox: Vec<String> = seen
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::InboxInserted { message, .. } => Some(format!("inserted:{message}")),
            AgentEvent::InboxClaimed { message, turn, .. } => Some(format!("claimed:{message}@{turn}")),
            AgentEvent::InboxDiscarded { messages, .. } => Some(format!("discarded:{messages:?}")),
            _ => None,
        })
        .collect();
    assert_eq!(
        inbox,
        [
            format!("inserted:{}", context.id),
            format!("inserted:{}", prompt.id),
            format!("claimed:{}@1", context.id),
            format!("claimed:{}@1", prompt.id),
            format!("inserted:{}", dropped.id),
            format!("discarded:{:?}", vec![dropped.id.clone()]),
        ]
    );
    // The claimed steer entered before the prompt, both in the first step.
    assert_eq!(user_texts(&*agent), ["context", "prompt"]);
    finish(&rt, [handle]).await;
}

/// The loop also runs on a multi-threaded runtime: concurrent agents drain their turns and
/// dispose cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_agents_on_a_multi_threaded_runtime() {
    let model = ScriptedModel::new((0..16).map(|i| chunks::text(format!("reply {i}"))));
    let rt = runtime(&model);
    let mut handles = Vec::new();
    for i in 0..4 {
        handles.push(create(&rt, &format!("a{i}")).await);
    }
    let runs = handles.iter().map(|h| {
        let agent = h.agent().clone();
        async move {
            for j in 0..4 {
                agent.followup(user(&format!("go {j}"))).unwrap();
                agent.when_idle().await;
            }
            agent
        }
    });
    let agents = futures::future::join_all(runs).await;
    for agent in &agents {
        assert_eq!(turn_ends(&**agent).len(), 4);
        assert!(turn_ends(&**agent).iter().all(|r| *r == TurnEndReason::Completed));
    }
    assert_eq!(model.requests().len(), 16);
    finish(&rt, handles).await;
}

/// A model response naming the same call id twice (a misbehaving server or adapter) runs both
/// calls, each answered by exactly one `tool/result` in the same step under a distinct id (the
/// repeat re-keyed `c1_2`, also in the logged assistant message and the next request), and the
/// log satisfies the session invariants (`inprocess-providers.md` §6.4 S11/S12).
#[tokio::test(start_paused = true)]
async fn duplicate_call_ids_in_one_step_keep_the_log_valid() {
    let model = ScriptedModel::new([
        chunks::tool_calls(
            None,
            vec![
                chunks::call("c1", "echo", json!({"x": 1})),
                chunks::call("c1", "echo", json!({"x": 2})),
            ],
        ),
        chunks::text("done"),
    ]);
    let rt = runtime(&model);
    let (runs, guard) = counting_echo(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    let events = agent.session().events();
    let calls: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolCall {
                call_id, arguments, ..
            } => Some((call_id.to_string(), arguments.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("c1".to_owned(), json!({"x": 1}).to_string()),
            ("c1_2".to_owned(), json!({"x": 2}).to_string())
        ]
    );
    let results: Vec<(u64, String, String)> = events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult { step, message, .. } => match message.content.as_slice() {
                [
                    ContentBlock::ToolResult {
                        tool_call_id,
                        content,
                        ..
                    },
                ] => Some((*step, tool_call_id.to_string(), texts(content).concat())),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        [
            (1, "c1".to_owned(), json!({"x": 1}).to_string()),
            (1, "c1_2".to_owned(), json!({"x": 2}).to_string())
        ]
    );
    let second = &model.requests()[1];
    let ids: Vec<String> = second
        .messages
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            ContentBlock::ToolCall { id, .. } => Some(id.to_string()),
            ContentBlock::ToolResult { tool_call_id, .. } => Some(format!("result:{tool_call_id}")),
            _ => None,
        })
        .collect();
    assert_eq!(ids, ["c1", "c1_2", "result:c1", "result:c1_2"]);
    drop(guard);
    finish(&rt, [handle]).await;
}

/// spec: §13.2 — chunks that address a block its `block-end` already closed (a repeated
/// `block-end`, a late delta; a misbehaving adapter) are stragglers: the first close wins and
/// the block is assembled once. A repeated `block-end` of a tool call therefore runs the call
/// once (it was re-keyed and run a second time), and a late text delta neither adds a block
/// nor changes the closed one. A `block-start` may still reuse a closed index (§13.2: indexes
/// are unique while open).
#[tokio::test(start_paused = true)]
async fn stragglers_after_block_end_are_ignored_and_run_no_second_call() {
    let call = ContentBlock::ToolCall {
        id: "c1".into(),
        name: "echo".into(),
        arguments: json!({"x": 1}).to_string(),
    };
    let stream = vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: agent::model::BlockType::Text,
        },
        StreamChunk::TextDelta {
            index: 0,
            text: "reading".into(),
        },
        StreamChunk::BlockEnd {
            index: 0,
            block: ContentBlock::text("reading"),
        },
        // A late delta for the closed text block.
        StreamChunk::TextDelta {
            index: 0,
            text: " more".into(),
        },
        StreamChunk::BlockStart {
            index: 1,
            block_type: agent::model::BlockType::ToolCall,
        },
        StreamChunk::ToolCallDelta {
            index: 1,
            id: "c1".into(),
            name: Some("echo".into()),
            arguments_delta: json!({"x": 1}).to_string(),
        },
        StreamChunk::BlockEnd {
            index: 1,
            block: call.clone(),
        },
        // The same close, repeated.
        StreamChunk::BlockEnd {
            index: 1,
            block: call.clone(),
        },
        // Index 0 reused by a new block: allowed once its block closed.
        StreamChunk::BlockStart {
            index: 0,
            block_type: agent::model::BlockType::Text,
        },
        StreamChunk::TextDelta {
            index: 0,
            text: "then".into(),
        },
        StreamChunk::BlockEnd {
            index: 0,
            block: ContentBlock::text("then"),
        },
        chunks::finish_chunk(FinishReason::ToolCalls),
    ];
    let model = ScriptedModel::new([stream, chunks::text("done")]);
    let rt = runtime(&model);
    let (runs, guard) = counting_echo(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the repeated close ran the call again"
    );
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    let first = agent
        .session()
        .events()
        .iter()
        .find_map(|e| match &e.data {
            EventData::AssistantMessage { message, .. } => Some(message.content.clone()),
            _ => None,
        })
        .expect("the first step's assistant message");
    assert_eq!(
        first,
        [ContentBlock::text("reading"), call, ContentBlock::text("then")]
    );
    assert_eq!(count(&*agent, "tool/call"), 1);
    assert_eq!(count(&*agent, "tool/result"), 1);
    drop(guard);
    finish(&rt, [handle]).await;
}

/// A tool whose output is not lossless JSON (a negative zero in its metadata) resolves as a
/// `FAILED` error result in place; the other calls of the step keep their results and the turn
/// continues (spec §11.1: outputs must be lossless JSON; §11.5 step 5: any failure is normalised
/// into an error result). Arguments that are not lossless JSON are refused the same way before
/// the body runs (§11.5: "snapshot the arguments as immutable lossless JSON (failure → error
/// result)").
#[tokio::test(start_paused = true)]
async fn non_lossless_tool_output_or_arguments_become_error_results() {
    let model = ScriptedModel::new([
        chunks::tool_calls(
            None,
            vec![
                chunks::call("c1", "lossy", json!({})),
                chunks::call("c2", "echo", "{\"x\": -0.0}"),
                chunks::call("c3", "echo", json!({"x": 1})),
            ],
        ),
        chunks::text("done"),
    ]);
    let rt = runtime(&model);
    let echoed = Arc::new(Mutex::new(Vec::new()));
    let guards = [
        rt.services()
            .tools
            .register(
                None,
                tool("lossy", |_args, _ctx| async move {
                    Ok(ToolOutput {
                        meta: Some(json!({"offset": -0.0})),
                        ..ToolOutput::text("ok")
                    })
                }),
            )
            .unwrap(),
        {
            let echoed = echoed.clone();
            rt.services()
                .tools
                .register(
                    None,
                    tool("echo", move |args, _ctx| {
                        echoed.lock().push(args.to_string());
                        async move { Ok(ToolOutput::text(args.to_string())) }
                    }),
                )
                .unwrap()
        },
    ];
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    assert_eq!(*echoed.lock(), [json!({"x": 1}).to_string()]);
    let results: Vec<(String, Option<String>, String)> = agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult { message, error, .. } => match message.content.as_slice() {
                [
                    ContentBlock::ToolResult {
                        tool_call_id,
                        content,
                        ..
                    },
                ] => Some((
                    tool_call_id.to_string(),
                    error.as_ref().map(|e| e.code.clone()),
                    texts(content).concat(),
                )),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 3, "{results:#?}");
    assert_eq!(results[0].0, "c1");
    assert_eq!(results[0].1.as_deref(), Some("FAILED"));
    assert!(
        results[0]
            .2
            .starts_with("Error: tool \"lossy\" returned output that is not lossless JSON"),
        "{results:#?}"
    );
    assert_eq!(results[1].0, "c2");
    assert_eq!(results[1].1.as_deref(), Some("INVALID_ARGS"));
    assert!(
        results[1]
            .2
            .starts_with("Error: tool call arguments are not lossless JSON"),
        "{results:#?}"
    );
    assert_eq!(results[2], ("c3".to_owned(), None, json!({"x": 1}).to_string()));
    drop(guards);
    finish(&rt, [handle]).await;
}

/// A tool that deferred a context message and was then cancelled with its turn leaves nothing
/// behind: the cancelled call's deferred context never enters the inbox, so the next,
/// unrelated turn does not receive it (spec §8.5: cancellation clears the inbox; §11.5: deferred
/// contexts belong to the execution's committed outcome).
#[tokio::test(start_paused = true)]
async fn a_cancelled_calls_deferred_context_does_not_leak_into_the_next_turn() {
    let model = ScriptedModel::new([chunks::tool_call("c1", "slow", json!({})), chunks::text("second")]);
    let rt = runtime(&model);
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool("slow", |_args, ctx| async move {
                ctx.defer_context(Message::user_text("deferred by the cancelled call"));
                std::future::pending::<()>().await;
                Ok(ToolOutput::text("never"))
            }),
        )
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("first")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    assert_eq!(turn_ends(&*agent), [aborted(CancelCause::User)]);
    agent.followup(user("next")).unwrap();
    agent.when_idle().await;
    let second = &model.requests()[1];
    assert!(
        second
            .messages
            .iter()
            .all(|m| m.text() != "deferred by the cancelled call"),
        "{:#?}",
        second.messages
    );
    assert!(
        user_texts(&*agent)
            .iter()
            .all(|t| t != "deferred by the cancelled call"),
        "{:?}",
        user_texts(&*agent)
    );
    drop(guard);
    finish(&rt, [handle]).await;
}

/// A deferred context that is not lossless JSON (a negative zero in a block) fails its call in
/// place (`FAILED`, the context discarded) instead of failing the inbox append after the step's
/// results and ending the turn with an error (spec §11.1, §11.5 step 5).
#[tokio::test(start_paused = true)]
async fn a_non_lossless_deferred_context_fails_its_call_not_the_turn() {
    let model = ScriptedModel::new([chunks::tool_call("c1", "ctx", json!({})), chunks::text("done")]);
    let rt = runtime(&model);
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool("ctx", |_args, ctx| async move {
                let mut block = serde_json::Map::new();
                block.insert("type".into(), json!("x-custom"));
                block.insert("weight".into(), json!(-0.0));
                ctx.defer_context(Message::user(
                    vec![ContentBlock::Other(block)],
                    agent::MessageSource::User,
                ));
                Ok(ToolOutput::text("ok"))
            }),
        )
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    let errors: Vec<Option<String>> = agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult { error, .. } => Some(error.as_ref().map(|e| e.code.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(errors, [Some("FAILED".to_owned())]);
    drop(guard);
    finish(&rt, [handle]).await;
}

/// Tool output nested deep enough to pass a standalone lossless check but too deep to read
/// back from where the log holds it — result content 123 levels deep (inside
/// `data.message.content[0].content` of its `tool/result` line), metadata 126 levels, a deferred
/// context's block 126 levels (inside an inbox splice) — fails its own call in place (`FAILED`)
/// instead of failing the append after the step and ending the turn with an error; the turn
/// completes and the other call keeps its result.
#[tokio::test(start_paused = true)]
async fn tool_output_too_deep_for_its_log_line_fails_its_call_not_the_turn() {
    fn nested(depth: usize) -> serde_json::Value {
        (1..depth).fold(json!([]), |inner, _| json!([inner]))
    }
    fn deep_block(depth: usize) -> ContentBlock {
        let mut block = serde_json::Map::new();
        block.insert("type".into(), json!("x-deep"));
        block.insert("v".into(), nested(depth));
        ContentBlock::Other(block)
    }
    let model = ScriptedModel::new([
        chunks::tool_calls(
            None,
            vec![
                chunks::call("c1", "deep", json!({"part": "content"})),
                chunks::call("c2", "deep", json!({"part": "meta"})),
                chunks::call("c3", "deep", json!({"part": "deferred"})),
                chunks::call("c4", "deep", json!({"part": "none"})),
            ],
        ),
        chunks::text("done"),
    ]);
    let rt = runtime(&model);
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool("deep", |args, ctx| async move {
                Ok(match args["part"].as_str() {
                    // The block array is level 1 of the content, so the value nests 123 levels.
                    Some("content") => ToolOutput {
                        content: vec![deep_block(121)],
                        ..ToolOutput::text("")
                    },
                    Some("meta") => ToolOutput {
                        meta: Some(nested(126)),
                        ..ToolOutput::text("ok")
                    },
                    Some("deferred") => {
                        ctx.defer_context(Message::user(vec![deep_block(122)], agent::MessageSource::User));
                        ToolOutput::text("ok")
                    }
                    _ => ToolOutput::text("fine"),
                })
            }),
        )
        .unwrap();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    let results: Vec<(Option<String>, String)> = agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult { message, error, .. } => match message.content.as_slice() {
                [ContentBlock::ToolResult { content, .. }] => {
                    Some((error.as_ref().map(|e| e.code.clone()), texts(content).concat()))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 4, "{results:#?}");
    for (result, part) in results[..3].iter().zip(["content", "meta", "deferred context"]) {
        assert_eq!(result.0.as_deref(), Some("FAILED"), "{part}: {results:#?}");
        assert!(
            result.1.contains(&format!("not lossless JSON: {part}: "))
                && result.1.contains("nests deeper than"),
            "{part}: {results:#?}"
        );
    }
    assert_eq!(results[3], (None, "fine".to_owned()));
    drop(guard);
    finish(&rt, [handle]).await;
}

/// A call that deferred a context and *succeeded*, in a step that is then cancelled during a
/// later call, leaves nothing behind either: the turn it deferred the context for is aborted,
/// so the context must not be appended to the inbox that `cancel()` just cleared and reach the
/// next, unrelated turn (spec §8.5: cancellation clears the inbox; §11.5).
#[tokio::test(start_paused = true)]
async fn a_successful_calls_deferred_context_does_not_outlive_its_cancelled_step() {
    let model = ScriptedModel::new([
        chunks::tool_calls(
            None,
            vec![
                chunks::call("c1", "defer", json!({})),
                chunks::call("c2", "hang", json!({})),
            ],
        ),
        chunks::text("second"),
    ]);
    let rt = runtime(&model);
    let guards = [
        rt.services()
            .tools
            .register(
                None,
                tool("defer", |_args, ctx| async move {
                    ctx.defer_context(Message::user_text("deferred by the first call"));
                    Ok(ToolOutput::text("done"))
                }),
            )
            .unwrap(),
        rt.services()
            .tools
            .register(
                None,
                tool("hang", |_args, _ctx| async move {
                    std::future::pending::<()>().await;
                    Ok(ToolOutput::text("never"))
                }),
            )
            .unwrap(),
    ];
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("first")).unwrap();
    settle().await;
    assert_eq!(count(&*agent, "tool/call"), 2, "both calls were made");
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    assert_eq!(turn_ends(&*agent), [aborted(CancelCause::User)]);
    let pending = agent.inbox();
    assert!(
        pending.next_turn.is_empty() && pending.next_step.is_empty(),
        "cancel() left the inbox holding {pending:?}"
    );
    agent.followup(user("next")).unwrap();
    agent.when_idle().await;
    let second = &model.requests()[1];
    assert!(
        second
            .messages
            .iter()
            .all(|m| m.text() != "deferred by the first call"),
        "{:#?}",
        second.messages
    );
    drop(guards);
    finish(&rt, [handle]).await;
}

/// A session observer that vetoes every event `vetoed` matches (`step/end`, `turn/end`) while
/// `on` is set.
struct VetoWhileOn {
    on: std::sync::atomic::AtomicBool,
    vetoed: fn(&EventData) -> bool,
}

impl VetoWhileOn {
    /// Vetoing from the start.
    fn new(vetoed: fn(&EventData) -> bool) -> Arc<Self> {
        Arc::new(Self {
            on: std::sync::atomic::AtomicBool::new(true),
            vetoed,
        })
    }
}

impl agent::SessionObserver for VetoWhileOn {
    fn check(&self, _session: &agent::Session, candidate: &agent::SessionEvent) -> Result<(), String> {
        if self.on.load(Ordering::SeqCst) && (self.vetoed)(&candidate.data) {
            return Err(format!("{} is vetoed", candidate.data.type_name()));
        }
        Ok(())
    }
}

/// The turn markers of the log, as `(is_start, turn)`.
fn turn_markers(agent: &dyn agent::Agent) -> Vec<(bool, u64)> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match e.data {
            EventData::TurnStart { turn } => Some((true, turn)),
            EventData::TurnEnd { turn, .. } => Some((false, turn)),
            _ => None,
        })
        .collect()
}

/// spec: ISES-142, ISES-145 (spine §8.6 step 3: `turn/end` is always appended; providers §6.4
/// S2: `turn/start` requires no open turn; a vetoed append does not advance the trace) — when the session refuses a turn's `turn/end` (an
/// observer veto), the turn stays open in the log and no turn opens over it: the agent reports
/// an `agent/error` coded `TURN_END_REFUSED` and goes idle; a later wake retries the refused
/// end first and, while it is still refused, opens no turn (the work stays pending, another
/// error says why); once the end is logged, the pending work runs in balanced turns. (Before
/// the fix the next wake appended `turn/start` into the unbalanced log — vetoed by the
/// invariant checker as an S2 violation — and the open turn was never closed.)
#[tokio::test(start_paused = true)]
async fn a_refused_turn_end_keeps_further_turns_closed_until_it_is_logged() {
    let model = ScriptedModel::new([chunks::text("one"), chunks::text("two"), chunks::text("three")]);
    let veto = VetoWhileOn::new(|e| matches!(e, EventData::TurnEnd { .. }));
    let rt = builder(&model).session_observer(veto.clone()).build();
    let (seen, recorder) = record_events(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let refusals = || {
        seen.lock()
            .iter()
            .filter(|e| {
                matches!(e, AgentEvent::Error { failure, .. }
                    if failure.code == crate::agent::codes::TURN_END_REFUSED
                        && failure.message.contains("turn 1"))
            })
            .count()
    };

    agent.followup(user("one")).unwrap();
    agent.when_idle().await;
    assert_eq!(turn_markers(&*agent), [(true, 1)], "turn 1 stays open");
    assert_eq!(refusals(), 1);
    assert_eq!(agent.status(), AgentStatus::Idle);

    // Still refused: the wake opens no turn; its message stays pending.
    agent.followup(user("two")).unwrap();
    agent.when_idle().await;
    assert_eq!(turn_markers(&*agent), [(true, 1)], "no turn opened over turn 1");
    assert_eq!(refusals(), 2);
    assert_eq!(agent.inbox().next_turn.len(), 1, "the message stays pending");
    assert_eq!(model.requests().len(), 1);
    assert_eq!(agent.status(), AgentStatus::Idle);

    // Accepted again: the next wake logs turn 1's end, then runs the pending work.
    veto.on.store(false, Ordering::SeqCst);
    agent.followup(user("three")).unwrap();
    agent.when_idle().await;
    drop(recorder);
    assert_eq!(
        turn_markers(&*agent),
        [
            (true, 1),
            (false, 1),
            (true, 2),
            (false, 2),
            (true, 3),
            (false, 3)
        ]
    );
    assert_eq!(turn_ends(&*agent), vec![TurnEndReason::Completed; 3]);
    assert_eq!(user_texts(&*agent), ["one", "two", "three"]);
    assert_eq!(refusals(), 2);
    assert!(agent.inbox().is_empty());
    finish(&rt, [handle]).await;
}

/// The step and turn markers of the log, in order (`"turn/start 1"`, `"step/end 1.1"`, …).
fn step_and_turn_markers(agent: &dyn agent::Agent) -> Vec<String> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match e.data {
            EventData::TurnStart { turn } => Some(format!("turn/start {turn}")),
            EventData::TurnEnd { turn, .. } => Some(format!("turn/end {turn}")),
            EventData::StepStart { turn, step } => Some(format!("step/start {turn}.{step}")),
            EventData::StepEnd { turn, step } => Some(format!("step/end {turn}.{step}")),
            _ => None,
        })
        .collect()
}

/// spec: ISES-142, ISES-145 (spine §8.6: `step/end` and `turn/end` are always appended;
/// providers §6.4 S5: `turn/end` requires no open step, S2: `turn/start` no open turn) — when
/// the session refuses a step's `step/end` (an observer veto), the step and its turn stay open
/// in the log: no `turn/end` is appended over the open step; the agent reports an
/// `agent/error` coded `STEP_END_REFUSED` and goes idle; a later wake retries the step's end
/// first and, while it is still refused, opens no turn (the work stays pending, another error
/// says why); once it is logged, the turn's end follows (an `error` ending carrying the
/// refusal) and the pending work runs in balanced turns. The online invariant checker (checked
/// by `finish`) sees no violation. (Before the fix the driver appended `turn/end` right after
/// the refused `step/end` — an S5 violation the checker vetoed — and the log never closed the
/// step.)
#[tokio::test(start_paused = true)]
async fn a_refused_step_end_keeps_its_turn_open_until_both_ends_are_logged() {
    let model = ScriptedModel::new([chunks::text("one"), chunks::text("two"), chunks::text("three")]);
    let veto = VetoWhileOn::new(|e| matches!(e, EventData::StepEnd { .. }));
    let rt = builder(&model).session_observer(veto.clone()).build();
    let (seen, recorder) = record_events(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let refusals = || {
        seen.lock()
            .iter()
            .filter(|e| {
                matches!(e, AgentEvent::Error { failure, .. }
                    if failure.code == crate::agent::codes::STEP_END_REFUSED
                        && failure.message.contains("step 1 of turn 1"))
            })
            .count()
    };
    let errors = || {
        seen.lock()
            .iter()
            .filter(|e| matches!(e, AgentEvent::Error { .. }))
            .count()
    };

    agent.followup(user("one")).unwrap();
    agent.when_idle().await;
    assert_eq!(
        step_and_turn_markers(&*agent),
        ["turn/start 1", "step/start 1.1"],
        "step 1 and turn 1 stay open"
    );
    assert_eq!(refusals(), 1);
    assert_eq!(errors(), 1, "the refusal is the turn's one error");
    assert_eq!(agent.status(), AgentStatus::Idle);

    // Still refused: the wake opens no turn; its message stays pending.
    agent.followup(user("two")).unwrap();
    agent.when_idle().await;
    assert_eq!(
        step_and_turn_markers(&*agent),
        ["turn/start 1", "step/start 1.1"],
        "no turn opened over turn 1"
    );
    assert_eq!(refusals(), 2);
    assert_eq!(agent.inbox().next_turn.len(), 1, "the message stays pending");
    assert_eq!(model.requests().len(), 1);
    assert_eq!(agent.status(), AgentStatus::Idle);

    // Accepted again: the next wake logs step 1's end and turn 1's, then runs the pending work.
    veto.on.store(false, Ordering::SeqCst);
    agent.followup(user("three")).unwrap();
    agent.when_idle().await;
    drop(recorder);
    assert_eq!(
        step_and_turn_markers(&*agent),
        [
            "turn/start 1",
            "step/start 1.1",
            "step/end 1.1",
            "turn/end 1",
            "turn/start 2",
            "step/start 2.1",
            "step/end 2.1",
            "turn/end 2",
            "turn/start 3",
            "step/start 3.1",
            "step/end 3.1",
            "turn/end 3",
        ]
    );
    let ends = turn_ends(&*agent);
    assert!(
        matches!(&ends[0], TurnEndReason::Error { error } if error.code == crate::agent::codes::STEP_END_REFUSED),
        "{ends:?}"
    );
    assert_eq!(ends[1..], [TurnEndReason::Completed, TurnEndReason::Completed]);
    assert_eq!(user_texts(&*agent), ["one", "two", "three"]);
    assert_eq!(refusals(), 2);
    assert_eq!(errors(), 2);
    assert!(agent.inbox().is_empty());
    finish(&rt, [handle]).await;
}

/// spec: ISES-142, ISES-145 (spine §8.6: `step/end` and `turn/end` are always appended;
/// providers §6.4 S5) — a step aborted mid-stream whose `step/end` the session refuses: the
/// abort ends the turn, the refusal is reported beside it (`STEP_END_REFUSED`), and no
/// `turn/end` is appended over the open step; the next wake logs the step's end, then the
/// turn's with its `aborted` reason, before the new work runs.
#[tokio::test(start_paused = true)]
async fn an_aborted_step_whose_end_is_refused_closes_on_the_next_wake() {
    let model = ScriptedModel::new([ScriptEntry::hang(), chunks::text("next").into()]);
    let veto = VetoWhileOn::new(|e| matches!(e, EventData::StepEnd { .. }));
    let rt = builder(&model).session_observer(veto.clone()).build();
    let (seen, recorder) = record_events(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();

    agent.followup(user("hangs")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    assert_eq!(
        step_and_turn_markers(&*agent),
        ["turn/start 1", "step/start 1.1"],
        "the aborted step and its turn stay open"
    );
    let codes = || {
        seen.lock()
            .iter()
            .filter_map(|e| match e {
                AgentEvent::Error { failure, .. } => Some(failure.code.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(codes(), [crate::agent::codes::STEP_END_REFUSED]);

    veto.on.store(false, Ordering::SeqCst);
    agent.followup(user("next")).unwrap();
    agent.when_idle().await;
    drop(recorder);
    assert_eq!(
        step_and_turn_markers(&*agent),
        [
            "turn/start 1",
            "step/start 1.1",
            "step/end 1.1",
            "turn/end 1",
            "turn/start 2",
            "step/start 2.1",
            "step/end 2.1",
            "turn/end 2",
        ]
    );
    assert_eq!(
        turn_ends(&*agent),
        [aborted(CancelCause::User), TurnEndReason::Completed]
    );
    assert_eq!(codes(), [crate::agent::codes::STEP_END_REFUSED]);
    finish(&rt, [handle]).await;
}

/// Registers a global `echo` tool (returns its arguments as text) on `rt`, counting its runs.
fn counting_echo(rt: &crate::runtime::Runtime) -> (Arc<AtomicUsize>, agent::Registration) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool("echo", move |args, _ctx| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ok(ToolOutput::text(args.to_string())) }
            }),
        )
        .unwrap();
    (runs, guard)
}

/// A tool (`concurrency_safe` as given) whose body registers a discard hook that records its
/// call id into `discarded`, then succeeds.
fn discard_recording(
    name: &str,
    concurrency_safe: bool,
    discarded: &Arc<Mutex<Vec<String>>>,
) -> agent::ToolDefinition {
    let discarded = discarded.clone();
    agent::ToolDefinition {
        concurrency_safe,
        ..tool(name, move |_args, ctx| {
            let discarded = discarded.clone();
            let call_id = ctx.execution.call_id.to_string();
            ctx.on_discarded(move || discarded.lock().push(call_id));
            async move { Ok(ToolOutput::text("done")) }
        })
    }
}

/// The call id a `tool/result` answers.
fn result_call_id(data: &EventData) -> Option<String> {
    match data {
        EventData::ToolResult { message, .. } => message.content.iter().find_map(|b| match b {
            ContentBlock::ToolResult { tool_call_id, .. } => Some(tool_call_id.to_string()),
            _ => None,
        }),
        _ => None,
    }
}

/// spec: TOOL-37 (§11.5: a body's success that is not what gets recorded runs its
/// `on_discarded` hooks) — when the session log refuses a committed success's `tool/result`
/// (an observer's veto), the model never sees that success nor any later result of the step:
/// the refused success (here an exclusive call) and every success abandoned after it (a
/// parallel one) run their discard hooks, once each, while a success logged before the refusal
/// runs none. Before the fix the scheduler dropped every call's context with its hooks unrun
/// once the step was committed, so nothing a body registered to undo was ever undone (a
/// `job_output` read kept the job reported with no notice: its output was lost to the model).
#[tokio::test(start_paused = true)]
async fn a_refused_tool_result_discards_it_and_every_later_success_of_the_step() {
    let model = ScriptedModel::new([chunks::tool_calls(
        None,
        vec![
            chunks::call("c1", "par", json!({})),
            chunks::call("c2", "excl", json!({})),
            chunks::call("c3", "par", json!({})),
        ],
    )]);
    let veto = VetoWhileOn::new(|e| result_call_id(e).as_deref() == Some("c2"));
    let rt = builder(&model).session_observer(veto).build();
    let discarded = Arc::new(Mutex::new(Vec::new()));
    let tools = &rt.services().tools;
    let _guards = [
        tools
            .register(None, discard_recording("par", true, &discarded))
            .unwrap(),
        tools
            .register(None, discard_recording("excl", false, &discarded))
            .unwrap(),
    ];
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();

    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    let logged: Vec<String> = agent
        .session()
        .events()
        .iter()
        .filter_map(|e| result_call_id(&e.data))
        .collect();
    assert_eq!(logged, ["c1"], "the refusal ended the step's results");
    assert_eq!(
        *discarded.lock(),
        ["c2", "c3"],
        "the refused success and the abandoned one ran their hooks; the logged one did not"
    );
    finish(&rt, [handle]).await;
    assert_eq!(discarded.lock().len(), 2, "each hook ran once");
}
