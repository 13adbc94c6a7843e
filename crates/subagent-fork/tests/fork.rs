//! The `fork` provider (spec `inprocess-providers.md` §5, checklist FRK-86…FRK-98) through the
//! seam's service, on the reference runtime with a scripted model and the online invariant
//! checker.

#[path = "../../subagent-inprocess/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::Duration;

use agent::{
    AgentRef, AgentRuntime, CancelCause, CancelOptions, ContentBlock, EventData, Message, SessionEvent,
    Signal,
};
use agent_loop::model::{ScriptEntry, chunks};
use common::*;
use parking_lot::Mutex;
use serde_json::json;
use subagent::StopReason;
use subagent::capabilities::{ContinuableCreateRequest, SubagentCapabilities};
use subagent::events::SubagentEvent;
use subagent::provider::{SubagentProvider, SubagentStartRequest};
use subagent::run::SubagentRun;
use subagent_fork::{DEFAULT_NAME, ForkProvider, completed_turn_prefix, register};

fn fork(host: &Host) -> agent::Registration {
    register(&host.service, host.driver.clone()).expect("registered")
}

async fn start(host: &Host, request: SubagentStartRequest) -> Box<dyn SubagentRun> {
    host.service.start(DEFAULT_NAME, request).await.expect("started")
}

fn turn_ends(events: &[SessionEvent]) -> usize {
    events.iter().filter(|e| e.type_name() == "turn/end").count()
}

/// spec: FRK-86 — `subagent/start` fires only after the seeded child is published.
#[tokio::test(start_paused = true)]
async fn frk_86_start_event_after_seeded_publication() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        chunks::text("child answer").into(),
    ])
    .await;
    let _p = fork(&host);
    host.parent_turn("parent question").await;
    let seen = Arc::new(Mutex::new(None));
    let s = seen.clone();
    let agents = host.runtime.services().agents.clone();
    let listener = host.service.events().on(move |e| {
        if let SubagentEvent::Start(info) = e {
            let child = agents.get(&info.id);
            *s.lock() = Some(child.and_then(|c| c.session().header().seed_length));
        }
        Ok(())
    });
    let run = start(&host, host.request()).await;
    let seed_length = (*seen.lock()).expect("start emitted");
    assert_eq!(seed_length, Some(host.parent.session().len() as u64));
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    drop(listener);
    host.finish().await;
}

