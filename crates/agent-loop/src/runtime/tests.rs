//! Tests of the registry: the creation transaction, scopes, owner links, disposal and resume
//! (spec §7, §9). Each cites the checklist ID it ports (`spec/agent-spine.md` §16).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt;
use parking_lot::Mutex;

use agent::event::RequestHeaderReason;
use agent::hooks::SessionStartSource;
use agent::prompt::{PERSONA_SECTION, PromptSection};
use agent::runtime::Setup;
use agent::tools::ToolOutput;
use agent::{
    AgentError, AgentEvent, AgentRuntime, CancelCause, CreateAgentOptions, EventData, ResumeAgentOptions,
    SessionEvent, SessionId, SessionMeta, SessionObserver, SessionStore, Signal, TurnEndReason,
};

use super::*;
use crate::model::{ScriptEntry, ScriptedModel, chunks};
use crate::runtime::testkit::*;

fn options(id: &str) -> CreateAgentOptions {
    let mut o = CreateAgentOptions::new(id.into());
    o.agent_options = mock_options();
    o
}

fn setup<F, Fut>(f: F) -> Option<Setup>
where
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = Result<Option<agent::runtime::Commit>, agent::BoxError>> + Send + 'static,
{
    Some(Box::new(move |ctx| f(ctx).boxed()))
}

fn nothing_published(rt: &Runtime, id: &str) {
    let id: SessionId = id.into();
    assert!(AgentRuntime::get(rt, &id).is_none(), "agent {id} published");
    assert!(rt.sessions().get(&id).is_none(), "session {id} published");
}

/// Records store notifications as strings.
fn record_store(rt: &Runtime, log: Arc<Mutex<Vec<String>>>) -> Registration {
    rt.sessions().events().on(move |e| {
        log.lock().push(match e {
            SessionStoreEvent::Created(s) => format!("session/created:{}", s.id()),
            SessionStoreEvent::Disposed(id) => format!("session/disposed:{id}"),
        });
        Ok(())
    })
}

/// Records agent notifications (lifecycle only) as strings.
fn record_lifecycle(rt: &Runtime, log: Arc<Mutex<Vec<String>>>) -> Registration {
    rt.services().agent_events.on(move |e| {
        let entry = match e {
            AgentEvent::Created { agent } => format!("agent/created:{agent}"),
            AgentEvent::SessionStart { agent, source } => format!("agent/session-start:{agent}:{source:?}"),
            AgentEvent::Disposed { agent } => format!("agent/disposed:{agent}"),
            _ => return Ok(()),
        };
        log.lock().push(entry);
        Ok(())
    })
}

/// spec: SPN-49 — a pre-cancelled creation signal rejects with its cause and publishes
/// nothing.
#[tokio::test(start_paused = true)]
async fn spn_49_pre_cancelled_creation_signal_rejects() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let log = Arc::new(Mutex::new(Vec::new()));
    let g1 = record_store(&rt, log.clone());
    let g2 = record_lifecycle(&rt, log.clone());
    for cause in [
        CancelCause::User,
        CancelCause::Other {
            reason: "plain cancellation reason".into(),
        },
    ] {
        let mut o = options("pre-aborted");
        o.signal = Some(Signal::cancelled_with(cause.clone()));
        let err = rt.create(o).await.unwrap_err();
        assert!(
            matches!(&err, AgentError::CreationAborted { id, cause: c } if id.as_str() == "pre-aborted" && *c == cause)
        );
        if let CancelCause::Other { .. } = cause {
            assert_eq!(
                err.to_string(),
                "agent \"pre-aborted\" creation aborted: plain cancellation reason"
            );
        }
        nothing_published(&rt, "pre-aborted");
    }
    assert!(log.lock().is_empty());
    drop((g1, g2));
    finish(&rt, []).await;
}

/// spec: SPN-50 — the creation signal aborts pending setup but not a returned live handle.
#[tokio::test(start_paused = true)]
async fn spn_50_creation_signal_is_creation_only() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let signal = Signal::new();
    let mut o = options("pending");
    o.signal = Some(signal.clone());
    let started = Arc::new(tokio::sync::Notify::new());
    let s = started.clone();
    o.setup = setup(move |ctx| async move {
        ctx.prompt_section(PromptSection {
            name: PERSONA_SECTION.into(),
            order: 0,
            text: "setup persona".into(),
            tool: None,
        })?;
        s.notify_one();
        std::future::pending::<()>().await;
        Ok(None)
    });
    let rt2 = rt.clone();
    let creating = tokio::spawn(async move { rt2.create(o).await });
    started.notified().await;
    signal.cancel(CancelCause::Parent);
    let err = creating.await.unwrap().unwrap_err();
    assert!(matches!(
        err,
        AgentError::CreationAborted {
            cause: CancelCause::Parent,
            ..
        }
    ));
    nothing_published(&rt, "pending");
    assert_eq!(rt.prompt().scoped_len(), 0, "setup registrations unwound");

    let live_signal = Signal::new();
    let mut o = options("live");
    o.signal = Some(live_signal.clone());
    let handle = rt.create(o).await.unwrap();
    live_signal.cancel(CancelCause::User);
    settle().await;
    assert!(AgentRuntime::get(&rt, handle.id()).is_some());
    assert!(handle.agent().is_live());
    assert_eq!(handle.agent().status(), agent::AgentStatus::Idle);
    finish(&rt, [handle]).await;
}

/// spec: SPN-51 — a rejecting setup publishes nothing, unwinds the scope, and frees the id.
#[tokio::test(start_paused = true)]
async fn spn_51_rejecting_setup_rolls_back() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let mut o = options("child");
    o.setup = setup(|ctx| async move {
        ctx.register_tool(tool("mine", |_a, _c| async { Ok(ToolOutput::text("x")) }))?;
        ctx.on_agent_event(|_| Ok(()))?;
        ctx.prompt_section(PromptSection {
            name: PERSONA_SECTION.into(),
            order: 0,
            text: "child".into(),
            tool: None,
        })?;
        Err("setup failed".into())
    });
    let err = rt.create(o).await.unwrap_err();
    assert_eq!(err.to_string(), "agent \"child\" setup failed: setup failed");
    nothing_published(&rt, "child");
    assert_eq!(rt.tool_registry().unwrap().counts().scope_layers, 0);
    assert_eq!(rt.services().agent_events.listener_count(), 0);
    assert_eq!(rt.prompt().scoped_len(), 0);
    // A failing commit rolls back the same way.
    let mut o = options("child");
    o.setup = setup(|_ctx| async move {
        Ok(Some(
            Box::new(|| Err("commit failed".into())) as agent::runtime::Commit
        ))
    });
    assert!(matches!(rt.create(o).await, Err(AgentError::Setup { .. })));
    nothing_published(&rt, "child");
    // The id is immediately reusable.
    let handle = rt.create(options("child")).await.unwrap();
    finish(&rt, [handle]).await;
}

