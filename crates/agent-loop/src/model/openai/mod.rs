//! [`OpenAiCompatible`]: streaming chat completions with tool calls over server-sent events.

mod assemble;
mod request;
#[cfg(test)]
mod robustness;
mod sse;

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use agent::{
    FinishReason, GenerateOptions, LlmFailure, ModelAdapter, ModelStream, Signal, StreamChunk, error_chain,
};
use futures::stream::{self, BoxStream};
use futures::{StreamExt as _, TryStreamExt as _};
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::Value;

use self::assemble::Assembler;
use self::sse::{MAX_EVENT_BYTES, SseDecoder, SseEvent};
use super::aborted_failure;

/// Failure messages are capped at this many UTF-8 bytes (on a char boundary).
const MESSAGE_CAP: usize = 1024;
/// At most this much of an error response body is read.
const ERROR_BODY_CAP: usize = 16 * 1024;

/// Connection settings of an [`OpenAiCompatible`] adapter.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// The API base URL, up to and including the version segment (for example
    /// `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1`); `/chat/completions` is
    /// appended.
    pub base_url: String,
    /// The bearer token; `None` for servers that need none. Never logged or put in errors.
    pub api_key: Option<String>,
    /// The model to ask for when a request names none (an empty `GenerateOptions::model`).
    pub model: String,
    /// Connection timeout; `None` leaves the HTTP client's default (none).
    pub connect_timeout: Option<Duration>,
    /// The longest the server may go without sending anything: the longest gap allowed between
    /// two reads of a streaming response's body, including the wait for its first byte, and
    /// the wait for the response head once the request is on its way (connecting included).
    /// `None` (the default from [`OpenAiConfig::new`]) sets no limit: a server that stalls is
    /// then given up on only when the request's signal is cancelled.
    ///
    /// When the gap is exceeded the stream ends with `finish {error}` with code `TIMEOUT`
    /// (the code of a transport timeout or an HTTP 408/504: a caller that retries those retries
    /// this too) and a message saying for how many seconds the server sent nothing; the
    /// connection is dropped at once and nothing is left running.
    /// While an error response's body is read, the gap only ends that read (the HTTP failure
    /// is reported with what arrived). Measured with `tokio::time`, so a paused test clock
    /// drives it. A cancelled signal still ends the stream at once, whatever the limit.
    pub idle_timeout: Option<Duration>,
}

