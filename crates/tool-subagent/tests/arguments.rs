//! Robustness of the model-facing arguments: the delegation tool (`acp-and-tools.md` §3.4–§3.8)
//! and the job tools it hands its background runs to (`job_output`, `job_kill`).
//!
//! Every test runs on a real host: the reference runtime with a scripted model, the real `spawn`
//! provider (children are real agents), the real job registry and job tools, and the online
//! invariant checker. The property is always the same: a malformed call gets a typed tool error
//! naming the problem and leaves nothing behind — no child agent or session, no model call, no
//! pending run, no job — while a well-formed call runs, settles and leaves the host quiescent.

mod common;

use std::sync::Arc;

use agent::content::visible_text;
use agent::jobs::{JobId, JobStatus};
use agent::tools::{ToolCallRequest, ToolResult};
use agent::{AgentHandle, AgentRuntime, Registration, SessionId, SessionStore, Signal};
use agent_loop::ScriptedModel;
use agent_loop::jobs::{JOB_NOT_FOUND, JobRegistry, job_tools};
use agent_loop::model::{ScriptEntry, chunks};
use agent_loop::runtime::{Runtime, assert_quiescent};
use invariants::InvariantObserver;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use subagent::service::SubagentService;
use subagent_inprocess::InProcessDriver;
use tool_subagent::model_text;
use tool_subagent::{SubagentToolConfig, SubagentToolPlugin};

/// The model route every agent of the rig uses.
const MODEL: &str = "mock";
/// What every child answers.
const ANSWER: &str = "child answer";
/// The first parent's id.
const PARENT: &str = "parent";

/// A real host with one delegation tool instance over the `spawn` provider.
struct Rig {
    rt: Runtime,
    model: ScriptedModel,
    observer: Arc<InvariantObserver>,
    subagents: SubagentService,
    driver: InProcessDriver,
    jobs: Arc<JobRegistry>,
    plugin: Option<SubagentToolPlugin>,
    registrations: Vec<Registration>,
    parents: Vec<AgentHandle>,
}

impl Rig {
    /// A rig whose tool instance is configured by `config` (config defaulting), with parent
    /// [`PARENT`].
    async fn new(config: Value) -> Self {
        let model = ScriptedModel::default();
        let observer = InvariantObserver::shared();
        let jobs = Arc::new(JobRegistry::new());
        let rt = Runtime::builder()
            .model(MODEL, model.adapter())
            .session_observer(observer.clone())
            .jobs(jobs.clone())
            .build();
        let mut registrations: Vec<Registration> = job_tools(jobs.clone())
            .into_iter()
            .map(|def| {
                rt.services()
                    .tools
                    .register(None, def)
                    .expect("job tool registers")
            })
            .collect();
        let subagents = SubagentService::new();
        let driver = InProcessDriver::new(rt.services().clone());
        registrations.push(subagent_spawn::register(&subagents, driver.clone()).expect("spawn registers"));
        let config = SubagentToolConfig::from_json(&config).expect("valid configuration");
        let plugin = SubagentToolPlugin::load(rt.services(), &subagents, config).expect("tool loads");
        let mut rig = Self {
            rt,
            model,
            observer,
            subagents,
            driver,
            jobs,
            plugin: Some(plugin),
            registrations,
            parents: Vec::new(),
        };
        rig.parent(PARENT).await;
        rig
    }

    /// A default rig: tool `subagent` over `spawn`, background enabled in one-shot mode.
    async fn default() -> Self {
        Self::new(json!({"provider": "spawn"})).await
    }

    /// Creates another live top-level agent routed to the scripted model.
    async fn parent(&mut self, id: &str) -> SessionId {
        let handle = self
            .rt
            .create(common::routed_parent(id, MODEL))
            .await
            .expect("parent is created");
        let id = handle.id().clone();
        self.parents.push(handle);
        id
    }

    /// Scripts `n` more child answers.
    fn answers(&self, n: usize) {
        for _ in 0..n {
            self.model.push(chunks::text(ANSWER));
        }
    }

    /// Calls tool `name` as `agent` with the raw argument text `raw`.
    async fn call_raw(&self, name: &str, agent: &str, raw: &str) -> ToolResult {
        let call = ToolCallRequest {
            call_id: "call".into(),
            name: name.to_owned(),
            arguments: raw.to_owned(),
        };
        self.rt
            .services()
            .tools
            .execute(&SessionId::from(agent), call, Signal::new())
            .await
            .result
    }

    /// Calls tool `name` as `agent` with `arguments`.
    async fn call(&self, name: &str, agent: &str, arguments: &Value) -> ToolResult {
        self.call_raw(name, agent, &arguments.to_string()).await
    }

    /// Calls the delegation tool as [`PARENT`].
    async fn delegate(&self, arguments: &Value) -> ToolResult {
        self.call("subagent", PARENT, arguments).await
    }

