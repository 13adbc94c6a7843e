//! The continuable background route (`acp-and-tools.md` §3.9) end to end: the delegation tool
//! loaded with the seam's `ContinuationManager` over a real host — the reference runtime with a
//! scripted model and an in-memory persistence backend, the real `spawn` provider, a real job
//! registry (which must stay empty), and the online invariant checker.
//!
//! Interleavings are controlled, never timed: a gated provider holds continuable preparations
//! until the test opens its gate, and the clock is paused (waits below are virtual).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::content::visible_text;
use agent::store::LoadedSession;
use agent::tools::{ToolCallRequest, ToolResult, codes};
use agent::{
    AgentHandle, AgentRef, AgentRuntime, CancelCause, EventData, Registration, SessionId, SessionPersistence,
    SessionStore, Signal,
};
use agent_loop::jobs::{JobRegistry, job_tools};
use agent_loop::model::{ScriptEntry, chunks};
use agent_loop::runtime::{Runtime, assert_quiescent};
use agent_loop::{MemoryStore, ScriptedModel};
use async_trait::async_trait;
use invariants::InvariantObserver;
use serde_json::{Value, json};
use subagent::continuation::ContinuationManager;
use subagent::descriptor::{DescriptorState, SubagentDescriptor, fold_subagent_descriptor};
use subagent::provider::{PrepareContinuable, ResolvedSubagentStartRequest, SubagentProvider};
use subagent::run::SubagentRun;
use subagent::service::SubagentService;
use subagent::{
    ContinuableCreateRequest, ContinuableCreateSpec, SubagentCapabilities, SubagentError, SubagentErrorCode,
};
use subagent_inprocess::InProcessDriver;
use tokio::sync::watch;
use tool_subagent::{SubagentToolConfig, SubagentToolPlugin, model_text};

/// The model route every agent of the rig uses.
const MODEL: &str = "mock";
/// The parent's id.
const PARENT: &str = "parent";
/// The name of the gated provider.
const GATED: &str = "gated";

// ---- the gated provider -------------------------------------------------------------------

/// A continuable provider whose preparations wait for a gate. Each preparation counts its
/// arrival, then returns no seed (the `spawn` shape) once the gate is open, or rejects
/// `CANCELLED` as soon as its own request's token is cancelled — each preparation follows only
/// its own token. Its one-shot `start` is never used here.
struct GatedProvider {
    gate: watch::Receiver<bool>,
    arrived: watch::Sender<usize>,
    cancelled: AtomicUsize,
    /// The cancellation causes the cancelled preparations saw.
    causes: std::sync::Mutex<Vec<Option<CancelCause>>>,
}

#[async_trait]
impl SubagentProvider for GatedProvider {
    fn name(&self) -> &str {
        GATED
    }

    fn capabilities(&self) -> SubagentCapabilities {
        SubagentCapabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        false
    }

    async fn start(
        &self,
        _request: ResolvedSubagentStartRequest,
    ) -> Result<Box<dyn SubagentRun>, SubagentError> {
        Err(SubagentError::new(
            SubagentErrorCode::ProviderFailed,
            "the gated provider serves continuable children only",
        ))
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        Some(self)
    }
}

#[async_trait]
impl PrepareContinuable for GatedProvider {
    async fn prepare_continuable(
        &self,
        request: ContinuableCreateRequest,
    ) -> Result<ContinuableCreateSpec, SubagentError> {
        self.arrived.send_modify(|n| *n += 1);
        let mut gate = self.gate.clone();
        tokio::select! {
            opened = gate.wait_for(|open| *open) => {
                opened.map(|_| ContinuableCreateSpec::default()).map_err(|e| {
                    SubagentError::new(SubagentErrorCode::ProviderFailed, e.to_string())
                })
            }
            () = request.signal.cancelled() => {
                self.cancelled.fetch_add(1, Ordering::SeqCst);
                self.causes.lock().expect("causes").push(request.signal.cause());
                Err(SubagentError::new(SubagentErrorCode::Cancelled, "preparation cancelled"))
            }
        }
    }
}

