//! Host code that panics where the continuation manager calls it (agents, runtimes, stores are
//! third-party code): each panic is contained as a typed error or a recorded teardown failure;
//! none reaches the caller, loops a caller for ever, or leaves a child resident, running or
//! registered.

use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use agent::{Agent, AgentError, InboxSnapshot, InboxTarget, Message, MessageId};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::*;
use crate::model_text::settlement_outcome_line;

/// Where a [`FaultyAgent`] panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// `when_idle` panics: a child whose idleness the manager cannot observe.
    Idle,
    /// The future `when_idle` returns panics once the agent was cancelled: a teardown waiting
    /// for the child to be idle.
    IdleAfterCancel,
    /// `send` panics for a settlement notice: a parent that cannot take its child's notice.
    SendNotice,
    /// `send` panics for a message with this text.
    SendText(&'static str),
    /// `cancel` panics without cancelling anything.
    Cancel,
    /// `send` panics for a child's report: a parent that cannot take it.
    SendReport,
    /// `session` panics once the agent was cancelled: a teardown that cannot read the epoch's
    /// terminal facts (its capture fails).
    SessionAfterCancel,
    /// `session` always panics: a child whose log the manager cannot read when it installs the
    /// child's first epoch.
    Session,
    /// `status` always panics: a child whose status the settlement watcher cannot read.
    Status,
}

/// A host agent over a live reference agent that panics as its [`Fault`] says and otherwise
/// delegates.
struct FaultyAgent {
    inner: AgentRef,
    fault: Fault,
    cancelled: AtomicBool,
}

impl Agent for FaultyAgent {
    fn id(&self) -> &SessionId {
        self.inner.id()
    }
    fn options(&self) -> &AgentOptions {
        self.inner.options()
    }
    fn session(&self) -> &Arc<agent::Session> {
        if self.fault == Fault::SessionAfterCancel && self.cancelled.load(AtomicOrdering::SeqCst) {
            panic!("the child's log exploded");
        }
        if self.fault == Fault::Session {
            panic!("the child's log exploded at residency");
        }
        self.inner.session()
    }
    fn scope(&self) -> &Arc<agent::Scope> {
        self.inner.scope()
    }
    fn send(&self, message: Message, target: InboxTarget, wake: bool) -> Result<MessageId, AgentError> {
        if self.fault == Fault::SendNotice && message.source.kind() == "subagent-settled" {
            panic!("the parent's send exploded");
        }
        if self.fault == Fault::SendReport && message.source.kind() == "subagent-report" {
            panic!("the parent's send exploded");
        }
        if matches!(self.fault, Fault::SendText(text) if visible_text(&message.content) == text) {
            panic!("the child's send exploded");
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
        if self.fault == Fault::Cancel {
            panic!("cancel exploded");
        }
        self.cancelled.store(true, AtomicOrdering::SeqCst);
        self.inner.cancel(cause, options);
    }
    fn status(&self) -> AgentStatus {
        if self.fault == Fault::Status {
            panic!("status exploded");
        }
        self.inner.status()
    }
    fn when_idle(&self) -> BoxFuture<'static, ()> {
        if self.fault == Fault::Idle {
            panic!("when_idle exploded");
        }
        if self.fault == Fault::IdleAfterCancel && self.cancelled.load(AtomicOrdering::SeqCst) {
            return async { panic!("when_idle exploded") }.boxed();
        }
        self.inner.when_idle()
    }
    fn is_live(&self) -> bool {
        self.inner.is_live()
    }
}

/// The disposer of a [`FaultyRuntime`] handle: the runtime's own handle.
struct Delegating(AgentHandle);

impl agent::Disposer for Delegating {
    fn dispose(&self) -> BoxFuture<'static, ()> {
        self.0.dispose()
    }
}

/// A host runtime whose agents *created* with an id in `faults` are [`FaultyAgent`]s (resumed
/// agents are the runtime's own). The manager sees agents only through this runtime, so it gets
/// the faulty agent from `create` and, while it is live, from `get`.
struct FaultyRuntime {
    inner: Arc<dyn AgentRuntime>,
    faults: Vec<(SessionId, Fault)>,
    created: Mutex<Vec<Arc<FaultyAgent>>>,
    /// While set, `create` and `resume` panic.
    panicking: AtomicBool,
    /// While set, `get` of this id panics.
    panicking_get: Mutex<Option<SessionId>>,
}

