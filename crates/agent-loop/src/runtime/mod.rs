//! The agent registry (spec §9): [`Runtime`] implements [`agent::AgentRuntime`] — the creation
//! transaction with rollback, owner links, the memoized quiescence transaction behind
//! [`AgentHandle::dispose`], resume, lookup and shutdown — and [`RuntimeBuilder`] assembles the
//! [`Services`] it runs on.
//!
//! # Creation (spec §9.1)
//! 1. prepare the unpublished session (header and seed validated; a live id, or one another
//!    creation or resumption under way holds until it ends, is a duplicate — scoped
//!    registrations are keyed by id, so two setups of one id would share them);
//! 2. validate the agent options, require a live owner, reject a pre-cancelled signal;
//! 3. construct the [`LoopAgent`] and its flat scope, recording the owner link;
//! 4. run `setup(ctx)` raced against the creation token — the caller's signal, the owner's
//!    disposal and runtime shutdown — then `commit()`; an error or a panic of either fails the
//!    creation with [`AgentError::Setup`] (a panic's message as its source) and rolls it back;
//! 5. publish in order: enter the session, enter the agent, `session/created`,
//!    [`AgentEvent::Created`], [`AgentEvent::SessionStart`]; liveness is re-checked after each
//!    edge; then the session is made durable (header and every event so far, when persistence
//!    is configured — nothing is written before, so a rolled-back creation stores nothing);
//!    finally the agent's driver gate opens.
//!
//! Any failure or cancellation (including dropping the `create` future) before the handle is
//! returned rolls back: the scope unwinds, announced entries are paired with their disposal
//! notifications, nothing stays registered and the id is immediately reusable. Every creation
//! and resumption under way is listed with its reserved id (and with its owner, if any), so
//! that [`Runtime::shutdown`] (and the owner's teardown) rolls back those not yet publishing
//! itself, without their creators' futures.
//!
//! # Disposal (spec §9.4)
//! One memoized teardown per agent, shared by its handle, its owner's disposal and
//! [`Runtime::shutdown`]: mark disposing (new work is refused) → `cancel(disposed)` → roll back
//! the owned creations not yet publishing — in their setup window, or (a resumption) still
//! loading its log — at once (their creators' futures need not be polled again), dispose owned
//! agents (also any an owned creation being published adds) and
//! the agent's background jobs while awaiting `when_idle` and the agent's tasks → dispose the agent's jobs once more (any started while the turn wound down) → dispose
//! the scope → unregister ([`AgentEvent::Disposed`]) → remove the session
//! (`session/disposed`) → drop the owner link. Every `dispose` call's future drives the
//! teardown when polled; the first one, dropped before the teardown completed (also unpolled),
//! hands the rest to a task of the runtime, so the teardown progresses even when no caller polls
//! it to the end. A panic in host code during a step (an owned agent's teardown, the jobs
//! service, an undo closure of the scope, the session removal) is contained and logged with
//! `tracing::warn!`, and the later steps still run; a panic while the teardown future is polled
//! is logged, the steps from the scope's disposal on still run, and the teardown counts as
//! finished: no `dispose` future ever panics.
//!
//! # Locking
//! `registry` (the live entries in creation order) is held for short synchronous sections;
//! events are emitted and futures awaited with no lock held.

mod builder;
mod dispose;
pub mod fork;
mod models;
#[cfg(test)]
mod overlap;
mod registry;
#[cfg(test)]
mod robust;
mod store;
#[cfg(test)]
mod teardown_panics;
#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use async_trait::async_trait;

use futures::{FutureExt, future};
use parking_lot::Mutex;
use tokio_util::task::TaskTracker;

use agent::hooks::SessionStartSource;
use agent::{
    Agent, AgentError, AgentEvent, AgentHandle, AgentRef, AgentRuntime, CancelCause, CreateAgentOptions, Ctx,
    Registration, ResumeAgentOptions, Scope, ScopeInactive, Services, Session, SessionId, SessionStore,
    Signal,
};

pub use builder::RuntimeBuilder;
use dispose::{AbortedBy, AgentEntry, PendingCreation};
pub use fork::{ForkError, ForkSeed, SessionFork, fork_seed};
pub use models::ModelMap;
pub use store::{MemorySessionStore, SessionStoreEvent};

use crate::agent::{LoopAgent, LoopConfig};
use crate::prompt::PromptRegistry;
use crate::tools::ToolRegistry;

/// The cause reported when the runtime is shut down (or gone) during a creation.
const INACTIVE: &str = "agent loop is not active";

