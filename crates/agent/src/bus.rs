//! A scoped, synchronous event bus with contained listeners.
//!
//! Listeners are registered globally or for one agent's scope and called **synchronously, in
//! registration order**, on the emitting thread. Every call is contained: a listener that returns
//! an error or panics is logged with `tracing::warn!` and never prevents the next listener from
//! running. Scoped listeners hear only events whose [carrier](Carried::carrier) is their agent.
//! Registration returns a [`Registration`] guard that removes the listener when dropped.
//!
//! Listeners that need async work should spawn it (on a task tracker they own) rather than block.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::ids::SessionId;
use crate::registration::Registration;

/// A boxed error returned by listeners and hooks.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An event that may be keyed to one agent (its *carrier*).
pub trait Carried {
    /// The agent this event is dispatched for, or `None` for unscoped events.
    fn carrier(&self) -> Option<&SessionId>;
}

type Listener<E> = Arc<dyn Fn(&E) -> Result<(), BoxError> + Send + Sync>;

struct Entry<E> {
    id: u64,
    scope: Option<SessionId>,
    listener: Listener<E>,
}

struct Inner<E> {
    next: AtomicU64,
    entries: RwLock<Arc<Vec<Entry<E>>>>,
    /// The length of `entries`, written under its write lock: an emission to a bus with no
    /// listeners returns after one load, without taking a snapshot.
    len: AtomicUsize,
}

/// A listener failed during a strict emission ([`EventBus::try_emit`]).
#[derive(Debug, thiserror::Error)]
#[error("event listener failed: {message}")]
pub struct ListenerFailed {
    /// The listener's error text (or `<unrenderable thrown value>` for a panic without a string
    /// payload).
    pub message: String,
}

/// A multi-listener event bus for events of type `E`. Cheap to clone (shared).
pub struct EventBus<E> {
    inner: Arc<Inner<E>>,
}

impl<E> Clone for EventBus<E> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<E: 'static> Default for EventBus<E> {
    fn default() -> Self {
        Self::new()
    }
}

/// Renders a panic payload for logs: its string, or `<unrenderable thrown value>`.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "<unrenderable thrown value>".to_owned()
    }
}

