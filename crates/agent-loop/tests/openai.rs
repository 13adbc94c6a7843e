//! The OpenAI-compatible adapter against a local HTTP server (127.0.0.1) replaying recorded
//! server-sent-event streams.
#![cfg(feature = "openai")]

mod common;

use agent::stream_grammar::validate_stream;
use agent::{
    CancelCause, ContentBlock, FinishReason, LlmFailure, ModelAdapter, Signal, StreamChunk, TokenUsage,
};
use agent_loop::model::{OpenAiCompatible, OpenAiConfig};
use common::openai::*;
use futures::StreamExt as _;
use serde_json::json;
use tokio::net::TcpListener;

#[tokio::test]
async fn streams_text_with_usage_and_sends_the_request() {
    let (base, received) = serve(vec![Reply::sse(&[
        delta(json!({"role": "assistant", "content": ""})),
        delta(json!({"content": "Hel"})),
        delta(json!({"content": "lo ✓"})),
        finish_event("stop"),
        usage_event(),
    ])])
    .await;
    let chunks = run(&adapter(&base), Signal::new()).await;
    assert_eq!(blocks(&chunks), vec![ContentBlock::text("Hello ✓")]);
    assert_eq!(finish(&chunks), FinishReason::Stop);
    assert!(chunks.contains(&StreamChunk::Usage {
        usage: TokenUsage {
            input_tokens: 12,
            output_tokens: 7,
            cache_read_tokens: Some(4),
            cache_write_tokens: None,
            reasoning_tokens: Some(2),
        }
    }));
    let deltas: Vec<&str> = chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::TextDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(deltas, ["Hel", "lo ✓"]);

    let received = received.lock();
    let req = &received[0];
    assert!(
        req.head.starts_with("POST /v1/chat/completions HTTP/1.1"),
        "{}",
        req.head
    );
    assert!(
        req.head
            .to_ascii_lowercase()
            .contains("authorization: bearer sk-test")
    );
    assert_eq!(req.body["model"], "gpt-test");
    assert_eq!(req.body["stream"], true);
    assert_eq!(req.body["max_tokens"], 64);
    assert_eq!(
        req.body["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    );
    assert_eq!(req.body["tools"][0]["function"]["name"], "read");
}

#[tokio::test]
async fn streams_parallel_tool_calls_by_index() {
    let (base, _) = serve(vec![Reply::sse(&[
        delta(json!({"role": "assistant", "content": "Let me check."})),
        delta(json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "read", "arguments": ""}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"pa"}}]})),
        delta(json!({"tool_calls": [{"index": 1, "id": "call_2", "type": "function", "function": {"name": "list", "arguments": "{}"}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "th\":\"a\"}"}}]})),
        finish_event("tool_calls"),
        usage_event(),
    ])])
    .await;
    let chunks = run(&adapter(&base), Signal::new()).await;
    assert_eq!(
        blocks(&chunks),
        vec![
            ContentBlock::text("Let me check."),
            ContentBlock::tool_call("call_1", "read", "{\"path\":\"a\"}"),
            ContentBlock::tool_call("call_2", "list", "{}"),
        ]
    );
    assert_eq!(finish(&chunks), FinishReason::ToolCalls);
    // Every tool-call delta names its call; the name travels with the first one.
    let first_delta = chunks
        .iter()
        .find(|c| matches!(c, StreamChunk::ToolCallDelta { .. }))
        .unwrap();
    assert!(
        matches!(first_delta, StreamChunk::ToolCallDelta { id, name: Some(n), .. } if id.as_str() == "call_1" && n == "read")
    );
}

