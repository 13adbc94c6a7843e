//! Delegated policy through child session events appended before publication (spec
//! `inprocess-providers.md` §2.5, checklist POL-19…POL-23).
//!
//! The reference runtime ships no sandbox-policy or approval *service*, so these tests compose a
//! minimal host-side equivalent from spine pieces (`agent::policy`): a runtime-context sentence
//! for the file policy (order 110) and for the approval policy (order 115), each folded from the
//! asking agent's own log, and a `write` tool that honours the folded sandbox mode and puts an
//! escalation to an approval gate that answers `never` deterministically (logging the
//! `approval/asked` / `approval/decided` pair) before any answerer is consulted. The driver is
//! told the host composes both services (`PolicyServices::ALL`).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent::policy::{
    APPROVAL_CONTEXT_NAME, APPROVAL_CONTEXT_ORDER, ApprovalPolicy, SANDBOX_CONTEXT_NAME,
    SANDBOX_CONTEXT_ORDER, SandboxMode, approval_context_sentence, approval_override,
    sandbox_context_sentence, sandbox_override,
};
use agent::prompt::RuntimeContext;
use agent::tools::{ToolContext, ToolDefinition, ToolError, ToolHandler, ToolOutput};
use agent::{AgentRef, EventData, MessageSource, Registration, Services, Session, SessionId};
use agent_loop::model::{ScriptEntry, chunks};
use async_trait::async_trait;
use common::*;
use parking_lot::Mutex;
use serde_json::{Value, json};
use subagent::run::SubagentRun;
use subagent::{PolicyServices, SUBAGENT_DELEGATION_CONTEXT, StopReason};
use subagent_inprocess::{InProcessDriver, InProcessRunOptions};

const DEFAULT_MODE: SandboxMode = SandboxMode::WorkspaceWrite;
const READ_ONLY_DENIAL: &str = "[sandbox: file access denied under read-only mode]";

/// The host-side policy services of these tests.
struct PolicyHost {
    files: Arc<Mutex<HashMap<String, String>>>,
    answerer_calls: Arc<AtomicUsize>,
    _guards: Vec<Registration>,
    driver: InProcessDriver,
}

fn session_of(services: &Services, id: &SessionId) -> Option<Arc<Session>> {
    services.sessions.get(id)
}

fn mode_of(session: &Session) -> SandboxMode {
    sandbox_override(session.events().iter()).unwrap_or(DEFAULT_MODE)
}

struct WriteTool {
    services: Services,
    files: Arc<Mutex<HashMap<String, String>>>,
    answerer_calls: Arc<AtomicUsize>,
}

#[async_trait]
impl ToolHandler for WriteTool {
    async fn execute(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let session =
            session_of(&self.services, ctx.agent()).ok_or_else(|| ToolError::failed("no session"))?;
        let path = args["file_path"].as_str().unwrap_or_default().to_owned();
        let content = args["content"].as_str().unwrap_or_default().to_owned();
        let mut mode = mode_of(&session);
        if let Some(wanted) = args["sandbox_permissions"].as_str() {
            // The approval gate: a `never` policy rejects before any answerer is consulted.
            let id = format!("approval-{}", ctx.execution.id.0);
            let asked = EventData::other(
                "approval/asked",
                json!({"id": id, "toolName": ctx.execution.name}),
            );
            session
                .append(asked, None)
                .map_err(|e| ToolError::failed(e.to_string()))?;
            let never = approval_override(session.events().iter()) == Some(ApprovalPolicy::Never);
            let outcome = if never {
                "rejected"
            } else {
                self.answerer_calls.fetch_add(1, Ordering::SeqCst);
                "allowed-once"
            };
            let decided = EventData::other("approval/decided", json!({"id": id, "outcome": outcome}));
            session
                .append(decided, None)
                .map_err(|e| ToolError::failed(e.to_string()))?;
            if never {
                return Err(ToolError::new(
                    "DENIED",
                    format!("the user rejected escalating this operation to \"{wanted}\""),
                ));
            }
            mode = wanted.parse().map_err(|_| ToolError::invalid_args("bad mode"))?;
        }
        if mode == SandboxMode::ReadOnly {
            return Err(ToolError::new("DENIED", READ_ONLY_DENIAL));
        }
        self.files.lock().insert(path, content);
        Ok(ToolOutput::text("written"))
    }
}

