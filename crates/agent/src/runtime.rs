//! The agent registry and creation transaction contract (spec §9), and [`Ctx`], the service
//! context through which agents and their scopes register things.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::agent::{AgentHandle, AgentOptions, AgentRef};
use crate::bus::{BoxError, EventBus};
use crate::error::AgentError;
use crate::event::SessionEvent;
use crate::header::SessionMeta;
use crate::hooks::{AgentEvent, PreStepInterceptor, TurnStoppingHook};
use crate::ids::SessionId;
use crate::jobs::Jobs;
use crate::model::ModelAdapter;
use crate::prompt::Prompt;
use crate::registration::{Registration, Scope, Unregister};
use crate::scoped::ScopedEntries;
use crate::signal::Signal;
use crate::store::{SessionPersistence, SessionStore};
use crate::tools::Tools;

/// A synchronous commit run after setup succeeded and before publication. An error or a panic
/// fails the creation with [`AgentError::Setup`] and rolls it back.
pub type Commit = Box<dyn FnOnce() -> Result<(), BoxError> + Send>;

/// The setup window: composes the unpublished agent (registrations through its [`Ctx`], appends
/// to its session), never drives it. Raced against the creation token.
pub type Setup = Box<dyn FnOnce(Ctx) -> BoxFuture<'static, Result<Option<Commit>, BoxError>> + Send>;

/// What to create.
pub struct CreateAgentOptions {
    /// The new agent's (and session's) id.
    pub session_id: SessionId,
    /// Header metadata.
    pub meta: SessionMeta,
    /// Seed events (fork, replay).
    pub seed: Option<Vec<SessionEvent>>,
    /// Agent options.
    pub agent_options: AgentOptions,
    /// Creation-only cancellation: cancelling it after `create` returned has no effect.
    pub signal: Option<Signal>,
    /// The setup window.
    pub setup: Option<Setup>,
    /// The creating agent: disposing it disposes the created agent.
    pub owner: Option<AgentRef>,
}

impl fmt::Debug for CreateAgentOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateAgentOptions")
            .field("session_id", &self.session_id)
            .field("meta", &self.meta)
            .field("seed_len", &self.seed.as_ref().map(Vec::len))
            .field("agent_options", &self.agent_options)
            .finish()
    }
}

impl CreateAgentOptions {
    /// Options for a fresh agent with default everything.
    pub fn new(session_id: SessionId) -> Self {
        Self {
            session_id,
            meta: SessionMeta::default(),
            seed: None,
            agent_options: AgentOptions::default(),
            signal: None,
            setup: None,
            owner: None,
        }
    }
}

/// What to resume.
pub struct ResumeAgentOptions {
    /// The persisted session to resume.
    pub session_id: SessionId,
    /// Agent options for the resumed instance.
    pub agent_options: AgentOptions,
    /// Creation-only cancellation.
    pub signal: Option<Signal>,
    /// The setup window.
    pub setup: Option<Setup>,
    /// The creating agent.
    pub owner: Option<AgentRef>,
}

/// The agent registry.
///
/// # Contract
/// * [`create`](AgentRuntime::create) is a transaction: prepare the session, validate options,
///   fuse the creation token (caller signal, owner disposal, runtime teardown), construct,
///   await `setup` raced against the token, run `commit`, then publish in order (enter session,
///   enter agent, `session/created`, `agent/created`, `agent/session-start`). Any failure or
///   cancellation before the handle is returned rolls everything back: nothing stays
///   registered and the id is immediately reusable.
/// * [`resume`](AgentRuntime::resume) loads persisted state (repairing an open turn) and runs
///   the same transaction.
/// * [`get`](AgentRuntime::get) returns only live agents.
/// * **Cancellation.** The caller's `signal` is observed only until the handle is returned;
///   cancelling it later does nothing. When the token wins, the `setup` future is dropped.
///   Dropping the `create`/`resume` future before it resolves is a cancellation too and rolls
///   back the same way (in the reference runtime, inside the drop; a teardown already under way
///   finishes on a runtime task).
/// * **Setup window.** `setup` runs on the caller's task with the new agent's scoped [`Ctx`]:
///   what it registers belongs to the agent's scope and is undone by a rollback. Wakes sent
///   during it wait for publication. `commit` runs synchronously, after `setup` resolved and
///   before publication. A panicking `setup` or `commit` fails the creation with
///   [`AgentError::Setup`] naming the panic, rolled back like any setup error.
/// * **Visibility.** `get` and `list` see an agent from its entry into the registry — already
///   while `agent/created` listeners run — until its disposal begins. They never block and may
///   be called from synchronous listeners.
/// * **Concurrency.** Every method takes `&self` and may be called from any thread. Of
///   concurrent creations of one id at most one publishes; the others fail with
///   [`AgentError::Duplicate`].
/// * **Errors.** [`AgentError::Duplicate`] (a live id), [`AgentError::InvalidOptions`],
///   [`AgentError::Inactive`] (an owner that is not live), [`AgentError::CreationAborted`]
///   (the caller's signal, or the runtime shutting down), [`AgentError::OwnerDisposed`],
///   [`AgentError::Setup`] (setup or commit failed); `resume` also [`AgentError::Persistence`]
///   without persistence and the store's own errors (such as [`AgentError::NotFound`]).
#[async_trait]
pub trait AgentRuntime: Send + Sync + 'static {
    /// Creates and publishes an agent.
    async fn create(&self, options: CreateAgentOptions) -> Result<AgentHandle, AgentError>;

    /// Resumes a persisted session as a live agent.
    async fn resume(&self, options: ResumeAgentOptions) -> Result<AgentHandle, AgentError>;

    /// The live agent with this id.
    fn get(&self, id: &SessionId) -> Option<AgentRef>;

    /// Live agents in creation order.
    fn list(&self) -> Vec<AgentRef>;

    /// The global service context.
    fn ctx(&self) -> Ctx;

    /// The context scoped to a live agent.
    fn agent_ctx(&self, id: &SessionId) -> Option<Ctx>;
}

