//! The offline reader: JSON-lines files and directories, malformed input, header-driven rules.

mod common;

use std::path::Path;

use agent::SessionId;
use common::*;
use invariants::synthetic::{self, LogBuilder, SyntheticLog, child_header};
use invariants::{Report, Violation, replay_dir, replay_jsonl_file, replay_jsonl_reader, replay_log};

fn rules(violations: &[Violation]) -> Vec<&'static str> {
    violations.iter().map(|v| v.rule.as_str()).collect()
}

fn read(text: &str) -> Report {
    replay_jsonl_reader(&SessionId::new("fallback"), text.as_bytes()).expect("in-memory reads do not fail")
}

fn lines(log: &SyntheticLog) -> Vec<String> {
    log.to_jsonl().lines().map(str::to_owned).collect()
}

fn join(lines: &[String]) -> String {
    let mut s = lines.join("\n");
    s.push('\n');
    s
}

/// The line (1-based, header = 1) of the first event of `kind` at or after event `from`.
fn line_of(log: &SyntheticLog, kind: &str, from: usize) -> usize {
    log.events[from..]
        .iter()
        .position(|e| e.type_name() == kind)
        .map(|i| i + from + 2)
        .expect("event present")
}

fn write(dir: &Path, name: &str, text: &str) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A subagent child of `parent` with one own turn carrying its descriptor.
fn spawn_child(id: &str, parent: &SyntheticLog) -> SyntheticLog {
    let mut b = LogBuilder::new(child_header(id, &parent.header, 0));
    b.turn(2, 1, Some("spawn"));
    b.build()
}

#[test]
fn a_valid_file_replays_clean() {
    let dir = scratch("valid-file");
    let log = synthetic::valid_log("main", 3, 2, 2);
    write(&dir, "main.jsonl", &log.to_jsonl());
    let report = replay_jsonl_file(&dir.join("main.jsonl")).unwrap();
    assert_eq!(report.session.as_str(), "main");
    assert_eq!(report.events, log.events.len() as u64);
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.open_turn, None);
}

/// Removing a `turn/end` from a valid log yields a violation naming the session and the seq.
#[test]
fn removing_a_turn_end_is_a_violation_at_its_place() {
    let log = synthetic::valid_log("cut", 3, 1, 0);
    let mut l = lines(&log);
    let at = line_of(&log, "turn/end", 0);
    l.remove(at - 1);
    let report = read(&join(&l));
    // The next event's seq skips one (SEQ), and the next turn/start finds turn 1 still open (S2);
    // its number 2 is right once turn 1 is closed, so S3 does not report the same defect again.
    let next_seq = (at - 2) as u64 + 1;
    let v = &report.violations;
    assert_eq!(rules(v), ["SEQ", "S2"], "{v:#?}");
    assert!(v.iter().all(|v| v.session.as_str() == "cut"));
    assert_eq!(v[0].seq, Some(next_seq));
    assert_eq!(v[0].line, Some(at as u64));
    assert_eq!(v[1].seq, Some(next_seq));
    assert!(
        v[1].to_string()
            .starts_with(&format!("[S2] session \"cut\" seq {next_seq} (line {at})"))
    );
}

/// Removing the final `turn/end` leaves the log inside an open turn, which the spec allows
/// (crash repair closes it on resume): reported as state, not as a violation.
#[test]
fn an_open_turn_at_the_end_of_the_log_is_allowed() {
    let log = synthetic::valid_log("open", 2, 1, 0);
    let mut l = lines(&log);
    l.pop();
    let report = read(&join(&l));
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.open_turn, Some(2));
}

/// Duplicating a child's descriptor yields a violation naming the session and the seq.
#[test]
fn duplicating_a_descriptor_is_a_violation_at_the_copy() {
    let parent = synthetic::valid_log("p", 1, 1, 0);
    let child = spawn_child("child", &parent);
    assert!(read(&child.to_jsonl()).is_clean());
    // Append a second descriptor inside the turn, right after the first.
    let mut b = LogBuilder::new(child.header.clone());
    b.event(turn_start(1), None)
        .descriptor("spawn")
        .descriptor("spawn");
    let report = read(&b.build().to_jsonl());
    assert_eq!(rules(&report.violations), ["DESCRIPTOR"]);
    let v = &report.violations[0];
    assert_eq!((v.session.as_str(), v.seq, v.line), ("child", Some(2), Some(4)));
    assert!(v.expected.contains("seq 1 already is one"), "{v}");
    // The same through a textual duplication of the line (the copy also repeats the seq).
    let mut l = lines(&child);
    let at = line_of(&child, invariants::DESCRIPTOR_TYPE, 0);
    l.insert(at, l[at - 1].clone());
    let report = read(&join(&l));
    assert_eq!(rules(&report.violations), ["S1", "DESCRIPTOR"]);
    assert!(report.violations.iter().all(|v| v.seq == Some((at - 2) as u64)));
}

