//! The live companions of providers §6.6: agent status (G1), request reconstruction (L1–L8)
//! and the seam's lifecycle (B1–B8), checklist ICMP-157…171 and seam INV-1…4.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent::content::ContentBlock;
use agent::event::{CallConfig, EpochHeader, EventData, RequestHeaderReason, SurfaceMeta};
use agent::model::{FinishReason, GenerateOptions, ModelAdapter, ModelStream, StreamChunk};
use agent::{AgentEvent, AgentStatus, EventBus, Message, MessageSource, Session, SessionId, SessionMeta};
use async_trait::async_trait;
use futures::StreamExt;
use invariants::{
    AgentStatusCompanion, CheckedModel, INVARIANT_FAILURE_CODE, PROVIDER_REGISTRY_SESSION, RequestCheck,
    SeamLifecycleCompanion, Violation,
};
use subagent::capabilities::NO_START_CAPABILITIES;
use subagent::events::{SubagentEvent, SubagentRunEndInfo, SubagentRunInfo};
use subagent::provider::{ResolvedSubagentStartRequest, SubagentProvider};
use subagent::run::SubagentRun;
use subagent::service::{RegisterError, SubagentService};
use subagent::{StopReason, SubagentError};

fn rules(violations: &[Violation]) -> Vec<&'static str> {
    violations.iter().map(|v| v.rule.as_str()).collect()
}

// ---------------------------------------------------------------------------------------------
// Agent status (G1)
// ---------------------------------------------------------------------------------------------

fn status(agent: &str, status: AgentStatus) -> AgentEvent {
    AgentEvent::Status {
        agent: agent.into(),
        status,
    }
}

/// spec: ICMP-157 — idle → running → idle passes.
#[test]
fn icmp_157_lifecycle_transitions_pass() {
    let companion = AgentStatusCompanion::new();
    let bus = EventBus::<AgentEvent>::new();
    let _guard = companion.listen(&bus);
    for s in [AgentStatus::Idle, AgentStatus::Running, AgentStatus::Idle] {
        bus.try_emit(&status("a1", s)).expect("a real transition passes");
    }
    assert!(companion.violations().is_empty());
    assert_eq!(companion.status_of(&"a1".into()), Some(AgentStatus::Idle));
}

/// spec: ICMP-158 — a repeated status is rejected as a no-op transition.
#[test]
fn icmp_158_repeated_status_is_a_no_op_transition() {
    let companion = AgentStatusCompanion::new();
    let bus = EventBus::<AgentEvent>::new();
    let _guard = companion.listen(&bus);
    bus.try_emit(&status("a3", AgentStatus::Running)).unwrap();
    let err = bus.try_emit(&status("a3", AgentStatus::Running)).unwrap_err();
    assert!(err.message.contains("no-op transition"), "{}", err.message);
    assert!(err.message.starts_with("[G1] session \"a3\""), "{}", err.message);
    let found = companion.violations();
    assert_eq!(rules(&found), ["G1"]);
    assert_eq!(found[0].session.as_str(), "a3");
    assert_eq!(
        found[0].veto_text(),
        "invariant violated by \"agent\": [G1] session \"a3\": expected agent/status to change, but it repeated running (no-op transition)"
    );
    // The runtime emits status contained: the finding is logged and delivery goes on.
    bus.emit(&status("a3", AgentStatus::Running));
    assert_eq!(companion.violations().len(), 2);
}

