//! # Spine contracts for the subagent seam
//!
//! This crate is everything a host must provide for the subagent family, as Rust types and
//! traits, with no runtime inside: identifiers, content blocks and messages, the session event
//! log and header, cancellation ([`Signal`]), a scoped event bus, and the host traits
//! ([`Agent`], [`AgentRuntime`], [`SessionStore`], [`Tools`], [`ModelAdapter`], [`Jobs`]).
//! Pure functions over logs live here too: the consumed-work fold, the balanced completed-turn
//! prefix and derived history.
//!
//! The crate never starts an async runtime and never blocks one. It knows nothing of
//! subagents: capability crates add log-only event types by name and the log keeps unknown
//! types losslessly.
#![warn(missing_docs)]

pub mod content;
pub mod event;
pub mod header;
pub mod ids;
pub mod message;
pub mod model;
pub mod session;
pub mod signal;
pub mod turn;

pub use content::ContentBlock;
pub use event::{EventData, InboxSplice, InboxTarget, SessionEvent, SurfaceMeta, SurfaceOp};
pub use header::{HeaderError, Origin, SessionHeader, SessionMeta};
pub use ids::{CallId, MessageId, SessionId};
pub use message::{Message, MessageSource, PluginForm, Role};
pub use model::{
    FinishReason, GenerateOptions, LlmFailure, ModelAdapter, ModelStream, StreamChunk, TokenUsage, ToolSchema,
};
pub use session::{LogError, Session, SessionObserver};
pub use signal::{CancelCause, Signal};
pub use turn::TurnEndReason;
