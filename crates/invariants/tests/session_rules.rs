//! The session companion's checklist (`inprocess-providers.md` §7.9, ISES-*), offline through
//! [`SessionReplay`] and online through [`InvariantObserver`].

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agent::event::{EventData, SurfaceMeta, SurfaceOp};
use agent::{LogError, Session, SessionEvent, SessionObserver};
use common::*;
use invariants::{InvariantObserver, RuleId, SessionReplay, Violation, replay_log, synthetic};
use serde_json::json;

fn rules(violations: &[Violation]) -> Vec<&'static str> {
    violations.iter().map(|v| v.rule.as_str()).collect()
}

/// Replays `events` without a header and returns every violation.
fn replay(events: &[SessionEvent]) -> Vec<Violation> {
    replay_log(None, events).violations
}

/// Replays `prefix`, then reports what `next` (appended at the next seq) would break.
fn next_breaks(prefix: &[EventData], next: EventData) -> Vec<&'static str> {
    let events = log(prefix.iter().cloned());
    let mut r = SessionReplay::new("s".into());
    for e in &events {
        assert_eq!(r.push(e), vec![], "prefix must be valid");
    }
    match r.check(&ev(events.len() as u64, next)) {
        Ok(()) => vec![],
        Err(v) => rules(&v),
    }
}

fn live(id: &str) -> (Arc<Session>, Arc<InvariantObserver>) {
    let obs = InvariantObserver::shared();
    let s = Arc::new(Session::new(synthetic::header(id), None).unwrap());
    s.publish(vec![obs.clone()]);
    (s, obs)
}

fn append(s: &Session, data: EventData) -> Result<Arc<SessionEvent>, LogError> {
    let surface = surface_for(&data);
    s.append_at(data, surface, 1)
}

fn veto_reason(r: Result<Arc<SessionEvent>, LogError>) -> String {
    match r {
        Err(LogError::Vetoed { reason, .. }) => reason,
        other => panic!("expected a veto, got {other:?}"),
    }
}

/// spec: ISES-140
/// The companion is global: one observer instance checks every session it is published to,
/// wherever it was created, and keeps each session's state apart.
#[test]
fn ises_140_one_observer_serves_every_session() {
    let obs = InvariantObserver::shared();
    let a = Session::new(synthetic::header("a"), None).unwrap();
    let b = Session::new(synthetic::header("b"), None).unwrap();
    a.publish(vec![obs.clone()]);
    b.publish(vec![obs.clone()]);
    append(&a, turn_start(1)).unwrap();
    append(&a, turn_end(1)).unwrap();
    append(&b, turn_start(1)).unwrap();
    assert_eq!(obs.tracked(), 2);
    assert!(veto_reason(append(&b, turn_start(2))).contains("[S2] session \"b\""));
}

/// spec: ISES-141
#[test]
fn ises_141_well_formed_turn_step_tool_sequence_passes() {
    let seq = [
        turn_start(1),
        user("hi"),
        step_start(1, 1),
        chunk(1, 1),
        assistant(1, 1),
        tool_call(1, 1, "c1"),
        tool_result(1, 1, "c1"),
        step_end(1, 1),
        turn_end(1),
    ];
    assert_eq!(replay(&log(seq.clone())), vec![]);
    let (s, obs) = live("ok");
    for data in seq {
        append(&s, data).unwrap();
    }
    assert_eq!(s.len(), 9);
    assert_eq!(obs.violations(), vec![]);
    assert_eq!(obs.open_turn(&"ok".into()), None);
    // The synthetic logs used by the other tests are clean too.
    let l = synthetic::valid_log("big", 4, 3, 2);
    assert!(replay_log(Some(&l.header), &l.events).is_clean());
}

struct VetoOnce(AtomicBool);
impl SessionObserver for VetoOnce {
    fn check(&self, _: &Session, _: &SessionEvent) -> Result<(), String> {
        if self.0.swap(false, Ordering::SeqCst) {
            Err("later dispatch veto".into())
        } else {
            Ok(())
        }
    }
}

/// spec: ISES-142
#[test]
fn ises_142_a_later_veto_does_not_advance_the_trace() {
    let obs = InvariantObserver::shared();
    let s = Session::new(synthetic::header("veto"), None).unwrap();
    s.publish(vec![obs.clone(), Arc::new(VetoOnce(AtomicBool::new(true)))]);
    assert_eq!(veto_reason(append(&s, turn_start(1))), "later dispatch veto");
    assert!(s.is_empty());
    assert_eq!(obs.open_turn(&"veto".into()), None);
    append(&s, turn_start(1)).unwrap();
    append(&s, turn_end(1)).unwrap();
    assert_eq!(obs.violations(), vec![]);
}