#[async_trait]
impl AgentRuntime for FaultyRuntime {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, AgentError> {
        if self.panicking.load(AtomicOrdering::SeqCst) {
            panic!("the runtime's create exploded");
        }
        let fault = self
            .faults
            .iter()
            .find(|(id, _)| id == &options.session_id)
            .map(|(_, fault)| *fault);
        let handle = self.inner.create(options).await?;
        let Some(fault) = fault else { return Ok(handle) };
        let agent = Arc::new(FaultyAgent {
            inner: handle.agent().clone(),
            fault,
            cancelled: AtomicBool::new(false),
        });
        self.created.lock().push(agent.clone());
        Ok(AgentHandle::new(agent, Arc::new(Delegating(handle))))
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, AgentError> {
        if self.panicking.load(AtomicOrdering::SeqCst) {
            panic!("the runtime's resume exploded");
        }
        self.inner.resume(options).await
    }
    fn get(&self, id: &SessionId) -> Option<AgentRef> {
        if self.panicking_get.lock().as_ref() == Some(id) {
            panic!("the runtime's get exploded");
        }
        let live = self.inner.get(id)?;
        let faulty = self
            .created
            .lock()
            .iter()
            .find(|a| Arc::ptr_eq(&a.inner, &live))
            .map(|a| a.clone() as AgentRef);
        Some(faulty.unwrap_or(live))
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

/// A [`Host`] whose manager creates the children named in `faults` as [`FaultyAgent`]s.
async fn faulty_host(script: Vec<ScriptEntry>, faults: &[(&str, Fault)]) -> (Host, Arc<FaultyRuntime>) {
    faulty_host_over(script, faults, |runtime| runtime).await
}

/// [`faulty_host`] over the host's runtime as `wrap` wraps it (the faulty agents are built over
/// the handles the wrapped runtime creates).
async fn faulty_host_over(
    script: Vec<ScriptEntry>,
    faults: &[(&str, Fault)],
    wrap: impl FnOnce(Arc<dyn AgentRuntime>) -> Arc<dyn AgentRuntime>,
) -> (Host, Arc<FaultyRuntime>) {
    let mut host = Host::new(script).await;
    let mut services = host.runtime.services().clone();
    let agents = Arc::new(FaultyRuntime {
        inner: wrap(services.agents.clone()),
        faults: faults
            .iter()
            .map(|(id, fault)| (SessionId::from(*id), *fault))
            .collect(),
        created: Mutex::new(Vec::new()),
        panicking: AtomicBool::new(false),
        panicking_get: Mutex::new(None),
    });
    services.agents = agents.clone();
    host.manager = ContinuationManager::new(host.service.clone(), services);
    (host, agents)
}

/// How long (paused) a call of these tests may take before it counts as hung.
const PATIENCE: Duration = Duration::from_secs(10);

/// `fut`'s output, or `None` once `limit` of paused time has passed. `fut` is polled once per
/// paused millisecond, between sleeps, so that a busy loop also turns into a failure instead of a
/// hang (`tokio::time::timeout` cannot interrupt one: a task that keeps waking itself keeps the
/// paused clock from advancing).
async fn within<F: Future>(limit: Duration, fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if let std::task::Poll::Ready(output) = futures::poll!(fut.as_mut()) {
            return Some(output);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

/// The child is released (neither resident nor registered) and its one epoch ended `error`.
fn assert_released_in_error(host: &Host, child_id: &SessionId) {
    assert!(!host.manager.is_resident(child_id));
    assert!(host.get(child_id).is_none());
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Error);
}

/// spec: CONT-35 — a selected drain with a failing teardown boundary rejects
/// `ACTIVATION_TEARDOWN_FAILED` yet still removes the child; here the boundary is the wait for
/// the child to be idle (the host agent's `when_idle` panics), the rejection names the panic and
/// the end edge reports `error`. A follow-up routed
/// while that teardown is under way waits for it and routes again: it cold-resumes the released
/// child and is delivered. (The panic abandoned the transaction with the Activation still in the
/// live map, and the follow-up re-routed to that finished disposal for ever.)
#[tokio::test(start_paused = true)]
async fn a_panicking_when_idle_in_teardown_still_releases_the_child() {
    let (host, _agents) = faulty_host(by_session(6), &[("child", Fault::IdleAfterCancel)]).await;
    let (held, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let drain = host
        .manager
        .drain_continuable_children(&host.parent, std::slice::from_ref(&child_id));
    let followup = within(
        PATIENCE,
        host.manager
            .followup(&host.parent, &child_id, vec![ContentBlock::text("after")]),
    )
    .await
    .expect("the follow-up resolved instead of looping");
    followup.expect("the follow-up cold-resumed the released child");
    let err = drain.await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ActivationTeardownFailed, "{err}");
    assert!(err.to_string().contains("when_idle exploded"), "{err}");
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Error);
    held.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    host.settle().await;
    assert_eq!(host.starts().len(), 2, "the follow-up opened a second epoch");
    assert_eq!(host.ends()[1].stop_reason, StopReason::Completed);
    // The first prompt, held at its pre-step, went with the drained turn.
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["after"]);
    drop(hook);
    host.finish().await;
}

/// spec: CONT-82 — a parent whose `send` *panics* on the settlement notice (a host agent, here a
/// resident continuable child taking its grandchild's notice) is treated like a parent send that
/// throws: logged as not delivered, the failed delivery is taken back out of the parent's
/// accounting and the ownership edge released, so the parent still settles; both end edges say
/// `completed`. (The panic abandoned the grandchild's transaction after its removal: no end edge,
/// and the parent kept owning the grandchild and expecting the notice, `running` for ever.)
#[tokio::test(start_paused = true)]
async fn a_panicking_parent_send_during_notice_delivery_is_contained() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let (host, agents) = faulty_host(by_session(10), &[("child", Fault::SendNotice)]).await;
    let (child_gate, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    let child = agents.get(&child_id).expect("the child is live");
    let gc_id = start_grandchild(&host, &child).await;
    yield_a_while().await;
    settle_with_one_undelivered_notice(&host, &warnings, &child_gate, &child, &child_id, &gc_id).await;
    drop(hook);
    host.finish().await;
}

/// spec: CONT-82 — a settlement notice whose delivery fails because the host runtime's `get`
/// *panics* while the manager resolves the parent (here a resident continuable child taking its
/// grandchild's notice) is logged as not delivered and never breaks the teardown: the ownership
/// edge is released, so the parent still settles, and both epochs get their end edges. (The
/// panic abandoned the grandchild's transaction after its removal: no end edge, and the parent
/// kept owning the grandchild, `waiting` for ever.)
#[tokio::test(start_paused = true)]
async fn a_panicking_parent_lookup_during_notice_delivery_is_contained() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let (host, agents) = faulty_host(by_session(10), &[]).await;
    let (child_gate, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    let child = agents.get(&child_id).expect("the child is live");
    let gc_id = start_grandchild(&host, &child).await;
    *agents.panicking_get.lock() = Some(child_id.clone());
    within(PATIENCE, async {
        while host.manager.is_resident(&gc_id) || host.ends().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the grandchild's epoch ended");
    *agents.panicking_get.lock() = None;
    settle_with_one_undelivered_notice(&host, &warnings, &child_gate, &child, &child_id, &gc_id).await;
    drop(hook);
    host.finish().await;
}

/// A child whose host agent's `when_idle` panics (so the manager can never see it
/// settle) is torn down instead of staying resident: the failure is logged, the Activation is
/// removed and the agent released, its notice says "failed before it finished." with no closing
/// message, and its end edge reports `error` — at once, not when its turn ends, which the manager
/// could only find out by polling. A later follow-up cold-resumes the child. (The panic killed
/// the settlement watcher: the child stayed resident, and its parent waiting, for ever.)
#[tokio::test(start_paused = true)]
async fn a_child_whose_when_idle_panics_is_torn_down_instead_of_pinned() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let (host, _agents) = faulty_host(by_session(6), &[("child", Fault::Idle)]).await;
    let (_held, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    // Released while its first turn is still held. (Only yields: a watcher polling the panicking
    // `when_idle` in a busy loop would keep the paused clock from advancing.)
    for _ in 0..1000 {
        if !host.manager.is_resident(&child_id) {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        !host.manager.is_resident(&child_id),
        "the held child was torn down"
    );
    drop(hook);
    host.settle().await;
    host.parent.when_idle().await;
    assert!(host.get(&child_id).is_none());
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Error);
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        block_texts(&notices[0].content),
        vec![
            "Background subagent child failed before it finished.".to_owned(),
            "It left no closing message.".to_owned(),
        ]
    );
    let logged = warnings.messages();
    assert!(
        logged.iter().any(|w| w.contains("when_idle panicked")),
        "{logged:?}"
    );
    host.cold_resume_and_settle(&child_id, "again").await;
    assert_eq!(host.ends().len(), 2);
    assert_eq!(host.ends()[1].stop_reason, StopReason::Completed);
    host.finish().await;
}

/// A child whose host agent's `status` panics (so the settlement watcher cannot tell whether it
/// is quiescent) is torn down like one whose `when_idle` panics, instead of staying resident: the
/// failure is logged, the Activation is removed and the agent released, the parent gets the
/// settlement notice and the epoch its end edge. A later follow-up cold-resumes the child. (The
/// panic killed the settlement watcher: the child stayed resident and registered, with no end
/// edge and no notice, and an owning parent Activation would have waited for ever.)
#[tokio::test(start_paused = true)]
async fn a_child_whose_status_panics_is_torn_down_instead_of_pinned() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let (host, _agents) = faulty_host(by_session(6), &[("child", Fault::Status)]).await;
    let child_id = start_reserved(&host, "child").await;
    within(PATIENCE, async {
        host.settle().await;
        host.parent.when_idle().await;
        host.settle().await;
    })
    .await
    .expect("the child was released");
    assert!(host.get(&child_id).is_none());
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        block_texts(&notices[0].content)[0],
        settlement_outcome_line(child_id.as_str(), &ends[0].stop_reason)
    );
    let logged = warnings.messages();
    assert!(logged.iter().any(|w| w.contains("status panicked")), "{logged:?}");
    host.cold_resume_and_settle(&child_id, "again").await;
    assert_eq!(host.ends().len(), 2);
    assert_eq!(host.ends()[1].stop_reason, StopReason::Completed);
    host.finish().await;
}

/// A follow-up routed to a child whose teardown *ended without releasing its Activation* rejects
/// `ACTIVATION_TEARDOWN_FAILED`, with the teardown's failure as its source, instead of waiting for
/// that finished teardown and routing to the same Activation again for ever. No known host fault
/// abandons a transaction any more, so the abandoned transaction is installed directly: one that
/// fails at once and releases nothing.
#[tokio::test(start_paused = true)]
async fn a_followup_to_an_activation_its_teardown_left_behind_fails() {
    let host = Host::new(by_session(6)).await;
    let (_held, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let inner = &host.manager.inner;
    let activation = inner.activations.lock().get(&child_id).cloned().unwrap();
    let abandoned = activation.open_disposal(&inner.tasks, |_| {
        futures::future::ready(Err(Arc::new(SubagentError::new(
            SubagentErrorCode::ActivationTeardownFailed,
            "activation teardown was abandoned",
        )) as crate::error::SharedError))
        .boxed()
    });
    abandoned.await.unwrap_err();
    let err = within(
        PATIENCE,
        host.manager
            .followup(&host.parent, &child_id, vec![ContentBlock::text("lost")]),
    )
    .await
    .expect("the follow-up resolved instead of looping")
    .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ActivationTeardownFailed, "{err}");
    assert!(err.to_string().contains("without releasing"), "{err}");
    let cause = std::error::Error::source(&err).expect("the teardown's failure is the source");
    assert!(cause.to_string().contains("abandoned"), "{cause}");
    assert!(!child_inbox_holds(&host, &child_id, "lost"));
    // Release what the abandoned transaction left, as its owner would have.
    inner.activations.lock().remove(&child_id);
    activation.dispose_handle().await.unwrap();
    drop(hook);
    host.finish().await;
}

fn child_inbox_holds(host: &Host, child_id: &SessionId, text: &str) -> bool {
    host.get(child_id).is_some_and(|child| {
        let inbox = child.inbox();
        inbox
            .next_turn
            .iter()
            .chain(&inbox.next_step)
            .any(|m| visible_text(&m.content) == text)
    })
}

/// `fut`'s output, or the message of a panic that unwound out of it (into its caller).
async fn no_unwind<F: Future>(fut: F) -> Result<F::Output, String> {
    std::panic::AssertUnwindSafe(fut)
        .catch_unwind()
        .await
        .map_err(|payload| agent::bus::panic_message(&*payload))
}

/// spec: CONT-48 — an inbox send that *panics* (a host agent) rejects the follow-up with a typed
/// error instead of unwinding into the caller, and leaves nothing accepted: the running epoch is
/// untouched, the message is not logged, and once the running turn ends the child settles on its
/// own. (The panic unwound with the message id already in the accepted set, which held the child
/// `running` for ever.)
#[tokio::test(start_paused = true)]
async fn a_panicking_send_rejects_the_followup_and_leaves_nothing_accepted() {
    let (host, _agents) = faulty_host(by_session(10), &[("child", Fault::SendText("explode"))]).await;
    let (child_gate, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let err = no_unwind(
        host.manager
            .followup(&host.parent, &child_id, vec![ContentBlock::text("explode")]),
    )
    .await
    .expect("the panic stayed out of the caller")
    .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ProviderFailed, "{err}");
    assert!(err.to_string().contains("the child's send exploded"), "{err}");
    assert!(
        host.manager.is_resident(&child_id),
        "the running epoch is untouched"
    );
    child_gate.send(true).unwrap();
    within(PATIENCE, async {
        host.settle().await;
        host.parent.when_idle().await;
    })
    .await
    .expect("the child settled");
    assert!(host.get(&child_id).is_none());
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Completed);
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    drop(hook);
    host.finish().await;
}

