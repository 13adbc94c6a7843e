//! Robustness tests for listing (spec §2.18) over the reference runtime's live store and
//! persistence: persisted children damaged byte by byte in a JSON-lines store, cancellation at
//! every scheduling point, listing under concurrent churn on a multi-threaded runtime, and
//! descendant walks over hostile trees.

use std::collections::BTreeMap;
use std::path::Path;

use agent::TurnEndReason;
use agent_loop::runtime::{Runtime, assert_quiescent};
use agent_loop::{JsonlStore, MemoryStore};

use super::*;
use crate::projection::SubagentIdentity;

const P: &str = "p";

fn meta(parent: Option<&str>, created_at: u64, origin: bool) -> SessionMeta {
    SessionMeta {
        parent_session: parent.map(SessionId::from),
        created_at: Some(created_at),
        origin: origin.then_some(Origin::Subagent),
        ..SessionMeta::default()
    }
}

fn descriptor(d: Value) -> EventData {
    EventData::other(crate::SUBAGENT_DESCRIPTOR_EVENT, d)
}

/// Creates session `id` the way the reference runtime does (prepared, entered into the live
/// store, which persists it) and appends `events`. Dropping the guard disposes of it; it stays
/// persisted.
fn enter(runtime: &Runtime, id: &str, meta: SessionMeta, events: Vec<EventData>) -> Registration {
    let store = runtime.sessions();
    let session = store.prepare(SessionId::from(id), None, meta).unwrap();
    let guard = store.enter(session.clone()).unwrap();
    for (i, data) in events.into_iter().enumerate() {
        session.append_at(data, None, 1_000 + i as u64).unwrap();
    }
    guard
}

fn services_of(
    runtime: &Runtime,
    registry: &ProjectionRegistry,
    persistence: Arc<dyn SessionPersistence>,
) -> ListingServices {
    ListingServices {
        projections: Some(registry.clone()),
        store: Some(Arc::new(runtime.sessions().clone())),
        persistence: Some(persistence),
        cache: None,
    }
}

fn views<T>(rows: &[T], view: fn(&T) -> Value) -> Vec<Value> {
    rows.iter().map(view).collect()
}

/// Disposes of `guards`, shuts `runtime` down and checks that nothing is left.
async fn finish(runtime: Runtime, guards: Vec<Registration>) {
    drop(guards);
    runtime.shutdown().await;
    assert_quiescent(&runtime);
}

// ---------------------------------------------------------------------------------------------
// Damaged persisted children (JSON lines, byte level)
// ---------------------------------------------------------------------------------------------

/// The victim's log: a superseded descriptor, one complete turn, then its current descriptor.
fn victim_events() -> Vec<EventData> {
    vec![
        descriptor(continuable("b-old")),
        EventData::TurnStart { turn: 1 },
        EventData::other("note", json!({"text": "working"})),
        EventData::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
        },
        descriptor(continuable("b")),
    ]
}

/// The bytes of `p.jsonl` (ordinary parent), `a.jsonl` (healthy settled child) and `b.jsonl`
/// (the victim), as the reference runtime persists them.
async fn pristine_logs() -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(JsonlStore::new(dir.path()));
    let runtime = Runtime::builder().persistence(store.clone()).build();
    let guards = vec![
        enter(&runtime, P, meta(None, 1, false), vec![]),
        enter(
            &runtime,
            "a",
            meta(Some(P), 2, true),
            vec![descriptor(continuable("a"))],
        ),
        enter(&runtime, "b", meta(Some(P), 3, true), victim_events()),
    ];
    finish(runtime, guards).await;
    let mut logs = BTreeMap::new();
    for id in [P, "a", "b"] {
        store.flush(&SessionId::from(id)).await.unwrap();
        logs.insert(
            id.to_owned(),
            std::fs::read(dir.path().join(format!("{id}.jsonl"))).unwrap(),
        );
    }
    logs
}

/// `listed` plus one header whose log does not exist (a store listing a missing file).
struct Phantom {
    inner: Arc<JsonlStore>,
    extra: Option<SessionHeader>,
}

#[async_trait]
impl SessionPersistence for Phantom {
    fn create(&self, header: &SessionHeader) -> Result<(), AgentError> {
        SessionPersistence::create(&*self.inner, header)
    }
    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        SessionPersistence::append(&*self.inner, id, event)
    }
    async fn flush(&self, id: &SessionId) -> Result<(), AgentError> {
        SessionPersistence::flush(&*self.inner, id).await
    }
    async fn list(&self) -> Result<Vec<SessionHeader>, AgentError> {
        let mut headers = SessionPersistence::list(&*self.inner).await?;
        headers.extend(self.extra.clone());
        Ok(headers)
    }
    async fn inspect(&self, id: &SessionId) -> Result<Option<SessionHeader>, AgentError> {
        SessionPersistence::inspect(&*self.inner, id).await
    }
    async fn load(&self, id: &SessionId) -> Result<LoadedSession, AgentError> {
        SessionPersistence::load(&*self.inner, id).await
    }
}

/// Every regular file in `dir` with its bytes (directories as `None`).
fn contents(dir: &Path) -> BTreeMap<String, Option<Vec<u8>>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = path.is_file().then(|| std::fs::read(&path).unwrap());
            (name, bytes)
        })
        .collect()
}

