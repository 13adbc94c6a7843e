//! [`JsonlStore`]: one JSON-lines file per session in a directory.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent::{SessionEvent, SessionHeader, SessionId};
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use super::codec::{encode_line, parse_header, parse_log};
use super::error::StoreError;
use super::writer::SessionFile;
use super::{LoadedSession, SessionSummary};

/// The file extension of session logs.
const EXTENSION: &str = "jsonl";

/// A lazily opened session log, shared by concurrent first users.
type Slot = Arc<OnceCell<Arc<SessionFile>>>;

/// The embedded default store: a directory holding one file `<id>.jsonl` per session, the
/// header's JSON on line 1 and one event per line after it, append-only.
///
/// # Durability
/// * `append` returns once the event's line is handed to the operating system (visible to
///   readers, survives a crash of this process, not necessarily of the machine).
/// * `flush` is the durability checkpoint: it returns once every event whose `append` had
///   completed is on stable storage (`fdatasync`; the first flush of a new file also syncs the
///   directory). Concurrent flushes of one session share one sync (group commit).
///
/// # Crash repair
/// A torn **last** line (an interrupted write) is dropped on load with a `tracing` warning and
/// reported as [`LoadedSession::repaired`]; the first append after such a load physically
/// truncates it before writing. A damaged line anywhere else is [`StoreError::Corrupt`] naming
/// the file and line; such a file is never rewritten. Loaded events are validated with
/// [`agent::session::validate_log`].
///
/// # Ownership and concurrency
/// The store is `Send + Sync` and meant to be shared (`Arc`). It keeps an open file handle per
/// session it has written to (release one with [`JsonlStore::close`]). One store instance must
/// be the only writer of its directory; readers in other processes are fine. All file I/O runs
/// on tokio's blocking pool, so every method must be called from within a tokio runtime.
///
/// # Cancellation
/// Dropping an `append` future after its first poll does not un-append: the event is written
/// anyway. Dropping a `flush` future abandons the wait, not the sync.
#[derive(Debug)]
pub struct JsonlStore {
    dir: PathBuf,
    /// Open logs by id. The lock protects only the map (never held across an `.await`).
    files: Mutex<HashMap<SessionId, Slot>>,
}

/// Runs blocking file-system work on tokio's blocking pool.
async fn blocking<T, F>(path: PathBuf, f: F) -> Result<T, StoreError>
where
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(join) => Err(StoreError::io(
            path,
            io::Error::other(format!("blocking store task failed: {join}")),
        )),
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |e| StoreError::io(path, e)
}

/// Reads the first line of `path` and parses it as `id`'s header.
fn read_header(path: &Path, id: &SessionId) -> Result<SessionHeader, StoreError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StoreError::NotFound(id.clone())),
        Err(e) => return Err(StoreError::io(path, e)),
    };
    let mut line = Vec::new();
    BufReader::new(file)
        .read_until(b'\n', &mut line)
        .map_err(io_err(path))?;
    let terminated = line.last() == Some(&b'\n');
    if terminated {
        line.pop();
    }
    parse_header(path, id, &line).map_err(|e| match e {
        StoreError::Corrupt { path, line, reason } if !terminated => StoreError::Corrupt {
            path,
            line,
            reason: format!("incomplete header (interrupted write): {reason}"),
        },
        other => other,
    })
}

/// Reads and parses a whole log.
fn read_log(path: &Path, id: &SessionId) -> Result<super::codec::ParsedLog, StoreError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StoreError::NotFound(id.clone())),
        Err(e) => return Err(StoreError::io(path, e)),
    };
    parse_log(path, id, &bytes)
}