/// The same for the first prompt: a start whose submission panics rejects with a typed error
/// and releases the fresh child (nothing resident, the agent unregistered). (The panic unwound
/// into the caller and left the child resident and `running` for ever.)
#[tokio::test(start_paused = true)]
async fn a_panicking_send_of_the_first_prompt_rejects_the_start() {
    let (host, _agents) = faulty_host(by_session(4), &[("child", Fault::SendText("explode"))]).await;
    let mut spec = host.spec("explode");
    spec.child_id = Some(SessionId::from("child"));
    let err = no_unwind(host.manager.start_continuable(spec))
        .await
        .expect("the panic stayed out of the caller")
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ProviderFailed, "{err}");
    assert!(err.to_string().contains("the child's send exploded"), "{err}");
    within(PATIENCE, host.settle())
        .await
        .expect("nothing stays resident");
    assert!(host.get(&SessionId::from("child")).is_none());
    host.finish().await;
}

/// Persistence over a [`MemoryStore`] whose `inspect` or `load` of any session but the parent's
/// panics while armed: a misbehaving host store reached from cold resume and reserved starts.
struct PanickingReads {
    store: Arc<MemoryStore>,
    inspect: AtomicBool,
    load: AtomicBool,
}

#[async_trait]
impl SessionPersistence for PanickingReads {
    fn create(&self, header: &agent::SessionHeader) -> Result<(), AgentError> {
        SessionPersistence::create(self.store.as_ref(), header)
    }
    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        SessionPersistence::append(self.store.as_ref(), id, event)
    }
    async fn flush(&self, id: &SessionId) -> Result<(), AgentError> {
        SessionPersistence::flush(self.store.as_ref(), id).await
    }
    async fn list(&self) -> Result<Vec<agent::SessionHeader>, AgentError> {
        SessionPersistence::list(self.store.as_ref()).await
    }
    async fn inspect(&self, id: &SessionId) -> Result<Option<agent::SessionHeader>, AgentError> {
        if id.as_str() != "parent" && self.inspect.load(AtomicOrdering::SeqCst) {
            panic!("the store's inspect exploded");
        }
        SessionPersistence::inspect(self.store.as_ref(), id).await
    }
    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, AgentError> {
        if id.as_str() != "parent" && self.load.load(AtomicOrdering::SeqCst) {
            panic!("the store's load exploded");
        }
        SessionPersistence::load(self.store.as_ref(), id).await
    }
}

