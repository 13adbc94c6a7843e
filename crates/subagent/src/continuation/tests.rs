//! Continuation manager tests (checklist CONT-*) on the reference runtime with a scripted model.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

use agent::content::visible_text;
use agent::policy::{ApprovalPolicy, SandboxMode, approval_override, sandbox_override};
use agent::{
    AgentEvent, AgentHandle, AgentOptions, AgentRef, AgentRuntime, AgentStatus, ContentBlock,
    CreateAgentOptions, EventData, MessageSource, SessionEvent, SessionId, SessionMeta, SessionPersistence,
    Signal,
};
use agent_loop::model::{ScriptEntry, chunks};
use agent_loop::runtime::{Runtime, RuntimeBuilder, assert_quiescent};
use agent_loop::warnings::WarningCapture;
use agent_loop::{MemoryStore, ScriptedModel};
use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::{Value, json};

use super::{ContinuableStartSpec, ContinuationManager};
use crate::capabilities::{ContinuableCreateRequest, ContinuableCreateSpec, SubagentCapabilities};
use crate::error::{SubagentError, SubagentErrorCode};
use crate::events::SubagentEvent;
use crate::provider::{PrepareContinuable, ResolvedSubagentStartRequest, SubagentProvider};
use crate::result::StopReason;
use crate::run::SubagentRun;
use crate::service::SubagentService;

/// The lookups of an `AgentRuntime` wrapper (`get`, `list`, `ctx`, `agent_ctx`), delegated to
/// its wrapped runtime in field `$inner`: the test runtimes below only change how agents are
/// created, resumed or disposed.
macro_rules! delegate_agent_lookups {
    ($inner:tt) => {
        fn get(&self, id: &SessionId) -> Option<AgentRef> {
            self.$inner.get(id)
        }
        fn list(&self) -> Vec<AgentRef> {
            self.$inner.list()
        }
        fn ctx(&self) -> agent::Ctx {
            self.$inner.ctx()
        }
        fn agent_ctx(&self, id: &SessionId) -> Option<agent::Ctx> {
            self.$inner.agent_ctx(id)
        }
    };
}

mod host_faults;
mod maintenance;
mod races;
mod setup;
mod surface;

const MODEL: &str = "mock";

/// A provider whose continuable preparation returns no seed (the `spawn` shape), counting calls.
struct TestProvider {
    name: String,
    continuable: bool,
    prepared: AtomicUsize,
    started: AtomicUsize,
}

impl TestProvider {
    /// A continuable test provider named `name` (its name picks its preparation's behaviour).
    fn continuable(name: &str) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            continuable: true,
            prepared: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
        })
    }
}

#[async_trait]
impl SubagentProvider for TestProvider {
    fn name(&self) -> &str {
        &self.name
    }
    fn capabilities(&self) -> SubagentCapabilities {
        SubagentCapabilities::ALL
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    async fn start(&self, _: ResolvedSubagentStartRequest) -> Result<Box<dyn SubagentRun>, SubagentError> {
        self.started.fetch_add(1, AtomicOrdering::SeqCst);
        Err(SubagentError::new(
            SubagentErrorCode::ProviderFailed,
            "one-shot not used",
        ))
    }
    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        self.continuable.then_some(self as &dyn PrepareContinuable)
    }
}

#[async_trait]
impl PrepareContinuable for TestProvider {
    async fn prepare_continuable(
        &self,
        request: ContinuableCreateRequest,
    ) -> Result<ContinuableCreateSpec, SubagentError> {
        self.prepared.fetch_add(1, AtomicOrdering::SeqCst);
        if self.name == "panicky" {
            tokio::task::yield_now().await;
            panic!("preparation exploded");
        }
        if self.name == "unbalanced" {
            // A turn closed while its step is still open: no agent loop writes this.
            let seed = [
                EventData::TurnStart { turn: 1 },
                EventData::StepStart { turn: 1, step: 1 },
                EventData::TurnEnd {
                    turn: 1,
                    reason: agent::TurnEndReason::Completed,
                },
            ]
            .into_iter()
            .enumerate()
            .map(|(i, data)| SessionEvent {
                seq: i as u64,
                time: 0,
                data,
                surface: None,
                ignorable: false,
            })
            .collect();
            return Ok(ContinuableCreateSpec { seed: Some(seed) });
        }
        if self.name == "fork" {
            let events = request.parent.session().events();
            let prefix = agent::balanced_completed_turn_prefix(&events);
            let seed: Vec<SessionEvent> = prefix.iter().map(|e| (**e).clone()).collect();
            return Ok(ContinuableCreateSpec {
                seed: (!seed.is_empty()).then_some(seed),
            });
        }
        Ok(ContinuableCreateSpec::default())
    }
}

struct Host {
    runtime: Runtime,
    model: ScriptedModel,
    store: Arc<MemoryStore>,
    service: SubagentService,
    manager: ContinuationManager,
    provider: Arc<TestProvider>,
    registration: Option<agent::Registration>,
    parent_handle: Option<AgentHandle>,
    parent: AgentRef,
    extra: Vec<AgentHandle>,
    events: Arc<Mutex<Vec<SubagentEvent>>>,
    _listener: agent::Registration,
}

fn routed() -> AgentOptions {
    AgentOptions {
        provider: Some(MODEL.into()),
        model: Some(MODEL.into()),
        ..AgentOptions::default()
    }
}

impl Host {
    /// After a refused start: the parent can still delegate, and that child runs and persists.
    async fn delegates_again(&self) {
        let (child_id, _) = self
            .manager
            .start_continuable(self.spec("next"))
            .await
            .expect("the parent can delegate again");
        self.settle().await;
        assert!(self.persisted(&child_id).await.events.len() > 1);
    }

    async fn new(script: Vec<ScriptEntry>) -> Self {
        Self::build(script, true, true, routed()).await
    }

    async fn build(
        script: Vec<ScriptEntry>,
        persistence: bool,
        continuable: bool,
        parent: AgentOptions,
    ) -> Self {
        Self::build_with(script, persistence, continuable, parent, false).await
    }

    /// [`Host::build`]; with `trickle`, the model's chunks arrive one scheduling point apart
    /// ([`agent_loop::model::Trickle`]).
    async fn build_with(
        script: Vec<ScriptEntry>,
        persistence: bool,
        continuable: bool,
        parent: AgentOptions,
        trickle: bool,
    ) -> Self {
        let store = Arc::new(MemoryStore::new());
        let persistence: Option<Arc<dyn SessionPersistence>> = persistence.then(|| store.clone() as _);
        Self::build_on(script, store, persistence, continuable, parent, trickle).await
    }

    /// A host whose runtime persists through `persistence` (which writes to `store`, or is
    /// `None`).
    async fn build_on(
        script: Vec<ScriptEntry>,
        store: Arc<MemoryStore>,
        persistence: Option<Arc<dyn SessionPersistence>>,
        continuable: bool,
        parent: AgentOptions,
        trickle: bool,
    ) -> Self {
        let model = ScriptedModel::new(script);
        let adapter = if trickle {
            Arc::new(agent_loop::model::Trickle::new(model.adapter()))
        } else {
            model.adapter()
        };
        let mut builder = RuntimeBuilder::new().model(MODEL, adapter);
        if let Some(persistence) = persistence {
            builder = builder.persistence(persistence);
        }
        let runtime = builder.build();
        let parent_handle = runtime
            .create(CreateAgentOptions {
                meta: SessionMeta::default(),
                agent_options: parent,
                ..CreateAgentOptions::new(SessionId::from("parent"))
            })
            .await
            .expect("parent created");
        let parent = parent_handle.agent().clone();
        let service = SubagentService::new();
        let provider = Arc::new(TestProvider {
            name: "spawn".into(),
            continuable,
            prepared: AtomicUsize::new(0),
            started: AtomicUsize::new(0),
        });
        let registration = service.register_provider(provider.clone()).expect("registered");
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let listener = service.events().on(move |e: &SubagentEvent| {
            sink.lock().push(e.clone());
            Ok(())
        });
        let manager = ContinuationManager::new(service.clone(), runtime.services().clone());
        Self {
            runtime,
            model,
            store,
            service,
            manager,
            provider,
            registration: Some(registration),
            parent_handle: Some(parent_handle),
            parent,
            extra: Vec::new(),
            events,
            _listener: listener,
        }
    }

    fn spec(&self, prompt: &str) -> ContinuableStartSpec {
        ContinuableStartSpec::new(
            "spawn",
            "research",
            vec![ContentBlock::text(prompt)],
            self.parent.clone(),
        )
    }

    async fn other_agent(&mut self, id: &str) -> AgentRef {
        let handle = self
            .runtime
            .create(CreateAgentOptions {
                agent_options: routed(),
                ..CreateAgentOptions::new(SessionId::from(id))
            })
            .await
            .expect("agent created");
        let agent = handle.agent().clone();
        self.extra.push(handle);
        agent
    }

    fn get(&self, id: &SessionId) -> Option<AgentRef> {
        AgentRuntime::get(&self.runtime, id)
    }

    fn agent_count(&self) -> usize {
        AgentRuntime::list(&self.runtime).len()
    }

    /// Sends `text` to the released child `child_id` (it cold-resumes), then waits until the
    /// manager, the parent and the manager again are settled.
    async fn cold_resume_and_settle(&self, child_id: &SessionId, text: &str) {
        self.manager
            .followup(&self.parent, child_id, vec![ContentBlock::text(text)])
            .await
            .expect("the child cold-resumes");
        self.settle().await;
        self.parent.when_idle().await;
        self.settle().await;
    }

    /// Waits until the manager has no resident child.
    async fn settle(&self) {
        for _ in 0..10_000 {
            if self.manager.resident().is_empty() && self.manager.task_count() == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        panic!("children did not settle: {:?}", self.manager.resident());
    }

    fn starts(&self) -> Vec<crate::events::SubagentRunInfo> {
        self.events
            .lock()
            .iter()
            .filter_map(|e| match e {
                SubagentEvent::Start(i) => Some(i.clone()),
                _ => None,
            })
            .collect()
    }

    fn ends(&self) -> Vec<crate::events::SubagentRunEndInfo> {
        self.events
            .lock()
            .iter()
            .filter_map(|e| match e {
                SubagentEvent::End(i) => Some(i.clone()),
                _ => None,
            })
            .collect()
    }

    async fn persisted(&self, id: &SessionId) -> agent::store::LoadedSession {
        SessionPersistence::load(self.store.as_ref(), id)
            .await
            .expect("persisted")
    }

    async fn finish(mut self) {
        self.manager.dispose_all().await.expect("drained");
        for handle in self.extra.drain(..) {
            handle.dispose().await;
        }
        if let Some(parent) = self.parent_handle.take() {
            parent.dispose().await;
        }
        self.service.close().await;
        self.runtime.shutdown().await;
        assert_eq!(self.manager.task_count(), 0, "manager tasks left");
        assert!(self.manager.resident().is_empty());
        assert!(self.manager.inner.locks.lock().is_empty(), "per-child locks left");
        drop(self._listener);
        assert_quiescent(&self.runtime);
    }
}

fn texts(events: &[SessionEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(message) if message.source.kind() == "user" => {
                Some(visible_text(&message.content))
            }
            _ => None,
        })
        .collect()
}

fn type_names(events: &[SessionEvent]) -> Vec<String> {
    events.iter().map(|e| e.data.type_name().to_owned()).collect()
}

fn notices(agent: &AgentRef) -> Vec<agent::Message> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(message) if message.source.kind() == "subagent-settled" => {
                Some(message.clone())
            }
            _ => None,
        })
        .collect()
}

fn block_texts(content: &[ContentBlock]) -> Vec<String> {
    content
        .iter()
        .map(|b| visible_text(std::slice::from_ref(b)))
        .collect()
}

/// spec: CONT-3 — a provider without continuable preparation rejects ("does not support
/// continuable children"); its `start` is never called; no child agent or session exists.
#[tokio::test(start_paused = true)]
async fn cont_3_provider_without_preparation_rejects() {
    let host = Host::build(vec![], true, false, routed()).await;
    let err = host
        .manager
        .start_continuable(host.spec("task"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::UnsupportedCapability);
    assert!(
        err.to_string().contains("does not support continuable children"),
        "{err}"
    );
    assert_eq!(host.provider.started.load(AtomicOrdering::SeqCst), 0);
    assert_eq!(host.agent_count(), 1);
    assert_eq!(agent::SessionStore::list(host.runtime.sessions()).len(), 1);
    assert!(
        host.events
            .lock()
            .iter()
            .all(|e| !matches!(e, SubagentEvent::Start(_)))
    );
    host.finish().await;
}

/// spec: CONT-4 — without persistence the start rejects ("require session persistence").
#[tokio::test(start_paused = true)]
async fn cont_4_persistence_is_required() {
    let host = Host::build(vec![], false, true, routed()).await;
    let err = host
        .manager
        .start_continuable(host.spec("task"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::PersistenceUnavailable);
    assert!(err.to_string().contains("require session persistence"), "{err}");
    assert_eq!(host.agent_count(), 1);
    host.finish().await;
}

/// spec: CONT-9 — `maxDepth: 0` rejects ("exceeds maxDepth 0") with no child created.
#[tokio::test(start_paused = true)]
async fn cont_9_max_depth_zero_rejects() {
    let host = Host::new(vec![]).await;
    let mut spec = host.spec("task");
    spec.max_depth = Some(json!(0));
    let err = host.manager.start_continuable(spec).await.unwrap_err();
    assert!(err.to_string().contains("exceeds maxDepth 0"), "{err}");
    assert_eq!(host.agent_count(), 1);
    assert!(
        host.store
            .list()
            .await
            .unwrap()
            .iter()
            .all(|h| h.id.as_str() == "parent")
    );
    host.finish().await;
}

/// spec: CONT-10 — an invalid `maxDepth` (JSON has no NaN; a fractional value is the Rust
/// equivalent) rejects ("non-negative safe integer") before preparation, with no child created.
#[tokio::test(start_paused = true)]
async fn cont_10_invalid_max_depth_rejects_before_preparation() {
    let host = Host::new(vec![]).await;
    for bad in [json!(1.5), json!(-1), json!("x")] {
        let mut spec = host.spec("task");
        spec.max_depth = Some(bad);
        let err = host.manager.start_continuable(spec).await.unwrap_err();
        assert!(err.to_string().contains("non-negative safe integer"), "{err}");
    }
    assert_eq!(host.provider.prepared.load(AtomicOrdering::SeqCst), 0);
    assert_eq!(host.agent_count(), 1);
    host.finish().await;
}

/// spec: CONT-1 — `startContinuable` returns a UUID-shaped child id and a message id equal to
/// the single inbox insertion, before any model request; after settlement the persisted log
/// contains the prompt.
#[tokio::test(start_paused = true)]
async fn cont_1_start_returns_ids_at_acceptance() {
    let host = Host::new(vec![
        chunks::text("child answer").into(),
        chunks::text("parent ack").into(),
    ])
    .await;
    let inserted = Arc::new(Mutex::new(Vec::new()));
    let sink = inserted.clone();
    let requests_at_insert = Arc::new(Mutex::new(Vec::new()));
    let seen = requests_at_insert.clone();
    let model = host.model.clone();
    let sessions = host.runtime.services().sessions.clone();
    let listener = host.runtime.services().agent_events.on(move |e: &AgentEvent| {
        if let AgentEvent::InboxInserted { agent, message } = e
            && agent.as_str() != "parent"
        {
            sink.lock().push(message.clone());
            seen.lock().push(model.requests().len());
            let log: Vec<SessionEvent> = sessions
                .get(agent)
                .map(|s| s.events().iter().map(|e| (**e).clone()).collect())
                .unwrap_or_default();
            assert!(texts(&log).is_empty(), "prompt logged before insertion");
        }
        Ok(())
    });
    let (child_id, message_id) = host
        .manager
        .start_continuable(host.spec("child task"))
        .await
        .unwrap();
    assert!(uuid::Uuid::parse_str(child_id.as_str()).is_ok(), "{child_id}");
    assert_eq!(*inserted.lock(), vec![message_id.clone()]);
    assert_eq!(*requests_at_insert.lock(), vec![0]);
    host.settle().await;
    let log = host.persisted(&child_id).await;
    assert!(texts(&log.events).contains(&"child task".to_owned()));
    drop(listener);
    host.finish().await;
}

/// spec: CONT-2 — a caller-reserved id is used verbatim; reusing it while live, and again after
/// the child settled and persisted, rejects `DUPLICATE_CHILD`; no stray agent remains.
#[tokio::test(start_paused = true)]
async fn cont_2_reserved_id_is_verbatim_and_unique() {
    let host = Host::new(vec![ScriptEntry::hang(), chunks::text("parent ack").into()]).await;
    let id = SessionId::from("reserved-child");
    let mut spec = host.spec("task");
    spec.child_id = Some(id.clone());
    let (child_id, _) = host.manager.start_continuable(spec.clone()).await.unwrap();
    assert_eq!(child_id, id);
    let err = host.manager.start_continuable(spec.clone()).await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::DuplicateChild);
    assert_eq!(host.agent_count(), 2);
    // Settle it (the drain stops the hanging turn), then reuse the persisted id.
    host.manager.dispose_all().await.unwrap();
    assert!(host.get(&id).is_none());
    let manager = ContinuationManager::new(host.service.clone(), host.runtime.services().clone());
    let err = manager.start_continuable(spec).await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::DuplicateChild);
    assert_eq!(host.agent_count(), 1);
    manager.dispose_all().await.unwrap();
    host.finish().await;
}

/// spec: CONT-5 — the persisted child has its descriptor before the first `turn/start`, equal to
/// `{version 2, continuable, provider, label, agentProvider, agentModel}` inherited from the
/// parent route, with no `surfaceOp`; header id, `parentSession` and `origin: subagent` are set.
#[tokio::test(start_paused = true)]
async fn cont_5_descriptor_precedes_the_first_turn() {
    let host = Host::new(vec![chunks::text("done").into(), chunks::text("ack").into()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    let log = host.persisted(&child_id).await;
    let names = type_names(&log.events);
    let descriptor = names
        .iter()
        .position(|n| n == "subagent/descriptor")
        .expect("descriptor");
    let first_turn = names.iter().position(|n| n == "turn/start").expect("turn");
    assert!(descriptor < first_turn, "{names:?}");
    assert_eq!(names.iter().filter(|n| *n == "subagent/descriptor").count(), 1);
    let event = &log.events[descriptor];
    assert!(event.surface.is_none());
    let data = event.data.to_data();
    assert_eq!(
        data,
        json!({"version": 2, "mode": "continuable", "provider": "spawn", "label": "research",
               "agentProvider": MODEL, "agentModel": MODEL})
    );
    assert_eq!(log.header.id, child_id);
    assert_eq!(log.header.parent_session, Some(SessionId::from("parent")));
    assert_eq!(log.header.origin, Some(agent::Origin::Subagent));
    host.finish().await;
}

/// spec: CONT-11 — a routeless parent with no persona/filter yields a descriptor with only
/// version, mode, provider, label.
#[tokio::test(start_paused = true)]
async fn cont_11_routeless_descriptor_is_minimal() {
    let host = Host::build(vec![], true, true, AgentOptions::default()).await;
    let mut spec = host.spec("task");
    spec.agent_options = None;
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    host.settle().await;
    let log = host.persisted(&child_id).await;
    let event = log
        .events
        .iter()
        .find(|e| e.data.type_name() == "subagent/descriptor")
        .expect("descriptor");
    let data = event.data.to_data();
    assert_eq!(
        data,
        json!({"version": 2, "mode": "continuable", "provider": "spawn", "label": "research"})
    );
    host.finish().await;
}

/// spec: CONT-16 — two follow-ups to a running child get distinct ids, keep the same Agent, and
/// are logged in call order after the prompt.
#[tokio::test(start_paused = true)]
async fn cont_16_followups_to_a_running_child_queue_in_order() {
    let host = Host::new(vec![
        chunks::text("one").into(),
        chunks::text("two").into(),
        chunks::text("three").into(),
        chunks::text("ack").into(),
    ])
    .await;
    let (child_id, first) = host.manager.start_continuable(host.spec("prompt")).await.unwrap();
    let child = host.get(&child_id).expect("live");
    assert_eq!(child.status(), AgentStatus::Running);
    let a = host
        .manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("follow A")])
        .await
        .unwrap();
    let b = host
        .manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("follow B")])
        .await
        .unwrap();
    assert!(a != b && a != first && b != first);
    assert!(Arc::ptr_eq(&child, &host.get(&child_id).unwrap()));
    host.settle().await;
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["prompt", "follow A", "follow B"]);
    host.finish().await;
}

