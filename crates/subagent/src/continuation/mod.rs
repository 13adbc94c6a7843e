//! The continuation manager: continuable children (spec §2.14) — first slice.
//!
//! A continuable child is one durable session plus at most one process-local
//! *Activation* (a residency epoch). This slice implements:
//!
//! * [`ContinuationManager::start_continuable`] (§2.14.2): validation, the provider's continuable
//!   preparation, creation through `services.agents.create` with the continuable descriptor, the
//!   delegated policy and the child composition applied in the unpublished setup window, the
//!   start edge once resident, and the first prompt delivered as a `followup`;
//! * [`ContinuationManager::followup`] (§2.14.5), authorized by the exact live durable direct
//!   parent: enqueued on a resident child, or delivered after a **cold resume** (the persisted
//!   header authorizes, the descriptor from the child's own suffix supplies provider, route and
//!   composition; `agents.resume` re-materializes; the submission re-authorizes);
//! * the settlement watcher and the disposal transaction (§2.14.6), the epoch stop reason and
//!   output (§2.14.7), the settlement notice (§2.14.8) and the end edge;
//! * [`ContinuationManager::dispose_all`]: a manager-wide drain that disposes every child and
//!   awaits quiescence;
//! * [`ContinuationManager::interrupt`] (§2.14.9): `user` and `ancestor` authority, one
//!   `keep_inbox` cancel of the current turn;
//! * [`ContinuationManager::report_from`] (§2.14.10): next-step or quiet delivery to the durable
//!   direct parent;
//! * [`ContinuationManager::drain_continuable_children`] and
//!   [`ContinuationManager::drain_continuable_descendants`] (§2.14.11): the selected teardown,
//!   and the scoped drain with the lineage-based admission it closes.
//!
//! * [`ContinuationManager::register_continuable_setup`] (§2.14.12): setup contributions
//!   installed into every fresh or cold-resumed child's unpublished scope, after its base
//!   composition, with a commit that refuses a child whose installation was revoked meanwhile;
//!   [`ContinuationManager::register_continuable_setup_keyed`] registers one under a key and
//!   refuses a second live one (`SETUP_ALREADY_REGISTERED`).
//!
//! Drains wait for in-flight materializations in their scope (spec §2.14.4 step 1). Listing
//! (§2.18) lives in [`crate::listing`].
//!
//! # Locks
//! * `Inner::activations` (sync) — the live map `child id → Activation`; held only for lookups
//!   and inserts/removals, never across an `.await`.
//! * `Inner::locks` (sync) — the per-child async locks by child id; an entry lives exactly as
//!   long as some `ChildLock` holds it.
//! * `Inner::closing` (sync) — the roots closed by scoped drains; held while their liveness and
//!   an agent's lineage are read from the registry, never across an `.await`.
//! * the per-child `tokio::sync::Mutex<()>` — serializes the residency decisions of one child
//!   (materialize-and-submit, follow-up routing, the watcher's settle decision); it is an async
//!   lock by design and may be held across the creation's `.await`.
//! * `Inner::admission` (sync, reentrant) — makes a submission's admission span (the checks
//!   through the inbox insertion) and the synchronous opening of a disposal transaction (its
//!   cancel) mutually atomic across threads, as both are one synchronous span in the spec: a
//!   follow-up admitted before a drain's cancel is inserted before it (CONT-45), and one that
//!   is not sees the closed admission (`DRAINING`). A materialization's whole residency
//!   (admission checks, ownership registration under a resident parent, ancestry, epoch, start
//!   edge) is one such span too (a parent's disposal either refuses the child or finds it
//!   owned), and so is a scoped drain's synchronous part (closing its roots, selecting its
//!   targets, collecting the in-flight materializations): the drain either selects a child
//!   made resident before it or refuses one that comes after, whose in-flight record it then
//!   waits for. A settlement notice's delivery (its scheduling decision — closing parent or
//!   not, wake or not — through its send) is one such span as well: a drain on another thread
//!   never opens the parent's teardown between the decision and the send. So is a report
//!   (its checks through its send, §2.14.10), and an interrupt (its disposal check through its
//!   cancel, §2.14.9: a teardown opened on another thread is either after its cancel or seen
//!   by it). Reentrant, because an insertion observer may itself drain; never held across an
//!   `.await`. Taken before any lock above.
//! * `Activation` fields (sync) — each protects only its own small set.

mod activation;
mod drain;
mod interrupt;
mod notice;
mod report;
mod resume;
mod setup;

pub use setup::{ContinuableSetupRegistration, ContinuableSetupRemover, SetupContribution, SetupRelease};

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agent::runtime::Setup;
use agent::{
    AgentError, AgentRef, AgentStatus, ContentBlock, CreateAgentOptions, Ctx, EventData, Message, MessageId,
    MessageSource, ScopeInactive, Services, SessionEvent, SessionId, Signal,
};
use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde_json::Value;
use tokio_util::task::TaskTracker;

use crate::capabilities::ContinuableCreateRequest;
use crate::compose::apply_child_composition;
use crate::composition::{ChildComposition, ToolFilter, child_session_meta, resolve_child_agent_options};
use crate::depth::{assert_subagent_max_depth, resolve_child_depth_of};
use crate::descriptor::{ContinuableDescriptor, SubagentDescriptor, snapshot_subagent_descriptor};
use crate::error::{SubagentError, SubagentErrorCode};
use crate::events::{SubagentEvent, SubagentRunInfo};
use crate::policy::{
    DelegatedPolicyOverrides, PolicyServices, append_delegated_policy_overrides,
    capture_delegated_policy_overrides,
};
use crate::result::StopReason;
use crate::service::SubagentService;

use activation::Activation;
pub use interrupt::InterruptAuthority;
pub use report::ReportDelivery;

#[cfg(test)]
mod tests;

/// What a caller asks of [`ContinuationManager::start_continuable`] (spec §2.14.2
/// `ContinuableStartSpec`): the one-shot request's fields without `label`, `signal` and
/// `outputSchema`, plus the provider, the creation label, an optional reserved id and the
/// caller's token.
#[derive(Clone)]
pub struct ContinuableStartSpec {
    /// The provider whose continuable preparation establishes the child.
    pub provider: String,
    /// The creation label, persisted in the descriptor.
    pub label: String,
    /// A caller-reserved child id; `None` mints a UUID.
    pub child_id: Option<SessionId>,
    /// The first prompt.
    pub prompt: Vec<ContentBlock>,
    /// The delegating agent.
    pub parent: AgentRef,
    /// Per-child route overrides.
    pub agent_options: Option<agent::AgentOptions>,
    /// Absolute cap on the child's depth, as untrusted JSON.
    pub max_depth: Option<Value>,
    /// Tool visibility filter, recorded in the descriptor.
    pub tool_filter: Option<ToolFilter>,
    /// Per-child persona, recorded in the descriptor.
    pub persona: Option<String>,
    /// The caller's token: owns lookup, materialization and admission until inbox acceptance.
    pub signal: Signal,
}

impl std::fmt::Debug for ContinuableStartSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContinuableStartSpec")
            .field("provider", &self.provider)
            .field("label", &self.label)
            .field("child_id", &self.child_id)
            .field("parent", self.parent.id())
            .finish_non_exhaustive()
    }
}

impl ContinuableStartSpec {
    /// A spec with only the required fields and a fresh token.
    pub fn new(
        provider: impl Into<String>,
        label: impl Into<String>,
        prompt: Vec<ContentBlock>,
        parent: AgentRef,
    ) -> Self {
        Self {
            provider: provider.into(),
            label: label.into(),
            child_id: None,
            prompt,
            parent,
            agent_options: None,
            max_depth: None,
            tool_filter: None,
            persona: None,
            signal: Signal::new(),
        }
    }
}

