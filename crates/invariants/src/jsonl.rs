//! The offline reader: JSON-lines session logs (line 1 the header, every further line one event)
//! replayed from readers, files and directory trees.
//!
//! Every defect of the input is a typed [`Violation`], never a panic: unreadable files (`IO`),
//! lines that are not JSON or not an event (`PARSE`), a cut-short last line (`TORN`), a missing or
//! invalid header (`HEADER`). Only the directory or file the caller named being unreadable is an
//! `Err`.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read as _};
use std::path::{Path, PathBuf};

use agent::{SessionEvent, SessionHeader, SessionId};
use serde_json::Value;

use crate::replay::{Report, SessionReplay, header_violations};
use crate::rule::RuleId;
use crate::violation::Violation;

/// The file or directory the caller named could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {}", path.display())]
pub struct ReadError {
    /// What could not be read.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: io::Error,
}

impl ReadError {
    fn new(path: &Path, source: io::Error) -> Self {
        Self {
            path: path.to_owned(),
            source,
        }
    }
}

/// The outcome of replaying every log under a directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirReport {
    /// How many logs were found: `*.jsonl` regular files (or links to one), whether or not they
    /// could then be opened and read. An entry that is named like a log but is no file to read
    /// — a FIFO, a device, a socket, a dangling link, a link to a directory — is not a log: it
    /// is not counted here, only reported (an `IO` finding), like an unreadable subdirectory.
    pub logs: usize,
    /// How many events were replayed across all logs.
    pub events: u64,
    /// Every violation, log by log in path order; an entry that could not be walked or read is
    /// reported in its path's place.
    pub violations: Vec<Violation>,
}

impl DirReport {
    /// Whether no log broke any rule.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of one rule.
    pub fn of_rule(&self, rule: RuleId) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.rule == rule)
    }

    pub(crate) fn add(&mut self, report: Report) {
        self.logs += 1;
        self.events += report.events;
        self.violations.extend(report.violations);
    }
}

/// One physical line of a log.
pub(crate) struct Line<'a> {
    /// 1-based line number.
    pub(crate) number: u64,
    /// The bytes, without the newline.
    pub(crate) bytes: &'a [u8],
    /// Whether the line ended with a newline (a final line without one may be torn).
    pub(crate) terminated: bool,
}

/// The longest line the reader takes, newline excluded: 256 MiB, far beyond any real session
/// event. A longer line can only be damage (a file of zeros, a stray disk image), and reading
/// stops there instead of pulling the file into memory whole.
pub const MAX_LINE_BYTES: u64 = 1 << 28;

/// A line longer than the reader's bound: the read stops there. Carried as the source of an
/// `InvalidData` [`io::Error`], so that a log reader can tell this defect of the input from a
/// failure to read it.
#[derive(Debug, thiserror::Error)]
#[error("line {number} is longer than {max} bytes; the log is not read past it")]
pub(crate) struct LineTooLong {
    /// The 1-based number of the line.
    pub(crate) number: u64,
    /// The bound it exceeds.
    pub(crate) max: u64,
}

impl LineTooLong {
    /// The over-long line `err` reports, if that is what it is.
    pub(crate) fn of(err: &io::Error) -> Option<&Self> {
        err.get_ref().and_then(|e| e.downcast_ref::<Self>())
    }
}

/// Reads `reader` line by line, calling `f` for each; stops early when `f` returns `false`. A
/// line longer than [`MAX_LINE_BYTES`] ends the read with an `InvalidData` error naming it
/// (its source a [`LineTooLong`]).
pub(crate) fn for_each_line<R: BufRead>(reader: R, f: impl FnMut(Line<'_>) -> bool) -> io::Result<()> {
    for_each_bounded_line(reader, MAX_LINE_BYTES, f)
}

/// [`for_each_line`] with the line bound `max`.
fn for_each_bounded_line<R: BufRead>(
    mut reader: R,
    max: u64,
    mut f: impl FnMut(Line<'_>) -> bool,
) -> io::Result<()> {
    let mut buf = Vec::new();
    let mut number = 0;
    loop {
        buf.clear();
        if (&mut reader).take(max + 1).read_until(b'\n', &mut buf)? == 0 {
            return Ok(());
        }
        number += 1;
        let terminated = buf.last() == Some(&b'\n');
        if !terminated && buf.len() as u64 > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                LineTooLong { number, max },
            ));
        }
        let bytes = if terminated {
            &buf[..buf.len() - 1]
        } else {
            &buf[..]
        };
        if !f(Line {
            number,
            bytes,
            terminated,
        }) {
            return Ok(());
        }
    }
}

