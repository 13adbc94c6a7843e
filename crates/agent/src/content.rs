//! Content blocks: the parts a [`Message`](crate::Message) is made of.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::ids::CallId;

/// The `type` tags [`ContentBlock`] reads as typed variants (every variant but
/// [`ContentBlock::Other`]'s). A block of another type must use another tag.
pub const CONTENT_BLOCK_TYPES: [&str; 5] = ["text", "reasoning", "image", "tool-call", "tool-result"];

/// One part of a message's content. Serialized with a `type` tag in the spec's kebab-case
/// vocabulary (`text`, `reasoning`, `image`, `tool-call`, `tool-result`).
///
/// The union is open: a block of a type this crate does not know deserializes as
/// [`ContentBlock::Other`] and serializes back unchanged. A block whose `type` is one of
/// [`CONTENT_BLOCK_TYPES`] but whose fields do not fit that type is refused with an error
/// naming the type; it never reads as [`ContentBlock::Other`] (and a session refuses to log an
/// `Other` that names a known type, which would read back as the typed variant).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ContentBlock {
    /// Visible text.
    Text {
        /// The text.
        text: String,
    },
    /// Model thinking, distinct from visible text.
    Reasoning {
        /// The reasoning text.
        text: String,
        /// Adapter-specific extra fields (signatures and the like), kept losslessly.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// An image; the spine treats its fields as opaque.
    Image {
        /// The image fields (`mimeType`, `data`, `url`, …), kept losslessly.
        #[serde(flatten)]
        fields: Map<String, Value>,
    },
    /// A tool call as the model produced it.
    ToolCall {
        /// The call id (may repeat across steps).
        id: CallId,
        /// The tool name.
        name: String,
        /// The raw JSON **string** exactly as the model produced it.
        arguments: String,
    },
    /// The result of a tool call.
    ToolResult {
        /// The call this result answers.
        #[serde(rename = "toolCallId")]
        tool_call_id: CallId,
        /// The result content.
        content: Vec<ContentBlock>,
        /// Whether the call failed.
        #[serde(rename = "isError", default, skip_serializing_if = "Option::is_none")]
        is_error: Option<bool>,
    },
    /// A block type this crate does not know, kept as raw JSON (including its `type`). Its
    /// `type`, if any, is never one of [`CONTENT_BLOCK_TYPES`].
    #[serde(untagged)]
    Other(Map<String, Value>),
}

/// The known block types' wire form, for reading (the same shapes as [`ContentBlock`]'s
/// typed variants, without the catch-all).
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum KnownBlock {
    Text {
        text: String,
    },
    Reasoning {
        text: String,
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    Image {
        #[serde(flatten)]
        fields: Map<String, Value>,
    },
    ToolCall {
        id: CallId,
        name: String,
        arguments: String,
    },
    ToolResult {
        #[serde(rename = "toolCallId")]
        tool_call_id: CallId,
        content: Vec<ContentBlock>,
        #[serde(rename = "isError", default)]
        is_error: Option<bool>,
    },
}

/// Reads one value of an open union tagged by `tag`: an object whose `tag` is one of `known`
/// reads strictly as `K` (the known variants' wire form), and a misfit is an error naming the
/// tag value and `what` the union is; any other object (another tag value, a non-string tag,
/// no tag) is returned as is, for the union's catch-all arm.
pub(crate) fn read_open_union<'de, D, K>(
    deserializer: D,
    tag: &str,
    known: &[&str],
    what: &str,
) -> Result<Result<K, Map<String, Value>>, D::Error>
where
    D: Deserializer<'de>,
    K: serde::de::DeserializeOwned,
{
    use serde::de::Error as _;
    let fields = Map::<String, Value>::deserialize(deserializer)?;
    let kind = match fields.get(tag) {
        Some(Value::String(kind)) if known.contains(&kind.as_str()) => kind.clone(),
        _ => return Ok(Err(fields)),
    };
    K::deserialize(Value::Object(fields))
        .map(Ok)
        .map_err(|e| D::Error::custom(format!("invalid `{kind}` {what}: {e}")))
}

