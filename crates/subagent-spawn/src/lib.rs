//! # Provider `spawn`: a fresh in-process child
//!
//! [`SpawnProvider`] runs each delegation as a fresh child agent in this process, through the
//! shared [`InProcessDriver`] with no seed (spec `inprocess-providers.md` §4): the child's
//! conversation starts empty (its first `user/message` is its own prompt); it gets the parent's
//! `cwd`, lineage (`parentSession` = the parent's id, its own distinct id), `origin: subagent`,
//! depth parent + 1 (persisted in its header and in its options), and the parent's model and
//! output-token cap unless the request overrides them. The parent receives only the child's
//! final output (or a stop reason) — never its intermediate work.
//!
//! The provider advertises all four start-time capabilities, says it does **not** inherit the
//! parent's context, and contributes no seed to continuable children.
//!
//! It depends only on the subagent service (it registers itself there), never on the tool
//! registry: the child's tools come from the host's registry through the driver.
#![warn(missing_docs)]

use std::fmt;
use std::pin::Pin;

use async_trait::async_trait;
use std::sync::Arc;
use subagent::SubagentError;
use subagent::agent::Registration;
use subagent::capabilities::{ContinuableCreateRequest, ContinuableCreateSpec, SubagentCapabilities};
use subagent::provider::{PrepareContinuable, ResolvedSubagentStartRequest, SubagentProvider};
use subagent::run::SubagentRun;
use subagent::service::{RegisterError, SubagentService};
use subagent_inprocess::{InProcessDriver, InProcessRunOptions};

/// The registry name a spawn provider uses by default.
pub const DEFAULT_NAME: &str = "spawn";

/// The `spawn` provider: fresh in-process children.
///
/// # Ownership, drop and cancellation
/// The provider holds only its name and a (shared) [`InProcessDriver`]. Each start is
/// independent (the service may call it concurrently): its failure, result and cleanup never
/// touch another's. A fulfilled start returns a run the caller owns and must dispose; removing
/// or dropping the provider never revokes such a run. A start's request signal is its only
/// cancellation (see [`subagent_inprocess::LocalRun`]).
#[derive(Clone)]
pub struct SpawnProvider {
    name: String,
    driver: InProcessDriver,
}

impl fmt::Debug for SpawnProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpawnProvider").field("name", &self.name).finish()
    }
}

impl SpawnProvider {
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

/// Registers a [`SpawnProvider`] named [`DEFAULT_NAME`] over `driver` with `service`. Dropping
/// the returned guard unregisters it (emitting `subagent/provider-removed`) without touching
/// runs already accepted.
pub fn register(service: &SubagentService, driver: InProcessDriver) -> Result<Registration, RegisterError> {
    service.register_provider(Arc::new(SpawnProvider::new(driver)))
}

#[async_trait]
impl SubagentProvider for SpawnProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> SubagentCapabilities {
        SubagentCapabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        false
    }

    /// The driver's start, returned as is (written out rather than `async fn`, which would box
    /// a second future around the driver's boxed one and move the request into it first).
    fn start<'life0, 'async_trait>(
        &'life0 self,
        request: ResolvedSubagentStartRequest,
    ) -> Pin<Box<dyn Future<Output = Result<Box<dyn SubagentRun>, SubagentError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.driver.start_boxed(request, InProcessRunOptions::fresh())
    }

    fn continuable(&self) -> Option<&dyn PrepareContinuable> {
        Some(self)
    }
}

#[async_trait]
impl PrepareContinuable for SpawnProvider {
    /// A spawned child starts fresh: no seed.
    async fn prepare_continuable(
        &self,
        _request: ContinuableCreateRequest,
    ) -> Result<ContinuableCreateSpec, SubagentError> {
        Ok(ContinuableCreateSpec::default())
    }
}
