//! The model stream grammar (spec §13.2), as a stateful validator.
//!
//! A model stream is a sequence of [`StreamChunk`]s obeying these rules:
//!
//! 1. a `block-start` opens block `index`; an index is unique while its block is open (it may
//!    be reused after the block ends);
//! 2. `text-delta`, `reasoning-delta` and `tool-call-delta` address an open block of the
//!    matching type (`text`, `reasoning`, `tool-call`);
//! 3. `block-end` closes an open block, and the assembled block it carries has the block's
//!    type;
//! 4. at most one `usage`, before `finish`;
//! 5. nothing after `finish`;
//! 6. `finish` with blocks still open is allowed only for an `error` or `aborted` reason;
//! 7. every stream ends with `finish`.
//!
//! (Indexes are `u32`, so "non-negative" holds by construction.)
//!
//! [`StreamGrammar`] checks a stream chunk by chunk; [`validate_stream`] checks a whole one.

use std::collections::BTreeMap;

use crate::content::ContentBlock;
use crate::model::{BlockType, FinishReason, StreamChunk};

/// The spec's name of a block type (`text`, `tool-call`, …).
fn block_name(block_type: &BlockType) -> &'static str {
    match block_type {
        BlockType::Text => "text",
        BlockType::Reasoning => "reasoning",
        BlockType::Image => "image",
        BlockType::ToolCall => "tool-call",
        BlockType::ToolResult => "tool-result",
    }
}

/// The spec's name of a chunk type (`block-start`, `text-delta`, …).
fn chunk_name(chunk: &StreamChunk) -> &'static str {
    match chunk {
        StreamChunk::BlockStart { .. } => "block-start",
        StreamChunk::TextDelta { .. } => "text-delta",
        StreamChunk::ReasoningDelta { .. } => "reasoning-delta",
        StreamChunk::ToolCallDelta { .. } => "tool-call-delta",
        StreamChunk::BlockEnd { .. } => "block-end",
        StreamChunk::Usage { .. } => "usage",
        StreamChunk::Finish { .. } => "finish",
    }
}

/// The spec's name of an assembled block's type, or a description of an unknown one.
fn assembled_name(block: &ContentBlock) -> String {
    match BlockType::of(block) {
        Some(t) => block_name(&t).to_owned(),
        None => match block {
            ContentBlock::Other(map) => match map.get("type").and_then(|t| t.as_str()) {
                Some(kind) => format!("unknown block type `{kind}`"),
                None => "an untyped block".to_owned(),
            },
            _ => "an unknown block type".to_owned(),
        },
    }
}

/// The spec's name of a finish reason's kind.
fn finish_name(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::ToolCalls => "tool-calls",
        FinishReason::MaxTokens => "max-tokens",
        FinishReason::Aborted { .. } => "aborted",
        FinishReason::Error { .. } => "error",
        // A failure: open blocks at it are no violation, so it is never named there.
        FinishReason::Unknown { .. } => "unknown",
    }
}

