//! # The subagent seam
//!
//! One agent (the *parent*) delegates work to a *child* agent through a **named provider**;
//! many providers coexist behind one service. This crate is the seam's vocabulary and its pure
//! rules — everything providers, tools and hosts share so each rule exists exactly once:
//!
//! | module | concept (spec `subagent-seam.md`) |
//! |---|---|
//! | [`error`] | [`SubagentError`] and its stable [`SubagentErrorCode`]s (§3) |
//! | [`result`] | [`SubagentResult`], the open [`StopReason`] set, the diagnostic bound, the turn-end → stop-reason map (§2.8) |
//! | [`output`] | the assistant-output fold (§2.9) |
//! | [`schema`] | the output-schema subset and structured-value validation (§2.10) |
//! | [`depth`] | delegation-depth arithmetic (§2.11) |
//! | [`descriptor`] | the durable, versioned `subagent/descriptor` event (§2.12) |
//! | [`capabilities`] | start-time capabilities and continuable preparation data (§2.3, §2.14.3) |
//! | [`policy`] | delegated sandbox/approval policy capture and append (§2.15) |
//! | [`composition`] | child composition data and child session metadata (§2.16, §2.14.4) |
//! | [`model_text`] | every text the seam shows a model (§2.16, §2.14.8, §2.14.10) |
//! | [`settle`] | `settle_run` and the out-of-process result settlement and run handle (§2.19) |
//! | [`provider`], [`run`] | the provider contract, the start request and the caller-owned run (§2.4–§2.7) |
//! | [`service`], [`events`] | `SubagentService`: the provider registry, `start`, lifecycle events (§2.1, §2.2, §2.5, §2.13) |
//! | [`continuation`] | the continuation manager: continuable children (§2.14, first slice) |
//! | [`listing`] | `list_children` and `list_descendants` (§2.18) |
//! | [`out_of_process`] | out-of-process configuration checks (§2.19) |
//!
//! The crate depends on the spine contracts (`agent`) and never on a runtime. Child-level
//! failures are values ([`StopReason`] plus a diagnostic), never `Err`; `Err` is reserved for
//! infrastructure faults and refused operations. Nothing here panics on bad input, bad logs or a
//! misbehaving provider.
#![warn(missing_docs)]

/// The spine contracts, re-exported so providers and tools depend on the seam alone.
pub use agent;

pub mod capabilities;
pub mod composition;
// Applying a child composition to a live scope (module owner: the in-process driver helper).
pub mod compose;
pub mod continuation;
pub mod depth;
pub mod descriptor;
pub mod error;
pub mod listing;
pub mod model_text;
pub mod out_of_process;
pub mod output;
pub mod policy;
pub mod projection;
pub mod result;
pub mod schema;
pub mod settle;
// -- the service half: provider contract, runs, lifecycle events, the service --
pub mod events;
pub mod provider;
pub mod run;
pub mod service;

pub use capabilities::{
    Capability, ContinuableCreateRequest, ContinuableCreateSpec, NO_START_CAPABILITIES,
    RequestedCapabilities, SubagentCapabilities,
};
pub use composition::{ChildComposition, ToolFilter, child_session_meta, resolve_child_agent_options};
pub use depth::{
    DepthError, DepthValue, SubagentDepthError, agent_delegation_depth, assert_subagent_max_depth,
    delegation_depth_of, resolve_child_depth, resolve_child_depth_of,
};
pub use descriptor::{
    ContinuableDescriptor, CorruptDescriptor, DescriptorMode, DescriptorSnapshotError, DescriptorState,
    OneShotDescriptor, SUBAGENT_DESCRIPTOR_EVENT, SUBAGENT_DESCRIPTOR_VERSION, SubagentDescriptor,
    fold_subagent_descriptor, parse_subagent_descriptor, seed_descriptor_turn, snapshot_subagent_descriptor,
};
pub use error::{SharedError, SubagentError, SubagentErrorCode, error_chain};
pub use model_text::SUBAGENT_DELEGATION_CONTEXT;
pub use out_of_process::{
    OutOfProcessError, assert_positive_finite, assert_usable_cwd, resolve_child_cwd, validate_configured_cwd,
};
pub use output::{AssistantOutputFold, final_assistant_output, final_assistant_output_of};
pub use policy::{
    DelegatedPolicyOverrides, PolicyServices, append_delegated_policy_overrides,
    capture_delegated_policy_overrides,
};
pub use result::{
    MAX_DIAGNOSTIC_BYTES, StopReason, SubagentResult, cap_diagnostic, epoch_stop_reason,
    one_shot_stop_reason, stop_reason_for_turn_end,
};
pub use schema::{StructuredValueError, assert_output_schema, assert_supported_schema, validate_structured};
pub use settle::{
    AbortListener, RunOutcome, RunSettlement, SubprocessRunHandle, SubprocessRunParts, settle_run,
    settle_run_result,
};
