//! Shared helpers for the agent and runtime tests.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::Value;

use agent::store::LoadedSession;
use agent::tools::{ToolContext, ToolDefinition, ToolError, ToolHandler, ToolOutput};
use agent::{
    Agent, AgentError, AgentEvent, AgentHandle, AgentOptions, AgentRuntime, ContentBlock, CreateAgentOptions,
    EventData, Message, Registration, SessionEvent, SessionHeader, SessionId, SessionPersistence,
    TurnEndReason,
};

use super::{Runtime, RuntimeBuilder, assert_quiescent};
use crate::model::ScriptedModel;

/// The provider/model route every test agent uses.
pub(crate) const MOCK: &str = "mock";

/// A runtime with `model` serving [`MOCK`].
pub(crate) fn runtime(model: &ScriptedModel) -> Runtime {
    builder(model).build()
}

thread_local! {
    /// The invariant checkers of the runtimes this test thread built.
    static CHECKERS: std::cell::RefCell<Vec<Arc<invariants::InvariantObserver>>> = const {
        std::cell::RefCell::new(Vec::new())
    };
}

/// A builder with `model` serving [`MOCK`] and the online invariant checker installed into
/// every session ([`finish`] asserts it recorded no violation).
pub(crate) fn builder(model: &ScriptedModel) -> RuntimeBuilder {
    builder_over(model.adapter())
}

/// [`builder`] over any adapter serving [`MOCK`] (a [`Trickle`](crate::model::Trickle)-wrapped
/// script, say).
pub(crate) fn builder_over(adapter: Arc<dyn agent::ModelAdapter>) -> RuntimeBuilder {
    let checker = invariants::InvariantObserver::shared();
    CHECKERS.with(|c| c.borrow_mut().push(checker.clone()));
    Runtime::builder().model(MOCK, adapter).session_observer(checker)
}

/// Options routed to the scripted model.
pub(crate) fn mock_options() -> AgentOptions {
    AgentOptions {
        provider: Some(MOCK.into()),
        model: Some(MOCK.into()),
        ..AgentOptions::default()
    }
}

/// Options creating agent `id` routed to the scripted model.
pub(crate) fn create_options(id: &str) -> CreateAgentOptions {
    let mut o = CreateAgentOptions::new(id.into());
    o.agent_options = mock_options();
    o
}

/// Options resuming stored session `id` routed to the scripted model (no signal, setup or owner).
pub(crate) fn resume_options(id: &str) -> agent::ResumeAgentOptions {
    agent::ResumeAgentOptions {
        session_id: id.into(),
        agent_options: mock_options(),
        signal: None,
        setup: None,
        owner: None,
    }
}

/// Creates a published agent routed to the scripted model.
pub(crate) async fn create(rt: &Runtime, id: &str) -> AgentHandle {
    let mut options = CreateAgentOptions::new(id.into());
    options.agent_options = mock_options();
    rt.create(options).await.expect("test agent creation succeeds")
}

/// A direct caller's prompt.
pub(crate) fn user(text: &str) -> Message {
    Message::user_text(text)
}

/// Lets every runnable task run until all of them wait (the paused clock advances only when
/// nothing can run).
pub(crate) async fn settle() {
    tokio::time::sleep(Duration::from_millis(30)).await;
}

/// The texts of every `user/message` in the log.
pub(crate) fn user_texts(agent: &dyn Agent) -> Vec<String> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) => Some(m.text()),
            _ => None,
        })
        .collect()
}

/// Every `turn/end` reason, in order.
pub(crate) fn turn_ends(agent: &dyn Agent) -> Vec<TurnEndReason> {
    agent
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::TurnEnd { reason, .. } => Some(reason.clone()),
            _ => None,
        })
        .collect()
}

/// Every event type, in order.
pub(crate) fn types(agent: &dyn Agent) -> Vec<String> {
    agent
        .session()
        .events()
        .iter()
        .map(|e| e.type_name().to_owned())
        .collect()
}

/// How many events of type `kind` the log holds.
pub(crate) fn count(agent: &dyn Agent, kind: &str) -> usize {
    types(agent).iter().filter(|t| *t == kind).count()
}

/// Records every agent event (global listener); drop the guard before asserting quiescence.
pub(crate) fn record_events(rt: &Runtime) -> (Arc<Mutex<Vec<AgentEvent>>>, Registration) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let guard = rt.services().agent_events.on(move |e| {
        sink.lock().push(e.clone());
        Ok(())
    });
    (seen, guard)
}

