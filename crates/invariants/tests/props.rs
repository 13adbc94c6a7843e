//! Property tests: arbitrary damage to valid logs never panics and always yields a clean report
//! or typed violations; the structural mutations are always caught; what the online observer
//! lets through always replays clean offline.

use std::sync::Arc;

use agent::{Session, SessionEvent, SessionId};
use invariants::synthetic::{self, LogBuilder, SyntheticLog, child_header};
use invariants::{InvariantObserver, Report, RuleId, replay_jsonl_reader, replay_log};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Mutation {
    Drop(usize),
    Duplicate(usize),
    Swap(usize, usize),
    Insert(usize, String),
    Truncate(usize),
    Flip(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Drop),
        any::<usize>().prop_map(Mutation::Duplicate),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
        (
            any::<usize>(),
            prop_oneof![
                ".{0,24}",
                Just("{}".to_owned()),
                Just("[1,2]".to_owned()),
                Just("{\"type\":\"turn/start\",\"seq\":0,\"time\":0,\"data\":{\"turn\":1}}".to_owned())
            ]
        )
            .prop_map(|(a, s)| Mutation::Insert(a, s)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(a, b)| Mutation::Flip(a, b)),
    ]
}

/// A valid log: top-level, or a subagent child with its descriptor in every turn's place.
fn valid() -> impl Strategy<Value = SyntheticLog> {
    (1u64..4, 1u64..4, 0u64..3, any::<bool>()).prop_map(|(turns, steps, calls, child)| {
        if child {
            let parent = synthetic::header("parent");
            let mut b = LogBuilder::new(child_header("child", &parent, 0));
            b.turn(steps, calls, Some("spawn"));
            for _ in 1..turns {
                b.turn(steps, calls, None);
            }
            b.build()
        } else {
            synthetic::valid_log("top", turns, steps, calls)
        }
    })
}

fn apply(text: &str, mutations: &[Mutation]) -> Vec<u8> {
    let mut lines: Vec<Vec<u8>> = text.lines().map(|l| l.as_bytes().to_vec()).collect();
    let mut tail: Option<usize> = None;
    for m in mutations {
        let n = lines.len().max(1);
        match m {
            Mutation::Drop(i) if !lines.is_empty() => {
                lines.remove(i % n);
            }
            Mutation::Duplicate(i) if !lines.is_empty() => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Mutation::Swap(a, b) if !lines.is_empty() => lines.swap(a % n, b % n),
            Mutation::Insert(i, s) => lines.insert(i % (lines.len() + 1), s.as_bytes().to_vec()),
            Mutation::Truncate(at) => tail = Some(*at),
            Mutation::Flip(i, b) if !lines.is_empty() => {
                let line = &mut lines[i % n];
                if !line.is_empty() {
                    let at = i % line.len();
                    line[at] = *b;
                }
            }
            _ => {}
        }
    }
    let mut bytes = lines.join(&b'\n');
    bytes.push(b'\n');
    if let Some(at) = tail {
        bytes.truncate(at % (bytes.len() + 1));
    }
    bytes
}

fn read(bytes: &[u8]) -> Report {
    replay_jsonl_reader(&SessionId::new("fallback"), bytes).expect("in-memory reads do not fail")
}

fn assert_typed(report: &Report) {
    for v in &report.violations {
        assert!(RuleId::ALL.contains(&v.rule), "unknown rule {:?}", v.rule);
        assert!(!v.session.as_str().is_empty());
        assert!(!v.expected.is_empty());
        let text = v.to_string();
        assert!(text.starts_with(&format!("[{}] session ", v.rule)), "{text}");
        assert!(text.contains(": expected "), "{text}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any damage to a valid log yields a report of typed violations (or a clean one), never a
    /// panic.
    #[test]
    fn damaged_logs_never_panic(log in valid(), mutations in prop::collection::vec(mutation(), 0..5)) {
        let bytes = apply(&log.to_jsonl(), &mutations);
        let report = read(&bytes);
        assert_typed(&report);
        if mutations.is_empty() {
            prop_assert!(report.is_clean(), "{:#?}", report.violations);
        }
    }

    /// Arbitrary bytes never panic either.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        assert_typed(&read(&bytes));
    }

    /// Dropping any event line but the last leaves a seq gap, and is always caught.
    #[test]
    fn dropping_an_inner_event_is_caught(log in valid(), i in any::<usize>()) {
        let n = log.events.len();
        let at = i % (n - 1);
        let mut events = log.events.clone();
        events.remove(at);
        let report = replay_log(Some(&log.header), &events);
        prop_assert!(!report.is_clean());
        prop_assert!(report.violations.iter().any(|v| v.seq == Some(at as u64 + 1)), "{:#?}", report.violations);
    }

    /// Duplicating any event is an S1 violation at that event's seq.
    #[test]
    fn duplicating_an_event_is_caught(log in valid(), i in any::<usize>()) {
        let at = i % log.events.len();
        let mut events = log.events.clone();
        events.insert(at, events[at].clone());
        let report = replay_log(Some(&log.header), &events);
        prop_assert!(report.violations.iter().any(|v| v.rule == RuleId::S1 && v.seq == Some(at as u64)));
    }

    /// Swapping two different events is always caught.
    #[test]
    fn swapping_events_is_caught(log in valid(), a in any::<usize>(), b in any::<usize>()) {
        let n = log.events.len();
        let (a, b) = (a % n, b % n);
        prop_assume!(a != b);
        let mut events = log.events.clone();
        events.swap(a, b);
        prop_assert!(!replay_log(Some(&log.header), &events).is_clean());
    }

    /// Whatever the online observer accepts replays clean offline: the two engines agree.
    #[test]
    fn online_acceptance_replays_clean(log in valid(), mutations in prop::collection::vec(mutation(), 0..4)) {
        let bytes = apply(&log.to_jsonl(), &mutations);
        let events: Vec<SessionEvent> = bytes
            .split(|b| *b == b'\n')
            .skip(1)
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        let obs = InvariantObserver::shared();
        let session = Arc::new(Session::new(log.header.clone(), None).unwrap());
        session.publish(vec![obs.clone()]);
        for ev in events {
            let _ = session.append_at(ev.data, ev.surface, ev.time);
        }
        let accepted = session.events();
        let report = replay_log(Some(session.header()), accepted.iter().map(|e| &**e));
        prop_assert!(report.is_clean(), "{:#?}", report.violations);
        if mutations.is_empty() {
            prop_assert_eq!(accepted.len(), log.events.len());
            prop_assert!(obs.violations().is_empty());
        }
    }
}
