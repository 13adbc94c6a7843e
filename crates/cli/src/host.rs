//! The host composition: one [`Host`] is the reference runtime (`agent-loop`) with durable
//! JSON-lines sessions, a background job registry and its `job_*` tools, the subagent service
//! with the in-process `spawn` and `fork` providers and its continuation manager, one delegation
//! tool per provider (`subagent` → `spawn`, `fork` → `fork`), optionally the read-only
//! workspace tools and, optionally, a per-turn step limit for every agent ([`StepLimit`]).
//!
//! ```text
//!   Runtime ── Services { agents, sessions, persistence: JsonlStore, tools, prompt, jobs, models }
//!      │
//!   SubagentService ── SpawnProvider ("spawn") ── tool "subagent"
//!                   ├─ ForkProvider  ("fork")  ── tool "fork"
//!                   └─ AcpProvider   ("acp")   ── tool "acp"   (optional: an ACP agent subprocess)
//!   ContinuationManager ── continuable children of both tools  (background mode, optional)
//!                       ├─ send_message / interrupt_agent / list_agents  (with it)
//!                       └─ report, in each continuable child's own scope  (with it)
//!   JobRegistry ── job_output / job_list / job_kill     (+ completion notices, optional)
//!   Workspace   ── read_file / list_dir / grep          (optional, read-only)
//!   StepLimit   ── global agent/pre-step interceptor     (optional, every agent)
//! ```
//!
//! [`build_host`] composes it; [`Host::create_agent`] creates a top-level agent on the
//! configured model; [`Host::run_turn`] delivers one prompt and waits until the agent (and, with
//! job notices on, every background job it started; with continuable children on, every child
//! it started) has settled; [`Host::shutdown`] tears it all down in order and makes every
//! session log durable. Tests drive the same host in-process.
//!
//! # Ownership
//! The host owns every registration it made (providers, tool mounts, job tools, workspace tools,
//! prompt sections, the notice listener). [`Host::shutdown`] drops them after disposing every
//! agent; dropping a host without shutting it down leaves live agents to their handles and logs
//! the job registry's warning.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agent::projection::ProjectionRegistry;
use agent::{
    Agent, AgentError, AgentHandle, AgentOptions, AgentRef, AgentRuntime, AgentStatus, BoxError,
    CreateAgentOptions, Message, ModelAdapter, PreStep, PreStepDecision, PreStepInterceptor, Registration,
    SessionId, SessionMeta, SessionObserver, SessionPersistence,
};
use agent_loop::JsonlStore;
use agent_loop::jobs::{JobRegistry, JobToolsConfig, job_guidance_section, job_tools_with};
use agent_loop::runtime::Runtime;
use parking_lot::Mutex;
use subagent::continuation::ContinuationManager;
use subagent::listing::ListingServices;
use subagent::projection::register_projections;
use subagent::service::SubagentService;
use subagent_fork::ForkProvider;
use subagent_inprocess::InProcessDriver;
use subagent_spawn::SpawnProvider;
use tool_subagent::{BackgroundMode, MaxDepth, SubagentToolConfig, SubagentToolPlugin};
use tool_subagent_control::{ListAgentsPlugin, SubagentControlPlugin};
use tool_subagent_report::{ReportToolConfig, ReportToolPlugin};

use crate::workspace::{Workspace, workspace_tools};

/// The tool name the `spawn` provider is mounted under.
pub const SPAWN_TOOL: &str = "subagent";
/// The tool name the `fork` provider is mounted under.
pub const FORK_TOOL: &str = "fork";
/// The tool name an ACP provider ([`HostOptions::acp`]) is mounted under.
pub const ACP_TOOL: &str = "acp";
/// The delegation depth cap every delegation tool sends (the tool's config default).
pub const DEFAULT_MAX_DEPTH: u64 = tool_subagent::DEFAULT_MAX_DEPTH;

