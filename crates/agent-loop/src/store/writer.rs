//! One session log being written: buffered appends, ordered writes and group-committed
//! `fdatasync`, with all file I/O off the caller's thread.
//!
//! Callers only touch a short `parking_lot` section: they check and reserve the event's `seq`,
//! push its encoded line into a buffer, and make sure a *drainer* runs. The drainer is one
//! blocking task (on tokio's blocking pool) at a time per session. It loops:
//!
//! 1. open the file on first use — create it and write the header line, or open an existing
//!    log (reading it if needed to learn its length, truncating a torn last line, restoring a
//!    missing final newline);
//! 2. hand every buffered line to the OS in one `write`;
//! 3. if a flush asked for durability beyond what is synced, one `fdatasync` covering everything
//!    written so far (the first one also syncs the directory entry);
//!
//! until there is nothing left to do. Hence writes reach the file in `seq` order, concurrent
//! appends share a `write`, and concurrent flushes share a sync (group commit): a flush arriving
//! while a sync is in flight waits for it and, if it needs more, for the single next one, which
//! covers every flush that arrived meanwhile.
//!
//! Progress is counted in *tickets*: ticket 1 is opening the file (header or repair included),
//! each accepted event line is one more. Waiters watch the published progress.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use agent::{SessionHeader, SessionId};
use parking_lot::{Condvar, Mutex, MutexGuard};
use tokio::sync::watch;

use super::codec::{ParsedLog, open_regular, parse_log, read_log, read_log_bytes, well_formed_json};
use super::dir::StoreDir;
use super::error::StoreError;

/// What a freshly parsed log told us, so the drainer need not read it again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Known {
    /// Number of intact events.
    pub events: u64,
    /// Byte length of the intact prefix.
    pub good_len: u64,
    /// Whether a torn last line must be cut before appending.
    pub torn: bool,
    /// Whether the last intact line lacks its `\n`.
    pub needs_newline: bool,
    /// The whole file's byte length when it was read: if the file has another length when the
    /// writer opens it, someone else appended since, and the log is read again (a torn log is
    /// always read again: another writer may have cut its tail and appended as many bytes).
    pub file_len: u64,
}

impl From<&ParsedLog> for Known {
    fn from(p: &ParsedLog) -> Self {
        Self {
            events: p.events.len() as u64,
            good_len: p.good_len,
            torn: p.torn,
            needs_newline: p.needs_newline,
            file_len: p.file_len,
        }
    }
}

/// What [`SessionFile::create`] found.
enum Created {
    /// A new log, header written.
    New,
    /// An existing log with an equal header, locked, to be continued.
    Adopted(File, Known),
}

/// How the drainer opens the file.
#[derive(Debug)]
pub(crate) enum Plan {
    /// Create a new log holding this header, whose line (already encoded, so a header that
    /// cannot be encoded never gets this far) is `line`.
    Create {
        /// The header.
        header: SessionHeader,
        /// Its encoded line, `\n` included.
        line: Vec<u8>,
    },
    /// Open an existing log (`None`: read it first).
    Existing(Option<Known>),
}

/// Progress published by the drainer.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    written: u64,
    synced: u64,
    failed: bool,
}

/// State protected by [`SessionFile::state`]: seq bookkeeping, the unwritten buffer and the
/// counters that decide the drainer's next job. Never held across an `.await` or during I/O.
#[derive(Debug)]
struct WriterState {
    /// How to open the file; taken by the drainer.
    plan: Option<Plan>,
    /// The log length this writer assumes (0 for a new log, the parsed length for a loaded
    /// one); `None` while unknown (an existing log not read yet). The drainer checks it when it
    /// opens the file.
    assumed_len: Option<u64>,
    /// The seq of the first event this writer accepted.
    first_accepted: Option<u64>,
    /// The seq the next append must carry (once anything is known).
    next_seq: u64,
    /// Tickets accepted (1 = open, plus one per event line).
    accepted: u64,
    /// Encoded lines accepted but not yet handed to the drainer.
    pending: Vec<u8>,
    /// Tickets handed to the OS.
    written: u64,
    /// Tickets made durable.
    synced: u64,
    /// The highest ticket some flush asked to make durable.
    sync_wanted: u64,
    /// Whether a drainer is running.
    draining: bool,
    /// Whether the directory entry has been synced.
    dir_synced: bool,
    /// The first failure; sticky.
    failed: Option<StoreError>,
}