fn inactive(id: &SessionId) -> AgentError {
    AgentError::CreationAborted {
        id: id.clone(),
        cause: CancelCause::Other {
            reason: INACTIVE.to_owned(),
        },
    }
}

#[cfg(test)]
thread_local! {
    /// Test hook: runs (once) when a creation or resumption on this thread is about to reserve
    /// its id, to interleave another transaction exactly there.
    static BEFORE_RESERVE: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
        const { std::cell::RefCell::new(None) };
}

struct RuntimeInner {
    /// Shared with every agent and context (one reference count each, not one per service).
    services: Arc<Services>,
    sessions: MemorySessionStore,
    prompt: PromptRegistry,
    tool_registry: Option<ToolRegistry>,
    config: LoopConfig,
    /// The registered agents (live or disposing) by id, in creation order.
    registry: Mutex<registry::Registry<Arc<AgentEntry>>>,
    /// The creations and resumptions under way by id (from their session's preparation, or a
    /// resume's duplicate check, to their end). Scoped registrations are keyed by id, so a
    /// second transaction of an id while one is in its setup window would share — and run
    /// under — the first one's registrations: it is refused `Duplicate` instead. Shutdown
    /// rolls back those not yet publishing from here, without their creators' futures.
    reserved: Mutex<foldhash::HashMap<SessionId, Arc<PendingCreation>>>,
    /// Held while an agent is marked announced and `AgentEvent::Created` is emitted, and while
    /// its teardown checks that mark and emits `AgentEvent::Disposed`, so listeners on any
    /// thread see an agent's `Created` before its `Disposed`. Reentrant: a `Created` listener
    /// may dispose the agent on its own thread.
    agent_lifecycle: parking_lot::ReentrantMutex<()>,
    shutdown: Signal,
    tasks: TaskTracker,
    /// The tokio runtime of the first creation or resumption: an agent's teardown left
    /// undriven by a drop outside any runtime (an [`AgentHandle`] dropped on a plain thread) is
    /// driven there.
    tokio: std::sync::OnceLock<tokio::runtime::Handle>,
    /// Registrations kept for the runtime's life: the builder's (the deployment persona) and
    /// those handed to [`Runtime::hold`].
    held: Mutex<Vec<Registration>>,
    /// Listener counts owned by the runtime itself (taken at build and at each `hold`), which
    /// [`assert_quiescent`] does not count as leaks.
    baseline: Mutex<Baseline>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Baseline {
    agent_listeners: usize,
    store_listeners: usize,
}

/// The reference agent registry. Cheap to clone (shared).
///
/// Dropping every clone without [`shutdown`](Runtime::shutdown) leaves live agents to their
/// handles; call `shutdown` for an orderly teardown.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("agents", &self.inner.registry.lock().len())
            .field("sessions", &self.inner.sessions.len())
            .finish()
    }
}

/// A creation's or resumption's hold on its id ([`RuntimeInner::reserved`]) and its
/// registration with its owner, if any (whose teardown rolls the creation back itself while it
/// is not yet publishing, see [`PendingCreation`]). Dropping it ends the creation: settled,
/// unlinked from its owner, its id freed.
struct Reservation {
    creation: Arc<PendingCreation>,
    /// The owner the creation is registered with.
    owner: Option<Arc<AgentEntry>>,
}

impl Reservation {
    /// Registers the creation with `owner` (once; from then on the owner's teardown rolls it
    /// back). `OwnerDisposed` once that teardown began.
    fn adopt(&mut self, owner: &Arc<AgentEntry>) -> Result<(), AgentError> {
        if let Some(adopted) = &self.owner {
            debug_assert!(Arc::ptr_eq(adopted, owner), "a creation has one owner");
            return Ok(());
        }
        if !owner.adopt_creation(&self.creation) {
            return Err(AgentError::OwnerDisposed(self.creation.id().clone()));
        }
        self.owner = Some(owner.clone());
        Ok(())
    }

