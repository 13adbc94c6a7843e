//! Cross-session rules over a whole store directory.

use std::collections::HashMap;
use std::io::{self, BufReader};
use std::path::{Path, PathBuf};

use agent::{Origin, SessionHeader, SessionId};
use serde_json::Value;

use crate::jsonl::{
    DirReport, Found, ReadError, find_logs, for_each_line, io_violation, locate, open_log, read_log, stem_id,
};
use crate::rule::RuleId;
use crate::violation::Violation;

struct Entry {
    path: PathBuf,
    header: SessionHeader,
}

/// Replays every `*.jsonl` log under `dir` like [`replay_dir`](crate::replay_dir), then checks
/// the relations between sessions:
///
/// * `DUP-SESSION`: no two logs carry the same session id (relations through a duplicated id
///   are then skipped: the parent would be ambiguous);
/// * `FILE-ID`: each log's file name is its header's session id (`<id>.jsonl`), the name its
///   store loads it by (a store refuses a file whose header names another session);
/// * `LINEAGE`: no session's `parentSession` chain leads back to it (a session naming itself,
///   or a cycle of sessions naming each other; each session on the loop is reported);
/// * `DEPTH`: a subagent child's `delegationDepth` is its parent's plus one;
/// * `NOTICE-PARENT`: every settlement notice a session received (a message whose source kind is
///   `subagent-settled`, logged as a `user/message` or inserted by an inbox splice) names, as its
///   `senderSessionId`, a child whose `parentSession` is that session (a fork child's inherited
///   seed holds its parent's notices, which are the parent's to answer for, not the child's);
/// * `FORK-SEED`: a child with `seedLength = n` starts with exactly its parent's first `n`
///   events (compared as JSON values, so key order does not matter); lines unreadable on either
///   side are skipped (they are already `PARSE` violations) and only the first difference is
///   reported.
///
/// Every relation is lenient about a parent that is not in the store: a store may hold a
/// subtree of a larger history, so a child naming an absent `parentSession` is not a violation.
/// The per-log rules include the header-level lineage checks (a subagent child names a parent
/// and has depth ≥ 1) and the child's own descriptor (`DESCRIPTOR`). Every violation names the
/// file it concerns (for a relation, the log of the session it is reported under).
pub fn check_store(dir: &Path) -> Result<DirReport, ReadError> {
    let mut report = DirReport::default();
    let mut entries: Vec<Entry> = Vec::new();
    for found in find_logs(dir)? {
        let path = match found {
            Found::Log(path) => path,
            Found::Problem(v) => {
                report.violations.push(v);
                continue;
            }
        };
        let read = open_log(&path).and_then(|f| read_log(&stem_id(&path), BufReader::new(f)));
        match read {
            Ok(mut read) => {
                locate(&mut read.report.violations, &path);
                report.add(read.report);
                // A log read only up to an over-long line (already an `IO` finding) takes no
                // part in the relations: its events past that line are unknown.
                if let Some(header) = read.header.filter(|_| read.cut.is_none()) {
                    entries.push(Entry { path, header });
                }
            }
            Err(e) => {
                report.logs += 1;
                report.violations.push(io_violation(&path, &e));
            }
        }
    }

    for entry in &entries {
        let named = stem_id(&entry.path);
        if named != entry.header.id {
            report.violations.push(Violation::at(
                entry.header.id.clone(),
                None,
                RuleId::FILE_ID,
                format!(
                    "a log's file name to be its session id, but {} holds session {}: its store cannot load it under either name",
                    entry.path.display(),
                    entry.header.id
                ),
            )
            .in_file(&entry.path));
        }
    }

    let mut by_id: HashMap<&SessionId, Vec<usize>> = HashMap::new();
    for (i, e) in entries.iter().enumerate() {
        by_id.entry(&e.header.id).or_default().push(i);
    }
    // In path order (entries are), so that a store's findings read the same on every run.
    for (i, entry) in entries.iter().enumerate() {
        if let Some(&first) = by_id.get(&entry.header.id).and_then(|holders| holders.first())
            && first != i
        {
            report.violations.push(
                Violation::at(
                    entry.header.id.clone(),
                    None,
                    RuleId::DUPLICATE_SESSION,
                    format!(
                        "one log per session id, but {} and {} both hold it",
                        entries[first].path.display(),
                        entry.path.display()
                    ),
                )
                .in_file(&entry.path),
            );
        }
    }

    let mut relations = lineage_cycles(&entries, &by_id);
    for child in &entries {
        let Some(parent_id) = &child.header.parent_session else {
            continue;
        };
        let (Some([_]), Some([parent])) = (
            by_id.get(&child.header.id).map(Vec::as_slice),
            by_id.get(parent_id).map(Vec::as_slice),
        ) else {
            continue;
        };
        let parent = &entries[*parent];
        relations.extend(depth_violation(child, parent).map(|v| v.in_file(&child.path)));
        if let Some(n) = child.header.seed_length.filter(|n| *n > 0) {
            match fork_seed_violation(child, parent, n) {
                Ok(v) => relations.extend(v.map(|v| v.in_file(&child.path))),
                Err((path, e)) => relations.push(io_violation(&path, &e)),
            }
        }
    }
    for receiver in &entries {
        match settlement_notices(&receiver.path, receiver.header.seed_length.unwrap_or(0)) {
            Ok(notices) => {
                for (seq, sender) in notices {
                    let Some([child]) = by_id.get(&sender).map(Vec::as_slice) else {
                        continue;
                    };
                    let child = &entries[*child];
                    if child.header.parent_session.as_ref() != Some(&receiver.header.id) {
                        relations.push(Violation::at(
                            receiver.header.id.clone(),
                            Some(seq),
                            RuleId::NOTICE_PARENT,
                            format!(
                                "the settlement notice from {sender} to come from a child of this session, but its parentSession is {}",
                                child
                                    .header
                                    .parent_session
                                    .as_ref()
                                    .map_or("absent".to_owned(), |p| format!("{p}"))
                            ),
                        )
                        .in_file(&receiver.path));
                    }
                }
            }
            Err(e) => relations.push(io_violation(&receiver.path, &e)),
        }
    }
    report.violations.extend(relations);
    Ok(report)
}

