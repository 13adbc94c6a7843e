//! The tool registry and its execution pipeline (spec §11), and the per-step scheduler.
//!
//! [`ToolRegistry`] implements [`agent::Tools`]:
//!
//! * **Layers** (spec §7, §11.1–11.2): the global layer → the scope-chain ancestors declared with
//!   [`Tools::set_scope_parent`] (farthest first) → the agent's own layer. Nearer layers shadow
//!   farther ones by name; one name per layer; `run_code` is reserved.
//! * **Restrictions** (§11.3): scoped only, compiled at registration, intersecting, each lifted by
//!   its own guard. They filter what a scope *inherits* (including tools registered later) and
//!   never its own registrations; an ancestor's restriction reaches every nested scope, a child's
//!   never its parent. A nested scope inherits exactly what its parent sees, so an ancestor's
//!   own tools are never hidden by that ancestor's (or a farther one's) restrictions, only by
//!   nearer ones. A restricted tool is absent from [`Tools::schemas`] and [`Tools::get`] and
//!   its calls resolve as `unknown tool "<name>"` (`UNKNOWN_TOOL`).
//! * **Guards** (§11.4): monotonic, evaluated after the whole pre-execute chain; global guards,
//!   then the scope chain's, farthest first. Any reason denies (`Error: <reason>`).
//! * **The pipeline** (§11.5): [`Tools::execute`], see [`pipeline`](self#execution-pipeline).
//! * **Scheduling** (§11.6): [`run_step_calls`].
//!
//! # Execution pipeline
//!
//! For each call: parse the raw arguments (empty → `{}`, non-JSON → the raw text as a JSON
//! string so the tool's own validation rejects it), mint an [`ExecutionId`](agent::tools::ExecutionId),
//! refuse arguments that are not lossless JSON (a negative zero: `INVALID_ARGS`, no stage runs
//! but the observers), then
//!
//! 1. cancellation check (`tool call aborted before dispatch`, code
//!    [`codes::ABORTED_BEFORE_DISPATCH`]; such a result skips post-execute);
//! 2. `tools/pre-execute`: the policies of the global scope and of the calling agent, folded in
//!    registration order from `Allow`; `Ask` goes to the [`ToolApproval`] service set with
//!    [`ToolRegistry::set_approval`], and is denied with a clear reason when there is none;
//! 3. guards (skipped when pre-execute already denied);
//! 4. the body, raced with the call's signal: an invisible tool is `UNKNOWN_TOOL`; a
//!    [`ToolError`](agent::tools::ToolError) keeps its code (`INVALID_ARGS`, …); a panic is
//!    `FAILED`; cancellation is `tool call aborted` (`CANCELLED`), and a cancelled execution's
//!    deferred contexts are discarded;
//! 5. `tools/post-execute`: each policy sees the outcome so far; `Accept` may replace content or
//!    value, `Block(feedback)` turns it into an error whose content is the feedback (`DENIED`)
//!    and discards deferred contexts; a success that races a cancellation becomes cancelled
//!    (discarding its deferred contexts too).
//!    An outcome whose content, value, metadata or deferred contexts are not lossless JSON
//!    (they could not be logged) becomes a `FAILED` result naming the offending number, and its
//!    deferred contexts are discarded.
//!    Wherever the pipeline itself replaces a body's **success** — the signal fired after the
//!    body returned (stage 4, or at commit), the output cannot be recorded, or a settled
//!    success is dropped uncommitted (the future of [`run_step_calls`] was dropped while the call
//!    awaited an earlier call's commit), or a committed success never reaches the model (the
//!    consumer of [`run_step_calls_armed`] drops its [`Delivery`] undelivered: the session
//!    log refused its `tool/result`, or a refusal abandoned the rest of the step) — it runs the
//!    execution's [`on_discarded`](agent::tools::ToolContext::on_discarded) hooks, once, so a
//!    body can undo a side effect only a delivered result justifies (a `job_output` read gives
//!    its claim on the job's report back; a panicking hook is contained and logged). A
//!    post-execute `Block` or failure does not run them:
//!    the policy decided what the model sees;
//! 6. `tools/result`: every observer (global and the agent's own) receives the frozen final
//!    outcome, synchronously, for every execution. Observer panics are contained and logged.
//!
//! Internally the pipeline has two halves: a concurrent *dispatch* (stages 1–4) and a
//! synchronous *commit* (stages 5–6). [`Tools::execute`] runs them back to back;
//! [`run_step_calls`] dispatches a parallel run's calls concurrently and commits them in model
//! order (spec §11.6).
//!
//! Failures reach the model as `Error: <message>` (see [`model_text`]).
//!
//! # Locking
//! One mutex protects the registry's state (layers, hooks, parent edges,
//! approval services). It is held only for short synchronous sections; user code (tool bodies,
//! policies, guards, observers) always runs after the lock is released, and values removed by a
//! registration guard are dropped after unlocking, so a guard dropped from inside user code cannot
//! deadlock.

use std::sync::{Arc, Weak};

use async_trait::async_trait;
use parking_lot::Mutex;

use agent::model::ToolSchema;
use agent::tools::{
    ExecutedTool, PostExecutePolicy, PreExecutePolicy, ToolCallRequest, ToolDefinition, ToolGuard,
    ToolRegistryError, ToolRestriction, ToolResultObserver, Tools,
};
use agent::{Registration, SessionId, Signal};

