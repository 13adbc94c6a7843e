//! Turn-end reasons (spec §4.4).

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::content::{known_tag, read_open_union};
use crate::model::LlmFailure;
use crate::signal::CancelCause;

/// The `kind` tags [`TurnEndReason`] reads as typed variants (every variant but
/// [`TurnEndReason::Other`]'s).
pub const TURN_END_KINDS: [&str; 6] = [
    "completed",
    "aborted",
    "blocked",
    "error",
    "max-tokens",
    "interrupted",
];

/// Why a turn ended. An open union: consumers must treat [`TurnEndReason::Other`] (any unknown
/// kind) as a failure. A reason whose `kind` is one of [`TURN_END_KINDS`] but whose fields do
/// not fit (an `aborted` without its cause) is refused with an error naming the kind; it never
/// reads as [`TurnEndReason::Other`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum TurnEndReason {
    /// The turn stopped normally (also used for a turn whose entered batch was empty).
    Completed,
    /// A cancellation interrupted the live turn.
    Aborted {
        /// The agent cancel cause.
        reason: CancelCause,
    },
    /// A pre-step interceptor rejected the proposed step; the claimed input is discarded.
    Blocked,
    /// The model (or something else) failed; always structured.
    Error {
        /// The failure facts.
        error: LlmFailure,
    },
    /// At least one step of the turn finished at the output-token ceiling (sticky within a turn).
    MaxTokens,
    /// Synthesised only by crash repair when reloading a log with an open turn.
    Interrupted,
    /// A reason this crate does not know, kept as raw JSON (including its `kind`). Its `kind`,
    /// if any, is never one of [`TURN_END_KINDS`].
    #[serde(untagged)]
    Other(Map<String, Value>),
}

/// The known reasons' wire form, for reading.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum KnownReason {
    Completed,
    Aborted { reason: CancelCause },
    Blocked,
    Error { error: LlmFailure },
    MaxTokens,
    Interrupted,
}

impl<'de> Deserialize<'de> for TurnEndReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let known = match read_open_union(deserializer, "kind", &TURN_END_KINDS, "turn-end reason")? {
            Ok(known) => known,
            Err(fields) => return Ok(Self::Other(fields)),
        };
        Ok(match known {
            KnownReason::Completed => Self::Completed,
            KnownReason::Aborted { reason } => Self::Aborted { reason },
            KnownReason::Blocked => Self::Blocked,
            KnownReason::Error { error } => Self::Error { error },
            KnownReason::MaxTokens => Self::MaxTokens,
            KnownReason::Interrupted => Self::Interrupted,
        })
    }
}

impl TurnEndReason {
    /// For [`TurnEndReason::Other`] whose `kind` is one of [`TURN_END_KINDS`], or an
    /// [`Aborted`](Self::Aborted) whose cause is a [`CancelCause::Unknown`] naming a known cause
    /// kind (either of which a log refuses: it would read back as the typed variant), that
    /// kind; otherwise `None`.
    pub fn other_with_known_kind(&self) -> Option<&str> {
        match self {
            Self::Other(fields) => known_tag(fields, "kind", &TURN_END_KINDS),
            Self::Aborted { reason } => reason.unknown_with_known_kind(),
            _ => None,
        }
    }

    /// The reason's `kind` string.
    pub fn kind(&self) -> &str {
        match self {
            Self::Completed => "completed",
            Self::Aborted { .. } => "aborted",
            Self::Blocked => "blocked",
            Self::Error { .. } => "error",
            Self::MaxTokens => "max-tokens",
            Self::Interrupted => "interrupted",
            Self::Other(map) => map.get("kind").and_then(Value::as_str).unwrap_or(""),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reasons_round_trip_in_spec_shape() {
        for raw in [
            json!({"kind": "completed"}),
            json!({"kind": "aborted", "reason": {"kind": "parent"}}),
            json!({"kind": "aborted", "reason": {"kind": "legacy"}}),
            json!({"kind": "error", "error": {"message": "m", "code": "UNKNOWN", "status": 429}}),
            json!({"kind": "max-tokens"}),
            json!({"kind": "interrupted"}),
            json!({"kind": "exploded", "why": 1}),
        ] {
            let r: TurnEndReason = serde_json::from_value(raw.clone()).unwrap();
            assert_eq!(serde_json::to_value(&r).unwrap(), raw);
        }
    }
}
