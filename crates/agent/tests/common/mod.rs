//! Small log builders shared by the integration tests of the pure functions over logs.
#![allow(dead_code)]

use agent::content::ContentBlock;
use agent::event::{InboxSplice, InboxTarget, SpliceOutcome};
use agent::model::LlmFailure;
use agent::{CancelCause, EventData, Message, SessionEvent, SurfaceMeta, TurnEndReason};

/// Builds a log with `seq == index`, surface metadata on surface events, time = seq.
#[derive(Clone, Debug, Default)]
pub struct Log {
    events: Vec<SessionEvent>,
}

impl Log {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one event with `surfaceOp: append` when it is a surface type.
    pub fn push(&mut self, data: EventData) -> &mut Self {
        let surface = data.is_surface().then(SurfaceMeta::append);
        self.push_with(data, surface)
    }

    /// Appends one event with explicit surface metadata.
    pub fn push_with(&mut self, data: EventData, surface: Option<SurfaceMeta>) -> &mut Self {
        let seq = self.events.len() as u64;
        self.events.push(SessionEvent {
            seq,
            time: seq,
            data,
            surface,
            ignorable: false,
        });
        self
    }

    pub fn turn_start(&mut self, turn: u64) -> &mut Self {
        self.push(EventData::TurnStart { turn })
    }

    pub fn turn_end(&mut self, turn: u64, reason: TurnEndReason) -> &mut Self {
        self.push(EventData::TurnEnd { turn, reason })
    }

    pub fn step_start(&mut self, turn: u64, step: u64) -> &mut Self {
        self.push(EventData::StepStart { turn, step })
    }

    pub fn step_end(&mut self, turn: u64, step: u64) -> &mut Self {
        self.push(EventData::StepEnd { turn, step })
    }

    pub fn user(&mut self, text: &str) -> &mut Self {
        self.push(EventData::UserMessage(Message::user_text(text)))
    }

    pub fn assistant(&mut self, turn: u64, step: u64, content: Vec<ContentBlock>) -> &mut Self {
        self.push(EventData::AssistantMessage {
            turn,
            step,
            message: Message::assistant(content, "p", "m"),
            usage: None,
            interrupted: false,
        })
    }

    pub fn tool_call(&mut self, turn: u64, step: u64, id: &str) -> &mut Self {
        self.push(EventData::ToolCall {
            turn,
            step,
            call_id: id.into(),
            name: "read".into(),
            arguments: "{}".into(),
        })
    }

    pub fn tool_result(&mut self, turn: u64, step: u64, id: &str, text: &str) -> &mut Self {
        self.push(EventData::ToolResult {
            turn,
            step,
            message: Message::tool_result(id.into(), vec![ContentBlock::text(text)], false),
            error: None,
            meta: None,
        })
    }

    /// An accepted message, as the inbox logs it (a pure insert).
    pub fn accept(&mut self, text: &str) -> &mut Self {
        self.push(EventData::InboxSpliced(InboxSplice {
            target: InboxTarget::NextTurn,
            start: 0,
            removed_count: None,
            inserted: vec![Message::user_text(text)],
            outcome: None,
        }))
    }

    /// The step-boundary read of one pending message (a claim).
    pub fn claim(&mut self) -> &mut Self {
        self.push(EventData::InboxSpliced(InboxSplice {
            target: InboxTarget::NextTurn,
            start: 0,
            removed_count: Some(1),
            inserted: vec![],
            outcome: None,
        }))
    }

    /// A cancellation of one pending message that leaves nothing behind.
    pub fn cancel_pending(&mut self) -> &mut Self {
        self.push(EventData::InboxSpliced(InboxSplice {
            target: InboxTarget::NextTurn,
            start: 0,
            removed_count: Some(1),
            inserted: vec![],
            outcome: Some(SpliceOutcome::Canceled),
        }))
    }

    /// A cancellation that inserts a replacement.
    pub fn cancel_replacing(&mut self, text: &str) -> &mut Self {
        self.push(EventData::InboxSpliced(InboxSplice {
            target: InboxTarget::NextTurn,
            start: 0,
            removed_count: Some(1),
            inserted: vec![Message::user_text(text)],
            outcome: Some(SpliceOutcome::Canceled),
        }))
    }

    /// One whole turn that claimed its input and reached a model step.
    pub fn stepped_turn(&mut self, turn: u64, reason: TurnEndReason) -> &mut Self {
        self.turn_start(turn)
            .claim()
            .step_start(turn, 1)
            .step_end(turn, 1)
            .turn_end(turn, reason)
    }

    pub fn other(&mut self, kind: &str) -> &mut Self {
        self.push(EventData::other(kind, serde_json::json!({"x": 1})))
    }

    pub fn events(&self) -> &[SessionEvent] {
        &self.events
    }

    pub fn last(&self) -> &SessionEvent {
        self.events.last().expect("the log is not empty")
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }
}

pub fn completed() -> TurnEndReason {
    TurnEndReason::Completed
}

pub fn aborted(cause: CancelCause) -> TurnEndReason {
    TurnEndReason::Aborted { reason: cause }
}

pub fn errored(message: &str) -> TurnEndReason {
    TurnEndReason::Error {
        error: LlmFailure::unknown(message),
    }
}
