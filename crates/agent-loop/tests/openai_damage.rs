//! The OpenAI-compatible adapter end to end (a 127.0.0.1 server replaying scripted bodies)
//! under odd framing, damage and cancellation at every point. The parser's exhaustive
//! framing and damage sweeps are unit tests (`model::openai::robustness`); these check that
//! the HTTP path gives the same results.
#![cfg(feature = "openai")]

mod common;

use std::time::Duration;

use agent::stream_grammar::validate_stream;
use agent::{CancelCause, ContentBlock, FinishReason, LlmFailure, ModelAdapter, Signal, StreamChunk};
use common::openai::*;
use futures::StreamExt as _;
use serde_json::{Value, json};

/// A guard against hangs only (a passing test never waits for it).
const HANG_GUARD: Duration = Duration::from_secs(20);

/// A recorded stream with multi-byte text, a tool call with argument deltas and usage.
fn recorded_events() -> Vec<Value> {
    vec![
        delta(json!({"role": "assistant", "content": "héllo "})),
        delta(json!({"content": "😀"})),
        delta(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "read", "arguments": ""}}]}),
        ),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\":\"é"}}]})),
        delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": "😀\"}"}}]})),
        finish_event("tool_calls"),
        usage_event(),
    ]
}

/// The stream's body as `data:` events ending in `[DONE]`.
fn sse_body(events: &[Value]) -> Vec<u8> {
    let mut body = String::new();
    for e in events {
        body.push_str(&format!("data: {e}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    body.into_bytes()
}

/// A reply delivering `body` in the given pieces.
fn reply_in_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Reply {
    Reply::stream(parts.into_iter().map(|p| Part::Data(p.to_vec())).collect())
}

#[tokio::test]
async fn any_framing_over_http_gives_the_same_chunks() {
    let body = sse_body(&recorded_events());
    let emoji = body.windows(4).position(|w| w == "😀".as_bytes()).unwrap();
    let crlf = String::from_utf8(body.clone())
        .unwrap()
        .replace('\n', "\r\n")
        .into_bytes();
    let cr_at = crlf.iter().position(|&b| b == b'\r').unwrap();
    let mut bom = "\u{feff}".as_bytes().to_vec();
    bom.extend_from_slice(&body);
    let replies = vec![
        reply_in_parts([&body[..]]),
        // One byte per write (each flushed).
        reply_in_parts(body.chunks(1)),
        // Splits inside a code point.
        reply_in_parts([
            &body[..emoji + 1],
            &body[emoji + 1..emoji + 3],
            &body[emoji + 3..],
        ]),
        // CRLF line ends, split between a `\r` and its `\n`.
        reply_in_parts([&crlf[..=cr_at], &crlf[cr_at + 1..]]),
        // A leading byte-order mark, split inside it.
        reply_in_parts([&bom[..2], &bom[2..]]),
    ];
    let count = replies.len();
    let (base, _) = serve(replies).await;
    let a = adapter(&base);
    let whole = run(&a, Signal::new()).await;
    assert_eq!(
        blocks(&whole),
        vec![
            ContentBlock::text("héllo 😀"),
            ContentBlock::tool_call("call_1", "read", "{\"path\":\"é😀\"}"),
        ]
    );
    assert_eq!(finish(&whole), FinishReason::ToolCalls);
    for n in 1..count {
        assert_eq!(run(&a, Signal::new()).await, whole, "reply {n}");
    }
}

#[tokio::test]
async fn damaged_bodies_end_in_typed_failures_over_http() {
    let text = delta(json!({"content": "kept"})).to_string();
    let mut not_utf8 = format!("data: {text}\n\n").into_bytes();
    not_utf8.extend_from_slice(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xC3(\"}}]}\n\n");
    let cases: Vec<(Vec<u8>, &str)> = vec![
        // A data line cut mid-JSON, then the body ends.
        (
            format!("data: {text}\n\ndata: {}", &text[..text.len() / 2]).into_bytes(),
            "BAD_RESPONSE",
        ),
        // The body ends between events, with no finish reason and no `[DONE]`.
        (format!("data: {text}\n\n").into_bytes(), "STREAM_INTERRUPTED"),
        (not_utf8, "BAD_RESPONSE"),
    ];
    let replies = cases.iter().map(|(b, _)| reply_in_parts([&b[..]])).collect();
    let (base, _) = serve(replies).await;
    let a = adapter(&base);
    for (body, code) in &cases {
        let chunks = run(&a, Signal::new()).await;
        let f = failure(&chunks);
        assert_eq!(f.code, *code, "{}", String::from_utf8_lossy(body));
        assert_eq!(f.request_id.as_deref(), Some("req_ok"));
        assert!(chunks.contains(&StreamChunk::TextDelta {
            index: 0,
            text: "kept".into()
        }));
    }
}

#[tokio::test]
async fn a_huge_single_line_arrives_whole_over_http() {
    let big = "é😀x".repeat(200_000);
    let body = sse_body(&[delta(json!({"content": big})), finish_event("stop")]);
    let (base, _) = serve(vec![reply_in_parts(body.chunks(100_000))]).await;
    let chunks = run(&adapter(&base), Signal::new()).await;
    assert_eq!(blocks(&chunks), vec![ContentBlock::text(big)]);
    assert_eq!(finish(&chunks), FinishReason::Stop);
}

/// Reads `n` chunks, cancels, reads the rest; checks the grammar. With `server`, first drives
/// the stream until the server has read its request (`served` requests before it), so that
/// even a cancel before the first chunk happens after the request went out.
async fn cancel_after(
    a: &agent_loop::model::OpenAiCompatible,
    n: usize,
    server: Option<(&Server, usize)>,
) -> Vec<StreamChunk> {
    let signal = Signal::new();
    let mut stream = a.stream(request(signal.clone()));
    if let Some((server, served)) = server {
        while server.received.lock().len() <= served {
            tokio::select! {
                biased;
                () = server.got_request.notified() => {}
                chunk = stream.next() => panic!("a chunk before the request was read: {chunk:?}"),
            }
        }
    }
    let mut chunks = Vec::new();
    for _ in 0..n {
        chunks.push(stream.next().await.expect("a chunk").expect("in-band"));
    }
    signal.cancel(CancelCause::User);
    let rest = tokio::time::timeout(HANG_GUARD, stream.collect::<Vec<_>>())
        .await
        .expect("the stream ends once cancelled");
    chunks.extend(rest.into_iter().map(|c| c.expect("in-band")));
    validate_stream(&chunks).unwrap_or_else(|e| panic!("{e}: {chunks:#?}"));
    chunks
}

fn aborted() -> StreamChunk {
    StreamChunk::Finish {
        reason: FinishReason::Aborted {
            failure: LlmFailure::new("ABORTED", "user"),
        },
        replay_state: None,
    }
}

#[tokio::test]
async fn cancelled_after_each_part_the_stream_aborts_and_hangs_up() {
    let events = recorded_events();
    // The chunks each event yields (`block-start`s and deltas; block ends come at the end).
    let per_event = [2, 1, 2, 1, 1, 0, 0];
    assert_eq!(per_event.len(), events.len());
    let parts: Vec<Vec<u8>> = events
        .iter()
        .map(|e| format!("data: {e}\n\n").into_bytes())
        .collect();
    // Reply `k` sends the first `k` events, then waits for the client to hang up.
    let mut replies = vec![Reply::sse(&events)];
    for k in 0..=events.len() {
        let mut script: Vec<Part> = parts[..k].iter().cloned().map(Part::Data).collect();
        script.push(Part::Hang);
        replies.push(Reply::stream(script));
    }
    let server = serve_watched(replies).await;
    let a = adapter(&server.base);
    let whole = run(&a, Signal::new()).await;
    for k in 0..=events.len() {
        let before: usize = per_event[..k].iter().sum();
        let chunks = cancel_after(&a, before, Some((&server, k + 1))).await;
        assert_eq!(chunks[..before], whole[..before], "after {k} parts");
        assert_eq!(chunks[before..], [aborted()], "after {k} parts");
        tokio::time::timeout(HANG_GUARD, server.hung_up.notified())
            .await
            .unwrap_or_else(|_| panic!("after {k} parts the server never saw the connection close"));
    }
}

#[tokio::test]
async fn cancelled_between_chunks_of_one_read_the_stream_aborts_at_once() {
    // The whole reply arrives in one write, so its chunks are parsed together and queued; a
    // cancel between two of them must still end the stream at once, not after the rest (and
    // not with the reply's own finish).
    let body = sse_body(&recorded_events());
    // 7 starts and deltas, 2 block ends, usage, finish.
    let total = 11;
    let (base, _) = serve((0..=total + 1).map(|_| reply_in_parts([&body[..]])).collect()).await;
    let a = adapter(&base);
    let whole = run(&a, Signal::new()).await;
    assert_eq!(whole.len(), total);
    assert_eq!(finish(&whole), FinishReason::ToolCalls);
    // (Cancelled before the first chunk, no request is sent and the next call takes the reply.)
    for n in 0..total {
        let chunks = cancel_after(&a, n, None).await;
        assert_eq!(chunks[..n], whole[..n], "cancelled after {n} chunks");
        assert_eq!(chunks[n..], [aborted()], "cancelled after {n} chunks");
    }
    // Cancelling after the finish changes nothing.
    assert_eq!(cancel_after(&a, total, None).await, whole);
}

/// A server that ignores `stream: true` answers 200 with one JSON document, and a wrong base URL
/// often answers 200 with an HTML page: the stream ends with a typed failure saying so — the
/// provider's own error when the document is one — instead of `STREAM_INTERRUPTED` after
/// parsing nothing; `+json` media types count too.
#[tokio::test]
async fn a_json_document_instead_of_an_event_stream_is_a_typed_failure() {
    let completion = json!({
        "id": "chatcmpl-1", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    });
    let error = json!({"error": {"message": "quota exceeded", "type": "insufficient_quota"}});
    let cases: Vec<(&'static str, Value, &str, &str)> = vec![
        (
            "application/json",
            completion.clone(),
            "BAD_RESPONSE",
            "instead of an event stream",
        ),
        (
            "application/json; charset=utf-8",
            error,
            "INSUFFICIENT_QUOTA",
            "quota exceeded",
        ),
        (
            "application/problem+json",
            completion,
            "BAD_RESPONSE",
            "instead of an event stream",
        ),
        (
            "text/html; charset=utf-8",
            json!("<html><body>Welcome to nginx!</body></html>"),
            "BAD_RESPONSE",
            "an HTML page instead of an event stream",
        ),
    ];
    for (content_type, document, code, message) in cases {
        let reply = Reply {
            status: 200,
            headers: vec![("content-type", content_type), ("x-request-id", "req_json")],
            parts: vec![Part::Data(document.to_string().into_bytes())],
        };
        let (base, _) = serve(vec![reply]).await;
        let chunks = tokio::time::timeout(HANG_GUARD, run(&adapter(&base), Signal::new()))
            .await
            .expect("no hang");
        let failure = failure(&chunks);
        assert_eq!(failure.code, code, "{content_type}: {failure:?}");
        assert!(failure.message.contains(message), "{content_type}: {failure:?}");
        assert_eq!(failure.request_id.as_deref(), Some("req_json"));
        assert!(
            !chunks.iter().any(|c| matches!(c, StreamChunk::TextDelta { .. })),
            "nothing was streamed: {chunks:?}"
        );
    }
}
