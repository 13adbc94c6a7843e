//! The subagent seam companion (providers §6.6 and seam §2.20, **B1–B8**): the provider
//! registry's add/remove pairs and the runs' start/end pairs on a
//! [`SubagentService`]'s event bus.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use agent::{EventBus, SessionId};
use subagent::events::{SubagentEvent, SubagentRunInfo};
use subagent::provider::SubagentProvider;
use subagent::service::SubagentService;

use crate::registry::Installer;
use crate::rule::RuleId;
use crate::violation::Violation;

/// The package the seam companion registers under.
pub const SUBAGENT_PACKAGE: &str = "subagent";

/// The session a provider-registry violation is reported under (provider notifications belong
/// to no session).
pub const PROVIDER_REGISTRY_SESSION: &str = "(subagent providers)";

/// One provider the companion believes registered.
struct ProviderEntry {
    provider: Weak<dyn SubagentProvider>,
    /// Whether the service held this exact provider when its `provider-added` was delivered
    /// (rather than the notification being emitted on the bus by hand).
    via_service: bool,
}

#[derive(Default)]
struct State {
    providers: HashMap<String, ProviderEntry>,
    runs: HashMap<String, SubagentRunInfo>,
    found: Vec<Violation>,
}

/// Checks the seam's lifecycle notifications (**B1–B8**):
///
/// * `subagent/provider-added`: **B1** the name is non-empty; **B2** the name is not
///   registered already;
/// * `subagent/provider-removed`: **B3** the name is registered;
/// * `subagent/start`: **B4** provider, run id and child id are non-empty; **B5** the run id is
///   not open already; **B8** the provider need not be registered any more (availability is an
///   admission-time fact, and runs outlive their provider's removal);
/// * `subagent/end`: **B6** an open start has the run id; **B7** its provider, child id and
///   `local` equal the start's.
///
/// Each finding is recorded in [`violations`](Self::violations) and returned as the listener's
/// `Err`. That is a veto where the service emits uncontained — a rejected `provider-added`
/// unwinds the registration, so `register_provider` fails with the finding — and a logged
/// warning for the contained `provider-removed`, `start` and `end`. A rejected notification
/// does not change the companion's state (the reference stages a transition before dispatch
/// and commits it on delivery).
///
/// The reference's staging also keeps a registration that a *later* listener unwinds from
/// counting as registered. Here the companion consults the service instead: a provider it
/// recorded from the service that the service no longer holds is treated as gone when its name
/// is added again, and a removal naming a provider the service still holds under a newer
/// registration is taken as the late removal of the older one.
///
/// Locking: one mutex guards the provider and run tables and the findings, held only for the
/// synchronous work of one notification (the service's own provider lock is taken inside it,
/// never the other way round).
pub struct SeamLifecycleCompanion {
    service: Mutex<Option<SubagentService>>,
    state: Mutex<State>,
}

impl std::fmt::Debug for SeamLifecycleCompanion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("SeamLifecycleCompanion")
            .field("providers", &state.providers.len())
            .field("open_runs", &state.runs.len())
            .field("found", &state.found.len())
            .finish()
    }
}

/// Identity of a provider object (the data pointer, ignoring the vtable).
fn same(a: &Arc<dyn SubagentProvider>, b: &Arc<dyn SubagentProvider>) -> bool {
    std::ptr::eq(Arc::as_ptr(a) as *const (), Arc::as_ptr(b) as *const ())
}

impl SeamLifecycleCompanion {
    /// A companion knowing no provider and no run.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            service: Mutex::new(None),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections are plain insertions and removals: a poisoned state is consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn service(&self) -> Option<SubagentService> {
        self.service.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the service currently holds exactly the provider `entry` recorded.
    fn service_holds(&self, name: &str, entry: &ProviderEntry) -> bool {
        let (Some(service), Some(recorded)) = (self.service(), entry.provider.upgrade()) else {
            return false;
        };
        service.get_provider(name).is_some_and(|p| same(&p, &recorded))
    }

    fn violation(session: SessionId, rule: RuleId, expected: String) -> Violation {
        Violation::at(session, None, rule, expected)
    }

    fn registry_violation(rule: RuleId, expected: String) -> Violation {
        Self::violation(SessionId::new(PROVIDER_REGISTRY_SESSION), rule, expected)
    }

