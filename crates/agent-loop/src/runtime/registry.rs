//! [`Registry`]: live entries keyed by session id, kept in creation order.
//!
//! The runtime's agent registry and the session store hold one entry per live id. With many
//! agents alive at once (a parent fanning out to thousands of children) a list searched and
//! compacted on every creation, lookup and disposal made each of those linear in the number of
//! live agents, and a fan-out quadratic. Here lookup by id is a hash probe, and insertion and
//! removal are logarithmic; iteration still follows creation order (listing, and shutdown in
//! reverse).

use std::collections::BTreeMap;

use agent::SessionId;

/// Entries keyed by a unique [`SessionId`], each with a serial number that orders them by
/// insertion. Not synchronized: the owner wraps it in its lock.
pub(crate) struct Registry<V> {
    /// Id → serial of the live entry with that id.
    by_id: foldhash::HashMap<SessionId, u64>,
    /// Serial → (id, entry), in insertion order.
    entries: BTreeMap<u64, (SessionId, V)>,
    /// The serial of the next insertion (never reused).
    next: u64,
}

impl<V> Default for Registry<V> {
    fn default() -> Self {
        Self {
            by_id: foldhash::HashMap::default(),
            entries: BTreeMap::new(),
            next: 1,
        }
    }
}

impl<V> Registry<V> {
    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether an entry has this id.
    pub(crate) fn contains(&self, id: &SessionId) -> bool {
        self.by_id.contains_key(id)
    }

    /// The entry with this id.
    pub(crate) fn get(&self, id: &SessionId) -> Option<&V> {
        let serial = self.by_id.get(id)?;
        self.entries.get(serial).map(|(_, v)| v)
    }

    /// The entry with this id, mutably.
    pub(crate) fn get_mut(&mut self, id: &SessionId) -> Option<&mut V> {
        let serial = self.by_id.get(id)?;
        self.entries.get_mut(serial).map(|(_, v)| v)
    }

    /// The entry with this serial (no hashing of an id).
    pub(crate) fn get_serial(&self, serial: u64) -> Option<&V> {
        self.entries.get(&serial).map(|(_, v)| v)
    }

    /// The entry with this serial, mutably.
    pub(crate) fn get_serial_mut(&mut self, serial: u64) -> Option<&mut V> {
        self.entries.get_mut(&serial).map(|(_, v)| v)
    }

    /// Inserts the entry `make(serial)` builds under `id` and a fresh serial, and returns the
    /// serial and the entry; when an entry already has `id`, `make` is not called but handed
    /// back (`Err`), so that the caller drops what it captured where it chooses (say, after
    /// releasing its lock). One hash probe of `id` either way.
    pub(crate) fn insert_with<F: FnOnce(u64) -> V>(
        &mut self,
        id: SessionId,
        make: F,
    ) -> Result<(u64, &V), F> {
        let slot = match self.by_id.entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => return Err(make),
            std::collections::hash_map::Entry::Vacant(slot) => slot,
        };
        let serial = self.next;
        self.next += 1;
        let id = slot.key().clone();
        slot.insert(serial);
        let (_, value) = self.entries.entry(serial).or_insert((id, make(serial)));
        Ok((serial, value))
    }

    /// Removes and returns the entry with this serial, if it is still here.
    pub(crate) fn remove(&mut self, serial: u64) -> Option<V> {
        let (id, value) = self.entries.remove(&serial)?;
        self.by_id.remove(&id);
        Some(value)
    }

    /// The entries in insertion order (reversible).
    pub(crate) fn values(&self) -> impl DoubleEndedIterator<Item = &V> {
        self.entries.values().map(|(_, v)| v)
    }

    /// The ids in insertion order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = &SessionId> {
        self.entries.values().map(|(id, _)| id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_found_by_id_and_kept_in_insertion_order() {
        let mut r = Registry::default();
        let a = *r.insert_with(SessionId::from("a"), |s| s).ok().expect("new").1;
        let b = *r.insert_with(SessionId::from("b"), |s| s).ok().expect("new").1;
        let c = *r.insert_with(SessionId::from("c"), |s| s).ok().expect("new").1;
        assert!(
            r.insert_with(SessionId::from("b"), |_| unreachable!("taken"))
                .is_err()
        );
        assert_eq!(r.get_serial(b), Some(&b));
        assert_eq!(r.get(&SessionId::from("b")), Some(&b));
        assert_eq!(r.values().copied().collect::<Vec<_>>(), [a, b, c]);
        assert_eq!(r.values().rev().copied().collect::<Vec<_>>(), [c, b, a]);

        assert_eq!(r.remove(b), Some(b));
        assert_eq!(r.remove(b), None, "removed once");
        assert!(!r.contains(&SessionId::from("b")));
        assert_eq!(r.get_serial(b), None, "the serial is not reused");
        // The id is free again, under a new serial that sorts last.
        let (b2, &value) = r
            .insert_with(SessionId::from("b"), |s| s)
            .ok()
            .expect("free again");
        assert_eq!(value, b2, "the serial passed to `make` is the one returned");
        assert!(b2 > c);
        assert_eq!(
            r.ids().map(|id| id.to_string()).collect::<Vec<_>>(),
            ["a", "c", "b"]
        );
        *r.get_mut(&SessionId::from("a")).expect("live") += 100;
        assert_eq!(r.get(&SessionId::from("a")), Some(&(a + 100)));
        *r.get_serial_mut(a).expect("live, by serial") -= 100;
        assert_eq!(r.get(&SessionId::from("a")), Some(&a));
        for serial in [a, c, b2] {
            r.remove(serial);
        }
        assert_eq!(r.len(), 0);
        assert!(r.by_id.is_empty(), "no id left behind");
    }
}
