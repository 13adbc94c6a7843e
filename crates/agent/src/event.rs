//! The session event log's envelope and event vocabulary (spec §4.1, §4.3).
//!
//! A [`SessionEvent`] serializes as `{type, seq, time, data}` plus, on the three surface types
//! only, `surfaceOp` and `sourceEventSeqs`, plus `ignorable: true` when set. Known types
//! deserialize into typed [`EventData`] variants; every other type is kept losslessly as
//! [`EventData::Other`].

use std::sync::Arc;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::ids::CallId;
use crate::message::Message;
use crate::model::{StreamChunk, TokenUsage, ToolSchema};
use crate::turn::TurnEndReason;

/// The event types whose payloads form the model-facing surface.
pub const SURFACE_TYPES: [&str; 3] = ["user/message", "assistant/message", "tool/result"];

/// The event types read back as typed [`EventData`] variants (every type but
/// [`EventData::Other`]'s). A plugin-owned event must use another name.
pub const TYPED_TYPES: [&str; 15] = [
    "turn/start",
    "turn/end",
    "step/start",
    "step/end",
    "user/message",
    "assistant/chunk",
    "assistant/message",
    "tool/call",
    "tool/result",
    "request/header",
    "request/context",
    "session/end-seed",
    "agent/inbox/spliced",
    "sandbox/mode",
    "approval/policy",
];

/// Which inbox list a splice addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InboxTarget {
    /// Queued prompts, one per turn.
    NextTurn,
    /// Steering and injected context for the nearest step boundary.
    NextStep,
}

/// How a surface event changes the surface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SurfaceOp {
    /// Appends to the surface (serialized as the string `"append"`).
    Append,
    /// Replaces the current surface nodes from seq `start` through seq `end`, both included
    /// (compaction-style; serialized as `{"op": "replace", "start", "end"}`; see
    /// [`derive_messages`](crate::derive_messages)).
    Replace {
        /// First replaced seq.
        start: u64,
        /// Last replaced seq (inclusive).
        end: u64,
    },
}

impl Serialize for SurfaceOp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Append => s.serialize_str("append"),
            Self::Replace { start, end } => {
                serde_json::json!({"op": "replace", "start": start, "end": end}).serialize(s)
            }
        }
    }
}

impl<'de> Deserialize<'de> for SurfaceOp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        match &v {
            Value::String(s) if s == "append" => Ok(Self::Append),
            Value::Object(m) if m.get("op").and_then(Value::as_str) == Some("replace") => {
                let num = |k: &str| {
                    m.get(k).and_then(Value::as_u64).ok_or_else(|| {
                        D::Error::custom(format!("surfaceOp.replace needs a non-negative integer `{k}`"))
                    })
                };
                Ok(Self::Replace {
                    start: num("start")?,
                    end: num("end")?,
                })
            }
            _ => Err(D::Error::custom(format!("invalid surfaceOp {v}"))),
        }
    }
}

/// Surface metadata carried only by surface events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SurfaceMeta {
    /// How the event changes the surface. `None` only in logs read from disk that violate the
    /// append contract; the validator rejects it.
    pub surface_op: Option<SurfaceOp>,
    /// For `assistant/message`: the seqs of the chunks that built it (explicit empty = known
    /// empty stream).
    pub source_event_seqs: Option<Vec<u64>>,
}

impl SurfaceMeta {
    /// `surfaceOp: append` with no source seqs.
    pub fn append() -> Self {
        Self {
            surface_op: Some(SurfaceOp::Append),
            source_event_seqs: None,
        }
    }
}

/// Why a `request/header` was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RequestHeaderReason {
    /// First request of a fresh agent.
    Initial,
    /// First request of a resumed agent.
    Resume,
    /// The configuration changed.
    Change,
}

/// The model call configuration a request header records.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallConfig {
    /// Provider route.
    pub provider: Arc<str>,
    /// Model route.
    pub model: Arc<str>,
    /// Reasoning effort id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Output-token cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
}

