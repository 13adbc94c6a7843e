//! [`SubagentService`]: the provider registry, one-shot `start` and lifecycle events
//! (spec §2.1, §2.2, §2.5, §2.13).

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent::bus::panic_message;
use agent::{EventBus, EventData, Registration, SessionId};
use futures::FutureExt;
use parking_lot::RwLock;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::depth::{DepthError, assert_subagent_max_depth};
use crate::descriptor::{DescriptorSnapshotError, SubagentDescriptor, snapshot_subagent_descriptor};
use crate::error::SubagentError;
use crate::events::{SubagentEvent, SubagentRunEndInfo, SubagentRunInfo};
use crate::provider::{ResolvedSubagentStartRequest, SubagentProvider, SubagentStartRequest};
use crate::result::{StopReason, SubagentResult};
use crate::run::{RunFailure, SettledCallback, SubagentRun};
use crate::schema::assert_output_schema;

/// Why `start` rejected. Nothing was published and no lifecycle event was emitted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A seam error (`NO_PROVIDER`, `UNSUPPORTED_CAPABILITY`, `UNSUPPORTED_SCHEMA`,
    /// `PROVIDER_FAILED` for a panicking provider, or the provider's own rejection, propagated
    /// unchanged).
    #[error(transparent)]
    Subagent(#[from] SubagentError),
    /// `maxDepth` is not a non-negative safe integer.
    #[error(transparent)]
    Depth(#[from] DepthError),
    /// The descriptor could not be snapshotted (for example an unrepresentable label).
    #[error(transparent)]
    Descriptor(#[from] DescriptorSnapshotError),
}

/// Why `register_provider` refused. Nothing stays registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// `DUPLICATE_PROVIDER`, or `PROVIDER_FAILED` when the provider's `name()` panicked.
    #[error(transparent)]
    Subagent(#[from] SubagentError),
    /// A `subagent/provider-added` listener failed; the registration was unwound.
    #[error(transparent)]
    Listener(#[from] agent::bus::ListenerFailed),
}

/// One registry entry: the provider and the name it had when it was registered. The registry
/// works on that recorded name only, so it never calls provider code while its lock is held.
struct Entry {
    /// This registration's own key: removal (by its guard or by the unwinding of a refused
    /// addition) takes out exactly this entry, never another registration of the same provider
    /// object (possible once its `name()` changed).
    key: u64,
    /// Shared so a start can keep it (for a lifecycle event it may have to mint later) without
    /// copying it.
    name: Arc<str>,
    provider: Arc<dyn SubagentProvider>,
    /// The descriptor event of a start without a label, snapshotted once at registration (it
    /// depends on the recorded name only): such starts clone it rather than build the same JSON
    /// payload, hashing its keys, every time.
    unlabeled: Option<EventData>,
}

struct Inner {
    /// The registered providers in insertion order. Held only for plain reads and writes of
    /// the vector; no provider code, listener or `.await` runs under it.
    providers: RwLock<Vec<Entry>>,
    /// The next [`Entry::key`].
    next_key: AtomicU64,
    events: EventBus<SubagentEvent>,
    tasks: TaskTracker,
}

/// The host's `subagents` service. Cheap to clone (shared).
///
/// # Contract
/// * Providers are registered by unique name and removed by dropping their [`Registration`].
///   Removal blocks new starts (lookup is per call) but never revokes runs already returned.
///   The name is read once, at registration: the registry (lookup, listing, the duplicate
///   check, `provider-removed`) keeps that name even if the provider's `name()` later changes.
/// * **Misbehaving providers.** Providers are third-party code. A panic in provider code the
///   service calls (`name`, `capabilities`, `start` — synchronously or at any poll — and the
///   returned run's `id` / `local_agent`) is contained: the call fails with `PROVIDER_FAILED`
///   naming the panic, nothing stays registered or pending and no lifecycle event is emitted
///   (a run whose `id` panicked is dropped, so it disposes itself in the background). Once the
///   run is accepted, a panicking `on_settled`, `result()` or result future ends the run with
///   `error` (logged) and `start` still returns the run. Provider code is never called under
///   the service's lock, so it may call back into the service.
/// * `start` validates in the fixed order of spec §2.5, then calls the provider and returns the
///   provider's run. Lifecycle events are emitted on [`SubagentService::events`]: `start`
///   synchronously before `start` returns, `end` when the run's result settles.
/// * Each accepted run has one pending `end` emission until its result settles: the run calls
///   it back from the task that settles the result ([`SubagentRun::on_settled`]), or, for a run
///   that cannot, a task owned by the service awaits the result. [`SubagentService::close`]
///   waits for every pending emission (each completes at the latest when its run is disposed)
///   and [`SubagentService::pending_runs`] counts them, together with the starts still in
///   flight (validated, the provider's `start` not yet settled), which `close` waits for too.
///   `close` has no deadline: a run that breaks the [`SubagentRun`] contract by never settling,
///   even once disposed, keeps it waiting (bound it with a timeout if that matters to the
///   host).
#[derive(Clone)]
pub struct SubagentService {
    inner: Arc<Inner>,
}

impl Default for SubagentService {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for SubagentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentService")
            .field("providers", &self.list())
            .finish()
    }
}

impl SubagentService {
    /// An empty service.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                providers: RwLock::new(Vec::new()),
                next_key: AtomicU64::new(0),
                events: EventBus::new(),
                tasks: closed_tracker(),
            }),
        }
    }

    /// The lifecycle event bus (`subagent/provider-added`, `provider-removed`, `start`, `end`).
    /// Scoped listeners (`on_scoped(parent, …)`) hear only runs delegated by that parent.
    pub fn events(&self) -> &EventBus<SubagentEvent> {
        &self.inner.events
    }

    /// Registers a provider under its name.
    ///
    /// Fails with `DUPLICATE_PROVIDER` when the name is taken, and with `PROVIDER_FAILED` when
    /// the provider's `name()` panics (it is called once, here). After storing the provider,
    /// `subagent/provider-added` is emitted **uncontained**: if a listener fails, the
    /// registration is unwound, the listeners that had already received the addition receive
    /// `subagent/provider-removed` for it (latest first, contained), and the listener's error is
    /// returned. Dropping the returned guard
    /// removes the provider and emits `subagent/provider-removed` (contained, unscoped).
    pub fn register_provider(
        &self,
        provider: Arc<dyn SubagentProvider>,
    ) -> Result<Registration, RegisterError> {
        let name = catch_unwind(AssertUnwindSafe(|| provider.name().to_owned()))
            .map_err(|payload| panicked(None, "name()", &*payload))?;
        let unlabeled = snapshot_subagent_descriptor(&SubagentDescriptor::one_shot(name.clone(), None)).ok();
        let key = self.inner.next_key.fetch_add(1, Ordering::Relaxed);
        {
            let mut providers = self.inner.providers.write();
            if providers.iter().any(|e| *e.name == *name) {
                return Err(SubagentError::duplicate_provider(&name).into());
            }
            providers.push(Entry {
                key,
                name: name.as_str().into(),
                provider: provider.clone(),
                unlabeled,
            });
        }
        let weak = Arc::downgrade(&self.inner);
        let registered = name.clone();
        let guard = Registration::new(move || {
            if let Some(inner) = weak.upgrade() {
                let removed = {
                    let mut providers = inner.providers.write();
                    let before = providers.len();
                    providers.retain(|e| e.key != key);
                    providers.len() != before
                };
                if removed {
                    inner.events.emit(&SubagentEvent::ProviderRemoved(registered));
                }
            }
        });
        // A listener's refusal unwinds the registration: the listeners that were told of the
        // provider (a tool plugin that mounted its tool) are told of its removal; the others
        // never heard of it.
        // The provider leaves the registry before they hear it (a plugin keeps a mount over a
        // provider that is still registered).
        let unregister = || {
            self.inner.providers.write().retain(|e| e.key != key);
        };
        let removed = name.clone();
        if let Err(failure) =
            self.inner
                .events
                .try_emit_or_undo(&SubagentEvent::ProviderAdded(provider.clone()), || {
                    unregister();
                    SubagentEvent::ProviderRemoved(removed)
                })
        {
            // Unwind through the registration's own removal step, without a second removal
            // announcement.
            unregister();
            drop(guard);
            return Err(RegisterError::Listener(failure));
        }
        Ok(guard)
    }

    /// The exact provider registered under `name`.
    pub fn get_provider(&self, name: &str) -> Option<Arc<dyn SubagentProvider>> {
        self.inner
            .providers
            .read()
            .iter()
            .find(|e| *e.name == *name)
            .map(|e| e.provider.clone())
    }

    /// The provider registered under `name`, that name (shared) and its unlabeled descriptor
    /// event.
    #[allow(clippy::type_complexity)]
    fn lookup(&self, name: &str) -> Option<(Arc<dyn SubagentProvider>, Arc<str>, Option<EventData>)> {
        self.inner
            .providers
            .read()
            .iter()
            .find(|e| *e.name == *name)
            .map(|e| (e.provider.clone(), e.name.clone(), e.unlabeled.clone()))
    }

    /// Registered provider names (as registered), in insertion order.
    pub fn list(&self) -> Vec<String> {
        self.inner
            .providers
            .read()
            .iter()
            .map(|e| e.name.to_string())
            .collect()
    }

    /// Validates `request` (spec §2.5 order: provider, capabilities, depth, schema, descriptor),
    /// starts it on provider `name`, emits `subagent/start` and returns the provider's run.
    ///
    /// A panic in the provider's `capabilities` or `start` (or the new run's `id` /
    /// `local_agent`) rejects with `PROVIDER_FAILED` and leaves nothing behind; see the type's
    /// contract. Dropping the returned future before it completes leaves no service state
    /// (the provider's own rollback on drop is its contract).
    pub async fn start(
        &self,
        name: &str,
        request: SubagentStartRequest,
    ) -> Result<Box<dyn SubagentRun>, StartError> {
        let (provider, registered, unlabeled) = self
            .lookup(name)
            .ok_or_else(|| SubagentError::no_provider(name))?;
        catch_unwind(AssertUnwindSafe(|| provider.capabilities()))
            .map_err(|payload| panicked(Some(name), "capabilities()", &*payload))?
            .check(name, request.requested_capabilities())?;
        let max_depth = assert_subagent_max_depth(request.max_depth.as_ref())?;
        if let Some(schema) = &request.output_schema {
            assert_output_schema(schema)?;
        }
        let descriptor = SubagentDescriptor::one_shot(name, request.label.clone());
        let descriptor_event = match unlabeled {
            Some(event) if request.label.is_none() => event,
            _ => snapshot_subagent_descriptor(&descriptor)?,
        };
        let parent = request.parent.id().clone();
        // Admitted: from here until its `end` is emitted (or the start fails, or its future is
        // dropped) the start counts as pending, so `close` also waits for a start whose provider
        // is still building the child — not only for runs already returned.
        let pending = self.inner.tasks.token();
        // A panic in the call (before the provider built its future) is caught as well as one
        // at any poll. The call is made here, not inside an `async` block that would keep its
        // own copy of the (large) resolved request beside this future's; the resolved request
        // is built as the call's argument, not moved into it.
        let starting = catch_unwind(AssertUnwindSafe(|| {
            provider.start(ResolvedSubagentStartRequest {
                request,
                max_depth,
                descriptor,
                descriptor_event,
            })
        }))
        .map_err(|payload| panicked(Some(name), "start", &*payload))?;
        let run = AssertUnwindSafe(starting)
            .catch_unwind()
            .await
            .map_err(|payload| panicked(Some(name), "start", &*payload))??;
        let described = catch_unwind(AssertUnwindSafe(|| {
            (run.id().clone(), run.local_agent().is_some())
        }));
        let (id, local) = match described {
            Ok(described) => described,
            Err(payload) => {
                // Unpublishable: drop the run (it disposes itself in the background).
                if catch_unwind(AssertUnwindSafe(|| drop(run))).is_err() {
                    tracing::warn!(provider = name, "subagent: a run panicked when dropped");
                }
                return Err(panicked(Some(name), "run id()/local_agent()", &*payload).into());
            }
        };
        let info = RunInfo::Unminted {
            provider: registered,
            id,
            local,
            parent,
        };
        // Emit `start` — to a bus with listeners: a silent bus would drop it unheard, so the run
        // id and the event are minted only once someone may hear about the run — then move its
        // info on to the `end` edge (no copy).
        let info = if self.inner.events.has_listeners() {
            let start = SubagentEvent::Start(info.mint());
            self.inner.events.emit(&start);
            let SubagentEvent::Start(info) = start else {
                unreachable!("built as a start event just above")
            };
            RunInfo::Minted(info)
        } else {
            info
        };
        let edge = EndEdge {
            info: Some(info),
            inner: self.inner.clone(),
            _pending: pending,
        };
        let callback: SettledCallback = Box::new(move |outcome| edge.emit(outcome));
        // A panicking `on_settled` has consumed the callback: dropped, it ended the run with
        // `error`; kept, the run still owes the call.
        let refused = match catch_unwind(AssertUnwindSafe(|| run.on_settled(callback))) {
            Ok(accepted) => accepted.err(),
            Err(payload) => {
                warn_run_panicked(name, "on_settled", &*payload);
                None
            }
        };
        if let Some(callback) = refused {
            // The run cannot call back: wait for its result on a task of our own. The edge in
            // the callback holds the tracker token, so the task is counted (once) and awaited
            // by `close`.
            match catch_unwind(AssertUnwindSafe(|| run.result())) {
                Ok(result) => {
                    let provider = name.to_owned();
                    tokio::spawn(async move {
                        let outcome = AssertUnwindSafe(result).catch_unwind().await;
                        callback(&outcome.unwrap_or_else(|payload| {
                            warn_run_panicked(&provider, "its result future", &*payload);
                            Err(RunFailure::new(panicked(Some(&provider), "result", &*payload)))
                        }));
                    });
                }
                Err(payload) => {
                    warn_run_panicked(name, "result()", &*payload);
                    callback(&Err(RunFailure::new(panicked(Some(name), "result()", &*payload))));
                }
            }
        }
        Ok(run)
    }

    /// Waits for every start still in flight (admitted past validation, its provider still
    /// building the child) and every `subagent/end` emission still pending (each completes once
    /// its run's result settles, at the latest when the run is disposed). A start in flight
    /// completes when its provider fulfils or rejects — cancel its request signal to hurry it —
    /// or when its caller drops the `start` future.
    pub async fn close(&self) {
        self.inner.tasks.wait().await;
    }

    /// The number of starts in flight plus accepted runs whose `subagent/end` is still pending.
    pub fn pending_runs(&self) -> usize {
        self.inner.tasks.len()
    }
}

