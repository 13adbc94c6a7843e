//! Agent-level notifications and the typed hooks a runtime calls (spec §8.7).
//!
//! The reference's "waterfall"/"serial" dispatch modes become typed traits here: a pre-step
//! [`PreStepInterceptor`] chain returning [`PreStepDecision`], and serial
//! [`TurnStoppingHook`]s. Plain notifications are [`AgentEvent`]s on an
//! [`EventBus`](crate::bus::EventBus).

use async_trait::async_trait;

use crate::agent::{AgentRef, AgentStatus};
use crate::bus::{BoxError, Carried};
use crate::ids::{MessageId, SessionId};
use crate::message::Message;
use crate::model::LlmFailure;
use crate::signal::Signal;

/// How a session came to be driven, for `agent/session-start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionStartSource {
    /// A fresh creation.
    Startup,
    /// A resumed session.
    Resume,
}

/// A notification about one agent (its carrier).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AgentEvent {
    /// `agent/status`: the public status changed (never the same value twice in a row).
    Status {
        /// The agent.
        agent: SessionId,
        /// The new status.
        status: AgentStatus,
    },
    /// `agent/created`: the agent was published.
    Created {
        /// The agent.
        agent: SessionId,
    },
    /// `agent/session-start`.
    SessionStart {
        /// The agent.
        agent: SessionId,
        /// Startup or resume.
        source: SessionStartSource,
    },
    /// `agent/disposed`: the agent left the registry.
    Disposed {
        /// The agent.
        agent: SessionId,
    },
    /// `agent/error`: a turn ended with an error.
    Error {
        /// The agent.
        agent: SessionId,
        /// The failure.
        failure: LlmFailure,
    },
    /// `agent/inbox/claimed`: a pending message was claimed by a turn.
    InboxClaimed {
        /// The agent.
        agent: SessionId,
        /// The claimed message.
        message: MessageId,
        /// The claiming turn.
        turn: u64,
    },
    /// `agent/inbox/inserted`.
    InboxInserted {
        /// The agent.
        agent: SessionId,
        /// The inserted message.
        message: MessageId,
    },
    /// `agent/inbox/discarded`: pending messages were cancelled.
    InboxDiscarded {
        /// The agent.
        agent: SessionId,
        /// The cancelled messages.
        messages: Vec<MessageId>,
    },
}

impl AgentEvent {
    /// The agent this event is about.
    pub fn agent(&self) -> &SessionId {
        match self {
            Self::Status { agent, .. }
            | Self::Created { agent }
            | Self::SessionStart { agent, .. }
            | Self::Disposed { agent }
            | Self::Error { agent, .. }
            | Self::InboxClaimed { agent, .. }
            | Self::InboxInserted { agent, .. }
            | Self::InboxDiscarded { agent, .. } => agent,
        }
    }
}

impl Carried for AgentEvent {
    fn carrier(&self) -> Option<&SessionId> {
        Some(self.agent())
    }
}

/// The decision of the pre-step chain.
#[derive(Clone, Debug, PartialEq)]
pub enum PreStepDecision {
    /// Enter these messages into the step (default: the claimed batch plus any snapshot).
    Enter(Vec<Message>),
    /// Reject the step: the turn ends `blocked` and the driver stops.
    Reject,
}

/// What a pre-step interceptor sees.
pub struct PreStep<'a> {
    /// The agent about to step.
    pub agent: &'a AgentRef,
    /// The open turn.
    pub turn: u64,
    /// The step about to open.
    pub step: u64,
    /// The step's cancellation.
    pub signal: &'a Signal,
}

/// A link in the `agent/pre-step` chain.
///
/// # Contract
/// * **Order.** Called once per step, on the agent's driver task, before `step/start`.
///   Interceptors run one at a time in registration order — global and agent-scoped ones
///   interleaved by when they were added, over the list as it was when the pre-step began; each
///   receives the decision proposed so far and returns the decision to pass on.
/// * **Decisions.** [`Reject`](PreStepDecision::Reject) ends the turn `blocked` and stops the
///   driver; the claimed batch, already spliced out of the inbox, is discarded. Entering nothing
///   on a turn's first step closes the turn `completed` without a step.
/// * **Effects.** Interceptors may append to the agent's session (the driver writes nothing
///   between the claim and `step/start` that would conflict) and deliver to the agent, but must
///   not wait for it to become idle: its driver is waiting for them.
/// * **Cancellation.** Each call is raced against the step's signal (also in
///   [`PreStep::signal`]): once it fires the future is dropped (after at most one more poll) and
///   the turn ends `aborted`.
/// * **Errors and panics.** `Err` ends the turn with an `error` and no model call; so does a
///   panic, which the driver contains.
#[async_trait]
pub trait PreStepInterceptor: Send + Sync + 'static {
    /// Inspects or replaces the proposed decision.
    async fn pre_step(
        &self,
        step: PreStep<'_>,
        proposed: PreStepDecision,
    ) -> Result<PreStepDecision, BoxError>;
}

/// A serial `agent/turn-stopping` listener: called when a turn is about to close with an empty
/// `next-step` list; it may [`steer`](crate::Agent::steer) to force another step.
///
/// # Contract
/// * **When.** On the agent's driver task, after a step that would end the turn closed (a
///   `completed` or `max-tokens` ending), so possibly several times per turn. Never for a turn
///   that ends blocked, aborted or with an error, or that opened no step.
/// * **Order.** One at a time, in registration order (global and agent-scoped hooks interleaved
///   by when they were added); a steer from any of them makes the turn take another step.
/// * **Cancellation.** Each call is raced against `signal`, the turn's: once it fires the future
///   is dropped (after at most one more poll) and the turn ends `aborted`.
/// * **Errors and panics.** `Err` — or a panic, which the driver contains — ends the turn with an
///   `error`; it is not merely logged. A hook must not wait for the agent to become idle: its
///   driver is waiting for the hook.
#[async_trait]
pub trait TurnStoppingHook: Send + Sync + 'static {
    /// Called before the turn closes.
    async fn turn_stopping(&self, agent: &AgentRef, turn: u64, signal: &Signal) -> Result<(), BoxError>;
}