/// What to compose.
#[derive(Clone)]
pub struct HostOptions {
    /// The session store directory (created with the first session).
    pub store_dir: PathBuf,
    /// The model adapter every agent uses.
    pub adapter: Arc<dyn ModelAdapter>,
    /// The provider route agents send their requests to (the adapter is registered under it).
    pub model_provider: String,
    /// The model name agents ask for.
    pub model_name: String,
    /// Optional output-token cap for every agent.
    pub max_tokens: Option<u64>,
    /// The deployment persona (system text), if any.
    pub persona: Option<String>,
    /// Mount the read-only workspace tools over this workspace.
    pub workspace: Option<Workspace>,
    /// The working directory recorded in session headers (absolute); default: the workspace
    /// root, else the process's current directory.
    pub cwd: Option<PathBuf>,
    /// Deliver background-job completion notices into their owner's conversation (inject into
    /// a running owner's next step, a follow-up turn for an idle one). Off in the scripted demo,
    /// which collects its job with `job_output`.
    pub deliver_job_notices: bool,
    /// The delegation depth cap of both delegation tools.
    pub max_depth: u64,
    /// How long `job_output {wait: true}` waits.
    pub job_wait_timeout: Duration,
    /// Observers installed into every session the runtime publishes (an online invariant
    /// checker, a trace writer).
    pub session_observers: Vec<Arc<dyn SessionObserver>>,
    /// The subagent service to register the providers with; a fresh one when `None`. Passing
    /// one lets a caller subscribe to its events (provider registration included) first.
    pub subagents: Option<SubagentService>,
    /// The most model steps one turn of any agent may take — the coordinator and every child,
    /// foreground or background, `spawn` or `fork` — enforced by [`StepLimit`]; `None` (the
    /// default) for no limit. A turn that would take one more step ends with an error naming
    /// the limit instead of calling the model again; a child's run then ends with stop reason
    /// `error`, which its parent sees as a failed delegation.
    pub max_steps_per_turn: Option<u32>,
    /// Background delegations start **continuable** children (`backgroundMode: continuable` on
    /// both delegation tools) instead of one-shot background jobs: each child is a durable
    /// session the host's [`ContinuationManager`] keeps resident while it works, releases when
    /// it settles (announcing its settlement into the parent's conversation, which wakes the
    /// parent), and can cold-resume later. The coordinator also gets the control tools
    /// `send_message`, `interrupt_agent` and `list_agents`, and every continuable child the
    /// `report` tool (delivered to its parent's next step). Off by default.
    pub continuable: bool,
    /// Also delegate to an external agent over the Agent Client Protocol: the `acp` provider
    /// (crate `subagent-acp`) loaded from this configuration and mounted as the tool
    /// [`ACP_TOOL`]. Every delegation spawns a fresh subprocess running one prompt turn; with
    /// `cwd` omitted the child runs in, and is announced, the delegating session's working
    /// directory. The tool sends no depth cap (the child manages its own recursion) and its
    /// background delegations stay one-shot jobs even with [`continuable`](Self::continuable)
    /// on, since an ACP child cannot be continued. A configuration that does not load fails
    /// [`build_host`] before anything is composed. `None` (the default) mounts nothing.
    pub acp: Option<subagent_acp::AcpConfig>,
}

impl std::fmt::Debug for HostOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostOptions")
            .field("store_dir", &self.store_dir)
            .field("model_provider", &self.model_provider)
            .field("model_name", &self.model_name)
            .field("workspace", &self.workspace)
            .field("deliver_job_notices", &self.deliver_job_notices)
            .field("max_depth", &self.max_depth)
            .field("max_steps_per_turn", &self.max_steps_per_turn)
            .field("continuable", &self.continuable)
            .field("acp", &self.acp)
            .finish_non_exhaustive()
    }
}

