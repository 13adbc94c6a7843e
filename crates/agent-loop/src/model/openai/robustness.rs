//! The response parser ([`BodyParser`], the I/O-free half of the adapter) against oddly framed
//! and damaged server-sent-event bodies: every framing of a body parses alike, the SSE syntax
//! variants parse like the plain form, and damage ends in a typed failure (or a documented
//! tolerance), always as a grammatical stream.

use std::collections::VecDeque;

use agent::stream_grammar::validate_stream;
use agent::{ContentBlock, FinishReason, StreamChunk, TokenUsage};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::BodyParser;

/// Parses a body delivered in `parts` exactly as `Call` does (a part that ends the stream ends
/// the parse), and checks the result against the stream grammar.
fn parse_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Vec<StreamChunk> {
    let mut parser = BodyParser::default();
    let mut out = VecDeque::new();
    let mut ended = false;
    for part in parts {
        if parser.feed(part, &mut out) {
            ended = true;
            break;
        }
    }
    if !ended {
        parser.end(&mut out);
    }
    let chunks = Vec::from(out);
    if let Err(e) = validate_stream(&chunks) {
        panic!("{e}: {chunks:#?}");
    }
    chunks
}

fn parse(body: &[u8]) -> Vec<StreamChunk> {
    parse_parts([body])
}

/// One chat-completion chunk event, shaped like OpenAI's.
fn event(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
        "model": "gpt-test", "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}],
    })
}

fn content(text: &str) -> Value {
    event(json!({"content": text}), None)
}

fn finish_event(reason: &str) -> Value {
    event(json!({}), Some(reason))
}

fn usage_event() -> Value {
    json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }})
}

fn usage() -> TokenUsage {
    TokenUsage {
        input_tokens: 12,
        output_tokens: 7,
        cache_read_tokens: Some(4),
        cache_write_tokens: None,
        reasoning_tokens: Some(2),
    }
}

fn tool_delta(index: u64, id: Option<&str>, name: Option<&str>, arguments: &str) -> Value {
    let mut call = json!({"index": index, "function": {"arguments": arguments}});
    if let Some(id) = id {
        call["id"] = json!(id);
        call["type"] = json!("function");
    }
    if let Some(name) = name {
        call["function"]["name"] = json!(name);
    }
    event(json!({"tool_calls": [call]}), None)
}

/// A `text` content part.
fn text_part(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// An event whose `delta.content` is an array of these parts.
fn parts(parts: &[Value]) -> Value {
    event(json!({ "content": parts }), None)
}

/// A body of `data:` events (`\n` line ends), with the `[DONE]` marker when `done`.
fn body(events: &[Value], done: bool) -> Vec<u8> {
    let mut out = String::new();
    for e in events {
        out.push_str(&format!("data: {e}\n\n"));
    }
    if done {
        out.push_str("data: [DONE]\n\n");
    }
    out.into_bytes()
}

/// The assembled blocks and the outcome (a finish kind, or an error's code) of a stream.
fn outcome(chunks: &[StreamChunk]) -> (Vec<ContentBlock>, String) {
    let blocks = chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::BlockEnd { block, .. } => Some(block.clone()),
            _ => None,
        })
        .collect();
    let end = match chunks.last() {
        Some(StreamChunk::Finish { reason, .. }) => match reason {
            FinishReason::Stop => "stop".to_owned(),
            FinishReason::ToolCalls => "tool-calls".to_owned(),
            FinishReason::MaxTokens => "max-tokens".to_owned(),
            FinishReason::Error { failure } | FinishReason::Aborted { failure } => failure.code.clone(),
            other => format!("{other:?}"),
        },
        other => panic!("no finish: {other:?}"),
    };
    (blocks, end)
}

/// A recorded stream and what it must parse to.
struct Recorded {
    name: &'static str,
    body: Vec<u8>,
    blocks: Vec<ContentBlock>,
    end: &'static str,
}

/// Valid streams covering text (with multi-byte UTF-8), reasoning, parallel tool calls with
/// argument deltas, usage and every finish reason.
fn recorded() -> Vec<Recorded> {
    vec![
        Recorded {
            name: "text",
            body: body(
                &[
                    event(json!({"role": "assistant", "content": ""}), None),
                    content("héllo "),
                    content("😀"),
                    content(" wörld ✓"),
                    finish_event("stop"),
                    usage_event(),
                ],
                true,
            ),
            blocks: vec![ContentBlock::text("héllo 😀 wörld ✓")],
            end: "stop",
        },
        Recorded {
            name: "reasoning",
            body: body(
                &[
                    event(
                        json!({"role": "assistant", "reasoning_content": "Let me think… "}),
                        None,
                    ),
                    event(json!({"reasoning_content": "🤔"}), None),
                    event(json!({"reasoning": " (alt field)"}), None),
                    content("42"),
                    finish_event("stop"),
                ],
                true,
            ),
            blocks: vec![
                ContentBlock::reasoning("Let me think… 🤔 (alt field)"),
                ContentBlock::text("42"),
            ],
            end: "stop",
        },
        Recorded {
            name: "tool calls",
            body: body(
                &[
                    content("Checking."),
                    tool_delta(0, Some("call_a"), Some("read"), ""),
                    tool_delta(0, None, None, "{\"pa"),
                    tool_delta(1, Some("call_b"), Some("list"), "{}"),
                    tool_delta(0, None, None, "th\":\"é😀\"}"),
                    finish_event("tool_calls"),
                    usage_event(),
                ],
                true,
            ),
            blocks: vec![
                ContentBlock::text("Checking."),
                ContentBlock::tool_call("call_a", "read", "{\"path\":\"é😀\"}"),
                ContentBlock::tool_call("call_b", "list", "{}"),
            ],
            end: "tool-calls",
        },
        Recorded {
            name: "length",
            body: body(&[content("trunc"), finish_event("length"), usage_event()], true),
            blocks: vec![ContentBlock::text("trunc")],
            end: "max-tokens",
        },
        Recorded {
            name: "content filter",
            body: body(&[content("no"), finish_event("content_filter")], true),
            blocks: vec![ContentBlock::text("no")],
            end: "CONTENT_FILTERED",
        },
        Recorded {
            name: "empty",
            body: body(
                &[event(json!({"role": "assistant"}), None), finish_event("stop")],
                true,
            ),
            blocks: vec![],
            end: "EMPTY_RESPONSE",
        },
        Recorded {
            name: "provider error mid-stream",
            body: body(
                &[
                    content("par"),
                    json!({"error": {"message": "overloaded", "code": "overloaded_error"}}),
                    content("never seen"),
                ],
                true,
            ),
            blocks: vec![],
            end: "OVERLOADED",
        },
        Recorded {
            name: "no [DONE] after the finish reason",
            body: body(&[content("ok"), finish_event("stop")], false),
            blocks: vec![ContentBlock::text("ok")],
            end: "stop",
        },
        Recorded {
            name: "content parts",
            body: body(
                &[
                    event(json!({"role": "assistant", "content": []}), None),
                    parts(&[text_part("héllo "), text_part("")]),
                    tool_delta(0, Some("call_a"), Some("read"), "{\"path\":"),
                    parts(&[text_part("😀"), text_part(" wörld")]),
                    event(json!({"content": null}), None),
                    tool_delta(0, None, None, "\"a\"}"),
                    content(" ✓"),
                    finish_event("tool_calls"),
                ],
                true,
            ),
            blocks: vec![
                ContentBlock::text("héllo 😀 wörld ✓"),
                ContentBlock::tool_call("call_a", "read", "{\"path\":\"a\"}"),
            ],
            end: "tool-calls",
        },
        Recorded {
            name: "interrupted",
            body: body(&[content("par")], false),
            blocks: vec![],
            end: "STREAM_INTERRUPTED",
        },
    ]
}

