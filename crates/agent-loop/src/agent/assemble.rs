//! Assembling streamed chunks into the blocks of one assistant message (spec §13.2, §13.3).

use serde_json::Value;

use agent::model::BlockType;
use agent::{CallId, ContentBlock, FinishReason, StreamChunk, TokenUsage};

/// Appends a delta to a block's text. The first delta (often the only one) is copied into a
/// string of its size: growing a string without a buffer takes the slower reserving path.
fn append(text: &mut String, delta: &str) {
    if text.capacity() == 0 {
        *text = delta.to_owned();
    } else {
        text.push_str(delta);
    }
}

/// One block as seen so far.
struct Partial {
    index: u32,
    kind: Option<BlockType>,
    text: String,
    call_id: Option<CallId>,
    name: Option<String>,
    arguments: String,
    /// Set by `block-end` when its block differs from what the deltas assembled: authoritative.
    block: Option<ContentBlock>,
    /// Set by `block-end`: freezes the partial. A closed partial without a `block` stands for
    /// the block its deltas assembled (which the `block-end` repeated).
    closed: bool,
}

impl Partial {
    fn new(index: u32, kind: Option<BlockType>) -> Self {
        Self {
            index,
            kind,
            text: String::new(),
            call_id: None,
            name: None,
            arguments: String::new(),
            block: None,
            closed: false,
        }
    }

    /// Closes the partial with the `block-end` block. A text or reasoning block equal to what
    /// the deltas assembled (the common case) is not copied: the assembled text stands for it.
    fn close(&mut self, block: &ContentBlock) {
        let repeated = match (block, self.kind) {
            (ContentBlock::Text { text }, Some(BlockType::Text)) => *text == self.text,
            (ContentBlock::Reasoning { text, extra }, Some(BlockType::Reasoning)) => {
                extra.is_empty() && *text == self.text
            }
            _ => false,
        };
        if !repeated {
            self.block = Some(block.clone());
        }
        self.closed = true;
    }

    /// The block this partial stands for; `None` for an unclosed block of a type that cannot
    /// be assembled from deltas.
    fn assemble(&self) -> Option<ContentBlock> {
        if let Some(block) = &self.block {
            return Some(block.clone());
        }
        match self.kind? {
            BlockType::Text => Some(ContentBlock::text(self.text.clone())),
            BlockType::Reasoning => Some(ContentBlock::reasoning(self.text.clone())),
            BlockType::ToolCall => Some(ContentBlock::ToolCall {
                id: self
                    .call_id
                    .clone()
                    .unwrap_or_else(|| CallId::new(format!("call-{}", self.index))),
                name: self.name.clone().unwrap_or_default(),
                arguments: self.arguments.clone(),
            }),
            BlockType::Image | BlockType::ToolResult => None,
        }
    }

    /// [`assemble`](Self::assemble), taking the block or text out of the partial (no copy),
    /// which is spent afterwards.
    fn take_block(&mut self) -> Option<ContentBlock> {
        if let Some(block) = self.block.take() {
            return Some(block);
        }
        match self.kind? {
            BlockType::Text => Some(ContentBlock::text(std::mem::take(&mut self.text))),
            BlockType::Reasoning => Some(ContentBlock::reasoning(std::mem::take(&mut self.text))),
            BlockType::ToolCall => Some(ContentBlock::ToolCall {
                id: self
                    .call_id
                    .take()
                    .unwrap_or_else(|| CallId::new(format!("call-{}", self.index))),
                name: self.name.take().unwrap_or_default(),
                arguments: std::mem::take(&mut self.arguments),
            }),
            BlockType::Image | BlockType::ToolResult => None,
        }
    }

    fn is_text_like(&self) -> bool {
        let kind = match &self.block {
            Some(block) => BlockType::of(block),
            None => self.kind,
        };
        matches!(kind, Some(BlockType::Text | BlockType::Reasoning))
    }
}

/// The partials of one stream, in stream order. The first is kept inline: most streams carry
/// one block, which then needs no list of its own. Partials are never removed, so `rest` holds
/// partials only after `first` does.
#[derive(Default)]
struct Partials {
    first: Option<Partial>,
    rest: Vec<Partial>,
}

