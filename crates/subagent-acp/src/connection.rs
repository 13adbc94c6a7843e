//! The ACP client side of one child (spec §1.6–§1.8, §2): the protocol connection over the
//! child's pipes, the streaming output fold, the permission policy and the wire mappings.
//!
//! # Ownership and concurrency
//! [`Connection::spawn`] spawns one tokio task that drives the protocol engine and returns the
//! [`Connection`] that owns it at once (no `.await` in between), so no cancellation point exists
//! at which the task is unowned. The task keeps the connection open until [`Connection::close`]
//! is called; returning from it drops the transport, which closes the child's stdin (tier 1 of
//! the teardown ladder). The task is awaited by [`Connection::finish`]; dropping a `Connection`
//! closes and aborts it (which also drops the transport).
//! Inbound callbacks run one at a time in arrival order and only append to the fold or answer a
//! permission request (under the policy until the run is cancelled, `cancelled` after), so
//! every chunk that precedes the prompt response is folded before the response is processed
//! (§1.7).
//!
//! # Failure causes
//! The engine reports a connection that the child's output broke (an over-long line, or a read
//! of the child's stdout that failed, such as `EIO` from its pipe) only as "connection
//! terminated". The reader under the engine records the typed cause in the
//! connection's [`OutputFault`] before it fails the read, so every request failing because of it
//! — and the run's diagnostic — names the cause ([`AcpError::ChildOutput`]). A line that is not
//! UTF-8 does not break the connection at all ([`Utf8Guard`](crate::Utf8Guard)).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    self as acp, InitializeRequest, PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification, SessionUpdate,
};
use agent_client_protocol::{ByteStreams, Client, JsonRpcMessage, JsonRpcRequest, UntypedMessage};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;
use subagent::agent::ContentBlock;
use subagent::{AssistantOutputFold, StopReason};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::task::JoinHandle;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;

use crate::config::{PREFIX, PermissionPolicy};
use crate::error::{AcpError, ChildOutputError, Stage};
use crate::line_limit::LineTooLong;
use crate::process::ChildPipes;

/// The streamed assistant text of one run, shared between the protocol callbacks (writers) and
/// every settlement path (readers). The lock guards only the fold and is never held across an
/// `.await`.
pub type SharedFold = Arc<Mutex<BoundedOutputFold>>;

/// The line that ends a run's output when the child's text exceeded the bound
/// ([`BoundedOutputFold`]).
pub const OUTPUT_TRUNCATED_MARKER: &str = "\n[output truncated]";

/// The output fold of one run (§1.7) with a bound on the text it keeps — this crate's extension
/// (configured as `maxOutputBytes`): the spec sets no bound, and without one a child that streams
/// chunks forever grows the parent's memory until the run is cancelled.
///
/// Text is folded in arrival order until `max_bytes` UTF-8 bytes are kept. The chunk that
/// crosses the bound is cut at the last character boundary within it; that piece and every later
/// chunk are dropped, [`OUTPUT_TRUNCATED_MARKER`] ends the output (so whoever reads the result —
/// the parent model included — sees that it is incomplete), and one `tracing` warning names the
/// provider and the bound. The stop reason is not affected: the child's own answer still decides
/// it, and the result carries no diagnostic for the truncation (§1.13 keeps diagnostics to
/// failures). A child whose whole text is exactly `max_bytes` bytes long loses nothing and gets
/// no marker.
#[derive(Clone, Debug)]
pub struct BoundedOutputFold {
    fold: AssistantOutputFold,
    /// Bytes of child text still accepted.
    room: usize,
    /// The configured bound, for the warning.
    max_bytes: usize,
    /// Whether text was dropped (the marker was appended and the warning emitted).
    truncated: bool,
    /// The provider's registry name, for the warning.
    provider: String,
}

impl BoundedOutputFold {
    /// An empty fold of provider `provider` keeping at most `max_bytes` bytes of text.
    pub fn new(provider: impl Into<String>, max_bytes: usize) -> Self {
        Self {
            fold: AssistantOutputFold::new(),
            room: max_bytes,
            max_bytes,
            truncated: false,
            provider: provider.into(),
        }
    }

