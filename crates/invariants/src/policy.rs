//! The replaying companions of providers §6.5 whose events reach the log: user approval (A1–A3)
//! and sandbox policy (X1).
//!
//! The tools companion's T1–T4 watch in-memory pipeline notifications that are never logged,
//! and T5 watches Code Mode dispatch events, which this workspace leaves out; neither has
//! anything to check in a session log.

use std::collections::HashSet;

use agent::SessionEvent;
use agent::event::EventData;
use serde_json::Value;

use crate::rule::RuleId;
use crate::trace::Finding;

/// Approval policies `approval/policy` may carry (A3).
pub const APPROVAL_POLICIES: [&str; 2] = ["ask", "never"];
/// Outcomes `approval/decided` may carry (A2).
pub const APPROVAL_OUTCOMES: [&str; 4] = ["allowed-once", "rejected", "cancelled", "unavailable"];
/// Modes `sandbox/mode` may carry (X1).
pub const SANDBOX_MODES: [&str; 3] = ["read-only", "workspace-write", "danger-full-access"];

/// Unanswered approval questions of one session.
#[derive(Clone, Debug, Default)]
pub(crate) struct ApprovalTrace {
    pending: HashSet<String>,
}

/// One approval event's deferred change.
#[derive(Clone, Debug)]
pub(crate) enum ApprovalDelta {
    None,
    Asked(String),
    Decided(String),
}

/// An approval id as a set key: its JSON text, so ids of different JSON types (the string
/// `"1"` and the number `1`) stay different ids.
fn id_key(v: &Value) -> String {
    v.to_string()
}

impl ApprovalTrace {
    /// Validates `ev` (with `open_turn` the turn open before it) without changing the trace.
    pub(crate) fn validate(
        &self,
        ev: &SessionEvent,
        open_turn: Option<u64>,
        out: &mut Vec<Finding>,
    ) -> ApprovalDelta {
        match &ev.data {
            EventData::Other { kind, data } if kind == "approval/asked" => {
                if open_turn.is_none() {
                    out.push((RuleId::A1, "an open turn around approval/asked".to_owned()));
                }
                match data.get("toolName") {
                    Some(Value::String(s)) if !s.is_empty() => {}
                    _ => out.push((
                        RuleId::A1,
                        "approval/asked to carry a non-empty toolName".to_owned(),
                    )),
                }
                let Some(id) = data.get("id") else {
                    out.push((RuleId::A1, "approval/asked to carry an id".to_owned()));
                    return ApprovalDelta::None;
                };
                let id = id_key(id);
                if self.pending.contains(&id) {
                    out.push((
                        RuleId::A1,
                        format!("approval/asked to open a fresh id, but {id} is already pending"),
                    ));
                }
                ApprovalDelta::Asked(id)
            }
            EventData::Other { kind, data } if kind == "approval/decided" => {
                if open_turn.is_none() {
                    out.push((RuleId::A2, "an open turn around approval/decided".to_owned()));
                }
                match data.get("outcome").and_then(Value::as_str) {
                    Some(o) if APPROVAL_OUTCOMES.contains(&o) => {}
                    other => out.push((
                        RuleId::A2,
                        format!(
                            "approval/decided outcome to be one of {APPROVAL_OUTCOMES:?}, got {}",
                            other.map_or_else(|| "none".to_owned(), |o| format!("{o:?}"))
                        ),
                    )),
                }
                let Some(id) = data.get("id") else {
                    out.push((RuleId::A2, "approval/decided to carry an id".to_owned()));
                    return ApprovalDelta::None;
                };
                let id = id_key(id);
                if !self.pending.contains(&id) {
                    out.push((
                        RuleId::A2,
                        format!(
                            "approval/decided to answer a pending approval/asked, but {id} is not pending"
                        ),
                    ));
                }
                ApprovalDelta::Decided(id)
            }
            EventData::ApprovalPolicy { policy, .. } => {
                if !APPROVAL_POLICIES.contains(&policy.as_str()) {
                    out.push((
                        RuleId::A3,
                        format!("approval/policy to be one of {APPROVAL_POLICIES:?}, got {policy:?}"),
                    ));
                }
                ApprovalDelta::None
            }
            EventData::SandboxMode { mode, .. } => {
                if !SANDBOX_MODES.contains(&mode.as_str()) {
                    out.push((
                        RuleId::X1,
                        format!("sandbox/mode to be one of {SANDBOX_MODES:?}, got {mode:?}"),
                    ));
                }
                ApprovalDelta::None
            }
            _ => ApprovalDelta::None,
        }
    }

    /// Commits a delta computed by [`ApprovalTrace::validate`].
    pub(crate) fn apply(&mut self, d: ApprovalDelta) {
        match d {
            ApprovalDelta::None => {}
            ApprovalDelta::Asked(id) => {
                self.pending.insert(id);
            }
            ApprovalDelta::Decided(id) => {
                self.pending.remove(&id);
            }
        }
    }
}