/// The entry a log's `parentSession` names, when both ids are unique in the store (through a
/// duplicated id the parent would be ambiguous).
fn parent_of(entries: &[Entry], by_id: &HashMap<&SessionId, Vec<usize>>, child: usize) -> Option<usize> {
    let entry = &entries[child];
    let parent = entry.header.parent_session.as_ref()?;
    match (
        by_id.get(&entry.header.id).map(Vec::as_slice),
        by_id.get(parent).map(Vec::as_slice),
    ) {
        (Some([_]), Some([parent])) => Some(*parent),
        _ => None,
    }
}

/// `LINEAGE`: no session's `parentSession` chain leads back to it (a parent exists before its
/// children, so a lineage is a forest). Every session on a loop is reported, in path order.
///
/// Each log has at most one parent, so the chains are walked once in all: a session already
/// walked from an earlier start is not walked again.
fn lineage_cycles(entries: &[Entry], by_id: &HashMap<&SessionId, Vec<usize>>) -> Vec<Violation> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    let mut mark = vec![Mark::New; entries.len()];
    // For each session on a loop: the loop's length.
    let mut on_cycle: Vec<Option<usize>> = vec![None; entries.len()];
    for start in 0..entries.len() {
        let mut path = Vec::new();
        let mut at = Some(start);
        while let Some(i) = at {
            match mark[i] {
                Mark::Done => break,
                Mark::OnPath => {
                    let from = path.iter().position(|&p| p == i).unwrap_or(0);
                    let cycle = &path[from..];
                    for &member in cycle {
                        on_cycle[member] = Some(cycle.len());
                    }
                    break;
                }
                Mark::New => {
                    mark[i] = Mark::OnPath;
                    path.push(i);
                    at = parent_of(entries, by_id, i);
                }
            }
        }
        for i in path {
            mark[i] = Mark::Done;
        }
    }
    entries
        .iter()
        .zip(on_cycle)
        .filter_map(|(entry, len)| {
            let len = len?;
            let id = &entry.header.id;
            let expected = if len == 1 {
                format!("a parentSession other than the session itself, but {id} names itself")
            } else {
                format!(
                    "a parentSession chain that does not lead back to the session, but {id}'s parent {} is on a cycle of {len} sessions through {id}",
                    entry.header.parent_session.as_ref().map_or("", |p| p.as_str())
                )
            };
            Some(Violation::at(id.clone(), None, RuleId::LINEAGE, expected).in_file(&entry.path))
        })
        .collect()
}

/// The source kind of the seam's settlement notices (seam §2.14.13).
const SETTLED_SOURCE: &str = "subagent-settled";

