//! Property tests for the session log's wire format and the pure functions over logs.
//!
//! * Well-formed logs (turns, steps, messages, tool calls, inbox splices, policy events,
//!   unknown plugin types) and headers round-trip through JSON unchanged, floats included.
//! * Unknown event types survive a round trip, whatever their payload.
//! * The folds never panic on arbitrary (ill-formed, any-order) logs, and the balanced
//!   completed-turn prefix of any live log written in the loop's shape is balanced.

use std::path::PathBuf;

use agent::content::ContentBlock;
use agent::event::{CallConfig, EpochHeader, RequestHeaderReason, SpliceOutcome, SurfaceOp, ToolResultError};
use agent::message::SnapshotSection;
use agent::model::{BlockType, FinishReason, LlmFailure, StreamChunk, TokenUsage, ToolSchema};
use agent::prefix::is_balanced;
use agent::{
    CancelCause, EventData, InboxSplice, InboxTarget, Message, MessageSource, Origin, PluginForm, Role,
    SessionEvent, SessionHeader, StreamGrammar, SurfaceMeta, TurnEndReason, approval_override,
    balanced_completed_turn_prefix, derive_messages, fold_consumed_work, next_turn_number, sandbox_override,
    validate_stream,
};
use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use serde_json::{Map, Value};

// ---------------------------------------------------------------------------------------------
// Leaf strategies
// ---------------------------------------------------------------------------------------------

/// Short readable text most of the time, arbitrary Unicode sometimes.
fn text() -> BoxedStrategy<String> {
    prop_oneof![4 => "[a-zA-Z0-9 .]{0,12}", 1 => any::<String>()].boxed()
}

fn ident() -> BoxedStrategy<String> {
    "[a-z][a-z0-9_]{0,7}".boxed()
}

/// A float a log may hold: finite and not negative zero (the append refuses the others).
/// Arbitrary bit patterns, so shortest renderings of up to 17 significant digits come up.
fn lossless_float() -> BoxedStrategy<f64> {
    any::<f64>()
        .prop_filter("lossless", |f| {
            f.is_finite() && !(*f == 0.0 && f.is_sign_negative())
        })
        .boxed()
}

/// Arbitrary JSON, floats included (tool metadata, replay state and plugin payloads carry
/// them; a logged float must read back as the same number).
fn json() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        lossless_float().prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            btree_map("[a-zA-Z]{1,6}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
    .boxed()
}

/// JSON other than `null` (an optional field holding `null` reads back as absent).
fn json_some() -> BoxedStrategy<Value> {
    json().prop_filter("not null", |v| !v.is_null()).boxed()
}

/// A JSON object whose keys all start with `prefix` (so they never collide with typed fields).
fn json_object(prefix: &'static str) -> BoxedStrategy<Map<String, Value>> {
    btree_map("[a-z]{1,5}", json(), 0..3)
        .prop_map(move |m| m.into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)).collect())
        .boxed()
}

fn failure() -> BoxedStrategy<LlmFailure> {
    (
        text(),
        "[A-Z_]{1,10}",
        option::of(any::<u16>()),
        option::of(any::<u64>()),
        option::of(ident()),
    )
        .prop_map(|(message, code, status, retry, request_id)| LlmFailure {
            message,
            code,
            status,
            provider_retry_after_ms: retry,
            request_id,
        })
        .boxed()
}

fn cancel_cause() -> BoxedStrategy<CancelCause> {
    prop_oneof![
        Just(CancelCause::User),
        Just(CancelCause::Parent),
        text().prop_map(|reason| CancelCause::Hook { reason }),
        Just(CancelCause::Disposed),
        Just(CancelCause::Legacy),
        text().prop_map(|reason| CancelCause::Other { reason }),
    ]
    .boxed()
}