mod approval;
pub mod model_text;
mod pipeline;
mod schedule;
mod state;
#[cfg(test)]
mod tests;

pub use approval::{ApprovalOutcome, ToolApproval};
pub use pipeline::{CommittedTool, Delivery};
pub use schedule::{run_step_calls, run_step_calls_armed};
pub use state::RegistryCounts;

/// Error codes of the pipeline beyond [`agent::tools::codes`].
pub mod codes {
    /// The call's signal was cancelled before its body was invoked (spec TOOL-27, TOOL-40).
    pub const ABORTED_BEFORE_DISPATCH: &str = "TOOL_ABORTED_BEFORE_DISPATCH";
    pub use agent::tools::codes::*;
}

struct Inner {
    state: Mutex<state::State>,
}

/// The layered tool registry and execution pipeline of the reference runtime.
///
/// Cheap to clone (shared). Every registration returns a [`Registration`] guard that undoes it
/// on drop; the guard holds the registry weakly, so it never keeps the registry alive.
#[derive(Clone)]
pub struct ToolRegistry {
    inner: Arc<Inner>,
}

impl Default for ToolRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("counts", &self.counts())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry with no approval service.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(state::State::default()),
            }),
        }
    }

    /// Installs the approval service that answers `Ask` decisions. The most recently installed
    /// live service answers; dropping the guard uninstalls it.
    pub fn set_approval(&self, approval: Arc<dyn ToolApproval>) -> Registration {
        let id = self.inner.state.lock().add_approval(approval);
        self.undo(move |s| s.remove_approval(id))
    }

    /// Live registration counts by kind.
    pub fn counts(&self) -> RegistryCounts {
        self.inner.state.lock().counts()
    }

    /// The number of live registrations of every kind (tools, restrictions, guards, policies,
    /// observers, scope-parent edges, approval services).
    pub fn len(&self) -> usize {
        self.counts().total()
    }

    /// Whether nothing is registered (every guard was dropped).
    pub fn is_empty(&self) -> bool {
        let counts = self.counts();
        counts.total() == 0 && counts.scope_layers == 0
    }

    /// A guard that runs `remove` on the state and drops what it removed after unlocking.
    fn undo(
        &self,
        remove: impl FnOnce(&mut state::State) -> state::Removed + Send + Sync + 'static,
    ) -> Registration {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        Registration::new(move || {
            if let Some(inner) = weak.upgrade() {
                let removed = remove(&mut inner.state.lock());
                drop(removed);
            }
        })
    }
}

#[async_trait]
impl Tools for ToolRegistry {
    fn register(
        &self,
        scope: Option<&SessionId>,
        def: ToolDefinition,
    ) -> Result<Registration, ToolRegistryError> {
        let name = def.name.clone();
        let id = self.inner.state.lock().register(scope, def)?;
        let scope = scope.cloned();
        Ok(self.undo(move |s| s.unregister(scope.as_ref(), &name, id)))
    }

    fn restrict(
        &self,
        scope: Option<&SessionId>,
        filter: ToolRestriction,
    ) -> Result<Registration, ToolRegistryError> {
        let id = self.inner.state.lock().restrict(scope, filter)?;
        let scope = scope.cloned().expect("restrict succeeded, so it was scoped");
        Ok(self.undo(move |s| s.unrestrict(&scope, id)))
    }

    fn guard(&self, scope: Option<&SessionId>, guard: ToolGuard) -> Registration {
        let id = self.inner.state.lock().add_guard(scope, guard);
        let scope = scope.cloned();
        self.undo(move |s| s.remove_guard(scope.as_ref(), id))
    }

    fn pre_execute(&self, scope: Option<&SessionId>, policy: PreExecutePolicy) -> Registration {
        let id = self.inner.state.lock().add_pre(scope, policy);
        let scope = scope.cloned();
        self.undo(move |s| s.remove_hook(state::HookKind::Pre, scope.as_ref(), id))
    }

    fn post_execute(&self, scope: Option<&SessionId>, policy: PostExecutePolicy) -> Registration {
        let id = self.inner.state.lock().add_post(scope, policy);
        let scope = scope.cloned();
        self.undo(move |s| s.remove_hook(state::HookKind::Post, scope.as_ref(), id))
    }

    fn on_result(&self, scope: Option<&SessionId>, observer: ToolResultObserver) -> Registration {
        let id = self.inner.state.lock().add_observer(scope, observer);
        let scope = scope.cloned();
        self.undo(move |s| s.remove_hook(state::HookKind::Observer, scope.as_ref(), id))
    }

    fn set_scope_parent(&self, scope: &SessionId, parent: &SessionId) -> Registration {
        let id = self.inner.state.lock().add_parent(scope, parent);
        let scope = scope.clone();
        self.undo(move |s| {
            s.remove_parent(&scope, id);
            None
        })
    }

    fn get(&self, name: &str, scope: Option<&SessionId>) -> Option<ToolDefinition> {
        self.inner.state.lock().resolve(name, scope)
    }

    fn schemas(&self, scope: Option<&SessionId>) -> Vec<ToolSchema> {
        self.inner.state.lock().schemas(scope)
    }

    async fn execute(&self, scope: &SessionId, call: ToolCallRequest, ctx_signal: Signal) -> ExecutedTool {
        self.run(scope, call, ctx_signal).await
    }

    /// Returns the registry itself: [`run_step_calls`] recognises it and commits a parallel
    /// group's outcomes in model order.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}
