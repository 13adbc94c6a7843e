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

pub mod agent;
pub mod bus;
pub mod content;
pub mod error;
pub mod hooks;
pub mod jobs;
pub mod projection;
pub mod prompt;
pub mod registration;
pub mod runtime;
pub mod scoped;
pub mod store;
pub mod tools;
// -- pure functions over logs (module owners: see git log) --
pub mod fold;
pub mod history;
pub mod policy;
pub mod prefix;
pub mod stream_grammar;
// -- end pure functions --
pub mod event;
pub mod header;
pub mod ids;
pub mod message;
pub mod model;
pub mod session;
pub mod signal;
pub mod turn;

pub use agent::{
    Agent, AgentHandle, AgentOptions, AgentRef, AgentStatus, CancelOptions, Disposer, InboxSnapshot,
};
pub use bus::{BoxError, Carried, EventBus};
pub use content::ContentBlock;
pub use error::{AgentError, error_chain};
pub use event::{EventData, InboxSplice, InboxTarget, SessionEvent, SurfaceMeta, SurfaceOp};
pub use header::{HeaderError, Origin, SessionHeader, SessionMeta};
pub use hooks::{AgentEvent, PreStep, PreStepDecision, PreStepInterceptor, TurnStoppingHook};
pub use ids::{CallId, MessageId, SessionId};
pub use jobs::Jobs;
pub use message::{Message, MessageSource, PluginForm, Role};
pub use model::{
    FinishReason, GenerateOptions, LlmFailure, ModelAdapter, ModelStream, StreamChunk, TokenUsage, ToolSchema,
};
pub use registration::{Registration, Scope, ScopeInactive};
pub use runtime::{AgentRuntime, CreateAgentOptions, Ctx, ResumeAgentOptions, Services};
pub use session::{LogError, Session, SessionObserver};
pub use signal::{CancelCause, CancelListener, CancelOnDrop, Signal};
pub use store::{SessionPersistence, SessionStore};
pub use tools::{ToolDefinition, Tools};
pub use turn::TurnEndReason;
// -- pure functions over logs: re-exports --
pub use fold::{AsEvent, ConsumedWork, fold_consumed_work};
pub use history::{MessageList, derive_messages};
pub use policy::{ApprovalPolicy, SandboxMode, approval_override, sandbox_override};
pub use prefix::{balanced_completed_turn_prefix, next_turn_number};
pub use stream_grammar::{GrammarError, StreamGrammar, validate_stream};
