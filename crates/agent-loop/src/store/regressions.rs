//! Regression tests for the JSONL store's handling of damaged logs, logs of a newer format,
//! creation over existing files, stale cached writers and drainers a shutting-down runtime
//! cannot run.
//!
//! No behaviour here has a spine spec ID: persistence backends are outside the spine
//! (spec §15); these pin the store's own contract (see [`JsonlStore`]).

use std::fs;
use std::path::Path;

use agent::{EventData, Session, SessionEvent, SessionHeader, SessionId, SessionMeta};

use super::{JsonlStore, StoreError};

fn header(id: &str) -> SessionHeader {
    SessionMeta {
        created_at: Some(1_000),
        ..SessionMeta::default()
    }
    .into_header(id.into(), 1_000)
    .expect("valid header")
}

/// `n` valid log-only events of session `id`.
fn events(id: &str, n: usize) -> Vec<SessionEvent> {
    let session = Session::new(header(id), None).expect("session");
    for i in 0..n {
        session
            .append_at(EventData::other("test/x", serde_json::json!({ "i": i })), None, 7)
            .expect("valid append");
    }
    session.events().iter().map(|e| (**e).clone()).collect()
}

/// Writes `header(id)` and `events` through a store of its own and returns the file's bytes.
async fn write_log(dir: &Path, id: &str, events: &[SessionEvent]) -> Vec<u8> {
    let store = JsonlStore::new(dir);
    let sid = SessionId::from(id);
    store.create(&header(id)).expect("create");
    for ev in events {
        store.append(&sid, ev).expect("append");
    }
    store.flush(&sid).await.expect("flush");
    store.close(&sid).await.expect("close");
    fs::read(dir.join(format!("{id}.jsonl"))).expect("read")
}

/// A NUL-free last line that ends in `\n` was written whole (the writer hands whole lines to the
/// OS, so an interrupted write leaves an unterminated prefix or lost blocks' zeros), so when it
/// is not well-formed JSON it is corruption, not a torn write: the load is refused naming the line, and a store continuing
/// the log refuses at its flush without cutting it. An unterminated bad last line is still a
/// torn write, dropped on load.
#[tokio::test]
async fn a_newline_terminated_bad_last_line_is_corrupt_and_never_truncated() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 3);
    let good = write_log(dir.path(), "s", &all[..2]).await;
    let path = dir.path().join("s.jsonl");
    for tail in [&b"garbage\n"[..], b"{\"type\":\"test/x\",\"seq\":2,\n", b"\n"] {
        let mut bytes = good.clone();
        bytes.extend_from_slice(tail);
        fs::write(&path, &bytes).expect("write");
        let err = JsonlStore::new(dir.path()).load(&id).await.unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { line: 4, .. }),
            "{tail:?}: {err}"
        );
        let fresh = JsonlStore::new(dir.path());
        fresh.append(&id, &all[2]).expect("accepted in memory");
        let err = fresh.flush(&id).await.unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { line: 4, .. }),
            "{tail:?}: {err}"
        );
        assert_eq!(fs::read(&path).expect("read"), bytes, "{tail:?}: nothing cut");
    }
    // Without its newline the same damage is a torn write: dropped, then cut by the next append.
    let mut bytes = good.clone();
    bytes.extend_from_slice(b"\0\0\0garbage");
    fs::write(&path, &bytes).expect("write");
    let store = JsonlStore::new(dir.path());
    let loaded = store.load(&id).await.expect("torn tail dropped");
    assert!(loaded.repaired);
    assert_eq!(loaded.events, all[..2]);
    store.append(&id, &all[2]).expect("append");
    store.flush(&id).await.expect("flush");
    assert_eq!(
        JsonlStore::new(dir.path()).load(&id).await.expect("load").events,
        all
    );
}