struct PanicsAfterCommit;
impl SessionObserver for PanicsAfterCommit {
    fn committed(&self, _: &Session, _: &Arc<SessionEvent>) {
        panic!("hostile observer");
    }
}

/// spec: ISES-143
#[test]
fn ises_143_a_failing_post_commit_peer_does_not_block_the_transition() {
    let obs = InvariantObserver::shared();
    let s = Session::new(synthetic::header("peer"), None).unwrap();
    s.publish(vec![Arc::new(PanicsAfterCommit), obs.clone()]);
    append(&s, turn_start(1)).unwrap();
    assert_eq!(obs.open_turn(&"peer".into()), Some(1));
    append(&s, turn_end(1)).unwrap();
    // The transitions were applied: turn 2 is next, turn 3 is not.
    assert!(veto_reason(append(&s, turn_start(3))).contains("[S3]"));
    append(&s, turn_start(2)).unwrap();
    assert_eq!(
        obs.violations().iter().map(|v| v.rule).collect::<Vec<_>>(),
        vec![RuleId::S3]
    );
}

/// spec: ISES-144
#[test]
fn ises_144_non_increasing_seq_is_rejected() {
    let mut r = SessionReplay::new("s".into());
    assert_eq!(r.push(&ev(0, turn_start(1))), vec![]);
    let err = r.check(&ev(0, turn_end(1))).unwrap_err();
    assert_eq!(rules(&err), ["S1"]);
    assert_eq!(err[0].seq, Some(0));
    assert_eq!(
        err[0].to_string(),
        "[S1] session \"s\" seq 0: expected seq to strictly increase past 0, got 0"
    );
    // check() left the state alone: the right seq still passes.
    assert_eq!(r.push(&ev(1, turn_end(1))), vec![]);
}

/// spec: ISES-145
#[test]
fn ises_145_turn_numbering_and_core_enclosure() {
    // A missing turn/end is S2 alone: turn 2 is the number S3 wants once turn 1 is closed.
    assert_eq!(next_breaks(&[turn_start(1)], turn_start(2)), ["S2"]);
    assert_eq!(next_breaks(&[turn_start(1)], turn_start(3)), ["S2", "S3"]);
    assert_eq!(next_breaks(&[turn_start(1)], turn_end(2)), ["S4"]);
    assert_eq!(next_breaks(&[turn_start(1), turn_end(1)], turn_start(3)), ["S3"]);
    let steps = [turn_start(1), step_start(1, 1), step_end(1, 1)];
    assert_eq!(next_breaks(&steps, turn_end(1)), Vec::<&str>::new());
    let enclosed = [turn_start(1), step_start(1, 1)];
    for inside in [
        other("todo/write", json!({"todos": []})),
        request_header(),
        request_context(),
    ] {
        assert_eq!(next_breaks(&enclosed, inside), Vec::<&str>::new());
    }
    // Outside any turn: context-ish user messages and plugin events are fine, core execution
    // events are not.
    assert_eq!(next_breaks(&[], user("idle context")), Vec::<&str>::new());
    assert_eq!(next_breaks(&[], request_context()), ["S14"]);
    assert_eq!(next_breaks(&[], request_header()), ["S14"]);
    assert_eq!(next_breaks(&[], other("todo/write", json!({}))), ["S14"]);
    assert_eq!(
        next_breaks(&[], other("plugin/marker", json!({}))),
        Vec::<&str>::new()
    );
    assert_eq!(
        next_breaks(&[user("x"), other("plugin/marker", json!({}))], turn_start(1)),
        Vec::<&str>::new()
    );
    // Online: the message names the open turn.
    let (s, _) = live("open");
    append(&s, turn_start(1)).unwrap();
    let reason = veto_reason(append(&s, turn_start(2)));
    assert!(reason.contains("turn 1 is still open"), "{reason}");
    append(&s, request_context()).unwrap();
    let reason = veto_reason(append(&s, turn_end(2)));
    assert!(
        reason.contains("turn/end to name the open turn 1, got turn 2"),
        "{reason}"
    );
}

