//! The consumed-work fold (spec §10): how a log accounts for the work it consumed.
//!
//! Turn boundaries alone cannot say whether a turn did real work: a turn that stopped before
//! its first step closes exactly like the no-op turns a rejection or an emptied claim
//! produces. The inbox's own record fills the gap: every inbox mutation is logged as an
//! `agent/inbox/spliced` event, claims carry `removedCount`, and cancellations carry
//! `outcome: canceled`. [`fold_consumed_work`] combines both into a [`ConsumedWork`].
//!
//! This module also defines [`AsEvent`], the input abstraction shared by the pure functions
//! over logs ([`fold_consumed_work`], [`crate::prefix`], [`crate::history`],
//! [`crate::policy`]): they accept owned events, references and `Arc`s alike.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::event::{EventData, SessionEvent};
use crate::turn::TurnEndReason;

/// Anything that can be viewed as a [`SessionEvent`]: the event itself, an `Arc` of it (the
/// shape [`Session::events`](crate::Session::events) hands out), or a reference to either.
///
/// The pure functions over logs take `impl IntoIterator<Item: AsEvent>` (or `&[impl AsEvent]`),
/// so `&[SessionEvent]`, `&Vec<Arc<SessionEvent>>` and `snapshot.iter()` all work unchanged.
pub trait AsEvent {
    /// The event this value stands for.
    fn as_event(&self) -> &SessionEvent;
}

impl AsEvent for SessionEvent {
    fn as_event(&self) -> &SessionEvent {
        self
    }
}

impl AsEvent for Arc<SessionEvent> {
    fn as_event(&self) -> &SessionEvent {
        self
    }
}

impl AsEvent for Box<SessionEvent> {
    fn as_event(&self) -> &SessionEvent {
        self
    }
}

impl<T: AsEvent + ?Sized> AsEvent for &T {
    fn as_event(&self) -> &SessionEvent {
        (**self).as_event()
    }
}

/// How one log (or an owned suffix of one) accounts for the work it consumed.
///
/// Returned by [`fold_consumed_work`]. The default value (no `end`, nothing dropped) is what a
/// log that consumed no work folds to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConsumedWork {
    /// The latest closed turn that accounts for consumed work: its `turn/end` event. A turn
    /// accounts for work when it entered a model step, or when it claimed inbox input and then
    /// ended any way other than `completed` (`blocked`, `aborted`, `interrupted`, `error`, or
    /// an unknown reason). `None` when no turn closed over any work.
    pub end: Option<SessionEvent>,
    /// Whether accepted work was cancelled out of the inbox, unrun, after [`end`](Self::end)
    /// (or anywhere, when there is no `end`). A cancellation that inserted a replacement does
    /// not count: the work stays pending under a new identity.
    pub dropped_unrun: bool,
}

