//! Structured output for in-process children (spec `inprocess-providers.md` §3.10): a forced,
//! child-scoped `structured_output` capture tool whose value is committed only on the
//! authoritative final result of its own execution.
//!
//! [`StructuredCapture::attach`] installs, through the child's scoped [`Ctx`] during the
//! unpublished setup window:
//!
//! 1. **the tool** [`STRUCTURED_OUTPUT_TOOL`] with the requested schema verbatim as its
//!    parameters. It is exclusive (not concurrency-safe), so it is a barrier within a step. Its
//!    body validates the arguments with the seam's [`validate_structured`] (a violation is an
//!    `INVALID_ARGS` error result the model can retry within the same turn), *stages* the value
//!    keyed by **this execution's** [`ExecutionId`] (call ids may repeat, execution ids never
//!    do), marks the result as concluding the turn and returns `{"recorded": true}` rendered as
//!    [`STRUCTURED_OUTPUT_RECORDED`];
//! 2. **the instruction** as the scoped prompt section [`STRUCTURED_OUTPUT_SECTION`] at order
//!    [`STRUCTURED_OUTPUT_SECTION_ORDER`] (it is appended to, never replaces, the rest of the
//!    system text, and only this child sees it);
//! 3. **the guard** (monotonic): once a value is captured, every further call of this child is
//!    denied with [`structured_output_already_recorded`]. Guards run after the whole
//!    pre-execute chain and can only deny, so no later "allow" policy resurrects dispatch;
//! 4. **the commit observer** on this child's tool results: for a capture execution it takes
//!    (and deletes) that execution's own stage and commits it only when the final result —
//!    after every pre/post policy and normalisation — succeeded, and only if nothing was
//!    captured before. A blocked, denied or invalid execution therefore never commits, and a
//!    discarded stage is never promoted by a later call (even one reusing the call id).
//!
//! A clean finish without a committed value is reported `error` by the driver; there is no
//! re-prompt. Code Mode (nested captures committed through an enclosing `run_code`) is left out
//! of this workspace, so there is no *pending* nested capture: the Rust equivalent is the plain
//! two-phase commit above.
//!
//! Every piece is a child-scoped registration: concurrent children never interact, nothing is
//! registered globally (the tool is unknown to every other agent), and disposing the child
//! removes all of it. Unloading the provider does not.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::{Value, json};
use subagent::agent::content::ContentBlock;
use subagent::agent::prompt::PromptSection;
use subagent::agent::tools::{
    ExecutionId, ToolContext, ToolDefinition, ToolError, ToolExecution, ToolHandler, ToolOutput, ToolResult,
};
use subagent::agent::{AgentError, Ctx};
use subagent::validate_structured;

use crate::model_text::{
    STRUCTURED_OUTPUT_DESCRIPTION, STRUCTURED_OUTPUT_INSTRUCTION, STRUCTURED_OUTPUT_RECORDED,
    STRUCTURED_OUTPUT_SECTION, STRUCTURED_OUTPUT_SECTION_ORDER, STRUCTURED_OUTPUT_TOOL,
    structured_output_already_recorded,
};

/// The live state of one structured run. Shared (`Arc`) between the driver, which reads the
/// committed value once the child settles, and the child-scoped registrations that write it.
///
/// # Ownership and drop
/// The driver keeps one `Arc` to read the committed value; the child-scoped registrations keep
/// the others and are undone (dropping their `Arc`s) when the child's scope is disposed. Nothing
/// here spawns work or waits; a stage whose execution never reports a final result is dropped
/// with the state.
///
/// # Locking
/// `staged` (values awaiting their own execution's final result) and `captured` (the committed
/// value) are each guarded by a short `parking_lot` section; neither is held across an `.await`
/// or while calling out.
#[derive(Debug)]
pub struct StructuredCapture {
    schema: Value,
    staged: Mutex<HashMap<ExecutionId, Value>>,
    captured: Mutex<Option<Value>>,
}

impl StructuredCapture {
    /// State for a run whose output must satisfy `schema` (already asserted by the service to
    /// be an object-rooted schema in the enforced subset).
    pub fn new(schema: Value) -> Arc<Self> {
        Arc::new(Self {
            schema,
            staged: Mutex::new(HashMap::new()),
            captured: Mutex::new(None),
        })
    }

    /// The requested schema (the tool's parameters).
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// The committed value, once a capture call's authoritative final result succeeded.
    pub fn captured(&self) -> Option<Value> {
        self.captured.lock().clone()
    }

