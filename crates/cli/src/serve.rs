//! `subagent acp`: the harness's own agent served over the Agent Client Protocol (ACP v1), so an
//! ACP client — an editor, or another harness's `acp` provider — can delegate to it.
//!
//! Every `session/new` composes a fresh [`Host`] rooted at the session's `cwd` (its read-only
//! workspace tools confined there, its logs in the configured store) with one coordinator agent
//! whose session id is the ACP session id. Every `session/prompt` delivers the prompt's text
//! blocks as one turn, streams the coordinator's visible text to the client as its log records
//! it (one `agent_message_chunk` per text delta, a blank line between the texts of different
//! model steps) and, once the coordinator has settled (its delegations and background jobs
//! included), answers with the stop reason of the turn: `completed` → `end_turn`, `max-tokens`
//! → `max_tokens`, `blocked` → `refusal`, `aborted`/`interrupted` → `cancelled`; a failed turn
//! answers with a JSON-RPC error carrying the failure. `session/cancel` cancels the running
//! prompt: its turn (cause `user`) and the background jobs it left running are stopped, and it
//! is answered `cancelled` — also when its turn had completed and the prompt was still waiting
//! for those jobs, or was about to be answered (a cancel handled before the answer is sent is
//! never lost). `session/load` cold-resumes a top-level session the store holds (from an
//! earlier run of the server; a subagent's session is refused, and so is a second load of a
//! session already open or being loaded, and an id no stored session can have), replays its
//! conversation to the client, and serves it like a new one.
//!
//! # Ownership and shutdown
//! [`serve`] owns every session and every request task. When the input ends (the client closed
//! it, or went away) or the connection fails, it lets every `session/new` and `session/load`
//! still being served finish (they do not wait on the model; a creation cut short would leave
//! its host undisposed), aborts the prompts still running, waits for them, then disposes every
//! coordinator and shuts every host down, so each session log ends balanced and durable; only
//! then does it return. [`serve_until`] can also be told to stop while the client is still
//! connected (`subagent acp` does so on its first Ctrl-C or SIGTERM): no request starts anything
//! new from then on, every running prompt is cancelled as `session/cancel` cancels it and
//! answered `cancelled`, and once all are answered the connection is closed and the sessions
//! wound down the same way. A client that hangs up (its end of the output closed: writing fails
//! with a broken pipe or a reset) is not a connection failure: what would still have been sent
//! to it is discarded, and its input's end winds the sessions down as usual. Permission
//! requests are never sent: the served agent has no tool that needs one (its workspace tools
//! only read). MCP servers offered in `session/new` are not connected: the session runs without
//! them, with a `tracing` warning (which `subagent acp` prints on stderr).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use agent::{
    AgentError, AgentHandle, CancelCause, CancelOptions, EventData, ModelAdapter, Session, SessionEvent,
    SessionId, SessionObserver, StreamChunk, TurnEndReason,
};
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, InitializeRequest, InitializeResponse,
    LoadSessionRequest, LoadSessionResponse, NewSessionRequest, NewSessionResponse, PromptRequest,
    PromptResponse, SessionId as SessionIdWire, SessionNotification, SessionUpdate, StopReason, TextContent,
};
use agent_client_protocol::{Agent as AcpAgent, ByteStreams, Client, Error as AcpError, ErrorCode};
use agent_loop::StoreError;
use agent_loop::jobs::KillOutcome;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinSet;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;

use crate::CliError;
use crate::host::{Host, HostError, HostOptions, build_host};
use crate::workspace::Workspace;

/// What every served session is composed from.
#[derive(Clone)]
pub struct ServeOptions {
    /// The model adapter every agent uses.
    pub adapter: Arc<dyn ModelAdapter>,
    /// The provider route the adapter is registered under.
    pub model_provider: String,
    /// The model name agents ask for.
    pub model_name: String,
    /// Optional output-token cap per model call.
    pub max_tokens: Option<u64>,
    /// The most model steps one turn of any agent may take ([`HostOptions::max_steps_per_turn`]).
    pub max_steps_per_turn: Option<u32>,
    /// Where every session's logs are stored (absolute, so a session's `cwd` cannot move it).
    pub store_dir: PathBuf,
    /// Observers installed into every session (an online invariant checker in tests).
    pub session_observers: Vec<Arc<dyn SessionObserver>>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("model_provider", &self.model_provider)
            .field("model_name", &self.model_name)
            .field("max_tokens", &self.max_tokens)
            .field("max_steps_per_turn", &self.max_steps_per_turn)
            .field("store_dir", &self.store_dir)
            .finish_non_exhaustive()
    }
}