/// What a model request is built from besides its messages.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EpochHeader {
    /// The call configuration.
    pub config: CallConfig,
    /// Which config fields the adapter supplied.
    #[serde(
        default,
        deserialize_with = "crate::content::present_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub adapter_defaults: Option<Value>,
    /// The system text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The tool schemas; absent when the request has no tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolSchema>>,
}

/// Error facts logged beside a failed `tool/result`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResultError {
    /// Error name.
    pub name: String,
    /// Error code (`UNKNOWN_TOOL`, `INVALID_ARGS`, …).
    pub code: String,
}

/// Whether a splice was a user-visible cancellation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpliceOutcome {
    /// Removed work was cancelled (the spec spells it `canceled`).
    Canceled,
}

/// `agent/inbox/spliced`: one normalised inbox mutation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxSplice {
    /// The list changed.
    pub target: InboxTarget,
    /// Index of the first removed or inserted item.
    pub start: u64,
    /// How many items were removed (absent for pure inserts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_count: Option<u64>,
    /// Inserted messages.
    pub inserted: Vec<Message>,
    /// `canceled` for user-visible removals; absent for claims and inserts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<SpliceOutcome>,
}

impl InboxSplice {
    /// Whether this splice is a claim: it declares `removedCount` and is not a cancellation.
    pub fn is_claim(&self) -> bool {
        self.removed_count.is_some() && self.outcome.is_none()
    }

    /// Whether this splice is a cancellation.
    pub fn is_cancellation(&self) -> bool {
        self.outcome == Some(SpliceOutcome::Canceled)
    }
}

/// The typed payload of one session event. Serialized as the envelope's `type` and `data`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum EventData {
    /// `turn/start {turn}`.
    TurnStart {
        /// Turn number (1, 2, 3, … per session, continuing after a seed).
        turn: u64,
    },
    /// `turn/end {turn, reason}`.
    TurnEnd {
        /// Turn number.
        turn: u64,
        /// Why it ended.
        reason: TurnEndReason,
    },
    /// `step/start {turn, step}`.
    StepStart {
        /// Turn number.
        turn: u64,
        /// Step number (1, 2, 3, … per turn).
        step: u64,
    },
    /// `step/end {turn, step}`.
    StepEnd {
        /// Turn number.
        turn: u64,
        /// Step number.
        step: u64,
    },
    /// `user/message` (surface): the message itself is the payload.
    UserMessage(Message),
    /// `assistant/chunk {turn, step, chunk}`.
    AssistantChunk {
        /// Turn number.
        turn: u64,
        /// Step number.
        step: u64,
        /// The raw chunk.
        chunk: StreamChunk,
    },
    /// `assistant/message {turn, step, message, usage?, interrupted?}` (surface).
    AssistantMessage {
        /// Turn number.
        turn: u64,
        /// Step number.
        step: u64,
        /// The assistant message (possibly with empty content).
        message: Message,
        /// Token usage (boxed: it would otherwise widen every event of every log).
        usage: Option<Box<TokenUsage>>,
        /// `true` when this is the safe prefix of a cancelled stream.
        interrupted: bool,
    },
    /// `tool/call {turn, step, callId, name, arguments}`.
    ToolCall {
        /// Turn number.
        turn: u64,
        /// Step number.
        step: u64,
        /// The call id.
        call_id: CallId,
        /// Tool name.
        name: String,
        /// Raw argument string.
        arguments: String,
    },
    /// `tool/result {turn, step, message, error?, meta?}` (surface).
    ToolResult {
        /// Turn number.
        turn: u64,
        /// Step number.
        step: u64,
        /// The tool-result message.
        message: Message,
        /// Error facts for a failed call (boxed, as `meta`: rare, and inline they would widen
        /// every event of every log).
        error: Option<Box<ToolResultError>>,
        /// Tool-specific metadata.
        meta: Option<Box<Value>>,
    },
    /// `request/header {header, reason}`.
    RequestHeader {
        /// What the request is built from (boxed: the largest payload, once per request,
        /// would otherwise widen every event of every log).
        header: Box<EpochHeader>,
        /// Why it was written.
        reason: RequestHeaderReason,
    },
    /// `request/context {provider, model, contextWindow?}`.
    RequestContext {
        /// Provider route.
        provider: Arc<str>,
        /// Model route.
        model: Arc<str>,
        /// The model's context window.
        context_window: Option<u64>,
    },
    /// `session/end-seed {}`: the first event after a seed.
    EndSeed,
    /// `agent/inbox/spliced`.
    InboxSpliced(InboxSplice),
    /// `sandbox/mode {mode, source?}`.
    SandboxMode {
        /// The mode (`read-only`, `workspace-write`, `danger-full-access`).
        mode: String,
        /// `delegation` when written by delegated-policy capture.
        source: Option<String>,
    },
    /// `approval/policy {policy, source?}`.
    ApprovalPolicy {
        /// The policy (`ask` or `never`).
        policy: String,
        /// `delegation` when written by delegated-policy capture.
        source: Option<String>,
    },
    /// Any other type (plugin-owned log-only events such as `subagent/descriptor`), kept
    /// losslessly.
    Other {
        /// The event type.
        kind: String,
        /// The raw payload, shared: cloning the event (or a cached event appended to many
        /// logs, as a subagent descriptor is) never copies it.
        data: Arc<Value>,
    },
}

