//! The test host shared by the driver's integration tests: the reference runtime (`agent-loop`)
//! with a [`ScriptedModel`] served as provider `mock`, the online invariant checker installed
//! into every session, a subagent service, and a parent agent.
//!
//! Every test ends with [`Host::finish`], which disposes the parent, waits for the driver's and
//! the service's tasks, shuts the runtime down and asserts quiescence (no agent, session, hook,
//! scoped registration or task left) and a clean invariant record.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use agent::content::visible_text;
use agent::{
    AgentHandle, AgentOptions, AgentRef, AgentRuntime, ContentBlock, CreateAgentOptions, EventData, Message,
    SessionEvent, SessionId, SessionMeta, Signal,
};
use agent_loop::ScriptedModel;
use agent_loop::model::ScriptEntry;
use agent_loop::runtime::{Runtime, assert_quiescent};
use async_trait::async_trait;
use invariants::InvariantObserver;
use subagent::capabilities::SubagentCapabilities;
use subagent::provider::{ResolvedSubagentStartRequest, SubagentProvider, SubagentStartRequest};
use subagent::run::SubagentRun;
use subagent::service::SubagentService;
use subagent::{SubagentDescriptor, SubagentError, assert_subagent_max_depth, snapshot_subagent_descriptor};
use subagent_inprocess::{InProcessDriver, InProcessRunOptions};

pub const MODEL: &str = "mock";
pub const CWD: &str = "/workspace";

pub struct Host {
    pub runtime: Runtime,
    pub model: ScriptedModel,
    pub observer: Arc<InvariantObserver>,
    pub service: SubagentService,
    pub driver: InProcessDriver,
    pub parent_handle: Option<AgentHandle>,
    pub parent: AgentRef,
    extra: Vec<AgentHandle>,
}

pub fn routed() -> AgentOptions {
    AgentOptions {
        provider: Some(MODEL.into()),
        model: Some(MODEL.into()),
        ..AgentOptions::default()
    }
}

impl Host {
    /// A host whose model answers with `script`, and a routed parent `parent` in [`CWD`].
    pub async fn new(script: Vec<ScriptEntry>) -> Self {
        Self::build(script, agent_loop::runtime::RuntimeBuilder::new(), routed()).await
    }

    /// A host whose parent (and so every child) is routed to `script` served through
    /// [`agent_loop::model::Trickle`]: each chunk arrives one scheduling point after the last
    /// (for the cancellation sweeps).
    pub async fn trickled(script: &ScriptedModel) -> Self {
        const TRICKLE: &str = "trickle";
        let adapter = Arc::new(agent_loop::model::Trickle::new(script.adapter()));
        Self::build(
            vec![],
            agent_loop::runtime::RuntimeBuilder::new().model(TRICKLE, adapter),
            AgentOptions {
                provider: Some(TRICKLE.into()),
                model: Some(TRICKLE.into()),
                ..AgentOptions::default()
            },
        )
        .await
    }

    /// A host with parent options `parent_options`.
    pub async fn with_parent(script: Vec<ScriptEntry>, parent_options: AgentOptions) -> Self {
        Self::build(script, agent_loop::runtime::RuntimeBuilder::new(), parent_options).await
    }

    /// A host whose runtime has no invariant checker, for tests that need a session log no
    /// agent loop writes (an ill-formed seed, which the checker refuses as the store enters
    /// the session). Its `observer` watches nothing.
    pub async fn unchecked(script: Vec<ScriptEntry>) -> Self {
        Self::assemble(
            script,
            agent_loop::runtime::RuntimeBuilder::new(),
            routed(),
            false,
        )
        .await
    }

    pub async fn build(
        script: Vec<ScriptEntry>,
        builder: agent_loop::runtime::RuntimeBuilder,
        parent_options: AgentOptions,
    ) -> Self {
        Self::assemble(script, builder, parent_options, true).await
    }

    async fn assemble(
        script: Vec<ScriptEntry>,
        builder: agent_loop::runtime::RuntimeBuilder,
        parent_options: AgentOptions,
        checked: bool,
    ) -> Self {
        let model = ScriptedModel::new(script);
        let observer = InvariantObserver::shared();
        let builder = builder.model(MODEL, model.adapter());
        let builder = if checked {
            builder.session_observer(observer.clone())
        } else {
            builder
        };
        let runtime = builder.build();
        let parent_handle = runtime
            .create(CreateAgentOptions {
                meta: SessionMeta {
                    cwd: Some(PathBuf::from(CWD)),
                    ..SessionMeta::default()
                },
                agent_options: parent_options,
                ..CreateAgentOptions::new(SessionId::from("parent"))
            })
            .await
            .expect("parent created");
        let parent = parent_handle.agent().clone();
        let driver = InProcessDriver::new(runtime.services().clone());
        Self {
            runtime,
            model,
            observer,
            service: SubagentService::new(),
            driver,
            parent_handle: Some(parent_handle),
            parent,
            extra: Vec::new(),
        }
    }