/// One served ACP session: its host and its coordinator.
struct Served {
    host: Host,
    coordinator: AgentHandle,
    /// Forwards the coordinator's text to the client (installed into its session).
    stream: Arc<TextStream>,
    /// The running prompt's cancellation, registered when its request arrives (so a
    /// `session/cancel` that follows it always reaches it); a second prompt is refused while it
    /// is set.
    prompt: Mutex<Option<CancellationToken>>,
}

/// Everything a connection's handlers share.
struct State {
    options: ServeOptions,
    sessions: Mutex<HashMap<String, Arc<Served>>>,
    /// The ids a `session/load` is opening (not yet in `sessions`): while one load of an id is
    /// under way, another is refused as if the session were open. Locked after `sessions`.
    loading: Mutex<HashSet<String>>,
    /// `session/new` and `session/load` tasks; reaped as they finish, finished at shutdown.
    setups: Mutex<JoinSet<()>>,
    /// `session/prompt` tasks; reaped as they finish, aborted at shutdown.
    prompts: Mutex<JoinSet<()>>,
    /// Set once the input ended: no task is spawned after that.
    closed: AtomicBool,
}

impl State {
    /// Spawns a request task on `tasks` (one of the two sets), unless the input has ended.
    fn spawn(&self, tasks: &Mutex<JoinSet<()>>, task: impl Future<Output = ()> + Send + 'static) {
        let mut tasks = tasks.lock();
        while tasks.try_join_next().is_some() {}
        if !self.closed.load(Ordering::Acquire) {
            tasks.spawn(task);
        }
    }

