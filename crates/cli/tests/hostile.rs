//! The `subagent` program under hostile input: store directories holding entries that are not
//! logs (a FIFO, a device link, a directory, empty and non-JSON files, symbolic links, a file
//! name that is not UTF-8), bad arguments, models that misbehave (HTTP errors, malformed
//! events, a JSON answer to a streaming request, malformed delegation arguments, endless
//! delegation, endless tool calls stopped at the step limit, a stalled stream interrupted with
//! Ctrl-C), `subagent acp` stopped by a signal or by its client leaving mid-prompt, and
//! concurrent programs on one store. Every run is bounded by a hang guard; every failure is one `subagent: …` line with
//! exit code 2; stores that are only read stay byte-for-byte unchanged; stores that were written
//! pass `subagent check`.
#![cfg(unix)]

mod support;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};

/// How long one program run may take before it counts as hung (runs take well under a second).
const HANG_GUARD: Duration = Duration::from_secs(120);

fn subagent() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_subagent"));
    cmd.env_remove("SUBAGENT_BASE_URL")
        .env_remove("SUBAGENT_API_KEY")
        .env_remove("SUBAGENT_MODEL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Starts `cmd`; `during(pid)` runs while it is alive; then waits for it under the hang guard
/// (killing it and failing if it does not end).
fn run_with(mut cmd: Command, during: impl FnOnce(u32)) -> Output {
    let child = cmd.spawn().expect("the binary starts");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    during(pid);
    match rx.recv_timeout(HANG_GUARD) {
        Ok(out) => out.expect("wait for the binary"),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            panic!("`subagent` (pid {pid}) hung: killed after {HANG_GUARD:?}");
        }
    }
}

fn run(cmd: Command) -> Output {
    run_with(cmd, |_| {})
}

/// `subagent agents --store <store>`, run to the end.
fn agents(store: &Path) -> Output {
    let mut cmd = subagent();
    cmd.arg("agents").arg("--store").arg(store);
    run(cmd)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code 2, and the last stderr line is `subagent: …` containing `needle`; no panic.
fn assert_fails(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stdout:\n{}\nstderr:\n{err}", stdout(o));
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("subagent: "), "{err}");
    assert!(
        last.contains(needle),
        "expected {needle:?} in the last line of:\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// `subagent check <dir>` passes.
fn assert_checks_clean(dir: &Path) {
    let mut cmd = subagent();
    cmd.arg("check").arg(dir);
    let out = run(cmd);
    assert_eq!(
        out.status.code(),
        Some(0),
        "check:\n{}{}",
        stdout(&out),
        stderr(&out)
    );
}

/// One directory entry as it is on disk (links not followed).
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    File { mode: u32, bytes: Vec<u8> },
    Dir { mode: u32 },
    Link(PathBuf),
    Other { kind: &'static str, mode: u32 },
}

/// Every entry under `dir` with its content, so any change to the store is visible. Regular
/// files are read only when nothing else could be: FIFOs and devices are recorded by type.
fn snapshot(dir: &Path) -> BTreeMap<Vec<u8>, Entry> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, Entry>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let kind = meta.file_type();
            let mode = meta.mode();
            let name = path
                .strip_prefix(root)
                .expect("under root")
                .as_os_str()
                .as_bytes()
                .to_vec();
            let value = if kind.is_symlink() {
                Entry::Link(std::fs::read_link(&path).expect("readlink"))
            } else if kind.is_dir() {
                walk(root, &path, out);
                Entry::Dir { mode }
            } else if kind.is_file() {
                Entry::File {
                    mode,
                    bytes: std::fs::read(&path).unwrap_or_else(|e| format!("unreadable: {e}").into_bytes()),
                }
            } else {
                let kind = if kind.is_fifo() { "fifo" } else { "special" };
                Entry::Other { kind, mode }
            };
            out.insert(name, value);
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Runs `subagent demo --store <store>` and returns the coordinator's id.
fn demo_into(store: &Path) -> String {
    let mut cmd = subagent();
    cmd.arg("demo").arg("--store").arg(store);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    text.lines()
        .find_map(|l| l.split("(coordinator ").nth(1))
        .and_then(|rest| rest.split(',').next())
        .expect("the demo names its coordinator")
        .to_owned()
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(status.success());
}

/// A demo store plus one entry of every hostile kind.
fn hostile_store() -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    let coordinator = demo_into(&store);
    std::fs::write(store.join("empty.jsonl"), b"").expect("write");
    std::fs::write(store.join("notlog.jsonl"), b"this is not a log\n").expect("write");
    std::fs::write(store.join("readme.txt"), b"not a log either\n").expect("write");
    std::fs::create_dir(store.join("dir.jsonl")).expect("mkdir");
    std::os::unix::fs::symlink(format!("{coordinator}.jsonl"), store.join("link.jsonl")).expect("symlink");
    std::os::unix::fs::symlink("nowhere.jsonl", store.join("dangling.jsonl")).expect("symlink");
    std::os::unix::fs::symlink("/dev/null", store.join("null.jsonl")).expect("symlink");
    mkfifo(&store.join("fifo.jsonl"));
    (tmp, coordinator)
}

#[test]
fn agents_log_and_check_survive_a_hostile_store_and_change_nothing() {
    let (tmp, coordinator) = hostile_store();
    let store = tmp.path().join("store");
    let before = snapshot(&store);

    let out = agents(&store);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listing = stdout(&out);
    assert!(
        listing.starts_with(&format!("{coordinator}  (top-level)")),
        "{listing}"
    );
    assert_eq!(listing.lines().count(), 5, "{listing}");
    let err = stderr(&out);
    for (id, why) in [
        ("dangling", "no stored session"),
        ("dir", "not a regular file (a directory)"),
        ("empty", "empty file"),
        ("fifo", "not a regular file (a FIFO)"),
        ("link", "the file is named for `link`"),
        ("notlog", "invalid header"),
        ("null", "not a regular file (a device)"),
    ] {
        assert!(
            err.lines().any(
                |l| l.starts_with(&format!("subagent: skipping unreadable session `{id}`: "))
                    && l.contains(why)
            ),
            "`{id}` ({why}) not named in:\n{err}"
        );
    }

    for (id, why) in [
        ("fifo", "not a regular file (a FIFO)"),
        ("null", "not a regular file (a device)"),
        ("dir", "not a regular file (a directory)"),
        ("empty", "empty file"),
        ("dangling", "no session `dangling`"),
    ] {
        let mut cmd = subagent();
        cmd.args(["log", id, "--store"]).arg(&store);
        let out = run(cmd);
        assert_fails(&out, why);
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    }
    let mut cmd = subagent();
    cmd.args(["log", &coordinator, "--store"]).arg(&store);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // `check` replays the logs it can read and reports the damaged ones as violations.
    let mut cmd = subagent();
    cmd.arg("check").arg(&store);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    let report = stdout(&out);
    assert!(report.contains("session \"empty\""), "{report}");
    assert!(report.contains("session \"notlog\""), "{report}");
    // Entries named like logs that are not logs are named too, never opened or skipped.
    for name in ["fifo", "null", "dangling"] {
        assert!(
            report.contains(&format!("session \"{name}\"")),
            "{name}: {report}"
        );
    }

    assert!(before == snapshot(&store), "the store changed");
}

#[test]
fn agents_names_a_log_whose_file_name_is_not_utf8() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    demo_into(&store);
    let name = std::ffi::OsStr::from_bytes(b"bad-\xff.jsonl");
    std::fs::write(store.join(name), b"{}\n").expect("write");
    let before = snapshot(&store);
    let out = agents(&store);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.lines().any(
            |l| l.starts_with("subagent: skipping unreadable session `bad-\u{fffd}`: ")
                && l.contains("not valid UTF-8")
        ),
        "{err}"
    );
    assert!(before == snapshot(&store), "the store changed");
}

