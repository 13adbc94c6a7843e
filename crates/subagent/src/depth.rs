//! Delegation depth (spec §2.11): how deep in a delegation tree an agent sits, and the
//! arithmetic that gives a child its depth and enforces a caller's cap.
//!
//! * The persisted session header's `delegationDepth` is the authoritative floor (absent = 0).
//! * The runtime option `subagentDepth` may deepen an agent but never lowers the floor, so a
//!   resumed child cannot regain a top-level budget.
//! * Depths are non-negative *safe* integers (≤ [`MAX_SAFE_INTEGER`] = 2^53 − 1), so that every
//!   depth survives a round trip through any JSON reader. Every value outside that range is
//!   rejected; the arithmetic is checked and never overflows.

use agent::Agent;
use serde_json::{Number, Value};

pub use agent::header::MAX_SAFE_INTEGER;

/// A delegation depth above the caller's cap (a plain error, deliberately not a
/// [`SubagentError`](crate::SubagentError)). Display: `subagent depth <A> exceeds maxDepth <M>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("subagent depth {attempted_depth} exceeds maxDepth {max_depth}")]
pub struct SubagentDepthError {
    /// The depth the child would have had.
    pub attempted_depth: u64,
    /// The cap it exceeded.
    pub max_depth: u64,
}

/// Why a depth computation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DepthError {
    /// A requested `maxDepth` is not a non-negative safe integer (a type error in the spec).
    #[error("subagent maxDepth must be a non-negative safe integer")]
    InvalidMaxDepth,
    /// An agent's runtime `subagentDepth` option is not a non-negative safe integer (a type
    /// error in the spec).
    #[error("agent subagentDepth must be a non-negative safe integer")]
    InvalidRuntimeDepth,
    /// The child's depth would leave the safe-integer range (a range error in the spec).
    #[error("subagent child depth exceeds the safe-integer range")]
    ChildDepthOverflow,
    /// The child's depth would exceed the requested cap.
    #[error(transparent)]
    Exceeded(#[from] SubagentDepthError),
}

/// A value that may be offered as a depth. Implemented for the integer types, `f64` (the
/// spec's number type) and JSON values, so untrusted input can be validated without a lossy
/// conversion first.
pub trait DepthValue {
    /// The value as a depth, when it is a non-negative safe integer (and not negative zero);
    /// `None` for everything else (negative, fractional, NaN, infinite, above
    /// [`MAX_SAFE_INTEGER`], or not a number at all).
    fn as_depth(&self) -> Option<u64>;
}

impl DepthValue for u64 {
    fn as_depth(&self) -> Option<u64> {
        (*self <= MAX_SAFE_INTEGER).then_some(*self)
    }
}

impl DepthValue for u32 {
    fn as_depth(&self) -> Option<u64> {
        Some(u64::from(*self))
    }
}

impl DepthValue for usize {
    fn as_depth(&self) -> Option<u64> {
        u64::try_from(*self).ok()?.as_depth()
    }
}

impl DepthValue for i64 {
    fn as_depth(&self) -> Option<u64> {
        u64::try_from(*self).ok()?.as_depth()
    }
}

impl DepthValue for i32 {
    fn as_depth(&self) -> Option<u64> {
        u64::try_from(*self).ok()?.as_depth()
    }
}

impl DepthValue for f64 {
    fn as_depth(&self) -> Option<u64> {
        let v = *self;
        let safe = v.is_finite()
            && v.fract() == 0.0
            && v >= 0.0
            && !(v == 0.0 && v.is_sign_negative())
            && v <= MAX_SAFE_INTEGER as f64;
        // `v` is integral and within 0..=2^53-1, so the cast is exact.
        safe.then_some(v as u64)
    }
}

impl DepthValue for Number {
    fn as_depth(&self) -> Option<u64> {
        if let Some(n) = self.as_u64() {
            n.as_depth()
        } else if let Some(n) = self.as_i64() {
            n.as_depth()
        } else {
            self.as_f64()?.as_depth()
        }
    }
}

impl DepthValue for Value {
    fn as_depth(&self) -> Option<u64> {
        match self {
            Value::Number(n) => n.as_depth(),
            _ => None,
        }
    }
}

impl<T: DepthValue + ?Sized> DepthValue for &T {
    fn as_depth(&self) -> Option<u64> {
        (**self).as_depth()
    }
}

