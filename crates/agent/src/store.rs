//! Session stores (spec §6): the live store and optional durable persistence.

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::AgentError;
use crate::event::SessionEvent;
use crate::header::{SessionHeader, SessionMeta};
use crate::ids::SessionId;
use crate::registration::Registration;
use crate::session::Session;

/// The live session store.
///
/// # Contract
/// * [`prepare`](SessionStore::prepare) builds an **unpublished** session (header and seed
///   validated); a live duplicate id is rejected. It does not reserve the id: `enter` decides
///   between concurrent preparations of one id.
/// * [`enter`](SessionStore::enter) publishes it (installs observers and persistence) and
///   inserts it; it never overwrites a live entry ([`AgentError::Duplicate`]). Dropping the
///   returned guard, from any thread, removes the entry; the session object and the observers
///   installed into it live on while anyone holds it.
/// * [`flush`](SessionStore::flush) is a durability checkpoint; it returns whether any durable
///   backend participated (`Ok(false)` without one) and fails with [`AgentError::NotFound`] for
///   an id that is not live. Callers may drop its future; that abandons the wait only.
/// * **Callers.** The runtime's creation transaction prepares and enters every session (its
///   durable writes start only when the creation commits); the continuation manager flushes a
///   continuable child at disposal, best-effort (a failure is logged).
/// * **Concurrency.** Every method takes `&self` and may be called from any thread, concurrently;
///   `get` and `list` must not block (listeners and listings call them).
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Builds an unpublished session.
    fn prepare(
        &self,
        id: SessionId,
        seed: Option<Vec<SessionEvent>>,
        meta: SessionMeta,
    ) -> Result<Arc<Session>, AgentError>;

    /// Publishes and inserts a prepared session.
    fn enter(&self, session: Arc<Session>) -> Result<Registration, AgentError>;

    /// A live session.
    fn get(&self, id: &SessionId) -> Option<Arc<Session>>;

    /// Live sessions in creation order.
    fn list(&self) -> Vec<Arc<Session>>;

    /// Durability checkpoint for one session.
    async fn flush(&self, id: &SessionId) -> Result<bool, AgentError>;
}

/// A persisted session as loaded.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedSession {
    /// Its header.
    pub header: SessionHeader,
    /// Its events (a torn last line dropped).
    pub events: Vec<SessionEvent>,
}

/// Durable persistence of session logs.
///
/// # Contract
/// * [`create`](SessionPersistence::create) writes the header; [`append`](SessionPersistence::append)
///   writes one event (append-only, buffered, no sync, never blocks for long);
///   [`flush`](SessionPersistence::flush) makes everything appended so far durable (concurrent
///   flushes may share one sync).
/// * [`load`](SessionPersistence::load) returns at least every event covered by a completed
///   `flush`; a torn last record is dropped; corruption elsewhere is an error and nothing is
///   rewritten. An open turn is returned as it is (the runtime repairs it on resume).
///   [`inspect`](SessionPersistence::inspect) answers `Ok(None)` for an unknown id; `load` fails
///   with [`AgentError::NotFound`].
/// * **How the runtime writes.** Nothing until a creation commits (a rolled-back creation
///   writes nothing); then `create` (not for a resumed session, whose events continue at the
///   loaded length) and every event so far, then each event as it is committed — once each, in
///   `seq` order. `append` is called from a [`SessionObserver`](crate::SessionObserver):
///   synchronously, on the appending thread, while the session's append lock is held. It must
///   not block or append to that session. Appends to one session never overlap; different
///   sessions are written concurrently.
/// * **Errors.** A `create` or `append` failure (or panic) while a creation commits fails the
///   creation (a panic as [`AgentError::Persistence`] naming it), which rolls back. A
///   later `append` failure is only logged by the runtime (the live session goes on), so an
///   implementation should report the loss again at the next `flush`, as the JSON-lines store
///   does.
/// * **Cancellation and concurrency.** Every method takes `&self` and may be called from any
///   thread. Readers race `list`, `inspect` and `load` against their signal, drop them when it
///   fires, and run several `load`s at once, so reads must have no effect to undo. Dropping a
///   `flush` future abandons the wait, not the sync.
/// * **Resuming.** Before it publishes a resumed session the runtime calls
///   [`claim`](SessionPersistence::claim) with the number of events it loaded, so a backend
///   whose logs have one writer at a time refuses a session another writer holds (or one that
///   grew since the load) at once, as the resume's error, rather than at a later `flush` after
///   the resumed agent already ran.
#[async_trait]
pub trait SessionPersistence: Send + Sync + 'static {
    /// Records a new session's header.
    fn create(&self, header: &SessionHeader) -> Result<(), AgentError>;

    /// Appends one event to a created session.
    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError>;

    /// Makes every append so far durable.
    async fn flush(&self, id: &SessionId) -> Result<(), AgentError>;

    /// Every stored session's header.
    async fn list(&self) -> Result<Vec<SessionHeader>, AgentError>;

    /// One stored header, if present.
    async fn inspect(&self, id: &SessionId) -> Result<Option<SessionHeader>, AgentError>;

    /// Loads a stored session.
    async fn load(&self, id: &SessionId) -> Result<LoadedSession, AgentError>;

    /// Makes this persistence the writer of session `id`, loaded with `events` events, before
    /// a resume publishes it: when it returns `Ok`, appends continuing at seq `events` will be
    /// accepted (barring I/O failures). A backend that admits one writer per log takes that
    /// role here — failing if another writer holds it — and fails if the stored log no longer
    /// holds `events` events (another writer continued it after the load). A failed claim
    /// leaves the stored log as it was and the session claimable again once the other writer
    /// lets go. Dropping the future abandons the claim; a claim that completes anyway holds
    /// the log as an append would.
    ///
    /// The default claims nothing and returns `Ok`: right for a backend with no notion of
    /// competing writers.
    async fn claim(&self, id: &SessionId, events: u64) -> Result<(), AgentError> {
        let _ = (id, events);
        Ok(())
    }

    /// The runtime has stopped writing session `id`: its live session was removed (its agent
    /// disposed, or its creation or resumption rolled back). A backend that holds something per
    /// written session — an open file, a writer's lock on the log — lets go of it here, once
    /// every append it accepted has reached its storage: nothing accepted is dropped. Not a
    /// durability checkpoint (a later [`flush`](SessionPersistence::flush) still covers those
    /// appends). A later `create`, `append` or `claim` of the same id (a resume) takes the
    /// session up again.
    ///
    /// Called synchronously, possibly on a runtime thread: it must not block. Without it a
    /// long-running host would hold one open log per session it ever wrote, and another
    /// process could never continue a session this one has finished with.
    ///
    /// The default does nothing: right for a backend that holds nothing per session.
    fn release(&self, id: &SessionId) {
        let _ = id;
    }
}
