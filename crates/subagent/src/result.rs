//! A delegation's terminal value: [`SubagentResult`] and the open [`StopReason`] set (spec §2.8),
//! the diagnostic bound, and the one map from a child's `turn/end` reason to a stop reason
//! (`inprocess-providers.md` §3.7, seam §2.14.7).

use std::fmt;
use std::str::FromStr;

use agent::{AsEvent, ConsumedWork, ContentBlock, TurnEndReason, fold_consumed_work};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Why a delegation ended. An **open** set: the known members below plus any other string kept
/// verbatim in [`StopReason::Other`].
///
/// Consumers branch on the known members and must treat every unknown member as a failure. Any
/// reason other than [`StopReason::Completed`] means the output may be partial.
///
/// Serialized as a plain string in the spec's spelling: `completed`, `aborted`, `error`,
/// `max-tokens`, `refusal`, or the raw string. Parsing a known spelling always yields the typed
/// member, never `Other`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopReason {
    /// The child finished its task.
    Completed,
    /// The request token or the run's disposal stopped the child.
    Aborted,
    /// A model, transport or other failure ended the child.
    Error,
    /// The child hit its output-token ceiling.
    MaxTokens,
    /// The child declined the task (also: a pre-step rejection discarded the claimed input).
    Refusal,
    /// A reason this crate does not know. Never holds a known spelling.
    Other(String),
}

impl StopReason {
    /// The reason in its wire spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Completed => "completed",
            Self::Aborted => "aborted",
            Self::Error => "error",
            Self::MaxTokens => "max-tokens",
            Self::Refusal => "refusal",
            Self::Other(s) => s,
        }
    }

    /// Parses a wire spelling; known spellings map to their typed member, anything else to
    /// [`StopReason::Other`].
    pub fn parse(s: &str) -> Self {
        match s {
            "completed" => Self::Completed,
            "aborted" => Self::Aborted,
            "error" => Self::Error,
            "max-tokens" => Self::MaxTokens,
            "refusal" => Self::Refusal,
            other => Self::Other(other.to_owned()),
        }
    }

    /// Whether this is [`StopReason::Completed`] (the only success).
    pub fn is_completed(&self) -> bool {
        matches!(self, Self::Completed)
    }

    /// Applies the one-shot driver's local-cancellation rule (`inprocess-providers.md` §3.7
    /// step 4): when the run was cancelled (request token or disposal) any reason other than
    /// `completed` becomes `aborted`; a turn that already completed stays `completed`.
    pub fn after_cancellation(self, cancelled: bool) -> Self {
        if cancelled && !self.is_completed() {
            Self::Aborted
        } else {
            self
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StopReason {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::parse(s))
    }
}

impl From<&str> for StopReason {
    fn from(s: &str) -> Self {
        Self::parse(s)
    }
}

impl Serialize for StopReason {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for StopReason {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Self::parse(&s))
    }
}

/// The largest a [`SubagentResult::diagnostic`] may be, in UTF-8 bytes.
pub const MAX_DIAGNOSTIC_BYTES: usize = 4096;

/// The marker [`cap_diagnostic`] appends to a diagnostic it had to shorten.
pub const DIAGNOSTIC_TRUNCATION_SUFFIX: &str = "\n[diagnostic truncated]";

/// Bounds a provider-authored diagnostic to [`MAX_DIAGNOSTIC_BYTES`].
///
/// Text that fits is returned unchanged. Longer text keeps its longest prefix that fits in
/// `MAX_DIAGNOSTIC_BYTES - DIAGNOSTIC_TRUNCATION_SUFFIX.len()` bytes, cut on a character boundary
/// (never splitting a UTF-8 sequence, never producing a replacement character), followed by
/// [`DIAGNOSTIC_TRUNCATION_SUFFIX`]. The result is always at most `MAX_DIAGNOSTIC_BYTES` bytes.
pub fn cap_diagnostic(text: &str) -> String {
    if text.len() <= MAX_DIAGNOSTIC_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_DIAGNOSTIC_BYTES - DIAGNOSTIC_TRUNCATION_SUFFIX.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = String::with_capacity(end + DIAGNOSTIC_TRUNCATION_SUFFIX.len());
    out.push_str(&text[..end]);
    out.push_str(DIAGNOSTIC_TRUNCATION_SUFFIX);
    out
}

