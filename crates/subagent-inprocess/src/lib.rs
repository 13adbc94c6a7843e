//! # The shared in-process one-shot subagent driver
//!
//! One implementation of an in-process delegation (spec `inprocess-providers.md` §3), shared by
//! the `spawn` provider (a fresh child) and the `fork` provider (a child seeded with the
//! parent's balanced completed-turn prefix); they differ only in
//! [`InProcessRunOptions::seed`]. Continuable children never pass through here.
//!
//! [`InProcessDriver::start`] owns, in order:
//!
//! 1. **validation before anything exists** — `maxDepth`, an already-cancelled request
//!    signal, the child's depth (the seam's depth arithmetic), all at call time;
//! 2. **delegated policy capture** at call time (the seam's capture), so a later parent switch
//!    never reaches the child;
//! 3. **the creation transaction** through the host's [`AgentRuntime`](subagent::agent::AgentRuntime)
//!    (`services.agents.create`, owned by the parent's scope, with the request signal as the
//!    creation token) and its setup window: policy events after any seed, the child composition
//!    (delegation statement at order 120, persona, tool filter — the seam's
//!    [`apply_child_composition`](subagent::compose::apply_child_composition)), the structured
//!    runtime ([`structured`]), and the descriptor interceptor ([`descriptor`]);
//! 4. **publication = fulfilment**: any failure before it rolls back and quiesces; after it the
//!    request signal is handed to the live run, the prompt delivered, and the caller owns a
//!    [`LocalRun`];
//! 5. **the result**, derived from the child's own events with the seam's rules ([`result`]);
//! 6. **quiescent, memoized disposal** of the child through its handle.
//!
//! Every rule that also applies elsewhere (depth, policy, composition, output fold, stop-reason
//! map, schema validation) is the seam's (`subagent`); this crate only sequences them.
#![warn(missing_docs)]

pub mod descriptor;
pub mod driver;
pub mod error;
pub mod model_text;
pub mod result;
pub mod run;
pub mod structured;

pub use driver::{InProcessDriver, InProcessRunOptions};
pub use error::{ABORTED_BEFORE_PUBLICATION, StartFailure};
pub use model_text::{STRUCTURED_OUTPUT_INSTRUCTION, STRUCTURED_OUTPUT_TOOL};
pub use result::derive_result;
pub use run::{HandleDisposalFailed, LocalRun};
pub use structured::StructuredCapture;
