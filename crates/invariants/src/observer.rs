//! [`InvariantObserver`]: the online engine, a [`SessionObserver`] that vetoes rule-breaking
//! appends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use agent::{Session, SessionEvent, SessionId, SessionObserver};

use crate::replay::{SessionReplay, Transition, header_violations};
use crate::rule::RuleId;
use crate::violation::Violation;

/// One tracked session: its committed replay state and the transition staged by the last
/// successful pre-commit check.
struct Tracked {
    replay: SessionReplay,
    staged: Option<Transition>,
}

/// Runs [`SessionReplay`] against every append of the sessions it is published to, following
/// providers §6.3:
///
/// * **pre-commit** ([`SessionObserver::check`]): the candidate is validated against the
///   committed state *without mutating it*; a violation vetoes the append (`Err(reason)`, the
///   log stays unchanged) and otherwise the transition is staged;
/// * **post-commit** ([`SessionObserver::committed`]): exactly the staged transition is applied.
///   A later observer's veto abandons the stage, so the state does not advance; another
///   observer failing after the commit does not stop the transition.
///
/// One observer serves any number of sessions; state is kept per session id. A session is
/// primed from its current log when a store enters it ([`SessionObserver::attach`]: a bad seed
/// fails the creation), by [`InvariantObserver::prime`], or lazily at its first check (a
/// session published without a store). Lazy priming that finds
/// violations in the existing log vetoes that first append and then carries on from the
/// resynchronised state. A candidate that continues its session's log but not the state kept
/// under that id (the id now names another session object: resumed, or created again after a
/// disposal) primes the state again from that log the same way.
///
/// The veto reason is the reference's failure text, `invariant violated by "<owner>": …`, for
/// each violation, joined by `; `.
///
/// Locking: one mutex guards the per-session states and the findings list; it is held only for
/// the synchronous work of one callback and never across a call into the session other than
/// [`Session::events`] and [`Session::header`].
#[derive(Default)]
pub struct InvariantObserver {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sessions: HashMap<SessionId, Tracked>,
    found: Vec<Violation>,
}

impl std::fmt::Debug for InvariantObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("InvariantObserver")
            .field("sessions", &state.sessions.len())
            .field("found", &state.found.len())
            .finish()
    }
}

/// Replays a session's current log, header rules included.
fn replay_session(session: &Session) -> (SessionReplay, Vec<Violation>) {
    let mut replay = SessionReplay::with_header(session.header());
    let mut violations = header_violations(session.header());
    for ev in session.events().iter() {
        violations.extend(replay.push(ev));
    }
    (replay, violations)
}

fn reason(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(Violation::veto_text)
        .collect::<Vec<_>>()
        .join("; ")
}

impl InvariantObserver {
    /// An observer tracking no session yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A shareable observer, ready for [`Session::publish`].
    pub fn shared() -> Arc<Self> {
        Arc::new(Self::new())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied transition (transitions are
        // applied by plain assignments), so a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// (Re)builds `session`'s state by replaying its whole current log (providers §6.3 (1), (2)).
    /// `Err` lists what the existing log breaks; the state is kept either way, resynchronised
    /// past the defects, and the violations are recorded in [`InvariantObserver::violations`].
    pub fn prime(&self, session: &Session) -> Result<(), Vec<Violation>> {
        let (replay, violations) = replay_session(session);
        let mut state = self.lock();
        state
            .sessions
            .insert(session.id().clone(), Tracked { replay, staged: None });
        if violations.is_empty() {
            Ok(())
        } else {
            state.found.extend(violations.iter().cloned());
            Err(violations)
        }
    }

    /// Drops a session's state (for example when it is disposed). Returns whether it was
    /// tracked. A later check primes it again from its log.
    pub fn forget(&self, session: &SessionId) -> bool {
        self.lock().sessions.remove(session).is_some()
    }

    /// How many sessions are tracked.
    pub fn tracked(&self) -> usize {
        self.lock().sessions.len()
    }

    /// The open turn of a tracked session's committed state.
    pub fn open_turn(&self, session: &SessionId) -> Option<u64> {
        self.lock()
            .sessions
            .get(session)
            .and_then(|t| t.replay.open_turn())
    }

    /// Every violation this observer has found so far, in order: vetoed appends, defects found
    /// while priming, and commits that arrived without a staged check.
    pub fn violations(&self) -> Vec<Violation> {
        self.lock().found.clone()
    }
}

impl SessionObserver for InvariantObserver {
    /// Primes the session from its log as the store enters it (providers §6.3 (2)): a seed or
    /// resumed log that breaks a rule refuses the session, so its creation fails.
    fn attach(&self, session: &Session) -> Result<(), String> {
        self.prime(session).map_err(|violations| reason(&violations))
    }

    fn check(&self, session: &Session, candidate: &SessionEvent) -> Result<(), String> {
        let mut state = self.lock();
        let state = &mut *state;
        let mut primed_violations = Vec::new();
        let tracked = match state.sessions.entry(session.id().clone()) {
            std::collections::hash_map::Entry::Occupied(o) => {
                let tracked = o.into_mut();
                let len = session.len() as u64;
                if candidate.seq == len && tracked.replay.events_seen() != len {
                    // The candidate continues the session's log but not this state: the id now
                    // names another session object (resumed, or created again after a
                    // disposal) whose log this observer did not follow. The log is the truth:
                    // start over from it. (A candidate that does not continue the log is judged
                    // against the state as it is.)
                    let (replay, violations) = replay_session(session);
                    primed_violations = violations;
                    *tracked = Tracked { replay, staged: None };
                }
                tracked
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                let (replay, violations) = replay_session(session);
                primed_violations = violations;
                v.insert(Tracked { replay, staged: None })
            }
        };
        let (mut violations, transition) = tracked.replay.transition(candidate);
        if primed_violations.is_empty() && violations.is_empty() {
            tracked.staged = Some(transition);
            return Ok(());
        }
        tracked.staged = None;
        primed_violations.append(&mut violations);
        let text = reason(&primed_violations);
        state.found.extend(primed_violations);
        Err(text)
    }

    fn committed(&self, session: &Session, event: &Arc<SessionEvent>) {
        let mut state = self.lock();
        let state = &mut *state;
        let Some(tracked) = state.sessions.get_mut(session.id()) else {
            // Never checked (the observer joined after the check phase): the log, which
            // already holds `event`, is the truth.
            let (replay, violations) = replay_session(session);
            if !violations.is_empty() {
                tracing::warn!(session = %session.id(), count = violations.len(), "invariant violations in a session first seen at commit");
            }
            state.found.extend(violations);
            state
                .sessions
                .insert(session.id().clone(), Tracked { replay, staged: None });
            return;
        };
        match tracked.staged.take() {
            Some(t) if t.seq == event.seq => tracked.replay.apply(t),
            _ => {
                let v = tracked.replay.violation(
                    Some(event.seq),
                    (
                        RuleId::STAGE,
                        format!(
                            "{} to have passed the pre-commit check before its commit",
                            event.type_name()
                        ),
                    ),
                );
                tracing::warn!(violation = %v, "session append committed without a staged invariant check");
                state.found.push(v);
                let more = tracked.replay.push(event);
                state.found.extend(more);
            }
        }
    }
}
