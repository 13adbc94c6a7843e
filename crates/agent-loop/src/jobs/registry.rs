//! [`JobRegistry`]: the process-local implementation of [`agent::Jobs`].

use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use agent::bus::{EventBus, panic_message};
use agent::ids::SessionId;
use agent::jobs::{
    DEFAULT_JOB_LIMIT, JobError, JobHooks, JobId, JobInfo, JobOutcome, JobRead, JobSpec, JobStatus, Jobs,
};
use agent::registration::Registration;
use agent::signal::Signal;
use async_trait::async_trait;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared, join_all};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::model_text;
use super::notice::JobNotice;

/// Decides whether an owner is still a live agent (wired by the host to its agent registry).
pub type OwnerProbe = Arc<dyn Fn(&SessionId) -> bool + Send + Sync>;

type CancelHook = Arc<dyn Fn(Option<String>) + Send + Sync>;

/// Configuration of a [`JobRegistry`].
#[derive(Clone)]
pub struct JobRegistryConfig {
    /// Per-owner limit of `running` plus `stopping` jobs (starts still in their starter count
    /// too). Default [`DEFAULT_JOB_LIMIT`]; `0` refuses every start.
    pub limit: usize,
    /// When `true`, [`start`](Jobs::start) fails with [`JobError::NoController`] unless a
    /// controller [attached](JobRegistry::attach_controller) globally or for the owner serves
    /// it. Default `false`: every owner is served.
    pub require_controller: bool,
    /// When set, an owner the probe reports as not live is refused with
    /// [`JobError::OwnerDisposed`] before the starter runs. Owners being
    /// [disposed](Jobs::dispose_owner) are refused regardless.
    pub owner_probe: Option<OwnerProbe>,
    /// The bus completion notices are emitted on; a fresh bus when `None`.
    pub notices: Option<EventBus<JobNotice>>,
}

impl Default for JobRegistryConfig {
    fn default() -> Self {
        Self {
            limit: DEFAULT_JOB_LIMIT,
            require_controller: false,
            owner_probe: None,
            notices: None,
        }
    }
}

impl fmt::Debug for JobRegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRegistryConfig")
            .field("limit", &self.limit)
            .field("require_controller", &self.require_controller)
            .field("owner_probe", &self.owner_probe.is_some())
            .finish()
    }
}

/// A non-consuming view of one job (a fresh value per call, never live state).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSnapshot {
    /// Id (`<kind>-<n>`).
    pub id: JobId,
    /// Kind.
    pub kind: String,
    /// Label.
    pub label: String,
    /// The owning agent.
    pub owner: SessionId,
    /// Status.
    pub status: JobStatus,
    /// The producer's detail, once settled with one.
    pub detail: Option<String>,
    /// Whether a kill, a terminal read or wait, or a teardown has reported (or committed to
    /// report) the terminal state; completion notices are suppressed when set. Reverts to
    /// `false` only when every read that [claimed](JobReadout::claimed) the report gives its
    /// claim back ([`JobRegistry::unclaim`]) and nothing else reported the job. A settlement that
    /// found waiters is not reported yet: its notice is held until a waiter delivers the output
    /// (then this is set) or every waiter is cancelled or dropped (then the notice is emitted).
    pub reported: bool,
}

impl JobSnapshot {
    /// The listing projection.
    pub fn info(&self) -> JobInfo {
        JobInfo {
            id: self.id.clone(),
            kind: self.kind.clone(),
            label: self.label.clone(),
            status: self.status,
        }
    }

    /// `[status: …]` for this job.
    pub fn status_line(&self) -> String {
        model_text::status_line(self.status, self.detail.as_deref())
    }
}

/// What [`JobRegistry::read_job`] returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobReadout {
    /// The job after the read (terminal reads mark it reported).
    pub snapshot: JobSnapshot,
    /// Empty while the job is live; its final output (or empty) once settled. Idempotent.
    pub output: String,
    /// Whether this read marked the job reported (suppressing its completion notice) in a way
    /// the reader may take back with [`JobRegistry::unclaim`] if its result never reaches whoever
    /// the notice was for. `false` for a live job, a read under a fired signal, and a job whose
    /// report came from elsewhere (a kill, a teardown) that no read can undo.
    pub claimed: bool,
}

/// What [`JobRegistry::kill_job`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KillOutcome {
    /// Cancellation was requested; the job is `stopping` (or settled meanwhile).
    Requested(JobSnapshot),
    /// The job had already settled; nothing was cancelled.
    AlreadyFinished(JobSnapshot),
    /// The job's `cancel` hook panicked. As in teardown, the job was forced `failed` (unless it
    /// had settled meanwhile) and its task aborted; its hooks are never called again.
    CancelPanicked {
        /// The job after the kill.
        snapshot: JobSnapshot,
        /// The panic's message.
        message: String,
    },
}

impl KillOutcome {
    /// The job after the kill.
    pub fn snapshot(&self) -> &JobSnapshot {
        match self {
            Self::Requested(s) | Self::AlreadyFinished(s) => s,
            Self::CancelPanicked { snapshot, .. } => snapshot,
        }
    }
}

/// Bookkeeping counts, for tests asserting that the registry ends empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobCounts {
    /// Job records held (live and settled-but-not-dropped).
    pub jobs: usize,
    /// Records `running` or `stopping`.
    pub active: usize,
    /// Starts whose starter is running (reserved, not yet registered).
    pub pending_starts: usize,
    /// Tasks awaiting a job's `done` (the registry's task tracker).
    pub tasks: usize,
    /// Reads currently waiting for a settlement.
    pub waiters: usize,
    /// Owners whose disposal is in progress.
    pub disposing_owners: usize,
}