/// spec: CONT-22 — a cold resume whose store read *panics* (the host's `inspect`, then its
/// `load`) rejects `NOT_RESUMABLE` ("unavailable", the contained panic as the source) instead of
/// unwinding into the caller; nothing becomes resident, no epoch starts, and once the store
/// behaves the same follow-up cold-resumes. A reserved-id start whose catalog check panics
/// rejects with a typed error too, creating nothing.
#[tokio::test(start_paused = true)]
async fn panicking_store_reads_reject_cold_resume_and_reserved_starts() {
    let store = Arc::new(MemoryStore::new());
    let reads = Arc::new(PanickingReads {
        store: store.clone(),
        inspect: AtomicBool::new(false),
        load: AtomicBool::new(false),
    });
    let persistence: Arc<dyn SessionPersistence> = reads.clone();
    let host = Host::build_on(by_session(6), store, Some(persistence), true, routed(), false).await;
    let child_id = start_reserved(&host, "child").await;
    host.settle().await;
    host.parent.when_idle().await;
    for (read, armed) in [("inspect", &reads.inspect), ("load", &reads.load)] {
        armed.store(true, AtomicOrdering::SeqCst);
        let err = no_unwind(
            host.manager
                .followup(&host.parent, &child_id, vec![ContentBlock::text("lost")]),
        )
        .await
        .unwrap_or_else(|panic| panic!("{read}: the panic reached the caller: {panic}"))
        .unwrap_err();
        assert_eq!(err.code(), SubagentErrorCode::NotResumable, "{read}: {err}");
        assert!(err.to_string().contains("unavailable"), "{read}: {err}");
        let cause = std::error::Error::source(&err).map(ToString::to_string);
        assert!(
            cause
                .as_deref()
                .is_some_and(|c| c.contains(&format!("the store's {read} exploded"))),
            "{read}: {cause:?}"
        );
        assert!(host.manager.resident().is_empty(), "{read}");
        armed.store(false, AtomicOrdering::SeqCst);
    }
    assert_eq!(host.starts().len(), 1, "no epoch started");
    reads.inspect.store(true, AtomicOrdering::SeqCst);
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("reserved"));
    let err = no_unwind(host.manager.start_continuable(spec))
        .await
        .expect("the panic stayed out of the caller")
        .unwrap_err();
    assert!(err.to_string().contains("the store's inspect exploded"), "{err}");
    assert!(host.get(&SessionId::from("reserved")).is_none());
    reads.inspect.store(false, AtomicOrdering::SeqCst);
    host.cold_resume_and_settle(&child_id, "again").await;
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task", "again"]);
    host.finish().await;
}

