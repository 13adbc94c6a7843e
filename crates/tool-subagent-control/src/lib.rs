//! # `tool-subagent-control` — the parent-side control tools
//!
//! The model-facing controls for continuable subagents (`acp-and-tools.md` §4), registered
//! **once** per host in the global tool layer — not per provider — so every delegation tool
//! instance shares one control surface:
//!
//! | plugin | tools | requires |
//! |---|---|---|
//! | [`SubagentControlPlugin`] ([`PLUGIN_NAME`]) | `send_message`, `interrupt_agent` | [`DEPENDENCIES`]: the tool registry and the subagent service's continuation manager |
//! | [`ListAgentsPlugin`] ([`LIST_AGENTS_PLUGIN_NAME`]) | `list_agents` | [`LIST_AGENTS_DEPENDENCIES`]: the tool registry, the child listing and the live agent registry |
//!
//! | module | concept |
//! |---|---|
//! | [`control`] | the root plugin: loading and unloading `send_message` and `interrupt_agent` (§4.1) |
//! | `send_message` | one follow-up turn through `ContinuationManager::followup_with` (§4.2) |
//! | `interrupt` | a current-turn stop through `ContinuationManager::interrupt` (§4.3) |
//! | [`list_agents`] | the listing plugin, its projection and rendering (§4.4) |
//! | [`model_text`] | every model-visible text: descriptions, schemas, renderings, refusals |
//! | [`error`] | [`ControlToolError`], a load failure |
//!
//! The tools are thin adapters: residency, cold resume, authority and listing belong to the seam
//! (`subagent::continuation`, `subagent::listing`); the tools parse arguments, name the calling
//! agent, and render the seam's answer or refusal. None of them is needed for continuable
//! delegation to work, and they own only the parent→child direction.
//!
//! The crate depends on the spine contracts and the seam (`subagent`, which re-exports `agent`)
//! only; it never depends on a runtime.
#![warn(missing_docs)]

pub mod control;
pub mod error;
mod failure;
mod interrupt;
pub mod list_agents;
pub mod model_text;
mod send_message;

pub use control::{DEPENDENCIES, PLUGIN_NAME, SubagentControlPlugin};
pub use error::ControlToolError;
pub use interrupt::InterruptAccepted;
pub use list_agents::{
    AgentListing, LIST_AGENTS_DEPENDENCIES, LIST_AGENTS_PLUGIN_NAME, ListAgentsPlugin, ListScope,
    ListedAgent, ListedStatus, TreePosition,
};
pub use send_message::MessageQueued;
