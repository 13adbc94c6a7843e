//! The model adapter contract: requests, the stream grammar and finish reasons (spec §13).

use std::sync::Arc;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::content::ContentBlock;
use crate::history::MessageList;
use crate::ids::{CallId, SessionId};
use crate::signal::Signal;

/// The facts of a model failure, kept verbatim. `code` is `UNKNOWN` for errors that carried no
/// structure, `ABORTED` for an in-band abort without cancellation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmFailure {
    /// Human-readable message (for a non-structured error: its error chain text).
    pub message: String,
    /// Machine-readable code.
    pub code: String,
    /// HTTP status, when the failure came from an HTTP response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The provider's retry-after hint in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_retry_after_ms: Option<u64>,
    /// The provider's request id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl LlmFailure {
    /// A failure with a code and message and no transport facts.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: code.into(),
            status: None,
            provider_retry_after_ms: None,
            request_id: None,
        }
    }

    /// The normalisation of any non-structured error: code `UNKNOWN`, message preserved.
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::new("UNKNOWN", message)
    }
}

impl std::fmt::Display for LlmFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for LlmFailure {}

/// Why a model stream finished. An open union (spine §13.3): a kind this version does not know
/// — read from a log a newer writer produced, or built by an adapter — is kept as
/// [`Unknown`](Self::Unknown), round-trips unchanged, and counts as a failure.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum FinishReason {
    /// The model stopped normally.
    Stop,
    /// The model stopped to call tools.
    ToolCalls,
    /// The output-token ceiling was reached.
    MaxTokens,
    /// The request was aborted.
    Aborted {
        /// The failure facts.
        failure: LlmFailure,
    },
    /// The request failed.
    Error {
        /// The failure facts.
        failure: LlmFailure,
    },
    /// A kind this version does not know; treated as a failure.
    Unknown {
        /// Its `kind`.
        kind: String,
        /// Its other fields, as written.
        fields: Map<String, Value>,
    },
}

impl FinishReason {
    /// Whether this finish is a failure (`aborted`, `error`, or a kind this version does not
    /// know).
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            Self::Aborted { .. } | Self::Error { .. } | Self::Unknown { .. }
        )
    }
}

/// The known kinds' wire form, borrowed for writing.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum KnownFinishRef<'a> {
    Stop,
    ToolCalls,
    MaxTokens,
    Aborted { failure: &'a LlmFailure },
    Error { failure: &'a LlmFailure },
}

/// The known kinds' wire form, owned for reading.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum KnownFinish {
    Stop,
    ToolCalls,
    MaxTokens,
    Aborted { failure: LlmFailure },
    Error { failure: LlmFailure },
}

/// The kinds [`KnownFinish`] reads.
pub(crate) const KNOWN_FINISH_KINDS: [&str; 5] = ["stop", "tool-calls", "max-tokens", "aborted", "error"];

impl Serialize for FinishReason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let known = match self {
            Self::Stop => KnownFinishRef::Stop,
            Self::ToolCalls => KnownFinishRef::ToolCalls,
            Self::MaxTokens => KnownFinishRef::MaxTokens,
            Self::Aborted { failure } => KnownFinishRef::Aborted { failure },
            Self::Error { failure } => KnownFinishRef::Error { failure },
            Self::Unknown { kind, fields } => {
                let mut map = serializer.serialize_map(Some(fields.len() + 1))?;
                map.serialize_entry("kind", kind)?;
                for (key, value) in fields {
                    if key != "kind" {
                        map.serialize_entry(key, value)?;
                    }
                }
                return map.end();
            }
        };
        known.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for FinishReason {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut fields = Map::<String, Value>::deserialize(deserializer)?;
        let kind = match fields.get("kind") {
            Some(Value::String(kind)) => kind.clone(),
            Some(_) => return Err(D::Error::custom("finish reason `kind` must be a string")),
            None => return Err(D::Error::missing_field("kind")),
        };
        if !KNOWN_FINISH_KINDS.contains(&kind.as_str()) {
            fields.remove("kind");
            return Ok(Self::Unknown { kind, fields });
        }
        Ok(
            match KnownFinish::deserialize(Value::Object(fields)).map_err(D::Error::custom)? {
                KnownFinish::Stop => Self::Stop,
                KnownFinish::ToolCalls => Self::ToolCalls,
                KnownFinish::MaxTokens => Self::MaxTokens,
                KnownFinish::Aborted { failure } => Self::Aborted { failure },
                KnownFinish::Error { failure } => Self::Error { failure },
            },
        )
    }
}