/// spec: CONT-35 — a selected drain with a failing teardown boundary rejects
/// `ACTIVATION_TEARDOWN_FAILED` yet still removes the child; here the boundary is the child's
/// cancel (the host agent's `cancel` panics without cancelling). The panic stays out of the
/// drain's caller, the teardown waits for the turn to end on its own, and then releases the
/// child; the end edge reports `error`. (The panic unwound into the drain's caller and abandoned
/// the transaction with the Activation resident for ever: no later drain could release it.)
#[tokio::test(start_paused = true)]
async fn a_panicking_cancel_in_teardown_is_recorded_and_the_child_released() {
    let (host, _agents) = faulty_host(by_session(6), &[("child", Fault::Cancel)]).await;
    let (child_gate, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let drain = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        host.manager
            .drain_continuable_children(&host.parent, std::slice::from_ref(&child_id))
    }))
    .expect("the panic stayed out of the caller");
    yield_a_while().await;
    assert!(
        host.manager.is_resident(&child_id),
        "the uncancelled turn is waited for"
    );
    child_gate.send(true).unwrap();
    let err = within(PATIENCE, drain)
        .await
        .expect("the drain resolved")
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ActivationTeardownFailed, "{err}");
    assert!(err.to_string().contains("cancel exploded"), "{err}");
    assert_released_in_error(&host, &child_id);
    drop(hook);
    host.parent.when_idle().await;
    host.finish().await;
}

