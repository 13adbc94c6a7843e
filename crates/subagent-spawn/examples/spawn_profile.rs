//! A fixed number of one-shot `spawn` delegations (start → result → dispose) on an instant model,
//! for profilers (`valgrind --tool=callgrind`, `perf stat -e instructions`): the loop of
//! `benches/spawn.rs` without criterion. `SPAWN_DELEGATIONS` (default 2000) sets the count; it
//! prints the mean wall time.
//!
//! `cargo build --release -p subagent-spawn --example spawn_profile`

use std::sync::Arc;
use std::time::Instant;

use agent::{
    AgentOptions, AgentRuntime, ContentBlock, CreateAgentOptions, GenerateOptions, ModelAdapter, ModelStream,
    SessionId, Signal,
};
use agent_loop::model::chunks;
use agent_loop::runtime::Runtime;
use futures::StreamExt;
use subagent::provider::SubagentStartRequest;
use subagent::service::SubagentService;
use subagent_inprocess::InProcessDriver;

/// A model that answers every call at once with one short text.
struct InstantModel;

impl ModelAdapter for InstantModel {
    fn stream(&self, _: Arc<GenerateOptions>) -> ModelStream {
        futures::stream::iter(chunks::text("done").into_iter().map(Ok)).boxed()
    }
}

fn main() {
    let delegations: u64 = std::env::var("SPAWN_DELEGATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds");
    let elapsed = rt.block_on(async {
        let runtime = Runtime::builder()
            .model("instant", Arc::new(InstantModel))
            .build();
        let parent_handle = runtime
            .create(CreateAgentOptions {
                agent_options: AgentOptions {
                    provider: Some("instant".into()),
                    model: Some("instant".into()),
                    ..AgentOptions::default()
                },
                ..CreateAgentOptions::new(SessionId::from("parent"))
            })
            .await
            .expect("parent");
        let parent = parent_handle.agent().clone();
        let service = SubagentService::new();
        let driver = InProcessDriver::new(runtime.services().clone());
        let provider = subagent_spawn::register(&service, driver).expect("registered");
        let start = Instant::now();
        for _ in 0..delegations {
            let request =
                SubagentStartRequest::new(vec![ContentBlock::text("task")], parent.clone(), Signal::new());
            let run = service.start("spawn", request).await.expect("started");
            let result = run.result().await.expect("result");
            assert!(result.stop_reason.is_completed());
            run.dispose().await.expect("disposed");
        }
        let elapsed = start.elapsed();
        drop(provider);
        service.close().await;
        parent_handle.dispose().await;
        runtime.shutdown().await;
        elapsed
    });
    println!(
        "{delegations} delegations, {:.0} ns per delegation",
        elapsed.as_secs_f64() * 1e9 / delegations as f64
    );
}
