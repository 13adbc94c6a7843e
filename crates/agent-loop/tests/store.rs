//! Session stores: round trips, catalog, crash repair and corruption reporting.

mod common;

use std::fs;
use std::sync::Arc;

use agent::{EventData, SessionEvent, SessionHeader, SessionId, TurnEndReason};
use agent_loop::store::{JsonlStore, LoadedSession, MemoryStore, SessionSummary, StoreError};
use common::{LogBuilder, header, header_at, sample_log};

/// The operations both stores share, so every scenario runs against both.
trait Store {
    fn create(&self, header: &SessionHeader) -> Result<(), StoreError>;
    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), StoreError>;
    async fn flush(&self, id: &SessionId) -> Result<(), StoreError>;
    async fn list(&self) -> Result<Vec<SessionSummary>, StoreError>;
    async fn inspect(&self, id: &SessionId) -> Result<SessionHeader, StoreError>;
    async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError>;
    async fn remove(&self, id: &SessionId) -> Result<(), StoreError>;
}

macro_rules! delegate {
    ($t:ty) => {
        impl Store for $t {
            fn create(&self, header: &SessionHeader) -> Result<(), StoreError> {
                <$t>::create(self, header)
            }
            fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), StoreError> {
                <$t>::append(self, id, event)
            }
            async fn flush(&self, id: &SessionId) -> Result<(), StoreError> {
                <$t>::flush(self, id).await
            }
            async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
                <$t>::list(self).await
            }
            async fn inspect(&self, id: &SessionId) -> Result<SessionHeader, StoreError> {
                <$t>::inspect(self, id).await
            }
            async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError> {
                <$t>::load(self, id).await
            }
            async fn remove(&self, id: &SessionId) -> Result<(), StoreError> {
                <$t>::remove(self, id).await
            }
        }
    };
}
delegate!(MemoryStore);
delegate!(JsonlStore);

async fn write_log(store: &impl Store, id: &str, events: &[SessionEvent]) {
    let id = SessionId::from(id);
    store.create(&header(id.as_str())).unwrap();
    for ev in events {
        store.append(&id, ev).unwrap();
    }
    store.flush(&id).await.unwrap();
}

async fn round_trip(store: impl Store) -> Vec<SessionEvent> {
    let events = sample_log("s1");
    write_log(&store, "s1", &events).await;
    let loaded = store.load(&"s1".into()).await.unwrap();
    assert_eq!(loaded.header, header("s1"));
    assert_eq!(loaded.events, events);
    assert!(!loaded.repaired);
    events
}

async fn catalog(store: impl Store) {
    assert!(store.list().await.unwrap().is_empty());
    store.create(&header_at("b", 20)).unwrap();
    store.create(&header_at("a", 20)).unwrap();
    store.create(&header_at("z", 10)).unwrap();
    let ids: Vec<String> = store
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|s| {
            assert_eq!(s.id, s.header.id);
            s.id.to_string()
        })
        .collect();
    assert_eq!(ids, ["z", "a", "b"]);
    assert_eq!(store.inspect(&"a".into()).await.unwrap(), header_at("a", 20));
    // Re-saving an identical header is a no-op; a different one is a duplicate.
    store.create(&header_at("a", 20)).unwrap();
    let err = store.create(&header_at("a", 21)).unwrap_err();
    assert!(
        matches!(err, StoreError::Duplicate(ref id) if id.as_str() == "a"),
        "{err}"
    );
    store.remove(&"a".into()).await.unwrap();
    assert_eq!(store.list().await.unwrap().len(), 2);
    for err in [
        store.inspect(&"a".into()).await.unwrap_err(),
        store.load(&"a".into()).await.unwrap_err(),
        store.remove(&"a".into()).await.unwrap_err(),
        store.flush(&"a".into()).await.unwrap_err(),
    ] {
        assert!(
            matches!(err, StoreError::NotFound(ref id) if id.as_str() == "a"),
            "{err}"
        );
    }
}

async fn append_checks_seq(store: impl Store) {
    let events = sample_log("s");
    let id = SessionId::from("s");
    // Appending to an unknown session fails: at once in memory, at the next flush on disk
    // (the disk store checks the file in the background).
    let err = match store.append(&id, &events[0]) {
        Err(e) => e,
        Ok(()) => store.flush(&id).await.unwrap_err(),
    };
    assert!(matches!(err, StoreError::NotFound(_)), "{err}");
    store.create(&header("s")).unwrap();
    let err = store.append(&id, &events[1]).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::SeqMismatch {
                expected: 0,
                got: 1,
                ..
            }
        ),
        "{err}"
    );
    store.append(&id, &events[0]).unwrap();
    let err = store.append(&id, &events[0]).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::SeqMismatch {
                expected: 1,
                got: 0,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(store.load(&id).await.unwrap().events, events[..1]);
}

