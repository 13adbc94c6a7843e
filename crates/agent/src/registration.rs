//! Registration guards and scopes.
//!
//! Every registration (event listener, tool, restriction, guard, prompt section, provider, …)
//! returns a [`Registration`]: dropping or [disposing](Registration::dispose) it undoes the
//! registration, exactly once. A [`Scope`] owns the guards adopted into it and drops them in
//! reverse order when it is disposed; registering through a disposed scope fails with
//! [`ScopeInactive`].

use std::fmt;

use parking_lot::Mutex;

use crate::ids::SessionId;

type Undo = Box<dyn FnOnce() + Send + Sync>;

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
            undo: Some(Box::new(undo)),
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

    fn run(&mut self) {
        if let Some(undo) = self.undo.take() {
            undo();
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
        let spilled = std::mem::take(&mut self.spilled);
        let inline = self.inline[..self.len]
            .iter_mut()
            .rev()
            .map(|slot| std::mem::replace(slot, Registration::noop()));
        for g in spilled.into_iter().rev().chain(inline) {
            if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(g))) {
                first_panic.get_or_insert(payload);
            }
        }
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
