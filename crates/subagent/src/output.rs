//! The assistant-output fold (spec §2.9): the one rule that picks a child's final output, shared
//! by [`SubagentResult::output`](crate::SubagentResult::output) and
//! `subagent/end.lastAssistantMessage`, for one-shot runs and continuable epochs alike.
//!
//! 1. The candidate is the content of the **last** `assistant/message` whose content is
//!    non-empty. Empty messages (the usage-only record after a tool-only `max-tokens` step) are
//!    skipped and never displace an earlier candidate; non-empty but textless content (reasoning
//!    only) counts as non-empty.
//! 2. Without such a message, the output is the concatenation of every `text-delta` chunk's
//!    text, as one text block. Reasoning deltas and tool results never contribute.
//! 3. Without either, there is no output.
//! 4. A non-empty message wins over text streamed before or after it; the stop reason plays no
//!    part.

use agent::model::StreamChunk;
use agent::{AsEvent, ContentBlock, EventData, SessionEvent};

/// The incremental form of the output rule, for transports that observe a child as it runs.
///
/// Session-event transports feed [`push_event`](Self::push_event); chunk-only transports (an
/// out-of-process child speaking a wire protocol) feed [`push_text`](Self::push_text). Both
/// feed the same streamed fallback. [`collect`](Self::collect) may be called at any time and
/// any number of times.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AssistantOutputFold {
    /// The content of the last non-empty assistant message seen so far.
    message: Option<Vec<ContentBlock>>,
    /// Every streamed text piece so far, concatenated.
    streamed: String,
}

impl AssistantOutputFold {
    /// An empty fold; [`collect`](Self::collect) on it yields `None`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one session event: a non-empty `assistant/message` becomes the candidate, a
    /// `text-delta` chunk extends the streamed fallback, every other event is ignored.
    pub fn push_event(&mut self, event: &SessionEvent) {
        self.push_data(&event.data);
    }

    /// Folds one event payload (the same rule as [`push_event`](Self::push_event)).
    pub fn push_data(&mut self, data: &EventData) {
        match data {
            EventData::AssistantMessage { message, .. } if !message.content.is_empty() => {
                self.message = Some(message.content.clone());
            }
            EventData::AssistantChunk {
                chunk: StreamChunk::TextDelta { text, .. },
                ..
            } => self.push_text(text),
            _ => {}
        }
    }

    /// Extends the streamed fallback with text observed outside session events. An empty piece
    /// is a no-op.
    pub fn push_text(&mut self, text: &str) {
        self.streamed.push_str(text);
    }

    /// The output selected so far: the last non-empty message, else the streamed text as one
    /// text block, else `None`.
    pub fn collect(&self) -> Option<Vec<ContentBlock>> {
        if let Some(content) = &self.message {
            return Some(content.clone());
        }
        (!self.streamed.is_empty()).then(|| vec![ContentBlock::text(self.streamed.clone())])
    }

    /// Like [`collect`](Self::collect), consuming the fold.
    pub fn into_output(self) -> Option<Vec<ContentBlock>> {
        if self.message.is_some() {
            return self.message;
        }
        (!self.streamed.is_empty()).then(|| vec![ContentBlock::text(self.streamed)])
    }
}

/// Applies the output rule to a complete, **child-owned** suffix of a log (the events after any
/// fork seed or epoch boundary, so inherited parent messages can never be selected).
///
/// Accepts any iterable of events or references to them (`&[SessionEvent]`, an
/// `agent::session::EventSnapshot`'s `Arc<SessionEvent>` items, …). `None` means the child
/// produced no output; a result turns that into `[]`.
pub fn final_assistant_output<I>(events: I) -> Option<Vec<ContentBlock>>
where
    I: IntoIterator,
    I::Item: AsEvent,
{
    let mut fold = AssistantOutputFold::new();
    for event in events {
        fold.push_event(event.as_event());
    }
    fold.into_output()
}

