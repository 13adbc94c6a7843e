//! Test rig: a real host — the reference runtime with an in-memory persistence backend, a real
//! `SubagentService` with a continuable `spawn`-shaped provider, the seam's
//! `ContinuationManager` and (optionally) the report package — plus a model adapter that
//! routes each session to its own scripted model and can hold a session's requests until the
//! test releases them.
//!
//! Nothing here sleeps for real time: the clock is paused in every test, and holds are opened
//! by the test, never by time.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use agent::content::visible_text;
use agent::tools::{ToolCallRequest, ToolResult};
use agent::{
    Agent, AgentError, AgentHandle, AgentOptions, AgentRef, AgentRuntime, AgentStatus, ContentBlock,
    CreateAgentOptions, EventData, GenerateOptions, InboxTarget, Message, MessageId, ModelAdapter,
    ModelStream, SessionId, SessionPersistence, Signal,
};
use agent_loop::model::{ScriptEntry, chunks};
use agent_loop::runtime::{Runtime, assert_quiescent};
use agent_loop::{MemoryStore, ScriptedModel};
use async_trait::async_trait;
use futures::StreamExt as _;
use parking_lot::Mutex;
use serde_json::json;
use subagent::continuation::{ContinuableStartSpec, ContinuationManager};
use subagent::provider::{PrepareContinuable, ResolvedSubagentStartRequest, SubagentProvider};
use subagent::run::SubagentRun;
use subagent::service::SubagentService;
use subagent::{
    ContinuableCreateRequest, ContinuableCreateSpec, SubagentCapabilities, SubagentError, SubagentErrorCode,
};
use tokio::sync::watch;
use tool_subagent_report::{ReportToolConfig, ReportToolPlugin};

/// The model route every agent uses.
pub const MODEL: &str = "mock";
/// The root parent's id.
pub const PARENT: &str = "parent";
/// The continuable provider's name.
pub const PROVIDER: &str = "spawn";

// ---- the model ----------------------------------------------------------------------------

/// Routes each request to its session's scripted model; a session without a script (or whose
/// script is used up) answers `"<session> answer"`. A held session's requests wait until the
/// test releases it (or the request is cancelled).
#[derive(Default)]
pub struct Models {
    scripts: Mutex<HashMap<String, ScriptedModel>>,
    gates: Mutex<HashMap<String, watch::Sender<bool>>>,
    released: Mutex<HashSet<String>>,
    requests: Mutex<Vec<Arc<GenerateOptions>>>,
}

impl Models {
    /// Appends `entries` to `session`'s script.
    pub fn script(&self, session: &str, entries: impl IntoIterator<Item = ScriptEntry>) {
        let mut scripts = self.scripts.lock();
        let model = scripts.entry(session.to_owned()).or_default();
        for entry in entries {
            model.push(entry);
        }
    }

    /// Holds `session`'s requests until [`release`](Self::release).
    pub fn hold(&self, session: &str) {
        self.released.lock().remove(session);
        self.gates
            .lock()
            .entry(session.to_owned())
            .or_insert_with(|| watch::channel(false).0);
    }

    /// Lets `session`'s held and future requests through.
    pub fn release(&self, session: &str) {
        self.released.lock().insert(session.to_owned());
        if let Some(gate) = self.gates.lock().get(session) {
            gate.send_replace(true);
        }
    }

    /// The requests `session` made so far.
    pub fn requests(&self, session: &str) -> Vec<Arc<GenerateOptions>> {
        self.requests
            .lock()
            .iter()
            .filter(|r| r.session_id.as_ref().is_some_and(|s| s.as_str() == session))
            .cloned()
            .collect()
    }

    fn gate(&self, session: &str) -> Option<watch::Receiver<bool>> {
        if self.released.lock().contains(session) {
            return None;
        }
        self.gates.lock().get(session).map(watch::Sender::subscribe)
    }

    fn model(&self, session: &str) -> ScriptedModel {
        let scripted = self.scripts.lock().get(session).cloned();
        match scripted {
            Some(model) if model.remaining() > 0 => model,
            _ => ScriptedModel::new([chunks::text(format!("{session} answer"))]),
        }
    }
}

/// The adapter the runtime uses (a shared handle on [`Models`]).
pub struct Routed(pub Arc<Models>);

