//! The balanced completed-turn prefix and turn-number continuation (spec §4.8).

mod common;

use std::sync::Arc;

use agent::prefix::is_balanced;
use agent::{CancelCause, SessionEvent, balanced_completed_turn_prefix, next_turn_number};
use common::{Log, aborted, completed};

#[test]
fn a_log_without_turn_end_has_an_empty_prefix() {
    assert!(balanced_completed_turn_prefix::<SessionEvent>(&[]).is_empty());
    let mut log = Log::new();
    log.user("hi")
        .other("subagent/descriptor")
        .turn_start(1)
        .step_start(1, 1);
    assert!(balanced_completed_turn_prefix(log.events()).is_empty());
}

#[test]
fn the_prefix_ends_at_the_last_turn_end_and_excludes_the_in_flight_turn_and_trailing_events() {
    let mut log = Log::new();
    log.other("sandbox-ish/log-only")
        .turn_start(1)
        .claim()
        .step_start(1, 1)
        .user("task")
        .tool_call(1, 1, "c1")
        .tool_result(1, 1, "c1", "ok")
        .step_end(1, 1)
        .turn_end(1, completed());
    let k = log.len();
    // Everything after the last turn/end is excluded: log-only events, an inbox splice for the
    // next turn, a policy switch, and the open turn that is delegating right now.
    log.other("subagent/descriptor")
        .accept("next")
        .push(agent::EventData::SandboxMode {
            mode: "read-only".into(),
            source: None,
        })
        .turn_start(2)
        .claim()
        .step_start(2, 1)
        .tool_call(2, 1, "delegate");
    let prefix = balanced_completed_turn_prefix(log.events());
    assert_eq!(prefix, &log.events()[..k]);
    assert_eq!(prefix.last().map(|e| e.seq), Some(k as u64 - 1));
    assert!(is_balanced(prefix));
    assert!(!is_balanced(log.events()));
    assert_eq!(next_turn_number(prefix), 2);
}

#[test]
fn the_prefix_is_contiguous_from_seq_zero_and_keeps_every_completed_turn() {
    let mut log = Log::new();
    log.stepped_turn(1, completed())
        .turn_start(2)
        .turn_end(2, aborted(CancelCause::User))
        .stepped_turn(3, completed());
    let prefix = balanced_completed_turn_prefix(log.events());
    assert_eq!(prefix.len(), log.len());
    assert!(prefix.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    assert_eq!(next_turn_number(prefix), 4);
}

#[test]
fn the_prefix_works_on_arc_snapshots() {
    let mut log = Log::new();
    log.stepped_turn(1, completed()).turn_start(2);
    let arcs: Vec<Arc<SessionEvent>> = log.events().iter().cloned().map(Arc::new).collect();
    let prefix = balanced_completed_turn_prefix(&arcs);
    assert_eq!(prefix.len(), 5);
    assert!(is_balanced(prefix));
}

#[test]
fn next_turn_number_is_one_more_than_the_last_turn_start() {
    assert_eq!(next_turn_number(Vec::<SessionEvent>::new()), 1);
    let mut log = Log::new();
    log.user("no turns yet");
    assert_eq!(next_turn_number(log.events()), 1);
    log.turn_start(1);
    assert_eq!(next_turn_number(log.events()), 2);
    log.turn_end(1, completed()).turn_start(5);
    assert_eq!(next_turn_number(log.events()), 6);
    // A corrupt log naming the largest turn saturates instead of overflowing.
    log.turn_start(u64::MAX);
    assert_eq!(next_turn_number(log.events()), u64::MAX);
}

#[test]
fn is_balanced_rejects_every_kind_of_open_or_misnested_structure() {
    let cases: Vec<(&str, Log)> = vec![
        ("open turn", {
            let mut l = Log::new();
            l.turn_start(1);
            l
        }),
        ("open step at turn end", {
            let mut l = Log::new();
            l.turn_start(1).step_start(1, 1).turn_end(1, completed());
            l
        }),
        ("nested turn", {
            let mut l = Log::new();
            l.turn_start(1).turn_start(2);
            l
        }),
        ("step outside a turn", {
            let mut l = Log::new();
            l.step_start(1, 1).step_end(1, 1);
            l
        }),
        ("step naming another turn", {
            let mut l = Log::new();
            l.turn_start(1)
                .step_start(2, 1)
                .step_end(2, 1)
                .turn_end(1, completed());
            l
        }),
        ("turn end without start", {
            let mut l = Log::new();
            l.turn_end(1, completed());
            l
        }),
        ("mismatched turn end", {
            let mut l = Log::new();
            l.turn_start(1).turn_end(2, completed());
            l
        }),
        ("mismatched step end", {
            let mut l = Log::new();
            l.turn_start(1).step_start(1, 1).step_end(1, 2);
            l
        }),
        ("tool call outside a step", {
            let mut l = Log::new();
            l.turn_start(1).tool_call(1, 1, "c").turn_end(1, completed());
            l
        }),
    ];
    for (name, log) in cases {
        assert!(!is_balanced(log.events()), "{name} must not be balanced");
    }
    let mut ok = Log::new();
    ok.user("between turns").stepped_turn(1, completed()).other("x/y");
    assert!(is_balanced(ok.events()));
}
