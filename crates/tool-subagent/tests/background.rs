//! The one-shot background route on the real job registry and job tools
//! (`acp-and-tools.md` §3.8).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent::jobs::Jobs;
use agent::{CancelCause, ContentBlock, Signal};
use agent_loop::jobs::{JobRegistry, JobRegistryConfig};
use common::{FakeProvider, FakeRun, Host, PanicAt, PanickingRun, completed, failure, text};
use futures::FutureExt;
use parking_lot::Mutex;
use serde_json::json;
use subagent::{StopReason, SubagentError, SubagentErrorCode, SubagentResult};

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

fn background() -> serde_json::Value {
    json!({"description": "deep research", "prompt": "dig in", "run_in_background": true})
}

/// spec: TOOL-36 — one-shot mode over a continuable-capable provider starts a background job
/// and never calls continuable preparation.
#[tokio::test(start_paused = true)]
async fn tool_36_one_shot_mode_ignores_continuable_capability() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("resumable", "done", counter()).with_continuable();
    let prepared = provider.prepare_calls.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({
        "provider": "resumable",
        "toolName": "subagent_resumable",
        "backgroundMode": "one-shot",
        "maxDepth": "provider-managed",
    }));
    let parent = host.parent("parent").await;
    let started = host.call("subagent_resumable", &parent, background()).await;
    assert_eq!(text(&started), "started background subagent job subagent-1");
    assert_eq!(prepared.load(Ordering::SeqCst), 0);
    host.close().await;
}

/// spec: TOOL-37 — a background start returns `{kind: background, jobId: subagent-1}`;
/// `job_output` with wait returns `background answer\n[status: completed]`, and again on a
/// second read.
#[tokio::test(start_paused = true)]
async fn tool_37_background_answer_is_collected_with_job_output() {
    let mut host = Host::new();
    let disposals = counter();
    let provider = FakeProvider::replying("mock", "background answer", disposals.clone());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "mock", "agentOptions": {"model": "child-model"}}));
    let parent = host.parent("sess-parent").await;
    let start = host.call("subagent", &parent, background()).await;
    assert!(!start.is_error, "{}", text(&start));
    assert_eq!(
        start.value,
        Some(json!({"kind": "background", "jobId": "subagent-1"}))
    );
    assert_eq!(text(&start), "started background subagent job subagent-1");
    let collected = host.job_output(&parent, "subagent-1").await;
    assert_eq!(text(&collected), "background answer\n[status: completed]");
    let again = host
        .call("job_output", &parent, json!({"job_id": "subagent-1"}))
        .await;
    assert_eq!(text(&again), "background answer\n[status: completed]");
    assert_eq!(
        disposals.load(Ordering::SeqCst),
        1,
        "disposed before the job settled"
    );
    let jobs = host.jobs.clone().expect("host has jobs");
    let listed = jobs.list(&parent);
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].kind, "subagent");
    assert_eq!(listed[0].label, "deep research");
    assert_eq!(requests.lock()[0].request.label.as_deref(), Some("deep research"));
    host.close().await;
}

/// spec: TOOL-38 — a background failure with a diagnostic shows
/// `(no new output)\n[status: failed, error; diagnostic: <d>]`.
#[tokio::test(start_paused = true)]
async fn tool_38_background_failure_keeps_the_diagnostic() {
    let mut host = Host::new();
    let result = SubagentResult::new(
        vec![ContentBlock::text("not background output")],
        StopReason::Error,
    )
    .with_diagnostic("Claude Code cancelled an unattended dialog");
    let _p = host.provider(FakeProvider::resulting("mock", result, counter()));
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("sess-parent").await;
    let started = host.call("subagent", &parent, background()).await;
    assert_eq!(text(&started), "started background subagent job subagent-1");
    let output = host.job_output(&parent, "subagent-1").await;
    assert_eq!(
        text(&output),
        "(no new output)\n[status: failed, error; diagnostic: Claude Code cancelled an unattended dialog]"
    );
    host.close().await;
}