    /// The transaction ended (published, or its rollback's synchronous part ran): releases a
    /// shutdown or an owner's teardown waiting for it, and unregisters it from the owner.
    fn settle(&mut self) {
        self.creation.settle();
        if let Some(owner) = self.owner.take() {
            owner.forget_creation(&self.creation);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.settle();
        self.creation.release();
    }
}

/// What the shared part of the creation transaction needs.
struct Plan {
    /// The id, held until the transaction ends (its rollback included).
    reservation: Reservation,
    session: Arc<Session>,
    options: agent::AgentOptions,
    signal: Option<Signal>,
    setup: Option<agent::runtime::Setup>,
    owner: Option<AgentRef>,
    /// Events of the session already durable (resume).
    persisted: Option<usize>,
    source: SessionStartSource,
}

/// A staged creation: the agent built, its rollback armed, publication pending.
pub(crate) struct Staged {
    rollback: Rollback,
    publication: Publication,
}

/// What the publication of a staged creation consumes.
struct Publication {
    agent: Arc<LoopAgent>,
    session: Arc<Session>,
    signal: Option<Signal>,
    setup: Option<agent::runtime::Setup>,
    owner: Option<Arc<AgentEntry>>,
    persisted: Option<usize>,
    source: SessionStartSource,
}

/// How far a creation got, for its rollback.
enum Stage {
    /// Constructed, unpublished: its agent and scope are in its [`PendingCreation`].
    Armed,
    /// Entered into the store and the registry.
    Published(Arc<AgentEntry>),
    /// Nothing to undo.
    Done,
}

/// Undoes a creation that did not return its handle (also when the `create` future is
/// dropped).
struct Rollback {
    stage: Stage,
    /// Settled and freed once the rollback ran (a field: dropped after [`Drop::drop`]'s undo);
    /// rolled back earlier by shutdown or the owner's teardown while not yet publishing.
    reservation: Reservation,
}

impl Rollback {
    fn set(&mut self, stage: Stage) {
        self.stage = stage;
    }

    /// Takes the creation back from shutdown and its owner's teardown for its synchronous
    /// publication. `Err`: one of them already rolled it back.
    fn claim(&self) -> Result<(), AbortedBy> {
        self.reservation.creation.claim()
    }

    async fn run(&mut self) {
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Armed => {
                self.reservation.creation.roll_back();
                self.reservation.settle();
            }
            Stage::Published(entry) => {
                // Registered by now: a shutdown or an owner's teardown waiting for this
                // creation goes on to dispose (and await) the entry itself.
                self.reservation.settle();
                entry.dispose().await;
            }
            Stage::Done => self.reservation.settle(),
        }
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Armed => self.reservation.creation.roll_back(),
            // The memoized teardown runs as a runtime task.
            Stage::Published(entry) => drop(entry.dispose()),
            Stage::Done => {}
        }
        // The reservation, dropped next, settles the creation and frees the id.
    }
}

enum Race<T> {
    Done(T),
    Caller(CancelCause),
    Owner,
    Shutdown,
}

impl<T> Race<Result<T, AgentError>> {
    /// The finished step's outcome, or the error that ends creating (or resuming) agent `id`
    /// when something else won the race.
    fn outcome(self, id: &SessionId) -> Result<T, AgentError> {
        match self {
            Race::Done(out) => out,
            Race::Caller(cause) => Err(AgentError::CreationAborted {
                id: id.clone(),
                cause,
            }),
            Race::Owner => Err(AgentError::OwnerDisposed(id.clone())),
            Race::Shutdown => Err(inactive(id)),
        }
    }
}

