//! The scripted model adapter (spec §13.4).

use std::sync::Arc;
use std::time::Duration;

use agent::stream_grammar::validate_stream;
use agent::{
    CancelCause, ContentBlock, FinishReason, GenerateOptions, LlmFailure, Message, ModelAdapter, Signal,
    StreamChunk,
};
use agent_loop::model::chunks::{self, SCRIPTED_USAGE, call};
use agent_loop::{ScriptEntry, ScriptedModel};
use futures::StreamExt as _;
use serde_json::json;

fn request(text: &str) -> Arc<GenerateOptions> {
    Arc::new(GenerateOptions::new(
        "scripted",
        "m",
        vec![Message::user_text(text)],
    ))
}

fn request_with(signal: Signal) -> Arc<GenerateOptions> {
    let mut r = GenerateOptions::new("scripted", "m", vec![Message::user_text("x")]);
    r.signal = signal;
    Arc::new(r)
}

async fn collect(model: &ScriptedModel, req: Arc<GenerateOptions>) -> Vec<Result<StreamChunk, LlmFailure>> {
    model.stream(req).collect().await
}

fn ok(items: Vec<Result<StreamChunk, LlmFailure>>) -> Vec<StreamChunk> {
    items.into_iter().map(|c| c.expect("no adapter error")).collect()
}

fn finish_of(chunks: &[StreamChunk]) -> &FinishReason {
    match chunks.last() {
        Some(StreamChunk::Finish { reason, .. }) => reason,
        other => panic!("stream must end with finish, got {other:?}"),
    }
}

