//! Cancellation: a [`Signal`] is a cancellation token that carries a first-wins [`CancelCause`].

use std::fmt;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering, fence};

use parking_lot::Mutex;
use serde::{Deserialize, Deserializer, Serialize};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::content::{known_tag, read_open_union};

/// The `kind` tags [`CancelCause`] reads as typed variants (every variant but
/// [`CancelCause::Unknown`]'s).
pub const CANCEL_CAUSE_KINDS: [&str; 6] = ["user", "parent", "hook", "disposed", "legacy", "other"];

/// Why an agent's activity was cancelled. Serialized as `{"kind": …}` in the spec's vocabulary.
///
/// The union is open: a cause this crate does not know (`legacy` in imported logs, or a
/// caller-supplied reason) round-trips through [`CancelCause::Other`]. A cause whose `kind` is
/// one of [`CANCEL_CAUSE_KINDS`] but whose fields do not fit (a `hook` without its reason) is
/// refused with an error naming the kind; it never reads as [`CancelCause::Unknown`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
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
    /// its `kind`. Its `kind`, if any, is never one of [`CANCEL_CAUSE_KINDS`].
    #[serde(untagged)]
    Unknown(serde_json::Map<String, serde_json::Value>),
}

/// The known causes' wire form, for reading.
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
enum KnownCause {
    User,
    Parent,
    Hook { reason: String },
    Disposed,
    Legacy,
    Other { reason: String },
}

impl<'de> Deserialize<'de> for CancelCause {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let known = match read_open_union(deserializer, "kind", &CANCEL_CAUSE_KINDS, "cancel cause")? {
            Ok(known) => known,
            Err(fields) => return Ok(Self::Unknown(fields)),
        };
        Ok(match known {
            KnownCause::User => Self::User,
            KnownCause::Parent => Self::Parent,
            KnownCause::Hook { reason } => Self::Hook { reason },
            KnownCause::Disposed => Self::Disposed,
            KnownCause::Legacy => Self::Legacy,
            KnownCause::Other { reason } => Self::Other { reason },
        })
    }
}

impl CancelCause {
    /// For [`CancelCause::Unknown`] whose `kind` is one of [`CANCEL_CAUSE_KINDS`] (which a log
    /// refuses: it would read back as the typed variant), that kind; otherwise `None`.
    pub fn unknown_with_known_kind(&self) -> Option<&str> {
        match self {
            Self::Unknown(fields) => known_tag(fields, "kind", &CANCEL_CAUSE_KINDS),
            _ => None,
        }
    }
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
    shared: Arc<Shared>,
}

/// The state every clone of one signal shares.
///
/// The token is created on first need (waiting, [`Signal::run`], [`Signal::token`]); until then
/// cancellation lives in the flags alone, so signals that are only checked and cancelled never
/// touch the token tree, and clones share one token handle.
#[derive(Default)]
struct Shared {
    /// The token, once needed: a child of the parent's token for a child signal, cancelled at
    /// creation when the signal already is.
    token: OnceLock<CancellationToken>,
    /// The first-wins cause of a direct [`Signal::cancel`].
    cause: Mutex<Option<CancelCause>>,
    /// The signal this one was derived from by [`Signal::child`].
    parent: Option<Signal>,
    /// Raised by [`Signal::cancel`] (after the cause is set, before the token is cancelled).
    cancelled: AtomicBool,
    /// The synchronous listeners registered by [`Signal::on_cancel`] on this signal or on a
    /// descendant; drained by the [`Signal::cancel`] that cancels this signal.
    listeners: Mutex<Listeners>,
    /// Raised once [`Signal::token`] has handed the token out. Until then (here and in every
    /// ancestor) the token can only be cancelled through [`Signal::cancel`] of this signal or an
    /// ancestor, which raise `cancelled`, so [`Signal::is_cancelled`] reads flags instead of
    /// locking the token's tree node.
    exposed: AtomicBool,
}