/// spec: TOOL-39 — a background call on a host without a job registry fails.
#[tokio::test(start_paused = true)]
async fn tool_39_background_without_job_registry() {
    let mut host = Host::without_jobs();
    let provider = FakeProvider::replying("mock", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, background()).await;
    assert!(outcome.is_error);
    assert!(text(&outcome).contains("background jobs unavailable: load @deepseek-ai/dsh-jobs"));
    assert!(requests.lock().is_empty());
    host.close().await;
}

/// spec: TOOL-40 — a background call with a pre-aborted token errors exactly
/// `Error: tool call aborted before dispatch` and starts no job.
#[tokio::test(start_paused = true)]
async fn tool_40_pre_aborted_background_call() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("mock", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("sess-parent").await;
    let outcome = host
        .call_with(
            "subagent",
            &parent,
            background(),
            Signal::cancelled_with(CancelCause::User),
        )
        .await;
    assert!(outcome.is_error);
    assert_eq!(text(&outcome), "Error: tool call aborted before dispatch");
    assert_eq!(
        outcome.error.map(|e| e.code),
        Some("TOOL_ABORTED_BEFORE_DISPATCH".to_owned())
    );
    assert!(host.jobs.as_ref().expect("jobs").snapshots(&parent).is_empty());
    assert!(requests.lock().is_empty());
    host.close().await;
}

/// spec: TOOL-41 — an asynchronous provider-start failure settles the job `failed` with the
/// error's display string (in Rust the message chain, without a JavaScript class-name prefix).
#[tokio::test(start_paused = true)]
async fn tool_41_start_failure_settles_failed() {
    let mut host = Host::new();
    let _p = host.provider(
        FakeProvider::new(
            "broken-start",
            Arc::new(|_| {
                async {
                    Err(SubagentError::new(
                        SubagentErrorCode::ProviderFailed,
                        "setup failed",
                    ))
                }
                .boxed()
            }),
        )
        .capability_less(),
    );
    let _tool = host.load(tool_subagent::SubagentToolConfig {
        tool_name: "subagent_broken".into(),
        ..tool_subagent::SubagentToolConfig::new("broken-start")
    });
    let parent = host.parent("sess-parent").await;
    let started = host.call("subagent_broken", &parent, background()).await;
    assert_eq!(text(&started), "started background subagent job subagent-1");
    let output = host.job_output(&parent, "subagent-1").await;
    assert_eq!(text(&output), "(no new output)\n[status: failed, setup failed]");
    host.close().await;
}

/// A startup rejection whose message already ends with its cause's text (the in-process
/// driver's `agent "<id>" setup failed: <cause>`, keeping the cause as its source) settles the
/// job `failed` with that text once, the cause not repeated after itself (§3.8 step 5).
#[tokio::test(start_paused = true)]
async fn a_start_rejection_names_its_cause_once_in_the_job() {
    let mut host = Host::new();
    let _p = host.provider(FakeProvider::new(
        "spawn",
        Arc::new(|_| {
            let failure = subagent_inprocess::StartFailure::Create(agent::AgentError::Setup {
                id: "child-1".into(),
                source: "unknown global tool \"nonexistent\"".into(),
            });
            async move { Err(failure.into()) }.boxed()
        }),
    ));
    let _tool = host.load_json(json!({"provider": "spawn"}));
    let parent = host.parent("sess-parent").await;
    let started = host.call("subagent", &parent, background()).await;
    assert_eq!(text(&started), "started background subagent job subagent-1");
    let output = host.job_output(&parent, "subagent-1").await;
    assert_eq!(
        text(&output),
        "(no new output)\n[status: failed, agent \"child-1\" setup failed: unknown global tool \"nonexistent\"]"
    );
    host.close().await;
}