impl OpenAiConfig {
    /// Settings for `base_url` with `api_key` and default `model`.
    pub fn new(base_url: impl Into<String>, api_key: Option<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key,
            model: model.into(),
            connect_timeout: None,
            idle_timeout: None,
        }
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

/// A [`ModelAdapter`] for any server that speaks OpenAI's streaming chat-completions API.
///
/// Each call POSTs one `stream: true` request to `<base_url>/chat/completions` (system text as a
/// leading `system` message, tool results as `tool` messages, tools as `function` tools, usage
/// requested with `stream_options.include_usage`) and maps the server-sent events onto the
/// spine's chunk grammar. The model sent is the request's `model`, or the configured one when
/// the request's is empty.
///
/// | OpenAI stream | chunks |
/// |---|---|
/// | `delta.content` | a `text` block: `block-start` on the first piece, then `text-delta`s |
/// | `delta.content` as an array of parts | the same, from each `text` part's `text` (and each `refusal` part's `refusal`) in order; a part of another type or without its string field is `BAD_RESPONSE` |
/// | `delta.refusal` | text, like `delta.content` (a refusal is what the model said) |
/// | `delta.reasoning_content` / `delta.reasoning` | a `reasoning` block, like a string `delta.content` |
/// | `delta.tool_calls[i]` | one `tool-call` block per `index`: `block-start`, then `tool-call-delta {id, name?, argumentsDelta}` (the call's id and name are the first ones sent); entries without an `index` are told apart by id |
/// | `usage` | one `usage` |
/// | `finish_reason` then `[DONE]` | every open block closed in index order with its assembled block, then `usage`, then `finish` |
///
/// Finish reasons: `stop` → `stop` (`tool-calls` when calls were streamed), `tool_calls` →
/// `tool-calls`, `length` → `max-tokens` (the loop drops the calls), `content_filter` → `error`
/// with code `CONTENT_FILTERED`, unknown reasons like `stop`. A completion with no content at
/// all (whatever its `stop`, `tool_calls` or unknown reason) is an `error` with code
/// `EMPTY_RESPONSE` (spec §13.3); a body that ends before any
/// finish reason or `[DONE]` is an `error` with code `STREAM_INTERRUPTED`; an event that is not
/// JSON (or not valid UTF-8, or larger than 16 MiB) is `BAD_RESPONSE`.
///
/// # Failures
/// Every failure ends the stream in-band with `finish {error {failure}}` (never an `Err` item):
///
/// | cause | `code` | other fields |
/// |---|---|---|
/// | HTTP 429 | `RATE_LIMITED` | `status`, `providerRetryAfterMs`, `requestId` |
/// | HTTP 400 / 401 / 403 | `BAD_REQUEST` / `AUTHENTICATION` / `PERMISSION_DENIED` | `status`, `requestId` |
/// | HTTP 404 / 408 / 413 | `NOT_FOUND` / `TIMEOUT` / `REQUEST_TOO_LARGE` | `status`, `requestId` |
/// | HTTP 500, 502, 503, 504, 529 | `SERVER_ERROR`, `BAD_GATEWAY`, `UNAVAILABLE`, `TIMEOUT`, `OVERLOADED` | `status`, `providerRetryAfterMs`, `requestId` |
/// | any other non-2xx | `HTTP_<status>` | `status`, `providerRetryAfterMs`, `requestId` |
/// | connection failure / timeout | `CONNECTION_FAILED` / `TIMEOUT` | — |
/// | the server sends nothing for longer than [`OpenAiConfig::idle_timeout`] | `TIMEOUT` | `requestId` (once the head arrived) |
/// | read error mid-stream | `STREAM_ERROR` | `requestId` |
/// | a provider error in the stream: an `{"error": …}` event, an event without `choices` whose top level is the error (a string `message` next to a `code`, a string `type` or `"object": "error"`), or any `event: error` event (JSON or plain text) | the error's string `code`, else its string `type` (a top-level `type` of `error` names no code): an HTTP error status as a `code` (a number or a 3-digit string from 400 to 599, as Azure OpenAI and vLLM send: `"429"`, `503`) as the code that status gets over HTTP (`429` → `RATE_LIMITED`, `503` → `UNAVAILABLE`, `418` → `HTTP_418`; any other numeric `code` names none); a well-known one as the code the same condition gets over HTTP — `rate_limit_exceeded`, `rate_limit_error`, `too_many_requests` → `RATE_LIMITED`; `overloaded`, `overloaded_error` → `OVERLOADED`; `server_error`, `internal_server_error`, `internal_error`, `api_error` → `SERVER_ERROR`; `service_unavailable` → `UNAVAILABLE`; `authentication_error`, `invalid_api_key` → `AUTHENTICATION`; `permission_error`, `permission_denied` → `PERMISSION_DENIED`; `context_length_exceeded`, `string_above_max_length` → `BAD_REQUEST` — any other upper-cased as sent (`insufficient_quota` → `INSUFFICIENT_QUOTA`: not `RATE_LIMITED`, as waiting does not clear it); else `PROVIDER_ERROR`. `message` is the error's `message`, else its JSON, else (plain text) the data; when the code was mapped to another name, it ends with ` (provider code: <original>)` | `requestId` |
/// | a 2xx answer with a JSON body (`application/json`) or an HTML page instead of an event stream | when the body is the provider's error (an `{"error": …}`, or a top-level error as in a stream), its code and message as for an error in the stream; else `BAD_RESPONSE` | `requestId` |
/// | an event that is not JSON, not valid UTF-8 or over 16 MiB | `BAD_RESPONSE` (for non-JSON, the message quotes the event's first 200 bytes, control characters escaped) | `requestId` |
/// | a `delta.content` part of a type other than `text` or `refusal`, or without its string field | `BAD_RESPONSE` | `requestId` |
/// | the body ends before a finish reason or `[DONE]` | `STREAM_INTERRUPTED` | `requestId` |
///
/// An event with no data (`data:` alone, as a keep-alive) is ignored.
///
/// `message` is the provider's error message when it sent one (capped at 1024 bytes), else the
/// status line. `providerRetryAfterMs` comes from `retry-after-ms`, else `retry-after` (seconds
/// or an HTTP date); `requestId` from `x-request-id`.
///
/// # Cancellation and ownership
/// Every await (connecting, reading the error body, each read of the event stream) is raced
/// against `request.signal` (and, when [`OpenAiConfig::idle_timeout`] is set, bounded by it),
/// and the signal is checked before each chunk is yielded; once it is
/// cancelled the stream ends at once with
/// `finish {aborted {failure: {code: ABORTED, message: <cause>}}}` (chunks parsed but not yet
/// yielded are dropped) and the connection is dropped. Dropping the stream drops the connection
/// too; no task is spawned. The adapter is cheap to clone (the HTTP client's connection pool is shared) and safe to call concurrently.
#[derive(Clone, Debug)]
pub struct OpenAiCompatible {
    config: Arc<OpenAiConfig>,
    url: Arc<str>,
    client: reqwest::Client,
}

impl OpenAiCompatible {
    /// An adapter for `config`.
    ///
    /// # Errors
    /// A failure with code `CONFIG`, before any request is made, when `base_url` is not an
    /// `http` or `https` URL, when a timeout is zero (which would fail every request; `None`
    /// sets no limit), or when the HTTP client cannot be built (for example TLS initialisation).
    pub fn new(config: OpenAiConfig) -> Result<Self, LlmFailure> {
        validate(&config).map_err(|message| LlmFailure::new("CONFIG", cap(message)))?;
        let mut builder = reqwest::Client::builder();
        if let Some(t) = config.connect_timeout {
            builder = builder.connect_timeout(t);
        }
        let client = builder
            .build()
            .map_err(|e| LlmFailure::new("CONFIG", cap(error_chain(&e))))?;
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        Ok(Self {
            config: Arc::new(config),
            url: url.into(),
            client,
        })
    }

