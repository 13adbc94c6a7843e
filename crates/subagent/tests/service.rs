//! The provider registry, `start` validation and lifecycle events (spec §2.2, §2.5, §2.13).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use agent::{
    Agent, AgentError, AgentOptions, AgentRef, AgentStatus, CancelCause, CancelOptions, ContentBlock,
    InboxSnapshot, InboxTarget, Message, MessageId, Scope, Session, SessionId, SessionMeta, Signal,
};
use async_trait::async_trait;
use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::json;
use subagent::capabilities::SubagentCapabilities;
use subagent::error::{SubagentError, SubagentErrorCode};
use subagent::events::SubagentEvent;
use subagent::provider::{ResolvedSubagentStartRequest, SubagentProvider, SubagentStartRequest};
use subagent::result::{StopReason, SubagentResult};
use subagent::run::{RunDisposeFuture, RunFailure, RunResultFuture, SettledCallback, SubagentRun};
use subagent::service::{RegisterError, StartError, SubagentService};
use tokio::sync::oneshot;

/// A parent agent double: only its identity matters to the service.
struct Parent {
    id: SessionId,
    options: AgentOptions,
    session: Arc<Session>,
    scope: Arc<Scope>,
}

impl Parent {
    fn agent(id: &str) -> AgentRef {
        let header = SessionMeta::default().into_header(id.into(), 1).unwrap();
        Arc::new(Self {
            id: id.into(),
            options: AgentOptions::default(),
            session: Arc::new(Session::new(header, None).unwrap()),
            scope: Arc::new(Scope::new(id.into(), None)),
        })
    }
}

impl Agent for Parent {
    fn id(&self) -> &SessionId {
        &self.id
    }
    fn options(&self) -> &AgentOptions {
        &self.options
    }
    fn session(&self) -> &Arc<Session> {
        &self.session
    }
    fn scope(&self) -> &Arc<Scope> {
        &self.scope
    }
    fn send(&self, message: Message, _: InboxTarget, _: bool) -> Result<MessageId, AgentError> {
        Ok(message.id)
    }
    fn remove_pending(&self, _: &MessageId) -> Result<bool, AgentError> {
        Ok(false)
    }
    fn inbox(&self) -> InboxSnapshot {
        InboxSnapshot::default()
    }
    fn cancel(&self, _: CancelCause, _: CancelOptions) {}
    fn status(&self) -> AgentStatus {
        AgentStatus::Idle
    }
    fn when_idle(&self) -> BoxFuture<'static, ()> {
        async {}.boxed()
    }
    fn is_live(&self) -> bool {
        true
    }
}

type ResultSender = oneshot::Sender<Result<SubagentResult, RunFailure>>;

/// A run whose result is settled by the test.
struct FakeRun {
    id: SessionId,
    result: RunResultFuture,
    dispose: RunDisposeFuture,
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
        self.dispose.clone()
    }
}

fn fake_run(id: &str) -> (FakeRun, ResultSender) {
    let (tx, rx) = oneshot::channel();
    let result = async move {
        rx.await
            .unwrap_or_else(|_| Ok(SubagentResult::new(vec![], StopReason::Aborted)))
    }
    .boxed()
    .shared();
    let r2 = result.clone();
    let dispose = async move {
        let _ = r2.await;
        Ok(())
    }
    .boxed()
    .shared();
    (
        FakeRun {
            id: id.into(),
            result,
            dispose,
        },
        tx,
    )
}

#[derive(Default)]
struct Calls {
    requests: Vec<ResolvedSubagentStartRequest>,
    senders: Vec<ResultSender>,
}

/// A provider whose starts are recorded; it answers with [`FakeRun`]s or a scripted error.
struct FakeProvider {
    name: String,
    caps: SubagentCapabilities,
    calls: Mutex<Calls>,
    fail: Option<SubagentError>,
    gate: Mutex<Option<oneshot::Receiver<()>>>,
}

impl FakeProvider {
    fn new(name: &str, caps: SubagentCapabilities) -> Arc<Self> {
        Arc::new(Self {
            name: name.into(),
            caps,
            calls: Mutex::default(),
            fail: None,
            gate: Mutex::new(None),
        })
    }
    fn calls(&self) -> usize {
        self.calls.lock().requests.len()
    }
    fn settle(&self, i: usize, r: Result<SubagentResult, RunFailure>) {
        let tx = std::mem::replace(&mut self.calls.lock().senders[i], oneshot::channel().0);
        let _ = tx.send(r);
    }
}

#[async_trait]
impl SubagentProvider for FakeProvider {
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
        let gate = self.gate.lock().take();
        if let Some(gate) = gate {
            let _ = gate.await;
        }
        if let Some(e) = &self.fail {
            return Err(e.clone());
        }
        let (run, tx) = fake_run("child-1");
        let mut calls = self.calls.lock();
        calls.requests.push(request);
        calls.senders.push(tx);
        Ok(Box::new(run))
    }
}

fn request(parent: &AgentRef) -> SubagentStartRequest {
    SubagentStartRequest::new(vec![ContentBlock::text("do it")], parent.clone(), Signal::new())
}

fn record(service: &SubagentService) -> (Arc<Mutex<Vec<String>>>, agent::Registration) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let guard = service.events().on(move |e| {
        let line = match e {
            SubagentEvent::ProviderAdded(p) => format!("provider-added {}", p.name()),
            SubagentEvent::ProviderRemoved(n) => format!("provider-removed {n}"),
            SubagentEvent::Start(i) => format!("start {} {} {}", i.provider, i.id, i.parent),
            SubagentEvent::End(e) => format!("end {} {}", e.info.provider, e.stop_reason.as_str()),
            _ => "other".into(),
        };
        s.lock().push(line);
        Ok(())
    });
    (seen, guard)
}

