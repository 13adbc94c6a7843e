//! The stores as [`agent::SessionPersistence`] backends.

use agent::{AgentError, SessionEvent, SessionHeader, SessionId, SessionPersistence, error_chain};
use async_trait::async_trait;

use super::error::StoreError;
use super::{JsonlStore, MemoryStore};

/// Maps a store error onto the spine's boundary error: `NotFound`, `Duplicate` and header
/// validation keep their typed variants; everything else becomes
/// [`AgentError::Persistence`] carrying the full message (file path and line included).
impl From<StoreError> for AgentError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(id) => AgentError::NotFound(id),
            StoreError::Duplicate(id) => AgentError::Duplicate(id),
            StoreError::Header(h) => AgentError::Header(h),
            other => AgentError::Persistence(error_chain(&other)),
        }
    }
}

fn spine(loaded: super::LoadedSession) -> agent::store::LoadedSession {
    agent::store::LoadedSession {
        header: loaded.header,
        events: loaded.events,
    }
}

/// Inspect's "absent is not an error" shape.
fn optional(result: Result<SessionHeader, StoreError>) -> Result<Option<SessionHeader>, AgentError> {
    match result {
        Ok(h) => Ok(Some(h)),
        Err(StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Delegates to the inherent methods; see [`JsonlStore`] for the contract (buffered
/// `create`/`append`, group-committed `flush`, torn-tail repair on `load`).
#[async_trait]
impl SessionPersistence for JsonlStore {
    fn create(&self, header: &SessionHeader) -> Result<(), AgentError> {
        Ok(JsonlStore::create(self, header)?)
    }

    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        Ok(JsonlStore::append(self, id, event)?)
    }

    async fn flush(&self, id: &SessionId) -> Result<(), AgentError> {
        Ok(JsonlStore::flush(self, id).await?)
    }

    async fn list(&self) -> Result<Vec<SessionHeader>, AgentError> {
        Ok(JsonlStore::list(self)
            .await?
            .into_iter()
            .map(|s| s.header)
            .collect())
    }

    async fn inspect(&self, id: &SessionId) -> Result<Option<SessionHeader>, AgentError> {
        optional(JsonlStore::inspect(self, id).await)
    }

    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, AgentError> {
        Ok(spine(JsonlStore::load(self, id).await?))
    }

    async fn claim(&self, id: &SessionId, events: u64) -> Result<(), AgentError> {
        Ok(JsonlStore::claim(self, id, events).await?)
    }

    fn release(&self, id: &SessionId) {
        JsonlStore::release(self, id);
    }
}

/// Delegates to the inherent methods; see [`MemoryStore`].
#[async_trait]
impl SessionPersistence for MemoryStore {
    fn create(&self, header: &SessionHeader) -> Result<(), AgentError> {
        Ok(MemoryStore::create(self, header)?)
    }

    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        Ok(MemoryStore::append(self, id, event)?)
    }

    async fn flush(&self, id: &SessionId) -> Result<(), AgentError> {
        Ok(MemoryStore::flush(self, id).await?)
    }

    async fn list(&self) -> Result<Vec<SessionHeader>, AgentError> {
        Ok(MemoryStore::list(self)
            .await?
            .into_iter()
            .map(|s| s.header)
            .collect())
    }

    async fn inspect(&self, id: &SessionId) -> Result<Option<SessionHeader>, AgentError> {
        optional(MemoryStore::inspect(self, id).await)
    }

    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, AgentError> {
        Ok(spine(MemoryStore::load(self, id).await?))
    }
}
