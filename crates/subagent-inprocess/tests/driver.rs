//! The shared driver's run flow, result derivation, cancellation windows, rollback and disposal
//! (spec `inprocess-providers.md` §3, checklist DRV-1…DRV-18), on the reference runtime with a
//! scripted model.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::hooks::{PreStep, PreStepDecision, PreStepInterceptor};
use agent::{
    AgentError, AgentHandle, AgentOptions, CancelCause, ContentBlock, Disposer, EventData, SessionId,
    SessionMeta, Signal, TurnEndReason,
};
use agent_loop::model::{ScriptEntry, chunks};
use async_trait::async_trait;
use common::*;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::json;
use subagent::depth::MAX_SAFE_INTEGER;
use subagent::error::SubagentErrorCode;
use subagent::run::SubagentRun;
use subagent::{DepthError, DepthValue, StopReason, SubagentDepthError, SubagentResult};
use subagent_inprocess::{InProcessRunOptions, StartFailure};

fn start_failure(e: &subagent::SubagentError) -> &StartFailure {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<StartFailure>())
        .expect("the typed start failure is the source")
}

/// spec: DRV-1 — start fulfils only after the child is registered; a fresh child completes with
/// its text; its options carry depth 1; double dispose is safe and removes the child.
#[tokio::test(start_paused = true)]
async fn drv_1_start_publishes_drives_and_disposes() {
    let host = Host::new(vec![chunks::text("driver answer").into()]).await;
    let run = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .expect("started");
    let child = host.get(run.id()).expect("registered at fulfilment");
    assert!(Arc::ptr_eq(&child, &run.local_agent().expect("local")));
    let result = run.result().await.expect("result");
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(text(&result.output), "driver answer");
    assert_eq!(child.options().subagent_depth, Some(1));
    run.dispose().await.expect("disposed");
    run.dispose().await.expect("disposed twice");
    assert!(host.get(run.id()).is_none());
    assert!(!child.is_live());
    host.finish().await;
}

/// spec: DRV-2 — explicit child model selectors work for a route-less parent; the child inherits
/// the parent `cwd`.
#[tokio::test(start_paused = true)]
async fn drv_2_explicit_route_for_routeless_parent_and_cwd() {
    let host = Host::with_parent(
        vec![chunks::text("driver answer").into()],
        AgentOptions::default(),
    )
    .await;
    let mut request = host.request();
    request.agent_options = Some(routed());
    let run = host
        .driver
        .start(resolve(request, "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    let child = run.local_agent().unwrap();
    assert_eq!(child.options().provider.as_deref(), Some(MODEL));
    assert_eq!(child.options().model.as_deref(), Some(MODEL));
    assert_eq!(
        child.session().header().cwd.as_deref(),
        Some(std::path::Path::new(CWD))
    );
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// Rejects every step of every agent but one.
struct RejectAllBut(SessionId);

#[async_trait]
impl PreStepInterceptor for RejectAllBut {
    async fn pre_step(
        &self,
        step: PreStep<'_>,
        proposed: PreStepDecision,
    ) -> Result<PreStepDecision, agent::bus::BoxError> {
        Ok(if step.agent.id() == &self.0 {
            proposed
        } else {
            PreStepDecision::Reject
        })
    }
}

/// spec: DRV-3 — a prompt discarded by a pre-step rejection reports `refusal` (the turn ends
/// `blocked`, no descriptor is written because no step was entered).
#[tokio::test(start_paused = true)]
async fn drv_3_pre_step_rejection_is_refusal() {
    let host = Host::new(vec![]).await;
    let guard = host
        .runtime
        .services()
        .pre_step
        .add(None, Arc::new(RejectAllBut(host.parent.id().clone())));
    let run = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Refusal);
    let child = run.local_agent().unwrap();
    assert_eq!(last_turn_end(&child), Some(TurnEndReason::Blocked));
    assert!(!types(&events_of(&child)).contains(&"subagent/descriptor".to_owned()));
    assert!(host.model.requests().is_empty());
    run.dispose().await.unwrap();
    drop(guard);
    host.finish().await;
}

/// A session store that counts flushes and otherwise delegates.
struct CountingStore {
    inner: Arc<dyn agent::SessionStore>,
    flushes: Arc<AtomicUsize>,
}

#[async_trait]
impl agent::SessionStore for CountingStore {
    fn prepare(
        &self,
        id: SessionId,
        seed: Option<Vec<agent::SessionEvent>>,
        meta: SessionMeta,
    ) -> Result<Arc<agent::Session>, AgentError> {
        self.inner.prepare(id, seed, meta)
    }
    fn enter(&self, session: Arc<agent::Session>) -> Result<agent::Registration, AgentError> {
        self.inner.enter(session)
    }
    fn get(&self, id: &SessionId) -> Option<Arc<agent::Session>> {
        self.inner.get(id)
    }
    fn list(&self) -> Vec<Arc<agent::Session>> {
        self.inner.list()
    }
    async fn flush(&self, id: &SessionId) -> Result<bool, AgentError> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.inner.flush(id).await
    }
}

/// spec: DRV-4 — a foreground run performs no final `session/flush` (the driver never flushes
/// the child's session through the host's store).
#[tokio::test(start_paused = true)]
async fn drv_4_no_final_flush() {
    let host = Host::new(vec![chunks::text("driver answer").into()]).await;
    let flushes = Arc::new(AtomicUsize::new(0));
    let mut services = host.runtime.services().clone();
    services.sessions = Arc::new(CountingStore {
        inner: services.sessions.clone(),
        flushes: flushes.clone(),
    });
    let driver = subagent_inprocess::InProcessDriver::new(services);
    let run = driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
    run.dispose().await.unwrap();
    driver.wait().await;
    assert_eq!(flushes.load(Ordering::SeqCst), 0);
    host.finish().await;
}

/// Disposes the real handle, then fails.
struct FailingDisposer(AgentHandle);

impl Disposer for FailingDisposer {
    fn dispose(&self) -> BoxFuture<'static, ()> {
        let inner = self.0.dispose();
        async move {
            inner.await;
            panic!("published handle disposal failed");
        }
        .boxed()
    }
}

