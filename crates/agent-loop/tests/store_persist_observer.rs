//! The live store's durable writer ([`MemorySessionStore`] with persistence) against a host
//! persistence that misbehaves after a session went live.

use std::sync::Arc;

use agent::{
    AgentError, EventData, SessionEvent, SessionHeader, SessionId, SessionMeta, SessionPersistence,
    SessionStore as _,
};
use agent_loop::MemoryStore;
use agent_loop::runtime::MemorySessionStore;
use async_trait::async_trait;
use parking_lot::Mutex;

/// A [`MemoryStore`] whose `append` panics for one seq.
#[derive(Default)]
struct PanickingAppend {
    inner: MemoryStore,
    panic_at: Mutex<Option<u64>>,
}

#[async_trait]
impl SessionPersistence for PanickingAppend {
    fn create(&self, header: &SessionHeader) -> Result<(), AgentError> {
        SessionPersistence::create(&self.inner, header)
    }

    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        if *self.panic_at.lock() == Some(event.seq) {
            panic!("persistence exploded at seq {}", event.seq);
        }
        SessionPersistence::append(&self.inner, id, event)
    }

    async fn flush(&self, id: &SessionId) -> Result<(), AgentError> {
        SessionPersistence::flush(&self.inner, id).await
    }

    async fn list(&self) -> Result<Vec<SessionHeader>, AgentError> {
        SessionPersistence::list(&self.inner).await
    }

    async fn inspect(&self, id: &SessionId) -> Result<Option<SessionHeader>, AgentError> {
        SessionPersistence::inspect(&self.inner, id).await
    }

    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, AgentError> {
        SessionPersistence::load(&self.inner, id).await
    }
}

/// An append that *panics* in the host's persistence after the session went live is contained
/// (spec §4.2.6: observer failures never undo the commit), but it is a lost event like an
/// append that returned an error: the durable log lacks an event the live session holds, so the
/// session's next durability checkpoint (spec §6 `flush`) must fail naming the panic, and so
/// must every later one. It used to report success: the panic unwound past the point where the
/// failure is remembered, after the writer had already moved past the event's seq.
#[tokio::test]
async fn an_append_that_panics_in_persistence_fails_every_later_flush() {
    let persistence = Arc::new(PanickingAppend::default());
    *persistence.panic_at.lock() = Some(1);
    let store = MemorySessionStore::new(Some(persistence.clone()));
    let id = SessionId::from("s");
    let header = SessionMeta::default().into_header(id.clone(), 1).expect("header");
    let session = Arc::new(agent::Session::new(header, None).expect("session"));
    let _entered = store.enter(session.clone()).expect("enter");
    let note = || EventData::other("test/note", serde_json::json!({}));
    session.append(note(), None).expect("seq 0");
    assert!(store.flush(&id).await.expect("seq 0 is durable"));
    // Seq 1 is committed to the live session; persisting it panics (contained).
    session.append(note(), None).expect("the append stands");
    assert_eq!(session.len(), 2);
    let stored = persistence.inner.load(&id).await.expect("load");
    assert_eq!(stored.events.len(), 1, "seq 1 never reached persistence");
    for _ in 0..2 {
        let err = store.flush(&id).await.expect_err("the durable log lacks seq 1");
        assert!(
            matches!(&err, AgentError::Persistence(m)
                if m.contains("event 1 of session \"s\"") && m.contains("persistence exploded at seq 1")),
            "{err}"
        );
    }
}
