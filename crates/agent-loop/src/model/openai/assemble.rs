//! Mapping chat-completion stream events onto the spine's chunk grammar.
//!
//! | OpenAI stream | our chunks |
//! |---|---|
//! | first `delta.content` | `block-start {text}` then `text-delta` (later ones: `text-delta`) |
//! | `delta.content` as an array of parts | each `text` part's `text` (and each `refusal` part's `refusal`), in order, exactly as if sent as a string `content`; any other part, or a part without its string field, is `BAD_RESPONSE` |
//! | `delta.refusal` (the model declining) | text, exactly as if sent as `content` (after it when both come in one delta) |
//! | `delta.reasoning_content` / `delta.reasoning` (the first that is a non-empty string) | a `reasoning` block, like a string `delta.content` |
//! | `delta.tool_calls[i]` (keyed by `index`) | one `tool-call` block per index: `block-start`, then `tool-call-delta {id, name?, argumentsDelta}` |
//! | an event of another shape (no `choices`, only other choices, a `delta` field of another type, such as a numeric `content`) | nothing: ignored |
//! | `usage` | one `usage` (`prompt_tokens`, `completion_tokens`, cached and reasoning details) |
//! | `finish_reason` | remembered; at `[DONE]` (or the end of the body) every open block is closed in index order with its assembled block, then `usage`, then `finish` |
//! | `{"error": …}` event, or an event without `choices` that is itself the error (a string `message` next to a `code`, a string `type` or `"object": "error"`) | `finish {error}` (open blocks allowed) with the error's `message` and its string `code` (else string `type`) — an HTTP error status as a `code` (a number or a 3-digit string, 400–599: `"429"`, `503`) as that status's code over HTTP ([`status_code`]: `429` → `RATE_LIMITED`), a well-known one as the adapter's canonical code ([`canonical_code`]: `rate_limit_exceeded` → `RATE_LIMITED`, as for an HTTP 429), with ` (provider code: <original>)` appended to the message; any other upper-cased — else `PROVIDER_ERROR` |
//! | an `event: error` event ([`on_error_event`](Assembler::on_error_event)) | the same, whatever its data: the error it carries, else its JSON as the error, else its text as the message |
//! | an event that is not JSON | `BAD_RESPONSE` quoting its first 200 bytes, control characters escaped |
//!
//! A refusal is what the model said (its finish reason is still `stop`), and the spine has no
//! finish of its own for it: it is kept as the response's text, not dropped (which would leave
//! an `EMPTY_RESPONSE`) nor turned into a failure a caller might retry.
//!
//! Finish reasons: `stop` → `stop` (`tool-calls` when calls were streamed),
//! `tool_calls`/`function_call` → `tool-calls`, `length` → `max-tokens`, `content_filter` →
//! `error` with code `CONTENT_FILTERED`, anything else is treated like `stop`; but `stop`,
//! `tool_calls` or any other reason with nothing at all streamed is an `error` with code
//! `EMPTY_RESPONSE`. A body that ends before any finish reason or `[DONE]` is an `error`
//! with code `STREAM_INTERRUPTED`.
//!
//! A tool call is keyed by its `index` alone: its id and name are the first ones sent (an id
//! changing mid-call does not split it; a name repeated in every delta is not concatenated),
//! a call that never sent an id gets `call_<index>`, and its arguments are passed on as sent,
//! JSON or not (the loop's tool pipeline judges them). `tool_calls` entries that are not
//! objects, or that open no call and carry nothing, are ignored.
//!
//! Entries without an `index` (Gemini's OpenAI-compatible endpoint sends none, each parallel
//! call in an event of its own, all at array position 0) are told apart by id: an id seen
//! before continues its call, a new id opens a new call, and an entry without an id continues
//! the latest such call at its position in the array (or opens one, with id `call_<position>`).

use std::collections::{BTreeMap, HashMap};

