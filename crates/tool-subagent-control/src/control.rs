//! [`SubagentControlPlugin`]: the root plugin registering `send_message` and `interrupt_agent`
//! (`acp-and-tools.md` §4.1–§4.3).

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use subagent::agent::tools::ToolDefinition;
use subagent::agent::{Registration, Services};
use subagent::continuation::ContinuationManager;
use tokio_util::task::TaskTracker;

use crate::error::ControlToolError;
use crate::interrupt::InterruptAgentTool;
use crate::model_text;
use crate::send_message::SendMessageTool;

/// The root plugin's name.
pub const PLUGIN_NAME: &str = "tool-subagent-control";

/// The host services the root plugin requires: the tool registry and the subagent service —
/// here, the [`ContinuationManager`] built over the host's `SubagentService`, which owns
/// follow-ups and interrupts.
pub const DEPENDENCIES: [&str; 2] = ["tools", "subagents"];

/// What both tool bodies share.
pub(crate) struct Control {
    pub(crate) services: Services,
    /// `None` for a composition without continuable children: `send_message` then fails
    /// `CONTINUATION_UNAVAILABLE` and `interrupt_agent` accepts every call as a no-op.
    pub(crate) continuation: Option<ContinuationManager>,
    /// The deliveries in flight. Each runs on its own task so that a call whose body is
    /// dropped never cuts a cold resume (or its rollback) short; the task ends as soon as the
    /// manager answered. Closed by [`SubagentControlPlugin::shutdown`].
    pub(crate) deliveries: TaskTracker,
    /// Serializes [`spawn_delivery`](Self::spawn_delivery)'s "closed? else spawn" with the
    /// closing of `deliveries`, so that a delivery is either tracked before the close (and
    /// awaited by `shutdown`) or refused. Held only for those synchronous sections.
    pub(crate) admission: Mutex<()>,
}

impl Control {
    /// Spawns `delivery` on the tracked task set, or `None` (dropping it unpolled) once
    /// [`shutdown`](SubagentControlPlugin::shutdown) closed the set: a delivery started after
    /// shutdown began would run untracked, past the moment shutdown promised that every
    /// delivery had ended.
    pub(crate) fn spawn_delivery<F>(&self, delivery: F) -> Option<tokio::task::JoinHandle<F::Output>>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let _admission = self.admission.lock();
        (!self.deliveries.is_closed()).then(|| self.deliveries.spawn(delivery))
    }
}

/// The loaded `send_message` and `interrupt_agent` tools.
///
/// Both tools are registered **once**, in the host's global tool layer, under their fixed names
/// (not per provider): several delegation tools share this one control surface. Neither is
/// needed for continuable delegation to work; they own only the parent→child direction.
///
/// # What the tools guarantee
/// * `send_message {subagent_id, message}` delivers the message as the child's **next turn**
///   through [`ContinuationManager::followup_with`], with the durable source
///   `{kind: coordinator, form: relay, senderSessionId: <caller>}`. Only the child's exact live
///   durable direct parent may deliver; the manager checks it, enqueues on a running child,
///   wakes an idle one and cold-resumes an absent one. Success renders
///   `message queued as the next turn for subagent <id>` with the value `{messageId}`; any
///   failure is an error with the seam's code and message, and means the message was not
///   delivered.
/// * `interrupt_agent {agent_id}` calls [`ContinuationManager::interrupt`] with ancestor
///   authority (the calling agent) and renders `interrupt requested for agent <id>` with
///   `{accepted: true}`, also for an accepted no-op (an absent, settled or one-shot target). It
///   never cold-resumes anything.
/// * Both refuse a call without a live calling agent and malformed arguments (`INVALID_ARGS`,
///   naming the parameter); nothing is delivered or cancelled then. Both refuse a call whose
///   execution signal is already cancelled (`CANCELLED`; `send_message` through the manager's
///   own check), so a cancelled call never takes effect.
/// * Neither is concurrency-safe: calls of one assistant message run one at a time, in the
///   model's order, so two messages to one child, or an interrupt followed by a waking message,
///   take effect in the order the model wrote them.
///
/// # Ownership, drop and cancellation
/// The plugin owns the two registrations. [`unload`](Self::unload) (or dropping the plugin)
/// unregisters both; a call already running finishes. Every child belongs to the
/// [`ContinuationManager`], never to the plugin: unloading stops nothing.
///
/// A call's execution signal owns a delivery only until the child's inbox accepts it:
/// cancelling it earlier makes the delivery reject `CANCELLED` (a cold resume it started is
/// rolled back); a turn already accepted cannot be cancelled through this tool. One exception
/// keeps a failed call meaning "not delivered": when the pipeline does not record the accepted
/// delivery's success (the signal fired between the inbox's acceptance and the recording, so
/// the model is told the call was aborted), the message is withdrawn from the child's inbox if
/// the child has not claimed it yet (`Agent::remove_pending`, a logged cancellation). A call whose
/// future is dropped before the manager answered cancels its delivery the same way (reason
/// [`DELIVERY_ABANDONED_REASON`](model_text::DELIVERY_ABANDONED_REASON)); the delivery still
/// runs to its end on a task [`shutdown`](Self::shutdown) waits for. A call whose future is
/// dropped after the inbox accepted the message but before the body took that answer (nobody
/// was told it was delivered) has the message withdrawn the same way, if still unclaimed.
pub struct SubagentControlPlugin {
    control: Arc<Control>,
    /// The two tool registrations; `None` once unloaded. Never held across an `.await`.
    registrations: Mutex<Option<Registration>>,
}

