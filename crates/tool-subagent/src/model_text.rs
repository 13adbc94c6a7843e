//! Every text the delegation tool puts in front of a model, in one place (`acp-and-tools.md`
//! §3.4–§3.8). Each is pinned by an `insta` snapshot below and listed in
//! `docs/model-experience.md`.
//!
//! * the tool description: a base wording chosen by the provider's `inheritsParentContext`
//!   (fresh child or inheriting child) plus a suffix chosen by the background mode;
//! * the parameter schema and its descriptions;
//! * the continuable guidance section;
//! * the rendering of the tool's value, the stop-reason failure texts and the combined
//!   result-and-dispose failure;
//! * the refusals the tool body raises (calling agent, disabled background, no job registry,
//!   malformed arguments).
//!
//! Texts the spec quotes are used verbatim; the base descriptions, the continuable suffix and
//! the guidance are this crate's wording around the phrases the spec makes load-bearing
//! (`does not see this conversation`, `inherits this conversation`,
//! `runs in the background by default`, `runtime sends you a notice containing its outcome`).
//! Failures reach the model through the tool registry, which prefixes them with `Error: `.

use serde_json::{Map, Value, json};
use subagent::StopReason;
use subagent::agent::ContentBlock;
use subagent::agent::content::visible_text;
use subagent::agent::jobs::JobError;

/// The default model-facing tool name.
pub const DEFAULT_TOOL_NAME: &str = "subagent";

/// The name of the `description` parameter.
pub const DESCRIPTION_PARAM: &str = "description";
/// The name of the `prompt` parameter.
pub const PROMPT_PARAM: &str = "prompt";
/// The name of the `run_in_background` parameter.
pub const RUN_IN_BACKGROUND_PARAM: &str = "run_in_background";

/// Description of the `description` parameter.
pub const DESCRIPTION_PARAM_TEXT: &str = "A short (3-5 word) description of the delegated task, for display.";

/// Description of the `prompt` parameter for a fresh child (one that does not see the parent's
/// conversation).
pub const FRESH_PROMPT_PARAM_TEXT: &str = "The complete, self-contained task for the subagent. It does not share this conversation's \
     context, so include everything it needs.";

/// Description of the `prompt` parameter for a child seeded with the parent's completed turns.
pub const INHERITING_PROMPT_PARAM_TEXT: &str = "The task for the subagent. It already sees this conversation's completed turns, so build on \
     them freely and state only what is new.";

/// Description of `run_in_background` in one-shot mode.
pub const ONE_SHOT_BACKGROUND_PARAM_TEXT: &str = "Whether to run as a background job and return its id. Defaults to false; collect with \
     job_output or stop with job_kill.";

/// Description of `run_in_background` in continuable mode.
pub const CONTINUABLE_BACKGROUND_PARAM_TEXT: &str = "Whether to run in the background and return a durable subagent id immediately. Defaults to \
     true. Set false to wait for the result when your next action depends on it.";

/// Base description for a fresh child: a self-contained task in a separate context.
pub const FRESH_DESCRIPTION: &str = "Delegate a self-contained task to a subagent: a separate agent with its own context that \
     does not see this conversation. Use it for focused, independent work (research, a scoped \
     change, an analysis) that would otherwise fill this conversation's context. It returns its \
     result, not its intermediate steps, so give it a complete, standalone prompt.";

/// Base description for a child seeded with the parent's completed turns.
pub const INHERITING_DESCRIPTION: &str = "Delegate a task to a subagent that inherits this conversation: the child starts from every \
     completed turn so far (it does not see the turn in progress). Use it for work that builds on \
     what has already been established here (a follow-up analysis, a review, a continuation) \
     without spending this conversation's context on the work itself. It returns its result, \
     not its intermediate steps.";

/// Description suffix when background runs are disabled.
pub const FOREGROUND_ONLY_SUFFIX: &str = " This call waits for the subagent and returns its result.";

/// Description suffix in one-shot mode.
pub const ONE_SHOT_SUFFIX: &str = " This call waits for the result by default. Set `run_in_background: true` to return a job \
     id; collect with `job_output` and stop with `job_kill`.";

