//! [`MemorySessionStore`]: the live session store (spec §6).

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};

use agent::bus::ListenerFailed;
use agent::session::now_ms;
use agent::{
    AgentError, Carried, EventBus, Registration, Session, SessionEvent, SessionId, SessionMeta,
    SessionObserver, SessionPersistence, SessionStore,
};

use super::fork::{ForkError, SessionFork, fork_seed};
use super::registry::Registry;

/// A notification about the live store's entries.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum SessionStoreEvent {
    /// `session/created`: an entered session was announced. Listeners replay `session.events()`
    /// to see appends made before publication.
    Created(Arc<Session>),
    /// `session/disposed`: an announced session left the store.
    Disposed(SessionId),
}

impl Carried for SessionStoreEvent {
    fn carrier(&self) -> Option<&SessionId> {
        Some(match self {
            Self::Created(s) => s.id(),
            Self::Disposed(id) => id,
        })
    }
}

struct Entry {
    session: Arc<Session>,
    announced: bool,
    /// The session's durable writer, when persistence is configured; `flush` reports the
    /// appends it could not write.
    persist: Option<Arc<PersistObserver>>,
}

#[derive(Default)]
struct State {
    /// The live sessions by id, in entry order.
    entries: Registry<Entry>,
}

/// Appends every committed event to durable persistence (post-commit; a failure — an error or
/// a panic in the host's persistence — is logged, and remembered: every later `flush` of the
/// session fails with it, since the durable log now lacks an event the live session holds).
///
/// Installed when the session is entered but *deferred* until the creation commits
/// ([`Durability::commit`]): a creation rolled back before then writes nothing durable (no
/// header, no event), so its id stays free in persistence as well.
struct PersistObserver {
    persistence: Arc<dyn SessionPersistence>,
    /// The seq of the next event to write; `None` while deferred (the commit writes the
    /// backlog). Taken by every write, so each event is written once and in order.
    next: Mutex<Option<u64>>,
    /// The first append persistence refused after the commit; sticky.
    failed: Mutex<Option<String>>,
}

impl PersistObserver {
    /// Writes the header (a new session, `persisted == None`) and every event not yet durable,
    /// then writes each later commit as it happens. Idempotent.
    fn commit(&self, session: &Session, persisted: Option<usize>) -> Result<(), AgentError> {
        let mut next = self.next.lock();
        if next.is_some() {
            return Ok(());
        }
        let events = session.events();
        let from = match persisted {
            Some(n) => n.min(events.len()),
            None => {
                self.persistence.create(session.header())?;
                0
            }
        };
        for event in &events[from..] {
            self.persistence.append(session.id(), event)?;
        }
        *next = Some(events.len() as u64);
        Ok(())
    }
}

impl SessionObserver for PersistObserver {
    fn committed(&self, session: &Session, event: &Arc<SessionEvent>) {
        let mut next = self.next.lock();
        // Deferred: the commit writes it. Already written by the commit: skip.
        let Some(n) = next.as_mut().filter(|n| event.seq >= **n) else {
            return;
        };
        *n = event.seq + 1;
        // A panic in the host's persistence is a lost event like a refusal: contained here
        // (not by the session, which would forget it) so every later flush reports it.
        let appended = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.persistence.append(session.id(), event)
        }))
        .unwrap_or_else(|payload| {
            Err(AgentError::Persistence(format!(
                "session persistence panicked: {}",
                agent::bus::panic_message(&*payload)
            )))
        });
        if let Err(err) = appended {
            tracing::warn!(session = %session.id(), seq = event.seq, %err, "persisting a session event failed");
            self.failed.lock().get_or_insert_with(|| {
                format!(
                    "event {} of session \"{}\" was not persisted: {err}",
                    event.seq,
                    session.id()
                )
            });
        }
    }
}

/// The durable side of a session entered by [`MemorySessionStore::enter_deferred`]: nothing is
/// written until [`commit`](Self::commit).
pub(crate) struct Durability {
    /// The entry's key in the store (for [`MemorySessionStore::announce_entered`]).
    key: u64,
    session: Arc<Session>,
    persisted: Option<usize>,
    observer: Option<Arc<PersistObserver>>,
}