use agent::model::BlockType;
use agent::{CallId, ContentBlock, FinishReason, LlmFailure, StreamChunk, TokenUsage};
use serde_json::Value;

use super::{MESSAGE_CAP, cap, status_code};
use crate::excerpt::EXCERPT_CAP;

/// What a `delta.tool_calls` entry's call is found by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ToolKey {
    /// The provider's `index`.
    Index(u64),
    /// The n-th call opened by an entry without an `index` ([`Assembler::unindexed`]).
    Unindexed(usize),
}

#[derive(Debug)]
struct ToolSlot {
    index: u32,
    id: CallId,
    name: String,
    arguments: String,
}

/// The calls opened by `tool_calls` entries without an `index`, numbered in opening order.
#[derive(Debug, Default)]
struct Unindexed {
    /// How many were opened.
    opened: usize,
    /// The first call opened with each id.
    by_id: HashMap<String, usize>,
    /// The latest call opened at each position of a `tool_calls` array.
    by_position: HashMap<u64, usize>,
}

/// Assembles one streamed response.
#[derive(Debug, Default)]
pub(crate) struct Assembler {
    next_index: u32,
    text: Option<(u32, String)>,
    reasoning: Option<(u32, String)>,
    /// Tool calls by the provider's `index` (or, for entries without one, by id).
    tools: BTreeMap<ToolKey, ToolSlot>,
    /// The calls opened by entries without an `index`, looked up in constant time (a linear
    /// search made a stream of many such calls quadratic to assemble).
    unindexed: Unindexed,
    finish_reason: Option<String>,
    usage: Option<TokenUsage>,
    /// The provider's request id, attached to failures.
    pub(crate) request_id: Option<String>,
}