/// spec: SPN-52 — an exotic (non-JSON) seed rejects creation before publication.
#[tokio::test(start_paused = true)]
async fn spn_52_exotic_seed_rejects_before_publication() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let log = Arc::new(Mutex::new(Vec::new()));
    let g = record_store(&rt, log.clone());
    let mut o = options("seeded");
    o.seed = Some(vec![SessionEvent {
        seq: 0,
        time: 1,
        data: EventData::other("x/exotic", serde_json::json!({"n": -0.0})),
        surface: None,
        ignorable: false,
    }]);
    let err = rt.create(o).await.unwrap_err();
    assert!(
        err.to_string()
            .starts_with("seed event at index 0 is not losslessly JSON-serializable"),
        "{err}"
    );
    nothing_published(&rt, "seeded");
    assert!(log.lock().is_empty());
    drop(g);
    finish(&rt, []).await;
}

/// spec: SPN-53 — setup registrations exist before `session-start` and the first assembly;
/// publication order is session then agent.
#[tokio::test(start_paused = true)]
async fn spn_53_setup_composes_before_publication_in_order() {
    let model = ScriptedModel::new([chunks::text("ok")]);
    let rt = builder(&model).persona("You are the deployment.").build();
    let log = Arc::new(Mutex::new(Vec::new()));
    let g1 = record_store(&rt, log.clone());
    let g2 = record_lifecycle(&rt, log.clone());
    let l = log.clone();
    let prompt = rt.prompt().clone();
    let g3 = rt.services().agent_events.on(move |e| {
        if let AgentEvent::SessionStart { agent, .. } = e {
            let persona = agent::prompt::Prompt::sections(&prompt, Some(agent))
                .into_iter()
                .find(|s| s.name == PERSONA_SECTION)
                .map(|s| s.text);
            l.lock().push(format!("persona:{}", persona.unwrap_or_default()));
        }
        Ok(())
    });
    let mut o = options("child");
    let l = log.clone();
    let rt2 = rt.clone();
    o.setup = setup(move |ctx| async move {
        l.lock().push("setup:start".into());
        assert!(
            rt2.sessions().get(&"child".into()).is_none(),
            "unpublished during setup"
        );
        assert!(AgentRuntime::get(&rt2, &"child".into()).is_none());
        tokio::task::yield_now().await;
        ctx.prompt_section(PromptSection {
            name: PERSONA_SECTION.into(),
            order: 0,
            text: "You are the child.".into(),
            tool: None,
        })?;
        let l = l.clone();
        Ok(Some(Box::new(move || {
            l.lock().push("setup:commit".into());
            Ok(())
        }) as agent::runtime::Commit))
    });
    let handle = rt.create(o).await.unwrap();
    assert_eq!(
        *log.lock(),
        [
            "setup:start",
            "setup:commit",
            "session/created:child",
            "agent/created:child",
            "agent/session-start:child:Startup",
            "persona:You are the child.",
        ]
    );
    handle.agent().followup(user("hi")).unwrap();
    handle.agent().when_idle().await;
    assert_eq!(model.requests()[0].system.as_deref(), Some("You are the child."));
    drop((g1, g2, g3));
    finish(&rt, [handle]).await;
}

