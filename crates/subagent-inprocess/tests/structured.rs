//! Structured output through the forced child-scoped capture tool (spec
//! `inprocess-providers.md` §3.10, checklist STR-29…STR-57), through the seam's service with an
//! inline provider over the shared driver, on the reference runtime with a scripted model.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent::prompt::PromptSection;
use agent::tools::{
    PostExecuteDecision, PreExecuteDecision, RESERVED_TOOL_NAME, ToolCallRequest, ToolExecution, ToolResult,
    codes,
};
use agent::{
    AgentRef, CallId, CancelCause, ContentBlock, EventData, GenerateOptions, MessageSource, SessionEvent,
    SessionId, SessionObserver, Signal,
};
use agent_loop::model::{ScriptEntry, chunks};
use common::*;
use parking_lot::Mutex;
use serde_json::{Value, json};
use subagent::StopReason;
use subagent::capabilities::SubagentCapabilities;
use subagent::provider::SubagentStartRequest;
use subagent::run::SubagentRun;
use subagent_inprocess::model_text::{STRUCTURED_OUTPUT_INSTRUCTION, STRUCTURED_OUTPUT_TOOL};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"answer": {"type": "number"}, "note": {"type": "string"}},
        "required": ["answer"]
    })
}

const CAPS: SubagentCapabilities = SubagentCapabilities {
    output_schema: true,
    depth_limit: true,
    tool_filter: true,
    persona: true,
};

fn structured_request(host: &Host) -> SubagentStartRequest {
    let mut r = host.request();
    r.label = Some("produce the answer".into());
    r.prompt = vec![ContentBlock::text("produce the answer")];
    r.output_schema = Some(schema());
    r
}

fn capture(id: &str, args: Value) -> ScriptEntry {
    chunks::tool_call(id, STRUCTURED_OUTPUT_TOOL, args).into()
}