/// Creating a session over a file whose only line lacks its newline replaces the file only
/// when that line is not well-formed JSON (an interrupted header write). A complete JSON line
/// that is no valid header for this id — another session's header, a header with an invalid
/// field, any other JSON — was written whole: the creation fails with a typed error at the
/// flush and the file is left as it was.
#[tokio::test]
async fn creating_over_a_complete_json_line_that_is_no_header_of_ours_keeps_the_file() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let path = dir.path().join("s.jsonl");
    let foreign = serde_json::to_vec(&header("other")).expect("json");
    let invalid = br#"{"version":1,"id":"s","createdAt":-5}"#.to_vec();
    for line in [foreign, invalid, b"[1,2]".to_vec(), b"7".to_vec()] {
        fs::write(&path, &line).expect("write");
        let store = JsonlStore::new(dir.path());
        store.create(&header("s")).expect("accepted in memory");
        let err = store.flush(&id).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::Corrupt { line: 1, reason, .. } if !reason.contains("interrupted")),
            "{}: {err}",
            String::from_utf8_lossy(&line)
        );
        assert_eq!(fs::read(&path).expect("kept"), line);
    }
    // An interrupted header write (no well-formed JSON) is still replaced.
    for torn in [&b""[..], br#"{"version":1,"id":"s","crea"#] {
        fs::write(&path, torn).expect("write");
        let store = JsonlStore::new(dir.path());
        store.create(&header("s")).expect("create");
        store.flush(&id).await.expect("replaced");
        let loaded = JsonlStore::new(dir.path()).load(&id).await.expect("load");
        assert_eq!(loaded.header, header("s"));
        assert!(loaded.events.is_empty());
    }
}

/// A header that cannot be written as JSON (a `cwd` that is not UTF-8) fails `create` at once
/// with a typed error — the header's own validation refuses it — and nothing is created on
/// disk: no log, not even the store's directory.
#[cfg(unix)]
#[tokio::test]
async fn a_header_that_cannot_be_encoded_fails_create_and_creates_nothing() {
    use std::os::unix::ffi::OsStrExt as _;
    let dir = tempfile::tempdir().expect("dir");
    let root = dir.path().join("store");
    let mut h = header("s");
    h.cwd = Some(Path::new(std::ffi::OsStr::from_bytes(b"/tmp/\xff")).to_path_buf());
    let store = JsonlStore::new(&root);
    let err = store.create(&h).unwrap_err();
    assert!(matches!(&err, StoreError::Header(e) if e.field == "cwd"), "{err}");
    assert!(!root.exists(), "nothing created");
    // The id stays free: a valid header creates the session.
    store.create(&header("s")).expect("create");
    store.flush(&"s".into()).await.expect("flush");
    assert_eq!(store.load(&"s".into()).await.expect("load").header, header("s"));
}

/// A store that loaded a session, then loads it again after another store continued it, sees
/// the new length: its next append continues the log as reloaded (not its first reading).
#[tokio::test]
async fn a_reload_brings_an_idle_cached_writer_up_to_date() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 4);
    write_log(dir.path(), "s", &all[..2]).await;

    let a = JsonlStore::new(dir.path());
    assert_eq!(a.load(&id).await.expect("load").events, all[..2]);

    let b = JsonlStore::new(dir.path());
    b.load(&id).await.expect("load");
    b.append(&id, &all[2]).expect("append");
    b.flush(&id).await.expect("flush");
    b.close(&id).await.expect("close");

    assert_eq!(a.load(&id).await.expect("reload").events, all[..3]);
    a.append(&id, &all[3]).expect("continues the reloaded log");
    a.flush(&id).await.expect("flush");
    assert_eq!(
        JsonlStore::new(dir.path()).load(&id).await.expect("load").events,
        all
    );
}

/// `create` and `append` inside a runtime that has shut down (its blocking pool refuses the
/// drainer) still get their lines written, by a plain thread instead: a later flush returns
/// (here: succeeds) instead of waiting forever for a drainer that never runs.
#[test]
fn a_drainer_a_shut_down_runtime_cannot_run_still_writes() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 2);
    let dead = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let handle = dead.handle().clone();
    drop(dead);
    let store = JsonlStore::new(dir.path());
    {
        let _inside = handle.enter();
        store.create(&header("s")).expect("create");
        store.append(&id, &all[0]).expect("append");
    }
    let live = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    live.block_on(async {
        {
            // A flush started inside the dead runtime needs no drainer it cannot start either.
            let _inside = handle.enter();
            store.append(&id, &all[1]).expect("append");
        }
        store.flush(&id).await.expect("flush");
        assert_eq!(store.load(&id).await.expect("load").events, all);
    });
}

