//! Fan-out of 1,000 concurrent children from one parent: throughput and memory.
//!
//! * `fan_out/1000_children` — one parent starts 1,000 children concurrently, awaits every result
//!   and disposes every run (throughput in children per second).
//! * `fan_out/4000_children` — the same with 4,000: the cost per child should not grow with the
//!   number of siblings alive at once (`cargo xtask bench` prints the per-child ratio of the
//!   two).
//! * `fan_out memory` (printed, not timed) — live heap bytes, counted by a global allocator
//!   wrapper, before the fan-out, at its peak (every child published and settled, none disposed)
//!   and after every run is disposed: memory must return to the baseline. A second identical
//!   round tells retained capacity (flat) from a per-child leak (growing again). It also
//!   prints how many allocations one child costs, from start to disposal.
//!
//! The counting allocator adds an atomic add to every allocation, so the one-shot ratio is
//! measured in its own target (`benches/spawn.rs`) without it.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]
// The counting global allocator below needs `unsafe impl GlobalAlloc`; nothing else does.
#![allow(unsafe_code)]

mod common;

use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

use common::Bench;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use subagent::run::SubagentRun;

/// Counts live heap bytes so the fan-out can report peak memory and its return to baseline.
struct CountingAlloc;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator unchanged; the counter is only arithmetic.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Starts `n` children at once and returns their runs once every one has started.
async fn start_many(bench: &Bench, n: usize) -> Vec<Box<dyn SubagentRun>> {
    futures::future::join_all((0..n).map(|_| bench.service.start("spawn", bench.request())))
        .await
        .into_iter()
        .map(|r| r.expect("started"))
        .collect()
}

async fn fan_out(bench: &Bench, n: usize) {
    let runs = start_many(bench, n).await;
    let results = futures::future::join_all(runs.iter().map(|r| r.result())).await;
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().is_ok_and(|r| r.stop_reason.is_completed()))
    );
    futures::future::join_all(runs.iter().map(|r| r.dispose())).await;
    assert_eq!(bench.live_agents(), 1, "every child disposed");
}

/// One untimed fan-out of `n` children, printing live heap bytes at baseline, peak and after
/// disposal, and the allocations per child.
async fn fan_out_memory(bench: &Bench, n: usize) {
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    let baseline = live_bytes();
    let runs = start_many(bench, n).await;
    let _ = futures::future::join_all(runs.iter().map(|r| r.result())).await;
    let peak = live_bytes();
    futures::future::join_all(runs.iter().map(|r| r.dispose())).await;
    drop(runs);
    bench.service.close().await;
    let after = live_bytes();
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - allocations;
    println!(
        "fan_out memory ({n} children): baseline {} KiB, peak {} KiB (+{} KiB, {} B/child), after dispose {} KiB ({:+} B vs baseline); {} allocations/child",
        baseline / 1024,
        peak / 1024,
        (peak - baseline) / 1024,
        (peak - baseline) / n as isize,
        after / 1024,
        after - baseline,
        allocations / n
    );
}

fn bench_fan_out(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let bench = rt.block_on(Bench::new());
    // Warm up once so lazily-initialised statics are not counted as growth, then measure.
    rt.block_on(fan_out_memory(&bench, 10));
    rt.block_on(fan_out_memory(&bench, 1000));
    rt.block_on(fan_out_memory(&bench, 1000));
    let mut group = c.benchmark_group("fan_out");
    group.sample_size(10);
    group.throughput(Throughput::Elements(1000));
    group.bench_function("1000_children", |b| b.iter(|| rt.block_on(fan_out(&bench, 1000))));
    // Four times the children alive at once: with nothing scanning its siblings, each child
    // costs about what it costs among 1,000 (`cargo xtask bench` prints the ratio per child).
    group.throughput(Throughput::Elements(4000));
    group.measurement_time(std::time::Duration::from_secs(10));
    group.bench_function("4000_children", |b| b.iter(|| rt.block_on(fan_out(&bench, 4000))));
    group.finish();
    rt.block_on(bench.close());
}

criterion_group!(benches, bench_fan_out);
criterion_main!(benches);
