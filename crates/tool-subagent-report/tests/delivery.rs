//! The `report` tool end to end on a real host (`acp-and-tools.md` §5.1–§5.5, checklist
//! REP-*): who gets the tool, how a report reaches the direct parent, and how it is refused.
//! Calls are made as the child through the host's tool registry, or by the child's own model.

mod common;

use agent::tools::ToolDefinition;
use agent::{AgentStatus, ContentBlock, InboxTarget, Message, Signal};
use agent_loop::model::{ScriptEntry, chunks};
use common::*;
use serde_json::json;
use subagent::SubagentErrorCode;
use subagent::composition::ToolFilter;
use subagent::continuation::ReportDelivery;
use tool_subagent_report::{ReportToolConfig, model_text};

fn quiet() -> Option<ReportToolConfig> {
    Some(ReportToolConfig::new(ReportDelivery::Quiet))
}

fn next_step() -> Option<ReportToolConfig> {
    Some(ReportToolConfig::new(ReportDelivery::NextStep))
}

/// The heading the parent's message starts with.
fn heading(child: &str) -> String {
    format!("Background subagent {child} reported:")
}

/// A model turn that calls `report` with `output`.
fn reporting(call: &str, output: &str) -> ScriptEntry {
    chunks::tool_call(call, "report", json!({"output": output})).into()
}

/// Keeps the parent in a model request (busy) until released.
async fn busy_parent(rig: &Rig) {
    rig.models.hold(PARENT);
    rig.parent()
        .followup(Message::user_text("parent work"))
        .expect("the parent takes work");
    rig.until("the parent is in a model request", || {
        rig.models.requests(PARENT).len() == 1
    })
    .await;
}

/// spec: REP-1 — `report` is absent from the global view and the root's, and present exactly
/// once in a continuable child, with exactly the parameter `output` (required).
#[tokio::test(start_paused = true)]
async fn rep_1_report_exists_only_in_continuable_children() {
    let mut rig = Rig::new(quiet()).await;
    assert!(!rig.tool_names(None).contains(&"report".to_owned()));
    assert!(!rig.tool_names(Some(PARENT)).contains(&"report".to_owned()));
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    let schemas: Vec<_> = rig
        .rt
        .services()
        .tools
        .schemas(Some(&"child".into()))
        .into_iter()
        .filter(|s| s.name == "report")
        .collect();
    assert_eq!(schemas.len(), 1);
    let properties = schemas[0].parameters["properties"]
        .as_object()
        .expect("properties");
    assert_eq!(properties.keys().collect::<Vec<_>>(), ["output"]);
    assert_eq!(schemas[0].parameters["required"], json!(["output"]));
    assert_eq!(schemas[0].description, model_text::TOOL_DESCRIPTION);
    // An agent that is not a continuable child (a root; one-shot children are plain agents of
    // the same kind) never gets it.
    rig.root("other-root").await;
    assert!(!rig.tool_names(Some("other-root")).contains(&"report".to_owned()));
    assert!(!rig.tool_names(None).contains(&"report".to_owned()));
    rig.finish().await;
}

/// spec: REP-2 — without the package a continuable child has no `report`, and calling it fails.
#[tokio::test(start_paused = true)]
async fn rep_2_without_the_package_a_child_has_no_report() {
    let rig = Rig::new(None).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    assert!(!rig.tool_names(Some("child")).contains(&"report".to_owned()));
    let result = rig.report("child", "missing").await;
    assert!(result.is_error, "{}", text(&result));
    assert!(reports(rig.parent()).is_empty());
    rig.finish().await;
}