/// Raised once a writer has let go of its log's advisory lock: when it is released, or when the
/// writer (and with it the open file) is dropped. A successor writer of the same log in this
/// store waits for it before it opens the log, so it never finds its predecessor's lock.
///
/// It also carries the writer's first failure (recorded before the latch is raised), so a
/// failure met after the store let go of the writer — which nobody waits on any more — is
/// still what the store's next flush or claim of the session reports.
#[derive(Debug, Default)]
pub(crate) struct ReleaseLatch {
    state: Mutex<LatchState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct LatchState {
    released: bool,
    failure: Option<StoreError>,
}

impl ReleaseLatch {
    fn raise(&self) {
        self.state.lock().released = true;
        self.changed.notify_all();
    }

    /// Records the writer's failure (the first one is kept).
    pub(crate) fn fail(&self, err: StoreError) {
        self.state.lock().failure.get_or_insert(err);
    }

    /// The failure recorded, if any.
    pub(crate) fn failure(&self) -> Option<StoreError> {
        self.state.lock().failure.clone()
    }

    /// Takes the failure recorded, if any: whoever takes it reports it.
    pub(crate) fn take_failure(&self) -> Option<StoreError> {
        self.state.lock().failure.take()
    }

    /// Whether the latch has been raised.
    pub(crate) fn is_raised(&self) -> bool {
        self.state.lock().released
    }

    /// Blocks the calling thread (a drainer, or a store read on the blocking pool) until the
    /// latch is raised.
    pub(crate) fn wait(&self) {
        let mut state = self.state.lock();
        while !state.released {
            self.changed.wait(&mut state);
        }
    }
}

/// A session log this store writes (or may write) to.
#[derive(Debug)]
pub(crate) struct SessionFile {
    id: SessionId,
    path: PathBuf,
    /// The store's directory (created, and made durable, before the log is created in it).
    dir: Arc<StoreDir>,
    /// The header, when this instance created the session or has read it.
    header: Mutex<Option<SessionHeader>>,
    /// The open file; set once by the drainer.
    file: OnceLock<File>,
    state: Mutex<WriterState>,
    progress: watch::Sender<Progress>,
    /// `fdatasync`s issued (diagnostics).
    syncs: AtomicU64,
    /// Raised when this writer lets go of the log's lock.
    latch: Arc<ReleaseLatch>,
    /// The latch of the writer this one succeeds (one its store was closing when this one was
    /// made): the drainer waits for it before opening the log.
    predecessor: Option<Arc<ReleaseLatch>>,
    /// Test seam: runs in `create` between creating the file and locking it.
    #[cfg(test)]
    before_lock: tests::Hook,
    /// Test seam: runs in the drainer before each event write (fault injection).
    #[cfg(test)]
    before_write: tests::Hook,
}

impl Drop for SessionFile {
    fn drop(&mut self) {
        // The open file (and its lock) goes with the writer: closed first, then announced (the
        // fields would only be dropped after this body).
        drop(self.file.take());
        self.latch.raise();
    }
}

impl SessionFile {
    /// A writer that will open the log as `plan` says, once `predecessor` (the latch of a
    /// writer of the same log its store is closing) is raised.
    pub(crate) fn new(
        id: SessionId,
        path: PathBuf,
        dir: Arc<StoreDir>,
        plan: Plan,
        predecessor: Option<Arc<ReleaseLatch>>,
    ) -> Arc<Self> {
        let (header, next_seq) = match &plan {
            Plan::Create { header, .. } => (Some(header.clone()), Some(0)),
            Plan::Existing(known) => (None, known.map(|k| k.events)),
        };
        Arc::new(Self {
            id,
            path,
            dir,
            header: Mutex::new(header),
            file: OnceLock::new(),
            state: Mutex::new(WriterState {
                plan: Some(plan),
                assumed_len: next_seq,
                first_accepted: None,
                next_seq: next_seq.unwrap_or(0),
                accepted: 1,
                pending: Vec::new(),
                written: 0,
                synced: 0,
                sync_wanted: 0,
                draining: false,
                dir_synced: false,
                failed: None,
            }),
            progress: watch::channel(Progress::default()).0,
            syncs: AtomicU64::new(0),
            latch: Arc::default(),
            predecessor,
            #[cfg(test)]
            before_lock: tests::Hook::default(),
            #[cfg(test)]
            before_write: tests::Hook::default(),
        })
    }

