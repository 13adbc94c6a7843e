//! The foreground route and common request construction through the real tool registry
//! (`acp-and-tools.md` §3.5–§3.7).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::{AgentOptions, CancelCause, ContentBlock, Signal};
use common::{FakeProvider, FakeRun, Host, PanicAt, PanickingRun, completed, failure, text};
use futures::FutureExt;
use serde_json::json;
use subagent::{StopReason, SubagentResult, ToolFilter};
use tokio::sync::{Barrier, Notify};

fn counter() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

fn args() -> serde_json::Value {
    json!({"description": "d", "prompt": "p"})
}

/// spec: TOOL-2 — a foreground success returns `{kind: foreground, runId, output}` and renders
/// the child's text.
#[tokio::test(start_paused = true)]
async fn tool_2_foreground_success() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("mock", "child says hi", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("parent-1").await;
    let result = host
        .call(
            "subagent",
            &parent,
            json!({"description": "do a thing", "prompt": "go research X", "run_in_background": false}),
        )
        .await;
    assert!(!result.is_error, "{}", text(&result));
    assert_eq!(
        result.value,
        Some(json!({
            "kind": "foreground",
            "runId": "mock-child",
            "output": [{"type": "text", "text": "child says hi"}],
        }))
    );
    assert_eq!(text(&result), "child says hi");
    let seen = requests.lock().clone();
    assert_eq!(seen[0].request.prompt, vec![ContentBlock::text("go research X")]);
    assert_eq!(seen[0].request.parent.id(), &parent);
    host.close().await;
}

/// spec: TOOL-5 — with background disabled a forced `run_in_background: true` is refused before
/// the provider is asked; a normal call still succeeds.
#[tokio::test(start_paused = true)]
async fn tool_5_forced_background_is_refused_when_disabled() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("mock", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "mock", "enableRunInBackground": false}));
    let parent = host.parent("sess-off").await;
    let forced = host
        .call(
            "subagent",
            &parent,
            json!({"description": "d", "prompt": "p", "run_in_background": true}),
        )
        .await;
    assert!(forced.is_error);
    assert!(text(&forced).contains("run_in_background is disabled for this tool instance"));
    assert_eq!(
        text(&forced),
        "Error: run_in_background is disabled for this tool instance (enableRunInBackground: false)"
    );
    assert!(
        requests.lock().is_empty(),
        "the provider was never asked to start a child"
    );
    let normal = host.call("subagent", &parent, args()).await;
    assert!(!normal.is_error);
    host.close().await;
}

/// spec: TOOL-7 — two concurrently dispatched foreground delegations overlap: each start blocks
/// until both started, so any serialization would deadlock (caught by the timeout).
#[tokio::test(start_paused = true)]
async fn tool_7_sibling_foreground_delegations_overlap() {
    let mut host = Host::new();
    let barrier = Arc::new(Barrier::new(2));
    let disposals = counter();
    let provider = FakeProvider::new(
        "mock",
        Arc::new(move |request| {
            let barrier = barrier.clone();
            let label = request.request.label.clone().unwrap_or_default();
            let run = FakeRun::resolved("child", completed(&label), disposals.clone());
            async move {
                barrier.wait().await;
                Ok(run)
            }
            .boxed()
        }),
    );
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "mock", "enableRunInBackground": false}));
    let parent = host.parent("parent").await;
    let both = async {
        tokio::join!(
            host.call(
                "subagent",
                &parent,
                json!({"description": "first", "prompt": "p1"})
            ),
            host.call(
                "subagent",
                &parent,
                json!({"description": "second", "prompt": "p2"})
            ),
        )
    };
    let (first, second) = tokio::time::timeout(Duration::from_secs(60), both)
        .await
        .expect("sibling delegations must overlap, not serialize");
    assert_eq!(text(&first), "first");
    assert_eq!(text(&second), "second");
    let mut labels: Vec<String> = requests
        .lock()
        .iter()
        .filter_map(|r| r.request.label.clone())
        .collect();
    labels.sort();
    assert_eq!(labels, ["first", "second"]);
    host.close().await;
}

