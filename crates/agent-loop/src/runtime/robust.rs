//! Robustness of the creation transaction under cancellation and concurrency (spec §9.1, §9.3,
//! §9.4): interruptions at every scheduling point of `create` and `resume`, interruptions from
//! inside the publication's own listeners, and races on a multi-threaded runtime. Every outcome
//! is either a published agent or a typed error with nothing left behind: no registry entry, no
//! live session, nothing written to durable persistence, every announcement paired with its
//! disposal, and a quiescent runtime.

use std::sync::Arc;

use futures::FutureExt;
use parking_lot::Mutex;

use agent::runtime::Setup;
use agent::{
    AgentError, AgentEvent, AgentHandle, AgentRuntime, CancelCause, Registration, SessionId,
    SessionPersistence, SessionStore, Signal,
};

use super::*;
use crate::model::{ScriptedModel, chunks};
use crate::runtime::testkit::*;
use crate::{JsonlStore, MemoryStore};

/// A setup that appends to the session and yields between its steps (so every step is a
/// scheduling point), then commits.
fn appending_setup() -> Option<Setup> {
    Some(Box::new(|ctx: Ctx| {
        async move {
            let agent = ctx.agent().expect("setup runs with the agent's context").clone();
            for i in 0..3 {
                agent.followup(user(&format!("setup {i}")))?;
                tokio::task::yield_now().await;
            }
            let commit: agent::runtime::Commit = Box::new(|| Ok(()));
            Ok(Some(commit))
        }
        .boxed()
    }))
}

/// A setup that stages a message with `inject` (logged at once, spec §8) between yields.
fn injecting_setup() -> Option<Setup> {
    Some(Box::new(|ctx: Ctx| {
        async move {
            let agent = ctx.agent().expect("setup runs with the agent's context").clone();
            tokio::task::yield_now().await;
            agent.inject(user("staged in setup"))?;
            tokio::task::yield_now().await;
            Ok(None)
        }
        .boxed()
    }))
}

/// Records store and lifecycle notifications as `kind:id` strings.
fn record(rt: &Runtime) -> (Arc<Mutex<Vec<String>>>, [Registration; 2]) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = log.clone();
    let store = rt.sessions().events().on(move |e| {
        l.lock().push(match e {
            SessionStoreEvent::Created(s) => format!("session/created:{}", s.id()),
            SessionStoreEvent::Disposed(id) => format!("session/disposed:{id}"),
        });
        Ok(())
    });
    let l = log.clone();
    let agents = rt.services().agent_events.on(move |e| {
        match e {
            AgentEvent::Created { agent } => l.lock().push(format!("agent/created:{agent}")),
            AgentEvent::Disposed { agent } => l.lock().push(format!("agent/disposed:{agent}")),
            _ => {}
        }
        Ok(())
    });
    (log, [store, agents])
}

/// Every `created` is followed by exactly one matching `disposed` (and no `disposed` comes
/// without its `created`).
fn assert_paired(log: &[String], context: &str) {
    for kind in ["session", "agent"] {
        let mut open: Vec<&str> = Vec::new();
        for entry in log {
            if let Some(id) = entry.strip_prefix(&format!("{kind}/created:")) {
                assert!(
                    !open.contains(&id),
                    "{context}: {kind} {id} created twice: {log:?}"
                );
                open.push(id);
            } else if let Some(id) = entry.strip_prefix(&format!("{kind}/disposed:")) {
                let at = open.iter().position(|o| *o == id);
                let at = at.unwrap_or_else(|| panic!("{context}: {kind} {id} disposed unannounced: {log:?}"));
                open.remove(at);
            }
        }
        assert!(
            open.is_empty(),
            "{context}: {kind}s never disposed: {open:?} in {log:?}"
        );
    }
}

fn nothing_live(rt: &Runtime, id: &str, context: &str) {
    let id: SessionId = id.into();
    assert!(
        AgentRuntime::get(rt, &id).is_none(),
        "{context}: agent {id} registered"
    );
    assert!(rt.loop_agent(&id).is_none(), "{context}: agent {id} registered");
    assert!(rt.sessions().get(&id).is_none(), "{context}: session {id} live");
}

/// Whether `persistence` holds a header for `id`.
async fn stored(persistence: &dyn SessionPersistence, id: &str) -> bool {
    persistence.inspect(&id.into()).await.expect("inspect").is_some()
}