    /// The latch raised when this writer lets go of the log's lock.
    pub(crate) fn latch(&self) -> Arc<ReleaseLatch> {
        self.latch.clone()
    }

    /// The header, when known to this writer.
    pub(crate) fn header(&self) -> Option<SessionHeader> {
        self.header.lock().clone()
    }

    /// Records the header read by a load.
    pub(crate) fn set_header(&self, header: SessionHeader) {
        *self.header.lock() = Some(header);
    }

    /// Brings a writer that has neither opened its log nor accepted anything (one a `load`
    /// made) up to date with `parsed`, a newer reading of the log: another store may have
    /// continued the log since this writer's reading, and appends must continue the log as it
    /// is now. A writer that holds accepted lines or has opened the log (so holds its lock, and
    /// nobody else can have appended) is left alone, as is a poisoned one. Returns whether the
    /// writer was brought up to date.
    pub(crate) fn refresh(&self, parsed: &ParsedLog) -> bool {
        let mut st = self.state.lock();
        let idle = matches!(st.plan, Some(Plan::Existing(_))) && st.accepted == 1 && st.failed.is_none();
        if idle {
            let known = Known::from(parsed);
            st.plan = Some(Plan::Existing(Some(known)));
            st.assumed_len = Some(known.events);
            st.next_seq = known.events;
            st.first_accepted = None;
            drop(st);
            self.set_header(parsed.header.clone());
        }
        idle
    }

    /// Whether the writer is poisoned.
    pub(crate) fn is_failed(&self) -> bool {
        self.state.lock().failed.is_some()
    }

    /// Lets go of the log's advisory lock now, rather than when the last holder of this writer
    /// (possibly a drainer finishing its loop) drops it. Only for a writer that will write
    /// nothing more: its store has forgotten it and everything it accepted is written.
    pub(crate) fn release(&self) {
        if let Some(file) = self.file.get()
            && let Err(e) = file.unlock()
        {
            tracing::debug!(session = %self.id, error = %e, "could not release a session log's lock; it goes with the file");
            return;
        }
        self.latch.raise();
    }

    /// [`release`](Self::release) when the file is open and every accepted line has been
    /// handed to the OS (only a sync can still be pending). For a writer whose store is going
    /// away: nothing can be accepted any more, so nothing more will be written.
    pub(crate) fn release_if_written(&self) {
        let written = {
            let st = self.state.lock();
            st.plan.is_none() && st.written >= st.accepted
        };
        if written {
            self.release();
        }
    }

    /// Fault injection: the drainer's next event write panics.
    #[cfg(test)]
    pub(crate) fn panic_on_next_write(&self) {
        self.before_write
            .set(|| panic!("injected session log writer panic"));
    }

    /// How many `fdatasync`s this writer has issued.
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Starts writing now (used right after creation so the header reaches the disk soon).
    pub(crate) fn start(self: &Arc<Self>) {
        self.kick(self.state.lock());
    }

    /// Accepts one encoded event line carrying `seq`, without waiting. Fails at once on a seq
    /// gap (or a poisoned writer); a gap that only the file can reveal (an existing log not read
    /// yet) poisons the writer when it is opened and surfaces at the next flush.
    pub(crate) fn accept(self: &Arc<Self>, seq: u64, line: &[u8]) -> Result<(), StoreError> {
        let mut st = self.state.lock();
        if let Some(err) = &st.failed {
            return Err(err.clone());
        }
        let anything_known = st.assumed_len.is_some() || st.first_accepted.is_some();
        if anything_known && seq != st.next_seq {
            return Err(StoreError::SeqMismatch {
                id: self.id.clone(),
                expected: st.next_seq,
                got: seq,
            });
        }
        st.first_accepted.get_or_insert(seq);
        // Saturating: a first append at the end of the range (to a log not read yet, so not
        // checked above) must not overflow; no log holds that many events, so the writer's
        // open refuses it as a seq mismatch before anything is written.
        st.next_seq = seq.saturating_add(1);
        st.pending.extend_from_slice(line);
        st.accepted += 1;
        self.kick(st);
        Ok(())
    }

