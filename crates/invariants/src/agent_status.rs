//! The agent companion (providers §6.6, **G1**): `agent/status` never repeats the previous
//! status of the same agent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use agent::{AgentEvent, AgentStatus, EventBus, SessionId};

use crate::registry::Installer;
use crate::rule::RuleId;
use crate::violation::Violation;

/// The package the agent companion registers under.
pub const AGENT_PACKAGE: &str = "agent";

/// Watches [`AgentEvent::Status`] notifications and rejects a no-op transition (**G1**).
///
/// Agents are tracked independently, by id. [`AgentEvent::Disposed`] forgets an agent, so an
/// id reused by a later agent starts fresh (the reference keys its state by the agent object).
/// A violation is recorded in [`violations`](Self::violations) and returned as the listener's
/// `Err`; the runtime emits status notifications contained, so the finding is logged and the
/// emission goes on. The rejected status is still taken as the agent's current status (it *is*
/// the status the runtime now reports).
///
/// Locking: one mutex guards the per-agent statuses and the findings; it is held only for the
/// synchronous work of one notification.
#[derive(Debug, Default)]
pub struct AgentStatusCompanion {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last: HashMap<SessionId, AgentStatus>,
    found: Vec<Violation>,
}

fn show(status: AgentStatus) -> &'static str {
    match status {
        AgentStatus::Idle => "idle",
        AgentStatus::Running => "running",
    }
}

impl AgentStatusCompanion {
    /// A companion tracking no agent yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a plain insertion or removal: a poisoned state is consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Observes one agent notification: `Err` (also recorded) when it is a repeated status.
    /// Notifications other than status and disposal are ignored.
    pub fn observe(&self, event: &AgentEvent) -> Result<(), Violation> {
        let mut state = self.lock();
        match event {
            AgentEvent::Status { agent, status } => {
                let previous = state.last.insert(agent.clone(), *status);
                if previous == Some(*status) {
                    let v = Violation::at(
                        agent.clone(),
                        None,
                        RuleId::G1,
                        format!(
                            "agent/status to change, but it repeated {} (no-op transition)",
                            show(*status)
                        ),
                    );
                    state.found.push(v.clone());
                    return Err(v);
                }
                Ok(())
            }
            AgentEvent::Disposed { agent } => {
                state.last.remove(agent);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Subscribes to `bus` (globally). Dropping the guard unsubscribes; tracked statuses are
    /// kept until [`reset`](Self::reset).
    pub fn listen(self: &Arc<Self>, bus: &EventBus<AgentEvent>) -> agent::Registration {
        let me = self.clone();
        bus.on(move |event| me.observe(event).map_err(Into::into))
    }

    /// Forgets every tracked agent (the findings stay).
    pub fn reset(&self) {
        self.lock().last.clear();
    }

    /// The last status seen for `agent`.
    pub fn status_of(&self, agent: &SessionId) -> Option<AgentStatus> {
        self.lock().last.get(agent).copied()
    }

    /// Every violation found so far, in order.
    pub fn violations(&self) -> Vec<Violation> {
        self.lock().found.clone()
    }

    /// The companion's installer for an [`InvariantRegistry`](crate::registry::InvariantRegistry)
    /// that provides the runtime's `EventBus<AgentEvent>`: each installation starts from fresh
    /// tracking state and subscribes for the registration's lifetime. Register it under
    /// [`AGENT_PACKAGE`].
    pub fn installer(self: &Arc<Self>) -> Installer {
        let me = self.clone();
        Installer::new(move |cx| {
            let bus = cx
                .service::<EventBus<AgentEvent>>()
                .ok_or("the agent companion needs the EventBus<AgentEvent> service")?;
            me.reset();
            cx.adopt(me.listen(&bus))?;
            Ok(())
        })
        .inject::<EventBus<AgentEvent>>()
    }
}
