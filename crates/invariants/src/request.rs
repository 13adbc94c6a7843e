//! The agent-loop companion (providers §6.6, **L1–L8**): request reconstruction. A model
//! request an agent loop built from its log must be exactly what the log says at dispatch.
//!
//! The reference installs this check first in its model-stream interceptor chain. The Rust
//! design has no such chain: a host hands each provider's [`ModelAdapter`] to its runtime, so the
//! check is a wrapper, [`CheckedModel`], that verifies each request **before** delegating to the
//! adapter it wraps — nothing inside the wrapped adapter (a replay adapter that answers at once,
//! a scripted double) can run first or hide the check.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use agent::event::{EpochHeader, EventData};
use agent::model::{FinishReason, GenerateOptions, LlmFailure, ModelAdapter, ModelStream, StreamChunk};
use agent::{Session, SessionEvent, SessionId, SessionStore};

use crate::registry::Installer;
use crate::replay::UNKNOWN_SESSION;
use crate::rule::RuleId;
use crate::violation::Violation;

/// The package the agent-loop companion registers under.
pub const AGENT_LOOP_PACKAGE: &str = "agent-loop";

/// The failure code of the error finish a vetoed request streams.
pub const INVARIANT_FAILURE_CODE: &str = "INVARIANT";

/// Finds a live session by id (for example a [`SessionStore`]'s `get`).
pub type SessionLookup = Arc<dyn Fn(&SessionId) -> Option<Arc<Session>> + Send + Sync>;

/// The request-reconstruction check (**L2, L3, L5–L8**; **L1** and **L4** hold by
/// construction, see below) and its findings.
///
/// For a request marked [`loop_built`](GenerateOptions::loop_built), in this order:
///
/// * **L2** it carries a session id; **L3** the lookup finds that session live (without a
///   session the remaining rules cannot be evaluated);
/// * **L5** the log's last `step/start` is still open — the loop dispatches inside a step;
/// * **L6** the log holds a `request/header` (the loop writes one at an agent's first request
///   and whenever the configuration changes, so the header in force may precede the open step);
/// * **L7** `messages` equal [`agent::derive_messages`] of the log as it is at dispatch —
///   context appended inside the open step included, no unlogged prefix or suffix;
/// * **L8** `model`, `system`, `temperature`, `max_tokens`, `stop` and `tools` equal the latest
///   `request/header` (absent tools ≡ an empty list).
///
/// Unmarked requests (one-shot calls such as summaries or titles) are skipped.
///
/// **L1/L4 (frozen request, frozen messages).** A request reaches an adapter as an
/// `Arc<GenerateOptions>`: while it is shared nobody can mutate it or its `messages` (there is no
/// interior mutability in it), so the request that was checked is exactly the request that is
/// streamed — [`CheckedModel`] hands the very same `Arc` on. The reference's runtime freeze
/// checks have nothing left to catch.
///
/// The check is inert until a session lookup is bound ([`bind`](Self::bind),
/// [`bind_store`](Self::bind_store), or installation through the registry): a companion that is
/// not installed checks nothing.
///
/// Locking: the lookup and the findings each sit behind a lock held only to read the lookup or
/// to push a finding; the session's log is read through its own immutable snapshot.
#[derive(Default)]
pub struct RequestCheck {
    lookup: RwLock<Option<SessionLookup>>,
    found: Mutex<Vec<Violation>>,
    /// How many marked requests were checked while a lookup was bound.
    checked: AtomicU64,
}

impl fmt::Debug for RequestCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestCheck")
            .field("bound", &self.is_bound())
            .field("found", &self.lock_found().len())
            .finish()
    }
}

/// The state of a log that the request rules read.
struct LogFacts<'a> {
    /// The last `step/start` as `(seq, turn, step)`, and whether it is still open.
    last_step: Option<((u64, u64, u64), bool)>,
    /// The latest `request/header`.
    header: Option<&'a EpochHeader>,
}

fn log_facts(events: &[Arc<SessionEvent>]) -> LogFacts<'_> {
    let mut last_step = None;
    let mut header = None;
    for ev in events {
        match &ev.data {
            EventData::StepStart { turn, step } => last_step = Some(((ev.seq, *turn, *step), true)),
            EventData::StepEnd { .. } | EventData::TurnEnd { .. } => {
                if let Some((_, open)) = &mut last_step {
                    *open = false;
                }
            }
            EventData::RequestHeader { header: h, .. } => header = Some(&**h),
            _ => {}
        }
    }
    LogFacts { last_step, header }
}