    /// Waits until every accepted line is handed to the OS (a settled file for readers). A
    /// writer with nothing to write returns at once without opening the file.
    pub(crate) async fn settle(self: &Arc<Self>) -> Result<(), StoreError> {
        let target = {
            let st = self.state.lock();
            if let Some(err) = &st.failed {
                return Err(err.clone());
            }
            let only_reads = matches!(st.plan, Some(Plan::Existing(_))) && st.accepted == 1;
            if only_reads || st.written >= st.accepted {
                return Ok(());
            }
            let target = st.accepted;
            self.kick(st);
            target
        };
        self.wait(|p| p.written >= target).await
    }

    /// Opens the log for appending now — taking its lock, reading it again if it changed since
    /// this store read it, cutting a torn tail — and checks that appends continue at seq
    /// `events`: [`StoreError::Changed`] if the log (with what this writer accepted) holds a
    /// different number of events. A writer that already opened the log only checks.
    pub(crate) async fn claim(self: &Arc<Self>, events: u64) -> Result<(), StoreError> {
        {
            let st = self.state.lock();
            if let Some(err) = &st.failed {
                return Err(err.clone());
            }
            if st.written == 0 {
                self.kick(st);
            }
        }
        self.wait(|p| p.written >= 1).await?;
        let st = self.state.lock();
        if st.next_seq != events {
            return Err(StoreError::Changed {
                id: self.id.clone(),
                loaded: events,
                stored: st.next_seq,
            });
        }
        Ok(())
    }

    /// Whether this writer only remembers a reading of the log (a `load` made it): it has not
    /// opened the log, accepted nothing, and is not poisoned. Its own `flush` has nothing to do.
    pub(crate) fn only_reads(&self) -> bool {
        let st = self.state.lock();
        matches!(st.plan, Some(Plan::Existing(_))) && st.accepted == 1 && st.failed.is_none()
    }

    /// Whether this writer was never handed an event line (it at most opened the log).
    pub(crate) fn accepted_nothing(&self) -> bool {
        self.state.lock().accepted == 1
    }

    /// Makes every accepted line durable (opening the log if needed); shares the sync with
    /// concurrent callers. A loaded log nothing was appended to is left as it is on disk: its
    /// file is not opened, so a torn last line stays until the next append cuts it.
    pub(crate) async fn flush(self: &Arc<Self>) -> Result<(), StoreError> {
        let target = {
            let mut st = self.state.lock();
            if let Some(err) = &st.failed {
                return Err(err.clone());
            }
            let only_reads = matches!(st.plan, Some(Plan::Existing(_))) && st.accepted == 1;
            if only_reads || st.synced >= st.accepted {
                return Ok(());
            }
            st.sync_wanted = st.sync_wanted.max(st.accepted);
            let target = st.accepted;
            self.kick(st);
            target
        };
        self.wait(|p| p.synced >= target).await
    }

    async fn wait(&self, done: impl Fn(&Progress) -> bool) -> Result<(), StoreError> {
        let mut rx = self.progress.subscribe();
        let failed = match rx.wait_for(|p| p.failed || done(p)).await {
            Ok(p) => p.failed && !done(&p),
            // The sender lives in `self`, which we borrow: it cannot be dropped.
            Err(_) => true,
        };
        if failed {
            let err = self.state.lock().failed.clone();
            return Err(
                err.unwrap_or_else(|| StoreError::io(&self.path, io::Error::other("session writer stopped")))
            );
        }
        Ok(())
    }

