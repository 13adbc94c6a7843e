//! `subagent acp`'s server ([`subagent_cli::serve::serve`]) driven in-process by an ACP client
//! over an in-memory pipe: a prompt answered with its final text and `end_turn`, every
//! malformed request refused with a clear error (nothing stored for it), a running turn
//! cancelled by `session/cancel`, and every session wound down — logs balanced and durable —
//! once the client closes its end.

mod support;

use std::sync::Arc;

use agent::{GenerateOptions, ModelAdapter, ModelStream};
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, InitializeRequest, InitializeResponse, LoadSessionRequest,
    NewSessionRequest, PromptRequest, SessionId, SessionNotification, SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::{ByteStreams, Client};
use agent_loop::model::chunks;
use futures::StreamExt;
use invariants::InvariantObserver;
use parking_lot::Mutex;
use subagent_cli::serve::{ServeOptions, serve, serve_until};
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// Answers every prompt at once, except one containing `WAIT`, whose stream never yields;
/// asked to `use a tool`, it says so and lists the workspace, then answers; asked to
/// `START-BACKGROUND` (in the latest prompt), it starts a background `spawn` child that waits forever, then answers;
/// asked to `DELEGATE` (in the latest prompt), it runs a `spawn` child in the foreground, then answers.
struct Answers;

impl ModelAdapter for Answers {
    fn stream(&self, options: Arc<GenerateOptions>) -> ModelStream {
        let said = |needle: &str| options.messages.iter().any(|m| m.text().contains(needle));
        let last_prompt = options
            .messages
            .iter()
            .rev()
            .find(|m| m.source.kind() == "user")
            .map(|m| m.text())
            .unwrap_or_default();
        if said("WAIT") {
            return futures::stream::pending().boxed();
        }
        let tool_results = options
            .messages
            .iter()
            .filter(|m| m.source.kind() == "tool")
            .count();
        let reply = if said("use a tool") {
            match tool_results {
                0 => chunks::text_and_tool_call(
                    "Looking.",
                    "call-1",
                    "list_dir",
                    serde_json::json!({"path": "."}),
                ),
                _ => chunks::text("Done."),
            }
        } else if last_prompt.contains("START-BACKGROUND") {
            match tool_results {
                0 => chunks::text_and_tool_call(
                    "Starting.",
                    "call-bg",
                    "subagent",
                    serde_json::json!({
                        "description": "waiter",
                        "prompt": "WAIT in the background",
                        "run_in_background": true,
                    }),
                ),
                _ => chunks::text("Started."),
            }
        } else if last_prompt.contains("DELEGATE") {
            match tool_results {
                0 => chunks::text_and_tool_call(
                    "Asking.",
                    "call-fg",
                    "subagent",
                    serde_json::json!({"description": "helper", "prompt": "say hi"}),
                ),
                _ => chunks::text("Done."),
            }
        } else {
            chunks::text("hello back")
        };
        futures::stream::iter(reply.into_iter().map(Ok)).boxed()
    }
}

type Agent = ConnectionTo<agent_client_protocol::Agent>;

/// `initialize` at protocol version 1.
async fn initialize(cx: &Agent) -> Result<InitializeResponse, agent_client_protocol::Error> {
    cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
        .block_task()
        .await
}

/// `session/new` at `cwd`; the new session's id.
async fn new_session(cx: &Agent, cwd: std::path::PathBuf) -> Result<SessionId, agent_client_protocol::Error> {
    Ok(cx
        .send_request(NewSessionRequest::new(cwd))
        .block_task()
        .await?
        .session_id)
}

/// A store directory, a workspace directory, and the workspace's canonical path (the `cwd` of
/// a session on it). Both directories are removed when dropped.
fn dirs() -> (tempfile::TempDir, tempfile::TempDir, std::path::PathBuf) {
    let store = tempfile::tempdir().expect("store dir");
    let workspace = tempfile::tempdir().expect("workspace dir");
    let cwd = workspace.path().canonicalize().expect("canonical workspace");
    (store, workspace, cwd)
}

fn text(t: &str) -> Vec<ContentBlock> {
    vec![ContentBlock::Text(TextContent::new(t))]
}

