//! The session-log trace: rules S1–S14 of providers §6.4, plus the envelope rules the session
//! object enforces on append (seq contiguity and surface markers, spine §4.2) so that logs read
//! from disk get the same scrutiny.
//!
//! Validation is pure: [`CoreTrace::validate`] computes the findings and the transition without
//! touching the trace; [`CoreTrace::apply`] commits a transition. On the valid path the
//! transition is exactly the reference's; after a violation it *resynchronises* on what the
//! offending event claims (a `turn/start 3` opens turn 3), so one defect in a log is reported
//! once instead of cascading over every later event.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hasher as _;

use agent::content::ContentBlock;
use agent::event::{EventData, SurfaceOp};
use agent::{CallId, MessageSource, SessionEvent};

use crate::rule::RuleId;

/// The error code of a synthetic not-started tool-result repair (S12's exception).
pub const TOOL_NOT_STARTED: &str = "TOOL_NOT_STARTED";

/// One finding: the rule and the "expected …" text.
pub(crate) type Finding = (RuleId, String);

/// Per-session bookkeeping of providers §6.3: `{lastSeq, openTurn, openStep, nextTurn, nextStep,
/// pendingCalls}`.
#[derive(Clone, Debug)]
pub(crate) struct CoreTrace {
    last_seq: Option<u64>,
    open_turn: Option<u64>,
    open_step: Option<u64>,
    next_turn: u64,
    next_step: u64,
    pending_calls: HashSet<CallId>,
    /// Seqs of the `assistant/chunk` events of the open step, in log order (spine §4.2 (4):
    /// what an `assistant/message`'s `sourceEventSeqs` may name).
    step_chunks: Vec<u64>,
    /// Every seq seen so far, as disjoint ranges (one range for a valid log): S1 holds that
    /// no seq repeats, also after the baseline was resynchronised below an earlier seq.
    seen: SeqRanges,
    /// Unreadable lines since the last event: each occupies one seq, so the next seq may skip
    /// up to this many values without a `SEQ` finding.
    unreadable: u64,
    /// The seqs of the current surface nodes, in surface order (spine §4.2 (3): what a
    /// `surfaceOp: replace {start, end}` must name).
    surface: Vec<u64>,
    /// For each current surface node that is a `tool/result`: a digest of what a replacement
    /// of it may not change (everything but its result's content).
    result_keys: HashMap<u64, Option<u64>>,
}

/// A set of `u64`s stored as disjoint, non-adjacent inclusive ranges `start → end`.
#[derive(Clone, Debug, Default)]
struct SeqRanges(BTreeMap<u64, u64>);

impl SeqRanges {
    fn contains(&self, n: u64) -> bool {
        self.0.range(..=n).next_back().is_some_and(|(_, end)| n <= *end)
    }

    fn insert(&mut self, n: u64) {
        if self.contains(n) {
            return;
        }
        let mut start = n;
        let mut end = n;
        if let Some((&s, &e)) = self.0.range(..n).next_back()
            && e.checked_add(1) == Some(n)
        {
            start = s;
        }
        if let Some(next) = n.checked_add(1)
            && let Some(e) = self.0.remove(&next)
        {
            end = e;
        }
        self.0.insert(start, end);
    }
}

impl Default for CoreTrace {
    fn default() -> Self {
        Self {
            last_seq: None,
            open_turn: None,
            open_step: None,
            next_turn: 1,
            next_step: 1,
            pending_calls: HashSet::new(),
            step_chunks: Vec::new(),
            seen: SeqRanges::default(),
            unreadable: 0,
            surface: Vec::new(),
            result_keys: HashMap::new(),
        }
    }
}