/// spec: SVC-1
#[tokio::test]
async fn svc_1_register_list_start_and_remove() {
    let service = SubagentService::new();
    let (seen, _g) = record(&service);
    let provider = FakeProvider::new("spawn", SubagentCapabilities::ALL);
    let guard = service.register_provider(provider.clone()).unwrap();
    assert_eq!(service.list(), vec!["spawn".to_owned()]);
    let got = service.get_provider("spawn").unwrap();
    assert!(Arc::ptr_eq(
        &got,
        &(provider.clone() as Arc<dyn SubagentProvider>)
    ));
    let parent = Parent::agent("p");
    let run = service.start("spawn", request(&parent)).await.unwrap();
    provider.settle(
        0,
        Ok(SubagentResult::new(
            vec![ContentBlock::text("ok")],
            StopReason::Completed,
        )),
    );
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
    run.dispose().await.unwrap();
    assert_eq!(provider.calls(), 1);
    service.close().await;
    drop(guard);
    assert!(service.get_provider("spawn").is_none());
    let seen = seen.lock().clone();
    assert_eq!(seen.first().unwrap(), "provider-added spawn");
    assert_eq!(seen.last().unwrap(), "provider-removed spawn");
}

/// spec: SVC-2
#[test]
fn svc_2_failing_provider_added_listener_unwinds_registration() {
    let service = SubagentService::new();
    let _g = service.events().on(|e| match e {
        SubagentEvent::ProviderAdded(_) => Err("listener refused".into()),
        _ => Ok(()),
    });
    let err = service
        .register_provider(FakeProvider::new("spawn", SubagentCapabilities::ALL))
        .unwrap_err();
    assert!(matches!(err, RegisterError::Listener(_)));
    assert_eq!(err.to_string(), "event listener failed: listener refused");
    assert!(service.list().is_empty());
}

/// spec: SVC-2 — a listener that accepted the addition (a tool plugin that mounted its tool)
/// hears the removal when a later listener refuses it, so nothing stays mounted for a provider
/// that is not registered; a listener after the refusal hears neither.
#[test]
fn svc_2_a_refused_registration_is_withdrawn_from_the_listeners_that_accepted_it() {
    let service = SubagentService::new();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let record = |who: &'static str| {
        let heard = heard.clone();
        move |e: &SubagentEvent| {
            match e {
                SubagentEvent::ProviderAdded(p) => heard.lock().push(format!("{who}: added {}", p.name())),
                SubagentEvent::ProviderRemoved(name) => heard.lock().push(format!("{who}: removed {name}")),
                _ => {}
            }
            Ok(())
        }
    };
    let _mounting = service.events().on(record("mounting"));
    let _refusing = service.events().on(|e| match e {
        SubagentEvent::ProviderAdded(_) => Err("listener refused".into()),
        _ => Ok(()),
    });
    let _later = service.events().on(record("later"));
    let err = service
        .register_provider(FakeProvider::new("spawn", SubagentCapabilities::ALL))
        .unwrap_err();
    assert!(matches!(err, RegisterError::Listener(_)));
    assert!(service.list().is_empty());
    assert_eq!(
        *heard.lock(),
        vec![
            "mounting: added spawn".to_owned(),
            "mounting: removed spawn".to_owned()
        ]
    );
}

/// spec: SVC-3
#[tokio::test]
async fn svc_3_duplicate_provider_and_unknown_name() {
    let service = SubagentService::new();
    let _g = service
        .register_provider(FakeProvider::new("spawn", SubagentCapabilities::ALL))
        .unwrap();
    let err = service
        .register_provider(FakeProvider::new("spawn", SubagentCapabilities::ALL))
        .unwrap_err();
    match err {
        RegisterError::Subagent(e) => assert_eq!(e.code(), SubagentErrorCode::DuplicateProvider),
        other => panic!("unexpected {other:?}"),
    }
    let parent = Parent::agent("p");
    let Err(StartError::Subagent(e)) = service.start("nope", request(&parent)).await else {
        panic!("expected NO_PROVIDER");
    };
    assert_eq!(e.code(), SubagentErrorCode::NoProvider);
}

/// spec: SVC-4
#[tokio::test]
async fn svc_4_provider_receives_fields_and_descriptor() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("spawn", SubagentCapabilities::ALL);
    let _g = service.register_provider(provider.clone()).unwrap();
    let parent = Parent::agent("p");
    let run = service.start("spawn", request(&parent)).await.unwrap();
    {
        let calls = provider.calls.lock();
        let r = &calls.requests[0];
        assert_eq!(r.request.prompt, vec![ContentBlock::text("do it")]);
        assert_eq!(
            r.descriptor.to_payload(),
            json!({"version": 2, "mode": "one-shot", "provider": "spawn"})
        );
        assert_eq!(r.descriptor_event.type_name(), "subagent/descriptor");
    }
    let mut labelled = request(&parent);
    labelled.label = Some("lbl".into());
    let run2 = service.start("spawn", labelled).await.unwrap();
    assert_eq!(
        provider.calls.lock().requests[1].descriptor.to_payload(),
        json!({"version": 2, "mode": "one-shot", "provider": "spawn", "label": "lbl"})
    );
    provider.settle(0, Ok(SubagentResult::new(vec![], StopReason::Completed)));
    provider.settle(1, Ok(SubagentResult::new(vec![], StopReason::Completed)));
    run.dispose().await.unwrap();
    run2.dispose().await.unwrap();
    service.close().await;
}