fn turn_end_reason() -> BoxedStrategy<TurnEndReason> {
    prop_oneof![
        3 => Just(TurnEndReason::Completed),
        1 => cancel_cause().prop_map(|reason| TurnEndReason::Aborted { reason }),
        1 => Just(TurnEndReason::Blocked),
        1 => failure().prop_map(|error| TurnEndReason::Error { error }),
        1 => Just(TurnEndReason::MaxTokens),
        1 => Just(TurnEndReason::Interrupted),
        1 => ("x-[a-z]{1,6}", json_object("f_")).prop_map(|(kind, mut map)| {
            map.insert("kind".into(), Value::String(kind));
            TurnEndReason::Other(map)
        }),
    ]
    .boxed()
}

fn content_block() -> BoxedStrategy<ContentBlock> {
    let leaf = prop_oneof![
        text().prop_map(ContentBlock::text),
        text().prop_map(ContentBlock::reasoning),
        (ident(), ident(), text()).prop_map(|(id, name, args)| ContentBlock::tool_call(id, name, args)),
        ("image/(png|jpeg)", text()).prop_map(|(mime, data)| {
            let mut fields = Map::new();
            fields.insert("mimeType".into(), Value::String(mime));
            fields.insert("data".into(), Value::String(data));
            ContentBlock::Image { fields }
        }),
        ("x-[a-z]{1,6}", json_object("u_")).prop_map(|(kind, mut map)| {
            map.insert("type".into(), Value::String(kind));
            ContentBlock::Other(map)
        }),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        (ident(), vec(inner, 0..3), option::of(any::<bool>())).prop_map(|(id, content, is_error)| {
            ContentBlock::ToolResult {
                tool_call_id: id.into(),
                content,
                is_error,
            }
        })
    })
    .boxed()
}

fn plugin_form() -> BoxedStrategy<Option<PluginForm>> {
    prop_oneof![
        Just(None),
        Just(Some(PluginForm::Instructions)),
        Just(Some(PluginForm::Catalog)),
        Just(Some(PluginForm::Relay)),
        text().prop_map(|summary| Some(PluginForm::Notice { summary })),
        vec((ident(), text()), 0..3).prop_map(|sections| Some(PluginForm::Snapshot {
            sections: sections
                .into_iter()
                .map(|(name, text)| SnapshotSection { name, text })
                .collect(),
        })),
    ]
    .boxed()
}

fn user_source() -> BoxedStrategy<MessageSource> {
    prop_oneof![
        Just(MessageSource::User),
        (ident(), plugin_form()).prop_map(|(plugin, form)| MessageSource::Plugin { plugin, form }),
        ("x-[a-z]{1,6}", json_object("s_")).prop_map(|(kind, mut map)| {
            map.insert("kind".into(), Value::String(kind));
            MessageSource::Other(map)
        }),
    ]
    .boxed()
}

fn user_message() -> BoxedStrategy<Message> {
    (ident(), vec(content_block(), 0..3), user_source())
        .prop_map(|(id, content, source)| Message {
            id: id.into(),
            role: Role::User,
            content,
            source,
        })
        .boxed()
}

fn assistant_message() -> BoxedStrategy<Message> {
    (
        ident(),
        vec(content_block(), 0..3),
        ident(),
        ident(),
        option::of(json_some()),
    )
        .prop_map(|(id, content, provider, model, replay_state)| Message {
            id: id.into(),
            role: Role::Assistant,
            content,
            source: MessageSource::Model {
                provider: provider.into(),
                model: model.into(),
                replay_state: replay_state.map(Box::new),
            },
        })
        .boxed()
}

fn tool_result_message() -> BoxedStrategy<Message> {
    (
        ident(),
        ident(),
        vec(content_block(), 0..2),
        any::<bool>(),
        json_object("t_"),
    )
        .prop_map(|(id, call, content, is_error, extra)| {
            let mut m = Message::tool_result(call.clone().into(), content, is_error);
            m.id = id.into();
            m.source = MessageSource::Tool {
                call_id: call.into(),
                extra,
            };
            m
        })
        .boxed()
}

fn usage() -> BoxedStrategy<TokenUsage> {
    (
        any::<u64>(),
        any::<u64>(),
        option::of(any::<u64>()),
        option::of(any::<u64>()),
        option::of(any::<u64>()),
    )
        .prop_map(|(i, o, cr, cw, r)| TokenUsage {
            input_tokens: i,
            output_tokens: o,
            cache_read_tokens: cr,
            cache_write_tokens: cw,
            reasoning_tokens: r,
        })
        .boxed()
}