    /// Observes one seam notification: `Err` (also recorded) with what it breaks.
    pub fn observe(&self, event: &SubagentEvent) -> Result<(), Vec<Violation>> {
        let service = self.service();
        let mut state = self.lock();
        let mut out = Vec::new();
        match event {
            SubagentEvent::ProviderAdded(provider) => {
                let name = provider.name().to_owned();
                if name.is_empty() {
                    out.push(Self::registry_violation(
                        RuleId::B1,
                        "subagent provider names to be non-empty".to_owned(),
                    ));
                }
                if let Some(entry) = state.providers.get(&name) {
                    if entry.via_service && !self.service_holds(&name, entry) {
                        // Unwound by a later listener, or its removal is still being announced.
                        state.providers.remove(&name);
                    } else {
                        out.push(Self::registry_violation(
                            RuleId::B2,
                            format!("subagent/provider-added not to repeat the registered {name:?}"),
                        ));
                    }
                }
                if out.is_empty() {
                    let via_service = service
                        .as_ref()
                        .and_then(|s| s.get_provider(&name))
                        .is_some_and(|p| same(&p, provider));
                    state.providers.insert(
                        name,
                        ProviderEntry {
                            provider: Arc::downgrade(provider),
                            via_service,
                        },
                    );
                }
            }
            SubagentEvent::ProviderRemoved(name) => match state.providers.get(name) {
                None => out.push(Self::registry_violation(
                    RuleId::B3,
                    format!("subagent/provider-removed to name a registered provider, got unknown provider {name:?}"),
                )),
                Some(entry) if entry.via_service && self.service_holds(name, entry) => {
                    // The late removal of an older registration of this name.
                }
                Some(_) => {
                    state.providers.remove(name);
                }
            },
            SubagentEvent::Start(info) => {
                if info.provider.is_empty() || info.run_id.is_empty() || info.id.as_str().is_empty() {
                    out.push(Self::violation(
                        info.parent.clone(),
                        RuleId::B4,
                        format!(
                            "subagent/start provider, runId, and child id to be non-empty, got provider {:?}, runId {:?}, child id {:?}",
                            info.provider,
                            info.run_id,
                            info.id.as_str()
                        ),
                    ));
                }
                if state.runs.contains_key(&info.run_id) {
                    out.push(Self::violation(
                        info.parent.clone(),
                        RuleId::B5,
                        format!("subagent/start not to repeat the open run id {:?}", info.run_id),
                    ));
                }
                if out.is_empty() {
                    state.runs.insert(info.run_id.clone(), info.clone());
                }
            }
            SubagentEvent::End(end) => {
                let info = &end.info;
                match state.runs.get(&info.run_id) {
                    None => out.push(Self::violation(
                        info.parent.clone(),
                        RuleId::B6,
                        format!(
                            "subagent/end to match an open subagent/start, but run {:?} has no matching subagent/start",
                            info.run_id
                        ),
                    )),
                    Some(start)
                        if start.provider != info.provider || start.id != info.id || start.local != info.local =>
                    {
                        out.push(Self::violation(
                            info.parent.clone(),
                            RuleId::B7,
                            format!(
                                "subagent/end for run {:?} to carry its start's identity (provider {:?}, child {}, local {}), got provider {:?}, child {}, local {}: the identity diverges from subagent/start",
                                info.run_id, start.provider, start.id, start.local, info.provider, info.id, info.local
                            ),
                        ));
                    }
                    Some(_) => {
                        state.runs.remove(&info.run_id);
                    }
                }
            }
            _ => {}
        }
        if out.is_empty() {
            Ok(())
        } else {
            state.found.extend(out.iter().cloned());
            Err(out)
        }
    }

    /// Watches `service`: seeds the registered providers from it (the reference reads the
    /// service's list at installation) and subscribes to its bus. Dropping the guard
    /// unsubscribes and forgets the service (tracked state stays until [`reset`](Self::reset)).
    pub fn listen(self: &Arc<Self>, service: &SubagentService) -> agent::Registration {
        {
            let mut state = self.lock();
            for name in service.list() {
                if let Some(p) = service.get_provider(&name) {
                    state.providers.insert(
                        name,
                        ProviderEntry {
                            provider: Arc::downgrade(&p),
                            via_service: true,
                        },
                    );
                }
            }
        }
        *self.service.lock().unwrap_or_else(|p| p.into_inner()) = Some(service.clone());
        let sub = self.listen_bus(service.events());
        let weak = Arc::downgrade(self);
        agent::Registration::new(move || {
            drop(sub);
            if let Some(me) = weak.upgrade() {
                *me.service.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
        })
    }

    /// Subscribes to a bare bus (no service to seed from or to consult).
    pub fn listen_bus(self: &Arc<Self>, bus: &EventBus<SubagentEvent>) -> agent::Registration {
        let me = self.clone();
        bus.on(move |event| {
            me.observe(event).map_err(|found| {
                found
                    .iter()
                    .map(Violation::veto_text)
                    .collect::<Vec<_>>()
                    .join("; ")
                    .into()
            })
        })
    }

    /// Forgets every provider and open run (the findings stay).
    pub fn reset(&self) {
        let mut state = self.lock();
        state.providers.clear();
        state.runs.clear();
    }

    /// How many runs are open (started, not ended).
    pub fn open_runs(&self) -> usize {
        self.lock().runs.len()
    }

    /// Every violation found so far, in order.
    pub fn violations(&self) -> Vec<Violation> {
        self.lock().found.clone()
    }

    /// The companion's installer for an [`InvariantRegistry`](crate::registry::InvariantRegistry)
    /// that provides the host's [`SubagentService`]: each installation starts from fresh state
    /// seeded from the service. Register it under [`SUBAGENT_PACKAGE`].
    pub fn installer(self: &Arc<Self>) -> Installer {
        let me = self.clone();
        Installer::new(move |cx| {
            let service = cx
                .service::<SubagentService>()
                .ok_or("the subagent companion needs the SubagentService service")?;
            me.reset();
            cx.adopt(me.listen(&service))?;
            Ok(())
        })
        .inject::<SubagentService>()
    }
}
