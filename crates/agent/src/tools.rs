//! Tool contracts (spec §11): definitions, the execution context, results, scoped
//! restrictions, guards and the layered registry trait.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde_json::Value;

use crate::content::ContentBlock;
use crate::ids::{CallId, SessionId};
use crate::message::Message;
use crate::model::ToolSchema;
use crate::registration::Registration;
use crate::signal::Signal;

/// The reserved name of the Code Mode transport; it can never be registered or restricted.
pub const RESERVED_TOOL_NAME: &str = "run_code";

/// Well-known tool error codes.
pub mod codes {
    /// The tool is unknown to (or restricted away from) the calling agent.
    pub const UNKNOWN_TOOL: &str = "UNKNOWN_TOOL";
    /// The arguments failed the tool's own validation; the model may retry in the same turn.
    pub const INVALID_ARGS: &str = "INVALID_ARGS";
    /// A policy, approval or guard denied the call.
    pub const DENIED: &str = "DENIED";
    /// The call was cancelled or never started because the step was cancelled.
    pub const CANCELLED: &str = "CANCELLED";
    /// The body failed.
    pub const FAILED: &str = "FAILED";
}

/// A tool body failure. `code` is one of [`codes`] or a tool-specific code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    /// Machine-readable code.
    pub code: String,
    /// Model-visible message.
    pub message: String,
}

impl ToolError {
    /// An error with a code and message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }

    /// An argument-validation failure (`INVALID_ARGS`).
    pub fn invalid_args(message: impl Into<String>) -> Self {
        Self::new(codes::INVALID_ARGS, message)
    }

    /// A generic body failure (`FAILED`).
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(codes::FAILED, message)
    }
}

/// A successful tool body's output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOutput {
    /// Model-visible content.
    pub content: Vec<ContentBlock>,
    /// The structured value (lossless JSON).
    pub value: Option<Value>,
    /// Tool-specific metadata logged with the result.
    pub meta: Option<Value>,
}

impl ToolOutput {
    /// A text-only output.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            content: vec![ContentBlock::text(text)],
            value: None,
            meta: None,
        }
    }
}

/// The unique identity of one trip through the execution pipeline. Call ids may repeat across
/// steps; execution ids never repeat within a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecutionId(pub u64);

impl ExecutionId {
    /// Mints a fresh process-unique id.
    pub fn next() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// One execution as policies, guards and result observers see it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolExecution {
    /// Unique execution identity.
    pub id: ExecutionId,
    /// The calling agent.
    pub agent: SessionId,
    /// The model's call id.
    pub call_id: CallId,
    /// The tool name.
    pub name: String,
    /// Immutable parsed arguments (a JSON string when the raw text was not JSON).
    pub arguments: Value,
}

/// A hook registered with [`ToolContext::on_discarded`].
type DiscardHook = Box<dyn FnOnce() + Send>;

/// The body's view of its execution.
///
/// Cloning shares the same execution state. `conclude_turn` marks this execution's **successful**
/// result as terminal for the turn; [`on_discarded`](Self::on_discarded) hooks run if that
/// success is not what gets recorded.
#[derive(Clone)]
pub struct ToolContext {
    /// The execution.
    pub execution: Arc<ToolExecution>,
    /// This call's cancellation; bodies must observe it. The reference loop hands each call its
    /// own [child](Signal::child) of the step's signal: the step's cancellation reaches it, and
    /// a body that cancels it cancels only its own call.
    pub signal: Signal,
    concluded: Arc<AtomicBool>,
    deferred: Arc<Mutex<Vec<Message>>>,
    discard_hooks: Arc<Mutex<Vec<DiscardHook>>>,
}

impl fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolContext")
            .field("execution", &self.execution)
            .finish()
    }
}

impl ToolContext {
    /// A context for `execution` under `signal`.
    pub fn new(execution: Arc<ToolExecution>, signal: Signal) -> Self {
        Self {
            execution,
            signal,
            concluded: Arc::default(),
            deferred: Arc::default(),
            discard_hooks: Arc::default(),
        }
    }

    /// The calling agent.
    pub fn agent(&self) -> &SessionId {
        &self.execution.agent
    }

