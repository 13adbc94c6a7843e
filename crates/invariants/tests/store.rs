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

/// `FORK-SEED` compares seeded events by their `seq`, not by their line: a blank line inside a
/// seed (a `PARSE` finding of its own) neither makes every later seeded event "differ" from
/// the parent's nor hides a real difference behind it, which is reported at its own seq.
#[test]
fn a_fork_seed_is_compared_by_seq_across_a_damaged_line() {
    let dir = scratch("store-fork-damaged");
    let (parent, _, forked, _) = family();
    let with_blank = |log: &SyntheticLog, at: usize| -> String {
        let mut lines: Vec<String> = log.to_jsonl().lines().map(str::to_owned).collect();
        lines.insert(at, String::new());
        lines.join("\n") + "\n"
    };
    put(&dir, "parent.jsonl", &parent);
    // A blank line after the child's first seeded event (line 1 is the header).
    std::fs::write(dir.join("forked.jsonl"), with_blank(&forked, 2)).unwrap();
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["PARSE"], "{:#?}", report.violations);

    // The same in the parent's log: still only the parse finding, now the parent's.
    put(&dir, "forked.jsonl", &forked);
    std::fs::write(dir.join("parent.jsonl"), with_blank(&parent, 3)).unwrap();
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["PARSE"], "{:#?}", report.violations);
    assert_eq!(report.violations[0].session.as_str(), "parent");

    // A real difference behind the blank line is reported at its own seq.
    let mut altered = parent.clone();
    altered.events[4].time += 1000;
    put(&dir, "parent.jsonl", &altered);
    std::fs::write(dir.join("forked.jsonl"), with_blank(&forked, 2)).unwrap();
    let report = check_store(&dir).unwrap();
    let seeds: Vec<_> = report
        .of_rule(invariants::RuleId::FORK_SEED)
        .map(|v| (v.session.as_str().to_owned(), v.seq))
        .collect();
    assert_eq!(
        seeds,
        [("forked".to_owned(), Some(4))],
        "{:#?}",
        report.violations
    );
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

/// A log copied or renamed to another file name is one its store cannot load (it finds a
/// session by file name and refuses a header naming another): `FILE-ID`, naming the session in
/// the header and the file. The copy also duplicates the id.
#[test]
fn a_log_is_named_after_its_session() {
    let dir = scratch("store-file-id");
    let (parent, spawned, _, _) = family();
    put(&dir, "parent.jsonl", &parent);
    put(&dir, "parent-copy.jsonl", &parent);
    put(&dir, "spawned.jsonl", &spawned);
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["FILE-ID", "DUP-SESSION"]);
    let message = report.violations[0].to_string();
    assert!(
        message.contains("parent-copy.jsonl holds session parent"),
        "{message}"
    );
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

/// A settlement notice as the continuation manager delivers it (seam §2.14.8, §2.14.13).
fn notice_from(child: &str) -> agent::Message {
    let source: agent::MessageSource = serde_json::from_value(serde_json::json!({
        "kind": "subagent-settled",
        "form": "notice",
        "summary": format!("Background subagent {child} finished and will do no further work unless you send it more."),
        "senderSessionId": child,
    }))
    .unwrap();
    agent::Message::user(
        vec![agent::ContentBlock::text("It left no closing message.")],
        source,
    )
}

/// Cross-session rule (issue: invariant replay): every settlement notice a parent received names
/// a child whose `parentSession` is that parent — whether logged as a `user/message` or inserted
/// into the inbox by a splice.
#[test]
fn settlement_notices_must_come_from_the_receivers_own_children() {
    let dir = scratch("store-notice");
    let (parent, spawned, forked, grandchild) = family();
    let mut p = LogBuilder::seeded(parent.header.clone(), &parent.events);
    p.event(
        agent::EventData::UserMessage(notice_from("spawned")),
        Some(agent::SurfaceMeta::append()),
    );
    let parent = p.build();
    // The fork child received a notice from the spawn child, which is not its child.
    let mut f = LogBuilder::seeded(forked.header.clone(), &forked.events);
    f.event(
        agent::EventData::InboxSpliced(agent::InboxSplice {
            target: agent::InboxTarget::NextTurn,
            start: 0,
            removed_count: None,
            inserted: vec![notice_from("spawned")],
            outcome: None,
        }),
        None,
    );
    let forked = f.build();
    let bad_seq = forked.events.len() as u64 - 1;
    put(&dir, "parent.jsonl", &parent);
    put(&dir, "spawned.jsonl", &spawned);
    put(&dir, "forked.jsonl", &forked);
    put(&dir, "grandchild.jsonl", &grandchild);
    let report = check_store(&dir).unwrap();
    let found: Vec<&Violation> = report
        .violations
        .iter()
        .filter(|v| v.rule.as_str() == "NOTICE-PARENT")
        .collect();
    assert_eq!(found.len(), 1, "{:#?}", report.violations);
    assert_eq!(found[0].session.as_str(), "forked");
    assert_eq!(found[0].seq, Some(bad_seq));
    assert_eq!(rules(&report.violations), vec!["NOTICE-PARENT"]);
}