#[test]
fn log_never_reads_outside_the_store() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    let coordinator = demo_into(&store);
    // Valid logs beside and below the store, reachable only through a path in the id.
    let log = std::fs::read(store.join(format!("{coordinator}.jsonl"))).expect("read");
    std::fs::write(tmp.path().join(format!("{coordinator}.jsonl")), &log).expect("write");
    std::fs::create_dir(store.join("sub")).expect("mkdir");
    std::fs::write(store.join("sub").join(format!("{coordinator}.jsonl")), &log).expect("write");
    let before = snapshot(tmp.path());
    for id in [
        format!("../{coordinator}"),
        format!("sub/{coordinator}"),
        format!("./{coordinator}"),
        format!("..\\{coordinator}"),
        "..".to_owned(),
        ".".to_owned(),
        String::new(),
        "x".repeat(300),
    ] {
        let mut cmd = subagent();
        cmd.arg("log").arg(&id).arg("--store").arg(&store);
        let out = run(cmd);
        assert_fails(&out, "no session");
        assert!(out.stdout.is_empty(), "{id}: {}", stdout(&out));
    }
    assert!(before == snapshot(tmp.path()), "something changed");
}

#[test]
fn a_store_that_is_missing_or_a_file_is_one_line_error_for_every_reader() {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("file");
    std::fs::write(&file, b"x").expect("write");
    let missing = tmp.path().join("missing");
    let before = snapshot(tmp.path());
    for (store, why) in [(&file, "not a directory"), (&missing, "no such directory")] {
        for args in [vec!["agents", "--store"], vec!["log", "x", "--store"]] {
            let mut cmd = subagent();
            cmd.args(&args).arg(store);
            let out = run(cmd);
            assert_fails(&out, why);
            assert_eq!(stderr(&out).lines().count(), 1);
        }
        let mut cmd = subagent();
        cmd.arg("check").arg(store);
        let out = run(cmd);
        assert_fails(&out, "cannot read store");
    }
    assert!(before == snapshot(tmp.path()), "something changed");
}

#[test]
fn bad_arguments_exit_2_and_write_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    let store_arg = store.to_str().expect("utf-8 path");
    let base = "http://127.0.0.1:9/v1";
    let run_args = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["run", "--model", "m", "--base-url", base, "--store", store_arg]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        v.extend(extra.iter().map(|s| (*s).to_owned()));
        v
    };
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![], "Usage"),
        (vec!["bogus".into()], "unrecognized subcommand"),
        (vec!["agents".into(), "--bogus".into()], "unexpected argument"),
        (vec!["agents".into(), "--store".into()], "a value is required"),
        (vec!["log".into()], "required arguments"),
        (
            vec!["check".into(), "a".into(), "b".into()],
            "unexpected argument",
        ),
        (
            run_args(&["--max-tokens", "-1", "task"]),
            "unexpected argument '-1'",
        ),
        (
            run_args(&["--max-tokens", "99999999999999999999999", "task"]),
            "invalid value",
        ),
        (run_args(&["--max-tokens", "ten", "task"]), "invalid value"),
        (
            run_args(&["--max-tokens", "0", "task"]),
            "invalid value '0' for '--max-tokens <N>': the output-token cap must be at least 1",
        ),
        (
            run_args(&["--max-tokens", "9007199254740992", "task"]),
            "invalid value '9007199254740992' for '--max-tokens <N>'",
        ),
        (
            run_args(&["--max-steps", "0", "task"]),
            "invalid value '0' for '--max-steps <N>': the step limit must be at least 1",
        ),
        (
            run_args(&["--max-steps", "-3", "task"]),
            "unexpected argument '-3'",
        ),
        (run_args(&["--max-steps", "many", "task"]), "invalid value"),
        (run_args(&[]), "required arguments"),
        (run_args(&[""]), "subagent: the task is empty"),
        (run_args(&[" \n\t "]), "subagent: the task is empty"),
    ];
    for (args, needle) in cases {
        let mut cmd = subagent();
        cmd.current_dir(tmp.path()).args(&args);
        let out = run(cmd);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: expected {needle:?} in:\n{err}");
        assert!(!store.exists(), "{args:?} created the store");
        assert_eq!(
            std::fs::read_dir(tmp.path()).expect("read_dir").count(),
            0,
            "{args:?} wrote into the working directory"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A scripted OpenAI-compatible server on 127.0.0.1.

/// What the server answers to one request.
enum Reply {
    /// `200 text/event-stream` with these events (each a JSON chunk or raw `data:` payload).
    Sse(String),
    /// A status, content type and body.
    Raw(u16, &'static str, Vec<(&'static str, &'static str)>, String),
    /// Headers and one text chunk, then nothing until the test ends.
    Stall,
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let event = json!({
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": 1_718_035_200,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {event}\n\n")
}

/// A streamed text answer.
fn text_sse(text: &str) -> Reply {
    Reply::Sse(format!(
        "{}{}{}data: [DONE]\n\n",
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(json!({"content": text}), None),
        chunk(json!({}), Some("stop")),
    ))
}

/// A streamed call of tool `name` with raw `arguments`.
fn tool_sse(name: &str, arguments: &str) -> Reply {
    Reply::Sse(format!(
        "{}{}{}data: [DONE]\n\n",
        chunk(json!({"role": "assistant", "content": ""}), None),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": format!("call_{}", uuid_like()), "type": "function",
                "function": {"name": name, "arguments": arguments}}]}),
            None
        ),
        chunk(json!({}), Some("tool_calls")),
    ))
}

