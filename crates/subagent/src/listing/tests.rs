//! Listing tests on synthetic stores (spec §5.4).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use agent::projection::Projection;
use agent::store::LoadedSession;
use agent::{AgentError, CancelCause, EventData, Registration, SessionEvent, SessionMeta};
use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::{Map, json};

use super::*;
use crate::SubagentErrorCode;
use crate::projection::register_projections;

fn header(id: &str, parent: Option<&str>, created_at: u64, origin: bool) -> SessionHeader {
    SessionHeader {
        version: agent::header::SESSION_FORMAT_VERSION,
        id: SessionId::from(id),
        created_at,
        cwd: None,
        parent_session: parent.map(SessionId::from),
        seed_length: None,
        origin: origin.then_some(Origin::Subagent),
        delegation_depth: None,
        agent_preset: None,
    }
}

fn one_shot(label: Option<&str>) -> Value {
    let mut v = json!({"version": 2, "mode": "one-shot", "provider": "spawn"});
    if let Some(l) = label {
        v["label"] = json!(l);
    }
    v
}

fn continuable(label: &str) -> Value {
    json!({"version": 2, "mode": "continuable", "provider": "spawn", "label": label,
           "agentProvider": "openai", "agentModel": "m1"})
}

fn log(descriptors: &[Value]) -> Vec<SessionEvent> {
    descriptors
        .iter()
        .enumerate()
        .map(|(i, d)| SessionEvent {
            seq: i as u64,
            time: 100 + i as u64,
            data: EventData::Other {
                kind: crate::SUBAGENT_DESCRIPTOR_EVENT.to_owned(),
                data: d.clone().into(),
            },
            surface: None,
            ignorable: false,
        })
        .collect()
}

#[derive(Default)]
struct LiveStore {
    sessions: Mutex<Vec<Arc<Session>>>,
}

impl LiveStore {
    fn add(&self, header: SessionHeader, descriptors: &[Value]) {
        let session = Session::new(header, Some(log(descriptors))).unwrap();
        self.sessions.lock().push(Arc::new(session));
    }
}

#[async_trait]
impl SessionStore for LiveStore {
    fn prepare(
        &self,
        _: SessionId,
        _: Option<Vec<SessionEvent>>,
        _: SessionMeta,
    ) -> Result<Arc<Session>, AgentError> {
        Err(AgentError::InvalidOptions("synthetic store".into()))
    }
    fn enter(&self, _: Arc<Session>) -> Result<Registration, AgentError> {
        Err(AgentError::InvalidOptions("synthetic store".into()))
    }
    fn get(&self, id: &SessionId) -> Option<Arc<Session>> {
        self.sessions.lock().iter().find(|s| s.id() == id).cloned()
    }
    fn list(&self) -> Vec<Arc<Session>> {
        self.sessions.lock().clone()
    }
    async fn flush(&self, _: &SessionId) -> Result<bool, AgentError> {
        Ok(false)
    }
}

#[derive(Default)]
struct Disk {
    logs: Mutex<Vec<LoadedSession>>,
    /// Headers `load` reports instead of the stored one.
    reported: Mutex<HashMap<SessionId, SessionHeader>>,
    loads: Mutex<Vec<SessionId>>,
    fail_list: AtomicBool,
    hang_list: AtomicBool,
    hang_load: AtomicBool,
    failing: Mutex<HashSet<SessionId>>,
    /// Cancelled inside `load`, just before it returns.
    cancel_in_load: Mutex<Option<Signal>>,
    lists: AtomicUsize,
}

impl Disk {
    fn add(&self, header: SessionHeader, descriptors: &[Value]) {
        self.logs.lock().push(LoadedSession {
            header,
            events: log(descriptors),
        });
    }
    fn loads(&self) -> Vec<SessionId> {
        self.loads.lock().clone()
    }
}

#[async_trait]
impl SessionPersistence for Disk {
    fn create(&self, _: &SessionHeader) -> Result<(), AgentError> {
        Ok(())
    }
    fn append(&self, _: &SessionId, _: &SessionEvent) -> Result<(), AgentError> {
        Ok(())
    }
    async fn flush(&self, _: &SessionId) -> Result<(), AgentError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<SessionHeader>, AgentError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        if self.hang_list.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.fail_list.load(Ordering::SeqCst) {
            return Err(AgentError::InvalidOptions("disk on fire".into()));
        }
        Ok(self.logs.lock().iter().map(|l| l.header.clone()).collect())
    }
    async fn inspect(&self, id: &SessionId) -> Result<Option<SessionHeader>, AgentError> {
        Ok(self
            .logs
            .lock()
            .iter()
            .find(|l| &l.header.id == id)
            .map(|l| l.header.clone()))
    }
    async fn load(&self, id: &SessionId) -> Result<LoadedSession, AgentError> {
        self.loads.lock().push(id.clone());
        if self.hang_load.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if let Some(signal) = self.cancel_in_load.lock().as_ref() {
            signal.cancel(CancelCause::User);
        }
        if self.failing.lock().contains(id) {
            return Err(AgentError::NotFound(id.clone()));
        }
        let mut loaded = self
            .logs
            .lock()
            .iter()
            .find(|l| &l.header.id == id)
            .cloned()
            .ok_or_else(|| AgentError::NotFound(id.clone()))?;
        if let Some(h) = self.reported.lock().get(id) {
            loaded.header = h.clone();
        }
        Ok(loaded)
    }
}

