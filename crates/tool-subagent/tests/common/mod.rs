//! Test fixture: a real `agent_loop` host (runtime, tool registry, job registry and job tools)
//! with a real `SubagentService`, and scriptable fake providers and runs.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::content::visible_text;
use agent::jobs::Jobs;
use agent::tools::{ToolCallRequest, ToolResult};
use agent::{
    AgentHandle, AgentRef, AgentRuntime, ContentBlock, CreateAgentOptions, Registration, Services, SessionId,
    Signal,
};
use agent_loop::jobs::{JobRegistry, job_tools};
use agent_loop::runtime::Runtime;
use async_trait::async_trait;
use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::{Value, json};
use subagent::provider::{PrepareContinuable, ResolvedSubagentStartRequest, SubagentProvider};
use subagent::run::{RunDisposeFuture, RunFailure, RunResultFuture, SubagentRun};
use subagent::service::SubagentService;
use subagent::{
    ContinuableCreateRequest, ContinuableCreateSpec, StopReason, SubagentCapabilities, SubagentError,
    SubagentResult,
};
use tool_subagent::{SubagentToolConfig, SubagentToolPlugin};

/// Options creating top-level agent `id` in `/workspace`, routed to provider and model `model`
/// (the real-runtime suites' parents).
pub fn routed_parent(id: &str, model: &str) -> CreateAgentOptions {
    CreateAgentOptions {
        meta: agent::SessionMeta {
            cwd: Some(std::path::PathBuf::from("/workspace")),
            ..agent::SessionMeta::default()
        },
        agent_options: agent::AgentOptions {
            provider: Some(model.into()),
            model: Some(model.into()),
            ..agent::AgentOptions::default()
        },
        ..CreateAgentOptions::new(SessionId::from(id))
    }
}

/// The shared tail of the real-runtime suites' teardown: stops the job registry, waits for the
/// driver's and the service's tasks, drops the registrations, shuts the runtime down, and
/// asserts that no driver task, pending run, job, agent, session or runtime task is left.
pub async fn shut_down_quiescent(
    jobs: &JobRegistry,
    driver: &subagent_inprocess::InProcessDriver,
    subagents: &SubagentService,
    registrations: &mut Vec<Registration>,
    rt: &Runtime,
) {
    jobs.shutdown().await;
    driver.wait().await;
    subagents.close().await;
    registrations.clear();
    rt.shutdown().await;
    assert_eq!(driver.task_count(), 0, "driver tasks left");
    assert_eq!(subagents.pending_runs(), 0, "service tasks left");
    assert!(jobs.counts().is_empty(), "jobs left: {:?}", jobs.counts());
    assert!(AgentRuntime::list(rt).is_empty(), "agents left");
    agent_loop::runtime::assert_quiescent(rt);
}

/// A plain error for fake results and disposals.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Failure(pub String);

/// A `RunFailure` with `message`.
pub fn failure(message: &str) -> RunFailure {
    RunFailure::new(Failure(message.to_owned()))
}

/// The texts of a result's content.
pub fn text(result: &ToolResult) -> String {
    visible_text(&result.content)
}

// ---- runs -----------------------------------------------------------------------------------

/// A scripted run: a result future, a disposal outcome, and a count of `dispose()` calls.
pub struct FakeRun {
    id: SessionId,
    result: RunResultFuture,
    dispose: RunDisposeFuture,
    dispose_calls: Arc<AtomicUsize>,
}

impl FakeRun {
    /// A run whose result is `result` and whose disposal yields `dispose`; `dispose_calls`
    /// counts `dispose()` calls.
    pub fn boxed(
        id: &str,
        result: BoxFuture<'static, Result<SubagentResult, RunFailure>>,
        dispose: Result<(), RunFailure>,
        dispose_calls: Arc<AtomicUsize>,
    ) -> Box<dyn SubagentRun> {
        Box::new(Self {
            id: id.into(),
            result: result.shared(),
            dispose: async move { dispose }.boxed().shared(),
            dispose_calls,
        })
    }

