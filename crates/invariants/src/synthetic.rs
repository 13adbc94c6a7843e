//! Deterministic synthetic logs that satisfy every rule, for tests and benchmarks.
//!
//! [`LogBuilder`] appends events with contiguous seqs and the numbering the rules expect;
//! [`SyntheticLog::to_jsonl`] renders the on-disk form (header line, then one event per line).

use agent::content::ContentBlock;
use agent::event::{CallConfig, EpochHeader, EventData, RequestHeaderReason, SurfaceMeta};
use agent::header::SESSION_FORMAT_VERSION;
use agent::model::StreamChunk;
use agent::{
    CallId, Message, MessageId, MessageSource, Origin, Role, SessionEvent, SessionHeader, SessionId,
    TurnEndReason,
};
use serde_json::json;

use crate::lineage::DESCRIPTOR_TYPE;

/// A header and its events.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticLog {
    /// The header (line 1 on disk).
    pub header: SessionHeader,
    /// The events, `seq == index`.
    pub events: Vec<SessionEvent>,
}

impl SyntheticLog {
    /// The on-disk JSON-lines form: the header, then one event per line, each line ending in
    /// `\n`.
    pub fn to_jsonl(&self) -> String {
        let mut out = serde_json::to_string(&self.header).expect("headers serialize to JSON");
        out.push('\n');
        for ev in &self.events {
            out.push_str(&serde_json::to_string(ev).expect("events serialize to JSON"));
            out.push('\n');
        }
        out
    }
}

/// A plain top-level header for session `id`.
pub fn header(id: &str) -> SessionHeader {
    SessionHeader {
        version: SESSION_FORMAT_VERSION,
        id: SessionId::new(id),
        created_at: 1,
        cwd: None,
        parent_session: None,
        seed_length: None,
        origin: None,
        delegation_depth: None,
        agent_preset: None,
    }
}

/// A subagent child's header: `origin: subagent`, `parentSession`, `delegationDepth`, and
/// `seedLength` when `seed_length > 0`.
pub fn child_header(id: &str, parent: &SessionHeader, seed_length: u64) -> SessionHeader {
    SessionHeader {
        parent_session: Some(parent.id.clone()),
        origin: Some(Origin::Subagent),
        delegation_depth: Some(parent.depth() + 1),
        seed_length: (seed_length > 0).then_some(seed_length),
        ..header(id)
    }
}

/// Builds a valid log event by event.
#[derive(Clone, Debug)]
pub struct LogBuilder {
    log: SyntheticLog,
    next_turn: u64,
    ids: u64,
}

impl LogBuilder {
    /// An empty log under `header`.
    pub fn new(header: SessionHeader) -> Self {
        Self {
            log: SyntheticLog {
                header,
                events: Vec::new(),
            },
            next_turn: 1,
            ids: 0,
        }
    }

    /// A log seeded with `seed` (copied verbatim) followed by `session/end-seed`, the way a fork
    /// child starts. Turn numbering continues after the seed's turns.
    pub fn seeded(header: SessionHeader, seed: &[SessionEvent]) -> Self {
        let mut b = Self::new(header);
        b.log.events = seed.to_vec();
        b.next_turn = 1 + seed
            .iter()
            .filter(|e| matches!(e.data, EventData::TurnEnd { .. }))
            .count() as u64;
        b.event(EventData::EndSeed, None);
        b
    }

    /// Appends one event with the next seq (its time equals its seq).
    pub fn event(&mut self, data: EventData, surface: Option<SurfaceMeta>) -> &mut Self {
        let seq = self.log.events.len() as u64;
        self.log.events.push(SessionEvent {
            seq,
            time: seq,
            data,
            surface,
            ignorable: false,
        });
        self
    }

    fn message_id(&mut self) -> MessageId {
        self.ids += 1;
        MessageId::new(format!("msg_{}_{}", self.log.header.id, self.ids))
    }

    /// Appends the seam's one-shot `subagent/descriptor` for provider `provider`.
    pub fn descriptor(&mut self, provider: &str) -> &mut Self {
        self.event(
            EventData::other(
                DESCRIPTOR_TYPE,
                json!({"version": 2, "mode": "one-shot", "provider": provider}),
            ),
            None,
        )
    }