impl JobCounts {
    /// Whether nothing at all is held.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The process-local background job registry.
///
/// # Contract
/// * **Atomic start.** [`start`](Jobs::start) runs a preflight — a tokio runtime is present
///   (else [`JobError::NoRuntime`]), the registry is not shut down, a controller serves the
///   owner (when [required](JobRegistryConfig::require_controller)), the owner is not being
///   disposed (and the [probe](JobRegistryConfig::owner_probe) reports it live), the owner is
///   under its limit — and reserves a capacity slot before it calls the starter exactly once. The registration that
///   follows cannot fail. A refused preflight never calls the starter and allocates no id; a
///   starter that panics releases its reservation and the panic propagates to the caller.
/// * **Ids** are `<kind>-<n>` with a counter per kind starting at 1, never reused.
/// * **Owner fence.** Every read, wait, kill and listing names the owner; another owner's job
///   reads as [`JobError::NotFound`], exactly like an unknown id.
/// * **First-wins settlement.** One task per job (tracked by the registry's
///   [`TaskTracker`]) awaits `done`; the first terminal outcome — the producer's, or a teardown
///   force-failure — is recorded, later ones are ignored. A `done` that panics settles `failed`,
///   and so does a job whose task is dropped before `done` resolved (the tokio runtime it was
///   started on shut down: nothing else would ever settle it).
/// * **Kill** calls `cancel(reason)` and only then marks the job `stopping` and reported. A
///   `cancel` that panics is contained as in teardown: the record is forced `failed` and its task
///   aborted ([`KillOutcome::CancelPanicked`]).
/// * **Notices.** An unreported settlement emits one [`JobNotice`] on [`notices`](Self::notices)
///   (carrier = owner) after waiters are released. Kills, terminal reads and waits, and teardown
///   mark a job reported and so suppress the notice. A settlement that finds waiters holds its
///   notice until one of them delivers the output; reads and waits whose signal has fired never
///   claim the report (their caller discards the result), and when the last waiter of a held
///   notice abandons — signal fired, or future dropped — the notice is emitted after all. A
///   read whose result is discarded only after it claimed (the signal fired later) gives the
///   claim back with [`unclaim`](Self::unclaim), and the notice goes out as if it had never
///   claimed.
/// * **Teardown.** [`dispose_owner`](Jobs::dispose_owner) cancels every job of the owner with the
///   reason [`OWNER_DISPOSED_REASON`](model_text::OWNER_DISPOSED_REASON), awaits `done` (and the
///   job's task), then drops the owner's records; [`shutdown`](Self::shutdown) does the same for
///   every owner. A `cancel` that panics during teardown force-fails the record and aborts its
///   task (dropping `done`: its work may be orphaned); a forced-failed job's hooks are never
///   called again. A producer that never settles `done` after `cancel` stalls teardown (its
///   contract).
///
/// Dropping the registry without [`shutdown`](Self::shutdown) cancels live jobs without awaiting
/// them and logs a warning.
pub struct JobRegistry {
    inner: Arc<Inner>,
}

/// Shared state. `state` protects every record, the per-kind counters, owner reservations and
/// controllers; it is never held across an `.await` nor while producer code (starter, `cancel`,
/// probe) or notice listeners run.
struct Inner {
    limit: usize,
    require_controller: bool,
    owner_probe: Option<OwnerProbe>,
    state: Mutex<State>,
    tracker: TaskTracker,
    notices: EventBus<JobNotice>,
    /// Bumped whenever a reservation resolves (committed or abandoned), for drains to wait on.
    reservations: watch::Sender<u64>,
    /// Bumped after job changes, for [`JobRegistry::changes`].
    changes: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    closed: bool,
    next_seq: u64,
    counters: HashMap<String, u64>,
    jobs: HashMap<JobId, Record>,
    owners: HashMap<SessionId, OwnerState>,
    controllers: HashMap<Option<SessionId>, usize>,
    pending: usize,
    waiters: usize,
}

#[derive(Default)]
struct OwnerState {
    pending: usize,
    disposing: usize,
}

impl OwnerState {
    fn is_idle(&self) -> bool {
        self.pending == 0 && self.disposing == 0
    }
}

struct Record {
    seq: u64,
    id: JobId,
    kind: String,
    label: String,
    owner: SessionId,
    status: JobStatus,
    detail: Option<String>,
    output: Option<String>,
    reported: bool,
    /// Reads whose claim on the report is outstanding (may still be given back with
    /// [`JobRegistry::unclaim`]). `reported` with no claims is a report no read can undo.
    claims: usize,
    /// The job settled while waiters were registered: its notice is held until one of them
    /// delivers the output (then it is suppressed) or every one abandons (then it is emitted).
    notice_held: bool,
    /// The completion notice has been emitted (at most one per job).
    notice_sent: bool,
    waiters: usize,
    teardown_cancelled: bool,
    cancel: CancelHook,
    /// Latch: cancelled once the record is terminal.
    settled: CancellationToken,
    abort: AbortHandle,
    /// Resolves once the job's task has ended.
    finished: Shared<BoxFuture<'static, ()>>,
}

impl Record {
    fn snapshot(&self) -> JobSnapshot {
        JobSnapshot {
            id: self.id.clone(),
            kind: self.kind.clone(),
            label: self.label.clone(),
            owner: self.owner.clone(),
            status: self.status,
            detail: self.detail.clone(),
            reported: self.reported,
        }
    }

    fn is_active(&self) -> bool {
        !self.status.is_terminal()
    }

