//! Every text this crate puts in front of a model, in one place (each is pinned by a snapshot
//! test and listed in `docs/model-experience.md`).
//!
//! * the delegation-scope statement written into every in-process child's runtime context
//!   (spec §2.16);
//! * the settlement notice a continuable child's parent receives when the child settles (spec
//!   §2.14.8);
//! * the heading of a continuable child's report (spec §2.14.10).

use agent::ContentBlock;

use crate::result::StopReason;

/// The runtime-context statement every in-process child receives (spec §2.16): its permission
/// scope was fixed at delegation, cannot be widened from inside, approval-requiring operations
/// are rejected, and a limitation should be reported rather than retried.
pub const SUBAGENT_DELEGATION_CONTEXT: &str = "You are a delegated subagent: your permission scope was fixed when you were started and \
cannot be widened from inside this session — operations that require approval are rejected \
automatically. When the task needs access beyond that scope, do not retry the denied operation; \
state the limitation in your reply so the delegating agent can handle it.";

/// The line that introduces a settled child's closing output in a settlement notice.
pub const CLOSING_MESSAGE_HEADING: &str = "Its closing message:";

/// The line a settlement notice carries instead of output when the epoch left none.
pub const NO_CLOSING_MESSAGE: &str = "It left no closing message.";

/// The most characters a `notice`-form message summary may have.
pub const NOTICE_SUMMARY_MAX_CHARS: usize = 120;

/// The outcome line of a settlement notice for child `child_id` that ended with `reason`
/// (spec §2.14.8):
///
/// * completed: `Background subagent <id> finished and will do no further work unless you send it more.`
/// * aborted: `Background subagent <id> was stopped before it finished.`
/// * max-tokens: `Background subagent <id> ran out of room before it finished.`
/// * refusal: `Background subagent <id> declined the task.`
/// * error: `Background subagent <id> failed before it finished.`
/// * anything else: `Background subagent <id> ended abnormally (<reason>) before it finished.`
pub fn settlement_outcome_line(child_id: &str, reason: &StopReason) -> String {
    match reason {
        StopReason::Completed => format!(
            "Background subagent {child_id} finished and will do no further work unless you send it more."
        ),
        StopReason::Aborted => format!("Background subagent {child_id} was stopped before it finished."),
        StopReason::MaxTokens => {
            format!("Background subagent {child_id} ran out of room before it finished.")
        }
        StopReason::Refusal => format!("Background subagent {child_id} declined the task."),
        StopReason::Error => format!("Background subagent {child_id} failed before it finished."),
        StopReason::Other(other) => {
            format!("Background subagent {child_id} ended abnormally ({other}) before it finished.")
        }
    }
}

/// The content of a settlement notice (spec §2.14.8): the outcome line, then either
/// [`CLOSING_MESSAGE_HEADING`] followed by the epoch's output blocks, or the single line
/// [`NO_CLOSING_MESSAGE`] when there is no output (`None` or empty).
pub fn settlement_notice_content(
    child_id: &str,
    reason: &StopReason,
    output: Option<&[ContentBlock]>,
) -> Vec<ContentBlock> {
    let mut content = vec![ContentBlock::text(settlement_outcome_line(child_id, reason))];
    match output {
        Some(blocks) if !blocks.is_empty() => {
            content.push(ContentBlock::text(CLOSING_MESSAGE_HEADING));
            content.extend(blocks.iter().cloned());
        }
        _ => content.push(ContentBlock::text(NO_CLOSING_MESSAGE)),
    }
    content
}

/// The first text block of a report from child `child_id` (spec §2.14.10):
/// `Background subagent <id> reported:`.
pub fn report_heading(child_id: &str) -> String {
    format!("Background subagent {child_id} reported:")
}

/// Bounds a `notice`-form summary to [`NOTICE_SUMMARY_MAX_CHARS`] characters: longer text keeps
/// its first 119 characters followed by `…`.
pub fn bound_notice_summary(text: &str) -> String {
    if text.chars().count() <= NOTICE_SUMMARY_MAX_CHARS {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(NOTICE_SUMMARY_MAX_CHARS - 1).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delegation_statement_is_pinned() {
        insta::assert_snapshot!(SUBAGENT_DELEGATION_CONTEXT);
        // The shipped statement says "task", not "job" (spec §6).
        assert!(SUBAGENT_DELEGATION_CONTEXT.contains("the task needs access"));
    }

    /// spec: §2.14.8 — the outcome lines are asserted verbatim.
    #[test]
    fn settlement_lines_are_pinned() {
        let lines: Vec<String> = [
            StopReason::Completed,
            StopReason::Aborted,
            StopReason::MaxTokens,
            StopReason::Refusal,
            StopReason::Error,
            StopReason::Other("paused".into()),
        ]
        .iter()
        .map(|r| settlement_outcome_line("c-1", r))
        .collect();
        insta::assert_snapshot!(lines.join("\n"));
        assert_eq!(
            settlement_outcome_line("c", &StopReason::Completed),
            "Background subagent c finished and will do no further work unless you send it more."
        );
    }

    #[test]
    fn notice_content_shapes() {
        let with =
            settlement_notice_content("c", &StopReason::Completed, Some(&[ContentBlock::text("answer")]));
        assert_eq!(
            with,
            vec![
                ContentBlock::text(settlement_outcome_line("c", &StopReason::Completed)),
                ContentBlock::text("Its closing message:"),
                ContentBlock::text("answer"),
            ]
        );
        for output in [None, Some(&[][..])] {
            let without = settlement_notice_content("c", &StopReason::Refusal, output);
            assert_eq!(
                without,
                vec![
                    ContentBlock::text("Background subagent c declined the task."),
                    ContentBlock::text("It left no closing message."),
                ]
            );
        }
        insta::assert_snapshot!(format!("{}\n{}", report_heading("c-1"), NO_CLOSING_MESSAGE));
    }

    #[test]
    fn summaries_are_bounded_to_120_characters() {
        let short = "x".repeat(120);
        assert_eq!(bound_notice_summary(&short), short);
        let long = "é".repeat(121);
        let bounded = bound_notice_summary(&long);
        assert_eq!(bounded.chars().count(), 120);
        assert!(bounded.ends_with('…'));
        assert_eq!(bounded, format!("{}…", "é".repeat(119)));
    }
}