    /// Marks this execution's successful result as ending the turn (no follow-up request).
    pub fn conclude_turn(&self) {
        self.concluded.store(true, Ordering::SeqCst);
    }

    /// Whether [`conclude_turn`](Self::conclude_turn) was called.
    pub fn concludes_turn(&self) -> bool {
        self.concluded.load(Ordering::SeqCst)
    }

    /// Defers a model-facing context message to after the step's results.
    pub fn defer_context(&self, message: Message) {
        self.deferred.lock().push(message);
    }

    /// Takes the deferred context messages.
    pub fn take_deferred(&self) -> Vec<Message> {
        std::mem::take(&mut *self.deferred.lock())
    }

    /// Registers `hook` to run if the pipeline records this execution's **successful** result as
    /// something else than that success: because the call's signal fired after the body
    /// returned (the call is recorded as cancelled), or because the output cannot be recorded
    /// (it becomes a `FAILED` result) — and, in a runtime that delivers results through a log,
    /// when the committed success never reaches the model (its `tool/result` append is
    /// refused, or the step is abandoned before it is logged). Use it to undo a side effect that only a *delivered*
    /// result justifies (e.g. marking a background job's output as read).
    ///
    /// Guarantees: a hook runs at most once, and only on such a discard; it never runs when the
    /// success is committed, nor when the body fails, panics or is dropped, nor when a
    /// post-execute policy replaces or blocks the result (the policy decided what the model
    /// sees). Hooks that never run are dropped with the last clone of the context. Only hooks
    /// registered before the body returns are guaranteed to count (see [`ToolHandler`]). A hook
    /// runs synchronously on the pipeline's task, with no lock of the context held, so it may
    /// use the context; it must not block.
    pub fn on_discarded(&self, hook: impl FnOnce() + Send + 'static) {
        self.discard_hooks.lock().push(Box::new(hook));
    }

    /// For pipelines: the body's successful result is **not** what is recorded (see
    /// [`on_discarded`](Self::on_discarded)), so runs every hook registered so far, in
    /// registration order. The hooks are taken: a second call runs only hooks registered
    /// since. A pipeline that commits the success never calls this.
    ///
    /// # Panics
    /// A hook that panics does not keep the later ones from running: every hook runs, then the
    /// first panic is resumed for the caller to contain.
    pub fn discard(&self) {
        let hooks = std::mem::take(&mut *self.discard_hooks.lock());
        let mut first_panic = None;
        for hook in hooks {
            if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(hook)) {
                first_panic.get_or_insert(payload);
            }
        }
        if let Some(payload) = first_panic {
            std::panic::resume_unwind(payload);
        }
    }
}

/// A tool body.
///
/// # Contract
/// * **Calls.** `execute` receives immutable parsed arguments (a JSON string when the model's
///   text was not JSON). The reference runtime polls it on the calling agent's driver task —
///   concurrently with the other calls of a step when the definition is `concurrency_safe`, and
///   with other agents' calls in any case — so it must not block a runtime thread. The handler
///   is shared (`Arc`); a call resolved just before its registration was dropped may still run.
/// * **Cancellation.** Observe `ctx.signal`. The reference pipeline also races the body against
///   it: once the signal fires the body is polled at most once more and, if still pending,
///   **dropped**, and the call is recorded as cancelled (`CANCELLED`). Cleanup that must outlive
///   the call belongs in `Drop` or a task of its own; awaiting it in the body after noticing the
///   cancellation is not guaranteed to run. A success returned after the signal fired is
///   recorded as cancelled too — even when the signal fires *after* the body last checked it —
///   and so is one whose output cannot be recorded: a body whose success has a side effect only
///   a delivered result justifies registers an [`on_discarded`](ToolContext::on_discarded)
///   hook to undo it in that case.
/// * **Context.** `ctx` may be cloned and kept, but only
///   [`conclude_turn`](ToolContext::conclude_turn),
///   [`defer_context`](ToolContext::defer_context) and
///   [`on_discarded`](ToolContext::on_discarded) calls made before the body returns are
///   guaranteed to count.
/// * **Errors and panics.** `Err(ToolError)` becomes an error result with its code and message
///   (post-execute policies still see it); a panic is caught and recorded as `FAILED`.
#[async_trait]
pub trait ToolHandler: Send + Sync + 'static {
    /// Runs the tool.
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError>;
}