    /// The completion notice to emit (once the lock is released), marking it sent: none once
    /// the registry is closed or when it was sent already.
    fn notice(&mut self, closed: bool) -> Option<JobNotice> {
        if closed || std::mem::replace(&mut self.notice_sent, true) {
            return None;
        }
        Some(JobNotice::new(self.snapshot()))
    }

    /// A delivering read marks the (terminal) job reported. Returns whether the read holds a
    /// claim it may give back: not when the job was already reported by something no read can
    /// undo (a kill or a teardown).
    fn claim(&mut self) -> bool {
        if self.reported && self.claims == 0 {
            return false;
        }
        self.reported = true;
        self.claims += 1;
        true
    }
}

impl State {
    fn serves(&self, owner: &SessionId) -> bool {
        self.controllers.contains_key(&None) || self.controllers.contains_key(&Some(owner.clone()))
    }

    fn release_reservation(&mut self, owner: &SessionId) {
        self.pending = self.pending.saturating_sub(1);
        if let Some(o) = self.owners.get_mut(owner) {
            o.pending = o.pending.saturating_sub(1);
            if o.is_idle() {
                self.owners.remove(owner);
            }
        }
    }

    fn owned_mut(&mut self, owner: &SessionId, id: &JobId) -> Result<&mut Record, JobError> {
        match self.jobs.get_mut(id) {
            Some(rec) if rec.owner == *owner => Ok(rec),
            _ => Err(JobError::NotFound(id.clone())),
        }
    }
}

impl Default for JobRegistry {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for JobRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRegistry")
            .field("limit", &self.inner.limit)
            .field("counts", &self.counts())
            .finish()
    }
}

impl JobRegistry {
    /// A registry with the default configuration.
    pub fn new() -> Self {
        Self::with_config(JobRegistryConfig::default())
    }

    /// A registry with `config`.
    pub fn with_config(config: JobRegistryConfig) -> Self {
        let (reservations, _) = watch::channel(0);
        Self {
            inner: Arc::new(Inner {
                limit: config.limit,
                require_controller: config.require_controller,
                owner_probe: config.owner_probe,
                state: Mutex::new(State::default()),
                tracker: TaskTracker::new(),
                notices: config.notices.unwrap_or_default(),
                reservations,
                changes: watch::Sender::new(0),
            }),
        }
    }

    /// The per-owner limit.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// The bus completion notices are emitted on (carrier = the job's owner).
    pub fn notices(&self) -> &EventBus<JobNotice> {
        &self.inner.notices
    }

    /// A change counter for callers that wait for a condition over the jobs (a host waiting
    /// until an owner's jobs are settled and reported) without polling: its value is bumped
    /// after every change that can make a job settled or reported, or drop a record — a
    /// settlement (forced ones included), a read, wait, kill or [`unclaim`](Self::unclaim), an
    /// owner's or the registry's teardown — and possibly after other changes. The counter's
    /// value means nothing; only its changes do.
    ///
    /// To wait without a lost wake-up, take (or
    /// [`borrow_and_update`](watch::Receiver::borrow_and_update)) the receiver first, then check
    /// the condition, then await [`changed`](watch::Receiver::changed). A receiver registers
    /// nothing: dropping it is all the cleanup there is. `changed` fails only once the registry
    /// is dropped.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Declares a job controller serving every owner (`scope = None`) or one owner. Only
    /// consulted when [`JobRegistryConfig::require_controller`] is set. Dropping the guard
    /// detaches it.
    pub fn attach_controller(&self, scope: Option<SessionId>) -> Registration {
        *self
            .inner
            .state
            .lock()
            .controllers
            .entry(scope.clone())
            .or_default() += 1;
        let weak = Arc::downgrade(&self.inner);
        Registration::new(move || {
            if let Some(inner) = weak.upgrade() {
                let mut state = inner.state.lock();
                if let Some(n) = state.controllers.get_mut(&scope) {
                    *n -= 1;
                    if *n == 0 {
                        state.controllers.remove(&scope);
                    }
                }
            }
        })
    }

    /// Bookkeeping counts.
    pub fn counts(&self) -> JobCounts {
        let state = self.inner.state.lock();
        JobCounts {
            jobs: state.jobs.len(),
            active: state.jobs.values().filter(|r| r.is_active()).count(),
            pending_starts: state.pending,
            tasks: self.inner.tracker.len(),
            waiters: state.waiters,
            disposing_owners: state.owners.values().filter(|o| o.disposing > 0).count(),
        }
    }

