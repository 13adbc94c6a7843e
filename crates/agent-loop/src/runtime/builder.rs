//! [`RuntimeBuilder`] and the weak `agents` service link.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio_util::task::TaskTracker;

use agent::prompt::Prompt;
use agent::runtime::{HookList, ModelRegistry};
use agent::{
    AgentError, AgentEvent, AgentHandle, AgentRef, AgentRuntime, CreateAgentOptions, Ctx, EventBus, Jobs,
    ResumeAgentOptions, Services, SessionId, SessionObserver, SessionPersistence, SessionStore, Signal,
    Tools,
};

use super::{Baseline, MemorySessionStore, ModelMap, Runtime, RuntimeInner, inactive};
use crate::agent::LoopConfig;
use crate::prompt::PromptRegistry;
use crate::tools::ToolRegistry;

/// The `agents` service handed to contexts: a weak link back to the runtime (so services never
/// keep the runtime alive) plus the other services, so a context can still be built after the
/// runtime is gone.
#[derive(Clone)]
struct RuntimeLink {
    runtime: Weak<RuntimeInner>,
    sessions: Arc<dyn SessionStore>,
    persistence: Option<Arc<dyn SessionPersistence>>,
    tools: Arc<dyn Tools>,
    prompt: Arc<dyn Prompt>,
    jobs: Option<Arc<dyn Jobs>>,
    models: Arc<dyn ModelRegistry>,
    agent_events: EventBus<AgentEvent>,
    pre_step: HookList<dyn agent::PreStepInterceptor>,
    turn_stopping: HookList<dyn agent::TurnStoppingHook>,
}

impl RuntimeLink {
    fn get(&self) -> Option<Runtime> {
        self.runtime.upgrade().map(|inner| Runtime { inner })
    }

    fn services(&self) -> Services {
        Services {
            agents: Arc::new(self.clone()),
            sessions: self.sessions.clone(),
            persistence: self.persistence.clone(),
            tools: self.tools.clone(),
            prompt: self.prompt.clone(),
            jobs: self.jobs.clone(),
            models: self.models.clone(),
            agent_events: self.agent_events.clone(),
            pre_step: self.pre_step.clone(),
            turn_stopping: self.turn_stopping.clone(),
        }
    }
}

#[async_trait]
impl AgentRuntime for RuntimeLink {
    fn create<'life0, 'async_trait>(
        &'life0 self,
        options: CreateAgentOptions,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<AgentHandle, AgentError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        // Written out (not `async fn`), as one box over the runtime's staged creation rather
        // than a box around the runtime's boxed `create`.
        Box::pin(async move {
            match self.get() {
                Some(rt) => {
                    let staged = rt.stage_create(options)?;
                    rt.finish(staged).await
                }
                None => Err(inactive(&options.session_id)),
            }
        })
    }

    async fn resume(&self, options: ResumeAgentOptions) -> Result<AgentHandle, AgentError> {
        match self.get() {
            Some(rt) => rt.resume(options).await,
            None => Err(inactive(&options.session_id)),
        }
    }

    fn get(&self, id: &SessionId) -> Option<AgentRef> {
        AgentRuntime::get(&self.get()?, id)
    }

    fn list(&self) -> Vec<AgentRef> {
        self.get().map(|rt| AgentRuntime::list(&rt)).unwrap_or_default()
    }

    fn ctx(&self) -> Ctx {
        Ctx::global(self.services())
    }

    fn agent_ctx(&self, id: &SessionId) -> Option<Ctx> {
        self.get()?.agent_ctx(id)
    }
}

/// Assembles a [`Runtime`] and its [`Services`].
pub struct RuntimeBuilder {
    models: Option<Arc<dyn ModelRegistry>>,
    model_map: ModelMap,
    tools: Option<Arc<dyn Tools>>,
    prompt: PromptRegistry,
    persistence: Option<Arc<dyn SessionPersistence>>,
    jobs: Option<Arc<dyn Jobs>>,
    observers: Vec<Arc<dyn SessionObserver>>,
    persona: Option<String>,
    config: LoopConfig,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("config", &self.config)
            .finish()
    }
}

