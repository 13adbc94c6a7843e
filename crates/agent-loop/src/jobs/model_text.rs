//! Every model-visible string of the job registry and the `job_*` tools, in one place.
//!
//! The fixed texts (`(no new output)`, the status line, the list row, the kill acknowledgement and
//! the completion notice) follow `acp-and-tools.md` §3.8 exactly; descriptions are this crate's
//! own wording and keep the load-bearing phrases (`[status: ...]`, `wait: true`). Every string is
//! pinned by an `insta` snapshot in `jobs/tests/model_text.rs`; `docs/model-experience.md` lists
//! them.

use agent::jobs::JobStatus;
use serde_json::{Value, json};

use crate::excerpt::excerpt;

/// Name of the read tool.
pub const JOB_OUTPUT: &str = "job_output";
/// Name of the listing tool.
pub const JOB_LIST: &str = "job_list";
/// Name of the kill tool.
pub const JOB_KILL: &str = "job_kill";

/// `job_output`'s description.
pub const JOB_OUTPUT_DESCRIPTION: &str = "Read a background job you started. A finished job returns its final output; a \
     running job returns only its status. Every response ends with `[status: ...]`. The read \
     does not block unless `wait: true`, which waits for the job to finish up to a bounded time; \
     a wait that runs out returns `[status: running]` and leaves the job running.";

/// `job_list`'s description.
pub const JOB_LIST_DESCRIPTION: &str =
    "List the background jobs you own, running and finished, with their ids, kinds and statuses.";

/// `job_kill`'s description.
pub const JOB_KILL_DESCRIPTION: &str = "Ask a running background job to stop, by job id. Returns at once; the job settles as \
     killed once its work has actually stopped.";

/// Description of the `job_id` parameter (`job_output`, `job_kill`).
pub const JOB_ID_PARAM: &str =
    "The job id returned by the tool that started the background work (for example `subagent-1`).";

/// Description of `job_output`'s `wait` parameter.
pub const WAIT_PARAM: &str = "Block until the job reaches a terminal status or the wait bound passes. A wait that runs \
     out returns [status: running] and the job keeps running.";

/// Description of `job_kill`'s `reason` parameter.
pub const REASON_PARAM: &str = "Optional short reason; it is logged and forwarded to the job.";

/// Name of the background-job guidance prompt section.
pub const GUIDANCE_SECTION: &str = "tool:jobs";

/// Order of the guidance section (tool-guidance band, after shell guidance).
pub const GUIDANCE_ORDER: i32 = 106;

/// Background-job guidance for the system prompt.
pub const GUIDANCE: &str = "Keep track of every background job id you start. This session tells you when a job \
     finishes, so do not poll or sleep while waiting for one: carry on with independent work and \
     do not redo what a running job is already doing. Before your final answer, collect every job \
     that still matters with job_output (use wait: true only when you cannot continue without \
     it), and stop jobs that no longer matter with job_kill.";

/// What a read shows in place of an empty body.
pub const NO_NEW_OUTPUT: &str = "(no new output)";

/// What `job_list` shows when the caller owns no job.
pub const NO_JOBS: &str = "(no background jobs)";

/// The plugin name completion-notice messages carry as their source.
pub const NOTICE_PLUGIN: &str = "tool-jobs";

/// The cancellation reason given to a job's `cancel` hook when its owner is disposed.
pub const OWNER_DISPOSED_REASON: &str = "owner disposed";

/// The cancellation reason given to a job's `cancel` hook when the registry shuts down.
pub const SHUTDOWN_REASON: &str = "jobs service disposed";

/// `[status: <status>]`, or `[status: <status>, <detail>]` when the job has a detail.
pub fn status_line(status: JobStatus, detail: Option<&str>) -> String {
    match detail {
        Some(detail) => format!("[status: {status}, {detail}]"),
        None => format!("[status: {status}]"),
    }
}

/// A `job_output` result: the body (or [`NO_NEW_OUTPUT`] when empty), a newline unless the body
/// already ends with one, then the status line.
pub fn read_result(body: &str, status: JobStatus, detail: Option<&str>) -> String {
    let body = if body.is_empty() { NO_NEW_OUTPUT } else { body };
    let separator = if body.ends_with('\n') { "" } else { "\n" };
    format!("{body}{separator}{}", status_line(status, detail))
}