/// Renumbering one seq yields a violation naming the session and the seq written.
#[test]
fn renumbering_a_seq_is_a_violation() {
    let log = synthetic::valid_log("renum", 2, 1, 0);
    let mut events = log.events.clone();
    events[4].seq = 40;
    let mut text = serde_json::to_string(&log.header).unwrap() + "\n";
    for e in &events {
        text.push_str(&serde_json::to_string(e).unwrap());
        text.push('\n');
    }
    let report = read(&text);
    let v = &report.violations;
    assert_eq!(rules(v), ["SEQ", "S1"], "{v:#?}");
    assert_eq!(
        (v[0].session.as_str(), v[0].seq, v[0].line),
        ("renum", Some(40), Some(6))
    );
    assert_eq!(v[1].seq, Some(5));
    assert!(
        v[0].to_string()
            .contains("expected seq 4 (seqs are contiguous from 0), got 40")
    );
}

#[test]
fn malformed_lines_are_typed_violations() {
    let log = synthetic::valid_log("bad", 1, 1, 0);
    let l = lines(&log);
    let n = l.len();

    let mut not_json = l.clone();
    not_json.insert(2, "this is not json".into());
    let r = read(&join(&not_json));
    assert_eq!(
        rules(&r.violations),
        ["PARSE"],
        "the unreadable line's seq gap is not reported twice"
    );
    assert_eq!(r.violations[0].line, Some(3));

    let mut shape = l.clone();
    shape[2] = r#"{"type":"turn/start","seq":1,"time":1,"data":{"turn":"one"}}"#.into();
    let r = read(&join(&shape));
    assert_eq!(rules(&r.violations)[0], "PARSE");
    assert!(
        r.violations[0].expected.contains("another shape"),
        "{}",
        r.violations[0]
    );

    let mut blank = l.clone();
    blank.insert(1, String::new());
    let r = read(&join(&blank));
    assert_eq!(rules(&r.violations), ["PARSE"]);
    assert!(r.violations[0].expected.contains("blank line"));

    let mut torn = join(&l);
    torn.truncate(torn.len() - 10);
    let r = read(&torn);
    assert_eq!(rules(&r.violations), ["TORN"]);
    assert_eq!(r.violations[0].line, Some(n as u64));

    let mut bytes = join(&l).into_bytes();
    bytes.splice(0..0, [0xff, 0xfe, b'\n']);
    let r = replay_jsonl_reader(&"bytes".into(), &bytes[..]).unwrap();
    // Line 1 is not JSON (the header is lost), and the real header on line 2 is no event.
    assert_eq!(rules(&r.violations), ["PARSE", "PARSE"], "{:#?}", r.violations);
    assert_eq!(r.session.as_str(), "bytes");
    let mut bytes = join(&l).into_bytes();
    let second = bytes.iter().position(|b| *b == b'\n').unwrap() + 1;
    bytes.splice(second..second, [0xc3, 0x28, b'\n']);
    let r = replay_jsonl_reader(&"bytes".into(), &bytes[..]).unwrap();
    assert_eq!(rules(&r.violations), ["PARSE"], "{:#?}", r.violations);
    assert_eq!(r.violations[0].line, Some(2));
}