/// The `subagent/end` emission of one accepted run. While it exists it counts as a pending run
/// (its tracker token); dropping it without [`emit`](Self::emit) (a run that can never settle
/// dropped its callback) emits `end` with `error`, so every `start` gets its `end`.
struct EndEdge {
    info: Option<RunInfo>,
    inner: Arc<Inner>,
    _pending: TaskTrackerToken,
}

impl EndEdge {
    fn emit(mut self, outcome: &Result<SubagentResult, RunFailure>) {
        if let Some(info) = self.info.take() {
            if !self.inner.events.has_listeners() {
                // Nobody would hear it: skip copying the output into an event.
                return;
            }
            let info = info.mint();
            let end = match outcome {
                Ok(r) => SubagentRunEndInfo {
                    info,
                    last_assistant_message: r.last_assistant_message().map(<[_]>::to_vec),
                    stop_reason: r.stop_reason.clone(),
                },
                Err(_) => Self::failed(info),
            };
            self.inner.events.emit(&SubagentEvent::End(end));
        }
    }

    fn failed(info: SubagentRunInfo) -> SubagentRunEndInfo {
        SubagentRunEndInfo {
            info,
            stop_reason: StopReason::Error,
            last_assistant_message: None,
        }
    }
}

impl Drop for EndEdge {
    fn drop(&mut self) {
        if let Some(info) = self.info.take()
            && self.inner.events.has_listeners()
        {
            self.inner
                .events
                .emit(&SubagentEvent::End(Self::failed(info.mint())));
        }
    }
}