/// A runtime whose `create` or `resume` *panics* fails the start (`PROVIDER_FAILED`, as for a
/// creation that failed) or the cold-resuming follow-up (spec: CONT-22 — `NOT_RESUMABLE`,
/// "unavailable", the contained panic as the source) with a typed error instead of unwinding
/// into the caller; nothing becomes resident or registered, no epoch starts, and once the runtime
/// behaves the same follow-up cold-resumes.
#[tokio::test(start_paused = true)]
async fn a_panicking_runtime_rejects_the_start_and_the_cold_resume() {
    let (host, agents) = faulty_host(by_session(6), &[]).await;
    let child_id = start_reserved(&host, "child").await;
    host.settle().await;
    host.parent.when_idle().await;
    let agent_count = host.agent_count();
    agents.panicking.store(true, AtomicOrdering::SeqCst);
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("fresh"));
    let err = no_unwind(host.manager.start_continuable(spec))
        .await
        .expect("the create's panic stayed out of the caller")
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ProviderFailed, "{err}");
    assert!(err.to_string().contains("the runtime's create exploded"), "{err}");
    let err = no_unwind(
        host.manager
            .followup(&host.parent, &child_id, vec![ContentBlock::text("lost")]),
    )
    .await
    .expect("the resume's panic stayed out of the caller")
    .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::NotResumable, "{err}");
    assert!(err.to_string().contains("unavailable"), "{err}");
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        cause
            .as_deref()
            .is_some_and(|c| c.contains("the runtime's resume exploded")),
        "{cause:?}"
    );
    assert!(host.manager.resident().is_empty());
    assert_eq!(host.agent_count(), agent_count);
    assert_eq!(host.starts().len(), 1, "no epoch started");
    agents.panicking.store(false, AtomicOrdering::SeqCst);
    host.cold_resume_and_settle(&child_id, "again").await;
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task", "again"]);
    host.finish().await;
}