/// How one accepted event changes the pending-call set (and, at a boundary, the open step's
/// chunks).
#[derive(Clone, Debug)]
pub(crate) enum CallsDelta {
    None,
    Add(CallId),
    Remove(CallId),
    /// A turn or step boundary: no call is pending and no chunk belongs to an open step.
    Clear,
    /// An `assistant/chunk` of the open step: its seq and, when that breaks contiguity, the
    /// seq it should have had (a message may name either, so one renumbered chunk is reported
    /// once, as `SEQ`).
    Chunk(u64, Option<u64>),
}

/// One event's deferred change to a [`CoreTrace`].
#[derive(Clone, Debug)]
pub(crate) struct CoreTransition {
    last_seq: u64,
    open_turn: Option<u64>,
    open_step: Option<u64>,
    next_turn: u64,
    next_step: u64,
    calls: CallsDelta,
    surface: Option<SurfaceDelta>,
}

/// One surface event's place among the current surface nodes.
#[derive(Clone, Debug)]
pub(crate) struct SurfaceDelta {
    seq: u64,
    /// The positions in the current surface nodes it replaces (none: it is appended, as a
    /// session reads a replacement whose range names no current nodes).
    span: Option<(usize, usize)>,
    /// For a `tool/result`, what a later replacement of it may not change.
    key: Option<Option<u64>>,
}

fn show(v: Option<u64>) -> String {
    v.map_or_else(|| "none".to_owned(), |n| n.to_string())
}

impl CoreTrace {
    /// The open turn, if any.
    pub(crate) fn open_turn(&self) -> Option<u64> {
        self.open_turn
    }

    /// The open step, if any.
    pub(crate) fn open_step(&self) -> Option<u64> {
        self.open_step
    }

    /// The number of calls of the open step still unanswered.
    pub(crate) fn pending_calls(&self) -> usize {
        self.pending_calls.len()
    }

    /// Notes that one log line could not be read: it took one seq, so the next seq may skip
    /// one more value (never more than one per unreadable line).
    pub(crate) fn note_unreadable(&mut self) {
        self.unreadable = self.unreadable.saturating_add(1);
    }

    fn require_open_step(&self, kind: &str, turn: u64, step: u64, rule: RuleId, out: &mut Vec<Finding>) {
        if self.open_turn != Some(turn) || self.open_step != Some(step) {
            out.push((
                rule,
                format!(
                    "{kind} to name the open turn {}/step {}, got turn {turn}/step {step}",
                    show(self.open_turn),
                    show(self.open_step)
                ),
            ));
        }
    }