impl HostOptions {
    /// Options for `adapter` served as `model_provider`/`model_name`, storing sessions in
    /// `store_dir`, with every other setting at its default (no persona, no workspace tools, no
    /// job notices, depth cap [`DEFAULT_MAX_DEPTH`], job waits of 30 s, no step limit, one-shot
    /// background delegations).
    pub fn new(
        store_dir: impl Into<PathBuf>,
        adapter: Arc<dyn ModelAdapter>,
        model_provider: impl Into<String>,
        model_name: impl Into<String>,
    ) -> Self {
        Self {
            store_dir: store_dir.into(),
            adapter,
            model_provider: model_provider.into(),
            model_name: model_name.into(),
            max_tokens: None,
            persona: None,
            workspace: None,
            cwd: None,
            deliver_job_notices: false,
            max_depth: DEFAULT_MAX_DEPTH,
            job_wait_timeout: agent_loop::jobs::DEFAULT_WAIT_TIMEOUT,
            session_observers: Vec::new(),
            subagents: None,
            max_steps_per_turn: None,
            continuable: false,
            acp: None,
        }
    }
}

/// The error code of a turn ended by [`StepLimit`].
pub const STEP_LIMIT: &str = "STEP_LIMIT";

/// A global `agent/pre-step` interceptor that ends a turn about to open step `limit + 1` with an
/// error (code [`STEP_LIMIT`], message
/// [`model_text::step_limit_reached`](crate::model_text::step_limit_reached)), so no
/// agent calls the model more than `limit` times in one turn.
///
/// It fails the turn (`Err`) rather than rejecting the step: a rejected step closes the turn
/// `blocked`, which a delegation reports to its parent as "subagent declined the task", while an
/// error reads as a failed run to the parent and as `the coordinator's turn failed: step limit
/// reached …` to the user. It is stateless (the driver numbers steps per turn, from 1), so one
/// registration serves every agent the runtime creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLimit {
    limit: u32,
}

impl StepLimit {
    /// A limit of `limit` steps per turn (at least 1; 0 is read as 1).
    pub fn new(limit: u32) -> Self {
        Self { limit: limit.max(1) }
    }

    /// The limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }
}

#[async_trait::async_trait]
impl PreStepInterceptor for StepLimit {
    async fn pre_step(
        &self,
        step: PreStep<'_>,
        proposed: PreStepDecision,
    ) -> Result<PreStepDecision, BoxError> {
        if step.step > u64::from(self.limit) {
            let text = crate::model_text::step_limit_reached(self.limit);
            return Err(Box::new(agent::LlmFailure::new(STEP_LIMIT, text)));
        }
        Ok(proposed)
    }
}

/// Reads an ACP provider configuration ([`HostOptions::acp`]) from a JSON file with the spec's
/// key names, e.g. `{"command": "my-acp-agent", "args": ["--stdio"], "permission": "reject"}`.
/// Unknown keys are refused, so a misspelt key is never silently ignored; anything but a JSON
/// object is refused as such. The parsed configuration is then validated with the provider's own
/// load-time check ([`subagent_acp::AcpConfig::load`]: graces, `cwd`, a `command`, `args` and
/// `env` a process can be given), so every error — reading, parsing or validating — names the
/// file ([`build_host`] loads it again when composing). Only a regular file of at most
/// [`MAX_ACP_CONFIG_BYTES`] is read: a FIFO would block the program, a device (`/dev/zero`) or
/// a huge file exhaust its memory, so both are refused with the reason.
pub fn read_acp_config(path: &Path) -> Result<subagent_acp::AcpConfig, crate::CliError> {
    use std::io::Read as _;
    let failed = |reason: String| crate::CliError::AcpConfig {
        path: path.to_owned(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| failed(e.to_string()))?;
    if !meta.is_file() {
        return Err(failed("not a regular file".to_owned()));
    }
    let file = std::fs::File::open(path).map_err(|e| failed(e.to_string()))?;
    let mut text = String::new();
    file.take(MAX_ACP_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| failed(e.to_string()))?;
    if text.len() as u64 > MAX_ACP_CONFIG_BYTES {
        return Err(failed(format!(
            "larger than {MAX_ACP_CONFIG_BYTES} bytes; an ACP configuration is a few lines"
        )));
    }
    // Syntax first (with its line and column), then the shape. serde would take an array of
    // the fields' values, in order, as a configuration, and its complaint about any other
    // non-object ("invalid length 0, expected struct AcpConfig with N elements") does not tell
    // the user what a configuration looks like.
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| failed(e.to_string()))?;
    if !value.is_object() {
        return Err(failed(
            r#"must be a JSON object, e.g. {"command": "my-acp-agent"}"#.to_owned(),
        ));
    }
    let config: subagent_acp::AcpConfig = serde_json::from_str(&text).map_err(|e| failed(e.to_string()))?;
    config.load().map_err(|e| failed(e.to_string()))?;
    Ok(config)
}

