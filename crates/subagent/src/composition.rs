//! Child composition as plain data (spec §2.16, §2.14.4): what a child is composed with
//! (persona, tool filter, the delegation-scope statement), and the durable header metadata a
//! child session is created with.
//!
//! Applying a composition needs a live child scope (prompt sections, runtime-context
//! contributions, tool restrictions); that belongs to the service. This module fixes the data
//! and the names and orders the registrations use, so every creation path composes children
//! identically.

use agent::agent::AgentOptions;
use agent::tools::ToolRestriction;
use agent::{Origin, SessionHeader, SessionMeta};

pub use crate::model_text::SUBAGENT_DELEGATION_CONTEXT;

/// The name of the runtime-context contribution carrying [`SUBAGENT_DELEGATION_CONTEXT`].
pub const DELEGATION_CONTEXT_NAME: &str = "subagent:delegation";

/// The order of the delegation statement among runtime-context contributions: after the
/// sandbox-policy (110) and approval-policy (115) sentences.
pub const DELEGATION_CONTEXT_ORDER: i32 = 120;

/// The name of the child-scoped system-prompt section a per-child persona registers (it shadows
/// the deployment persona of the same name).
pub const PERSONA_SECTION_NAME: &str = "deployment:persona";

/// The order of the persona section.
pub const PERSONA_SECTION_ORDER: i32 = 0;

/// The spec's name for a per-child tool restriction (`toolFilter: {allow?, deny?}`): the
/// host's [`ToolRestriction`].
pub type ToolFilter = ToolRestriction;

/// What a child is composed with beyond the parent's composition: the inputs of
/// `applyChildComposition` (spec §2.16). Fresh creation, cold resume and the one-shot driver
/// all apply it in the same order: join the parent's composition, register the delegation
/// statement ([`DELEGATION_CONTEXT_NAME`] at [`DELEGATION_CONTEXT_ORDER`]), register the persona
/// section ([`PERSONA_SECTION_NAME`] at [`PERSONA_SECTION_ORDER`]) when `persona` is present,
/// then install `tool_filter` as a scoped restriction when present. Every registration lives in
/// the child's scope, invisible to the parent and siblings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChildComposition {
    /// Per-child persona text shadowing the deployment persona (an empty string is a valid
    /// explicit shadow).
    pub persona: Option<String>,
    /// Per-child restriction of deployment-global tools (`{allow?, deny?}`): `allow` applies
    /// before `deny` to the live global registry, several restrictions intersect, child-scoped
    /// tools are added after filtering, `allow: []` hides every global tool, and a filter with
    /// neither list (or naming an unknown tool) fails loudly. Visibility, not authority.
    pub tool_filter: Option<ToolRestriction>,
}

/// The durable header metadata of a new child session (spec §2.14.4 `childSessionMeta`):
/// the parent's `cwd` (when it has one), `parentSession` = the parent's id, `origin: subagent`,
/// `delegationDepth` = `child_depth`, and `seedLength` only when `seed_length > 0` (how many
/// leading events were inherited from the parent's log).
///
/// No `agentPreset` is recorded: this workspace has no agent presets (children get a flat
/// scope), a deliberate difference from the reference.
pub fn child_session_meta(parent: &SessionHeader, child_depth: u64, seed_length: u64) -> SessionMeta {
    SessionMeta {
        cwd: parent.cwd.clone(),
        parent_session: Some(parent.id.clone()),
        created_at: None,
        seed_length: (seed_length > 0).then_some(seed_length),
        origin: Some(Origin::Subagent),
        delegation_depth: Some(child_depth),
        agent_preset: None,
    }
}

