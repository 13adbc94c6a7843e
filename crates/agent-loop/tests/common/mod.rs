//! Shared helpers for the integration tests.
#![allow(dead_code)]

use agent::event::ToolResultError;
use agent::{
    CallId, ContentBlock, EventData, Message, Session, SessionEvent, SessionHeader, SessionMeta, SurfaceMeta,
    TurnEndReason,
};
use serde_json::json;

#[cfg(feature = "openai")]
pub mod openai;

/// A valid header for `id`, created at `created_at`.
pub fn header_at(id: &str, created_at: u64) -> SessionHeader {
    SessionMeta {
        created_at: Some(created_at),
        ..SessionMeta::default()
    }
    .into_header(id.into(), created_at)
    .expect("valid header")
}

/// A valid header for `id`.
pub fn header(id: &str) -> SessionHeader {
    header_at(id, 1_000)
}

/// Builds a log through a real `Session`, so every event passes the append contract.
pub struct LogBuilder {
    session: Session,
}

impl LogBuilder {
    pub fn new(id: &str) -> Self {
        Self {
            session: Session::new(header(id), None).expect("session"),
        }
    }

    pub fn push(&mut self, data: EventData) -> &mut Self {
        let surface = data.is_surface().then(SurfaceMeta::append);
        self.session.append_at(data, surface, 7).expect("valid append");
        self
    }

    pub fn events(&self) -> Vec<SessionEvent> {
        self.session.events().iter().map(|e| (**e).clone()).collect()
    }
}

pub fn assistant(turn: u64, step: u64, content: Vec<ContentBlock>) -> EventData {
    EventData::AssistantMessage {
        turn,
        step,
        message: Message::assistant(content, "scripted", "m"),
        usage: None,
        interrupted: false,
    }
}

pub fn tool_call(turn: u64, step: u64, id: &str) -> EventData {
    EventData::ToolCall {
        turn,
        step,
        call_id: id.into(),
        name: "read".into(),
        arguments: "{}".into(),
    }
}

pub fn tool_result(turn: u64, step: u64, id: &str) -> EventData {
    EventData::ToolResult {
        turn,
        step,
        message: Message::tool_result(CallId::from(id), vec![ContentBlock::text("ok")], false),
        error: None,
        meta: None,
    }
}

pub fn tool_error(turn: u64, step: u64, id: &str, code: &str) -> EventData {
    EventData::ToolResult {
        turn,
        step,
        message: Message::tool_result(CallId::from(id), vec![ContentBlock::text("no")], true),
        error: Some(Box::new(ToolResultError {
            name: "ToolError".into(),
            code: code.into(),
        })),
        meta: None,
    }
}

/// One completed turn with a tool round trip, then a plugin event between turns.
pub fn sample_log(id: &str) -> Vec<SessionEvent> {
    let mut b = LogBuilder::new(id);
    b.push(EventData::TurnStart { turn: 1 })
        .push(EventData::StepStart { turn: 1, step: 1 })
        .push(EventData::UserMessage(Message::user_text(
            "hello ✓ \"quoted\"\nnewline",
        )))
        .push(assistant(1, 1, vec![ContentBlock::tool_call("c1", "read", "{}")]))
        .push(tool_call(1, 1, "c1"))
        .push(tool_result(1, 1, "c1"))
        .push(EventData::StepEnd { turn: 1, step: 1 })
        .push(EventData::StepStart { turn: 1, step: 2 })
        .push(assistant(1, 2, vec![ContentBlock::text("done")]))
        .push(EventData::StepEnd { turn: 1, step: 2 })
        .push(EventData::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
        })
        .push(EventData::other(
            "subagent/descriptor",
            json!({"version": 2, "mode": "one-shot"}),
        ));
    b.events()
}

/// The session-log enclosure rules S1–S14 (`inprocess-providers.md` §6.4), as a replay check.
pub fn check_enclosure(events: &[SessionEvent]) -> Result<(), String> {
    use std::collections::HashSet;
    let mut last_seq: Option<u64> = None;
    let mut open_turn: Option<u64> = None;
    let mut open_step: Option<u64> = None;
    let mut next_turn = 1;
    let mut next_step = 1;
    let mut pending: HashSet<CallId> = HashSet::new();
    for ev in events {
        let at = format!("seq {} ({})", ev.seq, ev.type_name());
        if last_seq.is_some_and(|l| ev.seq <= l) {
            return Err(format!("S1 at {at}"));
        }
        last_seq = Some(ev.seq);
        let in_step = |turn: u64, step: u64| open_turn == Some(turn) && open_step == Some(step);
        match &ev.data {
            EventData::TurnStart { turn } => {
                if open_turn.is_some() {
                    return Err(format!("S2 at {at}"));
                }
                if *turn != next_turn {
                    return Err(format!("S3 at {at}"));
                }
                open_turn = Some(*turn);
                next_step = 1;
            }
            EventData::TurnEnd { turn, .. } => {
                if open_turn != Some(*turn) {
                    return Err(format!("S4 at {at}"));
                }
                if open_step.is_some() {
                    return Err(format!("S5 at {at}"));
                }
                open_turn = None;
                next_turn += 1;
            }
            EventData::StepStart { turn, step } => {
                if open_turn != Some(*turn) {
                    return Err(format!("S6 at {at}"));
                }
                if open_step.is_some() {
                    return Err(format!("S7 at {at}"));
                }
                if *step != next_step {
                    return Err(format!("S8 at {at}"));
                }
                open_step = Some(*step);
            }
            EventData::StepEnd { turn, step } => {
                if !in_step(*turn, *step) {
                    return Err(format!("S9 at {at}"));
                }
                pending.clear();
                open_step = None;
                next_step += 1;
            }
            EventData::AssistantChunk { turn, step, .. } | EventData::AssistantMessage { turn, step, .. }
                if !in_step(*turn, *step) =>
            {
                return Err(format!("S10 at {at}"));
            }
            EventData::ToolCall {
                turn, step, call_id, ..
            } => {
                if !in_step(*turn, *step) {
                    return Err(format!("S11 at {at}"));
                }
                pending.insert(call_id.clone());
            }
            EventData::ToolResult {
                turn,
                step,
                message,
                error,
                ..
            } => {
                if !in_step(*turn, *step) {
                    return Err(format!("S12 (step) at {at}"));
                }
                let Some(ContentBlock::ToolResult {
                    tool_call_id,
                    is_error,
                    ..
                }) = message.content.first()
                else {
                    return Err(format!("S12 (shape) at {at}"));
                };
                let not_started =
                    *is_error == Some(true) && error.as_ref().is_some_and(|e| e.code == "TOOL_NOT_STARTED");
                if !pending.remove(tool_call_id) && !not_started {
                    return Err(format!("S12 (call) at {at}"));
                }
            }
            EventData::RequestHeader { .. } | EventData::RequestContext { .. } if open_turn.is_none() => {
                return Err(format!("S14 at {at}"));
            }
            _ => {}
        }
    }
    Ok(())
}
