//! [`LoopAgent`]: the reference [`agent::Agent`] — inbox, delivery and wake rules, cancellation,
//! status and the turn/step driver (spec §8).
//!
//! # Phases
//! The agent is `Idle` or `Running` (maintenance tasks are not part of this runtime, so the
//! public status is the phase). `Running` carries the active activity's [`Signal`] and the
//! *wake latch*: a waking send that arrives after that signal was cancelled (for any cause but
//! `disposed`) is redirected to `next-turn` and latched; when the aborted driver converges it
//! replays the latch — as a fresh turn in the same driver, so the status stays `running` — if
//! work is still pending. `cancel` without `keep_inbox` drops the latch with the inbox. A
//! `cancel` marks the activity `aborting` before it cancels the signal; sends treat the mark
//! like the cancelled signal.
//!
//! # Driver start
//! A wake delivered to an idle agent runs the driver's synchronous prefix on the caller's
//! thread: the phase becomes `Running` (emitting `AgentEvent::Status`), `turn/start` is
//! appended and the first batch is claimed. The rest of the drain runs as one tokio task,
//! counted among the agent's running drivers (what its teardown waits for) until the task's
//! future is dropped; its first suspension is prompt assembly.
//!
//! # Locking
//! * `state` (phase, last turn number, request-header bookkeeping) is held for short
//!   synchronous sections only, never across an `.await`, and never while events are emitted or
//!   the session is appended to.
//! * `status` is a re-entrant lock held while `AgentEvent::Status` is emitted (and by a
//!   converging driver from its idle transition through that emission), so status
//!   events are delivered in order and never twice with the same value, while a listener on the
//!   same thread may still call back into the agent. A status change caused by such a listener
//!   (say, a follow-up sent from the `idle` notification) is not emitted from inside the
//!   running emission — later listeners would see it before the event still being delivered —
//!   but by the outer emitter once every listener has seen its event. The outer emitter also
//!   clears the busy flag behind `when_idle` (under `state`, while the phase is still idle),
//!   so idle waiters resolve only after the `idle` event was delivered.
//! * The inbox has its own locks (see the `inbox` module). Its re-entrant operation lock is
//!   also held by `send` across its liveness check, phase read and append, and by `cancel`
//!   (so also by disposal's clear, which follows the liveness mark) across its clear
//!   and abort decision (not across cancelling the token, whose listeners may cancel other
//!   agents), so the two never interleave. Order: inbox operation lock → `state` → the inbox
//!   projection; `state` is never held while the operation lock is taken.

mod assemble;
mod driver;
mod inbox;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::{Mutex, ReentrantMutex};
use tokio::sync::Notify;

use agent::history::DerivedHistory;
use agent::{
    Agent, AgentError, AgentEvent, AgentOptions, AgentRef, AgentStatus, CancelCause, CancelOptions,
    EventData, InboxSnapshot, InboxTarget, Message, MessageId, Scope, Services, Session, SessionId, Signal,
};

use crate::prompt::RetainedSnapshot;
use driver::{AfterTurn, OpenTurn};
use inbox::Inbox;

/// Failure codes of the `agent/error` events the loop itself raises.
pub mod codes {
    /// The session refused to log a turn's `turn/end` (an observer vetoed it, say): the turn
    /// stays open in the log, so no further turn opens until that `turn/end` is logged. Each
    /// later wake retries it first; while it is still refused the wake opens no turn, its work
    /// stays pending and another `agent/error` with this code is emitted.
    pub const TURN_END_REFUSED: &str = "TURN_END_REFUSED";
    /// The session refused to log a step's `step/end` (an observer vetoed it, a persistence
    /// failure): the step, and so its turn, stays open in the log, so the turn stops there
    /// (ending `error` with this failure unless the step had failed or was aborted itself) and
    /// no further step or turn opens until that `step/end`, then the turn's `turn/end`, are
    /// logged. Each later wake retries them first; while the step's end is still refused the
    /// wake opens no turn, its work stays pending and another `agent/error` with this code is
    /// emitted.
    pub const STEP_END_REFUSED: &str = "STEP_END_REFUSED";
}

/// Tunables of the loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopConfig {
    /// How many concurrency-safe tool calls of one step may run at once (at least 1).
    pub tool_pool: usize,
}