/// A tool definition.
#[derive(Clone)]
pub struct ToolDefinition {
    /// Unique name within a layer.
    pub name: String,
    /// Model-facing description.
    pub description: String,
    /// JSON Schema of the arguments (object schema).
    pub parameters: Value,
    /// Whether calls may run in the parallel pool (otherwise exclusive barriers).
    pub concurrency_safe: bool,
    /// The body.
    pub handler: Arc<dyn ToolHandler>,
}

impl fmt::Debug for ToolDefinition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolDefinition")
            .field("name", &self.name)
            .field("concurrency_safe", &self.concurrency_safe)
            .finish()
    }
}

impl ToolDefinition {
    /// The model-facing schema.
    pub fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: self.name.clone(),
            description: self.description.clone(),
            parameters: self.parameters.clone(),
        }
    }
}

/// Error facts of a failed result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolResultError {
    /// Model-visible message.
    pub message: String,
    /// Code (`UNKNOWN_TOOL`, `INVALID_ARGS`, …).
    pub code: String,
}

/// The authoritative, immutable final outcome of one execution.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolResult {
    /// Whether the call failed.
    pub is_error: bool,
    /// Model-visible content.
    pub content: Vec<ContentBlock>,
    /// The structured value (success only).
    pub value: Option<Value>,
    /// Error facts (failure only).
    pub error: Option<ToolResultError>,
    /// Metadata logged with the result.
    pub meta: Option<Value>,
    /// Whether this successful result ends the turn.
    pub concludes_turn: bool,
}

impl ToolResult {
    /// A failed result whose content is `message` as text.
    pub fn failure(code: impl Into<String>, message: impl Into<String>) -> Self {
        let message = message.into();
        Self {
            is_error: true,
            content: vec![ContentBlock::text(message.clone())],
            value: None,
            error: Some(ToolResultError {
                message,
                code: code.into(),
            }),
            meta: None,
            concludes_turn: false,
        }
    }

    /// A successful result from a body's output.
    pub fn success(output: ToolOutput, concludes_turn: bool) -> Self {
        Self {
            is_error: false,
            content: output.content,
            value: output.value,
            error: None,
            meta: output.meta,
            concludes_turn,
        }
    }
}

/// A scoped capability filter (spec §11.3). At least one of `allow`/`deny` must be set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolRestriction {
    /// Keep only these inherited names.
    pub allow: Option<Vec<String>>,
    /// Remove these inherited names.
    pub deny: Option<Vec<String>>,
}

/// A registry refusal with the loud texts of spec §11.3.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolRegistryError {
    /// `restrict` without a scope.
    #[error("tool restriction requires a scoped context")]
    Unscoped,
    /// `restrict({})`.
    #[error("tool restriction is empty: name at least one tool in allow or deny")]
    EmptyRestriction,
    /// Names that are not inherited.
    #[error("unknown global tool {names}; known global tools: {known}")]
    UnknownNames {
        /// The offending names, quoted and comma-separated.
        names: String,
        /// The known inherited names, comma-separated, or `(none)`.
        known: String,
    },
    /// Naming the scope's own registration.
    #[error("tool \"{0}\" is registered by this scope; a restriction filters only inherited tools")]
    OwnName(String),
    /// `run_code` is reserved.
    #[error("tool name \"run_code\" is reserved")]
    Reserved,
    /// A second tool with the same name in one layer.
    #[error("tool \"{0}\" is already registered in this layer")]
    Duplicate(String),
    /// A name no model could call: empty, or containing whitespace or control characters (the
    /// name is shown `{:?}`-quoted).
    #[error(
        "tool name {0:?} is not callable: it must be non-empty, without whitespace or control characters"
    )]
    InvalidName(String),
    /// The scope is disposed.
    #[error("scope of agent \"{0}\" is inactive")]
    Inactive(SessionId),
}

