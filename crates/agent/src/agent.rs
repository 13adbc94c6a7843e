//! The [`Agent`] contract and its unique owner, [`AgentHandle`] (spec §8, §9.4).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::AgentError;
use crate::event::InboxTarget;
use crate::header::MAX_SAFE_INTEGER;
use crate::ids::{MessageId, SessionId};
use crate::message::Message;
use crate::registration::Scope;
use crate::session::Session;
use crate::signal::CancelCause;

/// A shared reference to a live agent. "Exact live" means `Arc::ptr_eq` with the registry's
/// current entry for that id.
pub type AgentRef = Arc<dyn Agent>;

/// Options fixed at an agent's creation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentOptions {
    /// Provider route for model requests (shared: every request and message of the agent
    /// names it without a copy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Arc<str>>,
    /// Model route for model requests (shared like `provider`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Arc<str>>,
    /// Output-token cap; when present, a positive safe integer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The subagent family's extension: this agent's delegation depth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagent_depth: Option<u64>,
    /// Further extension fields, kept verbatim.
    #[serde(flatten)]
    pub extensions: Map<String, Value>,
}

impl AgentOptions {
    /// Validates the options: `maxTokens` and `subagentDepth` must be safe integers, `maxTokens`
    /// positive.
    pub fn validate(&self) -> Result<(), AgentError> {
        if let Some(n) = self.max_tokens
            && (n == 0 || n > MAX_SAFE_INTEGER)
        {
            return Err(AgentError::InvalidOptions(format!(
                "maxTokens must be a positive safe integer, got {n}"
            )));
        }
        if let Some(n) = self.subagent_depth
            && n > MAX_SAFE_INTEGER
        {
            return Err(AgentError::InvalidOptions(format!(
                "subagentDepth must be a non-negative safe integer, got {n}"
            )));
        }
        Ok(())
    }
}

/// The public status of an agent. Maintenance folds into `Idle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentStatus {
    /// No driver is running.
    Idle,
    /// A driver is draining the inbox (possibly several turns).
    Running,
}

/// A snapshot of an agent's pending inbox.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InboxSnapshot {
    /// Queued prompts, one per turn, in order.
    pub next_turn: Vec<Message>,
    /// Steering and injected context for the nearest step boundary, in order.
    pub next_step: Vec<Message>,
}

impl InboxSnapshot {
    /// Whether both lists are empty.
    pub fn is_empty(&self) -> bool {
        self.next_turn.is_empty() && self.next_step.is_empty()
    }
}

/// Options for [`Agent::cancel`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CancelOptions {
    /// Keep unclaimed pending work (and park it for the next wake) instead of clearing the inbox.
    pub keep_inbox: bool,
}

/// A live agent: an id, fixed options, a session log, an inbox and a driver.
///
/// # Contract
/// * **Sharing.** Agents are shared as [`AgentRef`]; anyone may keep a clone. Holding an
///   `AgentRef` does not keep the agent *live*: liveness ends when its [`AgentHandle`] is
///   disposed; a stale `AgentRef` still answers reads but rejects new work with
///   [`AgentError::Disposed`].
/// * **Delivery.** [`send`](Agent::send) is the primitive; `followup`/`steer`/`inject` are fixed
///   presets. Every inbox mutation is logged (`agent/inbox/spliced`) before the in-memory inbox
///   changes. A wake delivered to an idle, published agent starts the driver **synchronously**:
///   when `send` returns, the agent is `running`, `turn/start` and the first claim splice are in
///   the log. Before publication (during the creation's setup window) wakes are held until the
///   agent is published. A waking send that arrives after the active turn was cancelled (for any
///   cause but `disposed`) is queued `next-turn` whatever its target, and runs once the aborted
///   turn has ended. Delivery never awaits, so it can be called from synchronous listeners; it
///   appends to the session and emits [`AgentEvent`](crate::AgentEvent)s on the calling thread.
/// * **Cancellation.** [`cancel`](Agent::cancel) aborts the active turn with a first-wins cause
///   and returns without waiting for it (await [`when_idle`](Agent::when_idle)). Unless
///   `keep_inbox`, it also durably clears the inbox and drops any latched wake — with or without
///   an active turn; a clear that cannot be logged is only reported through `tracing`. With no
///   active turn nothing is aborted and nothing is armed against later work.
/// * **Idleness.** [`when_idle`](Agent::when_idle) resolves when no driver remains, following
///   replacement work started before the observed driver retired. The returned future owns what
///   it needs (`'static`) and is cancel-safe.
/// * **Concurrency.** Every method takes `&self` and may be called from any thread, concurrently,
///   and from [`AgentEvent`](crate::AgentEvent) listeners the agent's own calls trigger — but not
///   from a [`SessionObserver`](crate::SessionObserver) of its own session, whose appends fail
///   with [`LogError::Reentrant`](crate::LogError::Reentrant). One driver runs at a time.
/// * **Errors.** `send` fails with [`AgentError::Disposed`] on a non-live agent,
///   [`AgentError::DuplicateMessage`] for an id already pending, or [`AgentError::Log`] when the
///   splice cannot be appended; nothing changes then. The reference agent also refuses a waking
///   `send` from a thread without a tokio runtime. Failures inside a turn are not returned: they
///   end the turn (`turn/end` with an `error`) and emit
///   [`AgentEvent::Error`](crate::AgentEvent::Error).
/// * **Panics.** The reference driver contains a panic inside a turn (hook, model adapter, tool
///   body, prompt renderer) as that turn's `error`; the agent stays usable.
pub trait Agent: Send + Sync + 'static {
    /// The agent's id (equal to its session's id).
    fn id(&self) -> &SessionId;

    /// The options fixed at creation.
    fn options(&self) -> &AgentOptions;

    /// The agent's session log.
    fn session(&self) -> &Arc<Session>;

    /// The agent's registration scope.
    fn scope(&self) -> &Arc<Scope>;

    /// Queues `message` on `target`, waking the driver when `wake` is set.
    fn send(&self, message: Message, target: InboxTarget, wake: bool) -> Result<MessageId, AgentError>;

    /// One later FIFO turn whose sole ordinary message is `message` (`next-turn`, wakes).
    fn followup(&self, message: Message) -> Result<MessageId, AgentError> {
        self.send(message, InboxTarget::NextTurn, true)
    }

    /// Enter at the nearest step boundary of the current turn; an idle agent starts a turn
    /// (`next-step`, wakes).
    fn steer(&self, message: Message) -> Result<MessageId, AgentError> {
        self.send(message, InboxTarget::NextStep, true)
    }

    /// Model-facing context for the next pre-step; does not wake an idle agent (`next-step`).
    fn inject(&self, message: Message) -> Result<MessageId, AgentError> {
        self.send(message, InboxTarget::NextStep, false)
    }

    /// Removes a pending message from either list as a logged cancellation. Returns whether it
    /// was pending.
    fn remove_pending(&self, id: &MessageId) -> Result<bool, AgentError>;

    /// A snapshot of the pending inbox.
    fn inbox(&self) -> InboxSnapshot;

    /// Cancels the active activity with `cause` (first wins) — see the trait contract.
    fn cancel(&self, cause: CancelCause, options: CancelOptions);

    /// The public status.
    fn status(&self) -> AgentStatus;

    /// Resolves when the agent is idle (immediately when nothing is active).
    fn when_idle(&self) -> BoxFuture<'static, ()>;

    /// Whether the agent is still live (not disposed or being disposed).
    fn is_live(&self) -> bool;
}