    /// Refuses a request that would start something (a session, a prompt) once the server is
    /// stopping or the input has ended.
    fn open_for_requests(&self) -> Result<(), AcpError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(internal("the server is shutting down".to_owned()));
        }
        Ok(())
    }

    /// A fresh host for one session rooted at `cwd` (checked: absolute, an existing directory).
    fn session_host(&self, cwd: &Path, mcp_servers: usize) -> Result<Host, AcpError> {
        let cwd = session_cwd(cwd)?;
        if mcp_servers > 0 {
            tracing::warn!(
                servers = mcp_servers,
                "subagent acp: MCP servers are not supported; the session runs without them"
            );
        }
        let workspace = Workspace::new(&cwd)
            .map_err(|e| invalid_params(format!("cannot use cwd {}: {e}", cwd.display())))?;
        let mut options = HostOptions::new(
            &self.options.store_dir,
            self.options.adapter.clone(),
            self.options.model_provider.clone(),
            self.options.model_name.clone(),
        );
        options.max_tokens = self.options.max_tokens;
        options.max_steps_per_turn = self.options.max_steps_per_turn;
        options.persona = Some(crate::model_text::run_persona(workspace.root()));
        options.cwd = Some(cwd);
        options.workspace = Some(workspace);
        options.deliver_job_notices = true;
        options.session_observers = self.options.session_observers.clone();
        build_host(options).map_err(|e| internal(format!("cannot start the host: {e}")))
    }

    async fn new_session(
        &self,
        request: NewSessionRequest,
        cx: ConnectionTo<Client>,
    ) -> Result<NewSessionResponse, AcpError> {
        let host = self.session_host(&request.cwd, request.mcp_servers.len())?;
        let id = format!("acp-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let coordinator = host.create_agent(SessionId::new(id.clone())).await;
        self.open(host, coordinator, cx).await?;
        Ok(NewSessionResponse::new(id))
    }

    /// `session/load`: cold-resumes a session this store holds (created by an earlier
    /// `subagent acp`) rooted at the request's `cwd`, replays its conversation to the client —
    /// each user prompt as a `user_message_chunk`, each assistant text as an
    /// `agent_message_chunk`, in order — and serves it like a new one.
    async fn load_session(
        &self,
        request: LoadSessionRequest,
        cx: ConnectionTo<Client>,
    ) -> Result<LoadSessionResponse, AcpError> {
        let id = request.session_id.0.to_string();
        let _loading = self.reserve(&id)?;
        let host = self.session_host(&request.cwd, request.mcp_servers.len())?;
        // A subagent's session continues only under its parent (its lineage, its parent's
        // tools and policy): served on its own, its log would take turns its parent never
        // asked for. Looked at before the resume, which already writes to the log. Any other
        // failure to read the header is left to the resume, which reports it.
        let refused = match host.store().inspect(&SessionId::new(id.clone())).await {
            Ok(header) => header.parent_session.map(|parent| {
                format!("session `{id}` is a subagent of `{parent}`; only a top-level session can be loaded")
            }),
            // The client's id cannot name a stored session at all (empty, or a path).
            Err(StoreError::InvalidId(_)) => Some(format!("`{id}` is not a valid session id")),
            Err(_) => None,
        };
        if let Some(refused) = refused {
            discard(host).await;
            return Err(invalid_params(refused));
        }
        let coordinator = host.resume_agent(SessionId::new(id.clone())).await;
        let served = self.open(host, coordinator, cx.clone()).await?;
        for event in served.coordinator.agent().session().events().iter() {
            let update = match &event.data {
                EventData::UserMessage(message) if message.source.kind() == "user" => {
                    SessionUpdate::UserMessageChunk(text_chunk(message.text()))
                }
                EventData::AssistantMessage { message, .. } if !message.text().is_empty() => {
                    SessionUpdate::AgentMessageChunk(text_chunk(message.text()))
                }
                _ => continue,
            };
            cx.send_notification(SessionNotification::new(request.session_id.clone(), update))?;
        }
        Ok(LoadSessionResponse::new())
    }

    /// Claims `id` for a `session/load` until the returned guard drops (by then the session is
    /// in `sessions`, or the load failed): refused while the session is open or another load of
    /// it is under way, so two loads of one id never resume it twice.
    fn reserve(&self, id: &str) -> Result<Loading<'_>, AcpError> {
        let sessions = self.sessions.lock();
        if sessions.contains_key(id) || !self.loading.lock().insert(id.to_owned()) {
            return Err(invalid_params(format!("session `{id}` is already open")));
        }
        Ok(Loading {
            state: self,
            id: id.to_owned(),
        })
    }

    /// Registers a session whose coordinator was just created or resumed on `host` (streaming
    /// its text to `cx`); a failed creation shuts the unused host down and is the error.
    async fn open(
        &self,
        host: Host,
        coordinator: Result<AgentHandle, HostError>,
        cx: ConnectionTo<Client>,
    ) -> Result<Arc<Served>, AcpError> {
        let coordinator = match coordinator {
            Ok(handle) => handle,
            Err(e) => {
                let error = match &e {
                    HostError::Agent(AgentError::NotFound(id)) => {
                        invalid_params(format!("no stored session `{id}`"))
                    }
                    _ => internal(format!("cannot start the session's agent: {e}")),
                };
                discard(host).await;
                return Err(error);
            }
        };
        let id = coordinator.id().to_string();
        let stream = Arc::new(TextStream {
            session: SessionIdWire::new(id.as_str()),
            cx,
            last_step: Mutex::new(None),
        });
        coordinator.agent().session().add_observer(stream.clone());
        let served = Arc::new(Served {
            host,
            coordinator,
            stream,
            prompt: Mutex::new(None),
        });
        self.sessions.lock().insert(id, served.clone());
        Ok(served)
    }

    /// Admits a prompt as its request arrives (handlers run one at a time, in arrival order):
    /// the session exists, the prompt has text, and no other prompt is running. Registers the
    /// prompt's cancellation.
    fn admit(&self, request: &PromptRequest) -> Result<(Arc<Served>, String, CancellationToken), AcpError> {
        self.open_for_requests()?;
        let session = &request.session_id;
        let served = self
            .sessions
            .lock()
            .get(&*session.0)
            .cloned()
            .ok_or_else(|| invalid_params(format!("unknown session `{}`", session.0)))?;
        let text = prompt_text(&request.prompt);
        if text.trim().is_empty() {
            return Err(invalid_params("the prompt has no text".to_owned()));
        }
        let token = CancellationToken::new();
        {
            let mut running = served.prompt.lock();
            if running.is_some() {
                return Err(AcpError::new(
                    ErrorCode::INVALID_REQUEST,
                    format!("a prompt is already running in session `{}`", session.0),
                ));
            }
            *running = Some(token.clone());
        }
        Ok((served, text, token))
    }

    /// Runs an admitted prompt to its response (its text streamed meanwhile), hands the response
    /// to `answer` (which sends it) and releases the session for the next prompt.
    ///
    /// The response is decided, sent and the session released in one step that
    /// [`cancel`](Self::cancel) cannot split: a `session/cancel` handled at any point before it
    /// — even after the prompt's turn has settled `completed`, or failed — makes the response
    /// `cancelled`, as the protocol requires of a prompt whose cancel the agent received; one
    /// handled after it finds no prompt running.
    async fn prompt(
        &self,
        served: Arc<Served>,
        text: String,
        cancel: CancellationToken,
        answer: impl FnOnce(Result<PromptResponse, AcpError>),
    ) {
        let reason = if cancel.is_cancelled() {
            // Cancelled before its turn began: no turn is run.
            Ok(TurnEndReason::Aborted {
                reason: CancelCause::User,
            })
        } else {
            *served.stream.last_step.lock() = None;
            run_prompt(&served, text, &cancel).await
        };
        #[cfg(test)]
        tests::after_turn().await;
        let mut running = served.prompt.lock();
        // A cancel that came after the turn had settled has nothing left to stop: `run_prompt`
        // returned with the coordinator idle and its background jobs settled.
        let reason = if cancel.is_cancelled() {
            Ok(TurnEndReason::Aborted {
                reason: CancelCause::User,
            })
        } else {
            reason
        };
        answer(reason.and_then(stop_reason).map(PromptResponse::new));
        *running = None;
    }

    /// `session/cancel`: cancels the session's running prompt, if any (its turn ends
    /// `aborted`, answered `cancelled`).
    fn cancel(&self, notification: &CancelNotification) {
        let served = self.sessions.lock().get(&*notification.session_id.0).cloned();
        if let Some(served) = served {
            // Cancelled under the lock the prompt's answer is decided under (see `prompt`).
            if let Some(token) = &*served.prompt.lock() {
                token.cancel();
            }
        }
    }

    /// Stops serving while the client is still connected ([`serve_until`]): no request task is
    /// spawned from now on, the session setups under way are finished, then every running
    /// prompt is cancelled (as by `session/cancel`: answered `cancelled`) and waited for.
    async fn stop(&self) {
        self.closed.store(true, Ordering::Release);
        let mut setups = std::mem::take(&mut *self.setups.lock());
        while setups.join_next().await.is_some() {}
        // Every prompt admitted so far has its task in `prompts` (admitted and spawned in one
        // handler run, and nothing is spawned once closed) and its cancellation registered.
        let sessions: Vec<Arc<Served>> = self.sessions.lock().values().cloned().collect();
        for served in sessions {
            if let Some(token) = &*served.prompt.lock() {
                token.cancel();
            }
        }
        let mut prompts = std::mem::take(&mut *self.prompts.lock());
        while prompts.join_next().await.is_some() {}
    }

    /// Ends every request task — session setups finished, prompts aborted — then every
    /// session: coordinators disposed, hosts shut down.
    async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // A setup does not wait on the model, so it is finished rather than cut short: cut, it
        // would drop a host (and a published coordinator) without shutting it down. The
        // session it opens is wound down below with the others.
        let mut setups = std::mem::take(&mut *self.setups.lock());
        while setups.join_next().await.is_some() {}
        let mut prompts = std::mem::take(&mut *self.prompts.lock());
        prompts.abort_all();
        while prompts.join_next().await.is_some() {}
        let sessions: Vec<(String, Arc<Served>)> = self.sessions.lock().drain().collect();
        for (id, served) in sessions {
            // Every task that held a session has ended, so the map held the last reference.
            let Ok(served) = Arc::try_unwrap(served) else {
                tracing::warn!(session = %id, "subagent acp: a session is still shared at shutdown; leaving it");
                continue;
            };
            served.coordinator.dispose().await;
            if let Err(e) = served.host.shutdown().await {
                tracing::warn!(session = %id, error = %e, "subagent acp: shutting a session's host down failed");
            }
        }
    }
}