/// The rows §2.18 prescribes for `parent`'s children, derived from what a separate store instance
/// can read of `dir` (plus `extra`) and the live child `live`: each readable origin-subagent
/// header naming `parent` is a candidate; a log the store cannot load is `unavailable`; a loaded
/// log without an identity is `corrupt`.
async fn oracle(
    dir: &Path,
    extra: Option<&SessionHeader>,
    live: &SessionHeader,
    parent: &str,
) -> Vec<SubagentListEntry> {
    let store = JsonlStore::new(dir);
    let mut headers: Vec<SessionHeader> = store
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.header)
        .filter(|h| h.id != live.id)
        .collect();
    headers.extend(extra.cloned());
    headers.push(live.clone());
    let has_children = |id: &SessionId| {
        headers
            .iter()
            .any(|h| is_subagent(h) && h.parent_session.as_ref() == Some(id))
    };
    let mut candidates: Vec<&SessionHeader> = headers
        .iter()
        .filter(|h| is_subagent(h) && h.parent_session.as_ref().map(SessionId::as_str) == Some(parent))
        .collect();
    candidates.sort_by(|a, b| (a.created_at, a.id.as_str()).cmp(&(b.created_at, b.id.as_str())));
    let mut rows = Vec::new();
    for h in candidates {
        let id = h.id.clone();
        let identity = if h == live {
            Some((Running, Some("c".to_owned()), "continuable"))
        } else {
            match store.load(&id).await {
                Err(_) => {
                    rows.push(diagnostic(id.as_str(), Unavailable));
                    continue;
                }
                Ok(loaded) => SubagentIdentity::fold(&loaded.events).map(|i| (Inactive, i.label, i.mode)),
            }
        };
        rows.push(match identity {
            None => diagnostic(id.as_str(), Corrupt),
            Some((activity, label, mode)) => SubagentListEntry::Child {
                has_children: has_children(&id),
                id,
                activity,
                mode,
                label,
            },
        });
    }
    rows
}

/// What one damaged variant produced for the victim (for coverage).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Absent,
    Label(String),
    Corrupt,
    Unavailable,
}

/// Lists `p`'s children and descendants over `files` written to a fresh directory (a directory
/// entry where the bytes are `None`), with a live child `c` beside them; checks the children
/// against [`oracle`], the descendants for termination and uniqueness, and that nothing stored
/// changed. Returns the victim `b`'s outcome.
async fn run_variant(
    name: &str,
    files: &BTreeMap<String, Option<Vec<u8>>>,
    extra: Option<SessionHeader>,
) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    for (id, bytes) in files {
        let path = dir.path().join(format!("{id}.jsonl"));
        match bytes {
            Some(bytes) => std::fs::write(path, bytes).unwrap(),
            None => std::fs::create_dir(path).unwrap(),
        }
    }
    let store = Arc::new(JsonlStore::new(dir.path()));
    let persistence = Arc::new(Phantom {
        inner: store.clone(),
        extra: extra.clone(),
    });
    let runtime = Runtime::builder().persistence(persistence.clone()).build();
    let registry = ProjectionRegistry::new();
    let _units = register_projections(&registry).unwrap();
    let live = enter(
        &runtime,
        "c",
        meta(Some(P), 4, true),
        vec![descriptor(continuable("c"))],
    );
    store.flush(&SessionId::from("c")).await.unwrap();
    let live_header = runtime
        .sessions()
        .get(&SessionId::from("c"))
        .unwrap()
        .header()
        .clone();
    let expected = oracle(dir.path(), extra.as_ref(), &live_header, P).await;
    let before = contents(dir.path());

    let services = services_of(&runtime, &registry, persistence);
    let rows = list_children(&services, &SessionId::from(P), &Signal::new())
        .await
        .unwrap_or_else(|e| panic!("{name}: listing failed: {e}"));
    assert_eq!(rows, expected, "{name}");
    let descendants = list_descendants(&services, &SessionId::from(P), &Signal::new())
        .await
        .unwrap_or_else(|e| panic!("{name}: descendants failed: {e}"));
    let mut seen = HashSet::new();
    for d in &descendants {
        assert!(
            seen.insert(d.entry.id().clone()),
            "{name}: {:?} twice",
            d.entry.id()
        );
    }
    let direct: Vec<_> = descendants
        .iter()
        .filter(|d| d.depth == 1)
        .map(|d| d.entry.clone())
        .collect();
    assert_eq!(direct, expected, "{name}: depth-1 descendants are the children");
    assert_eq!(contents(dir.path()), before, "{name}: listing changed the store");

    finish(runtime, vec![live]).await;
    let outcome = rows.iter().find(|r| r.id().as_str() == "b");
    match outcome {
        None => Outcome::Absent,
        Some(SubagentListEntry::Child { label, .. }) => Outcome::Label(label.clone().unwrap()),
        Some(SubagentListEntry::Diagnostic { reason: Corrupt, .. }) => Outcome::Corrupt,
        Some(SubagentListEntry::Diagnostic { reason, .. }) => {
            assert_eq!(*reason, Unavailable, "{name}");
            Outcome::Unavailable
        }
    }
}

/// Log files by session id: their bytes, or `None` for a directory in the file's place.
type Files = BTreeMap<String, Option<Vec<u8>>>;