impl Default for RuntimeBuilder {
    fn default() -> Self {
        Self {
            models: None,
            model_map: ModelMap::new(),
            tools: None,
            prompt: PromptRegistry::new(),
            persistence: None,
            jobs: None,
            observers: Vec::new(),
            persona: None,
            config: LoopConfig::default(),
        }
    }
}

impl RuntimeBuilder {
    /// A builder with an empty model map, a fresh [`ToolRegistry`] and [`PromptRegistry`], no
    /// persistence and no jobs.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `provider` with `adapter` (in the builder's [`ModelMap`]).
    pub fn model(self, provider: impl Into<String>, adapter: Arc<dyn agent::ModelAdapter>) -> Self {
        self.model_map.insert(provider, adapter);
        self
    }

    /// Uses a custom model registry instead of the builder's [`ModelMap`].
    pub fn models(mut self, models: Arc<dyn ModelRegistry>) -> Self {
        self.models = Some(models);
        self
    }

    /// Uses a custom tool registry instead of a fresh [`ToolRegistry`].
    pub fn tools(mut self, tools: Arc<dyn Tools>) -> Self {
        self.tools = Some(tools);
        self
    }

    /// Uses this prompt registry.
    pub fn prompt(mut self, prompt: PromptRegistry) -> Self {
        self.prompt = prompt;
        self
    }

    /// Registers the global deployment persona (section `deployment:persona`, order 0).
    pub fn persona(mut self, text: impl Into<String>) -> Self {
        self.persona = Some(text.into());
        self
    }

    /// Durable persistence for sessions (required by [`AgentRuntime::resume`]).
    pub fn persistence(mut self, persistence: Arc<dyn SessionPersistence>) -> Self {
        self.persistence = Some(persistence);
        self
    }

    /// The background job registry.
    pub fn jobs(mut self, jobs: Arc<dyn Jobs>) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// An observer installed into every session the runtime publishes (an invariant checker).
    pub fn session_observer(mut self, observer: Arc<dyn SessionObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Loop tunables.
    pub fn config(mut self, config: LoopConfig) -> Self {
        self.config = config;
        self
    }

    /// Builds the runtime.
    pub fn build(self) -> Runtime {
        let sessions = MemorySessionStore::new(self.persistence.clone());
        for observer in self.observers {
            sessions.add_observer(observer);
        }
        let (tools, tool_registry): (Arc<dyn Tools>, Option<ToolRegistry>) = match self.tools {
            Some(tools) => (tools, None),
            None => {
                let registry = ToolRegistry::new();
                (Arc::new(registry.clone()), Some(registry))
            }
        };
        let models = self.models.unwrap_or_else(|| Arc::new(self.model_map.clone()));
        let mut guards = Vec::new();
        if let Some(persona) = self.persona {
            guards.push(self.prompt.section(
                None,
                agent::prompt::PromptSection {
                    name: agent::prompt::PERSONA_SECTION.to_owned(),
                    order: 0,
                    text: persona,
                    tool: None,
                },
            ));
        }
        let prompt = self.prompt;
        prompt.link_tools(&tools);
        let persistence = self.persistence;
        let jobs = self.jobs;
        let config = self.config;
        let inner = Arc::new_cyclic(|weak: &Weak<RuntimeInner>| RuntimeInner {
            services: RuntimeLink {
                runtime: weak.clone(),
                sessions: Arc::new(sessions.clone()),
                persistence,
                tools,
                prompt: Arc::new(prompt.clone()),
                jobs,
                models,
                agent_events: EventBus::new(),
                pre_step: HookList::default(),
                turn_stopping: HookList::default(),
            }
            .services()
            .into(),
            sessions,
            prompt,
            tool_registry,
            config,
            registry: Mutex::new(Default::default()),
            reserved: Mutex::new(Default::default()),
            agent_lifecycle: parking_lot::ReentrantMutex::new(()),
            shutdown: Signal::new(),
            tasks: TaskTracker::new(),
            tokio: std::sync::OnceLock::new(),
            held: Mutex::new(guards),
            baseline: Mutex::new(Baseline::default()),
        });
        let runtime = Runtime { inner };
        // Session-log capture for `cargo xtask check-invariants` (no-op unless the variable is set).
        if let Some(guard) = crate::trace::install_from_env(runtime.sessions()) {
            runtime.hold(guard);
        }
        runtime.rebaseline();
        runtime
    }
}