/// Renders a list of open block indexes as `0, 2, 5`.
fn index_list(indexes: &[u32]) -> String {
    indexes.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// A violation of the stream grammar. Every variant names the 0-based `position` of the
/// offending chunk in the stream (for [`GrammarError::MissingFinish`], the stream length) and
/// what was expected there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrammarError {
    /// A `block-start` named an index whose block is still open.
    #[error(
        "chunk {position}: block-start reuses index {index}, whose {} block is still open; expected an index that is not open",
        block_name(.open)
    )]
    IndexStillOpen {
        /// Position of the chunk.
        position: usize,
        /// The reused index.
        index: u32,
        /// The type of the block already open there.
        open: BlockType,
    },
    /// A delta addressed an index with no open block.
    #[error(
        "chunk {position}: {chunk} addresses index {index}, which has no open block; expected an open {} block",
        block_name(.expected)
    )]
    DeltaWithoutOpenBlock {
        /// Position of the chunk.
        position: usize,
        /// The chunk type (`text-delta`, `reasoning-delta` or `tool-call-delta`).
        chunk: &'static str,
        /// The addressed index.
        index: u32,
        /// The block type the delta needs.
        expected: BlockType,
    },
    /// A delta addressed an open block of another type.
    #[error(
        "chunk {position}: {chunk} addresses index {index}, an open {} block; expected an open {} block",
        block_name(.open),
        block_name(.expected)
    )]
    DeltaTypeMismatch {
        /// Position of the chunk.
        position: usize,
        /// The chunk type (`text-delta`, `reasoning-delta` or `tool-call-delta`).
        chunk: &'static str,
        /// The addressed index.
        index: u32,
        /// The type of the open block.
        open: BlockType,
        /// The block type the delta needs.
        expected: BlockType,
    },
    /// A `block-end` named an index with no open block.
    #[error(
        "chunk {position}: block-end closes index {index}, which has no open block; expected an open index"
    )]
    EndWithoutOpenBlock {
        /// Position of the chunk.
        position: usize,
        /// The named index.
        index: u32,
    },
    /// A `block-end` carried an assembled block whose type differs from the open block's.
    #[error(
        "chunk {position}: block-end for index {index} carries {found}; expected an assembled {} block",
        block_name(.open)
    )]
    EndTypeMismatch {
        /// Position of the chunk.
        position: usize,
        /// The closed index.
        index: u32,
        /// The type of the open block.
        open: BlockType,
        /// The type of the assembled block carried (a description when it is not a known
        /// type).
        found: String,
    },
    /// A second `usage` chunk.
    #[error(
        "chunk {position}: a second usage (the first was chunk {first}); expected at most one usage per stream"
    )]
    DuplicateUsage {
        /// Position of the chunk.
        position: usize,
        /// Position of the first `usage`.
        first: usize,
    },
    /// A chunk after `finish`.
    #[error("chunk {position}: {chunk} after finish (chunk {finish}); expected the stream to end at finish")]
    AfterFinish {
        /// Position of the chunk.
        position: usize,
        /// The chunk type.
        chunk: &'static str,
        /// Position of the `finish`.
        finish: usize,
    },
    /// A `finish` other than `error`/`aborted` while blocks were open.
    #[error(
        "chunk {position}: finish `{reason}` with blocks still open at index {}; expected every block closed, or an error/aborted finish",
        index_list(.open)
    )]
    OpenBlocksAtFinish {
        /// Position of the chunk.
        position: usize,
        /// The finish reason's kind.
        reason: &'static str,
        /// The indexes still open, ascending.
        open: Vec<u32>,
    },
    /// The stream ended without `finish`.
    #[error("stream ended after {position} chunks without finish; expected a finish chunk last")]
    MissingFinish {
        /// The stream length (the position a `finish` was expected at).
        position: usize,
    },
}

impl GrammarError {
    /// The 0-based position of the offending chunk (for a missing finish, the stream length).
    pub fn position(&self) -> usize {
        match self {
            Self::IndexStillOpen { position, .. }
            | Self::DeltaWithoutOpenBlock { position, .. }
            | Self::DeltaTypeMismatch { position, .. }
            | Self::EndWithoutOpenBlock { position, .. }
            | Self::EndTypeMismatch { position, .. }
            | Self::DuplicateUsage { position, .. }
            | Self::AfterFinish { position, .. }
            | Self::OpenBlocksAtFinish { position, .. }
            | Self::MissingFinish { position } => *position,
        }
    }
}

/// A stateful validator of one model stream (spec §13.2).
///
/// Feed every chunk to [`push`](Self::push) in order, then call [`finish`](Self::finish) when
/// the stream ends. A rejected chunk is not applied and does not advance the position, so the
/// validator stays consistent, but callers normally stop at the first error.
#[derive(Clone, Debug, Default)]
pub struct StreamGrammar {
    /// Position of the next chunk.
    position: usize,
    /// Open blocks by index.
    open: BTreeMap<u32, BlockType>,
    /// Position of the `usage` chunk, once seen.
    usage: Option<usize>,
    /// Position of the `finish` chunk, once seen.
    finished: Option<usize>,
}

