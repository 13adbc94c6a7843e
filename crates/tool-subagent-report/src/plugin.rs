//! [`ReportToolPlugin`]: the loaded package — one continuable-child setup contribution
//! (`acp-and-tools.md` §5.1).

use std::fmt;
use std::sync::Arc;

use agent::Ctx;
use agent::bus::BoxError;
use subagent::SubagentError;
use subagent::continuation::{ContinuableSetupRegistration, ContinuationManager, SetupRelease};

use crate::config::ReportToolConfig;
use crate::error::ToolSubagentReportError;
use crate::install::{ReportInstallation, install_report_tool};

/// The package's name.
pub const PLUGIN_NAME: &str = "tool-subagent-report";

/// The key the package's setup contribution is registered under
/// ([`register_continuable_setup_keyed`](ContinuationManager::register_continuable_setup_keyed)):
/// one manager holds at most one live registration under it, so the package is loaded at most
/// once per manager.
pub const SETUP_KEY: &str = PLUGIN_NAME;

/// The host services the package requires: the subagent service (its continuation manager),
/// the tool registry and the system prompt. Installation uses the latter two only through each
/// child's scoped context, but declaring them makes a host missing one fail at load rather than
/// at the next child's creation.
pub const DEPENDENCIES: [&str; 3] = ["subagents", "tools", "systemPrompt"];

/// The loaded report package.
///
/// Loading registers **one setup contribution** with the continuation manager and nothing
/// else: no global tool, no global prompt section, no parent-side control. From then on every
/// continuable child residency the manager materializes — a fresh start or a cold resume —
/// gets, in its own scope, the `report` tool and the `tool:report` guidance section; roots,
/// one-shot children, siblings and out-of-process children never do. Children already resident
/// when the package loads are not retrofitted: the grant applies from a child's next residency.
///
/// # Ownership and drop
/// The plugin owns the contribution's registration. [`unload`](Self::unload) — or dropping
/// the plugin, which logs a failure instead of returning it — removes the contribution and
/// revokes the tool and section from every resident child **immediately** (their next call
/// fails), and a child still being set up fails its start or resume with
/// `ACTIVATION_SETUP_REVOKED`. Each installation is removed exactly once, whether by the
/// unload, the child's settlement or its disposal. While loaded, the contribution holds a clone
/// of the manager (the manager holds the contribution): unload or drop the plugin before
/// dropping the host.
///
/// # Concurrency
/// Installation runs synchronously inside each child's setup window, on whichever thread
/// creates the child; `unload` may run concurrently with it from any thread.
pub struct ReportToolPlugin {
    config: ReportToolConfig,
    registration: ContinuableSetupRegistration,
}

impl fmt::Debug for ReportToolPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReportToolPlugin")
            .field("config", &self.config)
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

impl ReportToolPlugin {
    /// Loads the package over `manager` (the host's continuation manager): registers the setup
    /// contribution that installs the report tool with `config`'s delivery policy, under
    /// [`SETUP_KEY`].
    ///
    /// # Once per manager
    /// While a copy of the package is loaded over `manager`, another load is refused here, at
    /// load time, and changes nothing: the loaded copy keeps installing exactly one `report`
    /// tool per continuable child. Once that copy is [unloaded](Self::unload) (or dropped), the
    /// package can be loaded again. Loads over different managers are independent.
    ///
    /// # Errors
    /// [`AlreadyLoaded`](ToolSubagentReportError::AlreadyLoaded) — its source the seam's
    /// `SETUP_ALREADY_REGISTERED` refusal — while a copy is loaded over `manager`.
    pub fn load(
        manager: &ContinuationManager,
        config: ReportToolConfig,
    ) -> Result<Self, ToolSubagentReportError> {
        let delivery = config.report_delivery;
        let delivering = manager.clone();
        let registration = manager
            .register_continuable_setup_keyed(
                SETUP_KEY,
                Arc::new(move |child: &Ctx| -> Result<SetupRelease, BoxError> {
                    install_report_tool(child, &delivering, delivery)
                        .map(ReportInstallation::into_release)
                        .map_err(|e| Box::new(e) as BoxError)
                }),
            )
            .map_err(ToolSubagentReportError::AlreadyLoaded)?;
        Ok(Self { config, registration })
    }

    /// The configuration the package was loaded with.
    pub fn config(&self) -> &ReportToolConfig {
        &self.config
    }

    /// Whether the contribution is still registered (the package was not unloaded).
    pub fn is_loaded(&self) -> bool {
        !self.registration.is_removed()
    }

    /// Unloads the package: removes the contribution and revokes every installation at once
    /// (see the type's documentation). Idempotent.
    ///
    /// # Errors
    /// Every installation's revocation is attempted; if any failed, the seam's
    /// `ACTIVATION_SETUP_RELEASE_FAILED` counting them, with their failures as causes. The
    /// package is unloaded regardless.
    pub fn unload(&self) -> Result<(), SubagentError> {
        self.registration.remove()
    }
}