/// Token accounting for one model call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u64>,
    /// Prompt tokens written to cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    /// Reasoning tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

/// The type of a content block opened by a `block-start` chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockType {
    /// Visible text.
    Text,
    /// Reasoning.
    Reasoning,
    /// An image.
    Image,
    /// A tool call.
    ToolCall,
    /// A tool result.
    ToolResult,
}

impl BlockType {
    /// The block type of an assembled block, if it is one of the known kinds.
    pub fn of(block: &ContentBlock) -> Option<Self> {
        Some(match block {
            ContentBlock::Text { .. } => Self::Text,
            ContentBlock::Reasoning { .. } => Self::Reasoning,
            ContentBlock::Image { .. } => Self::Image,
            ContentBlock::ToolCall { .. } => Self::ToolCall,
            ContentBlock::ToolResult { .. } => Self::ToolResult,
            ContentBlock::Other(_) => return None,
        })
    }
}

/// One chunk of a model stream. A closed union; its grammar is checked by
/// [`StreamGrammar`](crate::stream_grammar::StreamGrammar).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum StreamChunk {
    /// Opens block `index` of type `block_type`.
    #[serde(rename_all = "camelCase")]
    BlockStart {
        /// Block index (non-negative, unique while open).
        index: u32,
        /// The type of the block.
        block_type: BlockType,
    },
    /// Appends visible text to an open text block.
    TextDelta {
        /// Block index.
        index: u32,
        /// The text fragment.
        text: String,
    },
    /// Appends reasoning text to an open reasoning block.
    ReasoningDelta {
        /// Block index.
        index: u32,
        /// The text fragment.
        text: String,
    },
    /// Appends to an open tool-call block.
    #[serde(rename_all = "camelCase")]
    ToolCallDelta {
        /// Block index.
        index: u32,
        /// The call id.
        id: CallId,
        /// The tool name, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// A fragment of the raw argument string.
        arguments_delta: String,
    },
    /// Closes an open block and carries the assembled block.
    BlockEnd {
        /// Block index.
        index: u32,
        /// The assembled block.
        block: ContentBlock,
    },
    /// Token usage (at most once, before `finish`).
    Usage {
        /// The usage.
        usage: TokenUsage,
    },
    /// Ends the stream.
    #[serde(rename_all = "camelCase")]
    Finish {
        /// Why the stream ended.
        reason: FinishReason,
        /// Adapter-private replay state.
        #[serde(
            default,
            deserialize_with = "crate::content::present_boxed_value",
            skip_serializing_if = "Option::is_none"
        )]
        replay_state: Option<Box<Value>>,
    },
}

/// A model-facing tool schema.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    /// Tool name.
    pub name: String,
    /// Description shown to the model.
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub parameters: Value,
}

/// One model request. Loop-built requests are immutable (`Arc`), carry the session id and are
/// marked [`loop_built`](Self::loop_built).
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Provider route.
    pub provider: Arc<str>,
    /// Model route.
    pub model: Arc<str>,
    /// The conversation. A loop-built request's list shares the log's events (no message is
    /// copied per request).
    pub messages: MessageList,
    /// System text.
    pub system: Option<String>,
    /// Tool schemas; `None` when the request has no tools (never an empty list).
    pub tools: Option<Vec<ToolSchema>>,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Output-token cap.
    pub max_tokens: Option<u64>,
    /// Stop sequences.
    pub stop: Option<Vec<String>>,
    /// Reasoning effort id.
    pub reasoning_effort: Option<String>,
    /// The request's cancellation; its cause is the agent cancel cause.
    pub signal: Signal,
    /// The requesting session.
    pub session_id: Option<SessionId>,
    /// Whether an agent loop built this request from its log.
    pub loop_built: bool,
    /// Extra adapter settings, kept verbatim.
    pub extra: Map<String, Value>,
}

