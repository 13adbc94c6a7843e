//! What every control tool body shares: the calling agent and the rendering of a seam refusal.

use subagent::agent::tools::{ToolContext, ToolError};
use subagent::agent::{AgentRef, Services};
use subagent::{SubagentError, error_chain};

/// The calling agent: the registry's current agent for the call's session id, or the tool's
/// "requires a calling agent" refusal `refusal`. A caller that is not registered (a host
/// executing a tool outside any agent, or a session whose agent is gone) has no authority to
/// delegate, deliver, interrupt or list.
pub(crate) fn calling_agent(
    services: &Services,
    ctx: &ToolContext,
    refusal: &'static str,
) -> Result<AgentRef, ToolError> {
    services
        .agents
        .get(ctx.agent())
        .ok_or_else(|| ToolError::failed(refusal))
}

/// A seam refusal as a tool error: the seam's code (`UNAUTHORIZED`, `NOT_RESUMABLE`,
/// `DRAINING`, `CONTINUATION_UNAVAILABLE`, …) and its message with the cause chain.
pub(crate) fn seam_failure(error: &SubagentError) -> ToolError {
    ToolError::new(error.code().as_str(), error_chain(error))
}