/// How a creation is interrupted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Interrupt {
    /// The caller's creation signal is cancelled.
    Signal,
    /// The `create`/`resume` future is dropped (its task aborted).
    Drop,
    /// The creating owner is disposed.
    Owner,
    /// The runtime shuts down.
    Shutdown,
}

const INTERRUPTS: [Interrupt; 4] = [
    Interrupt::Signal,
    Interrupt::Drop,
    Interrupt::Owner,
    Interrupt::Shutdown,
];

/// Whether `err` is the typed error `interrupt` must produce.
fn expected_error(interrupt: Interrupt, err: &AgentError) -> bool {
    match interrupt {
        Interrupt::Signal => matches!(
            err,
            AgentError::CreationAborted {
                cause: CancelCause::User,
                ..
            }
        ),
        Interrupt::Owner => matches!(err, AgentError::OwnerDisposed(_) | AgentError::Inactive(_)),
        // Shutdown also disposes the owner; either cause is reported.
        Interrupt::Shutdown => {
            err.to_string()
                .ends_with("creation aborted: agent loop is not active")
                || matches!(err, AgentError::OwnerDisposed(_))
        }
        Interrupt::Drop => false,
    }
}

/// One creation (`resume == false`) or resumption of `child`, owned by a fresh `owner`,
/// interrupted after `point` scheduling points. Returns whether the creation had finished
/// before the interruption.
async fn interrupted(point: usize, interrupt: Interrupt, resume: bool) -> bool {
    let context = format!("{interrupt:?} at point {point} (resume: {resume})");
    let model = ScriptedModel::new((0..8).map(|_| chunks::text("ok")));
    let persistence = Arc::new(MemoryStore::new());
    let rt = builder(&model).persistence(persistence.clone()).build();
    let mut stored_before = Vec::new();
    if resume {
        let first = create(&rt, "child").await;
        first.agent().followup(user("go")).unwrap();
        first.agent().when_idle().await;
        first.dispose().await;
        stored_before = persistence.load(&"child".into()).await.unwrap().events;
    }
    let (log, guards) = record(&rt);
    let owner = create(&rt, "owner").await;
    let signal = Signal::new();
    let rt2 = rt.clone();
    let (o_signal, o_owner) = (Some(signal.clone()), Some(owner.agent().clone()));
    let task = tokio::spawn(async move {
        if resume {
            let mut o = resume_options("child");
            (o.signal, o.owner, o.setup) = (o_signal, o_owner, appending_setup());
            rt2.resume(o).await
        } else {
            let mut o = create_options("child");
            (o.signal, o.owner, o.setup) = (o_signal, o_owner, appending_setup());
            rt2.create(o).await
        }
    });
    for _ in 0..point {
        tokio::task::yield_now().await;
    }
    let finished_before = task.is_finished();
    let mut owner_disposal = None;
    let mut shutdown = None;
    match interrupt {
        Interrupt::Signal => drop(signal.cancel(CancelCause::User)),
        Interrupt::Drop => task.abort(),
        // `dispose` starts the teardown synchronously; awaited below.
        Interrupt::Owner => owner_disposal = Some(owner.dispose()),
        Interrupt::Shutdown => {
            let rt3 = rt.clone();
            shutdown = Some(tokio::spawn(async move { rt3.shutdown().await }));
        }
    }
    let outcome = task.await;
    if let Some(d) = owner_disposal {
        d.await;
    }
    if let Some(s) = shutdown {
        s.await.unwrap();
    }
    // A dropped creation hands a published entry's teardown to a runtime task.
    settle().await;
    let published: Option<AgentHandle> = match outcome {
        Ok(Ok(handle)) => Some(handle),
        Ok(Err(err)) => {
            assert!(!finished_before, "{context}: finished, then failed: {err}");
            assert!(
                expected_error(interrupt, &err),
                "{context}: unexpected error {err:?}"
            );
            None
        }
        Err(join) => {
            assert!(
                join.is_cancelled() && interrupt == Interrupt::Drop,
                "{context}: {join}"
            );
            None
        }
    };
    match &published {
        Some(handle) => {
            // A published agent carries every setup append and is durable.
            let texts = user_texts(&**handle.agent());
            assert!(
                texts.ends_with(&["setup 0".into(), "setup 1".into(), "setup 2".into()])
                    || !handle.agent().is_live(),
                "{context}: {texts:?}"
            );
            assert!(
                stored(&*persistence, "child").await,
                "{context}: published but not stored"
            );
        }
        None => {
            nothing_live(&rt, "child", &context);
            if resume {
                // A rolled-back resumption writes nothing.
                let after = persistence.load(&"child".into()).await.unwrap().events;
                assert_eq!(after, stored_before, "{context}: the stored log changed");
            } else {
                assert!(
                    !stored(&*persistence, "child").await,
                    "{context}: a rolled-back creation left a stored header"
                );
                // The id is immediately reusable.
                if rt.is_active() {
                    let again = create(&rt, "child").await;
                    again.dispose().await;
                }
            }
        }
    }
    owner.dispose().await;
    if let Some(handle) = published {
        handle.dispose().await;
    }
    rt.shutdown().await;
    drop(guards);
    assert_paired(&log.lock(), &context);
    finish(&rt, []).await;
    finished_before
}