#[tokio::test]
async fn length_reasoning_and_empty_responses() {
    let (base, _) = serve(vec![
        Reply::sse(&[delta(json!({"content": "trunc"})), finish_event("length")]),
        Reply::sse(&[
            delta(json!({"reasoning_content": "think"})),
            delta(json!({"content": "answer"})),
            finish_event("stop"),
        ]),
        Reply::sse(&[delta(json!({"role": "assistant"})), finish_event("stop")]),
        Reply::sse(&[delta(json!({"content": "no"})), finish_event("content_filter")]),
    ])
    .await;
    let a = adapter(&base);
    let chunks = run(&a, Signal::new()).await;
    assert_eq!(finish(&chunks), FinishReason::MaxTokens);
    assert_eq!(blocks(&chunks), vec![ContentBlock::text("trunc")]);

    let chunks = run(&a, Signal::new()).await;
    assert_eq!(
        blocks(&chunks),
        vec![ContentBlock::reasoning("think"), ContentBlock::text("answer")]
    );

    let chunks = run(&a, Signal::new()).await;
    assert_eq!(failure(&chunks).code, "EMPTY_RESPONSE");

    let chunks = run(&a, Signal::new()).await;
    assert_eq!(failure(&chunks).code, "CONTENT_FILTERED");
}

#[tokio::test]
async fn http_errors_carry_status_retry_after_and_request_id() {
    let (base, _) = serve(vec![
        Reply {
            status: 429,
            headers: vec![
                ("content-type", "application/json"),
                ("retry-after", "3"),
                ("x-request-id", "req_123"),
            ],
            parts: vec![Part::Data(
                br#"{"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}"#.to_vec(),
            )],
        },
        Reply {
            status: 500,
            headers: vec![("content-type", "text/plain")],
            parts: vec![Part::Data(b"upstream exploded".to_vec())],
        },
    ])
    .await;
    let a = adapter(&base);
    let chunks = run(&a, Signal::new()).await;
    assert_eq!(chunks.len(), 1, "a failed request streams only its finish");
    assert_eq!(
        failure(&chunks),
        LlmFailure {
            message: "Rate limit reached".into(),
            code: "RATE_LIMITED".into(),
            status: Some(429),
            provider_retry_after_ms: Some(3000),
            request_id: Some("req_123".into()),
        }
    );
    assert!(matches!(finish(&chunks), FinishReason::Error { .. }));

    let f = failure(&run(&a, Signal::new()).await);
    assert_eq!(
        (f.code.as_str(), f.status, f.message.as_str()),
        (
            "SERVER_ERROR",
            Some(500),
            "HTTP 500 Internal Server Error: upstream exploded"
        )
    );
}

#[tokio::test]
async fn stream_errors_become_failures() {
    let (base, _) = serve(vec![
        // An error event mid-stream, with a block open.
        Reply::stream(vec![
            Part::Data(format!("data: {}\n\n", delta(json!({"content": "par"}))).into_bytes()),
            Part::Data(
                b"data: {\"error\": {\"message\": \"overloaded\", \"code\": \"overloaded_error\"}}\n\n"
                    .to_vec(),
            ),
        ]),
        // The body ends before any finish reason.
        Reply::stream(vec![Part::Data(
            format!("data: {}\n\n", delta(json!({"content": "par"}))).into_bytes(),
        )]),
        // Not JSON.
        Reply::stream(vec![Part::Data(b"data: {nope\n\n".to_vec())]),
    ])
    .await;
    let a = adapter(&base);
    let f = failure(&run(&a, Signal::new()).await);
    assert_eq!(
        (f.code.as_str(), f.message.as_str()),
        ("OVERLOADED", "overloaded (provider code: overloaded_error)")
    );
    assert_eq!(f.request_id.as_deref(), Some("req_ok"));
    assert_eq!(failure(&run(&a, Signal::new()).await).code, "STREAM_INTERRUPTED");
    assert_eq!(failure(&run(&a, Signal::new()).await).code, "BAD_RESPONSE");
}

