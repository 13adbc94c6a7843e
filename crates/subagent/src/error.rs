//! The seam's typed failure: [`SubagentError`] with a stable [`SubagentErrorCode`] (spec §3).
//!
//! Every failure the seam itself raises carries one of the codes below and a message. Where the
//! spec fixes a message (or a fragment of one), the constructor on [`SubagentError`] that builds
//! it is the one place that text lives; callers never format these messages themselves.
//!
//! Child-level failures are *not* errors: they are values ([`StopReason`](crate::StopReason)
//! plus an optional diagnostic). `SubagentError` is for infrastructure faults and refused
//! operations.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use agent::error_chain;

/// A shareable, type-erased error: the cause a [`SubagentError`] carries, and the failure type of
/// memoized (shared) futures such as a run's disposal.
pub type SharedError = Arc<dyn StdError + Send + Sync + 'static>;

/// The stable machine-readable code of a [`SubagentError`], serialized in the spec's
/// SCREAMING_SNAKE spelling (`DUPLICATE_PROVIDER`, `NO_PROVIDER`, …).
///
/// The set is open for growth (`#[non_exhaustive]`): route on the codes you know and treat any
/// other as a generic failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum SubagentErrorCode {
    /// `registerProvider` with a name that is already registered.
    DuplicateProvider,
    /// `start` (or a continuable preparation) named an unregistered provider.
    NoProvider,
    /// The request needs a capability the provider does not advertise, or a continuable start
    /// names a provider without continuable preparation.
    UnsupportedCapability,
    /// An output schema falls outside the enforced subset or is not object-rooted.
    UnsupportedSchema,
    /// A continuable operation was called while no agents service (no continuation manager) is
    /// bound.
    ContinuationUnavailable,
    /// A continuable start or cold resume needs session persistence and none is configured.
    PersistenceUnavailable,
    /// A continuable child id already names a live agent, a live session or (for a
    /// caller-reserved id) a persisted session.
    DuplicateChild,
    /// Continuable admission is closed (manager drain, or a scoped drain covering the caller).
    Draining,
    /// The caller lacks the authority the operation requires.
    Unauthorized,
    /// A cold resume cannot reconstruct the child.
    NotResumable,
    /// The target (or owning parent) Activation's disposal has already begun.
    ActivationClosing,
    /// A report's direct parent is not live, or its send failed.
    ParentUnavailable,
    /// A disposal boundary failed (possibly several, combined).
    ActivationTeardownFailed,
    /// A setup contribution was revoked while a child was being provisioned.
    ActivationSetupRevoked,
    /// One or more setup installation disposers failed.
    ActivationSetupReleaseFailed,
    /// Listing was called without the projection registry.
    SubagentControlProjectionsUnavailable,
    /// Listing was called without the live session store.
    SubagentControlSessionStoreUnavailable,
    /// Listing observed its cancellation token aborted; also a provider start cancelled before
    /// publication.
    Cancelled,
    /// Rust addition: the child's depth would exceed the requested `maxDepth` (the reference
    /// throws an untyped `SubagentDepthError`; the typed error is this error's source).
    DepthExceeded,
    /// Rust addition: a provider's own start failure that no seam code describes (the reference
    /// passes such errors through untyped; the provider's typed error is this error's source);
    /// also provider code that panicked inside the service
    /// ([`SubagentError::provider_panicked`]).
    ProviderFailed,
    /// Rust addition: a keyed setup contribution
    /// ([`register_continuable_setup_keyed`](crate::continuation::ContinuationManager::register_continuable_setup_keyed))
    /// was refused because a live contribution is already registered under the same key.
    SetupAlreadyRegistered,
}