/// A log whose header declares a format version newer than this crate's is refused on load
/// (a typed corrupt-header error naming the version), and a store continuing it refuses at its
/// flush: nothing is appended to it in the older format, and its bytes are left as they were.
#[tokio::test]
async fn a_log_of_a_newer_format_version_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 2);
    let good = write_log(dir.path(), "s", &all[..1]).await;
    let path = dir.path().join("s.jsonl");
    let text = String::from_utf8(good).expect("utf-8");
    let newer = text.replacen("\"version\":0", "\"version\":9", 1);
    assert_ne!(newer, text, "the header carries its version");
    fs::write(&path, &newer).expect("write");
    let err = JsonlStore::new(dir.path()).load(&id).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { line: 1, reason, .. } if reason.contains("format version 9")),
        "{err}"
    );
    let store = JsonlStore::new(dir.path());
    store.append(&id, &all[1]).expect("accepted in memory");
    assert!(matches!(
        store.flush(&id).await,
        Err(StoreError::Corrupt { line: 1, .. })
    ));
    assert_eq!(
        fs::read_to_string(&path).expect("read"),
        newer,
        "nothing appended"
    );
}

/// A claim takes the log's lock at once: while another store writes the log, a second store
/// can load it but its claim fails with `Locked`, writes nothing and leaves no poisoned writer
/// behind — once the first store lets go, the second loads, claims and continues the log.
#[tokio::test]
async fn a_claim_of_a_log_another_store_writes_fails_at_once_and_can_be_retried() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 3);
    let first = JsonlStore::new(dir.path());
    first.create(&header("s")).expect("create");
    for ev in &all[..2] {
        first.append(&id, ev).expect("append");
    }
    first.flush(&id).await.expect("flush");
    let before = fs::read(dir.path().join("s.jsonl")).expect("read");

    let second = JsonlStore::new(dir.path());
    let loaded = second.load(&id).await.expect("a held log is still readable");
    assert_eq!(loaded.events.len(), 2);
    let err = second.claim(&id, 2).await.expect_err("the log is held");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert_eq!(
        fs::read(dir.path().join("s.jsonl")).expect("read"),
        before,
        "nothing written"
    );
    // No writer poisoned by the failed claim: loading still works.
    assert_eq!(second.load(&id).await.expect("loads again").events.len(), 2);

    first.close(&id).await.expect("close");
    second
        .claim(&id, 2)
        .await
        .expect("claimed once the first store let go");
    second.append(&id, &all[2]).expect("append");
    second.flush(&id).await.expect("flush");
    // And now the first store is the one refused.
    let err = first.claim(&id, 3).await.expect_err("held by the second store");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    second.close(&id).await.expect("close");
    let reread = JsonlStore::new(dir.path()).load(&id).await.expect("load");
    assert_eq!(reread.events, all);
}

/// A claim with a stale reading — another store continued the log after this one loaded it —
/// fails with `Changed` naming both lengths, writes nothing and keeps no lock: loading again
/// and claiming with the new length succeeds.
#[tokio::test]
async fn a_claim_after_another_writer_continued_the_log_fails_as_changed() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 3);
    write_log(dir.path(), "s", &all[..2]).await;
    let reader = JsonlStore::new(dir.path());
    assert_eq!(reader.load(&id).await.expect("load").events.len(), 2);

    let other = JsonlStore::new(dir.path());
    other.load(&id).await.expect("load");
    other.append(&id, &all[2]).expect("append");
    other.flush(&id).await.expect("flush");
    other.close(&id).await.expect("close");
    let before = fs::read(dir.path().join("s.jsonl")).expect("read");

    match reader.claim(&id, 2).await {
        Err(StoreError::Changed {
            loaded: 2, stored: 3, ..
        }) => {}
        other => panic!("expected Changed, got {other:?}"),
    }
    assert_eq!(
        fs::read(dir.path().join("s.jsonl")).expect("read"),
        before,
        "nothing written"
    );
    // The failed claim released the log: a third store can claim it at once.
    let third = JsonlStore::new(dir.path());
    third.load(&id).await.expect("load");
    third.claim(&id, 3).await.expect("not locked");
    third.close(&id).await.expect("close");
    assert_eq!(reader.load(&id).await.expect("reload").events.len(), 3);
    reader.claim(&id, 3).await.expect("claims the fresh reading");
}