impl Durability {
    /// Makes the session durable: its header (unless resumed), every event so far, and from now
    /// on every commit. Without persistence, nothing. A panic in the host's persistence is
    /// contained and returned as [`AgentError::Persistence`] naming it, so the creation rolls
    /// back as for any persistence failure.
    pub(crate) fn commit(&self) -> Result<(), AgentError> {
        let Some(observer) = &self.observer else {
            return Ok(());
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            observer.commit(&self.session, self.persisted)
        }))
        .unwrap_or_else(|payload| {
            Err(AgentError::Persistence(format!(
                "session persistence panicked while making session \"{}\" durable: {}",
                self.session.id(),
                agent::bus::panic_message(&*payload)
            )))
        })
    }
}

struct Inner {
    state: Mutex<State>,
    observers: RwLock<Vec<Arc<dyn SessionObserver>>>,
    persistence: Option<Arc<dyn SessionPersistence>>,
    events: EventBus<SessionStoreEvent>,
    /// Held while an entry is marked announced and `session/created` is emitted, and while an
    /// entry is removed and `session/disposed` is emitted, so listeners on any thread see a
    /// session's `created` before its `disposed`. Reentrant: a `created` listener may dispose
    /// the session (its `disposed` is then emitted inside the `created` emission).
    lifecycle: parking_lot::ReentrantMutex<()>,
}

/// The in-memory live session store.
///
/// * [`prepare`](SessionStore::prepare) validates the header and seed and rejects an id that is
///   live in the store; it does not reserve the id (the final [`enter`](SessionStore::enter)
///   arbitrates concurrent preparations).
/// * `enter` publishes the session with the store's observers (durable persistence first, when
///   configured, then every [`add_observer`](Self::add_observer) observer) and inserts it. The
///   returned guard removes the entry and, for announced sessions, emits
///   [`SessionStoreEvent::Disposed`] exactly once.
/// * [`announce`](Self::announce) emits [`SessionStoreEvent::Created`]; a failing listener
///   vetoes (the runtime then rolls the creation back).
///
/// Cheap to clone (shared). One mutex protects the entry list; it is never held while
/// listeners or observers run. A second, reentrant lock orders each session's notifications:
/// it is held while `session/created` and `session/disposed` are emitted, so every listener,
/// on any thread, sees a session's `created` before its `disposed`. Its listeners may create
/// or dispose sessions on their own thread, but must not wait for another thread that does.
#[derive(Clone)]
pub struct MemorySessionStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemorySessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemorySessionStore")
            .field("live", &self.len())
            .finish()
    }
}

impl Default for MemorySessionStore {
    fn default() -> Self {
        Self::new(None)
    }
}