/// The largest ACP configuration file [`read_acp_config`] reads: 1 MiB.
pub const MAX_ACP_CONFIG_BYTES: u64 = 1 << 20;

/// Why the host could not be composed or driven.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// A registration (provider, tool, tool mount) was refused.
    #[error("cannot register {what}: {reason}")]
    Register {
        /// What was being registered.
        what: String,
        /// Why.
        reason: String,
    },
    /// An agent could not be created or driven.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// Making session logs durable failed.
    #[error("cannot persist session logs in {}: {reason}", dir.display())]
    Persist {
        /// The store directory.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// The working directory could not be determined.
    #[error("cannot determine the working directory: {0}")]
    Cwd(std::io::Error),
}

/// Creates the store directory if it is missing, so that a path that cannot hold session logs
/// (a file in its place, a parent that is not a directory, no permission) fails the host before
/// any agent exists or any model is paid, instead of at the first flush after the run.
fn ensure_store_dir(dir: &std::path::Path) -> Result<(), HostError> {
    let failed = |reason: String| HostError::Persist {
        dir: dir.to_owned(),
        reason,
    };
    match std::fs::create_dir_all(dir) {
        Ok(()) if dir.is_dir() => Ok(()),
        Ok(()) => Err(failed("it is not a directory".to_owned())),
        Err(e) if dir.exists() && !dir.is_dir() => Err(failed(format!("it is not a directory ({e})"))),
        Err(e) => Err(failed(e.to_string())),
    }
}

fn register_err(what: &str, e: impl std::fmt::Display) -> HostError {
    HostError::Register {
        what: what.to_owned(),
        reason: e.to_string(),
    }
}

/// The tools of continuable delegation beyond the delegation tools themselves.
struct ControlTools {
    control: SubagentControlPlugin,
    list: ListAgentsPlugin,
    report: ReportToolPlugin,
}

/// The ids of the sessions a host's runtime published, in publication order, each once.
#[derive(Debug, Default)]
struct OwnSessions {
    order: Vec<SessionId>,
    seen: HashSet<SessionId>,
}

impl OwnSessions {
    fn insert(&mut self, id: &SessionId) {
        if self.seen.insert(id.clone()) {
            self.order.push(id.clone());
        }
    }
}

/// Signals a change for [`Host::settle`].
fn bump(changes: &tokio::sync::watch::Sender<u64>) {
    changes.send_modify(|v| *v = v.wrapping_add(1));
}

/// A composed host (see the module docs).
pub struct Host {
    runtime: Runtime,
    subagents: SubagentService,
    jobs: Arc<JobRegistry>,
    store: Arc<JsonlStore>,
    driver: InProcessDriver,
    /// Owns every continuable child (drained at shutdown, before the runtime).
    continuation: ContinuationManager,
    options: HostOptions,
    cwd: PathBuf,
    /// Job ids whose completion notice was delivered into their owner's conversation.
    delivered: Arc<Mutex<HashSet<String>>>,
    /// Bumped by the host's listeners on the runtime's agent events (every agent's status,
    /// inbox, creation and disposal) and after each delivered job notice: with the job
    /// registry's and the continuation manager's change counters, what [`Host::settle`] waits on.
    changes: Arc<tokio::sync::watch::Sender<u64>>,
    /// Every session this host's runtime published (created, forked or resumed), in order:
    /// the logs [`Host::shutdown`] makes durable.
    sessions: Arc<Mutex<OwnSessions>>,
    /// Loaded delegation tools (unloaded first at shutdown).
    plugins: Vec<SubagentToolPlugin>,
    /// The control tools and the report tool's setup contribution, with continuable children
    /// on (unloaded with the delegation tools).
    control: Option<ControlTools>,
    /// Every other registration, dropped at shutdown.
    guards: Vec<Registration>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("runtime", &self.runtime)
            .field("subagents", &self.subagents)
            .field("store", &self.store.dir())
            .finish_non_exhaustive()
    }
}

