//! Continuable children and parents whose host agent runs *maintenance* (spec §0, agent-spine
//! §8.4): a non-turn task during which the public status folds into `idle`, `when_idle` waits
//! for the task, and a waking send is inserted into the inbox but only latches its wake, which
//! replays when the task ends. The reference runtime has no maintenance (a left-out feature), but
//! the [`Agent`](agent::Agent) contract lets a host have it ("maintenance folds into `Idle`"), so
//! the manager must stay correct for such hosts: these tests run it over [`MaintainedAgent`], a
//! host agent that adds maintenance to a reference agent.

use agent::{Agent, AgentError, InboxSnapshot, InboxTarget, Message, MessageId};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::*;

/// A host agent over a live reference agent, with maintenance tasks.
///
/// The reference agent can only be woken by a send, so the latch replays as a re-delivery of
/// the latched messages still pending: all are removed (removal splices), then re-inserted in
/// latch order, the first with the wake (so the queue keeps their order).
struct MaintainedAgent {
    inner: AgentRef,
    /// Whether a maintenance task runs (a watch, so that `when_idle` can wait for its end).
    maintenance: tokio::sync::watch::Sender<bool>,
    /// The waking sends received during maintenance, in order.
    latched: Mutex<Vec<(Message, InboxTarget)>>,
}

impl MaintainedAgent {
    /// Starts a maintenance task; the agent must be truly idle.
    fn begin_maintenance(&self) {
        assert_eq!(
            self.inner.status(),
            AgentStatus::Idle,
            "maintenance runs from true idle"
        );
        self.maintenance.send_replace(true);
    }

    /// Ends the maintenance task and replays its latch.
    fn end_maintenance(&self) {
        self.maintenance.send_replace(false);
        let latched = std::mem::take(&mut *self.latched.lock());
        let pending: Vec<_> = latched
            .into_iter()
            .filter(|(message, _)| self.inner.remove_pending(&message.id).unwrap_or(false))
            .collect();
        for (message, target) in pending {
            self.inner
                .send(message, target, true)
                .expect("the latched wake replays");
        }
    }

    fn in_maintenance(&self) -> bool {
        *self.maintenance.borrow()
    }
}

impl Agent for MaintainedAgent {
    fn id(&self) -> &SessionId {
        self.inner.id()
    }
    fn options(&self) -> &AgentOptions {
        self.inner.options()
    }
    fn session(&self) -> &Arc<agent::Session> {
        self.inner.session()
    }
    fn scope(&self) -> &Arc<agent::Scope> {
        self.inner.scope()
    }
    fn send(&self, message: Message, target: InboxTarget, wake: bool) -> Result<MessageId, AgentError> {
        if wake && self.in_maintenance() {
            let id = self.inner.send(message.clone(), target, false)?;
            self.latched.lock().push((message, target));
            return Ok(id);
        }
        self.inner.send(message, target, wake)
    }
    fn remove_pending(&self, id: &MessageId) -> Result<bool, AgentError> {
        self.inner.remove_pending(id)
    }
    fn inbox(&self) -> InboxSnapshot {
        self.inner.inbox()
    }
    fn cancel(&self, cause: agent::CancelCause, options: agent::CancelOptions) {
        // Cancelling aborts the maintenance task; without `keep_inbox` the latch goes with the
        // inbox.
        if self.in_maintenance() {
            if !options.keep_inbox {
                self.latched.lock().clear();
            }
            self.maintenance.send_replace(false);
        }
        self.inner.cancel(cause, options);
    }
    fn status(&self) -> AgentStatus {
        // Maintenance folds into `idle` (and the reference agent is idle meanwhile).
        self.inner.status()
    }
    fn when_idle(&self) -> BoxFuture<'static, ()> {
        let mut maintenance = self.maintenance.subscribe();
        let inner = self.inner.clone();
        async move {
            // No driver and no maintenance task: re-checked after each awaited activity.
            loop {
                let _ = maintenance.wait_for(|running| !*running).await;
                inner.when_idle().await;
                if !*maintenance.borrow() {
                    break;
                }
            }
        }
        .boxed()
    }
    fn is_live(&self) -> bool {
        self.inner.is_live()
    }
}

/// The disposer of a [`MaintenanceRuntime`] handle: the runtime's own handle.
struct Delegating(AgentHandle);

