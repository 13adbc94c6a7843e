//! Crash repair of a log that ends inside an open turn.

use std::collections::HashSet;

use agent::event::ToolResultError;
use agent::session::now_ms;
use agent::{CallId, ContentBlock, EventData, Message, SessionEvent, SurfaceMeta, TurnEndReason};

/// `tool/result` error code for a call whose `tool/call` was logged (so it may have started,
/// and may have had effects) but whose result was never logged.
pub const TOOL_INTERRUPTED_CODE: &str = "TOOL_INTERRUPTED";
/// `tool/result` error code for a call the model made that was never logged as a `tool/call`,
/// so it never started (spec: the synthetic not-started repair, `inprocess-providers.md` S12).
pub const TOOL_NOT_STARTED_CODE: &str = "TOOL_NOT_STARTED";
/// The model-visible text of a [`TOOL_INTERRUPTED_CODE`] result.
pub const TOOL_INTERRUPTED_TEXT: &str = "Error: this tool call was interrupted before its result was recorded. \
It may or may not have taken effect; check before repeating it.";
/// The model-visible text of a [`TOOL_NOT_STARTED_CODE`] result.
pub const TOOL_NOT_STARTED_TEXT: &str =
    "Error: this tool call was not started because the session was interrupted.";

/// Closes a log that ends inside an open turn, at the current time. See
/// [`repair_open_turn_at`].
pub fn repair_open_turn(events: &mut Vec<SessionEvent>) -> bool {
    repair_open_turn_at(events, now_ms())
}

/// Closes a log that ends inside an open turn (the process died mid-turn) with the minimal
/// balanced suffix, stamped `time`, and returns whether anything was appended. A log with no
/// open turn is left unchanged.
///
/// The suffix, in order (each event gets `seq == index`):
///
/// 1. **Only when a step is open:** one error `tool/result` for every call of that step the
///    model made but no `tool/result` answered, in order of first appearance — code
///    [`TOOL_INTERRUPTED_CODE`] when a `tool/call` was logged for it (it may have run), else
///    [`TOOL_NOT_STARTED_CODE`] (the spec's synthetic not-started repair). Without these the
///    derived history would hold assistant tool calls with no results, which no provider
///    accepts as the next request; the session invariants allow either (S12).
/// 2. **Only when a step is open:** `step/end {turn, step}` — `turn/end` requires no open step
///    (S5); unanswered calls at step end are allowed (S9), but step 1 leaves none.
/// 3. `turn/end {turn, reason: interrupted}` — the reason spec §4.4 reserves for crash repair.
///
/// Nothing else is synthesised: no `assistant/message` is built from a step's dangling
/// `assistant/chunk`s (an unfinished stream has no safe message), so the repaired history ends
/// with whatever the log had committed. The result replays cleanly through the session
/// invariants (S1–S15) and the next turn is numbered one more than the repaired one.
pub fn repair_open_turn_at(events: &mut Vec<SessionEvent>, time: u64) -> bool {
    let mut open_turn: Option<u64> = None;
    // (turn, step, index of its step/start)
    let mut open_step: Option<(u64, u64, usize)> = None;
    for (i, ev) in events.iter().enumerate() {
        match &ev.data {
            EventData::TurnStart { turn } => {
                open_turn = Some(*turn);
                open_step = None;
            }
            EventData::TurnEnd { .. } => {
                open_turn = None;
                open_step = None;
            }
            EventData::StepStart { turn, step } => open_step = Some((*turn, *step, i)),
            EventData::StepEnd { .. } => open_step = None,
            _ => {}
        }
    }
    let Some(turn) = open_turn else {
        return false;
    };
    let push = |events: &mut Vec<SessionEvent>, data: EventData, surface: Option<SurfaceMeta>| {
        let seq = events.len() as u64;
        events.push(SessionEvent {
            seq,
            time,
            data,
            surface,
            ignorable: false,
        });
    };
    if let Some((step_turn, step, start)) = open_step.filter(|(t, ..)| *t == turn) {
        for (call_id, logged) in unanswered_calls(&events[start..], step_turn, step) {
            let (code, text) = if logged {
                (TOOL_INTERRUPTED_CODE, TOOL_INTERRUPTED_TEXT)
            } else {
                (TOOL_NOT_STARTED_CODE, TOOL_NOT_STARTED_TEXT)
            };
            let data = EventData::ToolResult {
                turn: step_turn,
                step,
                message: Message::tool_result(call_id, vec![ContentBlock::text(text)], true),
                error: Some(Box::new(ToolResultError {
                    name: "ToolError".into(),
                    code: code.into(),
                })),
                meta: None,
            };
            push(events, data, Some(SurfaceMeta::append()));
        }
        push(
            events,
            EventData::StepEnd {
                turn: step_turn,
                step,
            },
            None,
        );
    }
    push(
        events,
        EventData::TurnEnd {
            turn,
            reason: TurnEndReason::Interrupted,
        },
        None,
    );
    true
}

/// The calls of step `(turn, step)` (events starting at its `step/start`) that no `tool/result`
/// answered, in order of first appearance, each with whether a `tool/call` was logged for it.
fn unanswered_calls(step_events: &[SessionEvent], turn: u64, step: u64) -> Vec<(CallId, bool)> {
    // First-seen order, deduplicated through a set (a linear `contains` made a hostile step
    // with many calls quadratic to repair).
    let mut order: Vec<CallId> = Vec::new();
    let mut seen: HashSet<CallId> = HashSet::new();
    let mut logged: HashSet<CallId> = HashSet::new();
    let mut answered: HashSet<CallId> = HashSet::new();
    let mut note = |order: &mut Vec<CallId>, id: &CallId| {
        if seen.insert(id.clone()) {
            order.push(id.clone());
        }
    };
    for ev in step_events {
        if ev.data.step_scope() != Some((turn, step)) {
            continue;
        }
        match &ev.data {
            EventData::AssistantMessage { message, .. } => {
                for block in &message.content {
                    if let ContentBlock::ToolCall { id, .. } = block {
                        note(&mut order, id);
                    }
                }
            }
            EventData::ToolCall { call_id, .. } => {
                note(&mut order, call_id);
                logged.insert(call_id.clone());
            }
            EventData::ToolResult { message, .. } => {
                for block in &message.content {
                    if let ContentBlock::ToolResult { tool_call_id, .. } = block {
                        answered.insert(tool_call_id.clone());
                    }
                }
            }
            _ => {}
        }
    }
    order
        .into_iter()
        .filter(|id| !answered.contains(id))
        .map(|id| {
            let was_logged = logged.contains(&id);
            (id, was_logged)
        })
        .collect()
}