    /// Folds one piece of the child's text: kept whole while it fits, otherwise cut at the
    /// bound (the first time) or dropped (after).
    pub fn push_text(&mut self, text: &str) {
        if self.truncated || text.is_empty() {
            return;
        }
        if text.len() <= self.room {
            self.room -= text.len();
            self.fold.push_text(text);
            return;
        }
        self.fold.push_text(&text[..text.floor_char_boundary(self.room)]);
        self.fold.push_text(OUTPUT_TRUNCATED_MARKER);
        self.room = 0;
        self.truncated = true;
        tracing::warn!(
            "{PREFIX} \"{}\": the child's output exceeded maxOutputBytes ({} bytes); further text is dropped",
            self.provider,
            self.max_bytes
        );
    }

    /// Whether text was dropped at the bound.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The output collected so far (see [`AssistantOutputFold::collect`]), ending with
    /// [`OUTPUT_TRUNCATED_MARKER`] once text was dropped.
    pub fn collect(&self) -> Option<Vec<ContentBlock>> {
        self.fold.collect()
    }
}

/// The first way the child's output broke the connection, once it did. Shared by the reader
/// (which records it before failing the read, so it is set before any request fails because of
/// it) and every path that reports a failure. The lock is never held across an `.await`.
#[derive(Clone, Debug, Default)]
pub struct OutputFault(Arc<Mutex<Option<ChildOutputError>>>);

impl OutputFault {
    /// The recorded cause, if the child's output broke the connection.
    pub fn get(&self) -> Option<ChildOutputError> {
        self.0.lock().clone()
    }

    /// Records `cause` unless one is recorded already (the first cause ended the connection).
    fn record(&self, cause: ChildOutputError) {
        self.0.lock().get_or_insert(cause);
    }

    /// The error a request of `stage` failed with: the recorded cause when there is one (the
    /// engine's `source` then only says that the connection terminated), else `source`.
    pub fn request_failed(&self, stage: Stage, source: agent_client_protocol::Error) -> AcpError {
        match self.get() {
            Some(cause) => AcpError::ChildOutput { stage, cause },
            None => AcpError::Protocol { stage, source },
        }
    }
}

/// Records in an [`OutputFault`] why a read of the child's output failed — an over-long line as
/// [`ChildOutputError::LineTooLong`], any other error as [`ChildOutputError::Read`] with its kind
/// and message; bytes and errors pass through unchanged.
#[derive(Debug)]
struct FaultRecorder<R> {
    inner: R,
    fault: OutputFault,
}

impl<R: AsyncRead + Unpin> AsyncRead for FaultRecorder<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Err(error)) = &polled {
            this.fault
                .record(match error.get_ref().and_then(|e| e.downcast_ref()) {
                    Some(LineTooLong { max }) => ChildOutputError::LineTooLong { max: *max },
                    None => ChildOutputError::Read {
                        kind: error.kind(),
                        message: error.to_string(),
                    },
                });
        }
        polled
    }
}

/// The reader the engine reads `stdout` (the child's output) through. The output is bounded per
/// line: an endless line ends the connection instead of growing the engine's buffer without
/// limit. A line that is not UTF-8 reaches the engine as a malformed line, which it answers and
/// reads on. Why a read failed (an over-long line or an I/O error) is recorded in `fault`.
fn child_output<R: AsyncRead + Unpin>(
    stdout: R,
    fault: &OutputFault,
) -> FaultRecorder<crate::LineLimit<crate::Utf8Guard<R>>> {
    FaultRecorder {
        inner: crate::LineLimit::new(crate::Utf8Guard::new(stdout), crate::DEFAULT_MAX_LINE),
        fault: fault.clone(),
    }
}

/// The text an ACP content block contributes to the output: its text when it is a text block,
/// nothing otherwise.
pub fn content_text(block: &acp::ContentBlock) -> Option<&str> {
    match block {
        acp::ContentBlock::Text(text) => Some(&text.text),
        _ => None,
    }
}

