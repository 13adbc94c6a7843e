//! The durable `subagent/descriptor` event (spec §2.12): the versioned, log-only record of a
//! session-backed child's identity and lifecycle mode and, for continuable children, the
//! composition a cold resume needs.
//!
//! Payload (version [`SUBAGENT_DESCRIPTOR_VERSION`] = 2):
//!
//! | field | one-shot | continuable |
//! |---|---|---|
//! | `version` | `2` | `2` |
//! | `mode` | `"one-shot"` | `"continuable"` |
//! | `provider` | string | string |
//! | `label` | optional string | **required** string |
//! | `agentProvider`, `agentModel`, `persona` | not allowed | optional strings |
//! | `toolFilter` | not allowed | optional `{allow?, deny?}` with at least one list |
//!
//! Depth, output schema and per-activation budgets are deliberately absent; adding a
//! composition input is a version change, never a silent extra field.
//!
//! Reading a log ([`fold_subagent_descriptor`]) distinguishes three outcomes that callers treat
//! differently: **absent**, **unsupported** (another version: this runtime cannot classify the
//! child; not an error) and **corrupt** (a malformed current-version payload: an error whose
//! text starts `persisted subagent descriptor`).

use agent::tools::ToolRestriction;
use agent::{AsEvent, EventData, SessionEvent, SessionHeader, SessionId, SessionMeta, session::LogError};
use serde_json::{Map, Number, Value};

/// The descriptor format version this crate writes and reads.
pub const SUBAGENT_DESCRIPTOR_VERSION: u64 = 2;

/// The event type of the descriptor.
pub const SUBAGENT_DESCRIPTOR_EVENT: &str = "subagent/descriptor";

const BASE_KEYS: [&str; 4] = ["version", "mode", "provider", "label"];
const CONTINUABLE_KEYS: [&str; 4] = ["agentProvider", "agentModel", "persona", "toolFilter"];

/// A child's lifecycle mode as the descriptor records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DescriptorMode {
    /// A terminal one-shot run; never resumable.
    OneShot,
    /// A durable conversation that can receive later messages and be cold-resumed.
    Continuable,
}

impl DescriptorMode {
    /// The wire spelling (`one-shot`, `continuable`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OneShot => "one-shot",
            Self::Continuable => "continuable",
        }
    }
}

/// The descriptor of a one-shot child.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OneShotDescriptor {
    /// The provider that established the child.
    pub provider: String,
    /// The optional durable display label (the delegation's short description).
    pub label: Option<String>,
}

/// The descriptor of a continuable child: its identity plus the composition a cold resume
/// reapplies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContinuableDescriptor {
    /// The provider that established the child (kept after that provider unregisters).
    pub provider: String,
    /// The creation label.
    pub label: String,
    /// The resolved child route provider, when one was declared or inherited.
    pub agent_provider: Option<String>,
    /// The resolved child model, when one was declared or inherited.
    pub agent_model: Option<String>,
    /// The per-child persona.
    pub persona: Option<String>,
    /// The per-child tool restriction.
    pub tool_filter: Option<ToolRestriction>,
}

/// A parsed, supported (version 2) descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubagentDescriptor {
    /// `mode: "one-shot"`.
    OneShot(OneShotDescriptor),
    /// `mode: "continuable"`.
    Continuable(ContinuableDescriptor),
}

/// Why [`snapshot_subagent_descriptor`] refused its input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DescriptorSnapshotError {
    /// The payload cannot be represented as lossless JSON.
    #[error("subagent descriptor is not losslessly JSON-serializable")]
    NotLossless,
    /// The payload would not read back as itself (for example a tool filter with neither
    /// list); the message names the offending part.
    #[error("subagent descriptor is invalid: {0}")]
    Invalid(CorruptDescriptor),
}

