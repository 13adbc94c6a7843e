//! The balanced completed-turn prefix (spec §4.8) and turn-number continuation.
//!
//! A fork child is seeded with its parent's history up to the last *completed* turn: the
//! delegation usually happens from inside a tool call of the parent's open turn, and
//! everything after the last `turn/end` (the in-flight turn, inbox splices for it, policy
//! switches made since) belongs to the parent's present, not to its history.

use crate::event::EventData;
use crate::fold::AsEvent;

/// The balanced completed-turn prefix of a live log: `events[0..=k]`, where `k` is the
/// position of the **last** `turn/end` (empty when there is none).
///
/// In a valid log `seq == index`, so `k` is also that event's seq and the prefix is contiguous
/// from seq 0. For a log produced by an agent loop the prefix has no open turn or step, every
/// `tool/call` in it sits in a closed step, and it excludes the in-flight turn and every event
/// after the last `turn/end` — including trailing log-only events, which the store's general
/// fork would keep. [`is_balanced`] checks the structural part.
///
/// The function only looks at event types; it never panics, whatever the log holds. For an
/// ill-formed log (a `turn/end` while a step is open, turns out of order) the result is still
/// the slice up to the last `turn/end`, which may then not be balanced.
pub fn balanced_completed_turn_prefix<E: AsEvent>(events: &[E]) -> &[E] {
    let end = events
        .iter()
        .rposition(|e| matches!(e.as_event().data, EventData::TurnEnd { .. }))
        .map_or(0, |k| k + 1);
    &events[..end]
}

/// The number the next `turn/start` of a log continues with: one more than the turn of the
/// last `turn/start`, or 1 when the log has none.
///
/// Turn numbers continue after a seed, so a child seeded with a parent's prefix numbers its
/// first turn `next_turn_number(&seed)`. Saturates instead of overflowing on a corrupt log
/// that names turn `u64::MAX`.
pub fn next_turn_number<I>(events: I) -> u64
where
    I: IntoIterator,
    I::Item: AsEvent,
{
    events
        .into_iter()
        .filter_map(|e| match e.as_event().data {
            EventData::TurnStart { turn } => Some(turn),
            _ => None,
        })
        .last()
        .map_or(1, |turn| turn.saturating_add(1))
}

/// Whether `events` is structurally balanced: turns and steps open and close in order
/// (`turn/start` only with no turn open; `step/start` only inside an open turn with no step
/// open and naming that turn; `step/end` closing the open step; `turn/end` closing the open
/// turn with no step open), every `tool/call` sits in an open step, and nothing is open at the
/// end.
///
/// This is the shape [`balanced_completed_turn_prefix`] yields for logs written by an agent
/// loop, and what a seed must satisfy for the agent that drives it. It is not the full
/// enclosure rule set of the invariant checker (numbering contiguity, step-scoped payloads and
/// the like are not checked here).
pub fn is_balanced<I>(events: I) -> bool
where
    I: IntoIterator,
    I::Item: AsEvent,
{
    let mut open_turn: Option<u64> = None;
    let mut open_step: Option<(u64, u64)> = None;
    for item in events {
        match item.as_event().data {
            EventData::TurnStart { turn } => {
                if open_turn.is_some() {
                    return false;
                }
                open_turn = Some(turn);
            }
            EventData::TurnEnd { turn, .. } => {
                if open_turn != Some(turn) || open_step.is_some() {
                    return false;
                }
                open_turn = None;
            }
            EventData::StepStart { turn, step } => {
                if open_turn != Some(turn) || open_step.is_some() {
                    return false;
                }
                open_step = Some((turn, step));
            }
            EventData::StepEnd { turn, step } => {
                if open_step != Some((turn, step)) {
                    return false;
                }
                open_step = None;
            }
            EventData::ToolCall { turn, step, .. } if open_step != Some((turn, step)) => return false,
            _ => {}
        }
    }
    open_turn.is_none() && open_step.is_none()
}