/// A foreign projection unit that panics on the named sessions.
struct Faulty(HashSet<SessionId>);

impl Projection for Faulty {
    fn name(&self) -> &str {
        "faulty"
    }
    fn view(&self, header: &SessionHeader, _: &[Arc<SessionEvent>]) -> Value {
        assert!(!self.0.contains(&header.id), "foreign unit failure");
        Value::Null
    }
}

/// How a [`Cache`] read fails.
#[derive(Clone, Copy, Debug)]
enum CacheFault {
    /// The read returns an error.
    Fails,
    /// The read panics.
    Panics,
}

/// A projection-cache double: rows by session id, counted reads, and an optional fault.
#[derive(Default)]
struct Cache {
    rows: Mutex<HashMap<SessionId, CachedSnapshot>>,
    fault: Mutex<Option<CacheFault>>,
    reads: AtomicUsize,
}

impl Cache {
    fn put(&self, id: &str, row: CachedSnapshot) {
        self.rows.lock().insert(SessionId::from(id), row);
    }
    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl ProjectionCache for Cache {
    async fn cached_snapshot(
        &self,
        header: &SessionHeader,
    ) -> Result<Option<CachedSnapshot>, agent::BoxError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let fault = *self.fault.lock();
        match fault {
            Some(CacheFault::Fails) => Err("cache on fire".into()),
            Some(CacheFault::Panics) => panic!("cache exploded"),
            None => Ok(self.rows.lock().get(&header.id).cloned()),
        }
    }
}

/// A cache row holding only the identity view `identity`.
fn identity_row(identity: Value) -> CachedSnapshot {
    let mut values = Map::new();
    values.insert(IDENTITY_PROJECTION.to_owned(), identity);
    CachedSnapshot { as_of_seq: 0, values }
}

struct Fixture {
    live: Arc<LiveStore>,
    disk: Arc<Disk>,
    cache: Arc<Cache>,
    registry: ProjectionRegistry,
    _registration: Registration,
}

impl Fixture {
    fn new() -> Self {
        let registry = ProjectionRegistry::new();
        let registration = register_projections(&registry).unwrap();
        Self {
            live: Arc::default(),
            disk: Arc::default(),
            cache: Arc::default(),
            registry,
            _registration: registration,
        }
    }
    fn services(&self) -> ListingServices {
        ListingServices {
            projections: Some(self.registry.clone()),
            store: Some(self.live.clone()),
            persistence: Some(self.disk.clone()),
            cache: None,
        }
    }
    /// [`Fixture::services`] with the cache double.
    fn cached(&self) -> ListingServices {
        ListingServices {
            cache: Some(self.cache.clone()),
            ..self.services()
        }
    }
    async fn cached_children(&self, parent: &str) -> Vec<SubagentListEntry> {
        list_children(&self.cached(), &SessionId::from(parent), &Signal::new())
            .await
            .unwrap()
    }
    fn live_only(&self) -> ListingServices {
        ListingServices {
            persistence: None,
            ..self.services()
        }
    }
    async fn children(&self, parent: &str) -> Vec<SubagentListEntry> {
        list_children(&self.services(), &SessionId::from(parent), &Signal::new())
            .await
            .unwrap()
    }
    async fn descendants(&self, root: &str) -> Vec<(String, String, usize)> {
        list_descendants(&self.services(), &SessionId::from(root), &Signal::new())
            .await
            .unwrap()
            .into_iter()
            .map(|d| {
                (
                    d.entry.id().as_str().to_owned(),
                    d.parent_id.as_str().to_owned(),
                    d.depth,
                )
            })
            .collect()
    }
}

fn child(
    id: &str,
    activity: Activity,
    has_children: bool,
    mode: &'static str,
    label: Option<&str>,
) -> SubagentListEntry {
    SubagentListEntry::Child {
        id: SessionId::from(id),
        activity,
        has_children,
        mode,
        label: label.map(str::to_owned),
    }
}

fn diagnostic(id: &str, reason: DiagnosticReason) -> SubagentListEntry {
    SubagentListEntry::Diagnostic {
        id: SessionId::from(id),
        reason,
    }
}

fn code(err: ListingError) -> SubagentErrorCode {
    match err {
        ListingError::Subagent(e) => e.code(),
        ListingError::Persistence(e) => panic!("unexpected backend error {e}"),
    }
}

use Activity::{Inactive, Running};
use DiagnosticReason::{Corrupt, Unavailable};

/// spec: LIST-1
#[tokio::test(start_paused = true)]
async fn live_only_composition_lists_a_running_child() {
    let f = Fixture::new();
    f.live.add(header("p", None, 1, false), &[]);
    f.live
        .add(header("c", Some("p"), 2, true), &[continuable("worker")]);
    let rows = list_children(&f.live_only(), &SessionId::from("p"), &Signal::new())
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![child("c", Running, false, "continuable", Some("worker"))]
    );
}

/// spec: LIST-2, LIST-42
#[tokio::test(start_paused = true)]
async fn missing_projection_registry_is_refused_even_without_children() {
    let f = Fixture::new();
    let services = ListingServices {
        projections: None,
        ..f.services()
    };
    let err = list_children(&services, &SessionId::from("nobody"), &Signal::new())
        .await
        .unwrap_err();
    assert_eq!(
        code(err),
        SubagentErrorCode::SubagentControlProjectionsUnavailable
    );
    assert_eq!(f.disk.lists.load(Ordering::SeqCst), 0);
}

