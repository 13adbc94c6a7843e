//! Cross-session rules over a store directory.

mod common;

use std::path::Path;

use common::scratch;
use invariants::synthetic::{self, LogBuilder, SyntheticLog, child_header};
use invariants::{Violation, check_store, replay_dir};

fn rules(violations: &[Violation]) -> Vec<&'static str> {
    violations.iter().map(|v| v.rule.as_str()).collect()
}

fn put(dir: &Path, name: &str, log: &SyntheticLog) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, log.to_jsonl()).unwrap();
}

/// A parent with two completed turns, a spawn child, a fork child seeded with the parent's
/// whole (balanced) log, and a spawn grandchild under the fork.
fn family() -> (SyntheticLog, SyntheticLog, SyntheticLog, SyntheticLog) {
    let parent = synthetic::valid_log("parent", 2, 2, 1);
    let mut b = LogBuilder::new(child_header("spawned", &parent.header, 0));
    b.turn(2, 1, Some("spawn"));
    let spawned = b.build();
    let n = parent.events.len() as u64;
    let mut b = LogBuilder::seeded(child_header("forked", &parent.header, n), &parent.events);
    b.turn(1, 0, Some("fork"));
    let forked = b.build();
    let mut b = LogBuilder::new(child_header("grandchild", &forked.header, 0));
    b.turn(1, 0, Some("spawn"));
    (parent, spawned, forked, b.build())
}

#[test]
fn a_consistent_family_is_clean() {
    let dir = scratch("store-clean");
    let (parent, spawned, forked, grandchild) = family();
    put(&dir, "parent.jsonl", &parent);
    put(&dir, "children/spawned.jsonl", &spawned);
    put(&dir, "children/forked.jsonl", &forked);
    put(&dir, "children/deeper/grandchild.jsonl", &grandchild);
    let report = check_store(&dir).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.logs, 4);
    assert_eq!(
        report,
        replay_dir(&dir).unwrap(),
        "no cross-session findings either"
    );
}

#[test]
fn a_child_depth_must_be_its_parents_plus_one() {
    let dir = scratch("store-depth");
    let (parent, mut spawned, _, _) = family();
    spawned.header.delegation_depth = Some(3);
    put(&dir, "parent.jsonl", &parent);
    put(&dir, "spawned.jsonl", &spawned);
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["DEPTH"]);
    let v = &report.violations[0];
    assert_eq!(v.session.as_str(), "spawned");
    assert!(
        v.expected
            .contains("delegationDepth 1 (parent parent is at depth 0), got 3"),
        "{v}"
    );
    // Per log, depth 3 is a plausible value: only the store sees the relation.
    assert!(replay_dir(&dir).unwrap().is_clean());
}

#[test]
fn a_fork_seed_must_equal_the_parents_prefix() {
    let dir = scratch("store-fork");
    let (parent, _, forked, _) = family();
    put(&dir, "forked.jsonl", &forked);
    // The parent's log as stored differs at event 3 (another time stamp).
    let mut altered = parent.clone();
    altered.events[3].time += 1000;
    put(&dir, "parent.jsonl", &altered);
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["FORK-SEED"]);
    let v = &report.violations[0];
    assert_eq!((v.session.as_str(), v.seq), ("forked", Some(3)));

    // A parent log shorter than the seed.
    let mut short = parent.clone();
    short.events.truncate(4);
    put(&dir, "parent.jsonl", &short);
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["FORK-SEED"]);
    assert!(
        report.violations[0].expected.contains("holds 4"),
        "{}",
        report.violations[0]
    );

    // A parent that kept working after the fork is fine: only the prefix is compared.
    let mut grown = LogBuilder::new(parent.header.clone());
    for _ in 0..3 {
        grown.turn(2, 1, None);
    }
    put(&dir, "parent.jsonl", &grown.build());
    assert!(check_store(&dir).unwrap().is_clean());
}

#[test]
fn an_absent_parent_is_lenient() {
    let dir = scratch("store-absent");
    let (_, spawned, forked, grandchild) = family();
    put(&dir, "spawned.jsonl", &spawned);
    put(&dir, "forked.jsonl", &forked);
    put(&dir, "grandchild.jsonl", &grandchild);
    let report = check_store(&dir).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

#[test]
fn session_ids_are_unique_in_a_store() {
    let dir = scratch("store-dup");
    let (parent, spawned, _, _) = family();
    put(&dir, "a/parent.jsonl", &parent);
    put(&dir, "b/parent.jsonl", &parent);
    put(&dir, "spawned.jsonl", &spawned);
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["DUP-SESSION"]);
    assert_eq!(report.violations[0].session.as_str(), "parent");
}

#[test]
fn per_log_rules_still_apply_in_a_store() {
    let dir = scratch("store-perlog");
    let (parent, spawned, _, _) = family();
    put(&dir, "parent.jsonl", &parent);
    let mut text = spawned.to_jsonl();
    text.push_str("{\"torn\": tr");
    std::fs::write(dir.join("spawned.jsonl"), text).unwrap();
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["TORN"]);
    assert!(check_store(&dir.join("nope")).is_err());
}