/// A monotonic guard: returns `Some(reason)` to deny a call, `None` to abstain.
pub type ToolGuard = Arc<dyn Fn(&ToolExecution) -> Option<String> + Send + Sync>;

/// The `tools/pre-execute` decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreExecuteDecision {
    /// Run the call.
    Allow,
    /// Refuse it with a reason.
    Deny(String),
    /// Ask an approval service (denied when none is present).
    Ask,
}

/// The `tools/post-execute` decision.
#[derive(Clone, Debug, PartialEq)]
pub enum PostExecuteDecision {
    /// Keep the outcome, optionally replacing its content or value.
    Accept {
        /// Replacement content.
        content: Option<Vec<ContentBlock>>,
        /// Replacement value.
        value: Option<Value>,
    },
    /// Turn the outcome into an error whose content is the feedback.
    Block(String),
}

/// A `tools/pre-execute` policy link: sees the decision so far and returns the next.
pub type PreExecutePolicy =
    Arc<dyn Fn(&ToolExecution, PreExecuteDecision) -> PreExecuteDecision + Send + Sync>;

/// A `tools/post-execute` policy link.
pub type PostExecutePolicy =
    Arc<dyn Fn(&ToolExecution, &ToolResult) -> Option<PostExecuteDecision> + Send + Sync>;

/// A `tools/result` observer: receives the frozen final outcome; cannot change it.
pub type ToolResultObserver = Arc<dyn Fn(&ToolExecution, &ToolResult) + Send + Sync>;

/// One call to execute, as the model produced it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCallRequest {
    /// The model's call id.
    pub call_id: CallId,
    /// The tool name.
    pub name: String,
    /// The raw argument string (empty means `{}`; non-JSON is passed on as a JSON string).
    pub arguments: String,
}

/// The layered tool registry (global → scope-chain ancestors → the agent's own layer).
///
/// # Contract
/// * Every registration returns a [`Registration`]; dropping it removes the entry.
/// * Scoped entries are visible only to that scope (and, for restrictions, its nested scopes).
/// * [`execute`](Tools::execute) runs the whole pipeline of spec §11.5 and **always** returns a
///   result (failures are error results, never `Err`); it fires every result observer exactly
///   once with the frozen outcome before returning. Cancelling `signal` cancels the body.
/// * **How the driver calls it.** [`schemas`](Tools::schemas) at every pre-step,
///   [`get`](Tools::get) to classify each call, and `execute` once per call — concurrently for a
///   run of `concurrency_safe` calls (the reference registry, recognised through
///   [`as_any`](Tools::as_any), is driven through its own two halves instead) — awaiting each
///   call to completion: a step's cancellation reaches a call through `ctx_signal`, never by
///   dropping its future. Calls a cancelled step never started are answered by the runtime
///   itself; no policy or observer sees them.
/// * **Concurrency and reentrancy.** Every method may be called from any thread, concurrently.
///   Bodies, policies, guards and observers may register or drop registrations, so an
///   implementation must not hold its own locks while it runs them. Policies, guards and
///   observers are called synchronously, on the task that runs `execute`.
#[async_trait]
pub trait Tools: Send + Sync + 'static {
    /// Registers `def` in the global layer (`scope = None`) or in a scope's own layer.
    fn register(
        &self,
        scope: Option<&SessionId>,
        def: ToolDefinition,
    ) -> Result<Registration, ToolRegistryError>;

    /// Adds a scoped restriction (loud errors of spec §11.3).
    fn restrict(
        &self,
        scope: Option<&SessionId>,
        filter: ToolRestriction,
    ) -> Result<Registration, ToolRegistryError>;

    /// Adds a guard (global, or for one scope's calls).
    fn guard(&self, scope: Option<&SessionId>, guard: ToolGuard) -> Registration;

    /// Adds a pre-execute policy link.
    fn pre_execute(&self, scope: Option<&SessionId>, policy: PreExecutePolicy) -> Registration;

    /// Adds a post-execute policy link.
    fn post_execute(&self, scope: Option<&SessionId>, policy: PostExecutePolicy) -> Registration;

    /// Adds a result observer.
    fn on_result(&self, scope: Option<&SessionId>, observer: ToolResultObserver) -> Registration;

    /// Declares `scope`'s parent scope (for inherited layers). Undone by dropping the guard.
    fn set_scope_parent(&self, scope: &SessionId, parent: &SessionId) -> Registration;

    /// The definition `scope` sees under `name` (restricted-away reads as absent).
    fn get(&self, name: &str, scope: Option<&SessionId>) -> Option<ToolDefinition>;

    /// Model-facing schemas visible to `scope`, ordered by name.
    fn schemas(&self, scope: Option<&SessionId>) -> Vec<ToolSchema>;

    /// Runs one call through the pipeline for agent `scope`.
    async fn execute(&self, scope: &SessionId, call: ToolCallRequest, ctx_signal: Signal) -> ExecutedTool;

    /// The implementation as [`Any`](std::any::Any), so a runtime can recognise its own registry
    /// behind a `dyn Tools`.
    ///
    /// Provided: `None`, and implementations need not override it. The reference runtime's
    /// registry returns itself so that its step scheduler can run a parallel group's bodies
    /// concurrently yet commit their post-execute policies, normalisation and `tools/result`
    /// observers in model order (spec §11.6). An implementation that returns `None` is scheduled
    /// through [`execute`](Tools::execute) alone, so its post-execute policies and observers run
    /// whenever each call completes.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

