//! The losslessness check of the append contract (spec §4.2 rule 2), as a structural walk.
//!
//! [`check`] drives a value's `Serialize` implementation through a serializer that builds
//! nothing: it only looks at the numbers going by. That is the same walk
//! `serde_json::to_value` does, so every field a JSON rendering of the value would contain is
//! seen, typed fields and embedded [`serde_json::Value`]s alike, without allocating a `Value`
//! tree per append. The success path does not allocate at all; the path to an offending number
//! is assembled only while an error unwinds.
//!
//! A number is lossless unless it is a float that is negative zero or not finite. Paths use the
//! JSON shape `serde_json::to_value` would produce: `.key` for struct fields and map entries
//! (and for the variant wrapper of externally tagged enum variants), `[i]` for sequence and
//! tuple elements, `$` for the root.

use std::fmt;

use serde::Serialize;
use serde::ser::{self, Impossible};

use crate::content::ContentBlock;
use crate::event::EventData;
use crate::message::{Message, MessageSource, PluginForm};
use crate::model::{FinishReason, StreamChunk};
use crate::signal::CancelCause;
use crate::turn::TurnEndReason;

/// One step of the path to the offending number.
enum Segment {
    Key(String),
    Index(usize),
}

/// Why a value is not lossless.
#[derive(Debug)]
pub(super) struct Fault {
    /// What is wrong, without the path.
    what: What,
    /// Rendered path segments, innermost first (they are added while the error unwinds).
    path: Vec<String>,
}

#[derive(Debug)]
enum What {
    Float(f64),
    Unserializable(String),
    /// A container opened where the reader's nesting budget was spent.
    TooDeep(usize),
    /// An object rendered with the same key twice (a flattened map naming a key of the
    /// fields around it): a JSON reader keeps one of them, so the value reads back changed.
    DuplicateKey(String),
}

impl Fault {
    fn at(mut self, segment: Segment) -> Self {
        self.path.push(match segment {
            Segment::Key(k) => format!(".{k}"),
            Segment::Index(i) => format!("[{i}]"),
        });
        self
    }

    fn path(&self) -> String {
        if self.path.is_empty() {
            return "$".to_owned();
        }
        self.path.iter().rev().map(String::as_str).collect()
    }

    /// The human-readable reason, in the wording of [`check_lossless_json`](super::check_lossless_json).
    pub(super) fn reason(&self) -> String {
        match &self.what {
            What::Float(f) => {
                let shown = serde_json::Number::from_f64(*f).map_or_else(|| f.to_string(), |n| n.to_string());
                format!("{shown} at `{}` is not lossless", self.path())
            }
            What::Unserializable(msg) => {
                format!("value at `{}` is not JSON-serializable: {msg}", self.path())
            }
            What::TooDeep(limit) => format!(
                "value at `{}` nests deeper than {limit} levels, which a JSON reader refuses",
                self.path()
            ),
            What::DuplicateKey(key) => format!(
                "object at `{}` renders key `{key}` twice, which a JSON reader reads back as another value",
                self.path()
            ),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason())
    }
}

impl std::error::Error for Fault {}

impl ser::Error for Fault {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self {
            what: What::Unserializable(msg.to_string()),
            path: Vec::new(),
        }
    }
}