impl<E: 'static> EventBus<E> {
    /// An empty bus.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                next: AtomicU64::new(0),
                entries: RwLock::new(Arc::new(Vec::new())),
                len: AtomicUsize::new(0),
            }),
        }
    }

    /// Registers a listener for every event (unscoped).
    pub fn on(&self, listener: impl Fn(&E) -> Result<(), BoxError> + Send + Sync + 'static) -> Registration {
        self.add(None, Arc::new(listener))
    }

    /// Registers a listener that hears only events carried by agent `scope`.
    pub fn on_scoped(
        &self,
        scope: SessionId,
        listener: impl Fn(&E) -> Result<(), BoxError> + Send + Sync + 'static,
    ) -> Registration {
        self.add(Some(scope), Arc::new(listener))
    }

    fn add(&self, scope: Option<SessionId>, listener: Listener<E>) -> Registration {
        let id = self.inner.next.fetch_add(1, Ordering::Relaxed);
        {
            let mut entries = self.inner.entries.write();
            let mut next: Vec<Entry<E>> = entries
                .iter()
                .map(|e| Entry {
                    id: e.id,
                    scope: e.scope.clone(),
                    listener: e.listener.clone(),
                })
                .collect();
            next.push(Entry { id, scope, listener });
            self.inner.len.store(next.len(), Ordering::Release);
            *entries = Arc::new(next);
        }
        let weak = Arc::downgrade(&self.inner);
        Registration::new(move || {
            if let Some(inner) = weak.upgrade() {
                let previous = {
                    let mut entries = inner.entries.write();
                    let next: Vec<Entry<E>> = entries
                        .iter()
                        .filter(|e| e.id != id)
                        .map(|e| Entry {
                            id: e.id,
                            scope: e.scope.clone(),
                            listener: e.listener.clone(),
                        })
                        .collect();
                    inner.len.store(next.len(), Ordering::Release);
                    std::mem::replace(&mut *entries, Arc::new(next))
                };
                // The removed listener is dropped (with whatever it owns, possibly the guard of
                // another listener of this bus) only after the lock is released.
                drop(previous);
            }
        })
    }

    /// The number of registered listeners (for tests asserting registries end empty).
    pub fn listener_count(&self) -> usize {
        self.inner.entries.read().len()
    }

    /// Whether any listener is registered. An emitter may skip building an event nobody would
    /// hear (an emission on a bus without listeners delivers nothing).
    #[inline]
    pub fn has_listeners(&self) -> bool {
        !self.is_silent()
    }

    /// The listener set as of now (an `Arc` of the immutable list: registrations replace it).
    fn snapshot(&self) -> Arc<Vec<Entry<E>>> {
        self.inner.entries.read().clone()
    }

    /// Whether the bus has no listener at all (then an emission is a no-op).
    #[inline]
    fn is_silent(&self) -> bool {
        self.inner.len.load(Ordering::Acquire) == 0
    }

    fn matches(entry: &Entry<E>, carrier: Option<&SessionId>) -> bool {
        entry.scope.is_none() || entry.scope.as_ref() == carrier
    }

    fn call(listener: &Listener<E>, event: &E) -> Result<(), String> {
        match catch_unwind(AssertUnwindSafe(|| listener(event))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(payload) => Err(panic_message(&*payload)),
        }
    }

    /// Delivers `event` to every matching listener in registration order; each failure is
    /// contained and logged. The listener set is snapshotted first: listeners added or removed
    /// during delivery take effect from the next emission.
    #[inline]
    pub fn emit_for(&self, carrier: Option<&SessionId>, event: &E) {
        if !self.is_silent() {
            self.deliver(carrier, event);
        }
    }

    /// [`EventBus::emit_for`] once the bus has listeners.
    #[inline(never)]
    fn deliver(&self, carrier: Option<&SessionId>, event: &E) {
        let entries = self.snapshot();
        for e in entries.iter().filter(|e| Self::matches(e, carrier)) {
            if let Err(message) = Self::call(&e.listener, event) {
                tracing::warn!(%message, "event listener failed; delivery continues");
            }
        }
    }

    /// Delivers `event` in registration order and stops at the first failure, returning it
    /// (for events whose listeners may veto, such as provider registration).
    pub fn try_emit_for(&self, carrier: Option<&SessionId>, event: &E) -> Result<(), ListenerFailed> {
        if self.is_silent() {
            return Ok(());
        }
        let entries = self.snapshot();
        for e in entries.iter().filter(|e| Self::matches(e, carrier)) {
            Self::call(&e.listener, event).map_err(|message| ListenerFailed { message })?;
        }
        Ok(())
    }

    /// Like [`try_emit_for`](Self::try_emit_for), for an event a listener may veto whose
    /// effects must then be undone: at the first failure, `undo()` is delivered (contained, in
    /// reverse order) to exactly the listeners that had received `event`, and the failure is
    /// returned. Listeners after the failing one hear neither.
    pub fn try_emit_for_or_undo(
        &self,
        carrier: Option<&SessionId>,
        event: &E,
        undo: impl FnOnce() -> E,
    ) -> Result<(), ListenerFailed> {
        if self.is_silent() {
            return Ok(());
        }
        let entries = self.snapshot();
        let matching: Vec<&Entry<E>> = entries.iter().filter(|e| Self::matches(e, carrier)).collect();
        for (delivered, e) in matching.iter().enumerate() {
            if let Err(message) = Self::call(&e.listener, event) {
                if delivered > 0 {
                    let undo = undo();
                    for told in matching[..delivered].iter().rev() {
                        if let Err(message) = Self::call(&told.listener, &undo) {
                            tracing::warn!(%message, "event listener failed on an undo; delivery continues");
                        }
                    }
                }
                return Err(ListenerFailed { message });
            }
        }
        Ok(())
    }
}

