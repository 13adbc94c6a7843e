//! The store's general fork (spec §4.8 contrast paragraph, §6): seed events for a new session
//! taken from a source log through a turn boundary.
//!
//! Unlike the balanced completed-turn prefix the fork provider seeds its children with
//! ([`agent::balanced_completed_turn_prefix`], which clips at the last `turn/end`), the store
//! fork:
//!
//! * forks **through a boundary**: an explicit seq, or by default the latest boundary — the
//!   last `turn/end` of the log (the start of the log when no turn ever closed);
//! * **includes the trailing log-only events**: the events after the boundary that stand
//!   between turns (plugin events such as `subagent/descriptor` or `sandbox/mode`, inbox
//!   splices, between-turn messages), up to the next event that belongs to a turn;
//! * **rejects a boundary inside an open turn** with [`ForkError::OpenTurn`] (code
//!   [`OPEN_TURN`]): a boundary at a `turn/start` or at any event after it and before its
//!   `turn/end` would seed the child with half a turn.
//!
//! The seed is a verbatim copy of a prefix of the source log (so `seq == index` holds), ready
//! for [`SessionStore::prepare`](agent::SessionStore::prepare) or
//! [`CreateAgentOptions::seed`](agent::CreateAgentOptions); the session constructor adds the
//! `session/end-seed` marker. None of the providers uses this fork.

use agent::{AsEvent, EventData, SessionEvent, SessionId, SessionMeta};

/// [`ForkError::OpenTurn`]'s code.
pub const OPEN_TURN: &str = "OPEN_TURN";
/// [`ForkError::BoundaryOutOfRange`]'s code.
pub const BOUNDARY_OUT_OF_RANGE: &str = "BOUNDARY_OUT_OF_RANGE";
/// [`ForkError::NotFound`]'s code.
pub const NOT_FOUND: &str = "NOT_FOUND";
/// [`ForkError::Duplicate`]'s code.
pub const DUPLICATE: &str = "DUPLICATE";

/// Why a fork was refused. Nothing is created when one is returned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForkError {
    /// The boundary lies inside an open turn (at its `turn/start` or after it, before its
    /// `turn/end`).
    #[error("fork boundary seq {boundary} is inside open turn {turn}")]
    OpenTurn {
        /// The requested boundary.
        boundary: u64,
        /// The turn open at it.
        turn: u64,
    },
    /// The boundary names no event of the source log.
    #[error("fork boundary seq {boundary} is outside the source log of {len} events")]
    BoundaryOutOfRange {
        /// The requested boundary.
        boundary: u64,
        /// The source log's length.
        len: u64,
    },
    /// The source session is not live in the store.
    #[error("fork source session {0} is not live in the store")]
    NotFound(SessionId),
    /// The requested child id is live in the store already.
    #[error("fork child id {0} is already live in the store")]
    Duplicate(SessionId),
}

impl ForkError {
    /// The stable error code: [`OPEN_TURN`], [`BOUNDARY_OUT_OF_RANGE`], [`NOT_FOUND`] or
    /// [`DUPLICATE`].
    pub fn code(&self) -> &'static str {
        match self {
            Self::OpenTurn { .. } => OPEN_TURN,
            Self::BoundaryOutOfRange { .. } => BOUNDARY_OUT_OF_RANGE,
            Self::NotFound(_) => NOT_FOUND,
            Self::Duplicate(_) => DUPLICATE,
        }
    }
}

/// The seed of a fork ([`fork_seed`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ForkSeed {
    /// The seq of the boundary the fork went through; `None` when it forked from the start of
    /// the log (no boundary given and no turn ever closed).
    pub boundary: Option<u64>,
    /// The events through the boundary plus the trailing log-only events, copied verbatim.
    pub events: Vec<SessionEvent>,
}

/// A store fork ([`MemorySessionStore::fork`](super::MemorySessionStore::fork)): what a new
/// session needs to start from the source's history.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionFork {
    /// The child's id (the requested one, or a fresh one).
    pub child_id: SessionId,
    /// The seed and the boundary it went through.
    pub seed: ForkSeed,
    /// Metadata for the child's header: `parentSession` = the source, `seedLength` = the seed
    /// length (so the child replays none of the source's pending inbox work), and the source's
    /// `cwd`.
    pub meta: SessionMeta,
}

