//! Fixtures for the OpenAI-compatible adapter's tests: a local HTTP server (127.0.0.1) replaying
//! scripted server-sent-event bodies, and helpers to run the adapter and read its chunks.

use std::sync::Arc;
use std::time::Duration;

use agent::stream_grammar::validate_stream;
use agent::{
    ContentBlock, FinishReason, GenerateOptions, LlmFailure, Message, ModelAdapter, Signal, StreamChunk,
    ToolSchema,
};
use agent_loop::model::{OpenAiCompatible, OpenAiConfig};
use futures::StreamExt as _;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// One piece of a scripted HTTP response body.
pub enum Part {
    /// Bytes written (and flushed) as one piece.
    Data(Vec<u8>),
    /// Stop writing and keep the connection open until the client closes it.
    Hang,
    /// Write nothing for this long (`tokio::time`, so a paused test clock drives it).
    Pause(Duration),
}

/// A scripted HTTP response.
pub struct Reply {
    /// The status code; 0 never answers (the server waits for the client to hang up).
    pub status: u16,
    /// Response headers.
    pub headers: Vec<(&'static str, &'static str)>,
    /// The body, piece by piece.
    pub parts: Vec<Part>,
}

impl Reply {
    /// A 200 event stream: one part per event, then `data: [DONE]`.
    pub fn sse(events: &[Value]) -> Self {
        let mut parts: Vec<Part> = events
            .iter()
            .map(|e| Part::Data(format!("data: {e}\n\n").into_bytes()))
            .collect();
        parts.push(Part::Data(b"data: [DONE]\n\n".to_vec()));
        Self::stream(parts)
    }

    /// A 200 event stream of these parts.
    pub fn stream(parts: Vec<Part>) -> Self {
        Self {
            status: 200,
            headers: vec![("content-type", "text/event-stream"), ("x-request-id", "req_ok")],
            parts,
        }
    }
}

/// What the server received.
#[derive(Debug)]
pub struct Received {
    /// The request line and headers.
    pub head: String,
    /// The JSON body (`null` when it was not JSON).
    pub body: Value,
}

/// A one-connection-per-reply HTTP/1.1 server on 127.0.0.1. Each reply answers one accepted
/// connection; the server task ends after the last one.
pub async fn serve(replies: Vec<Reply>) -> (String, Arc<Mutex<Vec<Received>>>) {
    let (base, received, _) = serve_notifying(replies).await;
    (base, received)
}

/// Like [`serve`], also returning a notification fired after each request is read. A reply
/// with status 0 never answers: the server waits for the client to close the connection.
pub async fn serve_notifying(replies: Vec<Reply>) -> (String, Arc<Mutex<Vec<Received>>>, Arc<Notify>) {
    let server = serve_watched(replies).await;
    (server.base, server.received, server.got_request)
}

/// A running [`serve_watched`] server.
pub struct Server {
    /// The base URL (`http://127.0.0.1:<port>/v1`).
    pub base: String,
    /// The requests read so far.
    pub received: Arc<Mutex<Vec<Received>>>,
    /// Notified (one permit per request) after each request is read.
    pub got_request: Arc<Notify>,
    /// Notified (one permit per connection) when a reply waiting in [`Part::Hang`] (or a
    /// status-0 reply) sees the client close the connection.
    pub hung_up: Arc<Notify>,
}

/// Like [`serve`], also reporting each request read and each client hang-up.
pub async fn serve_watched(replies: Vec<Reply>) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    let got_request = Arc::new(Notify::new());
    let hung_up = Arc::new(Notify::new());
    let notify = got_request.clone();
    let closed = hung_up.clone();
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
                closed.notify_one();
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
                    Part::Pause(gap) => tokio::time::sleep(gap).await,
                    Part::Hang => {
                        // Wait until the client goes away.
                        let mut sink = [0u8; 64];
                        while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
                        closed.notify_one();
                        break;
                    }
                }
            }
        }
    });
    Server {
        base,
        received,
        got_request,
        hung_up,
    }
}

/// Reads one request (head and `content-length` body).
pub async fn read_request(socket: &mut TcpStream) -> Option<(String, Vec<u8>)> {
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

/// An adapter for `base` with key `sk-test` and default model `default-model`.
pub fn adapter(base: &str) -> OpenAiCompatible {
    OpenAiCompatible::new(OpenAiConfig::new(base, Some("sk-test".into()), "default-model")).unwrap()
}

/// Like [`adapter`], with [`OpenAiConfig::idle_timeout`] set to `idle`.
pub fn adapter_with_idle(base: &str, idle: Option<Duration>) -> OpenAiCompatible {
    let mut config = OpenAiConfig::new(base, Some("sk-test".into()), "default-model");
    config.idle_timeout = idle;
    OpenAiCompatible::new(config).unwrap()
}

/// A request (model `gpt-test`, a system prompt, one tool, `max_tokens` 64) under `signal`.
pub fn request(signal: Signal) -> Arc<GenerateOptions> {
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

/// Runs one call to the end; checks that failures are in-band and the stream grammatical.
pub async fn run(adapter: &OpenAiCompatible, signal: Signal) -> Vec<StreamChunk> {
    let items: Vec<Result<StreamChunk, LlmFailure>> = adapter.stream(request(signal)).collect().await;
    let chunks: Vec<StreamChunk> = items
        .into_iter()
        .map(|c| c.expect("failures are in-band"))
        .collect();
    validate_stream(&chunks).unwrap_or_else(|e| panic!("{e}: {chunks:#?}"));
    chunks
}

/// The stream's final finish reason.
pub fn finish(chunks: &[StreamChunk]) -> FinishReason {
    match chunks.last() {
        Some(StreamChunk::Finish { reason, .. }) => reason.clone(),
        other => panic!("no finish: {other:?}"),
    }
}

/// The failure an `error` or `aborted` stream ended with.
pub fn failure(chunks: &[StreamChunk]) -> LlmFailure {
    match finish(chunks) {
        FinishReason::Error { failure } | FinishReason::Aborted { failure } => failure,
        other => panic!("not a failure: {other:?}"),
    }
}

/// The assembled blocks of every `block-end`.
pub fn blocks(chunks: &[StreamChunk]) -> Vec<ContentBlock> {
    chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::BlockEnd { block, .. } => Some(block.clone()),
            _ => None,
        })
        .collect()
}

/// A chat-completion chunk event carrying `delta` for choice 0.
pub fn delta(delta: Value) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

/// A chat-completion chunk event carrying `finish_reason`.
pub fn finish_event(reason: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

/// The usage event (no choices) sent with `stream_options.include_usage`.
pub fn usage_event() -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }})
}