/// spec: LIST-2, LIST-42 — a registry lacking the seam's `subagent` unit (never registered, or
/// unregistered with the service) cannot identify any child. It is refused like a missing
/// registry, before any read, instead of listing the settled child `corrupt` and hiding the live
/// one.
#[tokio::test(start_paused = true)]
async fn a_registry_without_the_identity_unit_is_refused() {
    let f = Fixture::new();
    f.disk.add(header("p", None, 1, false), &[]);
    f.disk
        .add(header("c", Some("p"), 2, true), &[continuable("research")]);
    let services = ListingServices {
        projections: Some(ProjectionRegistry::new()),
        ..f.services()
    };
    let root = SessionId::from("p");
    let children = list_children(&services, &root, &Signal::new()).await;
    let descendants = list_descendants(&services, &root, &Signal::new()).await;
    for err in [
        children.map(drop).unwrap_err(),
        descendants.map(drop).unwrap_err(),
    ] {
        assert_eq!(
            code(err),
            SubagentErrorCode::SubagentControlProjectionsUnavailable
        );
    }
    assert_eq!(f.disk.lists.load(Ordering::SeqCst), 0);
}

/// spec: LIST-3, LIST-42
#[tokio::test(start_paused = true)]
async fn missing_session_store_is_refused() {
    let f = Fixture::new();
    let services = ListingServices {
        store: None,
        ..f.services()
    };
    let err = list_children(&services, &SessionId::from("p"), &Signal::new())
        .await
        .unwrap_err();
    assert_eq!(
        code(err),
        SubagentErrorCode::SubagentControlSessionStoreUnavailable
    );
}

/// spec: LIST-4, LIST-6
#[tokio::test(start_paused = true)]
async fn settled_continuable_of_a_persisted_parent_lists_inactive_with_its_label() {
    let f = Fixture::new();
    f.disk.add(header("p", None, 1, false), &[]);
    f.disk
        .add(header("c", Some("p"), 2, true), &[continuable("research")]);
    assert_eq!(
        f.children("p").await,
        vec![child("c", Inactive, false, "continuable", Some("research"))]
    );
}

/// spec: LIST-5, LIST-9
#[tokio::test(start_paused = true)]
async fn one_shot_and_continuable_children_list_together() {
    let f = Fixture::new();
    f.disk.add(header("a", Some("p"), 1, true), &[one_shot(None)]);
    f.disk
        .add(header("b", Some("p"), 2, true), &[one_shot(Some("find bugs"))]);
    f.disk.add(header("c", Some("p"), 3, true), &[continuable("k")]);
    assert_eq!(
        f.children("p").await,
        vec![
            child("a", Inactive, false, "one-shot", None),
            child("b", Inactive, false, "one-shot", Some("find bugs")),
            child("c", Inactive, false, "continuable", Some("k")),
        ]
    );
    let views: Vec<Value> = f
        .children("p")
        .await
        .iter()
        .map(SubagentListEntry::view)
        .collect();
    assert_eq!(
        views,
        [
            json!({"kind": "child", "id": "a", "activity": "inactive", "hasChildren": false, "mode": "one-shot"}),
            json!({"kind": "child", "id": "b", "activity": "inactive", "hasChildren": false, "mode": "one-shot",
                   "label": "find bugs"}),
            json!({"kind": "child", "id": "c", "activity": "inactive", "hasChildren": false, "mode": "continuable",
                   "label": "k"}),
        ]
    );
}

/// spec: LIST-7
#[tokio::test(start_paused = true)]
async fn order_is_created_at_then_id_and_ordinary_forks_are_not_rows() {
    let f = Fixture::new();
    f.disk.add(header("z", Some("p"), 1, true), &[one_shot(None)]);
    f.disk.add(header("b", Some("p"), 5, true), &[one_shot(None)]);
    f.live.add(header("a", Some("p"), 5, true), &[one_shot(None)]);
    f.disk.add(header("fork", Some("p"), 0, false), &[one_shot(None)]);
    let ids: Vec<_> = f
        .children("p")
        .await
        .iter()
        .map(|r| r.id().as_str().to_owned())
        .collect();
    assert_eq!(ids, ["z", "a", "b"]);
}

/// spec: LIST-8, LIST-10
#[tokio::test(start_paused = true)]
async fn creation_window_child_is_omitted_beside_running_and_inactive_siblings() {
    let f = Fixture::new();
    f.live.add(header("new", Some("p"), 1, true), &[]);
    f.live.add(header("run", Some("p"), 2, true), &[continuable("r")]);
    f.disk
        .add(header("done", Some("p"), 3, true), &[continuable("d")]);
    assert_eq!(
        f.children("p").await,
        vec![
            child("run", Running, false, "continuable", Some("r")),
            child("done", Inactive, false, "continuable", Some("d")),
        ]
    );
}

/// spec: LIST-11
#[tokio::test(start_paused = true)]
async fn the_last_descriptor_wins() {
    let f = Fixture::new();
    f.disk.add(
        header("a", Some("p"), 1, true),
        &[continuable("old"), continuable("new")],
    );
    f.disk.add(header("b", Some("p"), 2, true), &[continuable("sib")]);
    assert_eq!(
        f.children("p").await,
        vec![
            child("a", Inactive, false, "continuable", Some("new")),
            child("b", Inactive, false, "continuable", Some("sib")),
        ]
    );
}