    /// Creates another top-level agent (kept until [`Host::finish`]).
    pub async fn agent(&mut self, id: &str, meta: SessionMeta, options: AgentOptions) -> AgentRef {
        let handle = self
            .runtime
            .create(CreateAgentOptions {
                meta,
                agent_options: options,
                ..CreateAgentOptions::new(SessionId::from(id))
            })
            .await
            .expect("agent created");
        let agent = handle.agent().clone();
        self.extra.push(handle);
        agent
    }

    /// A one-shot request from the parent with the text prompt `child task`.
    pub fn request(&self) -> SubagentStartRequest {
        request_from(&self.parent, Signal::new())
    }

    /// Registers an inline provider named `name` over this host's driver (fresh children).
    pub fn register_inline(&self, name: &str, caps: SubagentCapabilities) -> agent::Registration {
        self.service
            .register_provider(Arc::new(Inline {
                name: name.into(),
                caps,
                driver: self.driver.clone(),
            }))
            .expect("registered")
    }

    /// Runs one turn of the parent with `text` and waits until it is idle.
    pub async fn parent_turn(&self, text: &str) {
        self.parent.followup(Message::user_text(text)).expect("delivered");
        self.parent.when_idle().await;
    }

    pub fn agent_count(&self) -> usize {
        AgentRuntime::list(&self.runtime).len()
    }

    pub fn session_count(&self) -> usize {
        agent::SessionStore::list(self.runtime.sessions()).len()
    }

    pub fn get(&self, id: &SessionId) -> Option<AgentRef> {
        AgentRuntime::get(&self.runtime, id)
    }

    /// Disposes everything and asserts quiescence and a clean invariant record.
    pub async fn finish(mut self) {
        for handle in self.extra.drain(..) {
            handle.dispose().await;
        }
        if let Some(parent) = self.parent_handle.take() {
            parent.dispose().await;
        }
        self.driver.wait().await;
        self.service.close().await;
        self.runtime.shutdown().await;
        assert_eq!(self.driver.task_count(), 0, "driver tasks left");
        assert_eq!(self.service.pending_runs(), 0, "service tasks left");
        assert_quiescent(&self.runtime);
        let violations = self.observer.violations();
        assert!(violations.is_empty(), "invariant violations: {violations:?}");
    }
}

/// A one-shot request from `parent` with the text prompt `child task` and label `child task`.
pub fn request_from(parent: &AgentRef, signal: Signal) -> SubagentStartRequest {
    let mut r = SubagentStartRequest::new(vec![ContentBlock::text("child task")], parent.clone(), signal);
    r.label = Some("child task".into());
    r
}

/// The request as the service would resolve it for provider `provider` (direct-driver tests).
/// An invalid raw `maxDepth` is left for the driver to reject.
pub fn resolve(request: SubagentStartRequest, provider: &str) -> ResolvedSubagentStartRequest {
    let descriptor = SubagentDescriptor::one_shot(provider, request.label.clone());
    let descriptor_event = snapshot_subagent_descriptor(&descriptor).expect("descriptor");
    let max_depth = assert_subagent_max_depth(request.max_depth.as_ref())
        .ok()
        .flatten();
    ResolvedSubagentStartRequest {
        request,
        max_depth,
        descriptor,
        descriptor_event,
    }
}

/// A test provider over the shared driver (fresh children), like the reference's inline one.
pub struct Inline {
    pub name: String,
    pub caps: SubagentCapabilities,
    pub driver: InProcessDriver,
}