#[tokio::test]
async fn memory_round_trip() {
    round_trip(MemoryStore::new()).await;
}

#[tokio::test]
async fn jsonl_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let events = round_trip(JsonlStore::new(dir.path().join("sessions"))).await;
    // A fresh store (a restarted process) reads the same log.
    let fresh = JsonlStore::new(dir.path().join("sessions"));
    assert_eq!(fresh.load(&"s1".into()).await.unwrap().events, events);
}

#[tokio::test]
async fn memory_catalog() {
    catalog(MemoryStore::new()).await;
}

#[tokio::test]
async fn jsonl_catalog() {
    let dir = tempfile::tempdir().unwrap();
    catalog(JsonlStore::new(dir.path())).await;
}

#[tokio::test]
async fn memory_append_checks_seq() {
    append_checks_seq(MemoryStore::new()).await;
}

#[tokio::test]
async fn jsonl_append_checks_seq() {
    let dir = tempfile::tempdir().unwrap();
    append_checks_seq(JsonlStore::new(dir.path())).await;
}

#[tokio::test]
async fn memory_counts_flushes() {
    let store = MemoryStore::new();
    write_log(&store, "s", &sample_log("s")).await;
    assert_eq!(store.flush_count(&"s".into()), 1);
}

#[tokio::test]
async fn jsonl_file_layout_is_header_then_one_event_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let events = sample_log("s");
    write_log(&store, "s", &events).await;
    let text = fs::read_to_string(dir.path().join("s.jsonl")).unwrap();
    assert!(text.ends_with('\n'));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + events.len());
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(lines[0]).unwrap(),
        serde_json::to_value(header("s")).unwrap()
    );
    for (line, ev) in lines[1..].iter().zip(&events) {
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(line).unwrap(),
            serde_json::to_value(ev).unwrap()
        );
    }
}

#[tokio::test]
async fn jsonl_rejects_ids_that_are_not_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    for bad in ["", ".", "..", "a/b", "a\\b"] {
        let err = store.inspect(&bad.into()).await.unwrap_err();
        assert!(matches!(err, StoreError::InvalidId(_)), "{bad:?}: {err}");
    }
}

/// Writes a valid log, then appends `tail` raw bytes to it.
async fn log_with_tail(dir: &std::path::Path, tail: &[u8]) -> (Vec<SessionEvent>, Vec<u8>) {
    let events = sample_log("s");
    write_log(&JsonlStore::new(dir), "s", &events).await;
    let path = dir.join("s.jsonl");
    let mut bytes = fs::read(&path).unwrap();
    bytes.extend_from_slice(tail);
    fs::write(&path, &bytes).unwrap();
    (events, bytes)
}