pub(crate) struct Inner {
    service: SubagentService,
    services: Services,
    policy: PolicyServices,
    /// The live map of resident Activations.
    activations: Mutex<HashMap<SessionId, Arc<Activation>>>,
    /// Per-child locks, each removed when its last [`ChildLock`] holder drops.
    locks: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
    /// Permanent manager-wide drain flag.
    draining: AtomicBool,
    /// Roots closed by scoped drains.
    closing: Mutex<Vec<drain::ClosingRoot>>,
    /// In-flight materializations (creation or resume until installed or rolled back).
    materializing: Mutex<Vec<drain::Materializing>>,
    /// Watchers and other background work.
    tasks: TaskTracker,
    /// Serializes submission spans with the opening of disposal transactions (see the module's
    /// lock list).
    admission: parking_lot::ReentrantMutex<()>,
    /// Setup contributions (§2.14.12), installed into every child this manager materializes.
    setup: Arc<setup::SetupRegistry>,
    /// The parents of settling children between their removal from the live map and the end of
    /// their notice's delivery (§2.14.6 steps 8–9), once per such child; see
    /// [`ContinuationManager::notices_under_way`].
    notices: Mutex<Vec<SessionId>>,
    /// Bumped for [`ContinuationManager::changes`].
    changes: tokio::sync::watch::Sender<u64>,
    /// Deterministic interleaving points for the tests.
    #[cfg(test)]
    hooks: TestHooks,
}

/// Deterministic interleaving points for the tests: each, when installed, is awaited at its
/// point of the manager's transactions.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct TestHooks {
    /// Awaited by a disposal transaction or a rollback after its removal from the live map (and
    /// the notice, if any) and before its ownership release, with the Activation released.
    pub(crate) before_release: Mutex<Option<TestHook>>,
    /// Called (synchronously) by a scoped drain right before its synchronous span takes the
    /// admission lock, with whether another thread holds that lock now (the span then waits
    /// for it).
    pub(crate) drain_span: Mutex<Option<SpanHook>>,
    /// Called (synchronously) by a scoped drain after it selected a root's targets, before it
    /// closes that root's admission — inside the drain's synchronous span.
    pub(crate) drain_selected: Mutex<Option<PointHook>>,
    /// Called (synchronously) by a materialization right before its residency span (spec
    /// §2.14.4 step 4) takes the admission lock, with the Activation being installed and whether
    /// another thread holds that lock now (the span then waits for it).
    pub(crate) residency: Mutex<Option<ResidencyHook>>,
    /// Called (synchronously) by a materialization's residency once its admission checks
    /// passed and its ownership is registered, before its ancestry is recorded — inside the
    /// residency's span.
    pub(crate) admitted: Mutex<Option<AdmittedHook>>,
    /// Called (synchronously) by a settlement notice's delivery once it decided how to schedule
    /// the notice (closing parent or not, and so whether to wake it), before its send — inside
    /// the delivery's admission span.
    pub(crate) notice_scheduled: Mutex<Option<PointHook>>,
    /// Called (synchronously) by a report once its checks passed and it decided how to deliver
    /// the report (closing parent or not, and so whether to wake it), before its send — inside
    /// the report's admission span.
    pub(crate) report_scheduled: Mutex<Option<PointHook>>,
    /// Called (synchronously) by an interrupt once it found its target resident, authorized and
    /// with no disposal open, before its cancel — inside the interrupt's admission span.
    pub(crate) interrupt_checked: Mutex<Option<PointHook>>,
}

/// A test hook: the future to await at its point, made from the Activation concerned.
#[cfg(test)]
pub(crate) type TestHook = Arc<dyn Fn(&Arc<Activation>) -> BoxFuture<'static, ()> + Send + Sync>;

/// A synchronous test hook told whether another thread holds the admission lock it is about to
/// take.
#[cfg(test)]
pub(crate) type SpanHook = Arc<dyn Fn(bool) + Send + Sync>;

/// A synchronous test hook at a point of a synchronous span.
#[cfg(test)]
pub(crate) type PointHook = Arc<dyn Fn() + Send + Sync>;

/// A synchronous test hook before a residency's span: the Activation being installed, and
/// whether another thread holds the admission lock it is about to take.
#[cfg(test)]
pub(crate) type ResidencyHook = Arc<dyn Fn(&Arc<Activation>, bool) + Send + Sync>;

/// A synchronous test hook inside a residency's span, with the Activation being installed.
#[cfg(test)]
pub(crate) type AdmittedHook = Arc<dyn Fn(&Arc<Activation>) + Send + Sync>;

#[cfg(test)]
impl TestHooks {
    async fn before_release(&self, activation: &Arc<Activation>) {
        let hook = self.before_release.lock().clone();
        if let Some(hook) = hook {
            hook(activation).await;
        }
    }

    fn drain_span(&self, admission: &parking_lot::ReentrantMutex<()>) {
        let hook = self.drain_span.lock().clone();
        if let Some(hook) = hook {
            hook(admission.is_locked() && !admission.is_owned_by_current_thread());
        }
    }

    fn admitted(&self, activation: &Arc<Activation>) {
        let hook = self.admitted.lock().clone();
        if let Some(hook) = hook {
            hook(activation);
        }
    }

    fn drain_selected(&self) {
        let hook = self.drain_selected.lock().clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    fn notice_scheduled(&self) {
        let hook = self.notice_scheduled.lock().clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    fn report_scheduled(&self) {
        let hook = self.report_scheduled.lock().clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    fn interrupt_checked(&self) {
        let hook = self.interrupt_checked.lock().clone();
        if let Some(hook) = hook {
            hook();
        }
    }

    fn residency(&self, activation: &Arc<Activation>, admission: &parking_lot::ReentrantMutex<()>) {
        let hook = self.residency.lock().clone();
        if let Some(hook) = hook {
            hook(
                activation,
                admission.is_locked() && !admission.is_owned_by_current_thread(),
            );
        }
    }
}

/// Marks a settlement notice as under way toward `parent` until dropped (the delivery ended,
/// or unwound).
struct NoticeUnderWay<'a> {
    notices: &'a Mutex<Vec<SessionId>>,
    /// Signalled once the entry is gone ([`ContinuationManager::changes`]).
    changes: &'a tokio::sync::watch::Sender<u64>,
    parent: SessionId,
}

impl<'a> NoticeUnderWay<'a> {
    fn new(
        notices: &'a Mutex<Vec<SessionId>>,
        changes: &'a tokio::sync::watch::Sender<u64>,
        parent: &SessionId,
    ) -> Self {
        notices.lock().push(parent.clone());
        Self {
            notices,
            changes,
            parent: parent.clone(),
        }
    }
}

impl Drop for NoticeUnderWay<'_> {
    fn drop(&mut self) {
        {
            let mut notices = self.notices.lock();
            if let Some(i) = notices.iter().position(|p| *p == self.parent) {
                notices.swap_remove(i);
            }
        }
        bump(self.changes);
    }
}

/// Signals [`ContinuationManager::changes`].
fn bump(changes: &tokio::sync::watch::Sender<u64>) {
    changes.send_modify(|v| *v = v.wrapping_add(1));
}

/// The continuation manager (spec §2.14). Cheap to clone (shared).
///
/// # Ownership, drop and cancellation
/// * The manager owns every Activation's handle; callers receive only ids.
/// * Each Activation has one tracked watcher task; [`dispose_all`](Self::dispose_all) disposes
///   every Activation and waits for the tasks. Dropping the manager without `dispose_all`
///   leaves resident children to their watchers (which keep the manager's state alive).
/// * Durable child sessions survive every teardown.
#[derive(Clone)]
pub struct ContinuationManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ContinuationManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContinuationManager")
            .field("resident", &self.resident())
            .field("draining", &self.inner.draining.load(Ordering::SeqCst))
            .finish()
    }
}