    /// The adapter's settings.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }
}

/// Checks the settings a request cannot succeed without.
fn validate(config: &OpenAiConfig) -> Result<(), String> {
    let url = reqwest::Url::parse(&config.base_url)
        .map_err(|e| format!("the base URL `{}` is not a URL ({e})", config.base_url))?;
    if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
        return Err(format!(
            "the base URL `{}` is not an http(s) URL with a host",
            config.base_url
        ));
    }
    for (name, timeout) in [
        ("connect_timeout", config.connect_timeout),
        ("idle_timeout", config.idle_timeout),
    ] {
        if timeout == Some(Duration::ZERO) {
            return Err(format!(
                "{name} is zero, which fails every request (`None` sets no limit)"
            ));
        }
    }
    Ok(())
}

impl ModelAdapter for OpenAiCompatible {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        let model = if request.model.is_empty() {
            self.config.model.as_str()
        } else {
            &request.model
        };
        let body = request::build_body(&request, model);
        let mut http = self.client.post(&*self.url).json(&body);
        if let Some(key) = &self.config.api_key {
            http = http.bearer_auth(key);
        }
        let call = Call {
            phase: Phase::Start(Some(Box::new(http))),
            signal: request.signal.clone(),
            idle: self.config.idle_timeout,
            queue: VecDeque::new(),
            body: BodyParser::default(),
            finished: false,
            aborted: false,
        };
        stream::unfold(call, |mut call| async move {
            loop {
                // Cancellation ends the stream at once, even between chunks parsed from one read.
                if !call.finished && !call.aborted && call.signal.is_cancelled() {
                    call.queue.clear();
                    call.abort();
                }
                if let Some(chunk) = call.queue.pop_front() {
                    call.finished = matches!(chunk, StreamChunk::Finish { .. });
                    return Some((Ok(chunk), call));
                }
                if matches!(call.phase, Phase::Done) {
                    return None;
                }
                call.advance().await;
            }
        })
        .boxed()
    }
}

