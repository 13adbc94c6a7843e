//! Every text of the tool pipeline that a model can see, in one place.
//!
//! Failures reach the model as one text block `Error: <message>` (see [`error_content`]); the
//! bare `<message>` is kept in [`ToolResultError::message`](agent::tools::ToolResultError). The
//! tests at the bottom pin every string.

/// The model-facing content of a failed result: the message prefixed with `Error: `.
pub fn error_content(message: &str) -> String {
    format!("Error: {message}")
}

/// A call naming a tool the calling agent cannot see (unknown, or restricted away). The name is
/// the model's own and is quoted as a bounded excerpt (a huge name is not echoed back in full).
pub fn unknown_tool(name: &str) -> String {
    format!("unknown tool \"{}\"", crate::excerpt::excerpt(name.to_owned()))
}

/// The call's signal was cancelled before its body was invoked.
pub const ABORTED_BEFORE_DISPATCH: &str = "tool call aborted before dispatch";

/// The call's signal was cancelled after its body was invoked.
pub const ABORTED: &str = "tool call aborted";

/// A call of a cancelled step that never started (synthetic result of the scheduler).
pub const NOT_STARTED: &str = "tool call not started: the step was cancelled";

/// A pre-execute policy asked for approval and no approval service is configured.
pub fn approval_unconfigured(name: &str) -> String {
    format!("tool \"{name}\" requires approval, but no approval service is configured")
}

/// The approval service reported that no approval channel (no UI, no answerer) is available.
pub fn approval_unavailable(name: &str) -> String {
    format!("tool \"{name}\" requires approval, but no approval channel is available")
}

/// The user answered "no".
pub fn approval_rejected(name: &str) -> String {
    format!("the user rejected tool \"{name}\"")
}

/// The approval request was cancelled by the approval channel.
pub fn approval_cancelled(name: &str) -> String {
    format!("approval for tool \"{name}\" was cancelled")
}

/// The approval service itself failed (panicked).
pub fn approval_failed(name: &str, detail: &str) -> String {
    format!("approval for tool \"{name}\" failed: {detail}")
}

/// A guard panicked; the call is denied (guards fail closed).
pub fn guard_failed(detail: &str) -> String {
    format!("tool guard failed: {detail}")
}

/// A `tools/pre-execute` policy panicked.
pub fn pre_execute_failed(detail: &str) -> String {
    format!("tools/pre-execute policy failed: {detail}")
}

/// A `tools/post-execute` policy panicked.
pub fn post_execute_failed(detail: &str) -> String {
    format!("tools/post-execute policy failed: {detail}")
}

/// A `tools/post-execute` policy tried to give a failed result a value.
pub const POST_VALUE_ON_FAILURE: &str = "tools/post-execute cannot replace the value of a failed result";

/// The error message of a post-execute block whose feedback has no text.
pub const BLOCKED_WITHOUT_FEEDBACK: &str = "tool result blocked by post-execute policy";

/// A tool body panicked.
pub fn body_panicked(name: &str, detail: &str) -> String {
    format!("tool \"{name}\" failed: {detail}")
}

/// The call's arguments parsed to JSON that is not lossless (a negative zero); the body never
/// runs. `detail` names the offending number and its path.
pub fn arguments_not_lossless(detail: &str) -> String {
    format!("tool call arguments are not lossless JSON: {detail}")
}

/// A tool's final output (content, value or metadata) is not lossless JSON, so it cannot be
/// recorded; `detail` names the offending number and its path.
pub fn output_not_lossless(name: &str, detail: &str) -> String {
    format!("tool \"{name}\" returned output that is not lossless JSON: {detail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins every model-visible text of the tool pipeline.
    #[test]
    fn model_texts_are_pinned() {
        assert_eq!(error_content("x"), "Error: x");
        assert_eq!(unknown_tool("bash"), "unknown tool \"bash\"");
        let huge = unknown_tool(&"x".repeat(100_000));
        assert!(huge.len() < 300 && huge.ends_with("…\""), "{huge}");
        assert_eq!(ABORTED_BEFORE_DISPATCH, "tool call aborted before dispatch");
        assert_eq!(ABORTED, "tool call aborted");
        assert_eq!(NOT_STARTED, "tool call not started: the step was cancelled");
        assert_eq!(
            approval_unconfigured("t"),
            "tool \"t\" requires approval, but no approval service is configured"
        );
        assert_eq!(
            approval_unavailable("t"),
            "tool \"t\" requires approval, but no approval channel is available"
        );
        assert_eq!(approval_rejected("t"), "the user rejected tool \"t\"");
        assert_eq!(approval_cancelled("t"), "approval for tool \"t\" was cancelled");
        assert_eq!(
            approval_failed("t", "boom"),
            "approval for tool \"t\" failed: boom"
        );
        assert_eq!(guard_failed("boom"), "tool guard failed: boom");
        assert_eq!(
            pre_execute_failed("boom"),
            "tools/pre-execute policy failed: boom"
        );
        assert_eq!(
            post_execute_failed("boom"),
            "tools/post-execute policy failed: boom"
        );
        assert_eq!(
            POST_VALUE_ON_FAILURE,
            "tools/post-execute cannot replace the value of a failed result"
        );
        assert_eq!(
            BLOCKED_WITHOUT_FEEDBACK,
            "tool result blocked by post-execute policy"
        );
        assert_eq!(body_panicked("t", "boom"), "tool \"t\" failed: boom");
        assert_eq!(
            arguments_not_lossless("boom"),
            "tool call arguments are not lossless JSON: boom"
        );
        assert_eq!(
            output_not_lossless("t", "boom"),
            "tool \"t\" returned output that is not lossless JSON: boom"
        );
    }

    /// Every model-visible text as the model sees it (failures with their `Error: ` prefix).
    #[test]
    fn model_texts_snapshot() {
        let texts = [
            unknown_tool("<name>"),
            ABORTED_BEFORE_DISPATCH.to_owned(),
            ABORTED.to_owned(),
            NOT_STARTED.to_owned(),
            approval_unconfigured("<name>"),
            approval_unavailable("<name>"),
            approval_rejected("<name>"),
            approval_cancelled("<name>"),
            approval_failed("<name>", "<detail>"),
            guard_failed("<detail>"),
            pre_execute_failed("<detail>"),
            post_execute_failed("<detail>"),
            POST_VALUE_ON_FAILURE.to_owned(),
            body_panicked("<name>", "<detail>"),
            arguments_not_lossless("<detail>"),
            output_not_lossless("<name>", "<detail>"),
        ];
        let mut out: Vec<String> = texts.iter().map(|t| error_content(t)).collect();
        out.push(format!(
            "(post-execute block without feedback) {BLOCKED_WITHOUT_FEEDBACK}"
        ));
        insta::assert_snapshot!("tool_pipeline_texts", out.join("\n"));
    }
}