fn block_type() -> BoxedStrategy<BlockType> {
    prop_oneof![
        Just(BlockType::Text),
        Just(BlockType::Reasoning),
        Just(BlockType::Image),
        Just(BlockType::ToolCall),
        Just(BlockType::ToolResult),
    ]
    .boxed()
}

fn finish_reason() -> BoxedStrategy<FinishReason> {
    prop_oneof![
        Just(FinishReason::Stop),
        Just(FinishReason::ToolCalls),
        Just(FinishReason::MaxTokens),
        failure().prop_map(|failure| FinishReason::Aborted { failure }),
        failure().prop_map(|failure| FinishReason::Error { failure }),
    ]
    .boxed()
}

/// Any chunk, with small indexes so that arbitrary sequences sometimes conform.
fn chunk() -> BoxedStrategy<StreamChunk> {
    let index = 0u32..3;
    prop_oneof![
        (index.clone(), block_type())
            .prop_map(|(index, block_type)| StreamChunk::BlockStart { index, block_type }),
        (index.clone(), text()).prop_map(|(index, text)| StreamChunk::TextDelta { index, text }),
        (index.clone(), text()).prop_map(|(index, text)| StreamChunk::ReasoningDelta { index, text }),
        (index.clone(), ident(), option::of(ident()), text()).prop_map(|(index, id, name, args)| {
            StreamChunk::ToolCallDelta {
                index,
                id: id.into(),
                name,
                arguments_delta: args,
            }
        }),
        (index, content_block()).prop_map(|(index, block)| StreamChunk::BlockEnd { index, block }),
        usage().prop_map(|usage| StreamChunk::Usage { usage }),
        (finish_reason(), option::of(json_some())).prop_map(|(reason, replay_state)| StreamChunk::Finish {
            reason,
            replay_state: replay_state.map(Box::new),
        }),
    ]
    .boxed()
}

fn epoch_header() -> BoxedStrategy<EpochHeader> {
    let config = (
        ident(),
        ident(),
        option::of(ident()),
        option::of(prop_oneof![Just(0.0), Just(0.5), Just(1.0), lossless_float()]),
        option::of(any::<u64>()),
        option::of(vec(text(), 0..2)),
    )
        .prop_map(
            |(provider, model, reasoning_effort, temperature, max_tokens, stop)| CallConfig {
                provider: provider.into(),
                model: model.into(),
                reasoning_effort,
                temperature,
                max_tokens,
                stop,
            },
        );
    let tool = (ident(), text(), json()).prop_map(|(name, description, parameters)| ToolSchema {
        name,
        description,
        parameters,
    });
    (
        config,
        option::of(json_some()),
        option::of(text()),
        option::of(vec(tool, 0..2)),
    )
        .prop_map(|(config, adapter_defaults, system, tools)| EpochHeader {
            config,
            adapter_defaults,
            system,
            tools,
        })
        .boxed()
}

/// A plugin-owned log-only event of an unknown type, and whether it is ignorable.
fn unknown_event() -> BoxedStrategy<(EventData, bool)> {
    (
        prop_oneof!["subagent/descriptor", "x/[a-z]{1,6}", "[a-z]{1,6}/[a-z]{1,6}/x"],
        json(),
        any::<bool>(),
    )
        .prop_map(|(kind, data, ignorable)| (EventData::other(kind, data), ignorable))
        .boxed()
}

fn policy_event() -> BoxedStrategy<EventData> {
    let source = option::of(prop_oneof![Just("delegation".to_owned()), ident()]);
    prop_oneof![
        (
            prop_oneof![
                "read-only",
                "workspace-write",
                "danger-full-access",
                "[a-z-]{0,8}"
            ],
            source.clone()
        )
            .prop_map(|(mode, source)| EventData::SandboxMode { mode, source }),
        (prop_oneof!["ask", "never", "[a-z]{0,6}"], source)
            .prop_map(|(policy, source)| EventData::ApprovalPolicy { policy, source }),
    ]
    .boxed()
}

