//! `subagent run` against a local OpenAI-compatible server (127.0.0.1) that replays recorded
//! server-sent-event streams (`tests/fixtures/*.sse`): the coordinator delegates with the
//! `subagent` tool, the spawned child lists the workspace with `list_dir` and answers, and the
//! coordinator answers from the child's result. The store then shows the child under the
//! coordinator and replays clean.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::thread;

use parking_lot::Mutex;
use serde_json::Value;

/// The prompt the recorded coordinator stream delegates (see `coordinator_delegates.sse`).
const DELEGATED_PROMPT: &str =
    "List the top-level entries of the workspace and say which one is the manifest.";

/// One request the server answered: which recording it replayed, its headers and JSON body.
#[derive(Clone, Debug)]
struct Exchange {
    replayed: &'static str,
    head: String,
    body: Value,
}

/// Picks the recording for a request by its content (never by arrival order).
fn route(body: &Value) -> &'static str {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let is_child = messages
        .iter()
        .any(|m| m["role"] == "user" && m["content"].as_str() == Some(DELEGATED_PROMPT));
    let has_tool_result = messages.iter().any(|m| m["role"] == "tool");
    match (is_child, has_tool_result) {
        (false, false) => "coordinator_delegates.sse",
        (true, false) => "child_lists.sse",
        (true, true) => "child_answers.sse",
        (false, true) => "coordinator_final.sse",
    }
}

fn recording(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// Reads one HTTP/1.1 request: the head and a `content-length` body.
fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// Serves recordings on 127.0.0.1 until the process ends; returns the base URL and the log of
/// exchanges.
fn serve() -> (String, Arc<Mutex<Vec<Exchange>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
    let base = format!("http://{}/v1", listener.local_addr().expect("local addr"));
    let log: Arc<Mutex<Vec<Exchange>>> = Arc::default();
    let seen = log.clone();
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let Some((head, body)) = read_request(&mut stream) else {
                continue;
            };
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let replayed = route(&body);
            seen.lock().push(Exchange { replayed, head, body });
            let reply = recording(replayed);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                  x-request-id: req_replay\r\nconnection: close\r\n\r\n",
            );
            let _ = stream.write_all(&reply);
            let _ = stream.flush();
        }
    });
    (base, log)
}

#[test]
fn run_delegates_end_to_end_against_a_replayed_stream() {
    let (base, exchanges) = serve();
    let workspace = tempfile::tempdir().expect("workspace");
    std::fs::write(
        workspace.path().join("Cargo.toml"),
        "[package]\nname = \"demo\"\n",
    )
    .expect("write");
    std::fs::write(workspace.path().join("README.md"), "# demo\n").expect("write");
    std::fs::create_dir(workspace.path().join("src")).expect("mkdir");
    let store = tempfile::tempdir().expect("store");

    let out = Command::new(env!("CARGO_BIN_EXE_subagent"))
        .current_dir(workspace.path())
        .env_remove("SUBAGENT_BASE_URL")
        .env_remove("SUBAGENT_API_KEY")
        .env("SUBAGENT_MODEL", "gpt-4o-mini")
        .args([
            "run",
            "--base-url",
            &base,
            "--api-key",
            "sk-test-replay",
            "--store",
        ])
        .arg(store.path())
        .arg("What is in this workspace? Delegate the listing.")
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status.code()
    );
    assert_eq!(
        stdout.trim_end(),
        "The subagent reports: the workspace holds Cargo.toml, README.md and src/, and Cargo.toml is the manifest."
    );
    assert!(stderr.contains("spawn \"list the workspace\""), "{stderr}");

    // Four model calls, each answered by the recording its content selects.
    let exchanges = exchanges.lock().clone();
    let replayed: Vec<&str> = exchanges.iter().map(|e| e.replayed).collect();
    assert_eq!(
        replayed,
        [
            "coordinator_delegates.sse",
            "child_lists.sse",
            "child_answers.sse",
            "coordinator_final.sse"
        ]
    );
    for e in &exchanges {
        assert!(e.head.starts_with("POST /v1/chat/completions "), "{}", e.head);
        assert!(
            e.head
                .to_ascii_lowercase()
                .contains("authorization: bearer sk-test-replay"),
            "{}",
            e.head
        );
        assert_eq!(e.body["model"], "gpt-4o-mini");
        assert_eq!(e.body["stream"], true);
        let tools: Vec<&str> = e.body["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str()).collect())
            .unwrap_or_default();
        for tool in ["subagent", "fork", "read_file", "list_dir", "grep", "job_output"] {
            assert!(tools.contains(&tool), "{tool} missing from {tools:?}");
        }
    }
    // The child's second request carries its real `list_dir` result (read-only workspace tool).
    let listing = exchanges[2].body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .expect("the child's tool result")
        .to_owned();
    assert_eq!(listing, "Cargo.toml\nREADME.md\nsrc/");
    // The coordinator's final request carries the child's answer as the delegation result.
    let delegated = exchanges[3].body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool"))
        .and_then(|m| m["content"].as_str())
        .expect("the delegation result")
        .to_owned();
    assert_eq!(
        delegated,
        "The workspace has `Cargo.toml`, `README.md` and `src/`; `Cargo.toml` is the manifest."
    );

    // The store: the coordinator with one spawn child, clean under replay.
    let agents = Command::new(env!("CARGO_BIN_EXE_subagent"))
        .args(["agents", "--store"])
        .arg(store.path())
        .output()
        .expect("agents runs");
    let tree = String::from_utf8_lossy(&agents.stdout);
    assert!(agents.status.success(), "{tree}");
    let lines: Vec<&str> = tree.lines().collect();
    assert_eq!(lines.len(), 2, "{tree}");
    assert!(
        lines[0].contains("(top-level)  depth 0  turns 1  last completed"),
        "{tree}"
    );
    assert!(
        lines[1].starts_with("└─ ")
            && lines[1].contains("spawn \"list the workspace\"  depth 1  turns 1  last completed"),
        "{tree}"
    );
    let report = invariants::check_store(store.path()).expect("store readable");
    assert_eq!(report.logs, 2);
    assert!(report.is_clean(), "{:#?}", report.violations);
}

#[test]
fn run_reports_a_model_failure_as_one_error_line() {
    // A port nobody listens on: the adapter's connection fails, the coordinator's turn ends with
    // an error, and the program exits non-zero with the failure as its last line.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let store = tempfile::tempdir().expect("store");
    let out = Command::new(env!("CARGO_BIN_EXE_subagent"))
        .current_dir(store.path())
        .env_remove("SUBAGENT_API_KEY")
        .args([
            "run",
            "--model",
            "m",
            "--base-url",
            &format!("http://127.0.0.1:{port}/v1"),
            "--store",
        ])
        .arg(store.path().join("logs"))
        .arg("hello")
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.lines().last().expect("an error line");
    assert!(
        last.starts_with("subagent: the coordinator's turn failed: "),
        "{stderr}"
    );
    assert!(last.contains("CONNECTION_FAILED"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