/// What [`Tools::execute`] returns: the execution identity and its authoritative result, plus
/// deferred context messages.
#[derive(Clone, Debug)]
pub struct ExecutedTool {
    /// The execution.
    pub execution: Arc<ToolExecution>,
    /// The frozen result.
    pub result: ToolResult,
    /// Context messages the body deferred.
    pub deferred: Vec<Message>,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn ctx() -> ToolContext {
        ToolContext::new(
            Arc::new(ToolExecution {
                id: ExecutionId::next(),
                agent: SessionId::from("a"),
                call_id: CallId::from("c1"),
                name: "t".to_owned(),
                arguments: Value::Null,
            }),
            Signal::new(),
        )
    }

    fn counting(ran: &Arc<AtomicUsize>) -> impl FnOnce() + Send + 'static {
        let ran = ran.clone();
        move || {
            ran.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// `discard` runs the hooks registered through any clone exactly once (they are taken), and
    /// a hook may use the context it was registered on (no lock is held while it runs).
    #[test]
    fn discard_runs_each_hook_once() {
        let ctx = ctx();
        let ran = Arc::new(AtomicUsize::new(0));
        ctx.on_discarded(counting(&ran));
        ctx.clone().on_discarded(counting(&ran));
        let reentrant = ctx.clone();
        let inner = ran.clone();
        ctx.on_discarded(move || reentrant.on_discarded(counting(&inner)));
        ctx.discard();
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        // The hooks were taken: only the one registered by the reentrant hook is left.
        ctx.discard();
        assert_eq!(ran.load(Ordering::SeqCst), 3);
        ctx.discard();
        assert_eq!(ran.load(Ordering::SeqCst), 3);
    }

    /// A panicking hook does not keep the later ones from running; the first panic reaches the
    /// caller once every hook ran.
    #[test]
    fn a_panicking_hook_does_not_skip_the_others() {
        let ctx = ctx();
        let ran = Arc::new(AtomicUsize::new(0));
        ctx.on_discarded(|| panic!("first hook exploded"));
        ctx.on_discarded(counting(&ran));
        ctx.on_discarded(|| panic!("third hook exploded"));
        ctx.on_discarded(counting(&ran));
        let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ctx.discard()))
            .expect_err("the first panic is resumed");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"first hook exploded"));
        assert_eq!(ran.load(Ordering::SeqCst), 2, "every hook ran");
    }

    /// A context whose success is committed never runs its hooks: they are dropped with it.
    #[test]
    fn undiscarded_hooks_are_dropped_unrun() {
        let ran = Arc::new(AtomicUsize::new(0));
        let ctx = ctx();
        ctx.on_discarded(counting(&ran));
        let held = Arc::downgrade(&ctx.discard_hooks);
        drop(ctx);
        assert!(
            held.upgrade().is_none(),
            "the hooks were dropped with the context"
        );
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
}