/// The [`Signal::on_cancel`] slots registered on one signal, in registration order: the first
/// in place, so that a signal with a single listener (the common case) allocates no list.
#[derive(Default)]
struct Listeners {
    /// The first slot, unless it was removed (then later slots stay in `rest`).
    first: Option<Arc<dyn ListenerSlot>>,
    /// The later slots.
    rest: Vec<Arc<dyn ListenerSlot>>,
}

impl Listeners {
    fn push(&mut self, slot: Arc<dyn ListenerSlot>) {
        if self.first.is_none() && self.rest.is_empty() {
            self.first = Some(slot);
        } else {
            self.rest.push(slot);
        }
    }

    /// Removes `slot` (every occurrence).
    fn remove(&mut self, slot: &Arc<dyn ListenerSlot>) {
        if self.first.as_ref().is_some_and(|first| same_slot(first, slot)) {
            self.first = None;
        }
        if !self.rest.is_empty() {
            self.rest.retain(|s| !same_slot(s, slot));
        }
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.first.is_none() && self.rest.is_empty()
    }

    /// Every slot, in registration order.
    fn into_ordered(self) -> impl Iterator<Item = Arc<dyn ListenerSlot>> {
        self.first.into_iter().chain(self.rest)
    }
}

/// One registered [`Signal::on_cancel`] action, shared by every signal of the chain it was
/// registered on; whichever runs or removes it first takes the action. (One allocation holds
/// the slot and the action.)
trait ListenerSlot: Send + Sync {
    /// Runs the action if nobody took it yet, containing a panic.
    fn run(&self);
    /// Drops the action unrun if nobody took it yet.
    fn discard(&self);
    /// Whether the action is still there.
    fn pending(&self) -> bool;
}

struct Slot<F> {
    action: Mutex<Option<F>>,
}

impl<F: FnOnce() + Send + 'static> ListenerSlot for Slot<F> {
    fn run(&self) {
        let action = self.action.lock().take();
        if let Some(action) = action
            && std::panic::catch_unwind(std::panic::AssertUnwindSafe(action)).is_err()
        {
            tracing::warn!("a signal's cancel listener panicked; the cancellation stands");
        }
    }

    fn discard(&self) {
        let action = self.action.lock().take();
        drop(action);
    }

    fn pending(&self) -> bool {
        self.action.lock().is_some()
    }
}

