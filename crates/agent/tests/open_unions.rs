//! The open unions of the message model (spine §3): `ContentBlock` keyed by `type` and
//! `MessageSource` keyed by `kind`. Their catch-all arms (`ContentBlock::Other`,
//! `MessageSource::Other`) hold **unknown** tags only; a known tag always means the typed
//! variant, so one JSON value never has two readings.

use agent::content::ContentBlock;
use agent::event::{InboxSplice, InboxTarget};
use agent::header::SessionMeta;
use agent::model::StreamChunk;
use agent::session::{check_inbox_insert_loggable, check_tool_result_loggable};
use agent::{EventData, LogError, Message, MessageSource, Role, Session, SessionEvent, SurfaceMeta};
use serde_json::{Map, Value, json};

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn session() -> Session {
    let header = SessionMeta::default().into_header("s".into(), 1).unwrap();
    Session::new(header, None).unwrap()
}

fn user_message(content: Vec<ContentBlock>, source: MessageSource) -> Message {
    Message {
        id: "m".into(),
        role: Role::User,
        content,
        source,
    }
}

/// spine §3 — a block or source whose tag names a known variant but whose fields do not fit
/// that variant (a `tool-call` whose `arguments` is an object instead of the raw string, a
/// `text` block without its text, a `tool` source without `callId`) is refused with an error
/// naming the tag and the field. It used to read back as the catch-all `Other` arm, silently:
/// the tool call vanished from the model's view of the history and the text from the visible
/// output, with no error anywhere.
#[test]
fn a_known_tag_with_a_malformed_shape_is_refused_not_read_as_unknown() {
    for (raw, needle) in [
        (
            json!({"type": "tool-call", "id": "c", "name": "read", "arguments": {"path": "a"}}),
            "`tool-call`",
        ),
        (json!({"type": "text"}), "missing field `text`"),
        (json!({"type": "text", "text": 5}), "`text`"),
        (
            json!({"type": "tool-result", "toolCallId": "c", "content": [{"type": "text"}]}),
            "missing field `text`",
        ),
        (
            json!({"type": "tool-result", "toolCallId": "c", "content": [], "isError": "yes"}),
            "`tool-result`",
        ),
    ] {
        let err =
            serde_json::from_value::<ContentBlock>(raw.clone()).expect_err(&format!("{raw} must be refused"));
        assert!(err.to_string().contains(needle), "{raw}: {err}");
    }
    for (raw, needle) in [
        (json!({"kind": "tool"}), "missing field `callId`"),
        (json!({"kind": "model", "provider": "p"}), "missing field `model`"),
        (json!({"kind": "plugin"}), "missing field `plugin`"),
        (json!({"kind": "plugin", "plugin": 7}), "`plugin`"),
    ] {
        let err = serde_json::from_value::<MessageSource>(raw.clone())
            .expect_err(&format!("{raw} must be refused"));
        assert!(err.to_string().contains(needle), "{raw}: {err}");
    }
    // Inside a log line the error names the event type.
    let line = json!({"type": "user/message", "seq": 0, "time": 1, "surfaceOp": "append", "data": {
        "id": "m", "role": "user", "source": {"kind": "user"},
        "content": [{"type": "tool-call", "id": "c", "name": "read", "arguments": {}}],
    }});
    let err = serde_json::from_value::<SessionEvent>(line).unwrap_err();
    assert!(
        err.to_string().contains("invalid `user/message` payload"),
        "{err}"
    );
    // Unknown tags (and tagless objects) still read as the catch-all and round-trip.
    for raw in [
        json!({"type": "audio", "data": "x", "n": 1}),
        json!({"note": "no type"}),
        json!({"type": 7}),
    ] {
        let block: ContentBlock = serde_json::from_value(raw.clone()).unwrap();
        assert!(matches!(block, ContentBlock::Other(_)), "{raw}");
        assert_eq!(serde_json::to_value(&block).unwrap(), raw);
    }
    for raw in [
        json!({"kind": "subagent-report", "senderSessionId": "c"}),
        json!({"x": 1}),
    ] {
        let source: MessageSource = serde_json::from_value(raw.clone()).unwrap();
        assert!(matches!(source, MessageSource::Other(_)), "{raw}");
        assert_eq!(serde_json::to_value(&source).unwrap(), raw);
    }
    // Well-formed known tags read as their variants, nested blocks included.
    let block: ContentBlock = serde_json::from_value(json!({
        "type": "tool-result", "toolCallId": "c", "isError": false,
        "content": [{"type": "text", "text": "ok"}, {"type": "reasoning", "text": "r", "sig": 1}],
    }))
    .unwrap();
    let ContentBlock::ToolResult { content, .. } = &block else {
        panic!("{block:?}")
    };
    assert_eq!(content[0], ContentBlock::text("ok"));
    assert!(matches!(&content[1], ContentBlock::Reasoning { extra, .. } if extra["sig"] == 1));
}