/// Folds one `session/update`: only `agent_message_chunk` text contributes; thoughts, tool
/// activity, plans and every other update are consumed and dropped.
pub fn fold_update(fold: &mut BoundedOutputFold, update: &SessionUpdate) {
    if let SessionUpdate::AgentMessageChunk(chunk) = update
        && let Some(text) = content_text(&chunk.content)
    {
        fold.push_text(text);
    }
}

/// The prompt the child receives: the request's text blocks, in order; every other harness block
/// (reasoning, images, tool calls) is dropped.
pub fn prompt_blocks(prompt: &[ContentBlock]) -> Vec<acp::ContentBlock> {
    prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } => Some(acp::ContentBlock::Text(acp::TextContent::new(text.clone()))),
            _ => None,
        })
        .collect()
}

/// Maps an ACP stop reason to the harness's (§1.9): `end_turn` → completed, `max_tokens` →
/// max-tokens, `refusal` → refusal, `cancelled` → aborted, anything else (including
/// `max_turn_requests`) → error.
pub fn map_stop_reason(reason: &acp::StopReason) -> StopReason {
    match reason {
        acp::StopReason::EndTurn => StopReason::Completed,
        acp::StopReason::MaxTokens => StopReason::MaxTokens,
        acp::StopReason::Refusal => StopReason::Refusal,
        acp::StopReason::Cancelled => StopReason::Aborted,
        _ => StopReason::Error,
    }
}

/// Decodes a raw `session/prompt` response into the harness stop reason. A response whose
/// `stopReason` is missing or unknown is malformed: it becomes a prompt failure (`error`), never
/// a silent `completed`.
pub fn decode_prompt_response(raw: Value) -> Result<StopReason, AcpError> {
    serde_json::from_value::<acp::PromptResponse>(raw)
        .map(|response| map_stop_reason(&response.stop_reason))
        .map_err(|source| AcpError::Malformed {
            stage: Stage::Prompt,
            source,
        })
}

/// Extracts the session id from a raw `session/new` response; a missing or non-string
/// `sessionId` is [`AcpError::MissingSessionId`].
pub fn decode_session_id(raw: &Value) -> Result<acp::SessionId, AcpError> {
    match raw.get("sessionId") {
        Some(Value::String(id)) => Ok(acp::SessionId::new(id.as_str())),
        _ => Err(AcpError::MissingSessionId),
    }
}

/// The automatic answer to a permission request under `policy` (§1.8). `allow` selects the first
/// option, in list order, whose kind is `allow_once` or `allow_always` (never inventing an id),
/// else `cancelled`; `reject` always answers `cancelled`.
pub fn permission_response(
    policy: PermissionPolicy,
    request: &RequestPermissionRequest,
) -> RequestPermissionResponse {
    let selected = match policy {
        PermissionPolicy::Reject => None,
        PermissionPolicy::Allow => request
            .options
            .iter()
            .find(|option| {
                matches!(
                    option.kind,
                    PermissionOptionKind::AllowOnce | PermissionOptionKind::AllowAlways
                )
            })
            .map(|option| option.option_id.clone()),
    };
    RequestPermissionResponse::new(match selected {
        Some(id) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id)),
        None => RequestPermissionOutcome::Cancelled,
    })
}

/// A request sent with typed params whose response is kept as raw JSON, so the provider decides
/// how a malformed response fails (for example a `session/new` answer without `sessionId`).
#[derive(Clone, Debug)]
pub struct RawRequest<P> {
    method: &'static str,
    params: P,
}

impl<P> RawRequest<P> {
    /// `session/new` with `params`.
    pub fn session_new(params: P) -> Self {
        Self {
            method: "session/new",
            params,
        }
    }

    /// `session/prompt` with `params`.
    pub fn prompt(params: P) -> Self {
        Self {
            method: "session/prompt",
            params,
        }
    }
}