fn inbox_target() -> BoxedStrategy<InboxTarget> {
    prop_oneof![Just(InboxTarget::NextTurn), Just(InboxTarget::NextStep)].boxed()
}

/// An inbox mutation that may stand between turns: an insert, a cancellation, or a
/// cancellation with a replacement.
fn between_splice() -> BoxedStrategy<InboxSplice> {
    (inbox_target(), 0u64..3, vec(user_message(), 0..2), 0u8..3)
        .prop_map(|(target, start, inserted, shape)| match shape {
            0 => InboxSplice {
                target,
                start,
                removed_count: None,
                inserted,
                outcome: None,
            },
            _ => InboxSplice {
                target,
                start,
                removed_count: Some(u64::from(shape)),
                inserted,
                outcome: Some(SpliceOutcome::Canceled),
            },
        })
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Well-formed logs
// ---------------------------------------------------------------------------------------------

/// One event between turns.
#[derive(Clone, Debug)]
enum Between {
    User(Message),
    Splice(InboxSplice),
    Policy(EventData),
    Unknown(EventData, bool),
    EndSeed,
}

fn between() -> BoxedStrategy<Between> {
    prop_oneof![
        user_message().prop_map(Between::User),
        between_splice().prop_map(Between::Splice),
        policy_event().prop_map(Between::Policy),
        unknown_event().prop_map(|(d, i)| Between::Unknown(d, i)),
        Just(Between::EndSeed),
    ]
    .boxed()
}

/// One event inside a step (rendered with the step's numbers).
#[derive(Clone, Debug)]
enum StepItem {
    User(Message),
    Header(EpochHeader, RequestHeaderReason),
    Context(String, String, Option<u64>),
    Chunk(StreamChunk),
    Assistant(Message, Option<TokenUsage>, bool, Option<Vec<u64>>),
    CallAndResult {
        name: String,
        arguments: String,
        result: Message,
        error: Option<ToolResultError>,
        meta: Option<Value>,
    },
    Splice(InboxSplice),
    Policy(EventData),
    Unknown(EventData, bool),
}

fn step_item() -> BoxedStrategy<StepItem> {
    let reason = prop_oneof![
        Just(RequestHeaderReason::Initial),
        Just(RequestHeaderReason::Resume),
        Just(RequestHeaderReason::Change),
    ];
    let error = option::of((ident(), "[A-Z_]{1,8}").prop_map(|(name, code)| ToolResultError { name, code }));
    prop_oneof![
        user_message().prop_map(StepItem::User),
        (epoch_header(), reason).prop_map(|(h, r)| StepItem::Header(h, r)),
        (ident(), ident(), option::of(any::<u64>())).prop_map(|(p, m, w)| StepItem::Context(p, m, w)),
        chunk().prop_map(StepItem::Chunk),
        (
            assistant_message(),
            option::of(usage()),
            any::<bool>(),
            option::of(vec(0u64..64, 0..3))
        )
            .prop_map(|(m, u, i, s)| StepItem::Assistant(m, u, i, s)),
        (
            ident(),
            text(),
            tool_result_message(),
            error,
            option::of(json_some())
        )
            .prop_map(|(name, arguments, result, error, meta)| StepItem::CallAndResult {
                name,
                arguments,
                result,
                error,
                meta,
            }),
        (vec(user_message(), 0..2)).prop_map(|inserted| StepItem::Splice(InboxSplice {
            target: InboxTarget::NextStep,
            start: 0,
            removed_count: None,
            inserted,
            outcome: None,
        })),
        policy_event().prop_map(StepItem::Policy),
        unknown_event().prop_map(|(d, i)| StepItem::Unknown(d, i)),
    ]
    .boxed()
}

#[derive(Clone, Debug)]
struct TurnPlan {
    before: Vec<Between>,
    claim: bool,
    steps: Vec<Vec<StepItem>>,
    reason: TurnEndReason,
}

fn turn_plan() -> BoxedStrategy<TurnPlan> {
    (
        vec(between(), 0..3),
        any::<bool>(),
        vec(vec(step_item(), 0..6), 0..3),
        turn_end_reason(),
    )
        .prop_map(|(before, claim, steps, reason)| TurnPlan {
            before,
            claim,
            steps,
            reason,
        })
        .boxed()
}

#[derive(Clone, Debug)]
struct LogPlan {
    first_turn: u64,
    time: u64,
    turns: Vec<TurnPlan>,
    trailing: Vec<Between>,
}

fn log_plan() -> BoxedStrategy<LogPlan> {
    (
        1u64..4,
        0u64..(1 << 53),
        vec(turn_plan(), 0..6),
        vec(between(), 0..3),
    )
        .prop_map(|(first_turn, time, turns, trailing)| LogPlan {
            first_turn,
            time,
            turns,
            trailing,
        })
        .boxed()
}

/// Appends events with `seq == index` and surface markers on surface types.
struct Writer {
    events: Vec<SessionEvent>,
    time: u64,
}

impl Writer {
    fn push(&mut self, data: EventData) {
        let surface = data.is_surface().then(SurfaceMeta::append);
        self.push_full(data, surface, false);
    }

    fn push_full(&mut self, data: EventData, surface: Option<SurfaceMeta>, ignorable: bool) {
        let seq = self.events.len() as u64;
        self.events.push(SessionEvent {
            seq,
            time: self.time + seq,
            data,
            surface,
            ignorable,
        });
    }

    fn between(&mut self, item: &Between) {
        match item.clone() {
            Between::User(m) => self.push(EventData::UserMessage(m)),
            Between::Splice(s) => self.push(EventData::InboxSpliced(s)),
            Between::Policy(p) => self.push(p),
            Between::Unknown(d, ignorable) => self.push_full(d, None, ignorable),
            Between::EndSeed => self.push(EventData::EndSeed),
        }
    }

    fn step_item(&mut self, turn: u64, step: u64, item: &StepItem, call: &mut u64) {
        match item.clone() {
            StepItem::User(m) => self.push(EventData::UserMessage(m)),
            StepItem::Header(header, reason) => self.push(EventData::RequestHeader {
                header: Box::new(header),
                reason,
            }),
            StepItem::Context(provider, model, context_window) => self.push(EventData::RequestContext {
                provider: provider.into(),
                model: model.into(),
                context_window,
            }),
            StepItem::Chunk(chunk) => self.push(EventData::AssistantChunk { turn, step, chunk }),
            StepItem::Assistant(message, usage, interrupted, seqs) => self.push_full(
                EventData::AssistantMessage {
                    turn,
                    step,
                    message,
                    usage: usage.map(Box::new),
                    interrupted,
                },
                Some(SurfaceMeta {
                    surface_op: Some(SurfaceOp::Append),
                    source_event_seqs: seqs,
                }),
                false,
            ),
            StepItem::CallAndResult {
                name,
                arguments,
                mut result,
                error,
                meta,
            } => {
                *call += 1;
                let call_id: agent::CallId = format!("call_{call}").into();
                self.push(EventData::ToolCall {
                    turn,
                    step,
                    call_id: call_id.clone(),
                    name,
                    arguments,
                });
                if let MessageSource::Tool { call_id: c, .. } = &mut result.source {
                    *c = call_id;
                }
                self.push(EventData::ToolResult {
                    turn,
                    step,
                    message: result,
                    error: error.map(Box::new),
                    meta: meta.map(Box::new),
                });
            }
            StepItem::Splice(s) => self.push(EventData::InboxSpliced(s)),
            StepItem::Policy(p) => self.push(p),
            StepItem::Unknown(d, ignorable) => self.push_full(d, None, ignorable),
        }
    }
}

/// A rendered well-formed log and the turn the consumed-work fold must report.
struct Rendered {
    events: Vec<SessionEvent>,
    accounting_turn: Option<u64>,
    last_turn: Option<u64>,
}

fn render(plan: &LogPlan) -> Rendered {
    let mut w = Writer {
        events: Vec::new(),
        time: plan.time,
    };
    let mut accounting_turn = None;
    let mut last_turn = None;
    let mut call = 0;
    for (i, t) in plan.turns.iter().enumerate() {
        let turn = plan.first_turn + i as u64;
        last_turn = Some(turn);
        t.before.iter().for_each(|b| w.between(b));
        w.push(EventData::TurnStart { turn });
        if t.claim {
            w.push(EventData::InboxSpliced(InboxSplice {
                target: InboxTarget::NextTurn,
                start: 0,
                removed_count: Some(1),
                inserted: vec![],
                outcome: None,
            }));
        }
        for (s, items) in t.steps.iter().enumerate() {
            let step = s as u64 + 1;
            w.push(EventData::StepStart { turn, step });
            items
                .iter()
                .for_each(|item| w.step_item(turn, step, item, &mut call));
            w.push(EventData::StepEnd { turn, step });
        }
        w.push(EventData::TurnEnd {
            turn,
            reason: t.reason.clone(),
        });
        if !t.steps.is_empty() || (t.claim && t.reason != TurnEndReason::Completed) {
            accounting_turn = Some(turn);
        }
    }
    plan.trailing.iter().for_each(|b| w.between(b));
    Rendered {
        events: w.events,
        accounting_turn,
        last_turn,
    }
}

fn round_trips(event: &SessionEvent) -> Result<(), TestCaseError> {
    let value = serde_json::to_value(event).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back: SessionEvent =
        serde_json::from_value(value.clone()).map_err(|e| TestCaseError::fail(format!("{e}: {value}")))?;
    prop_assert_eq!(&back, event);
    prop_assert_eq!(
        serde_json::to_value(&back).map_err(|e| TestCaseError::fail(e.to_string()))?,
        value
    );
    let line = serde_json::to_string(event).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let from_line: SessionEvent =
        serde_json::from_str(&line).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&from_line, event);
    Ok(())
}