#[tokio::test]
async fn torn_last_line_is_dropped_and_truncated_before_the_next_append() {
    let dir = tempfile::tempdir().unwrap();
    let (events, bytes) = log_with_tail(dir.path(), br#"{"type":"turn/start","seq":12,"ti"#).await;
    let path = dir.path().join("s.jsonl");
    let store = JsonlStore::new(dir.path());
    let loaded = store.load(&"s".into()).await.unwrap();
    assert!(loaded.repaired);
    assert_eq!(loaded.events, events);
    assert_eq!(fs::read(&path).unwrap(), bytes, "load never rewrites");
    // Nor does a flush with nothing appended (a host flushing every session at shutdown).
    store.flush(&"s".into()).await.unwrap();
    assert_eq!(
        fs::read(&path).unwrap(),
        bytes,
        "a flush of nothing never rewrites"
    );

    // Appending continues after the intact prefix: the torn bytes are cut first.
    let mut more = LogBuilder::new("s");
    for ev in &events {
        more.push(ev.data.clone());
    }
    more.push(EventData::TurnStart { turn: 2 });
    let next = more.events().pop().unwrap();
    store.append(&"s".into(), &next).unwrap();
    store.flush(&"s".into()).await.unwrap();
    let reloaded = JsonlStore::new(dir.path()).load(&"s".into()).await.unwrap();
    assert!(!reloaded.repaired);
    assert_eq!(reloaded.events.len(), events.len() + 1);
    assert_eq!(reloaded.events.last(), Some(&next));
}

/// A last line whose lost blocks read back as zeros after a power loss — the page holding its
/// newline kept — is a torn write even with its newline: no encoded line holds a NUL byte, and
/// no flush acknowledged it.
#[tokio::test]
async fn zero_filled_last_line_is_dropped_even_with_its_newline() {
    let dir = tempfile::tempdir().unwrap();
    let (events, _) = log_with_tail(dir.path(), b"\0\0\0garbage\n").await;
    let loaded = JsonlStore::new(dir.path()).load(&"s".into()).await.unwrap();
    assert!(loaded.repaired);
    assert_eq!(loaded.events, events);
}

#[tokio::test]
async fn last_line_missing_only_its_newline_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let events = sample_log("s");
    write_log(&JsonlStore::new(dir.path()), "s", &events).await;
    let path = dir.path().join("s.jsonl");
    let mut bytes = fs::read(&path).unwrap();
    bytes.pop();
    fs::write(&path, &bytes).unwrap();
    let store = JsonlStore::new(dir.path());
    let loaded = store.load(&"s".into()).await.unwrap();
    assert!(!loaded.repaired);
    assert_eq!(loaded.events, events);
    // The writer restores the newline before appending.
    let mut more = LogBuilder::new("s");
    for ev in &events {
        more.push(ev.data.clone());
    }
    more.push(EventData::TurnStart { turn: 2 });
    store.append(&"s".into(), &more.events()[events.len()]).unwrap();
    // The append is buffered: make it durable before reading the file back.
    store.flush(&"s".into()).await.unwrap();
    let reloaded = JsonlStore::new(dir.path()).load(&"s".into()).await.unwrap();
    assert_eq!(reloaded.events, more.events());
}

#[tokio::test]
async fn garbage_in_the_middle_names_file_and_line_and_rewrites_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let events = sample_log("s");
    write_log(&JsonlStore::new(dir.path()), "s", &events).await;
    let path = dir.path().join("s.jsonl");
    let text = fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines[4] = "{not json".into(); // line 5 = the event with seq 3
    let damaged = lines.join("\n") + "\n";
    fs::write(&path, &damaged).unwrap();

    let store = JsonlStore::new(dir.path());
    let err = store.load(&"s".into()).await.unwrap_err();
    match &err {
        StoreError::Corrupt { path: p, line, .. } => {
            assert_eq!(p, &path);
            assert_eq!(*line, 5);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let shown = err.to_string();
    assert!(shown.contains("s.jsonl") && shown.contains("line 5"), "{shown}");

    // Appending from a store that never loaded it is refused at the flush, and nothing
    // touches the file.
    let fresh = JsonlStore::new(dir.path());
    let mut more = LogBuilder::new("s");
    for ev in &events {
        more.push(ev.data.clone());
    }
    more.push(EventData::TurnStart { turn: 2 });
    fresh.append(&"s".into(), &more.events()[events.len()]).unwrap();
    let err = fresh.flush(&"s".into()).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { line: 5, .. }), "{err}");
    assert_eq!(fs::read_to_string(&path).unwrap(), damaged);
}

#[tokio::test]
async fn invalid_header_and_invalid_sequence_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let events = sample_log("s");
    write_log(&JsonlStore::new(dir.path()), "s", &events).await;
    let path = dir.path().join("s.jsonl");
    let text = fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();

    // Two events swapped: every line parses, but seq != index.
    let mut swapped = lines.clone();
    swapped.swap(2, 3);
    fs::write(&path, swapped.join("\n") + "\n").unwrap();
    let err = JsonlStore::new(dir.path()).load(&"s".into()).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidLog { .. }), "{err}");

    // A header naming another session.
    let mut other = lines.clone();
    let h = serde_json::to_string(&header("t")).unwrap();
    other[0] = &h;
    fs::write(&path, other.join("\n") + "\n").unwrap();
    let store = JsonlStore::new(dir.path());
    let err = store.load(&"s".into()).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { line: 1, .. }), "{err}");
    let err = store.inspect(&"s".into()).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { line: 1, .. }), "{err}");
    // The catalog skips it instead of failing.
    assert!(store.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn torn_header_is_replaced_by_create() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("s.jsonl"), br#"{"version":0,"id":"s","crea"#).unwrap();
    let store = JsonlStore::new(dir.path());
    let err = store.load(&"s".into()).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { line: 1, .. }), "{err}");
    store.create(&header("s")).unwrap();
    let loaded = store.load(&"s".into()).await.unwrap();
    assert_eq!(loaded.header, header("s"));
    assert!(loaded.events.is_empty());
}