/// A fork child inherits its parent's history, settlement notices included: a notice the
/// parent received from its own child, copied into the fork's seed, was not received by the
/// fork child and is no finding in its log (the parent's own log is where it is checked).
/// A notice from that same sibling in the fork child's own suffix still is.
#[test]
fn a_notice_inherited_through_a_fork_seed_is_the_parents_not_the_forks() {
    let dir = scratch("store-notice-seed");
    let (parent, spawned, _, _) = family();
    // The parent hears from its spawn child between two turns, then completes another turn.
    let mut p = LogBuilder::new(parent.header.clone());
    p.turn(2, 1, None);
    p.event(
        agent::EventData::UserMessage(notice_from("spawned")),
        Some(agent::SurfaceMeta::append()),
    );
    p.turn(1, 0, None);
    let parent = p.build();
    // Forked after that turn: the seed is the parent's whole balanced log, the notice included.
    let n = parent.events.len() as u64;
    let mut f = LogBuilder::seeded(child_header("forked", &parent.header, n), &parent.events);
    f.turn(1, 0, Some("fork"));
    let forked = f.build();
    put(&dir, "parent.jsonl", &parent);
    put(&dir, "spawned.jsonl", &spawned);
    put(&dir, "forked.jsonl", &forked);
    let report = check_store(&dir).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);

    // The same notice in the fork child's own suffix is one it received itself: a finding.
    let mut f = LogBuilder::seeded(forked.header.clone(), &forked.events[..n as usize]);
    f.turn(1, 0, Some("fork"));
    f.event(
        agent::EventData::UserMessage(notice_from("spawned")),
        Some(agent::SurfaceMeta::append()),
    );
    let forked = f.build();
    put(&dir, "forked.jsonl", &forked);
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["NOTICE-PARENT"]);
    assert_eq!(
        (report.violations[0].session.as_str(), report.violations[0].seq),
        ("forked", Some(forked.events.len() as u64 - 1))
    );
}

/// `NOTICE-PARENT`: whether a notice is in a fork child's inherited seed is decided by its
/// event's own `seq`, not by its line. A blank line inside the seed (a `PARSE` finding of its
/// own) moves the parent's notice, the seed's last event, one line down: it is still the
/// parent's, no finding in the child's log. Three seed events run together on one line (two
/// lost newlines) move the fork child's own notice, its first event after the seed's end, two
/// lines up, onto a seed event's line: it is still the child's, and still a finding.
#[test]
fn a_damaged_line_in_a_fork_seed_does_not_move_notices_across_it() {
    let dir = scratch("store-notice-seed-damage");
    let (parent, spawned, _, _) = family();
    // The parent hears from its spawn child after a turn and is forked right then: the notice
    // is the seed's last event.
    let mut p = LogBuilder::new(parent.header.clone());
    p.turn(2, 1, None);
    p.event(
        agent::EventData::UserMessage(notice_from("spawned")),
        Some(agent::SurfaceMeta::append()),
    );
    let parent = p.build();
    let n = parent.events.len() as u64;
    let header = child_header("forked", &parent.header, n);
    put(&dir, "parent.jsonl", &parent);
    put(&dir, "spawned.jsonl", &spawned);
    let lines = |log: &SyntheticLog| -> Vec<String> { log.to_jsonl().lines().map(str::to_owned).collect() };
    let notices = |report: &invariants::DirReport| -> Vec<(String, Option<u64>)> {
        report
            .of_rule(invariants::RuleId::NOTICE_PARENT)
            .map(|v| (v.session.as_str().to_owned(), v.seq))
            .collect()
    };

    // A blank line after the seed's first event.
    let mut f = LogBuilder::seeded(header.clone(), &parent.events);
    f.turn(1, 0, Some("fork"));
    let mut text = lines(&f.build());
    text.insert(2, String::new());
    std::fs::write(dir.join("forked.jsonl"), text.join("\n") + "\n").unwrap();
    let report = check_store(&dir).unwrap();
    assert!(notices(&report).is_empty(), "{:#?}", report.violations);
    assert!(
        rules(&report.violations).contains(&"PARSE"),
        "the blank line is a finding: {:#?}",
        report.violations
    );

    // The seed's first three events on one line; the fork child's own notice right after the
    // seed's end.
    let mut f = LogBuilder::seeded(header, &parent.events);
    f.event(
        agent::EventData::UserMessage(notice_from("spawned")),
        Some(agent::SurfaceMeta::append()),
    );
    let forked = f.build();
    let own = forked.events.len() as u64 - 1;
    assert_eq!(own, n + 1, "after the seed and its end marker");
    let mut text = lines(&forked);
    let run_together: String = text.drain(1..4).collect();
    text.insert(1, run_together);
    std::fs::write(dir.join("forked.jsonl"), text.join("\n") + "\n").unwrap();
    let report = check_store(&dir).unwrap();
    assert_eq!(
        notices(&report),
        [("forked".to_owned(), Some(own))],
        "{:#?}",
        report.violations
    );
}