impl ModelAdapter for Routed {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        self.0.requests.lock().push(request.clone());
        let models = self.0.clone();
        let session = request
            .session_id
            .as_ref()
            .map_or_else(String::new, |s| s.as_str().to_owned());
        let gate = models.gate(&session);
        futures::stream::once(async move {
            if let Some(mut gate) = gate {
                tokio::select! {
                    _ = gate.wait_for(|open| *open) => {}
                    () = request.signal.cancelled() => {}
                }
            }
            if request.signal.is_cancelled() {
                // Ends with the aborted finish a cancelled request owes.
                ScriptedModel::new([ScriptEntry::hang()])
                    .adapter()
                    .stream(request)
            } else {
                models.model(&session).adapter().stream(request)
            }
        })
        .flatten()
        .boxed()
    }
}

// ---- the provider -------------------------------------------------------------------------

/// A continuable provider of the `spawn` shape: its preparation returns no seed; its one-shot
/// `start` is never used.
pub struct ContinuableProvider;

#[async_trait]
impl SubagentProvider for ContinuableProvider {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn capabilities(&self) -> SubagentCapabilities {
        SubagentCapabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        false
    }

    async fn start(&self, _: ResolvedSubagentStartRequest) -> Result<Box<dyn SubagentRun>, SubagentError> {
        Err(SubagentError::new(
            SubagentErrorCode::ProviderFailed,
            "this provider serves continuable children only",
        ))
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        Some(self)
    }
}

#[async_trait]
impl PrepareContinuable for ContinuableProvider {
    async fn prepare_continuable(
        &self,
        _: ContinuableCreateRequest,
    ) -> Result<ContinuableCreateSpec, SubagentError> {
        Ok(ContinuableCreateSpec::default())
    }
}

// ---- a parent whose send throws -------------------------------------------------------------

/// The host's agent registry as the continuation manager sees it, except that the agents named
/// in `refusing` come back wrapped so that their `send` fails (a parent that throws on
/// delivery). Everything else is the runtime's own.
pub struct RefusingAgents {
    inner: Arc<dyn AgentRuntime>,
    refusing: Mutex<HashSet<SessionId>>,
}

impl RefusingAgents {
    /// From now on `id`'s sends fail.
    pub fn refuse(&self, id: &str) {
        self.refusing.lock().insert(SessionId::from(id));
    }
}

#[async_trait]
impl AgentRuntime for RefusingAgents {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, AgentError> {
        self.inner.create(options).await
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, AgentError> {
        self.inner.resume(options).await
    }
    fn get(&self, id: &SessionId) -> Option<AgentRef> {
        let live = self.inner.get(id)?;
        if self.refusing.lock().contains(id) {
            return Some(Arc::new(Proxy {
                inner: live,
                refuse_sends: true,
            }));
        }
        Some(live)
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

/// A stand-in for the exact agent `agent`: same id, same session, another object (a forged or
/// stale reference).
pub fn forged(agent: &AgentRef) -> AgentRef {
    Arc::new(Proxy {
        inner: agent.clone(),
        refuse_sends: false,
    })
}

/// Another object standing for a live agent: everything delegates to it, except that with
/// `refuse_sends` every `send` fails (a parent closing during a delivery).
struct Proxy {
    inner: AgentRef,
    refuse_sends: bool,
}

impl Agent for Proxy {
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
        if self.refuse_sends {
            return Err(AgentError::Other("parent closed during delivery".into()));
        }
        self.inner.send(message, target, wake)
    }
    fn remove_pending(&self, id: &MessageId) -> Result<bool, AgentError> {
        self.inner.remove_pending(id)
    }
    fn inbox(&self) -> agent::InboxSnapshot {
        self.inner.inbox()
    }
    fn cancel(&self, cause: agent::CancelCause, options: agent::CancelOptions) {
        self.inner.cancel(cause, options);
    }
    fn status(&self) -> AgentStatus {
        self.inner.status()
    }
    fn when_idle(&self) -> futures::future::BoxFuture<'static, ()> {
        self.inner.when_idle()
    }
    fn is_live(&self) -> bool {
        self.inner.is_live()
    }
}

// ---- the rig ------------------------------------------------------------------------------

/// One report delivered to (or pending in) an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The message id.
    pub id: String,
    /// The message's text blocks.
    pub texts: Vec<String>,
    /// `senderSessionId`.
    pub sender: String,
}

/// The host.
pub struct Rig {
    pub rt: Runtime,
    pub store: Arc<MemoryStore>,
    pub models: Arc<Models>,
    pub subagents: SubagentService,
    pub manager: ContinuationManager,
    pub plugin: Option<ReportToolPlugin>,
    /// The manager's view of the agent registry.
    pub agents_view: Arc<RefusingAgents>,
    provider: Option<agent::Registration>,
    parent: Option<AgentHandle>,
    extra: Vec<AgentHandle>,
    calls: Mutex<u64>,
}

