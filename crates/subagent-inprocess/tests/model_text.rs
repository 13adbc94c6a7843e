//! Every model-visible text of this crate, pinned (ARCHITECTURE: one file per crate, each string
//! snapshotted).

use subagent_inprocess::model_text::*;

#[test]
fn structured_output_texts_are_pinned() {
    let rendered = [
        format!("tool: {STRUCTURED_OUTPUT_TOOL}"),
        format!("description: {STRUCTURED_OUTPUT_DESCRIPTION}"),
        format!("section: {STRUCTURED_OUTPUT_SECTION} @ {STRUCTURED_OUTPUT_SECTION_ORDER}"),
        format!("instruction: {STRUCTURED_OUTPUT_INSTRUCTION}"),
        format!("recorded: {STRUCTURED_OUTPUT_RECORDED}"),
        format!("guard: {}", structured_output_already_recorded("<tool>")),
    ];
    insta::assert_snapshot!(rendered.join("\n"));
}