// ---- the rig ------------------------------------------------------------------------------

/// How a rig is built.
#[derive(Clone, Copy)]
struct Setup {
    /// Whether the runtime has a persistence backend.
    persistence: bool,
    /// Whether the tool is loaded with the continuation manager.
    manager: bool,
}

impl Setup {
    const FULL: Self = Self {
        persistence: true,
        manager: true,
    };
}

/// A real host with one delegation tool instance, the `spawn` and gated providers, a
/// continuation manager and one parent agent.
struct Rig {
    rt: Runtime,
    model: ScriptedModel,
    store: Arc<MemoryStore>,
    observer: Arc<InvariantObserver>,
    subagents: SubagentService,
    driver: InProcessDriver,
    jobs: Arc<JobRegistry>,
    manager: ContinuationManager,
    gated: Arc<GatedProvider>,
    gate: watch::Sender<bool>,
    arrived: watch::Receiver<usize>,
    plugin: Option<SubagentToolPlugin>,
    registrations: Vec<Registration>,
    parent: Option<AgentHandle>,
}

/// A model answer naming the session it answers: `<session id> reply`.
fn by_session() -> ScriptEntry {
    ScriptEntry::respond(|request| {
        let who = request.session_id.as_ref().map_or("?", |s| s.as_str()).to_owned();
        chunks::text(format!("{who} reply"))
    })
}

impl Rig {
    /// A rig whose tool instance is configured by `config` (config defaulting).
    async fn new(config: Value, setup: Setup) -> Self {
        let model = ScriptedModel::new((0..8).map(|_| by_session()));
        let store = Arc::new(MemoryStore::new());
        let observer = InvariantObserver::shared();
        let jobs = Arc::new(JobRegistry::new());
        let mut builder = Runtime::builder()
            .model(MODEL, model.adapter())
            .session_observer(observer.clone())
            .jobs(jobs.clone());
        if setup.persistence {
            builder = builder.persistence(store.clone());
        }
        let rt = builder.build();
        let mut registrations: Vec<Registration> = job_tools(jobs.clone())
            .into_iter()
            .map(|def| {
                rt.services()
                    .tools
                    .register(None, def)
                    .expect("job tool registers")
            })
            .collect();
        let subagents = SubagentService::new();
        let driver = InProcessDriver::new(rt.services().clone());
        registrations.push(subagent_spawn::register(&subagents, driver.clone()).expect("spawn registers"));
        let (gate, gate_rx) = watch::channel(false);
        let (arrived_tx, arrived) = watch::channel(0);
        let gated = Arc::new(GatedProvider {
            gate: gate_rx,
            arrived: arrived_tx,
            cancelled: AtomicUsize::new(0),
            causes: std::sync::Mutex::default(),
        });
        registrations.push(
            subagents
                .register_provider(gated.clone())
                .expect("gated registers"),
        );
        let manager = ContinuationManager::new(subagents.clone(), rt.services().clone());
        let config = SubagentToolConfig::from_json(&config).expect("valid configuration");
        let plugin = if setup.manager {
            SubagentToolPlugin::load_with_continuation(rt.services(), &subagents, manager.clone(), config)
        } else {
            SubagentToolPlugin::load(rt.services(), &subagents, config)
        }
        .expect("tool loads");
        let parent = rt
            .create(common::routed_parent(PARENT, MODEL))
            .await
            .expect("parent is created");
        Self {
            rt,
            model,
            store,
            observer,
            subagents,
            driver,
            jobs,
            manager,
            gated,
            gate,
            arrived,
            plugin: Some(plugin),
            registrations,
            parent: Some(parent),
        }
    }

    fn plugin(&self) -> &SubagentToolPlugin {
        self.plugin.as_ref().expect("plugin loaded")
    }