/// spec: SPN-54 — scoped registrations are visible only to their agent and die with it;
/// registering through a disposed scope fails.
#[tokio::test(start_paused = true)]
async fn spn_54_scoped_registrations_are_private_and_die_with_the_agent() {
    let model = ScriptedModel::default();
    let rt = builder(&model).persona("deployment").build();
    let a = create(&rt, "a").await;
    let b = create(&rt, "b").await;
    let ctx = rt.agent_ctx(a.id()).unwrap();
    ctx.register_tool(tool("mine", |_a, _c| async { Ok(ToolOutput::text("x")) }))
        .unwrap();
    ctx.prompt_section(PromptSection {
        name: PERSONA_SECTION.into(),
        order: 0,
        text: "scoped".into(),
        tool: None,
    })
    .unwrap();
    let heard = Arc::new(AtomicUsize::new(0));
    let h = heard.clone();
    ctx.on_agent_event(move |_| {
        h.fetch_add(1, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    let tools = &rt.services().tools;
    let prompt = rt.prompt();
    assert!(tools.get("mine", Some(a.id())).is_some());
    assert!(tools.get("mine", Some(b.id())).is_none());
    assert!(tools.get("mine", None).is_none());
    let persona = |id: Option<&SessionId>| {
        agent::prompt::Prompt::sections(prompt, id)
            .into_iter()
            .find(|s| s.name == PERSONA_SECTION)
            .unwrap()
            .text
    };
    assert_eq!(persona(Some(a.id())), "scoped");
    assert_eq!(persona(Some(b.id())), "deployment");
    // Scoped listeners hear only their agent.
    b.agent().inject(user("for b")).unwrap();
    assert_eq!(heard.load(Ordering::SeqCst), 0);
    a.agent().inject(user("for a")).unwrap();
    assert_eq!(heard.load(Ordering::SeqCst), 1);
    let a_id = a.id().clone();
    a.dispose().await;
    assert!(tools.get("mine", Some(&a_id)).is_none());
    assert_eq!(persona(Some(&a_id)), "deployment");
    let err = ctx
        .register_tool(tool("late", |_a, _c| async { Ok(ToolOutput::text("x")) }))
        .unwrap_err();
    assert!(matches!(err, AgentError::Inactive(_)), "{err}");
    assert!(tools.get("late", Some(&a_id)).is_none());
    finish(&rt, [b]).await;
}

/// Records `turn/end` events of one session, for teardown-order assertions.
struct TurnEndObserver {
    id: SessionId,
    log: Arc<Mutex<Vec<String>>>,
}

impl SessionObserver for TurnEndObserver {
    fn committed(&self, session: &agent::Session, event: &Arc<SessionEvent>) {
        if session.id() == &self.id && event.type_name() == "turn/end" {
            self.log.lock().push(format!("turn/end:{}", self.id));
        }
    }
}

/// spec: SPN-55 — owner disposal aborts a pending setup (publishing nothing) and disposes live
/// owned agents in order: turn end, unregistration, then session detach.
#[tokio::test(start_paused = true)]
async fn spn_55_owner_disposal_aborts_setup_and_disposes_children_in_order() {
    let model = ScriptedModel::new([ScriptEntry::hang()]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let rt = builder(&model)
        .session_observer(Arc::new(TurnEndObserver {
            id: "child".into(),
            log: log.clone(),
        }))
        .build();
    let owner = create(&rt, "owner").await;

    // A pending creation owned by `owner`.
    let mut o = options("pending");
    o.owner = Some(owner.agent().clone());
    let started = Arc::new(tokio::sync::Notify::new());
    let s = started.clone();
    o.setup = setup(move |_ctx| async move {
        s.notify_one();
        std::future::pending::<()>().await;
        Ok(None)
    });
    let rt2 = rt.clone();
    let pending = tokio::spawn(async move { rt2.create(o).await });
    started.notified().await;

    // A live owned child in a running turn.
    let mut o = options("child");
    o.owner = Some(owner.agent().clone());
    let child = rt.create(o).await.unwrap();
    child.agent().followup(user("work")).unwrap();
    settle().await;

    let g1 = record_store(&rt, log.clone());
    let g2 = record_lifecycle(&rt, log.clone());
    owner.dispose().await;
    let err = pending.await.unwrap().unwrap_err();
    assert_eq!(
        err.to_string(),
        "agent \"pending\" setup aborted: owner disposed during setup"
    );
    nothing_published(&rt, "pending");
    nothing_published(&rt, "child");
    let log = log.lock().clone();
    let child_events: Vec<&String> = log.iter().filter(|e| e.ends_with(":child")).collect();
    assert_eq!(
        child_events,
        ["turn/end:child", "agent/disposed:child", "session/disposed:child"]
    );
    assert_eq!(
        turn_ends(&**child.agent()),
        [TurnEndReason::Aborted {
            reason: CancelCause::Disposed
        }]
    );
    // Creating through a disposed owner fails as an inactive context.
    let mut o = options("orphan");
    o.owner = Some(owner.agent().clone());
    assert!(matches!(rt.create(o).await, Err(AgentError::Inactive(_))));
    drop((g1, g2));
    finish(&rt, [child]).await;
}

/// spec: SPN-56 — concurrent handle disposal and owner disposal share one quiescence boundary;
/// ids reopen only after quiescence.
#[tokio::test(start_paused = true)]
async fn spn_56_concurrent_disposals_share_one_boundary() {
    let model = ScriptedModel::new([ScriptEntry::hang_slow()]);
    let rt = runtime(&model);
    let log = Arc::new(Mutex::new(Vec::new()));
    let g = record_lifecycle(&rt, log.clone());
    let owner = create(&rt, "owner").await;
    let mut o = options("child");
    o.owner = Some(owner.agent().clone());
    let child = rt.create(o).await.unwrap();
    child.agent().followup(user("work")).unwrap();
    settle().await;
    let by_handle = child.dispose();
    let by_owner = owner.dispose();
    let again = child.dispose();
    // Not quiescent yet (the slow stream notices cancellation late): the id is still taken.
    assert!(matches!(
        rt.create(options("child")).await,
        Err(AgentError::Duplicate(_))
    ));
    futures::join!(by_handle, by_owner, again);
    assert_eq!(
        log.lock().iter().filter(|e| *e == "agent/disposed:child").count(),
        1,
        "one teardown"
    );
    assert!(child.agent().when_idle().now_or_never().is_some());
    // Quiescent: the id reopens.
    let reopened = rt.create(options("child")).await.unwrap();
    drop(g);
    finish(&rt, [reopened]).await;
}

/// spec: SPN-57 — resume preserves `parentSession`, `cwd`, `seedLength` and `delegationDepth`
/// from the header, repairs an open turn with `turn/end {interrupted}`, continues turn
/// numbering and logs the first request header as `resume`.
#[tokio::test(start_paused = true)]
async fn spn_57_resume_preserves_header_and_repairs_the_open_turn() {
    let model = ScriptedModel::new([
        chunks::text("seed").into(),
        chunks::text("one").into(),
        ScriptEntry::hang(),
        chunks::text("resumed").into(),
    ]);
    let persistence = Arc::new(TestPersistence::default());
    let rt = builder(&model).persistence(persistence.clone()).build();
    // A fork seed: a parent's balanced completed turn.
    let parent = create(&rt, "parent").await;
    parent.agent().followup(user("seeded history")).unwrap();
    parent.agent().when_idle().await;
    let seed: Vec<SessionEvent> = parent
        .agent()
        .session()
        .events()
        .iter()
        .map(|e| (**e).clone())
        .collect();
    let seed_length = seed.len() as u64;
    parent.dispose().await;
    let mut o = options("child");
    o.seed = Some(seed);
    o.meta = SessionMeta {
        cwd: Some("/work/space".into()),
        parent_session: Some("parent".into()),
        seed_length: Some(seed_length),
        delegation_depth: Some(2),
        ..SessionMeta::default()
    };
    let handle = rt.create(o).await.unwrap();
    let id = handle.id().clone();
    handle.agent().followup(user("first")).unwrap();
    handle.agent().when_idle().await;
    handle.agent().followup(user("second")).unwrap();
    settle().await;
    // Simulate a crash in the middle of turn 2: keep only what was durable then.
    let durable = persistence.events(&id).len();
    handle.dispose().await;
    persistence.truncate(&id, durable);
    let original = persistence.sessions.lock().get(&id).unwrap().0.clone();

    let log = Arc::new(Mutex::new(Vec::new()));
    let g = record_lifecycle(&rt, log.clone());
    let resumed = rt
        .resume(ResumeAgentOptions {
            session_id: id.clone(),
            agent_options: mock_options(),
            signal: None,
            setup: None,
            owner: None,
        })
        .await
        .unwrap();
    let agent = resumed.agent().clone();
    let header = agent.session().header();
    assert_eq!(*header, original);
    assert_eq!(header.parent_session, Some("parent".into()));
    assert_eq!(header.cwd, Some("/work/space".into()));
    assert_eq!(header.seed_length, Some(seed_length));
    assert_eq!(header.delegation_depth, Some(2));
    assert!(log.lock().contains(&format!(
        "agent/session-start:{id}:{:?}",
        SessionStartSource::Resume
    )));
    assert_eq!(turn_ends(&*agent).last(), Some(&TurnEndReason::Interrupted));
    agent.followup(user("third")).unwrap();
    agent.when_idle().await;
    let events = agent.session().events();
    let turns: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.data {
            EventData::TurnStart { turn } => Some(turn),
            _ => None,
        })
        .collect();
    assert_eq!(turns, [1, 2, 3, 4]);
    let reasons: Vec<RequestHeaderReason> = events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::RequestHeader { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.last(), Some(&RequestHeaderReason::Resume));
    assert!(agent::prefix::is_balanced(events.iter()));
    // The persisted log continues without gaps.
    let stored = persistence.events(&id);
    assert_eq!(stored.len(), events.len());
    assert!(stored.iter().enumerate().all(|(i, e)| e.seq == i as u64));
    // A live id cannot be resumed; without persistence resume is refused.
    assert!(matches!(
        rt.resume(ResumeAgentOptions {
            session_id: id.clone(),
            agent_options: mock_options(),
            signal: None,
            setup: None,
            owner: None,
        })
        .await,
        Err(AgentError::Duplicate(_))
    ));
    drop(g);
    finish(&rt, [resumed]).await;
    let bare = runtime(&ScriptedModel::default());
    let err = bare
        .resume(ResumeAgentOptions {
            session_id: "x".into(),
            agent_options: mock_options(),
            signal: None,
            setup: None,
            owner: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::Persistence(_)));
    finish(&bare, []).await;
}

/// A `session/created` listener failure vetoes and rolls back, pairing `session/disposed`.
#[tokio::test(start_paused = true)]
async fn failing_session_created_listener_rolls_back() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let log = Arc::new(Mutex::new(Vec::new()));
    let g1 = record_store(&rt, log.clone());
    let g2 = rt.sessions().events().on(|e| match e {
        SessionStoreEvent::Created(_) => Err("veto".into()),
        _ => Ok(()),
    });
    let g3 = record_lifecycle(&rt, log.clone());
    assert!(rt.create(options("a")).await.is_err());
    nothing_published(&rt, "a");
    assert_eq!(*log.lock(), ["session/created:a", "session/disposed:a"]);
    drop((g1, g2, g3));
    finish(&rt, []).await;
}

/// A panic in the host's persistence while a creation commits is contained: the creation fails
/// with `AgentError::Persistence` naming the panic and rolls back like any persistence failure
/// (it used to unwind out of `create`); the id is free again once persistence works.
#[tokio::test(start_paused = true)]
async fn a_persistence_panic_at_commit_fails_the_creation_and_rolls_back() {
    let model = ScriptedModel::default();
    let persistence = Arc::new(TestPersistence::default());
    persistence.panic_on_create.store(true, Ordering::Relaxed);
    let rt = builder(&model).persistence(persistence.clone()).build();
    let log = Arc::new(Mutex::new(Vec::new()));
    let g = record_store(&rt, log.clone());
    let created = std::panic::AssertUnwindSafe(rt.create(options("a")))
        .catch_unwind()
        .await
        .expect("the panic does not escape create");
    match created {
        Err(AgentError::Persistence(message)) => {
            assert!(message.contains("persistence exploded"), "{message}");
        }
        other => panic!(
            "expected a persistence error, got {:?}",
            other.map(|h| h.id().clone())
        ),
    }
    nothing_published(&rt, "a");
    assert_eq!(*log.lock(), ["session/created:a", "session/disposed:a"]);
    assert!(persistence.sessions.lock().is_empty(), "nothing stored");
    persistence.panic_on_create.store(false, Ordering::Relaxed);
    let handle = rt.create(options("a")).await.expect("the id is free");
    handle.dispose().await;
    drop(g);
    finish(&rt, []).await;
}

/// Dropping the `create` future mid-setup rolls back; shutdown aborts pending creations and
/// disposes every agent.
#[tokio::test(start_paused = true)]
async fn dropped_creation_and_shutdown_leave_nothing() {
    let model = ScriptedModel::new([ScriptEntry::hang()]);
    let rt = runtime(&model);
    let mut o = options("dropped");
    o.setup = setup(|ctx| async move {
        ctx.on_agent_event(|_| Ok(()))?;
        std::future::pending::<()>().await;
        Ok(None)
    });
    let fut = rt.create(o);
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(5), fut)
            .await
            .is_err()
    );
    nothing_published(&rt, "dropped");
    assert_eq!(rt.services().agent_events.listener_count(), 0);

    let a = create(&rt, "a").await;
    a.agent().followup(user("busy")).unwrap();
    settle().await;
    let mut o = options("pending");
    o.setup = setup(|_ctx| async move {
        std::future::pending::<()>().await;
        Ok(None)
    });
    let rt2 = rt.clone();
    let pending = tokio::spawn(async move { rt2.create(o).await });
    settle().await;
    rt.shutdown().await;
    let err = pending.await.unwrap().unwrap_err();
    assert_eq!(
        err.to_string(),
        "agent \"pending\" creation aborted: agent loop is not active"
    );
    assert_eq!(
        turn_ends(&**a.agent()),
        [TurnEndReason::Aborted {
            reason: CancelCause::Disposed
        }]
    );
    assert!(matches!(
        rt.create(options("late")).await,
        Err(AgentError::CreationAborted { .. })
    ));
    finish(&rt, [a]).await;
}