fn uuid_like() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

type Script = dyn Fn(&Value) -> Reply + Send + Sync;

/// Serves `script` on 127.0.0.1 (one thread per connection) until the test ends; returns the
/// base URL and a channel receiving every request body.
fn serve(script: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> (String, mpsc::Receiver<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let script: Arc<Script> = Arc::new(script);
    let (tx, rx) = mpsc::channel();
    let tx = Arc::new(Mutex::new(tx));
    // Stalled connections are kept open until the test process ends.
    let stalled: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let (script, tx, stalled) = (script.clone(), tx.clone(), stalled.clone());
            thread::spawn(move || {
                let Some((_, body)) = support::sse::read_request(&mut stream) else {
                    return;
                };
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let reply = script(&body);
                let _ = tx.lock().send(body);
                let (status, kind, extra, payload) = match reply {
                    Reply::Sse(events) => (200, "text/event-stream", vec![], events),
                    Reply::Raw(status, kind, extra, body) => (status, kind, extra, body),
                    Reply::Stall => {
                        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
                        let _ = stream.write_all(head.as_bytes());
                        let _ = stream.write_all(
                            chunk(json!({"role": "assistant", "content": "thinking"}), None).as_bytes(),
                        );
                        let _ = stream.flush();
                        stalled.lock().push(stream);
                        return;
                    }
                };
                let mut head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n",
                    payload.len()
                );
                for (k, v) in extra {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str("\r\n");
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(payload.as_bytes());
                let _ = stream.flush();
            });
        }
    });
    (base, rx)
}

/// `subagent run <task>` against `base` in a fresh workspace; returns the store directory.
fn run_command(base: &str, workspace: &Path, task: &str) -> (Command, PathBuf) {
    let store = workspace.join(".subagent");
    let mut cmd = subagent();
    cmd.current_dir(workspace)
        .args(["run", "--model", "m", "--base-url", base, "--store"])
        .arg(&store)
        .arg(task);
    (cmd, store)
}

/// The user-visible texts of a request's messages (for routing by content).
fn is_child(body: &Value) -> bool {
    body["messages"].as_array().is_some_and(|m| {
        m.iter()
            .any(|m| m["role"] == "user" && m["content"].as_str().is_some_and(|c| c.contains("CHILD")))
    })
}

fn has_tool_result(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"))
}

#[test]
fn every_kind_of_model_failure_ends_the_run_with_one_error_line_and_a_clean_store() {
    type Serve = Box<dyn Fn(&Value) -> Reply + Send + Sync>;
    let cases: Vec<(&str, Serve, &str)> = vec![
        (
            "500",
            Box::new(|_: &Value| {
                Reply::Raw(
                    500,
                    "application/json",
                    vec![],
                    r#"{"error":{"message":"boom"}}"#.into(),
                )
            }),
            "failed: boom (SERVER_ERROR)",
        ),
        (
            "429",
            Box::new(|_: &Value| {
                Reply::Raw(
                    429,
                    "application/json",
                    vec![("retry-after", "1")],
                    r#"{"error":{"message":"slow down"}}"#.into(),
                )
            }),
            "failed: slow down (RATE_LIMITED)",
        ),
        (
            "malformed event",
            Box::new(|_: &Value| Reply::Sse("data: {not json\n\ndata: [DONE]\n\n".into())),
            "an event that is not JSON",
        ),
        (
            "empty stream",
            Box::new(|_: &Value| Reply::Sse(String::new())),
            "(STREAM_INTERRUPTED)",
        ),
        (
            "html",
            Box::new(|_: &Value| Reply::Raw(200, "text/html", vec![], "<html>hi</html>".into())),
            "an HTML page instead of an event stream",
        ),
    ];
    for (name, script, why) in cases {
        let (base, requests) = serve(script);
        let workspace = tempfile::tempdir().expect("workspace");
        let (cmd, store) = run_command(&base, workspace.path(), "say hello");
        let out = run(cmd);
        assert_fails(&out, "subagent: the coordinator's turn failed: ");
        assert_fails(&out, why);
        assert!(
            requests.try_iter().count() >= 1,
            "{name}: no request reached the server"
        );
        assert_checks_clean(&store);
    }
}

#[test]
fn a_json_answer_to_a_streaming_request_is_one_clear_error_line() {
    let (base, _requests) = serve(|_| {
        let body = json!({
            "id": "chatcmpl-json", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "plain json"}, "finish_reason": "stop"}],
        });
        Reply::Raw(200, "application/json", vec![], body.to_string())
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "say hello");
    let out = run(cmd);
    // The adapter does not read a non-streamed answer; it says so in one line (no hang, no
    // panic) and the logs replay clean.
    assert_fails(
        &out,
        "instead of an event stream (does the server support `stream: true`?)",
    );
    assert_checks_clean(&store);
}

#[test]
fn malformed_delegation_arguments_become_tool_errors_and_the_run_completes() {
    let (base, requests) = serve(|body| {
        if has_tool_result(body) {
            return text_sse("done after errors");
        }
        // Both delegation tools at once, with arguments that are not what they take.
        Reply::Sse(format!(
            "{}{}{}{}data: [DONE]\n\n",
            chunk(json!({"role": "assistant", "content": ""}), None),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                    "function": {"name": "subagent", "arguments": "{not json"}}]}),
                None
            ),
            chunk(
                json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                    "function": {"name": "fork", "arguments": "{\"prompt\": 42, \"run_in_background\": \"yes\"}"}}]}),
                None
            ),
            chunk(json!({}), Some("tool_calls")),
        ))
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "delegate badly");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "done after errors");
    let bodies: Vec<Value> = requests.try_iter().collect();
    assert_eq!(bodies.len(), 2, "no child may have been started");
    let results: Vec<&Value> = bodies[1]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    // Only the coordinator's log exists.
    assert_eq!(std::fs::read_dir(&store).expect("store").count(), 1);
    assert_checks_clean(&store);
}

#[test]
fn a_huge_answer_is_printed_whole_and_stored() {
    let huge = "x".repeat(4 << 20);
    let answer = huge.clone();
    let (base, _requests) = serve(move |_| text_sse(&answer));
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "say a lot");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim_end(), huge);
    assert_checks_clean(&store);
    assert_eq!(agents(&store).status.code(), Some(0));
}

/// Sends SIGINT to `pid` once `requests` has delivered `n` request bodies.
fn interrupt_after(requests: &mpsc::Receiver<Value>, n: usize, pid: u32) -> Vec<Value> {
    let mut seen = Vec::new();
    while seen.len() < n {
        seen.push(
            requests
                .recv_timeout(HANG_GUARD)
                .expect("the run's requests reach the server"),
        );
    }
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    seen
}

