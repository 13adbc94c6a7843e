//! Cancellation: a [`Signal`] is a cancellation token that carries a first-wins [`CancelCause`].

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// Why an agent's activity was cancelled. Serialized as `{"kind": …}` in the spec's vocabulary.
///
/// The union is open: a cause this crate does not know (`legacy` in imported logs, or a
/// caller-supplied reason) round-trips through [`CancelCause::Other`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum CancelCause {
    /// A user (or direct caller) stopped the work.
    User,
    /// The delegating parent stopped the work (used by the subagent driver).
    Parent,
    /// A hook stopped the work, with its reason.
    Hook {
        /// The hook's reason.
        reason: String,
    },
    /// Teardown: the agent's handle is being disposed.
    Disposed,
    /// Imported logs whose cause is unknown.
    Legacy,
    /// A caller-supplied cause with a free-form reason. Serialized as
    /// `{"kind": "other", "reason": …}`.
    Other {
        /// A description of the cause.
        reason: String,
    },
    /// A cause kind this crate does not know (from a foreign log), kept as raw JSON including
    /// its `kind`.
    #[serde(untagged)]
    Unknown(serde_json::Map<String, serde_json::Value>),
}

impl fmt::Display for CancelCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::User => f.write_str("user"),
            Self::Parent => f.write_str("parent"),
            Self::Hook { reason } => write!(f, "hook: {reason}"),
            Self::Disposed => f.write_str("disposed"),
            Self::Legacy => f.write_str("legacy"),
            Self::Other { reason } => f.write_str(reason),
            Self::Unknown(map) => f.write_str(map.get("kind").and_then(|k| k.as_str()).unwrap_or("unknown")),
        }
    }
}

/// A cancellation channel with a first-wins cause.
///
/// A `Signal` is a [`CancellationToken`] plus a shared slot for the [`CancelCause`]. Cloning a
/// signal yields another handle to the **same** channel. [`Signal::child`] derives a signal that is
/// cancelled (with the parent's cause) whenever its parent is, but can also be cancelled on its own
/// without affecting the parent.
///
/// The first call to [`Signal::cancel`] decides the cause; later calls are no-ops. Cancellation is
/// level-triggered: once cancelled, a signal stays cancelled, and [`Signal::cancelled`] resolves
/// immediately.
#[derive(Clone, Default)]
pub struct Signal {
    token: CancellationToken,
    cause: Arc<Mutex<Option<CancelCause>>>,
    parent: Option<Arc<Signal>>,
}

impl fmt::Debug for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signal")
            .field("cancelled", &self.is_cancelled())
            .field("cause", &self.cause())
            .finish()
    }
}

impl Signal {
    /// A fresh, uncancelled signal.
    pub fn new() -> Self {
        Self::default()
    }

    /// A signal that is already cancelled with `cause`.
    pub fn cancelled_with(cause: CancelCause) -> Self {
        let signal = Self::new();
        signal.cancel(cause);
        signal
    }

    /// Derives a child signal: cancelling `self` cancels the child (whose cause then reads as the
    /// parent's), cancelling the child leaves `self` untouched.
    pub fn child(&self) -> Self {
        Self {
            token: self.token.child_token(),
            cause: Arc::new(Mutex::new(None)),
            parent: Some(Arc::new(self.clone())),
        }
    }

    /// Cancels with `cause`. Returns `true` when this call decided the cause (first wins), `false`
    /// when the signal was already cancelled (directly or through an ancestor).
    pub fn cancel(&self, cause: CancelCause) -> bool {
        if self.is_cancelled() {
            return false;
        }
        {
            let mut slot = self.cause.lock();
            if slot.is_some() {
                return false;
            }
            *slot = Some(cause);
        }
        self.token.cancel();
        true
    }

    /// Whether the signal (or any ancestor) is cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// The cause, once cancelled: this signal's own cause when it was cancelled directly, else the
    /// nearest cancelled ancestor's. `None` while uncancelled.
    pub fn cause(&self) -> Option<CancelCause> {
        if !self.is_cancelled() {
            return None;
        }
        if let Some(cause) = self.cause.lock().clone() {
            return Some(cause);
        }
        self.parent.as_ref().and_then(|p| p.cause())
    }

    /// Resolves once the signal is cancelled. Cancel-safe: dropping the future has no effect.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// The underlying token, for APIs that take a [`CancellationToken`]. Cancelling it directly
    /// leaves the cause unset; prefer [`Signal::cancel`].
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Runs `fut` until it completes or the signal is cancelled, whichever comes first; on
    /// cancellation returns `Err(cause)`.
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, CancelCause> {
        tokio_util::future::FutureExt::with_cancellation_token(fut, &self.token)
            .await
            .ok_or_else(|| self.cause().unwrap_or(CancelCause::Disposed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_causes_round_trip() {
        let raw = json!({"kind": "timeout", "after": 5});
        let cause: CancelCause = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(cause.to_string(), "timeout");
        assert_eq!(serde_json::to_value(&cause).unwrap(), raw);
    }

    #[test]
    fn first_cause_wins() {
        let s = Signal::new();
        assert!(s.cancel(CancelCause::User));
        assert!(!s.cancel(CancelCause::Disposed));
        assert_eq!(s.cause(), Some(CancelCause::User));
    }

    #[test]
    fn child_inherits_parent_cause_but_not_vice_versa() {
        let parent = Signal::new();
        let child = parent.child();
        child.cancel(CancelCause::Hook { reason: "x".into() });
        assert!(!parent.is_cancelled());
        let parent = Signal::new();
        let child = parent.child();
        parent.cancel(CancelCause::Parent);
        assert!(child.is_cancelled());
        assert_eq!(child.cause(), Some(CancelCause::Parent));
        assert!(!child.cancel(CancelCause::User));
    }

    #[test]
    fn causes_serialize_in_spec_shape() {
        assert_eq!(
            serde_json::to_value(CancelCause::Parent).unwrap(),
            json!({"kind": "parent"})
        );
        assert_eq!(
            serde_json::to_value(CancelCause::Hook { reason: "r".into() }).unwrap(),
            json!({"kind": "hook", "reason": "r"})
        );
    }

    #[tokio::test]
    async fn run_races_the_signal() {
        let s = Signal::cancelled_with(CancelCause::User);
        let out = s.run(std::future::pending::<()>()).await;
        assert_eq!(out, Err(CancelCause::User));
        let s = Signal::new();
        assert_eq!(s.run(async { 3 }).await, Ok(3));
    }
}