/// spec: REP-3 — the package registers no global tool and no parent control: a `send_message`
/// registered globally (standing in for the control package, which this workspace ships
/// separately) is the only global tool, and a child created with `toolFilter: {allow: []}` still
/// has `report` — a scope-local registration the filter does not touch — but not
/// `send_message`.
#[tokio::test(start_paused = true)]
async fn rep_3_report_survives_an_empty_allow_list_and_implies_no_parent_controls() {
    let rig = Rig::new(next_step()).await;
    assert!(rig.tool_names(None).is_empty(), "{:?}", rig.tool_names(None));
    assert!(rig.sections(None).is_empty());
    let control = rig
        .rt
        .services()
        .tools
        .register(
            None,
            ToolDefinition {
                name: "send_message".to_owned(),
                description: "stand-in for the parent-side control".to_owned(),
                parameters: json!({"type": "object", "properties": {}}),
                concurrency_safe: true,
                handler: std::sync::Arc::new(Unused),
            },
        )
        .expect("registers");
    assert_eq!(rig.tool_names(None), ["send_message"]);
    rig.models.hold("restricted");
    let mut spec = rig.spec(rig.parent(), "restricted", "restricted child");
    spec.tool_filter = Some(ToolFilter {
        allow: Some(vec![]),
        deny: None,
    });
    rig.start_spec(spec).await;
    let names = rig.tool_names(Some("restricted"));
    assert!(names.contains(&"report".to_owned()), "{names:?}");
    assert!(!names.contains(&"send_message".to_owned()), "{names:?}");
    assert!(
        rig.section_names(Some("restricted"))
            .contains(&"tool:report".to_owned())
    );
    drop(control);
    rig.finish().await;
}

/// A tool body that is never called.
struct Unused;

#[async_trait::async_trait]
impl agent::tools::ToolHandler for Unused {
    async fn execute(
        &self,
        _: serde_json::Value,
        _: agent::tools::ToolContext,
    ) -> Result<agent::tools::ToolOutput, agent::tools::ToolError> {
        Err(agent::tools::ToolError::failed("unused"))
    }
}

/// spec: REP-4 — quiet delivery: the parent's message is `Background subagent <child>
/// reported:` then the exact output, its sender is the child, its id is the one returned and
/// rendered, it is inserted into the next-step lane, and the idle parent stays idle with no new
/// model request.
#[tokio::test(start_paused = true)]
async fn rep_4_quiet_delivery_does_not_wake_the_parent() {
    let rig = Rig::new(quiet()).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    let result = rig.report("child", "CHILD_FINDING").await;
    assert!(!result.is_error, "{}", text(&result));
    let message_id = result.value.as_ref().expect("a value")["messageId"]
        .as_str()
        .expect("messageId")
        .to_owned();
    assert_eq!(text(&result), model_text::report_accepted(&message_id));
    assert_eq!(
        reports(rig.parent()),
        [Report {
            id: message_id,
            texts: vec![heading("child"), "CHILD_FINDING".to_owned()],
            sender: "child".to_owned(),
        }]
    );
    assert_eq!(
        reports(rig.parent())[0].texts.join("\n"),
        "Background subagent child reported:\nCHILD_FINDING"
    );
    assert_eq!(
        insertions(rig.parent()),
        [(InboxTarget::NextStep, "subagent-report".to_owned())]
    );
    assert_eq!(rig.parent().inbox().next_step.len(), 1);
    tokio::task::yield_now().await;
    assert_eq!(rig.parent().status(), AgentStatus::Idle);
    assert!(rig.models.requests(PARENT).is_empty());
    rig.finish().await;
}

/// Next-step delivery to an idle parent: inserted into the next-step lane, and the parent wakes
/// (one model request, which carries the report).
async fn next_step_delivery_wakes(config: Option<ReportToolConfig>) {
    let rig = Rig::new(config).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    let result = rig.report("child", "WAKE_UP").await;
    assert!(!result.is_error, "{}", text(&result));
    assert_eq!(
        insertions(rig.parent()),
        [(InboxTarget::NextStep, "subagent-report".to_owned())]
    );
    rig.parent().when_idle().await;
    let requests = rig.models.requests(PARENT);
    assert_eq!(requests.len(), 1);
    let seen = format!("{:?}", requests[0].messages);
    assert!(seen.contains("WAKE_UP"), "{seen}");
    assert_eq!(reports(rig.parent()).len(), 1);
    rig.finish().await;
}

/// spec: REP-5 — next-step delivery inserts into the next-step lane and starts a parent request.
#[tokio::test(start_paused = true)]
async fn rep_5_next_step_delivery_wakes_the_parent() {
    next_step_delivery_wakes(next_step()).await;
}