impl ContinuationManager {
    /// A manager over `service`'s providers and lifecycle bus, creating children through
    /// `services.agents`, with no policy services composed.
    pub fn new(service: SubagentService, services: Services) -> Self {
        Self::with_policy(service, services, PolicyServices::default())
    }

    /// A manager for a host that composes the policy services `policy`.
    pub fn with_policy(service: SubagentService, services: Services, policy: PolicyServices) -> Self {
        Self {
            inner: Arc::new(Inner {
                service,
                services,
                policy,
                activations: Mutex::new(HashMap::new()),
                locks: Mutex::new(HashMap::new()),
                draining: AtomicBool::new(false),
                closing: Mutex::new(Vec::new()),
                materializing: Mutex::new(Vec::new()),
                tasks: TaskTracker::new(),
                admission: parking_lot::ReentrantMutex::new(()),
                setup: Arc::default(),
                notices: Mutex::new(Vec::new()),
                changes: tokio::sync::watch::Sender::new(0),
                #[cfg(test)]
                hooks: TestHooks::default(),
            }),
        }
    }

    /// Registers a setup contribution (spec §2.14.12): from now on every fresh creation and every
    /// cold resume installs it into the child's unpublished scope, after the child's base
    /// composition and after every contribution registered before it. Resident children are not
    /// retrofitted.
    ///
    /// The returned registration owns the contribution: [`remove`](ContinuableSetupRegistration::remove)
    /// (or dropping it) closes it to new installations and releases every installation it has,
    /// in resident children and in children still being set up (whose start or resume then
    /// fails with `ACTIVATION_SETUP_REVOKED`). A child's disposal releases that child's
    /// installations only. Each installation is released exactly once, whichever comes first.
    pub fn register_continuable_setup(
        &self,
        contribution: SetupContribution,
    ) -> ContinuableSetupRegistration {
        self.inner.setup.register(contribution)
    }

    /// Registers a setup contribution under `key`, refusing a second live registration under the
    /// same key: for a package that must install its capability into each child at most once
    /// (two copies would both install, and the second would fail every child's setup).
    ///
    /// Behaves as [`register_continuable_setup`](Self::register_continuable_setup) once
    /// registered. The refusal is decided at registration, atomically with it: while a
    /// contribution registered under `key` on this manager is live (neither
    /// [removed](ContinuableSetupRegistration::remove) nor dropped), the call fails with
    /// `SETUP_ALREADY_REGISTERED` naming the key and changes nothing — the live contribution
    /// keeps installing as before. Once it is removed, the key can be registered again.
    /// Unkeyed registrations neither hold nor check any key.
    ///
    /// # Errors
    /// `SETUP_ALREADY_REGISTERED` ([`SubagentError::setup_already_registered`]) while `key` is
    /// held by a live contribution.
    pub fn register_continuable_setup_keyed(
        &self,
        key: &'static str,
        contribution: SetupContribution,
    ) -> Result<ContinuableSetupRegistration, SubagentError> {
        self.inner.setup.register_keyed(key, contribution)
    }

    /// The ids of the resident children, in no particular order.
    pub fn resident(&self) -> Vec<SessionId> {
        self.inner.activations.lock().keys().cloned().collect()
    }

    /// The parents that a settlement notice is on its way to: one entry (repeated per child)
    /// for each settling child that has already left the live map — so it is no longer in
    /// [`resident`](Self::resident) — but whose notice has not yet entered the parent's inbox
    /// (spec §2.14.6 steps 8–9). Once the notice is in, the parent is running (or holds the
    /// notice for its next step), and the entry is gone.
    ///
    /// A host waiting for a tree to go quiet checks this besides the resident children:
    /// otherwise it can see the parent idle with no resident child in this window and stop
    /// waiting just before the notice starts the parent's next turn.
    pub fn notices_under_way(&self) -> Vec<SessionId> {
        self.inner.notices.lock().clone()
    }

    /// A change counter for a host waiting, without polling, until a tree's continuable
    /// descendants are quiet (see [`resident`](Self::resident),
    /// [`notices_under_way`](Self::notices_under_way) and [`awaits_input`](Self::awaits_input)):
    /// its value is bumped once a settlement notice is no longer under way and after every
    /// ownership release (which follows every removal from the live map), and possibly after
    /// other changes; the value itself means nothing. The rest of what those reads depend on —
    /// the children's agent statuses and inboxes, agents leaving the registry — is signalled on
    /// the runtime's agent event bus, not here.
    ///
    /// To wait without a lost wake-up, take (or
    /// [`borrow_and_update`](tokio::sync::watch::Receiver::borrow_and_update)) the receiver
    /// first, then check, then await [`changed`](tokio::sync::watch::Receiver::changed). A
    /// receiver registers nothing: dropping it is all the cleanup there is. `changed` fails only
    /// once the manager's shared state is dropped.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Whether `child_id` has a resident Activation.
    pub fn is_resident(&self, child_id: &SessionId) -> bool {
        self.inner.activations.lock().contains_key(child_id)
    }

    /// Whether the resident child `child_id` can make no progress without new input: its
    /// disposal has not begun, its agent is idle, and what keeps it resident is only waking work
    /// parked by an interrupt (accepted but unclaimed, spec §2.14.9: it runs after a later
    /// waking send) and/or owned children that are all resident and await input themselves
    /// (checked recursively). Such a child stays resident, announcing nothing, until a waking
    /// send (a follow-up, a report, a notice) or a drain.
    ///
    /// `false` for a child that is not resident, is running, is being disposed (its settlement
    /// notice is under way), is settled but not yet released (idle with nothing accepted and no
    /// owned child: its watcher is about to open the disposal that announces it), or owns a
    /// child in flight (materializing, or released from the live map but not yet disowned: its
    /// notice is on its way). A host uses it to stop waiting for children that cannot settle
    /// on their own while still waiting for every one that can.
    ///
    /// Read under the admission lock, so a submission's acceptance and its wake are never seen
    /// apart (an accepted message with the child still idle).
    pub fn awaits_input(&self, child_id: &SessionId) -> bool {
        let inner = &self.inner;
        let _admission = inner.admission.lock();
        let mut pending = vec![child_id.clone()];
        let mut seen = std::collections::HashSet::new();
        while let Some(id) = pending.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            let Some(activation) = inner.activations.lock().get(&id).cloned() else {
                return false;
            };
            if activation.disposal().is_some() {
                return false;
            }
            // The status is host code: a panicking one says nothing, so the child is not
            // judged stuck.
            let idle = host_call("the child agent's status", || activation.agent.status())
                .is_ok_and(|status| status == AgentStatus::Idle);
            if !idle {
                return false;
            }
            let owned = activation.owned_children();
            if !activation.has_accepted() && owned.is_empty() {
                return false;
            }
            pending.extend(owned);
        }
        true
    }

    /// Starts a continuable child and resolves at the first prompt's inbox acceptance with
    /// `(child id, message id)` (spec §2.14.2).
    ///
    /// Steps 1–5 — admission, the persistence and `maxDepth` checks, the child id, depth, the
    /// descriptor snapshot and the **delegated-policy capture** — run synchronously, when this
    /// is called, before the returned future is first polled (as in the one-shot driver's
    /// `start`): a parent policy switch after the call does not reach the child, and a failure
    /// there is already decided when the future is created. The future does the rest.
    ///
    /// Any failure rejects with no ids and leaves no Activation, no live child and no ownership
    /// entry. After acceptance the manager owns the child: cancelling `spec.signal` no longer
    /// affects it.
    pub fn start_continuable(
        &self,
        spec: ContinuableStartSpec,
    ) -> impl Future<Output = Result<(SessionId, MessageId), SubagentError>> + Send + 'static {
        let admitted = self.inner.admit_start(&spec);
        let inner = self.inner.clone();
        async move { inner.finish_start(spec, admitted?).await }
    }
}

