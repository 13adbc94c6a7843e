//! The memoized quiescence transaction of one registered agent (spec §9.4).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};

use futures::FutureExt;
use futures::future::{self, BoxFuture};
use parking_lot::Mutex;

use agent::bus::panic_message;
use agent::{
    Agent, AgentError, AgentEvent, AgentRef, CancelCause, CancelOptions, Disposer, Scope, Services,
    SessionId, SessionPersistence,
};

use super::{RuntimeInner, inactive};
use crate::agent::{LoopAgent, Waiters};

/// What an entry owns, by a key (serial or address) no caller chooses: a hash map (cheaper to
/// insert into and remove from than an ordered map, and it keeps its table when emptied), with
/// a fixed hasher. Iterated only by the teardown, in key order ([`sorted`]).
pub(super) type OwnedMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

/// The values of `map` (taken), in key order.
fn sorted<K: Ord, V>(map: OwnedMap<K, V>) -> impl Iterator<Item = V> {
    let mut entries: Vec<(K, V)> = map.into_iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().map(|(_, v)| v)
}

/// One registered agent.
pub(super) struct AgentEntry {
    /// The entry itself, for [`Disposer::dispose`] (which borrows it).
    pub(super) me: Weak<AgentEntry>,
    /// The entry's serial in the runtime's registry (unique for the runtime's life; orders
    /// entries by creation).
    pub(super) serial: u64,
    pub(super) agent: Arc<LoopAgent>,
    pub(super) runtime: Weak<RuntimeInner>,
    /// The services the agent runs on (its jobs, the agent event bus): the teardown reaches
    /// them through here, not through the runtime, so a handle disposed after every clone of
    /// the runtime was dropped still disposes the agent's jobs and announces
    /// [`AgentEvent::Disposed`] to the listeners still on the bus.
    pub(super) services: Arc<Services>,
    /// The store entry; dropping it removes the session.
    pub(super) session_guard: Mutex<Option<super::store::SessionRemoval>>,
    pub(super) owner: Option<Weak<AgentEntry>>,
    /// Published agents this one created, by serial (the teardown disposes them in creation
    /// order). A map, so that each child's release unlinks itself without a scan of its
    /// siblings.
    pub(super) children: Mutex<OwnedMap<u64, Weak<AgentEntry>>>,
    /// Creations and resumptions of agents this one owns that are still under way (not yet
    /// published), by the address of their record: the teardown rolls back those that hold
    /// their id or are in their setup window and waits for those being published.
    pub(super) creations: Mutex<OwnedMap<usize, Arc<PendingCreation>>>,
    /// Set when the teardown begins (aborts pending creations it owns).
    pub(super) disposing: Latch,
    /// Whether `AgentEvent::Created` was emitted (so `Disposed` pairs with it).
    pub(super) announced: std::sync::atomic::AtomicBool,
    pub(super) teardown: TeardownCell,
}