impl SubagentErrorCode {
    /// Every code, in the order of spec §3, then the Rust additions.
    pub const ALL: [Self; 21] = [
        Self::DuplicateProvider,
        Self::NoProvider,
        Self::UnsupportedCapability,
        Self::UnsupportedSchema,
        Self::ContinuationUnavailable,
        Self::PersistenceUnavailable,
        Self::DuplicateChild,
        Self::Draining,
        Self::Unauthorized,
        Self::NotResumable,
        Self::ActivationClosing,
        Self::ParentUnavailable,
        Self::ActivationTeardownFailed,
        Self::ActivationSetupRevoked,
        Self::ActivationSetupReleaseFailed,
        Self::SubagentControlProjectionsUnavailable,
        Self::SubagentControlSessionStoreUnavailable,
        Self::Cancelled,
        Self::DepthExceeded,
        Self::ProviderFailed,
        Self::SetupAlreadyRegistered,
    ];

    /// The code in its wire spelling (`DUPLICATE_PROVIDER`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DuplicateProvider => "DUPLICATE_PROVIDER",
            Self::NoProvider => "NO_PROVIDER",
            Self::UnsupportedCapability => "UNSUPPORTED_CAPABILITY",
            Self::UnsupportedSchema => "UNSUPPORTED_SCHEMA",
            Self::ContinuationUnavailable => "CONTINUATION_UNAVAILABLE",
            Self::PersistenceUnavailable => "PERSISTENCE_UNAVAILABLE",
            Self::DuplicateChild => "DUPLICATE_CHILD",
            Self::Draining => "DRAINING",
            Self::Unauthorized => "UNAUTHORIZED",
            Self::NotResumable => "NOT_RESUMABLE",
            Self::ActivationClosing => "ACTIVATION_CLOSING",
            Self::ParentUnavailable => "PARENT_UNAVAILABLE",
            Self::ActivationTeardownFailed => "ACTIVATION_TEARDOWN_FAILED",
            Self::ActivationSetupRevoked => "ACTIVATION_SETUP_REVOKED",
            Self::ActivationSetupReleaseFailed => "ACTIVATION_SETUP_RELEASE_FAILED",
            Self::SubagentControlProjectionsUnavailable => "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE",
            Self::SubagentControlSessionStoreUnavailable => "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE",
            Self::Cancelled => "CANCELLED",
            Self::DepthExceeded => "DEPTH_EXCEEDED",
            Self::ProviderFailed => "PROVIDER_FAILED",
            Self::SetupAlreadyRegistered => "SETUP_ALREADY_REGISTERED",
        }
    }
}

impl fmt::Display for SubagentErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The seam's typed failure: a stable [`code`](Self::code), a human-readable
/// [`message`](Self::message) (its `Display`), and an optional [`source`](Self::source) kept for
/// hosts (the error chain).
///
/// The error is cheap to clone (its cause is shared), so a memoized future can hand the same
/// failure to every awaiting caller.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SubagentError {
    /// The stable code; route on this, never on the message.
    pub code: SubagentErrorCode,
    /// The message, exactly the text the spec fixes where it fixes one.
    pub message: String,
    /// The underlying cause, when there is one.
    pub source: Option<SharedError>,
}

impl fmt::Display for SubagentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for SubagentError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn StdError + 'static))
    }
}

impl PartialEq for SubagentError {
    /// Two errors are equal when code and message agree (causes are not compared).
    fn eq(&self, other: &Self) -> bool {
        self.code == other.code && self.message == other.message
    }
}

impl SubagentError {
    /// The error's name as hosts and renderers report it.
    pub const NAME: &'static str = "SubagentError";

    /// A new error with `code` and `message` and no cause.
    pub fn new(code: SubagentErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches `cause` as the error's source.
    pub fn with_source(mut self, cause: impl StdError + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(cause));
        self
    }

    /// Attaches an already shared cause as the error's source.
    pub fn with_shared_source(mut self, cause: SharedError) -> Self {
        self.source = Some(cause);
        self
    }

