//! Delegated policy (spec §2.15): fixing a child's permission scope at the delegation boundary.
//!
//! Both in-process delegation paths capture the parent's policy once —
//! **synchronously, before the start's first `.await`**, so a later parent switch belongs to the
//! parent's future — and append it to the child's own log during the unpublished setup window,
//! after any fork seed. The child's effective policy is then reconstructable from its log alone:
//! the latest `sandbox/mode` / `approval/policy` event wins, so fresh delegation events beat
//! stale seeded state and a later child-side switch still beats them.
//!
//! * Sandbox: only the parent session's **explicit** override (its latest `sandbox/mode`
//!   event) is copied, and only when a sandbox-policy service is composed; deployment defaults
//!   and one-shot grants never are. An unswitched parent stamps nothing, and its child follows
//!   the deployment default dynamically.
//! * Approval: pinned to `never` whenever an approval service is composed, regardless of the
//!   parent's own policy, so every child ask is rejected deterministically.
//!
//! A continuable child captures only at its start and appends only on fresh materialization; a
//! cold resume replays the persisted events and never re-captures.

use agent::policy::{
    ApprovalPolicy, SandboxMode, approval_override, delegated_policy_events, sandbox_override,
};
use agent::session::LogError;
use agent::{EventData, Session};

pub use agent::policy::DELEGATION_SOURCE;

/// Which optional policy services the host composes (both are optional; the seam probes them
/// and does nothing for an absent one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyServices {
    /// A sandbox-policy service is present.
    pub sandbox_policy: bool,
    /// An approval service is present.
    pub approval: bool,
}

impl PolicyServices {
    /// Both services present.
    pub const ALL: Self = Self {
        sandbox_policy: true,
        approval: true,
    };
}

/// The policy captured at one delegation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DelegatedPolicyOverrides {
    /// The parent session's explicit sandbox-mode override, or `None` without one or without a
    /// sandbox-policy service.
    pub sandbox_mode: Option<SandboxMode>,
    /// [`ApprovalPolicy::Never`] whenever an approval service is present (regardless of the
    /// parent's own policy), `None` otherwise.
    pub approval_policy: Option<ApprovalPolicy>,
}

impl DelegatedPolicyOverrides {
    /// The delegation events for these overrides, in append order: `sandbox/mode {mode,
    /// source: delegation}` (only when a mode was captured), then `approval/policy {policy,
    /// source: delegation}` (only when approval is pinned).
    pub fn events(&self) -> Vec<EventData> {
        delegated_policy_events(self.sandbox_mode, self.approval_policy)
    }
}

/// Captures the policy to seed into one delegation from the parent's session (spec §2.15
/// `captureDelegatedPolicyOverrides`): the parent's explicit sandbox override (its latest
/// `sandbox/mode`, via [`agent::policy::sandbox_override`]) when a sandbox-policy service is
/// present, and the approval pin `never` when an approval service is present.
///
/// Call it in the non-async prefix of the start, before its first `.await`. The result is a
/// snapshot: later appends to the parent do not change it.
pub fn capture_delegated_policy_overrides(
    parent: &Session,
    services: PolicyServices,
) -> DelegatedPolicyOverrides {
    DelegatedPolicyOverrides {
        sandbox_mode: if services.sandbox_policy {
            sandbox_override(parent.events().iter())
        } else {
            None
        },
        approval_policy: services.approval.then_some(ApprovalPolicy::Never),
    }
}

/// Appends the captured policy to the (unpublished) child session (spec §2.15
/// `appendDelegatedPolicyOverrides`), in the order of [`DelegatedPolicyOverrides::events`].
/// Call it during the child's setup window, after any fork seed. A refused append is returned
/// as the log's error; the creation must then roll back.
pub fn append_delegated_policy_overrides(
    child: &Session,
    overrides: &DelegatedPolicyOverrides,
) -> Result<(), LogError> {
    for data in overrides.events() {
        child.record(data, None)?;
    }
    Ok(())
}

/// The policy a child's own log folds to, as `(sandbox, approval)` overrides: the latest
/// `sandbox/mode` and `approval/policy` events, so later child-side switches beat the
/// delegation events and delegation events beat stale seeded state.
pub fn effective_policy(child: &Session) -> (Option<SandboxMode>, Option<ApprovalPolicy>) {
    let events = child.events();
    (sandbox_override(events.iter()), approval_override(events.iter()))
}