/// For a catch-all arm holding `fields`: the value of its `tag` when that names one of the
/// union's `known` variants (which a log refuses: it would read back as the typed variant).
pub(crate) fn known_tag<'a>(fields: &'a Map<String, Value>, tag: &str, known: &[&str]) -> Option<&'a str> {
    fields
        .get(tag)
        .and_then(Value::as_str)
        .filter(|kind| known.contains(kind))
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let known = match read_open_union(deserializer, "type", &CONTENT_BLOCK_TYPES, "content block")? {
            Ok(known) => known,
            Err(fields) => return Ok(Self::Other(fields)),
        };
        Ok(match known {
            KnownBlock::Text { text } => Self::Text { text },
            KnownBlock::Reasoning { text, extra } => Self::Reasoning { text, extra },
            KnownBlock::Image { fields } => Self::Image { fields },
            KnownBlock::ToolCall { id, name, arguments } => Self::ToolCall { id, name, arguments },
            KnownBlock::ToolResult {
                tool_call_id,
                content,
                is_error,
            } => Self::ToolResult {
                tool_call_id,
                content,
                is_error,
            },
        })
    }
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }

    /// A reasoning block without extra fields.
    pub fn reasoning(text: impl Into<String>) -> Self {
        Self::Reasoning {
            text: text.into(),
            extra: Map::new(),
        }
    }

    /// A tool-call block.
    pub fn tool_call(id: impl Into<CallId>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self::ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// For [`ContentBlock::Other`] whose `type` is one of [`CONTENT_BLOCK_TYPES`] (which a log
    /// refuses: it would read back as the typed variant), that type; otherwise `None`. Looks
    /// at this block only, not into a `tool-result`'s content.
    pub fn other_with_known_type(&self) -> Option<&str> {
        match self {
            Self::Other(fields) => known_tag(fields, "type", &CONTENT_BLOCK_TYPES),
            _ => None,
        }
    }

    /// The visible text of a `text` block, if it is one.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Self::Text { text } => Some(text),
            _ => None,
        }
    }
}

/// Deserializes a present JSON value (including `null`) as `Some`, so `Some(Value::Null)`
/// round-trips; use with `#[serde(default)]` so an absent key stays `None`.
pub fn present_value<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    <serde_json::Value as serde::Deserialize>::deserialize(d).map(Some)
}

/// [`present_value`], boxed: for the rarely present adapter-private fields kept out of line so
/// the types carrying them stay small.
pub fn present_boxed_value<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Box<serde_json::Value>>, D::Error> {
    <serde_json::Value as serde::Deserialize>::deserialize(d).map(|v| Some(Box::new(v)))
}

/// Concatenates the visible text of every `text` block, in order, with no separator.
pub fn visible_text(blocks: &[ContentBlock]) -> String {
    blocks.iter().filter_map(ContentBlock::as_text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn blocks_use_spec_tags() {
        let call = ContentBlock::tool_call("c1", "read", "{\"a\":1}");
        assert_eq!(
            serde_json::to_value(&call).unwrap(),
            json!({"type": "tool-call", "id": "c1", "name": "read", "arguments": "{\"a\":1}"})
        );
        let result = ContentBlock::ToolResult {
            tool_call_id: "c1".into(),
            content: vec![ContentBlock::text("ok")],
            is_error: Some(true),
        };
        assert_eq!(
            serde_json::to_value(&result).unwrap(),
            json!({"type": "tool-result", "toolCallId": "c1", "content": [{"type": "text", "text": "ok"}], "isError": true})
        );
    }

    #[test]
    fn unknown_block_round_trips() {
        let raw = json!({"type": "audio", "data": "xyz", "n": 1});
        let block: ContentBlock = serde_json::from_value(raw.clone()).unwrap();
        assert!(matches!(block, ContentBlock::Other(_)));
        assert_eq!(serde_json::to_value(&block).unwrap(), raw);
    }

    #[test]
    fn reasoning_keeps_extra_fields() {
        let raw = json!({"type": "reasoning", "text": "hm", "signature": "s"});
        let block: ContentBlock = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(serde_json::to_value(&block).unwrap(), raw);
    }
}
