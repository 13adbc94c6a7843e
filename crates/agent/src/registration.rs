//! Registration guards and scopes.
//!
//! Every registration (event listener, tool, restriction, guard, prompt section, provider, …)
//! returns a [`Registration`]: dropping or [disposing](Registration::dispose) it undoes the
//! registration, exactly once. A [`Scope`] owns the guards adopted into it and drops them in
//! reverse order when it is disposed; registering through a disposed scope fails with
//! [`ScopeInactive`].

use std::fmt;
use std::sync::Weak;

use parking_lot::Mutex;

use crate::ids::SessionId;

/// A registry whose entries are removed by key: the undo of a [`Registration::keyed`] guard.
///
/// The same rules as for any undo apply: [`unregister`](Unregister::unregister) must be cheap,
/// must not block, and runs on the dropping thread.
pub trait Unregister: Send + Sync {
    /// Removes the entry `key` of `scope`'s layer (the layer it was registered in). Called at
    /// most once per guard; an entry that is gone already is a no-op.
    fn unregister(&self, scope: Option<SessionId>, key: u64);
}

/// What a guard undoes: a boxed closure, or a keyed removal from a registry held weakly (which
/// needs no allocation of its own).
enum Undo {
    Closure(Box<dyn FnOnce() + Send + Sync>),
    Keyed {
        from: Weak<dyn Unregister>,
        scope: Option<SessionId>,
        key: u64,
    },
}

impl Undo {
    fn run(self) {
        match self {
            Self::Closure(undo) => undo(),
            Self::Keyed { from, scope, key } => {
                if let Some(from) = from.upgrade() {
                    from.unregister(scope, key);
                }
            }
        }
    }
}

/// A guard that undoes one registration when dropped or disposed.
///
/// The undo runs at most once. Undo closures must be cheap and must not block; they run on the
/// dropping thread.
#[must_use = "dropping a Registration undoes it immediately"]
pub struct Registration {
    undo: Option<Undo>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("active", &self.undo.is_some())
            .finish()
    }
}

impl Registration {
    /// A guard that runs `undo` when dropped.
    pub fn new(undo: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self {
            undo: Some(Undo::Closure(Box::new(undo))),
        }
    }

    /// A guard that removes entry `key` of `scope`'s layer from `from` when dropped (unless
    /// `from` is gone by then): the same as a guard whose closure upgrades `from` and calls
    /// [`Unregister::unregister`], without allocating the closure.
    pub fn keyed(from: Weak<dyn Unregister>, scope: Option<SessionId>, key: u64) -> Self {
        Self {
            undo: Some(Undo::Keyed { from, scope, key }),
        }
    }

    /// A guard with nothing to undo.
    pub const fn noop() -> Self {
        Self { undo: None }
    }

    /// Undoes the registration now (same as dropping).
    pub fn dispose(mut self) {
        self.run();
    }

    /// Combines several guards into one; they are undone in reverse order (all of them, even
    /// when one panics: the first panic propagates once every undo has run).
    pub fn all(guards: Vec<Registration>) -> Self {
        Self::new(move || drop_in_reverse(guards))
    }

    #[inline]
    fn run(&mut self) {
        if let Some(undo) = self.undo.take() {
            undo.run();
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.run();
    }
}

/// Undoes `guards` in reverse order. A panicking undo does not stop the others: each is
/// contained, and once all have run the first panic is resumed (a second one is dropped, where
/// it would abort the process if it unwound during the first).
fn drop_in_reverse(mut guards: Vec<Registration>) {
    let mut first_panic = None;
    while let Some(g) = guards.pop() {
        if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(g))) {
            first_panic.get_or_insert(payload);
        }
    }
    if let Some(payload) = first_panic {
        std::panic::resume_unwind(payload);
    }
}

/// Registering through a disposed scope.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("scope of agent \"{0}\" is inactive: it was disposed")]
pub struct ScopeInactive(pub SessionId);

/// The registration layer owned by one agent.
///
/// A scope is keyed by its agent's id and may name a parent scope (a subagent child's scope is
/// flat: it has none). It owns every guard [adopted](Scope::adopt) into it and drops them in
/// reverse order on [`Scope::dispose`]. After disposal, adopting fails with [`ScopeInactive`] and
/// the offered guard is dropped (undone) at once, so nothing registered through a dead scope
/// survives.
pub struct Scope {
    key: SessionId,
    parent: Option<SessionId>,
    /// `None` once disposed.
    guards: Mutex<Option<Guards>>,
}

/// How many guards a scope keeps in place before it allocates (an agent's scope typically
/// holds a few).
const INLINE_GUARDS: usize = 4;

/// A scope's guards in adoption order: the first [`INLINE_GUARDS`] in place, the rest in
/// `spilled`.
struct Guards {
    inline: [Registration; INLINE_GUARDS],
    /// How many of `inline` are adopted guards (the rest are no-ops).
    len: usize,
    spilled: Vec<Registration>,
}

impl Guards {
    fn new() -> Self {
        Self {
            inline: [const { Registration::noop() }; INLINE_GUARDS],
            len: 0,
            spilled: Vec::new(),
        }
    }