/// The services a host exposes, shared by every context.
#[derive(Clone)]
pub struct Services {
    /// The agent registry.
    pub agents: Arc<dyn AgentRuntime>,
    /// The live session store.
    pub sessions: Arc<dyn SessionStore>,
    /// Durable persistence, when configured.
    pub persistence: Option<Arc<dyn SessionPersistence>>,
    /// The tool registry.
    pub tools: Arc<dyn Tools>,
    /// The prompt registry.
    pub prompt: Arc<dyn Prompt>,
    /// The background job registry, when configured.
    pub jobs: Option<Arc<dyn Jobs>>,
    /// Model adapters by provider name.
    pub models: Arc<dyn ModelRegistry>,
    /// Agent-level notifications.
    pub agent_events: EventBus<AgentEvent>,
    /// Pre-step interceptors.
    pub pre_step: HookList<dyn PreStepInterceptor>,
    /// Turn-stopping hooks.
    pub turn_stopping: HookList<dyn TurnStoppingHook>,
}

/// Looks up model adapters by provider name.
///
/// # Contract
/// The driver calls [`adapter`](ModelRegistry::adapter) synchronously once per model step, on
/// the agent's driver task and concurrently for many agents: it must be quick and must not
/// block. The caller uses the returned adapter for that one request and does not cache it.
/// `None` fails the turn with an `error` coded `NO_ADAPTER`; a panic is contained by the driver
/// as the turn's `error`.
pub trait ModelRegistry: Send + Sync + 'static {
    /// The adapter serving `provider`.
    fn adapter(&self, provider: &str) -> Option<Arc<dyn ModelAdapter>>;
}

/// An ordered list of hooks, each global or scoped to one agent. Cheap to clone (shared).
///
/// Scoped hooks are kept per agent ([`ScopedEntries`]), so looking up one agent's hooks, and
/// adding or removing one, costs the same however many other agents have hooks of their own.
pub struct HookList<T: ?Sized> {
    inner: Arc<HookEntries<T>>,
}

/// A hook list's entries behind their lock; registration guards remove their hook from it by
/// key ([`Registration::keyed`]: no closure to allocate per hook).
struct HookEntries<T: ?Sized>(parking_lot::RwLock<ScopedEntries<Arc<T>>>);

impl<T: ?Sized> Default for HookEntries<T> {
    fn default() -> Self {
        Self(parking_lot::RwLock::default())
    }
}

impl<T: ?Sized> std::ops::Deref for HookEntries<T> {
    type Target = parking_lot::RwLock<ScopedEntries<Arc<T>>>;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<T: ?Sized + Send + Sync> Unregister for HookEntries<T> {
    fn unregister(&self, scope: Option<SessionId>, key: u64) {
        // The hook is dropped after the lock is released.
        let removed = self.write().remove(scope.as_ref(), key);
        drop(removed);
    }
}

impl<T: ?Sized> Clone for HookList<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T: ?Sized> Default for HookList<T> {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
        }
    }
}

