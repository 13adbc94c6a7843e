//! Structured output under odd schemas and a misbehaving model (spec `inprocess-providers.md`
//! §3.10, seam §2.10), through the seam's service with an inline provider over the shared
//! driver, on the reference runtime with a scripted model and the online invariant checker.
//! Every test ends with `Host::finish` (quiescent, invariant-clean).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent::model::{BlockType, StreamChunk};
use agent::tools::{PreExecuteDecision, ToolExecution, codes};
use agent::{AgentRuntime, CancelCause, EventData, Message, SessionEvent, Signal};
use agent_loop::model::{ScriptEntry, chunks};
use common::*;
use serde_json::{Value, json};
use subagent::capabilities::SubagentCapabilities;
use subagent::provider::SubagentStartRequest;
use subagent::run::SubagentRun;
use subagent::{StopReason, SubagentErrorCode, SubagentResult};
use subagent_inprocess::InProcessRunOptions;
use subagent_inprocess::model_text::STRUCTURED_OUTPUT_TOOL;

const CAPS: SubagentCapabilities = SubagentCapabilities::ALL;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"answer": {"type": "number"}},
        "required": ["answer"],
        "additionalProperties": false
    })
}

fn request(host: &Host, schema: Value) -> SubagentStartRequest {
    let mut r = host.request();
    r.output_schema = Some(schema);
    r
}

fn capture(id: &str, args: Value) -> ScriptEntry {
    chunks::tool_call(id, STRUCTURED_OUTPUT_TOOL, args).into()
}

/// Runs one structured child with `schema` over `script`; returns the result, the child's
/// tool results and the number of model requests. Disposes the run and finishes the host.
async fn run_structured(
    script: Vec<ScriptEntry>,
    schema: Value,
) -> (SubagentResult, Vec<(String, bool, String)>, usize) {
    let host = Host::new(script).await;
    let _p = host.register_inline("spawn", CAPS);
    let echo = global_tool(&host, counting_tool("echo", Arc::new(AtomicUsize::new(0))));
    let run = host
        .service
        .start("spawn", request(&host, schema))
        .await
        .expect("started");
    let result = run.result().await.expect("result resolves");
    let results = tool_results(&run.local_agent().unwrap());
    let requests = host.model.requests().len();
    run.dispose().await.unwrap();
    drop(echo);
    host.finish().await;
    (result, results, requests)
}

/// The error code logged for each `tool/result` of a child (None for a success).
fn result_codes(events: &[SessionEvent]) -> Vec<Option<String>> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult { error, .. } => Some(error.as_ref().map(|e| e.code.clone())),
            _ => None,
        })
        .collect()
}

/// spec: STR-29, STR-49 — odd but valid schemas (nested objects, arrays of objects, enums,
/// `oneOf`, `const`, unicode and empty property names, properties named like keywords, the
/// empty object schema, closed objects) are offered verbatim as the tool's parameters and a
/// matching value is captured as `structured`.
#[tokio::test(start_paused = true)]
async fn odd_valid_schemas_capture() {
    let cases = [
        (json!({"type": "object"}), json!({})),
        (json!({"type": "object"}), json!({"anything": [1, {"x": null}]})),
        (
            json!({"type": "object", "additionalProperties": false, "properties": {}}),
            json!({}),
        ),
        (
            json!({
                "type": "object",
                "required": ["outer"],
                "properties": {"outer": {
                    "type": "object",
                    "required": ["inner"],
                    "properties": {"inner": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": false,
                            "required": ["k"],
                            "properties": {"k": {"type": "string", "enum": ["a", "b"]}}
                        }
                    }}
                }}
            }),
            json!({"outer": {"inner": [{"k": "a"}, {"k": "b"}]}}),
        ),
        (
            json!({
                "type": "object",
                "properties": {
                    "ключ": {"type": "integer", "enum": [1, 2]},
                    "名前 ✓": {"type": "string", "const": "é"},
                    "": {"type": "null"},
                    "$ref": {"type": "string"},
                    "$defs": {"type": "boolean"},
                    "type": {"type": "string"},
                    "properties": {"oneOf": [{"type": "string"}, {"type": "number"}]},
                    "any": {"description": "any JSON"}
                },
                "required": ["ключ", "名前 ✓", "", "$ref", "type"]
            }),
            json!({"ключ": 2, "名前 ✓": "é", "": null, "$ref": "#/x", "$defs": true, "type": "t",
                   "properties": 1.5, "any": [{"deep": [null]}]}),
        ),
        (
            json!({"type": "object", "properties": {"n": {"type": "number", "enum": [0.5, 1e300]}}}),
            json!({"n": 1e300}),
        ),
        // Inside the subset but refused by JSON Schema's meta-schema (see the schema module).
        (
            json!({"type": "object", "examples": 5, "properties": {"a": {"type": "string"}}}),
            json!({"a": "x"}),
        ),
        (
            json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "a"]}),
            json!({"a": "x"}),
        ),
    ];
    for (schema, value) in cases {
        let host = Host::new(vec![capture("c1", value.clone())]).await;
        let _p = host.register_inline("spawn", CAPS);
        let run = host
            .service
            .start("spawn", request(&host, schema.clone()))
            .await
            .expect("started");
        let result = run.result().await.unwrap();
        assert_eq!(result.stop_reason, StopReason::Completed, "{schema}");
        assert_eq!(result.structured, Some(value), "{schema}");
        let offered = host.model.requests()[0]
            .tools
            .as_ref()
            .and_then(|t| t.iter().find(|t| t.name == STRUCTURED_OUTPUT_TOOL).cloned())
            .expect("the capture tool is offered");
        assert_eq!(offered.parameters, schema);
        run.dispose().await.unwrap();
        host.finish().await;
    }
}