/// The `\n`-terminated lines of `bytes` (the last one may lack its `\n`).
fn split_lines(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes
        .split_inclusive(|b| *b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

fn with(
    logs: &BTreeMap<String, Vec<u8>>,
    id: &str,
    bytes: Option<Vec<u8>>,
) -> BTreeMap<String, Option<Vec<u8>>> {
    let mut files: BTreeMap<String, Option<Vec<u8>>> =
        logs.iter().map(|(k, v)| (k.clone(), Some(v.clone()))).collect();
    match bytes {
        Some(b) => files.insert(id.to_owned(), Some(b)),
        None => files.remove(id),
    };
    files
}

/// `log` with its header line's JSON edited by `edit`.
fn edit_header(log: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut lines = split_lines(log);
    let mut header: Value = serde_json::from_slice(&lines[0]).unwrap();
    edit(&mut header);
    let mut line = serde_json::to_vec(&header).unwrap();
    line.push(b'\n');
    lines[0] = line;
    lines.concat()
}

/// spec: LIST-6, LIST-13, LIST-18, LIST-26 — a persisted child whose JSON-lines log is damaged in
/// every way (torn at and around every line boundary and inside every line; each line deleted,
/// duplicated, swapped with the next, garbled, preceded by a blank line; trailing garbage; an
/// empty file, a directory, a header naming another id or no id, a header whose parent link
/// points at itself, at a live sibling or into a cycle with a sibling, without `origin`, with
/// another `createdAt`; a listed log whose file is missing) lists exactly as the store can read
/// it: absent when its header is unreadable, its surviving identity when the log loads, `corrupt`
/// when a loaded log has no identity, `unavailable` when the log cannot be loaded. It never
/// panics, never drops, duplicates or alters a healthy sibling (a settled one and a live one),
/// never lists a child twice among the descendants, and never changes a byte in the store.
#[tokio::test(start_paused = true)]
async fn a_damaged_persisted_child_never_harms_its_siblings_or_the_store() {
    let logs = pristine_logs().await;
    let victim = &logs["b"];
    let lines = split_lines(victim);
    assert_eq!(lines.len(), 6, "a header and five events");
    let mut variants: Vec<(String, Files, Option<SessionHeader>)> = Vec::new();
    let mut push = |name: String, files| variants.push((name, files, None));
    push("intact".into(), with(&logs, "b", Some(victim.clone())));
    // Tears at, around and inside every line.
    let mut cuts = std::collections::BTreeSet::new();
    let mut end = 0;
    for line in &lines {
        let start = end;
        end += line.len();
        for cut in [start + 1, start + line.len() / 2, end - 2, end - 1, end] {
            cuts.insert(cut.min(victim.len()));
        }
    }
    cuts.insert(0);
    for cut in cuts {
        push(
            format!("torn at byte {cut}"),
            with(&logs, "b", Some(victim[..cut].to_vec())),
        );
    }
    for i in 0..lines.len() {
        let mut edited = lines.clone();
        edited.remove(i);
        push(
            format!("line {i} deleted"),
            with(&logs, "b", Some(edited.concat())),
        );
        let mut edited = lines.clone();
        edited.insert(i, lines[i].clone());
        push(
            format!("line {i} duplicated"),
            with(&logs, "b", Some(edited.concat())),
        );
        if i + 1 < lines.len() {
            let mut edited = lines.clone();
            edited.swap(i, i + 1);
            push(
                format!("lines {i} and {} swapped", i + 1),
                with(&logs, "b", Some(edited.concat())),
            );
        }
        for (what, byte) in [("garbled", b'#'), ("non-UTF-8", 0xff)] {
            let mut edited = lines.clone();
            let mid = edited[i].len() / 2;
            edited[i][mid] = byte;
            push(
                format!("line {i} {what}"),
                with(&logs, "b", Some(edited.concat())),
            );
        }
        let mut edited = lines.clone();
        edited.insert(i, b"\n".to_vec());
        push(
            format!("blank line before line {i}"),
            with(&logs, "b", Some(edited.concat())),
        );
    }
    for tail in [&b"{\"seq\":5,"[..], b"{\"seq\":5,\n", b"null\n", b"\xff\xfe"] {
        let mut bytes = victim.clone();
        bytes.extend_from_slice(tail);
        push(
            format!("trailing {:?}", String::from_utf8_lossy(tail)),
            with(&logs, "b", Some(bytes)),
        );
    }
    push("empty file".into(), with(&logs, "b", Some(Vec::new())));
    push("only a newline".into(), with(&logs, "b", Some(b"\n".to_vec())));
    let mut dir = with(&logs, "b", None);
    dir.insert("b".into(), None);
    push("a directory".into(), dir);
    type Edit = (&'static str, fn(&mut Value));
    let header_edits: [Edit; 8] = [
        ("header names the sibling a", |h| h["id"] = json!("a")),
        ("header names an unknown id", |h| h["id"] = json!("zz")),
        ("header without an id", |h| {
            h.as_object_mut().unwrap().remove("id");
        }),
        ("header is its own parent", |h| h["parentSession"] = json!("b")),
        ("header's parent is the live sibling", |h| {
            h["parentSession"] = json!("c")
        }),
        ("header without origin", |h| {
            h.as_object_mut().unwrap().remove("origin");
        }),
        ("header created first", |h| h["createdAt"] = json!(0)),
        ("header is not an object", |h| *h = json!([1, 2])),
    ];
    for (name, edit) in header_edits {
        push(name.into(), with(&logs, "b", Some(edit_header(victim, edit))));
    }
    let mut cycle = with(
        &logs,
        "b",
        Some(edit_header(victim, |h| h["parentSession"] = json!("a"))),
    );
    cycle.insert(
        "a".into(),
        Some(edit_header(&logs["a"], |h| h["parentSession"] = json!("b"))),
    );
    push("a and b form a parent cycle".into(), cycle);
    variants.push((
        "a listed log whose file is missing".into(),
        with(&logs, "b", Some(victim.clone())),
        Some(header("ghost", Some(P), 5, true)),
    ));

    let mut outcomes = std::collections::BTreeSet::new();
    for (name, files, extra) in &variants {
        outcomes.insert(run_variant(name, files, extra.clone()).await);
    }
    // The sweep reached every kind of outcome.
    assert_eq!(
        outcomes.into_iter().collect::<Vec<_>>(),
        [
            Outcome::Absent,
            Outcome::Label("b".into()),
            Outcome::Label("b-old".into()),
            Outcome::Corrupt,
            Outcome::Unavailable,
        ]
    );
}

/// spec: LIST-46 — damaged headers that form parent cycles (a self-parented child; two children
/// naming each other; a root that names its own descendant) never loop: every listing
/// terminates, lists each session at most once and never lists the root under itself.
#[tokio::test(start_paused = true)]
async fn damaged_parent_cycles_terminate() {
    let logs = pristine_logs().await;
    let dir = tempfile::tempdir().unwrap();
    let write = |id: &str, parent: &str| {
        let bytes = edit_header(&logs["a"], |h| {
            h["id"] = json!(id);
            h["parentSession"] = json!(parent);
        });
        std::fs::write(dir.path().join(format!("{id}.jsonl")), bytes).unwrap();
    };
    write("self", "self");
    write("m", "n");
    write("n", "m");
    write("r", "y");
    write("x", "r");
    write("y", "x");
    let store = Arc::new(JsonlStore::new(dir.path()));
    let runtime = Runtime::builder().persistence(store.clone()).build();
    let registry = ProjectionRegistry::new();
    let _units = register_projections(&registry).unwrap();
    let services = services_of(&runtime, &registry, store);
    let before = contents(dir.path());
    let walk = |root: &'static str| {
        let services = services.clone();
        async move {
            list_descendants(&services, &SessionId::from(root), &Signal::new())
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
                .collect::<Vec<_>>()
        }
    };
    let row = |id: &str, parent: &str, depth| (id.to_owned(), parent.to_owned(), depth);
    assert_eq!(walk("self").await, []);
    assert_eq!(walk("m").await, [row("n", "m", 1)]);
    assert_eq!(walk("n").await, [row("m", "n", 1)]);
    assert_eq!(walk("r").await, [row("x", "r", 1), row("y", "x", 2)]);
    assert_eq!(walk("y").await, [row("r", "y", 1), row("x", "r", 2)]);
    let children = list_children(&services, &SessionId::from("m"), &Signal::new())
        .await
        .unwrap();
    assert_eq!(children, [child("n", Inactive, true, "continuable", Some("a"))]);
    assert_eq!(contents(dir.path()), before);
    finish(runtime, vec![]).await;
}

/// Both listings run in a task spawned on a multi-threaded runtime (their futures are `Send`),
/// as a host serving listings from request handlers does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_run_in_spawned_tasks() {
    let f = Fixture::new();
    f.disk.add(header("a", Some(P), 1, true), &[continuable("x")]);
    f.disk.add(header("g", Some("a"), 2, true), &[one_shot(None)]);
    f.live.add(header("b", Some(P), 3, true), &[continuable("y")]);
    let services = f.services();
    let children = tokio::spawn({
        let services = services.clone();
        async move { list_children(&services, &SessionId::from(P), &Signal::new()).await }
    });
    let descendants = tokio::spawn({
        let services = services.clone();
        async move { list_descendants(&services, &SessionId::from(P), &Signal::new()).await }
    });
    assert_eq!(
        children.await.unwrap().unwrap(),
        [
            child("a", Inactive, true, "continuable", Some("x")),
            child("b", Running, false, "continuable", Some("y")),
        ]
    );
    let ids: Vec<_> = descendants
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|d| (d.entry.id().as_str().to_owned(), d.depth))
        .collect();
    assert_eq!(ids, [("a".into(), 1), ("g".into(), 2), ("b".into(), 1)]);
}

