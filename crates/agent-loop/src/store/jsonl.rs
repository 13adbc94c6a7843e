//! [`JsonlStore`]: one JSON-lines file per session in a directory.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};

use agent::{SessionEvent, SessionHeader, SessionId};
use parking_lot::Mutex;

use super::codec::{encode_line, open_regular, read_header, read_log};
use super::dir::StoreDir;
use super::error::StoreError;
use super::writer::{Known, Plan, ReleaseLatch, SessionFile};
use super::{LoadedSession, SessionSummary};

/// The file extension of session logs.
const EXTENSION: &str = "jsonl";

/// The embedded default store: a directory holding one file `<id>.jsonl` per session, the
/// header's JSON on line 1 and one event per line after it, append-only.
///
/// # Writing and durability
/// * [`create`](Self::create) and [`append`](Self::append) are synchronous and never touch
///   the disk on the caller's thread: they check what can be checked in memory (header validity,
///   a different header already created here, `seq` contiguity), buffer the line, and hand the
///   I/O to a per-session background writer on tokio's blocking pool. Lines reach the file in
///   `seq` order; concurrent appends share one `write`.
/// * [`flush`](Self::flush) is the durability checkpoint: it returns once every event appended
///   before the call is on stable storage (`fdatasync`; the first one also syncs the
///   directory). Concurrent flushes of one session share one sync (group commit). Failures the
///   writer met after `create`/`append` returned (a different log already on disk, an I/O
///   error, a `seq` that does not continue an existing log) surface here.
/// * A flush also checks that the file it synced is still the log at its path: a log deleted
///   or replaced (renamed over) while this store had it open fails the flush with
///   [`StoreError::Io`] (kind `NotFound`) rather than reporting durable events no reader will
///   find.
/// * After an I/O failure — or a panic in its background writer, reported as
///   [`StoreError::Io`] — a session's writer is poisoned: its appends and flushes fail with the
///   same error until [`close`](Self::close) or [`remove`](Self::remove).
///
/// # One writer per log
/// The writer takes an exclusive advisory lock on a log (`flock`, through [`std::fs::File::try_lock`])
/// when it first opens it for writing, before reading, repairing or appending anything, and
/// holds it until [`close`](Self::close) or until the store is dropped (at once when everything
/// it accepted has been written, else after its writer's last write; a process that exits or
/// crashes releases it too). Meanwhile another store — in
/// this process or another — can still read the log, but its writer fails with
/// [`StoreError::Locked`] (surfacing at its flush, or at once from [`claim`](Self::claim),
/// which the runtime calls when it resumes a session) and writes nothing. A log that grew since
/// this store read it (or that had a torn tail when read) is read again under the lock, so
/// appends continuing the stale reading
/// fail with [`StoreError::SeqMismatch`] instead of writing a second event with the same seq.
/// On a file system without advisory locks the log is written unlocked.
///
/// # Crash repair
/// A torn **last** line (an interrupted write: not well-formed JSON, and either without its
/// trailing `\n` or holding NUL bytes — blocks a power loss left unwritten) is dropped on load
/// with a `tracing` warning and reported as [`LoadedSession::repaired`]; the file is only
/// rewritten by the next append (or [`claim`](Self::claim)), which first truncates the torn
/// bytes. A damaged line anywhere
/// else is [`StoreError::Corrupt`] naming the file and its 1-based line, and so is a NUL-free
/// last line that ends in `\n`, or one that is well-formed JSON but no valid event: the writer
/// only hands whole lines to the OS, so no interrupted write leaves one, and it may hold a
/// flushed event. Such a file is never rewritten or truncated. Loaded events are validated with
/// [`agent::session::validate_log`].
///
/// # Ownership and concurrency
/// `Send + Sync`, shared as `Arc<JsonlStore>`. A log has one writing store at a time (see
/// below); readers are never blocked. It keeps per-session writer state for every
/// session it created, appended to or loaded, and an open file handle for those it wrote to;
/// [`close`](Self::close) releases one. Async methods do their file I/O on tokio's blocking pool
/// and must run inside a tokio runtime; `create`/`append` called outside one write on a plain
/// thread instead.
///
/// # Cancellation
/// Dropping a `flush` future abandons the wait, not the sync. Accepted appends are written even
/// if every handle to the store is dropped.
#[derive(Debug)]
pub struct JsonlStore {
    /// The directory, created (and its chain of entries synced) with the first session.
    dir: Arc<StoreDir>,
    /// Writer state by session. The lock protects only the map (never held across an
    /// `.await` or during I/O); an append accepts its line under it, so a writer taken out of
    /// the map (by `close` or `remove`) never accepts another line.
    files: Mutex<HashMap<SessionId, Arc<SessionFile>>>,
    /// The release latches of the writers `close` is closing: a writer made for the same log
    /// meanwhile opens the log only after its predecessor let go of the lock. Taken after
    /// `files` when both are held.
    closing: Mutex<HashMap<SessionId, Arc<ReleaseLatch>>>,
    /// Syncs issued by flushes of sessions this store held no writer for (tests read it).
    #[cfg(test)]
    unheld_syncs: Arc<AtomicU64>,
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

impl JsonlStore {
    /// A store over `dir`. No I/O happens here; the directory is created with the first
    /// session, and a missing directory lists as empty. Creating it also syncs the entries of
    /// every directory made (and of `dir` itself) in their parents, once per store, so a log
    /// reported durable survives a crash together with the directories that hold it.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: Arc::new(StoreDir::new(dir.into())),
            files: Mutex::new(HashMap::new()),
            closing: Mutex::new(HashMap::new()),
            #[cfg(test)]
            unheld_syncs: Arc::default(),
        }
    }

    /// The directory this store writes to.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The log file of session `id` (whether or not it exists).
    pub fn path_of(&self, id: &SessionId) -> Result<PathBuf, StoreError> {
        check_id(id)?;
        Ok(self.dir.path().join(format!("{id}.{EXTENSION}")))
    }

    /// Creates session `header.id`; its header line is written in the background.
    ///
    /// Creating a session this store already knows with an equal header is a no-op (a resumed
    /// session); a different header is [`StoreError::Duplicate`]. A log already on disk is
    /// adopted when its header is equal and reported as a duplicate by the next `flush`
    /// otherwise; a file left with only a torn header line (a crash during creation: empty, or
    /// one unterminated line that is not well-formed JSON) is replaced, with a warning. Any
    /// other file is left as it is and fails the next `flush` with [`StoreError::Corrupt`]: one
    /// whose only line is complete JSON but no valid header of this session, or whose first
    /// line is longer than any header (`MAX_HEADER_LINE`; only that much of it is read, as by
    /// [`load`](Self::load)).
    ///
    /// An invalid header (a `cwd` that is not UTF-8 among them, which JSON cannot hold) is
    /// [`StoreError::Header`], and one that still cannot be encoded as JSON is
    /// [`StoreError::EncodeHeader`]: at once either way, and nothing is created.
    pub fn create(&self, header: &SessionHeader) -> Result<(), StoreError> {
        header.validate()?;
        let path = self.path_of(&header.id)?;
        // Encoded before anything is made, so a header that cannot be written creates nothing.
        let line = encode_line(header).map_err(|e| StoreError::EncodeHeader {
            id: header.id.clone(),
            reason: e.to_string(),
        })?;
        let mut files = self.files.lock();
        if let Some(file) = files.get(&header.id)
            && !file.is_failed()
        {
            return match file.header() {
                Some(existing) if &existing != header => Err(StoreError::Duplicate(header.id.clone())),
                _ => Ok(()),
            };
        }
        let file = SessionFile::new(
            header.id.clone(),
            path,
            self.dir.clone(),
            Plan::Create {
                header: header.clone(),
                line,
            },
            self.closing.lock().get(&header.id).cloned(),
        );
        file.start();
        files.insert(header.id.clone(), file);
        Ok(())
    }

    /// Appends `event` to session `id`'s log without waiting for the disk. `event.seq` must
    /// equal the number of events already stored ([`StoreError::SeqMismatch`] otherwise,
    /// nothing stored). For a session this store has neither created nor loaded, the check
    /// against the existing log happens when the writer opens it and fails the next `flush`.
    pub fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), StoreError> {
        let line = encode_line(event).map_err(|e| StoreError::Encode {
            id: id.clone(),
            seq: event.seq,
            reason: e.to_string(),
        })?;
        // Accepted under the map's lock: a writer `close` or `remove` has taken out of the map
        // (and is waiting for, or has released) gets no more lines.
        let mut files = self.files.lock();
        let file = match files.get(id) {
            Some(file) => file,
            None => {
                let file = SessionFile::new(
                    id.clone(),
                    self.path_of(id)?,
                    self.dir.clone(),
                    Plan::Existing(None),
                    self.closing.lock().get(id).cloned(),
                );
                files.entry(id.clone()).or_insert(file)
            }
        };
        file.accept(event.seq, &line)
    }

    /// Durability checkpoint for session `id`: every event appended before this call is on
    /// stable storage when it returns `Ok`. Concurrent flushes share one sync. For a session
    /// this store writes nothing to — never written to, [`close`](Self::close)d or
    /// [`release`](Self::release)d since, or only [`load`](Self::load)ed since — checks its
    /// header (like [`inspect`](Self::inspect)) and syncs the log and the directory entry naming
    /// it: `close` and `release` hand every accepted line to the OS but sync nothing. A failure
    /// a released writer met after its release fails it (see [`release`](Self::release)).
    pub async fn flush(&self, id: &SessionId) -> Result<(), StoreError> {
        match self.cached(id) {
            // A writer that only read the log has nothing of its own to sync, but one this
            // store let go of may have written lines nobody synced.
            Some(file) if !file.only_reads() => file.flush().await,
            _ => self.sync_unheld(id).await,
        }
    }

    /// [`flush`](Self::flush) of a session this store holds no writer for.
    async fn sync_unheld(&self, id: &SessionId) -> Result<(), StoreError> {
        let path = self.path_of(id)?;
        let dir = self.dir.clone();
        let id = id.clone();
        #[cfg(test)]
        let counted = self.unheld_syncs.clone();
        // A released writer may still be writing what it accepted: the sync must cover it, and
        // lines it failed to write must not read as durable.
        let released = self.released(&id);
        blocking(path.clone(), move || {
            failure_of(released)?;
            read_header(&path, &id)?;
            let file =
                open_regular(&path, fs::OpenOptions::new().read(true)).map_err(|e| match e.kind() {
                    io::ErrorKind::NotFound => StoreError::NotFound(id.clone()),
                    _ => StoreError::io(&path, e),
                })?;
            file.sync_data().map_err(|e| StoreError::io(&path, e))?;
            dir.sync(dir.path())?;
            #[cfg(test)]
            counted.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })
        .await
    }

    /// How many syncs flushes of sessions this store held no writer for have issued.
    #[cfg(test)]
    pub(crate) fn unheld_syncs(&self) -> u64 {
        self.unheld_syncs.load(Ordering::Relaxed)
    }

    /// Every stored session, ordered by `createdAt` then id. Reads only header lines (after
    /// pending creations reached the disk). A file whose name is no valid session id (see
    /// [`path_of`](Self::path_of)) or whose header cannot be read is skipped with a
    /// warning (use [`inspect`](Self::inspect) or [`load`](Self::load) on it to get the error).
    pub async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
        let open: Vec<Arc<SessionFile>> = self.files.lock().values().cloned().collect();
        for file in open {
            if let Err(e) = file.settle().await {
                tracing::warn!(error = %e, "a session log write failed before listing");
            }
        }
        let letting_go: Vec<Arc<ReleaseLatch>> = self
            .closing
            .lock()
            .values()
            .filter(|latch| !latch.is_raised())
            .cloned()
            .collect();
        let dir = self.dir.path().to_owned();
        blocking(dir.clone(), move || {
            letting_go.iter().for_each(|latch| latch.wait());
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(StoreError::io(&dir, e)),
            };
            let mut out = Vec::new();
            for entry in entries {
                let path = entry.map_err(|e| StoreError::io(&dir, e))?.path();
                if path.extension().and_then(|e| e.to_str()) != Some(EXTENSION) {
                    continue;
                }
                let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                    continue;
                };
                let id = SessionId::from(stem);
                if let Err(e) = check_id(&id) {
                    // Not a name this store gives a log, and one `load` would refuse: listing it
                    // would offer a session nobody can open.
                    tracing::warn!(path = %path.display(), error = %e, "skipping a file whose name is no session id");
                    continue;
                }
                match read_header(&path, &id) {
                    Ok(header) => out.push(SessionSummary { id, header }),
                    Err(StoreError::NotFound(_)) => {}
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "skipping an unreadable session log");
                    }
                }
            }
            out.sort_by(|a, b| (a.header.created_at, &a.id).cmp(&(b.header.created_at, &b.id)));
            Ok(out)
        })
        .await
    }

    /// The header of session `id` as stored (reads only the first line, after a pending
    /// creation reached the disk).
    pub async fn inspect(&self, id: &SessionId) -> Result<SessionHeader, StoreError> {
        let path = self.path_of(id)?;
        if let Some(file) = self.cached(id) {
            settle_for_reading(&file).await;
        }
        let letting_go = self.letting_go(id);
        let id = id.clone();
        blocking(path.clone(), move || {
            wait_for(letting_go);
            read_header(&path, &id)
        })
        .await
    }

    /// The header and every intact event of session `id`, after every accepted append reached
    /// the file (or this store's writer failed: a poisoned writer keeps its failure for `flush`
    /// and [`claim`](Self::claim), and the log is read as it is on disk). A torn last line is
    /// dropped (with a warning) and reported as `repaired`; the file is not modified. The store
    /// remembers the log's length, so appends can continue it: loading again a session this
    /// store has only read so far (another store may have continued it meanwhile) updates what
    /// it remembers, so the next append continues the log as this load returned it.
    pub async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError> {
        let path = self.path_of(id)?;
        let cached = self.cached(id);
        if let Some(file) = &cached {
            settle_for_reading(file).await;
        }
        let letting_go = self.letting_go(id);
        let read_id = id.clone();
        let parsed = blocking(path.clone(), move || {
            wait_for(letting_go);
            read_log(&path, &read_id)
        })
        .await?;
        match cached {
            Some(file) => {
                // An idle writer (one an earlier load made) takes this newer reading; one that
                // has opened the log holds its lock, so nobody else appended since it read it.
                if !file.refresh(&parsed) && file.header().is_none() {
                    file.set_header(parsed.header.clone());
                }
            }
            None => {
                let mut files = self.files.lock();
                let file = SessionFile::new(
                    id.clone(),
                    self.path_of(id)?,
                    self.dir.clone(),
                    Plan::Existing(Some(Known::from(&parsed))),
                    self.closing.lock().get(id).cloned(),
                );
                file.set_header(parsed.header.clone());
                files.entry(id.clone()).or_insert(file);
            }
        }
        Ok(LoadedSession {
            header: parsed.header,
            events: parsed.events,
            repaired: parsed.torn,
        })
    }

    /// Makes this store the writer of session `id`, which the caller loaded with `events`
    /// events, before it continues the session: opens the log for appending now, under its
    /// advisory lock (cutting a torn tail, as the first append would), so that a log another
    /// store holds fails here with [`StoreError::Locked`] instead of at a later flush, and a
    /// log that another writer continued after the load fails with [`StoreError::Changed`].
    ///
    /// A claim that fails before this store appended anything to the session leaves no
    /// writer behind (and the lock released): the session can be loaded and claimed again
    /// once the other writer lets go. A writer poisoned by an earlier failed append keeps
    /// its failure (returned here) until [`close`](Self::close).
    pub async fn claim(&self, id: &SessionId, events: u64) -> Result<(), StoreError> {
        let path = self.path_of(id)?;
        // A writer this store released that failed afterwards is reported as a poisoned one
        // would be, until `close`.
        if let Some(latch) = self.released(id) {
            blocking(path.clone(), move || failure_of(Some(latch))).await?;
        }
        let file = {
            let mut files = self.files.lock();
            let file = files.entry(id.clone()).or_insert_with(|| {
                SessionFile::new(
                    id.clone(),
                    path,
                    self.dir.clone(),
                    Plan::Existing(None),
                    self.closing.lock().get(id).cloned(),
                )
            });
            Arc::clone(file)
        };
        let claimed = file.claim(events).await;
        if claimed.is_err() && file.accepted_nothing() {
            // Nothing of the caller's is at stake: forget the writer (releasing the lock if it
            // took it) so the next load and claim start over.
            self.close_writer(id, Some(&file)).await.ok();
        }
        claimed
    }

    /// Deletes session `id`'s log (after its pending writes, so nothing recreates it) and syncs
    /// the store directory, so the deletion survives a crash once this returns `Ok`. A log that
    /// does not exist is [`StoreError::NotFound`]. If the deletion succeeded but the directory
    /// sync failed, the log is gone yet the error ([`StoreError::Io`]) says the removal may not
    /// survive a crash.
    ///
    /// The session's writer is forgotten (a failure it met is dropped with the log) and lets go
    /// of the log's lock once it has written what it accepted. An append, claim or create of
    /// `id` made while `remove` runs makes a new writer, which opens the log only after that:
    /// it either continues the log just before the deletion (its next flush then fails with
    /// [`StoreError::Io`] of kind `NotFound`: the log was deleted while this store had it
    /// open) or finds it gone — never [`StoreError::Locked`] by this store's own writer.
    pub async fn remove(&self, id: &SessionId) -> Result<(), StoreError> {
        let path = self.path_of(id)?;
        let (cached, letting_go) = {
            let mut files = self.files.lock();
            let cached = files.remove(id);
            let mut closing = self.closing.lock();
            // A writer released before this one may still be writing: the deletion waits.
            let letting_go = closing.get(id).filter(|latch| !latch.is_raised()).cloned();
            // Recorded like `close` records it: a writer made for the log meanwhile waits for
            // this one to let go of the log's lock.
            if let Some(file) = &cached
                && !file.only_reads()
            {
                closing.insert(id.clone(), file.latch());
            }
            (cached, letting_go)
        };
        let _closing = cached.as_ref().map(|file| Closing {
            store: self,
            id,
            latch: file.latch(),
        });
        if let Some(file) = &cached {
            // A failed writer has nothing more to write; the file may still exist.
            let _ = file.settle().await;
            file.release();
        }
        let removed = id.clone();
        let dir = self.dir.clone();
        blocking(path.clone(), move || {
            // A released writer still writing would recreate or extend the file.
            wait_for(letting_go);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(StoreError::NotFound(removed)),
                Err(e) => return Err(StoreError::io(&path, e)),
            }
            // Else the deleted entry may come back after a crash.
            dir.sync(dir.path())
        })
        .await?;
        // A failure a released writer met concerned a log that is gone now.
        let mut closing = self.closing.lock();
        if closing.get(id).is_some_and(|latch| latch.is_raised()) {
            closing.remove(id);
        }
        Ok(())
    }

    /// Forgets session `id`'s writer state and closes its file after every accepted append has
    /// reached the file (not a durability checkpoint: flush, before or after, for that),
    /// releasing the log's lock before it returns. Also clears a writer poisoned by a failure, returning that
    /// failure — one a [`release`](Self::release)d writer met after its release included. A later append reopens the log — also one made while `close` runs, whose new
    /// writer opens the log only once this one has let go of it (when `close` returns, or when
    /// a dropped `close` future's writer is dropped). No-op for a session this store holds no
    /// state for.
    pub async fn close(&self, id: &SessionId) -> Result<(), StoreError> {
        self.close_writer(id, None).await
    }

    /// Lets go of session `id` without waiting: forgets its writer, which closes the log — and
    /// with it the log's lock — as soon as every line it accepted has been written (at once
    /// when nothing is left to write). Nothing accepted is dropped, and this is no durability
    /// checkpoint: a later [`flush`](Self::flush) syncs what the writer wrote. A later append,
    /// claim or create of `id` makes a new writer, which opens the log only once this one has
    /// let go of it. No-op for a session this store holds no writer for.
    ///
    /// Unlike [`close`](Self::close) it never blocks, so the runtime calls it (through
    /// [`SessionPersistence::release`](agent::store::SessionPersistence::release)) when a live
    /// session is removed. A writer poisoned by a failure is kept: its failure is still what
    /// the next [`flush`](Self::flush) or [`claim`](Self::claim) of the session reports (a
    /// log that lost lines must not read as durable), until [`close`](Self::close) clears it —
    /// and so is a failure the released writer meets afterwards, writing what it accepted.
    pub fn release(&self, id: &SessionId) {
        let file = {
            let mut files = self.files.lock();
            if files.get(id).is_none_or(|file| file.is_failed()) {
                return;
            }
            let Some(file) = files.remove(id) else { return };
            if file.only_reads() {
                // It holds no file and will write nothing: nothing to wait for. Its latch must
                // not replace that of a writer let go of before it, still writing or failed.
                return;
            }
            let mut closing = self.closing.lock();
            // Latches of writers that have let go already guard nothing any more, unless they
            // carry a failure still to report.
            closing.retain(|_, latch| !latch.is_raised() || latch.failure().is_some());
            closing.insert(id.clone(), file.latch());
            file
        };
        file.release_if_written();
        // Dropping the last handle closes the file; a drainer still writing holds one until
        // its last write.
        drop(file);
    }

    /// [`close`](Self::close), of session `id`'s writer only if it is `only` (when given).
    async fn close_writer(&self, id: &SessionId, only: Option<&Arc<SessionFile>>) -> Result<(), StoreError> {
        let (cached, earlier) = {
            let mut files = self.files.lock();
            if let Some(only) = only
                && !files.get(id).is_some_and(|f| Arc::ptr_eq(f, only))
            {
                return Ok(());
            }
            let cached = files.remove(id);
            let mut closing = self.closing.lock();
            // A writer released before: `close` waits for it and reports (and clears) a failure
            // it met. Not when only cleaning up after a claim.
            let earlier = closing.get(id).filter(|_| only.is_none()).cloned();
            if let Some(file) = &cached
                && !file.only_reads()
            {
                closing.insert(id.clone(), file.latch());
            }
            (cached, earlier)
        };
        let mut result = Ok(());
        if let Some(file) = cached {
            // Forgets the latch however this ends (a dropped `close` included): the writer
            // raises it itself when it is dropped.
            let _closing = Closing {
                store: self,
                id,
                latch: file.latch(),
            };
            result = file.settle().await;
            // Reported here, so not again by a successor that waits for this writer.
            let failure = file.latch().take_failure();
            file.release();
            result = result.and(failure.map_or(Ok(()), Err));
        }
        if let Some(latch) = earlier {
            let path = self.path_of(id)?;
            let waited = latch.clone();
            let failure = blocking(path, move || {
                waited.wait();
                Ok(waited.take_failure())
            })
            .await?;
            let mut closing = self.closing.lock();
            if closing.get(id).is_some_and(|l| Arc::ptr_eq(l, &latch)) {
                closing.remove(id);
            }
            if let Some(err) = failure {
                result = result.and(Err(err));
            }
        }
        result
    }

    /// How many `fdatasync`s this store has issued for session `id` since it began holding
    /// state for it (`None` when it holds none). Diagnostics: group-commit tests and benchmarks
    /// use it to check that concurrent flushes share syncs.
    pub fn sync_count(&self, id: &SessionId) -> Option<u64> {
        self.cached(id).map(|f| f.syncs())
    }

    /// How many times the store directory itself has been synced (tests read it).
    #[cfg(test)]
    pub(crate) fn store_dir_syncs(&self) -> usize {
        self.dir
            .synced()
            .iter()
            .filter(|d| d.as_path() == self.dir.path())
            .count()
    }

    /// Session `id`'s writer, if this store holds one (tests use it to inject faults or to hold
    /// a writer alive as a drainer still finishing its work would).
    #[cfg(test)]
    pub(crate) fn writer(&self, id: &SessionId) -> Option<Arc<SessionFile>> {
        self.cached(id)
    }

    fn cached(&self, id: &SessionId) -> Option<Arc<SessionFile>> {
        self.files.lock().get(id).cloned()
    }
}

