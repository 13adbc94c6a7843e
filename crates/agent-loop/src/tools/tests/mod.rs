//! Tests of the tool registry, its pipeline and the step scheduler.

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::{Value, json};

use agent::tools::{
    ExecutedTool, ToolCallRequest, ToolContext, ToolDefinition, ToolError, ToolHandler, ToolOutput,
};
use agent::{CallId, ContentBlock, SessionId, Signal, Tools};

use super::ToolRegistry;

mod pipeline;
mod registry;
mod schedule;

type BodyFn = dyn Fn(Value, ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> + Send + Sync;

/// A tool body built from a closure.
struct FnHandler(Box<BodyFn>);

#[async_trait]
impl ToolHandler for FnHandler {
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        (self.0)(arguments, ctx).await
    }
}

/// A definition whose body is `body`.
fn tool_with(
    name: &str,
    concurrency_safe: bool,
    body: impl Fn(Value, ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> + Send + Sync + 'static,
) -> ToolDefinition {
    ToolDefinition {
        name: name.to_owned(),
        description: format!("tool {name}"),
        parameters: json!({"type": "object", "properties": {}}),
        concurrency_safe,
        handler: Arc::new(FnHandler(Box::new(body))),
    }
}

/// A definition that replies `reply`.
fn tool_replying(name: &str, reply: &str) -> ToolDefinition {
    let reply = reply.to_owned();
    tool_with(name, false, move |_, _| {
        let reply = reply.clone();
        Box::pin(async move { Ok(ToolOutput::text(reply)) })
    })
}

/// A definition that replies `ran:<name>`.
fn tool(name: &str) -> ToolDefinition {
    tool_replying(name, &format!("ran:{name}"))
}

fn sid(id: &str) -> SessionId {
    SessionId::from(id)
}

fn call(id: &str, name: &str, arguments: &str) -> ToolCallRequest {
    ToolCallRequest {
        call_id: CallId::from(id),
        name: name.to_owned(),
        arguments: arguments.to_owned(),
    }
}

/// The first text block of a result.
fn text(executed: &ExecutedTool) -> String {
    match executed.result.content.first() {
        Some(ContentBlock::Text { text }) => text.clone(),
        other => format!("{other:?}"),
    }
}

/// The error code of a result (empty on success).
fn code(executed: &ExecutedTool) -> String {
    executed
        .result
        .error
        .as_ref()
        .map(|e| e.code.clone())
        .unwrap_or_default()
}

/// Executes `name` with `{}` as agent `agent` and returns the first text block.
async fn run(registry: &ToolRegistry, name: &str, agent: &str) -> String {
    let executed = registry
        .execute(&sid(agent), call("c1", name, "{}"), Signal::new())
        .await;
    text(&executed)
}

/// Schema names visible to `scope`.
fn names(registry: &ToolRegistry, scope: Option<&str>) -> Vec<String> {
    let scope = scope.map(sid);
    registry
        .schemas(scope.as_ref())
        .into_iter()
        .map(|s| s.name)
        .collect()
}

/// A shared, ordered event log.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, entry: impl Into<String>) {
        self.0.lock().push(entry.into());
    }

    fn entries(&self) -> Vec<String> {
        self.0.lock().clone()
    }

    fn index(&self, entry: &str) -> usize {
        self.entries()
            .iter()
            .position(|e| e == entry)
            .unwrap_or_else(|| panic!("{entry} not in log {:?}", self.entries()))
    }
}
