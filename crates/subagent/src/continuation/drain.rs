//! Drains (spec §2.14.11): the selected teardown `drain_continuable_children(parent, ids)` and
//! the scoped `drain_continuable_descendants(parents)` with the admission it closes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use agent::{Agent, AgentRef, SessionId};
use futures::FutureExt;
use futures::channel::oneshot;
use futures::future::{BoxFuture, Shared};

use super::activation::Activation;
use super::{ContinuationManager, Inner};
use crate::error::SubagentError;

impl ContinuationManager {
    /// Tears down the selected resident continuable children of `parent` (and their forests),
    /// child-first, and resolves when every selected transaction settled. Pending inbox work of
    /// the targets is discarded (this is teardown, unlike `interrupt`); admission is not closed
    /// and siblings are untouched. Ids are de-duplicated; absent ids are no-ops. Durable child
    /// sessions survive.
    ///
    /// # Errors
    /// `UNAUTHORIZED` — `parent` is not the exact live registry entry (even for an empty list),
    /// or a resident target is not its direct child (checked for every target before any
    /// disposal begins); `ACTIVATION_TEARDOWN_FAILED` aggregating failed branches after all
    /// branches settled.
    ///
    /// Authorization and opening every selected transaction happen synchronously, when this is
    /// called; the returned future awaits the teardowns.
    pub fn drain_continuable_children(
        &self,
        parent: &AgentRef,
        child_ids: &[SessionId],
    ) -> BoxFuture<'static, Result<(), SubagentError>> {
        match self.open_selected(parent, child_ids) {
            Ok(disposals) => settle_branches(disposals, "selected activation(s)").boxed(),
            Err(e) => futures::future::ready(Err(e)).boxed(),
        }
    }

    fn open_selected(
        &self,
        parent: &AgentRef,
        child_ids: &[SessionId],
    ) -> Result<Vec<super::activation::Disposal>, SubagentError> {
        let inner = &self.inner;
        let live = inner
            .services
            .agents
            .get(parent.id())
            .is_some_and(|p| Arc::ptr_eq(&p, parent));
        if !live {
            return Err(SubagentError::selected_teardown_requires_live_parent());
        }
        let mut ids: Vec<&SessionId> = Vec::new();
        for id in child_ids {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        let mut targets = Vec::new();
        for id in ids {
            let Some(activation) = inner.activations.lock().get(id).cloned() else {
                continue;
            };
            if &activation.parent_session != parent.id() || !activation.has_ancestor(parent) {
                return Err(SubagentError::not_direct_child(id.as_str(), parent.id().as_str()));
            }
            targets.push(activation);
        }
        Ok(targets.iter().map(|a| inner.open_disposal(a)).collect())
    }
}

/// One root closed by a scoped drain: closed while **that exact object** is the registry's
/// entry for its id (a same-id replacement is unaffected), with the members recorded when the
/// drains selected their targets.
pub(crate) struct ClosingRoot {
    root: Weak<dyn Agent>,
    root_id: SessionId,
    members: Vec<Weak<dyn Agent>>,
}

/// One in-flight materialization: the delegating parent's lineage at its start, and its
/// completion (resolved when the record's guard is dropped: installed or rolled back).
pub(crate) struct Materializing {
    id: u64,
    lineage: Vec<Weak<dyn Agent>>,
    done: Shared<oneshot::Receiver<()>>,
}

/// Removes its in-flight record and resolves its completion when dropped.
pub(crate) struct MaterializingGuard {
    inner: Weak<Inner>,
    id: u64,
    _done: oneshot::Sender<()>,
}

impl Drop for MaterializingGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.materializing.lock().retain(|m| m.id != self.id);
        }
    }
}

impl Inner {
    /// Registers an in-flight materialization delegated by `parent` (its exact live lineage).
    pub(super) fn begin_materialization(self: &Arc<Self>, parent: &AgentRef) -> MaterializingGuard {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let lineage = self.lineage_of(parent).iter().map(Arc::downgrade).collect();
        self.materializing.lock().push(Materializing {
            id,
            lineage,
            done: rx.shared(),
        });
        MaterializingGuard {
            inner: Arc::downgrade(self),
            id,
            _done: tx,
        }
    }

