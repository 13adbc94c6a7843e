//! [`ToolSubagentReportError`]: why configuring, loading, installing or revoking the report tool
//! failed (`acp-and-tools.md` §5.1). These reach the host: a refused load is
//! [`ReportToolPlugin::load`](crate::ReportToolPlugin::load)'s error, a failed installation fails the child's
//! materialization (the seam propagates it to the start or follow-up), a failed revocation is
//! the seam's `ACTIVATION_SETUP_RELEASE_FAILED` cause. Failures of a tool *call* reach the model
//! as tool errors instead (see [`model_text`](crate::model_text)).

use std::fmt;

use agent::AgentError;
use agent::tools::ToolRegistryError;
use subagent::SubagentError;

/// A configuration, load, installation or revocation failure of the report tool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolSubagentReportError {
    /// The configuration is not the documented shape (an unknown key, a `reportDelivery` other
    /// than `next-step` or `quiet`, a non-object).
    #[error("tool-subagent-report: invalid configuration: {0}")]
    InvalidConfig(String),
    /// [`ReportToolPlugin::load`](crate::ReportToolPlugin::load) was refused: a copy of the
    /// package is already loaded over this continuation manager (its contribution holds
    /// [`SETUP_KEY`](crate::SETUP_KEY)). Nothing was registered; the loaded copy is unaffected.
    /// The source is the seam's `SETUP_ALREADY_REGISTERED` refusal.
    #[error("tool-subagent-report: already loaded over this continuation manager: {0}")]
    AlreadyLoaded(#[source] SubagentError),
    /// The context handed to the installer is the global one: the report tool exists only in a
    /// child's own scope.
    #[error(
        "tool-subagent-report: the report tool installs only into an agent's scoped context, never the global one"
    )]
    NotScoped,
    /// The child's scope refused the installation (it was disposed); nothing stays registered.
    #[error("tool-subagent-report: cannot install the report tool into this scope: {0}")]
    Scope(#[source] AgentError),
    /// The tool registry refused the tool (for example another `report` in the child's own
    /// layer); the guidance section was rolled back.
    #[error("tool-subagent-report: {}", registry_refusal(.0))]
    Register(ToolRegistryError),
    /// The tool registry panicked while registering the tool (contained); the guidance section
    /// was rolled back.
    #[error("tool-subagent-report: the tool registry panicked while registering the report tool: {0}")]
    RegisterPanicked(String),
    /// Registering the tool failed, and rolling back the guidance section failed too. Both are
    /// kept, in that order; the section's guard was consumed, so nothing stays registered.
    #[error(
        "tool-subagent-report: failed to register the report tool and roll back its prompt guidance: {}; {rollback}",
        unprefixed(registration)
    )]
    RollbackFailed {
        /// Why the tool was not registered.
        registration: Box<ToolSubagentReportError>,
        /// Why removing the guidance section failed.
        rollback: UndoFailure,
    },
    /// Revoking an installation failed: both removals were attempted (the tool first, then the
    /// section) and these failed, in that order. Both guards were consumed regardless: each
    /// undo ran exactly once, and the installation counts as revoked.
    #[error(
        "tool-subagent-report: failed to revoke the report tool and prompt registrations: {}",
        join(failures)
    )]
    RevokeFailed {
        /// The failed removals, in attempt order.
        failures: Vec<UndoFailure>,
    },
}

impl ToolSubagentReportError {
    /// The failures this error aggregates, in order: for [`RollbackFailed`](Self::RollbackFailed)
    /// the registration's then the rollback's message, for [`RevokeFailed`](Self::RevokeFailed)
    /// each failed removal's; a single-cause error yields its own message alone.
    pub fn failures(&self) -> Vec<String> {
        match self {
            Self::RollbackFailed {
                registration,
                rollback,
            } => vec![registration.to_string(), rollback.to_string()],
            Self::RevokeFailed { failures } => failures.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        }
    }
}

/// The model-neutral text of a registry refusal; a duplicate name reads "already registered in
/// this scope" (the report tool only ever registers in one agent's own layer).
fn registry_refusal(error: &ToolRegistryError) -> String {
    match error {
        ToolRegistryError::Duplicate(name) => format!("tool \"{name}\" is already registered in this scope"),
        other => format!("the tool registry refused the report tool: {other}"),
    }
}

/// The crate's own prefix, which a nested error must not repeat inside an aggregate's message.
const PREFIX: &str = "tool-subagent-report: ";

/// `error`'s message without the crate's prefix (the aggregate around it carries it once).
fn unprefixed(error: &ToolSubagentReportError) -> String {
    let message = error.to_string();
    match message.strip_prefix(PREFIX) {
        Some(rest) => rest.to_owned(),
        None => message,
    }
}

fn join(failures: &[UndoFailure]) -> String {
    failures
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Which registration of an installation an [`UndoFailure`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstalledPart {
    /// The `report` tool in the child's layer.
    Tool,
    /// The `tool:report` guidance section in the child's layer.
    Section,
}

impl fmt::Display for InstalledPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tool => "the report tool",
            Self::Section => "the report guidance section",
        })
    }
}

/// Removing one registration failed: its guard's undo panicked (a host registry's removal, or
/// a listener it notifies, failed). The guard was consumed; the panic was contained.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("removing {part} failed: {message}")]
pub struct UndoFailure {
    /// The registration whose removal failed.
    pub part: InstalledPart,
    /// The panic's message.
    pub message: String,
}
