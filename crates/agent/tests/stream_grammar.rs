//! The model stream grammar (spec §13.2): one test per rule, plus accepted shapes.

use agent::content::ContentBlock;
use agent::model::{BlockType, FinishReason, LlmFailure, StreamChunk, TokenUsage};
use agent::{GrammarError, StreamGrammar, validate_stream};

fn start(index: u32, block_type: BlockType) -> StreamChunk {
    StreamChunk::BlockStart { index, block_type }
}

fn text(index: u32, t: &str) -> StreamChunk {
    StreamChunk::TextDelta {
        index,
        text: t.into(),
    }
}

fn reasoning(index: u32, t: &str) -> StreamChunk {
    StreamChunk::ReasoningDelta {
        index,
        text: t.into(),
    }
}

fn call_delta(index: u32, args: &str) -> StreamChunk {
    StreamChunk::ToolCallDelta {
        index,
        id: "c1".into(),
        name: Some("read".into()),
        arguments_delta: args.into(),
    }
}

fn end(index: u32, block: ContentBlock) -> StreamChunk {
    StreamChunk::BlockEnd { index, block }
}

fn usage() -> StreamChunk {
    StreamChunk::Usage {
        usage: TokenUsage::default(),
    }
}

fn finish(reason: FinishReason) -> StreamChunk {
    StreamChunk::Finish {
        reason,
        replay_state: None,
    }
}

fn stop() -> StreamChunk {
    finish(FinishReason::Stop)
}

fn error() -> FinishReason {
    FinishReason::Error {
        failure: LlmFailure::unknown("boom"),
    }
}

fn aborted() -> FinishReason {
    FinishReason::Aborted {
        failure: LlmFailure::new("ABORTED", "stopped"),
    }
}

#[test]
fn well_formed_streams_are_accepted() {
    let streams = [
        vec![stop()],
        vec![
            start(0, BlockType::Reasoning),
            reasoning(0, "hm"),
            end(0, ContentBlock::reasoning("hm")),
            start(1, BlockType::Text),
            text(1, "he"),
            text(1, "llo"),
            end(1, ContentBlock::text("hello")),
            start(2, BlockType::ToolCall),
            call_delta(2, "{"),
            call_delta(2, "}"),
            end(2, ContentBlock::tool_call("c1", "read", "{}")),
            usage(),
            finish(FinishReason::ToolCalls),
        ],
        // Interleaved blocks, an index reused after its block closed, usage before blocks.
        vec![
            usage(),
            start(0, BlockType::Text),
            start(1, BlockType::Reasoning),
            text(0, "a"),
            reasoning(1, "b"),
            end(1, ContentBlock::reasoning("b")),
            end(0, ContentBlock::text("a")),
            start(0, BlockType::Text),
            end(0, ContentBlock::text("")),
            finish(FinishReason::MaxTokens),
        ],
        // Open blocks at an error or aborted finish.
        vec![start(0, BlockType::Text), text(0, "part"), finish(error())],
        vec![
            start(3, BlockType::ToolCall),
            call_delta(3, "{"),
            finish(aborted()),
        ],
    ];
    for stream in streams {
        assert_eq!(validate_stream(&stream), Ok(()), "{stream:?}");
    }
}

#[test]
fn block_indexes_are_unique_while_open() {
    let err =
        validate_stream(&[start(0, BlockType::Text), start(0, BlockType::Reasoning), stop()]).unwrap_err();
    assert_eq!(
        err,
        GrammarError::IndexStillOpen {
            position: 1,
            index: 0,
            open: BlockType::Text
        }
    );
    assert_eq!(
        err.to_string(),
        "chunk 1: block-start reuses index 0, whose text block is still open; expected an index that is not open"
    );
}

#[test]
fn deltas_address_an_open_block() {
    let err = validate_stream(&[text(4, "x"), stop()]).unwrap_err();
    assert_eq!(
        err,
        GrammarError::DeltaWithoutOpenBlock {
            position: 0,
            chunk: "text-delta",
            index: 4,
            expected: BlockType::Text
        }
    );
    assert_eq!(
        err.to_string(),
        "chunk 0: text-delta addresses index 4, which has no open block; expected an open text block"
    );
    // A closed block is no longer open.
    let err = validate_stream(&[
        start(0, BlockType::Reasoning),
        end(0, ContentBlock::reasoning("")),
        reasoning(0, "late"),
        stop(),
    ])
    .unwrap_err();
    assert!(matches!(
        err,
        GrammarError::DeltaWithoutOpenBlock {
            position: 2,
            chunk: "reasoning-delta",
            ..
        }
    ));
}

#[test]
fn deltas_address_a_block_of_the_matching_type() {
    for (delta, open, expected, name) in [
        (text(0, "x"), BlockType::Reasoning, BlockType::Text, "text-delta"),
        (
            reasoning(0, "x"),
            BlockType::Text,
            BlockType::Reasoning,
            "reasoning-delta",
        ),
        (
            call_delta(0, "{"),
            BlockType::Text,
            BlockType::ToolCall,
            "tool-call-delta",
        ),
        (text(0, "x"), BlockType::Image, BlockType::Text, "text-delta"),
    ] {
        let err = validate_stream(&[start(0, open), delta, stop()]).unwrap_err();
        assert_eq!(
            err,
            GrammarError::DeltaTypeMismatch {
                position: 1,
                chunk: name,
                index: 0,
                open,
                expected
            }
        );
    }
    let err = validate_stream(&[start(0, BlockType::ToolCall), text(0, "x")]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "chunk 1: text-delta addresses index 0, an open tool-call block; expected an open text block"
    );
}

