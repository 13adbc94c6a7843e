//! Sweeps: one two-step turn (a tool call whose body yields, then a text answer) interrupted at
//! **every** scheduling point of its life, once per point, by a cancel, a steer, a follow-up and
//! the agent's disposal.
//! The model's chunks arrive one scheduling point apart ([`Trickle`]), so the points fall between
//! chunks, inside the tool call and at every boundary of the turn. Every run must end with a
//! log the online invariant checker accepts and a quiescent runtime (checked by `finish`).

use std::sync::Arc;

use agent::tools::ToolOutput;
use agent::{AgentError, AgentRuntime, ContentBlock, GenerateOptions, Message, TurnEndReason};

use super::*;
use crate::model::{ScriptEntry, ScriptedModel, Trickle, chunks};
use crate::runtime::testkit::*;

/// Whether a request already carries a tool result (the tool step is done).
fn answered(request: &GenerateOptions) -> bool {
    request
        .messages
        .iter()
        .flat_map(|m| &m.content)
        .any(|b| matches!(b, ContentBlock::ToolResult { .. }))
}

/// A model that calls `look` until a request carries its result, then answers `done`.
fn script() -> ScriptedModel {
    ScriptedModel::new((0..8).map(|_| {
        ScriptEntry::respond(|request| {
            if answered(request) {
                chunks::text("done")
            } else {
                chunks::tool_call("c1", "look", serde_json::json!({}))
            }
        })
    }))
}

/// A runtime over the trickled script with the yielding `look` tool, and agent `a` whose first
/// turn (`go`) has been delivered.
async fn started() -> (
    crate::runtime::Runtime,
    agent::AgentHandle,
    AgentRef,
    agent::Registration,
) {
    let model = script();
    let rt = builder_over(Arc::new(Trickle::new(model.adapter()))).build();
    let look = rt
        .services()
        .tools
        .register(
            None,
            tool("look", |_, _| async {
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                Ok(ToolOutput::text("looked"))
            }),
        )
        .expect("tool registered");
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).expect("delivered");
    (rt, handle, agent, look)
}

/// Runs `act` after `point` yields and returns whether the first turn had ended before it.
async fn at_point(point: usize, agent: &AgentRef, act: impl FnOnce(&AgentRef)) -> bool {
    for _ in 0..point {
        tokio::task::yield_now().await;
    }
    let ended = !turn_ends(&**agent).is_empty();
    act(agent);
    ended
}

/// Runs `run(point)` for the points 0, 1, 2, … until it reports that its interruption landed
/// after the first turn had ended (`true`); the first point must land inside the turn.
async fn until_turn_ended<F, Fut>(mut run: F)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for point in 0..500 {
        if run(point).await {
            assert!(point > 0, "the first point already found the turn ended");
            return;
        }
    }
    panic!("the turn never completed within 500 points");
}

/// The user texts of the log, each with whether an assistant message with text followed it
/// before the next user text.
fn answers(agent: &dyn Agent) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = Vec::new();
    for event in agent.session().events().iter() {
        match &event.data {
            EventData::UserMessage(m) => out.push((m.text(), false)),
            EventData::AssistantMessage { message, .. } if !message.text().is_empty() => {
                if let Some(last) = out.last_mut() {
                    last.1 = true;
                }
            }
            _ => {}
        }
    }
    out
}

/// spec: SPN-13, SPN-20 — a cancel at every scheduling point of a two-step turn: right after the
/// waking send (point 0) it closes the opened turn without a step; later, a running turn ends
/// `aborted {user}` with a log the checker accepts (every tool call answered); a finished turn is
/// left alone (a no-op); the agent ends idle with an empty inbox; and the next prompt runs.
#[tokio::test(start_paused = true)]
async fn cancel_at_every_point() {
    until_turn_ended(|point| async move {
        let (rt, handle, agent, look) = started().await;
        let ended = at_point(point, &agent, |a| {
            a.cancel(CancelCause::User, CancelOptions::default())
        })
        .await;
        agent.when_idle().await;
        let expected = if ended {
            TurnEndReason::Completed
        } else {
            aborted(CancelCause::User)
        };
        assert_eq!(turn_ends(&*agent), [expected], "point {point}");
        if point == 0 {
            assert_eq!(
                count(&*agent, "step/start"),
                0,
                "no step after an immediate cancel"
            );
        }
        assert!(agent.inbox().next_turn.is_empty() && agent.inbox().next_step.is_empty());
        agent.followup(user("again")).expect("delivered");
        agent.when_idle().await;
        assert_eq!(
            turn_ends(&*agent).last(),
            Some(&TurnEndReason::Completed),
            "point {point}"
        );
        drop(look);
        finish(&rt, [handle]).await;
        ended
    })
    .await;
}