/// spec: CONT-63 — a next-step report whose delivery *panics* (the resident parent's `send`, a
/// host agent) fails the report with `PARENT_UNAVAILABLE` (the contained panic as its source,
/// like a send that threw) instead of unwinding into the reporting child, and takes the report
/// back out of the parent's accounting: both epochs still settle, `completed`. (The panic left
/// the report's id in the parent's accepted set, holding the parent `running` for ever.)
#[tokio::test(start_paused = true)]
async fn a_panicking_report_delivery_fails_the_report_and_pins_nothing() {
    let (host, agents) = faulty_host(by_session(10), &[("child", Fault::SendReport)]).await;
    let (child_gate, child_hook) = gate(&host, "child");
    let (gc_gate, gc_hook) = gate(&host, "grandchild");
    let child_id = start_reserved(&host, "child").await;
    let child = agents.get(&child_id).expect("the child is live");
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("gc task")],
        child.clone(),
    );
    spec.child_id = Some(SessionId::from("grandchild"));
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    yield_a_while().await;
    let grandchild = host.get(&gc_id).expect("the grandchild is live");
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        host.manager.report_from(
            &grandchild,
            vec![ContentBlock::text("progress")],
            super::super::ReportDelivery::NextStep,
            &Signal::new(),
        )
    }))
    .expect("the panic stayed out of the reporter")
    .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ParentUnavailable, "{err}");
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        cause
            .as_deref()
            .is_some_and(|c| c.contains("the parent's send exploded")),
        "{cause:?}"
    );
    gc_gate.send(true).unwrap();
    child_gate.send(true).unwrap();
    within(PATIENCE, async {
        host.settle().await;
        host.parent.when_idle().await;
        host.settle().await;
    })
    .await
    .expect("both settled");
    let ends: Vec<(SessionId, StopReason)> = host
        .ends()
        .into_iter()
        .map(|e| (e.info.id, e.stop_reason))
        .collect();
    assert_eq!(
        ends,
        vec![(gc_id, StopReason::Completed), (child_id, StopReason::Completed)]
    );
    drop((child_hook, gc_hook));
    host.finish().await;
}

/// A child whose host agent's `session` panics when the manager reads the epoch boundary (the
/// last step of making it resident, after its ownership was registered) fails the start like a
/// host call that threw: `PROVIDER_FAILED` naming the panic, and the residency guard's rollback
/// runs — the child is disposed and unregistered, no start or end edge is emitted, no prompt is
/// sent, and a later manager drain has nothing left to do. (The panic unwound through the start
/// with the child resident and registered, and no epoch to end.)
#[tokio::test(start_paused = true)]
async fn a_panicking_child_session_at_residency_rolls_the_start_back() {
    let (host, _agents) = faulty_host(by_session(4), &[("child", Fault::Session)]).await;
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("child"));
    let err = within(PATIENCE, host.manager.start_continuable(spec))
        .await
        .expect("the start resolved")
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ProviderFailed, "{err}");
    assert!(
        err.to_string()
            .contains("the child agent panicked: the child's log exploded at residency"),
        "{err}"
    );
    host.settle().await;
    let child_id = SessionId::from("child");
    assert!(!host.manager.is_resident(&child_id));
    assert!(host.get(&child_id).is_none(), "the rollback disposed the child");
    assert!(host.starts().is_empty());
    assert!(host.ends().is_empty());
    assert_eq!(host.model.requests().len(), 0, "no prompt reached the child");
    host.manager.dispose_all().await.expect("a later drain succeeds");
    host.finish().await;
}

/// spec: CONT-55 — a capture failure (the host agent's `session` panics when the teardown reads
/// the epoch's terminal facts) makes the drain reject `ACTIVATION_TEARDOWN_FAILED` naming it, and
/// the end edge report `error` without a message; the child is still released and its parent
/// told it "failed before it finished". (The panic abandoned the transaction: the Activation
/// stayed resident and registered, with no end edge and no notice.)
#[tokio::test(start_paused = true)]
async fn cont_55_a_capture_failure_fails_the_drain_and_the_epoch() {
    let (host, _agents) = faulty_host(by_session(6), &[("child", Fault::SessionAfterCancel)]).await;
    let (_held, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let drain = host
        .manager
        .drain_continuable_children(&host.parent, std::slice::from_ref(&child_id));
    let err = within(PATIENCE, drain)
        .await
        .expect("the drain resolved")
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ActivationTeardownFailed, "{err}");
    assert!(err.to_string().contains("selected activation(s)"), "{err}");
    assert!(
        err.to_string()
            .contains("terminal facts could not be captured in its teardown: the child's log exploded"),
        "{err}"
    );
    assert_released_in_error(&host, &child_id);
    assert!(host.ends()[0].last_assistant_message.is_none());
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        block_texts(&notices[0].content),
        vec![
            "Background subagent child failed before it finished.".to_owned(),
            "It left no closing message.".to_owned(),
        ]
    );
    drop(hook);
    host.parent.when_idle().await;
    host.finish().await;
}