impl Runtime {
    /// A builder.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::new()
    }

    /// The services every context shares.
    pub fn services(&self) -> &Services {
        &self.inner.services
    }

    /// The live session store.
    pub fn sessions(&self) -> &MemorySessionStore {
        &self.inner.sessions
    }

    /// The prompt registry.
    pub fn prompt(&self) -> &PromptRegistry {
        &self.inner.prompt
    }

    /// The tool registry, when the runtime built its own.
    pub fn tool_registry(&self) -> Option<&ToolRegistry> {
        self.inner.tool_registry.as_ref()
    }

    /// The live agent with this id, as its concrete type.
    pub fn loop_agent(&self, id: &SessionId) -> Option<Arc<LoopAgent>> {
        self.entry(id).map(|e| e.agent.clone())
    }

    fn entry(&self, id: &SessionId) -> Option<Arc<AgentEntry>> {
        self.inner
            .registry
            .lock()
            .get(id)
            .filter(|e| e.agent.is_live())
            .cloned()
    }

    /// Whether the runtime still accepts creations.
    pub fn is_active(&self) -> bool {
        !self.inner.shutdown.is_cancelled()
    }

    /// Shuts the runtime down: pending creations abort ("agent loop is not active"), every
    /// registered agent is disposed (the same memoized teardown as its handle), and the
    /// runtime's tasks are awaited. Idempotent.
    ///
    /// A creation or resumption not yet publishing (holding its id, or in its setup window) is
    /// rolled back here, at once — its id freed, its agent marked disposed and its scope
    /// disposed — whether or not its creator's future is ever polled again (which then fails
    /// with the shutdown's error); one being published is awaited, and the agent it published
    /// disposed. So shutdown resolves with the runtime quiescent.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel(CancelCause::Other {
            reason: INACTIVE.to_owned(),
        });
        loop {
            // Taken under the reservations' lock after the cancellation: no creation reserves
            // an id from now on (see `reserve`).
            let creations: Vec<Arc<PendingCreation>> = self.inner.reserved.lock().values().cloned().collect();
            let publishing: Vec<Arc<PendingCreation>> = creations
                .into_iter()
                .filter(|c| !c.abort(AbortedBy::Shutdown))
                .collect();
            let entries: Vec<Arc<AgentEntry>> = self.inner.registry.lock().values().rev().cloned().collect();
            future::join(
                future::join_all(entries.iter().map(|e| e.dispose())),
                future::join_all(publishing.iter().map(|c| c.settled())),
            )
            .await;
            // A creation that settled may have published an agent after the entries were
            // taken: dispose it too.
            if publishing.is_empty() {
                break;
            }
        }
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    /// Keeps `guard` for the runtime's lifetime (for deployment-wide registrations such as a
    /// session capture listener). Listeners present at this call count as the runtime's own
    /// for [`assert_quiescent`].
    pub fn hold(&self, guard: Registration) {
        self.inner.held.lock().push(guard);
        self.rebaseline();
    }

    fn rebaseline(&self) {
        *self.inner.baseline.lock() = Baseline {
            agent_listeners: self.inner.services.agent_events.listener_count(),
            store_listeners: self.inner.sessions.events().listener_count(),
        };
    }

    /// The number of runtime tasks (disposals) still running.
    pub fn task_count(&self) -> usize {
        self.inner.tasks.len()
    }

    /// Races `fut` against the creation token: the caller's signal, the owner's disposal and
    /// runtime shutdown (in that priority, before `fut`).
    async fn race<T>(
        &self,
        fut: impl Future<Output = T>,
        signal: Option<&Signal>,
        owner: Option<&Arc<AgentEntry>>,
    ) -> Race<T> {
        // The first round, synchronously: a cancelled token wins, then a ready `fut`. Only a
        // pending `fut` needs the (boxed) wait on every source.
        if let Some(s) = signal
            && s.is_cancelled()
        {
            return Race::Caller(s.cause().unwrap_or(CancelCause::User));
        }
        if owner.is_some_and(|o| o.disposing.is_set()) {
            return Race::Owner;
        }
        if self.inner.shutdown.is_cancelled() {
            return Race::Shutdown;
        }
        let mut fut = std::pin::pin!(fut);
        if let std::task::Poll::Ready(out) =
            future::poll_fn(|cx| std::task::Poll::Ready(fut.as_mut().poll(cx))).await
        {
            return Race::Done(out);
        }
        Box::pin(self.race_pending(fut, signal, owner)).await
    }

    /// [`race`](Self::race) once `fut` is pending.
    async fn race_pending<T>(
        &self,
        fut: std::pin::Pin<&mut impl Future<Output = T>>,
        signal: Option<&Signal>,
        owner: Option<&Arc<AgentEntry>>,
    ) -> Race<T> {
        let caller = async {
            match signal {
                Some(s) => {
                    s.cancelled().await;
                    s.cause().unwrap_or(CancelCause::User)
                }
                None => future::pending().await,
            }
        };
        let owner = async {
            match owner {
                Some(o) => o.disposing.wait().await,
                None => future::pending().await,
            }
        };
        tokio::select! {
            biased;
            cause = caller => Race::Caller(cause),
            () = owner => Race::Owner,
            () = self.inner.shutdown.cancelled() => Race::Shutdown,
            out = fut => Race::Done(out),
        }
    }

    /// Holds `id` for a creation or resumption; `Duplicate` while another one holds it, the
    /// shutdown error once shutdown began.
    fn reserve(&self, id: &SessionId) -> Result<Reservation, AgentError> {
        #[cfg(test)]
        if let Some(hook) = BEFORE_RESERVE.with(|h| h.borrow_mut().take()) {
            hook();
        }
        let creation = {
            let mut reserved = self.inner.reserved.lock();
            // Checked under the lock shutdown takes after its cancellation: a creation is
            // either refused here or found (and rolled back) by shutdown.
            if self.inner.shutdown.is_cancelled() {
                return Err(inactive(id));
            }
            match reserved.entry(id.clone()) {
                std::collections::hash_map::Entry::Occupied(_) => {
                    return Err(AgentError::Duplicate(id.clone()));
                }
                std::collections::hash_map::Entry::Vacant(slot) => slot
                    .insert(Arc::new(PendingCreation::reserved(
                        Arc::downgrade(&self.inner),
                        id.clone(),
                    )))
                    .clone(),
            }
        };
        Ok(Reservation {
            creation,
            owner: None,
        })
    }

    /// [`reserve`](Self::reserve)s `id`, then requires it not live: `Duplicate` when a session
    /// or an agent of that id is. Checked once the id is held, so no transaction of the id can
    /// publish after the check (a publication enters its session and agent before it frees the
    /// id): a check made before reserving would miss one that published in between, and the
    /// creation would then run its setup beside the live agent — or, a resumption, load and
    /// claim the live session's log and, rolling back, let go of its writer.
    fn reserve_free(&self, id: &SessionId) -> Result<Reservation, AgentError> {
        let reservation = self.reserve(id)?;
        // An agent's session is live from before its registration to after its removal from the
        // registry (publication enters the session first; release unregisters it first), so a
        // registered id always has a live session: the store's check covers the registry's.
        let live = self.inner.sessions.contains(id);
        debug_assert!(
            live || !self.inner.registry.lock().contains(id),
            "a registered agent's session is live"
        );
        if live {
            // Dropped: the id freed; nothing held yet, nothing let go of.
            return Err(AgentError::Duplicate(id.clone()));
        }
        Ok(reservation)
    }

    /// The liveness checks re-run after every publication edge.
    fn recheck(
        &self,
        id: &SessionId,
        signal: Option<&Signal>,
        owner: Option<&Arc<AgentEntry>>,
    ) -> Result<(), AgentError> {
        if let Some(s) = signal
            && s.is_cancelled()
        {
            return Err(AgentError::CreationAborted {
                id: id.clone(),
                cause: s.cause().unwrap_or(CancelCause::User),
            });
        }
        if owner.is_some_and(|o| o.disposing.is_set()) {
            return Err(AgentError::OwnerDisposed(id.clone()));
        }
        if self.inner.shutdown.is_cancelled() {
            return Err(inactive(id));
        }
        Ok(())
    }

    fn owner_entry(&self, owner: Option<&AgentRef>) -> Result<Option<Arc<AgentEntry>>, AgentError> {
        let Some(owner) = owner else { return Ok(None) };
        let found = self
            .inner
            .registry
            .lock()
            .get(owner.id())
            .filter(|e| e.is_agent(owner))
            .cloned();
        match found {
            Some(e) if !e.disposing.is_set() => Ok(Some(e)),
            _ => Err(AgentError::Inactive(ScopeInactive(owner.id().clone()))),
        }
    }

    /// The shared transaction after session preparation.
    async fn transact(&self, plan: Plan) -> Result<AgentHandle, AgentError> {
        let staged = self.stage(plan)?;
        self.finish(staged).await
    }

    /// The synchronous part of the transaction: checks, the agent built and the rollback
    /// armed.
    fn stage(&self, plan: Plan) -> Result<Staged, AgentError> {
        let Plan {
            reservation,
            session,
            options,
            signal,
            setup,
            owner,
            persisted,
            source,
        } = plan;
        let id = session.id().clone();
        options.validate()?;
        if self.inner.tokio.get().is_none()
            && let Ok(handle) = tokio::runtime::Handle::try_current()
        {
            let _ = self.inner.tokio.set(handle);
        }
        let owner = self.owner_entry(owner.as_ref())?;
        if let Some(s) = &signal
            && s.is_cancelled()
        {
            return Err(AgentError::CreationAborted {
                id,
                cause: s.cause().unwrap_or(CancelCause::User),
            });
        }
        if self.inner.shutdown.is_cancelled() {
            return Err(inactive(&id));
        }
        let scope = Arc::new(Scope::new(id.clone(), None));
        let agent = LoopAgent::new(
            self.inner.services.clone(),
            session.clone(),
            options,
            scope.clone(),
            self.inner.config.clone(),
            source == SessionStartSource::Resume,
        )?;
        if let Err(by) = reservation.creation.arm(agent.clone(), scope.clone()) {
            // Shutdown rolled the reservation back since the check above (another thread).
            agent.begin_disposal();
            scope.dispose();
            return Err(by.error(&id));
        }
        let mut rollback = Rollback {
            stage: Stage::Armed,
            reservation,
        };
        if let Some(owner) = &owner {
            // Registered with the owner before the setup window opens (a resumption already
            // before its log was loaded), so that the owner's teardown can roll the creation
            // back without its future (spec: SPN-55). Refused: the owner began its teardown
            // since the check above.
            rollback.reservation.adopt(owner)?;
        }
        Ok(Staged {
            rollback,
            publication: Publication {
                agent,
                session,
                signal,
                setup,
                owner,
                persisted,
                source,
            },
        })
    }

    /// The asynchronous part of the transaction: publication, or the rollback.
    ///
    /// (Functions returning `async` blocks over the destructured state rather than `async fn`s,
    /// whose arguments would be stored twice in the creation future.)
    pub(crate) fn finish(
        &self,
        staged: Staged,
    ) -> impl Future<Output = Result<AgentHandle, AgentError>> + Send + '_ {
        let Staged {
            mut rollback,
            publication,
        } = staged;
        async move {
            let result = self.publish(&mut rollback, publication).await;
            match result {
                Ok(handle) => Ok(handle),
                Err(err) => {
                    rollback.run().await;
                    Err(err)
                }
            }
        }
    }

    /// Creation up to the transaction: the session prepared from `options`.
    fn plan_create(&self, options: CreateAgentOptions) -> Result<Plan, AgentError> {
        let CreateAgentOptions {
            session_id,
            meta,
            seed,
            agent_options,
            signal,
            setup,
            owner,
        } = options;
        if self.inner.shutdown.is_cancelled() {
            return Err(inactive(&session_id));
        }
        // The id is reserved first, so that its liveness is checked once (under the
        // reservation) rather than also by the store's `prepare` before it. The errors keep
        // their order: a refused reservation reports what `prepare` would have refused first.
        let reservation = match self.reserve_free(&session_id) {
            Ok(reservation) => reservation,
            Err(refused) => {
                return Err(self
                    .inner
                    .sessions
                    .prepare(session_id, seed, meta)
                    .err()
                    .unwrap_or(refused));
            }
        };
        let session = self.inner.sessions.prepare_unchecked(session_id, seed, meta)?;
        Ok(Plan {
            reservation,
            session,
            options: agent_options,
            signal,
            setup,
            owner,
            persisted: None,
            source: SessionStartSource::Startup,
        })
    }

    /// The synchronous part of [`AgentRuntime::create`]: the session prepared and the
    /// transaction staged. [`finish`](Self::finish) completes it.
    pub(crate) fn stage_create(&self, options: CreateAgentOptions) -> Result<Staged, AgentError> {
        self.stage(self.plan_create(options)?)
    }

    /// Publication: the setup raced, the session and agent entered, the announcements.
    #[allow(clippy::manual_async_fn)]
    fn publish<'a>(
        &'a self,
        rollback: &'a mut Rollback,
        publication: Publication,
    ) -> impl Future<Output = Result<AgentHandle, AgentError>> + Send + 'a {
        let Publication {
            agent,
            session,
            signal,
            setup,
            owner,
            persisted,
            source,
        } = publication;
        async move {
            let id = agent.id().clone();
            if let Some(setup) = setup {
                // A setup that failed because its creation was aborted meanwhile — shutdown or
                // the owner's teardown rolled it back and disposed the agent it was writing to,
                // or the caller cancelled — reports that abort, not its symptom.
                let failed = |source: agent::BoxError| {
                    self.recheck(&id, signal.as_ref(), owner.as_ref())
                        .err()
                        .unwrap_or_else(|| AgentError::Setup {
                            id: id.clone(),
                            source,
                        })
                };
                let ctx = Ctx::scoped(self.inner.services.clone(), agent.clone());
                let composed = std::panic::AssertUnwindSafe(setup(ctx)).catch_unwind();
                match self.race(composed, signal.as_ref(), owner.as_ref()).await {
                    Race::Done(Ok(Ok(commit))) => {
                        // A panicking commit fails the creation like a panicking setup.
                        let committed = commit.map_or(Ok(Ok(())), |commit| {
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(commit))
                        });
                        match committed {
                            Ok(Ok(())) => {}
                            Ok(Err(source)) => return Err(failed(source)),
                            Err(panic) => return Err(failed(agent::bus::panic_message(&*panic).into())),
                        }
                    }
                    Race::Done(Ok(Err(source))) => return Err(failed(source)),
                    Race::Done(Err(panic)) => return Err(failed(agent::bus::panic_message(&*panic).into())),
                    Race::Caller(cause) => return Err(AgentError::CreationAborted { id, cause }),
                    Race::Owner => return Err(AgentError::OwnerDisposed(id)),
                    Race::Shutdown => return Err(inactive(&id)),
                }
            }
            self.recheck(&id, signal.as_ref(), owner.as_ref())?;
            // From here to its end the publication runs synchronously: it takes the creation
            // back from the owner's teardown, which from now on waits for it to settle — unless
            // that teardown already rolled it back.
            if let Err(by) = rollback.claim() {
                return Err(by.error(&id));
            }

            // Publication: enter the session, then the agent.
            // Durable writes wait for the commit below: a rollback stores nothing.
            let (session_guard, durability) =
                match self.inner.sessions.enter_deferred(session.clone(), persisted) {
                    Ok(entered) => entered,
                    Err(err @ AgentError::Duplicate(_)) if persisted.is_some() => {
                        // A live session of the id (entered into the store directly, not through
                        // this runtime, whose transactions the reservation keeps out) writes the
                        // log: its removal lets go of it, not this rollback.
                        rollback.reservation.creation.hand_over_log();
                        return Err(err);
                    }
                    Err(err) => return Err(err),
                };
            if persisted.is_some() {
                // A resumed session: its removal lets go of the claimed log from now on.
                rollback.reservation.creation.hand_over_log();
            }
            let entry = {
                let mut registry = self.inner.registry.lock();
                let session_guard = Mutex::new(Some(session_guard));
                let make = |serial| {
                    Arc::new_cyclic(|me| AgentEntry {
                        me: me.clone(),
                        serial,
                        agent: agent.clone(),
                        runtime: Arc::downgrade(&self.inner),
                        services: self.inner.services.clone(),
                        session_guard,
                        owner: owner.as_ref().map(Arc::downgrade),
                        children: Mutex::default(),
                        creations: Mutex::default(),
                        disposing: dispose::Latch::default(),
                        announced: std::sync::atomic::AtomicBool::new(false),
                        teardown: Default::default(),
                    })
                };
                match registry.insert_with(id.clone(), make) {
                    Ok((_, entry)) => entry.clone(),
                    Err(make) => {
                        // The session's removal (in `make`) runs outside the registry's lock.
                        drop(registry);
                        drop(make);
                        return Err(AgentError::Duplicate(id));
                    }
                }
            };
            if let Some(owner) = &owner {
                owner.children.lock().insert(entry.serial, Arc::downgrade(&entry));
            }
            rollback.set(Stage::Published(entry.clone()));

            self.inner
                .sessions
                .announce_entered(&durability)
                .map_err(|e| AgentError::Other(Box::new(e)))?;
            self.recheck(&id, signal.as_ref(), owner.as_ref())?;
            {
                let lifecycle = self.inner.agent_lifecycle.lock();
                // A teardown that began since the check above (a shutdown draining the runtime,
                // on another thread) may already have released the entry: its release looked
                // at the mark under this lock, found it unset and emitted no `Disposed`, so a
                // `Created` now would never be paired. Its disposal is set before that release,
                // so under this lock it is seen here whenever the release came first.
                if entry.disposing.is_set() {
                    drop(lifecycle);
                    self.recheck(&id, signal.as_ref(), owner.as_ref())?;
                    return Err(AgentError::Disposed(id));
                }
                entry.announced.store(true, std::sync::atomic::Ordering::SeqCst);
                // (No event is built for a bus nobody listens to.)
                let events = &self.inner.services.agent_events;
                if events.has_listeners() {
                    events.emit(&AgentEvent::Created { agent: id.clone() });
                }
            }
            self.recheck(&id, signal.as_ref(), owner.as_ref())?;
            let events = &self.inner.services.agent_events;
            if events.has_listeners() {
                events.emit(&AgentEvent::SessionStart {
                    agent: id.clone(),
                    source,
                });
            }
            self.recheck(&id, signal.as_ref(), owner.as_ref())?;
            if entry.disposing.is_set() {
                return Err(AgentError::Disposed(id));
            }
            durability.commit()?;
            rollback.set(Stage::Done);
            agent.activate();
            Ok(AgentHandle::new(agent, entry))
        }
    }
}