/// Why a line is not an event, as a finding.
///
/// A line that is not well-formed JSON and has no newline can only be the last, cut short by an
/// interrupted write: `TORN`, the crash artifact a store drops on load, even when all it holds
/// is whitespace. (A last line that does end in a newline but holds zeros a lost write left is
/// torn too; only the caller knows whether a line is the last, see [`read_log`].)
fn unreadable(line: &Line<'_>, err: &serde_json::Error) -> (RuleId, String) {
    if serde_json::from_slice::<Value>(line.bytes).is_ok() {
        return (
            RuleId::PARSE,
            format!("a session event, got JSON of another shape ({err})"),
        );
    }
    if !line.terminated {
        return torn(err);
    }
    if line.bytes.iter().all(u8::is_ascii_whitespace) {
        return (
            RuleId::PARSE,
            "one session event per line, got a blank line".to_owned(),
        );
    }
    (
        RuleId::PARSE,
        format!("a JSON session event, got text that is not JSON ({err})"),
    )
}

/// The `TORN` finding for a cut-short last line.
fn torn(err: &serde_json::Error) -> (RuleId, String) {
    (
        RuleId::TORN,
        format!("a complete last line, got a cut-short one ({err}); stores drop it on load"),
    )
}

/// Whether an unreadable, newline-terminated line is torn if it turns out to be the last: not
/// JSON, and holding NUL bytes — blocks a power loss left unwritten, which a store drops on
/// load like a line without its newline.
fn torn_if_last(line: &Line<'_>) -> bool {
    line.terminated && line.bytes.contains(&0) && serde_json::from_slice::<Value>(line.bytes).is_err()
}

/// A replayed log plus the header it was read with.
pub(crate) struct ReadLog {
    pub(crate) report: Report,
    pub(crate) header: Option<SessionHeader>,
    /// The over-long line the read stopped at, if it did not reach the end of the log.
    pub(crate) cut: Option<u64>,
}

/// The replay of one log from a reader. `fallback` names the session when the header cannot be
/// read.
///
/// A line longer than [`MAX_LINE_BYTES`] is a defect of the input, not a read failure: reading
/// stops there and it becomes one `IO` finding at its line, after the findings of the lines
/// before it (which are kept). The end of such a log was never seen, so no end-of-log finding
/// is made for it.
pub(crate) fn read_log<R: BufRead>(fallback: &SessionId, reader: R) -> io::Result<ReadLog> {
    let mut violations: Vec<Violation> = Vec::new();
    let mut header: Option<SessionHeader> = None;
    let mut replay: Option<SessionReplay> = None;
    // The finding (index in `violations`) and parse error of the line before, when that line
    // is torn if it was the last (see `torn_if_last`).
    let mut torn_candidate: Option<(usize, serde_json::Error)> = None;
    let read = for_each_line(reader, |line| {
        torn_candidate = None;
        let replay = match &mut replay {
            Some(r) => r,
            None => {
                let (r, pending_event) = start(fallback, &line, &mut header, &mut violations);
                let r = replay.insert(r);
                if let Some(ev) = pending_event {
                    violations.extend(r.push(&ev).into_iter().map(|v| v.on_line(line.number)));
                }
                return true;
            }
        };
        match serde_json::from_slice::<SessionEvent>(line.bytes) {
            Ok(ev) => violations.extend(replay.push(&ev).into_iter().map(|v| v.on_line(line.number))),
            Err(err) => {
                let (rule, expected) = unreadable(&line, &err);
                violations
                    .push(Violation::at(replay.session().clone(), None, rule, expected).on_line(line.number));
                if torn_if_last(&line) {
                    torn_candidate = Some((violations.len() - 1, err));
                }
                replay.skip_unreadable();
            }
        }
        true
    });
    let cut = match read {
        Ok(()) => None,
        Err(e) => match LineTooLong::of(&e) {
            Some(long) => Some(long.number),
            None => return Err(e),
        },
    };
    if let Some((at, err)) = torn_candidate.filter(|_| cut.is_none()) {
        let (rule, expected) = torn(&err);
        violations[at].rule = rule;
        violations[at].expected = expected;
    }
    let session = replay
        .as_ref()
        .map_or_else(|| fallback.clone(), |r| r.session().clone());
    if let Some(number) = cut {
        violations.push(
            Violation::at(
                session.clone(),
                None,
                RuleId::IO,
                format!(
                    "every line of the log to be readable, but line {number} is longer than \
                     {MAX_LINE_BYTES} bytes; the log is not read past it"
                ),
            )
            .on_line(number),
        );
    }
    let replay = replay.unwrap_or_else(|| {
        if cut.is_none() {
            violations.push(Violation::at(
                fallback.clone(),
                None,
                RuleId::HEADER,
                "a header line, but the log is empty",
            ));
        }
        SessionReplay::new(fallback.clone())
    });
    let finish = replay.finish();
    if cut.is_none() {
        violations.extend(finish.violations);
    }
    Ok(ReadLog {
        report: Report {
            session,
            events: finish.events,
            violations,
            open_turn: finish.open_turn,
        },
        header,
        cut,
    })
}

