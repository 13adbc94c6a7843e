//! # Provider `acp`: an out-of-process child over the Agent Client Protocol
//!
//! Each start spawns a **fresh subprocess** (its own process group, a scrubbed environment,
//! piped stdin/stdout, inherited stderr), speaks ACP to it as the client over its stdio, runs
//! exactly one session with exactly one prompt turn, and returns the child's streamed assistant
//! text as the result (spec `acp-and-tools.md` §1).
//!
//! | module | concept |
//! |---|---|
//! | [`config`] | configuration and load-time validation (§1.2) |
//! | [`mod@env`] | the child environment: credential scrub, then explicit layering (§1.5) |
//! | [`process`] | spawning and the teardown ladder EOF → SIGTERM → SIGKILL (§1.11) |
//! | [`connection`] | the ACP client: fold, permission policy, stop-reason map (§1.7–§1.9) |
//! | [`provider`] | [`AcpProvider`] and its start flow (§1.6) |
//! | [`run`] | [`AcpRun`], the published run (§1.10, §1.14) |
//! | [`error`] | typed errors with the spec's messages |
//! | [`line_limit`] | a bound on one protocol line from a peer |
//! | [`utf8_guard`] | a line that is not UTF-8 is a malformed line, not a broken connection |
//!
//! The seam's out-of-process kit (`subagent::out_of_process`, `subagent::settle`) supplies the
//! cwd rules, the result settlement and the memoized run handle; this crate adds the ACP
//! transport and the process ladder. Nothing is pooled or persisted: an ACP child has no local
//! session and cannot be continued.
#![warn(missing_docs)]

pub mod config;
pub mod connection;
pub mod env;
pub mod error;
pub mod line_limit;
pub mod process;
pub mod provider;
pub mod run;
pub mod utf8_guard;

pub use config::{AcpConfig, AcpSettings, DEFAULT_PROVIDER_NAME, Graces, PermissionPolicy};
pub use error::{
    ABORTED_BEFORE_START, AcpConfigError, AcpError, AcpRegisterError, ChildOutputError, MISSING_SESSION_ID,
};
pub use line_limit::{DEFAULT_MAX_LINE, LineLimit, LineTooLong};
pub use provider::{AcpProvider, FailureSink, failure_warning, register, register_provider};
pub use run::AcpRun;
pub use utf8_guard::Utf8Guard;
