//! [`ScriptedModel`]: the deterministic model adapter every test uses (spec §13.4).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use agent::model::BlockType;
use agent::{FinishReason, GenerateOptions, LlmFailure, ModelAdapter, ModelStream, Signal, StreamChunk};
use futures::StreamExt as _;
use futures::stream;
use parking_lot::Mutex;

use super::aborted_failure;
use super::chunks::finish_chunk;

/// A function of the request that produces the response's chunks.
pub type Responder = Arc<dyn Fn(&GenerateOptions) -> Vec<StreamChunk> + Send + Sync>;

/// How late a [`ScriptEntry::HangSlow`] notices cancellation.
pub const HANG_SLOW_DELAY: Duration = Duration::from_millis(50);

/// One scripted model call.
#[derive(Clone)]
#[non_exhaustive]
pub enum ScriptEntry {
    /// Emit these chunks, immediately and in order (build them with
    /// [`chunks`](super::chunks)).
    Chunks(Vec<StreamChunk>),
    /// Call the function with the request when the call starts and emit what it returns.
    Respond(Responder),
    /// Emit `block-start {0, text}` and `text-delta {0, "partial"}`, then wait for the request's
    /// signal and end with `finish {aborted {failure: {code: ABORTED, message: <cause>}}}`.
    Hang,
    /// Like [`ScriptEntry::Hang`], but notice cancellation [`HANG_SLOW_DELAY`] late (a
    /// `tokio::time::sleep`, so a paused test clock controls it).
    HangSlow,
    /// Emit these chunks, then wait for cancellation and end like [`ScriptEntry::Hang`]. The
    /// chunks may leave blocks open (an aborted finish allows that).
    HangAfter(Vec<StreamChunk>),
    /// Fail the call as an adapter throw: the stream yields `Err(failure)` and ends.
    Fail(LlmFailure),
}

impl fmt::Debug for ScriptEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Chunks(c) => f.debug_tuple("Chunks").field(c).finish(),
            Self::Respond(_) => f.write_str("Respond(..)"),
            Self::Hang => f.write_str("Hang"),
            Self::HangSlow => f.write_str("HangSlow"),
            Self::HangAfter(c) => f.debug_tuple("HangAfter").field(c).finish(),
            Self::Fail(e) => f.debug_tuple("Fail").field(e).finish(),
        }
    }
}

impl From<Vec<StreamChunk>> for ScriptEntry {
    fn from(chunks: Vec<StreamChunk>) -> Self {
        Self::Chunks(chunks)
    }
}

impl ScriptEntry {
    /// A [`ScriptEntry::Respond`] entry.
    pub fn respond(f: impl Fn(&GenerateOptions) -> Vec<StreamChunk> + Send + Sync + 'static) -> Self {
        Self::Respond(Arc::new(f))
    }

    /// A [`ScriptEntry::Hang`] entry.
    pub fn hang() -> Self {
        Self::Hang
    }

    /// A [`ScriptEntry::HangSlow`] entry.
    pub fn hang_slow() -> Self {
        Self::HangSlow
    }

    /// A [`ScriptEntry::HangAfter`] entry.
    pub fn hang_after(chunks: Vec<StreamChunk>) -> Self {
        Self::HangAfter(chunks)
    }

    /// A [`ScriptEntry::Fail`] entry.
    pub fn fail(failure: LlmFailure) -> Self {
        Self::Fail(failure)
    }
}

#[derive(Default)]
struct Inner {
    /// Entries not yet consumed, front first.
    script: Mutex<VecDeque<ScriptEntry>>,
    /// Every request received, in call order.
    requests: Mutex<Vec<Arc<GenerateOptions>>>,
}

