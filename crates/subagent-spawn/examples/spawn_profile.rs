//! A fixed number of one-shot `spawn` delegations (start → result → dispose) on an instant model,
//! for profilers (`valgrind --tool=callgrind`, `perf stat -e instructions`): the loop of
//! `benches/spawn.rs` without criterion. `SPAWN_DELEGATIONS` (default 2000) sets the count; it
//! prints the mean wall time. With `SPAWN_FLOOR` set it runs the benchmark's floor instead (one
//! `block_on` of a tokio spawn + join per iteration), so the two instruction counts give the
//! benchmark's ratio without timing noise:
//!
//! ```text
//! cargo build --profile bench -p subagent-spawn --example spawn_profile
//! valgrind --tool=callgrind target/release/examples/spawn_profile              # delegations
//! SPAWN_FLOOR=1 valgrind --tool=callgrind target/release/examples/spawn_profile # floor
//! SPAWN_BARE=1 valgrind --tool=callgrind target/release/examples/spawn_profile  # runtime alone
//! ```
//!
//! Atomic read-modify-writes (reference counts, mutexes) cost more than their instruction count
//! shows; `xtask/locked_rmw.py` counts them per delegation from a per-instruction profile:
//!
//! ```text
//! valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=cg.out target/release/examples/spawn_profile
//! python3 xtask/locked_rmw.py cg.out target/release/examples/spawn_profile 2000
//! ```
//!
//! `SPAWN_BARE` runs what a delegation costs the reference runtime alone, without the seam:
//! create an agent on the same instant model, give it the task, wait for its one turn, dispose
//! of it. The difference to a delegation is the seam's and the driver's share.
//!
//! `SPAWN_FAN_OUT=n` runs `SPAWN_DELEGATIONS` rounds of a fan-out of `n` concurrent children
//! from the one parent (start all, await every result, dispose all) and prints the time per
//! child, which should stay flat as `n` grows (a per-parent structure scanned per child would
//! make it grow linearly):
//!
//! ```text
//! for n in 10 100 1000 4000; do SPAWN_FAN_OUT=$n SPAWN_DELEGATIONS=$((8000/n)) target/release/examples/spawn_profile; done
//! ```

#[path = "../benches/common/mod.rs"]
mod common;

use std::time::Instant;

use common::Bench;

fn main() {
    let delegations: u64 = std::env::var("SPAWN_DELEGATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime builds");
    if std::env::var_os("SPAWN_FLOOR").is_some() {
        // The benchmark's floor, iteration for iteration: one `block_on` of a tokio spawn + join.
        let start = Instant::now();
        for _ in 0..delegations {
            rt.block_on(async { std::hint::black_box(tokio::spawn(async { 1u8 }).await.expect("joined")) });
        }
        println!(
            "{delegations} floor iterations, {:.0} ns per iteration",
            start.elapsed().as_secs_f64() * 1e9 / delegations as f64
        );
        return;
    }
    let bench = rt.block_on(Bench::new());
    if let Some(n) = std::env::var("SPAWN_FAN_OUT").ok().and_then(|v| v.parse().ok()) {
        fan_out(&rt, &bench, n, delegations);
        rt.block_on(bench.close());
        return;
    }
    if std::env::var_os("SPAWN_BARE").is_some() {
        bare(&rt, &bench, delegations);
        rt.block_on(bench.close());
        return;
    }
    // One `block_on` per delegation, as in the benchmark.
    let start = Instant::now();
    for _ in 0..delegations {
        rt.block_on(bench.delegate_once());
    }
    let elapsed = start.elapsed();
    assert_eq!(bench.live_agents(), 1, "every child disposed");
    rt.block_on(bench.close());
    println!(
        "{delegations} delegations, {:.0} ns per delegation",
        elapsed.as_secs_f64() * 1e9 / delegations as f64
    );
}

/// The reference runtime's share of a delegation: create → one turn → dispose, per `block_on`.
fn bare(rt: &tokio::runtime::Runtime, bench: &Bench, cycles: u64) {
    let start = Instant::now();
    for i in 0..cycles {
        rt.block_on(bench.bare_cycle(agent::SessionId::new(format!("child-{i}"))));
    }
    let elapsed = start.elapsed();
    assert_eq!(bench.live_agents(), 1, "every child disposed");
    println!(
        "{cycles} bare runtime cycles, {:.0} ns per cycle",
        elapsed.as_secs_f64() * 1e9 / cycles as f64
    );
}

/// `rounds` fan-outs of `n` concurrent children from the one parent (start all, await every
/// result, dispose all), printing the mean time per child: constant across `n` unless some
/// per-parent structure grows superlinearly.
fn fan_out(rt: &tokio::runtime::Runtime, bench: &Bench, n: usize, rounds: u64) {
    use subagent::run::SubagentRun;
    let start = Instant::now();
    for _ in 0..rounds {
        rt.block_on(async {
            let runs: Vec<Box<dyn SubagentRun>> =
                futures::future::join_all((0..n).map(|_| bench.service.start("spawn", bench.request())))
                    .await
                    .into_iter()
                    .map(|r| r.expect("started"))
                    .collect();
            for result in futures::future::join_all(runs.iter().map(|r| r.result())).await {
                assert!(result.expect("result").stop_reason.is_completed());
            }
            futures::future::join_all(runs.iter().map(|r| r.dispose())).await;
        });
    }
    let elapsed = start.elapsed();
    assert_eq!(bench.live_agents(), 1, "every child disposed");
    println!(
        "{rounds} fan-outs of {n} children, {:.0} ns per child",
        elapsed.as_secs_f64() * 1e9 / (rounds as f64 * n as f64)
    );
}
