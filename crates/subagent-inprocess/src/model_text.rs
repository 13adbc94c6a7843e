//! Every text this crate puts in front of a model, in one place. Each is pinned by an `insta`
//! snapshot (`tests/model_text.rs`) and listed in `docs/model-experience.md`.
//!
//! Only structured children see any of them: the capture tool's name and description, the
//! acknowledgement rendered for a recorded value, the system-prompt instruction that the answer
//! must be reported through the tool, and the guard's denial reason for calls after a capture.
//! (The delegation-scope statement every child receives lives in the seam:
//! [`subagent::SUBAGENT_DELEGATION_CONTEXT`].)

/// The name of the child-scoped capture tool a structured child must call to finish.
pub const STRUCTURED_OUTPUT_TOOL: &str = "structured_output";

/// The capture tool's model-facing description.
pub const STRUCTURED_OUTPUT_DESCRIPTION: &str = "Report your final structured result. Call this exactly once, when your answer is complete; \
the arguments must match this tool's parameter schema exactly.";

/// The name of the child-scoped system-prompt section carrying
/// [`STRUCTURED_OUTPUT_INSTRUCTION`].
pub const STRUCTURED_OUTPUT_SECTION: &str = "tool:structured_output";

/// The order of [`STRUCTURED_OUTPUT_SECTION`]: the end of the tool-guidance band (100–199).
pub const STRUCTURED_OUTPUT_SECTION_ORDER: i32 = 190;

/// The system-prompt instruction a structured child receives: the answer must be reported by
/// calling the capture tool; a plain text answer does not count.
pub const STRUCTURED_OUTPUT_INSTRUCTION: &str = "When you have your final answer, you MUST report it by calling the \
`structured_output` tool with arguments matching its parameter schema exactly. Do not finish with a plain text \
answer: only the tool call counts as your result.";

/// The rendered content of a successful capture (its value is `{"recorded": true}`).
pub const STRUCTURED_OUTPUT_RECORDED: &str = "Structured output recorded.";

/// The reason the capture guard denies every call of a structured child once its value is
/// recorded. The model sees it as `Error: <reason>`.
pub fn structured_output_already_recorded(tool: &str) -> String {
    format!("structured output already recorded: the run is complete, so `{tool}` is not executed")
}
