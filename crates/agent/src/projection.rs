//! Session projections: named, pure folds of a session log into a JSON view (for listings and
//! dashboards), collected in a [`ProjectionRegistry`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use serde_json::{Map, Value};

use crate::event::SessionEvent;
use crate::header::SessionHeader;
use crate::registration::Registration;
use crate::session::Session;

/// A named, pure fold of a session log.
///
/// # Contract
/// * `view` must be deterministic, must not panic on any log (foreign or malformed logs
///   included: listings fold logs loaded from persistence) and must return a JSON value (use
///   `null` for "no value").
/// * It runs synchronously on the caller's thread — often an async task — and concurrently for
///   different sessions: keep it quick and non-blocking.
/// * [`ProjectionRegistry::snapshot`] does not contain a panic; the subagent listing does, and
///   reports that session as corrupt.
/// * `name` must not change: the registry checks uniqueness at registration and keys snapshots by
///   the name read at snapshot time.
/// * The registry holds the projection until its guard is dropped; a snapshot already under way
///   may still call it after that.
pub trait Projection: Send + Sync + 'static {
    /// The key under which the view appears in a snapshot.
    fn name(&self) -> &str;

    /// Folds `events` (with the session's `header`) into the view.
    fn view(&self, header: &SessionHeader, events: &[Arc<SessionEvent>]) -> Value;
}

/// A projection name is already registered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("session projection \"{0}\" is already registered")]
pub struct DuplicateProjection(pub String);

type Entries = Arc<RwLock<Vec<(u64, Arc<dyn Projection>)>>>;

/// The host's projection registry. Cheap to clone (shared).
///
/// Registration returns a guard; dropping it removes the projection, so a snapshot taken
/// afterwards no longer has its key.
#[derive(Clone, Default)]
pub struct ProjectionRegistry {
    entries: Entries,
}

impl std::fmt::Debug for ProjectionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProjectionRegistry")
            .field("names", &self.names())
            .finish()
    }
}

impl ProjectionRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `projection` under its name.
    pub fn register(&self, projection: Arc<dyn Projection>) -> Result<Registration, DuplicateProjection> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        {
            let mut entries = self.entries.write();
            if entries.iter().any(|(_, p)| p.name() == projection.name()) {
                return Err(DuplicateProjection(projection.name().to_owned()));
            }
            entries.push((id, projection));
        }
        let weak = Arc::downgrade(&self.entries);
        Ok(Registration::new(move || {
            if let Some(entries) = weak.upgrade() {
                let removed = {
                    let mut entries = entries.write();
                    entries
                        .iter()
                        .position(|(i, _)| *i == id)
                        .map(|index| entries.remove(index))
                };
                // The projection (and whatever it owns, possibly the guard of another
                // projection) is dropped after the lock is released.
                drop(removed);
            }
        }))
    }

    /// Registered names, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.entries
            .read()
            .iter()
            .map(|(_, p)| p.name().to_owned())
            .collect()
    }

    /// Every registered view of `session`'s current log, keyed by projection name.
    pub fn snapshot(&self, session: &Session) -> Map<String, Value> {
        let projections: Vec<Arc<dyn Projection>> =
            self.entries.read().iter().map(|(_, p)| p.clone()).collect();
        let events = session.events();
        projections
            .iter()
            .map(|p| (p.name().to_owned(), p.view(session.header(), &events)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A projection that may own another registration (held only to be dropped with it).
    struct Named(
        &'static str,
        #[expect(dead_code, reason = "held, never read")] Option<Registration>,
    );

    impl Projection for Named {
        fn name(&self) -> &str {
            self.0
        }

        fn view(&self, _: &SessionHeader, events: &[Arc<SessionEvent>]) -> Value {
            Value::from(events.len())
        }
    }

    /// Unregistering a projection drops it after the registry's lock is released: one owning
    /// the guard of another projection of the same registry used to be dropped under the write
    /// lock, whose second removal then deadlocked on it.
    #[test]
    fn unregistering_a_projection_that_owns_another_registration_does_not_deadlock() {
        let registry = ProjectionRegistry::new();
        let inner = registry.register(Arc::new(Named("inner", None))).unwrap();
        let outer = registry.register(Arc::new(Named("outer", Some(inner)))).unwrap();
        assert_eq!(registry.names(), ["inner", "outer"]);
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(outer);
            let _ = done.send(());
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("finished: no deadlock");
        assert!(registry.names().is_empty());
        let session = Session::new(
            crate::header::SessionMeta::default()
                .into_header("s".into(), 1)
                .unwrap(),
            None,
        )
        .unwrap();
        assert!(registry.snapshot(&session).is_empty());
    }
}