    /// The ids of the live agents, sorted.
    fn agents(&self) -> Vec<String> {
        let mut ids: Vec<String> = AgentRuntime::list(&self.rt)
            .iter()
            .map(|a| a.id().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// The ids of the live sessions, sorted.
    fn sessions(&self) -> Vec<String> {
        let mut ids: Vec<String> = SessionStore::list(self.rt.sessions())
            .iter()
            .map(|s| s.id().to_string())
            .collect();
        ids.sort();
        ids
    }

    /// The ids of the parents, sorted.
    fn parent_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.parents.iter().map(|h| h.id().to_string()).collect();
        ids.sort();
        ids
    }

    /// Nothing was started, stored or left running by the calls so far: only the parents live,
    /// no model call was made, no run is pending, no job exists and no foreground run is in
    /// flight.
    fn assert_untouched(&self, context: &str) {
        assert_eq!(self.agents(), self.parent_ids(), "{context}: live agents");
        assert_eq!(self.sessions(), self.parent_ids(), "{context}: live sessions");
        assert!(
            self.model.requests().is_empty(),
            "{context}: the model was called"
        );
        assert_eq!(self.subagents.pending_runs(), 0, "{context}: pending runs");
        assert!(
            self.jobs.counts().is_empty(),
            "{context}: jobs {:?}",
            self.jobs.counts()
        );
        assert_eq!(self.driver.task_count(), 0, "{context}: driver tasks");
        assert_eq!(self.plugin().foreground_runs(), 0, "{context}: foreground runs");
    }

    /// After settled delegations: only the parents live, no run is pending and no job is
    /// active.
    async fn assert_settled(&self, context: &str) {
        self.driver.wait().await;
        assert_eq!(self.agents(), self.parent_ids(), "{context}: live agents");
        assert_eq!(self.sessions(), self.parent_ids(), "{context}: live sessions");
        assert_eq!(self.subagents.pending_runs(), 0, "{context}: pending runs");
        assert_eq!(self.jobs.counts().active, 0, "{context}: active jobs");
        assert_eq!(
            self.jobs.counts().pending_starts,
            0,
            "{context}: pending job starts"
        );
        assert_eq!(self.plugin().foreground_runs(), 0, "{context}: foreground runs");
    }

    fn plugin(&self) -> &SubagentToolPlugin {
        self.plugin.as_ref().expect("plugin loaded")
    }

    /// Disposes everything and asserts quiescence and a clean invariant record.
    async fn finish(mut self) {
        if let Some(plugin) = self.plugin.take() {
            plugin.shutdown().await;
        }
        for handle in self.parents.drain(..) {
            handle.dispose().await;
        }
        common::shut_down_quiescent(
            &self.jobs,
            &self.driver,
            &self.subagents,
            &mut self.registrations,
            &self.rt,
        )
        .await;
        assert_quiescent(&self.rt);
        let violations = self.observer.violations();
        assert!(violations.is_empty(), "invariant violations: {violations:?}");
    }
}

/// The model-visible text of a result.
fn text(result: &ToolResult) -> String {
    visible_text(&result.content)
}

/// The error code and message of a failed result.
fn error(result: &ToolResult) -> (String, String) {
    assert!(result.is_error, "expected an error, got {}", text(result));
    let facts = result.error.clone().expect("error facts");
    assert_eq!(text(result), format!("Error: {}", facts.message));
    (facts.code, facts.message)
}

/// Asserts `result` is an `INVALID_ARGS` error with exactly `message`.
fn assert_invalid(result: &ToolResult, message: &str) {
    assert_eq!(error(result), ("INVALID_ARGS".to_owned(), message.to_owned()));
}

fn string_required(name: &str) -> String {
    model_text::string_param_required(name)
}

// ---- the delegation tool: hand-picked malformed arguments ---------------------------------

/// Every malformed shape of the three parameters is refused with `INVALID_ARGS` and a message
/// naming the parameter, before a child, a run or a job exists.
#[tokio::test(start_paused = true)]
async fn malformed_arguments_start_nothing() {
    let rig = Rig::default().await;
    let not_object = model_text::ARGUMENTS_NOT_OBJECT;
    let not_boolean = model_text::RUN_IN_BACKGROUND_NOT_BOOLEAN;
    let cases: Vec<(&str, String)> = vec![
        // Not an object at all.
        ("null", not_object.into()),
        ("[]", not_object.into()),
        (r#"[{"description": "d", "prompt": "p"}]"#, not_object.into()),
        ("\"go research X\"", not_object.into()),
        ("42", not_object.into()),
        ("true", not_object.into()),
        // The arguments double-encoded as a JSON string (a common model slip).
        (
            r#""{\"description\": \"d\", \"prompt\": \"p\"}""#,
            not_object.into(),
        ),
        // Not JSON: fenced as Markdown, truncated, single-quoted, trailing text.
        (
            "```json\n{\"description\": \"d\", \"prompt\": \"p\"}\n```",
            not_object.into(),
        ),
        (r#"{"description": "d", "prompt": "p""#, not_object.into()),
        ("{'description': 'd', 'prompt': 'p'}", not_object.into()),
        (
            r#"{"description": "d", "prompt": "p"} trailing"#,
            not_object.into(),
        ),
        // Empty arguments read as `{}`.
        ("", string_required("description")),
        ("   ", string_required("description")),
        ("{}", string_required("description")),
        // Missing or mistyped required strings.
        (r#"{"prompt": "p"}"#, string_required("description")),
        (r#"{"description": "d"}"#, string_required("prompt")),
        (
            r#"{"description": null, "prompt": "p"}"#,
            string_required("description"),
        ),
        (
            r#"{"description": 3, "prompt": "p"}"#,
            string_required("description"),
        ),
        (
            r#"{"description": ["d"], "prompt": "p"}"#,
            string_required("description"),
        ),
        (
            r#"{"description": {"text": "d"}, "prompt": "p"}"#,
            string_required("description"),
        ),
        (
            r#"{"description": "d", "prompt": null}"#,
            string_required("prompt"),
        ),
        (
            r#"{"description": "d", "prompt": false}"#,
            string_required("prompt"),
        ),
        (
            r#"{"description": "d", "prompt": 1e3}"#,
            string_required("prompt"),
        ),
        (
            r#"{"description": "d", "prompt": ["p"]}"#,
            string_required("prompt"),
        ),
        (
            r#"{"description": "d", "prompt": [{"type": "text", "text": "p"}]}"#,
            string_required("prompt"),
        ),
        // Case and spelling variants are not the parameters.
        (
            r#"{"Description": "d", "Prompt": "p"}"#,
            string_required("description"),
        ),
        (r#"{"description": "d", "task": "p"}"#, string_required("prompt")),
        // A mistyped `run_in_background`.
        (
            r#"{"description": "d", "prompt": "p", "run_in_background": "true"}"#,
            not_boolean.into(),
        ),
        (
            r#"{"description": "d", "prompt": "p", "run_in_background": "false"}"#,
            not_boolean.into(),
        ),
        (
            r#"{"description": "d", "prompt": "p", "run_in_background": 1}"#,
            not_boolean.into(),
        ),
        (
            r#"{"description": "d", "prompt": "p", "run_in_background": 0}"#,
            not_boolean.into(),
        ),
        (
            r#"{"description": "d", "prompt": "p", "run_in_background": []}"#,
            not_boolean.into(),
        ),
        (
            r#"{"description": "d", "prompt": "p", "run_in_background": {}}"#,
            not_boolean.into(),
        ),
    ];
    for (raw, message) in &cases {
        let result = rig.call_raw("subagent", PARENT, raw).await;
        assert_invalid(&result, message);
        rig.assert_untouched(raw);
    }
    rig.finish().await;
}

/// The parameters are checked in schema order, so the first malformed one is named.
#[tokio::test(start_paused = true)]
async fn the_first_malformed_parameter_is_named() {
    let rig = Rig::default().await;
    let result = rig
        .delegate(&json!({"description": 1, "prompt": 2, "run_in_background": "x"}))
        .await;
    assert_invalid(&result, &string_required("description"));
    let result = rig
        .delegate(&json!({"description": "d", "prompt": 2, "run_in_background": "x"}))
        .await;
    assert_invalid(&result, &string_required("prompt"));
    rig.assert_untouched("mixed");
    rig.finish().await;
}

/// Argument errors win over every later refusal: a malformed call by an unknown caller, or
/// asking for a background run on a disabled instance, is still `INVALID_ARGS`.
#[tokio::test(start_paused = true)]
async fn argument_errors_come_before_caller_and_route_checks() {
    let rig = Rig::new(json!({"provider": "spawn", "enableRunInBackground": false})).await;
    let result = rig.call("subagent", "nobody", &json!({"description": "d"})).await;
    assert_invalid(&result, &string_required("prompt"));
    let result = rig
        .delegate(&json!({"description": "d", "prompt": "p", "run_in_background": "yes"}))
        .await;
    assert_invalid(&result, model_text::RUN_IN_BACKGROUND_NOT_BOOLEAN);
    rig.assert_untouched("ordering");
    rig.finish().await;
}

/// spec: TOOL-5 — on an instance with background runs disabled, a forced `true` is refused
/// with the spec's exact text (code `INVALID_ARGS`) and nothing starts, while an explicit
/// `false` or `null` runs in the foreground.
#[tokio::test(start_paused = true)]
async fn tool_5_disabled_background_refuses_forced_true_and_accepts_false_and_null() {
    let rig = Rig::new(json!({"provider": "spawn", "enableRunInBackground": false})).await;
    let forced = rig
        .delegate(&json!({"description": "d", "prompt": "p", "run_in_background": true}))
        .await;
    assert_invalid(
        &forced,
        "run_in_background is disabled for this tool instance (enableRunInBackground: false)",
    );
    rig.assert_untouched("forced background");
    rig.answers(2);
    for flag in [json!(false), Value::Null] {
        let result = rig
            .delegate(&json!({"description": "d", "prompt": "p", "run_in_background": flag}))
            .await;
        assert!(!result.is_error, "{flag}: {}", text(&result));
        assert_eq!(text(&result), ANSWER);
        assert_eq!(
            result.value.as_ref().map(|v| v["kind"].clone()),
            Some(json!("foreground"))
        );
    }
    rig.assert_settled("foreground").await;
    assert!(
        rig.jobs.snapshots(&PARENT.into()).is_empty(),
        "no job was created"
    );
    rig.finish().await;
}

/// spec: TOOL-14 — a well-formed call from a caller that is not a live agent fails with the
/// spec's text and starts nothing.
#[tokio::test(start_paused = true)]
async fn tool_14_unknown_caller_starts_nothing() {
    let rig = Rig::default().await;
    for flag in [json!(false), json!(true)] {
        let result = rig
            .call(
                "subagent",
                "nobody",
                &json!({"description": "d", "prompt": "p", "run_in_background": flag}),
            )
            .await;
        assert_eq!(
            error(&result).1,
            "subagent tool requires a calling agent (exec.agent was undefined)"
        );
        rig.assert_untouched("unknown caller");
    }
    rig.finish().await;
}

/// A background call that exceeds the owner's job limit is refused by the registry's preflight
/// (spec §3.8 step 2) with the spec's text, and the refused call starts no child.
#[tokio::test(start_paused = true)]
async fn background_limit_refusal_starts_no_child() {
    let rig = Rig::default().await;
    let limit = rig.jobs.limit();
    for _ in 0..limit {
        rig.model.push(ScriptEntry::hang());
    }
    let args = json!({"description": "d", "prompt": "p", "run_in_background": true});
    for n in 1..=limit {
        let result = rig.delegate(&args).await;
        assert_eq!(
            text(&result),
            format!("started background subagent job subagent-{n}")
        );
    }
    tokio::task::yield_now().await;
    let before = rig.agents().len();
    let refused = rig.delegate(&args).await;
    assert_eq!(
        error(&refused).1,
        format!(
            "background job limit reached for this owner (limit: {limit}); use job_kill to stop an unneeded job, wait for it to finish, then retry"
        )
    );
    assert_eq!(rig.jobs.snapshots(&PARENT.into()).len(), limit);
    assert_eq!(rig.agents().len(), before, "the refused call started no child");
    for n in 1..=limit {
        rig.call("job_kill", PARENT, &json!({"job_id": format!("subagent-{n}")}))
            .await;
        let out = rig
            .call(
                "job_output",
                PARENT,
                &json!({"job_id": format!("subagent-{n}"), "wait": true}),
            )
            .await;
        assert_eq!(text(&out), "(no new output)\n[status: killed]");
    }
    rig.assert_settled("after kills").await;
    rig.finish().await;
}

/// Undeclared keys (the schema permits them), duplicated keys, huge and unusual strings are
/// accepted: the child receives the prompt verbatim and the job carries the description.
#[tokio::test(start_paused = true)]
async fn unusual_but_valid_arguments_run_verbatim() {
    let rig = Rig::default().await;
    let huge = "x".repeat(256 * 1024);
    let unicode = "résumé 🦀 \u{202e}rtl\u{0000}nul \"quoted\" \\ backslash\nnewline";
    let cases: Vec<(String, String, String)> = vec![
        (
            json!({"description": "d", "prompt": "p", "provider": "acp", "mode": "fork", "other": {"deep": [1, 2, {"x": null}]}})
                .to_string(),
            "d".into(),
            "p".into(),
        ),
        // Duplicate keys: the last one wins, as in JavaScript's JSON.parse.
        (
            r#"{"description": "first", "prompt": "p1", "prompt": "p2", "description": "second"}"#.into(),
            "second".into(),
            "p2".into(),
        ),
        (json!({"description": huge, "prompt": huge}).to_string(), huge.clone(), huge.clone()),
        (
            json!({"description": unicode, "prompt": unicode}).to_string(),
            unicode.into(),
            unicode.into(),
        ),
    ];
    for (n, (raw, description, prompt)) in cases.iter().enumerate() {
        for background in [false, true] {
            rig.answers(1);
            let raw = if background {
                // Keep the duplicate keys of the raw text: append the flag textually.
                let open = raw.trim_end().strip_suffix('}').expect("an object");
                format!("{open},\"run_in_background\":true}}")
            } else {
                raw.clone()
            };
            let before = rig.model.requests().len();
            let result = rig.call_raw("subagent", PARENT, &raw).await;
            assert!(!result.is_error, "case {n}: {}", text(&result));
            if background {
                let id = format!("subagent-{}", rig.jobs.snapshots(&PARENT.into()).len());
                assert_eq!(text(&result), format!("started background subagent job {id}"));
                let out = rig
                    .call("job_output", PARENT, &json!({"job_id": id, "wait": true}))
                    .await;
                assert_eq!(text(&out), format!("{ANSWER}\n[status: completed]"));
                let job = rig
                    .jobs
                    .get(&PARENT.into(), &agent::jobs::JobId(id))
                    .expect("job");
                assert_eq!(&job.label, description, "case {n}");
            } else {
                assert_eq!(text(&result), ANSWER, "case {n}");
            }
            let requests = rig.model.requests();
            assert_eq!(requests.len(), before + 1, "case {n}: one child model call");
            let first_user = requests[before]
                .messages
                .iter()
                .find(|m| m.role == agent::Role::User)
                .map(agent::Message::text);
            assert_eq!(first_user.as_deref(), Some(prompt.as_str()), "case {n}");
            rig.assert_settled(&format!("case {n}")).await;
        }
    }
    rig.finish().await;
}

/// A prompt that is empty or only whitespace is no task: it is refused as `INVALID_ARGS`
/// naming `prompt`, on both routes, before a child is created, the model is called or a job is
/// registered.
#[tokio::test(start_paused = true)]
async fn a_blank_prompt_starts_nothing() {
    let rig = Rig::default().await;
    rig.answers(4);
    for prompt in ["", " ", "\n\t  \r\n", "\u{3000}\u{2003}"] {
        for background in [false, true] {
            let result = rig
                .delegate(&json!({"description": "d", "prompt": prompt, "run_in_background": background}))
                .await;
            assert_invalid(&result, model_text::PROMPT_BLANK);
            assert!(
                result
                    .error
                    .as_ref()
                    .is_some_and(|e| e.message.contains("`prompt`"))
            );
            assert_eq!(rig.model.remaining(), 4);
            assert!(
                rig.model.requests().is_empty(),
                "{prompt:?}: the child's model was called"
            );
            assert_eq!(rig.agents(), rig.parent_ids(), "{prompt:?}");
            assert!(rig.jobs.counts().is_empty(), "{prompt:?}: a job was registered");
        }
    }
    rig.assert_untouched("blank prompts");
    rig.finish().await;
}

/// Every proper prefix of a well-formed argument text (a model's output cut off mid-stream) is
/// refused and starts nothing; only the whole text starts a child.
#[tokio::test(start_paused = true)]
async fn truncated_argument_texts_start_nothing() {
    let rig = Rig::default().await;
    let whole = r#"{"description": "dig", "prompt": "go research X", "run_in_background": false}"#;
    for end in 0..whole.len() {
        let prefix = &whole[..end];
        let result = rig.call_raw("subagent", PARENT, prefix).await;
        let (code, message) = error(&result);
        assert_eq!(code, "INVALID_ARGS", "{prefix}");
        assert!(message.starts_with("subagent argument"), "{prefix}: {message}");
        rig.assert_untouched(prefix);
    }
    rig.answers(1);
    let result = rig.call_raw("subagent", PARENT, whole).await;
    assert_eq!(text(&result), ANSWER);
    rig.assert_settled("whole").await;
    rig.finish().await;
}

/// One assistant step of a real parent turn mixes well-formed and malformed delegations (run in
/// parallel, the tool being concurrency-safe): each malformed call gets its own typed error in
/// model order, the well-formed siblings run to completion, and only they reach a child.
#[tokio::test(start_paused = true)]
async fn a_parent_step_mixing_malformed_and_valid_delegations() {
    let rig = Rig::default().await;
    let calls = vec![
        chunks::call(
            "c1",
            "subagent",
            r#"{"description": "one", "prompt": "first task"}"#,
        ),
        chunks::call("c2", "subagent", r#"{"description": "two"}"#),
        chunks::call("c3", "subagent", r#"{"description": "three", "prompt": "  "}"#),
        chunks::call(
            "c4",
            "subagent",
            r#"{"description": "four", "prompt": "fourth task", "run_in_background": true}"#,
        ),
        chunks::call("c5", "subagent", r#"{"description": "five", "prompt": "fif"#),
        chunks::call(
            "c6",
            "subagent",
            r#"{"description": "six", "prompt": "p", "run_in_background": "true"}"#,
        ),
    ];
    let parent = SessionId::from(PARENT);
    for _ in 0..8 {
        let (parent, calls) = (parent.clone(), calls.clone());
        rig.model.push(ScriptEntry::respond(move |request| {
            if request.session_id.as_ref() != Some(&parent) {
                return chunks::text(ANSWER);
            }
            let answered = request.messages.iter().any(|m| {
                m.content
                    .iter()
                    .any(|b| matches!(b, agent::ContentBlock::ToolResult { .. }))
            });
            if answered {
                chunks::text("parent done")
            } else {
                chunks::tool_calls(None, calls.clone())
            }
        }));
    }
    let handle = &rig.parents[0];
    handle
        .agent()
        .followup(agent::Message::user_text("delegate"))
        .expect("delivered");
    handle.agent().when_idle().await;
    let out = rig
        .call(
            "job_output",
            PARENT,
            &json!({"job_id": "subagent-1", "wait": true}),
        )
        .await;
    assert_eq!(text(&out), format!("{ANSWER}\n[status: completed]"));
    handle.agent().when_idle().await;
    let requests = rig.model.requests();
    let second_step = requests
        .iter()
        .find(|r| {
            r.session_id.as_ref() == Some(&parent)
                && r.messages.iter().any(|m| {
                    m.content
                        .iter()
                        .any(|b| matches!(b, agent::ContentBlock::ToolResult { .. }))
                })
        })
        .expect("the parent's second step");
    let results: Vec<(String, bool, String)> = second_step
        .messages
        .iter()
        .flat_map(|m| m.content.iter())
        .filter_map(|b| match b {
            agent::ContentBlock::ToolResult {
                tool_call_id,
                content,
                is_error,
            } => Some((
                tool_call_id.to_string(),
                is_error.unwrap_or(false),
                visible_text(content),
            )),
            _ => None,
        })
        .collect();
    let error = |message: &str| format!("Error: {message}");
    assert_eq!(
        results,
        vec![
            ("c1".into(), false, ANSWER.into()),
            ("c2".into(), true, error(&string_required("prompt"))),
            ("c3".into(), true, error(model_text::PROMPT_BLANK)),
            (
                "c4".into(),
                false,
                "started background subagent job subagent-1".into()
            ),
            ("c5".into(), true, error(model_text::ARGUMENTS_NOT_OBJECT)),
            (
                "c6".into(),
                true,
                error(model_text::RUN_IN_BACKGROUND_NOT_BOOLEAN)
            ),
        ]
    );
    let mut child_prompts: Vec<String> = requests
        .iter()
        .filter(|r| r.session_id.as_ref() != Some(&parent))
        .filter_map(|r| {
            r.messages
                .iter()
                .find(|m| m.role == agent::Role::User)
                .map(agent::Message::text)
        })
        .collect();
    child_prompts.sort();
    assert_eq!(
        child_prompts,
        ["first task", "fourth task"],
        "only the well-formed calls reached a child"
    );
    assert_eq!(rig.jobs.snapshots(&parent).len(), 1, "one job");
    rig.assert_settled("after the turn").await;
    rig.finish().await;
}

// ---- the job tools -------------------------------------------------------------------------

/// Starts one hanging background delegation as `owner` and returns its job id.
async fn hanging_job(rig: &Rig, owner: &str) -> String {
    rig.model.push(ScriptEntry::hang());
    let result = rig
        .call(
            "subagent",
            owner,
            &json!({"description": "hang", "prompt": "wait for a kill", "run_in_background": true}),
        )
        .await;
    let id = result
        .value
        .as_ref()
        .and_then(|v| v["jobId"].as_str())
        .unwrap_or_else(|| panic!("a job id: {}", text(&result)))
        .to_owned();
    // Let the child start and reach its model call.
    while rig.model.requests().len() < rig.jobs.counts().jobs {
        tokio::task::yield_now().await;
    }
    id
}

/// The status of `owner`'s job `id`.
fn status(rig: &Rig, owner: &str, id: &str) -> JobStatus {
    rig.jobs
        .get(&owner.into(), &JobId(id.to_owned()))
        .expect("the job exists")
        .status
}

/// Kills `owner`'s job `id` and waits for it to settle `killed`.
async fn kill_and_collect(rig: &Rig, owner: &str, id: &str) {
    let kill = rig.call("job_kill", owner, &json!({"job_id": id})).await;
    assert_eq!(text(&kill), format!("requested cancellation of job {id}"));
    let out = rig
        .call("job_output", owner, &json!({"job_id": id, "wait": true}))
        .await;
    assert_eq!(text(&out), "(no new output)\n[status: killed]");
}

/// Malformed `job_output` / `job_kill` arguments are `INVALID_ARGS` with a message naming the
/// argument and echoing what was sent; the running job is neither read, waited on nor killed.
#[tokio::test(start_paused = true)]
async fn malformed_job_tool_arguments_touch_no_job() {
    let rig = Rig::default().await;
    let id = hanging_job(&rig, PARENT).await;
    let requests = rig.model.requests().len();
    let cases: Vec<(&str, &str, &str)> = vec![
        (
            "job_output",
            "",
            "invalid job_id: expected a non-empty string, got null",
        ),
        (
            "job_output",
            "{}",
            "invalid job_id: expected a non-empty string, got null",
        ),
        (
            "job_output",
            r#"{"job_id": null}"#,
            "invalid job_id: expected a non-empty string, got null",
        ),
        (
            "job_output",
            r#"{"job_id": ""}"#,
            r#"invalid job_id: expected a non-empty string, got """#,
        ),
        (
            "job_output",
            r#"{"job_id": 1}"#,
            "invalid job_id: expected a non-empty string, got 1",
        ),
        (
            "job_output",
            r#"{"job_id": ["subagent-1"]}"#,
            r#"invalid job_id: expected a non-empty string, got ["subagent-1"]"#,
        ),
        (
            "job_output",
            r#"{"jobId": "subagent-1"}"#,
            "invalid job_id: expected a non-empty string, got null",
        ),
        (
            "job_output",
            r#"{"job_id": "subagent-1", "wait": "true"}"#,
            r#"invalid wait: expected a boolean, got "true""#,
        ),
        (
            "job_output",
            r#"{"job_id": "subagent-1", "wait": 1}"#,
            "invalid wait: expected a boolean, got 1",
        ),
        (
            "job_output",
            r#""subagent-1""#,
            r#"invalid arguments: expected an object, got "subagent-1""#,
        ),
        (
            "job_output",
            "subagent-1",
            r#"invalid arguments: expected an object, got "subagent-1""#,
        ),
        (
            "job_output",
            "[]",
            "invalid arguments: expected an object, got []",
        ),
        (
            "job_kill",
            "{}",
            "invalid job_id: expected a non-empty string, got null",
        ),
        (
            "job_kill",
            r#"{"job_id": ""}"#,
            r#"invalid job_id: expected a non-empty string, got """#,
        ),
        (
            "job_kill",
            r#"{"job_id": 1}"#,
            "invalid job_id: expected a non-empty string, got 1",
        ),
        (
            "job_kill",
            r#"{"job_id": "subagent-1", "reason": 7}"#,
            "invalid reason: expected a string, got 7",
        ),
        (
            "job_kill",
            r#"{"job_id": "subagent-1", "reason": ["stop"]}"#,
            r#"invalid reason: expected a string, got ["stop"]"#,
        ),
        (
            "job_kill",
            "null",
            "invalid arguments: expected an object, got null",
        ),
        (
            "job_kill",
            r#"{"job_id": "subagent-1""#,
            r#"invalid arguments: expected an object, got "{\"job_id\": \"subagent-1\"""#,
        ),
    ];
    for (tool, raw, message) in cases {
        let result = rig.call_raw(tool, PARENT, raw).await;
        assert_invalid(&result, message);
        assert_eq!(status(&rig, PARENT, &id), JobStatus::Running, "{tool} {raw}");
    }
    assert_eq!(rig.model.requests().len(), requests);
    assert_eq!(rig.agents().len(), 2, "the child still runs");
    kill_and_collect(&rig, PARENT, &id).await;
    rig.assert_settled("after the kill").await;
    rig.finish().await;
}

/// Unknown, malformed-looking and foreign job ids read as `JOB_NOT_FOUND` with one and the
/// same text (`no job <id> for this agent`): another parent can neither read, wait on nor kill
/// a job, and learns nothing about whether it exists. The owner's job is untouched.
#[tokio::test(start_paused = true)]
async fn unknown_and_foreign_job_ids_are_not_found() {
    let mut rig = Rig::default().await;
    let other = rig.parent("other-parent").await;
    let id = hanging_job(&rig, PARENT).await;
    let huge = format!("subagent-{}", "9".repeat(4096));
    let unknown = [
        "subagent-2",
        "subagent-0",
        "subagent--1",
        "subagent-01",
        "SUBAGENT-1",
        " subagent-1",
        "subagent-1 ",
        "subagent-1\n",
        "subagent",
        "bash-1",
        "../subagent-1",
        "*",
        huge.as_str(),
    ];
    let mut asked: Vec<(String, &str)> = unknown.iter().map(|u| ((*u).to_owned(), PARENT)).collect();
    asked.push((id.clone(), other.as_str()));
    for (job, caller) in &asked {
        for (tool, args) in [
            ("job_output", json!({"job_id": job})),
            ("job_output", json!({"job_id": job, "wait": true})),
            ("job_kill", json!({"job_id": job, "reason": "not yours"})),
        ] {
            let result = rig.call(tool, caller, &args).await;
            assert_eq!(
                error(&result),
                (JOB_NOT_FOUND.to_owned(), format!("no job {job} for this agent")),
                "{tool} {caller}"
            );
        }
    }
    assert_eq!(
        status(&rig, PARENT, &id),
        JobStatus::Running,
        "the owner's job is untouched"
    );
    assert!(rig.jobs.snapshots(&other).is_empty());
    // `job_list` takes no arguments: naming another owner lists only the caller's own jobs.
    for args in [json!({}), json!({"owner": PARENT}), json!({"job_id": id})] {
        let listed = rig.call("job_list", other.as_str(), &args).await;
        assert_eq!(text(&listed), "(no background jobs)", "{args}");
    }
    kill_and_collect(&rig, PARENT, &id).await;
    rig.assert_settled("after the kill").await;
    rig.finish().await;
}

/// spec: TOOL-44 — a kill renders `requested cancellation of job <id>` and the job settles
/// `killed`; a repeated kill before settlement is acknowledged again without error, a kill
/// after settlement reports the final status (repeatably), and the child is gone afterwards.
#[tokio::test(start_paused = true)]
async fn tool_44_repeated_kills_and_kill_after_settlement() {
    let rig = Rig::default().await;
    let id = hanging_job(&rig, PARENT).await;
    let first = rig
        .call("job_kill", PARENT, &json!({"job_id": id, "reason": "superseded"}))
        .await;
    assert_eq!(text(&first), format!("requested cancellation of job {id}"));
    assert_eq!(status(&rig, PARENT, &id), JobStatus::Stopping);
    let second = rig
        .call("job_kill", PARENT, &json!({"job_id": id, "reason": "again"}))
        .await;
    assert_eq!(text(&second), format!("requested cancellation of job {id}"));
    let out = rig
        .call("job_output", PARENT, &json!({"job_id": id, "wait": true}))
        .await;
    assert_eq!(text(&out), "(no new output)\n[status: killed]");
    assert!(
        rig.model.requests()[0].signal.is_cancelled(),
        "the kill reached the child's model call"
    );
    for _ in 0..2 {
        let late = rig.call("job_kill", PARENT, &json!({"job_id": id})).await;
        assert!(!late.is_error, "{}", text(&late));
        assert_eq!(
            text(&late),
            format!("job {id} had already finished [status: killed]")
        );
    }
    rig.assert_settled("after the kills").await;
    rig.finish().await;
}

/// Killing a job that already completed changes nothing: the kill reports the completion and
/// the answer can still be read.
#[tokio::test(start_paused = true)]
async fn kill_after_completion_keeps_the_answer() {
    let rig = Rig::default().await;
    rig.answers(1);
    let started = rig
        .delegate(&json!({"description": "d", "prompt": "p", "run_in_background": true}))
        .await;
    assert_eq!(text(&started), "started background subagent job subagent-1");
    let out = rig
        .call(
            "job_output",
            PARENT,
            &json!({"job_id": "subagent-1", "wait": true}),
        )
        .await;
    assert_eq!(text(&out), format!("{ANSWER}\n[status: completed]"));
    let kill = rig
        .call(
            "job_kill",
            PARENT,
            &json!({"job_id": "subagent-1", "reason": "late"}),
        )
        .await;
    assert_eq!(
        text(&kill),
        "job subagent-1 had already finished [status: completed]"
    );
    let again = rig
        .call("job_output", PARENT, &json!({"job_id": "subagent-1"}))
        .await;
    assert_eq!(text(&again), format!("{ANSWER}\n[status: completed]"));
    rig.assert_settled("after the late kill").await;
    rig.finish().await;
}

// ---- the delegation tool: arbitrary arguments (property) ----------------------------------

/// What a call with some arguments must do.
#[derive(Debug, PartialEq)]
enum Expected {
    /// `INVALID_ARGS` with exactly this message.
    Invalid(String),
    /// A foreground run answering [`ANSWER`].
    Foreground,
    /// A one-shot background job answering [`ANSWER`].
    Background,
    /// The continuable route of an instance loaded without a continuation manager (this rig
    /// loads with `SubagentToolPlugin::load`): `CONTINUATION_UNAVAILABLE`.
    ContinuationUnavailable,
}

/// The background setting of the tool instance under test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// `enableRunInBackground: true`, `backgroundMode: one-shot` (the default).
    OneShot,
    /// `enableRunInBackground: false`.
    Disabled,
    /// `backgroundMode: continuable`.
    Continuable,
}

impl Mode {
    fn config(self) -> Value {
        match self {
            Self::OneShot => json!({"provider": "spawn"}),
            Self::Disabled => json!({"provider": "spawn", "enableRunInBackground": false}),
            Self::Continuable => json!({"provider": "spawn", "backgroundMode": "continuable"}),
        }
    }
}

/// The oracle: the documented parse of §3.4 (two required strings, the prompt not blank, an
/// optional boolean) and the route table of §3.5 for `mode`, independent of the handler's code.
fn expected(arguments: &Value, mode: Mode) -> Expected {
    let Some(map) = arguments.as_object() else {
        return Expected::Invalid(model_text::ARGUMENTS_NOT_OBJECT.into());
    };
    let Some(Value::String(_)) = map.get("description") else {
        return Expected::Invalid(string_required("description"));
    };
    let Some(Value::String(prompt)) = map.get("prompt") else {
        return Expected::Invalid(string_required("prompt"));
    };
    if prompt.trim().is_empty() {
        return Expected::Invalid(model_text::PROMPT_BLANK.into());
    }
    let flag = match map.get("run_in_background") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(flag)) => Some(*flag),
        Some(_) => return Expected::Invalid(model_text::RUN_IN_BACKGROUND_NOT_BOOLEAN.into()),
    };
    match (mode, flag) {
        (_, Some(false)) | (Mode::OneShot | Mode::Disabled, None) => Expected::Foreground,
        (Mode::OneShot, Some(true)) => Expected::Background,
        (Mode::Disabled, Some(true)) => Expected::Invalid(model_text::BACKGROUND_DISABLED.into()),
        (Mode::Continuable, None | Some(true)) => Expected::ContinuationUnavailable,
    }
}

/// Strings a model might put anywhere: empty, blank, ordinary, arbitrary Unicode (controls
/// included), and rarely a huge one.
fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        2 => "[ \t\r\n\u{3000}]{1,6}",
        6 => "[a-zA-Z0-9 ,.:!?-]{1,40}",
        3 => any::<String>(),
        1 => (1usize..100_000).prop_map(|n| "y".repeat(n)),
    ]
}

/// Arbitrary JSON values, nested up to four levels.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        any_text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{0,12}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A value for `description` or `prompt`: absent, an ordinary string, any string, or any JSON
/// value.
fn any_string_param() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        1 => Just(None),
        10 => "[a-zA-Z0-9 ,.:!?-]*[a-zA-Z][a-zA-Z0-9 ,.:!?-]*".prop_map(|s| Some(Value::String(s))),
        3 => any_text().prop_map(|s| Some(Value::String(s))),
        2 => any_json().prop_map(Some),
    ]
}

/// A value for `run_in_background`: absent, `null`, a boolean, or any JSON value.
fn any_flag() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(Value::Null)),
        6 => any::<bool>().prop_map(|b| Some(Value::Bool(b))),
        1 => any_json().prop_map(Some),
    ]
}