impl<P> JsonRpcMessage for RawRequest<P>
where
    P: Serialize + serde::de::DeserializeOwned + Clone + std::fmt::Debug + Send + 'static,
{
    fn matches_method(method: &str) -> bool {
        method == "session/new" || method == "session/prompt"
    }

    fn method(&self) -> &str {
        self.method
    }

    fn to_untyped_message(&self) -> Result<UntypedMessage, agent_client_protocol::Error> {
        UntypedMessage::new(self.method, &self.params)
    }

    fn parse_message(method: &str, params: &Value) -> Result<Self, agent_client_protocol::Error> {
        let method = match method {
            "session/new" => "session/new",
            "session/prompt" => "session/prompt",
            _ => return Err(agent_client_protocol::Error::method_not_found()),
        };
        let params = serde_json::from_value(params.clone())
            .map_err(|_| agent_client_protocol::Error::invalid_params())?;
        Ok(Self { method, params })
    }
}

impl<P> JsonRpcRequest for RawRequest<P>
where
    P: Serialize + serde::de::DeserializeOwned + Clone + std::fmt::Debug + Send + 'static,
{
    type Response = Value;
}

/// One ACP client connection to a child: its engine task (owned from the moment it is spawned)
/// and, once the engine reported ready, its context.
#[derive(Debug)]
pub struct Connection {
    /// Set once the engine reported ready.
    cx: Option<ConnectionTo<agent_client_protocol::Agent>>,
    /// The engine's readiness report, until [`ready`](Self::ready) consumed it.
    ready: Option<tokio::sync::oneshot::Receiver<ConnectionTo<agent_client_protocol::Agent>>>,
    close: CancellationToken,
    task: Option<JoinHandle<()>>,
    fault: OutputFault,
}

impl Connection {
    /// Opens the connection over `pipes` and waits until it is ready ([`spawn`](Self::spawn)
    /// then [`ready`](Self::ready)). Dropping this future (or its failing) never leaves the
    /// engine behind: the task is closed and aborted, which closes the child's stdin.
    pub async fn open(
        pipes: ChildPipes,
        fold: SharedFold,
        policy: PermissionPolicy,
        cancelled: CancellationToken,
    ) -> Result<Self, AcpError> {
        Self::spawn(pipes, fold, policy, cancelled).opened().await
    }

    /// `self` once ready (the tail of [`open`](Self::open)).
    async fn opened(mut self) -> Result<Self, AcpError> {
        self.ready().await?;
        Ok(self)
    }

    /// Spawns the engine over `pipes`: session updates are folded into `fold` and permission
    /// requests answered under `policy` — until `cancelled` fires: from then on every permission
    /// request is answered `cancelled`, whatever the policy (a client that cancelled the turn
    /// must not approve the child's further tool calls, §2.6). Does not wait; the returned value
    /// owns the task from this moment, so a caller that stores it before its first `.await` can
    /// always close and await it ([`finish`](Self::finish)), whatever happens to the startup
    /// afterwards.
    pub fn spawn(
        pipes: ChildPipes,
        fold: SharedFold,
        policy: PermissionPolicy,
        cancelled: CancellationToken,
    ) -> Self {
        let fault = OutputFault::default();
        let incoming = child_output(pipes.stdout, &fault);
        Self::spawn_over(
            pipes.stdin.compat_write(),
            incoming.compat(),
            fault,
            fold,
            policy,
            cancelled,
        )
    }

    fn spawn_over<W, R>(
        outgoing: W,
        incoming: R,
        fault: OutputFault,
        fold: SharedFold,
        policy: PermissionPolicy,
        cancelled: CancellationToken,
    ) -> Self
    where
        W: futures::AsyncWrite + Send + 'static,
        R: futures::AsyncRead + Send + 'static,
    {
        let transport = ByteStreams::new(outgoing, incoming);
        let close = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let closing = close.clone();
        let task = tokio::spawn(async move {
            let outcome = Client
                .v1()
                .name("subagent-acp")
                .on_receive_notification(
                    async move |notification: SessionNotification, _cx| {
                        fold_update(&mut fold.lock(), &notification.update);
                        Ok(())
                    },
                    agent_client_protocol::on_receive_notification!(),
                )
                .on_receive_request(
                    async move |request: RequestPermissionRequest, responder, _cx| {
                        let policy = if cancelled.is_cancelled() {
                            PermissionPolicy::Reject
                        } else {
                            policy
                        };
                        responder.respond(permission_response(policy, &request))
                    },
                    agent_client_protocol::on_receive_request!(),
                )
                .connect_with(
                    transport,
                    async move |cx: ConnectionTo<agent_client_protocol::Agent>| {
                        let _ = ready_tx.send(cx);
                        closing.cancelled().await;
                        Ok(())
                    },
                )
                .await;
            if let Err(error) = outcome {
                tracing::debug!(%error, "subagent-acp: the ACP connection ended with an error");
            }
        });
        Self {
            cx: None,
            ready: Some(ready_rx),
            close,
            task: Some(task),
            fault,
        }
    }