    fn parent(&self) -> &AgentRef {
        self.parent.as_ref().expect("parent live").agent()
    }

    /// The delegation tool call future, as [`PARENT`], under `signal` (`'static`, so it can run
    /// on its own task).
    fn delegate(&self, arguments: &Value, signal: Signal) -> impl Future<Output = ToolResult> + 'static {
        let tools = self.rt.services().tools.clone();
        let call = ToolCallRequest {
            call_id: "call".into(),
            name: "subagent".to_owned(),
            arguments: arguments.to_string(),
        };
        async move { tools.execute(&SessionId::from(PARENT), call, signal).await.result }
    }

    /// The ids of the live agents, sorted.
    fn agents(&self) -> Vec<String> {
        let mut ids: Vec<String> = AgentRuntime::list(&self.rt)
            .iter()
            .map(|a| a.id().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// The ids of the live sessions, sorted.
    fn sessions(&self) -> Vec<String> {
        let mut ids: Vec<String> = SessionStore::list(self.rt.sessions())
            .iter()
            .map(|s| s.id().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// The ids of the persisted sessions, sorted.
    async fn persisted_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = SessionPersistence::list(self.store.as_ref())
            .await
            .expect("the store lists")
            .into_iter()
            .map(|h| h.id.to_string())
            .collect();
        ids.sort();
        ids
    }

    async fn persisted(&self, id: &str) -> LoadedSession {
        SessionPersistence::load(self.store.as_ref(), &SessionId::from(id))
            .await
            .expect("persisted")
    }

    /// Nothing of a refused or cancelled start is left: only the parent lives (agent and
    /// session), nothing but the parent is persisted, no child is resident, no start is in
    /// flight and no job exists.
    async fn assert_nothing_started(&self, context: &str) {
        assert_eq!(self.agents(), vec![PARENT], "{context}: live agents");
        assert_eq!(self.sessions(), vec![PARENT], "{context}: live sessions");
        assert_eq!(
            self.persisted_ids().await,
            vec![PARENT],
            "{context}: persisted sessions"
        );
        assert!(self.manager.resident().is_empty(), "{context}: resident");
        assert_eq!(self.plugin().continuable_starts(), 0, "{context}: starts");
        assert!(self.jobs.counts().is_empty(), "{context}: jobs");
    }

    /// Waits (virtual time) until `done` holds.
    async fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        for _ in 0..10_000 {
            if done(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("never reached: {what}");
    }

    /// Waits until every continuable child was released and the parent (woken by the
    /// settlement notices) is idle again.
    async fn settle(&self) {
        self.until("children released", |rig| {
            rig.manager.resident().is_empty() && rig.manager.task_count() == 0
        })
        .await;
        self.parent().when_idle().await;
    }

    /// Disposes the manager's children, the plugin, the parent, the jobs, the service and the
    /// runtime, and asserts quiescence: no live agent, session, manager task, start, run, job
    /// or runtime task, and a clean invariant record.
    async fn finish(mut self) {
        self.manager.dispose_all().await.expect("the manager drains");
        if let Some(plugin) = self.plugin.take() {
            plugin.shutdown().await;
        }
        if let Some(parent) = self.parent.take() {
            parent.dispose().await;
        }
        common::shut_down_quiescent(
            &self.jobs,
            &self.driver,
            &self.subagents,
            &mut self.registrations,
            &self.rt,
        )
        .await;
        assert_eq!(self.manager.task_count(), 0, "manager tasks left");
        assert!(self.manager.resident().is_empty(), "resident children left");
        assert!(self.agents().is_empty(), "agents left: {:?}", self.agents());
        assert!(self.sessions().is_empty(), "sessions left: {:?}", self.sessions());
        assert_quiescent(&self.rt);
        let violations = self.observer.violations();
        assert!(violations.is_empty(), "invariant violations: {violations:?}");
    }
}

/// The model-visible text of a result.
fn text(result: &ToolResult) -> String {
    visible_text(&result.content)
}

/// The error code and message of a failed result (the model sees `Error: <message>`).
fn error(result: &ToolResult) -> (String, String) {
    assert!(result.is_error, "expected an error, got {}", text(result));
    let facts = result.error.clone().expect("error facts");
    assert_eq!(text(result), format!("Error: {}", facts.message));
    (facts.code, facts.message)
}

/// The child id of a successful continuable start, after checking its value and rendering.
fn started(result: &ToolResult) -> String {
    assert!(!result.is_error, "{}", text(result));
    let value = result.value.clone().expect("a value");
    let id = value["subagentId"].as_str().expect("subagentId").to_owned();
    assert!(!id.is_empty());
    assert_eq!(value, json!({"kind": "continuable", "subagentId": id}));
    assert_eq!(text(result), format!("started subagent {id}"));
    id
}

/// Asserts the persisted child `log` has a continuable descriptor naming `provider` and
/// `label`, one user-sourced message (the prompt), and the assistant message of its model
/// answer.
fn assert_persisted_child(log: &LoadedSession, id: &str, provider: &str, label: &str, prompt: &str) {
    assert_eq!(log.header.id.as_str(), id);
    assert_eq!(log.header.parent_session, Some(SessionId::from(PARENT)));
    assert_eq!(log.header.origin, Some(agent::Origin::Subagent));
    match fold_subagent_descriptor(&log.events) {
        Ok(DescriptorState::Supported(SubagentDescriptor::Continuable(descriptor))) => {
            assert_eq!(descriptor.provider, provider);
            assert_eq!(descriptor.label, label);
        }
        other => panic!("{id}: no continuable descriptor: {other:?}"),
    }
    let user: Vec<String> = log
        .events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) if m.source.kind() == "user" => Some(visible_text(&m.content)),
            _ => None,
        })
        .collect();
    assert_eq!(user, vec![prompt.to_owned()], "{id}: user messages");
    let assistant: Vec<String> = log
        .events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::AssistantMessage { message, .. } => Some(visible_text(&message.content)),
            _ => None,
        })
        .collect();
    assert_eq!(assistant, vec![format!("{id} reply")], "{id}: assistant messages");
}

