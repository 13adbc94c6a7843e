//! The `report` tool body (`acp-and-tools.md` §5.2–§5.5): parse `output`, then hand it to the
//! seam's [`ContinuationManager::report_from`] with the installed child as the credential.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use agent::tools::{ToolContext, ToolError, ToolHandler, ToolOutput};
use agent::{Agent, ContentBlock, error_chain};
use async_trait::async_trait;
use serde_json::{Value, json};
use subagent::SubagentError;
use subagent::continuation::{ContinuationManager, ReportDelivery};

use crate::model_text;

/// The body of one installed `report` tool: one child, one delivery policy.
pub(crate) struct ReportTool {
    pub(crate) manager: ContinuationManager,
    pub(crate) delivery: ReportDelivery,
    /// The agent the tool was installed for. Weak: the tool lives in that agent's own layer and
    /// must not keep it alive.
    pub(crate) child: Weak<dyn Agent>,
    /// Set when the installation is revoked.
    pub(crate) revoked: Arc<AtomicBool>,
}

/// The model's arguments: the report's text.
pub(crate) fn parse_output(arguments: &Value) -> Result<String, ToolError> {
    let args = arguments
        .as_object()
        .ok_or_else(|| ToolError::invalid_args(model_text::ARGUMENTS_NOT_OBJECT))?;
    let Some(Value::String(output)) = args.get(model_text::OUTPUT_PARAM) else {
        return Err(ToolError::invalid_args(model_text::OUTPUT_REQUIRED));
    };
    // An empty report hands the parent nothing: refuse it rather than wake the parent for it.
    if output.trim().is_empty() {
        return Err(ToolError::invalid_args(model_text::OUTPUT_BLANK));
    }
    Ok(output.clone())
}

/// A seam refusal as the model sees it: the seam's code (`UNAUTHORIZED`, `ACTIVATION_CLOSING`,
/// `PARENT_UNAVAILABLE`, `DRAINING`, `CANCELLED`) and its message with the cause chain.
pub(crate) fn seam_failure(error: &SubagentError) -> ToolError {
    ToolError::new(error.code().as_str(), error_chain(error))
}

#[async_trait]
impl ToolHandler for ReportTool {
    /// Delivers one report. Everything happens synchronously inside the call (the seam's
    /// authorise-and-send span never suspends), so a cancelled or dropped call either delivered
    /// before it was polled to completion or delivered nothing.
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let output = parse_output(&arguments)?;
        if self.revoked.load(Ordering::SeqCst) {
            return Err(ToolError::failed(model_text::REVOKED));
        }
        // The credential is the installed child itself, and only when it is the caller; the seam
        // then checks that it is the exact agent of a resident Activation.
        let caller = ctx.agent();
        let Some(child) = self.child.upgrade().filter(|child| child.id() == caller) else {
            return Err(seam_failure(&SubagentError::not_continuable_reporter(
                caller.as_str(),
            )));
        };
        let message_id = self
            .manager
            .report_from(
                &child,
                vec![ContentBlock::text(output)],
                self.delivery,
                &ctx.signal,
            )
            .map_err(|e| seam_failure(&e))?;
        let id = message_id.as_str();
        Ok(ToolOutput {
            content: vec![ContentBlock::text(model_text::report_accepted(id))],
            value: Some(json!({"messageId": id})),
            meta: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent::tools::codes;
    use proptest::prelude::*;

    /// Bad arguments are refused as `INVALID_ARGS` naming what is wrong; a good `output` is kept
    /// verbatim (undeclared keys are ignored).
    #[test]
    fn arguments_are_parsed_strictly() {
        assert_eq!(parse_output(&json!({"output": " x \n"})).unwrap(), " x \n");
        assert_eq!(parse_output(&json!({"output": "x", "to": "root"})).unwrap(), "x");
        for (arguments, message) in [
            (json!("x"), model_text::ARGUMENTS_NOT_OBJECT),
            (json!(["x"]), model_text::ARGUMENTS_NOT_OBJECT),
            (json!({}), model_text::OUTPUT_REQUIRED),
            (json!({"output": null}), model_text::OUTPUT_REQUIRED),
            (json!({"output": 3}), model_text::OUTPUT_REQUIRED),
            (json!({"output": ["x"]}), model_text::OUTPUT_REQUIRED),
            (json!({"output": ""}), model_text::OUTPUT_BLANK),
            (json!({"output": " \t\n"}), model_text::OUTPUT_BLANK),
        ] {
            let error = parse_output(&arguments).expect_err("refused");
            assert_eq!(error.code, codes::INVALID_ARGS, "{arguments}");
            assert_eq!(error.message, message, "{arguments}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// The parse never panics and accepts exactly an object whose `output` is a string with
        /// a non-whitespace character, keeping it verbatim.
        #[test]
        fn parse_accepts_exactly_a_non_blank_output(output in prop_oneof![
            any::<String>().prop_map(Value::String),
            "[ \t\n]{0,3}".prop_map(Value::String),
            any::<i64>().prop_map(Value::from),
            Just(Value::Null),
        ], wrap in any::<bool>()) {
            let arguments = if wrap { json!({"output": output.clone()}) } else { output.clone() };
            match (wrap, &output) {
                (true, Value::String(s)) if !s.trim().is_empty() => {
                    prop_assert_eq!(parse_output(&arguments).unwrap(), s.clone());
                }
                _ => {
                    let error = parse_output(&arguments).unwrap_err();
                    prop_assert_eq!(error.code.as_str(), codes::INVALID_ARGS);
                }
            }
        }
    }
}
