//! The JSON-lines store over hostile directory entries: a FIFO or a device named like a log is
//! never opened for reading or writing (opening a FIFO blocks until a partner opens its other
//! end, reading `/dev/zero` never ends); it is reported as an I/O error naming what it is, and
//! left in place. Each scenario runs under a hang guard that, if the store blocks, opens the
//! FIFO's other end to release it and fails the test.
#![cfg(unix)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use agent::SessionId;
use agent_loop::store::{JsonlStore, StoreError};
use common::{header, sample_log};

/// How long a scenario may take before it counts as hung (generous: it takes milliseconds).
const HANG_GUARD: Duration = Duration::from_secs(60);

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

/// Runs `scenario` on its own thread and runtime; if it has not finished within
/// [`HANG_GUARD`], opens `fifo` read-write (which releases an open blocked on either end) and
/// fails.
fn guarded<T: Send + 'static>(fifo: PathBuf, scenario: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(scenario());
    });
    match rx.recv_timeout(HANG_GUARD) {
        Ok(value) => {
            worker.join().expect("scenario thread");
            value
        }
        Err(_) => {
            // Release an open blocked on the FIFO; the thread is not joined (a store that
            // reads a FIFO it holds open for writing blocks for good) and ends with the process.
            drop(fs::OpenOptions::new().read(true).write(true).open(&fifo));
            drop(worker);
            panic!("the store blocked on the FIFO {}", fifo.display());
        }
    }
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

fn assert_not_regular(result: Result<impl std::fmt::Debug, StoreError>, what: &str) {
    match result {
        Err(StoreError::Io { source, .. }) => assert!(
            source
                .to_string()
                .contains(&format!("not a regular file ({what})")),
            "{source}"
        ),
        other => panic!("expected an I/O error naming {what}, got {other:?}"),
    }
}

#[test]
fn list_inspect_and_load_never_open_a_fifo() {
    let dir = tempfile::tempdir().expect("dir");
    let fifo = dir.path().join("pipe.jsonl");
    mkfifo(&fifo);
    let path = dir.path().to_owned();
    let (listed, inspected, loaded) = guarded(fifo.clone(), move || {
        block_on(async move {
            let store = JsonlStore::new(&path);
            let good = SessionId::from("good");
            store.create(&header("good")).expect("create");
            for event in sample_log("good") {
                store.append(&good, &event).expect("append");
            }
            store.flush(&good).await.expect("flush");
            let pipe = SessionId::from("pipe");
            let listed: Vec<String> = store
                .list()
                .await
                .expect("list")
                .into_iter()
                .map(|s| s.id.to_string())
                .collect();
            (listed, store.inspect(&pipe).await, store.load(&pipe).await)
        })
    });
    assert_eq!(listed, ["good"]);
    assert_not_regular(inspected, "a FIFO");
    assert_not_regular(loaded, "a FIFO");
    assert!(is_fifo(&fifo), "the FIFO is left in place");
}

#[test]
fn a_log_linked_to_a_device_is_not_read() {
    let dir = tempfile::tempdir().expect("dir");
    std::os::unix::fs::symlink("/dev/null", dir.path().join("null.jsonl")).expect("symlink");
    let store = JsonlStore::new(dir.path());
    let id = SessionId::from("null");
    let (inspected, loaded, listed) = block_on(async {
        (
            store.inspect(&id).await,
            store.load(&id).await,
            store.list().await.expect("list"),
        )
    });
    assert_not_regular(inspected, "a device");
    assert_not_regular(loaded, "a device");
    assert!(listed.is_empty());
}

