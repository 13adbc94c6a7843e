//! The model-facing job tools.

use std::sync::Arc;
use std::time::Duration;

use agent::CancelCause;
use agent::content::visible_text;
use agent::ids::{CallId, SessionId};
use agent::jobs::{JobHooks, JobId, JobOutcome, JobSpec, JobStatus};
use agent::signal::Signal;
use agent::tools::{
    ExecutedTool, ExecutionId, ToolCallRequest, ToolContext, ToolDefinition, ToolError, ToolExecution, Tools,
    codes,
};
use futures::poll;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::{
    OnCancel, assert_ends_empty, completed, failed, killable, killed, producer, producer_with,
    record_notices, settle_tasks,
};
use crate::jobs::{JOB_NOT_FOUND, JobNotice, JobRegistry, JobToolsConfig, job_tools, job_tools_with};
use crate::tools::ToolRegistry;

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

/// The job tools registered in a real [`ToolRegistry`], so calls go through the whole pipeline
/// (which records a success whose call signal fired as aborted).
struct Pipeline {
    registry: Arc<JobRegistry>,
    tools: ToolRegistry,
    _registrations: Vec<agent::Registration>,
}

impl Pipeline {
    fn new() -> Self {
        let registry = Arc::new(JobRegistry::new());
        let tools = ToolRegistry::new();
        let registrations = job_tools(registry.clone())
            .into_iter()
            .map(|def| tools.register(None, def).expect("job tool registers"))
            .collect();
        Self {
            registry,
            tools,
            _registrations: registrations,
        }
    }

    /// Spawns one `job_output` call of `parent` through the pipeline under `signal`.
    fn spawn_output(&self, args: Value, signal: Signal) -> tokio::task::JoinHandle<ExecutedTool> {
        let tools = self.tools.clone();
        tokio::spawn(async move {
            let call = ToolCallRequest {
                call_id: CallId::from("call-1"),
                name: "job_output".to_owned(),
                arguments: args.to_string(),
            };
            tools.execute(&SessionId::from("parent"), call, signal).await
        })
    }
}

/// A job whose `done` resolves with `output` once `go` fires, cancelling `fire` right before
/// it resolves: the job settles and the signal fires in the same moment.
fn settles_cancelling(fire: Signal, go: oneshot::Receiver<()>, output: &str) -> JobSpec {
    let outcome = completed(output);
    JobSpec {
        kind: "subagent".to_owned(),
        label: "research".to_owned(),
        owner: SessionId::from("parent"),
        starter: Box::new(move || JobHooks {
            cancel: Box::new(|_| {}),
            done: Box::pin(async move {
                let _ = go.await;
                fire.cancel(CancelCause::User);
                outcome
            }),
        }),
    }
}

fn result_text(executed: &ExecutedTool) -> String {
    visible_text(&executed.result.content)
}

