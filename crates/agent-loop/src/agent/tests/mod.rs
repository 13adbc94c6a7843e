//! Tests of the agent: inbox, delivery, cancellation, status and the driver (spec §8).
//! Each cites the checklist ID it ports (`spec/agent-spine.md` §16).

mod delivery;
mod driver;
mod sweep;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;

use agent::bus::BoxError;
use agent::{
    Agent, AgentRef, CancelCause, CancelOptions, EventData, PreStep, PreStepDecision, PreStepInterceptor,
    Signal, TurnEndReason, TurnStoppingHook,
};

use crate::runtime::testkit::*;

pub(super) fn keep() -> CancelOptions {
    CancelOptions { keep_inbox: true }
}

pub(super) fn aborted(cause: CancelCause) -> TurnEndReason {
    TurnEndReason::Aborted { reason: cause }
}

pub(super) fn splices(agent: &dyn Agent) -> Vec<agent::InboxSplice> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::InboxSpliced(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

/// An interceptor built from a closure over the proposed decision (synchronous body).
pub(super) struct PreStepFn<F>(pub(super) F);

#[async_trait]
impl<F> PreStepInterceptor for PreStepFn<F>
where
    F: Fn(&PreStep<'_>, PreStepDecision) -> Result<PreStepDecision, BoxError> + Send + Sync + 'static,
{
    async fn pre_step(
        &self,
        step: PreStep<'_>,
        proposed: PreStepDecision,
    ) -> Result<PreStepDecision, BoxError> {
        (self.0)(&step, proposed)
    }
}

/// An interceptor that waits for the step's signal, then passes the decision on.
pub(super) struct BlockUntilCancelled(pub(super) Arc<AtomicUsize>);

#[async_trait]
impl PreStepInterceptor for BlockUntilCancelled {
    async fn pre_step(
        &self,
        step: PreStep<'_>,
        proposed: PreStepDecision,
    ) -> Result<PreStepDecision, BoxError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        step.signal.cancelled().await;
        Ok(proposed)
    }
}

/// A turn-stopping hook that steers `text` the first `times` times it is called.
pub(super) struct SteerOnStop {
    pub(super) text: &'static str,
    pub(super) left: AtomicUsize,
}

#[async_trait]
impl TurnStoppingHook for SteerOnStop {
    async fn turn_stopping(&self, agent: &AgentRef, _turn: u64, _signal: &Signal) -> Result<(), BoxError> {
        if self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            agent.steer(user(self.text))?;
        }
        Ok(())
    }
}