/// The served agent over ACP v1: one host per session, the coordinator's text streamed as it
/// is written (a blank line between model steps), stop reasons mapped, bad requests refused, a
/// second concurrent prompt refused, `session/cancel` honoured, and a clean wind-down at EOF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_agent_answers_refuses_bad_requests_cancels_and_winds_down_at_eof() {
    let (store, _workspace, workspace_path) = dirs();
    let cwd = workspace_path.clone();
    let updates = with_server(store.path(), async move |cx: Agent| {
        let init = initialize(&cx).await?;
        assert_eq!(init.protocol_version, ProtocolVersion::V1);

        // A relative or missing cwd is refused.
        for bad in ["relative/dir", "/no/such/dir/anywhere"] {
            let refused = cx
                .send_request(NewSessionRequest::new(bad))
                .block_task()
                .await
                .expect_err("a bad cwd is refused");
            assert!(refused.message.contains("cwd"), "{refused:?}");
        }
        let session = new_session(&cx, cwd).await?;

        // Unknown sessions and prompts without text are refused.
        let unknown = cx
            .send_request(PromptRequest::new("acp-nope", text("hi")))
            .block_task()
            .await
            .expect_err("an unknown session is refused");
        assert!(
            unknown.message.contains("unknown session `acp-nope`"),
            "{unknown:?}"
        );
        let empty = cx
            .send_request(PromptRequest::new(session.clone(), text("   ")))
            .block_task()
            .await
            .expect_err("a prompt without text is refused");
        assert!(empty.message.contains("no text"), "{empty:?}");

        // Prompts are answered `end_turn`, their text streamed meanwhile.
        for prompt in ["say hello", "use a tool"] {
            let answered = cx
                .send_request(PromptRequest::new(session.clone(), text(prompt)))
                .block_task()
                .await?;
            assert_eq!(answered.stop_reason, StopReason::EndTurn);
        }

        // While a prompt runs, another is refused; `session/cancel` ends the running one.
        // (The server admits requests in arrival order, so both are deterministic.)
        let waiting = cx.send_request(PromptRequest::new(session.clone(), text("WAIT for it")));
        let busy = cx
            .send_request(PromptRequest::new(session.clone(), text("again")))
            .block_task()
            .await
            .expect_err("a second prompt is refused while one runs");
        assert!(busy.message.contains("already running"), "{busy:?}");
        cx.send_notification(CancelNotification::new(session))?;
        let cancelled = waiting.block_task().await?;
        assert_eq!(cancelled.stop_reason, StopReason::Cancelled);
        Ok(())
    })
    .await;
    let agent_texts: Vec<&str> = updates
        .iter()
        .filter(|(user, _)| !user)
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(
        agent_texts,
        ["hello back", "Looking.", "\n\nDone."],
        "every text delta, in order; a blank line before a later step's text, none before a prompt's first"
    );

    // Only the valid session was stored.
    let ends = support::only_session_turn_ends(store.path(), &workspace_path).await;
    // The cancel may reach the waiting prompt before or after its turn began: no third turn,
    // or one that ended `aborted`.
    assert!(
        ends == ["completed", "completed"] || ends == ["completed", "completed", "aborted"],
        "the waiting prompt left no completed turn: {ends:?}"
    );
}

/// The `subagent acp` binary speaks newline-delimited JSON-RPC on stdout only: a session offered
/// MCP servers is created without them and says so on stderr, and closing stdin ends the
/// program cleanly, its session's log stored.
#[test]
fn the_binary_serves_on_stdio_warns_about_mcp_servers_on_stderr_and_exits_at_eof() {
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::process::{Command, Stdio};

    let store = tempfile::tempdir().expect("store dir");
    let workspace = tempfile::tempdir().expect("workspace dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_subagent"))
        .args([
            "acp",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--store",
        ])
        .arg(store.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut response = |request: serde_json::Value| {
        writeln!(stdin, "{request}").expect("request written");
        let id = request["id"].clone();
        loop {
            let mut line = String::new();
            assert!(
                stdout.read_line(&mut line).expect("stdout read") > 0,
                "stdout closed early"
            );
            let message: serde_json::Value =
                serde_json::from_str(&line).expect("stdout carries JSON-RPC only");
            if message["id"] == id {
                return message;
            }
        }
    };
    let init = response(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": 1}}),
    );
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
    let created = response(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
        "params": {"cwd": workspace.path(), "mcpServers": [
            {"name": "tools", "command": "/bin/true", "args": [], "env": []}]}}),
    );
    let session = created["result"]["sessionId"]
        .as_str()
        .expect("a session id")
        .to_owned();
    drop(stdin);
    let out = child.wait_with_output().expect("the binary exits");
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("MCP servers are not supported"), "{stderr}");
    assert!(
        store.path().join(format!("{session}.jsonl")).is_file(),
        "the session's log is stored"
    );
}