impl MemorySessionStore {
    /// A store, optionally backed by durable persistence.
    pub fn new(persistence: Option<Arc<dyn SessionPersistence>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                observers: RwLock::new(Vec::new()),
                persistence,
                events: EventBus::new(),
                lifecycle: parking_lot::ReentrantMutex::new(()),
            }),
        }
    }

    /// Adds an observer installed into every session entered from now on (for example an
    /// invariant checker).
    pub fn add_observer(&self, observer: Arc<dyn SessionObserver>) {
        self.inner.observers.write().push(observer);
    }

    /// The store's notifications (`session/created`, `session/disposed`).
    pub fn events(&self) -> &EventBus<SessionStoreEvent> {
        &self.inner.events
    }

    /// The number of live sessions.
    pub fn len(&self) -> usize {
        self.inner.state.lock().entries.len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether a session of this id is live (without taking a reference to it).
    pub(crate) fn contains(&self, id: &SessionId) -> bool {
        self.inner.state.lock().entries.contains(id)
    }

    /// Like [`SessionStore::enter`], for a session whose first `persisted` events are already
    /// durable (a resumed session): only the header of a new session is created and only the
    /// later events are written.
    pub fn enter_persisted(
        &self,
        session: Arc<Session>,
        persisted: Option<usize>,
    ) -> Result<Registration, AgentError> {
        let (guard, durability) = self.enter_deferred(session, persisted)?;
        durability.commit()?;
        Ok(guard.into_registration())
    }

    /// [`enter_persisted`](Self::enter_persisted) with the durable writes deferred until
    /// [`Durability::commit`] (the creation transaction commits only once every publication edge
    /// passed; a rollback before then leaves nothing in persistence).
    pub(crate) fn enter_deferred(
        &self,
        session: Arc<Session>,
        persisted: Option<usize>,
    ) -> Result<(SessionRemoval, Durability), AgentError> {
        // Every observer sees the log as it stands before anything is entered: one that cannot
        // accept it (a seed an invariant checker rejects) fails the entry, which rolls back.
        let observers_seen = self.inner.observers.read().clone();
        for observer in &observers_seen {
            let attached =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| observer.attach(&session)))
                    .unwrap_or_else(|payload| {
                        Err(format!(
                            "the observer panicked: {}",
                            agent::bus::panic_message(&*payload)
                        ))
                    });
            if let Err(reason) = attached {
                return Err(AgentError::Log(agent::LogError::Refused {
                    session: session.id().clone(),
                    reason,
                }));
            }
        }
        let persist = self.inner.persistence.as_ref().map(|persistence| {
            Arc::new(PersistObserver {
                persistence: persistence.clone(),
                next: Mutex::new(None),
                failed: Mutex::new(None),
            })
        });
        let key = {
            let mut state = self.inner.state.lock();
            let entered = state.entries.insert_with(session.id().clone(), |_| Entry {
                session: session.clone(),
                announced: false,
                persist: persist.clone(),
            });
            match entered {
                Ok((key, _)) => key,
                Err(_) => return Err(AgentError::Duplicate(session.id().clone())),
            }
        };
        let guard = SessionRemoval {
            inner: Arc::downgrade(&self.inner),
            key,
            id: session.id().clone(),
            session: Arc::downgrade(&session),
        };
        let mut observers: Vec<Arc<dyn SessionObserver>> = Vec::new();
        if let Some(p) = &persist {
            observers.push(p.clone());
        }
        observers.extend(observers_seen);
        session.publish(observers);
        Ok((
            guard,
            Durability {
                key,
                session,
                persisted,
                observer: persist,
            },
        ))
    }

    /// The optional store fork (spec §6 `fork(source, boundary?, childId?)`): the seed a new
    /// session needs to start from live session `source`'s history through `boundary` (a seq),
    /// or through the latest boundary when `None` — see [`fork_seed`] for the rules (trailing
    /// log-only events are included; a boundary inside an open turn is
    /// [`ForkError::OpenTurn`]). The child id is `child_id`, or a fresh one; a live id is
    /// [`ForkError::Duplicate`]. Nothing is created: pass the seed and metadata to
    /// [`prepare`](SessionStore::prepare) or an agent creation.
    pub fn fork(
        &self,
        source: &SessionId,
        boundary: Option<u64>,
        child_id: Option<SessionId>,
    ) -> Result<SessionFork, ForkError> {
        let session = self
            .get(source)
            .ok_or_else(|| ForkError::NotFound(source.clone()))?;
        let child_id = child_id.unwrap_or_else(SessionId::generate);
        if self.get(&child_id).is_some() {
            return Err(ForkError::Duplicate(child_id));
        }
        let seed = fork_seed(&session.events()[..], boundary)?;
        let meta = SessionMeta {
            cwd: session.header().cwd.clone(),
            parent_session: Some(source.clone()),
            seed_length: Some(seed.events.len() as u64),
            ..SessionMeta::default()
        };
        Ok(SessionFork { child_id, seed, meta })
    }

    /// Emits `session/created` for an entered session, once. A failing listener is returned
    /// (the caller rolls back; removal then pairs it with `session/disposed`).
    pub fn announce(&self, session: &Arc<Session>) -> Result<(), ListenerFailed> {
        self.announce_found(session, |entries| entries.get_mut(session.id()))
    }

    /// [`announce`](Self::announce) for the session [`enter_deferred`](Self::enter_deferred)
    /// entered, found by its entry's key instead of by hashing its id.
    pub(crate) fn announce_entered(&self, entered: &Durability) -> Result<(), ListenerFailed> {
        self.announce_found(&entered.session, |entries| entries.get_serial_mut(entered.key))
    }

    /// [`announce`](Self::announce) with the entry found by `find` (and still `session`'s).
    fn announce_found(
        &self,
        session: &Arc<Session>,
        find: impl FnOnce(&mut Registry<Entry>) -> Option<&mut Entry>,
    ) -> Result<(), ListenerFailed> {
        let _lifecycle = self.inner.lifecycle.lock();
        {
            let mut state = self.inner.state.lock();
            match find(&mut state.entries).filter(|e| Arc::ptr_eq(&e.session, session)) {
                Some(e) if !e.announced => e.announced = true,
                _ => return Ok(()),
            }
        }
        self.inner
            .events
            .try_emit(&SessionStoreEvent::Created(session.clone()))
    }

    /// [`prepare`](SessionStore::prepare) without its check that `id` is not live, for a caller
    /// that checks it itself (the runtime, once it holds the id).
    pub(crate) fn prepare_unchecked(
        &self,
        id: SessionId,
        seed: Option<Vec<SessionEvent>>,
        meta: SessionMeta,
    ) -> Result<Arc<Session>, AgentError> {
        let header = meta.into_header(id, now_ms())?;
        Ok(Arc::new(Session::new(header, seed)?))
    }
}