/// What the synchronous part of a continuable start (steps 1–5) decided.
struct AdmittedStart {
    reserved: bool,
    child_id: SessionId,
    parent: AgentRef,
    child_depth: u64,
    descriptor_event: EventData,
    policy: DelegatedPolicyOverrides,
}

impl Inner {
    /// Steps 1–5 of a continuable start, synchronous.
    fn admit_start(&self, spec: &ContinuableStartSpec) -> Result<AdmittedStart, SubagentError> {
        let inner = self;
        // 1. Admission, persistence, maxDepth.
        inner.admit(&spec.parent)?;
        inner.check_parent_open(&spec.parent)?;
        if inner.services.persistence.is_none() {
            return Err(SubagentError::persistence_unavailable());
        }
        let max_depth = assert_subagent_max_depth(spec.max_depth.as_ref()).map_err(depth_failure)?;
        // 2. The child id.
        let reserved = spec.child_id.is_some();
        let child_id = spec
            .child_id
            .clone()
            .unwrap_or_else(|| SessionId::new(uuid::Uuid::new_v4().to_string()));
        inner.check_available(&child_id)?;
        // 3. Depth.
        let parent = spec.parent.clone();
        let child_depth = resolve_child_depth_of(parent.as_ref(), max_depth).map_err(depth_failure)?;
        // 4. The descriptor snapshot.
        let requested = spec.agent_options.as_ref();
        let descriptor = SubagentDescriptor::Continuable(ContinuableDescriptor {
            provider: spec.provider.clone(),
            label: spec.label.clone(),
            agent_provider: requested
                .and_then(|o| o.provider.as_deref())
                .or(parent.options().provider.as_deref())
                .map(str::to_owned),
            agent_model: requested
                .and_then(|o| o.model.as_deref())
                .or(parent.options().model.as_deref())
                .map(str::to_owned),
            persona: spec.persona.clone(),
            tool_filter: spec.tool_filter.clone(),
        });
        let descriptor_event = snapshot_subagent_descriptor(&descriptor).map_err(|e| {
            SubagentError::new(SubagentErrorCode::ProviderFailed, e.to_string()).with_source(e)
        })?;
        // 5. Delegated policy, before the first suspension point.
        let policy = capture_delegated_policy_overrides(parent.session(), inner.policy);
        Ok(AdmittedStart {
            reserved,
            child_id,
            parent,
            child_depth,
            descriptor_event,
            policy,
        })
    }

    /// Steps 6–11 of a continuable start.
    async fn finish_start(
        self: Arc<Self>,
        spec: ContinuableStartSpec,
        admitted: AdmittedStart,
    ) -> Result<(SessionId, MessageId), SubagentError> {
        let inner = &self;
        let AdmittedStart {
            reserved,
            child_id,
            parent,
            child_depth,
            descriptor_event,
            policy,
        } = admitted;
        let requested = spec.agent_options.as_ref();
        // 6. The provider's preparation.
        let provider = inner
            .service
            .get_provider(&spec.provider)
            .ok_or_else(|| SubagentError::no_provider(&spec.provider))?;
        let prepared = {
            // Provider code is third-party: a panic in it is the provider's failure
            // (`PROVIDER_FAILED`), not the caller's, and nothing was created yet.
            let panicked = |during: &str, payload: Box<dyn std::any::Any + Send>| {
                SubagentError::provider_panicked(
                    Some(&spec.provider),
                    during,
                    &agent::bus::panic_message(&*payload),
                )
            };
            let prepare = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| provider.continuable()))
                .map_err(|payload| panicked("continuable()", payload))?;
            let Some(prepare) = prepare else {
                return Err(SubagentError::continuable_unsupported(&spec.provider));
            };
            let request = ContinuableCreateRequest {
                session_id: child_id.clone(),
                parent: parent.clone(),
                signal: spec.signal.clone(),
            };
            let preparing = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                prepare.prepare_continuable(request)
            }))
            .map_err(|payload| panicked("prepare_continuable", payload))?;
            std::panic::AssertUnwindSafe(preparing)
                .catch_unwind()
                .await
                .map_err(|payload| panicked("prepare_continuable", payload))??
        };
        // 7. Throw-if-aborted; admission.
        check_signal(&spec.signal)?;
        inner.admit(&parent)?;
        inner.check_parent_open(&parent)?;
        // 8. The seed and its length (the provider's prefix only). A seed the child's first turn
        // could not continue (an open turn or step, a turn closed over an open step) is the
        // provider's failure: created, the child would run on a log that breaks the session
        // invariants (spine §4.7 item 5).
        let seed = prepared.seed.filter(|s| !s.is_empty());
        if seed.as_ref().is_some_and(|s| !agent::prefix::is_balanced(s)) {
            return Err(SubagentError::unbalanced_seed(&spec.provider));
        }
        let seed_length = seed.as_ref().map_or(0, Vec::len) as u64;
        // 9. Under the child lock: re-check everything.
        let lock = inner.child_lock(&child_id);
        // The lock may be held by another operation on this id waiting on outside work (a
        // store's read, a runtime's resume): the wait is raced with the signal.
        let _guard = resume::until_cancelled(&spec.signal, lock.lock()).await?;
        if let Err(e) = inner.reserve(&parent, &child_id, reserved, &spec.signal).await {
            drop(_guard);
            return Err(e);
        }
        // 10. Materialize: register the in-flight record, then re-check admission — in that
        // order, so a drain starting meanwhile either finds the record (and waits for it) or is
        // found by the check: never neither.
        let materializing = inner.begin_materialization(&parent);
        if let Err(e) = check_signal(&spec.signal).and_then(|()| inner.admit(&parent)) {
            drop(materializing);
            drop(_guard);
            return Err(e);
        }
        let create = CreateAgentOptions {
            session_id: child_id.clone(),
            meta: child_session_meta(parent.session().header(), child_depth, seed_length),
            seed,
            agent_options: resolve_child_agent_options(parent.options(), requested, child_depth),
            signal: Some(spec.signal.clone()),
            setup: Some(setup(
                inner.setup.clone(),
                descriptor_event,
                policy,
                ChildComposition {
                    persona: spec.persona.clone(),
                    tool_filter: spec.tool_filter.clone(),
                },
            )),
            owner: None,
        };
        // A seam error raised in the setup window (a contribution's, or its commit's
        // `ACTIVATION_SETUP_REVOKED`) propagates unchanged; any other failure is the provider's.
        let handle = runtime_call(|| inner.services.agents.create(create))
            .await
            .map_err(|e| resume::seam_error_within(e).unwrap_or_else(agent_failure));
        let handle = match handle {
            Ok(handle) => handle,
            Err(e) => {
                drop(_guard);
                return Err(e);
            }
        };
        let activation = Activation::new(
            child_id.clone(),
            parent.id().clone(),
            spec.provider.clone(),
            handle,
        );
        inner
            .activations
            .lock()
            .insert(child_id.clone(), activation.clone());
        // Residency: under a guard that rolls back on failure.
        if let Err(e) = inner.make_resident(&activation, &parent, &spec.signal) {
            inner.rollback(activation, materializing).await;
            drop(_guard);
            return Err(e);
        }
        drop(materializing);
        inner.spawn_watcher(&activation, lock.clone());
        // 11. Submit the first prompt.
        match inner.submit(
            &activation,
            &parent,
            spec.prompt,
            MessageSource::User,
            &spec.signal,
        ) {
            Ok(id) => Ok((child_id, id)),
            Err(e) => {
                let disposal = inner.open_disposal(&activation);
                drop(_guard);
                let _ = disposal.await;
                Err(e)
            }
        }
    }
}

impl ContinuationManager {
    /// Delivers `content` to the continuable child `child_id` as one `followup` (next-turn) turn,
    /// with the source `{kind: "user"}` (see [`followup_with`](Self::followup_with)).
    pub async fn followup(
        &self,
        parent: &AgentRef,
        child_id: &SessionId,
        content: Vec<ContentBlock>,
    ) -> Result<MessageId, SubagentError> {
        self.followup_with(parent, child_id, content, MessageSource::User, &Signal::new())
            .await
    }

