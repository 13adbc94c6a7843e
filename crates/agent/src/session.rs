//! The append-only session log (spec §4.2, §4.7).
//!
//! A [`Session`] owns its header and its event list. Appends are validated against the append
//! contract before anything changes; once the session is *published* (entered into a store),
//! each append is first offered to every [`SessionObserver::check`] (any veto leaves the log
//! unchanged), then committed, then announced to [`SessionObserver::committed`] (failures there
//! are contained and logged, never undo the commit).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::ThreadId;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, RwLock};
use serde_json::Value;

use crate::content::ContentBlock;
use crate::event::{EventData, SessionEvent, SurfaceMeta};
use crate::header::SessionHeader;
use crate::history::{self, SurfaceNodes};
use crate::ids::SessionId;
use crate::message::{Message, MessageSource};

mod lossless;

/// Why an append or a seed was refused. Nothing changes when one is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// A seed event's `seq` is not its index.
    #[error("seed event at index {index} has seq {seq}; seqs must be contiguous from 0")]
    SeedSeq {
        /// Index in the seed.
        index: usize,
        /// The seq it carried.
        seq: u64,
    },
    /// A seed event is not lossless JSON.
    #[error("seed event at index {index} is not losslessly JSON-serializable: {reason}")]
    SeedNotLossless {
        /// Index in the seed.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A seed event is otherwise invalid (surface markers, provenance).
    #[error("seed event at index {index} is invalid: {reason}")]
    SeedInvalid {
        /// Index in the seed.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The candidate is not lossless JSON.
    #[error("session append of `{kind}` is not losslessly JSON-serializable: {reason}")]
    NotLossless {
        /// Event type.
        kind: String,
        /// What is wrong.
        reason: String,
    },
    /// Surface markers are missing or misplaced, or provenance is missing.
    #[error("session append of `{kind}` is invalid: {reason}")]
    Invalid {
        /// Event type.
        kind: String,
        /// What is wrong.
        reason: String,
    },
    /// An append was attempted from inside an observer of another append.
    #[error("session append cannot reenter while another append is being published")]
    Reentrant,
    /// An observer refused to watch the session, given its log as it stands when a store enters
    /// it (its seed): see [`SessionObserver::attach`].
    #[error("session `{session}` was refused by an observer of its store: {reason}")]
    Refused {
        /// The session.
        session: SessionId,
        /// The observer's reason.
        reason: String,
    },
    /// A pre-commit observer vetoed the append.
    #[error("session append of `{kind}` was vetoed: {reason}")]
    Vetoed {
        /// Event type.
        kind: String,
        /// The observer's reason.
        reason: String,
    },
}

/// Watches a published session's appends.
///
/// # Contract
/// * **Calls.** Observers run synchronously on the appending thread, in registration order, while
///   the session's append lock is held: for one session, calls never overlap and come in `seq`
///   order. One observer may be installed into many sessions (a store installs its observers into
///   every session it enters) and is then called concurrently for different sessions.
/// * **Reentrancy.** Observers must not block and must not append to the same session (such an
///   append fails with [`LogError::Reentrant`]) nor wait for a thread that does (it would
///   deadlock on the append lock); observers that must write should defer.
/// * **Veto.** A later observer may veto an append that `check` accepted, and `committed` is then
///   not called for it: `check` may stage state but must not commit it.
/// * **Panics.** Both are contained. A panic in `check` vetoes the append: it fails with
///   [`LogError::Vetoed`] whose reason names the panic, nothing is committed, later observers are
///   not asked, and the session stays usable. A panic in `committed` is logged; the append
///   stands.
/// * **Ownership.** The session holds its observers for its whole life (a later
///   [`Session::publish`] replaces the list); leaving a store does not remove them.
pub trait SessionObserver: Send + Sync + 'static {
    /// Called once when a store enters `session` with this observer among its observers,
    /// before the session is published and before any append reaches
    /// [`check`](Self::check): an observer that keeps state per session builds it here from the
    /// session's log as it stands (a seed, a resumed log). `Err(reason)` (or a panic) refuses the
    /// session: entering it fails with [`LogError::Refused`] and its creation or resumption
    /// rolls back. Default: accept.
    fn attach(&self, session: &Session) -> Result<(), String> {
        let _ = session;
        Ok(())
    }

    /// Pre-commit check. `Err(reason)` (or a panic) vetoes the append; the log and every
    /// observer's state stay unchanged. Default: accept.
    fn check(&self, session: &Session, candidate: &SessionEvent) -> Result<(), String> {
        let _ = (session, candidate);
        Ok(())
    }

    /// Post-commit notification. A panic here is contained and logged.
    fn committed(&self, session: &Session, event: &Arc<SessionEvent>) {
        let _ = (session, event);
    }
}

/// An immutable snapshot of a log: it never grows after being handed out.
pub type EventSnapshot = Arc<Vec<Arc<SessionEvent>>>;

struct Inner {
    events: EventSnapshot,
    /// Whether an observed append holds the next seq (it read `events.len()` and has not
    /// committed or been vetoed yet). An unobserved append finding it set waits on
    /// `append_lock` instead of taking that seq.
    reserved: bool,
}

/// One session: its header and its append-only event log.
///
/// Shared as `Arc<Session>`. All methods take `&self` and are safe to call concurrently:
/// appends are serialized by an internal lock held only for validation, commit and the
/// synchronous observer calls (never across an `.await`).
pub struct Session {
    header: SessionHeader,
    first_live_seq: u64,
    inner: Mutex<Inner>,
    /// Serializes observed appends (and an unobserved one that finds a seq reserved).
    append_lock: Mutex<()>,
    /// Whether some append is running observers (raised before `publishing` is set, lowered
    /// after it is cleared). While it is down no append can be reentering, so the exact check
    /// (thread id against `publishing`) is skipped.
    observing: AtomicBool,
    publishing: Mutex<Option<ThreadId>>,
    /// `None` until published. Replaced, never mutated in place, so an append clones only the
    /// `Arc`.
    observers: RwLock<Option<Observers>>,
    /// Whether `observers` holds a non-empty list; written under its write lock, so an append
    /// that reads it down skips the observer lock altogether.
    observed: AtomicBool,
}

type Observers = Arc<[Arc<dyn SessionObserver>]>;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.header.id)
            .field("len", &self.len())
            .field("published", &self.is_published())
            .finish()
    }
}