/// spec: ISES-146
#[test]
fn ises_146_open_step_identity_and_numbering() {
    assert_eq!(next_breaks(&[turn_start(1)], step_start(2, 1)), ["S6"]);
    let nested = [turn_start(1), step_start(1, 1)];
    assert_eq!(next_breaks(&nested, step_start(1, 2)), ["S7", "S8"]);
    assert_eq!(next_breaks(&nested, turn_end(1)), ["S5"]);
    assert_eq!(next_breaks(&nested, step_end(1, 2)), ["S9"]);
    assert_eq!(next_breaks(&nested, assistant(1, 2)), ["S10"]);
    let skipped = [turn_start(1), step_start(1, 1), step_end(1, 1)];
    assert_eq!(next_breaks(&skipped, step_start(1, 3)), ["S8"]);
    assert_eq!(next_breaks(&skipped, turn_end(1)), Vec::<&str>::new());
    let (s, _) = live("steps");
    append(&s, turn_start(1)).unwrap();
    append(&s, step_start(1, 1)).unwrap();
    let reason = veto_reason(append(&s, step_end(1, 2)));
    assert!(
        reason.contains("open turn 1/step 1, got turn 1/step 2"),
        "{reason}"
    );
    let reason = veto_reason(append(&s, step_start(1, 2)));
    assert!(
        reason.contains("[S7]") && reason.contains("no open step at step/start 2, but step 1 is still open"),
        "{reason}"
    );
    let reason = veto_reason(append(&s, turn_end(1)));
    assert!(
        reason.contains("[S5]") && reason.contains("step 1 is still open"),
        "{reason}"
    );
}

/// spec: ISES-147
#[test]
fn ises_147_chunks_outside_a_step_and_results_for_unknown_calls_are_rejected() {
    let (s, _) = live("chunk");
    append(&s, turn_start(1)).unwrap();
    let reason = veto_reason(append(&s, chunk(1, 1)));
    assert!(
        reason.contains("[S10]") && reason.contains("open turn 1/step none"),
        "{reason}"
    );
    assert_eq!(
        next_breaks(&[turn_start(1), step_start(1, 1)], tool_result(1, 1, "ghost")),
        ["S12"]
    );
    let (s, _) = live("ghost");
    append(&s, turn_start(1)).unwrap();
    append(&s, step_start(1, 1)).unwrap();
    let reason = veto_reason(append(&s, tool_result(1, 1, "ghost")));
    assert!(
        reason.contains("a tool/call ghost earlier in this step"),
        "{reason}"
    );
}

/// spec: ISES-148
#[test]
fn ises_148_fresh_tool_result_appends_are_open_step_checked() {
    let err = next_breaks(&[turn_start(1)], tool_result(1, 1, "closed"));
    assert_eq!(err, ["S12", "S12"], "no open step, and no pending call");
    let (s, _) = live("fresh");
    append(&s, turn_start(1)).unwrap();
    let reason = veto_reason(append(&s, tool_result(1, 1, "closed")));
    assert!(reason.contains("open turn 1/step none"), "{reason}");
}

fn rewritten_turn() -> Vec<EventData> {
    vec![
        turn_start(1),
        step_start(1, 1),
        tool_call(1, 1, "rewrite"),
        tool_result(1, 1, "rewrite"),
        step_end(1, 1),
        turn_end(1),
    ]
}

/// spec: ISES-149
#[test]
fn ises_149_a_replacement_inside_a_turn_is_accepted() {
    let (s, obs) = live("rewrite");
    for data in rewritten_turn() {
        append(&s, data).unwrap();
    }
    append(&s, turn_start(2)).unwrap();
    // Neither step nor pending-call checks apply to a replacement (of the result at seq 3 by
    // its own payload: the session accepts a rewrite that changes only the content).
    s.append_at(s.events()[3].data.clone(), replace(3), 1).unwrap();
    assert_eq!(obs.violations(), vec![]);
}

/// spec: ISES-150
#[test]
fn ises_150_a_replacement_outside_a_turn_is_rejected() {
    let (s, _) = live("outside");
    for data in rewritten_turn() {
        append(&s, data).unwrap();
    }
    let reason = veto_reason(s.append_at(s.events()[3].data.clone(), replace(3), 1));
    assert!(
        reason.contains("[S13]") && reason.contains("open turn"),
        "{reason}"
    );
    assert_eq!(s.len(), 6);
}