// Private payload mirrors used for (de)serialization of the known struct-like variants.
mod wire {
    use super::*;

    #[derive(Serialize, Deserialize)]
    pub struct Turn {
        pub turn: u64,
    }
    #[derive(Serialize, Deserialize)]
    pub struct TurnEnd {
        pub turn: u64,
        pub reason: TurnEndReason,
    }
    #[derive(Serialize, Deserialize)]
    pub struct Step {
        pub turn: u64,
        pub step: u64,
    }
    #[derive(Serialize, Deserialize)]
    pub struct Chunk {
        pub turn: u64,
        pub step: u64,
        pub chunk: StreamChunk,
    }
    #[derive(Serialize, Deserialize)]
    pub struct AssistantMessage {
        pub turn: u64,
        pub step: u64,
        pub message: Message,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub usage: Option<Box<TokenUsage>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub interrupted: Option<bool>,
    }
    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ToolCall {
        pub turn: u64,
        pub step: u64,
        pub call_id: CallId,
        pub name: String,
        pub arguments: String,
    }
    #[derive(Serialize, Deserialize)]
    pub struct ToolResult {
        pub turn: u64,
        pub step: u64,
        pub message: Message,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub error: Option<Box<ToolResultError>>,
        #[serde(
            default,
            deserialize_with = "crate::content::present_boxed_value",
            skip_serializing_if = "Option::is_none"
        )]
        pub meta: Option<Box<Value>>,
    }
    #[derive(Serialize, Deserialize)]
    pub struct RequestHeader {
        pub header: Box<EpochHeader>,
        pub reason: RequestHeaderReason,
    }
    #[derive(Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct RequestContext {
        pub provider: Arc<str>,
        pub model: Arc<str>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub context_window: Option<u64>,
    }
    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Empty {}
    #[derive(Serialize, Deserialize)]
    pub struct Sandbox {
        pub mode: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub source: Option<String>,
    }
    #[derive(Serialize, Deserialize)]
    pub struct Approval {
        pub policy: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub source: Option<String>,
    }
}

/// Borrowed payload mirrors for serialization (the same shapes as [`wire`], without clones).
mod wire_ref {
    use super::*;