impl Partials {
    fn iter(&self) -> impl DoubleEndedIterator<Item = &Partial> {
        self.first.iter().chain(&self.rest)
    }

    fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut Partial> {
        self.first.iter_mut().chain(&mut self.rest)
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// Adds a partial at the end, returning it. The list behind the first is sized for one
    /// more block at first, not for the four a growing list starts with.
    fn push(&mut self, partial: Partial) -> &mut Partial {
        if self.first.is_none() {
            return self.first.insert(partial);
        }
        if self.rest.capacity() == 0 {
            self.rest.reserve_exact(1);
        }
        self.rest.push(partial);
        self.rest.last_mut().expect("just pushed")
    }
}

/// Incrementally assembles one model stream.
///
/// Tolerant of adapters that skip `block-start`/`block-end`: a delta (or a `block-end`) for an
/// index never seen opens a block of its type. Deltas for a closed block are ignored, and the
/// first `block-end` of a block wins: a straggler addressing a closed index (a late delta, a
/// repeated `block-end`) neither changes the closed block nor adds one (a repeated tool call
/// would run twice). An index may be reused after its block closed, by a `block-start` (spec
/// §13.2: indexes are unique while open).
#[derive(Default)]
pub(crate) struct BlockAssembler {
    partials: Partials,
    usage: Option<Box<TokenUsage>>,
    finish: Option<FinishReason>,
    replay_state: Option<Box<Value>>,
}

impl BlockAssembler {
    /// The latest partial with this index (open or closed), if any. At most one partial per
    /// index is open, and it is the latest one with that index: a partial is only opened for an
    /// index whose latest partial is closed or absent.
    fn latest(&mut self, index: u32) -> Option<&mut Partial> {
        self.partials.iter_mut().rev().find(|p| p.index == index)
    }

    /// The open partial a delta for `index` adds to: the open one, or one opened with `kind`
    /// for an index never seen. `None` for a straggler (the index's block is closed).
    fn for_delta(&mut self, index: u32, kind: BlockType) -> Option<&mut Partial> {
        if !self.partials.iter().any(|p| p.index == index) {
            return Some(self.partials.push(Partial::new(index, Some(kind))));
        }
        self.latest(index).filter(|p| !p.closed)
    }

    /// Feeds one chunk, in stream order.
    pub(crate) fn push(&mut self, chunk: &StreamChunk) {
        match chunk {
            StreamChunk::BlockStart { index, block_type } => {
                if self.latest(*index).is_none_or(|p| p.closed) {
                    self.partials.push(Partial::new(*index, Some(*block_type)));
                }
            }
            StreamChunk::TextDelta { index, text } => {
                if let Some(partial) = self.for_delta(*index, BlockType::Text) {
                    append(&mut partial.text, text);
                }
            }
            StreamChunk::ReasoningDelta { index, text } => {
                if let Some(partial) = self.for_delta(*index, BlockType::Reasoning) {
                    append(&mut partial.text, text);
                }
            }
            StreamChunk::ToolCallDelta {
                index,
                id,
                name,
                arguments_delta,
            } => {
                if let Some(partial) = self.for_delta(*index, BlockType::ToolCall) {
                    partial.call_id = Some(id.clone());
                    if let Some(name) = name {
                        partial.name = Some(name.clone());
                    }
                    append(&mut partial.arguments, arguments_delta);
                }
            }
            StreamChunk::BlockEnd { index, block } => match self.latest(*index) {
                Some(partial) if !partial.closed => partial.close(block),
                // A repeated close: the first one won.
                Some(_) => {}
                None => {
                    let mut partial = Partial::new(*index, BlockType::of(block));
                    partial.block = Some(block.clone());
                    partial.closed = true;
                    self.partials.push(partial);
                }
            },
            StreamChunk::Usage { usage } => self.usage = Some(Box::new(usage.clone())),
            StreamChunk::Finish { reason, replay_state } => {
                self.finish = Some(reason.clone());
                self.replay_state = replay_state.clone();
            }
        }
    }