#[async_trait]
impl AgentRuntime for Runtime {
    fn create<'life0, 'async_trait>(
        &'life0 self,
        options: CreateAgentOptions,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<AgentHandle, AgentError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        // Written out (not `async fn`): the generated body would store the options twice. The
        // options are staged synchronously on the first poll, so the future keeps only them
        // and the publication.
        Box::pin(async move {
            let staged = self.stage_create(options)?;
            self.finish(staged).await
        })
    }

    async fn resume(&self, options: ResumeAgentOptions) -> Result<AgentHandle, AgentError> {
        let ResumeAgentOptions {
            session_id,
            agent_options,
            signal,
            setup,
            owner,
        } = options;
        if self.inner.shutdown.is_cancelled() {
            return Err(inactive(&session_id));
        }
        let persistence = self
            .inner
            .services
            .persistence
            .clone()
            .ok_or_else(|| AgentError::Persistence("session persistence is not configured".to_owned()))?;
        // Before the log is touched: a loser never holds — so its rollback never lets go of —
        // the log of a live session of its id.
        let mut reservation = self.reserve_free(&session_id)?;
        if let Some(s) = &signal
            && s.is_cancelled()
        {
            return Err(AgentError::CreationAborted {
                id: session_id,
                cause: s.cause().unwrap_or(CancelCause::User),
            });
        }
        let owner_entry = self.owner_entry(owner.as_ref())?;
        if let Some(owner) = &owner_entry {
            // Registered with the owner before the log is loaded, so that the owner's teardown
            // frees the id without this future (spec: SPN-55).
            reservation.adopt(owner)?;
        }
        // From the load on, the backend may hold state for the log (a cached reader, then the
        // claimed writer and its lock — also when a claim cut off by the race below completes
        // anyway): a rollback from here until the session enters the store (whose removal lets
        // go of the log from then on) lets go of it with the id.
        reservation.creation.hold_log(persistence.clone());
        let loaded = self
            .race(
                persistence.load(&session_id),
                signal.as_ref(),
                owner_entry.as_ref(),
            )
            .await
            .outcome(&session_id)?;
        let persisted = loaded.events.len();
        // Become the log's writer before anything runs on it: a log another writer holds, or
        // one that grew since it was read, fails the resume here, not a later flush.
        self.race(
            persistence.claim(&session_id, persisted as u64),
            signal.as_ref(),
            owner_entry.as_ref(),
        )
        .await
        .outcome(&session_id)?;
        let mut events = loaded.events;
        crate::store::repair_open_turn(&mut events);
        let session = Arc::new(Session::new(loaded.header, Some(events))?);
        self.transact(Plan {
            reservation,
            session,
            options: agent_options,
            signal,
            setup,
            owner,
            persisted: Some(persisted),
            source: SessionStartSource::Resume,
        })
        .await
    }