/// spec: CONT-20 — a follow-up from a non-parent agent rejects ("belongs to another parent
/// session").
#[tokio::test(start_paused = true)]
async fn cont_20_followup_from_non_parent_rejects() {
    let mut host = Host::new(vec![ScriptEntry::hang()]).await;
    let stranger = host.other_agent("stranger").await;
    let (child_id, _) = host.manager.start_continuable(host.spec("prompt")).await.unwrap();
    let err = host
        .manager
        .followup(&stranger, &child_id, vec![ContentBlock::text("hijack")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Unauthorized);
    assert!(
        err.to_string().contains("belongs to another parent session"),
        "{err}"
    );
    let child = host.get(&child_id).unwrap();
    assert!(
        texts(
            &child
                .session()
                .events()
                .iter()
                .map(|e| (**e).clone())
                .collect::<Vec<_>>()
        )
        .iter()
        .all(|t| t != "hijack")
    );
    host.finish().await;
}

/// spec: CONT-22 — a follow-up to an unknown id rejects `NOT_RESUMABLE`.
#[tokio::test(start_paused = true)]
async fn cont_22_followup_to_unknown_id_is_not_resumable() {
    let host = Host::new(vec![]).await;
    let err = host
        .manager
        .followup(
            &host.parent,
            &SessionId::from("nobody"),
            vec![ContentBlock::text("hi")],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::NotResumable);
    host.finish().await;
}

/// spec: CONT-27 — a top-level parent remains registered after its child settles.
/// spec: CONT-64 — completed child: one notice from the child whose text is the completed line,
/// `Its closing message:`, and the answer; the source summary is the completed line alone.
/// spec: CONT-74 — an idle parent gets exactly one new turn (its first) and one model request.
#[tokio::test(start_paused = true)]
async fn cont_27_64_74_completed_notice_opens_one_parent_turn() {
    let host = Host::new(vec![
        chunks::text("the answer").into(),
        chunks::text("parent ack").into(),
    ])
    .await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert!(host.get(&SessionId::from("parent")).is_some());
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    let line = format!(
        "Background subagent {child_id} finished and will do no further work unless you send it more."
    );
    assert_eq!(
        block_texts(&notices[0].content),
        vec![
            line.clone(),
            "Its closing message:".to_owned(),
            "the answer".to_owned()
        ]
    );
    assert_eq!(
        serde_json::to_value(&notices[0].source).unwrap(),
        json!({"kind": "subagent-settled", "form": "notice", "summary": line, "senderSessionId": child_id.as_str()})
    );
    assert!(matches!(notices[0].source, MessageSource::Other(_)));
    let parent_turns = host
        .parent
        .session()
        .events()
        .iter()
        .filter(|e| e.data.type_name() == "turn/start")
        .count();
    assert_eq!(parent_turns, 1);
    assert_eq!(
        host.model.requests().len(),
        2,
        "one child request, one parent request"
    );
    host.finish().await;
}

/// `ContinuationManager::changes` is signalled once a settled child has left the live map and
/// its notice is no longer under way (what a host waiting for a quiet tree re-checks on): after
/// the child settles, the counter has moved and neither `resident` nor `notices_under_way`
/// names it any more.
#[tokio::test(start_paused = true)]
async fn changes_are_signalled_when_a_settled_child_is_released() {
    let host = Host::new(vec![
        chunks::text("the answer").into(),
        chunks::text("parent ack").into(),
    ])
    .await;
    let mut changes = host.manager.changes();
    changes.borrow_and_update();
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert!(!host.manager.is_resident(&child_id));
    assert!(host.manager.notices_under_way().is_empty());
    assert!(
        changes.has_changed().expect("the manager is alive"),
        "the release and the delivered notice signal a change"
    );
    host.finish().await;
}

/// spec: CONT-49 — a child ending at the token ceiling reports `max-tokens` on its end edge.
/// spec: CONT-66 — token ceiling: the "ran out of room" line plus the partial closing message.
#[tokio::test(start_paused = true)]
async fn cont_49_66_max_tokens_end_edge_and_notice() {
    let host = Host::new(vec![
        chunks::max_tokens_text("partial work").into(),
        chunks::text("ack").into(),
    ])
    .await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::MaxTokens);
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        block_texts(&notices[0].content),
        vec![
            format!("Background subagent {child_id} ran out of room before it finished."),
            "Its closing message:".to_owned(),
            "partial work".to_owned()
        ]
    );
    host.finish().await;
}

/// spec: CONT-42 — after manager drain, starts and follow-ups reject `DRAINING`.
#[tokio::test(start_paused = true)]
async fn cont_42_after_drain_starts_and_followups_reject() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.manager.dispose_all().await.unwrap();
    let err = host
        .manager
        .start_continuable(host.spec("again"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining);
    let err = host
        .manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("more")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining);
    host.finish().await;
}

/// spec: CONT-50 — a follow-up with an already-aborted token to a running child rejects and
/// never reaches the log.
#[tokio::test(start_paused = true)]
async fn cont_50_preaborted_followup_rejects() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let signal = Signal::new();
    signal.cancel(agent::CancelCause::User);
    let err = host
        .manager
        .followup_with(
            &host.parent,
            &child_id,
            vec![ContentBlock::text("never")],
            MessageSource::User,
            &signal,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Cancelled);
    host.manager.dispose_all().await.unwrap();
    let log = host.persisted(&child_id).await;
    assert!(!texts(&log.events).contains(&"never".to_owned()));
    host.finish().await;
}

/// spec: CONT-88 — aborting the token after acceptance does not cancel the accepted turn; the
/// message is logged.
#[tokio::test(start_paused = true)]
async fn cont_88_abort_after_acceptance_is_ignored() {
    let host = Host::new(vec![chunks::text("finished").into(), chunks::text("ack").into()]).await;
    let spec = host.spec("task");
    let signal = spec.signal.clone();
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    signal.cancel(agent::CancelCause::User);
    host.settle().await;
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Completed);
    let log = host.persisted(&child_id).await;
    assert!(texts(&log.events).contains(&"task".to_owned()));
    host.finish().await;
}

/// spec: CONT-78 — manager drain: the parent receives one "was stopped…"/no-closing-message
/// notice, an inbox splice is logged, no `turn/start` occurs, the parent stays idle.
#[tokio::test(start_paused = true)]
async fn cont_78_drain_notice_is_injected_without_a_turn() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.manager.dispose_all().await.unwrap();
    assert_eq!(host.parent.status(), AgentStatus::Idle);
    let inbox = host.parent.inbox();
    assert_eq!(inbox.next_step.len(), 1);
    let notice = &inbox.next_step[0];
    let texts = block_texts(&notice.content);
    assert_eq!(
        texts,
        vec![
            format!("Background subagent {child_id} was stopped before it finished."),
            "It left no closing message.".to_owned()
        ]
    );
    let names: Vec<String> = host
        .parent
        .session()
        .events()
        .iter()
        .map(|e| e.data.type_name().to_owned())
        .collect();
    assert!(names.iter().any(|n| n == "agent/inbox/spliced"), "{names:?}");
    assert!(!names.iter().any(|n| n == "turn/start"), "{names:?}");
    host.finish().await;
}

/// spec: CONT-81 — a parent disposed before its child settles: the notice is dropped without
/// warnings and the end edge still fires.
/// spec: CONT-90 — a stale parent object rejects `UNAUTHORIZED`.
#[tokio::test(start_paused = true)]
async fn cont_81_90_gone_parent() {
    let mut host = Host::new(vec![ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let stale = host.parent.clone();
    host.parent_handle.take().unwrap().dispose().await;
    let err = host
        .manager
        .followup(&stale, &child_id, vec![ContentBlock::text("more")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Unauthorized);
    assert!(err.to_string().contains("exact live parent"), "{err}");
    host.manager.dispose_all().await.unwrap();
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].info.id, child_id);
    assert!(notices(&stale).is_empty());
    host.finish().await;
}

/// spec: §2.14.8 ("Parent absent → the notice is dropped silently … no warning"), §4 item 32,
/// CONT-81 — a parent whose disposal begins while a child's notice is under way (here: right
/// after the notice resolved the still-live parent and decided how to schedule itself, before
/// its send — as when the host disposes the parent on another thread) counts as gone: its
/// refused send is dropped without a warning, and the child's end edge still fires. (The
/// refusal was logged as "settlement notice was not delivered to its parent", as for a live
/// parent whose inbox failed.)
#[tokio::test(start_paused = true)]
async fn a_notice_to_a_parent_whose_disposal_began_is_dropped_without_a_warning() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let mut host = Host::new(by_session(4)).await;
    let (child_gate, hook) = gate(&host, "child");
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("child"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    yield_a_while().await;
    // The synchronous part of the parent's disposal, at the notice's scheduling point; the
    // teardown itself is awaited below.
    let parent_handle = Mutex::new(host.parent_handle.take());
    let parent_disposal = Arc::new(Mutex::new(None));
    let disposal = parent_disposal.clone();
    *host.manager.inner.hooks.notice_scheduled.lock() = Some(Arc::new(move || {
        if let Some(handle) = parent_handle.lock().take() {
            *disposal.lock() = Some(handle.dispose());
        }
    }));
    child_gate.send(true).unwrap();
    host.settle().await;
    *host.manager.inner.hooks.notice_scheduled.lock() = None;
    assert!(!host.parent.is_live(), "the parent's disposal began");
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].info.id, child_id);
    assert_eq!(ends[0].stop_reason, StopReason::Completed);
    assert!(notices(&host.parent).is_empty());
    let logged = warnings.messages();
    assert!(
        !logged.iter().any(|w| w.contains("settlement notice")),
        "{logged:?}"
    );
    let parent_disposed = parent_disposal
        .lock()
        .take()
        .expect("the notice disposed the parent");
    parent_disposed.await;
    drop(hook);
    host.finish().await;
}

/// The lifecycle edges of one epoch: one start (child id, provider, local) before any turn, one
/// end pairing its run id with the epoch's answer.
#[tokio::test(start_paused = true)]
async fn one_epoch_has_paired_lifecycle_edges() {
    let host = Host::new(vec![chunks::text("answer").into(), chunks::text("ack").into()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    let starts = host.starts();
    let ends = host.ends();
    assert_eq!(starts.len(), 1);
    assert_eq!(ends.len(), 1);
    assert_eq!(starts[0].id, child_id);
    assert_eq!(starts[0].provider, "spawn");
    assert!(starts[0].local);
    assert_eq!(starts[0].parent, SessionId::from("parent"));
    assert_eq!(ends[0].info, starts[0]);
    assert_eq!(ends[0].stop_reason, StopReason::Completed);
    assert_eq!(
        ends[0].last_assistant_message.as_deref().map(block_texts),
        Some(vec!["answer".to_owned()])
    );
    let _ = Value::Null;
    host.finish().await;
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

fn gate(host: &Host, id: &str) -> (tokio::sync::watch::Sender<bool>, agent::Registration) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let registration = host
        .runtime
        .services()
        .pre_step
        .add(Some(SessionId::from(id)), Arc::new(Gate { open: rx }));
    (tx, registration)
}

/// A model that answers each session with a fixed text: `child`, `grandchild`, `parent`, ….
fn by_session(entries: usize) -> Vec<ScriptEntry> {
    (0..entries)
        .map(|_| {
            ScriptEntry::respond(|request| {
                let who = request.session_id.as_ref().map_or("?", |s| s.as_str()).to_owned();
                chunks::text(format!("{who} reply"))
            })
        })
        .collect()
}

async fn yield_a_while() {
    for _ in 0..50 {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// spec: CONT-26 — a child Activation stays resident (same Agent) while its grandchild lives,
/// then both are released.
/// spec: CONT-19 — a child waiting on a running grandchild keeps the same Agent; a follow-up
/// wakes that same Agent; its log later also holds the grandchild's settlement notice
/// ("finished and will do no further work").
/// spec: CONT-77 — at notice insertion the parent's owned set still contains the child.
#[tokio::test(start_paused = true)]
async fn cont_19_26_77_waiting_child_keeps_its_agent() {
    let host = Host::new(by_session(10)).await;
    let (child_gate, child_hook) = gate(&host, "child");
    let (gc_gate, gc_hook) = gate(&host, "grandchild");
    let mut spec = host.spec("child task");
    spec.child_id = Some(SessionId::from("child"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let child = host.get(&child_id).unwrap();
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("gc task")],
        child.clone(),
    );
    spec.child_id = Some(SessionId::from("grandchild"));
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    // At the grandchild's notice insertion, the child still owns it.
    let owned_at_notice = Arc::new(Mutex::new(None));
    let probe = owned_at_notice.clone();
    let manager = host.manager.clone();
    let notice_listener =
        host.runtime
            .services()
            .agent_events
            .on_scoped(child_id.clone(), move |e: &AgentEvent| {
                if let AgentEvent::InboxInserted { agent, .. } = e {
                    let owned = manager
                        .inner
                        .activations
                        .lock()
                        .get(agent)
                        .map(|a| a.owned_children());
                    probe.lock().get_or_insert(owned);
                }
                Ok(())
            });
    // The child finishes its own turn but waits on the grandchild.
    child_gate.send(true).unwrap();
    child.when_idle().await;
    yield_a_while().await;
    assert!(host.manager.is_resident(&child_id));
    assert!(Arc::ptr_eq(&child, &host.get(&child_id).unwrap()));
    assert_eq!(child.status(), AgentStatus::Idle);
    // A follow-up wakes the same agent.
    *owned_at_notice.lock() = None;
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("still there?")])
        .await
        .unwrap();
    *owned_at_notice.lock() = None;
    child.when_idle().await;
    yield_a_while().await;
    assert!(Arc::ptr_eq(&child, &host.get(&child_id).unwrap()));
    assert!(host.manager.is_resident(&child_id));
    // The grandchild finishes: notice to the child, then both settle.
    gc_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert_eq!(*owned_at_notice.lock(), Some(Some(vec![gc_id.clone()])));
    let child_notices = notices(&child);
    assert_eq!(child_notices.len(), 1);
    assert!(visible_text(&child_notices[0].content).contains("finished and will do no further work"));
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["child task", "still there?"]);
    let ends: Vec<SessionId> = host.ends().into_iter().map(|e| e.info.id).collect();
    assert_eq!(ends, vec![gc_id, child_id]);
    assert!(host.get(&SessionId::from("child")).is_none());
    assert!(host.get(&SessionId::from("grandchild")).is_none());
    drop((notice_listener, child_hook, gc_hook));
    host.finish().await;
}

/// spec: CONT-75 — a busy parent gets two notices in next-step (none in next-turn), opens no
/// new turn, and reads both; senders are the two children in either order.
#[tokio::test(start_paused = true)]
async fn cont_75_busy_parent_reads_both_notices_in_one_turn() {
    let host = Host::new(by_session(10)).await;
    let (parent_gate, parent_hook) = gate(&host, "parent");
    let targets = Arc::new(Mutex::new(Vec::new()));
    let sink = targets.clone();
    let splices = host.parent.session().events().len();
    host.parent
        .followup(agent::Message::user_text("parent work"))
        .unwrap();
    assert_eq!(host.parent.status(), AgentStatus::Running);
    let (a, _) = host.manager.start_continuable(host.spec("task a")).await.unwrap();
    let (b, _) = host.manager.start_continuable(host.spec("task b")).await.unwrap();
    let inbox_listener =
        host.runtime
            .services()
            .agent_events
            .on_scoped(SessionId::from("parent"), move |e: &AgentEvent| {
                if let AgentEvent::InboxInserted { .. } = e {
                    sink.lock().push(());
                }
                Ok(())
            });
    host.settle().await;
    let inbox = host.parent.inbox();
    assert_eq!(inbox.next_step.len(), 2);
    assert!(inbox.next_turn.is_empty());
    assert_eq!(targets.lock().len(), 2);
    parent_gate.send(true).unwrap();
    host.parent.when_idle().await;
    let events: Vec<SessionEvent> = host.parent.session().events()[splices..]
        .iter()
        .map(|e| (**e).clone())
        .collect();
    assert_eq!(
        type_names(&events).iter().filter(|n| *n == "turn/start").count(),
        1,
        "no new turn"
    );
    let mut senders: Vec<String> = notices(&host.parent)
        .iter()
        .map(|m| {
            serde_json::to_value(&m.source).unwrap()["senderSessionId"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    senders.sort();
    let mut expected = vec![a.to_string(), b.to_string()];
    expected.sort();
    assert_eq!(senders, expected);
    // Both notices were read by the parent's model.
    let last = host.model.last_request().unwrap();
    let read: Vec<String> = last.messages.iter().map(|m| m.text()).collect();
    assert_eq!(
        read.iter()
            .filter(|t| t.contains("finished and will do no further work"))
            .count(),
        2
    );
    drop((inbox_listener, parent_hook));
    host.finish().await;
}

struct NoopTool;

#[async_trait]
impl agent::tools::ToolHandler for NoopTool {
    async fn execute(
        &self,
        _: Value,
        _: agent::tools::ToolContext,
    ) -> Result<agent::tools::ToolOutput, agent::tools::ToolError> {
        Err(agent::tools::ToolError::new("UNUSED", "unused"))
    }
}

/// spec: CONT-12 — a declared `toolFilter {deny}` is recorded in the descriptor.
#[tokio::test(start_paused = true)]
async fn cont_12_tool_filter_is_recorded() {
    let host = Host::new(vec![chunks::text("done").into(), chunks::text("ack").into()]).await;
    let tool = host
        .runtime
        .services()
        .tools
        .register(
            None,
            agent::ToolDefinition {
                name: "shell".into(),
                description: "run a command".into(),
                parameters: json!({"type": "object"}),
                concurrency_safe: false,
                handler: Arc::new(NoopTool),
            },
        )
        .unwrap();
    let mut spec = host.spec("task");
    spec.tool_filter = Some(agent::tools::ToolRestriction {
        allow: None,
        deny: Some(vec!["shell".into()]),
    });
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    host.settle().await;
    let log = host.persisted(&child_id).await;
    let event = log
        .events
        .iter()
        .find(|e| e.data.type_name() == "subagent/descriptor")
        .expect("descriptor");
    assert_eq!(event.data.to_data()["toolFilter"], json!({"deny": ["shell"]}));
    drop(tool);
    host.finish().await;
}

/// Rejects every step of the agent it is scoped to.
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

/// spec: CONT-61 — a pre-step rejection of the initial prompt reports `refusal`.
/// spec: CONT-67 — pre-step rejection: "declined the task." plus "It left no closing message."
#[tokio::test(start_paused = true)]
async fn cont_61_67_pre_step_rejection_is_a_refusal() {
    let host = Host::new(vec![chunks::text("parent ack").into()]).await;
    let hook = host
        .runtime
        .services()
        .pre_step
        .add(Some(SessionId::from("refuser")), Arc::new(RejectStep));
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("refuser"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Refusal);
    assert_eq!(ends[0].last_assistant_message, None);
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        block_texts(&notices[0].content),
        vec![
            format!("Background subagent {child_id} declined the task."),
            "It left no closing message.".to_owned()
        ]
    );
    drop(hook);
    host.finish().await;
}

/// spec: CONT-7 — aborting the token at `subagent/start` (between publication and acceptance)
/// rejects and leaves only the parent.
#[tokio::test(start_paused = true)]
async fn cont_7_abort_at_the_start_edge_rejects() {
    let host = Host::new(vec![]).await;
    let spec = host.spec("task");
    let signal = spec.signal.clone();
    let abort = host.service.events().on(move |e: &SubagentEvent| {
        if matches!(e, SubagentEvent::Start(_)) {
            signal.cancel(agent::CancelCause::User);
        }
        Ok(())
    });
    let err = host.manager.start_continuable(spec).await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Cancelled);
    assert_eq!(host.agent_count(), 1);
    assert!(host.manager.resident().is_empty());
    assert_eq!(host.model.requests().len(), 0);
    assert!(notices(&host.parent).is_empty());
    drop(abort);
    host.finish().await;
}

/// spec: CONT-8 — (Rust equivalent) publishing the start edge cannot fail here: the manager emits
/// it on the contained lifecycle bus (`EventBus::emit` returns `()`; each listener's error or
/// panic is logged and the next listener still runs), so the spec's "start rejects with the
/// publication failure, no child, no end edge" rollback has no trigger. What is asserted instead:
/// start-edge listeners that panic or fail change nothing — the start resolves, a listener
/// registered after them still hears the edge, the epoch's end edge pairs with it, the failures
/// are logged, and a later manager drain succeeds with no child left.
#[tokio::test(start_paused = true)]
async fn cont_8_a_failing_start_edge_listener_cannot_fail_the_start() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let host = Host::new(by_session(4)).await;
    let panicking = host.service.events().on(|e: &SubagentEvent| {
        if matches!(e, SubagentEvent::Start(_)) {
            panic!("start listener exploded");
        }
        Ok(())
    });
    let failing = host.service.events().on(|e: &SubagentEvent| match e {
        SubagentEvent::Start(_) => Err("start listener refused".into()),
        _ => Ok(()),
    });
    let heard = Arc::new(AtomicUsize::new(0));
    let count = heard.clone();
    let later = host.service.events().on(move |e: &SubagentEvent| {
        if matches!(e, SubagentEvent::Start(_)) {
            count.fetch_add(1, AtomicOrdering::SeqCst);
        }
        Ok(())
    });
    let (child_id, _) = host
        .manager
        .start_continuable(host.spec("task"))
        .await
        .expect("the start resolves");
    assert_eq!(heard.load(AtomicOrdering::SeqCst), 1);
    host.settle().await;
    host.parent.when_idle().await;
    let (starts, ends) = (host.starts(), host.ends());
    assert_eq!(starts.len(), 1);
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].info.run_id, starts[0].run_id);
    assert_eq!(ends[0].stop_reason, StopReason::Completed);
    let logged = warnings.messages();
    for failure in ["start listener exploded", "start listener refused"] {
        assert!(logged.iter().any(|w| w.contains(failure)), "{logged:?}");
    }
    drop((panicking, failing, later));
    host.manager.dispose_all().await.expect("a later drain succeeds");
    assert!(host.get(&child_id).is_none());
    host.finish().await;
}

