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
    /// The whole call is one admission span: a drain beginning on another thread either finds
    /// the report already in the parent's inbox (a parent it tears down discards it unread with
    /// its other pending work) or refuses it. A parent whose lineage is closing, or whose own
    /// teardown began, gets even a next-step report without a wake.
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
        // The whole report — its checks, its scheduling decision and its send — is one span
        // under the admission lock, like a submission's (spec §2.14.5) and a settlement
        // notice's (§2.14.8): the spec's report "runs without suspension" (§2.14.10), so with
        // respect to a drain's closing of admission and the opening of a disposal transaction
        // (its cancel) on another thread, it is either admitted and inserted wholly before —
        // a send the parent's cancel then discards — or refused after (`DRAINING`,
        // `ACTIVATION_CLOSING`). Checked outside the span, a drain opening the parent's
        // teardown between the checks and the send let the report's `steer` wake the
        // already-cancelled parent, which then ran (and paid for) a whole model turn inside
        // its own teardown.
        let _admission = inner.admission.lock();
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
        let owner = inner.activations.lock().get(parent.id()).cloned();
        // A closing parent (manager drain, a scoped drain covering it, or a resident parent
        // whose own teardown began) is never woken, as for a settlement notice (§2.14.8):
        // teardown is not a reason to spend a model request. Within this span a child admitted
        // above is covered by any drain covering its parent and is closed with an owning parent,
        // so this holds only what the span already guarantees; it keeps a waking send and its
        // accounting away from a closing parent should those invariants ever part.
        let closing = inner.is_closing(&parent) || owner.as_ref().is_some_and(|o| o.disposal().is_some());
        let wake = delivery == ReportDelivery::NextStep && !closing;
        // A waking send to a resident parent is accounted through its `accepted` set (§2.14.10
        // step 5, REP-10), so the parent is not judged quiescent before the send is admitted.
        let accounted = owner.as_ref().filter(|_| wake);
        if let Some(owner) = accounted {
            owner.accept(id.clone());
        }
        #[cfg(test)]
        inner.hooks.report_scheduled();
        // The parent is host code: a panic of its `send` counts as a failed send.
        let sent = send_contained("the parent agent", || {
            if wake {
                parent.steer(message)
            } else {
                parent.inject(message)
            }
        });
        if let Some(owner) = accounted {
            if sent.is_err() {
                owner.settle_accepted(&id);
            }
            owner.wake();
        }
        sent.map_err(|e| SubagentError::parent_unavailable().with_source(e))
    }
}