impl fmt::Debug for SubagentControlPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubagentControlPlugin")
            .field("loaded", &self.is_loaded())
            .field("continuation", &self.control.continuation.is_some())
            .field("deliveries", &self.deliveries())
            .finish()
    }
}

impl SubagentControlPlugin {
    /// Registers `send_message` and `interrupt_agent` in `services`' global tool layer, serving
    /// follow-ups and interrupts through `continuation`.
    ///
    /// `continuation` should be the host's manager over the same services
    /// (`ContinuationManager::new(subagents, services.clone())`): it resolves calling agents
    /// and children in its own agent registry, while this plugin resolves the caller in
    /// `services.agents`.
    ///
    /// # Errors
    /// [`ControlToolError::Register`] when the registry refuses a tool (either name already
    /// registered globally); nothing stays registered then.
    pub fn load(services: &Services, continuation: ContinuationManager) -> Result<Self, ControlToolError> {
        Self::load_inner(services, Some(continuation))
    }

    /// Registers both tools for a composition without continuable children (no continuation
    /// manager): every `send_message` fails with the seam's `CONTINUATION_UNAVAILABLE`
    /// (`continuable subagents require the agents service`) and every `interrupt_agent` from a
    /// live caller is an accepted no-op.
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn load_without_continuation(services: &Services) -> Result<Self, ControlToolError> {
        Self::load_inner(services, None)
    }

    fn load_inner(
        services: &Services,
        continuation: Option<ContinuationManager>,
    ) -> Result<Self, ControlToolError> {
        let control = Arc::new(Control {
            services: services.clone(),
            continuation,
            deliveries: TaskTracker::new(),
            admission: Mutex::new(()),
        });
        let send = services.tools.register(
            None,
            ToolDefinition {
                name: model_text::SEND_MESSAGE.to_owned(),
                description: model_text::SEND_MESSAGE_DESCRIPTION.to_owned(),
                parameters: model_text::send_message_parameters(),
                concurrency_safe: false,
                handler: Arc::new(SendMessageTool {
                    control: control.clone(),
                }),
            },
        )?;
        // On failure `send` is dropped here, which unregisters it.
        let interrupt = services.tools.register(
            None,
            ToolDefinition {
                name: model_text::INTERRUPT_AGENT.to_owned(),
                description: model_text::INTERRUPT_AGENT_DESCRIPTION.to_owned(),
                parameters: model_text::interrupt_agent_parameters(),
                concurrency_safe: false,
                handler: Arc::new(InterruptAgentTool {
                    control: control.clone(),
                }),
            },
        )?;
        Ok(Self {
            control,
            registrations: Mutex::new(Some(Registration::all(vec![send, interrupt]))),
        })
    }

    /// Whether the tools are registered (the plugin was not unloaded).
    pub fn is_loaded(&self) -> bool {
        self.registrations.lock().is_some()
    }

    /// Unregisters both tools. Idempotent. Children and deliveries in flight are untouched.
    pub fn unload(&self) {
        let registrations = self.registrations.lock().take();
        drop(registrations);
    }

    /// Unloads, then waits until every delivery started through this plugin has ended (the
    /// child's inbox accepted the message, or the delivery rejected and rolled back).
    ///
    /// From the moment it is called, no delivery starts any more: a `send_message` call
    /// resolved before the unload whose body runs afterwards delivers nothing and fails
    /// ([`SEND_MESSAGE_SHUT_DOWN`](model_text::SEND_MESSAGE_SHUT_DOWN)), so nothing this plugin
    /// started outlives the returned future.
    pub async fn shutdown(self) {
        self.unload();
        let deliveries = &self.control.deliveries;
        {
            let _admission = self.control.admission.lock();
            deliveries.close();
        }
        deliveries.wait().await;
    }

    /// The number of deliveries in flight: started by a `send_message` call and not yet
    /// answered by the manager (for tests asserting quiescence).
    pub fn deliveries(&self) -> usize {
        self.control.deliveries.len()
    }
}

impl Drop for SubagentControlPlugin {
    fn drop(&mut self) {
        self.unload();
    }
}
