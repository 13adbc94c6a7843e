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

/// A `before_release` hook (see [`super::super::TestHooks`]) that, the first time an epoch of
/// the child `id` reaches its ownership release, sends that Activation on the returned receiver
/// and holds the release until the returned sender fires (or is dropped).
fn hold_release_of(
    host: &Host,
    id: &str,
) -> (
    tokio::sync::oneshot::Receiver<Arc<super::super::activation::Activation>>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (reached_tx, reached_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let held = Arc::new(Mutex::new(Some((reached_tx, release_rx))));
    let id = SessionId::from(id);
    *host.manager.inner.hooks.before_release.lock() = Some(Arc::new(
        move |activation: &Arc<super::super::activation::Activation>| {
            let taken = if activation.child_id == id {
                held.lock().take()
            } else {
                None
            };
            let activation = activation.clone();
            Box::pin(async move {
                if let Some((reached, release)) = taken {
                    let _ = reached.send(activation);
                    let _ = release.await;
                }
            })
        },
    ));
    (reached_rx, release_tx)
}

/// spec: CONT-26 — an epoch's ownership release (spec §2.14.6 step 10) removes only its own
/// registration: a follow-up that cold-resumes the grandchild as a new epoch after the old
/// epoch left the live map but before it released ownership keeps the new epoch owned by the
/// child, which therefore stays resident (waiting) until the new epoch settles; then both are
/// released. (Ownership was keyed by child id alone: the old epoch's release removed the new
/// epoch's registration, and the child could settle under its live grandchild.)
#[tokio::test(start_paused = true)]
async fn an_old_epochs_release_keeps_a_new_epochs_ownership() {
    let host = Host::new(by_session(12)).await;
    let (child_gate, child_hook) = gate(&host, "child");
    let (gc_gate, gc_hook) = gate(&host, "gc");
    gc_gate.send(true).unwrap();
    let mut spec = host.spec("child task");
    spec.child_id = Some(SessionId::from("child"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let child = host.get(&child_id).unwrap();
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("gc task")],
        child.clone(),
    );
    spec.child_id = Some(SessionId::from("gc"));
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let child_activation = activation(&host.manager, &child_id).unwrap();
    assert_eq!(child_activation.owned_children(), vec![gc_id.clone()]);
    let (reached, release) = hold_release_of(&host, "gc");
    child_gate.send(true).unwrap();
    // The first epoch of the grandchild settles: it is out of the live map, its notice is in
    // the child's inbox, and its ownership release is held.
    let old_epoch = reached
        .await
        .expect("the grandchild's first epoch reaches its release");
    assert!(!host.manager.is_resident(&gc_id));
    let old_disposal = old_epoch.disposal().expect("the first epoch is being disposed");
    // The new epoch below is held at its first step, so it stays resident throughout.
    gc_gate.send(false).unwrap();
    // Meanwhile the child follows up: the grandchild cold-resumes as a new epoch, owned anew.
    host.manager
        .followup(&child, &gc_id, vec![ContentBlock::text("gc again")])
        .await
        .expect("the grandchild cold-resumes");
    let new_epoch = activation(&host.manager, &gc_id).unwrap();
    assert!(!Arc::ptr_eq(&new_epoch, &old_epoch));
    assert_eq!(child_activation.owned_children(), vec![gc_id.clone()]);
    // The first epoch's release ends: the new epoch is still owned by the child.
    release.send(()).unwrap();
    old_disposal.await.expect("the first epoch's teardown succeeds");
    assert_eq!(
        child_activation.owned_children(),
        vec![gc_id.clone()],
        "the old epoch's release removed the new epoch's ownership"
    );
    assert!(host.manager.is_resident(&child_id));
    drop((old_epoch, new_epoch));
    gc_gate.send(true).unwrap();
    // Everything settles: the new epoch, then the child (whose own release is not held).
    host.settle().await;
    host.parent.when_idle().await;
    host.settle().await;
    assert!(child_activation.owned_children().is_empty());
    drop(child_activation);
    let log = host.persisted(&gc_id).await;
    assert_eq!(texts(&log.events), vec!["gc task", "gc again"]);
    assert_eq!(notices(&child).len(), 2, "one notice per grandchild epoch");
    let ends: Vec<SessionId> = host.ends().into_iter().map(|e| e.info.id).collect();
    assert_eq!(ends, vec![gc_id.clone(), gc_id, child_id]);
    assert_eq!(host.starts().len(), 3);
    drop((child_hook, gc_hook));
    host.finish().await;
}

/// A host runtime whose first created agent's handle disposal does not begin until released:
/// it reports on `entered` that it was reached, then waits for `release` (or its drop).
struct HeldDisposal {
    inner: Arc<dyn AgentRuntime>,
    held: Mutex<Option<HeldDisposer>>,
}

/// The hold of a [`HeldDisposal`] handle, and (once built) the runtime's own handle.
struct HeldDisposer {
    entered: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    release: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
    handle: Option<AgentHandle>,
}

impl agent::Disposer for HeldDisposer {
    fn dispose(&self) -> futures::future::BoxFuture<'static, ()> {
        let teardown = self.handle.as_ref().expect("built with its handle").dispose();
        let entered = self.entered.lock().take();
        let release = self.release.lock().take();
        Box::pin(async move {
            if let Some(entered) = entered {
                let _ = entered.send(());
            }
            if let Some(release) = release {
                let _ = release.await;
            }
            teardown.await;
        })
    }
}

#[async_trait]
impl AgentRuntime for HeldDisposal {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        let handle = self.inner.create(options).await?;
        let Some(mut held) = self.held.lock().take() else {
            return Ok(handle);
        };
        let agent = handle.agent().clone();
        held.handle = Some(handle);
        Ok(AgentHandle::new(agent, Arc::new(held)))
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.inner.resume(options).await
    }
    delegate_agent_lookups!(inner);
}