/// spine §3, §4.2 rule 2, §4.7 — an `Other` arm that names a known tag is refused at the append
/// site (and in a seed, and by the loggability pre-checks that promise the append will not
/// refuse), the log unchanged: its JSON reads back as the typed variant, so the stored event
/// would not be the event that was appended (a `ContentBlock::Other` spelling a text block
/// turns into visible text on the next load).
#[test]
fn an_other_arm_naming_a_known_tag_is_refused_at_the_append() {
    let text_as_other = ContentBlock::Other(object(json!({"type": "text", "text": "hi"})));
    let user_as_other = MessageSource::Other(object(json!({"kind": "user"})));
    // The two readings really differ.
    let line = serde_json::to_value(&text_as_other).unwrap();
    assert_ne!(
        serde_json::from_value::<ContentBlock>(line).ok(),
        Some(text_as_other.clone())
    );

    let s = session();
    let cases = [
        (
            "block",
            EventData::UserMessage(user_message(vec![text_as_other.clone()], MessageSource::User)),
        ),
        (
            "source",
            EventData::UserMessage(user_message(vec![ContentBlock::text("x")], user_as_other.clone())),
        ),
        (
            "nested block",
            EventData::UserMessage(user_message(
                vec![ContentBlock::ToolResult {
                    tool_call_id: "c".into(),
                    content: vec![text_as_other.clone()],
                    is_error: Some(false),
                }],
                MessageSource::User,
            )),
        ),
        (
            "assistant block",
            EventData::AssistantMessage {
                turn: 1,
                step: 1,
                message: Message::assistant(vec![text_as_other.clone()], "p", "m"),
                usage: None,
                interrupted: false,
            },
        ),
        (
            "streamed block",
            EventData::AssistantChunk {
                turn: 1,
                step: 1,
                chunk: StreamChunk::BlockEnd {
                    index: 0,
                    block: text_as_other.clone(),
                },
            },
        ),
        (
            "inbox insert",
            EventData::InboxSpliced(InboxSplice {
                target: InboxTarget::NextTurn,
                start: 0,
                removed_count: None,
                inserted: vec![user_message(vec![], user_as_other.clone())],
                outcome: None,
            }),
        ),
    ];
    for (what, data) in cases {
        let surface = data.is_surface().then(SurfaceMeta::append);
        let err = s.append(data.clone(), surface.clone()).expect_err(what);
        assert!(matches!(err, LogError::Invalid { .. }), "{what}: {err}");
        let path = match what {
            "block" => "`.content[0]` names the known type `text`",
            "source" => "`.source` names the known kind `user`",
            "nested block" => "`.content[0].content[0]` names the known type `text`",
            "assistant block" => "`.message.content[0]`",
            "streamed block" => "`.chunk.block`",
            _ => "`.inserted[0].source`",
        };
        assert!(err.to_string().contains(path), "{what}: {err}");
        let seed = vec![SessionEvent {
            seq: 0,
            time: 1,
            data,
            surface,
            ignorable: false,
        }];
        let header = SessionMeta::default().into_header("t".into(), 1).unwrap();
        let err = Session::new(header, Some(seed)).expect_err(what);
        assert!(
            matches!(err, LogError::SeedInvalid { index: 0, .. }),
            "{what}: {err}"
        );
    }
    assert!(s.is_empty(), "nothing was committed");
    // The pre-checks a tool pipeline runs before committing agree with the append.
    assert!(check_tool_result_loggable(std::slice::from_ref(&text_as_other), None).is_err());
    assert!(check_inbox_insert_loggable(&[user_message(vec![], user_as_other)]).is_err());
    // Unknown tags stay welcome.
    let custom = ContentBlock::Other(object(json!({"type": "x-custom", "v": 1})));
    let plugin = MessageSource::Other(object(json!({"kind": "subagent-report"})));
    s.append(
        EventData::UserMessage(user_message(vec![custom.clone()], plugin.clone())),
        Some(SurfaceMeta::append()),
    )
    .unwrap();
    assert!(check_tool_result_loggable(&[custom], None).is_ok());
    assert!(check_inbox_insert_loggable(&[user_message(vec![], plugin)]).is_ok());
}