impl Default for LoopConfig {
    fn default() -> Self {
        Self { tool_pool: 8 }
    }
}

/// A [`Notify`] that counts its waiters, so that waking them costs one atomic load when there
/// are none. For a condition a waker makes true (with a `SeqCst` write) before it calls
/// [`wake_all`](Self::wake_all), and that a waiter reads (`SeqCst`) after it registered: either
/// the waker sees the waiter counted, or the waiter sees the condition.
#[derive(Default)]
pub(crate) struct Waiters {
    count: AtomicUsize,
    notify: Notify,
}

impl Waiters {
    /// Wakes every waiter (none to wake: one load).
    pub(crate) fn wake_all(&self) {
        if self.count.load(Ordering::SeqCst) != 0 {
            self.notify.notify_waiters();
        }
    }

    /// Resolves once `ready()` holds (at once when it does).
    pub(crate) async fn wait_until(&self, ready: impl Fn() -> bool) {
        if ready() {
            return;
        }
        /// Uncounts the waiter when its wait ends (also when it is dropped).
        struct Counted<'a>(&'a AtomicUsize);
        impl Drop for Counted<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.count.fetch_add(1, Ordering::SeqCst);
        let _counted = Counted(&self.count);
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a wake between the check and the wait wakes it.
            notified.as_mut().enable();
            if ready() {
                return;
            }
            notified.await;
            // Woken: usually by the change awaited (no need to register again to see it).
            if ready() {
                return;
            }
        }
    }
}

/// The busy flag behind [`Agent::when_idle`], shared with the idle waiters so that a waiter never
/// keeps the agent alive. (A flag and one [`Notify`] rather than a `watch` channel: setting it
/// is an atomic store, and only becoming idle wakes anyone.)
#[derive(Default)]
struct IdleFlag {
    busy: AtomicBool,
    idle: Waiters,
}

impl IdleFlag {
    fn set(&self, busy: bool) {
        self.busy.store(busy, Ordering::SeqCst);
        if !busy {
            self.idle.wake_all();
        }
    }

    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }

    /// Resolves once the flag is clear (at once when it is).
    async fn wait(&self) {
        self.idle.wait_until(|| !self.is_busy()).await;
    }
}

/// The agent's driver tasks that are spawned and whose future is not dropped yet. (A count and
/// a [`Notify`] in the agent, where a `TaskTracker` would be one more allocation per agent.)
#[derive(Default)]
struct Drivers {
    running: AtomicUsize,
    exited: Waiters,
}

impl Drivers {
    fn is_empty(&self) -> bool {
        self.running.load(Ordering::SeqCst) == 0
    }

    /// Resolves once no driver runs (at once when none does).
    async fn wait(&self) {
        self.exited.wait_until(|| self.is_empty()).await;
    }
}

/// The agent as its driver task holds it: counted among the agent's running drivers from the
/// spawn until the task's future is dropped (completed, or dropped with its runtime).
struct Driver(Arc<LoopAgent>);

impl Driver {
    fn new(agent: Arc<LoopAgent>) -> Self {
        agent.drivers.running.fetch_add(1, Ordering::SeqCst);
        Self(agent)
    }

    /// The drain: runs turns until the agent converges to idle.
    ///
    /// (An `async` block over the captured turn rather than an `async fn`, whose arguments
    /// would be stored twice in the driver task.)
    #[allow(clippy::manual_async_fn)]
    fn drive(self, mut open: OpenTurn) -> impl Future<Output = ()> + Send + 'static {
        async move {
            loop {
                let after = self.run_turn(&mut open).await;
                match self.after_turn(after) {
                    Some(next) => open = next,
                    None => return,
                }
            }
        }
    }
}

impl std::ops::Deref for Driver {
    type Target = LoopAgent;

    fn deref(&self) -> &LoopAgent {
        &self.0
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let drivers = &self.0.drivers;
        if drivers.running.fetch_sub(1, Ordering::SeqCst) == 1 {
            drivers.exited.wake_all();
        }
    }
}

/// The status emission state, behind the agent's re-entrant `status` lock.
struct StatusEmission {
    /// The last status emitted.
    last: Cell<AgentStatus>,
    /// Whether an emission is running (on the thread holding the lock).
    emitting: Cell<bool>,
}