    #[derive(Serialize)]
    pub struct TurnEnd<'a> {
        pub turn: u64,
        pub reason: &'a TurnEndReason,
    }
    #[derive(Serialize)]
    pub struct Chunk<'a> {
        pub turn: u64,
        pub step: u64,
        pub chunk: &'a StreamChunk,
    }
    #[derive(Serialize)]
    pub struct AssistantMessage<'a> {
        pub turn: u64,
        pub step: u64,
        pub message: &'a Message,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub usage: Option<&'a TokenUsage>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub interrupted: Option<bool>,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct ToolCall<'a> {
        pub turn: u64,
        pub step: u64,
        pub call_id: &'a CallId,
        pub name: &'a str,
        pub arguments: &'a str,
    }
    #[derive(Serialize)]
    pub struct ToolResult<'a> {
        pub turn: u64,
        pub step: u64,
        pub message: &'a Message,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub error: Option<&'a ToolResultError>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub meta: Option<&'a Value>,
    }
    #[derive(Serialize)]
    pub struct RequestHeader<'a> {
        pub header: &'a EpochHeader,
        pub reason: RequestHeaderReason,
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    pub struct RequestContext<'a> {
        pub provider: &'a str,
        pub model: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub context_window: Option<u64>,
    }
    #[derive(Serialize)]
    pub struct Sandbox<'a> {
        pub mode: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub source: Option<&'a str>,
    }
    #[derive(Serialize)]
    pub struct Approval<'a> {
        pub policy: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub source: Option<&'a str>,
    }
}

/// The envelope's `data` of one event, borrowed (see [`EventData::payload`]).
struct Payload<'a>(&'a EventData);

impl Serialize for Payload<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            EventData::TurnStart { turn } => wire::Turn { turn: *turn }.serialize(s),
            EventData::TurnEnd { turn, reason } => wire_ref::TurnEnd { turn: *turn, reason }.serialize(s),
            EventData::StepStart { turn, step } | EventData::StepEnd { turn, step } => wire::Step {
                turn: *turn,
                step: *step,
            }
            .serialize(s),
            EventData::UserMessage(m) => m.serialize(s),
            EventData::AssistantChunk { turn, step, chunk } => wire_ref::Chunk {
                turn: *turn,
                step: *step,
                chunk,
            }
            .serialize(s),
            EventData::AssistantMessage {
                turn,
                step,
                message,
                usage,
                interrupted,
            } => wire_ref::AssistantMessage {
                turn: *turn,
                step: *step,
                message,
                usage: usage.as_deref(),
                interrupted: interrupted.then_some(true),
            }
            .serialize(s),
            EventData::ToolCall {
                turn,
                step,
                call_id,
                name,
                arguments,
            } => wire_ref::ToolCall {
                turn: *turn,
                step: *step,
                call_id,
                name,
                arguments,
            }
            .serialize(s),
            EventData::ToolResult {
                turn,
                step,
                message,
                error,
                meta,
            } => wire_ref::ToolResult {
                turn: *turn,
                step: *step,
                message,
                error: error.as_deref(),
                meta: meta.as_deref(),
            }
            .serialize(s),
            EventData::RequestHeader { header, reason } => wire_ref::RequestHeader {
                header,
                reason: *reason,
            }
            .serialize(s),
            EventData::RequestContext {
                provider,
                model,
                context_window,
            } => wire_ref::RequestContext {
                provider,
                model,
                context_window: *context_window,
            }
            .serialize(s),
            EventData::EndSeed => wire::Empty {}.serialize(s),
            EventData::InboxSpliced(splice) => splice.serialize(s),
            EventData::SandboxMode { mode, source } => wire_ref::Sandbox {
                mode,
                source: source.as_deref(),
            }
            .serialize(s),
            EventData::ApprovalPolicy { policy, source } => wire_ref::Approval {
                policy,
                source: source.as_deref(),
            }
            .serialize(s),
            EventData::Other { data, .. } => data.serialize(s),
        }
    }
}

impl EventData {
    /// The event's `type` string.
    pub fn type_name(&self) -> &str {
        match self {
            Self::TurnStart { .. } => "turn/start",
            Self::TurnEnd { .. } => "turn/end",
            Self::StepStart { .. } => "step/start",
            Self::StepEnd { .. } => "step/end",
            Self::UserMessage(_) => "user/message",
            Self::AssistantChunk { .. } => "assistant/chunk",
            Self::AssistantMessage { .. } => "assistant/message",
            Self::ToolCall { .. } => "tool/call",
            Self::ToolResult { .. } => "tool/result",
            Self::RequestHeader { .. } => "request/header",
            Self::RequestContext { .. } => "request/context",
            Self::EndSeed => "session/end-seed",
            Self::InboxSpliced(_) => "agent/inbox/spliced",
            Self::SandboxMode { .. } => "sandbox/mode",
            Self::ApprovalPolicy { .. } => "approval/policy",
            Self::Other { kind, .. } => kind,
        }
    }

