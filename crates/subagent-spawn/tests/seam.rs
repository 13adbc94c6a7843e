//! Seam behaviours the in-process providers depend on (spec `inprocess-providers.md` §7.7,
//! checklist SEAM-99…SEAM-116, SEAM-121, SEAM-122), exercised with the real `spawn` provider on
//! the reference runtime and a scripted model. Output-fold shapes that a live loop cannot
//! produce (text streamed with no message at all) are checked on the seam's fold directly.

#[path = "../../subagent-inprocess/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent::model::BlockType;
use agent::{AgentRef, ContentBlock, EventData, Message, SessionEvent, Signal, StreamChunk, SurfaceMeta};
use agent_loop::model::chunks;
use async_trait::async_trait;
use common::*;
use parking_lot::Mutex;
use serde_json::json;
use subagent::capabilities::{NO_START_CAPABILITIES, SubagentCapabilities};
use subagent::error::SubagentErrorCode;
use subagent::events::SubagentEvent;
use subagent::provider::{ResolvedSubagentStartRequest, SubagentProvider};
use subagent::run::SubagentRun;
use subagent::service::{RegisterError, StartError};
use subagent::{AssistantOutputFold, StopReason, SubagentDescriptor, SubagentError, final_assistant_output};
use subagent_inprocess::{InProcessDriver, InProcessRunOptions};
use subagent_spawn::SpawnProvider;

/// A provider over the shared driver that counts its calls and keeps the resolved requests.
struct Recording {
    name: String,
    caps: SubagentCapabilities,
    driver: InProcessDriver,
    calls: AtomicUsize,
    seen: Mutex<Vec<ResolvedSubagentStartRequest>>,
}

impl Recording {
    fn new(name: &str, caps: SubagentCapabilities, driver: InProcessDriver) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            caps,
            driver,
            calls: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
        })
    }
}

#[async_trait]
impl SubagentProvider for Recording {
    fn name(&self) -> &str {
        &self.name
    }
    fn capabilities(&self) -> SubagentCapabilities {
        self.caps
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    async fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> Result<Box<dyn SubagentRun>, SubagentError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().push(request.clone());
        Ok(Box::new(
            self.driver.start(request, InProcessRunOptions::fresh()).await?,
        ))
    }
}

/// `(event name, run id)` pairs a recording listener heard.
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Records `(event name, run id)` of the lifecycle events a listener hears.
fn record(host: &Host, scoped_to: Option<&AgentRef>) -> (Seen, agent::Registration) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let listener = move |e: &SubagentEvent| {
        let run = match e {
            SubagentEvent::Start(i) => i.run_id.clone(),
            SubagentEvent::End(e) => e.info.run_id.clone(),
            _ => String::new(),
        };
        s.lock().push((e.name().to_owned(), run));
        Ok(())
    };
    let guard = match scoped_to {
        Some(parent) => host.service.events().on_scoped(parent.id().clone(), listener),
        None => host.service.events().on(listener),
    };
    (seen, guard)
}

/// spec: SEAM-99 — providers register, list, resolve, start and unregister, with added/removed
/// events.
#[tokio::test(start_paused = true)]
async fn seam_99_register_list_resolve_start_unregister() {
    let host = Host::new(vec![chunks::text("answer").into()]).await;
    let (seen, listener) = record(&host, None);
    let guard = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    assert_eq!(host.service.list(), ["spawn"]);
    assert_eq!(host.service.get_provider("spawn").unwrap().name(), "spawn");
    let run = host.service.start("spawn", host.request()).await.unwrap();
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    host.service.close().await;
    drop(guard);
    assert!(host.service.list().is_empty());
    let names: Vec<String> = seen.lock().iter().map(|e| e.0.clone()).collect();
    assert_eq!(
        names,
        [
            "subagent/provider-added",
            "subagent/start",
            "subagent/end",
            "subagent/provider-removed"
        ]
    );
    drop(listener);
    host.finish().await;
}

