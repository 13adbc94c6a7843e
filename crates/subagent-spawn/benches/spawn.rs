//! One-shot delegation cost against its floor, measured in the same run.
//!
//! * `one_shot/floor_tokio_spawn_join` — spawning one tokio task and joining it: the least any
//!   task-based delegation must pay.
//! * `one_shot/spawn_start_result_dispose` — one `spawn` delegation through the service on the
//!   reference runtime: validation, child creation (setup window, publication), the child's one
//!   turn against an instant model, result derivation, and quiescent disposal.
//! * `fan_out/1000_children` — one parent starts 1,000 children concurrently, awaits every result
//!   and disposes every run (throughput in children per second).
//!
//! * `fan_out memory` (printed once, not timed) — live heap bytes, counted by a global
//!   allocator wrapper, before the fan-out, at its peak (every child published and settled, none
//!   disposed) and after every run is disposed: memory must return to the baseline.
//!
//! The figures to watch are `spawn_start_result_dispose ÷ floor_tokio_spawn_join` and the
//! fan-out's children per second. Benchmarks build with the workspace's `[profile.bench]` (fat
//! LTO, one codegen unit). For a noise-free ratio, count instructions of the same loop with
//! `examples/spawn_profile.rs` under callgrind (delegations vs `SPAWN_FLOOR=1`).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]
// The counting global allocator below needs `unsafe impl GlobalAlloc`; nothing else does.
#![allow(unsafe_code)]

use std::hint::black_box;
use std::sync::Arc;

use agent::{
    AgentOptions, AgentRuntime, ContentBlock, CreateAgentOptions, GenerateOptions, ModelAdapter, ModelStream,
    SessionId, Signal,
};
use agent_loop::model::chunks;
use agent_loop::runtime::Runtime;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures::StreamExt;
use subagent::provider::SubagentStartRequest;
use subagent::run::SubagentRun;
use subagent::service::SubagentService;
use subagent_inprocess::InProcessDriver;

/// Counts live heap bytes so the fan-out can report peak memory and its return to baseline.
struct CountingAlloc;

static LIVE_BYTES: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

// SAFETY: every call forwards to the system allocator unchanged; the counter is only arithmetic.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn live_bytes() -> isize {
    LIVE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// A model that answers every call at once with one short text.
struct InstantModel;

impl ModelAdapter for InstantModel {
    fn stream(&self, _: Arc<GenerateOptions>) -> ModelStream {
        futures::stream::iter(chunks::text("done").into_iter().map(Ok)).boxed()
    }
}

struct Bench {
    runtime: Runtime,
    service: SubagentService,
    parent: agent::AgentRef,
    _parent_handle: agent::AgentHandle,
    _provider: agent::Registration,
}

async fn host() -> Bench {
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
    let service = SubagentService::new();
    let driver = InProcessDriver::new(runtime.services().clone());
    let provider = subagent_spawn::register(&service, driver).expect("registered");
    Bench {
        parent: parent_handle.agent().clone(),
        runtime,
        service,
        _parent_handle: parent_handle,
        _provider: provider,
    }
}

async fn delegate_once(bench: &Bench) {
    let request = SubagentStartRequest::new(
        vec![ContentBlock::text("task")],
        bench.parent.clone(),
        Signal::new(),
    );
    let run = bench.service.start("spawn", request).await.expect("started");
    let result = run.result().await.expect("result");
    assert!(result.stop_reason.is_completed());
    run.dispose().await.expect("disposed");
    black_box(result);
}

async fn fan_out(bench: &Bench, n: usize) {
    let starts = (0..n).map(|_| {
        let request = SubagentStartRequest::new(
            vec![ContentBlock::text("task")],
            bench.parent.clone(),
            Signal::new(),
        );
        bench.service.start("spawn", request)
    });
    let runs: Vec<Box<dyn SubagentRun>> = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(|r| r.expect("started"))
        .collect();
    let results = futures::future::join_all(runs.iter().map(|r| r.result())).await;
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().is_ok_and(|r| r.stop_reason.is_completed()))
    );
    futures::future::join_all(runs.iter().map(|r| r.dispose())).await;
    assert_eq!(
        AgentRuntime::list(&bench.runtime).len(),
        1,
        "every child disposed"
    );
}

/// One untimed fan-out of `n` children, printing live heap bytes at baseline, peak and after
/// disposal.
async fn fan_out_memory(bench: &Bench, n: usize) {
    let baseline = live_bytes();
    let starts = (0..n).map(|_| {
        let request = SubagentStartRequest::new(
            vec![ContentBlock::text("task")],
            bench.parent.clone(),
            Signal::new(),
        );
        bench.service.start("spawn", request)
    });
    let runs: Vec<Box<dyn SubagentRun>> = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(|r| r.expect("started"))
        .collect();
    let _ = futures::future::join_all(runs.iter().map(|r| r.result())).await;
    let peak = live_bytes();
    futures::future::join_all(runs.iter().map(|r| r.dispose())).await;
    drop(runs);
    bench.service.close().await;
    let after = live_bytes();
    println!(
        "fan_out memory ({n} children): baseline {} KiB, peak {} KiB (+{} KiB, {} B/child), after dispose {} KiB ({:+} B vs baseline)",
        baseline / 1024,
        peak / 1024,
        (peak - baseline) / 1024,
        (peak - baseline) / n as isize,
        after / 1024,
        after - baseline
    );
}

fn bench_one_shot(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let bench = rt.block_on(host());
    // Warm up once so lazily-initialised statics are not counted as growth, then measure.
    rt.block_on(fan_out_memory(&bench, 10));
    rt.block_on(fan_out_memory(&bench, 1000));
    // A second round shows whether what stayed after the first is retained capacity (flat) or
    // a per-child leak (growing again).
    rt.block_on(fan_out_memory(&bench, 1000));
    let mut group = c.benchmark_group("one_shot");
    group.bench_function("floor_tokio_spawn_join", |b| {
        b.iter(|| {
            rt.block_on(async { black_box(tokio::spawn(async { black_box(1u8) }).await.expect("joined")) })
        })
    });
    group.bench_function("spawn_start_result_dispose", |b| {
        b.iter(|| rt.block_on(delegate_once(&bench)))
    });
    group.finish();

    let mut group = c.benchmark_group("fan_out");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1000));
    group.bench_function("1000_children", |b| b.iter(|| rt.block_on(fan_out(&bench, 1000))));
    group.finish();
    rt.block_on(async {
        bench.service.close().await;
        bench.runtime.shutdown().await;
    });
}

criterion_group!(benches, bench_one_shot);
criterion_main!(benches);