/// Reads line 1. Returns the replay to continue with and, when line 1 turned out to be an event
/// (the header is missing), that event.
fn start(
    fallback: &SessionId,
    line: &Line<'_>,
    header: &mut Option<SessionHeader>,
    violations: &mut Vec<Violation>,
) -> (SessionReplay, Option<SessionEvent>) {
    let fail = |violations: &mut Vec<Violation>, rule, expected: String| {
        violations.push(Violation::at(fallback.clone(), None, rule, expected).on_line(line.number));
    };
    let value = match serde_json::from_slice::<Value>(line.bytes) {
        Ok(v) => v,
        Err(err) => {
            let rule = if line.terminated {
                RuleId::PARSE
            } else {
                RuleId::TORN
            };
            fail(
                violations,
                rule,
                format!("a JSON session header on line 1 ({err})"),
            );
            return (SessionReplay::new(fallback.clone()), None);
        }
    };
    match serde_json::from_value::<SessionHeader>(value.clone()) {
        Ok(h) => {
            violations.extend(header_violations(&h).into_iter().map(|v| v.on_line(line.number)));
            let replay = SessionReplay::with_header(&h);
            *header = Some(h);
            (replay, None)
        }
        Err(err) => match serde_json::from_value::<SessionEvent>(value) {
            Ok(ev) => {
                fail(
                    violations,
                    RuleId::HEADER,
                    "a session header on line 1, found an event (the header is missing)".to_owned(),
                );
                (SessionReplay::new(fallback.clone()), Some(ev))
            }
            Err(_) => {
                fail(
                    violations,
                    RuleId::HEADER,
                    format!("a session header on line 1 ({err})"),
                );
                (SessionReplay::new(fallback.clone()), None)
            }
        },
    }
}

/// Replays one JSON-lines log from `reader`. `fallback` names the session when its header cannot
/// be read. Only a read failure of `reader` itself is an `Err`. A line longer than
/// [`MAX_LINE_BYTES`] is an `IO` finding at its line: reading stops there (so a damaged file costs
/// at most that much memory), and the findings of the lines before it are kept.
pub fn replay_jsonl_reader<R: BufRead>(fallback: &SessionId, reader: R) -> io::Result<Report> {
    read_log(fallback, reader).map(|r| r.report)
}

/// The session id a log file stands for when its header is unreadable: its file stem.
pub(crate) fn stem_id(path: &Path) -> SessionId {
    SessionId::new(
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    )
}

/// Opens a log for reading, only if it is a regular file (or a link to one).
///
/// The type is checked on the open handle, so a path replaced between a directory walk and the
/// open is still caught. The open itself never blocks (`O_NONBLOCK`, which has no effect on
/// regular files; a FIFO opened for reading without it waits for a writer) and never takes a
/// controlling terminal. Anything else is an `InvalidInput` error naming it.
pub(crate) fn open_log(path: &Path) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let file = options.open(path)?;
    if file.metadata()?.is_file() {
        Ok(file)
    } else {
        Err(not_regular())
    }
}

fn not_regular() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "not a regular file")
}

/// Replays one JSON-lines log file. A path that is not a regular file (a FIFO, a device, a
/// directory) is an error; it is never read.
///
/// Every violation of the report names `path` as its file.
pub fn replay_jsonl_file(path: &Path) -> Result<Report, ReadError> {
    let file = open_log(path).map_err(|e| ReadError::new(path, e))?;
    let mut report =
        replay_jsonl_reader(&stem_id(path), BufReader::new(file)).map_err(|e| ReadError::new(path, e))?;
    locate(&mut report.violations, path);
    Ok(report)
}