    /// The completions of the in-flight materializations whose lineage satisfies `covered`.
    pub(super) fn inflight_materializations(
        &self,
        covered: impl Fn(&[Weak<dyn Agent>]) -> bool,
    ) -> Vec<futures::future::BoxFuture<'static, ()>> {
        self.materializing
            .lock()
            .iter()
            .filter(|m| covered(&m.lineage))
            .map(|m| m.done.clone().map(|_| ()).boxed())
            .collect()
    }

    /// The exact live closing root covering `agent`, if any (pruning roots that left the
    /// registry): one whose recorded members or whose root itself `agent`'s live lineage
    /// (`agent` included) holds.
    pub(super) fn closing_root_over(&self, agent: &AgentRef) -> Option<SessionId> {
        let mut closing = self.closing.lock();
        closing.retain(|c| {
            c.root.upgrade().is_some_and(|root| {
                self.services
                    .agents
                    .get(&c.root_id)
                    .is_some_and(|r| Arc::ptr_eq(&r, &root))
            })
        });
        if closing.is_empty() {
            return None;
        }
        let lineage = self.lineage_of(agent);
        for c in closing.iter() {
            let Some(root) = c.root.upgrade() else { continue };
            // A member, or below one: the forest of a selected child is inside the root's scope
            // even where the live lineage no longer reaches the root itself (an intermediate
            // between them left the registry).
            let members: Vec<AgentRef> = c.members.iter().filter_map(Weak::upgrade).collect();
            let covered = lineage
                .iter()
                .any(|a| Arc::ptr_eq(a, &root) || members.iter().any(|m| Arc::ptr_eq(m, a)));
            if covered {
                return Some(c.root_id.clone());
            }
        }
        None
    }

    /// `agent` and its live durable ancestors (cycle-safe).
    fn lineage_of(&self, agent: &AgentRef) -> Vec<AgentRef> {
        let mut out = vec![agent.clone()];
        let mut next = agent.session().header().parent_session.clone();
        while let Some(id) = next {
            if out.iter().any(|a| a.id() == &id) {
                break;
            }
            let Some(parent) = self.services.agents.get(&id) else {
                break;
            };
            next = parent.session().header().parent_session.clone();
            out.push(parent);
        }
        out
    }
}

impl ContinuationManager {
    /// Scoped drain (spec §2.14.11): closes admission below each exact live `parents` root and
    /// tears down every resident continuable descendant of those roots (a root that is itself
    /// continuable stays resident: its host still owns it), child-first. Stale root objects are
    /// ignored. Admission stays closed for a root until that exact object leaves the registry;
    /// unrelated forests stay admitting. Failures aggregate as `ACTIVATION_TEARDOWN_FAILED`.
    ///
    /// Closing the roots, selecting the targets and opening their transactions happen
    /// synchronously, when this is called, in one span that no materialization's residency
    /// interleaves with (on any thread): a child materializing below a root is either selected
    /// here, fully resident, or refused `DRAINING` and waited for — the returned future awaits
    /// the in-flight materializations below the roots, then the teardowns, so that once it
    /// resolves no continuable descendant admitted before the drain is resident.
    pub fn drain_continuable_descendants(
        &self,
        parents: &[AgentRef],
    ) -> BoxFuture<'static, Result<(), SubagentError>> {
        let inner = &self.inner;
        let roots: Vec<AgentRef> = parents
            .iter()
            .filter(|p| {
                inner
                    .services
                    .agents
                    .get(p.id())
                    .is_some_and(|r| Arc::ptr_eq(&r, p))
            })
            .cloned()
            .collect();
        if roots.is_empty() {
            return futures::future::ready(Ok(())).boxed();
        }
        // Synchronously: close each root, select its descendants, open their disposals, collect
        // the in-flight materializations — one span under the admission lock, so that a
        // materialization's residency span (which checks admission and records the ancestry the
        // selection reads; its in-flight record goes only after it) comes wholly before it —
        // the child is selected — or wholly after it — the child is refused and its record
        // waited for. Unlocked, a residency on another thread could fall between the selection
        // and the collection, and the drain resolved with that child resident under its closed
        // root.
        #[cfg(test)]
        inner.hooks.drain_span(&inner.admission);
        let admission = inner.admission.lock();
        let activations: Vec<_> = inner.activations.lock().values().cloned().collect();
        let mut disposals = Vec::new();
        for root in &roots {
            let mut targets = select_forest(&activations, root);
            // Ancestors first, so cancellation runs top-down (spec §2.14.6): opening a target's
            // transaction opens its owned children's, and a descendant opened later only joins
            // its already-open transaction. (The map's order would sometimes cancel a grandchild
            // while its parent still ran.)
            let selected = targets.clone();
            targets.sort_by_cached_key(|a| selected_ancestors(a, &selected));
            #[cfg(test)]
            inner.hooks.drain_selected();
            {
                let mut closing = inner.closing.lock();
                let index = match closing
                    .iter()
                    .position(|c| c.root.upgrade().is_some_and(|r| Arc::ptr_eq(&r, root)))
                {
                    Some(i) => i,
                    None => {
                        closing.push(ClosingRoot {
                            root: Arc::downgrade(root),
                            root_id: root.id().clone(),
                            members: Vec::new(),
                        });
                        closing.len() - 1
                    }
                };
                for target in &targets {
                    closing[index].members.push(Arc::downgrade(&target.agent));
                }
            }
            for target in &targets {
                if !disposals.iter().any(|(id, _)| id == &target.child_id) {
                    disposals.push((target.child_id.clone(), inner.open_disposal(target)));
                }
            }
        }
        // In scope: below a root, or below one of the roots' members (their selected children,
        // whose forests the admission check closes too, spec §4 item 40).
        let members: Vec<AgentRef> = {
            let closing = inner.closing.lock();
            closing
                .iter()
                .filter(|c| {
                    c.root
                        .upgrade()
                        .is_some_and(|r| roots.iter().any(|root| Arc::ptr_eq(&r, root)))
                })
                .flat_map(|c| c.members.iter().filter_map(Weak::upgrade))
                .collect()
        };
        let inflight = inner.inflight_materializations(|lineage| {
            lineage.iter().filter_map(Weak::upgrade).any(|a| {
                roots.iter().any(|r| Arc::ptr_eq(&a, r)) || members.iter().any(|m| Arc::ptr_eq(&a, m))
            })
        });
        drop(admission);
        let disposals: Vec<_> = disposals.into_iter().map(|(_, d)| d).collect();
        async move {
            futures::future::join_all(inflight).await;
            settle_branches(disposals, "scoped activation(s)").await
        }
        .boxed()
    }
}