fn pending_start(name: &str, rejection: SubagentError) -> FakeProvider {
    FakeProvider::new(
        name,
        Arc::new(move |request| {
            let signal = request.request.signal.clone();
            let rejection = rejection.clone();
            async move {
                signal.cancelled().await;
                Err(rejection)
            }
            .boxed()
        }),
    )
    .capability_less()
}

/// spec: TOOL-42 — killing a job whose provider startup is still pending settles it `killed`.
#[tokio::test(start_paused = true)]
async fn tool_42_kill_during_startup_is_killed() {
    let mut host = Host::new();
    let _p = host.provider(pending_start(
        "pending-start",
        SubagentError::new(SubagentErrorCode::Cancelled, "startup aborted"),
    ));
    let _tool = host.load(tool_subagent::SubagentToolConfig {
        tool_name: "subagent_pending".into(),
        ..tool_subagent::SubagentToolConfig::new("pending-start")
    });
    let parent = host.parent("sess-parent").await;
    host.call("subagent_pending", &parent, background()).await;
    let kill = host
        .call(
            "job_kill",
            &parent,
            json!({"job_id": "subagent-1", "reason": "no longer needed"}),
        )
        .await;
    assert_eq!(text(&kill), "requested cancellation of job subagent-1");
    let output = host.job_output(&parent, "subagent-1").await;
    assert_eq!(text(&output), "(no new output)\n[status: killed]");
    host.close().await;
}

/// spec: TOOL-43 — a kill during startup whose rollback also fails settles `failed` with the
/// combined startup-and-cleanup failure, never `killed`.
#[tokio::test(start_paused = true)]
async fn tool_43_kill_during_startup_with_failed_rollback_is_failed() {
    let mut host = Host::new();
    let _p = host.provider(pending_start(
        "broken-start-rollback",
        SubagentError::new(
            SubagentErrorCode::ActivationTeardownFailed,
            "startup failed and cleanup also failed",
        ),
    ));
    let _tool = host.load(tool_subagent::SubagentToolConfig {
        tool_name: "subagent_broken_rollback".into(),
        ..tool_subagent::SubagentToolConfig::new("broken-start-rollback")
    });
    let parent = host.parent("sess-parent").await;
    host.call("subagent_broken_rollback", &parent, background()).await;
    host.call("job_kill", &parent, json!({"job_id": "subagent-1"}))
        .await;
    let output = host.job_output(&parent, "subagent-1").await;
    assert_eq!(
        text(&output),
        "(no new output)\n[status: failed, startup failed and cleanup also failed]"
    );
    host.close().await;
}

