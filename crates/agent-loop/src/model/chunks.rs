//! Builders for well-formed chunk lists (spec §13.2), used by [`ScriptedModel`](super::ScriptedModel)
//! scripts and by tests.
//!
//! Every function here returns a complete stream: each block is opened, filled by one delta and
//! closed with its assembled block; then one `usage` ([`SCRIPTED_USAGE`]) and one `finish`.
//! Block indexes count from 0 in emission order.

use agent::model::BlockType;
use agent::{CallId, ContentBlock, FinishReason, LlmFailure, StreamChunk, TokenUsage};
use serde_json::Value;

/// The usage every scripted response reports: 10 input tokens, 5 output tokens.
pub const SCRIPTED_USAGE: TokenUsage = TokenUsage {
    input_tokens: 10,
    output_tokens: 5,
    cache_read_tokens: None,
    cache_write_tokens: None,
    reasoning_tokens: None,
};

/// The raw argument string of a scripted tool call: a JSON value (serialized compactly) or a
/// string taken verbatim (which need not be valid JSON, to test argument validation).
pub trait ToolArguments {
    /// The raw argument string.
    fn into_arguments(self) -> String;
}

impl ToolArguments for Value {
    fn into_arguments(self) -> String {
        self.to_string()
    }
}

impl ToolArguments for &Value {
    fn into_arguments(self) -> String {
        self.to_string()
    }
}

impl ToolArguments for &str {
    fn into_arguments(self) -> String {
        self.to_owned()
    }
}

impl ToolArguments for String {
    fn into_arguments(self) -> String {
        self
    }
}

/// One tool call of a scripted response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScriptedCall {
    /// The call id.
    pub id: CallId,
    /// The tool name.
    pub name: String,
    /// The raw argument string.
    pub arguments: String,
}

/// A scripted tool call.
pub fn call(id: impl Into<CallId>, name: impl Into<String>, arguments: impl ToolArguments) -> ScriptedCall {
    ScriptedCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into_arguments(),
    }
}

/// A growing chunk list with a block-index counter.
#[derive(Debug, Default)]
struct Builder {
    chunks: Vec<StreamChunk>,
    next: u32,
}

impl Builder {
    fn text(&mut self, text: &str) -> &mut Self {
        let index = self.open(BlockType::Text);
        if !text.is_empty() {
            self.chunks.push(StreamChunk::TextDelta {
                index,
                text: text.to_owned(),
            });
        }
        self.close(index, ContentBlock::text(text))
    }

    fn reasoning(&mut self, text: &str) -> &mut Self {
        let index = self.open(BlockType::Reasoning);
        self.chunks.push(StreamChunk::ReasoningDelta {
            index,
            text: text.to_owned(),
        });
        self.close(index, ContentBlock::reasoning(text))
    }

    fn call(&mut self, call: ScriptedCall) -> &mut Self {
        let index = self.open(BlockType::ToolCall);
        self.chunks.push(StreamChunk::ToolCallDelta {
            index,
            id: call.id.clone(),
            name: Some(call.name.clone()),
            arguments_delta: call.arguments.clone(),
        });
        self.close(
            index,
            ContentBlock::ToolCall {
                id: call.id,
                name: call.name,
                arguments: call.arguments,
            },
        )
    }

    fn open(&mut self, block_type: BlockType) -> u32 {
        let index = self.next;
        self.next += 1;
        self.chunks.push(StreamChunk::BlockStart { index, block_type });
        index
    }

    fn close(&mut self, index: u32, block: ContentBlock) -> &mut Self {
        self.chunks.push(StreamChunk::BlockEnd { index, block });
        self
    }

    fn finish(&mut self, reason: FinishReason) -> Vec<StreamChunk> {
        self.chunks.push(StreamChunk::Usage {
            usage: SCRIPTED_USAGE,
        });
        self.chunks.push(finish_chunk(reason));
        std::mem::take(&mut self.chunks)
    }
}

/// A `finish` chunk without replay state.
pub fn finish_chunk(reason: FinishReason) -> StreamChunk {
    StreamChunk::Finish {
        reason,
        replay_state: None,
    }
}

/// One text block, finish `stop`. An empty `text` yields an empty text block (no delta).
pub fn text(text: impl AsRef<str>) -> Vec<StreamChunk> {
    // Block start, delta, block end, usage, finish.
    let mut builder = Builder {
        chunks: Vec::with_capacity(5),
        next: 0,
    };
    builder.text(text.as_ref()).finish(FinishReason::Stop)
}

/// A reasoning block then a text block, finish `stop`.
pub fn reasoning_then_text(reasoning: impl AsRef<str>, text: impl AsRef<str>) -> Vec<StreamChunk> {
    Builder::default()
        .reasoning(reasoning.as_ref())
        .text(text.as_ref())
        .finish(FinishReason::Stop)
}

/// One text block, finish `max-tokens` (the output-token ceiling was hit).
pub fn max_tokens_text(text: impl AsRef<str>) -> Vec<StreamChunk> {
    Builder::default()
        .text(text.as_ref())
        .finish(FinishReason::MaxTokens)
}

/// One tool call (no text), finish `tool-calls`.
pub fn tool_call(
    id: impl Into<CallId>,
    name: impl Into<String>,
    arguments: impl ToolArguments,
) -> Vec<StreamChunk> {
    tool_calls(None, vec![call(id, name, arguments)])
}

/// A text block, then one tool call, finish `tool-calls`.
pub fn text_and_tool_call(
    text: impl AsRef<str>,
    id: impl Into<CallId>,
    name: impl Into<String>,
    arguments: impl ToolArguments,
) -> Vec<StreamChunk> {
    tool_calls(Some(text.as_ref()), vec![call(id, name, arguments)])
}

/// An optional leading text block, then every call in order (several calls in one response),
/// finish `tool-calls`.
pub fn tool_calls(leading_text: Option<&str>, calls: Vec<ScriptedCall>) -> Vec<StreamChunk> {
    let mut b = Builder::default();
    if let Some(t) = leading_text {
        b.text(t);
    }
    for c in calls {
        b.call(c);
    }
    b.finish(FinishReason::ToolCalls)
}

/// A response cut at the output-token ceiling in the middle of a tool call: the call block is
/// closed with the partial `arguments` it had and the finish is `max-tokens` (the loop must not
/// dispatch it).
pub fn max_tokens_tool_call(
    id: impl Into<CallId>,
    name: impl Into<String>,
    partial_arguments: impl Into<String>,
) -> Vec<StreamChunk> {
    let mut b = Builder::default();
    b.call(ScriptedCall {
        id: id.into(),
        name: name.into(),
        arguments: partial_arguments.into(),
    });
    b.finish(FinishReason::MaxTokens)
}

/// An empty completion: no blocks, usage, finish `stop`.
pub fn empty() -> Vec<StreamChunk> {
    Builder::default().finish(FinishReason::Stop)
}

/// An in-band `finish {error {failure}}` with no blocks and no usage.
pub fn error(failure: LlmFailure) -> Vec<StreamChunk> {
    vec![finish_chunk(FinishReason::Error { failure })]
}

/// An in-band `finish {aborted {failure}}` with no blocks and no usage (an abort the request's
/// signal did not cause).
pub fn aborted(failure: LlmFailure) -> Vec<StreamChunk> {
    vec![finish_chunk(FinishReason::Aborted { failure })]
}