impl StreamGrammar {
    /// A validator at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many chunks have been accepted (the position of the next chunk).
    pub fn position(&self) -> usize {
        self.position
    }

    /// Whether a `finish` chunk has been accepted.
    pub fn is_finished(&self) -> bool {
        self.finished.is_some()
    }

    /// The blocks currently open, by ascending index.
    pub fn open_blocks(&self) -> impl Iterator<Item = (u32, BlockType)> + '_ {
        self.open.iter().map(|(i, t)| (*i, *t))
    }

    /// Checks the next chunk against the grammar and, when it conforms, applies it.
    pub fn push(&mut self, chunk: &StreamChunk) -> Result<(), GrammarError> {
        let position = self.position;
        if let Some(finish) = self.finished {
            return Err(GrammarError::AfterFinish {
                position,
                chunk: chunk_name(chunk),
                finish,
            });
        }
        match chunk {
            StreamChunk::BlockStart { index, block_type } => {
                if let Some(open) = self.open.get(index) {
                    return Err(GrammarError::IndexStillOpen {
                        position,
                        index: *index,
                        open: *open,
                    });
                }
                self.open.insert(*index, *block_type);
            }
            StreamChunk::TextDelta { index, .. } => self.check_delta(chunk, *index, BlockType::Text)?,
            StreamChunk::ReasoningDelta { index, .. } => {
                self.check_delta(chunk, *index, BlockType::Reasoning)?
            }
            StreamChunk::ToolCallDelta { index, .. } => {
                self.check_delta(chunk, *index, BlockType::ToolCall)?
            }
            StreamChunk::BlockEnd { index, block } => {
                let Some(open) = self.open.get(index).copied() else {
                    return Err(GrammarError::EndWithoutOpenBlock {
                        position,
                        index: *index,
                    });
                };
                if BlockType::of(block) != Some(open) {
                    return Err(GrammarError::EndTypeMismatch {
                        position,
                        index: *index,
                        open,
                        found: assembled_name(block),
                    });
                }
                self.open.remove(index);
            }
            StreamChunk::Usage { .. } => {
                if let Some(first) = self.usage {
                    return Err(GrammarError::DuplicateUsage { position, first });
                }
                self.usage = Some(position);
            }
            StreamChunk::Finish { reason, .. } => {
                if !self.open.is_empty() && !reason.is_failure() {
                    return Err(GrammarError::OpenBlocksAtFinish {
                        position,
                        reason: finish_name(reason),
                        open: self.open.keys().copied().collect(),
                    });
                }
                self.finished = Some(position);
            }
        }
        self.position += 1;
        Ok(())
    }

    /// Ends the stream: succeeds only when a `finish` chunk was accepted.
    pub fn finish(self) -> Result<(), GrammarError> {
        match self.finished {
            Some(_) => Ok(()),
            None => Err(GrammarError::MissingFinish {
                position: self.position,
            }),
        }
    }

    fn check_delta(&self, chunk: &StreamChunk, index: u32, expected: BlockType) -> Result<(), GrammarError> {
        match self.open.get(&index) {
            None => Err(GrammarError::DeltaWithoutOpenBlock {
                position: self.position,
                chunk: chunk_name(chunk),
                index,
                expected,
            }),
            Some(open) if *open != expected => Err(GrammarError::DeltaTypeMismatch {
                position: self.position,
                chunk: chunk_name(chunk),
                index,
                open: *open,
                expected,
            }),
            Some(_) => Ok(()),
        }
    }
}

/// Validates a whole stream: every chunk in order, then the end of the stream. Returns the
/// first violation.
pub fn validate_stream(chunks: &[StreamChunk]) -> Result<(), GrammarError> {
    let mut grammar = StreamGrammar::new();
    chunks.iter().try_for_each(|chunk| grammar.push(chunk))?;
    grammar.finish()
}
