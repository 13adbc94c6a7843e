//! The background job registry contract (`acp-and-tools.md` §3.8 "Job registry rules").

use std::fmt;

use async_trait::async_trait;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::bus::BoxError;
use crate::ids::SessionId;
use crate::signal::Signal;

/// The default per-owner limit of running and stopping jobs.
pub const DEFAULT_JOB_LIMIT: usize = 10;

/// A job id: `<kind>-<n>` per kind, starting at 1.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub String);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A job's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobStatus {
    /// Started, not settled.
    Running,
    /// Kill requested, not settled.
    Stopping,
    /// Settled successfully.
    Completed,
    /// Settled with a failure.
    Failed,
    /// Settled after a kill.
    Killed,
}

impl JobStatus {
    /// Whether the job has settled.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Killed)
    }
}

impl fmt::Display for JobStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Killed => "killed",
        })
    }
}

/// How a job settled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOutcome {
    /// `Completed`, `Failed` or `Killed`.
    pub status: JobStatus,
    /// Final output (completed jobs).
    pub output: Option<String>,
    /// Failure detail.
    pub detail: Option<String>,
}

/// What a starter returns once its work is running.
pub struct JobHooks {
    /// Requests cancellation with an optional reason.
    pub cancel: Box<dyn Fn(Option<String>) + Send + Sync>,
    /// Settles after every resource is released; never fails.
    pub done: BoxFuture<'static, JobOutcome>,
}

/// Starts a job's work. Called only after the registry's preflight succeeded.
pub type JobStarter = Box<dyn FnOnce() -> JobHooks + Send>;

/// A request to start a job.
pub struct JobSpec {
    /// Kind (`subagent`, …); ids are numbered per kind.
    pub kind: String,
    /// Human label.
    pub label: String,
    /// The owning agent; only it may read or kill the job.
    pub owner: SessionId,
    /// The starter.
    pub starter: JobStarter,
}

/// A job as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    /// Id.
    pub id: JobId,
    /// Kind.
    pub kind: String,
    /// Label.
    pub label: String,
    /// Status.
    pub status: JobStatus,
}

/// A job registry refusal, with the texts the tools show the model.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// No controller serves the owner.
    #[error("background jobs unavailable: no job controller serves this agent")]
    NoController,
    /// The registry drives jobs on a tokio runtime, and `start` was called outside one (a host
    /// fault: the starter was not called).
    #[error(
        "background jobs unavailable: a job needs a tokio runtime to run on, and this call was made outside one"
    )]
    NoRuntime,
    /// The owner is at its limit.
    #[error(
        "background job limit reached for this owner (limit: {0}); use job_kill to stop an unneeded job, wait for it to finish, then retry"
    )]
    LimitReached(usize),
    /// Unknown id, or not owned by the caller (indistinguishable on purpose).
    #[error("no job {0} for this agent")]
    NotFound(JobId),
    /// The owner is being disposed.
    #[error("background jobs unavailable: the owning agent is disposed")]
    OwnerDisposed,
    /// The registry has shut down (the host is stopping); it starts no more jobs.
    #[error("background jobs unavailable: the job registry has shut down")]
    ShutDown,
    /// Waiting was cancelled.
    #[error("waiting for job {0} was cancelled")]
    Cancelled(JobId),
}

/// A job's output as read by its owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRead {
    /// Status at read time.
    pub status: JobStatus,
    /// The outcome once settled.
    pub outcome: Option<JobOutcome>,
}

/// The background job registry.
///
/// # Contract
/// * [`start`](Jobs::start) is atomic: preflight (owner live, controller present, capacity),
///   then the starter, then a registration that cannot fail — a failed preflight leaves no work.
///   It is synchronous: the starter runs exactly once, on the caller's thread, and must not
///   block. The registry drives `done` itself (the reference registry on a task of the current
///   tokio runtime; it refuses a start outside one with [`JobError::NoRuntime`]).
/// * **Hooks.** `cancel` runs synchronously inside [`kill`](Jobs::kill),
///   [`dispose_owner`](Jobs::dispose_owner) or the registry's drop, from any thread, and may run
///   more than once (every kill, then owner disposal): keep it quick and idempotent. `done` must
///   settle after a `cancel`, and only once every resource is released.
/// * Access is owner-fenced: reads and kills name the owner; another owner's job reads as absent.
/// * Settlement is first-wins. [`kill`](Jobs::kill) only requests cancellation: it returns at
///   once, and the job reads `stopping` until `done` settles it. Killing a settled job is `Ok`.
/// * **Waiting.** [`read`](Jobs::read) with `wait` races the wait against `signal`: cancellation
///   fails it with [`JobError::Cancelled`] and stops only the wait, never the job. Dropping the
///   future is safe.
/// * Disposing an owner cancels its jobs and awaits their `done` ([`Jobs::dispose_owner`]);
///   meanwhile starts for that owner fail with [`JobError::OwnerDisposed`], afterwards they are
///   accepted again. The reference runtime calls it twice per agent teardown (while the turn
///   winds down, and once the agent is idle). Dropping its future leaves the cancellations
///   requested without waiting for them.
/// * **Concurrency.** Every method takes `&self` and may be called from any thread, concurrently.
/// * **Panics.** A panicking starter propagates out of `start` (the reference registry releases
///   the reserved capacity first). A `done` that panics settles the job `failed`. The reference
///   registry contains a panicking `cancel` alike in `kill` (which returns `Ok`) and during owner
///   disposal: the job is forced `failed` with a detail naming the panic, its `done` is dropped,
///   and its `cancel` is not called again.
#[async_trait]
pub trait Jobs: Send + Sync + 'static {
    /// Starts a job; returns its id.
    fn start(&self, spec: JobSpec) -> Result<JobId, JobError>;

    /// Lists `owner`'s jobs.
    fn list(&self, owner: &SessionId) -> Vec<JobInfo>;

    /// Requests cancellation of `owner`'s job `id`; marks it stopping.
    fn kill(&self, owner: &SessionId, id: &JobId, reason: Option<String>) -> Result<(), JobError>;

    /// Reads `owner`'s job; with `wait`, first waits for settlement (raced against `signal`).
    async fn read(
        &self,
        owner: &SessionId,
        id: &JobId,
        wait: bool,
        signal: &Signal,
    ) -> Result<JobRead, JobError>;

    /// Cancels and awaits every job of `owner`.
    async fn dispose_owner(&self, owner: &SessionId);
}

/// Boxed error alias re-exported for job starters.
pub type JobStartError = BoxError;