    /// The error's name ([`SubagentError::NAME`]).
    pub fn name(&self) -> &'static str {
        Self::NAME
    }

    /// The stable code.
    pub fn code(&self) -> SubagentErrorCode {
        self.code
    }

    /// The message (the same text as `Display`).
    pub fn message(&self) -> &str {
        &self.message
    }

    // ---- registry and start -------------------------------------------------------------

    /// `DUPLICATE_PROVIDER`: `a subagent provider named "<name>" is already registered`.
    pub fn duplicate_provider(name: &str) -> Self {
        Self::new(
            SubagentErrorCode::DuplicateProvider,
            format!("a subagent provider named \"{name}\" is already registered"),
        )
    }

    /// `NO_PROVIDER`: `no subagent provider registered for "<name>"`.
    pub fn no_provider(name: &str) -> Self {
        Self::new(
            SubagentErrorCode::NoProvider,
            format!("no subagent provider registered for \"{name}\""),
        )
    }

    /// `PROVIDER_FAILED` for provider code that panicked inside the seam: `subagent provider
    /// "<provider>" panicked in <during>: <panic message>`, or `a subagent provider panicked in
    /// <during>: …` when its name is unknown (its `name()` is what panicked). `during` names the
    /// call (`start`, `capabilities()`, `run id()`, …).
    pub fn provider_panicked(provider: Option<&str>, during: &str, message: &str) -> Self {
        let who = match provider {
            Some(name) => format!("subagent provider \"{name}\""),
            None => "a subagent provider".to_owned(),
        };
        Self::new(
            SubagentErrorCode::ProviderFailed,
            format!("{who} panicked in {during}: {message}"),
        )
    }

    /// `PROVIDER_FAILED` for a continuable preparation whose seed is not balanced
    /// ([`is_balanced`](agent::prefix::is_balanced)): `subagent provider "<provider>" prepared
    /// a seed that is not balanced (a turn or step left open, a turn closed over an open step,
    /// or a tool/call outside its step); the child could not continue it`. Nothing was created.
    pub fn unbalanced_seed(provider: &str) -> Self {
        Self::new(
            SubagentErrorCode::ProviderFailed,
            format!(
                "subagent provider \"{provider}\" prepared a seed that is not balanced (a turn or step \
                 left open, a turn closed over an open step, or a tool/call outside its step); the \
                 child could not continue it"
            ),
        )
    }

    /// `PROVIDER_FAILED` for an interrupt whose target's `cancel` panicked (the child agent is
    /// host code): `subagent "<child>" could not be interrupted: its agent's cancel panicked:
    /// <panic message>`. Nothing was cancelled; the child's turn goes on.
    pub fn interrupt_failed(child_id: &str, message: &str) -> Self {
        Self::new(
            SubagentErrorCode::ProviderFailed,
            format!(
                "subagent \"{child_id}\" could not be interrupted: its agent's cancel panicked: {message}"
            ),
        )
    }

    /// `UNSUPPORTED_CAPABILITY` for a start-time capability:
    /// `subagent provider "<provider>" does not support the "<capability>" capability`, where
    /// `capability` is the flag's wire name (`outputSchema`, `depthLimit`, `toolFilter`,
    /// `persona`).
    pub fn unsupported_capability(provider: &str, capability: &str) -> Self {
        Self::new(
            SubagentErrorCode::UnsupportedCapability,
            format!("subagent provider \"{provider}\" does not support the \"{capability}\" capability"),
        )
    }

    /// `UNSUPPORTED_CAPABILITY` for a continuable start on a provider without continuable
    /// preparation: `subagent provider "<provider>" does not support continuable children (it
    /// has no continuable preparation)`.
    pub fn continuable_unsupported(provider: &str) -> Self {
        Self::new(
            SubagentErrorCode::UnsupportedCapability,
            format!(
                "subagent provider \"{provider}\" does not support continuable children \
                 (it has no continuable preparation)"
            ),
        )
    }

    /// `UNSUPPORTED_SCHEMA`: `unsupported JSON schema: <v1>; <v2>; …` listing every violation in
    /// walk order.
    pub fn unsupported_schema<S: AsRef<str>>(violations: &[S]) -> Self {
        let joined = violations
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join("; ");
        Self::new(
            SubagentErrorCode::UnsupportedSchema,
            format!("unsupported JSON schema: {joined}"),
        )
    }

    // ---- continuation availability ------------------------------------------------------

    /// `CONTINUATION_UNAVAILABLE`: `continuable subagents require the agents service`.
    pub fn continuation_unavailable() -> Self {
        Self::new(
            SubagentErrorCode::ContinuationUnavailable,
            "continuable subagents require the agents service",
        )
    }

    /// `PERSISTENCE_UNAVAILABLE`: `continuable subagents require session persistence (configure
    /// a session persistence backend)`.
    pub fn persistence_unavailable() -> Self {
        Self::new(
            SubagentErrorCode::PersistenceUnavailable,
            "continuable subagents require session persistence (configure a session persistence backend)",
        )
    }

    /// `DUPLICATE_CHILD`: `subagent "<id>" already exists`.
    pub fn duplicate_child(child_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::DuplicateChild,
            format!("subagent \"{child_id}\" already exists"),
        )
    }

    /// `DRAINING` while the whole manager drains: `continuable subagents are draining; the
    /// operation was not admitted`.
    pub fn draining() -> Self {
        Self::new(
            SubagentErrorCode::Draining,
            "continuable subagents are draining; the operation was not admitted",
        )
    }

    /// `DRAINING` under a scoped drain: `continuable subagents below parent "<root>" are
    /// draining; the operation was not admitted`.
    pub fn draining_below(root_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::Draining,
            format!(
                "continuable subagents below parent \"{root_id}\" are draining; the operation was not admitted"
            ),
        )
    }

    // ---- authority ----------------------------------------------------------------------

    /// `UNAUTHORIZED` for a delivery from a parent that is not the exact live entry:
    /// `subagent "<child>" delivery requires the exact live parent agent`.
    pub fn delivery_requires_live_parent(child_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::Unauthorized,
            format!("subagent \"{child_id}\" delivery requires the exact live parent agent"),
        )
    }

    /// `UNAUTHORIZED` when the caller is not the child's durable direct parent (follow-up, or
    /// `user` interrupt authority with the wrong address):
    /// `subagent "<child>" belongs to another parent session`.
    pub fn foreign_parent(child_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::Unauthorized,
            format!("subagent \"{child_id}\" belongs to another parent session"),
        )
    }

    /// `UNAUTHORIZED` for a stale ancestor: `interrupting "<target>" requires the exact live
    /// ancestor agent`.
    pub fn interrupt_requires_live_ancestor(target_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::Unauthorized,
            format!("interrupting \"{target_id}\" requires the exact live ancestor agent"),
        )
    }

    /// `UNAUTHORIZED` for a self-interrupt: `agent "<id>" cannot interrupt itself`.
    pub fn cannot_interrupt_itself(agent_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::Unauthorized,
            format!("agent \"{agent_id}\" cannot interrupt itself"),
        )
    }

    /// `UNAUTHORIZED` when the ancestor is not in the target's ancestry:
    /// `subagent "<target>" is not a live descendant of agent "<agent>"`.
    pub fn not_live_descendant(target_id: &str, agent_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::Unauthorized,
            format!("subagent \"{target_id}\" is not a live descendant of agent \"{agent_id}\""),
        )
    }

    /// `UNAUTHORIZED` for a reporter that is not the exact agent of a resident Activation:
    /// `agent "<id>" is not a live continuable subagent and cannot report`.
    pub fn not_continuable_reporter(agent_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::Unauthorized,
            format!("agent \"{agent_id}\" is not a live continuable subagent and cannot report"),
        )
    }

    /// `UNAUTHORIZED` for a selected drain through a stale parent: `selected child teardown
    /// requires the exact live parent agent`.
    pub fn selected_teardown_requires_live_parent() -> Self {
        Self::new(
            SubagentErrorCode::Unauthorized,
            "selected child teardown requires the exact live parent agent",
        )
    }

    /// `UNAUTHORIZED` for a selected drain naming a resident child of someone else:
    /// `subagent "<child>" is not a direct child of agent "<parent>"`.
    pub fn not_direct_child(child_id: &str, parent_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::Unauthorized,
            format!("subagent \"{child_id}\" is not a direct child of agent \"{parent_id}\""),
        )
    }

    // ---- resumption -----------------------------------------------------------------------

    /// `NOT_RESUMABLE` when inspection or re-materialization failed: `subagent "<child>" is
    /// unavailable`.
    pub fn child_unavailable(child_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::NotResumable,
            format!("subagent \"{child_id}\" is unavailable"),
        )
    }

    /// `NOT_RESUMABLE` when the persisted session (or the agent resumed from it) found for a
    /// child id is another session: `subagent "<child>" is unavailable: its persisted session
    /// names "<found>"`. Nothing is adopted under the child's id.
    pub fn child_session_mismatch(child_id: &str, found: &str) -> Self {
        Self::new(
            SubagentErrorCode::NotResumable,
            format!("subagent \"{child_id}\" is unavailable: its persisted session names \"{found}\""),
        )
    }

    /// `NOT_RESUMABLE` when the own suffix holds no supported continuable descriptor:
    /// `subagent "<child>" has no supported continuation state and cannot be resumed; do not
    /// retry send_message with this id`.
    pub fn no_continuation_state(child_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::NotResumable,
            format!(
                "subagent \"{child_id}\" has no supported continuation state and cannot be resumed; \
                 do not retry send_message with this id"
            ),
        )
    }

    // ---- closing activations ------------------------------------------------------------

    /// `ACTIVATION_CLOSING` when ownership would be registered under a parent Activation whose
    /// disposal began: `subagent parent "<parent>" is being disposed; the child was not
    /// established`.
    pub fn parent_activation_closing(parent_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::ActivationClosing,
            format!("subagent parent \"{parent_id}\" is being disposed; the child was not established"),
        )
    }

    /// `ACTIVATION_CLOSING` for a submission racing disposal: `subagent "<child>" activation is
    /// being disposed; the message was not accepted`.
    pub fn submission_activation_closing(child_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::ActivationClosing,
            format!("subagent \"{child_id}\" activation is being disposed; the message was not accepted"),
        )
    }

    /// `ACTIVATION_CLOSING` for a reporter whose Activation is closing: `subagent "<child>"
    /// activation is being disposed; the report was not delivered`.
    pub fn reporter_activation_closing(child_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::ActivationClosing,
            format!("subagent \"{child_id}\" activation is being disposed; the report was not delivered"),
        )
    }

    /// `PARENT_UNAVAILABLE`: `direct parent is not live; report was not delivered`.
    pub fn parent_unavailable() -> Self {
        Self::new(
            SubagentErrorCode::ParentUnavailable,
            "direct parent is not live; report was not delivered",
        )
    }

    // ---- teardown and setup ---------------------------------------------------------------

    /// `ACTIVATION_TEARDOWN_FAILED` aggregating drain branches: `continuable subagent teardown
    /// failed for <n> <subject>: <chain>; <chain>`, where `subject` names the drained set
    /// (`activation(s)`, `scoped activation(s)`, `selected activation(s)`).
    pub fn teardown_failed_for(subject: &str, failures: &[&(dyn StdError + 'static)]) -> Self {
        Self::new(
            SubagentErrorCode::ActivationTeardownFailed,
            format!(
                "continuable subagent teardown failed for {} {subject}: {}",
                failures.len(),
                join_chains(failures)
            ),
        )
    }

    /// `ACTIVATION_TEARDOWN_FAILED` for one failed handle disposal (the host's disposer
    /// panicked): `subagent "<child>" handle disposal failed: <message>`.
    pub fn handle_disposal_failed(child_id: &str, message: &str) -> Self {
        Self::new(
            SubagentErrorCode::ActivationTeardownFailed,
            format!("subagent \"{child_id}\" handle disposal failed: {message}"),
        )
    }

    /// `ACTIVATION_TEARDOWN_FAILED` when the teardown could not cancel the child (the host
    /// agent's `cancel` panicked): `subagent "<child>" could not be cancelled in its teardown:
    /// <message>`. The teardown goes on once the child is idle; the epoch reports `error`.
    pub fn cancel_failed(child_id: &str, message: &str) -> Self {
        Self::new(
            SubagentErrorCode::ActivationTeardownFailed,
            format!("subagent \"{child_id}\" could not be cancelled in its teardown: {message}"),
        )
    }

    /// `ACTIVATION_TEARDOWN_FAILED` when the teardown could not wait for the child to become idle
    /// (the host agent's `when_idle` panicked): `subagent "<child>" did not become idle in its
    /// teardown: <message>`. The teardown goes on; the epoch reports `error`.
    pub fn idle_wait_failed(child_id: &str, message: &str) -> Self {
        Self::new(
            SubagentErrorCode::ActivationTeardownFailed,
            format!("subagent \"{child_id}\" did not become idle in its teardown: {message}"),
        )
    }

    /// `ACTIVATION_TEARDOWN_FAILED` when the teardown could not capture the epoch's terminal facts
    /// (spec §2.14.6 step 5; reading the child's log through the host agent panicked):
    /// `subagent "<child>" terminal facts could not be captured in its teardown: <message>`. The
    /// teardown goes on; the epoch reports `error` with no output.
    pub fn capture_failed(child_id: &str, message: &str) -> Self {
        Self::new(
            SubagentErrorCode::ActivationTeardownFailed,
            format!(
                "subagent \"{child_id}\" terminal facts could not be captured in its teardown: {message}"
            ),
        )
    }

    /// `ACTIVATION_TEARDOWN_FAILED` for a delivery that waited for a child's teardown which ended
    /// without releasing that Activation (it was abandoned): `subagent "<child>" activation
    /// teardown ended without releasing it; the message was not accepted`. Routing again would
    /// only find the same Activation again.
    pub fn teardown_left_activation(child_id: &str) -> Self {
        Self::new(
            SubagentErrorCode::ActivationTeardownFailed,
            format!(
                "subagent \"{child_id}\" activation teardown ended without releasing it; \
                 the message was not accepted"
            ),
        )
    }

    /// `ACTIVATION_TEARDOWN_FAILED` combining several boundaries of one disposal:
    /// `subagent "<child>" activation teardown failed at <n> boundaries: <chain>; <chain>`.
    pub fn teardown_failed_at_boundaries(child_id: &str, failures: &[&(dyn StdError + 'static)]) -> Self {
        Self::new(
            SubagentErrorCode::ActivationTeardownFailed,
            format!(
                "subagent \"{child_id}\" activation teardown failed at {} boundaries: {}",
                failures.len(),
                join_chains(failures)
            ),
        )
    }

    /// `ACTIVATION_SETUP_REVOKED`: `a continuable-subagent setup contribution was revoked while
    /// this child was being built; the child was not established`.
    pub fn setup_revoked() -> Self {
        Self::new(
            SubagentErrorCode::ActivationSetupRevoked,
            "a continuable-subagent setup contribution was revoked while this child was being built; \
             the child was not established",
        )
    }

    /// `ACTIVATION_SETUP_RELEASE_FAILED`: `continuable-subagent setup <during> failed to release
    /// <n> installation(s): <chain>; <chain>`.
    pub fn setup_release_failed(during: &str, failures: &[&(dyn StdError + 'static)]) -> Self {
        Self::new(
            SubagentErrorCode::ActivationSetupReleaseFailed,
            format!(
                "continuable-subagent setup {during} failed to release {} installation(s): {}",
                failures.len(),
                join_chains(failures)
            ),
        )
    }

    /// `SETUP_ALREADY_REGISTERED`: `a continuable-subagent setup contribution keyed "<key>" is
    /// already registered; remove it before registering another`. Nothing was registered; the
    /// live contribution is unaffected.
    pub fn setup_already_registered(key: &str) -> Self {
        Self::new(
            SubagentErrorCode::SetupAlreadyRegistered,
            format!(
                "a continuable-subagent setup contribution keyed \"{key}\" is already registered; \
                 remove it before registering another"
            ),
        )
    }

    // ---- listing ----------------------------------------------------------------------------

    /// `SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE`: `listing subagents requires the session
    /// projection registry`.
    pub fn projections_unavailable() -> Self {
        Self::new(
            SubagentErrorCode::SubagentControlProjectionsUnavailable,
            "listing subagents requires the session projection registry",
        )
    }

    /// `SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE`: `listing subagents requires the session
    /// store`.
    pub fn session_store_unavailable() -> Self {
        Self::new(
            SubagentErrorCode::SubagentControlSessionStoreUnavailable,
            "listing subagents requires the session store",
        )
    }

    /// `CANCELLED`: `subagent listing was cancelled`.
    pub fn listing_cancelled() -> Self {
        Self::new(SubagentErrorCode::Cancelled, "subagent listing was cancelled")
    }
}

fn join_chains(failures: &[&(dyn StdError + 'static)]) -> String {
    failures
        .iter()
        .map(|e| error_chain(*e))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Plain(&'static str);

    #[derive(Debug, thiserror::Error)]
    #[error("{msg}")]
    struct Wrapped {
        msg: &'static str,
        #[source]
        cause: Plain,
    }

    /// spec: SVC-15 — a `SubagentError` is a harness error named `SubagentError` carrying its
    /// code.
    #[test]
    fn svc_15_error_has_name_and_code() {
        let err = SubagentError::no_provider("ghost");
        assert_eq!(err.name(), "SubagentError");
        assert_eq!(err.code(), SubagentErrorCode::NoProvider);
        assert_eq!(err.to_string(), "no subagent provider registered for \"ghost\"");
        let as_dyn: &dyn StdError = &err;
        assert!(as_dyn.source().is_none());
    }

    /// spec: §3 — every code serializes in SCREAMING_SNAKE spelling and round-trips.
    #[test]
    fn codes_serialize_screaming_snake() {
        for code in SubagentErrorCode::ALL {
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, serde_json::Value::String(code.as_str().to_owned()));
            let back: SubagentErrorCode = serde_json::from_value(json).unwrap();
            assert_eq!(back, code);
            assert_eq!(code.to_string(), code.as_str());
        }
        let names: Vec<&str> = SubagentErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        insta::assert_snapshot!(names.join("\n"));
    }

    /// spec: §3 — the message texts the spec fixes, pinned verbatim.
    #[test]
    fn fixed_messages_are_pinned() {
        let cause = Wrapped {
            msg: "handle disposal failed",
            cause: Plain("reap failed"),
        };
        let other = Plain("capture failed");
        let failures: [&(dyn StdError + 'static); 2] = [&cause, &other];
        let all = [
            SubagentError::duplicate_provider("spawn"),
            SubagentError::no_provider("ghost"),
            SubagentError::provider_panicked(Some("wild"), "start", "boom"),
            SubagentError::provider_panicked(None, "name()", "boom"),
            SubagentError::unsupported_capability("acp", "outputSchema"),
            SubagentError::continuable_unsupported("acp"),
            SubagentError::unsupported_schema(&["schema.pattern is bad", "schema.x is bad"]),
            SubagentError::continuation_unavailable(),
            SubagentError::persistence_unavailable(),
            SubagentError::duplicate_child("c1"),
            SubagentError::draining(),
            SubagentError::draining_below("root"),
            SubagentError::delivery_requires_live_parent("c1"),
            SubagentError::foreign_parent("c1"),
            SubagentError::interrupt_requires_live_ancestor("c1"),
            SubagentError::cannot_interrupt_itself("a1"),
            SubagentError::not_live_descendant("c1", "a1"),
            SubagentError::not_continuable_reporter("a1"),
            SubagentError::selected_teardown_requires_live_parent(),
            SubagentError::not_direct_child("c1", "p1"),
            SubagentError::child_unavailable("c1"),
            SubagentError::no_continuation_state("c1"),
            SubagentError::parent_activation_closing("p1"),
            SubagentError::submission_activation_closing("c1"),
            SubagentError::reporter_activation_closing("c1"),
            SubagentError::parent_unavailable(),
            SubagentError::teardown_failed_for("selected activation(s)", &failures),
            SubagentError::teardown_failed_at_boundaries("c1", &failures),
            SubagentError::setup_revoked(),
            SubagentError::setup_release_failed("removal", &failures[..1]),
            SubagentError::setup_already_registered("tool-subagent-report"),
            SubagentError::projections_unavailable(),
            SubagentError::session_store_unavailable(),
            SubagentError::listing_cancelled(),
        ];
        let rendered: Vec<String> = all.iter().map(|e| format!("{}: {}", e.code(), e)).collect();
        insta::assert_snapshot!(rendered.join("\n"));
    }

    /// spec: §2.14 — the fragments the continuation suite matches are part of the fixed texts.
    #[test]
    fn spec_fragments_appear_in_messages() {
        assert!(
            SubagentError::continuable_unsupported("p")
                .message()
                .contains("does not support continuable children")
        );
        assert!(
            SubagentError::persistence_unavailable()
                .message()
                .contains("require session persistence")
        );
        assert!(
            SubagentError::foreign_parent("c")
                .message()
                .contains("belongs to another parent session")
        );
        assert!(
            SubagentError::no_continuation_state("c")
                .message()
                .contains("no supported continuation state")
        );
        assert!(
            SubagentError::interrupt_requires_live_ancestor("c")
                .message()
                .contains("exact live ancestor")
        );
        assert!(
            SubagentError::cannot_interrupt_itself("c")
                .message()
                .contains("cannot interrupt itself")
        );
        assert!(
            SubagentError::not_live_descendant("c", "a")
                .message()
                .contains("not a live descendant")
        );
        assert!(
            SubagentError::setup_revoked()
                .message()
                .contains("revoked while this child was being built")
        );
    }

    #[test]
    fn source_is_kept_and_chain_renders_without_repeats() {
        let err = SubagentError::child_unavailable("c").with_source(Wrapped {
            msg: "inspect failed",
            cause: Plain("disk gone"),
        });
        assert_eq!(
            error_chain(&err),
            "subagent \"c\" is unavailable: inspect failed: disk gone"
        );
        let repeated = Wrapped {
            msg: "same",
            cause: Plain("same"),
        };
        assert_eq!(error_chain(&repeated), "same");
        // A wrapper whose message ends with its cause's text (`"<context>: {source}"`) shows the
        // cause once; a deeper cause it does not embed is still appended.
        let embedding = SubagentError::new(
            SubagentErrorCode::ProviderFailed,
            "agent \"c\" setup failed: unknown tool",
        )
        .with_source(Wrapped {
            msg: "unknown tool",
            cause: Plain("registry closed"),
        });
        assert_eq!(
            error_chain(&embedding),
            "agent \"c\" setup failed: unknown tool: registry closed"
        );
        assert_eq!(error_chain(&Plain("")), "<empty error>");
        let cloned = err.clone();
        assert_eq!(cloned, err);
        assert!(StdError::source(&cloned).is_some());
    }
}