/// spec: SVC-8
#[tokio::test]
async fn svc_8_unsupported_capabilities_reject_before_the_provider() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("bare", SubagentCapabilities::default());
    let _g = service.register_provider(provider.clone()).unwrap();
    let parent = Parent::agent("p");
    type Setter = Box<dyn Fn(&mut SubagentStartRequest)>;
    let variants: Vec<Setter> = vec![
        Box::new(|r| r.output_schema = Some(json!({"type": "object"}))),
        Box::new(|r| r.max_depth = Some(json!(1))),
        Box::new(|r| {
            r.tool_filter = Some(subagent::composition::ToolFilter {
                allow: Some(vec!["x".into()]),
                deny: None,
            })
        }),
        Box::new(|r| r.persona = Some(String::new())),
    ];
    for set in variants {
        let mut req = request(&parent);
        set(&mut req);
        let Err(StartError::Subagent(e)) = service.start("bare", req).await else {
            panic!("expected UNSUPPORTED_CAPABILITY");
        };
        assert_eq!(e.code(), SubagentErrorCode::UnsupportedCapability);
    }
    // Capability checks precede value checks.
    let mut req = request(&parent);
    req.max_depth = Some(json!(-1));
    let Err(StartError::Subagent(e)) = service.start("bare", req).await else {
        panic!("expected UNSUPPORTED_CAPABILITY");
    };
    assert_eq!(e.code(), SubagentErrorCode::UnsupportedCapability);
    assert_eq!(provider.calls(), 0);
}

/// spec: SVC-9
#[tokio::test]
async fn svc_9_bad_depth_and_schema_reject_before_the_provider() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("all", SubagentCapabilities::ALL);
    let _g = service.register_provider(provider.clone()).unwrap();
    let parent = Parent::agent("p");
    let mut req = request(&parent);
    req.max_depth = Some(json!(-1));
    let Err(StartError::Depth(e)) = service.start("all", req).await else {
        panic!("expected a depth error");
    };
    assert!(e.to_string().contains("non-negative safe integer"), "{e}");
    let mut req = request(&parent);
    req.output_schema = Some(json!({"type": "string"}));
    let Err(StartError::Subagent(e)) = service.start("all", req).await else {
        panic!("expected UNSUPPORTED_SCHEMA");
    };
    assert_eq!(e.code(), SubagentErrorCode::UnsupportedSchema);
    assert_eq!(provider.calls(), 0);
    assert_eq!(
        subagent::depth::assert_subagent_max_depth::<u64>(None).unwrap(),
        None
    );
}

/// spec: SVC-10
#[tokio::test]
async fn svc_10_lifecycle_edges_are_ordered_and_scoped_by_the_parent() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("spawn", SubagentCapabilities::ALL);
    let (gate_tx, gate_rx) = oneshot::channel();
    *provider.gate.lock() = Some(gate_rx);
    let _g = service.register_provider(provider.clone()).unwrap();
    let parent = Parent::agent("p");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let _scoped = service.events().on_scoped("p".into(), move |e| {
        match e {
            SubagentEvent::Start(i) => s.lock().push(("start", i.run_id.clone())),
            SubagentEvent::End(e) => s.lock().push(("end", e.info.run_id.clone())),
            _ => {}
        }
        Ok(())
    });
    let other = Arc::new(Mutex::new(0));
    let o = other.clone();
    let _other = service.events().on_scoped("someone-else".into(), move |_| {
        *o.lock() += 1;
        Ok(())
    });
    let svc = service.clone();
    let parent2 = parent.clone();
    let pending = tokio::spawn(async move { svc.start("spawn", request(&parent2)).await });
    tokio::task::yield_now().await;
    assert!(
        seen.lock().is_empty(),
        "no edge while the provider start is pending"
    );
    gate_tx.send(()).unwrap();
    let run = pending.await.unwrap().unwrap();
    assert_eq!(seen.lock().len(), 1);
    provider.settle(0, Ok(SubagentResult::new(vec![], StopReason::Completed)));
    run.dispose().await.unwrap();
    service.close().await;
    let seen = seen.lock().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!((seen[0].0, seen[1].0), ("start", "end"));
    assert_eq!(seen[0].1, seen[1].1);
    assert_eq!(*other.lock(), 0);
}

/// spec: SVC-11
#[tokio::test]
async fn svc_11_identical_children_get_distinct_run_ids() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("spawn", SubagentCapabilities::ALL);
    let _g = service.register_provider(provider.clone()).unwrap();
    let ids = Arc::new(Mutex::new(Vec::new()));
    let i = ids.clone();
    let _l = service.events().on(move |e| {
        if let SubagentEvent::Start(info) = e {
            i.lock().push((info.run_id.clone(), info.id.clone()));
        }
        Ok(())
    });
    let parent = Parent::agent("p");
    let a = service.start("spawn", request(&parent)).await.unwrap();
    let b = service.start("spawn", request(&parent)).await.unwrap();
    let ids = ids.lock().clone();
    assert_eq!(ids[0].1, ids[1].1);
    assert_ne!(ids[0].0, ids[1].0);
    provider.settle(0, Ok(SubagentResult::new(vec![], StopReason::Completed)));
    provider.settle(1, Ok(SubagentResult::new(vec![], StopReason::Completed)));
    a.dispose().await.unwrap();
    b.dispose().await.unwrap();
    service.close().await;
}

