//! The JSON-lines format: encoding lines and parsing a whole log with torn-tail detection.
//!
//! A log file is the header's JSON on line 1, then one event's JSON per line, every line ending
//! in `\n`. The writer hands only whole lines to the OS, so a write that was interrupted can only
//! leave an **unterminated** proper prefix of a line at the end of the file — or, after a power
//! loss, a tail whose unwritten blocks read back as zero bytes (a page of the line lost, the page
//! holding its `\n` kept). Neither was acknowledged durable (no flush completed over it). Hence:
//!
//! * a last line that is not even well-formed JSON and either lacks its `\n` or holds a NUL
//!   byte (which no encoded line holds: JSON escapes it) is a torn write and is dropped (the next
//!   append cuts it);
//! * a last line that parses but lacks its `\n` is complete (a JSON object's proper prefix never
//!   parses) and is kept; the writer adds the missing `\n` before appending;
//! * any other line that does not parse as an event is corruption, reported with its 1-based
//!   line number ([`StoreError::Corrupt`]) and never dropped or cut. That includes a NUL-free
//!   last line that ends in `\n` (written whole, so no interrupted write: whatever damaged it,
//!   it may have held a flushed event) and a last line that is well-formed JSON but no valid
//!   event (written whole too: by another version, a tool, a hand).
//!
//! The header line follows the same rule: only a lone unterminated first line that is not
//! well-formed JSON is an interrupted header write.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead as _, BufReader, Read as _};
use std::path::Path;

use agent::{SessionEvent, SessionHeader, SessionId};

use super::error::StoreError;

/// Encodes one value as a JSON line (with its trailing `\n`).
pub(crate) fn encode_line<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    Ok(line)
}

/// A parsed log.
#[derive(Debug)]
pub(crate) struct ParsedLog {
    pub header: SessionHeader,
    pub events: Vec<SessionEvent>,
    /// Byte length of the intact prefix (the file minus a torn last line).
    pub good_len: u64,
    /// Whether a torn last line was dropped.
    pub torn: bool,
    /// Whether the last kept line lacks its trailing `\n`.
    pub needs_newline: bool,
    /// Byte length of the whole file as read (torn bytes included).
    pub file_len: u64,
}

/// Splits `bytes` into lines: `(start, end_without_newline, terminated)`.
fn lines(bytes: &[u8]) -> Vec<(usize, usize, bool)> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < bytes.len() {
        match bytes[start..].iter().position(|b| *b == b'\n') {
            Some(n) => {
                out.push((start, start + n, true));
                start += n + 1;
            }
            None => {
                out.push((start, bytes.len(), false));
                start = bytes.len();
            }
        }
    }
    out
}

fn corrupt(path: &Path, line: usize, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        path: path.to_path_buf(),
        line: line as u64,
        reason: reason.into(),
    }
}

/// Whether `line` is one well-formed JSON value (of any shape). A proper prefix of an encoded
/// object never is, so a line that is cannot be an interrupted write.
pub(crate) fn well_formed_json(line: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok()
}

/// Parses the header line.
pub(crate) fn parse_header(path: &Path, id: &SessionId, line: &[u8]) -> Result<SessionHeader, StoreError> {
    let header: SessionHeader =
        serde_json::from_slice(line).map_err(|e| corrupt(path, 1, format!("invalid header: {e}")))?;
    header
        .validate()
        .map_err(|e| corrupt(path, 1, format!("invalid header: {e}")))?;
    if &header.id != id {
        return Err(corrupt(
            path,
            1,
            format!(
                "header names session `{}`, the file is named for `{id}`",
                header.id
            ),
        ));
    }
    Ok(header)
}