/// Whether `data`'s payload is certainly lossless, decided without driving its `Serialize`
/// implementation: only the places a float (or deep nesting) can hide are visited (embedded
/// [`serde_json::Value`]s, open-union maps, nested `tool-result` blocks and the one typed
/// float, the request temperature); every other field is a string, integer, boolean or closed
/// enum and can never be at fault.
///
/// `true` means the full walk ([`check`]) would find nothing, and neither would
/// [`misnamed_other`]. `false` means "not certain": the caller runs both walks, which decide
/// and, on a fault, name its path. So this fast path
/// can change cost, never verdicts or error texts. The matches below are exhaustive on purpose:
/// a new variant or field shape must be classified here before the crate compiles.
pub(super) fn plainly_lossless(data: &EventData) -> bool {
    match data {
        EventData::TurnStart { .. }
        | EventData::StepStart { .. }
        | EventData::StepEnd { .. }
        | EventData::ToolCall { .. }
        | EventData::RequestContext { .. }
        | EventData::EndSeed
        | EventData::SandboxMode { .. }
        | EventData::ApprovalPolicy { .. } => true,
        EventData::TurnEnd { reason, .. } => turn_end_reason(reason),
        EventData::UserMessage(message) | EventData::AssistantMessage { message, .. } => {
            plain_message(message)
        }
        EventData::AssistantChunk { chunk, .. } => plain_chunk(chunk),
        EventData::ToolResult { message, meta, .. } => {
            plain_message(message) && meta.as_deref().is_none_or(plain_value)
        }
        EventData::RequestHeader { header, .. } => {
            header.config.temperature.is_none_or(plain_float)
                && header.adapter_defaults.as_ref().is_none_or(plain_value)
                && header
                    .tools
                    .as_ref()
                    .is_none_or(|tools| tools.iter().all(|t| plain_value(&t.parameters)))
        }
        EventData::InboxSpliced(splice) => splice.inserted.iter().all(plain_message),
        EventData::Other { data, .. } => plain_value(data),
    }
}

/// Whether `data` is one of the typed non-surface events whose payload certainly holds no lossy
/// float (boundaries, tool calls, request context, status events, turn ends with a known
/// reason, plain stream chunks and inbox splices). A subset of [`plainly_lossless`].
#[inline(always)]
pub(super) fn plain_non_surface(data: &EventData) -> bool {
    match data {
        EventData::TurnStart { .. }
        | EventData::StepStart { .. }
        | EventData::StepEnd { .. }
        | EventData::ToolCall { .. }
        | EventData::RequestContext { .. }
        | EventData::EndSeed
        | EventData::SandboxMode { .. }
        | EventData::ApprovalPolicy { .. } => true,
        EventData::TurnEnd { reason, .. } => !matches!(
            reason,
            TurnEndReason::Other(_)
                | TurnEndReason::Aborted {
                    reason: CancelCause::Unknown(_)
                }
        ),
        EventData::AssistantChunk { chunk, .. } => plain_chunk(chunk),
        EventData::InboxSpliced(splice) => splice.inserted.iter().all(plain_message),
        _ => false,
    }
}

fn plain_chunk(chunk: &StreamChunk) -> bool {
    match chunk {
        StreamChunk::BlockStart { .. }
        | StreamChunk::TextDelta { .. }
        | StreamChunk::ReasoningDelta { .. }
        | StreamChunk::ToolCallDelta { .. }
        | StreamChunk::Usage { .. } => true,
        StreamChunk::BlockEnd { block, .. } => plain_block(block),
        StreamChunk::Finish { reason, replay_state } => {
            finish_reason(reason) && replay_state.as_deref().is_none_or(plain_value)
        }
    }
}

fn plain_float(f: f64) -> bool {
    float(f).is_ok()
}

/// How deeply an embedded JSON value (or open-union map) may nest and still be certain on the
/// fast path, and how many `tool-result` blocks may nest inside one another. The typed fields
/// around an embedded value add at most 6 levels to an event's `data`, and each nested
/// `tool-result` 2, so a payload the fast path calls plain nests at most
/// 6 + 2 × [`PLAIN_RESULT_NESTING`] + [`PLAIN_DEPTH`] = 102 levels: well inside what a reader
/// accepts. Anything deeper is walked, and the walk counts exactly.
const PLAIN_DEPTH: usize = 64;

/// See [`PLAIN_DEPTH`].
const PLAIN_RESULT_NESTING: usize = 16;

/// Whether a JSON value is certainly lossless (no negative-zero float) and shallow enough to
/// be read back; `false` means "walk it".
pub(super) fn plain_value(value: &serde_json::Value) -> bool {
    plain_value_within(value, PLAIN_DEPTH)
}