/// spec: SVC-12
#[tokio::test]
async fn svc_12_provider_rejection_propagates_without_edges() {
    let service = SubagentService::new();
    let provider = Arc::new(FakeProvider {
        name: "bad".into(),
        caps: SubagentCapabilities::ALL,
        calls: Mutex::default(),
        fail: Some(SubagentError::persistence_unavailable()),
        gate: Mutex::new(None),
    });
    let _g = service.register_provider(provider).unwrap();
    let (seen, _r) = record(&service);
    let parent = Parent::agent("p");
    let Err(StartError::Subagent(e)) = service.start("bad", request(&parent)).await else {
        panic!("expected the provider's error");
    };
    assert_eq!(e.code(), SubagentErrorCode::PersistenceUnavailable);
    assert!(seen.lock().is_empty());
}

/// spec: SVC-13
#[tokio::test]
async fn svc_13_end_edge_carries_output_and_reason() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("spawn", SubagentCapabilities::ALL);
    let _g = service.register_provider(provider.clone()).unwrap();
    let ends = Arc::new(Mutex::new(Vec::new()));
    let e2 = ends.clone();
    let _l = service.events().on(move |e| {
        if let SubagentEvent::End(end) = e {
            e2.lock().push(end.clone());
        }
        Ok(())
    });
    let parent = Parent::agent("p");
    let runs = [
        service.start("spawn", request(&parent)).await.unwrap(),
        service.start("spawn", request(&parent)).await.unwrap(),
        service.start("spawn", request(&parent)).await.unwrap(),
    ];
    provider.settle(
        0,
        Ok(SubagentResult::new(
            vec![ContentBlock::text("out")],
            StopReason::MaxTokens,
        )),
    );
    provider.settle(1, Ok(SubagentResult::new(vec![], StopReason::Completed)));
    provider.settle(2, Err(RunFailure::new(std::io::Error::other("transport gone"))));
    for r in &runs {
        let _ = r.dispose().await;
    }
    service.close().await;
    assert_eq!(runs[2].result().await.unwrap_err().to_string(), "transport gone");
    let mut ends = ends.lock().clone();
    ends.sort_by_key(|e| e.stop_reason.as_str().to_owned());
    let by = |r: StopReason| ends.iter().find(|e| e.stop_reason == r).unwrap().clone();
    let max = by(StopReason::MaxTokens);
    assert_eq!(max.info.provider, "spawn");
    assert_eq!(max.last_assistant_message, Some(vec![ContentBlock::text("out")]));
    assert_eq!(by(StopReason::Completed).last_assistant_message, None);
    assert_eq!(by(StopReason::Error).last_assistant_message, None);
}

/// A run that accepts the service's settled observer and leaves it to the test.
struct CallbackRun {
    run: FakeRun,
    observer: Arc<Mutex<Option<SettledCallback>>>,
}

impl SubagentRun for CallbackRun {
    fn id(&self) -> &SessionId {
        self.run.id()
    }
    fn local_agent(&self) -> Option<AgentRef> {
        None
    }
    fn result(&self) -> RunResultFuture {
        self.run.result()
    }
    fn dispose(&self) -> RunDisposeFuture {
        self.run.dispose()
    }
    fn on_settled(&self, callback: SettledCallback) -> Result<(), SettledCallback> {
        *self.observer.lock() = Some(callback);
        Ok(())
    }
}

/// A provider whose runs accept the settled observer (handing it to the test).
struct CallbackProvider {
    observers: Mutex<Vec<Arc<Mutex<Option<SettledCallback>>>>>,
}

#[async_trait]
impl SubagentProvider for CallbackProvider {
    fn name(&self) -> &str {
        "cb"
    }
    fn capabilities(&self) -> SubagentCapabilities {
        SubagentCapabilities::ALL
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    async fn start(&self, _: ResolvedSubagentStartRequest) -> Result<Box<dyn SubagentRun>, SubagentError> {
        let observer = Arc::new(Mutex::new(None));
        self.observers.lock().push(observer.clone());
        Ok(Box::new(CallbackRun {
            run: fake_run("child-cb").0,
            observer,
        }))
    }
}

/// spec: SVC-13 (a run that calls the service back: the `end` edge is emitted from the
/// settling task with the result it is given; a callback dropped uncalled still ends the run,
/// with `error`; either way the pending count returns to zero)
#[tokio::test]
async fn svc_13_end_edge_through_the_settled_callback() {
    let service = SubagentService::new();
    let provider = Arc::new(CallbackProvider {
        observers: Mutex::default(),
    });
    let _g = service.register_provider(provider.clone()).unwrap();
    let (seen, _l) = record(&service);
    let parent = Parent::agent("p");
    let _a = service.start("cb", request(&parent)).await.unwrap();
    let _b = service.start("cb", request(&parent)).await.unwrap();
    assert_eq!(service.pending_runs(), 2, "no task, but two pending ends");
    let observers: Vec<_> = provider.observers.lock().drain(..).collect();
    let first = observers[0]
        .lock()
        .take()
        .expect("the service registered its observer");
    first(&Ok(SubagentResult::new(
        vec![ContentBlock::text("out")],
        StopReason::MaxTokens,
    )));
    assert_eq!(service.pending_runs(), 1);
    drop(observers[1].lock().take());
    assert_eq!(service.pending_runs(), 0);
    service.close().await;
    assert_eq!(
        *seen.lock(),
        [
            "start cb child-cb p",
            "start cb child-cb p",
            "end cb max-tokens",
            "end cb error"
        ]
    );
}

/// spec: SVC-14
#[test]
fn svc_14_provider_removed_listener_failures_are_contained() {
    let service = SubagentService::new();
    let _a = service.events().on(|e| match e {
        SubagentEvent::ProviderRemoved(_) => Err("sync failure".into()),
        _ => Ok(()),
    });
    let _b = service.events().on(|e| match e {
        SubagentEvent::ProviderRemoved(_) => std::panic::panic_any(7u32),
        _ => Ok(()),
    });
    let got = Arc::new(Mutex::new(None));
    let g = got.clone();
    let _c = service.events().on(move |e| {
        if let SubagentEvent::ProviderRemoved(n) = e {
            *g.lock() = Some(n.clone());
        }
        Ok(())
    });
    let guard = service
        .register_provider(FakeProvider::new("spawn", SubagentCapabilities::ALL))
        .unwrap();
    drop(guard);
    assert_eq!(got.lock().as_deref(), Some("spawn"));
    assert!(service.list().is_empty());
}

/// spec: SVC-15
#[test]
fn svc_15_subagent_error_has_name_and_code() {
    let e = SubagentError::no_provider("x");
    assert_eq!(e.name(), "SubagentError");
    assert_eq!(e.code(), SubagentErrorCode::NoProvider);
    assert_eq!(e.code().as_str(), "NO_PROVIDER");
    let _ = CancelCause::User;
}

// ---- a misbehaving provider (third-party code the host did not write) ------------------

/// Where a [`Misbehaving`] provider or its run panics.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    /// `start` panics before it builds its future.
    StartSync,
    /// `start` panics on its first poll.
    StartFirstPoll,
    /// `start` panics after an await.
    StartAfterAwait,
    /// `capabilities` panics.
    Capabilities,
    /// The returned run's `id` panics.
    RunId,
    /// The returned run's `on_settled` panics (after dropping the callback).
    OnSettled,
    /// The returned run's `result` method panics.
    ResultMethod,
    /// The returned run's result future panics when polled.
    ResultFuture,
    /// The returned run's `dispose` panics.
    Dispose,
}