enum Phase {
    Idle,
    Running {
        signal: Signal,
        wake_requested: bool,
        /// A `cancel` decided to abort this activity (under the inbox's operation lock) and is
        /// about to cancel `signal`: from then on a waking send is handled as arriving after
        /// the abort, and no further turn opens for it.
        aborting: bool,
    },
}

impl Phase {
    /// Whether the running activity is aborted (or about to be, by a `cancel` in progress).
    fn is_aborting(&self) -> bool {
        matches!(self, Phase::Running { signal, aborting, .. } if *aborting || signal.is_cancelled())
    }
}

struct State {
    phase: Phase,
    /// The number of the last `turn/start` in the log.
    last_turn: u64,
    /// Whether the publication gate is open (before it, wakes are deferred).
    unlocked: bool,
    /// A wake that arrived while the gate was closed.
    deferred_wake: bool,
    /// How many wakes were delivered (wrapping): lets `cancel` tell a waking send made while
    /// it cleared the inbox from a non-waking one.
    wakes: u64,
    /// Whether this instance already logged its initial/resume request header.
    request_header_logged: bool,
    /// Incremental scan of the log for the last runtime-context snapshot: (events scanned,
    /// what was found).
    snapshot_scan: (usize, RetainedSnapshot),
    /// The log's derived history, projected incrementally for model requests.
    history: DerivedHistory,
    /// A turn whose `turn/end` (or whose last step's `step/end`) the session refused: the log
    /// still has it (and that step) open, so the next turn must log these ends before its
    /// `turn/start` (spec §8.6: `step/end` and `turn/end` are always appended; providers §6.4
    /// S2: `turn/start` requires no open turn, S5: `turn/end` no open step).
    unclosed: Option<driver::UnclosedTurn>,
}

/// The reference agent loop. Created and published by [`Runtime`](crate::runtime::Runtime);
/// shared as [`AgentRef`].
///
/// Besides the [`Agent`] contract it offers [`replace_pending`](Self::replace_pending). A
/// `LoopAgent` built directly with [`LoopAgent::new`] starts *gated*: deliveries are logged but
/// the driver only starts once [`activate`](Self::activate) is called (the runtime calls it
/// after publication).
pub struct LoopAgent {
    me: Weak<LoopAgent>,
    id: SessionId,
    options: AgentOptions,
    session: Arc<Session>,
    scope: Arc<Scope>,
    services: Arc<Services>,
    config: LoopConfig,
    resumed: bool,
    inbox: Inbox,
    state: Mutex<State>,
    busy: Arc<IdleFlag>,
    status: ReentrantMutex<StatusEmission>,
    drivers: Drivers,
    disposed: AtomicBool,
    /// Test hook: runs once, on the driver's thread, as a drain that has finished its turn is
    /// about to converge (after the turn's end, before the idle-or-continue decision).
    #[cfg(test)]
    pub(crate) before_converge: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Test hook: runs once, on the sending thread, as a `send` that found the agent live is
    /// about to take the inbox's operation lock (where a disposal on another thread can begin).
    #[cfg(test)]
    pub(crate) before_send_exclusive: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for LoopAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopAgent")
            .field("id", &self.id)
            .field("status", &self.status())
            .finish()
    }
}

