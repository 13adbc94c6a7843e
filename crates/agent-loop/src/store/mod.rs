//! Session persistence: [`MemoryStore`] (tests) and [`JsonlStore`] (the embedded default).
//!
//! Both stores keep, per session, the immutable [`SessionHeader`] and the append-only list of
//! [`SessionEvent`]s. Both implement [`agent::SessionPersistence`] (errors mapped onto
//! [`agent::AgentError`]) and offer the same operations inherently, with the richer
//! [`StoreError`], [`SessionSummary`] and [`LoadedSession`] types. All take `&self`; the async
//! ones return `Send` futures.
//!
//! | operation | contract |
//! |---|---|
//! | `create(&header)` (sync) | creates the session; creating it again with an identical header is a no-op (resume), a different one is [`StoreError::Duplicate`] |
//! | `append(&id, &event)` (sync, buffered) | appends one event; `event.seq` must equal the number of events already stored ([`StoreError::SeqMismatch`] otherwise, nothing stored) |
//! | `flush(&id)` | durability checkpoint: every event appended before the call is durable when it returns; concurrent flushes share one sync (group commit) |
//! | `list()` | every stored session's [`SessionSummary`], ordered by `createdAt` then id |
//! | `inspect(&id)` | the header alone |
//! | `load(&id)` | the header and every event ([`LoadedSession`]) |
//! | `remove(&id)` | deletes the session |
//!
//! A log that ends inside an open turn (the process died mid-turn) is loaded as it is; the
//! runtime calls [`repair_open_turn`] on resume to close it balanced before the session goes
//! live again.

mod codec;
mod dir;
mod error;
mod jsonl;
mod memory;
mod persistence;
#[cfg(test)]
mod regressions;
mod repair;
mod writer;

use agent::{SessionEvent, SessionHeader, SessionId};

pub use error::StoreError;
pub use jsonl::JsonlStore;
pub use memory::MemoryStore;
pub use repair::{
    TOOL_INTERRUPTED_CODE, TOOL_INTERRUPTED_TEXT, TOOL_NOT_STARTED_CODE, TOOL_NOT_STARTED_TEXT,
    repair_open_turn, repair_open_turn_at,
};

/// One entry of a store's catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    /// The session id (equals `header.id`).
    pub id: SessionId,
    /// The session's header.
    pub header: SessionHeader,
}

/// A session read back from a store.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedSession {
    /// The session's header.
    pub header: SessionHeader,
    /// Every intact event, in order; `events[i].seq == i`.
    pub events: Vec<SessionEvent>,
    /// `true` when the load dropped a torn last line (an interrupted write: a last line that is
    /// not well-formed JSON and lacks its trailing `\n` or holds the zero bytes of blocks a power
    /// loss left unwritten; any other damaged line fails the load). The dropped line
    /// was never acknowledged as durable: every event covered by a completed `flush` is intact.
    /// This is *not* the open-turn repair, which the runtime applies on resume with
    /// [`repair_open_turn`].
    pub repaired: bool,
}