/// Disposes the handles, shuts the runtime down and asserts quiescence.
pub(crate) async fn finish(rt: &Runtime, handles: impl IntoIterator<Item = AgentHandle>) {
    for handle in handles {
        handle.dispose().await;
    }
    rt.shutdown().await;
    assert_quiescent(rt);
    let violations: Vec<String> = CHECKERS.with(|c| {
        c.borrow()
            .iter()
            .flat_map(|checker| checker.violations())
            .map(|v| format!("{v:?}"))
            .collect()
    });
    assert!(violations.is_empty(), "invariant violations: {violations:#?}");
}

/// A tool whose body is a closure.
pub(crate) struct FnTool<F>(pub(crate) F);

#[async_trait]
impl<F, Fut> ToolHandler for FnTool<F>
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
{
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        (self.0)(arguments, ctx).await
    }
}

/// A global tool definition (exclusive) with a closure body.
pub(crate) fn tool<F, Fut>(name: &str, body: F) -> ToolDefinition
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
{
    ToolDefinition {
        name: name.into(),
        description: format!("test tool {name}"),
        parameters: serde_json::json!({"type": "object"}),
        concurrency_safe: false,
        handler: Arc::new(FnTool(body)),
    }
}

/// The text of an assistant message's blocks.
pub(crate) fn texts(blocks: &[ContentBlock]) -> Vec<String> {
    blocks
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.clone()),
            ContentBlock::Reasoning { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// An in-memory [`SessionPersistence`] whose stored logs a test can cut (to simulate a crash).
#[derive(Default)]
pub(crate) struct TestPersistence {
    pub(crate) sessions: Mutex<HashMap<SessionId, (SessionHeader, Vec<SessionEvent>)>>,
    /// When set, `create` panics (a host persistence bug).
    pub(crate) panic_on_create: std::sync::atomic::AtomicBool,
    /// When set, appending the event with this seq fails (a full disk, say).
    pub(crate) fail_append_at: Mutex<Option<u64>>,
}

impl TestPersistence {
    /// Keeps only the first `len` events of a stored session.
    pub(crate) fn truncate(&self, id: &SessionId, len: usize) {
        if let Some((_, events)) = self.sessions.lock().get_mut(id) {
            events.truncate(len);
        }
    }

    /// The stored events of a session.
    pub(crate) fn events(&self, id: &SessionId) -> Vec<SessionEvent> {
        self.sessions
            .lock()
            .get(id)
            .map(|(_, e)| e.clone())
            .unwrap_or_default()
    }
}

#[async_trait]
impl SessionPersistence for TestPersistence {
    fn create(&self, header: &SessionHeader) -> Result<(), AgentError> {
        assert!(
            !self.panic_on_create.load(std::sync::atomic::Ordering::Relaxed),
            "persistence exploded"
        );
        let mut sessions = self.sessions.lock();
        if sessions.contains_key(&header.id) {
            return Err(AgentError::Duplicate(header.id.clone()));
        }
        sessions.insert(header.id.clone(), (header.clone(), Vec::new()));
        Ok(())
    }

    fn append(&self, id: &SessionId, event: &SessionEvent) -> Result<(), AgentError> {
        let mut sessions = self.sessions.lock();
        let (_, events) = sessions
            .get_mut(id)
            .ok_or_else(|| AgentError::NotFound(id.clone()))?;
        if *self.fail_append_at.lock() == Some(event.seq) {
            return Err(AgentError::Persistence(format!(
                "no space left for seq {}",
                event.seq
            )));
        }
        if event.seq != events.len() as u64 {
            return Err(AgentError::Persistence(format!(
                "seq {} out of order (expected {})",
                event.seq,
                events.len()
            )));
        }
        events.push(event.clone());
        Ok(())
    }

    async fn flush(&self, _id: &SessionId) -> Result<(), AgentError> {
        Ok(())
    }

    async fn list(&self) -> Result<Vec<SessionHeader>, AgentError> {
        Ok(self.sessions.lock().values().map(|(h, _)| h.clone()).collect())
    }

    async fn inspect(&self, id: &SessionId) -> Result<Option<SessionHeader>, AgentError> {
        Ok(self.sessions.lock().get(id).map(|(h, _)| h.clone()))
    }

    async fn load(&self, id: &SessionId) -> Result<LoadedSession, AgentError> {
        let sessions = self.sessions.lock();
        let (header, events) = sessions.get(id).ok_or_else(|| AgentError::NotFound(id.clone()))?;
        Ok(LoadedSession {
            header: header.clone(),
            events: events.clone(),
        })
    }
}