#[test]
fn header_problems_are_typed_violations() {
    let r = read("");
    assert_eq!(rules(&r.violations), ["HEADER"]);
    assert_eq!(r.session.as_str(), "fallback");

    // Missing header: line 1 is already an event, which is still replayed.
    let log = synthetic::valid_log("nohdr", 1, 1, 0);
    let l = lines(&log);
    let r = read(&join(&l[1..]));
    assert_eq!(rules(&r.violations), ["HEADER"]);
    assert_eq!(r.events, log.events.len() as u64);

    let r = read("{\"not\": \"a header\"}\n");
    assert_eq!(rules(&r.violations), ["HEADER"]);

    let mut h = synthetic::header("rel");
    h.cwd = Some("relative/dir".into());
    let r = read(&(serde_json::to_string(&h).unwrap() + "\n"));
    assert_eq!(rules(&r.violations), ["HEADER"]);
    assert_eq!(r.session.as_str(), "rel");

    let mut orphan = synthetic::header("orphan");
    orphan.origin = Some(agent::Origin::Subagent);
    let r = read(&(serde_json::to_string(&orphan).unwrap() + "\n"));
    assert_eq!(rules(&r.violations), ["LINEAGE", "DEPTH"]);
}

/// A fork child's seed ends with `turn/end` and is followed by `session/end-seed`.
#[test]
fn seeded_layout_is_checked() {
    let parent = synthetic::valid_log("p", 2, 1, 0);
    let n = parent.events.len();
    let mut b = LogBuilder::seeded(child_header("fork", &parent.header, n as u64), &parent.events);
    b.turn(1, 0, Some("fork"));
    let fork = b.build();
    assert!(replay_log(Some(&fork.header), &fork.events).is_clean());

    // A seed cut inside a turn.
    let mut bad = fork.clone();
    bad.header.seed_length = Some(n as u64 - 1);
    let v = replay_log(Some(&bad.header), &bad.events).violations;
    assert_eq!(rules(&v), ["SEED", "SEED"], "{v:#?}");
    assert_eq!(v[0].seq, Some(n as u64 - 2));
    assert_eq!(v[1].seq, Some(n as u64 - 1));

    // A log shorter than its seed.
    let short = &fork.events[..n - 3];
    let v = replay_log(Some(&fork.header), short).violations;
    assert_eq!(rules(&v), ["SEED"]);
    assert_eq!(v[0].seq, None);
}

/// A subagent child's own descriptor comes once, before its first step; a seeded ancestor's
/// descriptor does not count.
#[test]
fn descriptor_rules() {
    let parent = synthetic::valid_log("p", 1, 1, 0);
    let child = spawn_child("c", &parent);
    // The child is itself forked: its seed carries its descriptor, the fork adds its own.
    let n = child.events.len();
    let mut b = LogBuilder::seeded(child_header("gc", &child.header, n as u64), &child.events);
    b.turn(1, 0, Some("fork"));
    let grandchild = b.build();
    assert!(replay_log(Some(&grandchild.header), &grandchild.events).is_clean());

    // Without its own descriptor the grandchild's first own step is flagged.
    let mut b = LogBuilder::seeded(grandchild.header.clone(), &child.events);
    b.turn(1, 0, None);
    let missing = b.build();
    let v = replay_log(Some(&missing.header), &missing.events).violations;
    assert_eq!(rules(&v), ["DESCRIPTOR"]);
    assert_eq!(v[0].seq, Some(n as u64 + 2), "the first own step/start");

    // A descriptor after the first step.
    let mut b = LogBuilder::new(child.header.clone());
    b.turn(1, 0, None).descriptor("spawn");
    let late = b.build();
    let v = replay_log(Some(&late.header), &late.events).violations;
    assert_eq!(rules(&v), ["DESCRIPTOR", "DESCRIPTOR"]);

    // A child that never reached a model request may lack one (it was cancelled early).
    let mut b = LogBuilder::new(child.header.clone());
    b.event(turn_start(1), None).event(
        agent::event::EventData::TurnEnd {
            turn: 1,
            reason: agent::TurnEndReason::Aborted {
                reason: agent::CancelCause::Parent,
            },
        },
        None,
    );
    let early = b.build();
    assert!(replay_log(Some(&early.header), &early.events).is_clean());

    // A top-level session never needs one.
    assert!(replay_log(Some(&parent.header), &parent.events).is_clean());
}

