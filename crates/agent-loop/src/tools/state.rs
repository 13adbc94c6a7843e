//! The registry's layered state: one [`Layer`] per scope plus the global one, scope-parent
//! edges, policy hooks and result observers, and the views derived from them (spec §7, §11.2,
//! §11.3).
//!
//! Everything here is synchronous and runs under the registry's one mutex; nothing in this file
//! awaits, calls user code, or drops user values that could re-enter the registry (removals
//! return the removed value so the caller drops it after unlocking).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use agent::SessionId;
use agent::model::ToolSchema;
use agent::scoped::ScopedEntries;
use agent::tools::{
    PostExecutePolicy, PreExecutePolicy, RESERVED_TOOL_NAME, ToolDefinition, ToolGuard, ToolRegistryError,
    ToolRestriction, ToolResultObserver,
};

use super::approval::ToolApproval;

/// A restriction compiled (copied into sets) at registration.
#[derive(Debug)]
pub(super) struct CompiledRestriction {
    allow: Option<HashSet<String>>,
    deny: Option<HashSet<String>>,
}

impl CompiledRestriction {
    fn admits(&self, name: &str) -> bool {
        self.allow.as_ref().is_none_or(|a| a.contains(name))
            && self.deny.as_ref().is_none_or(|d| !d.contains(name))
    }
}

/// One scope's (or the global) contribution: tools, restrictions and guards.
#[derive(Default)]
pub(super) struct Layer {
    tools: BTreeMap<String, (u64, ToolDefinition)>,
    restrictions: Vec<(u64, CompiledRestriction)>,
    guards: Vec<(u64, ToolGuard)>,
}

impl Layer {
    fn is_empty(&self) -> bool {
        self.tools.is_empty() && self.restrictions.is_empty() && self.guards.is_empty()
    }

    fn admits(&self, name: &str) -> bool {
        self.restrictions.iter().all(|(_, r)| r.admits(name))
    }
}

/// Which hook list an entry lives in.
#[derive(Clone, Copy, Debug)]
pub(super) enum HookKind {
    Pre,
    Post,
    Observer,
}

/// A value removed from the state, to be dropped by the caller after unlocking.
pub(super) type Removed = Option<Box<dyn std::any::Any + Send>>;

/// Every registration the registry holds. Protected by `ToolRegistry`'s mutex.
#[derive(Default)]
pub(super) struct State {
    next_id: u64,
    global: Layer,
    scopes: HashMap<SessionId, Layer>,
    /// Parent edges per scope; the last live edge is the effective parent.
    parents: HashMap<SessionId, Vec<(u64, SessionId)>>,
    /// Execution policies and result observers, global or per agent (an agent's lookup does
    /// not walk other agents' entries).
    pre: ScopedEntries<PreExecutePolicy>,
    post: ScopedEntries<PostExecutePolicy>,
    observers: ScopedEntries<ToolResultObserver>,
    /// Approval services; the last live one answers.
    approvals: Vec<(u64, Arc<dyn ToolApproval>)>,
}

/// Live registration counts (for tests asserting registries end empty).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegistryCounts {
    /// Tools in every layer.
    pub tools: usize,
    /// Scoped restrictions.
    pub restrictions: usize,
    /// Guards in every layer.
    pub guards: usize,
    /// `tools/pre-execute` policies.
    pub pre_execute: usize,
    /// `tools/post-execute` policies.
    pub post_execute: usize,
    /// `tools/result` observers.
    pub observers: usize,
    /// Scope-parent edges.
    pub scope_parents: usize,
    /// Approval services.
    pub approvals: usize,
    /// Scope layers currently allocated (a layer exists while it holds anything).
    pub scope_layers: usize,
}

impl RegistryCounts {
    /// Total live registrations of every kind (layers are containers, not registrations).
    pub fn total(&self) -> usize {
        self.tools
            + self.restrictions
            + self.guards
            + self.pre_execute
            + self.post_execute
            + self.observers
            + self.scope_parents
            + self.approvals
    }
}

