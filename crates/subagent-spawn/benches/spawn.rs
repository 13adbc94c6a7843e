//! One-shot delegation cost against its floor, measured in the same run.
//!
//! * `one_shot/floor_tokio_spawn_join` — spawning one tokio task and joining it: the least any
//!   task-based delegation must pay.
//! * `one_shot/spawn_start_result_dispose` — one `spawn` delegation through the service on the
//!   reference runtime: validation, child creation (setup window, publication), the child's one
//!   turn against an instant model, result derivation, and quiescent disposal.
//! * `one_shot/bare_runtime_create_turn_dispose` — the reference runtime's share of that
//!   delegation with no seam at all: create an agent on the same instant model, give it the task,
//!   wait for its one turn, dispose of it. No provider can cost less than this row; the
//!   difference to the row above is the seam's and the driver's share.
//!
//! The figure to watch is `spawn_start_result_dispose ÷ floor_tokio_spawn_join` (`cargo xtask
//! bench` prints it). Both run on the system allocator, as a host would: the fan-out's
//! byte-counting allocator lives in its own target (`benches/fan_out.rs`) so its atomic counter
//! is not charged to every allocation here. Benchmarks build with the workspace's
//! `[profile.bench]` (fat LTO, one codegen unit). For a noise-free ratio, count instructions of
//! the same loop with `examples/spawn_profile.rs` under callgrind (delegations vs
//! `SPAWN_FLOOR=1`).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

mod common;

use std::hint::black_box;

use common::Bench;
use criterion::{Criterion, criterion_group, criterion_main};

fn bench_one_shot(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let bench = rt.block_on(Bench::new());
    let mut group = c.benchmark_group("one_shot");
    group.bench_function("floor_tokio_spawn_join", |b| {
        b.iter(|| {
            rt.block_on(async { black_box(tokio::spawn(async { black_box(1u8) }).await.expect("joined")) })
        })
    });
    group.bench_function("spawn_start_result_dispose", |b| {
        b.iter(|| rt.block_on(async { black_box(bench.delegate_once().await) }))
    });
    let mut cycle = 0u64;
    group.bench_function("bare_runtime_create_turn_dispose", |b| {
        b.iter(|| {
            cycle += 1;
            rt.block_on(bench.bare_cycle(agent::SessionId::new(format!("bare-{cycle}"))))
        })
    });
    group.finish();
    assert_eq!(bench.live_agents(), 1, "every child disposed");
    rt.block_on(bench.close());
}

criterion_group!(benches, bench_one_shot);
criterion_main!(benches);