    /// Whether this is one of the three surface types.
    #[inline]
    pub fn is_surface(&self) -> bool {
        match self {
            Self::UserMessage(_) | Self::AssistantMessage { .. } | Self::ToolResult { .. } => true,
            Self::Other { kind, .. } => SURFACE_TYPES.contains(&kind.as_str()),
            _ => false,
        }
    }

    /// A log-only plugin event of type `kind` with payload `data`.
    pub fn other(kind: impl Into<String>, data: impl Into<Arc<Value>>) -> Self {
        Self::Other {
            kind: kind.into(),
            data: data.into(),
        }
    }

    /// The payload as JSON (the envelope's `data`).
    pub fn to_data(&self) -> Value {
        serde_json::to_value(self.payload()).expect("event payloads contain only JSON-representable values")
    }

    /// The payload as a borrowed serializable view: it serializes exactly as
    /// [`to_data`](Self::to_data) renders, without cloning the event or building a `Value`.
    pub fn payload(&self) -> impl Serialize + '_ {
        Payload(self)
    }

    /// Builds the typed payload for `kind` from its JSON `data`. Unknown kinds become
    /// [`EventData::Other`]; a known kind whose data does not match its payload shape is an error.
    pub fn from_parts(kind: &str, data: Value) -> Result<Self, serde_json::Error> {
        use serde_json::from_value as f;
        Ok(match kind {
            "turn/start" => Self::TurnStart {
                turn: f::<wire::Turn>(data)?.turn,
            },
            "turn/end" => {
                let w: wire::TurnEnd = f(data)?;
                Self::TurnEnd {
                    turn: w.turn,
                    reason: w.reason,
                }
            }
            "step/start" => {
                let w: wire::Step = f(data)?;
                Self::StepStart {
                    turn: w.turn,
                    step: w.step,
                }
            }
            "step/end" => {
                let w: wire::Step = f(data)?;
                Self::StepEnd {
                    turn: w.turn,
                    step: w.step,
                }
            }
            "user/message" => Self::UserMessage(f(data)?),
            "assistant/chunk" => {
                let w: wire::Chunk = f(data)?;
                Self::AssistantChunk {
                    turn: w.turn,
                    step: w.step,
                    chunk: w.chunk,
                }
            }
            "assistant/message" => {
                let w: wire::AssistantMessage = f(data)?;
                Self::AssistantMessage {
                    turn: w.turn,
                    step: w.step,
                    message: w.message,
                    usage: w.usage,
                    interrupted: w.interrupted == Some(true),
                }
            }
            "tool/call" => {
                let w: wire::ToolCall = f(data)?;
                Self::ToolCall {
                    turn: w.turn,
                    step: w.step,
                    call_id: w.call_id,
                    name: w.name,
                    arguments: w.arguments,
                }
            }
            "tool/result" => {
                let w: wire::ToolResult = f(data)?;
                Self::ToolResult {
                    turn: w.turn,
                    step: w.step,
                    message: w.message,
                    error: w.error,
                    meta: w.meta,
                }
            }
            "request/header" => {
                let w: wire::RequestHeader = f(data)?;
                Self::RequestHeader {
                    header: w.header,
                    reason: w.reason,
                }
            }
            "request/context" => {
                let w: wire::RequestContext = f(data)?;
                Self::RequestContext {
                    provider: w.provider,
                    model: w.model,
                    context_window: w.context_window,
                }
            }
            "session/end-seed" => {
                f::<wire::Empty>(data)?;
                Self::EndSeed
            }
            "agent/inbox/spliced" => Self::InboxSpliced(f(data)?),
            "sandbox/mode" => {
                let w: wire::Sandbox = f(data)?;
                Self::SandboxMode {
                    mode: w.mode,
                    source: w.source,
                }
            }
            "approval/policy" => {
                let w: wire::Approval = f(data)?;
                Self::ApprovalPolicy {
                    policy: w.policy,
                    source: w.source,
                }
            }
            other => Self::Other {
                kind: other.to_owned(),
                data: Arc::new(data),
            },
        })
    }

    /// The `(turn, step)` this event is scoped to, for step-scoped types.
    pub fn step_scope(&self) -> Option<(u64, u64)> {
        match self {
            Self::StepStart { turn, step }
            | Self::StepEnd { turn, step }
            | Self::AssistantChunk { turn, step, .. }
            | Self::AssistantMessage { turn, step, .. }
            | Self::ToolCall { turn, step, .. }
            | Self::ToolResult { turn, step, .. } => Some((*turn, *step)),
            _ => None,
        }
    }
}