/// Description suffix in continuable mode.
pub const CONTINUABLE_SUFFIX: &str = " This tool runs in the background by default: it returns a durable subagent id at once and \
     keeps the child's conversation available for later turns. When the run settles, the \
     runtime sends you a notice with its outcome and any final assistant message; \
     `send_message` gives the same child a later turn. Set `run_in_background: false` only when \
     your next action depends on the result.";

/// The order of the continuable guidance section (spec: 116.5, after the delegation policy and
/// before the child `report` guidance at 117; prompt orders are integers here, so it shares 116
/// with the delegation policy and follows it by registration order).
pub const GUIDANCE_ORDER: i32 = 116;

/// The name of the continuable guidance section: `tool:<toolName>`.
pub fn guidance_section_name(tool_name: &str) -> String {
    format!("tool:{tool_name}")
}

/// The continuable guidance text for tool `tool_name`.
pub fn guidance(tool_name: &str) -> String {
    format!(
        "Use {tool_name} in the background by default. Start independent delegations together in \
         one assistant message and keep doing useful work while they run. Set \
         `run_in_background: false` only when your next action depends on that subagent's result. \
         When a background run settles, the runtime sends you a notice containing its outcome and \
         any final assistant message."
    )
}

/// How an instance exposes background runs; selects the description suffix and the
/// `run_in_background` parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackgroundExposure {
    /// `enableRunInBackground: false`: no parameter, foreground only.
    Disabled,
    /// One-shot mode: background runs are jobs.
    OneShot,
    /// Continuable mode: background by default, durable child ids.
    Continuable,
}

/// The tool description for a provider that does (`inherits = true`) or does not see the
/// parent's completed turns, under `exposure`.
pub fn tool_description(inherits: bool, exposure: BackgroundExposure) -> String {
    let base = if inherits {
        INHERITING_DESCRIPTION
    } else {
        FRESH_DESCRIPTION
    };
    let suffix = match exposure {
        BackgroundExposure::Disabled => FOREGROUND_ONLY_SUFFIX,
        BackgroundExposure::OneShot => ONE_SHOT_SUFFIX,
        BackgroundExposure::Continuable => CONTINUABLE_SUFFIX,
    };
    format!("{base}{suffix}")
}

/// The JSON Schema of the tool's arguments: `description` and `prompt` (required strings) and,
/// unless background runs are disabled, the optional boolean `run_in_background`. There is no
/// provider selector and no mode parameter. Undeclared keys are not forbidden (which is why a
/// disabled instance also refuses `run_in_background: true` at execution).
pub fn tool_parameters(inherits: bool, exposure: BackgroundExposure) -> Value {
    let mut properties = Map::new();
    properties.insert(
        DESCRIPTION_PARAM.to_owned(),
        json!({"type": "string", "description": DESCRIPTION_PARAM_TEXT}),
    );
    let prompt = if inherits {
        INHERITING_PROMPT_PARAM_TEXT
    } else {
        FRESH_PROMPT_PARAM_TEXT
    };
    properties.insert(
        PROMPT_PARAM.to_owned(),
        json!({"type": "string", "description": prompt}),
    );
    let background = match exposure {
        BackgroundExposure::Disabled => None,
        BackgroundExposure::OneShot => Some(ONE_SHOT_BACKGROUND_PARAM_TEXT),
        BackgroundExposure::Continuable => Some(CONTINUABLE_BACKGROUND_PARAM_TEXT),
    };
    if let Some(text) = background {
        properties.insert(
            RUN_IN_BACKGROUND_PARAM.to_owned(),
            json!({"type": "boolean", "description": text}),
        );
    }
    json!({
        "type": "object",
        "properties": properties,
        "required": [DESCRIPTION_PARAM, PROMPT_PARAM],
    })
}

// ---- rendering ----------------------------------------------------------------------------

/// The rendering of a background start: `started background subagent job <jobId>`.
pub fn background_started(job_id: &str) -> String {
    format!("started background subagent job {job_id}")
}

/// The rendering of a continuable start: `started subagent <subagentId>`.
pub fn continuable_started(subagent_id: &str) -> String {
    format!("started subagent {subagent_id}")
}