/// spec: SPN-49, SPN-50, SPN-51, SPN-55 — `create` interrupted at every scheduling point of its
/// setup window (its signal cancelled, its future dropped, its owner disposed, the runtime shut
/// down): either the agent is published with every setup append, or the creation fails with the
/// interruption's typed error and leaves nothing — no registry entry, no live session, no stored
/// header, every announcement paired with its disposal — and the id is reusable at once.
#[tokio::test(start_paused = true)]
async fn create_interrupted_at_every_point() {
    for interrupt in INTERRUPTS {
        let mut finished = false;
        for point in 0..64 {
            if interrupted(point, interrupt, false).await {
                assert!(point > 0, "{interrupt:?}: creation finished without yielding");
                finished = true;
                break;
            }
        }
        assert!(finished, "{interrupt:?}: creation never finished");
    }
}

/// `resume` (spec §9.3: the same transaction after a load) interrupted at every scheduling
/// point: either resumed with every setup append, or a typed error with nothing live and the
/// stored log unchanged.
#[tokio::test(start_paused = true)]
async fn resume_interrupted_at_every_point() {
    for interrupt in INTERRUPTS {
        let mut finished = false;
        for point in 0..64 {
            if interrupted(point, interrupt, true).await {
                finished = true;
                break;
            }
        }
        assert!(finished, "{interrupt:?}: resumption never finished");
    }
}

/// Where inside the publication a listener interrupts the creation.
#[derive(Clone, Copy, Debug)]
enum Edge {
    SessionCreated,
    AgentCreated,
    SessionStart,
}

/// spec: SPN-49, SPN-55 (§9.1 step 6, "liveness is re-checked after each edge") — a creation
/// interrupted from a listener of each publication edge (its signal cancelled, its owner
/// disposed, the runtime shut down) fails with the typed error, pairs every announcement with
/// its disposal and leaves nothing: no live entry and no header in durable persistence (memory
/// and JSON lines), so the id is immediately reusable.
#[tokio::test(start_paused = true)]
async fn interrupted_from_a_publication_listener_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (n, jsonl) in [false, true].into_iter().enumerate() {
        for edge in [Edge::SessionCreated, Edge::AgentCreated, Edge::SessionStart] {
            for interrupt in [Interrupt::Signal, Interrupt::Owner, Interrupt::Shutdown] {
                let context = format!("{interrupt:?} from {edge:?} (jsonl: {jsonl})");
                let persistence: Arc<dyn SessionPersistence> = if jsonl {
                    Arc::new(JsonlStore::new(
                        dir.path().join(format!("{n}-{edge:?}-{interrupt:?}")),
                    ))
                } else {
                    Arc::new(MemoryStore::new())
                };
                let model = ScriptedModel::default();
                let rt = builder(&model).persistence(persistence.clone()).build();
                let (log, guards) = record(&rt);
                let owner = Arc::new(create(&rt, "owner").await);
                let signal = Signal::new();
                let owner_disposal = Arc::new(Mutex::new(None));
                let act = {
                    let (signal, owner, rt, disposal) =
                        (signal.clone(), owner.clone(), rt.clone(), owner_disposal.clone());
                    move |id: &SessionId| {
                        if id.as_str() != "child" {
                            return;
                        }
                        match interrupt {
                            Interrupt::Signal => drop(signal.cancel(CancelCause::User)),
                            Interrupt::Owner => *disposal.lock() = Some(owner.dispose()),
                            // The first poll of `shutdown` cancels the creation token.
                            Interrupt::Shutdown => {
                                *disposal.lock() = Some(Box::pin({
                                    let rt = rt.clone();
                                    async move { rt.shutdown().await }
                                })
                                    as futures::future::BoxFuture<'static, ()>)
                            }
                            Interrupt::Drop => unreachable!(),
                        }
                        let mut slot = disposal.lock();
                        if slot.as_mut().is_some_and(|d| d.now_or_never().is_some()) {
                            *slot = None;
                        }
                    }
                };
                let act = Arc::new(Mutex::new(Some(act)));
                let fire = move |id: &SessionId| {
                    if let Some(act) = act.lock().take() {
                        act(id);
                    }
                };
                let guard = match edge {
                    Edge::SessionCreated => rt.sessions().events().on(move |e| {
                        if let SessionStoreEvent::Created(s) = e {
                            fire(s.id());
                        }
                        Ok(())
                    }),
                    Edge::AgentCreated | Edge::SessionStart => rt.services().agent_events.on(move |e| {
                        match (edge, e) {
                            (Edge::AgentCreated, AgentEvent::Created { agent })
                            | (Edge::SessionStart, AgentEvent::SessionStart { agent, .. }) => fire(agent),
                            _ => {}
                        }
                        Ok(())
                    }),
                };
                let mut o = create_options("child");
                (o.signal, o.owner, o.setup) = (Some(signal), Some(owner.agent().clone()), appending_setup());
                let err = rt.create(o).await.expect_err(&context);
                assert!(
                    expected_error(interrupt, &err),
                    "{context}: unexpected error {err:?}"
                );
                let disposal = owner_disposal.lock().take();
                if let Some(d) = disposal {
                    d.await;
                }
                nothing_live(&rt, "child", &context);
                drop(guard);
                assert!(
                    !stored(&*persistence, "child").await,
                    "{context}: a header was stored"
                );
                if rt.is_active() {
                    let again = create(&rt, "child").await;
                    again.dispose().await;
                }
                owner.dispose().await;
                rt.shutdown().await;
                drop(guards);
                assert_paired(&log.lock(), &context);
                finish(&rt, []).await;
            }
        }
    }
}