    /// Starts a job (see the type-level contract). Same as [`Jobs::start`].
    pub fn start_job(&self, spec: JobSpec) -> Result<JobId, JobError> {
        let JobSpec {
            kind,
            label,
            owner,
            starter,
        } = spec;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("job registry: start outside a tokio runtime refused");
            return Err(JobError::NoRuntime);
        };
        if let Some(probe) = &self.inner.owner_probe {
            let live = catch_unwind(AssertUnwindSafe(|| probe(&owner))).unwrap_or_else(|payload| {
                tracing::warn!(message = %panic_message(&*payload), "job registry: owner probe panicked");
                false
            });
            if !live {
                return Err(JobError::OwnerDisposed);
            }
        }
        let reservation = Inner::reserve(&self.inner, &owner)?;
        let hooks = starter();
        Ok(reservation.commit(kind, label, hooks, &runtime))
    }

    /// `owner`'s jobs in start order.
    pub fn snapshots(&self, owner: &SessionId) -> Vec<JobSnapshot> {
        let state = self.inner.state.lock();
        let mut owned: Vec<&Record> = state.jobs.values().filter(|r| r.owner == *owner).collect();
        owned.sort_by_key(|r| r.seq);
        owned.into_iter().map(Record::snapshot).collect()
    }

    /// A non-consuming snapshot of `owner`'s job `id` (marks nothing reported).
    pub fn get(&self, owner: &SessionId, id: &JobId) -> Result<JobSnapshot, JobError> {
        let mut state = self.inner.state.lock();
        Ok(state.owned_mut(owner, id)?.snapshot())
    }

    /// Reads `owner`'s job `id` without waiting. A terminal read marks the job reported and is
    /// idempotent.
    ///
    /// For a caller whose result is discarded once a cancellation signal fires (a tool body),
    /// use [`read_job_unless_cancelled`](Self::read_job_unless_cancelled) or
    /// [`wait_and_read`](Self::wait_and_read) instead.
    pub fn read_job(&self, owner: &SessionId, id: &JobId) -> Result<JobReadout, JobError> {
        let read = read_locked(&mut self.inner.state.lock(), owner, id, true);
        self.inner.bump_changes();
        read
    }

    /// Reads `owner`'s job `id` without waiting, like [`read_job`](Self::read_job), except that
    /// a read made once `signal` has fired does not mark the job reported: whoever reads under a
    /// fired signal may discard the result (the tool pipeline records such a call as aborted),
    /// so the report is left to the completion notice or a later read. The signal is checked
    /// under the registry lock, atomically with the marking; a signal that fires only after it
    /// is the caller's to handle: [`unclaim`](Self::unclaim) the read if it
    /// [claimed](JobReadout::claimed) the report and its result is discarded.
    pub fn read_job_unless_cancelled(
        &self,
        owner: &SessionId,
        id: &JobId,
        signal: &Signal,
    ) -> Result<JobReadout, JobError> {
        let read = read_locked(&mut self.inner.state.lock(), owner, id, !signal.is_cancelled());
        self.inner.bump_changes();
        read
    }

    /// Waits like [`wait_settled`](Self::wait_settled), then reads like
    /// [`read_job_unless_cancelled`](Self::read_job_unless_cancelled), keeping this read
    /// registered as a waiter until the read is done: a settlement that finds it holds its
    /// completion notice meanwhile.
    ///
    /// * Settled, `signal` not fired: the output is returned and the job marked reported (the
    ///   held notice is suppressed); [`claimed`](JobReadout::claimed) says whether the caller
    ///   may give that back with [`unclaim`](Self::unclaim) should its result be discarded
    ///   after all (the signal fired only after this check).
    /// * Settled, `signal` fired (it raced the settlement): the output is returned but the job
    ///   is **not** marked reported; if no other waiter remains, the held notice is emitted, so
    ///   the output is never consumed by a call whose result is discarded.
    /// * Timed out: the live status (empty output), nothing marked.
    /// * Not settled and `signal` fired: [`JobError::Cancelled`]; the job keeps running.
    ///
    /// Cancel-safe: dropping the future unregisters the waiter and releases its claim on the
    /// report exactly like a fired signal does.
    pub async fn wait_and_read(
        &self,
        owner: &SessionId,
        id: &JobId,
        timeout: Option<Duration>,
        signal: &Signal,
    ) -> Result<JobReadout, JobError> {
        let waiter = self.wait_registered(owner, id, timeout, signal).await?;
        let (result, notice) = {
            let mut state = self.inner.state.lock();
            let cancelled = signal.is_cancelled();
            match waiter {
                None => (read_locked(&mut state, owner, id, !cancelled), None),
                Some(waiter) => {
                    let status = state.owned_mut(owner, id).map(|rec| rec.status);
                    let delivered = !cancelled && matches!(status, Ok(s) if s.is_terminal());
                    let (claimed, notice) = waiter.release(&mut state, delivered);
                    let result = match status {
                        Err(error) => Err(error),
                        Ok(s) if !s.is_terminal() && cancelled => Err(JobError::Cancelled(id.clone())),
                        // A delivering release has marked the job reported already.
                        Ok(_) => read_locked(&mut state, owner, id, false)
                            .map(|read| JobReadout { claimed, ..read }),
                    };
                    (result, notice)
                }
            }
        };
        self.inner.bump_changes();
        if let Some(notice) = notice {
            self.inner.notices.emit(&notice);
        }
        result
    }

    /// Gives back the claim on the report that a read of `owner`'s job `id` made
    /// ([`JobReadout::claimed`]), for a reader whose result never reached anyone (the tool
    /// pipeline [discarded](agent::tools::ToolContext::on_discarded) it). Call it at most once
    /// per claiming readout.
    ///
    /// Once no other read's claim is outstanding, the job is exactly as if the read had never
    /// claimed: it reads unreported again and its completion notice is emitted now (with the
    /// lock released; never once the registry is closed, and never a second time: a job that
    /// settled unreported before the read had its notice already) — or, while waiters are
    /// registered, held for them, so a delivering waiter suppresses it and the last abandoning
    /// one emits it. While another claiming read is outstanding (it may have delivered), the
    /// job stays reported; a report made by a kill or a teardown is never undone.
    ///
    /// Returns whether the job reads unreported again. A job that is gone (its owner was
    /// disposed) or foreign is left alone (`false`).
    pub fn unclaim(&self, owner: &SessionId, id: &JobId) -> bool {
        let (unreported, notice) = {
            let mut state = self.inner.state.lock();
            let closed = state.closed;
            let Ok(rec) = state.owned_mut(owner, id) else {
                return false;
            };
            if rec.claims == 0 {
                return false;
            }
            rec.claims -= 1;
            if rec.claims > 0 {
                return false;
            }
            rec.reported = false;
            let notice = if rec.notice_sent {
                // Emitted before the read claimed (the job settled unreported): the notice
                // already told the owner to read the output.
                None
            } else if rec.waiters > 0 {
                rec.notice_held = true;
                None
            } else {
                rec.notice(closed)
            };
            (true, notice)
        };
        self.inner.bump_changes();
        if let Some(notice) = notice {
            self.inner.notices.emit(&notice);
        }
        unreported
    }

    /// Waits until `owner`'s job `id` settles, `timeout` passes (`Ok(false)`), or `signal` is
    /// cancelled ([`JobError::Cancelled`]). Returns `Ok(true)` once settled (at once for a settled
    /// job). A settlement that finds a waiter holds its notice; the waiter that returns it with
    /// `signal` not fired claims the report (marks the job reported, suppressing the notice),
    /// while one whose `signal` fired — or that is dropped — releases its claim, and once no
    /// waiter is left the held notice is emitted. Cancelling or timing out stops only this wait,
    /// never the job. Cancel-safe: dropping the future unregisters the waiter.
    pub async fn wait_settled(
        &self,
        owner: &SessionId,
        id: &JobId,
        timeout: Option<Duration>,
        signal: &Signal,
    ) -> Result<bool, JobError> {
        let Some(waiter) = self.wait_registered(owner, id, timeout, signal).await? else {
            return Ok(true);
        };
        let (result, notice) = {
            let mut state = self.inner.state.lock();
            let cancelled = signal.is_cancelled();
            let status = state.owned_mut(owner, id).map(|rec| rec.status);
            let delivered = !cancelled && matches!(status, Ok(s) if s.is_terminal());
            let (_, notice) = waiter.release(&mut state, delivered);
            let result = match status {
                Err(error) => Err(error),
                Ok(s) if s.is_terminal() => Ok(true),
                Ok(_) if cancelled => Err(JobError::Cancelled(id.clone())),
                Ok(_) => Ok(false),
            };
            (result, notice)
        };
        self.inner.bump_changes();
        if let Some(notice) = notice {
            self.inner.notices.emit(&notice);
        }
        result
    }

    /// Registers a waiter on `owner`'s job `id` and waits until it settles, `timeout` passes or
    /// `signal` fires. `None` when the job was already settled (no waiter registered); otherwise
    /// the still-registered waiter, which the caller releases under the lock (or drops).
    async fn wait_registered<'a>(
        &'a self,
        owner: &SessionId,
        id: &'a JobId,
        timeout: Option<Duration>,
        signal: &Signal,
    ) -> Result<Option<WaiterGuard<'a>>, JobError> {
        let latch = {
            let mut state = self.inner.state.lock();
            let rec = state.owned_mut(owner, id)?;
            if rec.status.is_terminal() {
                return Ok(None);
            }
            rec.waiters += 1;
            let latch = rec.settled.clone();
            state.waiters += 1;
            latch
        };
        let guard = WaiterGuard {
            inner: &self.inner,
            id,
            armed: true,
        };
        let settled = async {
            match timeout {
                Some(limit) => {
                    let _ = tokio::time::timeout(limit, latch.cancelled()).await;
                }
                None => latch.cancelled().await,
            }
        };
        tokio::select! {
            biased;
            () = settled => {}
            () = signal.cancelled() => {}
        }
        Ok(Some(guard))
    }

    /// Kills `owner`'s job `id`: calls its `cancel(reason)`, then marks it `stopping` and
    /// reported. A settled job is only marked reported ([`KillOutcome::AlreadyFinished`]).
    ///
    /// A panicking `cancel` hook is contained exactly as owner disposal contains it: the panic is
    /// logged, the job is forced `failed` with a detail naming it (first-wins: unless it settled
    /// meanwhile) and its task aborted, dropping `done` — the work may be orphaned. The job stays
    /// reported (no notice), and as it is settled no later kill or teardown calls its `cancel`
    /// again ([`KillOutcome::CancelPanicked`]).
    pub fn kill_job(
        &self,
        owner: &SessionId,
        id: &JobId,
        reason: Option<String>,
    ) -> Result<KillOutcome, JobError> {
        let cancel = {
            let mut state = self.inner.state.lock();
            let rec = state.owned_mut(owner, id)?;
            if rec.status.is_terminal() {
                rec.reported = true;
                // A report no read can take back any more.
                rec.claims = 0;
                let snapshot = rec.snapshot();
                drop(state);
                self.inner.bump_changes();
                return Ok(KillOutcome::AlreadyFinished(snapshot));
            }
            // Claimed before `cancel` runs so a settlement it triggers stays quiet.
            rec.reported = true;
            rec.cancel.clone()
        };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| cancel(reason))) {
            let message = panic_message(&*payload);
            tracing::warn!(job = %id, %message, "job cancel panicked during kill; record forced failed, work may be orphaned");
            self.inner
                .force_fail(id, model_text::kill_cancel_panicked(&message));
            let snapshot = self.inner.state.lock().owned_mut(owner, id)?.snapshot();
            return Ok(KillOutcome::CancelPanicked { snapshot, message });
        }
        let snapshot = {
            let mut state = self.inner.state.lock();
            let rec = state.owned_mut(owner, id)?;
            if rec.status == JobStatus::Running {
                rec.status = JobStatus::Stopping;
            }
            rec.snapshot()
        };
        self.inner.bump_changes();
        Ok(KillOutcome::Requested(snapshot))
    }

    /// Cancels and awaits every job of every owner, drops every record, and closes the registry:
    /// later starts fail with [`JobError::ShutDown`]. Idempotent.
    pub async fn shutdown(&self) {
        self.inner.state.lock().closed = true;
        self.inner.drain(None, model_text::SHUTDOWN_REASON).await;
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }

    /// Cancels and awaits every job of `owner`, then drops its records. Same as
    /// [`Jobs::dispose_owner`]. While it runs, starts for `owner` fail with
    /// [`JobError::OwnerDisposed`]; once it returns the owner may start jobs again (a resumed
    /// agent reuses its session id), unless the owner probe says otherwise.
    pub async fn dispose_owner_jobs(&self, owner: &SessionId) {
        self.inner
            .state
            .lock()
            .owners
            .entry(owner.clone())
            .or_default()
            .disposing += 1;
        let _fence = DisposingGuard {
            inner: &self.inner,
            owner,
        };
        self.inner
            .drain(Some(owner), model_text::OWNER_DISPOSED_REASON)
            .await;
    }
}