/// A `job_output` wait whose call is cancelled in the very moment the job settles (the
/// producer fires the call's signal right before `done` resolves) does not lose the output.
/// The pipeline records the call as aborted, so the wait must not have claimed the report:
/// the job stays unreported, its completion notice is emitted, and a later `job_output` still
/// reads the output (and only then marks the job reported).
#[tokio::test(start_paused = true)]
async fn job_output_wait_cancelled_as_the_job_settles_leaves_the_output_to_the_notice() {
    let h = Pipeline::new();
    let (notices, _notices) = record_notices(&h.registry);
    let signal = Signal::new();
    let (go, gate) = oneshot::channel();
    let job = h
        .registry
        .start_job(settles_cancelling(signal.clone(), gate, "background answer"))
        .unwrap();
    let call = h.spawn_output(json!({"job_id": "subagent-1", "wait": true}), signal.clone());
    settle_tasks().await;
    assert_eq!(h.registry.counts().waiters, 1, "the call is waiting");
    go.send(()).unwrap();
    let executed = call.await.unwrap();
    assert!(signal.is_cancelled());
    // The call's result was discarded as aborted: it does not carry the output.
    assert!(executed.result.is_error, "{:?}", executed.result);
    assert_eq!(
        executed.result.error.as_ref().map(|e| e.code.as_str()),
        Some(codes::CANCELLED)
    );
    assert!(!result_text(&executed).contains("background answer"));
    // So the output was not consumed: the job is unreported and its notice went out.
    let parent = SessionId::from("parent");
    let snapshot = h.registry.get(&parent, &job).unwrap();
    assert_eq!(
        (snapshot.status, snapshot.reported),
        (JobStatus::Completed, false)
    );
    let sent = notices.lock().clone();
    assert_eq!(sent.len(), 1, "the completion notice is delivered after all");
    assert_eq!(sent[0].job.id, job);
    assert_eq!(
        sent[0].text,
        "background job subagent-1 (subagent: research) finished [status: completed]. Read its output with job_output."
    );
    assert_eq!(h.registry.counts().waiters, 0);
    // A later call reads the output and claims the report.
    let later = h
        .spawn_output(json!({"job_id": "subagent-1", "wait": true}), Signal::new())
        .await
        .unwrap();
    assert!(!later.result.is_error);
    assert_eq!(result_text(&later), "background answer\n[status: completed]");
    assert!(h.registry.get(&parent, &job).unwrap().reported);
    assert_eq!(notices.lock().len(), 1);
    assert_ends_empty(&h.registry).await;
}

/// The uncancelled path keeps its semantics through the pipeline: the waiting `job_output`
/// delivers the output, marks the job reported and so suppresses the completion notice.
#[tokio::test(start_paused = true)]
async fn job_output_wait_that_delivers_claims_the_report_through_the_pipeline() {
    let h = Pipeline::new();
    let (notices, _notices) = record_notices(&h.registry);
    let (spec, p) = producer("subagent", "research", "parent");
    let job = h.registry.start_job(spec).unwrap();
    let call = h.spawn_output(json!({"job_id": "subagent-1", "wait": true}), Signal::new());
    settle_tasks().await;
    assert_eq!(h.registry.counts().waiters, 1);
    p.settle(completed("background answer"));
    let executed = call.await.unwrap();
    assert!(!executed.result.is_error, "{:?}", executed.result);
    assert_eq!(result_text(&executed), "background answer\n[status: completed]");
    assert!(h.registry.get(&SessionId::from("parent"), &job).unwrap().reported);
    settle_tasks().await;
    assert!(
        notices.lock().is_empty(),
        "the delivering wait reported the settlement"
    );
    assert_ends_empty(&h.registry).await;
}

/// `job_output` without wait, made once its call signal has fired (the pipeline will discard
/// its result), does not claim the report either: a settlement whose notice is held for a
/// waiter still gets its notice once that waiter abandons.
#[tokio::test(start_paused = true)]
async fn job_output_without_wait_under_a_fired_signal_does_not_claim_the_report() {
    let h = Harness::new();
    let (notices, _notices) = record_notices(&h.registry);
    let (spec, p) = producer("bash", "x", "parent");
    let job = h.registry.start_job(spec).unwrap();
    let parent = SessionId::from("parent");
    let waiter_signal = Signal::new();
    let waiter = h.registry.wait_settled(&parent, &job, None, &waiter_signal);
    tokio::pin!(waiter);
    assert!(poll!(&mut waiter).is_pending(), "the waiter is registered");
    p.settle(completed("answer"));
    settle_tasks().await;
    assert!(notices.lock().is_empty(), "the notice is held for the waiter");
    let fired = Signal::new();
    fired.cancel(CancelCause::User);
    let (text, _) = h
        .call_with("parent", "job_output", json!({"job_id": "bash-1"}), fired)
        .await
        .unwrap();
    assert_eq!(text, "answer\n[status: completed]");
    // The waiter's call is cancelled too: nobody delivered the output, so the notice goes out.
    waiter_signal.cancel(CancelCause::User);
    assert_eq!(waiter.await, Ok(true));
    assert_eq!(notices.lock().len(), 1);
    assert!(!h.registry.get(&parent, &JobId("bash-1".into())).unwrap().reported);
    assert_ends_empty(&h.registry).await;
}