impl State {
    fn mint(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn layer_mut(&mut self, scope: Option<&SessionId>) -> &mut Layer {
        match scope {
            None => &mut self.global,
            Some(s) => self.scopes.entry(s.clone()).or_default(),
        }
    }

    fn layer(&self, scope: Option<&SessionId>) -> Option<&Layer> {
        match scope {
            None => Some(&self.global),
            Some(s) => self.scopes.get(s),
        }
    }

    /// Applies `edit` to a layer and frees a scope layer that became empty.
    fn edit_layer<R>(&mut self, scope: Option<&SessionId>, edit: impl FnOnce(&mut Layer) -> R) -> R {
        match scope {
            None => edit(&mut self.global),
            Some(s) => {
                let Some(layer) = self.scopes.get_mut(s) else {
                    return edit(&mut Layer::default());
                };
                let out = edit(layer);
                if layer.is_empty() {
                    self.scopes.remove(s);
                }
                out
            }
        }
    }

    // ---- registration -------------------------------------------------------------------

    pub(super) fn register(
        &mut self,
        scope: Option<&SessionId>,
        def: ToolDefinition,
    ) -> Result<u64, ToolRegistryError> {
        if def.name.is_empty() || def.name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ToolRegistryError::InvalidName(def.name));
        }
        if def.name == RESERVED_TOOL_NAME {
            return Err(ToolRegistryError::Reserved);
        }
        if self.layer(scope).is_some_and(|l| l.tools.contains_key(&def.name)) {
            return Err(ToolRegistryError::Duplicate(def.name));
        }
        let id = self.mint();
        self.layer_mut(scope).tools.insert(def.name.clone(), (id, def));
        Ok(id)
    }

    pub(super) fn unregister(&mut self, scope: Option<&SessionId>, name: &str, id: u64) -> Removed {
        self.edit_layer(scope, |layer| match layer.tools.get(name) {
            Some((live, _)) if *live == id => layer.tools.remove(name).map(|(_, d)| Box::new(d) as _),
            _ => None,
        })
    }

    /// Validates and compiles a restriction for `scope` (spec §11.3 rules 1–4).
    pub(super) fn restrict(
        &mut self,
        scope: Option<&SessionId>,
        filter: ToolRestriction,
    ) -> Result<u64, ToolRegistryError> {
        let Some(scope) = scope else {
            return Err(ToolRegistryError::Unscoped);
        };
        if filter.allow.is_none() && filter.deny.is_none() {
            return Err(ToolRegistryError::EmptyRestriction);
        }
        let named: Vec<&String> = filter.allow.iter().chain(filter.deny.iter()).flatten().collect();
        if named.iter().any(|n| *n == RESERVED_TOOL_NAME) {
            return Err(ToolRegistryError::Reserved);
        }
        if let Some(own) = self.scopes.get(scope)
            && let Some(name) = named.iter().find(|n| own.tools.contains_key(n.as_str()))
        {
            return Err(ToolRegistryError::OwnName((*name).clone()));
        }
        let known = self.inherited_names(scope);
        let mut unknown: Vec<&str> = Vec::new();
        for name in &named {
            if !known.contains(name.as_str()) && !unknown.contains(&name.as_str()) {
                unknown.push(name);
            }
        }
        if !unknown.is_empty() {
            let names = unknown
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect::<Vec<_>>()
                .join(", ");
            let known = if known.is_empty() {
                "(none)".to_owned()
            } else {
                known.into_iter().collect::<Vec<_>>().join(", ")
            };
            return Err(ToolRegistryError::UnknownNames { names, known });
        }
        let compiled = CompiledRestriction {
            allow: filter.allow.map(|a| a.into_iter().collect()),
            deny: filter.deny.map(|d| d.into_iter().collect()),
        };
        let id = self.mint();
        self.layer_mut(Some(scope)).restrictions.push((id, compiled));
        Ok(id)
    }

    pub(super) fn unrestrict(&mut self, scope: &SessionId, id: u64) -> Removed {
        self.edit_layer(Some(scope), |layer| {
            let at = layer.restrictions.iter().position(|(i, _)| *i == id)?;
            Some(Box::new(layer.restrictions.remove(at).1) as _)
        })
    }

    pub(super) fn add_guard(&mut self, scope: Option<&SessionId>, guard: ToolGuard) -> u64 {
        let id = self.mint();
        self.layer_mut(scope).guards.push((id, guard));
        id
    }

    pub(super) fn remove_guard(&mut self, scope: Option<&SessionId>, id: u64) -> Removed {
        self.edit_layer(scope, |layer| {
            let at = layer.guards.iter().position(|(i, _)| *i == id)?;
            Some(Box::new(layer.guards.remove(at).1) as _)
        })
    }

    pub(super) fn add_pre(&mut self, scope: Option<&SessionId>, hook: PreExecutePolicy) -> u64 {
        self.pre.push(scope, hook)
    }

    pub(super) fn add_post(&mut self, scope: Option<&SessionId>, hook: PostExecutePolicy) -> u64 {
        self.post.push(scope, hook)
    }

    pub(super) fn add_observer(&mut self, scope: Option<&SessionId>, hook: ToolResultObserver) -> u64 {
        self.observers.push(scope, hook)
    }

    /// Removes hook `id` of `kind`, registered in `scope`'s layer.
    pub(super) fn remove_hook(&mut self, kind: HookKind, scope: Option<&SessionId>, id: u64) -> Removed {
        fn boxed<T: Send + 'static>(hook: Option<T>) -> Removed {
            hook.map(|h| Box::new(h) as _)
        }
        match kind {
            HookKind::Pre => boxed(self.pre.remove(scope, id)),
            HookKind::Post => boxed(self.post.remove(scope, id)),
            HookKind::Observer => boxed(self.observers.remove(scope, id)),
        }
    }

    pub(super) fn add_parent(&mut self, scope: &SessionId, parent: &SessionId) -> u64 {
        let id = self.mint();
        self.parents
            .entry(scope.clone())
            .or_default()
            .push((id, parent.clone()));
        id
    }

    pub(super) fn remove_parent(&mut self, scope: &SessionId, id: u64) {
        if let Some(edges) = self.parents.get_mut(scope) {
            edges.retain(|(i, _)| *i != id);
            if edges.is_empty() {
                self.parents.remove(scope);
            }
        }
    }

    pub(super) fn add_approval(&mut self, approval: Arc<dyn ToolApproval>) -> u64 {
        let id = self.mint();
        self.approvals.push((id, approval));
        id
    }

    pub(super) fn remove_approval(&mut self, id: u64) -> Removed {
        let at = self.approvals.iter().position(|(i, _)| *i == id)?;
        Some(Box::new(self.approvals.remove(at).1) as _)
    }

    // ---- views --------------------------------------------------------------------------

    /// The scope chain of `scope`: farthest ancestor first, `scope` itself last. Cycles are
    /// cut at the first repeated key.
    fn chain(&self, scope: &SessionId) -> Vec<SessionId> {
        let mut chain = vec![scope.clone()];
        let mut current = scope;
        while let Some((_, parent)) = self.parents.get(current).and_then(|edges| edges.last()) {
            if chain.contains(parent) {
                break;
            }
            chain.push(parent.clone());
            current = parent;
        }
        chain.reverse();
        chain
    }

    /// Names `scope` inherits (global layer and every ancestor layer), before restrictions.
    fn inherited_names(&self, scope: &SessionId) -> BTreeSet<String> {
        let chain = self.chain(scope);
        let mut names: BTreeSet<String> = self.global.tools.keys().cloned().collect();
        for key in &chain[..chain.len() - 1] {
            if let Some(layer) = self.scopes.get(key) {
                names.extend(layer.tools.keys().cloned());
            }
        }
        names
    }

    /// Whether every restriction on `chain` admits the inherited `name`.
    ///
    /// Callers pass only the layers *nearer* than the one that defines `name` (`chain[depth..]`,
    /// see [`Self::schemas`]): a layer's restrictions filter what it inherits, never its own
    /// registrations, so a nested scope sees an ancestor's own tools exactly as the ancestor
    /// does (spec §11.3 rule 6).
    fn chain_admits(&self, chain: &[SessionId], name: &str) -> bool {
        chain
            .iter()
            .filter_map(|k| self.scopes.get(k))
            .all(|l| l.admits(name))
    }

    /// The definition `scope` sees under `name` (own shadows inherited; nearer ancestors shadow
    /// farther ones; a restricted-away inherited tool reads as absent).
    pub(super) fn resolve(&self, name: &str, scope: Option<&SessionId>) -> Option<ToolDefinition> {
        let Some(scope) = scope else {
            return self.global.tools.get(name).map(|(_, d)| d.clone());
        };
        if let Some((_, def)) = self.scopes.get(scope).and_then(|l| l.tools.get(name)) {
            return Some(def.clone());
        }
        let chain = self.chain(scope);
        // The nearest definition and its depth: 0 for the global layer, `i + 1` for the tool
        // of `chain[i]`. Only restrictions of layers nearer than its own apply to it.
        let (depth, inherited) = chain[..chain.len() - 1]
            .iter()
            .enumerate()
            .rev()
            .find_map(|(i, k)| self.scopes.get(k)?.tools.get(name).map(|t| (i + 1, t)))
            .or_else(|| self.global.tools.get(name).map(|t| (0, t)))?;
        self.chain_admits(&chain[depth..], name)
            .then(|| inherited.1.clone())
    }

    /// The schemas of every definition `scope` sees, by name (own shadows inherited; nearer
    /// ancestors shadow farther ones; restricted-away inherited tools are absent). The
    /// definitions are not copied, and a scope without ancestors builds no scope chain when
    /// nothing is registered globally.
    pub(super) fn schemas(&self, scope: Option<&SessionId>) -> Vec<ToolSchema> {
        let Some(scope) = scope else {
            return self.global.tools.values().map(|(_, d)| d.schema()).collect();
        };
        let own = self.scopes.get(scope);
        if self.global.tools.is_empty() && !self.parents.contains_key(scope) {
            // Nothing to inherit: the scope's own tools.
            return own.map_or_else(Vec::new, |l| l.tools.values().map(|(_, d)| d.schema()).collect());
        }
        let chain = self.chain(scope);
        // Each inherited definition with its depth (0: global; `i + 1`: `chain[i]`'s own), the
        // nearest shadowing the farther; only restrictions of nearer layers filter it.
        let mut inherited: BTreeMap<&String, (usize, &ToolDefinition)> =
            self.global.tools.iter().map(|(n, (_, d))| (n, (0, d))).collect();
        for (i, key) in chain[..chain.len() - 1].iter().enumerate() {
            if let Some(layer) = self.scopes.get(key) {
                inherited.extend(layer.tools.iter().map(|(n, (_, d))| (n, (i + 1, d))));
            }
        }
        inherited.retain(|n, (depth, _)| self.chain_admits(&chain[*depth..], n));
        if let Some(own) = own {
            inherited.extend(own.tools.iter().map(|(n, (_, d))| (n, (chain.len(), d))));
        }
        inherited.values().map(|(_, d)| d.schema()).collect()
    }

    /// Guards that apply to `agent`'s calls: global first, then the scope chain farthest first.
    pub(super) fn guards_for(&self, agent: &SessionId) -> Vec<ToolGuard> {
        let mut guards: Vec<ToolGuard> = self.global.guards.iter().map(|(_, g)| g.clone()).collect();
        for key in self.chain(agent) {
            if let Some(layer) = self.scopes.get(&key) {
                guards.extend(layer.guards.iter().map(|(_, g)| g.clone()));
            }
        }
        guards
    }

    fn hooks_for<T: Clone>(list: &ScopedEntries<T>, agent: &SessionId) -> Vec<T> {
        list.visible(Some(agent))
            .map(|(_, hook, _)| hook.clone())
            .collect()
    }

    /// Pre-execute policies for `agent` (global and its own), in registration order.
    pub(super) fn pre_for(&self, agent: &SessionId) -> Vec<PreExecutePolicy> {
        Self::hooks_for(&self.pre, agent)
    }

    /// Post-execute policies for `agent`, in registration order.
    pub(super) fn post_for(&self, agent: &SessionId) -> Vec<PostExecutePolicy> {
        Self::hooks_for(&self.post, agent)
    }

    /// Result observers for `agent`, in registration order.
    pub(super) fn observers_for(&self, agent: &SessionId) -> Vec<ToolResultObserver> {
        Self::hooks_for(&self.observers, agent)
    }

    /// The answering approval service, if any.
    pub(super) fn approval(&self) -> Option<Arc<dyn ToolApproval>> {
        self.approvals.last().map(|(_, a)| a.clone())
    }

    pub(super) fn counts(&self) -> RegistryCounts {
        let layers = || std::iter::once(&self.global).chain(self.scopes.values());
        RegistryCounts {
            tools: layers().map(|l| l.tools.len()).sum(),
            restrictions: layers().map(|l| l.restrictions.len()).sum(),
            guards: layers().map(|l| l.guards.len()).sum(),
            pre_execute: self.pre.len(),
            post_execute: self.post.len(),
            observers: self.observers.len(),
            scope_parents: self.parents.values().map(Vec::len).sum(),
            approvals: self.approvals.len(),
            scope_layers: self.scopes.len(),
        }
    }
}