impl JsonlStore {
    /// A store over `dir`. No I/O happens here; the directory is created by the first
    /// `save_header`, and a missing directory lists as empty.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: Mutex::new(HashMap::new()),
        }
    }

    /// The directory this store writes to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log file of session `id` (whether or not it exists).
    pub fn path_of(&self, id: &SessionId) -> Result<PathBuf, StoreError> {
        check_id(id)?;
        Ok(self.dir.join(format!("{id}.{EXTENSION}")))
    }

    /// Creates session `header.id`: writes its header line to a new file.
    ///
    /// Saving a header equal to the stored one is a no-op; a different one is
    /// [`StoreError::Duplicate`]. A file left with only a torn header line (a crash during
    /// creation, so nothing of the session was ever acknowledged) is replaced, with a warning.
    pub async fn save_header(&self, header: &SessionHeader) -> Result<(), StoreError> {
        header.validate()?;
        let id = header.id.clone();
        let path = self.path_of(&id)?;
        let line = encode_line(header).map_err(|e| StoreError::Encode {
            id: id.clone(),
            seq: 0,
            reason: e.to_string(),
        })?;
        let dir = self.dir.clone();
        let value = header.clone();
        let p = path.clone();
        let created = blocking(path.clone(), move || {
            fs::create_dir_all(&dir).map_err(io_err(&dir))?;
            let create = || OpenOptions::new().append(true).create_new(true).open(&p);
            let file = match create() {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match read_header(&p, &id) {
                    Ok(existing) if existing == value => return Ok(None),
                    Ok(_) => return Err(StoreError::Duplicate(id)),
                    Err(StoreError::Corrupt { reason, .. }) if is_torn_header(&p)? => {
                        tracing::warn!(path = %p.display(), %reason, "replacing a session log whose header write was interrupted");
                        fs::remove_file(&p).map_err(io_err(&p))?;
                        create().map_err(io_err(&p))?
                    }
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(StoreError::io(&p, e)),
            };
            (&file).write_all(&line).map_err(io_err(&p))?;
            Ok(Some(SessionFile::new(id, p, dir, file, 1)))
        })
        .await?;
        if let Some(file) = created {
            let slot: Slot = Arc::new(OnceCell::new_with(Some(file)));
            self.files.lock().insert(header.id.clone(), slot);
        }
        Ok(())
    }

    /// Appends `event` to session `id`'s log. `event.seq` must equal the number of events
    /// already stored. Returns once the line is handed to the OS; see the type's documentation
    /// for durability and cancellation.
    pub async fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), StoreError> {
        let line = encode_line(event).map_err(|e| StoreError::Encode {
            id: id.clone(),
            seq: event.seq,
            reason: e.to_string(),
        })?;
        let file = self.open(id).await?;
        file.append(event.seq, line).await
    }

    /// Durability checkpoint for session `id`: every event whose `append` completed before this
    /// call is on stable storage when it returns `Ok`. Concurrent flushes share one sync.
    pub async fn flush(&self, id: &SessionId) -> Result<(), StoreError> {
        self.open(id).await?.flush().await
    }

    /// Every stored session, ordered by `createdAt` then id. Reads only header lines. A file
    /// whose header cannot be read is skipped with a warning (use [`JsonlStore::inspect`] or
    /// [`JsonlStore::load`] on it to get the error).
    pub async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
        let dir = self.dir.clone();
        blocking(self.dir.clone(), move || {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(StoreError::io(&dir, e)),
            };
            let mut out = Vec::new();
            for entry in entries {
                let entry = entry.map_err(io_err(&dir))?;
                let path = entry.path();
                if path.extension().and_then(|e| e.to_str()) != Some(EXTENSION) {
                    continue;
                }
                let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                    continue;
                };
                let id = SessionId::from(stem);
                match read_header(&path, &id) {
                    Ok(header) => out.push(SessionSummary { id, header }),
                    Err(StoreError::NotFound(_)) => {}
                    Err(e) => tracing::warn!(path = %path.display(), error = %e, "skipping an unreadable session log"),
                }
            }
            out.sort_by(|a, b| {
                (a.header.created_at, &a.id).cmp(&(b.header.created_at, &b.id))
            });
            Ok(out)
        })
        .await
    }

    /// The header of session `id` (reads only the first line).
    pub async fn inspect(&self, id: &SessionId) -> Result<SessionHeader, StoreError> {
        let path = self.path_of(id)?;
        let id = id.clone();
        blocking(path.clone(), move || read_header(&path, &id)).await
    }

    /// The header and every intact event of session `id`. A torn last line is dropped (with a
    /// warning) and reported as `repaired`; the file is not modified. Events of a session this
    /// store is writing are read after every accepted append has reached the file.
    pub async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError> {
        let path = self.path_of(id)?;
        let open = self.files.lock().get(id).and_then(|slot| slot.get().cloned());
        if let Some(file) = open {
            file.settle().await?;
        }
        let id = id.clone();
        let parsed = blocking(path.clone(), move || read_log(&path, &id)).await?;
        Ok(LoadedSession {
            header: parsed.header,
            events: parsed.events,
            repaired: parsed.torn,
        })
    }

    /// Deletes session `id`'s log. Appends racing with the removal of the same session may be
    /// lost; callers remove sessions they no longer write to.
    pub async fn remove(&self, id: &SessionId) -> Result<(), StoreError> {
        let path = self.path_of(id)?;
        self.files.lock().remove(id);
        let id = id.clone();
        blocking(path.clone(), move || match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(StoreError::NotFound(id)),
            Err(e) => Err(StoreError::io(&path, e)),
        })
        .await
    }

    /// Releases the open file handle of session `id` after every accepted append has reached
    /// the file (not a durability checkpoint: call `flush` first for that). The next append
    /// reopens the file. Also clears a writer poisoned by an I/O failure. No-op for a session
    /// that is not open.
    pub async fn close(&self, id: &SessionId) -> Result<(), StoreError> {
        let slot = self.files.lock().remove(id);
        match slot.and_then(|s| s.get().cloned()) {
            Some(file) => file.settle().await,
            None => Ok(()),
        }
    }

    /// How many `fdatasync`s this store instance has issued for session `id` since it opened
    /// the session's file (`None` when the file is not open). Diagnostics: group-commit tests
    /// and benchmarks use it to check that concurrent flushes share syncs.
    pub fn sync_count(&self, id: &SessionId) -> Option<u64> {
        let slot = self.files.lock().get(id).cloned()?;
        slot.get().map(|f| f.syncs())
    }

    /// The open log of `id`, opening an existing file on first use: it is read and validated,
    /// a torn last line is truncated away (with a warning) and a missing final newline added.
    async fn open(&self, id: &SessionId) -> Result<Arc<SessionFile>, StoreError> {
        let path = self.path_of(id)?;
        let slot = self.files.lock().entry(id.clone()).or_default().clone();
        let result = slot
            .get_or_try_init(|| {
                let id = id.clone();
                let dir = self.dir.clone();
                blocking(path.clone(), move || open_existing(id, path, dir))
            })
            .await
            .cloned();
        if result.is_err() {
            // Do not keep an empty slot for a session that failed to open.
            let mut files = self.files.lock();
            if files
                .get(id)
                .is_some_and(|s| Arc::ptr_eq(s, &slot) && !s.initialized())
            {
                files.remove(id);
            }
        }
        result
    }
}