#[test]
fn ctrl_c_during_a_stalled_stream_ends_the_run_with_balanced_logs() {
    let (base, requests) = serve(|_| Reply::Stall);
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "wait forever");
    let out = run_with(cmd, |pid| {
        interrupt_after(&requests, 1, pid);
    });
    let err = stderr(&out);
    assert!(
        err.contains("subagent: interrupted; cancelling the coordinator"),
        "{err}"
    );
    assert!(err.contains("press Ctrl-C again to exit at once"), "{err}");
    // One Ctrl-C is the graceful stop: exit 2 with the aborted turn, not 130.
    assert_fails(&out, "was aborted");
    assert!(!err.contains("interrupted again"), "{err}");
    assert_checks_clean(&store);
}

#[test]
fn endless_delegation_stops_at_the_depth_cap_and_ctrl_c_ends_it_cleanly() {
    // Every agent, at every step, delegates again (and ignores refusals).
    let (base, requests) = serve(|body| {
        let _ = is_child(body);
        tool_sse(
            "subagent",
            r#"{"description":"again","prompt":"CHILD: delegate again"}"#,
        )
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "delegate forever");
    let out = run_with(cmd, |pid| {
        // Far more calls than the depth cap allows agents: some were refused.
        interrupt_after(&requests, 12, pid);
    });
    assert_fails(&out, "was aborted");
    assert_checks_clean(&store);
    let out = agents(&store);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listing = stdout(&out);
    let max_depth = listing
        .lines()
        .filter_map(|l| {
            l.split("depth ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max();
    assert_eq!(max_depth, Some(3), "{listing}");
}

/// The `turn/end` reasons recorded in every log of `store`, keyed by the log's file name.
fn turn_ends(store: &Path) -> BTreeMap<String, Vec<Value>> {
    let mut ends = BTreeMap::new();
    for entry in std::fs::read_dir(store).expect("store") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("log");
        let reasons = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["type"] == "turn/end")
            .map(|e| e["data"]["reason"].clone())
            .collect();
        ends.insert(
            path.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            reasons,
        );
    }
    ends
}

#[test]
fn a_model_that_calls_tools_forever_is_stopped_at_the_step_limit() {
    // Every step calls a tool again: without a limit the turn never ends.
    let (base, requests) = serve(|_| tool_sse("list_dir", "{}"));
    let workspace = tempfile::tempdir().expect("workspace");
    let (mut cmd, store) = run_command(&base, workspace.path(), "look around forever");
    cmd.args(["--max-steps", "3"]);
    let out = run(cmd);
    assert_fails(
        &out,
        "subagent: the coordinator's turn failed: step limit reached: the turn took 3 model steps \
         without finishing (the limit is 3 steps per turn; raise it with --max-steps) (STEP_LIMIT)",
    );
    assert_eq!(requests.try_iter().count(), 3, "one model call per allowed step");
    let ends = turn_ends(&store);
    assert_eq!(ends.len(), 1, "{ends:?}");
    let reasons = ends.values().next().expect("the coordinator's log");
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert_eq!(reasons[0]["kind"], "error", "{reasons:?}");
    assert_eq!(reasons[0]["error"]["code"], "STEP_LIMIT", "{reasons:?}");
    assert!(
        reasons[0].to_string().contains("step limit reached"),
        "{reasons:?}"
    );
    assert_checks_clean(&store);
}

#[test]
fn the_default_step_limit_of_run_is_50() {
    let (base, requests) = serve(|_| tool_sse("list_dir", "{}"));
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "look around forever");
    let out = run(cmd);
    assert_fails(&out, "the turn took 50 model steps without finishing");
    assert_eq!(requests.try_iter().count(), 50);
    assert_checks_clean(&store);
}

#[test]
fn a_child_stopped_at_the_step_limit_is_a_failed_delegation_for_its_parent() {
    // The coordinator delegates once and answers from the result; the child calls a tool on
    // every step.
    let (base, requests) = serve(|body| {
        if is_child(body) {
            tool_sse("list_dir", "{}")
        } else if has_tool_result(body) {
            text_sse("the child could not finish")
        } else {
            tool_sse(
                "subagent",
                r#"{"description":"loop","prompt":"CHILD: list forever"}"#,
            )
        }
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let (mut cmd, store) = run_command(&base, workspace.path(), "delegate a loop");
    cmd.args(["--max-steps", "4"]);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "the child could not finish");
    let bodies: Vec<Value> = requests.try_iter().collect();
    let (child, parent): (Vec<&Value>, Vec<&Value>) = bodies.iter().partition(|b| is_child(b));
    assert_eq!(child.len(), 4, "the child made one call per allowed step");
    assert_eq!(parent.len(), 2, "the coordinator delegated, then answered");
    // The coordinator's second call carries the delegation's failure as its tool result.
    let result = parent[1]["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .expect("the delegation result")
        .to_owned();
    assert!(result.contains("subagent run failed"), "{result}");
    // The child's log ends its turn with the step-limit error; the coordinator's completed.
    let ends = turn_ends(&store);
    assert_eq!(ends.len(), 2, "{ends:?}");
    let (mut errors, mut completed) = (0, 0);
    for reasons in ends.values() {
        assert_eq!(reasons.len(), 1, "{ends:?}");
        match reasons[0]["kind"].as_str() {
            Some("error") => {
                errors += 1;
                assert!(
                    reasons[0].to_string().contains("the limit is 4 steps per turn"),
                    "{ends:?}"
                );
            }
            Some("completed") => completed += 1,
            _ => panic!("unexpected turn end: {ends:?}"),
        }
    }
    assert_eq!((errors, completed), (1, 1), "{ends:?}");
    let listing = stdout(&agents(&store));
    assert!(
        listing
            .lines()
            .any(|l| l.contains("spawn \"loop\"") && l.ends_with("last error")),
        "{listing}"
    );
    assert_checks_clean(&store);
}

#[test]
fn a_run_within_the_step_limit_is_unaffected() {
    // One tool call, then the answer: exactly two steps, the limit.
    let (base, requests) = serve(|body| {
        if has_tool_result(body) {
            text_sse("listed")
        } else {
            tool_sse("list_dir", "{}")
        }
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let (mut cmd, store) = run_command(&base, workspace.path(), "list once");
    cmd.args(["--max-steps", "2"]);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "listed");
    assert_eq!(requests.try_iter().count(), 2);
    let ends = turn_ends(&store);
    let reasons: Vec<&Value> = ends.values().flatten().collect();
    assert_eq!(reasons.len(), 1, "{ends:?}");
    assert_eq!(reasons[0]["kind"], "completed", "{ends:?}");
    assert_checks_clean(&store);
}

#[test]
fn two_demos_share_a_store_while_agents_reads_it() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    let spawn_demo = || {
        let mut cmd = subagent();
        cmd.arg("demo").arg("--store").arg(&store);
        cmd.spawn().expect("demo starts")
    };
    let (a, b) = (spawn_demo(), spawn_demo());
    // Read the store while both write to it (until both are done): never a crash.
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let outs = (a.wait_with_output(), b.wait_with_output());
        let _ = tx.send(());
        outs
    });
    let mut reads = 0;
    loop {
        let out = agents(&store);
        // Before the first session is created the store may not exist yet.
        assert!(matches!(out.status.code(), Some(0 | 2)), "{}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
        reads += 1;
        if rx.recv_timeout(Duration::ZERO).is_ok() || reads > 200 {
            break;
        }
    }
    rx.recv_timeout(HANG_GUARD).ok();
    let (a, b) = waiter.join().expect("waiter");
    for out in [a.expect("demo a"), b.expect("demo b")] {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_checks_clean(&store);
    let out = agents(&store);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listing = stdout(&out);
    assert_eq!(
        listing.lines().filter(|l| l.contains("(top-level)")).count(),
        2,
        "{listing}"
    );
    assert_eq!(listing.lines().count(), 10, "{listing}");
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
}

#[test]
fn ctrl_c_ends_a_run_whose_background_job_stalls() {
    // The coordinator starts a background job, then both its next model call and the job's
    // stall. A user cancel does not reach background jobs, so Ctrl-C must not wait for the job
    // to settle: disposing of the coordinator ends it.
    let (base, requests) = serve(|body| {
        if is_child(body) || has_tool_result(body) {
            return Reply::Stall;
        }
        tool_sse(
            "subagent",
            r#"{"description":"slow job","prompt":"CHILD: take forever","run_in_background":true}"#,
        )
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "start a job");
    let out = run_with(cmd, |pid| {
        // The coordinator's first and second calls and the job's call.
        interrupt_after(&requests, 3, pid);
    });
    assert!(
        stderr(&out).contains("subagent: interrupted; cancelling the coordinator"),
        "{}",
        stderr(&out)
    );
    assert_fails(&out, "was aborted");
    assert_checks_clean(&store);
    let out = agents(&store);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listing = stdout(&out);
    assert_eq!(listing.lines().count(), 2, "{listing}");
    assert!(listing.lines().all(|l| l.ends_with("last aborted")), "{listing}");
    assert!(
        listing
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("spawn \"slow job\"  background job")),
        "{listing}"
    );
}

// ----- Text that would act on a terminal -----------------------------------------------------

/// Characters a terminal acts on (escape, carriage return, bell, the one-character CSI, a bidi
/// override): none may reach the program's output raw.
const RAW: [char; 5] = ['\x1b', '\r', '\x07', '\u{9b}', '\u{202e}'];

/// A label as hostile as a model can make one: a window-title write, a line forged after a
/// carriage return and a newline, and a bidi override.
const EVIL_LABEL: &str = "evil\x1b]0;pwned\x07\r\nforged line\u{202e}gnp.exe";
/// [`EVIL_LABEL`] as it must be shown: on one line, every such character visible.
const EVIL_LABEL_SHOWN: &str = "evil\\u{1b}]0;pwned\\u{7}\\r\\nforged line\\u{202e}gnp.exe";

fn assert_inert(what: &str, text: &str) {
    for c in RAW {
        assert!(!text.contains(c), "{what}: raw {c:?} in:\n{text:?}");
    }
}

/// Writes `<id>.jsonl` from a header and events (JSON values, one per line).
fn write_log(store: &Path, file_stem: &str, header: Value, events: &[Value]) {
    let mut text = format!("{header}\n");
    for (seq, event) in events.iter().enumerate() {
        let mut event = event.clone();
        event["seq"] = json!(seq);
        event["time"] = json!(1);
        text.push_str(&format!("{event}\n"));
    }
    std::fs::write(store.join(format!("{file_stem}.jsonl")), text).expect("write log");
}

/// A store whose labels, provider, messages, reasons and one file name carry escape
/// sequences, control characters and a bidi override.
fn store_with_escape_sequences(store: &Path) {
    std::fs::create_dir_all(store).expect("mkdir");
    let call_args = json!({"description": EVIL_LABEL, "prompt": "CHILD"}).to_string();
    write_log(
        store,
        "root",
        json!({"version": 0, "id": "root", "createdAt": 1}),
        &[
            json!({"type": "turn/start", "data": {"turn": 1}}),
            json!({"type": "user/message", "data": {"id": "m1", "role": "user",
                "content": [{"type": "text", "text": "hello\x1b[2J\nsecond line\u{202e}"}],
                "source": {"kind": "user"}}, "surfaceOp": "append"}),
            json!({"type": "tool/call", "data": {"turn": 1, "step": 1, "callId": "call\r1",
                "name": "subagent", "arguments": call_args}}),
            json!({"type": "assistant/message", "data": {"turn": 1, "step": 1, "message": {
                "id": "m2", "role": "assistant",
                "content": [{"type": "text", "text": "answer\x1b]52;c;Y2xpcA==\x07\rforged\u{9b}2J"}],
                "source": {"kind": "model", "provider": "p", "model": "m"}}},
                "surfaceOp": "append"}),
            json!({"type": "turn/end", "data": {"turn": 1, "reason": {"kind": "error",
                "error": {"message": "boom\x1b[2J\rforged", "code": "UNKNOWN"}}}}),
        ],
    );
    write_log(
        store,
        "child-1",
        json!({"version": 0, "id": "child-1", "createdAt": 2, "parentSession": "root",
            "origin": "subagent", "delegationDepth": 1}),
        &[
            json!({"type": "turn/start", "data": {"turn": 1}}),
            json!({"type": "subagent/descriptor", "data": {"version": 2, "mode": "one-shot",
                "provider": "spawn\x1b[31m", "label": EVIL_LABEL}}),
            json!({"type": "turn/end", "data": {"turn": 1, "reason": {"kind": "completed"}}}),
        ],
    );
    // A log named with an escape sequence: `agents` names it unreadable, `check` a violation.
    std::fs::write(store.join("bad\x1b]0;t\x07.jsonl"), b"").expect("write");
}

#[test]
fn agents_log_and_check_show_escape_sequences_in_a_store_as_visible_escapes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let store = tmp.path().join("store");
    store_with_escape_sequences(&store);
    let before = snapshot(&store);

    let out = agents(&store);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (listing, err) = (stdout(&out), stderr(&out));
    assert_inert("agents stdout", &listing);
    assert_inert("agents stderr", &err);
    // The newline in the label did not break the tree: one line per session.
    assert_eq!(listing.lines().count(), 2, "{listing}\n{err}");
    let child = listing.lines().nth(1).expect("the child's line");
    assert!(
        child.starts_with("└─ child-1  spawn\\u{1b}[31m \"")
            && child.contains(&format!("\"{EVIL_LABEL_SHOWN}\"")),
        "{child}"
    );
    assert!(
        err.contains("skipping unreadable session `bad\\u{1b}]0;t\\u{7}`"),
        "{err}"
    );

    let mut cmd = subagent();
    cmd.args(["log", "child-1", "--store"]).arg(&store);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_inert("log child-1", &text);
    assert!(
        text.contains(&format!(
            "\n  provider  spawn\\u{{1b}}[31m \"{EVIL_LABEL_SHOWN}\"\n"
        )),
        "{text}"
    );

    let mut cmd = subagent();
    cmd.args(["log", "root", "--store"]).arg(&store);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_inert("log root", &text);
    // A message body keeps its line break (its second line indented under the event) …
    assert!(
        text.contains("[user] hello\\u{1b}[2J\n         second line\\u{202e}\n"),
        "{text}"
    );
    assert!(
        text.contains("[assistant] answer\\u{1b}]52;c;Y2xpcA==\\u{7}\\rforged\\u{9b}2J"),
        "{text}"
    );
    // … everything else is one line.
    assert!(text.contains("→ subagent [call\\r1] {"), "{text}");
    assert!(
        text.contains("\\u001b]0;pwned\\u0007"),
        "JSON escapes are kept: {text}"
    );
    assert!(text.contains("boom\\u{1b}[2J\\rforged"), "{text}");

    let mut cmd = subagent();
    cmd.arg("check").arg(&store);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    let (report, err) = (stdout(&out), stderr(&out));
    assert_inert("check stdout", &report);
    assert_inert("check stderr", &err);
    assert!(report.contains("session \"bad\\u{1b}]0;t\\u{7}\""), "{report}");

    // An error message quoting an id shows it escaped, on its one line.
    let mut cmd = subagent();
    cmd.args(["log", "gone\x1b[2J\nforged", "--store"]).arg(&store);
    let out = run(cmd);
    assert_fails(&out, "no session `gone\\u{1b}[2J\\nforged`");
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert_inert("log error", &stderr(&out));

    assert!(before == snapshot(&store), "the store changed");
}

#[test]
fn run_shows_a_hostile_label_and_error_escaped_and_pipes_the_answer_exactly() {
    const ANSWER: &str = "final\x1b]52;c;Y2xpcA==\x07 answer\u{202e}\nline two";
    let (base, _requests) = serve(|body| {
        if is_child(body) {
            text_sse("child done\x1b[2J")
        } else if has_tool_result(body) {
            text_sse(ANSWER)
        } else {
            tool_sse(
                "subagent",
                &json!({"description": EVIL_LABEL, "prompt": "CHILD: look"}).to_string(),
            )
        }
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "delegate");
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // stdout is a pipe: the answer is the model's, byte for byte.
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{ANSWER}\n"));
    // The live tree (plain lines on a pipe) shows the label on one line, escaped.
    let err = stderr(&out);
    assert_inert("run stderr", &err);
    assert!(
        err.lines()
            .any(|l| l.starts_with(&format!("  + spawn \"{EVIL_LABEL_SHOWN}\"  depth 1"))),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with(&format!("  = spawn \"{EVIL_LABEL_SHOWN}\"  depth 1"))),
        "{err}"
    );
    assert_checks_clean(&store);

    // A server's error message ends the run in one escaped line.
    let (base, _requests) = serve(|_| {
        Reply::Raw(
            500,
            "application/json",
            vec![],
            json!({"error": {"message": "boom\x1b]0;pwned\x07\r\nforged"}}).to_string(),
        )
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, _store) = run_command(&base, workspace.path(), "say hello");
    let out = run(cmd);
    assert_fails(&out, "failed: boom\\u{1b}]0;pwned\\u{7}\\r\\nforged");
    assert_inert("run error", &stderr(&out));
}

/// A store path that cannot hold session logs (a file is in its place) fails the run before any
/// model call: nothing is spent on a run whose logs could not be kept.
#[test]
fn an_unusable_store_fails_before_any_model_call() {
    let (base, requests) = serve(|_| text_sse("answer"));
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "do it");
    fs::write(&store, "not a directory").expect("a file where the store goes");
    let out = run(cmd);
    assert_fails(&out, "cannot persist session logs in");
    assert!(
        stderr(&out).to_lowercase().contains("not a directory"),
        "{}",
        stderr(&out)
    );
    assert_eq!(requests.try_iter().count(), 0, "no model call was made");
    assert_eq!(
        fs::read_to_string(&store).expect("the file"),
        "not a directory",
        "left as it was"
    );
}

/// A reader that closes the pipe early (`subagent agents | head -1`) ends the program quietly
/// with status 141, as `SIGPIPE` would, instead of a panic and its backtrace. Each output is
/// larger than a pipe's buffer, so a write fails however the two processes are scheduled.
#[test]
fn a_closed_stdout_ends_the_program_quietly() {
    // 1,000 sessions to list, and 1,000 logs with one unreadable line each to check.
    let (listed, damaged) = (
        tempfile::tempdir().expect("store"),
        tempfile::tempdir().expect("store"),
    );
    for i in 0..1000 {
        let id = format!("session-{i:04}");
        let header = json!({"version": 0, "id": id, "createdAt": i + 1});
        fs::write(listed.path().join(format!("{id}.jsonl")), format!("{header}\n")).expect("log");
        fs::write(
            damaged.path().join(format!("{id}.jsonl")),
            format!("{header}\nnot json\n"),
        )
        .expect("log");
    }
    for (args, store) in [(["agents", "--store"], &listed), (["check", "--"], &damaged)] {
        let mut cmd = subagent();
        cmd.args(args).arg(store.path());
        let mut child = cmd.spawn().expect("spawn");
        drop(child.stdout.take()); // the reader goes away at once
        let out = child.wait_with_output().expect("wait");
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
    // A closed stderr loses the diagnostic, not the exit status (no panic: that would be 101).
    let mut cmd = subagent();
    cmd.args(["log", "no-such-session", "--store"]).arg(listed.path());
    let mut child = cmd.spawn().expect("spawn");
    drop(child.stderr.take());
    assert_eq!(child.wait().expect("wait").code(), Some(2));
}

/// Warnings the libraries log while `run` works (here: the model repeated a tool call id, which
/// the driver re-keys and reports with the call's id and tool name) quote what the model sent;
/// they reach stderr escaped and on one line, like everything else the program prints.
#[test]
fn run_logs_warnings_quoting_model_text_escaped() {
    let (base, _requests) = serve(|body| {
        if has_tool_result(body) {
            return text_sse("done");
        }
        let call = |index: u64| {
            chunk(
                json!({"tool_calls": [{"index": index, "id": "dup\x1b]0;pwned\x07\r\nforged\u{202e}",
                    "type": "function", "function": {"name": "list_dir\x1b[2J", "arguments": "{}"}}]}),
                None,
            )
        };
        Reply::Sse(format!(
            "{}{}{}{}data: [DONE]\n\n",
            chunk(json!({"role": "assistant", "content": ""}), None),
            call(0),
            call(1),
            chunk(json!({}), Some("tool_calls")),
        ))
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "list twice");
    let out = run(cmd);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(stdout(&out), "done\n");
    let warning = err
        .lines()
        .find(|l| l.contains("the model repeated a tool call id"))
        .unwrap_or_else(|| panic!("the re-keying is reported:\n{err}"));
    assert!(
        warning.contains("dup\\u{1b}]0;pwned\\u{7}\\r\\nforged\\u{202e}"),
        "{warning}"
    );
    assert_inert("run stderr", &err);
    assert!(!err.contains("\nforged"), "a forged line:\n{err}");
    assert_checks_clean(&store);
}

/// `subagent demo --store <dir>` whose path carries characters a terminal acts on (an escape
/// sequence, a carriage return, a bell): the banner and the closing lines show the path inert,
/// as `run` and `agents` do, and the demo still runs into that directory.
#[test]
fn a_demo_store_path_with_escape_sequences_is_shown_inert() {
    let root = tempfile::tempdir().expect("temp dir");
    let store = root.path().join("logs\x1b]0;pwned\x07\rforged");
    let mut cmd = subagent();
    cmd.arg("demo").arg("--store").arg(&store);
    let out = run(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_inert("demo output", &text);
    assert!(text.contains("logs\\u{1b}]0;pwned\\u{7}\\rforged"), "{text}");
    assert!(store.is_dir(), "the demo wrote into the directory as named");
}

/// `kill <pid>` (SIGTERM, what `timeout`, service managers and container runtimes send) during
/// a stalled stream is the graceful stop Ctrl-C is: the coordinator's turn is aborted, the host
/// shuts down and every log ends balanced — not a process killed mid-write with its turns open.
#[test]
fn sigterm_during_a_stalled_stream_ends_the_run_with_balanced_logs() {
    let (base, requests) = serve(|_| Reply::Stall);
    let workspace = tempfile::tempdir().expect("workspace");
    let (cmd, store) = run_command(&base, workspace.path(), "wait forever");
    let out = run_with(cmd, |pid| {
        requests
            .recv_timeout(HANG_GUARD)
            .expect("the run's request reaches the server");
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    });
    let err = stderr(&out);
    assert!(
        err.contains("subagent: interrupted; cancelling the coordinator"),
        "{err}"
    );
    assert_fails(&out, "was aborted");
    assert!(!err.contains("interrupted again"), "{err}");
    assert_checks_clean(&store);
}

/// SIGTERM while the coordinator waits on an `acp` delegation whose agent stays alive past the
/// end of its stdin (as an agent busy in a tool, or one that spawned helpers, does): the run
/// winds down as on Ctrl-C, and the provider's teardown (EOF, then SIGTERM to the child's own
/// process group) ends the child. A SIGTERM that killed `subagent` outright left the child,
/// in a process group of its own, running with nobody to stop it.
#[test]
fn sigterm_during_an_acp_delegation_leaves_no_child_process_behind() {
    let (base, requests) = serve(|body| {
        if has_tool_result(body) {
            return text_sse("done");
        }
        tool_sse("acp", r#"{"description":"hang","prompt":"wait for a cancel"}"#)
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let dir = tempfile::tempdir().expect("scratch");
    let ready = dir.path().join("ready");
    mkfifo(&ready);
    let pid_file = dir.path().join("pid");
    let terminated = dir.path().join("sigterm");
    let config = dir.path().join("acp.json");
    let text = |p: &Path| p.to_str().expect("a UTF-8 path").to_owned();
    let env = json!({
        "MOCK_HANG": "1",
        "MOCK_IGNORE_EOF": "1",
        "MOCK_READY_FILE": text(&ready),
        "MOCK_PID_FILE": text(&pid_file),
        "MOCK_SIGTERM_FILE": text(&terminated),
    });
    let agent = text(support::mock_acp_agent());
    // A short EOF grace: the child ignores EOF, so the teardown goes on to SIGTERM soon.
    let config_json = json!({"command": agent, "env": env, "disposeEofGraceMs": 100});
    fs::write(&config, config_json.to_string()).expect("config");
    let (mut cmd, store) = run_command(&base, workspace.path(), "delegate and wait");
    cmd.arg("--acp-config").arg(&config);
    // Output to files, not pipes: a child left behind holds the stderr it inherited, and the
    // test must still see `subagent` end.
    let (out_file, err_file) = (dir.path().join("stdout"), dir.path().join("stderr"));
    cmd.stdout(fs::File::create(&out_file).expect("stdout file"))
        .stderr(fs::File::create(&err_file).expect("stderr file"));
    let mut out = run_with(cmd, |pid| {
        requests
            .recv_timeout(HANG_GUARD)
            .expect("the coordinator's request reaches the server");
        // The mock touches `ready` (a FIFO: each touch waits for a reader) once its SIGTERM
        // handler is armed and once its prompt handler has streamed: then it hangs in the turn.
        let (tx, rx) = mpsc::channel();
        let fifo = ready.clone();
        thread::spawn(move || {
            for _ in 0..2 {
                let _ = fs::read(&fifo);
            }
            let _ = tx.send(());
        });
        rx.recv_timeout(HANG_GUARD)
            .expect("the ACP child reaches its prompt");
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    });
    out.stdout = fs::read(&out_file).expect("stdout");
    out.stderr = fs::read(&err_file).expect("stderr");
    let child: u32 = fs::read_to_string(&pid_file)
        .expect("the child wrote its pid")
        .trim()
        .parse()
        .expect("a pid");
    let left_behind = subagent_acp::process::group_alive(child);
    if left_behind {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{child}")])
            .status();
    }
    assert!(
        !left_behind,
        "the ACP child {child} outlived `subagent`: {}",
        stderr(&out)
    );
    assert!(terminated.exists(), "the child was sent SIGTERM by the teardown");
    assert_fails(&out, "was aborted");
    assert_checks_clean(&store);
}

// ---------------------------------------------------------------------------------------------
// `subagent acp` (the ACP server) stopped by a signal or by its client leaving.

/// A running `subagent acp` on a stalled model, driven as an ACP client over its stdin and
/// stdout: one session, one prompt whose model call has reached the server (its turn is open).
struct StalledServer {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    /// Every JSON-RPC message the server writes on stdout, one per line.
    messages: mpsc::Receiver<Value>,
    /// Its whole stderr, once it has closed.
    stderr: mpsc::Receiver<String>,
    store: PathBuf,
    workspace: tempfile::TempDir,
}

impl StalledServer {
    /// Starts the server, opens a session and sends a prompt (id 3); returns once the prompt's
    /// model call has reached the server.
    fn prompted() -> Self {
        use std::io::{BufRead as _, BufReader, Read as _};

        let (base, requests) = serve(|_| Reply::Stall);
        let workspace = tempfile::tempdir().expect("workspace");
        let store = workspace.path().join(".subagent");
        let mut cmd = subagent();
        cmd.args(["acp", "--model", "m", "--base-url", &base, "--store"])
            .arg(&store)
            .env_remove("RUST_LOG")
            .stdin(Stdio::piped());
        let mut child = cmd.spawn().expect("the binary starts");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut stderr_pipe = child.stderr.take().expect("stderr");
        let (tx, messages) = mpsc::channel();
        thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { return };
                let message = serde_json::from_str(&line).expect("stdout carries JSON-RPC only");
                if tx.send(message).is_err() {
                    return;
                }
            }
        });
        let (tx, stderr) = mpsc::channel();
        thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr_pipe.read_to_string(&mut text);
            let _ = tx.send(text);
        });
        let mut server = Self {
            child,
            stdin: Some(stdin),
            messages,
            stderr,
            store,
            workspace,
        };
        server.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1}}));
        server.response(1);
        let cwd = server
            .workspace
            .path()
            .canonicalize()
            .expect("canonical workspace");
        server.send(json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
            "params": {"cwd": cwd, "mcpServers": []}}));
        let created = server.response(2);
        let session = created["result"]["sessionId"].clone();
        assert!(session.is_string(), "{created}");
        server.send(json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
            "params": {"sessionId": session, "prompt": [{"type": "text", "text": "wait forever"}]}}));
        requests
            .recv_timeout(HANG_GUARD)
            .expect("the prompt's model call reaches the server");
        server
    }

    fn send(&mut self, message: Value) {
        let stdin = self.stdin.as_mut().expect("stdin still open");
        writeln!(stdin, "{message}").expect("request written");
    }

    /// The response to request `id` (other messages skipped).
    fn response(&self, id: u64) -> Value {
        loop {
            let message = self
                .messages
                .recv_timeout(HANG_GUARD)
                .unwrap_or_else(|_| panic!("no response to request {id}"));
            if message["id"] == id {
                return message;
            }
        }
    }

    /// Sends `signal` (`TERM`, `INT`) to the server.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the server to exit (killing it and failing if it does not, under the hang
    /// guard); its exit status, its stderr, and its store (in the workspace, which lives on).
    fn exit(self) -> (std::process::ExitStatus, String, Stored) {
        let pid = self.child.id();
        let mut child = self.child;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let status = match rx.recv_timeout(HANG_GUARD) {
            Ok(status) => status.expect("wait for the binary"),
            Err(_) => {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
                panic!("`subagent acp` (pid {pid}) hung: killed after {HANG_GUARD:?}");
            }
        };
        drop(self.stdin);
        let err = self.stderr.recv_timeout(HANG_GUARD).expect("stderr closes");
        let store = Stored {
            path: self.store.clone(),
            _workspace: self.workspace,
        };
        (status, err, store)
    }
}