/// The findings of one store come in the same order on every run: duplicated session ids are
/// reported in the path order of their second copies, like every other finding.
#[test]
fn duplicate_sessions_are_reported_in_path_order() {
    let dir = scratch("store-dup-order");
    let ids: Vec<String> = (0..12).map(|i| format!("s{i:02}")).collect();
    for id in &ids {
        let log = synthetic::valid_log(id, 1, 1, 0);
        put(&dir, &format!("a/{id}.jsonl"), &log);
        put(&dir, &format!("b/{id}.jsonl"), &log);
    }
    let report = check_store(&dir).unwrap();
    let reported: Vec<&str> = report.violations.iter().map(|v| v.session.as_str()).collect();
    assert_eq!(reported, ids, "{:#?}", report.violations);
    assert!(
        report.violations[0].expected.ends_with(&format!(
            "{} and {} both hold it",
            dir.join("a/s00.jsonl").display(),
            dir.join("b/s00.jsonl").display()
        )),
        "{}",
        report.violations[0]
    );
}

/// A `parentSession` chain that leads back to where it started is no lineage any store can
/// hold: a parent is created before its children. Absent parents stay lenient (a store may be a
/// subtree), but a session naming itself, or two sessions naming each other, is a `LINEAGE`
/// finding for every session on the loop — also when no depth rule applies (store forks carry
/// no `origin: subagent`) and when the logs are otherwise valid.
#[test]
fn a_cycle_of_parents_is_a_lineage_violation() {
    let dir = scratch("store-lineage-cycle");
    let mut selfish = synthetic::valid_log("selfish", 1, 1, 0);
    selfish.header.parent_session = Some("selfish".into());
    put(&dir, "selfish.jsonl", &selfish);
    let report = check_store(&dir).unwrap();
    assert_eq!(rules(&report.violations), ["LINEAGE"], "{:#?}", report.violations);
    assert_eq!(report.violations[0].session.as_str(), "selfish");
    assert!(
        report.violations[0].expected.contains("names itself"),
        "{}",
        report.violations[0]
    );

    let dir = scratch("store-lineage-cycle-2");
    // a → b → c → a, with d hanging off the loop (d → a): d's chain never returns to d.
    for (id, parent) in [("a", "c"), ("b", "a"), ("c", "b"), ("d", "a")] {
        let mut log = synthetic::valid_log(id, 1, 1, 0);
        log.header.parent_session = Some(parent.into());
        put(&dir, &format!("{id}.jsonl"), &log);
    }
    let report = check_store(&dir).unwrap();
    assert_eq!(
        rules(&report.violations),
        ["LINEAGE", "LINEAGE", "LINEAGE"],
        "{:#?}",
        report.violations
    );
    let sessions: Vec<&str> = report.violations.iter().map(|v| v.session.as_str()).collect();
    assert_eq!(sessions, ["a", "b", "c"]);
    assert!(
        report.violations[0].expected.contains("a cycle of 3 sessions"),
        "{}",
        report.violations[0]
    );

    // A long chain without a loop is still clean (and walked once, not once per session).
    let dir = scratch("store-lineage-chain");
    for i in 0..200 {
        let mut log = synthetic::valid_log(&format!("s{i:03}"), 1, 1, 0);
        if i > 0 {
            log.header.parent_session = Some(format!("s{:03}", i - 1).as_str().into());
        }
        put(&dir, &format!("s{i:03}.jsonl"), &log);
    }
    assert!(check_store(&dir).unwrap().is_clean());
}
