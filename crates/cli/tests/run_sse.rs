//! `subagent run` against a local OpenAI-compatible server (127.0.0.1) that replays recorded
//! server-sent-event streams (`tests/fixtures/*.sse`): the coordinator delegates with the
//! `subagent` tool, the spawned child lists the workspace with `list_dir` and answers, and the
//! coordinator answers from the child's result. The store then shows the child under the
//! coordinator and replays clean.

mod support;

use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;

use parking_lot::Mutex;
use serde_json::Value;
use support::sse::Exchange;

/// The prompt the recorded coordinator stream delegates (see `coordinator_delegates.sse`).
const DELEGATED_PROMPT: &str =
    "List the top-level entries of the workspace and say which one is the manifest.";

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

/// Serves the recordings [`route`] picks, on 127.0.0.1.
fn serve() -> (String, Arc<Mutex<Vec<Exchange>>>) {
    support::sse::serve(|body| {
        let name = route(body);
        (name, support::sse::recording(name))
    })
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

/// `subagent run --acp-config FILE` mounts the `acp` tool: the coordinator (on the local
/// server) delegates through it to a real ACP agent subprocess (the scripted mock), receives its
/// streamed answer as the tool result, and answers; the store then checks clean.
#[test]
fn run_delegates_to_an_acp_agent_configured_with_acp_config() {
    let (base, exchanges) = support::sse::serve(|body| {
        let has_tool_result = body["messages"]
            .as_array()
            .is_some_and(|ms| ms.iter().any(|m| m["role"] == "tool"));
        if has_tool_result {
            (
                "text",
                support::sse::text_stream("Relayed the ACP agent's answer."),
            )
        } else {
            let arguments = serde_json::json!({"description": "ask the ACP agent", "prompt": "hello"});
            ("acp call", support::sse::tool_call_stream("acp", &arguments))
        }
    });
    let workspace = tempfile::tempdir().expect("workspace");
    let store = tempfile::tempdir().expect("store");
    let config = workspace.path().join("acp.json");
    let json =
        serde_json::json!({"command": support::mock_acp_agent(), "env": {"MOCK_TEXT": "answer from ACP"}});
    std::fs::write(&config, json.to_string()).expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_subagent"))
        .current_dir(workspace.path())
        .env_remove("SUBAGENT_BASE_URL")
        .env_remove("SUBAGENT_API_KEY")
        .env_remove("SUBAGENT_MODEL")
        .args([
            "run",
            "--base-url",
            &base,
            "--model",
            "test-model",
            "--acp-config",
        ])
        .arg(&config)
        .arg("--store")
        .arg(store.path())
        .arg("Ask the ACP agent.")
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout.trim(), "Relayed the ACP agent's answer.");
    assert!(
        stderr.contains("  + acp  depth 1  (") && stderr.contains("  = acp  depth 1  completed  ("),
        "the tree shows the out-of-process child one level below the coordinator:\n{stderr}"
    );
    let exchanges = exchanges.lock().clone();
    assert_eq!(exchanges.len(), 2, "{exchanges:#?}");
    let offered: Vec<&str> = exchanges[0].body["tools"]
        .as_array()
        .expect("tools offered")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(offered.contains(&"acp"), "{offered:?}");
    let tool_result = exchanges[1].body["messages"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["role"] == "tool"))
        .expect("the tool result reached the model")
        .to_string();
    assert!(tool_result.contains("answer from ACP"), "{tool_result}");
    let check = Command::new(env!("CARGO_BIN_EXE_subagent"))
        .arg("check")
        .arg(store.path())
        .output()
        .expect("check runs");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// A run that finishes but whose host cannot make every log durable: the answer is still
/// printed on stdout, and the shutdown's failure is reported on stderr with exit code 2. The
/// server replaces the store directory by a file when the coordinator's first request arrives,
/// so the logs' writes fail (each a warning on stderr) and so does the shutdown's flush. Before
/// the fix the shutdown's failure was returned before the answer was printed (stdout stayed
/// empty), and `run` installed no log subscriber, so the writers' warnings went nowhere.
#[test]
fn run_prints_the_answer_and_then_reports_a_failed_shutdown() {
    let root = tempfile::tempdir().expect("root");
    let store = root.path().join("store");
    let workspace = root.path().join("workspace");
    std::fs::create_dir(&workspace).expect("mkdir");
    std::fs::write(workspace.join("Cargo.toml"), "[package]\nname = \"demo\"\n").expect("write");
    std::fs::write(workspace.join("README.md"), "# demo\n").expect("write");
    std::fs::create_dir(workspace.join("src")).expect("mkdir");
    let (moved_store, blocked_store) = (root.path().join("moved"), store.clone());
    let (base, _exchanges) = support::sse::serve(move |body| {
        let name = route(body);
        if name == "coordinator_delegates.sse" && blocked_store.is_dir() {
            std::fs::rename(&blocked_store, &moved_store).expect("the store moves away");
            std::fs::write(&blocked_store, "not a directory").expect("a file takes its place");
        }
        (name, support::sse::recording(name))
    });

    let out = Command::new(env!("CARGO_BIN_EXE_subagent"))
        .current_dir(&workspace)
        .env_remove("SUBAGENT_BASE_URL")
        .env_remove("SUBAGENT_API_KEY")
        .env("SUBAGENT_MODEL", "gpt-4o-mini")
        .args(["run", "--base-url", &base, "--store"])
        .arg(&store)
        .arg("What is in this workspace? Delegate the listing.")
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stdout.trim_end(),
        "The subagent reports: the workspace holds Cargo.toml, README.md and src/, and Cargo.toml is the manifest.",
        "the finished answer is printed\nstderr:\n{stderr}"
    );
    assert_eq!(out.status.code(), Some(2), "stderr:\n{stderr}");
    let last = stderr.lines().last().expect("an error line");
    assert!(
        last.starts_with("subagent: the host did not shut down cleanly: cannot persist session logs"),
        "{stderr}"
    );
    assert!(
        stderr.contains("WARN") && stderr.contains("session log write failed"),
        "the failed writes' warnings reach stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
