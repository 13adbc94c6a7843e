//! Regression tests for the defects an audit of the checker found: a double-reported missing
//! `turn/end`, under-reported repeated seqs, seq gaps hidden behind an unreadable line, findings
//! dropped by an over-long line, and a tool-result message without its tool-result block.

mod common;

use agent::content::ContentBlock;
use agent::event::EventData;
use agent::{CallId, Message, SessionEvent, SessionId};
use common::*;
use invariants::{RuleId, Violation, replay_dir, replay_log, synthetic};

fn rules(violations: &[Violation]) -> Vec<&'static str> {
    violations.iter().map(|v| v.rule.as_str()).collect()
}

/// `events` renumbered with the given seqs (one per event, in order).
fn with_seqs(events: Vec<SessionEvent>, seqs: &[u64]) -> Vec<SessionEvent> {
    assert_eq!(events.len(), seqs.len());
    events
        .into_iter()
        .zip(seqs)
        .map(|(mut e, s)| {
            e.seq = *s;
            e
        })
        .collect()
}

/// spec: providers §6.4 S2, S3 — a missing `turn/end` before the next `turn/start` is one
/// defect: S2 (turn 1 is still open). The new turn's number 2 is exactly what S3 would require
/// once turn 1 were closed, so it is not also reported as "expected turn/start 1, got 2".
#[test]
fn a_missing_turn_end_is_reported_once_as_s2() {
    let report = replay_log(None, log([turn_start(1), user("hi"), turn_start(2)]));
    assert_eq!(rules(&report.violations), ["S2"], "{:#?}", report.violations);
    assert_eq!(report.violations[0].seq, Some(2));
    // A skipped number on top of the missing end is a second defect, still reported (S3),
    // against the number the next turn should have had.
    let report = replay_log(None, log([turn_start(1), turn_start(3)]));
    assert_eq!(
        rules(&report.violations),
        ["S2", "S3"],
        "{:#?}",
        report.violations
    );
    assert!(
        report.violations[1].expected.contains("turn/start 2"),
        "{}",
        report.violations[1]
    );
}

/// spec: providers §6.4 S1 (seq > lastSeq; a rejected event does not advance `lastSeq`,
/// providers §6.3 (5)) — in a duplicated run `0,1,2,1,2,3` both copies (seqs 1 and 2) repeat
/// an earlier seq, so both are S1 findings, not only the first.
#[test]
fn every_event_of_a_duplicated_run_is_an_s1_finding() {
    let events = with_seqs(
        log([
            turn_start(1),
            user("a"),
            user("b"),
            user("c"),
            user("d"),
            user("e"),
        ]),
        &[0, 1, 2, 1, 2, 3],
    );
    let report = replay_log(None, &events);
    let s1: Vec<_> = report.of_rule(RuleId::S1).map(|v| v.seq).collect();
    assert_eq!(s1, [Some(1), Some(2)], "{:#?}", report.violations);
    // One renumbered event still costs one finding per defect, not one per later event.
    let events = with_seqs(
        log([turn_start(1), user("a"), user("b"), user("c"), user("d")]),
        &[0, 1, 40, 3, 4],
    );
    assert_eq!(rules(&replay_log(None, &events).violations), ["SEQ", "S1"]);
}

/// spec: spine §4.2 (1) (`SEQ`: seqs contiguous from 0) — an unreadable line occupies one seq,
/// so the next event may skip exactly that one; a larger gap behind it is still a `SEQ`
/// finding.
#[test]
fn an_unreadable_line_excuses_a_gap_of_one_seq_only() {
    let events = log([
        turn_start(1),
        user("a"),
        user("b"),
        user("c"),
        user("d"),
        user("e"),
        turn_end(1),
    ]);
    // Line 1 the header; event 2 (line 4) becomes garbage. `shift` renumbers every event after
    // it by that much.
    let text = |shift: i64| {
        let mut text = serde_json::to_string(&synthetic::header("gap")).unwrap() + "\n";
        for e in &events {
            let line = match e.seq {
                2 => "not json".to_owned(),
                s if s > 2 => {
                    let mut e = e.clone();
                    e.seq = e.seq.checked_add_signed(shift).unwrap();
                    serde_json::to_string(&e).unwrap()
                }
                _ => serde_json::to_string(e).unwrap(),
            };
            text.push_str(&line);
            text.push('\n');
        }
        invariants::replay_jsonl_reader(&SessionId::new("gap"), text.as_bytes())
            .expect("in-memory reads do not fail")
    };
    // The gap of one the garbage leaves is excused (and so is none: it may not be an event).
    for shift in [0, -1] {
        let report = text(shift);
        assert_eq!(rules(&report.violations), ["PARSE"], "{:#?}", report.violations);
    }
    // Seq 3 written as 10: a gap of eight seqs behind one unreadable line.
    let report = text(7);
    assert_eq!(
        rules(&report.violations),
        ["PARSE", "SEQ"],
        "{:#?}",
        report.violations
    );
    assert_eq!(report.violations[1].seq, Some(10));
    assert!(
        report.violations[1].expected.contains("seq 2 to 3"),
        "{}",
        report.violations[1]
    );
}

