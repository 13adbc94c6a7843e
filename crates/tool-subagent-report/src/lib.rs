//! # `tool-subagent-report` — the child-scoped return channel
//!
//! A continuable subagent child's `report` tool (`acp-and-tools.md` §5): the child sends
//! selected content to the agent that started it, without ending its turn.
//!
//! The package is not a global tool. [`ReportToolPlugin::load`] registers one **setup
//! contribution** with the seam's
//! [`ContinuationManager`](subagent::continuation::ContinuationManager); the manager installs
//! it into every continuable child residency (fresh start or cold resume) inside the child's
//! unpublished setup window, so the tool and its guidance exist only in that child's own scope
//! and survive its tool filter. Roots, one-shot children, siblings and out-of-process children
//! never see it. The contribution is keyed ([`SETUP_KEY`]): a second load over the same manager
//! is refused with [`ToolSubagentReportError::AlreadyLoaded`] while the first copy is loaded.
//!
//! | module | concept |
//! |---|---|
//! | [`config`] | [`ReportToolConfig`]: the deployment's `reportDelivery` (`next-step` or `quiet`) |
//! | [`plugin`] | [`ReportToolPlugin`]: load (register the contribution), unload (revoke at once) |
//! | [`install`] | [`install_report_tool`]: the installer body, and the [`ReportInstallation`] that revokes it |
//! | [`model_text`] | every model-visible text: description, schema, guidance, rendering, refusals |
//! | [`error`] | [`ToolSubagentReportError`]: configuration, load, installation and revocation failures |
//! | `handler` | the tool body: parse `output`, deliver through `report_from` |
//!
//! # What a call guarantees
//! * Delivery is the seam's [`report_from`](subagent::continuation::ContinuationManager::report_from):
//!   the installed child is the credential, the recipient is its durable direct parent, the
//!   parent receives one user message `Background subagent <id> reported:` + `output` with the
//!   source `{kind: subagent-report, form: relay, senderSessionId}`, and the tool answers
//!   `{messageId}` rendered `report accepted by the agent that started you as message <id>`.
//!   The id means the live parent accepted the message — not that it read it.
//! * Reporting never ends the child's turn, never settles it, and creates no job.
//! * Refusals reach the model with the seam's code and text (`UNAUTHORIZED`,
//!   `ACTIVATION_CLOSING`, `PARENT_UNAVAILABLE`, `DRAINING`, `CANCELLED`); malformed arguments
//!   are `INVALID_ARGS`. A refused call delivers nothing.
//!
//! The crate depends on the spine contracts (`agent`) and the seam (`subagent`) only; it never
//! depends on a runtime.
#![warn(missing_docs)]

pub mod config;
pub mod error;
mod handler;
pub mod install;
pub mod model_text;
pub mod plugin;

pub use config::ReportToolConfig;
pub use error::{InstalledPart, ToolSubagentReportError, UndoFailure};
pub use install::{ReportInstallation, install_report_tool};
pub use plugin::{DEPENDENCIES, PLUGIN_NAME, ReportToolPlugin, SETUP_KEY};
pub use subagent::continuation::ReportDelivery;
