//! Applying a [`ChildComposition`] to a live, unpublished child scope (spec §2.16
//! `applyChildComposition`; `inprocess-providers.md` §2.4).
//!
//! [`crate::composition`] fixes the *data* (persona, tool filter) and the names and orders of
//! the registrations; this module performs them, so every creation path — the one-shot
//! in-process driver, fresh continuable materialization and cold resume — composes a child
//! identically, in one place.
//!
//! Order (each step through the child's own scoped [`Ctx`], so every registration is adopted by
//! the child's scope, invisible to the parent and to siblings, and undone when the child is
//! disposed):
//!
//! 1. join the parent's composition — a no-op here: this workspace has no agent presets, so a
//!    child gets a fresh, flat scope (a deliberate difference from the reference);
//! 2. the delegation-scope statement ([`SUBAGENT_DELEGATION_CONTEXT`]) as the runtime-context
//!    contribution [`DELEGATION_CONTEXT_NAME`] at [`DELEGATION_CONTEXT_ORDER`] (after the
//!    sandbox 110 and approval 115 sentences); it rides the runtime-context snapshot, never the
//!    system text, so parent and child system prompts stay identical;
//! 3. the persona, when present, as the scoped section [`PERSONA_SECTION_NAME`] at
//!    [`PERSONA_SECTION_ORDER`] (it shadows the deployment persona for this child only);
//! 4. the tool filter, when present, as a scoped restriction. A filter naming an unknown tool
//!    fails here, loudly (`unknown global tool …`), and the caller's creation must roll back.
//!
//! Nothing else is imported from the parent: its own scoped tools, restrictions, guards and
//! persona are not inherited and no authority subset is established.

use agent::prompt::{PromptSection, RuntimeContext};
use agent::{AgentError, Ctx, ScopeInactive, SessionId};

use crate::composition::{
    ChildComposition, DELEGATION_CONTEXT_NAME, DELEGATION_CONTEXT_ORDER, PERSONA_SECTION_NAME,
    PERSONA_SECTION_ORDER,
};
use crate::model_text::SUBAGENT_DELEGATION_CONTEXT;

/// Applies `composition` to a child through its **scoped** context `child` (the `Ctx` a creation
/// transaction hands its setup window), in the order of the module docs.
///
/// # Errors
/// * [`AgentError::Inactive`] when `child` is not scoped to an agent (a global context would
///   register deployment-wide state a child must never leak) or its scope was disposed;
/// * the registry's own error for a refused registration — notably an unknown or
///   non-restrictable name in the tool filter (`unknown global tool "<name>"; known global
///   tools: …`).
///
/// Registrations made before a failing step stay adopted by the child's scope; the creation
/// transaction's rollback unwinds them with the scope.
pub fn apply_child_composition(child: &Ctx, composition: &ChildComposition) -> Result<(), AgentError> {
    if child.scope_key().is_none() {
        return Err(AgentError::Inactive(ScopeInactive(SessionId::from(
            "<global context>",
        ))));
    }
    // 1. Composition join: no agent presets in this workspace (see the module docs).
    // 2. The delegation-scope statement.
    adopted(child.runtime_context(delegation_context())?);
    // 3. The persona shadow.
    if let Some(persona) = &composition.persona {
        adopted(child.prompt_section(PromptSection {
            name: PERSONA_SECTION_NAME.to_owned(),
            order: PERSONA_SECTION_ORDER,
            text: persona.clone(),
            tool: None,
        })?);
    }
    // 4. The tool filter.
    if let Some(filter) = &composition.tool_filter {
        adopted(child.restrict_tools(filter.clone())?);
    }
    Ok(())
}

/// The delegation-scope statement every child registers: built once per process (its renderer
/// is shared), so each child clones it rather than allocating the same renderer again.
fn delegation_context() -> RuntimeContext {
    static STATEMENT: std::sync::LazyLock<RuntimeContext> = std::sync::LazyLock::new(|| {
        RuntimeContext::fixed(
            DELEGATION_CONTEXT_NAME,
            DELEGATION_CONTEXT_ORDER,
            SUBAGENT_DELEGATION_CONTEXT,
        )
    });
    STATEMENT.clone()
}

/// A scoped context adopts its guards into the child's scope and hands back `None`. The scope
/// check above makes `Some` unreachable; should a context ever hand a guard back, dropping it
/// undoes that registration at once, so nothing can leak into a shared layer.
fn adopted(guard: Option<agent::Registration>) {
    debug_assert!(guard.is_none(), "a scoped context adopts its registrations");
    drop(guard);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statement's registration contract (name, order) is the one the composition data
    /// fixes; the text is the seam's constant.
    #[test]
    fn statement_uses_the_fixed_name_and_order() {
        let ctx = RuntimeContext::fixed(
            DELEGATION_CONTEXT_NAME,
            DELEGATION_CONTEXT_ORDER,
            SUBAGENT_DELEGATION_CONTEXT,
        );
        assert_eq!(ctx.name, "subagent:delegation");
        assert_eq!(ctx.order, 120);
        assert_eq!(
            (ctx.render)(&SessionId::from("child")).as_deref(),
            Some(SUBAGENT_DELEGATION_CONTEXT)
        );
    }
}