    /// A run that already resolved with `result` and disposes cleanly.
    pub fn resolved(
        id: &str,
        result: SubagentResult,
        dispose_calls: Arc<AtomicUsize>,
    ) -> Box<dyn SubagentRun> {
        Self::boxed(id, async move { Ok(result) }.boxed(), Ok(()), dispose_calls)
    }
}

impl SubagentRun for FakeRun {
    fn id(&self) -> &SessionId {
        &self.id
    }

    fn local_agent(&self) -> Option<AgentRef> {
        None
    }

    fn result(&self) -> RunResultFuture {
        self.result.clone()
    }

    fn dispose(&self) -> RunDisposeFuture {
        self.dispose_calls.fetch_add(1, Ordering::SeqCst);
        self.dispose.clone()
    }
}

/// Where a [`PanickingRun`] panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanicAt {
    /// In the `result()` call itself.
    ResultCall,
    /// When its result future is polled.
    ResultFuture,
    /// In the `dispose()` call itself (the result completes).
    DisposeCall,
    /// When its disposal future is polled (the result completes).
    DisposeFuture,
    /// In `id()`, from its second call on (the service's own call at publication succeeds).
    LaterId,
}

/// A misbehaving third-party run that panics at one point; every other answer is a completed
/// result (`"done"`) or a clean disposal. Counts `dispose()` calls.
pub struct PanickingRun {
    at: PanicAt,
    id_calls: AtomicUsize,
    dispose_calls: Arc<AtomicUsize>,
    result: RunResultFuture,
    dispose: RunDisposeFuture,
}

impl PanickingRun {
    /// A run (id `wild-child`) panicking at `at`.
    pub fn boxed(at: PanicAt, dispose_calls: Arc<AtomicUsize>) -> Box<dyn SubagentRun> {
        let result = if at == PanicAt::ResultFuture {
            async { panic!("result exploded") }.boxed()
        } else {
            async { Ok(completed("done")) }.boxed()
        };
        let dispose = if at == PanicAt::DisposeFuture {
            async { panic!("dispose exploded") }.boxed()
        } else {
            async { Ok(()) }.boxed()
        };
        Box::new(Self {
            at,
            id_calls: AtomicUsize::new(0),
            dispose_calls,
            result: result.shared(),
            dispose: dispose.shared(),
        })
    }

    /// A provider named `name` whose runs panic at `at`.
    pub fn provider(name: &str, at: PanicAt, dispose_calls: Arc<AtomicUsize>) -> FakeProvider {
        FakeProvider::new(
            name,
            Arc::new(move |_| {
                let run = Self::boxed(at, dispose_calls.clone());
                async move { Ok(run) }.boxed()
            }),
        )
        .capability_less()
    }
}

impl SubagentRun for PanickingRun {
    fn id(&self) -> &SessionId {
        if self.at == PanicAt::LaterId && self.id_calls.fetch_add(1, Ordering::SeqCst) > 0 {
            panic!("id() exploded");
        }
        static ID: std::sync::OnceLock<SessionId> = std::sync::OnceLock::new();
        ID.get_or_init(|| "wild-child".into())
    }

    fn local_agent(&self) -> Option<AgentRef> {
        None
    }

    fn result(&self) -> RunResultFuture {
        if self.at == PanicAt::ResultCall {
            panic!("result() exploded");
        }
        self.result.clone()
    }

    fn dispose(&self) -> RunDisposeFuture {
        self.dispose_calls.fetch_add(1, Ordering::SeqCst);
        if self.at == PanicAt::DisposeCall {
            panic!("dispose() exploded");
        }
        self.dispose.clone()
    }
}

/// A completed result with one text block.
pub fn completed(text: &str) -> SubagentResult {
    SubagentResult::new(vec![ContentBlock::text(text)], StopReason::Completed)
}

// ---- providers ------------------------------------------------------------------------------

/// How a fake provider starts a run.
pub type StartFn = Arc<
    dyn Fn(ResolvedSubagentStartRequest) -> BoxFuture<'static, Result<Box<dyn SubagentRun>, SubagentError>>
        + Send
        + Sync,
>;

/// A scriptable provider that records every request it receives.
pub struct FakeProvider {
    pub name: String,
    pub capabilities: SubagentCapabilities,
    pub inherits: bool,
    pub continuable: bool,
    pub start: StartFn,
    pub requests: Arc<Mutex<Vec<ResolvedSubagentStartRequest>>>,
    pub prepare_calls: Arc<AtomicUsize>,
}