impl PolicyHost {
    fn install(host: &Host) -> Self {
        let services = host.runtime.services().clone();
        let files = Arc::new(Mutex::new(HashMap::new()));
        let answerer_calls = Arc::new(AtomicUsize::new(0));
        let s1 = services.clone();
        let sandbox = services.prompt.runtime_context(
            None,
            RuntimeContext {
                name: SANDBOX_CONTEXT_NAME.into(),
                order: SANDBOX_CONTEXT_ORDER,
                render: Arc::new(move |id| {
                    session_of(&s1, id).map(|s| sandbox_context_sentence(mode_of(&s)))
                }),
            },
        );
        let s2 = services.clone();
        let approval = services.prompt.runtime_context(
            None,
            RuntimeContext {
                name: APPROVAL_CONTEXT_NAME.into(),
                order: APPROVAL_CONTEXT_ORDER,
                render: Arc::new(move |id| {
                    session_of(&s2, id).map(|s| {
                        approval_context_sentence(
                            approval_override(s.events().iter()).unwrap_or(ApprovalPolicy::Ask),
                        )
                    })
                }),
            },
        );
        let write = services
            .tools
            .register(
                None,
                ToolDefinition {
                    name: "write".into(),
                    description: "write a file".into(),
                    parameters: json!({"type": "object"}),
                    concurrency_safe: false,
                    handler: Arc::new(WriteTool {
                        services: services.clone(),
                        files: files.clone(),
                        answerer_calls: answerer_calls.clone(),
                    }),
                },
            )
            .unwrap();
        Self {
            files,
            answerer_calls,
            _guards: vec![sandbox, approval, write],
            driver: InProcessDriver::with_policy(services, PolicyServices::ALL),
        }
    }
}

fn switch(session: &Session, mode: SandboxMode) {
    session
        .append(
            EventData::SandboxMode {
                mode: mode.as_str().into(),
                source: None,
            },
            None,
        )
        .unwrap();
}

fn write_call(path: &str) -> ScriptEntry {
    chunks::tool_call("write", "write", json!({"file_path": path, "content": "escaped"})).into()
}

fn policy_events(child: &AgentRef) -> Vec<(u64, String, String, Option<String>)> {
    child
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::SandboxMode { mode, source } => {
                Some((e.seq, "sandbox/mode".into(), mode.clone(), source.clone()))
            }
            EventData::ApprovalPolicy { policy, source } => {
                Some((e.seq, "approval/policy".into(), policy.clone(), source.clone()))
            }
            _ => None,
        })
        .collect()
}

fn delegation() -> Option<String> {
    Some("delegation".into())
}

