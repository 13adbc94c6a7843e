//! The companion contract (providers §6.2, §6.7): one companion per package, registered under
//! the package's exact name, and the standard composition of the live ones.

use std::sync::Arc;

use crate::agent_status::{AGENT_PACKAGE, AgentStatusCompanion};
use crate::registry::{Installer, InvariantRegistry, Registration, RegistryError};
use crate::request::{AGENT_LOOP_PACKAGE, RequestCheck};
use crate::seam::{SUBAGENT_PACKAGE, SeamLifecycleCompanion};
use crate::violation::Violation;

/// Packages whose companion is empty, each with the justification the contract requires next
/// to it. They still register (with [`Installer::empty`]) so that name reservation and
/// selection behave as for every other package.
pub const EMPTY_COMPANIONS: &[(&str, &str)] = &[
    (
        "subagent-inprocess",
        "No runtime invariant: the shared in-process driver has no independent event sequence or mutable data relation beyond the contracts enforced at the owning seam and the session log.",
    ),
    (
        "subagent-spawn",
        "No runtime invariant: the spawn provider is a configuration of the in-process driver and adds no independent event sequence or mutable data relation.",
    ),
    (
        "subagent-fork",
        "No runtime invariant: the fork provider is a configuration of the in-process driver; its seed is checked by the session-log rules (SEED, FORK-SEED).",
    ),
];

/// Registers every [`EMPTY_COMPANIONS`] entry. On failure the ones already registered are
/// disposed (dropped) and the error is returned.
pub fn register_empty_companions(registry: &InvariantRegistry) -> Result<Vec<Registration>, RegistryError> {
    EMPTY_COMPANIONS
        .iter()
        .map(|(package, _justification)| registry.register(package, Installer::empty()))
        .collect()
}

/// The live companions of §6.6 that a host can mount: agent status (**G1**), request
/// reconstruction (**L1–L8**) and the seam's lifecycle (**B1–B8**).
#[derive(Debug)]
pub struct StandardCompanions {
    /// `agent`.
    pub agent: Arc<AgentStatusCompanion>,
    /// `agent-loop` (wrap the runtime's adapters with [`RequestCheck::wrap`]).
    pub request: Arc<RequestCheck>,
    /// `subagent`.
    pub seam: Arc<SeamLifecycleCompanion>,
}

impl Default for StandardCompanions {
    fn default() -> Self {
        Self::new()
    }
}

impl StandardCompanions {
    /// Fresh companions.
    pub fn new() -> Self {
        Self {
            agent: AgentStatusCompanion::new(),
            request: RequestCheck::new(),
            seam: SeamLifecycleCompanion::new(),
        }
    }

    /// Registers the three live companions under their package names, then the
    /// [`EMPTY_COMPANIONS`]. The registry must provide `EventBus<AgentEvent>`,
    /// `Arc<dyn SessionStore>` and `SubagentService` (for the selected packages). On failure
    /// everything registered so far is disposed (dropped) and the error is returned.
    pub fn register(&self, registry: &InvariantRegistry) -> Result<Vec<Registration>, RegistryError> {
        let mut out = vec![
            registry.register(AGENT_PACKAGE, self.agent.installer())?,
            registry.register(AGENT_LOOP_PACKAGE, self.request.installer())?,
            registry.register(SUBAGENT_PACKAGE, self.seam.installer())?,
        ];
        out.extend(register_empty_companions(registry)?);
        Ok(out)
    }

    /// Every violation the three companions have found, companion by companion.
    pub fn violations(&self) -> Vec<Violation> {
        let mut out = self.agent.violations();
        out.extend(self.request.violations());
        out.extend(self.seam.violations());
        out
    }
}
