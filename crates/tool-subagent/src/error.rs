//! [`ToolSubagentError`]: why loading or mounting a delegation tool failed (`acp-and-tools.md`
//! §3.2). These reach the host (load) or the provider's registrar (a late mount failure
//! unwinds that provider's registration); failures of a tool *call* reach the model as tool
//! errors instead (see [`model_text`](crate::model_text)).

use subagent::agent::tools::ToolRegistryError;
use subagent::{DepthError, SubagentError};

/// A configuration, mount or registration failure of one tool instance.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolSubagentError {
    /// The configuration is not the documented shape (unknown key, wrong type, missing
    /// `provider`).
    #[error("tool-subagent: invalid configuration: {0}")]
    InvalidConfig(String),
    /// `maxDepth` is neither a non-negative safe integer nor `provider-managed`:
    /// `subagent maxDepth must be a non-negative safe integer`.
    #[error(transparent)]
    InvalidMaxDepth(#[from] DepthError),
    /// `agentOptions.maxTokens` is not a positive safe integer.
    #[error("tool-subagent: `agentOptions.maxTokens` must be a positive safe integer")]
    InvalidMaxTokens,
    /// `toolName` is empty.
    #[error("tool-subagent: `toolName` must be a non-empty string")]
    EmptyToolName,
    /// An explicit `toolFilter` names neither list.
    #[error(
        "tool-subagent: `toolFilter` is configured but names neither `allow` nor `deny` — remove the key or fill the filter"
    )]
    EmptyToolFilter,
    /// A numeric `maxDepth` over a provider without the `depthLimit` capability.
    #[error(
        "tool-subagent: provider \"{provider}\" cannot enforce maxDepth (no depthLimit capability) — set maxDepth: 'provider-managed' to leave the recursion budget to the provider"
    )]
    UnenforceableMaxDepth {
        /// The provider's name.
        provider: String,
    },
    /// `backgroundMode: continuable` over a provider without continuable preparation.
    #[error("tool-subagent: provider \"{provider}\" does not support `backgroundMode: continuable`")]
    ContinuableUnsupported {
        /// The provider's name.
        provider: String,
    },
    /// The provider's own code panicked while the tool was mounting over it (in `name()`,
    /// `capabilities()`, `continuable()` or `inherits_parent_context()`): the seam's
    /// `PROVIDER_FAILED` error naming the provider, the method and the panic. Nothing was
    /// registered.
    #[error(transparent)]
    Provider(SubagentError),
    /// The tool registry refused the tool (for example a duplicate `toolName`).
    #[error(transparent)]
    Register(#[from] ToolRegistryError),
}