#[tokio::test]
async fn concurrent_flushes_share_one_sync() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(JsonlStore::new(dir.path()));
    let events = sample_log("s");
    let id = SessionId::from("s");
    store.create(&header("s")).unwrap();
    for ev in &events {
        store.append(&id, ev).unwrap();
    }
    assert_eq!(store.sync_count(&id), Some(0), "appends never sync");
    let flushes = (0..32).map(|_| store.flush(&id));
    for result in futures::future::join_all(flushes).await {
        result.unwrap();
    }
    assert_eq!(store.sync_count(&id), Some(1));
    // Nothing new: no sync at all.
    store.flush(&id).await.unwrap();
    assert_eq!(store.sync_count(&id), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_and_flushes_across_sessions_stay_ordered() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(JsonlStore::new(dir.path()));
    let mut tasks = Vec::new();
    for s in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("s{s}");
            let id = SessionId::from(name.as_str());
            let events = sample_log(&name);
            store.create(&header(&name)).unwrap();
            for (i, ev) in events.iter().enumerate() {
                store.append(&id, ev).unwrap();
                if i % 3 == 0 {
                    store.flush(&id).await.unwrap();
                }
            }
            store.flush(&id).await.unwrap();
            (id, events)
        }));
    }
    for task in tasks {
        let (id, events) = task.await.unwrap();
        let loaded = JsonlStore::new(dir.path()).load(&id).await.unwrap();
        assert_eq!(loaded.events, events);
    }
}

/// A store over a fresh directory in which session `s` was created and given the first five
/// events of `sample_log("s")` (all of which it returns).
fn five_appended() -> (tempfile::TempDir, JsonlStore, SessionId, Vec<SessionEvent>) {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let events = sample_log("s");
    let id = SessionId::from("s");
    store.create(&header("s")).unwrap();
    for ev in &events[..5] {
        store.append(&id, ev).unwrap();
    }
    (dir, store, id, events)
}

#[tokio::test]
async fn close_releases_the_handle_and_the_next_append_reopens() {
    let (_dir, store, id, events) = five_appended();
    store.close(&id).await.unwrap();
    assert_eq!(store.sync_count(&id), None);
    for ev in &events[5..] {
        store.append(&id, ev).unwrap();
    }
    assert_eq!(store.load(&id).await.unwrap().events, events);
}

/// Appends made while `close` is still waiting for the closed writer's lines go to a new writer
/// that opens the log only after the closed one let go of its lock: they continue the log in
/// order and their flush succeeds. (The new writer used to open the log at once and find it
/// still locked by the closing one: its flush failed `Locked`.)
#[tokio::test]
async fn appends_made_while_close_runs_continue_the_log_after_it() {
    for _ in 0..20 {
        let (dir, store, id, events) = five_appended();
        let mut closing = std::pin::pin!(store.close(&id));
        // The first poll takes the writer out of the store; it then waits for its writes.
        let closed = futures::poll!(closing.as_mut());
        for ev in &events[5..] {
            store.append(&id, ev).unwrap();
        }
        if closed.is_pending() {
            closing.await.unwrap();
        }
        store.flush(&id).await.unwrap();
        assert_eq!(store.load(&id).await.unwrap().events, events);
        assert_eq!(
            JsonlStore::new(dir.path()).load(&id).await.unwrap().events,
            events
        );
    }
}

/// `release` lets go of a session without waiting: appended lines still being written are
/// neither lost nor read half-written — a load, a flush or another store's claim right after it
/// sees every line — and the store holds nothing for the session any more (its file and lock
/// go once the lines are written). A later append in the same store reopens the log and
/// continues it in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_lets_go_once_written_and_loses_nothing() {
    for _ in 0..20 {
        let (dir, store, id, events) = five_appended();
        store.release(&id);
        assert_eq!(store.sync_count(&id), None, "no writer held");
        assert_eq!(store.load(&id).await.unwrap().events, events[..5]);
        store.flush(&id).await.unwrap();
        let other = JsonlStore::new(dir.path());
        assert_eq!(other.load(&id).await.unwrap().events, events[..5]);
        other
            .claim(&id, 5)
            .await
            .expect("the released log is free for another store");
        other.close(&id).await.unwrap();

        for ev in &events[5..] {
            store.append(&id, ev).unwrap();
        }
        store.release(&id);
        store.flush(&id).await.unwrap();
        assert_eq!(store.sync_count(&id), None);
        assert_eq!(
            JsonlStore::new(dir.path()).load(&id).await.unwrap().events,
            events
        );
    }
}