/// spec: STR-38 — schemas outside the subset (`$ref`/`$defs`, `anyOf`, type arrays, a
/// non-object root, misplaced or unknown keywords, `required` naming an undeclared property,
/// a nested bad node) reject the start with a typed `UNSUPPORTED_SCHEMA` error: no agent, no
/// session, no model request, the parent's log untouched.
#[tokio::test(start_paused = true)]
async fn out_of_subset_schemas_reject_before_anything_starts() {
    let bad = [
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"type": "string"}}}),
        json!({"$ref": "#/$defs/root", "$defs": {"root": {"type": "object"}}}),
        json!({"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}),
        json!({"type": ["object", "null"]}),
        json!({"type": "array", "items": {"type": "string"}}),
        json!({}),
        json!({"oneOf": [{"type": "object"}, {"type": "object"}]}),
        json!({"type": "object", "required": ["missing"]}),
        json!({"type": "object", "additionalProperties": {"type": "string"}}),
        json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string", "pattern": "x"}}}}}),
        json!({"type": "object", "properties": {"a": {"type": "integer", "enum": [1.5]}}}),
        json!({"type": "object", "properties": {"a": {"type": "string", "items": {"type": "string"}}}}),
        json!({"type": "object", "$schema": "https://json-schema.org/draft/2020-12/schema"}),
        json!({"type": "object", "properties": {"a": 7}}),
        json!("object"),
    ];
    let host = Host::new(vec![]).await;
    let _p = host.register_inline("spawn", CAPS);
    let before = (host.agent_count(), host.session_count(), events_of(&host.parent));
    for schema in bad {
        let Err(err) = host.service.start("spawn", request(&host, schema.clone())).await else {
            panic!("{schema}: the start must reject");
        };
        let subagent::service::StartError::Subagent(err) = err else {
            panic!("{schema}: a schema error expected, got {err}");
        };
        assert_eq!(
            err.code(),
            SubagentErrorCode::UnsupportedSchema,
            "{schema}: {err}"
        );
        assert!(err.to_string().starts_with("unsupported JSON schema: "), "{err}");
        assert_eq!(
            (host.agent_count(), host.session_count(), events_of(&host.parent)),
            before,
            "{schema}"
        );
    }
    assert!(host.model.requests().is_empty());
    host.finish().await;
}

/// spec: STR-38 — the driver re-checks the output schema for direct callers (which skip the
/// service's check): an out-of-subset schema rejects with `UNSUPPORTED_SCHEMA` before any
/// child exists, instead of starting a child that can never capture.
#[tokio::test(start_paused = true)]
async fn direct_driver_start_rejects_an_out_of_subset_schema() {
    let host = Host::new(vec![capture("c1", json!({"answer": 1}))]).await;
    let before = (host.agent_count(), host.session_count());
    for schema in [json!({"type": "string"}), json!({"type": "object", "anyOf": []})] {
        let request = request(&host, schema.clone());
        let Err(err) = host
            .driver
            .start(resolve(request, "direct"), InProcessRunOptions::fresh())
            .await
        else {
            panic!("{schema}: the direct start must reject");
        };
        assert_eq!(
            err.code(),
            SubagentErrorCode::UnsupportedSchema,
            "{schema}: {err}"
        );
        assert_eq!((host.agent_count(), host.session_count()), before);
    }
    assert!(host.model.requests().is_empty());
    host.finish().await;
}