/// spine §3, §4.4, §8.5 — the other open unions of a log line follow the same rule: a turn-end
/// reason, a cancel cause or a plugin form whose tag is known but whose fields do not fit is
/// refused (it used to read as the catch-all: an `aborted` turn without its cause became an
/// unknown reason, which consumers map to an error), and a catch-all naming a known tag is
/// refused at the append (a `TurnEndReason::Other` spelled `{"kind": "completed"}`, which
/// consumers treat as a failure, read back as a completed turn; likewise a
/// `FinishReason::Unknown` of kind `stop`).
#[test]
fn turn_end_reasons_causes_and_plugin_forms_keep_known_tags_typed() {
    use agent::model::LlmFailure;
    use agent::{CancelCause, PluginForm, TurnEndReason};

    for (raw, needle) in [
        (json!({"kind": "aborted"}), "missing field `reason`"),
        (
            json!({"kind": "error", "error": {"message": "m"}}),
            "missing field `code`",
        ),
        (
            json!({"kind": "aborted", "reason": {"kind": "hook"}}),
            "missing field `reason`",
        ),
    ] {
        let err = serde_json::from_value::<TurnEndReason>(raw.clone())
            .expect_err(&format!("{raw} must be refused"));
        assert!(err.to_string().contains(needle), "{raw}: {err}");
    }
    for (raw, needle) in [
        (json!({"kind": "hook"}), "missing field `reason`"),
        (json!({"kind": "other", "reason": 3}), "`other`"),
    ] {
        let err =
            serde_json::from_value::<CancelCause>(raw.clone()).expect_err(&format!("{raw} must be refused"));
        assert!(err.to_string().contains(needle), "{raw}: {err}");
    }
    for (raw, needle) in [
        (json!({"type": "notice"}), "missing field `summary`"),
        (
            json!({"type": "snapshot", "sections": [{"name": "a"}]}),
            "missing field `text`",
        ),
    ] {
        let err =
            serde_json::from_value::<PluginForm>(raw.clone()).expect_err(&format!("{raw} must be refused"));
        assert!(err.to_string().contains(needle), "{raw}: {err}");
    }
    // Unknown tags still read as the catch-all and round-trip; known ones stay typed.
    let raw = json!({"kind": "exploded", "why": 1});
    let reason: TurnEndReason = serde_json::from_value(raw.clone()).unwrap();
    assert!(matches!(reason, TurnEndReason::Other(_)));
    assert_eq!(serde_json::to_value(&reason).unwrap(), raw);
    let raw = json!({"kind": "aborted", "reason": {"kind": "timeout", "after": 5}});
    let reason: TurnEndReason = serde_json::from_value(raw.clone()).unwrap();
    assert!(matches!(
        &reason,
        TurnEndReason::Aborted {
            reason: CancelCause::Unknown(_)
        }
    ));
    assert_eq!(serde_json::to_value(&reason).unwrap(), raw);
    let raw = json!({"type": "digest", "n": 2});
    let form: PluginForm = serde_json::from_value(raw.clone()).unwrap();
    assert!(matches!(form, PluginForm::Other(_)));
    assert_eq!(serde_json::to_value(&form).unwrap(), raw);
    assert_eq!(
        serde_json::from_value::<TurnEndReason>(
            json!({"kind": "error", "error": {"message": "m", "code": "C"}})
        )
        .unwrap(),
        TurnEndReason::Error {
            error: LlmFailure::new("C", "m")
        }
    );

    // Write side: a catch-all naming a known tag is refused, the log unchanged.
    let s = session();
    let misnamed = [
        (
            "reason",
            EventData::TurnEnd {
                turn: 1,
                reason: TurnEndReason::Other(object(json!({"kind": "completed"}))),
            },
        ),
        (
            "cause",
            EventData::TurnEnd {
                turn: 1,
                reason: TurnEndReason::Aborted {
                    reason: CancelCause::Unknown(object(json!({"kind": "user"}))),
                },
            },
        ),
        (
            "finish reason",
            EventData::AssistantChunk {
                turn: 1,
                step: 1,
                chunk: StreamChunk::Finish {
                    reason: agent::FinishReason::Unknown {
                        kind: "stop".into(),
                        fields: Map::new(),
                    },
                    replay_state: None,
                },
            },
        ),
        (
            "form",
            EventData::UserMessage(user_message(
                vec![],
                MessageSource::Plugin {
                    plugin: "prompt".into(),
                    form: Some(PluginForm::Other(object(json!({"type": "relay"})))),
                },
            )),
        ),
    ];
    for (what, data) in misnamed {
        let surface = data.is_surface().then(SurfaceMeta::append);
        let err = s.append(data, surface).expect_err(what);
        assert!(matches!(err, LogError::Invalid { .. }), "{what}: {err}");
        assert!(err.to_string().contains("known"), "{what}: {err}");
    }
    assert!(s.is_empty(), "nothing was committed");
    s.append(
        EventData::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Other(object(json!({"kind": "exploded"}))),
        },
        None,
    )
    .unwrap();
}