/// One accepted entry of a session log. Immutable once accepted; `seq == index` from 0.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionEvent {
    /// Position in the log (equals the index).
    pub seq: u64,
    /// Epoch milliseconds.
    pub time: u64,
    /// The typed payload.
    pub data: EventData,
    /// Surface metadata (surface types only).
    pub surface: Option<SurfaceMeta>,
    /// Whether a reader that does not recognise the type may skip it.
    pub ignorable: bool,
}

impl SessionEvent {
    /// The event's `type`.
    pub fn type_name(&self) -> &str {
        self.data.type_name()
    }
}

#[derive(Serialize)]
struct WireOut<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    seq: u64,
    time: u64,
    data: Payload<'a>,
    #[serde(rename = "surfaceOp", skip_serializing_if = "Option::is_none")]
    surface_op: Option<&'a SurfaceOp>,
    #[serde(rename = "sourceEventSeqs", skip_serializing_if = "Option::is_none")]
    source_event_seqs: Option<&'a Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignorable: Option<bool>,
}

#[derive(Deserialize)]
struct WireIn {
    #[serde(rename = "type")]
    kind: String,
    seq: u64,
    time: u64,
    data: Value,
    #[serde(rename = "surfaceOp", default)]
    surface_op: Option<SurfaceOp>,
    #[serde(rename = "sourceEventSeqs", default)]
    source_event_seqs: Option<Vec<u64>>,
    #[serde(default)]
    ignorable: Option<bool>,
}