fn tool_names(request: &GenerateOptions) -> Vec<String> {
    request
        .tools
        .as_ref()
        .map(|t| t.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default()
}

/// Starts a structured run through the service.
async fn start(host: &Host, request: SubagentStartRequest) -> Box<dyn SubagentRun> {
    host.service.start("spawn", request).await.expect("started")
}

/// Executes one call through the host's tool pipeline for `scope`.
async fn execute(host: &Host, scope: &SessionId, call_id: &str, args: Value) -> agent::tools::ExecutedTool {
    host.runtime
        .services()
        .tools
        .execute(
            scope,
            ToolCallRequest {
                call_id: CallId::from(call_id),
                name: STRUCTURED_OUTPUT_TOOL.into(),
                arguments: args.to_string(),
            },
            Signal::new(),
        )
        .await
}

/// Blocks the first `n` capture executions in post-execute.
fn block_first_captures(host: &Host, n: usize, feedback: &'static str) -> agent::Registration {
    let left = Arc::new(AtomicUsize::new(n));
    host.runtime.services().tools.post_execute(
        None,
        Arc::new(move |exec: &ToolExecution, _: &ToolResult| {
            (exec.name == STRUCTURED_OUTPUT_TOOL
                && left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
                    .is_ok())
            .then(|| PostExecuteDecision::Block(feedback.into()))
        }),
    )
}

/// spec: STR-29 — a valid call is captured as `structured`, stop `completed`, and the tool's
/// acknowledgement value is `{recorded: true}`.
#[tokio::test(start_paused = true)]
async fn str_29_valid_call_is_captured() {
    let host = Host::new(vec![capture("c1", json!({"answer": 42, "note": "done"}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let ack = Arc::new(Mutex::new(None));
    let seen = ack.clone();
    let observer = host.runtime.services().tools.on_result(
        None,
        Arc::new(move |exec: &ToolExecution, result: &ToolResult| {
            if exec.name == STRUCTURED_OUTPUT_TOOL && !result.is_error {
                *seen.lock() = result.value.clone();
            }
        }),
    );
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"answer": 42, "note": "done"})));
    assert_eq!(*ack.lock(), Some(json!({"recorded": true})));
    run.dispose().await.unwrap();
    drop(observer);
    host.finish().await;
}

/// spec: STR-30 — a successful capture ends the turn with no extra model request.
#[tokio::test(start_paused = true)]
async fn str_30_capture_concludes_the_turn() {
    let host = Host::new(vec![
        capture("c1", json!({"answer": 1})),
        chunks::text("MUST NOT BE CONSUMED").into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let run = start(&host, structured_request(&host)).await;
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
    assert_eq!(host.model.requests().len(), 1);
    assert_eq!(host.model.remaining(), 1);
    run.dispose().await.unwrap();
    host.finish().await;
}

fn capture_then(second: &str, first_args: Value) -> ScriptEntry {
    chunks::tool_calls(
        None,
        vec![
            chunks::call("c1", STRUCTURED_OUTPUT_TOOL, first_args),
            chunks::call("c2", second, json!({})),
        ],
    )
    .into()
}

/// spec: STR-31 — calls after the capture in the same response are denied and their bodies
/// never run.
#[tokio::test(start_paused = true)]
async fn str_31_later_calls_in_the_response_are_denied() {
    let host = Host::new(vec![capture_then("side_effect", json!({"answer": 5}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let ran = Arc::new(AtomicUsize::new(0));
    let tool = global_tool(&host, counting_tool("side_effect", ran.clone()));
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"answer": 5})));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let results = tool_results(&run.local_agent().unwrap());
    let denied = results.iter().find(|r| r.0 == "c2").expect("c2 result logged");
    assert!(denied.1);
    assert!(
        denied.2.contains(
            "structured output already recorded: the run is complete, so `side_effect` is not executed"
        ),
        "{}",
        denied.2
    );
    run.dispose().await.unwrap();
    drop(tool);
    host.finish().await;
}

/// spec: STR-32 — a later-registered pre-execute policy returning "allow" cannot resurrect a
/// denied call (guards run after the whole pre-execute chain and only deny); its logged result
/// is an error.
#[tokio::test(start_paused = true)]
async fn str_32_later_allow_cannot_resurrect() {
    let host = Host::new(vec![capture_then("side_effect", json!({"answer": 5}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let ran = Arc::new(AtomicUsize::new(0));
    let tool = global_tool(&host, counting_tool("side_effect", ran.clone()));
    let run = start(&host, structured_request(&host)).await;
    let allow = host
        .runtime
        .services()
        .tools
        .pre_execute(None, Arc::new(|_: &ToolExecution, _| PreExecuteDecision::Allow));
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, Some(json!({"answer": 5})));
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    let results = tool_results(&run.local_agent().unwrap());
    assert!(results.iter().find(|r| r.0 == "c2").expect("logged").1);
    run.dispose().await.unwrap();
    drop((allow, tool));
    host.finish().await;
}

/// spec: STR-33 — calls before the capture in the same response run normally.
#[tokio::test(start_paused = true)]
async fn str_33_earlier_calls_run() {
    let host = Host::new(vec![
        chunks::tool_calls(
            None,
            vec![
                chunks::call("c1", "side_effect", json!({})),
                chunks::call("c2", STRUCTURED_OUTPUT_TOOL, json!({"answer": 6})),
            ],
        )
        .into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let ran = Arc::new(AtomicUsize::new(0));
    let tool = global_tool(&host, counting_tool("side_effect", ran.clone()));
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(result.structured, Some(json!({"answer": 6})));
    run.dispose().await.unwrap();
    drop(tool);
    host.finish().await;
}

/// spec: STR-34 — an invalid call yields an `isError` (`INVALID_ARGS`) result and the model
/// retries in the same turn (two results logged).
#[tokio::test(start_paused = true)]
async fn str_34_invalid_call_is_retried_in_turn() {
    let host = Host::new(vec![
        capture("c1", json!({"answer": "not-a-number"})),
        capture("c2", json!({"answer": 7})),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, Some(json!({"answer": 7})));
    assert_eq!(result.stop_reason, StopReason::Completed);
    let child = run.local_agent().unwrap();
    let results = tool_results(&child);
    assert_eq!(results.len(), 2);
    assert!(results[0].1 && !results[1].1);
    let codes_logged: Vec<String> = child
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult { error: Some(err), .. } => Some(err.code.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(codes_logged, [codes::INVALID_ARGS]);
    let turns = child
        .session()
        .events()
        .iter()
        .filter(|e| e.type_name() == "turn/start")
        .count();
    assert_eq!(turns, 1);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: STR-35 — a clean prose finish without a capture is `error` immediately: one request, one
/// caller user message (no nudge).
#[tokio::test(start_paused = true)]
async fn str_35_prose_finish_is_error_without_reprompt() {
    let host = Host::new(vec![
        chunks::text("here is my answer in prose").into(),
        chunks::text("MUST NOT BE CONSUMED").into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.structured, None);
    assert_eq!(host.model.requests().len(), 1);
    let child = run.local_agent().unwrap();
    let caller_messages = child
        .session()
        .events()
        .iter()
        .filter(|e| matches!(&e.data, EventData::UserMessage(m) if m.source.kind() != "plugin"))
        .count();
    assert_eq!(caller_messages, 1);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: STR-36 — an errored child (script exhausted) stays `error`.
#[tokio::test(start_paused = true)]
async fn str_36_errored_child_stays_error() {
    let host = Host::new(vec![]).await;
    let _p = host.register_inline("spawn", CAPS);
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.structured, None);
    assert_eq!(host.model.requests().len(), 1);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// Cancels `signal` when a session other than `parent` commits a `turn/end`.
struct CancelAtTurnEnd {
    parent: SessionId,
    signal: Signal,
}

impl SessionObserver for CancelAtTurnEnd {
    fn committed(&self, session: &agent::Session, event: &Arc<SessionEvent>) {
        if session.id() != &self.parent && matches!(event.data, EventData::TurnEnd { .. }) {
            self.signal.cancel(CancelCause::Other {
                reason: "cancelled at turn end".into(),
            });
        }
    }
}

/// spec: STR-37 — a cancel landing at the turn end of a clean capture-less turn reports
/// `aborted`.
#[tokio::test(start_paused = true)]
async fn str_37_cancel_at_turn_end_is_aborted() {
    let signal = Signal::new();
    let builder = agent_loop::runtime::RuntimeBuilder::new().session_observer(Arc::new(CancelAtTurnEnd {
        parent: "parent".into(),
        signal: signal.clone(),
    }));
    let host = Host::build(vec![chunks::text("prose, no capture").into()], builder, routed()).await;
    let _p = host.register_inline("spawn", CAPS);
    let mut request = structured_request(&host);
    request.signal = signal;
    let run = start(&host, request).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(result.structured, None);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: STR-38 — an out-of-subset schema rejects at start with `unsupported JSON schema`; the
/// parent is untouched and nothing is created.
#[tokio::test(start_paused = true)]
async fn str_38_out_of_subset_schema_rejects() {
    let host = Host::new(vec![]).await;
    let _p = host.register_inline("spawn", CAPS);
    let before = (host.agent_count(), host.parent.session().len());
    let mut request = structured_request(&host);
    request.output_schema = Some(json!({"type": "object", "oneOf": []}));
    let Err(err) = host.service.start("spawn", request).await else {
        panic!("the start must reject")
    };
    assert!(err.to_string().starts_with("unsupported JSON schema"), "{err}");
    assert!(host.parent.is_live());
    assert_eq!((host.agent_count(), host.parent.session().len()), before);
    host.finish().await;
}

/// spec: STR-39 — a schema carrying non-JSON annotation data rejects with `annotation must be
/// lossless JSON data`. (Rust: a `serde_json::Value` cannot hold a function; the non-lossless
/// value it can hold is negative zero.)
#[tokio::test(start_paused = true)]
async fn str_39_non_lossless_annotation_rejects() {
    let host = Host::new(vec![]).await;
    let _p = host.register_inline("spawn", CAPS);
    let mut request = structured_request(&host);
    request.output_schema = Some(json!({"type": "object", "default": -0.0}));
    let Err(err) = host.service.start("spawn", request).await else {
        panic!("the start must reject")
    };
    let text = err.to_string();
    assert!(text.starts_with("unsupported JSON schema"), "{text}");
    assert!(text.contains("annotation must be lossless JSON data"), "{text}");
    assert_eq!(host.agent_count(), 1);
    host.finish().await;
}

/// spec: STR-40 — a post-execute block on the capture logs an error result with the feedback,
/// continues the turn (a second request), and ends `error` without `structured`.
#[tokio::test(start_paused = true)]
async fn str_40_blocked_capture_continues_and_ends_error() {
    let host = Host::new(vec![
        capture("c1", json!({"answer": 7})),
        chunks::text("continues after the blocked capture").into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let block = block_first_captures(&host, usize::MAX, "capture rejected by hook");
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, None);
    assert_eq!(result.stop_reason, StopReason::Error);
    let results = tool_results(&run.local_agent().unwrap());
    assert!(results[0].1);
    assert!(
        results[0].2.contains("capture rejected by hook"),
        "{}",
        results[0].2
    );
    assert_eq!(host.model.requests().len(), 2);
    run.dispose().await.unwrap();
    drop(block);
    host.finish().await;
}

/// spec: STR-41 — a post-execute accept with replacement content still commits.
#[tokio::test(start_paused = true)]
async fn str_41_accept_with_replacement_commits() {
    let host = Host::new(vec![capture("c1", json!({"answer": 8}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let rewrite = host.runtime.services().tools.post_execute(
        None,
        Arc::new(|exec: &ToolExecution, _: &ToolResult| {
            (exec.name == STRUCTURED_OUTPUT_TOOL).then(|| PostExecuteDecision::Accept {
                content: Some(vec![ContentBlock::text("recorded (rewritten)")]),
                value: None,
            })
        }),
    );
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"answer": 8})));
    assert!(
        tool_results(&run.local_agent().unwrap())[0]
            .2
            .contains("rewritten")
    );
    run.dispose().await.unwrap();
    drop(rewrite);
    host.finish().await;
}

/// spec: STR-42 — a post-execute link registered after the child (so it sees the capture's
/// apparent success and has the last word) that blocks prevents the commit: the commit happens
/// only on the truly final result.
#[tokio::test(start_paused = true)]
async fn str_42_later_blocking_wrapper_prevents_commit() {
    let host = Host::new(vec![
        capture("c1", json!({"answer": 8})),
        chunks::text("capture was rejected").into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let seen_success = Arc::new(AtomicUsize::new(0));
    let seen = seen_success.clone();
    let run = start(&host, structured_request(&host)).await;
    let wrapper = host.runtime.services().tools.post_execute(
        None,
        Arc::new(move |exec: &ToolExecution, so_far: &ToolResult| {
            if exec.name != STRUCTURED_OUTPUT_TOOL {
                return None;
            }
            if !so_far.is_error {
                seen.fetch_add(1, Ordering::SeqCst);
            }
            Some(PostExecuteDecision::Block("rejected after downstream".into()))
        }),
    );
    let result = run.result().await.unwrap();
    assert_eq!(
        seen_success.load(Ordering::SeqCst),
        1,
        "the wrapper saw the body's success"
    );
    assert_eq!(result.structured, None);
    assert_eq!(result.stop_reason, StopReason::Error);
    let results = tool_results(&run.local_agent().unwrap());
    assert!(results.iter().find(|r| r.0 == "c1").unwrap().1);
    run.dispose().await.unwrap();
    drop(wrapper);
    host.finish().await;
}

/// spec: STR-43 — the instruction is appended to the child's system text with the rest of the
/// prompt (a deployment-persona-like section) preserved.
#[tokio::test(start_paused = true)]
async fn str_43_instruction_is_appended_to_the_system_text() {
    let host = Host::new(vec![capture("c1", json!({"answer": 1}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let section = host.runtime.services().prompt.section(
        None,
        PromptSection {
            name: "test:persona".into(),
            order: 10,
            text: "You are a counter.".into(),
            tool: None,
        },
    );
    let run = start(&host, structured_request(&host)).await;
    run.result().await.unwrap();
    let system = host.model.last_request().unwrap().system.clone().unwrap();
    assert!(system.contains("You are a counter."));
    assert!(system.ends_with(STRUCTURED_OUTPUT_INSTRUCTION));
    assert!(system.find(STRUCTURED_OUTPUT_INSTRUCTION).unwrap() > 0);
    run.dispose().await.unwrap();
    drop(section);
    host.finish().await;
}

/// spec: STR-44 — Code Mode is left out of this workspace (no `run_code` transport, no generated
/// SDK). Rust equivalent: the wire carries the capture as one native tool whose parameters are
/// the schema (never a `run_code` tool — the name is reserved), the instruction is still present,
/// and the capture commits.
#[tokio::test(start_paused = true)]
async fn str_44_no_code_mode_the_capture_is_a_native_tool() {
    let host = Host::new(vec![capture("c1", json!({"answer": 12}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, Some(json!({"answer": 12})));
    let request = host.model.requests()[0].clone();
    assert_eq!(tool_names(&request), [STRUCTURED_OUTPUT_TOOL]);
    assert!(!tool_names(&request).iter().any(|n| n == RESERVED_TOOL_NAME));
    assert!(
        request
            .system
            .as_deref()
            .unwrap()
            .contains(STRUCTURED_OUTPUT_INSTRUCTION)
    );
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: STR-45 — (Code Mode left out) Rust equivalent of "a nested capture is discarded when
/// the enclosing program fails": a capture whose body succeeded but whose authoritative final
/// result failed is discarded, and the turn continues.
#[tokio::test(start_paused = true)]
async fn str_45_capture_discarded_when_its_final_result_fails() {
    let host = Host::new(vec![
        capture("c1", json!({"answer": 12})),
        chunks::text("outer code failed").into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let block = block_first_captures(&host, 1, "program failed after capture");
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, None);
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(host.model.requests().len(), 2);
    assert!(tool_results(&run.local_agent().unwrap())[0].1);
    run.dispose().await.unwrap();
    drop(block);
    host.finish().await;
}

/// spec: STR-46 — (Code Mode left out) Rust equivalent of "a nested capture is discarded when
/// post-policy blocks the enclosing result": there is no enclosing transport, and `run_code`
/// cannot even be registered (reserved), so a capture commits only through its own successful
/// final result — a post-policy block on it discards it.
#[tokio::test(start_paused = true)]
async fn str_46_no_enclosing_transport_exists() {
    let host = Host::new(vec![
        capture("c1", json!({"answer": 12})),
        chunks::text("outer code was blocked").into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let mut reserved = counting_tool(RESERVED_TOOL_NAME, Arc::new(AtomicUsize::new(0)));
    reserved.name = RESERVED_TOOL_NAME.into();
    assert!(host.runtime.services().tools.register(None, reserved).is_err());
    let block = block_first_captures(&host, 1, "outer blocked");
    let run = start(&host, structured_request(&host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, None);
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(host.model.requests().len(), 2);
    run.dispose().await.unwrap();
    drop(block);
    host.finish().await;
}

/// spec: STR-47 — the instruction appears only in structured children's requests.
#[tokio::test(start_paused = true)]
async fn str_47_instruction_only_in_structured_requests() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        capture("c1", json!({"answer": 1})),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    host.parent_turn("hello").await;
    let parent_system = host.model.requests()[0].system.clone().unwrap_or_default();
    assert!(!parent_system.contains(STRUCTURED_OUTPUT_INSTRUCTION));
    let run = start(&host, structured_request(&host)).await;
    run.result().await.unwrap();
    let child_system = host.model.requests()[1].system.clone().unwrap();
    assert!(child_system.ends_with(STRUCTURED_OUTPUT_INSTRUCTION));
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: STR-48 — nothing is registered globally; a plain agent never sees the tool.
#[tokio::test(start_paused = true)]
async fn str_48_nothing_global() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        capture("c1", json!({"answer": 1})),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let tools = host.runtime.services().tools.clone();
    host.parent_turn("hello").await;
    assert!(tools.get(STRUCTURED_OUTPUT_TOOL, None).is_none());
    assert!(!tool_names(&host.model.requests()[0]).contains(&STRUCTURED_OUTPUT_TOOL.to_owned()));
    let run = start(&host, structured_request(&host)).await;
    // While a structured child is live, neither the global view nor the parent sees the tool.
    assert!(tools.get(STRUCTURED_OUTPUT_TOOL, None).is_none());
    assert!(
        tools
            .get(STRUCTURED_OUTPUT_TOOL, Some(host.parent.id()))
            .is_none()
    );
    assert!(
        tools
            .schemas(None)
            .iter()
            .all(|s| s.name != STRUCTURED_OUTPUT_TOOL)
    );
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: STR-49 — a structured child sees the tool with its exact schema while the plain parent
/// does not.
#[tokio::test(start_paused = true)]
async fn str_49_child_sees_its_exact_schema() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        capture("c1", json!({"answer": 42})),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    host.parent_turn("hello").await;
    assert!(!tool_names(&host.model.requests()[0]).contains(&STRUCTURED_OUTPUT_TOOL.to_owned()));
    let run = start(&host, structured_request(&host)).await;
    run.result().await.unwrap();
    let child_request = host.model.requests()[1].clone();
    let entry = child_request
        .tools
        .as_ref()
        .unwrap()
        .iter()
        .find(|t| t.name == STRUCTURED_OUTPUT_TOOL)
        .unwrap()
        .clone();
    assert_eq!(entry.parameters, schema());
    run.dispose().await.unwrap();
    host.finish().await;
}

/// Answers with whatever schema the calling child was given.
fn answer_own_schema(id: &'static str) -> ScriptEntry {
    ScriptEntry::respond(move |options: &GenerateOptions| {
        let entry = options
            .tools
            .as_ref()
            .and_then(|t| t.iter().find(|t| t.name == STRUCTURED_OUTPUT_TOOL))
            .expect("capture tool present");
        let args = if entry.parameters["properties"].get("verdict").is_some() {
            json!({"verdict": "real"})
        } else {
            json!({"answer": 1})
        };
        chunks::tool_call(id, STRUCTURED_OUTPUT_TOOL, args)
    })
}

/// spec: STR-50 — two concurrent children each see and satisfy their own schema.
#[tokio::test(start_paused = true)]
async fn str_50_concurrent_children_have_their_own_schemas() {
    let other = json!({
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": ["real", "bogus"]}},
        "required": ["verdict"]
    });
    let host = Host::new(vec![answer_own_schema("c1"), answer_own_schema("c2")]).await;
    let _p = host.register_inline("spawn", CAPS);
    let a = start(&host, structured_request(&host)).await;
    let mut second = structured_request(&host);
    second.output_schema = Some(other.clone());
    let b = start(&host, second).await;
    let (ra, rb) = futures::join!(a.result(), b.result());
    assert_eq!(ra.unwrap().structured, Some(json!({"answer": 1})));
    assert_eq!(rb.unwrap().structured, Some(json!({"verdict": "real"})));
    let schemas: Vec<Value> = host
        .model
        .requests()
        .iter()
        .map(|r| {
            r.tools
                .as_ref()
                .unwrap()
                .iter()
                .find(|t| t.name == STRUCTURED_OUTPUT_TOOL)
                .unwrap()
                .parameters
                .clone()
        })
        .collect();
    assert!(schemas.contains(&schema()) && schemas.contains(&other));
    a.dispose().await.unwrap();
    b.dispose().await.unwrap();
    host.finish().await;
}

/// spec: STR-51 — tool order is lexicographic (the capture tool before `zz_probe`) and a global
/// section at order 200 follows the order-190 instruction.
#[tokio::test(start_paused = true)]
async fn str_51_canonical_orders() {
    let host = Host::new(vec![capture("c1", json!({"answer": 7}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let tool = global_tool(&host, counting_tool("zz_probe", Arc::new(AtomicUsize::new(0))));
    let section = host.runtime.services().prompt.section(
        None,
        PromptSection {
            name: "after-band".into(),
            order: 200,
            text: "AFTER-BAND".into(),
            tool: None,
        },
    );
    let run = start(&host, structured_request(&host)).await;
    run.result().await.unwrap();
    let request = host.model.requests()[0].clone();
    let names = tool_names(&request);
    let capture_at = names.iter().position(|n| n == STRUCTURED_OUTPUT_TOOL).unwrap();
    assert!(capture_at < names.iter().position(|n| n == "zz_probe").unwrap());
    let system = request.system.clone().unwrap();
    assert!(system.find("AFTER-BAND").unwrap() > system.find(STRUCTURED_OUTPUT_INSTRUCTION).unwrap());
    run.dispose().await.unwrap();
    drop((tool, section));
    host.finish().await;
}

/// spec: STR-52 — a request with no tools omits the tools field (no empty list is
/// materialized).
#[tokio::test(start_paused = true)]
async fn str_52_no_tools_means_no_tools_field() {
    let host = Host::new(vec![chunks::text("plain").into()]).await;
    host.parent_turn("q").await;
    assert_eq!(host.model.requests()[0].tools, None);
    host.finish().await;
}

/// spec: STR-53 — registrations ride the child scope: unloading the provider mid-run does not
/// remove them; disposing the run does.
#[tokio::test(start_paused = true)]
async fn str_53_registrations_ride_the_child_scope() {
    let host = Host::new(vec![capture("c1", json!({"answer": 4}))]).await;
    let provider = host.register_inline("spawn", CAPS);
    let tools = host.runtime.services().tools.clone();
    assert!(tools.get(STRUCTURED_OUTPUT_TOOL, None).is_none());
    let run = start(&host, structured_request(&host)).await;
    drop(provider);
    assert!(host.service.list().is_empty());
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, Some(json!({"answer": 4})));
    let child_id = run.id().clone();
    assert!(tools.get(STRUCTURED_OUTPUT_TOOL, Some(&child_id)).is_some());
    run.dispose().await.unwrap();
    assert!(tools.get(STRUCTURED_OUTPUT_TOOL, Some(&child_id)).is_none());
    host.finish().await;
}

fn error_code(executed: &agent::tools::ExecutedTool) -> Option<String> {
    executed.result.error.as_ref().map(|e| e.code.clone())
}

/// spec: STR-54 — calling `structured_output` as an agent without a structured run, or with no
/// agent, is `UNKNOWN_TOOL`. (Rust: the pipeline always names a scope; "no agent" is a scope id
/// no agent owns, and the global view.)
#[tokio::test(start_paused = true)]
async fn str_54_unknown_tool_without_a_structured_run() {
    let host = Host::new(vec![]).await;
    let as_parent = execute(&host, &host.parent.id().clone(), "x", json!({"answer": 1})).await;
    assert!(as_parent.result.is_error);
    assert_eq!(error_code(&as_parent).as_deref(), Some(codes::UNKNOWN_TOOL));
    let as_nobody = execute(&host, &SessionId::from("nobody"), "x", json!({"answer": 1})).await;
    assert!(as_nobody.result.is_error);
    assert_eq!(error_code(&as_nobody).as_deref(), Some(codes::UNKNOWN_TOOL));
    assert!(
        host.runtime
            .services()
            .tools
            .get(STRUCTURED_OUTPUT_TOOL, None)
            .is_none()
    );
    host.finish().await;
}

async fn blocked_run(host: &Host) -> (Box<dyn SubagentRun>, AgentRef) {
    let run = start(host, structured_request(host)).await;
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.structured, None);
    let child = run.local_agent().unwrap();
    (run, child)
}

/// spec: STR-55 — a blocked stage is discarded and never promoted by a later invalid call; a
/// later valid call still captures its own value.
#[tokio::test(start_paused = true)]
async fn str_55_blocked_stage_is_never_promoted() {
    let host = Host::new(vec![capture("c1", json!({"answer": 1}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let block = block_first_captures(&host, 1, "rejected");
    let (run, child) = blocked_run(&host).await;
    let invalid = execute(&host, child.id(), "c2", json!({"answer": "not-a-number"})).await;
    assert!(invalid.result.is_error);
    // Nothing was committed: a further call is not denied by the guard…
    let valid = execute(&host, child.id(), "c3", json!({"answer": 9})).await;
    assert!(!valid.result.is_error, "{:?}", valid.result);
    // …and now the run is complete: later calls are.
    let after = execute(&host, child.id(), "c4", json!({"answer": 10})).await;
    assert!(after.result.is_error);
    assert!(after.result.content.iter().any(|b| {
        b.as_text()
            .is_some_and(|t| t.contains("structured output already recorded"))
    }));
    run.dispose().await.unwrap();
    drop(block);
    host.finish().await;
}

/// spec: STR-56 — reusing a failed execution's call id never promotes its discarded stage.
#[tokio::test(start_paused = true)]
async fn str_56_reused_call_id_never_promotes() {
    let host = Host::new(vec![capture("c1", json!({"answer": 1}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let block = block_first_captures(&host, 1, "rejected");
    let (run, child) = blocked_run(&host).await;
    let reused = execute(&host, child.id(), "c1", json!({"answer": "not-a-number"})).await;
    assert!(reused.result.is_error);
    let valid = execute(&host, child.id(), "c1", json!({"answer": 5})).await;
    assert!(!valid.result.is_error);
    run.dispose().await.unwrap();
    drop(block);
    host.finish().await;
}

/// spec: STR-57 — a pre-execute deny reusing a call id cannot promote another execution's stage.
#[tokio::test(start_paused = true)]
async fn str_57_denied_call_cannot_promote() {
    let host = Host::new(vec![capture("c1", json!({"answer": 1}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let block = block_first_captures(&host, 1, "rejected");
    let (run, child) = blocked_run(&host).await;
    let deny = host.runtime.services().tools.pre_execute(
        None,
        Arc::new(|exec: &ToolExecution, decision| {
            if exec.name == STRUCTURED_OUTPUT_TOOL {
                PreExecuteDecision::Deny("outer veto".into())
            } else {
                decision
            }
        }),
    );
    let denied = execute(&host, child.id(), "c1", json!({"answer": 2})).await;
    assert!(denied.result.is_error);
    drop(deny);
    let valid = execute(&host, child.id(), "c1", json!({"answer": 5})).await;
    assert!(!valid.result.is_error);
    run.dispose().await.unwrap();
    drop(block);
    let _ = MessageSource::User;
    host.finish().await;
}
