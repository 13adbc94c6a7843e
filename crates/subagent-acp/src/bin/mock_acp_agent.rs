//! The scripted mock ACP agent (spec `acp-and-tools.md` §1.16): a real subprocess speaking ACP v1
//! on its own stdin/stdout, scripted entirely by environment variables (no model, no network).
//! Test support for this crate's integration tests; not a product binary.
//!
//! | variable | behaviour |
//! |---|---|
//! | `MOCK_TEXT` | text streamed as one `agent_message_chunk` (default `mock child answer`) |
//! | `MOCK_STREAM_CHUNKS=<n>:<size>` | stream `n` chunks of `size` bytes instead: chunk `i` repeats the letter `a + i % 26` |
//! | `MOCK_ECHO_ENV=<NAME>` | stream the value of NAME instead (or `<NAME unset>`) |
//! | `MOCK_ECHO_CWD=1` | stream the real cwd, a newline, then the `cwd` announced in `session/new` |
//! | `MOCK_STOP` | the stop reason string returned (default `end_turn`; any string is sent verbatim) |
//! | `MOCK_SESSION_ID` | fixed session id (default random) |
//! | `MOCK_MISSING_SESSION_ID=1` | answer `session/new` with `{}` |
//! | `MOCK_NEWSESSION_READY` + `MOCK_NEWSESSION_GO` | touch READY on entering `session/new`, then wait for GO |
//! | `MOCK_PERMISSION=1` | ask permission (`yes`/allow_once, `no`/reject_once); `cancelled` → stop `cancelled` |
//! | `MOCK_NO_ALLOW=1` | with `MOCK_PERMISSION`, offer only the reject option |
//! | `MOCK_WRITE_FILE=<name>` | with `MOCK_PERMISSION`, once permitted write `proof` to `<name>` in the process cwd (a denied request writes nothing) |
//! | `MOCK_THOUGHT=1` | send an `agent_thought_chunk` before the message chunk |
//! | `MOCK_HANG=1` | after streaming, wait for `session/cancel`, then answer `cancelled` |
//! | `MOCK_IGNORE_CANCEL=1` | with hang: receive `session/cancel` but never answer |
//! | `MOCK_ASK_AFTER_CANCEL=<path>` | with hang: on `session/cancel` first ask permission (`yes`/allow_once, `no`/reject_once), write the answer (`selected:<id>` or `cancelled`) to path, then answer `cancelled` |
//! | `MOCK_CRASH_ON_CANCEL=1` | exit(1) on `session/cancel` |
//! | `MOCK_CRASH_ON_PROMPT=1` | stream the text, then exit(1) without answering the prompt |
//! | `MOCK_READY_FILE` | touched once the prompt handler streamed its chunk, or once a SIGTERM trap is armed |
//! | `MOCK_FLUSH_ON_EOF=<path>` | on stdin EOF wait `MOCK_FLUSH_DELAY_MS` (default 150), touch path, exit 0 |
//! | `MOCK_TRAP_SIGTERM=1` | ignore SIGTERM and stay alive past EOF (forces the SIGKILL tier) |
//! | `MOCK_IGNORE_EOF=1` | stay alive past EOF; on SIGTERM touch `MOCK_SIGTERM_FILE` (if set) and exit 0 |
//! | `MOCK_PID_FILE` | write the process id to this path at startup |
//! | `MOCK_BAD_LINE=<kind>` | during the prompt, after streaming, write one raw non-protocol line to stdout, then go on: `long:<n>` (`n` bytes of `x`), `utf8` (JSON whose string holds invalid UTF-8), `json` (text that is not JSON) |
//! | `MOCK_BAD_LINE_AT_START=1` | write that line at startup instead, before reading anything |

use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, InitializeRequest, InitializeResponse,
    NewSessionRequest, PermissionOption, PermissionOptionKind, PromptRequest, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId, SessionNotification, SessionUpdate, TextContent, ToolCallUpdate,
    ToolCallUpdateFields,
};
use agent_client_protocol::{Agent, ByteStreams, Client, JsonRpcMessage, JsonRpcRequest, UntypedMessage};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

/// A request whose params are typed and whose response the mock writes as raw JSON (so it can
/// omit `sessionId` or send an unknown stop reason).
macro_rules! raw_request {
    ($name:ident, $params:ty, $method:literal) => {
        #[derive(Clone, Debug)]
        struct $name($params);

        impl JsonRpcMessage for $name {
            fn matches_method(method: &str) -> bool {
                method == $method
            }
            fn method(&self) -> &str {
                $method
            }
            fn to_untyped_message(&self) -> Result<UntypedMessage, agent_client_protocol::Error> {
                UntypedMessage::new($method, &self.0)
            }
            fn parse_message(method: &str, params: &Value) -> Result<Self, agent_client_protocol::Error> {
                if method != $method {
                    return Err(agent_client_protocol::Error::method_not_found());
                }
                serde_json::from_value(params.clone())
                    .map(Self)
                    .map_err(|_| agent_client_protocol::Error::invalid_params())
            }
        }

        impl JsonRpcRequest for $name {
            type Response = Value;
        }
    };
}

