//! `report_from(child, content, delivery, signal)` (spec §2.14.10): a live continuable child
//! sends selected content to its durable direct parent.

use agent::{AgentRef, ContentBlock, Message, MessageId, MessageSource, Signal};
use serde_json::{Map, Value};

use super::{ContinuationManager, check_signal, send_contained};
use crate::error::SubagentError;
use crate::model_text::report_heading;

/// How a report reaches the parent (chosen by the deployment, not the child).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReportDelivery {
    /// `steer`: wakes an idle parent, joins a running parent's next step boundary.
    #[default]
    NextStep,
    /// `inject`: waits in the parent's next step without waking it.
    Quiet,
}

impl ContinuationManager {
    /// Sends `content` from the resident continuable child `child` to its durable direct
    /// parent, without suspension, and returns the delivered message's id (acceptance, not a
    /// read receipt). Reporting neither ends the child's turn nor changes its residency.
    ///
    /// The message is one user-role message whose first text block is `Background subagent
    /// <id> reported:` followed by `content`, with the source `{kind: "subagent-report", form:
    /// "relay", senderSessionId}`.
    ///
    /// # Errors
    /// The token's cancellation (`CANCELLED`); `DRAINING`; `UNAUTHORIZED` when `child` is not
    /// the exact agent of a resident Activation; `ACTIVATION_CLOSING` when its disposal began;
    /// `PARENT_UNAVAILABLE` when the direct parent is not live or its inbox refused the send
    /// (also by panicking: the panic is contained, never unwinds into the reporter).
    pub fn report_from(
        &self,
        child: &AgentRef,
        content: Vec<ContentBlock>,
        delivery: ReportDelivery,
        signal: &Signal,
    ) -> Result<MessageId, SubagentError> {
        let inner = &self.inner;
        check_signal(signal)?;
        inner.admit(child)?;
        let activation = inner
            .activations
            .lock()
            .get(child.id())
            .filter(|a| std::sync::Arc::ptr_eq(&a.agent, child))
            .cloned()
            .ok_or_else(|| SubagentError::not_continuable_reporter(child.id().as_str()))?;
        if activation.disposal().is_some() {
            return Err(SubagentError::reporter_activation_closing(child.id().as_str()));
        }
        let parent = inner
            .services
            .agents
            .get(&activation.parent_session)
            .ok_or_else(SubagentError::parent_unavailable)?;
        let child_id = child.id().as_str();
        let mut source = Map::new();
        source.insert("kind".into(), Value::from("subagent-report"));
        source.insert("form".into(), Value::from("relay"));
        source.insert("senderSessionId".into(), Value::from(child_id));
        let mut blocks = vec![ContentBlock::text(report_heading(child_id))];
        blocks.extend(content);
        let message = Message::user(blocks, MessageSource::Other(source));
        let id = message.id.clone();
        // The parent is host code: a panic of its `send` counts as a failed send.
        let sent = match delivery {
            ReportDelivery::Quiet => send_contained("the parent agent", || parent.inject(message)),
            ReportDelivery::NextStep => {
                let owner = inner.activations.lock().get(parent.id()).cloned();
                if let Some(owner) = &owner {
                    owner.accept(id.clone());
                }
                let sent = send_contained("the parent agent", || parent.steer(message));
                if let Some(owner) = &owner {
                    if sent.is_err() {
                        owner.settle_accepted(&id);
                    }
                    owner.wake();
                }
                sent
            }
        };
        sent.map_err(|e| SubagentError::parent_unavailable().with_source(e))
    }
}
