//! Delegated policy (spec §14): the sandbox-mode and approval-policy overrides a session log
//! carries, and the runtime-context sentences that describe them to the model.
//!
//! Both policies are optional services. A session's override is the value of its **last**
//! `sandbox/mode` (respectively `approval/policy`) event; without one the deployment default
//! applies, dynamically. A runtime switch appends a new event without `source`; delegation
//! seeds a child's log with `source: "delegation"` events ([`delegated_policy_events`]).

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::event::EventData;
use crate::fold::AsEvent;

/// The `source` value marking a policy event seeded into a child at delegation.
pub const DELEGATION_SOURCE: &str = "delegation";

/// Runtime-context order of the sandbox-policy sentence.
pub const SANDBOX_CONTEXT_ORDER: i32 = 110;

/// Runtime-context order of the approval-policy sentence.
pub const APPROVAL_CONTEXT_ORDER: i32 = 115;

/// Runtime-context name of the sandbox-policy sentence.
pub const SANDBOX_CONTEXT_NAME: &str = "sandbox:policy";

/// Runtime-context name of the approval-policy sentence.
pub const APPROVAL_CONTEXT_NAME: &str = "approval:policy";

/// A policy value in an event was not one this crate knows.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{value}`; expected one of {expected}")]
pub struct UnknownPolicyValue {
    /// Which policy (`sandbox mode` or `approval policy`).
    pub kind: &'static str,
    /// The value given.
    pub value: String,
    /// The accepted values, for the message.
    pub expected: &'static str,
}

/// Which file operations the sandbox lets a session's tools perform. Serialized in the spec's
/// kebab-case (`read-only`, `workspace-write`, `danger-full-access`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Sandboxed operations cannot change files.
    ReadOnly,
    /// Sandboxed operations may change files inside the session workspace.
    WorkspaceWrite,
    /// The sandbox does not restrict file changes.
    DangerFullAccess,
}

impl SandboxMode {
    /// Every mode, in order of increasing access.
    pub const ALL: [Self; 3] = [Self::ReadOnly, Self::WorkspaceWrite, Self::DangerFullAccess];

    /// The mode's wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::WorkspaceWrite => "workspace-write",
            Self::DangerFullAccess => "danger-full-access",
        }
    }
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SandboxMode {
    type Err = UnknownPolicyValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| UnknownPolicyValue {
                kind: "sandbox mode",
                value: s.to_owned(),
                expected: "read-only, workspace-write, danger-full-access",
            })
    }
}

/// Whether actions that need approval may ask for it. Serialized as `ask` or `never`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalPolicy {
    /// Approval asks go to the configured answerers (failing closed without one).
    Ask,
    /// No one is asked: every approval ask is rejected deterministically, before any answerer
    /// is consulted (the ask/decision pair is still logged).
    Never,
}

impl ApprovalPolicy {
    /// Every policy.
    pub const ALL: [Self; 2] = [Self::Ask, Self::Never];

    /// The policy's wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ask => "ask",
            Self::Never => "never",
        }
    }
}

impl fmt::Display for ApprovalPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApprovalPolicy {
    type Err = UnknownPolicyValue;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPolicyValue {
                kind: "approval policy",
                value: s.to_owned(),
                expected: "ask, never",
            })
    }
}

/// A session's sandbox-mode override: the mode of its last `sandbox/mode` event, or `None`
/// when it has none (the deployment default applies).
///
/// An event whose `mode` is not a known [`SandboxMode`] is ignored, as if it were absent: the
/// override is then the last *known* mode before it (or `None`). Such an event can only come
/// from a foreign or corrupt log, since this crate's writers only produce known modes.
pub fn sandbox_override<I>(events: I) -> Option<SandboxMode>
where
    I: IntoIterator,
    I::Item: AsEvent,
{
    events
        .into_iter()
        .fold(None, |current, e| match &e.as_event().data {
            EventData::SandboxMode { mode, .. } => mode.parse().ok().or(current),
            _ => current,
        })
}

