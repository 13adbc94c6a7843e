//! The host with an ACP provider mounted ([`HostOptions::acp`]): a real composition in which a
//! scripted coordinator delegates once through the `acp` tool to a real subprocess (the
//! `subagent-acp` crate's scripted mock ACP agent), with the provider's `cwd` omitted; and the
//! harness's own ACP agent, `subagent acp`, driven by that provider as its child.

mod support;

use std::sync::Arc;

use agent::{
    ContentBlock, EventData, GenerateOptions, ModelAdapter, ModelStream, SessionId, Signal, StreamChunk,
};
use agent_loop::model::chunks;
use futures::StreamExt;
use subagent::StopReason;
use subagent::provider::SubagentStartRequest;
use subagent_acp::AcpConfig;
use subagent_cli::catalog::tool_result_text;
use subagent_cli::host::{ACP_TOOL, Host, HostOptions, build_host};

/// Delegates once through the `acp` tool, then answers with whatever the tool returned.
struct DelegatesOnce;

impl ModelAdapter for DelegatesOnce {
    fn stream(&self, options: Arc<GenerateOptions>) -> ModelStream {
        let result = options
            .messages
            .iter()
            .find(|m| m.source.kind() == "tool")
            .map(tool_result_text);
        let reply: Vec<StreamChunk> = match result {
            None => chunks::tool_call(
                "call-1",
                ACP_TOOL,
                serde_json::json!({"description": "where are you", "prompt": "report your cwd"}),
            ),
            Some(text) => chunks::text(format!("the child said: {text}")),
        };
        futures::stream::iter(reply.into_iter().map(Ok)).boxed()
    }
}

/// spec: ACP-48 — a real composition with the provider's `cwd` omitted: a scripted parent
/// delegates once through the mounted `acp` tool; the child process runs in, and is announced in
/// `session/new`, the parent session's working directory, so the single `tool/result` reads
/// `<workspace>\n<workspace>`. Nothing goes wrong on the way (the Rust form of "no unhandled
/// errors on stderr"): the coordinator answers with that result, every log append passes the
/// online invariant checker, and the host shuts down cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_48_composition_without_cwd_runs_the_child_in_the_parent_workspace() {
    let store = tempfile::tempdir().expect("store dir");
    let workspace = tempfile::tempdir().expect("workspace dir");
    // The child reports its real (canonical) directory.
    let workspace_path = workspace.path().canonicalize().expect("canonical workspace");
    let mut acp = AcpConfig::new(support::mock_acp_agent().to_str().expect("a UTF-8 path"));
    acp.env.insert("MOCK_ECHO_CWD".to_owned(), "1".to_owned());
    assert_eq!(acp.cwd, None, "the provider's cwd is omitted");
    let mut options = HostOptions::new(store.path(), Arc::new(DelegatesOnce), "mock", "mock");
    options.cwd = Some(workspace_path.clone());
    options.acp = Some(acp);
    let (host, observer) = support::observed_host(options);
    let coordinator = host
        .create_agent(SessionId::from("coordinator"))
        .await
        .expect("coordinator");
    host.run_turn(coordinator.agent(), "delegate once")
        .await
        .expect("the turn runs");

    let events = coordinator.agent().session().events();
    let results: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult { message, .. } => Some(tool_result_text(message)),
            _ => None,
        })
        .collect();
    let ws = workspace_path.display();
    assert_eq!(
        results,
        [format!("{ws}\n{ws}")],
        "one tool result: real cwd, then announced cwd"
    );
    assert_eq!(
        Host::last_answer(coordinator.agent().as_ref()).as_deref(),
        Some(format!("the child said: {ws}\n{ws}").as_str())
    );
    coordinator.dispose().await;
    host.shutdown().await.expect("shutdown");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}

/// A configuration that does not load fails the composition before anything is composed (not
/// even the store directory is created), naming the provider.
#[tokio::test]
async fn an_acp_configuration_that_does_not_load_fails_the_host() {
    let store = tempfile::tempdir().expect("store dir");
    let mut acp = AcpConfig::new("mock_acp_agent");
    acp.cwd = Some(String::new());
    let store_dir = store.path().join("not-yet");
    let mut options = HostOptions::new(&store_dir, Arc::new(DelegatesOnce), "mock", "mock");
    options.acp = Some(acp);
    let error = build_host(options).expect_err("an empty cwd is refused at load");
    assert!(!store_dir.exists(), "nothing was composed");
    let text = error.to_string();
    assert!(text.starts_with("cannot register provider acp: "), "{text}");
    assert!(text.contains("cwd"), "{text}");
}

/// spec: ACP-49 — the harness's own ACP agent answers a `PONG` prompt with `completed`. Rust
/// form, keyless: the `acp` provider starts this crate's `subagent acp` (on a local
/// OpenAI-compatible server replaying a recorded `PONG` answer) as its child; the run's result
/// is that answer with stop reason `completed`. The served session's log lands in the child's
/// store, rooted at the delegating session's working directory, with its one turn completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_49_the_harness_own_acp_agent_answers_pong_with_completed() {
    let (base, exchanges) = support::sse::serve(|_| ("pong.sse", support::sse::recording("pong.sse")));
    let store = tempfile::tempdir().expect("store dir");
    let child_store = tempfile::tempdir().expect("child store dir");
    let workspace = tempfile::tempdir().expect("workspace dir");
    let workspace_path = workspace.path().canonicalize().expect("canonical workspace");
    let mut acp = AcpConfig::new(env!("CARGO_BIN_EXE_subagent"));
    acp.args = ["acp", "--base-url", &base, "--model", "gpt-4o-mini", "--store"]
        .map(str::to_owned)
        .to_vec();
    acp.args
        .push(child_store.path().to_str().expect("a UTF-8 path").to_owned());
    let mut options = HostOptions::new(store.path(), Arc::new(DelegatesOnce), "mock", "mock");
    options.cwd = Some(workspace_path.clone());
    options.acp = Some(acp);
    let host: Host = build_host(options).expect("the host composes");
    let parent = host
        .create_agent(SessionId::from("parent"))
        .await
        .expect("parent");
    let request = SubagentStartRequest::new(
        vec![ContentBlock::text("PONG")],
        parent.agent().clone(),
        Signal::new(),
    );
    let run = host
        .subagents()
        .start("acp", request)
        .await
        .expect("the child starts");
    let result = run.result().await.expect("a result");
    run.dispose().await.expect("disposed");
    assert_eq!(
        result.stop_reason,
        StopReason::Completed,
        "{:?}",
        result.diagnostic
    );
    assert_eq!(agent::content::visible_text(&result.output), "PONG");

    let prompts: Vec<String> = exchanges
        .lock()
        .iter()
        .filter_map(|e| {
            let messages = e.body["messages"].as_array()?;
            messages
                .last()
                .and_then(|m| m["content"].as_str())
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(
        prompts,
        ["PONG"],
        "the served coordinator asked its model once, with the prompt"
    );
    let ends = support::only_session_turn_ends(child_store.path(), &workspace_path).await;
    assert_eq!(ends, ["completed"]);
    parent.dispose().await;
    host.shutdown().await.expect("shutdown");
}
