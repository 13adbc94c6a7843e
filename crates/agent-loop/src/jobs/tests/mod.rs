//! Tests of the job registry, the job tools and their model-visible texts.
//!
//! Every rule of `acp-and-tools.md` §3.8 ("Job registry rules") has a test here. All run on
//! tokio's paused clock (or, for one cross-thread race, a multi-thread runtime with no timers);
//! none sleeps for real.

mod model_text;
mod registry;
mod robust;
mod tools;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use agent::ids::SessionId;
use agent::jobs::{JobHooks, JobOutcome, JobSpec, JobStatus};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::{JobCounts, JobNotice, JobRegistry};

/// What a test producer does when its `cancel` hook is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OnCancel {
    /// Records the reason only; the test settles `done` itself.
    Record,
    /// Records the reason and settles `killed`.
    Kill,
    /// Panics (a misbehaving producer).
    Panic,
}

/// The test's side of a controllable producer.
#[derive(Clone)]
pub(super) struct Producer {
    /// How many times the starter ran.
    pub started: Arc<AtomicUsize>,
    /// Reasons passed to `cancel`, in order.
    pub cancels: Arc<Mutex<Vec<Option<String>>>>,
    /// Set once `done` has released its resources (just before resolving).
    pub released: Arc<AtomicBool>,
    tx: Arc<Mutex<Option<oneshot::Sender<JobOutcome>>>>,
}

impl Producer {
    /// Settles `done` with `outcome` (after the configured release delay). `false` if it had
    /// already been settled.
    pub fn settle(&self, outcome: JobOutcome) -> bool {
        match self.tx.lock().take() {
            Some(tx) => tx.send(outcome).is_ok(),
            None => false,
        }
    }

    pub fn cancels(&self) -> Vec<Option<String>> {
        self.cancels.lock().clone()
    }

    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    pub fn released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }
}

/// A producer spec: `on_cancel` decides what `cancel` does; `release` is how long `done` takes to
/// release its resources once its outcome is decided (paused clock).
pub(super) fn producer_with(
    kind: &str,
    label: &str,
    owner: &str,
    on_cancel: OnCancel,
    release: Duration,
) -> (JobSpec, Producer) {
    let (tx, rx) = oneshot::channel();
    let producer = Producer {
        started: Arc::default(),
        cancels: Arc::default(),
        released: Arc::default(),
        tx: Arc::new(Mutex::new(Some(tx))),
    };
    let p = producer.clone();
    let spec = JobSpec {
        kind: kind.to_owned(),
        label: label.to_owned(),
        owner: SessionId::from(owner),
        starter: Box::new(move || {
            p.started.fetch_add(1, Ordering::SeqCst);
            let cancel_side = p.clone();
            let released = p.released.clone();
            JobHooks {
                cancel: Box::new(move |reason| {
                    cancel_side.cancels.lock().push(reason);
                    match on_cancel {
                        OnCancel::Record => {}
                        OnCancel::Kill => {
                            cancel_side.settle(killed());
                        }
                        OnCancel::Panic => panic!("cancel exploded"),
                    }
                }),
                done: Box::pin(async move {
                    let outcome = rx.await.unwrap_or_else(|_| failed("producer dropped"));
                    if !release.is_zero() {
                        tokio::time::sleep(release).await;
                    }
                    released.store(true, Ordering::SeqCst);
                    outcome
                }),
            }
        }),
    };
    (spec, producer)
}

/// A producer whose `cancel` only records.
pub(super) fn producer(kind: &str, label: &str, owner: &str) -> (JobSpec, Producer) {
    producer_with(kind, label, owner, OnCancel::Record, Duration::ZERO)
}

/// A producer whose `cancel` settles `killed`.
pub(super) fn killable(kind: &str, label: &str, owner: &str) -> (JobSpec, Producer) {
    producer_with(kind, label, owner, OnCancel::Kill, Duration::ZERO)
}

pub(super) fn completed(output: &str) -> JobOutcome {
    JobOutcome {
        status: JobStatus::Completed,
        output: Some(output.to_owned()),
        detail: None,
    }
}

pub(super) fn failed(detail: &str) -> JobOutcome {
    JobOutcome {
        status: JobStatus::Failed,
        output: None,
        detail: Some(detail.to_owned()),
    }
}

pub(super) fn killed() -> JobOutcome {
    JobOutcome {
        status: JobStatus::Killed,
        output: None,
        detail: None,
    }
}

/// Lets spawned tasks run until they block (paused clock: never advances time by itself).
pub(super) async fn settle_tasks() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// Records every notice the registry emits.
pub(super) fn record_notices(registry: &JobRegistry) -> (Arc<Mutex<Vec<JobNotice>>>, agent::Registration) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let guard = registry.notices().on(move |notice: &JobNotice| {
        sink.lock().push(notice.clone());
        Ok(())
    });
    (seen, guard)
}

/// Shuts the registry down and asserts that nothing is left.
pub(super) async fn assert_ends_empty(registry: &JobRegistry) {
    registry.shutdown().await;
    assert_eq!(registry.counts(), JobCounts::default());
    assert!(registry.counts().is_empty());
}