/// spec: SPN-29 — a steer at every scheduling point: while the turn runs it enters at the next
/// step boundary of the same turn; once the turn ended it starts a turn of its own; either way it
/// is answered exactly once and no message is lost.
#[tokio::test(start_paused = true)]
async fn steer_at_every_point() {
    until_turn_ended(|point| async move {
        let (rt, handle, agent, look) = started().await;
        let ended = at_point(point, &agent, |a| {
            a.steer(user("steer")).expect("steered");
        })
        .await;
        agent.when_idle().await;
        let turns = turn_ends(&*agent);
        assert!(
            turns.iter().all(|t| *t == TurnEndReason::Completed),
            "point {point}: {turns:?}"
        );
        assert_eq!(turns.len(), if ended { 2 } else { 1 }, "point {point}: {turns:?}");
        let log = answers(&*agent);
        let steers: Vec<_> = log.iter().filter(|(text, _)| text == "steer").collect();
        assert_eq!(steers, [&("steer".to_owned(), true)], "point {point}: {log:?}");
        assert_eq!(
            log.last(),
            Some(&("steer".to_owned(), true)),
            "point {point}: answered last"
        );
        drop(look);
        finish(&rt, [handle]).await;
        ended
    })
    .await;
}

/// A follow-up at every scheduling point (spec §8, `next-turn`): it waits for the running turn and then
/// runs as exactly one later turn of its own (never merged into the running one), answered once.
#[tokio::test(start_paused = true)]
async fn followup_at_every_point() {
    until_turn_ended(|point| async move {
        let (rt, handle, agent, look) = started().await;
        let ended = at_point(point, &agent, |a| {
            a.followup(Message::user_text("later")).expect("queued");
        })
        .await;
        agent.when_idle().await;
        assert_eq!(
            turn_ends(&*agent),
            [TurnEndReason::Completed, TurnEndReason::Completed],
            "point {point}"
        );
        let log = answers(&*agent);
        assert_eq!(
            log.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>(),
            ["go", "later"],
            "point {point}"
        );
        assert!(
            log.iter().all(|(_, answered)| *answered),
            "point {point}: {log:?}"
        );
        drop(look);
        finish(&rt, [handle]).await;
        ended
    })
    .await;
}

/// The agent's disposal (spec §9.4) at every scheduling point of a two-step turn: a running
/// turn ends `aborted {disposed}`, a finished one keeps `completed`; the disposal always reaches
/// quiescence (the agent and its session unregistered, no task left) with a log the checker
/// accepts, and the disposed agent rejects new work.
#[tokio::test(start_paused = true)]
async fn disposal_at_every_point() {
    until_turn_ended(|point| async move {
        let (rt, handle, agent, look) = started().await;
        let ended = at_point(point, &agent, |_| {}).await;
        handle.dispose().await;
        let expected = if ended {
            TurnEndReason::Completed
        } else {
            aborted(CancelCause::Disposed)
        };
        assert_eq!(turn_ends(&*agent), [expected], "point {point}");
        assert!(
            AgentRuntime::get(&rt, agent.id()).is_none(),
            "point {point}: still registered"
        );
        assert!(
            matches!(agent.followup(user("late")), Err(AgentError::Disposed(_))),
            "point {point}: a disposed agent took new work"
        );
        drop(look);
        finish(&rt, [handle]).await;
        ended
    })
    .await;
}

/// A model adapter that panics: in `stream()` itself (`at == None`) or while yielding item
/// `at` of an otherwise normal text answer.
struct PanicAt(Option<usize>);

impl agent::ModelAdapter for PanicAt {
    fn stream(&self, _: Arc<GenerateOptions>) -> agent::ModelStream {
        use futures::StreamExt;
        let Some(at) = self.0 else {
            panic!("adapter failure in stream()");
        };
        futures::stream::iter(chunks::text("never whole").into_iter().enumerate())
            .map(move |(i, chunk)| {
                assert!(i != at, "adapter failure at item {at}");
                Ok(chunk)
            })
            .boxed()
    }
}

/// A panicking model adapter, at every point of its stream (and in `stream()` itself), is a
/// contained turn failure: the turn ends `error`, the log stays valid (the online checker), the
/// agent takes its next prompt, and the runtime still shuts down quiescent.
#[tokio::test(start_paused = true)]
async fn a_panicking_model_at_every_point_fails_only_the_turn() {
    let items = chunks::text("never whole").len();
    for at in std::iter::once(None).chain((0..items).map(Some)) {
        let rt = builder_over(Arc::new(PanicAt(at))).build();
        let handle = create(&rt, "a").await;
        let agent = handle.agent().clone();
        agent.followup(user("go")).expect("delivered");
        agent.when_idle().await;
        assert!(
            matches!(turn_ends(&*agent).as_slice(), [TurnEndReason::Error { .. }]),
            "panic at {at:?}: {:?}",
            turn_ends(&*agent)
        );
        agent
            .followup(user("again"))
            .expect("the agent takes its next prompt");
        agent.when_idle().await;
        assert_eq!(turn_ends(&*agent).len(), 2, "panic at {at:?}");
        finish(&rt, [handle]).await;
    }
}