/// A writer poisoned by a failed append (here: the log is locked by another store) keeps its
/// failure for `flush` and `claim` until `close`, but does not stop this store from reading the
/// log: `load` and `inspect` return what is on disk.
#[tokio::test]
async fn a_poisoned_writer_fails_flush_and_claim_but_not_reads() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 3);
    let holder = JsonlStore::new(dir.path());
    holder.create(&header("s")).expect("create");
    for ev in &all[..2] {
        holder.append(&id, ev).expect("append");
    }
    holder.flush(&id).await.expect("flush");

    let other = JsonlStore::new(dir.path());
    other.load(&id).await.expect("load");
    other.append(&id, &all[2]).expect("accepted, written later");
    let err = other.flush(&id).await.expect_err("the log is held");
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");

    let loaded = other
        .load(&id)
        .await
        .expect("a poisoned writer does not fail reads");
    assert_eq!(loaded.events, all[..2].to_vec());
    assert_eq!(other.inspect(&id).await.expect("inspect"), header("s"));
    // The lost append is still reported, by flush and by claim.
    assert!(matches!(other.flush(&id).await, Err(StoreError::Locked { .. })));
    assert!(matches!(
        other.claim(&id, 2).await,
        Err(StoreError::Locked { .. })
    ));
    // `close` clears it, returning the failure.
    assert!(matches!(other.close(&id).await, Err(StoreError::Locked { .. })));
    holder.close(&id).await.expect("close");
    other.load(&id).await.expect("load");
    other.claim(&id, 2).await.expect("claims after the holder let go");
    other.close(&id).await.expect("close");
}

/// A log whose file name is no session id this store accepts (here: longer than 200 bytes) is
/// not listed: `load` and `inspect` refuse the id, so listing it offered a session nobody could
/// open. A valid log beside it is listed as before.
#[tokio::test]
async fn a_log_named_by_an_invalid_id_is_not_listed() {
    let dir = tempfile::tempdir().expect("dir");
    write_log(dir.path(), "s", &events("s", 1)).await;
    let long = "a".repeat(201);
    let mut line = serde_json::to_vec(&header(&long)).expect("header encodes");
    line.push(b'\n');
    fs::write(dir.path().join(format!("{long}.jsonl")), line).expect("write");

    let store = JsonlStore::new(dir.path());
    let err = store
        .load(&SessionId::from(long.as_str()))
        .await
        .expect_err("not an id");
    assert!(matches!(err, StoreError::InvalidId(_)), "{err}");
    let listed: Vec<String> = store
        .list()
        .await
        .expect("list")
        .into_iter()
        .map(|s| s.id.to_string())
        .collect();
    assert_eq!(listed, ["s"]);
}

/// `flush` promises that every event appended before it is on stable storage when it returns
/// `Ok`. `close` hands the closed writer's lines to the OS but syncs nothing, and forgets the
/// writer; a flush after it used to take the session for one this store never wrote to and
/// only check that the log exists, reporting never-synced events durable (lost on a power
/// failure). It now syncs the log. Errors are as before: a missing log is `NotFound`.
#[tokio::test]
async fn a_flush_after_close_syncs_what_the_closed_writer_wrote() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 3);
    let store = JsonlStore::new(dir.path());
    store.create(&header("s")).expect("create");
    for ev in &all {
        store.append(&id, ev).expect("append");
    }
    store.close(&id).await.expect("close");
    assert_eq!(
        store.sync_count(&id),
        None,
        "close synced nothing and forgot the writer"
    );
    assert_eq!(store.unheld_syncs(), 0);
    store.flush(&id).await.expect("flush");
    assert_eq!(
        store.unheld_syncs(),
        1,
        "the flush synced what the closed writer wrote"
    );
    assert_eq!(store.load(&id).await.expect("load").events, all);
    assert!(matches!(
        store.flush(&SessionId::from("missing")).await,
        Err(StoreError::NotFound(_))
    ));
}

