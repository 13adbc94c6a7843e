//! # Provider `fork`: an in-process child seeded with the parent's history
//!
//! [`ForkProvider`] runs each delegation as an in-process child whose log starts with the
//! parent's **balanced completed-turn prefix** (spec `inprocess-providers.md` §5): every event up
//! to and including the parent's last `turn/end`, taken once at start
//! ([`completed_turn_prefix`], the spine's
//! [`balanced_completed_turn_prefix`](subagent::agent::balanced_completed_turn_prefix)). The parent's
//! in-flight turn (delegation usually happens from inside one of its tool calls), everything
//! after its last `turn/end`, its pending inbox work, its tool view, restrictions, persona and
//! authority are all excluded; the delegated policy is re-captured live and appended after the
//! seed. With no completed parent turn the child is unseeded and behaves exactly like `spawn`.
//!
//! The child records `seedLength` and `parentSession`, its first own turn continues the parent's
//! turn numbering, and its result reads only its own events (never a seeded parent message).
//!
//! The provider advertises all four start-time capabilities and says it **does** inherit the
//! parent's context. Its continuable preparation returns the same prefix, captured once.
#![warn(missing_docs)]

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use subagent::SubagentError;
use subagent::agent::prefix::is_balanced;
use subagent::agent::{AgentRef, Registration, SessionEvent};
use subagent::capabilities::{ContinuableCreateRequest, ContinuableCreateSpec, SubagentCapabilities};
use subagent::provider::{PrepareContinuable, ResolvedSubagentStartRequest, SubagentProvider};
use subagent::run::SubagentRun;
use subagent::service::{RegisterError, SubagentService};
use subagent_inprocess::{InProcessDriver, InProcessRunOptions, StartFailure};

/// The registry name a fork provider uses by default.
pub const DEFAULT_NAME: &str = "fork";

/// The seed a fork child of `parent` gets now: the parent's balanced completed-turn prefix
/// (contiguous from seq 0, ending at its last `turn/end`), or `None` when no turn has completed
/// (the child is then created unseeded: no end-seed marker, no `seedLength`).
///
/// A one-time snapshot: later parent history never reaches the child.
///
/// For a log written by an agent loop the prefix is balanced. An ill-formed parent log (a turn
/// closed over an open step, a `tool/call` outside its step) can yield an unbalanced prefix; a
/// start (or a continuable preparation) then rejects with `PROVIDER_FAILED` (source
/// [`StartFailure::UnbalancedSeed`]) and creates nothing.
pub fn completed_turn_prefix(parent: &AgentRef) -> Option<Vec<SessionEvent>> {
    let events = parent.session().events();
    let prefix = subagent::agent::balanced_completed_turn_prefix(&events);
    (!prefix.is_empty()).then(|| prefix.iter().map(|e| (**e).clone()).collect())
}

/// The `fork` provider: in-process children seeded with the parent's completed turns.
///
/// # Ownership, drop and cancellation
/// The provider holds only its name and a (shared) [`InProcessDriver`]. Each start is
/// independent (the service may call it concurrently). A fulfilled start returns a run the
/// caller owns and must dispose; removing or dropping the provider never revokes it. A start's
/// request signal is its only cancellation (see [`subagent_inprocess::LocalRun`]).
#[derive(Clone)]
pub struct ForkProvider {
    name: String,
    driver: InProcessDriver,
}

impl fmt::Debug for ForkProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForkProvider").field("name", &self.name).finish()
    }
}

impl ForkProvider {
    /// A provider named [`DEFAULT_NAME`] over `driver`.
    pub fn new(driver: InProcessDriver) -> Self {
        Self::named(DEFAULT_NAME, driver)
    }

    /// A provider registered under `name`.
    pub fn named(name: impl Into<String>, driver: InProcessDriver) -> Self {
        Self {
            name: name.into(),
            driver,
        }
    }

    /// The driver the provider starts children with.
    pub fn driver(&self) -> &InProcessDriver {
        &self.driver
    }
}

/// Registers a [`ForkProvider`] named [`DEFAULT_NAME`] over `driver` with `service`. Dropping
/// the returned guard unregisters it without touching runs already accepted.
pub fn register(service: &SubagentService, driver: InProcessDriver) -> Result<Registration, RegisterError> {
    service.register_provider(Arc::new(ForkProvider::new(driver)))
}

#[async_trait]
impl SubagentProvider for ForkProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> SubagentCapabilities {
        SubagentCapabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        true
    }

    /// The seed (the parent's completed-turn prefix) and everything the driver captures at
    /// call time are taken when this is called, not when the future is first polled: parent
    /// history or a policy switch after the call never reaches the child. Written out rather
    /// than `async fn`, which would defer the capture to the first poll and box a second
    /// future around the driver's.
    ///
    /// A request whose signal is already cancelled gets no seed: the driver refuses it at call
    /// time (`CANCELLED`, `subagent request was aborted before child publication`, nothing
    /// created) whatever the seed, so the parent's history is not copied only to be dropped.
    fn start<'life0, 'async_trait>(
        &'life0 self,
        request: ResolvedSubagentStartRequest,
    ) -> Pin<Box<dyn Future<Output = Result<Box<dyn SubagentRun>, SubagentError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let seed = if request.request.signal.is_cancelled() {
            None
        } else {
            completed_turn_prefix(&request.request.parent)
        };
        let options = InProcessRunOptions { seed };
        self.driver.start_boxed(request, options)
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        Some(self)
    }
}

#[async_trait]
impl PrepareContinuable for ForkProvider {
    /// The same prefix, captured once at creation: it becomes part of the child's durable
    /// transcript, so a cold resume replays it instead of re-forking newer parent history.
    ///
    /// The request signal is observed (the trait's contract): an already-cancelled preparation
    /// rejects before the parent's history is read or copied.
    ///
    /// # Errors
    /// * `CANCELLED` (source [`StartFailure::AbortedBeforePublication`]) when the request signal
    ///   is already cancelled; nothing was copied or created.
    /// * `PROVIDER_FAILED` (source [`StartFailure::UnbalancedSeed`]) when the prefix is not
    ///   balanced (an ill-formed parent log), as a one-shot start of the same parent rejects: the
    ///   child could not continue it.
    async fn prepare_continuable(
        &self,
        request: ContinuableCreateRequest,
    ) -> Result<ContinuableCreateSpec, SubagentError> {
        if request.signal.is_cancelled() {
            return Err(StartFailure::AbortedBeforePublication.into());
        }
        let seed = completed_turn_prefix(&request.parent);
        if seed.as_ref().is_some_and(|s| !is_balanced(s)) {
            return Err(StartFailure::UnbalancedSeed.into());
        }
        Ok(ContinuableCreateSpec { seed })
    }
}