/// spec: ISES-151
#[test]
fn ises_151_not_started_repairs_and_unanswered_calls_are_accepted() {
    let repaired = [
        turn_start(1),
        step_start(1, 1),
        not_started(1, 1, "crashed"),
        step_end(1, 1),
        EventData::TurnEnd {
            turn: 1,
            reason: agent::TurnEndReason::Interrupted,
        },
    ];
    let unresolved = [
        turn_start(1),
        step_start(1, 1),
        tool_call(1, 1, "c1"),
        step_end(1, 1),
        turn_end(1),
    ];
    for seq in [repaired.to_vec(), unresolved.to_vec()] {
        assert_eq!(replay(&log(seq.clone())), vec![]);
        let (s, obs) = live("repair");
        for data in seq {
            append(&s, data).unwrap();
        }
        assert_eq!(obs.violations(), vec![]);
    }
    // A not-started marker needs both the error flag and the code: an ordinary failed result
    // for an unknown call is still rejected.
    let mut plain_error = not_started(1, 1, "x");
    if let EventData::ToolResult { error, .. } = &mut plain_error {
        error.as_mut().unwrap().code = "UNKNOWN_TOOL".into();
    }
    assert_eq!(
        next_breaks(&[turn_start(1), step_start(1, 1)], plain_error),
        ["S12"]
    );
}

/// spec: ISES-152
#[test]
fn ises_152_a_later_step_cannot_answer_an_earlier_call() {
    let prefix = [
        turn_start(1),
        step_start(1, 1),
        tool_call(1, 1, "c1"),
        step_end(1, 1),
        step_start(1, 2),
    ];
    assert_eq!(next_breaks(&prefix, tool_result(1, 2, "c1")), ["S12"]);
    let (s, _) = live("later");
    for data in prefix {
        append(&s, data).unwrap();
    }
    let reason = veto_reason(append(&s, tool_result(1, 2, "c1")));
    assert!(reason.contains("earlier in this step"), "{reason}");
}

/// spec: ISES-153
#[test]
fn ises_153_a_bad_seed_fails_priming_and_sessions_are_independent() {
    let obs = InvariantObserver::new();
    let bad = Session::new(
        synthetic::header("bad"),
        Some(log([turn_start(1), turn_start(2)])),
    )
    .unwrap();
    let err = obs.prime(&bad).unwrap_err();
    assert_eq!(rules(&err), ["S2"]);
    assert_eq!(err[0].session.as_str(), "bad");
    assert_eq!(err[0].seq, Some(1));

    let obs = InvariantObserver::shared();
    let a = Session::new(synthetic::header("a"), None).unwrap();
    let b = Session::new(synthetic::header("b"), None).unwrap();
    a.publish(vec![obs.clone()]);
    b.publish(vec![obs.clone()]);
    append(&a, turn_start(1)).unwrap();
    append(&b, turn_start(1)).unwrap();
    assert_eq!(obs.violations(), vec![]);
}

/// spec: ISES-154
#[test]
fn ises_154_a_new_observer_rebuilds_open_turn_state_from_the_log() {
    let (s, first) = live("reload");
    append(&s, turn_start(1)).unwrap();
    append(&s, step_start(1, 1)).unwrap();
    // Reload: a fresh observer replaces the first one and primes lazily from the log.
    let second = InvariantObserver::shared();
    s.publish(vec![second.clone()]);
    drop(first);
    append(&s, chunk(1, 1)).unwrap();
    assert_eq!(second.open_turn(&"reload".into()), Some(1));
    let reason = veto_reason(append(&s, turn_start(2)));
    assert!(reason.contains("turn 1 is still open"), "{reason}");
    // Explicit priming does the same.
    let third = InvariantObserver::new();
    third.prime(&s).unwrap();
    assert_eq!(third.open_turn(&"reload".into()), Some(1));
}

/// One observer serving a session id across two session objects: the first is dropped, the
/// second is the same log resumed (its seed copied, an end-seed marker appended before
/// publication). The observer follows the new object's log, not its state for the old one, so
/// the resumed session's appends are judged against what the log really holds.
#[test]
fn a_resumed_session_under_a_known_id_is_judged_by_its_own_log() {
    let (first, obs) = live("again");
    append(&first, turn_start(1)).unwrap();
    append(&first, turn_end(1)).unwrap();
    let seed: Vec<SessionEvent> = first.events().iter().map(|e| (**e).clone()).collect();
    drop(first);
    let resumed = Session::new(synthetic::header("again"), Some(seed)).unwrap();
    assert_eq!(resumed.len(), 3, "the seed and its end-seed marker");
    resumed.publish(vec![obs.clone()]);
    append(&resumed, turn_start(2)).unwrap();
    // Still checked: a second open turn is refused.
    let reason = veto_reason(append(&resumed, turn_start(3)));
    assert!(reason.contains("turn 2 is still open"), "{reason}");
    assert!(
        obs.violations().iter().all(|v| v.rule.as_str() != "SEQ"),
        "{:#?}",
        obs.violations()
    );
}