/// Whether two slots are the same registration (data pointers; vtables may differ).
fn same_slot(a: &Arc<dyn ListenerSlot>, b: &Arc<dyn ListenerSlot>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// The registration of a [`Signal::on_cancel`] action: dropping it removes the action from the
/// signal (and its ancestors) unrun.
#[must_use = "dropping the listener removes it"]
pub struct CancelListener {
    signal: Signal,
    slot: Arc<dyn ListenerSlot>,
}

impl CancelListener {
    /// Takes the action (so it never runs) and removes the slot from every list of the chain.
    fn unregister(&self) {
        self.slot.discard();
        let mut chain = Some(&self.signal);
        while let Some(signal) = chain {
            signal.shared.listeners.lock().remove(&self.slot);
            chain = signal.shared.parent.as_ref();
        }
    }
}

impl Drop for CancelListener {
    fn drop(&mut self) {
        self.unregister();
    }
}

impl fmt::Debug for CancelListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelListener")
            .field("pending", &self.slot.pending())
            .finish()
    }
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
            shared: Arc::new(Shared {
                parent: Some(self.clone()),
                ..Shared::default()
            }),
        }
    }

    /// A guard that cancels this signal with `cause` when dropped, unless
    /// [`disarm`](CancelOnDrop::disarm)ed first: for work handed to a task whose caller may be
    /// dropped mid-await (an abandoned tool call), so that the task learns nobody is waiting.
    pub fn cancel_on_drop(&self, cause: CancelCause) -> CancelOnDrop {
        CancelOnDrop {
            armed: Some((self.clone(), cause)),
        }
    }

    /// Cancels with `cause`. Returns `true` when this call decided the cause (first wins), `false`
    /// when the signal was already cancelled (directly or through an ancestor).
    pub fn cancel(&self, cause: CancelCause) -> bool {
        if self.is_cancelled() {
            return false;
        }
        {
            let mut slot = self.shared.cause.lock();
            if slot.is_some() {
                return false;
            }
            *slot = Some(cause);
        }
        self.shared.cancelled.store(true, Ordering::SeqCst);
        // Pairs with the fence in `token_ref`: either this sees the token, or its creator sees
        // the flag (and cancels the token itself).
        fence(Ordering::SeqCst);
        if let Some(token) = self.shared.token.get() {
            token.cancel();
        }
        // The flag is up, so `on_cancel` (which checks it under this lock) adds no more.
        let listeners = std::mem::take(&mut *self.shared.listeners.lock());
        for slot in listeners.into_ordered() {
            slot.run();
        }
        true
    }

    /// Registers `action` to run **synchronously**, at most once, inside the [`Signal::cancel`]
    /// call that cancels this signal or one of its ancestors, on the cancelling thread, after the
    /// cause is set and the token is cancelled.
    ///
    /// # Contract
    /// * **Already cancelled.** When the signal is already cancelled at registration (by a
    ///   `cancel` on it or an ancestor), the action is dropped without running; check
    ///   [`is_cancelled`](Signal::is_cancelled) after registering, as the spec's listener handoff
    ///   does, to close that window.
    /// * **Removal.** Dropping the returned [`CancelListener`] removes the registration; the
    ///   action is then dropped unrun. A `cancel` racing the drop on another thread may still
    ///   run it (once).
    /// * **Direct token cancellation** (through [`Signal::token`], which sets no cause) runs no
    ///   listener; a caller that must see it also awaits [`cancelled`](Signal::cancelled).
    /// * **Panics** in the action are caught and logged; the remaining listeners still run and
    ///   `cancel` returns normally.
    /// * The action must not block: it runs inside whichever call cancels the signal.
    pub fn on_cancel(&self, action: impl FnOnce() + Send + 'static) -> CancelListener {
        let slot: Arc<dyn ListenerSlot> = Arc::new(Slot {
            action: Mutex::new(Some(action)),
        });
        let mut chain = Some(self);
        while let Some(signal) = chain {
            let mut listeners = signal.shared.listeners.lock();
            if signal.shared.cancelled.load(Ordering::SeqCst) {
                drop(listeners);
                let listener = CancelListener {
                    signal: self.clone(),
                    slot,
                };
                // Undo the registrations made so far and drop the action unrun.
                listener.unregister();
                return listener;
            }
            listeners.push(slot.clone());
            drop(listeners);
            chain = signal.shared.parent.as_ref();
        }
        CancelListener {
            signal: self.clone(),
            slot,
        }
    }

    /// The token, created on first use (see [`Shared`]).
    fn token_ref(&self) -> &CancellationToken {
        if let Some(token) = self.shared.token.get() {
            return token;
        }
        let mut created = false;
        let token = self.shared.token.get_or_init(|| {
            created = true;
            match &self.shared.parent {
                Some(parent) => parent.token_ref().child_token(),
                None => CancellationToken::new(),
            }
        });
        if created {
            fence(Ordering::SeqCst);
            if self.shared.cancelled.load(Ordering::SeqCst) {
                token.cancel();
            }
        }
        token
    }

    /// Whether the signal (or any ancestor) is cancelled.
    #[inline]
    pub fn is_cancelled(&self) -> bool {
        // The common cases (cancelled here; a root whose token was never handed out) inline.
        let shared = &*self.shared;
        if shared.cancelled.load(Ordering::Acquire) {
            return true;
        }
        if shared.parent.is_none() && !shared.exposed.load(Ordering::Acquire) {
            return false;
        }
        self.is_cancelled_through_chain()
    }

    /// [`Signal::is_cancelled`] for a child or an exposed token: the ancestors' flags, or the
    /// token itself once any token on the chain was handed out.
    fn is_cancelled_through_chain(&self) -> bool {
        let mut signal = self;
        loop {
            let shared = &signal.shared;
            if shared.cancelled.load(Ordering::Acquire) {
                return true;
            }
            if shared.exposed.load(Ordering::Acquire) {
                // Someone may have cancelled this token (or an ancestor's) directly.
                return self.token_ref().is_cancelled();
            }
            match &shared.parent {
                Some(parent) => signal = parent,
                None => return false,
            }
        }
    }

    /// The cause, once cancelled: this signal's own cause when it was cancelled directly, else the
    /// nearest cancelled ancestor's. `None` while uncancelled.
    pub fn cause(&self) -> Option<CancelCause> {
        if !self.is_cancelled() {
            return None;
        }
        if let Some(cause) = self.shared.cause.lock().clone() {
            return Some(cause);
        }
        self.shared.parent.as_ref().and_then(|p| p.cause())
    }

    /// Resolves once the signal is cancelled. Cancel-safe: dropping the future has no effect.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token_ref().cancelled()
    }

    /// The underlying token, for APIs that take a [`CancellationToken`]. Cancelling it directly
    /// leaves the cause unset; prefer [`Signal::cancel`].
    pub fn token(&self) -> &CancellationToken {
        self.shared.exposed.store(true, Ordering::Release);
        self.token_ref()
    }

    /// Runs `fut` until it completes or the signal is cancelled, whichever comes first; on
    /// cancellation returns `Err(cause)`.
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, CancelCause> {
        tokio_util::future::FutureExt::with_cancellation_token(fut, self.token_ref())
            .await
            .ok_or_else(|| self.cause().unwrap_or(CancelCause::Disposed))
    }
}