/// The real `job_output` body, after which its own call's signal fires before it returns: the
/// cancellation lands after the body's locked check, as one from another thread cancelling the
/// turn would, but deterministically.
struct CancelsAfterReturn(Arc<dyn agent::tools::ToolHandler>);

#[async_trait::async_trait]
impl agent::tools::ToolHandler for CancelsAfterReturn {
    async fn execute(
        &self,
        arguments: Value,
        ctx: ToolContext,
    ) -> Result<agent::tools::ToolOutput, ToolError> {
        let output = self.0.execute(arguments, ctx.clone()).await;
        ctx.signal.cancel(CancelCause::User);
        output
    }
}

impl Pipeline {
    /// Registers `job_output_racing`: the real `job_output` over this registry wrapped in
    /// [`CancelsAfterReturn`].
    fn register_racing_output(&self) -> agent::Registration {
        let real = job_tools(self.registry.clone())
            .into_iter()
            .find(|def| def.name == "job_output")
            .expect("job_output is built");
        let racing = ToolDefinition {
            name: "job_output_racing".to_owned(),
            handler: Arc::new(CancelsAfterReturn(real.handler)),
            ..real
        };
        self.tools.register(None, racing).expect("racing tool registers")
    }

    /// Runs one call of `parent` through the pipeline under a fresh signal.
    async fn execute(&self, name: &str, args: Value) -> ExecutedTool {
        let call = ToolCallRequest {
            call_id: CallId::from("call-2"),
            name: name.to_owned(),
            arguments: args.to_string(),
        };
        self.tools
            .execute(&SessionId::from("parent"), call, Signal::new())
            .await
    }
}

impl Pipeline {
    /// A later plain `job_output` of `parent`'s `job` reads `text` and only then marks the job
    /// reported; `notices` recorded exactly one completion notice. Ends the registry.
    async fn later_read_delivers(
        &self,
        job: &JobId,
        text: &str,
        notices: &parking_lot::Mutex<Vec<JobNotice>>,
    ) {
        let later = self
            .execute("job_output", json!({"job_id": job.to_string()}))
            .await;
        assert!(!later.result.is_error, "{:?}", later.result);
        assert_eq!(result_text(&later), text);
        let parent = SessionId::from("parent");
        assert!(self.registry.get(&parent, job).unwrap().reported);
        assert_eq!(notices.lock().len(), 1, "exactly one notice");
        assert_ends_empty(&self.registry).await;
    }
}

fn assert_cancelled_without_output(executed: &ExecutedTool, output: &str) {
    assert!(executed.result.is_error, "{:?}", executed.result);
    assert_eq!(
        executed.result.error.as_ref().map(|e| e.code.as_str()),
        Some(codes::CANCELLED)
    );
    assert!(!result_text(executed).contains(output));
}