/// A writer poisoned by a failure is not let go of by `release`: the lines it lost must not
/// read as durable, so the next flush still reports the failure (here a seq gap only the file
/// could reveal), until `close` clears it.
#[tokio::test]
async fn release_keeps_a_poisoned_writer_and_its_failure() {
    let dir = tempfile::tempdir().unwrap();
    let events = sample_log("s");
    write_log(&JsonlStore::new(dir.path()), "s", &events).await;
    let all = continued(&events, 3);
    let id = SessionId::from("s");
    let b = JsonlStore::new(dir.path());
    // One past the log's end: the writer finds the gap when it opens the file.
    b.append(&id, &all[events.len() + 1]).unwrap();
    assert!(b.flush(&id).await.is_err(), "the gap is reported");
    b.release(&id);
    assert!(b.flush(&id).await.is_err(), "still reported after release");
    assert!(
        b.close(&id).await.is_err(),
        "close returns the failure and clears it"
    );
    b.flush(&id).await.unwrap();
    assert_eq!(b.load(&id).await.unwrap().events, events);
}

#[tokio::test]
async fn turn_end_reason_interrupted_round_trips_through_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let mut events = LogBuilder::new("s");
    events.push(EventData::TurnStart { turn: 1 });
    let mut events = events.events();
    assert!(agent_loop::repair_open_turn(&mut events));
    write_log(&store, "s", &events).await;
    let loaded = store.load(&"s".into()).await.unwrap();
    assert!(matches!(
        loaded.events[1].data,
        EventData::TurnEnd {
            turn: 1,
            reason: TurnEndReason::Interrupted
        }
    ));
}

/// `events` continued by one more event (a fresh `turn/start`).
fn continued(events: &[SessionEvent], extra: usize) -> Vec<SessionEvent> {
    let mut b = LogBuilder::new("s");
    for ev in events {
        b.push(ev.data.clone());
    }
    for i in 0..extra {
        b.push(EventData::other("test/more", serde_json::json!({"i": i})));
    }
    let mut all = b.events();
    // Keep the original events (and their message ids) verbatim.
    all.splice(..events.len(), events.iter().cloned());
    all
}

#[tokio::test]
async fn a_fresh_store_continues_an_existing_log_and_checks_the_seq_when_it_opens_it() {
    let dir = tempfile::tempdir().unwrap();
    let events = sample_log("s");
    write_log(&JsonlStore::new(dir.path()), "s", &events).await;
    let path = dir.path().join("s.jsonl");
    let all = continued(&events, 6);

    // Right seq, no load first: accepted, verified when the writer opens the file.
    let b = JsonlStore::new(dir.path());
    b.append(&"s".into(), &all[events.len()]).unwrap();
    b.append(&"s".into(), &all[events.len() + 1]).unwrap();
    b.flush(&"s".into()).await.unwrap();
    assert_eq!(b.load(&"s".into()).await.unwrap().events, all[..events.len() + 2]);
    let before = fs::read(&path).unwrap();
    // A store keeps the log it writes locked until it lets go of it.
    b.close(&"s".into()).await.unwrap();

    // A gap: reported by the flush, the file is untouched, the writer stays poisoned.
    let c = JsonlStore::new(dir.path());
    c.append(&"s".into(), &all[events.len() + 4]).unwrap();
    let err = c.flush(&"s".into()).await.unwrap_err();
    let expected = events.len() as u64 + 2;
    let got = expected + 2;
    assert!(
        matches!(err, StoreError::SeqMismatch { expected: e, got: g, .. } if e == expected && g == got),
        "{err}"
    );
    assert!(c.append(&"s".into(), &all[events.len() + 2]).is_err());
    assert_eq!(fs::read(&path).unwrap(), before);
    // Closing clears the poisoned writer.
    c.close(&"s".into()).await.unwrap_err();
    c.append(&"s".into(), &all[events.len() + 2]).unwrap();
    c.flush(&"s".into()).await.unwrap();
    assert_eq!(c.load(&"s".into()).await.unwrap().events, all[..events.len() + 3]);
    c.close(&"s".into()).await.unwrap();

    // After a load, the seq is checked at once.
    let d = JsonlStore::new(dir.path());
    d.load(&"s".into()).await.unwrap();
    let err = d.append(&"s".into(), &all[0]).unwrap_err();
    assert!(matches!(err, StoreError::SeqMismatch { .. }), "{err}");
    // And re-creating a loaded session with its own header is a no-op (resume).
    d.create(&header("s")).unwrap();
    d.append(&"s".into(), &all[events.len() + 3]).unwrap();
    d.flush(&"s".into()).await.unwrap();
}

