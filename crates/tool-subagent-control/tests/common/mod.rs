//! Test rig: a real host — the reference runtime with a scripted model, an in-memory persistence
//! backend, the online invariant checker, the real `spawn` provider, the seam's continuation
//! manager and child listing — with both control plugins loaded.
//!
//! Interleavings are controlled, never timed: children are held at their first step by a gate
//! (or by a model entry that hangs until cancelled), and the clock is paused, so every wait
//! below is virtual.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::content::visible_text;
use agent::projection::ProjectionRegistry;
use agent::tools::{ToolCallRequest, ToolResult};
use agent::{
    AgentHandle, AgentOptions, AgentRef, AgentRuntime, ContentBlock, CreateAgentOptions, EventData,
    Registration, SessionEvent, SessionId, SessionMeta, SessionPersistence, Signal,
};
use agent_loop::model::{ScriptEntry, chunks};
use agent_loop::runtime::{Runtime, assert_quiescent};
use agent_loop::{MemoryStore, ScriptedModel};
use async_trait::async_trait;
use invariants::InvariantObserver;
use serde_json::Value;
use subagent::continuation::{ContinuableStartSpec, ContinuationManager};
use subagent::listing::ListingServices;
use subagent::projection::register_projections;
use subagent::service::SubagentService;
use subagent_inprocess::InProcessDriver;
use tool_subagent_control::{AgentListing, ListAgentsPlugin, SubagentControlPlugin};

/// The model route every agent of the rig uses.
pub const MODEL: &str = "mock";
/// The parent's id.
pub const PARENT: &str = "parent";

/// The model options every agent of the rig runs with.
pub fn routed() -> AgentOptions {
    AgentOptions {
        provider: Some(MODEL.into()),
        model: Some(MODEL.into()),
        ..AgentOptions::default()
    }
}

/// A model answer of `text`.
pub fn answer(text: &str) -> ScriptEntry {
    chunks::text(text).into()
}

// ---- pre-step interceptors ----------------------------------------------------------------

/// Rejects every step of the agent it is scoped to: the parent's turns (opened by settlement
/// notices) never reach the scripted model, whose entries are sized for the children alone.
struct RejectStep;

#[async_trait]
impl agent::PreStepInterceptor for RejectStep {
    async fn pre_step(
        &self,
        _: agent::PreStep<'_>,
        _: agent::PreStepDecision,
    ) -> Result<agent::PreStepDecision, agent::BoxError> {
        Ok(agent::PreStepDecision::Reject)
    }
}

/// Holds every step of the agent it is scoped to until its gate opens.
struct Gate {
    open: tokio::sync::watch::Receiver<bool>,
}

#[async_trait]
impl agent::PreStepInterceptor for Gate {
    async fn pre_step(
        &self,
        _: agent::PreStep<'_>,
        proposed: agent::PreStepDecision,
    ) -> Result<agent::PreStepDecision, agent::BoxError> {
        let mut open = self.open.clone();
        open.wait_for(|v| *v)
            .await
            .map_err(|e| Box::new(e) as agent::BoxError)?;
        Ok(proposed)
    }
}

// ---- a persistence that can hold an inspection ---------------------------------------------

/// Persistence over a [`MemoryStore`] whose `inspect` of the held session (if any) signals
/// `entered` and then never answers: a cold resume of that session waits there until its
/// delivery's signal is cancelled (the manager races store reads with it).
pub struct HeldInspect {
    store: Arc<MemoryStore>,
    /// The session whose inspection is held.
    pub held: parking_lot::Mutex<Option<SessionId>>,
    /// Notified when a held inspection begins.
    pub entered: tokio::sync::Notify,
}