/// Composes a host (see the module docs). Must be called inside a tokio runtime.
pub fn build_host(options: HostOptions) -> Result<Host, HostError> {
    let cwd = match (&options.cwd, &options.workspace) {
        (Some(cwd), _) => cwd.clone(),
        (None, Some(ws)) => ws.root().to_owned(),
        (None, None) => std::env::current_dir().map_err(HostError::Cwd)?,
    };
    // A misconfigured ACP provider fails before anything is composed.
    let acp = match &options.acp {
        Some(config) => {
            Some(subagent_acp::AcpProvider::load(config).map_err(|e| register_err("provider acp", e))?)
        }
        None => None,
    };
    ensure_store_dir(&options.store_dir)?;
    let store = Arc::new(JsonlStore::new(&options.store_dir));
    let jobs = Arc::new(JobRegistry::new());
    let mut builder = Runtime::builder()
        .model(options.model_provider.clone(), options.adapter.clone())
        .persistence(store.clone())
        .jobs(jobs.clone());
    if let Some(persona) = &options.persona {
        builder = builder.persona(persona.clone());
    }
    for observer in &options.session_observers {
        builder = builder.session_observer(observer.clone());
    }
    let runtime = builder.build();
    let services = runtime.services().clone();
    let mut guards: Vec<Registration> = Vec::new();

    // The sessions this host publishes — and so writes — before any exists: shutdown flushes
    // these and no other log of the (possibly shared) store directory.
    let sessions: Arc<Mutex<OwnSessions>> = Arc::default();
    {
        let sessions = sessions.clone();
        guards.push(runtime.sessions().events().on(move |event| {
            if let agent_loop::runtime::SessionStoreEvent::Created(session) = event {
                sessions.lock().insert(session.id());
            }
            Ok(())
        }));
    }

    // The step limit: registered first and globally, so it decides before any agent-scoped
    // interceptor (a child's descriptor append) and reaches every agent, children included.
    if let Some(limit) = options.max_steps_per_turn {
        guards.push(services.pre_step.add(None, Arc::new(StepLimit::new(limit))));
    }

    // Background jobs: the model-facing tools and their guidance.
    for tool in job_tools_with(
        jobs.clone(),
        JobToolsConfig {
            wait_timeout: options.job_wait_timeout,
        },
    ) {
        let name = tool.name.clone();
        guards.push(
            services
                .tools
                .register(None, tool)
                .map_err(|e| register_err(&name, e))?,
        );
    }
    guards.push(services.prompt.section(None, job_guidance_section()));

    // Read-only workspace tools.
    if let Some(workspace) = &options.workspace {
        for tool in workspace_tools(workspace) {
            let name = tool.name.clone();
            guards.push(
                services
                    .tools
                    .register(None, tool)
                    .map_err(|e| register_err(&name, e))?,
            );
        }
    }

    // The seam: one service, two in-process providers over one driver.
    let subagents = options.subagents.clone().unwrap_or_default();
    let driver = InProcessDriver::new(services.clone());
    guards.push(
        subagents
            .register_provider(Arc::new(SpawnProvider::new(driver.clone())))
            .map_err(|e| register_err("provider spawn", e))?,
    );
    guards.push(
        subagents
            .register_provider(Arc::new(ForkProvider::new(driver.clone())))
            .map_err(|e| register_err("provider fork", e))?,
    );

    // One delegation tool per provider; their continuable route goes through one manager.
    let continuation = ContinuationManager::new(subagents.clone(), services.clone());
    let mut plugins = Vec::new();
    for (provider, tool) in [
        (subagent_spawn::DEFAULT_NAME, SPAWN_TOOL),
        (subagent_fork::DEFAULT_NAME, FORK_TOOL),
    ] {
        let mut config = SubagentToolConfig::new(provider);
        config.tool_name = tool.to_owned();
        config.max_depth = Some(MaxDepth::Cap(options.max_depth));
        if options.continuable {
            config.background_mode = BackgroundMode::Continuable;
        }
        let plugin =
            SubagentToolPlugin::load_with_continuation(&services, &subagents, continuation.clone(), config)
                .map_err(|e| register_err(&format!("tool {tool}"), e))?;
        plugins.push(plugin);
    }

    // The optional out-of-process provider, loaded (so validated) above.
    if let Some(acp) = acp {
        let name = acp.settings().provider_name.clone();
        guards.push(
            subagent_acp::register_provider(&subagents, acp).map_err(|e| register_err("provider acp", e))?,
        );
        let mut config = SubagentToolConfig::new(name);
        config.tool_name = ACP_TOOL.to_owned();
        config.max_depth = Some(MaxDepth::ProviderManaged);
        let plugin = SubagentToolPlugin::load(&services, &subagents, config)
            .map_err(|e| register_err(&format!("tool {ACP_TOOL}"), e))?;
        plugins.push(plugin);
    }

    // The control tools over the same manager, and a child listing over the live registry and
    // the durable store.
    let control = if options.continuable {
        let projections = ProjectionRegistry::new();
        guards.push(register_projections(&projections).map_err(|e| register_err("projections", e))?);
        let listing = ListingServices {
            projections: Some(projections),
            store: Some(services.sessions.clone()),
            persistence: Some(store.clone() as Arc<dyn SessionPersistence>),
            cache: None,
        };
        let control = SubagentControlPlugin::load(&services, continuation.clone())
            .map_err(|e| register_err("the control tools", e))?;
        let list = ListAgentsPlugin::load(&services, Arc::new(listing))
            .map_err(|e| register_err("tool list_agents", e))?;
        let report = ReportToolPlugin::load(&continuation, ReportToolConfig::default())
            .map_err(|e| register_err("tool report", e))?;
        Some(ControlTools {
            control,
            list,
            report,
        })
    } else {
        None
    };

    // What `settle` waits on besides the registry's and the manager's own change counters:
    // every agent's status, inbox, creation and disposal.
    let changes = Arc::new(tokio::sync::watch::Sender::new(0u64));
    {
        let changes = changes.clone();
        guards.push(services.agent_events.on(move |_| {
            bump(&changes);
            Ok(())
        }));
    }

    // Completion notices into the owner's conversation.
    let delivered: Arc<Mutex<HashSet<String>>> = Arc::default();
    if options.deliver_job_notices {
        let agents = services.agents.clone();
        let seen = delivered.clone();
        let changes = changes.clone();
        guards.push(jobs.notices().on(move |notice| {
            if let Some(owner) = agents.get(&notice.owner) {
                let message = notice.to_message();
                let sent = match owner.status() {
                    AgentStatus::Running => owner.inject(message),
                    AgentStatus::Idle => owner.followup(message),
                };
                if let Err(e) = sent {
                    tracing::warn!(job = %notice.job.id, error = %e, "delivering a job notice failed");
                }
            }
            seen.lock().insert(notice.job.id.0.clone());
            bump(&changes);
            Ok(())
        }));
    }

    Ok(Host {
        runtime,
        subagents,
        jobs,
        store,
        driver,
        continuation,
        options,
        cwd,
        delivered,
        changes,
        sessions,
        plugins,
        control,
        guards,
    })
}