fn header() -> BoxedStrategy<SessionHeader> {
    (
        any::<u32>(),
        ident(),
        any::<u64>(),
        option::of("(/[a-z0-9 ._-]{1,6}){0,3}"),
        option::of(ident()),
        option::of(any::<u64>()),
        any::<bool>(),
        option::of(any::<u64>()),
        option::of(text()),
    )
        .prop_map(
            |(version, id, created_at, cwd, parent, seed_length, sub, depth, preset)| SessionHeader {
                version,
                id: id.into(),
                created_at,
                cwd: cwd.map(PathBuf::from),
                parent_session: parent.map(Into::into),
                seed_length,
                origin: sub.then_some(Origin::Subagent),
                delegation_depth: depth,
                agent_preset: preset,
            },
        )
        .boxed()
}

// ---------------------------------------------------------------------------------------------
// Arbitrary (ill-formed) logs
// ---------------------------------------------------------------------------------------------

fn small_turn() -> BoxedStrategy<u64> {
    prop_oneof![4 => 0u64..4, 1 => Just(u64::MAX)].boxed()
}

fn arbitrary_surface() -> BoxedStrategy<Option<SurfaceMeta>> {
    prop_oneof![
        Just(None),
        Just(Some(SurfaceMeta::append())),
        Just(Some(SurfaceMeta {
            surface_op: None,
            source_event_seqs: None
        })),
        (0u64..40, 0u64..40).prop_map(|(start, end)| Some(SurfaceMeta {
            surface_op: Some(SurfaceOp::Replace { start, end }),
            source_event_seqs: None,
        })),
    ]
    .boxed()
}