/// The terminal value of one delegation (spec §2.8).
///
/// Child-level endings (including model and transport failures) are results, never errors.
/// Serialized as `{output, structured?, diagnostic?, stopReason}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentResult {
    /// The assistant output chosen by the output fold (§2.9); empty when the child produced
    /// neither a non-empty message nor streamed text. May be partial unless the stop reason is
    /// `completed`.
    pub output: Vec<ContentBlock>,
    /// Present only when a requested output schema was satisfied by a valid captured value.
    /// Opaque JSON to the seam; the provider validated it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<Value>,
    /// Provider-authored, non-assistant failure detail for a non-completed result: at most
    /// [`MAX_DIAGNOSTIC_BYTES`] bytes, free of tool inputs, file contents, environment values,
    /// credentials and raw protocol payloads. Presented apart from `output`; never part of
    /// `subagent/end.lastAssistantMessage`. Set it through [`SubagentResult::with_diagnostic`],
    /// which enforces the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<String>,
    /// Why the delegation ended.
    pub stop_reason: StopReason,
}

impl SubagentResult {
    /// A result with `output` and `stop_reason` and no other field.
    pub fn new(output: Vec<ContentBlock>, stop_reason: StopReason) -> Self {
        Self {
            output,
            structured: None,
            diagnostic: None,
            stop_reason,
        }
    }

    /// An `aborted` result carrying whatever output was collected.
    pub fn aborted(output: Vec<ContentBlock>) -> Self {
        Self::new(output, StopReason::Aborted)
    }

    /// Attaches a captured structured value.
    pub fn with_structured(mut self, value: Value) -> Self {
        self.structured = Some(value);
        self
    }

    /// Attaches a diagnostic, bounded by [`cap_diagnostic`].
    pub fn with_diagnostic(mut self, diagnostic: &str) -> Self {
        self.diagnostic = Some(cap_diagnostic(diagnostic));
        self
    }

    /// The output as `subagent/end.lastAssistantMessage` carries it: `None` (key omitted) when
    /// the output is empty.
    pub fn last_assistant_message(&self) -> Option<&[ContentBlock]> {
        (!self.output.is_empty()).then_some(self.output.as_slice())
    }
}

/// Maps the `turn/end` reason of a one-shot child's accounting turn (the consumed-work fold's
/// `end` over the child's own events) to the recorded stop reason — the one place this map
/// lives (`inprocess-providers.md` §3.7 step 3):
///
/// | turn-end reason | stop reason |
/// |---|---|
/// | `completed` | `completed` |
/// | `max-tokens` | `max-tokens` |
/// | `aborted` (any cause) | `aborted` |
/// | `blocked` | `refusal` |
/// | `error`, `interrupted`, any unknown reason, or no accounting turn (`None`) | `error` |
///
/// Combine with [`StopReason::after_cancellation`] for the driver's local-cancellation rule.
/// Continuable epochs use [`epoch_stop_reason`], which differs on purpose.
pub fn stop_reason_for_turn_end(end: Option<&TurnEndReason>) -> StopReason {
    match end.map(TurnEndReason::kind) {
        Some("completed") => StopReason::Completed,
        Some("max-tokens") => StopReason::MaxTokens,
        Some("aborted") => StopReason::Aborted,
        Some("blocked") => StopReason::Refusal,
        _ => StopReason::Error,
    }
}

/// The recorded stop reason of a one-shot child from its **own** events (the suffix after any
/// seed): [`stop_reason_for_turn_end`] of the consumed-work fold's accounting turn. The fold's
/// `dropped_unrun` is deliberately ignored (the driver applies its own cancellation flag with
/// [`StopReason::after_cancellation`]).
pub fn one_shot_stop_reason<I>(own_events: I) -> StopReason
where
    I: IntoIterator,
    I::Item: AsEvent,
{
    stop_reason_for_turn_end(fold_consumed_work(own_events).end_reason())
}

