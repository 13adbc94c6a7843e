//! [`install_report_tool`]: the installer body — the `report` tool and its guidance section in
//! one child's own scope — and [`ReportInstallation`], the one handle that revokes both
//! (`acp-and-tools.md` §5.1).
//!
//! # How the guards are held
//! Registering through a scoped [`Ctx`] hands the guard to the child's scope, which keeps it
//! until the child is disposed — too late for a revocation that must take effect at once. The
//! installer therefore registers in the child's layer directly (keyed by the child's id, as the
//! scoped context would) and keeps both guards in one shared slot. Two owners can empty it,
//! whichever comes first, and the second finds it empty:
//!
//! * the [`ReportInstallation`] (its [`revoke`](ReportInstallation::revoke) or its drop) — the
//!   setup contribution's release, run when the package is unloaded, the child's residency
//!   ends or its setup rolls back;
//! * a guard the child's scope adopts, so that the child's disposal removes both even when the
//!   installation is kept elsewhere.
//!
//! # Lock
//! `Slot::guards` protects the two guards; it is held only to take them out, never while a
//! guard's undo (host code) runs.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agent::bus::{BoxError, panic_message};
use agent::prompt::PromptSection;
use agent::tools::ToolDefinition;
use agent::{AgentError, Ctx, Registration, SessionId};
use parking_lot::Mutex;
use subagent::continuation::{ContinuationManager, ReportDelivery, SetupRelease};

use crate::error::{InstalledPart, ToolSubagentReportError, UndoFailure};
use crate::handler::ReportTool;
use crate::model_text;

/// The two registrations of one installation.
struct Guards {
    tool: Registration,
    section: Registration,
}

/// What the installation and the scope's guard share.
struct Slot {
    /// Set before the guards are removed: a call resolved just before the removal is refused.
    revoked: Arc<AtomicBool>,
    /// The guards, until one owner takes them.
    guards: Mutex<Option<Guards>>,
}

impl Slot {
    /// Removes both registrations if nobody has: marks the tool revoked, then undoes the tool
    /// and the section — both attempted, each undo's panic contained — and aggregates the
    /// failures. `Ok` when already revoked.
    fn revoke(&self) -> Result<(), ToolSubagentReportError> {
        self.revoked.store(true, Ordering::SeqCst);
        let Some(Guards { tool, section }) = self.guards.lock().take() else {
            return Ok(());
        };
        let failures: Vec<UndoFailure> = [(InstalledPart::Tool, tool), (InstalledPart::Section, section)]
            .into_iter()
            .filter_map(|(part, guard)| undo(part, guard).err())
            .collect();
        if failures.is_empty() {
            Ok(())
        } else {
            Err(ToolSubagentReportError::RevokeFailed { failures })
        }
    }
}

/// Undoes one registration now, containing a panic of its undo as an [`UndoFailure`].
fn undo(part: InstalledPart, guard: Registration) -> Result<(), UndoFailure> {
    catch_unwind(AssertUnwindSafe(|| guard.dispose())).map_err(|panic| UndoFailure {
        part,
        message: panic_message(&*panic),
    })
}

