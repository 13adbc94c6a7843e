//! The OpenAI-compatible adapter against a local HTTP server (127.0.0.1) replaying recorded
//! server-sent-event streams.
#![cfg(feature = "openai")]

use std::sync::Arc;

use agent::stream_grammar::validate_stream;
use agent::{
    CancelCause, ContentBlock, FinishReason, GenerateOptions, LlmFailure, Message, ModelAdapter, Signal,
    StreamChunk, TokenUsage, ToolSchema,
};
use agent_loop::model::{OpenAiCompatible, OpenAiConfig};
use futures::StreamExt as _;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// One piece of a scripted HTTP response body.
enum Part {
    /// Bytes written (and flushed) as one piece.
    Data(Vec<u8>),
    /// Stop writing and keep the connection open until the client closes it.
    Hang,
}

/// A scripted HTTP response.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, &'static str)>,
    parts: Vec<Part>,
}

impl Reply {
    fn sse(events: &[Value]) -> Self {
        let mut parts: Vec<Part> = events
            .iter()
            .map(|e| Part::Data(format!("data: {e}\n\n").into_bytes()))
            .collect();
        parts.push(Part::Data(b"data: [DONE]\n\n".to_vec()));
        Self::stream(parts)
    }

    fn stream(parts: Vec<Part>) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type", "text/event-stream"), ("x-request-id", "req_ok")],
            parts,
        }
    }
}

/// What the server received.
#[derive(Debug)]
struct Received {
    head: String,
    body: Value,
}

/// A one-connection-per-reply HTTP/1.1 server on 127.0.0.1. Each reply answers one accepted
/// connection; the server task ends after the last one.
async fn serve(replies: Vec<Reply>) -> (String, Arc<Mutex<Vec<Received>>>) {
    let (base, received, _) = serve_notifying(replies).await;
    (base, received)
}

/// Like [`serve`], also returning a notification fired after each request is read. A reply
/// with status 0 never answers: the server waits for the client to close the connection.
async fn serve_notifying(replies: Vec<Reply>) -> (String, Arc<Mutex<Vec<Received>>>, Arc<Notify>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    let got_request = Arc::new(Notify::new());
    let notify = got_request.clone();
    let log = received.clone();
    tokio::spawn(async move {
        for reply in replies {
            let (mut socket, _) = listener.accept().await.unwrap();
            let Some((head, body)) = read_request(&mut socket).await else {
                continue;
            };
            log.lock().push(Received {
                head,
                body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            });
            notify.notify_one();
            if reply.status == 0 {
                let mut sink = [0u8; 64];
                while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
                continue;
            }
            let reason = match reply.status {
                200 => "OK",
                429 => "Too Many Requests",
                500 => "Internal Server Error",
                _ => "Status",
            };
            let mut head = format!("HTTP/1.1 {} {reason}\r\nconnection: close\r\n", reply.status);
            for (k, v) in &reply.headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            if socket.write_all(head.as_bytes()).await.is_err() {
                continue;
            }
            for part in reply.parts {
                match part {
                    Part::Data(bytes) => {
                        if socket.write_all(&bytes).await.is_err() || socket.flush().await.is_err() {
                            break;
                        }
                    }
                    Part::Hang => {
                        // Wait until the client goes away.
                        let mut sink = [0u8; 64];
                        while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
                        break;
                    }
                }
            }
        }
    });
    (base, received, got_request)
}

/// Reads one request (head and `content-length` body).
async fn read_request(socket: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = socket.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = socket.read(&mut tmp).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    Some((head, buf[head_end..head_end + len].to_vec()))
}

fn adapter(base: &str) -> OpenAiCompatible {
    OpenAiCompatible::new(OpenAiConfig::new(base, Some("sk-test".into()), "default-model")).unwrap()
}

fn request(signal: Signal) -> Arc<GenerateOptions> {
    let mut r = GenerateOptions::new("openai", "gpt-test", vec![Message::user_text("hi")]);
    r.signal = signal;
    r.system = Some("be brief".into());
    r.tools = Some(vec![ToolSchema {
        name: "read".into(),
        description: "Reads a file.".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
    }]);
    r.max_tokens = Some(64);
    Arc::new(r)
}

async fn run(adapter: &OpenAiCompatible, signal: Signal) -> Vec<StreamChunk> {
    let items: Vec<Result<StreamChunk, LlmFailure>> = adapter.stream(request(signal)).collect().await;
    let chunks: Vec<StreamChunk> = items
        .into_iter()
        .map(|c| c.expect("failures are in-band"))
        .collect();
    validate_stream(&chunks).unwrap_or_else(|e| panic!("{e}: {chunks:#?}"));
    chunks
}

fn finish(chunks: &[StreamChunk]) -> FinishReason {
    match chunks.last() {
        Some(StreamChunk::Finish { reason, .. }) => reason.clone(),
        other => panic!("no finish: {other:?}"),
    }
}

fn failure(chunks: &[StreamChunk]) -> LlmFailure {
    match finish(chunks) {
        FinishReason::Error { failure } | FinishReason::Aborted { failure } => failure,
        other => panic!("not a failure: {other:?}"),
    }
}

fn blocks(chunks: &[StreamChunk]) -> Vec<ContentBlock> {
    chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::BlockEnd { block, .. } => Some(block.clone()),
            _ => None,
        })
        .collect()
}

fn delta(delta: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

fn finish_event(reason: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

fn usage_event() -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }})
}

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
        ("OVERLOADED_ERROR", "overloaded")
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
    let config = OpenAiConfig::new("http://127.0.0.1:1/v1", Some("sk-secret".into()), "m");
    let shown = format!("{config:?}");
    assert!(
        !shown.contains("sk-secret") && shown.contains("<redacted>"),
        "{shown}"
    );
}