/// A re-entrant `dispose` from a listener the teardown triggers joins the same teardown; a
/// handle dropped without `dispose` is torn down in the background.
#[tokio::test(start_paused = true)]
async fn reentrant_dispose_and_dropped_handles_tear_down() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let handle = Arc::new(create(&rt, "a").await);
    handle.agent().inject(user("pending")).unwrap();
    let h = handle.clone();
    let joined = Arc::new(Mutex::new(None));
    let j = joined.clone();
    let guard = rt.services().agent_events.on(move |e| {
        if let AgentEvent::InboxDiscarded { .. } = e {
            *j.lock() = Some(h.dispose());
        }
        Ok(())
    });
    handle.dispose().await;
    let rejoined = joined.lock().take().expect("the listener re-entered dispose");
    rejoined.await;
    drop(guard);
    nothing_published(&rt, "a");

    let dropped = create(&rt, "b").await;
    drop(dropped);
    settle().await;
    nothing_published(&rt, "b");
    drop(handle);
    finish(&rt, []).await;
}

/// A handle dropped without `dispose` outside any tokio runtime (on a plain thread) is torn down
/// in the background all the same, on the runtime its agent was created on: the agent leaves
/// the registry, its turn is aborted and nothing stays published. (Its teardown used to start
/// and be dropped unrun there: the agent stayed registered, mid-turn, for ever.)
#[tokio::test(start_paused = true)]
async fn a_handle_dropped_outside_a_runtime_is_torn_down() {
    let model = ScriptedModel::new([ScriptEntry::hang_slow()]);
    let rt = runtime(&model);
    let handle = create(&rt, "a").await;
    handle.agent().followup(user("work")).unwrap();
    settle().await;
    let agent = handle.agent().clone();
    std::thread::spawn(move || {
        assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "no runtime on this thread"
        );
        drop(handle);
    })
    .join()
    .expect("the drop did not panic");
    settle().await;
    agent.when_idle().await;
    assert!(!agent.is_live());
    assert_eq!(
        turn_ends(&*agent),
        [TurnEndReason::Aborted {
            reason: CancelCause::Disposed
        }]
    );
    nothing_published(&rt, "a");
    drop(agent);
    finish(&rt, []).await;
}

/// A job service recording each owner it disposed the jobs of.
#[derive(Default)]
struct RecordingJobs(Mutex<Vec<SessionId>>);

#[async_trait::async_trait]
impl agent::Jobs for RecordingJobs {
    fn start(&self, _spec: agent::jobs::JobSpec) -> Result<agent::jobs::JobId, agent::jobs::JobError> {
        Err(agent::jobs::JobError::NoController)
    }
    fn list(&self, _owner: &SessionId) -> Vec<agent::jobs::JobInfo> {
        Vec::new()
    }
    fn kill(
        &self,
        _owner: &SessionId,
        id: &agent::jobs::JobId,
        _reason: Option<String>,
    ) -> Result<(), agent::jobs::JobError> {
        Err(agent::jobs::JobError::NotFound(id.clone()))
    }
    async fn read(
        &self,
        _owner: &SessionId,
        id: &agent::jobs::JobId,
        _wait: bool,
        _signal: &Signal,
    ) -> Result<agent::jobs::JobRead, agent::jobs::JobError> {
        Err(agent::jobs::JobError::NotFound(id.clone()))
    }
    async fn dispose_owner(&self, owner: &SessionId) {
        self.0.lock().push(owner.clone());
    }
}

