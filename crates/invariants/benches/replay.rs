//! Replay throughput against its floor, measured in the same run.
//!
//! * `floor/serde_value` — parsing the log's bytes, line by line, into `Vec<serde_json::Value>`:
//!   the least any JSON-lines reader must do.
//! * `replay/jsonl` — the offline reader: typed parse of every line plus every per-log rule.
//! * `replay/engine_only` — the rule engine alone over already-parsed events.
//!
//! The figure to watch is `replay/jsonl ÷ floor/serde_value` (both report bytes per second over
//! the same bytes).

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use agent::{SessionEvent, SessionId};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use invariants::{SessionReplay, replay_jsonl_reader, synthetic};
use serde_json::Value;

fn bench_replay(c: &mut Criterion) {
    // 1500 turns of three steps with two tool calls per non-final step: ~40k events.
    let log = synthetic::valid_log("bench", 1500, 3, 2);
    let text = log.to_jsonl();
    let bytes = text.as_bytes();
    let id = SessionId::new("bench");
    let report = replay_jsonl_reader(&id, bytes).expect("in-memory reads do not fail");
    assert!(report.is_clean(), "the synthetic log must be valid");
    assert_eq!(report.events, log.events.len() as u64);

    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.sample_size(20);
    group.bench_function("floor/serde_value", |b| {
        b.iter(|| {
            let values: Vec<Value> = black_box(bytes)
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| serde_json::from_slice(l).expect("valid JSON"))
                .collect();
            black_box(values)
        })
    });
    group.bench_function("replay/jsonl", |b| {
        b.iter(|| black_box(replay_jsonl_reader(&id, black_box(bytes)).expect("in-memory reads do not fail")))
    });
    let events: Vec<SessionEvent> = log.events.clone();
    group.bench_function("replay/engine_only", |b| {
        b.iter(|| {
            let mut replay = SessionReplay::with_header(&log.header);
            for ev in black_box(&events) {
                black_box(replay.push(ev));
            }
            black_box(replay.finish())
        })
    });
    group.finish();
}

criterion_group!(benches, bench_replay);
criterion_main!(benches);
