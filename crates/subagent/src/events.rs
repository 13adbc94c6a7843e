//! Lifecycle events of the seam (spec §2.13).

use std::fmt;
use std::sync::Arc;

use agent::{Carried, ContentBlock, SessionId};

use crate::provider::SubagentProvider;
use crate::result::StopReason;

/// `subagent/start`: a one-shot run (or continuable epoch) became visible.
#[derive(Clone, Debug, PartialEq)]
pub struct SubagentRunInfo {
    /// Service-minted run id (unique per run or epoch; never derived from names).
    pub run_id: String,
    /// The provider name recorded when the child was created.
    pub provider: String,
    /// The run id (local: the child session id).
    pub id: SessionId,
    /// Whether the run had a local agent when `start` fulfilled.
    pub local: bool,
    /// The delegating parent (the event's carrier).
    pub parent: SessionId,
}

/// `subagent/end`: a run settled.
#[derive(Clone, Debug, PartialEq)]
pub struct SubagentRunEndInfo {
    /// The run's start info.
    pub info: SubagentRunInfo,
    /// Why it ended (`error` when the result failed).
    pub stop_reason: StopReason,
    /// The chosen output; `None` when there is none or the result failed.
    pub last_assistant_message: Option<Vec<ContentBlock>>,
}

/// One seam event.
#[derive(Clone)]
#[non_exhaustive]
pub enum SubagentEvent {
    /// `subagent/provider-added` (uncontained: a failing listener unwinds the registration).
    ProviderAdded(Arc<dyn SubagentProvider>),
    /// `subagent/provider-removed` (contained, unscoped).
    ProviderRemoved(String),
    /// `subagent/start` (contained, scoped by the parent).
    Start(SubagentRunInfo),
    /// `subagent/end` (contained, scoped by the parent).
    End(SubagentRunEndInfo),
}

impl fmt::Debug for SubagentEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ProviderAdded(p) => f.debug_tuple("ProviderAdded").field(&p.name()).finish(),
            Self::ProviderRemoved(n) => f.debug_tuple("ProviderRemoved").field(n).finish(),
            Self::Start(i) => f.debug_tuple("Start").field(i).finish(),
            Self::End(i) => f.debug_tuple("End").field(i).finish(),
        }
    }
}

impl SubagentEvent {
    /// The spec's event name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::ProviderAdded(_) => "subagent/provider-added",
            Self::ProviderRemoved(_) => "subagent/provider-removed",
            Self::Start(_) => "subagent/start",
            Self::End(_) => "subagent/end",
        }
    }
}

impl Carried for SubagentEvent {
    fn carrier(&self) -> Option<&SessionId> {
        match self {
            Self::Start(i) => Some(&i.parent),
            Self::End(e) => Some(&e.info.parent),
            _ => None,
        }
    }
}