fn arbitrary_event_data() -> BoxedStrategy<EventData> {
    prop_oneof![
        small_turn().prop_map(|turn| EventData::TurnStart { turn }),
        (small_turn(), turn_end_reason()).prop_map(|(turn, reason)| EventData::TurnEnd { turn, reason }),
        (small_turn(), 0u64..3).prop_map(|(turn, step)| EventData::StepStart { turn, step }),
        (small_turn(), 0u64..3).prop_map(|(turn, step)| EventData::StepEnd { turn, step }),
        user_message().prop_map(EventData::UserMessage),
        (small_turn(), assistant_message(), any::<bool>()).prop_map(|(turn, message, interrupted)| {
            EventData::AssistantMessage {
                turn,
                step: 1,
                message,
                usage: None,
                interrupted,
            }
        }),
        (small_turn(), ident()).prop_map(|(turn, id)| EventData::ToolCall {
            turn,
            step: 1,
            call_id: id.into(),
            name: "t".into(),
            arguments: "{}".into(),
        }),
        (small_turn(), tool_result_message()).prop_map(|(turn, message)| EventData::ToolResult {
            turn,
            step: 1,
            message,
            error: None,
            meta: None,
        }),
        (
            inbox_target(),
            option::of(0u64..3),
            vec(user_message(), 0..2),
            any::<bool>()
        )
            .prop_map(|(target, removed_count, inserted, cancel)| {
                EventData::InboxSpliced(InboxSplice {
                    target,
                    start: 0,
                    removed_count,
                    inserted,
                    outcome: cancel.then_some(SpliceOutcome::Canceled),
                })
            }),
        policy_event(),
        unknown_event().prop_map(|(d, _)| d),
        Just(EventData::EndSeed),
    ]
    .boxed()
}