// ---------------------------------------------------------------------------------------------
// Cancellation at every scheduling point
// ---------------------------------------------------------------------------------------------

/// Counts one read in flight until dropped (completed or abandoned).
struct InFlight<'a>(&'a Slow);

impl<'a> InFlight<'a> {
    fn new(slow: &'a Slow) -> Self {
        let now = slow.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        slow.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(slow)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A [`MemoryStore`] whose `list` and `load` take a few scheduling points each (one to three
/// `yield_now`s, by id), so that on a current-thread runtime another task can act between any
/// two steps of a listing; it counts reads started and in flight. `list` also reports `extra`
/// (a header without a log).
struct Slow {
    inner: MemoryStore,
    extra: SessionHeader,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    reads: AtomicUsize,
}

async fn points(n: usize) {
    for _ in 0..n {
        tokio::task::yield_now().await;
    }
}

#[async_trait]
impl SessionPersistence for Slow {
    fn create(&self, header: &SessionHeader) -> Result<(), AgentError> {
        SessionPersistence::create(&self.inner, header)
    }
    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        SessionPersistence::append(&self.inner, id, event)
    }
    async fn flush(&self, id: &SessionId) -> Result<(), AgentError> {
        SessionPersistence::flush(&self.inner, id).await
    }
    async fn list(&self) -> Result<Vec<SessionHeader>, AgentError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let _flight = InFlight::new(self);
        points(2).await;
        let mut headers = SessionPersistence::list(&self.inner).await?;
        headers.push(self.extra.clone());
        Ok(headers)
    }
    async fn inspect(&self, id: &SessionId) -> Result<Option<SessionHeader>, AgentError> {
        SessionPersistence::inspect(&self.inner, id).await
    }
    async fn load(&self, id: &SessionId) -> Result<LoadedSession, AgentError> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let _flight = InFlight::new(self);
        points(1 + id.as_str().bytes().map(usize::from).sum::<usize>() % 3).await;
        SessionPersistence::load(&self.inner, id).await
    }
}

