//! The scripted provider fixture itself (`FakeProvider::scripted`, the port of upstream
//! `scripted-provider.ts`), exercised through the real subagent service.

mod common;

use std::pin::pin;
use std::task::Poll;

use agent::{AgentRef, CancelCause, ContentBlock, SessionId, Signal};
use common::{FakeProvider, Host, SCRIPTED_REPLY, SCRIPTED_START_ABORTED, Script};
use serde_json::json;
use subagent::provider::SubagentStartRequest;
use subagent::{StopReason, SubagentCapabilities, SubagentResult};

/// A live parent agent of `host` and its reference.
async fn parent(host: &mut Host) -> (SessionId, AgentRef) {
    let id = host.parent("parent").await;
    let agent = host.services().agents.get(&id).expect("the parent is live");
    (id, agent)
}

/// A start request with one text block, under `signal`.
fn request(parent: &AgentRef, signal: Signal) -> SubagentStartRequest {
    SubagentStartRequest::new(vec![ContentBlock::text("task")], parent.clone(), signal)
}

/// Starts a run on `provider` and returns its settled result, disposing the run.
async fn outcome(host: &Host, provider: &str, request: SubagentStartRequest) -> SubagentResult {
    let run = host
        .subagents
        .start(provider, request)
        .await
        .expect("the start is accepted");
    let result = run.result().await.expect("the result settles");
    run.dispose().await.expect("the run disposes");
    result
}

/// spec: TOOL-55 — the scripted provider registers under its configured name, publishes a run
/// named after itself and the parent, and returns its configured reply (or the default one) as
/// a completed result with nothing else in it.
#[tokio::test(start_paused = true)]
async fn tool_55_registers_under_its_name_and_returns_its_reply() {
    let mut host = Host::new();
    let (parent_id, parent) = parent(&mut host).await;
    let mock = host.provider(FakeProvider::scripted(
        "mock",
        Script {
            reply: Some("hello from fixture".into()),
            ..Script::default()
        },
    ));
    assert_eq!(host.subagents.list(), ["mock"]);
    let run = host
        .subagents
        .start("mock", request(&parent, Signal::new()))
        .await
        .expect("the start is accepted");
    assert_eq!(
        run.id().to_string(),
        format!("scripted-subagent:mock:{parent_id}")
    );
    assert_eq!(
        run.result().await.expect("the result settles"),
        SubagentResult::new(
            vec![ContentBlock::text("hello from fixture")],
            StopReason::Completed
        )
    );
    run.dispose().await.expect("the run disposes");
    drop(mock);

    let _spawn = host.provider(FakeProvider::scripted("spawn", Script::default()));
    assert_eq!(host.subagents.list(), ["spawn"]);
    let result = outcome(&host, "spawn", request(&parent, Signal::new())).await;
    assert_eq!(result.output, [ContentBlock::text(SCRIPTED_REPLY)]);
    host.close().await;
}

/// spec: TOOL-55 — a structured value is returned only when the request names an output schema:
/// the configured value, else `{"reply": <reply>}`; without a schema there is none.
#[tokio::test(start_paused = true)]
async fn tool_55_structured_values_only_when_a_schema_is_requested() {
    let mut host = Host::new();
    let (_, parent) = parent(&mut host).await;
    let _configured = host.provider(FakeProvider::scripted(
        "configured",
        Script {
            reply: Some("r".into()),
            structured: Some(json!({"answer": 42})),
            ..Script::default()
        },
    ));
    let _fallback = host.provider(FakeProvider::scripted(
        "fallback",
        Script {
            reply: Some("fallback reply".into()),
            ..Script::default()
        },
    ));
    let _plain = host.provider(FakeProvider::scripted(
        "plain",
        Script {
            capabilities: Some(SubagentCapabilities {
                output_schema: false,
                ..SubagentCapabilities::ALL
            }),
            ..Script::default()
        },
    ));
    let schema = json!({"type": "object", "properties": {"answer": {"type": "number"}}});
    let with_schema = || {
        let mut request = request(&parent, Signal::new());
        request.output_schema = Some(schema.clone());
        request
    };
    let configured = outcome(&host, "configured", with_schema()).await;
    assert_eq!(configured.structured, Some(json!({"answer": 42})));
    let fallback = outcome(&host, "fallback", with_schema()).await;
    assert_eq!(fallback.structured, Some(json!({"reply": "fallback reply"})));
    for provider in ["configured", "fallback", "plain"] {
        let result = outcome(&host, provider, request(&parent, Signal::new())).await;
        assert_eq!(
            result.structured, None,
            "{provider}: no schema, no structured value"
        );
        assert_eq!(result.stop_reason, StopReason::Completed, "{provider}");
    }
    host.close().await;
}