impl FakeProvider {
    /// A provider named `name` with every capability, a fresh context and no continuable
    /// preparation, starting runs with `start`.
    pub fn new(name: &str, start: StartFn) -> Self {
        Self {
            name: name.to_owned(),
            capabilities: SubagentCapabilities::ALL,
            inherits: false,
            continuable: false,
            start,
            requests: Arc::default(),
            prepare_calls: Arc::default(),
        }
    }

    /// A provider whose runs complete with `reply` (run id `<name>-child`), counting disposals
    /// in `disposals`.
    pub fn replying(name: &str, reply: &str, disposals: Arc<AtomicUsize>) -> Self {
        let reply = reply.to_owned();
        let id = format!("{name}-child");
        Self::new(
            name,
            Arc::new(move |_| {
                let run = FakeRun::resolved(&id, completed(&reply), disposals.clone());
                async move { Ok(run) }.boxed()
            }),
        )
    }

    /// A provider whose runs resolve with `result`.
    pub fn resulting(name: &str, result: SubagentResult, disposals: Arc<AtomicUsize>) -> Self {
        Self::new(
            name,
            Arc::new(move |_| {
                let run = FakeRun::resolved("child", result.clone(), disposals.clone());
                async move { Ok(run) }.boxed()
            }),
        )
    }

    /// The same provider without any capability.
    pub fn capability_less(mut self) -> Self {
        self.capabilities = SubagentCapabilities::default();
        self
    }

    /// The same provider with the given inheritance descriptor.
    pub fn inheriting(mut self, inherits: bool) -> Self {
        self.inherits = inherits;
        self
    }

    /// The same provider with continuable preparation.
    pub fn with_continuable(mut self) -> Self {
        self.continuable = true;
        self
    }
}

#[async_trait]
impl SubagentProvider for FakeProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> SubagentCapabilities {
        self.capabilities
    }

    fn inherits_parent_context(&self) -> bool {
        self.inherits
    }

    async fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> Result<Box<dyn SubagentRun>, SubagentError> {
        self.requests.lock().push(request.clone());
        (self.start)(request).await
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        self.continuable.then_some(self as &dyn PrepareContinuable)
    }
}

#[async_trait]
impl PrepareContinuable for FakeProvider {
    async fn prepare_continuable(
        &self,
        _request: ContinuableCreateRequest,
    ) -> Result<ContinuableCreateSpec, SubagentError> {
        self.prepare_calls.fetch_add(1, Ordering::SeqCst);
        Ok(ContinuableCreateSpec::default())
    }
}

// ---- the scripted provider ------------------------------------------------------------------

/// The reply of a [`FakeProvider::scripted`] provider without a configured one.
pub const SCRIPTED_REPLY: &str = "scripted subagent reply";

/// How a [`FakeProvider::scripted`] provider rejects a start cancelled before its run is
/// published.
pub const SCRIPTED_START_ABORTED: &str = "scripted subagent start aborted before publication";

/// What a [`FakeProvider::scripted`] provider answers (the upstream `scripted-provider.ts`
/// fixture). Every field is optional.
#[derive(Clone, Debug, Default)]
pub struct Script {
    /// The child's final text; [`SCRIPTED_REPLY`] when absent.
    pub reply: Option<String>,
    /// The terminal stop reason; `completed` when absent.
    pub stop_reason: Option<StopReason>,
    /// A diagnostic attached to a result that did not complete.
    pub diagnostic: Option<String>,
    /// The advertised capabilities; all of them when absent.
    pub capabilities: Option<SubagentCapabilities>,
    /// Whether the provider inherits the parent's completed turns.
    pub inherits: bool,
    /// The structured value returned when the request asks for one; `{"reply": <reply>}` when
    /// absent.
    pub structured: Option<Value>,
}

/// The run of a scripted provider: its result resolves one scheduling round after it is first
/// awaited, `aborted` when the request's signal was cancelled or the run disposed by then.
struct ScriptedRun {
    id: SessionId,
    result: RunResultFuture,
    disposed: Arc<std::sync::atomic::AtomicBool>,
}