#[cfg(test)]
impl JobRegistry {
    /// Settles `id` as its task would (for first-wins tests).
    pub(crate) fn settle_for_test(&self, id: &JobId, outcome: JobOutcome) {
        self.inner.settle(id, outcome);
    }
}

impl Inner {
    fn reserve(this: &Arc<Self>, owner: &SessionId) -> Result<Reservation, JobError> {
        let mut state = this.state.lock();
        if state.closed {
            return Err(JobError::ShutDown);
        }
        if this.require_controller && !state.serves(owner) {
            return Err(JobError::NoController);
        }
        let pending = match state.owners.get(owner) {
            Some(o) if o.disposing > 0 => return Err(JobError::OwnerDisposed),
            Some(o) => o.pending,
            None => 0,
        };
        let active = state
            .jobs
            .values()
            .filter(|r| r.owner == *owner && r.is_active())
            .count();
        if active + pending >= this.limit {
            return Err(JobError::LimitReached(this.limit));
        }
        state.owners.entry(owner.clone()).or_default().pending += 1;
        state.pending += 1;
        Ok(Reservation {
            inner: this.clone(),
            owner: owner.clone(),
            live: true,
        })
    }

    fn bump_reservations(&self) {
        self.reservations.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Signals [`JobRegistry::changes`]. Never called with the state lock held.
    fn bump_changes(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Records the first terminal outcome of `id`, releases its waiters, then emits its notice
    /// unless reported. Returns whether this outcome was the one recorded.
    fn settle(&self, id: &JobId, outcome: JobOutcome) -> bool {
        let notice = {
            let mut state = self.state.lock();
            let closed = state.closed;
            let Some(rec) = state.jobs.get_mut(id) else {
                return false;
            };
            if rec.status.is_terminal() {
                return false;
            }
            let outcome = normalize(outcome);
            rec.status = outcome.status;
            rec.detail = outcome.detail;
            rec.output = outcome.output;
            // The waiters may still be cancelled before they deliver the output (their call's
            // result is then discarded): hold the notice until one delivers or all abandon.
            if rec.waiters > 0 && !rec.reported {
                rec.notice_held = true;
            }
            rec.settled.cancel();
            if rec.reported || rec.notice_held {
                None
            } else {
                rec.notice(closed)
            }
        };
        self.bump_changes();
        if let Some(notice) = notice {
            self.notices.emit(&notice);
        }
        true
    }

    /// Cancels (once) and awaits every job of `owner` (or of everyone), until no start for it is
    /// pending and every record is settled with its task ended; then drops those records.
    async fn drain(&self, owner: Option<&SessionId>, reason: &str) {
        let belongs = |r: &Record| owner.is_none_or(|o| r.owner == *o);
        loop {
            let (cancels, finished, reservations) = {
                let mut state = self.state.lock();
                let pending = match owner {
                    Some(o) => state.owners.get(o).map_or(0, |s| s.pending),
                    None => state.pending,
                };
                let quiet = state
                    .jobs
                    .values()
                    .filter(|r| belongs(r))
                    .all(|r| r.status.is_terminal() && r.finished.peek().is_some());
                if pending == 0 && quiet {
                    state.jobs.retain(|_, r| !belongs(r));
                    drop(state);
                    self.bump_changes();
                    return;
                }
                let mut cancels = Vec::new();
                let mut finished = Vec::new();
                for rec in state.jobs.values_mut().filter(|r| belongs(r)) {
                    if rec.is_active() {
                        // Nobody is left to read a notice for work torn down with its owner.
                        rec.reported = true;
                        if !rec.teardown_cancelled {
                            rec.teardown_cancelled = true;
                            cancels.push((rec.id.clone(), rec.cancel.clone()));
                        }
                    }
                    finished.push(rec.finished.clone());
                }
                let reservations = (pending > 0).then(|| self.reservations.subscribe());
                (cancels, finished, reservations)
            };
            for (id, cancel) in cancels {
                self.teardown_cancel(&id, &cancel, reason);
            }
            join_all(finished).await;
            if let Some(mut rx) = reservations {
                // Resolves at once if a reservation resolved since the snapshot above.
                let _ = rx.changed().await;
            }
        }
    }

    fn teardown_cancel(&self, id: &JobId, cancel: &CancelHook, reason: &str) {
        match catch_unwind(AssertUnwindSafe(|| cancel(Some(reason.to_owned())))) {
            Ok(()) => {
                let mut state = self.state.lock();
                if let Some(rec) = state.jobs.get_mut(id)
                    && rec.status == JobStatus::Running
                {
                    rec.status = JobStatus::Stopping;
                }
            }
            Err(payload) => {
                let message = panic_message(&*payload);
                tracing::warn!(job = %id, %message, "job cancel panicked during teardown; record forced failed, work may be orphaned");
                self.force_fail(id, model_text::teardown_cancel_panicked(&message));
            }
        }
    }

    /// What a panicking `cancel` leaves: the job settled `failed` with `detail` (first-wins) and
    /// its task aborted (dropping `done`).
    fn force_fail(&self, id: &JobId, detail: String) {
        self.settle(
            id,
            JobOutcome {
                status: JobStatus::Failed,
                output: None,
                detail: Some(detail),
            },
        );
        // Aborted with the lock released: a task dropped in place settles through the lock.
        let abort = self.state.lock().jobs.get(id).map(|rec| rec.abort.clone());
        if let Some(abort) = abort {
            abort.abort();
        }
    }
}

fn normalize(outcome: JobOutcome) -> JobOutcome {
    if outcome.status.is_terminal() {
        outcome
    } else {
        tracing::warn!(status = %outcome.status, "job done resolved with a non-terminal status");
        JobOutcome {
            status: JobStatus::Failed,
            output: None,
            detail: Some(model_text::non_terminal_outcome(outcome.status)),
        }
    }
}

/// A capacity slot held while a starter runs. Dropped without [`commit`](Self::commit) (the
/// starter panicked), it releases the slot.
struct Reservation {
    inner: Arc<Inner>,
    owner: SessionId,
    live: bool,
}

impl Reservation {
    fn commit(
        mut self,
        kind: String,
        label: String,
        hooks: JobHooks,
        runtime: &tokio::runtime::Handle,
    ) -> JobId {
        let JobHooks { cancel, done } = hooks;
        let inner = self.inner.clone();
        let (id, dropped) = {
            let mut state = inner.state.lock();
            let n = state.counters.entry(kind.clone()).or_insert(0);
            *n += 1;
            let id = JobId(format!("{kind}-{n}"));
            let seq = state.next_seq;
            state.next_seq += 1;
            // A start that raced a teardown is torn down by it; nobody will read its notice.
            let torn_down = state.closed || state.owners.get(&self.owner).is_some_and(|o| o.disposing > 0);
            let weak: Weak<Inner> = Arc::downgrade(&inner);
            let task_id = id.clone();
            // Settles the job if the task's future is dropped before `done` resolved (polled
            // or not: the runtime running it shut down): nothing else would, and the record
            // would stay live forever.
            let arming = Arc::new(AtomicU8::new(UNARMED));
            let dropped = SettleOnDrop {
                inner: weak.clone(),
                id: task_id.clone(),
                arming: arming.clone(),
                disarmed: false,
            };
            let task = inner.tracker.spawn_on(
                async move {
                    let outcome = match AssertUnwindSafe(done).catch_unwind().await {
                        Ok(outcome) => outcome,
                        Err(payload) => {
                            let message = panic_message(&*payload);
                            tracing::warn!(job = %task_id, %message, "job done future panicked");
                            JobOutcome {
                                status: JobStatus::Failed,
                                output: None,
                                detail: Some(model_text::done_panicked(&message)),
                            }
                        }
                    };
                    dropped.disarm();
                    if let Some(inner) = weak.upgrade() {
                        inner.settle(&task_id, outcome);
                    }
                },
                runtime,
            );
            let abort = task.abort_handle();
            let finished = async move {
                let _ = task.await;
            }
            .boxed()
            .shared();
            state.jobs.insert(
                id.clone(),
                Record {
                    seq,
                    id: id.clone(),
                    kind,
                    label,
                    owner: self.owner.clone(),
                    status: JobStatus::Running,
                    detail: None,
                    output: None,
                    reported: torn_down,
                    claims: 0,
                    notice_held: false,
                    notice_sent: false,
                    waiters: 0,
                    teardown_cancelled: false,
                    cancel: Arc::from(cancel),
                    settled: CancellationToken::new(),
                    abort,
                    finished,
                },
            );
            state.release_reservation(&self.owner);
            // A task dropped before this point (a runtime that is shut down drops it inside
            // the spawn) left its settlement to us: the lock is held here.
            let dropped = arming
                .compare_exchange(UNARMED, ARMED, Ordering::SeqCst, Ordering::SeqCst)
                .is_err();
            (id, dropped)
        };
        if dropped {
            inner.settle(&id, task_dropped());
        }
        self.live = false;
        inner.bump_reservations();
        id
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.live {
            self.inner.state.lock().release_reservation(&self.owner);
            self.inner.bump_reservations();
        }
    }
}

/// [`SettleOnDrop::arming`] while the job's record is not registered yet.
const UNARMED: u8 = 0;
/// [`SettleOnDrop::arming`] once the record is registered: a drop settles it.
const ARMED: u8 = 1;
/// [`SettleOnDrop::arming`] after a drop before the record was registered: the registration
/// settles it.
const DROPPED: u8 = 2;

/// The outcome of a job whose task was dropped before `done` resolved.
fn task_dropped() -> JobOutcome {
    JobOutcome {
        status: JobStatus::Failed,
        output: None,
        detail: Some(model_text::TASK_DROPPED.to_owned()),
    }
}

/// Moved into a job's task with its `done` future: dropped with the task before `done`
/// resolved (the tokio runtime running it shut down, or an abort after a panicking `cancel`),
/// it settles the job `failed` (first-wins: a forced failure has settled it already).
struct SettleOnDrop {
    inner: Weak<Inner>,
    id: JobId,
    /// [`UNARMED`], [`ARMED`] or [`DROPPED`]: a drop while the starting thread still holds the
    /// state lock (inside the spawn) must not take it, so it leaves the settlement to that
    /// thread.
    arming: Arc<AtomicU8>,
    /// Set once `done` resolved: the task settles the job itself.
    disarmed: bool,
}

impl SettleOnDrop {
    fn disarm(mut self) {
        self.disarmed = true;
    }
}

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        if self.disarmed
            || self
                .arming
                .compare_exchange(UNARMED, DROPPED, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            return;
        }
        if let Some(inner) = self.inner.upgrade()
            && inner.settle(&self.id, task_dropped())
        {
            tracing::warn!(job = %self.id, "job task dropped before its done future resolved; job settled failed");
        }
    }
}

