//! Crash repair of logs that end inside an open turn.

mod common;

use agent::{ContentBlock, EventData, Message, Session, TurnEndReason};
use agent_loop::store::{
    TOOL_INTERRUPTED_CODE, TOOL_NOT_STARTED_CODE, repair_open_turn, repair_open_turn_at,
};
use common::{LogBuilder, assistant, check_enclosure, header, sample_log, tool_call, tool_result};

fn turn_end(turn: u64) -> EventData {
    EventData::TurnEnd {
        turn,
        reason: TurnEndReason::Interrupted,
    }
}

/// The repaired log is balanced, valid as a seed, and the next turn continues the numbering.
fn assert_resumable(events: &[agent::SessionEvent], next_turn: u64) {
    check_enclosure(events).expect("repaired log replays cleanly");
    agent::session::validate_log(events).expect("repaired log is valid");
    let mut seeded = events.to_vec();
    seeded.push(agent::SessionEvent {
        seq: events.len() as u64,
        time: 9,
        data: EventData::TurnStart { turn: next_turn },
        surface: None,
        ignorable: false,
    });
    check_enclosure(&seeded).expect("the next turn opens cleanly");
    Session::new(header("s"), Some(events.to_vec())).expect("seeds a session");
}

#[test]
fn a_balanced_log_is_left_alone() {
    let mut events = sample_log("s");
    let before = events.clone();
    assert!(!repair_open_turn(&mut events));
    assert_eq!(events, before);
    let mut empty = Vec::new();
    assert!(!repair_open_turn(&mut empty));
    assert!(empty.is_empty());
}

#[test]
fn an_open_turn_without_a_step_gets_only_turn_end() {
    let mut b = LogBuilder::new("s");
    b.push(EventData::TurnStart { turn: 1 })
        .push(EventData::UserMessage(Message::user_text("between")));
    let mut events = b.events();
    assert!(repair_open_turn_at(&mut events, 42));
    assert_eq!(events.len(), 3);
    assert_eq!(events[2].seq, 2);
    assert_eq!(events[2].time, 42);
    assert_eq!(events[2].data, turn_end(1));
    assert_resumable(&events, 2);
}

#[test]
fn a_crash_mid_stream_closes_the_step_then_the_turn() {
    let mut b = LogBuilder::new("s");
    for ev in sample_log("s") {
        b.push(ev.data);
    }
    b.push(EventData::TurnStart { turn: 2 })
        .push(EventData::StepStart { turn: 2, step: 1 })
        .push(EventData::UserMessage(Message::user_text("go")))
        .push(EventData::AssistantChunk {
            turn: 2,
            step: 1,
            chunk: agent::StreamChunk::TextDelta {
                index: 0,
                text: "par".into(),
            },
        });
    let mut events = b.events();
    let n = events.len();
    assert!(repair_open_turn(&mut events));
    let tail: Vec<_> = events[n..].iter().map(|e| e.data.clone()).collect();
    assert_eq!(tail, vec![EventData::StepEnd { turn: 2, step: 1 }, turn_end(2)]);
    assert_resumable(&events, 3);
}

#[test]
fn unanswered_calls_get_error_results_before_step_end() {
    let mut b = LogBuilder::new("s");
    b.push(EventData::TurnStart { turn: 1 })
        .push(EventData::StepStart { turn: 1, step: 1 })
        .push(assistant(
            1,
            1,
            vec![
                ContentBlock::text("three calls"),
                ContentBlock::tool_call("done", "read", "{}"),
                ContentBlock::tool_call("running", "read", "{}"),
                ContentBlock::tool_call("queued", "read", "{}"),
            ],
        ))
        .push(tool_call(1, 1, "done"))
        .push(tool_result(1, 1, "done"))
        .push(tool_call(1, 1, "running"));
    let mut events = b.events();
    let n = events.len();
    assert!(repair_open_turn(&mut events));
    let tail = &events[n..];
    assert_eq!(tail.len(), 4);
    let result_of = |i: usize| match &tail[i].data {
        EventData::ToolResult {
            turn: 1,
            step: 1,
            message,
            error: Some(error),
            ..
        } => {
            let Some(ContentBlock::ToolResult {
                tool_call_id,
                is_error,
                ..
            }) = message.content.first()
            else {
                panic!("not a tool-result message: {message:?}");
            };
            assert_eq!(*is_error, Some(true));
            assert!(tail[i].surface.is_some(), "surface events carry surfaceOp");
            (tool_call_id.to_string(), error.code.clone())
        }
        other => panic!("expected a tool/result, got {other:?}"),
    };
    assert_eq!(result_of(0), ("running".into(), TOOL_INTERRUPTED_CODE.into()));
    assert_eq!(result_of(1), ("queued".into(), TOOL_NOT_STARTED_CODE.into()));
    assert_eq!(tail[2].data, EventData::StepEnd { turn: 1, step: 1 });
    assert_eq!(tail[3].data, turn_end(1));
    assert_resumable(&events, 2);
}