    /// Starts the drainer unless one is running. Takes the state lock's guard and releases it
    /// before starting one (a drainer that cannot start is handled without the lock held).
    fn kick(self: &Arc<Self>, mut st: MutexGuard<'_, WriterState>) {
        if st.draining {
            return;
        }
        st.draining = true;
        drop(st);
        // The drainer owns an `Arc` to the writer: it finishes its work even if the store and
        // every waiter are gone. Outside a tokio runtime it gets a plain thread, and so does a
        // drainer the runtime's blocking pool refuses or discards unrun (it is shutting down):
        // see [`DrainTask`].
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let task = DrainTask(Some(Arc::clone(self)));
                drop(handle.spawn_blocking(move || task.run()));
            }
            Err(_) => Arc::clone(self).drain_on_thread(),
        }
    }

    /// Runs the drainer on a plain thread; if no thread can be started, poisons the writer with
    /// that failure (so waiting flushes return it instead of waiting for a drainer that never
    /// runs).
    fn drain_on_thread(self: Arc<Self>) {
        let this = Arc::clone(&self);
        let spawned = std::thread::Builder::new()
            .name("session-log-writer".into())
            .spawn(move || this.drain());
        if let Err(e) = spawned {
            let err = StoreError::io(
                &self.path,
                io::Error::new(e.kind(), format!("cannot start the session log writer: {e}")),
            );
            tracing::warn!(session = %self.id, error = %err, "session log writer not started; the session's writer is poisoned");
            self.poison(err);
        }
    }

    /// The drainer (blocking). A panic in it poisons the writer like an I/O failure — a
    /// [`StoreError::Io`] naming the panic, recorded on the latch and in the state, waiters
    /// woken — instead of leaving the writer marked as draining forever, with every flush
    /// waiting for it hanging.
    fn drain(&self) {
        let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.drain_loop())) else {
            return;
        };
        let reason = agent::bus::panic_message(&*panic);
        let err = StoreError::io(
            &self.path,
            io::Error::other(format!("the session log writer panicked: {reason}")),
        );
        tracing::error!(session = %self.id, error = %err, "session log writer panicked; the session's writer is poisoned");
        self.poison(err);
    }

    /// Records `err` as this writer's failure (the first one is kept) — on the latch first, so
    /// a store that let go of the writer reports it once the latch is raised — stops the
    /// drainer and wakes every waiter.
    fn poison(&self, err: StoreError) {
        self.latch.fail(err.clone());
        let mut st = self.state.lock();
        st.failed.get_or_insert(err);
        st.draining = false;
        drop(st);
        self.progress.send_modify(|p| p.failed = true);
    }

    /// The drainer loop (blocking).
    fn drain_loop(&self) {
        enum Job {
            Open(Plan),
            Write(Vec<u8>, u64),
            Sync(u64, bool),
        }
        loop {
            let job = {
                let mut st = self.state.lock();
                if st.failed.is_some() {
                    st.draining = false;
                    return;
                }
                if let Some(plan) = st.plan.take() {
                    Job::Open(plan)
                } else if !st.pending.is_empty() {
                    Job::Write(std::mem::take(&mut st.pending), st.accepted)
                } else if st.sync_wanted > st.synced {
                    Job::Sync(st.written, !st.dir_synced)
                } else {
                    st.draining = false;
                    return;
                }
            };
            let result = match job {
                Job::Open(plan) => self.open(plan).map(|()| {
                    self.state.lock().written = 1;
                    self.progress.send_modify(|p| p.written = 1);
                }),
                Job::Write(buf, upto) => self.write(&buf).map(|()| {
                    self.state.lock().written = upto;
                    self.progress.send_modify(|p| p.written = upto);
                }),
                Job::Sync(upto, with_dir) => self.sync(with_dir).map(|()| {
                    let mut st = self.state.lock();
                    st.synced = upto;
                    st.dir_synced = true;
                    drop(st);
                    self.progress.send_modify(|p| p.synced = upto);
                }),
            };
            if let Err(err) = result {
                tracing::warn!(session = %self.id, error = %err, "session log write failed; the session's writer is poisoned");
                // Before anyone can see the latch raised (when this writer is dropped): a store
                // that let go of the writer reports it from there.
                self.poison(err);
                return;
            }
        }
    }

    fn io(&self, e: io::Error) -> StoreError {
        StoreError::io(&self.path, e)
    }

    /// Opens (or creates) the file and makes it ready for appending, holding its advisory lock
    /// from before anything is read or repaired until this writer is dropped. A successor first
    /// waits for its predecessor to let go of the lock (it has nothing left to write: its store
    /// forgot it and only waits for what it accepted).
    fn open(&self, plan: Plan) -> Result<(), StoreError> {
        if let Some(predecessor) = &self.predecessor {
            predecessor.wait();
            // The predecessor lost lines this writer may continue: its failure is this one's
            // (a `close` that reported it took it).
            if let Some(err) = predecessor.failure() {
                return Err(err);
            }
        }
        let (file, known) = match plan {
            Plan::Create { header, line } => match self.create(&header, &line)? {
                Created::New => return Ok(()),
                Created::Adopted(file, known) => (file, known),
            },
            Plan::Existing(known) => {
                let file = open_regular(&self.path, OpenOptions::new().append(true)).map_err(|e| match e
                    .kind()
                {
                    io::ErrorKind::NotFound => StoreError::NotFound(self.id.clone()),
                    _ => self.io(e),
                })?;
                self.lock(&file)?;
                let len = file.metadata().map_err(|e| self.io(e))?.len();
                let known = match known {
                    // Read by this store and unchanged since: another writer only ever grows
                    // an intact log, so an unchanged length means unchanged contents. Not so
                    // for a torn one: another writer may have cut the torn bytes and appended
                    // a line exactly as long, which cutting at our stale `good_len` would
                    // destroy.
                    Some(known) if known.file_len == len && !known.torn => known,
                    // Never read, torn when read, or another writer appended after our read:
                    // read it now, under the lock, so the seq check below sees what is really
                    // there.
                    _ => {
                        let parsed = read_log(&self.path, &self.id)?;
                        self.set_header(parsed.header.clone());
                        Known::from(&parsed)
                    }
                };
                (file, known)
            }
        };
        {
            // Check appends accepted under a wrong or unknown length assumption.
            let mut st = self.state.lock();
            if st.assumed_len != Some(known.events) {
                match st.first_accepted {
                    Some(first) if first != known.events => {
                        return Err(StoreError::SeqMismatch {
                            id: self.id.clone(),
                            expected: known.events,
                            got: first,
                        });
                    }
                    Some(_) => {}
                    None => st.next_seq = known.events,
                }
                st.assumed_len = Some(known.events);
            }
        }
        if known.torn {
            tracing::warn!(path = %self.path.display(), "truncating the torn last line of a session log before appending");
            file.set_len(known.good_len).map_err(|e| self.io(e))?;
        }
        if known.needs_newline {
            (&file).write_all(b"\n").map_err(|e| self.io(e))?;
        }
        let _ = self.file.set(file);
        Ok(())
    }

    /// Takes the log's exclusive advisory lock without waiting: another writer holding it is
    /// [`StoreError::Locked`]. A file system without advisory locks writes unlocked (debug log).
    fn lock(&self, file: &File) -> Result<(), StoreError> {
        match file.try_lock() {
            Ok(()) => Ok(()),
            Err(fs::TryLockError::WouldBlock) => Err(StoreError::Locked {
                id: self.id.clone(),
                path: self.path.clone(),
            }),
            Err(fs::TryLockError::Error(e)) if e.kind() == io::ErrorKind::Unsupported => {
                tracing::debug!(path = %self.path.display(), "file system has no advisory locks; writing the session log unlocked");
                Ok(())
            }
            Err(fs::TryLockError::Error(e)) => Err(self.io(e)),
        }
    }

    /// Creates the file, locks it and writes the header line `line`. An existing log with an
    /// equal header is adopted (locked, returned for the caller to continue); a different one is
    /// a duplicate. An existing file is judged only while this writer holds its lock, and only
    /// one whose bytes are not well-formed JSON and hold no newline — a header write that never
    /// completed, or an empty file — is replaced; any other (a complete header of another
    /// session, an invalid header, any other JSON) is [`StoreError::Corrupt`] and left as it is.
    ///
    /// Every file this writer locks — one it created or one it found — is checked to still be
    /// the file at the log's path once locked: another store replacing an empty file it found
    /// (while holding that file's lock) between our creating it and locking it makes us start
    /// over instead of writing into the unlinked file. After [`CREATE_ATTEMPTS`] such losses
    /// the creation fails with [`StoreError::Locked`].
    fn create(&self, header: &SessionHeader, line: &[u8]) -> Result<Created, StoreError> {
        self.dir.ensure()?;
        for _ in 0..CREATE_ATTEMPTS {
            match OpenOptions::new().append(true).create_new(true).open(&self.path) {
                Ok(file) => {
                    #[cfg(test)]
                    self.before_lock.run();
                    self.lock(&file)?;
                    if !self.at_path(&file)? {
                        continue;
                    }
                    (&file).write_all(line).map_err(|e| self.io(e))?;
                    let _ = self.file.set(file);
                    return Ok(Created::New);
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    // Never a FIFO or device: opening one could block, and it is no log to adopt.
                    let existing = match open_regular(&self.path, OpenOptions::new().read(true).append(true))
                    {
                        Ok(file) => file,
                        // Replaced (by a store that judged it a torn header) since `create_new`.
                        Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(self.io(e)),
                    };
                    self.lock(&existing)?;
                    if !self.at_path(&existing)? {
                        continue;
                    }
                    let bytes = read_log_bytes(&self.path, &existing)?;
                    if bytes.contains(&b'\n') || well_formed_json(&bytes) {
                        let parsed = parse_log(&self.path, &self.id, &bytes)?;
                        if &parsed.header != header {
                            return Err(StoreError::Duplicate(self.id.clone()));
                        }
                        return Ok(Created::Adopted(existing, Known::from(&parsed)));
                    }
                    // Deleted while we hold its lock: a store that created it and has not locked
                    // it yet finds it gone from the path once it has, and starts over.
                    tracing::warn!(path = %self.path.display(), "replacing a session log whose header write was interrupted");
                    fs::remove_file(&self.path).map_err(|e| self.io(e))?;
                    drop(existing);
                }
                Err(e) => return Err(self.io(e)),
            }
        }
        Err(StoreError::Locked {
            id: self.id.clone(),
            path: self.path.clone(),
        })
    }

    fn write(&self, buf: &[u8]) -> Result<(), StoreError> {
        #[cfg(test)]
        self.before_write.run();
        let file = self.file.get().ok_or_else(|| {
            StoreError::io(
                &self.path,
                io::Error::other("session log written before it was opened"),
            )
        })?;
        let mut file: &File = file;
        file.write_all(buf).map_err(|e| self.io(e))
    }

    /// Fails unless the open file is still the log at `self.path`: a log deleted, or replaced
    /// (renamed over), while this writer holds it open keeps receiving writes that no reader
    /// will ever see, so a flush must not report them durable.
    fn check_still_at_path(&self, file: &File) -> Result<(), StoreError> {
        if self.at_path(file)? {
            return Ok(());
        }
        Err(self.io(io::Error::new(
            io::ErrorKind::NotFound,
            "the session log was deleted or replaced while this store had it open; \
             events appended since its last successful flush are not in it",
        )))
    }

    /// Whether the open `file` is the file at `self.path` (not deleted, not replaced).
    #[cfg(unix)]
    fn at_path(&self, file: &File) -> Result<bool, StoreError> {
        use std::os::unix::fs::MetadataExt as _;
        let open = file.metadata().map_err(|e| self.io(e))?;
        if open.nlink() == 0 {
            return Ok(false);
        }
        match fs::metadata(&self.path) {
            Ok(at_path) => Ok(at_path.dev() == open.dev() && at_path.ino() == open.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.io(e)),
        }
    }

    /// Without file identities to compare, only a log deleted outright is noticed.
    #[cfg(not(unix))]
    fn at_path(&self, _file: &File) -> Result<bool, StoreError> {
        match fs::metadata(&self.path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(self.io(e)),
        }
    }

    fn sync(&self, with_dir: bool) -> Result<(), StoreError> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if let Some(file) = self.file.get() {
            file.sync_data().map_err(|e| self.io(e))?;
            self.check_still_at_path(file)?;
        }
        if with_dir {
            // The first sync also makes the file's directory entry durable.
            self.dir.sync(self.dir.path())?;
        }
        Ok(())
    }
}