impl AgentEntry {
    /// Starts (or joins) the memoized teardown.
    ///
    /// Every returned future awaits the same transaction, and whichever of them is polled drives
    /// it. If the first call's future is dropped before the teardown completed, the rest runs as
    /// a task of the runtime, so the teardown progresses even when no caller polls it to the end.
    /// (A teardown that completes on its first poll needs no task.)
    pub(super) fn dispose(self: &Arc<Self>) -> BoxFuture<'static, ()> {
        let first = {
            let mut state = self.teardown.0.lock();
            match *state {
                TeardownState::Unstarted => {
                    *state = TeardownState::Running {
                        future: Some(Transaction::Unpolled),
                        notified: false,
                        wakers: Vec::new(),
                    };
                    true
                }
                _ => false,
            }
        };
        if first {
            // The synchronous part, outside the cell's lock (listeners it triggers may call
            // `dispose` again): no new work from now on, the active turn aborted and the inbox
            // cleared (no wake latch under `disposed`).
            self.disposing.set();
            self.agent.begin_disposal();
            self.agent.cancel(CancelCause::Disposed, CancelOptions::default());
        }
        Box::pin(Teardown {
            entry: Some(self.clone()),
            first,
        })
    }

    /// Polls the memoized teardown on behalf of one of its futures.
    ///
    /// A panic while polling it (the teardown contains host code step by step, so only a fault
    /// of its own) is contained here: it is logged, the rest of the transaction is skipped but
    /// its synchronous [release] runs, and the teardown counts as finished for every
    /// current and later `dispose` future.
    fn poll_teardown(self: &Arc<Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut transaction = {
            let mut state = self.teardown.0.lock();
            match &mut *state {
                TeardownState::Done => return Poll::Ready(()),
                TeardownState::Unstarted => unreachable!("polled before dispose started it"),
                TeardownState::Running {
                    future,
                    notified,
                    wakers,
                } => match future.take() {
                    Some(future) => {
                        *notified = false;
                        future
                    }
                    None => {
                        // Another holder is polling it right now: wait for its wake-ups.
                        register(wakers, cx.waker());
                        return Poll::Pending;
                    }
                },
            }
        };
        // The transaction's own waker, built only for a transaction that is polled (a quiescent
        // agent's release needs none).
        let waker = || Waker::from(self.clone());
        let poll = || match &mut transaction {
            Transaction::Unpolled if self.release_if_quiescent() => Poll::Ready(()),
            Transaction::Unpolled => {
                let mut future = Box::pin(teardown(self.clone()));
                let poll = future.as_mut().poll(&mut Context::from_waker(&waker()));
                transaction = Transaction::Boxed(future);
                poll
            }
            Transaction::Boxed(future) => future.as_mut().poll(&mut Context::from_waker(&waker())),
        };
        let finished = match catch_unwind(AssertUnwindSafe(poll)) {
            Ok(poll) => poll.is_ready(),
            Err(payload) => {
                tracing::warn!(
                    agent = %self.agent.id(),
                    message = %panic_message(&*payload),
                    "agent teardown panicked; its remaining steps are skipped and the agent is released"
                );
                release(self);
                true
            }
        };
        if finished {
            let wakers = match std::mem::replace(&mut *self.teardown.0.lock(), TeardownState::Done) {
                TeardownState::Running { wakers, .. } => wakers,
                _ => Vec::new(),
            };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| drop(transaction))) {
                tracing::warn!(
                    agent = %self.agent.id(),
                    message = %panic_message(&*payload),
                    "dropping the agent's teardown panicked"
                );
            }
            wakers.into_iter().for_each(Waker::wake);
            return Poll::Ready(());
        }
        let mut state = self.teardown.0.lock();
        let TeardownState::Running {
            future: slot,
            notified,
            wakers,
        } = &mut *state
        else {
            unreachable!("only the poller leaves the running state");
        };
        *slot = Some(transaction);
        if std::mem::take(notified) {
            // Woken while it was polled (the wake found no waker of ours): poll again soon,
            // through the scheduler (a self-waking poll, e.g. out of coop budget, must yield).
            drop(state);
            cx.waker().wake_by_ref();
        } else {
            register(wakers, cx.waker());
        }
        Poll::Pending
    }

    /// The whole teardown of an agent with nothing to wait for — no owned agent, no jobs
    /// service, idle, no driver task of its own running — where every asynchronous step of
    /// [`teardown`] would be ready at once: only the synchronous [release], without
    /// building (and boxing) the transaction. Returns whether it ran.
    fn release_if_quiescent(self: &Arc<Self>) -> bool {
        let agent = &self.agent;
        let quiescent = self.children.lock().is_empty()
            && self.creations.lock().is_empty()
            && self.services.jobs.is_none()
            && agent.is_idle()
            && !agent.has_running_driver();
        if quiescent {
            release(self);
        }
        quiescent
    }

    /// Whether the teardown completed.
    fn teardown_settled(&self) -> bool {
        matches!(*self.teardown.0.lock(), TeardownState::Done)
    }

    pub(super) fn is_agent(&self, agent: &AgentRef) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.agent), Arc::as_ptr(agent))
    }

    /// Registers a creation this agent owns. `false` once the teardown began: the creation
    /// must fail (checked under the list's lock, which the teardown takes after it set
    /// `disposing`, so a creation is either refused here or found by the teardown).
    pub(super) fn adopt_creation(&self, creation: &Arc<PendingCreation>) -> bool {
        let mut creations = self.creations.lock();
        if self.disposing.is_set() {
            return false;
        }
        creations.insert(creation_key(creation), creation.clone());
        true
    }

    /// Unregisters a creation that ended.
    pub(super) fn forget_creation(&self, creation: &Arc<PendingCreation>) {
        self.creations.lock().remove(&creation_key(creation));
    }
}

