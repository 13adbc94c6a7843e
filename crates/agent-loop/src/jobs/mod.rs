//! # Background jobs
//!
//! [`JobRegistry`] is the process-local implementation of [`agent::Jobs`]
//! (`acp-and-tools.md` §3.8, "Job registry rules"): atomic starts behind a preflight, per-kind
//! ids (`subagent-1`, …), owner-fenced access, first-wins settlement, kill, waiting reads,
//! owner disposal and registry shutdown, and a [`JobNotice`] on an [`agent::EventBus`] when a job
//! settles unreported.
//!
//! [`job_tools`] builds the model-facing `job_output`, `job_list` and `job_kill` tools over a
//! registry. Every model-visible string lives in [`model_text`].
//!
//! ## Wiring
//! * Put the registry in [`agent::Services::jobs`] and register [`job_tools`] (and, if wanted,
//!   [`job_guidance_section`]).
//! * Call [`Jobs::dispose_owner`](agent::Jobs::dispose_owner) from agent disposal so a job never
//!   outlives its owner, and [`JobRegistry::shutdown`] at host shutdown.
//! * Subscribe to [`JobRegistry::notices`] to deliver completion notices
//!   ([`JobNotice::to_message`]) into the owner's inbox.

pub mod model_text;
mod notice;
mod registry;
mod tools;

pub use notice::JobNotice;
pub use registry::{
    JobCounts, JobReadout, JobRegistry, JobRegistryConfig, JobSnapshot, KillOutcome, OwnerProbe,
};
pub use tools::{
    DEFAULT_WAIT_TIMEOUT, JOB_NOT_FOUND, JobToolsConfig, job_guidance_section, job_tools, job_tools_with,
};

#[cfg(test)]
mod tests;