/// One `job_list` row: `<id> [<kind>] <status> — <label>`.
pub fn list_row(id: &str, kind: &str, status: JobStatus, label: &str) -> String {
    format!("{id} [{kind}] {status} — {label}")
}

/// `job_kill`'s acknowledgement for a live job.
pub fn kill_requested(id: &str) -> String {
    format!("requested cancellation of job {id}")
}

/// `job_kill`'s answer for a job that had already settled.
pub fn kill_already_finished(id: &str, status: JobStatus, detail: Option<&str>) -> String {
    format!("job {id} had already finished {}", status_line(status, detail))
}

/// The completion notice delivered to a job's owner.
pub fn completion_notice(
    id: &str,
    kind: &str,
    label: &str,
    status: JobStatus,
    detail: Option<&str>,
) -> String {
    format!(
        "background job {id} ({kind}: {label}) finished {}. Read its output with job_output.",
        status_line(status, detail)
    )
}

/// The one-line summary of a completion notice (its collapsed row in a UI).
pub fn notice_summary(kind: &str, label: &str, status: JobStatus, detail: Option<&str>) -> String {
    format!("{kind} {label} {}", status_line(status, detail))
}

/// A `job_id` argument that is not a non-empty string.
pub fn invalid_job_id(got: &Value) -> String {
    format!(
        "invalid job_id: expected a non-empty string, got {}",
        render_json(got)
    )
}

/// A `wait` argument that is not a boolean.
pub fn invalid_wait(got: &Value) -> String {
    format!("invalid wait: expected a boolean, got {}", render_json(got))
}

/// A `reason` argument that is not a string.
pub fn invalid_reason(got: &Value) -> String {
    format!("invalid reason: expected a string, got {}", render_json(got))
}

/// `job_kill`'s error when the job's `cancel` hook panicked: the registry forced the job to
/// `status` (`failed`, unless it settled meanwhile) and dropped its work.
pub fn kill_failed(id: &str, message: &str, status: JobStatus) -> String {
    format!(
        "cancelling job {id} failed: {message}; the job is now {} and its work may be orphaned",
        status_line(status, None)
    )
}

/// Arguments that are not a JSON object.
pub fn invalid_arguments(got: &Value) -> String {
    format!("invalid arguments: expected an object, got {}", render_json(got))
}

/// The failure detail of a job whose `done` future panicked (a producer contract violation).
pub fn done_panicked(message: &str) -> String {
    format!("job panicked before settling: {message}")
}

/// The failure detail of a job whose task was dropped before its `done` future resolved: the
/// tokio runtime it was started on shut down, so nothing is left to settle it.
pub const TASK_DROPPED: &str =
    "job stopped before settling: the runtime running it shut down; its work may be orphaned";

/// The failure detail of a job whose `done` resolved with a non-terminal status.
pub fn non_terminal_outcome(status: JobStatus) -> String {
    format!("job settled with non-terminal status {status}")
}

/// The failure detail of a job whose `cancel` hook panicked during owner or registry teardown.
pub fn teardown_cancel_panicked(message: &str) -> String {
    format!("cancel panicked during teardown; work may be orphaned: {message}")
}

/// The failure detail of a job whose `cancel` hook panicked during a kill.
pub fn kill_cancel_panicked(message: &str) -> String {
    format!("cancel panicked during kill; work may be orphaned: {message}")
}

/// The JSON schema of `job_output`'s arguments.
pub fn job_output_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "job_id": {"type": "string", "description": JOB_ID_PARAM},
            "wait": {"type": "boolean", "description": WAIT_PARAM},
        },
        "required": ["job_id"],
        "additionalProperties": false,
    })
}

/// The JSON schema of `job_list`'s arguments (none).
pub fn job_list_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {},
        "additionalProperties": false,
    })
}

/// The JSON schema of `job_kill`'s arguments.
pub fn job_kill_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "job_id": {"type": "string", "description": JOB_ID_PARAM},
            "reason": {"type": "string", "description": REASON_PARAM},
        },
        "required": ["job_id"],
        "additionalProperties": false,
    })
}

fn render_json(value: &Value) -> String {
    excerpt(serde_json::to_string(value).unwrap_or_else(|_| "<unrenderable>".to_owned()))
}