/// spec: POL-21, FRK-88 — the fork provider's `start` captures its seed (and, through the
/// driver, the delegated policy) when it is called: a parent turn completed between the call and
/// the first poll of its future does not reach the child.
#[tokio::test(start_paused = true)]
async fn the_seed_is_captured_when_start_is_called() {
    let host = Host::new(vec![
        chunks::text("first parent answer").into(),
        chunks::text("second parent answer").into(),
        chunks::text("child answer").into(),
    ])
    .await;
    host.parent_turn("first question").await;
    let at_call = host.parent.session().len();
    let provider = ForkProvider::new(host.driver.clone());
    let starting = provider.start(resolve(host.request(), DEFAULT_NAME));
    host.parent_turn("second question").await;
    assert!(host.parent.session().len() > at_call);
    let run = starting.await.expect("started");
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    assert_eq!(child.session().header().seed_length, Some(at_call as u64));
    assert_eq!(turn_ends(&events_of(&child)[..at_call]), 1);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: FRK-87 — with no completed parent turn the child is unseeded: one own `turn/end`, no
/// `seedLength`, no end-seed marker.
#[tokio::test(start_paused = true)]
async fn frk_87_no_completed_turn_means_unseeded() {
    let host = Host::new(vec![chunks::text("child answer").into()]).await;
    let _p = fork(&host);
    let run = start(&host, host.request()).await;
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    let events = events_of(&child);
    assert_eq!(turn_ends(&events), 1);
    assert_eq!(child.session().header().seed_length, None);
    assert!(!types(&events).contains(&"session/end-seed".to_owned()));
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: FRK-88 — all completed parent turns are seeded through the last `turn/end`
/// (`seedLength` = parent log length, two seeded turn ends).
#[tokio::test(start_paused = true)]
async fn frk_88_all_completed_turns_are_seeded() {
    let host = Host::new(vec![
        chunks::text("one").into(),
        chunks::text("two").into(),
        chunks::text("child").into(),
    ])
    .await;
    let _p = fork(&host);
    host.parent_turn("first").await;
    host.parent_turn("second").await;
    let parent_len = host.parent.session().len();
    let run = start(&host, host.request()).await;
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    let events = events_of(&child);
    assert_eq!(child.session().header().seed_length, Some(parent_len as u64));
    assert_eq!(turn_ends(&events[..parent_len]), 2);
    assert_eq!(events[parent_len - 1].type_name(), "turn/end");
    assert_eq!(turn_ends(&events), 3);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: FRK-89 — the child inherits the parent's user message, records lineage and
/// `seedLength`, and returns its own answer.
#[tokio::test(start_paused = true)]
async fn frk_89_inherits_history_and_answers_for_itself() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        chunks::text("child answer").into(),
    ])
    .await;
    let _p = fork(&host);
    host.parent_turn("parent question").await;
    let run = start(&host, host.request()).await;
    let result = run.result().await.unwrap();
    assert_eq!(text(&result.output), "child answer");
    let child_request = host.model.requests()[1].clone();
    let texts: Vec<String> = child_request.messages.iter().map(Message::text).collect();
    assert!(texts.iter().any(|t| t == "parent question"), "{texts:?}");
    assert!(texts.iter().any(|t| t == "child task"));
    let header = run.local_agent().unwrap().session().header().clone();
    assert_eq!(header.parent_session.as_ref(), Some(host.parent.id()));
    assert_eq!(header.seed_length, Some(host.parent.session().len() as u64));
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: FRK-90 — forking while the parent's second turn hangs excludes the open turn; the
/// invariant-checked child completes with two turn ends in total and continues the numbering.
#[tokio::test(start_paused = true)]
async fn frk_90_open_parent_turn_is_excluded() {
    let host = Host::new(vec![
        chunks::text("first answer").into(),
        ScriptEntry::hang(),
        chunks::text("child answer").into(),
    ])
    .await;
    let _p = fork(&host);
    host.parent_turn("first").await;
    host.parent.followup(Message::user_text("second")).unwrap();
    while host.model.requests().len() < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let run = start(&host, host.request()).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    let child = run.local_agent().unwrap();
    let events = events_of(&child);
    assert_eq!(turn_ends(&events), 2);
    let own_turns: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.data {
            EventData::TurnStart { turn } => Some(turn),
            _ => None,
        })
        .collect();
    assert_eq!(own_turns, [1, 2]);
    assert!(host.observer.violations().is_empty());
    run.dispose().await.unwrap();
    host.parent.cancel(CancelCause::User, CancelOptions::default());
    host.parent.when_idle().await;
    host.finish().await;
}

/// spec: FRK-91 — structured output works for a seeded child; nothing stays registered.
#[tokio::test(start_paused = true)]
async fn frk_91_structured_output_for_a_seeded_child() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        chunks::tool_call(
            "c1",
            subagent_inprocess::STRUCTURED_OUTPUT_TOOL,
            json!({"answer": 5}),
        )
        .into(),
    ])
    .await;
    let _p = fork(&host);
    host.parent_turn("parent question").await;
    let mut request = host.request();
    request.output_schema = Some(json!({
        "type": "object",
        "properties": {"answer": {"type": "number"}},
        "required": ["answer"]
    }));
    let run = start(&host, request).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, Some(json!({"answer": 5})));
    assert!(
        run.local_agent()
            .unwrap()
            .session()
            .header()
            .seed_length
            .is_some()
    );
    let child = run.id().clone();
    run.dispose().await.unwrap();
    let tools = host.runtime.services().tools.clone();
    assert!(
        tools
            .get(subagent_inprocess::STRUCTURED_OUTPUT_TOOL, Some(&child))
            .is_none()
    );
    assert!(
        tools
            .get(subagent_inprocess::STRUCTURED_OUTPUT_TOOL, None)
            .is_none()
    );
    host.finish().await;
}