#[tokio::test]
async fn cancellation_mid_stream_ends_with_an_aborted_finish() {
    let (base, _) = serve(vec![Reply::stream(vec![
        Part::Data(format!("data: {}\n\n", delta(json!({"content": "partial"}))).into_bytes()),
        Part::Hang,
    ])])
    .await;
    let a = adapter(&base);
    let signal = Signal::new();
    let mut stream = a.stream(request(signal.clone()));
    let mut chunks = Vec::new();
    // Read until the partial text arrives, then cancel.
    loop {
        let chunk = stream.next().await.unwrap().unwrap();
        let is_delta = matches!(chunk, StreamChunk::TextDelta { .. });
        chunks.push(chunk);
        if is_delta {
            break;
        }
    }
    signal.cancel(CancelCause::User);
    while let Some(chunk) = stream.next().await {
        chunks.push(chunk.unwrap());
    }
    validate_stream(&chunks).unwrap();
    assert_eq!(
        finish(&chunks),
        FinishReason::Aborted {
            failure: LlmFailure::new("ABORTED", "user")
        }
    );
}

#[tokio::test]
async fn cancellation_while_waiting_for_the_response() {
    // The server reads the request and never answers.
    let (base, received, got_request) = serve_notifying(vec![Reply {
        status: 0,
        headers: vec![],
        parts: vec![],
    }])
    .await;
    let a = adapter(&base);
    let signal = Signal::new();
    let stream = a.stream(request(signal.clone()));
    let collecting = tokio::spawn(stream.collect::<Vec<_>>());
    got_request.notified().await;
    assert_eq!(received.lock().len(), 1);
    signal.cancel(CancelCause::Parent);
    let chunks: Vec<StreamChunk> = collecting
        .await
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        chunks,
        vec![StreamChunk::Finish {
            reason: FinishReason::Aborted {
                failure: LlmFailure::new("ABORTED", "parent")
            },
            replay_state: None
        }]
    );
}

#[tokio::test]
async fn an_already_cancelled_request_sends_nothing() {
    let (base, received) = serve(vec![]).await;
    let chunks = run(&adapter(&base), Signal::cancelled_with(CancelCause::Disposed)).await;
    assert_eq!(failure(&chunks), LlmFailure::new("ABORTED", "disposed"));
    assert!(received.lock().is_empty());
}

#[tokio::test]
async fn connection_failures_are_structured() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let f = failure(&run(&adapter(&base), Signal::new()).await);
    assert_eq!(f.code, "CONNECTION_FAILED");
    assert!(
        !f.message.contains("sk-test"),
        "credentials never appear in failures"
    );
}

#[test]
fn debug_output_redacts_the_api_key() {
    let mut config = OpenAiConfig::new("http://127.0.0.1:1/v1", Some("sk-secret".into()), "m");
    config.idle_timeout = Some(std::time::Duration::from_secs(90));
    let shown = format!("{config:?}");
    assert!(
        !shown.contains("sk-secret") && shown.contains("<redacted>"),
        "{shown}"
    );
    assert!(shown.contains("idle_timeout: Some(90s)"), "{shown}");
}

/// Settings no request could succeed with are refused when the adapter is built, with code
/// `CONFIG` and a message naming the setting, instead of failing every turn later.
#[test]
fn settings_no_request_could_use_are_refused_up_front() {
    let refused = |config: OpenAiConfig| match OpenAiCompatible::new(config) {
        Ok(_) => panic!("accepted"),
        Err(failure) => {
            assert_eq!(failure.code, "CONFIG");
            failure.message
        }
    };
    let message = refused(OpenAiConfig::new("api.example.com/v1", None, "m"));
    assert!(message.contains("`api.example.com/v1` is not a URL"), "{message}");
    let message = refused(OpenAiConfig::new("ftp://example.com/v1", None, "m"));
    assert!(message.contains("is not an http(s) URL with a host"), "{message}");
    let mut config = OpenAiConfig::new("http://127.0.0.1:1/v1", None, "m");
    config.idle_timeout = Some(std::time::Duration::ZERO);
    assert!(refused(config).starts_with("idle_timeout is zero"));
    let mut config = OpenAiConfig::new("http://127.0.0.1:1/v1", None, "m");
    config.connect_timeout = Some(std::time::Duration::ZERO);
    assert!(refused(config).starts_with("connect_timeout is zero"));
    let mut config = OpenAiConfig::new("https://api.example.com/v1/", None, "m");
    config.idle_timeout = Some(std::time::Duration::from_millis(1));
    assert!(OpenAiCompatible::new(config).is_ok());
}