impl<T: ?Sized + Send + Sync + 'static> HookList<T> {
    /// Adds a hook (global when `scope` is `None`). Dropping the guard removes it.
    pub fn add(&self, scope: Option<SessionId>, hook: Arc<T>) -> Registration {
        let id = self.inner.write().push(scope.as_ref(), hook);
        let weak: std::sync::Weak<dyn Unregister> = Arc::downgrade(&self.inner) as _;
        Registration::keyed(weak, scope, id)
    }

    /// The hooks that apply to `agent`: global ones and those scoped to it, in registration
    /// order.
    pub fn for_agent(&self, agent: &SessionId) -> Vec<Arc<T>> {
        self.hooks_for(agent).into_vec()
    }

    /// [`for_agent`](Self::for_agent) without allocating for none or one hook (the common
    /// cases); an empty list is answered without looking up `agent`.
    pub fn hooks_for(&self, agent: &SessionId) -> Hooks<T> {
        let entries = self.inner.read();
        let global = entries.global();
        let own = if entries.scoped_agents() == 0 {
            &[]
        } else {
            entries.own(Some(agent))
        };
        match (global, own) {
            (only, []) | ([], only) => Hooks::of(only.len(), only.iter().map(|(_, hook)| hook)),
            _ => Hooks::of(
                global.len() + own.len(),
                entries.visible(Some(agent)).map(|(_, hook, _)| hook),
            ),
        }
    }

    /// The number of hooks (for tests asserting registries end empty).
    pub fn len(&self) -> usize {
        self.inner.read().len()
    }

    /// Whether there are no hooks.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The hooks that apply to one agent ([`HookList::hooks_for`]), in registration order. Holds
/// none or one without allocating.
#[derive(Default)]
pub enum Hooks<T: ?Sized> {
    /// No hook.
    #[default]
    None,
    /// One hook.
    One(Arc<T>),
    /// Several hooks.
    Many(Vec<Arc<T>>),
}

impl<T: ?Sized> Hooks<T> {
    /// The `len` hooks of `hooks`.
    fn of<'a>(len: usize, mut hooks: impl Iterator<Item = &'a Arc<T>>) -> Self
    where
        T: 'a,
    {
        match len {
            0 => Self::None,
            1 => hooks.next().map_or(Self::None, |hook| Self::One(hook.clone())),
            _ => {
                let mut many = Vec::with_capacity(len);
                many.extend(hooks.cloned());
                Self::Many(many)
            }
        }
    }

    /// The hooks, in registration order.
    pub fn as_slice(&self) -> &[Arc<T>] {
        match self {
            Self::None => &[],
            Self::One(hook) => std::slice::from_ref(hook),
            Self::Many(hooks) => hooks,
        }
    }

    /// Whether there is no hook.
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// The hooks as a vector.
    pub fn into_vec(self) -> Vec<Arc<T>> {
        match self {
            Self::None => Vec::new(),
            Self::One(hook) => vec![hook],
            Self::Many(hooks) => hooks,
        }
    }
}

/// A service context: the host's services plus an optional agent scope.
///
/// Registrations made through a scoped `Ctx` are visible only to that agent and are **adopted
/// by its scope**: they are undone, in reverse order, when the agent is disposed. Through a
/// disposed scope every registration fails with [`AgentError::Inactive`] and registers nothing.
/// The unscoped (global) context returns the guards to the caller instead.
#[derive(Clone)]
pub struct Ctx {
    /// The host's services (shared: building a context costs one reference count).
    pub services: Arc<Services>,
    scope: Option<Arc<Scope>>,
    agent: Option<AgentRef>,
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx").field("scope", &self.scope).finish()
    }
}

impl Ctx {
    /// The global context.
    pub fn global(services: impl Into<Arc<Services>>) -> Self {
        Self {
            services: services.into(),
            scope: None,
            agent: None,
        }
    }

    /// The context of one agent.
    pub fn scoped(services: impl Into<Arc<Services>>, agent: AgentRef) -> Self {
        Self {
            services: services.into(),
            scope: Some(agent.scope().clone()),
            agent: Some(agent),
        }
    }

    /// The agent this context is scoped to.
    pub fn agent(&self) -> Option<&AgentRef> {
        self.agent.as_ref()
    }

    /// The scope key, when scoped.
    pub fn scope_key(&self) -> Option<&SessionId> {
        self.scope.as_ref().map(|s| s.key())
    }

    /// Keeps `guard` for the scope's lifetime (scoped), or returns it (global).
    pub fn own(&self, guard: Registration) -> Result<Option<Registration>, AgentError> {
        match &self.scope {
            Some(scope) => {
                scope.adopt(guard)?;
                Ok(None)
            }
            None => Ok(Some(guard)),
        }
    }

    fn check_active(&self) -> Result<(), AgentError> {
        if let Some(scope) = &self.scope {
            scope.ensure_active()?;
        }
        Ok(())
    }