#[test]
fn directories_are_walked_recursively() {
    let dir = scratch("walk");
    let a = synthetic::valid_log("a", 2, 1, 1);
    let b = synthetic::valid_log("b", 1, 2, 0);
    write(&dir, "a.jsonl", &a.to_jsonl());
    write(&dir, "nested/deeper/b.jsonl", &b.to_jsonl());
    write(&dir, "nested/notes.txt", "not a log");
    let mut broken = b.to_jsonl();
    broken.push_str("garbage\n");
    write(
        &dir,
        "nested/c.jsonl",
        &broken.replace("\"id\":\"b\"", "\"id\":\"c\""),
    );
    let report = replay_dir(&dir).unwrap();
    assert_eq!(report.logs, 3);
    // The unreadable line counts as a log position.
    assert_eq!(report.events, (a.events.len() + 2 * b.events.len() + 1) as u64);
    assert_eq!(rules(&report.violations), ["PARSE"]);
    assert_eq!(report.violations[0].session.as_str(), "c");

    // Entries named like logs that are not regular files are reported, not opened (a FIFO
    // would block the check forever) and not silently skipped.
    #[cfg(unix)]
    {
        let fifo = dir.join("nested/pipe.jsonl");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        std::os::unix::fs::symlink(dir.join("nowhere.jsonl"), dir.join("dangling.jsonl")).unwrap();
        std::os::unix::fs::symlink(dir.join("nested"), dir.join("folder.jsonl")).unwrap();
        let report = replay_dir(&dir).unwrap();
        // They are no logs: not counted (`DirReport::logs`), by the store check either.
        assert_eq!(report.logs, 3);
        assert_eq!(invariants::check_store(&dir).unwrap().logs, 3);
        let mut io: Vec<&str> = report
            .violations
            .iter()
            .filter(|v| v.rule.as_str() == "IO")
            .map(|v| v.session.as_str())
            .collect();
        io.sort_unstable();
        assert_eq!(io, ["dangling", "folder", "pipe"], "{:?}", report.violations);
        std::fs::remove_file(&fifo).unwrap();
        std::fs::remove_file(dir.join("dangling.jsonl")).unwrap();
        std::fs::remove_file(dir.join("folder.jsonl")).unwrap();
    }

    let err = replay_dir(&dir.join("missing")).unwrap_err();
    assert!(err.to_string().starts_with("cannot read "), "{err}");
    assert!(replay_jsonl_file(&dir.join("missing.jsonl")).is_err());
    // Reading one file by name refuses anything but a regular file, without reading it.
    let err = replay_jsonl_file(&dir.join("nested")).unwrap_err();
    assert_eq!(err.source.to_string(), "not a regular file", "{err:?}");
}

/// A FIFO handed to the file reader by name (or swapped in for a log after the directory walk
/// looked at it) is refused on its open handle: the open does not wait for a writer.
#[cfg(unix)]
#[test]
fn a_fifo_read_by_name_is_refused_without_blocking() {
    let dir = scratch("fifo-by-name");
    let fifo = dir.join("pipe.jsonl");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || tx.send(replay_jsonl_file(&fifo).map(|r| r.events))
    });
    // A deadline, not a pause: before the fix the open blocked here for good.
    let result = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the open of a FIFO returned instead of waiting for a writer");
    let err = result.unwrap_err();
    assert_eq!(err.source.to_string(), "not a regular file", "{err:?}");
    reader.join().unwrap().expect("the receiver waited");
    std::fs::remove_file(&fifo).unwrap();
}

/// A log whose line never ends — here a 1 TiB sparse file of zeros, as damage or a stray disk
/// image might leave — is read only up to the line bound: it is an `IO` finding naming the
/// bound, and the logs beside it are still replayed.
#[test]
fn a_huge_file_without_line_breaks_is_read_only_to_the_line_bound() {
    let dir = scratch("huge");
    let huge = std::fs::File::create(dir.join("huge.jsonl")).unwrap();
    if huge.set_len(1 << 40).is_err() {
        return; // a file system without sparse files of this size: nothing to show here
    }
    let good = synthetic::valid_log("good", 1, 1, 0);
    write(&dir, "good.jsonl", &good.to_jsonl());
    let report = replay_dir(&dir).unwrap();
    assert_eq!(report.logs, 2);
    assert_eq!(report.events, good.events.len() as u64);
    assert_eq!(rules(&report.violations), ["IO"], "{:?}", report.violations);
    assert_eq!(report.violations[0].session.as_str(), "huge");
    let expected = format!("line 1 is longer than {} bytes", invariants::MAX_LINE_BYTES);
    assert!(
        report.violations[0].expected.contains(&expected),
        "{:?}",
        report.violations
    );
}

