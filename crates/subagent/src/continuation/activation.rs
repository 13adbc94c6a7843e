//! One residency epoch of a continuable child (spec §2.14.1).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use agent::{
    Agent, AgentEvent, AgentHandle, AgentRef, AgentStatus, ContentBlock, MessageId, Registration, SessionId,
};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::error::SharedError;
use crate::events::SubagentRunInfo;
use crate::output::final_assistant_output;
use crate::result::{StopReason, epoch_stop_reason};

/// The memoized disposal transaction; every converging releaser awaits the same outcome.
pub(crate) type Disposal = Shared<BoxFuture<'static, Result<(), SharedError>>>;

/// Identifies one Activation (one residency epoch) among every Activation of the process: two
/// epochs of the same child id never share one. An ownership registration records the epoch that
/// made it, so that an epoch's release removes its own registration only — never that of a later
/// epoch of the same child, cold-resumed between the earlier one's removal from the live map and
/// its ownership release (spec §2.14.6 steps 8–10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Epoch(u64);

impl Epoch {
    fn mint() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Per-Activation state. Each mutex protects only its own field and is never held across an
/// `.await`.
pub(crate) struct Activation {
    pub(crate) child_id: SessionId,
    /// This residency epoch's identity.
    pub(crate) epoch_id: Epoch,
    /// The durable direct parent's id.
    pub(crate) parent_session: SessionId,
    /// The provider named by the descriptor.
    pub(crate) provider: String,
    pub(crate) agent: AgentRef,
    handle: Mutex<Option<AgentHandle>>,
    /// Child session ids this Activation owns, each with the epoch of the child's Activation that
    /// registered it (spec §2.14.6 `ownedChildren`).
    owned: Mutex<HashMap<SessionId, Epoch>>,
    /// Waking sends not yet seen claimed or discarded.
    accepted: Mutex<HashSet<MessageId>>,
    /// Whether any delivery to this child was accepted.
    announced: AtomicBool,
    /// The disposal transaction; its presence is the admission cutoff.
    disposal: Mutex<Option<Disposal>>,
    /// The start edge's info and the epoch boundary (log length at the start edge).
    epoch: Mutex<Option<(SubagentRunInfo, usize)>>,
    /// The inbox subscription.
    subscription: Mutex<Option<Registration>>,
    /// The child agent plus the exact live lineage of its parent at materialization (weak: the
    /// ancestry never keeps an agent alive).
    ancestry: Mutex<Vec<Weak<dyn Agent>>>,
    wake: Notify,
}

impl Activation {
    pub(crate) fn new(
        child_id: SessionId,
        parent_session: SessionId,
        provider: String,
        handle: AgentHandle,
    ) -> Arc<Self> {
        Arc::new(Self {
            child_id,
            epoch_id: Epoch::mint(),
            parent_session,
            provider,
            agent: handle.agent().clone(),
            handle: Mutex::new(Some(handle)),
            owned: Mutex::default(),
            accepted: Mutex::default(),
            announced: AtomicBool::new(false),
            disposal: Mutex::new(None),
            epoch: Mutex::new(None),
            subscription: Mutex::new(None),
            ancestry: Mutex::new(Vec::new()),
            wake: Notify::new(),
        })
    }

    pub(crate) fn disposal(&self) -> Option<Disposal> {
        self.disposal.lock().clone()
    }

    /// Installs the disposal transaction built by `start` on first call (synchronously, before
    /// `start`'s synchronous part runs) and returns the shared transaction.
    pub(crate) fn open_disposal(
        self: &Arc<Self>,
        tasks: &tokio_util::task::TaskTracker,
        start: impl FnOnce(Arc<Self>) -> BoxFuture<'static, Result<(), SharedError>>,
    ) -> Disposal {
        let (tx, rx) = futures::channel::oneshot::channel::<Result<(), SharedError>>();
        {
            let mut slot = self.disposal.lock();
            if let Some(existing) = slot.as_ref() {
                return existing.clone();
            }
            let shared = async move {
                rx.await.unwrap_or_else(|_| {
                    Err(Arc::new(crate::error::SubagentError::new(
                        crate::error::SubagentErrorCode::ActivationTeardownFailed,
                        "activation teardown was abandoned",
                    )) as SharedError)
                })
            }
            .boxed()
            .shared();
            *slot = Some(shared);
        }
        let work = start(self.clone());
        let shared = self.disposal().expect("installed above");
        tasks.spawn(async move {
            let _ = tx.send(work.await);
        });
        shared
    }

    /// Registers `child` (one epoch of a child) as owned, replacing a registration by an earlier
    /// epoch of the same child id (which has left the live map: its release no longer removes
    /// this one).
    pub(crate) fn own(&self, child: &Activation) {
        self.owned.lock().insert(child.child_id.clone(), child.epoch_id);
    }

