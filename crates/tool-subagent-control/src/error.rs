//! [`ControlToolError`]: why loading a control plugin failed. Failures of a tool *call* reach
//! the model as tool errors instead (see [`model_text`](crate::model_text) and the seam's
//! messages).

use subagent::agent::tools::ToolRegistryError;

/// A load failure of [`SubagentControlPlugin`](crate::SubagentControlPlugin) or
/// [`ListAgentsPlugin`](crate::ListAgentsPlugin). Nothing stays registered after one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlToolError {
    /// The tool registry refused a tool (for example a second `send_message` in the global
    /// layer: the tools are registered once per host, not per provider).
    #[error(transparent)]
    Register(#[from] ToolRegistryError),
}