    fn push(&mut self, guard: Registration) {
        match self.inline.get_mut(self.len) {
            Some(slot) => {
                *slot = guard;
                self.len += 1;
            }
            None => self.spilled.push(guard),
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Undoes every guard, the last adopted first (see [`drop_in_reverse`]).
    fn undo(mut self) {
        let mut first_panic = None;
        // Each undo runs in place (no guard is moved out and dropped), contained.
        let mut undo = |guard: &mut Registration| {
            if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| guard.run())) {
                first_panic.get_or_insert(payload);
            }
        };
        for guard in self.spilled.iter_mut().rev() {
            undo(guard);
        }
        for guard in self.inline[..self.len].iter_mut().rev() {
            undo(guard);
        }
        // Every guard is a no-op now: dropping them undoes nothing more.
        drop(self);
        if let Some(payload) = first_panic {
            std::panic::resume_unwind(payload);
        }
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("key", &self.key)
            .field("parent", &self.parent)
            .field("active", &self.is_active())
            .finish()
    }
}

impl Scope {
    /// A fresh, active scope for agent `key`, optionally parented to another scope key.
    pub fn new(key: SessionId, parent: Option<SessionId>) -> Self {
        Self {
            key,
            parent,
            guards: Mutex::new(Some(Guards::new())),
        }
    }

    /// The agent this scope belongs to.
    pub fn key(&self) -> &SessionId {
        &self.key
    }

    /// The parent scope key, if any.
    pub fn parent(&self) -> Option<&SessionId> {
        self.parent.as_ref()
    }

    /// Whether the scope is still active.
    pub fn is_active(&self) -> bool {
        self.guards.lock().is_some()
    }

    /// Fails with [`ScopeInactive`] once disposed.
    pub fn ensure_active(&self) -> Result<(), ScopeInactive> {
        if self.is_active() {
            Ok(())
        } else {
            Err(ScopeInactive(self.key.clone()))
        }
    }

    /// Hands `guard` to the scope, which keeps it until disposal. On a disposed scope the guard is
    /// undone immediately and [`ScopeInactive`] is returned.
    pub fn adopt(&self, guard: Registration) -> Result<(), ScopeInactive> {
        let mut slot = self.guards.lock();
        match slot.as_mut() {
            Some(guards) => {
                guards.push(guard);
                Ok(())
            }
            None => {
                drop(slot);
                drop(guard);
                Err(ScopeInactive(self.key.clone()))
            }
        }
    }

    /// Disposes the scope: undoes every adopted guard in reverse order. Idempotent.
    ///
    /// # Panics
    /// A panicking undo does not stop the others: every guard is undone, in order, and then the
    /// first panic propagates (the scope is disposed by then).
    pub fn dispose(&self) {
        let guards = {
            let mut slot = self.guards.lock();
            match &*slot {
                None => return,
                // Nothing to undo: disposed in place.
                Some(guards) if guards.is_empty() => {
                    *slot = None;
                    return;
                }
                Some(_) => slot.take(),
            }
        };
        if let Some(guards) = guards {
            guards.undo();
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        self.dispose();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A keyed guard removes its entry once, from the layer it names, and does nothing once
    /// the registry is gone.
    #[test]
    fn keyed_guards_unregister_once() {
        type Log = Mutex<Vec<(Option<SessionId>, u64)>>;
        struct Registry(Log);
        impl Unregister for Registry {
            fn unregister(&self, scope: Option<SessionId>, key: u64) {
                self.0.lock().push((scope, key));
            }
        }
        let registry = Arc::new(Registry(Mutex::new(Vec::new())));
        let weak = || Arc::downgrade(&registry) as std::sync::Weak<dyn Unregister>;
        let scope = Scope::new("a".into(), None);
        scope
            .adopt(Registration::keyed(weak(), Some("a".into()), 1))
            .unwrap();
        Registration::keyed(weak(), None, 2).dispose();
        scope.dispose();
        scope.dispose();
        assert_eq!(
            *registry.0.lock(),
            vec![(None, 2), (Some(SessionId::from("a")), 1)]
        );
        let orphan = Registration::keyed(weak(), None, 3);
        drop(registry);
        drop(orphan);
    }

    #[test]
    fn guards_undo_once_and_scopes_unwind_in_reverse() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let scope = Scope::new("a".into(), None);
        for i in 0..3 {
            let log = log.clone();
            scope
                .adopt(Registration::new(move || log.lock().push(i)))
                .unwrap();
        }
        scope.dispose();
        scope.dispose();
        assert_eq!(*log.lock(), vec![2, 1, 0]);
        let log2 = log.clone();
        let err = scope
            .adopt(Registration::new(move || log2.lock().push(9)))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "scope of agent \"a\" is inactive: it was disposed"
        );
        assert_eq!(*log.lock(), vec![2, 1, 0, 9]);
    }

    /// A panicking undo does not stop the scope's other undos: they all run, in reverse order,
    /// and the first panic propagates once they have (a second panic does not abort).
    #[test]
    fn a_panicking_undo_does_not_stop_the_others() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let scope = Scope::new("a".into(), None);
        for i in 0..5 {
            let log = log.clone();
            scope
                .adopt(Registration::new(move || {
                    log.lock().push(i);
                    if i % 2 == 1 {
                        panic!("undo {i} exploded");
                    }
                }))
                .unwrap();
        }
        let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scope.dispose()))
            .expect_err("the first panic propagates");
        assert_eq!(crate::bus::panic_message(&*payload), "undo 3 exploded");
        assert_eq!(*log.lock(), vec![4, 3, 2, 1, 0]);
        assert!(!scope.is_active());
    }
}