/// A stopped server's store, kept on disk as long as this lives.
struct Stored {
    path: PathBuf,
    _workspace: tempfile::TempDir,
}

/// SIGTERM (what `kill`, service managers and ACP clients tearing their agent down send) to
/// `subagent acp` while a prompt's turn waits on a stalled model: the server stops taking
/// requests, cancels the prompt — answered `cancelled`, as ACP requires of a cancelled prompt,
/// its client being still connected — shuts the session's host down so its log ends balanced
/// (the turn `aborted`), and exits 0. Before, SIGTERM killed it outright: no answer, and a log
/// whose turn never ended.
#[test]
fn sigterm_during_a_served_prompt_answers_cancelled_and_leaves_balanced_logs() {
    let server = StalledServer::prompted();
    server.signal("TERM");
    let answer = server.response(3);
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    let (status, err, store) = server.exit();
    assert_eq!(status.code(), Some(0), "stderr:\n{err}");
    assert!(
        err.contains("subagent: interrupted; cancelling the running prompts"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let ends = turn_ends(&store.path);
    assert_eq!(ends.len(), 1, "{ends:?}");
    let reasons = ends.values().next().expect("the session's log");
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    assert_eq!(reasons[0]["kind"], "aborted", "{reasons:?}");
    assert_checks_clean(&store.path);
}

/// Ctrl-C (SIGINT) to `subagent acp` is the same graceful stop as SIGTERM.
#[test]
fn ctrl_c_during_a_served_prompt_winds_the_server_down() {
    let server = StalledServer::prompted();
    server.signal("INT");
    let answer = server.response(3);
    assert_eq!(answer["result"]["stopReason"], "cancelled", "{answer}");
    let (status, err, store) = server.exit();
    assert_eq!(status.code(), Some(0), "stderr:\n{err}");
    assert_checks_clean(&store.path);
    let ends = turn_ends(&store.path);
    assert_eq!(ends.values().flatten().count(), 1, "{ends:?}");
}

/// The client going away (stdin closed) while a prompt's turn waits on a stalled model: the
/// server aborts the prompt, shuts the session's host down (the turn ends `aborted`, the log
/// balanced) and exits 0.
#[test]
fn stdin_closed_during_a_served_prompt_ends_the_server_with_balanced_logs() {
    let mut server = StalledServer::prompted();
    drop(server.stdin.take());
    let (status, err, store) = server.exit();
    assert_eq!(status.code(), Some(0), "stderr:\n{err}");
    let ends = turn_ends(&store.path);
    let reasons: Vec<&Value> = ends.values().flatten().collect();
    assert_eq!(reasons.len(), 1, "{ends:?}");
    assert_eq!(reasons[0]["kind"], "aborted", "{reasons:?}");
    assert_checks_clean(&store.path);
}