    /// Validates `ev` against the committed trace without changing it.
    pub(crate) fn validate(&self, ev: &SessionEvent, out: &mut Vec<Finding>) -> CoreTransition {
        let seq = ev.seq;
        match self.last_seq {
            Some(last) if seq <= last => out.push((
                RuleId::S1,
                format!("seq to strictly increase past {last}, got {seq}"),
            )),
            // After a resynchronised baseline (an earlier S1 or SEQ finding) a seq can be above
            // the previous event's and still repeat an earlier one: S1 all the same.
            _ if self.seen.contains(seq) => out.push((
                RuleId::S1,
                format!("seq to strictly increase, got {seq}, which an earlier event already has"),
            )),
            last => {
                let want = last.map_or(0, |l| l.saturating_add(1));
                // Each unreadable line before this event took one seq (or none, if it was not
                // an event at all): a gap of up to that many is excused, a larger one is not.
                let most = want.saturating_add(self.unreadable);
                if !(want..=most).contains(&seq) {
                    let expected = if most == want {
                        format!("seq {want} (seqs are contiguous from 0), got {seq}")
                    } else {
                        format!(
                            "seq {want} to {most} (seqs are contiguous from 0; each of the {} unreadable \
                             lines before it takes at most one), got {seq}",
                            self.unreadable
                        )
                    };
                    out.push((RuleId::SEQ, expected));
                }
            }
        }
        check_surface(ev, out);
        let surface = self.place_surface(ev, out);
        check_contents(ev, out);

        let mut t = CoreTransition {
            // Trusting the event's seq (rather than the maximum seen) keeps one renumbered
            // event from flagging every later one.
            last_seq: seq,
            open_turn: self.open_turn,
            open_step: self.open_step,
            next_turn: self.next_turn,
            next_step: self.next_step,
            calls: CallsDelta::None,
            surface,
        };
        let kind = ev.type_name();
        match &ev.data {
            EventData::TurnStart { turn } => {
                let turn = *turn;
                if let Some(open) = self.open_turn {
                    out.push((
                        RuleId::S2,
                        format!("no open turn at turn/start {turn}, but turn {open} is still open"),
                    ));
                }
                // With a turn still open (S2), the number that turn's missing `turn/end` would
                // have made next is also the right one: that defect is S2's, reported once.
                let after_open = self.open_turn.map(|open| open.saturating_add(1));
                if turn != self.next_turn && Some(turn) != after_open {
                    let want = after_open.unwrap_or(self.next_turn);
                    out.push((RuleId::S3, format!("turn/start {want}, got turn/start {turn}")));
                }
                t.open_turn = Some(turn);
                t.open_step = None;
                t.next_turn = turn;
                t.next_step = 1;
                t.calls = CallsDelta::Clear;
            }
            EventData::TurnEnd { turn, .. } => {
                let turn = *turn;
                if self.open_turn != Some(turn) {
                    out.push((
                        RuleId::S4,
                        format!(
                            "turn/end to name the open turn {}, got turn {turn}",
                            show(self.open_turn)
                        ),
                    ));
                }
                if let Some(step) = self.open_step {
                    out.push((
                        RuleId::S5,
                        format!("no open step at turn/end {turn}, but step {step} is still open"),
                    ));
                }
                t.open_turn = None;
                t.open_step = None;
                // Valid path: the open turn equals `next_turn`, so this is `next_turn + 1`.
                t.next_turn = if self.open_turn == Some(turn) {
                    self.next_turn.saturating_add(1)
                } else {
                    turn.saturating_add(1).max(self.next_turn)
                };
                t.calls = CallsDelta::Clear;
            }
            EventData::StepStart { turn, step } => {
                let (turn, step) = (*turn, *step);
                if self.open_turn != Some(turn) {
                    out.push((
                        RuleId::S6,
                        format!(
                            "step/start in the open turn {}, got turn {turn}",
                            show(self.open_turn)
                        ),
                    ));
                }
                if let Some(open) = self.open_step {
                    out.push((
                        RuleId::S7,
                        format!("no open step at step/start {step}, but step {open} is still open"),
                    ));
                }
                // Step numbering is per turn: against the wrong turn (S6) it has no meaning.
                if self.open_turn == Some(turn) && step != self.next_step {
                    out.push((
                        RuleId::S8,
                        format!("step/start {} in turn {turn}, got step {step}", self.next_step),
                    ));
                }
                t.open_turn = Some(turn);
                t.open_step = Some(step);
                t.next_step = step;
                t.calls = CallsDelta::Clear;
            }
            EventData::StepEnd { turn, step } => {
                self.require_open_step(kind, *turn, *step, RuleId::S9, out);
                t.open_step = None;
                t.next_step = step.saturating_add(1);
                t.calls = CallsDelta::Clear;
            }
            EventData::AssistantChunk { turn, step, .. } => {
                self.require_open_step(kind, *turn, *step, RuleId::S10, out);
                let position = self.last_seq.map_or(0, |l| l.saturating_add(1));
                t.calls = CallsDelta::Chunk(seq, (position != seq).then_some(position));
            }
            EventData::AssistantMessage { turn, step, .. } => {
                self.require_open_step(kind, *turn, *step, RuleId::S10, out);
                self.check_source_seqs(ev, out);
            }
            EventData::ToolCall {
                turn, step, call_id, ..
            } => {
                self.require_open_step(kind, *turn, *step, RuleId::S11, out);
                t.calls = CallsDelta::Add(call_id.clone());
            }
            EventData::ToolResult {
                turn,
                step,
                message,
                error,
                ..
            } => {
                let replacing = matches!(
                    ev.surface.as_ref().and_then(|s| s.surface_op.as_ref()),
                    Some(SurfaceOp::Replace { .. })
                );
                if replacing {
                    if self.open_turn.is_none() {
                        out.push((
                            RuleId::S13,
                            "an open turn around a tool/result surface replacement".to_owned(),
                        ));
                    }
                } else {
                    self.require_open_step(kind, *turn, *step, RuleId::S12, out);
                    let not_started = matches!(
                        message.content.first(),
                        Some(ContentBlock::ToolResult {
                            is_error: Some(true),
                            ..
                        })
                    ) && error.as_ref().is_some_and(|e| e.code == TOOL_NOT_STARTED);
                    let named = answered_calls(message);
                    let blocks = message
                        .content
                        .iter()
                        .filter(|b| matches!(b, ContentBlock::ToolResult { .. }))
                        .count();
                    if let [first, second, ..] = named.as_slice() {
                        out.push((
                            RuleId::S12,
                            format!(
                                "a tool/result message answering one call, but it names both {first} and {second}"
                            ),
                        ));
                    } else if blocks != 1 && !named.is_empty() {
                        // Spine §3: the block is what the model is shown as the call's answer.
                        out.push((
                            RuleId::S12,
                            format!(
                                "a tool/result message carrying exactly one tool-result block, got {blocks}"
                            ),
                        ));
                    }
                    match named.into_iter().next() {
                        Some(call) => {
                            if !not_started && !self.pending_calls.contains(&call) {
                                out.push((
                                    RuleId::S12,
                                    format!(
                                        "a tool/call {call} earlier in this step before its tool/result \
                                         (or a {TOOL_NOT_STARTED} repair)"
                                    ),
                                ));
                            }
                            t.calls = CallsDelta::Remove(call);
                        }
                        None if !not_started => out.push((
                            RuleId::S12,
                            "a tool/result message naming the call it answers".to_owned(),
                        )),
                        None => {}
                    }
                }
            }
            EventData::RequestHeader { .. } | EventData::RequestContext { .. } => {
                self.require_open_turn(kind, out);
            }
            EventData::Other { kind, .. } if kind == "todo/write" => {
                self.require_open_turn(kind, out);
            }
            // S15: user messages, the end-seed marker and every plugin-owned event are
            // unconstrained here.
            _ => {}
        }
        t
    }