fn arbitrary_log() -> BoxedStrategy<Vec<SessionEvent>> {
    vec(
        (
            arbitrary_event_data(),
            arbitrary_surface(),
            0u64..48,
            any::<bool>(),
        ),
        0..40,
    )
    .prop_map(|items| {
        items
            .into_iter()
            .map(|(data, surface, seq, ignorable)| SessionEvent {
                seq,
                time: 0,
                data,
                surface,
                ignorable,
            })
            .collect()
    })
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Every event of a well-formed log, and the log as JSON lines, round-trips unchanged.
    #[test]
    fn well_formed_logs_round_trip_through_json(plan in log_plan()) {
        let rendered = render(&plan);
        for event in &rendered.events {
            round_trips(event)?;
        }
        let lines: Vec<String> = rendered
            .events
            .iter()
            .map(|e| serde_json::to_string(e).expect("events serialize"))
            .collect();
        let back: Vec<SessionEvent> = lines
            .iter()
            .map(|l| serde_json::from_str(l).expect("lines parse"))
            .collect();
        prop_assert_eq!(back, rendered.events);
    }

    /// Well-formed logs satisfy the loop's shape: the whole log and every completed-turn
    /// prefix of every live cut are balanced, and the folds report what the plan implies.
    #[test]
    fn prefixes_of_live_logs_are_balanced(plan in log_plan(), cut in any::<prop::sample::Index>()) {
        let rendered = render(&plan);
        let events = &rendered.events;
        prop_assert!(is_balanced(events));
        prop_assert_eq!(balanced_completed_turn_prefix(events).len(),
            events.iter().rposition(|e| e.type_name() == "turn/end").map_or(0, |k| k + 1));
        prop_assert_eq!(
            fold_consumed_work(events).end.map(|e| match e.data {
                EventData::TurnEnd { turn, .. } => turn,
                _ => unreachable!("the fold's end is a turn/end"),
            }),
            rendered.accounting_turn
        );
        prop_assert_eq!(next_turn_number(events), rendered.last_turn.map_or(1, |t| t + 1));

        // Any cut of a well-formed log is a live log (possibly inside an open turn or step).
        let live = &events[..cut.index(events.len() + 1)];
        let prefix = balanced_completed_turn_prefix(live);
        prop_assert!(is_balanced(prefix), "unbalanced prefix of length {}", prefix.len());
        prop_assert!(prefix.iter().enumerate().all(|(i, e)| e.seq == i as u64));
        prop_assert!(live[prefix.len()..].iter().all(|e| e.type_name() != "turn/end"));
        if let Some(last) = prefix.last() {
            prop_assert_eq!(last.type_name(), "turn/end");
        }
        // The prefix's next turn continues the numbering.
        let ends = prefix.iter().filter(|e| e.type_name() == "turn/end").count() as u64;
        prop_assert_eq!(next_turn_number(prefix), if ends == 0 { 1 } else { plan.first_turn + ends });
    }

    /// Headers round-trip through JSON unchanged.
    #[test]
    fn headers_round_trip_through_json(header in header()) {
        let value = serde_json::to_value(&header).expect("headers serialize");
        let back: SessionHeader = serde_json::from_value(value.clone()).expect("headers parse");
        prop_assert_eq!(&back, &header);
        prop_assert_eq!(serde_json::to_value(&back).expect("headers serialize"), value);
    }

    /// An unknown event type survives a round trip whatever its payload, from the typed side
    /// and from raw JSON.
    #[test]
    fn unknown_event_types_survive_a_round_trip(
        (data, ignorable) in unknown_event(),
        seq in any::<u64>(),
        time in any::<u64>(),
    ) {
        let event = SessionEvent { seq, time, data: data.clone(), surface: None, ignorable };
        round_trips(&event)?;
        let mut raw = serde_json::json!({
            "type": data.type_name(), "seq": seq, "time": time, "data": data.to_data(),
        });
        if ignorable {
            raw["ignorable"] = Value::Bool(true);
        }
        let parsed: SessionEvent = serde_json::from_value(raw.clone()).expect("unknown types parse");
        prop_assert_eq!(&parsed.data, &data);
        prop_assert_eq!(serde_json::to_value(&parsed).expect("events serialize"), raw);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The pure functions over logs never panic, whatever the log holds, and the prefix is
    /// always the slice up to the last `turn/end`.
    #[test]
    fn log_functions_never_panic_on_arbitrary_logs(log in arbitrary_log()) {
        let work = fold_consumed_work(&log);
        if let Some(end) = &work.end {
            prop_assert_eq!(end.type_name(), "turn/end");
            prop_assert!(log.contains(end));
        }
        let prefix = balanced_completed_turn_prefix(&log);
        prop_assert_eq!(prefix, &log[..prefix.len()]);
        prop_assert!(log[prefix.len()..].iter().all(|e| e.type_name() != "turn/end"));
        if let Some(last) = prefix.last() {
            prop_assert_eq!(last.type_name(), "turn/end");
        }
        // Accounting happens only at `turn/end`, so the prefix folds to the same end.
        prop_assert_eq!(fold_consumed_work(prefix).end, work.end);
        let _ = next_turn_number(&log);
        let _ = is_balanced(&log);
        let _ = sandbox_override(&log);
        let _ = approval_override(&log);
        let derived = derive_messages(&log);
        prop_assert!(derived.len() <= log.len());
        // The incremental projection agrees with the whole-log one at every growth step.
        let shared: Vec<std::sync::Arc<agent::SessionEvent>> =
            log.iter().cloned().map(std::sync::Arc::new).collect();
        let mut incremental = agent::history::DerivedHistory::new();
        for cut in [0, log.len() / 3, log.len() / 2, log.len()] {
            incremental.update(&shared[..cut]);
            prop_assert_eq!(incremental.messages(), derive_messages(&log[..cut]));
            // The shared list a loop-built request carries reads as the same messages.
            let list = incremental.message_list();
            prop_assert_eq!(&list, &derive_messages(&log[..cut]));
            prop_assert_eq!(list.iter().rev().count(), list.len());
        }
    }

    /// The stream validator never panics, and the incremental and whole-stream forms agree.
    #[test]
    fn stream_grammar_never_panics_and_agrees_with_validate_stream(chunks in vec(chunk(), 0..12)) {
        let whole = validate_stream(&chunks);
        let mut grammar = StreamGrammar::new();
        let mut incremental = Ok(());
        for c in &chunks {
            if let Err(e) = grammar.push(c) {
                incremental = Err(e);
                break;
            }
        }
        let incremental = incremental.and_then(|()| grammar.finish());
        prop_assert_eq!(&whole, &incremental);
        if let Err(e) = whole {
            prop_assert!(e.position() <= chunks.len());
            prop_assert!(!e.to_string().is_empty());
        }
    }
}