#[async_trait]
impl SessionPersistence for HeldInspect {
    fn create(&self, header: &agent::SessionHeader) -> Result<(), agent::AgentError> {
        SessionPersistence::create(self.store.as_ref(), header)
    }
    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), agent::AgentError> {
        SessionPersistence::append(self.store.as_ref(), id, event)
    }
    async fn flush(&self, id: &SessionId) -> Result<(), agent::AgentError> {
        SessionPersistence::flush(self.store.as_ref(), id).await
    }
    async fn list(&self) -> Result<Vec<agent::SessionHeader>, agent::AgentError> {
        SessionPersistence::list(self.store.as_ref()).await
    }
    async fn inspect(&self, id: &SessionId) -> Result<Option<agent::SessionHeader>, agent::AgentError> {
        if self.held.lock().as_ref() == Some(id) {
            self.entered.notify_one();
            std::future::pending::<()>().await;
        }
        SessionPersistence::inspect(self.store.as_ref(), id).await
    }
    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, agent::AgentError> {
        SessionPersistence::load(self.store.as_ref(), id).await
    }
}

// ---- the rig ------------------------------------------------------------------------------

/// A real host with both control plugins loaded and one parked parent agent.
pub struct Rig {
    pub rt: Runtime,
    pub model: ScriptedModel,
    pub store: Arc<MemoryStore>,
    pub observer: Arc<InvariantObserver>,
    pub subagents: SubagentService,
    pub driver: InProcessDriver,
    pub manager: ContinuationManager,
    pub projections: ProjectionRegistry,
    pub control: Option<SubagentControlPlugin>,
    pub list: Option<ListAgentsPlugin>,
    registrations: Vec<Registration>,
    parent: Option<AgentHandle>,
    extra: Vec<AgentHandle>,
    calls: AtomicUsize,
}

impl Rig {
    /// A rig whose model answers with `script` and whose `list_agents` reads the seam's
    /// listing over the host.
    pub async fn new(script: Vec<ScriptEntry>) -> Self {
        Self::build(script, None, None).await
    }

    /// A rig whose `list_agents` reads `listing` instead of the seam's listing.
    pub async fn with_listing(script: Vec<ScriptEntry>, listing: Arc<dyn AgentListing>) -> Self {
        Self::build(script, Some(listing), None).await
    }

    /// A rig whose persistence can hold the inspection of one session (see [`HeldInspect`]).
    pub async fn with_held_inspect(script: Vec<ScriptEntry>) -> (Self, Arc<HeldInspect>) {
        let store = Arc::new(MemoryStore::new());
        let held = Arc::new(HeldInspect {
            store: store.clone(),
            held: parking_lot::Mutex::new(None),
            entered: tokio::sync::Notify::new(),
        });
        let rig = Self::build(script, None, Some((store, held.clone()))).await;
        (rig, held)
    }

    async fn build(
        script: Vec<ScriptEntry>,
        listing: Option<Arc<dyn AgentListing>>,
        held: Option<(Arc<MemoryStore>, Arc<HeldInspect>)>,
    ) -> Self {
        let model = ScriptedModel::new(script);
        let (store, persistence): (Arc<MemoryStore>, Arc<dyn SessionPersistence>) = match held {
            Some((store, held)) => (store, held),
            None => {
                let store = Arc::new(MemoryStore::new());
                (store.clone(), store)
            }
        };
        let observer = InvariantObserver::shared();
        let rt = Runtime::builder()
            .model(MODEL, model.adapter())
            .session_observer(observer.clone())
            .persistence(persistence)
            .build();
        let subagents = SubagentService::new();
        let driver = InProcessDriver::new(rt.services().clone());
        let mut registrations =
            vec![subagent_spawn::register(&subagents, driver.clone()).expect("spawn registers")];
        let projections = ProjectionRegistry::new();
        registrations.push(register_projections(&projections).expect("projections register"));
        let manager = ContinuationManager::new(subagents.clone(), rt.services().clone());
        let control =
            SubagentControlPlugin::load(rt.services(), manager.clone()).expect("control tools load");
        let listing = listing.unwrap_or_else(|| {
            Arc::new(ListingServices {
                projections: Some(projections.clone()),
                store: Some(rt.services().sessions.clone()),
                persistence: Some(store.clone() as Arc<dyn SessionPersistence>),
                cache: None,
            })
        });
        let list = ListAgentsPlugin::load(rt.services(), listing).expect("list_agents loads");
        let parent = rt
            .create(CreateAgentOptions {
                meta: SessionMeta {
                    cwd: Some(PathBuf::from("/workspace")),
                    ..SessionMeta::default()
                },
                agent_options: routed(),
                ..CreateAgentOptions::new(SessionId::from(PARENT))
            })
            .await
            .expect("parent is created");
        registrations.push(
            rt.services()
                .pre_step
                .add(Some(SessionId::from(PARENT)), Arc::new(RejectStep)),
        );
        Self {
            rt,
            model,
            store,
            observer,
            subagents,
            driver,
            manager,
            projections,
            control: Some(control),
            list: Some(list),
            registrations,
            parent: Some(parent),
            extra: Vec::new(),
            calls: AtomicUsize::new(0),
        }
    }