/// spec: TOOL-44 — `job_kill` reasons reach the run's token (`superseded`), the default reason
/// is `background subagent task killed`, the kill renders `requested cancellation of job <id>`,
/// and the job settles `killed`.
#[tokio::test(start_paused = true)]
async fn tool_44_kill_reasons_reach_the_run() {
    let mut host = Host::new();
    let cancels: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let disposals = counter();
    let (seen, d) = (cancels.clone(), disposals.clone());
    let starts = counter();
    let provider = FakeProvider::new(
        "hanging",
        Arc::new(move |request| {
            let signal = request.request.signal.clone();
            let label = request.request.label.clone().unwrap_or_default();
            let seen = seen.clone();
            let result = async move {
                signal.cancelled().await;
                let reason = match signal.cause() {
                    Some(CancelCause::Other { reason }) => reason,
                    other => format!("{other:?}"),
                };
                seen.lock().insert(label, reason);
                Ok(SubagentResult::aborted(vec![]))
            }
            .boxed();
            let n = starts.fetch_add(1, Ordering::SeqCst) + 1;
            let run = FakeRun::boxed(&format!("hang-{n}"), result, Ok(()), d.clone());
            async move { Ok(run) }.boxed()
        }),
    )
    .capability_less();
    let _p = host.provider(provider);
    let _tool = host.load(tool_subagent::SubagentToolConfig {
        tool_name: "subagent_hang".into(),
        ..tool_subagent::SubagentToolConfig::new("hanging")
    });
    let parent = host.parent("sess-parent").await;
    let one = host
        .call(
            "subagent_hang",
            &parent,
            json!({"description": "one", "prompt": "p", "run_in_background": true}),
        )
        .await;
    let two = host
        .call(
            "subagent_hang",
            &parent,
            json!({"description": "two", "prompt": "p", "run_in_background": true}),
        )
        .await;
    assert_eq!(text(&one), "started background subagent job subagent-1");
    assert_eq!(text(&two), "started background subagent job subagent-2");
    let with_reason = host
        .call(
            "job_kill",
            &parent,
            json!({"job_id": "subagent-1", "reason": "superseded"}),
        )
        .await;
    let without_reason = host
        .call("job_kill", &parent, json!({"job_id": "subagent-2"}))
        .await;
    assert_eq!(text(&with_reason), "requested cancellation of job subagent-1");
    assert_eq!(text(&without_reason), "requested cancellation of job subagent-2");
    let killed = host.job_output(&parent, "subagent-1").await;
    assert_eq!(text(&killed), "(no new output)\n[status: killed]");
    let killed = host.job_output(&parent, "subagent-2").await;
    assert_eq!(text(&killed), "(no new output)\n[status: killed]");
    assert_eq!(
        *cancels.lock(),
        BTreeMap::from([
            ("one".to_owned(), "superseded".to_owned()),
            ("two".to_owned(), "background subagent task killed".to_owned()),
        ])
    );
    assert_eq!(disposals.load(Ordering::SeqCst), 2);
    host.close().await;
}