    /// Installs the tool, the instruction, the guard and the commit observer through the
    /// child's **scoped** context (see the module docs). Every registration is adopted by the
    /// child's scope and undone with it.
    ///
    /// # Errors
    /// [`AgentError::Inactive`] for an unscoped or disposed context; the registry's error for a
    /// refused registration. Registrations made before a failure stay with the child's scope,
    /// which the creation transaction's rollback disposes.
    pub fn attach(self: &Arc<Self>, child: &Ctx) -> Result<(), AgentError> {
        if child.scope_key().is_none() {
            return Err(AgentError::Inactive(subagent::agent::ScopeInactive(
                subagent::agent::SessionId::from("<global context>"),
            )));
        }
        drop(child.register_tool(ToolDefinition {
            name: STRUCTURED_OUTPUT_TOOL.to_owned(),
            description: STRUCTURED_OUTPUT_DESCRIPTION.to_owned(),
            parameters: self.schema.clone(),
            concurrency_safe: false,
            handler: Arc::new(CaptureTool(self.clone())),
        })?);
        drop(child.prompt_section(PromptSection {
            name: STRUCTURED_OUTPUT_SECTION.to_owned(),
            order: STRUCTURED_OUTPUT_SECTION_ORDER,
            text: STRUCTURED_OUTPUT_INSTRUCTION.to_owned(),
            tool: None,
        })?);
        let state = self.clone();
        drop(child.guard_tools(Arc::new(move |execution: &ToolExecution| {
            state
                .captured
                .lock()
                .is_some()
                .then(|| structured_output_already_recorded(&execution.name))
        }))?);
        let state = self.clone();
        drop(
            child.on_tool_result(Arc::new(move |execution: &ToolExecution, result: &ToolResult| {
                state.commit(execution, result);
            }))?,
        );
        Ok(())
    }

    /// Stages `value` for `execution` (the body's half of the two-phase commit).
    fn stage(&self, execution: ExecutionId, value: Value) {
        self.staged.lock().insert(execution, value);
    }

    /// The commit observer: the authoritative final outcome of one execution of this child.
    fn commit(&self, execution: &ToolExecution, result: &ToolResult) {
        if execution.name != STRUCTURED_OUTPUT_TOOL {
            return;
        }
        // Take and delete this execution's own stage, whatever the outcome.
        let Some(value) = self.staged.lock().remove(&execution.id) else {
            return;
        };
        if result.is_error {
            return;
        }
        let mut captured = self.captured.lock();
        if captured.is_none() {
            *captured = Some(value);
        }
    }
}

/// The capture tool's body.
struct CaptureTool(Arc<StructuredCapture>);

#[async_trait]
impl ToolHandler for CaptureTool {
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        validate_structured(&self.0.schema, &arguments)
            .map_err(|e| ToolError::invalid_args(e.to_string()))?;
        self.0.stage(ctx.execution.id, arguments);
        ctx.conclude_turn();
        Ok(ToolOutput {
            content: vec![ContentBlock::text(STRUCTURED_OUTPUT_RECORDED)],
            value: Some(json!({"recorded": true})),
            meta: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subagent::agent::Signal;
    use subagent::agent::ids::CallId;

    fn execution(id: u64, name: &str) -> ToolExecution {
        ToolExecution {
            id: ExecutionId(id),
            agent: "child".into(),
            call_id: CallId::from("c1"),
            name: name.into(),
            arguments: json!({}),
        }
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {"answer": {"type": "number"}}, "required": ["answer"]})
    }

    fn ok() -> ToolResult {
        ToolResult::success(ToolOutput::text(STRUCTURED_OUTPUT_RECORDED), true)
    }

    #[tokio::test]
    async fn body_validates_stages_and_concludes() {
        let state = StructuredCapture::new(schema());
        let tool = CaptureTool(state.clone());
        let exec = Arc::new(execution(1, STRUCTURED_OUTPUT_TOOL));
        let ctx = ToolContext::new(exec.clone(), Signal::new());
        let out = tool.execute(json!({"answer": 1}), ctx.clone()).await.unwrap();
        assert_eq!(out.value, Some(json!({"recorded": true})));
        assert!(ctx.concludes_turn());
        // Staged, not captured, until the authoritative result arrives.
        assert_eq!(state.captured(), None);
        state.commit(&exec, &ok());
        assert_eq!(state.captured(), Some(json!({"answer": 1})));

        let bad = ToolContext::new(Arc::new(execution(2, STRUCTURED_OUTPUT_TOOL)), Signal::new());
        let err = tool
            .execute(json!({"answer": "x"}), bad.clone())
            .await
            .unwrap_err();
        assert_eq!(err.code, subagent::agent::tools::codes::INVALID_ARGS);
        assert!(!bad.concludes_turn());
    }

    #[test]
    fn failed_results_discard_their_own_stage_only() {
        let state = StructuredCapture::new(schema());
        state.stage(ExecutionId(7), json!({"answer": 1}));
        state.commit(
            &execution(7, STRUCTURED_OUTPUT_TOOL),
            &ToolResult::failure("DENIED", "blocked"),
        );
        assert_eq!(state.captured(), None);
        // A later success of another execution never promotes the discarded stage.
        state.commit(&execution(8, STRUCTURED_OUTPUT_TOOL), &ok());
        assert_eq!(state.captured(), None);
        // Other tools are ignored.
        state.stage(ExecutionId(9), json!({"answer": 2}));
        state.commit(&execution(9, "other"), &ok());
        assert_eq!(state.captured(), None);
        state.commit(&execution(9, STRUCTURED_OUTPUT_TOOL), &ok());
        assert_eq!(state.captured(), Some(json!({"answer": 2})));
        // The first commit wins.
        state.stage(ExecutionId(10), json!({"answer": 3}));
        state.commit(&execution(10, STRUCTURED_OUTPUT_TOOL), &ok());
        assert_eq!(state.captured(), Some(json!({"answer": 2})));
    }
}