    /// Spine §4.2 (4): an appended `assistant/message`'s `sourceEventSeqs` lists the seqs of the
    /// chunks that built it — `assistant/chunk` events of its own (open) step, logged before it,
    /// each once and in log order. An explicit empty list ("known empty stream") and an absent
    /// one pass; a replacing message (compaction) is not checked, its chunks being in an earlier
    /// step.
    fn check_source_seqs(&self, ev: &SessionEvent, out: &mut Vec<Finding>) {
        let Some(meta) = &ev.surface else { return };
        let (Some(SurfaceOp::Append), Some(seqs)) = (&meta.surface_op, &meta.source_event_seqs) else {
            return;
        };
        if let Some(bad) = seqs.iter().find(|s| self.step_chunks.binary_search(s).is_err()) {
            out.push((
                RuleId::SURFACE,
                format!(
                    "sourceEventSeqs to name assistant/chunk events of the open step logged before the message, but seq {bad} is not one"
                ),
            ));
        } else if let Some(pair) = seqs.windows(2).find(|w| w[0] >= w[1]) {
            out.push((
                RuleId::SURFACE,
                format!(
                    "sourceEventSeqs to list each chunk once, in log order, but {} is followed by {}",
                    pair[0], pair[1]
                ),
            ));
        }
    }