impl ConsumedWork {
    /// The accounting turn's end reason, if there is an accounting turn.
    pub fn end_reason(&self) -> Option<&TurnEndReason> {
        match &self.end.as_ref()?.data {
            EventData::TurnEnd { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// The accounting turn's number, if there is an accounting turn.
    pub fn end_turn(&self) -> Option<u64> {
        match &self.end.as_ref()?.data {
            EventData::TurnEnd { turn, .. } => Some(*turn),
            _ => None,
        }
    }
}

/// Whether a turn that claimed input but never reached a step accounts for that input by the
/// way it ended. Only `completed` does not: its claim was rewritten away and nothing was left
/// to run. Every other ending — including reasons this crate does not know — is that input's
/// ending.
fn ending_accounts_for_claim(reason: &TurnEndReason) -> bool {
    !matches!(reason, TurnEndReason::Completed)
}

/// Folds a log, or an owned suffix of one, into its account of consumed work (spec §10).
///
/// One pass over `events`, in order, keeping the open turn number, the turns that opened a
/// `step/start` ("stepped") and the turns that claimed inbox input:
///
/// * an `agent/inbox/spliced` with `removedCount` and no `outcome` seen while a turn is open
///   is a claim by that turn; seen with no open turn (a suffix that starts mid-turn) it is
///   credited to no turn;
/// * an `agent/inbox/spliced` with `removedCount` and `outcome: canceled` that inserts nothing
///   sets `dropped_unrun`; one that inserts a replacement does not; splices without
///   `removedCount` (plain inserts) are ignored;
/// * at `turn/end {turn, reason}` the open turn closes; the turn accounts for work when it
///   stepped, or when it claimed input and `reason` is not `completed`. An accounting turn
///   becomes [`ConsumedWork::end`] and resets `dropped_unrun` (a drop before it closed is
///   reported by its own ending).
///
/// Consequences: no-op turns never mask an earlier real outcome, a claimed-then-rejected turn
/// reports `blocked`, and an emptied claim is ignored.
///
/// Never panics: ill-formed logs (unbalanced turns, mismatched numbers, any order) simply fold
/// by the same rules. Turns are keyed by the numbers their events carry.
pub fn fold_consumed_work<I>(events: I) -> ConsumedWork
where
    I: IntoIterator,
    I::Item: AsEvent,
{
    // Turn-number sets. In a well-formed log each holds at most the open turn (entries leave at
    // their `turn/end`), so a vector beats hashing; ill-formed logs still fold by the same rules.
    let mut stepped = TurnSet::default();
    let mut claimed = TurnSet::default();
    let mut open: Option<u64> = None;
    let mut end: Option<SessionEvent> = None;
    let mut dropped_unrun = false;
    for item in events {
        let event = item.as_event();
        match &event.data {
            EventData::TurnStart { turn } => open = Some(*turn),
            EventData::StepStart { turn, .. } => {
                stepped.insert(*turn);
            }
            EventData::InboxSpliced(splice) => {
                if splice.removed_count.is_none() {
                    continue;
                }
                if splice.is_cancellation() {
                    dropped_unrun |= splice.inserted.is_empty();
                } else if let Some(turn) = open {
                    claimed.insert(turn);
                }
            }
            EventData::TurnEnd { turn, reason } => {
                open = None;
                let was_stepped = stepped.remove(turn);
                let was_claimed = claimed.remove(turn);
                if was_stepped || (was_claimed && ending_accounts_for_claim(reason)) {
                    end = Some(event.clone());
                    dropped_unrun = false;
                }
            }
            _ => {}
        }
    }
    ConsumedWork { end, dropped_unrun }
}

/// A small set of turn numbers (see [`fold_consumed_work`]). The first member lives inline, so
/// a well-formed log (at most the open turn in each set) folds without allocating; the others
/// live in an ordered set, so a malformed log with many turns that never close still folds in
/// O(n log n) rather than quadratic time.
#[derive(Default)]
struct TurnSet {
    first: Option<u64>,
    rest: BTreeSet<u64>,
}

impl TurnSet {
    fn insert(&mut self, turn: u64) {
        if self.first == Some(turn) {
            return;
        }
        // `first` is empty only when `rest` is (a removal refills it from `rest`).
        if self.first.is_none() {
            self.first = Some(turn);
        } else {
            self.rest.insert(turn);
        }
    }

    /// Removes `turn`, returning whether it was present.
    fn remove(&mut self, turn: &u64) -> bool {
        if self.first == Some(*turn) {
            self.first = self.rest.pop_first();
            return true;
        }
        self.rest.remove(turn)
    }
}

#[cfg(test)]
mod tests {
    use super::TurnSet;
    use std::collections::BTreeSet;

    /// The inline-first set behaves as a set under any interleaving (ill-formed logs use more
    /// than one member).
    #[test]
    fn turn_set_is_a_set() {
        let mut set = TurnSet::default();
        let mut model = BTreeSet::new();
        let mut x: u64 = 7;
        for _ in 0..2000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let turn = (x >> 60) % 6;
            if (x >> 40) & 1 == 0 {
                set.insert(turn);
                model.insert(turn);
            } else {
                assert_eq!(set.remove(&turn), model.remove(&turn), "turn {turn}");
            }
            let mut members: Vec<u64> = set.first.into_iter().chain(set.rest.iter().copied()).collect();
            members.sort_unstable();
            assert_eq!(members, model.iter().copied().collect::<Vec<_>>());
        }
    }
}