impl Host {
    /// The agent runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The subagent service (providers, lifecycle events).
    pub fn subagents(&self) -> &SubagentService {
        &self.subagents
    }

    /// The continuation manager that owns every continuable child (see
    /// [`HostOptions::continuable`]); also usable directly, e.g. to send a child a follow-up.
    pub fn continuation(&self) -> &ContinuationManager {
        &self.continuation
    }

    /// The background job registry.
    pub fn jobs(&self) -> &Arc<JobRegistry> {
        &self.jobs
    }

    /// The durable session store.
    pub fn store(&self) -> &Arc<JsonlStore> {
        &self.store
    }

    /// The store directory.
    pub fn store_dir(&self) -> &Path {
        &self.options.store_dir
    }

    /// The working directory recorded in session headers.
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    /// The names of the delegation tools, with their providers.
    pub fn delegation_tools(&self) -> Vec<(String, String)> {
        self.plugins
            .iter()
            .map(|p| (p.tool_name().to_owned(), p.config().provider.clone()))
            .collect()
    }

    /// Creates a top-level agent `id` on the configured model.
    pub async fn create_agent(&self, id: SessionId) -> Result<AgentHandle, HostError> {
        let mut create = CreateAgentOptions::new(id);
        create.meta = SessionMeta {
            cwd: Some(self.cwd.clone()),
            ..SessionMeta::default()
        };
        create.agent_options = self.agent_options();
        Ok(self.runtime.create(create).await?)
    }

