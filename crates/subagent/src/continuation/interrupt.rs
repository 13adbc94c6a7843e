//! `interrupt(target, authority)` (spec §2.14.9): synchronous admission, asynchronous effect.

use std::sync::Arc;

use agent::{AgentRef, CancelCause, CancelOptions, SessionId};

use super::ContinuationManager;
use crate::error::SubagentError;

/// Who asks to stop a continuable child's current turn.
#[derive(Clone)]
pub enum InterruptAuthority {
    /// A human presenting the target's durable direct-parent address (no live parent agent is
    /// needed). Cancel cause `user`.
    User {
        /// The target's durable direct parent.
        parent_session_id: SessionId,
    },
    /// An exact live ancestor agent (direct parent or deeper). Cancel cause `parent`.
    Ancestor {
        /// The ancestor.
        agent: AgentRef,
    },
}

impl std::fmt::Debug for InterruptAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::User { parent_session_id } => f
                .debug_struct("User")
                .field("parent_session_id", parent_session_id)
                .finish(),
            Self::Ancestor { agent } => f.debug_struct("Ancestor").field("agent", agent.id()).finish(),
        }
    }
}

impl ContinuationManager {
    /// Stops the current turn of the resident continuable child `target` (spec §2.14.9) and
    /// returns once the cancel signal is issued, without waiting for the target to observe it.
    ///
    /// Only the current turn is aborted (`cancel` with `keep_inbox`): unclaimed queued work is
    /// kept and parked until the next waking send, the Activation stays resident, descendants
    /// are not signalled. An absent target (unknown, settled, one-shot) or one whose disposal
    /// began is an accepted no-op.
    ///
    /// # Errors
    /// `UNAUTHORIZED` — an ancestor that is not the exact live registry entry ("requires the
    /// exact live ancestor agent", even for an absent target), a self-interrupt ("cannot
    /// interrupt itself"), a wrong parent address ("belongs to another parent session"), or an
    /// ancestor outside the target's recorded ancestry ("is not a live descendant").
    /// `PROVIDER_FAILED` — the target agent's `cancel` panicked
    /// ([`SubagentError::interrupt_failed`]); nothing was cancelled and the Activation is
    /// unchanged.
    pub fn interrupt(&self, target: &SessionId, authority: &InterruptAuthority) -> Result<(), SubagentError> {
        let inner = &self.inner;
        if let InterruptAuthority::Ancestor { agent } = authority {
            let live = inner
                .services
                .agents
                .get(agent.id())
                .is_some_and(|a| Arc::ptr_eq(&a, agent));
            if !live {
                return Err(SubagentError::interrupt_requires_live_ancestor(target.as_str()));
            }
            if agent.id() == target {
                return Err(SubagentError::cannot_interrupt_itself(agent.id().as_str()));
            }
        }
        // The lookup, the authorization, the disposal check and the cancel are one span under
        // the admission lock, like a submission's (spec §2.14.5) and the opening of a disposal
        // transaction (its cancel): with respect to a drain or a settling watcher on another
        // thread, the interrupt either cancels wholly before the transaction opens (whose own
        // cancel then follows) or finds it open and is a no-op (CONT-103). Checked outside the
        // span, a teardown opened between the check and the cancel got a second cancel of the
        // child from the interrupt. Nothing here suspends.
        let _admission = inner.admission.lock();
        let Some(activation) = inner.activations.lock().get(target).cloned() else {
            return Ok(());
        };
        let cause = match authority {
            InterruptAuthority::User { parent_session_id } => {
                if &activation.parent_session != parent_session_id {
                    return Err(SubagentError::foreign_parent(target.as_str()));
                }
                CancelCause::User
            }
            InterruptAuthority::Ancestor { agent } => {
                if !activation.has_ancestor(agent) || Arc::ptr_eq(&activation.agent, agent) {
                    return Err(SubagentError::not_live_descendant(
                        target.as_str(),
                        agent.id().as_str(),
                    ));
                }
                CancelCause::Parent
            }
        };
        if activation.disposal().is_some() {
            return Ok(());
        }
        #[cfg(test)]
        inner.hooks.interrupt_checked();
        // The child is host code: a panic of its `cancel` is the interrupt's typed failure,
        // never an unwind into the caller (a tool call, a signal handler).
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            activation.agent.cancel(cause, CancelOptions { keep_inbox: true });
        }))
        .map_err(|payload| {
            SubagentError::interrupt_failed(target.as_str(), &agent::bus::panic_message(&*payload))
        })
    }
}