enum Phase {
    /// Not sent yet.
    Start(Option<Box<reqwest::RequestBuilder>>),
    /// Reading the event stream.
    Streaming(BoxStream<'static, Result<Vec<u8>, reqwest::Error>>),
    /// The final `finish` is queued.
    Done,
}

/// One model call in progress.
struct Call {
    phase: Phase,
    signal: Signal,
    /// The idle limit ([`OpenAiConfig::idle_timeout`]).
    idle: Option<Duration>,
    /// Chunks ready to be yielded.
    queue: VecDeque<StreamChunk>,
    body: BodyParser,
    /// Whether the `finish` has been yielded.
    finished: bool,
    /// Whether the `finish` queued is the one for a cancellation.
    aborted: bool,
}

impl Call {
    /// Does one unit of work: sends the request or processes one read of the body.
    async fn advance(&mut self) {
        match &mut self.phase {
            Phase::Start(builder) => {
                let Some(builder) = builder.take() else {
                    return self.end(self.body.asm.fail_chunk("UNKNOWN", "request already sent"));
                };
                let response = match race(&self.signal, within(self.idle, builder.send())).await {
                    None => return self.abort(),
                    Some(None) => {
                        return self.end(
                            self.body
                                .asm
                                .fail_chunk("TIMEOUT", self.silence("before the response head")),
                        );
                    }
                    Some(Some(Ok(r))) => r,
                    Some(Some(Err(e))) => return self.end(transport_failure(&e)),
                };
                self.body.asm.request_id = header_str(response.headers(), "x-request-id");
                if !response.status().is_success() {
                    let status = response.status();
                    let headers = response.headers().clone();
                    let body = match race(&self.signal, read_capped(response, self.idle)).await {
                        None => return self.abort(),
                        Some(body) => body,
                    };
                    let failure = http_failure(status.as_u16(), status.canonical_reason(), &headers, &body);
                    return self.end(StreamChunk::Finish {
                        reason: FinishReason::Error { failure },
                        replay_state: None,
                    });
                }
                if let Some(kind) = not_an_event_stream(response.headers()) {
                    // A server that ignored `stream: true` (or reports an error with a 200), or
                    // a page that is no API at all: its one document is not an event stream.
                    let headers = response.headers().clone();
                    let body = match race(&self.signal, read_capped(response, self.idle)).await {
                        None => return self.abort(),
                        Some(body) => body,
                    };
                    let failure = document_instead_of_stream(kind, &headers, &body);
                    return self.end(StreamChunk::Finish {
                        reason: FinishReason::Error { failure },
                        replay_state: None,
                    });
                }
                let body = response.bytes_stream().map_ok(|b| b.to_vec()).boxed();
                self.phase = Phase::Streaming(body);
            }
            Phase::Streaming(body) => {
                let next = match race(&self.signal, within(self.idle, body.next())).await {
                    None => return self.abort(),
                    Some(None) => {
                        let chunk = self
                            .body
                            .asm
                            .fail_chunk("TIMEOUT", self.silence("while streaming the response"));
                        return self.end(chunk);
                    }
                    Some(Some(next)) => next,
                };
                match next {
                    Some(Ok(bytes)) => {
                        if self.body.feed(&bytes, &mut self.queue) {
                            self.phase = Phase::Done;
                        }
                    }
                    Some(Err(e)) => {
                        let chunk = self.body.asm.fail_chunk(
                            "STREAM_ERROR",
                            format!("reading the response stream failed: {}", error_chain(&e)),
                        );
                        self.end(chunk);
                    }
                    None => {
                        self.body.end(&mut self.queue);
                        self.phase = Phase::Done;
                    }
                }
            }
            Phase::Done => {}
        }
    }

    /// The message of an idle timeout hit `when`.
    fn silence(&self, when: &str) -> String {
        let secs = self.idle.unwrap_or_default().as_secs_f64();
        format!("the server sent nothing for {secs} s {when} (idle timeout)")
    }

    fn end(&mut self, finish: StreamChunk) {
        self.queue.push_back(finish);
        self.phase = Phase::Done;
    }