/// The lifecycle identity of one accepted run: minted (run id, provider name as a `String`) when
/// its `subagent/start` had listeners, else kept unminted until an `end` finds some. A run id
/// only identifies a run to listeners, and no listener heard of this run before then.
enum RunInfo {
    /// Announced by `subagent/start`.
    Minted(SubagentRunInfo),
    /// Not announced yet: the parts of its info, without a run id.
    Unminted {
        provider: Arc<str>,
        id: SessionId,
        local: bool,
        parent: SessionId,
    },
}

impl RunInfo {
    /// The info, minting a run id for an unannounced run.
    fn mint(self) -> SubagentRunInfo {
        match self {
            Self::Minted(info) => info,
            Self::Unminted {
                provider,
                id,
                local,
                parent,
            } => SubagentRunInfo {
                run_id: uuid_like(),
                provider: provider.to_string(),
                id,
                local,
                parent,
            },
        }
    }
}

/// `PROVIDER_FAILED` for provider code that panicked during `during`.
fn panicked(provider: Option<&str>, during: &str, payload: &(dyn Any + Send)) -> SubagentError {
    SubagentError::provider_panicked(provider, during, &panic_message(payload))
}

fn warn_run_panicked(provider: &str, during: &str, payload: &(dyn Any + Send)) {
    tracing::warn!(
        provider,
        panic = %panic_message(payload),
        "subagent: an accepted run panicked in {during}; its end edge is error"
    );
}

