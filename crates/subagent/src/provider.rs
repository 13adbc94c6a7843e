//! The provider contract and the one-shot start request (spec §2.4–§2.6).

use std::fmt;

use agent::{AgentOptions, AgentRef, ContentBlock, EventData, Signal};
use async_trait::async_trait;
use serde_json::Value;

use crate::capabilities::{
    ContinuableCreateRequest, ContinuableCreateSpec, RequestedCapabilities, SubagentCapabilities,
};
use crate::composition::ToolFilter;
use crate::descriptor::SubagentDescriptor;
use crate::error::SubagentError;
use crate::run::SubagentRun;

/// A caller's one-shot delegation request.
///
/// `signal` is the single cancellation channel before **and** after publication: cancelling it
/// before `start` fulfils makes `start` reject after rollback; cancelling it afterwards aborts the
/// child's remaining work and its result resolves `aborted`.
#[derive(Clone)]
pub struct SubagentStartRequest {
    /// Content delivered as the child's user message.
    pub prompt: Vec<ContentBlock>,
    /// The delegating agent (lineage, cwd and depth come from its durable state).
    pub parent: AgentRef,
    /// The request's cancellation.
    pub signal: Signal,
    /// Short durable display label.
    pub label: Option<String>,
    /// Per-child route overrides.
    pub agent_options: Option<AgentOptions>,
    /// Object-rooted output schema (requires `output_schema`).
    pub output_schema: Option<Value>,
    /// Absolute cap on the child's depth, as untrusted JSON (requires `depth_limit`); validated
    /// as a non-negative safe integer.
    pub max_depth: Option<Value>,
    /// Tool visibility filter (requires `tool_filter`).
    pub tool_filter: Option<ToolFilter>,
    /// Per-child persona (requires `persona`); an empty string is a valid explicit shadow.
    pub persona: Option<String>,
}

impl fmt::Debug for SubagentStartRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubagentStartRequest")
            .field("parent", self.parent.id())
            .field("label", &self.label)
            .field("max_depth", &self.max_depth)
            .finish_non_exhaustive()
    }
}

impl SubagentStartRequest {
    /// A request with only the required fields.
    pub fn new(prompt: Vec<ContentBlock>, parent: AgentRef, signal: Signal) -> Self {
        Self {
            prompt,
            parent,
            signal,
            label: None,
            agent_options: None,
            output_schema: None,
            max_depth: None,
            tool_filter: None,
            persona: None,
        }
    }

    /// Which capability-gated fields are present.
    pub fn requested_capabilities(&self) -> RequestedCapabilities {
        RequestedCapabilities {
            output_schema: self.output_schema.is_some(),
            max_depth: self.max_depth.is_some(),
            tool_filter: self.tool_filter.is_some(),
            persona: self.persona.is_some(),
        }
    }
}

/// The request a provider receives: the caller's fields (a new value; the caller's request is
/// not reused), the validated depth cap and the resolved durable descriptor.
#[derive(Clone, Debug)]
pub struct ResolvedSubagentStartRequest {
    /// The caller's request.
    pub request: SubagentStartRequest,
    /// `max_depth` validated as a non-negative safe integer.
    pub max_depth: Option<u64>,
    /// The one-shot descriptor (`{version: 2, mode: one-shot, provider, label?}`).
    pub descriptor: SubagentDescriptor,
    /// The descriptor as the log-only event a session-backed provider appends inside the child's
    /// first turn, before its first model request.
    pub descriptor_event: EventData,
}

/// The optional continuable capability: its presence on a provider *is* the capability.
///
/// # Contract
/// * **Data only.** The continuation manager calls
///   [`prepare_continuable`](PrepareContinuable::prepare_continuable) once per continuable
///   start, after admission, then creates the child itself through the host's
///   [`AgentRuntime`](agent::AgentRuntime) — the provider's `start` is not involved. Return
///   detached data only: create no agent, session or registration, since nothing would release
///   it.
/// * **Cancellation.** Observe `request.signal`. The manager awaits the preparation without
///   racing it and checks the signal afterwards (a cancelled start then rejects and the data is
///   dropped); its caller may also drop the start future, and the preparation with it.
/// * **Concurrency.** Called on the starting caller's task, concurrently for distinct children.
/// * **Errors** reject the start unchanged; nothing was created yet. A panic in `continuable()`
///   or in the preparation rejects it with `PROVIDER_FAILED` naming the panic.
#[async_trait]
pub trait PrepareContinuable: Send + Sync + 'static {
    /// Prepares detached data for a continuable child (for example a fork seed).
    async fn prepare_continuable(
        &self,
        request: ContinuableCreateRequest,
    ) -> Result<ContinuableCreateSpec, SubagentError>;
}

/// A named way of running a child.
///
/// # Contract
/// * `start` is one-shot only. The service has validated capabilities, depth and schema and
///   resolved the descriptor. A session-backed implementation appends
///   [`ResolvedSubagentStartRequest::descriptor_event`] inside the child's initial turn, before
///   its first model request.
/// * **Publication boundary = fulfilment.** Before `start` returns `Ok`, the provider owns all
///   setup and must cancel, roll back and quiesce every unpublished resource on every failure
///   path (including cancellation of the request signal) before returning `Err`.
/// * **Dropped start.** The service awaits `start` on its caller's task, and that caller may drop
///   the future at any await (the tool pipeline drops a cancelled call's body): treat a drop as
///   a cancellation and release unpublished resources in `Drop` or on a task. The in-process
///   providers get this from [`AgentRuntime::create`](agent::AgentRuntime::create), which rolls
///   back when its future is dropped.
/// * After `Ok`, the caller owns the run and must call [`SubagentRun::dispose`].
/// * The service may call one provider concurrently for distinct children; each start owns its
///   own state and cancellation path.
/// * `name` must not change: the service looks providers up by name on every call.
///   `capabilities` is read at every start.
/// * **Errors.** A [`SubagentError`] from `start` reaches the service's caller unchanged, and no
///   lifecycle event is emitted for it.
#[async_trait]
pub trait SubagentProvider: Send + Sync + 'static {
    /// Unique registry name.
    fn name(&self) -> &str;

    /// Start-time, one-shot capabilities.
    fn capabilities(&self) -> SubagentCapabilities;

    /// Whether the child sees the parent's completed-turn history (descriptive only).
    fn inherits_parent_context(&self) -> bool;

    /// Starts a one-shot child.
    async fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> Result<Box<dyn SubagentRun>, SubagentError>;

    /// The continuable capability, when present.
    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        None
    }
}