/// spec: SEAM-100 — a failing `provider-added` listener rolls the registration back.
#[tokio::test(start_paused = true)]
async fn seam_100_failing_added_listener_rolls_back() {
    let host = Host::new(vec![]).await;
    let listener = host.service.events().on(|e| match e {
        SubagentEvent::ProviderAdded(_) => Err("refused".into()),
        _ => Ok(()),
    });
    let err = subagent_spawn::register(&host.service, host.driver.clone()).unwrap_err();
    assert!(matches!(err, RegisterError::Listener(_)));
    assert!(host.service.list().is_empty());
    drop(listener);
    host.finish().await;
}

/// spec: SEAM-101 — duplicate and missing providers fail with `DUPLICATE_PROVIDER` /
/// `NO_PROVIDER`.
#[tokio::test(start_paused = true)]
async fn seam_101_duplicate_and_missing() {
    let host = Host::new(vec![]).await;
    let guard = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    match subagent_spawn::register(&host.service, host.driver.clone()) {
        Err(RegisterError::Subagent(e)) => assert_eq!(e.code(), SubagentErrorCode::DuplicateProvider),
        other => panic!("expected DUPLICATE_PROVIDER, got {:?}", other.map(|_| ())),
    }
    match host.service.start("missing", host.request()).await {
        Err(StartError::Subagent(e)) => assert_eq!(e.code(), SubagentErrorCode::NoProvider),
        Err(other) => panic!("expected NO_PROVIDER, got {other}"),
        Ok(_) => panic!("expected NO_PROVIDER"),
    }
    assert_eq!(host.agent_count(), 1);
    drop(guard);
    host.finish().await;
}

