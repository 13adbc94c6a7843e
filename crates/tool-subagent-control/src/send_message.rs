//! `send_message` (`acp-and-tools.md` §4.2): one follow-up turn for a continuable child,
//! delivered through the seam's [`ContinuationManager::followup_with`](subagent::continuation::ContinuationManager::followup_with).
//!
//! The tool adds no routing and no authority of its own. The manager authorizes the exact live
//! durable direct parent (before a cold resume and again at inbox admission), enqueues on a
//! running child, wakes a resident idle one and cold-resumes an absent one. The message is
//! always a later FIFO turn, never steering.

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::{Map, Value};
use subagent::SubagentError;
use subagent::agent::bus::panic_message;
use subagent::agent::tools::{ToolContext, ToolError, ToolHandler, ToolOutput};
use subagent::agent::{AgentRuntime, CancelCause, ContentBlock, MessageId, MessageSource, SessionId};
use tokio::task::JoinError;

use crate::control::Control;
use crate::failure::{calling_agent, seam_failure};
use crate::model_text;

/// The model's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SendMessageArgs {
    pub(crate) subagent_id: String,
    pub(crate) message: String,
}

impl SendMessageArgs {
    /// Parses `{subagent_id, message}`: a non-empty id and a message with some non-whitespace
    /// text. Undeclared keys are permitted (the registry's schema check does not forbid them).
    pub(crate) fn parse(arguments: &Value) -> Result<Self, ToolError> {
        let args = arguments.as_object().ok_or_else(|| {
            ToolError::invalid_args(model_text::arguments_not_object(model_text::SEND_MESSAGE))
        })?;
        let subagent_id = match args.get(model_text::SUBAGENT_ID_PARAM) {
            Some(Value::String(id)) if !id.is_empty() => id.clone(),
            _ => {
                return Err(ToolError::invalid_args(model_text::id_param_required(
                    model_text::SEND_MESSAGE,
                    model_text::SUBAGENT_ID_PARAM,
                )));
            }
        };
        let message = match args.get(model_text::MESSAGE_PARAM) {
            Some(Value::String(message)) => message.clone(),
            _ => return Err(ToolError::invalid_args(model_text::MESSAGE_REQUIRED)),
        };
        // An empty message is no work: refuse it rather than wake (or cold-resume) a child for
        // a blank turn.
        if message.trim().is_empty() {
            return Err(ToolError::invalid_args(model_text::MESSAGE_BLANK));
        }
        Ok(Self { subagent_id, message })
    }
}

/// What an accepted delivery returns, serialized as `{messageId}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageQueued {
    /// The id of the message the child's inbox accepted.
    pub message_id: String,
}

impl MessageQueued {
    /// The tool output for a delivery to `subagent_id`: one text block
    /// `message queued as the next turn for subagent <id>` and the value itself.
    pub fn into_output(self, subagent_id: &str) -> ToolOutput {
        let value = serde_json::to_value(&self).ok();
        ToolOutput {
            value,
            ..ToolOutput::text(model_text::message_queued(subagent_id))
        }
    }
}

/// The durable source of a relayed message: `{kind: coordinator, form: relay, senderSessionId}`.
/// It records the sender and grants nothing: authority comes from the calling agent alone.
pub(crate) fn relay_source(sender: &SessionId) -> MessageSource {
    let mut source = Map::new();
    source.insert("kind".into(), Value::from("coordinator"));
    source.insert("form".into(), Value::from("relay"));
    source.insert("senderSessionId".into(), Value::from(sender.as_str()));
    MessageSource::Other(source)
}

/// The body of `send_message`.
pub(crate) struct SendMessageTool {
    pub(crate) control: Arc<Control>,
}

#[async_trait]
impl ToolHandler for SendMessageTool {
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args = SendMessageArgs::parse(&arguments)?;
        let control = &self.control;
        let parent = calling_agent(
            &control.services,
            &ctx,
            model_text::SEND_MESSAGE_CALLING_AGENT_REQUIRED,
        )?;
        let Some(manager) = control.continuation.clone() else {
            return Err(seam_failure(&SubagentError::continuation_unavailable()));
        };
        // The delivery listens to a child of the call's token: cancelled with it (the token owns
        // only the phase before inbox acceptance), and by `abandon` when this body is dropped
        // before the delivery answered.
        let signal = ctx.signal.child();
        // Dropped with this body before the delivery answered (a host abandoning the call
        // without firing its signal), it cancels the delivery: nobody would learn whether the
        // message was accepted, so it must reject (and roll a cold resume back) instead.
        let abandon = signal.cancel_on_drop(CancelCause::Other {
            reason: model_text::DELIVERY_ABANDONED_REASON.to_owned(),
        });
        let child_id = SessionId::from(args.subagent_id.as_str());
        let content = vec![ContentBlock::text(args.message)];
        let source = relay_source(parent.id());
        // Hands the accepted message's id from the delivery to this body. Dropped with this
        // body before it took the id, it withdraws the message (see `Receipt`).
        let receipt = Receipt::new(control.services.agents.clone(), child_id.clone());
        let handoff = receipt.handoff.clone();
        // On a tracked task: a dropped body never cuts a cold resume (or its rollback) short.
        let task = control.spawn_delivery(async move {
            let delivered = manager
                .followup_with(&parent, &child_id, content, source, &signal)
                .await;
            if let Ok(message_id) = &delivered {
                handoff.accepted(message_id);
            }
            delivered
        });
        let Some(task) = task else {
            abandon.disarm();
            return Err(ToolError::failed(model_text::SEND_MESSAGE_SHUT_DOWN));
        };
        let joined = task.await;
        abandon.disarm();
        // From here on this body answers for the message: no `.await` is left before the
        // discard hook is registered.
        receipt.taken();
        let message_id = joined
            .map_err(|join| task_failure(&args.subagent_id, join))?
            .map_err(|error| seam_failure(&error))?;
        withdraw_if_discarded(
            control.services.agents.clone(),
            &ctx,
            &args.subagent_id,
            &message_id,
        );
        Ok(MessageQueued {
            message_id: message_id.to_string(),
        }
        .into_output(&args.subagent_id))
    }
}