/// spec: POL-19 — a spawn child starts with `sandbox/mode(read-only, delegation)@0` and
/// `approval/policy(never, delegation)@1`, `firstLiveSeq 0`, no `seedLength`; writes are denied;
/// the runtime-context message (before `request/header`) states the read-only file policy,
/// disabled approvals and the delegated-subagent statement, and the last two are absent from the
/// system text; the parent log is untouched.
#[tokio::test(start_paused = true)]
async fn pol_19_spawn_child_is_stamped_before_publication() {
    let host = Host::new(vec![
        write_call("/ws/spawn-blocked.txt"),
        chunks::text("child done").into(),
    ])
    .await;
    let policy = PolicyHost::install(&host);
    switch(host.parent.session(), SandboxMode::ReadOnly);
    assert_eq!(approval_override(host.parent.session().events().iter()), None);
    let parent_len = host.parent.session().len();
    let run = policy
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert!(!policy.files.lock().contains_key("/ws/spawn-blocked.txt"));
    assert!(tool_results(&child)[0].2.contains(READ_ONLY_DENIAL));
    assert_eq!(
        policy_events(&child),
        [
            (0, "sandbox/mode".into(), "read-only".into(), delegation()),
            (1, "approval/policy".into(), "never".into(), delegation()),
        ]
    );
    assert_eq!(child.session().first_live_seq(), 0);
    assert_eq!(child.session().header().seed_length, None);
    assert_eq!(
        sandbox_override(child.session().events().iter()),
        Some(SandboxMode::ReadOnly)
    );
    assert_eq!(
        approval_override(child.session().events().iter()),
        Some(ApprovalPolicy::Never)
    );
    let events = events_of(&child);
    let header = events
        .iter()
        .find_map(|e| match &e.data {
            EventData::RequestHeader { header, .. } => Some((e.seq, header.clone())),
            _ => None,
        })
        .expect("request header");
    let (context_seq, context) = events
        .iter()
        .find_map(|e| match &e.data {
            EventData::UserMessage(m) if matches!(&m.source, MessageSource::Plugin { plugin, .. } if plugin == agent::prompt::PROMPT_PLUGIN) => {
                Some((e.seq, m.text()))
            }
            _ => None,
        })
        .expect("runtime-context snapshot");
    assert!(context_seq < header.0);
    assert!(
        context.contains(&sandbox_context_sentence(SandboxMode::ReadOnly)),
        "{context}"
    );
    assert!(
        context.contains(&approval_context_sentence(ApprovalPolicy::Never)),
        "{context}"
    );
    assert!(context.contains(SUBAGENT_DELEGATION_CONTEXT), "{context}");
    let system = header.1.system.unwrap_or_default();
    assert!(!system.contains(&approval_context_sentence(ApprovalPolicy::Never)));
    assert!(!system.contains(SUBAGENT_DELEGATION_CONTEXT));
    assert_eq!(host.parent.session().len(), parent_len);
    run.dispose().await.unwrap();
    drop(policy);
    host.finish().await;
}

/// spec: POL-20 — with a seed, the delegated events land after the prefix and its end-seed
/// marker: the seeded mode keeps its seq, then `session/end-seed`, then the delegated mode; the
/// fresh policy wins; a later child switch wins again. (Rust: this workspace's invariant checker
/// requires a seed to be a balanced completed-turn prefix, so the seed is the parent's switch
/// plus one completed turn — seeded mode @0, end-seed @n, delegated mode @n+1 — instead of the
/// reference's bare one-event seed.)
#[tokio::test(start_paused = true)]
async fn pol_20_delegated_events_follow_the_seed() {
    let host = Host::new(vec![
        chunks::text("parent answer").into(),
        write_call("/ws/fork-blocked.txt"),
        chunks::text("child done").into(),
    ])
    .await;
    let policy = PolicyHost::install(&host);
    switch(host.parent.session(), SandboxMode::WorkspaceWrite);
    host.parent_turn("parent question").await;
    let seed = events_of(&host.parent);
    let n = seed.len() as u64;
    switch(host.parent.session(), SandboxMode::ReadOnly);
    let run = policy
        .driver
        .start(
            resolve(host.request(), "fork"),
            InProcessRunOptions::seeded(seed.clone()),
        )
        .await
        .unwrap();
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    assert_eq!(child.session().header().seed_length, Some(n));
    assert_eq!(child.session().first_live_seq(), n);
    assert_eq!(events_of(&child)[n as usize].type_name(), "session/end-seed");
    let sandbox: Vec<_> = policy_events(&child)
        .into_iter()
        .filter(|e| e.1 == "sandbox/mode")
        .collect();
    assert_eq!(
        sandbox,
        [
            (0, "sandbox/mode".into(), "workspace-write".into(), None),
            (n + 1, "sandbox/mode".into(), "read-only".into(), delegation()),
        ]
    );
    assert!(!policy.files.lock().contains_key("/ws/fork-blocked.txt"));
    assert_eq!(
        sandbox_override(child.session().events().iter()),
        Some(SandboxMode::ReadOnly)
    );
    switch(child.session(), SandboxMode::DangerFullAccess);
    assert_eq!(
        sandbox_override(child.session().events().iter()),
        Some(SandboxMode::DangerFullAccess)
    );
    run.dispose().await.unwrap();
    drop(policy);
    host.finish().await;
}

