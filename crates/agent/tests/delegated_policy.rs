//! Delegated policy (spec §14): override folds, context sentences, delegation events.

mod common;

use agent::policy::{
    APPROVAL_CONTEXT_ORDER, DELEGATION_SOURCE, SANDBOX_CONTEXT_ORDER, approval_context_sentence,
    delegated_policy_events, sandbox_context_sentence, sandbox_context_sentence_in,
};
use agent::{ApprovalPolicy, EventData, SandboxMode, approval_override, sandbox_override};
use common::{Log, completed};

fn sandbox(mode: &str, source: Option<&str>) -> EventData {
    EventData::SandboxMode {
        mode: mode.into(),
        source: source.map(Into::into),
    }
}

fn approval(policy: &str, source: Option<&str>) -> EventData {
    EventData::ApprovalPolicy {
        policy: policy.into(),
        source: source.map(Into::into),
    }
}

#[test]
fn modes_and_policies_use_the_spec_spelling() {
    for (mode, wire) in [
        (SandboxMode::ReadOnly, "read-only"),
        (SandboxMode::WorkspaceWrite, "workspace-write"),
        (SandboxMode::DangerFullAccess, "danger-full-access"),
    ] {
        assert_eq!(serde_json::to_value(mode).unwrap(), serde_json::json!(wire));
        assert_eq!(wire.parse::<SandboxMode>(), Ok(mode));
        assert_eq!(mode.to_string(), wire);
    }
    for (policy, wire) in [(ApprovalPolicy::Ask, "ask"), (ApprovalPolicy::Never, "never")] {
        assert_eq!(serde_json::to_value(policy).unwrap(), serde_json::json!(wire));
        assert_eq!(wire.parse::<ApprovalPolicy>(), Ok(policy));
    }
    let err = "full".parse::<SandboxMode>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown sandbox mode `full`; expected one of read-only, workspace-write, danger-full-access"
    );
    assert!("Never".parse::<ApprovalPolicy>().is_err());
}

#[test]
fn no_policy_event_means_no_override() {
    let mut log = Log::new();
    log.stepped_turn(1, completed());
    assert_eq!(sandbox_override(log.events()), None);
    assert_eq!(approval_override(log.events()), None);
}

#[test]
fn the_last_policy_event_is_the_override() {
    let mut log = Log::new();
    log.push(sandbox("read-only", Some(DELEGATION_SOURCE)))
        .push(approval("never", Some(DELEGATION_SOURCE)))
        .stepped_turn(1, completed())
        .push(sandbox("danger-full-access", None))
        .push(approval("ask", None))
        .push(sandbox("workspace-write", None));
    assert_eq!(sandbox_override(log.events()), Some(SandboxMode::WorkspaceWrite));
    assert_eq!(approval_override(log.events()), Some(ApprovalPolicy::Ask));
}

#[test]
fn an_unparseable_value_is_ignored() {
    let mut log = Log::new();
    log.push(sandbox("read-only", None))
        .push(approval("never", None))
        .push(sandbox("everything", None))
        .push(approval("sometimes", None));
    assert_eq!(sandbox_override(log.events()), Some(SandboxMode::ReadOnly));
    assert_eq!(approval_override(log.events()), Some(ApprovalPolicy::Never));
    let mut only_bad = Log::new();
    only_bad.push(sandbox("", None)).push(approval("", None));
    assert_eq!(sandbox_override(only_bad.events()), None);
    assert_eq!(approval_override(only_bad.events()), None);
}

#[test]
fn delegation_events_carry_the_delegation_source_sandbox_first() {
    assert!(delegated_policy_events(None, None).is_empty());
    assert_eq!(
        delegated_policy_events(Some(SandboxMode::ReadOnly), Some(ApprovalPolicy::Never)),
        [
            sandbox("read-only", Some("delegation")),
            approval("never", Some("delegation"))
        ]
    );
    assert_eq!(
        delegated_policy_events(None, Some(ApprovalPolicy::Ask)),
        [approval("ask", Some("delegation"))]
    );
    // A child log seeded with them folds back to exactly the captured values.
    let mut child = Log::new();
    for data in delegated_policy_events(Some(SandboxMode::WorkspaceWrite), Some(ApprovalPolicy::Never)) {
        child.push(data);
    }
    assert_eq!(
        sandbox_override(child.events()),
        Some(SandboxMode::WorkspaceWrite)
    );
    assert_eq!(approval_override(child.events()), Some(ApprovalPolicy::Never));
    let json = serde_json::to_value(&child.events()[0]).unwrap();
    assert_eq!(
        json["data"],
        serde_json::json!({"mode": "workspace-write", "source": "delegation"})
    );
}

#[test]
fn context_sentences_are_pinned() {
    assert_eq!(SANDBOX_CONTEXT_ORDER, 110);
    assert_eq!(APPROVAL_CONTEXT_ORDER, 115);
    assert_eq!(
        sandbox_context_sentence(SandboxMode::ReadOnly),
        "File policy: read-only. Operations run through the file sandbox cannot change files right now. \
         If a task needs a change, still try the tool and follow any denial or escalation guidance it \
         returns instead of refusing in advance."
    );
    assert_eq!(
        sandbox_context_sentence(SandboxMode::WorkspaceWrite),
        "File policy: workspace-write. Operations run through the file sandbox may change files inside \
         the session workspace (and some system temporary directories); changes elsewhere are denied."
    );
    assert_eq!(
        sandbox_context_sentence(SandboxMode::DangerFullAccess),
        "File policy: danger-full-access. The file sandbox does not limit which files operations may change."
    );
    assert_eq!(
        sandbox_context_sentence_in(SandboxMode::WorkspaceWrite, std::path::Path::new("/w/proj")),
        "File policy: workspace-write. Operations run through the file sandbox may change files inside \
         the session workspace \"/w/proj\" (and some system temporary directories); changes elsewhere \
         are denied."
    );
    assert_eq!(
        sandbox_context_sentence_in(SandboxMode::ReadOnly, std::path::Path::new("/w")),
        sandbox_context_sentence(SandboxMode::ReadOnly)
    );
    assert_eq!(
        approval_context_sentence(ApprovalPolicy::Ask),
        "Approval policy: ask. Actions that need approval are put to the configured approvers; when none \
         is available, the action is refused."
    );
    assert_eq!(
        approval_context_sentence(ApprovalPolicy::Never),
        "Approval prompts are off in this session: every action that needs approval is refused \
         automatically, so do not ask for sandbox escalation."
    );
}