/// A parent `p` with twelve settled continuable children (`k00`..`k11`), two running ones, one in
/// its creation window, one settled without a descriptor (`corrupt`), one listed without a log
/// (`unavailable`), a settled grandchild under `k03` and an ordinary fork with a continuable
/// child; every child persisted by the reference runtime. Returns the runtime, the guards of the
/// live sessions, the projection registry (with its units' guard) and the persistence.
async fn crowd() -> (
    Runtime,
    Vec<Registration>,
    ProjectionRegistry,
    Registration,
    Arc<Slow>,
) {
    let slow = Arc::new(Slow {
        inner: MemoryStore::new(),
        extra: header("ghost", Some(P), 30, true),
        in_flight: AtomicUsize::new(0),
        max_in_flight: AtomicUsize::new(0),
        reads: AtomicUsize::new(0),
    });
    let runtime = Runtime::builder().persistence(slow.clone()).build();
    let registry = ProjectionRegistry::new();
    let units = register_projections(&registry).unwrap();
    let mut settled = vec![enter(&runtime, P, meta(None, 1, false), vec![])];
    for i in 0..12u64 {
        let id = format!("k{i:02}");
        settled.push(enter(
            &runtime,
            &id,
            meta(Some(P), 10 + i, true),
            vec![descriptor(continuable(&id))],
        ));
    }
    settled.push(enter(&runtime, "bare", meta(Some(P), 25, true), vec![]));
    settled.push(enter(
        &runtime,
        "g",
        meta(Some("k03"), 26, true),
        vec![descriptor(one_shot(None))],
    ));
    settled.push(enter(&runtime, "fork", meta(Some(P), 27, false), vec![]));
    settled.push(enter(
        &runtime,
        "fc",
        meta(Some("fork"), 28, true),
        vec![descriptor(continuable("fc"))],
    ));
    drop(settled);
    let live = vec![
        enter(
            &runtime,
            "run1",
            meta(Some(P), 21, true),
            vec![descriptor(continuable("run1"))],
        ),
        enter(&runtime, "window", meta(Some(P), 22, true), vec![]),
        enter(
            &runtime,
            "run2",
            meta(Some(P), 23, true),
            vec![descriptor(one_shot(Some("r2")))],
        ),
    ];
    (runtime, live, registry, units, slow)
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Children,
    Descendants,
}

async fn listing(op: Op, services: &ListingServices, signal: &Signal) -> Result<Vec<Value>, ListingError> {
    let root = SessionId::from(P);
    Ok(match op {
        Op::Children => views(
            &list_children(services, &root, signal).await?,
            SubagentListEntry::view,
        ),
        Op::Descendants => views(
            &list_descendants(services, &root, signal).await?,
            DescendantEntry::view,
        ),
    })
}

/// spec: LIST-36, LIST-37, LIST-38, LIST-39, LIST-40, LIST-29 — the listing's token cancelled at
/// every scheduling point of `listChildren` and `listDescendants` over a crowd of children (cold
/// reads four at a time, so several are in flight at once): a listing that had not finished
/// when its token was cancelled is `CANCELLED`, one that had is exactly the uncancelled listing,
/// nothing in between; no read starts after the
/// cancellation and no read outlives the listing; the uncancelled listing reads each cold
/// candidate once, at most four at a time; and the host ends quiescent.
#[tokio::test(start_paused = true)]
async fn cancellation_at_every_point_is_all_or_nothing() {
    let (runtime, live, registry, _units, slow) = crowd().await;
    let services = services_of(&runtime, &registry, slow.clone());
    for op in [Op::Children, Op::Descendants] {
        slow.reads.store(0, Ordering::SeqCst);
        slow.max_in_flight.store(0, Ordering::SeqCst);
        let expected = listing(op, &services, &Signal::new()).await.unwrap();
        // One list plus one read per cold candidate (14 children, or 16 descendants).
        let cold = match op {
            Op::Children => 14,
            Op::Descendants => 16,
        };
        assert_eq!(slow.reads.load(Ordering::SeqCst), 1 + cold, "{op:?}");
        assert_eq!(
            slow.max_in_flight.load(Ordering::SeqCst),
            4,
            "{op:?}: bounded parallel reads"
        );
        let kinds: HashSet<String> = expected
            .iter()
            .map(|v| format!("{}/{}", v["kind"], v.get("activity").or(v.get("reason")).unwrap()))
            .collect();
        assert_eq!(
            kinds.len(),
            4,
            "{op:?}: running, inactive, corrupt and unavailable rows: {kinds:?}"
        );
        let mut cancelled = 0;
        let mut most_in_flight_at_cancel = 0;
        for point in 0.. {
            assert!(point < 1_000, "{op:?}: the listing never completed");
            slow.reads.store(0, Ordering::SeqCst);
            let signal = Signal::new();
            let task = tokio::spawn({
                let (services, signal) = (services.clone(), signal.clone());
                async move { listing(op, &services, &signal).await }
            });
            points(point).await;
            most_in_flight_at_cancel = most_in_flight_at_cancel.max(slow.in_flight.load(Ordering::SeqCst));
            // The listing has no await after its final token check: a listing not finished
            // by now must see this cancellation.
            let finished = task.is_finished();
            signal.cancel(CancelCause::User);
            let reads_at_cancel = slow.reads.load(Ordering::SeqCst);
            let result = task.await.unwrap();
            assert_eq!(
                slow.in_flight.load(Ordering::SeqCst),
                0,
                "{op:?} point {point}: a read outlived the listing"
            );
            match result {
                Ok(rows) => {
                    assert!(finished, "{op:?} point {point}: success after the cancellation");
                    assert_eq!(rows, expected, "{op:?} point {point}");
                    break;
                }
                Err(err) => {
                    assert_eq!(code(err), SubagentErrorCode::Cancelled, "{op:?} point {point}");
                    assert_eq!(
                        slow.reads.load(Ordering::SeqCst),
                        reads_at_cancel,
                        "{op:?} point {point}: a read started after the cancellation"
                    );
                    cancelled += 1;
                }
            }
        }
        assert!(
            cancelled >= 10,
            "{op:?}: only {cancelled} points fell inside the listing"
        );
        assert_eq!(
            most_in_flight_at_cancel, 4,
            "{op:?}: some cancellation lands while four reads are in flight"
        );
    }
    finish(runtime, live).await;
}

// ---------------------------------------------------------------------------------------------
// Listing under concurrent churn
// ---------------------------------------------------------------------------------------------

/// What the churn has finished doing, updated after each step completes.
#[derive(Default)]
struct Churned {
    described: HashSet<String>,
    disposed: HashSet<String>,
    done: bool,
}