/// spec: LIST-12
#[tokio::test(start_paused = true)]
async fn live_valid_then_malformed_is_a_present_null_and_omitted() {
    let f = Fixture::new();
    f.live.add(
        header("c", Some("p"), 1, true),
        &[continuable("x"), json!({"version": 2})],
    );
    let session = f.live.get(&SessionId::from("c")).unwrap();
    let snap = f.registry.snapshot(&session);
    let round: Value = serde_json::from_str(&serde_json::to_string(&snap).unwrap()).unwrap();
    assert_eq!(
        round.as_object().unwrap().get(IDENTITY_PROJECTION),
        Some(&Value::Null)
    );
    assert_eq!(f.children("p").await, vec![]);
}

/// spec: LIST-13, LIST-19, LIST-20
#[tokio::test(start_paused = true)]
async fn malformed_or_unknown_version_descriptors_are_corrupt() {
    let f = Fixture::new();
    f.disk.add(
        header("a", Some("p"), 1, true),
        &[continuable("x"), json!({"mode": "one-shot"})],
    );
    f.disk.add(
        header("b", Some("p"), 2, true),
        &[json!({"version": 2, "provider": "p"})],
    );
    f.disk.add(
        header("c", Some("p"), 3, true),
        &[json!({"version": 3, "mode": "one-shot", "provider": "p"})],
    );
    f.disk.add(header("d", Some("p"), 4, true), &[one_shot(None)]);
    assert_eq!(
        f.children("p").await,
        vec![
            diagnostic("a", Corrupt),
            diagnostic("b", Corrupt),
            diagnostic("c", Corrupt),
            child("d", Inactive, false, "one-shot", None),
        ]
    );
}

/// spec: LIST-16
#[tokio::test(start_paused = true)]
async fn an_inspection_with_a_different_header_is_corrupt() {
    let mutations: [fn(&mut SessionHeader); 7] = [
        |h| h.version = 9,
        |h| h.id = SessionId::from("other"),
        |h| h.created_at = 99,
        |h| h.cwd = Some("/elsewhere".into()),
        |h| h.parent_session = Some(SessionId::from("q")),
        |h| h.seed_length = Some(3),
        |h| h.delegation_depth = Some(2),
    ];
    for mutate in mutations {
        let f = Fixture::new();
        f.disk.add(header("a", Some("p"), 1, true), &[continuable("x")]);
        f.disk.add(header("b", Some("p"), 2, true), &[continuable("y")]);
        let mut reported = header("a", Some("p"), 1, true);
        mutate(&mut reported);
        f.disk.reported.lock().insert(SessionId::from("a"), reported);
        assert_eq!(
            f.children("p").await,
            vec![
                diagnostic("a", Corrupt),
                child("b", Inactive, false, "continuable", Some("y")),
            ]
        );
    }
}

/// spec: LIST-21
#[tokio::test(start_paused = true)]
async fn a_fork_with_only_the_seeded_descriptor_lists_under_the_ancestor_identity() {
    let f = Fixture::new();
    let mut h = header("fork", Some("p"), 1, true);
    h.seed_length = Some(2);
    let mut events = log(&[continuable("ancestor")]);
    events.push(SessionEvent {
        seq: 1,
        time: 101,
        data: EventData::EndSeed,
        surface: None,
        ignorable: false,
    });
    f.disk.logs.lock().push(LoadedSession { header: h, events });
    assert_eq!(
        f.children("p").await,
        vec![child("fork", Inactive, false, "continuable", Some("ancestor"))]
    );
}

/// spec: LIST-22
#[tokio::test(start_paused = true)]
async fn a_descriptor_naming_an_unmounted_provider_still_lists() {
    let f = Fixture::new();
    f.disk.add(
        header("a", Some("p"), 1, true),
        &[json!({"version": 2, "mode": "one-shot", "provider": "gone", "label": "l"})],
    );
    assert_eq!(
        f.children("p").await,
        vec![child("a", Inactive, false, "one-shot", Some("l"))]
    );
}

/// spec: LIST-23, LIST-24
#[tokio::test(start_paused = true)]
async fn a_failing_foreign_unit_corrupts_only_its_child() {
    let f = Fixture::new();
    let _faulty = f
        .registry
        .register(Arc::new(Faulty(HashSet::from([
            SessionId::from("cold"),
            SessionId::from("hot"),
        ]))))
        .unwrap();
    f.disk
        .add(header("cold", Some("p"), 1, true), &[continuable("c")]);
    f.disk
        .add(header("cold2", Some("p"), 2, true), &[continuable("c2")]);
    f.live.add(header("hot", Some("p"), 3, true), &[continuable("h")]);
    f.live
        .add(header("hot2", Some("p"), 4, true), &[continuable("h2")]);
    assert_eq!(
        f.children("p").await,
        vec![
            diagnostic("cold", Corrupt),
            child("cold2", Inactive, false, "continuable", Some("c2")),
            diagnostic("hot", Corrupt),
            child("hot2", Running, false, "continuable", Some("h2")),
        ]
    );
}