/// spec: FRK-92 — a child that produces no message of its own returns `[]`, never the seeded
/// parent text.
#[tokio::test(start_paused = true)]
async fn frk_92_no_own_message_returns_empty() {
    let host = Host::new(vec![chunks::text("parent answer").into(), chunks::empty().into()]).await;
    let _p = fork(&host);
    host.parent_turn("parent question").await;
    let run = start(&host, host.request()).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.output, Vec::<ContentBlock>::new());
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: FRK-93 — all four capabilities are advertised; the provider inherits parent context.
#[tokio::test(start_paused = true)]
async fn frk_93_capabilities() {
    let host = Host::new(vec![]).await;
    let provider = ForkProvider::new(host.driver.clone());
    assert_eq!(provider.capabilities(), SubagentCapabilities::ALL);
    assert!(provider.inherits_parent_context());
    assert_eq!(provider.name(), "fork");
    host.finish().await;
}

/// spec: FRK-94 — disposing the provider's registration unregisters it.
#[tokio::test(start_paused = true)]
async fn frk_94_unregistering() {
    let host = Host::new(vec![]).await;
    let removed = Arc::new(Mutex::new(Vec::new()));
    let r = removed.clone();
    let listener = host.service.events().on(move |e| {
        if let SubagentEvent::ProviderRemoved(name) = e {
            r.lock().push(name.clone());
        }
        Ok(())
    });
    let guard = fork(&host);
    assert_eq!(host.service.list(), ["fork"]);
    drop(guard);
    assert!(host.service.list().is_empty());
    assert_eq!(*removed.lock(), ["fork"]);
    drop(listener);
    host.finish().await;
}

async fn prepare(provider: &ForkProvider, parent: &AgentRef) -> Option<Vec<SessionEvent>> {
    provider
        .continuable()
        .expect("continuable preparation present")
        .prepare_continuable(ContinuableCreateRequest {
            session_id: "reserved".into(),
            parent: parent.clone(),
            signal: Signal::new(),
        })
        .await
        .unwrap()
        .seed
}