/// [`plain_value`] for a value with `budget` levels of containers left.
fn plain_value_within(value: &serde_json::Value, budget: usize) -> bool {
    use serde_json::Value;
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => true,
        // Integers always pass; a float is checked like the walk checks it.
        Value::Number(n) => !n.is_f64() || n.as_f64().is_some_and(plain_float),
        Value::Array(items) => budget > 0 && items.iter().all(|item| plain_value_within(item, budget - 1)),
        Value::Object(map) => plain_map_within(map, budget),
    }
}

fn plain_map(map: &serde_json::Map<String, serde_json::Value>) -> bool {
    plain_map_within(map, PLAIN_DEPTH)
}

fn plain_map_within(map: &serde_json::Map<String, serde_json::Value>, budget: usize) -> bool {
    budget > 0 && map.values().all(|v| plain_value_within(v, budget - 1))
}

fn plain_message(message: &Message) -> bool {
    message.content.iter().all(plain_block)
        && match &message.source {
            MessageSource::User => true,
            MessageSource::Plugin { form, .. } => match form {
                None
                | Some(
                    PluginForm::Instructions
                    | PluginForm::Catalog
                    | PluginForm::Snapshot { .. }
                    | PluginForm::Notice { .. }
                    | PluginForm::Relay
                    | PluginForm::Recall,
                ) => true,
                // An `Other` naming a known type is refused by the open-union check: not plain.
                Some(form @ PluginForm::Other(map)) => {
                    plain_map(map) && form.other_with_known_type().is_none()
                }
            },
            MessageSource::Model { replay_state, .. } => replay_state.as_deref().is_none_or(plain_value),
            MessageSource::Tool { extra, .. } => {
                plain_map(extra) && !extra.contains_key("kind") && !extra.contains_key("callId")
            }
            // An `Other` naming a known kind is refused by the open-union check: not plain.
            MessageSource::Other(map) => plain_map(map) && message.source.other_with_known_kind().is_none(),
        }
}

fn plain_block(block: &ContentBlock) -> bool {
    plain_block_within(block, PLAIN_RESULT_NESTING)
}

/// [`plain_block`] with `nesting` more `tool-result` levels allowed.
fn plain_block_within(block: &ContentBlock, nesting: usize) -> bool {
    match block {
        ContentBlock::Text { .. } | ContentBlock::ToolCall { .. } => true,
        // A flattened map naming a field of its own block renders that key twice: walk it.
        ContentBlock::Reasoning { extra, .. } => {
            plain_map(extra) && !extra.contains_key("type") && !extra.contains_key("text")
        }
        ContentBlock::Image { fields } => plain_map(fields) && !fields.contains_key("type"),
        ContentBlock::ToolResult { content, .. } => {
            nesting > 0 && content.iter().all(|b| plain_block_within(b, nesting - 1))
        }
        // An `Other` naming a known type is refused by the open-union check: not plain.
        ContentBlock::Other(map) => plain_map(map) && block.other_with_known_type().is_none(),
    }
}

fn turn_end_reason(reason: &TurnEndReason) -> bool {
    // A catch-all naming a known kind is refused by the open-union check: not plain.
    if reason.other_with_known_kind().is_some() {
        return false;
    }
    match reason {
        TurnEndReason::Completed
        | TurnEndReason::Blocked
        | TurnEndReason::Error { .. }
        | TurnEndReason::MaxTokens
        | TurnEndReason::Interrupted => true,
        TurnEndReason::Aborted { reason } => match reason {
            CancelCause::User
            | CancelCause::Parent
            | CancelCause::Hook { .. }
            | CancelCause::Disposed
            | CancelCause::Legacy
            | CancelCause::Other { .. } => true,
            CancelCause::Unknown(map) => plain_map(map),
        },
        TurnEndReason::Other(map) => plain_map(map),
    }
}

fn finish_reason(reason: &FinishReason) -> bool {
    match reason {
        FinishReason::Stop
        | FinishReason::ToolCalls
        | FinishReason::MaxTokens
        | FinishReason::Aborted { .. }
        | FinishReason::Error { .. } => true,
        // An `Unknown` naming a known kind is refused by the open-union check: not plain.
        FinishReason::Unknown { kind, fields } => {
            plain_map(fields) && !crate::model::KNOWN_FINISH_KINDS.contains(&kind.as_str())
        }
    }
}