/// spec: DRV-5 — a run failure rejects `result` and a handle-disposal failure rejects
/// `dispose()`, on separate channels; the registries end clean. (Rust: the spine's handle
/// disposal is infallible, so its failure is a panicking teardown, reported as
/// `HandleDisposalFailed`.)
#[tokio::test(start_paused = true)]
async fn drv_5_result_and_dispose_fail_on_separate_channels() {
    let host = Host::new(vec![]).await;
    let (agents, sessions) = (host.agent_count(), host.session_count());
    let driver = wrapped_driver(&host, |handle| {
        let agent = HookedAgent::new(handle.agent())
            .on_send(|| Err(AgentError::Other("published run failed".into())));
        AgentHandle::new(Arc::new(agent), Arc::new(FailingDisposer(handle)))
    });
    let run = driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    assert!(host.get(run.id()).is_some());
    let run_error = run.result().await.unwrap_err();
    assert_eq!(run_error.to_string(), "published run failed");
    let dispose_error = run.dispose().await.unwrap_err();
    assert!(
        dispose_error
            .to_string()
            .contains("published handle disposal failed"),
        "{dispose_error}"
    );
    // The result failure is not re-raised by dispose, and vice versa.
    assert_eq!(
        run.result().await.unwrap_err().to_string(),
        "published run failed"
    );
    driver.wait().await;
    assert_eq!((host.agent_count(), host.session_count()), (agents, sessions));
    host.finish().await;
}

/// spec: DRV-6 — the stop reason reflects the recorded `max-tokens` turn end; nothing is
/// appended after it (no flush-time metadata).
#[tokio::test(start_paused = true)]
async fn drv_6_max_tokens_turn_end() {
    let host = Host::new(vec![chunks::max_tokens_text("partial answer").into()]).await;
    let run = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::MaxTokens);
    assert_eq!(text(&result.output), "partial answer");
    let child = run.local_agent().unwrap();
    let events = events_of(&child);
    assert!(matches!(
        &events.last().unwrap().data,
        EventData::TurnEnd {
            reason: TurnEndReason::MaxTokens,
            ..
        }
    ));
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: DRV-7 — a final empty usage-only assistant message (a tool-only `max-tokens` step) does
/// not hide earlier streamed text; stop reason `max-tokens`.
#[tokio::test(start_paused = true)]
async fn drv_7_empty_usage_message_keeps_earlier_text() {
    let host = Host::new(vec![
        chunks::text_and_tool_call("partial one", "t1", "noop", json!({})).into(),
        chunks::max_tokens_tool_call("t2", "noop", "{}").into(),
    ])
    .await;
    let calls = Arc::new(AtomicUsize::new(0));
    let tool = global_tool(&host, counting_tool("noop", calls.clone()));
    let run = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::MaxTokens);
    assert_eq!(text(&result.output), "partial one");
    // The truncated second call was not dispatched.
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    run.dispose().await.unwrap();
    drop(tool);
    host.finish().await;
}