fn assembled(chunks: &[StreamChunk]) -> Vec<ContentBlock> {
    chunks
        .iter()
        .filter_map(|c| match c {
            StreamChunk::BlockEnd { block, .. } => Some(block.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn every_helper_obeys_the_stream_grammar() {
    let failure = LlmFailure::new("HTTP_500", "boom");
    let lists = [
        chunks::text("hello"),
        chunks::text(""),
        chunks::reasoning_then_text("think", "say"),
        chunks::max_tokens_text("cut"),
        chunks::tool_call("c1", "read", json!({"path": "a"})),
        chunks::text_and_tool_call("let me look", "c1", "read", "{}"),
        chunks::tool_calls(
            Some("two"),
            vec![call("a", "x", "{}"), call("b", "y", json!([1]))],
        ),
        chunks::tool_calls(None, vec![call("a", "x", "not json")]),
        chunks::max_tokens_tool_call("c1", "read", "{\"pa"),
        chunks::empty(),
        chunks::error(failure.clone()),
        chunks::aborted(failure),
    ];
    for list in &lists {
        validate_stream(list).unwrap_or_else(|e| panic!("{e}: {list:?}"));
    }
}

#[test]
fn helpers_assemble_the_expected_blocks_and_finishes() {
    let t = chunks::text("hello");
    assert_eq!(assembled(&t), vec![ContentBlock::text("hello")]);
    assert_eq!(finish_of(&t), &FinishReason::Stop);
    assert!(t.contains(&StreamChunk::Usage {
        usage: SCRIPTED_USAGE
    }));

    let m = chunks::max_tokens_text("cut");
    assert_eq!(finish_of(&m), &FinishReason::MaxTokens);

    let calls = chunks::tool_calls(
        Some("two"),
        vec![call("a", "x", "{}"), call("b", "y", json!({"k": 1}))],
    );
    assert_eq!(
        assembled(&calls),
        vec![
            ContentBlock::text("two"),
            ContentBlock::tool_call("a", "x", "{}"),
            ContentBlock::tool_call("b", "y", "{\"k\":1}"),
        ]
    );
    assert_eq!(finish_of(&calls), &FinishReason::ToolCalls);

    let single = chunks::tool_call("c1", "read", "{}");
    assert_eq!(
        assembled(&single),
        vec![ContentBlock::tool_call("c1", "read", "{}")]
    );

    let truncated = chunks::max_tokens_tool_call("c1", "read", "{\"pa");
    assert_eq!(finish_of(&truncated), &FinishReason::MaxTokens);
    assert_eq!(
        assembled(&truncated),
        vec![ContentBlock::tool_call("c1", "read", "{\"pa")]
    );

    assert!(assembled(&chunks::empty()).is_empty());
    assert_eq!(finish_of(&chunks::empty()), &FinishReason::Stop);
}

#[tokio::test]
async fn entries_are_consumed_in_order_and_every_request_is_recorded() {
    let model = ScriptedModel::new([chunks::text("one"), chunks::text("two")]);
    assert_eq!(model.remaining(), 2);
    let (r1, r2) = (request("a"), request("b"));
    let first = ok(collect(&model, r1.clone()).await);
    let second = ok(collect(&model, r2.clone()).await);
    assert_eq!(assembled(&first), vec![ContentBlock::text("one")]);
    assert_eq!(assembled(&second), vec![ContentBlock::text("two")]);
    let seen = model.requests();
    assert_eq!(seen.len(), 2);
    assert!(Arc::ptr_eq(&seen[0], &r1) && Arc::ptr_eq(&seen[1], &r2));
    assert!(Arc::ptr_eq(&model.last_request().unwrap(), &r2));
    assert_eq!(model.remaining(), 0);
}

#[tokio::test]
async fn an_exhausted_script_is_an_adapter_error_and_still_records_the_request() {
    let model = ScriptedModel::new(Vec::<ScriptEntry>::new());
    let out = collect(&model, request("a")).await;
    assert_eq!(out, vec![Err(LlmFailure::unknown("script exhausted"))]);
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn clones_share_the_script_and_the_record() {
    let model = ScriptedModel::default();
    let adapter: Arc<dyn ModelAdapter> = model.adapter();
    model.push(chunks::text("late"));
    model.push(ScriptEntry::fail(LlmFailure::new("RATE_LIMITED", "slow down")));
    let out: Vec<_> = adapter.stream(request("a")).collect().await;
    assert_eq!(assembled(&ok(out)), vec![ContentBlock::text("late")]);
    let out: Vec<_> = adapter.stream(request("b")).collect().await;
    assert_eq!(out, vec![Err(LlmFailure::new("RATE_LIMITED", "slow down"))]);
    assert_eq!(model.requests().len(), 2);
}

#[tokio::test]
async fn a_responder_sees_the_request() {
    let model = ScriptedModel::new([ScriptEntry::respond(|req| {
        let n = req.messages.len();
        chunks::text(format!("{} said {}", n, req.messages[0].text()))
    })]);
    let out = ok(collect(&model, request("hi")).await);
    assert_eq!(assembled(&out), vec![ContentBlock::text("1 said hi")]);
}

#[tokio::test(start_paused = true)]
async fn hang_streams_a_partial_text_then_waits_for_cancellation() {
    let model = ScriptedModel::new([ScriptEntry::hang()]);
    let signal = Signal::new();
    let mut stream = model.stream(request_with(signal.clone()));
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(stream.next().await.unwrap().unwrap());
    }
    assert!(matches!(seen[1], StreamChunk::TextDelta { index: 0, ref text } if text == "partial"));
    // Nothing more until the signal fires, however long we wait.
    assert!(
        tokio::time::timeout(Duration::from_secs(3600), stream.next())
            .await
            .is_err()
    );
    signal.cancel(CancelCause::User);
    seen.push(stream.next().await.unwrap().unwrap());
    assert!(stream.next().await.is_none());
    assert_eq!(
        finish_of(&seen),
        &FinishReason::Aborted {
            failure: LlmFailure::new("ABORTED", "user")
        }
    );
    validate_stream(&seen).expect("an aborted finish may leave the block open");
}

#[tokio::test(start_paused = true)]
async fn hang_slow_notices_cancellation_fifty_milliseconds_late() {
    let model = ScriptedModel::new([ScriptEntry::hang_slow()]);
    let signal = Signal::new();
    let mut stream = model.stream(request_with(signal.clone()));
    stream.next().await.unwrap().unwrap();
    stream.next().await.unwrap().unwrap();
    signal.cancel(CancelCause::Hook {
        reason: "stop".into(),
    });
    let cancelled_at = tokio::time::Instant::now();
    let finish = stream.next().await.unwrap().unwrap();
    assert_eq!(cancelled_at.elapsed(), Duration::from_millis(50));
    assert_eq!(
        finish,
        chunks::finish_chunk(FinishReason::Aborted {
            failure: LlmFailure::new("ABORTED", "hook: stop")
        })
    );
}

#[tokio::test(start_paused = true)]
async fn hang_after_emits_custom_chunks_first() {
    let custom = vec![
        StreamChunk::BlockStart {
            index: 3,
            block_type: agent::model::BlockType::ToolCall,
        },
        StreamChunk::ToolCallDelta {
            index: 3,
            id: "c".into(),
            name: Some("read".into()),
            arguments_delta: "{\"pa".into(),
        },
    ];
    let model = ScriptedModel::new([ScriptEntry::hang_after(custom.clone())]);
    let signal = Signal::cancelled_with(CancelCause::Parent);
    let out = ok(collect(&model, request_with(signal)).await);
    assert_eq!(&out[..2], &custom[..]);
    assert_eq!(
        finish_of(&out),
        &FinishReason::Aborted {
            failure: LlmFailure::new("ABORTED", "parent")
        }
    );
    validate_stream(&out).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_dropped_hanging_stream_leaves_nothing_behind() {
    let model = ScriptedModel::new([ScriptEntry::hang(), chunks::text("next").into()]);
    let mut stream = model.stream(request("a"));
    stream.next().await.unwrap().unwrap();
    drop(stream);
    let out = ok(collect(&model, request("b")).await);
    assert_eq!(assembled(&out), vec![ContentBlock::text("next")]);
}

#[tokio::test]
async fn in_band_failures_are_finishes_not_errors() {
    let failure = LlmFailure::new("ABORTED", "provider gave up");
    let model = ScriptedModel::new([chunks::aborted(failure.clone())]);
    let out = ok(collect(&model, request("a")).await);
    assert_eq!(out, vec![chunks::finish_chunk(FinishReason::Aborted { failure })]);
}
