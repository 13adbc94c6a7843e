//! The `spawn` provider (spec `inprocess-providers.md` §4, checklist SPW-58…SPW-85) through the
//! seam's service, on the reference runtime with a scripted model.

#[path = "../../subagent-inprocess/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use agent::tools::{ToolContext, ToolDefinition, ToolError, ToolHandler, ToolOutput, ToolRestriction, codes};
use agent::{
    AgentEvent, AgentOptions, AgentRuntime, CancelCause, ContentBlock, CreateAgentOptions, EventData,
    Message, SessionId, SessionMeta, Signal,
};
use agent_loop::model::{ScriptEntry, chunks};
use agent_loop::runtime::{RuntimeBuilder, SessionStoreEvent};
use async_trait::async_trait;
use common::*;
use parking_lot::Mutex;
use serde_json::{Value, json};
use subagent::StopReason;
use subagent::capabilities::{ContinuableCreateRequest, SubagentCapabilities};
use subagent::error::SubagentErrorCode;
use subagent::events::SubagentEvent;
use subagent::provider::{SubagentProvider, SubagentStartRequest};
use subagent::run::SubagentRun;
use subagent::service::StartError;
use subagent_spawn::{DEFAULT_NAME, SpawnProvider, register};

fn spawn(host: &Host) -> agent::Registration {
    register(&host.service, host.driver.clone()).expect("registered")
}

async fn start(host: &Host, request: SubagentStartRequest) -> Box<dyn SubagentRun> {
    host.service.start(DEFAULT_NAME, request).await.expect("started")
}

async fn start_err(host: &Host, request: SubagentStartRequest) -> StartError {
    match host.service.start(DEFAULT_NAME, request).await {
        Ok(_) => panic!("the start must reject"),
        Err(e) => e,
    }
}

/// Records every lifecycle event and publication notification of a host.
struct Recorder {
    seen: Arc<Mutex<Vec<String>>>,
    _guards: Vec<agent::Registration>,
}

impl Recorder {
    fn install(host: &Host) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (a, b, c) = (seen.clone(), seen.clone(), seen.clone());
        let guards = vec![
            host.runtime.services().agent_events.on(move |e| {
                match e {
                    AgentEvent::Created { .. } => a.lock().push("agent/created".into()),
                    AgentEvent::SessionStart { .. } => a.lock().push("agent/session-start".into()),
                    AgentEvent::Disposed { .. } => a.lock().push("agent/disposed".into()),
                    _ => {}
                }
                Ok(())
            }),
            host.runtime.sessions().events().on(move |e| {
                if let SessionStoreEvent::Created(_) = e {
                    b.lock().push("session/created".into());
                }
                Ok(())
            }),
            host.service.events().on(move |e| {
                c.lock().push(e.name().into());
                Ok(())
            }),
        ];
        Self {
            seen,
            _guards: guards,
        }
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.seen.lock())
    }
}

/// spec: SPW-58 — a fresh child runs to completion and returns its final text.
#[tokio::test(start_paused = true)]
async fn spw_58_fresh_child_returns_its_final_text() {
    let host = Host::new(vec![chunks::text("spawned answer").into()]).await;
    let _p = spawn(&host);
    let run = start(&host, host.request()).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.output, vec![ContentBlock::text("spawned answer")]);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-59 — `subagent/start` is emitted only after publication and resolves the child.
#[tokio::test(start_paused = true)]
async fn spw_59_start_event_follows_publication() {
    let host = Host::new(vec![chunks::text("answer").into()]).await;
    let _p = spawn(&host);
    let resolved = Arc::new(Mutex::new(None));
    let seen = resolved.clone();
    let agents = host.runtime.services().agents.clone();
    let listener = host.service.events().on(move |e| {
        if let SubagentEvent::Start(info) = e {
            *seen.lock() = Some((info.id.clone(), agents.get(&info.id).is_some(), info.local));
        }
        Ok(())
    });
    let run = start(&host, host.request()).await;
    let (id, was_registered, local) = resolved.lock().clone().expect("start emitted");
    assert_eq!(&id, run.id());
    assert!(was_registered && local);
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    drop(listener);
    host.finish().await;
}