fn creation_key(creation: &Arc<PendingCreation>) -> usize {
    Arc::as_ptr(creation) as usize
}

/// A creation or resumption under way, from its id's reservation to the end of its
/// transaction: listed in the runtime's reservations (what [`Runtime::shutdown`] rolls back,
/// spine §9.1 step 3) and, when it has an owner, among the owner entry's creations from before
/// anything of it exists until it ended (what the owner's teardown rolls back, spec: SPN-55 —
/// the owner's disposal aborts pending setup).
///
/// Before its publication the creation holds nothing the registry sees but its reserved id and
/// (in its setup window) its agent's scope, and its own rollback would only run when its
/// creator's future is next polled or dropped. So shutdown and the owner's teardown roll it
/// back themselves ([`abort`](Self::abort)): its id freed and, in the setup window, its agent
/// marked disposed and its scope (everything the setup registered) disposed — at once,
/// whatever becomes of the creator's future, which later still fails with the abort's error
/// ([`AbortedBy::error`]; its own rollback finds nothing left to undo). Once the transaction
/// [claims](Self::claim) it for its (synchronous) publication, they instead wait until it
/// [settles](Self::settle) and then dispose the agent it may have published.
///
/// [`Runtime::shutdown`]: super::Runtime::shutdown
pub(super) struct PendingCreation {
    runtime: Weak<RuntimeInner>,
    id: SessionId,
    state: Mutex<CreationState>,
    settled: Latch,
    /// Whether the id was freed: it is freed once, so a late free leaves a new reservation of
    /// the same id alone.
    released: AtomicBool,
    /// A resumption's claimed log ([`hold_log`](Self::hold_log)) until its session enters the
    /// store ([`hand_over_log`](Self::hand_over_log)), whose removal lets go of it from then
    /// on: let go of when the id is freed before that (a rollback; spec:
    /// `SessionPersistence::release`, "its creation or resumption rolled back").
    log: Mutex<Option<Arc<dyn SessionPersistence>>>,
    /// Raised (before `log` is written) once a log is held: letting go of a log is one load for
    /// the creations that never held one. (`SeqCst` with `released`: a release that reads it
    /// down is seen by `hold_log`'s check of `released`, which then lets go itself.)
    held_log: AtomicBool,
}

enum CreationState {
    /// Only the id is held (the session is being prepared, or a resumed log loaded).
    Reserved,
    /// In the setup window: what an abort undoes.
    Armed {
        agent: Arc<LoopAgent>,
        scope: Arc<Scope>,
    },
    /// Taken back by its transaction (publishing); what its own rollback undoes.
    Claimed {
        agent: Arc<LoopAgent>,
        scope: Arc<Scope>,
    },
    /// Rolled back by an abort.
    Aborted(AbortedBy),
    /// Settled, or rolled back by its transaction.
    Ended,
}

/// Who rolled a pending creation back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AbortedBy {
    /// Its owner's teardown.
    Owner,
    /// The runtime's shutdown.
    Shutdown,
}

impl AbortedBy {
    /// The error the creation of `id` fails with.
    pub(super) fn error(self, id: &SessionId) -> AgentError {
        match self {
            Self::Owner => AgentError::OwnerDisposed(id.clone()),
            Self::Shutdown => inactive(id),
        }
    }
}

impl PendingCreation {
    /// A creation holding only its id, in the reservations of `runtime`.
    pub(super) fn reserved(runtime: Weak<RuntimeInner>, id: SessionId) -> Self {
        Self {
            runtime,
            id,
            state: Mutex::new(CreationState::Reserved),
            settled: Latch::default(),
            released: AtomicBool::new(false),
            log: Mutex::new(None),
            held_log: AtomicBool::new(false),
        }
    }

    /// The resumption reads (then claims) its log from `persistence`: freeing the id from now
    /// on lets go of it, until [`hand_over_log`](Self::hand_over_log). Let go of at once when
    /// the id was freed already (an abort, on another thread).
    pub(super) fn hold_log(&self, persistence: Arc<dyn SessionPersistence>) {
        self.held_log.store(true, Ordering::SeqCst);
        *self.log.lock() = Some(persistence);
        if self.released.load(Ordering::SeqCst) {
            self.let_go_of_log();
        }
    }

    /// The resumed session entered the store: its removal lets go of the log from now on.
    pub(super) fn hand_over_log(&self) {
        drop(self.log.lock().take());
    }