impl agent::Disposer for Delegating {
    fn dispose(&self) -> BoxFuture<'static, ()> {
        self.0.dispose()
    }
}

/// A host runtime whose agents created with an id in `maintained` are [`MaintainedAgent`]s; the
/// manager sees agents only through it, so `get` answers the maintained agent while it is live.
struct MaintenanceRuntime {
    inner: Arc<dyn AgentRuntime>,
    maintained: Vec<SessionId>,
    created: Mutex<Vec<Arc<MaintainedAgent>>>,
}

impl MaintenanceRuntime {
    /// The maintained agent created as `id`.
    fn agent(&self, id: &str) -> Arc<MaintainedAgent> {
        self.created
            .lock()
            .iter()
            .find(|a| a.id().as_str() == id)
            .cloned()
            .expect("created")
    }
}

#[async_trait]
impl AgentRuntime for MaintenanceRuntime {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, AgentError> {
        let maintained = self.maintained.contains(&options.session_id);
        let handle = self.inner.create(options).await?;
        if !maintained {
            return Ok(handle);
        }
        let agent = Arc::new(MaintainedAgent {
            inner: handle.agent().clone(),
            maintenance: tokio::sync::watch::Sender::new(false),
            latched: Mutex::new(Vec::new()),
        });
        self.created.lock().push(agent.clone());
        Ok(AgentHandle::new(agent, Arc::new(Delegating(handle))))
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, AgentError> {
        self.inner.resume(options).await
    }
    fn get(&self, id: &SessionId) -> Option<AgentRef> {
        let live = self.inner.get(id)?;
        let maintained = self
            .created
            .lock()
            .iter()
            .find(|a| Arc::ptr_eq(&a.inner, &live))
            .map(|a| a.clone() as AgentRef);
        Some(maintained.unwrap_or(live))
    }
    fn list(&self) -> Vec<AgentRef> {
        self.inner.list()
    }
    fn ctx(&self) -> agent::Ctx {
        self.inner.ctx()
    }
    fn agent_ctx(&self, id: &SessionId) -> Option<agent::Ctx> {
        self.inner.agent_ctx(id)
    }
}

/// A [`Host`] whose manager creates the children named in `maintained` as [`MaintainedAgent`]s,
/// each of which begins a maintenance task when its first turn ends (as it goes idle, before
/// anyone can observe it idle), and the listener doing that.
async fn maintenance_host(
    script: Vec<ScriptEntry>,
    maintained: &[&str],
) -> (Host, Arc<MaintenanceRuntime>, agent::Registration) {
    let mut host = Host::new(script).await;
    let mut services = host.runtime.services().clone();
    let agents = Arc::new(MaintenanceRuntime {
        inner: services.agents.clone(),
        maintained: maintained.iter().map(|id| SessionId::from(*id)).collect(),
        created: Mutex::new(Vec::new()),
    });
    services.agents = agents.clone();
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let runtime = agents.clone();
    let begun = Arc::new(Mutex::new(Vec::<SessionId>::new()));
    let listener = host.runtime.services().agent_events.on(move |e: &AgentEvent| {
        if let AgentEvent::Status {
            agent,
            status: AgentStatus::Idle,
        } = e
            && runtime.maintained.contains(agent)
            && !begun.lock().contains(agent)
        {
            begun.lock().push(agent.clone());
            runtime.agent(agent.as_str()).begin_maintenance();
        }
        Ok(())
    });
    (host, agents, listener)
}

/// The settlement notices in `events`, as their first text block.
fn notice_lines(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) if m.source.kind() == "subagent-settled" => {
                block_texts(&m.content).into_iter().next()
            }
            _ => None,
        })
        .collect()
}