/// The first catch-all arm of an open union in `data` that names one of the union's known tags
/// (a [`ContentBlock::Other`] whose `type` is `text`, a [`MessageSource::Other`] whose `kind`
/// is `user`, a [`PluginForm::Other`], [`TurnEndReason::Other`], [`CancelCause::Unknown`] or
/// [`FinishReason::Unknown`] spelling a known variant), as a refusal reason with its path in
/// the payload. Such a value renders as the typed variant's JSON (or as a malformed one), so
/// the logged line would read back as another value, or not at all (spine §3, §4.2 rule 2).
/// Like [`check`], the path is assembled only on a hit: the walk allocates nothing otherwise.
pub(super) fn misnamed_other(data: &EventData) -> Option<String> {
    let found = match data {
        EventData::TurnEnd { reason, .. } => reason.other_with_known_kind().map(|kind| match reason {
            TurnEndReason::Aborted { .. } => Misnamed::new("cancel cause", "kind", kind)
                .at(".reason")
                .at(".reason"),
            _ => Misnamed::new("turn-end reason", "kind", kind).at(".reason"),
        }),
        EventData::UserMessage(message) => misnamed_in_message(message),
        EventData::AssistantMessage { message, .. } | EventData::ToolResult { message, .. } => {
            misnamed_in_message(message).map(|m| m.at(".message"))
        }
        EventData::InboxSpliced(splice) => {
            misnamed_in_message_list(&splice.inserted).map(|m| m.at(".inserted"))
        }
        EventData::AssistantChunk {
            chunk: StreamChunk::BlockEnd { block, .. },
            ..
        } => misnamed_in_block(block).map(|m| m.at(".block").at(".chunk")),
        EventData::AssistantChunk {
            chunk:
                StreamChunk::Finish {
                    reason: FinishReason::Unknown { kind, .. },
                    ..
                },
            ..
        } if crate::model::KNOWN_FINISH_KINDS.contains(&kind.as_str()) => Some(
            Misnamed::new("finish reason", "kind", kind)
                .at(".reason")
                .at(".chunk"),
        ),
        _ => None,
    };
    found.map(|m| m.reason())
}

/// [`misnamed_other`] for `messages` (paths relative to the list).
pub(super) fn misnamed_in_messages(messages: &[Message]) -> Option<String> {
    misnamed_in_message_list(messages).map(|m| m.reason())
}

/// [`misnamed_other`] for `blocks` (paths relative to the list).
pub(super) fn misnamed_in_blocks(blocks: &[ContentBlock]) -> Option<String> {
    misnamed_in_block_list(blocks).map(|m| m.reason())
}

/// A catch-all arm naming a known tag, found by the open-union walk.
struct Misnamed {
    what: &'static str,
    tag: &'static str,
    kind: String,
    /// Path segments, innermost first (added while the walk returns).
    path: Vec<Step>,
}

/// One segment of a [`Misnamed`] path.
enum Step {
    Key(&'static str),
    Index(usize),
}

impl Misnamed {
    #[cold]
    #[inline(never)]
    fn new(what: &'static str, tag: &'static str, kind: &str) -> Self {
        Self {
            what,
            tag,
            kind: kind.to_owned(),
            path: Vec::new(),
        }
    }

    fn at(mut self, key: &'static str) -> Self {
        self.path.push(Step::Key(key));
        self
    }

    fn at_index(mut self, index: usize) -> Self {
        self.path.push(Step::Index(index));
        self
    }