/// spec: the reader's contract (every defect of the input is a typed finding; `IO`, `PARSE`) —
/// a line beyond [`invariants::MAX_LINE_BYTES`] stops the read there, but the findings of the
/// lines before it are kept, and the over-long line is one more finding at its line.
#[test]
fn an_overlong_line_keeps_the_findings_before_it() {
    let dir = scratch("audit-overlong");
    let log = synthetic::valid_log("long", 2, 1, 0);
    // The first user message is made unreadable: a PARSE finding before the long line.
    let garbage = 1 + log
        .events
        .iter()
        .position(|e| e.type_name() == "user/message")
        .expect("a user message");
    let mut text = String::new();
    for (i, line) in log.to_jsonl().lines().enumerate() {
        text.push_str(if i == garbage { "garbage" } else { line });
        text.push('\n');
    }
    let path = dir.join("long.jsonl");
    std::fs::write(&path, &text).unwrap();
    // A sparse tail with no newline: one line longer than the bound.
    let file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    if file
        .set_len(text.len() as u64 + invariants::MAX_LINE_BYTES + 2)
        .is_err()
    {
        return; // no sparse files here: nothing to show
    }
    let report = replay_dir(&dir).unwrap();
    assert_eq!(
        rules(&report.violations),
        ["PARSE", "IO"],
        "{:#?}",
        report.violations
    );
    let long_line = log.events.len() as u64 + 2;
    assert_eq!(report.violations[0].line, Some(garbage as u64 + 1));
    assert_eq!(report.violations[1].line, Some(long_line));
    assert!(report.violations.iter().all(|v| v.session.as_str() == "long"));
    assert!(
        report
            .violations
            .iter()
            .all(|v| v.file.as_deref() == Some(path.as_path()))
    );
    assert_eq!(report.events, log.events.len() as u64);
}

/// spec: spine §3 ("a tool-result message carries exactly one `tool-result` block"), providers
/// §6.4 S12 — a `tool/result` whose message has a tool source but no tool-result block (or two
/// blocks for the same call) is a finding.
#[test]
fn a_tool_result_message_needs_exactly_one_tool_result_block() {
    let with_content = |content: Vec<ContentBlock>| {
        let mut message = Message::tool_result(CallId::new("c1"), vec![], false);
        message.content = content;
        EventData::ToolResult {
            turn: 1,
            step: 1,
            message,
            error: None,
            meta: None,
        }
    };
    let block = || ContentBlock::ToolResult {
        tool_call_id: CallId::new("c1"),
        content: vec![],
        is_error: Some(false),
    };
    let prefix = [turn_start(1), step_start(1, 1), tool_call(1, 1, "c1")];
    for (content, ok) in [
        (vec![block()], true),
        (vec![], false),
        (vec![ContentBlock::text("done")], false),
        (vec![block(), block()], false),
    ] {
        let n = content.len();
        let events = log(prefix.iter().cloned().chain([with_content(content)]));
        let report = replay_log(None, &events);
        if ok {
            assert!(report.is_clean(), "{:#?}", report.violations);
        } else {
            assert_eq!(
                rules(&report.violations),
                ["S12"],
                "{n} blocks: {:#?}",
                report.violations
            );
            assert_eq!(report.violations[0].seq, Some(3));
        }
    }
}

/// The files of a report's findings, in report order.
#[cfg(unix)]
fn files(violations: &[Violation]) -> Vec<std::path::PathBuf> {
    violations
        .iter()
        .map(|v| {
            v.file
                .clone()
                .expect("a finding read from a directory names its file")
        })
        .collect()
}