impl Assembler {
    /// Handles one SSE `data` payload (other than `[DONE]`). `Err` is a failure the stream
    /// must end with (as `finish {error}`).
    pub(crate) fn on_data(&mut self, data: &str) -> Result<Vec<StreamChunk>, LlmFailure> {
        let event: Value = serde_json::from_str(data).map_err(|e| {
            self.failure(
                "BAD_RESPONSE",
                format!(
                    "the provider sent an event that is not JSON ({e}): `{}`",
                    quote(data)
                ),
            )
        })?;
        if let Some(failure) = self.provider_error(&event) {
            return Err(failure);
        }
        if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(parse_usage(usage));
        }
        let mut out = Vec::new();
        let Some(choice) = event.get("choices").and_then(Value::as_array).and_then(|c| {
            c.iter()
                .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        }) else {
            return Ok(out);
        };
        if let Some(delta) = choice.get("delta") {
            // Checked before anything of the event is emitted: a damaged part fails the event.
            let content = self.content_pieces(delta)?;
            // The first of the two that carries text: a `null` (or empty) `reasoning_content`
            // next to a `reasoning` does not hide it.
            let reasoning = ["reasoning_content", "reasoning"]
                .into_iter()
                .find_map(|field| delta.get(field).and_then(Value::as_str).filter(|t| !t.is_empty()));
            if let Some(text) = reasoning {
                let index = self.open(BlockType::Reasoning, &mut out);
                out.push(StreamChunk::ReasoningDelta {
                    index,
                    text: text.to_owned(),
                });
                if let Some((_, acc)) = &mut self.reasoning {
                    acc.push_str(text);
                }
            }
            for text in content.into_iter().filter(|t| !t.is_empty()) {
                let index = self.open(BlockType::Text, &mut out);
                out.push(StreamChunk::TextDelta {
                    index,
                    text: text.to_owned(),
                });
                if let Some((_, acc)) = &mut self.text {
                    acc.push_str(text);
                }
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for (position, call) in calls.iter().enumerate() {
                    self.on_tool_delta(call, position as u64, &mut out);
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        Ok(out)
    }

    /// The failure for an `event: error` event, whatever its data: the error it carries (as
    /// in any event), else its JSON taken as the error, else its text as the message (code
    /// `PROVIDER_ERROR`).
    pub(crate) fn on_error_event(&self, data: &str) -> LlmFailure {
        match serde_json::from_str::<Value>(data) {
            Ok(event) => self
                .provider_error(&event)
                .unwrap_or_else(|| self.error_failure(&event, true)),
            Err(_) => self.failure("PROVIDER_ERROR", data.trim()),
        }
    }

    /// The provider's error an event reports, if it reports one: its `error` member (unless
    /// `null`), or, in an event without `choices`, the event itself when it has a string
    /// `message` next to a `code`, a string `type` or `"object": "error"` (the shape some
    /// servers send their errors in, vLLM's among them). Also how a successful response's one
    /// JSON document is recognised as the provider's error.
    pub(super) fn provider_error(&self, event: &Value) -> Option<LlmFailure> {
        if let Some(error) = event.get("error").filter(|e| !e.is_null()) {
            return Some(self.error_failure(error, false));
        }
        let fields = event.as_object()?;
        let is_error = !fields.contains_key("choices")
            && fields.get("message").is_some_and(Value::is_string)
            && (fields.get("code").is_some_and(|c| !c.is_null())
                || fields.get("type").is_some_and(Value::is_string)
                || fields.get("object").and_then(Value::as_str) == Some("error"));
        is_error.then(|| self.error_failure(event, true))
    }

    /// The failure for a provider's error (an object or a bare string): its `message` (else its
    /// JSON text); its `code` when that is an HTTP error status ([`http_error_status`]) as the
    /// code the HTTP path gives that status ([`status_code`]); else its string `code`, else its
    /// string `type` — as the adapter's canonical code when it is a well-known one
    /// ([`canonical_code`]), else upper-cased — else `PROVIDER_ERROR`. For an error that is the
    /// whole event (`top_level`) a `type` of `error` only says it is one, and names no code.
    ///
    /// When the canonical code is not simply the provider's upper-cased, the message ends with
    /// ` (provider code: <original>)`, kept within the message cap.
    fn error_failure(&self, error: &Value, top_level: bool) -> LlmFailure {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| error.as_str())
            .map_or_else(|| error.to_string(), str::to_owned);
        let status = error.get("code").and_then(http_error_status);
        let status_text = status.map(|s| s.to_string());
        let Some(raw) = status_text
            .as_deref()
            .or_else(|| error.get("code").and_then(Value::as_str))
            .or_else(|| {
                error
                    .get("type")
                    .and_then(Value::as_str)
                    .filter(|t| !(top_level && *t == "error"))
            })
        else {
            return self.failure("PROVIDER_ERROR", message);
        };
        let upper = raw.to_ascii_uppercase();
        let canonical = status.map_or_else(
            || canonical_code(raw).map(str::to_owned),
            |s| Some(status_code(s)),
        );
        match canonical {
            Some(canonical) if canonical != upper => {
                let suffix = format!(" (provider code: {raw})");
                let mut message = message;
                let room = MESSAGE_CAP.saturating_sub(suffix.len());
                if message.len() > room {
                    let mut end = room;
                    while !message.is_char_boundary(end) {
                        end -= 1;
                    }
                    message.truncate(end);
                }
                message.push_str(&suffix);
                self.failure(&canonical, message)
            }
            Some(canonical) => self.failure(&canonical, message),
            None => self.failure(&upper, message),
        }
    }

    /// The text pieces a `delta` adds to the text block, in order: `content` as a string, or
    /// each part of `content` as an array (a `text` part's `text`, a `refusal` part's
    /// `refusal`), then `refusal` as a string. `content` or `refusal` of another type (`null`
    /// among them) adds nothing. An array part that is not an object, has no string `type`, is
    /// of another type, or lacks its string field is a `BAD_RESPONSE` naming the part.
    fn content_pieces<'a>(&self, delta: &'a Value) -> Result<Vec<&'a str>, LlmFailure> {
        let mut pieces = Vec::new();
        match delta.get("content") {
            Some(Value::String(text)) => pieces.push(text.as_str()),
            Some(Value::Array(parts)) => {
                for (position, part) in parts.iter().enumerate() {
                    pieces.push(self.content_part(position, part)?);
                }
            }
            _ => {}
        }
        if let Some(refusal) = delta.get("refusal").and_then(Value::as_str) {
            pieces.push(refusal);
        }
        Ok(pieces)
    }

    /// The text of one part (at `position`) of an array `delta.content`.
    fn content_part<'a>(&self, position: usize, part: &'a Value) -> Result<&'a str, LlmFailure> {
        let bad = |what: String| {
            self.failure(
                "BAD_RESPONSE",
                format!("the provider sent a content part (`delta.content[{position}]`) {what}"),
            )
        };
        let Some(fields) = part.as_object() else {
            return Err(bad(format!("that is not an object: {}", excerpt(part))));
        };
        let field = match fields.get("type").and_then(Value::as_str) {
            Some("text") => "text",
            Some("refusal") => "refusal",
            Some(other) => {
                return Err(bad(format!(
                    "of type `{other}`, which this adapter cannot represent (only `text` and \
                     `refusal` parts are supported)"
                )));
            }
            None => return Err(bad(format!("without a string `type`: {}", excerpt(part)))),
        };
        fields.get(field).and_then(Value::as_str).ok_or_else(|| {
            bad(format!(
                "of type `{field}` without a string `{field}`: {}",
                excerpt(part)
            ))
        })
    }

    /// Handles one entry of `delta.tool_calls` (at `position` in its array).
    ///
    /// An entry that is not an object, or opens no call and carries no id, name or arguments,
    /// is ignored. The first id and the first name are the call's: servers that repeat them in
    /// every delta (or mint a new id per delta) neither grow the name nor split the call.
    fn on_tool_delta(&mut self, call: &Value, position: u64, out: &mut Vec<StreamChunk>) {
        let Some(call) = call.as_object() else {
            return;
        };
        let id = call.get("id").and_then(Value::as_str).filter(|s| !s.is_empty());
        let key = match call.get("index").and_then(Value::as_u64) {
            Some(index) => ToolKey::Index(index),
            None => self.unindexed_key(id, position),
        };
        let function = call.get("function");
        let name = function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty());
        let arguments = function
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if !self.tools.contains_key(&key) {
            if id.is_none() && name.is_none() && arguments.is_empty() {
                return;
            }
            let index = self.next_index;
            self.next_index += 1;
            let fallback = match key {
                ToolKey::Index(index) => index,
                ToolKey::Unindexed(_) => {
                    let opened = self.unindexed.opened;
                    self.unindexed.opened += 1;
                    if let Some(id) = id {
                        self.unindexed.by_id.entry(id.to_owned()).or_insert(opened);
                    }
                    self.unindexed.by_position.insert(position, opened);
                    position
                }
            };
            let id = id.map_or_else(|| CallId::new(format!("call_{fallback}")), CallId::from);
            out.push(StreamChunk::BlockStart {
                index,
                block_type: BlockType::ToolCall,
            });
            self.tools.insert(
                key,
                ToolSlot {
                    index,
                    id,
                    name: String::new(),
                    arguments: String::new(),
                },
            );
        }
        let slot = self.tools.get_mut(&key).expect("inserted above");
        let new_name = name.filter(|_| slot.name.is_empty());
        if let Some(name) = new_name {
            slot.name = name.to_owned();
        }
        slot.arguments.push_str(arguments);
        if new_name.is_some() || !arguments.is_empty() {
            out.push(StreamChunk::ToolCallDelta {
                index: slot.index,
                id: slot.id.clone(),
                name: new_name.map(str::to_owned),
                arguments_delta: arguments.to_owned(),
            });
        }
    }

    /// The key of an entry without an `index`, with `id` (if it sent one) at `position` in its
    /// array: the call opened with that id; for an entry without an id, the latest call opened
    /// at that position; else a call not opened yet.
    fn unindexed_key(&self, id: Option<&str>, position: u64) -> ToolKey {
        let found = match id {
            Some(id) => self.unindexed.by_id.get(id),
            None => self.unindexed.by_position.get(&position),
        };
        ToolKey::Unindexed(found.copied().unwrap_or(self.unindexed.opened))
    }

    /// Opens the text or reasoning block on first use; returns its index.
    fn open(&mut self, block_type: BlockType, out: &mut Vec<StreamChunk>) -> u32 {
        let slot = match block_type {
            BlockType::Reasoning => &mut self.reasoning,
            _ => &mut self.text,
        };
        if let Some((index, _)) = slot {
            return *index;
        }
        let index = self.next_index;
        self.next_index += 1;
        *slot = Some((index, String::new()));
        out.push(StreamChunk::BlockStart { index, block_type });
        index
    }

    /// Ends the response: closes every open block (index order), then `usage` and `finish`.
    /// `done` says whether the provider's `[DONE]` marker arrived.
    pub(crate) fn finish(&mut self, done: bool) -> Vec<StreamChunk> {
        let Some(reason) = self
            .finish_reason
            .clone()
            .or_else(|| done.then(|| "stop".to_owned()))
        else {
            return vec![self.fail_chunk(
                "STREAM_INTERRUPTED",
                "the response stream ended before the model finished",
            )];
        };
        let has_blocks = self.text.is_some() || self.reasoning.is_some() || !self.tools.is_empty();
        let reason = match reason.as_str() {
            "length" => FinishReason::MaxTokens,
            "content_filter" => FinishReason::Error {
                failure: self.failure(
                    "CONTENT_FILTERED",
                    "the provider's content filter stopped the response",
                ),
            },
            // Whatever the reason claims (`tool_calls` included), nothing at all is empty.
            _ if !has_blocks => FinishReason::Error {
                failure: self.failure("EMPTY_RESPONSE", "the model returned an empty response"),
            },
            _ if !self.tools.is_empty() => FinishReason::ToolCalls,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            _ => FinishReason::Stop,
        };
        let mut ends: Vec<(u32, ContentBlock)> = Vec::new();
        if let Some((index, text)) = self.text.take() {
            ends.push((index, ContentBlock::text(text)));
        }
        if let Some((index, text)) = self.reasoning.take() {
            ends.push((index, ContentBlock::reasoning(text)));
        }
        for slot in std::mem::take(&mut self.tools).into_values() {
            ends.push((
                slot.index,
                ContentBlock::ToolCall {
                    id: slot.id,
                    name: slot.name,
                    arguments: slot.arguments,
                },
            ));
        }
        ends.sort_by_key(|(index, _)| *index);
        let mut out: Vec<StreamChunk> = ends
            .into_iter()
            .map(|(index, block)| StreamChunk::BlockEnd { index, block })
            .collect();
        if let Some(usage) = self.usage.take() {
            out.push(StreamChunk::Usage { usage });
        }
        out.push(StreamChunk::Finish {
            reason,
            replay_state: None,
        });
        out
    }

    /// A failure carrying this response's request id.
    pub(crate) fn failure(&self, code: &str, message: impl Into<String>) -> LlmFailure {
        let mut failure = LlmFailure::new(code, cap(message.into()));
        failure.request_id = self.request_id.clone();
        failure
    }

    /// A terminal `finish {error}` chunk.
    pub(crate) fn fail_chunk(&self, code: &str, message: impl Into<String>) -> StreamChunk {
        StreamChunk::Finish {
            reason: FinishReason::Error {
                failure: self.failure(code, message),
            },
            replay_state: None,
        }
    }
}