/// spec: REP-22 — the default configuration wakes the parent the same way.
#[tokio::test(start_paused = true)]
async fn rep_22_the_default_configuration_wakes_the_parent() {
    let config = ReportToolConfig::from_json(&json!({})).expect("valid");
    assert_eq!(config, ReportToolConfig::default());
    next_step_delivery_wakes(Some(config)).await;
}

/// spec: REP-6 — repeated next-step reports to a busy parent queue in accepted order and are
/// claimed together, in one batch.
#[tokio::test(start_paused = true)]
async fn rep_6_reports_to_a_busy_parent_queue_in_order_and_batch() {
    let rig = Rig::new(next_step()).await;
    busy_parent(&rig).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    for output in ["FIRST", "SECOND"] {
        let result = rig.report("child", output).await;
        assert!(!result.is_error, "{}", text(&result));
    }
    let pending = rig.parent().inbox().next_step;
    assert_eq!(pending.len(), 2);
    let last_lines: Vec<String> = reports(rig.parent())
        .into_iter()
        .map(|r| r.texts.last().cloned().unwrap_or_default())
        .collect();
    assert_eq!(last_lines, ["FIRST", "SECOND"]);
    rig.models.release(PARENT);
    rig.until("the parent claimed the reports", || {
        rig.parent().inbox().next_step.is_empty()
    })
    .await;
    let claims: Vec<u64> = rig
        .parent()
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            agent::EventData::InboxSpliced(s) if s.is_claim() && s.target == InboxTarget::NextStep => {
                s.removed_count
            }
            _ => None,
        })
        .collect();
    assert_eq!(claims, [2], "both reports claimed in one batch");
    rig.finish().await;
}

/// spec: REP-7 — a report the child's own model sends before it finishes precedes its
/// settlement notice in the busy parent's next-step queue (`subagent-report`, then
/// `subagent-settled`), and nothing waits in the next-turn queue.
#[tokio::test(start_paused = true)]
async fn rep_7_a_report_precedes_the_settlement_notice() {
    let rig = Rig::new(next_step()).await;
    busy_parent(&rig).await;
    rig.models.script(
        "child",
        [
            reporting("r1", "ORDERED_REPORT"),
            chunks::text("child done").into(),
        ],
    );
    rig.start(rig.parent(), "child", "child task").await;
    rig.settle().await;
    assert!(rig.agent("child").is_none(), "the child settled");
    let inbox = rig.parent().inbox();
    let kinds: Vec<&str> = inbox.next_step.iter().map(|m| m.source.kind()).collect();
    assert_eq!(kinds, ["subagent-report", "subagent-settled"]);
    assert!(inbox.next_turn.is_empty());
    rig.finish().await;
}

/// spec: REP-8 — an accepted report stays with the parent after the child settles.
#[tokio::test(start_paused = true)]
async fn rep_8_an_accepted_report_outlives_the_child() {
    let rig = Rig::new(quiet()).await;
    rig.models.script(
        "child",
        [
            reporting("r1", "DURABLE_SELECTION"),
            chunks::text("child done").into(),
        ],
    );
    rig.start(rig.parent(), "child", "child task").await;
    rig.settle().await;
    rig.parent().when_idle().await;
    assert!(rig.agent("child").is_none(), "the child settled");
    let texts: Vec<Vec<String>> = reports(rig.parent()).into_iter().map(|r| r.texts).collect();
    assert_eq!(texts, [vec![heading("child"), "DURABLE_SELECTION".to_owned()]]);
    // The child's turn went on after the report: the tool result, then its final answer.
    let log = rig.persisted("child").await;
    let results: Vec<String> = log
        .events
        .iter()
        .filter_map(|e| match &e.data {
            agent::EventData::ToolResult { message, .. } => Some(format!("{:?}", message.content)),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1);
    assert!(
        results[0].contains("report accepted by the agent that started you as message "),
        "{results:?}"
    );
    rig.finish().await;
}

/// spec: REP-9 — a grandchild's report reaches only its direct parent (the child), never the
/// root.
#[tokio::test(start_paused = true)]
async fn rep_9_nested_reports_cross_exactly_one_edge() {
    let rig = Rig::new(quiet()).await;
    rig.models.hold("outer");
    rig.models.hold("inner");
    let outer = rig.start(rig.parent(), "outer", "outer task").await;
    rig.start(&outer, "inner", "inner task").await;
    let result = rig.report("inner", "FROM_GRANDCHILD").await;
    assert!(!result.is_error, "{}", text(&result));
    assert!(reports(rig.parent()).is_empty());
    let received = reports(&outer);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].sender, "inner");
    assert_eq!(
        received[0].texts,
        [heading("inner"), "FROM_GRANDCHILD".to_owned()]
    );
    rig.models.release("outer");
    outer.when_idle().await;
    assert_eq!(reports(&outer).len(), 1);
    assert!(reports(rig.parent()).iter().all(|r| r.sender != "inner"));
    rig.finish().await;
}