/// spec: TOOL-8 — `aborted`/`error`/`max-tokens`/`refusal` each produce an errored result
/// naming the ending, with the preserved partial reply.
#[tokio::test(start_paused = true)]
async fn tool_8_non_completed_stop_reasons_are_errors_with_partial_output() {
    for (reason, fragment) in [
        (StopReason::Aborted, "cancelled"),
        (StopReason::Error, "failed"),
        (StopReason::MaxTokens, "token limit"),
        (StopReason::Refusal, "declined"),
    ] {
        let mut host = Host::new();
        let result = SubagentResult::new(
            vec![ContentBlock::text("scripted subagent reply")],
            reason.clone(),
        );
        let _p = host.provider(FakeProvider::resulting("mock", result, counter()));
        let _tool = host.load_json(json!({"provider": "mock"}));
        let parent = host.parent("parent").await;
        let outcome = host.call("subagent", &parent, args()).await;
        assert!(outcome.is_error, "{reason}");
        let rendered = text(&outcome);
        assert!(rendered.contains(fragment), "{reason}: {rendered}");
        assert!(
            rendered.contains("scripted subagent reply"),
            "{reason}: {rendered}"
        );
        assert!(outcome.value.is_none());
        host.close().await;
    }
}

/// spec: TOOL-9 — the diagnostic is rendered exactly, before the partial output.
#[tokio::test(start_paused = true)]
async fn tool_9_diagnostic_rendering() {
    let mut host = Host::new();
    let result = SubagentResult::new(
        vec![ContentBlock::text("partial assistant text")],
        StopReason::Error,
    )
    .with_diagnostic("Claude Code denied a tool request");
    let _p = host.provider(FakeProvider::resulting("mock", result, counter()));
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(outcome.is_error);
    assert_eq!(
        text(&outcome),
        "Error: subagent run failed\nDiagnostic: Claude Code denied a tool request\n\
         Partial output before the run ended:\npartial assistant text"
    );
    host.close().await;
}

/// spec: TOOL-11 — an unknown stop reason is an errored result saying the run ended
/// abnormally.
#[tokio::test(start_paused = true)]
async fn tool_11_unknown_stop_reason_is_an_error() {
    let mut host = Host::new();
    let result = SubagentResult::new(
        vec![ContentBlock::text("partial")],
        StopReason::Other("frobnicated".into()),
    );
    let _p = host.provider(FakeProvider::resulting("weird", result, counter()).capability_less());
    let _tool = host.load_json(json!({"provider": "weird", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(outcome.is_error);
    assert!(text(&outcome).contains("abnormally"));
    assert!(text(&outcome).starts_with("Error: subagent run ended abnormally (frobnicated)"));
    host.close().await;
}

/// spec: TOOL-12 — configured `agentOptions` reach the start request.
#[tokio::test(start_paused = true)]
async fn tool_12_agent_options_reach_the_request() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("capture", "ok", counter()).capability_less();
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({
        "provider": "capture",
        "agentOptions": {"model": "child-model"},
        "maxDepth": "provider-managed",
    }));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(!outcome.is_error, "{}", text(&outcome));
    assert_eq!(
        requests.lock()[0].request.agent_options,
        Some(AgentOptions {
            model: Some("child-model".into()),
            ..AgentOptions::default()
        })
    );
    host.close().await;
}

/// spec: TOOL-14 — a call without a (live) calling agent fails and never reaches the provider.
#[tokio::test(start_paused = true)]
async fn tool_14_calling_agent_required() {
    let host = Host::new();
    let provider = FakeProvider::replying("mock", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "mock"}));
    let outcome = host.call("subagent", &"nobody".into(), args()).await;
    assert!(outcome.is_error);
    assert!(text(&outcome).contains("requires a calling agent"));
    assert_eq!(
        text(&outcome),
        "Error: subagent tool requires a calling agent (exec.agent was undefined)"
    );
    assert!(requests.lock().is_empty());
    host.close().await;
}