/// `(seq, senderSessionId)` of every settlement notice a log's session received itself:
/// `user/message` events and messages inserted by `agent/inbox/spliced`, after the first
/// `seed_length` events (a fork child's inherited prefix holds what its parent received, checked
/// in the parent's log and compared with it by `FORK-SEED`). Unreadable lines, and lines without
/// a `seq` (not an event), are skipped (they are already `PARSE` findings).
///
/// Whether an event is in the seed is decided by its own `seq`, not by its line: a blank or
/// unreadable line the log should not hold (or two events run together on one line) moves every
/// later event to another line, but not out of or into the seed.
fn settlement_notices(path: &Path, seed_length: u64) -> io::Result<Vec<(u64, SessionId)>> {
    fn sender(message: &Value) -> Option<SessionId> {
        let source = message.get("source")?;
        (source.get("kind")?.as_str()? == SETTLED_SOURCE)
            .then(|| source.get("senderSessionId")?.as_str().map(SessionId::from))
            .flatten()
    }
    let mut out = Vec::new();
    let file = open_log(path)?;
    for_each_line(BufReader::new(file), |line| {
        // Line 1 is the header.
        if line.number == 1 {
            return true;
        }
        let Ok(event) = serde_json::from_slice::<Value>(line.bytes) else {
            return true;
        };
        let Some(seq) = event.get("seq").and_then(Value::as_u64) else {
            return true;
        };
        if seq < seed_length {
            return true;
        }
        let data = event.get("data");
        match event.get("type").and_then(Value::as_str) {
            Some("user/message") => out.extend(data.and_then(sender).map(|s| (seq, s))),
            Some("agent/inbox/spliced") => {
                let inserted = data.and_then(|d| d.get("inserted")).and_then(Value::as_array);
                out.extend(
                    inserted
                        .into_iter()
                        .flatten()
                        .filter_map(sender)
                        .map(|s| (seq, s)),
                );
            }
            _ => {}
        }
        true
    })?;
    Ok(out)
}

fn depth_violation(child: &Entry, parent: &Entry) -> Option<Violation> {
    if child.header.origin != Some(Origin::Subagent) {
        return None;
    }
    let want = parent.header.depth().saturating_add(1);
    let got = child.header.depth();
    (got != want).then(|| {
        Violation::at(
            child.header.id.clone(),
            None,
            RuleId::DEPTH,
            format!(
                "delegationDepth {want} (parent {} is at depth {}), got {got}",
                parent.header.id,
                parent.header.depth()
            ),
        )
    })
}

/// The seeded part of a log: its readable events with `seq < n`, by `seq`, and whether the log
/// holds the whole seed.
///
/// Events are placed by their own `seq`, not by their line, like [`settlement_notices`]: a
/// blank or unreadable line (a `PARSE` finding of its own) neither shifts the later events onto
/// other seeded positions nor hides a real difference behind it.
struct SeedPrefix {
    events: std::collections::BTreeMap<u64, Value>,
    /// The log holds at least `n` events: a readable one at `seq ≥ n - 1`, or — its `seq`s
    /// damaged — at least `n` non-blank lines after the header.
    complete: bool,
}

fn seed_prefix(path: &Path, n: u64) -> io::Result<SeedPrefix> {
    let mut events = std::collections::BTreeMap::new();
    let mut lines = 0u64;
    let mut last_seq = None;
    let file = open_log(path)?;
    for_each_line(BufReader::new(file), |line| {
        if line.number == 1 || line.bytes.iter().all(u8::is_ascii_whitespace) {
            return true;
        }
        lines += 1;
        let Ok(event) = serde_json::from_slice::<Value>(line.bytes) else {
            return true;
        };
        let Some(seq) = event.get("seq").and_then(Value::as_u64) else {
            return true;
        };
        last_seq = last_seq.max(Some(seq));
        if seq >= n {
            // Past the seed (seqs only grow in a log the `SEQ` rule accepts).
            return false;
        }
        events.entry(seq).or_insert(event);
        true
    })?;
    Ok(SeedPrefix {
        events,
        complete: last_seq.is_some_and(|s| s.saturating_add(1) >= n) || lines >= n,
    })
}

fn fork_seed_violation(
    child: &Entry,
    parent: &Entry,
    n: u64,
) -> Result<Option<Violation>, (PathBuf, io::Error)> {
    let mine = seed_prefix(&child.path, n).map_err(|e| (child.path.clone(), e))?;
    let theirs = seed_prefix(&parent.path, n).map_err(|e| (parent.path.clone(), e))?;
    let v = |seq: Option<u64>, expected: String| {
        Violation::at(child.header.id.clone(), seq, RuleId::FORK_SEED, expected)
    };
    // An event missing on either side (damaged there) is that log's own finding.
    for (seq, a) in &mine.events {
        if let Some(b) = theirs.events.get(seq)
            && a != b
        {
            return Ok(Some(v(
                Some(*seq),
                format!(
                    "seeded event {seq} to equal event {seq} of parent {}",
                    parent.header.id
                ),
            )));
        }
    }
    if !theirs.complete {
        return Ok(Some(v(
            None,
            format!(
                "parent {} to hold at least the {n} seeded events, but it holds {}",
                parent.header.id,
                theirs.events.len()
            ),
        )));
    }
    // A child shorter than its seed is the per-log `SEED` rule's finding.
    Ok(None)
}
