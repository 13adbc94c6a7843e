//! The OpenAI-compatible adapter end to end (a 127.0.0.1 server replaying scripted bodies)
//! under odd framing, damage, stalls and cancellation at every point. The parser's exhaustive
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

/// The `error` failure a stream ended with, and the virtual time from `since` to its finish
/// (which must come within `limit`).
async fn drain_to_failure(
    stream: &mut agent::ModelStream,
    chunks: &mut Vec<StreamChunk>,
    since: tokio::time::Instant,
    limit: Duration,
) -> (LlmFailure, Duration) {
    let rest = tokio::time::timeout(limit, stream.collect::<Vec<_>>())
        .await
        .unwrap_or_else(|_| panic!("no finish within {limit:?} after {chunks:?}"));
    chunks.extend(rest.into_iter().map(|c| c.expect("in-band")));
    let elapsed = since.elapsed();
    validate_stream(chunks).unwrap_or_else(|e| panic!("{e}: {chunks:#?}"));
    match chunks.last() {
        Some(StreamChunk::Finish {
            reason: FinishReason::Error { failure },
            ..
        }) => (failure.clone(), elapsed),
        other => panic!("not an error finish: {other:?}"),
    }
}

/// A server that stops sending (after the head and part of the body, before the first byte of
/// the body, or before the head) ends the stream with a `TIMEOUT` once the configured idle gap
/// has passed on the (paused) clock, and the connection is closed at once, while the caller
/// still holds the stream; an error response whose body stalls is reported with what arrived.
#[tokio::test(start_paused = true)]
async fn an_idle_timeout_ends_a_stalled_stream_with_a_typed_timeout() {
    let idle = Duration::from_secs(30);
    let event =
        |text: &str| Part::Data(format!("data: {}\n\n", delta(json!({"content": text}))).into_bytes());
    let server = serve_watched(vec![
        // Mid-stream, after a keep-alive comment.
        Reply::stream(vec![
            event("partial"),
            Part::Data(b": still here\n\n".to_vec()),
            Part::Hang,
        ]),
        // The head, then not one byte of the body.
        Reply::stream(vec![Part::Hang]),
        // Not even a head.
        Reply {
            status: 0,
            headers: vec![],
            parts: vec![],
        },
        // An error response whose body stalls.
        Reply {
            status: 500,
            headers: vec![("content-type", "text/plain"), ("x-request-id", "req_500")],
            parts: vec![Part::Data(b"upstream ".to_vec()), Part::Hang],
        },
    ])
    .await;
    let a = adapter_with_idle(&server.base, Some(idle));
    let cases = [
        (
            "TIMEOUT",
            "the server sent nothing for 30 s while streaming the response (idle timeout)",
            Some("req_ok"),
            "partial",
        ),
        (
            "TIMEOUT",
            "the server sent nothing for 30 s while streaming the response (idle timeout)",
            Some("req_ok"),
            "",
        ),
        (
            "TIMEOUT",
            "the server sent nothing for 30 s before the response head (idle timeout)",
            None,
            "",
        ),
        (
            "SERVER_ERROR",
            "HTTP 500 Internal Server Error: upstream",
            Some("req_500"),
            "",
        ),
    ];
    for (n, (code, message, request_id, text)) in cases.into_iter().enumerate() {
        let mut stream = a.stream(request(Signal::new()));
        let mut chunks = Vec::new();
        if !text.is_empty() {
            // Up to the text delta: the last thing the server sent.
            while !matches!(chunks.last(), Some(StreamChunk::TextDelta { .. })) {
                chunks.push(stream.next().await.expect("a chunk").expect("in-band"));
            }
        }
        let since = tokio::time::Instant::now();
        let (failure, elapsed) = drain_to_failure(&mut stream, &mut chunks, since, idle + HANG_GUARD).await;
        assert_eq!(failure.code, code, "case {n}: {failure:?}");
        assert_eq!(failure.message, message, "case {n}");
        assert_eq!(failure.request_id.as_deref(), request_id, "case {n}");
        assert!(
            elapsed >= idle && elapsed < idle + Duration::from_secs(1),
            "case {n}: ended after {elapsed:?}"
        );
        // The connection is closed although the stream is still held.
        tokio::time::timeout(HANG_GUARD, server.hung_up.notified())
            .await
            .unwrap_or_else(|_| panic!("case {n}: the server never saw the connection close"));
        if !text.is_empty() {
            assert!(chunks.contains(&StreamChunk::TextDelta {
                index: 0,
                text: text.into()
            }));
        }
        drop(stream);
    }
}