/// spec: LIST-25
#[tokio::test(start_paused = true)]
async fn a_failing_persisted_listing_fails_the_call_with_the_backend_error() {
    let f = Fixture::new();
    f.disk.fail_list.store(true, Ordering::SeqCst);
    let err = list_children(&f.services(), &SessionId::from("p"), &Signal::new())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ListingError::Persistence(AgentError::InvalidOptions(ref m)) if m == "disk on fire")
    );
}

/// spec: LIST-18, LIST-26
#[tokio::test(start_paused = true)]
async fn a_failing_inspection_is_unavailable_until_recovery() {
    let f = Fixture::new();
    f.disk.add(header("a", Some("p"), 1, true), &[continuable("x")]);
    f.disk.add(header("b", Some("p"), 2, true), &[continuable("y")]);
    f.disk.failing.lock().insert(SessionId::from("a"));
    assert_eq!(
        f.children("p").await,
        vec![
            diagnostic("a", Unavailable),
            child("b", Inactive, false, "continuable", Some("y")),
        ]
    );
    f.disk.failing.lock().clear();
    assert_eq!(
        f.children("p").await[0],
        child("a", Inactive, false, "continuable", Some("x"))
    );
}

/// spec: LIST-28, LIST-29, LIST-32
#[tokio::test(start_paused = true)]
async fn cold_children_are_inspected_once_live_never_grandchildren_never() {
    let f = Fixture::new();
    f.disk.add(header("a", Some("p"), 1, true), &[continuable("x")]);
    f.disk.add(header("g", Some("a"), 2, true), &[continuable("g")]);
    f.disk.add(header("b", Some("p"), 3, true), &[one_shot(None)]);
    f.live.add(header("l", Some("p"), 4, true), &[continuable("l")]);
    let rows = f.children("p").await;
    assert_eq!(rows[0], child("a", Inactive, true, "continuable", Some("x")));
    assert_eq!(rows.len(), 3);
    let mut loads = f.disk.loads();
    loads.sort_by(|x, y| x.as_str().cmp(y.as_str()));
    assert_eq!(loads, [SessionId::from("a"), SessionId::from("b")]);
}

/// spec: LIST-34, LIST-35
#[tokio::test(start_paused = true)]
async fn only_origin_grandchildren_set_has_children() {
    let f = Fixture::new();
    f.disk.add(header("a", Some("p"), 1, true), &[continuable("a")]);
    f.disk.add(header("fork", Some("a"), 2, false), &[]);
    f.disk.add(header("b", Some("p"), 3, true), &[continuable("b")]);
    f.disk.add(header("bad", Some("b"), 4, true), &[]);
    assert_eq!(
        f.children("p").await,
        vec![
            child("a", Inactive, false, "continuable", Some("a")),
            child("b", Inactive, true, "continuable", Some("b")),
        ]
    );
    assert_eq!(f.children("b").await, vec![diagnostic("bad", Corrupt)]);
}

/// spec: LIST-36, LIST-52
#[tokio::test(start_paused = true)]
async fn a_pre_aborted_token_is_cancelled_before_any_persistence_read() {
    let f = Fixture::new();
    let signal = Signal::cancelled_with(CancelCause::User);
    let err = list_children(&f.services(), &SessionId::from("p"), &signal)
        .await
        .unwrap_err();
    assert_eq!(code(err), SubagentErrorCode::Cancelled);
    let err = list_descendants(&f.services(), &SessionId::from("p"), &signal)
        .await
        .unwrap_err();
    assert_eq!(code(err), SubagentErrorCode::Cancelled);
    assert_eq!(f.disk.lists.load(Ordering::SeqCst), 0);
}

/// spec: LIST-37
#[tokio::test(start_paused = true)]
async fn abort_during_the_persisted_listing_is_cancelled() {
    let f = Fixture::new();
    f.disk.hang_list.store(true, Ordering::SeqCst);
    let signal = Signal::new();
    let services = f.services();
    let parent = SessionId::from("p");
    let (result, ()) = tokio::join!(list_children(&services, &parent, &signal), async {
        tokio::task::yield_now().await;
        signal.cancel(CancelCause::User);
    });
    assert_eq!(code(result.unwrap_err()), SubagentErrorCode::Cancelled);
    assert_eq!(f.disk.lists.load(Ordering::SeqCst), 1);
}

/// spec: LIST-38
#[tokio::test(start_paused = true)]
async fn abort_during_a_cold_inspection_is_cancelled() {
    let f = Fixture::new();
    f.disk.add(header("a", Some("p"), 1, true), &[continuable("x")]);
    f.disk.hang_load.store(true, Ordering::SeqCst);
    let signal = Signal::new();
    let services = f.services();
    let parent = SessionId::from("p");
    let (result, ()) = tokio::join!(list_children(&services, &parent, &signal), async {
        tokio::task::yield_now().await;
        signal.cancel(CancelCause::User);
    });
    assert_eq!(code(result.unwrap_err()), SubagentErrorCode::Cancelled);
    assert_eq!(f.disk.loads(), [SessionId::from("a")]);
}

/// spec: LIST-39, LIST-40
#[tokio::test(start_paused = true)]
async fn abort_as_an_inspection_settles_is_cancelled_not_a_row() {
    for failing in [false, true] {
        let f = Fixture::new();
        f.disk.add(header("a", Some("p"), 1, true), &[continuable("x")]);
        if failing {
            f.disk.failing.lock().insert(SessionId::from("a"));
        }
        let signal = Signal::new();
        *f.disk.cancel_in_load.lock() = Some(signal.clone());
        let err = list_children(&f.services(), &SessionId::from("p"), &signal)
            .await
            .unwrap_err();
        assert_eq!(code(err), SubagentErrorCode::Cancelled);
    }
}

