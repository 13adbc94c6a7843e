//! Inbox, delivery, wake rules, cancellation, status and `when_idle` (SPN-12…27).

use std::sync::Arc;

use futures::FutureExt;
use parking_lot::Mutex;

use agent::event::SpliceOutcome;
use agent::model::BlockType;
use agent::{
    AgentError, AgentEvent, AgentHandle, AgentStatus, CancelCause, CancelOptions, ContentBlock, EventData,
    InboxTarget, Message, MessageId, StreamChunk, TurnEndReason,
};

use super::*;
use crate::model::{ScriptEntry, ScriptedModel, chunks};
use crate::runtime::testkit::*;

/// spec: SPN-12 — `clear()` logs both lists as durable cancellations (`next-step` first),
/// replace works across lists, duplicate ids are rejected.
#[tokio::test(start_paused = true)]
async fn spn_12_inbox_clear_replace_and_duplicates() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let queued = user("queued");
    let injected = user("context");
    agent.send(queued.clone(), InboxTarget::NextTurn, false).unwrap();
    agent.inject(injected.clone()).unwrap();
    // A pending id is rejected in either list.
    assert!(matches!(
        agent.send(queued.clone(), InboxTarget::NextStep, false),
        Err(AgentError::DuplicateMessage(id)) if id == queued.id
    ));
    assert!(matches!(
        agent.inject(injected.clone()),
        Err(AgentError::DuplicateMessage(_))
    ));
    // Replace locates the id across lists (here: next-step) as a cancellation inserting the
    // replacement.
    let loop_agent = rt.loop_agent(agent.id()).unwrap();
    let replacement = user("context v2");
    assert!(
        loop_agent
            .replace_pending(&injected.id, replacement.clone())
            .unwrap()
    );
    assert!(!loop_agent.replace_pending(&injected.id, user("gone")).unwrap());
    let last = splices(&*agent).pop().unwrap();
    assert_eq!(last.target, InboxTarget::NextStep);
    assert_eq!(last.removed_count, Some(1));
    assert_eq!(last.inserted, vec![replacement.clone()]);
    assert_eq!(last.outcome, Some(SpliceOutcome::Canceled));
    assert_eq!(agent.inbox().next_step, vec![replacement]);
    // Clear: next-step first, then next-turn, each a durable cancellation.
    let before = splices(&*agent).len();
    agent.cancel(CancelCause::User, CancelOptions::default());
    let cleared = &splices(&*agent)[before..];
    assert_eq!(cleared.len(), 2);
    assert_eq!(cleared[0].target, InboxTarget::NextStep);
    assert_eq!(cleared[1].target, InboxTarget::NextTurn);
    for s in cleared {
        assert_eq!(s.removed_count, Some(1));
        assert!(s.inserted.is_empty());
        assert_eq!(s.outcome, Some(SpliceOutcome::Canceled));
    }
    assert!(agent.inbox().is_empty());
    // An empty clear logs nothing.
    let before = agent.session().len();
    agent.cancel(CancelCause::User, CancelOptions::default());
    assert_eq!(agent.session().len(), before);
    assert!(model.requests().is_empty());
    finish(&rt, [handle]).await;
}

/// A session observer that vetoes the claim splice of the `next-turn` list (a pure deletion).
struct VetoNextTurnClaim;

impl agent::SessionObserver for VetoNextTurnClaim {
    fn check(&self, _session: &agent::Session, candidate: &agent::SessionEvent) -> Result<(), String> {
        match &candidate.data {
            EventData::InboxSpliced(s)
                if s.target == InboxTarget::NextTurn && s.inserted.is_empty() && s.outcome.is_none() =>
            {
                Err("next-turn claims are vetoed".into())
            }
            _ => Ok(()),
        }
    }
}

