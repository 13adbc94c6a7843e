//! The memoized quiescence transaction of one registered agent (spec §9.4).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, future};
use parking_lot::Mutex;
use tokio::sync::Notify;

use agent::{Agent, AgentEvent, AgentRef, CancelCause, CancelOptions, Disposer, Registration};

use super::RuntimeInner;
use crate::agent::LoopAgent;

/// One registered agent.
pub(super) struct AgentEntry {
    pub(super) agent: Arc<LoopAgent>,
    pub(super) runtime: Weak<RuntimeInner>,
    /// The store entry; dropping it removes the session.
    pub(super) session_guard: Mutex<Option<Registration>>,
    pub(super) owner: Option<Weak<AgentEntry>>,
    /// Published agents this one created.
    pub(super) children: Mutex<Vec<Weak<AgentEntry>>>,
    /// Set when the teardown begins (aborts pending creations it owns).
    pub(super) disposing: Latch,
    /// Whether `AgentEvent::Created` was emitted (so `Disposed` pairs with it).
    pub(super) announced: std::sync::atomic::AtomicBool,
    pub(super) teardown: OnceLock<Shared<BoxFuture<'static, ()>>>,
}

impl AgentEntry {
    /// Starts (or joins) the memoized teardown.
    ///
    /// The first call's future drives the teardown when polled; if it is dropped before the
    /// teardown completed, the rest runs as a task of the runtime, so the teardown progresses
    /// even when no caller polls it to the end. (A teardown that completes on its first poll
    /// needs no task.)
    pub(super) fn dispose(self: &Arc<Self>) -> BoxFuture<'static, ()> {
        let mut first = false;
        let shared = self
            .teardown
            .get_or_init(|| {
                first = true;
                teardown(self.clone()).boxed().shared()
            })
            .clone();
        if first {
            // The synchronous part, outside the cell's initialisation (listeners it triggers
            // may call `dispose` again): no new work from now on, the active turn aborted and
            // the inbox cleared (no wake latch under `disposed`).
            self.disposing.set();
            self.agent.begin_disposal();
            self.agent.cancel(CancelCause::Disposed, CancelOptions::default());
            return Box::pin(Teardown {
                shared: Some(shared),
                runtime: self.runtime.clone(),
            });
        }
        shared.boxed()
    }

    pub(super) fn is_agent(&self, agent: &AgentRef) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.agent), Arc::as_ptr(agent))
    }
}

/// A one-way flag with waiters: set once, never cleared. (An atomic and a [`Notify`] inside the
/// entry, where a [`Signal`](agent::Signal) would be two more allocations per agent.)
#[derive(Default)]
pub(super) struct Latch {
    set: AtomicBool,
    notify: Notify,
}

impl Latch {
    /// Sets the flag and wakes every waiter.
    pub(super) fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Whether the flag is set.
    pub(super) fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Resolves once the flag is set (at once when it is).
    pub(super) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a `set` between the check and the wait wakes it.
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// The quiescence transaction of one agent (see the module docs).
pub(super) async fn teardown(entry: Arc<AgentEntry>) {
    let agent = entry.agent.clone();
    let children: Vec<Arc<AgentEntry>> = entry
        .children
        .lock()
        .drain(..)
        .filter_map(|w| w.upgrade())
        .collect();
    let jobs = entry.runtime.upgrade().and_then(|rt| rt.services.jobs.clone());
    let id = agent.id().clone();
    let jobs_done = async move {
        if let Some(jobs) = jobs {
            jobs.dispose_owner(&id).await;
        }
    };
    future::join3(
        future::join_all(children.iter().map(|c| c.dispose())),
        jobs_done,
        agent.wait_idle(),
    )
    .await;
    agent.tasks().close();
    agent.tasks().wait().await;
    agent.scope().dispose();
    if let Some(rt) = entry.runtime.upgrade() {
        rt.registry.lock().retain(|e| !Arc::ptr_eq(e, &entry));
    }
    if entry.announced.load(std::sync::atomic::Ordering::SeqCst)
        && let Some(rt) = entry.runtime.upgrade()
    {
        rt.services.agent_events.emit(&AgentEvent::Disposed {
            agent: agent.id().clone(),
        });
    }
    let guard = entry.session_guard.lock().take();
    drop(guard);
    if let Some(owner) = entry.owner.as_ref().and_then(Weak::upgrade) {
        owner
            .children
            .lock()
            .retain(|w| w.upgrade().is_some_and(|e| !Arc::ptr_eq(&e, &entry)));
    }
}

/// The first caller's view of a teardown: polling drives it; dropping it unfinished hands the
/// rest to a runtime task (or a plain tokio task when the runtime is gone; nothing without a
/// tokio runtime).
struct Teardown {
    shared: Option<Shared<BoxFuture<'static, ()>>>,
    runtime: Weak<RuntimeInner>,
}

impl Future for Teardown {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let Some(shared) = self.shared.as_mut() else {
            return std::task::Poll::Ready(());
        };
        let poll = shared.poll_unpin(cx);
        if poll.is_ready() {
            self.shared = None;
        }
        poll
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else { return };
        if shared.peek().is_some() {
            return;
        }
        // Drive the teardown in the background so it progresses even if no caller polls.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            match self.runtime.upgrade() {
                Some(rt) => drop(rt.tasks.spawn_on(shared, &handle)),
                None => drop(handle.spawn(shared)),
            }
        }
    }
}

pub(super) struct EntryDisposer(pub(super) Arc<AgentEntry>);

impl Disposer for EntryDisposer {
    fn dispose(&self) -> BoxFuture<'static, ()> {
        self.0.dispose()
    }
}
