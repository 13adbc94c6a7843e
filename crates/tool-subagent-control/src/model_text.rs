//! Every text the control tools put in front of a model, in one place (`acp-and-tools.md` §4).
//! Each is pinned by an `insta` snapshot below and listed in `docs/model-experience.md`.
//!
//! * the three tool descriptions and their parameter schemas;
//! * the renderings of the tools' values (`message queued …`, `interrupt requested …`, the
//!   `list_agents` lines and `(no subagents)`);
//! * the refusals the tool bodies raise themselves (no calling agent, malformed arguments, a
//!   delivery task that ended without an answer).
//!
//! Texts the spec quotes are used verbatim (parameter descriptions, renderings, the
//! calling-agent refusals); the descriptions are this crate's wording around the phrases the spec
//! makes load-bearing (`next turn`, `current turn`, `send_message`, `interrupt_agent`,
//! `not to poll for completion — you are told when one finishes`, `resumable, not terminal`).
//! Refusals of the seam (`UNAUTHORIZED`, `NOT_RESUMABLE`, `DRAINING`, …) keep the seam's own
//! messages. Failures reach the model through the tool registry, which prefixes them with
//! `Error: `.

use serde_json::{Value, json};

// ---- names --------------------------------------------------------------------------------

/// The name of the delivery tool.
pub const SEND_MESSAGE: &str = "send_message";
/// The name of the interrupt tool.
pub const INTERRUPT_AGENT: &str = "interrupt_agent";
/// The name of the listing tool.
pub const LIST_AGENTS: &str = "list_agents";

/// `send_message`'s target parameter.
pub const SUBAGENT_ID_PARAM: &str = "subagent_id";
/// `send_message`'s message parameter.
pub const MESSAGE_PARAM: &str = "message";
/// `interrupt_agent`'s target parameter.
pub const AGENT_ID_PARAM: &str = "agent_id";
/// `list_agents`' scope parameter.
pub const SCOPE_PARAM: &str = "scope";

/// The `scope` value listing direct children (the default).
pub const SCOPE_CHILDREN: &str = "children";
/// The `scope` value walking the whole tree below the caller.
pub const SCOPE_DESCENDANTS: &str = "descendants";

// ---- send_message ---------------------------------------------------------------------------

/// The `send_message` description. It promises no job and no answer: the message becomes the
/// subagent's next turn, and a failure means it was not delivered.
pub const SEND_MESSAGE_DESCRIPTION: &str = "Send a message to a background subagent by the subagent id it was started with, continuing \
     the same conversation. The message becomes the subagent's next turn: if the subagent is \
     still working, the message waits until its current turn ends, so it cannot redirect work \
     already under way. This call returns no answer from the subagent, only the confirmation \
     that the message was queued; use it to give the subagent more work, and the runtime tells \
     you when it settles again. If this call fails, the message was NOT delivered.";

/// Description of `subagent_id`.
pub const SUBAGENT_ID_PARAM_TEXT: &str = "The subagent id returned when the background subagent was started.";

/// Description of `message`.
pub const MESSAGE_PARAM_TEXT: &str = "The message to deliver to the subagent.";

/// The argument schema of `send_message`: the two required strings `subagent_id` and `message`.
pub fn send_message_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            SUBAGENT_ID_PARAM: {"type": "string", "description": SUBAGENT_ID_PARAM_TEXT},
            MESSAGE_PARAM: {"type": "string", "description": MESSAGE_PARAM_TEXT},
        },
        "required": [SUBAGENT_ID_PARAM, MESSAGE_PARAM],
    })
}

/// The rendering of an accepted delivery: `message queued as the next turn for subagent <id>`.
pub fn message_queued(subagent_id: &str) -> String {
    format!("message queued as the next turn for subagent {subagent_id}")
}

// ---- interrupt_agent ----------------------------------------------------------------------

/// The `interrupt_agent` description: only the current turn stops, queued messages wait for a
/// later `send_message`, and a finished target is an accepted no-op.
pub const INTERRUPT_AGENT_DESCRIPTION: &str = "Request cancellation of a background agent's current turn, by its agent id. The target may \
     be your direct child or a deeper agent started below it. Only the current turn stops: \
     messages already queued for the agent stay parked until a later send_message reaches it, \
     agents it started keep running, and the agent itself stays available for follow-ups. This \
     call returns as soon as the stop is requested, so the agent may keep running briefly; \
     interrupting an agent that has already finished is accepted and does nothing.";