/// A malformed current-version descriptor payload ("corrupt"). Every message starts
/// `persisted subagent descriptor`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptDescriptor {
    /// The payload is not a JSON object.
    #[error("persisted subagent descriptor payload must be an object")]
    PayloadNotObject,
    /// `version` is missing or not a number.
    #[error("persisted subagent descriptor version must be a number")]
    VersionNotNumber,
    /// `mode` is missing or not one of the two modes.
    #[error("persisted subagent descriptor mode must be \"one-shot\" or \"continuable\"")]
    InvalidMode,
    /// The payload has a key outside its mode's key set.
    #[error("persisted subagent descriptor payload has unknown field \"{0}\"")]
    UnknownField(String),
    /// A string field (`provider`, `label`, `agentProvider`, `agentModel`, `persona`) has
    /// another type (including `null`) or, for a required one, is missing.
    #[error("persisted subagent descriptor {0} must be a string")]
    NotAString(&'static str),
    /// `toolFilter` is not a JSON object.
    #[error("persisted subagent descriptor toolFilter must be an object")]
    ToolRestrictionNotObject,
    /// `toolFilter` has a key other than `allow` and `deny`.
    #[error("persisted subagent descriptor toolFilter has unknown field \"{0}\"")]
    ToolRestrictionUnknownField(String),
    /// `toolFilter.allow` or `toolFilter.deny` is not an array of strings.
    #[error("persisted subagent descriptor toolFilter.{0} must be an array of strings")]
    ToolRestrictionListNotStrings(&'static str),
    /// `toolFilter` declares neither list.
    #[error("persisted subagent descriptor toolFilter must declare allow and/or deny")]
    ToolRestrictionEmpty,
}

/// What a log (or one payload) says about a child's descriptor.
#[derive(Clone, Debug, PartialEq)]
pub enum DescriptorState {
    /// No `subagent/descriptor` event.
    Absent,
    /// A descriptor of another version: this runtime cannot classify it (not an error; resume
    /// treats it as "no supported continuation state", listing as corrupt).
    Unsupported {
        /// The version it declares.
        version: Number,
    },
    /// A supported descriptor.
    Supported(SubagentDescriptor),
}

impl DescriptorState {
    /// The supported descriptor, if any (absent and unsupported both yield `None`, the spec's
    /// fold result).
    pub fn into_supported(self) -> Option<SubagentDescriptor> {
        match self {
            Self::Supported(d) => Some(d),
            _ => None,
        }
    }
}

impl SubagentDescriptor {
    /// A one-shot descriptor for `provider` with an optional label.
    pub fn one_shot(provider: impl Into<String>, label: Option<String>) -> Self {
        Self::OneShot(OneShotDescriptor {
            provider: provider.into(),
            label,
        })
    }

    /// The mode.
    pub fn mode(&self) -> DescriptorMode {
        match self {
            Self::OneShot(_) => DescriptorMode::OneShot,
            Self::Continuable(_) => DescriptorMode::Continuable,
        }
    }

    /// The provider that established the child.
    pub fn provider(&self) -> &str {
        match self {
            Self::OneShot(d) => &d.provider,
            Self::Continuable(d) => &d.provider,
        }
    }

    /// The label, if any (always present for continuable children).
    pub fn label(&self) -> Option<&str> {
        match self {
            Self::OneShot(d) => d.label.as_deref(),
            Self::Continuable(d) => Some(&d.label),
        }
    }

    /// The continuable descriptor, when this is one.
    pub fn as_continuable(&self) -> Option<&ContinuableDescriptor> {
        match self {
            Self::Continuable(d) => Some(d),
            Self::OneShot(_) => None,
        }
    }

    /// The versioned payload: `version`, `mode`, `provider`, then every present optional field
    /// (absent ones are omitted entirely, never written as `null`).
    pub fn to_payload(&self) -> Value {
        // Sized for the most keys the mode can have, so building the payload never regrows it.
        let mut map = Map::with_capacity(match self {
            Self::OneShot(_) => 4,
            Self::Continuable(_) => 8,
        });
        map.insert("version".into(), Value::from(SUBAGENT_DESCRIPTOR_VERSION));
        map.insert("mode".into(), Value::from(self.mode().as_str()));
        map.insert("provider".into(), Value::from(self.provider()));
        let mut put = |key: &str, v: &Option<String>| {
            if let Some(v) = v {
                map.insert(key.into(), Value::from(v.as_str()));
            }
        };
        match self {
            Self::OneShot(d) => put("label", &d.label),
            Self::Continuable(d) => {
                put("label", &Some(d.label.clone()));
                put("agentProvider", &d.agent_provider);
                put("agentModel", &d.agent_model);
                put("persona", &d.persona);
                if let Some(filter) = &d.tool_filter {
                    let mut f = Map::new();
                    for (key, list) in [("allow", &filter.allow), ("deny", &filter.deny)] {
                        if let Some(list) = list {
                            f.insert(key.into(), Value::from(list.clone()));
                        }
                    }
                    map.insert("toolFilter".into(), Value::Object(f));
                }
            }
        }
        Value::Object(map)
    }

    /// The descriptor as a log-only event payload (`subagent/descriptor`, no surface marker).
    /// Prefer [`snapshot_subagent_descriptor`], which also proves the payload reads back.
    pub fn to_event_data(&self) -> EventData {
        EventData::other(SUBAGENT_DESCRIPTOR_EVENT, self.to_payload())
    }
}

/// Builds and detaches the descriptor event for `descriptor` (spec §2.12 snapshot), before any
/// provider work, so invalid input rejects the call before a child exists.
///
/// The payload is checked to be lossless JSON and to read back, through
/// [`parse_subagent_descriptor`], as exactly `descriptor`; otherwise it fails with
/// [`DescriptorSnapshotError`] (`subagent descriptor is not losslessly JSON-serializable`, or
/// an invalid part such as a tool filter with neither list).
pub fn snapshot_subagent_descriptor(
    descriptor: &SubagentDescriptor,
) -> Result<EventData, DescriptorSnapshotError> {
    let payload = descriptor.to_payload();
    if let SubagentDescriptor::OneShot(_) = descriptor {
        // Strings only (version, mode, provider, optional label): always lossless and always
        // read back as themselves, so the proof below is statically true (and costs a parse per
        // delegation). Pinned by the round-trip tests.
        return Ok(EventData::other(SUBAGENT_DESCRIPTOR_EVENT, payload));
    }
    agent::session::check_lossless_json(&payload).map_err(|_| DescriptorSnapshotError::NotLossless)?;
    match parse_subagent_descriptor(&payload) {
        Ok(DescriptorState::Supported(back)) if &back == descriptor => {
            Ok(EventData::other(SUBAGENT_DESCRIPTOR_EVENT, payload))
        }
        Err(corrupt) => Err(DescriptorSnapshotError::Invalid(corrupt)),
        // The payload is built from the descriptor itself; a mismatch would mean it cannot be
        // represented faithfully.
        Ok(_) => Err(DescriptorSnapshotError::NotLossless),
    }
}

fn optional_string(map: &Map<String, Value>, key: &'static str) -> Result<Option<String>, CorruptDescriptor> {
    match map.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(CorruptDescriptor::NotAString(key)),
    }
}