/// spec: SEAM-102 — the resolved request carries the one-shot descriptor and is a new value (the
/// caller's request is not reused); a run has no resume surface.
#[tokio::test(start_paused = true)]
async fn seam_102_resolved_request_carries_the_descriptor() {
    let host = Host::new(vec![chunks::text("answer").into()]).await;
    let provider = Recording::new("spawn", SubagentCapabilities::ALL, host.driver.clone());
    let _g = host.service.register_provider(provider.clone()).unwrap();
    let request = host.request();
    let kept = request.clone();
    let run = host.service.start("spawn", request).await.unwrap();
    let resolved = provider.seen.lock()[0].clone();
    assert_eq!(
        resolved.descriptor,
        SubagentDescriptor::one_shot("spawn", Some("child task".into()))
    );
    assert_eq!(
        resolved.descriptor_event,
        EventData::other(
            "subagent/descriptor",
            json!({"version": 2, "mode": "one-shot", "provider": "spawn", "label": "child task"})
        )
    );
    assert_eq!(resolved.request.prompt, kept.prompt);
    assert!(Arc::ptr_eq(&resolved.request.parent, &kept.parent));
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SEAM-103 — each unsupported capability is rejected before the provider is called.
#[tokio::test(start_paused = true)]
async fn seam_103_unsupported_capabilities_reject_first() {
    let host = Host::new(vec![]).await;
    let provider = Recording::new("bare", NO_START_CAPABILITIES, host.driver.clone());
    let _g = host.service.register_provider(provider.clone()).unwrap();
    let mut requests = Vec::new();
    let mut r = host.request();
    r.output_schema = Some(json!({"type": "object"}));
    requests.push((r, "outputSchema"));
    let mut r = host.request();
    r.max_depth = Some(json!(3));
    requests.push((r, "depthLimit"));
    let mut r = host.request();
    r.tool_filter = Some(agent::tools::ToolRestriction {
        allow: Some(vec![]),
        deny: None,
    });
    requests.push((r, "toolFilter"));
    let mut r = host.request();
    r.persona = Some(String::new());
    requests.push((r, "persona"));
    for (request, capability) in requests {
        match host.service.start("bare", request).await {
            Err(StartError::Subagent(e)) => {
                assert_eq!(e.code(), SubagentErrorCode::UnsupportedCapability);
                assert!(e.to_string().contains(capability), "{e}");
            }
            Err(other) => panic!("unexpected {other}"),
            Ok(_) => panic!("must reject"),
        }
    }
    assert_eq!(provider.calls.load(Ordering::SeqCst), 0);
    assert_eq!(host.agent_count(), 1);
    host.finish().await;
}

/// spec: SEAM-104 — invalid `maxDepth` and invalid schemas are rejected before the provider is
/// called.
#[tokio::test(start_paused = true)]
async fn seam_104_invalid_values_reject_first() {
    let host = Host::new(vec![]).await;
    let provider = Recording::new("spawn", SubagentCapabilities::ALL, host.driver.clone());
    let _g = host.service.register_provider(provider.clone()).unwrap();
    let mut r = host.request();
    r.max_depth = Some(json!(-1));
    let Err(e) = host.service.start("spawn", r).await else {
        panic!("must reject")
    };
    assert_eq!(
        e.to_string(),
        "subagent maxDepth must be a non-negative safe integer"
    );
    let mut r = host.request();
    r.output_schema = Some(json!({"type": "string"}));
    let Err(e) = host.service.start("spawn", r).await else {
        panic!("must reject")
    };
    assert!(e.to_string().starts_with("unsupported JSON schema"));
    assert_eq!(provider.calls.load(Ordering::SeqCst), 0);
    host.finish().await;
}

/// spec: SEAM-105 — lifecycle is published only after provider fulfilment, start before end,
/// keyed to the parent, sharing one run id.
#[tokio::test(start_paused = true)]
async fn seam_105_lifecycle_after_fulfilment_keyed_to_the_parent() {
    let mut host = Host::new(vec![chunks::text("answer").into()]).await;
    let _g = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let other = host.agent("other", agent::SessionMeta::default(), routed()).await;
    let (mine, l1) = record(&host, Some(&host.parent.clone()));
    let (theirs, l2) = record(&host, Some(&other));
    let registered_at_start = Arc::new(Mutex::new(None));
    let r = registered_at_start.clone();
    let agents = host.runtime.services().agents.clone();
    let l3 = host.service.events().on(move |e| {
        if let SubagentEvent::Start(i) = e {
            *r.lock() = Some(agents.get(&i.id).is_some());
        }
        Ok(())
    });
    let run = host.service.start("spawn", host.request()).await.unwrap();
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    host.service.close().await;
    assert_eq!(*registered_at_start.lock(), Some(true));
    let mine = mine.lock().clone();
    assert_eq!(mine.len(), 2);
    assert_eq!(
        (mine[0].0.as_str(), mine[1].0.as_str()),
        ("subagent/start", "subagent/end")
    );
    assert_eq!(mine[0].1, mine[1].1);
    assert!(theirs.lock().is_empty());
    drop((l1, l2, l3));
    host.finish().await;
}

/// spec: SEAM-106 — repeated provider and parent still get distinct run ids.
#[tokio::test(start_paused = true)]
async fn seam_106_distinct_run_ids() {
    let host = Host::new(vec![chunks::text("a").into(), chunks::text("b").into()]).await;
    let _g = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let (seen, listener) = record(&host, None);
    for _ in 0..2 {
        let run = host.service.start("spawn", host.request()).await.unwrap();
        run.result().await.unwrap();
        run.dispose().await.unwrap();
    }
    host.service.close().await;
    let starts: Vec<String> = seen
        .lock()
        .iter()
        .filter(|e| e.0 == "subagent/start")
        .map(|e| e.1.clone())
        .collect();
    assert_eq!(starts.len(), 2);
    assert_ne!(starts[0], starts[1]);
    drop(listener);
    host.finish().await;
}

/// spec: SEAM-107 — a provider rejection emits no lifecycle events.
#[tokio::test(start_paused = true)]
async fn seam_107_rejection_emits_nothing() {
    let host = Host::new(vec![]).await;
    let _g = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let (seen, listener) = record(&host, None);
    let mut r = host.request();
    r.max_depth = Some(json!(0));
    assert!(host.service.start("spawn", r).await.is_err());
    host.service.close().await;
    assert!(seen.lock().is_empty());
    drop(listener);
    host.finish().await;
}

/// spec: SEAM-108 — the end event carries the last output (omitted when empty) and maps a
/// rejected result to `error`.
#[tokio::test(start_paused = true)]
async fn seam_108_end_carries_output_and_maps_rejection() {
    let host = Host::new(vec![chunks::text("answer").into()]).await;
    let _g = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let failing = wrapped_driver(&host, |handle| {
        HookedAgent::new(handle.agent())
            .on_send(|| Err(agent::AgentError::Other("delivery failed".into())))
            .handle(handle)
    });
    let _f = host
        .service
        .register_provider(Arc::new(SpawnProvider::named("failing", failing.clone())))
        .unwrap();
    let ends = Arc::new(Mutex::new(Vec::new()));
    let e2 = ends.clone();
    let listener = host.service.events().on(move |e| {
        if let SubagentEvent::End(end) = e {
            e2.lock().push((
                end.info.provider.clone(),
                end.stop_reason.clone(),
                end.last_assistant_message.clone(),
            ));
        }
        Ok(())
    });
    for provider in ["spawn", "spawn", "failing"] {
        let run = host.service.start(provider, host.request()).await.unwrap();
        let _ = run.result().await;
        run.dispose().await.unwrap();
        host.service.close().await;
    }
    let ends = ends.lock().clone();
    assert_eq!(
        ends[0],
        (
            "spawn".into(),
            StopReason::Completed,
            Some(vec![ContentBlock::text("answer")])
        )
    );
    // The second child exhausts the script: an error with no output, the key omitted.
    assert_eq!(ends[1], ("spawn".into(), StopReason::Error, None));
    assert_eq!(ends[2], ("failing".into(), StopReason::Error, None));
    failing.wait().await;
    drop(listener);
    host.finish().await;
}

/// spec: SEAM-109 — lifecycle listener failures (an error, an un-printable panic, a failing
/// asynchronous continuation) are contained and logged; later listeners still run and the run is
/// unchanged.
#[tokio::test(start_paused = true)]
async fn seam_109_listener_failures_are_contained() {
    let host = Host::new(vec![chunks::text("answer").into()]).await;
    let _g = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let failing = host.service.events().on(|_| Err("listener failed".into()));
    let unprintable = host.service.events().on(|e| {
        if matches!(e, SubagentEvent::Start(_)) {
            std::panic::panic_any(42_u8);
        }
        Ok(())
    });
    let tasks = Arc::new(TaskSet::default());
    let t2 = tasks.clone();
    let asynchronous = host.service.events().on(move |_| {
        t2.spawn(async { Err::<(), _>("async listener failed") });
        Ok(())
    });
    let (seen, last) = record(&host, None);
    let run = host.service.start("spawn", host.request()).await.unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    run.dispose().await.unwrap();
    host.service.close().await;
    tasks.wait().await;
    let names: Vec<String> = seen.lock().iter().map(|e| e.0.clone()).collect();
    assert_eq!(names, ["subagent/start", "subagent/end"]);
    drop((failing, unprintable, asynchronous, last));
    host.finish().await;
}

/// A tiny task set (the spawned continuations of SEAM-109).
#[derive(Default)]
struct TaskSet(Mutex<Vec<tokio::task::JoinHandle<Result<(), &'static str>>>>);

impl TaskSet {
    fn spawn(&self, f: impl std::future::Future<Output = Result<(), &'static str>> + Send + 'static) {
        self.0.lock().push(tokio::spawn(f));
    }
    async fn wait(&self) {
        let handles: Vec<_> = std::mem::take(&mut *self.0.lock());
        for h in handles {
            let outcome = h.await.expect("joined");
            assert_eq!(outcome, Err("async listener failed"));
        }
    }
}

/// spec: SEAM-110 — the last non-empty message wins over a later empty one (a tool-only
/// `max-tokens` step records an empty usage message).
#[tokio::test(start_paused = true)]
async fn seam_110_last_non_empty_message_wins() {
    let host = Host::new(vec![
        chunks::text_and_tool_call("kept", "t1", "noop", json!({})).into(),
        chunks::max_tokens_tool_call("t2", "noop", "{}").into(),
    ])
    .await;
    let _g = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let tool = global_tool(&host, counting_tool("noop", Arc::new(AtomicUsize::new(0))));
    let run = host.service.start("spawn", host.request()).await.unwrap();
    let result = run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    let last_message = child
        .session()
        .events()
        .iter()
        .rev()
        .find_map(|e| match &e.data {
            EventData::AssistantMessage { message, .. } => Some(message.content.clone()),
            _ => None,
        })
        .unwrap();
    assert!(last_message.iter().all(|b| b.as_text().is_none()));
    assert_eq!(text(&result.output), "kept");
    run.dispose().await.unwrap();
    drop(tool);
    host.finish().await;
}

fn ev(data: EventData) -> SessionEvent {
    let surface = data.is_surface().then(SurfaceMeta::append);
    SessionEvent {
        seq: 0,
        time: 0,
        data,
        surface,
        ignorable: false,
    }
}

fn delta(text: &str) -> SessionEvent {
    ev(EventData::AssistantChunk {
        turn: 1,
        step: 1,
        chunk: StreamChunk::TextDelta {
            index: 0,
            text: text.into(),
        },
    })
}

fn message(content: Vec<ContentBlock>) -> SessionEvent {
    ev(EventData::AssistantMessage {
        turn: 1,
        step: 1,
        message: Message::assistant(content, MODEL, MODEL),
        usage: None,
        interrupted: false,
    })
}

/// spec: SEAM-111 — a non-empty message wins over text streamed before and after it (a shape a
/// live loop does not write — streamed text after the last message with no message of its own —
/// so the seam's fold is checked on a constructed suffix).
#[test]
fn seam_111_message_wins_over_streamed_text() {
    let own = [
        delta("before "),
        message(vec![ContentBlock::text("the answer")]),
        delta("after"),
    ];
    assert_eq!(
        final_assistant_output(&own),
        Some(vec![ContentBlock::text("the answer")])
    );
}

/// spec: SEAM-112 — reasoning-only content counts as a non-empty message (a live child whose only
/// block is reasoning).
#[tokio::test(start_paused = true)]
async fn seam_112_reasoning_only_counts() {
    let reasoning_only = vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Reasoning,
        },
        StreamChunk::ReasoningDelta {
            index: 0,
            text: "thinking".into(),
        },
        StreamChunk::BlockEnd {
            index: 0,
            block: ContentBlock::reasoning("thinking"),
        },
        StreamChunk::Usage {
            usage: chunks::SCRIPTED_USAGE,
        },
        chunks::finish_chunk(agent::FinishReason::Stop),
    ];
    let host = Host::new(vec![reasoning_only.into()]).await;
    let _g = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let run = host.service.start("spawn", host.request()).await.unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.output, vec![ContentBlock::reasoning("thinking")]);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SEAM-113 — the fallback joins text deltas only: no reasoning deltas, no tool-result