/// Runs an agent's disposal. Implemented by runtimes; called through [`AgentHandle`].
///
/// # Contract
/// * **Memoized.** Every call returns a future for the same single teardown, and all of them
///   complete together, at quiescence. Calls may come concurrently, from any thread, and from
///   listeners the teardown itself triggers.
/// * **Progress without polling.** The returned future may be dropped unpolled:
///   [`AgentHandle`]'s drop spawns it on the current tokio runtime, if there is one, and drops it
///   otherwise. Start the teardown in `dispose` itself. The reference runtime does: the call
///   marks the agent disposing and cancels its turn (cause `disposed`) before returning, and a
///   first future dropped unfinished hands the rest to a runtime task — on the current tokio
///   runtime, or, dropped outside any, on the one it created its agents on.
/// * **Panics.** The returned futures never panic in the reference runtime: each teardown step
///   that runs host code (owned agents' teardowns, the [`Jobs`](crate::Jobs) service, the undo
///   closures of the agent's scope) is contained, logged with `tracing::warn!`, and the teardown
///   goes on; a panic while the teardown itself is polled is logged too, the agent is released
///   (scope disposed, unregistered, session removed) and every current and later future
///   completes.
pub trait Disposer: Send + Sync + 'static {
    /// Starts (or joins) the teardown and resolves when the agent is quiescent: its turn ended,
    /// its scope unwound, it and its session unregistered.
    fn dispose(&self) -> BoxFuture<'static, ()>;
}

/// The unique owner of an agent's life. Not `Clone`.
///
/// [`dispose`](AgentHandle::dispose) is the memoized quiescence transaction (spec §9.4): repeated
/// or concurrent calls, owner disposal and runtime teardown all await the same completion.
/// Dropping a handle without disposing it starts the same teardown in the background (on the
/// current tokio runtime, if any) and logs a warning; without a tokio runtime only what
/// [`Disposer::dispose`] does before returning happens, and what its dropped future does (the
/// reference runtime's finishes the teardown on the runtime it created the agent on).
pub struct AgentHandle {
    agent: AgentRef,
    disposer: Arc<dyn Disposer>,
    disposed: AtomicBool,
}

impl fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentHandle")
            .field("id", self.agent.id())
            .finish()
    }
}

impl AgentHandle {
    /// Wraps a live agent and its runtime's memoized disposer.
    pub fn new(agent: AgentRef, disposer: Arc<dyn Disposer>) -> Self {
        Self {
            agent,
            disposer,
            disposed: AtomicBool::new(false),
        }
    }

    /// The live agent.
    pub fn agent(&self) -> &AgentRef {
        &self.agent
    }

    /// The agent's id.
    pub fn id(&self) -> &SessionId {
        self.agent.id()
    }

    /// Disposes the agent and resolves at quiescence. Idempotent and memoized.
    pub fn dispose(&self) -> BoxFuture<'static, ()> {
        self.disposed.store(true, Ordering::SeqCst);
        self.disposer.dispose()
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        if self.disposed.load(Ordering::SeqCst) {
            return;
        }
        tracing::warn!(agent = %self.agent.id(), "AgentHandle dropped without dispose(); disposing in the background");
        let fut = self.disposer.dispose();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(fut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_validate_max_tokens() {
        let ok = AgentOptions {
            max_tokens: Some(10),
            ..Default::default()
        };
        ok.validate().unwrap();
        let bad = AgentOptions {
            max_tokens: Some(0),
            ..Default::default()
        };
        assert_eq!(
            bad.validate().unwrap_err().to_string(),
            "invalid agent options: maxTokens must be a positive safe integer, got 0"
        );
    }
}