/// Appends `items` to `session` (surface events as `append`).
fn append_all(session: &agent::Session, items: impl IntoIterator<Item = agent::event::EventData>) {
    for data in items {
        let surface = surface_for(&data);
        session.append(data, surface).expect("a valid append");
    }
}

/// spec: SPN-62 (spine §4.7 (4), §4.8) — a session seeded by the store's general
/// `fork(source, boundary?)` is a valid log although its seed need not end with `turn/end`: that
/// fork keeps the trailing log-only events (or, with no closed turn, only the leading ones), and
/// when the seed already ends with `session/end-seed` (a resumed source) the constructor adds no
/// second marker. Only the fork *provider*'s children (`origin: subagent`) end their seed with
/// `turn/end` (providers §5.3).
#[test]
fn store_fork_children_with_trailing_log_only_events_replay_clean() {
    use agent::SessionStore as _;
    use agent_loop::runtime::MemorySessionStore;

    let store = MemorySessionStore::default();
    let source = store
        .prepare("src".into(), None, agent::SessionMeta::default())
        .unwrap();
    append_all(
        &source,
        [
            turn_start(1),
            step_start(1, 1),
            user("hi"),
            step_end(1, 1),
            turn_end(1),
            agent::event::EventData::SandboxMode {
                mode: "read-only".into(),
                source: None,
            },
            turn_start(2),
        ],
    );
    let _entered = store.enter(source.clone()).unwrap();
    let child_turn = [
        turn_start(2),
        step_start(2, 1),
        user("go"),
        step_end(2, 1),
        turn_end(2),
    ];

    // Latest boundary: the seed is turn 1 plus the trailing `sandbox/mode`.
    let fork = store.fork(source.id(), None, Some("child".into())).unwrap();
    assert_eq!(fork.seed.events.last().unwrap().type_name(), "sandbox/mode");
    let child = store
        .prepare(fork.child_id, Some(fork.seed.events), fork.meta)
        .unwrap();
    append_all(&child, child_turn.clone());
    let r = replay_log(Some(child.header()), child.events().iter().map(|e| &**e));
    assert!(r.is_clean(), "{:#?}", r.violations);
    // The marker is still required after such a seed.
    let n = child.header().seed_length.unwrap() as usize;
    let unmarked: Vec<_> = (child.events()[..n].iter().map(|e| e.data.clone()))
        .chain(child_turn.clone())
        .enumerate()
        .map(|(i, data)| {
            let mut e = ev(i as u64, data);
            e.surface = surface_for(&e.data);
            e
        })
        .collect();
    let v = replay_log(Some(child.header()), &unmarked).violations;
    assert_eq!(rules(&v), ["SEED"], "{v:#?}");
    assert_eq!(v[0].seq, Some(n as u64));

    // A resumed source ends with its own `session/end-seed`: the fork's seed keeps it and the
    // child gets no second marker.
    let resumed = agent::Session::new(
        agent::SessionMeta::default()
            .into_header("resumed".into(), 1)
            .unwrap(),
        Some(log([
            turn_start(1),
            step_start(1, 1),
            user("hi"),
            step_end(1, 1),
            turn_end(1),
        ])),
    )
    .unwrap();
    assert_eq!(resumed.events().last().unwrap().type_name(), "session/end-seed");
    let seed = agent_loop::runtime::fork_seed(&resumed.events()[..], None).unwrap();
    let n = seed.events.len() as u64;
    assert_eq!(seed.events.last().unwrap().type_name(), "session/end-seed");
    let meta = agent::SessionMeta {
        parent_session: Some("resumed".into()),
        seed_length: Some(n),
        ..agent::SessionMeta::default()
    };
    let child =
        agent::Session::new(meta.into_header("child2".into(), 2).unwrap(), Some(seed.events)).unwrap();
    append_all(&child, child_turn.clone());
    assert_eq!(child.events()[n as usize].type_name(), "turn/start");
    let r = replay_log(Some(child.header()), child.events().iter().map(|e| &**e));
    assert!(r.is_clean(), "{:#?}", r.violations);

    // A source without a closed turn: the seed is its leading log-only events.
    let early = agent::Session::new(
        agent::SessionMeta::default()
            .into_header("early".into(), 1)
            .unwrap(),
        None,
    )
    .unwrap();
    append_all(&early, [other("x/note", serde_json::json!({})), turn_start(1)]);
    let seed = agent_loop::runtime::fork_seed(&early.events()[..], None).unwrap();
    let meta = agent::SessionMeta {
        parent_session: Some("early".into()),
        seed_length: Some(seed.events.len() as u64),
        ..agent::SessionMeta::default()
    };
    let child =
        agent::Session::new(meta.into_header("child3".into(), 2).unwrap(), Some(seed.events)).unwrap();
    append_all(&child, [turn_start(1), turn_end(1)]);
    let r = replay_log(Some(child.header()), child.events().iter().map(|e| &**e));
    assert!(r.is_clean(), "{:#?}", r.violations);
    // Online, priming at `session/created` accepts such a child too, and so do its appends.
    let observer = invariants::InvariantObserver::shared();
    assert_eq!(observer.prime(&child), Ok(()));
    use agent::SessionObserver as _;
    let next = agent::SessionEvent {
        seq: child.len() as u64,
        time: 3,
        data: turn_start(2),
        surface: None,
        ignorable: false,
    };
    assert_eq!(observer.check(&child, &next), Ok(()));
}