impl LoopAgent {
    /// Builds an agent over `session` (unpublished or published) with its registration `scope`.
    /// The inbox is replayed from the header's `seedLength`; turn numbering continues after the
    /// last `turn/start` in the log. `resumed` makes the first request header `resume`.
    pub fn new(
        services: impl Into<Arc<Services>>,
        session: Arc<Session>,
        options: AgentOptions,
        scope: Arc<Scope>,
        config: LoopConfig,
        resumed: bool,
    ) -> Result<Arc<Self>, AgentError> {
        options.validate()?;
        let services = services.into();
        // One snapshot of the log for the inbox's replay and the turn numbering.
        let events = session.events();
        let inbox = Inbox::new(session.clone(), &events, services.agent_events.clone())?;
        // The number of the last `turn/start` exactly (not `next_turn_number - 1`, which
        // saturates at the end of the range and would reuse the last number).
        let last_turn = events
            .iter()
            .rev()
            .find_map(|e| match e.data {
                EventData::TurnStart { turn } => Some(turn),
                _ => None,
            })
            .unwrap_or(0);
        let busy = Arc::new(IdleFlag::default());
        Ok(Arc::new_cyclic(|me| Self {
            me: me.clone(),
            id: session.id().clone(),
            options,
            session,
            scope,
            services,
            config,
            resumed,
            inbox,
            state: Mutex::new(State {
                phase: Phase::Idle,
                last_turn,
                unlocked: false,
                deferred_wake: false,
                wakes: 0,
                request_header_logged: false,
                snapshot_scan: (0, RetainedSnapshot::Never),
                history: DerivedHistory::new(),
                unclosed: None,
            }),
            busy,
            status: ReentrantMutex::new(StatusEmission {
                last: Cell::new(AgentStatus::Idle),
                emitting: Cell::new(false),
            }),
            drivers: Drivers::default(),
            disposed: AtomicBool::new(false),
            #[cfg(test)]
            before_converge: Mutex::new(None),
            #[cfg(test)]
            before_send_exclusive: Mutex::new(None),
        }))
    }

    /// Opens the publication gate: from now on wakes start the driver. A wake that arrived
    /// while the gate was closed is delivered now if its work is still pending.
    pub fn activate(&self) {
        let deferred = {
            let mut st = self.state.lock();
            st.unlocked = true;
            std::mem::take(&mut st.deferred_wake)
        };
        if deferred && self.inbox.has_pending() {
            self.wake_driver(false);
        }
    }

    /// Replaces a pending message (in either list) as a durable cancellation that inserts the
    /// replacement. Returns whether `id` was pending.
    pub fn replace_pending(&self, id: &MessageId, message: Message) -> Result<bool, AgentError> {
        self.inbox.replace(id, message)
    }

    /// The loop's tunables.
    pub fn config(&self) -> &LoopConfig {
        &self.config
    }

    /// Whether a driver task of this agent runs (spawned, its future not dropped yet).
    pub(crate) fn has_running_driver(&self) -> bool {
        !self.drivers.is_empty()
    }

    /// Resolves once no driver task of this agent runs (at once when none does).
    pub(crate) async fn drivers_exited(&self) {
        self.drivers.wait().await;
    }

    /// Resolves once the agent is idle (like [`Agent::when_idle`], without boxing; ready at
    /// once when it already is).
    pub(crate) async fn wait_idle(&self) {
        if !self.busy.is_busy() {
            return;
        }
        self.busy.wait().await;
    }

    /// Whether the agent is idle (what [`wait_idle`](Self::wait_idle) waits for).
    pub(crate) fn is_idle(&self) -> bool {
        !self.busy.is_busy()
    }

    /// Returns once no status emission is in progress on another thread: the `idle` event of a
    /// drain that converged (on another thread) before the caller saw the agent idle has been
    /// delivered. The teardown passes here before it unregisters the agent, so `agent/status`
    /// never follows `agent/disposed`.
    pub(crate) fn status_settled(&self) {
        drop(self.status.lock());
    }

    /// Marks the agent as being disposed: it takes no new work from now on.
    pub(crate) fn begin_disposal(&self) {
        self.disposed.store(true, Ordering::SeqCst);
    }

    fn arc(&self) -> Arc<LoopAgent> {
        self.me
            .upgrade()
            .expect("a LoopAgent method runs while the agent is alive, so its Arc exists")
    }

    fn agent_ref(&self) -> AgentRef {
        self.arc()
    }