/// spec: SPN-12 (spine §8.2: a claim removes the `next-step` items, then the first `next-turn`
/// item, then emits `agent/inbox/claimed` per message) — when the `next-turn` half of a claim
/// fails to log, the `next-step` items its first splice already removed still get their
/// `claimed` notifications: every message that leaves the inbox is claimed or discarded, as
/// the log says. (Before the fix the injected message left the inbox with no notification.)
#[tokio::test(start_paused = true)]
async fn a_half_failed_claim_still_notifies_what_it_claimed() {
    let model = ScriptedModel::new([chunks::text("never")]);
    let rt = crate::runtime::Runtime::builder()
        .model(MOCK, model.adapter())
        .session_observer(Arc::new(VetoNextTurnClaim))
        .build();
    let (seen, recorder) = record_events(&rt);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let context = user("context");
    agent.inject(context.clone()).unwrap();
    agent.followup(user("prompt")).unwrap();
    agent.when_idle().await;
    drop(recorder);
    let claimed_in_log: Vec<_> = splices(&*agent)
        .into_iter()
        .filter(|s| s.inserted.is_empty() && s.outcome.is_none())
        .collect();
    assert_eq!(claimed_in_log.len(), 1, "only the next-step half was logged");
    assert_eq!(claimed_in_log[0].target, InboxTarget::NextStep);
    let claimed: Vec<_> = seen
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::InboxClaimed { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(claimed, [context.id]);
    assert!(agent.inbox().next_step.is_empty());
    assert_eq!(agent.inbox().next_turn.len(), 1, "the prompt is still pending");
    assert!(matches!(&turn_ends(&*agent)[..], [TurnEndReason::Error { .. }]));
    assert!(model.requests().is_empty());
    finish(&rt, [handle]).await;
}

/// spec: SPN-13 — `cancel()` on an idle agent with nothing queued is a no-op; the next prompt
/// runs.
#[tokio::test(start_paused = true)]
async fn spn_13_idle_cancel_is_a_no_op() {
    let model = ScriptedModel::new([chunks::text("reply")]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.cancel(CancelCause::User, CancelOptions::default());
    assert!(agent.session().is_empty(), "nothing logged");
    agent.followup(user("real prompt")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["real prompt"]);
    assert_eq!(turn_ends(&*agent), [TurnEndReason::Completed]);
    finish(&rt, [handle]).await;
}

/// spec: SPN-14 — `keepInbox` does not restore work a waking send already claimed; the opened
/// turn ends `aborted {user}` with no model call.
#[tokio::test(start_paused = true)]
async fn spn_14_keep_inbox_does_not_restore_claimed_work() {
    let model = ScriptedModel::new([chunks::text("wake reply")]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("preserved")).unwrap();
    agent.cancel(CancelCause::User, keep());
    assert!(
        splices(&*agent).iter().all(|s| s.outcome.is_none()),
        "keep_inbox logs no cancellation"
    );
    agent.when_idle().await;
    assert!(agent.inbox().is_empty());
    assert!(user_texts(&*agent).is_empty());
    assert!(model.requests().is_empty());
    assert_eq!(turn_ends(&*agent), [aborted(CancelCause::User)]);
    agent.followup(user("wake it")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["wake it"]);
    assert_eq!(model.requests().len(), 1);
    finish(&rt, [handle]).await;
}

/// spec: SPN-15 — `keepInbox` parks queued work after an active turn aborts; it runs on the
/// next wake.
#[tokio::test(start_paused = true)]
async fn spn_15_keep_inbox_parks_queued_work_until_the_next_wake() {
    let model = ScriptedModel::new([
        ScriptEntry::hang(),
        chunks::text("preserved reply").into(),
        chunks::text("wake reply").into(),
    ]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("active")).unwrap();
    settle().await;
    agent.followup(user("preserved")).unwrap();
    agent.cancel(CancelCause::User, keep());
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["active"]);
    assert_eq!(agent.inbox().next_turn.len(), 1);
    assert_eq!(model.requests().len(), 1);
    assert_eq!(agent.status(), AgentStatus::Idle);
    agent.followup(user("wake it")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["active", "preserved", "wake it"]);
    assert_eq!(model.requests().len(), 3);
    finish(&rt, [handle]).await;
}

/// spec: SPN-16 — a waking send in the abort-to-idle window is latched and replays at
/// convergence.
#[tokio::test(start_paused = true)]
async fn spn_16_wake_in_abort_window_is_latched_and_replayed() {
    let model = ScriptedModel::new([ScriptEntry::hang(), chunks::text("B reply").into()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("active")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, keep());
    agent.followup(user("B")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["active", "B"]);
    assert_eq!(model.requests().len(), 2);
    assert!(agent.inbox().is_empty());
    assert_eq!(
        turn_ends(&*agent),
        [aborted(CancelCause::User), TurnEndReason::Completed]
    );
    finish(&rt, [handle]).await;
}

/// spec: SPN-16 (steering variant) — a latched steer is redirected to `next-turn`: it cannot
/// join the aborted turn.
#[tokio::test(start_paused = true)]
async fn spn_16_latched_steer_is_redirected_to_next_turn() {
    let model = ScriptedModel::new([ScriptEntry::hang_slow(), chunks::text("B reply").into()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("A")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, keep());
    agent.steer(user("B")).unwrap();
    assert_eq!(agent.inbox().next_turn.len(), 1);
    assert!(agent.inbox().next_step.is_empty());
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["A", "B"]);
    finish(&rt, [handle]).await;
}

/// spec: SPN-17 — `cancel()` without `keepInbox` clears a latched wake with the inbox.
#[tokio::test(start_paused = true)]
async fn spn_17_cancel_clears_a_latched_wake() {
    let model = ScriptedModel::new([ScriptEntry::hang(), chunks::text("C reply").into()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("active")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, keep());
    agent.followup(user("B")).unwrap();
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["active"]);
    assert!(agent.inbox().is_empty());
    assert_eq!(model.requests().len(), 1);
    agent.followup(user("C")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["active", "C"]);
    assert_eq!(model.requests().len(), 2);
    finish(&rt, [handle]).await;
}

/// Agent `a` with a hanging turn on "active" and "queued" waiting behind it, cancelled by the
/// user while an `InboxDiscarded` listener of that clear makes `deliver`'s delivery (once).
/// Returns once the agent is idle again, the listener removed.
async fn cancel_with_a_delivery_during_the_clear(
    model: &ScriptedModel,
    deliver: impl Fn(&AgentRef) -> Result<MessageId, AgentError> + Send + Sync + 'static,
) -> (crate::runtime::Runtime, AgentHandle, AgentRef) {
    let rt = runtime(model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("active")).unwrap();
    settle().await;
    agent.followup(user("queued")).unwrap();
    let sender = Arc::downgrade(&agent);
    let delivered = Arc::new(Mutex::new(false));
    let once = delivered.clone();
    let guard = rt.services().agent_events.on(move |e| {
        if let AgentEvent::InboxDiscarded { .. } = e
            && !std::mem::replace(&mut *once.lock(), true)
            && let Some(agent) = sender.upgrade()
        {
            deliver(&agent)?;
        }
        Ok(())
    });
    agent.cancel(CancelCause::User, CancelOptions::default());
    assert!(*delivered.lock(), "the discard listener delivered");
    agent.when_idle().await;
    drop(guard);
    (rt, handle, agent)
}

/// spec: SPN-16, SPN-17 — a waking send made while `cancel()` clears the inbox (here from an
/// `InboxDiscarded` listener of that clear; another thread can hit the same window) arrives
/// after the clear but before the active turn's token is cancelled. The clear cannot drop it
/// and the aborted turn never claims it, so it is latched like a send after the cancel and
/// replays at convergence. (Before the fix it was stranded: the agent went idle with the
/// message pending and no wake.)
#[tokio::test(start_paused = true)]
async fn spn_16_send_during_cancel_clear_is_latched_not_stranded() {
    let model = ScriptedModel::new([ScriptEntry::hang(), chunks::text("late reply").into()]);
    let (rt, handle, agent) = cancel_with_a_delivery_during_the_clear(&model, |agent| {
        agent.followup(user("sent during the clear"))
    })
    .await;
    assert_eq!(user_texts(&*agent), ["active", "sent during the clear"]);
    assert_eq!(model.requests().len(), 2);
    assert!(agent.inbox().is_empty(), "nothing stranded: {:?}", agent.inbox());
    assert_eq!(
        turn_ends(&*agent),
        [aborted(CancelCause::User), TurnEndReason::Completed]
    );
    assert_eq!(agent.status(), AgentStatus::Idle);
    finish(&rt, [handle]).await;
}

/// spec: SPN-12 — `clear` cancels exactly the messages pending when it was called. Here a
/// discard listener of its `next-step` splice removes one queued prompt and sends a follow-up
/// before the `next-turn` splice: the other queued prompt is cancelled, the listener's send is
/// kept (latched, it replays at convergence), and the log's splices say so. (The clear used to
/// cancel as many `next-turn` entries as were pending at the call, which then took the
/// listener's send with them; without the removal the same send was kept.)
#[tokio::test(start_paused = true)]
async fn spn_12_clear_cancels_exactly_what_was_pending_at_the_call() {
    let model = ScriptedModel::new([ScriptEntry::hang(), chunks::text("late reply").into()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("active")).unwrap();
    settle().await;
    agent.inject(user("context")).unwrap();
    let first = agent.followup(user("queued 1")).unwrap();
    agent.followup(user("queued 2")).unwrap();
    let sender = Arc::downgrade(&agent);
    let discards = Arc::new(Mutex::new(Vec::new()));
    let seen = discards.clone();
    let guard = rt.services().agent_events.on(move |e| {
        if let AgentEvent::InboxDiscarded { messages, .. } = e {
            let mut seen = seen.lock();
            seen.push(messages.len());
            if seen.len() == 1
                && let Some(agent) = sender.upgrade()
            {
                assert!(agent.remove_pending(&first)?);
                agent.followup(user("sent during the clear"))?;
            }
        }
        Ok(())
    });
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    drop(guard);
    assert_eq!(
        *discards.lock(),
        [1, 1, 1],
        "the context, the listener's removal, the other queued prompt"
    );
    assert_eq!(user_texts(&*agent), ["active", "sent during the clear"]);
    assert!(agent.inbox().is_empty(), "nothing stranded: {:?}", agent.inbox());
    assert_eq!(
        turn_ends(&*agent),
        [aborted(CancelCause::User), TurnEndReason::Completed]
    );
    finish(&rt, [handle]).await;
}

/// spec: SPN-16, SPN-17 (spine §8.3: `inject` does not wake) — context injected while
/// `cancel()` clears the inbox is not latched: it stays pending for the next wake instead of
/// starting a turn of its own.
#[tokio::test(start_paused = true)]
async fn inject_during_cancel_clear_stays_parked() {
    let model = ScriptedModel::new([ScriptEntry::hang(), chunks::text("later reply").into()]);
    let (rt, handle, agent) = cancel_with_a_delivery_during_the_clear(&model, |agent| {
        agent.inject(user("context during the clear"))
    })
    .await;
    assert_eq!(user_texts(&*agent), ["active"]);
    assert_eq!(model.requests().len(), 1, "no turn for a non-waking send");
    assert_eq!(agent.inbox().next_step.len(), 1, "the context stays pending");
    agent.followup(user("wake")).unwrap();
    agent.when_idle().await;
    assert_eq!(
        user_texts(&*agent),
        ["active", "context during the clear", "wake"]
    );
    finish(&rt, [handle]).await;
}

/// spec: SPN-18 — removing a latched message before convergence suppresses the replay (no
/// empty turn).
#[tokio::test(start_paused = true)]
async fn spn_18_removed_latched_message_suppresses_replay() {
    let model = ScriptedModel::new([ScriptEntry::hang()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("active")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, keep());
    let steer = user("steer me");
    agent.steer(steer.clone()).unwrap();
    assert!(agent.remove_pending(&steer.id).unwrap());
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["active"]);
    assert_eq!(model.requests().len(), 1);
    assert!(agent.inbox().is_empty());
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert_eq!(count(&*agent, "turn/start"), 1);
    finish(&rt, [handle]).await;
}

/// spec: SPN-19 — a wake arriving after disposal began is never latched. In this runtime a
/// disposing agent refuses new work outright (`AgentError::Disposed`); a direct
/// `cancel(disposed)` likewise never arms the latch (the wake stays parked, no replay turn).
#[tokio::test(start_paused = true)]
async fn spn_19_no_latch_after_disposal_began() {
    let model = ScriptedModel::new([ScriptEntry::hang_slow(), chunks::text("late reply").into()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("active")).unwrap();
    settle().await;
    let disposal = handle.dispose();
    assert!(matches!(
        agent.followup(user("late wake")),
        Err(AgentError::Disposed(_))
    ));
    disposal.await;
    assert_eq!(model.requests().len(), 1);
    assert_eq!(user_texts(&*agent), ["active"]);
    assert_eq!(turn_ends(&*agent), [aborted(CancelCause::Disposed)]);

    // The latch rule itself: a `disposed` cause never latches.
    let model = ScriptedModel::new([ScriptEntry::hang(), chunks::text("never").into()]);
    let rt2 = runtime(&model);
    let handle2 = create(&rt2, "b").await;
    let agent = handle2.agent().clone();
    agent.followup(user("active")).unwrap();
    settle().await;
    agent.cancel(CancelCause::Disposed, keep());
    agent.followup(user("late")).unwrap();
    agent.when_idle().await;
    assert_eq!(model.requests().len(), 1);
    assert_eq!(agent.inbox().next_turn.len(), 1, "parked, not replayed");
    assert_eq!(count(&*agent, "turn/start"), 1);
    finish(&rt, []).await;
    finish(&rt2, [handle2]).await;
}

/// spec: SPN-19 — a send that passed its liveness check when disposal began (here: disposal
/// started by an `InboxInserted` listener of that very send, which is also where a send on
/// another thread can lose the race) never starts a driver: no `running` status, no
/// `turn/start`, no model call after disposal began. (Before the fix the send's wake found the
/// disposing agent idle and opened a turn on it.)
#[tokio::test(start_paused = true)]
async fn spn_19_send_racing_disposal_starts_no_turn() {
    let model = ScriptedModel::new([chunks::text("should not run")]);
    let rt = runtime(&model);
    let handle = Arc::new(create(&rt, "a").await);
    let agent = handle.agent().clone();
    let (seen, recorder) = record_events(&rt);
    let disposal = Arc::new(Mutex::new(None));
    let (h, d) = (handle.clone(), disposal.clone());
    let guard = rt.services().agent_events.on(move |e| {
        if let AgentEvent::InboxInserted { .. } = e {
            let mut d = d.lock();
            if d.is_none() {
                *d = Some(h.dispose());
            }
        }
        Ok(())
    });
    let sent = agent.followup(user("racing the disposal"));
    assert!(sent.is_ok(), "the send passed its liveness check: {sent:?}");
    let fut = disposal
        .lock()
        .take()
        .expect("the insert listener started disposal");
    fut.await;
    settle().await;
    drop(guard);
    drop(recorder);
    let statuses: Vec<AgentStatus> = seen
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Status { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert!(
        statuses.is_empty(),
        "no status change after disposal began: {statuses:?}"
    );
    assert_eq!(count(&*agent, "turn/start"), 0);
    assert!(model.requests().is_empty());
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert!(
        agent.inbox().is_empty(),
        "the disposal's clear cancelled the message"
    );
    drop(handle);
    finish(&rt, []).await;
}

/// spec: SPN-19, SPN-9 — a send that passed its liveness check just before disposal began
/// (another thread, in production; here a hook between that check and the inbox's operation
/// lock starts the disposal) is refused like a send to a disposed agent, for every preset
/// (`followup`, `steer`, `inject`): nothing is appended after the disposal's clear, and the
/// inbox of the disposed agent is empty. (Before the fix the send appended after the clear and
/// returned `Ok`: the message was logged as accepted, then never run nor cancelled, so the
/// consumed-work fold did not count it as dropped work and the caller believed it delivered.)
#[tokio::test(start_paused = true)]
async fn spn_19_send_passing_its_check_as_disposal_begins_is_refused() {
    type Preset = fn(&dyn agent::Agent, Message) -> Result<MessageId, AgentError>;
    let presets: [(&str, Preset); 3] = [
        ("followup", |a, m| a.followup(m)),
        ("steer", |a, m| a.steer(m)),
        ("inject", |a, m| a.inject(m)),
    ];
    for (name, preset) in presets {
        let model = ScriptedModel::new([chunks::text("should not run")]);
        let rt = runtime(&model);
        let handle = Arc::new(create(&rt, "a").await);
        let agent = handle.agent().clone();
        let loop_agent = rt.loop_agent(agent.id()).unwrap();
        let disposal = Arc::new(Mutex::new(None));
        let (h, d) = (handle.clone(), disposal.clone());
        *loop_agent.before_send_exclusive.lock() = Some(Box::new(move || {
            *d.lock() = Some(h.dispose());
        }));
        let late = user("racing the disposal");
        let sent = preset(&*agent, late.clone());
        assert!(
            matches!(&sent, Err(AgentError::Disposed(id)) if id == agent.id()),
            "{name}: a send after disposal began is refused: {sent:?}"
        );
        let fut = disposal.lock().take().expect("the hook started disposal");
        fut.await;
        assert!(
            agent.inbox().is_empty(),
            "{name}: work stranded on a disposed agent: {:?}",
            agent.inbox()
        );
        assert!(
            !splices(&*agent)
                .iter()
                .any(|s| s.inserted.iter().any(|m| m.id == late.id)),
            "{name}: the refused message was logged as accepted"
        );
        assert_eq!(count(&*agent, "turn/start"), 0, "{name}");
        assert!(model.requests().is_empty(), "{name}");
        drop((agent, loop_agent, handle));
        finish(&rt, []).await;
    }
}

/// spec: SPN-20 — cancel right after waking sends closes the synchronously opened turn
/// without a step.
#[tokio::test(start_paused = true)]
async fn spn_20_cancel_after_waking_sends_closes_the_turn_without_a_step() {
    let model = ScriptedModel::new([chunks::text("should not run")]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("drop me first")).unwrap();
    agent.followup(user("drop me second")).unwrap();
    agent.cancel(CancelCause::User, CancelOptions::default());
    settle().await;
    assert!(user_texts(&*agent).is_empty());
    assert_eq!(count(&*agent, "turn/start"), 1);
    assert_eq!(count(&*agent, "step/start"), 0);
    assert_eq!(turn_ends(&*agent), [aborted(CancelCause::User)]);
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert!(model.requests().is_empty());
    finish(&rt, [handle]).await;
}

/// spec: SPN-21 — disposal from the running notification drops queued work before
/// `turn/start`.
#[tokio::test(start_paused = true)]
async fn spn_21_disposal_from_running_notification_drops_work_before_turn_start() {
    let model = ScriptedModel::new([chunks::text("should not run")]);
    let rt = runtime(&model);
    let handle = Arc::new(create(&rt, "a").await);
    let agent = handle.agent().clone();
    let disposal = Arc::new(Mutex::new(None));
    let (h, d) = (handle.clone(), disposal.clone());
    let guard = rt.services().agent_events.on(move |e| {
        if let AgentEvent::Status {
            status: AgentStatus::Running,
            ..
        } = e
        {
            *d.lock() = Some(h.dispose());
        }
        Ok(())
    });
    agent.followup(user("drop before claim")).unwrap();
    let fut = disposal
        .lock()
        .take()
        .expect("the running listener started disposal");
    fut.await;
    drop(guard);
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert_eq!(count(&*agent, "turn/start"), 0);
    assert!(user_texts(&*agent).is_empty());
    assert!(model.requests().is_empty());
    assert!(agent.inbox().is_empty());
    drop(handle);
    finish(&rt, []).await;
}

/// spec: SPN-22 — cancel mid-stream finalises the streamed text prefix as an interrupted
/// assistant message citing its chunks; the next request sees it.
#[tokio::test(start_paused = true)]
async fn spn_22_cancel_mid_stream_finalises_the_prefix() {
    let model = ScriptedModel::new([ScriptEntry::hang(), chunks::text("after").into()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    let events = agent.session().events();
    let message = events
        .iter()
        .find(|e| e.type_name() == "assistant/message")
        .unwrap();
    let EventData::AssistantMessage {
        message: m,
        interrupted,
        ..
    } = &message.data
    else {
        unreachable!()
    };
    assert_eq!(m.content, vec![ContentBlock::text("partial")]);
    assert!(interrupted);
    let chunk_seqs: Vec<u64> = events
        .iter()
        .filter(|e| e.type_name() == "assistant/chunk")
        .map(|e| e.seq)
        .collect();
    assert_eq!(
        message.surface.as_ref().unwrap().source_event_seqs.as_ref(),
        Some(&chunk_seqs)
    );
    let t = types(&*agent);
    let pos = |k: &str| t.iter().position(|x| x == k).unwrap();
    assert!(pos("assistant/message") < pos("step/end"));
    assert!(pos("step/end") < pos("turn/end"));
    agent.followup(user("continue")).unwrap();
    agent.when_idle().await;
    let replayed = &model.requests()[1].messages;
    assert!(
        replayed
            .iter()
            .any(|m| m.role == agent::Role::Assistant && m.text() == "partial")
    );
    finish(&rt, [handle]).await;
}

/// spec: SPN-23 — cancel drops a half-streamed tool call but keeps completed text.
#[tokio::test(start_paused = true)]
async fn spn_23_cancel_drops_half_streamed_tool_call() {
    let model = ScriptedModel::new([ScriptEntry::hang_after(vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Text,
        },
        StreamChunk::TextDelta {
            index: 0,
            text: "reading the file".into(),
        },
        StreamChunk::BlockEnd {
            index: 0,
            block: ContentBlock::text("reading the file"),
        },
        StreamChunk::BlockStart {
            index: 1,
            block_type: BlockType::ToolCall,
        },
        StreamChunk::ToolCallDelta {
            index: 1,
            id: "c1".into(),
            name: Some("read".into()),
            arguments_delta: "{\"pa".into(),
        },
    ])]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    let messages: Vec<Message> = agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::AssistantMessage { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].content, vec![ContentBlock::text("reading the file")]);
    assert_eq!(count(&*agent, "tool/call"), 0);
    finish(&rt, [handle]).await;
}

/// spec: SPN-24 — cancel before any visible content finalises nothing.
#[tokio::test(start_paused = true)]
async fn spn_24_cancel_before_visible_content_finalises_nothing() {
    let model = ScriptedModel::new([ScriptEntry::hang_after(vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::ToolCall,
        },
        StreamChunk::ToolCallDelta {
            index: 0,
            id: "c1".into(),
            name: Some("read".into()),
            arguments_delta: "{\"pa".into(),
        },
    ])]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    assert_eq!(count(&*agent, "assistant/message"), 0);
    assert_eq!(count(&*agent, "assistant/chunk"), 2);
    assert_eq!(turn_ends(&*agent), [aborted(CancelCause::User)]);
    finish(&rt, [handle]).await;
}

/// spec: SPN-25 — the first typed cancel cause wins over later ones (and is the model
/// request's cancellation reason) and over lifecycle teardown.
#[tokio::test(start_paused = true)]
async fn spn_25_first_cancel_cause_wins() {
    let model = ScriptedModel::new([ScriptEntry::hang(), ScriptEntry::hang()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    agent.followup(user("go")).unwrap();
    settle().await;
    agent.cancel(CancelCause::Parent, CancelOptions::default());
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
    assert_eq!(model.requests()[0].signal.cause(), Some(CancelCause::Parent));
    assert_eq!(turn_ends(&*agent), [aborted(CancelCause::Parent)]);

    agent.followup(user("again")).unwrap();
    settle().await;
    agent.cancel(CancelCause::User, CancelOptions::default());
    handle.dispose().await;
    assert_eq!(
        turn_ends(&*agent),
        [aborted(CancelCause::Parent), aborted(CancelCause::User)]
    );
    finish(&rt, []).await;
}

/// spec: SPN-26 — `whenIdle()` resolves immediately when idle and waits for active work until
/// cancellation.
#[tokio::test(start_paused = true)]
async fn spn_26_when_idle_resolves_immediately_or_waits_for_work() {
    let model = ScriptedModel::new([ScriptEntry::hang()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    assert!(agent.when_idle().now_or_never().is_some());
    agent.followup(user("go")).unwrap();
    let mut idle = agent.when_idle();
    settle().await;
    assert!((&mut idle).now_or_never().is_none(), "still running");
    agent.cancel(CancelCause::User, CancelOptions::default());
    idle.await;
    assert_eq!(agent.status(), AgentStatus::Idle);
    finish(&rt, [handle]).await;
}

/// spec: SPN-27 — one completed turn emits exactly `running` then `idle`.
#[tokio::test(start_paused = true)]
async fn spn_27_one_turn_emits_running_then_idle() {
    let model = ScriptedModel::new([chunks::text("reply")]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let (seen, guard) = record_events(&rt);
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    drop(guard);
    let statuses: Vec<AgentStatus> = seen
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Status { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(statuses, [AgentStatus::Running, AgentStatus::Idle]);
    finish(&rt, [handle]).await;
}

/// spec: SPN-27 (spine §8.4: every change of the public status emits `agent/status`; the same
/// status is never emitted twice in a row) — a status listener that starts work from the `idle`
/// notification (a follow-up) does not make later listeners see the statuses out of order.
/// Before the fix the `running` of the new drain was emitted from inside the `idle` emission,
/// so a listener registered after the sender saw `running, running, idle, idle`.
#[tokio::test(start_paused = true)]
async fn status_listener_waking_from_idle_keeps_later_listeners_in_order() {
    let model = ScriptedModel::new([chunks::text("one"), chunks::text("two")]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let sender = Arc::downgrade(&agent);
    let sent = Arc::new(Mutex::new(false));
    let once = sent.clone();
    let waker = rt.services().agent_events.on(move |e| {
        if let AgentEvent::Status {
            status: AgentStatus::Idle,
            ..
        } = e
            && !std::mem::replace(&mut *once.lock(), true)
            && let Some(agent) = sender.upgrade()
        {
            agent.followup(user("second"))?;
        }
        Ok(())
    });
    let (seen, recorder) = record_events(&rt);
    agent.followup(user("first")).unwrap();
    agent.when_idle().await;
    drop(recorder);
    drop(waker);
    assert!(*sent.lock());
    assert_eq!(user_texts(&*agent), ["first", "second"]);
    let statuses: Vec<AgentStatus> = seen
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Status { status, .. } => Some(*status),
            _ => None,
        })
        .collect();
    assert_eq!(
        statuses,
        [
            AgentStatus::Running,
            AgentStatus::Idle,
            AgentStatus::Running,
            AgentStatus::Idle
        ]
    );
    assert_eq!(agent.status(), AgentStatus::Idle);
    finish(&rt, [handle]).await;
}

/// spec: SPN-26, SPN-27 (spine §8.4; the reference resolves `whenIdle()` after the `idle`
/// event) — `when_idle` resolves only once the `idle` status event reached every listener: a
/// listener of that event (which calls back into the agent) still sees it pending, and the
/// waiter resolves afterwards. Before the fix the busy flag was cleared before the emission, so
/// a waiter (on another thread, or polled from the first listener as here) saw the agent idle
/// while later listeners had not received `idle` yet.
#[tokio::test(start_paused = true)]
async fn when_idle_resolves_after_the_idle_event_reached_every_listener() {
    let model = ScriptedModel::new([chunks::text("reply")]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let observer = Arc::downgrade(&agent);
    let during = Arc::new(Mutex::new(Vec::new()));
    let sink = during.clone();
    let first = rt.services().agent_events.on(move |e| {
        if let AgentEvent::Status {
            status: AgentStatus::Idle,
            ..
        } = e
            && let Some(agent) = observer.upgrade()
        {
            sink.lock().push((
                agent.when_idle().now_or_never().is_some(),
                agent.status(),
                agent.inbox().is_empty(),
            ));
        }
        Ok(())
    });
    let (seen, recorder) = record_events(&rt);
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert!(
        matches!(
            seen.lock().last(),
            Some(AgentEvent::Status {
                status: AgentStatus::Idle,
                ..
            })
        ),
        "the waiter resolved after the idle event reached the last listener"
    );
    drop(recorder);
    drop(first);
    assert_eq!(
        *during.lock(),
        [(false, AgentStatus::Idle, true)],
        "when_idle is still pending while the idle event is delivered"
    );
    assert!(agent.when_idle().now_or_never().is_some());
    assert_eq!(agent.status(), AgentStatus::Idle);
    finish(&rt, [handle]).await;
}

/// spec: SPN-12 (spine §8.2 notifications; event delivery is in order) — a listener that changes
/// the inbox from an inbox notification does not make later listeners see the notifications out
/// of order: the nested change's notification is delivered once every listener saw the one
/// being delivered (as nested status changes are). Before the fix it was emitted from inside
/// the running emission, so a listener registered after the injector saw `second` inserted
/// before `first`.
#[tokio::test(start_paused = true)]
async fn inbox_listener_changing_the_inbox_keeps_later_listeners_in_order() {
    let model = ScriptedModel::new(Vec::<ScriptEntry>::new());
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let injector = Arc::downgrade(&agent);
    let injected = Arc::new(Mutex::new(false));
    let once = injected.clone();
    let nested = rt.services().agent_events.on(move |e| {
        if let AgentEvent::InboxInserted { .. } = e
            && !std::mem::replace(&mut *once.lock(), true)
            && let Some(agent) = injector.upgrade()
        {
            agent.inject(user("second"))?;
        }
        Ok(())
    });
    let (seen, recorder) = record_events(&rt);
    let first = agent.inject(user("first")).unwrap();
    assert!(*injected.lock(), "the listener injected");
    drop(recorder);
    drop(nested);
    let snapshot = agent.inbox();
    let texts: Vec<String> = snapshot.next_step.iter().map(|m| m.text()).collect();
    assert_eq!(texts, ["first", "second"]);
    let second = snapshot.next_step[1].id.clone();
    let inserted: Vec<agent::MessageId> = seen
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::InboxInserted { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(inserted, [first, second]);
    assert_eq!(agent.status(), AgentStatus::Idle);
    finish(&rt, [handle]).await;
}

/// spec: SPN-19, SPN-55 — follow-ups racing the agent's disposal on a multi-threaded runtime:
/// each is either refused (`Disposed`) or accepted, no `agent/status` follows `agent/disposed`
/// (neither a drain started after the teardown nor the `idle` of a drain the disposal
/// cancelled), and the agent ends idle with the runtime quiescent. (The deterministic
/// reproduction of the send race is `spn_19_send_racing_disposal_starts_no_turn`; the `idle`
/// emitted after `agent/disposed` has no deterministic reproduction: before its fix this test
/// failed in about 3% of its runs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_racing_disposal_on_threads_start_nothing_after_teardown() {
    for round in 0..64 {
        let model = ScriptedModel::new((0..64).map(|i| chunks::text(format!("reply {i}"))));
        let rt = runtime(&model);
        let (seen, recorder) = record_events(&rt);
        let handle = create(&rt, "a").await;
        let agent = handle.agent().clone();
        let sender = {
            let agent = agent.clone();
            tokio::spawn(async move {
                for n in 0.. {
                    match agent.followup(user(&format!("m{n}"))) {
                        Ok(_) => tokio::task::yield_now().await,
                        Err(AgentError::Disposed(_)) => return,
                        Err(other) => panic!("unexpected send error: {other:?}"),
                    }
                }
            })
        };
        for _ in 0..round % 8 {
            tokio::task::yield_now().await;
        }
        handle.dispose().await;
        sender.await.unwrap();
        agent.when_idle().await;
        drop(recorder);
        let events = seen.lock().clone();
        let disposed = events
            .iter()
            .position(|e| matches!(e, AgentEvent::Disposed { .. }))
            .unwrap_or_else(|| panic!("round {round}: no agent/disposed"));
        assert!(
            !events[disposed..]
                .iter()
                .any(|e| matches!(e, AgentEvent::Status { .. })),
            "round {round}: a status change after the teardown: {:?}",
            &events[disposed..]
        );
        assert_eq!(agent.status(), AgentStatus::Idle, "round {round}");
        drop(agent);
        finish(&rt, []).await;
    }
}

/// spec: SPN-16, SPN-17 — a waking send racing a full `cancel()` on another thread. The send
/// is either cleared by the cancel (it came first) or latched and replayed after the aborted
/// turn (it came after), never parked with no wake: the agent does not end idle with the
/// message pending. (Before the fix `send` read the phase before taking the inbox's operation
/// lock: a send that read the uncancelled phase while the cancel was clearing the inbox
/// appended after the clear, counted its wake after the cancel's latch check, and found the
/// token cancelled without being redirected or latched. No hook runs inside that gap on the
/// sending thread, so there is no deterministic reproduction; this test failed in most of its
/// runs before the fix.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spn_16_send_racing_cancel_on_threads_is_cleared_or_latched() {
    for round in 0..64 {
        let model = ScriptedModel::new([
            ScriptEntry::hang(),
            chunks::text("reply").into(),
            chunks::text("spare").into(),
        ]);
        let rt = runtime(&model);
        let handle = create(&rt, "a").await;
        let agent = handle.agent().clone();
        agent.followup(user("active")).unwrap();
        while model.requests().is_empty() {
            tokio::task::yield_now().await;
        }
        agent.followup(user("queued")).unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(2));
        let sender = {
            let (agent, barrier) = (agent.clone(), barrier.clone());
            tokio::task::spawn_blocking(move || {
                barrier.wait();
                agent.followup(user("raced")).unwrap();
            })
        };
        let canceller = {
            let (agent, barrier) = (agent.clone(), barrier.clone());
            tokio::task::spawn_blocking(move || {
                barrier.wait();
                agent.cancel(CancelCause::User, CancelOptions::default());
            })
        };
        sender.await.unwrap();
        canceller.await.unwrap();
        agent.when_idle().await;
        assert!(
            agent.inbox().is_empty(),
            "round {round}: the raced send is stranded: {:?}",
            agent.inbox()
        );
        let texts = user_texts(&*agent);
        assert!(
            texts == ["active"] || texts == ["active", "raced"],
            "round {round}: {texts:?}"
        );
        assert_eq!(agent.status(), AgentStatus::Idle, "round {round}");
        drop(agent);
        finish(&rt, [handle]).await;
    }
}

/// spec: SPN-27 (spine §8.3 rule 1, §8.6 step 4) — a follow-up sent as the drain closes its
/// last turn is never stranded. The send finds the agent running, so its wake is a no-op (a
/// running drain picks queued work up itself): the drain must see it when it decides between
/// the next turn and idle. A hook sends it at the latest point — after the turn ended, before
/// the drain converges. Before the fix the drain decided "nothing pending" first and made the
/// idle transition in a second critical section, so a send landing in between (another thread,
/// in production) left the follow-up pending on an idle agent, with `when_idle` resolved.
#[tokio::test(start_paused = true)]
async fn spn_27_followup_sent_as_the_drain_converges_is_not_stranded() {
    let model = ScriptedModel::new([chunks::text("first reply"), chunks::text("second reply")]);
    let rt = builder(&model).build();
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();
    let loop_agent = rt.loop_agent(agent.id()).unwrap();
    let sender = agent.clone();
    *loop_agent.before_converge.lock() = Some(Box::new(move || {
        assert_eq!(
            sender.status(),
            AgentStatus::Running,
            "the drain is still running"
        );
        sender.followup(user("second")).unwrap();
    }));
    agent.followup(user("first")).unwrap();
    agent.when_idle().await;
    assert!(
        agent.inbox().is_empty(),
        "a follow-up is stranded with the agent idle: {:?}",
        agent.inbox()
    );
    assert_eq!(user_texts(&*agent), ["first", "second"]);
    assert_eq!(
        turn_ends(&*agent),
        [TurnEndReason::Completed, TurnEndReason::Completed]
    );
    assert_eq!(agent.status(), AgentStatus::Idle);
    assert!(loop_agent.before_converge.lock().is_none(), "the hook ran");
    drop((agent, loop_agent));
    finish(&rt, [handle]).await;
}