/// Every finding read from a file names that file. Session ids repeat across directories (the
/// capture behind `cargo xtask check-invariants` writes one directory per test, each with its
/// own `parent.jsonl`), so a finding that names only the session, seq and line cannot be traced
/// to the log that breaks the rule. Checked for per-event rules (`replay_jsonl_file`,
/// `replay_dir`, `check_store`), header and end-of-log findings, and a store's cross-session
/// findings.
#[test]
fn findings_name_the_file_they_concern() {
    let dir = scratch("findings-name-files");
    let good = synthetic::valid_log("parent", 2, 1, 0);
    let mut bad = good.clone();
    let end = bad
        .events
        .iter()
        .position(|e| e.type_name() == "turn/end")
        .unwrap();
    bad.events.remove(end);
    write(&dir, "test_a/parent.jsonl", &good.to_jsonl());
    write(&dir, "test_b/parent.jsonl", &bad.to_jsonl());
    let broken = dir.join("test_b").join("parent.jsonl");
    let named = |v: &Violation| {
        v.file.as_deref() == Some(broken.as_path()) && v.to_string().contains(&broken.display().to_string())
    };

    let report = replay_dir(&dir).unwrap();
    assert!(!report.is_clean());
    assert!(report.violations.iter().all(named), "{:#?}", report.violations);
    let report = replay_jsonl_file(&broken).unwrap();
    assert!(!report.is_clean());
    assert!(report.violations.iter().all(named), "{:#?}", report.violations);
    let report = invariants::check_store(&dir.join("test_b")).unwrap();
    assert!(!report.is_clean());
    assert!(report.violations.iter().all(named), "{:#?}", report.violations);

    // Header and end-of-log findings (a subagent child without parent, shorter than its seed).
    let mut orphan = child_header("parent", &good.header, 50);
    orphan.parent_session = None;
    write(
        &dir,
        "test_b/parent.jsonl",
        &LogBuilder::new(orphan).build().to_jsonl(),
    );
    let report = replay_dir(&dir).unwrap();
    assert_eq!(
        rules(&report.violations),
        ["LINEAGE", "SEED"],
        "{:#?}",
        report.violations
    );
    assert!(report.violations.iter().all(named), "{:#?}", report.violations);

    // A cross-session finding names the log it is about (here the child with the wrong depth).
    let mut child = child_header("parent", &good.header, 0);
    child.id = "child".into();
    child.delegation_depth = Some(5);
    let mut b = LogBuilder::new(child);
    b.turn(1, 0, Some("spawn"));
    std::fs::remove_file(&broken).unwrap();
    let broken = dir.join("test_a").join("child.jsonl");
    write(&dir, "test_a/child.jsonl", &b.build().to_jsonl());
    let report = invariants::check_store(&dir.join("test_a")).unwrap();
    assert_eq!(rules(&report.violations), ["DEPTH"], "{:#?}", report.violations);
    let v = &report.violations[0];
    assert_eq!(v.file.as_deref(), Some(broken.as_path()), "{v:#?}");
    assert!(v.to_string().contains(&broken.display().to_string()), "{v}");
}