    /// Removes `child`'s own registration from the owned set — only if it was made by that very
    /// epoch; returns whether it was there. A later epoch's registration under the same child id
    /// stays.
    pub(crate) fn disown(&self, child: &Activation) -> bool {
        let mut owned = self.owned.lock();
        if owned.get(&child.child_id) == Some(&child.epoch_id) {
            owned.remove(&child.child_id);
            true
        } else {
            false
        }
    }

    pub(crate) fn owned_children(&self) -> Vec<SessionId> {
        self.owned.lock().keys().cloned().collect()
    }

    pub(crate) fn accept(&self, id: MessageId) {
        self.accepted.lock().insert(id);
    }

    pub(crate) fn settle_accepted(&self, id: &MessageId) {
        self.accepted.lock().remove(id);
    }

    /// Whether some waking send to this child is accepted but not yet claimed or discarded.
    pub(crate) fn has_accepted(&self) -> bool {
        !self.accepted.lock().is_empty()
    }

    pub(crate) fn announce(&self) {
        self.announced.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_announced(&self) -> bool {
        self.announced.load(Ordering::SeqCst)
    }

    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    pub(crate) async fn notified(&self) {
        self.wake.notified().await;
    }

    /// Quiescent (idle, nothing accepted unclaimed) and owning no live child.
    pub(crate) fn is_settled(&self) -> bool {
        self.agent.status() == AgentStatus::Idle
            && self.accepted.lock().is_empty()
            && self.owned.lock().is_empty()
    }

    /// Claimed and discarded notifications remove ids from `accepted` and wake the watcher.
    pub(crate) fn observe(&self, event: &AgentEvent) {
        match event {
            AgentEvent::InboxClaimed { message, .. } => {
                self.settle_accepted(message);
                self.wake();
            }
            AgentEvent::InboxDiscarded { messages, .. } => {
                {
                    let mut accepted = self.accepted.lock();
                    for m in messages {
                        accepted.remove(m);
                    }
                }
                self.wake();
            }
            _ => {}
        }
    }

    pub(crate) fn set_subscription(&self, registration: Registration) {
        *self.subscription.lock() = Some(registration);
    }

    pub(crate) fn drop_subscription(&self) {
        let registration = self.subscription.lock().take();
        drop(registration);
    }

    pub(crate) fn set_ancestry(&self, ancestry: Vec<Weak<dyn Agent>>) {
        *self.ancestry.lock() = ancestry;
    }

    /// Whether `agent` (by identity) is recorded in this Activation's ancestry.
    pub(crate) fn has_ancestor(&self, agent: &AgentRef) -> bool {
        self.ancestry
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .any(|a| Arc::ptr_eq(&a, agent))
    }

    /// Opens an epoch whose own events start at `boundary` (the child's log length when it
    /// became resident).
    pub(crate) fn begin_epoch(&self, info: SubagentRunInfo, boundary: usize) {
        *self.epoch.lock() = Some((info, boundary));
    }

    pub(crate) fn epoch(&self) -> Option<SubagentRunInfo> {
        self.epoch.lock().as_ref().map(|(info, _)| info.clone())
    }

    /// The epoch's terminal facts (spec §2.14.7) from its own log suffix. Reads the log through
    /// the host agent's `session` (host code): the disposal transaction contains a panic as a
    /// failed capture.
    pub(crate) fn capture(&self) -> (StopReason, Option<Vec<ContentBlock>>) {
        let boundary = self.epoch.lock().as_ref().map_or(0, |(_, b)| *b);
        let events = self.agent.session().events();
        let own = super::epoch_events(&events, boundary);
        let reason = epoch_stop_reason(&agent::fold_consumed_work(own.iter()));
        let output = final_assistant_output(own.iter()).filter(|o| !o.is_empty());
        (reason, output)
    }

    /// Drops the inbox subscription and disposes the handle (once). A panic of the runtime's
    /// disposer (host code) is contained and returned as its message: the caller records it as
    /// a failed boundary and its transaction goes on.
    pub(crate) async fn dispose_handle(&self) -> Result<(), String> {
        self.drop_subscription();
        let handle = self.handle.lock().take();
        let Some(handle) = handle else {
            return Ok(());
        };
        super::contained(|| handle.dispose()).await
    }

    /// Resolves when the child agent is idle. A panic of the host agent's `when_idle` (the call
    /// or its future) is contained and returned as its message: the manager can then no longer
    /// tell when this child is idle.
    pub(crate) async fn idle(&self) -> Result<(), String> {
        super::contained(|| self.agent.when_idle()).await
    }
}