/// spec: SPN-56 (ids reopen only after quiescence) — concurrent creations of one id on a
/// multi-threaded runtime (with and without setups that yield): exactly one wins, every other
/// fails `Duplicate`, and nothing is half-registered — one agent, one live session, one stored
/// header, and the losers' announcements (none) and scopes leave nothing once the winner is
/// disposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creations_of_one_id_have_one_winner() {
    let model = ScriptedModel::default();
    let persistence = Arc::new(MemoryStore::new());
    let rt = builder(&model).persistence(persistence.clone()).build();
    let (log, guards) = record(&rt);
    for round in 0..24 {
        let id = format!("x{round}");
        let tasks: Vec<_> = (0..4)
            .map(|n| {
                let (rt, id) = (rt.clone(), id.clone());
                tokio::spawn(async move {
                    let mut o = create_options(&id);
                    if (n + round) % 2 == 0 {
                        o.setup = appending_setup();
                    }
                    rt.create(o).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(handle) => winners.push(handle),
                Err(AgentError::Duplicate(dup)) => assert_eq!(dup.as_str(), id),
                Err(other) => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        assert_eq!(AgentRuntime::list(&rt).len(), 1, "round {round}");
        assert_eq!(rt.sessions().len(), 1, "round {round}");
        assert!(stored(&*persistence, &id).await, "round {round}");
        for w in winners {
            w.dispose().await;
        }
        nothing_live(&rt, &id, &format!("round {round}"));
    }
    rt.shutdown().await;
    drop(guards);
    assert_paired(&log.lock(), "concurrent creations");
    finish(&rt, []).await;
}

/// Runtime shutdown racing creations (owned and unowned, with yielding setups) and a resume on
/// a multi-threaded runtime: every creation either returns a handle or fails with a typed
/// error; once shutdown returned and every creation settled the runtime is quiescent without
/// anyone disposing the returned handles (shutdown disposed them), every announcement is paired,
/// and no rolled-back creation stored a header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_racing_creations_leaves_nothing() {
    for round in 0..16 {
        let model = ScriptedModel::new((0..8).map(|_| chunks::text("ok")));
        let persistence = Arc::new(MemoryStore::new());
        let rt = builder(&model).persistence(persistence.clone()).build();
        // A stored session to resume.
        let old = create(&rt, "old").await;
        old.dispose().await;
        let (log, guards) = record(&rt);
        let parent = Arc::new(create(&rt, "parent").await);
        parent.agent().followup(user("busy")).unwrap();
        let mut tasks = Vec::new();
        for n in 0..6 {
            let (rt, parent) = (rt.clone(), parent.agent().clone());
            tasks.push(tokio::spawn(async move {
                let mut o = create_options(&format!("c{n}"));
                if n % 2 == 0 {
                    o.setup = appending_setup();
                }
                if n % 3 == 0 {
                    o.owner = Some(parent);
                }
                rt.create(o).await
            }));
        }
        let rt2 = rt.clone();
        tasks.push(tokio::spawn(async move {
            let mut o = resume_options("old");
            o.setup = appending_setup();
            rt2.resume(o).await
        }));
        let rt2 = rt.clone();
        let shutdown = tokio::spawn(async move {
            for _ in 0..round {
                tokio::task::yield_now().await;
            }
            rt2.shutdown().await;
        });
        let mut handles = Vec::new();
        let mut failed = Vec::new();
        for (n, t) in tasks.into_iter().enumerate() {
            match t.await.unwrap() {
                Ok(handle) => handles.push(handle),
                Err(err) => {
                    assert!(
                        matches!(
                            err,
                            AgentError::CreationAborted { .. }
                                | AgentError::OwnerDisposed(_)
                                | AgentError::Inactive(_)
                        ),
                        "round {round}: creation {n}: {err:?}"
                    );
                    failed.push(n);
                }
            }
        }
        shutdown.await.unwrap();
        drop(guards);
        assert_quiescent(&rt);
        for handle in &handles {
            assert!(
                !handle.agent().is_live(),
                "round {round}: {} survived shutdown",
                handle.id()
            );
        }
        for n in failed.into_iter().filter(|n| *n < 6) {
            assert!(
                !stored(&*persistence, &format!("c{n}")).await,
                "round {round}: rolled-back c{n} stored a header"
            );
        }
        assert_paired(&log.lock(), &format!("round {round}"));
        finish(&rt, handles).await;
    }
}

/// An agent's disposal racing its running turn, pending `when_idle` waiters, a resume and a
/// re-creation of its id on a multi-threaded runtime: every waiter returns, the resume and the
/// re-creation either fail typed (`Duplicate` while the id is taken) or publish once the
/// disposal reached quiescence; at most one agent holds the id at any time (checked at every
/// publication); the stored log stays loadable with contiguous seqs; and everything ends
/// quiescent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disposal_racing_a_turn_waiters_and_resume() {
    for round in 0..16 {
        let model = ScriptedModel::new((0..8).map(|i| chunks::text(format!("reply {i}"))));
        let persistence = Arc::new(MemoryStore::new());
        let rt = builder(&model).persistence(persistence.clone()).build();
        let (log, guards) = record(&rt);
        // At most one registered agent per id at every publication.
        let violations = Arc::new(Mutex::new(Vec::new()));
        let live_check = {
            let (inner, violations) = (Arc::downgrade(&rt.inner), violations.clone());
            rt.services().agent_events.on(move |e| {
                if let (AgentEvent::Created { agent }, Some(inner)) = (e, inner.upgrade()) {
                    let holders = inner
                        .registry
                        .lock()
                        .values()
                        .filter(|e| e.agent.id() == agent)
                        .count();
                    if holders > 1 {
                        violations
                            .lock()
                            .push(format!("{holders} agents registered as {agent}"));
                    }
                }
                Ok(())
            })
        };
        let handle = Arc::new(create(&rt, "a").await);
        handle.agent().followup(user("go")).unwrap();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let agent = handle.agent().clone();
                tokio::spawn(async move { agent.when_idle().await })
            })
            .collect();
        let rt2 = rt.clone();
        let resumer = tokio::spawn(async move {
            for _ in 0..round % 4 {
                tokio::task::yield_now().await;
            }
            rt2.resume(resume_options("a")).await
        });
        let h = handle.clone();
        let disposer = tokio::spawn(async move { h.dispose().await });
        let rt2 = rt.clone();
        let creator = tokio::spawn(async move { rt2.create(create_options("a")).await });
        for w in waiters {
            w.await.unwrap();
        }
        disposer.await.unwrap();
        let mut handles = Vec::new();
        for outcome in [resumer.await.unwrap(), creator.await.unwrap()] {
            match outcome {
                Ok(h) => handles.push(h),
                // A fresh creation of a stored id is a duplicate in persistence.
                Err(AgentError::Duplicate(_)) => {}
                Err(other) => panic!("round {round}: {other:?}"),
            }
        }
        assert!(handles.len() <= 1, "round {round}: two agents published");
        for h in &handles {
            h.dispose().await;
        }
        let stored = persistence.load(&"a".into()).await.expect("the stored log loads");
        assert!(
            stored.events.iter().enumerate().all(|(i, e)| e.seq == i as u64),
            "round {round}: gaps in the stored log"
        );
        rt.shutdown().await;
        drop((guards, live_check));
        assert!(
            violations.lock().is_empty(),
            "round {round}: {:?}",
            violations.lock()
        );
        assert_paired(&log.lock(), &format!("round {round}"));
        finish(&rt, handles).await;
        drop(handle);
    }
}