    /// Spine §4.2 (3): a surface event's place among the current surface nodes. A
    /// `surfaceOp: replace {start, end}` must name current surface nodes, `start` not after
    /// `end`; a `tool/result` replacement must rewrite exactly one current `tool/result`,
    /// changing only its result's content — what a session checks on append and a store on
    /// load, so a stored log it would refuse is not called clean.
    fn place_surface(&self, ev: &SessionEvent, out: &mut Vec<Finding>) -> Option<SurfaceDelta> {
        if !ev.data.is_surface() {
            return None;
        }
        let key = matches!(ev.data, EventData::ToolResult { .. }).then(|| result_key(&ev.data));
        let mut span = None;
        if let Some(SurfaceOp::Replace { start, end }) =
            ev.surface.as_ref().and_then(|s| s.surface_op.as_ref())
        {
            let first = self.surface.iter().position(|seq| seq == start);
            span = first.and_then(|first| {
                let last = self.surface[first..].iter().position(|seq| seq == end)?;
                Some((first, first + last))
            });
            let problem = match (span, &key) {
                (None, _) => Some(format!(
                    "surfaceOp replace {{start: {start}, end: {end}}} to name current surface nodes, start not after end"
                )),
                (Some(_), None) => None,
                (Some((first, last)), Some(_)) if first != last => {
                    Some("a tool/result surface replacement to rewrite exactly one current node".to_owned())
                }
                (Some(_), Some(key)) => match self.result_keys.get(start) {
                    Some(original) if original == key => None,
                    Some(_) => Some(
                        "a tool/result surface replacement to change only the result's content".to_owned(),
                    ),
                    None => {
                        Some("a tool/result surface replacement to target a current tool/result".to_owned())
                    }
                },
            };
            out.extend(problem.map(|p| (RuleId::SURFACE, p)));
        }
        Some(SurfaceDelta {
            seq: ev.seq,
            span,
            key,
        })
    }

    fn require_open_turn(&self, kind: &str, out: &mut Vec<Finding>) {
        if self.open_turn.is_none() {
            out.push((
                RuleId::S14,
                format!("an open turn around {kind} (core execution events are turn-enclosed)"),
            ));
        }
    }

    /// Commits a transition computed by [`CoreTrace::validate`] against this same state.
    pub(crate) fn apply(&mut self, t: CoreTransition) {
        self.last_seq = Some(t.last_seq);
        self.open_turn = t.open_turn;
        self.open_step = t.open_step;
        self.next_turn = t.next_turn;
        self.next_step = t.next_step;
        self.seen.insert(t.last_seq);
        self.unreadable = 0;
        if let Some(d) = t.surface {
            match d.span {
                Some((first, last)) => {
                    for seq in self.surface.drain(first..=last) {
                        self.result_keys.remove(&seq);
                    }
                    self.surface.insert(first, d.seq);
                }
                None => self.surface.push(d.seq),
            }
            if let Some(key) = d.key {
                self.result_keys.insert(d.seq, key);
            }
        }
        match t.calls {
            CallsDelta::None => {}
            CallsDelta::Add(c) => {
                self.pending_calls.insert(c);
            }
            CallsDelta::Remove(c) => {
                self.pending_calls.remove(&c);
            }
            CallsDelta::Clear => {
                self.pending_calls.clear();
                self.step_chunks.clear();
            }
            // Seqs only grow on the valid path; a resynchronised (out-of-order) one is kept
            // sorted so lookups stay binary searches.
            CallsDelta::Chunk(seq, position) => {
                for seq in std::iter::once(seq).chain(position) {
                    match self.step_chunks.last() {
                        Some(last) if *last >= seq => {
                            if let Err(at) = self.step_chunks.binary_search(&seq) {
                                self.step_chunks.insert(at, seq);
                            }
                        }
                        _ => self.step_chunks.push(seq),
                    }
                }
            }
        }
    }
}

