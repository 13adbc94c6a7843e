//! Composition inheritance (spec `inprocess-providers.md` §2.4, checklist CMP-24…CMP-28).
//!
//! The reference composes agents from *presets* and joins a child to its parent's preset layer.
//! Agent presets are left out of this workspace on purpose: a child has a fresh **flat** scope
//! over the deployment's global layer, and the composition join is a no-op. Each test therefore
//! asserts the Rust equivalent of its checklist line: the child sees exactly the deployment's
//! (global) composition, never the parent's own scoped registrations; no preset is recorded; a
//! tool filter applies to the inherited (global) tools; and the child follows the *live* global
//! composition.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use agent::prompt::PromptSection;
use agent::{AgentRuntime, EventData, GenerateOptions};
use agent_loop::model::chunks;
use common::*;
use subagent::run::SubagentRun;
use subagent_inprocess::InProcessRunOptions;

fn tool_names(request: &GenerateOptions) -> Vec<String> {
    request
        .tools
        .as_ref()
        .map(|t| t.iter().map(|s| s.name.clone()).collect())
        .unwrap_or_default()
}

fn no_calls() -> Arc<AtomicUsize> {
    Arc::new(AtomicUsize::new(0))
}

/// spec: CMP-24 — (presets left out) the child's model request carries exactly the deployment's
/// tools: the global layer, without the parent's own scoped tools.
#[tokio::test(start_paused = true)]
async fn cmp_24_child_request_carries_exactly_the_shared_tools() {
    let host = Host::new(vec![chunks::text("parent").into(), chunks::text("child").into()]).await;
    let read = global_tool(&host, counting_tool("read", no_calls()));
    let parent_ctx = host.runtime.agent_ctx(host.parent.id()).unwrap();
    assert!(
        parent_ctx
            .register_tool(counting_tool("parent_only", no_calls()))
            .unwrap()
            .is_none()
    );
    host.parent_turn("hi").await;
    assert_eq!(tool_names(&host.model.requests()[0]), ["parent_only", "read"]);
    let run = host
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    run.result().await.unwrap();
    assert_eq!(tool_names(&host.model.requests()[1]), ["read"]);
    run.dispose().await.unwrap();
    drop(read);
    host.finish().await;
}

/// spec: CMP-25 — (presets left out) the child's request header carries the deployment's prompt
/// sections, not the parent's own scoped sections.
#[tokio::test(start_paused = true)]
async fn cmp_25_child_header_carries_the_shared_sections() {
    let host = Host::new(vec![chunks::text("child").into()]).await;
    let shared = host.runtime.services().prompt.section(
        None,
        PromptSection {
            name: "deployment:guidance".into(),
            order: 50,
            text: "SHARED GUIDANCE".into(),
            tool: None,
        },
    );
    let parent_ctx = host.runtime.agent_ctx(host.parent.id()).unwrap();
    assert!(
        parent_ctx
            .prompt_section(PromptSection {
                name: "parent:own".into(),
                order: 60,
                text: "PARENT ONLY".into(),
                tool: None,
            })
            .unwrap()
            .is_none()
    );
    let run = host
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    let system = child
        .session()
        .events()
        .iter()
        .find_map(|e| match &e.data {
            EventData::RequestHeader { header, .. } => header.system.clone(),
            _ => None,
        })
        .expect("request header with system text");
    assert!(system.contains("SHARED GUIDANCE"));
    assert!(!system.contains("PARENT ONLY"));
    run.dispose().await.unwrap();
    drop(shared);
    host.finish().await;
}

/// spec: CMP-26 — (presets left out) the child header records no `agentPreset`, and the child's
/// scope is flat (no parent scope key).
#[tokio::test(start_paused = true)]
async fn cmp_26_no_preset_is_recorded() {
    let host = Host::new(vec![chunks::text("child").into()]).await;
    let run = host
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    assert_eq!(child.session().header().agent_preset, None);
    assert_eq!(child.scope().parent(), None);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: CMP-27 — a tool filter applies to the inherited (global) tools: denying the only one
/// leaves none, so the child's request has no tools field.
#[tokio::test(start_paused = true)]
async fn cmp_27_filter_applies_to_inherited_tools() {
    let host = Host::new(vec![chunks::text("child").into()]).await;
    let read = global_tool(&host, counting_tool("read", no_calls()));
    let mut request = host.request();
    request.tool_filter = Some(agent::tools::ToolRestriction {
        allow: None,
        deny: Some(vec!["read".into()]),
    });
    let run = host
        .driver
        .start(resolve(request, "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    run.result().await.unwrap();
    assert_eq!(host.model.requests()[0].tools, None);
    run.dispose().await.unwrap();
    drop(read);
    host.finish().await;
}

/// spec: CMP-28 — (presets left out) the child follows the parent's *live* composition: a
/// shared tool added after the parent was created, while it was still blank, reaches the child.
#[tokio::test(start_paused = true)]
async fn cmp_28_child_follows_the_live_composition() {
    let host = Host::new(vec![chunks::text("child").into()]).await;
    assert!(host.parent.session().is_empty());
    let late = global_tool(&host, counting_tool("late_tool", no_calls()));
    let run = host
        .driver
        .start(resolve(host.request(), "spawn"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    run.result().await.unwrap();
    assert_eq!(tool_names(&host.model.requests()[0]), ["late_tool"]);
    run.dispose().await.unwrap();
    drop(late);
    host.finish().await;
}