/// spec: FRK-95 — continuable preparation returns no seed before a completed turn and afterwards
/// a seed ending in `turn/end` with seqs equal to indexes.
#[tokio::test(start_paused = true)]
async fn frk_95_continuable_preparation() {
    let host = Host::new(vec![chunks::text("parent answer").into()]).await;
    let provider = ForkProvider::new(host.driver.clone());
    assert_eq!(prepare(&provider, &host.parent).await, None);
    host.parent_turn("q").await;
    let seed = prepare(&provider, &host.parent).await.expect("seeded");
    assert_eq!(seed.last().unwrap().type_name(), "turn/end");
    assert!(seed.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    assert_eq!(Some(seed), completed_turn_prefix(&host.parent));
    host.finish().await;
}

/// spec: FRK-96 — (Rust equivalent of "named plugin exports only") the crate's surface is the
/// provider type, its default name, `register` and the prefix function.
#[tokio::test(start_paused = true)]
async fn frk_96_surface() {
    let host = Host::new(vec![]).await;
    assert_eq!(DEFAULT_NAME, "fork");
    let guard = register(&host.service, host.driver.clone()).unwrap();
    assert_eq!(host.service.get_provider("fork").unwrap().name(), "fork");
    assert_eq!(ForkProvider::named("other", host.driver.clone()).name(), "other");
    assert_eq!(completed_turn_prefix(&host.parent), None);
    drop(guard);
    host.finish().await;
}

/// spec: FRK-97 — spawn and fork coexist on one service.
#[tokio::test(start_paused = true)]
async fn frk_97_spawn_and_fork_coexist() {
    let host = Host::new(vec![]).await;
    let s = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let f = fork(&host);
    assert_eq!(host.service.list(), ["spawn", "fork"]);
    assert!(
        !host
            .service
            .get_provider("spawn")
            .unwrap()
            .inherits_parent_context()
    );
    assert!(
        host.service
            .get_provider("fork")
            .unwrap()
            .inherits_parent_context()
    );
    drop((s, f));
    host.finish().await;
}

/// spec: FRK-98 — one parent drives a spawn child and a fork child (distinct sessions, both
/// lineage-stamped, only the fork seeded) and then keeps working, with only its own two turns
/// logged.
#[tokio::test(start_paused = true)]
async fn frk_98_one_parent_drives_both() {
    let host = Host::new(vec![
        chunks::text("parent one").into(),
        chunks::text("spawn child").into(),
        chunks::text("fork child").into(),
        chunks::text("parent two").into(),
    ])
    .await;
    let _s = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let _f = fork(&host);
    host.parent_turn("first").await;
    let spawned = host.service.start("spawn", host.request()).await.expect("spawn");
    let forked = host.service.start("fork", host.request()).await.expect("fork");
    assert_eq!(text(&spawned.result().await.unwrap().output), "spawn child");
    assert_eq!(text(&forked.result().await.unwrap().output), "fork child");
    assert_ne!(spawned.id(), forked.id());
    let (sc, fc) = (spawned.local_agent().unwrap(), forked.local_agent().unwrap());
    for child in [&sc, &fc] {
        assert_eq!(
            child.session().header().parent_session.as_ref(),
            Some(host.parent.id())
        );
    }
    assert_eq!(sc.session().header().seed_length, None);
    assert!(fc.session().header().seed_length.is_some());
    spawned.dispose().await.unwrap();
    forked.dispose().await.unwrap();
    host.parent_turn("second").await;
    let parent_turns = events_of(&host.parent)
        .iter()
        .filter(|e| e.type_name() == "turn/start")
        .count();
    assert_eq!(parent_turns, 2);
    host.finish().await;
}

/// spec: §5.1, §5.3 (spine §4.7 item 5) — a parent whose log is ill-formed (a turn closed while
/// its step is still open, which no agent loop writes) has an unbalanced completed-turn prefix.
/// The fork refuses it with a typed `PROVIDER_FAILED` error (source
/// `StartFailure::UnbalancedSeed`) instead of publishing a child that could not continue it:
/// nothing is created, no model request is made, the parent's log is untouched. Its continuable
/// preparation (spec §5.5) refuses the same prefix with the same error.
#[tokio::test(start_paused = true)]
async fn an_ill_formed_parent_log_is_refused_with_a_typed_error() {
    // No invariant checker: it would refuse this parent's seed when the store enters it.
    let host = Host::unchecked(vec![]).await;
    let _p = fork(&host);
    // Created from a seed (the session accepts any seed; balance is the driving agent's
    // concern), so the log never passes through an append a checker could veto.
    let seed: Vec<SessionEvent> = [
        EventData::TurnStart { turn: 1 },
        EventData::StepStart { turn: 1, step: 1 },
        EventData::TurnEnd {
            turn: 1,
            reason: agent::TurnEndReason::Completed,
        },
    ]
    .into_iter()
    .enumerate()
    .map(|(i, data)| SessionEvent {
        seq: i as u64,
        time: 0,
        data,
        surface: None,
        ignorable: false,
    })
    .collect();
    let handle = host
        .runtime
        .create(agent::CreateAgentOptions {
            seed: Some(seed),
            agent_options: routed(),
            ..agent::CreateAgentOptions::new("ill-formed".into())
        })
        .await
        .expect("created");
    let parent = handle.agent().clone();
    let before = events_of(&parent);
    assert_eq!(completed_turn_prefix(&parent).map(|s| s.len()), Some(3));
    let (agents, sessions) = (host.agent_count(), host.session_count());
    let err = match host
        .service
        .start(DEFAULT_NAME, request_from(&parent, Signal::new()))
        .await
    {
        Ok(_) => panic!("an unbalanced seed must not start"),
        Err(subagent::service::StartError::Subagent(e)) => e,
        Err(other) => panic!("expected a seam error, got {other}"),
    };
    assert_eq!(err.code(), subagent::error::SubagentErrorCode::ProviderFailed);
    let failure = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<subagent_inprocess::StartFailure>())
        .expect("typed source");
    assert!(matches!(
        failure,
        subagent_inprocess::StartFailure::UnbalancedSeed
    ));
    assert_eq!((host.agent_count(), host.session_count()), (agents, sessions));
    assert!(host.model.requests().is_empty());
    assert_eq!(events_of(&parent), before);
    // The continuable preparation refuses the same prefix the same way.
    let err = ForkProvider::new(host.driver.clone())
        .continuable()
        .expect("continuable preparation present")
        .prepare_continuable(ContinuableCreateRequest {
            session_id: "reserved".into(),
            parent: parent.clone(),
            signal: Signal::new(),
        })
        .await
        .expect_err("an unbalanced prefix is not a seed");
    assert_eq!(err.code(), subagent::error::SubagentErrorCode::ProviderFailed);
    assert!(matches!(
        std::error::Error::source(&err).and_then(|s| s.downcast_ref::<subagent_inprocess::StartFailure>()),
        Some(subagent_inprocess::StartFailure::UnbalancedSeed)
    ));
    handle.dispose().await;
    host.finish().await;
    // The parent's log is this test's ill-formed input, not a log a loop wrote: keep its
    // capture out of `cargo xtask check-invariants`, which would rightly flag it (S5).
    agent_loop::trace::discard_capture("ill-formed");
}