/// The header fields L8 compares, which differ between `request` and `header`.
fn header_divergence(request: &GenerateOptions, header: &EpochHeader) -> Vec<String> {
    let mut out = Vec::new();
    let config = &header.config;
    if request.model != config.model {
        out.push(format!(
            "model {:?} (request has {:?})",
            config.model, request.model
        ));
    }
    if request.system != header.system {
        out.push("the header's system text".to_owned());
    }
    if request.temperature != config.temperature {
        out.push(format!(
            "temperature {:?} (request has {:?})",
            config.temperature, request.temperature
        ));
    }
    if request.max_tokens != config.max_tokens {
        out.push(format!(
            "maxTokens {:?} (request has {:?})",
            config.max_tokens, request.max_tokens
        ));
    }
    if request.stop != config.stop {
        out.push(format!("stop {:?} (request has {:?})", config.stop, request.stop));
    }
    let tools = |t: &Option<Vec<agent::ToolSchema>>| t.clone().unwrap_or_default();
    if tools(&request.tools) != tools(&header.tools) {
        out.push("the header's tool schemas".to_owned());
    }
    out
}

impl RequestCheck {
    /// An unbound check (inert until a lookup is bound).
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// A check bound for good to `store`.
    pub fn with_store(store: Arc<dyn SessionStore>) -> Arc<Self> {
        let check = Self::new();
        *check.lookup.write().unwrap_or_else(|p| p.into_inner()) = Some(store_lookup(store));
        check
    }

    /// A check bound for good to `lookup`.
    pub fn with_lookup(
        lookup: impl Fn(&SessionId) -> Option<Arc<Session>> + Send + Sync + 'static,
    ) -> Arc<Self> {
        let check = Self::new();
        *check.lookup.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(lookup));
        check
    }

    fn lock_found(&self) -> MutexGuard<'_, Vec<Violation>> {
        self.found.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn current_lookup(&self) -> Option<SessionLookup> {
        self.lookup.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether a lookup is bound (the check is active).
    pub fn is_bound(&self) -> bool {
        self.current_lookup().is_some()
    }

    /// Binds `lookup` (replacing any earlier one). Dropping the guard unbinds it again, which
    /// makes the check inert.
    pub fn bind(
        self: &Arc<Self>,
        lookup: impl Fn(&SessionId) -> Option<Arc<Session>> + Send + Sync + 'static,
    ) -> agent::Registration {
        let lookup: SessionLookup = Arc::new(lookup);
        *self.lookup.write().unwrap_or_else(|p| p.into_inner()) = Some(lookup.clone());
        let weak = Arc::downgrade(self);
        agent::Registration::new(move || {
            if let Some(me) = weak.upgrade() {
                let mut slot = me.lookup.write().unwrap_or_else(|p| p.into_inner());
                if slot.as_ref().is_some_and(|l| Arc::ptr_eq(l, &lookup)) {
                    *slot = None;
                }
            }
        })
    }

    /// Binds the live sessions of `store` (see [`bind`](Self::bind)).
    pub fn bind_store(self: &Arc<Self>, store: Arc<dyn SessionStore>) -> agent::Registration {
        let lookup = store_lookup(store);
        self.bind(move |id| lookup(id))
    }

    /// Wraps `inner` so every request is checked before it is delegated.
    pub fn wrap(self: &Arc<Self>, inner: Arc<dyn ModelAdapter>) -> Arc<CheckedModel> {
        Arc::new(CheckedModel {
            inner,
            check: self.clone(),
        })
    }

    /// What `request` breaks, without recording anything. `Ok` for an unmarked request and
    /// while the check is unbound.
    pub fn check(&self, request: &GenerateOptions) -> Result<(), Vec<Violation>> {
        if !request.loop_built {
            return Ok(());
        }
        let Some(lookup) = self.current_lookup() else {
            return Ok(());
        };
        let Some(id) = &request.session_id else {
            return Err(vec![Violation::at(
                SessionId::new(UNKNOWN_SESSION),
                None,
                RuleId::L2,
                "a loop-built request to carry a session id",
            )]);
        };
        let Some(session) = lookup(id) else {
            return Err(vec![Violation::at(
                id.clone(),
                None,
                RuleId::L3,
                format!("a loop-built request to name a live session, but no session \"{id}\" is live"),
            )]);
        };
        let events = session.events();
        let v = |rule, expected: String| Violation::at(id.clone(), None, rule, expected);
        let mut out = Vec::new();
        let facts = log_facts(&events);
        match facts.last_step {
            None => out.push(v(
                RuleId::L5,
                format!(
                    "a loop-built request inside an open step, but the log ({} events) holds no step/start",
                    events.len()
                ),
            )),
            Some(((seq, turn, step), false)) => out.push(v(
                RuleId::L5,
                format!(
                    "a loop-built request inside an open step, but the last step/start (seq {seq}, turn {turn} step {step}) is closed"
                ),
            )),
            Some((_, true)) => {}
        }
        if facts.header.is_none() {
            out.push(v(
                RuleId::L6,
                "a request/header in the log of a loop-built request, but there is none".to_owned(),
            ));
        }
        let expected = agent::derive_messages(events.iter());
        if request.messages != expected {
            out.push(v(
                RuleId::L7,
                format!(
                    "the request's messages to equal the history derived from the log at dispatch ({} messages at log length {}), got {} messages: the request diverges from the dispatch-time durable derivation",
                    expected.len(),
                    events.len(),
                    request.messages.len()
                ),
            ));
        }
        if let Some(header) = facts.header {
            let diverging = header_divergence(request, header);
            if !diverging.is_empty() {
                out.push(v(
                    RuleId::L8,
                    format!(
                        "the request to match the latest request/header, but it diverges in {}",
                        diverging.join(", ")
                    ),
                ));
            }
        }
        if out.is_empty() { Ok(()) } else { Err(out) }
    }

    /// [`check`](Self::check), recording what it finds.
    pub fn verify(&self, request: &GenerateOptions) -> Result<(), Vec<Violation>> {
        if request.loop_built && self.is_bound() {
            self.checked.fetch_add(1, Ordering::Relaxed);
        }
        let result = self.check(request);
        if let Err(found) = &result {
            self.lock_found().extend(found.iter().cloned());
        }
        result
    }

    /// Every violation found so far, in order.
    pub fn violations(&self) -> Vec<Violation> {
        self.lock_found().clone()
    }

    /// How many loop-built requests [`verify`](Self::verify) has checked (while bound), passing or
    /// not.
    pub fn checked(&self) -> u64 {
        self.checked.load(Ordering::Relaxed)
    }

    /// The companion's installer for an [`InvariantRegistry`](crate::registry::InvariantRegistry)
    /// that provides the runtime's `Arc<dyn SessionStore>`: it binds the store for the
    /// registration's lifetime (the wrapped adapters stay in place and go inert when it is
    /// disposed). Register it under [`AGENT_LOOP_PACKAGE`].
    pub fn installer(self: &Arc<Self>) -> Installer {
        let me = self.clone();
        Installer::new(move |cx| {
            let store = cx
                .service::<Arc<dyn SessionStore>>()
                .ok_or("the agent-loop companion needs the Arc<dyn SessionStore> service")?;
            cx.adopt(me.bind_store(store))?;
            Ok(())
        })
        .inject::<Arc<dyn SessionStore>>()
    }
}

