//! Derived history (spec §4.6).

mod common;

use std::sync::Arc;

use agent::content::ContentBlock;
use agent::event::SurfaceOp;
use agent::history::event_message;
use agent::model::{StreamChunk, TokenUsage};
use agent::{EventData, Message, MessageSource, SessionEvent, SurfaceMeta, derive_messages};
use common::{Log, completed};

fn messages_of(log: &Log) -> Vec<Message> {
    log.events()
        .iter()
        .filter_map(|e| event_message(e).cloned())
        .collect()
}

#[test]
fn surface_events_project_in_order_and_everything_else_projects_nothing() {
    let mut log = Log::new();
    log.other("subagent/descriptor")
        .accept("queued")
        .turn_start(1)
        .claim()
        .step_start(1, 1)
        .user("task")
        .push(EventData::AssistantChunk {
            turn: 1,
            step: 1,
            chunk: StreamChunk::TextDelta {
                index: 0,
                text: "x".into(),
            },
        })
        .assistant(
            1,
            1,
            vec![
                ContentBlock::text("calling"),
                ContentBlock::tool_call("c1", "read", "{}"),
            ],
        )
        .tool_call(1, 1, "c1")
        .tool_result(1, 1, "c1", "file body")
        .step_end(1, 1)
        .step_start(1, 2)
        .assistant(1, 2, vec![ContentBlock::text("done")])
        .step_end(1, 2)
        .turn_end(1, completed());
    let derived = derive_messages(log.events());
    let texts: Vec<String> = derived.iter().map(|m| m.text()).collect();
    assert_eq!(texts, ["task", "calling", "", "done"]);
    assert_eq!(derived, messages_of(&log));
    // The tool result is the user-role message carrying the tool-result block.
    assert_eq!(derived[2].role, agent::Role::User);
    assert!(matches!(
        derived[2].content[..],
        [ContentBlock::ToolResult { .. }]
    ));
    // Exact content and source of the user message.
    let EventData::UserMessage(user) = &log.events()[5].data else {
        panic!("seq 5 is the user message")
    };
    assert_eq!(&derived[0], user);
    assert_eq!(derived[0].source, MessageSource::User);
}

#[test]
fn empty_assistant_messages_are_skipped() {
    let mut log = Log::new();
    log.turn_start(1).step_start(1, 1).user("q");
    log.push(EventData::AssistantMessage {
        turn: 1,
        step: 1,
        message: Message::assistant(vec![], "p", "m"),
        usage: Some(Box::new(TokenUsage::default())),
        interrupted: false,
    });
    log.step_end(1, 1).turn_end(1, completed());
    let derived = derive_messages(log.events());
    assert_eq!(derived.len(), 1);
    assert_eq!(derived[0].text(), "q");
}

#[test]
fn interrupted_assistant_prefixes_are_history() {
    let mut log = Log::new();
    log.push(EventData::AssistantMessage {
        turn: 1,
        step: 1,
        message: Message::assistant(vec![ContentBlock::text("partial")], "p", "m"),
        usage: None,
        interrupted: true,
    });
    assert_eq!(derive_messages(log.events())[0].text(), "partial");
}

#[test]
fn a_replace_shadows_the_named_surface_range() {
    let mut log = Log::new();
    log.user("a") // seq 0
        .user("b") // seq 1
        .turn_start(1) // seq 2
        .user("c") // seq 3
        .user("d"); // seq 4
    log.push_with(
        EventData::UserMessage(Message::user_text("summary of b..c")),
        Some(SurfaceMeta {
            surface_op: Some(SurfaceOp::Replace { start: 1, end: 3 }),
            source_event_seqs: None,
        }),
    );
    let texts: Vec<String> = derive_messages(log.events()).iter().map(Message::text).collect();
    assert_eq!(texts, ["a", "summary of b..c", "d"]);
}

#[test]
fn an_invalid_replace_range_keeps_everything() {
    let mut log = Log::new();
    log.user("a").user("b");
    for (start, end) in [(1, 0), (0, 9), (9, 1)] {
        log.push_with(
            EventData::UserMessage(Message::user_text("r")),
            Some(SurfaceMeta {
                surface_op: Some(SurfaceOp::Replace { start, end }),
                source_event_seqs: None,
            }),
        );
    }
    let texts: Vec<String> = derive_messages(log.events()).iter().map(Message::text).collect();
    assert_eq!(texts, ["a", "b", "r", "r", "r"]);
}

#[test]
fn surface_events_without_markers_are_treated_as_appends() {
    let mut log = Log::new();
    log.push_with(EventData::UserMessage(Message::user_text("bare")), None);
    assert_eq!(derive_messages(log.events()).len(), 1);
}

#[test]
fn derive_messages_accepts_arc_snapshots() {
    let mut log = Log::new();
    log.user("x");
    let arcs: Vec<Arc<SessionEvent>> = log.events().iter().cloned().map(Arc::new).collect();
    assert_eq!(derive_messages(&arcs), derive_messages(log.events()));
}

/// The list a loop-built request carries shares the log's events: it holds exactly the projected
/// messages (in order, readable from both ends and by index), copies none of them, and clones
/// share one allocation.
#[test]
fn a_message_list_shares_the_logs_events() {
    let mut log = Log::new();
    log.turn_start(1)
        .user("task")
        .step_start(1, 1)
        .assistant(1, 1, vec![])
        .assistant(1, 1, vec![ContentBlock::text("answer")]);
    let arcs: Vec<Arc<SessionEvent>> = log.events().iter().cloned().map(Arc::new).collect();
    let mut history = agent::history::DerivedHistory::new();
    history.update(&arcs);
    let list = history.message_list();
    let expected = derive_messages(log.events());
    assert_eq!(list.len(), 2, "the empty assistant record projects to nothing");
    assert_eq!(list, expected);
    assert_eq!(list.to_vec(), expected);
    assert_eq!(list[1].text(), "answer");
    assert_eq!(list.last().map(Message::text).as_deref(), Some("answer"));
    assert_eq!(
        list.iter().rev().map(Message::text).collect::<Vec<_>>(),
        ["answer", "task"]
    );
    assert!(list.get(2).is_none());
    // No copy: the list's messages are the events' own.
    let EventData::UserMessage(logged) = &arcs[1].data else {
        panic!("the second event is the user message")
    };
    assert!(std::ptr::eq(&list[0], logged));
    assert!(agent::MessageList::ptr_eq(&list, &list.clone()));
    assert!(!agent::MessageList::ptr_eq(&list, &history.message_list()));
    // An owned list compares by its messages.
    let owned = agent::MessageList::from(expected.clone());
    assert_eq!(owned, list);
    assert!(agent::MessageList::new().is_empty());
}