/// spec: §5.3, §5.4, §3.6 (FRK-88, FRK-89) — a fork of a parent that is itself a fork child: the
/// grandchild's seed is the child's whole balanced log (the grandparent's seed and its end-seed
/// marker included, verbatim), its `seedLength`, lineage and depth are its own, its turn numbering
/// continues, and its result holds only its own answer. Disposing the middle run drains the
/// grandchild (owned by the child's scope) as well; both runs end quiescent.
#[tokio::test(start_paused = true)]
async fn fork_of_a_fork_child_seeds_the_childs_whole_log() {
    let host = Host::new(vec![
        chunks::text("grandparent answer").into(),
        chunks::text("child answer").into(),
        chunks::text("grandchild answer").into(),
        ScriptEntry::hang(),
    ])
    .await;
    let _p = fork(&host);
    host.parent_turn("first").await;
    let child_run = start(&host, host.request()).await;
    assert_eq!(text(&child_run.result().await.unwrap().output), "child answer");
    let child = child_run.local_agent().unwrap();
    let child_log = events_of(&child);
    assert_eq!(child_log.last().map(SessionEvent::type_name), Some("turn/end"));

    let grandchild_run = start(&host, request_from(&child, Signal::new())).await;
    let result = grandchild_run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(text(&result.output), "grandchild answer");
    let grandchild = grandchild_run.local_agent().unwrap();
    let events = events_of(&grandchild);
    let header = grandchild.session().header().clone();
    assert_eq!(header.seed_length, Some(child_log.len() as u64));
    assert_eq!(header.parent_session.as_ref(), Some(child.id()));
    assert_eq!(header.delegation_depth, Some(2));
    assert_eq!(grandchild.options().subagent_depth, Some(2));
    assert_eq!(events[..child_log.len()], child_log[..]);
    let markers = events
        .iter()
        .filter(|e| matches!(e.data, EventData::EndSeed))
        .count();
    assert_eq!(
        markers, 2,
        "the child's own marker is seeded, the grandchild adds one"
    );
    let turns: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.data {
            EventData::TurnStart { turn } => Some(turn),
            _ => None,
        })
        .collect();
    assert_eq!(turns, [1, 2, 3]);
    grandchild_run.dispose().await.unwrap();

    // A second grandchild, still running when its parent (the middle child) is disposed.
    let running = start(&host, request_from(&child, Signal::new())).await;
    while host.model.requests().len() < 4 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    child_run.dispose().await.unwrap();
    assert!(host.get(running.id()).is_none(), "drained with its owner");
    assert_eq!(running.result().await.unwrap().stop_reason, StopReason::Aborted);
    running.dispose().await.unwrap();
    assert!(host.observer.violations().is_empty());
    host.finish().await;
}