/// Validates an optional `maxDepth` (spec §2.11 `assertSubagentMaxDepth`): `None` passes;
/// anything else must be a non-negative safe integer, else
/// [`DepthError::InvalidMaxDepth`] ("subagent maxDepth must be a non-negative safe integer").
/// Returns the validated cap.
pub fn assert_subagent_max_depth<V: DepthValue>(max_depth: Option<V>) -> Result<Option<u64>, DepthError> {
    match max_depth {
        None => Ok(None),
        Some(v) => v.as_depth().map(Some).ok_or(DepthError::InvalidMaxDepth),
    }
}

/// An agent's delegation depth (spec §2.11 `delegationDepthOf`): the larger of its header's
/// `delegationDepth` (absent = 0; trusted, the session store validated it) and its runtime
/// `subagentDepth` option (absent = 0). A runtime value that is not a non-negative safe integer
/// fails with [`DepthError::InvalidRuntimeDepth`].
pub fn delegation_depth_of<V: DepthValue>(
    header_depth: Option<u64>,
    runtime_depth: Option<V>,
) -> Result<u64, DepthError> {
    let runtime = match runtime_depth {
        None => 0,
        Some(v) => v.as_depth().ok_or(DepthError::InvalidRuntimeDepth)?,
    };
    Ok(header_depth.unwrap_or(0).max(runtime))
}

/// The depth of a new child of a parent at `parent_depth` (spec §2.11 `resolveChildDepth`):
/// `parent_depth + 1`, which must stay a safe integer
/// ([`DepthError::ChildDepthOverflow`]) and, when a cap is given, must not exceed it
/// ([`DepthError::Exceeded`]; the cap is absolute and inclusive, so `max_depth: Some(0)` forbids
/// any child of a top-level agent). A cap above [`MAX_SAFE_INTEGER`] is
/// [`DepthError::InvalidMaxDepth`].
pub fn resolve_child_depth(parent_depth: u64, max_depth: Option<u64>) -> Result<u64, DepthError> {
    let max_depth = assert_subagent_max_depth(max_depth)?;
    let child = parent_depth
        .checked_add(1)
        .filter(|d| *d <= MAX_SAFE_INTEGER)
        .ok_or(DepthError::ChildDepthOverflow)?;
    match max_depth {
        Some(max) if child > max => Err(SubagentDepthError {
            attempted_depth: child,
            max_depth: max,
        }
        .into()),
        _ => Ok(child),
    }
}

/// [`delegation_depth_of`] for a live agent: its session header's `delegationDepth` against its
/// options' `subagent_depth` (spec §2.11 `delegationDepthOf(agent)`).
pub fn agent_delegation_depth(agent: &dyn Agent) -> Result<u64, DepthError> {
    delegation_depth_of(
        agent.session().header().delegation_depth,
        agent.options().subagent_depth,
    )
}