/// The rendering of a foreground value's output (canonical JSON content blocks): the
/// concatenated `text` of its text blocks, defensively ignoring every other value.
pub fn foreground_text(output: &[Value]) -> String {
    output
        .iter()
        .filter(|v| v.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|v| v.get("text").and_then(Value::as_str))
        .collect()
}

/// The headline of a foreground run that ended with `reason`; `None` for `completed`.
pub fn stop_reason_headline(reason: &StopReason) -> Option<String> {
    Some(match reason {
        StopReason::Completed => return None,
        StopReason::Aborted => "subagent run was cancelled".to_owned(),
        StopReason::Error => "subagent run failed".to_owned(),
        StopReason::MaxTokens => "subagent run hit its token limit before finishing".to_owned(),
        StopReason::Refusal => "subagent declined the task".to_owned(),
        other => format!("subagent run ended abnormally ({other})"),
    })
}

/// The failure message of a foreground run that did not complete: the headline, then
/// `\nDiagnostic: <diagnostic>` when there is a diagnostic, then
/// `\nPartial output before the run ended:\n<text>` when the output's text is non-empty.
/// `None` for `completed`.
pub fn stop_reason_failure(
    reason: &StopReason,
    diagnostic: Option<&str>,
    output: &[ContentBlock],
) -> Option<String> {
    let mut message = stop_reason_headline(reason)?;
    if let Some(diagnostic) = diagnostic {
        message.push_str("\nDiagnostic: ");
        message.push_str(diagnostic);
    }
    let text = visible_text(output);
    if !text.is_empty() {
        message.push_str("\nPartial output before the run ended:\n");
        message.push_str(&text);
    }
    Some(message)
}

/// The one failure of a foreground run whose result failed and whose disposal failed too:
/// `subagent run failed: <result failure>; dispose failed: <dispose failure>`.
pub fn result_and_dispose_failed(result_failure: &str, dispose_failure: &str) -> String {
    format!("subagent run failed: {result_failure}; dispose failed: {dispose_failure}")
}

// ---- refusals -----------------------------------------------------------------------------

/// The call has no live calling agent to delegate from.
pub const CALLING_AGENT_REQUIRED: &str = "subagent tool requires a calling agent (exec.agent was undefined)";

/// `run_in_background: true` on an instance that disabled background runs.
pub const BACKGROUND_DISABLED: &str =
    "run_in_background is disabled for this tool instance (enableRunInBackground: false)";

/// A one-shot background call on a host without a job registry.
pub const JOBS_UNAVAILABLE: &str =
    "background jobs unavailable: load @deepseek-ai/dsh-jobs and @deepseek-ai/dsh-tool-jobs";

/// A one-shot background call whose job preflight found no job controller serving the calling
/// agent (`acp-and-tools.md` §3.8 step 2, verbatim): the registry's own refusal names the
/// problem, this text also names the remedy.
pub const JOBS_NO_CONTROLLER: &str = "background jobs unavailable: no job controller serves this agent (load \
     @deepseek-ai/dsh-tool-jobs in its composition)";

/// The model-facing text of a job registry's refusal to start a one-shot background job: the
/// spec's text for a missing controller ([`JOBS_NO_CONTROLLER`]), the registry's own text
/// (owner limit, disposed owner, shut-down registry, …) otherwise.
pub fn job_start_refused(error: &JobError) -> String {
    match error {
        JobError::NoController => JOBS_NO_CONTROLLER.to_owned(),
        other => other.to_string(),
    }
}

/// The cancellation reason a killed background job gives its run when `job_kill` names none.
pub const DEFAULT_KILL_REASON: &str = "background subagent task killed";

/// The cancellation reason a one-shot background job's run receives when the pipeline discards
/// the call's successful result (the call's signal fired as the body returned), so the model
/// never received the job id.
pub const CALL_DISCARDED_KILL_REASON: &str =
    "the subagent tool call was cancelled before its job id reached the model";

/// The cancellation reason a foreground run's child receives when its tool call is abandoned
/// (the call's future dropped before the run answered, without the call's signal firing).
pub const CALL_ABANDONED_REASON: &str = "the subagent tool call was abandoned before the run finished";

/// The cancellation reason a continuable start receives when its tool call is abandoned (the
/// call's future dropped before the child accepted its prompt, without the call's signal
/// firing).
pub const START_ABANDONED_REASON: &str =
    "the subagent tool call was abandoned before the child accepted its task";