/// Runs `exchange` as an ACP client against a server on `store` until the client closes its
/// end, then waits for the server to wind down (every log append having passed the online
/// invariant checker); returns every text update the client saw as `(from the user?, text)`.
async fn with_server<F>(store: &std::path::Path, exchange: F) -> Vec<(bool, String)>
where
    F: AsyncFnOnce(Agent) -> Result<(), agent_client_protocol::Error> + Send + 'static,
{
    with_server_observed(store, Vec::new(), exchange).await
}

/// [`with_server`], with `observers` installed into every session beside the invariant checker.
async fn with_server_observed<F>(
    store: &std::path::Path,
    observers: Vec<Arc<dyn agent::SessionObserver>>,
    exchange: F,
) -> Vec<(bool, String)>
where
    F: AsyncFnOnce(Agent) -> Result<(), agent_client_protocol::Error> + Send + 'static,
{
    let observer = InvariantObserver::shared();
    let mut session_observers: Vec<Arc<dyn agent::SessionObserver>> = vec![observer.clone()];
    session_observers.extend(observers);
    let options = ServeOptions {
        adapter: Arc::new(Answers),
        model_provider: "mock".to_owned(),
        model_name: "mock".to_owned(),
        max_tokens: None,
        max_steps_per_turn: Some(5),
        store_dir: store.to_owned(),
        session_observers,
    };
    let (client_end, server_end) = tokio::io::duplex(1 << 16);
    let (server_read, server_write) = tokio::io::split(server_end);
    let server = tokio::spawn(serve(options, server_read, server_write));
    let (client_read, client_write) = tokio::io::split(client_end);
    let transport = ByteStreams::new(client_write.compat_write(), client_read.compat());
    let updates: Arc<Mutex<Vec<(bool, String)>>> = Arc::default();
    let seen = updates.clone();
    Client
        .v1()
        .name("test-client")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                let (user, chunk) = match notification.update {
                    SessionUpdate::UserMessageChunk(chunk) => (true, chunk),
                    SessionUpdate::AgentMessageChunk(chunk) => (false, chunk),
                    _ => return Ok(()),
                };
                if let ContentBlock::Text(t) = chunk.content {
                    seen.lock().push((user, t.text));
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, exchange)
        .await
        .expect("the client's exchange succeeds");
    // The client's end is gone: the server winds down and returns.
    server
        .await
        .expect("the server task")
        .expect("the server ends cleanly");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    updates.lock().clone()
}