/// An object-rooted schema nested `depth` JSON levels deep (arrays of arrays of strings under
/// the property `deep`).
fn nested_schema(depth: usize) -> Value {
    let mut schema = json!({"type": "string"});
    for _ in 0..depth - 3 {
        schema = json!({"type": "array", "items": schema});
    }
    json!({"type": "object", "properties": {"deep": schema}})
}

/// spec: STR-38 — a schema inside the subset but nested deeper than an output schema may
/// (`MAX_OUTPUT_SCHEMA_DEPTH`: values are judged under it, and the child logs it in every
/// request header) rejects the start with `UNSUPPORTED_SCHEMA` before any child exists (through
/// the service and directly), instead of starting a child that can only end `error`.
/// A schema at the bound still starts and captures.
#[tokio::test(start_paused = true)]
async fn schema_nested_past_the_validation_bound_rejects_before_anything_starts() {
    let host = Host::new(vec![capture("c1", json!({"deep": []}))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let before = (host.agent_count(), host.session_count(), events_of(&host.parent));
    let too_deep = nested_schema(subagent::schema::MAX_OUTPUT_SCHEMA_DEPTH + 1);
    let Err(err) = host
        .service
        .start("spawn", request(&host, too_deep.clone()))
        .await
    else {
        panic!("the start must reject a schema no value can be validated under");
    };
    let subagent::service::StartError::Subagent(err) = err else {
        panic!("a schema error expected, got {err}");
    };
    assert_eq!(err.code(), SubagentErrorCode::UnsupportedSchema, "{err}");
    assert_eq!(
        err.to_string(),
        "unsupported JSON schema: schema nests deeper than 120 levels"
    );
    let Err(err) = host
        .driver
        .start(
            resolve(request(&host, too_deep), "direct"),
            InProcessRunOptions::fresh(),
        )
        .await
    else {
        panic!("the direct start must reject too");
    };
    assert_eq!(err.code(), SubagentErrorCode::UnsupportedSchema, "{err}");
    assert_eq!(
        (host.agent_count(), host.session_count(), events_of(&host.parent)),
        before
    );
    assert!(host.model.requests().is_empty());
    // At the bound the schema is usable: the child starts and its capture commits.
    let run = host
        .service
        .start(
            "spawn",
            request(&host, nested_schema(subagent::schema::MAX_OUTPUT_SCHEMA_DEPTH)),
        )
        .await
        .expect("started");
    let result = run.result().await.expect("result resolves");
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"deep": []})));
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: STR-34 — arguments that are not JSON reach the body as the raw string and fail
/// validation (`INVALID_ARGS`); the model retries in the same turn and the valid call captures.
#[tokio::test(start_paused = true)]
async fn invalid_json_arguments_are_retried_in_turn() {
    let (result, results, requests) = run_structured(
        vec![
            chunks::tool_call("c1", STRUCTURED_OUTPUT_TOOL, "{\"answer\": 1").into(),
            capture("c2", json!({"answer": 2})),
        ],
        schema(),
    )
    .await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"answer": 2})));
    assert_eq!(requests, 2);
    assert_eq!(results.len(), 2);
    assert!(results[0].1 && !results[1].1, "{results:?}");
}

/// spec: STR-34, STR-35 — a value violating the schema (wrong type, a missing required key, an
/// extra key on a closed object, unparseable JSON) is never captured; a following prose finish
/// ends the run `error` without `structured` and without a nudge.
#[tokio::test(start_paused = true)]
async fn violating_values_then_prose_end_error() {
    for bad in [
        chunks::tool_call("c1", STRUCTURED_OUTPUT_TOOL, json!({"answer": "one"})),
        chunks::tool_call("c1", STRUCTURED_OUTPUT_TOOL, json!({})),
        chunks::tool_call("c1", STRUCTURED_OUTPUT_TOOL, json!({"answer": 1, "extra": true})),
        chunks::tool_call("c1", STRUCTURED_OUTPUT_TOOL, "not json at all"),
        chunks::tool_call("c1", STRUCTURED_OUTPUT_TOOL, "[1, 2]"),
    ] {
        let (result, results, requests) =
            run_structured(vec![bad.into(), chunks::text("prose instead").into()], schema()).await;
        assert_eq!(result.stop_reason, StopReason::Error);
        assert_eq!(result.structured, None);
        assert_eq!(requests, 2);
        assert_eq!(results.len(), 1);
        assert!(results[0].1);
    }
}