#[test]
fn recorded_streams_parse_to_their_outcomes() {
    for r in recorded() {
        assert_eq!(
            outcome(&parse(&r.body)),
            (r.blocks, r.end.to_owned()),
            "{}",
            r.name
        );
    }
    let text = parse(&recorded()[0].body);
    assert!(text.contains(&StreamChunk::Usage { usage: usage() }));
}

#[test]
fn every_two_part_split_parses_like_the_whole_body() {
    for r in recorded() {
        let whole = parse(&r.body);
        for at in 0..=r.body.len() {
            let (a, b) = r.body.split_at(at);
            assert_eq!(parse_parts([a, b]), whole, "{} split at byte {at}", r.name);
        }
    }
}

#[test]
fn one_byte_parts_parse_like_the_whole_body() {
    for r in recorded() {
        let whole = parse(&r.body);
        assert_eq!(parse_parts(r.body.chunks(1)), whole, "{}", r.name);
    }
}

/// Fixed seeds keep the generated cases the same on every run; nothing is persisted.
fn config(cases: u32, seed: u64) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: proptest::test_runner::RngSeed::Fixed(seed),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(256, 0x5EED_0001))]
    #[test]
    fn any_framing_parses_like_the_whole_body(
        which in 0..10usize,
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let r = &recorded()[which];
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(r.body.len() + 1)).collect();
        at.sort_unstable();
        let mut parts = Vec::new();
        let mut from = 0;
        for cut in at {
            parts.push(&r.body[from..cut]);
            from = cut;
        }
        parts.push(&r.body[from..]);
        prop_assert_eq!(parse_parts(parts), parse(&r.body));
    }
}

/// `body` with every `\n` line end rewritten to `end`.
fn with_line_ends(body: &[u8], end: &str) -> Vec<u8> {
    String::from_utf8(body.to_vec())
        .unwrap()
        .replace('\n', end)
        .into_bytes()
}

#[test]
fn crlf_and_bare_cr_line_ends_parse_like_lf_at_any_split() {
    for r in recorded() {
        let whole = parse(&r.body);
        for end in ["\r\n", "\r"] {
            let body = with_line_ends(&r.body, end);
            assert_eq!(parse(&body), whole, "{} with {end:?}", r.name);
            for at in 0..=body.len() {
                let (a, b) = body.split_at(at);
                assert_eq!(
                    parse_parts([a, b]),
                    whole,
                    "{} with {end:?} split at {at}",
                    r.name
                );
            }
        }
    }
    // Mixed line ends in one body, including a `\r` `\n` pair split across two reads.
    let plain = body(&[content("a"), content("b"), finish_event("stop")], true);
    let mixed = format!(
        "data: {}\r\n\rdata: {}\n\r\ndata: {}\r\r",
        content("a"),
        content("b"),
        finish_event("stop")
    ) + "data: [DONE]\r\n\r\n";
    let mixed = mixed.as_bytes();
    assert_eq!(parse(mixed), parse(&plain));
    let cr = mixed.iter().position(|&b| b == b'\r').unwrap();
    assert_eq!(parse_parts([&mixed[..=cr], &mixed[cr + 1..]]), parse(&plain));
}

#[test]
fn sse_syntax_variants_parse_like_the_plain_form() {
    let first = content("héllo ").to_string();
    let (head, tail) = first.split_at(first.find(",\"choices\"").unwrap() + 1);
    let variants = format!(
        concat!(
            ": keep-alive\n",
            ":\n",
            "\n",
            "retry: 3000\n",
            "id: 1\n",
            "event: message\n",
            // A data field split over two lines (joined with `\n`, JSON whitespace).
            "data: {head}\n",
            "data: {tail}\n",
            "\n",
            // No space after the colon; an unknown field; a bare `data` field (appends an
            // empty line); a comment inside the event.
            "data:{second}\n",
            "x-unknown: 1\n",
            "data\n",
            ": inside an event\n",
            "\n",
            "id\n",
            "event: message\n",
            "data:  {finish}\n",
            "\n",
            "data:[DONE]\n",
            "\n",
        ),
        head = head,
        tail = tail,
        second = content("😀"),
        finish = finish_event("stop"),
    );
    let plain = body(&[content("héllo "), content("😀"), finish_event("stop")], true);
    let whole = parse(&plain);
    assert_eq!(
        outcome(&whole),
        (vec![ContentBlock::text("héllo 😀")], "stop".to_owned())
    );
    assert_eq!(parse(variants.as_bytes()), whole);
    assert_eq!(parse_parts(variants.as_bytes().chunks(1)), whole);
}