struct Misbehaving {
    fault: Fault,
}

/// A run that panics where its [`Fault`] says.
struct PanickyRun {
    fault: Fault,
    id: SessionId,
}

impl SubagentRun for PanickyRun {
    fn id(&self) -> &SessionId {
        if self.fault == Fault::RunId {
            panic!("run id exploded");
        }
        &self.id
    }
    fn local_agent(&self) -> Option<AgentRef> {
        None
    }
    fn result(&self) -> RunResultFuture {
        match self.fault {
            Fault::ResultMethod => panic!("result method exploded"),
            Fault::ResultFuture => async { panic!("result future exploded") }.boxed().shared(),
            _ => async { Ok(SubagentResult::new(vec![], StopReason::Completed)) }
                .boxed()
                .shared(),
        }
    }
    fn dispose(&self) -> RunDisposeFuture {
        if self.fault == Fault::Dispose {
            panic!("dispose exploded");
        }
        async { Ok(()) }.boxed().shared()
    }
    fn on_settled(&self, callback: SettledCallback) -> Result<(), SettledCallback> {
        if self.fault == Fault::OnSettled {
            drop(callback);
            panic!("on_settled exploded");
        }
        Err(callback)
    }
}

impl SubagentProvider for Misbehaving {
    fn name(&self) -> &str {
        "wild"
    }
    fn capabilities(&self) -> SubagentCapabilities {
        if self.fault == Fault::Capabilities {
            panic!("capabilities exploded");
        }
        SubagentCapabilities::ALL
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    fn start<'a, 'f>(
        &'a self,
        _: ResolvedSubagentStartRequest,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Box<dyn SubagentRun>, SubagentError>> + Send + 'f>,
    >
    where
        'a: 'f,
        Self: 'f,
    {
        if self.fault == Fault::StartSync {
            panic!("start exploded synchronously");
        }
        let fault = self.fault;
        async move {
            match fault {
                Fault::StartFirstPoll => panic!("start exploded on first poll"),
                Fault::StartAfterAwait => {
                    tokio::task::yield_now().await;
                    panic!("start exploded after an await")
                }
                _ => Ok(Box::new(PanickyRun {
                    fault,
                    id: "wild-child".into(),
                }) as Box<dyn SubagentRun>),
            }
        }
        .boxed()
    }
}

/// Starts a child on the misbehaving provider `wild`, catching a panic that escapes `start`
/// (the defect these tests guard against) so the test can report it.
async fn start_wild(
    service: &SubagentService,
    parent: &AgentRef,
) -> std::thread::Result<Result<Box<dyn SubagentRun>, StartError>> {
    AssertUnwindSafe(service.start("wild", request(parent)))
        .catch_unwind()
        .await
}

/// A panicking provider `start` (synchronous, on first poll, after an await) or `capabilities`
/// is a `PROVIDER_FAILED` start error naming the provider and the panic; nothing is left behind:
/// no lifecycle edge, no pending end, the registration intact and undone at the end.
#[tokio::test(start_paused = true)]
async fn a_panicking_provider_start_or_capabilities_is_a_typed_error() {
    let cases = [
        (Fault::StartSync, "start exploded synchronously"),
        (Fault::StartFirstPoll, "start exploded on first poll"),
        (Fault::StartAfterAwait, "start exploded after an await"),
        (Fault::Capabilities, "capabilities exploded"),
    ];
    for (fault, text) in cases {
        let service = SubagentService::new();
        let guard = service
            .register_provider(Arc::new(Misbehaving { fault }))
            .unwrap();
        let (seen, _l) = record(&service);
        let parent = Parent::agent("p");
        let started = start_wild(&service, &parent).await;
        let Ok(Err(StartError::Subagent(e))) = started else {
            panic!("{fault:?}: expected a typed start error");
        };
        assert_eq!(e.code(), SubagentErrorCode::ProviderFailed, "{fault:?}");
        assert!(e.message().contains("\"wild\""), "{fault:?}: {e}");
        assert!(e.message().contains(text), "{fault:?}: {e}");
        assert!(seen.lock().is_empty(), "{fault:?}: no edge for a rejected start");
        assert_eq!(service.pending_runs(), 0, "{fault:?}");
        assert_eq!(service.list(), ["wild"], "{fault:?}");
        service.close().await;
        drop(guard);
        assert!(service.list().is_empty());
    }
}

/// A run whose `id` panics right after the provider fulfilled is refused like a panicking start
/// (`PROVIDER_FAILED`, no edge): the service cannot describe it.
#[tokio::test(start_paused = true)]
async fn a_run_whose_id_panics_is_refused_without_edges() {
    let service = SubagentService::new();
    let _g = service
        .register_provider(Arc::new(Misbehaving { fault: Fault::RunId }))
        .unwrap();
    let (seen, _l) = record(&service);
    let parent = Parent::agent("p");
    let started = start_wild(&service, &parent).await;
    let Ok(Err(StartError::Subagent(e))) = started else {
        panic!("expected a typed start error");
    };
    assert_eq!(e.code(), SubagentErrorCode::ProviderFailed);
    assert!(e.message().contains("run id exploded"), "{e}");
    assert!(seen.lock().is_empty());
    assert_eq!(service.pending_runs(), 0);
    service.close().await;
}

/// An accepted run whose `on_settled` or `result` panics, or whose result future panics, is
/// still returned (it was published and `subagent/start` was emitted); its `end` edge is
/// `error` and nothing stays pending. A panicking `dispose` is the caller's to see: the service
/// never calls it.
#[tokio::test(start_paused = true)]
async fn panics_of_an_accepted_run_end_it_with_error() {
    for fault in [
        Fault::OnSettled,
        Fault::ResultMethod,
        Fault::ResultFuture,
        Fault::Dispose,
    ] {
        let service = SubagentService::new();
        let _g = service
            .register_provider(Arc::new(Misbehaving { fault }))
            .unwrap();
        let (seen, _l) = record(&service);
        let parent = Parent::agent("p");
        let started = start_wild(&service, &parent).await;
        let Ok(Ok(run)) = started else {
            panic!("{fault:?}: the accepted run must be returned");
        };
        service.close().await;
        assert_eq!(service.pending_runs(), 0, "{fault:?}");
        let expected_end = if fault == Fault::Dispose {
            "end wild completed"
        } else {
            "end wild error"
        };
        assert_eq!(
            *seen.lock(),
            ["start wild wild-child p", expected_end],
            "{fault:?}"
        );
        drop(run);
    }
}

/// spec: close waits (a run that never settles keeps its `end` pending; the `SubagentRun`
/// contract makes disposal settle the result, and then `close` returns)
#[tokio::test(start_paused = true)]
async fn close_waits_for_a_run_that_has_not_settled() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("spawn", SubagentCapabilities::ALL);
    let _g = service.register_provider(provider.clone()).unwrap();
    let parent = Parent::agent("p");
    let run = service.start("spawn", request(&parent)).await.unwrap();
    assert!(
        tokio::time::timeout(std::time::Duration::from_secs(3600), service.close())
            .await
            .is_err(),
        "close waits for the pending end"
    );
    assert_eq!(service.pending_runs(), 1);
    provider.settle(0, Ok(SubagentResult::new(vec![], StopReason::Completed)));
    run.dispose().await.unwrap();
    service.close().await;
    assert_eq!(service.pending_runs(), 0);
}

/// A `start` future dropped while the provider is pending leaves nothing in the service: no
/// edge, no pending end, the provider still registered and removable.
#[tokio::test(start_paused = true)]
async fn a_dropped_start_leaves_nothing_behind() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("spawn", SubagentCapabilities::ALL);
    let (_gate_tx, gate_rx) = oneshot::channel();
    *provider.gate.lock() = Some(gate_rx);
    let guard = service.register_provider(provider.clone()).unwrap();
    let (seen, _l) = record(&service);
    let parent = Parent::agent("p");
    {
        let start = service.start("spawn", request(&parent));
        futures::pin_mut!(start);
        assert!(futures::poll!(start.as_mut()).is_pending());
    }
    assert!(seen.lock().is_empty());
    assert_eq!(service.pending_runs(), 0);
    assert_eq!(provider.calls(), 0);
    service.close().await;
    drop(guard);
    assert!(service.list().is_empty());
}

