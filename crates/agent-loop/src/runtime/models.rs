//! [`ModelMap`]: model adapters by provider name.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;

use agent::ModelAdapter;
use agent::runtime::ModelRegistry;

/// A simple [`ModelRegistry`]: one adapter per provider name. Cheap to clone (shared); the lock
/// is held only to read or replace a map entry. (An ordered map: a handful of providers is
/// found faster by comparison than by hashing the name on every model request.)
#[derive(Clone, Default)]
pub struct ModelMap {
    adapters: Arc<RwLock<BTreeMap<String, Arc<dyn ModelAdapter>>>>,
}

impl std::fmt::Debug for ModelMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.adapters.read().keys().cloned().collect();
        f.debug_struct("ModelMap").field("providers", &names).finish()
    }
}

impl ModelMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `provider` with `adapter`, returning the adapter it replaces.
    pub fn insert(
        &self,
        provider: impl Into<String>,
        adapter: Arc<dyn ModelAdapter>,
    ) -> Option<Arc<dyn ModelAdapter>> {
        self.adapters.write().insert(provider.into(), adapter)
    }

    /// Stops serving `provider`.
    pub fn remove(&self, provider: &str) -> Option<Arc<dyn ModelAdapter>> {
        self.adapters.write().remove(provider)
    }
}

impl ModelRegistry for ModelMap {
    fn adapter(&self, provider: &str) -> Option<Arc<dyn ModelAdapter>> {
        self.adapters.read().get(provider).cloned()
    }
}