/// spec: SPN-51 — a setup that fails (an error, a panic, a failing `commit`, or a panicking
/// `commit`) after each number of its scheduling points publishes nothing, announces nothing,
/// stores nothing, and frees the id at once; a panic is reported as [`AgentError::Setup`]
/// naming it.
#[tokio::test(start_paused = true)]
async fn failing_setup_at_every_point_stores_nothing() {
    for yields in 0..4 {
        for failure in ["error", "panic", "commit", "commit-panic"] {
            let context = format!("{failure} after {yields} yields");
            let model = ScriptedModel::default();
            let persistence = Arc::new(MemoryStore::new());
            let rt = builder(&model).persistence(persistence.clone()).build();
            let (log, guards) = record(&rt);
            let mut o = create_options("child");
            o.setup = Some(Box::new(move |ctx: Ctx| {
                async move {
                    let agent = ctx.agent().expect("scoped").clone();
                    for i in 0..yields {
                        agent.followup(user(&format!("setup {i}")))?;
                        tokio::task::yield_now().await;
                    }
                    match failure {
                        "error" => Err("setup failed".into()),
                        "panic" => panic!("setup exploded"),
                        "commit" => {
                            let commit: agent::runtime::Commit = Box::new(|| Err("commit failed".into()));
                            Ok(Some(commit))
                        }
                        _ => {
                            let commit: agent::runtime::Commit = Box::new(|| panic!("commit exploded"));
                            Ok(Some(commit))
                        }
                    }
                }
                .boxed()
            }));
            let err = std::panic::AssertUnwindSafe(rt.create(o))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| panic!("{context}: the panic unwound out of create"))
                .expect_err(&context);
            assert!(matches!(err, AgentError::Setup { .. }), "{context}: {err:?}");
            let named = match failure {
                "error" => "setup failed",
                "panic" => "setup exploded",
                "commit" => "commit failed",
                _ => "commit exploded",
            };
            assert!(err.to_string().ends_with(named), "{context}: {err}");
            nothing_live(&rt, "child", &context);
            assert!(!stored(&*persistence, "child").await, "{context}: stored");
            assert!(log.lock().is_empty(), "{context}: announced {:?}", log.lock());
            let again = create(&rt, "child").await;
            drop(guards);
            finish(&rt, [again]).await;
        }
    }
}