    /// The finish reason; `stop` when the stream ended without one.
    pub(crate) fn finish(&self) -> &FinishReason {
        static STOP: FinishReason = FinishReason::Stop;
        self.finish.as_ref().unwrap_or(&STOP)
    }

    /// Usage, when a `usage` chunk arrived (taken: the assembler keeps none).
    pub(crate) fn take_usage(&mut self) -> Option<Box<TokenUsage>> {
        self.usage.take()
    }

    /// Adapter-private replay state from the `finish` chunk (taken: the assembler keeps none).
    pub(crate) fn take_replay_state(&mut self) -> Option<Box<Value>> {
        self.replay_state.take()
    }

    /// Every block in stream order; a `max-tokens` finish drops every tool call (a truncated call
    /// is unsafe to dispatch), and so does a stream that ended without a `finish` chunk for
    /// every tool call it left open (no `block-end`): its arguments may be cut anywhere, so
    /// dispatching it could run a different call than the model meant. Tool calls the stream
    /// closed are kept (adapters may omit `finish`).
    ///
    /// The blocks are taken out of the assembler (not copied), which is spent afterwards: it
    /// is called once, when the stream is over. (Taken through a borrow, so that the
    /// assembler is not moved to be consumed.)
    pub(crate) fn take_blocks(&mut self) -> Vec<ContentBlock> {
        let truncated = matches!(self.finish, Some(FinishReason::MaxTokens));
        let unfinished = self.finish.is_none();
        // A list of its own, sized for every partial up front (usually none is dropped), filled
        // by a plain loop: an iterator chain here was not fused into one pass.
        let mut blocks = Vec::with_capacity(self.partials.len());
        for partial in self.partials.iter_mut() {
            if unfinished && !partial.closed && partial.kind == Some(BlockType::ToolCall) {
                continue;
            }
            match partial.take_block() {
                Some(ContentBlock::ToolCall { .. }) if truncated => {}
                Some(block) => blocks.push(block),
                None => {}
            }
        }
        blocks
    }

