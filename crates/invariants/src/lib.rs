//! # Invariants over session logs
//!
//! A streaming rule engine over `agent` session logs, usable offline and online:
//!
//! * **Per event** — [`SessionReplay`] is a state machine fed one [`agent::SessionEvent`] at a
//!   time. It implements the session rules S1–S14 of `inprocess-providers.md` §6.4, the envelope
//!   rules a live session enforces (contiguous seqs, surface markers), the log-visible
//!   companions of §6.5 (approval A1–A3, sandbox X1), and, given the header, the seed layout of a
//!   fork child and a subagent child's own `subagent/descriptor`. [`SessionReplay::check`] is
//!   pure (a veto needs that); [`SessionReplay::push`] checks and advances.
//! * **Offline** — [`replay_log`] replays a log in memory; [`replay_jsonl_reader`],
//!   [`replay_jsonl_file`] and [`replay_dir`] read the JSON-lines store format (line 1 the
//!   header, then one event per line, directories walked recursively). Malformed input becomes
//!   typed [`Violation`]s (`PARSE`, `TORN`, `HEADER`, `IO`), never a panic. [`check_store`]
//!   adds the rules between sessions (parent depth, fork seed equality, unique ids).
//! * **Online** — [`InvariantObserver`] is an [`agent::SessionObserver`]: its pre-commit check
//!   runs the same state machine against the candidate and vetoes an append that breaks a rule,
//!   leaving the log unchanged; the post-commit notification applies the staged transition.
//! * **Live companions** (providers §6.6) — checks over notifications and requests that never
//!   reach a log: [`AgentStatusCompanion`] (agent status, G1) on the runtime's
//!   `EventBus<AgentEvent>`, [`RequestCheck`] with its adapter wrapper [`CheckedModel`]
//!   (request reconstruction, L1–L8) and [`SeamLifecycleCompanion`] (the seam's provider and
//!   run lifecycle, B1–B8) on a `SubagentService`'s bus. Each records [`Violation`]s with the
//!   same shape and vetoes where the reference does.
//! * **Registry** (providers §6.1, §6.2) — [`InvariantRegistry`] selects companions by package
//!   name (allow/block lists of regular expressions), reserves names, runs each selected
//!   installer in its own child scope and rolls everything back on failure;
//!   [`StandardCompanions`] mounts the live companions and the empty ones.
//!
//! Every finding names its session, the event's seq, the [`RuleId`] and what was expected.
//!
//! ```
//! use invariants::{RuleId, replay_log, synthetic};
//!
//! let mut log = synthetic::valid_log("s", 2, 2, 1);
//! assert!(replay_log(Some(&log.header), &log.events).is_clean());
//!
//! // Drop the first turn's `turn/end`: the second `turn/start` finds turn 1 still open.
//! let end = log.events.iter().position(|e| e.type_name() == "turn/end").unwrap();
//! log.events.remove(end);
//! let report = replay_log(Some(&log.header), &log.events);
//! assert!(report.of_rule(RuleId::S2).any(|v| v.seq == Some(end as u64 + 1)));
//! ```
#![warn(missing_docs)]

mod agent_status;
mod companions;
mod jsonl;
mod lineage;
mod observer;
mod policy;
pub mod registry;
mod replay;
mod request;
mod rule;
mod seam;
mod store;
pub mod synthetic;
mod trace;
mod violation;

pub use agent_status::{AGENT_PACKAGE, AgentStatusCompanion};
pub use companions::{EMPTY_COMPANIONS, StandardCompanions, register_empty_companions};
pub use jsonl::{DirReport, MAX_LINE_BYTES, ReadError, replay_dir, replay_jsonl_file, replay_jsonl_reader};
pub use lineage::DESCRIPTOR_TYPE;
pub use observer::InvariantObserver;
pub use policy::{APPROVAL_OUTCOMES, APPROVAL_POLICIES, SANDBOX_MODES};
pub use registry::{
    AsyncInstaller, ConfigError, InstallCx, Installer, InvariantError, InvariantFailure, InvariantRegistry,
    Registration, RegistryConfig, RegistryError,
};
pub use replay::{Finish, Report, SessionReplay, UNKNOWN_SESSION, header_violations, replay_log};
pub use request::{AGENT_LOOP_PACKAGE, CheckedModel, INVARIANT_FAILURE_CODE, RequestCheck, SessionLookup};
pub use rule::RuleId;
pub use seam::{PROVIDER_REGISTRY_SESSION, SUBAGENT_PACKAGE, SeamLifecycleCompanion};
pub use store::check_store;
pub use trace::TOOL_NOT_STARTED;
pub use violation::Violation;