/// Reads `owner`'s job `id` under the lock: its output once settled (empty while live). With
/// `claim`, a terminal read marks the job reported ([`Record::claim`]).
fn read_locked(
    state: &mut State,
    owner: &SessionId,
    id: &JobId,
    claim: bool,
) -> Result<JobReadout, JobError> {
    let rec = state.owned_mut(owner, id)?;
    let terminal = rec.status.is_terminal();
    let claimed = terminal && claim && rec.claim();
    let output = if terminal {
        rec.output.clone().unwrap_or_default()
    } else {
        String::new()
    };
    Ok(JobReadout {
        snapshot: rec.snapshot(),
        output,
        claimed,
    })
}

/// One registered waiter of a job. Released explicitly under the lock by the wait that
/// registered it ([`release`](Self::release)), or — when that wait's future is dropped — on
/// drop, which abandons its claim on the report.
struct WaiterGuard<'a> {
    inner: &'a Inner,
    id: &'a JobId,
    armed: bool,
}

impl WaiterGuard<'_> {
    /// Unregisters the waiter under `state`. `delivered` (the job is settled and its output goes
    /// to a caller whose signal has not fired) claims the report (the returned flag says
    /// whether that claim may be given back, see [`Record::claim`]); otherwise the waiter
    /// abandons its claim, and the last waiter to abandon a held notice returns it for the
    /// caller to emit once the lock is released.
    fn release(mut self, state: &mut State, delivered: bool) -> (bool, Option<JobNotice>) {
        self.armed = false;
        release_waiter(state, self.id, delivered)
    }
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (_, notice) = release_waiter(&mut self.inner.state.lock(), self.id, false);
        if let Some(notice) = notice {
            self.inner.notices.emit(&notice);
        }
    }
}