    /// Why the child's output broke the connection, once it did (shared; see [`OutputFault`]).
    pub fn fault(&self) -> &OutputFault {
        &self.fault
    }

    /// Waits until the engine is ready. Fails when the engine stopped before it was ready (the
    /// child's pipes are gone); the task has then been awaited. Cancel-safe: dropping this future
    /// leaves the task owned by `self`. Calling it again after success is a no-op.
    pub async fn ready(&mut self) -> Result<(), AcpError> {
        if self.cx.is_some() {
            return Ok(());
        }
        let outcome = match self.ready.as_mut() {
            Some(ready) => ready.await.ok(),
            None => None,
        };
        self.ready = None;
        match outcome {
            Some(cx) => {
                self.cx = Some(cx);
                Ok(())
            }
            None => {
                // The handle stays in `self` while awaited, so dropping this future here still
                // leaves the task owned (and aborted by `Drop`).
                self.close.cancel();
                if let Some(task) = self.task.as_mut() {
                    let _ = task.await;
                    self.task = None;
                }
                Err(self.not_ready())
            }
        }
    }

    /// The connection context (cheap to clone) for sending requests and notifications, once
    /// the engine is [`ready`](Self::ready).
    pub fn context(&self) -> Option<&ConnectionTo<agent_client_protocol::Agent>> {
        self.cx.as_ref()
    }

    fn cx(&self) -> Result<&ConnectionTo<agent_client_protocol::Agent>, AcpError> {
        self.cx.as_ref().ok_or_else(|| self.not_ready())
    }

    /// The failure of a connection whose engine is not (or never became) ready.
    fn not_ready(&self) -> AcpError {
        self.fault
            .request_failed(Stage::Connection, agent_client_protocol::Error::internal_error())
    }

    /// `initialize` with protocol version 1 and no optional client capabilities.
    pub async fn initialize(&self) -> Result<(), AcpError> {
        self.cx()?
            .send_request(InitializeRequest::new(ProtocolVersion::V1))
            .block_task()
            .await
            .map(drop)
            .map_err(|source| self.fault.request_failed(Stage::Initialize, source))
    }

    /// `session/new {cwd, mcpServers: []}`; returns the child's session id.
    pub async fn new_session(&self, cwd: &std::path::Path) -> Result<acp::SessionId, AcpError> {
        let raw = self
            .cx()?
            .send_request(RawRequest::session_new(acp::NewSessionRequest::new(cwd)))
            .block_task()
            .await
            .map_err(|source| self.fault.request_failed(Stage::SessionNew, source))?;
        decode_session_id(&raw)
    }

    /// Asks the connection to end: the engine returns, dropping the transport, which closes the
    /// child's stdin. Idempotent; does not wait.
    pub fn close(&self) {
        self.close.cancel();
    }