/// spec: CONT-23 — a follow-up routed to a child whose disposal is under way waits for that
/// disposal (spec §2.14.5) under its token: cancelled during the wait, it rejects `CANCELLED`
/// at once, while the disposal itself goes on and completes once the host's disposer returns;
/// the follow-up is never delivered. (The wait ignored the token: the cancelled follow-up
/// stayed pending until the disposal ended — for ever with a hung host disposer.)
#[tokio::test(start_paused = true)]
async fn a_followup_waiting_for_a_disposal_observes_its_cancellation() {
    let mut host = Host::new(by_session(6)).await;
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel();
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(HeldDisposal {
        inner: services.agents.clone(),
        held: Mutex::new(Some(HeldDisposer {
            entered: Mutex::new(Some(entered_tx)),
            release: Mutex::new(Some(release_rx)),
            handle: None,
        })),
    });
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("held"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    // The child settles; its disposal is held in the host's disposer.
    entered_rx.await.expect("the child's handle disposal is reached");
    assert!(host.manager.is_resident(&child_id));
    let signal = Signal::new();
    let mut followup = Box::pin(host.manager.followup_with(
        &host.parent,
        &child_id,
        vec![ContentBlock::text("again")],
        MessageSource::User,
        &signal,
    ));
    assert!(
        futures::poll!(followup.as_mut()).is_pending(),
        "the follow-up waits for the disposal"
    );
    signal.cancel(agent::CancelCause::User);
    let std::task::Poll::Ready(outcome) = futures::poll!(followup.as_mut()) else {
        panic!("the cancelled follow-up is still waiting for the disposal");
    };
    let err = outcome.expect_err("the cancelled follow-up rejects");
    assert_eq!(err.code(), SubagentErrorCode::Cancelled, "{err}");
    drop(followup);
    // The disposal was not cancelled with the wait: it is still under way, then completes.
    assert!(host.manager.is_resident(&child_id));
    release_tx.send(()).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    host.settle().await;
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    assert_eq!(host.starts().len(), 1);
    assert_eq!(host.ends().len(), 1);
    assert_eq!(notices(&host.parent).len(), 1);
    host.finish().await;
}

/// A host runtime that cancels the creation's token right after it created the agent `id` (the
/// runtime ignored the token): that start then fails its residency check and rolls back.
struct AbortAfterCreating {
    inner: Arc<dyn AgentRuntime>,
    id: SessionId,
}

#[async_trait]
impl AgentRuntime for AbortAfterCreating {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        let signal = options.signal.clone().filter(|_| options.session_id == self.id);
        let handle = self.inner.create(options).await?;
        if let Some(signal) = signal {
            signal.cancel(agent::CancelCause::User);
        }
        Ok(handle)
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.inner.resume(options).await
    }
    delegate_agent_lookups!(inner);
}

/// spec: CONT-26 — a rollback's ownership release (spec §2.14.6, the lighter transaction)
/// removes only the rolled-back epoch's own registration: a follow-up that cold-resumes the
/// grandchild after the rollback removed it from the live map (its starter dropped) but before
/// the rollback released ownership keeps the new epoch owned by the child. (Ownership was keyed
/// by child id alone: the rollback — whose epoch never even registered — removed the new
/// epoch's registration.)
#[tokio::test(start_paused = true)]
async fn a_rollbacks_release_keeps_a_new_epochs_ownership() {
    let mut host = Host::new(by_session(12)).await;
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(AbortAfterCreating {
        inner: services.agents.clone(),
        id: SessionId::from("gc"),
    });
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let (child_gate, child_hook) = gate(&host, "child");
    let (gc_gate, gc_hook) = gate(&host, "gc");
    let mut spec = host.spec("child task");
    spec.child_id = Some(SessionId::from("child"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let child = host.get(&child_id).unwrap();
    let child_activation = activation(&host.manager, &child_id).unwrap();
    let (reached, release) = hold_release_of(&host, "gc");
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("gc task")],
        child.clone(),
    );
    let gc_id = SessionId::from("gc");
    spec.child_id = Some(gc_id.clone());
    let mut start = Box::pin(host.manager.start_continuable(spec));
    let mut reached = std::pin::pin!(reached);
    // The start is refused after creation; its rollback reaches the release and is held there.
    let rolled_back = tokio::select! {
        outcome = start.as_mut() => panic!("the start finished before its rollback released: {outcome:?}"),
        rolled_back = reached.as_mut() => rolled_back.expect("the rollback reaches its release"),
    };
    assert!(!host.manager.is_resident(&gc_id));
    let rollback = rolled_back
        .disposal()
        .expect("the rollback is the epoch's disposal");
    // The starter goes away; the child follows up and the grandchild cold-resumes, owned anew.
    drop(start);
    host.manager
        .followup(&child, &gc_id, vec![ContentBlock::text("gc again")])
        .await
        .expect("the grandchild cold-resumes");
    let new_epoch = activation(&host.manager, &gc_id).unwrap();
    assert!(!Arc::ptr_eq(&new_epoch, &rolled_back));
    assert_eq!(child_activation.owned_children(), vec![gc_id.clone()]);
    release.send(()).unwrap();
    rollback.await.expect("the rollback succeeds");
    assert_eq!(
        child_activation.owned_children(),
        vec![gc_id.clone()],
        "the rollback's release removed the new epoch's ownership"
    );
    drop((rolled_back, new_epoch));
    child_gate.send(true).unwrap();
    gc_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    host.settle().await;
    assert!(child_activation.owned_children().is_empty());
    drop(child_activation);
    let log = host.persisted(&gc_id).await;
    assert_eq!(texts(&log.events), vec!["gc again"]);
    let ends: Vec<SessionId> = host.ends().into_iter().map(|e| e.info.id).collect();
    assert_eq!(ends, vec![gc_id, child_id]);
    drop((child_hook, gc_hook));
    host.finish().await;
}

/// A host runtime whose creation of the agent `id` does not begin until released: it reports
/// on `entered` that it was reached, then waits for `release` (or its drop).
struct HeldCreate {
    inner: Arc<dyn AgentRuntime>,
    id: SessionId,
    held: Mutex<
        Option<(
            tokio::sync::oneshot::Sender<()>,
            tokio::sync::oneshot::Receiver<()>,
        )>,
    >,
}