#[test]
fn an_open_step_after_a_finished_tool_round_needs_no_results() {
    let mut b = LogBuilder::new("s");
    b.push(EventData::TurnStart { turn: 1 })
        .push(EventData::StepStart { turn: 1, step: 1 })
        .push(assistant(1, 1, vec![ContentBlock::tool_call("c", "read", "{}")]))
        .push(tool_call(1, 1, "c"))
        .push(tool_result(1, 1, "c"))
        .push(EventData::StepEnd { turn: 1, step: 1 })
        .push(EventData::StepStart { turn: 1, step: 2 });
    let mut events = b.events();
    let n = events.len();
    assert!(repair_open_turn(&mut events));
    let tail: Vec<_> = events[n..].iter().map(|e| e.data.clone()).collect();
    assert_eq!(tail, vec![EventData::StepEnd { turn: 1, step: 2 }, turn_end(1)]);
    assert_resumable(&events, 2);
}

/// The next turn number after `events` (one more than the last `turn/start`'s).
fn next_turn(events: &[agent::SessionEvent]) -> u64 {
    events
        .iter()
        .filter_map(|e| match e.data {
            EventData::TurnStart { turn } => Some(turn),
            _ => None,
        })
        .max()
        .unwrap_or(0)
        + 1
}

/// Crash at any byte, then resume: a JSON-lines log holding a finished turn and an open one
/// mid tool round, cut at every byte after its header, loads a prefix of what was written and
/// repairs to a resumable log; the repair, appended to the file, survives a second crash at
/// any byte of its own write: the reload repairs again to a resumable log that keeps every
/// original event.
#[tokio::test]
async fn a_log_cut_at_any_byte_loads_and_repairs_to_a_resumable_log_twice() {
    use agent_loop::store::JsonlStore;
    let mut b = LogBuilder::new("s");
    for ev in sample_log("s").iter().take(11) {
        b.push(ev.data.clone());
    }
    b.push(EventData::TurnStart { turn: 2 })
        .push(EventData::StepStart { turn: 2, step: 1 })
        .push(assistant(
            2,
            1,
            vec![
                ContentBlock::tool_call("done", "read", "{}"),
                ContentBlock::tool_call("running", "read", "{}"),
                ContentBlock::tool_call("queued", "read", "{}"),
            ],
        ))
        .push(tool_call(2, 1, "done"))
        .push(tool_result(2, 1, "done"))
        .push(tool_call(2, 1, "running"));
    let events = b.events();
    let id = agent::SessionId::from("s");
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    store.create(&header("s")).unwrap();
    for ev in &events {
        store.append(&id, ev).unwrap();
    }
    store.flush(&id).await.unwrap();
    store.close(&id).await.unwrap();
    let full = std::fs::read(dir.path().join("s.jsonl")).unwrap();
    let header_end = full.iter().position(|b| *b == b'\n').unwrap() + 1;

    let cut_dir = tempfile::tempdir().unwrap();
    let cut_path = cut_dir.path().join("s.jsonl");
    for cut in header_end..=full.len() {
        std::fs::write(&cut_path, &full[..cut]).unwrap();
        let loaded = JsonlStore::new(cut_dir.path()).load(&id).await;
        let mut loaded = loaded.unwrap_or_else(|e| panic!("cut at {cut}: {e}")).events;
        assert_eq!(loaded[..], events[..loaded.len()], "cut at {cut}");
        let next = next_turn(&loaded);
        repair_open_turn_at(&mut loaded, 9);
        assert_resumable(&loaded, next);
    }

    // The whole log, repaired and the repair written back, then cut inside that write.
    let store = JsonlStore::new(dir.path());
    let mut repaired = store.load(&id).await.unwrap().events;
    assert!(repair_open_turn_at(&mut repaired, 9));
    for ev in &repaired[events.len()..] {
        store.append(&id, ev).unwrap();
    }
    store.flush(&id).await.unwrap();
    store.close(&id).await.unwrap();
    let full = std::fs::read(dir.path().join("s.jsonl")).unwrap();
    let original_len = std::fs::read(&cut_path).unwrap().len();
    for cut in original_len..=full.len() {
        std::fs::write(&cut_path, &full[..cut]).unwrap();
        let loaded = JsonlStore::new(cut_dir.path()).load(&id).await;
        let mut loaded = loaded
            .unwrap_or_else(|e| panic!("repair cut at {cut}: {e}"))
            .events;
        assert!(
            loaded.len() >= events.len(),
            "repair cut at {cut}: lost an original event"
        );
        assert_eq!(loaded[..], repaired[..loaded.len()], "repair cut at {cut}");
        repair_open_turn_at(&mut loaded, 9);
        assert_resumable(&loaded, 3);
        assert_eq!(loaded[..events.len()], events[..]);
    }
}