/// spec: CONT-56 — a capture failure and a handle-disposal failure of the same teardown combine
/// into one `ACTIVATION_TEARDOWN_FAILED` mentioning both ("at 2 boundaries"); the child is
/// removed (neither resident nor registered) and its epoch ends with `error`.
#[tokio::test(start_paused = true)]
async fn cont_56_capture_and_handle_disposal_failures_combine() {
    let (host, _agents) = faulty_host_over(
        by_session(6),
        &[("child", Fault::SessionAfterCancel)],
        |runtime| Arc::new(super::PanickingDisposal::every(runtime)),
    )
    .await;
    let (_held, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let drain = host
        .manager
        .drain_continuable_children(&host.parent, std::slice::from_ref(&child_id));
    let err = within(PATIENCE, drain)
        .await
        .expect("the drain resolved")
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ActivationTeardownFailed, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("\"child\" activation teardown failed at 2 boundaries"),
        "{text}"
    );
    assert!(text.contains("the child's log exploded"), "{text}");
    assert!(text.contains("the handle's disposal exploded"), "{text}");
    assert_released_in_error(&host, &child_id);
    drop(hook);
    host.parent.when_idle().await;
    host.finish().await;
}

/// An interrupt whose target agent's `cancel` *panics* (host code) fails with a typed
/// `PROVIDER_FAILED` naming the child and the panic instead of unwinding into the caller (a tool
/// call, a signal handler); nothing was cancelled: the child stays resident, its turn runs on to
/// its answer, and the parent hears of it as usual.
#[tokio::test(start_paused = true)]
async fn a_panicking_cancel_fails_the_interrupt_and_leaves_the_turn_running() {
    let (host, _agents) = faulty_host(by_session(6), &[("child", Fault::Cancel)]).await;
    let (child_gate, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let authority = super::super::InterruptAuthority::User {
        parent_session_id: SessionId::from("parent"),
    };
    let interrupted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        host.manager.interrupt(&child_id, &authority)
    }))
    .expect("the panic stayed out of the caller");
    let err = interrupted.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ProviderFailed, "{err}");
    assert!(err.to_string().contains("\"child\""), "{err}");
    assert!(err.to_string().contains("cancel exploded"), "{err}");
    assert!(host.manager.is_resident(&child_id));
    assert_eq!(host.get(&child_id).unwrap().status(), AgentStatus::Running);
    child_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    // The turn ran to its answer: not cancelled by the failed interrupt.
    let log = host.persisted(&child_id).await;
    let kinds: Vec<Value> = turn_end_reasons(&log.events)
        .iter()
        .map(|r| r["kind"].clone())
        .collect();
    assert_eq!(kinds, vec![json!("completed")]);
    assert!(
        log.events
            .iter()
            .any(|e| matches!(&e.data, EventData::AssistantMessage { message, .. }
            if visible_text(&message.content) == "child reply")),
        "the child answered"
    );
    // Its settlement tears the epoch down, whose cancel panics once more: recorded there, as in
    // `a_panicking_cancel_in_teardown_is_recorded_and_the_child_released`.
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert!(!host.manager.is_resident(&child_id));
    drop(hook);
    host.finish().await;
}

/// Starts the continuable grandchild `grandchild` below the resident `child`.
async fn start_grandchild(host: &Host, child: &AgentRef) -> SessionId {
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("gc task")],
        child.clone(),
    );
    spec.child_id = Some(SessionId::from("grandchild"));
    host.manager.start_continuable(spec).await.unwrap().0
}

/// Opens the child's gate and asserts what a lost grandchild notice leaves: both epochs ended
/// `completed` (grandchild first), no notice in the child, the child's own notice in the parent,
/// and exactly one "not delivered" warning.
async fn settle_with_one_undelivered_notice(
    host: &Host,
    warnings: &WarningCapture,
    child_gate: &tokio::sync::watch::Sender<bool>,
    child: &AgentRef,
    child_id: &SessionId,
    gc_id: &SessionId,
) {
    child_gate.send(true).unwrap();
    within(PATIENCE, async {
        host.settle().await;
        host.parent.when_idle().await;
        host.settle().await;
    })
    .await
    .expect("the child settled");
    let ends: Vec<(SessionId, StopReason)> = host
        .ends()
        .into_iter()
        .map(|e| (e.info.id, e.stop_reason))
        .collect();
    assert_eq!(
        ends,
        vec![
            (gc_id.clone(), StopReason::Completed),
            (child_id.clone(), StopReason::Completed)
        ]
    );
    assert!(notices(child).is_empty());
    assert_eq!(notices(&host.parent).len(), 1);
    let logged = warnings.messages();
    assert_eq!(
        logged
            .iter()
            .filter(|w| w.contains("settlement notice was not delivered to its parent"))
            .count(),
        1,
        "{logged:?}"
    );
}