fn string_list(
    filter: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<Vec<String>>, CorruptDescriptor> {
    match filter.get(key) {
        None => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or(CorruptDescriptor::ToolRestrictionListNotStrings(key)),
        Some(_) => Err(CorruptDescriptor::ToolRestrictionListNotStrings(key)),
    }
}

fn parse_tool_filter(value: &Value) -> Result<ToolRestriction, CorruptDescriptor> {
    let filter = value
        .as_object()
        .ok_or(CorruptDescriptor::ToolRestrictionNotObject)?;
    if let Some(key) = filter.keys().find(|k| *k != "allow" && *k != "deny") {
        return Err(CorruptDescriptor::ToolRestrictionUnknownField(key.clone()));
    }
    let allow = string_list(filter, "allow")?;
    let deny = string_list(filter, "deny")?;
    if allow.is_none() && deny.is_none() {
        return Err(CorruptDescriptor::ToolRestrictionEmpty);
    }
    Ok(ToolRestriction { allow, deny })
}

/// Parses one descriptor payload, checking in this order: the payload is an object; `version`
/// is a number (a version other than 2 is [`DescriptorState::Unsupported`], not an error);
/// `mode` is one of the two modes; every key belongs to that mode's key set (checked before any
/// field type); `provider` is a string; then the mode's own fields. A present key with a `null`
/// value is malformed.
///
/// Total over arbitrary JSON: never panics.
pub fn parse_subagent_descriptor(payload: &Value) -> Result<DescriptorState, CorruptDescriptor> {
    let map = payload.as_object().ok_or(CorruptDescriptor::PayloadNotObject)?;
    let version = match map.get("version") {
        Some(Value::Number(n)) => n,
        _ => return Err(CorruptDescriptor::VersionNotNumber),
    };
    if version.as_f64() != Some(SUBAGENT_DESCRIPTOR_VERSION as f64) {
        return Ok(DescriptorState::Unsupported {
            version: version.clone(),
        });
    }
    let mode = match map.get("mode").and_then(Value::as_str) {
        Some("one-shot") => DescriptorMode::OneShot,
        Some("continuable") => DescriptorMode::Continuable,
        _ => return Err(CorruptDescriptor::InvalidMode),
    };
    let known = |key: &str| {
        BASE_KEYS.contains(&key) || (mode == DescriptorMode::Continuable && CONTINUABLE_KEYS.contains(&key))
    };
    if let Some(key) = map.keys().find(|k| !known(k)) {
        return Err(CorruptDescriptor::UnknownField(key.clone()));
    }
    let provider = match map.get("provider") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(CorruptDescriptor::NotAString("provider")),
    };
    let descriptor = match mode {
        DescriptorMode::OneShot => SubagentDescriptor::OneShot(OneShotDescriptor {
            provider,
            label: optional_string(map, "label")?,
        }),
        DescriptorMode::Continuable => {
            let label = match map.get("label") {
                Some(Value::String(s)) => s.clone(),
                _ => return Err(CorruptDescriptor::NotAString("label")),
            };
            let agent_provider = optional_string(map, "agentProvider")?;
            let agent_model = optional_string(map, "agentModel")?;
            let persona = optional_string(map, "persona")?;
            let tool_filter = map.get("toolFilter").map(parse_tool_filter).transpose()?;
            SubagentDescriptor::Continuable(ContinuableDescriptor {
                provider,
                label,
                agent_provider,
                agent_model,
                persona,
                tool_filter,
            })
        }
    };
    Ok(DescriptorState::Supported(descriptor))
}