/// spec: SPN-56 — a handle disposed after every clone of the runtime was dropped ("live agents
/// are left to their handles") still runs the whole quiescence transaction: the turn ends
/// `aborted {disposed}`, the agent's background jobs are disposed, its session leaves the
/// store, and `agent/disposed` reaches the listeners that heard `agent/created`. (The teardown
/// used to reach the jobs service and the event bus through the runtime: with it gone, the
/// agent's jobs kept running and `agent/disposed` was never announced.)
#[tokio::test(start_paused = true)]
async fn a_handle_disposed_after_the_runtime_was_dropped_tears_down_fully() {
    let model = ScriptedModel::new([ScriptEntry::hang_slow()]);
    let jobs = Arc::new(RecordingJobs::default());
    let rt = builder(&model).jobs(jobs.clone()).build();
    let (events, g) = record_events(&rt);
    let sessions = rt.sessions().clone();
    let handle = create(&rt, "a").await;
    handle.agent().followup(user("work")).unwrap();
    settle().await;
    drop(rt);
    handle.dispose().await;
    assert!(!handle.agent().is_live());
    assert_eq!(
        turn_ends(&**handle.agent()),
        [TurnEndReason::Aborted {
            reason: CancelCause::Disposed
        }]
    );
    assert!(sessions.get(handle.id()).is_none(), "the session left the store");
    assert!(
        jobs.0.lock().iter().any(|owner| owner == handle.id()),
        "the agent's jobs were disposed"
    );
    let lifecycle: Vec<String> = events
        .lock()
        .iter()
        .filter_map(|e| match e {
            AgentEvent::Created { agent } => Some(format!("created {agent}")),
            AgentEvent::Disposed { agent } => Some(format!("disposed {agent}")),
            _ => None,
        })
        .collect();
    assert_eq!(lifecycle, ["created a", "disposed a"]);
    drop(g);
}

/// A later disposer drives the memoized teardown while the first call's future is held
/// unpolled; the first future then resolves at once and dropping it starts no task.
#[tokio::test(start_paused = true)]
async fn a_later_disposer_drives_the_teardown_while_the_first_is_held() {
    let model = ScriptedModel::new([ScriptEntry::hang_slow()]);
    let rt = runtime(&model);
    let log = Arc::new(Mutex::new(Vec::new()));
    let g = record_lifecycle(&rt, log.clone());
    let handle = create(&rt, "a").await;
    handle.agent().followup(user("work")).unwrap();
    settle().await;
    let first = handle.dispose();
    handle.dispose().await;
    assert!(handle.agent().when_idle().now_or_never().is_some());
    assert!(
        first.now_or_never().is_some(),
        "the first future sees the same completion"
    );
    assert_eq!(
        log.lock().iter().filter(|e| *e == "agent/disposed:a").count(),
        1,
        "one teardown"
    );
    drop(g);
    finish(&rt, [handle]).await;
}

/// The first disposer, polled once and dropped unfinished, hands the teardown to a runtime task;
/// a waiting disposer sees its completion, and so does one that joins later.
#[tokio::test(start_paused = true)]
async fn a_dropped_first_disposer_hands_the_teardown_on() {
    let model = ScriptedModel::new([ScriptEntry::hang_slow()]);
    let rt = runtime(&model);
    let log = Arc::new(Mutex::new(Vec::new()));
    let g = record_lifecycle(&rt, log.clone());
    let handle = create(&rt, "a").await;
    handle.agent().followup(user("work")).unwrap();
    settle().await;
    let mut first = handle.dispose();
    assert!(
        (&mut first).now_or_never().is_none(),
        "the slow stream delays quiescence"
    );
    let mut waiting = handle.dispose();
    assert!((&mut waiting).now_or_never().is_none());
    drop(first);
    waiting.await;
    handle.dispose().await;
    assert_eq!(
        log.lock().iter().filter(|e| *e == "agent/disposed:a").count(),
        1,
        "one teardown"
    );
    drop(g);
    finish(&rt, [handle]).await;
}

/// Concurrent disposers on a multi-threaded runtime (one of them dropped after a first poll)
/// all complete on one teardown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_disposers_on_a_multi_threaded_runtime() {
    let model = ScriptedModel::new((0..8).map(|i| chunks::text(format!("reply {i}"))));
    let rt = runtime(&model);
    let log = Arc::new(Mutex::new(Vec::new()));
    let g = record_lifecycle(&rt, log.clone());
    for round in 0..8 {
        let id = format!("a{round}");
        let handle = Arc::new(create(&rt, &id).await);
        handle.agent().followup(user("go")).unwrap();
        let mut dropped = handle.dispose();
        let _ = (&mut dropped).now_or_never();
        let disposers: Vec<_> = (0..3)
            .map(|_| {
                let h = handle.clone();
                tokio::spawn(async move { h.dispose().await })
            })
            .collect();
        drop(dropped);
        for d in disposers {
            d.await.unwrap();
        }
        assert!(handle.agent().when_idle().now_or_never().is_some());
        let disposed = format!("agent/disposed:{id}");
        assert_eq!(log.lock().iter().filter(|e| **e == disposed).count(), 1);
    }
    drop(g);
    finish(&rt, []).await;
}

/// A pending idle `inject()` survives persistence and resume without a synthetic turn.
#[tokio::test(start_paused = true)]
async fn pending_inject_survives_resume() {
    let model = ScriptedModel::new([chunks::text("ok")]);
    let persistence = Arc::new(TestPersistence::default());
    let rt = builder(&model).persistence(persistence.clone()).build();
    let handle = create(&rt, "a").await;
    handle.agent().inject(user("staged")).unwrap();
    // Simulate a crash: the agent's live state is gone, its log persisted.
    let durable = persistence.events(handle.id()).len();
    handle.dispose().await;
    persistence.truncate(&"a".into(), durable);
    let resumed = rt
        .resume(ResumeAgentOptions {
            session_id: "a".into(),
            agent_options: mock_options(),
            signal: None,
            setup: None,
            owner: None,
        })
        .await
        .unwrap();
    let agent = resumed.agent().clone();
    settle().await;
    assert_eq!(
        agent
            .inbox()
            .next_step
            .iter()
            .map(agent::Message::text)
            .collect::<Vec<_>>(),
        ["staged"]
    );
    assert_eq!(count(&*agent, "turn/start"), 0);
    agent.followup(user("go")).unwrap();
    agent.when_idle().await;
    assert_eq!(user_texts(&*agent), ["staged", "go"]);
    finish(&rt, [resumed]).await;
}

/// The setup window composes, never drives: a prompt delivered during setup is logged but its
/// turn starts only after publication.
#[tokio::test(start_paused = true)]
async fn setup_delivery_waits_for_publication() {
    let model = ScriptedModel::new([chunks::text("ok")]);
    let rt = runtime(&model);
    let mut o = options("child");
    o.setup = setup(|ctx| async move {
        let agent = ctx.agent().expect("setup runs with the agent's context").clone();
        agent.followup(user("task"))?;
        tokio::task::yield_now().await;
        assert_eq!(agent.status(), agent::AgentStatus::Idle);
        assert_eq!(count(&*agent, "turn/start"), 0);
        Ok(None)
    });
    let handle = rt.create(o).await.unwrap();
    handle.agent().when_idle().await;
    assert_eq!(user_texts(&**handle.agent()), ["task"]);
    assert_eq!(turn_ends(&**handle.agent()), [TurnEndReason::Completed]);
    finish(&rt, [handle]).await;
}

