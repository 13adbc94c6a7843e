//! A readable rendering of one session log (`subagent log <id>`).
//!
//! The header first (lineage, depth, inherited prefix, descriptor), then the log event by event:
//! turns and steps as markers, user and assistant messages as text, tool calls with their
//! arguments, tool results, inbox changes and log-only events in one line each. Streaming
//! chunks are summarized (`… N chunks`) rather than repeated, since the assembled
//! `assistant/message` carries the same content. Events inherited from a fork seed are marked
//! with `|` in the margin.
//!
//! Everything shown comes from the log, which models and whoever wrote the file control, so it
//! passes through [`crate::terminal_text`]: message bodies (user, assistant and tool-result
//! text) through [`multi_line`], keeping their line breaks (continuation lines are indented
//! under their event), and every other field — ids, labels, names, arguments, reasons — through
//! [`single_line`]. No control character, escape sequence or bidirectional control reaches the
//! terminal raw; each is shown as a visible escape such as `\u{1b}`.

use std::fmt::Write as _;

use agent::{ContentBlock, EventData, Message, MessageSource, SessionEvent, SessionHeader};

use crate::catalog::{summarize, tool_result_text};
use crate::terminal_text::{multi_line, single_line};

/// Long texts are cut to this many characters per block.
pub const MAX_TEXT_CHARS: usize = 2000;

/// Renders `header` and `events`.
pub fn render_log(header: &SessionHeader, events: &[SessionEvent]) -> String {
    let row = summarize(header.clone(), events);
    let mut out = String::new();
    let _ = writeln!(out, "session {}", single_line(header.id.as_str()));
    if let Some(parent) = &header.parent_session {
        let _ = writeln!(out, "  parent    {}", single_line(parent.as_str()));
    }
    if let Some(p) = &row.provider {
        let label = row
            .label
            .as_deref()
            .map(|l| format!(" \"{}\"", single_line(l)))
            .unwrap_or_default();
        let _ = writeln!(out, "  provider  {}{label}", single_line(p));
    }
    let _ = writeln!(out, "  depth     {}", row.depth);
    if let Some(cwd) = &header.cwd {
        let _ = writeln!(out, "  cwd       {}", single_line(&cwd.display().to_string()));
    }
    let _ = writeln!(out, "  created   {} (epoch ms)", header.created_at);
    let _ = writeln!(
        out,
        "  events    {}  turns {}  last {}",
        events.len(),
        row.turns,
        single_line(row.last_stop.as_deref().unwrap_or("(never ran)"))
    );
    if let Some(n) = header.seed_length {
        let _ = writeln!(out, "  inherited the first {n} events from its parent (marked |)");
    }
    out.push('\n');
    let seed = header.seed_length.unwrap_or(0);
    let mut chunks = 0usize;
    for event in events {
        if let EventData::AssistantChunk { .. } = event.data {
            chunks += 1;
            continue;
        }
        let margin = if event.seq < seed { "| " } else { "  " };
        if chunks > 0 {
            let _ = writeln!(out, "{margin}    … {chunks} streamed chunk(s)");
            chunks = 0;
        }
        // `describe` escaped every field already; a line goes through `multi_line` once more
        // so that nothing it may be extended with can reach the terminal raw (a no-op,
        // without allocating, on clean text).
        let text = match event.data {
            // The marker at the seed's end is where a fork child's own events begin; any later
            // one was written by a cold resume, which reopened the log with its events replayed.
            EventData::EndSeed if event.seq != seed => format!("#{:<4} ── resumed ──", event.seq),
            _ => describe(event),
        };
        for (i, line) in text.lines().enumerate() {
            let indent = if i == 0 { "" } else { "       " };
            let _ = writeln!(out, "{margin}{indent}{}", multi_line(line));
        }
    }
    if chunks > 0 {
        let _ = writeln!(out, "      … {chunks} streamed chunk(s)");
    }
    out
}

