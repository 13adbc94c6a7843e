//! `drain_continuable_children(parent, child_ids)` (spec §2.14.11): the selected teardown.

use std::sync::Arc;

use agent::{AgentRef, SessionId};

use super::ContinuationManager;
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
    pub async fn drain_continuable_children(
        &self,
        parent: &AgentRef,
        child_ids: &[SessionId],
    ) -> Result<(), SubagentError> {
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
        let disposals: Vec<_> = targets.iter().map(|a| inner.open_disposal(a)).collect();
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
        Err(SubagentError::teardown_failed_for(
            "selected activation(s)",
            &refs,
        ))
    }
}
