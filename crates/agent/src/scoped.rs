//! [`ScopedEntries`]: registrations that are global or scoped to one agent, kept per agent.
//!
//! Hooks, prompt sections and runtime contexts are registered globally or for one agent, and
//! looked up for one agent at every step. Kept in one flat list, each lookup and each removal
//! walked every other agent's registrations, so a parent fanning out to thousands of children
//! paid for all of them at every child's step. Here an agent's own entries are found by a hash
//! probe and removed without touching anyone else's.

use std::slice;

use crate::ids::SessionId;

/// Entries registered globally or for one agent, each under an id that follows registration
/// order (ascending, never reused). Not synchronized: the owner wraps it in its lock.
pub struct ScopedEntries<T> {
    next: u64,
    global: Vec<(u64, T)>,
    scoped: foldhash::HashMap<SessionId, OneOrMany<(u64, T)>>,
}

/// An agent's own entries: most agents have one, which needs no vector.
enum OneOrMany<E> {
    One(E),
    Many(Vec<E>),
}

impl<E> OneOrMany<E> {
    fn as_slice(&self) -> &[E] {
        match self {
            Self::One(e) => slice::from_ref(e),
            Self::Many(v) => v,
        }
    }
}

impl<T> Default for ScopedEntries<T> {
    fn default() -> Self {
        Self {
            next: 0,
            global: Vec::new(),
            scoped: foldhash::HashMap::default(),
        }
    }
}

impl<T> std::fmt::Debug for ScopedEntries<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopedEntries")
            .field("global", &self.global.len())
            .field("scoped", &self.scoped_len())
            .finish()
    }
}

impl<T> ScopedEntries<T> {
    /// No entries.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `item`, global when `scope` is `None`, and returns its id.
    pub fn push(&mut self, scope: Option<&SessionId>, item: T) -> u64 {
        let id = self.next;
        self.next += 1;
        match scope {
            None => self.global.push((id, item)),
            Some(scope) => match self.scoped.get_mut(scope) {
                None => {
                    self.scoped.insert(scope.clone(), OneOrMany::One((id, item)));
                }
                Some(OneOrMany::Many(v)) => v.push((id, item)),
                Some(one) => {
                    let OneOrMany::One(first) =
                        std::mem::replace(one, OneOrMany::Many(Vec::with_capacity(2)))
                    else {
                        unreachable!("matched as one just above")
                    };
                    if let OneOrMany::Many(v) = one {
                        v.extend([first, (id, item)]);
                    }
                }
            },
        }
        id
    }

    /// Removes the entry `id` from `scope`'s layer (where it was pushed), keeping the others in
    /// order; an agent left with no entry is forgotten. `None` when there is no such entry.
    pub fn remove(&mut self, scope: Option<&SessionId>, id: u64) -> Option<T> {
        let Some(scope) = scope else {
            let index = self.global.iter().position(|(i, _)| *i == id)?;
            return Some(self.global.remove(index).1);
        };
        if self.scoped.is_empty() {
            return None;
        }
        // One hash probe of the agent's id, whether its entries are then kept or forgotten.
        let std::collections::hash_map::Entry::Occupied(mut own) = self.scoped.entry(scope.clone()) else {
            return None;
        };
        match own.get_mut() {
            OneOrMany::One((i, _)) if *i == id => match own.remove() {
                OneOrMany::One((_, item)) => Some(item),
                OneOrMany::Many(_) => unreachable!("matched as this one entry just above"),
            },
            OneOrMany::One(_) => None,
            OneOrMany::Many(v) => {
                let index = v.iter().position(|(i, _)| *i == id)?;
                let (_, item) = v.remove(index);
                if v.is_empty() {
                    own.remove();
                }
                Some(item)
            }
        }
    }

    /// The global entries, in registration order.
    pub fn global(&self) -> &[(u64, T)] {
        &self.global
    }