#[tokio::test]
async fn creating_over_a_different_log_on_disk_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let events = sample_log("s");
    write_log(&JsonlStore::new(dir.path()), "s", &events).await;
    let path = dir.path().join("s.jsonl");
    let before = fs::read(&path).unwrap();

    let other = JsonlStore::new(dir.path());
    other.create(&header_at("s", 99)).unwrap();
    let err = other.flush(&"s".into()).await.unwrap_err();
    assert!(matches!(err, StoreError::Duplicate(_)), "{err}");

    // The same header is adopted, but the log is not empty: appending from seq 0 is a gap. The
    // creation starts the writer at once (on a blocking thread), so the gap is refused by the
    // append itself when the writer has read the log by then, and otherwise at the flush.
    let same = JsonlStore::new(dir.path());
    same.create(&header("s")).unwrap();
    let err = match same.append(&"s".into(), &events[0]) {
        Err(err) => err,
        Ok(()) => same.flush(&"s".into()).await.unwrap_err(),
    };
    assert!(
        matches!(
            err,
            StoreError::SeqMismatch {
                expected: 12,
                got: 0,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(fs::read(&path).unwrap(), before);
}

#[tokio::test]
async fn both_stores_serve_as_spine_persistence() {
    use agent::{AgentError, SessionPersistence};
    let dir = tempfile::tempdir().unwrap();
    let stores: Vec<Arc<dyn SessionPersistence>> = vec![
        Arc::new(MemoryStore::new()),
        Arc::new(JsonlStore::new(dir.path())),
    ];
    for store in stores {
        let events = sample_log("s");
        let id = SessionId::from("s");
        store.create(&header("s")).unwrap();
        for ev in &events {
            store.append(&id, ev).unwrap();
        }
        store.flush(&id).await.unwrap();
        assert_eq!(store.list().await.unwrap(), vec![header("s")]);
        assert_eq!(store.inspect(&id).await.unwrap(), Some(header("s")));
        assert_eq!(store.inspect(&"nope".into()).await.unwrap(), None);
        let loaded = store.load(&id).await.unwrap();
        assert_eq!((loaded.header, loaded.events), (header("s"), events.clone()));
        assert!(matches!(
            store.load(&"nope".into()).await,
            Err(AgentError::NotFound(_))
        ));
        assert!(matches!(
            store.create(&header_at("s", 5)),
            Err(AgentError::Duplicate(_))
        ));
        match store.append(&id, &events[0]) {
            Err(AgentError::Persistence(msg)) => assert!(msg.contains("expected 12"), "{msg}"),
            other => panic!("expected a persistence error, got {other:?}"),
        }
    }
}

#[test]
fn creating_and_appending_work_outside_a_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let store = JsonlStore::new(dir.path());
    let events = sample_log("s");
    store.create(&header("s")).unwrap();
    for ev in &events {
        store.append(&"s".into(), ev).unwrap();
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        store.flush(&"s".into()).await.unwrap();
        assert_eq!(
            JsonlStore::new(dir.path())
                .load(&"s".into())
                .await
                .unwrap()
                .events,
            events
        );
    });
}

