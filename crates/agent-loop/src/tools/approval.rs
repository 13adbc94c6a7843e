//! The optional approval service that resolves a `tools/pre-execute` [`Ask`] decision.
//!
//! [`Ask`]: agent::tools::PreExecuteDecision::Ask

use async_trait::async_trait;

use agent::Signal;
use agent::tools::ToolExecution;

/// How an approval request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApprovalOutcome {
    /// Run this one call.
    AllowedOnce,
    /// The user said no.
    Rejected,
    /// The approval channel cancelled the request.
    Cancelled,
    /// No one can answer (no UI, no answerer).
    Unavailable,
}

/// Answers approval asks for the [`ToolRegistry`](super::ToolRegistry).
///
/// # Contract
/// `request` must observe `signal` (the call's cancellation); the registry also races it
/// against the signal and treats a cancelled wait as "aborted before dispatch". Every outcome
/// other than [`ApprovalOutcome::AllowedOnce`] denies the call with a distinct reason, so the
/// model can tell a human "no" from an absent channel. Without a configured service, every
/// `Ask` is denied.
#[async_trait]
pub trait ToolApproval: Send + Sync + 'static {
    /// Asks whether `execution` may run.
    async fn request(&self, execution: &ToolExecution, signal: &Signal) -> ApprovalOutcome;
}