/// spec: LIST-41, LIST-44
#[tokio::test(start_paused = true)]
async fn a_parent_without_children_lists_nothing() {
    let f = Fixture::new();
    f.disk.add(header("p", None, 1, false), &[]);
    assert_eq!(f.children("p").await, vec![]);
    assert_eq!(f.descendants("p").await, vec![]);
}

/// spec: LIST-43
#[tokio::test(start_paused = true)]
async fn descendants_are_listed_in_pre_order() {
    let f = Fixture::new();
    f.disk.add(header("A", Some("r"), 1, true), &[continuable("a")]);
    f.disk.add(header("A1", Some("A"), 2, true), &[continuable("a1")]);
    f.disk.add(header("B", Some("r"), 3, true), &[continuable("b")]);
    let rows = list_descendants(&f.services(), &SessionId::from("r"), &Signal::new())
        .await
        .unwrap();
    assert_eq!(
        rows[0].entry,
        child("A", Inactive, true, "continuable", Some("a"))
    );
    assert_eq!(
        f.descendants("r").await,
        [
            ("A".into(), "r".into(), 1),
            ("A1".into(), "A".into(), 2),
            ("B".into(), "r".into(), 1)
        ]
    );
}

/// spec: LIST-45
#[tokio::test(start_paused = true)]
async fn a_creation_window_node_is_omitted_but_its_child_lists() {
    let f = Fixture::new();
    f.live.add(header("w", Some("r"), 1, true), &[]);
    f.disk.add(header("c", Some("w"), 2, true), &[continuable("c")]);
    assert_eq!(f.descendants("r").await, [("c".into(), "w".into(), 2)]);
}

/// spec: LIST-46
#[tokio::test(start_paused = true)]
async fn a_parent_cycle_does_not_revisit_the_root() {
    let f = Fixture::new();
    f.disk.add(header("r", Some("c"), 1, true), &[continuable("r")]);
    f.disk.add(header("c", Some("r"), 2, true), &[continuable("c")]);
    assert_eq!(f.descendants("r").await, [("c".into(), "r".into(), 1)]);
}

/// spec: LIST-47
#[tokio::test(start_paused = true)]
async fn a_ten_thousand_deep_chain_resolves_its_leaf() {
    let f = Fixture::new();
    for i in 1..10_000u64 {
        let parent = if i == 1 {
            "r".to_owned()
        } else {
            format!("n{}", i - 1)
        };
        f.disk.add(header(&format!("n{i}"), Some(&parent), i, false), &[]);
    }
    f.disk.add(
        header("leaf", Some("n9999"), 10_000, true),
        &[continuable("leaf")],
    );
    assert_eq!(
        f.descendants("r").await,
        [("leaf".into(), "n9999".into(), 10_000)]
    );
}

/// spec: LIST-48
#[tokio::test(start_paused = true)]
async fn ordinary_forks_are_traversed_but_absent() {
    let f = Fixture::new();
    f.disk.add(header("fork", Some("r"), 1, false), &[]);
    f.disk
        .add(header("fc", Some("fork"), 2, true), &[continuable("fc")]);
    f.disk.add(header("once", Some("r"), 3, true), &[one_shot(None)]);
    f.disk
        .add(header("oc", Some("once"), 4, true), &[continuable("oc")]);
    assert_eq!(
        f.descendants("r").await,
        [
            ("fc".into(), "fork".into(), 2),
            ("once".into(), "r".into(), 1),
            ("oc".into(), "once".into(), 2)
        ]
    );
}

/// spec: LIST-49, LIST-50, LIST-51
#[tokio::test(start_paused = true)]
async fn corrupt_intermediates_are_positioned_and_their_subtrees_list() {
    let f = Fixture::new();
    f.disk.add(header("bare", Some("r"), 1, true), &[]);
    f.disk
        .add(header("b1", Some("bare"), 2, true), &[continuable("b1")]);
    f.disk.add(
        header("v3", Some("r"), 3, true),
        &[json!({"version": 3, "mode": "one-shot", "provider": "p"})],
    );
    f.disk
        .add(header("v1", Some("v3"), 4, true), &[continuable("v1")]);
    f.disk
        .add(header("moved", Some("r"), 5, true), &[continuable("m")]);
    f.disk.reported.lock().insert(
        SessionId::from("moved"),
        header("moved", Some("elsewhere"), 5, true),
    );
    let rows = list_descendants(&f.services(), &SessionId::from("r"), &Signal::new())
        .await
        .unwrap();
    let got: Vec<_> = rows.iter().map(|d| (d.entry.clone(), d.depth)).collect();
    assert_eq!(
        got,
        vec![
            (diagnostic("bare", Corrupt), 1),
            (child("b1", Inactive, false, "continuable", Some("b1")), 2),
            (diagnostic("v3", Corrupt), 1),
            (child("v1", Inactive, false, "continuable", Some("v1")), 2),
            (diagnostic("moved", Corrupt), 1),
        ]
    );
}