#[test]
fn block_end_closes_an_open_block() {
    let err = validate_stream(&[end(0, ContentBlock::text("x")), stop()]).unwrap_err();
    assert_eq!(
        err,
        GrammarError::EndWithoutOpenBlock {
            position: 0,
            index: 0
        }
    );
    // Closing twice.
    let err = validate_stream(&[
        start(1, BlockType::Text),
        end(1, ContentBlock::text("x")),
        end(1, ContentBlock::text("x")),
        stop(),
    ])
    .unwrap_err();
    assert_eq!(
        err,
        GrammarError::EndWithoutOpenBlock {
            position: 2,
            index: 1
        }
    );
    assert_eq!(
        err.to_string(),
        "chunk 2: block-end closes index 1, which has no open block; expected an open index"
    );
}

#[test]
fn block_end_carries_a_block_of_the_same_type() {
    let err = validate_stream(&[
        start(0, BlockType::Text),
        end(0, ContentBlock::reasoning("x")),
        stop(),
    ])
    .unwrap_err();
    assert_eq!(
        err,
        GrammarError::EndTypeMismatch {
            position: 1,
            index: 0,
            open: BlockType::Text,
            found: "reasoning".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "chunk 1: block-end for index 0 carries reasoning; expected an assembled text block"
    );
    let unknown: ContentBlock = serde_json::from_value(serde_json::json!({"type": "audio"})).unwrap();
    let err = validate_stream(&[start(0, BlockType::Image), end(0, unknown), stop()]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "chunk 1: block-end for index 0 carries unknown block type `audio`; expected an assembled image block"
    );
}

#[test]
fn at_most_one_usage() {
    let err = validate_stream(&[usage(), usage(), stop()]).unwrap_err();
    assert_eq!(
        err,
        GrammarError::DuplicateUsage {
            position: 1,
            first: 0
        }
    );
    assert_eq!(
        err.to_string(),
        "chunk 1: a second usage (the first was chunk 0); expected at most one usage per stream"
    );
}

#[test]
fn usage_comes_before_finish_and_nothing_follows_finish() {
    let err = validate_stream(&[stop(), usage()]).unwrap_err();
    assert_eq!(
        err,
        GrammarError::AfterFinish {
            position: 1,
            chunk: "usage",
            finish: 0
        }
    );
    for late in [start(0, BlockType::Text), text(0, "x"), stop()] {
        let err = validate_stream(&[stop(), late]).unwrap_err();
        assert!(
            matches!(err, GrammarError::AfterFinish { position: 1, .. }),
            "{err}"
        );
    }
    let err = validate_stream(&[stop(), stop()]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "chunk 1: finish after finish (chunk 0); expected the stream to end at finish"
    );
}

#[test]
fn finish_with_open_blocks_is_allowed_only_for_error_or_aborted() {
    for reason in [
        FinishReason::Stop,
        FinishReason::ToolCalls,
        FinishReason::MaxTokens,
    ] {
        let err = validate_stream(&[
            start(2, BlockType::Text),
            start(0, BlockType::ToolCall),
            finish(reason),
        ])
        .unwrap_err();
        assert!(
            matches!(&err, GrammarError::OpenBlocksAtFinish { position: 2, open, .. } if open == &[0, 2]),
            "{err:?}"
        );
    }
    let err = validate_stream(&[start(0, BlockType::Text), stop()]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "chunk 1: finish `stop` with blocks still open at index 0; expected every block closed, or an error/aborted finish"
    );
}

#[test]
fn every_stream_ends_with_finish() {
    assert_eq!(
        validate_stream(&[]),
        Err(GrammarError::MissingFinish { position: 0 })
    );
    let err = validate_stream(&[start(0, BlockType::Text), end(0, ContentBlock::text(""))]).unwrap_err();
    assert_eq!(err, GrammarError::MissingFinish { position: 2 });
    assert_eq!(
        err.to_string(),
        "stream ended after 2 chunks without finish; expected a finish chunk last"
    );
}

#[test]
fn the_validator_is_incremental_and_a_rejected_chunk_changes_nothing() {
    let mut grammar = StreamGrammar::new();
    grammar.push(&start(0, BlockType::Text)).unwrap();
    grammar.push(&text(0, "a")).unwrap();
    assert_eq!(grammar.position(), 2);
    assert_eq!(grammar.open_blocks().collect::<Vec<_>>(), [(0, BlockType::Text)]);
    let err = grammar.push(&reasoning(0, "b")).unwrap_err();
    assert_eq!(err.position(), 2);
    assert_eq!(grammar.position(), 2);
    grammar.push(&end(0, ContentBlock::text("a"))).unwrap();
    assert!(!grammar.is_finished());
    grammar.push(&stop()).unwrap();
    assert!(grammar.is_finished());
    assert_eq!(grammar.finish(), Ok(()));
}