/// Stops everything a cancelled prompt set going, so nothing of it reaches the client after
/// the answer: the coordinator's turn is aborted, then its background jobs still running are
/// killed (a killed job is reported: its settlement delivers no notice), and a notice that a
/// job delivered before its kill is dropped with the coordinator's inbox.
async fn stop(served: &Served, agent: &agent::AgentRef) {
    agent.cancel(CancelCause::User, CancelOptions::default());
    // Idle: no tool call of the aborted turn starts a job after the kills below.
    agent.when_idle().await;
    let jobs = served.host.jobs();
    for job in jobs.snapshots(agent.id()) {
        if job.status.is_terminal() {
            continue;
        }
        match jobs.kill_job(agent.id(), &job.id, Some(PROMPT_CANCELLED.to_owned())) {
            Ok(KillOutcome::CancelPanicked { message, .. }) => {
                tracing::warn!(job = %job.id, %message, "subagent acp: a background job's cancel panicked");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(job = %job.id, error = %e, "subagent acp: a background job could not be killed")
            }
        }
    }
    agent.cancel(CancelCause::User, CancelOptions::default());
    agent.when_idle().await;
}

/// Why a cancelled prompt's background jobs were killed (their kill reason).
const PROMPT_CANCELLED: &str = "the ACP client cancelled the prompt";

/// A `session/load`'s claim on its session id ([`State::reserve`]), released when dropped.
struct Loading<'a> {
    state: &'a State,
    id: String,
}

impl Drop for Loading<'_> {
    fn drop(&mut self) {
        self.state.loading.lock().remove(&self.id);
    }
}