/// A deterministic [`ModelAdapter`]: each call consumes the next [`ScriptEntry`] and every
/// request is recorded.
///
/// * Cloning is cheap and yields a handle to the **same** script and record (an `Arc` inside),
///   so a test keeps one handle while the runtime owns another.
/// * An exhausted script makes the call fail as an adapter throw,
///   `Err(LlmFailure::unknown("script exhausted"))` — the loop turns that into a structured
///   `UNKNOWN` turn error.
/// * Every stream built from the [`chunks`](super::chunks) helpers obeys the stream grammar;
///   hanging entries end with an `aborted` finish (open blocks allowed) once the request's
///   [`Signal`] is cancelled. Chunk lists and responders are emitted as given.
/// * Streams own no task: dropping one mid-hang simply stops waiting.
#[derive(Clone, Default)]
pub struct ScriptedModel {
    inner: Arc<Inner>,
}

impl fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("remaining", &self.remaining())
            .field("requests", &self.inner.requests.lock().len())
            .finish()
    }
}

impl ScriptedModel {
    /// A model that will answer with `entries`, one per call, in order. Chunk lists convert
    /// with `.into()` when mixed with other entries:
    ///
    /// ```
    /// use agent_loop::model::chunks;
    /// use agent_loop::{ScriptEntry, ScriptedModel};
    ///
    /// let model = ScriptedModel::new([
    ///     chunks::text_and_tool_call("Reading.", "c1", "read", serde_json::json!({"path": "a"})).into(),
    ///     ScriptEntry::hang(),
    /// ]);
    /// assert_eq!(model.remaining(), 2);
    /// ```
    pub fn new(entries: impl IntoIterator<Item = impl Into<ScriptEntry>>) -> Self {
        let model = Self::default();
        model
            .inner
            .script
            .lock()
            .extend(entries.into_iter().map(Into::into));
        model
    }

    /// Appends an entry to the end of the script.
    pub fn push(&self, entry: impl Into<ScriptEntry>) {
        self.inner.script.lock().push_back(entry.into());
    }

    /// How many entries are left.
    pub fn remaining(&self) -> usize {
        self.inner.script.lock().len()
    }

    /// Every request received so far, in call order.
    pub fn requests(&self) -> Vec<Arc<GenerateOptions>> {
        self.inner.requests.lock().clone()
    }

    /// The most recent request.
    pub fn last_request(&self) -> Option<Arc<GenerateOptions>> {
        self.inner.requests.lock().last().cloned()
    }

    /// This model as a shared adapter (`Arc<dyn ModelAdapter>`), still sharing the script.
    pub fn adapter(&self) -> Arc<dyn ModelAdapter> {
        Arc::new(self.clone())
    }
}

impl ModelAdapter for ScriptedModel {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        self.inner.requests.lock().push(request.clone());
        let entry = self.inner.script.lock().pop_front();
        match entry {
            None => stream::iter([Err(LlmFailure::unknown("script exhausted"))]).boxed(),
            Some(ScriptEntry::Chunks(chunks)) => stream::iter(chunks.into_iter().map(Ok)).boxed(),
            Some(ScriptEntry::Respond(f)) => stream::iter(f(&request).into_iter().map(Ok)).boxed(),
            Some(ScriptEntry::Fail(failure)) => stream::iter([Err(failure)]).boxed(),
            Some(ScriptEntry::Hang) => hang(partial(), request.signal.clone(), None),
            Some(ScriptEntry::HangSlow) => hang(partial(), request.signal.clone(), Some(HANG_SLOW_DELAY)),
            Some(ScriptEntry::HangAfter(chunks)) => hang(chunks, request.signal.clone(), None),
        }
    }
}

/// The chunks a plain hang emits before waiting.
fn partial() -> Vec<StreamChunk> {
    vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Text,
        },
        StreamChunk::TextDelta {
            index: 0,
            text: "partial".into(),
        },
    ]
}

/// `before`, then (after cancellation and an optional delay) an aborted finish.
fn hang(before: Vec<StreamChunk>, signal: Signal, late_by: Option<Duration>) -> ModelStream {
    let end = stream::once(async move {
        signal.cancelled().await;
        if let Some(delay) = late_by {
            tokio::time::sleep(delay).await;
        }
        Ok(finish_chunk(FinishReason::Aborted {
            failure: aborted_failure(&signal),
        }))
    });
    stream::iter(before.into_iter().map(Ok)).chain(end).boxed()
}