#[async_trait]
impl SubagentProvider for Inline {
    fn name(&self) -> &str {
        &self.name
    }
    fn capabilities(&self) -> SubagentCapabilities {
        self.caps
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    async fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> Result<Box<dyn SubagentRun>, SubagentError> {
        Ok(Box::new(
            self.driver.start(request, InProcessRunOptions::fresh()).await?,
        ))
    }
}

/// The visible text of content blocks.
pub fn text(blocks: &[ContentBlock]) -> String {
    visible_text(blocks)
}

/// A session's events, owned.
pub fn events_of(agent: &AgentRef) -> Vec<SessionEvent> {
    agent.session().events().iter().map(|e| (**e).clone()).collect()
}

/// The event types of a log.
pub fn types(events: &[SessionEvent]) -> Vec<String> {
    events.iter().map(|e| e.type_name().to_owned()).collect()
}

/// The last `turn/end` reason kind.
pub fn last_turn_end(agent: &AgentRef) -> Option<agent::TurnEndReason> {
    agent.session().events().iter().rev().find_map(|e| match &e.data {
        EventData::TurnEnd { reason, .. } => Some(reason.clone()),
        _ => None,
    })
}

/// Tool results of a log: (call id, is_error, text).
pub fn tool_results(agent: &AgentRef) -> Vec<(String, bool, String)> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult { message, .. } => message.content.iter().find_map(|b| match b {
                ContentBlock::ToolResult {
                    tool_call_id,
                    content,
                    is_error,
                } => Some((
                    tool_call_id.as_str().to_owned(),
                    is_error.unwrap_or(false),
                    visible_text(content),
                )),
                _ => None,
            }),
            _ => None,
        })
        .collect()
}

/// A parent double with chosen options and header (depth tests that need values a live runtime
/// agent cannot have).
pub struct FakeParent {
    id: SessionId,
    options: AgentOptions,
    session: Arc<agent::Session>,
    scope: Arc<agent::Scope>,
}

impl FakeParent {
    pub fn agent(id: &str, options: AgentOptions, meta: SessionMeta) -> AgentRef {
        let header = meta.into_header(id.into(), 1).expect("header");
        Arc::new(Self {
            id: id.into(),
            options,
            session: Arc::new(agent::Session::new(header, None).expect("session")),
            scope: Arc::new(agent::Scope::new(id.into(), None)),
        })
    }
}

impl agent::Agent for FakeParent {
    fn id(&self) -> &SessionId {
        &self.id
    }
    fn options(&self) -> &AgentOptions {
        &self.options
    }
    fn session(&self) -> &Arc<agent::Session> {
        &self.session
    }
    fn scope(&self) -> &Arc<agent::Scope> {
        &self.scope
    }
    fn send(
        &self,
        message: Message,
        _: agent::InboxTarget,
        _: bool,
    ) -> Result<agent::MessageId, agent::AgentError> {
        Ok(message.id)
    }
    fn remove_pending(&self, _: &agent::MessageId) -> Result<bool, agent::AgentError> {
        Ok(false)
    }
    fn inbox(&self) -> agent::InboxSnapshot {
        agent::InboxSnapshot::default()
    }
    fn cancel(&self, _: agent::CancelCause, _: agent::CancelOptions) {}
    fn status(&self) -> agent::AgentStatus {
        agent::AgentStatus::Idle
    }
    fn when_idle(&self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async {})
    }
    fn is_live(&self) -> bool {
        true
    }
}

/// Wraps a host runtime so a test can intervene right after `create` fulfils (the handoff
/// window) or replace the returned handle.
pub struct WrapRuntime {
    pub inner: Arc<dyn AgentRuntime>,
    /// Edits the creation options before the inner `create` (e.g. to wrap the setup window).
    #[allow(clippy::type_complexity)]
    pub before: Box<dyn Fn(&mut CreateAgentOptions) + Send + Sync>,
    #[allow(clippy::type_complexity)]
    pub on_create: Box<dyn Fn(AgentHandle) -> AgentHandle + Send + Sync>,
}