#[async_trait]
impl AgentRuntime for HeldCreate {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        let held = if options.session_id == self.id {
            self.held.lock().take()
        } else {
            None
        };
        if let Some((entered, release)) = held {
            let _ = entered.send(());
            let _ = release.await;
        }
        self.inner.create(options).await
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.inner.resume(options).await
    }
    delegate_agent_lookups!(inner);
}

/// spec: CONT-39 — a scoped drain and a start below its root installing its Activation, on two
/// threads: the drain's synchronous span (selection, closing, collection of the in-flight
/// materializations) and the start's residency never interleave. Here the start is let go on
/// while the drain is between selecting its targets and closing its root: its residency waits
/// for the drain's span, is refused `DRAINING` and rolled back, and the drain — which found
/// its in-flight record — resolves only once the child is gone. (Unserialized, the start
/// became resident in the middle of the drain — after the selection, which missed it, and
/// before the collection, its own record already dropped — and the drain resolved at once
/// with the child resident under the closed root, its first prompt accepted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_drain_never_resolves_under_a_child_becoming_resident() {
    let mut host = Host::new(vec![ScriptEntry::hang()]).await;
    let id = SessionId::from("inflight");
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel();
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(HeldCreate {
        inner: services.agents.clone(),
        id: id.clone(),
        held: Mutex::new(Some((entered_tx, release_rx))),
    });
    host.manager = ContinuationManager::new(host.service.clone(), services);
    // What lets the drain's span go on, once the start was let go: the start returned, or its
    // residency found the admission lock held by the drain's thread (and waits for it).
    let (progress_tx, progress_rx) = std::sync::mpsc::channel::<&'static str>();
    let residency = progress_tx.clone();
    let watched = id.clone();
    *host.manager.inner.hooks.residency.lock() = Some(Arc::new(
        move |activation: &Arc<super::super::activation::Activation>, contended: bool| {
            if contended && activation.child_id == watched {
                let _ = residency.send("the residency waits for the drain's span");
            }
        },
    ));
    let release = Mutex::new(Some(release_tx));
    let progress_rx = Mutex::new(progress_rx);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    *host.manager.inner.hooks.drain_selected.lock() = Some(Arc::new(move || {
        let Some(release) = release.lock().take() else {
            return;
        };
        // The drain has selected its targets (the child is not even in the live map yet) and
        // not closed its root: the start goes on now, on another thread.
        release.send(()).expect("the start is held in its creation");
        let progress = progress_rx.lock().recv().expect("the start goes on");
        sink.lock().push(progress);
    }));
    let mut spec = host.spec("task");
    spec.child_id = Some(id.clone());
    let manager = host.manager.clone();
    let start = tokio::spawn(async move {
        let outcome = manager.start_continuable(spec).await;
        let _ = progress_tx.send("the start returned");
        outcome
    });
    entered_rx.await.expect("the start reaches its creation");
    // The drain's synchronous span runs on a thread of its own (it blocks in the hook).
    let (manager, root) = (host.manager.clone(), host.parent.clone());
    let drain = tokio::task::spawn_blocking(move || {
        manager.drain_continuable_descendants(std::slice::from_ref(&root))
    })
    .await
    .expect("the drain's synchronous span");
    drain.await.expect("the drain resolves");
    assert!(
        host.manager.resident().is_empty(),
        "the drain resolved with {:?} resident under its closed root",
        host.manager.resident()
    );
    assert!(host.get(&id).is_none(), "the drain resolved with the child live");
    let err = start
        .await
        .expect("the start's task")
        .expect_err("the start is refused");
    assert_eq!(err.code(), SubagentErrorCode::Draining, "{err}");
    assert_eq!(*seen.lock(), vec!["the residency waits for the drain's span"]);
    assert!(host.starts().is_empty() && host.ends().is_empty());
    assert_eq!(host.model.requests().len(), 0);
    *host.manager.inner.hooks.residency.lock() = None;
    *host.manager.inner.hooks.drain_selected.lock() = None;
    host.finish().await;
}