/// Where the accepted message's id stands between the delivery task and the call's body.
#[derive(Debug, Default)]
enum Handoff {
    /// The delivery has not been accepted (yet, or ever).
    #[default]
    Waiting,
    /// The child's inbox accepted the message; the body has not taken the answer yet.
    Accepted(MessageId),
    /// The body took the answer: it reports the delivery and registers its discard hook.
    Taken,
    /// The body was dropped without taking the answer.
    Dropped,
}

/// The delivery task's side of a [`Receipt`].
#[derive(Clone)]
struct HandoffSlot {
    state: Arc<Mutex<Handoff>>,
    /// The live registry, to find the child in for a withdrawal.
    agents: Arc<dyn AgentRuntime>,
    /// The child the message was sent to.
    child_id: SessionId,
}

impl HandoffSlot {
    /// Records that the child's inbox accepted `message_id`; if the body is already gone (it
    /// was dropped while the delivery ran), withdraws the message at once.
    fn accepted(&self, message_id: &MessageId) {
        let dropped = {
            let mut state = self.state.lock();
            if matches!(*state, Handoff::Dropped) {
                true
            } else {
                *state = Handoff::Accepted(message_id.clone());
                false
            }
        };
        if dropped {
            withdraw(self.agents.as_ref(), &self.child_id, message_id);
        }
    }
}

/// The body's side of the hand-off. A call's future may be dropped after the child's inbox
/// accepted its message but before the body observed the answer — the pipeline drops a body
/// still pending once the call's signal fired (on a multi-thread runtime the delivery task can
/// accept in that window), or a host abandons the call. Nobody is then told that the message was
/// delivered (the pipeline records the call as cancelled), so, like a discarded success, the
/// message is withdrawn while still unclaimed: by this guard's drop when the delivery was
/// accepted first, or by the delivery task when the body was dropped first.
struct Receipt {
    handoff: HandoffSlot,
    /// Whether the body took the answer (the guard then does nothing).
    taken: bool,
}

impl Receipt {
    fn new(agents: Arc<dyn AgentRuntime>, child_id: SessionId) -> Self {
        Self {
            handoff: HandoffSlot {
                state: Arc::default(),
                agents,
                child_id,
            },
            taken: false,
        }
    }

    /// The body took the delivery's answer and answers for the message from now on.
    fn taken(mut self) {
        *self.handoff.state.lock() = Handoff::Taken;
        self.taken = true;
    }
}

impl Drop for Receipt {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        let previous = std::mem::replace(&mut *self.handoff.state.lock(), Handoff::Dropped);
        if let Handoff::Accepted(message_id) = previous {
            withdraw(self.handoff.agents.as_ref(), &self.handoff.child_id, &message_id);
        }
    }
}

/// Removes `message_id` from the inbox of the live child `child_id` if it is still pending (a
/// logged cancellation, which also settles the manager's accounting of the waking send). A
/// message the child already claimed into a turn cannot be taken back: nothing changes then.
fn withdraw(agents: &dyn AgentRuntime, child_id: &SessionId, message_id: &MessageId) {
    // `Ok(false)`: already claimed (or gone with the child) — nothing left to withdraw. An
    // error: the cancellation could not be logged and the child's inbox is unchanged; the
    // call's result is already decided, so it can only be logged.
    if let Some(child) = agents.get(child_id)
        && let Err(error) = child.remove_pending(message_id)
    {
        tracing::warn!(child = %child_id, message = %message_id, %error, "send_message: could not withdraw a delivery whose call was recorded as failed");
    }
}