/// Appends a compaction to `agent`'s log: one `user/message` whose `surfaceOp: replace` rewrites
/// every current surface node into `summary`.
fn compact(agent: &AgentRef, summary: &str) {
    let events = events_of(agent);
    let surface: Vec<u64> = events
        .iter()
        .filter(|e| e.data.is_surface())
        .map(|e| e.seq)
        .collect();
    // The current nodes: a node replaced earlier is gone, its replacement stands for it.
    let current = agent::history::derive_messages(&events);
    assert!(!current.is_empty(), "something to compact");
    let replaced_from = events
        .iter()
        .rev()
        .find_map(|e| match e.surface.as_ref().and_then(|s| s.surface_op.as_ref()) {
            Some(agent::SurfaceOp::Replace { .. }) => Some(e.seq),
            _ => None,
        })
        .unwrap_or(surface[0]);
    agent
        .session()
        .append(
            EventData::UserMessage(Message::user_text(summary)),
            Some(agent::SurfaceMeta {
                surface_op: Some(agent::SurfaceOp::Replace {
                    start: replaced_from,
                    end: *surface.last().unwrap(),
                }),
                source_event_seqs: None,
            }),
        )
        .expect("compaction appended");
}

/// spec: §5.1, §5.2 (spine §4.2 item 3, §4.8) — a parent whose log holds compaction-style
/// surface replacements: the one inside the balanced prefix (between two completed turns) is
/// seeded verbatim, so the child's first model request sees the parent's compacted history
/// (its summary, not the replaced messages); the one after the last `turn/end` is excluded.
/// The child's log replays clean and its result holds only its own answer.
#[tokio::test(start_paused = true)]
async fn a_compacted_parent_history_is_seeded_as_compacted() {
    let host = Host::new(vec![
        chunks::text("first answer").into(),
        chunks::text("second answer").into(),
        chunks::text("child answer").into(),
    ])
    .await;
    let _p = fork(&host);
    host.parent_turn("first").await;
    compact(&host.parent, "summary of the first turn");
    host.parent_turn("second").await;
    let prefix_len = events_of(&host.parent).len();
    compact(&host.parent, "summary of both turns");
    let parent_log = events_of(&host.parent);
    let run = start(&host, host.request()).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(text(&result.output), "child answer");
    let child = run.local_agent().unwrap();
    let events = events_of(&child);
    assert_eq!(child.session().header().seed_length, Some(prefix_len as u64));
    assert_eq!(events[..prefix_len], parent_log[..prefix_len]);
    // The child's first request continues the compacted history of the seed.
    let seeded: Vec<String> = agent::history::derive_messages(&parent_log[..prefix_len])
        .iter()
        .map(|m| m.text())
        .collect();
    assert_eq!(seeded[0], "summary of the first turn");
    assert!(!seeded.iter().any(|t| t == "first" || t == "first answer"));
    assert!(!seeded.iter().any(|t| t == "summary of both turns"));
    let request = host
        .model
        .requests()
        .last()
        .cloned()
        .expect("the child's request");
    let sent: Vec<String> = request.messages.iter().map(|m| m.text()).collect();
    assert_eq!(sent[..seeded.len()], seeded[..], "{sent:?}");
    run.dispose().await.unwrap();
    assert!(
        host.observer.violations().is_empty(),
        "{:?}",
        host.observer.violations()
    );
    host.finish().await;
}
