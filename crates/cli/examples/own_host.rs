//! A host of one's own, built step by step: the program `docs/getting-started.md` walks
//! through. It composes the reference runtime with an in-memory log, registers the `spawn` and
//! `fork` providers with a subagent service, mounts one delegation tool per provider, and lets a
//! scripted parent delegate once through each.
//!
//! Run it with `cargo run -p subagent-cli --example own_host`.

use std::sync::Arc;

use agent::{AgentOptions, AgentRuntime, CreateAgentOptions, GenerateOptions, Message, Role, SessionId};
use agent_loop::jobs::{JobRegistry, job_tools};
use agent_loop::model::chunks;
use agent_loop::runtime::Runtime;
use agent_loop::{MemoryStore, ScriptEntry, ScriptedModel};
use serde_json::json;
use subagent::service::SubagentService;
use subagent_fork::ForkProvider;
use subagent_inprocess::InProcessDriver;
use subagent_spawn::SpawnProvider;
use tool_subagent::{MaxDepth, SubagentToolConfig, SubagentToolPlugin};

/// Step 1 — a model. Here a scripted one that serves parent and children alike: the parent
/// (session `parent`) first delegates through `subagent` (spawn), then through `fork`, then
/// answers; a child answers its prompt.
fn model() -> ScriptedModel {
    let entry = ScriptEntry::respond(|request: &GenerateOptions| {
        if request.session_id.as_ref().map(SessionId::as_str) != Some("parent") {
            let prompt = request
                .messages
                .iter()
                .rev()
                .find(|m| m.role == Role::User)
                .map(Message::text)
                .unwrap_or_default();
            return chunks::text(format!("done: {prompt}"));
        }
        let results = request
            .messages
            .iter()
            .filter(|m| matches!(m.source, agent::MessageSource::Tool { .. }))
            .count();
        match results {
            0 => chunks::tool_call(
                "c1",
                "subagent",
                json!({"description": "fresh look", "prompt": "Say hello."}),
            ),
            1 => chunks::tool_call(
                "c2",
                "fork",
                json!({"description": "follow-up", "prompt": "Build on that."}),
            ),
            _ => chunks::text("Both children answered."),
        }
    });
    ScriptedModel::new(std::iter::repeat_n(entry, 16))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Step 2 — the runtime: model route, durable persistence (any `SessionPersistence`; the
    // `subagent` program uses `JsonlStore`), and a job registry for background delegations.
    let jobs = Arc::new(JobRegistry::new());
    let runtime = Runtime::builder()
        .model("scripted", model().adapter())
        .persistence(Arc::new(MemoryStore::new()))
        .jobs(jobs.clone())
        .build();
    let services = runtime.services().clone();
    let mut guards = Vec::new();
    for tool in job_tools(jobs.clone()) {
        guards.push(services.tools.register(None, tool)?);
    }

    // Step 3 — the seam: one service, providers registered by name. Both in-process providers
    // share one driver, which creates children through `services.agents`.
    let subagents = SubagentService::new();
    let driver = InProcessDriver::new(services.clone());
    guards.push(subagents.register_provider(Arc::new(SpawnProvider::new(driver.clone())))?);
    guards.push(subagents.register_provider(Arc::new(ForkProvider::new(driver.clone())))?);

    // Step 4 — the model-facing tools: one instance per provider, each with its own name. The
    // tool mounts while its provider is registered and unmounts when it goes away.
    let mut plugins = Vec::new();
    for (provider, tool_name) in [("spawn", "subagent"), ("fork", "fork")] {
        let mut config = SubagentToolConfig::new(provider);
        config.tool_name = tool_name.to_owned();
        config.max_depth = Some(MaxDepth::Cap(3));
        plugins.push(SubagentToolPlugin::load(&services, &subagents, config)?);
    }

    // Step 5 — watch the delegations (optional): lifecycle events name provider, child and parent.
    guards.push(subagents.events().on(|event| {
        if let subagent::events::SubagentEvent::End(end) = event {
            println!(
                "{} child {} ended: {}",
                end.info.provider, end.info.id, end.stop_reason
            );
        }
        Ok(())
    }));

    // Step 6 — a parent agent on the model; one prompt; wait until it is idle.
    let mut create = CreateAgentOptions::new(SessionId::from("parent"));
    create.agent_options = AgentOptions {
        provider: Some("scripted".into()),
        model: Some("demo".into()),
        ..AgentOptions::default()
    };
    let parent = runtime.create(create).await?;
    parent
        .agent()
        .followup(Message::user_text("Delegate twice, then answer."))?;
    parent.agent().when_idle().await;
    let answer = parent
        .agent()
        .session()
        .events()
        .iter()
        .rev()
        .find_map(|e| match &e.data {
            agent::EventData::AssistantMessage { message, .. } if !message.text().is_empty() => {
                Some(message.text())
            }
            _ => None,
        });
    let answer = answer.unwrap_or_default();
    println!("parent answered: {answer}");

    // Step 7 — tear down in order: the parent (and with it any child or job it still owns),
    // the tools, the runtime, the job registry, pending lifecycle events.
    parent.dispose().await;
    for plugin in plugins {
        plugin.shutdown().await;
    }
    runtime.shutdown().await;
    jobs.shutdown().await;
    subagents.close().await;
    driver.wait().await;
    drop(guards);
    Ok(())
}