/// Helpers for this crate's policy tests.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use agent::SessionEvent;

    /// Logs a session's own (non-delegated) sandbox switch.
    pub(crate) fn switch_sandbox(s: &Session, mode: SandboxMode) {
        s.append(
            EventData::SandboxMode {
                mode: mode.as_str().into(),
                source: None,
            },
            None,
        )
        .unwrap();
    }

    /// The `sandbox/mode` and `approval/policy` events among `events`: (type, value, source).
    pub(crate) fn policy_events<'a>(
        events: impl IntoIterator<Item = &'a SessionEvent>,
    ) -> Vec<(String, String, Option<String>)> {
        events
            .into_iter()
            .filter_map(|e| match &e.data {
                EventData::SandboxMode { mode, source } => {
                    Some(("sandbox/mode".into(), mode.clone(), source.clone()))
                }
                EventData::ApprovalPolicy { policy, source } => {
                    Some(("approval/policy".into(), policy.clone(), source.clone()))
                }
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::switch_sandbox;
    use super::*;
    use agent::{SessionEvent, SessionMeta};

    fn session(id: &str, seed: Option<Vec<SessionEvent>>) -> Session {
        let header = SessionMeta::default().into_header(id.into(), 1).unwrap();
        Session::new(header, seed).unwrap()
    }

    fn sandbox_of(s: &Session) -> Option<SandboxMode> {
        effective_policy(s).0
    }

    fn policy_events(s: &Session) -> Vec<(String, String, Option<String>)> {
        test_support::policy_events(s.events().iter().map(|e| &**e))
    }

    /// spec: §2.15 — a parent override `danger-full-access` with no approval override gives the
    /// child exactly `sandbox/mode` then `approval/policy`, both `source: delegation`; the
    /// child's log folds to that policy; the parent still has no approval override.
    #[test]
    fn parent_override_is_appended_in_order() {
        let parent = session("parent", None);
        switch_sandbox(&parent, SandboxMode::DangerFullAccess);
        let captured = capture_delegated_policy_overrides(&parent, PolicyServices::ALL);
        let child = session("child", None);
        append_delegated_policy_overrides(&child, &captured).unwrap();
        assert_eq!(
            policy_events(&child),
            vec![
                (
                    "sandbox/mode".into(),
                    "danger-full-access".into(),
                    Some("delegation".into())
                ),
                (
                    "approval/policy".into(),
                    "never".into(),
                    Some("delegation".into())
                ),
            ]
        );
        assert_eq!(sandbox_of(&child), Some(SandboxMode::DangerFullAccess));
        assert_eq!(effective_policy(&child).1, Some(ApprovalPolicy::Never));
        assert_eq!(effective_policy(&parent).1, None);
    }

    /// spec: §2.15 — policy is a snapshot taken at capture: a parent switch after it does not
    /// reach the child.
    #[test]
    fn later_parent_switch_does_not_reach_the_child() {
        let parent = session("parent", None);
        switch_sandbox(&parent, SandboxMode::ReadOnly);
        let captured = capture_delegated_policy_overrides(&parent, PolicyServices::ALL);
        switch_sandbox(&parent, SandboxMode::DangerFullAccess);
        let child = session("child", None);
        append_delegated_policy_overrides(&child, &captured).unwrap();
        assert_eq!(sandbox_of(&child), Some(SandboxMode::ReadOnly));
    }

    /// spec: INH-3, POL-22 — an unswitched parent stamps only `approval/policy never` (at seq 0)
    /// and leaves no effective sandbox override.
    #[test]
    fn inh_3_unswitched_parent_pins_only_approval() {
        let parent = session("parent", None);
        let child = session("child", None);
        append_delegated_policy_overrides(
            &child,
            &capture_delegated_policy_overrides(&parent, PolicyServices::ALL),
        )
        .unwrap();
        assert_eq!(
            policy_events(&child),
            vec![(
                "approval/policy".into(),
                "never".into(),
                Some("delegation".into())
            )]
        );
        assert_eq!(child.events()[0].type_name(), "approval/policy");
        assert_eq!(sandbox_of(&child), None);
    }

    /// spec: INH-4 — an unswitched fork parent: only the approval event, after the fork prefix
    /// and its end-seed marker.
    #[test]
    fn inh_4_fork_child_gets_only_approval_after_the_prefix() {
        let parent = session("parent", None);
        let prefix: Vec<SessionEvent> = vec![SessionEvent {
            seq: 0,
            time: 1,
            data: EventData::TurnStart { turn: 1 },
            surface: None,
            ignorable: false,
        }];
        let child = session("child", Some(prefix));
        append_delegated_policy_overrides(
            &child,
            &capture_delegated_policy_overrides(&parent, PolicyServices::ALL),
        )
        .unwrap();
        let types: Vec<String> = child.events().iter().map(|e| e.type_name().to_owned()).collect();
        assert_eq!(types, ["turn/start", "session/end-seed", "approval/policy"]);
    }

    /// spec: INH-5 — a later child-side sandbox switch wins over the delegation event.
    #[test]
    fn inh_5_later_child_switch_wins() {
        let parent = session("parent", None);
        switch_sandbox(&parent, SandboxMode::ReadOnly);
        let child = session("child", None);
        append_delegated_policy_overrides(
            &child,
            &capture_delegated_policy_overrides(&parent, PolicyServices::ALL),
        )
        .unwrap();
        switch_sandbox(&child, SandboxMode::WorkspaceWrite);
        assert_eq!(sandbox_of(&child), Some(SandboxMode::WorkspaceWrite));
    }

    /// spec: INH-7, POL-20 — a stale mode inside a fork prefix (seq 0) is followed by end-seed
    /// (seq 1) and the fresh delegation event (seq 2), which wins; a later child switch wins again.
    #[test]
    fn inh_7_fresh_delegation_beats_stale_seeded_mode() {
        let parent = session("parent", None);
        switch_sandbox(&parent, SandboxMode::ReadOnly);
        let stale = vec![SessionEvent {
            seq: 0,
            time: 1,
            data: EventData::SandboxMode {
                mode: "danger-full-access".into(),
                source: None,
            },
            surface: None,
            ignorable: false,
        }];
        let child = session("child", Some(stale));
        append_delegated_policy_overrides(
            &child,
            &capture_delegated_policy_overrides(&parent, PolicyServices::ALL),
        )
        .unwrap();
        let events = child.events();
        assert_eq!(events[1].type_name(), "session/end-seed");
        assert!(
            matches!(&events[2].data, EventData::SandboxMode { mode, source } if mode == "read-only" && source.as_deref() == Some("delegation"))
        );
        assert_eq!(sandbox_of(&child), Some(SandboxMode::ReadOnly));
        switch_sandbox(&child, SandboxMode::WorkspaceWrite);
        assert_eq!(sandbox_of(&child), Some(SandboxMode::WorkspaceWrite));
    }

    /// spec: §2.15 — without the services nothing is captured or appended; the sandbox override
    /// needs the sandbox-policy service, the approval pin needs the approval service.
    #[test]
    fn absent_services_capture_nothing() {
        let parent = session("parent", None);
        switch_sandbox(&parent, SandboxMode::ReadOnly);
        let none = capture_delegated_policy_overrides(&parent, PolicyServices::default());
        assert_eq!(none, DelegatedPolicyOverrides::default());
        assert!(none.events().is_empty());
        let sandbox_only = capture_delegated_policy_overrides(
            &parent,
            PolicyServices {
                sandbox_policy: true,
                approval: false,
            },
        );
        assert_eq!(sandbox_only.sandbox_mode, Some(SandboxMode::ReadOnly));
        assert_eq!(sandbox_only.approval_policy, None);
        // The parent's own approval policy never leaks: the pin is always `never`.
        parent
            .append(
                EventData::ApprovalPolicy {
                    policy: "ask".into(),
                    source: None,
                },
                None,
            )
            .unwrap();
        let captured = capture_delegated_policy_overrides(&parent, PolicyServices::ALL);
        assert!(
            matches!(&captured.events()[1], EventData::ApprovalPolicy { policy, .. } if policy == "never")
        );
    }
}