/// Registers the undo of an accepted delivery for the case where the pipeline does not record
/// this call's success: the call's signal fired after the child's inbox accepted the message but
/// before the result was recorded (the model is told the call was aborted), or the output could
/// not be recorded. The model then reads a failure, which the tool's description says means the
/// message was NOT delivered (and a retry would deliver it twice), so the hook removes the
/// message from the child's inbox while it is still pending — a logged cancellation, which
/// also settles the manager's accounting of the waking send. A message the child already
/// claimed into a turn cannot be taken back; the hook then changes nothing.
fn withdraw_if_discarded(
    agents: Arc<dyn AgentRuntime>,
    ctx: &ToolContext,
    subagent_id: &str,
    message_id: &MessageId,
) {
    let child_id = SessionId::from(subagent_id);
    let message_id = message_id.clone();
    ctx.on_discarded(move || withdraw(agents.as_ref(), &child_id, &message_id));
}

/// A delivery task that ended without an answer: it panicked (the manager contains host code's
/// panics; this is a last resort), or the runtime cancelled it.
fn task_failure(subagent_id: &str, join: JoinError) -> ToolError {
    let detail = if join.is_panic() {
        panic_message(&*join.into_panic())
    } else {
        model_text::TASK_CANCELLED.to_owned()
    };
    ToolError::failed(model_text::delivery_task_failed(subagent_id, &detail))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use subagent::agent::tools::codes;

    #[test]
    fn arguments_are_parsed_strictly() {
        let ok = SendMessageArgs::parse(&json!({"subagent_id": "c", "message": "go on", "extra": 1}));
        assert_eq!(
            ok.ok(),
            Some(SendMessageArgs {
                subagent_id: "c".into(),
                message: "go on".into()
            })
        );
        for (args, message) in [
            (
                json!(["c", "m"]),
                model_text::arguments_not_object("send_message"),
            ),
            (
                json!({"message": "m"}),
                model_text::id_param_required("send_message", "subagent_id"),
            ),
            (
                json!({"subagent_id": "", "message": "m"}),
                model_text::id_param_required("send_message", "subagent_id"),
            ),
            (
                json!({"subagent_id": 7, "message": "m"}),
                model_text::id_param_required("send_message", "subagent_id"),
            ),
            (
                json!({"subagent_id": "c"}),
                model_text::MESSAGE_REQUIRED.to_owned(),
            ),
            (
                json!({"subagent_id": "c", "message": ["m"]}),
                model_text::MESSAGE_REQUIRED.to_owned(),
            ),
            (
                json!({"subagent_id": "c", "message": " \n\t"}),
                model_text::MESSAGE_BLANK.to_owned(),
            ),
        ] {
            let error = SendMessageArgs::parse(&args).expect_err("malformed");
            assert_eq!(error.code, codes::INVALID_ARGS);
            assert_eq!(error.message, message);
        }
    }

    /// spec: CTRL-2 (source half) — the relayed source records the sender in the spec's shape.
    #[test]
    fn ctrl_2_relay_source_shape() {
        let source = relay_source(&SessionId::from("parent"));
        assert_eq!(source.kind(), "coordinator");
        assert_eq!(
            serde_json::to_value(&source).ok(),
            Some(json!({"kind": "coordinator", "form": "relay", "senderSessionId": "parent"}))
        );
    }

    #[test]
    fn value_serializes_in_spec_shape() {
        let output = MessageQueued {
            message_id: "m-1".into(),
        }
        .into_output("child");
        assert_eq!(output.value, Some(json!({"messageId": "m-1"})));
        assert_eq!(
            output.content,
            vec![ContentBlock::text(
                "message queued as the next turn for subagent child"
            )]
        );
    }

    fn any_field() -> impl Strategy<Value = Option<Value>> {
        prop_oneof![
            1 => Just(None),
            1 => Just(Some(Value::Null)),
            4 => prop_oneof![Just(String::new()), "[ \t\n]{1,3}", any::<String>()]
                .prop_map(|s| Some(Value::String(s))),
            1 => any::<i64>().prop_map(|n| Some(Value::from(n))),
            1 => any::<bool>().prop_map(|b| Some(Value::Bool(b))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 256,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// The parse never panics, accepts exactly a non-empty id and a non-blank message (both
        /// kept verbatim), and refuses everything else as `INVALID_ARGS`.
        #[test]
        fn parse_accepts_exactly_the_documented_shape(id in any_field(), message in any_field()) {
            let mut map = Map::new();
            if let Some(id) = id.clone() {
                map.insert("subagent_id".into(), id);
            }
            if let Some(message) = message.clone() {
                map.insert("message".into(), message);
            }
            let parsed = SendMessageArgs::parse(&Value::Object(map));
            let id = id.as_ref().and_then(Value::as_str).filter(|s| !s.is_empty());
            let message = message.as_ref().and_then(Value::as_str).filter(|s| !s.trim().is_empty());
            match (id, message) {
                (Some(id), Some(message)) => {
                    let args = parsed.expect("well-formed");
                    prop_assert_eq!(args.subagent_id, id);
                    prop_assert_eq!(args.message, message);
                }
                _ => prop_assert_eq!(parsed.expect_err("malformed").code, codes::INVALID_ARGS),
            }
        }
    }
}
