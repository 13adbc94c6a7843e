//! One idle → turn → idle cycle of a [`LoopAgent`](agent_loop::agent::LoopAgent) on an instant
//! scripted model, against floors measured in the same run: a bare tokio spawn+join and an
//! mpsc channel round trip. Prints the ratios and whether they meet the ≤ 20× target
//! (`cargo bench -p agent-loop --bench turn`).

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

/// The acceptance target: one cycle costs at most this many floors.
const TARGET_RATIO: f64 = 20.0;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Measures all three in one run and prints the ratios. The three are interleaved over several
/// rounds and each reported figure is the median of its rounds, so a burst of load on the
/// machine skews one round rather than one side of the ratio.
fn ratios(_c: &mut Criterion) {
    const ROUNDS: usize = 7;
    const N: u64 = 1_000;
    let rt = tokio();
    let mut bench = Bench::new();
    // Warm up.
    bench.turn_cycles(&rt, 200);
    spawn_join(&rt, 1_000);
    channel_round_trip(&rt, 1_000);
    let (mut turns, mut spawns, mut chans) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        turns.push(per_iter(bench.turn_cycles(&rt, N), N));
        spawns.push(per_iter(spawn_join(&rt, N * 10), N * 10));
        chans.push(per_iter(channel_round_trip(&rt, N * 10), N * 10));
    }
    let (turn, spawn, chan) = (median(turns), median(spawns), median(chans));
    let (vs_spawn, vs_chan) = (turn / spawn, turn / chan);
    let verdict = if vs_spawn.max(vs_chan) <= TARGET_RATIO {
        "met"
    } else {
        "NOT met"
    };
    println!(
        "turn cycle: {turn:.0} ns; floors: spawn+join {spawn:.0} ns, channel round trip {chan:.0} ns; \
         ratio vs spawn+join {vs_spawn:.1}x, vs channel round trip {vs_chan:.1}x \
         (target <= {TARGET_RATIO:.0}x: {verdict}; medians of {ROUNDS} interleaved rounds)"
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