/// spec: TOOL-37 (and `acp-and-tools.md` §3.8 step 6: later interaction is through
/// `job_output` and completion notices) — a waiting `job_output` that delivers the output and
/// claims the report, but whose call signal fires after that locked check (before the body
/// returns), is recorded CANCELLED by the pipeline; the discarded success gives its claim back,
/// so the job is not reported, its held completion notice is emitted exactly once, and a later
/// `job_output` still reads the output and only then marks the job reported.
#[tokio::test(start_paused = true)]
async fn job_output_wait_discarded_after_it_claimed_gives_the_report_back() {
    let h = Pipeline::new();
    let _racing = h.register_racing_output();
    let (notices, _notices) = record_notices(&h.registry);
    let (spec, p) = producer("subagent", "research", "parent");
    let job = h.registry.start_job(spec).unwrap();
    let parent = SessionId::from("parent");
    let call = {
        let tools = h.tools.clone();
        tokio::spawn(async move {
            let call = ToolCallRequest {
                call_id: CallId::from("call-1"),
                name: "job_output_racing".to_owned(),
                arguments: json!({"job_id": "subagent-1", "wait": true}).to_string(),
            };
            tools
                .execute(&SessionId::from("parent"), call, Signal::new())
                .await
        })
    };
    settle_tasks().await;
    assert_eq!(h.registry.counts().waiters, 1, "the call is waiting");
    p.settle(completed("background answer"));
    let executed = call.await.unwrap();
    assert_cancelled_without_output(&executed, "background answer");
    let snapshot = h.registry.get(&parent, &job).unwrap();
    assert_eq!(
        (snapshot.status, snapshot.reported),
        (JobStatus::Completed, false),
        "the discarded read did not consume the output"
    );
    let sent = notices.lock().clone();
    assert_eq!(sent.len(), 1, "the completion notice is delivered after all");
    assert_eq!(sent[0].job.id, job);
    assert_eq!(h.registry.counts().waiters, 0);

    h.later_read_delivers(&job, "background answer\n[status: completed]", &notices)
        .await;
}

/// spec: TOOL-37 — the same for `job_output` without wait: the read claims the report of a
/// settled job whose notice is held for another waiter, then its call signal fires before the
/// body returns. The pipeline records the call CANCELLED, the claim is given back, so when the
/// waiter abandons the notice goes out exactly once, and a later read delivers the output.
#[tokio::test(start_paused = true)]
async fn job_output_without_wait_discarded_after_it_claimed_gives_the_report_back() {
    let h = Pipeline::new();
    let _racing = h.register_racing_output();
    let (notices, _notices) = record_notices(&h.registry);
    let (spec, p) = producer("bash", "x", "parent");
    let job = h.registry.start_job(spec).unwrap();
    let parent = SessionId::from("parent");
    let waiter_signal = Signal::new();
    let waiter = h.registry.wait_settled(&parent, &job, None, &waiter_signal);
    tokio::pin!(waiter);
    assert!(poll!(&mut waiter).is_pending(), "the waiter is registered");
    p.settle(completed("answer"));
    settle_tasks().await;
    assert!(notices.lock().is_empty(), "the notice is held for the waiter");

    let executed = h.execute("job_output_racing", json!({"job_id": "bash-1"})).await;
    assert_cancelled_without_output(&executed, "answer");
    assert!(!h.registry.get(&parent, &job).unwrap().reported);
    assert!(notices.lock().is_empty(), "still held for the waiter");

    // The waiter's call is cancelled too: nobody delivered the output, so the notice goes out.
    waiter_signal.cancel(CancelCause::User);
    assert_eq!(waiter.await, Ok(true));
    assert_eq!(
        notices.lock().len(),
        1,
        "the completion notice is delivered after all"
    );
    assert!(!h.registry.get(&parent, &job).unwrap().reported);

    h.later_read_delivers(&job, "answer\n[status: completed]", &notices)
        .await;
}

/// A discarded read of a job whose notice already went out (it settled unreported before the
/// read) gives the claim back without a second notice, and a discarded read never undoes a
/// report another, delivered read made.
#[tokio::test(start_paused = true)]
async fn a_discarded_read_never_duplicates_a_notice_nor_undoes_a_delivered_read() {
    let h = Pipeline::new();
    let _racing = h.register_racing_output();
    let (notices, _notices) = record_notices(&h.registry);
    let (spec, p) = producer("bash", "x", "parent");
    let job = h.registry.start_job(spec).unwrap();
    let parent = SessionId::from("parent");
    p.settle(completed("answer"));
    settle_tasks().await;
    assert_eq!(notices.lock().len(), 1, "settled unreported: notified");

    let executed = h.execute("job_output_racing", json!({"job_id": "bash-1"})).await;
    assert_cancelled_without_output(&executed, "answer");
    assert!(!h.registry.get(&parent, &job).unwrap().reported);
    assert_eq!(notices.lock().len(), 1, "no second notice");

    let delivered = h.execute("job_output", json!({"job_id": "bash-1"})).await;
    assert_eq!(result_text(&delivered), "answer\n[status: completed]");
    let executed = h.execute("job_output_racing", json!({"job_id": "bash-1"})).await;
    assert_cancelled_without_output(&executed, "answer");
    assert!(
        h.registry.get(&parent, &job).unwrap().reported,
        "the delivered read's report stands"
    );
    assert_eq!(notices.lock().len(), 1);
    assert_ends_empty(&h.registry).await;
}