/// spec: CONT-17 — a follow-up to a settled child cold-resumes, returns an id, is logged after
/// the prompt, and the log still has exactly one descriptor.
/// spec: CONT-51 — the end edge reports the epoch's own answer; after cold resume the second
/// epoch reports its own new answer.
/// spec: CONT-84 — two epochs (start, cold resume) produce two start edges with the child id and
/// provider, ends pairing their run ids, both `completed`.
#[tokio::test(start_paused = true)]
async fn cont_17_51_84_followup_to_a_settled_child_cold_resumes() {
    let host = Host::new(vec![
        chunks::text("first answer").into(),
        chunks::text("parent ack").into(),
        chunks::text("second answer").into(),
        chunks::text("parent ack again").into(),
    ])
    .await;
    let (child_id, first) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert!(host.get(&child_id).is_none());
    let second = host
        .manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("again")])
        .await
        .unwrap();
    assert_ne!(first, second);
    host.settle().await;
    host.parent.when_idle().await;
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task", "again"]);
    assert_eq!(
        type_names(&log.events)
            .iter()
            .filter(|n| *n == "subagent/descriptor")
            .count(),
        1
    );
    let starts = host.starts();
    let ends = host.ends();
    assert_eq!(starts.len(), 2);
    assert_eq!(ends.len(), 2);
    assert_ne!(starts[0].run_id, starts[1].run_id);
    for (start, end) in starts.iter().zip(&ends) {
        assert_eq!(start.id, child_id);
        assert_eq!(start.provider, "spawn");
        assert_eq!(&end.info, start);
        assert_eq!(end.stop_reason, StopReason::Completed);
    }
    let answers: Vec<Option<Vec<String>>> = ends
        .iter()
        .map(|e| e.last_assistant_message.as_deref().map(block_texts))
        .collect();
    assert_eq!(
        answers,
        vec![
            Some(vec!["first answer".to_owned()]),
            Some(vec!["second answer".to_owned()])
        ]
    );
    host.finish().await;
}

/// spec: CONT-18 — after the provider unregisters, a follow-up still succeeds; both epochs'
/// start edges name the original provider; end run ids pair with start run ids.
#[tokio::test(start_paused = true)]
async fn cont_18_cold_resume_survives_provider_removal() {
    let mut host = Host::new(vec![
        chunks::text("one").into(),
        chunks::text("ack").into(),
        chunks::text("two").into(),
        chunks::text("ack").into(),
    ])
    .await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    drop(host.registration.take());
    assert!(host.service.get_provider("spawn").is_none());
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("again")])
        .await
        .unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let starts = host.starts();
    let ends = host.ends();
    assert_eq!(starts.len(), 2);
    assert!(starts.iter().all(|s| s.provider == "spawn"));
    let start_ids: Vec<&String> = starts.iter().map(|s| &s.run_id).collect();
    let end_ids: Vec<&String> = ends.iter().map(|e| &e.info.run_id).collect();
    assert_eq!(start_ids, end_ids);
    host.finish().await;
}

/// spec: CONT-94 — a declared `agentOptions.model` is recorded and reapplied on cold resume.
/// spec: CONT-15 — a declared persona is recorded and a later cold-resume follow-up lands in the
/// log.
#[tokio::test(start_paused = true)]
async fn cont_15_94_declared_model_and_persona_survive_cold_resume() {
    let host = Host::new(vec![
        chunks::text("one").into(),
        chunks::text("ack").into(),
        chunks::text("two").into(),
        chunks::text("ack").into(),
    ])
    .await;
    let mut spec = host.spec("task");
    spec.agent_options = Some(AgentOptions {
        model: Some("special".into()),
        ..AgentOptions::default()
    });
    spec.persona = Some("You are terse.".into());
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("resumed")])
        .await
        .unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let log = host.persisted(&child_id).await;
    let descriptor = log
        .events
        .iter()
        .find(|e| e.data.type_name() == "subagent/descriptor")
        .expect("descriptor")
        .data
        .to_data();
    assert_eq!(descriptor["agentModel"], json!("special"));
    assert_eq!(descriptor["persona"], json!("You are terse."));
    assert_eq!(texts(&log.events), vec!["task", "resumed"]);
    let child_models: Vec<String> = host
        .model
        .requests()
        .iter()
        .filter(|r| r.session_id.as_ref() == Some(&child_id))
        .map(|r| r.model.to_string())
        .collect();
    assert_eq!(child_models, vec!["special", "special"]);
    host.finish().await;
}

/// spec: CONT-21 — a follow-up to a persisted one-shot child rejects ("no supported
/// continuation state").
#[tokio::test(start_paused = true)]
async fn cont_21_one_shot_child_is_not_resumable() {
    let host = Host::new(vec![]).await;
    let handle = host
        .runtime
        .create(CreateAgentOptions {
            meta: SessionMeta {
                parent_session: Some(SessionId::from("parent")),
                origin: Some(agent::Origin::Subagent),
                delegation_depth: Some(1),
                ..SessionMeta::default()
            },
            ..CreateAgentOptions::new(SessionId::from("one-shot"))
        })
        .await
        .unwrap();
    handle
        .agent()
        .session()
        .append(
            crate::descriptor::SubagentDescriptor::one_shot("spawn", None).to_event_data(),
            None,
        )
        .unwrap();
    handle.dispose().await;
    let err = host
        .manager
        .followup(
            &host.parent,
            &SessionId::from("one-shot"),
            vec![ContentBlock::text("hi")],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::NotResumable);
    assert!(
        err.to_string().contains("no supported continuation state"),
        "{err}"
    );
    assert!(host.get(&SessionId::from("one-shot")).is_none());
    host.finish().await;
}

fn turn_end_reasons(events: &[SessionEvent]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.data.type_name() == "turn/end")
        .map(|e| e.data.to_data()["reason"].clone())
        .collect()
}

fn live_log(agent: &AgentRef) -> Vec<SessionEvent> {
    agent.session().events().iter().map(|e| (**e).clone()).collect()
}

/// spec: CONT-96 — `user` authority: one cancel with (`user`, keepInbox); no further model
/// request; two follow-ups remain parked in next-turn; the child is idle and resident; a later
/// waking follow-up runs the parked two then itself; turn ends are aborted, completed ×3.
#[tokio::test(start_paused = true)]
async fn cont_96_user_interrupt_parks_queued_work() {
    let host = Host::new(vec![
        ScriptEntry::hang(),
        chunks::text("a").into(),
        chunks::text("b").into(),
        chunks::text("c").into(),
        chunks::text("parent ack").into(),
    ])
    .await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).unwrap();
    for text in ["A", "B"] {
        host.manager
            .followup(&host.parent, &child_id, vec![ContentBlock::text(text)])
            .await
            .unwrap();
    }
    yield_a_while().await;
    assert_eq!(host.model.requests().len(), 1);
    host.manager
        .interrupt(
            &child_id,
            &super::InterruptAuthority::User {
                parent_session_id: SessionId::from("parent"),
            },
        )
        .unwrap();
    child.when_idle().await;
    yield_a_while().await;
    assert_eq!(host.model.requests().len(), 1, "no further model request");
    assert_eq!(child.status(), AgentStatus::Idle);
    assert!(host.manager.is_resident(&child_id));
    assert!(Arc::ptr_eq(&child, &host.get(&child_id).unwrap()));
    let parked: Vec<String> = child.inbox().next_turn.iter().map(|m| m.text()).collect();
    assert_eq!(parked, vec!["A", "B"]);
    assert_eq!(
        turn_end_reasons(&live_log(&child)),
        vec![json!({"kind": "aborted", "reason": {"kind": "user"}})]
    );
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("C")])
        .await
        .unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task", "A", "B", "C"]);
    let kinds: Vec<Value> = turn_end_reasons(&log.events)
        .iter()
        .map(|r| r["kind"].clone())
        .collect();
    assert_eq!(
        kinds,
        vec![
            json!("aborted"),
            json!("completed"),
            json!("completed"),
            json!("completed")
        ]
    );
    host.finish().await;
}

/// spec: CONT-98 — a wrong parent address throws ("belongs to another parent session") without
/// cancelling; the right one cancels with (`user`, keepInbox).
/// spec: CONT-100 — self → "cannot interrupt itself"; a stranger → "not a live descendant";
/// stale → "exact live ancestor", also for an absent target; the target is never cancelled.
#[tokio::test(start_paused = true)]
async fn cont_98_100_interrupt_authority() {
    let mut host = Host::new(vec![ScriptEntry::hang()]).await;
    let stranger = host.other_agent("stranger").await;
    let stale_handle = host
        .runtime
        .create(CreateAgentOptions::new(SessionId::from("stale")))
        .await
        .unwrap();
    let stale = stale_handle.agent().clone();
    stale_handle.dispose().await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).unwrap();
    let wrong = super::InterruptAuthority::User {
        parent_session_id: SessionId::from("stranger"),
    };
    let err = host.manager.interrupt(&child_id, &wrong).unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Unauthorized);
    assert!(
        err.to_string().contains("belongs to another parent session"),
        "{err}"
    );
    let ancestor = |agent: &AgentRef| super::InterruptAuthority::Ancestor { agent: agent.clone() };
    let err = host.manager.interrupt(&child_id, &ancestor(&child)).unwrap_err();
    assert!(err.to_string().contains("cannot interrupt itself"), "{err}");
    let err = host
        .manager
        .interrupt(&child_id, &ancestor(&stranger))
        .unwrap_err();
    assert!(err.to_string().contains("not a live descendant"), "{err}");
    let err = host.manager.interrupt(&child_id, &ancestor(&stale)).unwrap_err();
    assert!(err.to_string().contains("exact live ancestor"), "{err}");
    let err = host
        .manager
        .interrupt(&SessionId::from("absent"), &ancestor(&stale))
        .unwrap_err();
    assert!(err.to_string().contains("exact live ancestor"), "{err}");
    yield_a_while().await;
    assert_eq!(child.status(), AgentStatus::Running, "never cancelled");
    assert!(turn_end_reasons(&live_log(&child)).is_empty());
    host.manager
        .interrupt(
            &child_id,
            &super::InterruptAuthority::User {
                parent_session_id: SessionId::from("parent"),
            },
        )
        .unwrap();
    child.when_idle().await;
    assert_eq!(
        turn_end_reasons(&live_log(&child)),
        vec![json!({"kind": "aborted", "reason": {"kind": "user"}})]
    );
    host.finish().await;
}

/// spec: CONT-99 — the top-level agent as ancestor interrupts a grandchild and a child, each
/// with (`parent`, keepInbox).
#[tokio::test(start_paused = true)]
async fn cont_99_top_level_ancestor_interrupts_child_and_grandchild() {
    let host = Host::new(vec![
        ScriptEntry::hang(),
        ScriptEntry::hang(),
        chunks::text("child ack").into(),
        chunks::text("parent ack").into(),
    ])
    .await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).unwrap();
    let spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("gc task")],
        child.clone(),
    );
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let gc = host.get(&gc_id).unwrap();
    yield_a_while().await;
    let top = super::InterruptAuthority::Ancestor {
        agent: host.parent.clone(),
    };
    host.manager.interrupt(&gc_id, &top).unwrap();
    host.manager.interrupt(&child_id, &top).unwrap();
    let parent_cause = vec![json!({"kind": "aborted", "reason": {"kind": "parent"}})];
    gc.when_idle().await;
    assert_eq!(turn_end_reasons(&live_log(&gc)), parent_cause);
    host.settle().await;
    host.parent.when_idle().await;
    let child_log = host.persisted(&child_id).await;
    assert_eq!(turn_end_reasons(&child_log.events)[..1], parent_cause[..]);
    host.finish().await;
}

/// spec: CONT-101 — absent ids (both kinds) and a one-shot child id are no-ops; the one-shot
/// agent is never cancelled.
/// spec: CONT-102 — interrupting a naturally settled child is a no-op.
#[tokio::test(start_paused = true)]
async fn cont_101_102_absent_and_settled_targets_are_no_ops() {
    let mut host = Host::new(vec![
        chunks::text("done").into(),
        chunks::text("ack").into(),
        ScriptEntry::hang(),
    ])
    .await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let user = super::InterruptAuthority::User {
        parent_session_id: SessionId::from("parent"),
    };
    let top = super::InterruptAuthority::Ancestor {
        agent: host.parent.clone(),
    };
    host.manager.interrupt(&child_id, &user).unwrap();
    host.manager.interrupt(&child_id, &top).unwrap();
    host.manager.interrupt(&SessionId::from("absent"), &user).unwrap();
    host.manager.interrupt(&SessionId::from("absent"), &top).unwrap();
    let one_shot = host.other_agent("one-shot").await;
    one_shot.followup(agent::Message::user_text("work")).unwrap();
    assert_eq!(one_shot.status(), AgentStatus::Running);
    host.manager
        .interrupt(&SessionId::from("one-shot"), &user)
        .unwrap();
    host.manager
        .interrupt(&SessionId::from("one-shot"), &top)
        .unwrap();
    yield_a_while().await;
    assert_eq!(one_shot.status(), AgentStatus::Running);
    assert!(turn_end_reasons(&live_log(&one_shot)).is_empty());
    host.finish().await;
}

fn sources_of(agent: &AgentRef, kind: &str) -> Vec<agent::Message> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(message) if message.source.kind() == kind => Some(message.clone()),
            _ => None,
        })
        .collect()
}

/// spec: CONT-63 — a next-step report from a running child wakes an idle parent (one parent
/// request), the parent's logged report id equals the returned id, and the later settlement
/// opens a second parent request.
#[tokio::test(start_paused = true)]
async fn cont_63_next_step_report_wakes_an_idle_parent() {
    let host = Host::new(by_session(10)).await;
    let (child_gate, child_hook) = gate(&host, "reporter");
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("reporter"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let child = host.get(&child_id).unwrap();
    assert_eq!(child.status(), AgentStatus::Running);
    let id = host
        .manager
        .report_from(
            &child,
            vec![ContentBlock::text("halfway there")],
            super::ReportDelivery::NextStep,
            &Signal::new(),
        )
        .unwrap();
    host.parent.when_idle().await;
    let parent_requests = |host: &Host| {
        host.model
            .requests()
            .iter()
            .filter(|r| r.session_id.as_ref().is_some_and(|s| s.as_str() == "parent"))
            .count()
    };
    assert_eq!(parent_requests(&host), 1);
    let reports = sources_of(&host.parent, "subagent-report");
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].id, id);
    assert_eq!(
        block_texts(&reports[0].content),
        vec![
            format!("Background subagent {child_id} reported:"),
            "halfway there".to_owned()
        ]
    );
    assert_eq!(
        serde_json::to_value(&reports[0].source).unwrap(),
        json!({"kind": "subagent-report", "form": "relay", "senderSessionId": child_id.as_str()})
    );
    child_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert_eq!(parent_requests(&host), 2);
    drop(child_hook);
    host.finish().await;
}

/// spec: CONT-65 — the notice arrives even when the child already reported (quiet).
#[tokio::test(start_paused = true)]
async fn cont_65_notice_follows_a_quiet_report() {
    let host = Host::new(by_session(10)).await;
    let (child_gate, child_hook) = gate(&host, "quiet");
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("quiet"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let child = host.get(&child_id).unwrap();
    host.manager
        .report_from(
            &child,
            vec![ContentBlock::text("note")],
            super::ReportDelivery::Quiet,
            &Signal::new(),
        )
        .unwrap();
    assert_eq!(
        host.parent.status(),
        AgentStatus::Idle,
        "a quiet report does not wake"
    );
    child_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert_eq!(sources_of(&host.parent, "subagent-report").len(), 1);
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert!(visible_text(&notices[0].content).contains("finished and will do no further work"));
    drop(child_hook);
    host.finish().await;
}

/// spec: CONT-25 — a follow-up issued as the child becomes idle (racing settlement) still
/// resolves and is logged.
#[tokio::test(start_paused = true)]
async fn cont_25_followup_racing_settlement_is_delivered() {
    let host = Host::new(by_session(10)).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).unwrap();
    child.when_idle().await;
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("racing")])
        .await
        .unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task", "racing"]);
    host.finish().await;
}

/// spec: CONT-31 — manager drain disposes the grandchild before the child; the durable child
/// session still loads.
#[tokio::test(start_paused = true)]
async fn cont_31_manager_drain_releases_child_first() {
    let host = Host::new(vec![ScriptEntry::hang(), ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).unwrap();
    let spec = ContinuableStartSpec::new("spawn", "deeper", vec![ContentBlock::text("gc task")], child);
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let disposed = Arc::new(Mutex::new(Vec::new()));
    let sink = disposed.clone();
    let listener = host.runtime.services().agent_events.on(move |e: &AgentEvent| {
        if let AgentEvent::Disposed { agent } = e {
            sink.lock().push(agent.clone());
        }
        Ok(())
    });
    host.manager.dispose_all().await.unwrap();
    assert_eq!(*disposed.lock(), vec![gc_id.clone(), child_id.clone()]);
    let ends: Vec<SessionId> = host.ends().into_iter().map(|e| e.info.id).collect();
    assert_eq!(ends, vec![gc_id, child_id.clone()]);
    let log = host.persisted(&child_id).await;
    assert_eq!(log.header.id, child_id);
    drop(listener);
    host.finish().await;
}

/// spec: CONT-46 — an accepted follow-up still queued at drain time is absent from the persisted
/// log (no replay).
/// spec: CONT-58 — a queued message discarded by a drain does not block settlement and is not
/// logged.
#[tokio::test(start_paused = true)]
async fn cont_46_58_queued_followup_is_discarded_by_a_drain() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("queued")])
        .await
        .unwrap();
    yield_a_while().await;
    assert_eq!(
        host.model.requests().len(),
        1,
        "the first turn is in its model call"
    );
    host.manager.dispose_all().await.unwrap();
    assert!(host.manager.resident().is_empty());
    assert_eq!(host.ends().len(), 1);
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    host.finish().await;
}

/// spec: CONT-70 — a child drained at its first pre-step: "was stopped…" plus "It left no
/// closing message."
#[tokio::test(start_paused = true)]
async fn cont_70_drained_at_first_pre_step() {
    let host = Host::new(vec![]).await;
    let (_gate, hook) = gate(&host, "held");
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("held"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    yield_a_while().await;
    assert_eq!(host.model.requests().len(), 0);
    host.manager.dispose_all().await.unwrap();
    let notice = host.parent.inbox().next_step;
    assert_eq!(notice.len(), 1);
    assert_eq!(
        block_texts(&notice[0].content),
        vec![
            format!("Background subagent {child_id} was stopped before it finished."),
            "It left no closing message.".to_owned()
        ]
    );
    assert_eq!(host.ends()[0].stop_reason, StopReason::Aborted);
    drop(hook);
    host.finish().await;
}

/// spec: CONT-34 — a selected drain with a duplicated id cancels the target with cause
/// `parent`, releases the target and its grandchild, and leaves the sibling.
/// spec: CONT-36 — a selected drain through another live parent rejects `UNAUTHORIZED` and
/// leaves the target.
/// spec: CONT-37 — a selected drain through a stale parent object rejects `UNAUTHORIZED` even
/// with an empty id list.
#[tokio::test(start_paused = true)]
async fn cont_34_36_37_selected_drain() {
    let mut host = Host::new(vec![
        ScriptEntry::hang(),
        ScriptEntry::hang(),
        ScriptEntry::hang(),
        chunks::text("parent ack").into(),
    ])
    .await;
    let stranger = host.other_agent("stranger").await;
    let stale_handle = host
        .runtime
        .create(CreateAgentOptions::new(SessionId::from("stale")))
        .await
        .unwrap();
    let stale = stale_handle.agent().clone();
    stale_handle.dispose().await;
    let (target_id, _) = host.manager.start_continuable(host.spec("target")).await.unwrap();
    let target = host.get(&target_id).unwrap();
    let spec = ContinuableStartSpec::new("spawn", "deeper", vec![ContentBlock::text("gc")], target.clone());
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let (sibling_id, _) = host
        .manager
        .start_continuable(host.spec("sibling"))
        .await
        .unwrap();
    yield_a_while().await;
    let err = host
        .manager
        .drain_continuable_children(&stranger, std::slice::from_ref(&target_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Unauthorized);
    let err = host
        .manager
        .drain_continuable_children(&stale, &[])
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Unauthorized);
    assert!(host.manager.is_resident(&target_id));
    assert!(turn_end_reasons(&live_log(&target)).is_empty());
    host.manager
        .drain_continuable_children(&host.parent, &[target_id.clone(), target_id.clone()])
        .await
        .unwrap();
    assert!(!host.manager.is_resident(&target_id));
    assert!(!host.manager.is_resident(&gc_id));
    assert!(host.manager.is_resident(&sibling_id));
    let log = host.persisted(&target_id).await;
    assert_eq!(
        turn_end_reasons(&log.events),
        vec![json!({"kind": "aborted", "reason": {"kind": "parent"}})]
    );
    host.finish().await;
}

/// spec: CONT-14 — a fork child's first own turn after the descriptor is numbered 2 (after one
/// inherited turn) and its header has `seedLength > 0`.
#[tokio::test(start_paused = true)]
async fn cont_14_fork_child_continues_the_turn_numbering() {
    let host = Host::new(vec![
        chunks::text("parent first").into(),
        chunks::text("fork answer").into(),
        chunks::text("parent ack").into(),
    ])
    .await;
    let fork = host
        .service
        .register_provider(TestProvider::continuable("fork"))
        .unwrap();
    host.parent.followup(agent::Message::user_text("hello")).unwrap();
    host.parent.when_idle().await;
    let mut spec = host.spec("forked task");
    spec.provider = "fork".into();
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let log = host.persisted(&child_id).await;
    let seed_length = log.header.seed_length.expect("seedLength") as usize;
    assert!(seed_length > 0);
    let own = &log.events[seed_length..];
    let names = type_names(own);
    let descriptor = names
        .iter()
        .position(|n| n == "subagent/descriptor")
        .expect("descriptor");
    let first_turn = names.iter().position(|n| n == "turn/start").expect("turn");
    assert!(descriptor < first_turn, "{names:?}");
    assert_eq!(own[first_turn].data.to_data()["turn"], json!(2));
    assert_eq!(host.starts()[0].provider, "fork");
    drop(fork);
    host.finish().await;
}

/// A provider whose continuable preparation panics (third-party code) fails the start with
/// `PROVIDER_FAILED` naming the panic, instead of unwinding into the caller; nothing was
/// created, reserved or left locked, and the parent may start another child at once.
#[tokio::test(start_paused = true)]
async fn a_panicking_preparation_is_a_provider_failure_and_leaves_nothing() {
    let host = Host::new(vec![chunks::text("child answer").into()]).await;
    let panicky = host
        .service
        .register_provider(TestProvider::continuable("panicky"))
        .unwrap();
    let mut spec = host.spec("task");
    spec.provider = "panicky".into();
    let started =
        futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(host.manager.start_continuable(spec)))
            .await
            .expect("the panic does not reach the caller");
    let err = started.expect_err("a failed preparation");
    assert_eq!(err.code(), SubagentErrorCode::ProviderFailed);
    assert!(
        err.message().contains("\"panicky\"") && err.message().contains("preparation exploded"),
        "{err}"
    );
    assert!(host.manager.resident().is_empty());
    assert!(host.starts().is_empty(), "no start edge");
    host.delegates_again().await;
    drop(panicky);
    host.finish().await;
}