/// Argument values: mostly objects with the real field names (and undeclared extras, which may
/// shadow nothing since the real fields are inserted last), sometimes any JSON value at all.
fn any_arguments() -> impl Strategy<Value = Value> {
    let object = (
        any_string_param(),
        any_string_param(),
        any_flag(),
        prop::collection::btree_map("[a-z_]{1,12}", any_json(), 0..3),
    )
        .prop_map(|(description, prompt, flag, extras)| {
            let mut map: Map<String, Value> = extras.into_iter().collect();
            for (key, value) in [
                ("description", description),
                ("prompt", prompt),
                ("run_in_background", flag),
            ] {
                map.remove(key);
                if let Some(value) = value {
                    map.insert(key.to_owned(), value);
                }
            }
            Value::Object(map)
        });
    prop_oneof![8 => object, 1 => any_json()]
}

/// Runs `future` on a fresh current-thread runtime with a paused clock.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime")
        .block_on(future)
}

/// One delegation call with `arguments` on a fresh rig, checked against [`expected`]: a typed
/// error that starts nothing, or a run that reaches the child verbatim and settles; the rig
/// ends quiescent either way.
async fn check_one_call(arguments: Value, mode: Mode) {
    let rig = Rig::new(mode.config()).await;
    rig.answers(1);
    let result = rig.delegate(&arguments).await;
    match expected(&arguments, mode) {
        Expected::ContinuationUnavailable => {
            assert_eq!(
                error(&result),
                (
                    "CONTINUATION_UNAVAILABLE".to_owned(),
                    "continuable subagents require the agents service".to_owned()
                )
            );
            rig.assert_untouched("continuable");
        }
        Expected::Invalid(message) => {
            assert_invalid(&result, &message);
            rig.assert_untouched("invalid");
        }
        outcome => {
            assert!(!result.is_error, "{}", text(&result));
            let description = arguments["description"].as_str().unwrap_or_default();
            if outcome == Expected::Background {
                assert_eq!(text(&result), "started background subagent job subagent-1");
                assert_eq!(
                    result.value,
                    Some(json!({"kind": "background", "jobId": "subagent-1"}))
                );
                let job = rig.jobs.get(&PARENT.into(), &JobId("subagent-1".into()));
                assert_eq!(job.map(|j| j.label).ok().as_deref(), Some(description));
                let out = rig
                    .call(
                        "job_output",
                        PARENT,
                        &json!({"job_id": "subagent-1", "wait": true}),
                    )
                    .await;
                assert_eq!(text(&out), format!("{ANSWER}\n[status: completed]"));
            } else {
                assert_eq!(text(&result), ANSWER);
                assert_eq!(
                    result.value.as_ref().map(|v| v["kind"].clone()),
                    Some(json!("foreground"))
                );
                assert!(rig.jobs.counts().is_empty(), "a foreground call registered a job");
            }
            let requests = rig.model.requests();
            assert_eq!(requests.len(), 1, "exactly one child model call");
            let first_user = requests[0]
                .messages
                .iter()
                .find(|m| m.role == agent::Role::User)
                .map(agent::Message::text);
            assert_eq!(first_user.as_deref(), arguments["prompt"].as_str());
            rig.assert_settled("after the run").await;
        }
    }
    rig.finish().await;
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Arbitrary argument values, on a one-shot, a background-disabled and a continuable
    /// instance, never panic and never leak: each call is either a typed error with the
    /// documented code and message (`INVALID_ARGS`, or `CONTINUATION_UNAVAILABLE` for the
    /// continuable route; nothing started, stored or left running) or a start that settles,
    /// and the host is quiescent afterwards.
    #[test]
    fn arbitrary_arguments_are_refused_cleanly_or_run_and_settle(
        arguments in any_arguments(),
        mode in prop_oneof![6 => Just(Mode::OneShot), 2 => Just(Mode::Disabled), 1 => Just(Mode::Continuable)],
    ) {
        block_on(check_one_call(arguments, mode));
    }

    /// Arbitrary raw argument text (not necessarily JSON) is parsed by the registry's rule
    /// (blank → `{}`, invalid JSON → the raw string) and then behaves like that value.
    #[test]
    fn arbitrary_raw_argument_text_is_refused_cleanly_or_runs(raw in any::<String>()) {
        block_on(async {
            let rig = Rig::default().await;
            let result = rig.call_raw("subagent", PARENT, &raw).await;
            let value = if raw.trim().is_empty() {
                json!({})
            } else {
                serde_json::from_str(&raw).unwrap_or_else(|_| Value::String(raw.clone()))
            };
            match expected(&value, Mode::OneShot) {
                Expected::Invalid(message) => assert_invalid(&result, &message),
                other => panic!("random text {raw:?} parsed as valid arguments ({other:?})"),
            }
            rig.assert_untouched("raw");
            rig.finish().await;
        });
    }
}

