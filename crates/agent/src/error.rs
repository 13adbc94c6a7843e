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

/// Renders an error with its whole cause chain: the outermost message first, each cause appended
/// with `": "`, skipping a cause whose text the rendering already holds (wrappers that embed
/// their cause's text, as `"opening x: permission denied"` over `"permission denied"`, would
/// otherwise print it twice). An empty message renders as `<empty error>`; a chain longer than
/// 64 causes (a pathological cycle) ends in `<cause chain truncated>`.
///
/// For diagnostics only (messages, notices, logs): never parse the result, route on types or
/// codes.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    fn text(e: &dyn std::error::Error) -> String {
        let s = e.to_string();
        if s.is_empty() {
            "<empty error>".to_owned()
        } else {
            s
        }
    }
    let mut out = text(error);
    let mut current = error.source();
    let mut budget = 64usize;
    while let Some(cause) = current {
        if budget == 0 {
            out.push_str(": <cause chain truncated>");
            break;
        }
        budget -= 1;
        let t = text(cause);
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        current = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Plain(&'static str);

    #[derive(Debug, thiserror::Error)]
    #[error("{msg}")]
    struct Wrapped {
        msg: &'static str,
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    }

    fn wrap(msg: &'static str, cause: impl std::error::Error + Send + Sync + 'static) -> Wrapped {
        Wrapped {
            msg,
            cause: Box::new(cause),
        }
    }

    /// Every cause is rendered once, outermost first; a cause whose text a wrapper already
    /// embeds, or repeats, is not printed again; an empty message is named.
    #[test]
    fn the_chain_renders_each_cause_once() {
        let err = wrap("inspect failed", wrap("reading the log", Plain("disk gone")));
        assert_eq!(error_chain(&err), "inspect failed: reading the log: disk gone");
        assert_eq!(error_chain(&wrap("same", Plain("same"))), "same");
        let embedding = wrap("opening x: permission denied", Plain("permission denied"));
        assert_eq!(error_chain(&embedding), "opening x: permission denied");
        assert_eq!(error_chain(&Plain("")), "<empty error>");
        assert_eq!(error_chain(&wrap("outer", Plain(""))), "outer: <empty error>");
    }

    /// An error that is its own source renders a bounded chain.
    #[test]
    fn a_cyclic_chain_is_truncated() {
        #[derive(Debug)]
        struct Cycle(u32);
        impl std::fmt::Display for Cycle {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "level {}", self.0)
            }
        }
        static LEVELS: [Cycle; 2] = [Cycle(0), Cycle(1)];
        impl std::error::Error for Cycle {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&LEVELS[(self.0 as usize + 1) % 2])
            }
        }
        let rendered = error_chain(&LEVELS[0]);
        assert_eq!(rendered, "level 0: level 1: <cause chain truncated>");
    }
}