/// [`final_assistant_output`] over a slice, without the fold's copies: the last non-empty
/// assistant message is found from the end and cloned once; only when there is none is the
/// streamed text concatenated.
pub fn final_assistant_output_of<E: AsEvent>(events: &[E]) -> Option<Vec<ContentBlock>> {
    let last_message = events.iter().rev().find_map(|e| match &e.as_event().data {
        EventData::AssistantMessage { message, .. } if !message.content.is_empty() => Some(&message.content),
        _ => None,
    });
    if let Some(content) = last_message {
        return Some(content.clone());
    }
    let mut fold = AssistantOutputFold::new();
    for event in events {
        fold.push_event(event.as_event());
    }
    fold.into_output()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent::Message;
    use agent::event::SurfaceMeta;
    use std::sync::Arc;

    /// The output rule through both entry points, which must agree.
    fn output(events: &[SessionEvent]) -> Option<Vec<ContentBlock>> {
        let folded = final_assistant_output(events);
        assert_eq!(
            final_assistant_output_of(events),
            folded,
            "slice form agrees with the fold"
        );
        folded
    }

    fn event(data: EventData) -> SessionEvent {
        SessionEvent {
            seq: 0,
            time: 0,
            data,
            surface: None,
            ignorable: false,
        }
    }

    fn message(content: Vec<ContentBlock>) -> SessionEvent {
        let mut ev = event(EventData::AssistantMessage {
            turn: 1,
            step: 1,
            message: Message::assistant(content, "p", "m"),
            usage: None,
            interrupted: false,
        });
        ev.surface = Some(SurfaceMeta::append());
        ev
    }

    fn text_delta(text: &str) -> SessionEvent {
        event(EventData::AssistantChunk {
            turn: 1,
            step: 1,
            chunk: StreamChunk::TextDelta {
                index: 0,
                text: text.into(),
            },
        })
    }

    fn reasoning_delta(text: &str) -> SessionEvent {
        event(EventData::AssistantChunk {
            turn: 1,
            step: 1,
            chunk: StreamChunk::ReasoningDelta {
                index: 0,
                text: text.into(),
            },
        })
    }

    fn tool_result(text: &str) -> SessionEvent {
        event(EventData::ToolResult {
            turn: 1,
            step: 1,
            message: Message::tool_result("call-1".into(), vec![ContentBlock::text(text)], false),
            error: None,
            meta: None,
        })
    }

    /// spec: OUT-1 — the last non-empty message wins over a later empty message.
    #[test]
    fn out_1_last_non_empty_message_wins_over_later_empty() {
        let events = [
            message(vec![ContentBlock::text("step one")]),
            message(vec![ContentBlock::text("step two")]),
            message(vec![]),
        ];
        assert_eq!(output(&events), Some(vec![ContentBlock::text("step two")]));
    }

    /// spec: OUT-2 — a non-empty message wins over text streamed before and after it.
    #[test]
    fn out_2_message_wins_over_streamed_text_around_it() {
        let events = [
            text_delta("earlier partial"),
            message(vec![ContentBlock::text("complete answer")]),
            text_delta("later partial"),
            message(vec![]),
        ];
        assert_eq!(output(&events), Some(vec![ContentBlock::text("complete answer")]));
    }

    /// spec: OUT-3 — a textless non-empty message (reasoning only) wins over streamed text.
    #[test]
    fn out_3_textless_message_counts_as_non_empty() {
        let content = vec![ContentBlock::reasoning("complete reasoning")];
        let events = [
            text_delta("streamed text"),
            message(content.clone()),
            text_delta("later partial"),
        ];
        assert_eq!(output(&events), Some(content));
    }

    /// spec: OUT-4 — without messages, text deltas concatenate into one text block; reasoning
    /// deltas and tool results are excluded.
    #[test]
    fn out_4_fallback_joins_text_deltas_only() {
        let events = [
            reasoning_delta("thinking"),
            text_delta("partial "),
            tool_result("tool output"),
            text_delta("answer"),
            message(vec![]),
        ];
        assert_eq!(output(&events), Some(vec![ContentBlock::text("partial answer")]));
    }

    /// spec: OUT-5 — no messages and no text (or only reasoning plus an empty message) → none.
    #[test]
    fn out_5_nothing_yields_none() {
        assert_eq!(output(&[]), None);
        assert_eq!(output(&[reasoning_delta("thinking"), message(vec![])]), None);
    }

    /// spec: OUT-6 — `push_text` pieces concatenate; empty pieces are ignored.
    #[test]
    fn out_6_push_text_concatenates_and_ignores_empty() {
        let mut fold = AssistantOutputFold::new();
        fold.push_text("");
        assert_eq!(fold.collect(), None);
        fold.push_text("hello ");
        fold.push_text("");
        fold.push_text("world");
        assert_eq!(fold.collect(), Some(vec![ContentBlock::text("hello world")]));
        // A later non-empty message still wins over raw text.
        fold.push_event(&message(vec![ContentBlock::text("final")]));
        assert_eq!(fold.collect(), Some(vec![ContentBlock::text("final")]));
        assert_eq!(fold.into_output(), Some(vec![ContentBlock::text("final")]));
    }

    /// spec: OUT-7 — a fresh fold collects none.
    #[test]
    fn out_7_fresh_fold_collects_none() {
        assert_eq!(AssistantOutputFold::new().collect(), None);
        assert_eq!(AssistantOutputFold::default().into_output(), None);
    }

    #[test]
    fn accepts_shared_event_snapshots() {
        let events: Vec<Arc<SessionEvent>> = vec![Arc::new(text_delta("a")), Arc::new(text_delta("b"))];
        assert_eq!(
            final_assistant_output(events.iter().map(|e| &**e)),
            Some(vec![ContentBlock::text("ab")])
        );
        assert_eq!(
            final_assistant_output(events),
            Some(vec![ContentBlock::text("ab")])
        );
    }
}