    fn get(&self, id: &SessionId) -> Option<AgentRef> {
        self.entry(id).map(|e| e.agent.clone() as AgentRef)
    }

    fn list(&self) -> Vec<AgentRef> {
        self.inner
            .registry
            .lock()
            .values()
            .filter(|e| e.agent.is_live())
            .map(|e| e.agent.clone() as AgentRef)
            .collect()
    }

    fn ctx(&self) -> Ctx {
        Ctx::global(self.inner.services.clone())
    }

    fn agent_ctx(&self, id: &SessionId) -> Option<Ctx> {
        let agent = AgentRuntime::get(self, id)?;
        Some(Ctx::scoped(self.inner.services.clone(), agent))
    }
}

/// Asserts that `runtime` is quiescent: no registered agent (live or disposing), no live
/// session, no hook or listener left on the shared lists and buses (beyond those the runtime
/// itself holds, see [`Runtime::hold`]), no agent-scoped prompt or tool registration, and no
/// runtime task still running. Global deployment registrations (the persona, global tools) may
/// remain. For tests; panics with a description otherwise.
pub fn assert_quiescent(runtime: &Runtime) {
    let inner = &runtime.inner;
    let agents: Vec<String> = inner.registry.lock().ids().map(ToString::to_string).collect();
    assert!(agents.is_empty(), "agents still registered: {agents:?}");
    let reserved: Vec<String> = inner.reserved.lock().keys().map(ToString::to_string).collect();
    assert!(
        reserved.is_empty(),
        "creations still holding their ids: {reserved:?}"
    );
    let sessions: Vec<String> = inner.sessions.list().iter().map(|s| s.id().to_string()).collect();
    assert!(sessions.is_empty(), "sessions still live: {sessions:?}");
    let s = &inner.services;
    assert_eq!(s.pre_step.len(), 0, "pre-step interceptors left");
    assert_eq!(s.turn_stopping.len(), 0, "turn-stopping hooks left");
    let baseline = *inner.baseline.lock();
    assert_eq!(
        s.agent_events.listener_count(),
        baseline.agent_listeners,
        "agent event listeners left"
    );
    assert_eq!(
        inner.sessions.events().listener_count(),
        baseline.store_listeners,
        "session store listeners left"
    );
    assert_eq!(
        inner.prompt.scoped_len(),
        0,
        "agent-scoped prompt registrations left"
    );
    if let Some(tools) = &inner.tool_registry {
        assert_eq!(
            tools.counts().scope_layers,
            0,
            "agent-scoped tool layers left: {tools:?}"
        );
    }
    assert_eq!(inner.tasks.len(), 0, "runtime tasks still running");
}