impl Drop for JsonlStore {
    /// Releases the lock of every log whose accepted lines have all been written, so another
    /// store can continue it at once; a writer still writing keeps its lock until its last
    /// write.
    fn drop(&mut self) {
        for file in self.files.get_mut().values() {
            file.release_if_written();
        }
    }
}

impl JsonlStore {
    /// The latch of a writer of `id` this store has let go of (released or being closed) that
    /// may still be writing what it accepted: a read, sync or removal of the log waits for it.
    fn letting_go(&self, id: &SessionId) -> Option<Arc<ReleaseLatch>> {
        self.closing
            .lock()
            .get(id)
            .filter(|latch| !latch.is_raised())
            .cloned()
    }

    /// The latch of a writer of `id` this store has let go of that may still be writing, or
    /// that failed: a flush or claim waits for it and reports its failure.
    fn released(&self, id: &SessionId) -> Option<Arc<ReleaseLatch>> {
        self.closing
            .lock()
            .get(id)
            .filter(|latch| !latch.is_raised() || latch.failure().is_some())
            .cloned()
    }
}

/// Waits (on a blocking-pool thread) for a writer the store let go of, then returns the failure
/// it met, if any.
fn failure_of(latch: Option<Arc<ReleaseLatch>>) -> Result<(), StoreError> {
    match latch {
        Some(latch) => {
            latch.wait();
            latch.failure().map_or(Ok(()), Err)
        }
        None => Ok(()),
    }
}

/// Waits (on a blocking-pool thread) until a writer the store let go of has let go of the log.
fn wait_for(latch: Option<Arc<ReleaseLatch>>) {
    if let Some(latch) = latch {
        latch.wait();
    }
}

/// Removes a closed writer's latch from [`JsonlStore::closing`] unless a later `close` of the
/// same session replaced it.
struct Closing<'a> {
    store: &'a JsonlStore,
    id: &'a SessionId,
    latch: Arc<ReleaseLatch>,
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        let mut closing = self.store.closing.lock();
        if closing.get(self.id).is_some_and(|l| Arc::ptr_eq(l, &self.latch)) {
            closing.remove(self.id);
        }
    }
}

/// Waits until what `file` accepted is written, so a read sees it. A writer that failed (before
/// or during the wait) keeps its failure for `flush` and `claim`; a reader reads the log as the
/// failure left it rather than failing too.
async fn settle_for_reading(file: &Arc<SessionFile>) {
    if let Err(e) = file.settle().await {
        tracing::debug!(error = %e, "reading a session log whose writer in this store failed");
    }
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
