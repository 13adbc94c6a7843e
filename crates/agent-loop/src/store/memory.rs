//! [`MemoryStore`]: sessions kept in process memory.

use std::collections::HashMap;

use agent::{SessionEvent, SessionHeader, SessionId};
use parking_lot::Mutex;

use super::error::StoreError;
use super::{LoadedSession, SessionSummary};

#[derive(Debug)]
struct Entry {
    header: SessionHeader,
    events: Vec<SessionEvent>,
    flushes: u64,
}

/// A store that keeps every session in memory, for tests and for hosts that need no
/// durability. Same contract as [`JsonlStore`](super::JsonlStore) (header equality on
/// re-create, `seq` checks on append, catalog order) minus the disk: every error is reported by
/// the call that caused it, and `flush` only checks that the session exists and counts the call
/// (see [`MemoryStore::flush_count`]).
///
/// Shared as `Arc<MemoryStore>`; every method takes `&self`. State sits behind one short
/// `parking_lot` lock that is never held across an `.await`, so every future completes on its
/// first poll and cancellation has no effect. Needs no async runtime.
#[derive(Debug, Default)]
pub struct MemoryStore {
    /// Sessions by id.
    sessions: Mutex<HashMap<SessionId, Entry>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Creates session `header.id`. An equal header already stored is a no-op; a different one
    /// is [`StoreError::Duplicate`].
    pub fn create(&self, header: &SessionHeader) -> Result<(), StoreError> {
        header.validate()?;
        let mut sessions = self.sessions.lock();
        match sessions.get(&header.id) {
            Some(entry) if &entry.header == header => Ok(()),
            Some(_) => Err(StoreError::Duplicate(header.id.clone())),
            None => {
                sessions.insert(
                    header.id.clone(),
                    Entry {
                        header: header.clone(),
                        events: Vec::new(),
                        flushes: 0,
                    },
                );
                Ok(())
            }
        }
    }

    /// Appends a copy of `event`; `event.seq` must equal the number of stored events.
    pub fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), StoreError> {
        let mut sessions = self.sessions.lock();
        let entry = sessions
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.clone()))?;
        let expected = entry.events.len() as u64;
        if event.seq != expected {
            return Err(StoreError::SeqMismatch {
                id: id.clone(),
                expected,
                got: event.seq,
            });
        }
        entry.events.push(event.clone());
        Ok(())
    }

    /// Checks that the session exists and counts the checkpoint; memory has nothing to sync.
    pub async fn flush(&self, id: &SessionId) -> Result<(), StoreError> {
        let mut sessions = self.sessions.lock();
        let entry = sessions
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound(id.clone()))?;
        entry.flushes += 1;
        Ok(())
    }

    /// How many times `flush` succeeded for session `id` (0 for an unknown session). For tests
    /// that assert where durability checkpoints happen.
    pub fn flush_count(&self, id: &SessionId) -> u64 {
        self.sessions.lock().get(id).map_or(0, |e| e.flushes)
    }

    /// Every stored session, ordered by `createdAt` then id.
    pub async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
        let mut out: Vec<SessionSummary> = self
            .sessions
            .lock()
            .iter()
            .map(|(id, e)| SessionSummary {
                id: id.clone(),
                header: e.header.clone(),
            })
            .collect();
        out.sort_by(|a, b| (a.header.created_at, &a.id).cmp(&(b.header.created_at, &b.id)));
        Ok(out)
    }

    /// The header of session `id`.
    pub async fn inspect(&self, id: &SessionId) -> Result<SessionHeader, StoreError> {
        self.sessions
            .lock()
            .get(id)
            .map(|e| e.header.clone())
            .ok_or_else(|| StoreError::NotFound(id.clone()))
    }

    /// A copy of session `id`'s header and events (`repaired` is always `false`).
    pub async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError> {
        self.sessions
            .lock()
            .get(id)
            .map(|e| LoadedSession {
                header: e.header.clone(),
                events: e.events.clone(),
                repaired: false,
            })
            .ok_or_else(|| StoreError::NotFound(id.clone()))
    }

    /// Deletes session `id`.
    pub async fn remove(&self, id: &SessionId) -> Result<(), StoreError> {
        self.sessions
            .lock()
            .remove(id)
            .map(drop)
            .ok_or_else(|| StoreError::NotFound(id.clone()))
    }
}
