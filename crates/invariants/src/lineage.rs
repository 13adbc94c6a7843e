//! Header-driven rules of one log: the header itself, the seed layout of a seeded (fork) child,
//! and a subagent child's own descriptor.

use agent::event::EventData;
use agent::{Origin, SessionEvent, SessionHeader};

use crate::rule::RuleId;
use crate::trace::Finding;

/// The log-only event type the seam writes to record a child's durable identity.
pub const DESCRIPTOR_TYPE: &str = "subagent/descriptor";

/// Findings about a header alone (spine §5, seam §2.11): the fields validate, and a subagent
/// child names its parent and sits at depth one or more.
pub(crate) fn header_findings(header: &SessionHeader) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Err(e) = header.validate() {
        out.push((RuleId::HEADER, format!("a valid session header ({e})")));
    }
    if header.origin == Some(Origin::Subagent) {
        if header.parent_session.is_none() {
            out.push((
                RuleId::LINEAGE,
                "a subagent child to name its parentSession".to_owned(),
            ));
        }
        if header.depth() == 0 {
            out.push((
                RuleId::DEPTH,
                "a subagent child's delegationDepth to be at least 1, got 0".to_owned(),
            ));
        }
    }
    out
}

/// What the header says about the log's layout.
#[derive(Clone, Debug, Default)]
pub(crate) struct LineageTrace {
    /// `seedLength`, when positive.
    seed_length: Option<u64>,
    /// Whether the session is a subagent child (`origin: subagent`).
    subagent: bool,
    /// Whether the seed's last event is itself `session/end-seed` (a seed taken from a resumed
    /// log by the store's general fork): the constructor then adds no second marker.
    seed_marked: bool,
    /// Seq of the first descriptor in the child's own suffix.
    first_descriptor: Option<u64>,
    /// Seq of the first `step/start` in the child's own suffix.
    first_step: Option<u64>,
    /// One past the greatest seq replayed: how many events the log holds by its own count
    /// (blank or unreadable lines, `PARSE` findings of their own, do not count).
    held: u64,
}

/// One event's deferred change to a [`LineageTrace`].
#[derive(Clone, Debug, Default)]
pub(crate) struct LineageDelta {
    descriptor: Option<u64>,
    step: Option<u64>,
    seed_marked: bool,
    seq: u64,
}

impl LineageTrace {
    pub(crate) fn new(header: Option<&SessionHeader>) -> Self {
        Self {
            seed_length: header.and_then(|h| h.seed_length).filter(|n| *n > 0),
            subagent: header.is_some_and(|h| h.origin == Some(Origin::Subagent)),
            seed_marked: false,
            first_descriptor: None,
            first_step: None,
            held: 0,
        }
    }

    /// The seq where the child's own suffix starts.
    fn own_from(&self) -> u64 {
        self.seed_length.unwrap_or(0)
    }

    /// Validates `ev` without changing the trace. Its place in the seed is its own `seq`, not
    /// its line: a blank or unreadable line inside a seed moves no event into or out of it.
    pub(crate) fn validate(&self, ev: &SessionEvent, out: &mut Vec<Finding>) -> LineageDelta {
        let mut d = LineageDelta {
            seq: ev.seq,
            ..LineageDelta::default()
        };
        let index = ev.seq;
        // `seq` is read from the log: the greatest one has no successor (no overflow).
        let last_of_seed = |n: u64| index.checked_add(1) == Some(n);
        if let Some(n) = self.seed_length {
            let end_seed = matches!(ev.data, EventData::EndSeed);
            // Only the fork provider clips its seed to the balanced completed-turn prefix
            // (providers §5.3); the store's general fork keeps trailing log-only events (spine
            // §4.8), so a seed that is not a subagent child's may end with any of them.
            if last_of_seed(n) && self.subagent && !matches!(ev.data, EventData::TurnEnd { .. }) {
                out.push((
                    RuleId::SEED,
                    format!(
                        "the seed's last event (seq {}) to be turn/end (a balanced completed-turn prefix), got {}",
                        n - 1,
                        ev.type_name()
                    ),
                ));
            }
            if last_of_seed(n) {
                d.seed_marked = end_seed;
            }
            // Spine §4.7 (4): the constructor appends the marker unless the seed already ends
            // with one.
            if index == n && !self.seed_marked && !end_seed {
                out.push((
                    RuleId::SEED,
                    format!(
                        "session/end-seed right after the {n}-event seed, got {}",
                        ev.type_name()
                    ),
                ));
            }
        }
        if !self.subagent || index < self.own_from() {
            return d;
        }
        match &ev.data {
            EventData::Other { kind, .. } if kind == DESCRIPTOR_TYPE => {
                if let Some(first) = self.first_descriptor {
                    out.push((
                        RuleId::DESCRIPTOR,
                        format!("exactly one {DESCRIPTOR_TYPE} in the child's own suffix, but seq {first} already is one"),
                    ));
                } else {
                    if let Some(step) = self.first_step {
                        out.push((
                            RuleId::DESCRIPTOR,
                            format!(
                                "{DESCRIPTOR_TYPE} before the child's first model request, but step/start at seq {step} came first"
                            ),
                        ));
                    }
                    d.descriptor = Some(ev.seq);
                }
            }
            EventData::StepStart { .. } if self.first_step.is_none() => {
                if self.first_descriptor.is_none() {
                    out.push((
                        RuleId::DESCRIPTOR,
                        format!("a {DESCRIPTOR_TYPE} in the child's own suffix before its first step/start"),
                    ));
                }
                d.step = Some(ev.seq);
            }
            _ => {}
        }
        d
    }

    /// Commits a delta computed by [`LineageTrace::validate`].
    pub(crate) fn apply(&mut self, d: LineageDelta) {
        self.seed_marked |= d.seed_marked;
        self.held = self.held.max(d.seq.saturating_add(1));
        if self.first_descriptor.is_none() {
            self.first_descriptor = d.descriptor;
        }
        if self.first_step.is_none() {
            self.first_step = d.step;
        }
    }

    /// End-of-log findings: a seeded log holds its whole seed and the end-seed marker (the
    /// seed's own last event when it already is one), counted by seq.
    pub(crate) fn finish(&self, out: &mut Vec<Finding>) {
        let events = self.held;
        if let Some(n) = self.seed_length
            && (events < n || (events == n && !self.seed_marked))
        {
            out.push((
                RuleId::SEED,
                format!("the {n}-event seed followed by session/end-seed, but the log holds {events} events"),
            ));
        }
    }
}
