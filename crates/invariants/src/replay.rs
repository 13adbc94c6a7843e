//! [`SessionReplay`]: the streaming rule engine for one session log.

use std::borrow::Borrow;

use agent::{SessionEvent, SessionHeader, SessionId};

use crate::lineage::{LineageDelta, LineageTrace, header_findings};
use crate::policy::{ApprovalDelta, ApprovalTrace};
use crate::rule::RuleId;
use crate::trace::{CoreTrace, CoreTransition, Finding};
use crate::violation::Violation;

/// A state machine over one session log, fed one [`SessionEvent`] at a time.
///
/// It checks, per event:
///
/// * the session rules S1–S14 of providers §6.4 (S15 names the unconstrained events);
/// * the envelope rules a live session enforces on append (spine §4.2): seqs contiguous from 0
///   (`SEQ`), surface markers exactly on surface events (`SURFACE`), lossless data and model
///   provenance (`EVENT`);
/// * the replaying companions of §6.5 whose events reach the log: approval A1–A3 and sandbox X1;
/// * with a header ([`SessionReplay::with_header`]): the seed layout of a seeded child (`SEED`)
///   and, for a subagent child, one `subagent/descriptor` in its own suffix before its first
///   `step/start` (`DESCRIPTOR`).
///
/// Not checkable here: the request-reconstruction rules L1–L8 (a model request is not logged, so
/// the derived history cannot be compared with it after the fact — [`RequestCheck`](crate::RequestCheck)
/// checks them live), the tools companion's pipeline rules T1–T4 (in-memory notifications) and
/// T5 (Code Mode, left out of this workspace), and the live agent-status and lifecycle
/// companions (G1, B1–B8: [`AgentStatusCompanion`](crate::AgentStatusCompanion),
/// [`SeamLifecycleCompanion`](crate::SeamLifecycleCompanion)), whose notifications are not
/// session events.
///
/// [`SessionReplay::check`] is pure: it reports what an event would break without advancing the
/// state, which is what an append-time veto needs. [`SessionReplay::push`] checks and advances.
/// After a violation the state resynchronises on what the offending event claims, so one defect
/// is reported once rather than at every later event. A log may end inside an open turn (a crash
/// or an in-flight turn; stores repair it on resume), so [`SessionReplay::finish`] reports the
/// open turn without calling it a violation.
#[derive(Clone, Debug)]
pub struct SessionReplay {
    session: SessionId,
    index: u64,
    core: CoreTrace,
    approvals: ApprovalTrace,
    lineage: LineageTrace,
}

/// One event's validated, not yet applied, effect on a [`SessionReplay`].
#[derive(Clone, Debug)]
pub(crate) struct Transition {
    /// The seq of the event the transition belongs to.
    pub(crate) seq: u64,
    core: CoreTransition,
    approvals: ApprovalDelta,
    lineage: LineageDelta,
}

/// The state of a log at its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finish {
    /// End-of-log violations (a seeded log shorter than its seed).
    pub violations: Vec<Violation>,
    /// The number of events replayed.
    pub events: u64,
    /// The turn still open at the end of the log, if any (allowed: crash repair closes it).
    pub open_turn: Option<u64>,
    /// The step still open at the end of the log, if any.
    pub open_step: Option<u64>,
}

impl SessionReplay {
    /// A replay of session `session` without a header: header-driven rules (`SEED`,
    /// `DESCRIPTOR`) are off.
    pub fn new(session: SessionId) -> Self {
        Self::build(session, None)
    }

    /// A replay of the session `header` describes, with the header-driven rules on. The header
    /// itself is checked by [`header_violations`].
    pub fn with_header(header: &SessionHeader) -> Self {
        Self::build(header.id.clone(), Some(header))
    }

    fn build(session: SessionId, header: Option<&SessionHeader>) -> Self {
        Self {
            session,
            index: 0,
            core: CoreTrace::default(),
            approvals: ApprovalTrace::default(),
            lineage: LineageTrace::new(header),
        }
    }

    /// The session replayed.
    pub fn session(&self) -> &SessionId {
        &self.session
    }

    /// How many events (including unreadable lines) have been pushed.
    pub fn events_seen(&self) -> u64 {
        self.index
    }

    /// The open turn, if any.
    pub fn open_turn(&self) -> Option<u64> {
        self.core.open_turn()
    }

    /// The open step, if any.
    pub fn open_step(&self) -> Option<u64> {
        self.core.open_step()
    }