impl<E: Carried + 'static> EventBus<E> {
    /// Delivers `event` to global listeners and to listeners scoped to its carrier. Contained.
    pub fn emit(&self, event: &E) {
        self.emit_for(event.carrier(), event);
    }

    /// Like [`EventBus::emit`] but stops at, and returns, the first failure.
    pub fn try_emit(&self, event: &E) -> Result<(), ListenerFailed> {
        self.try_emit_for(event.carrier(), event)
    }

    /// [`try_emit_for_or_undo`](Self::try_emit_for_or_undo) for the event's own carrier.
    pub fn try_emit_or_undo(&self, event: &E, undo: impl FnOnce() -> E) -> Result<(), ListenerFailed> {
        self.try_emit_for_or_undo(event.carrier(), event, undo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    struct Ev(Option<SessionId>, u32);
    impl Carried for Ev {
        fn carrier(&self) -> Option<&SessionId> {
            self.0.as_ref()
        }
    }

    #[test]
    fn delivery_is_ordered_scoped_and_contained() {
        let bus = EventBus::<Ev>::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s1 = seen.clone();
        let _a = bus.on(move |e| {
            s1.lock().push(("global", e.1));
            Ok(())
        });
        let _b = bus.on(|_| panic!("boom"));
        let _c = bus.on(|_| Err("nope".into()));
        let s2 = seen.clone();
        let _d = bus.on_scoped("x".into(), move |e| {
            s2.lock().push(("x", e.1));
            Ok(())
        });
        bus.emit(&Ev(Some("x".into()), 1));
        bus.emit(&Ev(Some("y".into()), 2));
        bus.emit(&Ev(None, 3));
        assert_eq!(
            *seen.lock(),
            vec![("global", 1), ("x", 1), ("global", 2), ("global", 3)]
        );
        let err = bus.try_emit(&Ev(None, 4)).unwrap_err();
        assert_eq!(err.message, "boom");
    }

    #[test]
    fn dropping_a_guard_removes_the_listener() {
        let bus = EventBus::<Ev>::new();
        let g = bus.on(|_| Ok(()));
        assert_eq!(bus.listener_count(), 1);
        drop(g);
        assert_eq!(bus.listener_count(), 0);
    }

    #[test]
    fn listeners_are_heard_across_empty_and_non_empty_spells() {
        let bus = EventBus::<Ev>::new();
        bus.emit(&Ev(None, 0));
        assert!(bus.try_emit(&Ev(None, 0)).is_ok());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s1 = seen.clone();
        let g = bus.on(move |e| {
            s1.lock().push(e.1);
            Ok(())
        });
        bus.emit(&Ev(None, 1));
        drop(g);
        bus.emit(&Ev(None, 2));
        let clone = bus.clone();
        let s2 = seen.clone();
        let _g = clone.on(move |e| {
            s2.lock().push(e.1 * 10);
            Ok(())
        });
        bus.emit(&Ev(None, 3));
        assert!(bus.try_emit(&Ev(None, 4)).is_ok());
        assert_eq!(*seen.lock(), vec![1, 30, 40]);
    }

    #[test]
    fn unrenderable_panics_are_named() {
        let bus = EventBus::<Ev>::new();
        let _g = bus.on(|_| std::panic::panic_any(42u8));
        assert_eq!(
            bus.try_emit(&Ev(None, 1)).unwrap_err().message,
            "<unrenderable thrown value>"
        );
    }

    /// Runs `f` on another thread and fails (instead of hanging) if it does not finish: a
    /// deadlocked `f` is left blocked on its thread.
    fn finishes(f: impl FnOnce() + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = done.send(());
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("finished: no deadlock");
    }

    /// Removing a listener drops it, and with it whatever it owns, after the bus's lock is
    /// released: a listener owning the guard of another listener of the same bus (one agent's
    /// registrations tied together) used to be dropped under the write lock, whose second
    /// removal then deadlocked on it.
    #[test]
    fn removing_a_listener_that_owns_another_registration_does_not_deadlock() {
        let bus = EventBus::<Ev>::new();
        let companion = bus.on(|_| Ok(()));
        let owner = bus.on(move |_| {
            let _keep = &companion;
            Ok(())
        });
        assert_eq!(bus.listener_count(), 2);
        finishes(move || drop(owner));
        assert_eq!(bus.listener_count(), 0);
    }

    /// A vetoed emission is undone for exactly the listeners that heard it, latest first;
    /// listeners after the veto hear nothing, and a failing undo does not stop the others.
    #[test]
    fn a_vetoed_emission_is_undone_for_the_listeners_that_heard_it() {
        let bus: EventBus<Ev> = EventBus::new();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let listener = |name: &'static str, veto: Option<u32>, fail_undo: bool| {
            let heard = heard.clone();
            move |e: &Ev| {
                heard.lock().push((name, e.1));
                if Some(e.1) == veto || (fail_undo && e.1 == 0) {
                    Err("no".into())
                } else {
                    Ok(())
                }
            }
        };
        let _a = bus.on(listener("a", None, false));
        let _b = bus.on(listener("b", None, true));
        let _c = bus.on(listener("c", Some(7), false));
        let _d = bus.on(listener("d", None, false));
        let failure = bus.try_emit_or_undo(&Ev(None, 7), || Ev(None, 0)).unwrap_err();
        assert_eq!(failure.message, "no");
        assert_eq!(
            *heard.lock(),
            vec![("a", 7), ("b", 7), ("c", 7), ("b", 0), ("a", 0)]
        );
        heard.lock().clear();
        bus.try_emit_or_undo(&Ev(None, 8), || unreachable!("nothing to undo"))
            .expect("delivered");
        assert_eq!(heard.lock().len(), 4);
    }
}