/// spec: TOOL-55 — the configured stop reason is honoured (with its diagnostic, which a
/// completed run never carries), and a cancellation of the request's signal — or a disposal —
/// before the result resolves makes it `aborted`.
#[tokio::test(start_paused = true)]
async fn tool_55_configured_and_cancellation_stop_reasons() {
    let mut host = Host::new();
    let (_, parent) = parent(&mut host).await;
    let _refusing = host.provider(FakeProvider::scripted(
        "refusing",
        Script {
            stop_reason: Some(StopReason::Refusal),
            diagnostic: Some("not my job".into()),
            ..Script::default()
        },
    ));
    let _mock = host.provider(FakeProvider::scripted(
        "mock",
        Script {
            diagnostic: Some("only when not completed".into()),
            ..Script::default()
        },
    ));
    let refused = outcome(&host, "refusing", request(&parent, Signal::new())).await;
    assert_eq!(refused.stop_reason, StopReason::Refusal);
    assert_eq!(refused.diagnostic.as_deref(), Some("not my job"));
    assert_eq!(refused.output, [ContentBlock::text(SCRIPTED_REPLY)]);
    let completed = outcome(&host, "mock", request(&parent, Signal::new())).await;
    assert_eq!(completed.stop_reason, StopReason::Completed);
    assert_eq!(completed.diagnostic, None);

    let signal = Signal::new();
    let run = host
        .subagents
        .start("mock", request(&parent, signal.clone()))
        .await
        .expect("the start is accepted");
    signal.cancel(CancelCause::User);
    let cancelled = run.result().await.expect("the result settles");
    assert_eq!(cancelled.stop_reason, StopReason::Aborted);
    assert_eq!(cancelled.diagnostic.as_deref(), Some("only when not completed"));
    run.dispose().await.expect("the run disposes");

    let run = host
        .subagents
        .start("mock", request(&parent, Signal::new()))
        .await
        .expect("the start is accepted");
    run.dispose().await.expect("the run disposes");
    let disposed = run.result().await.expect("the result settles");
    assert_eq!(disposed.stop_reason, StopReason::Aborted);
    host.close().await;
}

/// spec: TOOL-55 — a start whose signal is cancelled before, or while, its run is published
/// rejects with `scripted subagent start aborted before publication`; the provider itself
/// refuses (the service passed the request on both times) and nothing is left running.
#[tokio::test(start_paused = true)]
async fn tool_55_rejects_cancellation_before_and_during_publication() {
    let mut host = Host::new();
    let (_, parent) = parent(&mut host).await;
    let provider = FakeProvider::scripted("mock", Script::default());
    let requests = provider.requests.clone();
    let _mock = host.provider(provider);

    let already = Signal::cancelled_with(CancelCause::User);
    let refused = host
        .subagents
        .start("mock", request(&parent, already))
        .await
        .err()
        .expect("a pre-cancelled start is refused");
    assert_eq!(refused.to_string(), SCRIPTED_START_ABORTED);
    assert_eq!(requests.lock().len(), 1, "the provider saw the request");

    let handoff = Signal::new();
    {
        let mut pending = pin!(host.subagents.start("mock", request(&parent, handoff.clone())));
        let first = futures::poll!(pending.as_mut());
        assert!(first.is_pending(), "publication is under way");
        assert_eq!(requests.lock().len(), 2);
        handoff.cancel(CancelCause::User);
        let refused = match futures::poll!(pending.as_mut()) {
            Poll::Ready(outcome) => outcome
                .err()
                .expect("a start cancelled during publication is refused"),
            Poll::Pending => panic!("the start answers once it is polled after the cancellation"),
        };
        assert_eq!(refused.to_string(), SCRIPTED_START_ABORTED);
    }
    assert_eq!(host.subagents.pending_runs(), 0);
    host.close().await;
}

/// spec: TOOL-55 — the scripted provider unregisters with its owning scope: dropping its
/// registration removes it from the service.
#[tokio::test(start_paused = true)]
async fn tool_55_unregisters_with_its_scope() {
    let host = Host::new();
    let registration = host.provider(FakeProvider::scripted("mock", Script::default()));
    assert_eq!(host.subagents.list(), ["mock"]);
    assert!(host.subagents.get_provider("mock").is_some());
    drop(registration);
    assert_eq!(host.subagents.list(), Vec::<String>::new());
    assert!(host.subagents.get_provider("mock").is_none());
    host.close().await;
}