/// A provider whose `name` panics is refused at registration with `PROVIDER_FAILED`; nothing
/// is registered and no event is emitted.
#[test]
fn a_panicking_name_is_refused_at_registration() {
    struct NoName;
    #[async_trait]
    impl SubagentProvider for NoName {
        fn name(&self) -> &str {
            panic!("name exploded")
        }
        fn capabilities(&self) -> SubagentCapabilities {
            SubagentCapabilities::ALL
        }
        fn inherits_parent_context(&self) -> bool {
            false
        }
        async fn start(
            &self,
            _: ResolvedSubagentStartRequest,
        ) -> Result<Box<dyn SubagentRun>, SubagentError> {
            unreachable!("never registered")
        }
    }
    let service = SubagentService::new();
    let (seen, _l) = record(&service);
    let registered =
        std::panic::catch_unwind(AssertUnwindSafe(|| service.register_provider(Arc::new(NoName))));
    let Ok(Err(RegisterError::Subagent(e))) = registered else {
        panic!("expected a typed registration error");
    };
    assert_eq!(e.code(), SubagentErrorCode::ProviderFailed);
    assert!(e.message().contains("name exploded"), "{e}");
    assert!(service.list().is_empty());
    assert!(seen.lock().is_empty());
}

/// A provider whose `name` changes after registration (or that calls back into the service from
/// `name` or `capabilities`).
struct Shifty {
    name: Mutex<String>,
    service: Mutex<Option<SubagentService>>,
}