/// Opens an existing log for appending (blocking).
fn open_existing(id: SessionId, path: PathBuf, dir: PathBuf) -> Result<Arc<SessionFile>, StoreError> {
    let parsed = read_log(&path, &id)?;
    let file = OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(io_err(&path))?;
    if parsed.torn {
        tracing::warn!(path = %path.display(), "truncating the torn last line of a session log before appending");
        file.set_len(parsed.good_len).map_err(io_err(&path))?;
    }
    if parsed.needs_newline {
        (&file).write_all(b"\n").map_err(io_err(&path))?;
    }
    let units = 1 + parsed.events.len() as u64;
    Ok(SessionFile::new(id, path, dir, file, units))
}

/// Whether `path` holds at most one line and no terminated one (the header write never
/// completed).
fn is_torn_header(path: &Path) -> Result<bool, StoreError> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    Ok(!bytes.contains(&b'\n'))
}

/// Rejects ids that cannot name a file inside the store's directory.
fn check_id(id: &SessionId) -> Result<(), StoreError> {
    let s = id.as_str();
    let bad = s.is_empty() || s == "." || s == ".." || s.contains(['/', '\\', '\0']) || s.len() > 200;
    if bad {
        return Err(StoreError::InvalidId(id.clone()));
    }
    Ok(())
}
