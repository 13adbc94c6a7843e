//! The spine's boundary error.

use crate::bus::BoxError;
use crate::header::HeaderError;
use crate::ids::{MessageId, SessionId};
use crate::registration::ScopeInactive;
use crate::session::LogError;
use crate::signal::CancelCause;

/// Errors returned by the host traits ([`Agent`](crate::Agent),
/// [`AgentRuntime`](crate::AgentRuntime), stores and registries).
///
/// Child-level failures (a model error, a refused step) are **values** in the log, not
/// `AgentError`s; this type is for infrastructure faults and invalid requests.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// Invalid session header metadata.
    #[error(transparent)]
    Header(#[from] HeaderError),
    /// A seed or append violated the append contract.
    #[error(transparent)]
    Log(#[from] LogError),
    /// Registering through (or creating from) a disposed scope.
    #[error(transparent)]
    Inactive(#[from] ScopeInactive),
    /// Invalid agent options (for example a `maxTokens` that is not a positive safe integer).
    #[error("invalid agent options: {0}")]
    InvalidOptions(String),
    /// A live agent or session already uses this id.
    #[error("session \"{0}\" already exists")]
    Duplicate(SessionId),
    /// No live or stored session has this id.
    #[error("session \"{0}\" not found")]
    NotFound(SessionId),
    /// A pending message with this id is already queued.
    #[error("message \"{0}\" is already pending in the inbox")]
    DuplicateMessage(MessageId),
    /// The agent is being disposed and takes no new work.
    #[error("agent \"{0}\" is disposed")]
    Disposed(SessionId),
    /// Creation was cancelled before publication.
    #[error("agent \"{id}\" creation aborted: {cause}")]
    CreationAborted {
        /// The agent being created.
        id: SessionId,
        /// The cancellation cause.
        cause: CancelCause,
    },
    /// The setup callback (or commit) failed or panicked; creation was rolled back.
    #[error("agent \"{id}\" setup failed: {source}")]
    Setup {
        /// The agent being created.
        id: SessionId,
        /// The setup error.
        #[source]
        source: BoxError,
    },
    /// The owner scope was disposed during setup.
    #[error("agent \"{0}\" setup aborted: owner disposed during setup")]
    OwnerDisposed(SessionId),
    /// Persistence is not configured or failed.
    #[error("persistence: {0}")]
    Persistence(String),
    /// Any other host failure.
    #[error(transparent)]
    Other(BoxError),
}
