//! The consumed-work fold (spec §10, checklist SPN-1 … SPN-11).

mod common;

use std::sync::Arc;

use agent::{CancelCause, ConsumedWork, EventData, SessionEvent, TurnEndReason, fold_consumed_work};
use common::{Log, aborted, completed, errored};

fn turn_end_of(work: &ConsumedWork) -> Option<u64> {
    work.end_turn()
}

/// spec: SPN-1
#[test]
fn spn_1_a_log_that_consumed_no_work_folds_to_no_end_and_no_drop() {
    let mut log = Log::new();
    log.accept("queued");
    assert_eq!(fold_consumed_work(log.events()), ConsumedWork::default());
    assert_eq!(
        fold_consumed_work(log.events()),
        ConsumedWork {
            end: None,
            dropped_unrun: false
        }
    );
    // The empty log, too.
    assert_eq!(
        fold_consumed_work(Vec::<SessionEvent>::new()),
        ConsumedWork::default()
    );
}

/// spec: SPN-2
#[test]
fn spn_2_the_fold_reports_the_latest_turn_that_entered_a_model_step() {
    let mut log = Log::new();
    log.stepped_turn(1, completed())
        .stepped_turn(2, TurnEndReason::MaxTokens);
    let work = fold_consumed_work(log.events());
    assert_eq!(
        work.end.map(|e| e.data),
        Some(EventData::TurnEnd {
            turn: 2,
            reason: TurnEndReason::MaxTokens
        })
    );
    assert!(!work.dropped_unrun);
}

/// spec: SPN-3
#[test]
fn spn_3_a_turn_that_claimed_input_then_failed_before_any_step_is_the_accounting_turn() {
    let mut log = Log::new();
    log.stepped_turn(1, completed())
        .turn_start(2)
        .claim()
        .turn_end(2, errored("ENOSPC"));
    let work = fold_consumed_work(log.events());
    assert_eq!(work.end.as_ref(), Some(log.last()));
    assert_eq!(work.end_reason(), Some(&errored("ENOSPC")));
}

/// spec: SPN-4
#[test]
fn spn_4_a_turn_that_claimed_input_then_was_stopped_before_any_step_is_the_accounting_turn() {
    let mut log = Log::new();
    log.stepped_turn(1, completed())
        .turn_start(2)
        .claim()
        .turn_end(2, aborted(CancelCause::User));
    let work = fold_consumed_work(log.events());
    assert_eq!(work.end.as_ref(), Some(log.last()));
    assert_eq!(turn_end_of(&work), Some(2));
}

/// spec: SPN-5
#[test]
fn spn_5_turns_stopped_failed_or_rejected_without_claiming_input_are_ignored() {
    let mut log = Log::new();
    log.stepped_turn(1, completed());
    let first_end = log.last().clone();
    log.turn_start(2)
        .turn_end(2, aborted(CancelCause::Parent))
        .turn_start(3)
        .turn_end(3, errored("x"))
        .turn_start(4)
        .turn_end(4, TurnEndReason::Blocked);
    let work = fold_consumed_work(log.events());
    assert_eq!(work.end, Some(first_end));
    assert_eq!(turn_end_of(&work), Some(1));
}

/// spec: SPN-6
#[test]
fn spn_6_a_claimed_then_rejected_blocked_turn_is_the_accounting_turn() {
    let mut log = Log::new();
    log.stepped_turn(1, completed())
        .turn_start(2)
        .claim()
        .turn_end(2, TurnEndReason::Blocked);
    let work = fold_consumed_work(log.events());
    assert_eq!(turn_end_of(&work), Some(2));
    assert_eq!(work.end_reason(), Some(&TurnEndReason::Blocked));
}

/// spec: SPN-7
#[test]
fn spn_7_a_claim_that_its_own_turn_emptied_is_ignored() {
    let mut log = Log::new();
    log.stepped_turn(1, completed())
        .turn_start(2)
        .claim()
        .turn_end(2, completed());
    assert_eq!(turn_end_of(&fold_consumed_work(log.events())), Some(1));
}