/// The arguments are not a JSON object.
pub const ARGUMENTS_NOT_OBJECT: &str =
    "subagent arguments must be a JSON object with string fields `description` and `prompt`";

/// A required string parameter is missing or not a string.
pub fn string_param_required(name: &str) -> String {
    format!("subagent argument `{name}` is required and must be a string")
}

/// `prompt` is a string without any non-whitespace character: there is no task to delegate.
pub const PROMPT_BLANK: &str =
    "subagent argument `prompt` must contain the task: it is empty or only whitespace";

/// `run_in_background` is present but not a boolean.
pub const RUN_IN_BACKGROUND_NOT_BOOLEAN: &str =
    "subagent argument `run_in_background` must be a boolean when present";

/// The detail of [`foreground_task_failed`] and [`continuable_start_failed`] when the runtime
/// cancelled the call's task (it is shutting down).
pub const FOREGROUND_TASK_CANCELLED: &str = "its task was cancelled by the runtime";

/// The background task of a foreground call ended without an answer (it panicked, or the
/// runtime cancelled it): `subagent run failed: <detail>`.
pub fn foreground_task_failed(detail: &str) -> String {
    format!("subagent run failed: {detail}")
}

/// The task of a continuable start ended without an answer (it panicked, or the runtime
/// cancelled it): `subagent start failed: <detail>`.
pub fn continuable_start_failed(detail: &str) -> String {
    format!("subagent start failed: {detail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_descriptions() -> String {
        let mut out = Vec::new();
        for inherits in [false, true] {
            for exposure in [
                BackgroundExposure::Disabled,
                BackgroundExposure::OneShot,
                BackgroundExposure::Continuable,
            ] {
                out.push(format!(
                    "## inherits={inherits} exposure={exposure:?}\n{}",
                    tool_description(inherits, exposure)
                ));
            }
        }
        out.join("\n\n")
    }

    /// Both base wordings with every suffix, verbatim.
    #[test]
    fn descriptions_are_pinned() {
        insta::assert_snapshot!(all_descriptions());
    }

    /// The argument schema of every wording and exposure.
    #[test]
    fn schemas_are_pinned() {
        let mut out = Map::new();
        for (inherits, key) in [(false, "fresh"), (true, "inheriting")] {
            for (exposure, mode) in [
                (BackgroundExposure::Disabled, "disabled"),
                (BackgroundExposure::OneShot, "one-shot"),
                (BackgroundExposure::Continuable, "continuable"),
            ] {
                out.insert(format!("{key}/{mode}"), tool_parameters(inherits, exposure));
            }
        }
        insta::assert_snapshot!(serde_json::to_string_pretty(&Value::Object(out)).unwrap_or_default());
    }

    #[test]
    fn failure_and_rendering_texts_are_pinned() {
        let reasons = [
            StopReason::Completed,
            StopReason::Aborted,
            StopReason::Error,
            StopReason::MaxTokens,
            StopReason::Refusal,
            StopReason::Other("frobnicated".into()),
        ];
        let mut lines: Vec<String> = reasons
            .iter()
            .map(|r| format!("{r}: {:?}", stop_reason_headline(r)))
            .collect();
        lines.push(
            stop_reason_failure(&StopReason::Error, Some("d"), &[ContentBlock::text("partial")])
                .unwrap_or_default(),
        );
        lines.push(result_and_dispose_failed("first", "second"));
        lines.push(background_started("subagent-1"));
        lines.push(continuable_started("child-1"));
        lines.push(guidance_section_name(DEFAULT_TOOL_NAME));
        lines.push(guidance(DEFAULT_TOOL_NAME));
        lines.push(CALLING_AGENT_REQUIRED.to_owned());
        lines.push(BACKGROUND_DISABLED.to_owned());
        lines.push(JOBS_UNAVAILABLE.to_owned());
        lines.push(job_start_refused(&JobError::NoController));
        lines.push(job_start_refused(&JobError::LimitReached(10)));
        lines.push(DEFAULT_KILL_REASON.to_owned());
        lines.push(CALL_ABANDONED_REASON.to_owned());
        lines.push(START_ABANDONED_REASON.to_owned());
        lines.push(CALL_DISCARDED_KILL_REASON.to_owned());
        lines.push(ARGUMENTS_NOT_OBJECT.to_owned());
        lines.push(string_param_required(PROMPT_PARAM));
        lines.push(PROMPT_BLANK.to_owned());
        lines.push(RUN_IN_BACKGROUND_NOT_BOOLEAN.to_owned());
        lines.push(foreground_task_failed("panicked"));
        lines.push(foreground_task_failed(FOREGROUND_TASK_CANCELLED));
        lines.push(continuable_start_failed("panicked"));
        lines.push(continuable_start_failed(FOREGROUND_TASK_CANCELLED));
        insta::assert_snapshot!(lines.join("\n---\n"));
    }

    /// spec: TOOL-20 — a fresh child's wording says it does not see the conversation, and the
    /// prompt parameter asks for everything it needs.
    #[test]
    fn fresh_wording_phrases() {
        for exposure in [
            BackgroundExposure::Disabled,
            BackgroundExposure::OneShot,
            BackgroundExposure::Continuable,
        ] {
            assert!(tool_description(false, exposure).contains("does not see this conversation"));
            let params = tool_parameters(false, exposure);
            let prompt = params["properties"]["prompt"]["description"]
                .as_str()
                .unwrap_or("");
            assert!(prompt.contains("include everything it needs"));
        }
    }

    /// spec: TOOL-21 — an inheriting child's wording says it inherits the conversation, never
    /// that it does not see it, and the prompt parameter mentions completed turns.
    #[test]
    fn inheriting_wording_phrases() {
        for exposure in [
            BackgroundExposure::Disabled,
            BackgroundExposure::OneShot,
            BackgroundExposure::Continuable,
        ] {
            let description = tool_description(true, exposure);
            assert!(description.contains("inherits this conversation"));
            assert!(!description.contains("does not see this conversation"));
            let params = tool_parameters(true, exposure);
            let prompt = params["properties"]["prompt"]["description"]
                .as_str()
                .unwrap_or("");
            assert!(prompt.contains("completed turns"));
        }
    }

    /// spec: TOOL-46 (wording half) — the continuable description and parameter promise no job
    /// and name `send_message`; the guidance carries its load-bearing phrases. The route itself
    /// (an omitted flag starts a persisted child, no job) is exercised end to end in
    /// `tests/continuable.rs`.
    #[test]
    fn continuable_wording_phrases() {
        let description = tool_description(false, BackgroundExposure::Continuable);
        assert!(!description.contains("job_output"));
        assert!(!description.contains("job_kill"));
        assert!(description.contains("send_message"));
        assert!(description.contains("runs in the background by default"));
        assert!(!description.contains("never poll or wait on it"));
        assert!(CONTINUABLE_BACKGROUND_PARAM_TEXT.contains("Defaults to true"));
        let text = guidance("subagent");
        assert!(text.contains("Use subagent in the background by default"));
        assert!(text.contains("runtime sends you a notice containing its outcome"));
    }

    /// spec: TOOL-9 — the diagnostic rendering, exactly (the registry adds `Error: `).
    #[test]
    fn diagnostic_rendering_is_exact() {
        let message = stop_reason_failure(
            &StopReason::Error,
            Some("Claude Code denied a tool request"),
            &[
                ContentBlock::text("partial "),
                ContentBlock::text("assistant text"),
            ],
        );
        assert_eq!(
            message.as_deref(),
            Some(
                "subagent run failed\nDiagnostic: Claude Code denied a tool request\n\
                 Partial output before the run ended:\npartial assistant text"
            )
        );
        assert_eq!(
            stop_reason_failure(&StopReason::Refusal, None, &[]).as_deref(),
            Some("subagent declined the task")
        );
        assert_eq!(stop_reason_failure(&StopReason::Completed, None, &[]), None);
    }

    #[test]
    fn foreground_rendering_ignores_non_text_values() {
        let output = vec![
            json!({"type": "text", "text": "a"}),
            json!({"type": "reasoning", "text": "hidden"}),
            json!("stray"),
            json!({"type": "text", "text": 5}),
            json!({"type": "text", "text": "b"}),
        ];
        assert_eq!(foreground_text(&output), "ab");
    }
}
