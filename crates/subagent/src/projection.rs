//! The seam's session projections (spec §2.17): `subagentTiming` and `subagent` (identity).
//!
//! Both are pure, total folds over a session log. [`register_projections`] registers them with
//! a host's [`ProjectionRegistry`]; the returned guard unregisters them (hold it for as long as
//! the service is loaded).

use std::sync::Arc;

use agent::projection::{DuplicateProjection, Projection, ProjectionRegistry};
use agent::{EventData, Registration, SessionEvent, SessionHeader};
use serde_json::{Value, json};

use crate::descriptor::{DescriptorState, SUBAGENT_DESCRIPTOR_EVENT, parse_subagent_descriptor};

/// The timing projection's key.
pub const TIMING_PROJECTION: &str = "subagentTiming";

/// The identity projection's key.
pub const IDENTITY_PROJECTION: &str = "subagent";

/// An open turn's bounds: `since` its start, `through` the latest event seen while open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ActiveInterval {
    /// The open turn's start time (ms).
    pub since: u64,
    /// The latest time seen while it is open (ms).
    pub through: u64,
}

/// The `subagentTiming` fold state (state version 2).
///
/// Before any descriptor, turns accumulate nothing (a start is only remembered as pending).
/// Every descriptor resets `settled_ms` to 0 and, if a turn is open, opens the active interval
/// at that turn's start. After a descriptor, each completed turn adds `max(0, end - since)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimingState {
    /// Milliseconds of completed turns since the latest descriptor.
    pub settled_ms: u64,
    /// The open turn, once a descriptor was seen.
    pub active: Option<ActiveInterval>,
    /// A turn start seen before any descriptor.
    pub pending_start: Option<u64>,
    /// Whether a descriptor was seen.
    pub described: bool,
}

impl TimingState {
    /// Applies one event. Returns an equal state when the event changes nothing.
    pub fn apply(self, event: &SessionEvent) -> Self {
        let mut next = self;
        match &event.data {
            EventData::Other { kind, .. } if kind == SUBAGENT_DESCRIPTOR_EVENT => {
                let open_since = self.active.map(|a| a.since).or(self.pending_start);
                next.settled_ms = 0;
                next.described = true;
                next.pending_start = None;
                next.active = open_since.map(|since| ActiveInterval {
                    since,
                    through: event.time,
                });
            }
            EventData::TurnStart { .. } => {
                if self.described {
                    next.active = Some(ActiveInterval {
                        since: event.time,
                        through: event.time,
                    });
                } else {
                    next.pending_start = Some(event.time);
                }
            }
            EventData::TurnEnd { .. } => {
                if let Some(active) = self.active {
                    next.settled_ms = self
                        .settled_ms
                        .saturating_add(event.time.saturating_sub(active.since));
                    next.active = None;
                } else {
                    next.pending_start = None;
                }
            }
            _ => {
                if let Some(active) = self.active
                    && event.time > active.through
                {
                    next.active = Some(ActiveInterval {
                        through: event.time,
                        ..active
                    });
                }
            }
        }
        next
    }

    /// Folds a whole log.
    pub fn fold<'a>(events: impl IntoIterator<Item = &'a SessionEvent>) -> Self {
        events.into_iter().fold(Self::default(), Self::apply)
    }

    /// The wire view: `{settledMs, active?: {since, through}}`.
    pub fn view(&self) -> Value {
        match self.active {
            Some(a) => {
                json!({"settledMs": self.settled_ms, "active": {"since": a.since, "through": a.through}})
            }
            None => json!({"settledMs": self.settled_ms}),
        }
    }
}

/// The `subagent` identity view: the latest descriptor's mode, label and seq.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubagentIdentity {
    /// `one-shot` or `continuable`.
    pub mode: &'static str,
    /// The descriptor's label.
    pub label: Option<String>,
    /// The seq of the descriptor event it came from (`seq >= seedLength` proves it is the
    /// child's own).
    pub seq: u64,
}

impl SubagentIdentity {
    /// Folds a log: last descriptor wins; a malformed or unknown-version one resets to `None`.
    pub fn fold<'a>(events: impl IntoIterator<Item = &'a SessionEvent>) -> Option<Self> {
        let mut identity = None;
        for event in events {
            if let EventData::Other { kind, data } = &event.data
                && kind == SUBAGENT_DESCRIPTOR_EVENT
            {
                identity = match parse_subagent_descriptor(data) {
                    Ok(DescriptorState::Supported(d)) => Some(Self {
                        mode: d.mode().as_str(),
                        label: d.label().map(str::to_owned),
                        seq: event.seq,
                    }),
                    _ => None,
                };
            }
        }
        identity
    }

    /// The wire view; `None` is the JSON `null` sentinel.
    pub fn view(identity: Option<&Self>) -> Value {
        match identity {
            None => Value::Null,
            Some(i) => {
                let mut v = json!({"mode": i.mode, "seq": i.seq});
                if let Some(label) = &i.label {
                    v["label"] = Value::String(label.clone());
                }
                v
            }
        }
    }
}

struct TimingProjection;

impl Projection for TimingProjection {
    fn name(&self) -> &str {
        TIMING_PROJECTION
    }
    fn view(&self, _: &SessionHeader, events: &[Arc<SessionEvent>]) -> Value {
        TimingState::fold(events.iter().map(|e| &**e)).view()
    }
}