/// spec: LIST-53
#[tokio::test(start_paused = true)]
async fn descendants_without_the_projection_registry_are_refused() {
    let f = Fixture::new();
    let services = ListingServices {
        projections: None,
        ..f.services()
    };
    let err = list_descendants(&services, &SessionId::from("r"), &Signal::new())
        .await
        .unwrap_err();
    assert_eq!(
        code(err),
        SubagentErrorCode::SubagentControlProjectionsUnavailable
    );
}

mod robust;

/// A listing of many children whose reads complete at once still yields to the other tasks of
/// its thread (tokio's cooperative budget): a task spawned before the listing runs before the
/// listing finishes.
#[tokio::test(start_paused = true)]
async fn a_long_listing_lets_other_tasks_run() {
    let f = Fixture::new();
    f.disk.add(header("p", None, 1, false), &[]);
    for i in 0..1_000u64 {
        f.disk.add(
            header(&format!("c{i:04}"), Some("p"), 2 + i, true),
            &[continuable("work")],
        );
    }
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = {
        let done = done.clone();
        tokio::spawn(async move { done.load(std::sync::atomic::Ordering::SeqCst) })
    };
    let rows = f.children("p").await;
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(rows.len(), 1_000);
    assert!(
        !seen.await.unwrap(),
        "the spawned task ran only after the listing"
    );
}

/// An event at `seq` (time `100 + seq`) carrying `data`, with `surface`.
fn event(seq: u64, data: EventData, surface: Option<agent::SurfaceMeta>) -> SessionEvent {
    SessionEvent {
        seq,
        time: 100 + seq,
        data,
        surface,
        ignorable: false,
    }
}

/// A fork child's log: the ancestor's descriptor and the end of the seed (`seedLength` 2), then
/// its own descriptor at seq 2.
fn fork_log(ancestor: &str, own: &str) -> Vec<SessionEvent> {
    let descriptor = |label| EventData::Other {
        kind: crate::SUBAGENT_DESCRIPTOR_EVENT.to_owned(),
        data: continuable(label).into(),
    };
    vec![
        event(0, descriptor(ancestor), None),
        event(1, EventData::EndSeed, None),
        event(2, descriptor(own), None),
    ]
}

/// spec: LIST-14 — a cache row whose identity is from the child's own suffix is served
/// directly: its label wins over the log's and the log is never read.
#[tokio::test(start_paused = true)]
async fn an_own_suffix_cache_row_is_served_without_inspection() {
    let f = Fixture::new();
    f.disk
        .add(header("c", Some("p"), 1, true), &[continuable("from the log")]);
    f.cache.put(
        "c",
        identity_row(json!({"mode": "continuable", "label": "from the cache", "seq": 0})),
    );
    assert_eq!(
        f.cached_children("p").await,
        vec![child("c", Inactive, false, "continuable", Some("from the cache"))]
    );
    assert!(f.disk.loads().is_empty(), "{:?}", f.disk.loads());
    assert_eq!(f.cache.reads(), 1);
}

/// spec: LIST-15 — a cache row with an ancestor's identity (its `seq` below the header's
/// `seedLength`) is refused and one inspection serves the child's own label; a row at exactly
/// `seedLength` is the child's own and is served without one.
#[tokio::test(start_paused = true)]
async fn an_ancestor_cache_row_is_refused_and_one_inspection_serves_the_own_label() {
    let f = Fixture::new();
    for (id, created_at) in [("fork", 1), ("fork2", 2)] {
        let mut h = header(id, Some("p"), created_at, true);
        h.seed_length = Some(2);
        f.disk.logs.lock().push(LoadedSession {
            header: h,
            events: fork_log("ancestor", "own"),
        });
    }
    f.cache.put(
        "fork",
        identity_row(json!({"mode": "continuable", "label": "ancestor", "seq": 1})),
    );
    f.cache.put(
        "fork2",
        identity_row(json!({"mode": "continuable", "label": "own (cached)", "seq": 2})),
    );
    assert_eq!(
        f.cached_children("p").await,
        vec![
            child("fork", Inactive, false, "continuable", Some("own")),
            child("fork2", Inactive, false, "continuable", Some("own (cached)")),
        ]
    );
    assert_eq!(f.disk.loads(), [SessionId::from("fork")]);
}

/// spec: LIST-17 — a cached `null` identity sentinel falls through to one inspection, which
/// serves the log's identity.
#[tokio::test(start_paused = true)]
async fn a_cached_null_sentinel_falls_through_to_one_inspection() {
    let f = Fixture::new();
    f.disk.add(header("c", Some("p"), 1, true), &[continuable("x")]);
    f.cache.put("c", identity_row(Value::Null));
    assert_eq!(
        f.cached_children("p").await,
        vec![child("c", Inactive, false, "continuable", Some("x"))]
    );
    assert_eq!(f.cache.reads(), 1);
    assert_eq!(f.disk.loads(), [SessionId::from("c")]);
}