impl Serialize for SessionEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let surface = self.surface.as_ref();
        WireOut {
            kind: self.type_name(),
            seq: self.seq,
            time: self.time,
            data: Payload(&self.data),
            surface_op: surface.and_then(|m| m.surface_op.as_ref()),
            source_event_seqs: surface.and_then(|m| m.source_event_seqs.as_ref()),
            ignorable: self.ignorable.then_some(true),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for SessionEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = WireIn::deserialize(d)?;
        let data = EventData::from_parts(&w.kind, w.data)
            .map_err(|e| D::Error::custom(format!("invalid `{}` payload: {e}", w.kind)))?;
        let surface = if w.surface_op.is_some() || w.source_event_seqs.is_some() {
            Some(SurfaceMeta {
                surface_op: w.surface_op,
                source_event_seqs: w.source_event_seqs,
            })
        } else {
            None
        };
        Ok(Self {
            seq: w.seq,
            time: w.time,
            data,
            surface,
            ignorable: w.ignorable == Some(true),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A cloned plugin-owned event (a cached subagent descriptor appended to every child's log)
    /// shares its payload; the clone still serializes as the original.
    #[test]
    fn cloning_an_other_event_shares_its_payload() {
        let event = EventData::other("subagent/descriptor", json!({"version": 2, "mode": "one-shot"}));
        let clone = event.clone();
        let (EventData::Other { data: a, .. }, EventData::Other { data: b, .. }) = (&event, &clone) else {
            panic!("both are plugin-owned events")
        };
        assert!(Arc::ptr_eq(a, b));
        assert_eq!(clone.to_data(), json!({"version": 2, "mode": "one-shot"}));
    }

    #[test]
    fn envelope_round_trips() {
        for raw in [
            json!({"type": "turn/start", "seq": 0, "time": 5, "data": {"turn": 1}}),
            json!({"type": "session/end-seed", "seq": 3, "time": 5, "data": {}}),
            json!({"type": "user/message", "seq": 1, "time": 5, "data": {"id": "m", "role": "user", "content": [{"type": "text", "text": "hi"}], "source": {"kind": "user"}}, "surfaceOp": "append"}),
            json!({"type": "subagent/descriptor", "seq": 2, "time": 5, "data": {"version": 2, "mode": "one-shot"}}),
            json!({"type": "x/unknown", "seq": 4, "time": 5, "data": [1, "a"], "ignorable": true}),
            json!({"type": "agent/inbox/spliced", "seq": 0, "time": 1, "data": {"target": "next-turn", "start": 0, "removedCount": 1, "inserted": [], "outcome": "canceled"}}),
        ] {
            let ev: SessionEvent = serde_json::from_value(raw.clone()).unwrap();
            assert_eq!(serde_json::to_value(&ev).unwrap(), raw);
        }
    }

    #[test]
    fn present_null_values_survive_a_round_trip() {
        let raw = json!({"type": "tool/result", "seq": 0, "time": 1, "data": {"turn": 1, "step": 1, "message": {"id": "m", "role": "user", "content": [], "source": {"kind": "tool", "callId": "c"}}, "meta": null}, "surfaceOp": "append"});
        let ev: SessionEvent = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(serde_json::to_value(&ev).unwrap(), raw);
    }

    /// The borrowed payload view renders every typed variant in the shape `from_parts` reads
    /// back (and optional fields are omitted, never `null`).
    #[test]
    fn every_typed_payload_round_trips_through_its_rendering() {
        let usage = TokenUsage {
            input_tokens: 3,
            output_tokens: 4,
            cache_read_tokens: Some(1),
            cache_write_tokens: None,
            reasoning_tokens: None,
        };
        let header = EpochHeader {
            config: CallConfig {
                provider: "p".into(),
                model: "m".into(),
                temperature: Some(0.5),
                ..CallConfig::default()
            },
            adapter_defaults: Some(json!({"temperature": true})),
            system: Some("sys".into()),
            tools: Some(vec![ToolSchema {
                name: "read".into(),
                description: "reads".into(),
                parameters: json!({"type": "object"}),
            }]),
        };
        let all = [
            EventData::TurnStart { turn: 1 },
            EventData::TurnEnd {
                turn: 1,
                reason: TurnEndReason::Completed,
            },
            EventData::StepStart { turn: 1, step: 2 },
            EventData::StepEnd { turn: 1, step: 2 },
            EventData::UserMessage(Message::user_text("hi")),
            EventData::AssistantChunk {
                turn: 1,
                step: 1,
                chunk: StreamChunk::Usage { usage: usage.clone() },
            },
            EventData::AssistantMessage {
                turn: 1,
                step: 1,
                message: Message::assistant(vec![], "p", "m"),
                usage: Some(Box::new(usage)),
                interrupted: true,
            },
            EventData::AssistantMessage {
                turn: 1,
                step: 1,
                message: Message::assistant(vec![], "p", "m"),
                usage: None,
                interrupted: false,
            },
            EventData::ToolCall {
                turn: 1,
                step: 1,
                call_id: "c".into(),
                name: "read".into(),
                arguments: "{}".into(),
            },
            EventData::ToolResult {
                turn: 1,
                step: 1,
                message: Message::tool_result("c".into(), vec![], true),
                error: Some(Box::new(ToolResultError {
                    name: "ToolError".into(),
                    code: "X".into(),
                })),
                meta: Some(Box::new(Value::Null)),
            },
            EventData::RequestHeader {
                header: Box::new(header),
                reason: RequestHeaderReason::Initial,
            },
            EventData::RequestContext {
                provider: "p".into(),
                model: "m".into(),
                context_window: Some(8),
            },
            EventData::EndSeed,
            EventData::InboxSpliced(InboxSplice {
                target: InboxTarget::NextStep,
                start: 0,
                removed_count: Some(1),
                inserted: vec![],
                outcome: Some(SpliceOutcome::Canceled),
            }),
            EventData::SandboxMode {
                mode: "read-only".into(),
                source: Some("delegation".into()),
            },
            EventData::ApprovalPolicy {
                policy: "never".into(),
                source: None,
            },
            EventData::other("x/y", json!([1, {"a": null}])),
        ];
        // The typed names are exactly the typed variants' (a plugin event may use none).
        let mut names: Vec<&str> = all
            .iter()
            .map(EventData::type_name)
            .filter(|n| *n != "x/y")
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut typed = TYPED_TYPES.to_vec();
        typed.sort_unstable();
        assert_eq!(names, typed);
        for kind in TYPED_TYPES {
            assert!(
                !matches!(
                    EventData::from_parts(kind, Value::Null),
                    Ok(EventData::Other { .. })
                ),
                "{kind}"
            );
        }
        for data in all {
            let rendered = data.to_data();
            assert_eq!(serde_json::to_value(data.payload()).unwrap(), rendered);
            let back = EventData::from_parts(data.type_name(), rendered.clone()).unwrap();
            assert_eq!(back, data, "{rendered}");
        }
        let bare = EventData::AssistantMessage {
            turn: 1,
            step: 1,
            message: Message::assistant(vec![], "p", "m"),
            usage: None,
            interrupted: false,
        };
        let rendered = bare.to_data();
        assert!(rendered.get("usage").is_none() && rendered.get("interrupted").is_none());
    }

    /// A logged float reads back as the same number: an event written as a line and read back
    /// (a persisted log reloaded, a seed copied through JSON) serializes to the same line.
    /// `serde_json`'s default float parser is off by one unit in the last place for about one
    /// in ten shortest renderings of 17 significant digits, so without its `float_roundtrip`
    /// parser a tool's metadata, an adapter's replay state or a request temperature changed on
    /// every reload — and the stored value was no longer what later readers see.
    ///
    /// spec: agent-spine §4.2 rule 2 (lossless JSON; the stored value is what readers see)
    #[test]
    fn floats_survive_a_written_and_reread_line() {
        // Shortest renderings the default parser reads back one unit off.
        let floats = [985.6906946328695, 955774.9072043791];
        let events = [
            EventData::ToolResult {
                turn: 1,
                step: 1,
                message: Message::tool_result("c".into(), vec![], false),
                error: None,
                meta: Some(Box::new(json!({"score": floats[0], "nested": [floats[1]]}))),
            },
            EventData::RequestHeader {
                header: Box::new(EpochHeader {
                    config: CallConfig {
                        provider: "p".into(),
                        model: "m".into(),
                        temperature: Some(floats[0]),
                        ..CallConfig::default()
                    },
                    ..EpochHeader::default()
                }),
                reason: RequestHeaderReason::Initial,
            },
            EventData::other("x/metric", json!({"value": floats[1]})),
        ];
        for data in events {
            let event = SessionEvent {
                seq: 0,
                time: 1,
                surface: data.is_surface().then(SurfaceMeta::append),
                data,
                ignorable: false,
            };
            let line = serde_json::to_string(&event).unwrap();
            let back: SessionEvent = serde_json::from_str(&line).unwrap();
            assert_eq!(back, event, "{line}");
            assert_eq!(serde_json::to_string(&back).unwrap(), line);
        }
    }

    #[test]
    fn malformed_known_payload_is_an_error() {
        let raw = json!({"type": "turn/start", "seq": 0, "time": 5, "data": {"turn": "one"}});
        let err = serde_json::from_value::<SessionEvent>(raw).unwrap_err();
        assert!(err.to_string().contains("invalid `turn/start` payload"), "{err}");
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod size_tests {
    use super::*;

    /// Every log holds one allocation of an event's size per event, whatever its type: the
    /// large, rare payload parts (a request header, a tool result's error facts and metadata,
    /// an assistant message's usage) are boxed so that they do not set that size for all.
    #[test]
    fn an_event_is_no_wider_than_its_common_payloads_need() {
        assert!(
            std::mem::size_of::<EventData>() <= 184,
            "{}",
            std::mem::size_of::<EventData>()
        );
        assert!(
            std::mem::size_of::<SessionEvent>() <= 256,
            "{}",
            std::mem::size_of::<SessionEvent>()
        );
    }
}