/// [`resolve_child_depth`] for a live parent (spec §2.11 `resolveChildDepth(parent, maxDepth)`):
/// `agent_delegation_depth(parent) + 1`, capped by `max_depth`.
pub fn resolve_child_depth_of(parent: &dyn Agent, max_depth: Option<u64>) -> Result<u64, DepthError> {
    resolve_child_depth(agent_delegation_depth(parent)?, max_depth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// spec: §2.11 — `maxDepth: -1` is rejected ("non-negative safe integer") and an absent
    /// `maxDepth` passes.
    #[test]
    fn max_depth_validation() {
        assert_eq!(assert_subagent_max_depth::<u64>(None), Ok(None));
        let err = assert_subagent_max_depth(Some(-1i64)).unwrap_err();
        assert_eq!(err, DepthError::InvalidMaxDepth);
        assert_eq!(
            err.to_string(),
            "subagent maxDepth must be a non-negative safe integer"
        );
        assert_eq!(assert_subagent_max_depth(Some(3u64)), Ok(Some(3)));
    }

    /// spec: §2.11 — `maxDepth: NaN`, fractions, infinities, negative zero and unsafe integers
    /// are all rejected.
    #[test]
    fn non_integers_are_rejected() {
        for bad in [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1.5,
            -0.0,
            -1.0,
            9_007_199_254_740_992.0,
        ] {
            assert_eq!(
                assert_subagent_max_depth(Some(bad)),
                Err(DepthError::InvalidMaxDepth),
                "{bad}"
            );
        }
        for bad in [
            json!("1"),
            json!(null),
            json!(-0.0),
            json!(2.5),
            json!(9_007_199_254_740_992u64),
            json!([1]),
        ] {
            assert_eq!(
                assert_subagent_max_depth(Some(&bad)),
                Err(DepthError::InvalidMaxDepth),
                "{bad}"
            );
        }
        assert_eq!(assert_subagent_max_depth(Some(&json!(2.0))), Ok(Some(2)));
        assert_eq!(assert_subagent_max_depth(Some(&json!(0))), Ok(Some(0)));
        assert_eq!(
            assert_subagent_max_depth(Some(MAX_SAFE_INTEGER)),
            Ok(Some(MAX_SAFE_INTEGER))
        );
        assert_eq!(
            assert_subagent_max_depth(Some(MAX_SAFE_INTEGER + 1)),
            Err(DepthError::InvalidMaxDepth)
        );
    }

    /// spec: §2.11 — `maxDepth: 0` forbids a child of a top-level agent ("exceeds maxDepth 0");
    /// a cap equal to the child depth is allowed.
    #[test]
    fn cap_is_absolute_and_inclusive() {
        let err = resolve_child_depth(0, Some(0)).unwrap_err();
        assert_eq!(
            err,
            DepthError::Exceeded(SubagentDepthError {
                attempted_depth: 1,
                max_depth: 0
            })
        );
        assert_eq!(err.to_string(), "subagent depth 1 exceeds maxDepth 0");
        assert_eq!(resolve_child_depth(0, Some(1)), Ok(1));
        assert_eq!(resolve_child_depth(2, None), Ok(3));
        assert_eq!(
            resolve_child_depth(2, Some(2)).unwrap_err().to_string(),
            "subagent depth 3 exceeds maxDepth 2"
        );
    }

    /// spec: §2.11 — the header is the monotone floor; runtime options may deepen but never
    /// lower it; an invalid runtime value is a type error.
    #[test]
    fn depth_of_takes_the_larger_and_validates_runtime() {
        assert_eq!(delegation_depth_of::<u64>(None, None), Ok(0));
        assert_eq!(delegation_depth_of(Some(3), Some(1u64)), Ok(3));
        assert_eq!(delegation_depth_of(Some(1), Some(4u64)), Ok(4));
        assert_eq!(delegation_depth_of(None, Some(2u64)), Ok(2));
        for bad in [-0.0, 1.5, f64::NAN, -2.0] {
            let err = delegation_depth_of(Some(1), Some(bad)).unwrap_err();
            assert_eq!(err, DepthError::InvalidRuntimeDepth);
            assert_eq!(
                err.to_string(),
                "agent subagentDepth must be a non-negative safe integer"
            );
        }
    }

    #[test]
    fn child_depth_overflow_is_a_range_error() {
        let err = resolve_child_depth(MAX_SAFE_INTEGER, None).unwrap_err();
        assert_eq!(err, DepthError::ChildDepthOverflow);
        assert_eq!(
            err.to_string(),
            "subagent child depth exceeds the safe-integer range"
        );
        assert_eq!(
            resolve_child_depth(u64::MAX, None),
            Err(DepthError::ChildDepthOverflow)
        );
        assert_eq!(
            resolve_child_depth(MAX_SAFE_INTEGER - 1, None),
            Ok(MAX_SAFE_INTEGER)
        );
        assert_eq!(
            resolve_child_depth(0, Some(u64::MAX)),
            Err(DepthError::InvalidMaxDepth)
        );
    }

    mod live_agent {
        use super::*;
        use agent::agent::{AgentOptions, AgentStatus, CancelOptions, InboxSnapshot};
        use agent::{
            AgentError, CancelCause, InboxTarget, Message, MessageId, Scope, Session, SessionId, SessionMeta,
        };
        use futures::future::BoxFuture;
        use std::sync::Arc;

        /// The smallest agent: an id, options and a session; every operation is inert.
        struct Stub {
            id: SessionId,
            options: AgentOptions,
            session: Arc<Session>,
            scope: Arc<Scope>,
        }

        impl Stub {
            fn new(header_depth: Option<u64>, runtime_depth: Option<u64>) -> Self {
                let id = SessionId::from("stub");
                let meta = SessionMeta {
                    delegation_depth: header_depth,
                    ..SessionMeta::default()
                };
                Self {
                    session: Arc::new(Session::new(meta.into_header(id.clone(), 1).unwrap(), None).unwrap()),
                    scope: Arc::new(Scope::new(id.clone(), None)),
                    options: AgentOptions {
                        subagent_depth: runtime_depth,
                        ..AgentOptions::default()
                    },
                    id,
                }
            }
        }

        impl Agent for Stub {
            fn id(&self) -> &SessionId {
                &self.id
            }
            fn options(&self) -> &AgentOptions {
                &self.options
            }
            fn session(&self) -> &Arc<Session> {
                &self.session
            }
            fn scope(&self) -> &Arc<Scope> {
                &self.scope
            }
            fn send(&self, message: Message, _: InboxTarget, _: bool) -> Result<MessageId, AgentError> {
                Ok(message.id)
            }
            fn remove_pending(&self, _: &MessageId) -> Result<bool, AgentError> {
                Ok(false)
            }
            fn inbox(&self) -> InboxSnapshot {
                InboxSnapshot::default()
            }
            fn cancel(&self, _: CancelCause, _: CancelOptions) {}
            fn status(&self) -> AgentStatus {
                AgentStatus::Idle
            }
            fn when_idle(&self) -> BoxFuture<'static, ()> {
                Box::pin(async {})
            }
            fn is_live(&self) -> bool {
                true
            }
        }

        /// spec: §2.11 — a live agent's depth is the larger of its persisted header depth and
        /// its runtime option (a resumed child keeps its floor); its child is one deeper and
        /// honours the cap; an unsafe runtime depth is the runtime type error.
        #[test]
        fn live_agent_depth_and_child_depth() {
            assert_eq!(agent_delegation_depth(&Stub::new(None, None)), Ok(0));
            assert_eq!(agent_delegation_depth(&Stub::new(Some(2), None)), Ok(2));
            assert_eq!(agent_delegation_depth(&Stub::new(Some(2), Some(0))), Ok(2));
            assert_eq!(agent_delegation_depth(&Stub::new(Some(1), Some(3))), Ok(3));
            assert_eq!(
                agent_delegation_depth(&Stub::new(None, Some(MAX_SAFE_INTEGER + 1))),
                Err(DepthError::InvalidRuntimeDepth)
            );
            assert_eq!(resolve_child_depth_of(&Stub::new(Some(2), None), None), Ok(3));
            assert_eq!(
                resolve_child_depth_of(&Stub::new(None, None), Some(0))
                    .unwrap_err()
                    .to_string(),
                "subagent depth 1 exceeds maxDepth 0"
            );
        }
    }

    proptest! {
        /// Every u64 is accepted exactly when it is a safe integer.
        #[test]
        fn u64_inputs_accepted_iff_safe(v in any::<u64>()) {
            prop_assert_eq!(assert_subagent_max_depth(Some(v)).is_ok(), v <= MAX_SAFE_INTEGER);
        }

        /// Every i64 is accepted exactly when it is non-negative and safe.
        #[test]
        fn i64_inputs_accepted_iff_non_negative_safe(v in any::<i64>()) {
            let ok = v >= 0 && (v as u64) <= MAX_SAFE_INTEGER;
            prop_assert_eq!(assert_subagent_max_depth(Some(v)).is_ok(), ok);
            prop_assert_eq!(delegation_depth_of(None, Some(v)).is_ok(), ok);
        }

        /// Every f64 is accepted exactly when it is an integral, non-negative, non-negative-zero,
        /// safe value, and then converts exactly.
        #[test]
        fn f64_inputs_accepted_iff_safe_integer(v in any::<f64>()) {
            let ok = v.is_finite() && v.fract() == 0.0 && v >= 0.0 && !(v == 0.0 && v.is_sign_negative())
                && v <= MAX_SAFE_INTEGER as f64;
            let got = assert_subagent_max_depth(Some(v));
            prop_assert_eq!(got.is_ok(), ok);
            if let Ok(Some(d)) = got {
                prop_assert_eq!(d as f64, v);
            }
        }

        /// Child depth arithmetic never overflows or panics, always yields a safe integer, and
        /// honours the inclusive cap.
        #[test]
        fn child_depth_never_overflows(parent in any::<u64>(), max in proptest::option::of(any::<u64>())) {
            match resolve_child_depth(parent, max) {
                Ok(child) => {
                    prop_assert_eq!(child, parent + 1);
                    prop_assert!(child <= MAX_SAFE_INTEGER);
                    if let Some(m) = max { prop_assert!(child <= m); }
                }
                Err(DepthError::InvalidMaxDepth) => prop_assert!(max.is_some_and(|m| m > MAX_SAFE_INTEGER)),
                Err(DepthError::ChildDepthOverflow) => prop_assert!(parent >= MAX_SAFE_INTEGER),
                Err(DepthError::Exceeded(e)) => {
                    prop_assert_eq!(e.attempted_depth, parent + 1);
                    prop_assert!(max.is_some_and(|m| parent + 1 > m));
                }
                Err(other) => prop_assert!(false, "unexpected {other:?}"),
            }
        }
    }
}