/// Current wall-clock time in epoch milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Session {
    /// Builds an unpublished session. With a seed (even an empty one), every seed event is
    /// validated like an append, copied, and followed by `session/end-seed` unless the seed
    /// already ends with one; `first_live_seq` is the seed length. Without a seed, the log is
    /// empty and has no marker.
    pub fn new(header: SessionHeader, seed: Option<Vec<SessionEvent>>) -> Result<Self, LogError> {
        let (events, first_live_seq) = match seed {
            None => (Vec::with_capacity(LOG_CAPACITY), 0),
            Some(seed) => {
                validate_log(&seed)?;
                let len = seed.len() as u64;
                let ends_with_marker = matches!(seed.last(), Some(e) if matches!(e.data, EventData::EndSeed));
                let mut events: Vec<Arc<SessionEvent>> = Vec::with_capacity(seed.len() + 1 + LOG_CAPACITY);
                events.extend(seed.into_iter().map(Arc::new));
                if !ends_with_marker {
                    events.push(Arc::new(SessionEvent {
                        seq: len,
                        time: now_ms(),
                        data: EventData::EndSeed,
                        surface: None,
                        ignorable: false,
                    }));
                }
                (events, len)
            }
        };
        Ok(Self {
            header,
            first_live_seq,
            inner: Mutex::new(Inner {
                events: Arc::new(events),
                reserved: false,
            }),
            append_lock: Mutex::new(()),
            observing: AtomicBool::new(false),
            publishing: Mutex::new(None),
            observers: RwLock::new(None),
            observed: AtomicBool::new(false),
        })
    }

    /// The session id.
    pub fn id(&self) -> &SessionId {
        &self.header.id
    }

    /// The immutable header.
    pub fn header(&self) -> &SessionHeader {
        &self.header
    }

    /// The seq of the first event not copied from the seed (the seed length; 0 without a seed).
    pub fn first_live_seq(&self) -> u64 {
        self.first_live_seq
    }

    /// An immutable snapshot of the log.
    pub fn events(&self) -> EventSnapshot {
        self.inner.lock().events.clone()
    }

    /// The number of events.
    pub fn len(&self) -> usize {
        self.inner.lock().events.len()
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the session has been published (entered into a store).
    pub fn is_published(&self) -> bool {
        self.observers.read().is_some()
    }

    /// Publishes the session: from now on every append is checked by and announced to
    /// `observers`. Calling it again replaces the observer list.
    pub fn publish(&self, observers: Vec<Arc<dyn SessionObserver>>) {
        // Sessions are often published with no observers: share one empty list.
        static NO_OBSERVERS: std::sync::LazyLock<Observers> = std::sync::LazyLock::new(|| Arc::new([]));
        let list = if observers.is_empty() {
            NO_OBSERVERS.clone()
        } else {
            observers.into()
        };
        let mut slot = self.observers.write();
        self.observed.store(!list.is_empty(), Ordering::Release);
        *slot = Some(list);
    }

    /// Adds one observer to a published session (no-op before publication).
    pub fn add_observer(&self, observer: Arc<dyn SessionObserver>) {
        if let Some(list) = self.observers.write().as_mut() {
            let mut next = list.to_vec();
            next.push(observer);
            *list = next.into();
            self.observed.store(true, Ordering::Release);
        }
    }

    /// Appends an event at the current time. See [`Session::append_at`].
    pub fn append(
        &self,
        data: EventData,
        surface: Option<SurfaceMeta>,
    ) -> Result<Arc<SessionEvent>, LogError> {
        self.append_impl::<true>(data, surface, None)
            .map(Committed::event)
    }

    /// Appends an event with an explicit timestamp. The seq is assigned here (`== len`). On any
    /// error nothing changes.
    ///
    /// The candidate is checked against the append contract (spine §4.2) first: lossless JSON,
    /// surface markers, model provenance, and for a `surfaceOp: replace {start, end}` a range
    /// that names current surface nodes in surface order (a `tool/result` replacement: exactly
    /// one current `tool/result`, changing only its result's content) — checked against the
    /// log the event commits to, under the lock that assigns its seq. A published session then
    /// offers it to its observers' checks.
    pub fn append_at(
        &self,
        data: EventData,
        surface: Option<SurfaceMeta>,
        time: u64,
    ) -> Result<Arc<SessionEvent>, LogError> {
        self.append_impl::<true>(data, surface, Some(time))
            .map(Committed::event)
    }

    /// [`append`](Self::append) for a caller that does not need the event back: the log keeps
    /// the only reference (no reference count is taken and dropped for the caller). Returns the
    /// event's seq.
    pub fn record(&self, data: EventData, surface: Option<SurfaceMeta>) -> Result<u64, LogError> {
        self.append_impl::<false>(data, surface, None).map(Committed::seq)
    }

    /// [`append_at`](Self::append_at) for a caller that does not need the event back; see
    /// [`record`](Self::record).
    pub fn record_at(
        &self,
        data: EventData,
        surface: Option<SurfaceMeta>,
        time: u64,
    ) -> Result<u64, LogError> {
        self.append_impl::<false>(data, surface, Some(time))
            .map(Committed::seq)
    }

    /// The append itself; `time: None` reads the clock; `SHARE` hands the committed event back
    /// (otherwise only its seq). Inlined into every entry point so the (large) payload is moved
    /// as few times as possible.
    #[inline(always)]
    fn append_impl<const SHARE: bool>(
        &self,
        data: EventData,
        surface: Option<SurfaceMeta>,
        time: Option<u64>,
    ) -> Result<Committed, LogError> {
        // An append can only reenter from inside an observer, and this thread raised
        // `observing` (program order) before calling one, so a lowered flag rules it out.
        if self.observing.load(Ordering::Acquire)
            && *self.publishing.lock() == Some(std::thread::current().id())
        {
            return Err(LogError::Reentrant);
        }
        let time = time.unwrap_or_else(now_ms);
        // The event is built before it is validated, so the payload moves straight from the
        // argument into the allocation. (Validated first, the payload's address has escaped into
        // the validation, and the compiler then copies it twice more on its way to the heap.)
        // Its seq is assigned below, under the log lock, through the same exclusive borrow.
        let mut event;
        let unshared;
        match event_pool::take() {
            Some(recycled) => {
                event = recycled;
                unshared = Arc::get_mut(&mut event).expect("a pooled event is not shared");
                reset_pooled(unshared, time, surface);
            }
            None => {
                event = new_event(time, surface);
                unshared = Arc::get_mut(&mut event).expect("a new event is not shared");
            }
        }
        place_payload(unshared, data);
        if let Err(e) = validate_candidate(&unshared.data, unshared.surface.as_ref()) {
            let kind = unshared.type_name().to_owned();
            return Err(match e {
                CandidateError::Lossless(reason) => LogError::NotLossless { kind, reason },
                CandidateError::Invalid(reason) => LogError::Invalid { kind, reason },
            });
        }
        // A replacement's range is checked against the log it commits to, under the lock that
        // assigns its seq (each commit site below).
        let replace = history::replace_op(unshared.surface.as_ref());
        // Unobserved, seq assignment and commit share one lock and need no other — unless an
        // observed append (the observer list was replaced meanwhile) holds a seq.
        if !self.observed.load(Ordering::Acquire) {
            let mut inner = self.inner.lock();
            if !inner.reserved {
                check_replace(&inner.events, replace, unshared)?;
                let seq = inner.events.len() as u64;
                unshared.seq = seq;
                return Ok(commit::<SHARE>(&mut inner.events, event, seq));
            }
        }
        let _serial = self.append_lock.lock();
        // An empty observer list behaves exactly like none: nothing to consult or announce.
        let observers = if self.observed.load(Ordering::Acquire) {
            match &*self.observers.read() {
                Some(list) if !list.is_empty() => Some(list.clone()),
                _ => None,
            }
        } else {
            None
        };
        let Some(observers) = observers else {
            // Reservations are made under `append_lock`, which this append holds: none is open.
            let mut inner = self.inner.lock();
            check_replace(&inner.events, replace, unshared)?;
            let seq = inner.events.len() as u64;
            unshared.seq = seq;
            return Ok(commit::<SHARE>(&mut inner.events, event, seq));
        };
        let seq = {
            // While the seq is reserved no other append commits, so the range checked here is
            // the one the event commits against.
            let mut inner = self.inner.lock();
            check_replace(&inner.events, replace, unshared)?;
            inner.reserved = true;
            inner.events.len() as u64
        };
        unshared.seq = seq;
        self.observing.store(true, Ordering::Release);
        *self.publishing.lock() = Some(std::thread::current().id());
        // A panicking check is a veto: the append is refused and the session stays usable.
        // (Observer calls are the only code between reserving the seq and releasing it that
        // can unwind, and they are contained.)
        let verdict = observers.iter().try_for_each(|o| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| o.check(self, &event))).unwrap_or_else(
                |payload| {
                    Err(format!(
                        "a session observer panicked in its check: {}",
                        crate::bus::panic_message(&*payload)
                    ))
                },
            )
        });
        if let Err(reason) = verdict {
            self.inner.lock().reserved = false;
            self.end_observing();
            return Err(LogError::Vetoed {
                kind: event.type_name().to_owned(),
                reason,
            });
        }
        {
            let mut inner = self.inner.lock();
            push_event(&mut inner.events, event.clone());
            inner.reserved = false;
        }
        for o in observers.iter() {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| o.committed(self, &event)));
            if result.is_err() {
                tracing::warn!(session = %self.id(), seq, "session observer panicked; the append stands");
            }
        }
        self.end_observing();
        Ok(if SHARE {
            Committed::Shared(event)
        } else {
            Committed::Seq(seq)
        })
    }

    fn end_observing(&self) {
        *self.publishing.lock() = None;
        self.observing.store(false, Ordering::Release);
    }
}

impl Drop for Session {
    /// Hands the log's event allocations that nothing else references to this thread's pool
    /// of event allocations (their payloads dropped here, as before); events still shared (a
    /// snapshot of the log, a history or a caller holding one) are left to their last owner.
    fn drop(&mut self) {
        if let Some(events) = Arc::get_mut(&mut self.inner.get_mut().events) {
            event_pool::recycle(events.drain(..));
        }
    }
}

/// A small per-thread pool of event allocations recycled from dropped sessions, so that a
/// short-lived session (a one-shot delegation logs a dozen events) does not pay an allocation
/// and a free per event: the allocator's per-thread cache holds only a few blocks of one
/// size, and the rest of a log's same-sized events take its slow path both ways.
///
/// A pooled event is unshared (strong count 1, no weak handle) and holds the payload-free
/// placeholder `EndSeed` and no surface metadata; its payload was dropped when it was
/// recycled. At most `CAPACITY` (64) allocations are kept per thread (the rest are freed);
/// they are freed with the thread. The pool is only a cache: when it is
/// unavailable (borrowed by a re-entrant call, or the thread is exiting) events are allocated
/// and freed as usual.
mod event_pool {
    use std::cell::RefCell;
    use std::sync::Arc;

    use crate::event::{EventData, SessionEvent};

    /// Allocations kept per thread at most.
    pub(super) const CAPACITY: usize = 64;

    thread_local! {
        static POOL: RefCell<Vec<Arc<SessionEvent>>> = const { RefCell::new(Vec::new()) };
    }

    /// A recycled, unshared event with the placeholder payload, if the pool has one.
    #[inline]
    pub(super) fn take() -> Option<Arc<SessionEvent>> {
        POOL.try_with(|pool| pool.try_borrow_mut().ok().and_then(|mut pool| pool.pop()))
            .ok()
            .flatten()
    }

    /// Consumes `events` (the log of a dropped session, or the last holders of its events),
    /// keeping the allocations of the unshared ones while the pool has room (the rest are
    /// dropped as usual). Payloads are dropped before the pool is borrowed.
    pub(super) fn recycle(events: impl Iterator<Item = Arc<SessionEvent>>) {
        for mut event in events {
            let Some(unshared) = Arc::get_mut(&mut event) else {
                continue;
            };
            // Dropped in place (moving the payload out would copy it).
            unshared.data = EventData::EndSeed;
            unshared.surface = None;
            let full = POOL
                .try_with(|pool| match pool.try_borrow_mut() {
                    Ok(mut pool) if pool.len() < CAPACITY => {
                        pool.push(event);
                        false
                    }
                    _ => true,
                })
                .unwrap_or(true);
            if full {
                return;
            }
        }
    }
}