/// Parses a whole log file. See the module documentation for the torn-tail rules. Events are
/// validated with [`agent::session::validate_log`].
pub(crate) fn parse_log(path: &Path, id: &SessionId, bytes: &[u8]) -> Result<ParsedLog, StoreError> {
    let lines = lines(bytes);
    let Some(&(h_start, h_end, h_terminated)) = lines.first() else {
        return Err(corrupt(path, 1, "empty file: the header was never written"));
    };
    let header = match parse_header(path, id, &bytes[h_start..h_end]) {
        Ok(h) => h,
        Err(e) if lines.len() == 1 && !h_terminated && !well_formed_json(&bytes[h_start..h_end]) => {
            return Err(corrupt(
                path,
                1,
                format!("incomplete header (interrupted write): {e}"),
            ));
        }
        Err(e) => return Err(e),
    };
    let mut events = Vec::with_capacity(lines.len().saturating_sub(1));
    let mut good_len = if h_terminated { h_end + 1 } else { h_end } as u64;
    let mut needs_newline = !h_terminated;
    let mut torn = false;
    let last = lines.len() - 1;
    for (i, &(start, end, terminated)) in lines.iter().enumerate().skip(1) {
        match serde_json::from_slice::<SessionEvent>(&bytes[start..end]) {
            Ok(event) => {
                events.push(event);
                good_len = if terminated { end + 1 } else { end } as u64;
                needs_newline = !terminated;
            }
            // Only a last line that is not well-formed JSON and is unterminated (the writer never
            // leaves a newline-terminated partial line) or holds lost blocks' zeros can be a
            // torn write.
            Err(e)
                if i == last
                    && (!terminated || bytes[start..end].contains(&0))
                    && !well_formed_json(&bytes[start..end]) =>
            {
                tracing::warn!(
                    path = %path.display(),
                    line = i + 1,
                    error = %e,
                    "dropping the torn last line of a session log (an interrupted write)"
                );
                torn = true;
            }
            Err(e) => return Err(corrupt(path, i + 1, format!("invalid event: {e}"))),
        }
    }
    agent::session::validate_log(&events).map_err(|source| StoreError::InvalidLog {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(ParsedLog {
        header,
        events,
        good_len,
        torn,
        needs_newline,
        file_len: bytes.len() as u64,
    })
}

/// What a file that is not a regular file is, for the error naming it.
fn file_kind(meta: &fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        let kind = meta.file_type();
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Fails unless `meta` describes a regular file.
fn ensure_regular(meta: &fs::Metadata) -> io::Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file ({})", file_kind(meta)),
    ))
}

/// Opens the log at `path` (symbolic links followed) with `options`, but only if it is a
/// regular file: a FIFO, socket, device or directory is never read or written, so a stray
/// FIFO named `<id>.jsonl` cannot block the process (opening one for reading waits for a
/// writer) and `/dev/zero` cannot be read forever. The type is checked before opening, and the
/// open file is checked again (the path may have been replaced in between); the open itself
/// does not block (`O_NONBLOCK`, no effect on regular files) nor take a controlling terminal.
pub(crate) fn open_regular(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    ensure_regular(&fs::metadata(path)?)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let file = options.open(path)?;
    ensure_regular(&file.metadata()?)?;
    Ok(file)
}

/// Opens the log at `path` for reading (see [`open_regular`]); a missing file is
/// [`StoreError::NotFound`].
fn open_for_reading(path: &Path, id: &SessionId) -> Result<File, StoreError> {
    open_regular(path, OpenOptions::new().read(true)).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => StoreError::NotFound(id.clone()),
        _ => StoreError::io(path, e),
    })
}

/// The longest header line a store reads, newline excluded. A header holds ids, one path and a
/// few numbers (a few KiB at most), so a longer first line can only be damage: reading stops
/// there instead of pulling a damaged (or huge sparse) file into memory to list the store.
pub(crate) const MAX_HEADER_LINE: u64 = 1 << 20;

