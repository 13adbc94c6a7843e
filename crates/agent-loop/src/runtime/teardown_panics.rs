//! Host code that panics during an agent's teardown (spec §9.4): an undo closure adopted into
//! the agent's scope, a host [`Jobs`] service, an owned child's teardown. Each panic is
//! contained and logged where the runtime meets it, the rest of the teardown still runs, every
//! `dispose` future (current and later) completes normally, and the runtime ends quiescent.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use futures::FutureExt;

use agent::jobs::{JobError, JobId, JobInfo, JobRead, JobSpec, Jobs};
use agent::tools::ToolOutput;
use agent::{AgentEvent, AgentRuntime, CreateAgentOptions, Registration, SessionId, Signal};

use super::*;
use crate::model::ScriptedModel;
use crate::runtime::testkit::*;
use crate::warnings::WarningCapture;

/// Counts the agent's `Disposed` announcements.
fn count_disposed(rt: &Runtime, id: &str) -> (Arc<AtomicUsize>, Registration) {
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    let id = SessionId::from(id);
    let guard = rt.services().agent_events.on(move |e| {
        if matches!(e, AgentEvent::Disposed { agent } if *agent == id) {
            c.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    });
    (count, guard)
}

/// Scoped registrations through `id`'s context: a tool, a prompt section, a listener, a
/// counting guard, then (undone first) a guard whose undo panics. Returns the counter.
fn register_with_a_panicking_undo(rt: &Runtime, id: &SessionId) -> Arc<AtomicUsize> {
    let ctx = rt.agent_ctx(id).expect("live agent");
    ctx.register_tool(tool("mine", |_a, _c| async { Ok(ToolOutput::text("x")) }))
        .unwrap();
    ctx.prompt_section(agent::prompt::PromptSection {
        name: "scoped".into(),
        order: 0,
        text: "scoped".into(),
        tool: None,
    })
    .unwrap();
    ctx.on_agent_event(|_| Ok(())).unwrap();
    let undone = Arc::new(AtomicUsize::new(0));
    let u = undone.clone();
    ctx.own(Registration::new(move || {
        u.fetch_add(1, Ordering::SeqCst);
    }))
    .unwrap();
    ctx.own(Registration::new(|| panic!("undo exploded"))).unwrap();
    undone
}

/// A panicking undo in the agent's scope: the first `dispose` future, one taken before it ran
/// and one taken after all complete normally; the agent is unregistered, its session removed,
/// `Disposed` announced once, every other scoped registration undone, the panic logged.
#[tokio::test(start_paused = true)]
async fn a_panicking_scope_undo_is_contained_and_the_teardown_finishes() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let (disposed, g) = count_disposed(&rt, "a");
    let handle = create(&rt, "a").await;
    let id = handle.id().clone();
    let undone = register_with_a_panicking_undo(&rt, &id);
    let waiting = handle.dispose();
    std::panic::AssertUnwindSafe(handle.dispose())
        .catch_unwind()
        .await
        .expect("the teardown's panic is contained");
    std::panic::AssertUnwindSafe(waiting)
        .catch_unwind()
        .await
        .expect("a waiting dispose completes");
    std::panic::AssertUnwindSafe(handle.dispose())
        .catch_unwind()
        .await
        .expect("a later dispose completes");
    assert!(AgentRuntime::get(&rt, &id).is_none());
    assert!(rt.sessions().get(&id).is_none());
    assert_eq!(disposed.load(Ordering::SeqCst), 1);
    assert_eq!(undone.load(Ordering::SeqCst), 1);
    assert!(rt.services().tools.get("mine", Some(&id)).is_none());
    assert_eq!(
        warnings.mentioning("undo exploded"),
        1,
        "{:?}",
        warnings.warnings()
    );
    drop(g);
    finish(&rt, [handle]).await;
}

/// A host job service whose owner disposal panics.
struct PanickingJobs;

#[async_trait]
impl Jobs for PanickingJobs {
    fn start(&self, _spec: JobSpec) -> Result<JobId, JobError> {
        Err(JobError::NoController)
    }
    fn list(&self, _owner: &SessionId) -> Vec<JobInfo> {
        Vec::new()
    }
    fn kill(&self, _owner: &SessionId, id: &JobId, _reason: Option<String>) -> Result<(), JobError> {
        Err(JobError::NotFound(id.clone()))
    }
    async fn read(
        &self,
        _owner: &SessionId,
        id: &JobId,
        _wait: bool,
        _signal: &Signal,
    ) -> Result<JobRead, JobError> {
        Err(JobError::NotFound(id.clone()))
    }
    async fn dispose_owner(&self, _owner: &SessionId) {
        tokio::task::yield_now().await;
        panic!("jobs exploded");
    }
}