/// Hands `events` to this thread's pool of event allocations (see `event_pool`): those that
/// nothing else references are kept for reuse by later appends, the rest dropped as usual. For
/// the last holders of a dropped session's events.
pub(crate) fn recycle_events(events: impl Iterator<Item = Arc<SessionEvent>>) {
    event_pool::recycle(events);
}

/// Allocates the shared event with a payload-free placeholder (its seq still 0), for
/// [`place_payload`] to fill in place.
///
/// A plain `Arc::new` of the whole event assembles the event and then its reference counts on
/// the stack before copying them to the heap: three copies of the payload (measured). Here
/// `Arc::new_cyclic` (its weak handle unused) allocates first and writes the placeholder field
/// by field; the payload then replaces it in place, copied once.
#[inline(always)]
fn new_event(time: u64, surface: Option<SurfaceMeta>) -> Arc<SessionEvent> {
    Arc::new_cyclic(|_| SessionEvent {
        seq: 0,
        time,
        data: EventData::EndSeed,
        surface,
        ignorable: false,
    })
}

/// Readies a pooled event for an append at `at` with `meta`, keeping the payload-free
/// placeholder `place_payload` expects.
///
/// Every field is named (a field added later cannot keep a stale value: it must be reset here
/// to compile). A pooled event holds the `EndSeed` placeholder and no surface metadata (see
/// `event_pool`): the payload is left in place (a whole assignment would run the payload's drop
/// glue, a call per append) for `place_payload` to overwrite.
#[inline(always)]
fn reset_pooled(event: &mut SessionEvent, at: u64, meta: Option<SurfaceMeta>) {
    let SessionEvent {
        seq,
        time,
        data,
        surface,
        ignorable,
    } = event;
    debug_assert!(matches!(data, EventData::EndSeed) && surface.is_none());
    *seq = 0;
    *time = at;
    *ignorable = false;
    *surface = meta;
}

/// Moves `data` into a new event's placeholder.
#[inline(always)]
fn place_payload(event: &mut SessionEvent, data: EventData) {
    let placeholder = std::mem::replace(&mut event.data, data);
    // `EndSeed` owns nothing, so skipping its drop glue leaks nothing.
    debug_assert!(matches!(placeholder, EventData::EndSeed));
    std::mem::forget(placeholder);
}

/// What an append hands back: the shared event, or only its seq.
enum Committed {
    Shared(Arc<SessionEvent>),
    Seq(u64),
}

impl Committed {
    fn seq(self) -> u64 {
        match self {
            Self::Shared(event) => event.seq,
            Self::Seq(seq) => seq,
        }
    }

    fn event(self) -> Arc<SessionEvent> {
        match self {
            Self::Shared(event) => event,
            Self::Seq(_) => unreachable!("a sharing append hands back its event"),
        }
    }
}

/// Pushes `event` (its seq assigned) to the log, keeping a reference for the caller when
/// `SHARE`.
#[inline(always)]
fn commit<const SHARE: bool>(events: &mut EventSnapshot, event: Arc<SessionEvent>, seq: u64) -> Committed {
    if SHARE {
        push_event(events, event.clone());
        Committed::Shared(event)
    } else {
        push_event(events, event);
        Committed::Seq(seq)
    }
}

/// Initial capacity of a log's event list: a short session never reallocates it.
const LOG_CAPACITY: usize = 32;

/// Appends to the log, copying it first only when a snapshot still shares it (the copy gets
/// headroom, so a reader taking a snapshot per append does not also cost a regrowth per append).
#[inline(always)]
fn push_event(events: &mut EventSnapshot, event: Arc<SessionEvent>) {
    match Arc::get_mut(events) {
        Some(list) => list.push(event),
        None => push_to_copy(events, event),
    }
}

#[cold]
#[inline(never)]
fn push_to_copy(events: &mut EventSnapshot, event: Arc<SessionEvent>) {
    let mut list = Vec::with_capacity((events.len() * 2).max(LOG_CAPACITY));
    list.extend(events.iter().cloned());
    list.push(event);
    *events = Arc::new(list);
}

enum CandidateError {
    Lossless(String),
    Invalid(String),
}

/// Checks that a JSON value is lossless: no negative zero anywhere, and no deeper nesting than
/// a JSON reader accepts (see [`check_lossless`]).
pub fn check_lossless_json(value: &Value) -> Result<(), String> {
    // A direct look at the numbers decides the common (lossless) case; the walk names the path.
    if lossless::plain_value(value) {
        return Ok(());
    }
    check_lossless(value)
}

/// Checks that the JSON rendering of `value` is lossless: no float in it is negative zero or
/// non-finite (`serde_json` would silently render the latter as `null`), and its arrays and
/// objects nest at most 127 levels deep (`serde_json` writes deeper renderings but refuses to
/// read them back), and no object renders a key twice (a `#[serde(flatten)]` map naming a
/// field of its struct, which would read back as another value). The walk follows `value`'s
/// `Serialize` implementation without building a JSON tree; the error names the first
/// offending number or container and its path in the rendering (`.key`, `[i]`, `$` for the
/// root).
pub fn check_lossless<T: serde::Serialize + ?Sized>(value: &T) -> Result<(), String> {
    lossless::check(value, lossless::MAX_READABLE_DEPTH).map_err(|fault| fault.reason())
}

/// Checks that a tool's final outcome can be logged as the `content` and `meta` of a
/// `tool/result` event: [`check_lossless`] of each, with the nesting budget left where each
/// sits in the event's line. (The result content is four levels deeper than the line's top —
/// `data.message.content[0].content` — and `meta` two, so content or metadata that passes
/// [`check_lossless`] on its own can still nest too deep to be read back once logged.) A
/// caller that checks with this before committing an outcome never has the append refuse it
/// for its shape. The content's open unions are checked as the append checks them (no
/// [`ContentBlock::Other`] naming a known block type). The error names the part (`content: …`,
/// `meta: …`) and the path inside it.
pub fn check_tool_result_loggable(content: &[ContentBlock], meta: Option<&Value>) -> Result<(), String> {
    // line → data → message → content array → tool-result block → its content array.
    const CONTENT_DEPTH: usize = lossless::MAX_READABLE_DEPTH - 5;
    // line → data → meta.
    const META_DEPTH: usize = lossless::MAX_READABLE_DEPTH - 2;
    lossless::check(content, CONTENT_DEPTH).map_err(|fault| format!("content: {}", fault.reason()))?;
    if let Some(reason) = lossless::misnamed_in_blocks(content) {
        return Err(format!("content: {reason}"));
    }
    match meta {
        Some(meta) if !lossless::plain_value(meta) => {
            lossless::check(meta, META_DEPTH).map_err(|fault| format!("meta: {}", fault.reason()))
        }
        _ => Ok(()),
    }
}

/// Checks that `messages` can be logged as the messages an inbox splice inserts
/// (`agent/inbox/spliced`, whose `data.inserted` holds them): [`check_lossless`] with the
/// nesting budget left there, and the open-union check of the append (no
/// [`ContentBlock::Other`] or [`MessageSource::Other`] naming a known tag), so an inbox
/// insertion of messages that pass never fails for their shape.
pub fn check_inbox_insert_loggable(messages: &[Message]) -> Result<(), String> {
    // line → data → inserted array.
    const INSERTED_DEPTH: usize = lossless::MAX_READABLE_DEPTH - 2;
    lossless::check(messages, INSERTED_DEPTH).map_err(|fault| fault.reason())?;
    match lossless::misnamed_in_messages(messages) {
        Some(reason) => Err(reason),
        None => Ok(()),
    }
}

/// [`check_lossless`] for an event's `data`, which sits one level inside its envelope: the
/// whole line must read back.
fn check_lossless_payload(data: &EventData) -> Result<(), String> {
    lossless::check(&data.payload(), lossless::MAX_READABLE_DEPTH - 1).map_err(|fault| fault.reason())
}

/// Checks a candidate event against the append contract (spine §4.2). Inlined into the
/// appends: the common case below is decided without a call, the rest by
/// [`validate_candidate_in_full`].
#[inline(always)]
fn validate_candidate(data: &EventData, surface: Option<&SurfaceMeta>) -> Result<(), CandidateError> {
    // Shortcut for the float-free, non-surface boundary and status events (most appends): of
    // the rules in `validate_candidate_in_full` only the surface-marker one can apply, with the
    // same verdict and text.
    if lossless::plain_non_surface(data) {
        return match surface {
            None => Ok(()),
            Some(_) => Err(invalid(
                "only surface events may carry surfaceOp or sourceEventSeqs",
            )),
        };
    }
    validate_candidate_in_full(data, surface)
}