/// A session's approval-policy override: the policy of its last `approval/policy` event, or
/// `None` when it has none (the deployment default applies).
///
/// An event whose `policy` is not a known [`ApprovalPolicy`] is ignored, as if it were
/// absent: the override is then the last *known* policy before it (or `None`).
pub fn approval_override<I>(events: I) -> Option<ApprovalPolicy>
where
    I: IntoIterator,
    I::Item: AsEvent,
{
    events
        .into_iter()
        .fold(None, |current, e| match &e.as_event().data {
            EventData::ApprovalPolicy { policy, .. } => policy.parse().ok().or(current),
            _ => current,
        })
}

/// The runtime-context sentence (order [`SANDBOX_CONTEXT_ORDER`], name
/// [`SANDBOX_CONTEXT_NAME`]) describing the active file policy. It describes the policy
/// without listing which tools exist, and tells the model to let tools report denials rather
/// than refusing work up front.
pub fn sandbox_context_sentence(mode: SandboxMode) -> String {
    match mode {
        SandboxMode::ReadOnly => "File policy: read-only. Operations run through the file sandbox cannot \
             change files right now. If a task needs a change, still try the tool and follow any \
             denial or escalation guidance it returns instead of refusing in advance."
            .to_owned(),
        SandboxMode::WorkspaceWrite => "File policy: workspace-write. Operations run through the file \
             sandbox may change files inside the session workspace (and some system temporary \
             directories); changes elsewhere are denied."
            .to_owned(),
        SandboxMode::DangerFullAccess => "File policy: danger-full-access. The file sandbox does not \
             limit which files operations may change."
            .to_owned(),
    }
}

/// [`sandbox_context_sentence`], naming the workspace root for `workspace-write` (the other
/// modes do not depend on it). The root is quoted as a JSON string so unusual characters
/// stay unambiguous.
pub fn sandbox_context_sentence_in(mode: SandboxMode, workspace_root: &Path) -> String {
    match mode {
        SandboxMode::WorkspaceWrite => {
            let root = serde_json::Value::String(workspace_root.to_string_lossy().into_owned());
            format!(
                "File policy: workspace-write. Operations run through the file sandbox may change \
                 files inside the session workspace {root} (and some system temporary directories); \
                 changes elsewhere are denied."
            )
        }
        other => sandbox_context_sentence(other),
    }
}

/// The runtime-context sentence (order [`APPROVAL_CONTEXT_ORDER`], name
/// [`APPROVAL_CONTEXT_NAME`]) saying whether approval prompts are available.
pub fn approval_context_sentence(policy: ApprovalPolicy) -> String {
    match policy {
        ApprovalPolicy::Ask => "Approval policy: ask. Actions that need approval are put to the \
             configured approvers; when none is available, the action is refused."
            .to_owned(),
        ApprovalPolicy::Never => "Approval prompts are off in this session: every action that needs \
             approval is refused automatically, so do not ask for sandbox escalation."
            .to_owned(),
    }
}

/// The events that seed a child's log with its parent's captured policy at delegation:
/// `sandbox/mode {mode, source: "delegation"}` when `sandbox` is given, then
/// `approval/policy {policy, source: "delegation"}` when `approval` is given. Empty when
/// neither is.
///
/// They are appended to the child's session during its unpublished setup window, so the
/// child's overrides fold to exactly these values from its first turn on.
pub fn delegated_policy_events(
    sandbox: Option<SandboxMode>,
    approval: Option<ApprovalPolicy>,
) -> Vec<EventData> {
    let sandbox = sandbox.map(|mode| EventData::SandboxMode {
        mode: mode.as_str().to_owned(),
        source: Some(DELEGATION_SOURCE.to_owned()),
    });
    let approval = approval.map(|policy| EventData::ApprovalPolicy {
        policy: policy.as_str().to_owned(),
        source: Some(DELEGATION_SOURCE.to_owned()),
    });
    sandbox.into_iter().chain(approval).collect()
}