fn store_lookup(store: Arc<dyn SessionStore>) -> SessionLookup {
    Arc::new(move |id| store.get(id))
}

/// A [`ModelAdapter`] that runs the [`RequestCheck`] on each request before delegating.
///
/// A request that passes is handed on unchanged — the same `Arc` — to the wrapped adapter. A
/// request that breaks a rule never reaches it: the call streams a single `finish` with an
/// `error` reason whose failure code is [`INVARIANT_FAILURE_CODE`] and whose message is the
/// reference's failure text for each violation (`invariant violated by "agent-loop": …`),
/// so the turn fails at the offending request.
pub struct CheckedModel {
    inner: Arc<dyn ModelAdapter>,
    check: Arc<RequestCheck>,
}

impl fmt::Debug for CheckedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckedModel")
            .field("check", &self.check)
            .finish_non_exhaustive()
    }
}

impl CheckedModel {
    /// The check this adapter runs.
    pub fn check(&self) -> &Arc<RequestCheck> {
        &self.check
    }

    /// The wrapped adapter.
    pub fn inner(&self) -> &Arc<dyn ModelAdapter> {
        &self.inner
    }
}

impl ModelAdapter for CheckedModel {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        match self.check.verify(&request) {
            Ok(()) => self.inner.stream(request),
            Err(found) => {
                let message = found
                    .iter()
                    .map(Violation::veto_text)
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::warn!(%message, "model request vetoed by the request-reconstruction invariant");
                let finish = StreamChunk::Finish {
                    reason: FinishReason::Error {
                        failure: LlmFailure::new(INVARIANT_FAILURE_CODE, message),
                    },
                    replay_state: None,
                };
                Box::pin(futures::stream::iter([Ok(finish)]))
            }
        }
    }
}