    /// Lets go of the claimed log, if still held.
    fn let_go_of_log(&self) {
        if !self.held_log.load(Ordering::SeqCst) {
            return;
        }
        let log = self.log.lock().take();
        if let Some(persistence) = log {
            contained_now(&self.id, "log release", || persistence.release(&self.id));
        }
    }

    /// The reserved id.
    pub(super) fn id(&self) -> &SessionId {
        &self.id
    }

    /// The setup window opens: what an abort now undoes. `Err`: it was aborted already.
    pub(super) fn arm(&self, agent: Arc<LoopAgent>, scope: Arc<Scope>) -> Result<(), AbortedBy> {
        let mut state = self.state.lock();
        match *state {
            CreationState::Reserved => {
                *state = CreationState::Armed { agent, scope };
                Ok(())
            }
            CreationState::Aborted(by) => Err(by),
            _ => unreachable!("a creation is armed once, before it is claimed or ends"),
        }
    }

    /// The transaction takes the creation back to publish it. `Err`: an abort already rolled
    /// it back.
    pub(super) fn claim(&self) -> Result<(), AbortedBy> {
        let mut state = self.state.lock();
        match std::mem::replace(&mut *state, CreationState::Ended) {
            CreationState::Armed { agent, scope } | CreationState::Claimed { agent, scope } => {
                *state = CreationState::Claimed { agent, scope };
                Ok(())
            }
            CreationState::Aborted(by) => {
                *state = CreationState::Aborted(by);
                Err(by)
            }
            CreationState::Reserved | CreationState::Ended => {
                unreachable!("a creation is claimed between its arming and its end")
            }
        }
    }

    /// The transaction's own rollback of its setup (unless an abort did it already): the agent
    /// marked disposed, its scope disposed (a panic there contained and logged).
    pub(super) fn roll_back(&self) {
        let taken = {
            let mut state = self.state.lock();
            match &*state {
                CreationState::Armed { .. } | CreationState::Claimed { .. } => {
                    std::mem::replace(&mut *state, CreationState::Ended)
                }
                _ => return,
            }
        };
        if let CreationState::Armed { agent, scope } | CreationState::Claimed { agent, scope } = taken {
            agent.begin_disposal();
            // Contained like every teardown step: a panicking undo closure the setup handed its
            // scope must not turn the creation's typed error into a panic (or, when the
            // creation's future is dropped, panic in its destructor).
            contained_now(&self.id, "pending creation", || scope.dispose());
        }
    }

    /// The transaction ended: nothing is left for an abort to undo here.
    pub(super) fn settle(&self) {
        let previous = {
            let mut state = self.state.lock();
            match &*state {
                CreationState::Aborted(_) | CreationState::Ended => None,
                _ => Some(std::mem::replace(&mut *state, CreationState::Ended)),
            }
        };
        // Dropped (the agent's last reference, say) outside the lock.
        drop(previous);
        self.settled.set();
    }

    /// Resolves once the creation settled or was aborted.
    pub(super) async fn settled(&self) {
        self.settled.wait().await;
    }

    /// Frees the id now (once), after letting go of a claimed log not handed over (so that no
    /// new reservation of the id claims the log before).
    pub(super) fn release(&self) {
        if self.released.swap(true, Ordering::SeqCst) {
            return;
        }
        self.let_go_of_log();
        if let Some(rt) = self.runtime.upgrade() {
            let removed = rt.reserved.lock().remove(&self.id);
            // The list's reference, dropped outside its lock.
            drop(removed);
        }
    }

    /// Shutdown's or the owner's teardown's rollback: undoes the creation now unless its
    /// transaction publishes it. Returns whether it is over; `false` while its transaction
    /// publishes it (then await [`settled`](Self::settled)).
    pub(super) fn abort(&self, by: AbortedBy) -> bool {
        let taken = {
            let mut state = self.state.lock();
            match &*state {
                CreationState::Claimed { .. } => return false,
                CreationState::Aborted(_) | CreationState::Ended => return true,
                CreationState::Reserved | CreationState::Armed { .. } => {
                    std::mem::replace(&mut *state, CreationState::Aborted(by))
                }
            }
        };
        if let CreationState::Armed { agent, scope } = taken {
            agent.begin_disposal();
            contained_now(&self.id, "pending creation", || scope.dispose());
        }
        self.release();
        self.settled.set();
        true
    }
}

