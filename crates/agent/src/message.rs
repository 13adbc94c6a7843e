//! Messages and their provenance.

use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::content::{ContentBlock, known_tag, read_open_union};
use crate::ids::{CallId, MessageId};

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// System text.
    System,
    /// The user (or a tool result, which travels as a user-role message).
    User,
    /// The model.
    Assistant,
}

/// One immutable message. Helpers mint the id; once created a message is never changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Stable identity of this message.
    pub id: MessageId,
    /// Who speaks it.
    pub role: Role,
    /// Its content, in order.
    pub content: Vec<ContentBlock>,
    /// Where it came from.
    pub source: MessageSource,
}

impl Message {
    /// A user-role message with a fresh id.
    pub fn user(content: Vec<ContentBlock>, source: MessageSource) -> Self {
        Self {
            id: MessageId::generate(),
            role: Role::User,
            content,
            source,
        }
    }

    /// A user-role text message from a direct caller (`source.kind == "user"`), with a fresh id.
    pub fn user_text(text: impl Into<String>) -> Self {
        Self::user(vec![ContentBlock::text(text)], MessageSource::User)
    }

    /// An assistant message with `model` provenance and a fresh id.
    pub fn assistant(
        content: Vec<ContentBlock>,
        provider: impl Into<Arc<str>>,
        model: impl Into<Arc<str>>,
    ) -> Self {
        Self {
            id: MessageId::generate(),
            role: Role::Assistant,
            content,
            source: MessageSource::Model {
                provider: provider.into(),
                model: model.into(),
                replay_state: None,
            },
        }
    }

    /// A tool-result message: a user-role message carrying exactly one `tool-result` block whose
    /// `isError` is the call's failure flag.
    pub fn tool_result(call_id: CallId, content: Vec<ContentBlock>, is_error: bool) -> Self {
        Self {
            id: MessageId::generate(),
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_call_id: call_id.clone(),
                content,
                is_error: Some(is_error),
            }],
            source: MessageSource::Tool {
                call_id,
                extra: Map::new(),
            },
        }
    }

    /// The concatenated visible text of this message's `text` blocks.
    pub fn text(&self) -> String {
        crate::content::visible_text(&self.content)
    }
}

/// The `kind` tags [`MessageSource`] reads as typed variants (every variant but
/// [`MessageSource::Other`]'s). A source of another kind must use another tag.
pub const MESSAGE_SOURCE_KINDS: [&str; 4] = ["user", "plugin", "model", "tool"];

/// Where a message came from: an open union keyed by `kind`.
///
/// A source of a kind this crate does not know deserializes as [`MessageSource::Other`] and
/// serializes back unchanged. A source whose `kind` is one of [`MESSAGE_SOURCE_KINDS`] but
/// whose fields do not fit that kind is refused with an error naming the kind; it never reads
/// as [`MessageSource::Other`] (and a session refuses to log an `Other` that names a known
/// kind, which would read back as the typed variant).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum MessageSource {
    /// A direct human or caller prompt (the subagent driver uses this for the child task).
    User,
    /// Context injected by a plugin.
    Plugin {
        /// The plugin's name.
        plugin: String,
        /// Optional semantic metadata.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        form: Option<PluginForm>,
    },
    /// Assistant provenance.
    Model {
        /// The provider that produced the message.
        provider: Arc<str>,
        /// The model that produced the message.
        model: Arc<str>,
        /// Adapter-private lossless JSON needed to replay the message.
        #[serde(
            rename = "replayState",
            default,
            deserialize_with = "crate::content::present_boxed_value",
            skip_serializing_if = "Option::is_none"
        )]
        replay_state: Option<Box<Value>>,
    },
    /// A tool-result message.
    Tool {
        /// The call this message answers.
        #[serde(rename = "callId")]
        call_id: CallId,
        /// Further fields, kept losslessly.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// A source kind this crate does not know, kept as raw JSON (including its `kind`). Its
    /// `kind`, if any, is never one of [`MESSAGE_SOURCE_KINDS`].
    #[serde(untagged)]
    Other(Map<String, Value>),
}

/// The known source kinds' wire form, for reading (the same shapes as [`MessageSource`]'s
/// typed variants, without the catch-all).
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum KnownSource {
    User,
    Plugin {
        plugin: String,
        #[serde(default)]
        form: Option<PluginForm>,
    },
    Model {
        provider: Arc<str>,
        model: Arc<str>,
        #[serde(
            rename = "replayState",
            default,
            deserialize_with = "crate::content::present_boxed_value"
        )]
        replay_state: Option<Box<Value>>,
    },
    Tool {
        #[serde(rename = "callId")]
        call_id: CallId,
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
}