/// spec: STR-29, STR-31 — two valid captures in one response: the first commits, the second is
/// denied (its value never replaces the first) and the turn ends without another request.
#[tokio::test(start_paused = true)]
async fn two_captures_in_one_step_first_wins() {
    let (result, results, requests) = run_structured(
        vec![
            chunks::tool_calls(
                None,
                vec![
                    chunks::call("c1", STRUCTURED_OUTPUT_TOOL, json!({"answer": 1})),
                    chunks::call("c2", STRUCTURED_OUTPUT_TOOL, json!({"answer": 2})),
                ],
            )
            .into(),
            chunks::text("MUST NOT BE CONSUMED").into(),
        ],
        schema(),
    )
    .await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"answer": 1})));
    assert_eq!(requests, 1);
    assert_eq!(results.len(), 2);
    assert!(!results[0].1);
    assert!(results[1].1);
    assert!(
        results[1].2.contains("structured output already recorded"),
        "{}",
        results[1].2
    );
}

/// spec: STR-34, STR-29 — an invalid and a valid capture in one response: the invalid one is an
/// `INVALID_ARGS` result, the valid one commits and concludes the turn.
#[tokio::test(start_paused = true)]
async fn invalid_then_valid_capture_in_one_step() {
    let host = Host::new(vec![
        chunks::tool_calls(
            None,
            vec![
                chunks::call("c1", STRUCTURED_OUTPUT_TOOL, json!({"answer": "x"})),
                chunks::call("c2", STRUCTURED_OUTPUT_TOOL, json!({"answer": 3})),
            ],
        )
        .into(),
        chunks::text("MUST NOT BE CONSUMED").into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let run = host
        .service
        .start("spawn", request(&host, schema()))
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"answer": 3})));
    assert_eq!(host.model.requests().len(), 1);
    let codes_logged = result_codes(&events_of(&run.local_agent().unwrap()));
    assert_eq!(codes_logged, [Some(codes::INVALID_ARGS.to_owned()), None]);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: STR-31, STR-33 — the capture between two concurrency-safe calls in one response: the
/// earlier call runs, the later one is denied without running its body.
#[tokio::test(start_paused = true)]
async fn capture_between_parallel_tools() {
    let host = Host::new(vec![
        chunks::tool_calls(
            None,
            vec![
                chunks::call("c1", "echo", json!({})),
                chunks::call("c2", STRUCTURED_OUTPUT_TOOL, json!({"answer": 4})),
                chunks::call("c3", "echo", json!({})),
            ],
        )
        .into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let ran = Arc::new(AtomicUsize::new(0));
    let echo = global_tool(&host, counting_tool("echo", ran.clone()));
    let run = host
        .service
        .start("spawn", request(&host, schema()))
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.structured, Some(json!({"answer": 4})));
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    let results = tool_results(&run.local_agent().unwrap());
    let flags: Vec<(&str, bool)> = results.iter().map(|r| (r.0.as_str(), r.1)).collect();
    assert_eq!(flags, [("c1", false), ("c2", false), ("c3", true)]);
    run.dispose().await.unwrap();
    drop(echo);
    host.finish().await;
}

/// spec: §3.10 item 5 — steering that arrives while the capture runs still gets a step, but
/// the guard denies every further call (including a second capture with another value); the
/// run stays `completed` with the first value and the steered answer as output.
#[tokio::test(start_paused = true)]
async fn steering_after_a_capture_cannot_replace_it() {
    let host = Host::new(vec![
        capture("c1", json!({"answer": 1})),
        capture("c2", json!({"answer": 2})),
        chunks::text("steered answer").into(),
    ])
    .await;
    let _p = host.register_inline("spawn", CAPS);
    let runtime = host.runtime.clone();
    let steered = Arc::new(AtomicUsize::new(0));
    let once = steered.clone();
    let steer = host.runtime.services().tools.pre_execute(
        None,
        Arc::new(move |exec: &ToolExecution, decision: PreExecuteDecision| {
            if exec.name == STRUCTURED_OUTPUT_TOOL
                && once.fetch_add(1, Ordering::SeqCst) == 0
                && let Some(child) = AgentRuntime::get(&runtime, &exec.agent)
            {
                child
                    .steer(Message::user_text("one more thing"))
                    .expect("steered");
            }
            decision
        }),
    );
    let run = host
        .service
        .start("spawn", request(&host, schema()))
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(json!({"answer": 1})));
    let results = tool_results(&run.local_agent().unwrap());
    let flags: Vec<(&str, bool)> = results.iter().map(|r| (r.0.as_str(), r.1)).collect();
    assert_eq!(flags, [("c1", false), ("c2", true)]);
    assert_eq!(text(&result.output), "steered answer");
    run.dispose().await.unwrap();
    drop(steer);
    host.finish().await;
}