impl SubagentRun for ScriptedRun {
    fn id(&self) -> &SessionId {
        &self.id
    }

    fn local_agent(&self) -> Option<AgentRef> {
        None
    }

    fn result(&self) -> RunResultFuture {
        self.result.clone()
    }

    fn dispose(&self) -> RunDisposeFuture {
        self.disposed.store(true, Ordering::SeqCst);
        async { Ok(()) }.boxed().shared()
    }
}

impl FakeProvider {
    /// The scripted provider fixture, registered as `name`: it rejects a start whose signal is
    /// cancelled before or while its run is published ([`SCRIPTED_START_ABORTED`]); its run
    /// (id `scripted-subagent:<name>:<parent>`) answers the reply as one text block with the
    /// scripted stop reason — `aborted` when the signal is cancelled or the run disposed before
    /// the result resolves — carries the diagnostic only when the run did not complete, and a
    /// structured value (configured, or `{"reply": <reply>}`) only when the request names an
    /// output schema and the provider advertises `outputSchema`.
    pub fn scripted(name: &str, script: Script) -> Self {
        let capabilities = script.capabilities.unwrap_or(SubagentCapabilities::ALL);
        let inherits = script.inherits;
        let provider = name.to_owned();
        let start: StartFn = Arc::new(move |resolved| {
            let script = script.clone();
            let provider = provider.clone();
            async move {
                let request = resolved.request;
                let aborted =
                    || SubagentError::new(subagent::SubagentErrorCode::Cancelled, SCRIPTED_START_ABORTED);
                if request.signal.is_cancelled() {
                    return Err(aborted());
                }
                // Publication takes a scheduling round; a cancellation meanwhile rejects too.
                tokio::task::yield_now().await;
                if request.signal.is_cancelled() {
                    return Err(aborted());
                }
                let reply = script.reply.clone().unwrap_or_else(|| SCRIPTED_REPLY.to_owned());
                let structured = (request.output_schema.is_some() && capabilities.output_schema).then(|| {
                    script
                        .structured
                        .clone()
                        .unwrap_or_else(|| json!({"reply": reply}))
                });
                let disposed = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let (signal, stopped) = (request.signal.clone(), disposed.clone());
                let result = async move {
                    tokio::task::yield_now().await;
                    let stop_reason = if signal.is_cancelled() || stopped.load(Ordering::SeqCst) {
                        StopReason::Aborted
                    } else {
                        script.stop_reason.clone().unwrap_or(StopReason::Completed)
                    };
                    let completed = stop_reason == StopReason::Completed;
                    let mut result = SubagentResult::new(vec![ContentBlock::text(reply)], stop_reason);
                    result.structured = structured;
                    if let Some(diagnostic) = script.diagnostic.as_deref().filter(|_| !completed) {
                        result = result.with_diagnostic(diagnostic);
                    }
                    Ok(result)
                };
                let run: Box<dyn SubagentRun> = Box::new(ScriptedRun {
                    id: format!("scripted-subagent:{provider}:{}", request.parent.id()).into(),
                    result: result.boxed().shared(),
                    disposed,
                });
                Ok(run)
            }
            .boxed()
        });
        Self {
            capabilities,
            inherits,
            ..Self::new(name, start)
        }
    }
}

// ---- host -----------------------------------------------------------------------------------

/// A real host: `agent_loop` runtime with its tool registry, optionally a job registry with the
/// job tools, and a subagent service.
pub struct Host {
    pub rt: Runtime,
    pub subagents: SubagentService,
    pub jobs: Option<Arc<JobRegistry>>,
    job_tools: Vec<Registration>,
    agents: Vec<AgentHandle>,
    calls: AtomicUsize,
}

impl Host {
    /// A host with a job registry (default configuration) and the job tools.
    pub fn new() -> Self {
        Self::build(Some(JobRegistry::new()))
    }

    /// A host without a job registry.
    pub fn without_jobs() -> Self {
        Self::build(None)
    }

    /// A host with `jobs` and the job tools.
    pub fn with_jobs(jobs: JobRegistry) -> Self {
        Self::build(Some(jobs))
    }