/// spec: CONT-39 — the other order: a start admitted to residency (its admission checks passed)
/// on one thread, a scoped drain of its root beginning on another before the residency is
/// done: the drain's span waits for the whole residency, then selects the child — fully
/// resident, its ancestry recorded — and tears it down, so the drain resolves only once the
/// child is gone. (The residency's span covered its admission checks and ownership only: the
/// drain, falling between that span and the recording of the ancestry, did not select the child,
/// waited only for its in-flight record — dropped once the child was resident — and resolved
/// with the child resident under the closed root.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_drain_tears_down_a_child_admitted_before_it() {
    let mut host = Host::new(vec![ScriptEntry::hang()]).await;
    let id = SessionId::from("admitted");
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel();
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(HeldDisposal {
        inner: services.agents.clone(),
        held: Mutex::new(Some(HeldDisposer {
            entered: Mutex::new(Some(entered_tx)),
            release: Mutex::new(Some(release_rx)),
            handle: None,
        })),
    });
    host.manager = ContinuationManager::new(host.service.clone(), services);
    // What lets the residency go on, once the drain began: the drain's span found the
    // admission lock held by the residency's thread (and waits for it), or it is over.
    let (progress_tx, progress_rx) = std::sync::mpsc::channel::<&'static str>();
    let drain_span = progress_tx.clone();
    *host.manager.inner.hooks.drain_span.lock() = Some(Arc::new(move |contended: bool| {
        if contended {
            let _ = drain_span.send("the drain's span waits for the residency");
        }
    }));
    let (admitted_tx, admitted_rx) = tokio::sync::oneshot::channel();
    let admitted = Mutex::new(Some((admitted_tx, progress_rx)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let watched = id.clone();
    *host.manager.inner.hooks.admitted.lock() = Some(Arc::new(
        move |activation: &Arc<super::super::activation::Activation>| {
            if activation.child_id != watched {
                return;
            }
            let Some((reached, progress)) = admitted.lock().take() else {
                return;
            };
            reached.send(()).expect("the test waits for the residency");
            let progress = progress.recv().expect("the drain goes on");
            sink.lock().push(progress);
        },
    ));
    let mut spec = host.spec("task");
    spec.child_id = Some(id.clone());
    let start = tokio::spawn(host.manager.start_continuable(spec));
    admitted_rx
        .await
        .expect("the start's residency passes its admission checks");
    // The drain's synchronous span runs on a thread of its own (it may wait for the lock).
    let (manager, root) = (host.manager.clone(), host.parent.clone());
    let drain = tokio::task::spawn_blocking(move || {
        manager.drain_continuable_descendants(std::slice::from_ref(&root))
    })
    .await
    .expect("the drain's synchronous span");
    let _ = progress_tx.send("the drain's span is over");
    let mut drain = std::pin::pin!(drain);
    let mut entered = std::pin::pin!(entered_rx);
    let drained_first = tokio::select! {
        biased;
        outcome = drain.as_mut() => {
            outcome.expect("the drain resolves");
            true
        }
        held = entered.as_mut() => {
            held.expect("the child's handle disposal is reached");
            false
        }
    };
    assert!(
        !drained_first,
        "the drain resolved with the child resident under its closed root (resident: {:?})",
        host.manager.resident()
    );
    // The drain waits for the child's teardown, held in the host's disposer.
    assert!(host.manager.is_resident(&id));
    release_tx.send(()).unwrap();
    drain.await.expect("the drain resolves");
    assert!(!host.manager.is_resident(&id));
    assert!(host.get(&id).is_none(), "the drain resolved with the child live");
    assert_eq!(*seen.lock(), vec!["the drain's span waits for the residency"]);
    // The first prompt was accepted before the drain's span or refused after it.
    match start.await.expect("the start's task") {
        Ok((child, _)) => assert_eq!(child, id),
        Err(e) => assert_eq!(e.code(), SubagentErrorCode::Draining, "{e}"),
    }
    assert_eq!(host.starts().len(), 1);
    assert_eq!(host.ends().len(), 1);
    *host.manager.inner.hooks.drain_span.lock() = None;
    *host.manager.inner.hooks.admitted.lock() = None;
    host.finish().await;
}

/// A host runtime whose first resumed agent's handle disposal does not begin until released
/// (see [`HeldDisposer`]).
struct HeldResumedDisposal {
    inner: Arc<dyn AgentRuntime>,
    held: Mutex<Option<HeldDisposer>>,
}

#[async_trait]
impl AgentRuntime for HeldResumedDisposal {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.inner.create(options).await
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        let handle = self.inner.resume(options).await?;
        let Some(mut held) = self.held.lock().take() else {
            return Ok(handle);
        };
        let agent = handle.agent().clone();
        held.handle = Some(handle);
        Ok(AgentHandle::new(agent, Arc::new(held)))
    }
    delegate_agent_lookups!(inner);
}