    /// Closes the connection and waits for its task to end.
    pub async fn finish(mut self) {
        self.close();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.close.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Sends `session/prompt` and decodes the response into the harness stop reason. A failure
/// the child's output caused (recorded in `fault`) is reported with that cause.
pub async fn prompt(
    cx: &ConnectionTo<agent_client_protocol::Agent>,
    fault: &OutputFault,
    session: acp::SessionId,
    blocks: Vec<acp::ContentBlock>,
) -> Result<StopReason, AcpError> {
    let raw = cx
        .send_request(RawRequest::prompt(acp::PromptRequest::new(session, blocks)))
        .block_task()
        .await
        .map_err(|source| fault.request_failed(Stage::Prompt, source))?;
    decode_prompt_response(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokio::io::AsyncReadExt;

    /// spec: ACP-26 (§1.6 rollback, §1.11 tier 1) — dropping `open` after the connection task
    /// was spawned but before it reported ready must not leave the task behind: the task ends
    /// and the peer (the child) sees EOF on its input, so the EOF tier of a rollback can work.
    /// The peer never answers anything. The runtime is current-thread with a paused clock, so the
    /// drop lands deterministically between the spawn and the task's first poll, and a task that
    /// lives on makes the bounded wait time out instead of hanging.
    #[tokio::test(start_paused = true)]
    async fn dropping_open_before_ready_ends_the_task_and_closes_the_child_input() {
        let runtime = tokio::runtime::Handle::current();
        let baseline = runtime.metrics().num_alive_tasks();
        let (ours_out, mut child_in) = tokio::io::duplex(1024);
        let (_child_out, ours_in) = tokio::io::duplex(1024);
        let fold: SharedFold = Arc::new(Mutex::new(BoundedOutputFold::new("acp", 1024)));
        {
            let mut open = std::pin::pin!(
                Connection::spawn_over(
                    ours_out.compat_write(),
                    ours_in.compat(),
                    OutputFault::default(),
                    fold,
                    PermissionPolicy::Reject,
                    CancellationToken::new()
                )
                .opened()
            );
            assert!(futures::poll!(&mut open).is_pending(), "open waits for the task");
            assert_eq!(
                runtime.metrics().num_alive_tasks(),
                baseline + 1,
                "the task was spawned"
            );
        }
        let mut rest = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(3600),
            child_in.read_to_end(&mut rest),
        )
        .await;
        assert!(
            matches!(read, Ok(Ok(0))),
            "the child's input reaches EOF once open is dropped: {read:?}"
        );
        let drained = tokio::time::timeout(std::time::Duration::from_secs(3600), async {
            while runtime.metrics().num_alive_tasks() > baseline {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        })
        .await;
        assert!(drained.is_ok(), "no connection task outlives the dropped open");
    }

    /// Reads from `inner` until its end, then fails every read with `EIO` instead of reporting
    /// end of input: a child's stdout whose pipe broke after valid output.
    struct FailsAtEnd {
        inner: tokio::io::DuplexStream,
    }

    impl AsyncRead for FailsAtEnd {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let before = buf.filled().len();
            match Pin::new(&mut self.inner).poll_read(cx, buf) {
                Poll::Ready(Ok(())) if buf.filled().len() == before => {
                    Poll::Ready(Err(std::io::Error::from_raw_os_error(5)))
                }
                other => other,
            }
        }
    }

    /// A read of the child's stdout that fails with an I/O error (here `EIO`, after a valid
    /// line) ends the connection, and the pending request's failure names that error — its kind
    /// and message — instead of the engine's opaque "connection terminated" (spec §1.13: the
    /// failure says why the child failed).
    #[tokio::test]
    async fn a_failed_read_of_the_child_output_names_the_error() {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

        let (ours_out, child_in) = tokio::io::duplex(64 * 1024);
        let (mut child_out, ours_in) = tokio::io::duplex(64 * 1024);
        let fold: SharedFold = Arc::new(Mutex::new(BoundedOutputFold::new("acp", 1024)));
        let fault = OutputFault::default();
        let mut connection = Connection::spawn_over(
            ours_out.compat_write(),
            child_output(FailsAtEnd { inner: ours_in }, &fault).compat(),
            fault,
            fold,
            PermissionPolicy::Reject,
            CancellationToken::new(),
        );
        connection.ready().await.expect("ready");
        let child = async move {
            let mut request = String::new();
            BufReader::new(child_in)
                .read_line(&mut request)
                .await
                .expect("the initialize request");
            assert!(request.contains("\"initialize\""), "{request}");
            let update = json!({
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {
                    "sessionId": "s",
                    "update": {
                        "sessionUpdate": "agent_message_chunk",
                        "content": {"type": "text", "text": "partial"},
                    },
                },
            });
            child_out
                .write_all(format!("{update}\n").as_bytes())
                .await
                .expect("write");
            // Closing the pipe makes the next read fail with EIO.
            drop(child_out);
        };
        let (failed, ()) = tokio::join!(connection.initialize(), child);
        let err = failed.expect_err("the read error ends the connection");
        let eio = std::io::Error::from_raw_os_error(5);
        match &err {
            AcpError::ChildOutput {
                stage: Stage::Initialize,
                cause: ChildOutputError::Read { kind, message },
            } => {
                assert_eq!(*kind, eio.kind());
                assert_eq!(*message, eio.to_string());
            }
            other => panic!("expected the read error as the cause, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            format!("ACP initialize failed: reading the agent's output failed: {eio}")
        );
        connection.finish().await;
    }

    /// spec: ACP-1 — end_turn → completed, max_tokens → max-tokens, refusal → refusal,
    /// cancelled → aborted, max_turn_requests → error.
    #[test]
    fn acp_1_stop_reason_mapping() {
        let cases = [
            (acp::StopReason::EndTurn, StopReason::Completed),
            (acp::StopReason::MaxTokens, StopReason::MaxTokens),
            (acp::StopReason::Refusal, StopReason::Refusal),
            (acp::StopReason::Cancelled, StopReason::Aborted),
            (acp::StopReason::MaxTurnRequests, StopReason::Error),
        ];
        for (wire, expected) in cases {
            assert_eq!(map_stop_reason(&wire), expected, "{wire:?}");
        }
        assert_eq!(
            decode_prompt_response(json!({"stopReason": "end_turn"})).unwrap(),
            StopReason::Completed
        );
    }

    /// spec: ACP-2 — an unknown ACP stop reason is a malformed prompt response, which the
    /// settlement flattens to `error` (never `completed`).
    #[test]
    fn acp_2_unknown_stop_reason_is_error() {
        let err = decode_prompt_response(json!({"stopReason": "surprise"})).unwrap_err();
        assert!(
            matches!(
                err,
                AcpError::Malformed {
                    stage: Stage::Prompt,
                    ..
                }
            ),
            "{err}"
        );
        assert!(decode_prompt_response(json!({})).is_err());
    }

    /// spec: ACP-3 — a text block yields its text; an image block yields nothing.
    #[test]
    fn acp_3_content_extraction() {
        let text = acp::ContentBlock::Text(acp::TextContent::new("hello"));
        assert_eq!(content_text(&text), Some("hello"));
        let image = acp::ContentBlock::Image(acp::ImageContent::new("AAAA", "image/png"));
        assert_eq!(content_text(&image), None);
    }

    /// spec: ACP-4 — the prompt keeps text blocks and drops non-text blocks (reasoning).
    #[test]
    fn acp_4_prompt_translation() {
        let blocks = prompt_blocks(&[
            ContentBlock::text("one"),
            ContentBlock::reasoning("hidden"),
            ContentBlock::text("two"),
        ]);
        let texts: Vec<_> = blocks.iter().filter_map(content_text).collect();
        assert_eq!(texts, ["one", "two"]);
        assert!(prompt_blocks(&[ContentBlock::reasoning("only")]).is_empty());
    }

    /// spec: ACP-35 — a thought chunk is consumed but excluded; message chunks concatenate in
    /// arrival order with no separator.
    #[test]
    fn acp_35_thoughts_are_excluded_from_the_fold() {
        let mut fold = BoundedOutputFold::new("acp", 1024);
        let chunk = |t: &str| acp::ContentChunk::new(acp::ContentBlock::Text(acp::TextContent::new(t)));
        fold_update(&mut fold, &SessionUpdate::AgentThoughtChunk(chunk("thinking")));
        fold_update(&mut fold, &SessionUpdate::AgentMessageChunk(chunk("a")));
        fold_update(&mut fold, &SessionUpdate::UserMessageChunk(chunk("user")));
        fold_update(&mut fold, &SessionUpdate::AgentMessageChunk(chunk("b")));
        assert_eq!(fold.collect(), Some(vec![ContentBlock::text("ab")]));
    }

    /// The output bound (`maxOutputBytes`, this crate's extension of §1.7): text is kept until
    /// the bound, the crossing chunk is cut at the last character boundary within it (never half
    /// a character), the marker ends the output, later chunks are dropped, and exactly one
    /// warning names the provider and the bound.
    #[test]
    fn the_fold_stops_at_the_bound_with_a_marker_and_one_warning() {
        let capture = agent_loop::warnings::WarningCapture::new();
        let _installed = capture.install();
        let mut fold = BoundedOutputFold::new("remote", 6);
        fold.push_text("abc");
        fold.push_text("");
        assert!(!fold.truncated());
        // "é" is two bytes: 3 + 2 = 5 fits, the next "é" would end at byte 7.
        fold.push_text("ééé");
        assert!(fold.truncated());
        fold.push_text("more");
        fold.push_text("and more");
        let expected = format!("abcé{OUTPUT_TRUNCATED_MARKER}");
        assert_eq!(fold.collect(), Some(vec![ContentBlock::text(expected)]));
        assert_eq!(
            capture.messages(),
            [
                "subagent-acp \"remote\": the child's output exceeded maxOutputBytes (6 bytes); further text is dropped"
            ]
        );
    }

    /// Text of exactly the bound is kept whole, without the marker or a warning; one byte more
    /// truncates.
    #[test]
    fn text_of_exactly_the_bound_is_not_truncated() {
        let capture = agent_loop::warnings::WarningCapture::new();
        let _installed = capture.install();
        let mut fold = BoundedOutputFold::new("acp", 4);
        fold.push_text("ab");
        fold.push_text("cd");
        assert!(!fold.truncated());
        assert_eq!(fold.collect(), Some(vec![ContentBlock::text("abcd")]));
        assert!(capture.is_empty());
        fold.push_text("e");
        assert_eq!(
            fold.collect(),
            Some(vec![ContentBlock::text(format!("abcd{OUTPUT_TRUNCATED_MARKER}"))])
        );
        assert_eq!(capture.len(), 1);
    }

    fn permission_request(options: Vec<acp::PermissionOption>) -> RequestPermissionRequest {
        RequestPermissionRequest::new(
            acp::SessionId::new("s"),
            acp::ToolCallUpdate::new("call", acp::ToolCallUpdateFields::new()),
            options,
        )
    }

    fn option(id: &str, kind: PermissionOptionKind) -> acp::PermissionOption {
        acp::PermissionOption::new(id.to_owned(), id.to_owned(), kind)
    }

    /// The allow policy picks the first allow-shaped option in list order; reject (and allow
    /// without an allow option) answers cancelled.
    #[test]
    fn permission_policy_answers() {
        let request = permission_request(vec![
            option("no", PermissionOptionKind::RejectOnce),
            option("always", PermissionOptionKind::AllowAlways),
            option("once", PermissionOptionKind::AllowOnce),
        ]);
        let selected = |r: RequestPermissionResponse| match r.outcome {
            RequestPermissionOutcome::Selected(s) => Some(s.option_id.to_string()),
            _ => None,
        };
        assert_eq!(
            selected(permission_response(PermissionPolicy::Allow, &request)),
            Some("always".into())
        );
        assert_eq!(
            selected(permission_response(PermissionPolicy::Reject, &request)),
            None
        );
        let rejects_only = permission_request(vec![option("no", PermissionOptionKind::RejectOnce)]);
        assert_eq!(
            selected(permission_response(PermissionPolicy::Allow, &rejects_only)),
            None
        );
    }

    /// A `session/new` answer without a string session id is rejected with the spec's message.
    #[test]
    fn missing_session_id_message() {
        assert_eq!(
            decode_session_id(&json!({})).unwrap_err().to_string(),
            "ACP child published without a session id"
        );
        assert_eq!(
            decode_session_id(&json!({"sessionId": 3}))
                .unwrap_err()
                .to_string(),
            "ACP child published without a session id"
        );
        assert_eq!(&*decode_session_id(&json!({"sessionId": "x"})).unwrap().0, "x");
    }
}