/// spec: the checker's contract (`DirReport::violations`: log by log in path order) — entries
/// that cannot be read (dangling links, unreadable subdirectories, …) are reported in their
/// path's place, not first and in whatever order the file system lists a directory, so two runs
/// over the same tree on different file systems print the same findings in the same order.
#[cfg(unix)]
#[test]
fn findings_of_a_tree_are_in_path_order_whatever_the_listing_order() {
    let dir = scratch("audit-path-order");
    let names = ["m", "c", "x", "a", "q", "f", "k", "b", "z", "d", "r", "h"];
    for name in names {
        std::os::unix::fs::symlink(dir.join("nowhere"), dir.join(format!("{name}-dangling.jsonl")))
            .expect("symlink");
        std::fs::create_dir_all(dir.join(format!("{name}-sub"))).expect("subdirectory");
        std::os::unix::fs::symlink(dir.join("nowhere"), dir.join(format!("{name}-sub/l.jsonl")))
            .expect("symlink");
    }
    // A real log in the middle of the order, with one finding of its own.
    let log = synthetic::valid_log("g", 1, 1, 0);
    std::fs::write(dir.join("g.jsonl"), log.to_jsonl() + "\n").expect("write");

    let report = replay_dir(&dir).expect("the tree is readable");
    let got = files(&report.violations);
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got, sorted, "{:#?}", report.violations);
    assert_eq!(got.len(), 2 * names.len() + 1);
    assert!(got.contains(&dir.join("g.jsonl")));

    let report = invariants::check_store(&dir).expect("the tree is readable");
    let got = files(&report.violations);
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got, sorted, "{:#?}", report.violations);
}

/// spec: ARCHITECTURE "Data" (a torn last line is dropped on load with a warning), the
/// checker's `TORN` rule — the checker calls `TORN` exactly the last lines a store drops as an
/// interrupted write, and `PARSE` the damage a store refuses to load: a last line of zeros a
/// power loss left (newline or not) and an unterminated whitespace-only last line are torn; the
/// same zeros before another line, or a blank line ending in a newline, are not.
#[tokio::test]
async fn a_torn_last_line_is_torn_exactly_when_a_store_drops_it() {
    let dir = scratch("audit-torn-last-line");
    let log = synthetic::valid_log("t", 1, 1, 0);
    let text = log.to_jsonl();
    let zeros = [0u8; 16];
    let cases: [(&str, Vec<u8>, Option<&str>); 5] = [
        (
            "zeros-nl",
            [text.as_bytes(), &zeros, b"\n"].concat(),
            Some("TORN"),
        ),
        ("zeros", [text.as_bytes(), &zeros].concat(), Some("TORN")),
        ("blanks", [text.as_bytes(), b"   "].concat(), Some("TORN")),
        ("blank-nl", [text.as_bytes(), b"   \n"].concat(), None),
        (
            "zeros-inside",
            [
                text.as_bytes(),
                &zeros,
                b"\n",
                text.lines().nth(1).unwrap().as_bytes(),
                b"\n",
            ]
            .concat(),
            None,
        ),
    ];
    for (name, bytes, torn) in cases {
        let report = invariants::replay_jsonl_reader(&SessionId::new("t"), &bytes[..]).expect("in memory");
        let want = torn.unwrap_or("PARSE");
        assert_eq!(
            rules(&report.violations)[..1],
            [want],
            "{name}: {:#?}",
            report.violations
        );
        assert_eq!(
            report.violations[0].line,
            Some(log.events.len() as u64 + 2),
            "{name}"
        );
        // What the store does with the same file.
        let store_dir = dir.join(name);
        std::fs::create_dir_all(&store_dir).expect("dir");
        std::fs::write(store_dir.join("t.jsonl"), &bytes).expect("write");
        let loaded = agent_loop::JsonlStore::new(&store_dir)
            .load(&SessionId::new("t"))
            .await;
        match torn {
            Some(_) => assert!(loaded.expect("a torn tail loads").repaired, "{name}"),
            None => assert!(loaded.is_err(), "{name}: the store refuses the log"),
        }
    }
}

/// `surfaceOp: replace {start, end}`.
fn replacing(start: u64, end: u64) -> Option<agent::event::SurfaceMeta> {
    Some(agent::event::SurfaceMeta {
        surface_op: Some(agent::event::SurfaceOp::Replace { start, end }),
        source_event_seqs: None,
    })
}