/// A host whose child `held` ran one epoch and settled, and whose next (cold-resumed) epoch's
/// handle disposal is held: reports on the returned receiver when it is reached, and waits
/// for the returned sender.
async fn settled_child_with_held_resume_disposal() -> (
    Host,
    SessionId,
    tokio::sync::oneshot::Receiver<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let mut host = Host::new(by_session(8)).await;
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let (release_tx, release_rx) = tokio::sync::oneshot::channel();
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(HeldResumedDisposal {
        inner: services.agents.clone(),
        held: Mutex::new(Some(HeldDisposer {
            entered: Mutex::new(Some(entered_tx)),
            release: Mutex::new(Some(release_rx)),
            handle: None,
        })),
    });
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("held"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    host.settle().await;
    assert_eq!(host.ends().len(), 1);
    (host, child_id, entered_rx, release_tx)
}

/// After the held release of the refused epoch was let go: everything ends empty — the epoch
/// released with its end edge and no notice, the follow-up never delivered.
async fn the_refused_epoch_is_released(host: Host, child_id: &SessionId) {
    host.settle().await;
    host.parent.when_idle().await;
    host.settle().await;
    assert!(!host.manager.is_resident(child_id));
    assert!(host.get(child_id).is_none());
    let log = host.persisted(child_id).await;
    assert_eq!(
        texts(&log.events),
        vec!["task"],
        "the follow-up was never delivered"
    );
    assert_eq!(host.starts().len(), 2);
    assert_eq!(host.ends().len(), 2);
    assert_eq!(
        notices(&host.parent).len(),
        1,
        "the refused epoch announced nothing"
    );
    host.finish().await;
}

/// spec: CONT-23 — a follow-up whose cold-resumed epoch is refused at submission because its
/// token was cancelled (here at the epoch's start edge) rejects `CANCELLED` at once: it does
/// not wait for that fresh epoch's release, which goes on in the background and completes once
/// the host's disposer returns; then nothing is left. (The wait for the release ignored the
/// token: with a hung host disposer the cancelled follow-up never returned.)
#[tokio::test(start_paused = true)]
async fn a_cancelled_followup_does_not_wait_for_its_refused_epochs_release() {
    let (host, child_id, entered_rx, release_tx) = settled_child_with_held_resume_disposal().await;
    let signal = Signal::new();
    let cancel = signal.clone();
    let resumed = child_id.clone();
    let listener = host.service.events().on(move |e: &SubagentEvent| {
        if let SubagentEvent::Start(info) = e
            && info.id == resumed
        {
            cancel.cancel(agent::CancelCause::User);
        }
        Ok(())
    });
    let mut followup = Box::pin(host.manager.followup_with(
        &host.parent,
        &child_id,
        vec![ContentBlock::text("again")],
        MessageSource::User,
        &signal,
    ));
    let mut entered = std::pin::pin!(entered_rx);
    let mut reached = false;
    let outcome = tokio::select! {
        outcome = followup.as_mut() => outcome,
        held = entered.as_mut() => {
            held.expect("the epoch's handle disposal is reached");
            reached = true;
            let std::task::Poll::Ready(outcome) = futures::poll!(followup.as_mut()) else {
                panic!("the cancelled follow-up is still waiting for its epoch's release");
            };
            outcome
        }
    };
    let err = outcome.expect_err("the cancelled follow-up rejects");
    assert_eq!(err.code(), SubagentErrorCode::Cancelled, "{err}");
    drop(followup);
    if !reached {
        entered.await.expect("the epoch's handle disposal is reached");
    }
    // The release was not cancelled with the wait: it is still under way, held by the host.
    assert!(host.manager.is_resident(&child_id));
    release_tx.send(()).unwrap();
    drop(listener);
    the_refused_epoch_is_released(host, &child_id).await;
}

/// spec: CONT-48 — a follow-up whose cold-resumed epoch's inbox send is refused waits for that
/// fresh epoch's release before rejecting with the send's error, so that no epoch is left
/// when the error is seen; cancelled during that wait, it rejects `CANCELLED` at once instead,
/// and the release completes in the background once the host's disposer returns. (The wait
/// ignored the token: with a hung host disposer the cancelled follow-up never returned.)
#[tokio::test(start_paused = true)]
async fn a_refused_followup_waits_for_its_epochs_release_unless_cancelled() {
    for cancelled in [false, true] {
        let (host, child_id, entered_rx, release_tx) = settled_child_with_held_resume_disposal().await;
        // The resumed epoch's agent refuses the follow-up's insertion.
        let services = host.runtime.services().clone();
        let resumed = child_id.clone();
        let listener = host.service.events().on(move |e: &SubagentEvent| {
            if let SubagentEvent::Start(info) = e
                && info.id == resumed
                && let Some(agent) = services.agents.get(&resumed)
            {
                agent
                    .session()
                    .add_observer(Arc::new(RefuseInsertion(|m| visible_text(&m.content) == "again")));
            }
            Ok(())
        });
        let signal = Signal::new();
        let mut followup = Box::pin(host.manager.followup_with(
            &host.parent,
            &child_id,
            vec![ContentBlock::text("again")],
            MessageSource::User,
            &signal,
        ));
        let mut entered = std::pin::pin!(entered_rx);
        tokio::select! {
            outcome = followup.as_mut() => {
                panic!("cancelled={cancelled}: the follow-up returned before its epoch's release: {outcome:?}")
            }
            held = entered.as_mut() => held.expect("the epoch's handle disposal is reached"),
        }
        assert!(
            futures::poll!(followup.as_mut()).is_pending(),
            "cancelled={cancelled}: the follow-up waits for its epoch's release"
        );
        if cancelled {
            signal.cancel(agent::CancelCause::User);
            let std::task::Poll::Ready(outcome) = futures::poll!(followup.as_mut()) else {
                panic!("the cancelled follow-up is still waiting for its epoch's release");
            };
            let err = outcome.expect_err("the cancelled follow-up rejects");
            assert_eq!(err.code(), SubagentErrorCode::Cancelled, "{err}");
            drop(followup);
            assert!(host.manager.is_resident(&child_id), "the release goes on");
            release_tx.send(()).unwrap();
        } else {
            release_tx.send(()).unwrap();
            let err = followup.await.expect_err("the refused follow-up rejects");
            assert_ne!(err.code(), SubagentErrorCode::Cancelled, "{err}");
            assert!(
                err.to_string().contains("synthetic inbox failure"),
                "the send's error: {err}"
            );
            assert!(
                !host.manager.is_resident(&child_id),
                "the refused epoch is gone when the error is seen"
            );
        }
        drop(listener);
        the_refused_epoch_is_released(host, &child_id).await;
    }
}

/// The Activation `manager` maps `id` to now, if any.
fn activation(
    manager: &ContinuationManager,
    id: &SessionId,
) -> Option<Arc<crate::continuation::activation::Activation>> {
    manager.inner.activations.lock().get(id).cloned()
}

/// spec: §2.14.8 scheduling, CONT-79 — a settlement notice's scheduling decision and its send
/// are one admission span, like a submission's (spec §2.14.5, CONT-45). Here a scoped drain
/// covering the notified parent — a resident, waiting Activation — begins on another thread
/// right after the notice decided to wake that (not yet closing) parent: the drain's span waits
/// for the delivery, so the notice enters the parent's inbox before the drain cancels the
/// parent, and that cancel discards it. No model request is spent in the parent's teardown.
/// (Decided outside any span, the drain opened the parent's teardown — its cancel — between the
/// decision and the send; the waking `followup` then reached the already-cancelled parent,
/// which ran a whole model turn on the notice inside its own teardown.)
#[tokio::test(start_paused = true)]
async fn a_drain_beginning_mid_notice_spends_no_model_request_on_the_closing_parent() {
    let host = Host::new(by_session(10)).await;
    let (mid_gate, mid_hook) = gate(&host, "mid");
    let (leaf_gate, leaf_hook) = gate(&host, "leaf");
    let mut spec = host.spec("mid task");
    spec.child_id = Some(SessionId::from("mid"));
    let (mid_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let mid = host.get(&mid_id).unwrap();
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("leaf task")],
        mid.clone(),
    );
    spec.child_id = Some(SessionId::from("leaf"));
    let (leaf_id, _) = host.manager.start_continuable(spec).await.unwrap();
    // The mid child finishes its turn and waits on the leaf.
    mid_gate.send(true).unwrap();
    mid.when_idle().await;
    yield_a_while().await;
    assert!(host.manager.is_resident(&mid_id));
    assert_eq!(mid.status(), AgentStatus::Idle);
    let mid_requests = host
        .model
        .requests()
        .iter()
        .filter(|r| r.session_id.as_ref() == Some(&mid_id))
        .count();
    assert_eq!(mid_requests, 1);
    // What lets the notice go on, once the drain began on its thread: the drain's span found the
    // admission lock held by the notice's thread (and waits for it), or it is over.
    // The drain: started on a thread of its own by the leaf's notice, once it decided how to
    // schedule itself; its synchronous span's end is awaited before the leaf's release.
    let (hook, seen, drain_rx) = drain_from_a_point(&host, "the drain's span waits for the notice");
    *host.manager.inner.hooks.notice_scheduled.lock() = Some(hook);
    let (drain_thread_tx, drain_thread_rx) = std::sync::mpsc::channel();
    let joined = Mutex::new(Some((drain_rx, drain_thread_tx)));
    let watched = leaf_id.clone();
    *host.manager.inner.hooks.before_release.lock() = Some(Arc::new(
        move |activation: &Arc<super::super::activation::Activation>| {
            if activation.child_id == watched
                && let Some((drain_rx, drain_thread_tx)) = joined.lock().take()
            {
                // Holds this (the runtime's only) thread until the drain's synchronous span is
                // over on its own: the parent's cancel has then been issued.
                let drain = drain_rx.recv().expect("the notice started the drain");
                let drain = drain.join().expect("the drain's synchronous span");
                drain_thread_tx.send(drain).expect("the test holds the drain");
            }
            Box::pin(async {})
        },
    ));
    leaf_gate.send(true).unwrap();
    let drain = loop {
        if let Ok(drain) = drain_thread_rx.try_recv() {
            break drain;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    };
    drain.await.expect("the scoped drain releases the mid child");
    host.settle().await;
    // The leaf's notice reached the mid child's log ...
    let log = host.persisted(&mid_id).await;
    let inserted = log
        .events
        .iter()
        .position(|e| {
            matches!(&e.data, EventData::InboxSpliced(splice)
                if splice.inserted.iter().any(|m| m.source.kind() == "subagent-settled"))
        })
        .expect("the leaf's notice reached the mid child");
    // ... and the closing mid child spent no model request on it.
    let mid_requests = host
        .model
        .requests()
        .iter()
        .filter(|r| r.session_id.as_ref() == Some(&mid_id))
        .count();
    assert_eq!(
        mid_requests, 1,
        "the closing parent ran a model turn on the notice"
    );
    assert!(
        !type_names(&log.events[inserted..])
            .iter()
            .any(|n| n == "step/start"),
        "the closing parent opened a step after the notice: {:?}",
        type_names(&log.events[inserted..])
    );
    let ends: Vec<SessionId> = host.ends().into_iter().map(|e| e.info.id).collect();
    assert_eq!(ends, vec![leaf_id, mid_id]);
    assert_eq!(*seen.lock(), vec!["the drain's span waits for the notice"]);
    *host.manager.inner.hooks.drain_span.lock() = None;
    *host.manager.inner.hooks.notice_scheduled.lock() = None;
    *host.manager.inner.hooks.before_release.lock() = None;
    drop((mid_hook, leaf_hook));
    host.finish().await;
}

/// spec: §2.14.10 (REP-5, REP-10, REP-12), CONT-45, CONT-79 — a report runs without suspension:
/// its checks, its scheduling decision and its send are one admission span, like a
/// submission's (§2.14.5) and a settlement notice's (§2.14.8). Here a scoped drain covering the
/// reporting leaf and its parent — a resident, waiting Activation — begins on another thread
/// right after a next-step report from the leaf passed its checks and decided to wake that (not
/// yet closing) parent: the drain's span waits for the report, so the report enters the
/// parent's inbox before the drain cancels the parent, and that cancel discards it. No model
/// request is spent in the parent's teardown. (Checked outside any span, the drain opened the
/// parent's teardown — its cancel — between the checks and the send; the waking `steer` then
/// reached the already-cancelled parent, which ran a whole model turn on the report inside its
/// own teardown.)
#[tokio::test(start_paused = true)]
async fn a_drain_beginning_mid_report_spends_no_model_request_on_the_closing_parent() {
    let host = Host::new(by_session(10)).await;
    let (mid_gate, mid_hook) = gate(&host, "mid");
    let (_leaf_gate, leaf_hook) = gate(&host, "leaf");
    let mut spec = host.spec("mid task");
    spec.child_id = Some(SessionId::from("mid"));
    let (mid_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let mid = host.get(&mid_id).unwrap();
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("leaf task")],
        mid.clone(),
    );
    spec.child_id = Some(SessionId::from("leaf"));
    let (leaf_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let leaf = host.get(&leaf_id).unwrap();
    // The mid child finishes its turn and waits on the leaf, which runs (held at its step).
    mid_gate.send(true).unwrap();
    mid.when_idle().await;
    yield_a_while().await;
    assert!(host.manager.is_resident(&mid_id));
    assert_eq!(mid.status(), AgentStatus::Idle);
    assert_eq!(leaf.status(), AgentStatus::Running);
    let mid_requests = |host: &Host| {
        host.model
            .requests()
            .iter()
            .filter(|r| r.session_id.as_ref() == Some(&mid_id))
            .count()
    };
    assert_eq!(mid_requests(&host), 1);
    // What lets the report go on, once the drain began on its thread: the drain's span found the
    // admission lock held by the report's thread (and waits for it), or it is over.
    // The drain: started on a thread of its own by the report, once it decided how to deliver
    // itself.
    let (hook, seen, drain_rx) = drain_from_a_point(&host, "the drain's span waits for the report");
    *host.manager.inner.hooks.report_scheduled.lock() = Some(hook);
    let reported = host.manager.report_from(
        &leaf,
        vec![ContentBlock::text("halfway there")],
        crate::continuation::ReportDelivery::NextStep,
        &Signal::new(),
    );
    // Holds this (the runtime's only) thread, with no await since the report, until the drain's
    // synchronous span is over on its own: the parent's cancel has then been issued.
    let drain = drain_rx
        .recv()
        .expect("the report started the drain")
        .join()
        .expect("the drain's synchronous span");
    let id = reported.expect("the report was admitted before the drain");
    drain.await.expect("the scoped drain releases the mid child");
    host.settle().await;
    // The report reached the mid child's log ...
    let log = host.persisted(&mid_id).await;
    let inserted = log
        .events
        .iter()
        .position(|e| {
            matches!(&e.data, EventData::InboxSpliced(splice)
                if splice.inserted.iter().any(|m| m.id == id))
        })
        .expect("the report reached the mid child");
    // ... and the closing mid child spent no model request on it.
    assert_eq!(
        mid_requests(&host),
        1,
        "the closing parent ran a model turn on the report"
    );
    assert!(
        !type_names(&log.events[inserted..])
            .iter()
            .any(|n| n == "step/start"),
        "the closing parent opened a step after the report: {:?}",
        type_names(&log.events[inserted..])
    );
    let ends: Vec<SessionId> = host.ends().into_iter().map(|e| e.info.id).collect();
    assert_eq!(ends, vec![leaf_id, mid_id]);
    assert_eq!(*seen.lock(), vec!["the drain's span waits for the report"]);
    *host.manager.inner.hooks.drain_span.lock() = None;
    *host.manager.inner.hooks.report_scheduled.lock() = None;
    drop((mid_hook, leaf_hook));
    host.finish().await;
}

/// A root's continuable child `t` (hanging) created under a one-shot-like intermediate `mid`
/// that has already left the registry (the CONT-38 shape), plus a live agent `o2` whose durable
/// parent is `t` (a one-shot run of `t`'s). Returns `(t's id, o2)`.
async fn forest_past_a_departed_intermediate(host: &mut Host) -> (SessionId, AgentRef) {
    let meta = |parent: &SessionId, depth: u64| SessionMeta {
        parent_session: Some(parent.clone()),
        origin: Some(agent::Origin::Subagent),
        delegation_depth: Some(depth),
        ..SessionMeta::default()
    };
    let mid_handle = host
        .runtime
        .create(CreateAgentOptions {
            meta: meta(&SessionId::from("parent"), 1),
            agent_options: routed(),
            ..CreateAgentOptions::new(SessionId::from("mid"))
        })
        .await
        .unwrap();
    let mid = mid_handle.agent().clone();
    let mut spec = ContinuableStartSpec::new("spawn", "deep", vec![ContentBlock::text("task")], mid);
    spec.child_id = Some(SessionId::from("t"));
    let (t_id, _) = host.manager.start_continuable(spec).await.unwrap();
    mid_handle.dispose().await;
    assert!(host.get(&SessionId::from("mid")).is_none());
    // A plain agent below `t` (no `origin: subagent`): it runs turns here (the settlement notices
    // of the children started on its behalf wake it) without the descriptor a provider's child
    // carries, which the log invariants require of a subagent's log.
    let o2_handle = host
        .runtime
        .create(CreateAgentOptions {
            meta: SessionMeta {
                origin: None,
                ..meta(&t_id, 3)
            },
            agent_options: routed(),
            ..CreateAgentOptions::new(SessionId::from("o2"))
        })
        .await
        .unwrap();
    let o2 = o2_handle.agent().clone();
    host.extra.push(o2_handle);
    (t_id, o2)
}

/// spec: CONT-32, CONT-38 (§2.14.11) — a scoped drain tears down every resident continuable
/// descendant of its root, also one materialized (under a one-shot run `o2` of the drained
/// child `t`) after an intermediate between the root and `t` had left the registry: its
/// recorded ancestry stops at `t`, whose own ancestry reaches the root. (Selected only by the
/// root in its recorded ancestry, and not owned by `t`'s Activation, it stayed resident after
/// the drain resolved — a continuable grandchild left running below a drained root.)
#[tokio::test(start_paused = true)]
async fn a_scoped_drain_tears_down_a_descendant_recorded_below_a_drained_child() {
    let mut host = Host::new(vec![ScriptEntry::hang(), ScriptEntry::hang()]).await;
    let (t_id, o2) = forest_past_a_departed_intermediate(&mut host).await;
    let mut spec = ContinuableStartSpec::new("spawn", "deeper", vec![ContentBlock::text("task")], o2);
    spec.child_id = Some(SessionId::from("g"));
    let (g_id, _) = host.manager.start_continuable(spec).await.unwrap();
    yield_a_while().await;
    host.manager
        .drain_continuable_descendants(std::slice::from_ref(&host.parent))
        .await
        .unwrap();
    assert!(!host.manager.is_resident(&t_id));
    assert!(
        !host.manager.is_resident(&g_id),
        "a continuable descendant below the drained child stayed resident"
    );
    assert!(host.get(&g_id).is_none());
    host.finish().await;
}

/// spec: CONT-32 (§2.14.11) — while a scoped drain tears a child `t` down, admission is closed
/// for the whole forest below it: a start on behalf of `o2` (a one-shot run of `t`'s, whose
/// lineage reaches the root only through an intermediate that already left the registry)
/// rejects `DRAINING`. (Only the selected children themselves were recorded as closed, so
/// `o2`'s start was admitted and its child became resident below the drained root.)
#[tokio::test(start_paused = true)]
async fn a_scoped_drain_closes_admission_below_a_drained_child() {
    let mut host = Host::new(vec![ScriptEntry::hang(), ScriptEntry::hang()]).await;
    let (t_id, o2) = forest_past_a_departed_intermediate(&mut host).await;
    yield_a_while().await;
    let drain = host
        .manager
        .drain_continuable_descendants(std::slice::from_ref(&host.parent));
    let mut spec = ContinuableStartSpec::new("spawn", "late", vec![ContentBlock::text("task")], o2);
    spec.child_id = Some(SessionId::from("late"));
    let started = host.manager.start_continuable(spec);
    drain.await.unwrap();
    let err = started
        .await
        .expect_err("a start below a drained child is refused");
    assert_eq!(err.code(), SubagentErrorCode::Draining, "{err}");
    assert!(!host.manager.is_resident(&t_id));
    assert!(!host.manager.is_resident(&SessionId::from("late")));
    assert!(host.get(&SessionId::from("late")).is_none());
    host.finish().await;
}

/// spec: CONT-39, §4 item 40 — a scoped drain waits for every in-flight materialization in its
/// scope, also one delegated by a drained child `t` whose lineage reaches the root only through
/// an intermediate that already left the registry: the drain resolves only once that refused
/// child is rolled back. (The in-flight record was matched against the roots alone: the drain
/// resolved while the refused child was still registered, its rollback under way.)
#[tokio::test(start_paused = true)]
async fn a_scoped_drain_waits_for_a_materialization_below_a_drained_child() {
    let mut host = Host::new(vec![ScriptEntry::hang()]).await;
    let (t_id, _o2) = forest_past_a_departed_intermediate(&mut host).await;
    yield_a_while().await;
    let t = host.get(&t_id).unwrap();
    let (reached, release) = hold_release_of(&host, "below");
    let resolved = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = resolved.clone();
    let manager = host.manager.clone();
    let root = host.parent.clone();
    let listener = host.runtime.services().agent_events.on(move |e: &AgentEvent| {
        if let AgentEvent::Created { agent } = e
            && agent.as_str() == "below"
        {
            let drain = manager.drain_continuable_descendants(std::slice::from_ref(&root));
            let flag = flag.clone();
            tokio::spawn(async move {
                drain.await.unwrap();
                flag.store(true, AtomicOrdering::SeqCst);
            });
        }
        Ok(())
    });
    let mut spec = ContinuableStartSpec::new("spawn", "below", vec![ContentBlock::text("gc")], t);
    spec.child_id = Some(SessionId::from("below"));
    let started = tokio::spawn(host.manager.start_continuable(spec));
    let _held = reached
        .await
        .expect("the refused child's rollback reached its release");
    yield_a_while().await;
    assert!(!host.manager.is_resident(&t_id), "the drained child is released");
    assert!(
        !resolved.load(AtomicOrdering::SeqCst),
        "the drain resolved while a materialization below its drained child was rolling back"
    );
    release.send(()).unwrap();
    let err = started.await.unwrap().unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining, "{err}");
    yield_a_while().await;
    assert!(resolved.load(AtomicOrdering::SeqCst));
    assert!(host.get(&SessionId::from("below")).is_none());
    *host.manager.inner.hooks.before_release.lock() = None;
    drop(listener);
    host.finish().await;
}