/// spec: REP-10 — a next-step report to a parent that is itself a resident continuable child is
/// accounted: that parent stays live and resident, and receives the report.
#[tokio::test(start_paused = true)]
async fn rep_10_reports_to_a_resident_continuable_parent_are_accounted() {
    let rig = Rig::new(next_step()).await;
    rig.models.hold("outer");
    rig.models.hold("inner");
    let outer = rig.start(rig.parent(), "outer", "outer task").await;
    rig.start(&outer, "inner", "inner task").await;
    let result = rig.report("inner", "WAKE_PARENT_CHILD").await;
    assert!(!result.is_error, "{}", text(&result));
    let live = rig.agent("outer").expect("the parent child is live");
    assert!(std::sync::Arc::ptr_eq(&live, &outer));
    assert!(rig.manager.is_resident(&"outer".into()));
    rig.models.release("outer");
    rig.until("the report reached the parent child's log", || {
        outer.session().events().iter().any(
            |e| matches!(&e.data, agent::EventData::UserMessage(m) if m.source.kind() == "subagent-report"),
        )
    })
    .await;
    let received = reports(&outer);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].sender, "inner");
    assert!(received[0].texts.contains(&"WAKE_PARENT_CHILD".to_owned()));
    rig.finish().await;
}

/// spec: REP-11 — a parent whose send throws: the call fails `PARENT_UNAVAILABLE` (the send's
/// failure as its cause) and nothing is delivered.
#[tokio::test(start_paused = true)]
async fn rep_11_a_throwing_parent_send_is_parent_unavailable() {
    let rig = Rig::new(quiet()).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    rig.agents_view.refuse(PARENT);
    let result = rig.report("child", "rejected").await;
    assert_eq!(code(&result), "PARENT_UNAVAILABLE");
    assert!(
        text(&result).contains("direct parent is not live; report was not delivered"),
        "{}",
        text(&result)
    );
    assert!(
        text(&result).contains("parent closed during delivery"),
        "{}",
        text(&result)
    );
    assert!(reports(rig.parent()).is_empty());
    assert!(insertions(rig.parent()).is_empty());
    rig.finish().await;
}