impl GenerateOptions {
    /// A request for `provider`/`model` with `messages` and nothing else set.
    pub fn new(
        provider: impl Into<Arc<str>>,
        model: impl Into<Arc<str>>,
        messages: impl Into<MessageList>,
    ) -> Self {
        Self {
            provider: provider.into(),
            model: model.into(),
            messages: messages.into(),
            system: None,
            tools: None,
            temperature: None,
            max_tokens: None,
            stop: None,
            reasoning_effort: None,
            signal: Signal::new(),
            session_id: None,
            loop_built: false,
            extra: Map::new(),
        }
    }
}

/// A stream of chunks from one model call. Errors are adapter throws; the runtime converts them
/// into a terminal `finish` (`aborted` when the request was cancelled or the code is `ABORTED`,
/// else `error`).
pub type ModelStream = BoxStream<'static, Result<StreamChunk, LlmFailure>>;

/// A model adapter: turns one request into a stream of [`StreamChunk`]s.
///
/// # Contract
/// * The stream obeys the grammar of spec §13.2 (checked by
///   [`StreamGrammar`](crate::stream_grammar::StreamGrammar)) and ends with `finish`.
/// * The adapter observes `request.signal` promptly: once it is cancelled the stream ends (with
///   an `aborted` finish or an error) without waiting for the provider.
/// * Dropping the stream cancels the underlying call; no task outlives the stream.
/// * Adapters are shared (`Arc<dyn ModelAdapter>`) and must tolerate concurrent calls.
pub trait ModelAdapter: Send + Sync + 'static {
    /// Starts one model call.
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chunks_use_spec_shape() {
        let c = StreamChunk::ToolCallDelta {
            index: 0,
            id: "c".into(),
            name: Some("t".into()),
            arguments_delta: "{".into(),
        };
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"type": "tool-call-delta", "index": 0, "id": "c", "name": "t", "argumentsDelta": "{"})
        );
        let f = StreamChunk::Finish {
            reason: FinishReason::Error {
                failure: LlmFailure::unknown("boom"),
            },
            replay_state: None,
        };
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            json!({"type": "finish", "reason": {"kind": "error", "failure": {"message": "boom", "code": "UNKNOWN"}}})
        );
        let s = StreamChunk::BlockStart {
            index: 1,
            block_type: BlockType::ToolCall,
        };
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({"type": "block-start", "index": 1, "blockType": "tool-call"})
        );
    }
}

#[cfg(test)]
mod finish_reason_tests {
    use super::*;

    /// spine §13.3 — the finish reason is an open union: an unknown kind reads back as
    /// `Unknown` with its fields, writes back unchanged and is a failure; known kinds keep their
    /// wire form; a known kind with a bad payload, or no string `kind`, is refused.
    #[test]
    fn unknown_finish_kinds_round_trip_and_count_as_failures() {
        let line = r#"{"kind":"content-withheld","detail":{"policy":7},"retry":false}"#;
        let reason: FinishReason = serde_json::from_str(line).unwrap();
        match &reason {
            FinishReason::Unknown { kind, fields } => {
                assert_eq!(kind, "content-withheld");
                assert_eq!(fields.len(), 2);
            }
            other => panic!("expected an unknown kind, got {other:?}"),
        }
        assert!(reason.is_failure());
        let back: Value = serde_json::to_value(&reason).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(line).unwrap());

        for (line, reason) in [
            (r#"{"kind":"stop"}"#, FinishReason::Stop),
            (r#"{"kind":"tool-calls"}"#, FinishReason::ToolCalls),
            (r#"{"kind":"max-tokens"}"#, FinishReason::MaxTokens),
            (
                r#"{"kind":"error","failure":{"message":"m","code":"C"}}"#,
                FinishReason::Error {
                    failure: LlmFailure::new("C", "m"),
                },
            ),
        ] {
            assert_eq!(serde_json::from_str::<FinishReason>(line).unwrap(), reason);
            assert_eq!(
                serde_json::to_value(&reason).unwrap(),
                serde_json::from_str::<Value>(line).unwrap()
            );
            assert_eq!(reason.is_failure(), matches!(reason, FinishReason::Error { .. }));
        }
        for bad in [
            r#"{"kind":"error"}"#,
            r#"{"kind":7}"#,
            r#"{"failure":{}}"#,
            r#""stop""#,
        ] {
            assert!(
                serde_json::from_str::<FinishReason>(bad).is_err(),
                "{bad} was accepted"
            );
        }
    }
}
