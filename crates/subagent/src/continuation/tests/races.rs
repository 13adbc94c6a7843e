//! Races between a continuable child's releasers and later deliveries to the same child.

use super::*;

/// A host runtime that cancels the creation's token right after the creation returned (the
/// runtime ignored the token): the start then fails its residency check and rolls back.
struct AbortAfterCreate(Arc<dyn AgentRuntime>);

#[async_trait]
impl AgentRuntime for AbortAfterCreate {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        let signal = options.signal.clone();
        let handle = self.0.create(options).await?;
        if let Some(signal) = signal {
            signal.cancel(agent::CancelCause::User);
        }
        Ok(handle)
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.0.resume(options).await
    }
    delegate_agent_lookups!(0);
}

/// A follow-up racing the rollback of a refused start (whose caller dropped it while the fresh
/// agent's handle was being disposed) waits for that release and then cold-resumes the durable
/// child (spec §2.14.5 routing): it is accepted, runs once, and the epoch is announced and
/// released like any other. (The rollback was no admission cutoff: the follow-up was accepted
/// by the agent being disposed, discarded unrun, and no epoch edge or notice ever followed.)
#[tokio::test(start_paused = true)]
async fn a_followup_racing_a_dropped_starts_rollback_cold_resumes() {
    let mut host = Host::new(vec![
        chunks::text("second answer").into(),
        chunks::text("parent ack").into(),
    ])
    .await;
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(AbortAfterCreate(Arc::new(SlowDisposal(services.agents.clone()))));
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let child_id = SessionId::from("dropped");
    let mut spec = host.spec("task");
    spec.child_id = Some(child_id.clone());
    let mut start = Box::pin(host.manager.start_continuable(spec));
    let mut dropped_mid_rollback = false;
    for _ in 0..10_000 {
        match futures::poll!(start.as_mut()) {
            std::task::Poll::Ready(outcome) => {
                panic!("the start finished before it could be dropped: {outcome:?}")
            }
            std::task::Poll::Pending if host.manager.is_resident(&child_id) => {
                dropped_mid_rollback = true;
                break;
            }
            std::task::Poll::Pending => tokio::task::yield_now().await,
        }
    }
    assert!(dropped_mid_rollback, "the rollback was never observed in flight");
    drop(start);
    let id = host
        .manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("again")])
        .await
        .expect("the follow-up is accepted");
    host.settle().await;
    host.parent.when_idle().await;
    host.settle().await;
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["again"], "{:?}", type_names(&log.events));
    assert_eq!(
        type_names(&log.events)
            .iter()
            .filter(|n| *n == "subagent/descriptor")
            .count(),
        1
    );
    assert!(
        log.events
            .iter()
            .any(|e| matches!(&e.data, EventData::UserMessage(m) if m.id == id)),
        "the accepted follow-up is in the child's log"
    );
    assert_eq!(host.starts().len(), 1);
    assert_eq!(host.ends().len(), 1);
    assert_eq!(notices(&host.parent).len(), 1);
    host.finish().await;
}

/// A host runtime whose *resumed* agents' handles explode when disposed (after releasing the
/// agent), like [`PanickingDisposal`] does for created ones.
struct PanickingResumedDisposal(Arc<dyn AgentRuntime>);

#[async_trait]
impl AgentRuntime for PanickingResumedDisposal {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.0.create(options).await
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        let handle = self.0.resume(options).await?;
        Ok(AgentHandle::new(
            handle.agent().clone(),
            Arc::new(ExplodingDisposer(handle)),
        ))
    }
    delegate_agent_lookups!(0);
}

/// spec: CONT-22 — a cold resume whose runtime resumed another session (the store's load was
/// redirected) releases that agent and rejects `NOT_RESUMABLE` even when the host's handle
/// disposal panics: the panic is contained (it unwound into the follow-up's caller), the
/// foreign agent is gone and nothing is resident.
#[tokio::test(start_paused = true)]
async fn a_panicking_disposal_of_a_foreign_resumed_agent_is_contained() {
    let store = Arc::new(MemoryStore::new());
    let persistence: Arc<dyn SessionPersistence> = Arc::new(AliasedSession {
        store: store.clone(),
        alias: SessionId::from("alias"),
        target: SessionId::from("impostor"),
        consistent_inspect: true,
    });
    let mut host = Host::build_on(by_session(6), store, Some(persistence), true, routed(), false).await;
    let impostor = start_reserved(&host, "impostor").await;
    host.settle().await;
    host.parent.when_idle().await;
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(PanickingResumedDisposal(services.agents.clone()));
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let agents = host.agent_count();
    let alias = SessionId::from("alias");
    let followup = host
        .manager
        .followup(&host.parent, &alias, vec![ContentBlock::text("misrouted")]);
    let outcome = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(followup)).await;
    let err = outcome
        .expect("the host's panic does not unwind into the caller")
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::NotResumable, "{err}");
    yield_a_while().await;
    assert!(host.manager.resident().is_empty());
    assert!(host.get(&impostor).is_none());
    assert_eq!(host.agent_count(), agents);
    host.finish().await;
}