    fn reason(&self) -> String {
        let mut path: String = self
            .path
            .iter()
            .rev()
            .map(|step| match step {
                Step::Key(key) => (*key).to_owned(),
                Step::Index(i) => format!("[{i}]"),
            })
            .collect();
        if path.is_empty() {
            path.push('$');
        }
        let (what, tag, kind) = (self.what, self.tag, &self.kind);
        format!(
            "the unknown-{tag} {what} at `{path}` names the known {tag} `{kind}`; \
             it would read back as a `{kind}` {what}, not as the value appended"
        )
    }
}

fn misnamed_in_message_list(messages: &[Message]) -> Option<Misnamed> {
    messages
        .iter()
        .enumerate()
        .find_map(|(i, message)| misnamed_in_message(message).map(|m| m.at_index(i)))
}

fn misnamed_in_block_list(blocks: &[ContentBlock]) -> Option<Misnamed> {
    blocks
        .iter()
        .enumerate()
        .find_map(|(i, block)| misnamed_in_block(block).map(|m| m.at_index(i)))
}

fn misnamed_in_message(message: &Message) -> Option<Misnamed> {
    let source = match &message.source {
        MessageSource::Plugin { form: Some(form), .. } => form
            .other_with_known_type()
            .map(|kind| Misnamed::new("plugin form", "type", kind).at(".form")),
        source => source
            .other_with_known_kind()
            .map(|kind| Misnamed::new("message source", "kind", kind)),
    };
    match source {
        Some(found) => Some(found.at(".source")),
        None => misnamed_in_block_list(&message.content).map(|m| m.at(".content")),
    }
}

fn misnamed_in_block(block: &ContentBlock) -> Option<Misnamed> {
    match block {
        ContentBlock::ToolResult { content, .. } => misnamed_in_block_list(content).map(|m| m.at(".content")),
        _ => block
            .other_with_known_type()
            .map(|kind| Misnamed::new("content block", "type", kind)),
    }
}

/// The deepest nesting of arrays and objects `serde_json` reads back (its parser refuses a
/// 128th level): a rendering nested deeper is written fine but can never be read again.
pub(super) const MAX_READABLE_DEPTH: usize = 127;

/// Walks `value`'s serialization; `Err` names the first number that is not lossless, or the
/// first container nested deeper than `max_depth` levels (counting `value`'s own).
pub(super) fn check<T: Serialize + ?Sized>(value: &T, max_depth: usize) -> Result<(), Fault> {
    value.serialize(Walker {
        budget: max_depth,
        limit: max_depth,
    })
}

fn float(f: f64) -> Result<(), Fault> {
    if (f == 0.0 && f.is_sign_negative()) || !f.is_finite() {
        return Err(Fault {
            what: What::Float(f),
            path: Vec::new(),
        });
    }
    Ok(())
}

fn keyed<T: Serialize + ?Sized>(walker: Walker, key: &str, value: &T) -> Result<(), Fault> {
    value
        .serialize(walker)
        .map_err(|e| e.at(Segment::Key(key.to_owned())))
}

/// The walking serializer: it produces nothing and fails on the first lossy number or the
/// first container opened with no nesting budget left.
#[derive(Clone, Copy)]
struct Walker {
    /// How many more levels of arrays and objects may open here.
    budget: usize,
    /// The whole budget, for the error text.
    limit: usize,
}

impl Walker {
    /// The walker for what lies inside `levels` newly opened containers (a variant wrapper
    /// object and its body are two), or the fault when that is deeper than the budget.
    fn open(self, levels: usize) -> Result<Self, Fault> {
        match self.budget.checked_sub(levels) {
            Some(budget) => Ok(Self { budget, ..self }),
            None => Err(Fault {
                what: What::TooDeep(self.limit),
                path: Vec::new(),
            }),
        }
    }
}

/// A sequence, tuple or tuple-variant body (counts elements for the path).
struct Seq {
    /// The walker for the elements.
    inner: Walker,
    /// The variant wrapper of a tuple variant, if any.
    variant: Option<&'static str>,
    next: usize,
}

/// A map body; `key` holds the rendered key between `serialize_key` and `serialize_value`.
struct Map {
    /// The walker for the values.
    inner: Walker,
    key: Option<String>,
    /// The keys rendered so far, for a map whose length was not announced: that is how serde
    /// renders a struct with a `#[serde(flatten)]` map (its fields, then the map's entries),
    /// the one shape in which a key can be written twice. (Maps of announced length — JSON
    /// objects, `BTreeMap`s — hold distinct keys by construction and are not tracked.)
    seen: Option<std::collections::HashSet<String>>,
}

impl Map {
    /// Records `key` (already checked to be a valid key) when keys are tracked; a repeated
    /// key is a fault.
    fn record<K: Serialize + ?Sized>(&mut self, key: &K) -> Result<(), Fault> {
        if let Some(seen) = &mut self.seen {
            let key = key.serialize(KeyText)?;
            if let Some(key) = seen.replace(key) {
                return Err(Fault {
                    what: What::DuplicateKey(key),
                    path: Vec::new(),
                });
            }
        }
        Ok(())
    }
}

/// A struct or struct-variant body.
struct Struct {
    /// The walker for the fields.
    inner: Walker,
    variant: Option<&'static str>,
}

impl Seq {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fault> {
        let index = self.next;
        self.next += 1;
        value.serialize(self.inner).map_err(|e| {
            let e = e.at(Segment::Index(index));
            match self.variant {
                Some(v) => e.at(Segment::Key(v.to_owned())),
                None => e,
            }
        })
    }
}

impl Struct {
    fn field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Fault> {
        keyed(self.inner, key, value).map_err(|e| match self.variant {
            Some(v) => e.at(Segment::Key(v.to_owned())),
            None => e,
        })
    }
}

macro_rules! accept {
    ($($name:ident($ty:ty)),* $(,)?) => {
        $(fn $name(self, _: $ty) -> Result<(), Fault> { Ok(()) })*
    };
}

impl ser::Serializer for Walker {
    type Ok = ();
    type Error = Fault;
    type SerializeSeq = Seq;
    type SerializeTuple = Seq;
    type SerializeTupleStruct = Seq;
    type SerializeTupleVariant = Seq;
    type SerializeMap = Map;
    type SerializeStruct = Struct;
    type SerializeStructVariant = Struct;