/// [`validate_candidate`] without its shortcut: every rule.
#[inline(never)]
fn validate_candidate_in_full(data: &EventData, surface: Option<&SurfaceMeta>) -> Result<(), CandidateError> {
    // Typed floats that serde_json would silently turn into `null`.
    if let EventData::RequestHeader { header, .. } = data
        && let Some(t) = header.config.temperature
        && (!t.is_finite() || (t == 0.0 && t.is_sign_negative()))
    {
        return Err(lossy_temperature(t));
    }
    // The fast path only skips walks that cannot fail; anything it is unsure of is walked.
    if !lossless::plainly_lossless(data) {
        check_lossless_payload(data).map_err(CandidateError::Lossless)?;
        // An open union's catch-all naming a known tag would read back as another value.
        if let Some(reason) = lossless::misnamed_other(data) {
            return Err(CandidateError::Invalid(reason));
        }
    }
    // A plugin event named like a typed one would read back as that type (or not at all).
    if let EventData::Other { kind, .. } = data
        && crate::event::TYPED_TYPES.contains(&kind.as_str())
    {
        return Err(CandidateError::Invalid(format!(
            "`{kind}` is a typed event type; a plugin event may not use it"
        )));
    }
    match (data.is_surface(), surface) {
        (true, None) | (true, Some(SurfaceMeta { surface_op: None, .. })) => {
            return Err(invalid("surface events must declare surfaceOp"));
        }
        (false, Some(_)) => {
            return Err(invalid(
                "only surface events may carry surfaceOp or sourceEventSeqs",
            ));
        }
        _ => {}
    }
    if let Some(SurfaceMeta {
        source_event_seqs: Some(_),
        ..
    }) = surface
        && !matches!(data, EventData::AssistantMessage { .. })
    {
        return Err(invalid("only assistant/message may carry sourceEventSeqs"));
    }
    match data {
        EventData::AssistantMessage { message, .. } => match &message.source {
            MessageSource::Model { provider, model, .. } if !provider.is_empty() && !model.is_empty() => {}
            _ => {
                return Err(invalid(
                    "assistant messages must carry model provenance with provider and model",
                ));
            }
        },
        EventData::RequestHeader { header, .. }
            if header.config.provider.is_empty() || header.config.model.is_empty() =>
        {
            return Err(invalid("request headers must name provider and model"));
        }
        _ => {}
    }
    Ok(())
}

// The error paths are kept out of line so the accepting path stays small.
#[cold]
#[inline(never)]
fn lossy_temperature(t: f64) -> CandidateError {
    CandidateError::Lossless(format!("temperature {t} is not lossless"))
}

#[cold]
#[inline(never)]
fn invalid(reason: &str) -> CandidateError {
    CandidateError::Invalid(reason.to_owned())
}

fn validate_seed_event(index: usize, ev: &SessionEvent) -> Result<(), LogError> {
    if ev.seq != index as u64 {
        return Err(LogError::SeedSeq { index, seq: ev.seq });
    }
    validate_candidate(&ev.data, ev.surface.as_ref()).map_err(|e| match e {
        CandidateError::Lossless(reason) => LogError::SeedNotLossless { index, reason },
        CandidateError::Invalid(reason) => LogError::SeedInvalid { index, reason },
    })
}

/// Validates a whole log as a seed would be validated (seq contiguity, losslessness, surface
/// markers and replacement ranges, provenance). Used by stores when loading and by tools that
/// check logs.
pub fn validate_log(events: &[SessionEvent]) -> Result<(), LogError> {
    let mut surface = SurfaceNodes::default();
    for (index, event) in events.iter().enumerate() {
        validate_seed_event(index, event)?;
        if !event.data.is_surface() {
            continue;
        }
        if let Some(range) = history::replace_op(event.surface.as_ref()) {
            surface
                .check_replace(range, &event.data, |seq| events.get(usize::try_from(seq).ok()?))
                .map_err(|reason| LogError::SeedInvalid { index, reason })?;
        }
        surface.place(event);
    }
    Ok(())
}

/// Refuses a replacement (`replace`, from the candidate's surface metadata) whose range does
/// not name current surface nodes of `events` in order. The check replays the log's surface,
/// which only a replacement (rare: compaction) pays for.
#[inline(always)]
fn check_replace(
    events: &[Arc<SessionEvent>],
    replace: Option<(u64, u64)>,
    candidate: &SessionEvent,
) -> Result<(), LogError> {
    match replace {
        None => Ok(()),
        Some(range) => check_replace_slow(events, range, candidate),
    }
}