/// The adapter's canonical code for a well-known provider error code or type (matched
/// case-insensitively) — the code the same condition gets when it arrives as an HTTP status
/// ([`http_failure`](super::http_failure)), so a retry policy keyed on codes treats both alike —
/// else `None` (the provider's code is then kept, upper-cased).
///
/// | provider `code` / `type` | code | as HTTP |
/// |---|---|---|
/// | `rate_limit_exceeded`, `rate_limit_error`, `too_many_requests` | `RATE_LIMITED` | 429 |
/// | `overloaded`, `overloaded_error` | `OVERLOADED` | 529 |
/// | `server_error`, `internal_server_error`, `internal_error`, `api_error` | `SERVER_ERROR` | 500 |
/// | `service_unavailable` | `UNAVAILABLE` | 503 |
/// | `authentication_error`, `invalid_api_key` | `AUTHENTICATION` | 401 |
/// | `permission_error`, `permission_denied` | `PERMISSION_DENIED` | 403 |
/// | `context_length_exceeded`, `string_above_max_length` | `BAD_REQUEST` | 400 |
///
/// A `code` that is an HTTP error status (`"429"`, `503`) does not come here: it goes through
/// the HTTP path's own table ([`status_code`]), see [`http_error_status`].
///
/// `insufficient_quota` is deliberately not mapped: the HTTP path gives every 429
/// `RATE_LIMITED`, which a caller may retry, while an exhausted quota does not clear by
/// waiting; it stays `INSUFFICIENT_QUOTA`.
fn canonical_code(provider: &str) -> Option<&'static str> {
    let code = match provider.to_ascii_lowercase().as_str() {
        "rate_limit_exceeded" | "rate_limit_error" | "too_many_requests" => "RATE_LIMITED",
        "overloaded" | "overloaded_error" => "OVERLOADED",
        "server_error" | "internal_server_error" | "internal_error" | "api_error" => "SERVER_ERROR",
        "service_unavailable" => "UNAVAILABLE",
        "authentication_error" | "invalid_api_key" => "AUTHENTICATION",
        "permission_error" | "permission_denied" => "PERMISSION_DENIED",
        "context_length_exceeded" | "string_above_max_length" => "BAD_REQUEST",
        _ => return None,
    };
    Some(code)
}

