//! How much of the parent's history the fork provider copies (spec `inprocess-providers.md` §5.1,
//! §5.5; the `PrepareContinuable` contract): a request that is refused because its signal is
//! already cancelled must not copy the parent's history first.
//!
//! Heap bytes are counted per thread by a wrapper around the system allocator, so the count
//! covers exactly what the test's own (current-thread, paused-clock) runtime allocates between
//! two points, whatever other test threads do.

// The counting global allocator below needs `unsafe impl GlobalAlloc`; nothing else does.
#![allow(unsafe_code)]

#[path = "../../subagent-inprocess/tests/common/mod.rs"]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use agent::{CancelCause, Signal};
use agent_loop::model::chunks;
use common::*;
use subagent::SubagentErrorCode;
use subagent::capabilities::ContinuableCreateRequest;
use subagent::provider::SubagentProvider;
use subagent_fork::{DEFAULT_NAME, ForkProvider};

/// Counts the bytes allocated on each thread.
struct Counting;

thread_local! {
    static ALLOCATED: Cell<usize> = const { Cell::new(0) };
}

fn count(bytes: usize) {
    // `try_with`: the slot may already be gone while the thread exits.
    let _ = ALLOCATED.try_with(|c| c.set(c.get().saturating_add(bytes)));
}

// SAFETY: every call forwards to the system allocator unchanged; the counter is only arithmetic
// on a const-initialised thread-local that never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Bytes allocated on this thread while `f`'s future runs to completion.
async fn allocated_by<T>(f: impl Future<Output = T>) -> (T, usize) {
    let before = ALLOCATED.with(Cell::get);
    let out = f.await;
    (out, ALLOCATED.with(Cell::get) - before)
}

/// The size of the parent's one prompt: its completed-turn prefix holds at least this much.
const PROMPT_BYTES: usize = 4 << 20;

/// A host whose parent completed one turn with a [`PROMPT_BYTES`] prompt.
async fn long_history() -> Host {
    let host = Host::new(vec![chunks::text("parent answer").into()]).await;
    host.parent_turn(&"x".repeat(PROMPT_BYTES)).await;
    let seed = subagent_fork::completed_turn_prefix(&host.parent).expect("seeded");
    assert!(serde_json::to_string(&seed).unwrap().len() >= PROMPT_BYTES);
    host
}

/// spec: §3.2 step 2, §5.1 — a start whose request signal is already cancelled is refused at
/// call time with nothing created; the fork must not copy the parent's (here 4 MiB) history
/// into a seed the driver then drops. The refusal itself is unchanged.
#[tokio::test(start_paused = true)]
async fn a_cancelled_start_does_not_copy_the_parents_history() {
    let host = long_history().await;
    let provider = ForkProvider::new(host.driver.clone());
    let request = resolve(
        request_from(&host.parent, Signal::cancelled_with(CancelCause::User)),
        DEFAULT_NAME,
    );
    let (result, bytes) = allocated_by(async { provider.start(request).await }).await;
    let err = result.err().expect("a cancelled start is refused");
    assert_eq!(err.code(), SubagentErrorCode::Cancelled);
    assert_eq!(err.message(), subagent_inprocess::ABORTED_BEFORE_PUBLICATION);
    assert!(
        bytes < PROMPT_BYTES / 4,
        "a refused start allocated {bytes} bytes: the parent's history was copied"
    );
    assert_eq!((host.agent_count(), host.session_count()), (1, 1));
    host.finish().await;
}

/// spec: §5.5, seam §2.14.3 (the `PrepareContinuable` contract: the preparation observes the
/// request signal) — an already-cancelled continuable preparation rejects with `CANCELLED`
/// instead of returning a seed, and copies nothing of the parent's history.
#[tokio::test(start_paused = true)]
async fn a_cancelled_continuable_preparation_rejects_without_copying() {
    let host = long_history().await;
    let provider = ForkProvider::new(host.driver.clone());
    let request = ContinuableCreateRequest {
        session_id: "reserved".into(),
        parent: host.parent.clone(),
        signal: Signal::cancelled_with(CancelCause::User),
    };
    let prepare = provider.continuable().expect("continuable preparation present");
    let (result, bytes) = allocated_by(prepare.prepare_continuable(request)).await;
    let err = result.expect_err("a cancelled preparation is refused");
    assert_eq!(err.code(), SubagentErrorCode::Cancelled);
    assert!(
        bytes < PROMPT_BYTES / 4,
        "a refused preparation allocated {bytes} bytes: the parent's history was copied"
    );
    host.finish().await;
}

/// spec: §5.1, §5.3 — the counterpart: a live start seeds the child with the whole prefix
/// (the large prompt included) and finishes normally.
#[tokio::test(start_paused = true)]
async fn a_live_start_still_seeds_the_whole_prefix() {
    let host = long_history().await;
    host.model.push(chunks::text("child answer"));
    let provider = ForkProvider::new(host.driver.clone());
    let at_call = host.parent.session().len();
    let run = provider
        .start(resolve(host.request(), DEFAULT_NAME))
        .await
        .expect("started");
    run.result().await.unwrap();
    let child = run.local_agent().unwrap();
    assert_eq!(child.session().header().seed_length, Some(at_call as u64));
    run.dispose().await.unwrap();
    host.finish().await;
}