/// A capture call's chunks cut after `arguments` (no block end, no finish).
fn partial_capture(arguments: &str) -> Vec<StreamChunk> {
    vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::ToolCall,
        },
        StreamChunk::ToolCallDelta {
            index: 0,
            id: "c1".into(),
            name: Some(STRUCTURED_OUTPUT_TOOL.into()),
            arguments_delta: arguments.into(),
        },
    ]
}

/// spec: §3.10 item 6, STR-35 — a stream that ends in the middle of the capture call (no
/// block end, no finish) never dispatches it, even when the arguments received so far happen
/// to parse and satisfy the schema: nothing is captured, no tool result is logged, the clean
/// capture-less finish reports `error`, and no retry request is made.
#[tokio::test(start_paused = true)]
async fn stream_ending_mid_capture_never_dispatches_it() {
    for cut in [r#"{"answer": 4"#, r#"{"answer": 4}"#] {
        let (result, results, requests) = run_structured(
            vec![
                ScriptEntry::Chunks(partial_capture(cut)),
                chunks::text("MUST NOT BE CONSUMED").into(),
            ],
            schema(),
        )
        .await;
        assert_eq!(result.stop_reason, StopReason::Error, "{cut}");
        assert_eq!(result.structured, None, "{cut}");
        assert!(results.is_empty(), "{cut}: {results:?}");
        assert_eq!(requests, 1, "{cut}");
    }
}