/// spec: SPN-8
#[test]
fn spn_8_a_claim_with_no_open_turn_is_credited_to_no_turn() {
    let mut log = Log::new();
    // An owned suffix can begin inside a turn whose start it does not contain.
    log.stepped_turn(1, completed())
        .claim()
        .turn_end(2, aborted(CancelCause::User));
    assert_eq!(turn_end_of(&fold_consumed_work(log.events())), Some(1));

    // The same shape as a suffix starting mid-turn: nothing accounts for work.
    let mut suffix = Log::new();
    suffix.claim().turn_end(7, aborted(CancelCause::User));
    assert_eq!(fold_consumed_work(suffix.events()), ConsumedWork::default());
}

/// spec: SPN-9
#[test]
fn spn_9_work_cancelled_out_of_the_inbox_after_the_last_accounting_turn_sets_dropped_unrun() {
    let mut log = Log::new();
    log.stepped_turn(1, completed());
    let end = log.last().clone();
    log.accept("never runs").cancel_pending();
    assert_eq!(
        fold_consumed_work(log.events()),
        ConsumedWork {
            end: Some(end),
            dropped_unrun: true
        }
    );
    // Without any accounting turn, a drop is still reported.
    let mut only_drop = Log::new();
    only_drop.accept("never runs").cancel_pending();
    assert_eq!(
        fold_consumed_work(only_drop.events()),
        ConsumedWork {
            end: None,
            dropped_unrun: true
        }
    );
}

/// spec: SPN-10
#[test]
fn spn_10_a_cancellation_that_inserts_a_replacement_is_not_counted_as_dropped() {
    let mut log = Log::new();
    log.stepped_turn(1, completed()).cancel_replacing("rewritten");
    let work = fold_consumed_work(log.events());
    assert!(!work.dropped_unrun);
    assert_eq!(turn_end_of(&work), Some(1));
}

/// spec: SPN-11
#[test]
fn spn_11_a_later_accounting_turn_absorbs_an_earlier_drop() {
    let mut log = Log::new();
    log.stepped_turn(1, completed())
        .cancel_pending()
        .stepped_turn(2, completed());
    assert_eq!(
        fold_consumed_work(log.events()),
        ConsumedWork {
            end: Some(log.last().clone()),
            dropped_unrun: false
        }
    );
    // A no-op turn closing after the drop does not absorb it.
    let mut noop = Log::new();
    noop.stepped_turn(1, completed())
        .cancel_pending()
        .turn_start(2)
        .turn_end(2, completed());
    let work = fold_consumed_work(noop.events());
    assert_eq!(turn_end_of(&work), Some(1));
    assert!(work.dropped_unrun);
}

#[test]
fn a_claimed_turn_with_an_unknown_reason_accounts_for_its_input() {
    let mut log = Log::new();
    let unknown: TurnEndReason = serde_json::from_value(serde_json::json!({"kind": "exploded"})).unwrap();
    log.stepped_turn(1, completed())
        .turn_start(2)
        .claim()
        .turn_end(2, unknown.clone());
    let work = fold_consumed_work(log.events());
    assert_eq!(work.end_reason(), Some(&unknown));
}

#[test]
fn a_claimed_turn_ended_by_crash_repair_accounts_for_its_input() {
    let mut log = Log::new();
    log.turn_start(1).claim().turn_end(1, TurnEndReason::Interrupted);
    assert_eq!(turn_end_of(&fold_consumed_work(log.events())), Some(1));
}

#[test]
fn a_cancellation_without_removed_count_is_ignored() {
    let mut log = Log::new();
    log.push(EventData::InboxSpliced(agent::InboxSplice {
        target: agent::InboxTarget::NextStep,
        start: 0,
        removed_count: None,
        inserted: vec![],
        outcome: Some(agent::event::SpliceOutcome::Canceled),
    }));
    assert!(!fold_consumed_work(log.events()).dropped_unrun);
}

#[test]
fn the_fold_accepts_arcs_references_and_owned_events() {
    let mut log = Log::new();
    log.stepped_turn(1, completed());
    let expected = fold_consumed_work(log.events());
    let arcs: Vec<Arc<SessionEvent>> = log.events().iter().cloned().map(Arc::new).collect();
    assert_eq!(fold_consumed_work(&arcs), expected);
    assert_eq!(fold_consumed_work(arcs.iter()), expected);
    assert_eq!(fold_consumed_work(log.events().to_vec()), expected);
}