/// spec: SPW-60 — the child has its own session id with `parentSession` lineage.
#[tokio::test(start_paused = true)]
async fn spw_60_own_id_with_lineage() {
    let host = Host::new(vec![chunks::text("answer").into()]).await;
    let _p = spawn(&host);
    let run = start(&host, host.request()).await;
    let child = run.local_agent().unwrap();
    assert_ne!(run.id(), host.parent.id());
    assert_eq!(child.id(), run.id());
    assert_eq!(
        child.session().header().parent_session.as_ref(),
        Some(host.parent.id())
    );
    assert_eq!(child.session().header().origin, Some(agent::Origin::Subagent));
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-61 — the child does not inherit the parent conversation.
#[tokio::test(start_paused = true)]
async fn spw_61_no_parent_history() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        chunks::text("child answer").into(),
    ])
    .await;
    let _p = spawn(&host);
    host.parent_turn("parent question").await;
    let run = start(&host, host.request()).await;
    run.result().await.unwrap();
    let child_request = host.model.requests()[1].clone();
    let texts: Vec<String> = child_request.messages.iter().map(Message::text).collect();
    assert!(
        texts
            .iter()
            .all(|t| !t.contains("parent question") && !t.contains("parent answer"))
    );
    assert!(texts.iter().any(|t| t == "child task"));
    let child = run.local_agent().unwrap();
    assert_eq!(child.session().header().seed_length, None);
    assert!(!types(&events_of(&child)).contains(&"session/end-seed".to_owned()));
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-62 — dispose removes the child from the registry.
#[tokio::test(start_paused = true)]
async fn spw_62_dispose_removes_the_child() {
    let host = Host::new(vec![chunks::text("answer").into()]).await;
    let _p = spawn(&host);
    let run = start(&host, host.request()).await;
    run.result().await.unwrap();
    assert!(host.get(run.id()).is_some());
    run.dispose().await.unwrap();
    assert!(host.get(run.id()).is_none());
    assert!(agent::SessionStore::get(host.runtime.sessions(), run.id()).is_none());
    host.finish().await;
}