    /// Emits the current public status if it differs from the last one emitted. Called from a
    /// status listener (re-entrantly on the emitting thread) it emits nothing: the outer call
    /// re-reads the status after its event reached every listener and emits the change then.
    ///
    /// The outer call also releases the idle waiters, once the agent is idle and its `idle`
    /// event reached every listener (spec: SPN-26, SPN-27; the reference resolves `whenIdle()`
    /// after the event), so a waiter never sees the agent idle before the listeners do.
    fn emit_status(&self) {
        let emission = self.status.lock();
        if emission.emitting.replace(true) {
            return;
        }
        // Cleared even if an emission unwinds (listener failures are contained by the bus).
        struct Done<'a>(&'a Cell<bool>);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.set(false);
            }
        }
        let _done = Done(&emission.emitting);
        loop {
            let current = self.status();
            if emission.last.get() == current {
                if current == AgentStatus::Idle {
                    // Under `state`, so a wake that opened a new phase meanwhile (another
                    // thread) keeps the flag set.
                    let st = self.state.lock();
                    if matches!(st.phase, Phase::Idle) {
                        self.busy.set(false);
                    }
                }
                return;
            }
            emission.last.set(current);
            let events = &self.services.agent_events;
            // (No event is built for a bus nobody listens to.)
            if events.has_listeners() {
                events.emit(&AgentEvent::Status {
                    agent: self.id.clone(),
                    status: current,
                });
            }
        }
    }

    /// Delivers a wake (spec §8.3 rule 1–2).
    fn wake_driver(&self, after_abort: bool) {
        let start = {
            let mut st = self.state.lock();
            st.wakes = st.wakes.wrapping_add(1);
            // A send that passed its liveness check before disposal began (another thread, or
            // a listener of the send itself disposing the agent) must not start a driver on the
            // disposing agent: teardown never waits on a new turn. Read under `state`, after
            // `begin_disposal` stored the flag and before its `cancel` takes `state`, so a wake
            // either sees the flag or opens a phase that cancel then aborts.
            if self.disposed.load(Ordering::SeqCst) {
                return;
            }
            if !st.unlocked {
                st.deferred_wake = true;
                return;
            }
            if matches!(st.phase, Phase::Idle) && tokio::runtime::Handle::try_current().is_err() {
                // The driver needs a tokio runtime; keep the wake for `activate`.
                tracing::warn!(agent = %self.id, "wake without a tokio runtime; deferred until activate()");
                st.deferred_wake = true;
                return;
            }
            match &mut st.phase {
                Phase::Running {
                    signal,
                    wake_requested,
                    ..
                } => {
                    if after_abort && signal.cause() != Some(CancelCause::Disposed) {
                        *wake_requested = true;
                    }
                    false
                }
                Phase::Idle => {
                    st.phase = Phase::Running {
                        signal: Signal::new(),
                        wake_requested: false,
                        aborting: false,
                    };
                    self.busy.set(true);
                    true
                }
            }
        };
        if start {
            self.emit_status();
            self.start_driver();
        }
    }

    /// Runs the synchronous prefix of a fresh driver and spawns the rest.
    fn start_driver(&self) {
        if let Some(open) = self
            .open_turn()
            .or_else(|| self.next_open_after_exit(AfterTurn::Stop))
        {
            tokio::spawn(Driver::new(self.arc()).drive(open));
        }
    }

    /// The driver has no turn in flight: go on with a fresh signal (still running) or become
    /// idle. It goes on when the activity is uncancelled and work is pending by `after`'s rule
    /// (spine §8.6 step 4), or when a wake is latched and work is pending (replay). Returns
    /// whether it goes on.
    ///
    /// The pending-work check and the idle transition are one critical section (under
    /// `state`): a send reads the phase before it appends and delivers its wake after, so a
    /// send that found the driver running (its wake is then a no-op, spine §8.3 rule 1) either
    /// appended before the check, which sees it, or delivers its wake after the transition, to
    /// an idle agent. (Checked in a section of its own, a send appending between the check and
    /// the transition was left pending on an idle agent, with no wake.)
    fn converge(&self, after: AfterTurn) -> bool {
        // Held from the idle transition through its status emission, so that a teardown that
        // saw the agent idle (another thread) waits for the `idle` event before it announces
        // the disposal (see `status_settled`).
        let _emission = self.status.lock();
        let go_on = {
            let mut st = self.state.lock();
            let go_on = match &st.phase {
                Phase::Running {
                    signal,
                    wake_requested,
                    aborting,
                } => {
                    let continues = !*aborting
                        && !signal.is_cancelled()
                        && match after {
                            AfterTurn::AnyPending => self.inbox.has_pending(),
                            AfterTurn::QueuedPrompt => self.inbox.has_queued_prompt(),
                            AfterTurn::Stop => false,
                        };
                    continues
                        || (*wake_requested
                            && !self.disposed.load(Ordering::SeqCst)
                            && self.inbox.has_pending())
                }
                Phase::Idle => false,
            };
            if go_on {
                st.phase = Phase::Running {
                    signal: Signal::new(),
                    wake_requested: false,
                    aborting: false,
                };
            } else {
                // The idle waiters are released by the emission below, after the `idle` event.
                st.phase = Phase::Idle;
            }
            go_on
        };
        if !go_on {
            self.emit_status();
        }
        go_on
    }

    /// The synchronous opening of a turn: abort check, `turn/start`, first claim.
    fn open_turn(&self) -> Option<OpenTurn> {
        let (signal, turn) = {
            let st = self.state.lock();
            let Phase::Running { signal, .. } = &st.phase else {
                return None;
            };
            (signal.clone(), st.last_turn.checked_add(1))
        };
        if signal.is_cancelled() {
            return None;
        }
        // A turn whose `turn/end` (or whose last step's `step/end`) was refused is still open
        // in the log: close it (its step first) or open nothing (the work stays pending for a
        // later wake to retry).
        let unclosed = self.state.lock().unclosed.take();
        if let Some(unclosed) = unclosed
            && let Err(unclosed) = self.close_unclosed(unclosed)
        {
            self.state.lock().unclosed = Some(unclosed);
            return None;
        }
        // A log (seeded, forked or resumed) can already hold the last number a turn may take;
        // numbers stay safe integers so the log stays readable in the reference format.
        let Some(turn) = turn.filter(|t| *t <= agent::header::MAX_SAFE_INTEGER) else {
            self.report_error(driver::failure_of(&AgentError::Other(
                format!(
                    "agent \"{}\" cannot open another turn: its log already holds turn number {} \
                     (turn numbers are safe integers, at most {})",
                    self.id,
                    self.state.lock().last_turn,
                    agent::header::MAX_SAFE_INTEGER
                )
                .into(),
            )));
            return None;
        };
        if let Err(err) = self.session.record(EventData::TurnStart { turn }, None) {
            self.report_error(driver::failure_of(&err));
            return None;
        }
        self.state.lock().last_turn = turn;
        let claimed = self
            .inbox
            .claim(InboxTarget::NextTurn, turn)
            .map_err(|e| driver::TurnFailure::from_error(&e));
        Some(OpenTurn {
            turn,
            signal,
            claimed,
        })
    }

    /// After a turn: with work pending (what counts is `after`'s rule) and an uncancelled
    /// activity, start the next turn with a fresh signal; otherwise converge.
    fn after_turn(&self, after: AfterTurn) -> Option<OpenTurn> {
        self.next_open_after_exit(after)
    }

    /// Converges (going on while work is pending by `after`'s rule, then replaying a latched
    /// wake while one is pending) until a turn opens or the agent is idle.
    fn next_open_after_exit(&self, mut after: AfterTurn) -> Option<OpenTurn> {
        #[cfg(test)]
        if let Some(hook) = self.before_converge.lock().take() {
            hook();
        }
        loop {
            if !self.converge(after) {
                return None;
            }
            if let Some(open) = self.open_turn() {
                return Some(open);
            }
            // The turn did not open (its signal was cancelled meanwhile, or it could not be
            // logged): only a latched wake may try again.
            after = AfterTurn::Stop;
        }
    }

    fn report_error(&self, failure: agent::LlmFailure) {
        self.services.agent_events.emit(&AgentEvent::Error {
            agent: self.id.clone(),
            failure,
        });
    }
}