/// spec: SPN-50, SPN-55 — a setup that fails because its creation was interrupted in the same
/// poll (the interruption reached it synchronously, as one from another thread of a
/// multi-threaded runtime does: the caller's signal cancelled, the owner's disposal begun, the
/// runtime's shutdown begun), typically with the `Disposed` of the agent the rollback took from
/// it, reports the interruption's typed error, not a setup failure; nothing is left.
#[tokio::test(start_paused = true)]
async fn a_setup_failing_from_its_interruption_reports_the_interruption() {
    for interrupt in [Interrupt::Signal, Interrupt::Owner, Interrupt::Shutdown] {
        let context = format!("{interrupt:?}");
        let model = ScriptedModel::default();
        let rt = builder(&model).build();
        let owner = Arc::new(create(&rt, "owner").await);
        let signal = Signal::new();
        // The interruption begun by the setup, awaited to its end by the test.
        let begun: Arc<Mutex<Option<futures::future::BoxFuture<'static, ()>>>> = Arc::default();
        let mut o = create_options("child");
        o.owner = Some(owner.agent().clone());
        o.signal = Some(signal.clone());
        let (slot, rt2, owner_agent) = (begun.clone(), rt.clone(), owner.clone());
        o.setup = Some(Box::new(move |ctx: Ctx| {
            async move {
                let agent = ctx.agent().expect("scoped").clone();
                agent.followup(user("setup"))?;
                let mut interruption: futures::future::BoxFuture<'static, ()> = match interrupt {
                    Interrupt::Signal => {
                        signal.cancel(CancelCause::User);
                        futures::future::ready(()).boxed()
                    }
                    Interrupt::Owner => owner_agent.dispose(),
                    _ => async move { rt2.shutdown().await }.boxed(),
                };
                // Its synchronous part runs now, inside this poll of the setup.
                if futures::poll!(interruption.as_mut()).is_pending() {
                    *slot.lock() = Some(interruption);
                }
                agent.followup(user("after"))?;
                Err("setup failed after its interruption".into())
            }
            .boxed()
        }));
        let err = rt.create(o).await.expect_err(&context);
        assert!(expected_error(interrupt, &err), "{context}: {err:?}");
        let pending = begun.lock().take();
        if let Some(interruption) = pending {
            interruption.await;
        }
        nothing_live(&rt, "child", &context);
        owner.dispose().await;
        finish(&rt, []).await;
    }
}