/// spec: SPW-63 — child depth is parent + 1 in options (and in its header).
#[tokio::test(start_paused = true)]
async fn spw_63_depth_is_parent_plus_one() {
    let mut host = Host::new(vec![chunks::text("answer").into()]).await;
    let _p = spawn(&host);
    let parent = host
        .agent(
            "depth-one",
            SessionMeta {
                delegation_depth: Some(1),
                ..SessionMeta::default()
            },
            AgentOptions {
                subagent_depth: Some(1),
                ..routed()
            },
        )
        .await;
    let run = start(&host, request_from(&parent, Signal::new())).await;
    let child = run.local_agent().unwrap();
    assert_eq!(child.options().subagent_depth, Some(2));
    assert_eq!(child.session().header().delegation_depth, Some(2));
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-64 — `maxDepth: 0` rejects with `subagent depth 1 exceeds maxDepth 0`.
#[tokio::test(start_paused = true)]
async fn spw_64_max_depth_zero_rejects() {
    let host = Host::new(vec![]).await;
    let _p = spawn(&host);
    let mut request = host.request();
    request.max_depth = Some(json!(0));
    let err = start_err(&host, request).await;
    assert_eq!(err.to_string(), "subagent depth 1 exceeds maxDepth 0");
    assert_eq!(host.agent_count(), 1);
    host.finish().await;
}

/// spec: SPW-65 — a token-ceiling child maps to `max-tokens`.
#[tokio::test(start_paused = true)]
async fn spw_65_max_tokens() {
    let host = Host::new(vec![chunks::max_tokens_text("truncated").into()]).await;
    let _p = spawn(&host);
    let run = start(&host, host.request()).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::MaxTokens);
    assert_eq!(text(&result.output), "truncated");
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-66 — script exhaustion maps to `error` with `[]` output.
#[tokio::test(start_paused = true)]
async fn spw_66_script_exhaustion_is_error() {
    let host = Host::new(vec![]).await;
    let _p = spawn(&host);
    let run = start(&host, host.request()).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    assert!(result.output.is_empty());
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-67 — an already-cancelled signal rejects without publishing.
#[tokio::test(start_paused = true)]
async fn spw_67_already_cancelled_rejects() {
    let host = Host::new(vec![]).await;
    let _p = spawn(&host);
    let recorder = Recorder::install(&host);
    let err = start_err(
        &host,
        request_from(&host.parent, Signal::cancelled_with(CancelCause::User)),
    )
    .await;
    assert_eq!(
        err.to_string(),
        "subagent request was aborted before child publication"
    );
    assert!(recorder.take().is_empty());
    assert_eq!((host.agent_count(), host.session_count()), (1, 1));
    drop(recorder);
    host.finish().await;
}

/// spec: SPW-68 — a cancellation in the same tick as the start, landing inside the creation
/// transaction (right after the setup window), rejects and publishes nothing: no
/// `session/created`, `agent/created`, `agent/session-start`, `subagent/start` or `subagent/end`.
#[tokio::test(start_paused = true)]
async fn spw_68_cancel_during_creation_publishes_nothing() {
    let host = Host::new(vec![]).await;
    let signal = Signal::new();
    let in_setup = signal.clone();
    let driver = hooked_driver(
        &host,
        move |options: &mut CreateAgentOptions| {
            let s = in_setup.clone();
            after_setup(options, move || {
                s.cancel(CancelCause::Other {
                    reason: "same tick".into(),
                });
            });
        },
        |h| h,
    );
    let _p = host
        .service
        .register_provider(Arc::new(SpawnProvider::new(driver.clone())))
        .unwrap();
    let recorder = Recorder::install(&host);
    let err = start_err(&host, request_from(&host.parent, signal)).await;
    let StartError::Subagent(e) = &err else {
        panic!("expected the provider's error, got {err}")
    };
    assert_eq!(e.code(), SubagentErrorCode::Cancelled);
    assert!(e.to_string().contains("creation aborted: same tick"), "{e}");
    assert!(recorder.take().is_empty());
    assert_eq!((host.agent_count(), host.session_count()), (1, 1));
    driver.wait().await;
    drop(recorder);
    host.finish().await;
}

/// spec: SPW-69 — cancelling a running child through the signal settles `aborted`.
#[tokio::test(start_paused = true)]
async fn spw_69_signal_cancels_a_running_child() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let _p = spawn(&host);
    let signal = Signal::new();
    let run = start(&host, request_from(&host.parent, signal.clone())).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    signal.cancel(CancelCause::User);
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(text(&result.output), "partial");
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-70 — disposing a running child reaches quiescence and settles `aborted`.
#[tokio::test(start_paused = true)]
async fn spw_70_dispose_of_a_running_child() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let _p = spawn(&host);
    let run = start(&host, host.request()).await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    run.dispose().await.unwrap();
    assert!(host.get(run.id()).is_none());
    assert_eq!(host.session_count(), 1);
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    host.finish().await;
}

/// spec: SPW-71 — a run exposes neither steer nor resume (the `SubagentRun` surface is `id`,
/// `local_agent`, `result`, `dispose` only); the provider's continuable preparation contributes
/// no seed.
#[tokio::test(start_paused = true)]
async fn spw_71_no_steer_no_resume_no_seed() {
    let host = Host::new(vec![chunks::text("parent answer").into()]).await;
    host.parent_turn("q").await;
    let provider = SpawnProvider::new(host.driver.clone());
    let prepare = provider.continuable().expect("continuable preparation present");
    let spec = prepare
        .prepare_continuable(ContinuableCreateRequest {
            session_id: "reserved".into(),
            parent: host.parent.clone(),
            signal: Signal::new(),
        })
        .await
        .unwrap();
    assert_eq!(spec.seed, None);
    host.finish().await;
}

/// spec: SPW-72 — the parent `cwd` is inherited.
#[tokio::test(start_paused = true)]
async fn spw_72_cwd_is_inherited() {
    let host = Host::new(vec![chunks::text("answer").into()]).await;
    let _p = spawn(&host);
    let run = start(&host, host.request()).await;
    assert_eq!(
        run.local_agent().unwrap().session().header().cwd.as_deref(),
        Some(std::path::Path::new(CWD))
    );
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-73 — `agentOptions.model` is used when the parent has no model.
#[tokio::test(start_paused = true)]
async fn spw_73_requested_model_when_the_parent_has_none() {
    let host = Host::with_parent(
        vec![chunks::text("answer").into()],
        AgentOptions {
            provider: Some(MODEL.into()),
            ..AgentOptions::default()
        },
    )
    .await;
    let _p = spawn(&host);
    let mut request = host.request();
    request.agent_options = Some(AgentOptions {
        model: Some(MODEL.into()),
        ..AgentOptions::default()
    });
    let run = start(&host, request).await;
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
    assert_eq!(&*host.model.requests()[0].model, MODEL);
    assert_eq!(run.local_agent().unwrap().options().model.as_deref(), Some(MODEL));
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-74 — all four capabilities are advertised (and the child is fresh).
#[tokio::test(start_paused = true)]
async fn spw_74_capabilities() {
    let host = Host::new(vec![]).await;
    let provider = SpawnProvider::new(host.driver.clone());
    assert_eq!(provider.capabilities(), SubagentCapabilities::ALL);
    assert!(!provider.inherits_parent_context());
    assert_eq!(provider.name(), "spawn");
    host.finish().await;
}

/// spec: SPW-75 — disposing the provider's registration unregisters it
/// (`subagent/provider-removed`).
#[tokio::test(start_paused = true)]
async fn spw_75_unregistering() {
    let host = Host::new(vec![]).await;
    let recorder = Recorder::install(&host);
    let guard = spawn(&host);
    assert_eq!(host.service.list(), ["spawn"]);
    drop(guard);
    assert!(host.service.list().is_empty());
    assert_eq!(
        recorder.take(),
        ["subagent/provider-added", "subagent/provider-removed"]
    );
    drop(recorder);
    host.finish().await;
}

/// spec: SPW-76 — structured output works through the shipped provider and nothing stays
/// registered afterwards.
#[tokio::test(start_paused = true)]
async fn spw_76_structured_output() {
    let host = Host::new(vec![
        chunks::tool_call(
            "c1",
            subagent_inprocess::STRUCTURED_OUTPUT_TOOL,
            json!({"answer": 3}),
        )
        .into(),
    ])
    .await;
    let _p = spawn(&host);
    let mut request = host.request();
    request.output_schema = Some(json!({
        "type": "object",
        "properties": {"answer": {"type": "number"}},
        "required": ["answer"]
    }));
    let run = start(&host, request).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, Some(json!({"answer": 3})));
    assert_eq!(result.stop_reason, StopReason::Completed);
    let child = run.id().clone();
    run.dispose().await.unwrap();
    let tools = host.runtime.services().tools.clone();
    assert!(
        tools
            .get(subagent_inprocess::STRUCTURED_OUTPUT_TOOL, None)
            .is_none()
    );
    assert!(
        tools
            .get(subagent_inprocess::STRUCTURED_OUTPUT_TOOL, Some(&child))
            .is_none()
    );
    host.finish().await;
}

/// spec: SPW-77 — unloading the provider does not revoke an accepted run; the run later aborts
/// via its signal.
#[tokio::test(start_paused = true)]
async fn spw_77_unload_does_not_revoke() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let provider = spawn(&host);
    let signal = Signal::new();
    let run = start(&host, request_from(&host.parent, signal.clone())).await;
    drop(provider);
    assert!(host.service.list().is_empty());
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(run.local_agent().unwrap().is_live());
    signal.cancel(CancelCause::User);
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-78 — a start against an already-unloaded provider fails `no subagent provider`
/// without touching the parent.
#[tokio::test(start_paused = true)]
async fn spw_78_start_after_unload() {
    let host = Host::new(vec![]).await;
    drop(spawn(&host));
    let before = (host.agent_count(), host.parent.session().len());
    let err = start_err(&host, host.request()).await;
    let StartError::Subagent(e) = &err else {
        panic!("expected NO_PROVIDER, got {err}")
    };
    assert_eq!(e.code(), SubagentErrorCode::NoProvider);
    assert!(e.to_string().starts_with("no subagent provider"));
    assert_eq!((host.agent_count(), host.parent.session().len()), before);
    host.finish().await;
}

/// spec: SPW-79 — (Rust equivalent of "named plugin exports only") the crate's surface is the
/// provider type, its default name and `register`, which installs it with the service alone.
#[tokio::test(start_paused = true)]
async fn spw_79_surface_is_the_provider_its_name_and_register() {
    let host = Host::new(vec![]).await;
    assert_eq!(DEFAULT_NAME, "spawn");
    let guard = register(&host.service, host.driver.clone()).unwrap();
    let provider = host.service.get_provider(DEFAULT_NAME).expect("registered");
    assert_eq!(provider.name(), DEFAULT_NAME);
    assert_eq!(SpawnProvider::named("other", host.driver.clone()).name(), "other");
    drop(guard);
    host.finish().await;
}

/// spec: SPW-80 — a child persona shadows the deployment persona in the child request only.
#[tokio::test(start_paused = true)]
async fn spw_80_persona_shadows_in_the_child_only() {
    let host = Host::build(
        vec![
            chunks::text("parent answer").into(),
            chunks::text("child answer").into(),
        ],
        RuntimeBuilder::new().persona("DEPLOYMENT PERSONA"),
        routed(),
    )
    .await;
    let _p = spawn(&host);
    host.parent_turn("q").await;
    let mut request = host.request();
    request.persona = Some("CHILD PERSONA".into());
    let run = start(&host, request).await;
    run.result().await.unwrap();
    let parent_system = host.model.requests()[0].system.clone().unwrap();
    let child_system = host.model.requests()[1].system.clone().unwrap();
    assert!(parent_system.contains("DEPLOYMENT PERSONA") && !parent_system.contains("CHILD PERSONA"));
    assert!(child_system.contains("CHILD PERSONA") && !child_system.contains("DEPLOYMENT PERSONA"));
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: SPW-81 — a tool filter hides the denied tool and refuses its execution (`unknown tool`
/// in the log).
#[tokio::test(start_paused = true)]
async fn spw_81_filter_hides_and_refuses() {
    let host = Host::new(vec![
        chunks::tool_call("w1", "write", json!({})).into(),
        chunks::text("done").into(),
    ])
    .await;
    let _p = spawn(&host);
    let writes = Arc::new(AtomicUsize::new(0));
    let read = global_tool(&host, counting_tool("read", Arc::new(AtomicUsize::new(0))));
    let write = global_tool(&host, counting_tool("write", writes.clone()));
    let mut request = host.request();
    request.tool_filter = Some(ToolRestriction {
        allow: None,
        deny: Some(vec!["write".into()]),
    });
    let run = start(&host, request).await;
    run.result().await.unwrap();
    let names: Vec<String> = host.model.requests()[0]
        .tools
        .as_ref()
        .unwrap()
        .iter()
        .map(|t| t.name.clone())
        .collect();
    assert_eq!(names, ["read"]);
    assert_eq!(writes.load(Ordering::SeqCst), 0);
    let child = run.local_agent().unwrap();
    let results = tool_results(&child);
    assert!(
        results[0].1 && results[0].2.contains("unknown tool"),
        "{results:?}"
    );
    let logged_code = child.session().events().iter().find_map(|e| match &e.data {
        EventData::ToolResult { error: Some(err), .. } => Some(err.code.clone()),
        _ => None,
    });
    assert_eq!(logged_code.as_deref(), Some(codes::UNKNOWN_TOOL));
    run.dispose().await.unwrap();
    drop((read, write));
    host.finish().await;
}

/// spec: SPW-82 — an unknown filter name fails loud (`unknown global tool "no_such_tool"`) with
/// no orphan.
#[tokio::test(start_paused = true)]
async fn spw_82_unknown_filter_name_fails_loud() {
    let host = Host::new(vec![]).await;
    let _p = spawn(&host);
    let recorder = Recorder::install(&host);
    let mut request = host.request();
    request.tool_filter = Some(ToolRestriction {
        allow: Some(vec!["no_such_tool".into()]),
        deny: None,
    });
    let err = start_err(&host, request).await;
    assert!(
        err.to_string().contains("unknown global tool \"no_such_tool\""),
        "{err}"
    );
    assert!(recorder.take().is_empty());
    assert_eq!((host.agent_count(), host.session_count()), (1, 1));
    drop(recorder);
    host.finish().await;
}

/// spec: SPW-83 — spawning from a disposed parent fails with an inactive-context error and
/// publishes nothing.
#[tokio::test(start_paused = true)]
async fn spw_83_disposed_parent_is_inactive() {
    let host = Host::new(vec![]).await;
    let _p = spawn(&host);
    let doomed = host
        .runtime
        .create(CreateAgentOptions {
            agent_options: routed(),
            ..CreateAgentOptions::new(SessionId::from("doomed"))
        })
        .await
        .unwrap();
    let parent = doomed.agent().clone();
    doomed.dispose().await;
    let recorder = Recorder::install(&host);
    let err = start_err(&host, request_from(&parent, Signal::new())).await;
    assert!(err.to_string().contains("inactive"), "{err}");
    let StartError::Subagent(e) = &err else { panic!() };
    assert_eq!(e.code(), SubagentErrorCode::ParentUnavailable);
    assert!(recorder.take().is_empty());
    assert_eq!((host.agent_count(), host.session_count()), (1, 1));
    drop(recorder);
    host.finish().await;
}

/// spec: SPW-84 — parent disposal during the child's setup transaction rejects and prevents
/// every publication notification.
#[tokio::test(start_paused = true)]
async fn spw_84_parent_disposal_during_setup() {
    let host = Host::new(vec![]).await;
    let owner = host
        .runtime
        .create(CreateAgentOptions {
            agent_options: routed(),
            ..CreateAgentOptions::new(SessionId::from("owner"))
        })
        .await
        .unwrap();
    let parent = owner.agent().clone();
    let owner = Arc::new(Mutex::new(Some(owner)));
    let disposal: Arc<Mutex<Option<futures::future::BoxFuture<'static, ()>>>> = Arc::default();
    let (o, d) = (owner.clone(), disposal.clone());
    let driver = hooked_driver(
        &host,
        move |options: &mut CreateAgentOptions| {
            let (o, d) = (o.clone(), d.clone());
            after_setup(options, move || {
                if let Some(handle) = o.lock().take() {
                    *d.lock() = Some(handle.dispose());
                }
            });
        },
        |h| h,
    );
    let _p = host
        .service
        .register_provider(Arc::new(SpawnProvider::new(driver.clone())))
        .unwrap();
    let recorder = Recorder::install(&host);
    let err = start_err(&host, request_from(&parent, Signal::new())).await;
    assert!(err.to_string().contains("owner disposed during setup"), "{err}");
    let disposing = disposal
        .lock()
        .take()
        .expect("the owner was disposed during setup");
    disposing.await;
    let seen = recorder.take();
    assert!(
        !seen
            .iter()
            .any(|e| e == "session/created" || e == "agent/session-start" || e.starts_with("subagent/")),
        "{seen:?}"
    );
    // Only the owner's own disposal is announced; the child was never announced.
    assert_eq!(seen, ["agent/disposed"]);
    assert_eq!((host.agent_count(), host.session_count()), (1, 1));
    driver.wait().await;
    drop(recorder);
    host.finish().await;
}

/// The parent's delegation tool: starts a `spawn` child from inside the parent's tool call.
struct Delegate {
    service: subagent::service::SubagentService,
    agents: Arc<dyn AgentRuntime>,
}

#[async_trait]
impl ToolHandler for Delegate {
    async fn execute(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let parent = self
            .agents
            .get(ctx.agent())
            .ok_or_else(|| ToolError::failed("no parent"))?;
        let task = args["task"].as_str().unwrap_or_default().to_owned();
        let request = SubagentStartRequest::new(vec![ContentBlock::text(task)], parent, ctx.signal.clone());
        let run = self
            .service
            .start(DEFAULT_NAME, request)
            .await
            .map_err(|e| ToolError::failed(e.to_string()))?;
        let result = run.result().await;
        let _ = run.dispose().await;
        let result = result.map_err(|e| ToolError::failed(e.to_string()))?;
        if !result.stop_reason.is_completed() {
            return Err(ToolError::failed(format!(
                "subagent ended: {}",
                result.stop_reason
            )));
        }
        Ok(ToolOutput {
            content: result.output,
            value: None,
            meta: None,
        })
    }
}

/// spec: SPW-85 — (the reference's key-gated smoke on a real model; no network here) a parent
/// delegates file writing to a child from inside its own tool call, the child writes through a
/// tool, and the parent's log records the delegation call and the child's answer as its result.
#[tokio::test(start_paused = true)]
async fn spw_85_parent_delegates_from_a_tool_call() {
    let host = Host::new(vec![
        chunks::tool_call("d1", "delegate", json!({"task": "write hello.txt"})).into(),
        chunks::tool_call("w1", "write_file", json!({"path": "hello.txt"})).into(),
        chunks::text("wrote hello.txt").into(),
        chunks::text("the child wrote the file").into(),
    ])
    .await;
    let _p = spawn(&host);
    let writes = Arc::new(AtomicUsize::new(0));
    let write = global_tool(&host, counting_tool("write_file", writes.clone()));
    let delegate = global_tool(
        &host,
        ToolDefinition {
            name: "delegate".into(),
            description: "delegate a task".into(),
            parameters: json!({"type": "object"}),
            concurrency_safe: false,
            handler: Arc::new(Delegate {
                service: host.service.clone(),
                agents: host.runtime.services().agents.clone(),
            }),
        },
    );
    let delegated = Arc::new(AtomicBool::new(false));
    let seen = delegated.clone();
    let listener = host
        .service
        .events()
        .on_scoped(host.parent.id().clone(), move |e| {
            if matches!(e, SubagentEvent::End(end) if end.stop_reason == StopReason::Completed) {
                seen.store(true, Ordering::SeqCst);
            }
            Ok(())
        });
    host.parent_turn("please delegate").await;
    assert_eq!(writes.load(Ordering::SeqCst), 1);
    assert!(delegated.load(Ordering::SeqCst));
    let parent_events = events_of(&host.parent);
    assert!(
        parent_events
            .iter()
            .any(|e| matches!(&e.data, EventData::ToolCall { name, .. } if name == "delegate"))
    );
    let results = tool_results(&host.parent);
    assert_eq!(results[0].2, "wrote hello.txt");
    assert_eq!(host.agent_count(), 1, "the child was disposed");
    drop((write, delegate, listener));
    host.finish().await;
}