/// spec: TOOL-22 — `dispose()` is called exactly once on the success path.
#[tokio::test(start_paused = true)]
async fn tool_22_dispose_once_on_success() {
    let mut host = Host::new();
    let disposals = counter();
    let _p = host.provider(FakeProvider::replying("spy", "ok", disposals.clone()).capability_less());
    let _tool = host.load_json(json!({"provider": "spy", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(!outcome.is_error);
    assert_eq!(disposals.load(Ordering::SeqCst), 1);
    host.close().await;
}

/// spec: TOOL-23 — `dispose()` is called exactly once on the error path.
#[tokio::test(start_paused = true)]
async fn tool_23_dispose_once_on_error() {
    let mut host = Host::new();
    let disposals = counter();
    let result = SubagentResult::new(vec![], StopReason::Error);
    let _p = host.provider(FakeProvider::resulting("spy", result, disposals.clone()).capability_less());
    let _tool = host.load_json(json!({"provider": "spy", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(outcome.is_error);
    assert_eq!(text(&outcome), "Error: subagent run failed");
    assert_eq!(disposals.load(Ordering::SeqCst), 1);
    host.close().await;
}

fn failing_provider(result_fails: bool, disposals: Arc<AtomicUsize>) -> FakeProvider {
    FakeProvider::new(
        "spy",
        Arc::new(move |_| {
            let result = if result_fails {
                async { Err(failure("published run failed")) }.boxed()
            } else {
                async { Ok(completed("completed before disposal")) }.boxed()
            };
            let run = FakeRun::boxed(
                "spy-child",
                result,
                Err(failure("published handle disposal failed")),
                disposals.clone(),
            );
            async move { Ok(run) }.boxed()
        }),
    )
    .capability_less()
}

/// spec: TOOL-24 — a rejected result plus a failing dispose yield one errored result naming
/// both failures; dispose is called once.
#[tokio::test(start_paused = true)]
async fn tool_24_result_and_dispose_failures_combine() {
    let mut host = Host::new();
    let disposals = counter();
    let _p = host.provider(failing_provider(true, disposals.clone()));
    let _tool = host.load_json(json!({"provider": "spy", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(outcome.is_error);
    assert_eq!(
        text(&outcome),
        "Error: subagent run failed: published run failed; dispose failed: published handle disposal failed"
    );
    assert_eq!(disposals.load(Ordering::SeqCst), 1);
    host.close().await;
}

/// spec: TOOL-25 — a failing dispose after a completed result is an errored result naming the
/// disposal failure.
#[tokio::test(start_paused = true)]
async fn tool_25_dispose_failure_after_completion() {
    let mut host = Host::new();
    let disposals = counter();
    let _p = host.provider(failing_provider(false, disposals.clone()));
    let _tool = host.load_json(json!({"provider": "spy", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(outcome.is_error);
    assert_eq!(text(&outcome), "Error: published handle disposal failed");
    assert_eq!(disposals.load(Ordering::SeqCst), 1);
    host.close().await;
}

/// spec: TOOL-26 — aborting the tool call's token reaches the provider's start token; the
/// result is errored, and the run is still disposed.
#[tokio::test(start_paused = true)]
async fn tool_26_call_token_is_the_providers_cancellation_channel() {
    let mut host = Host::new();
    let cancelled = counter();
    let disposals = counter();
    let started = Arc::new(Notify::new());
    let (c, d, s) = (cancelled.clone(), disposals.clone(), started.clone());
    let provider = FakeProvider::new(
        "spy",
        Arc::new(move |request| {
            let signal = request.request.signal.clone();
            let c = c.clone();
            let result = async move {
                signal.cancelled().await;
                c.fetch_add(1, Ordering::SeqCst);
                Ok(SubagentResult::aborted(vec![]))
            }
            .boxed();
            let run = FakeRun::boxed("spy-child", result, Ok(()), d.clone());
            s.notify_one();
            async move { Ok(run) }.boxed()
        }),
    )
    .capability_less();
    let _p = host.provider(provider);
    let tool = host.load_json(json!({"provider": "spy", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    let signal = Signal::new();
    let call = host.call_with("subagent", &parent, args(), signal.clone());
    let cancel = async {
        started.notified().await;
        signal.cancel(CancelCause::User);
    };
    let (outcome, ()) = tokio::join!(call, cancel);
    assert!(outcome.is_error);
    tool.shutdown().await;
    assert_eq!(cancelled.load(Ordering::SeqCst), 1);
    assert_eq!(
        disposals.load(Ordering::SeqCst),
        1,
        "the cancelled run is still disposed"
    );
    host.close().await;
}

/// spec: TOOL-27 — a pre-aborted token yields `tool call aborted before dispatch` and the
/// provider never sees the call.
#[tokio::test(start_paused = true)]
async fn tool_27_pre_aborted_call_never_reaches_the_provider() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("spy", "ok", counter()).capability_less();
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "spy", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    let outcome = host
        .call_with(
            "subagent",
            &parent,
            args(),
            Signal::cancelled_with(CancelCause::User),
        )
        .await;
    assert!(outcome.is_error);
    let error = outcome.error.clone().expect("error facts");
    assert_eq!(error.message, "tool call aborted before dispatch");
    assert_eq!(error.code, "TOOL_ABORTED_BEFORE_DISPATCH");
    assert!(requests.lock().is_empty());
    host.close().await;
}

/// spec: TOOL-30 — `persona`, `toolFilter` and a numeric `maxDepth` reach the start request.
#[tokio::test(start_paused = true)]
async fn tool_30_persona_filter_and_cap_reach_the_request() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("capture2", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({
        "provider": "capture2",
        "persona": "You are the child.",
        "toolFilter": {"deny": ["subagent"]},
        "maxDepth": 2,
    }));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(!outcome.is_error, "{}", text(&outcome));
    let seen = requests.lock().clone();
    assert_eq!(seen[0].request.persona.as_deref(), Some("You are the child."));
    assert_eq!(
        seen[0].request.tool_filter.as_ref().and_then(|f| f.deny.clone()),
        Some(vec!["subagent".to_owned()])
    );
    assert_eq!(seen[0].request.max_depth, Some(json!(2)));
    assert_eq!(seen[0].max_depth, Some(2));
    host.close().await;
}

/// spec: TOOL-33 — a deny-only tool filter is forwarded without an `allow` list.
#[tokio::test(start_paused = true)]
async fn tool_33_deny_only_filter_has_no_allow() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("capture3", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({
        "provider": "capture3",
        "toolFilter": {"deny": ["subagent"]},
        "maxDepth": "provider-managed",
    }));
    let parent = host.parent("parent").await;
    host.call("subagent", &parent, args()).await;
    assert_eq!(
        requests.lock()[0].request.tool_filter,
        Some(ToolFilter {
            allow: None,
            deny: Some(vec!["subagent".into()]),
        })
    );
    host.close().await;
}

/// spec: TOOL-34 — an omitted `agentOptions` leaves the request without agent options.
#[tokio::test(start_paused = true)]
async fn tool_34_omitted_agent_options_stay_absent() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("capture4", "ok", counter()).capability_less();
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "capture4", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    host.call("subagent", &parent, args()).await;
    assert_eq!(requests.lock()[0].request.agent_options, None);
    host.close().await;
}

/// spec: TOOL-48 — continuable mode with an explicit `false` waits and
/// returns a foreground result; no job is created.
#[tokio::test(start_paused = true)]
async fn tool_48_continuable_mode_explicit_false_is_foreground() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("spawn", "continuable answer", counter()).with_continuable();
    let prepared = provider.prepare_calls.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "spawn", "backgroundMode": "continuable"}));
    let parent = host.parent("parent").await;
    let outcome = host
        .call(
            "subagent",
            &parent,
            json!({"description": "d", "prompt": "p", "run_in_background": false}),
        )
        .await;
    assert!(!outcome.is_error, "{}", text(&outcome));
    assert_eq!(
        outcome.value.as_ref().map(|v| v["kind"].clone()),
        Some(json!("foreground"))
    );
    assert_eq!(text(&outcome), "continuable answer");
    let jobs = host.jobs.as_ref().expect("host has jobs");
    assert!(jobs.snapshots(&parent).is_empty());
    assert_eq!(prepared.load(Ordering::SeqCst), 0);
    host.close().await;
}

/// spec: TOOL-51 — the default `maxDepth` 3 and `label = description` reach the request; no
/// tool filter is injected.
#[tokio::test(start_paused = true)]
async fn tool_51_default_cap_and_label() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("spawn", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "spawn"}));
    let parent = host.parent("parent").await;
    host.call(
        "subagent",
        &parent,
        json!({"description": "review the diff", "prompt": "p"}),
    )
    .await;
    let seen = requests.lock().clone();
    assert_eq!(seen[0].request.max_depth, Some(json!(3)));
    assert_eq!(seen[0].request.label.as_deref(), Some("review the diff"));
    assert_eq!(seen[0].request.tool_filter, None);
    assert_eq!(seen[0].request.persona, None);
    host.close().await;
}

/// spec: TOOL-52 — an explicit tool filter is forwarded unchanged with `maxDepth: 0`.
#[tokio::test(start_paused = true)]
async fn tool_52_explicit_filter_with_zero_cap() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("spawn", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({
        "provider": "spawn",
        "toolFilter": {"allow": ["read", "grep"], "deny": ["write"]},
        "maxDepth": 0,
    }));
    let parent = host.parent("parent").await;
    host.call("subagent", &parent, args()).await;
    let seen = requests.lock().clone();
    assert_eq!(
        seen[0].request.tool_filter,
        Some(ToolFilter {
            allow: Some(vec!["read".into(), "grep".into()]),
            deny: Some(vec!["write".into()]),
        })
    );
    assert_eq!(seen[0].request.max_depth, Some(json!(0)));
    host.close().await;
}

/// A start rejection (here the service's capability check) becomes `Error: <message>` with the
/// seam's code; there is nothing to dispose.
#[tokio::test(start_paused = true)]
async fn start_rejection_is_an_error_result() {
    let mut host = Host::new();
    let disposals = counter();
    let provider = FakeProvider::replying("bare", "ok", disposals.clone()).capability_less();
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({
        "provider": "bare",
        "persona": "child",
        "maxDepth": "provider-managed",
    }));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(outcome.is_error);
    assert_eq!(
        text(&outcome),
        "Error: subagent provider \"bare\" does not support the \"persona\" capability"
    );
    assert_eq!(
        outcome.error.map(|e| e.code),
        Some("UNSUPPORTED_CAPABILITY".to_owned())
    );
    assert!(requests.lock().is_empty());
    assert_eq!(disposals.load(Ordering::SeqCst), 0);
    host.close().await;
}

/// A start rejection whose message already ends with its cause's text — the in-process
/// driver's setup failure (`agent "<id>" setup failed: <cause>`, keeping the cause as its
/// source), as when a configured tool filter names an unknown tool — reaches the model with the
/// cause once (§3.7 step 1: `Error: <message>`), not repeated after itself.
#[tokio::test(start_paused = true)]
async fn a_start_rejection_names_its_cause_once() {
    let mut host = Host::new();
    let _p = host.provider(setup_failing_provider());
    let _tool = host.load_json(json!({"provider": "spawn"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    assert!(outcome.is_error);
    assert_eq!(
        text(&outcome),
        "Error: agent \"child-1\" setup failed: unknown global tool \"nonexistent\""
    );
    assert_eq!(outcome.error.map(|e| e.code), Some("PROVIDER_FAILED".to_owned()));
    host.close().await;
}

/// A provider whose start rejects as the in-process driver does when the child's setup window
/// fails: a `PROVIDER_FAILED` error whose message embeds its source's text.
fn setup_failing_provider() -> FakeProvider {
    FakeProvider::new(
        "spawn",
        Arc::new(|_| {
            let failure = subagent_inprocess::StartFailure::Create(agent::AgentError::Setup {
                id: "child-1".into(),
                source: "unknown global tool \"nonexistent\"".into(),
            });
            async move { Err(failure.into()) }.boxed()
        }),
    )
}

/// Malformed arguments are refused as `INVALID_ARGS` before anything starts.
#[tokio::test(start_paused = true)]
async fn malformed_arguments_are_invalid_args() {
    let mut host = Host::new();
    let provider = FakeProvider::replying("mock", "ok", counter());
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "mock"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, json!({"description": "d"})).await;
    assert_eq!(outcome.error.map(|e| e.code), Some("INVALID_ARGS".to_owned()));
    assert!(requests.lock().is_empty());
    host.close().await;
}

/// A provider whose runs wait for their request signal and then end `aborted`, recording the
/// cause each one saw; `started` is notified once a run exists.
fn waiting_provider(
    causes: Arc<parking_lot::Mutex<Vec<CancelCause>>>,
    disposals: Arc<AtomicUsize>,
    started: Arc<Notify>,
) -> FakeProvider {
    FakeProvider::new(
        "spy",
        Arc::new(move |request| {
            let signal = request.request.signal.clone();
            let causes = causes.clone();
            let result = async move {
                signal.cancelled().await;
                causes.lock().push(signal.cause().unwrap_or(CancelCause::Legacy));
                Ok(SubagentResult::aborted(vec![]))
            }
            .boxed();
            let run = FakeRun::boxed("spy-child", result, Ok(()), disposals.clone());
            started.notify_one();
            async move { Ok(run) }.boxed()
        }),
    )
    .capability_less()
}

/// A host that abandons a foreground call by dropping its future (its own timeout, a dropped
/// turn) without firing the call's signal no longer owns the child: the child is cancelled,
/// its run disposed once, and no foreground run is left in flight — the plugin shuts down
/// instead of waiting forever on a child nobody will collect.
#[tokio::test(start_paused = true)]
async fn a_dropped_foreground_call_cancels_and_disposes_its_child() {
    let mut host = Host::new();
    let causes = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let disposals = counter();
    let started = Arc::new(Notify::new());
    let provider = waiting_provider(causes.clone(), disposals.clone(), started.clone());
    let _p = host.provider(provider);
    let tool = host.load_json(json!({"provider": "spy", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    let signal = Signal::new();
    tokio::select! {
        outcome = host.call_with("subagent", &parent, args(), signal.clone()) => {
            panic!("the child waits for cancellation, yet the call ended: {}", text(&outcome));
        }
        () = started.notified() => {}
    }
    // The call's future is dropped here; its signal never fired.
    assert!(!signal.is_cancelled());
    tokio::time::timeout(Duration::from_secs(3600), tool.shutdown())
        .await
        .expect("the abandoned child is cancelled and its run disposed");
    assert_eq!(
        *causes.lock(),
        vec![CancelCause::Other {
            reason: tool_subagent::model_text::CALL_ABANDONED_REASON.to_owned()
        }],
        "the child saw its cancellation, with the abandonment as its cause"
    );
    assert_eq!(disposals.load(Ordering::SeqCst), 1, "the run is disposed once");
    host.close().await;
}

/// A third-party run that panics in `result()`, its result future, `dispose()`, its disposal
/// future or `id()` does not unwind through the tool: the call ends with a clear error naming the
/// provider and the panic (never the runtime's task-panic text), the run is disposed — once,
/// before the call answers — even when its result panicked, and nothing stays in flight.
#[tokio::test(start_paused = true)]
async fn a_panicking_run_is_a_clear_error_and_still_disposed() {
    let cases = [
        (
            PanicAt::ResultCall,
            "Error: subagent provider \"wild\" panicked in result(): result() exploded",
        ),
        (
            PanicAt::ResultFuture,
            "Error: subagent provider \"wild\" panicked in its result future: ",
        ),
        (
            PanicAt::DisposeCall,
            "Error: subagent provider \"wild\" panicked in dispose(): dispose() exploded",
        ),
        (
            PanicAt::DisposeFuture,
            "Error: subagent provider \"wild\" panicked in its dispose future: dispose exploded",
        ),
        (
            PanicAt::LaterId,
            "Error: subagent provider \"wild\" panicked in run id(): id() exploded",
        ),
    ];
    for (at, message) in cases {
        let mut host = Host::new();
        let disposals = counter();
        let _p = host.provider(PanickingRun::provider("wild", at, disposals.clone()));
        let tool = host.load_json(json!({"provider": "wild", "maxDepth": "provider-managed"}));
        let parent = host.parent("parent").await;
        let outcome = host.call("subagent", &parent, args()).await;
        assert!(outcome.is_error, "{at:?}: {}", text(&outcome));
        assert!(
            text(&outcome).starts_with(message),
            "{at:?}: {:?} does not start with {message:?}",
            text(&outcome)
        );
        assert_eq!(
            disposals.load(Ordering::SeqCst),
            1,
            "{at:?}: disposed once, before the call answered"
        );
        assert_eq!(tool.foreground_runs(), 0, "{at:?}");
        tool.shutdown().await;
        host.close().await;
    }
}

/// A provider that sets an oversized diagnostic directly (bypassing
/// `SubagentResult::with_diagnostic`) cannot flood the model: the foreground failure carries the
/// diagnostic bounded to `MAX_DIAGNOSTIC_BYTES`, cut on a character boundary of multi-byte
/// text and marked as truncated, followed by the partial output.
#[tokio::test(start_paused = true)]
async fn an_oversized_diagnostic_reaches_the_model_bounded() {
    let mut host = Host::new();
    let mut result = SubagentResult::new(vec![ContentBlock::text("partial")], StopReason::Error);
    result.diagnostic = Some("é".repeat(subagent::MAX_DIAGNOSTIC_BYTES));
    let _p = host.provider(FakeProvider::resulting("spy", result, counter()).capability_less());
    let _tool = host.load_json(json!({"provider": "spy", "maxDepth": "provider-managed"}));
    let parent = host.parent("parent").await;
    let outcome = host.call("subagent", &parent, args()).await;
    let shown = text(&outcome);
    let diagnostic = shown
        .strip_prefix("Error: subagent run failed\nDiagnostic: ")
        .and_then(|rest| rest.strip_suffix("\nPartial output before the run ended:\npartial"))
        .unwrap_or_else(|| panic!("unexpected shape: {:.200}", shown));
    assert!(
        diagnostic.len() <= subagent::MAX_DIAGNOSTIC_BYTES,
        "{} bytes",
        diagnostic.len()
    );
    assert!(diagnostic.ends_with(subagent::result::DIAGNOSTIC_TRUNCATION_SUFFIX));
    assert!(diagnostic.starts_with("éé"));
    host.close().await;
}