/// Maps a continuable epoch's consumed work (the fold over the epoch's own suffix) to its stop
/// reason (seam §2.14.7). It shares the known members with [`stop_reason_for_turn_end`] and
/// differs in three places: `interrupted` reads as `aborted`; a `completed` or absent
/// accounting turn reads as `aborted` when accepted work was later cancelled unrun
/// (`dropped_unrun`), else `completed`.
///
/// A recorded failure therefore wins over a later cancellation.
pub fn epoch_stop_reason(work: &ConsumedWork) -> StopReason {
    let end = work.end_reason();
    match end.map(TurnEndReason::kind) {
        None | Some("completed") => {
            if work.dropped_unrun {
                StopReason::Aborted
            } else {
                StopReason::Completed
            }
        }
        Some("interrupted") => StopReason::Aborted,
        _ => stop_reason_for_turn_end(end),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent::{CancelCause, model::LlmFailure};
    use serde_json::json;

    #[test]
    fn stop_reasons_use_spec_spelling_and_stay_open() {
        for (reason, text) in [
            (StopReason::Completed, "completed"),
            (StopReason::Aborted, "aborted"),
            (StopReason::Error, "error"),
            (StopReason::MaxTokens, "max-tokens"),
            (StopReason::Refusal, "refusal"),
            (StopReason::Other("paused".into()), "paused"),
        ] {
            assert_eq!(serde_json::to_value(&reason).unwrap(), json!(text));
            assert_eq!(serde_json::from_value::<StopReason>(json!(text)).unwrap(), reason);
            assert_eq!(reason.to_string(), text);
        }
    }

    #[test]
    fn result_serializes_in_spec_shape() {
        let r = SubagentResult::new(vec![ContentBlock::text("hi")], StopReason::MaxTokens);
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"output": [{"type": "text", "text": "hi"}], "stopReason": "max-tokens"})
        );
        let r = SubagentResult::new(vec![], StopReason::Error)
            .with_diagnostic("denied")
            .with_structured(json!({"a": 1}));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v,
            json!({"output": [], "structured": {"a": 1}, "diagnostic": "denied", "stopReason": "error"})
        );
        assert_eq!(serde_json::from_value::<SubagentResult>(v).unwrap(), r);
    }

    /// spec: §2.13 — an empty output omits `lastAssistantMessage`; otherwise it equals the
    /// output.
    #[test]
    fn last_assistant_message_mirrors_output() {
        let empty = SubagentResult::new(vec![], StopReason::Completed);
        assert_eq!(empty.last_assistant_message(), None);
        let full = SubagentResult::new(vec![ContentBlock::text("a")], StopReason::Completed);
        assert_eq!(full.last_assistant_message(), Some(full.output.as_slice()));
    }

    /// spec: RUN-4 — a diagnostic of exactly 4096 bytes is unchanged; an oversized multibyte
    /// one is cut to at most 4096 bytes on a character boundary, ends with the truncation
    /// marker and contains no replacement character.
    #[test]
    fn run_4_diagnostic_cap() {
        let exact = "x".repeat(MAX_DIAGNOSTIC_BYTES);
        assert_eq!(cap_diagnostic(&exact), exact);
        let oversized = "权限".repeat(MAX_DIAGNOSTIC_BYTES);
        let capped = cap_diagnostic(&oversized);
        assert!(capped.len() <= MAX_DIAGNOSTIC_BYTES);
        assert!(capped.ends_with("[diagnostic truncated]"));
        assert!(!capped.contains('\u{FFFD}'));
        let prefix = capped.strip_suffix(DIAGNOSTIC_TRUNCATION_SUFFIX).unwrap();
        assert!(oversized.starts_with(prefix));
        // Longest fitting prefix: one more character would not fit.
        let budget = MAX_DIAGNOSTIC_BYTES - DIAGNOSTIC_TRUNCATION_SUFFIX.len();
        assert!(prefix.len() <= budget && prefix.len() + "权".len() > budget);
        let via_result = SubagentResult::new(vec![], StopReason::Error).with_diagnostic(&oversized);
        assert_eq!(via_result.diagnostic.as_deref(), Some(capped.as_str()));
    }

    proptest::proptest! {
        #[test]
        fn diagnostic_cap_is_bounded_and_a_prefix(s in "\\PC{0,3000}", rep in 1usize..4) {
            let text = s.repeat(rep);
            let capped = cap_diagnostic(&text);
            proptest::prop_assert!(capped.len() <= MAX_DIAGNOSTIC_BYTES);
            if text.len() <= MAX_DIAGNOSTIC_BYTES {
                proptest::prop_assert_eq!(&capped, &text);
            } else {
                let prefix = capped.strip_suffix(DIAGNOSTIC_TRUNCATION_SUFFIX).unwrap();
                proptest::prop_assert!(text.starts_with(prefix));
            }
        }
    }

    fn reason(raw: Value) -> TurnEndReason {
        serde_json::from_value(raw).unwrap()
    }

    /// spec: inprocess-providers §3.7 — the one-shot map: completed → completed, max-tokens →
    /// max-tokens, aborted (any cause) → aborted, blocked → refusal, error / interrupted /
    /// unknown / none → error; local cancellation turns every non-completed reason into aborted.
    #[test]
    fn one_shot_stop_reason_map() {
        let aborted = TurnEndReason::Aborted {
            reason: CancelCause::Parent,
        };
        let error = TurnEndReason::Error {
            error: LlmFailure::unknown("boom"),
        };
        let cases = [
            (Some(TurnEndReason::Completed), StopReason::Completed),
            (Some(TurnEndReason::MaxTokens), StopReason::MaxTokens),
            (Some(aborted), StopReason::Aborted),
            (
                Some(reason(json!({"kind": "aborted", "reason": {"kind": "legacy"}}))),
                StopReason::Aborted,
            ),
            (Some(TurnEndReason::Blocked), StopReason::Refusal),
            (Some(error), StopReason::Error),
            (Some(TurnEndReason::Interrupted), StopReason::Error),
            (Some(reason(json!({"kind": "exploded"}))), StopReason::Error),
            (None, StopReason::Error),
        ];
        for (end, expected) in cases {
            assert_eq!(stop_reason_for_turn_end(end.as_ref()), expected, "{end:?}");
        }
        assert_eq!(
            StopReason::Completed.after_cancellation(true),
            StopReason::Completed
        );
        assert_eq!(StopReason::Error.after_cancellation(true), StopReason::Aborted);
        assert_eq!(StopReason::Refusal.after_cancellation(false), StopReason::Refusal);
    }

    /// spec: §2.14.7 — the epoch map: interrupted reads as aborted; completed or no accounting
    /// turn reads as aborted only when accepted work was dropped unrun; a recorded failure wins
    /// over a later cancellation.
    #[test]
    fn epoch_stop_reason_map() {
        let work = |reason: Option<TurnEndReason>, dropped_unrun: bool| ConsumedWork {
            end: reason.map(|reason| agent::SessionEvent {
                seq: 0,
                time: 0,
                data: agent::EventData::TurnEnd { turn: 1, reason },
                surface: None,
                ignorable: false,
            }),
            dropped_unrun,
        };
        let error = TurnEndReason::Error {
            error: LlmFailure::unknown("boom"),
        };
        let cases = [
            (work(None, false), StopReason::Completed),
            (work(None, true), StopReason::Aborted),
            (work(Some(TurnEndReason::Completed), false), StopReason::Completed),
            (work(Some(TurnEndReason::Completed), true), StopReason::Aborted),
            (work(Some(TurnEndReason::Interrupted), false), StopReason::Aborted),
            (work(Some(TurnEndReason::MaxTokens), true), StopReason::MaxTokens),
            (work(Some(TurnEndReason::Blocked), true), StopReason::Refusal),
            (work(Some(error), true), StopReason::Error),
            (
                work(Some(reason(json!({"kind": "odd"}))), false),
                StopReason::Error,
            ),
        ];
        for (work, expected) in cases {
            assert_eq!(epoch_stop_reason(&work), expected, "{work:?}");
        }
    }

    /// spec: inprocess-providers §3.7 — the recorded reason comes from the consumed-work fold of
    /// the child's own events; no accounting turn at all reads as `error`.
    #[test]
    fn one_shot_stop_reason_reads_the_own_log() {
        use agent::{EventData, SessionEvent};
        let ev = |seq, data| SessionEvent {
            seq,
            time: 0,
            data,
            surface: None,
            ignorable: false,
        };
        assert_eq!(
            one_shot_stop_reason(Vec::<SessionEvent>::new()),
            StopReason::Error
        );
        let log = [
            ev(0, EventData::TurnStart { turn: 1 }),
            ev(1, EventData::StepStart { turn: 1, step: 1 }),
            ev(2, EventData::StepEnd { turn: 1, step: 1 }),
            ev(
                3,
                EventData::TurnEnd {
                    turn: 1,
                    reason: TurnEndReason::MaxTokens,
                },
            ),
        ];
        assert_eq!(one_shot_stop_reason(&log), StopReason::MaxTokens);
    }
}