    /// Delivers `content` to the continuable child `child_id` (spec §2.14.5) with `source` (which
    /// grants no authority) and resolves at inbox acceptance with the message id.
    ///
    /// Authority: `parent` must be the exact live registry entry (`UNAUTHORIZED`, "delivery
    /// requires the exact live parent agent") and the child's durable direct parent
    /// (`UNAUTHORIZED`, "belongs to another parent session"). A child with no Activation is
    /// cold-resumed first (`PERSISTENCE_UNAVAILABLE` without persistence; `NOT_RESUMABLE` for an
    /// unknown id, a persisted session that names another id, a child with no supported
    /// continuable descriptor, or a failed re-materialization — except that a [`SubagentError`]
    /// the runtime's resume raised, directly or from the setup window, propagates unchanged); a
    /// child whose disposal is under way is waited for, then routed again — unless that
    /// teardown ended without releasing the child's Activation (`ACTIVATION_TEARDOWN_FAILED`,
    /// with the teardown's failure as its source), which routing again would only find again.
    /// That wait observes `signal`: cancelled meanwhile, the follow-up rejects `CANCELLED` at
    /// once (the disposal itself goes on to completion in the background).
    ///
    /// A submission refused after a cold resume releases the fresh epoch (which admitted
    /// nothing) through its disposal, and rejects once that disposal settled, so that no epoch
    /// is left when the error is seen — unless `signal` is cancelled (before or during that
    /// wait): then the follow-up rejects `CANCELLED` at once, and the epoch's disposal completes
    /// in the background (the manager's drains still wait for it).
    ///
    /// Host code that panics on the way — the store's reads or the runtime's resume during a
    /// cold resume (`NOT_RESUMABLE`), the child's inbox send (`PROVIDER_FAILED`, like a send
    /// that threw) — fails the follow-up with a typed error and never unwinds into the caller.
    pub async fn followup_with(
        &self,
        parent: &AgentRef,
        child_id: &SessionId,
        content: Vec<ContentBlock>,
        source: MessageSource,
        signal: &Signal,
    ) -> Result<MessageId, SubagentError> {
        let inner = &self.inner;
        inner.admit(parent)?;
        loop {
            let lock = inner.child_lock(child_id);
            // Raced with the signal: the lock may be held by another operation on this child
            // waiting on outside work (a cold resume's store read or runtime resume).
            let guard = resume::until_cancelled(signal, lock.lock()).await?;
            let activation = inner.activations.lock().get(child_id).cloned();
            let activation = match activation {
                Some(activation) => activation,
                None => match inner.cold_resume(parent, child_id, &lock, signal).await {
                    Ok(activation) => activation,
                    Err(e) => {
                        drop(guard);
                        return Err(e);
                    }
                },
            };
            if let Some(disposal) = activation.disposal() {
                drop(guard);
                // Raced with the signal: the teardown awaits host code (the child's idle, the
                // store's flush, the handle's disposal), which may take long or never end. A
                // cancelled follow-up rejects at once; only its wait is dropped — the disposal
                // runs on as its tracked task (spec §2.14.6).
                let outcome = resume::until_cancelled(signal, disposal).await?;
                check_signal(signal)?;
                inner.admit(parent)?;
                // A finished teardown that left this very Activation mapped (abandoned) would be
                // found again by every later routing: fail instead of looping for ever.
                let left = inner
                    .activations
                    .lock()
                    .get(child_id)
                    .is_some_and(|a| Arc::ptr_eq(a, &activation));
                if left {
                    let error = SubagentError::teardown_left_activation(child_id.as_str());
                    return Err(match outcome {
                        Err(cause) => error.with_shared_source(cause),
                        Ok(()) => error,
                    });
                }
                continue;
            }
            return match inner.submit(&activation, parent, content, source, signal) {
                Ok(id) => Ok(id),
                Err(e) => {
                    // A fresh epoch that admitted nothing is released through its disposal,
                    // awaited before rejecting so that the caller sees no epoch left — raced
                    // with the signal, though: the teardown awaits host code (the child's idle,
                    // the store's flush, the handle's disposal), which may take long or never
                    // end. A cancelled follow-up (before or during the wait) rejects `CANCELLED`
                    // at once; only its wait is dropped — the disposal runs on as its tracked
                    // task, and drains still find the epoch and wait for it (spec §2.14.6).
                    let disposal = (!activation.is_announced()).then(|| inner.open_disposal(&activation));
                    drop(guard);
                    if let Some(disposal) = disposal {
                        let _ = resume::until_cancelled(signal, disposal).await?;
                    }
                    Err(e)
                }
            };
        }
    }

    /// Manager-wide drain: closes admission permanently, disposes every resident child (roots
    /// first open their forests; children are released before their owners) and awaits the
    /// manager's background work. Failures aggregate as `ACTIVATION_TEARDOWN_FAILED`.
    ///
    /// Closing admission and opening every root's disposal (so cancellation propagates
    /// top-down) happen **synchronously, when this is called**, before the returned future is
    /// first polled; the future awaits the teardowns and the manager's tasks.
    pub fn dispose_all(&self) -> BoxFuture<'static, Result<(), SubagentError>> {
        let inner = self.inner.clone();
        inner.draining.store(true, Ordering::SeqCst);
        let all: Vec<Arc<Activation>> = inner.activations.lock().values().cloned().collect();
        let owned: std::collections::HashSet<SessionId> =
            all.iter().flat_map(|a| a.owned_children()).collect();
        let disposals: Vec<_> = all
            .iter()
            .filter(|a| !owned.contains(&a.child_id))
            .map(|a| inner.open_disposal(a))
            .collect();
        let inflight = inner.inflight_materializations(|_| true);
        async move {
            futures::future::join_all(inflight).await;
            let results = futures::future::join_all(disposals).await;
            inner.tasks.close();
            inner.tasks.wait().await;
            inner.tasks.reopen();
            let failures: Vec<_> = results.into_iter().filter_map(Result::err).collect();
            if failures.is_empty() {
                Ok(())
            } else {
                let refs: Vec<&(dyn std::error::Error + 'static)> = failures
                    .iter()
                    .map(|e| e.as_ref() as &(dyn std::error::Error + 'static))
                    .collect();
                Err(SubagentError::teardown_failed_for("activation(s)", &refs))
            }
        }
        .boxed()
    }

    /// The number of background tasks (watchers) still running.
    pub fn task_count(&self) -> usize {
        self.inner.tasks.len()
    }
}

impl Inner {
    /// The admission check (`DRAINING`) for an operation on behalf of `agent`: closed while
    /// the manager drains, or while a scoped drain covers `agent` (a live lineage containing a
    /// closing root or a recorded member of a closing root's set — `agent` itself or one of its
    /// live ancestors).
    pub(super) fn admit(&self, agent: &AgentRef) -> Result<(), SubagentError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(SubagentError::draining());
        }
        match self.closing_root_over(agent) {
            Some(root) => Err(SubagentError::draining_below(root.as_str())),
            None => Ok(()),
        }
    }

    /// `ACTIVATION_CLOSING` when `parent` is a resident Activation whose disposal began (it
    /// can no longer own a new child).
    fn check_parent_open(&self, parent: &AgentRef) -> Result<(), SubagentError> {
        let owner = self.activations.lock().get(parent.id()).cloned();
        match owner {
            Some(owner) if owner.disposal().is_some() => {
                Err(SubagentError::parent_activation_closing(parent.id().as_str()))
            }
            _ => Ok(()),
        }
    }

    /// Whether `agent`'s lineage is closing (manager drain or a covering scoped drain).
    pub(super) fn is_closing(&self, agent: &AgentRef) -> bool {
        self.admit(agent).is_err()
    }