/// A resumption rolled back after its session entered the store (a `session/created` listener
/// vetoes) leaves the stored log exactly as it was: neither the repair of its open turn nor its
/// setup's appends are written; a later resumption succeeds from the same log.
#[tokio::test(start_paused = true)]
async fn a_vetoed_resume_leaves_the_stored_log_unchanged() {
    let model = ScriptedModel::new((0..4).map(|_| chunks::text("ok")));
    let persistence = Arc::new(MemoryStore::new());
    let rt = builder(&model).persistence(persistence.clone()).build();
    let first = create(&rt, "a").await;
    first.agent().followup(user("go")).unwrap();
    first.agent().when_idle().await;
    first.dispose().await;
    let before = persistence.load(&"a".into()).await.unwrap().events;
    let (log, guards) = record(&rt);
    let veto = rt.sessions().events().on(|e| match e {
        SessionStoreEvent::Created(_) => Err("veto".into()),
        _ => Ok(()),
    });
    let mut o = resume_options("a");
    o.setup = injecting_setup();
    assert!(rt.resume(o).await.is_err());
    nothing_live(&rt, "a", "vetoed resume");
    let after = persistence.load(&"a".into()).await.unwrap().events;
    assert_eq!(after, before, "a vetoed resume wrote to the stored log");
    drop(veto);
    let mut o = resume_options("a");
    o.setup = injecting_setup();
    let resumed = rt.resume(o).await.expect("resumes from the unchanged log");
    resumed.dispose().await;
    let stored = persistence.load(&"a".into()).await.unwrap().events;
    assert!(
        stored.len() > before.len(),
        "the setup's append is stored once published"
    );
    assert!(stored.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    drop(guards);
    assert_paired(&log.lock(), "vetoed resume");
    finish(&rt, []).await;
}

/// A resume of a session whose log another runtime's store is writing fails at once — the
/// claim finds the log locked — rather than publishing an agent whose appends fail at a later
/// flush; nothing is live and the log is unchanged. Once the other writer lets go — its agent
/// disposed, which releases the log without closing the store — the same runtime resumes the
/// session and continues its log.
#[tokio::test(start_paused = true)]
async fn a_resume_of_a_log_another_store_writes_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let id = SessionId::from("a");
    let model = ScriptedModel::new((0..4).map(|_| chunks::text("ok")));
    let writing = Arc::new(JsonlStore::new(dir.path()));
    let rt_writing = builder(&model).persistence(writing.clone()).build();
    let first = create(&rt_writing, "a").await;
    first.agent().followup(user("go")).unwrap();
    first.agent().when_idle().await;
    writing.flush(&id).await.unwrap();
    let path = writing.path_of(&id).unwrap();
    let before = std::fs::read(&path).unwrap();
    let stored_before = JsonlStore::new(dir.path()).load(&id).await.unwrap().events.len();

    let resuming = Arc::new(JsonlStore::new(dir.path()));
    let rt = builder(&model).persistence(resuming.clone()).build();
    let err = rt
        .resume(resume_options("a"))
        .await
        .expect_err("the log is held by the other store");
    assert!(
        matches!(&err, AgentError::Persistence(msg) if msg.contains("locked")),
        "{err}"
    );
    nothing_live(&rt, "a", "refused resume");
    assert!(
        std::fs::read(&path).unwrap() == before,
        "the refused resume wrote to the log"
    );

    // The writing agent goes away; its store (still open) lets go of the log once what it
    // accepted is written — which its flush waits for.
    first.dispose().await;
    writing.flush(&id).await.unwrap();
    assert_eq!(writing.sync_count(&id), None, "the writing store holds no writer");
    let resumed = rt
        .resume(resume_options("a"))
        .await
        .expect("resumes once the other store let go");
    resumed.agent().followup(user("again")).unwrap();
    resumed.agent().when_idle().await;
    resumed.dispose().await;
    resuming.flush(&id).await.unwrap();
    let stored = JsonlStore::new(dir.path()).load(&id).await.unwrap().events;
    assert!(stored.len() > stored_before, "the resumed turn is stored");
    assert!(stored.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    finish(&rt, []).await;
    finish(&rt_writing, []).await;
}

/// An observer that panics in `attach`.
struct PanickingAttach;

impl agent::SessionObserver for PanickingAttach {
    fn attach(&self, _: &Session) -> Result<(), String> {
        panic!("attach exploded")
    }
}

/// A store observer refusing a session as it is entered (here: panicking in `attach`) fails the
/// creation with `LogError::Refused` naming the panic, and the creation rolls back: nothing is
/// live, nothing reaches persistence, and the runtime stays usable.
#[tokio::test(start_paused = true)]
async fn an_observer_refusing_a_session_at_entry_fails_its_creation() {
    let model = ScriptedModel::new((0..2).map(|_| chunks::text("ok")));
    let persistence = Arc::new(MemoryStore::new());
    let rt = builder(&model)
        .persistence(persistence.clone())
        .session_observer(Arc::new(PanickingAttach))
        .build();
    let err = rt.create(create_options("a")).await.expect_err("refused");
    assert!(
        matches!(&err, AgentError::Log(agent::LogError::Refused { session, reason })
            if session.as_str() == "a" && reason.contains("attach exploded")),
        "{err:?}"
    );
    nothing_live(&rt, "a", "refused creation");
    assert!(!stored(persistence.as_ref(), "a").await);
    finish(&rt, []).await;
}

/// A resumption that claimed its log and then rolled back before publishing — its setup
/// failed, or its owner's teardown rolled it back in its setup window (at once, without its
/// creator's future) — lets go of the log (spec `SessionPersistence::release`: "its creation or
/// resumption rolled back"): its store holds no writer for it, and another store resumes the
/// session at once instead of finding the log locked.
#[tokio::test(start_paused = true)]
async fn a_resume_rolled_back_before_publication_releases_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let id = SessionId::from("a");
    let model = ScriptedModel::new((0..4).map(|_| chunks::text("ok")));
    let store = Arc::new(JsonlStore::new(dir.path()));
    let rt = builder(&model).persistence(store.clone()).build();
    let first = create(&rt, "a").await;
    first.agent().followup(user("go")).unwrap();
    first.agent().when_idle().await;
    first.dispose().await;
    store.flush(&id).await.unwrap();
    assert_eq!(store.sync_count(&id), None, "the disposed agent's log is let go");

    // The setup fails after the claim.
    let mut o = resume_options("a");
    o.setup = Some(Box::new(|_: Ctx| {
        async { Err::<Option<agent::runtime::Commit>, _>("setup refused".into()) }.boxed()
    }));
    let err = rt.resume(o).await.expect_err("the setup fails");
    assert!(matches!(&err, AgentError::Setup { .. }), "{err:?}");
    nothing_live(&rt, "a", "failed setup");
    assert_eq!(
        store.sync_count(&id),
        None,
        "a resumption whose setup failed still holds the log"
    );

    // The owner's teardown rolls the resumption back in its setup window; its future is kept
    // unpolled meanwhile.
    let owner = create(&rt, "owner").await;
    let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
    let mut o = resume_options("a");
    o.owner = Some(owner.agent().clone());
    let entered_tx = Mutex::new(Some(entered_tx));
    o.setup = Some(Box::new(move |_: Ctx| {
        let entered_tx = entered_tx.lock().take();
        async move {
            if let Some(tx) = entered_tx {
                let _ = tx.send(());
            }
            futures::future::pending::<()>().await;
            Ok(None)
        }
        .boxed()
    }));
    let mut resuming = rt.resume(o);
    tokio::select! {
        biased;
        _ = entered => {}
        _ = &mut resuming => panic!("the setup never ends"),
    }
    owner.dispose().await;
    assert_eq!(
        store.sync_count(&id),
        None,
        "a resumption its owner rolled back still holds the log"
    );
    let other_store = Arc::new(JsonlStore::new(dir.path()));
    let other = builder(&model).persistence(other_store.clone()).build();
    let resumed = other
        .resume(resume_options("a"))
        .await
        .expect("another store resumes the log the rolled-back resumption let go");
    let err = resuming.await.expect_err("rolled back by its owner");
    assert!(matches!(&err, AgentError::OwnerDisposed(_)), "{err:?}");
    resumed.dispose().await;
    finish(&other, []).await;
    finish(&rt, []).await;
}