/// The idle limit is a gap, not a deadline: a server that keeps sending, however slowly and for
/// however long in all, is never cut off.
#[tokio::test(start_paused = true)]
async fn an_idle_timeout_does_not_fire_while_the_server_keeps_sending() {
    let idle = Duration::from_secs(10);
    let gap = Duration::from_secs(1);
    let mut parts = vec![Part::Pause(gap)];
    for i in 0..25 {
        parts.push(Part::Data(
            format!("data: {}\n\n", delta(json!({"content": format!("{i} ")}))).into_bytes(),
        ));
        parts.push(Part::Pause(gap));
        // A keep-alive comment counts as the server sending something.
        parts.push(Part::Data(b": ping\n\n".to_vec()));
        parts.push(Part::Pause(gap));
    }
    parts.push(Part::Data(
        format!("data: {}\n\ndata: [DONE]\n\n", finish_event("stop")).into_bytes(),
    ));
    let (base, _) = serve(vec![Reply::stream(parts)]).await;
    let started = tokio::time::Instant::now();
    let chunks = run(&adapter_with_idle(&base, Some(idle)), Signal::new()).await;
    let text: String = (0..25).map(|i| format!("{i} ")).collect();
    assert_eq!(blocks(&chunks), vec![ContentBlock::text(text)]);
    assert_eq!(finish(&chunks), FinishReason::Stop);
    assert!(started.elapsed() >= 51 * gap, "{:?}", started.elapsed());
}

/// Without an idle timeout (the default) a stalled server is waited on for as long as it
/// takes; only the cancel signal ends the stream.
#[tokio::test(start_paused = true)]
async fn without_an_idle_timeout_a_stalled_stream_waits_for_the_cancel() {
    let server = serve_watched(vec![Reply::stream(vec![
        Part::Data(format!("data: {}\n\n", delta(json!({"content": "partial"}))).into_bytes()),
        Part::Hang,
    ])])
    .await;
    let a = adapter(&server.base);
    assert_eq!(a.config().idle_timeout, None);
    let signal = Signal::new();
    let mut stream = a.stream(request(signal.clone()));
    let mut chunks = vec![];
    while !matches!(chunks.last(), Some(StreamChunk::TextDelta { .. })) {
        chunks.push(stream.next().await.expect("a chunk").expect("in-band"));
    }
    tokio::select! {
        chunk = stream.next() => panic!("the stalled stream yielded {chunk:?}"),
        () = tokio::time::sleep(Duration::from_secs(7 * 24 * 3600)) => {}
    }
    signal.cancel(CancelCause::User);
    chunks.extend(
        stream
            .by_ref()
            .map(|c| c.expect("in-band"))
            .collect::<Vec<_>>()
            .await,
    );
    validate_stream(&chunks).unwrap();
    assert_eq!(chunks.last(), Some(&aborted()));
    tokio::time::timeout(HANG_GUARD, server.hung_up.notified())
        .await
        .expect("the server saw the connection close");
}

/// A cancel while the idle timer runs ends the stream at once with the abort, not the timeout.
#[tokio::test(start_paused = true)]
async fn a_cancel_wins_over_a_pending_idle_timeout() {
    let idle = Duration::from_secs(30);
    let server = serve_watched(vec![
        Reply::stream(vec![
            Part::Data(format!("data: {}\n\n", delta(json!({"content": "partial"}))).into_bytes()),
            Part::Hang,
        ]),
        Reply {
            status: 0,
            headers: vec![],
            parts: vec![],
        },
    ])
    .await;
    let a = adapter_with_idle(&server.base, Some(idle));
    for (n, text) in ["partial", ""].into_iter().enumerate() {
        let signal = Signal::new();
        let mut stream = a.stream(request(signal.clone()));
        let mut chunks = vec![];
        if !text.is_empty() {
            while !matches!(chunks.last(), Some(StreamChunk::TextDelta { .. })) {
                chunks.push(stream.next().await.expect("a chunk").expect("in-band"));
            }
        }
        let since = tokio::time::Instant::now();
        let cancel = async {
            tokio::time::sleep(idle - Duration::from_secs(1)).await;
            signal.cancel(CancelCause::User);
        };
        let (rest, ()) = tokio::join!(stream.by_ref().collect::<Vec<_>>(), cancel);
        assert_eq!(since.elapsed(), idle - Duration::from_secs(1), "case {n}");
        chunks.extend(rest.into_iter().map(|c| c.expect("in-band")));
        validate_stream(&chunks).unwrap();
        assert_eq!(chunks.last(), Some(&aborted()), "case {n}");
        tokio::time::timeout(HANG_GUARD, server.hung_up.notified())
            .await
            .unwrap_or_else(|_| panic!("case {n}: the server never saw the connection close"));
    }
}
