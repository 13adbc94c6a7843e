//! A fixed number of idle → turn → idle cycles on an instant scripted model, for profilers
//! (`valgrind --tool=callgrind`, `perf stat -e instructions`): the loop of `benches/turn.rs`
//! without criterion. `TURN_CYCLES` (default 2000) sets the count; it prints the mean wall time.
//!
//! `cargo build --release -p agent-loop --example turn_profile`

use std::time::{Duration, Instant};

use agent::{AgentOptions, AgentRuntime, CreateAgentOptions, Message};
use agent_loop::ScriptedModel;
use agent_loop::model::chunks;
use agent_loop::runtime::{ModelMap, Runtime};

/// Cycles per agent, as in the bench.
const CYCLES_PER_AGENT: u64 = 16;

fn main() {
    let cycles: u64 = std::env::var("TURN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds");
    let models = ModelMap::new();
    let runtime = Runtime::builder()
        .models(std::sync::Arc::new(models.clone()))
        .build();
    let total = rt.block_on(async {
        let mut total = Duration::ZERO;
        let mut done = 0;
        let mut next_id = 0;
        while done < cycles {
            let model = ScriptedModel::default();
            models.insert("bench", model.adapter());
            next_id += 1;
            let mut options = CreateAgentOptions::new(format!("bench-{next_id}").into());
            options.agent_options = AgentOptions {
                provider: Some("bench".into()),
                model: Some("bench".into()),
                ..AgentOptions::default()
            };
            let handle = runtime.create(options).await.expect("agent creation succeeds");
            let agent = handle.agent().clone();
            let n = CYCLES_PER_AGENT.min(cycles - done);
            for _ in 0..n {
                model.push(chunks::text("ok"));
                let message = Message::user_text("go");
                let start = Instant::now();
                agent.followup(message).expect("the agent accepts work");
                agent.when_idle().await;
                total += start.elapsed();
            }
            done += n;
            handle.dispose().await;
        }
        runtime.shutdown().await;
        total
    });
    println!(
        "{cycles} cycles, {:.0} ns per cycle",
        total.as_secs_f64() * 1e9 / cycles as f64
    );
}