/// Reads the first line of `path` and parses it as `id`'s header (blocking). At most
/// [`MAX_HEADER_LINE`] bytes (and the newline) are read: a longer first line is
/// [`StoreError::Corrupt`].
pub(crate) fn read_header(path: &Path, id: &SessionId) -> Result<SessionHeader, StoreError> {
    let file = open_for_reading(path, id)?;
    let mut line = Vec::new();
    BufReader::new(file)
        .take(MAX_HEADER_LINE + 1)
        .read_until(b'\n', &mut line)
        .map_err(|e| StoreError::io(path, e))?;
    let terminated = line.last() == Some(&b'\n');
    if terminated {
        line.pop();
    } else if line.len() as u64 > MAX_HEADER_LINE {
        return Err(corrupt(
            path,
            1,
            format!("the header line is longer than {MAX_HEADER_LINE} bytes"),
        ));
    }
    if line.is_empty() && !terminated {
        return Err(corrupt(path, 1, "empty file: the header was never written"));
    }
    parse_header(path, id, &line).map_err(|e| match e {
        StoreError::Corrupt {
            path,
            line: n,
            reason,
        } if !terminated && !well_formed_json(&line) => StoreError::Corrupt {
            path,
            line: n,
            reason: format!("incomplete header (interrupted write): {reason}"),
        },
        other => other,
    })
}

/// Reads a whole log file's bytes from `file` (blocking), but refuses one whose first line is
/// longer than [`MAX_HEADER_LINE`] after reading only that far: such a file holds no header,
/// so it is no log, and a huge (possibly sparse) one must not be pulled into memory whole.
pub(crate) fn read_log_bytes(path: &Path, file: &File) -> Result<Vec<u8>, StoreError> {
    let mut reader = BufReader::new(file);
    let mut bytes = Vec::new();
    (&mut reader)
        .take(MAX_HEADER_LINE + 1)
        .read_until(b'\n', &mut bytes)
        .map_err(|e| StoreError::io(path, e))?;
    if bytes.last() != Some(&b'\n') && bytes.len() as u64 > MAX_HEADER_LINE {
        return Err(corrupt(
            path,
            1,
            format!("the header line is longer than {MAX_HEADER_LINE} bytes"),
        ));
    }
    reader
        .read_to_end(&mut bytes)
        .map_err(|e| StoreError::io(path, e))?;
    Ok(bytes)
}

/// Reads and parses a whole log (blocking).
pub(crate) fn read_log(path: &Path, id: &SessionId) -> Result<ParsedLog, StoreError> {
    let bytes = read_log_bytes(path, &open_for_reading(path, id)?)?;
    parse_log(path, id, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header line of exactly [`MAX_HEADER_LINE`] bytes is read; one byte more is corrupt,
    /// whether or not a newline follows it.
    #[test]
    fn the_header_line_is_read_up_to_its_bound() {
        let dir = tempfile::tempdir().expect("dir");
        let id = SessionId::from("padded");
        let header = agent::SessionMeta::default()
            .into_header(id.clone(), 1_000)
            .expect("header");
        let json = serde_json::to_vec(&header).expect("json");
        let path = dir.path().join("padded.jsonl");
        let padded = |len: u64, newline: bool| {
            let mut line = json.clone();
            line.resize(len as usize, b' ');
            if newline {
                line.push(b'\n');
            }
            fs::write(&path, &line).expect("write");
        };
        padded(MAX_HEADER_LINE, true);
        assert_eq!(read_header(&path, &id).expect("at the bound"), header);
        for newline in [true, false] {
            padded(MAX_HEADER_LINE + 1, newline);
            match read_header(&path, &id) {
                Err(StoreError::Corrupt { line: 1, reason, .. }) => {
                    assert_eq!(
                        reason,
                        format!("the header line is longer than {MAX_HEADER_LINE} bytes")
                    );
                }
                other => panic!("expected a corrupt header, got {other:?}"),
            }
        }
    }

    #[test]
    fn lines_split_with_termination() {
        assert_eq!(lines(b""), vec![]);
        assert_eq!(lines(b"a\nbc"), vec![(0, 1, true), (2, 4, false)]);
        assert_eq!(lines(b"a\n\n"), vec![(0, 1, true), (2, 2, true)]);
    }
}