/// spec: POL-21 — policy is captured synchronously at delegation, before asynchronous creation:
/// a parent switch right after `start` does not reach the child.
#[tokio::test(start_paused = true)]
async fn pol_21_capture_happens_at_the_call() {
    let host = Host::new(vec![chunks::text("child done").into()]).await;
    let policy = PolicyHost::install(&host);
    switch(host.parent.session(), SandboxMode::ReadOnly);
    let starting = policy
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh());
    switch(host.parent.session(), SandboxMode::DangerFullAccess);
    let run = starting.await.unwrap();
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    assert_eq!(
        sandbox_override(host.parent.session().events().iter()),
        Some(SandboxMode::DangerFullAccess)
    );
    assert_eq!(
        sandbox_override(child.session().events().iter()),
        Some(SandboxMode::ReadOnly)
    );
    run.dispose().await.unwrap();
    drop(policy);
    host.finish().await;
}

/// spec: POL-22 — an unswitched parent stamps no `sandbox/mode` (the deployment default applies)
/// but approval is still pinned, at seq 0.
#[tokio::test(start_paused = true)]
async fn pol_22_unswitched_parent_pins_only_approval() {
    let host = Host::new(vec![
        write_call("/ws/default-allowed.txt"),
        chunks::text("child done").into(),
    ])
    .await;
    let policy = PolicyHost::install(&host);
    let run = policy
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    assert_eq!(
        policy
            .files
            .lock()
            .get("/ws/default-allowed.txt")
            .map(String::as_str),
        Some("escaped")
    );
    assert_eq!(
        policy_events(&child),
        [(0, "approval/policy".into(), "never".into(), delegation())]
    );
    assert_eq!(child.session().first_live_seq(), 0);
    run.dispose().await.unwrap();
    drop(policy);
    host.finish().await;
}

/// spec: POL-23 — a child escalation request is rejected deterministically without consulting a
/// granting answerer; the asked/decided events are logged with outcome `rejected`.
#[tokio::test(start_paused = true)]
async fn pol_23_escalation_is_rejected_without_an_answerer() {
    let host = Host::new(vec![
        chunks::tool_call(
            "write",
            "write",
            json!({
                "file_path": "/ws/escalation-blocked.txt",
                "content": "escaped",
                "sandbox_permissions": "workspace-write",
                "justification": "test escalation from a delegated child"
            }),
        )
        .into(),
        chunks::text("child done").into(),
    ])
    .await;
    let policy = PolicyHost::install(&host);
    switch(host.parent.session(), SandboxMode::ReadOnly);
    let run = policy
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    assert!(!policy.files.lock().contains_key("/ws/escalation-blocked.txt"));
    assert_eq!(policy.answerer_calls.load(Ordering::SeqCst), 0);
    assert!(
        tool_results(&child)[0]
            .2
            .contains("the user rejected escalating this operation to \"workspace-write\"")
    );
    let find = |kind: &str| {
        child.session().events().iter().find_map(|e| match &e.data {
            EventData::Other { kind: k, data } if k == kind => Some(data.clone()),
            _ => None,
        })
    };
    let asked = find("approval/asked").expect("asked logged");
    let decided = find("approval/decided").expect("decided logged");
    assert_eq!(asked["toolName"], "write");
    assert_eq!(decided["id"], asked["id"]);
    assert_eq!(decided["outcome"], "rejected");
    run.dispose().await.unwrap();
    drop(policy);
    host.finish().await;
}