/// text (constructed suffix: no message at all).
#[test]
fn seam_113_fallback_joins_text_deltas_only() {
    let own = [
        delta("one "),
        ev(EventData::AssistantChunk {
            turn: 1,
            step: 1,
            chunk: StreamChunk::ReasoningDelta {
                index: 1,
                text: "hidden".into(),
            },
        }),
        ev(EventData::ToolResult {
            turn: 1,
            step: 1,
            message: Message::tool_result("c1".into(), vec![ContentBlock::text("tool text")], false),
            error: None,
            meta: None,
        }),
        delta("two"),
    ];
    assert_eq!(
        final_assistant_output(&own),
        Some(vec![ContentBlock::text("one two")])
    );
}

/// spec: SEAM-114 — no message and no text yields none (a live child whose model call fails
/// before any output: `[]`).
#[tokio::test(start_paused = true)]
async fn seam_114_nothing_yields_none() {
    let host = Host::new(vec![]).await;
    let _g = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    let run = host.service.start("spawn", host.request()).await.unwrap();
    let result = run.result().await.unwrap();
    assert!(result.output.is_empty());
    let child = run.local_agent().unwrap();
    assert_eq!(final_assistant_output(child.session().events().iter()), None);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SEAM-115 — raw text pieces fold into the same fallback; empty pieces are ignored.
#[test]
fn seam_115_raw_text_pieces() {
    let mut fold = AssistantOutputFold::new();
    fold.push_text("a");
    fold.push_text("");
    fold.push_text("b");
    assert_eq!(fold.collect(), Some(vec![ContentBlock::text("ab")]));
    fold.push_event(&message(vec![ContentBlock::text("message")]));
    assert_eq!(fold.collect(), Some(vec![ContentBlock::text("message")]));
}

/// spec: SEAM-116 — an empty fold collects none.
#[test]
fn seam_116_empty_fold() {
    let mut fold = AssistantOutputFold::new();
    assert_eq!(fold.collect(), None);
    fold.push_text("");
    assert_eq!(fold.collect(), None);
}

/// spec: SEAM-121 — (the reference's llm-replay test kit is not part of this workspace) Rust
/// equivalent: a fork-seeded child's model-call record is derivable from its own events only —
/// the `assistant/chunk` events at or after its header's `seedLength` are exactly its own call's
/// chunks, and the seeded parent chunks all lie before the boundary.
#[tokio::test(start_paused = true)]
async fn seam_121_child_script_comes_from_its_own_suffix() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        chunks::text("child answer").into(),
    ])
    .await;
    host.parent_turn("parent question").await;
    let seed = events_of(&host.parent);
    let run = host
        .driver
        .start(
            resolve(host.request(), "fork"),
            InProcessRunOptions::seeded(seed.clone()),
        )
        .await
        .unwrap();
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    let boundary = child.session().header().seed_length.unwrap() as usize;
    let own_chunks: Vec<StreamChunk> = events_of(&child)[boundary..]
        .iter()
        .filter_map(|e| match &e.data {
            EventData::AssistantChunk { chunk, .. } => Some(chunk.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(own_chunks, chunks::text("child answer"));
    let seeded_chunks = events_of(&child)[..boundary]
        .iter()
        .filter(|e| e.type_name() == "assistant/chunk")
        .count();
    assert_eq!(seeded_chunks, chunks::text("parent answer").len());
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SEAM-122 — (no replay adapter here) Rust equivalent: with sequential delegation the
/// scripted model binds calls in first-call order, parent first: the parent's call consumes the
/// first entry and the child's the second.
#[tokio::test(start_paused = true)]
async fn seam_122_first_call_order_parent_first() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        chunks::text("child answer").into(),
    ])
    .await;
    let _g = subagent_spawn::register(&host.service, host.driver.clone()).unwrap();
    host.parent_turn("parent question").await;
    let run = host.service.start("spawn", host.request()).await.unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(text(&result.output), "child answer");
    let requests = host.model.requests();
    assert_eq!(requests[0].session_id.as_ref(), Some(host.parent.id()));
    assert_eq!(requests[1].session_id.as_ref(), Some(run.id()));
    run.dispose().await.unwrap();
    let _ = Signal::new();
    host.finish().await;
}
