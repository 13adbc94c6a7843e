//! Turn-end reasons (spec §4.4).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::model::LlmFailure;
use crate::signal::CancelCause;

/// Why a turn ended. An open union: consumers must treat [`TurnEndReason::Other`] (any unknown
/// kind) as a failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// A reason this crate does not know, kept as raw JSON (including its `kind`).
    #[serde(untagged)]
    Other(Map<String, Value>),
}

impl TurnEndReason {
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
