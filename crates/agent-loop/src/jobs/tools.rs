//! The model-facing job tools: `job_output`, `job_list`, `job_kill`.
//!
//! Each body takes its caller from [`ToolContext::agent`]; that agent is the owner the registry
//! fences every access with.

use std::sync::Arc;
use std::time::Duration;

use agent::jobs::{JobError, JobId};
use agent::prompt::PromptSection;
use agent::tools::{ToolContext, ToolDefinition, ToolError, ToolHandler, ToolOutput, codes};
use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::model_text;
use super::registry::{JobRegistry, JobSnapshot, KillOutcome};

/// The default bound of a `job_output` wait.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Tool error code of an unknown (or foreign) job id.
pub const JOB_NOT_FOUND: &str = "JOB_NOT_FOUND";

/// Configuration of the job tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobToolsConfig {
    /// How long `job_output` with `wait: true` waits before answering with the live status
    /// (default [`DEFAULT_WAIT_TIMEOUT`]). The job keeps running either way.
    pub wait_timeout: Duration,
}

impl Default for JobToolsConfig {
    fn default() -> Self {
        Self {
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }
}

/// `job_output`, `job_list` and `job_kill` over `registry`, with the default configuration.
pub fn job_tools(registry: Arc<JobRegistry>) -> Vec<ToolDefinition> {
    job_tools_with(registry, JobToolsConfig::default())
}

/// `job_output`, `job_list` and `job_kill` over `registry`.
pub fn job_tools_with(registry: Arc<JobRegistry>, config: JobToolsConfig) -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: model_text::JOB_OUTPUT.to_owned(),
            description: model_text::JOB_OUTPUT_DESCRIPTION.to_owned(),
            parameters: model_text::job_output_parameters(),
            concurrency_safe: true,
            handler: Arc::new(JobOutput {
                registry: registry.clone(),
                wait_timeout: config.wait_timeout,
            }),
        },
        ToolDefinition {
            name: model_text::JOB_LIST.to_owned(),
            description: model_text::JOB_LIST_DESCRIPTION.to_owned(),
            parameters: model_text::job_list_parameters(),
            concurrency_safe: true,
            handler: Arc::new(JobList {
                registry: registry.clone(),
            }),
        },
        ToolDefinition {
            name: model_text::JOB_KILL.to_owned(),
            description: model_text::JOB_KILL_DESCRIPTION.to_owned(),
            parameters: model_text::job_kill_parameters(),
            concurrency_safe: false,
            handler: Arc::new(JobKill { registry }),
        },
    ]
}

/// The background-job guidance section for the system prompt (name `tool:jobs`, order 106).
pub fn job_guidance_section() -> PromptSection {
    PromptSection {
        name: model_text::GUIDANCE_SECTION.to_owned(),
        order: model_text::GUIDANCE_ORDER,
        text: model_text::GUIDANCE.to_owned(),
        tool: None,
    }
}

struct JobOutput {
    registry: Arc<JobRegistry>,
    wait_timeout: Duration,
}

#[async_trait]
impl ToolHandler for JobOutput {
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args = object(&arguments)?;
        let id = job_id(args)?;
        let wait = match args.get("wait") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(wait)) => *wait,
            Some(other) => return Err(ToolError::invalid_args(model_text::invalid_wait(other))),
        };
        let owner = ctx.agent();
        // The pipeline discards a result whose call signal fired (recorded as aborted), so the
        // read claims the report (suppressing the completion notice) only while the signal has
        // not fired, checked atomically with the marking; a wait the signal interrupts releases
        // its claim and the notice goes out.
        let read = if wait {
            self.registry
                .wait_and_read(owner, &id, Some(self.wait_timeout), &ctx.signal)
                .await
        } else {
            self.registry.read_job_unless_cancelled(owner, &id, &ctx.signal)
        }
        .map_err(job_error)?;
        if read.claimed {
            // The signal may still fire after that check (another thread cancels the turn), or
            // the output may prove unrecordable: the pipeline then discards this success, and
            // the claim goes back so the completion notice still delivers the output.
            let registry = self.registry.clone();
            let (owner, id) = (owner.clone(), id.clone());
            ctx.on_discarded(move || {
                registry.unclaim(&owner, &id);
            });
        }
        let text = model_text::read_result(
            &read.output,
            read.snapshot.status,
            read.snapshot.detail.as_deref(),
        );
        Ok(ToolOutput {
            value: Some(json!({"text": read.output, "job": public_job(&read.snapshot)})),
            ..ToolOutput::text(text)
        })
    }
}

struct JobList {
    registry: Arc<JobRegistry>,
}

#[async_trait]
impl ToolHandler for JobList {
    async fn execute(&self, _arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let jobs = self.registry.snapshots(ctx.agent());
        let text = if jobs.is_empty() {
            model_text::NO_JOBS.to_owned()
        } else {
            jobs.iter()
                .map(|j| model_text::list_row(&j.id.0, &j.kind, j.status, &j.label))
                .collect::<Vec<_>>()
                .join("\n")
        };
        Ok(ToolOutput {
            value: Some(Value::Array(jobs.iter().map(public_job).collect())),
            ..ToolOutput::text(text)
        })
    }
}

struct JobKill {
    registry: Arc<JobRegistry>,
}

#[async_trait]
impl ToolHandler for JobKill {
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args = object(&arguments)?;
        let id = job_id(args)?;
        let reason = match args.get("reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(reason)) => Some(reason.clone()),
            Some(other) => return Err(ToolError::invalid_args(model_text::invalid_reason(other))),
        };
        let owner = ctx.agent();
        let outcome = self.registry.kill_job(owner, &id, reason).map_err(job_error)?;
        let (text, label) = match &outcome {
            KillOutcome::Requested(job) => (model_text::kill_requested(&job.id.0), "cancellation-requested"),
            KillOutcome::AlreadyFinished(job) => (
                model_text::kill_already_finished(&job.id.0, job.status, job.detail.as_deref()),
                "already-finished",
            ),
            KillOutcome::CancelPanicked { snapshot, message } => {
                return Err(ToolError::failed(model_text::kill_failed(
                    &snapshot.id.0,
                    message,
                    snapshot.status,
                )));
            }
        };
        Ok(ToolOutput {
            value: Some(json!({"outcome": label, "job": public_job(outcome.snapshot())})),
            ..ToolOutput::text(text)
        })
    }
}

fn object(arguments: &Value) -> Result<&Map<String, Value>, ToolError> {
    arguments
        .as_object()
        .ok_or_else(|| ToolError::invalid_args(model_text::invalid_arguments(arguments)))
}

fn job_id(args: &Map<String, Value>) -> Result<JobId, ToolError> {
    match args.get("job_id") {
        Some(Value::String(id)) if !id.is_empty() => Ok(JobId(id.clone())),
        other => Err(ToolError::invalid_args(model_text::invalid_job_id(
            other.unwrap_or(&Value::Null),
        ))),
    }
}

fn job_error(error: JobError) -> ToolError {
    let code = match &error {
        JobError::NotFound(_) => JOB_NOT_FOUND,
        JobError::Cancelled(_) => codes::CANCELLED,
        _ => codes::FAILED,
    };
    ToolError::new(code, error.to_string())
}

/// The structured job value the tools return: no owner, no notice bookkeeping.
fn public_job(job: &JobSnapshot) -> Value {
    let mut value = json!({
        "id": job.id.0,
        "kind": job.kind,
        "label": job.label,
        "status": job.status,
    });
    if let (Some(detail), Some(map)) = (&job.detail, value.as_object_mut()) {
        map.insert("detail".to_owned(), Value::String(detail.clone()));
    }
    value
}