/// `flush` promises that every event appended before it is on stable storage when it returns
/// `Ok`. A writer this store let go of (`close`, or the runtime's `release`) hands its lines to
/// the OS but syncs nothing; a `load` afterwards made an idle writer, and a flush of a session
/// with an idle writer returned `Ok` at once — without syncing the lines the let-go writer
/// wrote (lost on a power failure). It now syncs the log and its directory entry, as a flush of
/// a session with no writer does.
#[tokio::test]
async fn a_flush_after_a_load_syncs_what_a_let_go_writer_wrote() {
    for release in [false, true] {
        let dir = tempfile::tempdir().expect("dir");
        let id = SessionId::from("s");
        let all = events("s", 3);
        let store = JsonlStore::new(dir.path());
        store.create(&header("s")).expect("create");
        for ev in &all {
            store.append(&id, ev).expect("append");
        }
        if release {
            store.release(&id);
        } else {
            store.close(&id).await.expect("close");
        }
        assert_eq!(store.load(&id).await.expect("load").events, all);
        assert_eq!(store.unheld_syncs(), 0);
        store.flush(&id).await.expect("flush");
        assert_eq!(
            store.unheld_syncs(),
            1,
            "release: {release}: the flush synced what the let-go writer wrote"
        );
    }
}

/// A writer `release`d while it still had an accepted line to write, which it then failed to
/// write (here: another store holds the log, so it is `Locked`), used to take its failure with
/// it: the next flush found no writer, synced the log and returned `Ok` — reporting durable an
/// event that is not in the log. The failure is now kept, like that of a writer poisoned before
/// its release: `flush` and `claim` report it until `close` clears it (returning it) — also
/// after a load and a release of the reading it left (a resume rolled back at its claim), which
/// used to put the idle reader's latch in the failed writer's place.
#[test]
fn a_released_writer_that_fails_afterwards_still_fails_the_next_flush() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 3);
    // One blocking thread: a task parked on it keeps the writer's drainer queued until the
    // test has released the writer.
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let holder = JsonlStore::new(dir.path());
        holder.create(&header("s")).expect("create");
        for ev in &all[..2] {
            holder.append(&id, ev).expect("append");
        }
        holder.flush(&id).await.expect("flush");

        let store = JsonlStore::new(dir.path());
        assert_eq!(store.load(&id).await.expect("load").events, all[..2]);
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let parked = tokio::task::spawn_blocking(move || gate.recv().ok());
        store.append(&id, &all[2]).expect("accepted, written later");
        store.release(&id);
        open.send(()).expect("parked");
        parked.await.expect("gate");

        let err = store.flush(&id).await.expect_err("event 2 was never written");
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        assert!(
            matches!(store.flush(&id).await, Err(StoreError::Locked { .. })),
            "still reported"
        );
        // A resume rolled back at its claim: the reading its load left is let go of again,
        // which must not take the failure with it either.
        assert_eq!(store.load(&id).await.expect("readable").events, all[..2]);
        assert!(matches!(
            store.claim(&id, 2).await,
            Err(StoreError::Locked { .. })
        ));
        store.release(&id);
        assert!(
            matches!(store.flush(&id).await, Err(StoreError::Locked { .. })),
            "still reported after the reading was let go of"
        );
        assert!(
            matches!(store.close(&id).await, Err(StoreError::Locked { .. })),
            "close returns the failure and clears it"
        );
        store.flush(&id).await.expect("cleared by close");
        holder.close(&id).await.expect("close");
        assert_eq!(store.load(&id).await.expect("load").events, all[..2]);
    });
}

/// A panic in a session's background writer (here injected into its next write) used to leave
/// the writer marked as running forever: the flush waiting for it never returned, nor did any
/// later flush, `close` or read of the session. The panic now poisons the writer like an I/O
/// failure: the flush fails with [`StoreError::Io`] naming the panic, later appends and flushes
/// fail with it too, and `close` returns and clears it, after which the session can be continued.
#[tokio::test(start_paused = true)]
async fn a_panic_in_the_writer_fails_the_flush_instead_of_hanging_it() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 2);
    let store = JsonlStore::new(dir.path());
    store.create(&header("s")).expect("create");
    store.flush(&id).await.expect("header written");
    store.writer(&id).expect("writer").panic_on_next_write();
    store.append(&id, &all[0]).expect("accepted, written later");
    // Paused time only advances once nothing runs, not even blocking tasks: a hung flush.
    let flushed = tokio::time::timeout(std::time::Duration::from_secs(60), store.flush(&id))
        .await
        .expect("the flush returns instead of hanging");
    let err = flushed.expect_err("event 0 was never written");
    assert!(
        matches!(&err, StoreError::Io { .. }) && err.to_string().contains("panicked"),
        "{err}"
    );
    assert!(matches!(store.append(&id, &all[0]), Err(StoreError::Io { .. })));
    assert!(matches!(store.flush(&id).await, Err(StoreError::Io { .. })));
    assert!(matches!(store.close(&id).await, Err(StoreError::Io { .. })));
    // Cleared: the lost event can be appended again.
    store.append(&id, &all[0]).expect("append");
    store.append(&id, &all[1]).expect("append");
    store.flush(&id).await.expect("flush");
    assert_eq!(store.load(&id).await.expect("load").events, all);
}