#[async_trait]
impl AgentRuntime for WrapRuntime {
    async fn create(&self, mut options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        (self.before)(&mut options);
        let handle = self.inner.create(options).await?;
        Ok((self.on_create)(handle))
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.inner.resume(options).await
    }
    fn get(&self, id: &SessionId) -> Option<AgentRef> {
        self.inner.get(id)
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

/// A driver whose children are created through `wrap` around this host's runtime.
pub fn wrapped_driver(
    host: &Host,
    on_create: impl Fn(AgentHandle) -> AgentHandle + Send + Sync + 'static,
) -> InProcessDriver {
    hooked_driver(host, |_| {}, on_create)
}

/// A driver whose creations pass through `before` (options) and `on_create` (handle).
pub fn hooked_driver(
    host: &Host,
    before: impl Fn(&mut CreateAgentOptions) + Send + Sync + 'static,
    on_create: impl Fn(AgentHandle) -> AgentHandle + Send + Sync + 'static,
) -> InProcessDriver {
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(WrapRuntime {
        inner: services.agents.clone(),
        before: Box::new(before),
        on_create: Box::new(on_create),
    });
    InProcessDriver::new(services)
}

/// Wraps a creation's setup window so `after` runs right after the driver's own setup (still
/// inside the unpublished creation transaction).
pub fn after_setup(options: &mut CreateAgentOptions, after: impl FnOnce() + Send + 'static) {
    if let Some(inner) = options.setup.take() {
        options.setup = Some(Box::new(move |ctx| {
            Box::pin(async move {
                let out = inner(ctx).await;
                after();
                out
            })
        }));
    }
}

/// A global tool `name` whose body returns `ran` and counts its calls.
pub fn counting_tool(name: &str, calls: Arc<std::sync::atomic::AtomicUsize>) -> agent::tools::ToolDefinition {
    struct Body(Arc<std::sync::atomic::AtomicUsize>);
    #[async_trait]
    impl agent::tools::ToolHandler for Body {
        async fn execute(
            &self,
            _: serde_json::Value,
            _: agent::tools::ToolContext,
        ) -> Result<agent::tools::ToolOutput, agent::tools::ToolError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(agent::tools::ToolOutput::text("ran"))
        }
    }
    agent::tools::ToolDefinition {
        name: name.into(),
        description: "probe".into(),
        parameters: serde_json::json!({"type": "object"}),
        concurrency_safe: true,
        handler: Arc::new(Body(calls)),
    }
}

/// Registers a global tool on the host's registry; the guard removes it.
pub fn global_tool(host: &Host, def: agent::tools::ToolDefinition) -> agent::Registration {
    host.runtime
        .services()
        .tools
        .register(None, def)
        .expect("tool registered")
}

/// A host agent over a real one whose `send` and `cancel` first run test hooks — a misbehaving
/// or racing host — and which otherwise delegates. A `send` hook returning an error fails the
/// send without delivering; a hook may also panic.
pub struct HookedAgent {
    inner: AgentRef,
    on_send: Box<dyn Fn() -> Result<(), agent::AgentError> + Send + Sync>,
    on_cancel: Box<dyn Fn() + Send + Sync>,
}

impl HookedAgent {
    /// Delegates everything to `inner` until hooks are added.
    pub fn new(inner: &AgentRef) -> Self {
        Self {
            inner: inner.clone(),
            on_send: Box::new(|| Ok(())),
            on_cancel: Box::new(|| {}),
        }
    }

    /// Runs `hook` before every `send`; an `Err` is the send's result.
    pub fn on_send(
        mut self,
        hook: impl Fn() -> Result<(), agent::AgentError> + Send + Sync + 'static,
    ) -> Self {
        self.on_send = Box::new(hook);
        self
    }

    /// Runs `hook` before every `cancel`.
    pub fn on_cancel(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_cancel = Box::new(hook);
        self
    }

    /// The wrapped agent as the handle of `handle`'s agent, disposing the real handle.
    pub fn handle(self, handle: AgentHandle) -> AgentHandle {
        AgentHandle::new(Arc::new(self), Arc::new(Forward(handle)))
    }
}

impl agent::Agent for HookedAgent {
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
    fn send(
        &self,
        message: Message,
        target: agent::InboxTarget,
        wake: bool,
    ) -> Result<agent::MessageId, agent::AgentError> {
        (self.on_send)()?;
        self.inner.send(message, target, wake)
    }
    fn remove_pending(&self, id: &agent::MessageId) -> Result<bool, agent::AgentError> {
        self.inner.remove_pending(id)
    }
    fn inbox(&self) -> agent::InboxSnapshot {
        self.inner.inbox()
    }
    fn cancel(&self, cause: agent::CancelCause, options: agent::CancelOptions) {
        (self.on_cancel)();
        self.inner.cancel(cause, options)
    }
    fn status(&self) -> agent::AgentStatus {
        self.inner.status()
    }
    fn when_idle(&self) -> futures::future::BoxFuture<'static, ()> {
        self.inner.when_idle()
    }
    fn is_live(&self) -> bool {
        self.inner.is_live()
    }
}

/// A disposer that disposes the real handle.
pub struct Forward(pub AgentHandle);

impl agent::Disposer for Forward {
    fn dispose(&self) -> futures::future::BoxFuture<'static, ()> {
        self.0.dispose()
    }
}