/// One writer per log at a time: a second store (in this process or another) can read a log
/// that another store is writing, but its appends fail with `Locked` at the flush and nothing
/// of theirs reaches the file; the first store writes on undisturbed; once it closes the log,
/// the second can continue it.
#[tokio::test]
async fn a_log_is_written_by_one_store_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let events = sample_log("s");
    let all = continued(&events, 4);
    let path = dir.path().join("s.jsonl");
    let a = JsonlStore::new(dir.path());
    write_log(&a, "s", &events).await;
    let n = events.len();

    let b = JsonlStore::new(dir.path());
    assert_eq!(
        b.load(&"s".into()).await.unwrap().events,
        events,
        "reading is not locked"
    );
    let before = fs::read(&path).unwrap();
    b.append(&"s".into(), &all[n]).unwrap();
    let err = b.flush(&"s".into()).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Locked { id, .. } if id.as_str() == "s"),
        "{err}"
    );
    assert!(err.to_string().contains("locked"), "{err}");
    assert_eq!(
        fs::read(&path).unwrap(),
        before,
        "nothing of the second store's was written"
    );
    assert!(
        b.append(&"s".into(), &all[n + 1]).is_err(),
        "its writer stays poisoned"
    );

    a.append(&"s".into(), &all[n]).unwrap();
    a.flush(&"s".into()).await.unwrap();
    assert_eq!(a.load(&"s".into()).await.unwrap().events, all[..=n]);

    a.close(&"s".into()).await.unwrap();
    assert!(matches!(
        b.close(&"s".into()).await,
        Err(StoreError::Locked { .. })
    ));
    assert_eq!(b.load(&"s".into()).await.unwrap().events, all[..=n]);
    b.append(&"s".into(), &all[n + 1]).unwrap();
    b.flush(&"s".into()).await.unwrap();
    assert_eq!(b.load(&"s".into()).await.unwrap().events, all[..n + 2]);
}

/// A store that read a log, then let another store continue it, must not append after its
/// stale reading: the writer reads the log again under the lock and reports the gap, and the
/// file keeps exactly what the other store wrote (no event twice, no seq twice).
#[tokio::test]
async fn a_log_changed_since_it_was_read_is_read_again_before_appending() {
    let dir = tempfile::tempdir().unwrap();
    let events = sample_log("s");
    let all = continued(&events, 2);
    let path = dir.path().join("s.jsonl");
    write_log(&JsonlStore::new(dir.path()), "s", &events).await;
    let n = events.len();

    let stale = JsonlStore::new(dir.path());
    assert_eq!(stale.load(&"s".into()).await.unwrap().events.len(), n);

    let other = JsonlStore::new(dir.path());
    other.load(&"s".into()).await.unwrap();
    other.append(&"s".into(), &all[n]).unwrap();
    other.flush(&"s".into()).await.unwrap();
    other.close(&"s".into()).await.unwrap();
    let before = fs::read(&path).unwrap();

    // Accepted against the stale length (seq n), refused when the writer opens the file.
    stale.append(&"s".into(), &all[n]).unwrap();
    assert_stale_flush_refused(&stale, dir.path(), &before, &all[..=n]).await;
}

/// A store that read a log with a torn tail, then let another store cut that tail and append an
/// event exactly as long as it, must not take the unchanged file length for an unchanged file:
/// its writer reads the log again under the lock instead of cutting at its stale offset (which
/// would destroy the other store's flushed event), and reports the gap.
#[tokio::test]
async fn a_torn_log_continued_to_the_same_length_since_it_was_read_is_read_again() {
    let dir = tempfile::tempdir().unwrap();
    let n = sample_log("s").len();
    let path = dir.path().join("s.jsonl");
    // The next event's line length depends on its seq and data, not on the earlier events.
    let theirs_len = serde_json::to_vec(&continued(&sample_log("s"), 1)[n])
        .unwrap()
        .len()
        + 1;
    // A torn tail exactly as long as the line the other store will append in its place.
    let mut tail = b"{".to_vec();
    tail.resize(theirs_len, b'x');
    let (events, torn) = log_with_tail(dir.path(), &tail).await;
    let all = continued(&events, 1);
    assert_eq!(serde_json::to_vec(&all[n]).unwrap().len() + 1, theirs_len);

    let stale = JsonlStore::new(dir.path());
    let loaded = stale.load(&"s".into()).await.unwrap();
    assert!(loaded.repaired);
    assert_eq!(loaded.events.len(), n);

    let other = JsonlStore::new(dir.path());
    other.load(&"s".into()).await.unwrap();
    other.append(&"s".into(), &all[n]).unwrap();
    other.flush(&"s".into()).await.unwrap();
    other.close(&"s".into()).await.unwrap();
    let before = fs::read(&path).unwrap();
    assert_eq!(before.len(), torn.len(), "the file has its torn length again");

    // The same length as the stale store's reading, different content.
    let mut mine = all[n].clone();
    mine.data = EventData::other("test/more", serde_json::json!({"i": 7}));
    assert_eq!(serde_json::to_vec(&mine).unwrap().len() + 1, theirs_len);
    stale.append(&"s".into(), &mine).unwrap();
    assert_stale_flush_refused(&stale, dir.path(), &before, &all[..=n]).await;
}