/// A random run id (UUID v4 text form).
fn uuid_like() -> String {
    let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    uuid::Uuid::new_v4()
        .hyphenated()
        .encode_lower(&mut buf)
        .to_owned()
}

/// A task tracker that is closed from the start and never reopened. Closing a tracker only
/// lets [`TaskTracker::wait`] resolve once it is empty; tasks are still tracked after it. So
/// waiting needs no close-wait-reopen dance, whose reopen could land between another waiter's
/// close and its first poll and leave that waiter pending until the next close.
fn closed_tracker() -> TaskTracker {
    let tasks = TaskTracker::new();
    tasks.close();
    tasks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capabilities::SubagentCapabilities;

    struct Named(&'static str);

    #[async_trait::async_trait]
    impl SubagentProvider for Named {
        fn name(&self) -> &str {
            self.0
        }

        fn capabilities(&self) -> SubagentCapabilities {
            SubagentCapabilities::ALL
        }

        fn inherits_parent_context(&self) -> bool {
            false
        }

        async fn start(
            &self,
            _request: ResolvedSubagentStartRequest,
        ) -> Result<Box<dyn SubagentRun>, SubagentError> {
            unreachable!("never started")
        }
    }

    /// The descriptor event a registration keeps for unlabeled starts is exactly the one such a
    /// start would snapshot, under the name as registered; unknown names find nothing.
    #[test]
    fn lookup_yields_the_provider_and_its_unlabeled_descriptor_snapshot() {
        let service = SubagentService::new();
        let provider: Arc<dyn SubagentProvider> = Arc::new(Named("spawn"));
        let _registration = service.register_provider(provider.clone()).unwrap();
        let (found, name, unlabeled) = service.lookup("spawn").expect("registered");
        assert!(Arc::ptr_eq(&found, &provider));
        assert_eq!(&*name, "spawn");
        let expected = snapshot_subagent_descriptor(&SubagentDescriptor::one_shot("spawn", None)).unwrap();
        assert_eq!(unlabeled, Some(expected));
        assert!(service.lookup("other").is_none());
    }
}