/// Whether an event belongs to a turn (it may only stand inside one), as opposed to the
/// log-only events that may stand between turns.
fn belongs_to_turn(data: &EventData) -> bool {
    matches!(
        data,
        EventData::TurnStart { .. }
            | EventData::TurnEnd { .. }
            | EventData::RequestHeader { .. }
            | EventData::RequestContext { .. }
    ) || data.step_scope().is_some()
}

/// Computes the seed of a fork of `events` (a log, `seq == index`) through `boundary`, or
/// through the latest boundary when `None`. See the [module docs](self) for the rules.
pub fn fork_seed<E: AsEvent>(events: &[E], boundary: Option<u64>) -> Result<ForkSeed, ForkError> {
    let through = match boundary {
        Some(seq) => {
            let len = events.len() as u64;
            let index = usize::try_from(seq)
                .ok()
                .filter(|i| *i < events.len())
                .ok_or(ForkError::BoundaryOutOfRange { boundary: seq, len })?;
            let mut open: Option<u64> = None;
            for event in &events[..=index] {
                match event.as_event().data {
                    EventData::TurnStart { turn } => open = Some(turn),
                    EventData::TurnEnd { .. } => open = None,
                    _ => {}
                }
            }
            if let Some(turn) = open {
                return Err(ForkError::OpenTurn { boundary: seq, turn });
            }
            Some(index)
        }
        None => events
            .iter()
            .rposition(|e| matches!(e.as_event().data, EventData::TurnEnd { .. })),
    };
    let mut end = through.map_or(0, |i| i + 1);
    while end < events.len() && !belongs_to_turn(&events[end].as_event().data) {
        end += 1;
    }
    Ok(ForkSeed {
        boundary: through.map(|i| i as u64),
        events: events[..end].iter().map(|e| e.as_event().clone()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use agent::{Message, Session, SessionStore, SurfaceMeta, TurnEndReason};
    use serde_json::json;

    use super::*;
    use crate::runtime::MemorySessionStore;

    /// A live session in `store` whose log is: a descriptor, turn 1 (closed), an inbox accept
    /// and a policy switch between turns, turn 2 (closed), a trailing descriptor update, and
    /// turn 3 still open.
    ///
    /// | seq | event |
    /// |---|---|
    /// | 0 | `subagent/descriptor` |
    /// | 1 | `turn/start 1` |
    /// | 2 | `step/start 1.1` |
    /// | 3 | `user/message` |
    /// | 4 | `step/end 1.1` |
    /// | 5 | `turn/end 1` |
    /// | 6 | `sandbox/mode` |
    /// | 7 | `agent/inbox/spliced` (accept) |
    /// | 8 | `turn/start 2` |
    /// | 9 | `turn/end 2` |
    /// | 10 | `x/note` |
    /// | 11 | `turn/start 3` |
    /// | 12 | `step/start 3.1` |
    fn source(store: &MemorySessionStore) -> (Arc<Session>, agent::Registration) {
        let session = store.prepare("src".into(), None, SessionMeta::default()).unwrap();
        let append = |data: EventData, surface: Option<SurfaceMeta>| {
            session.append(data, surface).unwrap();
        };
        let end = |turn| EventData::TurnEnd {
            turn,
            reason: TurnEndReason::Completed,
        };
        append(
            EventData::other("subagent/descriptor", json!({"version": 2})),
            None,
        );
        append(EventData::TurnStart { turn: 1 }, None);
        append(EventData::StepStart { turn: 1, step: 1 }, None);
        append(
            EventData::UserMessage(Message::user_text("hi")),
            Some(SurfaceMeta::append()),
        );
        append(EventData::StepEnd { turn: 1, step: 1 }, None);
        append(end(1), None);
        append(
            EventData::SandboxMode {
                mode: "read-only".into(),
                source: None,
            },
            None,
        );
        append(
            EventData::InboxSpliced(agent::InboxSplice {
                target: agent::InboxTarget::NextTurn,
                start: 0,
                removed_count: None,
                inserted: vec![Message::user_text("next")],
                outcome: None,
            }),
            None,
        );
        append(EventData::TurnStart { turn: 2 }, None);
        append(end(2), None);
        append(EventData::other("x/note", json!({"n": 1})), None);
        append(EventData::TurnStart { turn: 3 }, None);
        append(EventData::StepStart { turn: 3, step: 1 }, None);
        let guard = store.enter(session.clone()).unwrap();
        (session, guard)
    }

    fn types(seed: &ForkSeed) -> Vec<&str> {
        seed.events.iter().map(SessionEvent::type_name).collect()
    }

    /// spec: SPN-62 — the store fork goes through an explicit or the latest boundary, keeps the
    /// trailing log-only events (which the balanced prefix drops), and refuses a boundary inside
    /// an open turn with `OPEN_TURN`.
    #[test]
    fn spn_62_store_fork_includes_trailing_log_only_events_and_rejects_open_turn_boundaries() {
        let store = MemorySessionStore::default();
        let (session, _guard) = source(&store);
        let log = session.events();

        // Latest boundary: the last `turn/end` (seq 9), plus the trailing `x/note`; the open
        // turn 3 is left out.
        let latest = store.fork(session.id(), None, Some("child".into())).unwrap();
        assert_eq!(latest.child_id, SessionId::from("child"));
        assert_eq!(latest.seed.boundary, Some(9));
        assert_eq!(latest.seed.events.len(), 11);
        assert_eq!(latest.seed.events.last().unwrap().type_name(), "x/note");
        let verbatim: Vec<SessionEvent> = log[..11].iter().map(|e| (**e).clone()).collect();
        assert_eq!(latest.seed.events, verbatim);
        // The balanced completed-turn prefix stops at the `turn/end` instead.
        assert_eq!(agent::balanced_completed_turn_prefix(&log[..]).len(), 10);
        assert_eq!(latest.meta.parent_session, Some(session.id().clone()));
        assert_eq!(latest.meta.seed_length, Some(11));

        // Explicit boundary at turn 1's end: the between-turn `sandbox/mode` and inbox accept
        // come along, turn 2 does not.
        let explicit = fork_seed(&log[..], Some(5)).unwrap();
        assert_eq!(explicit.boundary, Some(5));
        assert_eq!(
            types(&explicit)[4..],
            ["step/end", "turn/end", "sandbox/mode", "agent/inbox/spliced"]
        );
        // An explicit boundary on a log-only event between turns is not inside a turn either.
        assert_eq!(fork_seed(&log[..], Some(6)).unwrap().events.len(), 8);

        // Boundaries inside an open turn (its `turn/start`, a step inside it, the live turn 3).
        for (boundary, turn) in [(1, 1), (3, 1), (8, 2), (11, 3), (12, 3)] {
            let err = store.fork(session.id(), Some(boundary), None).unwrap_err();
            assert_eq!(err, ForkError::OpenTurn { boundary, turn });
            assert_eq!(err.code(), OPEN_TURN);
        }
        let err = fork_seed(&log[..], Some(13)).unwrap_err();
        assert_eq!(err.code(), BOUNDARY_OUT_OF_RANGE);

        // The seed makes a valid child session (the constructor adds `session/end-seed`), and a
        // fresh child id is minted when none is given.
        let fresh = store.fork(session.id(), Some(5), None).unwrap();
        assert_ne!(&fresh.child_id, session.id());
        let child = store
            .prepare(latest.child_id, Some(latest.seed.events), latest.meta)
            .unwrap();
        assert_eq!(child.first_live_seq(), 11);
        assert_eq!(child.events()[11].type_name(), "session/end-seed");
        assert_eq!(child.header().seed_length, Some(11));
    }

    #[test]
    fn fork_without_a_closed_turn_keeps_the_leading_log_only_events() {
        let store = MemorySessionStore::default();
        let session = store.prepare("s".into(), None, SessionMeta::default()).unwrap();
        session
            .append(EventData::other("subagent/descriptor", json!({})), None)
            .unwrap();
        let seed = fork_seed(&session.events()[..], None).unwrap();
        assert_eq!((seed.boundary, seed.events.len()), (None, 1));
        session.append(EventData::TurnStart { turn: 1 }, None).unwrap();
        let seed = fork_seed(&session.events()[..], None).unwrap();
        assert_eq!((seed.boundary, seed.events.len()), (None, 1));
        assert!(fork_seed::<SessionEvent>(&[], None).unwrap().events.is_empty());
    }

    #[test]
    fn fork_refuses_unknown_sources_and_live_child_ids() {
        let store = MemorySessionStore::default();
        let err = store.fork(&"nope".into(), None, None).unwrap_err();
        assert_eq!((err.code(), err), (NOT_FOUND, ForkError::NotFound("nope".into())));
        let (session, _guard) = source(&store);
        let err = store
            .fork(session.id(), None, Some(session.id().clone()))
            .unwrap_err();
        assert_eq!(err.code(), DUPLICATE);
    }
}