    accept!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
    );

    fn serialize_i128(self, v: i128) -> Result<(), Fault> {
        if i64::try_from(v).is_ok() || u64::try_from(v).is_ok() {
            Ok(())
        } else {
            Err(ser::Error::custom("number out of range"))
        }
    }

    fn serialize_u128(self, v: u128) -> Result<(), Fault> {
        if u64::try_from(v).is_ok() {
            Ok(())
        } else {
            Err(ser::Error::custom("number out of range"))
        }
    }

    fn serialize_f32(self, v: f32) -> Result<(), Fault> {
        float(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<(), Fault> {
        float(v)
    }

    fn serialize_none(self) -> Result<(), Fault> {
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Fault> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), Fault> {
        Ok(())
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<(), Fault> {
        Ok(())
    }

    fn serialize_unit_variant(self, _: &'static str, _: u32, _: &'static str) -> Result<(), Fault> {
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<(), Fault> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Fault> {
        // Rendered `{variant: value}`: the wrapper object is one level.
        keyed(self.open(1)?, variant, value)
    }

    fn serialize_seq(self, _: Option<usize>) -> Result<Seq, Fault> {
        Ok(Seq {
            inner: self.open(1)?,
            variant: None,
            next: 0,
        })
    }

    fn serialize_tuple(self, _: usize) -> Result<Seq, Fault> {
        self.serialize_seq(None)
    }

    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Seq, Fault> {
        self.serialize_seq(None)
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Seq, Fault> {
        // Rendered `{variant: [...]}`: two levels.
        Ok(Seq {
            inner: self.open(2)?,
            variant: Some(variant),
            next: 0,
        })
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Map, Fault> {
        Ok(Map {
            inner: self.open(1)?,
            key: None,
            seen: len.is_none().then(std::collections::HashSet::new),
        })
    }

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Struct, Fault> {
        Ok(Struct {
            inner: self.open(1)?,
            variant: None,
        })
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        _: usize,
    ) -> Result<Struct, Fault> {
        // Rendered `{variant: {...}}`: two levels.
        Ok(Struct {
            inner: self.open(2)?,
            variant: Some(variant),
        })
    }

    fn collect_str<T: fmt::Display + ?Sized>(self, _: &T) -> Result<(), Fault> {
        Ok(())
    }
}

/// The compound serializers whose entries all go one way: a sequence's elements (of a seq,
/// tuple, tuple struct or tuple variant) to [`Seq::element`], a struct's fields (of a struct or
/// struct variant) to [`Struct::field`]. Ending one checks nothing more.
macro_rules! forward_compound {
    ($ty:ident: $trait:ident::$method:ident => $target:ident) => {
        impl ser::$trait for $ty {
            type Ok = ();
            type Error = Fault;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fault> {
                self.$target(value)
            }

            fn end(self) -> Result<(), Fault> {
                Ok(())
            }
        }
    };
    ($ty:ident: $trait:ident::$method:ident(key) => $target:ident) => {
        impl ser::$trait for $ty {
            type Ok = ();
            type Error = Fault;

            fn $method<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Fault> {
                self.$target(key, value)
            }

            fn end(self) -> Result<(), Fault> {
                Ok(())
            }
        }
    };
}

forward_compound!(Seq: SerializeSeq::serialize_element => element);
forward_compound!(Seq: SerializeTuple::serialize_element => element);
forward_compound!(Seq: SerializeTupleStruct::serialize_field => element);
forward_compound!(Seq: SerializeTupleVariant::serialize_field => element);

impl ser::SerializeMap for Map {
    type Ok = ();
    type Error = Fault;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Fault> {
        self.key = Some(key.serialize(KeyText)?);
        self.record(key)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fault> {
        let key = self.key.take().unwrap_or_default();
        value.serialize(self.inner).map_err(|e| e.at(Segment::Key(key)))
    }

    fn serialize_entry<K: Serialize + ?Sized, V: Serialize + ?Sized>(
        &mut self,
        key: &K,
        value: &V,
    ) -> Result<(), Fault> {
        // The key is rendered only when the value is at fault (the common case allocates
        // nothing); it must still be a valid JSON object key.
        key.serialize(KeyCheck)?;
        self.record(key)?;
        value.serialize(self.inner).map_err(|e| {
            let key = key.serialize(KeyText).unwrap_or_default();
            e.at(Segment::Key(key))
        })
    }

    fn end(self) -> Result<(), Fault> {
        Ok(())
    }
}

forward_compound!(Struct: SerializeStruct::serialize_field(key) => field);
forward_compound!(Struct: SerializeStructVariant::serialize_field(key) => field);

fn key_must_be_a_string() -> Fault {
    ser::Error::custom("key must be a string")
}

/// Map keys as `serde_json` accepts them: strings, chars, booleans, integers, finite floats,
/// unit variants and newtype wrappers of those. Generic over what it returns so the same rules
/// serve the allocation-free check ([`KeyCheck`]) and the rendering for paths ([`KeyText`]).
macro_rules! key_serializer {
    ($name:ident, $ok:ty, |$s:ident| $text:expr) => {
        impl ser::Serializer for $name {
            type Ok = $ok;
            type Error = Fault;
            type SerializeSeq = Impossible<$ok, Fault>;
            type SerializeTuple = Impossible<$ok, Fault>;
            type SerializeTupleStruct = Impossible<$ok, Fault>;
            type SerializeTupleVariant = Impossible<$ok, Fault>;
            type SerializeMap = Impossible<$ok, Fault>;
            type SerializeStruct = Impossible<$ok, Fault>;
            type SerializeStructVariant = Impossible<$ok, Fault>;

            fn serialize_bool(self, v: bool) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_i8(self, v: i8) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_i16(self, v: i16) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_i32(self, v: i32) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_i64(self, v: i64) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_i128(self, v: i128) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_u8(self, v: u8) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_u16(self, v: u16) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_u32(self, v: u32) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_u64(self, v: u64) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_u128(self, v: u128) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_f32(self, v: f32) -> Result<$ok, Fault> {
                self.serialize_f64(f64::from(v))
            }
            fn serialize_f64(self, v: f64) -> Result<$ok, Fault> {
                if !v.is_finite() {
                    return Err(key_must_be_a_string());
                }
                let $s = &v;
                Ok($text)
            }
            fn serialize_char(self, v: char) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_str(self, v: &str) -> Result<$ok, Fault> {
                let $s = &v;
                Ok($text)
            }
            fn serialize_bytes(self, _: &[u8]) -> Result<$ok, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_none(self) -> Result<$ok, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_some<T: Serialize + ?Sized>(self, _: &T) -> Result<$ok, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_unit(self) -> Result<$ok, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_unit_struct(self, _: &'static str) -> Result<$ok, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_unit_variant(
                self,
                _: &'static str,
                _: u32,
                variant: &'static str,
            ) -> Result<$ok, Fault> {
                self.serialize_str(variant)
            }
            fn serialize_newtype_struct<T: Serialize + ?Sized>(
                self,
                _: &'static str,
                value: &T,
            ) -> Result<$ok, Fault> {
                value.serialize(self)
            }
            fn serialize_newtype_variant<T: Serialize + ?Sized>(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: &T,
            ) -> Result<$ok, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_tuple_struct(
                self,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeTupleStruct, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_tuple_variant(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeTupleVariant, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Fault> {
                Err(key_must_be_a_string())
            }
            fn serialize_struct_variant(
                self,
                _: &'static str,
                _: u32,
                _: &'static str,
                _: usize,
            ) -> Result<Self::SerializeStructVariant, Fault> {
                Err(key_must_be_a_string())
            }
        }
    };
}

/// Validates a map key without rendering it.
struct KeyCheck;
key_serializer!(KeyCheck, (), |_v| ());

/// Renders a map key for an error path.
struct KeyText;
key_serializer!(KeyText, String, |v| v.to_string());

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reason<T: Serialize>(v: &T) -> Option<String> {
        check(v, MAX_READABLE_DEPTH).err().map(|f| f.reason())
    }

    #[test]
    fn values_match_the_value_walk() {
        assert_eq!(reason(&json!({"a": [1, 2.5, {"b": -1}]})), None);
        assert_eq!(
            reason(&json!(-0.0)).as_deref(),
            Some("-0.0 at `$` is not lossless")
        );
        assert_eq!(
            reason(&json!({"a": [1, {"b": -0.0}]})).as_deref(),
            Some("-0.0 at `.a[1].b` is not lossless")
        );
    }

    #[test]
    fn typed_floats_and_variants_are_walked() {
        #[derive(Serialize)]
        enum E {
            New(f64),
            Tuple(u8, f64),
            Struct { x: f64 },
        }
        #[derive(Serialize)]
        struct S {
            list: Vec<E>,
            map: std::collections::BTreeMap<u32, f32>,
        }
        let ok = S {
            list: vec![E::New(1.0), E::Tuple(1, 0.0), E::Struct { x: 2.0 }],
            map: [(7, 1.5)].into(),
        };
        assert_eq!(reason(&ok), None);
        let bad = |list, map: &[(u32, f32)]| S {
            list,
            map: map.iter().copied().collect(),
        };
        assert_eq!(
            reason(&bad(vec![E::Tuple(1, f64::NAN)], &[])).as_deref(),
            Some("NaN at `.list[0].Tuple[1]` is not lossless")
        );
        assert_eq!(
            reason(&bad(vec![E::New(-0.0)], &[])).as_deref(),
            Some("-0.0 at `.list[0].New` is not lossless")
        );
        assert_eq!(
            reason(&bad(vec![E::Struct { x: f64::INFINITY }], &[])).as_deref(),
            Some("inf at `.list[0].Struct.x` is not lossless")
        );
        assert_eq!(
            reason(&bad(vec![], &[(7, -0.0)])).as_deref(),
            Some("-0.0 at `.map.7` is not lossless")
        );
    }

    #[test]
    fn non_string_keys_are_refused() {
        let map: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert_eq!(
            reason(&map).as_deref(),
            Some("value at `$` is not JSON-serializable: key must be a string")
        );
    }
}