/// A provider whose continuable preparation returns a seed that is not balanced (here a turn
/// closed over an open step) fails the start with `PROVIDER_FAILED` before anything is created:
/// no agent, no session, no start edge; the parent can delegate again.
#[tokio::test(start_paused = true)]
async fn an_unbalanced_prepared_seed_is_a_provider_failure_and_leaves_nothing() {
    let host = Host::new(vec![chunks::text("child answer").into()]).await;
    let unbalanced = host
        .service
        .register_provider(TestProvider::continuable("unbalanced"))
        .unwrap();
    let agents = host.runtime.list().len();
    let mut spec = host.spec("task");
    spec.provider = "unbalanced".into();
    let err = host
        .manager
        .start_continuable(spec)
        .await
        .expect_err("an unbalanced seed is refused");
    assert_eq!(err.code(), SubagentErrorCode::ProviderFailed);
    assert!(
        err.message().contains("\"unbalanced\"") && err.message().contains("not balanced"),
        "{err}"
    );
    assert_eq!(host.runtime.list().len(), agents, "no child agent was created");
    assert!(host.manager.resident().is_empty());
    assert!(host.starts().is_empty(), "no start edge");
    assert!(host.model.requests().is_empty(), "no model call");
    host.delegates_again().await;
    drop(unbalanced);
    host.finish().await;
}

/// spec: CONT-33 — a scoped drain of a continuable child as root cancels only the grandchild,
/// keeps the root, and closes admission under it.
#[tokio::test(start_paused = true)]
async fn cont_33_scoped_drain_of_a_continuable_root() {
    let host = Host::new(vec![ScriptEntry::hang(), ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).unwrap();
    let spec = ContinuableStartSpec::new("spawn", "deeper", vec![ContentBlock::text("gc")], child.clone());
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    yield_a_while().await;
    host.manager
        .drain_continuable_descendants(std::slice::from_ref(&child))
        .await
        .unwrap();
    assert!(!host.manager.is_resident(&gc_id));
    assert!(host.manager.is_resident(&child_id));
    assert!(Arc::ptr_eq(&child, &host.get(&child_id).unwrap()));
    assert_eq!(
        child.status(),
        AgentStatus::Running,
        "the root's own turn goes on"
    );
    assert!(turn_end_reasons(&live_log(&child)).is_empty());
    let spec = ContinuableStartSpec::new("spawn", "again", vec![ContentBlock::text("gc2")], child.clone());
    let err = host.manager.start_continuable(spec).await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining);
    assert!(err.to_string().contains(child_id.as_str()), "{err}");
    // The grandchild's notice reached its closing parent without a wake.
    assert_eq!(
        child
            .inbox()
            .next_step
            .iter()
            .filter(|m| m.source.kind() == "subagent-settled")
            .count(),
        1
    );
    host.finish().await;
}

/// spec: CONT-40 — a scoped drain with a stale root object does not close admission for the
/// live same-id parent.
#[tokio::test(start_paused = true)]
async fn cont_40_stale_root_does_not_close_admission() {
    let mut host = Host::new(vec![chunks::text("done").into()]).await;
    let stale_handle = host
        .runtime
        .create(CreateAgentOptions::new(SessionId::from("p2")))
        .await
        .unwrap();
    let stale = stale_handle.agent().clone();
    stale_handle.dispose().await;
    // The live same-id parent is the persisted session resumed. (Creating `p2` again would
    // collide with the persisted log, unless both headers happened to carry the same
    // millisecond — a test must not depend on that.)
    let live_handle = host
        .runtime
        .resume(agent::ResumeAgentOptions {
            session_id: SessionId::from("p2"),
            agent_options: routed(),
            signal: None,
            setup: None,
            owner: None,
        })
        .await
        .unwrap();
    let live = live_handle.agent().clone();
    host.extra.push(live_handle);
    host.manager
        .drain_continuable_descendants(std::slice::from_ref(&stale))
        .await
        .unwrap();
    let spec = ContinuableStartSpec::new("spawn", "label", vec![ContentBlock::text("task")], live);
    host.manager.start_continuable(spec).await.unwrap();
    host.settle().await;
    host.finish().await;
}

/// spec: CONT-79 — scoped drain: the parent gets the "was stopped…" notice without a wake (an
/// inbox splice is logged, no `turn/start`, the parent stays idle).
#[tokio::test(start_paused = true)]
async fn cont_79_scoped_drain_notice_is_injected() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    yield_a_while().await;
    host.manager
        .drain_continuable_descendants(std::slice::from_ref(&host.parent))
        .await
        .unwrap();
    assert!(!host.manager.is_resident(&child_id));
    assert_eq!(host.parent.status(), AgentStatus::Idle);
    let inbox = host.parent.inbox();
    assert_eq!(inbox.next_step.len(), 1);
    assert_eq!(
        block_texts(&inbox.next_step[0].content)[0],
        format!("Background subagent {child_id} was stopped before it finished.")
    );
    let names = type_names(&live_log(&host.parent));
    assert!(names.iter().any(|n| n == "agent/inbox/spliced"), "{names:?}");
    assert!(!names.iter().any(|n| n == "turn/start"), "{names:?}");
    host.finish().await;
}

/// spec: CONT-38 — a scoped drain finds a continuable descendant whose intermediate one-shot
/// parent already left the registry.
#[tokio::test(start_paused = true)]
async fn cont_38_scoped_drain_reaches_past_a_departed_intermediate() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let mid_handle = host
        .runtime
        .create(CreateAgentOptions {
            meta: SessionMeta {
                parent_session: Some(SessionId::from("parent")),
                origin: Some(agent::Origin::Subagent),
                delegation_depth: Some(1),
                ..SessionMeta::default()
            },
            agent_options: routed(),
            ..CreateAgentOptions::new(SessionId::from("mid"))
        })
        .await
        .unwrap();
    let mid = mid_handle.agent().clone();
    let spec = ContinuableStartSpec::new("spawn", "deep", vec![ContentBlock::text("task")], mid);
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    mid_handle.dispose().await;
    assert!(host.get(&SessionId::from("mid")).is_none());
    yield_a_while().await;
    host.manager
        .drain_continuable_descendants(std::slice::from_ref(&host.parent))
        .await
        .unwrap();
    assert!(!host.manager.is_resident(&child_id));
    assert!(host.get(&child_id).is_none());
    host.finish().await;
}

/// spec: CONT-43 — a manager drain begun at `subagent/start` makes the start reject `DRAINING`
/// with no inbox insertion and only the parent left.
/// spec: CONT-83 — a start refused by a drain at `subagent/start` produces no notice.
#[tokio::test(start_paused = true)]
async fn cont_43_manager_drain_at_the_start_edge() {
    let host = Host::new(vec![]).await;
    let manager = host.manager.clone();
    let drains = Arc::new(Mutex::new(Vec::new()));
    let pending = drains.clone();
    let listener = host.service.events().on(move |e: &SubagentEvent| {
        if matches!(e, SubagentEvent::Start(_)) {
            pending.lock().push(manager.dispose_all());
        }
        Ok(())
    });
    let inserted = Arc::new(AtomicUsize::new(0));
    let count = inserted.clone();
    let inbox = host.runtime.services().agent_events.on(move |e: &AgentEvent| {
        if let AgentEvent::InboxInserted { agent, .. } = e
            && agent.as_str() != "parent"
        {
            count.fetch_add(1, AtomicOrdering::SeqCst);
        }
        Ok(())
    });
    let err = host
        .manager
        .start_continuable(host.spec("task"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining);
    let drain = drains.lock().pop().expect("drain begun");
    drain.await.unwrap();
    assert_eq!(inserted.load(AtomicOrdering::SeqCst), 0);
    assert_eq!(host.agent_count(), 1);
    assert!(
        notices(&host.parent).is_empty() && host.parent.inbox().is_empty(),
        "no notice"
    );
    drop((listener, inbox));
    host.finish().await;
}

/// spec: CONT-87 — a follow-up with a pre-aborted token to a settled child rejects and is not
/// logged.
#[tokio::test(start_paused = true)]
async fn cont_87_preaborted_followup_to_a_settled_child() {
    let host = Host::new(vec![chunks::text("done").into(), chunks::text("ack").into()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let signal = Signal::new();
    signal.cancel(agent::CancelCause::User);
    let err = host
        .manager
        .followup_with(
            &host.parent,
            &child_id,
            vec![ContentBlock::text("never")],
            MessageSource::User,
            &signal,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Cancelled);
    assert!(host.get(&child_id).is_none());
    assert_eq!(host.starts().len(), 1, "no second epoch");
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    host.finish().await;
}

/// spec: CONT-89 — with the Activation entry removed but the agent still live, a follow-up
/// rejects with a `SubagentError` and the live agent is not adopted.
#[tokio::test(start_paused = true)]
async fn cont_89_live_agent_without_activation_is_not_adopted() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).unwrap();
    yield_a_while().await;
    let removed = host.manager.inner.activations.lock().remove(&child_id).unwrap();
    let err = host
        .manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("adopt?")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::NotResumable);
    assert!(!host.manager.is_resident(&child_id));
    assert!(Arc::ptr_eq(&child, &host.get(&child_id).unwrap()));
    assert_eq!(host.starts().len(), 1);
    host.manager
        .inner
        .activations
        .lock()
        .insert(child_id.clone(), removed);
    host.finish().await;
}

/// spec: CONT-13 — cold resume in a fresh runtime of a routeless child leaves the resumed agent
/// with no provider and no model.
#[tokio::test(start_paused = true)]
async fn cont_13_routeless_cold_resume_in_a_fresh_runtime() {
    let host = Host::build(vec![], true, true, AgentOptions::default()).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let store = host.store.clone();
    host.finish().await;
    // A fresh runtime over the same store, with the parent resumed there.
    let runtime = RuntimeBuilder::new().persistence(store.clone()).build();
    let parent_handle = runtime
        .resume(agent::ResumeAgentOptions {
            session_id: SessionId::from("parent"),
            agent_options: AgentOptions::default(),
            signal: None,
            setup: None,
            owner: None,
        })
        .await
        .unwrap();
    let parent = parent_handle.agent().clone();
    let service = SubagentService::new();
    let manager = ContinuationManager::new(service.clone(), runtime.services().clone());
    let options = Arc::new(Mutex::new(None));
    let seen = options.clone();
    let services = runtime.services().clone();
    let target = child_id.clone();
    let listener = service.events().on(move |e: &SubagentEvent| {
        if let SubagentEvent::Start(info) = e
            && info.id == target
        {
            *seen.lock() = services.agents.get(&info.id).map(|a| a.options().clone());
        }
        Ok(())
    });
    manager
        .followup(&parent, &child_id, vec![ContentBlock::text("again")])
        .await
        .unwrap();
    let resumed = options
        .lock()
        .clone()
        .expect("resumed agent seen at its start edge");
    assert_eq!(resumed.provider, None);
    assert_eq!(resumed.model, None);
    manager.dispose_all().await.unwrap();
    parent_handle.dispose().await;
    drop(listener);
    runtime.shutdown().await;
    assert_quiescent(&runtime);
}

/// spec: CONT-44 — a manager drain begun at `agent/created` (before Activation install) makes
/// the start reject `DRAINING`, and the child's disposal is observed before the drain resolves.
#[tokio::test(start_paused = true)]
async fn cont_44_manager_drain_at_agent_created_waits_for_the_materialization() {
    let host = Host::new(vec![]).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let log = order.clone();
    let manager = host.manager.clone();
    let listener = host.runtime.services().agent_events.on(move |e: &AgentEvent| {
        match e {
            AgentEvent::Created { agent } if agent.as_str() == "early" => {
                let drain = manager.dispose_all();
                let log = log.clone();
                tokio::spawn(async move {
                    drain.await.unwrap();
                    log.lock().push("drain resolved".to_owned());
                });
            }
            AgentEvent::Disposed { agent } if agent.as_str() == "early" => {
                log.lock().push("child disposed".to_owned());
            }
            _ => {}
        }
        Ok(())
    });
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("early"));
    let err = host.manager.start_continuable(spec).await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining);
    yield_a_while().await;
    assert_eq!(*order.lock(), vec!["child disposed", "drain resolved"]);
    assert_eq!(host.agent_count(), 1);
    assert!(host.starts().is_empty() && host.ends().is_empty());
    drop(listener);
    host.finish().await;
}

/// spec: CONT-39 — a scoped drain waits for an in-flight materialization below the root; that
/// start then rejects `DRAINING` and its child is removed.
#[tokio::test(start_paused = true)]
async fn cont_39_scoped_drain_waits_for_an_inflight_materialization() {
    let host = Host::new(vec![]).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let log = order.clone();
    let manager = host.manager.clone();
    let root = host.parent.clone();
    let listener = host.runtime.services().agent_events.on(move |e: &AgentEvent| {
        match e {
            AgentEvent::Created { agent } if agent.as_str() == "below" => {
                let drain = manager.drain_continuable_descendants(std::slice::from_ref(&root));
                let log = log.clone();
                tokio::spawn(async move {
                    drain.await.unwrap();
                    log.lock().push("drain resolved".to_owned());
                });
            }
            AgentEvent::Disposed { agent } if agent.as_str() == "below" => {
                log.lock().push("child disposed".to_owned());
            }
            _ => {}
        }
        Ok(())
    });
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("below"));
    let err = host.manager.start_continuable(spec).await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining);
    assert!(err.to_string().contains("below parent \"parent\""), "{err}");
    yield_a_while().await;
    assert_eq!(*order.lock(), vec!["child disposed", "drain resolved"]);
    assert!(host.get(&SessionId::from("below")).is_none());
    drop(listener);
    host.finish().await;
}

/// spec: CONT-93 — starting a grandchild under a parent Activation whose disposal is marked
/// open rejects `ACTIVATION_CLOSING` and leaves no new agent.
#[tokio::test(start_paused = true)]
async fn cont_93_closing_parent_activation_cannot_own_a_new_child() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).unwrap();
    yield_a_while().await;
    let activation = host
        .manager
        .inner
        .activations
        .lock()
        .get(&child_id)
        .cloned()
        .unwrap();
    let disposal = host.manager.inner.open_disposal(&activation);
    let before = host.agent_count();
    let spec = ContinuableStartSpec::new("spawn", "late", vec![ContentBlock::text("gc")], child);
    let err = host.manager.start_continuable(spec).await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ActivationClosing);
    assert!(host.agent_count() <= before);
    disposal.await.unwrap();
    assert_eq!(host.agent_count(), 1);
    host.finish().await;
}

/// spec: CONT-62 — a synchronous inbox observer at follow-up insertion sees the child still
/// registered; the child makes exactly two model requests and logs the queued message.
#[tokio::test(start_paused = true)]
async fn cont_62_insertion_observer_sees_a_registered_child() {
    let host = Host::new(by_session(10)).await;
    let (child_gate, hook) = gate(&host, "observed");
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("observed"));
    let (child_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let services = host.runtime.services().clone();
    let listener = host
        .runtime
        .services()
        .agent_events
        .on_scoped(child_id.clone(), move |e: &AgentEvent| {
            if let AgentEvent::InboxInserted { agent, .. } = e {
                sink.lock().push(services.agents.get(agent).is_some());
            }
            Ok(())
        });
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("queued")])
        .await
        .unwrap();
    assert_eq!(*seen.lock(), vec![true]);
    child_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let child_requests = host
        .model
        .requests()
        .iter()
        .filter(|r| r.session_id.as_ref() == Some(&child_id))
        .count();
    assert_eq!(child_requests, 2);
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task", "queued"]);
    drop((listener, hook));
    host.finish().await;
}

/// What a [`StepRule`] does with the n-th step (0-based) of its agent.
#[derive(Clone, Copy)]
enum StepAction {
    Pass,
    /// Wait until the step's signal is cancelled, then pass (the driver sees the cancellation).
    HoldUntilCancelled,
    Fail,
    Reject,
}

struct StepRule {
    steps: AtomicUsize,
    rule: fn(usize) -> StepAction,
}

#[async_trait]
impl agent::PreStepInterceptor for StepRule {
    async fn pre_step(
        &self,
        step: agent::PreStep<'_>,
        proposed: agent::PreStepDecision,
    ) -> Result<agent::PreStepDecision, agent::BoxError> {
        let n = self.steps.fetch_add(1, AtomicOrdering::SeqCst);
        match (self.rule)(n) {
            StepAction::Pass => Ok(proposed),
            StepAction::HoldUntilCancelled => {
                step.signal.cancelled().await;
                Ok(proposed)
            }
            StepAction::Fail => Err("pre-step failure".into()),
            StepAction::Reject => Ok(agent::PreStepDecision::Reject),
        }
    }
}

fn step_rule(host: &Host, id: &str, rule: fn(usize) -> StepAction) -> agent::Registration {
    host.runtime.services().pre_step.add(
        Some(SessionId::from(id)),
        Arc::new(StepRule {
            steps: AtomicUsize::new(0),
            rule,
        }),
    )
}

async fn start_reserved(host: &Host, id: &str) -> SessionId {
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from(id));
    host.manager.start_continuable(spec).await.unwrap().0
}

/// spec: CONT-71 — an ancestor interrupt at the first pre-step: "was stopped…" plus no closing
/// message.
#[tokio::test(start_paused = true)]
async fn cont_71_ancestor_interrupt_at_the_first_pre_step() {
    let host = Host::new(by_session(10)).await;
    let hook = step_rule(&host, "held", |_| StepAction::HoldUntilCancelled);
    let child_id = start_reserved(&host, "held").await;
    yield_a_while().await;
    host.manager
        .interrupt(
            &child_id,
            &super::InterruptAuthority::Ancestor {
                agent: host.parent.clone(),
            },
        )
        .unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        block_texts(&notices[0].content),
        vec![
            format!("Background subagent {child_id} was stopped before it finished."),
            "It left no closing message.".to_owned()
        ]
    );
    drop(hook);
    host.finish().await;
}

/// spec: CONT-69 — a later turn held at pre-step and drained: "was stopped before it
/// finished." plus the earlier answer.
#[tokio::test(start_paused = true)]
async fn cont_69_later_turn_held_and_drained() {
    let host = Host::new(by_session(10)).await;
    let hook = step_rule(&host, "later", |n| {
        if n == 0 {
            StepAction::Pass
        } else {
            StepAction::HoldUntilCancelled
        }
    });
    let child_id = start_reserved(&host, "later").await;
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("more")])
        .await
        .unwrap();
    yield_a_while().await;
    assert!(host.manager.is_resident(&child_id));
    host.manager.dispose_all().await.unwrap();
    let inbox = host.parent.inbox().next_step;
    let notice = inbox
        .iter()
        .find(|m| m.source.kind() == "subagent-settled")
        .expect("notice");
    assert_eq!(
        block_texts(&notice.content),
        vec![
            format!("Background subagent {child_id} was stopped before it finished."),
            "Its closing message:".to_owned(),
            "later reply".to_owned()
        ]
    );
    drop(hook);
    host.finish().await;
}

/// spec: CONT-68 — a later turn failing at pre-step with an error: "failed before it
/// finished." plus the earlier answer; the swallowed follow-up is not logged.
#[tokio::test(start_paused = true)]
async fn cont_68_later_turn_failing_at_pre_step() {
    let host = Host::new(by_session(10)).await;
    let hook = step_rule(&host, "failing", |n| {
        if n == 0 {
            StepAction::Pass
        } else {
            StepAction::Fail
        }
    });
    let child_id = start_reserved(&host, "failing").await;
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("swallowed")])
        .await
        .unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        block_texts(&notices[0].content),
        vec![
            format!("Background subagent {child_id} failed before it finished."),
            "Its closing message:".to_owned(),
            "failing reply".to_owned()
        ]
    );
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    drop(hook);
    host.finish().await;
}

/// spec: CONT-97 — interrupting a child never cancels its running grandchild, which completes;
/// the child stays resident until then.
#[tokio::test(start_paused = true)]
async fn cont_97_interrupt_spares_the_grandchild() {
    let host = Host::new(by_session(10)).await;
    let child_hook = step_rule(&host, "mid", |_| StepAction::HoldUntilCancelled);
    let (gc_gate, gc_hook) = gate(&host, "leaf");
    let child_id = start_reserved(&host, "mid").await;
    let child = host.get(&child_id).unwrap();
    let mut spec =
        ContinuableStartSpec::new("spawn", "deeper", vec![ContentBlock::text("gc")], child.clone());
    spec.child_id = Some(SessionId::from("leaf"));
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    yield_a_while().await;
    host.manager
        .interrupt(
            &child_id,
            &super::InterruptAuthority::User {
                parent_session_id: SessionId::from("parent"),
            },
        )
        .unwrap();
    child.when_idle().await;
    yield_a_while().await;
    assert!(host.manager.is_resident(&child_id), "waiting on its grandchild");
    assert!(host.manager.is_resident(&gc_id));
    drop(child_hook);
    gc_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let ends = host.ends();
    let gc_end = ends.iter().find(|e| e.info.id == gc_id).expect("grandchild end");
    assert_eq!(gc_end.stop_reason, StopReason::Completed);
    let order: Vec<&SessionId> = ends.iter().map(|e| &e.info.id).collect();
    assert_eq!(order, vec![&gc_id, &child_id]);
    drop(gc_hook);
    host.finish().await;
}

