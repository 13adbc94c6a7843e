//! [`ModelMap`]: model adapters by provider name.

use std::sync::Arc;

use parking_lot::RwLock;

use agent::ModelAdapter;
use agent::runtime::ModelRegistry;

/// The served providers, sorted by name, each with its adapter.
type Adapters = Vec<(String, Arc<dyn ModelAdapter>)>;

/// A simple [`ModelRegistry`]: one adapter per provider name. Cheap to clone (shared); the lock
/// is held only to read or replace an entry. (A list sorted by name, searched by bisection: a
/// handful of providers is found faster so than by hashing the name or walking a tree on every
/// model request.)
#[derive(Clone, Default)]
pub struct ModelMap {
    adapters: Arc<RwLock<Adapters>>,
}

impl std::fmt::Debug for ModelMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .adapters
            .read()
            .iter()
            .map(|(name, _)| name.clone())
            .collect();
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
        let provider = provider.into();
        let mut adapters = self.adapters.write();
        match adapters.binary_search_by(|(name, _)| name.as_str().cmp(&provider)) {
            Ok(at) => Some(std::mem::replace(&mut adapters[at].1, adapter)),
            Err(at) => {
                adapters.insert(at, (provider, adapter));
                None
            }
        }
    }

    /// Stops serving `provider`.
    pub fn remove(&self, provider: &str) -> Option<Arc<dyn ModelAdapter>> {
        let mut adapters = self.adapters.write();
        let at = adapters
            .binary_search_by(|(name, _)| name.as_str().cmp(provider))
            .ok()?;
        Some(adapters.remove(at).1)
    }
}

impl ModelRegistry for ModelMap {
    fn adapter(&self, provider: &str) -> Option<Arc<dyn ModelAdapter>> {
        let adapters = self.adapters.read();
        let at = adapters
            .binary_search_by(|(name, _)| name.as_str().cmp(provider))
            .ok()?;
        Some(adapters[at].1.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Insertion replaces a provider's adapter, removal stops serving it, lookups find each
    /// provider by its exact name, and the providers are listed by name.
    #[test]
    fn adapters_by_provider_name() {
        let map = ModelMap::new();
        let model = crate::model::ScriptedModel::new(Vec::<crate::model::ScriptEntry>::new());
        let (a, b) = (model.adapter(), model.adapter());
        assert!(map.insert("zeta", a.clone()).is_none());
        assert!(map.insert("alpha", a.clone()).is_none());
        assert!(map.insert("alp", b.clone()).is_none());
        let replaced = map.insert("zeta", b.clone()).expect("replaced");
        assert!(Arc::ptr_eq(&replaced, &a));
        assert!(Arc::ptr_eq(&map.adapter("zeta").expect("served"), &b));
        assert!(Arc::ptr_eq(&map.adapter("alpha").expect("served"), &a));
        assert!(map.adapter("alph").is_none());
        assert!(map.adapter("").is_none());
        assert_eq!(
            format!("{map:?}"),
            r#"ModelMap { providers: ["alp", "alpha", "zeta"] }"#
        );
        assert!(Arc::ptr_eq(&map.remove("alpha").expect("removed"), &a));
        assert!(map.remove("alpha").is_none());
        assert!(map.adapter("alpha").is_none());
        assert!(map.adapter("alp").is_some());
    }
}
