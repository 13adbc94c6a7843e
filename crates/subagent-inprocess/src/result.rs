//! Result derivation for one settled in-process child (spec `inprocess-providers.md` §3.7),
//! from the child's **own** events only, using the seam's rules (one place per rule):
//!
//! 1. `own` = the child's events from the seed boundary onward, so a seeded parent message can
//!    never be selected;
//! 2. the recorded stop reason is the seam's [`one_shot_stop_reason`] (consumed-work fold →
//!    turn-end map; `dropped_unrun` deliberately ignored);
//! 3. the driver's cancellation rule ([`StopReason::after_cancellation`]): when the run was
//!    cancelled (request signal or disposal) anything but `completed` becomes `aborted`;
//! 4. the output is the seam's output rule ([`final_assistant_output_of`]), `[]` when there is none;
//! 5. structured runs: a committed value → `structured`; no value and a `completed` reason →
//!    `error` (`aborted` when cancelled); otherwise the child's own failure stands.
//!
//! No other field is ever set: in-process providers never write a `diagnostic`.

use serde_json::Value;
use subagent::agent::AsEvent;
use subagent::{StopReason, SubagentResult, final_assistant_output_of, one_shot_stop_reason};

/// Derives the result of a settled child from its own events (`own`, the suffix after the seed
/// boundary), whether the run was `cancelled`, and — for a structured run — the committed value
/// (`Some(None)`: structured, nothing committed; `None`: not a structured run).
pub fn derive_result<E: AsEvent>(
    own: &[E],
    cancelled: bool,
    structured: Option<Option<Value>>,
) -> SubagentResult {
    let stop_reason = one_shot_stop_reason(own.iter()).after_cancellation(cancelled);
    let output = final_assistant_output_of(own).unwrap_or_default();
    match structured {
        Some(Some(value)) => SubagentResult::new(output, stop_reason).with_structured(value),
        Some(None) if stop_reason.is_completed() => SubagentResult::new(
            output,
            if cancelled {
                StopReason::Aborted
            } else {
                StopReason::Error
            },
        ),
        _ => SubagentResult::new(output, stop_reason),
    }
}