    /// `DUPLICATE_CHILD` when `id` names a live agent or a live session.
    fn check_available(&self, id: &SessionId) -> Result<(), SubagentError> {
        if self.services.agents.get(id).is_some()
            || self.services.sessions.get(id).is_some()
            || self.activations.lock().contains_key(id)
        {
            return Err(SubagentError::duplicate_child(id.as_str()));
        }
        Ok(())
    }

    /// Delivery authority: `parent` is the exact live registry entry and the child's durable
    /// direct parent.
    fn authorize(
        &self,
        parent: &AgentRef,
        child_id: &SessionId,
        parent_session: Option<&SessionId>,
    ) -> Result<(), SubagentError> {
        let live = self
            .services
            .agents
            .get(parent.id())
            .is_some_and(|p| Arc::ptr_eq(&p, parent));
        if !live {
            return Err(SubagentError::delivery_requires_live_parent(child_id.as_str()));
        }
        if parent_session != Some(parent.id()) {
            return Err(SubagentError::foreign_parent(child_id.as_str()));
        }
        Ok(())
    }

    /// The child agent plus the exact live lineage of `parent` (parent, its durable parent if
    /// live, and so on), as weak references. Cycle-safe.
    fn lineage(&self, child: &AgentRef, parent: &AgentRef) -> Vec<std::sync::Weak<dyn agent::Agent>> {
        let mut out = vec![Arc::downgrade(child), Arc::downgrade(parent)];
        let mut seen = vec![child.id().clone(), parent.id().clone()];
        let mut next = parent.session().header().parent_session.clone();
        while let Some(id) = next {
            if seen.contains(&id) {
                break;
            }
            let Some(agent) = self.services.agents.get(&id) else {
                break;
            };
            out.push(Arc::downgrade(&agent));
            seen.push(id);
            next = agent.session().header().parent_session.clone();
        }
        out
    }

    /// The checks of the child lock's critical section before materialization (spec §2.14.2
    /// step 9): token, admission, id availability, and for a caller-reserved id the persisted
    /// catalog.
    async fn reserve(
        &self,
        parent: &AgentRef,
        child_id: &SessionId,
        reserved: bool,
        signal: &Signal,
    ) -> Result<(), SubagentError> {
        check_signal(signal)?;
        self.admit(parent)?;
        self.check_available(child_id)?;
        if reserved {
            // Raced with the signal (the token owns the lookup): an abort during a slow read
            // rejects at once, instead of waiting for the store with the child's lock held.
            let persisted = match &self.services.persistence {
                Some(p) => resume::until_cancelled(signal, store_call(|| p.inspect(child_id)))
                    .await?
                    .map_err(agent_failure)?,
                None => None,
            };
            if persisted.is_some() {
                return Err(SubagentError::duplicate_child(child_id.as_str()));
            }
            check_signal(signal)?;
            self.admit(parent)?;
            self.check_available(child_id)?;
        }
        Ok(())
    }

    /// A holder of `id`'s per-child lock (the map's entry, created on first need).
    fn child_lock(self: &Arc<Self>, id: &SessionId) -> ChildLock {
        let lock = self.locks.lock().entry(id.clone()).or_default().clone();
        ChildLock {
            inner: self.clone(),
            id: id.clone(),
            lock: Some(lock),
        }
    }

    /// Installs ownership, the inbox subscription and the epoch boundary, then emits the start
    /// edge (spec §2.14.4 step 4). Synchronous: no suspension point.
    ///
    /// The whole residency is one span under `admission`, like a submission's, so that every
    /// other admission span sees this child either not yet admitted or fully resident (ancestry
    /// recorded, epoch begun, start edge emitted) — never in between:
    /// * the opening of the parent's disposal (which takes the same lock to cancel and to open
    ///   the transactions of the children it owns *then*) comes either before — this child is
    ///   refused `ACTIVATION_CLOSING` — or after — it finds this child owned and tears it down
    ///   with the parent. Checked and registered apart, a disposal opened in between (on another
    ///   thread) missed the child, which then outlived its parent's teardown;
    /// * a scoped drain's synchronous span (closing its roots, selecting its targets by their
    ///   recorded ancestry, collecting the in-flight materializations) comes either before —
    ///   this child is refused `DRAINING` and rolled back while the drain waits for its
    ///   in-flight record — or after — the drain selects this child by its ancestry and tears
    ///   it down. With the ancestry recorded after the span (and the drain's selection outside
    ///   any span), a drain on another thread could select before the ancestry was there and
    ///   collect the in-flight records after this child dropped its own: it resolved with the
    ///   child resident under its closed root;
    /// * no disposal opened by someone else can run beside the rest of the installation (an end
    ///   edge missed because the epoch had not begun yet, a subscription set after the
    ///   teardown dropped it).
    fn make_resident(
        self: &Arc<Self>,
        activation: &Arc<Activation>,
        parent: &AgentRef,
        signal: &Signal,
    ) -> Result<(), SubagentError> {
        #[cfg(test)]
        self.hooks.residency(activation, &self.admission);
        let _admission = self.admission.lock();
        check_signal(signal)?;
        self.admit(parent)?;
        if let Some(owner) = self.activations.lock().get(parent.id()).cloned() {
            if owner.disposal().is_some() {
                return Err(SubagentError::parent_activation_closing(parent.id().as_str()));
            }
            owner.own(activation);
        }
        #[cfg(test)]
        self.hooks.admitted(activation);
        // The lineage and the epoch boundary read host agents (their `session`) and the host
        // runtime (`get`): a panic there fails the start like a host call that threw, and the
        // caller's rollback undoes the ownership registered above (unwound, it left the child
        // resident, owned and registered with no epoch).
        let ancestry = host_call("the agent runtime", || self.lineage(&activation.agent, parent))
            .map_err(agent_failure)?;
        activation.set_ancestry(ancestry);
        let boundary =
            host_call("the child agent", || activation.agent.session().len()).map_err(agent_failure)?;
        let weak = Arc::downgrade(activation);
        let registration = self
            .services
            .agent_events
            .on_scoped(activation.child_id.clone(), move |event| {
                if let Some(activation) = weak.upgrade() {
                    activation.observe(event);
                }
                Ok(())
            });
        activation.set_subscription(registration);
        let info = SubagentRunInfo {
            run_id: uuid::Uuid::new_v4().to_string(),
            provider: activation.provider.clone(),
            id: activation.child_id.clone(),
            local: true,
            parent: activation.parent_session.clone(),
        };
        activation.begin_epoch(info.clone(), boundary);
        // Listeners are contained by the bus; one that drains or disposes re-enters the
        // (reentrant) admission lock and finds this child fully resident.
        self.service.events().emit(&SubagentEvent::Start(info));
        Ok(())
    }

    /// The final admission span (spec §2.14.5 "Submission"): no suspension from here to
    /// acceptance.
    fn submit(
        &self,
        activation: &Arc<Activation>,
        parent: &AgentRef,
        content: Vec<ContentBlock>,
        source: MessageSource,
        signal: &Signal,
    ) -> Result<MessageId, SubagentError> {
        let child_id = activation.child_id.as_str();
        // One span with respect to every disposal's opening (and its cancel).
        let _admission = self.admission.lock();
        check_signal(signal)?;
        self.admit(parent)?;
        if activation.disposal().is_some() {
            return Err(SubagentError::submission_activation_closing(child_id));
        }
        self.authorize(parent, &activation.child_id, Some(&activation.parent_session))?;
        let owner = self.activations.lock().get(parent.id()).cloned();
        if let Some(owner) = owner {
            if owner.disposal().is_some() {
                return Err(SubagentError::parent_activation_closing(parent.id().as_str()));
            }
            owner.own(activation);
        }
        let message = Message::user(content, source);
        let id = message.id.clone();
        activation.accept(id.clone());
        // The child is host code: a panic of its `send` is contained and fails the submission
        // like a send that threw, taking the id back out of `accepted` (left there, it would
        // hold the child `running` for ever).
        let sent = send_contained("the child agent", || activation.agent.followup(message));
        if let Err(e) = sent {
            activation.settle_accepted(&id);
            return Err(agent_failure(e));
        }
        activation.wake();
        activation.announce();
        Ok(id)
    }