/// Description of `agent_id`.
pub const AGENT_ID_PARAM_TEXT: &str = "The agent id of the running agent to interrupt.";

/// The argument schema of `interrupt_agent`: the single required string `agent_id`.
pub fn interrupt_agent_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            AGENT_ID_PARAM: {"type": "string", "description": AGENT_ID_PARAM_TEXT},
        },
        "required": [AGENT_ID_PARAM],
    })
}

/// The rendering of an accepted interrupt (also of an accepted no-op):
/// `interrupt requested for agent <id>`.
pub fn interrupt_requested(agent_id: &str) -> String {
    format!("interrupt requested for agent {agent_id}")
}

// ---- list_agents --------------------------------------------------------------------------

/// The `list_agents` description: discovery for recall, not polling; the three statuses (with
/// `ready` resumable, not terminal); the snapshot is no delivery promise; diagnostics; the
/// `descendants` scope and which entries may take `send_message` or `interrupt_agent`.
pub const LIST_AGENTS_DESCRIPTION: &str = "List your continuable background subagents by durable id and label. Use it to recall which \
     ones you started, not to poll for completion — you are told when one finishes. Each status \
     comes from the live agent registry: running means the subagent is working right now; idle \
     means it is loaded but between turns (it may be waiting on agents it started); ready means \
     it exists only in storage — resumable, not terminal, and not a result waiting to be \
     collected: a `send_message` starts a new turn of the same conversation. A direct child \
     stays a `send_message` candidate in every status. The list is a snapshot, not a delivery \
     promise: `send_message` makes the authoritative check and may still fail. Children that \
     could not be read are listed as diagnostics instead of being left out. Scope \
     `descendants` walks the whole tree below you in a stable pre-order and gives each entry \
     its durable direct-parent id and its depth; only depth-1 entries may receive \
     `send_message`, deeper entries are candidates for `interrupt_agent` only.";

/// Description of `scope`.
pub const SCOPE_PARAM_TEXT: &str =
    "children (default) lists your direct children only; descendants walks the complete tree below you.";

/// The argument schema of `list_agents`: one optional string `scope`, `children` or
/// `descendants`; nothing is required.
pub fn list_agents_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            SCOPE_PARAM: {
                "type": "string",
                "enum": [SCOPE_CHILDREN, SCOPE_DESCENDANTS],
                "description": SCOPE_PARAM_TEXT,
            },
        },
        "required": [],
    })
}

/// The rendering of an empty listing.
pub const NO_SUBAGENTS: &str = "(no subagents)";

/// The position annotation of a `descendants` line: ` parent=<id> depth=<n>`.
fn position_text(position: Option<(&str, usize)>) -> String {
    position.map_or_else(String::new, |(parent, depth)| {
        format!(" parent={parent} depth={depth}")
    })
}

/// One listed child: `<id> [<status>] — <label>`, with ` parent=<id> depth=<n>` before the
/// dash when the entry has a position (scope `descendants`).
///
/// The listing is one line per entry, and a label is the delegating model's free text (in scope
/// `descendants`, a child model's): every control character in it (C0 and C1, so every line
/// break — `\n`, `\r`, vertical tab, form feed, NEL — and the information separators
/// U+001C–U+001E that line splitters such as Python's `splitlines` also break on) and the line
/// and paragraph separators U+2028 and U+2029 are rendered as a space, so a label can neither
/// split its entry nor forge another.
pub fn child_line(id: &str, status: &str, position: Option<(&str, usize)>, label: &str) -> String {
    let label: String = label
        .chars()
        .map(|c| if breaks_a_line(c) { ' ' } else { c })
        .collect();
    format!("{id} [{status}]{} — {label}", position_text(position))
}