const CHURN: usize = 48;

/// Creates `CHURN` children of `p` from two tasks, `pace` scheduling points apart per step: enter,
/// append the descriptor, run a turn, then dispose of two in three (the rest stay live until the
/// end). Returns the guards of the live ones.
async fn churn(runtime: Runtime, state: Arc<Mutex<Churned>>, lane: usize, pace: usize) -> Vec<Registration> {
    let mut kept = Vec::new();
    for i in (lane..CHURN).step_by(2) {
        let id = format!("c{i:03}");
        let store = runtime.sessions();
        let session = store
            .prepare(
                SessionId::from(id.as_str()),
                None,
                meta(Some(P), 10 + i as u64, true),
            )
            .unwrap();
        let guard = store.enter(session.clone()).unwrap();
        points(pace).await;
        session.append(descriptor(continuable(&id)), None).unwrap();
        state.lock().described.insert(id.clone());
        points(pace).await;
        session.append(EventData::TurnStart { turn: 1 }, None).unwrap();
        session
            .append(
                EventData::TurnEnd {
                    turn: 1,
                    reason: TurnEndReason::Completed,
                },
                None,
            )
            .unwrap();
        if i % 3 == 0 {
            kept.push(guard);
        } else {
            drop(guard);
            state.lock().disposed.insert(id.clone());
        }
        points(pace).await;
    }
    kept
}

/// Checks one listing taken while the churn ran: children in id (= creation) order, each once;
/// each a continuable child labelled with its id (no diagnostic: every child is described
/// before it can settle); every child described before the listing began is listed, and every
/// child disposed of before it began is listed `inactive`.
fn check_churned(rows: &[SubagentListEntry], described: &HashSet<String>, disposed: &HashSet<String>) {
    let ids: Vec<&str> = rows.iter().map(|r| r.id().as_str()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "order or duplicate: {ids:?}");
    for row in rows {
        let SubagentListEntry::Child {
            id,
            activity,
            mode,
            label,
            has_children,
        } = row
        else {
            panic!("a diagnostic row under churn: {row:?} in {ids:?}");
        };
        assert_eq!(
            (*mode, label.as_deref(), *has_children),
            ("continuable", Some(id.as_str()), false)
        );
        if disposed.contains(id.as_str()) {
            assert_eq!(*activity, Inactive, "{id:?} was disposed of before the listing");
        }
    }
    for id in described {
        assert!(
            ids.contains(&id.as_str()),
            "{id} was described before the listing but is missing"
        );
    }
}

/// spec: LIST-7, LIST-8, LIST-10 — on a multi-threaded runtime, children are created, described,
/// settled and disposed of (by the reference runtime's live store over a memory or a JSON-lines
/// store) while `listChildren` and `listDescendants` run again and again: every listing
/// completes, lists each child once (live or persisted, never both), in order, with its own
/// label, never drops a child that existed before it began and never lists a disposed one as
/// running; the final listing has every child `inactive`, and the host ends quiescent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_during_churn_is_well_formed() {
    for jsonl in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let persistence: Arc<dyn SessionPersistence> = if jsonl {
            Arc::new(JsonlStore::new(dir.path()))
        } else {
            Arc::new(MemoryStore::new())
        };
        let runtime = Runtime::builder().persistence(persistence.clone()).build();
        let registry = ProjectionRegistry::new();
        let _units = register_projections(&registry).unwrap();
        let services = services_of(&runtime, &registry, persistence);
        let parent = enter(&runtime, P, meta(None, 1, false), vec![]);
        let state = Arc::new(Mutex::new(Churned::default()));
        // Scheduling points between two churn steps, so that listings overlap the churn (a
        // JSON-lines listing is slower: it reads files on the blocking pool).
        let pace = if jsonl { 200 } else { 20 };
        let lanes: Vec<_> = (0..2)
            .map(|lane| tokio::spawn(churn(runtime.clone(), state.clone(), lane, pace)))
            .collect();
        let lister = tokio::spawn({
            let (services, state) = (services.clone(), state.clone());
            async move {
                let mut partial = 0;
                loop {
                    let (described, disposed, done) = {
                        let s = state.lock();
                        (s.described.clone(), s.disposed.clone(), s.done)
                    };
                    if !described.is_empty() && described.len() < CHURN {
                        partial += 1;
                    }
                    let root = SessionId::from(P);
                    let rows = list_children(&services, &root, &Signal::new()).await.unwrap();
                    check_churned(&rows, &described, &disposed);
                    let below = list_descendants(&services, &root, &Signal::new()).await.unwrap();
                    assert!(below.iter().all(|d| d.depth == 1 && d.parent_id == root));
                    let below: Vec<_> = below.into_iter().map(|d| d.entry).collect();
                    check_churned(&below, &described, &disposed);
                    if done {
                        return partial;
                    }
                    // Over a memory store a listing never suspends: let the churn run (tasks
                    // that yielded on this worker wait for it to return to the scheduler).
                    tokio::task::yield_now().await;
                }
            }
        });
        let work = async {
            let mut kept = Vec::new();
            for lane in lanes {
                kept.extend(lane.await.unwrap());
            }
            state.lock().done = true;
            let partial = lister.await.unwrap();
            assert!(partial > 0, "no listing overlapped the churn");
            kept
        };
        let mut kept = tokio::time::timeout(std::time::Duration::from_secs(60), work)
            .await
            .expect("a listing deadlocked");
        kept.push(parent);
        finish(runtime, kept).await;
        let rows = list_children(&services, &SessionId::from(P), &Signal::new())
            .await
            .unwrap();
        assert_eq!(rows.len(), CHURN, "jsonl: {jsonl}");
        assert!(rows.iter().all(|r| matches!(
            r,
            SubagentListEntry::Child {
                activity: Inactive,
                ..
            }
        )));
    }
}