/// Folds a log slice to its descriptor (spec §2.12 fold): the **first** `subagent/descriptor`
/// event is authoritative (the establishing path appends exactly one). No such event →
/// [`DescriptorState::Absent`]; otherwise [`parse_subagent_descriptor`] of its payload.
///
/// Resume authority passes only the child's own suffix (`events[seedLength..]`), because a fork
/// seed may replay an ancestor's descriptor. Total over arbitrary logs: never panics.
pub fn fold_subagent_descriptor<I>(events: I) -> Result<DescriptorState, CorruptDescriptor>
where
    I: IntoIterator,
    I::Item: AsEvent,
{
    for event in events {
        if let EventData::Other { kind, data } = &event.as_event().data
            && kind == SUBAGENT_DESCRIPTOR_EVENT
        {
            return parse_subagent_descriptor(data);
        }
    }
    Ok(DescriptorState::Absent)
}

/// Builds a continuable child's creation seed (spec §2.12 placement): the provider's inherited
/// prefix (when any, followed by the session's end-seed marker) and then the descriptor as one
/// between-turn event, before any `turn/start`. The events are staged through a real
/// [`agent::Session`], so seqs are contiguous from 0 and the same lossless-JSON rules as the
/// durable log apply; a seed those rules reject is returned as the log's error.
///
/// The child header's `seedLength` must count only the provider's prefix, never the descriptor.
pub fn seed_descriptor_turn(
    child_id: &SessionId,
    provider_seed: Option<Vec<SessionEvent>>,
    descriptor_event: EventData,
) -> Result<Vec<SessionEvent>, LogError> {
    let header: SessionHeader = SessionMeta::default()
        .into_header(child_id.clone(), agent::session::now_ms())
        .map_err(|e| LogError::Invalid {
            kind: SUBAGENT_DESCRIPTOR_EVENT.to_owned(),
            reason: e.to_string(),
        })?;
    let staged = agent::Session::new(header, provider_seed)?;
    staged.record(descriptor_event, None)?;
    Ok(staged.events().iter().map(|e| (**e).clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn ev(seq: u64, data: EventData) -> SessionEvent {
        SessionEvent {
            seq,
            time: 1,
            data,
            surface: None,
            ignorable: false,
        }
    }

    fn descriptor_event(payload: Value) -> SessionEvent {
        ev(0, EventData::other(SUBAGENT_DESCRIPTOR_EVENT, payload))
    }

    fn fold_payload(payload: Value) -> Result<DescriptorState, CorruptDescriptor> {
        fold_subagent_descriptor([descriptor_event(payload)])
    }

    fn full_continuable() -> SubagentDescriptor {
        SubagentDescriptor::Continuable(ContinuableDescriptor {
            provider: "spawn".into(),
            label: "research".into(),
            agent_provider: Some("openai".into()),
            agent_model: Some("m1".into()),
            persona: Some("You are terse.".into()),
            tool_filter: Some(ToolRestriction {
                allow: Some(vec!["read".into()]),
                deny: Some(vec!["shell".into()]),
            }),
        })
    }

    /// spec: SVC-16 — empty log folds to none; the minimal one-shot snapshot has exactly
    /// version/mode/provider; round trip; label included when given; a complete continuable
    /// payload round-trips; allow-only and deny-only filters are accepted; version + 1 folds to
    /// none.
    #[test]
    fn svc_16_snapshot_and_fold() {
        assert_eq!(
            fold_subagent_descriptor(Vec::<SessionEvent>::new()),
            Ok(DescriptorState::Absent)
        );

        let minimal = SubagentDescriptor::one_shot("spawn", None);
        let data = snapshot_subagent_descriptor(&minimal).unwrap();
        assert_eq!(data.type_name(), "subagent/descriptor");
        assert_eq!(
            data.to_data(),
            json!({"version": 2, "mode": "one-shot", "provider": "spawn"})
        );
        assert_eq!(
            fold_subagent_descriptor([ev(0, data)]).unwrap(),
            DescriptorState::Supported(minimal)
        );

        let labeled = SubagentDescriptor::one_shot("spawn", Some("find bugs".into()));
        let data = snapshot_subagent_descriptor(&labeled).unwrap();
        assert_eq!(
            data.to_data(),
            json!({"version": 2, "mode": "one-shot", "provider": "spawn", "label": "find bugs"})
        );
        assert_eq!(
            fold_subagent_descriptor([ev(0, data)]).unwrap().into_supported(),
            Some(labeled)
        );

        let full = full_continuable();
        let data = snapshot_subagent_descriptor(&full).unwrap();
        assert_eq!(
            data.to_data(),
            json!({"version": 2, "mode": "continuable", "provider": "spawn", "label": "research",
                   "agentProvider": "openai", "agentModel": "m1", "persona": "You are terse.",
                   "toolFilter": {"allow": ["read"], "deny": ["shell"]}})
        );
        assert_eq!(
            fold_subagent_descriptor([ev(0, data)]).unwrap().into_supported(),
            Some(full)
        );

        for filter in [
            ToolRestriction {
                allow: Some(vec!["read".into()]),
                deny: None,
            },
            ToolRestriction {
                allow: None,
                deny: Some(vec!["shell".into()]),
            },
        ] {
            let d = SubagentDescriptor::Continuable(ContinuableDescriptor {
                provider: "p".into(),
                label: "l".into(),
                agent_provider: None,
                agent_model: None,
                persona: None,
                tool_filter: Some(filter),
            });
            let data = snapshot_subagent_descriptor(&d).unwrap();
            assert_eq!(
                fold_subagent_descriptor([ev(0, data)]).unwrap().into_supported(),
                Some(d)
            );
        }

        let next = fold_payload(json!({"version": 3, "mode": "one-shot", "provider": "p"})).unwrap();
        assert_eq!(next, DescriptorState::Unsupported { version: 3.into() });
        assert_eq!(next.into_supported(), None);
        // Version 1 (the pre-mode format) is unsupported, not corrupt.
        assert!(matches!(
            fold_payload(json!({"version": 1, "provider": "p"})),
            Ok(DescriptorState::Unsupported { .. })
        ));
    }

    /// spec: SVC-16 — an input that cannot be represented faithfully is refused at snapshot
    /// time. In Rust every string is valid JSON, so the reference's "non-JSON value in
    /// toolFilter" is unrepresentable; the remaining invalid input is a filter with neither
    /// list, and the lossless error keeps its fixed text.
    #[test]
    fn svc_16_snapshot_refuses_unrepresentable_input() {
        let d = SubagentDescriptor::Continuable(ContinuableDescriptor {
            provider: "p".into(),
            label: "l".into(),
            agent_provider: None,
            agent_model: None,
            persona: None,
            tool_filter: Some(ToolRestriction::default()),
        });
        let err = snapshot_subagent_descriptor(&d).unwrap_err();
        assert_eq!(
            err,
            DescriptorSnapshotError::Invalid(CorruptDescriptor::ToolRestrictionEmpty)
        );
        assert_eq!(
            DescriptorSnapshotError::NotLossless.to_string(),
            "subagent descriptor is not losslessly JSON-serializable"
        );
    }

    /// spec: SVC-17 — malformed persisted payloads fail with the fixed fragments.
    #[test]
    fn svc_17_corrupt_payload_fragments() {
        let cases: Vec<(Value, &str)> = vec![
            (json!("s"), "payload must be an object"),
            (json!(null), "payload must be an object"),
            (json!([]), "payload must be an object"),
            (
                json!({"mode": "one-shot", "provider": "p"}),
                "version must be a number",
            ),
            (
                json!({"version": "2", "mode": "one-shot", "provider": "p"}),
                "version must be a number",
            ),
            (
                json!({"version": 2, "provider": "p"}),
                "mode must be \"one-shot\" or \"continuable\"",
            ),
            (
                json!({"version": 2, "mode": "forever", "provider": "p"}),
                "mode must be \"one-shot\" or \"continuable\"",
            ),
            (
                json!({"version": 2, "mode": "one-shot", "provider": "p", "persona": "x"}),
                "payload has unknown field \"persona\"",
            ),
            (
                json!({"version": 2, "mode": "one-shot", "provider": "p", "label": 7}),
                "label must be a string",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "extra": 1}),
                "payload has unknown field \"extra\"",
            ),
            (
                json!({"version": 2, "mode": "one-shot"}),
                "provider must be a string",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p"}),
                "label must be a string",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": 3}),
                "label must be a string",
            ),
            (
                json!({"version": 2, "mode": "one-shot", "provider": 5}),
                "provider must be a string",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": "l", "agentProvider": 1}),
                "agentProvider must be a string",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": "l", "agentModel": []}),
                "agentModel must be a string",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": "l", "persona": {}}),
                "persona must be a string",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": "l", "toolFilter": []}),
                "toolFilter must be an object",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": "l", "toolFilter": {"except": []}}),
                "toolFilter has unknown field \"except\"",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": "l", "toolFilter": {}}),
                "toolFilter must declare allow and/or deny",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": "l", "toolFilter": {"allow": "read"}}),
                "toolFilter.allow must be an array of strings",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": "l", "toolFilter": {"deny": [1]}}),
                "toolFilter.deny must be an array of strings",
            ),
            (
                json!({"version": 2, "mode": "one-shot", "provider": "p", "label": null}),
                "label must be a string",
            ),
            (
                json!({"version": 2, "mode": "continuable", "provider": "p", "label": "l", "toolFilter": null}),
                "toolFilter must be an object",
            ),
        ];
        for (payload, fragment) in cases {
            let err = fold_payload(payload.clone()).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("persisted subagent descriptor {fragment}"),
                "{payload}"
            );
        }
    }

    #[test]
    fn first_descriptor_wins_and_other_events_are_skipped() {
        let first = SubagentDescriptor::one_shot("a", None);
        let second = SubagentDescriptor::one_shot("b", None);
        let events = vec![
            ev(0, EventData::TurnStart { turn: 1 }),
            ev(1, first.to_event_data()),
            ev(2, second.to_event_data()),
        ];
        assert_eq!(
            fold_subagent_descriptor(&events).unwrap().into_supported(),
            Some(first)
        );
        // A corrupt first descriptor is not rescued by a later valid one.
        let events = vec![
            descriptor_event(json!({"version": 2})),
            ev(1, second.to_event_data()),
        ];
        assert_eq!(
            fold_subagent_descriptor(&events),
            Err(CorruptDescriptor::InvalidMode)
        );
    }

    #[test]
    fn seeding_places_the_descriptor_after_the_inherited_prefix() {
        let d = snapshot_subagent_descriptor(&SubagentDescriptor::one_shot("fork", None)).unwrap();
        let fresh = seed_descriptor_turn(&"c".into(), None, d.clone()).unwrap();
        assert_eq!(fresh.len(), 1);
        assert_eq!(fresh[0].seq, 0);
        assert_eq!(fresh[0].type_name(), SUBAGENT_DESCRIPTOR_EVENT);

        let prefix = vec![
            ev(0, EventData::TurnStart { turn: 1 }),
            ev(
                1,
                EventData::TurnEnd {
                    turn: 1,
                    reason: agent::TurnEndReason::Completed,
                },
            ),
        ];
        let seeded = seed_descriptor_turn(&"c".into(), Some(prefix.clone()), d).unwrap();
        assert_eq!(&seeded[..2], &prefix[..]);
        let types: Vec<&str> = seeded.iter().map(SessionEvent::type_name).collect();
        assert_eq!(
            types,
            [
                "turn/start",
                "turn/end",
                "session/end-seed",
                "subagent/descriptor"
            ]
        );
        assert!(seeded.iter().enumerate().all(|(i, e)| e.seq == i as u64));
        // A broken seed is the log's error, not a panic.
        let bad = vec![ev(5, EventData::TurnStart { turn: 1 })];
        assert!(seed_descriptor_turn(&"c".into(), Some(bad), EventData::EndSeed).is_err());
    }

    fn arb_opt_string() -> impl Strategy<Value = Option<String>> {
        proptest::option::of("\\PC{0,12}")
    }

    fn arb_descriptor() -> impl Strategy<Value = SubagentDescriptor> {
        let list = proptest::option::of(prop::collection::vec("\\PC{0,8}", 0..4));
        let filter = proptest::option::of(
            (list.clone(), list).prop_filter_map("needs a list", |(allow, deny)| {
                (allow.is_some() || deny.is_some()).then_some(ToolRestriction { allow, deny })
            }),
        );
        prop_oneof![
            ("\\PC{0,12}", arb_opt_string())
                .prop_map(|(provider, label)| SubagentDescriptor::one_shot(provider, label)),
            (
                "\\PC{0,12}",
                "\\PC{0,12}",
                arb_opt_string(),
                arb_opt_string(),
                arb_opt_string(),
                filter
            )
                .prop_map(
                    |(provider, label, agent_provider, agent_model, persona, tool_filter)| {
                        SubagentDescriptor::Continuable(ContinuableDescriptor {
                            provider,
                            label,
                            agent_provider,
                            agent_model,
                            persona,
                            tool_filter,
                        })
                    }
                ),
        ]
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            prop::sample::select(vec!["one-shot", "continuable", "p", "", "allow"]).prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            let keys = prop::sample::select(vec![
                "version",
                "mode",
                "provider",
                "label",
                "agentProvider",
                "agentModel",
                "persona",
                "toolFilter",
                "allow",
                "deny",
                "x",
            ]);
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((keys, inner.clone()), 0..8).prop_map(|kv| {
                    Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
                // Payloads that pass the early checks, so the later ones get exercised too.
                (
                    prop::collection::vec(
                        (
                            prop::sample::select(vec!["provider", "label", "toolFilter", "persona", "x"]),
                            inner
                        ),
                        0..5
                    ),
                    prop::sample::select(vec!["one-shot", "continuable"])
                )
                    .prop_map(|(kv, mode)| {
                        let mut m = Map::new();
                        m.insert("version".into(), json!(2));
                        m.insert("mode".into(), json!(mode));
                        for (k, v) in kv {
                            m.insert(k.to_owned(), v);
                        }
                        Value::Object(m)
                    }),
            ]
        })
    }

    proptest! {
        /// A descriptor snapshot always folds back to itself.
        #[test]
        fn snapshot_folds_back_to_itself(d in arb_descriptor()) {
            let data = snapshot_subagent_descriptor(&d).unwrap();
            let back = fold_subagent_descriptor([ev(0, data)]).unwrap();
            prop_assert_eq!(back, DescriptorState::Supported(d));
        }

        /// The fold never panics on arbitrary JSON payloads, and whatever it accepts
        /// re-snapshots to an equal payload.
        #[test]
        fn fold_never_panics(payload in arb_json()) {
            if let Ok(DescriptorState::Supported(d)) = fold_payload(payload.clone()) {
                let data = snapshot_subagent_descriptor(&d).unwrap();
                let mut canonical = payload;
                canonical["version"] = json!(2);
                prop_assert_eq!(data.to_data(), canonical);
            }
        }
    }
}