/// Names `path` as the file of every violation that names none yet.
pub(crate) fn locate(violations: &mut [Violation], path: &Path) {
    for v in violations.iter_mut().filter(|v| v.file.is_none()) {
        v.file = Some(path.to_owned());
    }
}

/// What a directory walk found at one path: a log to read, or an entry that could not be
/// walked or read (an `IO` finding naming it).
pub(crate) enum Found {
    /// A `*.jsonl` regular file (or a link to one).
    Log(PathBuf),
    /// An unreadable subdirectory or entry, or an entry named like a log that is not a regular
    /// file.
    Problem(Violation),
}

impl Found {
    fn path(&self) -> Option<&Path> {
        match self {
            Self::Log(path) => Some(path),
            Self::Problem(v) => v.file.as_deref(),
        }
    }
}

/// Every `*.jsonl` file under `dir`, recursively, and every problem met on the way, all in path
/// order (a problem takes the place of the path it names), so that a report lists its findings
/// in the same order on every run and file system, whatever order directories list their
/// entries in. Symbolic links to directories are not followed. Unreadable subdirectories
/// become `IO` problems; only `dir` itself being unreadable is an `Err`.
pub(crate) fn find_logs(dir: &Path) -> Result<Vec<Found>, ReadError> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(current) = stack.pop() {
        let entries = match std::fs::read_dir(&current) {
            Ok(entries) => entries,
            Err(e) if current == dir => return Err(ReadError::new(dir, e)),
            Err(e) => {
                found.push(Found::Problem(io_violation(&current, &e)));
                continue;
            }
        };
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    found.push(Found::Problem(io_violation(&current, &e)));
                    continue;
                }
            };
            let path = entry.path();
            let kind = match entry.file_type() {
                Ok(kind) => kind,
                Err(e) => {
                    found.push(Found::Problem(io_violation(&path, &e)));
                    continue;
                }
            };
            if kind.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                // A log is a regular file (or a link to one). Anything else named like a log —
                // a FIFO, a device, a socket, a dangling link, a link to a directory — is
                // reported, never opened: opening a FIFO would block the check forever.
                // The readers open it with `open_log`, which checks again on the handle.
                match std::fs::metadata(&path) {
                    Ok(meta) if meta.is_file() => found.push(Found::Log(path)),
                    Ok(_) => found.push(Found::Problem(io_violation(&path, &not_regular()))),
                    Err(e) => found.push(Found::Problem(io_violation(&path, &e))),
                }
            }
        }
    }
    // Stable: problems naming one path keep the order they were met in.
    found.sort_by(|a, b| a.path().cmp(&b.path()));
    Ok(found)
}

pub(crate) fn io_violation(path: &Path, e: &io::Error) -> Violation {
    Violation::at(
        stem_id(path),
        None,
        RuleId::IO,
        format!("{} to be readable ({e})", path.display()),
    )
    .in_file(path)
}

/// Replays every `*.jsonl` log under `dir` (recursively), each on its own. Cross-session rules
/// are [`check_store`](crate::check_store)'s. Every violation names the file it was found in.
pub fn replay_dir(dir: &Path) -> Result<DirReport, ReadError> {
    let mut report = DirReport::default();
    for found in find_logs(dir)? {
        let path = match found {
            Found::Log(path) => path,
            Found::Problem(v) => {
                report.violations.push(v);
                continue;
            }
        };
        match replay_jsonl_file(&path) {
            Ok(r) => report.add(r),
            Err(e) => {
                report.logs += 1;
                report.violations.push(io_violation(&path, &e.source));
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(bytes: &[u8], max: u64) -> io::Result<Vec<(Vec<u8>, bool)>> {
        let mut out = Vec::new();
        for_each_bounded_line(bytes, max, |line| {
            out.push((line.bytes.to_vec(), line.terminated));
            true
        })?;
        Ok(out)
    }

    /// A line of exactly the bound is read, terminated or not; one byte more ends the read with
    /// an error naming the line, whether or not a newline follows it.
    #[test]
    fn lines_are_read_up_to_the_bound() {
        assert_eq!(
            lines_of(b"abcd\nefgh", 4).expect("within the bound"),
            [(b"abcd".to_vec(), true), (b"efgh".to_vec(), false)]
        );
        for bytes in [&b"ok\nabcde\nnever"[..], b"ok\nabcde"] {
            let err = lines_of(bytes, 4).expect_err("over the bound");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            assert_eq!(
                err.to_string(),
                "line 2 is longer than 4 bytes; the log is not read past it"
            );
        }
    }
}
