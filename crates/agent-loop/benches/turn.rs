//! One idle → turn → idle cycle of a [`LoopAgent`](agent_loop::agent::LoopAgent) on an instant
//! scripted model, against floors measured in the same run: a bare tokio spawn+join and an
//! mpsc channel round trip. Prints the ratios (`cargo bench -p agent-loop --bench turn`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use tokio::runtime::Runtime as Tokio;
use tokio::sync::mpsc;

use agent::{AgentHandle, AgentOptions, AgentRuntime, CreateAgentOptions, Message};
use agent_loop::ScriptedModel;
use agent_loop::model::chunks;
use agent_loop::runtime::{ModelMap, Runtime};

/// Cycles run on one agent before it is replaced (its log, and so the derived history each
/// request carries, grows with every turn).
const CYCLES_PER_AGENT: u64 = 16;

struct Bench {
    runtime: Runtime,
    models: ModelMap,
    model: ScriptedModel,
    next_id: u64,
}

impl Bench {
    fn new() -> Self {
        let model = ScriptedModel::default();
        let models = ModelMap::new();
        let runtime = Runtime::builder()
            .models(std::sync::Arc::new(models.clone()))
            .build();
        Self {
            runtime,
            models,
            model,
            next_id: 0,
        }
    }

    async fn agent(&mut self) -> AgentHandle {
        // A fresh model per agent: the scripted model records every request.
        self.model = ScriptedModel::default();
        self.models.insert("bench", self.model.adapter());
        self.next_id += 1;
        let mut options = CreateAgentOptions::new(format!("bench-{}", self.next_id).into());
        options.agent_options = AgentOptions {
            provider: Some("bench".into()),
            model: Some("bench".into()),
            ..AgentOptions::default()
        };
        self.runtime
            .create(options)
            .await
            .expect("bench agent creation succeeds")
    }

    /// Times `iters` turn cycles (agent creation and disposal excluded).
    fn turn_cycles(&mut self, tokio: &Tokio, iters: u64) -> Duration {
        tokio.block_on(async {
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let handle = self.agent().await;
                let agent = handle.agent().clone();
                let n = CYCLES_PER_AGENT.min(iters - done);
                for _ in 0..n {
                    self.model.push(chunks::text("ok"));
                    let message = Message::user_text("go");
                    let start = Instant::now();
                    agent.followup(message).expect("the bench agent accepts work");
                    agent.when_idle().await;
                    total += start.elapsed();
                }
                done += n;
                handle.dispose().await;
            }
            total
        })
    }
}

fn spawn_join(tokio: &Tokio, iters: u64) -> Duration {
    tokio.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            black_box(tokio::spawn(async { black_box(1) }).await.unwrap());
        }
        start.elapsed()
    })
}

fn channel_round_trip(tokio: &Tokio, iters: u64) -> Duration {
    tokio.block_on(async {
        let (to_echo, mut from_caller) = mpsc::channel::<u64>(1);
        let (to_caller, mut from_echo) = mpsc::channel::<u64>(1);
        let echo = tokio::spawn(async move {
            while let Some(v) = from_caller.recv().await {
                if to_caller.send(v).await.is_err() {
                    break;
                }
            }
        });
        let start = Instant::now();
        for i in 0..iters {
            to_echo.send(i).await.unwrap();
            black_box(from_echo.recv().await.unwrap());
        }
        let elapsed = start.elapsed();
        drop(to_echo);
        echo.await.unwrap();
        elapsed
    })
}

fn tokio() -> Tokio {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds")
}

fn per_iter(d: Duration, iters: u64) -> f64 {
    d.as_secs_f64() * 1e9 / iters as f64
}

/// Measures all three in one run and prints the ratios.
fn ratios(_c: &mut Criterion) {
    const N: u64 = 2_000;
    let rt = tokio();
    let mut bench = Bench::new();
    // Warm up.
    bench.turn_cycles(&rt, 200);
    spawn_join(&rt, 1_000);
    channel_round_trip(&rt, 1_000);
    let turn = per_iter(bench.turn_cycles(&rt, N), N);
    let spawn = per_iter(spawn_join(&rt, N * 10), N * 10);
    let chan = per_iter(channel_round_trip(&rt, N * 10), N * 10);
    println!(
        "turn cycle: {turn:.0} ns; floors: spawn+join {spawn:.0} ns, channel round trip {chan:.0} ns; \
         ratio vs spawn+join {:.1}x, vs channel round trip {:.1}x",
        turn / spawn,
        turn / chan
    );
    rt.block_on(bench.runtime.shutdown());
}

fn criterion_benches(c: &mut Criterion) {
    let rt = tokio();
    let mut bench = Bench::new();
    c.bench_function("turn/idle-turn-idle", |b| {
        b.iter_custom(|iters| bench.turn_cycles(&rt, iters))
    });
    c.bench_function("floor/spawn-join", |b| {
        b.iter_custom(|iters| spawn_join(&rt, iters))
    });
    c.bench_function("floor/channel-round-trip", |b| {
        b.iter_custom(|iters| channel_round_trip(&rt, iters))
    });
    rt.block_on(bench.runtime.shutdown());
}

criterion_group!(benches, ratios, criterion_benches);
criterion_main!(benches);