/// An event the live session committed but persistence refused (a full disk, say) is missing
/// from the durable log; the refusal is contained as the observer's failure (spec §4.2.6), but
/// the session's next durability checkpoint must not report success — and nor may any later
/// one, since every later event sits behind the gap.
#[tokio::test]
async fn an_append_persistence_refused_fails_every_later_flush() {
    let persistence = Arc::new(TestPersistence::default());
    *persistence.fail_append_at.lock() = Some(1);
    let store = MemorySessionStore::new(Some(persistence.clone()));
    let header = agent::SessionMeta::default().into_header("s".into(), 1).unwrap();
    let session = Arc::new(agent::Session::new(header, None).unwrap());
    let _entered = agent::SessionStore::enter(&store, session.clone()).unwrap();
    let note = || EventData::other("test/note", serde_json::json!({}));
    session.append(note(), None).unwrap();
    assert!(agent::SessionStore::flush(&store, &"s".into()).await.unwrap());
    session.append(note(), None).unwrap();
    session.append(note(), None).unwrap();
    assert_eq!(persistence.events(&"s".into()).len(), 1);
    for _ in 0..2 {
        let err = agent::SessionStore::flush(&store, &"s".into()).await.unwrap_err();
        assert!(
            matches!(&err, AgentError::Persistence(m) if m.contains("event 1 of session \"s\"") && m.contains("no space left")),
            "{err}"
        );
    }
}

/// A setup that registers a tool, an agent-event listener and a persona section (scoped
/// registrations a rollback must undo), tells `entered` it ran, then pauses until `released`
/// resolves (dropping its sender keeps the creation in its setup window for good).
fn paused_setup(
    persona: &'static str,
    entered: tokio::sync::oneshot::Sender<()>,
    released: tokio::sync::oneshot::Receiver<()>,
) -> Option<Setup> {
    setup(move |ctx| async move {
        ctx.register_tool(tool("mine", |_a, _c| async { Ok(ToolOutput::text("x")) }))?;
        ctx.on_agent_event(|_| Ok(()))?;
        ctx.prompt_section(PromptSection {
            name: PERSONA_SECTION.into(),
            order: 0,
            text: persona.into(),
            tool: None,
        })?;
        entered.send(()).expect("the test waits for the setup");
        let _ = released.await;
        Ok(None)
    })
}

/// spec: SPN-55 — owner disposal aborts a pending setup without waiting for the creator: a
/// child creation paused in its setup window (with scoped registrations) under an owner whose
/// disposal resolves while the creator's future is alive and unpolled leaves the runtime
/// quiescent — no reserved id, no scoped registration, no live agent or session — and the id
/// is free again at once; the creator's future, polled afterwards, still reports the abort
/// (without freeing the id a later creation holds by then).
/// (Before the fix the rollback ran only when the creator's future was next polled or
/// dropped: the owner's disposal resolved with the child's id still reserved and its setup's
/// registrations live.)
#[tokio::test(start_paused = true)]
async fn owner_disposal_rolls_back_an_unpolled_creation_in_its_setup_window() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let owner = create(&rt, "owner").await;
    let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
    let (_release, released) = tokio::sync::oneshot::channel::<()>();
    let mut o = options("child");
    o.owner = Some(owner.agent().clone());
    o.setup = paused_setup("child", entered_tx, released);
    let mut creating = rt.create(o);
    // One poll runs the creation into its setup, which pauses there.
    assert!(futures::poll!(creating.as_mut()).is_pending());
    entered.await.expect("the setup ran");
    assert!(matches!(
        rt.create(options("child")).await,
        Err(AgentError::Duplicate(_))
    ));

    // The owner's disposal resolves with `creating` alive and not polled again.
    owner.dispose().await;
    nothing_published(&rt, "child");
    assert!(AgentRuntime::get(&rt, &"owner".into()).is_none());
    assert_quiescent(&rt);

    // The id is free at once: a second creation of it takes it (paused in its own setup).
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let mut o = options("child");
    o.setup = setup(move |_ctx| async move {
        go.await.expect("the test releases the second setup");
        Ok(None)
    });
    let mut second = rt.create(o);
    assert!(futures::poll!(second.as_mut()).is_pending());

    // The creator's future still reports the abort; its late rollback finds nothing left to
    // undo and leaves the second creation's hold on the id alone.
    let err = creating.await.expect_err("the owner was disposed during setup");
    assert!(
        matches!(&err, AgentError::OwnerDisposed(id) if id.as_str() == "child"),
        "{err}"
    );
    assert!(matches!(
        rt.create(options("child")).await,
        Err(AgentError::Duplicate(_))
    ));
    go_tx.send(()).expect("the second setup waits");
    let again = second.await.expect("the second creation publishes");
    finish(&rt, [again]).await;
}

/// spec: SPN-55 (spine §9.1 step 3: runtime shutdown aborts a pending setup) — shutdown rolls
/// back an ownerless creation paused in its setup window (with scoped registrations) without
/// waiting for its creator: it resolves with the runtime quiescent — no reserved id, no scoped
/// registration, no live agent or session — while the creator's future is alive and unpolled;
/// that future, polled afterwards, fails with the shutdown's error.
/// (Before the fix shutdown resolved with the creation's id still reserved and its setup's
/// registrations live until the creator's future was polled again or dropped.)
#[tokio::test(start_paused = true)]
async fn shutdown_rolls_back_an_unpolled_creation_in_its_setup_window() {
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
    let (_release, released) = tokio::sync::oneshot::channel::<()>();
    let mut o = options("lone");
    o.setup = paused_setup("lone", entered_tx, released);
    let mut creating = rt.create(o);
    // One poll runs the creation into its setup, which pauses there.
    assert!(futures::poll!(creating.as_mut()).is_pending());
    entered.await.expect("the setup ran");

    // Shutdown resolves with `creating` alive and not polled again.
    rt.shutdown().await;
    nothing_published(&rt, "lone");
    assert_quiescent(&rt);

    let err = creating.await.expect_err("the runtime shut down during setup");
    assert!(
        matches!(&err, AgentError::CreationAborted { id, cause: CancelCause::Other { reason } }
            if id.as_str() == "lone" && reason == INACTIVE),
        "{err}"
    );
    finish(&rt, []).await;
}

/// A [`TestPersistence`] whose next `load` (once armed) reports that it began, then waits until
/// the test releases it.
struct GatedLoad {
    store: Arc<TestPersistence>,
    gate: Mutex<
        Option<(
            tokio::sync::oneshot::Sender<()>,
            tokio::sync::oneshot::Receiver<()>,
        )>,
    >,
}

impl GatedLoad {
    /// Arms the gate: returns the receiver told when the load began and the sender releasing it.
    fn arm(
        &self,
    ) -> (
        tokio::sync::oneshot::Receiver<()>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let (began_tx, began) = tokio::sync::oneshot::channel();
        let (release, released) = tokio::sync::oneshot::channel();
        *self.gate.lock() = Some((began_tx, released));
        (began, release)
    }
}