    /// Starts the settlement watcher of `activation` (spec §2.14.6).
    fn spawn_watcher(self: &Arc<Self>, activation: &Arc<Activation>, lock: ChildLock) {
        let inner = self.clone();
        let activation = activation.clone();
        self.tasks.spawn(async move {
            loop {
                if activation.disposal().is_some() {
                    break;
                }
                let idle = tokio::select! {
                    idle = activation.idle() => idle,
                    () = activation.notified() => Ok(()),
                };
                let guard = lock.lock().await;
                if activation.disposal().is_some() {
                    break;
                }
                // A child whose host agent cannot say when it is idle (its `when_idle` panicked)
                // would never be seen settled: it is torn down now instead of staying resident.
                if let Err(panic) = &idle {
                    tracing::warn!(child = %activation.child_id, panic = %panic,
                        "the child agent's when_idle panicked; tearing its activation down");
                }
                // The settle decision reads the host agent's `status`: a panic there is contained
                // and tears the child down like a panicking `when_idle` (left to unwind, it killed
                // this watcher and the child stayed resident, its owner waiting, for ever).
                let settled = idle.is_ok()
                    && host_call("the child agent's status", || activation.is_settled()).unwrap_or_else(|e| {
                        tracing::warn!(child = %activation.child_id, error = %e,
                            "the child agent's status panicked; tearing its activation down");
                        true
                    });
                if idle.is_err() || settled {
                    let disposal = inner.open_disposal(&activation);
                    drop(guard);
                    if let Err(e) = disposal.await {
                        tracing::warn!(child = %activation.child_id, error = %e, "activation teardown failed");
                    }
                    break;
                }
                drop(guard);
                // A status that panics now (it did not above) routes again: the next settle
                // decision reads it once more.
                let idle_now = host_call("the child agent's status", || activation.agent.status())
                    .is_ok_and(|status| status == AgentStatus::Idle);
                if idle_now {
                    activation.notified().await;
                }
            }
        });
    }

    /// Opens (or joins) the memoized disposal transaction of `activation` (spec §2.14.6): the
    /// synchronous part (wake, cancel, open owned children's transactions) runs now.
    fn open_disposal(self: &Arc<Self>, activation: &Arc<Activation>) -> activation::Disposal {
        let _admission = self.admission.lock();
        let inner = self.clone();
        activation.open_disposal(&self.tasks, move |activation| {
            activation.wake();
            // The child is host code: a panic of its `cancel` would unwind into whoever opened
            // this transaction and abandon it with the Activation resident. It is contained and
            // recorded as a failed boundary; the teardown then waits for the turn to end.
            let cancelled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                activation
                    .agent
                    .cancel(agent::CancelCause::Parent, agent::CancelOptions::default());
            }));
            let cancel_failure = cancelled.err().map(|payload| {
                Arc::new(SubagentError::cancel_failed(
                    activation.child_id.as_str(),
                    &agent::bus::panic_message(&*payload),
                )) as crate::error::SharedError
            });
            let children: Vec<_> = activation
                .owned_children()
                .into_iter()
                .filter_map(|id| inner.activations.lock().get(&id).cloned())
                .map(|child| inner.open_disposal(&child))
                .collect();
            async move { inner.dispose(activation, cancel_failure, children).await }.boxed()
        })
    }

    /// The asynchronous part of the disposal transaction; `cancel_failure` is the synchronous
    /// part's failed cancel, if it failed.
    async fn dispose(
        self: Arc<Self>,
        activation: Arc<Activation>,
        cancel_failure: Option<crate::error::SharedError>,
        children: Vec<activation::Disposal>,
    ) -> Result<(), crate::error::SharedError> {
        let child_id = activation.child_id.clone();
        let mut failures: Vec<crate::error::SharedError> = cancel_failure.into_iter().collect();
        for result in futures::future::join_all(children).await {
            if let Err(e) = result {
                failures.push(e);
            }
        }
        // A host agent whose `when_idle` panics is not waited for: the failure is recorded and
        // the handle's disposal below still releases the agent.
        if let Err(panic) = activation.idle().await {
            failures.push(Arc::new(SubagentError::idle_wait_failed(
                child_id.as_str(),
                &panic,
            )));
        }
        // Best-effort: a rejection — or a panic of the host's store, contained here so that it
        // cannot abandon the transaction with the Activation still in the live map — is only
        // logged.
        let flushed = store_call(|| self.services.sessions.flush(&child_id)).await;
        if let Err(e) = flushed {
            tracing::warn!(child = %child_id, error = %e,
                "best-effort final session flush failed; the persisted state may be missing or stale on resume");
        }
        // Capture reads the epoch's log through the host agent (`session` is host code): a panic
        // there is contained and recorded as a failed boundary — left to unwind, it abandoned
        // the transaction with the Activation still resident and no end edge.
        let captured = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| activation.capture()));
        let (stop_reason, output) = match captured {
            Ok(facts) => facts,
            Err(payload) => {
                failures.push(Arc::new(SubagentError::capture_failed(
                    child_id.as_str(),
                    &agent::bus::panic_message(&*payload),
                )));
                (StopReason::Error, None)
            }
        };
        if let Err(panic) = activation.dispose_handle().await {
            failures.push(Arc::new(SubagentError::handle_disposal_failed(
                child_id.as_str(),
                &panic,
            )));
        }
        let failure: Option<crate::error::SharedError> = match failures.len() {
            0 => None,
            1 => failures.pop(),
            _ => {
                let refs: Vec<&(dyn std::error::Error + 'static)> = failures
                    .iter()
                    .map(|e| e.as_ref() as &(dyn std::error::Error + 'static))
                    .collect();
                Some(Arc::new(SubagentError::teardown_failed_at_boundaries(
                    child_id.as_str(),
                    &refs,
                )))
            }
        };
        let (stop_reason, output) = if failure.is_some() {
            (StopReason::Error, None)
        } else {
            (stop_reason, output)
        };
        // Removal from the live map, then the notice, then the ownership release, then the end.
        // Marked under way before the removal, so a host never sees the child in neither place.
        let under_way = activation
            .is_announced()
            .then(|| NoticeUnderWay::new(&self.notices, &self.changes, &activation.parent_session));
        {
            let mut map = self.activations.lock();
            if map.get(&child_id).is_some_and(|a| Arc::ptr_eq(a, &activation)) {
                map.remove(&child_id);
            }
        }
        if activation.is_announced() {
            // Resolving the parent and its state calls host code (the runtime's `get`, the
            // parent's session and status): a panic there fails this delivery only — left to
            // unwind, it abandoned the transaction after the removal, with no ownership release
            // (the parent pinned `waiting`) and no end edge.
            let delivered = host_call("the notice's parent lookup", || {
                self.deliver_notice(&activation, &stop_reason, output.as_deref());
            });
            if let Err(e) = delivered {
                tracing::warn!(child = %child_id, error = %e, "settlement notice was not delivered to its parent");
            }
        }
        drop(under_way);
        #[cfg(test)]
        self.hooks.before_release(&activation).await;
        self.release_ownership(&activation);
        if let Some(info) = activation.epoch() {
            self.service
                .events()
                .emit(&SubagentEvent::End(crate::events::SubagentRunEndInfo {
                    info,
                    stop_reason,
                    last_assistant_message: output,
                }));
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Rollback of an Activation whose start edge was never emitted: dispose the handle, remove
    /// the map entry, release ownership. No notice, no end edge.
    ///
    /// The rollback runs as a tracked task that also holds the in-flight `materializing`
    /// record until it is done, so it completes — and drains keep waiting for it — even when
    /// the caller's future is dropped while awaiting it.
    fn rollback(
        self: &Arc<Self>,
        activation: Arc<Activation>,
        materializing: drain::MaterializingGuard,
    ) -> impl Future<Output = ()> + Send + 'static {
        let inner = self.clone();
        // Installed as the Activation's (memoized) disposal, so that it is the admission cutoff
        // like any release: a delivery routed to this child meanwhile (its starter dropped, so
        // its lock released) waits for the rollback and then cold-resumes, instead of being
        // accepted by an agent whose handle is being disposed — and never run.
        let disposal = {
            let _admission = self.admission.lock();
            activation.open_disposal(&self.tasks, move |activation| {
                async move {
                    if let Err(panic) = activation.dispose_handle().await {
                        tracing::warn!(child = %activation.child_id, panic = %panic,
                            "the handle disposal of a rolled-back activation failed");
                    }
                    {
                        let mut map = inner.activations.lock();
                        if map
                            .get(&activation.child_id)
                            .is_some_and(|a| Arc::ptr_eq(a, &activation))
                        {
                            map.remove(&activation.child_id);
                        }
                    }
                    #[cfg(test)]
                    inner.hooks.before_release(&activation).await;
                    inner.release_ownership(&activation);
                    Ok(())
                }
                .boxed()
            })
        };
        let done = self.tasks.spawn(async move {
            let _ = disposal.await;
            drop(materializing);
        });
        async move {
            if let Err(e) = done.await {
                tracing::warn!(error = %e, "continuable activation rollback failed");
            }
        }
    }

    /// Step 10 of the disposal transaction (and of a rollback): removes `activation`'s ownership
    /// registrations from every resident Activation and wakes those owners. Only registrations
    /// made by this very epoch go: a later epoch of the same child id, cold-resumed since this
    /// one left the live map, keeps its own (its parent still waits for it).
    fn release_ownership(&self, activation: &Activation) {
        let owners: Vec<Arc<Activation>> = self.activations.lock().values().cloned().collect();
        for owner in owners {
            if owner.disown(activation) {
                owner.wake();
            }
        }
        bump(&self.changes);
    }
}

/// One holder of a child's per-child lock entry in `Inner::locks`. Holders are made only by
/// [`Inner::child_lock`] and [`Clone`], and every drop happens under the map's lock, so the
/// holder dropped last — whichever it is — sees itself as the only one and removes the entry:
/// an entry never outlives its holders, and is never removed while someone holds it (a removal
/// under a waiting holder would let a newcomer take a fresh entry and run beside it).
pub(super) struct ChildLock {
    inner: Arc<Inner>,
    id: SessionId,
    /// `None` only inside `drop`.
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
}

impl ChildLock {
    /// Waits for the lock.
    pub(super) async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.as_ref().expect("held until drop").lock().await
    }
}

impl Clone for ChildLock {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            id: self.id.clone(),
            lock: self.lock.clone(),
        }
    }
}