/// A job service that panics in `dispose_owner` (both passes) does not stop the rest of the
/// teardown: the scope is released, the agent unregistered, its session removed.
#[tokio::test(start_paused = true)]
async fn a_panicking_job_service_does_not_stop_the_teardown() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let model = ScriptedModel::default();
    let rt = builder(&model).jobs(Arc::new(PanickingJobs)).build();
    let (disposed, g) = count_disposed(&rt, "a");
    let handle = create(&rt, "a").await;
    let id = handle.id().clone();
    let ctx = rt.agent_ctx(&id).unwrap();
    ctx.register_tool(tool("mine", |_a, _c| async { Ok(ToolOutput::text("x")) }))
        .unwrap();
    std::panic::AssertUnwindSafe(handle.dispose())
        .catch_unwind()
        .await
        .expect("the job service's panic is contained");
    assert!(AgentRuntime::get(&rt, &id).is_none());
    assert!(rt.sessions().get(&id).is_none());
    assert!(rt.services().tools.get("mine", Some(&id)).is_none());
    assert_eq!(disposed.load(Ordering::SeqCst), 1);
    assert!(
        warnings.mentioning("jobs exploded") >= 1,
        "{:?}",
        warnings.warnings()
    );
    drop(g);
    finish(&rt, [handle]).await;
}

/// An owned child whose teardown panics, torn down by the runtime's shutdown together with its
/// owner: the shutdown completes, both are unregistered, the runtime ends quiescent.
#[tokio::test(start_paused = true)]
async fn a_child_whose_teardown_panics_does_not_stall_its_owner_or_shutdown() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let model = ScriptedModel::default();
    let rt = runtime(&model);
    let owner = create(&rt, "owner").await;
    let mut o = CreateAgentOptions::new("child".into());
    o.agent_options = mock_options();
    o.owner = Some(owner.agent().clone());
    let child = rt.create(o).await.unwrap();
    let undone = register_with_a_panicking_undo(&rt, child.id());
    std::panic::AssertUnwindSafe(rt.shutdown())
        .catch_unwind()
        .await
        .expect("the child's panic is contained");
    assert!(AgentRuntime::list(&rt).is_empty());
    assert_eq!(undone.load(Ordering::SeqCst), 1);
    assert_eq!(
        warnings.mentioning("undo exploded"),
        1,
        "{:?}",
        warnings.warnings()
    );
    child.dispose().await;
    finish(&rt, [owner]).await;
}

/// spec: SPN-51 — a setup that fails after handing its scope an undo closure that panics still
/// fails its creation with the setup's typed error, and (the rollback contained the panic and
/// logged it) every other registration is undone and nothing stays published. The same for a
/// creation whose future is dropped in its setup window. (The rollback used to let the panic
/// escape: `create` panicked instead of returning `AgentError::Setup`, and a dropped creation
/// panicked in its destructor.)
#[tokio::test(start_paused = true)]
async fn a_panicking_undo_in_a_rolled_back_setup_is_contained() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let model = ScriptedModel::default();
    let rt = runtime(&model);

    let mut o = CreateAgentOptions::new("failing".into());
    o.agent_options = mock_options();
    o.setup = Some(Box::new(|ctx: agent::Ctx| {
        async move {
            ctx.register_tool(tool("mine", |_a, _c| async { Ok(ToolOutput::text("x")) }))?;
            ctx.own(Registration::new(|| panic!("undo exploded")))?;
            Err::<Option<agent::runtime::Commit>, agent::BoxError>("setup failed".into())
        }
        .boxed()
    }));
    let created = std::panic::AssertUnwindSafe(rt.create(o))
        .catch_unwind()
        .await
        .expect("the rollback contains the undo's panic");
    assert!(matches!(created, Err(AgentError::Setup { .. })), "{created:?}");
    assert!(rt.services().tools.get("mine", Some(&"failing".into())).is_none());

    // Dropped in its setup window (after its registrations).
    let mut o = CreateAgentOptions::new("dropped".into());
    o.agent_options = mock_options();
    o.setup = Some(Box::new(|ctx: agent::Ctx| {
        async move {
            ctx.own(Registration::new(|| panic!("undo exploded")))?;
            futures::future::pending::<()>().await;
            Ok::<Option<agent::runtime::Commit>, agent::BoxError>(None)
        }
        .boxed()
    }));
    let mut creating = rt.create(o);
    assert!(futures::poll!(creating.as_mut()).is_pending());
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(creating)))
        .expect("dropping the creation contains the undo's panic");

    assert_eq!(
        warnings.mentioning("undo exploded"),
        2,
        "{:?}",
        warnings.warnings()
    );
    finish(&rt, []).await;
}
