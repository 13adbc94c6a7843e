//! The model-facing job tools.

use std::sync::Arc;
use std::time::Duration;

use agent::CancelCause;
use agent::content::visible_text;
use agent::ids::{CallId, SessionId};
use agent::jobs::{JobOutcome, JobStatus};
use agent::signal::Signal;
use agent::tools::{ExecutionId, ToolContext, ToolDefinition, ToolError, ToolExecution, codes};
use serde_json::{Value, json};

use super::{
    OnCancel, assert_ends_empty, completed, failed, killable, killed, producer, producer_with, settle_tasks,
};
use crate::jobs::{JOB_NOT_FOUND, JobRegistry, JobToolsConfig, job_tools, job_tools_with};

struct Harness {
    registry: Arc<JobRegistry>,
    tools: Vec<ToolDefinition>,
}

impl Harness {
    fn new() -> Self {
        Self::with(JobToolsConfig::default())
    }

    fn with(config: JobToolsConfig) -> Self {
        let registry = Arc::new(JobRegistry::new());
        let tools = job_tools_with(registry.clone(), config);
        Self { registry, tools }
    }

    async fn call_with(
        &self,
        agent: &str,
        name: &str,
        args: Value,
        signal: Signal,
    ) -> Result<(String, Value), ToolError> {
        let def = self.tools.iter().find(|t| t.name == name).expect("tool exists");
        let ctx = ToolContext::new(
            Arc::new(ToolExecution {
                id: ExecutionId::next(),
                agent: SessionId::from(agent),
                call_id: CallId::from("call-1"),
                name: name.to_owned(),
                arguments: args.clone(),
            }),
            signal,
        );
        let out = def.handler.execute(args, ctx).await?;
        Ok((visible_text(&out.content), out.value.unwrap_or(Value::Null)))
    }

    async fn call(&self, agent: &str, name: &str, args: Value) -> Result<(String, Value), ToolError> {
        self.call_with(agent, name, args, Signal::new()).await
    }

    async fn text(&self, agent: &str, name: &str, args: Value) -> String {
        self.call(agent, name, args).await.expect("tool succeeds").0
    }
}

#[test]
fn the_three_tools_are_built_with_their_names_and_pools() {
    let tools = job_tools(Arc::new(JobRegistry::new()));
    let shape: Vec<(&str, bool)> = tools
        .iter()
        .map(|t| (t.name.as_str(), t.concurrency_safe))
        .collect();
    assert_eq!(
        shape,
        [("job_output", true), ("job_list", true), ("job_kill", false)]
    );
}