/// spec: §3.10 item 6 — a capture call truncated by the model's token limit is not executed:
/// the run keeps its own `max-tokens` reason and reports no value.
#[tokio::test(start_paused = true)]
async fn max_tokens_mid_capture_keeps_its_reason() {
    let (result, _, _) = run_structured(
        vec![chunks::max_tokens_tool_call("c1", STRUCTURED_OUTPUT_TOOL, r#"{"answer": 5}"#).into()],
        schema(),
    )
    .await;
    assert_eq!(result.structured, None);
    assert_eq!(result.stop_reason, StopReason::MaxTokens);
}

/// spec: §3.4, §3.10 item 6 — the request signal cancels a child whose stream hangs in the
/// middle of the capture call: `aborted`, nothing captured, the tool never ran.
#[tokio::test(start_paused = true)]
async fn cancel_mid_capture_stream_is_aborted() {
    let host = Host::new(vec![ScriptEntry::hang_after(partial_capture(r#"{"answer": 4}"#))]).await;
    let _p = host.register_inline("spawn", CAPS);
    let signal = Signal::new();
    let mut r = request_from(&host.parent, signal.clone());
    r.output_schema = Some(schema());
    let run = host.service.start("spawn", r).await.unwrap();
    while host.model.requests().is_empty() {
        tokio::task::yield_now().await;
    }
    signal.cancel(CancelCause::User);
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(result.structured, None);
    assert!(tool_results(&run.local_agent().unwrap()).is_empty());
    run.dispose().await.unwrap();
    host.finish().await;
}

/// How the misbehaving-capture sweep interrupts the run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Interrupt {
    Signal,
    DisposeRun,
}

/// One run of a child whose model first sends an invalid capture, then a valid capture and a
/// second capture (another value) in one response, interrupted after `point` yields. Returns
/// `None` when the start rejected, else the stop reason.
async fn misbehaving_capture_once(interrupt: Interrupt, point: usize) -> Option<StopReason> {
    let script = agent_loop::ScriptedModel::new(vec![
        chunks::tool_call("c1", STRUCTURED_OUTPUT_TOOL, json!({"answer": "x"})),
        chunks::tool_calls(
            None,
            vec![
                chunks::call("c2", STRUCTURED_OUTPUT_TOOL, json!({"answer": 2})),
                chunks::call("c3", STRUCTURED_OUTPUT_TOOL, json!({"answer": 3})),
            ],
        ),
    ]);
    let host = Host::trickled(&script).await;
    let signal = Signal::new();
    let mut r = request_from(&host.parent, signal.clone());
    r.output_schema = Some(schema());
    let mut start = Some(tokio::spawn(
        host.driver
            .start(resolve(r, "spawn"), InProcessRunOptions::fresh()),
    ));
    let mut run = None;
    for _ in 0..point {
        tokio::task::yield_now().await;
        if start.as_ref().is_some_and(|s| s.is_finished()) {
            run = Some(start.take().unwrap().await.unwrap().expect("published"));
        }
    }
    if interrupt == Interrupt::Signal {
        signal.cancel(CancelCause::User);
    }
    let run = match (run, start) {
        (Some(run), _) => run,
        (None, Some(start)) => match start.await.unwrap() {
            Ok(run) => run,
            Err(e) => {
                assert_eq!(interrupt, Interrupt::Signal, "point {point}: {e}");
                assert_eq!(e.code(), SubagentErrorCode::Cancelled, "point {point}: {e}");
                host.finish().await;
                return None;
            }
        },
        (None, None) => unreachable!("the start is either taken or pending"),
    };
    let dispose = (interrupt == Interrupt::DisposeRun).then(|| run.dispose());
    let result = run.result().await.expect("a published run's result resolves");
    let child = run.local_agent().unwrap();
    let results = tool_results(&child);
    let committed = results.iter().any(|(id, is_error, _)| id == "c2" && !is_error);
    match result.stop_reason {
        StopReason::Completed => assert_eq!(result.structured, Some(json!({"answer": 2})), "point {point}"),
        StopReason::Aborted => {}
        ref other => panic!("{interrupt:?} at point {point}: unexpected {other:?}"),
    }
    // A value is reported exactly when the valid capture committed, and it is never the
    // invalid one's or the second capture's.
    assert_eq!(
        result.structured.is_some(),
        committed,
        "{interrupt:?} at point {point}"
    );
    assert!(
        results.iter().all(|(id, is_error, _)| id == "c2" || *is_error),
        "{interrupt:?} at point {point}: {results:?}"
    );
    match dispose {
        Some(d) => d.await.unwrap(),
        None => run.dispose().await.unwrap(),
    }
    host.finish().await;
    Some(result.stop_reason)
}

/// spec: STR-31, STR-34, §3.4 — a model that misbehaves around the capture (an invalid
/// capture, then a valid one and a second one in the same response), cancelled by the request
/// signal or the run's disposal at every scheduling point: the start rejects cleanly or the
/// result is `completed` with exactly the valid value or `aborted`; a value is reported exactly
/// when its capture committed; the outcome is monotonic in the point; every run ends quiescent
/// and invariant-clean.
#[tokio::test(start_paused = true)]
async fn misbehaving_capture_cancelled_at_every_point() {
    for interrupt in [Interrupt::Signal, Interrupt::DisposeRun] {
        let mut outcomes = Vec::new();
        for point in 0..500 {
            let outcome = misbehaving_capture_once(interrupt, point).await;
            if outcomes.last() == Some(&Some(StopReason::Completed)) {
                assert_eq!(
                    outcome,
                    Some(StopReason::Completed),
                    "{interrupt:?} regressed at {point}"
                );
            }
            let done = outcome == Some(StopReason::Completed) && outcomes.last() == Some(&outcome);
            outcomes.push(outcome);
            if done {
                break;
            }
        }
        assert_eq!(
            outcomes.last(),
            Some(&Some(StopReason::Completed)),
            "{interrupt:?}: {outcomes:?}"
        );
        assert!(
            outcomes.contains(&Some(StopReason::Aborted)),
            "{interrupt:?}: {outcomes:?}"
        );
    }
}