// ---------------------------------------------------------------------------------------------
// Descendant walks over hostile trees
// ---------------------------------------------------------------------------------------------

/// A deterministic pseudo-random sequence (an LCG), so failures replay.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An ordinary session (traversed, never a row).
    Ordinary,
    /// A settled, described child.
    Settled,
    /// A settled child without a descriptor (`corrupt`).
    Bare,
    /// A live, described child.
    Running,
    /// A live child inside its creation window (omitted).
    Window,
}

struct Node {
    id: String,
    parent: String,
    created_at: u64,
    kind: Kind,
}

/// The §2.18 descendant listing of `root` over `nodes`, computed recursively: stable pre-order
/// (siblings by `createdAt` then id), each node visited once (the root never), every node
/// traversed, only subagent nodes with a row emitted.
fn reference_walk(nodes: &[Node], root: &str) -> Vec<(SubagentListEntry, String, usize)> {
    fn visit<'a>(
        nodes: &'a [Node],
        at: &str,
        depth: usize,
        visited: &mut HashSet<&'a str>,
        out: &mut Vec<(SubagentListEntry, String, usize)>,
    ) {
        let mut below: Vec<&Node> = nodes.iter().filter(|n| n.parent == at).collect();
        below.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        for node in below {
            if !visited.insert(&node.id) {
                continue;
            }
            let has_children = nodes
                .iter()
                .any(|n| n.kind != Kind::Ordinary && n.parent == node.id);
            let label = Some(node.id.as_str());
            let row = match node.kind {
                Kind::Ordinary | Kind::Window => None,
                Kind::Settled => Some(child(&node.id, Inactive, has_children, "continuable", label)),
                Kind::Running => Some(child(&node.id, Running, has_children, "continuable", label)),
                Kind::Bare => Some(diagnostic(&node.id, Corrupt)),
            };
            if let Some(row) = row {
                out.push((row, node.parent.clone(), depth));
            }
            visit(nodes, &node.id, depth + 1, visited, out);
        }
    }
    let mut out = Vec::new();
    visit(nodes, root, 1, &mut HashSet::from([root]), &mut out);
    out
}

fn fixture_of(nodes: &[Node]) -> Fixture {
    let f = Fixture::new();
    for node in nodes {
        let h = header(
            &node.id,
            Some(&node.parent),
            node.created_at,
            node.kind != Kind::Ordinary,
        );
        let described = [continuable(&node.id)];
        match node.kind {
            Kind::Ordinary | Kind::Bare => f.disk.add(h, &[]),
            Kind::Settled => f.disk.add(h, &described),
            Kind::Running => f.live.add(h, &described),
            Kind::Window => f.live.add(h, &[]),
        }
    }
    f
}

/// spec: LIST-43, LIST-45, LIST-46, LIST-48, LIST-49 — over pseudo-random forests of live,
/// settled, corrupt, creation-window and ordinary sessions whose parent links may point at the
/// root, at earlier or later nodes (cycles and self-loops included) or at a session that no
/// longer exists, `listDescendants` from the root, from a missing parent and from every node
/// equals a recursive pre-order reference (siblings by `createdAt` then id, each session at most
/// once, the root never), and its depth-1 rows equal `listChildren` (less a self-parented
/// root).
#[tokio::test(start_paused = true)]
async fn descendant_walks_match_a_recursive_pre_order() {
    for seed in 0..12 {
        let mut rng = Lcg(seed);
        let n = 40;
        let nodes: Vec<Node> = (0..n)
            .map(|i| {
                let parent = match rng.below(10) {
                    0..=2 => "r".to_owned(),
                    3..=6 if i > 0 => format!("n{:02}", rng.below(i)),
                    7 => "gone".to_owned(),
                    _ => format!("n{:02}", rng.below(n)),
                };
                let kind = [
                    Kind::Ordinary,
                    Kind::Settled,
                    Kind::Settled,
                    Kind::Bare,
                    Kind::Running,
                    Kind::Window,
                ][rng.below(6) as usize];
                Node {
                    id: format!("n{i:02}"),
                    parent,
                    created_at: rng.below(5),
                    kind,
                }
            })
            .collect();
        let f = fixture_of(&nodes);
        let roots = ["r", "gone"]
            .into_iter()
            .map(str::to_owned)
            .chain(nodes.iter().map(|n| n.id.clone()));
        for root in roots {
            let got: Vec<_> =
                list_descendants(&f.services(), &SessionId::from(root.as_str()), &Signal::new())
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|d| (d.entry, d.parent_id.as_str().to_owned(), d.depth))
                    .collect();
            assert_eq!(got, reference_walk(&nodes, &root), "seed {seed} root {root}");
            let mut seen = HashSet::new();
            assert!(got.iter().all(|(row, _, _)| seen.insert(row.id().clone())));
            assert!(!seen.contains(&SessionId::from(root.as_str())));
            let direct: Vec<_> = got
                .into_iter()
                .filter(|(_, _, depth)| *depth == 1)
                .map(|(row, _, _)| row)
                .collect();
            // A self-parented root is its own child (§2.18's candidate rule has no exception)
            // but never its own descendant.
            let mut children = f.children(&root).await;
            children.retain(|row| row.id().as_str() != root);
            assert_eq!(children, direct, "seed {seed} root {root}");
        }
    }
}