/// spec: ISES-155
#[test]
fn ises_155_end_seed_is_accepted_anywhere_and_moves_no_cursor() {
    let obs = InvariantObserver::shared();
    let balanced = Session::new(
        synthetic::header("between"),
        Some(log([turn_start(1), turn_end(1)])),
    )
    .unwrap();
    obs.prime(&balanced).unwrap();
    let open = Session::new(synthetic::header("inside"), Some(log([turn_start(1)]))).unwrap();
    let kinds: Vec<String> = open.events().iter().map(|e| e.type_name().to_owned()).collect();
    assert_eq!(kinds, ["turn/start", "session/end-seed"]);
    obs.prime(&open).unwrap();
    open.publish(vec![obs.clone()]);
    let reason = veto_reason(append(&open, turn_start(2)));
    assert!(reason.contains("turn 1 is still open"), "{reason}");
    append(&open, turn_end(1)).unwrap();
}

/// spec: ISES-156
/// Disposal: once the observer is no longer published to the session nothing is checked, and
/// `forget` drops the session's state.
#[test]
fn ises_156_removing_the_observer_removes_every_check() {
    let (s, obs) = live("disposed");
    append(&s, turn_start(1)).unwrap();
    s.publish(vec![]);
    append(&s, turn_start(2)).unwrap();
    assert_eq!(obs.violations(), vec![]);
    assert!(obs.forget(&"disposed".into()));
    assert_eq!(obs.tracked(), 0);
    assert!(!obs.forget(&"disposed".into()));
}

/// spec: IREG-133
/// Rust equivalent of the registry's failure shape: a veto names the owning package and uses
/// the standard `invariant violated by "<package>": ` prefix.
#[test]
fn ireg_133_vetoes_carry_the_owner_and_the_standard_prefix() {
    let (s, _) = live("prefix");
    let reason = veto_reason(append(&s, turn_end(1)));
    assert!(
        reason.starts_with("invariant violated by \"session\": [S4] session \"prefix\" seq 0: expected "),
        "{reason}"
    );
    let reason = veto_reason(append(
        &s,
        EventData::SandboxMode {
            mode: "yolo".into(),
            source: None,
        },
    ));
    assert!(
        reason.starts_with("invariant violated by \"sandbox-policy\": [X1]"),
        "{reason}"
    );
}

/// A veto leaves the log unchanged and records the violation; the next valid append passes.
#[test]
fn online_veto_leaves_the_log_unchanged() {
    let (s, obs) = live("unchanged");
    append(&s, turn_start(1)).unwrap();
    let before = s.events();
    assert!(append(&s, step_start(1, 2)).is_err());
    assert_eq!(s.events(), before);
    assert_eq!(obs.violations().len(), 1);
    assert_eq!(obs.violations()[0].seq, Some(1));
    append(&s, step_start(1, 1)).unwrap();
}

/// Lazy priming of a session whose existing log is broken vetoes the first append only.
#[test]
fn lazy_priming_reports_existing_defects_once() {
    let s = Session::new(synthetic::header("lazy"), Some(log([turn_end(1)]))).unwrap();
    let obs = InvariantObserver::shared();
    s.publish(vec![obs.clone()]);
    let reason = veto_reason(append(&s, user("x")));
    assert!(reason.contains("[S4]"), "{reason}");
    append(&s, user("x")).unwrap();
}

/// The approval and sandbox companions (§6.5 A1–A3, X1).
#[test]
fn approval_and_sandbox_companions() {
    let asked = |id: &str, tool: &str| other("approval/asked", json!({"id": id, "toolName": tool}));
    let decided = |id: &str, outcome: &str| other("approval/decided", json!({"id": id, "outcome": outcome}));
    let open = [turn_start(1), step_start(1, 1)];
    assert_eq!(next_breaks(&open, asked("q", "bash")), Vec::<&str>::new());
    assert_eq!(next_breaks(&[], asked("q", "bash")), ["A1"]);
    assert_eq!(next_breaks(&open, asked("q", "")), ["A1"]);
    let pending = [turn_start(1), step_start(1, 1), asked("q", "bash")];
    assert_eq!(next_breaks(&pending, asked("q", "bash")), ["A1"]);
    assert_eq!(
        next_breaks(&pending, decided("q", "allowed-once")),
        Vec::<&str>::new()
    );
    assert_eq!(next_breaks(&pending, decided("q", "maybe")), ["A2"]);
    assert_eq!(next_breaks(&pending, decided("other", "rejected")), ["A2"]);
    let answered = [turn_start(1), asked("q", "bash"), decided("q", "cancelled")];
    assert_eq!(next_breaks(&answered, decided("q", "cancelled")), ["A2"]);
    let policy = |p: &str| EventData::ApprovalPolicy {
        policy: p.into(),
        source: Some("delegation".into()),
    };
    assert_eq!(next_breaks(&[], policy("never")), Vec::<&str>::new());
    assert_eq!(next_breaks(&[], policy("sometimes")), ["A3"]);
    let mode = |m: &str| EventData::SandboxMode {
        mode: m.into(),
        source: None,
    };
    for ok in invariants::SANDBOX_MODES {
        assert_eq!(next_breaks(&[], mode(ok)), Vec::<&str>::new());
    }
    assert_eq!(next_breaks(&[], mode("root")), ["X1"]);
}

