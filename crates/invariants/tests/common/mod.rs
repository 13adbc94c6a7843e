//! Shared helpers for the integration tests: event constructors and scratch directories.
#![allow(dead_code)]

use std::path::PathBuf;

use agent::content::ContentBlock;
use agent::event::{
    CallConfig, EpochHeader, EventData, RequestHeaderReason, SurfaceMeta, SurfaceOp, ToolResultError,
};
use agent::model::StreamChunk;
use agent::{CallId, Message, SessionEvent, TurnEndReason};
use serde_json::{Value, json};

pub fn turn_start(turn: u64) -> EventData {
    EventData::TurnStart { turn }
}

pub fn turn_end(turn: u64) -> EventData {
    EventData::TurnEnd {
        turn,
        reason: TurnEndReason::Completed,
    }
}

pub fn step_start(turn: u64, step: u64) -> EventData {
    EventData::StepStart { turn, step }
}

pub fn step_end(turn: u64, step: u64) -> EventData {
    EventData::StepEnd { turn, step }
}

pub fn chunk(turn: u64, step: u64) -> EventData {
    EventData::AssistantChunk {
        turn,
        step,
        chunk: StreamChunk::TextDelta {
            index: 0,
            text: "h".into(),
        },
    }
}

pub fn assistant(turn: u64, step: u64) -> EventData {
    EventData::AssistantMessage {
        turn,
        step,
        message: Message::assistant(vec![ContentBlock::tool_call("c1", "echo", "{}")], "mock", "mock"),
        usage: None,
        interrupted: false,
    }
}

pub fn tool_call(turn: u64, step: u64, id: &str) -> EventData {
    EventData::ToolCall {
        turn,
        step,
        call_id: CallId::new(id),
        name: "echo".into(),
        arguments: "{}".into(),
    }
}

pub fn tool_result(turn: u64, step: u64, id: &str) -> EventData {
    EventData::ToolResult {
        turn,
        step,
        message: Message::tool_result(CallId::new(id), vec![], false),
        error: None,
        meta: None,
    }
}

/// A synthetic not-started repair result for `id`.
pub fn not_started(turn: u64, step: u64, id: &str) -> EventData {
    EventData::ToolResult {
        turn,
        step,
        message: Message::tool_result(CallId::new(id), vec![], true),
        error: Some(Box::new(ToolResultError {
            name: "ToolNotStartedError".into(),
            code: invariants::TOOL_NOT_STARTED.into(),
        })),
        meta: None,
    }
}

pub fn user(text: &str) -> EventData {
    EventData::UserMessage(Message::user_text(text))
}

pub fn request_header() -> EventData {
    EventData::RequestHeader {
        header: Box::new(EpochHeader {
            config: CallConfig {
                provider: "mock".into(),
                model: "mock".into(),
                ..CallConfig::default()
            },
            ..EpochHeader::default()
        }),
        reason: RequestHeaderReason::Initial,
    }
}

pub fn request_context() -> EventData {
    EventData::RequestContext {
        provider: "mock".into(),
        model: "m".into(),
        context_window: Some(128_000),
    }
}

pub fn other(kind: &str, data: Value) -> EventData {
    EventData::other(kind, data)
}

pub fn descriptor() -> EventData {
    other(
        invariants::DESCRIPTOR_TYPE,
        json!({"version": 2, "mode": "one-shot", "provider": "spawn"}),
    )
}

/// The surface metadata an append of `data` needs (`append` for surface types, none otherwise).
pub fn surface_for(data: &EventData) -> Option<SurfaceMeta> {
    data.is_surface().then(SurfaceMeta::append)
}

/// `surfaceOp: replace` over `seq..seq`.
pub fn replace(seq: u64) -> Option<SurfaceMeta> {
    Some(SurfaceMeta {
        surface_op: Some(SurfaceOp::Replace { start: seq, end: seq }),
        source_event_seqs: None,
    })
}

/// Events with seqs from 0 and the surface metadata each type needs.
pub fn log(items: impl IntoIterator<Item = EventData>) -> Vec<SessionEvent> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, data)| ev(i as u64, data))
        .collect()
}

/// One event at `seq` with the surface metadata its type needs.
pub fn ev(seq: u64, data: EventData) -> SessionEvent {
    SessionEvent {
        seq,
        time: seq,
        surface: surface_for(&data),
        data,
        ignorable: false,
    }
}

/// A fresh, empty scratch directory under cargo's per-target temporary directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("invariants-tests")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory can be created");
    dir
}