/// spec: REP-12 — roots and forged same-id senders are `UNAUTHORIZED` (the seam's boundary; the
/// tool itself exists only for the child), a pre-cancelled call fails, a report to a disposed
/// parent fails, and during a drain the call fails `DRAINING`; none delivers anything.
#[tokio::test(start_paused = true)]
async fn rep_12_roots_forgeries_cancellation_absent_parents_and_drains_are_refused() {
    let mut rig = Rig::new(quiet()).await;
    // A root: no tool to call, and the seam refuses it as a reporter.
    let result = rig.report(PARENT, "root").await;
    assert!(result.is_error);
    let error = rig
        .manager
        .report_from(
            rig.parent(),
            vec![ContentBlock::text("root")],
            ReportDelivery::Quiet,
            &Signal::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), SubagentErrorCode::Unauthorized);
    assert_eq!(
        error.to_string(),
        "agent \"parent\" is not a live continuable subagent and cannot report"
    );

    let disposable = rig.root("disposable-parent").await;
    rig.models.hold("child");
    let child = rig.start(&disposable, "child", "child task").await;
    let error = rig
        .manager
        .report_from(
            &forged(&child),
            vec![ContentBlock::text("forged")],
            ReportDelivery::Quiet,
            &Signal::new(),
        )
        .unwrap_err();
    assert_eq!(error.code(), SubagentErrorCode::Unauthorized);

    // A call whose token is already cancelled: the runtime's pipeline refuses it before the
    // body runs; the seam refuses the same token `CANCELLED` should a body reach it.
    let cancelled = Signal::new();
    cancelled.cancel(agent::CancelCause::User);
    let result = rig.report_with("child", "cancelled", cancelled.clone()).await;
    assert_eq!(code(&result), "TOOL_ABORTED_BEFORE_DISPATCH", "{}", text(&result));
    let error = rig
        .manager
        .report_from(
            &child,
            vec![ContentBlock::text("cancelled")],
            ReportDelivery::Quiet,
            &cancelled,
        )
        .unwrap_err();
    assert_eq!(error.code(), SubagentErrorCode::Cancelled);
    assert!(reports(&disposable).is_empty());

    rig.take_root("disposable-parent").dispose().await;
    let result = rig.report("child", "orphaned").await;
    assert_eq!(code(&result), "PARENT_UNAVAILABLE", "{}", text(&result));
    assert!(reports(&disposable).is_empty());

    let mut spec = rig.spec(rig.parent(), "drained", "drained task");
    spec.child_id = Some("drained".into());
    rig.models.hold("drained");
    let drained = rig.start_spec(spec).await;
    let draining = rig
        .manager
        .drain_continuable_descendants(std::slice::from_ref(&drained));
    let result = rig.report("drained", "draining").await;
    assert_eq!(code(&result), "DRAINING", "{}", text(&result));
    assert!(
        text(&result).contains(
            "continuable subagents below parent \"drained\" are draining; the operation was not admitted"
        ),
        "{}",
        text(&result)
    );
    draining.await.expect("drained");
    assert!(reports(rig.parent()).is_empty());
    rig.finish().await;
}

/// spec: REP-20 — a parent whose disposal has begun. Upstream a parent still in the registry
/// accepts reports until its disposal completes; in this runtime an agent leaves the live
/// registry and stops taking work the moment its disposal begins (the `Agent` contract), so
/// the report fails `PARENT_UNAVAILABLE` then, delivers nothing, and keeps failing after the
/// disposal completed.
#[tokio::test(start_paused = true)]
async fn rep_20_a_parent_being_disposed_takes_no_more_reports() {
    let mut rig = Rig::new(quiet()).await;
    let disposing_parent = rig.root("disposing-parent").await;
    rig.models.hold("child");
    rig.start(&disposing_parent, "child", "child task").await;
    let accepted = rig.report("child", "before-close").await;
    assert!(!accepted.is_error, "{}", text(&accepted));
    let handle = rig.take_root("disposing-parent");
    let disposing = handle.dispose();
    assert!(rig.agent("disposing-parent").is_none(), "left the live registry");
    let result = rig.report("child", "during-close").await;
    assert_eq!(code(&result), "PARENT_UNAVAILABLE", "{}", text(&result));
    disposing.await;
    let result = rig.report("child", "after-close").await;
    assert_eq!(code(&result), "PARENT_UNAVAILABLE", "{}", text(&result));
    // Only the report sent before the disposal began was ever inserted (the disposal then
    // discarded the parent's pending inbox with the rest of it).
    assert_eq!(
        insertions(&disposing_parent),
        [(InboxTarget::NextStep, "subagent-report".to_owned())]
    );
    rig.finish().await;
}

/// spec: REP-23 — a child that finishes without calling `report` produces no report: the parent
/// gets only the settlement notice, the child's log holds only its own prompt as user input, and
/// no job registry is involved.
#[tokio::test(start_paused = true)]
async fn rep_23_finishing_never_reports_automatically() {
    let rig = Rig::new(quiet()).await;
    assert!(rig.rt.services().jobs.is_none(), "no job registry in this host");
    rig.models.script("child", [chunks::text("final answer").into()]);
    rig.start(rig.parent(), "child", "child task").await;
    rig.settle().await;
    rig.parent().when_idle().await;
    assert!(reports(rig.parent()).is_empty());
    let log = rig.persisted("child").await;
    let user_texts: Vec<String> = log
        .events
        .iter()
        .filter_map(|e| match &e.data {
            agent::EventData::UserMessage(m) if m.source.kind() != "plugin" => {
                Some(agent::content::visible_text(&m.content))
            }
            _ => None,
        })
        .collect();
    assert_eq!(user_texts, ["child task"]);
    rig.finish().await;
}