/// spec: CONT-72 — a follow-up accepted while the child is in maintenance (idle status, its wake
/// only latched: no turn opens) and drained before any turn opens: the parent is told the child
/// "was stopped before it finished." with the earlier answer as its closing message (the dropped
/// follow-up is work cancelled unrun after the completed turn), the end edge says `aborted` with
/// that answer, and the follow-up is never logged as a message.
#[tokio::test(start_paused = true)]
async fn cont_72_followup_accepted_in_maintenance_then_drained() {
    let (host, agents, listener) = maintenance_host(by_session(4), &["child"]).await;
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let child = agents.agent("child");
    assert!(child.in_maintenance(), "the first turn ended into maintenance");
    assert!(
        host.manager.is_resident(&child_id),
        "maintenance is not quiescence"
    );
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("more")])
        .await
        .expect("accepted during maintenance");
    yield_a_while().await;
    assert!(host.manager.is_resident(&child_id));
    assert_eq!(child.status(), AgentStatus::Idle);
    assert_eq!(child.inbox().next_turn.len(), 1, "queued, its wake latched");
    assert_eq!(
        type_names(&live_log(&child.inner))
            .iter()
            .filter(|t| *t == "turn/start")
            .count(),
        1,
        "no turn opened for the follow-up"
    );
    host.manager
        .drain_continuable_children(&host.parent, std::slice::from_ref(&child_id))
        .await
        .expect("drained");
    assert!(!host.manager.is_resident(&child_id));
    host.parent.when_idle().await;
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        block_texts(&notices[0].content),
        vec![
            "Background subagent child was stopped before it finished.".to_owned(),
            "Its closing message:".to_owned(),
            "child reply".to_owned(),
        ]
    );
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Aborted);
    assert_eq!(
        ends[0].last_assistant_message.as_deref().map(block_texts),
        Some(vec!["child reply".to_owned()])
    );
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"], "the follow-up is not logged");
    drop(listener);
    host.finish().await;
}

/// spec: CONT-76 — a parent Activation in maintenance while its two children settle stays
/// resident — its status is `idle` and it owns nothing any more, only the two accounted notices
/// (accepted, their wakes latched) keep it from settling — then, once the maintenance ends, reads
/// both notices in settlement order (the second-started child settled first) and settles itself:
/// its own parent gets its notice.
#[tokio::test(start_paused = true)]
async fn cont_76_parent_in_maintenance_reads_both_notices_then_settles() {
    let (host, agents, listener) = maintenance_host(by_session(8), &["p"]).await;
    let (p_gate, p_hook) = gate(&host, "p");
    let (c1_gate, c1_hook) = gate(&host, "c1");
    let (c2_gate, c2_hook) = gate(&host, "c2");
    let p_id = start_reserved(&host, "p").await;
    let p = agents.agent("p");
    for id in ["c1", "c2"] {
        let mut spec = ContinuableStartSpec::new(
            "spawn",
            "helper",
            vec![ContentBlock::text(format!("{id} task"))],
            p.clone() as AgentRef,
        );
        spec.child_id = Some(SessionId::from(id));
        host.manager
            .start_continuable(spec)
            .await
            .expect("started under p");
    }
    p_gate.send(true).unwrap();
    yield_a_while().await;
    assert!(p.in_maintenance(), "p's first turn ended into maintenance");
    c2_gate.send(true).unwrap();
    yield_a_while().await;
    c1_gate.send(true).unwrap();
    yield_a_while().await;
    let (c1, c2) = (SessionId::from("c1"), SessionId::from("c2"));
    assert!(!host.manager.is_resident(&c1) && !host.manager.is_resident(&c2));
    assert!(
        host.manager.is_resident(&p_id),
        "the accounted notices keep the idle parent resident"
    );
    assert_eq!(p.status(), AgentStatus::Idle);
    let pending: Vec<String> = p
        .inbox()
        .next_turn
        .iter()
        .map(|m| block_texts(&m.content)[0].clone())
        .collect();
    assert_eq!(
        pending,
        [
            "Background subagent c2 finished and will do no further work unless you send it more.",
            "Background subagent c1 finished and will do no further work unless you send it more.",
        ]
    );
    assert!(notice_lines(&live_log(&p.inner)).is_empty(), "unread so far");
    p.end_maintenance();
    host.settle().await;
    host.parent.when_idle().await;
    host.settle().await;
    let log = host.persisted(&p_id).await;
    assert_eq!(notice_lines(&log.events), pending, "read in settlement order");
    let ended: Vec<String> = host
        .ends()
        .iter()
        .map(|e| e.info.id.as_str().to_owned())
        .collect();
    assert_eq!(ended, ["c2", "c1", "p"]);
    assert_eq!(host.ends()[2].stop_reason, StopReason::Completed);
    assert_eq!(
        notice_lines(&live_log(&host.parent)),
        ["Background subagent p finished and will do no further work unless you send it more."]
    );
    drop((listener, p_hook, c1_hook, c2_hook));
    host.finish().await;
}