    /// The parent agent.
    pub fn parent(&self) -> &AgentRef {
        self.parent.as_ref().expect("parent live").agent()
    }

    /// The live agent `id`.
    pub fn agent(&self, id: &str) -> Option<AgentRef> {
        AgentRuntime::get(&self.rt, &SessionId::from(id))
    }

    /// The ids of the live agents, sorted.
    pub fn agents(&self) -> Vec<String> {
        let mut ids: Vec<String> = AgentRuntime::list(&self.rt)
            .iter()
            .map(|a| a.id().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// Creates an ordinary live agent `id` (not a subagent), owned by the rig.
    pub async fn other_agent(&mut self, id: &str) -> AgentRef {
        let handle = self
            .rt
            .create(CreateAgentOptions {
                agent_options: routed(),
                ..CreateAgentOptions::new(SessionId::from(id))
            })
            .await
            .expect("agent is created");
        let agent = handle.agent().clone();
        self.extra.push(handle);
        agent
    }

    /// Holds every step of agent `id` until the returned sender sends `true`. Dropping the
    /// registration (kept by the rig) removes the gate.
    pub fn gate(&mut self, id: &str) -> tokio::sync::watch::Sender<bool> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        self.registrations.push(
            self.rt
                .services()
                .pre_step
                .add(Some(SessionId::from(id)), Arc::new(Gate { open: rx })),
        );
        tx
    }

    /// Starts a continuable `spawn` child with id `id`, label `label` and prompt `prompt`
    /// under `parent`, through the manager (as the delegation tool would).
    pub async fn start(&self, parent: &AgentRef, id: &str, label: &str, prompt: &str) -> SessionId {
        let mut spec =
            ContinuableStartSpec::new("spawn", label, vec![ContentBlock::text(prompt)], parent.clone());
        spec.child_id = Some(SessionId::from(id));
        let (child_id, _) = self
            .manager
            .start_continuable(spec)
            .await
            .expect("the child starts");
        child_id
    }

    /// Calls tool `name` as agent `caller` with `arguments` under `signal`.
    pub async fn call_with(&self, name: &str, caller: &str, arguments: Value, signal: Signal) -> ToolResult {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let call = ToolCallRequest {
            call_id: format!("call-{n}").into(),
            name: name.to_owned(),
            arguments: arguments.to_string(),
        };
        self.rt
            .services()
            .tools
            .execute(&SessionId::from(caller), call, signal)
            .await
            .result
    }

    /// Calls tool `name` as agent `caller` with `arguments` under a fresh signal.
    pub async fn call(&self, name: &str, caller: &str, arguments: Value) -> ToolResult {
        self.call_with(name, caller, arguments, Signal::new()).await
    }

    /// Whether a tool named `name` is visible globally, and how many are.
    pub fn tool_count(&self, name: &str) -> usize {
        self.rt
            .services()
            .tools
            .schemas(None)
            .iter()
            .filter(|s| s.name == name)
            .count()
    }

    /// The description of tool `name`.
    pub fn description(&self, name: &str) -> String {
        self.rt
            .services()
            .tools
            .get(name, None)
            .map(|d| d.description)
            .unwrap_or_default()
    }

    /// The parameter schema of tool `name`.
    pub fn parameters(&self, name: &str) -> Value {
        self.rt
            .services()
            .tools
            .get(name, None)
            .map(|d| d.parameters)
            .unwrap_or(Value::Null)
    }

    /// Waits (virtual time) until `done` holds.
    pub async fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        for _ in 0..10_000 {
            if done(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("never reached: {what}");
    }

    /// Lets every runnable task run for a while (virtual time).
    pub async fn yield_a_while(&self) {
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits until child `id` released its Activation (it settled).
    pub async fn until_released(&self, id: &SessionId) {
        self.until("the child released its Activation", |rig| {
            !rig.manager.is_resident(id) && rig.agent(id.as_str()).is_none()
        })
        .await;
    }

    /// Waits until every continuable child was released and the manager's tasks ended.
    pub async fn settle(&self) {
        self.until("children released", |rig| {
            rig.manager.resident().is_empty() && rig.manager.task_count() == 0
        })
        .await;
    }

    /// The persisted log of session `id`.
    pub async fn persisted(&self, id: &SessionId) -> agent::store::LoadedSession {
        SessionPersistence::load(self.store.as_ref(), id)
            .await
            .expect("persisted")
    }

    /// Disposes every child (the manager), the plugins, the agents, the providers and the
    /// runtime, and asserts quiescence: no delivery in flight, no live agent or session, no
    /// manager, driver or service task, and a clean invariant record.
    pub async fn finish(mut self) {
        self.manager.dispose_all().await.expect("the manager drains");
        if let Some(control) = self.control.take() {
            control.shutdown().await;
        }
        drop(self.list.take());
        for handle in self.extra.drain(..) {
            handle.dispose().await;
        }
        if let Some(parent) = self.parent.take() {
            parent.dispose().await;
        }
        self.driver.wait().await;
        self.subagents.close().await;
        self.registrations.clear();
        self.rt.shutdown().await;
        assert_eq!(self.manager.task_count(), 0, "manager tasks left");
        assert!(self.manager.resident().is_empty(), "resident children left");
        assert_eq!(self.driver.task_count(), 0, "driver tasks left");
        assert_eq!(self.subagents.pending_runs(), 0, "service tasks left");
        assert!(self.agents().is_empty(), "agents left: {:?}", self.agents());
        assert_quiescent(&self.rt);
        let violations = self.observer.violations();
        assert!(violations.is_empty(), "invariant violations: {violations:?}");
    }
}

// ---- results and logs ---------------------------------------------------------------------

/// The model-visible text of a result.
pub fn text(result: &ToolResult) -> String {
    visible_text(&result.content)
}

/// The text of a successful result, after checking it succeeded.
pub fn ok_text(result: &ToolResult) -> String {
    assert!(!result.is_error, "expected success, got {}", text(result));
    text(result)
}

/// The error code and message of a failed result (the model sees `Error: <message>`).
pub fn error(result: &ToolResult) -> (String, String) {
    assert!(result.is_error, "expected an error, got {}", text(result));
    let facts = result.error.clone().expect("error facts");
    assert_eq!(text(result), format!("Error: {}", facts.message));
    (facts.code, facts.message)
}

/// The prompts of a log: the text of every user-role message that is neither plugin context nor
/// a settlement notice, in log order.
pub fn prompts(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) if !matches!(m.source.kind(), "plugin" | "subagent-settled") => {
                Some(visible_text(&m.content))
            }
            _ => None,
        })
        .collect()
}

/// The `reason` of every `turn/end` of a log, in order.
pub fn turn_end_reasons(events: &[SessionEvent]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.data.type_name() == "turn/end")
        .map(|e| e.data.to_data()["reason"].clone())
        .collect()
}

/// The live log of `agent`.
pub fn live_log(agent: &AgentRef) -> Vec<SessionEvent> {
    agent.session().events().iter().map(|e| (**e).clone()).collect()
}