    /// The prefix an interrupted stream can finalise: closed and open text/reasoning blocks
    /// with non-blank content, in stream order. Tool calls (complete or not) are dropped: they
    /// were never dispatched.
    pub(crate) fn interrupted_blocks(&self) -> Vec<ContentBlock> {
        self.partials
            .iter()
            .filter(|p| p.is_text_like())
            .filter_map(Partial::assemble)
            .filter(|b| match b {
                ContentBlock::Text { text } | ContentBlock::Reasoning { text, .. } => !text.trim().is_empty(),
                _ => false,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::chunks;

    /// The assembled content is a list of its own, sized for the blocks: the log keeps every
    /// assistant message, so it must not keep the assembler's larger allocation with it.
    #[test]
    fn assembled_content_is_sized_for_its_blocks() {
        let mut a = BlockAssembler::default();
        for c in chunks::text("hi") {
            a.push(&c);
        }
        let blocks = a.take_blocks();
        assert_eq!(blocks, vec![ContentBlock::text("hi")]);
        assert_eq!(blocks.capacity(), 1);
    }

    /// spec: §13.2, §13.3 — a stream that ends without `finish` while a tool call is still open
    /// never yields that call (its arguments may be cut anywhere, even at a point where they
    /// parse); closed calls and text of such a stream are kept.
    #[test]
    fn drops_open_tool_calls_of_a_stream_without_finish() {
        let unfinished = || {
            let mut a = BlockAssembler::default();
            for c in chunks::text_and_tool_call("hi", "c1", "read", serde_json::json!({"path": "a"})) {
                if !matches!(c, StreamChunk::Finish { .. } | StreamChunk::Usage { .. }) {
                    a.push(&c);
                }
            }
            a.push(&StreamChunk::BlockStart {
                index: 7,
                block_type: BlockType::ToolCall,
            });
            a.push(&StreamChunk::ToolCallDelta {
                index: 7,
                id: "c2".into(),
                name: Some("rm".into()),
                arguments_delta: "{\"path\": \"/\"}".into(),
            });
            a
        };
        let blocks = unfinished().take_blocks();
        assert_eq!(blocks.len(), 2, "{blocks:?}");
        assert_eq!(blocks[0], ContentBlock::text("hi"));
        assert!(matches!(&blocks[1], ContentBlock::ToolCall { id, .. } if id.as_str() == "c1"));
        // With a finish, an unclosed call is the adapter's (tolerated) shorthand and is kept.
        let mut a = unfinished();
        a.push(&chunks::finish_chunk(FinishReason::ToolCalls));
        let blocks = a.take_blocks();
        assert_eq!(blocks.len(), 3);
        assert!(
            matches!(&blocks[2], ContentBlock::ToolCall { id, name, arguments } if id.as_str() == "c2" && name == "rm" && arguments == "{\"path\": \"/\"}"),
            "{blocks:?}"
        );
    }

    /// spec: §13.2 — the first `block-end` of a block wins: a late tool-call delta or a repeated
    /// close of a closed call adds no second call and leaves the closed one as it was, and a
    /// block made only of a `block-end` is not repeated by a second one; a `block-start` may
    /// reuse the index.
    #[test]
    fn stragglers_for_a_closed_block_are_ignored() {
        let call = |arguments: &str| ContentBlock::ToolCall {
            id: "c1".into(),
            name: "read".into(),
            arguments: arguments.into(),
        };
        let mut a = BlockAssembler::default();
        for c in chunks::tool_call("c1", "read", "{}") {
            if !matches!(c, StreamChunk::Finish { .. }) {
                a.push(&c);
            }
        }
        a.push(&StreamChunk::ToolCallDelta {
            index: 0,
            id: "c1".into(),
            name: None,
            arguments_delta: "{\"late\": 1}".into(),
        });
        a.push(&StreamChunk::BlockEnd {
            index: 0,
            block: call("{}"),
        });
        // Closed by its `block-end` alone, then closed again.
        for _ in 0..2 {
            a.push(&StreamChunk::BlockEnd {
                index: 5,
                block: ContentBlock::text("once"),
            });
        }
        a.push(&StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Text,
        });
        a.push(&StreamChunk::TextDelta {
            index: 0,
            text: "again".into(),
        });
        a.push(&chunks::finish_chunk(FinishReason::ToolCalls));
        assert_eq!(
            a.take_blocks(),
            vec![
                call("{}"),
                ContentBlock::text("once"),
                ContentBlock::text("again")
            ]
        );
    }

    #[test]
    fn assembles_closed_blocks_and_drops_calls_on_max_tokens() {
        let mut a = BlockAssembler::default();
        for c in chunks::text_and_tool_call("hi", "c1", "read", serde_json::json!({})) {
            a.push(&c);
        }
        assert_eq!(a.take_blocks().len(), 2);
        let mut a = BlockAssembler::default();
        for c in chunks::max_tokens_tool_call("c1", "read", "{\"pa") {
            a.push(&c);
        }
        assert_eq!(*a.finish(), FinishReason::MaxTokens);
        assert!(a.take_usage().is_some());
        assert!(a.take_blocks().is_empty());
    }

    #[test]
    fn interrupted_prefix_keeps_text_and_drops_half_calls() {
        let mut a = BlockAssembler::default();
        let stream = [
            StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Text,
            },
            StreamChunk::TextDelta {
                index: 0,
                text: "reading".into(),
            },
            StreamChunk::BlockEnd {
                index: 0,
                block: ContentBlock::text("reading"),
            },
            StreamChunk::BlockStart {
                index: 1,
                block_type: BlockType::ToolCall,
            },
            StreamChunk::ToolCallDelta {
                index: 1,
                id: "c1".into(),
                name: Some("read".into()),
                arguments_delta: "{\"pa".into(),
            },
            StreamChunk::BlockStart {
                index: 2,
                block_type: BlockType::Reasoning,
            },
            StreamChunk::ReasoningDelta {
                index: 2,
                text: "  ".into(),
            },
        ];
        for c in &stream {
            a.push(c);
        }
        assert_eq!(a.interrupted_blocks(), vec![ContentBlock::text("reading")]);
    }
}