    /// `agent`'s own entries, in registration order (none for `None`).
    pub fn own(&self, agent: Option<&SessionId>) -> &[(u64, T)] {
        agent
            .and_then(|a| self.scoped.get(a))
            .map_or(&[], OneOrMany::as_slice)
    }

    /// The entries that apply to `agent` — the global ones and its own — merged into
    /// registration order, each with whether it is the agent's own.
    pub fn visible(&self, agent: Option<&SessionId>) -> impl Iterator<Item = (u64, &T, bool)> {
        let (mut global, mut own) = (self.global.iter().peekable(), self.own(agent).iter().peekable());
        std::iter::from_fn(move || {
            let take_own = match (global.peek(), own.peek()) {
                (Some((g, _)), Some((o, _))) => o < g,
                (None, Some(_)) => true,
                (_, None) => false,
            };
            if take_own {
                own.next().map(|(id, item)| (*id, item, true))
            } else {
                global.next().map(|(id, item)| (*id, item, false))
            }
        })
    }

    /// The number of entries, all layers.
    pub fn len(&self) -> usize {
        self.global.len() + self.scoped_len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of agent-scoped entries (all agents).
    pub fn scoped_len(&self) -> usize {
        self.scoped.values().map(|own| own.as_slice().len()).sum()
    }

    /// The number of agents with entries of their own.
    pub fn scoped_agents(&self) -> usize {
        self.scoped.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Global and scoped entries interleave in registration order for their agent only;
    /// removing one keeps the others' order and forgets an agent left with none.
    #[test]
    fn entries_apply_to_their_agent_in_registration_order() {
        let mut e = ScopedEntries::new();
        let (a, b) = (SessionId::from("a"), SessionId::from("b"));
        let g1 = e.push(None, "g1");
        let a1 = e.push(Some(&a), "a1");
        let b1 = e.push(Some(&b), "b1");
        let g2 = e.push(None, "g2");
        let a2 = e.push(Some(&a), "a2");
        let a3 = e.push(Some(&a), "a3");
        let names = |e: &ScopedEntries<&str>, agent: Option<&SessionId>| -> Vec<String> {
            e.visible(agent).map(|(_, name, _)| name.to_string()).collect()
        };
        assert_eq!(names(&e, Some(&a)), ["g1", "a1", "g2", "a2", "a3"]);
        assert_eq!(names(&e, Some(&b)), ["g1", "b1", "g2"]);
        assert_eq!(names(&e, Some(&SessionId::from("c"))), ["g1", "g2"]);
        assert_eq!(names(&e, None), ["g1", "g2"]);
        let own: Vec<bool> = e.visible(Some(&b)).map(|(_, _, own)| own).collect();
        assert_eq!(own, [false, true, false]);
        assert_eq!((e.len(), e.scoped_len(), e.scoped_agents()), (6, 4, 2));

        assert_eq!(e.remove(Some(&a), a2), Some("a2"));
        assert_eq!(e.remove(Some(&a), a2), None, "removed once");
        assert_eq!(e.remove(Some(&b), a1), None, "not in that layer");
        assert_eq!(e.remove(Some(&SessionId::from("c")), a1), None, "no such agent");
        assert_eq!(e.scoped_agents(), 2, "a miss registers no agent");
        assert_eq!(names(&e, Some(&a)), ["g1", "a1", "g2", "a3"]);
        assert_eq!(e.remove(None, g1), Some("g1"));
        assert_eq!(e.remove(Some(&b), b1), Some("b1"));
        assert_eq!(e.scoped_agents(), 1, "b, left with nothing, is forgotten");
        assert_eq!(e.remove(Some(&a), a1), Some("a1"));
        assert_eq!(e.remove(Some(&a), a3), Some("a3"));
        assert_eq!(e.scoped_agents(), 0);
        assert_eq!(names(&e, Some(&a)), ["g2"]);
        assert_eq!(e.remove(None, g2), Some("g2"));
        assert!(e.is_empty());
        // Ids are never reused.
        assert!(e.push(Some(&a), "later") > a3);
    }
}