/// Ends everything `entry` owns: rolls back the creations and resumptions not yet publishing
/// (holding their id, or in their setup window), then
/// disposes (and awaits) the published agents it owns, together with waiting for the creations
/// being published — again, until nothing is left (a creation that settles may have published
/// a child after the children were taken).
async fn dispose_owned(entry: &Arc<AgentEntry>) {
    loop {
        let creations: Vec<Arc<PendingCreation>> =
            sorted(std::mem::take(&mut *entry.creations.lock())).collect();
        let publishing: Vec<Arc<PendingCreation>> = creations
            .into_iter()
            .filter(|c| !c.abort(AbortedBy::Owner))
            .collect();
        let children: Vec<Arc<AgentEntry>> = sorted(std::mem::take(&mut *entry.children.lock()))
            .filter_map(|w| w.upgrade())
            .collect();
        if children.is_empty() && publishing.is_empty() {
            return;
        }
        future::join(
            future::join_all(children.iter().map(|c| c.dispose())),
            future::join_all(publishing.iter().map(|c| c.settled())),
        )
        .await;
    }
}

/// A one-way flag with waiters: set once, never cleared. (An atomic and a [`Notify`] inside the
/// entry, where a [`Signal`](agent::Signal) would be two more allocations per agent.)
///
/// [`Notify`]: tokio::sync::Notify
#[derive(Default)]
pub(super) struct Latch {
    set: AtomicBool,
    waiters: Waiters,
}

impl Latch {
    /// Sets the flag and wakes every waiter.
    pub(super) fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.waiters.wake_all();
    }

    /// Whether the flag is set.
    pub(super) fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Resolves once the flag is set (at once when it is).
    pub(super) async fn wait(&self) {
        self.waiters.wait_until(|| self.is_set()).await;
    }
}

/// The quiescence transaction of one agent (see the module docs).
///
/// Every step that runs host code — owned agents' teardowns, the [`Jobs`](agent::Jobs)
/// service, the undo closures of the agent's scope, the session store's removal — is contained
/// on its own: a panic is logged with `tracing::warn!` and the teardown goes on, so the agent
/// always ends unregistered with its session removed.
pub(super) async fn teardown(entry: Arc<AgentEntry>) {
    let agent = entry.agent.clone();
    let jobs = entry.services.jobs.clone();
    let id = agent.id().clone();
    let jobs_done = async {
        if let Some(jobs) = &jobs {
            jobs.dispose_owner(&id).await;
        }
    };
    future::join3(
        contained(&id, "owned agents", dispose_owned(&entry)),
        contained(&id, "jobs", jobs_done),
        contained(&id, "idle", agent.wait_idle()),
    )
    .await;
    agent.drivers_exited().await;
    // A turn still winding down (a tool body that did not observe its cancellation) or one of
    // the agent's tasks may have started a job after the first pass: now that the agent is
    // idle and its tasks have ended, nothing of its own can start another, so a second pass
    // leaves the agent no job.
    let jobs_done = async {
        if let Some(jobs) = &jobs {
            jobs.dispose_owner(&id).await;
        }
    };
    contained(&id, "jobs", jobs_done).await;
    release(&entry);
}

/// The synchronous end of the teardown: dispose the scope, unregister the agent
/// ([`AgentEvent::Disposed`] once, if it was announced), remove its session and drop the owner
/// link. Each step is contained; idempotent (it is also what a teardown that panicked while
/// polled still runs).
fn release(entry: &Arc<AgentEntry>) {
    let agent = &entry.agent;
    let id = agent.id();
    // A drain that converged on another thread may still be emitting its `idle`: it is
    // delivered before `agent/disposed`.
    agent.status_settled();
    contained_now(id, "scope", || agent.scope().dispose());
    let runtime = entry.runtime.upgrade();
    // (Without the runtime no publication can run: no lifecycle lock is needed then.)
    let lifecycle = runtime.as_ref().map(|rt| {
        // The registry's reference to `entry` (the teardown holds another).
        rt.registry.lock().remove(entry.serial);
        rt.agent_lifecycle.lock()
    });
    // (No event is built for a bus nobody listens to.)
    if entry.announced.swap(false, Ordering::SeqCst) && entry.services.agent_events.has_listeners() {
        entry
            .services
            .agent_events
            .emit(&AgentEvent::Disposed { agent: id.clone() });
    }
    drop(lifecycle);
    let guard = entry.session_guard.lock().take();
    contained_now(id, "session", || drop(guard));
    if let Some(owner) = entry.owner.as_ref().and_then(Weak::upgrade) {
        owner.children.lock().remove(&entry.serial);
    }
}