/// spec: DRV-8 — a fork seed is copied verbatim, `seedLength` recorded, and only child-owned
/// output is returned.
#[tokio::test(start_paused = true)]
async fn drv_8_seed_is_verbatim_and_output_is_child_owned() {
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
            resolve(host.request(), "test"),
            InProcessRunOptions::seeded(seed.clone()),
        )
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(text(&result.output), "child answer");
    let child = run.local_agent().unwrap();
    assert_eq!(child.session().header().seed_length, Some(seed.len() as u64));
    assert_eq!(events_of(&child)[..seed.len()], seed[..]);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: DRV-8 (§5.1) — an empty seed is no seed: a child started with
/// `InProcessRunOptions::seeded(vec![])` is created unseeded, like a fresh one — no
/// `session/end-seed` marker, no `seedLength` in its header. (Before, the driver passed the
/// empty seed on and the child's log opened with an end-seed marker at 0 while its header said
/// it was unseeded.)
#[tokio::test(start_paused = true)]
async fn an_empty_seed_creates_an_unseeded_child() {
    let host = Host::new(vec![chunks::text("child answer").into()]).await;
    let run = host
        .driver
        .start(
            resolve(host.request(), "test"),
            InProcessRunOptions::seeded(Vec::new()),
        )
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(text(&result.output), "child answer");
    let child = run.local_agent().unwrap();
    assert_eq!(child.session().header().seed_length, None);
    let events = events_of(&child);
    assert!(
        events.iter().all(|e| e.type_name() != "session/end-seed"),
        "no end-seed marker: {:?}",
        events.iter().map(|e| e.type_name()).collect::<Vec<_>>()
    );
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: DRV-8 (spine §4.7 item 5, §4.8) — a seed the child's first turn could not continue is
/// refused at start with a typed `PROVIDER_FAILED` error (source
/// [`StartFailure::UnbalancedSeed`]) before anything exists: a turn closed while its step is
/// open, a seed ending inside an open turn or step, a `tool/call` outside its step. No agent,
/// no session, no model request; a balanced seed still starts. (Before, such a child was
/// published and its first append broke the session invariants — with an enforcing observer
/// the run then failed after publication with a vetoed append.)
#[tokio::test(start_paused = true)]
async fn unbalanced_seed_is_refused_before_publication() {
    fn ev(seq: u64, data: EventData) -> agent::SessionEvent {
        agent::SessionEvent {
            seq,
            time: 0,
            data,
            surface: None,
            ignorable: false,
        }
    }
    let turn_start = |turn| EventData::TurnStart { turn };
    let step_start = |turn, step| EventData::StepStart { turn, step };
    let turn_end = |turn| EventData::TurnEnd {
        turn,
        reason: TurnEndReason::Completed,
    };
    let call = EventData::ToolCall {
        turn: 1,
        step: 1,
        call_id: "c1".into(),
        name: "echo".into(),
        arguments: "{}".into(),
    };
    let seeds: Vec<Vec<EventData>> = vec![
        // turn/end over an open step
        vec![turn_start(1), step_start(1, 1), turn_end(1)],
        // ends inside an open turn
        vec![turn_start(1)],
        // ends inside an open step
        vec![turn_start(1), step_start(1, 1)],
        // a tool/call outside its step
        vec![turn_start(1), call.clone(), turn_end(1)],
    ];
    let host = Host::new(vec![chunks::text("balanced answer").into()]).await;
    let (agents, sessions) = (host.agent_count(), host.session_count());
    for seed in seeds {
        let seed: Vec<_> = seed
            .into_iter()
            .enumerate()
            .map(|(i, d)| ev(i as u64, d))
            .collect();
        let err = host
            .driver
            .start(
                resolve(host.request(), "fork"),
                InProcessRunOptions::seeded(seed.clone()),
            )
            .await
            .expect_err("an unbalanced seed is refused");
        assert_eq!(err.code(), SubagentErrorCode::ProviderFailed, "{seed:?}");
        assert!(
            matches!(start_failure(&err), StartFailure::UnbalancedSeed),
            "{seed:?}: {err}"
        );
        assert!(
            err.to_string().starts_with("subagent seed is not balanced"),
            "{err}"
        );
        assert_eq!((host.agent_count(), host.session_count()), (agents, sessions));
        assert!(host.model.requests().is_empty());
    }
    // A balanced seed (one closed turn with a step) is accepted and driven. It is the parent's
    // own completed-turn prefix, as a fork's is, so the captured child log also passes the
    // store rule that a seeded child starts with its parent's first `seedLength` events
    // (FORK-SEED, `cargo xtask check-invariants`).
    let session = host.parent.session();
    for data in [
        turn_start(1),
        step_start(1, 1),
        EventData::StepEnd { turn: 1, step: 1 },
        turn_end(1),
    ] {
        session
            .append(data, None)
            .expect("a closed turn on the idle parent");
    }
    let balanced: Vec<_> = session.events().iter().map(|e| (**e).clone()).collect();
    assert_eq!(balanced.len(), 4);
    let run = host
        .driver
        .start(
            resolve(host.request(), "fork"),
            InProcessRunOptions::seeded(balanced),
        )
        .await
        .expect("a balanced seed starts");
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(text(&result.output), "balanced answer");
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: DRV-9 — the child header persists `origin: subagent` and `delegationDepth: 1`.
#[tokio::test(start_paused = true)]
async fn drv_9_header_origin_and_depth() {
    let host = Host::new(vec![chunks::text("child answer").into()]).await;
    let run = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    run.result().await.unwrap();
    let header = run.local_agent().unwrap().session().header().clone();
    assert_eq!(header.origin, Some(agent::Origin::Subagent));
    assert_eq!(header.delegation_depth, Some(1));
    assert_eq!(header.parent_session.as_ref(), Some(host.parent.id()));
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: DRV-10 — the parent's `maxTokens` is inherited by the child request and an explicit
/// override wins.
#[tokio::test(start_paused = true)]
async fn drv_10_max_tokens_inherited_and_overridden() {
    let host = Host::with_parent(
        vec![
            chunks::text("inherited").into(),
            chunks::text("overridden").into(),
        ],
        AgentOptions {
            max_tokens: Some(111),
            ..routed()
        },
    )
    .await;
    let inherited = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    inherited.result().await.unwrap();
    assert_eq!(host.model.requests()[0].max_tokens, Some(111));
    assert_eq!(inherited.local_agent().unwrap().options().max_tokens, Some(111));
    inherited.dispose().await.unwrap();

    let mut request = host.request();
    request.agent_options = Some(AgentOptions {
        max_tokens: Some(222),
        ..AgentOptions::default()
    });
    let overridden = host
        .driver
        .start(resolve(request, "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    overridden.result().await.unwrap();
    assert_eq!(host.model.requests()[1].max_tokens, Some(222));
    assert_eq!(overridden.local_agent().unwrap().options().max_tokens, Some(222));
    overridden.dispose().await.unwrap();
    host.finish().await;
}

fn exceeded(e: &subagent::SubagentError) -> SubagentDepthError {
    match start_failure(e) {
        StartFailure::Depth(DepthError::Exceeded(d)) => *d,
        other => panic!("expected a depth error, got {other:?}"),
    }
}

/// spec: DRV-11 — a resumed child (header depth 1, no runtime depth) is counted by its header:
/// child depth 2 exceeds `maxDepth` 1.
#[tokio::test(start_paused = true)]
async fn drv_11_header_depth_counts_for_a_resumed_child() {
    let mut host = Host::new(vec![]).await;
    let resumed = host
        .agent(
            "resumed-child",
            SessionMeta {
                parent_session: Some("root".into()),
                delegation_depth: Some(1),
                ..SessionMeta::default()
            },
            routed(),
        )
        .await;
    let before = host.agent_count();
    let mut request = request_from(&resumed, Signal::new());
    request.max_depth = Some(json!(1));
    let err = host
        .driver
        .start(resolve(request, "test"), InProcessRunOptions::fresh())
        .await
        .unwrap_err();
    assert_eq!(
        exceeded(&err),
        SubagentDepthError {
            attempted_depth: 2,
            max_depth: 1
        }
    );
    assert_eq!(err.to_string(), "subagent depth 2 exceeds maxDepth 1");
    assert_eq!(host.agent_count(), before);
    host.finish().await;
}

/// spec: DRV-12 — runtime depth may deepen but never lower the header depth (header 2,
/// runtime 1 → child 3 rejected at max 2).
#[tokio::test(start_paused = true)]
async fn drv_12_runtime_depth_never_lowers_the_header() {
    let mut host = Host::new(vec![]).await;
    let parent = host
        .agent(
            "deep-parent",
            SessionMeta {
                delegation_depth: Some(2),
                ..SessionMeta::default()
            },
            AgentOptions {
                subagent_depth: Some(1),
                ..routed()
            },
        )
        .await;
    let mut request = request_from(&parent, Signal::new());
    request.max_depth = Some(json!(2));
    let err = host
        .driver
        .start(resolve(request, "test"), InProcessRunOptions::fresh())
        .await
        .unwrap_err();
    assert_eq!(
        exceeded(&err),
        SubagentDepthError {
            attempted_depth: 3,
            max_depth: 2
        }
    );
    host.finish().await;
}

/// spec: DRV-13 — invalid `maxDepth`, exceeded depth, malformed runtime depths and safe-range
/// overflow reject before publication. (Rust: the runtime option `subagentDepth` is a typed
/// `u64`, so NaN, 1.5, −1 and −0 cannot be held by an agent; the seam's depth rule is shown to
/// reject them as raw values, and the representable malformed value — above the safe range — is
/// rejected through a parent that carries it.)
#[tokio::test(start_paused = true)]
async fn drv_13_depth_failures_reject_before_publication() {
    let host = Host::new(vec![]).await;
    let before = (host.agent_count(), host.session_count());
    for bad in [
        json!(-1),
        json!(1.5),
        json!(-0.0),
        json!(9007199254740992u64),
        json!("1"),
    ] {
        let mut request = host.request();
        request.max_depth = Some(bad.clone());
        let err = host
            .driver
            .start(resolve(request, "test"), InProcessRunOptions::fresh())
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "subagent maxDepth must be a non-negative safe integer",
            "{bad}"
        );
    }
    let mut request = host.request();
    request.max_depth = Some(json!(0));
    let err = host
        .driver
        .start(resolve(request, "test"), InProcessRunOptions::fresh())
        .await
        .unwrap_err();
    assert!(matches!(
        start_failure(&err),
        StartFailure::Depth(DepthError::Exceeded(_))
    ));

    for raw in [json!(f64::NAN.to_string()), json!(1.5), json!(-1), json!(-0.0)] {
        assert_eq!(raw.as_depth(), None, "{raw}");
    }
    let malformed = FakeParent::agent(
        "malformed",
        AgentOptions {
            subagent_depth: Some(MAX_SAFE_INTEGER + 1),
            ..AgentOptions::default()
        },
        SessionMeta::default(),
    );
    let err = host
        .driver
        .start(
            resolve(request_from(&malformed, Signal::new()), "test"),
            InProcessRunOptions::fresh(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "agent subagentDepth must be a non-negative safe integer"
    );
    let at_max = FakeParent::agent(
        "at-max",
        AgentOptions {
            subagent_depth: Some(MAX_SAFE_INTEGER),
            ..AgentOptions::default()
        },
        SessionMeta::default(),
    );
    let err = host
        .driver
        .start(
            resolve(request_from(&at_max, Signal::new()), "test"),
            InProcessRunOptions::fresh(),
        )
        .await
        .unwrap_err();
    assert!(matches!(
        start_failure(&err),
        StartFailure::Depth(DepthError::ChildDepthOverflow)
    ));
    assert_eq!(
        err.to_string(),
        "subagent child depth exceeds the safe-integer range"
    );
    assert_eq!((host.agent_count(), host.session_count()), before);
    host.finish().await;
}

/// spec: DRV-14 — an already-cancelled request rejects with "aborted before child publication"
/// and publishes nothing.
#[tokio::test(start_paused = true)]
async fn drv_14_already_cancelled_request_rejects() {
    let host = Host::new(vec![]).await;
    let before = (host.agent_count(), host.session_count());
    let signal = Signal::cancelled_with(CancelCause::Other {
        reason: "too late".into(),
    });
    let err = host
        .driver
        .start(
            resolve(request_from(&host.parent, signal), "test"),
            InProcessRunOptions::fresh(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "subagent request was aborted before child publication"
    );
    assert_eq!(err.code(), SubagentErrorCode::Cancelled);
    assert_eq!((host.agent_count(), host.session_count()), before);
    host.finish().await;
}

/// spec: DRV-15 — a route-less child gets options exactly `{subagentDepth: 1}` and ends `error`.
#[tokio::test(start_paused = true)]
async fn drv_15_routeless_child_gets_only_its_depth() {
    let host = Host::with_parent(vec![], AgentOptions::default()).await;
    let run = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    let child = run.local_agent().unwrap();
    assert_eq!(
        serde_json::to_value(child.options()).unwrap(),
        json!({"subagentDepth": 1})
    );
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Error);
    assert!(host.model.requests().is_empty());
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: DRV-16 — a post-publication token abort yields `{output: [partial], stopReason:
/// aborted}`, the request's cancellation reason is `{kind: parent}`, the turn ends `aborted
/// {parent}`; disposing a running child yields `aborted`.
#[tokio::test(start_paused = true)]
async fn drv_16_post_publication_abort_and_dispose_of_a_running_child() {
    let host = Host::new(vec![ScriptEntry::hang(), ScriptEntry::hang()]).await;
    let signal = Signal::new();
    let signalled = host
        .driver
        .start(
            resolve(request_from(&host.parent, signal.clone()), "test"),
            InProcessRunOptions::fresh(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    signal.cancel(CancelCause::Other {
        reason: "stop child".into(),
    });
    assert_eq!(
        signalled.result().await.unwrap(),
        SubagentResult::new(vec![ContentBlock::text("partial")], StopReason::Aborted)
    );
    assert_eq!(host.model.requests()[0].signal.cause(), Some(CancelCause::Parent));
    let child = signalled.local_agent().unwrap();
    assert_eq!(
        last_turn_end(&child),
        Some(TurnEndReason::Aborted {
            reason: CancelCause::Parent
        })
    );
    signalled.dispose().await.unwrap();

    let disposed = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    disposed.dispose().await.unwrap();
    assert_eq!(disposed.result().await.unwrap().stop_reason, StopReason::Aborted);
    host.finish().await;
}

/// spec: DRV-17 — a failing unpublished setup (unknown tool filter) rejects and leaves no agent
/// or session.
#[tokio::test(start_paused = true)]
async fn drv_17_failing_setup_rolls_back() {
    let host = Host::new(vec![]).await;
    let before = (host.agent_count(), host.session_count());
    let mut request = host.request();
    request.tool_filter = Some(agent::tools::ToolRestriction {
        allow: None,
        deny: Some(vec!["unknown-tool".into()]),
    });
    let err = host
        .driver
        .start(resolve(request, "test"), InProcessRunOptions::fresh())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown global tool"), "{err}");
    assert_eq!((host.agent_count(), host.session_count()), before);
    host.finish().await;
}

/// spec: DRV-18 — an abort landing between the factory's publication and the driver's listener
/// installation yields a run with an id and `{output: [], stopReason: aborted}`; the prompt is
/// never delivered; dispose cleans up.
#[tokio::test(start_paused = true)]
async fn drv_18_abort_in_the_handoff_window() {
    let host = Host::new(vec![]).await;
    let before = (host.agent_count(), host.session_count());
    let signal = Signal::new();
    let at_handoff = signal.clone();
    let driver = wrapped_driver(&host, move |handle| {
        // `create` already detached its creation-only listener; the run has not armed its own.
        at_handoff.cancel(CancelCause::Other {
            reason: "handoff race".into(),
        });
        handle
    });
    let run = driver
        .start(
            resolve(request_from(&host.parent, signal), "test"),
            InProcessRunOptions::fresh(),
        )
        .await
        .unwrap();
    assert!(host.get(run.id()).is_some());
    assert_eq!(
        run.result().await.unwrap(),
        SubagentResult::new(vec![], StopReason::Aborted)
    );
    let child = run.local_agent().unwrap();
    assert!(
        !types(&events_of(&child))
            .iter()
            .any(|t| t == "turn/start" || t == "user/message")
    );
    run.dispose().await.unwrap();
    driver.wait().await;
    assert_eq!((host.agent_count(), host.session_count()), before);
    host.finish().await;
}

/// spec: §3.6 — the child is owned by the parent's scope: disposing the parent agent drains the
/// child, whose run then settles `aborted`; the caller's dispose still completes.
#[tokio::test(start_paused = true)]
async fn parent_disposal_drains_the_child() {
    let mut host = Host::new(vec![ScriptEntry::hang()]).await;
    let run = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let parent = host.parent_handle.take().expect("parent handle");
    parent.dispose().await;
    assert!(
        host.get(run.id()).is_none(),
        "the child was drained with its owner"
    );
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// A fresh run of the host's parent whose child is in a turn that never ends.
async fn hanging_run(host: &Host) -> subagent_inprocess::LocalRun {
    let run = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    run
}

/// ARCHITECTURE (ownership): a run dropped without `dispose()` is disposed in the background
/// (with a warning); the child leaves the registry and its session is removed.
#[tokio::test(start_paused = true)]
async fn dropped_run_is_disposed_in_the_background() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let run = hanging_run(&host).await;
    let id = run.id().clone();
    drop(run);
    while host.get(&id).is_some() || host.session_count() > 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    host.driver.wait().await;
    host.finish().await;
}

/// ARCHITECTURE (ownership): a run dropped undisposed outside any tokio runtime — on a plain
/// thread — is still disposed in the background, on the runtime it was started on: the child
/// leaves the registry, its session is removed and the driver's tracker awaits the disposal.
/// (It used to start the disposal and drop it unrun: the child stayed registered and live.)
#[tokio::test(start_paused = true)]
async fn run_dropped_outside_a_runtime_is_disposed_on_its_own() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let run = hanging_run(&host).await;
    let id = run.id().clone();
    std::thread::spawn(move || {
        assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "no runtime on this thread"
        );
        drop(run);
    })
    .join()
    .expect("the drop did not panic");
    host.driver.wait().await;
    assert!(host.get(&id).is_none(), "disposed in the background");
    assert_eq!(host.session_count(), 1, "only the parent's session is left");
    host.finish().await;
}

/// §3.8 — a run dropped after its request signal fired (what a cancelled tool call does: its
/// future, holding the run, is dropped mid-await) is disposed in the background like any
/// dropped run, but logs no warning; a run dropped with its signal live still warns.
#[tokio::test(start_paused = true)]
async fn dropping_a_cancelled_run_does_not_warn() {
    let warnings = agent_loop::warnings::WarningCapture::new();
    let _subscriber = warnings.install();
    let host = Host::new(vec![ScriptEntry::hang(), ScriptEntry::hang()]).await;
    let drop_after = |cancel: bool| {
        let host = &host;
        async move {
            let signal = Signal::new();
            let run = host
                .driver
                .start(
                    resolve(request_from(&host.parent, signal.clone()), "test"),
                    InProcessRunOptions::fresh(),
                )
                .await
                .unwrap();
            let id = run.id().clone();
            tokio::time::sleep(Duration::from_millis(10)).await;
            if cancel {
                signal.cancel(CancelCause::User);
            }
            drop(run);
            host.driver.wait().await;
            assert!(host.get(&id).is_none(), "disposed in the background");
        }
    };
    drop_after(true).await;
    assert_eq!(warnings.len(), 0, "a cancelled run's drop is expected");
    drop_after(false).await;
    assert_eq!(warnings.len(), 1, "an undisposed live run still warns");
    host.finish().await;
}

/// Concurrency: many children of one parent started, settled and disposed concurrently on a
/// multi-threaded runtime each get their own result, and the host ends quiescent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_children_on_a_multi_threaded_runtime() {
    let n = 32;
    let host = Host::new((0..n).map(|_| chunks::text("same answer").into()).collect()).await;
    let starts = (0..n).map(|_| {
        host.driver
            .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
    });
    let runs: Vec<_> = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(|r| r.expect("started"))
        .collect();
    let results = futures::future::join_all(runs.iter().map(|r| r.result())).await;
    for result in results {
        let result = result.unwrap();
        assert_eq!(result.stop_reason, StopReason::Completed);
        assert_eq!(text(&result.output), "same answer");
    }
    futures::future::join_all(runs.iter().map(|r| r.dispose())).await;
    assert_eq!(host.agent_count(), 1);
    host.finish().await;
}