raw_request!(NewSession, NewSessionRequest, "session/new");
raw_request!(Prompt, PromptRequest, "session/prompt");

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn flag(name: &str) -> bool {
    var(name).as_deref() == Some("1")
}

fn touch(path: &str) {
    if let Err(error) = std::fs::write(path, b"") {
        eprintln!("mock_acp_agent: cannot touch {path}: {error}");
    }
}

struct State {
    announced_cwd: Mutex<Option<String>>,
    cancelled: Notify,
}

fn chunk(session: &SessionId, text: String, thought: bool) -> SessionNotification {
    let content = ContentChunk::new(ContentBlock::Text(TextContent::new(text)));
    let update = if thought {
        SessionUpdate::AgentThoughtChunk(content)
    } else {
        SessionUpdate::AgentMessageChunk(content)
    };
    SessionNotification::new(session.clone(), update)
}

fn permission_options() -> Vec<PermissionOption> {
    let mut options = Vec::new();
    if !flag("MOCK_NO_ALLOW") {
        options.push(PermissionOption::new(
            "yes".to_owned(),
            "Yes".to_owned(),
            PermissionOptionKind::AllowOnce,
        ));
    }
    options.push(PermissionOption::new(
        "no".to_owned(),
        "No".to_owned(),
        PermissionOptionKind::RejectOnce,
    ));
    options
}

/// The raw line `MOCK_BAD_LINE` asks for (newline included), if any.
fn bad_line() -> Option<Vec<u8>> {
    let kind = var("MOCK_BAD_LINE")?;
    let mut line = match kind.as_str() {
        "utf8" => b"{\"jsonrpc\":\"2.0\",\"method\":\"x/\xff\xfe\"}".to_vec(),
        "json" => b"this is not json".to_vec(),
        other => {
            let n = other
                .strip_prefix("long:")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("mock_acp_agent: unknown MOCK_BAD_LINE {other:?}"));
            vec![b'x'; n]
        }
    };
    line.push(b'\n');
    Some(line)
}

/// Writes `line` to stdout under the process-wide stdout lock, flushed: the engine's own writes
/// go through the same lock one whole line at a time, so the lines never interleave.
fn write_raw(line: &[u8]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(error) = out.write_all(line).and_then(|()| out.flush()) {
        eprintln!("mock_acp_agent: cannot write the bad line: {error}");
    }
}

/// The `MOCK_STREAM_CHUNKS` script, `(n, size)`, if any.
fn stream_chunks() -> Option<(usize, usize)> {
    let spec = var("MOCK_STREAM_CHUNKS")?;
    let parsed = spec
        .split_once(':')
        .and_then(|(n, size)| Some((n.parse().ok()?, size.parse().ok()?)));
    Some(parsed.unwrap_or_else(|| panic!("mock_acp_agent: MOCK_STREAM_CHUNKS {spec:?} is not <n>:<size>")))
}

/// Chunk `i` of a `MOCK_STREAM_CHUNKS` stream: `size` copies of the letter `a + i % 26`.
fn stream_chunk(i: usize, size: usize) -> String {
    let letter = char::from(b'a' + (i % 26) as u8);
    std::iter::repeat_n(letter, size).collect()
}

fn answer_text(state: &State) -> String {
    if let Some(name) = var("MOCK_ECHO_ENV") {
        return std::env::var(&name).unwrap_or_else(|_| format!("<{name} unset>"));
    }
    if flag("MOCK_ECHO_CWD") {
        let real = std::env::current_dir()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let announced = state.announced_cwd.lock().clone().unwrap_or_default();
        return format!("{real}\n{announced}");
    }
    var("MOCK_TEXT").unwrap_or_else(|| "mock child answer".to_owned())
}

