//! Building the chat-completions request body from a [`GenerateOptions`].

use agent::content::visible_text;
use agent::{ContentBlock, GenerateOptions, Message, Role};
use serde_json::{Map, Value, json};

/// The JSON body of a streaming chat-completions request for `request`, sent to `model`.
///
/// * `system` becomes a leading `system` message.
/// * A user-role message's `tool-result` blocks become `tool` messages (content: the result's
///   visible text); its other text and image blocks become one `user` message (a plain string
///   for a single text block, content parts otherwise).
/// * An assistant message becomes `{content, tool_calls}`; reasoning blocks are not sent back;
///   a message with neither text nor calls is skipped.
/// * `tools`, `temperature`, `max_tokens`, `stop` and `reasoning_effort` are sent when set;
///   usage is requested with `stream_options.include_usage`.
pub(crate) fn build_body(request: &GenerateOptions, model: &str) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = &request.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for message in &request.messages {
        push_message(&mut messages, message);
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("stream".into(), json!(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if let Some(tools) = request.tools.as_ref().filter(|t| !t.is_empty()) {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters,
                }})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(n) = request.max_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    if let Some(stop) = &request.stop {
        body.insert("stop".into(), json!(stop));
    }
    if let Some(effort) = &request.reasoning_effort {
        body.insert("reasoning_effort".into(), json!(effort));
    }
    Value::Object(body)
}

fn push_message(out: &mut Vec<Value>, message: &Message) {
    match message.role {
        Role::System => out.push(json!({"role": "system", "content": message.text()})),
        Role::User => {
            let mut parts = Vec::new();
            for block in &message.content {
                match block {
                    ContentBlock::ToolResult {
                        tool_call_id,
                        content,
                        ..
                    } => out.push(json!({
                        "role": "tool",
                        "tool_call_id": tool_call_id,
                        "content": visible_text(content),
                    })),
                    ContentBlock::Text { text } => parts.push(json!({"type": "text", "text": text})),
                    ContentBlock::Image { fields } => {
                        if let Some(url) = image_url(fields) {
                            parts.push(json!({"type": "image_url", "image_url": {"url": url}}));
                        }
                    }
                    _ => {}
                }
            }
            match parts.as_slice() {
                [] => {}
                [only] if only["type"] == "text" => {
                    out.push(json!({"role": "user", "content": only["text"]}));
                }
                _ => out.push(json!({"role": "user", "content": parts})),
            }
        }
        Role::Assistant => {
            let text = message.text();
            let calls: Vec<Value> = message
                .content
                .iter()
                .filter_map(|b| match b {
                    ContentBlock::ToolCall { id, name, arguments } => Some(json!({
                        "id": id, "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    })),
                    _ => None,
                })
                .collect();
            if text.is_empty() && calls.is_empty() {
                return;
            }
            let mut m = Map::new();
            m.insert("role".into(), json!("assistant"));
            m.insert(
                "content".into(),
                if text.is_empty() { Value::Null } else { json!(text) },
            );
            if !calls.is_empty() {
                m.insert("tool_calls".into(), Value::Array(calls));
            }
            out.push(Value::Object(m));
        }
    }
}

/// An image block's URL: its `url`, or a data URL from `data` and `mimeType`.
fn image_url(fields: &Map<String, Value>) -> Option<String> {
    if let Some(url) = fields.get("url").and_then(Value::as_str) {
        return Some(url.to_owned());
    }
    let data = fields.get("data").and_then(Value::as_str)?;
    let mime = fields
        .get("mimeType")
        .and_then(Value::as_str)
        .unwrap_or("image/png");
    Some(format!("data:{mime};base64,{data}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent::{CallId, ToolSchema};

    #[test]
    fn maps_history_tools_and_settings() {
        let mut req = GenerateOptions::new(
            "p",
            "m",
            vec![
                Message::user_text("hi"),
                Message::assistant(
                    vec![
                        ContentBlock::reasoning("hmm"),
                        ContentBlock::text("calling"),
                        ContentBlock::tool_call("c1", "read", "{\"p\":1}"),
                    ],
                    "p",
                    "m",
                ),
                Message::tool_result(CallId::from("c1"), vec![ContentBlock::text("ok")], false),
                Message::assistant(vec![], "p", "m"),
            ],
        );
        req.system = Some("sys".into());
        req.tools = Some(vec![ToolSchema {
            name: "read".into(),
            description: "reads".into(),
            parameters: json!({"type": "object"}),
        }]);
        req.max_tokens = Some(100);
        req.temperature = Some(0.5);
        let body = build_body(&req, "gpt");
        assert_eq!(
            body,
            json!({
                "model": "gpt",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "calling", "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"p\":1}"}}
                    ]},
                    {"role": "tool", "tool_call_id": "c1", "content": "ok"},
                ],
                "stream": true,
                "stream_options": {"include_usage": true},
                "tools": [{"type": "function", "function": {"name": "read", "description": "reads", "parameters": {"type": "object"}}}],
                "temperature": 0.5,
                "max_tokens": 100,
            })
        );
    }
}