    fn build(jobs: Option<JobRegistry>) -> Self {
        let jobs = jobs.map(Arc::new);
        let mut builder = Runtime::builder();
        if let Some(jobs) = &jobs {
            builder = builder.jobs(jobs.clone() as Arc<dyn Jobs>);
        }
        let rt = builder.build();
        let job_tools = match &jobs {
            Some(jobs) => job_tools(jobs.clone())
                .into_iter()
                .map(|def| {
                    rt.services()
                        .tools
                        .register(None, def)
                        .expect("job tools register once")
                })
                .collect(),
            None => Vec::new(),
        };
        Self {
            rt,
            subagents: SubagentService::new(),
            jobs,
            job_tools,
            agents: Vec::new(),
            calls: AtomicUsize::new(0),
        }
    }

    /// The host's services.
    pub fn services(&self) -> &Services {
        self.rt.services()
    }

    /// Registers `provider`.
    pub fn provider(&self, provider: FakeProvider) -> Registration {
        self.subagents
            .register_provider(Arc::new(provider))
            .expect("provider registers")
    }

    /// Loads a tool instance configured by JSON (config defaulting).
    pub fn load_json(&self, config: Value) -> SubagentToolPlugin {
        let config = SubagentToolConfig::from_json(&config).expect("valid configuration");
        self.load(config)
    }

    /// Loads a tool instance.
    pub fn load(&self, config: SubagentToolConfig) -> SubagentToolPlugin {
        SubagentToolPlugin::load(self.services(), &self.subagents, config).expect("tool loads")
    }

    /// Creates a live parent agent.
    pub async fn parent(&mut self, id: &str) -> SessionId {
        let handle = self
            .rt
            .create(CreateAgentOptions::new(id.into()))
            .await
            .expect("parent agent is created");
        let id = handle.id().clone();
        self.agents.push(handle);
        id
    }

    /// Whether a tool named `name` is visible globally.
    pub fn has_tool(&self, name: &str) -> bool {
        self.services().tools.schemas(None).iter().any(|s| s.name == name)
    }

    /// The description of tool `name`.
    pub fn description(&self, name: &str) -> String {
        self.services()
            .tools
            .get(name, None)
            .map(|d| d.description)
            .unwrap_or_default()
    }

    /// The parameter schema of tool `name`.
    pub fn parameters(&self, name: &str) -> Value {
        self.services()
            .tools
            .get(name, None)
            .map(|d| d.parameters)
            .unwrap_or(Value::Null)
    }

    /// Calls tool `name` as `agent` with `arguments` under a fresh signal.
    pub async fn call(&self, name: &str, agent: &SessionId, arguments: Value) -> ToolResult {
        self.call_with(name, agent, arguments, Signal::new()).await
    }

    /// Calls tool `name` as `agent` with `arguments` under `signal`.
    pub async fn call_with(
        &self,
        name: &str,
        agent: &SessionId,
        arguments: Value,
        signal: Signal,
    ) -> ToolResult {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let call = ToolCallRequest {
            call_id: format!("call-{n}").into(),
            name: name.to_owned(),
            arguments: arguments.to_string(),
        };
        self.services().tools.execute(agent, call, signal).await.result
    }

    /// `job_output` with `wait: true`.
    pub async fn job_output(&self, agent: &SessionId, job: &str) -> ToolResult {
        self.call("job_output", agent, json!({"job_id": job, "wait": true}))
            .await
    }

    /// Disposes every parent, shuts the job registry and the runtime down, and checks that no
    /// lifecycle emission is left pending.
    pub async fn close(mut self) {
        for handle in self.agents.drain(..) {
            handle.dispose().await;
        }
        if let Some(jobs) = &self.jobs {
            jobs.shutdown().await;
        }
        self.job_tools.clear();
        self.rt.shutdown().await;
        tokio::time::timeout(Duration::from_secs(60), self.subagents.close())
            .await
            .expect("every run settles");
        assert_eq!(self.subagents.pending_runs(), 0, "service tasks left");
        if let Some(jobs) = &self.jobs {
            assert!(jobs.counts().is_empty(), "jobs left: {:?}", jobs.counts());
        }
        agent_loop::runtime::assert_quiescent(&self.rt);
    }
}