/// A writer released while it still had a line to write, whose drainer then panicked, used to
/// be dropped by the unwinding without recording any failure: the next flush found the released
/// writer gone without a failure, synced the log and returned `Ok` — reporting durable an event
/// that is not in the log. The panic is now recorded like an I/O failure: `flush` reports it
/// until `close` clears it.
#[test]
fn a_released_writer_whose_drainer_panics_still_fails_the_next_flush() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 1);
    // One blocking thread: a task parked on it keeps the drainer queued until the writer is
    // released.
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = JsonlStore::new(dir.path());
        store.create(&header("s")).expect("create");
        store.flush(&id).await.expect("header written");
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let parked = tokio::task::spawn_blocking(move || gate.recv().ok());
        store.writer(&id).expect("writer").panic_on_next_write();
        store.append(&id, &all[0]).expect("accepted, written later");
        store.release(&id);
        open.send(()).expect("parked");
        parked.await.expect("gate");

        let err = store.flush(&id).await.expect_err("event 0 was never written");
        assert!(err.to_string().contains("panicked"), "{err}");
        assert!(matches!(store.close(&id).await, Err(StoreError::Io { .. })));
        store.flush(&id).await.expect("cleared by close");
        assert!(store.load(&id).await.expect("load").events.is_empty());
    });
}

/// `remove` deleted the log without syncing the store directory, so after a crash the removed
/// session could come back. The directory entry is now synced before `remove` returns.
#[tokio::test]
async fn remove_syncs_the_directory_entry_it_deleted() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let store = JsonlStore::new(dir.path());
    store.create(&header("s")).expect("create");
    store.append(&id, &events("s", 1)[0]).expect("append");
    store.flush(&id).await.expect("flush");
    let before = store.store_dir_syncs();
    store.remove(&id).await.expect("remove");
    assert!(!dir.path().join("s.jsonl").exists());
    assert_eq!(
        store.store_dir_syncs(),
        before + 1,
        "the deletion was made durable"
    );
}

/// An append made while `remove` waits for the removed writer to write what it accepted makes a
/// new writer. `remove` did not record the removed writer as letting go of the log, so the new
/// writer opened the log while the removed one (here held alive, as a drainer finishing a sync
/// would) still held its lock, and failed with `Locked` — "another store is writing it" — though
/// only this store ever wrote it. The new writer now waits for the removed one to let go: it
/// continues the log, which the removal then deletes, and its flush says so.
#[test]
fn an_append_racing_remove_is_not_refused_as_locked() {
    let dir = tempfile::tempdir().expect("dir");
    let id = SessionId::from("s");
    let all = events("s", 2);
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let store = std::sync::Arc::new(JsonlStore::new(dir.path()));
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let parked = tokio::task::spawn_blocking(move || gate.recv().ok());
        store.create(&header("s")).expect("create");
        store.append(&id, &all[0]).expect("accepted, written later");
        let removed_writer = store.writer(&id).expect("writer");
        let removing = tokio::spawn({
            let (store, id) = (store.clone(), id.clone());
            async move { store.remove(&id).await }
        });
        // `remove` has taken the writer and waits for it to write event 0.
        while store.writer(&id).is_some() {
            tokio::task::yield_now().await;
        }
        store.append(&id, &all[1]).expect("accepted by a new writer");
        open.send(()).expect("parked");
        parked.await.expect("gate");
        removing.await.expect("joined").expect("removed");

        let err = store.flush(&id).await.expect_err("the log was removed");
        assert!(
            matches!(&err, StoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
            "{err}"
        );
        assert!(matches!(store.load(&id).await, Err(StoreError::NotFound(_))));
        drop(removed_writer);
        assert!(store.close(&id).await.is_err(), "close returns the failure");
        store.create(&header("s")).expect("create again");
        store.flush(&id).await.expect("a new log");
    });
}