/// spec: CONT-103, §2.14.9 step 4 — an interrupt's disposal check and its cancel are one
/// admission span, like the opening of a disposal transaction (its cancel). Here a scoped drain
/// covering the interrupted child begins on another thread right after the interrupt found no
/// disposal open: the drain's span waits for the interrupt, so the interrupt's `keepInbox`
/// cancel (cause `user`) is issued before the child's transaction opens, and the drain's cancel
/// is the transaction's own — the child is never cancelled by an interrupt after its teardown
/// began. (Checked outside the span, the drain opened the child's teardown — its cancel, cause
/// `parent` — between the check and the cancel, and the interrupt then cancelled the closing
/// child a second time.)
#[tokio::test(start_paused = true)]
async fn a_drain_beginning_mid_interrupt_is_not_followed_by_the_interrupts_cancel() {
    let host = Host::new(vec![]).await;
    let (order, recorders) = record_cancels(&host, &["target"]);
    let child_id = start_reserved(&host, "target").await;
    yield_a_while().await;
    // What lets the interrupt go on, once the drain began on its thread: the drain's span found
    // the admission lock held by the interrupt's thread (and waits for it), or it is over.
    let (hook, seen, drain_rx) = drain_from_a_point(&host, "the drain's span waits for the interrupt");
    *host.manager.inner.hooks.interrupt_checked.lock() = Some(hook);
    host.manager
        .interrupt(
            &child_id,
            &crate::continuation::InterruptAuthority::User {
                parent_session_id: SessionId::from("parent"),
            },
        )
        .expect("the interrupt is accepted");
    let drain = drain_rx
        .recv()
        .expect("the interrupt started the drain")
        .join()
        .expect("the drain's synchronous span");
    drain.await.expect("the scoped drain releases the child");
    host.settle().await;
    assert_eq!(*seen.lock(), vec!["the drain's span waits for the interrupt"]);
    assert_eq!(cancelled_ids(&order), vec!["target"]);
    // The turn ended with the interrupt's cause: its cancel came first, the transaction's after.
    let log = host.persisted(&child_id).await;
    assert_eq!(
        turn_end_reasons(&log.events),
        vec![json!({"kind": "aborted", "reason": {"kind": "user"}})]
    );
    *host.manager.inner.hooks.drain_span.lock() = None;
    *host.manager.inner.hooks.interrupt_checked.lock() = None;
    drop(recorders);
    host.finish().await;
}

