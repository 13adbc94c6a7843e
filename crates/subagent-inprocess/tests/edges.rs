//! Lifecycle edges the spec implies but the per-id tests do not reach: a start future dropped
//! inside the setup window, a setup that fails after the whole composition (structured runtime
//! included), the host runtime shut down under a live run, and concurrent disposals racing the
//! request signal and the result. Every test ends quiescent (`Host::finish`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use agent::{CancelCause, ContentBlock, CreateAgentOptions, Signal};
use agent_loop::model::{ScriptEntry, chunks};
use common::*;
use serde_json::json;
use subagent::run::SubagentRun;
use subagent::{StopReason, SubagentErrorCode, SubagentResult};
use subagent_inprocess::InProcessRunOptions;

fn schema() -> serde_json::Value {
    json!({"type": "object", "properties": {"answer": {"type": "number"}}, "required": ["answer"]})
}

/// A request composing everything the setup window installs: persona, tool filter (over the
/// global `echo`) and the structured runtime.
fn composed_request(host: &Host) -> subagent::provider::SubagentStartRequest {
    let mut request = host.request();
    request.output_schema = Some(schema());
    request.persona = Some("persona".into());
    request.tool_filter = Some(agent::tools::ToolRestriction {
        allow: Some(vec!["echo".into()]),
        deny: None,
    });
    request
}

/// Wraps the creation's setup: `yields` scheduling points before and after the driver's own
/// setup, then `fail_after` turns a successful setup into a failure.
fn wrap_setup(options: &mut CreateAgentOptions, yields: usize, fail_after: bool) {
    if let Some(inner) = options.setup.take() {
        options.setup = Some(Box::new(move |ctx| {
            Box::pin(async move {
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                let out = inner(ctx).await?;
                for _ in 0..yields {
                    tokio::task::yield_now().await;
                }
                if fail_after {
                    return Err("late setup failure".into());
                }
                Ok(out)
            })
        }));
    }
}

/// spec: §3.2 (fulfilment is publication), §3.4 (during creation), §3.5 — a start future dropped
/// at any point of a setup window that yields (before, inside and after the child's composition)
/// rolls the unpublished child back: no agent, no session, no scoped registration (structured
/// tool, persona, restriction, descriptor interceptor) is left; a start that got to publish runs
/// normally.
#[tokio::test(start_paused = true)]
async fn a_start_dropped_inside_the_setup_window_leaves_nothing() {
    let (mut dropped, mut published) = (0, 0);
    for point in 0..12 {
        let host = Host::new(vec![
            chunks::tool_call("c1", "structured_output", json!({"answer": 1})).into(),
        ])
        .await;
        let echo = global_tool(&host, counting_tool("echo", Arc::default()));
        let before = (host.agent_count(), host.session_count());
        let driver = hooked_driver(&host, |options| wrap_setup(options, 3, false), |handle| handle);
        let start = tokio::spawn(driver.start(
            resolve(composed_request(&host), "spawn"),
            InProcessRunOptions::fresh(),
        ));
        for _ in 0..point {
            tokio::task::yield_now().await;
        }
        if start.is_finished() {
            published += 1;
            let run = start.await.expect("start task").expect("published");
            assert_eq!(run.result().await.unwrap().structured, Some(json!({"answer": 1})));
            run.dispose().await.unwrap();
        } else {
            dropped += 1;
            start.abort();
            assert!(start.await.unwrap_err().is_cancelled(), "point {point}");
        }
        driver.wait().await;
        assert_eq!(
            (host.agent_count(), host.session_count()),
            before,
            "point {point}"
        );
        drop(echo);
        host.finish().await;
    }
    assert!(
        dropped > 0 && published > 0,
        "both outcomes reached: {dropped} dropped, {published} published"
    );
}

/// spec: §3.5 — a setup that fails after the child was fully composed (policy, delegation
/// statement, persona, tool filter, structured runtime, descriptor interceptor) rejects with
/// the setup failure and rolls every registration back; the registries are unchanged.
#[tokio::test(start_paused = true)]
async fn a_setup_failing_after_the_whole_composition_rolls_back() {
    let host = Host::new(vec![]).await;
    let echo = global_tool(&host, counting_tool("echo", Arc::default()));
    let before = (host.agent_count(), host.session_count());
    let driver = hooked_driver(&host, |options| wrap_setup(options, 1, true), |handle| handle);
    let error = driver
        .start(
            resolve(composed_request(&host), "spawn"),
            InProcessRunOptions::fresh(),
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), SubagentErrorCode::ProviderFailed);
    assert!(error.to_string().contains("late setup failure"), "{error}");
    assert_eq!((host.agent_count(), host.session_count()), before);
    assert_eq!(host.model.requests().len(), 0);
    driver.wait().await;
    drop(echo);
    host.finish().await;
}

/// spec: §3.6, §3.8 — the host runtime shut down under a live run drains the child: the result
/// settles `aborted` with the partial text (never hangs, never an infrastructure fault), and a
/// later `dispose()` completes.
#[tokio::test(start_paused = true)]
async fn a_runtime_shut_down_under_a_live_run_settles_and_disposes() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let run = host
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    host.runtime.shutdown().await;
    let result = tokio::time::timeout(Duration::from_secs(3600), run.result())
        .await
        .expect("the result settles")
        .expect("a drained child is a cancellation, not a fault");
    assert_eq!(
        result,
        SubagentResult::new(vec![ContentBlock::text("partial")], StopReason::Aborted)
    );
    tokio::time::timeout(Duration::from_secs(3600), run.dispose())
        .await
        .expect("dispose completes")
        .unwrap();
    host.finish().await;
}

/// spec: §3.8 — two disposals from different threads racing the request signal and the
/// result: both succeed, the result is `completed` with the text or `aborted`, and the host ends
/// quiescent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_disposals_racing_the_signal_agree() {
    for _ in 0..20 {
        let host = Host::new(vec![chunks::text("x").into()]).await;
        let signal = Signal::new();
        let run = Arc::new(
            host.driver
                .start(
                    resolve(request_from(&host.parent, signal.clone()), "spawn"),
                    InProcessRunOptions::fresh(),
                )
                .await
                .unwrap(),
        );
        let (a, b) = (run.clone(), run.clone());
        let first = tokio::spawn(async move { a.dispose().await });
        let second = tokio::spawn(async move { b.dispose().await });
        signal.cancel(CancelCause::Parent);
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        let result = run.result().await.unwrap();
        match result.stop_reason {
            StopReason::Completed => assert_eq!(result.output, vec![ContentBlock::text("x")]),
            StopReason::Aborted => {}
            other => panic!("unexpected stop reason {other:?}"),
        }
        assert!(host.get(run.id()).is_none());
        drop(run);
        host.finish().await;
    }
}
