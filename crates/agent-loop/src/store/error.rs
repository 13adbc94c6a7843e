//! The stores' one error type.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use agent::{HeaderError, LogError, SessionId};

/// Why a store operation failed. Cheap to clone (shared I/O errors are behind an `Arc`), so one
/// failure can be handed to every caller that shared a group commit.
///
/// A failed operation leaves stored data unchanged, except where a variant says otherwise.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A file-system operation failed — or the session's background writer panicked (the
    /// source's message says so), which is handled the same way. For `append` and `flush` this
    /// poisons the session's writer in this store instance: later appends and flushes of that
    /// session fail with the same error (the file may end in a torn line, which the next load
    /// drops).
    #[error("session store I/O error at {}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: Arc<io::Error>,
    },
    /// A stored log is damaged somewhere other than its last line (or its header is missing
    /// or invalid). Nothing was rewritten.
    #[error("corrupt session log {}, line {line}: {reason}", path.display())]
    Corrupt {
        /// The log file.
        path: PathBuf,
        /// The 1-based line number (the header is line 1, the event with seq `n` is line
        /// `n + 2`).
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// Every line of a stored log parsed, but the events break the append contract
    /// (`seq == index`, lossless JSON, surface markers, provenance).
    #[error("invalid session log {}: {source}", path.display())]
    InvalidLog {
        /// The log file (empty for the in-memory store).
        path: PathBuf,
        /// The violated rule.
        #[source]
        source: LogError,
    },
    /// No session with this id is stored.
    #[error("no stored session `{0}`")]
    NotFound(SessionId),
    /// `save_header` for an id that is already stored with a different header.
    #[error("session `{0}` is already stored with a different header")]
    Duplicate(SessionId),
    /// `append` with an event whose `seq` is not the number of events already stored.
    #[error("session `{id}`: appended event has seq {got}, expected {expected}")]
    SeqMismatch {
        /// The session.
        id: SessionId,
        /// The number of events already stored.
        expected: u64,
        /// The seq the event carried.
        got: u64,
    },
    /// [`claim`](super::JsonlStore::claim) of a session whose log no longer holds the events
    /// the caller loaded: another writer continued it after the load. Nothing was written;
    /// load it again to continue it.
    #[error(
        "session `{id}` changed since it was loaded ({loaded} events loaded, {stored} stored now); load it again"
    )]
    Changed {
        /// The session.
        id: SessionId,
        /// The number of events the caller loaded.
        loaded: u64,
        /// The number of events the log holds now.
        stored: u64,
    },
    /// Another writer holds the session's log: a different store instance — in this process
    /// or another — has it open for appending (an advisory lock on the file). Nothing was
    /// written or repaired. Met by an append, like an I/O failure it poisons this store's
    /// writer for the session until [`close`](super::JsonlStore::close); met by a
    /// [`claim`](super::JsonlStore::claim), which appended nothing, it leaves no writer
    /// behind, so the session can be claimed again once the other writer lets go. The other
    /// writer's log is untouched.
    #[error("session `{id}` is being written by another store (its log {} is locked); nothing was written", path.display())]
    Locked {
        /// The session.
        id: SessionId,
        /// The log file.
        path: PathBuf,
    },
    /// The session id cannot name a file (empty, `.`/`..`, or containing a path separator or
    /// NUL).
    #[error("session id {0:?} cannot be used as a file name")]
    InvalidId(SessionId),
    /// The header to save is invalid.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// The header to create could not be encoded as JSON (e.g. a `cwd` that is not UTF-8).
    /// Nothing was created: no log file, no writer state.
    #[error("cannot encode the header of session `{id}`: {reason}")]
    EncodeHeader {
        /// The session.
        id: SessionId,
        /// The encoder's message.
        reason: String,
    },
    /// An event could not be encoded as JSON.
    #[error("cannot encode event {seq} of session `{id}`: {reason}")]
    Encode {
        /// The session.
        id: SessionId,
        /// The event's seq.
        seq: u64,
        /// The encoder's message.
        reason: String,
    },
}

impl StoreError {
    /// An [`StoreError::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source: Arc::new(source),
        }
    }
}