struct IdentityProjection;

impl Projection for IdentityProjection {
    fn name(&self) -> &str {
        IDENTITY_PROJECTION
    }
    fn view(&self, _: &SessionHeader, events: &[Arc<SessionEvent>]) -> Value {
        SubagentIdentity::view(SubagentIdentity::fold(events.iter().map(|e| &**e)).as_ref())
    }
}

/// Registers `subagentTiming` and `subagent` with `registry`. Dropping the guard unregisters
/// both. Fails (registering neither) when either name is taken.
pub fn register_projections(registry: &ProjectionRegistry) -> Result<Registration, DuplicateProjection> {
    let timing = registry.register(Arc::new(TimingProjection))?;
    let identity = registry.register(Arc::new(IdentityProjection))?;
    Ok(Registration::all(vec![timing, identity]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent::{Session, SessionMeta, TurnEndReason};

    fn ev(kind: &str, seq: u64, time: u64) -> SessionEvent {
        let data = match kind {
            "turn/start" => EventData::TurnStart { turn: 1 },
            "turn/end" => EventData::TurnEnd {
                turn: 1,
                reason: TurnEndReason::Completed,
            },
            "subagent/descriptor" => EventData::other(
                SUBAGENT_DESCRIPTOR_EVENT,
                json!({"version": 2, "mode": "one-shot", "provider": "spawn"}),
            ),
            other => EventData::other(other, json!({})),
        };
        SessionEvent {
            seq,
            time,
            data,
            surface: None,
            ignorable: false,
        }
    }

    fn fold(events: &[SessionEvent]) -> Value {
        TimingState::fold(events).view()
    }

    /// spec: SEAM-117, TIME-1 — both projections register with the registry, a fresh session
    /// shows `{settledMs: 0}` and `null`, and both keys disappear when the guard is dropped.
    #[test]
    fn seam_117_time_1_projections_register_and_unregister() {
        let registry = ProjectionRegistry::new();
        let guard = register_projections(&registry).unwrap();
        let header = SessionMeta::default().into_header("s".into(), 1).unwrap();
        let session = Session::new(header, None).unwrap();
        let before = registry.snapshot(&session);
        assert_eq!(before[TIMING_PROJECTION], json!({"settledMs": 0}));
        assert_eq!(before[IDENTITY_PROJECTION], Value::Null);
        assert!(register_projections(&registry).is_err(), "names are unique");
        drop(guard);
        let after = registry.snapshot(&session);
        assert!(!after.contains_key(TIMING_PROJECTION));
        assert!(!after.contains_key(IDENTITY_PROJECTION));
    }

    /// spec: SEAM-118, TIME-2
    #[test]
    fn seam_118_time_2_descriptor_resets_and_later_turns_sum() {
        let log = [
            ev("turn/start", 0, 100),
            ev("subagent/descriptor", 1, 110),
            ev("turn/end", 2, 300),
            ev("turn/start", 3, 1_000),
            ev("subagent/descriptor", 4, 1_100),
            ev("turn/end", 5, 4_100),
            ev("turn/start", 6, 10_000),
            ev("turn/end", 7, 12_000),
        ];
        assert_eq!(fold(&log), json!({"settledMs": 5_100}));
    }

    /// spec: SEAM-119, TIME-3
    #[test]
    fn seam_119_time_3_open_turn_bounds_and_reversed_clock() {
        let log = [
            ev("turn/start", 0, 1_000),
            ev("subagent/descriptor", 1, 1_100),
            ev("turn/end", 2, 900),
            ev("turn/start", 3, 2_000),
            ev("assistant/chunk", 4, 2_500),
        ];
        assert_eq!(
            fold(&log),
            json!({"settledMs": 0, "active": {"since": 2_000, "through": 2_500}})
        );
    }

    /// spec: SEAM-120, TIME-4
    #[test]
    fn seam_120_time_4_pre_descriptor_turns_and_unrelated_events_are_ignored() {
        let initial = TimingState::default();
        assert_eq!(initial.apply(&ev("assistant/chunk", 0, 1)), initial);
        assert_eq!(initial.apply(&ev("turn/end", 1, 2)), initial);
        let described = initial.apply(&ev("subagent/descriptor", 2, 3));
        assert_eq!(described.apply(&ev("turn/end", 3, 4)), described);
        let log = [
            ev("turn/start", 0, 100),
            ev("turn/end", 1, 200),
            ev("subagent/descriptor", 2, 300),
        ];
        assert_eq!(fold(&log), json!({"settledMs": 0}));
    }

    #[test]
    fn identity_is_last_descriptor_and_resets_on_malformed() {
        let mut log = vec![ev("subagent/descriptor", 0, 1)];
        let id = SubagentIdentity::fold(&log).unwrap();
        assert_eq!(
            SubagentIdentity::view(Some(&id)),
            json!({"mode": "one-shot", "seq": 0})
        );
        log.push(SessionEvent {
            seq: 1,
            time: 2,
            data: EventData::other(SUBAGENT_DESCRIPTOR_EVENT, json!({"version": 2, "mode": "bogus"})),
            surface: None,
            ignorable: false,
        });
        assert_eq!(SubagentIdentity::fold(&log), None);
    }
}