/// How often [`SessionFile::create`] starts over after losing its file to a concurrent creator
/// before it gives up with [`StoreError::Locked`].
const CREATE_ATTEMPTS: usize = 4;

/// A drainer handed to tokio's blocking pool. A pool that is shutting down refuses the task or
/// discards it unrun, dropping it — synchronously inside `spawn_blocking`, or later on a pool
/// thread — and then the drainer runs on a plain thread instead
/// ([`SessionFile::drain_on_thread`]): accepted lines are still written, and no flush waits
/// for a drainer that never runs. `kick` spawns it without the state lock held, so this drop
/// may take the lock.
struct DrainTask(Option<Arc<SessionFile>>);

impl DrainTask {
    fn run(mut self) {
        if let Some(file) = self.0.take() {
            file.drain();
        }
    }
}

impl Drop for DrainTask {
    fn drop(&mut self) {
        if let Some(file) = self.0.take() {
            tracing::debug!(session = %file.id, "the runtime did not run the session log writer; running it on a thread");
            file.drain_on_thread();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::JsonlStore;

    /// A closure a test runs at one point of the writer.
    #[derive(Default)]
    pub(super) struct Hook(Mutex<Option<Box<dyn FnOnce() + Send>>>);

    impl std::fmt::Debug for Hook {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Hook")
        }
    }

    impl Hook {
        /// Makes `hook` run at the next [`run`](Self::run) (once).
        pub(super) fn set(&self, hook: impl FnOnce() + Send + 'static) {
            *self.0.lock() = Some(Box::new(hook));
        }

        pub(super) fn run(&self) {
            let hook = self.0.lock().take();
            if let Some(hook) = hook {
                hook();
            }
        }
    }

    /// Two stores create the same session: the first has created the (still empty) file but
    /// not locked it yet when the second finds it, takes it for a crash-leftover torn header
    /// and replaces it with its own log. The first must not then lock and write into the
    /// unlinked file (reporting a creation that no reader will ever see): it finds the file
    /// gone from the path once locked, starts over, finds the second store's log locked, and
    /// fails with [`StoreError::Locked`]. The second store's log is intact.
    #[test]
    fn a_created_file_replaced_before_it_is_locked_is_never_written_unlinked() {
        let dir = tempfile::tempdir().expect("dir");
        let id = SessionId::from("s");
        let header = agent::SessionMeta::default()
            .into_header(id.clone(), 1_000)
            .expect("header");
        let line = serde_json::to_vec(&header).expect("json");
        let path = dir.path().join("s.jsonl");
        let first = SessionFile::new(
            id.clone(),
            path.clone(),
            Arc::new(StoreDir::new(dir.path().to_owned())),
            Plan::Create {
                header: header.clone(),
                line: [&line[..], b"\n"].concat(),
            },
            None,
        );
        let second = Arc::new(JsonlStore::new(dir.path()));
        let (second_in, first_path, second_header, second_id) =
            (second.clone(), path.clone(), header.clone(), id.clone());
        *first.before_lock.0.lock() = Some(Box::new(move || {
            assert_eq!(fs::read(&first_path).expect("created").len(), 0);
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            second_in.create(&second_header).expect("create");
            rt.block_on(second_in.flush(&second_id))
                .expect("the second store replaces the empty file");
        }));
        // Outside a runtime: the first writer's drainer runs on a plain thread.
        first.start();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let err = rt.block_on(first.flush()).unwrap_err();
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        let loaded = rt
            .block_on(JsonlStore::new(dir.path()).load(&id))
            .expect("the second store's log");
        assert_eq!(loaded.header, header);
        assert_eq!(fs::read(&path).expect("read"), [&line[..], b"\n"].concat());
        drop(second);
    }
}