/// A last line that is complete JSON but no valid event was written whole — an interrupted
/// write only leaves a proper prefix of an encoded object, which never parses — so it is no torn
/// write: the load is refused as corrupt (naming the line), like the same damage anywhere else,
/// and nothing truncates it. Dropping it would let the next append cut a line that may hold a
/// flushed event (written, say, by a newer version with a field this one rejects).
#[tokio::test]
async fn a_complete_json_last_line_that_is_no_event_is_corrupt_not_torn() {
    let dir = tempfile::tempdir().unwrap();
    let n = sample_log("s").len();
    let line = format!(r#"{{"type":"turn/start","seq":{n},"time":7,"data":{{"turn":"two"}}}}"#);
    for newline in [true, false] {
        let mut tail = line.clone().into_bytes();
        if newline {
            tail.push(b'\n');
        }
        let (events, bytes) = log_with_tail(dir.path(), &tail).await;
        let path = dir.path().join("s.jsonl");
        let err = JsonlStore::new(dir.path()).load(&"s".into()).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Corrupt { line, .. } if *line == n as u64 + 2),
            "{err}"
        );
        // A store continuing the log refuses at its flush and cuts nothing.
        let fresh = JsonlStore::new(dir.path());
        fresh.append(&"s".into(), &continued(&events, 1)[n]).unwrap();
        let err = fresh.flush(&"s".into()).await.unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert_eq!(fs::read(&path).unwrap(), bytes);
        fs::remove_file(&path).unwrap();
    }
}

/// A log deleted or replaced under a store that has it open must not swallow appends: the
/// writer's file handle still points at the old (unlinked or renamed-over) file, so a flush
/// that reported success would claim durability for events no reader will ever find. The
/// flush fails with an I/O error naming the log instead, and the writer stays poisoned.
#[tokio::test]
async fn a_log_deleted_or_replaced_under_its_writer_fails_the_flush() {
    for replace in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let events = sample_log("s");
        let all = continued(&events, 2);
        let n = events.len();
        let path = dir.path().join("s.jsonl");
        let store = JsonlStore::new(dir.path());
        write_log(&store, "s", &events).await;
        if replace {
            let other = dir.path().join("other");
            fs::write(&other, fs::read(&path).unwrap()).unwrap();
            fs::rename(&other, &path).unwrap();
        } else {
            fs::remove_file(&path).unwrap();
        }
        store.append(&"s".into(), &all[n]).unwrap();
        let err = store.flush(&"s".into()).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Io { path: p, .. } if p == &path),
            "replace={replace}: {err}"
        );
        assert!(
            store.append(&"s".into(), &all[n + 1]).is_err(),
            "its writer stays poisoned"
        );
    }
}

/// A stale store's flush of session `s` (its append at the seq another store already used) is
/// refused with the seq gap, the log file keeps its bytes `before` (the other store's flushed
/// event survives), and a fresh load reads exactly `expected`.
async fn assert_stale_flush_refused(
    stale: &JsonlStore,
    dir: &std::path::Path,
    before: &[u8],
    expected: &[SessionEvent],
) {
    let n = expected.len() - 1;
    let err = stale.flush(&"s".into()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::SeqMismatch { expected, got, .. } if expected == n as u64 + 1 && got == n as u64),
        "{err}"
    );
    assert_eq!(
        fs::read(dir.join("s.jsonl")).unwrap(),
        before,
        "the flushed event survives"
    );
    assert_eq!(
        JsonlStore::new(dir).load(&"s".into()).await.unwrap().events,
        expected
    );
}

/// A seq at the end of the range appended to a log this store has not read yet is refused as a
/// seq mismatch (at the flush, when the writer opens the log) — the append used to compute the
/// next seq as `seq + 1` and panicked on the overflow — and the log is left as it was.
#[tokio::test]
async fn an_append_with_the_last_seq_of_the_range_is_a_seq_mismatch_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let events = sample_log("s");
    write_log(&JsonlStore::new(dir.path()), "s", &events).await;
    let id = SessionId::from("s");
    let store = JsonlStore::new(dir.path());
    let mut last = events[0].clone();
    last.seq = u64::MAX;
    let err = match store.append(&id, &last) {
        Err(e) => e,
        Ok(()) => store.flush(&id).await.unwrap_err(),
    };
    assert!(
        matches!(err, StoreError::SeqMismatch { got: u64::MAX, .. }),
        "{err}"
    );
    let fresh = JsonlStore::new(dir.path());
    assert_eq!(fresh.load(&id).await.unwrap().events, events);
}