    /// How many calls of the open step are still unanswered (allowed at `step/end`).
    pub fn pending_calls(&self) -> usize {
        self.core.pending_calls()
    }

    pub(crate) fn violation(&self, seq: Option<u64>, (rule, expected): Finding) -> Violation {
        Violation::at(self.session.clone(), seq, rule, expected)
    }

    /// Validates `ev` as the next event without changing the state.
    pub(crate) fn transition(&self, ev: &SessionEvent) -> (Vec<Violation>, Transition) {
        let mut out = Vec::new();
        let core = self.core.validate(ev, &mut out);
        let approvals = self.approvals.validate(ev, self.core.open_turn(), &mut out);
        let lineage = self.lineage.validate(ev, &mut out);
        let violations = out.into_iter().map(|f| self.violation(Some(ev.seq), f)).collect();
        (
            violations,
            Transition {
                seq: ev.seq,
                core,
                approvals,
                lineage,
            },
        )
    }

    /// Commits a transition computed by [`SessionReplay::transition`] against this same state.
    pub(crate) fn apply(&mut self, t: Transition) {
        self.core.apply(t.core);
        self.approvals.apply(t.approvals);
        self.lineage.apply(t.lineage);
        self.index += 1;
    }

    /// What appending `ev` next would break, without changing the state. `Ok(())` means the
    /// event is acceptable.
    pub fn check(&self, ev: &SessionEvent) -> Result<(), Vec<Violation>> {
        let (violations, _) = self.transition(ev);
        if violations.is_empty() {
            Ok(())
        } else {
            Err(violations)
        }
    }

    /// Checks `ev` as the next event and advances the state; returns the violations found (empty
    /// for a valid event).
    pub fn push(&mut self, ev: &SessionEvent) -> Vec<Violation> {
        let (violations, t) = self.transition(ev);
        self.apply(t);
        violations
    }

    /// Counts one log entry that could not be read as an event: it occupies a position, and
    /// the gap of (at most) one seq it leaves is not reported again; a larger gap still is.
    pub fn skip_unreadable(&mut self) {
        self.core.note_unreadable();
        self.index += 1;
    }

    /// Ends the replay: end-of-log violations and the final state.
    pub fn finish(self) -> Finish {
        let mut out = Vec::new();
        self.lineage.finish(&mut out);
        Finish {
            violations: out.into_iter().map(|f| self.violation(None, f)).collect(),
            events: self.index,
            open_turn: self.core.open_turn(),
            open_step: self.core.open_step(),
        }
    }
}

/// What a header alone breaks: invalid fields (`HEADER`), a subagent child without a parent
/// (`LINEAGE`) or at depth 0 (`DEPTH`).
pub fn header_violations(header: &SessionHeader) -> Vec<Violation> {
    header_findings(header)
        .into_iter()
        .map(|(rule, expected)| Violation::at(header.id.clone(), None, rule, expected))
        .collect()
}

/// The outcome of replaying one log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The session replayed.
    pub session: SessionId,
    /// How many log positions were replayed: every line after the header, unreadable ones
    /// included (each occupies a seq).
    pub events: u64,
    /// Every violation, in log order (end-of-log findings last).
    pub violations: Vec<Violation>,
    /// The turn open at the end of the log, if any (not a violation).
    pub open_turn: Option<u64>,
}

impl Report {
    /// Whether the log broke no rule.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of one rule.
    pub fn of_rule(&self, rule: RuleId) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.rule == rule)
    }
}

/// The session id [`replay_log`] reports when it is given no header.
pub const UNKNOWN_SESSION: &str = "(unknown session)";

/// Replays a whole log held in memory: the header (when given) is checked and drives the
/// header rules; then every event is pushed and the replay finished.
///
/// Without a header the report's session is [`UNKNOWN_SESSION`].
pub fn replay_log<I>(header: Option<&SessionHeader>, events: I) -> Report
where
    I: IntoIterator,
    I::Item: Borrow<SessionEvent>,
{
    let (mut replay, mut violations) = match header {
        Some(h) => (SessionReplay::with_header(h), header_violations(h)),
        None => (SessionReplay::new(SessionId::new(UNKNOWN_SESSION)), Vec::new()),
    };
    for ev in events {
        violations.extend(replay.push(ev.borrow()));
    }
    let session = replay.session().clone();
    let finish = replay.finish();
    violations.extend(finish.violations);
    Report {
        session,
        events: finish.events,
        violations,
        open_turn: finish.open_turn,
    }
}