async fn run_prompt(
    state: Arc<State>,
    cx: ConnectionTo<Client>,
    session: SessionId,
) -> Result<Value, agent_client_protocol::Error> {
    if flag("MOCK_THOUGHT") {
        cx.send_notification(chunk(&session, "private thought".to_owned(), true))?;
    }
    if let Some((n, size)) = stream_chunks() {
        for i in 0..n {
            cx.send_notification(chunk(&session, stream_chunk(i, size), false))?;
        }
    } else {
        cx.send_notification(chunk(&session, answer_text(&state), false))?;
    }
    if let Some(line) = bad_line().filter(|_| !flag("MOCK_BAD_LINE_AT_START")) {
        write_raw(&line);
    }
    if flag("MOCK_CRASH_ON_PROMPT") {
        // Give the chunk a moment to leave the pipe, then die without answering.
        tokio::time::sleep(Duration::from_millis(50)).await;
        std::process::exit(1);
    }
    if let Some(ready) = var("MOCK_READY_FILE") {
        touch(&ready);
    }
    if flag("MOCK_PERMISSION") {
        let request = RequestPermissionRequest::new(
            session.clone(),
            ToolCallUpdate::new("mock-call", ToolCallUpdateFields::new()),
            permission_options(),
        );
        let response = cx.send_request(request).block_task().await?;
        if let RequestPermissionOutcome::Cancelled = response.outcome {
            return Ok(json!({"stopReason": "cancelled"}));
        }
        if let Some(name) = var("MOCK_WRITE_FILE")
            && let Err(error) = std::fs::write(&name, b"proof")
        {
            eprintln!("mock_acp_agent: cannot write {name}: {error}");
            return Ok(json!({"stopReason": "refusal"}));
        }
        cx.send_notification(chunk(&session, " (permitted)".to_owned(), false))?;
    }
    if flag("MOCK_HANG") {
        state.cancelled.notified().await;
        if let Some(outcome_file) = var("MOCK_ASK_AFTER_CANCEL") {
            // A tool call racing the cancellation: the client must not approve it any more.
            let request = RequestPermissionRequest::new(
                session.clone(),
                ToolCallUpdate::new("late-call", ToolCallUpdateFields::new()),
                permission_options(),
            );
            let outcome = match cx.send_request(request).block_task().await?.outcome {
                RequestPermissionOutcome::Selected(selected) => format!("selected:{}", selected.option_id),
                _ => "cancelled".to_owned(),
            };
            // Written aside, then renamed: a waiter never reads a half-written answer.
            let partial = format!("{outcome_file}.partial");
            if let Err(error) =
                std::fs::write(&partial, outcome).and_then(|()| std::fs::rename(&partial, &outcome_file))
            {
                eprintln!("mock_acp_agent: cannot write {outcome_file}: {error}");
            }
        }
        if flag("MOCK_IGNORE_CANCEL") {
            std::future::pending::<()>().await;
        }
        return Ok(json!({"stopReason": "cancelled"}));
    }
    let stop = var("MOCK_STOP").unwrap_or_else(|| "end_turn".to_owned());
    Ok(json!({"stopReason": stop}))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Some(path) = var("MOCK_PID_FILE") {
        let _ = std::fs::write(path, std::process::id().to_string());
    }
    #[cfg(unix)]
    arm_signals();
    if let Some(line) = bad_line().filter(|_| flag("MOCK_BAD_LINE_AT_START")) {
        write_raw(&line);
    }

    let state = Arc::new(State {
        announced_cwd: Mutex::new(None),
        cancelled: Notify::new(),
    });
    let session_id = var("MOCK_SESSION_ID").unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let transport = ByteStreams::new(tokio::io::stdout().compat_write(), tokio::io::stdin().compat());
    let (s1, s2, s3) = (state.clone(), state.clone(), state.clone());
    let served = Agent
        .v1()
        .name("mock-acp-agent")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                responder.respond(
                    InitializeResponse::new(request.protocol_version)
                        .agent_capabilities(AgentCapabilities::new()),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSession, responder, cx: ConnectionTo<Client>| {
                *s1.announced_cwd.lock() = Some(request.0.cwd.display().to_string());
                let session_id = session_id.clone();
                cx.spawn(async move {
                    if let (Some(ready), Some(go)) = (var("MOCK_NEWSESSION_READY"), var("MOCK_NEWSESSION_GO"))
                    {
                        touch(&ready);
                        while !std::path::Path::new(&go).exists() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    if flag("MOCK_MISSING_SESSION_ID") {
                        responder.respond(json!({}))
                    } else {
                        responder.respond(json!({"sessionId": session_id}))
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: Prompt, responder, cx: ConnectionTo<Client>| {
                let state = s2.clone();
                let session = request.0.session_id.clone();
                let inner = cx.clone();
                cx.spawn(async move {
                    let answer = run_prompt(state, inner, session).await?;
                    responder.respond(answer)
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |_cancel: CancelNotification, _cx| {
                if flag("MOCK_CRASH_ON_CANCEL") {
                    std::process::exit(1);
                }
                s3.cancelled.notify_waiters();
                s3.cancelled.notify_one();
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_to(transport)
        .await;
    if let Err(error) = served {
        eprintln!("mock_acp_agent: connection ended with an error: {error}");
    }
    // stdin reached EOF.
    if let Some(path) = var("MOCK_FLUSH_ON_EOF") {
        let delay = var("MOCK_FLUSH_DELAY_MS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(150);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        touch(&path);
        std::process::exit(0);
    }
    if flag("MOCK_IGNORE_EOF") || flag("MOCK_TRAP_SIGTERM") {
        std::future::pending::<()>().await;
    }
    std::process::exit(0);
}

#[cfg(unix)]
fn arm_signals() {
    use tokio::signal::unix::{SignalKind, signal};
    if flag("MOCK_TRAP_SIGTERM") {
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
        tokio::spawn(async move { while term.recv().await.is_some() {} });
        if let Some(ready) = var("MOCK_READY_FILE") {
            touch(&ready);
        }
    } else if flag("MOCK_IGNORE_EOF") {
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
        tokio::spawn(async move {
            term.recv().await;
            if let Some(marker) = var("MOCK_SIGTERM_FILE") {
                touch(&marker);
            }
            std::process::exit(0);
        });
        if let Some(ready) = var("MOCK_READY_FILE") {
            touch(&ready);
        }
    }
}
