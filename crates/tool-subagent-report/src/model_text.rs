//! Every text the `report` tool puts in front of a model, in one place (`acp-and-tools.md` §5.2).
//! Each is pinned by an `insta` snapshot below.
//!
//! * the tool's name, description and argument schema;
//! * the guidance section (`tool:report`, order 117) that states the report obligation;
//! * the rendering of an accepted report;
//! * the refusals the tool body raises itself (malformed arguments, a revoked installation).
//!
//! Texts the spec quotes are used verbatim (the `output` parameter's description, the rendering,
//! `A failed call may still have arrived, so do not blindly repeat it.`,
//! `Deliver your result with the report tool before you finish`,
//! `reporting never ends your turn`); the rest is this crate's wording around them. Failures
//! reach the model through the tool registry, which prefixes them with `Error: `. The seam's
//! refusals (`UNAUTHORIZED`, `ACTIVATION_CLOSING`, `PARENT_UNAVAILABLE`, `DRAINING`,
//! `CANCELLED`) keep the seam's own texts, and the parent's message heading
//! (`Background subagent <id> reported:`) is the seam's too.

use serde_json::{Value, json};

/// The model-facing tool name.
pub const TOOL_NAME: &str = "report";

/// The name of the one parameter.
pub const OUTPUT_PARAM: &str = "output";

/// Description of the `output` parameter (verbatim from the spec).
pub const OUTPUT_PARAM_TEXT: &str =
    "Actionable content for your parent; summarize conclusions and reference relevant shared paths.";

/// The tool description: who receives the report, when to call it, what it does not do.
pub const TOOL_DESCRIPTION: &str = "Send a report to the agent that started you. Call it once before you finish, with a final \
     result that stands on its own, and earlier as well whenever a finding should change what \
     that agent does next. That agent works in the same workspace but never receives your \
     transcript, tool output or reasoning, so finishing your work is not itself a result. \
     Reporting does not end your turn or your work, and only your direct parent receives the \
     report. A failed call may still have arrived, so do not blindly repeat it.";

/// The name of the guidance section: `tool:report`.
pub const GUIDANCE_SECTION_NAME: &str = "tool:report";

/// The order of the guidance section: after every per-tool section a continuable child can
/// carry (the delegation guidance sits at 116).
pub const GUIDANCE_ORDER: i32 = 117;

/// The guidance section's text: the report obligation, stated as an instruction.
pub const GUIDANCE: &str = "Deliver your result with the report tool before you finish: call it once, with an answer \
     that stands on its own. The agent that started you shares your workspace but does not see \
     your transcript, tool output or reasoning, so a closing remark such as \"done\" gives it \
     nothing it can use. When a partial finding changes what that agent should do next, report \
     it earlier as well; reporting never ends your turn.";

/// The JSON Schema of the tool's arguments: one required string, `output`. There is no
/// recipient, child id or delivery-mode parameter.
pub fn tool_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            OUTPUT_PARAM: {"type": "string", "description": OUTPUT_PARAM_TEXT},
        },
        "required": [OUTPUT_PARAM],
    })
}

/// The rendering of an accepted report:
/// `report accepted by the agent that started you as message <messageId>`.
pub fn report_accepted(message_id: &str) -> String {
    format!("report accepted by the agent that started you as message {message_id}")
}

// ---- refusals -----------------------------------------------------------------------------

/// The arguments are not a JSON object.
pub const ARGUMENTS_NOT_OBJECT: &str = "report arguments must be a JSON object with a string field `output`";

/// `output` is missing or not a string.
pub const OUTPUT_REQUIRED: &str = "report argument `output` is required and must be a string";

/// `output` has no non-whitespace character: there is nothing to report.
pub const OUTPUT_BLANK: &str =
    "report argument `output` must contain what you report: it is empty or only whitespace";

/// The installation serving the call was revoked (the package was unloaded, or the child's
/// residency ended) after the call was resolved.
pub const REVOKED: &str = "the report tool was revoked for this agent; the report was not delivered";

#[cfg(test)]
mod tests {
    use super::*;

    /// The description and the guidance, verbatim.
    #[test]
    fn descriptions_are_pinned() {
        insta::assert_snapshot!(format!(
            "## tool {TOOL_NAME}\n{TOOL_DESCRIPTION}\n\n## section {GUIDANCE_SECTION_NAME} (order {GUIDANCE_ORDER})\n{GUIDANCE}"
        ));
    }

    /// The argument schema.
    #[test]
    fn schema_is_pinned() {
        insta::assert_snapshot!(serde_json::to_string_pretty(&tool_parameters()).expect("serializable"));
    }

    /// The rendering and every refusal the tool raises itself.
    #[test]
    fn rendering_and_refusals_are_pinned() {
        insta::assert_snapshot!(
            [
                report_accepted("m-1"),
                ARGUMENTS_NOT_OBJECT.to_owned(),
                OUTPUT_REQUIRED.to_owned(),
                OUTPUT_BLANK.to_owned(),
                REVOKED.to_owned(),
            ]
            .join("\n")
        );
    }

    /// spec: REP-17 — the guidance carries the two load-bearing phrases; spec: REP-1 — the
    /// schema names exactly `output`, required, with the spec's description.
    #[test]
    fn rep_17_spec_quoted_phrases_are_verbatim() {
        assert!(GUIDANCE.contains("Deliver your result with the report tool before you finish"));
        assert!(GUIDANCE.contains("reporting never ends your turn"));
        assert!(
            TOOL_DESCRIPTION.contains("A failed call may still have arrived, so do not blindly repeat it.")
        );
        assert_eq!(
            report_accepted("abc"),
            "report accepted by the agent that started you as message abc"
        );
        let schema = tool_parameters();
        let properties = schema["properties"].as_object().expect("properties");
        assert_eq!(properties.keys().collect::<Vec<_>>(), ["output"]);
        assert_eq!(schema["required"], json!(["output"]));
        assert_eq!(
            properties["output"]["description"],
            "Actionable content for your parent; summarize conclusions and reference relevant shared paths."
        );
    }
}
