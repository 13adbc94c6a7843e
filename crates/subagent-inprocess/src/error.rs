//! Why an in-process start rejected ([`StartFailure`]), and how that reaches the seam as a
//! [`SubagentError`].
//!
//! A rejected start means nothing was published: the creation transaction rolled back and
//! quiesced before the error was returned. The failure's own text is the message (the spec
//! fixes several: `subagent request was aborted before child publication`,
//! `subagent depth <a> exceeds maxDepth <m>`, `unknown global tool "<name>"; …`) and the typed
//! failure stays reachable as the error's `source` (downcast to [`StartFailure`], then to
//! [`DepthError`] or [`AgentError`]).

use subagent::agent::AgentError;
use subagent::{DepthError, SubagentError, SubagentErrorCode};

/// The message of a start whose request signal was already cancelled.
pub const ABORTED_BEFORE_PUBLICATION: &str = "subagent request was aborted before child publication";

/// Why [`InProcessDriver::start`](crate::InProcessDriver::start) rejected. Nothing was
/// published and nothing needs disposal.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartFailure {
    /// The request signal was cancelled before the start began (nothing was created).
    #[error("subagent request was aborted before child publication")]
    AbortedBeforePublication,
    /// The depth arithmetic refused the child: an invalid `maxDepth`, an invalid runtime
    /// `subagentDepth` on the parent, a child depth outside the safe-integer range, or a child
    /// depth above `maxDepth` ([`DepthError::Exceeded`] carries the
    /// [`SubagentDepthError`](subagent::SubagentDepthError)).
    #[error(transparent)]
    Depth(#[from] DepthError),
    /// The seed is not balanced ([`is_balanced`](subagent::agent::prefix::is_balanced)): it
    /// ends inside an open turn or step, closes a turn while one of its steps is open, or holds
    /// a `tool/call` outside its step. The child's first turn would break the session
    /// invariants, so nothing was created. A fork seed comes from an ill-formed parent log.
    #[error(
        "subagent seed is not balanced: it must end with no turn or step open, close every step \
         before its turn, and hold every tool/call inside its step"
    )]
    UnbalancedSeed,
    /// The host's creation transaction rejected and rolled back: the signal fired during
    /// creation (`CreationAborted`), the parent is disposed (`Inactive`) or was disposed during
    /// setup (`OwnerDisposed`), the setup window failed (`Setup`, e.g. an unknown tool-filter
    /// name), or another host fault.
    #[error(transparent)]
    Create(#[from] AgentError),
}

impl StartFailure {
    /// The seam code this failure is reported with.
    ///
    /// The reference passes a provider's own start failures through untyped; here each maps to
    /// a seam code (two of them Rust additions); route on the
    /// [`source`](std::error::Error::source) for anything finer:
    ///
    /// | failure | code |
    /// |---|---|
    /// | aborted before publication, creation aborted | `CANCELLED` |
    /// | parent disposed or disposing (`Inactive`, `OwnerDisposed`, `Disposed`) | `PARENT_UNAVAILABLE` |
    /// | the minted child id is taken | `DUPLICATE_CHILD` |
    /// | depth refused | `DEPTH_EXCEEDED` (source: the `SubagentDepthError`) |
    /// | unbalanced seed, setup failure and every other creation fault | `PROVIDER_FAILED` |
    pub fn code(&self) -> SubagentErrorCode {
        match self {
            Self::AbortedBeforePublication => SubagentErrorCode::Cancelled,
            Self::Depth(_) => SubagentErrorCode::DepthExceeded,
            Self::UnbalancedSeed => SubagentErrorCode::ProviderFailed,
            Self::Create(e) => match e {
                AgentError::CreationAborted { .. } => SubagentErrorCode::Cancelled,
                AgentError::Inactive(_) | AgentError::OwnerDisposed(_) | AgentError::Disposed(_) => {
                    SubagentErrorCode::ParentUnavailable
                }
                AgentError::Duplicate(_) => SubagentErrorCode::DuplicateChild,
                _ => SubagentErrorCode::ProviderFailed,
            },
        }
    }

    /// The failure as the seam's error: [`code`](Self::code), this failure's text as the
    /// message, and this failure as the source.
    pub fn into_subagent_error(self) -> SubagentError {
        SubagentError::new(self.code(), self.to_string()).with_source(self)
    }
}

impl From<StartFailure> for SubagentError {
    fn from(failure: StartFailure) -> Self {
        failure.into_subagent_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subagent::SubagentDepthError;

    #[test]
    fn messages_are_the_failures_own_text_and_the_source_is_kept() {
        let e: SubagentError = StartFailure::AbortedBeforePublication.into();
        assert_eq!(e.to_string(), ABORTED_BEFORE_PUBLICATION);
        assert_eq!(e.code(), SubagentErrorCode::Cancelled);
        let e: SubagentError = StartFailure::Depth(DepthError::Exceeded(SubagentDepthError {
            attempted_depth: 1,
            max_depth: 0,
        }))
        .into();
        assert_eq!(e.to_string(), "subagent depth 1 exceeds maxDepth 0");
        let source = std::error::Error::source(&e).expect("source kept");
        let failure = source.downcast_ref::<StartFailure>().expect("typed source");
        assert!(matches!(failure, StartFailure::Depth(DepthError::Exceeded(d)) if d.attempted_depth == 1));
    }
}