impl Drop for ChildLock {
    fn drop(&mut self) {
        let Some(lock) = self.lock.take() else { return };
        let mut locks = self.inner.locks.lock();
        // The map's reference and this one: nobody else holds it, and nobody can take it while
        // the map is locked.
        let last = locks.get(&self.id).is_some_and(|entry| Arc::ptr_eq(entry, &lock))
            && Arc::strong_count(&lock) == 2;
        drop(lock);
        if last {
            locks.remove(&self.id);
        }
    }
}

/// The setup window of a fresh continuable child: the descriptor, the delegated policy, the
/// child composition, then the setup contributions, whose commit it returns (spec §2.14.4 step
/// 3).
fn setup(
    contributions: Arc<setup::SetupRegistry>,
    descriptor: EventData,
    policy: DelegatedPolicyOverrides,
    composition: ChildComposition,
) -> Setup {
    Box::new(move |ctx: Ctx| {
        async move {
            let child = ctx
                .agent()
                .ok_or_else(|| AgentError::Inactive(ScopeInactive(SessionId::from("<global context>"))))?;
            child.session().record(descriptor, None)?;
            append_delegated_policy_overrides(child.session(), &policy)?;
            apply_child_composition(&ctx, &composition)?;
            Ok(Some(contributions.apply(&ctx)?))
        }
        .boxed()
    })
}

/// Calls host code `call` and awaits the future it returns, containing a panic of either (agents,
/// runtimes and stores are third-party code, which must not unwind through the manager's
/// transactions or into its callers) as the panic's message.
async fn contained<F: Future>(call: impl FnOnce() -> F) -> Result<F::Output, String> {
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(future) => std::panic::AssertUnwindSafe(future).catch_unwind().await,
        Err(payload) => Err(payload),
    };
    outcome.map_err(|payload| agent::bus::panic_message(&*payload))
}

/// A call into the host's session store or persistence, with a panic contained as a failed
/// call (`AgentError::Persistence`, "the session store panicked: …").
async fn store_call<T, F>(call: impl FnOnce() -> F) -> Result<T, AgentError>
where
    F: Future<Output = Result<T, AgentError>>,
{
    contained(call).await.unwrap_or_else(|panic| {
        Err(AgentError::Persistence(format!(
            "the session store panicked: {panic}"
        )))
    })
}

/// A call into the host's agent runtime (`create`, `resume`), with a panic contained as a failed
/// call (`AgentError::Other`, "the agent runtime panicked: …").
async fn runtime_call<T, F>(call: impl FnOnce() -> F) -> Result<T, AgentError>
where
    F: Future<Output = Result<T, AgentError>>,
{
    contained(call).await.unwrap_or_else(|panic| {
        Err(AgentError::Other(
            format!("the agent runtime panicked: {panic}").into(),
        ))
    })
}

/// A delivery into a host agent's inbox (`send` and its presets), with a panic contained as a
/// failed send (`AgentError::Other`, "`<who>` panicked: …"), so that the caller's accounting for
/// the delivery (an id accepted before the send) is undone as for a send that threw.
fn send_contained(
    who: &str,
    send: impl FnOnce() -> Result<MessageId, AgentError>,
) -> Result<MessageId, AgentError> {
    host_call(who, send)?
}

/// A synchronous call into host code (`who`), with a panic contained as a failed call
/// (`AgentError::Other`, "`who` panicked: …").
fn host_call<T>(who: &str, call: impl FnOnce() -> T) -> Result<T, AgentError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).map_err(|payload| {
        AgentError::Other(format!("{who} panicked: {}", agent::bus::panic_message(&*payload)).into())
    })
}

/// Throw-if-aborted: the token's cause as a `CANCELLED` error.
fn check_signal(signal: &Signal) -> Result<(), SubagentError> {
    if signal.is_cancelled() {
        let cause = signal
            .cause()
            .map_or_else(|| "cancelled".to_owned(), |c| format!("{c:?}"));
        return Err(SubagentError::new(
            SubagentErrorCode::Cancelled,
            format!("continuable subagent operation was aborted before acceptance ({cause})"),
        ));
    }
    Ok(())
}

fn depth_failure(e: crate::depth::DepthError) -> SubagentError {
    SubagentError::new(SubagentErrorCode::DepthExceeded, e.to_string()).with_source(e)
}

fn agent_failure(e: AgentError) -> SubagentError {
    let code = match &e {
        AgentError::CreationAborted { .. } => SubagentErrorCode::Cancelled,
        _ => SubagentErrorCode::ProviderFailed,
    };
    SubagentError::new(code, e.to_string()).with_source(e)
}

/// The epoch's own events, for capture.
fn epoch_events(events: &[Arc<SessionEvent>], boundary: usize) -> &[Arc<SessionEvent>] {
    events.get(boundary..).unwrap_or(&[])
}