/// The HTTP error status a provider's error `code` is, if it is one: a JSON number, or a string
/// of exactly three ASCII digits, from 400 to 599 (Azure OpenAI sends `"code": "429"`, vLLM
/// `"code": 503`). Any other number (`200`, `42`) is no status, and names no code by itself.
fn http_error_status(code: &Value) -> Option<u16> {
    let status = match code {
        Value::Number(n) => n.as_u64()?,
        Value::String(s) if s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok()?,
        _ => return None,
    };
    u16::try_from(status).ok().filter(|s| (400..=599).contains(s))
}

/// At most [`EXCERPT_CAP`] bytes of a value's JSON text (on a
/// char boundary), for messages.
fn excerpt(value: &Value) -> String {
    crate::excerpt::excerpt(value.to_string())
}

/// At most [`EXCERPT_CAP`] bytes of `text` for a message, with control characters escaped
/// (`\n`, `\t`, `\u{1b}`: the quote stays on one line and shows what was sent) and `…` marking
/// a cut. Only as much of `text` is read as the quote holds.
fn quote(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        let len = if c.is_control() {
            c.escape_default().count()
        } else {
            c.len_utf8()
        };
        if out.len() + len > EXCERPT_CAP {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn parse_usage(usage: &Value) -> TokenUsage {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64);
    TokenUsage {
        input_tokens: n(usage.get("prompt_tokens")).unwrap_or(0),
        output_tokens: n(usage.get("completion_tokens")).unwrap_or(0),
        cache_read_tokens: n(usage.pointer("/prompt_tokens_details/cached_tokens"))
            .or_else(|| n(usage.get("prompt_cache_hit_tokens"))),
        cache_write_tokens: None,
        reasoning_tokens: n(usage.pointer("/completion_tokens_details/reasoning_tokens")),
    }
}