/// spec: TOOL-50 — a failing job preflight (no job controller serves the caller) means the
/// provider's start is never called.
#[tokio::test(start_paused = true)]
async fn tool_50_failed_preflight_never_starts_the_provider() {
    let mut host = Host::with_jobs(JobRegistry::with_config(JobRegistryConfig {
        require_controller: true,
        ..JobRegistryConfig::default()
    }));
    let provider = FakeProvider::replying("mock", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("sess-parent").await;
    let outcome = host.call("subagent", &parent, background()).await;
    assert!(outcome.is_error);
    // The spec's text, verbatim (§3.8 step 2): the refusal names its remedy.
    assert_eq!(
        text(&outcome),
        "Error: background jobs unavailable: no job controller serves this agent (load \
         @deepseek-ai/dsh-tool-jobs in its composition)"
    );
    tokio::task::yield_now().await;
    assert!(requests.lock().is_empty());
    host.close().await;
}

/// spec: TOOL-56 — the job outcome mapping through the tool: completed → the output text;
/// aborted → killed; error / max-tokens / refusal / unknown → failed with the reason; a
/// rejected result → failed with its error; a failing dispose → `dispose failed: …`; both →
/// `…; dispose failed: …`; the run is disposed before the job reports.
#[tokio::test(start_paused = true)]
async fn tool_56_settlement_mapping() {
    type Script = (
        fn() -> futures::future::BoxFuture<'static, Result<SubagentResult, subagent::run::RunFailure>>,
        bool,
        &'static str,
    );
    let cases: Vec<Script> = vec![
        (
            || async { Ok(completed("partial")) }.boxed(),
            false,
            "partial\n[status: completed]",
        ),
        (
            || async { Ok(SubagentResult::aborted(vec![ContentBlock::text("partial")])) }.boxed(),
            false,
            "(no new output)\n[status: killed]",
        ),
        (
            || async { Ok(SubagentResult::new(vec![], StopReason::Error)) }.boxed(),
            false,
            "(no new output)\n[status: failed, error]",
        ),
        (
            || async { Ok(SubagentResult::new(vec![], StopReason::MaxTokens)) }.boxed(),
            false,
            "(no new output)\n[status: failed, max-tokens]",
        ),
        (
            || async { Ok(SubagentResult::new(vec![], StopReason::Refusal)) }.boxed(),
            false,
            "(no new output)\n[status: failed, refusal]",
        ),
        (
            || async { Ok(SubagentResult::new(vec![], StopReason::Other("paused".into()))) }.boxed(),
            false,
            "(no new output)\n[status: failed, paused]",
        ),
        (
            || async { Err(failure("transport gone")) }.boxed(),
            false,
            "(no new output)\n[status: failed, transport gone]",
        ),
        (
            || async { Ok(completed("ok")) }.boxed(),
            true,
            "(no new output)\n[status: failed, dispose failed: reap failed]",
        ),
        (
            || async { Err(failure("transport gone")) }.boxed(),
            true,
            "(no new output)\n[status: failed, transport gone; dispose failed: reap failed]",
        ),
    ];
    for (result, dispose_fails, expected) in cases {
        let mut host = Host::new();
        let disposals = counter();
        let d = disposals.clone();
        let _p = host.provider(FakeProvider::new(
            "mock",
            Arc::new(move |_| {
                let dispose = if dispose_fails {
                    Err(failure("reap failed"))
                } else {
                    Ok(())
                };
                let run = FakeRun::boxed("child", result(), dispose, d.clone());
                async move { Ok(run) }.boxed()
            }),
        ));
        let _tool = host.load_json(json!({"provider": "mock"}));
        let parent = host.parent("parent").await;
        host.call("subagent", &parent, background()).await;
        let output = host.job_output(&parent, "subagent-1").await;
        assert_eq!(text(&output), expected);
        assert_eq!(disposals.load(Ordering::SeqCst), 1, "{expected}");
        host.close().await;
    }
}

/// Once the job id is returned the call's token no longer owns the child: cancelling it does
/// not cancel the run.
#[tokio::test(start_paused = true)]
async fn the_call_token_does_not_own_a_background_child() {
    let mut host = Host::new();
    let gate = Arc::new(tokio::sync::Notify::new());
    let g = gate.clone();
    let observed = Arc::new(Mutex::new(None::<bool>));
    let o = observed.clone();
    let _p = host.provider(FakeProvider::new(
        "mock",
        Arc::new(move |request| {
            let (g, o) = (g.clone(), o.clone());
            let signal = request.request.signal.clone();
            let result = async move {
                g.notified().await;
                *o.lock() = Some(signal.is_cancelled());
                Ok(completed("still ran"))
            }
            .boxed();
            let run = FakeRun::boxed("child", result, Ok(()), Arc::new(AtomicUsize::new(0)));
            async move { Ok(run) }.boxed()
        }),
    ));
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("parent").await;
    let call_signal = Signal::new();
    let started = host
        .call_with("subagent", &parent, background(), call_signal.clone())
        .await;
    assert_eq!(text(&started), "started background subagent job subagent-1");
    call_signal.cancel(CancelCause::User);
    gate.notify_one();
    let output = host.job_output(&parent, "subagent-1").await;
    assert_eq!(text(&output), "still ran\n[status: completed]");
    assert_eq!(*observed.lock(), Some(false));
    host.close().await;
}

/// Disposing the owner's jobs cancels the run and awaits its disposal, so a background child
/// never outlives its parent (§3.8 step 7).
#[tokio::test(start_paused = true)]
async fn owner_disposal_cancels_and_disposes_the_run() {
    let mut host = Host::new();
    let disposals = counter();
    let d = disposals.clone();
    let _p = host.provider(FakeProvider::new(
        "mock",
        Arc::new(move |request| {
            let signal = request.request.signal.clone();
            let result = async move {
                signal.cancelled().await;
                Ok(SubagentResult::aborted(vec![]))
            }
            .boxed();
            let run = FakeRun::boxed("child", result, Ok(()), d.clone());
            async move { Ok(run) }.boxed()
        }),
    ));
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("parent").await;
    host.call("subagent", &parent, background()).await;
    tokio::task::yield_now().await;
    let jobs = host.jobs.clone().expect("host has jobs");
    jobs.dispose_owner(&parent).await;
    assert_eq!(disposals.load(Ordering::SeqCst), 1);
    assert!(jobs.list(&parent).is_empty());
    host.close().await;
}

/// A third-party run that panics in `result()`, its result future, `dispose()` or its disposal
/// future settles its job `failed` with a detail naming the provider and the panic; the run is
/// disposed — once, before the job reports — even when its result panicked, so the job's
/// settlement still means the child's resources are released.
#[tokio::test(start_paused = true)]
async fn a_panicking_run_settles_failed_after_its_disposal() {
    let cases = [
        (
            PanicAt::ResultCall,
            "(no new output)\n[status: failed, subagent provider \"wild\" panicked in result(): result() exploded]",
        ),
        (
            PanicAt::ResultFuture,
            "(no new output)\n[status: failed, subagent provider \"wild\" panicked in its result future: ",
        ),
        (
            PanicAt::DisposeCall,
            "(no new output)\n[status: failed, dispose failed: subagent provider \"wild\" panicked in dispose(): dispose() exploded]",
        ),
        (
            PanicAt::DisposeFuture,
            "(no new output)\n[status: failed, dispose failed: subagent provider \"wild\" panicked in its dispose future: dispose exploded]",
        ),
    ];
    for (at, expected) in cases {
        let mut host = Host::new();
        let disposals = counter();
        let _p = host.provider(PanickingRun::provider("wild", at, disposals.clone()));
        let _tool = host.load_json(json!({"provider": "wild", "maxDepth": "provider-managed"}));
        let parent = host.parent("parent").await;
        let started = host.call("subagent", &parent, background()).await;
        assert_eq!(text(&started), "started background subagent job subagent-1");
        let output = host.job_output(&parent, "subagent-1").await;
        assert!(
            text(&output).starts_with(expected),
            "{at:?}: {:?} does not start with {expected:?}",
            text(&output)
        );
        assert_eq!(disposals.load(Ordering::SeqCst), 1, "{at:?}: disposed once");
        host.close().await;
    }
}

/// A provider that sets an oversized diagnostic directly (bypassing
/// `SubagentResult::with_diagnostic`) cannot flood the model through `job_output`: the failed
/// job's detail carries the diagnostic bounded to `MAX_DIAGNOSTIC_BYTES`, cut on a character
/// boundary of multi-byte text and marked as truncated.
#[tokio::test(start_paused = true)]
async fn an_oversized_diagnostic_reaches_job_output_bounded() {
    let mut host = Host::new();
    let mut result = SubagentResult::new(vec![], StopReason::Error);
    result.diagnostic = Some("é".repeat(subagent::MAX_DIAGNOSTIC_BYTES));
    let _p = host.provider(FakeProvider::resulting("mock", result, counter()));
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("parent").await;
    host.call("subagent", &parent, background()).await;
    let shown = text(&host.job_output(&parent, "subagent-1").await);
    let diagnostic = shown
        .strip_prefix("(no new output)\n[status: failed, error; diagnostic: ")
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or_else(|| panic!("unexpected shape: {:.200}", shown));
    assert!(
        diagnostic.len() <= subagent::MAX_DIAGNOSTIC_BYTES,
        "{} bytes",
        diagnostic.len()
    );
    assert!(diagnostic.ends_with(subagent::result::DIAGNOSTIC_TRUNCATION_SUFFIX));
    host.close().await;
}

/// spec: TOOL-44 / §3.8 step 3 — the call's token stops owning a background child only once
/// the job id is *returned*. When the call's signal fires as the body returns, the pipeline
/// discards the success (the call is recorded as cancelled) and the model never learns the id:
/// the job must then be killed — its run cancelled and disposed, the job settled `killed` —
/// rather than keep working for a call the model saw cancelled.
#[tokio::test(start_paused = true)]
async fn a_discarded_background_start_kills_its_job() {
    let mut host = Host::new();
    let call_signal = Signal::new();
    let reasons: Arc<Mutex<Vec<String>>> = Arc::default();
    let disposals = counter();
    let (cancel_call, seen, d) = (call_signal.clone(), reasons.clone(), disposals.clone());
    let provider = FakeProvider::new(
        "hanging",
        Arc::new(move |request| {
            // The call's signal fires while the body runs (deterministically here; in a
            // multi-threaded host, the user's interrupt racing the body's return).
            cancel_call.cancel(CancelCause::User);
            let signal = request.request.signal.clone();
            let seen = seen.clone();
            let result = async move {
                signal.cancelled().await;
                seen.lock().push(match signal.cause() {
                    Some(CancelCause::Other { reason }) => reason,
                    other => format!("{other:?}"),
                });
                Ok(SubagentResult::aborted(vec![]))
            }
            .boxed();
            let run = FakeRun::boxed("hang", result, Ok(()), d.clone());
            async move { Ok(run) }.boxed()
        }),
    )
    .capability_less();
    let _p = host.provider(provider);
    let _tool = host.load(tool_subagent::SubagentToolConfig::new("hanging"));
    let parent = host.parent("sess-parent").await;
    let outcome = host
        .call_with("subagent", &parent, background(), call_signal)
        .await;
    assert!(
        outcome.is_error,
        "the call is recorded as cancelled: {}",
        text(&outcome)
    );
    let jobs = host.jobs.clone().expect("the host has a job registry");
    let listed = jobs.list(&parent);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_ne!(
        listed[0].status,
        agent::jobs::JobStatus::Running,
        "a job whose id never reached the model keeps running: {listed:?}"
    );
    let killed = host.job_output(&parent, "subagent-1").await;
    assert_eq!(text(&killed), "(no new output)\n[status: killed]");
    assert_eq!(
        *reasons.lock(),
        vec![tool_subagent::model_text::CALL_DISCARDED_KILL_REASON.to_owned()]
    );
    assert_eq!(disposals.load(Ordering::SeqCst), 1);
    host.close().await;
}

/// Runs the background `subagent` tool's body directly under `ctx` (as the pipeline's dispatch
/// does), leaving the commit — delivering or discarding the success — to the test.
async fn dispatch_background(host: &Host, parent: &agent::SessionId) -> agent::tools::ToolContext {
    use agent::tools::{ExecutionId, ToolContext, ToolExecution};
    let execution = ToolExecution {
        id: ExecutionId::next(),
        agent: parent.clone(),
        call_id: "call-bg".into(),
        name: "subagent".to_owned(),
        arguments: background(),
    };
    let ctx = ToolContext::new(Arc::new(execution), Signal::new());
    let definition = host
        .services()
        .tools
        .get("subagent", None)
        .expect("the tool is registered");
    let output = definition
        .handler
        .execute(background(), ctx.clone())
        .await
        .expect("the background job starts");
    assert_eq!(
        agent::content::visible_text(&output.content),
        "started background subagent job subagent-1"
    );
    ctx
}

/// Lets every spawned task run until it blocks (paused clock: time never advances by itself).
async fn run_tasks() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

/// A provider whose start is rejected synchronously (its future is ready on its first poll).
fn rejecting_start() -> FakeProvider {
    FakeProvider::new(
        "rejecting",
        Arc::new(|_| {
            async {
                Err(SubagentError::new(
                    SubagentErrorCode::ProviderFailed,
                    "setup failed",
                ))
            }
            .boxed()
        }),
    )
    .capability_less()
}

/// Records every completion notice of `host`'s registry.
fn record_notices(host: &Host) -> (Arc<Mutex<Vec<String>>>, agent::Registration) {
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = seen.clone();
    let guard = host.jobs.as_ref().expect("jobs").notices().on(move |notice| {
        sink.lock().push(notice.text.clone());
        Ok(())
    });
    (seen, guard)
}

/// spec: TOOL-44 / §3.8 step 3 — a background job whose start is rejected at once settles
/// while its call's success is still on its way to the model (on a multi-thread runtime the
/// job's task runs on another worker as the body returns; on any runtime while the pipeline
/// awaits an earlier call of its group or the result's log append). When the pipeline then
/// discards that success (the signal fired as the body returned, the append was refused), the
/// discard hook's kill must leave no trace the model can see: no completion notice may name the
/// job id the model never received. Before, the job had settled and emitted its notice before
/// the kill marked it reported.
#[tokio::test(start_paused = true)]
async fn a_discarded_background_start_that_settled_at_once_announces_nothing() {
    let mut host = Host::new();
    let _p = host.provider(rejecting_start());
    let _tool = host.load(tool_subagent::SubagentToolConfig::new("rejecting"));
    let parent = host.parent("sess-parent").await;
    let (notices, _notices) = record_notices(&host);

    let ctx = dispatch_background(&host, &parent).await;
    // The job's task runs before the pipeline decides what to record.
    run_tasks().await;
    // The pipeline discards the success; the model never learns `subagent-1`.
    ctx.discard();
    drop(ctx);
    run_tasks().await;

    assert!(
        notices.lock().is_empty(),
        "a notice names a job the model never heard of: {:?}",
        notices.lock()
    );
    let jobs = host.jobs.clone().expect("jobs");
    let job = agent::jobs::JobId("subagent-1".to_owned());
    let snapshot = jobs.get(&parent, &job).expect("the job is listed");
    assert!(snapshot.status.is_terminal(), "{snapshot:?}");
    assert!(snapshot.reported, "{snapshot:?}");
    host.close().await;
}

/// spec: TOOL-41 / §3.8 — the same job whose call's success *is* committed and delivered
/// announces its settlement exactly once, and only once the result carrying its id reached
/// the model (the context's last clone is released), never before.
#[tokio::test(start_paused = true)]
async fn a_background_start_that_settled_at_once_is_announced_after_its_id_is_delivered() {
    let mut host = Host::new();
    let _p = host.provider(rejecting_start());
    let _tool = host.load(tool_subagent::SubagentToolConfig::new("rejecting"));
    let parent = host.parent("sess-parent").await;
    let (notices, _notices) = record_notices(&host);

    let ctx = dispatch_background(&host, &parent).await;
    run_tasks().await;
    assert!(
        notices.lock().is_empty(),
        "announced before the call's result was delivered: {:?}",
        notices.lock()
    );
    // Committed and delivered: the pipeline lets go of the context without discarding.
    drop(ctx);
    run_tasks().await;
    assert_eq!(
        *notices.lock(),
        [
            "background job subagent-1 (subagent: deep research) finished [status: failed, setup failed]. Read its output with job_output."
        ]
    );
    let output = host.job_output(&parent, "subagent-1").await;
    assert_eq!(text(&output), "(no new output)\n[status: failed, setup failed]");
    host.close().await;
}

/// A held announcement never stalls teardown: disposing the owner while the call's result is
/// still undelivered settles the job (its kill releases the hold) without a notice.
#[tokio::test(start_paused = true)]
async fn a_held_announcement_never_stalls_owner_disposal() {
    let mut host = Host::new();
    let _p = host.provider(rejecting_start());
    let _tool = host.load(tool_subagent::SubagentToolConfig::new("rejecting"));
    let parent = host.parent("sess-parent").await;
    let (notices, _notices) = record_notices(&host);

    let ctx = dispatch_background(&host, &parent).await;
    run_tasks().await;
    let jobs = host.jobs.clone().expect("jobs");
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        jobs.dispose_owner_jobs(&parent),
    )
    .await
    .expect("disposal is not stalled by the undelivered call");
    drop(ctx);
    run_tasks().await;
    assert!(notices.lock().is_empty(), "{:?}", notices.lock());
    host.close().await;
}