/// The model route of every agent.
pub fn routed() -> AgentOptions {
    AgentOptions {
        provider: Some(MODEL.into()),
        model: Some(MODEL.into()),
        ..AgentOptions::default()
    }
}

impl Rig {
    /// A host with the report package loaded with `config`, or without it (`None`).
    pub async fn new(config: Option<ReportToolConfig>) -> Self {
        let models = Arc::new(Models::default());
        let store = Arc::new(MemoryStore::new());
        let rt = Runtime::builder()
            .model(MODEL, Arc::new(Routed(models.clone())))
            .persistence(store.clone())
            .build();
        let subagents = SubagentService::new();
        let provider = subagents
            .register_provider(Arc::new(ContinuableProvider))
            .expect("provider registers");
        let mut services = rt.services().clone();
        let agents_view = Arc::new(RefusingAgents {
            inner: services.agents.clone(),
            refusing: Mutex::new(HashSet::new()),
        });
        services.agents = agents_view.clone();
        let manager = ContinuationManager::new(subagents.clone(), services);
        let plugin = config.map(|config| ReportToolPlugin::load(&manager, config).expect("loads"));
        let parent = rt
            .create(CreateAgentOptions {
                agent_options: routed(),
                ..CreateAgentOptions::new(SessionId::from(PARENT))
            })
            .await
            .expect("parent created");
        Self {
            rt,
            store,
            models,
            subagents,
            manager,
            plugin,
            agents_view,
            provider: Some(provider),
            parent: Some(parent),
            extra: Vec::new(),
            calls: Mutex::new(0),
        }
    }

    /// The root parent.
    pub fn parent(&self) -> &AgentRef {
        self.parent.as_ref().expect("parent live").agent()
    }

    /// Takes the parent's handle (the test disposes it).
    pub fn take_parent(&mut self) -> AgentHandle {
        self.parent.take().expect("parent handle")
    }

    /// Another root agent, disposed at [`finish`](Self::finish) unless taken.
    pub async fn root(&mut self, id: &str) -> AgentRef {
        let handle = self
            .rt
            .create(CreateAgentOptions {
                agent_options: routed(),
                ..CreateAgentOptions::new(SessionId::from(id))
            })
            .await
            .expect("root created");
        let agent = handle.agent().clone();
        self.extra.push(handle);
        agent
    }

    /// Takes the handle of the extra root `id`.
    pub fn take_root(&mut self, id: &str) -> AgentHandle {
        let index = self
            .extra
            .iter()
            .position(|h| h.agent().id().as_str() == id)
            .expect("root handle");
        self.extra.remove(index)
    }

    /// A continuable start spec for child `child_id` of `parent` with task `prompt`.
    pub fn spec(&self, parent: &AgentRef, child_id: &str, prompt: &str) -> ContinuableStartSpec {
        let mut spec =
            ContinuableStartSpec::new(PROVIDER, prompt, vec![ContentBlock::text(prompt)], parent.clone());
        spec.child_id = Some(SessionId::from(child_id));
        spec
    }

    /// Starts a continuable child of `parent` and returns it (resident at that point).
    pub async fn start(&self, parent: &AgentRef, child_id: &str, prompt: &str) -> AgentRef {
        self.start_spec(self.spec(parent, child_id, prompt)).await
    }