    fn abort(&mut self) {
        self.aborted = true;
        self.end(StreamChunk::Finish {
            reason: FinishReason::Aborted {
                failure: aborted_failure(&self.signal),
            },
            replay_state: None,
        });
    }
}

/// The event stream of a successful response, parsed incrementally. It does no I/O: [`Call`]
/// feeds it each read of the body, so any framing of the same bytes yields the same chunks.
#[derive(Debug, Default)]
struct BodyParser {
    decoder: SseDecoder,
    asm: Assembler,
}

impl BodyParser {
    /// Feeds one read of the body and appends the chunks it completes to `out`; returns
    /// whether the stream ended (its `finish` is then the last chunk in `out`, and the rest of
    /// the body must be ignored).
    fn feed(&mut self, bytes: &[u8], out: &mut VecDeque<StreamChunk>) -> bool {
        let ended = self
            .decoder
            .feed(bytes)
            .into_iter()
            .any(|event| self.on_event(&event, out));
        ended || self.check_size(out)
    }

    /// Ends the stream with `BAD_RESPONSE` when an event outgrew [`MAX_EVENT_BYTES`]; returns
    /// whether it did.
    fn check_size(&mut self, out: &mut VecDeque<StreamChunk>) -> bool {
        if !self.decoder.too_large() {
            return false;
        }
        out.push_back(self.asm.fail_chunk(
            "BAD_RESPONSE",
            format!("the provider sent an event of more than {MAX_EVENT_BYTES} bytes"),
        ));
        true
    }

    /// The body ended (without [`feed`](Self::feed) having ended the stream): appends the
    /// final chunks, the last of them a `finish`.
    fn end(&mut self, out: &mut VecDeque<StreamChunk>) {
        if self.check_size(out) {
            return;
        }
        if let Some(event) = self.decoder.finish()
            && self.on_event(&event, out)
        {
            return;
        }
        out.extend(self.asm.finish(false));
    }

    /// Handles one event; returns whether the stream ended.
    fn on_event(&mut self, event: &SseEvent, out: &mut VecDeque<StreamChunk>) -> bool {
        let data = match std::str::from_utf8(&event.data) {
            Ok(data) => data,
            Err(e) => {
                out.push_back(self.asm.fail_chunk(
                    "BAD_RESPONSE",
                    format!("the provider sent an event that is not valid UTF-8: {e}"),
                ));
                return true;
            }
        };
        // An event without data (`data:` alone) carries nothing: a keep-alive, not damage.
        if data.trim().is_empty() {
            return false;
        }
        if event.error {
            // `event: error`: whatever its data says is the provider's error.
            out.push_back(StreamChunk::Finish {
                reason: FinishReason::Error {
                    failure: self.asm.on_error_event(data),
                },
                replay_state: None,
            });
            return true;
        }
        if data.trim() == "[DONE]" {
            out.extend(self.asm.finish(true));
            return true;
        }
        match self.asm.on_data(data) {
            Ok(chunks) => {
                out.extend(chunks);
                false
            }
            Err(failure) => {
                out.push_back(StreamChunk::Finish {
                    reason: FinishReason::Error { failure },
                    replay_state: None,
                });
                true
            }
        }
    }
}

/// Runs `fut` unless `signal` is (or becomes) cancelled first, in which case `None`.
async fn race<F: Future>(signal: &Signal, fut: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        () = signal.cancelled() => None,
        out = fut => Some(out),
    }
}

/// Runs `fut` unless `idle` is set and passes first, in which case `None`.
async fn within<F: Future>(idle: Option<Duration>, fut: F) -> Option<F::Output> {
    match idle {
        Some(limit) => tokio::time::timeout(limit, fut).await.ok(),
        None => Some(fut.await),
    }
}