#[test]
fn a_leading_byte_order_mark_is_skipped() {
    let plain = body(&[content("héllo"), finish_event("stop")], true);
    let whole = parse(&plain);
    assert_eq!(
        outcome(&whole),
        (vec![ContentBlock::text("héllo")], "stop".to_owned())
    );
    let mut with_bom = "\u{feff}".as_bytes().to_vec();
    with_bom.extend_from_slice(&plain);
    assert_eq!(parse(&with_bom), whole);
    // However the mark is framed.
    for at in 0..=4 {
        let (a, b) = with_bom.split_at(at);
        assert_eq!(parse_parts([a, b]), whole, "split at {at}");
    }
    assert_eq!(parse_parts(with_bom.chunks(1)), whole);
    // Only a leading mark is skipped: elsewhere it is part of a field name (an unknown field,
    // ignored as the SSE spec says), so the event it starts carries no data.
    let mut inner = body(&[content("a")], false);
    inner.extend_from_slice("\u{feff}".as_bytes());
    inner.extend_from_slice(&body(&[content("b"), finish_event("stop")], true));
    assert_eq!(outcome(&parse(&inner)).0, vec![ContentBlock::text("a")]);
}
/// The error code a stream failed with, if it did.
fn error_code(chunks: &[StreamChunk]) -> Option<String> {
    match chunks.last() {
        Some(StreamChunk::Finish {
            reason: FinishReason::Error { failure },
            ..
        }) => Some(failure.code.clone()),
        _ => None,
    }
}