/// Envelope rules a live session enforces, checked for logs from elsewhere.
#[test]
fn seq_contiguity_and_surface_markers() {
    let mut events = log([turn_start(1), user("x"), turn_end(1)]);
    events[2].seq = 5;
    let v = replay(&events);
    assert_eq!(rules(&v), ["SEQ"]);
    assert_eq!(v[0].seq, Some(5));
    let mut first = log([turn_start(1)]);
    first[0].seq = 1;
    assert_eq!(rules(&replay(&first)), ["SEQ"]);

    let mut events = log([user("x"), turn_start(1)]);
    events[0].surface = None;
    events[1].surface = surface_for(&user("y"));
    assert_eq!(rules(&replay(&events)), ["SURFACE", "SURFACE"]);
}

/// After a defect the state resynchronises on the offending event, so a log with one missing
/// line reports one violation rather than one per later event.
#[test]
fn one_defect_is_reported_once() {
    let l = synthetic::valid_log("resync", 3, 2, 1);
    let mut events = l.events.clone();
    let start2 = events
        .iter()
        .position(|e| matches!(e.data, EventData::TurnStart { turn: 2 }))
        .unwrap();
    events.remove(start2);
    let v = replay_log(Some(&l.header), &events).violations;
    // The seq gap, then the step of turn 2 with no open turn.
    assert_eq!(rules(&v), ["SEQ", "S6"], "{v:#?}");
}

/// Providers §6.3 (4): a commit that arrives without a matching pre-commit check is itself a
/// violation (`STAGE`); the transition is still applied so the state follows the log.
#[test]
fn a_commit_without_a_staged_check_is_recorded() {
    let s = Session::new(synthetic::header("stage"), None).unwrap();
    let obs = InvariantObserver::new();
    obs.prime(&s).unwrap();
    SessionObserver::committed(&obs, &s, &Arc::new(ev(0, turn_start(1))));
    let found = obs.violations();
    assert_eq!(rules(&found), ["STAGE"]);
    assert_eq!((found[0].session.as_str(), found[0].seq), ("stage", Some(0)));
    assert_eq!(obs.open_turn(&"stage".into()), Some(1));
    // A stale stage (for another seq) is no match either.
    SessionObserver::check(&obs, &s, &ev(1, turn_end(1))).unwrap();
    SessionObserver::committed(&obs, &s, &Arc::new(ev(2, user("x"))));
    assert_eq!(rules(&obs.violations()), ["STAGE", "STAGE", "SEQ"]);
}

/// spec: SPN-60 (spine §4.2 (2), §4.7 (1)) — what a session validates on every append and seed
/// event besides seqs and surface markers is checked for logs from elsewhere too: data is
/// lossless JSON (a negative zero read from disk is not), and assistant messages and request
/// headers carry provider and model. A store refuses to load such a log, so the checker must not
/// call it clean.
#[test]
fn event_contents_a_session_would_refuse_are_flagged() {
    let mut events = log([
        turn_start(1),
        step_start(1, 1),
        request_header(),
        assistant(1, 1),
        step_end(1, 1),
        turn_end(1),
        other("x/note", json!({"v": 1.5})),
    ]);
    assert_eq!(replay(&events), vec![]);

    events[6].data = other("x/note", json!({"v": -0.0}));
    if let EventData::AssistantMessage { message, .. } = &mut events[3].data {
        message.source = agent::MessageSource::Model {
            provider: "".into(),
            model: "m".into(),
            replay_state: None,
        };
    }
    if let EventData::RequestHeader { header, .. } = &mut events[2].data {
        header.config.model = "".into();
    }
    let v = replay(&events);
    assert_eq!(rules(&v), ["EVENT", "EVENT", "EVENT"], "{v:#?}");
    assert_eq!(
        v.iter().map(|v| v.seq).collect::<Vec<_>>(),
        [Some(2), Some(3), Some(6)]
    );
    // The same from a file.
    let mut text = serde_json::to_string(&invariants::synthetic::header("f")).unwrap();
    for e in &events {
        text.push('\n');
        text.push_str(&serde_json::to_string(e).unwrap());
    }
    text.push('\n');
    let r = invariants::replay_jsonl_reader(&"f".into(), text.as_bytes()).unwrap();
    assert_eq!(
        rules(&r.violations),
        ["EVENT", "EVENT", "EVENT"],
        "{:#?}",
        r.violations
    );
}

