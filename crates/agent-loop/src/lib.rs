//! # The reference runtime for the agent spine
//!
//! `agent-loop` implements the contracts of the spine crate `agent`: session stores (an in-memory
//! one for tests and a JSON-lines one on disk with crash repair) and model adapters (the
//! deterministic [`ScriptedModel`] test double and, behind the `openai` feature, an
//! OpenAI-compatible streaming adapter). The turn/step driver, inbox, creation transaction,
//! scopes, tool pipeline, prompt assembly and job registry live in further modules.
//!
//! Library code here never starts an async runtime and never blocks a runtime thread: store
//! file I/O runs on tokio's blocking pool.
#![warn(missing_docs)]

pub mod model;
pub mod store;

#[cfg(feature = "openai")]
pub use model::OpenAiCompatible;
pub use model::{ScriptEntry, ScriptedModel};
pub use store::{JsonlStore, LoadedSession, MemoryStore, SessionSummary, StoreError, repair_open_turn};
pub mod agent;
mod excerpt;
pub mod jobs;
pub mod prompt;
pub mod runtime;
pub mod tools;
pub mod trace;
pub mod warnings;