#[tokio::test(start_paused = true)]
async fn job_output_renders_a_completed_job_idempotently() {
    let h = Harness::new();
    let (spec, p) = producer("subagent", "research", "parent");
    h.registry.start_job(spec).unwrap();
    p.settle(completed("background answer"));
    settle_tasks().await;
    let (text, value) = h
        .call("parent", "job_output", json!({"job_id": "subagent-1"}))
        .await
        .unwrap();
    assert_eq!(text, "background answer\n[status: completed]");
    assert_eq!(
        value,
        json!({
            "text": "background answer",
            "job": {"id": "subagent-1", "kind": "subagent", "label": "research", "status": "completed"},
        })
    );
    assert_eq!(
        h.text("parent", "job_output", json!({"job_id": "subagent-1"}))
            .await,
        "background answer\n[status: completed]"
    );
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn job_output_renders_failed_and_killed_jobs() {
    let h = Harness::new();
    let (spec, f) = producer("subagent", "a", "parent");
    h.registry.start_job(spec).unwrap();
    let (spec, k) = producer("subagent", "b", "parent");
    h.registry.start_job(spec).unwrap();
    f.settle(failed("error; diagnostic: the model refused"));
    k.settle(killed());
    settle_tasks().await;
    assert_eq!(
        h.text("parent", "job_output", json!({"job_id": "subagent-1"}))
            .await,
        "(no new output)\n[status: failed, error; diagnostic: the model refused]"
    );
    assert_eq!(
        h.text("parent", "job_output", json!({"job_id": "subagent-2"}))
            .await,
        "(no new output)\n[status: killed]"
    );
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn job_output_without_wait_shows_the_live_status_and_newline_terminated_bodies_keep_one_newline() {
    let h = Harness::new();
    let (spec, p) = producer("bash", "x", "parent");
    h.registry.start_job(spec).unwrap();
    assert_eq!(
        h.text("parent", "job_output", json!({"job_id": "bash-1"})).await,
        "(no new output)\n[status: running]"
    );
    assert_eq!(
        h.text("parent", "job_output", json!({"job_id": "bash-1", "wait": false}))
            .await,
        "(no new output)\n[status: running]"
    );
    p.settle(JobOutcome {
        status: JobStatus::Completed,
        output: Some("line\n".into()),
        detail: Some("exit code: 0".into()),
    });
    settle_tasks().await;
    assert_eq!(
        h.text("parent", "job_output", json!({"job_id": "bash-1"})).await,
        "line\n[status: completed, exit code: 0]"
    );
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn job_output_with_wait_blocks_until_settlement() {
    let h = Arc::new(Harness::new());
    let (spec, p) = producer("subagent", "research", "parent");
    h.registry.start_job(spec).unwrap();
    let call = {
        let h = h.clone();
        tokio::spawn(async move {
            h.text(
                "parent",
                "job_output",
                json!({"job_id": "subagent-1", "wait": true}),
            )
            .await
        })
    };
    settle_tasks().await;
    assert!(!call.is_finished());
    p.settle(completed("background answer"));
    assert_eq!(call.await.unwrap(), "background answer\n[status: completed]");
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn job_output_wait_is_bounded_and_leaves_the_job_running() {
    let h = Harness::with(JobToolsConfig {
        wait_timeout: Duration::from_secs(7),
    });
    let (spec, p) = producer("bash", "x", "parent");
    h.registry.start_job(spec).unwrap();
    let start = tokio::time::Instant::now();
    let text = h
        .text("parent", "job_output", json!({"job_id": "bash-1", "wait": true}))
        .await;
    assert_eq!(text, "(no new output)\n[status: running]");
    assert_eq!(start.elapsed(), Duration::from_secs(7));
    assert!(p.cancels().is_empty());
    p.settle(completed(""));
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn job_output_wait_observes_the_call_signal() {
    let h = Arc::new(Harness::new());
    let (spec, p) = producer("bash", "x", "parent");
    h.registry.start_job(spec).unwrap();
    let signal = Signal::new();
    let call = {
        let h = h.clone();
        let signal = signal.clone();
        tokio::spawn(async move {
            h.call_with(
                "parent",
                "job_output",
                json!({"job_id": "bash-1", "wait": true}),
                signal,
            )
            .await
        })
    };
    settle_tasks().await;
    signal.cancel(CancelCause::User);
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        ToolError::new(codes::CANCELLED, "waiting for job bash-1 was cancelled")
    );
    assert!(p.cancels().is_empty(), "cancelling a wait never cancels the job");
    p.settle(completed(""));
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn the_calling_agent_is_the_owner() {
    let h = Harness::new();
    let (spec, p) = killable("bash", "secret", "alice");
    h.registry.start_job(spec).unwrap();
    let not_found = ToolError::new(JOB_NOT_FOUND, "no job bash-1 for this agent");
    assert_eq!(
        h.call("bob", "job_output", json!({"job_id": "bash-1"}))
            .await
            .unwrap_err(),
        not_found
    );
    assert_eq!(
        h.call("bob", "job_kill", json!({"job_id": "bash-1"}))
            .await
            .unwrap_err(),
        not_found
    );
    assert_eq!(h.text("bob", "job_list", json!({})).await, "(no background jobs)");
    assert!(p.cancels().is_empty());
    assert_eq!(
        h.text("alice", "job_list", json!({})).await,
        "bash-1 [bash] running — secret"
    );
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn invalid_arguments_are_refused_as_invalid_args() {
    let h = Harness::new();
    let cases = [
        (
            "job_output",
            json!({}),
            "invalid job_id: expected a non-empty string, got null",
        ),
        (
            "job_output",
            json!({"job_id": ""}),
            "invalid job_id: expected a non-empty string, got \"\"",
        ),
        (
            "job_output",
            json!({"job_id": 3}),
            "invalid job_id: expected a non-empty string, got 3",
        ),
        (
            "job_output",
            json!({"job_id": "bash-1", "wait": "yes"}),
            "invalid wait: expected a boolean, got \"yes\"",
        ),
        (
            "job_kill",
            json!({"job_id": "bash-1", "reason": 1}),
            "invalid reason: expected a string, got 1",
        ),
        (
            "job_kill",
            json!("bash-1"),
            "invalid arguments: expected an object, got \"bash-1\"",
        ),
    ];
    for (name, args, message) in cases {
        let err = h.call("a", name, args).await.unwrap_err();
        assert_eq!(err, ToolError::invalid_args(message), "{name}");
    }
}

/// Huge arguments (a model pasting a large blob into `job_id`, or raw non-JSON text that the
/// pipeline passes on as a string) are quoted in the refusal only as a bounded excerpt, cut on
/// a char boundary and marked `…`, so a bad call never echoes its whole input back into the
/// model's context. Short values are quoted whole, as before.
#[tokio::test(start_paused = true)]
async fn refusals_quote_huge_arguments_as_a_bounded_excerpt() {
    let h = Harness::new();
    let huge = "é".repeat(50_000);
    let cases = [
        (
            "job_output",
            json!(huge.clone()),
            "invalid arguments: expected an object, got \"",
        ),
        (
            "job_output",
            json!({"job_id": [huge.clone()]}),
            "invalid job_id: expected a non-empty string, got [\"",
        ),
        (
            "job_output",
            json!({"job_id": "bash-1", "wait": huge.clone()}),
            "invalid wait: expected a boolean, got \"",
        ),
        (
            "job_kill",
            json!({"job_id": "bash-1", "reason": {"r": huge.clone()}}),
            "invalid reason: expected a string, got {\"",
        ),
    ];
    for (name, args, prefix) in cases {
        let err = h.call("a", name, args).await.unwrap_err();
        assert_eq!(err.code, codes::INVALID_ARGS, "{name}");
        assert!(err.message.starts_with(prefix), "{name}: {}", &err.message[..80]);
        assert!(err.message.len() < 400, "{name}: {} bytes", err.message.len());
        assert!(err.message.ends_with('…'), "{name}");
    }
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn job_list_renders_rows_in_start_order() {
    let h = Harness::new();
    let (text, value) = h.call("a", "job_list", json!({})).await.unwrap();
    assert_eq!(text, "(no background jobs)");
    assert_eq!(value, json!([]));
    let (spec, p1) = producer("bash", "pnpm test", "a");
    h.registry.start_job(spec).unwrap();
    let (spec, p2) = producer("subagent", "open research", "a");
    h.registry.start_job(spec).unwrap();
    let (spec, p3) = producer("bash", "build", "a");
    h.registry.start_job(spec).unwrap();
    p3.settle(JobOutcome {
        status: JobStatus::Completed,
        output: None,
        detail: Some("exit code: 0".into()),
    });
    settle_tasks().await;
    let (text, value) = h.call("a", "job_list", json!({})).await.unwrap();
    assert_eq!(
        text,
        "bash-1 [bash] running — pnpm test\nsubagent-1 [subagent] running — open research\nbash-2 [bash] completed — build"
    );
    assert_eq!(
        value[2],
        json!({"id": "bash-2", "kind": "bash", "label": "build", "status": "completed", "detail": "exit code: 0"})
    );
    p1.settle(completed(""));
    p2.settle(completed(""));
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn job_kill_forwards_the_reason_and_the_job_settles_killed() {
    let h = Harness::new();
    let (spec, p) = killable("subagent", "research", "parent");
    h.registry.start_job(spec).unwrap();
    let (text, value) = h
        .call(
            "parent",
            "job_kill",
            json!({"job_id": "subagent-1", "reason": "superseded"}),
        )
        .await
        .unwrap();
    assert_eq!(text, "requested cancellation of job subagent-1");
    assert_eq!(
        value,
        json!({
            "outcome": "cancellation-requested",
            "job": {"id": "subagent-1", "kind": "subagent", "label": "research", "status": "stopping"},
        })
    );
    assert_eq!(p.cancels(), vec![Some("superseded".to_owned())]);
    settle_tasks().await;
    assert_eq!(
        h.text("parent", "job_output", json!({"job_id": "subagent-1"}))
            .await,
        "(no new output)\n[status: killed]"
    );
    // Killing a settled job reports its terminal status instead.
    let (text, value) = h
        .call("parent", "job_kill", json!({"job_id": "subagent-1"}))
        .await
        .unwrap();
    assert_eq!(text, "job subagent-1 had already finished [status: killed]");
    assert_eq!(value["outcome"], "already-finished");
    assert_eq!(p.cancels().len(), 1);
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn job_kill_without_a_reason_forwards_none() {
    let h = Harness::new();
    let (spec, p) = killable("bash", "x", "a");
    h.registry.start_job(spec).unwrap();
    h.call("a", "job_kill", json!({"job_id": "bash-1", "reason": null}))
        .await
        .unwrap();
    assert_eq!(p.cancels(), vec![None]);
    assert_ends_empty(&h.registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_cancel_becomes_a_failed_kill() {
    let h = Harness::new();
    let (spec, p) = producer_with("bash", "x", "a", OnCancel::Panic, Duration::ZERO);
    h.registry.start_job(spec).unwrap();
    let err = h
        .call("a", "job_kill", json!({"job_id": "bash-1"}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ToolError::failed(
            "cancelling job bash-1 failed: cancel exploded; the job is now [status: failed] and its work may be orphaned"
        )
    );
    assert_eq!(
        h.registry
            .get(&SessionId::from("a"), &agent::jobs::JobId("bash-1".into()))
            .unwrap()
            .status,
        JobStatus::Failed
    );
    // The job is settled: a second kill reports it finished and does not call the hook again.
    let again = h.text("a", "job_kill", json!({"job_id": "bash-1"})).await;
    assert!(
        again.starts_with("job bash-1 had already finished [status: failed"),
        "{again}"
    );
    assert_eq!(p.cancels(), vec![None]);
    assert_ends_empty(&h.registry).await;
}
