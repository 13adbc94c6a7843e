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
///   validated); a live duplicate id is rejected.
/// * [`enter`](SessionStore::enter) publishes it (installs observers and persistence) and
///   inserts it; it never overwrites a live entry. Dropping the returned guard removes the entry.
/// * [`flush`](SessionStore::flush) is a durability checkpoint; it returns whether any durable
///   backend participated.
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
/// * [`load`](SessionPersistence::load) returns exactly what was flushed, at least; a torn last
///   record is dropped; corruption elsewhere is an error and nothing is rewritten.
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
}