/// The resident continuable descendants of `root` among `activations` (the root excluded: its
/// host still owns it): each one whose recorded ancestry holds the root, and — transitively —
/// each one whose recorded ancestry holds one already selected. The second rule reaches a child
/// materialized below a selected one after an intermediate between the root and that selected
/// child left the registry: its ancestry (the live lineage at its materialization) stops short
/// of the root, and its owner is no Activation of the forest (a one-shot run in between), so
/// neither the first rule nor the selected child's teardown would reach it.
fn select_forest(activations: &[Arc<Activation>], root: &AgentRef) -> Vec<Arc<Activation>> {
    let mut selected: Vec<Arc<Activation>> = activations
        .iter()
        .filter(|a| a.has_ancestor(root) && !Arc::ptr_eq(&a.agent, root))
        .cloned()
        .collect();
    loop {
        let below: Vec<Arc<Activation>> = activations
            .iter()
            .filter(|a| {
                !Arc::ptr_eq(&a.agent, root)
                    && !selected.iter().any(|s| Arc::ptr_eq(s, a))
                    && selected.iter().any(|s| a.has_ancestor(&s.agent))
            })
            .cloned()
            .collect();
        if below.is_empty() {
            return selected;
        }
        selected.extend(below);
    }
}

/// How many of the other `selected` Activations are recorded ancestors of `activation` (its
/// depth among them).
fn selected_ancestors(activation: &Arc<Activation>, selected: &[Arc<Activation>]) -> usize {
    selected
        .iter()
        .filter(|other| !Arc::ptr_eq(other, activation) && activation.has_ancestor(&other.agent))
        .count()
}

/// Awaits every branch, then reports the failed ones as one `ACTIVATION_TEARDOWN_FAILED`
/// naming `subject`.
async fn settle_branches(
    disposals: Vec<super::activation::Disposal>,
    subject: &'static str,
) -> Result<(), SubagentError> {
    let failures: Vec<_> = futures::future::join_all(disposals)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    if failures.is_empty() {
        return Ok(());
    }
    let refs: Vec<&(dyn std::error::Error + 'static)> = failures
        .iter()
        .map(|e| e.as_ref() as &(dyn std::error::Error + 'static))
        .collect();
    Err(SubagentError::teardown_failed_for(subject, &refs))
}