/// Whether `c` may end a line for some reader of the listing: a control character (Unicode
/// `Cc`, which holds every ASCII and C1 line break and the separators U+001C–U+001E) or one of
/// the separators U+2028 and U+2029.
fn breaks_a_line(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// One diagnostic row: `<id> [diagnostic: <reason>]`, with ` parent=<id> depth=<n>` at the end
/// when the entry has a position (scope `descendants`).
pub fn diagnostic_line(id: &str, reason: &str, position: Option<(&str, usize)>) -> String {
    format!("{id} [diagnostic: {reason}]{}", position_text(position))
}

// ---- refusals -----------------------------------------------------------------------------

/// `send_message` without a live calling agent.
pub const SEND_MESSAGE_CALLING_AGENT_REQUIRED: &str =
    "send_message requires a calling agent (exec.agent was undefined)";

/// `interrupt_agent` without a live calling agent.
pub const INTERRUPT_AGENT_CALLING_AGENT_REQUIRED: &str =
    "interrupt_agent requires a calling agent (exec.agent was undefined)";

/// `list_agents` without a live calling agent.
pub const LIST_AGENTS_CALLING_AGENT_REQUIRED: &str =
    "list_agents requires a calling agent (exec.agent was undefined)";

/// The arguments of tool `tool` are not a JSON object.
pub fn arguments_not_object(tool: &str) -> String {
    format!("{tool} arguments must be a JSON object")
}

/// A required id parameter of tool `tool` is missing, not a string, or empty.
pub fn id_param_required(tool: &str, name: &str) -> String {
    format!("{tool} argument `{name}` is required and must be a non-empty string")
}

/// `send_message`'s `message` is missing or not a string.
pub const MESSAGE_REQUIRED: &str = "send_message argument `message` is required and must be a string";

/// `send_message`'s `message` has no non-whitespace character: there is nothing to deliver.
pub const MESSAGE_BLANK: &str =
    "send_message argument `message` must contain the message: it is empty or only whitespace";

/// `list_agents`' `scope` is present but neither `children` nor `descendants`.
pub const SCOPE_INVALID: &str =
    "list_agents argument `scope` must be \"children\" or \"descendants\" when present";

/// An `interrupt_agent` call whose signal was already cancelled when its body ran: nothing was
/// interrupted.
pub fn interrupt_cancelled(agent_id: &str) -> String {
    format!(
        "interrupt_agent was cancelled before the interrupt was requested; agent {agent_id} was not interrupted"
    )
}

/// A `send_message` call whose body ran after the control plugin's shutdown began (it was
/// resolved before the tools were unloaded): no delivery was started.
pub const SEND_MESSAGE_SHUT_DOWN: &str = "send_message is shut down; the message was NOT delivered";

/// The cancellation reason a delivery receives when its `send_message` call is abandoned (the
/// call's future dropped before the child's inbox accepted the message, without the call's
/// signal firing).
pub const DELIVERY_ABANDONED_REASON: &str =
    "the send_message call was abandoned before the message was accepted";

/// The detail of [`delivery_task_failed`] when the runtime cancelled the delivery's task (it is
/// shutting down).
pub const TASK_CANCELLED: &str = "its task was cancelled by the runtime";

/// The task of a delivery ended without an answer (it panicked, or the runtime cancelled it):
/// whether the message was accepted is unknown, and the text says so.
pub fn delivery_task_failed(subagent_id: &str, detail: &str) -> String {
    format!(
        "delivery to subagent {subagent_id} ended without an answer ({detail}); the message may not have been delivered"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    /// The three descriptions, verbatim.
    #[test]
    fn descriptions_are_pinned() {
        insta::assert_snapshot!(
            [
                format!("## {SEND_MESSAGE}\n{SEND_MESSAGE_DESCRIPTION}"),
                format!("## {INTERRUPT_AGENT}\n{INTERRUPT_AGENT_DESCRIPTION}"),
                format!("## {LIST_AGENTS}\n{LIST_AGENTS_DESCRIPTION}"),
            ]
            .join("\n\n")
        );
    }

    /// The three argument schemas.
    #[test]
    fn schemas_are_pinned() {
        let mut out = Map::new();
        out.insert(SEND_MESSAGE.to_owned(), send_message_parameters());
        out.insert(INTERRUPT_AGENT.to_owned(), interrupt_agent_parameters());
        out.insert(LIST_AGENTS.to_owned(), list_agents_parameters());
        insta::assert_snapshot!(serde_json::to_string_pretty(&Value::Object(out)).unwrap_or_default());
    }

    /// The renderings and the refusals.
    #[test]
    fn renderings_and_refusals_are_pinned() {
        let lines = [
            message_queued("child-1"),
            interrupt_requested("child-1"),
            NO_SUBAGENTS.to_owned(),
            child_line("child-1", "ready", None, "summarize the doc"),
            child_line("child-2", "running", Some(("parent", 1)), "nested leaf"),
            diagnostic_line("broken", "corrupt", None),
            diagnostic_line("broken", "unavailable", Some(("parent", 2))),
            SEND_MESSAGE_CALLING_AGENT_REQUIRED.to_owned(),
            INTERRUPT_AGENT_CALLING_AGENT_REQUIRED.to_owned(),
            LIST_AGENTS_CALLING_AGENT_REQUIRED.to_owned(),
            arguments_not_object(SEND_MESSAGE),
            id_param_required(SEND_MESSAGE, SUBAGENT_ID_PARAM),
            id_param_required(INTERRUPT_AGENT, AGENT_ID_PARAM),
            MESSAGE_REQUIRED.to_owned(),
            MESSAGE_BLANK.to_owned(),
            SCOPE_INVALID.to_owned(),
            interrupt_cancelled("child-1"),
            SEND_MESSAGE_SHUT_DOWN.to_owned(),
            DELIVERY_ABANDONED_REASON.to_owned(),
            delivery_task_failed("child-1", "panicked"),
            delivery_task_failed("child-1", TASK_CANCELLED),
        ];
        insta::assert_snapshot!(lines.join("\n---\n"));
    }

    /// spec: CTRL-1 (wording half) — the `send_message` description promises no job and names
    /// the next turn; the registered schema is asserted in `tests/control.rs`.
    #[test]
    fn send_message_wording() {
        assert!(!SEND_MESSAGE_DESCRIPTION.contains("job_output"));
        assert!(!SEND_MESSAGE_DESCRIPTION.contains("job id"));
        assert!(SEND_MESSAGE_DESCRIPTION.contains("next turn"));
        assert!(SEND_MESSAGE_DESCRIPTION.contains("NOT delivered"));
    }

    /// spec: CTRL-9 (wording half) — the `interrupt_agent` description names the current turn
    /// and `send_message`.
    #[test]
    fn interrupt_agent_wording() {
        assert!(INTERRUPT_AGENT_DESCRIPTION.contains("current turn"));
        assert!(INTERRUPT_AGENT_DESCRIPTION.contains("send_message"));
    }

    /// §4.4 "one line per entry" — no character a line splitter breaks on survives in a
    /// rendered label: the ASCII and Unicode line breaks, the information separators
    /// U+001C–U+001E (Python's `splitlines` breaks on them) and every other control character
    /// become spaces, so a label (a child model's free text, in scope `descendants`) cannot
    /// forge a listing line for any reader. Ordinary text, including non-ASCII, is kept.
    #[test]
    fn a_label_cannot_break_its_line_for_any_line_splitter() {
        let breakers = [
            '\n', '\r', '\u{b}', '\u{c}', '\u{1c}', '\u{1d}', '\u{1e}', '\u{85}', '\u{2028}', '\u{2029}',
            '\0', '\u{1b}', '\u{7f}', '\u{9f}',
        ];
        for c in breakers {
            let label = format!("real{c}forged [idle] — fake child");
            let line = child_line("child-1", "ready", Some(("parent", 1)), &label);
            assert_eq!(
                line,
                "child-1 [ready] parent=parent depth=1 — real forged [idle] — fake child",
                "U+{:04X}",
                u32::from(c)
            );
            assert!(!line.chars().any(breaks_a_line), "U+{:04X}", u32::from(c));
        }
        assert_eq!(
            child_line("c", "idle", None, "résumé\t— ünïcode ✓"),
            "c [idle] — résumé — ünïcode ✓"
        );
    }

    /// spec: CTRL-20 (wording half) — the `list_agents` description says completion is
    /// announced and `ready` is resumable, and names both action tools (CTRL-15).
    #[test]
    fn list_agents_wording() {
        for phrase in [
            "not to poll for completion — you are told when one finishes",
            "resumable, not terminal",
            "send_message",
            "interrupt_agent",
        ] {
            assert!(LIST_AGENTS_DESCRIPTION.contains(phrase), "{phrase}");
        }
    }
}
