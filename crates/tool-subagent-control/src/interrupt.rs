//! `interrupt_agent` (`acp-and-tools.md` §4.3): stop the current turn of a continuable
//! descendant through the seam's [`ContinuationManager::interrupt`] with ancestor authority.
//!
//! The call is synchronous: it returns once the manager issued the cancel (or accepted a
//! no-op), never waiting for the target to stop. The manager does every check — the exact live
//! caller, no self-interrupt, the caller in the target's recorded ancestry — and the effect is
//! one `keep_inbox` cancel with cause `parent`; the tool adds no authority of its own.
//!
//! [`ContinuationManager::interrupt`]: subagent::continuation::ContinuationManager::interrupt

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;
use subagent::agent::SessionId;
use subagent::agent::tools::{ToolContext, ToolError, ToolHandler, ToolOutput, codes};
use subagent::continuation::InterruptAuthority;

use crate::control::Control;
use crate::failure::{calling_agent, seam_failure};
use crate::model_text;

/// Parses `{agent_id}`: a non-empty string. Undeclared keys are permitted.
pub(crate) fn parse_agent_id(arguments: &Value) -> Result<String, ToolError> {
    let args = arguments.as_object().ok_or_else(|| {
        ToolError::invalid_args(model_text::arguments_not_object(model_text::INTERRUPT_AGENT))
    })?;
    match args.get(model_text::AGENT_ID_PARAM) {
        Some(Value::String(id)) if !id.is_empty() => Ok(id.clone()),
        _ => Err(ToolError::invalid_args(model_text::id_param_required(
            model_text::INTERRUPT_AGENT,
            model_text::AGENT_ID_PARAM,
        ))),
    }
}

/// What an accepted interrupt returns, serialized as `{accepted: true}` (also for a no-op).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct InterruptAccepted {
    /// Always `true`: a refused interrupt is an error, not a value.
    pub accepted: bool,
}

impl InterruptAccepted {
    /// The tool output for an interrupt of `agent_id`: one text block
    /// `interrupt requested for agent <id>` and the value itself.
    pub fn into_output(self, agent_id: &str) -> ToolOutput {
        let value = serde_json::to_value(self).ok();
        ToolOutput {
            value,
            ..ToolOutput::text(model_text::interrupt_requested(agent_id))
        }
    }
}

/// The body of `interrupt_agent`.
pub(crate) struct InterruptAgentTool {
    pub(crate) control: Arc<Control>,
}

#[async_trait]
impl ToolHandler for InterruptAgentTool {
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let agent_id = parse_agent_id(&arguments)?;
        let control = &self.control;
        let caller = calling_agent(
            &control.services,
            &ctx,
            model_text::INTERRUPT_AGENT_CALLING_AGENT_REQUIRED,
        )?;
        // The interrupt is synchronous and cannot be undone, so the call's signal is observed
        // once, right before it: a call cancelled before its body ran interrupts nothing and
        // says so, instead of stopping the target's turn while its result reads as cancelled.
        if ctx.signal.is_cancelled() {
            return Err(ToolError::new(
                codes::CANCELLED,
                model_text::interrupt_cancelled(&agent_id),
            ));
        }
        // Without a continuation manager there is no continuable child to stop: every interrupt
        // is an accepted no-op (spec §4.3).
        if let Some(manager) = &control.continuation {
            manager
                .interrupt(
                    &SessionId::from(agent_id.as_str()),
                    &InterruptAuthority::Ancestor { agent: caller },
                )
                .map_err(|error| seam_failure(&error))?;
        }
        Ok(InterruptAccepted { accepted: true }.into_output(&agent_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use subagent::agent::ContentBlock;

    #[test]
    fn agent_id_is_parsed_strictly() {
        assert_eq!(
            parse_agent_id(&json!({"agent_id": "a", "extra": true})).ok(),
            Some("a".to_owned())
        );
        for args in [
            json!("a"),
            json!({}),
            json!({"agent_id": ""}),
            json!({"agent_id": null}),
            json!({"agent_id": 3}),
        ] {
            let error = parse_agent_id(&args).expect_err("malformed");
            assert_eq!(error.code, codes::INVALID_ARGS);
        }
        assert_eq!(
            parse_agent_id(&json!({})).expect_err("missing").message,
            "interrupt_agent argument `agent_id` is required and must be a non-empty string"
        );
    }

    #[test]
    fn value_serializes_in_spec_shape() {
        let output = InterruptAccepted { accepted: true }.into_output("child");
        assert_eq!(output.value, Some(json!({"accepted": true})));
        assert_eq!(
            output.content,
            vec![ContentBlock::text("interrupt requested for agent child")]
        );
    }
}