/// spec: ICMP-159 — agents are tracked independently (and a disposed agent's id starts fresh).
#[test]
fn icmp_159_agents_are_tracked_independently() {
    let companion = AgentStatusCompanion::new();
    let bus = EventBus::<AgentEvent>::new();
    let _guard = companion.listen(&bus);
    bus.try_emit(&status("a5", AgentStatus::Running)).unwrap();
    bus.try_emit(&status("b5", AgentStatus::Running))
        .expect("another agent's first status is not a repeat");
    bus.try_emit(&AgentEvent::Disposed { agent: "a5".into() })
        .unwrap();
    bus.try_emit(&status("a5", AgentStatus::Running))
        .expect("a reused id starts fresh after disposal");
    assert!(companion.violations().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Request reconstruction (L1–L8)
// ---------------------------------------------------------------------------------------------

/// An adapter that counts its calls and answers at once with an empty `stop` finish (a
/// short-circuiting stream, like a replay adapter).
#[derive(Default)]
struct Counting {
    calls: AtomicUsize,
    last: std::sync::Mutex<Option<Arc<GenerateOptions>>>,
}

impl ModelAdapter for Counting {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        self.calls.fetch_add(1, Ordering::SeqCst);
        *self.last.lock().unwrap() = Some(request);
        Box::pin(futures::stream::iter([Ok(StreamChunk::Finish {
            reason: FinishReason::Stop,
            replay_state: None,
        })]))
    }
}

struct RequestHost {
    session: Arc<Session>,
    check: Arc<RequestCheck>,
    inner: Arc<Counting>,
    model: Arc<CheckedModel>,
    /// The derivation at the step boundary (before `step/start`).
    boundary: Vec<Message>,
}

fn session(id: &str) -> Arc<Session> {
    let header = SessionMeta::default().into_header(id.into(), 1).unwrap();
    Arc::new(Session::new(header, None).unwrap())
}

fn request_header(model: &str) -> EventData {
    EventData::RequestHeader {
        header: Box::new(EpochHeader {
            config: CallConfig {
                provider: "mock".into(),
                model: model.into(),
                ..CallConfig::default()
            },
            ..EpochHeader::default()
        }),
        reason: RequestHeaderReason::Initial,
    }
}

/// `turn/start 1`, a user message, `step/start 1/1`, `request/header {model: m}` — the
/// reference's `requestSetup`.
fn request_host(id: &str) -> RequestHost {
    let session = session(id);
    session.append(EventData::TurnStart { turn: 1 }, None).unwrap();
    session
        .append(
            EventData::UserMessage(Message::user_text("hi")),
            Some(SurfaceMeta::append()),
        )
        .unwrap();
    let boundary = agent::derive_messages(session.events().iter());
    session
        .append(EventData::StepStart { turn: 1, step: 1 }, None)
        .unwrap();
    session.append(request_header("m"), None).unwrap();
    let live = session.clone();
    let check = RequestCheck::with_lookup(move |id| (id == live.id()).then(|| live.clone()));
    let inner = Arc::new(Counting::default());
    let model = check.wrap(inner.clone());
    RequestHost {
        session,
        check,
        inner,
        model,
        boundary,
    }
}

fn loop_request(session: Option<&SessionId>, model: &str, messages: Vec<Message>) -> Arc<GenerateOptions> {
    Arc::new(GenerateOptions {
        session_id: session.cloned(),
        loop_built: true,
        ..GenerateOptions::new("mock", model, messages)
    })
}

/// Streams `request` through `model` and returns its chunks.
fn dispatch(model: &CheckedModel, request: Arc<GenerateOptions>) -> Vec<StreamChunk> {
    futures::executor::block_on(
        model
            .stream(request)
            .map(|c| c.expect("no adapter throw"))
            .collect(),
    )
}

/// The failure of an error finish vetoing a request, if that is what `chunks` is.
fn veto(chunks: &[StreamChunk]) -> Option<&agent::LlmFailure> {
    match chunks {
        [
            StreamChunk::Finish {
                reason: FinishReason::Error { failure },
                ..
            },
        ] if failure.code == INVARIANT_FAILURE_CODE => Some(failure),
        _ => None,
    }
}

/// spec: ICMP-160 — a request equal to the derivation and the header passes; it is handed on as
/// the very same immutable `Arc` (L1/L4 hold by construction).
#[test]
fn icmp_160_request_equal_to_derivation_and_header_passes() {
    let host = request_host("req-check");
    let request = loop_request(Some(host.session.id()), "m", host.boundary.clone());
    let chunks = dispatch(&host.model, request.clone());
    assert!(veto(&chunks).is_none(), "{chunks:?}");
    assert_eq!(host.inner.calls.load(Ordering::SeqCst), 1);
    let delegated = host.inner.last.lock().unwrap().clone().unwrap();
    assert!(
        Arc::ptr_eq(&delegated, &request),
        "the checked request is the streamed request"
    );
    assert!(host.check.violations().is_empty());
}

/// spec: ICMP-161 — context appended inside the open step before dispatch is part of the
/// expected messages.
#[test]
fn icmp_161_context_inside_the_open_step_is_expected() {
    let host = request_host("req-context");
    host.session
        .append(
            EventData::UserMessage(Message::user(
                vec![ContentBlock::text("[step context]")],
                MessageSource::plugin("x"),
            )),
            Some(SurfaceMeta::append()),
        )
        .unwrap();
    let messages = agent::derive_messages(host.session.events().iter());
    assert_eq!(messages.len(), host.boundary.len() + 1);
    let chunks = dispatch(&host.model, loop_request(Some(host.session.id()), "m", messages));
    assert!(veto(&chunks).is_none(), "{chunks:?}");
    // The boundary derivation alone now lacks the context: a divergence.
    let chunks = dispatch(
        &host.model,
        loop_request(Some(host.session.id()), "m", host.boundary.clone()),
    );
    assert!(veto(&chunks).is_some());
    assert_eq!(rules(&host.check.violations()), ["L7"]);
}

/// spec: ICMP-162 — any extra prefix or suffix message fails as derivation divergence.
#[test]
fn icmp_162_extra_prefix_or_suffix_diverges() {
    let host = request_host("req-extra");
    let extra = Message::user_text("<system-reminder>catalog</system-reminder>");
    let id = host.session.id();
    assert!(
        veto(&dispatch(
            &host.model,
            loop_request(Some(id), "m", host.boundary.clone())
        ))
        .is_none()
    );
    let mut prefixed = vec![extra.clone()];
    prefixed.extend(host.boundary.clone());
    let mut suffixed = host.boundary.clone();
    suffixed.push(extra);
    for messages in [prefixed, suffixed] {
        let chunks = dispatch(&host.model, loop_request(Some(id), "m", messages));
        let failure = veto(&chunks).expect("vetoed");
        assert!(
            failure
                .message
                .contains("diverges from the dispatch-time durable derivation"),
            "{}",
            failure.message
        );
        assert!(
            failure
                .message
                .starts_with("invariant violated by \"agent-loop\": [L7] session \"req-extra\""),
            "{}",
            failure.message
        );
    }
    assert_eq!(rules(&host.check.violations()), ["L7", "L7"]);
    assert_eq!(
        host.inner.calls.load(Ordering::SeqCst),
        1,
        "vetoed requests never reach the adapter"
    );
}

/// spec: ICMP-163 — message divergence and header (model) divergence are both rejected.
#[test]
fn icmp_163_message_and_header_divergence_are_rejected() {
    let host = request_host("req-diverge");
    let id = host.session.id();
    let mut divergent = host.boundary.clone();
    divergent.push(Message::user_text("phantom"));
    assert!(veto(&dispatch(&host.model, loop_request(Some(id), "m", divergent))).is_some());
    let chunks = dispatch(
        &host.model,
        loop_request(Some(id), "other", host.boundary.clone()),
    );
    let failure = veto(&chunks).expect("vetoed");
    assert!(failure.message.contains("[L8]"), "{}", failure.message);
    assert!(
        failure.message.contains("model \"m\" (request has \"other\")"),
        "{}",
        failure.message
    );
    // The other header fields: system, temperature, max tokens, stop, tools (absent ≡ empty).
    let base = || GenerateOptions {
        session_id: Some(id.clone()),
        loop_built: true,
        ..GenerateOptions::new("mock", "m", host.boundary.clone())
    };
    let variants = [
        GenerateOptions {
            system: Some("s".into()),
            ..base()
        },
        GenerateOptions {
            temperature: Some(0.5),
            ..base()
        },
        GenerateOptions {
            max_tokens: Some(10),
            ..base()
        },
        GenerateOptions {
            stop: Some(vec!["x".into()]),
            ..base()
        },
        GenerateOptions {
            tools: Some(vec![agent::ToolSchema {
                name: "t".into(),
                description: "d".into(),
                parameters: serde_json::json!({"type": "object"}),
            }]),
            ..base()
        },
    ];
    for request in variants {
        assert!(veto(&dispatch(&host.model, Arc::new(request))).is_some());
    }
    let empty_tools = GenerateOptions {
        tools: Some(Vec::new()),
        ..base()
    };
    assert!(
        veto(&dispatch(&host.model, Arc::new(empty_tools))).is_none(),
        "absent tools equal an empty list"
    );
    assert_eq!(
        rules(&host.check.violations()),
        ["L7", "L8", "L8", "L8", "L8", "L8", "L8"]
    );
}

/// spec: ICMP-164 — a missing `step/start` or a missing `request/header` is rejected (and so is a
/// request outside the open step).
#[test]
fn icmp_164_missing_step_or_header_is_rejected() {
    let s = session("req-bare");
    s.append(EventData::TurnStart { turn: 1 }, None).unwrap();
    let live = s.clone();
    let check = RequestCheck::with_lookup(move |id| (id == live.id()).then(|| live.clone()));
    let bare = loop_request(Some(s.id()), "m", Vec::new());
    let found = check.check(&bare).unwrap_err();
    assert_eq!(rules(&found), ["L5", "L6"]);
    assert!(found[0].expected.contains("holds no step/start"), "{}", found[0]);
    s.append(EventData::StepStart { turn: 1, step: 1 }, None).unwrap();
    let found = check.check(&bare).unwrap_err();
    assert_eq!(rules(&found), ["L6"]);
    assert!(found[0].expected.contains("request/header"), "{}", found[0]);
    s.append(request_header("m"), None).unwrap();
    assert!(check.check(&bare).is_ok());
    // After the step closed, a dispatch is outside any step.
    s.append(EventData::StepEnd { turn: 1, step: 1 }, None).unwrap();
    let found = check.check(&bare).unwrap_err();
    assert_eq!(rules(&found), ["L5"]);
    assert!(found[0].expected.contains("is closed"), "{}", found[0]);
    assert!(check.violations().is_empty(), "`check` is pure; `verify` records");
}

/// spec: ICMP-165 — an unfrozen messages list cannot exist (Rust: the request is an immutable
/// `Arc<GenerateOptions>`, so the messages the check read are the messages the adapter gets);
/// unmarked requests are skipped.
#[test]
fn icmp_165_unmarked_requests_are_skipped() {
    let host = request_host("req-unmarked");
    // L4 by construction: the check and the adapter see the same list.
    let request = loop_request(Some(host.session.id()), "m", host.boundary.clone());
    assert!(veto(&dispatch(&host.model, request.clone())).is_none());
    let seen = host.inner.last.lock().unwrap().clone().unwrap();
    assert!(agent::MessageList::ptr_eq(&seen.messages, &request.messages));
    // Unmarked: a summariser, a request without session, one naming a ghost session, a direct
    // one-shot call on a live session with an empty log.
    let unmarked = [
        GenerateOptions {
            session_id: Some(host.session.id().clone()),
            ..GenerateOptions::new("mock", "summarizer", Vec::new())
        },
        GenerateOptions::new("mock", "m", Vec::new()),
        GenerateOptions {
            session_id: Some("ghost".into()),
            ..GenerateOptions::new("mock", "m", Vec::new())
        },
    ];
    for request in unmarked {
        assert!(veto(&dispatch(&host.model, Arc::new(request))).is_none());
    }
    assert!(host.check.violations().is_empty());
    assert_eq!(host.inner.calls.load(Ordering::SeqCst), 4);
}

/// spec: ICMP-166 — a marked request that lacks a session id or names a non-live session is
/// rejected (an unfrozen request cannot be built: see ICMP-165).
#[test]
fn icmp_166_marked_request_without_live_session_is_rejected() {
    let host = request_host("req-marked");
    let chunks = dispatch(&host.model, loop_request(None, "m", Vec::new()));
    let failure = veto(&chunks).expect("vetoed");
    assert!(failure.message.contains("[L2]"), "{}", failure.message);
    assert!(failure.message.contains("carry a session id"));
    let chunks = dispatch(
        &host.model,
        loop_request(Some(&"missing-loop-session".into()), "m", Vec::new()),
    );
    let failure = veto(&chunks).expect("vetoed");
    assert!(failure.message.contains("[L3]"), "{}", failure.message);
    assert!(
        failure
            .message
            .contains("no session \"missing-loop-session\" is live")
    );
    assert_eq!(rules(&host.check.violations()), ["L2", "L3"]);
    assert_eq!(host.inner.calls.load(Ordering::SeqCst), 0);
}

/// spec: ICMP-167 — the check runs before a short-circuiting stream: the wrapped adapter (which
/// answers at once) is never called for a divergent request.
#[test]
fn icmp_167_check_runs_before_a_short_circuiting_adapter() {
    let host = request_host("prepend-check");
    let divergent = vec![Message::user_text("phantom")];
    let chunks = dispatch(&host.model, loop_request(Some(host.session.id()), "m", divergent));
    let failure = veto(&chunks).expect("vetoed");
    assert!(
        failure
            .message
            .contains("diverges from the dispatch-time durable derivation")
    );
    assert_eq!(host.inner.calls.load(Ordering::SeqCst), 0);
    // An unbound check is inert (a companion that is not installed checks nothing).
    let unbound = RequestCheck::new();
    let model = unbound.wrap(host.inner.clone());
    let chunks = dispatch(
        &model,
        loop_request(Some(host.session.id()), "m", vec![Message::user_text("phantom")]),
    );
    assert!(veto(&chunks).is_none());
    assert_eq!(host.inner.calls.load(Ordering::SeqCst), 1);
    // Binding activates it; dropping the binding makes it inert again.
    let live = host.session.clone();
    let guard = unbound.bind(move |id| (id == live.id()).then(|| live.clone()));
    assert!(unbound.is_bound());
    assert!(
        veto(&dispatch(
            &model,
            loop_request(Some(host.session.id()), "m", Vec::new())
        ))
        .is_some()
    );
    drop(guard);
    assert!(!unbound.is_bound());
}

// ---------------------------------------------------------------------------------------------
// Seam lifecycle (B1–B8)
// ---------------------------------------------------------------------------------------------

struct Provider(String);

#[async_trait]
impl SubagentProvider for Provider {
    fn name(&self) -> &str {
        &self.0
    }
    fn capabilities(&self) -> subagent::capabilities::SubagentCapabilities {
        NO_START_CAPABILITIES
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    async fn start(
        &self,
        _request: ResolvedSubagentStartRequest,
    ) -> Result<Box<dyn SubagentRun>, SubagentError> {
        Err(SubagentError::no_provider(&self.0))
    }
}

fn provider(name: &str) -> Arc<dyn SubagentProvider> {
    Arc::new(Provider(name.into()))
}

fn start() -> SubagentRunInfo {
    SubagentRunInfo {
        run_id: "run-1".into(),
        provider: "mock".into(),
        id: "child-1".into(),
        local: false,
        parent: "parent".into(),
    }
}

fn end(info: SubagentRunInfo) -> SubagentRunEndInfo {
    SubagentRunEndInfo {
        info,
        stop_reason: StopReason::Completed,
        last_assistant_message: None,
    }
}

fn seam() -> (SubagentService, Arc<SeamLifecycleCompanion>, agent::Registration) {
    let service = SubagentService::new();
    let companion = SeamLifecycleCompanion::new();
    let guard = companion.listen(&service);
    (service, companion, guard)
}

/// spec: ICMP-168 — valid provider and run lifecycle pairs pass.
/// spec: INV-1 — well-formed provider add/remove and run start/end pairs pass.
#[test]
fn icmp_168_inv_1_valid_pairs_pass() {
    let (service, companion, _guard) = seam();
    let bus = service.events();
    bus.try_emit(&SubagentEvent::ProviderAdded(provider("mock")))
        .unwrap();
    bus.try_emit(&SubagentEvent::Start(start())).unwrap();
    assert_eq!(companion.open_runs(), 1);
    bus.try_emit(&SubagentEvent::End(end(start()))).unwrap();
    bus.try_emit(&SubagentEvent::ProviderRemoved("mock".into()))
        .unwrap();
    assert_eq!(companion.open_runs(), 0);
    // The same through the service itself: register, unregister.
    let registration = service.register_provider(provider("real")).unwrap();
    drop(registration);
    assert!(companion.violations().is_empty(), "{:?}", companion.violations());
}

/// spec: ICMP-169 — empty provider names, repeated adds and removal of unknown providers are
/// rejected.
/// spec: INV-2 — an empty provider name, a repeated add and removal of an unknown provider fail.
#[test]
fn icmp_169_inv_2_malformed_provider_transitions_are_rejected() {
    let (service, companion, _guard) = seam();
    let bus = service.events();
    let err = bus
        .try_emit(&SubagentEvent::ProviderAdded(provider("")))
        .unwrap_err();
    assert!(err.message.contains("names to be non-empty"), "{}", err.message);
    let mock = provider("mock");
    bus.try_emit(&SubagentEvent::ProviderAdded(mock.clone())).unwrap();
    let err = bus.try_emit(&SubagentEvent::ProviderAdded(mock)).unwrap_err();
    assert!(
        err.message.contains("repeat the registered \"mock\""),
        "{}",
        err.message
    );
    let err = bus
        .try_emit(&SubagentEvent::ProviderRemoved("missing".into()))
        .unwrap_err();
    assert!(
        err.message.contains("unknown provider \"missing\""),
        "{}",
        err.message
    );
    let found = companion.violations();
    assert_eq!(rules(&found), ["B1", "B2", "B3"]);
    assert!(
        found
            .iter()
            .all(|v| v.session.as_str() == PROVIDER_REGISTRY_SESSION)
    );
    assert!(
        found[0]
            .veto_text()
            .starts_with("invariant violated by \"subagent\": [B1]")
    );

    // Through the service, an empty name is vetoed: the uncontained add unwinds the registration.
    match service.register_provider(provider("")) {
        Err(RegisterError::Listener(e)) => assert!(e.message.contains("[B1]"), "{}", e.message),
        other => panic!("expected the companion's veto, got {other:?}"),
    }
    assert!(service.list().is_empty());
}

/// spec: ICMP-170 — empty fields, repeated run ids, unmatched ends and diverging end identity are
/// rejected.
/// spec: INV-3 — empty provider or run id on start, a repeated run id, an end without start and
/// an end whose identity diverges fail.
#[test]
fn icmp_170_inv_3_malformed_run_transitions_are_rejected() {
    let (service, companion, _guard) = seam();
    let bus = service.events();
    let cases = [
        SubagentRunInfo {
            provider: String::new(),
            ..start()
        },
        SubagentRunInfo {
            run_id: String::new(),
            ..start()
        },
        SubagentRunInfo {
            id: "".into(),
            ..start()
        },
    ];
    for info in cases {
        let err = bus.try_emit(&SubagentEvent::Start(info)).unwrap_err();
        assert!(
            err.message
                .contains("provider, runId, and child id to be non-empty"),
            "{}",
            err.message
        );
    }
    bus.try_emit(&SubagentEvent::Start(start())).unwrap();
    let err = bus.try_emit(&SubagentEvent::Start(start())).unwrap_err();
    assert!(err.message.contains("repeat the open run id"), "{}", err.message);
    let err = bus
        .try_emit(&SubagentEvent::End(end(SubagentRunInfo {
            run_id: "missing".into(),
            ..start()
        })))
        .unwrap_err();
    assert!(
        err.message.contains("no matching subagent/start"),
        "{}",
        err.message
    );
    for diverging in [
        SubagentRunInfo {
            id: "other".into(),
            ..start()
        },
        SubagentRunInfo {
            provider: "other".into(),
            ..start()
        },
        SubagentRunInfo {
            local: true,
            ..start()
        },
    ] {
        let err = bus.try_emit(&SubagentEvent::End(end(diverging))).unwrap_err();
        assert!(err.message.contains("identity diverges"), "{}", err.message);
    }
    let found = companion.violations();
    assert_eq!(rules(&found), ["B4", "B4", "B4", "B5", "B6", "B7", "B7", "B7"]);
    assert!(
        found.iter().all(|v| v.session.as_str() == "parent"),
        "run findings name the parent"
    );
    // Rejected notifications changed nothing: the run is still open and a matching end passes.
    assert_eq!(companion.open_runs(), 1);
    bus.try_emit(&SubagentEvent::End(end(start()))).unwrap();
    assert_eq!(companion.open_runs(), 0);
}

/// spec: ICMP-171 — a recorded provider name is accepted after the provider was removed.
/// spec: INV-4 — a run naming a provider that has already been removed passes.
#[test]
fn icmp_171_inv_4_removed_provider_name_is_accepted() {
    let (service, companion, _guard) = seam();
    let bus = service.events();
    let registration = service.register_provider(provider("historical")).unwrap();
    drop(registration);
    let info = SubagentRunInfo {
        provider: "historical".into(),
        ..start()
    };
    bus.try_emit(&SubagentEvent::Start(info.clone())).unwrap();
    bus.try_emit(&SubagentEvent::End(end(info))).unwrap();
    assert!(companion.violations().is_empty());
}

/// A registration that a later `provider-added` listener unwinds does not count as registered:
/// adding the name again is not a repeat (the reference's staging, done here by consulting the
/// service).
#[test]
fn a_registration_unwound_by_a_later_listener_is_not_registered() {
    let (service, companion, _guard) = seam();
    let refuse = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = refuse.clone();
    let _later = service.events().on(move |e| {
        if matches!(e, SubagentEvent::ProviderAdded(_)) && flag.load(Ordering::SeqCst) {
            return Err("refused".into());
        }
        Ok(())
    });
    assert!(service.register_provider(provider("spawn")).is_err());
    refuse.store(false, Ordering::SeqCst);
    let registration = service
        .register_provider(provider("spawn"))
        .expect("the retry is not a repeated add");
    drop(registration);
    assert!(companion.violations().is_empty(), "{:?}", companion.violations());
    // Providers registered before the companion listened are known to it.
    let early = service.register_provider(provider("early")).unwrap();
    let late = SeamLifecycleCompanion::new();
    let _g = late.listen(&service);
    drop(early);
    assert!(late.violations().is_empty(), "{:?}", late.violations());
}
