//! # `tool-subagent` — the model-facing delegation tool
//!
//! One [`SubagentToolPlugin`] binds **one provider** of the subagent service to **one
//! model-facing tool name** (`acp-and-tools.md` §3). The model never selects a provider:
//! exposing several transports means loading several instances with distinct tool names.
//!
//! | module | concept |
//! |---|---|
//! | [`config`] | [`SubagentToolConfig`], its defaults and load-time validation (§3.2, §3.10) |
//! | [`plugin`] | loading, mounting on `provider-added`, unmounting on `provider-removed` (§3.3) |
//! | [`model_text`] | every model-visible text: wordings, schema, renderings, failures (§3.4, §3.7) |
//! | [`route`] | route resolution (§3.5) |
//! | [`value`] | the canonical output value and its rendering (§3.4) |
//! | `handler` | the tool body and common request construction (§3.6) |
//! | `foreground` | start, await the result, always dispose (§3.7) |
//! | [`background`] | a one-shot run owned by a job (§3.8) |
//! | `continuable` | a continuable child started through the seam's continuation manager (§3.9) |
//!
//! The continuable route (§3.9) starts children through the host's
//! [`ContinuationManager`](subagent::continuation::ContinuationManager), given at load with
//! [`SubagentToolPlugin::load_with_continuation`]; the call answers the child's durable id and
//! the manager owns the child from then on. An instance loaded with [`SubagentToolPlugin::load`]
//! has no manager, and its continuable calls fail with `CONTINUATION_UNAVAILABLE`.
//!
//! The crate depends on the spine contracts (`agent`) and the seam (`subagent`) only; it never
//! depends on a runtime.
#![warn(missing_docs)]

pub mod background;
pub mod config;
mod continuable;
pub mod error;
mod foreground;
mod handler;
pub mod model_text;
pub mod plugin;
pub mod route;
pub mod value;

pub use config::{BackgroundMode, DEFAULT_MAX_DEPTH, MaxDepth, PROVIDER_MANAGED, SubagentToolConfig};
pub use error::ToolSubagentError;
pub use model_text::BackgroundExposure;
pub use plugin::{DEPENDENCIES, PLUGIN_NAME, SubagentToolPlugin};
pub use route::{Route, resolve_route};
pub use value::DelegationValue;