/// The thread of a drain begun by [`drain_from_a_point`]; it returns the drain's future.
type DrainThread = std::thread::JoinHandle<futures::future::BoxFuture<'static, Result<(), SubagentError>>>;

/// A scoped drain of the host's root begun on a thread of its own from inside a point hook (the
/// first time it fires), for the races between a drain and an operation holding the admission
/// lock. Returns the hook to install at the operation's point; what the hook saw before it let
/// the operation go on — the drain's span found the admission lock held and waits for it
/// (`waits`), or it was over (`"the drain's span is over"`);
/// and the receiver of the drain thread's handle (its result: the drain's future).
fn drain_from_a_point(
    host: &Host,
    waits: &'static str,
) -> (
    crate::continuation::PointHook,
    Arc<Mutex<Vec<&'static str>>>,
    std::sync::mpsc::Receiver<DrainThread>,
) {
    let (progress_tx, progress_rx) = std::sync::mpsc::channel::<&'static str>();
    let drain_span = progress_tx.clone();
    *host.manager.inner.hooks.drain_span.lock() = Some(Arc::new(move |contended: bool| {
        if contended {
            let _ = drain_span.send(waits);
        }
    }));
    let (drain_tx, drain_rx) = std::sync::mpsc::channel();
    let start_drain = Mutex::new(Some((progress_tx, progress_rx, drain_tx)));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let (manager, root, runtime) = (
        host.manager.clone(),
        host.parent.clone(),
        tokio::runtime::Handle::current(),
    );
    let hook: crate::continuation::PointHook = Arc::new(move || {
        let Some((progress_tx, progress_rx, drain_tx)) = start_drain.lock().take() else {
            return;
        };
        let (manager, root, runtime) = (manager.clone(), root.clone(), runtime.clone());
        let drain = std::thread::spawn(move || {
            let _runtime = runtime.enter();
            let drain = manager.drain_continuable_descendants(std::slice::from_ref(&root));
            let _ = progress_tx.send("the drain's span is over");
            drain
        });
        drain_tx.send(drain).expect("the test holds the drain's receiver");
        sink.lock().push(progress_rx.recv().expect("the drain goes on"));
    });
    (hook, seen, drain_rx)
}