#[async_trait::async_trait]
impl agent::SessionPersistence for GatedLoad {
    fn create(&self, header: &agent::SessionHeader) -> Result<(), AgentError> {
        self.store.create(header)
    }

    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        self.store.append(id, event)
    }

    async fn flush(&self, id: &SessionId) -> Result<(), AgentError> {
        self.store.flush(id).await
    }

    async fn list(&self) -> Result<Vec<agent::SessionHeader>, AgentError> {
        self.store.list().await
    }

    async fn inspect(&self, id: &SessionId) -> Result<Option<agent::SessionHeader>, AgentError> {
        self.store.inspect(id).await
    }

    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, AgentError> {
        let gate = self.gate.lock().take();
        if let Some((began, released)) = gate {
            began.send(()).expect("the test waits for the load");
            // Dropped unreleased, the load goes on as well.
            let _ = released.await;
        }
        self.store.load(id).await
    }
}

/// A runtime over a [`GatedLoad`] persistence holding a stored session `"child"`.
async fn runtime_with_stored_child(model: &ScriptedModel) -> (Runtime, Arc<GatedLoad>) {
    let persistence = Arc::new(GatedLoad {
        store: Arc::new(TestPersistence::default()),
        gate: Mutex::new(None),
    });
    let rt = builder(model).persistence(persistence.clone()).build();
    create(&rt, "child").await.dispose().await;
    assert!(
        persistence
            .store
            .sessions
            .lock()
            .contains_key(&SessionId::from("child"))
    );
    (rt, persistence)
}

/// spec: SPN-55 — the owner's disposal aborts a resumption it owns whose persistence `load` is
/// still pending, without waiting for the resumer: the disposal resolves with the runtime
/// quiescent (the id no longer reserved) while the resuming future is alive and unpolled; that
/// future, polled after the load completes, fails with `OwnerDisposed`.
/// (Before the fix the resumption was registered with its owner only after its load, so the
/// owner's disposal resolved with the id still reserved.)
#[tokio::test(start_paused = true)]
async fn owner_disposal_frees_the_id_of_a_resumption_whose_load_is_pending() {
    let model = ScriptedModel::default();
    let (rt, persistence) = runtime_with_stored_child(&model).await;
    let owner = create(&rt, "owner").await;
    let (began, release) = persistence.arm();
    let mut o = resume_options("child");
    o.owner = Some(owner.agent().clone());
    let mut resuming = rt.resume(o);
    assert!(futures::poll!(resuming.as_mut()).is_pending());
    began.await.expect("the load began");
    assert!(matches!(
        rt.resume(resume_options("child")).await,
        Err(AgentError::Duplicate(_))
    ));

    // The owner's disposal resolves with `resuming` alive and not polled again.
    owner.dispose().await;
    nothing_published(&rt, "child");
    assert_quiescent(&rt);

    release.send(()).expect("the load waits");
    let err = resuming
        .await
        .expect_err("the owner was disposed during the load");
    assert!(
        matches!(&err, AgentError::OwnerDisposed(id) if id.as_str() == "child"),
        "{err}"
    );
    // The id is free: the session resumes.
    let again = rt
        .resume(resume_options("child"))
        .await
        .expect("the resume succeeds");
    finish(&rt, [again]).await;
}

/// spec: SPN-55 (spine §9.1 step 3) — shutdown aborts an ownerless resumption whose
/// persistence `load` is still pending: it resolves with the runtime quiescent while the
/// resuming future is alive and unpolled; that future later fails with the shutdown's error.
/// (Before the fix shutdown resolved with the id still reserved.)
#[tokio::test(start_paused = true)]
async fn shutdown_frees_the_id_of_a_resumption_whose_load_is_pending() {
    let model = ScriptedModel::default();
    let (rt, persistence) = runtime_with_stored_child(&model).await;
    let (began, release) = persistence.arm();
    let mut resuming = rt.resume(resume_options("child"));
    assert!(futures::poll!(resuming.as_mut()).is_pending());
    began.await.expect("the load began");

    rt.shutdown().await;
    nothing_published(&rt, "child");
    assert_quiescent(&rt);

    release.send(()).expect("the load waits");
    let err = resuming.await.expect_err("the runtime shut down during the load");
    assert!(
        matches!(&err, AgentError::CreationAborted { id, cause: CancelCause::Other { reason } }
            if id.as_str() == "child" && reason == INACTIVE),
        "{err}"
    );
    finish(&rt, []).await;
}

/// A test hook of [`RecordingRelease`], run once.
type Hook = Mutex<Option<Box<dyn FnOnce() + Send>>>;

/// A [`TestPersistence`] recording every `release`, and whether a session of that id was live
/// in the watched runtime's store when it came (and which); its next `load` and `release` run
/// a hook first when one is set (to interleave another transaction there).
#[derive(Default)]
struct RecordingRelease {
    store: TestPersistence,
    /// `(id, live)` per `release` call.
    releases: Mutex<Vec<(SessionId, bool)>>,
    /// The session of the id live at each `release`, if any.
    released_live: Mutex<Vec<Option<Arc<agent::Session>>>>,
    runtime: Mutex<std::sync::Weak<RuntimeInner>>,
    on_load: Hook,
    on_release: Hook,
}

impl RecordingRelease {
    fn watch(&self, rt: &Runtime) {
        *self.runtime.lock() = Arc::downgrade(&rt.inner);
    }

    /// The ids released while a session of theirs was live.
    fn released_while_live(&self) -> Vec<SessionId> {
        self.releases
            .lock()
            .iter()
            .filter(|(_, live)| *live)
            .map(|(id, _)| id.clone())
            .collect()
    }
}

#[async_trait::async_trait]
impl agent::SessionPersistence for RecordingRelease {
    fn create(&self, header: &agent::SessionHeader) -> Result<(), AgentError> {
        self.store.create(header)
    }

    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        self.store.append(id, event)
    }

    async fn flush(&self, id: &SessionId) -> Result<(), AgentError> {
        self.store.flush(id).await
    }

    async fn list(&self) -> Result<Vec<agent::SessionHeader>, AgentError> {
        self.store.list().await
    }

    async fn inspect(&self, id: &SessionId) -> Result<Option<agent::SessionHeader>, AgentError> {
        self.store.inspect(id).await
    }

    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, AgentError> {
        let hook = self.on_load.lock().take();
        if let Some(hook) = hook {
            hook();
        }
        self.store.load(id).await
    }

    fn release(&self, id: &SessionId) {
        let hook = self.on_release.lock().take();
        if let Some(hook) = hook {
            hook();
        }
        let live = self.runtime.lock().upgrade().and_then(|rt| rt.sessions.get(id));
        self.releases.lock().push((id.clone(), live.is_some()));
        self.released_live.lock().push(live);
    }
}

