//! Appending the resolved `subagent/descriptor` inside the child's first turn (spec
//! `inprocess-providers.md` §3.2 step 6.4).
//!
//! The driver registers a [`DescriptorAppend`] pre-step interceptor on the child's scope during
//! setup. The first time the decision reaching it is `Enter`, it appends the descriptor event to
//! the child's session. Because the driver starts the child's turn, this lands after
//! `turn/start` and the claim splice and before `step/start` and the first model request. If the
//! first step is rejected no descriptor is written (a later entered step writes it).
//!
//! Ordering note (the Rust hook model): interceptors run global first, then the agent's scope in
//! registration order, each seeing the decision proposed so far. This one is registered during
//! the unpublished setup, so every global interceptor and every scoped one the setup registered
//! before it has already decided; only a child-scoped interceptor registered *after* publication
//! could still turn an `Enter` it saw into a rejection.

use async_trait::async_trait;
use parking_lot::Mutex;
use subagent::agent::EventData;
use subagent::agent::bus::BoxError;
use subagent::agent::hooks::{PreStep, PreStepDecision, PreStepInterceptor};

/// A one-shot pre-step interceptor that appends a descriptor event at the first entered step.
///
/// Owned by the child's scope through its registration guard; dropped (and never fired again)
/// when the child is disposed.
#[derive(Debug)]
pub struct DescriptorAppend {
    /// The event until it is appended (taken, not cloned, by the first entered step).
    event: Mutex<Option<EventData>>,
}

impl DescriptorAppend {
    /// An interceptor that will append `event` (the resolved request's descriptor event).
    pub fn new(event: EventData) -> Self {
        Self {
            event: Mutex::new(Some(event)),
        }
    }

    /// Whether the descriptor was appended.
    pub fn appended(&self) -> bool {
        self.event.lock().is_none()
    }
}

#[async_trait]
impl PreStepInterceptor for DescriptorAppend {
    async fn pre_step(
        &self,
        step: PreStep<'_>,
        proposed: PreStepDecision,
    ) -> Result<PreStepDecision, BoxError> {
        if matches!(proposed, PreStepDecision::Enter(_)) {
            let event = self.event.lock().take();
            if let Some(event) = event {
                step.agent.session().record(event, None)?;
            }
        }
        Ok(proposed)
    }
}