/// Every distinct call a tool-result message claims to answer, in order: its source's `callId`,
/// then each tool-result block's `toolCallId`. A well-formed message names exactly one (spine
/// §3: one tool-result block, for the call its source names); the blocks are what the model is
/// shown, so a block naming another call answers that call, whatever the source says.
fn answered_calls(message: &agent::Message) -> Vec<CallId> {
    let source = match &message.source {
        MessageSource::Tool { call_id, .. } => Some(call_id),
        _ => None,
    };
    let blocks = message.content.iter().filter_map(|b| match b {
        ContentBlock::ToolResult { tool_call_id, .. } => Some(tool_call_id),
        _ => None,
    });
    let mut calls: Vec<CallId> = Vec::new();
    for call in source.into_iter().chain(blocks) {
        if !calls.contains(call) {
            calls.push(call.clone());
        }
    }
    calls
}

/// A digest of what a replacement of a `tool/result` may not change: everything but the content
/// of its result block (spine §4.2 (3), as a session checks it). A digest rather than a copy, so
/// a long log's large `meta` values are not held twice. `None` if it cannot be rendered.
fn result_key(data: &EventData) -> Option<u64> {
    let EventData::ToolResult {
        turn,
        step,
        message,
        error,
        meta,
    } = data
    else {
        return None;
    };
    let result = match message.content.first() {
        Some(ContentBlock::ToolResult {
            tool_call_id,
            is_error,
            ..
        }) => serde_json::json!({"toolCallId": tool_call_id, "isError": is_error}),
        other => serde_json::json!({"block": other}),
    };
    let bytes = serde_json::to_vec(&(
        turn,
        step,
        error,
        meta,
        &message.id,
        &message.role,
        &message.source,
        result,
    ))
    .ok()?;
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(&bytes);
    Some(hasher.finish())
}

/// Spine §4.2 (2), §4.7 (1): what a session validates in every appended or seeded event besides
/// seqs and surface markers — lossless JSON data and model provenance — so that a log read from
/// disk that a store would refuse to load is not called clean.
fn check_contents(ev: &SessionEvent, out: &mut Vec<Finding>) {
    let kind = ev.type_name();
    if let Err(reason) = agent::session::check_lossless(&ev.data.payload()) {
        out.push((
            RuleId::EVENT,
            format!("{kind} data to be losslessly JSON-serializable ({reason})"),
        ));
    }
    match &ev.data {
        EventData::AssistantMessage { message, .. } => match &message.source {
            MessageSource::Model { provider, model, .. } if !provider.is_empty() && !model.is_empty() => {}
            _ => out.push((
                RuleId::EVENT,
                "assistant/message to carry model provenance with provider and model".to_owned(),
            )),
        },
        EventData::RequestHeader { header, .. }
            if header.config.provider.is_empty() || header.config.model.is_empty() =>
        {
            out.push((
                RuleId::EVENT,
                "request/header to name provider and model".to_owned(),
            ));
        }
        _ => {}
    }
}

/// Spine §4.2 (3): surface events declare `surfaceOp`; other events carry no surface metadata;
/// only `assistant/message` carries `sourceEventSeqs`.
fn check_surface(ev: &SessionEvent, out: &mut Vec<Finding>) {
    let kind = ev.type_name();
    match (ev.data.is_surface(), &ev.surface) {
        (true, None) | (true, Some(agent::SurfaceMeta { surface_op: None, .. })) => out.push((
            RuleId::SURFACE,
            format!("surface event {kind} to declare surfaceOp"),
        )),
        (false, Some(_)) => out.push((
            RuleId::SURFACE,
            format!("no surfaceOp or sourceEventSeqs on non-surface event {kind}"),
        )),
        _ => {}
    }
    if ev.surface.as_ref().is_some_and(|s| s.source_event_seqs.is_some())
        && ev.data.is_surface()
        && !matches!(ev.data, EventData::AssistantMessage { .. })
    {
        out.push((
            RuleId::SURFACE,
            format!("sourceEventSeqs only on assistant/message, found on {kind}"),
        ));
    }
}