/// spec: S11 — `tool/call` names exactly the open `(turn, step)`: outside any turn, between
/// steps, and naming another step of the open turn are each flagged S11 (offline and online),
/// and the rejected call is not pending afterwards.
#[test]
fn s11_tool_calls_name_the_open_step() {
    assert_eq!(next_breaks(&[], tool_call(1, 1, "c")), ["S11"]);
    assert_eq!(next_breaks(&[turn_start(1)], tool_call(1, 1, "c")), ["S11"]);
    let open = [turn_start(1), step_start(1, 1)];
    assert_eq!(next_breaks(&open, tool_call(1, 2, "c")), ["S11"]);
    assert_eq!(next_breaks(&open, tool_call(2, 1, "c")), ["S11"]);
    assert_eq!(next_breaks(&open, tool_call(1, 1, "c")), Vec::<&str>::new());
    let closed = [turn_start(1), step_start(1, 1), step_end(1, 1)];
    assert_eq!(next_breaks(&closed, tool_call(1, 1, "c")), ["S11"]);

    let (s, obs) = live("calls");
    append(&s, turn_start(1)).unwrap();
    append(&s, step_start(1, 1)).unwrap();
    let reason = veto_reason(append(&s, tool_call(1, 2, "c")));
    assert!(
        reason.contains("[S11]") && reason.contains("open turn 1/step 1, got turn 1/step 2"),
        "{reason}"
    );
    // The vetoed call never became pending: a result for it is still unknown.
    let reason = veto_reason(append(&s, tool_result(1, 1, "c")));
    assert!(reason.contains("[S12]"), "{reason}");
    assert_eq!(s.len(), 2);
    assert_eq!(
        obs.violations()
            .iter()
            .map(|v| v.rule.as_str())
            .collect::<Vec<_>>(),
        ["S11", "S12"]
    );
}

/// spec: SPN-60 (spine §4.2 (4)) — an appended `assistant/message`'s `sourceEventSeqs` names the
/// `assistant/chunk` events of its own step logged before it, each once and in log order. An
/// explicit empty list (a known empty stream) and an absent list pass; a seq that is not such a
/// chunk (another event, a chunk of an earlier step, a later seq), a repeated chunk and chunks
/// out of order are flagged `SURFACE`, offline and online alike.
#[test]
fn source_event_seqs_name_chunks_of_the_open_step() {
    let with_seqs = |mut e: SessionEvent, seqs: Vec<u64>| {
        e.surface.as_mut().unwrap().source_event_seqs = Some(seqs);
        e
    };
    // 0 turn/start, 1 step/start, 2 chunk, 3 chunk, 4 message, 5 step/end, 6 step/start,
    // 7 chunk, 8 message.
    let base = log([
        turn_start(1),
        step_start(1, 1),
        chunk(1, 1),
        chunk(1, 1),
        assistant(1, 1),
        step_end(1, 1),
        step_start(1, 2),
        chunk(1, 2),
        assistant(1, 2),
    ]);
    let build = |first: Vec<u64>, second: Vec<u64>| {
        let mut events = base.clone();
        events[4] = with_seqs(events[4].clone(), first);
        events[8] = with_seqs(events[8].clone(), second);
        events
    };
    for (first, second) in [(vec![2, 3], vec![7]), (vec![], vec![]), (vec![3], vec![7])] {
        assert_eq!(replay(&build(first, second)), vec![]);
    }
    for (first, second, at) in [
        (vec![2, 1], vec![7], 4), // a step/start
        (vec![2, 3], vec![3], 8), // a chunk of the previous step
        (vec![2, 9], vec![7], 4), // a later seq
        (vec![2, 4], vec![7], 4), // the message itself
        (vec![2, 2], vec![7], 4), // a chunk named twice
        (vec![3, 2], vec![7], 4), // chunks out of log order
    ] {
        let v = replay(&build(first.clone(), second.clone()));
        assert_eq!(rules(&v), ["SURFACE"], "{first:?} {second:?}: {v:#?}");
        assert_eq!(v[0].seq, Some(at));
    }

    // Online: the same candidate is vetoed.
    let (s, obs) = live("sources");
    for data in [turn_start(1), step_start(1, 1), chunk(1, 1)] {
        append(&s, data).unwrap();
    }
    let bad = SurfaceMeta {
        surface_op: Some(SurfaceOp::Append),
        source_event_seqs: Some(vec![1]),
    };
    let reason = veto_reason(s.append(assistant(1, 1), Some(bad)));
    assert!(
        reason.contains("[SURFACE]") && reason.contains("seq 1 is not one"),
        "{reason}"
    );
    let good = SurfaceMeta {
        surface_op: Some(SurfaceOp::Append),
        source_event_seqs: Some(vec![2]),
    };
    s.append(assistant(1, 1), Some(good)).unwrap();
    assert_eq!(obs.violations().len(), 1);
}