    /// Starts a continuable child from `spec` and returns it.
    pub async fn start_spec(&self, spec: ContinuableStartSpec) -> AgentRef {
        let (id, _) = self
            .manager
            .start_continuable(spec)
            .await
            .expect("the child starts");
        self.agent(id.as_str()).expect("the child is live")
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

    /// Calls `report` as `agent` with `output`, under `signal`.
    pub async fn report_with(&self, agent: &str, output: &str, signal: Signal) -> ToolResult {
        let call_id = {
            let mut calls = self.calls.lock();
            *calls += 1;
            format!("report-{calls}")
        };
        let call = ToolCallRequest {
            call_id: call_id.into(),
            name: "report".to_owned(),
            arguments: json!({"output": output}).to_string(),
        };
        self.rt
            .services()
            .tools
            .execute(&SessionId::from(agent), call, signal)
            .await
            .result
    }

    /// Calls `report` as `agent` with `output`.
    pub async fn report(&self, agent: &str, output: &str) -> ToolResult {
        self.report_with(agent, output, Signal::new()).await
    }

    /// The tool names `agent` sees (`None`: the global view).
    pub fn tool_names(&self, agent: Option<&str>) -> Vec<String> {
        let scope = agent.map(SessionId::from);
        self.rt
            .services()
            .tools
            .schemas(scope.as_ref())
            .into_iter()
            .map(|s| s.name)
            .collect()
    }

    /// The prompt sections `agent` assembles (`None`: the global assembly).
    pub fn sections(&self, agent: Option<&str>) -> Vec<agent::prompt::PromptSection> {
        let scope = agent.map(SessionId::from);
        self.rt.services().prompt.sections(scope.as_ref())
    }

    /// The names of [`sections`](Self::sections).
    pub fn section_names(&self, agent: Option<&str>) -> Vec<String> {
        self.sections(agent).into_iter().map(|s| s.name).collect()
    }

    /// Waits (virtual time) until no child is resident and the manager's tasks ended.
    pub async fn settle(&self) {
        for _ in 0..10_000 {
            if self.manager.resident().is_empty() && self.manager.task_count() == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("children did not settle: {:?}", self.manager.resident());
    }

    /// Waits (virtual time) until `done` holds.
    pub async fn until(&self, what: &str, done: impl Fn() -> bool) {
        for _ in 0..10_000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("timed out waiting until {what}");
    }

    /// `id`'s persisted log.
    pub async fn persisted(&self, id: &str) -> agent::store::LoadedSession {
        SessionPersistence::load(self.store.as_ref(), &SessionId::from(id))
            .await
            .expect("persisted")
    }

    /// Tears everything down and asserts that every registry ends empty: the package unloaded,
    /// every child released, no agent, session, tool, prompt section or task left.
    pub async fn finish(mut self) {
        if let Some(plugin) = self.plugin.take() {
            plugin.unload().expect("unloads");
        }
        for id in self.models.gates.lock().keys() {
            self.models.released.lock().insert(id.clone());
        }
        for gate in self.models.gates.lock().values() {
            gate.send_replace(true);
        }
        self.manager.dispose_all().await.expect("drained");
        for handle in self.extra.drain(..) {
            handle.dispose().await;
        }
        if let Some(parent) = self.parent.take() {
            parent.dispose().await;
        }
        drop(self.provider.take());
        self.subagents.close().await;
        self.rt.shutdown().await;
        assert_eq!(self.manager.task_count(), 0, "manager tasks left");
        assert!(self.manager.resident().is_empty(), "children left resident");
        let tools = self.rt.tool_registry().expect("the runtime's registry").counts();
        assert_eq!(tools.tools, 0, "tools left: {tools:?}");
        assert_eq!(self.rt.prompt().len(), 0, "prompt registrations left");
        assert_quiescent(&self.rt);
    }
}

/// The reports `agent` received: visible in its log, then still pending in its inbox.
pub fn reports(agent: &AgentRef) -> Vec<Report> {
    let visible: Vec<Message> = agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) => Some(m.clone()),
            _ => None,
        })
        .collect();
    let inbox = agent.inbox();
    visible
        .into_iter()
        .chain(inbox.next_step)
        .chain(inbox.next_turn)
        .filter(|m| m.source.kind() == "subagent-report")
        .map(|m| Report {
            id: m.id.as_str().to_owned(),
            texts: m
                .content
                .iter()
                .map(|b| visible_text(std::slice::from_ref(b)))
                .collect(),
            sender: sender(&m),
        })
        .collect()
}

/// A message's `senderSessionId`.
pub fn sender(message: &Message) -> String {
    let value = serde_json::to_value(&message.source).expect("serializable");
    value["senderSessionId"].as_str().unwrap_or_default().to_owned()
}

/// The inbox insertions logged for `agent`: the lane and the source kind of each inserted
/// message, in order.
pub fn insertions(agent: &AgentRef) -> Vec<(InboxTarget, String)> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::InboxSpliced(splice) if splice.removed_count.is_none() && splice.outcome.is_none() => {
                Some(
                    splice
                        .inserted
                        .iter()
                        .map(|m| (splice.target, m.source.kind().to_owned()))
                        .collect::<Vec<_>>(),
                )
            }
            _ => None,
        })
        .flatten()
        .collect()
}

/// The text of a tool result.
pub fn text(result: &ToolResult) -> String {
    visible_text(&result.content)
}

/// The error code of a failed tool result.
pub fn code(result: &ToolResult) -> String {
    assert!(result.is_error, "expected a failure: {}", text(result));
    result.error.as_ref().expect("error facts").code.clone()
}