/// spec: LIST-31 — no cache row → one inspection; a row without the `subagent` key (here only
/// the timing view) → another inspection on the next listing.
#[tokio::test(start_paused = true)]
async fn a_missing_row_or_identity_key_falls_through_to_one_inspection() {
    let f = Fixture::new();
    f.disk.add(header("c", Some("p"), 1, true), &[continuable("x")]);
    let expected = vec![child("c", Inactive, false, "continuable", Some("x"))];
    assert_eq!(f.cached_children("p").await, expected);
    assert_eq!(f.disk.loads(), [SessionId::from("c")]);
    let mut values = Map::new();
    values.insert(
        crate::projection::TIMING_PROJECTION.to_owned(),
        json!({"settledMs": 0}),
    );
    f.cache.put("c", CachedSnapshot { as_of_seq: 0, values });
    assert_eq!(f.cached_children("p").await, expected);
    assert_eq!(f.disk.loads(), [SessionId::from("c"), SessionId::from("c")]);
    assert_eq!(f.cache.reads(), 2);
}

/// spec: LIST-33 — a cache read that fails (an error, or a panic of the host's cache) silently
/// falls through to one inspection: the row is served from the log and no warning is logged.
#[tokio::test(start_paused = true)]
async fn a_failing_cache_read_silently_falls_through_to_one_inspection() {
    let warnings = agent_loop::warnings::WarningCapture::new();
    let _subscriber = warnings.install();
    let f = Fixture::new();
    f.disk.add(header("c", Some("p"), 1, true), &[continuable("x")]);
    f.cache.put(
        "c",
        identity_row(json!({"mode": "continuable", "label": "unread", "seq": 0})),
    );
    let expected = vec![child("c", Inactive, false, "continuable", Some("x"))];
    for (round, fault) in [CacheFault::Fails, CacheFault::Panics].into_iter().enumerate() {
        *f.cache.fault.lock() = Some(fault);
        assert_eq!(f.cached_children("p").await, expected, "{fault:?}");
        assert_eq!(f.disk.loads().len(), round + 1, "{fault:?}");
    }
    assert_eq!(f.cache.reads(), 2);
    assert!(warnings.messages().is_empty(), "{:?}", warnings.messages());
}

/// spec: LIST-30 — with a real cache row written after settlement, no inspection happens. This
/// runtime ships no projection cache, so the row is what a host cache would write once the child
/// settled: the registry's own snapshot of the settled log (both units' real views, the identity
/// with its `seq`). The rung accepts that row as it is.
#[tokio::test(start_paused = true)]
async fn a_real_cache_row_written_after_settlement_spares_the_inspection() {
    let f = Fixture::new();
    f.disk.add(
        header("c", Some("p"), 1, true),
        &[continuable("old"), continuable("settled")],
    );
    let settled = f.disk.logs.lock()[0].clone();
    let session = Session::new(settled.header, Some(settled.events)).unwrap();
    f.cache.put(
        "c",
        CachedSnapshot {
            as_of_seq: session.len() as u64 - 1,
            values: f.registry.snapshot(&session),
        },
    );
    assert_eq!(
        f.cached_children("p").await,
        vec![child("c", Inactive, false, "continuable", Some("settled"))]
    );
    assert!(f.disk.loads().is_empty(), "{:?}", f.disk.loads());
}

/// spec: LIST-27 — compacted and uncompacted twins list identically. This runtime never compacts
/// (surface events are append-only), but a log may carry a compaction-style surface `replace` —
/// a summary replacing earlier surface nodes. The listing's identity folds the log-only
/// descriptor, which no surface operation replaces, so a twin whose history was compacted lists
/// exactly like its uncompacted twin, persisted and live.
#[tokio::test(start_paused = true)]
async fn compacted_and_uncompacted_twins_list_identically() {
    use agent::{Message, SurfaceMeta, SurfaceOp};
    let history = |compacted: bool| {
        let mut events = log(&[continuable("twin")]);
        for (seq, text) in [(1, "task"), (2, "more")] {
            events.push(event(
                seq,
                EventData::UserMessage(Message::user_text(text)),
                Some(SurfaceMeta::append()),
            ));
        }
        if compacted {
            events.push(event(
                3,
                EventData::UserMessage(Message::user_text("summary of task and more")),
                Some(SurfaceMeta {
                    surface_op: Some(SurfaceOp::Replace { start: 1, end: 2 }),
                    source_event_seqs: None,
                }),
            ));
        }
        events
    };
    let f = Fixture::new();
    for (id, created_at, compacted) in [("u", 1, false), ("k", 2, true)] {
        f.disk.logs.lock().push(LoadedSession {
            header: header(id, Some("p"), created_at, true),
            events: history(compacted),
        });
        let live = header(&format!("live-{id}"), Some("q"), created_at, true);
        let session = Session::new(live, Some(history(compacted))).unwrap();
        f.live.sessions.lock().push(Arc::new(session));
    }
    let without_id = |rows: Vec<SubagentListEntry>| -> Vec<Value> {
        rows.iter()
            .map(|r| {
                let mut v = r.view();
                v.as_object_mut().unwrap().remove("id");
                v
            })
            .collect()
    };
    for (parent, prefix, activity) in [("p", "", Inactive), ("q", "live-", Running)] {
        let rows = f.children(parent).await;
        let ids: Vec<_> = rows.iter().map(|r| r.id().as_str().to_owned()).collect();
        assert_eq!(ids, [format!("{prefix}u"), format!("{prefix}k")], "{parent}");
        assert_eq!(
            rows[0],
            child(
                &format!("{prefix}u"),
                activity,
                false,
                "continuable",
                Some("twin")
            ),
            "{parent}"
        );
        let views = without_id(rows);
        assert_eq!(views[0], views[1], "{parent}");
    }
}
