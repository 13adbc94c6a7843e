//! # `subagent-cli`: the `subagent` program and the host it composes
//!
//! The library half of the command-line crate, so tests (and other programs) can drive the
//! same host in-process:
//!
//! | module | what it is |
//! |---|---|
//! | [`host`] | [`build_host`]: runtime + subagent service + `spawn`/`fork` providers + delegation tools + background jobs + JSON-lines store (+ read-only workspace tools; + continuable children with `send_message`, `interrupt_agent`, `list_agents` and `report`; + an `acp` provider and tool) |
//! | [`demo`] | the scripted coordinator of `subagent demo` and [`demo::run_demo`] |
//! | [`tree`] | the live delegation tree fed by lifecycle and status events |
//! | [`catalog`] | the stored sessions as a parent → child tree (`subagent agents`) |
//! | [`logview`] | a readable rendering of one session log (`subagent log`) |
//! | [`workspace`] | the read-only `read_file`, `list_dir` and `grep` tools (`subagent run`) |
//! | [`model_text`] | every text this crate shows a model (tool descriptions, schemas, failures, personas) |
//! | [`error`] | [`CliError`], the one-line user-facing failures |
//! | [`terminal_text`] | untrusted text (labels, ids, messages, errors) made safe to print: control and bidi characters shown as visible escapes |
//! | [`serve`] | `subagent acp`: the host's coordinator served over the Agent Client Protocol on stdio, one host per ACP session |
//! | [`interrupt`] | Ctrl-C in two stages: the first winds the work down, the second abandons it |
#![warn(missing_docs)]

pub mod catalog;
pub mod demo;
pub mod error;
pub mod host;
pub mod interrupt;
pub mod logview;
pub mod model_text;
pub mod serve;
pub mod terminal_text;
pub mod tree;
pub mod workspace;

pub use error::CliError;
pub use host::{Host, HostError, HostOptions, build_host};