/// Reads at most [`ERROR_BODY_CAP`] bytes of a response body (errors, and a wait for a read
/// longer than `idle`, end the read).
async fn read_capped(response: reqwest::Response, idle: Option<Duration>) -> Vec<u8> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(Some(Ok(bytes))) = within(idle, stream.next()).await {
        body.extend_from_slice(&bytes);
        if body.len() >= ERROR_BODY_CAP {
            body.truncate(ERROR_BODY_CAP);
            break;
        }
    }
    body
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v: &HeaderValue| v.to_str().ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The retry-after hint in milliseconds: `retry-after-ms`, else `retry-after` as (possibly
/// fractional) seconds or an HTTP date.
fn retry_after_ms(headers: &HeaderMap) -> Option<u64> {
    if let Some(ms) = header_str(headers, "retry-after-ms").and_then(|s| s.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(ms.round() as u64);
    }
    let value = header_str(headers, "retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| (secs * 1000.0).round() as u64);
    }
    let at = httpdate::parse_http_date(&value).ok()?;
    Some(
        at.duration_since(SystemTime::now())
            .map_or(0, |d| d.as_millis() as u64),
    )
}

/// The adapter's code for an HTTP error status: the one table both a non-2xx response and a
/// status-like `code` in a stream's error ([`assemble`]) go through. A status it does not name
/// is `HTTP_<status>`.
pub(super) fn status_code(status: u16) -> String {
    match status {
        400 => "BAD_REQUEST".to_owned(),
        401 => "AUTHENTICATION".to_owned(),
        403 => "PERMISSION_DENIED".to_owned(),
        404 => "NOT_FOUND".to_owned(),
        408 | 504 => "TIMEOUT".to_owned(),
        413 => "REQUEST_TOO_LARGE".to_owned(),
        429 => "RATE_LIMITED".to_owned(),
        500 => "SERVER_ERROR".to_owned(),
        502 => "BAD_GATEWAY".to_owned(),
        503 => "UNAVAILABLE".to_owned(),
        529 => "OVERLOADED".to_owned(),
        other => format!("HTTP_{other}"),
    }
}

/// The failure for a non-2xx response.
fn http_failure(status: u16, reason: Option<&str>, headers: &HeaderMap, body: &[u8]) -> LlmFailure {
    let code = status_code(status);
    let provider_message = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error").filter(|e| e.is_string()))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let message = provider_message.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        let line = format!("HTTP {status} {}", reason.unwrap_or(""));
        if text.is_empty() {
            line.trim_end().to_owned()
        } else {
            format!("{}: {text}", line.trim_end())
        }
    });
    LlmFailure {
        message: cap(message),
        code,
        status: Some(status),
        provider_retry_after_ms: retry_after_ms(headers),
        request_id: header_str(headers, "x-request-id"),
    }
}

/// A successful response's body that is one document, not an event stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Document {
    /// `application/json` or a `+json` type.
    Json,
    /// `text/html` (a proxy's or a web server's page: usually a wrong base URL).
    Html,
}

/// What a successful response's `content-type` says its body is, when that is not an event
/// stream (a missing or other type is read as a stream).
fn not_an_event_stream(headers: &HeaderMap) -> Option<Document> {
    let value = header_str(headers, "content-type")?;
    let media = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if media == "application/json" || (media.starts_with("application/") && media.ends_with("+json")) {
        Some(Document::Json)
    } else if media == "text/html" {
        Some(Document::Html)
    } else {
        None
    }
}

/// The failure for a successful response whose body is one document instead of an event
/// stream: the provider's own error when the JSON document is one — recognised as an error
/// event in a stream is ([`Assembler::provider_error`]: an `{"error": …}`, or a document
/// without `choices` that is itself the error, such as vLLM's `{"object": "error", "message":
/// …}`), with its message and code — else `BAD_RESPONSE` saying what came instead.
fn document_instead_of_stream(kind: Document, headers: &HeaderMap, body: &[u8]) -> LlmFailure {
    let mut asm = Assembler::default();
    asm.request_id = header_str(headers, "x-request-id");
    let document = match kind {
        Document::Json => serde_json::from_slice::<Value>(body).ok(),
        Document::Html => None,
    };
    let mut failure = match (kind, document.as_ref().and_then(|d| asm.provider_error(d))) {
        (_, Some(error)) => error,
        (Document::Json, None) => asm.failure(
            "BAD_RESPONSE",
            "the provider answered with one JSON document instead of an event stream (does the \
             server support `stream: true`?)",
        ),
        (Document::Html, None) => asm.failure(
            "BAD_RESPONSE",
            "the provider answered with an HTML page instead of an event stream (is the base URL \
             the API's, up to its version segment?)",
        ),
    };
    failure.provider_retry_after_ms = retry_after_ms(headers);
    failure
}

