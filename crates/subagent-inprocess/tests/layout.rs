//! The child log layout of spec `inprocess-providers.md` §3.3 and the descriptor placement of
//! §3.2 step 6.4.

mod common;

use agent::EventData;
use agent_loop::model::chunks;
use common::*;
use serde_json::json;
use subagent::run::SubagentRun;
use subagent_inprocess::InProcessRunOptions;

/// spec: §3.3 — spawn without policy services: the prompt splice at seq 0, `turn/start`, the
/// claim, the descriptor (inside the first turn, before `step/start` and the first request),
/// then the step with the prompt as its first user message.
#[tokio::test(start_paused = true)]
async fn spawn_layout_places_the_descriptor_inside_the_first_turn() {
    let host = Host::new(vec![chunks::text("answer").into()]).await;
    let run = host
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    let events = events_of(&child);
    let t = types(&events);
    assert_eq!(
        t[..6],
        [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "subagent/descriptor",
            "step/start",
            "user/message",
        ]
    );
    assert!(matches!(&events[0].data, EventData::InboxSpliced(s) if !s.is_claim()));
    assert!(matches!(&events[2].data, EventData::InboxSpliced(s) if s.is_claim()));
    match &events[3].data {
        EventData::Other { kind, data } => {
            assert_eq!(kind, "subagent/descriptor");
            assert_eq!(
                &**data,
                &json!({"version": 2, "mode": "one-shot", "provider": "spawn", "label": "child task"})
            );
        }
        other => panic!("expected the descriptor, got {other:?}"),
    }
    assert!(matches!(&events[5].data, EventData::UserMessage(m) if m.text() == "child task"));
    let first_request = t.iter().position(|x| x == "request/header").unwrap();
    assert!(first_request > 3);
    assert_eq!(t.last().map(String::as_str), Some("turn/end"));
    assert_eq!(t.iter().filter(|x| *x == "subagent/descriptor").count(), 1);
    run.dispose().await.unwrap();
    host.finish().await;
}
