//! The continuable background route (`acp-and-tools.md` §3.9): a continuable child started
//! through the seam's [`ContinuationManager`], answered with its durable id.
//!
//! The tool only starts the child. From the moment the child's inbox accepts the first prompt
//! the manager owns it: the tool keeps no handle, registers no job and awaits no result. The
//! manager later delivers the settlement notice to the parent, and `send_message` continues the
//! child.

use std::future::Future;

use subagent::SubagentError;
use subagent::agent::tools::ToolError;
use subagent::continuation::{ContinuableStartSpec, ContinuationManager};
use subagent::service::StartError;

use crate::foreground::start_failure;
use crate::value::DelegationValue;

/// Starts one continuable child with `spec` and answers `{kind: continuable, subagentId}`.
///
/// The manager's synchronous admission (its steps 1–5: admission, persistence and `maxDepth`
/// checks, child id, depth, descriptor, delegated-policy capture) runs **now**, when this is
/// called; the returned future does the rest and resolves at the first prompt's inbox
/// acceptance. `spec.signal` owns the start until then: cancelling it before acceptance makes
/// the start reject and leaves no agent, no Activation and no persisted child; cancelling it
/// afterwards does not affect the child.
///
/// Every rejection becomes [`failure`].
pub(crate) fn start(
    manager: &ContinuationManager,
    spec: ContinuableStartSpec,
) -> impl Future<Output = Result<DelegationValue, ToolError>> + Send + 'static {
    let starting = manager.start_continuable(spec);
    async move {
        let (child_id, _accepted) = starting.await.map_err(failure)?;
        Ok(DelegationValue::Continuable {
            subagent_id: child_id.as_str().to_owned(),
        })
    }
}

/// A continuable start's rejection as a tool error, mapped like every other seam rejection of
/// the tool (see `foreground::start_failure`): the seam's code (`CONTINUATION_UNAVAILABLE`,
/// `PERSISTENCE_UNAVAILABLE`, `DRAINING`, `DUPLICATE_CHILD`, `DEPTH_EXCEEDED`, `CANCELLED`, …)
/// and the error's message with its cause chain.
pub(crate) fn failure(error: SubagentError) -> ToolError {
    start_failure(StartError::Subagent(error))
}