/// The options of a new child agent (spec §2.11 `resolveChildAgentOptions`): the parent's
/// `provider`, `model` and `max_tokens` (each only when the parent has it), overridden field by
/// field by every field `requested` sets (extension fields included), then `subagent_depth` =
/// `child_depth`. Nothing else is copied from the parent; a parent with no route and no override
/// yields options with only the depth, and no route is invented.
pub fn resolve_child_agent_options(
    parent: &AgentOptions,
    requested: Option<&AgentOptions>,
    child_depth: u64,
) -> AgentOptions {
    let mut options = AgentOptions {
        provider: parent.provider.clone(),
        model: parent.model.clone(),
        max_tokens: parent.max_tokens,
        ..AgentOptions::default()
    };
    if let Some(requested) = requested {
        if requested.provider.is_some() {
            options.provider.clone_from(&requested.provider);
        }
        if requested.model.is_some() {
            options.model.clone_from(&requested.model);
        }
        if requested.max_tokens.is_some() {
            options.max_tokens = requested.max_tokens;
        }
        for (key, value) in &requested.extensions {
            options.extensions.insert(key.clone(), value.clone());
        }
    }
    options.subagent_depth = Some(child_depth);
    options
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// spec: §2.11 — child options: the parent's route (provider, model, max tokens) overridden
    /// field by field by the request, then the child's depth; nothing else is inherited and no
    /// route is invented.
    #[test]
    fn child_options_inherit_the_route_and_stamp_the_depth() {
        let parent = AgentOptions {
            provider: Some("openai".into()),
            model: Some("m1".into()),
            max_tokens: Some(100),
            subagent_depth: Some(1),
            extensions: [("parentOnly".to_owned(), json!(true))].into_iter().collect(),
        };
        let inherited = resolve_child_agent_options(&parent, None, 2);
        assert_eq!(
            serde_json::to_value(&inherited).unwrap(),
            json!({"provider": "openai", "model": "m1", "maxTokens": 100, "subagentDepth": 2})
        );
        let requested = AgentOptions {
            model: Some("m2".into()),
            subagent_depth: Some(9),
            extensions: [("reasoning".to_owned(), json!("high"))].into_iter().collect(),
            ..AgentOptions::default()
        };
        let overridden = resolve_child_agent_options(&parent, Some(&requested), 2);
        assert_eq!(
            serde_json::to_value(&overridden).unwrap(),
            json!({"provider": "openai", "model": "m2", "maxTokens": 100, "subagentDepth": 2, "reasoning": "high"})
        );
        let routeless = resolve_child_agent_options(&AgentOptions::default(), None, 1);
        assert_eq!(
            serde_json::to_value(&routeless).unwrap(),
            json!({"subagentDepth": 1})
        );
    }

    /// spec: §2.14.4 — child metadata: parent cwd, lineage, origin, depth, and `seedLength` only
    /// when positive.
    #[test]
    fn child_meta_records_lineage_and_depth() {
        let parent = SessionMeta {
            cwd: Some("/work".into()),
            delegation_depth: Some(1),
            ..SessionMeta::default()
        }
        .into_header("parent".into(), 5)
        .unwrap();
        let meta = child_session_meta(&parent, 2, 0);
        assert_eq!(
            serde_json::to_value(&meta).unwrap(),
            json!({"cwd": "/work", "parentSession": "parent", "origin": "subagent", "delegationDepth": 2})
        );
        let seeded = child_session_meta(&parent, 2, 7);
        assert_eq!(seeded.seed_length, Some(7));
        let header = seeded.into_header("child".into(), 9).unwrap();
        assert_eq!(header.parent_session.as_ref().map(|s| s.as_str()), Some("parent"));
        assert_eq!(header.depth(), 2);
        let no_cwd = SessionMeta::default().into_header("p".into(), 1).unwrap();
        assert_eq!(child_session_meta(&no_cwd, 1, 0).cwd, None);
    }

    #[test]
    fn registration_names_and_orders() {
        assert_eq!(DELEGATION_CONTEXT_NAME, "subagent:delegation");
        assert_eq!(DELEGATION_CONTEXT_ORDER, 120);
        assert_eq!(PERSONA_SECTION_NAME, "deployment:persona");
        assert_eq!(PERSONA_SECTION_ORDER, 0);
    }
}