/// A parallel-safe tool whose body never settles.
struct NeverSettles;

#[async_trait::async_trait]
impl agent::tools::ToolHandler for NeverSettles {
    async fn execute(
        &self,
        _arguments: Value,
        _ctx: ToolContext,
    ) -> Result<agent::tools::ToolOutput, ToolError> {
        std::future::pending().await
    }
}

/// Polls `step` until every task blocks; it must not complete.
async fn drive_pending<F: std::future::Future + Unpin>(step: &mut F) {
    tokio::select! {
        biased;
        _ = step => panic!("the step is expected to stay pending"),
        () = settle_tasks() => {}
    }
}

/// spec: TOOL-37 — a `job_output` wait that delivered the output (claiming the report, so the
/// held completion notice is suppressed) inside a parallel group, behind an earlier call that
/// is still running, is never recorded if the step is dropped before its commit (a host bounding
/// the step, a runtime shutting down). Its claim goes back with the dropped success: the job
/// reads unreported, the completion notice goes out once, and a later `job_output` still reads
/// the output. Before, the job stayed reported with no notice: its output was lost to the owner.
#[tokio::test(start_paused = true)]
async fn job_output_dropped_with_its_step_before_its_commit_gives_the_report_back() {
    let h = Pipeline::new();
    let _slow = h
        .tools
        .register(
            None,
            ToolDefinition {
                name: "slow".to_owned(),
                description: "never settles".to_owned(),
                parameters: json!({"type": "object"}),
                concurrency_safe: true,
                handler: Arc::new(NeverSettles),
            },
        )
        .unwrap();
    let (notices, _notices) = record_notices(&h.registry);
    let (spec, p) = producer("subagent", "research", "parent");
    let job = h.registry.start_job(spec).unwrap();
    let parent = SessionId::from("parent");
    let call = |id: &str, name: &str, args: Value| ToolCallRequest {
        call_id: CallId::from(id),
        name: name.to_owned(),
        arguments: args.to_string(),
    };
    let calls = vec![
        call("call-1", "slow", json!({})),
        call(
            "call-2",
            "job_output",
            json!({"job_id": "subagent-1", "wait": true}),
        ),
    ];
    let signal = Signal::new();
    let mut step = Box::pin(crate::tools::run_step_calls(&h.tools, &parent, calls, &signal, 4));
    drive_pending(&mut step).await;
    assert_eq!(h.registry.counts().waiters, 1, "job_output is waiting");
    p.settle(completed("background answer"));
    drive_pending(&mut step).await;
    assert_eq!(h.registry.counts().waiters, 0, "the wait delivered");
    assert!(
        h.registry.get(&parent, &job).unwrap().reported,
        "the delivering wait claimed the report"
    );
    assert!(notices.lock().is_empty(), "its notice is suppressed");

    drop(step);
    assert!(
        !h.registry.get(&parent, &job).unwrap().reported,
        "the dropped, never recorded read gave its claim back"
    );
    assert_eq!(
        notices.lock().len(),
        1,
        "the completion notice is delivered after all"
    );
    h.later_read_delivers(&job, "background answer\n[status: completed]", &notices)
        .await;
}