/// The first lines of the settlement notices the parent received.
fn notices(parent: &AgentRef) -> Vec<String> {
    parent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) if m.source.kind() == "subagent-settled" => {
                Some(visible_text(&m.content[..1]))
            }
            _ => None,
        })
        .collect()
}

// ---- tests --------------------------------------------------------------------------------

/// spec: TOOL-46 — continuable default: the description lacks `job_output`/`job_kill`,
/// contains `send_message` and `runs in the background by default`, lacks `never poll or wait
/// on it`; `run_in_background` says `Defaults to true`; the guidance contains `Use subagent in
/// the background by default` and `runtime sends you a notice containing its outcome`; a call
/// with the flag omitted renders `started subagent <id>`; no job is created; the child's
/// persisted session has a descriptor and an assistant message. (The manager also delivers the
/// child's settlement notice to the parent.)
#[tokio::test(start_paused = true)]
async fn tool_46_continuable_default_starts_a_persisted_child() {
    let rig = Rig::new(
        json!({"provider": "spawn", "backgroundMode": "continuable"}),
        Setup::FULL,
    )
    .await;
    let tools = &rig.rt.services().tools;
    let definition = tools.get("subagent", None).expect("the tool is mounted");
    let description = definition.description;
    assert!(!description.contains("job_output"), "{description}");
    assert!(!description.contains("job_kill"), "{description}");
    assert!(description.contains("send_message"), "{description}");
    assert!(
        description.contains("runs in the background by default"),
        "{description}"
    );
    assert!(!description.contains("never poll or wait on it"), "{description}");
    let flag = definition.parameters["properties"]["run_in_background"]["description"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(flag.contains("Defaults to true"), "{flag}");
    let guidance: Vec<String> = rig
        .rt
        .services()
        .prompt
        .sections(Some(&SessionId::from(PARENT)))
        .into_iter()
        .filter(|s| s.name == "tool:subagent")
        .map(|s| s.text)
        .collect();
    assert_eq!(guidance.len(), 1);
    assert!(guidance[0].contains("Use subagent in the background by default"));
    assert!(guidance[0].contains("runtime sends you a notice containing its outcome"));

    let result = rig
        .delegate(
            &json!({"description": "survey the crate", "prompt": "list its modules"}),
            Signal::new(),
        )
        .await;
    let id = started(&result);
    assert!(rig.jobs.counts().is_empty(), "a job was created");
    assert!(rig.jobs.snapshots(&SessionId::from(PARENT)).is_empty());
    assert_eq!(rig.plugin().continuable_starts(), 0, "the call tracks nothing");

    rig.settle().await;
    assert!(rig.jobs.counts().is_empty(), "a job was created");
    let log = rig.persisted(&id).await;
    assert_persisted_child(&log, &id, "spawn", "survey the crate", "list its modules");
    assert_eq!(
        notices(rig.parent()),
        vec![format!(
            "Background subagent {id} finished and will do no further work unless you send it more."
        )]
    );
    assert_eq!(rig.agents(), vec![PARENT], "the settled child was released");
    rig.finish().await;
}

/// spec: TOOL-49 — two concurrent continuable preparations: the one whose call signal is
/// cancelled errors and leaves no agent and no persisted session; the sibling returns
/// `{kind: continuable, subagentId}` and persists independently. Both calls are held inside the
/// provider's preparation (a gate) until the test cancels one and later opens the gate.
#[tokio::test(start_paused = true)]
async fn tool_49_a_cancelled_preparation_leaves_nothing_and_spares_its_sibling() {
    let mut rig = Rig::new(
        json!({"provider": GATED, "backgroundMode": "continuable"}),
        Setup::FULL,
    )
    .await;
    let cancelled_signal = Signal::new();
    let cancelled = tokio::spawn(rig.delegate(
        &json!({"description": "cancelled task", "prompt": "never runs"}),
        cancelled_signal.clone(),
    ));
    let sibling = tokio::spawn(rig.delegate(
        &json!({"description": "sibling task", "prompt": "runs anyway"}),
        Signal::new(),
    ));
    // Both preparations are in flight at once.
    rig.arrived
        .wait_for(|n| *n == 2)
        .await
        .expect("the provider lives");
    assert_eq!(rig.plugin().continuable_starts(), 2);
    assert_eq!(rig.agents(), vec![PARENT], "nothing is created while preparing");

    cancelled_signal.cancel(agent::CancelCause::User);
    let result = cancelled.await.expect("the call's task");
    let (code, _) = error(&result);
    assert_eq!(code, codes::CANCELLED, "{}", text(&result));
    // The cancelled start ends (its preparation followed its own token) while the sibling is
    // still held in the provider.
    rig.until("the cancelled start ended", |rig| {
        rig.plugin().continuable_starts() == 1
    })
    .await;
    assert_eq!(rig.gated.cancelled.load(Ordering::SeqCst), 1);
    assert_eq!(
        *rig.gated.causes.lock().expect("causes"),
        vec![Some(CancelCause::User)],
        "the call's own cancellation reached its preparation"
    );
    assert!(!sibling.is_finished(), "the sibling is still preparing");
    assert_eq!(rig.agents(), vec![PARENT], "the cancelled start left an agent");
    assert_eq!(rig.sessions(), vec![PARENT]);
    assert_eq!(rig.persisted_ids().await, vec![PARENT]);
    assert!(rig.manager.resident().is_empty());

    rig.gate.send_replace(true);
    let result = sibling.await.expect("the call's task");
    let id = started(&result);
    rig.settle().await;
    let mut expected = vec![PARENT.to_owned(), id.clone()];
    expected.sort();
    assert_eq!(rig.persisted_ids().await, expected, "only the sibling persisted");
    let log = rig.persisted(&id).await;
    assert_persisted_child(&log, &id, GATED, "sibling task", "runs anyway");
    assert_eq!(rig.gated.cancelled.load(Ordering::SeqCst), 1);
    assert!(rig.jobs.counts().is_empty(), "a job was created");
    assert_eq!(rig.agents(), vec![PARENT]);
    // The model answered the sibling and the parent's notice turn only.
    assert_eq!(rig.model.requests().len(), 2);
    rig.finish().await;
}

/// §3.9 step 1 — the caller's token owns the start until acceptance; a call whose future is
/// dropped (abandoned by its host) while its start is still preparing, without its signal ever
/// firing, cancels that start with the abandonment reason: the start still runs to its end on
/// its tracked task, rejects, and leaves nothing behind.
#[tokio::test(start_paused = true)]
async fn an_abandoned_call_cancels_its_start() {
    let mut rig = Rig::new(
        json!({"provider": GATED, "backgroundMode": "continuable"}),
        Setup::FULL,
    )
    .await;
    let signal = Signal::new();
    let mut call = Box::pin(rig.delegate(&json!({"description": "d", "prompt": "p"}), signal.clone()));
    tokio::select! {
        result = &mut call => panic!("the call answered while preparing: {}", text(&result)),
        arrived = rig.arrived.wait_for(|n| *n == 1) => {
            arrived.expect("the provider lives");
        }
    }
    assert_eq!(rig.plugin().continuable_starts(), 1);
    drop(call);
    rig.until("the abandoned start ended", |rig| {
        rig.plugin().continuable_starts() == 0
    })
    .await;
    assert!(!signal.is_cancelled(), "the call's own signal never fired");
    assert_eq!(
        *rig.gated.causes.lock().expect("causes"),
        vec![Some(CancelCause::Other {
            reason: model_text::START_ABANDONED_REASON.to_owned()
        })]
    );
    rig.assert_nothing_started("abandoned").await;
    assert!(rig.model.requests().is_empty());
    rig.finish().await;
}

/// spec: SVC-7 (Rust equivalent) — "Without an agents service, `startContinuable` … reject
/// `CONTINUATION_UNAVAILABLE`": here the missing piece is the continuation manager. A tool
/// loaded with `SubagentToolPlugin::load` (no manager) mounts in continuable mode, and a
/// continuable call fails with `CONTINUATION_UNAVAILABLE` — even on a host with persistence and
/// a continuable provider — without reaching the provider's preparation or creating anything.
#[tokio::test(start_paused = true)]
async fn svc_7_without_a_manager_the_continuable_route_is_unavailable() {
    let rig = Rig::new(
        json!({"provider": GATED, "backgroundMode": "continuable"}),
        Setup {
            persistence: true,
            manager: false,
        },
    )
    .await;
    rig.gate.send_replace(true);
    assert!(rig.plugin().is_mounted());
    for args in [
        json!({"description": "d", "prompt": "p"}),
        json!({"description": "d", "prompt": "p", "run_in_background": true}),
    ] {
        let result = rig.delegate(&args, Signal::new()).await;
        assert_eq!(
            error(&result),
            (
                "CONTINUATION_UNAVAILABLE".to_owned(),
                "continuable subagents require the agents service".to_owned()
            )
        );
    }
    assert_eq!(*rig.arrived.borrow(), 0, "the provider was asked to prepare");
    rig.assert_nothing_started("without a manager").await;
    assert!(rig.model.requests().is_empty());
    rig.finish().await;
}

/// §3.9 step 3 — a rejected start surfaces as `Error: <message>` with the seam's code, and
/// leaves nothing behind: a depth error (`maxDepth: 0`), then `DRAINING` once the host drained
/// the manager.
#[tokio::test(start_paused = true)]
async fn continuable_rejections_keep_the_seam_code_and_message() {
    let rig = Rig::new(
        json!({"provider": "spawn", "backgroundMode": "continuable", "maxDepth": 0}),
        Setup::FULL,
    )
    .await;
    let args = json!({"description": "d", "prompt": "p"});
    let result = rig.delegate(&args, Signal::new()).await;
    assert_eq!(
        error(&result),
        (
            SubagentErrorCode::DepthExceeded.as_str().to_owned(),
            "subagent depth 1 exceeds maxDepth 0".to_owned()
        )
    );
    rig.assert_nothing_started("depth").await;

    rig.manager.dispose_all().await.expect("the manager drains");
    let result = rig.delegate(&args, Signal::new()).await;
    let draining = SubagentError::draining();
    assert_eq!(
        error(&result),
        (draining.code().as_str().to_owned(), draining.message().to_owned())
    );
    assert_eq!(draining.code(), SubagentErrorCode::Draining);
    rig.assert_nothing_started("draining").await;
    assert!(rig.model.requests().is_empty());
    rig.finish().await;
}

/// §3.9 step 3 — without session persistence a continuable call fails
/// `PERSISTENCE_UNAVAILABLE` and starts nothing.
#[tokio::test(start_paused = true)]
async fn continuable_route_requires_persistence() {
    let rig = Rig::new(
        json!({"provider": "spawn", "backgroundMode": "continuable"}),
        Setup {
            persistence: false,
            manager: true,
        },
    )
    .await;
    let result = rig
        .delegate(&json!({"description": "d", "prompt": "p"}), Signal::new())
        .await;
    let expected = SubagentError::persistence_unavailable();
    assert_eq!(
        error(&result),
        (
            "PERSISTENCE_UNAVAILABLE".to_owned(),
            expected.message().to_owned()
        )
    );
    assert_eq!(rig.agents(), vec![PARENT]);
    assert_eq!(rig.sessions(), vec![PARENT]);
    assert!(rig.manager.resident().is_empty());
    assert!(rig.jobs.counts().is_empty());
    assert!(rig.model.requests().is_empty());
    rig.finish().await;
}

/// §3.6 on the continuable route — the common request construction reaches the child: the
/// label is the description, and the configured persona, tool filter and numeric `maxDepth`
/// are applied (recorded in the descriptor; the child sits at depth 1 under the cap).
#[tokio::test(start_paused = true)]
async fn continuable_start_carries_the_common_request() {
    let rig = Rig::new(
        json!({
            "provider": "spawn",
            "backgroundMode": "continuable",
            "persona": "You are a careful reviewer.",
            "toolFilter": {"deny": ["job_kill"]},
            "maxDepth": 2,
        }),
        Setup::FULL,
    )
    .await;
    let result = rig
        .delegate(
            &json!({"description": "review the diff", "prompt": "review it", "run_in_background": true}),
            Signal::new(),
        )
        .await;
    let id = started(&result);
    rig.settle().await;
    let log = rig.persisted(&id).await;
    assert_persisted_child(&log, &id, "spawn", "review the diff", "review it");
    assert_eq!(log.header.delegation_depth, Some(1));
    match fold_subagent_descriptor(&log.events) {
        Ok(DescriptorState::Supported(SubagentDescriptor::Continuable(descriptor))) => {
            assert_eq!(descriptor.persona.as_deref(), Some("You are a careful reviewer."));
            let filter = descriptor.tool_filter.expect("the tool filter is recorded");
            assert_eq!(filter.allow, None);
            assert_eq!(filter.deny, Some(vec!["job_kill".to_owned()]));
        }
        other => panic!("no continuable descriptor: {other:?}"),
    }
    rig.finish().await;
}