/// One event as text (possibly several lines: only message bodies keep their line breaks).
fn describe(event: &SessionEvent) -> String {
    let seq = event.seq;
    match &event.data {
        EventData::TurnStart { turn } => format!("#{seq:<4} ── turn {turn} ──"),
        EventData::TurnEnd { turn, reason } => {
            let detail = match reason {
                agent::TurnEndReason::Aborted { reason } => {
                    format!(" ({})", single_line(&reason.to_string()))
                }
                agent::TurnEndReason::Error { error } => {
                    format!(" ({})", single_line(&error.to_string()))
                }
                _ => String::new(),
            };
            format!(
                "#{seq:<4} ── turn {turn} ended: {}{detail} ──",
                single_line(reason.kind())
            )
        }
        EventData::StepStart { turn, step } => format!("#{seq:<4}   step {turn}.{step}"),
        EventData::StepEnd { .. } => String::new(),
        EventData::UserMessage(m) => format!("#{seq:<4} {} {}", who(m), message_text(m)),
        EventData::AssistantMessage {
            message,
            interrupted,
            usage,
            ..
        } => {
            let mut s = format!("#{seq:<4} [assistant] {}", message_text(message));
            if *interrupted {
                s.push_str("  (interrupted)");
            }
            if let Some(u) = usage {
                let _ = write!(s, "\ntokens in {} out {}", u.input_tokens, u.output_tokens);
            }
            s
        }
        EventData::ToolCall {
            call_id,
            name,
            arguments,
            ..
        } => format!(
            "#{seq:<4}   → {} [{}] {}",
            single_line(name),
            single_line(call_id.as_str()),
            single_line(&clip(arguments))
        ),
        EventData::ToolResult { message, error, .. } => {
            let call = match &message.source {
                MessageSource::Tool { call_id, .. } => single_line(call_id.as_str()).into_owned(),
                _ => "?".to_owned(),
            };
            let status = match error {
                Some(e) => format!("error {}", single_line(&e.code.to_string())),
                None => "ok".to_owned(),
            };
            format!(
                "#{seq:<4}   ← [{call}] {status}: {}",
                multi_line(&clip(&tool_result_text(message)))
            )
        }
        EventData::RequestHeader { header, reason } => {
            let tools = header
                .tools
                .as_ref()
                .map(|t| t.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "))
                .unwrap_or_else(|| "none".to_owned());
            let reason = format!("{reason:?}").to_lowercase();
            format!(
                "#{seq:<4}   request header ({reason}): {}/{}; tools: {}",
                single_line(&header.config.provider),
                single_line(&header.config.model),
                single_line(&tools)
            )
        }
        EventData::RequestContext { provider, model, .. } => format!(
            "#{seq:<4}   request context {}/{}",
            single_line(provider),
            single_line(model)
        ),
        EventData::EndSeed => format!("#{seq:<4} ── end of inherited prefix ──"),
        EventData::InboxSpliced(splice) => {
            let verb = if splice.is_cancellation() {
                "cancelled"
            } else if splice.is_claim() {
                "claimed"
            } else {
                "queued"
            };
            let n = splice
                .removed_count
                .unwrap_or(splice.inserted.len() as u64)
                .max(splice.inserted.len() as u64);
            let target = match splice.target {
                agent::InboxTarget::NextTurn => "next turn",
                agent::InboxTarget::NextStep => "next step",
            };
            format!("#{seq:<4}   inbox {verb} {n} message(s) for the {target}")
        }
        EventData::SandboxMode { mode, source } => {
            format!(
                "#{seq:<4}   sandbox mode {}{}",
                single_line(&mode.to_string()),
                from(source.as_deref())
            )
        }
        EventData::ApprovalPolicy { policy, source } => {
            format!(
                "#{seq:<4}   approval policy {}{}",
                single_line(&policy.to_string()),
                from(source.as_deref())
            )
        }
        EventData::Other { kind, data } => format!(
            "#{seq:<4}   {} {}",
            single_line(kind),
            single_line(&clip(&data.to_string()))
        ),
        other => format!("#{seq:<4}   {}", single_line(other.type_name())),
    }
}

fn from(source: Option<&str>) -> String {
    source
        .map(|s| format!(" (from {})", single_line(s)))
        .unwrap_or_default()
}

/// `[user]`, `[plugin <name>]` or `[<kind>]`.
fn who(message: &Message) -> String {
    match &message.source {
        MessageSource::User => "[user]".to_owned(),
        MessageSource::Plugin { plugin, .. } => format!("[{}]", single_line(plugin)),
        other => format!("[{}]", single_line(other.kind())),
    }
}

/// A message's content as one readable text: its texts keep their line breaks, the rest is
/// single-line (all of it escaped for the terminal).
fn message_text(message: &Message) -> String {
    let mut parts = Vec::new();
    for block in &message.content {
        match block {
            ContentBlock::Text { text } => parts.push(multi_line(&clip(text)).into_owned()),
            ContentBlock::Reasoning { text, .. } => {
                parts.push(format!("(thinking) {}", multi_line(&clip(text))))
            }
            ContentBlock::ToolCall { name, .. } => parts.push(format!("(calls {})", single_line(name))),
            ContentBlock::ToolResult { content, .. } => {
                parts.push(multi_line(&clip(&agent::content::visible_text(content))).into_owned())
            }
            ContentBlock::Image { .. } => parts.push("(image)".to_owned()),
            ContentBlock::Other(map) => parts.push(format!(
                "({})",
                single_line(map.get("type").and_then(|t| t.as_str()).unwrap_or("block"))
            )),
            _ => parts.push("(block)".to_owned()),
        }
    }
    if parts.is_empty() {
        "(empty)".to_owned()
    } else {
        parts.join(" ")
    }
}

/// Cuts `text` to [`MAX_TEXT_CHARS`] characters.
fn clip(text: &str) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(MAX_TEXT_CHARS).collect();
    if chars.next().is_some() {
        format!("{head}… [cut]")
    } else {
        head
    }
}