    /// Cold-resumes the stored top-level agent `id` from its session log on the configured
    /// model (its header, and so its recorded working directory, are the stored ones). Fails
    /// with [`AgentError::NotFound`] when the store has no such session.
    pub async fn resume_agent(&self, id: SessionId) -> Result<AgentHandle, HostError> {
        let resume = agent::ResumeAgentOptions {
            session_id: id,
            agent_options: self.agent_options(),
            signal: None,
            setup: None,
            owner: None,
        };
        Ok(self.runtime.resume(resume).await?)
    }

    /// The options every top-level agent of this host runs with.
    fn agent_options(&self) -> AgentOptions {
        AgentOptions {
            provider: Some(self.options.model_provider.as_str().into()),
            model: Some(self.options.model_name.as_str().into()),
            max_tokens: self.options.max_tokens,
            ..AgentOptions::default()
        }
    }

    /// Delivers `prompt` to `agent` as a new turn and waits until it has settled: the agent is
    /// idle and — when job notices are delivered — none of its background jobs is still running
    /// or has a notice that could still start another turn.
    pub async fn run_turn(&self, agent: &AgentRef, prompt: impl Into<String>) -> Result<(), HostError> {
        agent.followup(Message::user_text(prompt))?;
        self.settle(agent).await;
        Ok(())
    }

    /// Waits until `agent` is idle, (with job notices on) has no unsettled or undelivered
    /// background job, and has no resident continuable descendant that can still make progress:
    /// a continuable child announces its settlement into its parent's conversation before it is
    /// released, so by then the parent has the notice and its turn for it is under way or done.
    ///
    /// A resident descendant that cannot move without new input is not waited for (see
    /// [`ContinuationManager::awaits_input`]): one left idle with a message parked by an
    /// interrupt (spec §2.14.9), or waiting only on such children. It announces nothing until a
    /// waking send, which nobody is left to make once `agent` is idle; [`Host::shutdown`]
    /// releases it.
    ///
    /// Event-driven: between checks it waits for a change signalled by the job registry
    /// ([`JobRegistry::changes`]), the continuation manager ([`ContinuationManager::changes`])
    /// or the host's own listeners (agent events, delivered job notices) — each taken before the
    /// check it may invalidate, so no change is missed — never for a timer. Cancel-safe: dropping
    /// the future leaves nothing registered.
    pub async fn settle(&self, agent: &AgentRef) {
        let mut jobs = self.jobs.changes();
        let mut tree = self.continuation.changes();
        let mut host = self.changes.subscribe();
        loop {
            agent.when_idle().await;
            // Marked seen before the checks: a change after this point wakes the wait below.
            jobs.borrow_and_update();
            tree.borrow_and_update();
            host.borrow_and_update();
            let jobs_quiet = !self.options.deliver_job_notices || self.jobs_quiet(agent.id());
            if jobs_quiet && !self.has_progressing_descendant(agent.id()) {
                if agent.status() == AgentStatus::Idle {
                    return;
                }
                continue;
            }
            // The senders live as long as `self`: none of these fails while it is borrowed.
            tokio::select! {
                _ = jobs.changed() => {}
                _ = tree.changed() => {}
                _ = host.changed() => {}
            }
        }
    }

