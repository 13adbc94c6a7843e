//! Pins every model-visible string of the job tools with `insta` snapshots.

use std::fmt::Write as _;
use std::sync::Arc;

use agent::jobs::{JobError, JobId, JobStatus};
use serde_json::json;

use crate::jobs::model_text as t;
use crate::jobs::{JobRegistry, job_guidance_section, job_tools};

#[test]
fn tool_schemas() {
    let tools = job_tools(Arc::new(JobRegistry::new()));
    let schemas: Vec<_> = tools
        .iter()
        .map(|d| {
            let s = d.schema();
            json!({"name": s.name, "description": s.description, "parameters": s.parameters})
        })
        .collect();
    insta::assert_snapshot!("tool_schemas", serde_json::to_string_pretty(&schemas).unwrap());
}

#[test]
fn guidance_section() {
    let section = job_guidance_section();
    insta::assert_snapshot!(
        "guidance_section",
        format!(
            "name: {}\norder: {}\n\n{}",
            section.name, section.order, section.text
        )
    );
}

#[test]
fn result_and_notice_texts() {
    let mut out = String::new();
    let mut line = |label: &str, text: String| {
        writeln!(out, "{label}:\n{text}\n").unwrap();
    };
    line(
        "read completed",
        t::read_result("background answer", JobStatus::Completed, None),
    );
    line(
        "read newline body",
        t::read_result("line\n", JobStatus::Completed, Some("exit code: 0")),
    );
    line(
        "read failed",
        t::read_result("", JobStatus::Failed, Some("error; diagnostic: <d>")),
    );
    line("read killed", t::read_result("", JobStatus::Killed, None));
    line("read running", t::read_result("", JobStatus::Running, None));
    line("read stopping", t::read_result("", JobStatus::Stopping, None));
    line(
        "list row",
        t::list_row("subagent-1", "subagent", JobStatus::Running, "research"),
    );
    line("list empty", t::NO_JOBS.to_owned());
    line("kill requested", t::kill_requested("subagent-1"));
    line(
        "kill already finished",
        t::kill_already_finished("subagent-1", JobStatus::Failed, Some("error")),
    );
    line("kill failed", t::kill_failed("bash-1", "boom", JobStatus::Failed));
    line(
        "completion notice",
        t::completion_notice("subagent-1", "subagent", "research", JobStatus::Completed, None),
    );
    line(
        "completion notice with detail",
        t::completion_notice(
            "subagent-2",
            "subagent",
            "audit",
            JobStatus::Failed,
            Some("error; diagnostic: <d>"),
        ),
    );
    line(
        "notice summary",
        t::notice_summary("subagent", "research", JobStatus::Killed, None),
    );
    line("notice plugin", t::NOTICE_PLUGIN.to_owned());
    line("invalid job_id", t::invalid_job_id(&json!("")));
    line("invalid wait", t::invalid_wait(&json!("yes")));
    line("invalid reason", t::invalid_reason(&json!(1)));
    line("invalid arguments", t::invalid_arguments(&json!([1])));
    line("done panicked", t::done_panicked("boom"));
    line("task dropped", t::TASK_DROPPED.to_owned());
    line(
        "non-terminal outcome",
        t::non_terminal_outcome(JobStatus::Stopping),
    );
    line("teardown cancel panicked", t::teardown_cancel_panicked("boom"));
    line("kill cancel panicked", t::kill_cancel_panicked("boom"));
    line("owner disposed reason", t::OWNER_DISPOSED_REASON.to_owned());
    line("shutdown reason", t::SHUTDOWN_REASON.to_owned());
    insta::assert_snapshot!("result_and_notice_texts", out);
}

/// The registry refusals as the tools show them (their texts live in `agent::jobs`).
#[test]
fn registry_refusals() {
    let id = JobId("subagent-1".into());
    let errors = [
        JobError::NoController,
        JobError::NoRuntime,
        JobError::LimitReached(10),
        JobError::NotFound(id.clone()),
        JobError::OwnerDisposed,
        JobError::ShutDown,
        JobError::Cancelled(id),
    ];
    let out: Vec<String> = errors.iter().map(ToString::to_string).collect();
    insta::assert_snapshot!("registry_refusals", out.join("\n"));
}