/// `session/load` cold-resumes a session an earlier server stored: the client is told the
/// conversation so far (its prompt, the answer), the session takes another prompt, and its log
/// then holds both turns. An unknown id and an id already open are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_session_loads_with_its_history_replayed_and_takes_another_prompt() {
    let (store, _workspace, cwd) = dirs();
    let session: Arc<Mutex<Option<String>>> = Arc::default();
    let (first_cwd, created) = (cwd.clone(), session.clone());
    let first = with_server(store.path(), async move |cx: Agent| {
        let init = initialize(&cx).await?;
        assert!(init.agent_capabilities.load_session, "loading is advertised");
        let id = new_session(&cx, first_cwd).await?;
        let answered = cx
            .send_request(PromptRequest::new(id.clone(), text("say hello")))
            .block_task()
            .await?;
        assert_eq!(answered.stop_reason, StopReason::EndTurn);
        *created.lock() = Some(id.0.to_string());
        Ok(())
    })
    .await;
    assert_eq!(first, [(false, "hello back".to_owned())]);
    let id = session.lock().clone().expect("a session was created");

    let load_cwd = cwd.clone();
    let loaded_id = id.clone();
    let second = with_server(store.path(), async move |cx: Agent| {
        initialize(&cx).await?;
        let unknown = cx
            .send_request(LoadSessionRequest::new("acp-nope", load_cwd.clone()))
            .block_task()
            .await
            .expect_err("an unknown session is refused");
        assert!(
            unknown.message.contains("no stored session `acp-nope`"),
            "{unknown:?}"
        );
        cx.send_request(LoadSessionRequest::new(loaded_id.clone(), load_cwd.clone()))
            .block_task()
            .await?;
        let twice = cx
            .send_request(LoadSessionRequest::new(loaded_id.clone(), load_cwd))
            .block_task()
            .await
            .expect_err("an open session is not loaded again");
        assert!(twice.message.contains("already open"), "{twice:?}");
        let answered = cx
            .send_request(PromptRequest::new(loaded_id, text("say hello again")))
            .block_task()
            .await?;
        assert_eq!(answered.stop_reason, StopReason::EndTurn);
        Ok(())
    })
    .await;
    assert_eq!(
        second,
        [
            (true, "say hello".to_owned()),
            (false, "hello back".to_owned()),
            (false, "hello back".to_owned()),
        ],
        "the history replayed, then the new answer streamed"
    );
    let ends = support::only_session_turn_ends(store.path(), &cwd).await;
    assert_eq!(ends, ["completed", "completed"]);
}

/// A client that goes away in the middle of a turn: the server aborts the prompt, disposes the
/// coordinator and shuts its host down, so the stored log ends balanced (the turn, if it began,
/// ended `aborted`) and the server returns cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_turn_leaves_a_balanced_log() {
    let (store, _workspace, cwd) = dirs();
    let session_cwd = cwd.clone();
    with_server(store.path(), async move |cx: Agent| {
        initialize(&cx).await?;
        let session = new_session(&cx, session_cwd).await?;
        // Sent, never awaited: the client closes its end with the turn in flight.
        drop(cx.send_request(PromptRequest::new(session, text("WAIT forever"))));
        Ok(())
    })
    .await;
    let ends = support::only_session_turn_ends(store.path(), &cwd).await;
    assert!(
        ends.is_empty() || ends == ["aborted"],
        "the in-flight turn never began or was aborted: {ends:?}"
    );
}

/// A `session/new` still being served when the client leaves is finished, then wound down with
/// every other session: the server returns only after its host was shut down (no task of it
/// outlives the server), and its log is stored, durable and balanced, with no turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_new_in_flight_at_eof_is_finished_and_wound_down() {
    let (store, _workspace, cwd) = dirs();
    let session_cwd = cwd.clone();
    with_server(store.path(), async move |cx: Agent| {
        initialize(&cx).await?;
        // Sent, never awaited: the client closes its end while the session is being created.
        drop(cx.send_request(NewSessionRequest::new(session_cwd)));
        Ok(())
    })
    .await;
    let ends = support::only_session_turn_ends(store.path(), &cwd).await;
    assert!(ends.is_empty(), "no turn ran: {ends:?}");
}

/// Tells of every turn end of a top-level session (a served coordinator), as its kind.
struct CoordinatorTurnEnds(tokio::sync::mpsc::UnboundedSender<String>);

impl agent::SessionObserver for CoordinatorTurnEnds {
    fn committed(&self, session: &agent::Session, event: &Arc<agent::SessionEvent>) {
        if let agent::EventData::TurnEnd { reason, .. } = &event.data
            && session.header().parent_session.is_none()
        {
            let _ = self.0.send(reason.kind().to_owned());
        }
    }
}