    /// Whether a resident continuable child that has `ancestor` in its live lineage (followed
    /// through the live agents' headers) can still make progress — run, settle, announce — on
    /// its own, or a settled one's notice is still on its way to `ancestor` or one of its
    /// descendants.
    fn has_progressing_descendant(&self, ancestor: &SessionId) -> bool {
        let in_tree = |id: &SessionId| id == ancestor || self.descends_from(id, ancestor);
        self.continuation
            .resident()
            .iter()
            .any(|child| self.descends_from(child, ancestor) && !self.continuation.awaits_input(child))
            // A settled child's notice still on its way to a parent in the tree: it will wake
            // that parent (read after the resident children — the manager marks the notice
            // before the child leaves the live map).
            || self.continuation.notices_under_way().iter().any(in_tree)
    }

    /// Whether the live agent `child` has `ancestor` in its live lineage.
    fn descends_from(&self, child: &SessionId, ancestor: &SessionId) -> bool {
        let mut next = self.runtime.get(child);
        // Bounded: a lineage is a chain of live agents, each at a greater depth.
        for _ in 0..=self.runtime.list().len() {
            let Some(agent) = next else { return false };
            match agent.session().header().parent_session.clone() {
                Some(parent) if &parent == ancestor => return true,
                Some(parent) => next = self.runtime.get(&parent),
                None => return false,
            }
        }
        false
    }

    /// Whether every job of `owner` has settled and was either reported or had its notice
    /// delivered.
    fn jobs_quiet(&self, owner: &SessionId) -> bool {
        let delivered = self.delivered.lock();
        self.jobs
            .snapshots(owner)
            .iter()
            .all(|j| j.status.is_terminal() && (j.reported || delivered.contains(&j.id.0)))
    }

    /// The text of `agent`'s last assistant message with visible text.
    pub fn last_answer(agent: &dyn Agent) -> Option<String> {
        agent.session().events().iter().rev().find_map(|e| match &e.data {
            agent::EventData::AssistantMessage { message, .. } if !message.text().is_empty() => {
                Some(message.text())
            }
            _ => None,
        })
    }

    /// Tears the host down: unloads the delegation tools (waiting for foreground runs), drains
    /// the continuable children, shuts the runtime down (disposing every agent, its children and its jobs), shuts the job
    /// registry down, waits for pending lifecycle events and result tasks, drops every
    /// registration, then flushes the log of every session this host published (created,
    /// forked or resumed) to stable storage — only those: other logs in the store directory
    /// (another process's, or files this store cannot even name) are none of its business.
    /// Every log is attempted; the failures are reported together.
    pub async fn shutdown(self) -> Result<(), HostError> {
        let Host {
            runtime,
            subagents,
            jobs,
            store,
            driver,
            continuation,
            options,
            plugins,
            control,
            guards,
            sessions,
            ..
        } = self;
        for plugin in &plugins {
            plugin.unload();
        }
        if let Some(ControlTools {
            control,
            list,
            report,
        }) = control
        {
            list.unload();
            if let Err(e) = report.unload() {
                tracing::warn!(error = %e, "unloading the report tool failed");
            }
            control.shutdown().await;
        }
        // Continuable children first: the manager owns them, and draining it delivers their
        // settlement notices while their parents are still live.
        if let Err(e) = continuation.dispose_all().await {
            tracing::warn!(error = %e, "draining the continuable children failed");
        }
        runtime.shutdown().await;
        for plugin in plugins {
            plugin.shutdown().await;
        }
        jobs.shutdown().await;
        subagents.close().await;
        driver.wait().await;
        drop(guards);
        let own = std::mem::take(&mut sessions.lock().order);
        let mut failures = Vec::new();
        for id in own {
            match store.flush(&id).await {
                Ok(()) => {}
                // A session announced but rolled back before its durable commit left nothing
                // in the store: there is nothing to flush.
                Err(agent_loop::StoreError::NotFound(_)) => {}
                Err(e) => failures.push(format!("session {id}: {e}")),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(HostError::Persist {
                dir: options.store_dir.clone(),
                reason: failures.join("; "),
            })
        }
    }
}