#[async_trait]
impl SubagentProvider for Shifty {
    fn name(&self) -> &str {
        let service = self.service.lock().clone();
        if let Some(service) = service {
            // Reentrant: reads the registry the caller may be holding.
            let _ = service.list();
            let _ = service.get_provider("x");
        }
        // Leak a copy so the returned `&str` outlives the lock (a test double only).
        Box::leak(self.name.lock().clone().into_boxed_str())
    }
    fn capabilities(&self) -> SubagentCapabilities {
        let service = self.service.lock().clone();
        if let Some(service) = service {
            let _ = service.list();
            let _ = service.get_provider("x");
        }
        SubagentCapabilities::ALL
    }
    fn inherits_parent_context(&self) -> bool {
        false
    }
    async fn start(&self, _: ResolvedSubagentStartRequest) -> Result<Box<dyn SubagentRun>, SubagentError> {
        let (run, tx) = fake_run("shifty-child");
        let _ = tx.send(Ok(SubagentResult::new(vec![], StopReason::Completed)));
        Ok(Box::new(run))
    }
}

/// The registry keeps the name a provider had when it was registered: a later change moves
/// nothing (lookup, listing, duplicate check and `provider-removed` use the registered name).
#[tokio::test(start_paused = true)]
async fn a_provider_name_that_changes_after_registration_is_ignored() {
    let service = SubagentService::new();
    let (seen, _l) = record(&service);
    let shifty = Arc::new(Shifty {
        name: Mutex::new("a".into()),
        service: Mutex::new(None),
    });
    let guard = service.register_provider(shifty.clone()).unwrap();
    *shifty.name.lock() = "b".into();
    assert_eq!(service.list(), ["a"]);
    assert!(service.get_provider("a").is_some());
    assert!(service.get_provider("b").is_none());
    let Err(RegisterError::Subagent(e)) =
        service.register_provider(FakeProvider::new("a", SubagentCapabilities::ALL))
    else {
        panic!("\"a\" is still taken");
    };
    assert_eq!(e.code(), SubagentErrorCode::DuplicateProvider);
    let b = service
        .register_provider(FakeProvider::new("b", SubagentCapabilities::ALL))
        .unwrap();
    let parent = Parent::agent("p");
    let run = service.start("a", request(&parent)).await.unwrap();
    run.dispose().await.unwrap();
    service.close().await;
    drop(b);
    drop(guard);
    assert!(service.list().is_empty());
    let seen = seen.lock().clone();
    let removed: Vec<_> = seen
        .iter()
        .filter(|l| l.starts_with("provider-removed"))
        .collect();
    assert_eq!(removed, ["provider-removed b", "provider-removed a"], "{seen:?}");
}

/// Provider code (`name`, `capabilities`) is never called while the service holds its registry
/// lock: a provider that calls back into the service from them cannot deadlock registration,
/// lookup, listing or `start`. Runs on its own thread so a deadlock fails instead of hanging.
#[test]
fn provider_code_may_reenter_the_service() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let service = SubagentService::new();
            let shifty = Arc::new(Shifty {
                name: Mutex::new("reentrant".into()),
                service: Mutex::new(Some(service.clone())),
            });
            let a = service.register_provider(shifty.clone()).unwrap();
            let b = service
                .register_provider(FakeProvider::new("other", SubagentCapabilities::ALL))
                .unwrap();
            assert!(service.get_provider("other").is_some());
            assert_eq!(service.list(), ["reentrant", "other"]);
            let parent = Parent::agent("p");
            let run = service.start("reentrant", request(&parent)).await.unwrap();
            run.dispose().await.unwrap();
            service.close().await;
            drop(b);
            drop(a);
            assert!(service.list().is_empty());
            // Break the provider → service cycle.
            shifty.service.lock().take();
        });
        let _ = done_tx.send(());
    });
    done_rx
        .recv_timeout(std::time::Duration::from_secs(30))
        .expect("the service deadlocked on a provider calling back into it");
}

/// A run the service awaits on its own task counts once in `pending_runs`, and `close` may be
/// awaited from several tasks at once (every one returns once the last end is emitted).
#[tokio::test(start_paused = true)]
async fn a_task_awaited_run_counts_once_and_concurrent_closes_complete() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("spawn", SubagentCapabilities::ALL);
    let _g = service.register_provider(provider.clone()).unwrap();
    let parent = Parent::agent("p");
    let run = service.start("spawn", request(&parent)).await.unwrap();
    assert_eq!(service.pending_runs(), 1, "one pending end per run");
    let closes: Vec<_> = (0..3)
        .map(|_| {
            let s = service.clone();
            tokio::spawn(async move { s.close().await })
        })
        .collect();
    tokio::task::yield_now().await;
    provider.settle(0, Ok(SubagentResult::new(vec![], StopReason::Completed)));
    run.dispose().await.unwrap();
    for close in closes {
        tokio::time::timeout(std::time::Duration::from_secs(3600), close)
            .await
            .expect("every concurrent close returns")
            .unwrap();
    }
    assert_eq!(service.pending_runs(), 0);
}