/// Runs one asynchronous teardown step, containing (and logging) a panic.
async fn contained<T>(id: &SessionId, step: &str, work: impl Future<Output = T>) {
    if let Err(payload) = AssertUnwindSafe(work).catch_unwind().await {
        warn_step(id, step, &*payload);
    }
}

/// Runs one synchronous teardown step, containing (and logging) a panic.
fn contained_now(id: &SessionId, step: &str, work: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(work)) {
        warn_step(id, step, &*payload);
    }
}

fn warn_step(id: &SessionId, step: &str, payload: &(dyn std::any::Any + Send)) {
    tracing::warn!(
        agent = %id,
        step,
        message = %panic_message(payload),
        "a step of the agent's teardown panicked; the teardown goes on"
    );
}

/// The memoized teardown of one entry: unstarted until the first `dispose`, then the
/// transaction that any of its futures polls (the others wait on the list of wakers; it is only
/// built, and boxed, by a first poll that cannot complete it at once), then done. (What [`futures::future::Shared`] would give, without its extra allocations.)
#[derive(Default)]
pub(super) struct TeardownCell(Mutex<TeardownState>);

#[derive(Default)]
enum TeardownState {
    #[default]
    Unstarted,
    Running {
        /// `None` while one holder polls it.
        future: Option<Transaction>,
        /// Set by a wake-up of the transaction (see the entry's [`Wake`] impl).
        notified: bool,
        /// The holders waiting for the next wake-up.
        wakers: Vec<Waker>,
    },
    /// Completed (also after a panic while polled, see [`AgentEntry::poll_teardown`]).
    Done,
}

/// The transaction of a running teardown.
enum Transaction {
    /// Not polled yet: the first poll completes a quiescent agent's teardown at once
    /// ([`AgentEntry::release_if_quiescent`]), or builds the [`teardown`] future.
    Unpolled,
    /// The [`teardown`] future, polled at least once.
    Boxed(BoxFuture<'static, ()>),
}

/// Adds a holder's waker to the waiting list (once).
fn register(wakers: &mut Vec<Waker>, waker: &Waker) {
    if !wakers.iter().any(|w| w.will_wake(waker)) {
        wakers.push(waker.clone());
    }
}

/// The transaction's own waker: wakes every waiting holder (the next to poll drives it).
impl Wake for AgentEntry {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let wakers = match &mut *self.teardown.0.lock() {
            TeardownState::Running { notified, wakers, .. } => {
                *notified = true;
                std::mem::take(wakers)
            }
            _ => return,
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// One caller's view of the teardown: polling drives it. The first caller's view, dropped
/// unfinished, hands the rest to a runtime task (or a plain tokio task when the runtime is gone),
/// on the current tokio runtime or else on the one the registry created its agents on.
struct Teardown {
    /// `None` once the teardown completed.
    entry: Option<Arc<AgentEntry>>,
    first: bool,
}

impl Future for Teardown {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(entry) = self.entry.as_ref() else {
            return Poll::Ready(());
        };
        let poll = entry.poll_teardown(cx);
        if poll.is_ready() {
            self.entry = None;
        }
        poll
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        let Some(entry) = self.entry.take() else { return };
        if !self.first || entry.teardown_settled() {
            return;
        }
        // Drive the teardown in the background so it progresses even if no caller polls: on the
        // current tokio runtime, or — dropped outside any — on the one the registry's agents
        // were created on.
        let runtime = entry.runtime.upgrade();
        let handle = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| runtime.as_ref().and_then(|rt| rt.tokio.get().cloned()));
        let Some(handle) = handle else { return };
        let rest = Teardown {
            entry: Some(entry),
            first: false,
        };
        match runtime {
            Some(rt) => drop(rt.tasks.spawn_on(rest, &handle)),
            None => drop(handle.spawn(rest)),
        }
    }
}

/// The entry is its handle's disposer itself (no wrapper to allocate).
impl Disposer for AgentEntry {
    fn dispose(&self) -> BoxFuture<'static, ()> {
        match self.me.upgrade() {
            Some(entry) => entry.dispose(),
            // Unreachable: the handle calling this holds the entry.
            None => Box::pin(future::ready(())),
        }
    }
}