    /// Appends one complete turn: a prompt, then `steps` steps (a request header in the first),
    /// each streaming two text chunks and an assistant message; every step but the last makes
    /// `calls` tool calls and answers them. When `descriptor` names a provider, its descriptor
    /// is written inside the turn before the first step, as the one-shot driver does.
    pub fn turn(&mut self, steps: u64, calls: u64, descriptor: Option<&str>) -> &mut Self {
        let turn = self.next_turn;
        self.next_turn += 1;
        self.event(EventData::TurnStart { turn }, None);
        if let Some(provider) = descriptor {
            self.descriptor(provider);
        }
        let prompt = Message {
            id: self.message_id(),
            role: Role::User,
            content: vec![ContentBlock::text(format!("task for turn {turn}"))],
            source: MessageSource::User,
        };
        for step in 1..=steps.max(1) {
            self.event(EventData::StepStart { turn, step }, None);
            if step == 1 {
                self.event(
                    EventData::UserMessage(prompt.clone()),
                    Some(SurfaceMeta::append()),
                );
                self.event(
                    EventData::RequestHeader {
                        header: Box::new(EpochHeader {
                            config: CallConfig {
                                provider: "scripted".into(),
                                model: "m".into(),
                                ..CallConfig::default()
                            },
                            system: Some("You are a test agent.".into()),
                            ..EpochHeader::default()
                        }),
                        reason: RequestHeaderReason::Initial,
                    },
                    None,
                );
            }
            let last = step == steps.max(1);
            let chunk_seqs = [self.log.events.len() as u64, self.log.events.len() as u64 + 1];
            for text in ["wor", "king"] {
                self.event(
                    EventData::AssistantChunk {
                        turn,
                        step,
                        chunk: StreamChunk::TextDelta {
                            index: 0,
                            text: text.into(),
                        },
                    },
                    None,
                );
            }
            let call_ids: Vec<CallId> = if last {
                Vec::new()
            } else {
                (0..calls)
                    .map(|c| CallId::new(format!("call_{turn}_{step}_{c}")))
                    .collect()
            };
            let mut content = vec![ContentBlock::text("working")];
            content.extend(
                call_ids
                    .iter()
                    .map(|id| ContentBlock::tool_call(id.clone(), "echo", "{}")),
            );
            let message = Message {
                id: self.message_id(),
                role: Role::Assistant,
                content,
                source: MessageSource::Model {
                    provider: "scripted".into(),
                    model: "m".into(),
                    replay_state: None,
                },
            };
            self.event(
                EventData::AssistantMessage {
                    turn,
                    step,
                    message,
                    usage: None,
                    interrupted: false,
                },
                Some(SurfaceMeta {
                    surface_op: Some(agent::SurfaceOp::Append),
                    source_event_seqs: Some(chunk_seqs.to_vec()),
                }),
            );
            for id in &call_ids {
                self.event(
                    EventData::ToolCall {
                        turn,
                        step,
                        call_id: id.clone(),
                        name: "echo".into(),
                        arguments: "{}".into(),
                    },
                    None,
                );
            }
            for id in call_ids {
                let mut message = Message::tool_result(id, vec![ContentBlock::text("ok")], false);
                message.id = self.message_id();
                self.event(
                    EventData::ToolResult {
                        turn,
                        step,
                        message,
                        error: None,
                        meta: None,
                    },
                    Some(SurfaceMeta::append()),
                );
            }
            self.event(EventData::StepEnd { turn, step }, None);
        }
        self.event(
            EventData::TurnEnd {
                turn,
                reason: TurnEndReason::Completed,
            },
            None,
        )
    }

    /// The log built so far.
    pub fn build(&self) -> SyntheticLog {
        self.log.clone()
    }
}

/// A valid top-level log of `turns` turns, each of `steps` steps with `calls` tool calls in every
/// step but the last.
pub fn valid_log(id: &str, turns: u64, steps: u64, calls: u64) -> SyntheticLog {
    let mut b = LogBuilder::new(header(id));
    for _ in 0..turns {
        b.turn(steps, calls, None);
    }
    b.build()
}
