//! Model adapters: the deterministic [`ScriptedModel`] test double (and [`Trickle`], which spaces
//! any adapter's chunks one scheduling point apart) and, behind the `openai` feature,
//! `OpenAiCompatible` for any OpenAI-compatible chat-completions endpoint.
//!
//! Both implement [`agent::ModelAdapter`]: every stream they return obeys the grammar of spec
//! §13.2 (block-start / delta / block-end carrying the assembled block, at most one usage,
//! exactly one final `finish`) and observes the request's [`Signal`](agent::Signal).

pub mod chunks;
mod scripted;
mod trickle;

#[cfg(feature = "openai")]
mod openai;

pub use scripted::{HANG_SLOW_DELAY, Responder, ScriptEntry, ScriptedModel};
pub use trickle::Trickle;

#[cfg(feature = "openai")]
pub use openai::{OpenAiCompatible, OpenAiConfig};

/// The failure of a call its request signal cancelled: code `ABORTED`, the cause as message.
pub(crate) fn aborted_failure(signal: &agent::Signal) -> agent::LlmFailure {
    let cause = signal
        .cause()
        .map_or_else(|| "cancelled".to_owned(), |c| c.to_string());
    agent::LlmFailure::new("ABORTED", cause)
}