/// A session observer that vetoes every `tool/result` append while `on` is set.
struct VetoToolResults {
    on: std::sync::atomic::AtomicBool,
}

impl agent::SessionObserver for VetoToolResults {
    fn check(&self, _session: &agent::Session, candidate: &agent::SessionEvent) -> Result<(), String> {
        if self.on.load(std::sync::atomic::Ordering::SeqCst)
            && matches!(candidate.data, agent::EventData::ToolResult { .. })
        {
            return Err("tool/result is vetoed".to_owned());
        }
        Ok(())
    }
}

/// The texts of the logged `tool/result`s answering `call_id`.
fn logged_results(agent: &dyn agent::Agent, call_id: &str) -> Vec<String> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            agent::EventData::ToolResult { message, .. } => message.content.iter().find_map(|b| match b {
                agent::ContentBlock::ToolResult {
                    tool_call_id,
                    content,
                    ..
                } if tool_call_id.to_string() == call_id => Some(visible_text(content)),
                _ => None,
            }),
            _ => None,
        })
        .collect()
}

/// spec: TOOL-37 — a `job_output` wait run by an agent's turn delivers the output of the job
/// that settled under it (claiming the report, so the held completion notice is suppressed),
/// but the session log refuses its `tool/result` (an observer's veto): the model never sees
/// the output, so the committed success gives its claim back — the job reads unreported, its
/// completion notice goes out once, and a later `job_output` (once the log accepts results
/// again) returns the output. Before, the step's contexts were dropped with their hooks unrun:
/// the job stayed reported with no notice, and the output was lost to the model.
#[tokio::test(start_paused = true)]
async fn job_output_whose_logged_result_is_refused_gives_the_report_back() {
    use crate::model::{ScriptedModel, chunks};
    use crate::runtime::testkit::{builder, create, finish, user};

    let model = ScriptedModel::new([
        chunks::tool_call("c1", "job_output", json!({"job_id": "subagent-1", "wait": true})),
        chunks::tool_call("c2", "job_output", json!({"job_id": "subagent-1"})),
        chunks::text("done"),
    ]);
    let veto = Arc::new(VetoToolResults {
        on: std::sync::atomic::AtomicBool::new(true),
    });
    let registry = Arc::new(JobRegistry::new());
    let rt = builder(&model)
        .session_observer(veto.clone())
        .jobs(registry.clone())
        .build();
    let _tools: Vec<agent::Registration> = job_tools(registry.clone())
        .into_iter()
        .map(|def| rt.services().tools.register(None, def).unwrap())
        .collect();
    let (notices, _notices) = record_notices(&registry);
    let (spec, p) = producer("subagent", "research", "a");
    let job = registry.start_job(spec).unwrap();
    let owner = SessionId::from("a");
    let handle = create(&rt, "a").await;
    let agent = handle.agent().clone();

    agent.followup(user("read it")).unwrap();
    settle_tasks().await;
    assert_eq!(registry.counts().waiters, 1, "job_output is waiting");
    p.settle(completed("background answer"));
    agent.when_idle().await;
    assert!(
        logged_results(&*agent, "c1").is_empty(),
        "the tool/result was refused"
    );
    let snapshot = registry.get(&owner, &job).unwrap();
    assert_eq!(
        (snapshot.status, snapshot.reported),
        (JobStatus::Completed, false),
        "the refused read gave its claim on the report back"
    );
    assert_eq!(notices.lock().len(), 1, "the completion notice goes out");
    assert_eq!(notices.lock()[0].job.id, job);

    veto.on.store(false, std::sync::atomic::Ordering::SeqCst);
    agent.followup(user("read it again")).unwrap();
    agent.when_idle().await;
    assert_eq!(
        logged_results(&*agent, "c2"),
        ["background answer\n[status: completed]"]
    );
    assert!(registry.get(&owner, &job).unwrap().reported);
    assert_eq!(notices.lock().len(), 1, "exactly one notice");
    finish(&rt, [handle]).await;
}