/// spec: A1, A2 — an approval id is compared as the JSON value it is: the number `1` does not
/// answer (A2) or duplicate (A1) the string `"1"`.
#[test]
fn approval_ids_of_different_json_types_are_different_ids() {
    let asked = |id: serde_json::Value| other("approval/asked", json!({"id": id, "toolName": "bash"}));
    let decided = |id: serde_json::Value| other("approval/decided", json!({"id": id, "outcome": "rejected"}));
    let pending = [turn_start(1), step_start(1, 1), asked(json!("1"))];
    assert_eq!(next_breaks(&pending, decided(json!(1))), ["A2"]);
    assert_eq!(next_breaks(&pending, asked(json!(1))), Vec::<&str>::new());
    assert_eq!(next_breaks(&pending, decided(json!("1"))), Vec::<&str>::new());
    let numeric = [turn_start(1), asked(json!(7))];
    assert_eq!(next_breaks(&numeric, decided(json!(7))), Vec::<&str>::new());
    assert_eq!(next_breaks(&numeric, decided(json!("7"))), ["A2"]);
}

/// A `tool/result` whose message answers a pending call through its source (`callId`) but whose
/// tool-result block — what the model is shown — answers another call.
fn crossed_result(turn: u64, step: u64, source: &str, block: &str) -> EventData {
    let mut message = agent::Message::tool_result(agent::CallId::new(source), vec![], false);
    message.content = vec![agent::content::ContentBlock::ToolResult {
        tool_call_id: agent::CallId::new(block),
        content: vec![],
        is_error: Some(false),
    }];
    EventData::ToolResult {
        turn,
        step,
        message,
        error: None,
        meta: None,
    }
}

/// spec: S12 (providers §6.4), ISES-147 — a result must answer a pending call of its step. A
/// message that names a pending call in its source but carries a tool-result block for a call
/// that never happened (spine §3: a tool-result message carries exactly one tool-result block,
/// for the call it answers) answers an unknown call as far as the model is concerned: it is
/// rejected offline and vetoed online, and so is one whose extra block answers an unknown call.
#[test]
fn s12_a_result_whose_blocks_answer_another_call_is_rejected() {
    let prefix = [turn_start(1), step_start(1, 1), tool_call(1, 1, "c1")];
    assert_eq!(next_breaks(&prefix, crossed_result(1, 1, "c1", "ghost")), ["S12"]);
    let mut two_blocks = crossed_result(1, 1, "c1", "c1");
    if let EventData::ToolResult { message, .. } = &mut two_blocks {
        message.content.push(agent::content::ContentBlock::ToolResult {
            tool_call_id: agent::CallId::new("ghost"),
            content: vec![],
            is_error: Some(false),
        });
    }
    assert_eq!(next_breaks(&prefix, two_blocks), ["S12"]);
    // The consistent form is still accepted.
    assert_eq!(
        next_breaks(&prefix, crossed_result(1, 1, "c1", "c1")),
        Vec::<&str>::new()
    );

    let (s, _) = live("crossed");
    for data in prefix {
        append(&s, data).unwrap();
    }
    let reason = veto_reason(append(&s, crossed_result(1, 1, "c1", "ghost")));
    assert!(reason.contains("[S12]") && reason.contains("ghost"), "{reason}");
}
