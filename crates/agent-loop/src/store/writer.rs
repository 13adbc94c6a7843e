//! One open session log: ordered, batched writes and group-committed `fdatasync`.
//!
//! All file I/O of a session runs in at most one blocking task at a time, the *drainer*. It
//! loops: hand every accepted-but-unwritten line to the OS in one `write`, then — if some flush
//! asked for durability beyond what is synced — one `fdatasync` covering everything written so
//! far, until there is nothing left to do. Appends and flushes only touch a short
//! `parking_lot` section and then wait on a `watch` channel, so:
//!
//! * writes reach the file in `seq` order, and concurrent appends share one `write`;
//! * concurrent flushes share one sync (group commit): a flush that arrives while a sync is in
//!   flight waits for it and, if it needs more, for the single next one, which then covers every
//!   flush that arrived meanwhile.
//!
//! "Units" count lines: the header is unit 1, the event with seq `n` is unit `n + 2`.

use std::fs::File;
use std::io::{self, Write as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent::SessionId;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::error::StoreError;

/// Progress published by the drainer.
#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// Units handed to the OS.
    written: u64,
    /// Units made durable.
    synced: u64,
    /// The writer failed (the error is in [`WriterState::failed`]).
    failed: bool,
}

/// State protected by [`SessionFile::state`]: the unwritten buffer and the counters that decide
/// the drainer's next job.
#[derive(Debug)]
struct WriterState {
    /// Units accepted (written or buffered).
    accepted: u64,
    /// Encoded lines accepted but not yet handed to the drainer.
    pending: Vec<u8>,
    /// Units handed to the OS.
    written: u64,
    /// Units made durable.
    synced: u64,
    /// The highest unit count some flush asked to make durable.
    sync_wanted: u64,
    /// Whether a drainer task is running.
    draining: bool,
    /// Whether the directory entry has been synced (done once, with the first sync).
    dir_synced: bool,
    /// The first I/O failure; sticky.
    failed: Option<StoreError>,
}

/// An open session log file.
#[derive(Debug)]
pub(crate) struct SessionFile {
    id: SessionId,
    path: PathBuf,
    dir: PathBuf,
    file: File,
    state: Mutex<WriterState>,
    progress: watch::Sender<Progress>,
    /// `fdatasync`s issued (diagnostics).
    syncs: AtomicU64,
}

impl SessionFile {
    /// Wraps an open append-mode `file` that already holds `units` complete lines (header
    /// included), none known to be durable.
    pub(crate) fn new(id: SessionId, path: PathBuf, dir: PathBuf, file: File, units: u64) -> Arc<Self> {
        let (progress, _) = watch::channel(Progress {
            written: units,
            synced: 0,
            failed: false,
        });
        Arc::new(Self {
            id,
            path,
            dir,
            file,
            state: Mutex::new(WriterState {
                accepted: units,
                pending: Vec::new(),
                written: units,
                synced: 0,
                sync_wanted: 0,
                draining: false,
                dir_synced: false,
                failed: None,
            }),
            progress,
            syncs: AtomicU64::new(0),
        })
    }

    /// How many `fdatasync`s this writer has issued.
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Accepts one encoded event line carrying `seq` and waits until it is handed to the OS.
    ///
    /// Cancellation: once the first poll has returned, the line is accepted and will be written
    /// even if the future is dropped.
    pub(crate) async fn append(self: &Arc<Self>, seq: u64, line: Vec<u8>) -> Result<(), StoreError> {
        let target = {
            let mut st = self.state.lock();
            if let Some(err) = &st.failed {
                return Err(err.clone());
            }
            let expected = st.accepted - 1;
            if seq != expected {
                return Err(StoreError::SeqMismatch {
                    id: self.id.clone(),
                    expected,
                    got: seq,
                });
            }
            st.pending.extend_from_slice(&line);
            st.accepted += 1;
            self.kick(&mut st);
            st.accepted
        };
        self.wait(|p| p.written >= target).await
    }

    /// Makes every accepted unit durable; shares the sync with concurrent callers.
    pub(crate) async fn flush(self: &Arc<Self>) -> Result<(), StoreError> {
        let target = {
            let mut st = self.state.lock();
            if let Some(err) = &st.failed {
                return Err(err.clone());
            }
            if st.synced >= st.accepted {
                return Ok(());
            }
            st.sync_wanted = st.sync_wanted.max(st.accepted);
            self.kick(&mut st);
            st.accepted
        };
        self.wait(|p| p.synced >= target).await
    }

    /// Waits until every accepted unit is handed to the OS (a settled file for readers).
    pub(crate) async fn settle(self: &Arc<Self>) -> Result<(), StoreError> {
        let target = self.state.lock().accepted;
        self.wait(|p| p.written >= target).await
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

    /// Starts the drainer unless one is running. Called with the state lock held.
    fn kick(self: &Arc<Self>, st: &mut WriterState) {
        if st.draining {
            return;
        }
        st.draining = true;
        let this = Arc::clone(self);
        // The drainer owns an `Arc` to the file: it finishes its work even if the store and
        // every waiter are gone.
        drop(tokio::task::spawn_blocking(move || this.drain()));
    }

    /// The drainer loop (runs on the blocking pool).
    fn drain(&self) {
        enum Job {
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
                if !st.pending.is_empty() {
                    Job::Write(std::mem::take(&mut st.pending), st.accepted)
                } else if st.sync_wanted > st.synced {
                    Job::Sync(st.written, !st.dir_synced)
                } else {
                    st.draining = false;
                    return;
                }
            };
            let result = match job {
                Job::Write(buf, upto) => (&self.file)
                    .write_all(&buf)
                    .map_err(|e| (self.path.clone(), e))
                    .map(|()| {
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
            if let Err((path, err)) = result {
                tracing::warn!(session = %self.id, path = %path.display(), error = %err, "session log write failed; the session's writer is poisoned");
                let mut st = self.state.lock();
                st.failed = Some(StoreError::io(path, err));
                st.draining = false;
                drop(st);
                self.progress.send_modify(|p| p.failed = true);
                return;
            }
        }
    }

    fn sync(&self, with_dir: bool) -> Result<(), (PathBuf, io::Error)> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.file.sync_data().map_err(|e| (self.path.clone(), e))?;
        if with_dir {
            // The first sync also makes the file's directory entry durable.
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| (self.dir.clone(), e))?;
        }
        Ok(())
    }
}