/// A log whose first line never ends — here a 1 TiB sparse file of zeros, as damage or a stray
/// disk image might leave — is not read into memory to list the store: listing skips it after
/// one bounded read, and inspecting it is a corrupt header.
#[test]
fn a_huge_file_without_a_header_line_is_read_only_to_the_header_bound() {
    let dir = tempfile::tempdir().expect("dir");
    let huge = fs::File::create(dir.path().join("huge.jsonl")).expect("create");
    if huge.set_len(1 << 40).is_err() {
        return; // a file system without sparse files of this size: nothing to show here
    }
    let store = JsonlStore::new(dir.path());
    let good = SessionId::from("good");
    let (listed, inspected) = block_on(async {
        store.create(&header("good")).expect("create");
        for event in sample_log("good") {
            store.append(&good, &event).expect("append");
        }
        store.flush(&good).await.expect("flush");
        let listed: Vec<String> = store
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|s| s.id.to_string())
            .collect();
        (listed, store.inspect(&SessionId::from("huge")).await)
    });
    assert_eq!(listed, ["good"]);
    match inspected {
        Err(StoreError::Corrupt { line: 1, reason, .. }) => {
            assert!(reason.starts_with("the header line is longer than"), "{reason}");
        }
        other => panic!("expected a corrupt header, got {other:?}"),
    }
}

#[test]
fn a_directory_named_like_a_log_is_not_read() {
    let dir = tempfile::tempdir().expect("dir");
    fs::create_dir(dir.path().join("sub.jsonl")).expect("mkdir");
    let store = JsonlStore::new(dir.path());
    let id = SessionId::from("sub");
    assert_not_regular(block_on(store.load(&id)), "a directory");
}

#[test]
fn appending_to_a_fifo_fails_without_blocking() {
    let dir = tempfile::tempdir().expect("dir");
    let fifo = dir.path().join("pipe.jsonl");
    mkfifo(&fifo);
    let path = dir.path().to_owned();
    let flushed = guarded(fifo.clone(), move || {
        block_on(async move {
            let store = JsonlStore::new(&path);
            let id = SessionId::from("pipe");
            let first = sample_log("pipe").remove(0);
            store.append(&id, &first).expect("append is accepted in memory");
            store.flush(&id).await
        })
    });
    assert_not_regular(flushed, "a FIFO");
    assert!(is_fifo(&fifo), "the FIFO is left in place");
}

#[test]
fn creating_over_a_fifo_fails_without_blocking_or_replacing_it() {
    let dir = tempfile::tempdir().expect("dir");
    let fifo = dir.path().join("pipe.jsonl");
    mkfifo(&fifo);
    let path = dir.path().to_owned();
    let flushed = guarded(fifo.clone(), move || {
        block_on(async move {
            let store = JsonlStore::new(&path);
            let id = SessionId::from("pipe");
            store
                .create(&header("pipe"))
                .expect("create is accepted in memory");
            store.flush(&id).await
        })
    });
    assert_not_regular(flushed, "a FIFO");
    assert!(is_fifo(&fifo), "the FIFO is left in place");
}

/// Loading (or creating over) a file named like a log whose first line is longer than any
/// header can be — here 64 MiB of sparse zeros — reads only to the header bound: loading it is
/// a corrupt header, not a read of the whole file into memory (a 1 TiB one would exhaust it),
/// and creating a session over it is refused at the flush instead of deleting the file as a
/// torn header.
#[test]
fn loading_or_creating_over_a_file_without_a_header_line_reads_only_to_the_header_bound() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("huge.jsonl");
    let len = 64 << 20;
    fs::File::create(&path)
        .expect("create")
        .set_len(len)
        .expect("sparse file");
    let store = JsonlStore::new(dir.path());
    let id = SessionId::from("huge");
    let (loaded, created) = block_on(async {
        let loaded = store.load(&id).await;
        let fresh = JsonlStore::new(dir.path());
        fresh.create(&header("huge")).expect("create");
        (loaded, fresh.flush(&id).await)
    });
    for (what, result) in [("create", created), ("load", loaded.map(drop))] {
        match result {
            Err(StoreError::Corrupt { line: 1, reason, .. }) => {
                assert!(
                    reason.starts_with("the header line is longer than"),
                    "{what}: {reason}"
                );
            }
            other => panic!("{what}: expected a corrupt header, got {other:?}"),
        }
    }
    assert_eq!(fs::metadata(&path).expect("still there").len(), len);
}
