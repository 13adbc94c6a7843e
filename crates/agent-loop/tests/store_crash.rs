//! Property: a JSON-lines log cut at any byte of its last write (or anywhere after its last
//! durability checkpoint) still loads, keeps every flushed event intact, and yields a prefix of
//! what was written; appending then resumes after that prefix.

mod common;

use std::fs;

use agent::{ContentBlock, EventData, Message, SessionEvent, SessionId, TurnEndReason};
use agent_loop::store::JsonlStore;
use common::{LogBuilder, assistant, header};
use proptest::prelude::*;
use serde_json::json;

#[derive(Clone, Debug)]
enum Op {
    Note(String),
    User(String),
    Assistant(String),
    Turn,
}

fn op() -> impl Strategy<Value = Op> {
    let text = "\\PC{0,24}";
    prop_oneof![
        text.prop_map(Op::Note),
        text.prop_map(Op::User),
        text.prop_map(Op::Assistant),
        Just(Op::Turn),
    ]
}

fn build(ops: &[Op]) -> Vec<SessionEvent> {
    let mut b = LogBuilder::new("s");
    let mut turn = 0;
    for op in ops {
        match op {
            Op::Note(t) => {
                b.push(EventData::other("test/note", json!({"text": t, "n": 1.5})));
            }
            Op::User(t) => {
                b.push(EventData::UserMessage(Message::user_text(t.clone())));
            }
            Op::Assistant(t) => {
                b.push(assistant(turn, 1, vec![ContentBlock::text(t.clone())]));
            }
            Op::Turn => {
                turn += 1;
                b.push(EventData::TurnStart { turn });
                b.push(EventData::TurnEnd {
                    turn,
                    reason: TurnEndReason::Completed,
                });
            }
        }
    }
    b.events()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn a_cut_anywhere_after_the_last_flush_loads_a_prefix_with_every_flushed_event(
        ops in prop::collection::vec(op(), 1..12),
        flushed_fraction in 0.0f64..1.0,
        resume_probe in any::<prop::sample::Index>(),
        earlier_cuts in prop::collection::vec(any::<prop::sample::Index>(), 8),
    ) {
        let events = build(&ops);
        let flushed = ((events.len() as f64) * flushed_fraction) as usize;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let id = SessionId::from("s");
        let rt = runtime();
        rt.block_on(async {
            let store = JsonlStore::new(dir.path());
            store.create(&header("s")).unwrap();
            for ev in &events[..flushed] {
                store.append(&id, ev).unwrap();
            }
            store.flush(&id).await.unwrap();
            for ev in &events[flushed..] {
                store.append(&id, ev).unwrap();
            }
            // Hand the rest to the OS without a checkpoint.
            store.close(&id).await.unwrap();
        });
        let full = fs::read(&path).unwrap();
        // Byte offsets of line starts: the header, then one line per event.
        let starts: Vec<usize> = std::iter::once(0)
            .chain(full.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i + 1))
            .collect();
        prop_assert_eq!(starts.len(), events.len() + 2);
        let flushed_len = starts[1 + flushed];
        let last_write_start = starts[events.len()];
        let probe = resume_probe.index(full.len() - flushed_len + 1) + flushed_len;
        let cut_dir = tempfile::tempdir().unwrap();
        let cut_path = cut_dir.path().join("s.jsonl");
        // Every byte of the last write, plus a sample of cuts between the flush and it.
        let mut cuts: Vec<usize> = (last_write_start..=full.len()).collect();
        cuts.extend(
            earlier_cuts
                .iter()
                .map(|i| flushed_len + i.index(last_write_start - flushed_len + 1)),
        );
        cuts.push(probe);
        cuts.sort_unstable();
        cuts.dedup();
        for cut in cuts {
            fs::write(&cut_path, &full[..cut]).unwrap();
            let loaded = rt.block_on(JsonlStore::new(cut_dir.path()).load(&id));
            let loaded = match loaded {
                Ok(l) => l,
                Err(e) => return Err(TestCaseError::fail(format!("cut at {cut}: {e}"))),
            };
            prop_assert_eq!(&loaded.header, &header("s"));
            prop_assert!(loaded.events.len() >= flushed, "cut at {}: lost flushed events", cut);
            prop_assert!(loaded.events.len() <= events.len());
            prop_assert_eq!(&loaded.events[..], &events[..loaded.events.len()]);
            // Cutting inside the last write loses at most that write's event.
            if cut >= last_write_start {
                prop_assert!(loaded.events.len() + 1 >= events.len());
            }
            if cut == probe {
                // The store resumes appending after the intact prefix.
                let resumed = rt.block_on(async {
                    let store = JsonlStore::new(cut_dir.path());
                    store.load(&id).await.unwrap();
                    for ev in &events[loaded.events.len()..] {
                        store.append(&id, ev).unwrap();
                    }
                    store.close(&id).await.unwrap();
                    JsonlStore::new(cut_dir.path()).load(&id).await.unwrap()
                });
                prop_assert!(!resumed.repaired);
                prop_assert_eq!(&resumed.events, &events);
            }
        }
    }
}