/// Runs `racer` (a transaction of the same id, to completion) when the next creation or
/// resumption on this thread is about to reserve its id — after the checks it made before.
fn race_before_reserve(
    rt: &Runtime,
    racer: impl FnOnce(&Runtime) -> Result<AgentHandle, AgentError> + 'static,
) -> Arc<Mutex<Option<AgentHandle>>> {
    let won = Arc::new(Mutex::new(None));
    let (rt, slot) = (rt.clone(), won.clone());
    BEFORE_RESERVE.with(|h| {
        *h.borrow_mut() = Some(Box::new(move || {
            *slot.lock() = Some(racer(&rt).expect("the racing transaction wins"));
        }));
    });
    won
}

/// spec §6 (`prepare`: "duplicates of a live id are rejected"), §9.1, SPN-56 — a resumption
/// whose id a racing creation or resumption of the same id made live between its duplicate
/// check and its reservation fails `Duplicate` without ever touching the log: it never lets go
/// of (`SessionPersistence::release`) the writer of the live session that won, which keeps its
/// log. (Before the fix the loser reserved the freed id, loaded and claimed the live session's
/// log, failed to enter the store, and its rollback released the live session's writer —
/// dropping the single-writer lock of a log this process still appends to.)
#[tokio::test(start_paused = true)]
async fn a_resume_losing_its_id_to_a_racer_never_releases_the_live_log() {
    for racer_resumes in [false, true] {
        let model = ScriptedModel::default();
        let persistence = Arc::new(RecordingRelease::default());
        let rt = builder(&model).persistence(persistence.clone()).build();
        persistence.watch(&rt);
        if racer_resumes {
            create(&rt, "x").await.dispose().await;
        }
        persistence.releases.lock().clear();
        let won = race_before_reserve(&rt, move |rt| {
            // The racer needs no await that suspends (no setup, an immediate persistence).
            if racer_resumes {
                futures::executor::block_on(rt.resume(resume_options("x")))
            } else {
                futures::executor::block_on(rt.create(options("x")))
            }
        });
        let err = rt
            .resume(resume_options("x"))
            .await
            .expect_err("the racer holds the id");
        assert!(
            matches!(&err, AgentError::Duplicate(id) if id.as_str() == "x"),
            "racer resumes: {racer_resumes}: {err}"
        );
        let winner = won.lock().take().expect("the racer ran");
        assert!(
            AgentRuntime::get(&rt, &"x".into()).is_some(),
            "the winner is live"
        );
        assert_eq!(
            persistence.released_while_live(),
            Vec::<SessionId>::new(),
            "racer resumes: {racer_resumes}: the losing resume released the live session's log"
        );
        winner.dispose().await;
        finish(&rt, []).await;
    }
}

/// spec §6, §9.1 (SPN-54: scoped registrations are visible only to their agent) — a creation
/// whose id a racing creation made live between its `prepare` and its reservation fails
/// `Duplicate` before its setup runs: its registrations, keyed by the id, never exist beside
/// the live agent's. (Before the fix its setup ran while the winner was live, and the creation
/// failed only at the store's entry.)
#[tokio::test(start_paused = true)]
async fn a_create_losing_its_id_to_a_racer_never_runs_its_setup() {
    let model = ScriptedModel::default();
    let rt = builder(&model)
        .persistence(Arc::new(TestPersistence::default()))
        .build();
    let won = race_before_reserve(&rt, |rt| futures::executor::block_on(rt.create(options("x"))));
    let ran = Arc::new(AtomicUsize::new(0));
    let mut o = options("x");
    let seen = ran.clone();
    o.setup = setup(move |_| async move {
        seen.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    });
    let err = rt.create(o).await.expect_err("the racer holds the id");
    assert!(
        matches!(&err, AgentError::Duplicate(id) if id.as_str() == "x"),
        "{err}"
    );
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "the losing creation's setup ran beside the live agent"
    );
    let winner = won.lock().take().expect("the racer ran");
    finish(&rt, [winner]).await;
}

/// spec: SPN-56 (ids reopen only after quiescence) — a resumption racing the removal of the
/// live session of its id (its agent disposed) — here, run from inside that removal's
/// `SessionPersistence::release`, as another thread would — is refused `Duplicate` until the
/// removal let go of the log; the removal's release never lands on a resumed successor's
/// writer. (Before the fix the store released the log only after the entry had left it, so a
/// resumption in between published, claimed the log, and then lost its writer to the old
/// session's late release.)
#[tokio::test(start_paused = true)]
async fn a_removed_sessions_release_never_lands_on_a_resumed_successor() {
    let model = ScriptedModel::default();
    let persistence = Arc::new(RecordingRelease::default());
    let rt = builder(&model).persistence(persistence.clone()).build();
    persistence.watch(&rt);
    let first = create(&rt, "x").await;
    let old = first.agent().session().clone();
    let raced = Arc::new(Mutex::new(None));
    let (racer, slot) = (rt.clone(), raced.clone());
    *persistence.on_release.lock() = Some(Box::new(move || {
        *slot.lock() = Some(futures::executor::block_on(racer.resume(resume_options("x"))));
    }));
    first.dispose().await;
    let raced = raced.lock().take().expect("the racer ran");
    let successor = match raced {
        Err(AgentError::Duplicate(_)) => None,
        Err(err) => panic!("unexpected: {err}"),
        Ok(handle) => Some(handle),
    };
    for live in persistence.released_live.lock().iter().flatten() {
        assert!(
            Arc::ptr_eq(live, &old),
            "the removed session's release landed on its resumed successor"
        );
    }
    assert!(
        successor.is_none(),
        "resumed before the old session's log was let go of"
    );
    // Once the removal ended, the session resumes.
    let again = rt.resume(resume_options("x")).await.expect("resumes");
    finish(&rt, [again]).await;
}

/// spec §6 (`enter` never overwrites a live entry) — a resumption that claimed its log and then
/// finds a session of its id live in the store at entry (entered there directly, by the host,
/// while the log loaded) fails `Duplicate` and does not let go of the log that live session
/// writes. (Before the fix its rollback released the live session's writer.)
#[tokio::test(start_paused = true)]
async fn a_resume_refused_at_store_entry_leaves_the_live_sessions_log() {
    let model = ScriptedModel::default();
    let persistence = Arc::new(RecordingRelease::default());
    let rt = builder(&model).persistence(persistence.clone()).build();
    persistence.watch(&rt);
    create(&rt, "x").await.dispose().await;
    persistence.releases.lock().clear();
    let direct = Arc::new(Mutex::new(None));
    let (store, slot) = (rt.sessions().clone(), direct.clone());
    *persistence.on_load.lock() = Some(Box::new(move || {
        let session = store
            .prepare("x".into(), None, SessionMeta::default())
            .expect("not live yet");
        // Its (empty) log counts as durable: the stored one is not recreated.
        let entered = store.enter_persisted(session, Some(0));
        *slot.lock() = Some(entered.expect("entered directly"));
    }));
    let err = rt
        .resume(resume_options("x"))
        .await
        .expect_err("a session of the id is live");
    assert!(
        matches!(&err, AgentError::Duplicate(id) if id.as_str() == "x"),
        "{err}"
    );
    assert_eq!(
        persistence.released_while_live(),
        Vec::<SessionId>::new(),
        "the refused resume released the live session's log"
    );
    drop(direct.lock().take());
    finish(&rt, []).await;
}