/// A `session/cancel` that reaches a prompt after its turn completed — the prompt still
/// waiting for the background job that turn started — is answered `cancelled`, not
/// `end_turn`, and stops the job: nothing more is streamed for the cancelled prompt, and the
/// next prompt is answered instead of waiting for a job that would never end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_while_background_work_runs_answers_cancelled_and_stops_the_work() {
    let (store, _workspace, cwd) = dirs();
    let (ended, mut turn_ends) = tokio::sync::mpsc::unbounded_channel();
    let observers: Vec<Arc<dyn agent::SessionObserver>> = vec![Arc::new(CoordinatorTurnEnds(ended))];
    let updates = with_server_observed(store.path(), observers, async move |cx: Agent| {
        initialize(&cx).await?;
        let session = new_session(&cx, cwd).await?;
        let waiting = cx.send_request(PromptRequest::new(session.clone(), text("START-BACKGROUND")));
        // The turn that started the job is over; the prompt now waits for the job.
        assert_eq!(turn_ends.recv().await.as_deref(), Some("completed"));
        cx.send_notification(CancelNotification::new(session.clone()))?;
        assert_eq!(waiting.block_task().await?.stop_reason, StopReason::Cancelled);
        // A failure guard only: a job left running would keep this prompt waiting for good.
        let next = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            cx.send_request(PromptRequest::new(session, text("say hello")))
                .block_task(),
        )
        .await
        .expect("the next prompt does not wait for the cancelled prompt's job")?;
        assert_eq!(next.stop_reason, StopReason::EndTurn);
        assert_eq!(turn_ends.recv().await.as_deref(), Some("completed"));
        assert!(turn_ends.try_recv().is_err(), "no turn ran for a job notice");
        Ok(())
    })
    .await;
    let agent_texts: Vec<&str> = updates
        .iter()
        .filter(|(user, _)| !user)
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(agent_texts, ["Starting.", "\n\nStarted.", "hello back"]);
}

/// Two `session/load`s of one stored session sent together: one resumes it, the other is
/// refused as already open — the session is never resumed twice (two hosts appending to one
/// log, one of them never shut down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_loads_of_one_session_at_once_resume_it_once() {
    let (store, _workspace, cwd) = dirs();
    let id = stored_session(store.path(), &cwd, "say hello").await;
    with_server(store.path(), async move |cx: Agent| {
        initialize(&cx).await?;
        let first = cx.send_request(LoadSessionRequest::new(id.clone(), cwd.clone()));
        let second = cx.send_request(LoadSessionRequest::new(id.clone(), cwd));
        let (first, second) = futures::join!(first.block_task(), second.block_task());
        let refused: Vec<_> = [first.err(), second.err()].into_iter().flatten().collect();
        assert_eq!(refused.len(), 1, "exactly one load is refused: {refused:?}");
        assert!(refused[0].message.contains("already open"), "{refused:?}");
        let answered = cx
            .send_request(PromptRequest::new(id, text("say hello again")))
            .block_task()
            .await?;
        assert_eq!(answered.stop_reason, StopReason::EndTurn);
        Ok(())
    })
    .await;
}

/// A subagent's stored session is not served on its own: `session/load` of a child's id is
/// refused with a clear error, and the child's log is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subagents_session_is_refused_by_session_load() {
    let (store, _workspace, cwd) = dirs();
    stored_session(store.path(), &cwd, "DELEGATE").await;
    let stored = agent_loop::JsonlStore::new(store.path());
    let sessions = agent::SessionPersistence::list(&stored).await.expect("listed");
    let child = sessions
        .iter()
        .find(|h| h.parent_session.is_some())
        .expect("the delegation stored its child")
        .id
        .clone();
    let before = std::fs::read(stored.path_of(&child).expect("a valid id")).expect("the child's log");
    let child_id = child.to_string();
    with_server(store.path(), async move |cx: Agent| {
        initialize(&cx).await?;
        let refused = cx
            .send_request(LoadSessionRequest::new(child_id.clone(), cwd))
            .block_task()
            .await
            .expect_err("a subagent's session is refused");
        assert!(
            refused.message.contains("is a subagent of") && refused.message.contains(&child_id),
            "{refused:?}"
        );
        Ok(())
    })
    .await;
    let after = std::fs::read(stored.path_of(&child).expect("a valid id")).expect("the child's log");
    assert_eq!(before, after, "the child's log is untouched");
}

/// Serves one session on `store` at `cwd` that answers `prompt` (`end_turn`); returns its id.
async fn stored_session(store: &std::path::Path, cwd: &std::path::Path, prompt: &'static str) -> String {
    let id: Arc<Mutex<Option<String>>> = Arc::default();
    let (created, cwd) = (id.clone(), cwd.to_owned());
    with_server(store, async move |cx: Agent| {
        initialize(&cx).await?;
        let session = new_session(&cx, cwd).await?;
        let answered = cx
            .send_request(PromptRequest::new(session.clone(), text(prompt)))
            .block_task()
            .await?;
        assert_eq!(answered.stop_reason, StopReason::EndTurn);
        *created.lock() = Some(session.0.to_string());
        Ok(())
    })
    .await;
    id.lock().clone().expect("a session was created")
}

