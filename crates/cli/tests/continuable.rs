//! The host with continuable background delegations ([`HostOptions::continuable`]): the
//! coordinator's `subagent` call starts a durable child through the host's continuation manager,
//! the child's settlement notice wakes the coordinator, and [`Host::run_turn`] returns only once
//! the coordinator has answered it. Every session append passes the online invariant checker,
//! and the host shuts down with nothing resident.

use std::sync::Arc;

use agent::{AgentRuntime, GenerateOptions, Message, ModelAdapter, ModelStream, SessionId, StreamChunk};
use agent_loop::model::chunks;
use futures::StreamExt;
use invariants::InvariantObserver;
use subagent::descriptor::{SubagentDescriptor, fold_subagent_descriptor};
use subagent_cli::host::{Host, HostOptions, build_host};

const CHILD_TASK: &str = "CHILD-TASK: find the answer";

/// The coordinator delegates once, says it is waiting, and answers the child's settlement
/// notice; the child answers its task.
struct Coordinated;

fn texts(options: &GenerateOptions) -> Vec<String> {
    options.messages.iter().map(Message::text).collect()
}

fn has_source(options: &GenerateOptions, kind: &str) -> bool {
    options.messages.iter().any(|m| m.source.kind() == kind)
}

impl ModelAdapter for Coordinated {
    fn stream(&self, options: Arc<GenerateOptions>) -> ModelStream {
        let texts = texts(&options);
        let reply: Vec<StreamChunk> = if texts.iter().any(|t| t.contains(CHILD_TASK)) {
            chunks::text("the child's finding")
        } else if has_source(&options, "subagent-settled") {
            chunks::text("final: the child reported")
        } else if has_source(&options, "tool") {
            chunks::text("waiting for the child")
        } else {
            chunks::tool_call(
                "call-1",
                "subagent",
                serde_json::json!({"description": "research", "prompt": CHILD_TASK}),
            )
        };
        futures::stream::iter(reply.into_iter().map(Ok)).boxed()
    }
}

/// The continuable route end to end through the host: start, settlement notice, the
/// coordinator's answer, clean shutdown.
#[tokio::test(start_paused = true)]
async fn a_continuable_child_settles_and_its_notice_is_answered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut options = HostOptions::new(dir.path(), Arc::new(Coordinated), "mock", "mock");
    options.continuable = true;
    let observer = InvariantObserver::shared();
    options.session_observers.push(observer.clone());
    let host: Host = build_host(options).expect("the host composes");
    let coordinator = host
        .create_agent(SessionId::from("coordinator"))
        .await
        .expect("coordinator");
    host.run_turn(coordinator.agent(), "delegate the research")
        .await
        .expect("the turn runs");
    assert_eq!(
        Host::last_answer(coordinator.agent().as_ref()).as_deref(),
        Some("final: the child reported"),
        "run_turn waited for the child's notice and the coordinator's answer to it"
    );
    assert!(
        host.continuation().resident().is_empty(),
        "the child was released"
    );
    let children: Vec<SessionId> = host
        .store()
        .list()
        .await
        .expect("listed")
        .into_iter()
        .map(|s| s.id)
        .filter(|id| id.as_str() != "coordinator")
        .collect();
    assert_eq!(children.len(), 1, "{children:?}");
    let loaded = agent::SessionPersistence::load(host.store().as_ref(), &children[0])
        .await
        .expect("the child's log loads");
    let state = fold_subagent_descriptor(loaded.events.iter()).expect("a valid descriptor");
    assert!(
        matches!(state.into_supported(), Some(SubagentDescriptor::Continuable(_))),
        "the child is continuable, so it can cold-resume"
    );
    assert!(
        host.runtime().get(&children[0]).is_none(),
        "released children leave the registry"
    );
    coordinator.dispose().await;
    host.shutdown().await.expect("shutdown");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}