// ---- parent disposal -----------------------------------------------------------------------

/// A parent disposed while its turn waits on a delegation — a foreground child or a background
/// job, each hanging on its model call — takes the child with it: the disposal completes, no
/// child agent, session, pending run, job or foreground run is left, and the invariant record
/// is clean.
#[tokio::test(start_paused = true)]
async fn a_parent_disposed_mid_delegation_leaves_nothing_behind() {
    for background in [false, true] {
        let mut rig = Rig::default().await;
        let parent = SessionId::from(PARENT);
        let call =
            json!({"description": "hang", "prompt": "wait", "run_in_background": background}).to_string();
        let p = parent.clone();
        rig.model.push(ScriptEntry::respond(move |request| {
            assert_eq!(request.session_id.as_ref(), Some(&p), "the parent asks first");
            chunks::tool_calls(None, vec![chunks::call("c1", "subagent", call.as_str())])
        }));
        // The child hangs on its model call; in the background case the parent's next step
        // (after the job id) hangs too.
        rig.model.push(ScriptEntry::hang());
        rig.model.push(ScriptEntry::hang());
        let handle = rig.parents.remove(0);
        handle
            .agent()
            .followup(agent::Message::user_text("delegate"))
            .expect("delivered");
        let expected_calls = if background { 3 } else { 2 };
        while rig.model.requests().len() < expected_calls {
            tokio::task::yield_now().await;
        }
        tokio::time::timeout(std::time::Duration::from_secs(3600), handle.dispose())
            .await
            .unwrap_or_else(|_| panic!("background: {background}: the parent's disposal completes"));
        rig.driver.wait().await;
        if let Some(plugin) = rig.plugin.take() {
            tokio::time::timeout(std::time::Duration::from_secs(3600), plugin.shutdown())
                .await
                .unwrap_or_else(|_| panic!("background: {background}: no foreground run is left"));
        }
        assert!(
            rig.agents().is_empty(),
            "background: {background}: {:?}",
            rig.agents()
        );
        assert!(
            rig.sessions().is_empty(),
            "background: {background}: {:?}",
            rig.sessions()
        );
        assert_eq!(rig.subagents.pending_runs(), 0, "background: {background}");
        assert_eq!(rig.jobs.counts().active, 0, "background: {background}");
        rig.finish().await;
    }
}