/// See [`WaiterGuard::release`].
fn release_waiter(state: &mut State, id: &JobId, delivered: bool) -> (bool, Option<JobNotice>) {
    state.waiters = state.waiters.saturating_sub(1);
    let closed = state.closed;
    let Some(rec) = state.jobs.get_mut(id) else {
        return (false, None);
    };
    rec.waiters = rec.waiters.saturating_sub(1);
    if delivered {
        let claimed = rec.claim();
        rec.notice_held = false;
        return (claimed, None);
    }
    let last_abandons_held = rec.waiters == 0 && std::mem::take(&mut rec.notice_held);
    let notice = if last_abandons_held && !rec.reported {
        rec.notice(closed)
    } else {
        None
    };
    (false, notice)
}

/// Lifts one owner's disposal fence, on every exit of the disposal.
struct DisposingGuard<'a> {
    inner: &'a Inner,
    owner: &'a SessionId,
}

impl Drop for DisposingGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock();
        if let Some(o) = state.owners.get_mut(self.owner) {
            o.disposing = o.disposing.saturating_sub(1);
            if o.is_idle() {
                state.owners.remove(self.owner);
            }
        }
    }
}

impl Drop for JobRegistry {
    fn drop(&mut self) {
        let cancels: Vec<(JobId, CancelHook)> = {
            let mut state = self.inner.state.lock();
            if std::mem::replace(&mut state.closed, true) {
                return;
            }
            state
                .jobs
                .values_mut()
                .filter(|r| r.is_active() && !r.teardown_cancelled)
                .map(|r| {
                    r.reported = true;
                    r.teardown_cancelled = true;
                    (r.id.clone(), r.cancel.clone())
                })
                .collect()
        };
        if cancels.is_empty() {
            return;
        }
        tracing::warn!(
            jobs = cancels.len(),
            "job registry dropped without shutdown; cancelling live jobs without awaiting them"
        );
        for (id, cancel) in cancels {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| {
                cancel(Some(model_text::SHUTDOWN_REASON.to_owned()))
            })) {
                tracing::warn!(job = %id, message = %panic_message(&*payload), "job cancel panicked during drop");
            }
        }
    }
}

#[async_trait]
impl Jobs for JobRegistry {
    fn start(&self, spec: JobSpec) -> Result<JobId, JobError> {
        self.start_job(spec)
    }

    fn list(&self, owner: &SessionId) -> Vec<JobInfo> {
        self.snapshots(owner).iter().map(JobSnapshot::info).collect()
    }

    fn kill(&self, owner: &SessionId, id: &JobId, reason: Option<String>) -> Result<(), JobError> {
        self.kill_job(owner, id, reason).map(|_| ())
    }

    async fn read(
        &self,
        owner: &SessionId,
        id: &JobId,
        wait: bool,
        signal: &Signal,
    ) -> Result<JobRead, JobError> {
        let read = if wait {
            self.wait_and_read(owner, id, None, signal).await?
        } else {
            self.read_job_unless_cancelled(owner, id, signal)?
        };
        let status = read.snapshot.status;
        Ok(JobRead {
            status,
            outcome: status.is_terminal().then(|| JobOutcome {
                status,
                output: Some(read.output).filter(|o| !o.is_empty()),
                detail: read.snapshot.detail,
            }),
        })
    }

    async fn dispose_owner(&self, owner: &SessionId) {
        self.dispose_owner_jobs(owner).await;
    }
}