/// The text deltas of a stream, joined.
fn streamed_text(chunks: &[StreamChunk]) -> String {
    chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::TextDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn invalid_utf8_in_an_event_is_a_bad_response_not_replacement_characters() {
    // A lone continuation byte, a truncated 4-byte sequence, an overlong `/`, a surrogate, 0xFF.
    for bad in [
        &b"\x80"[..],
        b"\xF0\x9F\x98",
        b"\xC0\xAF",
        b"\xED\xA0\x80",
        b"\xFF",
    ] {
        let mut raw = body(&[content("ok ")], false);
        raw.extend_from_slice(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a");
        raw.extend_from_slice(bad);
        raw.extend_from_slice(b"b\"}}]}\n\n");
        raw.extend_from_slice(&body(&[content("never"), finish_event("stop")], true));
        let chunks = parse(&raw);
        assert_eq!(
            error_code(&chunks).as_deref(),
            Some("BAD_RESPONSE"),
            "{bad:?}: {chunks:?}"
        );
        assert_eq!(streamed_text(&chunks), "ok ", "{bad:?}");
        for at in 0..=raw.len() {
            let (a, b) = raw.split_at(at);
            assert_eq!(parse_parts([a, b]), chunks, "{bad:?} split at {at}");
        }
    }
    // In a comment or an ignored field such bytes are harmless.
    let mut raw = b": \xFF\xFE keep-alive\nevent: \x80\n".to_vec();
    raw.extend_from_slice(&body(&[content("fine"), finish_event("stop")], true));
    assert_eq!(
        outcome(&parse(&raw)),
        (vec![ContentBlock::text("fine")], "stop".to_owned())
    );
}

/// The tool-call deltas of a stream, as `(index, id, name, arguments delta)`.
fn tool_deltas(chunks: &[StreamChunk]) -> Vec<(u32, String, Option<String>, String)> {
    chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::ToolCallDelta {
                index,
                id,
                name,
                arguments_delta,
            } => Some((
                *index,
                id.as_str().to_owned(),
                name.clone(),
                arguments_delta.clone(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn a_tool_name_repeated_in_every_delta_is_kept_once() {
    // Some servers (vLLM's harmony path, for one) repeat the id and name in every delta.
    let raw = body(
        &[
            tool_delta(0, Some("call_a"), Some("read"), "{\"pa"),
            tool_delta(0, Some("call_a"), Some("read"), "th\":1}"),
            finish_event("tool_calls"),
        ],
        true,
    );
    let chunks = parse(&raw);
    assert_eq!(
        outcome(&chunks),
        (
            vec![ContentBlock::tool_call("call_a", "read", "{\"path\":1}")],
            "tool-calls".to_owned()
        )
    );
    assert_eq!(
        tool_deltas(&chunks),
        [
            (
                0,
                "call_a".to_owned(),
                Some("read".to_owned()),
                "{\"pa".to_owned()
            ),
            (0, "call_a".to_owned(), None, "th\":1}".to_owned()),
        ]
    );
}

#[test]
fn a_tool_call_id_change_mid_call_keeps_the_first_id() {
    // Servers that mint a fresh id per delta exist (the index is what OpenAI's clients key
    // on); the call stays one call under its first id.
    let raw = body(
        &[
            tool_delta(0, Some("call_a"), Some("read"), "{\"a\":"),
            tool_delta(0, Some("call_z"), None, "1}"),
            finish_event("tool_calls"),
        ],
        true,
    );
    let chunks = parse(&raw);
    assert_eq!(
        outcome(&chunks).0,
        vec![ContentBlock::tool_call("call_a", "read", "{\"a\":1}")]
    );
    assert!(tool_deltas(&chunks).iter().all(|d| d.1 == "call_a"));
}

#[test]
fn tool_call_index_gaps_missing_ids_and_bad_arguments_are_passed_through() {
    let raw = body(
        &[
            tool_delta(3, Some("call_3"), Some("read"), "{\"path\":"),
            // No id: one is made up from the index.
            tool_delta(7, None, Some("list"), "not json"),
            tool_delta(3, None, None, "\"a\""),
            // Arguments cut off: not JSON at the end; the loop's tool pipeline rejects them.
            finish_event("tool_calls"),
        ],
        true,
    );
    let chunks = parse(&raw);
    assert_eq!(
        outcome(&chunks),
        (
            vec![
                ContentBlock::tool_call("call_3", "read", "{\"path\":\"a\""),
                ContentBlock::tool_call("call_7", "list", "not json"),
            ],
            "tool-calls".to_owned()
        )
    );
    // Block indexes follow first appearance, whatever the provider's indexes.
    assert_eq!(
        tool_deltas(&chunks).iter().map(|d| d.0).collect::<Vec<_>>(),
        [0, 1, 0]
    );
}

#[test]
fn events_of_unknown_shape_are_ignored() {
    let odd = [
        json!({"object": "something.new", "payload": [1, 2]}),
        json!({"choices": []}),
        json!({"choices": {}}),
        json!({"choices": null}),
        json!({"choices": [{"index": 1, "delta": {"content": "another choice"}}]}),
        json!({"choices": [{"index": 0}]}),
        json!({"choices": [{"index": 0, "delta": null}]}),
        json!({"choices": [{"index": 0, "delta": {"content": 42, "tool_calls": {}}}]}),
        json!({"error": null, "choices": [{"index": 0, "delta": {"content": "b"}}]}),
        json!({"usage": "lots"}),
        json!([]),
        json!(42),
        json!(null),
    ];
    let mut events = vec![content("a")];
    events.extend(odd.iter().cloned());
    events.push(finish_event("stop"));
    let chunks = parse(&body(&events, true));
    let (blocks, end) = outcome(&chunks);
    assert_eq!(end, "stop");
    assert_eq!(blocks[0], ContentBlock::text("ab"));
    assert!(!chunks.iter().any(|c| matches!(c, StreamChunk::Usage { .. })));
}

#[test]
fn tool_call_entries_without_a_call_in_them_open_no_call() {
    // Not objects, or objects with no id, no name and no arguments: nothing to call.
    let raw = body(
        &[
            content("a"),
            event(
                json!({"tool_calls": [17, "x", null, {"function": null}, {"index": 4, "type": "function"}]}),
                None,
            ),
            event(
                json!({"tool_calls": [{"index": 5, "function": {"arguments": ""}}]}),
                None,
            ),
            finish_event("stop"),
        ],
        true,
    );
    let chunks = parse(&raw);
    assert_eq!(
        outcome(&chunks),
        (vec![ContentBlock::text("a")], "stop".to_owned())
    );
}

#[test]
fn truncated_or_unparsable_events_are_bad_responses() {
    let good = content("kept").to_string();
    for bad in [
        &good[..good.len() - 1],
        &good[..good.len() / 2],
        "{",
        "[DONE",
        "{\"choices\": [] } trailing",
    ] {
        let raw = format!(
            "data: {good}\n\ndata: {bad}\n\ndata: {}\n\ndata: [DONE]\n\n",
            content("never")
        );
        let chunks = parse(raw.as_bytes());
        assert_eq!(error_code(&chunks).as_deref(), Some("BAD_RESPONSE"), "{bad:?}");
        assert_eq!(streamed_text(&chunks), "kept", "{bad:?}");
    }
}

#[test]
fn a_body_that_ends_early_is_interrupted() {
    let text = content("par").to_string();
    // Between events, before any finish reason: no finish reason, no `[DONE]`.
    let between = format!("data: {text}\n\n");
    // Mid-event: the last line cut inside the JSON, or inside the field name, or complete but
    // without the blank line that ends the event.
    let mid_json = format!("data: {text}\n\ndata: {}", &text[..20]);
    let mid_name = format!("data: {text}\n\nda");
    let unterminated = format!("data: {text}\n\ndata: {text}");
    for (raw, code, streamed) in [
        (between, "STREAM_INTERRUPTED", "par"),
        (mid_json, "BAD_RESPONSE", "par"),
        (mid_name, "STREAM_INTERRUPTED", "par"),
        (unterminated, "STREAM_INTERRUPTED", "parpar"),
    ] {
        let chunks = parse(raw.as_bytes());
        assert_eq!(error_code(&chunks).as_deref(), Some(code), "{raw}");
        assert_eq!(streamed_text(&chunks), streamed, "{raw}");
    }
    // After the finish reason the reply is complete; only the usage that follows it is lost.
    let raw = body(&[content("done"), finish_event("stop"), usage_event()], true);
    let cut = String::from_utf8(raw.clone())
        .unwrap()
        .find("data: {\"id\":\"chatcmpl-9\",\"object\":\"chat.completion.chunk\",\"choices\":[]")
        .unwrap();
    let chunks = parse(&raw[..cut]);
    assert_eq!(
        outcome(&chunks),
        (vec![ContentBlock::text("done")], "stop".to_owned())
    );
    assert!(!chunks.iter().any(|c| matches!(c, StreamChunk::Usage { .. })));
}

#[test]
fn a_huge_single_line_arrives_whole() {
    let big: String = "é😀x".repeat(600_000);
    let raw = body(&[content(&big), finish_event("stop")], true);
    assert!(raw.len() > 4 << 20);
    let whole = parse(&raw);
    assert_eq!(
        outcome(&whole),
        (vec![ContentBlock::text(big.clone())], "stop".to_owned())
    );
    assert_eq!(parse_parts(raw.chunks(65_521)), whole);
}

/// Every chunk of `chunks` but the `usage`.
fn without_usage(chunks: &[StreamChunk]) -> Vec<StreamChunk> {
    chunks
        .iter()
        .filter(|c| !matches!(c, StreamChunk::Usage { .. }))
        .cloned()
        .collect()
}

#[test]
fn every_truncation_is_the_whole_reply_or_a_typed_failure() {
    for r in recorded() {
        let whole = parse(&r.body);
        for at in 0..r.body.len() {
            let cut = parse(&r.body[..at]);
            let (last, before) = cut.split_last().unwrap();
            let failed = matches!(
                last,
                StreamChunk::Finish { reason: FinishReason::Error { failure }, .. }
                    if ["STREAM_INTERRUPTED", "BAD_RESPONSE"].contains(&failure.code.as_str())
            );
            assert!(
                cut == whole
                    // Cut after the finish reason: complete but for the usage that follows it.
                    || without_usage(&cut) == without_usage(&whole)
                    // A failure after some of the reply's own chunks.
                    || (failed && whole.starts_with(before)),
                "{} cut at {at}: {cut:#?}\nwhole: {whole:#?}",
                r.name
            );
        }
    }
}

/// One kind of damage to a body.
#[derive(Clone, Debug)]
enum Damage {
    /// Replace the byte at this position.
    Replace(prop::sample::Index, u8),
    /// Insert a byte before this position.
    Insert(prop::sample::Index, u8),
    /// Delete up to this many bytes from this position.
    Delete(prop::sample::Index, usize),
    /// Repeat up to this many bytes from this position.
    Repeat(prop::sample::Index, usize),
}

fn damage() -> impl Strategy<Value = Damage> {
    // Bytes that matter to the framing or to JSON, and any byte.
    let byte = prop_oneof![
        prop::sample::select(b"\n\r:{}[]\",\\ 0a".to_vec()),
        prop::sample::select(vec![0x80u8, 0xC3, 0xE2, 0xF0, 0xFF, 0xEF, 0xBB, 0xBF]),
        any::<u8>(),
    ];
    prop_oneof![
        (any::<prop::sample::Index>(), byte.clone()).prop_map(|(i, b)| Damage::Replace(i, b)),
        (any::<prop::sample::Index>(), byte).prop_map(|(i, b)| Damage::Insert(i, b)),
        (any::<prop::sample::Index>(), 1..64usize).prop_map(|(i, n)| Damage::Delete(i, n)),
        (any::<prop::sample::Index>(), 1..64usize).prop_map(|(i, n)| Damage::Repeat(i, n)),
    ]
}

fn apply(body: &mut Vec<u8>, damage: &Damage) {
    match damage {
        Damage::Replace(i, b) if !body.is_empty() => {
            let i = i.index(body.len());
            body[i] = *b;
        }
        Damage::Insert(i, b) => body.insert(i.index(body.len() + 1), *b),
        Damage::Delete(i, n) if !body.is_empty() => {
            let i = i.index(body.len());
            body.drain(i..(i + n).min(body.len()));
        }
        Damage::Repeat(i, n) if !body.is_empty() => {
            let i = i.index(body.len());
            let piece = body[i..(i + n).min(body.len())].to_vec();
            body.splice(i..i, piece);
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(config(1024, 0x5EED_0002))]
    /// Damaged bodies (however framed) never panic or hang, and always parse to a grammatical
    /// stream (checked by `parse_parts`) that ends with a finish.
    #[test]
    fn damaged_bodies_parse_to_grammatical_streams(
        which in 0..10usize,
        damages in proptest::collection::vec(damage(), 1..6),
        truncate in proptest::option::of(any::<prop::sample::Index>()),
        part in 1..300usize,
    ) {
        let mut raw = recorded()[which].body.clone();
        for d in &damages {
            apply(&mut raw, d);
        }
        if let Some(t) = truncate {
            raw.truncate(t.index(raw.len() + 1));
        }
        let whole = parse(&raw);
        let ends_with_finish = matches!(whole.last(), Some(StreamChunk::Finish { .. }));
        prop_assert!(ends_with_finish, "no finish: {:?}", whole);
        prop_assert_eq!(parse_parts(raw.chunks(part)), whole);
    }
}

#[test]
fn an_endless_line_fails_once_it_outgrows_the_event_limit() {
    use super::sse::MAX_EVENT_BYTES;
    let mut parser = BodyParser::default();
    let mut out = VecDeque::new();
    assert!(!parser.feed(&body(&[content("a")], false), &mut out));
    assert!(!parser.feed(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"",
        &mut out
    ));
    // A server that never ends the line: the parse stops as soon as the event is too large,
    // without waiting for the body to end.
    let piece = vec![b'x'; 1 << 20];
    let mut fed = 0;
    let ended = loop {
        if parser.feed(&piece, &mut out) {
            break true;
        }
        fed += piece.len();
        if fed > 2 * MAX_EVENT_BYTES {
            break false;
        }
    };
    assert!(ended, "still buffering after {fed} bytes");
    assert!(fed <= MAX_EVENT_BYTES, "{fed}");
    let chunks = Vec::from(out);
    validate_stream(&chunks).unwrap();
    assert_eq!(error_code(&chunks).as_deref(), Some("BAD_RESPONSE"));
    assert_eq!(streamed_text(&chunks), "a");
}

#[test]
fn provider_error_events_of_any_shape_are_typed_failures() {
    for (error, code, message) in [
        (
            json!({"message": "slow down", "code": "rate_limit_exceeded"}),
            "RATE_LIMITED",
            "slow down (provider code: rate_limit_exceeded)",
        ),
        (
            json!({"message": "oops", "type": "server_error", "code": 500}),
            "SERVER_ERROR",
            "oops (provider code: 500)",
        ),
        (json!({"message": "no code"}), "PROVIDER_ERROR", "no code"),
        (json!("plain words"), "PROVIDER_ERROR", "plain words"),
        (json!({"detail": 1}), "PROVIDER_ERROR", "{\"detail\":1}"),
    ] {
        let raw = body(&[content("a"), json!({ "error": error })], true);
        let chunks = parse(&raw);
        match chunks.last() {
            Some(StreamChunk::Finish {
                reason: FinishReason::Error { failure },
                ..
            }) => assert_eq!((failure.code.as_str(), failure.message.as_str()), (code, message)),
            other => panic!("{other:?}"),
        }
    }
}

/// A well-known provider error code (or type) in the stream gets the code the same condition
/// gets as an HTTP status (`rate_limit_exceeded` → `RATE_LIMITED`, as a 429), so a retry policy
/// keyed on codes treats both alike; the provider's own code stays in the message. Unknown
/// codes are kept upper-cased, and `insufficient_quota` (not cleared by waiting) is not made a
/// retryable `RATE_LIMITED`. A `code` that is an HTTP error status — Azure OpenAI's `"429"`,
/// vLLM's numeric `503` — gets that status's code from the HTTP path's table; a number that is
/// no error status (`200`, `42`) names no code, as before.
#[test]
fn well_known_provider_error_codes_become_the_http_paths_codes() {
    let cases: &[(Value, &str, &str)] = &[
        (
            json!({"code": "rate_limit_exceeded", "type": "requests"}),
            "RATE_LIMITED",
            " (provider code: rate_limit_exceeded)",
        ),
        (
            json!({"type": "rate_limit_error"}),
            "RATE_LIMITED",
            " (provider code: rate_limit_error)",
        ),
        (
            json!({"code": "too_many_requests"}),
            "RATE_LIMITED",
            " (provider code: too_many_requests)",
        ),
        (
            json!({"type": "overloaded_error"}),
            "OVERLOADED",
            " (provider code: overloaded_error)",
        ),
        (json!({"code": "overloaded"}), "OVERLOADED", ""),
        (json!({"type": "server_error", "code": null}), "SERVER_ERROR", ""),
        (
            json!({"code": "internal_server_error"}),
            "SERVER_ERROR",
            " (provider code: internal_server_error)",
        ),
        (
            json!({"code": "service_unavailable"}),
            "UNAVAILABLE",
            " (provider code: service_unavailable)",
        ),
        (
            json!({"type": "authentication_error"}),
            "AUTHENTICATION",
            " (provider code: authentication_error)",
        ),
        (
            json!({"code": "invalid_api_key", "type": "invalid_request_error"}),
            "AUTHENTICATION",
            " (provider code: invalid_api_key)",
        ),
        (
            json!({"type": "permission_error"}),
            "PERMISSION_DENIED",
            " (provider code: permission_error)",
        ),
        (
            json!({"code": "context_length_exceeded", "type": "invalid_request_error"}),
            "BAD_REQUEST",
            " (provider code: context_length_exceeded)",
        ),
        (
            json!({"code": "string_above_max_length"}),
            "BAD_REQUEST",
            " (provider code: string_above_max_length)",
        ),
        (
            json!({"code": "Rate_Limit_Exceeded"}),
            "RATE_LIMITED",
            " (provider code: Rate_Limit_Exceeded)",
        ),
        (
            json!({"code": "insufficient_quota", "type": "insufficient_quota"}),
            "INSUFFICIENT_QUOTA",
            "",
        ),
        (json!({"code": "model_not_found"}), "MODEL_NOT_FOUND", ""),
        (
            json!({"type": "invalid_request_error"}),
            "INVALID_REQUEST_ERROR",
            "",
        ),
        // Azure OpenAI's status-like string codes: the HTTP path's code for that status.
        (json!({"code": "429"}), "RATE_LIMITED", " (provider code: 429)"),
        (json!({"code": "503"}), "UNAVAILABLE", " (provider code: 503)"),
        (
            json!({"code": "500", "type": "server_error"}),
            "SERVER_ERROR",
            " (provider code: 500)",
        ),
        (json!({"code": "418"}), "HTTP_418", " (provider code: 418)"),
        // vLLM's numeric codes, ahead of its `type`.
        (
            json!({"code": 503, "type": "ServiceUnavailableError"}),
            "UNAVAILABLE",
            " (provider code: 503)",
        ),
        (
            json!({"code": 400, "type": "BadRequestError"}),
            "BAD_REQUEST",
            " (provider code: 400)",
        ),
        (json!({"code": 504}), "TIMEOUT", " (provider code: 504)"),
        // A number that is no HTTP error status stays as before.
        (json!({"code": 200, "type": "server_error"}), "SERVER_ERROR", ""),
        (json!({"code": 42}), "PROVIDER_ERROR", ""),
        (json!({"code": "200"}), "200", ""),
        (json!({"code": "4290"}), "4290", ""),
    ];
    for (error, code, suffix) in cases {
        let mut error = error.clone();
        error["message"] = json!("the provider's words");
        let expected = format!("the provider's words{suffix}");
        // As an `{"error": …}` member, as a top-level error event, and as an `event: error`.
        let lead = String::from_utf8(body(&[content("a")], false)).unwrap();
        for raw in [
            body(&[content("a"), json!({ "error": error })], true),
            format!("{lead}data: {error}\n\n").into_bytes(),
            format!("{lead}event: error\ndata: {error}\n\n").into_bytes(),
        ] {
            let chunks = parse(&raw);
            let failure = failure_of(&chunks);
            assert_eq!(
                (failure.code.as_str(), failure.message.as_str()),
                (*code, expected.as_str()),
                "{error}"
            );
        }
    }
    // A message at the cap keeps the provider's code visible and the whole within the cap.
    let long = "é".repeat(super::MESSAGE_CAP);
    let raw = body(
        &[
            content("a"),
            json!({"error": {"message": long, "code": "rate_limit_exceeded"}}),
        ],
        true,
    );
    let chunks = parse(&raw);
    let failure = failure_of(&chunks);
    assert_eq!(failure.code, "RATE_LIMITED");
    assert!(
        failure.message.len() <= super::MESSAGE_CAP,
        "{}",
        failure.message.len()
    );
    assert!(failure.message.starts_with("éé"));
    assert!(
        failure
            .message
            .ends_with("é (provider code: rate_limit_exceeded)"),
        "{}",
        failure.message
    );
}

/// An event with no data (`data:` alone, or only blanks, as some servers send to keep a
/// connection alive) carries nothing: it is skipped wherever it appears, not a `BAD_RESPONSE`.
#[test]
fn events_without_data_are_keep_alives() {
    let plain = body(&[content("hello"), finish_event("stop")], true);
    let expected = parse(&plain);
    for keep_alive in ["data:\n\n", "data: \n\n", "data:  \r\n\r\n", "data:\ndata:\n\n"] {
        let mut with = keep_alive.as_bytes().to_vec();
        with.extend_from_slice(&body(&[content("hello")], false));
        with.extend_from_slice(keep_alive.as_bytes());
        with.extend_from_slice(&body(&[finish_event("stop")], true));
        assert_eq!(parse(&with), expected, "{keep_alive:?}");
    }
}

/// `delta.content` as an array of parts streams exactly like the same text sent as strings:
/// the `text` parts in order, within an event and across events, empty parts and `null`
/// content adding nothing.
#[test]
fn text_content_parts_stream_like_string_content() {
    let as_strings = parse(&body(
        &[
            content("Hel"),
            content("lo"),
            content(", "),
            content("wörld"),
            finish_event("stop"),
        ],
        true,
    ));
    let as_parts = parse(&body(
        &[
            parts(&[text_part("Hel"), text_part("lo")]),
            event(json!({"content": null}), None),
            parts(&[]),
            parts(&[text_part(""), text_part(", ")]),
            parts(&[text_part("wörld")]),
            finish_event("stop"),
        ],
        true,
    ));
    assert_eq!(as_parts, as_strings);
    assert_eq!(
        outcome(&as_parts),
        (vec![ContentBlock::text("Hello, wörld")], "stop".to_owned())
    );
}

/// A refusal, as a `refusal` content part or as `delta.refusal`, is the model's answer: it is
/// streamed as text (in order with the other parts), not dropped as an empty response.
#[test]
fn refusals_are_streamed_as_text() {
    let refusal = |text: &str| json!({"type": "refusal", "refusal": text});
    let expected = (
        vec![ContentBlock::text("I'm sorry, I can't help with that.")],
        "stop".to_owned(),
    );
    for events in [
        vec![
            parts(&[refusal("I'm sorry, ")]),
            parts(&[refusal("I can't help with that.")]),
        ],
        vec![
            event(json!({"content": null, "refusal": "I'm sorry, "}), None),
            event(json!({"refusal": "I can't help with that."}), None),
        ],
        vec![parts(&[
            text_part("I'm sorry, "),
            refusal("I can't help with that."),
        ])],
    ] {
        let mut events = events;
        events.push(event(json!({"content": null, "refusal": null}), None));
        events.push(finish_event("stop"));
        let chunks = parse(&body(&events, true));
        assert_eq!(outcome(&chunks), expected, "{events:?}");
        assert_eq!(
            streamed_text(&chunks),
            expected.0[0].as_text().unwrap(),
            "{events:?}"
        );
    }
}

/// A content part the adapter cannot represent, or one without its string field, ends the
/// stream with a `BAD_RESPONSE` naming the part (after what was streamed before it; nothing
/// of its own event is streamed).
#[test]
fn unknown_or_malformed_content_parts_are_bad_responses() {
    let cases = [
        (
            json!({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}),
            "of type `image_url`, which this adapter cannot represent",
        ),
        (json!({"type": "audio", "text": "x"}), "of type `audio`"),
        (json!({"type": "text"}), "of type `text` without a string `text`"),
        (json!({"type": "text", "text": null}), "without a string `text`"),
        (json!({"type": "text", "text": 42}), "without a string `text`: {"),
        (
            json!({"type": "refusal", "text": "no"}),
            "without a string `refusal`",
        ),
        (json!({"text": "untyped"}), "without a string `type`"),
        (json!({"type": 7, "text": "x"}), "without a string `type`"),
        (json!("bare string"), "that is not an object: \"bare string\""),
        (json!(null), "that is not an object: null"),
    ];
    for (part, message) in cases {
        let raw = body(
            &[
                content("kept"),
                parts(&[text_part(" lost"), part.clone()]),
                content("never"),
                finish_event("stop"),
            ],
            true,
        );
        let chunks = parse(&raw);
        let Some(StreamChunk::Finish {
            reason: FinishReason::Error { failure },
            ..
        }) = chunks.last()
        else {
            panic!("{part}: {chunks:?}");
        };
        assert_eq!(failure.code, "BAD_RESPONSE", "{part}");
        assert!(
            failure.message.contains("`delta.content[1]`") && failure.message.contains(message),
            "{part}: {}",
            failure.message
        );
        assert_eq!(streamed_text(&chunks), "kept", "{part}");
    }
    // A huge part is quoted only in part.
    let huge = json!({"type": "text", "text": ["x".repeat(100_000)]});
    let chunks = parse(&body(&[parts(&[huge])], true));
    let Some(StreamChunk::Finish {
        reason: FinishReason::Error { failure },
        ..
    }) = chunks.last()
    else {
        panic!("{chunks:?}");
    };
    assert!(failure.message.len() < 400, "{}", failure.message);
}

/// One `delta.tool_calls` entry without an `index`, as Gemini's OpenAI-compatible endpoint
/// sends them.
fn unindexed_call(id: Option<&str>, name: Option<&str>, arguments: &str) -> Value {
    let mut call = json!({"type": "function", "function": {"arguments": arguments}});
    if let Some(id) = id {
        call["id"] = json!(id);
    }
    if let Some(name) = name {
        call["function"]["name"] = json!(name);
    }
    call
}

/// Parallel calls sent without `index` (each in an event of its own, all at array position 0,
/// each with its own id, as Gemini's endpoint does) stay separate calls, with their own ids,
/// names and arguments, instead of being merged into one call whose arguments are the others'
/// glued together. Arguments continued without an id (or with the same id) still join their
/// call, and id-less entries at different positions of one array are still different calls.
#[test]
fn parallel_tool_calls_without_an_index_stay_separate() {
    let calls = |entries: Vec<Value>| event(json!({ "tool_calls": entries }), None);
    let raw = body(
        &[
            calls(vec![unindexed_call(Some("fc-1"), Some("weather"), "{\"city\":")]),
            calls(vec![unindexed_call(None, None, "\"Oslo\"}")]),
            calls(vec![unindexed_call(Some("fc-2"), Some("time"), "{\"tz\":")]),
            calls(vec![unindexed_call(Some("fc-2"), None, "\"UTC\"}")]),
            finish_event("stop"),
        ],
        true,
    );
    assert_eq!(
        outcome(&parse(&raw)),
        (
            vec![
                ContentBlock::tool_call("fc-1", "weather", "{\"city\":\"Oslo\"}"),
                ContentBlock::tool_call("fc-2", "time", "{\"tz\":\"UTC\"}"),
            ],
            "tool-calls".to_owned()
        )
    );
    let raw = body(
        &[
            calls(vec![
                unindexed_call(None, Some("a"), "1"),
                unindexed_call(None, Some("b"), "2"),
            ]),
            calls(vec![unindexed_call(None, None, "0")]),
            finish_event("stop"),
        ],
        true,
    );
    assert_eq!(
        outcome(&parse(&raw)),
        (
            vec![
                ContentBlock::tool_call("call_0", "a", "10"),
                ContentBlock::tool_call("call_1", "b", "2"),
            ],
            "tool-calls".to_owned()
        )
    );
}

/// A stream of many calls without an `index` — each opened by its own id in an event of its
/// own, or by id-less entries at distinct positions of one array — assembles each one as its
/// own call. (Finding an entry's call used to search every call opened before it, so a hostile
/// provider's single 16 MiB event of such entries kept the parser busy for minutes; the lookup
/// is constant-time now. Timing is not asserted here — callgrind showed the cost doubling, not
/// quadrupling, with the count — this test pins the assembly those lookups must keep.)
#[test]
fn many_calls_without_an_index_assemble_separately() {
    const CALLS: usize = 2_000;
    let calls = |entries: Vec<Value>| event(json!({ "tool_calls": entries }), None);
    let mut events: Vec<Value> = (0..CALLS)
        .map(|i| calls(vec![unindexed_call(Some(&format!("fc-{i}")), Some("f"), "{}")]))
        .collect();
    events.push(calls(
        (0..CALLS)
            .map(|_| unindexed_call(None, Some("g"), "[]"))
            .collect(),
    ));
    events.push(finish_event("stop"));
    let (blocks, finish) = outcome(&parse(&body(&events, true)));
    assert_eq!(finish, "tool-calls");
    // The id-less entry at position 0 continues the latest call opened there (the last one
    // with an id); every other position opens a call of its own.
    assert_eq!(blocks.len(), 2 * CALLS - 1);
    let last = CALLS - 1;
    let expected = (0..last)
        .map(|i| ContentBlock::tool_call(format!("fc-{i}").as_str(), "f", "{}"))
        .chain([ContentBlock::tool_call(
            format!("fc-{last}").as_str(),
            "f",
            "{}[]",
        )])
        .chain((1..CALLS).map(|i| ContentBlock::tool_call(format!("call_{i}").as_str(), "g", "[]")));
    assert!(blocks.into_iter().eq(expected));
}

/// A response that streamed nothing at all is `EMPTY_RESPONSE` (retryable) whatever finish
/// reason it claims: a `tool_calls` finish with no call (nor any text) is not a completed
/// turn with an empty answer.
/// spec: §13.3 (empty completion)
#[test]
fn an_empty_response_claiming_tool_calls_is_empty() {
    for reason in ["tool_calls", "function_call", "stop", "something_new"] {
        let raw = body(
            &[
                event(json!({"role": "assistant", "content": ""}), None),
                finish_event(reason),
            ],
            true,
        );
        assert_eq!(
            outcome(&parse(&raw)),
            (vec![], "EMPTY_RESPONSE".to_owned()),
            "{reason}"
        );
    }
    // A `tool_calls` finish after text alone is still a finish, not a failure.
    let raw = body(&[content("hi"), finish_event("tool_calls")], true);
    assert_eq!(
        outcome(&parse(&raw)),
        (vec![ContentBlock::text("hi")], "tool-calls".to_owned())
    );
}

/// A `null` (or empty) `reasoning_content` next to a `reasoning` string does not hide it.
#[test]
fn a_null_reasoning_content_does_not_hide_reasoning() {
    let raw = body(
        &[
            event(json!({"reasoning_content": null, "reasoning": "thi"}), None),
            event(json!({"reasoning_content": "", "reasoning": "nk"}), None),
            event(json!({"reasoning_content": null, "content": "ok"}), None),
            finish_event("stop"),
        ],
        true,
    );
    assert_eq!(
        outcome(&parse(&raw)),
        (
            vec![ContentBlock::reasoning("think"), ContentBlock::text("ok")],
            "stop".to_owned()
        )
    );
}

/// The failure a stream ended with.
fn failure_of(chunks: &[StreamChunk]) -> &agent::LlmFailure {
    match chunks.last() {
        Some(StreamChunk::Finish {
            reason: FinishReason::Error { failure },
            ..
        }) => failure,
        other => panic!("no error finish: {other:?}"),
    }
}

/// Errors sent without an `error` member, as `event: error` events (whatever their data) or
/// as a top-level `{"message", "code"}` object, end the stream with the provider's message
/// and code (after what was streamed before), instead of being ignored until the stream ends
/// `STREAM_INTERRUPTED` with the provider's words lost.
#[test]
fn error_events_without_an_error_member_carry_the_providers_message() {
    let lead = String::from_utf8(body(&[content("a")], false)).unwrap();
    let after = String::from_utf8(body(&[content("never"), finish_event("stop")], true)).unwrap();
    for (event, code, message) in [
        (
            "event: error\ndata: {\"message\": \"Model is overloaded\", \"code\": \"overloaded\"}\n\n",
            "OVERLOADED",
            "Model is overloaded",
        ),
        (
            "event: error\ndata: {\"message\": \"boom\"}\n\n",
            "PROVIDER_ERROR",
            "boom",
        ),
        (
            "event: error\ndata: {\"type\": \"error\", \"message\": \"bad\"}\n\n",
            "PROVIDER_ERROR",
            "bad",
        ),
        (
            "event: error\ndata: Internal error\n\n",
            "PROVIDER_ERROR",
            "Internal error",
        ),
        (
            "event: error\ndata: {\"error\": {\"message\": \"nested\", \"code\": \"x_y\"}}\n\n",
            "X_Y",
            "nested",
        ),
        (
            "event: error\ndata: {\"detail\": 1}\n\n",
            "PROVIDER_ERROR",
            "{\"detail\":1}",
        ),
        (
            "data: {\"message\": \"slow down\", \"code\": \"rate_limit_exceeded\"}\n\n",
            "RATE_LIMITED",
            "slow down (provider code: rate_limit_exceeded)",
        ),
        (
            "data: {\"object\": \"error\", \"message\": \"too long\", \"type\": \
             \"invalid_request_error\", \"param\": null, \"code\": 400}\n\n",
            "BAD_REQUEST",
            "too long (provider code: 400)",
        ),
        (
            "data: {\"object\": \"error\", \"message\": \"no type\", \"code\": 500}\n\n",
            "SERVER_ERROR",
            "no type (provider code: 500)",
        ),
    ] {
        let raw = format!("{lead}{event}{after}");
        let chunks = parse(raw.as_bytes());
        let failure = failure_of(&chunks);
        assert_eq!(
            (failure.code.as_str(), failure.message.as_str()),
            (code, message),
            "{event:?}"
        );
        assert_eq!(streamed_text(&chunks), "a", "{event:?}");
        // However the body is framed.
        assert_eq!(parse_parts(raw.as_bytes().chunks(1)), chunks, "{event:?}");
    }
    // An `event: error` without data dispatches nothing, and its type does not carry over to
    // the next event; nor does a top-level `message` alone make an error.
    let raw = format!(
        "{lead}event: error\n\ndata: {{\"message\": \"status\"}}\n\n{}",
        String::from_utf8(body(&[content("b"), finish_event("stop")], true)).unwrap()
    );
    assert_eq!(
        outcome(&parse(raw.as_bytes())),
        (vec![ContentBlock::text("ab")], "stop".to_owned())
    );
}

/// A `BAD_RESPONSE` for an event that is not JSON quotes what the server sent, bounded and
/// with control characters escaped, so `data: Internal error` is understandable.
#[test]
fn a_non_json_event_is_quoted_in_its_bad_response() {
    let lead = String::from_utf8(body(&[content("a")], false)).unwrap();
    let chunks = parse(format!("{lead}data: Internal error\n\n").as_bytes());
    let failure = failure_of(&chunks);
    assert_eq!(failure.code, "BAD_RESPONSE");
    assert!(
        failure
            .message
            .starts_with("the provider sent an event that is not JSON (")
            && failure.message.ends_with("): `Internal error`"),
        "{}",
        failure.message
    );
    assert_eq!(streamed_text(&chunks), "a");

    // Control characters (a data field over two lines is joined with `\n`) are escaped.
    let chunks = parse(format!("{lead}data: oops\u{1b}[31m\tred\ndata: more\u{7}\n\n").as_bytes());
    let message = &failure_of(&chunks).message;
    assert!(
        message.ends_with(r"`oops\u{1b}[31m\tred\nmore\u{7}`"),
        "{message}"
    );
    assert!(!message.chars().any(char::is_control), "{message:?}");

    // A huge event is quoted in part only, whatever its characters.
    for unit in ["x", "é", "\u{1}"] {
        let huge = unit.repeat(100_000);
        let chunks = parse(format!("{lead}data: {huge}\n\n").as_bytes());
        let failure = failure_of(&chunks);
        assert_eq!(failure.code, "BAD_RESPONSE");
        let quoted = failure.message.split_once('`').unwrap().1;
        assert!(quoted.ends_with("…`"), "{quoted}");
        assert!(
            quoted.len() <= crate::excerpt::EXCERPT_CAP + "…`".len(),
            "{}",
            quoted.len()
        );
    }
}
