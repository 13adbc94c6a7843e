//! The settlement notice (spec §2.14.8): what a settled child's durable direct parent is told.

use agent::{AgentStatus, ContentBlock, Message, MessageSource};
use serde_json::{Map, Value};

use super::activation::Activation;
use super::{Inner, send_contained};
use crate::model_text::{bound_notice_summary, settlement_notice_content, settlement_outcome_line};
use crate::result::StopReason;

impl Inner {
    /// The settlement notice (spec §2.14.8).
    pub(super) fn deliver_notice(
        &self,
        activation: &Activation,
        reason: &StopReason,
        output: Option<&[ContentBlock]>,
    ) {
        let child_id = activation.child_id.as_str();
        // A parent whose disposal began counts as gone (its send would be refused): the notice
        // is dropped silently, as for an absent parent.
        let Some(parent) = self
            .services
            .agents
            .get(&activation.parent_session)
            .filter(|parent| parent.is_live())
        else {
            return;
        };
        let mut source = Map::new();
        source.insert("kind".into(), Value::from("subagent-settled"));
        source.insert("form".into(), Value::from("notice"));
        source.insert(
            "summary".into(),
            Value::from(bound_notice_summary(&settlement_outcome_line(child_id, reason))),
        );
        source.insert("senderSessionId".into(), Value::from(child_id));
        let message = Message::user(
            settlement_notice_content(child_id, reason, output),
            MessageSource::Other(source),
        );
        let id = message.id.clone();
        // The scheduling decision and the send are one span under the admission lock, like a
        // submission's (spec §2.14.5): with respect to the opening of a disposal transaction
        // (its cancel) and a drain's closing of admission on another thread, the notice is
        // either decided and inserted wholly before — a waking send the parent's cancel then
        // discards or aborts — or decided after, and then injected without a wake. Decided
        // outside the span, a drain opening the parent's teardown between the decision and the
        // send let a wake into the already-cancelled parent, which then ran (and paid for) a
        // whole model turn inside its own teardown.
        let _admission = self.admission.lock();
        let owner = self.activations.lock().get(parent.id()).cloned();
        // A closing parent (manager drain, a scoped drain covering it, or a resident parent whose own teardown began) gets
        // the notice without a wake: teardown is not a reason to spend a model request.
        let closing = self.is_closing(&parent) || owner.as_ref().is_some_and(|o| o.disposal().is_some());
        let accounted = owner.as_ref().filter(|_| !closing);
        if let Some(owner) = accounted {
            owner.accept(id.clone());
        }
        #[cfg(test)]
        self.hooks.notice_scheduled();
        // The parent is host code: a panic of its `send` is contained and counts as a failed
        // send, so that it cannot abandon the disposal transaction delivering the notice.
        let result = send_contained("the parent agent", || {
            if closing {
                parent.inject(message)
            } else if parent.status() == AgentStatus::Idle {
                parent.followup(message)
            } else {
                parent.steer(message)
            }
        });
        if let Some(owner) = accounted {
            if result.is_err() {
                owner.settle_accepted(&id);
            }
            owner.wake();
        }
        match result {
            // The parent's disposal began after it was resolved above (on another thread, or
            // from a listener of the send): it is gone, and a notice to a gone parent is dropped
            // without a warning (spec §2.14.8).
            Err(e) if !parent.is_live() => {
                tracing::debug!(child = %child_id, error = %e, "settlement notice dropped: its parent is being disposed");
            }
            Err(e) => {
                tracing::warn!(child = %child_id, error = %e, "settlement notice was not delivered to its parent");
            }
            Ok(_) => {}
        }
    }
}
