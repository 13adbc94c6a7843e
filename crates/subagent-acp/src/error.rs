//! The crate's typed errors. Messages the spec quotes are reproduced exactly.

use subagent::out_of_process::OutOfProcessError;
use subagent::{SubagentError, SubagentErrorCode};

/// Start was cancelled before the child was published (spec §1.6 steps 1 and 8).
pub const ABORTED_BEFORE_START: &str = "subagent request was aborted before the ACP child started";

/// `session/new` answered without a string `sessionId` (spec §1.6 step 7c).
pub const MISSING_SESSION_ID: &str = "ACP child published without a session id";

/// A configuration rejected at load. `Display` is the full message (`subagent-acp: …`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AcpConfigError {
    /// The full message.
    pub message: String,
}

impl AcpConfigError {
    pub(crate) fn new(message: String) -> Self {
        Self { message }
    }
}

impl From<OutOfProcessError> for AcpConfigError {
    fn from(error: OutOfProcessError) -> Self {
        Self::new(error.message)
    }
}

/// Why loading or registering a provider failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcpRegisterError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] AcpConfigError),
    /// The service refused the registration (for example a duplicate name).
    #[error(transparent)]
    Register(#[from] subagent::service::RegisterError),
}

/// The ACP protocol stage a failure happened in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// `initialize`.
    Initialize,
    /// `session/new`.
    SessionNew,
    /// `session/prompt`.
    Prompt,
    /// The connection itself (transport setup or teardown).
    Connection,
}

impl Stage {
    /// The stage's fixed display name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initialize => "initialize",
            Self::SessionNew => "session-new",
            Self::Prompt => "prompt",
            Self::Connection => "connection",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the child's output broke the connection: an over-long line or any other failed read. The
/// protocol engine reports only that the connection terminated; the connection's reader records
/// the cause when it fails the read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChildOutputError {
    /// The child wrote a line longer than the limit ([`LineLimit`](crate::LineLimit)).
    #[error("the agent wrote a line longer than {max} bytes")]
    LineTooLong {
        /// The limit, in bytes (newline excluded).
        max: usize,
    },
    /// Reading the child's output failed with an I/O error (for example `EIO` from its pipe).
    /// The message is the operating system's (or the reader's) description of the error, never
    /// the child's own output.
    #[error("reading the agent's output failed: {message}")]
    Read {
        /// The error's kind.
        kind: std::io::ErrorKind,
        /// The error's message.
        message: String,
    },
}

/// A failure while starting or running an ACP child.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcpError {
    /// The request signal fired before the child was published.
    #[error("{ABORTED_BEFORE_START}")]
    AbortedBeforeStart,
    /// The child's working directory could not be resolved (nothing was spawned).
    #[error("{0}")]
    Cwd(#[from] OutOfProcessError),
    /// The executable could not be spawned.
    #[error("subagent-acp: failed to spawn {command}: {source}")]
    Spawn {
        /// The configured command.
        command: String,
        /// The operating system's error (shared with the process record that observed it).
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    /// `start` was called outside a tokio runtime (the run's tasks need one).
    #[error("subagent-acp: start must be called inside a tokio runtime")]
    NoRuntime,
    /// The child's stdin or stdout pipe was unavailable after spawning.
    #[error("subagent-acp: the child's stdio pipes are unavailable")]
    Pipes,
    /// `session/new` answered without a session id.
    #[error("{MISSING_SESSION_ID}")]
    MissingSessionId,
    /// A request failed: an error response, a torn pipe, or a child that closed its output.
    #[error("ACP {stage} failed: {source}")]
    Protocol {
        /// The stage.
        stage: Stage,
        /// The protocol engine's error.
        #[source]
        source: agent_client_protocol::Error,
    },
    /// A request failed because the child's output broke the connection (a line longer than the
    /// limit, or a read of its stdout that failed): the cause, not the engine's opaque
    /// terminated connection.
    #[error("ACP {stage} failed: {cause}")]
    ChildOutput {
        /// The stage whose request was pending (or [`Stage::Connection`] before any was sent).
        stage: Stage,
        /// What the child wrote.
        #[source]
        cause: ChildOutputError,
    },
    /// A response could not be understood (for example an unknown stop reason).
    #[error("ACP {stage} response is malformed: {source}")]
    Malformed {
        /// The stage.
        stage: Stage,
        /// The decoding error.
        #[source]
        source: serde_json::Error,
    },
    /// The run was cancelled locally while a request was pending.
    #[error("the ACP run was cancelled")]
    Cancelled,
}

impl AcpError {
    /// The stage the failure belongs to, when it is a protocol-level one.
    pub fn stage(&self) -> Option<Stage> {
        match self {
            Self::Protocol { stage, .. }
            | Self::ChildOutput { stage, .. }
            | Self::Malformed { stage, .. } => Some(*stage),
            Self::MissingSessionId => Some(Stage::SessionNew),
            _ => None,
        }
    }

    /// The start rejection this error becomes: `CANCELLED` for an abort, `PROVIDER_FAILED`
    /// otherwise, with this error's message and the error itself as the source.
    pub fn into_start_error(self) -> SubagentError {
        let code = match self {
            Self::AbortedBeforeStart => SubagentErrorCode::Cancelled,
            _ => SubagentErrorCode::ProviderFailed,
        };
        SubagentError::new(code, self.to_string()).with_source(self)
    }
}