/// Removes the entry a session was entered under ([`MemorySessionStore::enter_deferred`]) when
/// dropped: the store's removal guard, without the allocation of a [`Registration`]'s closure
/// (the public entry points wrap it in one, [`into_registration`](Self::into_registration)).
pub(crate) struct SessionRemoval {
    inner: std::sync::Weak<Inner>,
    /// The entry's key (serials are never reused).
    key: u64,
    id: SessionId,
    session: std::sync::Weak<Session>,
}

impl SessionRemoval {
    /// The removal as a [`Registration`].
    fn into_registration(self) -> Registration {
        Registration::new(move || drop(self))
    }
}

impl Drop for SessionRemoval {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else { return };
        let (key, id) = (self.key, &self.id);
        // Nothing writes the session any more: the persistence lets go of what it holds
        // for it (an open log and its lock), once what it accepted is written. Before the
        // entry leaves the store: while it is here the id is live, so no resumption of it
        // can claim the log before this release — which would then let go of the successor's
        // writer, not this session's (spec: SPN-56, ids reopen only after quiescence).
        // Found by its key (serials are never reused), not by hashing the id; only looked up
        // when the store persists at all.
        let persisted = |persistence| {
            inner
                .state
                .lock()
                .entries
                .get_serial(key)
                .is_some_and(|e| {
                    std::ptr::eq(Arc::as_ptr(&e.session), self.session.as_ptr()) && e.persist.is_some()
                })
                .then_some(persistence)
        };
        if let Some(persistence) = inner.persistence.as_ref().and_then(persisted)
            && let Err(payload) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| persistence.release(id)))
        {
            // Contained: the entry leaves the store all the same.
            tracing::warn!(
                session = %id,
                message = %agent::bus::panic_message(&*payload),
                "session persistence panicked releasing the log"
            );
        }
        let lifecycle = inner.lifecycle.lock();
        let removed = inner.state.lock().entries.remove(key);
        if let Some(entry) = &removed
            && entry.announced
        {
            inner
                .events
                .emit(&SessionStoreEvent::Disposed(entry.session.id().clone()));
        }
        drop(lifecycle);
        // The entry (its session's last reference, say) is dropped outside the locks.
        drop(removed);
    }
}

#[async_trait]
impl SessionStore for MemorySessionStore {
    fn prepare(
        &self,
        id: SessionId,
        seed: Option<Vec<SessionEvent>>,
        meta: SessionMeta,
    ) -> Result<Arc<Session>, AgentError> {
        if self.get(&id).is_some() {
            return Err(AgentError::Duplicate(id));
        }
        self.prepare_unchecked(id, seed, meta)
    }

    fn enter(&self, session: Arc<Session>) -> Result<Registration, AgentError> {
        self.enter_persisted(session, None)
    }

    fn get(&self, id: &SessionId) -> Option<Arc<Session>> {
        self.inner.state.lock().entries.get(id).map(|e| e.session.clone())
    }

    fn list(&self) -> Vec<Arc<Session>> {
        self.inner
            .state
            .lock()
            .entries
            .values()
            .map(|e| e.session.clone())
            .collect()
    }

    /// Also fails — after the persistence flush settled — when an event committed to the live
    /// session could not be appended to persistence: the durable log lacks it, so reporting
    /// the checkpoint as reached would be a lie.
    async fn flush(&self, id: &SessionId) -> Result<bool, AgentError> {
        let persist = {
            let state = self.inner.state.lock();
            let Some(entry) = state.entries.get(id) else {
                return Err(AgentError::NotFound(id.clone()));
            };
            entry.persist.clone()
        };
        match &self.inner.persistence {
            Some(p) => {
                p.flush(id).await?;
                match persist.and_then(|o| o.failed.lock().clone()) {
                    Some(failed) => Err(AgentError::Persistence(failed)),
                    None => Ok(true),
                }
            }
            None => Ok(false),
        }
    }
}