/// spec: CONT-53 — a resumed epoch whose prompt is rejected pre-step reports no message (not the
/// previous epoch's) and `refusal`.
#[tokio::test(start_paused = true)]
async fn cont_53_resumed_epoch_refused_reports_no_message() {
    let host = Host::new(by_session(10)).await;
    let hook = step_rule(&host, "second", |n| {
        if n == 0 {
            StepAction::Pass
        } else {
            StepAction::Reject
        }
    });
    let child_id = start_reserved(&host, "second").await;
    host.settle().await;
    host.parent.when_idle().await;
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("again")])
        .await
        .unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let ends = host.ends();
    assert_eq!(ends.len(), 2);
    assert_eq!(ends[0].stop_reason, StopReason::Completed);
    assert_eq!(
        ends[0].last_assistant_message.as_deref().map(block_texts),
        Some(vec!["second reply".to_owned()])
    );
    assert_eq!(ends[1].stop_reason, StopReason::Refusal);
    assert_eq!(ends[1].last_assistant_message, None);
    drop(hook);
    host.finish().await;
}

/// spec: CONT-80 — a notice delivered to a closing host parent is cancelled unread when the
/// parent is disposed; the resumed parent has no pending notice; the persisted log shows one
/// insert splice then one removal splice.
#[tokio::test(start_paused = true)]
async fn cont_80_notice_to_a_closing_parent_is_cancelled_unread() {
    let mut host = Host::new(vec![ScriptEntry::hang()]).await;
    host.manager.start_continuable(host.spec("task")).await.unwrap();
    yield_a_while().await;
    host.manager.dispose_all().await.unwrap();
    assert_eq!(host.parent.inbox().next_step.len(), 1);
    host.parent_handle.take().unwrap().dispose().await;
    let log = host.persisted(&SessionId::from("parent")).await;
    let splices: Vec<(usize, bool)> = log
        .events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::InboxSpliced(splice) => Some((splice.inserted.len(), splice.is_cancellation())),
            _ => None,
        })
        .collect();
    assert_eq!(splices, vec![(1, false), (0, true)]);
    assert!(!texts(&log.events).iter().any(|t| t.contains("was stopped")));
    let resumed = host
        .runtime
        .resume(agent::ResumeAgentOptions {
            session_id: SessionId::from("parent"),
            agent_options: routed(),
            signal: None,
            setup: None,
            owner: None,
        })
        .await
        .unwrap();
    assert!(resumed.agent().inbox().is_empty());
    resumed.dispose().await;
    host.finish().await;
}

/// spec: CONT-52 — an epoch ending with a tool-only `max-tokens` step reports `max-tokens` and
/// the earlier non-empty message (text plus tool-call block, no tool result).
#[tokio::test(start_paused = true)]
async fn cont_52_tool_only_max_tokens_step_keeps_the_earlier_message() {
    let host = Host::new(vec![
        chunks::text_and_tool_call("looking", "call-1", "shell", json!({})).into(),
        chunks::max_tokens_tool_call("call-2", "shell", "{\"cmd\": \"l").into(),
        chunks::text("ack").into(),
    ])
    .await;
    let tool = host
        .runtime
        .services()
        .tools
        .register(
            None,
            agent::ToolDefinition {
                name: "shell".into(),
                description: "run a command".into(),
                parameters: json!({"type": "object"}),
                concurrency_safe: false,
                handler: Arc::new(NoopTool),
            },
        )
        .unwrap();
    host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::MaxTokens);
    let message = ends[0].last_assistant_message.clone().expect("earlier message");
    assert_eq!(message.len(), 2, "{message:?}");
    assert_eq!(visible_text(&message[..1]), "looking");
    assert!(matches!(message[1], ContentBlock::ToolCall { .. }), "{message:?}");
    drop(tool);
    host.finish().await;
}

/// spec: CONT-59 — a delivery cancelled from its own insertion observer does not pin the
/// Activation; it settles without a drain and the message is not logged.
#[tokio::test(start_paused = true)]
async fn cont_59_delivery_cancelled_at_insertion_does_not_pin() {
    let host = Host::new(by_session(10)).await;
    let (child_gate, hook) = gate(&host, "cancelling");
    let child_id = start_reserved(&host, "cancelling").await;
    let services = host.runtime.services().clone();
    let armed = Arc::new(AtomicUsize::new(1));
    let listener = host
        .runtime
        .services()
        .agent_events
        .on_scoped(child_id.clone(), move |e: &AgentEvent| {
            if let AgentEvent::InboxInserted { agent, message } = e
                && armed.fetch_sub(1, AtomicOrdering::SeqCst) == 1
                && let Some(child) = services.agents.get(agent)
            {
                child.remove_pending(message)?;
            }
            Ok(())
        });
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("cancelled")])
        .await
        .unwrap();
    child_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert_eq!(host.ends().len(), 1);
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    drop((listener, hook));
    host.finish().await;
}

/// spec: CONT-60 — a cancel during a second delivery's admission discards both queued messages
/// and empties `accepted`; the child settles.
#[tokio::test(start_paused = true)]
async fn cont_60_cancel_during_second_delivery_discards_both() {
    let host = Host::new(by_session(10)).await;
    let hook = step_rule(&host, "cancelled", |_| StepAction::HoldUntilCancelled);
    let child_id = start_reserved(&host, "cancelled").await;
    yield_a_while().await;
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("one")])
        .await
        .unwrap();
    let services = host.runtime.services().clone();
    let armed = Arc::new(AtomicUsize::new(1));
    let listener = host
        .runtime
        .services()
        .agent_events
        .on_scoped(child_id.clone(), move |e: &AgentEvent| {
            if let AgentEvent::InboxInserted { agent, .. } = e
                && armed.fetch_sub(1, AtomicOrdering::SeqCst) == 1
                && let Some(child) = services.agents.get(agent)
            {
                child.cancel(agent::CancelCause::User, agent::CancelOptions::default());
            }
            Ok(())
        });
    host.manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("two")])
        .await
        .unwrap();
    let activation = host.manager.inner.activations.lock().get(&child_id).cloned();
    drop(hook);
    host.settle().await;
    host.parent.when_idle().await;
    if let Some(activation) = activation {
        assert!(activation.is_settled() || activation.disposal().is_some());
    }
    let log = host.persisted(&child_id).await;
    let logged = texts(&log.events);
    assert!(!logged.iter().any(|t| t == "one" || t == "two"), "{logged:?}");
    assert_eq!(host.ends().len(), 1);
    assert_eq!(host.ends()[0].stop_reason, StopReason::Aborted);
    drop(listener);
    host.finish().await;
}

/// Holds the first step of the agents it is scoped to until their turn is cancelled, and records
/// — synchronously, inside the cancel — whose turn it was and how many flushes that child's
/// session had seen by then.
struct CancelRecorder {
    order: CancelOrder,
    store: Arc<MemoryStore>,
}

#[async_trait]
impl agent::PreStepInterceptor for CancelRecorder {
    async fn pre_step(
        &self,
        step: agent::PreStep<'_>,
        proposed: agent::PreStepDecision,
    ) -> Result<agent::PreStepDecision, agent::BoxError> {
        let order = self.order.clone();
        let store = self.store.clone();
        let id = step.agent.id().clone();
        let _listener = step.signal.on_cancel(move || {
            let flushes = store.flush_count(&id);
            order.lock().push((id.as_str().to_owned(), flushes));
        });
        step.signal.cancelled().await;
        Ok(proposed)
    }
}

/// What [`CancelRecorder`]s saw, in order: (agent id, that session's flush count at the cancel).
type CancelOrder = Arc<Mutex<Vec<(String, u64)>>>;

/// Records the cancels of the turns of `ids` (each held at its first step until cancelled).
fn record_cancels(host: &Host, ids: &[&str]) -> (CancelOrder, Vec<agent::Registration>) {
    let order = Arc::new(Mutex::new(Vec::new()));
    let registrations = ids
        .iter()
        .map(|id| {
            host.runtime.services().pre_step.add(
                Some(SessionId::from(*id)),
                Arc::new(CancelRecorder {
                    order: order.clone(),
                    store: host.store.clone(),
                }),
            )
        })
        .collect();
    (order, registrations)
}

fn cancelled_ids(order: &Mutex<Vec<(String, u64)>>) -> Vec<String> {
    order.lock().iter().map(|(id, _)| id.clone()).collect()
}

/// spec: CONT-6 — aborting the caller's token inside the child's creation window (at
/// `agent/created`, before publication) rejects the start and leaves only the parent
/// registered: no Activation, no lifecycle edge, no model request, no notice.
#[tokio::test(start_paused = true)]
async fn cont_6_abort_in_the_creation_window_rolls_back() {
    let host = Host::new(vec![]).await;
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("early"));
    let signal = spec.signal.clone();
    let listener = host.runtime.services().agent_events.on(move |e: &AgentEvent| {
        if matches!(e, AgentEvent::Created { agent } if agent.as_str() == "early") {
            signal.cancel(agent::CancelCause::User);
        }
        Ok(())
    });
    let err = host.manager.start_continuable(spec).await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Cancelled, "{err}");
    yield_a_while().await;
    let ids: Vec<SessionId> = AgentRuntime::list(&host.runtime)
        .iter()
        .map(|a| a.id().clone())
        .collect();
    assert_eq!(ids, vec![SessionId::from("parent")]);
    assert!(host.manager.resident().is_empty());
    assert!(host.starts().is_empty() && host.ends().is_empty());
    assert_eq!(host.model.requests().len(), 0);
    assert!(notices(&host.parent).is_empty());
    drop(listener);
    host.finish().await;
}

/// spec: CONT-32 — a scoped drain of `parent`: its synchronous cancels are exactly
/// [child, grandchild]; the sibling forest (under another parent) stays resident and accepts a
/// follow-up; new starts and follow-ups under the drained parent reject `DRAINING`; two
/// concurrent drains both resolve; target and grandchild are gone afterwards; the root stays
/// closed after its descendants are gone; the sibling is untouched.
#[tokio::test(start_paused = true)]
async fn cont_32_scoped_drain_spares_the_sibling_forest() {
    let mut host = Host::new(by_session(12)).await;
    let sibling_parent = host.other_agent("sibling-parent").await;
    let (order, recorders) = record_cancels(&host, &["target", "gc"]);
    let (open_sibling, sibling_gate) = gate(&host, "sibling");
    let target_id = start_reserved(&host, "target").await;
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "sib",
        vec![ContentBlock::text("task")],
        sibling_parent.clone(),
    );
    spec.child_id = Some(SessionId::from("sibling"));
    let (sibling_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let target = host.get(&target_id).unwrap();
    let sibling = host.get(&sibling_id).unwrap();
    let mut spec =
        ContinuableStartSpec::new("spawn", "deeper", vec![ContentBlock::text("gc")], target.clone());
    spec.child_id = Some(SessionId::from("gc"));
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    yield_a_while().await;
    assert!(order.lock().is_empty());

    let drained = host
        .manager
        .drain_continuable_descendants(std::slice::from_ref(&host.parent));
    let converged = host
        .manager
        .drain_continuable_descendants(std::slice::from_ref(&host.parent));
    assert_eq!(
        cancelled_ids(&order),
        vec!["target", "gc"],
        "synchronous, child first"
    );
    assert!(Arc::ptr_eq(&target, &host.get(&target_id).unwrap()));
    assert!(host.get(&gc_id).is_some());
    assert!(Arc::ptr_eq(&sibling, &host.get(&sibling_id).unwrap()));
    host.manager
        .followup(
            &sibling_parent,
            &sibling_id,
            vec![ContentBlock::text("still live")],
        )
        .await
        .expect("the sibling forest still accepts work");
    let err = host
        .manager
        .start_continuable(host.spec("late"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining, "{err}");
    let err = host
        .manager
        .followup(&host.parent, &target_id, vec![ContentBlock::text("too late")])
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining, "{err}");

    let (first, second) = futures::join!(drained, converged);
    first.unwrap();
    second.unwrap();
    assert!(host.get(&target_id).is_none() && host.get(&gc_id).is_none());
    assert!(!host.manager.is_resident(&target_id) && !host.manager.is_resident(&gc_id));
    let err = host
        .manager
        .start_continuable(host.spec("later"))
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        SubagentErrorCode::Draining,
        "the root stays closed: {err}"
    );
    assert!(Arc::ptr_eq(&sibling, &host.get(&sibling_id).unwrap()));
    assert!(host.manager.is_resident(&sibling_id));
    assert_eq!(
        cancelled_ids(&order),
        vec!["target", "gc"],
        "nothing else was cancelled"
    );

    open_sibling.send(true).unwrap();
    host.settle().await;
    sibling_parent.when_idle().await;
    let log = host.persisted(&sibling_id).await;
    assert_eq!(texts(&log.events), vec!["task", "still live"]);
    assert_eq!(
        turn_end_reasons(&log.events)
            .iter()
            .map(|r| r["kind"].clone())
            .collect::<Vec<_>>(),
        vec![json!("completed"); turn_end_reasons(&log.events).len()]
    );
    drop((recorders, sibling_gate));
    host.finish().await;
}

/// spec: CONT-45 — a follow-up that reached its admission point before a manager drain
/// resolves with an id, and its inbox insertion is observed before the drain's cancel.
/// spec: CONT-46 — that accepted but still queued follow-up is absent from the persisted log.
#[tokio::test(start_paused = true)]
async fn cont_45_admitted_followup_is_inserted_before_the_drain_cancels() {
    let host = Host::new(by_session(4)).await;
    let (order, recorders) = record_cancels(&host, &["held"]);
    let child_id = start_reserved(&host, "held").await;
    yield_a_while().await;
    let inserted = order.clone();
    let listener = host
        .runtime
        .services()
        .agent_events
        .on_scoped(child_id.clone(), move |e: &AgentEvent| {
            if matches!(e, AgentEvent::InboxInserted { .. }) {
                inserted.lock().push(("enqueue".to_owned(), 0));
            }
            Ok(())
        });
    let mut delivery = Box::pin(host.manager.followup(
        &host.parent,
        &child_id,
        vec![ContentBlock::text("before drain")],
    ));
    // Let the follow-up reach its admission point (admission and insertion are one
    // synchronous span, so one poll may already finish it), then begin the drain.
    let first = futures::poll!(delivery.as_mut());
    let drained = host.manager.dispose_all();
    match first {
        std::task::Poll::Ready(id) => id.expect("admitted before the drain"),
        std::task::Poll::Pending => delivery.as_mut().await.expect("admitted before the drain"),
    };
    drained.await.unwrap();
    assert_eq!(cancelled_ids(&order), vec!["enqueue", "held"]);
    let log = host.persisted(&child_id).await;
    let logged = texts(&log.events);
    assert!(!logged.iter().any(|t| t == "before drain"), "{logged:?}");
    drop((delivery, listener, recorders));
    host.finish().await;
}

/// spec: CONT-57 — the drain cancels the child's running turn before the best-effort final
/// flush: no flush of the child's session happened before the cancel, exactly one after it, and
/// the flushed log holds the aborted `turn/end` the cancel produced.
#[tokio::test(start_paused = true)]
async fn cont_57_cancel_precedes_the_final_flush() {
    let host = Host::new(vec![]).await;
    let (order, recorders) = record_cancels(&host, &["slow"]);
    let child_id = start_reserved(&host, "slow").await;
    yield_a_while().await;
    let before = host.store.flush_count(&child_id);
    host.manager.dispose_all().await.unwrap();
    let recorded = order.lock().clone();
    assert_eq!(
        recorded,
        vec![("slow".to_owned(), before)],
        "cancelled before any final flush"
    );
    assert_eq!(
        host.store.flush_count(&child_id),
        before + 1,
        "one final flush, after the cancel"
    );
    let log = host.persisted(&child_id).await;
    assert_eq!(
        turn_end_reasons(&log.events),
        vec![json!({"kind": "aborted", "reason": {"kind": "parent"}})]
    );
    drop(recorders);
    host.finish().await;
}

/// spec: CONT-91 — once a manager drain has begun a child's teardown, starting a grandchild
/// under that child rejects `DRAINING` and leaves no new agent.
#[tokio::test(start_paused = true)]
async fn cont_91_grandchild_under_a_child_in_teardown_rejects_draining() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).unwrap();
    yield_a_while().await;
    let drained = host.manager.dispose_all();
    let before = host.agent_count();
    let spec = ContinuableStartSpec::new("spawn", "late", vec![ContentBlock::text("gc")], child);
    let err = host.manager.start_continuable(spec).await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Draining, "{err}");
    assert!(host.agent_count() <= before, "no new agent");
    drained.await.unwrap();
    assert_eq!(host.agent_count(), 1);
    assert_eq!(
        host.model.requests().len(),
        1,
        "the grandchild never reached the model"
    );
    host.finish().await;
}

/// spec: CONT-103 — after a scoped drain opened the child's transaction (its one cancel, cause
/// `parent`, issued before the drain call returns), an interrupt is an accepted no-op: it
/// returns at once, issues no cancel of its own (the turn ends with the drain's cause, not the
/// interrupt's `user`), and the drain completes.
#[tokio::test(start_paused = true)]
async fn cont_103_interrupt_after_a_scoped_drain_is_a_no_op() {
    let host = Host::new(vec![]).await;
    let (order, recorders) = record_cancels(&host, &["target"]);
    let child_id = start_reserved(&host, "target").await;
    yield_a_while().await;
    let drained = host
        .manager
        .drain_continuable_descendants(std::slice::from_ref(&host.parent));
    assert_eq!(cancelled_ids(&order), vec!["target"]);
    host.manager
        .interrupt(
            &child_id,
            &super::InterruptAuthority::User {
                parent_session_id: SessionId::from("parent"),
            },
        )
        .expect("an accepted no-op");
    drained.await.unwrap();
    assert_eq!(cancelled_ids(&order), vec!["target"]);
    let log = host.persisted(&child_id).await;
    assert_eq!(
        turn_end_reasons(&log.events),
        vec![json!({"kind": "aborted", "reason": {"kind": "parent"}})]
    );
    drop(recorders);
    host.finish().await;
}

/// A host whose manager composes both policy services (sandbox policy and approval).
async fn policy_host(script: Vec<ScriptEntry>) -> Host {
    let mut host = Host::new(script).await;
    host.manager = ContinuationManager::with_policy(
        host.service.clone(),
        host.runtime.services().clone(),
        crate::policy::PolicyServices::ALL,
    );
    host
}

/// The parent's own (non-delegated) sandbox switch.
fn switch_sandbox(agent: &AgentRef, mode: SandboxMode) {
    crate::policy::test_support::switch_sandbox(agent.session(), mode);
}

/// The `sandbox/mode` and `approval/policy` events: (type, value, source).
fn policy_events(events: &[SessionEvent]) -> Vec<(String, String, Option<String>)> {
    crate::policy::test_support::policy_events(events)
}

fn delegated(kind: &str, value: &str) -> (String, String, Option<String>) {
    (kind.into(), value.into(), Some("delegation".into()))
}

/// spec: INH-1 — a parent override `danger-full-access` and no approval override: at
/// acceptance the continuable child already has sandbox `danger-full-access` and approval
/// `never`; its persisted log has exactly `sandbox/mode` then `approval/policy`, both
/// `source: delegation`; the reloaded log folds to the same policy; the parent still has no
/// approval override; the child's runtime context carries the delegation statement.
#[tokio::test(start_paused = true)]
async fn inh_1_parent_override_and_pinned_approval_reach_the_child() {
    let host = policy_host(vec![chunks::text("child done").into()]).await;
    switch_sandbox(&host.parent, SandboxMode::DangerFullAccess);
    assert_eq!(approval_override(host.parent.session().events().iter()), None);
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    let child = host.get(&child_id).expect("resident at acceptance");
    let live = child.session().events();
    assert_eq!(sandbox_override(live.iter()), Some(SandboxMode::DangerFullAccess));
    assert_eq!(approval_override(live.iter()), Some(ApprovalPolicy::Never));
    host.settle().await;
    let loaded = host.persisted(&child_id).await;
    assert_eq!(
        policy_events(&loaded.events),
        vec![
            delegated("sandbox/mode", "danger-full-access"),
            delegated("approval/policy", "never")
        ]
    );
    assert_eq!(
        sandbox_override(loaded.events.iter()),
        Some(SandboxMode::DangerFullAccess)
    );
    assert_eq!(
        approval_override(loaded.events.iter()),
        Some(ApprovalPolicy::Never)
    );
    assert_eq!(approval_override(host.parent.session().events().iter()), None);
    let context: Vec<String> = loaded
        .events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) if m.source.kind() != "user" => Some(visible_text(&m.content)),
            _ => None,
        })
        .collect();
    assert!(
        context
            .iter()
            .any(|t| t.contains(crate::model_text::SUBAGENT_DELEGATION_CONTEXT)),
        "{context:?}"
    );
    host.parent.when_idle().await;
    host.finish().await;
}

/// spec: INH-2 — the policy is captured when `start_continuable` is called: a parent switch
/// after the call and before the future is awaited does not reach the child (`read-only`).
#[tokio::test(start_paused = true)]
async fn inh_2_policy_is_captured_at_the_call() {
    let host = policy_host(vec![chunks::text("child done").into()]).await;
    switch_sandbox(&host.parent, SandboxMode::ReadOnly);
    let starting = host.manager.start_continuable(host.spec("task"));
    switch_sandbox(&host.parent, SandboxMode::DangerFullAccess);
    let (child_id, _) = starting.await.unwrap();
    host.settle().await;
    let loaded = host.persisted(&child_id).await;
    assert_eq!(
        sandbox_override(host.parent.session().events().iter()),
        Some(SandboxMode::DangerFullAccess)
    );
    assert_eq!(
        sandbox_override(loaded.events.iter()),
        Some(SandboxMode::ReadOnly)
    );
    host.parent.when_idle().await;
    host.finish().await;
}