/// The `finish {error}` chunk for a failure to send the request.
fn transport_failure(e: &reqwest::Error) -> StreamChunk {
    let code = if e.is_timeout() {
        "TIMEOUT"
    } else if e.is_connect() {
        "CONNECTION_FAILED"
    } else {
        "NETWORK_ERROR"
    };
    StreamChunk::Finish {
        reason: FinishReason::Error {
            failure: LlmFailure::new(code, cap(error_chain(e))),
        },
        replay_state: None,
    }
}

/// Caps a message at [`MESSAGE_CAP`] bytes on a char boundary.
pub(crate) fn cap(mut message: String) -> String {
    if message.len() > MESSAGE_CAP {
        let mut end = MESSAGE_CAP;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after_ms(&h), Some(2000));
        h.insert("retry-after", HeaderValue::from_static("1.5"));
        assert_eq!(retry_after_ms(&h), Some(1500));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after_ms(&h), Some(250));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after_ms(&h), Some(0));
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after_ms(&h), None);
    }

    #[test]
    fn cap_respects_char_boundaries() {
        let s = "é".repeat(MESSAGE_CAP);
        let capped = cap(s);
        assert!(capped.len() <= MESSAGE_CAP);
        assert!(capped.chars().all(|c| c == 'é'));
    }

    /// A 2xx answer whose JSON document is the provider's error in any shape a stream's error
    /// event may take — `{"error": …}`, or vLLM's top-level `{"object": "error", "message": …,
    /// "type": …, "code": 400}` — surfaces the provider's message and code (as the same error
    /// in a stream would), not a generic `BAD_RESPONSE`. A completion document is still one.
    #[test]
    fn a_json_document_that_is_the_providers_error_surfaces_it() {
        let mut headers = HeaderMap::new();
        headers.insert("x-request-id", HeaderValue::from_static("req_1"));
        headers.insert("retry-after", HeaderValue::from_static("3"));
        let cases: [(&str, &str, &str); 5] = [
            (
                r#"{"object": "error", "message": "This model's maximum context length is 4096 tokens.", "type": "BadRequestError", "param": null, "code": 400}"#,
                "BAD_REQUEST",
                "This model's maximum context length is 4096 tokens. (provider code: 400)",
            ),
            (
                r#"{"object": "error", "message": "model not loaded", "type": "error", "code": 503}"#,
                "UNAVAILABLE",
                "model not loaded (provider code: 503)",
            ),
            (
                r#"{"message": "upstream overloaded", "code": "overloaded"}"#,
                "OVERLOADED",
                "upstream overloaded",
            ),
            (
                r#"{"error": {"message": "quota exceeded", "type": "insufficient_quota"}}"#,
                "INSUFFICIENT_QUOTA",
                "quota exceeded",
            ),
            (
                r#"{"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "hi"}}]}"#,
                "BAD_RESPONSE",
                "the provider answered with one JSON document instead of an event stream",
            ),
        ];
        for (body, code, message) in cases {
            let f = document_instead_of_stream(Document::Json, &headers, body.as_bytes());
            assert_eq!(f.code, code, "{body}: {f:?}");
            assert!(f.message.starts_with(message), "{body}: {f:?}");
            assert_eq!(f.request_id.as_deref(), Some("req_1"), "{body}");
            assert_eq!(f.provider_retry_after_ms, Some(3000), "{body}");
            assert_eq!(f.status, None, "a 2xx answer: {body}");
        }
    }

    #[test]
    fn http_failure_uses_provider_message() {
        let f = http_failure(
            400,
            Some("Bad Request"),
            &HeaderMap::new(),
            br#"{"error": {"message": "bad tools", "type": "invalid_request_error"}}"#,
        );
        assert_eq!(
            (f.code.as_str(), f.message.as_str(), f.status),
            ("BAD_REQUEST", "bad tools", Some(400))
        );
    }
}