impl Drop for LoopAgent {
    /// Idle waiters resolve when the agent goes away (even one dropped while running, say with
    /// its runtime).
    fn drop(&mut self) {
        self.busy.set(false);
    }
}

impl Agent for LoopAgent {
    fn id(&self) -> &SessionId {
        &self.id
    }

    fn options(&self) -> &AgentOptions {
        &self.options
    }

    fn session(&self) -> &Arc<Session> {
        &self.session
    }

    fn scope(&self) -> &Arc<Scope> {
        &self.scope
    }

    fn send(&self, message: Message, target: InboxTarget, wake: bool) -> Result<MessageId, AgentError> {
        if !self.is_live() {
            return Err(AgentError::Disposed(self.id.clone()));
        }
        if wake && tokio::runtime::Handle::try_current().is_err() {
            return Err(AgentError::Other(
                "waking an agent requires a tokio runtime on the calling thread".into(),
            ));
        }
        let id = message.id.clone();
        #[cfg(test)]
        if let Some(hook) = self.before_send_exclusive.lock().take() {
            hook();
        }
        let after_abort = {
            // The phase read and the append form one step that a `cancel` on another thread
            // cannot split (spec: SPN-16, SPN-17): otherwise a send that read the running phase
            // before the cancel could append after its clear and find the turn aborted, neither
            // cleared nor latched.
            let _exclusive = self.inbox.exclusive();
            // Liveness again, in the section of the append (spec: SPN-19, SPN-9): disposal marks
            // the agent before its `cancel` clears the inbox under this same lock, so a send
            // either appends before that clear (which cancels its message, counted as dropped
            // work) or sees the mark here and is refused. (Checked only above, a send that
            // passed the check just before disposal began appended after the clear: accepted,
            // `Ok`, then never run nor cancelled.)
            if !self.is_live() {
                return Err(AgentError::Disposed(self.id.clone()));
            }
            // Captured before the insertion, so a re-entrant cancel from a splice observer
            // cannot reclassify it.
            let after_abort = wake && self.state.lock().phase.is_aborting();
            let target = if after_abort {
                InboxTarget::NextTurn
            } else {
                target
            };
            self.inbox.append(target, message)?;
            after_abort
        };
        if wake {
            self.wake_driver(after_abort);
        }
        Ok(id)
    }