/// spec: agent-spine §4.2 (3) (SURFACE) — a replacement must name current surface nodes,
/// `start` not after `end`, and a `tool/result` replacement must rewrite exactly one current
/// `tool/result`, changing only its result's content. A session refuses anything else on
/// append, and a store refuses a log holding it on load (`validate_log`), so the offline
/// checker must not call such a log clean; valid compactions stay clean.
#[test]
fn a_surface_replacement_must_name_current_surface_nodes() {
    // Built once: every tool/result message gets a fresh id.
    let history = log([
        turn_start(1),           // 0
        user("task"),            // 1
        step_start(1, 1),        // 2
        assistant(1, 1),         // 3
        tool_call(1, 1, "c1"),   // 4
        tool_result(1, 1, "c1"), // 5
        step_end(1, 1),          // 6
        turn_end(1),             // 7
        turn_start(2),           // 8
    ]);
    let base = || history.clone();
    let summary = |surface| SessionEvent {
        seq: 9,
        time: 9,
        data: user("summary"),
        surface,
        ignorable: false,
    };
    let rewritten = |id: &str, surface| {
        let EventData::ToolResult { message, .. } = tool_result(1, 1, id) else {
            unreachable!("a tool/result")
        };
        let mut original = base()[5].clone();
        let EventData::ToolResult { message: m, .. } = &mut original.data else {
            unreachable!("a tool/result")
        };
        // Same message id and source; only the result block's content (or its call) differs.
        let mut message = message;
        message.id = m.id.clone();
        if id == "c1" {
            message.content = vec![ContentBlock::ToolResult {
                tool_call_id: CallId::new("c1"),
                content: vec![ContentBlock::text("shortened")],
                is_error: Some(false),
            }];
        }
        *m = message;
        SessionEvent {
            seq: 9,
            surface,
            ..original
        }
    };
    let cases = [
        ("whole history", summary(replacing(1, 5)), true),
        ("one node", summary(replacing(3, 3)), true),
        ("tool/result content", rewritten("c1", replacing(5, 5)), true),
        ("reversed", summary(replacing(5, 1)), false),
        ("not a node", summary(replacing(2, 5)), false),
        ("past the end", summary(replacing(1, 40)), false),
        (
            "tool/result over two nodes",
            rewritten("c1", replacing(3, 5)),
            false,
        ),
        (
            "tool/result over a user message",
            rewritten("c1", replacing(1, 1)),
            false,
        ),
        (
            "tool/result answering another call",
            rewritten("c2", replacing(5, 5)),
            false,
        ),
    ];
    for (name, event, valid) in cases {
        let mut events = base();
        events.push(event);
        assert_eq!(
            agent::session::validate_log(&events).is_ok(),
            valid,
            "{name}: the session's own verdict: {:?}",
            agent::session::validate_log(&events)
        );
        let report = replay_log(None, &events);
        if valid {
            assert!(report.is_clean(), "{name}: {:#?}", report.violations);
        } else {
            assert_eq!(
                rules(&report.violations),
                ["SURFACE"],
                "{name}: {:#?}",
                report.violations
            );
            assert_eq!(report.violations[0].seq, Some(9), "{name}");
        }
    }
    // A replaced node is no longer current: a later replacement cannot name it.
    let mut events = base();
    events.push(summary(replacing(1, 5)));
    events.push(SessionEvent {
        seq: 10,
        ..summary(replacing(3, 3))
    });
    assert!(agent::session::validate_log(&events).is_err());
    assert_eq!(rules(&replay_log(None, &events).violations), ["SURFACE"]);
}

/// spec: providers §6.4 S1 — a seeded child's log whose event claims the greatest `seq`
/// (`u64::MAX`, which has no successor) is an ordinary finding, not an arithmetic overflow in
/// the seed-layout check (it panicked in debug builds).
#[test]
fn the_greatest_seq_in_a_seeded_child_is_a_finding_not_an_overflow() {
    let parent = synthetic::valid_log("p", 1, 1, 0);
    let header = synthetic::child_header("c", &parent.header, 2);
    let mut events = parent.events[..2].to_vec();
    events.push(SessionEvent {
        seq: u64::MAX,
        ..events[1].clone()
    });
    let report = replay_log(Some(&header), &events);
    assert!(
        report
            .violations
            .iter()
            .any(|v| v.seq == Some(u64::MAX) && v.rule == RuleId::SEQ),
        "{:#?}",
        report.violations
    );
    let text = format!(
        "{}\n{}\n",
        serde_json::to_string(&header).expect("header"),
        events
            .iter()
            .map(|e| serde_json::to_string(e).expect("event"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let read = invariants::replay_jsonl_reader(&SessionId::new("c"), text.as_bytes()).expect("read");
    assert_eq!(rules(&read.violations), rules(&report.violations));
}