/// spec: INH-6 — a cold resume after the parent widened replays the child's own persisted
/// snapshot: exactly one delegation `sandbox/mode` (`read-only`) and one `approval/policy`.
#[tokio::test(start_paused = true)]
async fn inh_6_cold_resume_keeps_the_delegation_snapshot() {
    let host = policy_host(by_session(6)).await;
    switch_sandbox(&host.parent, SandboxMode::ReadOnly);
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    switch_sandbox(&host.parent, SandboxMode::DangerFullAccess);
    host.manager
        .followup(
            &host.parent,
            &child_id,
            vec![ContentBlock::text("continue please")],
        )
        .await
        .unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let loaded = host.persisted(&child_id).await;
    assert_eq!(texts(&loaded.events), vec!["task", "continue please"]);
    assert_eq!(
        policy_events(&loaded.events),
        vec![
            delegated("sandbox/mode", "read-only"),
            delegated("approval/policy", "never")
        ]
    );
    assert_eq!(
        sandbox_override(loaded.events.iter()),
        Some(SandboxMode::ReadOnly)
    );
    host.finish().await;
}

/// How a [`FailingChildFlush`] fails a subagent child's flush.
#[derive(Clone, Copy)]
enum FlushFault {
    /// The flush rejects ("disk full").
    Rejects,
    /// The flush panics.
    Panics,
}

/// Persistence over a [`MemoryStore`] whose `flush` of a subagent child's session fails (the
/// parent's flushes succeed).
struct FailingChildFlush(Arc<MemoryStore>, FlushFault);

#[async_trait]
impl SessionPersistence for FailingChildFlush {
    fn create(&self, header: &agent::SessionHeader) -> Result<(), agent::AgentError> {
        SessionPersistence::create(self.0.as_ref(), header)
    }
    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), agent::AgentError> {
        SessionPersistence::append(self.0.as_ref(), id, event)
    }
    async fn flush(&self, id: &SessionId) -> Result<(), agent::AgentError> {
        match (id.as_str(), self.1) {
            ("parent", _) => SessionPersistence::flush(self.0.as_ref(), id).await,
            (_, FlushFault::Rejects) => Err(agent::AgentError::Persistence("disk full".into())),
            (_, FlushFault::Panics) => panic!("the store's flush exploded"),
        }
    }
    async fn list(&self) -> Result<Vec<agent::SessionHeader>, agent::AgentError> {
        SessionPersistence::list(self.0.as_ref()).await
    }
    async fn inspect(&self, id: &SessionId) -> Result<Option<agent::SessionHeader>, agent::AgentError> {
        SessionPersistence::inspect(self.0.as_ref(), id).await
    }
    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, agent::AgentError> {
        SessionPersistence::load(self.0.as_ref(), id).await
    }
}

/// spec: CONT-28 — a child whose final flush succeeds settles (notice, `completed` end edge)
/// and no final-flush warning — no warning at all — is logged.
#[tokio::test(start_paused = true)]
async fn cont_28_a_clean_final_flush_logs_no_warning() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let host = Host::new(vec![chunks::text("done").into(), chunks::text("ack").into()]).await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert!(host.store.flush_count(&child_id) >= 1, "the final flush ran");
    assert_eq!(host.ends().len(), 1);
    assert_eq!(host.ends()[0].stop_reason, StopReason::Completed);
    assert_eq!(notices(&host.parent).len(), 1);
    assert!(warnings.is_empty(), "{:?}", warnings.messages());
    host.finish().await;
}

/// spec: CONT-29 — a failing best-effort final flush is logged as a warning ("best-effort
/// final session flush failed") and does not fail the child: the Activation is released, the
/// parent still gets its notice and the end edge says `completed`.
#[tokio::test(start_paused = true)]
async fn cont_29_a_failing_final_flush_is_logged_and_settles() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let store = Arc::new(MemoryStore::new());
    let persistence: Arc<dyn SessionPersistence> =
        Arc::new(FailingChildFlush(store.clone(), FlushFault::Rejects));
    let host = Host::build_on(
        vec![chunks::text("done").into(), chunks::text("ack").into()],
        store,
        Some(persistence),
        true,
        routed(),
        false,
    )
    .await;
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert!(!host.manager.is_resident(&child_id));
    assert!(host.get(&child_id).is_none());
    assert_eq!(host.ends().len(), 1);
    assert_eq!(host.ends()[0].stop_reason, StopReason::Completed);
    assert_eq!(notices(&host.parent).len(), 1);
    let logged = warnings.messages();
    assert_eq!(
        logged
            .iter()
            .filter(|w| w.contains("best-effort final session flush failed"))
            .count(),
        1,
        "{logged:?}"
    );
    host.finish().await;
}

/// Persistence over a [`MemoryStore`] whose `inspect` of one session, once armed, announces
/// itself and then never finishes (a store stuck on a slow disk).
struct StuckInspect {
    store: Arc<MemoryStore>,
    stuck: Arc<Mutex<Option<SessionId>>>,
    entered: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl SessionPersistence for StuckInspect {
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
        if self.stuck.lock().as_ref() == Some(id) {
            self.entered.notify_one();
            std::future::pending::<()>().await;
        }
        SessionPersistence::inspect(self.store.as_ref(), id).await
    }
    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, agent::AgentError> {
        SessionPersistence::load(self.store.as_ref(), id).await
    }
}

/// spec: CONT-23 — the cold inspection of a follow-up runs under the follow-up's signal: an
/// abort while the store is still reading rejects the follow-up at once with `CANCELLED` naming
/// the abort's cause (it does not wait for the store), and the message is never logged.
#[tokio::test(start_paused = true)]
async fn cont_23_abort_during_cold_inspection_rejects_at_once() {
    let store = Arc::new(MemoryStore::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let stuck = Arc::new(Mutex::new(None));
    let persistence: Arc<dyn SessionPersistence> = Arc::new(StuckInspect {
        store: store.clone(),
        stuck: stuck.clone(),
        entered: entered.clone(),
    });
    let host = Host::build_on(by_session(4), store, Some(persistence), true, routed(), false).await;
    let child_id = start_reserved(&host, "cold").await;
    host.settle().await;
    host.parent.when_idle().await;
    *stuck.lock() = Some(child_id.clone());
    let signal = Signal::new();
    let followup = host.manager.followup_with(
        &host.parent,
        &child_id,
        vec![ContentBlock::text("too late")],
        MessageSource::User,
        &signal,
    );
    let abort = async {
        entered.notified().await;
        signal.cancel(agent::CancelCause::User);
    };
    let (outcome, ()) = tokio::time::timeout(std::time::Duration::from_secs(3600), async {
        tokio::join!(followup, abort)
    })
    .await
    .expect("the follow-up does not wait for the stuck store");
    let err = outcome.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Cancelled, "{err}");
    assert!(err.to_string().contains("User"), "{err}");
    assert!(!host.manager.is_resident(&child_id));
    assert!(host.get(&child_id).is_none());
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    host.finish().await;
}

/// A reserved-id start's persisted-catalog check (spec §2.14.2 step 9, "with the token"; the
/// start's counterpart of CONT-23) runs under the start's signal: an abort while the store is still reading rejects the
/// start at once with `CANCELLED` naming the abort's cause, instead of waiting for the store
/// with the child's lock held; nothing is created, and once the store answers again the same id
/// starts. (The check awaited the store unraced: the aborted start hung as long as the store.)
#[tokio::test(start_paused = true)]
async fn abort_during_a_reserved_starts_catalog_check_rejects_at_once() {
    let store = Arc::new(MemoryStore::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let stuck = Arc::new(Mutex::new(Some(SessionId::from("reserved"))));
    let persistence: Arc<dyn SessionPersistence> = Arc::new(StuckInspect {
        store: store.clone(),
        stuck: stuck.clone(),
        entered: entered.clone(),
    });
    let host = Host::build_on(by_session(4), store, Some(persistence), true, routed(), false).await;
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("reserved"));
    let signal = spec.signal.clone();
    let start = host.manager.start_continuable(spec);
    let abort = async {
        entered.notified().await;
        signal.cancel(agent::CancelCause::User);
    };
    let (outcome, ()) = tokio::time::timeout(std::time::Duration::from_secs(3600), async {
        tokio::join!(start, abort)
    })
    .await
    .expect("the start does not wait for the stuck store");
    let err = outcome.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Cancelled, "{err}");
    assert!(err.to_string().contains("User"), "{err}");
    assert_eq!(host.agent_count(), 1);
    assert!(host.manager.resident().is_empty());
    assert!(host.starts().is_empty());
    *stuck.lock() = None;
    let child_id = start_reserved(&host, "reserved").await;
    host.settle().await;
    assert_eq!(texts(&host.persisted(&child_id).await.events), vec!["task"]);
    host.parent.when_idle().await;
    host.settle().await;
    host.finish().await;
}

/// A follow-up waiting for a child's lock behind another follow-up's cold resume (stuck on a slow
/// store) runs under its own signal too (CONT-23): aborting it rejects it at once with
/// `CANCELLED`, instead of waiting as long as the store with the other follow-up; so does a start
/// reserving the same id; no message is logged. (The wait for the child's lock was not raced with the signal: the aborted follow-up
/// hung until the stuck one finished.)
#[tokio::test(start_paused = true)]
async fn abort_while_waiting_for_the_childs_lock_rejects_at_once() {
    let store = Arc::new(MemoryStore::new());
    let entered = Arc::new(tokio::sync::Notify::new());
    let stuck = Arc::new(Mutex::new(None));
    let persistence: Arc<dyn SessionPersistence> = Arc::new(StuckInspect {
        store: store.clone(),
        stuck: stuck.clone(),
        entered: entered.clone(),
    });
    let host = Host::build_on(by_session(4), store, Some(persistence), true, routed(), false).await;
    let child_id = start_reserved(&host, "cold").await;
    host.settle().await;
    host.parent.when_idle().await;
    *stuck.lock() = Some(child_id.clone());
    let (stuck_signal, waiting_signal) = (Signal::new(), Signal::new());
    let first = host.manager.followup_with(
        &host.parent,
        &child_id,
        vec![ContentBlock::text("stuck")],
        MessageSource::User,
        &stuck_signal,
    );
    let second = async {
        entered.notified().await;
        let waiting = host.manager.followup_with(
            &host.parent,
            &child_id,
            vec![ContentBlock::text("waiting")],
            MessageSource::User,
            &waiting_signal,
        );
        // A start reserving the same id waits for the same lock (spec §2.14.2 step 9).
        let mut spec = host.spec("again");
        spec.child_id = Some(child_id.clone());
        let start_signal = spec.signal.clone();
        let starting = host.manager.start_continuable(spec);
        let abort = async {
            yield_a_while().await;
            waiting_signal.cancel(agent::CancelCause::User);
            start_signal.cancel(agent::CancelCause::User);
        };
        let (outcome, started, ()) = tokio::join!(waiting, starting, abort);
        // Only now is the stuck follow-up let go.
        stuck_signal.cancel(agent::CancelCause::Parent);
        (outcome, started)
    };
    let (first, (second, started)) = tokio::time::timeout(std::time::Duration::from_secs(3600), async {
        tokio::join!(first, second)
    })
    .await
    .expect("the aborted follow-up does not wait for the stuck one");
    let err = second.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Cancelled, "{err}");
    assert!(err.to_string().contains("User"), "{err}");
    let err = started.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Cancelled, "{err}");
    assert_eq!(first.unwrap_err().code(), SubagentErrorCode::Cancelled);
    assert!(!host.manager.is_resident(&child_id));
    assert!(host.get(&child_id).is_none());
    assert_eq!(texts(&host.persisted(&child_id).await.events), vec!["task"]);
    host.finish().await;
}

/// A host runtime whose `resume` holds the resumed agent — already published — until released,
/// before handing the caller its handle: a cold materialization held open.
struct PausingResume {
    inner: Arc<dyn AgentRuntime>,
    resumed: Arc<tokio::sync::Notify>,
    release: tokio::sync::watch::Receiver<bool>,
}

#[async_trait]
impl AgentRuntime for PausingResume {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.inner.create(options).await
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        let handle = self.inner.resume(options).await?;
        self.resumed.notify_one();
        let mut release = self.release.clone();
        let _ = release.wait_for(|released| *released).await;
        Ok(handle)
    }
    delegate_agent_lookups!(inner);
}

/// spec: CONT-47 — replacing the parent (its handle disposed, then the same id resumed as a new
/// agent) while a follow-up's cold materialization is under way makes the follow-up reject
/// `UNAUTHORIZED` ("delivery requires the exact live parent agent"): the message is never logged,
/// the fresh epoch is released again (its end edge pairs its start; no notice), and the
/// replacement parent is never woken.
#[tokio::test(start_paused = true)]
async fn cont_47_parent_replaced_during_cold_materialization() {
    let mut host = Host::new(by_session(4)).await;
    let resumed = Arc::new(tokio::sync::Notify::new());
    let (release, released) = tokio::sync::watch::channel(false);
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(PausingResume {
        inner: services.agents.clone(),
        resumed: resumed.clone(),
        release: released,
    });
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let child_id = start_reserved(&host, "cold").await;
    host.settle().await;
    host.parent.when_idle().await;
    assert_eq!(
        host.model.requests().len(),
        2,
        "the child's answer and the parent's reaction"
    );
    let original = host.parent_handle.take().unwrap();
    let stale = host.parent.clone();
    let delivery = host.manager.followup(
        &stale,
        &child_id,
        vec![ContentBlock::text("must not cross parent replacement")],
    );
    let replace = async {
        resumed.notified().await;
        assert!(
            host.get(&child_id).is_some(),
            "the child is resumed and published"
        );
        original.dispose().await;
        let replacement = host
            .runtime
            .resume(agent::ResumeAgentOptions {
                session_id: SessionId::from("parent"),
                agent_options: routed(),
                signal: None,
                setup: None,
                owner: None,
            })
            .await
            .expect("the same id is live again");
        release.send(true).unwrap();
        replacement
    };
    let (outcome, replacement) = tokio::join!(delivery, replace);
    host.parent = replacement.agent().clone();
    host.parent_handle = Some(replacement);
    assert!(!Arc::ptr_eq(&stale, &host.parent));
    let err = outcome.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::Unauthorized, "{err}");
    assert!(err.to_string().contains("exact live parent"), "{err}");
    assert!(!host.manager.is_resident(&child_id));
    assert!(host.get(&child_id).is_none());
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    let (starts, ends) = (host.starts(), host.ends());
    assert_eq!(starts.len(), 2, "the resumed epoch reached residency");
    assert_eq!(ends.len(), 2);
    assert_eq!(ends[1].info, starts[1]);
    assert_eq!(host.parent.status(), AgentStatus::Idle);
    assert!(host.parent.inbox().next_turn.is_empty() && host.parent.inbox().next_step.is_empty());
    assert_eq!(host.model.requests().len(), 2, "nobody was woken");
    host.finish().await;
}

/// Vetoes every inbox splice that inserts a message `refused` picks: the session log refuses the
/// insertion, so the sender's `send` (`followup`, `steer`, `inject`) fails — an inbox send that
/// throws, on the reference runtime.
struct RefuseInsertion(fn(&agent::Message) -> bool);

impl agent::SessionObserver for RefuseInsertion {
    fn check(&self, _: &agent::Session, candidate: &SessionEvent) -> Result<(), String> {
        match &candidate.data {
            EventData::InboxSpliced(splice) if splice.inserted.iter().any(|m| (self.0)(m)) => {
                Err("synthetic inbox failure".to_owned())
            }
            _ => Ok(()),
        }
    }
}

/// spec: CONT-48 — an inbox send that throws rejects the follow-up with that error (the send's
/// `AgentError` is the rejection's source, its text the rejection's message) and leaves nothing
/// accepted: the message is not logged, and once the running turn ends the child settles on its
/// own — an id left in `accepted` would hold it `running` for ever.
#[tokio::test(start_paused = true)]
async fn cont_48_throwing_inbox_send_leaves_nothing_accepted() {
    let host = Host::new(by_session(10)).await;
    let (child_gate, hook) = gate(&host, "refusing");
    let child_id = start_reserved(&host, "refusing").await;
    let child = host.get(&child_id).unwrap();
    yield_a_while().await;
    assert_eq!(child.status(), AgentStatus::Running);
    child.session().add_observer(Arc::new(RefuseInsertion(|m| {
        visible_text(&m.content) == "throws"
    })));
    let err = host
        .manager
        .followup(&host.parent, &child_id, vec![ContentBlock::text("throws")])
        .await
        .unwrap_err();
    let cause = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<agent::AgentError>())
        .expect("the send's error is the rejection's source");
    assert!(
        matches!(cause, agent::AgentError::Log(agent::LogError::Vetoed { reason, .. })
            if reason == "synthetic inbox failure"),
        "{cause:?}"
    );
    assert_eq!(err.to_string(), cause.to_string());
    assert!(
        host.manager.is_resident(&child_id),
        "the running epoch is untouched"
    );
    assert!(child.inbox().next_turn.is_empty());
    child_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert!(host.get(&child_id).is_none());
    assert_eq!(host.ends().len(), 1);
    assert_eq!(host.ends()[0].stop_reason, StopReason::Completed);
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    drop(hook);
    host.finish().await;
}

/// spec: CONT-82 — a parent send that throws (the parent's log refuses the notice's insertion) is
/// logged as a warning ("settlement notice was not delivered to its parent") and changes nothing
/// else: the child is released and its end edge still says `completed`, with its answer; the
/// parent holds no notice and is not woken.
#[tokio::test(start_paused = true)]
async fn cont_82_a_throwing_parent_send_is_logged_and_settles() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let host = Host::new(vec![chunks::text("the answer").into()]).await;
    host.parent.session().add_observer(Arc::new(RefuseInsertion(|m| {
        m.source.kind() == "subagent-settled"
    })));
    let (child_id, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    assert!(host.get(&child_id).is_none());
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Completed);
    assert_eq!(
        ends[0].last_assistant_message.as_deref().map(block_texts),
        Some(vec!["the answer".to_owned()])
    );
    assert!(notices(&host.parent).is_empty());
    assert_eq!(host.model.requests().len(), 1, "the parent was not woken");
    let logged = warnings.messages();
    assert_eq!(
        logged
            .iter()
            .filter(|w| w.contains("settlement notice was not delivered to its parent"))
            .count(),
        1,
        "{logged:?}"
    );
    host.finish().await;
}

/// spec: CONT-82 — the same with a resident parent Activation: the grandchild's notice, which
/// the child's log refuses, is logged as not delivered, its end edge says `completed`, and the
/// failed send is taken back out of the child's accounting, so the child still settles (its
/// own notice reaches the top-level parent).
#[tokio::test(start_paused = true)]
async fn cont_82_a_throwing_send_to_a_resident_parent_does_not_pin_it() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let host = Host::new(by_session(10)).await;
    let (child_gate, child_hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    let child = host.get(&child_id).unwrap();
    child.session().add_observer(Arc::new(RefuseInsertion(|m| {
        m.source.kind() == "subagent-settled"
    })));
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("gc task")],
        child.clone(),
    );
    spec.child_id = Some(SessionId::from("grandchild"));
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    child_gate.send(true).unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    let ends: Vec<(SessionId, StopReason)> = host
        .ends()
        .into_iter()
        .map(|e| (e.info.id, e.stop_reason))
        .collect();
    assert_eq!(
        ends,
        vec![
            (gc_id, StopReason::Completed),
            (child_id.clone(), StopReason::Completed)
        ]
    );
    assert!(notices(&child).is_empty());
    let parent_notices = notices(&host.parent);
    assert_eq!(parent_notices.len(), 1);
    assert_eq!(
        serde_json::to_value(&parent_notices[0].source).unwrap()["senderSessionId"],
        json!(child_id.as_str())
    );
    let logged = warnings.messages();
    assert_eq!(
        logged
            .iter()
            .filter(|w| w.contains("settlement notice was not delivered to its parent"))
            .count(),
        1,
        "{logged:?}"
    );
    drop(child_hook);
    host.finish().await;
}