/// Bad arguments are refused with `INVALID_ARGS` before anything is delivered.
#[tokio::test(start_paused = true)]
async fn malformed_arguments_deliver_nothing() {
    let rig = Rig::new(next_step()).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    for arguments in [
        json!({}),
        json!({"output": 7}),
        json!({"output": "  "}),
        json!(["x"]),
    ] {
        let call = agent::tools::ToolCallRequest {
            call_id: "bad".into(),
            name: "report".to_owned(),
            arguments: arguments.to_string(),
        };
        let result = rig
            .rt
            .services()
            .tools
            .execute(&"child".into(), call, Signal::new())
            .await
            .result;
        assert_eq!(code(&result), "INVALID_ARGS", "{arguments}");
    }
    assert!(reports(rig.parent()).is_empty());
    assert!(rig.models.requests(PARENT).is_empty());
    rig.finish().await;
}

/// spec: §5.5 `ACTIVATION_CLOSING` (acp-and-tools.md) — a report from a child whose Activation
/// disposal has begun (a selected teardown opened, the child not yet gone) is refused with the
/// seam's code and text and delivers nothing; once the teardown completed, the tool is gone
/// from the child's scope.
#[tokio::test(start_paused = true)]
async fn a_report_from_a_closing_activation_is_refused() {
    let rig = Rig::new(next_step()).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    let teardown = rig
        .manager
        .drain_continuable_children(rig.parent(), &["child".into()]);
    let result = rig.report("child", "too late").await;
    assert_eq!(code(&result), "ACTIVATION_CLOSING", "{}", text(&result));
    assert_eq!(
        text(&result),
        "Error: subagent \"child\" activation is being disposed; the report was not delivered"
    );
    teardown.await.expect("torn down");
    let result = rig.report("child", "after teardown").await;
    assert_eq!(code(&result), "UNKNOWN_TOOL", "{}", text(&result));
    assert!(reports(rig.parent()).is_empty());
    assert!(
        insertions(rig.parent())
            .iter()
            .all(|(_, kind)| kind != "subagent-report")
    );
    rig.finish().await;
}

/// Raw argument text at the edges: text that is not JSON (a lone surrogate escape, a cut-off
/// object) is `INVALID_ARGS` and delivers nothing; control characters and a large output are
/// delivered verbatim, as the exact last block of the parent's message.
#[tokio::test(start_paused = true)]
async fn raw_arguments_at_the_edges() {
    let rig = Rig::new(quiet()).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    let call = |raw: &str| agent::tools::ToolCallRequest {
        call_id: "raw".into(),
        name: "report".to_owned(),
        arguments: raw.to_owned(),
    };
    for raw in [r#"{"output": "a\ud800b"}"#, r#"{"output": "cut of"#, "null", ""] {
        let result = rig
            .rt
            .services()
            .tools
            .execute(&"child".into(), call(raw), Signal::new())
            .await
            .result;
        assert_eq!(code(&result), "INVALID_ARGS", "{raw:?}");
    }
    assert!(reports(rig.parent()).is_empty());
    let result = rig
        .rt
        .services()
        .tools
        .execute(
            &"child".into(),
            call(r#"{"output": "a\u0000b\u001b[0m\r\n"}"#),
            Signal::new(),
        )
        .await
        .result;
    assert!(!result.is_error, "{}", text(&result));
    let large = "x".repeat(1 << 20);
    let result = rig.report("child", &large).await;
    assert!(!result.is_error, "{}", text(&result));
    let last: Vec<String> = reports(rig.parent())
        .into_iter()
        .map(|r| r.texts.last().cloned().unwrap_or_default())
        .collect();
    assert_eq!(last, ["a\u{0}b\u{1b}[0m\r\n".to_owned(), large]);
    rig.finish().await;
}