/// spec: LIST-46, LIST-47 — a 10,000-deep chain of continuable children (every seventh live,
/// the rest settled in the reference memory store) whose root names the leaf as its parent,
/// with a thousand settled siblings beside the chain's head: the walk terminates, lists every
/// child exactly once in pre-order at its depth, reads each settled one once, and never lists
/// the root.
#[tokio::test(start_paused = true)]
async fn a_deep_cyclic_chain_and_a_wide_level_list_once_in_pre_order() {
    const DEEP: usize = 10_000;
    const WIDE: usize = 1_000;
    let store = Arc::new(MemoryStore::new());
    let live = Arc::new(LiveStore::default());
    let registry = ProjectionRegistry::new();
    let _units = register_projections(&registry).unwrap();
    let persist = |h: SessionHeader, label: &str| {
        SessionPersistence::create(&*store, &h).unwrap();
        SessionPersistence::append(&*store, &h.id, &log(&[continuable(label)])[0]).unwrap();
    };
    persist(header("r", Some(&format!("d{}", DEEP - 1)), 0, true), "root");
    for i in 0..DEEP {
        let id = format!("d{i}");
        let parent = if i == 0 {
            "r".to_owned()
        } else {
            format!("d{}", i - 1)
        };
        let h = header(&id, Some(&parent), 1, true);
        if i % 7 == 3 {
            live.add(h, &[continuable(&id)]);
        } else {
            persist(h, &id);
        }
    }
    // Siblings of the chain's head, created at the same time (ordered by id) or later.
    for i in 0..WIDE {
        let id = format!("w{i:04}");
        persist(header(&id, Some("r"), (i % 3) as u64, true), &id);
    }
    let services = ListingServices {
        projections: Some(registry.clone()),
        store: Some(live.clone()),
        persistence: Some(store.clone()),
        cache: None,
    };
    let rows = list_descendants(&services, &SessionId::from("r"), &Signal::new())
        .await
        .unwrap();
    let mut expected: Vec<(String, String, usize)> = Vec::new();
    let wide = |i: usize| (format!("w{i:04}"), "r".to_owned(), 1);
    // createdAt 0 first, then createdAt 1 by id ("d0" sorts before "w…"), then createdAt 2.
    expected.extend((0..WIDE).filter(|i| i % 3 == 0).map(wide));
    for i in 0..DEEP {
        let parent = if i == 0 {
            "r".to_owned()
        } else {
            format!("d{}", i - 1)
        };
        expected.push((format!("d{i}"), parent, i + 1));
    }
    expected.extend((0..WIDE).filter(|i| i % 3 == 1).map(wide));
    expected.extend((0..WIDE).filter(|i| i % 3 == 2).map(wide));
    let got: Vec<(String, String, usize)> = rows
        .iter()
        .map(|d| {
            (
                d.entry.id().as_str().to_owned(),
                d.parent_id.as_str().to_owned(),
                d.depth,
            )
        })
        .collect();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "the walk is not the expected pre-order");
    for d in &rows {
        let id = d.entry.id().as_str();
        let SubagentListEntry::Child { label, activity, .. } = &d.entry else {
            panic!("{id}: {:?}", d.entry);
        };
        assert_eq!(label.as_deref(), Some(id));
        let running = id
            .strip_prefix('d')
            .is_some_and(|i| i.parse::<usize>().unwrap() % 7 == 3);
        assert_eq!(*activity == Running, running, "{id}");
    }
}

/// A [`MemoryStore`] that runs `hook` when a listing starts, before it reads anything.
struct Hooked {
    inner: MemoryStore,
    hook: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

#[async_trait]
impl SessionPersistence for Hooked {
    fn create(&self, header: &SessionHeader) -> Result<(), AgentError> {
        SessionPersistence::create(&self.inner, header)
    }
    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        SessionPersistence::append(&self.inner, id, event)
    }
    async fn flush(&self, id: &SessionId) -> Result<(), AgentError> {
        SessionPersistence::flush(&self.inner, id).await
    }
    async fn list(&self) -> Result<Vec<SessionHeader>, AgentError> {
        let hook = self.hook.lock().take();
        if let Some(hook) = hook {
            hook();
        }
        SessionPersistence::list(&self.inner).await
    }
    async fn inspect(&self, id: &SessionId) -> Result<Option<SessionHeader>, AgentError> {
        SessionPersistence::inspect(&self.inner, id).await
    }
    async fn load(&self, id: &SessionId) -> Result<LoadedSession, AgentError> {
        SessionPersistence::load(&self.inner, id).await
    }
}

/// spec: LIST-8 — a child the reference runtime creates while the persisted listing runs (its
/// header already persisted, its descriptor not yet appended) is in its creation window: the
/// live store, read after the persisted listing, wins its id and the child is omitted — never
/// inspected cold and reported `corrupt`. Its settled sibling lists as before.
#[tokio::test(start_paused = true)]
async fn a_child_created_during_the_persisted_listing_is_in_its_creation_window() {
    let persistence = Arc::new(Hooked {
        inner: MemoryStore::new(),
        hook: Mutex::new(None),
    });
    let runtime = Runtime::builder().persistence(persistence.clone()).build();
    let registry = ProjectionRegistry::new();
    let _units = register_projections(&registry).unwrap();
    let settled = enter(
        &runtime,
        "old",
        meta(Some(P), 1, true),
        vec![descriptor(continuable("old"))],
    );
    drop(settled);
    let created = Arc::new(Mutex::new(None));
    *persistence.hook.lock() = Some(Box::new({
        let (runtime, created) = (runtime.clone(), created.clone());
        move || *created.lock() = Some(enter(&runtime, "new", meta(Some(P), 2, true), vec![]))
    }));
    let services = services_of(&runtime, &registry, persistence.clone());
    let rows = list_children(&services, &SessionId::from(P), &Signal::new())
        .await
        .unwrap();
    assert!(created.lock().is_some(), "the hook ran");
    assert!(
        SessionPersistence::inspect(&persistence.inner, &SessionId::from("new"))
            .await
            .unwrap()
            .is_some(),
        "the new child's header is persisted"
    );
    assert_eq!(rows, [child("old", Inactive, false, "continuable", Some("old"))]);
    let guard = created.lock().take().unwrap();
    finish(runtime, vec![guard]).await;
}