/// A `session/load` of an id no session can have in the store (empty, or naming a path: `/`,
/// `..`) is the client's bad request: refused as invalid params, naming the id — not reported
/// as an internal failure of the server — and nothing is stored for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_of_an_id_no_session_can_have_is_refused_as_invalid_params() {
    let (store, _workspace, cwd) = dirs();
    with_server(store.path(), async move |cx: Agent| {
        initialize(&cx).await?;
        for id in ["", "../escape", "a/b"] {
            let refused = cx
                .send_request(LoadSessionRequest::new(id, cwd.clone()))
                .block_task()
                .await
                .expect_err("an id no session can have is refused");
            assert_eq!(
                refused.code,
                agent_client_protocol::ErrorCode::INVALID_PARAMS,
                "{id:?}: {refused:?}"
            );
            assert!(refused.message.contains(&format!("`{id}`")), "{refused:?}");
        }
        Ok(())
    })
    .await;
    let stored: Vec<_> = std::fs::read_dir(store.path()).expect("the store").collect();
    assert!(stored.is_empty(), "nothing stored: {stored:?}");
}

/// The server stopped while its client is still connected ([`serve_until`]: the program's first
/// Ctrl-C or SIGTERM) with a prompt waiting for the background job its turn started: the
/// prompt is answered `cancelled` (ACP: a prompt the agent cancels ends `cancelled`), the job
/// is stopped, a new request is refused, and the server returns on its own — the client never
/// closing its end — with every log balanced (the stored logs replay without violations).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_the_client_connected_answers_running_prompts_cancelled_and_winds_down() {
    let (store, _workspace, cwd) = dirs();
    let observer = InvariantObserver::shared();
    let (ended, mut turn_ends) = tokio::sync::mpsc::unbounded_channel();
    let options = ServeOptions {
        adapter: Arc::new(Answers),
        model_provider: "mock".to_owned(),
        model_name: "mock".to_owned(),
        max_tokens: None,
        max_steps_per_turn: Some(5),
        store_dir: store.path().to_owned(),
        session_observers: vec![observer.clone(), Arc::new(CoordinatorTurnEnds(ended))],
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (client_end, server_end) = tokio::io::duplex(1 << 16);
    let (server_read, server_write) = tokio::io::split(server_end);
    let server = tokio::spawn(serve_until(options, server_read, server_write, async move {
        let _ = stopped.await;
    }));
    let (client_read, client_write) = tokio::io::split(client_end);
    let transport = ByteStreams::new(client_write.compat_write(), client_read.compat());
    let session_cwd = cwd.clone();
    let server = Client
        .v1()
        .name("test-client")
        .connect_with(transport, async move |cx: Agent| {
            initialize(&cx).await?;
            let session = new_session(&cx, session_cwd.clone()).await?;
            let waiting = cx.send_request(PromptRequest::new(session, text("START-BACKGROUND")));
            // The turn that started the job is over; the prompt now waits for the job.
            assert_eq!(turn_ends.recv().await.as_deref(), Some("completed"));
            stop.send(()).expect("the server listens for its stop");
            assert_eq!(waiting.block_task().await?.stop_reason, StopReason::Cancelled);
            // The server stopped taking requests before it answered the prompt.
            let refused = cx
                .send_request(NewSessionRequest::new(session_cwd))
                .block_task()
                .await;
            assert!(
                refused.is_err(),
                "a request after the stop is refused: {refused:?}"
            );
            // The client stays connected: the server ends by itself.
            let server = server.await;
            assert!(turn_ends.try_recv().is_err(), "no turn ran after the stop");
            Ok(server)
        })
        .await
        .expect("the client's exchange succeeds");
    server.expect("the server task").expect("the server ends cleanly");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    let report = invariants::check_store(store.path()).expect("the store replays");
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(
        report.logs, 2,
        "the coordinator's and the background child's logs"
    );
}
