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
/// * **When.** Asked only when a call's `tools/pre-execute` chain ends in `Ask`, and before the
///   guards and the tool lookup run: a call to an unknown or restricted tool can be asked about.
///   [`ApprovalOutcome::AllowedOnce`] bypasses nothing — a guard may still deny the call. The
///   most recently installed live service answers.
/// * **Outcomes.** Every outcome other than `AllowedOnce` denies the call (`DENIED`) with a
///   distinct reason, so the model can tell a human "no" from an absent channel. Without a
///   configured service, every `Ask` is denied.
/// * **Cancellation.** `request` must observe `signal` (the call's cancellation). The registry
///   also races it against the signal: once it fires the future is dropped (after at most one
///   more poll) and the call ends "aborted before dispatch"
///   ([`ABORTED_BEFORE_DISPATCH`](super::codes::ABORTED_BEFORE_DISPATCH)).
/// * **Concurrency.** Called on the calling agent's driver task, concurrently for the parallel
///   calls of a step and for different agents; the service is shared (`Arc`) and held until its
///   guard is dropped.
/// * **Panics** are contained: the call is denied with a reason naming the failure.
#[async_trait]
pub trait ToolApproval: Send + Sync + 'static {
    /// Asks whether `execution` may run.
    async fn request(&self, execution: &ToolExecution, signal: &Signal) -> ApprovalOutcome;
}