/// Cancels a [`Signal`] when dropped, unless disarmed (see [`Signal::cancel_on_drop`]).
///
/// Dropping it cancels the signal with the guard's cause (a no-op when the signal was already
/// cancelled: the first cause wins); [`disarm`](Self::disarm) consumes it without cancelling.
#[must_use = "dropping the guard cancels the signal at once"]
pub struct CancelOnDrop {
    armed: Option<(Signal, CancelCause)>,
}

impl CancelOnDrop {
    /// Consumes the guard without cancelling the signal.
    pub fn disarm(mut self) {
        self.armed = None;
    }
}

impl fmt::Debug for CancelOnDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelOnDrop")
            .field("armed", &self.armed.is_some())
            .finish()
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some((signal, cause)) = self.armed.take() {
            signal.cancel(cause);
        }
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
    fn cancel_on_drop_cancels_unless_disarmed() {
        let s = Signal::new();
        s.cancel_on_drop(CancelCause::Disposed).disarm();
        assert!(!s.is_cancelled());
        drop(s.cancel_on_drop(CancelCause::User));
        assert_eq!(s.cause(), Some(CancelCause::User));
        drop(s.cancel_on_drop(CancelCause::Disposed));
        assert_eq!(s.cause(), Some(CancelCause::User), "the first cause stands");
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

    #[test]
    fn direct_token_cancellation_is_seen_through_the_chain() {
        // A token cancelled behind the signal's back (no cause).
        let s = Signal::new();
        let clone = s.clone();
        let child = s.child();
        let grandchild = child.child();
        assert!(!grandchild.is_cancelled());
        s.token().clone().cancel();
        assert!(s.is_cancelled() && clone.is_cancelled());
        assert!(child.is_cancelled() && grandchild.is_cancelled());
        assert_eq!(grandchild.cause(), None);
        assert!(!s.cancel(CancelCause::User));
        // A child's token cancelled directly leaves the parent alone.
        let parent = Signal::new();
        let child = parent.child();
        child.token().cancel();
        assert!(child.is_cancelled());
        assert!(!parent.is_cancelled());
        // A grandparent's cause reaches a grandchild at once, and the tokens follow.
        let root = Signal::new();
        let grandchild = root.child().child();
        assert!(root.cancel(CancelCause::Parent));
        assert!(grandchild.is_cancelled());
        assert!(grandchild.token().is_cancelled());
        assert_eq!(grandchild.cause(), Some(CancelCause::Parent));
        // Exposure after derivation still routes through the token.
        let root = Signal::new();
        let child = root.child();
        let token = root.token().clone();
        assert!(!child.is_cancelled());
        token.cancel();
        assert!(child.is_cancelled());
        assert_eq!(child.cause(), None);
    }

    #[tokio::test]
    async fn tokens_made_late_agree_with_the_flags() {
        // Cancelled before any token exists: the token is born cancelled, waits end at once.
        let s = Signal::new();
        let clone = s.clone();
        assert!(s.cancel(CancelCause::User));
        clone.cancelled().await;
        assert!(clone.token().is_cancelled());
        // A child made before the parent's token exists follows the parent's later cancel.
        let parent = Signal::new();
        let child = parent.child();
        let grandchild = child.child();
        let waiter = tokio::spawn({
            let grandchild = grandchild.clone();
            async move { grandchild.cancelled().await }
        });
        tokio::task::yield_now().await;
        assert!(parent.cancel(CancelCause::Parent));
        waiter.await.unwrap();
        assert!(grandchild.token().is_cancelled());
        assert_eq!(grandchild.cause(), Some(CancelCause::Parent));
        // An ancestor cancelled first: a descendant's first token is already cancelled.
        let root = Signal::new();
        let leaf = root.child().child();
        root.cancel(CancelCause::Hook { reason: "r".into() });
        leaf.cancelled().await;
        assert_eq!(
            leaf.run(std::future::pending::<()>()).await,
            Err(CancelCause::Hook { reason: "r".into() })
        );
        // A child's own cancel does not reach its parent's token.
        let parent = Signal::new();
        let child = parent.child();
        child.cancel(CancelCause::User);
        assert!(child.token().is_cancelled());
        assert!(!parent.token().is_cancelled() && !parent.is_cancelled());
    }

    #[test]
    fn racing_cancel_and_token_creation_always_cancel_the_token() {
        for _ in 0..200 {
            let s = Signal::new();
            let child = s.child();
            let canceller = std::thread::spawn({
                let s = s.clone();
                move || s.cancel(CancelCause::User)
            });
            let token = child.token().clone();
            assert!(canceller.join().unwrap());
            assert!(token.is_cancelled());
            assert!(child.is_cancelled());
        }
    }

    fn counter() -> (
        Arc<std::sync::atomic::AtomicUsize>,
        impl Fn() + Send + Sync + Clone + 'static,
    ) {
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let bump = {
            let count = count.clone();
            move || {
                count.fetch_add(1, Ordering::SeqCst);
            }
        };
        (count, bump)
    }

    /// The first listener is kept in place and the later ones in a list: whichever are
    /// removed, the remaining ones run in registration order.
    #[test]
    fn listeners_run_in_registration_order_after_removals() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let push = |n: u32| {
            let order = order.clone();
            move || order.lock().push(n)
        };
        let s = Signal::new();
        let first = s.on_cancel(push(1));
        let _second = s.on_cancel(push(2));
        let third = s.on_cancel(push(3));
        drop(first);
        let _fourth = s.on_cancel(push(4));
        drop(third);
        let _fifth = s.on_cancel(push(5));
        s.cancel(CancelCause::User);
        assert_eq!(*order.lock(), vec![2, 4, 5]);

        // Emptied, the list takes a new first listener in place again.
        order.lock().clear();
        let s = Signal::new();
        drop(s.on_cancel(push(1)));
        drop(s.on_cancel(push(2)));
        assert!(s.shared.listeners.lock().is_empty());
        let _a = s.on_cancel(push(3));
        let _b = s.on_cancel(push(4));
        s.cancel(CancelCause::User);
        assert_eq!(*order.lock(), vec![3, 4]);
    }

    #[test]
    fn listeners_run_synchronously_once_inside_cancel() {
        let s = Signal::new();
        let (count, bump) = counter();
        let seen = Arc::new(Mutex::new(None));
        let _a = s.on_cancel(bump.clone());
        let _b = s.on_cancel({
            let s = s.clone();
            let seen = seen.clone();
            // Inside the action the cancellation is already visible, cause included.
            move || *seen.lock() = Some((s.is_cancelled(), s.cause()))
        });
        assert_eq!(count.load(Ordering::SeqCst), 0);
        assert!(s.cancel(CancelCause::User));
        assert_eq!(count.load(Ordering::SeqCst), 1, "ran before cancel returned");
        assert_eq!(*seen.lock(), Some((true, Some(CancelCause::User))));
        assert!(!s.cancel(CancelCause::Parent));
        assert_eq!(count.load(Ordering::SeqCst), 1, "at most once");
    }

    #[test]
    fn an_ancestors_cancel_runs_a_descendants_listener() {
        let root = Signal::new();
        let leaf = root.child().child();
        let (count, bump) = counter();
        let _l = leaf.on_cancel(bump);
        root.cancel(CancelCause::Parent);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        // The leaf's own later cancel finds the action taken.
        leaf.cancel(CancelCause::User);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        // A descendant's cancel does not run an ancestor's listener.
        let root = Signal::new();
        let child = root.child();
        let (count, bump) = counter();
        let _l = root.on_cancel(bump);
        child.cancel(CancelCause::User);
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn listeners_on_cancelled_signals_or_dropped_guards_never_run() {
        let (count, bump) = counter();
        let s = Signal::cancelled_with(CancelCause::User);
        drop(s.on_cancel(bump.clone()));
        let root = Signal::new();
        let child = root.child();
        root.cancel(CancelCause::User);
        let kept = child.on_cancel(bump.clone());
        child.cancel(CancelCause::Parent);
        assert_eq!(count.load(Ordering::SeqCst), 0, "registered after cancellation");
        drop(kept);
        let s = Signal::new();
        drop(s.on_cancel(bump.clone()));
        assert!(
            s.shared.listeners.lock().is_empty(),
            "the guard's drop removes the slot"
        );
        let leaf = Signal::new().child();
        let guard = leaf.on_cancel(bump.clone());
        drop(guard);
        assert!(leaf.shared.listeners.lock().is_empty());
        assert!(
            leaf.shared
                .parent
                .as_ref()
                .unwrap()
                .shared
                .listeners
                .lock()
                .is_empty()
        );
        s.cancel(CancelCause::User);
        leaf.cancel(CancelCause::User);
        assert_eq!(count.load(Ordering::SeqCst), 0);
        // Direct token cancellation sets no cause and runs no listener.
        let s = Signal::new();
        let _l = s.on_cancel(bump);
        s.token().cancel();
        assert!(s.is_cancelled());
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_panicking_listener_is_contained() {
        let s = Signal::new();
        let (count, bump) = counter();
        let _a = s.on_cancel(|| panic!("listener failure"));
        let _b = s.on_cancel(bump);
        assert!(s.cancel(CancelCause::User));
        assert_eq!(count.load(Ordering::SeqCst), 1, "later listeners still run");
        assert!(s.is_cancelled());
    }

    #[test]
    fn racing_registration_and_cancel_run_the_action_at_most_once() {
        for _ in 0..200 {
            let root = Signal::new();
            let leaf = root.child();
            let (count, bump) = counter();
            let canceller = std::thread::spawn({
                let root = root.clone();
                move || root.cancel(CancelCause::User)
            });
            let guard = leaf.on_cancel(bump.clone());
            assert!(canceller.join().unwrap());
            assert!(count.load(Ordering::SeqCst) <= 1);
            drop(guard);
            // Registered strictly before the cancel: it always runs.
            let s = Signal::new();
            let (count, bump) = counter();
            let guard = s.on_cancel(bump);
            std::thread::spawn({
                let s = s.clone();
                move || s.cancel(CancelCause::User)
            })
            .join()
            .unwrap();
            assert_eq!(count.load(Ordering::SeqCst), 1);
            drop(guard);
        }
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