#[cold]
#[inline(never)]
fn check_replace_slow(
    events: &[Arc<SessionEvent>],
    range: (u64, u64),
    candidate: &SessionEvent,
) -> Result<(), LogError> {
    SurfaceNodes::of(events)
        .check_replace(range, &candidate.data, |seq| {
            events.get(usize::try_from(seq).ok()?).map(|e| &**e)
        })
        .map_err(|reason| LogError::Invalid {
            kind: candidate.type_name().to_owned(),
            reason,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::SessionMeta;
    use crate::message::Message;

    fn header(id: &str) -> SessionHeader {
        SessionMeta::default().into_header(id.into(), 1).unwrap()
    }

    fn ev(seq: u64, data: EventData) -> SessionEvent {
        SessionEvent {
            seq,
            time: 1,
            data,
            surface: None,
            ignorable: false,
        }
    }

    /// Event allocations recycled from a dropped session (the per-thread `event_pool`) log
    /// exactly like fresh ones: the payload, time, seq, surface and `ignorable` of the new event,
    /// nothing of the old one. An event still shared when its session dropped is left intact.
    #[test]
    fn recycled_event_allocations_log_like_fresh_ones() {
        // Earlier tests on this thread (`--test-threads=1`) may have filled the pool.
        while event_pool::take().is_some() {}
        let first = Session::new(header("a"), None).unwrap();
        let kept = first
            .append(
                EventData::UserMessage(Message::user_text("kept")),
                Some(SurfaceMeta::append()),
            )
            .unwrap();
        first
            .append(
                EventData::UserMessage(Message::user_text("gone")),
                Some(SurfaceMeta::append()),
            )
            .unwrap();
        first
            .record_at(EventData::TurnStart { turn: 1 }, None, 7)
            .unwrap();
        let (with_surface, last) = {
            let events = first.events();
            (Arc::as_ptr(&events[1]) as usize, Arc::as_ptr(&events[2]) as usize)
        };
        drop(first);
        assert!(matches!(&kept.data, EventData::UserMessage(m) if m.text() == "kept"));
        assert!(kept.surface.is_some());

        let second = Session::new(header("b"), None).unwrap();
        second
            .record_at(EventData::TurnStart { turn: 2 }, None, 9)
            .unwrap();
        second
            .record_at(EventData::StepStart { turn: 2, step: 1 }, None, 10)
            .unwrap();
        let events = second.events();
        // The pool hands back the last recycled allocation first.
        assert_eq!(Arc::as_ptr(&events[0]) as usize, last);
        assert_eq!(Arc::as_ptr(&events[1]) as usize, with_surface);
        assert_eq!(
            *events[0],
            SessionEvent {
                seq: 0,
                time: 9,
                data: EventData::TurnStart { turn: 2 },
                surface: None,
                ignorable: false,
            }
        );
        assert_eq!(
            *events[1],
            SessionEvent {
                seq: 1,
                time: 10,
                data: EventData::StepStart { turn: 2, step: 1 },
                surface: None,
                ignorable: false,
            }
        );
    }

    /// The last holder of a dropped session's events (its derived history) hands their
    /// allocations to the pool too, emptied of their payloads.
    #[test]
    fn a_history_outliving_its_session_recycles_its_events() {
        while event_pool::take().is_some() {}
        let session = Session::new(header("a"), None).unwrap();
        session
            .append(
                EventData::UserMessage(Message::user_text("hi")),
                Some(SurfaceMeta::append()),
            )
            .unwrap();
        let mut history = crate::history::DerivedHistory::new();
        history.update(&session.events());
        let held = Arc::as_ptr(&session.events()[0]) as usize;
        drop(session);
        assert!(event_pool::take().is_none(), "the history still holds the event");
        assert_eq!(history.messages().len(), 1);
        drop(history);
        let recycled = event_pool::take().expect("the history's last reference was recycled");
        assert_eq!(Arc::as_ptr(&recycled) as usize, held);
        assert!(matches!(recycled.data, EventData::EndSeed));
        assert!(recycled.surface.is_none());
    }

    /// spec: SPN-59
    #[test]
    fn spn_59_empty_seed_marks_end_seed_at_zero_and_fresh_has_none() {
        let s = Session::new(header("a"), Some(vec![])).unwrap();
        assert_eq!(s.len(), 1);
        assert!(matches!(s.events()[0].data, EventData::EndSeed));
        assert_eq!(s.first_live_seq(), 0);
        let fresh = Session::new(header("b"), None).unwrap();
        assert!(fresh.is_empty());
        // Reopening a log that already ends with the marker adds no second one.
        let log: Vec<SessionEvent> = s.events().iter().map(|e| (**e).clone()).collect();
        let reopened = Session::new(header("a"), Some(log)).unwrap();
        assert_eq!(reopened.len(), 1);
    }

    /// spec: SPN-58 (the seed part: verbatim copy, one end-seed, `firstLiveSeq`)
    #[test]
    fn spn_58_seed_is_kept_verbatim_with_one_marker() {
        let seed = vec![
            ev(0, EventData::TurnStart { turn: 1 }),
            ev(
                1,
                EventData::TurnEnd {
                    turn: 1,
                    reason: crate::TurnEndReason::Completed,
                },
            ),
        ];
        let s = Session::new(header("a"), Some(seed.clone())).unwrap();
        let events = s.events();
        assert_eq!(events.len(), 3);
        assert_eq!(*events[0], seed[0]);
        assert_eq!(*events[1], seed[1]);
        assert!(matches!(events[2].data, EventData::EndSeed));
        assert_eq!(events[2].seq, 2);
        assert_eq!(s.first_live_seq(), 2);
    }

    /// spec: SPN-60
    #[test]
    fn spn_60_seed_must_be_contiguous_lossless_and_surface_valid() {
        let err = Session::new(header("a"), Some(vec![ev(1, EventData::TurnStart { turn: 1 })])).unwrap_err();
        assert_eq!(err, LogError::SeedSeq { index: 0, seq: 1 });
        let bad = ev(0, EventData::other("x/y", serde_json::json!({"z": -0.0})));
        let err = Session::new(header("a"), Some(vec![bad])).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("seed event at index 0 is not losslessly JSON-serializable"),
            "{err}"
        );
        let no_marker = ev(0, EventData::UserMessage(Message::user_text("hi")));
        let err = Session::new(header("a"), Some(vec![no_marker])).unwrap_err();
        assert!(matches!(err, LogError::SeedInvalid { index: 0, .. }));
    }

    #[test]
    fn append_assigns_seq_and_snapshots_never_grow() {
        let s = Session::new(header("a"), None).unwrap();
        let snap = s.events();
        let e = s.append(EventData::TurnStart { turn: 1 }, None).unwrap();
        assert_eq!(e.seq, 0);
        assert!(snap.is_empty());
        assert_eq!(s.len(), 1);
        let err = s
            .append(EventData::UserMessage(Message::user_text("x")), None)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "session append of `user/message` is invalid: surface events must declare surfaceOp"
        );
        let err = s
            .append(EventData::TurnStart { turn: 2 }, Some(SurfaceMeta::append()))
            .unwrap_err();
        assert!(matches!(err, LogError::Invalid { .. }));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn lossless_check_walks_typed_payloads_and_names_the_path() {
        let s = Session::new(header("a"), None).unwrap();
        let err = s
            .append(EventData::other("x/y", serde_json::json!({"z": [1, -0.0]})), None)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "session append of `x/y` is not losslessly JSON-serializable: -0.0 at `.z[1]` is not lossless"
        );
        // A negative zero nested in a typed payload (a tool result's metadata).
        let err = s
            .append(
                EventData::ToolResult {
                    turn: 1,
                    step: 1,
                    message: Message::tool_result("c".into(), vec![], false),
                    error: None,
                    meta: Some(Box::new(serde_json::json!({"cost": -0.0}))),
                },
                Some(SurfaceMeta::append()),
            )
            .unwrap_err();
        assert_eq!(
            err,
            LogError::NotLossless {
                kind: "tool/result".into(),
                reason: "-0.0 at `.meta.cost` is not lossless".into(),
            }
        );
        assert!(s.is_empty());
        assert_eq!(check_lossless_json(&serde_json::json!({"ok": 0.0})), Ok(()));
        assert_eq!(
            check_lossless_json(&serde_json::json!({"a": [1, {"b": -0.0}]})),
            Err("-0.0 at `.a[1].b` is not lossless".to_owned())
        );
        assert_eq!(
            check_lossless_json(&serde_json::json!(-0.0)),
            Err("-0.0 at `$` is not lossless".to_owned())
        );
    }

    /// A plugin-owned (`Other`) event may not name a type the log reads back as a typed event:
    /// it used to be accepted, and then either its line failed to read back (a payload not of
    /// that type's shape made the whole log unloadable) or it read back as the typed event, so
    /// the folds over the live log (which ignore plugin events) and over the reloaded log
    /// disagreed. Plugin types of their own are still accepted, and seeds are held to the
    /// same rule.
    #[test]
    fn a_plugin_event_may_not_take_a_typed_events_name() {
        let s = Session::new(header("a"), None).unwrap();
        let impostors = [
            (
                EventData::other("turn/start", serde_json::json!({"turn": "one"})),
                None,
            ),
            (
                EventData::other(
                    "turn/end",
                    serde_json::json!({"turn": 1, "reason": {"kind": "completed"}}),
                ),
                None,
            ),
            (
                EventData::other("sandbox/mode", serde_json::json!({"mode": "read-only"})),
                None,
            ),
            (EventData::other("session/end-seed", serde_json::json!({})), None),
            (
                EventData::other("user/message", serde_json::json!({"id": 1})),
                Some(SurfaceMeta::append()),
            ),
        ];
        for (data, surface) in impostors {
            let kind = data.type_name().to_owned();
            let err = s.append(data.clone(), surface.clone()).unwrap_err();
            assert_eq!(
                err,
                LogError::Invalid {
                    kind: kind.clone(),
                    reason: format!("`{kind}` is a typed event type; a plugin event may not use it"),
                }
            );
            let seed = vec![SessionEvent {
                surface,
                ..ev(0, data)
            }];
            assert!(matches!(
                Session::new(header("a"), Some(seed)),
                Err(LogError::SeedInvalid { index: 0, .. })
            ));
        }
        assert!(s.is_empty());
        let event = s
            .append(
                EventData::other("subagent/descriptor", serde_json::json!({"version": 2})),
                None,
            )
            .unwrap();
        let back: SessionEvent = serde_json::from_str(&serde_json::to_string(&*event).unwrap()).unwrap();
        assert_eq!(back, *event);
    }

    /// `depth` nested one-element arrays around `1`.
    fn nested(depth: usize) -> Value {
        (0..depth).fold(serde_json::json!(1), |v, _| serde_json::json!([v]))
    }

    /// An append is accepted only if its JSON line reads back as the same event: a payload
    /// nested deeper than a JSON reader accepts (`serde_json` stops at 128 levels) used to be
    /// appended, and its line then failed to parse ("recursion limit exceeded"), so a store
    /// holding it could not load the log (or dropped it as a torn last line). The deepest
    /// payloads that do read back are still accepted, and a seed is held to the same rule.
    #[test]
    fn an_event_whose_line_could_not_be_read_back_is_refused() {
        let plugin = |depth| EventData::other("x/y", nested(depth));
        let tool_meta = |depth| EventData::ToolResult {
            turn: 1,
            step: 1,
            message: Message::tool_result("c".into(), vec![], false),
            error: None,
            meta: Some(Box::new(nested(depth))),
        };
        // (payload, deepest accepted depth): the envelope and the tool result's `data` object
        // each take one level of the reader's budget.
        let cases: [(&dyn Fn(usize) -> EventData, usize); 2] = [(&plugin, 126), (&tool_meta, 125)];
        for (make, deepest) in cases {
            for depth in deepest - 3..=deepest + 3 {
                let data = make(depth);
                let surface = data.is_surface().then(SurfaceMeta::append);
                let s = Session::new(header("a"), None).unwrap();
                match s.append(data, surface) {
                    Ok(event) => {
                        assert!(depth <= deepest, "depth {depth} was accepted");
                        let line = serde_json::to_string(&*event).unwrap();
                        let back: SessionEvent = serde_json::from_str(&line)
                            .unwrap_or_else(|e| panic!("depth {depth}: the line reads back: {e}"));
                        assert_eq!(back, *event);
                    }
                    Err(err) => {
                        assert!(depth > deepest, "depth {depth} was refused: {err}");
                        assert!(
                            matches!(&err, LogError::NotLossless { reason, .. }
                                if reason.contains("nests deeper than")),
                            "{err}"
                        );
                        assert!(s.is_empty());
                    }
                }
            }
        }
        // Typed nesting counts too: tool-result blocks inside one another (two levels each).
        let results = |levels: usize| {
            let block = (0..levels).fold(crate::ContentBlock::text("x"), |inner, _| {
                crate::ContentBlock::ToolResult {
                    tool_call_id: "c".into(),
                    content: vec![inner],
                    is_error: None,
                }
            });
            EventData::UserMessage(Message::user(vec![block], MessageSource::User))
        };
        let s = Session::new(header("a"), None).unwrap();
        let event = s.append(results(20), Some(SurfaceMeta::append())).unwrap();
        let back: SessionEvent = serde_json::from_str(&serde_json::to_string(&*event).unwrap()).unwrap();
        assert_eq!(back, *event);
        assert!(matches!(
            s.append(results(70), Some(SurfaceMeta::append())),
            Err(LogError::NotLossless { .. })
        ));
        let seed = vec![ev(0, plugin(127))];
        assert!(matches!(
            Session::new(header("a"), Some(seed)),
            Err(LogError::SeedNotLossless { index: 0, .. })
        ));
        // A standalone value is held to the reader's own limit.
        assert_eq!(check_lossless_json(&nested(127)), Ok(()));
        assert!(serde_json::from_str::<Value>(&nested(127).to_string()).is_ok());
        assert!(check_lossless_json(&nested(128)).is_err());
        assert!(serde_json::from_str::<Value>(&nested(128).to_string()).is_err());
    }

    /// The fast path of the lossless check: every event kind that can carry a float (an
    /// embedded `Value`, an open-union map, the request temperature) is still walked when one is
    /// negative zero, and is refused with exactly the full walk's reason; float-free payloads
    /// skip the walk.
    #[test]
    fn lossless_fast_path_never_hides_a_lossy_float() {
        use crate::content::ContentBlock;
        use crate::event::{CallConfig, EpochHeader, InboxSplice, InboxTarget, RequestHeaderReason};
        use crate::message::{MessageSource, PluginForm};
        use crate::model::{FinishReason, StreamChunk, ToolSchema};
        use crate::signal::CancelCause;
        use crate::turn::TurnEndReason;
        use serde_json::{Map, json};

        let bad_map = || -> Map<String, Value> {
            json!({"kind": "x", "deep": [{"n": -0.0}]})
                .as_object()
                .unwrap()
                .clone()
        };
        let bad = || json!({"a": [1, {"b": -0.0}]});
        let msg = |content: Vec<ContentBlock>, source: MessageSource| Message::user(content, source);
        let plain_msg = || Message::user_text("hi");
        let header_with =
            |config: CallConfig, adapter_defaults: Option<Value>, tools: Option<Vec<ToolSchema>>| {
                EventData::RequestHeader {
                    header: Box::new(EpochHeader {
                        config,
                        adapter_defaults,
                        system: None,
                        tools,
                    }),
                    reason: RequestHeaderReason::Initial,
                }
            };
        let config = || CallConfig {
            provider: "p".into(),
            model: "m".into(),
            ..CallConfig::default()
        };
        let user = |m: Message| EventData::UserMessage(m);
        let assistant = |m: Message| EventData::AssistantMessage {
            turn: 1,
            step: 1,
            message: m,
            usage: None,
            interrupted: false,
        };
        let tool_result = |m: Message, meta: Option<Value>| EventData::ToolResult {
            turn: 1,
            step: 1,
            message: m,
            error: None,
            meta: meta.map(Box::new),
        };
        let chunk = |chunk: StreamChunk| EventData::AssistantChunk {
            turn: 1,
            step: 1,
            chunk,
        };
        let turn_end = |reason: TurnEndReason| EventData::TurnEnd { turn: 1, reason };
        let splice = |m: Message| {
            EventData::InboxSpliced(InboxSplice {
                target: InboxTarget::NextTurn,
                start: 0,
                removed_count: None,
                inserted: vec![m],
                outcome: None,
            })
        };
        let model_source = |replay_state| MessageSource::Model {
            provider: "p".into(),
            model: "m".into(),
            replay_state,
        };

        let lossy = vec![
            EventData::other("x/y", bad()),
            EventData::other("x/y", json!(-0.0)),
            tool_result(plain_msg(), Some(bad())),
            tool_result(
                Message::tool_result("c".into(), vec![ContentBlock::Other(bad_map())], false),
                None,
            ),
            header_with(config(), Some(bad()), None),
            header_with(
                config(),
                None,
                Some(vec![ToolSchema {
                    name: "t".into(),
                    description: "d".into(),
                    parameters: bad(),
                }]),
            ),
            user(msg(vec![ContentBlock::Other(bad_map())], MessageSource::User)),
            user(msg(
                vec![ContentBlock::Reasoning {
                    text: "r".into(),
                    extra: bad_map(),
                }],
                MessageSource::User,
            )),
            user(msg(
                vec![ContentBlock::Image { fields: bad_map() }],
                MessageSource::User,
            )),
            user(msg(
                vec![ContentBlock::ToolResult {
                    tool_call_id: "c".into(),
                    content: vec![ContentBlock::Other(bad_map())],
                    is_error: None,
                }],
                MessageSource::User,
            )),
            user(msg(vec![], MessageSource::Other(bad_map()))),
            user(msg(
                vec![],
                MessageSource::Tool {
                    call_id: "c".into(),
                    extra: bad_map(),
                },
            )),
            user(msg(
                vec![],
                MessageSource::Plugin {
                    plugin: "p".into(),
                    form: Some(PluginForm::Other(bad_map())),
                },
            )),
            assistant(msg(
                vec![ContentBlock::text("a")],
                model_source(Some(Box::new(bad()))),
            )),
            chunk(StreamChunk::BlockEnd {
                index: 0,
                block: ContentBlock::Other(bad_map()),
            }),
            chunk(StreamChunk::Finish {
                reason: FinishReason::Stop,
                replay_state: Some(Box::new(bad())),
            }),
            turn_end(TurnEndReason::Other(bad_map())),
            turn_end(TurnEndReason::Aborted {
                reason: CancelCause::Unknown(bad_map()),
            }),
            splice(msg(vec![ContentBlock::Other(bad_map())], MessageSource::User)),
        ];
        for data in lossy {
            assert!(!lossless::plainly_lossless(&data), "{data:?}");
            assert!(!lossless::plain_non_surface(&data), "{data:?}");
            let expected = check_lossless(&data.payload()).expect_err("the walk refuses it");
            let surface = data.is_surface().then(SurfaceMeta::append);
            let s = Session::new(header("a"), None).unwrap();
            let err = s.append(data.clone(), surface).unwrap_err();
            assert_eq!(
                err,
                LogError::NotLossless {
                    kind: data.type_name().to_owned(),
                    reason: expected,
                },
                "{data:?}"
            );
            assert!(s.is_empty());
        }

        // Floats that are fine, and payloads with no float at all, take the fast path.
        let fine = vec![
            EventData::TurnStart { turn: 1 },
            turn_end(TurnEndReason::Completed),
            turn_end(TurnEndReason::Aborted {
                reason: CancelCause::Parent,
            }),
            EventData::other("x/y", json!({"a": [0.0, 1.5, -2, {"b": null}]})),
            user(plain_msg()),
            assistant(msg(
                vec![ContentBlock::text("a")],
                model_source(Some(Box::new(json!({"t": 0.5})))),
            )),
            tool_result(
                Message::tool_result("c".into(), vec![ContentBlock::text("ok")], false),
                Some(json!({"cost": 0.25})),
            ),
            header_with(
                CallConfig {
                    temperature: Some(0.0),
                    ..config()
                },
                Some(json!({"temperature": 1.0})),
                None,
            ),
            chunk(StreamChunk::TextDelta {
                index: 0,
                text: "t".into(),
            }),
            chunk(StreamChunk::BlockEnd {
                index: 0,
                block: ContentBlock::text("t"),
            }),
            chunk(StreamChunk::Finish {
                reason: FinishReason::Stop,
                replay_state: Some(Box::new(json!({"r": 0.5}))),
            }),
            chunk(StreamChunk::Usage {
                usage: crate::model::TokenUsage::default(),
            }),
            splice(plain_msg()),
        ];
        for data in fine {
            assert!(lossless::plainly_lossless(&data), "{data:?}");
            assert_eq!(check_lossless(&data.payload()), Ok(()), "{data:?}");
            // The validation shortcut covers only non-surface events, with the rule's own text.
            if lossless::plain_non_surface(&data) {
                assert!(!data.is_surface(), "{data:?}");
                let s = Session::new(header("a"), None).unwrap();
                assert_eq!(
                    s.append(data.clone(), Some(SurfaceMeta::append())).unwrap_err(),
                    LogError::Invalid {
                        kind: data.type_name().to_owned(),
                        reason: "only surface events may carry surfaceOp or sourceEventSeqs".into(),
                    }
                );
                s.append(data, None).unwrap();
            }
        }
        // A bad temperature is never certain on the fast path (the explicit check names it).
        let hot = header_with(
            CallConfig {
                temperature: Some(f64::NAN),
                ..config()
            },
            None,
            None,
        );
        assert!(!lossless::plainly_lossless(&hot));
    }

    #[test]
    fn shared_snapshots_stay_frozen_and_empty_observer_lists_change_nothing() {
        let s = Session::new(header("a"), None).unwrap();
        s.publish(vec![]);
        assert!(s.is_published());
        let mut snaps = Vec::new();
        for turn in 1..=40 {
            snaps.push(s.events());
            let e = s.append(EventData::TurnStart { turn }, None).unwrap();
            assert_eq!(e.seq, turn - 1);
        }
        for (i, snap) in snaps.iter().enumerate() {
            assert_eq!(snap.len(), i);
        }
        let all = s.events();
        assert_eq!(all.len(), 40);
        assert!(all.iter().enumerate().all(|(i, e)| e.seq == i as u64));
        // A reentrant append is still caught once a real observer joins.
        let re = Arc::new(Reenter(Mutex::new(None)));
        s.add_observer(re.clone());
        s.append(EventData::TurnStart { turn: 41 }, None).unwrap();
        assert_eq!(*re.0.lock(), Some(LogError::Reentrant));
        assert_eq!(s.len(), 41);
    }

    struct Veto;
    impl SessionObserver for Veto {
        fn check(&self, _: &Session, c: &SessionEvent) -> Result<(), String> {
            if c.type_name() == "turn/end" {
                Err("no".into())
            } else {
                Ok(())
            }
        }
    }

    struct Reenter(Mutex<Option<LogError>>);
    impl SessionObserver for Reenter {
        fn committed(&self, s: &Session, _: &Arc<SessionEvent>) {
            *self.0.lock() = s.append(EventData::TurnStart { turn: 9 }, None).err();
        }
    }

    #[test]
    fn published_appends_are_checked_and_reentrancy_is_rejected() {
        let s = Session::new(header("a"), None).unwrap();
        let re = Arc::new(Reenter(Mutex::new(None)));
        s.publish(vec![Arc::new(Veto), re.clone()]);
        s.append(EventData::TurnStart { turn: 1 }, None).unwrap();
        assert_eq!(*re.0.lock(), Some(LogError::Reentrant));
        assert_eq!(s.len(), 1);
        let err = s
            .append(
                EventData::TurnEnd {
                    turn: 1,
                    reason: crate::TurnEndReason::Completed,
                },
                None,
            )
            .unwrap_err();
        assert_eq!(err.to_string(), "session append of `turn/end` was vetoed: no");
        assert_eq!(s.len(), 1);
    }

    /// Panics in the check of events of one type, counts the checks it is asked.
    struct PanicOn(&'static str, std::sync::atomic::AtomicUsize);
    impl SessionObserver for PanicOn {
        fn check(&self, _: &Session, c: &SessionEvent) -> Result<(), String> {
            self.1.fetch_add(1, Ordering::Relaxed);
            assert_ne!(c.type_name(), self.0, "observer bug");
            Ok(())
        }
    }

    /// A panicking check vetoes its append (later observers are not asked) and leaves the
    /// session usable on the same thread: it used to unwind out of the append with the
    /// reentrancy guard still raised, so every later append on that thread failed `Reentrant`.
    #[test]
    fn a_panicking_check_vetoes_the_append_and_the_session_stays_usable() {
        let s = Session::new(header("a"), None).unwrap();
        let after = Arc::new(PanicOn("never", std::sync::atomic::AtomicUsize::new(0)));
        s.publish(vec![
            Arc::new(PanicOn("turn/end", std::sync::atomic::AtomicUsize::new(0))),
            after.clone(),
        ]);
        s.append(EventData::TurnStart { turn: 1 }, None).unwrap();
        let err = s
            .append(
                EventData::TurnEnd {
                    turn: 1,
                    reason: crate::TurnEndReason::Completed,
                },
                None,
            )
            .unwrap_err();
        match &err {
            LogError::Vetoed { kind, reason } => {
                assert_eq!(kind, "turn/end");
                assert!(
                    reason.starts_with("a session observer panicked in its check: ")
                        && reason.contains("observer bug"),
                    "{reason}"
                );
            }
            other => panic!("expected a veto, got {other:?}"),
        }
        assert_eq!(s.len(), 1, "nothing committed");
        assert_eq!(
            after.1.load(Ordering::Relaxed),
            1,
            "the later observer was not asked"
        );
        s.append(EventData::TurnStart { turn: 2 }, None)
            .expect("the session still takes appends on this thread");
        assert_eq!(s.len(), 2);
    }

    /// Holds its first check until released, telling the test when it is inside it.
    struct Gate {
        entered: std::sync::mpsc::SyncSender<()>,
        release: Mutex<std::sync::mpsc::Receiver<()>>,
    }
    impl SessionObserver for Gate {
        fn check(&self, _: &Session, _: &SessionEvent) -> Result<(), String> {
            let _ = self.entered.send(());
            let _ = self.release.lock().recv();
            Ok(())
        }
    }

    /// An unobserved append (the observer list was emptied meanwhile) that arrives while an
    /// observed append is between taking its seq and committing waits for it, instead of taking
    /// the same seq: the log stays numbered by position.
    #[test]
    fn an_unobserved_append_never_takes_a_seq_an_observed_one_holds() {
        let s = Arc::new(Session::new(header("a"), None).unwrap());
        let (entered_tx, entered) = std::sync::mpsc::sync_channel(1);
        let (release, release_rx) = std::sync::mpsc::channel();
        s.publish(vec![Arc::new(Gate {
            entered: entered_tx,
            release: Mutex::new(release_rx),
        })]);
        let observed = std::thread::spawn({
            let s = s.clone();
            move || s.append(EventData::TurnStart { turn: 1 }, None).map(|e| e.seq)
        });
        entered.recv().expect("the observed append is in its check");
        s.publish(Vec::new());
        let done = Arc::new(AtomicBool::new(false));
        let unobserved = std::thread::spawn({
            let (s, done) = (s.clone(), done.clone());
            move || {
                let seq = s.append(EventData::TurnStart { turn: 2 }, None).map(|e| e.seq);
                done.store(true, Ordering::SeqCst);
                seq
            }
        });
        // Give the unobserved append every chance to (wrongly) commit before the observed one.
        for _ in 0..10_000 {
            if done.load(Ordering::SeqCst) {
                break;
            }
            std::thread::yield_now();
        }
        release.send(()).expect("released");
        let first = observed.join().unwrap().expect("observed append");
        let second = unobserved.join().unwrap().expect("unobserved append");
        assert_eq!((first, second), (0, 1));
        let seqs: Vec<u64> = s.events().iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![0, 1]);
    }

    /// `record` appends like `append` (same seq assignment, validation and observers) and
    /// returns the seq; the log then holds the event's only reference.
    #[test]
    fn record_appends_like_append_and_keeps_the_only_reference() {
        let s = Session::new(header("a"), None).unwrap();
        assert_eq!(s.record(EventData::TurnStart { turn: 1 }, None), Ok(0));
        assert_eq!(s.record_at(EventData::TurnStart { turn: 2 }, None, 7), Ok(1));
        let events = s.events();
        assert_eq!((events[1].seq, events[1].time), (1, 7));
        drop(events);
        let re = Arc::new(Reenter(Mutex::new(None)));
        s.publish(vec![Arc::new(Veto), re.clone()]);
        assert_eq!(s.record(EventData::TurnStart { turn: 3 }, None), Ok(2));
        assert_eq!(
            *re.0.lock(),
            Some(LogError::Reentrant),
            "observers were consulted"
        );
        let vetoed = s.record(
            EventData::TurnEnd {
                turn: 3,
                reason: crate::TurnEndReason::Completed,
            },
            None,
        );
        assert!(matches!(vetoed, Err(LogError::Vetoed { .. })));
        let events = s.events();
        assert_eq!(events.len(), 3);
        assert!(
            events.iter().all(|e| Arc::strong_count(e) == 1),
            "the log holds the only references"
        );
    }

    fn replace(start: u64, end: u64) -> Option<SurfaceMeta> {
        Some(SurfaceMeta {
            surface_op: Some(crate::SurfaceOp::Replace { start, end }),
            source_event_seqs: None,
        })
    }

    fn user(text: &str) -> EventData {
        EventData::UserMessage(Message::user_text(text))
    }

    /// A session whose surface is the user messages `a`, `b`, `c` at seqs 1, 2, 3 (seq 0 is a
    /// `turn/start`, which is no surface node), unobserved or published with an observer.
    fn three_messages(observed: bool) -> Session {
        let s = Session::new(header("a"), None).unwrap();
        if observed {
            s.publish(vec![Arc::new(Veto)]);
        }
        s.append(EventData::TurnStart { turn: 1 }, None).unwrap();
        for text in ["a", "b", "c"] {
            s.append(user(text), Some(SurfaceMeta::append())).unwrap();
        }
        s
    }

    fn surface_texts(s: &Session) -> Vec<String> {
        crate::derive_messages(s.events().iter())
            .iter()
            .map(|m| m.text())
            .collect()
    }

    /// spec: SPN §4.2 rule 3 (a `replace {start, end}` is validated by the session: the
    /// invariant checker's S13 relies on it). A range that does not name current surface nodes
    /// in surface order is refused and leaves the log unchanged, on the unobserved and the
    /// published (observed) append paths alike; a valid one commits and the derived history
    /// shows the replacement.
    #[test]
    fn a_surface_replacement_must_name_current_nodes_in_order() {
        for observed in [false, true] {
            let s = three_messages(observed);
            for (start, end, why) in [
                (3, 1, "start after end"),
                (1, 9, "end past the log"),
                (0, 2, "start is not a surface node"),
                (7, 7, "neither exists"),
            ] {
                let err = s.append(user("summary"), replace(start, end)).unwrap_err();
                assert!(
                    matches!(&err, LogError::Invalid { kind, reason } if kind == "user/message"
                        && reason.contains(&format!("replace {{start: {start}, end: {end}}}"))),
                    "{why} (observed: {observed}): {err}"
                );
                assert_eq!(s.len(), 4, "{why}: the log is unchanged");
            }
            let summary = s.append(user("summary of a, b"), replace(1, 2)).unwrap();
            assert_eq!(summary.seq, 4);
            assert_eq!(surface_texts(&s), ["summary of a, b", "c"]);
            // The replaced nodes are gone from the surface: a range naming them is refused, one
            // from the replacement (seq 4) through `c` (seq 3) is in surface order.
            assert!(s.append(user("x"), replace(1, 3)).is_err());
            s.append(user("all"), replace(4, 3)).unwrap();
            assert_eq!(surface_texts(&s), ["all"]);
        }
    }

    /// A seed (and so a stored log, which stores load with `validate_log`) is held to the same
    /// rule, naming the offending event's index; a valid replacement in a seed is kept.
    #[test]
    fn a_seed_replacement_must_name_current_nodes_in_order() {
        let mut seed = vec![
            ev(0, EventData::TurnStart { turn: 1 }),
            SessionEvent {
                surface: Some(SurfaceMeta::append()),
                ..ev(1, user("a"))
            },
            SessionEvent {
                surface: replace(0, 1),
                ..ev(2, user("summary"))
            },
        ];
        let err = Session::new(header("a"), Some(seed.clone())).unwrap_err();
        assert!(
            matches!(&err, LogError::SeedInvalid { index: 2, reason } if reason.contains("replace {start: 0, end: 1}")),
            "{err}"
        );
        assert_eq!(validate_log(&seed), Err(err));
        seed[2].surface = replace(1, 1);
        let s = Session::new(header("a"), Some(seed.clone())).unwrap();
        assert_eq!(surface_texts(&s), ["summary"]);
        assert_eq!(validate_log(&seed), Ok(()));
    }

    fn tool_result(message: Message) -> EventData {
        EventData::ToolResult {
            turn: 1,
            step: 1,
            message,
            error: None,
            meta: None,
        }
    }

    /// spec: S13's premise (inprocess-providers.md, "the session itself validated the
    /// replacement"): a `tool/result` replacement rewrites exactly one current `tool/result`
    /// and changes only its result's content; anything else is refused, the log unchanged.
    #[test]
    fn a_tool_result_replacement_rewrites_one_result_and_only_its_content() {
        let s = three_messages(false);
        let original =
            Message::tool_result("c1".into(), vec![crate::ContentBlock::text("long output")], false);
        let result_seq = s
            .append(tool_result(original.clone()), Some(SurfaceMeta::append()))
            .unwrap()
            .seq;
        let rewritten = |text: &str| {
            let mut message = original.clone();
            message.content =
                Message::tool_result("c1".into(), vec![crate::ContentBlock::text(text)], false).content;
            message
        };
        let mut other_call = rewritten("short");
        other_call.content = Message::tool_result("c2".into(), vec![], false).content;
        let mut other_id = rewritten("short");
        other_id.id = crate::MessageId::generate();
        let refusals = [
            (
                tool_result(rewritten("short")),
                (3, result_seq),
                "exactly one current node",
            ),
            (
                tool_result(rewritten("short")),
                (3, 3),
                "must target a current tool/result",
            ),
            (
                tool_result(other_call),
                (result_seq, result_seq),
                "may change only",
            ),
            (tool_result(other_id), (result_seq, result_seq), "may change only"),
            (
                EventData::ToolResult {
                    turn: 2,
                    step: 1,
                    message: rewritten("short"),
                    error: None,
                    meta: None,
                },
                (result_seq, result_seq),
                "may change only",
            ),
        ];
        for (data, (start, end), why) in refusals {
            let err = s.append(data, replace(start, end)).unwrap_err();
            assert!(
                matches!(&err, LogError::Invalid { kind, reason } if kind == "tool/result" && reason.contains(why)),
                "{why}: {err}"
            );
        }
        assert_eq!(s.len(), 5, "the log is unchanged");
        s.append(tool_result(rewritten("short")), replace(result_seq, result_seq))
            .unwrap();
        let history = crate::derive_messages(s.events().iter());
        assert_eq!(history.len(), 4);
        assert_eq!(history[3], rewritten("short"));
    }

    /// The loggability checks agree with the append at the nesting limit: a tool outcome
    /// (result content, metadata) or inbox insertion passes the check exactly when the event
    /// that logs it is accepted — the pipeline relies on this to turn an unloggable outcome
    /// into an error result instead of a failed turn.
    #[test]
    fn loggability_checks_agree_with_the_append_at_the_nesting_limit() {
        let s = Session::new(header("a"), None).unwrap();
        let block = |depth: usize| {
            let mut map = serde_json::Map::new();
            map.insert("type".into(), "x-deep".into());
            map.insert("v".into(), nested(depth));
            crate::ContentBlock::Other(map)
        };
        let mut accepted = [0usize; 3];
        for depth in 115..=127 {
            let content = vec![block(depth)];
            let checked = check_tool_result_loggable(&content, None).is_ok();
            let logged = s
                .append(
                    tool_result(Message::tool_result("c".into(), content, false)),
                    Some(SurfaceMeta::append()),
                )
                .is_ok();
            assert_eq!(checked, logged, "content nesting {depth}");
            accepted[0] += usize::from(logged);

            let meta = nested(depth);
            let checked = check_tool_result_loggable(&[], Some(&meta)).is_ok();
            let logged = s
                .append(
                    EventData::ToolResult {
                        turn: 1,
                        step: 1,
                        message: Message::tool_result("c".into(), vec![], false),
                        error: None,
                        meta: Some(Box::new(meta)),
                    },
                    Some(SurfaceMeta::append()),
                )
                .is_ok();
            assert_eq!(checked, logged, "meta nesting {depth}");
            accepted[1] += usize::from(logged);

            let messages = vec![Message::user(vec![block(depth)], crate::MessageSource::User)];
            let checked = check_inbox_insert_loggable(&messages).is_ok();
            let logged = s
                .append(
                    EventData::InboxSpliced(crate::event::InboxSplice {
                        target: crate::event::InboxTarget::NextTurn,
                        start: 0,
                        removed_count: None,
                        inserted: messages,
                        outcome: None,
                    }),
                    None,
                )
                .is_ok();
            assert_eq!(checked, logged, "inserted message nesting {depth}");
            accepted[2] += usize::from(logged);
        }
        // Each boundary lies inside the range walked, so both verdicts were seen.
        assert!(accepted.iter().all(|n| (1..13).contains(n)), "{accepted:?}");
        let err = check_tool_result_loggable(&[block(127)], None).unwrap_err();
        assert!(err.starts_with("content: value at `[0].v[0]"), "{err}");
    }

    /// An open-union map flattened into a block or source (a reasoning block's `extra`, an
    /// image's `fields`, a tool source's `extra`) that names a key of the fields around it
    /// (`type`, `text`, `kind`, `callId`) renders that key twice in the log line. Such appends
    /// used to be accepted, and the line then read back as another value: a reasoning block
    /// whose extra fields carried the provider's own `type` came back as an unknown block, a
    /// tool result's source with an extra `kind` as an unknown source. They are refused (on
    /// the fast path's inputs and through the loggability checks alike), the log unchanged;
    /// extra fields of their own still round-trip.
    #[test]
    fn a_flattened_map_that_repeats_a_key_is_refused() {
        use crate::content::ContentBlock;
        use crate::message::MessageSource;
        use serde_json::{Map, json};

        let map = |v: Value| -> Map<String, Value> { v.as_object().unwrap().clone() };
        let reasoning = |extra| ContentBlock::Reasoning {
            text: "thought".into(),
            extra: map(extra),
        };
        let tool_source = |extra| MessageSource::Tool {
            call_id: "c".into(),
            extra: map(extra),
        };
        let user_with =
            |block: ContentBlock| EventData::UserMessage(Message::user(vec![block], MessageSource::User));
        let result_with = |source: MessageSource| EventData::ToolResult {
            turn: 1,
            step: 1,
            message: Message {
                source,
                ..Message::tool_result("c".into(), vec![ContentBlock::text("ok")], false)
            },
            error: None,
            meta: None,
        };
        let s = Session::new(header("a"), None).unwrap();
        let refused = [
            (
                user_with(reasoning(json!({"type": "thinking"}))),
                "type",
                ".content[0]",
            ),
            (
                user_with(reasoning(json!({"text": "other"}))),
                "text",
                ".content[0]",
            ),
            (
                user_with(ContentBlock::Image {
                    fields: map(json!({"type": "png", "data": "x"})),
                }),
                "type",
                ".content[0]",
            ),
            (
                result_with(tool_source(json!({"kind": "mcp"}))),
                "kind",
                ".message.source",
            ),
            (
                result_with(tool_source(json!({"callId": "d"}))),
                "callId",
                ".message.source",
            ),
        ];
        for (data, key, path) in refused {
            let kind = data.type_name().to_owned();
            let line = serde_json::to_string(&data.payload()).unwrap();
            assert_eq!(line.matches(&format!("\"{key}\":")).count(), 2, "{line}");
            let err = s.append(data, Some(SurfaceMeta::append())).unwrap_err();
            assert_eq!(
                err,
                LogError::NotLossless {
                    kind,
                    reason: format!(
                        "object at `{path}` renders key `{key}` twice, which a JSON reader reads back as another value"
                    ),
                }
            );
        }
        assert!(s.is_empty());
        // The loggability checks agree: such content never reaches a failing append.
        assert!(check_tool_result_loggable(&[reasoning(json!({"type": "thinking"}))], None).is_err());
        let inserted = vec![Message::user(
            vec![reasoning(json!({"text": "x"}))],
            MessageSource::User,
        )];
        assert!(check_inbox_insert_loggable(&inserted).is_err());
        let splice = EventData::InboxSpliced(crate::event::InboxSplice {
            target: crate::event::InboxTarget::NextTurn,
            start: 0,
            removed_count: None,
            inserted,
            outcome: None,
        });
        assert!(matches!(
            s.append(splice, None),
            Err(LogError::NotLossless { .. })
        ));
        assert!(s.is_empty());
        // Extra fields of their own are kept, and read back as written.
        for data in [
            user_with(reasoning(json!({"signature": "sig", "n": 1.5}))),
            result_with(tool_source(json!({"server": "mcp"}))),
        ] {
            let event = s.append(data, Some(SurfaceMeta::append())).unwrap();
            let back: SessionEvent = serde_json::from_str(&serde_json::to_string(&*event).unwrap()).unwrap();
            assert_eq!(back, *event);
        }
        assert!(check_tool_result_loggable(&[reasoning(json!({"signature": "sig"}))], None).is_ok());
    }
}