/// Installs the `report` tool and its `tool:report` guidance section (order 117) into the
/// agent `child` is scoped to, delivering through `manager` with `delivery`.
///
/// This is the body of the package's setup contribution, exposed so that tooling (a generated
/// tool catalog, a test) can mint the scope-local schema into a synthetic child's scope. The
/// seam calls it once per continuable child residency, inside the child's unpublished setup
/// window.
///
/// The section is registered first, then the tool. If the tool is refused (another `report`
/// in that layer, a panicking registry) the section is removed again before the error returns;
/// if that removal fails too, both failures come back as
/// [`RollbackFailed`](ToolSubagentReportError::RollbackFailed). Nothing stays registered after
/// an error.
///
/// # Errors
/// [`NotScoped`](ToolSubagentReportError::NotScoped) for the global context;
/// [`Scope`](ToolSubagentReportError::Scope) when the child's scope was disposed;
/// [`Register`](ToolSubagentReportError::Register),
/// [`RegisterPanicked`](ToolSubagentReportError::RegisterPanicked) or
/// [`RollbackFailed`](ToolSubagentReportError::RollbackFailed) as above.
///
/// # Ownership
/// The returned [`ReportInstallation`] and the child's scope share the two registrations:
/// revoking or dropping the installation removes both at once, and so does the child's
/// disposal. The tool holds the child only weakly and the manager by a clone; it keeps neither
/// alive past its removal.
pub fn install_report_tool(
    child: &Ctx,
    manager: &ContinuationManager,
    delivery: ReportDelivery,
) -> Result<ReportInstallation, ToolSubagentReportError> {
    let agent = child.agent().ok_or(ToolSubagentReportError::NotScoped)?;
    agent
        .scope()
        .ensure_active()
        .map_err(|inactive| ToolSubagentReportError::Scope(AgentError::Inactive(inactive)))?;
    let key = agent.id().clone();
    let services = &child.services;
    let section = services.prompt.section(
        Some(&key),
        PromptSection {
            name: model_text::GUIDANCE_SECTION_NAME.to_owned(),
            order: model_text::GUIDANCE_ORDER,
            text: model_text::GUIDANCE.to_owned(),
            // Guidance only while the child can see the tool.
            tool: Some(model_text::TOOL_NAME.to_owned()),
        },
    );
    let revoked = Arc::new(AtomicBool::new(false));
    let definition = ToolDefinition {
        name: model_text::TOOL_NAME.to_owned(),
        description: model_text::TOOL_DESCRIPTION.to_owned(),
        parameters: model_text::tool_parameters(),
        // Exclusive: several reports in one step are accepted in the model's call order.
        concurrency_safe: false,
        handler: Arc::new(ReportTool {
            manager: manager.clone(),
            delivery,
            child: Arc::downgrade(agent),
            revoked: revoked.clone(),
        }),
    };
    let registered = catch_unwind(AssertUnwindSafe(|| {
        services.tools.register(Some(&key), definition)
    }));
    let tool = match registered {
        Ok(Ok(tool)) => tool,
        Ok(Err(refused)) => return Err(rolled_back(ToolSubagentReportError::Register(refused), section)),
        Err(panic) => {
            let error = ToolSubagentReportError::RegisterPanicked(panic_message(&*panic));
            return Err(rolled_back(error, section));
        }
    };
    let slot = Arc::new(Slot {
        revoked,
        guards: Mutex::new(Some(Guards { tool, section })),
    });
    let scope_owned = slot.clone();
    let scope_guard = Registration::new(move || {
        if let Err(error) = scope_owned.revoke() {
            tracing::warn!(%error, "disposing a child's scope failed to remove its report tool registrations");
        }
    });
    let global = match child.own(scope_guard) {
        Ok(global) => global,
        // The scope was disposed since the check above: it undid the guard at once, which
        // revoked the slot.
        Err(inactive) => return Err(ToolSubagentReportError::Scope(inactive)),
    };
    Ok(ReportInstallation {
        slot,
        child: key,
        _unowned: global,
    })
}

/// Removes `section` after the tool's registration failed with `error`.
fn rolled_back(error: ToolSubagentReportError, section: Registration) -> ToolSubagentReportError {
    match undo(InstalledPart::Section, section) {
        Ok(()) => error,
        Err(rollback) => ToolSubagentReportError::RollbackFailed {
            registration: Box::new(error),
            rollback,
        },
    }
}

/// One installation of the report tool and its guidance in one child's scope.
///
/// # Ownership and drop
/// The installation shares its two registrations with the child's scope (see the module
/// documentation). [`revoke`](Self::revoke) — or dropping the installation, which revokes and
/// logs a failure — removes both **immediately**: the tool leaves the child's schema and its
/// next call fails, the section leaves the child's system prompt. A call already running keeps
/// running; one resolved just before the removal is refused. The child's disposal revokes too.
///
/// # Concurrency
/// `revoke` may be called from any thread and any number of times; the registrations are
/// removed exactly once, by whichever caller (or the scope) gets there first.
#[must_use = "dropping the installation revokes the report tool and its guidance at once"]
pub struct ReportInstallation {
    slot: Arc<Slot>,
    child: SessionId,
    /// The guard a context without a scope handed back; never set for the scoped contexts the
    /// installer accepts. Kept so that nothing is undone early.
    _unowned: Option<Registration>,
}

impl std::fmt::Debug for ReportInstallation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportInstallation")
            .field("child", &self.child)
            .field("revoked", &self.is_revoked())
            .finish()
    }
}

impl ReportInstallation {
    /// The agent the tool is installed for.
    pub fn child(&self) -> &SessionId {
        &self.child
    }

    /// Whether the installation was revoked (by this handle or the child's scope).
    pub fn is_revoked(&self) -> bool {
        self.slot.guards.lock().is_none()
    }

    /// Removes the tool and the section now: both removals are attempted, the tool's first,
    /// and their failures (panicking undos, contained) aggregate as
    /// [`RevokeFailed`](ToolSubagentReportError::RevokeFailed). Idempotent: later calls, and
    /// calls after the child's disposal, return `Ok`.
    pub fn revoke(&self) -> Result<(), ToolSubagentReportError> {
        self.slot.revoke()
    }

    /// The installation as the seam's [`SetupRelease`]: running it revokes, and a revocation
    /// failure becomes the release's error.
    pub fn into_release(self) -> SetupRelease {
        Box::new(move || self.revoke().map_err(|e| Box::new(e) as BoxError))
    }
}

impl Drop for ReportInstallation {
    fn drop(&mut self) {
        if let Err(error) = self.revoke() {
            tracing::warn!(%error, "dropping a report tool installation failed to remove its registrations");
        }
    }
}