/// Each registration is undone by its own guard only. A provider object whose
/// name changed after registration can be registered again under the new name; dropping the
/// first guard removes only the first registration (announcing only its name), and the second
/// registration stays until its own guard drops, which announces its removal. A refused
/// re-registration likewise never takes the earlier registration with it.
#[tokio::test(start_paused = true)]
async fn each_registration_is_undone_by_its_own_guard_only() {
    let service = SubagentService::new();
    let (seen, _l) = record(&service);
    let shifty = Arc::new(Shifty {
        name: Mutex::new("a".into()),
        service: Mutex::new(None),
    });
    let first = service.register_provider(shifty.clone()).unwrap();
    *shifty.name.lock() = "b".into();
    let second = service.register_provider(shifty.clone()).unwrap();
    assert_eq!(service.list(), ["a", "b"]);
    drop(first);
    assert_eq!(
        service.list(),
        ["b"],
        "the second registration survives the first guard"
    );
    assert!(service.get_provider("b").is_some());
    let parent = Parent::agent("p");
    let run = service.start("b", request(&parent)).await.unwrap();
    run.dispose().await.unwrap();
    service.close().await;
    drop(second);
    assert!(service.list().is_empty());
    let removed: Vec<_> = seen
        .lock()
        .iter()
        .filter(|l| l.starts_with("provider-removed"))
        .cloned()
        .collect();
    assert_eq!(removed, ["provider-removed a", "provider-removed b"]);

    // A refused re-registration of the same object unwinds only itself.
    *shifty.name.lock() = "c".into();
    let kept = service.register_provider(shifty.clone()).unwrap();
    *shifty.name.lock() = "d".into();
    let refusing = service.events().on(|e| match e {
        SubagentEvent::ProviderAdded(_) => Err("listener refused".into()),
        _ => Ok(()),
    });
    assert!(matches!(
        service.register_provider(shifty.clone()),
        Err(RegisterError::Listener(_))
    ));
    drop(refusing);
    assert_eq!(
        service.list(),
        ["c"],
        "the refusal unwound only its own registration"
    );
    drop(kept);
    assert!(service.list().is_empty());
}

/// `close` waits for a start still in flight (validated, the provider still building the
/// child), not only for runs already returned: it used to resolve at once, after which the
/// start was accepted, `subagent/start` was emitted and an `end` was pending on a service whose
/// `close` had already reported quiescence. Once the provider fulfils, `close` waits for that
/// run's `end` as for any other run.
#[tokio::test(start_paused = true)]
async fn close_waits_for_a_start_in_flight() {
    let service = SubagentService::new();
    let provider = FakeProvider::new("spawn", SubagentCapabilities::ALL);
    let (gate_tx, gate_rx) = oneshot::channel();
    *provider.gate.lock() = Some(gate_rx);
    let _g = service.register_provider(provider.clone()).unwrap();
    let (seen, _l) = record(&service);
    let parent = Parent::agent("p");
    let starting = tokio::spawn({
        let service = service.clone();
        async move { service.start("spawn", request(&parent)).await }
    });
    // Let the start reach the provider, which waits for the gate.
    while !provider.gate.lock().is_none() {
        tokio::task::yield_now().await;
    }
    assert_eq!(service.pending_runs(), 1, "the start in flight is pending");
    let hour = std::time::Duration::from_secs(3600);
    assert!(
        tokio::time::timeout(hour, service.close()).await.is_err(),
        "close waits for the start in flight"
    );
    gate_tx.send(()).unwrap();
    let run = starting.await.unwrap().unwrap();
    assert_eq!(*seen.lock(), vec!["start spawn child-1 p".to_owned()]);
    assert_eq!(service.pending_runs(), 1, "now the run's end is pending");
    assert!(tokio::time::timeout(hour, service.close()).await.is_err());
    provider.settle(0, Ok(SubagentResult::new(vec![], StopReason::Completed)));
    run.dispose().await.unwrap();
    service.close().await;
    assert_eq!(service.pending_runs(), 0);
    assert_eq!(seen.lock().last().unwrap(), "end spawn completed");
}

/// A start in flight that the provider rejects, or whose future is dropped, stops counting as
/// pending: `close` then returns, with no lifecycle edge.
#[tokio::test(start_paused = true)]
async fn a_start_in_flight_that_fails_or_is_dropped_releases_close() {
    let service = SubagentService::new();
    let failing = Arc::new(FakeProvider {
        name: "failing".into(),
        caps: SubagentCapabilities::ALL,
        calls: Mutex::default(),
        fail: Some(SubagentError::no_provider("inner")),
        gate: Mutex::new(None),
    });
    let (gate_tx, gate_rx) = oneshot::channel();
    *failing.gate.lock() = Some(gate_rx);
    let _f = service.register_provider(failing.clone()).unwrap();
    let (seen, _l) = record(&service);
    let parent = Parent::agent("p");
    let starting = tokio::spawn({
        let service = service.clone();
        let parent = parent.clone();
        async move { service.start("failing", request(&parent)).await.map(|_| ()) }
    });
    while !failing.gate.lock().is_none() {
        tokio::task::yield_now().await;
    }
    assert_eq!(service.pending_runs(), 1);
    gate_tx.send(()).unwrap();
    assert!(starting.await.unwrap().is_err());
    service.close().await;
    assert_eq!(service.pending_runs(), 0);

    let gated = FakeProvider::new("gated", SubagentCapabilities::ALL);
    let (_gate_tx, gate_rx) = oneshot::channel();
    *gated.gate.lock() = Some(gate_rx);
    let _g = service.register_provider(gated.clone()).unwrap();
    {
        let start = service.start("gated", request(&parent));
        futures::pin_mut!(start);
        assert!(futures::poll!(start.as_mut()).is_pending());
        assert_eq!(service.pending_runs(), 1);
    }
    assert_eq!(service.pending_runs(), 0);
    service.close().await;
    assert_eq!(
        *seen.lock(),
        vec!["provider-added gated".to_owned()],
        "no lifecycle edge for a failed or dropped start"
    );
}