    /// Registers a tool in this context's layer.
    pub fn register_tool(
        &self,
        def: crate::tools::ToolDefinition,
    ) -> Result<Option<Registration>, AgentError> {
        self.check_active()?;
        let guard = self
            .services
            .tools
            .register(self.scope_key(), def)
            .map_err(|e| AgentError::Other(Box::new(e)))?;
        self.own(guard)
    }

    /// Adds a tool restriction for this (scoped) context.
    pub fn restrict_tools(
        &self,
        filter: crate::tools::ToolRestriction,
    ) -> Result<Option<Registration>, AgentError> {
        self.check_active()?;
        let guard = self
            .services
            .tools
            .restrict(self.scope_key(), filter)
            .map_err(|e| AgentError::Other(Box::new(e)))?;
        self.own(guard)
    }

    /// Adds a tool guard for this context.
    pub fn guard_tools(&self, guard: crate::tools::ToolGuard) -> Result<Option<Registration>, AgentError> {
        self.check_active()?;
        let g = self.services.tools.guard(self.scope_key(), guard);
        self.own(g)
    }

    /// Adds a tool-result observer for this context.
    pub fn on_tool_result(
        &self,
        observer: crate::tools::ToolResultObserver,
    ) -> Result<Option<Registration>, AgentError> {
        self.check_active()?;
        let g = self.services.tools.on_result(self.scope_key(), observer);
        self.own(g)
    }

    /// Registers a prompt section in this context's layer.
    pub fn prompt_section(
        &self,
        section: crate::prompt::PromptSection,
    ) -> Result<Option<Registration>, AgentError> {
        self.check_active()?;
        let g = self.services.prompt.section(self.scope_key(), section);
        self.own(g)
    }

    /// Registers a runtime context in this context's layer.
    pub fn runtime_context(
        &self,
        context: crate::prompt::RuntimeContext,
    ) -> Result<Option<Registration>, AgentError> {
        self.check_active()?;
        let g = self.services.prompt.runtime_context(self.scope_key(), context);
        self.own(g)
    }

    /// Adds a pre-step interceptor (scoped: hears only this agent).
    pub fn on_pre_step(&self, hook: Arc<dyn PreStepInterceptor>) -> Result<Option<Registration>, AgentError> {
        self.check_active()?;
        let g = self.services.pre_step.add(self.scope_key().cloned(), hook);
        self.own(g)
    }

    /// Adds a turn-stopping hook (scoped: hears only this agent).
    pub fn on_turn_stopping(
        &self,
        hook: Arc<dyn TurnStoppingHook>,
    ) -> Result<Option<Registration>, AgentError> {
        self.check_active()?;
        let g = self.services.turn_stopping.add(self.scope_key().cloned(), hook);
        self.own(g)
    }

    /// Listens to agent events (scoped: only this agent's).
    pub fn on_agent_event(
        &self,
        listener: impl Fn(&AgentEvent) -> Result<(), BoxError> + Send + Sync + 'static,
    ) -> Result<Option<Registration>, AgentError> {
        self.check_active()?;
        let g = match self.scope_key() {
            Some(key) => self.services.agent_events.on_scoped(key.clone(), listener),
            None => self.services.agent_events.on(listener),
        };
        self.own(g)
    }
}

#[cfg(test)]
mod hook_list_tests {
    use super::*;

    /// Global and scoped hooks interleave in registration order for their agent only; removing
    /// one keeps the others' order and leaves no empty per-agent list behind.
    #[test]
    fn hooks_apply_to_their_agent_in_registration_order() {
        let list: HookList<str> = HookList::default();
        let (a, b) = (SessionId::from("a"), SessionId::from("b"));
        let g1 = list.add(None, Arc::from("g1"));
        let a1 = list.add(Some(a.clone()), Arc::from("a1"));
        let b1 = list.add(Some(b.clone()), Arc::from("b1"));
        let g2 = list.add(None, Arc::from("g2"));
        let a2 = list.add(Some(a.clone()), Arc::from("a2"));
        let names = |agent: &SessionId| -> Vec<String> {
            list.for_agent(agent).iter().map(|h| h.to_string()).collect()
        };
        assert_eq!(names(&a), ["g1", "a1", "g2", "a2"]);
        assert_eq!(names(&b), ["g1", "b1", "g2"]);
        assert_eq!(names(&SessionId::from("c")), ["g1", "g2"]);
        assert_eq!(list.len(), 5);

        drop(a1);
        assert_eq!(names(&a), ["g1", "g2", "a2"]);
        drop(g1);
        assert_eq!(names(&a), ["g2", "a2"]);
        drop((b1, a2));
        assert_eq!(
            list.inner.read().scoped_agents(),
            0,
            "no empty per-agent list left"
        );
        assert_eq!(names(&a), ["g2"]);
        drop(g2);
        assert!(list.is_empty());
    }
}