/// Shuts down a host whose session was refused or could not start.
async fn discard(host: Host) {
    if let Err(e) = host.shutdown().await {
        tracing::warn!(error = %e, "subagent acp: shutting an unused host down failed");
    }
}

/// Runs one turn of `served`'s coordinator (racing `cancel`) until it has settled; returns how
/// its last turn ended — `aborted` whenever `cancel` won, even when the turn itself had
/// already completed and the prompt was only waiting for its background work (the protocol
/// answers a cancelled prompt `cancelled`).
async fn run_prompt(
    served: &Served,
    text: String,
    cancel: &CancellationToken,
) -> Result<TurnEndReason, AcpError> {
    let agent = served.coordinator.agent().clone();
    let from = agent.session().len();
    let turn = tokio::select! {
        // The prompt is delivered before the cancellation is looked at, so a cancel that
        // came first still ends a turn rather than leaving none half-started.
        biased;
        turn = served.host.run_turn(&agent, text) => Some(turn),
        () = cancel.cancelled() => None,
    };
    let Some(turn) = turn else {
        stop(served, &agent).await;
        return Ok(TurnEndReason::Aborted {
            reason: CancelCause::User,
        });
    };
    turn.map_err(|e| internal(format!("the turn could not start: {e}")))?;
    let events = agent.session().events();
    events
        .get(from..)
        .unwrap_or_default()
        .iter()
        .rev()
        .find_map(|e| match &e.data {
            EventData::TurnEnd { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .ok_or_else(|| internal("the turn left no end in the session log".to_owned()))
}

/// Streams a served coordinator's visible text to the client as its session log records it:
/// one `agent_message_chunk` per `text-delta` chunk (reasoning and tool activity are not sent),
/// with a blank line before the first text of a model step that follows text of an earlier
/// one. Installed into the coordinator's session, it runs synchronously at each commit (before
/// the turn can end, so every update precedes the prompt's response) and only enqueues.
struct TextStream {
    session: SessionIdWire,
    cx: ConnectionTo<Client>,
    /// `(turn, step)` of the last text sent for the current prompt.
    last_step: Mutex<Option<(u64, u64)>>,
}

impl SessionObserver for TextStream {
    fn committed(&self, _session: &Session, event: &Arc<SessionEvent>) {
        let EventData::AssistantChunk {
            turn,
            step,
            chunk: StreamChunk::TextDelta { text, .. },
        } = &event.data
        else {
            return;
        };
        if text.is_empty() {
            return;
        }
        let text = {
            let mut last = self.last_step.lock();
            let follows_other_step = last.is_some_and(|at| at != (*turn, *step));
            *last = Some((*turn, *step));
            if follows_other_step {
                format!("\n\n{text}")
            } else {
                text.clone()
            }
        };
        let update = SessionNotification::new(
            self.session.clone(),
            SessionUpdate::AgentMessageChunk(text_chunk(text)),
        );
        if let Err(error) = self.cx.send_notification(update) {
            tracing::debug!(%error, "subagent acp: a text update could not be sent (the client is gone)");
        }
    }
}

/// The session's working directory: an absolute path to an existing directory (ACP requires
/// absolute paths), canonicalized so the workspace confinement and the session header agree.
fn session_cwd(cwd: &Path) -> Result<PathBuf, AcpError> {
    if !cwd.is_absolute() {
        return Err(invalid_params(format!(
            "cwd must be an absolute path, got {}",
            cwd.display()
        )));
    }
    let canonical = cwd
        .canonicalize()
        .map_err(|e| invalid_params(format!("cannot use cwd {}: {e}", cwd.display())))?;
    if !canonical.is_dir() {
        return Err(invalid_params(format!(
            "cwd {} is not a directory",
            cwd.display()
        )));
    }
    Ok(canonical)
}

/// The prompt's text blocks, one per line; every other block (images, resources) is dropped.
fn prompt_text(blocks: &[ContentBlock]) -> String {
    blocks
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The ACP stop reason of a turn end; a failed turn is an error response.
fn stop_reason(reason: TurnEndReason) -> Result<StopReason, AcpError> {
    match reason {
        TurnEndReason::Completed => Ok(StopReason::EndTurn),
        TurnEndReason::MaxTokens => Ok(StopReason::MaxTokens),
        TurnEndReason::Blocked => Ok(StopReason::Refusal),
        TurnEndReason::Aborted { .. } | TurnEndReason::Interrupted => Ok(StopReason::Cancelled),
        TurnEndReason::Error { error } => Err(internal(format!("the turn failed: {error}"))),
        other => Err(internal(format!("the turn ended with `{}`", other.kind()))),
    }
}

fn text_chunk(text: String) -> ContentChunk {
    ContentChunk::new(ContentBlock::Text(TextContent::new(text)))
}

fn invalid_params(message: String) -> AcpError {
    AcpError::new(ErrorCode::INVALID_PARAMS, message)
}

fn internal(message: String) -> AcpError {
    AcpError::new(ErrorCode::INTERNAL_ERROR, message)
}

/// The output to a client that may hang up: a write (or flush) that fails because the client
/// closed its end (a broken pipe or a reset connection) marks the client gone, and everything
/// written from then on is discarded as if sent. Any other failure is passed on.
struct HangUp<W> {
    inner: W,
    gone: bool,
}

impl<W> HangUp<W> {
    fn new(inner: W) -> Self {
        Self { inner, gone: false }
    }

    /// Passes `result` on, unless it is the client hanging up: then the client is gone and the
    /// operation counts as done (`done`).
    fn settle<T>(&mut self, result: std::io::Result<T>, done: T) -> std::io::Result<T> {
        match result {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                tracing::debug!(error = %e, "subagent acp: the client hung up; discarding further output");
                self.gone = true;
                Ok(done)
            }
            other => other,
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for HangUp<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.gone {
            return Poll::Ready(Ok(buf.len()));
        }
        let written = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, buf));
        Poll::Ready(self.settle(written, buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.gone {
            return Poll::Ready(Ok(()));
        }
        let flushed = std::task::ready!(Pin::new(&mut self.inner).poll_flush(cx));
        Poll::Ready(self.settle(flushed, ()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.gone {
            return Poll::Ready(Ok(()));
        }
        let closed = std::task::ready!(Pin::new(&mut self.inner).poll_shutdown(cx));
        Poll::Ready(self.settle(closed, ()))
    }
}

/// Serves ACP v1 on `input`/`output` until `input` ends, then winds every session down (see the
/// module docs). Fails only when the connection itself failed; the sessions are wound down
/// either way. A malformed input line — not JSON, or not even UTF-8 — is answered with a JSON-RPC
/// parse error and serving goes on; a line longer than
/// [`DEFAULT_MAX_LINE`](subagent_acp::DEFAULT_MAX_LINE) bytes ends the connection.
pub async fn serve<R, W>(options: ServeOptions, input: R, output: W) -> Result<(), CliError>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    serve_until(options, input, output, std::future::pending()).await
}

/// [`serve`], also stopping when `stop` resolves (the program's first Ctrl-C or SIGTERM) while
/// the client is still connected: from then on no request starts anything new (a
/// `session/new`, `session/load` or `session/prompt` that arrives is answered with an error),
/// the sessions being created are finished, every running prompt is cancelled as a
/// `session/cancel` would cancel it — its turn aborted, its background jobs killed, and answered
/// `cancelled` — and once every prompt has been answered the connection is closed (what was
/// sent is flushed first) and every session wound down as at the end of the input. Returns
/// `Ok` after such a stop; the input is not read to its end.
pub async fn serve_until<R, W>(
    options: ServeOptions,
    input: R,
    output: W,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), CliError>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    // The client's input is bounded per line: an endless line ends the connection (and winds
    // the sessions down) instead of growing the engine's buffer without limit. And it is made
    // UTF-8 first: the engine ends the whole connection on a line that does not decode (losing
    // the answers to requests read with it), while a line that is not JSON is answered with a
    // parse error and the connection goes on — so a line with a stray non-UTF-8 byte must reach
    // it as the malformed line it is (each invalid byte as NUL, which no JSON text may hold).
    let input = subagent_acp::LineLimit::new(
        subagent_acp::Utf8Guard::new(input),
        subagent_acp::DEFAULT_MAX_LINE,
    );
    let transport = ByteStreams::new(HangUp::new(output).compat_write(), input.compat());
    let state = Arc::new(State {
        options,
        sessions: Mutex::new(HashMap::new()),
        loading: Mutex::new(HashSet::new()),
        setups: Mutex::new(JoinSet::new()),
        prompts: Mutex::new(JoinSet::new()),
        closed: AtomicBool::new(false),
    });
    let (for_new, for_load, for_prompt, for_cancel, for_stop) = (
        state.clone(),
        state.clone(),
        state.clone(),
        state.clone(),
        state.clone(),
    );
    let served = AcpAgent
        .v1()
        .name("subagent")
        .on_receive_request(
            async move |_request: InitializeRequest, responder, _cx| {
                responder.respond(
                    InitializeResponse::new(ProtocolVersion::V1)
                        .agent_capabilities(AgentCapabilities::new().load_session(true)),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest, responder, cx: ConnectionTo<Client>| {
                if let Err(refused) = for_new.open_for_requests() {
                    return responder.respond_with_error(refused);
                }
                let state = for_new.clone();
                for_new.spawn(&for_new.setups, async move {
                    let _ = responder.respond_with_result(state.new_session(request, cx).await);
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, cx: ConnectionTo<Client>| {
                if let Err(refused) = for_load.open_for_requests() {
                    return responder.respond_with_error(refused);
                }
                let state = for_load.clone();
                for_load.spawn(&for_load.setups, async move {
                    let _ = responder.respond_with_result(state.load_session(request, cx).await);
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, _cx| {
                let (served, text, cancel) = match for_prompt.admit(&request) {
                    Ok(admitted) => admitted,
                    Err(refused) => return responder.respond_with_error(refused),
                };
                let state = for_prompt.clone();
                for_prompt.spawn(&for_prompt.prompts, async move {
                    state
                        .prompt(served, text, cancel, |response| {
                            let _ = responder.respond_with_result(response);
                        })
                        .await;
                });
                Ok(())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx| {
                for_cancel.cancel(&notification);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Client>| {
            tokio::select! {
                // The input ended (or failed): as `connect_to` serves, until then.
                () = cx.incoming_closed() => {}
                () = stop => for_stop.stop().await,
            }
            Ok(())
        })
        .await;
    state.close().await;
    served.map_err(|e| CliError::Run(format!("the ACP connection failed: {e}")))
}

#[cfg(test)]
mod tests {
    use agent::{GenerateOptions, ModelStream};
    use agent_client_protocol::v1::schema::TextContent;
    use futures::StreamExt;
    use serde_json::Value;
    use tokio::io::AsyncWriteExt;
    use tokio::sync::oneshot;

    use super::*;

    /// A pause between a prompt's turn having settled and its answer being decided: told when a
    /// prompt gets there (the first sender), it waits there for the second.
    type AfterTurn = (oneshot::Sender<()>, oneshot::Receiver<()>);

    /// The pause the next prompt to get there takes (none by default; only
    /// [`a_cancel_handled_before_the_answer_is_decided_answers_cancelled`] serves prompts here).
    static AFTER_TURN: Mutex<Option<AfterTurn>> = Mutex::new(None);

    /// Takes the pause [`AFTER_TURN`] holds, if any.
    pub(super) async fn after_turn() {
        let pause = AFTER_TURN.lock().take();
        if let Some((reached, resume)) = pause {
            let _ = reached.send(());
            let _ = resume.await;
        }
    }

    /// Answers every model call with one short text.
    struct Hello;

    impl ModelAdapter for Hello {
        fn stream(&self, _: Arc<GenerateOptions>) -> ModelStream {
            futures::stream::iter(agent_loop::model::chunks::text("hello back").into_iter().map(Ok)).boxed()
        }
    }

    /// Serving options on the `Hello` model with a store in `store_dir`.
    fn hello_options(
        store_dir: &std::path::Path,
        session_observers: Vec<Arc<dyn SessionObserver>>,
    ) -> ServeOptions {
        ServeOptions {
            adapter: Arc::new(Hello),
            model_provider: "mock".to_owned(),
            model_name: "mock".to_owned(),
            max_tokens: None,
            max_steps_per_turn: Some(5),
            store_dir: store_dir.to_owned(),
            session_observers,
        }
    }

    /// spec: acp-and-tools.md §2.5, §2.6 — the protocol requires `cancelled` once the agent has
    /// received `session/cancel`. A cancel the server handles after the prompt's turn has
    /// settled but before its answer is decided (on another thread, as the answer is being
    /// made) is not lost: the prompt is answered `cancelled`, not `end_turn`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancel_handled_before_the_answer_is_decided_answers_cancelled() {
        let store = tempfile::tempdir().expect("store dir");
        let workspace = tempfile::tempdir().expect("workspace dir");
        let cwd = workspace.path().canonicalize().expect("canonical workspace");
        let observer = invariants::InvariantObserver::shared();
        let options = hello_options(store.path(), vec![observer.clone() as Arc<dyn SessionObserver>]);
        let (reached, at_pause) = oneshot::channel();
        let (resume, paused) = oneshot::channel();
        *AFTER_TURN.lock() = Some((reached, paused));
        let (client_end, server_end) = tokio::io::duplex(1 << 16);
        let (server_read, server_write) = tokio::io::split(server_end);
        let server = tokio::spawn(serve(options, server_read, server_write));
        let (client_read, client_write) = tokio::io::split(client_end);
        let transport = ByteStreams::new(client_write.compat_write(), client_read.compat());
        agent_client_protocol::Client
            .v1()
            .name("test-client")
            .connect_with(
                transport,
                async move |cx: ConnectionTo<agent_client_protocol::Agent>| {
                    cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                        .block_task()
                        .await?;
                    let session = cx
                        .send_request(NewSessionRequest::new(cwd))
                        .block_task()
                        .await?
                        .session_id;
                    let prompt = ContentBlock::Text(TextContent::new("say hello"));
                    let answer = cx.send_request(PromptRequest::new(session.clone(), vec![prompt]));
                    at_pause.await.expect("the prompt's turn settles");
                    cx.send_notification(CancelNotification::new(session))?;
                    // Requests are handled in arrival order: once a later one is answered, the
                    // cancel has been handled.
                    cx.send_request(InitializeRequest::new(ProtocolVersion::V1))
                        .block_task()
                        .await?;
                    resume.send(()).expect("the prompt waits");
                    assert_eq!(answer.block_task().await?.stop_reason, StopReason::Cancelled);
                    Ok(())
                },
            )
            .await
            .expect("the client's exchange succeeds");
        server
            .await
            .expect("the server task")
            .expect("the server ends cleanly");
        assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    }

    /// A client that hung up swallows what is still written to it; while it is there, writes
    /// reach it as they are, and a failure that is not a hang-up is passed on.
    #[tokio::test]
    async fn output_to_a_client_that_hung_up_is_discarded() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut out = HangUp::new(ours);
        out.write_all(b"hello\n").await.expect("written");
        let mut line = [0u8; 6];
        tokio::io::AsyncReadExt::read_exact(&mut theirs, &mut line)
            .await
            .expect("read");
        assert_eq!(&line, b"hello\n");
        drop(theirs);
        out.write_all(b"to nobody\n")
            .await
            .expect("discarded, not failed");
        out.flush().await.expect("flushed");
        out.shutdown().await.expect("closed");
        assert!(out.gone);

        let mut refused = HangUp::new(Refusing);
        let err = refused.write_all(b"x").await.expect_err("passed on");
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(!refused.gone);
    }

    /// Serves raw `input` lines to completion and returns every line the server wrote.
    async fn served_lines(input: &[u8]) -> Vec<String> {
        let store = tempfile::tempdir().expect("store dir");
        let options = hello_options(store.path(), Vec::new());
        let (client_end, server_end) = tokio::io::duplex(1 << 16);
        let (server_read, server_write) = tokio::io::split(server_end);
        let server = tokio::spawn(serve(options, server_read, server_write));
        let (mut client_read, mut client_write) = tokio::io::split(client_end);
        client_write.write_all(input).await.expect("written");
        client_write.shutdown().await.expect("closed");
        let mut out = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut client_read, &mut out)
            .await
            .expect("read");
        server
            .await
            .expect("the server task")
            .expect("the server ends cleanly");
        String::from_utf8_lossy(&out).lines().map(str::to_owned).collect()
    }

    /// A client line that is not UTF-8 is a malformed line like any other that is not JSON: it
    /// is answered with a parse error, and the requests before and after it are answered too.
    /// (Unguarded, the protocol engine ended the whole connection on it, without answering
    /// even the request read just before it.)
    #[tokio::test]
    async fn a_line_that_is_not_utf8_is_answered_as_malformed_and_serving_goes_on() {
        const INITIALIZE_1: &[u8] =
            b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n";
        const INITIALIZE_2: &[u8] =
            b"{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}\n";
        for bad in [
            &b"not json\n"[..],
            b"\xff\xfe\n",
            // A request whose only fault is a truncated character inside a string.
            b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"\xc3\"}}\n",
        ] {
            let lines = served_lines(&[INITIALIZE_1, bad, INITIALIZE_2].concat()).await;
            let answers: Vec<Value> = lines
                .iter()
                .map(|line| serde_json::from_str(line).expect("the server writes JSON lines"))
                .collect();
            assert_eq!(answers.len(), 3, "{bad:?}: {lines:#?}");
            assert_eq!(answers[0]["id"], 1, "{lines:#?}");
            assert!(answers[0].get("result").is_some(), "{lines:#?}");
            assert_eq!(answers[1]["error"]["code"], -32700, "{bad:?}: {lines:#?}");
            assert_eq!(answers[2]["id"], 2, "{lines:#?}");
            assert!(answers[2].get("result").is_some(), "{lines:#?}");
        }
    }

    /// A writer whose every write fails with an error that is not a hang-up.
    struct Refusing;

    impl AsyncWrite for Refusing {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<std::io::Result<usize>> {
            Poll::Ready(Err(std::io::ErrorKind::PermissionDenied.into()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }
}
