//! Delegated policy capture through the delegation tool (`subagent-seam.md` §2.15,
//! `inprocess-providers.md` §2.5): the parent's policy is captured at the tool call — the
//! start's synchronous prefix runs in the call, never later on a task — so a parent switch made
//! right after the call (or while the rest of the start waits for a task) does not reach the
//! child. Real host: the reference runtime with a scripted model, the real job registry and job
//! tools, and the real `spawn` provider over a driver composed with both policy services.

mod common;

use std::sync::Arc;

use agent::content::visible_text;
use agent::policy::{SandboxMode, sandbox_override};
use agent::tools::{ToolCallRequest, ToolResult};
use agent::{AgentHandle, AgentRuntime, EventData, Registration, Session, SessionId, Signal};
use agent_loop::ScriptedModel;
use agent_loop::jobs::{JobRegistry, job_tools};
use agent_loop::model::chunks;
use agent_loop::runtime::{Runtime, assert_quiescent};
use futures::FutureExt;
use parking_lot::Mutex;
use serde_json::{Value, json};
use subagent::PolicyServices;
use subagent::events::SubagentEvent;
use subagent::service::SubagentService;
use subagent_inprocess::InProcessDriver;
use tool_subagent::{SubagentToolConfig, SubagentToolPlugin};

const MODEL: &str = "mock";
const PARENT: &str = "parent";

/// The host: one tool instance `subagent` over `spawn` (one-shot mode), parent [`PARENT`].
struct Rig {
    rt: Runtime,
    subagents: SubagentService,
    driver: InProcessDriver,
    jobs: Arc<JobRegistry>,
    plugin: Option<SubagentToolPlugin>,
    registrations: Vec<Registration>,
    parent: Option<AgentHandle>,
    /// The sandbox mode each child started with, recorded at its `subagent/start`.
    child_modes: Arc<Mutex<Vec<Option<SandboxMode>>>>,
}

impl Rig {
    /// A rig whose children answer `answers` times.
    async fn new(answers: usize) -> Self {
        let model = ScriptedModel::default();
        for _ in 0..answers {
            model.push(chunks::text("child answer"));
        }
        let jobs = Arc::new(JobRegistry::new());
        let rt = Runtime::builder()
            .model(MODEL, model.adapter())
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
        let driver = InProcessDriver::with_policy(rt.services().clone(), PolicyServices::ALL);
        registrations.push(subagent_spawn::register(&subagents, driver.clone()).expect("spawn registers"));
        let child_modes: Arc<Mutex<Vec<Option<SandboxMode>>>> = Arc::default();
        let (modes, services) = (child_modes.clone(), rt.services().clone());
        registrations.push(subagents.events().on(move |event: &SubagentEvent| {
            if let SubagentEvent::Start(info) = event
                && let Some(child) = services.agents.get(&info.id)
            {
                modes
                    .lock()
                    .push(sandbox_override(child.session().events().iter()));
            }
            Ok(())
        }));
        let config = SubagentToolConfig::from_json(&json!({"provider": "spawn"})).expect("valid");
        let plugin = SubagentToolPlugin::load(rt.services(), &subagents, config).expect("tool loads");
        let parent = rt
            .create(common::routed_parent(PARENT, MODEL))
            .await
            .expect("parent is created");
        Self {
            rt,
            subagents,
            driver,
            jobs,
            plugin: Some(plugin),
            registrations,
            parent: Some(parent),
            child_modes,
        }
    }

    /// The parent's session.
    fn parent_session(&self) -> Arc<Session> {
        self.parent.as_ref().expect("parent").agent().session().clone()
    }

    /// Calls tool `name` as the parent.
    async fn call(&self, name: &str, arguments: Value) -> ToolResult {
        let call = ToolCallRequest {
            call_id: "call".into(),
            name: name.to_owned(),
            arguments: arguments.to_string(),
        };
        self.rt
            .services()
            .tools
            .execute(&SessionId::from(PARENT), call, Signal::new())
            .await
            .result
    }

    /// Shuts everything down and asserts quiescence: no agent, session, job, run or task left.
    async fn finish(mut self) {
        if let Some(plugin) = self.plugin.take() {
            plugin.shutdown().await;
        }
        if let Some(parent) = self.parent.take() {
            parent.dispose().await;
        }
        common::shut_down_quiescent(
            &self.jobs,
            &self.driver,
            &self.subagents,
            &mut self.registrations,
            &self.rt,
        )
        .await;
        assert!(AgentRuntime::list(&self.rt).is_empty(), "agents left");
        assert_quiescent(&self.rt);
    }
}

/// Switches `session`'s sandbox mode (an explicit override, which delegation copies).
fn switch(session: &Session, mode: SandboxMode) {
    session
        .append(
            EventData::SandboxMode {
                mode: mode.as_str().into(),
                source: None,
            },
            None,
        )
        .expect("the switch is logged");
}

fn text(result: &ToolResult) -> String {
    visible_text(&result.content)
}

/// spec: POL-21 — through the one-shot background route: the parent is read-only when it
/// delegates and switches to full access as soon as the call has returned the job id; the child
/// starts read-only. (The registry polls the job's work on a task; the start used to begin
/// there, after the switch.)
#[tokio::test(start_paused = true)]
async fn pol_21_a_switch_after_a_background_delegation_does_not_reach_the_child() {
    let rig = Rig::new(1).await;
    switch(&rig.parent_session(), SandboxMode::ReadOnly);
    let result = rig
        .call(
            "subagent",
            json!({"description": "d", "prompt": "p", "run_in_background": true}),
        )
        .await;
    assert_eq!(text(&result), "started background subagent job subagent-1");
    switch(&rig.parent_session(), SandboxMode::DangerFullAccess);
    let output = rig
        .call("job_output", json!({"job_id": "subagent-1", "wait": true}))
        .await;
    assert_eq!(text(&output), "child answer\n[status: completed]");
    assert_eq!(*rig.child_modes.lock(), [Some(SandboxMode::ReadOnly)]);
    rig.finish().await;
}

/// spec: POL-21 — through the foreground route: the parent is read-only when it delegates and
/// switches to full access while the call is still in flight (after its first poll); the child
/// starts read-only. (The run executes on a tracked task; the start used to begin there, after
/// the switch.)
#[tokio::test(start_paused = true)]
async fn pol_21_a_switch_during_a_foreground_delegation_does_not_reach_the_child() {
    let rig = Rig::new(1).await;
    switch(&rig.parent_session(), SandboxMode::ReadOnly);
    let mut call = rig
        .call("subagent", json!({"description": "d", "prompt": "p"}))
        .boxed_local();
    assert!((&mut call).now_or_never().is_none());
    switch(&rig.parent_session(), SandboxMode::DangerFullAccess);
    let result = call.await;
    assert_eq!(text(&result), "child answer");
    assert_eq!(*rig.child_modes.lock(), [Some(SandboxMode::ReadOnly)]);
    rig.finish().await;
}