    fn remove_pending(&self, id: &MessageId) -> Result<bool, AgentError> {
        self.inbox.remove(id)
    }

    fn inbox(&self) -> InboxSnapshot {
        self.inbox.snapshot()
    }

    fn cancel(&self, cause: CancelCause, options: CancelOptions) {
        // The clear and the abort decision form one step that a `send` on another thread cannot
        // split (see `send`; spec: SPN-16, SPN-17). The token itself is cancelled after the lock
        // is released (its listeners may cancel other agents); `aborting` covers the gap.
        let exclusive = self.inbox.exclusive();
        // Whether the inbox was durably cleared by this call.
        let mut cleared = false;
        let wakes = self.state.lock().wakes;
        if !options.keep_inbox {
            match self.inbox.clear() {
                Ok(_) => cleared = true,
                Err(err) => {
                    tracing::warn!(agent = %self.id, %err, "cancel could not durably clear the inbox");
                }
            }
        }
        let mut st = self.state.lock();
        if !options.keep_inbox {
            st.deferred_wake = false;
            if let Phase::Running { wake_requested, .. } = &mut st.phase {
                *wake_requested = false;
            }
        }
        let st_wakes = st.wakes;
        let signal = match &mut st.phase {
            Phase::Running {
                signal,
                wake_requested,
                aborting,
            } => {
                // Work pending after a successful clear was sent while the inbox was being
                // cleared (from a listener of the clear, or another thread): after the clear,
                // before the token below is cancelled. The aborted turn will not claim it, so
                // if a waking send delivered it, it is latched like a waking send after the
                // cancel (never under `disposed`); non-waking context stays parked.
                if cleared
                    && st_wakes != wakes
                    && !self.disposed.load(Ordering::SeqCst)
                    && signal.cause().unwrap_or_else(|| cause.clone()) != CancelCause::Disposed
                    && self.inbox.has_pending()
                {
                    *wake_requested = true;
                }
                *aborting = true;
                Some(signal.clone())
            }
            Phase::Idle => None,
        };
        drop(st);
        drop(exclusive);
        if let Some(signal) = signal {
            signal.cancel(cause);
        }
    }

    fn status(&self) -> AgentStatus {
        match self.state.lock().phase {
            Phase::Idle => AgentStatus::Idle,
            Phase::Running { .. } => AgentStatus::Running,
        }
    }

    fn when_idle(&self) -> BoxFuture<'static, ()> {
        let busy = self.busy.clone();
        async move { busy.wait().await }.boxed()
    }

    fn is_live(&self) -> bool {
        !self.disposed.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests;