/// spec: CONT-95 — unloading the service drains live Activations. The Rust manager has no plugin
/// unload hook: its owner unloads it with [`ContinuationManager::dispose_all`], the manager-wide
/// drain (`SubagentService::close` only awaits one-shot end edges, and dropping a manager clone
/// cannot run an async teardown). Unloaded with a child `waiting` on a `running` grandchild, both
/// are cancelled (the grandchild's held turn ends `aborted` by its `parent`) and disposed,
/// grandchild first;
/// each epoch gets its end edge; nothing stays resident, registered or tracked; both durable
/// sessions survive.
#[tokio::test(start_paused = true)]
async fn cont_95_unloading_drains_live_activations() {
    let host = Host::new(vec![ScriptEntry::hang(), chunks::text("child reply").into()]).await;
    let (child_gate, child_hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    let child = host.get(&child_id).unwrap();
    let mut spec = ContinuableStartSpec::new(
        "spawn",
        "deeper",
        vec![ContentBlock::text("gc task")],
        child.clone(),
    );
    spec.child_id = Some(SessionId::from("grandchild"));
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    let grandchild = host.get(&gc_id).unwrap();
    yield_a_while().await;
    child_gate.send(true).unwrap();
    child.when_idle().await;
    yield_a_while().await;
    // Live: the child waits (idle, owning the grandchild); the grandchild runs.
    assert_eq!(host.model.requests().len(), 2);
    assert_eq!(child.status(), AgentStatus::Idle);
    assert_eq!(grandchild.status(), AgentStatus::Running);
    let mut resident = host.manager.resident();
    resident.sort();
    assert_eq!(resident, vec![child_id.clone(), gc_id.clone()]);
    host.manager.dispose_all().await.expect("unloaded");
    assert!(host.manager.resident().is_empty());
    assert_eq!(host.manager.task_count(), 0);
    assert!(host.get(&child_id).is_none() && host.get(&gc_id).is_none());
    assert_eq!(host.agent_count(), 1, "only the parent is left");
    let ends: Vec<(SessionId, StopReason)> = host
        .ends()
        .into_iter()
        .map(|e| (e.info.id, e.stop_reason))
        .collect();
    assert_eq!(
        ends,
        vec![
            (gc_id.clone(), StopReason::Aborted),
            (child_id.clone(), StopReason::Completed)
        ]
    );
    let gc_log = host.persisted(&gc_id).await;
    assert_eq!(
        turn_end_reasons(&gc_log.events),
        vec![json!({"kind": "aborted", "reason": {"kind": "parent"}})]
    );
    let child_log = host.persisted(&child_id).await;
    assert_eq!(child_log.header.id, child_id);
    assert_eq!(texts(&child_log.events), vec!["task"]);
    drop(child_hook);
    host.finish().await;
}

/// Sweeps: one continuable child's life interrupted at **every** scheduling point (counted in
/// `yield_now` calls of the test task on a current-thread runtime with a paused clock, with a
/// model that yields before every chunk), once per point.
mod sweep {
    use super::*;

    async fn host() -> Host {
        Host::build_with(by_session(20), true, true, routed(), true).await
    }

    /// The user-role texts of the child's persisted log and whether each was answered (an
    /// assistant message follows it before the next user text).
    fn answered(events: &[SessionEvent]) -> Vec<(String, bool)> {
        let mut out: Vec<(String, bool)> = Vec::new();
        for event in events {
            match &event.data {
                EventData::UserMessage(message) if message.source.kind() == "user" => {
                    out.push((visible_text(&message.content), false));
                }
                EventData::AssistantMessage { message, .. } if !message.content.is_empty() => {
                    if let Some(last) = out.last_mut() {
                        last.1 = true;
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// spec: CONT-25 — a follow-up issued at every scheduling point of a continuable child's first
    /// epoch (while it runs, as it settles, after it was released) is accepted and answered
    /// exactly once, after the first task; every epoch's start edge has its end edge; the parent
    /// hears of every epoch; and the host ends quiescent.
    #[tokio::test(start_paused = true)]
    async fn followup_at_every_point() {
        let mut resumed = 0;
        for point in 0..500 {
            let host = host().await;
            let (child_id, _) = host.manager.start_continuable(host.spec("first")).await.unwrap();
            for _ in 0..point {
                tokio::task::yield_now().await;
            }
            let released_first = !host.manager.is_resident(&child_id);
            host.manager
                .followup(&host.parent, &child_id, vec![ContentBlock::text("second")])
                .await
                .unwrap_or_else(|e| panic!("point {point}: the follow-up was refused: {e}"));
            host.settle().await;
            host.parent.when_idle().await;
            host.settle().await;
            let log = host.persisted(&child_id).await;
            assert_eq!(
                answered(&log.events),
                vec![("first".to_owned(), true), ("second".to_owned(), true)],
                "point {point}"
            );
            let (starts, ends) = (host.starts().len(), host.ends().len());
            assert_eq!(starts, ends, "point {point}: every epoch's start has its end");
            assert!((1..=2).contains(&starts), "point {point}: {starts} epochs");
            assert_eq!(
                notices(&host.parent).len(),
                ends,
                "point {point}: one notice per settled epoch"
            );
            host.finish().await;
            if released_first {
                resumed += 1;
                assert_eq!(starts, 2, "point {point}: a released child is cold-resumed");
                if resumed == 2 {
                    return;
                }
            }
        }
        panic!("the child was never released within 500 points");
    }

    /// Runs `run(point)` for the points 0, 1, 2, … until it reports that its interruption
    /// landed after the child's epoch had ended (`true`); the first point must land inside it.
    async fn until_epoch_ended<F, Fut>(mut run: F)
    where
        F: FnMut(usize) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        for point in 0..500 {
            if run(point).await {
                assert!(point > 0, "the first point already found the epoch ended");
                return;
            }
        }
        panic!("the child's epoch never ended within 500 points");
    }

    /// A host whose continuable child (prompt `first`) ran for `point` scheduling points, the
    /// child's id, and whether its first turn had ended (or it was already released) by then.
    async fn started_until(point: usize) -> (Host, SessionId, bool) {
        let host = host().await;
        let (child_id, _) = host.manager.start_continuable(host.spec("first")).await.unwrap();
        for _ in 0..point {
            tokio::task::yield_now().await;
        }
        let ended = !host.manager.is_resident(&child_id)
            || host.get(&child_id).is_some_and(|child| {
                child
                    .session()
                    .events()
                    .iter()
                    .any(|e| e.data.type_name() == "turn/end")
            });
        (host, child_id, ended)
    }

    /// spec: CONT-78 — a manager drain at every scheduling point of a continuable child's first
    /// epoch: a child still running ends `aborted` (cause `parent`, as a drain cancels — CONT-34),
    /// one that had finished keeps `completed`; every start edge has its end edge; the parent
    /// hears of the epoch once; the persisted log loads with every turn closed; and the host ends
    /// quiescent.
    #[tokio::test(start_paused = true)]
    async fn drain_at_every_point() {
        until_epoch_ended(|point| async move {
            let (host, child_id, ended_first) = started_until(point).await;
            host.manager
                .dispose_all()
                .await
                .unwrap_or_else(|e| panic!("point {point}: the drain failed: {e}"));
            host.parent.when_idle().await;
            assert!(!host.manager.is_resident(&child_id), "point {point}");
            assert!(
                host.get(&child_id).is_none(),
                "point {point}: the child outlived the drain"
            );
            let log = host.persisted(&child_id).await;
            let reasons = turn_end_reasons(&log.events);
            let opened = type_names(&log.events)
                .iter()
                .filter(|t| *t == "turn/start")
                .count();
            assert_eq!(reasons.len(), opened, "point {point}: every turn closed");
            let expected = if ended_first {
                json!({"kind": "completed"})
            } else {
                json!({"kind": "aborted", "reason": {"kind": "parent"}})
            };
            assert_eq!(reasons, vec![expected], "point {point}");
            assert_eq!(
                host.starts().len(),
                host.ends().len(),
                "point {point}: paired edges"
            );
            // A completed epoch's notice opened a parent turn; a drained one waits in the
            // parent's inbox for its next step (CONT-78).
            let queued = host
                .parent
                .inbox()
                .next_step
                .iter()
                .filter(|m| m.source.kind() == "subagent-settled")
                .count();
            assert_eq!(
                notices(&host.parent).len() + queued,
                1,
                "point {point}: one notice"
            );
            host.finish().await;
            ended_first
        })
        .await;
    }

    /// spec: CONT-17 — a manager drain at every scheduling point of a **cold-resumed** epoch: the
    /// first epoch completed and was released, a follow-up resumed the child from its persisted
    /// log, and the drain lands somewhere in the second epoch. The persisted log keeps the first
    /// epoch intact and closes the second (`completed` if it had finished, else `aborted`),
    /// every start edge has its end edge, and the host ends quiescent.
    #[tokio::test(start_paused = true)]
    async fn drain_at_every_point_of_a_resumed_epoch() {
        until_epoch_ended(|point| async move {
            let host = host().await;
            let (child_id, _) = host.manager.start_continuable(host.spec("first")).await.unwrap();
            host.settle().await;
            host.parent.when_idle().await;
            host.manager
                .followup(&host.parent, &child_id, vec![ContentBlock::text("second")])
                .await
                .expect("cold resume");
            for _ in 0..point {
                tokio::task::yield_now().await;
            }
            let ended = !host.manager.is_resident(&child_id)
                || host
                    .get(&child_id)
                    .is_some_and(|child| turn_end_reasons(&live_log(&child)).len() == 2);
            host.manager
                .dispose_all()
                .await
                .unwrap_or_else(|e| panic!("point {point}: the drain failed: {e}"));
            host.parent.when_idle().await;
            let log = host.persisted(&child_id).await;
            let second = if ended {
                json!({"kind": "completed"})
            } else {
                json!({"kind": "aborted", "reason": {"kind": "parent"}})
            };
            assert_eq!(
                turn_end_reasons(&log.events),
                vec![json!({"kind": "completed"}), second],
                "point {point}"
            );
            assert_eq!(
                answered(&log.events)[0],
                ("first".to_owned(), true),
                "point {point}"
            );
            assert_eq!(host.starts().len(), 2, "point {point}: two epochs");
            assert_eq!(host.ends().len(), 2, "point {point}: paired edges");
            host.finish().await;
            ended
        })
        .await;
    }

    /// Follow-ups from several tasks racing each other and the child's settlement, release and
    /// cold resume for real on a multi-threaded runtime: every follow-up is accepted, lands in
    /// the child's persisted log exactly once after the first task, and is answered; every epoch's
    /// start edge has its end edge; the host ends quiescent. (Nothing waits on time: timing only
    /// changes the interleaving; the timeout only turns a hang into a failure.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_followups_race_settlement_on_a_multi_threaded_runtime() {
        for round in 0..8usize {
            let host = Host::build_with(by_session(200), true, true, routed(), true).await;
            let (child_id, _) = host.manager.start_continuable(host.spec("first")).await.unwrap();
            let senders: Vec<_> = (0..4usize)
                .map(|task| {
                    let (manager, parent, child_id) =
                        (host.manager.clone(), host.parent.clone(), child_id.clone());
                    tokio::spawn(async move {
                        for j in 0..3usize {
                            for _ in 0..(round * 3 + task * 5 + j * 7) % 23 {
                                tokio::task::yield_now().await;
                            }
                            let text = format!("m{task}-{j}");
                            manager
                                .followup(&parent, &child_id, vec![ContentBlock::text(text.clone())])
                                .await
                                .unwrap_or_else(|e| {
                                    panic!("round {round}: {text} refused: {}", crate::error_chain(&e))
                                });
                        }
                    })
                })
                .collect();
            for sender in senders {
                sender.await.expect("sender");
            }
            quiet(&host, &format!("round {round}")).await;
            let log = host.persisted(&child_id).await;
            let answers = answered(&log.events);
            assert_eq!(answers[0].0, "first", "round {round}");
            let mut texts: Vec<&str> = answers.iter().map(|(t, _)| t.as_str()).collect();
            texts.sort_unstable();
            let mut expected = vec!["first".to_owned()];
            expected.extend((0..4).flat_map(|t| (0..3).map(move |j| format!("m{t}-{j}"))));
            expected.sort_unstable();
            assert_eq!(texts, expected, "round {round}: every follow-up exactly once");
            assert!(
                answers.iter().all(|(_, answered)| *answered),
                "round {round}: {answers:?}"
            );
            assert_eq!(
                host.starts().len(),
                host.ends().len(),
                "round {round}: paired edges"
            );
            host.finish().await;
        }
    }

    /// Starts with one reserved child id racing each other for real on a multi-threaded
    /// runtime: exactly one wins, every other rejects `DUPLICATE_CHILD`, and nothing is left
    /// behind (one child agent, its lock entry released with it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reserved_id_starts_race_on_a_multi_threaded_runtime() {
        for round in 0..8usize {
            let host = Host::build_with(by_session(50), true, true, routed(), true).await;
            let id = SessionId::from(format!("reserved-{round}"));
            let starts: Vec<_> = (0..4usize)
                .map(|task| {
                    let manager = host.manager.clone();
                    let mut spec = host.spec(&format!("task {task}"));
                    spec.child_id = Some(id.clone());
                    tokio::spawn(async move {
                        for _ in 0..(round + task * 3) % 7 {
                            tokio::task::yield_now().await;
                        }
                        manager.start_continuable(spec).await
                    })
                })
                .collect();
            let mut won = 0;
            for start in starts {
                match start.await.expect("start task") {
                    Ok((child, _)) => {
                        assert_eq!(child, id);
                        won += 1;
                    }
                    Err(e) => assert_eq!(
                        e.code(),
                        SubagentErrorCode::DuplicateChild,
                        "round {round}: {}",
                        crate::error_chain(&e)
                    ),
                }
            }
            assert_eq!(won, 1, "round {round}: exactly one start wins the id");
            host.manager.dispose_all().await.expect("drained");
            host.finish().await;
        }
    }

    /// Follow-ups racing a scoped drain of their parent on a multi-threaded runtime: each
    /// follow-up is either accepted before the drain closed admission or rejected with a typed
    /// code (never a half-resumed child); the drain leaves no resident child; and the host ends
    /// quiescent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn followups_race_a_scoped_drain_on_a_multi_threaded_runtime() {
        for round in 0..8usize {
            let host = Host::build_with(by_session(200), true, true, routed(), true).await;
            let (child_id, _) = host.manager.start_continuable(host.spec("first")).await.unwrap();
            let senders: Vec<_> = (0..3usize)
                .map(|task| {
                    let (manager, parent, child_id) =
                        (host.manager.clone(), host.parent.clone(), child_id.clone());
                    tokio::spawn(async move {
                        let mut outcomes = Vec::new();
                        for j in 0..3usize {
                            for _ in 0..(round * 5 + task * 3 + j) % 11 {
                                tokio::task::yield_now().await;
                            }
                            let text = format!("m{task}-{j}");
                            outcomes.push(
                                manager
                                    .followup(&parent, &child_id, vec![ContentBlock::text(text)])
                                    .await,
                            );
                        }
                        outcomes
                    })
                })
                .collect();
            for _ in 0..round * 4 {
                tokio::task::yield_now().await;
            }
            host.manager
                .drain_continuable_descendants(std::slice::from_ref(&host.parent))
                .await
                .expect("drained");
            for sender in senders {
                for outcome in sender.await.expect("sender") {
                    if let Err(e) = outcome {
                        assert_eq!(
                            e.code(),
                            SubagentErrorCode::Draining,
                            "round {round}: {}",
                            crate::error_chain(&e)
                        );
                    }
                }
            }
            assert!(
                !host.manager.is_resident(&child_id),
                "round {round}: the drain released the child"
            );
            host.finish().await;
        }
    }

    /// Waits (yields only; the timeout turns a hang into a failure) until the manager has no
    /// resident child and the parent is idle.
    async fn quiet(host: &Host, what: &str) {
        tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while !(host.manager.resident().is_empty()
                && host.manager.task_count() == 0
                && host.parent.status() == AgentStatus::Idle)
            {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            let resident = host.manager.resident();
            let mut diag = format!(
                "resident={resident:?} tasks={} parent={:?} parent_inbox={:?}",
                host.manager.task_count(),
                host.parent.status(),
                host.parent.inbox()
            );
            for id in &resident {
                if let Some(a) = host.get(id) {
                    diag += &format!(
                        " child {id}: status={:?} inbox={:?} log_tail={:?}",
                        a.status(),
                        a.inbox(),
                        a.session()
                            .events()
                            .iter()
                            .rev()
                            .take(6)
                            .map(|e| e.type_name().to_owned())
                            .collect::<Vec<_>>()
                    );
                }
                if let Some(act) = host.manager.inner.activations.lock().get(id) {
                    diag += &format!(
                        " activation: disposal={} settled={} announced={} owned={:?} epoch={}",
                        act.disposal().is_some(),
                        act.is_settled(),
                        act.is_announced(),
                        act.owned_children(),
                        act.epoch().is_some()
                    );
                }
            }
            diag += &format!(
                " parent_tail={:?}",
                host.parent
                    .session()
                    .events()
                    .iter()
                    .rev()
                    .take(6)
                    .map(|e| e.type_name().to_owned())
                    .collect::<Vec<_>>()
            );
            panic!("{what}: the host never went quiet: {diag}")
        });
    }

    /// Follow-ups and user interrupts racing for real on a multi-threaded runtime: every
    /// follow-up is accepted (inserted into the child's inbox exactly once, and delivered at most
    /// once); every turn ends
    /// `completed` or `aborted {user}`; a last follow-up after the interrupts wakes whatever they
    /// parked and is answered; edges stay paired and the host ends quiescent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn interrupts_race_followups_on_a_multi_threaded_runtime() {
        for round in 0..8usize {
            let host = Host::build_with(by_session(200), true, true, routed(), true).await;
            let (child_id, _) = host.manager.start_continuable(host.spec("first")).await.unwrap();
            let sender = {
                let (manager, parent, child_id) =
                    (host.manager.clone(), host.parent.clone(), child_id.clone());
                tokio::spawn(async move {
                    for j in 0..6usize {
                        for _ in 0..(round * 3 + j * 5) % 13 {
                            tokio::task::yield_now().await;
                        }
                        manager
                            .followup(&parent, &child_id, vec![ContentBlock::text(format!("m{j}"))])
                            .await
                            .unwrap_or_else(|e| {
                                panic!("round {round}: m{j} refused: {}", crate::error_chain(&e))
                            });
                    }
                })
            };
            let interrupter = {
                let (manager, child_id) = (host.manager.clone(), child_id.clone());
                tokio::spawn(async move {
                    for k in 0..4usize {
                        for _ in 0..(round * 7 + k * 11) % 17 {
                            tokio::task::yield_now().await;
                        }
                        manager
                            .interrupt(
                                &child_id,
                                &super::super::InterruptAuthority::User {
                                    parent_session_id: SessionId::from("parent"),
                                },
                            )
                            .expect("a user interrupt is accepted");
                    }
                })
            };
            sender.await.expect("sender");
            interrupter.await.expect("interrupter");
            host.manager
                .followup(&host.parent, &child_id, vec![ContentBlock::text("last")])
                .await
                .expect("the last follow-up");
            quiet(&host, &format!("round {round}")).await;
            let log = host.persisted(&child_id).await;
            // Every accepted message was inserted into the inbox exactly once (the durable record
            // of acceptance). One claimed by a turn an interrupt then stopped before its first
            // step is dropped by design (SPN-14), so it need not reach a `user/message`; none
            // reaches one twice.
            let mut accepted: Vec<String> = log
                .events
                .iter()
                .filter_map(|e| match &e.data {
                    EventData::InboxSpliced(splice) => Some(splice.inserted.iter().map(|m| m.text())),
                    _ => None,
                })
                .flatten()
                .collect();
            accepted.sort_unstable();
            let mut expected = vec!["first".to_owned(), "last".to_owned()];
            expected.extend((0..6).map(|j| format!("m{j}")));
            expected.sort_unstable();
            assert_eq!(accepted, expected, "round {round}: every message accepted once");
            let answers = answered(&log.events);
            let mut delivered: Vec<&str> = answers.iter().map(|(t, _)| t.as_str()).collect();
            delivered.sort_unstable();
            delivered.dedup();
            assert_eq!(
                delivered.len(),
                answers.len(),
                "round {round}: a message delivered twice"
            );
            assert_eq!(answers.last(), Some(&("last".to_owned(), true)), "round {round}");
            for reason in turn_end_reasons(&log.events) {
                assert!(
                    reason == json!({"kind": "completed"})
                        || reason == json!({"kind": "aborted", "reason": {"kind": "user"}}),
                    "round {round}: {reason}"
                );
            }
            assert_eq!(
                host.starts().len(),
                host.ends().len(),
                "round {round}: paired edges"
            );
            host.finish().await;
        }
    }

    /// Continuable starts racing a manager drain for real on a multi-threaded runtime: each start
    /// either fulfils before the drain closed admission or rejects `DRAINING`; the drain leaves
    /// no resident child and no live child agent; every child that was created has a closed log
    /// (as many `turn/end` as `turn/start`); and the host ends quiescent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn starts_race_a_manager_drain_on_a_multi_threaded_runtime() {
        for round in 0..8usize {
            let host = Host::build_with(by_session(200), true, true, routed(), true).await;
            let starts: Vec<_> = (0..4usize)
                .map(|task| {
                    let manager = host.manager.clone();
                    let spec = host.spec(&format!("task {task}"));
                    tokio::spawn(async move {
                        for _ in 0..(round * 5 + task * 3) % 11 {
                            tokio::task::yield_now().await;
                        }
                        manager.start_continuable(spec).await
                    })
                })
                .collect();
            for _ in 0..round * 2 {
                tokio::task::yield_now().await;
            }
            host.manager.dispose_all().await.expect("drained");
            let mut started = Vec::new();
            for start in starts {
                match start.await.expect("start task") {
                    Ok((child, _)) => started.push(child),
                    Err(e) => assert_eq!(
                        e.code(),
                        SubagentErrorCode::Draining,
                        "round {round}: {}",
                        crate::error_chain(&e)
                    ),
                }
            }
            assert!(host.manager.resident().is_empty(), "round {round}");
            for child in &started {
                assert!(
                    host.get(child).is_none(),
                    "round {round}: {child} outlived the drain"
                );
                let log = host.persisted(child).await;
                let opened = type_names(&log.events)
                    .iter()
                    .filter(|t| *t == "turn/start")
                    .count();
                assert_eq!(
                    turn_end_reasons(&log.events).len(),
                    opened,
                    "round {round}: {child}"
                );
            }
            host.finish().await;
        }
    }

    /// spec: CONT-96, CONT-102 — a user interrupt at every scheduling point of a continuable
    /// child's first epoch: a running turn ends `aborted {user}`, a finished or released child is
    /// left alone (a no-op); a follow-up afterwards is answered; edges stay paired; and the host
    /// ends quiescent.
    #[tokio::test(start_paused = true)]
    async fn interrupt_at_every_point() {
        until_epoch_ended(|point| async move {
            let (host, child_id, ended_first) = started_until(point).await;
            host.manager
                .interrupt(
                    &child_id,
                    &super::super::InterruptAuthority::User {
                        parent_session_id: SessionId::from("parent"),
                    },
                )
                .unwrap_or_else(|e| panic!("point {point}: the interrupt was refused: {e}"));
            if let Some(child) = host.get(&child_id) {
                child.when_idle().await;
            }
            host.manager
                .followup(&host.parent, &child_id, vec![ContentBlock::text("second")])
                .await
                .unwrap_or_else(|e| panic!("point {point}: the follow-up was refused: {e}"));
            host.settle().await;
            host.parent.when_idle().await;
            host.settle().await;
            let log = host.persisted(&child_id).await;
            let reasons = turn_end_reasons(&log.events);
            let first = if ended_first {
                json!({"kind": "completed"})
            } else {
                json!({"kind": "aborted", "reason": {"kind": "user"}})
            };
            assert_eq!(
                reasons,
                vec![first, json!({"kind": "completed"})],
                "point {point}"
            );
            let answers = answered(&log.events);
            assert_eq!(
                answers.last(),
                Some(&("second".to_owned(), true)),
                "point {point}"
            );
            assert_eq!(
                host.starts().len(),
                host.ends().len(),
                "point {point}: paired edges"
            );
            host.finish().await;
            ended_first
        })
        .await;
    }
}