impl<'de> Deserialize<'de> for MessageSource {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let known = match read_open_union(deserializer, "kind", &MESSAGE_SOURCE_KINDS, "message source")? {
            Ok(known) => known,
            Err(fields) => return Ok(Self::Other(fields)),
        };
        Ok(match known {
            KnownSource::User => Self::User,
            KnownSource::Plugin { plugin, form } => Self::Plugin { plugin, form },
            KnownSource::Model {
                provider,
                model,
                replay_state,
            } => Self::Model {
                provider,
                model,
                replay_state,
            },
            KnownSource::Tool { call_id, extra } => Self::Tool { call_id, extra },
        })
    }
}

impl MessageSource {
    /// A plugin source without form metadata.
    pub fn plugin(name: impl Into<String>) -> Self {
        Self::Plugin {
            plugin: name.into(),
            form: None,
        }
    }

    /// For [`MessageSource::Other`] whose `kind` is one of [`MESSAGE_SOURCE_KINDS`] (which a
    /// log refuses: it would read back as the typed variant), that kind; otherwise `None`.
    pub fn other_with_known_kind(&self) -> Option<&str> {
        match self {
            Self::Other(fields) => known_tag(fields, "kind", &MESSAGE_SOURCE_KINDS),
            _ => None,
        }
    }

    /// The source's `kind` string.
    pub fn kind(&self) -> &str {
        match self {
            Self::User => "user",
            Self::Plugin { .. } => "plugin",
            Self::Model { .. } => "model",
            Self::Tool { .. } => "tool",
            Self::Other(map) => map.get("kind").and_then(Value::as_str).unwrap_or(""),
        }
    }
}

/// The `type` tags [`PluginForm`] reads as typed variants (every variant but
/// [`PluginForm::Other`]'s).
pub const PLUGIN_FORM_TYPES: [&str; 6] = ["instructions", "catalog", "snapshot", "notice", "relay", "recall"];

/// Optional semantic metadata on a plugin message, keyed by `type`.
///
/// An open union: a form of a type this crate does not know reads as [`PluginForm::Other`]; a
/// form whose `type` is one of [`PLUGIN_FORM_TYPES`] but whose fields do not fit is refused
/// with an error naming the type.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PluginForm {
    /// Standing instructions.
    Instructions,
    /// A catalog of things the model can use.
    Catalog,
    /// A runtime-context snapshot.
    Snapshot {
        /// The rendered sections, in order.
        sections: Vec<SnapshotSection>,
    },
    /// A notice with a one-line summary.
    Notice {
        /// The summary.
        summary: String,
    },
    /// A relayed message.
    Relay,
    /// A recalled message.
    Recall,
    /// A form this crate does not know, kept as raw JSON. Its `type`, if any, is never one of
    /// [`PLUGIN_FORM_TYPES`].
    #[serde(untagged)]
    Other(Map<String, Value>),
}

/// The known forms' wire form, for reading.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum KnownForm {
    Instructions,
    Catalog,
    Snapshot { sections: Vec<SnapshotSection> },
    Notice { summary: String },
    Relay,
    Recall,
}

impl<'de> Deserialize<'de> for PluginForm {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let known = match read_open_union(deserializer, "type", &PLUGIN_FORM_TYPES, "plugin form")? {
            Ok(known) => known,
            Err(fields) => return Ok(Self::Other(fields)),
        };
        Ok(match known {
            KnownForm::Instructions => Self::Instructions,
            KnownForm::Catalog => Self::Catalog,
            KnownForm::Snapshot { sections } => Self::Snapshot { sections },
            KnownForm::Notice { summary } => Self::Notice { summary },
            KnownForm::Relay => Self::Relay,
            KnownForm::Recall => Self::Recall,
        })
    }
}

impl PluginForm {
    /// For [`PluginForm::Other`] whose `type` is one of [`PLUGIN_FORM_TYPES`] (which a log
    /// refuses: it would read back as the typed variant), that type; otherwise `None`.
    pub fn other_with_known_type(&self) -> Option<&str> {
        match self {
            Self::Other(fields) => known_tag(fields, "type", &PLUGIN_FORM_TYPES),
            _ => None,
        }
    }
}

/// One named section of a runtime-context snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSection {
    /// The contributing context's name.
    pub name: String,
    /// The rendered text.
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sources_round_trip() {
        for raw in [
            json!({"kind": "user"}),
            json!({"kind": "plugin", "plugin": "prompt", "form": {"type": "snapshot", "sections": [{"name": "a", "text": "b"}]}}),
            json!({"kind": "model", "provider": "p", "model": "m", "replayState": {"x": 1}}),
            json!({"kind": "tool", "callId": "c", "extra": true}),
            json!({"kind": "subagent-report", "child": "x"}),
        ] {
            let src: MessageSource = serde_json::from_value(raw.clone()).unwrap();
            assert_eq!(serde_json::to_value(&src).unwrap(), raw);
        }
    }

    #[test]
    fn other_source_reports_its_kind() {
        let src: MessageSource = serde_json::from_value(json!({"kind": "relay-x"})).unwrap();
        assert_eq!(src.kind(), "relay-x");
    }
}