/// spec: CONT-29 — the best-effort final flush never fails the transaction, also when the host
/// store's flush *panics*: the panic is contained and logged like a failed flush, the Activation
/// is released (agent unregistered, nothing resident), the parent gets its notice, the end edge
/// says `completed`, and a later follow-up cold-resumes the child. (A panic unwinding through the
/// transaction left the Activation in the live map for ever with an abandoned disposal: the
/// agent stayed registered, no notice or end edge, and every later follow-up spun on it.)
#[tokio::test(start_paused = true)]
async fn a_panicking_final_flush_is_contained_and_settles() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let store = Arc::new(MemoryStore::new());
    let persistence: Arc<dyn SessionPersistence> =
        Arc::new(FailingChildFlush(store.clone(), FlushFault::Panics));
    let host = Host::build_on(by_session(6), store, Some(persistence), true, routed(), false).await;
    let child_id = start_reserved(&host, "flaky").await;
    host.settle().await;
    host.parent.when_idle().await;
    assert!(host.get(&child_id).is_none(), "the child was released");
    assert_eq!(host.ends().len(), 1);
    assert_eq!(host.ends()[0].stop_reason, StopReason::Completed);
    assert_eq!(notices(&host.parent).len(), 1);
    assert!(
        warnings
            .messages()
            .iter()
            .any(|w| w.contains("best-effort final session flush failed")),
        "{:?}",
        warnings.messages()
    );
    host.cold_resume_and_settle(&child_id, "again").await;
    assert_eq!(host.ends().len(), 2);
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task", "again"]);
    host.finish().await;
}

/// Persistence over a [`MemoryStore`] that answers for `alias` with the stored session `target`
/// (header and events): a hostile or corrupted store whose header names another session. With
/// `consistent_inspect`, `inspect` still reports `alias` (only `load` is redirected).
struct AliasedSession {
    store: Arc<MemoryStore>,
    alias: SessionId,
    target: SessionId,
    consistent_inspect: bool,
}

impl AliasedSession {
    fn map<'a>(&'a self, id: &'a SessionId) -> &'a SessionId {
        if id == &self.alias { &self.target } else { id }
    }
}

#[async_trait]
impl SessionPersistence for AliasedSession {
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
        let header = SessionPersistence::inspect(self.store.as_ref(), self.map(id)).await?;
        Ok(header.map(|mut header| {
            if self.consistent_inspect && id == &self.alias {
                header.id = id.clone();
            }
            header
        }))
    }
    async fn load(&self, id: &SessionId) -> Result<agent::store::LoadedSession, agent::AgentError> {
        SessionPersistence::load(self.store.as_ref(), self.map(id)).await
    }
}

/// spec: CONT-22 — a follow-up to `alias`, whose persisted header names another session
/// (`impostor`, a settled continuable child of the same parent), rejects `NOT_RESUMABLE`
/// instead of resuming `impostor` under the Activation of `alias`: no agent is registered,
/// nothing stays resident, no epoch starts, and neither log gains the message. (Adopting the
/// mismatched agent delivered the message into `impostor`'s log and pinned the `alias`
/// Activation `running` for ever: its inbox subscription, scoped to `alias`, never saw the claim.)
#[tokio::test(start_paused = true)]
async fn cold_resume_refuses_a_header_naming_another_session() {
    refuses_an_aliased_session(false).await;
}

/// spec: CONT-22 — the same when only the load is redirected (the inspected header names
/// `alias`, the loaded log is `impostor`'s): the runtime resumes `impostor`, and the manager
/// releases that agent again instead of adopting it.
#[tokio::test(start_paused = true)]
async fn cold_resume_refuses_an_agent_resumed_as_another_session() {
    refuses_an_aliased_session(true).await;
}

async fn refuses_an_aliased_session(consistent_inspect: bool) {
    let store = Arc::new(MemoryStore::new());
    let persistence: Arc<dyn SessionPersistence> = Arc::new(AliasedSession {
        store: store.clone(),
        alias: SessionId::from("alias"),
        target: SessionId::from("impostor"),
        consistent_inspect,
    });
    let host = Host::build_on(by_session(6), store, Some(persistence), true, routed(), false).await;
    let impostor = start_reserved(&host, "impostor").await;
    host.settle().await;
    host.parent.when_idle().await;
    let agents = host.agent_count();
    let err = host
        .manager
        .followup(
            &host.parent,
            &SessionId::from("alias"),
            vec![ContentBlock::text("misrouted")],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::NotResumable, "{err}");
    assert!(err.to_string().contains("alias"), "{err}");
    assert!(host.manager.resident().is_empty());
    assert!(host.get(&impostor).is_none());
    assert!(host.get(&SessionId::from("alias")).is_none());
    assert_eq!(host.agent_count(), agents);
    assert_eq!(host.starts().len(), 1, "no epoch started");
    let log = host.persisted(&impostor).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    host.finish().await;
}

/// A host runtime whose agent handles take a few scheduling points to dispose (the runtime's
/// own teardown starts at once; the handle's future yields before awaiting it).
struct SlowDisposal(Arc<dyn AgentRuntime>);

/// The disposer of a [`SlowDisposal`] handle: yields, then awaits the runtime's own handle.
struct YieldingDisposer(AgentHandle);

impl agent::Disposer for YieldingDisposer {
    fn dispose(&self) -> futures::future::BoxFuture<'static, ()> {
        let teardown = self.0.dispose();
        Box::pin(async move {
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            teardown.await;
        })
    }
}

impl SlowDisposal {
    fn wrap(handle: AgentHandle) -> AgentHandle {
        AgentHandle::new(handle.agent().clone(), Arc::new(YieldingDisposer(handle)))
    }
}

#[async_trait]
impl AgentRuntime for SlowDisposal {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.0.create(options).await.map(Self::wrap)
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.0.resume(options).await.map(Self::wrap)
    }
    delegate_agent_lookups!(0);
}

/// A start whose caller drops it while its rollback is under way (a manager drain begun at
/// `agent/created` made the residency check fail and the fresh agent is being disposed) still
/// finishes the rollback: once the drain resolves nothing is resident, the child is gone, and
/// no lifecycle edge exists. (The rollback ran in the dropped future: dropped mid-way, it left
/// the Activation in the live map after the drain had resolved.)
#[tokio::test(start_paused = true)]
async fn a_start_dropped_during_its_rollback_leaves_nothing_resident() {
    let mut host = Host::new(vec![]).await;
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(SlowDisposal(services.agents.clone()));
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let drained = Arc::new(Mutex::new(None));
    let slot = drained.clone();
    let manager = host.manager.clone();
    let listener = host.runtime.services().agent_events.on(move |e: &AgentEvent| {
        if let AgentEvent::Created { agent } = e
            && agent.as_str() == "dropped"
        {
            *slot.lock() = Some(tokio::spawn(manager.dispose_all()));
        }
        Ok(())
    });
    let mut spec = host.spec("task");
    spec.child_id = Some(SessionId::from("dropped"));
    let child_id = SessionId::from("dropped");
    let mut start = Box::pin(host.manager.start_continuable(spec));
    let mut dropped_mid_rollback = false;
    for _ in 0..10_000 {
        match futures::poll!(start.as_mut()) {
            std::task::Poll::Ready(outcome) => {
                panic!("the start finished before it could be dropped: {outcome:?}")
            }
            std::task::Poll::Pending if host.manager.is_resident(&child_id) => {
                dropped_mid_rollback = true;
                break;
            }
            std::task::Poll::Pending => tokio::task::yield_now().await,
        }
    }
    assert!(dropped_mid_rollback, "the rollback was never observed in flight");
    drop(start);
    let drain = drained.lock().take().expect("the drain began at agent/created");
    drain.await.unwrap().expect("drained");
    assert!(
        host.manager.resident().is_empty(),
        "{:?}",
        host.manager.resident()
    );
    yield_a_while().await;
    assert!(host.get(&child_id).is_none());
    assert!(host.starts().is_empty() && host.ends().is_empty());
    drop(listener);
    host.finish().await;
}

/// A host runtime whose agent handles fail to dispose: the disposer starts the runtime's own
/// teardown (so the agent is still released) and then panics — a handle-disposal failure.
struct PanickingDisposal {
    inner: Arc<dyn AgentRuntime>,
    /// The one created agent whose handle explodes; `None`: every created agent's.
    only: Option<SessionId>,
}

impl PanickingDisposal {
    /// Every created agent's handle explodes.
    fn every(inner: Arc<dyn AgentRuntime>) -> Self {
        Self { inner, only: None }
    }

    /// Only the handle of the agent created as `id` explodes.
    fn only(inner: Arc<dyn AgentRuntime>, id: &str) -> Self {
        Self {
            inner,
            only: Some(SessionId::from(id)),
        }
    }
}

/// The disposer of an exploding [`PanickingDisposal`] handle.
struct ExplodingDisposer(AgentHandle);

impl agent::Disposer for ExplodingDisposer {
    fn dispose(&self) -> futures::future::BoxFuture<'static, ()> {
        let teardown = self.0.dispose();
        Box::pin(async move {
            teardown.await;
            panic!("the handle's disposal exploded");
        })
    }
}

#[async_trait]
impl AgentRuntime for PanickingDisposal {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        let explodes = self.only.as_ref().is_none_or(|id| id == &options.session_id);
        let handle = self.inner.create(options).await?;
        if !explodes {
            return Ok(handle);
        }
        Ok(AgentHandle::new(
            handle.agent().clone(),
            Arc::new(ExplodingDisposer(handle)),
        ))
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.inner.resume(options).await
    }
    delegate_agent_lookups!(inner);
}

/// spec: CONT-30 — a handle-disposal failure (the host's disposer panics) during natural
/// settlement is logged ("activation teardown failed") and the Activation is still removed.
/// spec: CONT-73 — its notice says "failed before it finished." and "It left no closing
/// message." (output withheld), and the end edge reports `error` without a message. A later
/// follow-up cold-resumes the child. (The panic abandoned the transaction before the live-map
/// removal: the Activation stayed resident for ever, no notice or end edge was sent, and a
/// follow-up spun on the abandoned disposal.)
#[tokio::test(start_paused = true)]
async fn cont_30_73_a_failing_handle_disposal_still_releases_the_activation() {
    let warnings = WarningCapture::new();
    let _subscriber = warnings.install();
    let mut host = Host::new(by_session(6)).await;
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(PanickingDisposal::every(services.agents.clone()));
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let child_id = start_reserved(&host, "child").await;
    host.settle().await;
    host.parent.when_idle().await;
    assert!(host.get(&child_id).is_none());
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Error);
    assert!(ends[0].last_assistant_message.is_none());
    let notices = notices(&host.parent);
    assert_eq!(notices.len(), 1);
    assert_eq!(
        block_texts(&notices[0].content),
        vec![
            "Background subagent child failed before it finished.".to_owned(),
            "It left no closing message.".to_owned(),
        ]
    );
    let logged = warnings.messages();
    assert!(
        logged.iter().any(|w| w.contains("activation teardown failed")),
        "{logged:?}"
    );
    host.cold_resume_and_settle(&child_id, "again").await;
    assert_eq!(host.ends().len(), 2);
    assert_eq!(host.ends()[1].stop_reason, StopReason::Completed);
    host.finish().await;
}

/// spec: CONT-35 — a selected drain with a failing handle disposal rejects
/// `ACTIVATION_TEARDOWN_FAILED` yet still removes the child.
/// spec: CONT-54 — the end edge of that drained epoch reports `error`.
#[tokio::test(start_paused = true)]
async fn cont_35_54_selected_drain_with_a_failing_handle_disposal() {
    let mut host = Host::new(by_session(6)).await;
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(PanickingDisposal::every(services.agents.clone()));
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let (_held, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let err = host
        .manager
        .drain_continuable_children(&host.parent, std::slice::from_ref(&child_id))
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ActivationTeardownFailed, "{err}");
    assert!(err.to_string().contains("selected activation(s)"), "{err}");
    assert!(err.to_string().contains("exploded"), "{err}");
    assert!(!host.manager.is_resident(&child_id));
    assert!(host.get(&child_id).is_none());
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Error);
    drop(hook);
    host.parent.when_idle().await;
    host.finish().await;
}

/// spec: CONT-41 — a scoped drain with a failing handle disposal rejects
/// `ACTIVATION_TEARDOWN_FAILED` ("scoped activation(s)", naming the failure) and still removes the
/// child: it is neither resident nor registered, and its epoch ends with `error`.
#[tokio::test(start_paused = true)]
async fn cont_41_scoped_drain_with_a_failing_handle_disposal() {
    let mut host = Host::new(by_session(6)).await;
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(PanickingDisposal::every(services.agents.clone()));
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let (_held, hook) = gate(&host, "child");
    let child_id = start_reserved(&host, "child").await;
    yield_a_while().await;
    let err = host
        .manager
        .drain_continuable_descendants(std::slice::from_ref(&host.parent))
        .await
        .unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ActivationTeardownFailed, "{err}");
    assert!(err.to_string().contains("scoped activation(s)"), "{err}");
    assert!(
        err.to_string().contains("\"child\" handle disposal failed"),
        "{err}"
    );
    assert!(!host.manager.is_resident(&child_id));
    assert!(host.get(&child_id).is_none());
    let ends = host.ends();
    assert_eq!(ends.len(), 1);
    assert_eq!(ends[0].stop_reason, StopReason::Error);
    drop(hook);
    host.parent.when_idle().await;
    host.finish().await;
}

/// spec: CONT-92 — a grandchild's handle-disposal failure during a (manager) drain rejects
/// `ACTIVATION_TEARDOWN_FAILED` naming the grandchild; every other branch still releases — its
/// parent child (whose epoch reports `error`, as a failed owned child is a failed boundary of its
/// teardown) and an unrelated sibling (`aborted`) — nothing stays resident or registered, and the
/// three durable sessions remain loadable.
#[tokio::test(start_paused = true)]
async fn cont_92_grandchild_disposal_failure_during_drain() {
    let mut host = Host::new(vec![
        ScriptEntry::hang(),
        ScriptEntry::hang(),
        ScriptEntry::hang(),
    ])
    .await;
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(PanickingDisposal::only(services.agents.clone(), "grandchild"));
    host.manager = ContinuationManager::new(host.service.clone(), services);
    let child_id = start_reserved(&host, "child").await;
    let sibling_id = start_reserved(&host, "sibling").await;
    let child = host.get(&child_id).unwrap();
    let mut spec = ContinuableStartSpec::new("spawn", "deeper", vec![ContentBlock::text("gc task")], child);
    spec.child_id = Some(SessionId::from("grandchild"));
    let (gc_id, _) = host.manager.start_continuable(spec).await.unwrap();
    yield_a_while().await;
    let err = host.manager.dispose_all().await.unwrap_err();
    assert_eq!(err.code(), SubagentErrorCode::ActivationTeardownFailed, "{err}");
    assert!(
        err.to_string().contains("\"grandchild\" handle disposal failed"),
        "{err}"
    );
    assert!(err.to_string().contains("exploded"), "{err}");
    assert!(
        host.manager.resident().is_empty(),
        "{:?}",
        host.manager.resident()
    );
    for id in [&child_id, &sibling_id, &gc_id] {
        assert!(host.get(id).is_none(), "{id} is still registered");
    }
    let reasons: std::collections::HashMap<SessionId, StopReason> = host
        .ends()
        .into_iter()
        .map(|e| (e.info.id, e.stop_reason))
        .collect();
    assert_eq!(reasons.len(), 3);
    assert_eq!(reasons[&gc_id], StopReason::Error);
    assert_eq!(reasons[&child_id], StopReason::Error);
    assert_eq!(reasons[&sibling_id], StopReason::Aborted);
    for id in [&child_id, &sibling_id, &gc_id] {
        let log = host.persisted(id).await;
        assert_eq!(&log.header.id, id);
        assert_eq!(log.events[0].data.type_name(), crate::SUBAGENT_DESCRIPTOR_EVENT);
    }
    host.finish().await;
}

/// A host runtime whose `resume` fails with a seam error: wrapped as `AgentError::Other` for
/// the first resume, as a setup failure (`AgentError::Setup`) for the second.
struct SeamErrorResume {
    inner: Arc<dyn AgentRuntime>,
    resumes: AtomicUsize,
}

#[async_trait]
impl AgentRuntime for SeamErrorResume {
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        self.inner.create(options).await
    }
    async fn resume(&self, options: agent::ResumeAgentOptions) -> Result<AgentHandle, agent::AgentError> {
        let refusal = SubagentError::new(SubagentErrorCode::Unauthorized, "the host refused this resume");
        match self.resumes.fetch_add(1, AtomicOrdering::SeqCst) {
            0 => Err(agent::AgentError::Other(Box::new(refusal))),
            _ => Err(agent::AgentError::Setup {
                id: options.session_id,
                source: Box::new(refusal),
            }),
        }
    }
    delegate_agent_lookups!(inner);
}

/// spec: CONT-24 — a `SubagentError` raised by the agent resume (directly, or from its setup
/// window) propagates as that error — same code, same message — instead of being turned into
/// `NOT_RESUMABLE`; nothing becomes resident and the message is never logged.
#[tokio::test(start_paused = true)]
async fn cont_24_a_seam_error_from_resume_propagates_unchanged() {
    let mut host = Host::new(by_session(4)).await;
    let child_id = start_reserved(&host, "child").await;
    host.settle().await;
    host.parent.when_idle().await;
    let mut services = host.runtime.services().clone();
    services.agents = Arc::new(SeamErrorResume {
        inner: services.agents.clone(),
        resumes: AtomicUsize::new(0),
    });
    host.manager = ContinuationManager::new(host.service.clone(), services);
    for attempt in ["direct", "from setup"] {
        let err = host
            .manager
            .followup(&host.parent, &child_id, vec![ContentBlock::text("refused")])
            .await
            .unwrap_err();
        assert_eq!(err.code(), SubagentErrorCode::Unauthorized, "{attempt}: {err}");
        assert_eq!(err.message(), "the host refused this resume", "{attempt}");
        assert!(!host.manager.is_resident(&child_id));
    }
    let log = host.persisted(&child_id).await;
    assert_eq!(texts(&log.events), vec!["task"]);
    host.finish().await;
}

/// What [`ObserveNoticeWindow`] saw when the settlement notice entered the parent's log.
#[derive(Default)]
struct NoticeWindow {
    seen: bool,
    child_resident: bool,
    under_way: Vec<SessionId>,
}

/// Records, at the moment a settlement notice's insertion reaches the parent's log (inside the
/// delivery), whether the child is still resident and which notices the manager reports as
/// under way.
struct ObserveNoticeWindow {
    manager: ContinuationManager,
    child: SessionId,
    window: Arc<parking_lot::Mutex<NoticeWindow>>,
}

impl agent::SessionObserver for ObserveNoticeWindow {
    fn check(&self, _: &agent::Session, candidate: &SessionEvent) -> Result<(), String> {
        if let EventData::InboxSpliced(splice) = &candidate.data
            && splice
                .inserted
                .iter()
                .any(|m| m.source.kind() == "subagent-settled")
        {
            let mut w = self.window.lock();
            w.seen = true;
            w.child_resident = self.manager.is_resident(&self.child);
            w.under_way = self.manager.notices_under_way();
        }
        Ok(())
    }
}

/// A settling child leaves the live map before its notice reaches the parent (spec §2.14.6
/// steps 8–9); meanwhile the manager reports the notice as under way to that parent, so a host
/// waiting for the tree to go quiet never sees it idle with nothing pending in that window.
/// Afterwards nothing is reported under way.
#[tokio::test(start_paused = true)]
async fn a_notice_between_the_live_map_and_the_parent_is_reported_under_way() {
    let host = Host::new(vec![chunks::text("the answer").into()]).await;
    let child_id = SessionId::from("settling");
    let window = Arc::new(parking_lot::Mutex::new(NoticeWindow::default()));
    host.parent.session().add_observer(Arc::new(ObserveNoticeWindow {
        manager: host.manager.clone(),
        child: child_id.clone(),
        window: window.clone(),
    }));
    let mut spec = host.spec("task");
    spec.child_id = Some(child_id.clone());
    host.manager.start_continuable(spec).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    {
        let w = window.lock();
        assert!(w.seen, "the notice was delivered");
        assert!(!w.child_resident, "the child left the live map before its notice");
        assert_eq!(w.under_way, vec![host.parent.id().clone()]);
    }
    assert!(host.manager.notices_under_way().is_empty());
    assert_eq!(notices(&host.parent).len(), 1);
    host.finish().await;
}
