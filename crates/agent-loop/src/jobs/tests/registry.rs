//! The job registry rules (`acp-and-tools.md` §3.8).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::CancelCause;
use agent::ids::SessionId;
use agent::jobs::{DEFAULT_JOB_LIMIT, JobError, JobHooks, JobId, JobOutcome, JobSpec, JobStatus, Jobs};
use agent::message::{MessageSource, PluginForm};
use agent::signal::Signal;
use futures::poll;
use parking_lot::Mutex;

use super::{
    OnCancel, assert_ends_empty, completed, failed, killable, killed, producer, producer_with,
    record_notices, settle_tasks,
};
use crate::jobs::{JobCounts, JobRegistry, JobRegistryConfig, KillOutcome, model_text};

fn id(s: &str) -> JobId {
    JobId(s.to_owned())
}

fn owner(s: &str) -> SessionId {
    SessionId::from(s)
}

fn limited(limit: usize) -> JobRegistry {
    JobRegistry::with_config(JobRegistryConfig {
        limit,
        ..JobRegistryConfig::default()
    })
}

#[tokio::test(start_paused = true)]
async fn ids_are_numbered_per_kind_from_one() {
    let registry = JobRegistry::new();
    let mut producers = Vec::new();
    for kind in ["bash", "subagent", "bash", "subagent", "bash"] {
        let (spec, p) = killable(kind, "x", "a");
        producers.push(p);
        registry.start(spec).unwrap();
    }
    let ids: Vec<String> = registry.list(&owner("a")).into_iter().map(|j| j.id.0).collect();
    assert_eq!(ids, ["bash-1", "subagent-1", "bash-2", "subagent-2", "bash-3"]);
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn refused_preflight_never_calls_the_starter_and_allocates_no_id() {
    let registry = limited(1);
    let (first, p1) = producer("bash", "first", "a");
    assert_eq!(registry.start(first).unwrap(), id("bash-1"));

    let (second, p2) = producer("bash", "second", "a");
    let err = registry.start(second).unwrap_err();
    assert_eq!(err, JobError::LimitReached(1));
    assert_eq!(p2.started(), 0, "a refused preflight leaves no work");
    assert_eq!(
        registry.counts(),
        JobCounts {
            jobs: 1,
            active: 1,
            tasks: 1,
            ..JobCounts::default()
        }
    );

    // The refused start consumed no id: the next admitted start is `bash-2`.
    p1.settle(completed("ok"));
    settle_tasks().await;
    let (third, p3) = producer("bash", "third", "a");
    assert_eq!(registry.start(third).unwrap(), id("bash-2"));
    assert_eq!(p3.started(), 1);
    p3.settle(completed("ok"));
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn the_limit_counts_running_and_stopping_jobs_per_owner_and_renders_its_text() {
    let registry = JobRegistry::new();
    assert_eq!(registry.limit(), DEFAULT_JOB_LIMIT);
    let mut producers = Vec::new();
    for _ in 0..DEFAULT_JOB_LIMIT {
        let (spec, p) = producer("bash", "sleep", "a");
        registry.start(spec).unwrap();
        producers.push(p);
    }
    let (spec, refused) = producer("bash", "sleep", "a");
    let err = registry.start(spec).unwrap_err();
    assert_eq!(
        err.to_string(),
        "background job limit reached for this owner (limit: 10); use job_kill to stop an unneeded job, \
         wait for it to finish, then retry"
    );
    assert_eq!(refused.started(), 0);

    // Another owner has its own bucket.
    let (spec, other) = producer("bash", "sleep", "b");
    assert_eq!(registry.start(spec).unwrap(), id("bash-11"));

    // A stopping job still occupies its slot until the producer settles.
    registry.kill(&owner("a"), &id("bash-1"), None).unwrap();
    assert_eq!(
        registry.get(&owner("a"), &id("bash-1")).unwrap().status,
        JobStatus::Stopping
    );
    let (spec, _) = producer("bash", "sleep", "a");
    assert_eq!(registry.start(spec).unwrap_err(), JobError::LimitReached(10));

    producers[0].settle(killed());
    settle_tasks().await;
    let (spec, admitted) = producer("bash", "sleep", "a");
    assert_eq!(registry.start(spec).unwrap(), id("bash-12"));

    for p in producers.iter().chain([&other, &admitted]) {
        p.settle(completed(""));
    }
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_controller_must_serve_the_owner_when_required() {
    let registry = JobRegistry::with_config(JobRegistryConfig {
        require_controller: true,
        ..JobRegistryConfig::default()
    });
    let (spec, p) = producer("subagent", "research", "a");
    let err = registry.start(spec).unwrap_err();
    assert_eq!(err, JobError::NoController);
    assert!(err.to_string().contains("no job controller serves this agent"));
    assert_eq!(p.started(), 0);

    // A controller for another owner does not serve `a`; one for `a` does.
    let other = registry.attach_controller(Some(owner("b")));
    let (spec, p) = producer("subagent", "research", "a");
    assert_eq!(registry.start(spec).unwrap_err(), JobError::NoController);
    assert_eq!(p.started(), 0);
    let own = registry.attach_controller(Some(owner("a")));
    let (spec, p) = killable("subagent", "research", "a");
    assert_eq!(registry.start(spec).unwrap(), id("subagent-1"));
    drop(own);
    drop(other);

    // Detaching the last controller re-arms the fence; a global one serves everyone.
    let (spec, _) = producer("subagent", "research", "a");
    assert_eq!(registry.start(spec).unwrap_err(), JobError::NoController);
    let global = registry.attach_controller(None);
    let (spec, q) = killable("subagent", "research", "z");
    assert_eq!(registry.start(spec).unwrap(), id("subagent-2"));
    drop(global);

    p.settle(completed(""));
    q.settle(completed(""));
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn an_owner_the_probe_reports_dead_is_refused_before_the_starter() {
    let registry = JobRegistry::with_config(JobRegistryConfig {
        owner_probe: Some(Arc::new(|o: &SessionId| o.as_str() == "live")),
        ..JobRegistryConfig::default()
    });
    let (spec, p) = producer("bash", "x", "dead");
    let err = registry.start(spec).unwrap_err();
    assert_eq!(err, JobError::OwnerDisposed);
    assert_eq!(
        err.to_string(),
        "background jobs unavailable: the owning agent is disposed"
    );
    assert_eq!(p.started(), 0);
    let (spec, p) = producer("bash", "x", "live");
    registry.start(spec).unwrap();
    p.settle(completed(""));
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_starter_releases_its_reservation_and_registers_nothing() {
    let registry = limited(1);
    let spec = JobSpec {
        kind: "bash".into(),
        label: "boom".into(),
        owner: owner("a"),
        starter: Box::new(|| panic!("starter exploded")),
    };
    let result = catch_unwind(AssertUnwindSafe(|| registry.start(spec)));
    assert!(result.is_err(), "the starter's panic reaches its caller");
    assert!(registry.counts().is_empty());
    // The slot is free again and no id was consumed.
    let (spec, p) = producer("bash", "x", "a");
    assert_eq!(registry.start(spec).unwrap(), id("bash-1"));
    p.settle(completed(""));
    assert_ends_empty(&registry).await;
}

/// A start outside a tokio runtime is refused with the truthful error (no runtime to run the
/// job on), not as a missing controller.
#[test]
fn start_outside_a_runtime_is_refused_without_calling_the_starter() {
    let registry = JobRegistry::new();
    let (spec, p) = producer("bash", "x", "a");
    let err = registry.start(spec).unwrap_err();
    assert_eq!(err, JobError::NoRuntime);
    assert_eq!(
        err.to_string(),
        "background jobs unavailable: a job needs a tokio runtime to run on, and this call was made outside one"
    );
    assert_eq!(p.started(), 0);
    assert!(registry.counts().is_empty());
}

#[tokio::test(start_paused = true)]
async fn access_is_fenced_by_owner_and_foreign_jobs_read_as_absent() {
    let registry = JobRegistry::new();
    let (spec, p) = producer("bash", "secret", "alice");
    registry.start(spec).unwrap();
    let bob = owner("bob");
    let job = id("bash-1");
    let not_found = JobError::NotFound(job.clone());
    assert_eq!(not_found.to_string(), "no job bash-1 for this agent");

    assert!(registry.list(&bob).is_empty());
    assert_eq!(registry.get(&bob, &job).unwrap_err(), not_found);
    assert_eq!(registry.read_job(&bob, &job).unwrap_err(), not_found);
    assert_eq!(registry.kill(&bob, &job, None).unwrap_err(), not_found);
    assert_eq!(
        registry.read(&bob, &job, true, &Signal::new()).await.unwrap_err(),
        not_found
    );
    assert_eq!(
        p.cancels(),
        Vec::<Option<String>>::new(),
        "a foreign kill cancels nothing"
    );
    // Unknown ids are indistinguishable from foreign ones.
    assert_eq!(
        registry.get(&owner("alice"), &id("bash-99")).unwrap_err(),
        JobError::NotFound(id("bash-99"))
    );
    // Disposing another owner leaves alice's job alone.
    registry.dispose_owner(&bob).await;
    assert_eq!(registry.list(&owner("alice")).len(), 1);
    assert!(p.cancels().is_empty());

    p.settle(completed("mine"));
    settle_tasks().await;
    assert_eq!(registry.read_job(&owner("alice"), &job).unwrap().output, "mine");
    assert_eq!(registry.read_job(&bob, &job).unwrap_err(), not_found);
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn settlement_is_first_wins_and_notifies_once() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let (spec, p) = producer("bash", "build", "a");
    let job = registry.start(spec).unwrap();
    p.settle(completed("first"));
    settle_tasks().await;
    registry.settle_for_test(&job, failed("second"));
    let snapshot = registry.get(&owner("a"), &job).unwrap();
    assert_eq!(snapshot.status, JobStatus::Completed);
    assert_eq!(snapshot.detail, None);
    assert_eq!(registry.read_job(&owner("a"), &job).unwrap().output, "first");
    assert_eq!(notices.lock().len(), 1);

    // A forced outcome that lands first wins over the producer's later one.
    let (spec, q) = producer("bash", "lint", "a");
    let job = registry.start(spec).unwrap();
    registry.settle_for_test(&job, failed("forced"));
    q.settle(completed("late"));
    settle_tasks().await;
    let snapshot = registry.get(&owner("a"), &job).unwrap();
    assert_eq!(
        (snapshot.status, snapshot.detail.as_deref()),
        (JobStatus::Failed, Some("forced"))
    );
    assert_eq!(notices.lock().len(), 2);
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_or_non_terminal_done_settles_failed() {
    let registry = JobRegistry::new();
    let panicking = JobSpec {
        kind: "bash".into(),
        label: "p".into(),
        owner: owner("a"),
        starter: Box::new(|| JobHooks {
            cancel: Box::new(|_| {}),
            done: Box::pin(async { panic!("done exploded") }),
        }),
    };
    let non_terminal = JobSpec {
        kind: "bash".into(),
        label: "n".into(),
        owner: owner("a"),
        starter: Box::new(|| JobHooks {
            cancel: Box::new(|_| {}),
            done: Box::pin(async {
                JobOutcome {
                    status: JobStatus::Running,
                    output: Some("ignored".into()),
                    detail: None,
                }
            }),
        }),
    };
    let p = registry.start(panicking).unwrap();
    let n = registry.start(non_terminal).unwrap();
    settle_tasks().await;
    let p = registry.read_job(&owner("a"), &p).unwrap();
    assert_eq!(p.snapshot.status, JobStatus::Failed);
    assert_eq!(
        p.snapshot.detail.as_deref(),
        Some("job panicked before settling: done exploded")
    );
    let n = registry.read_job(&owner("a"), &n).unwrap();
    assert_eq!(n.snapshot.status, JobStatus::Failed);
    assert_eq!(
        n.snapshot.detail.as_deref(),
        Some("job settled with non-terminal status running")
    );
    assert_eq!(n.output, "");
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn kill_calls_cancel_first_then_marks_stopping_and_reported() {
    let registry = Arc::new(JobRegistry::new());
    let (notices, _guard) = record_notices(&registry);
    // The cancel hook observes the job while it runs: still `running`.
    let seen_during_cancel = Arc::new(Mutex::new(None));
    let (tx, rx) = tokio::sync::oneshot::channel::<JobOutcome>();
    let tx = Arc::new(Mutex::new(Some(tx)));
    let weak = Arc::downgrade(&registry);
    let seen = seen_during_cancel.clone();
    let reasons = Arc::new(Mutex::new(Vec::new()));
    let reasons_in = reasons.clone();
    let spec = JobSpec {
        kind: "subagent".into(),
        label: "research".into(),
        owner: owner("a"),
        starter: Box::new(move || JobHooks {
            cancel: Box::new(move |reason| {
                let registry = weak.upgrade().expect("registry alive during kill");
                *seen.lock() = Some(
                    registry
                        .get(&SessionId::from("a"), &JobId("subagent-1".into()))
                        .unwrap(),
                );
                reasons_in.lock().push(reason);
            }),
            done: Box::pin(async move { rx.await.unwrap_or_else(|_| killed()) }),
        }),
    };
    let job = registry.start(spec).unwrap();
    let outcome = registry
        .kill_job(&owner("a"), &job, Some("superseded".into()))
        .unwrap();
    let during = seen_during_cancel.lock().clone().unwrap();
    assert_eq!(during.status, JobStatus::Running);
    assert_eq!(*reasons.lock(), vec![Some("superseded".to_owned())]);
    let KillOutcome::Requested(after) = outcome else {
        panic!("expected a requested kill, got {outcome:?}");
    };
    assert_eq!((after.status, after.reported), (JobStatus::Stopping, true));

    // Killing again forwards again (cancel is idempotent by contract); the job stays stopping.
    registry.kill(&owner("a"), &job, None).unwrap();
    assert_eq!(*reasons.lock(), vec![Some("superseded".to_owned()), None]);

    // The producer settles `killed`; the kill already reported it, so no notice.
    if let Some(tx) = tx.lock().take() {
        let _ = tx.send(killed());
    }
    settle_tasks().await;
    let read = registry.read_job(&owner("a"), &job).unwrap();
    assert_eq!(read.snapshot.status, JobStatus::Killed);
    assert!(notices.lock().is_empty());

    // A settled job is not cancelled again.
    let again = registry.kill_job(&owner("a"), &job, Some("late".into())).unwrap();
    assert!(matches!(again, KillOutcome::AlreadyFinished(ref s) if s.status == JobStatus::Killed));
    assert_eq!(reasons.lock().len(), 2);
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_kill_on_a_settled_job_suppresses_its_notice_only_if_first() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let (spec, p) = producer("bash", "x", "a");
    let job = registry.start(spec).unwrap();
    p.settle(completed("done"));
    settle_tasks().await;
    assert_eq!(notices.lock().len(), 1, "the unreported settlement was announced");
    let outcome = registry.kill_job(&owner("a"), &job, None).unwrap();
    assert!(matches!(outcome, KillOutcome::AlreadyFinished(ref s) if s.reported));
    assert!(p.cancels().is_empty());
    assert_ends_empty(&registry).await;
}

/// A `cancel` that panics inside `kill` is contained exactly as in teardown: the record is
/// forced `failed` (its detail names the panic), its task aborted, the kill's report claim
/// stands (no notice), and the hook is never called again — not by a second kill, nor by the
/// owner's disposal.
#[tokio::test(start_paused = true)]
async fn a_panicking_cancel_in_kill_force_fails_the_job_like_teardown() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let (spec, p) = producer_with("bash", "x", "a", OnCancel::Panic, Duration::ZERO);
    let job = registry.start(spec).unwrap();
    let (a, signal) = (owner("a"), Signal::new());
    let waiter = registry.wait_settled(&a, &job, None, &signal);
    let outcome = catch_unwind(AssertUnwindSafe(|| registry.kill_job(&a, &job, None)))
        .expect("the cancel hook's panic is contained")
        .unwrap();
    let KillOutcome::CancelPanicked { snapshot, message } = outcome else {
        panic!("expected a contained cancel panic, got {outcome:?}");
    };
    assert_eq!(message, "cancel exploded");
    assert_eq!((snapshot.status, snapshot.reported), (JobStatus::Failed, true));
    assert_eq!(
        snapshot.detail.as_deref(),
        Some("cancel panicked during kill; work may be orphaned: cancel exploded")
    );
    assert_eq!(registry.get(&a, &job).unwrap(), snapshot);
    assert_eq!(
        waiter.await,
        Ok(true),
        "a waiter is released by the forced settlement"
    );
    let again = registry.kill_job(&a, &job, Some("again".into())).unwrap();
    assert!(matches!(again, KillOutcome::AlreadyFinished(ref s) if s.status == JobStatus::Failed));
    settle_tasks().await;
    assert!(
        !p.released(),
        "done never ran to completion: its task was aborted"
    );
    assert!(!p.settle(completed("late")), "done was dropped with its task");
    assert!(notices.lock().is_empty(), "the kill claimed the report");
    registry.dispose_owner(&a).await;
    assert_eq!(p.cancels(), vec![None], "the hook ran once");
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_waiting_read_returns_at_settlement_and_claims_the_report() {
    let registry = Arc::new(JobRegistry::new());
    let (notices, _guard) = record_notices(&registry);
    let (spec, p) = producer("subagent", "research", "a");
    let job = registry.start(spec).unwrap();
    let reader = {
        let registry = registry.clone();
        let job = job.clone();
        tokio::spawn(async move { registry.read(&owner("a"), &job, true, &Signal::new()).await })
    };
    settle_tasks().await;
    assert_eq!(registry.counts().waiters, 1);
    p.settle(completed("background answer"));
    let read = reader.await.unwrap().unwrap();
    assert_eq!(read.status, JobStatus::Completed);
    assert_eq!(read.outcome.unwrap().output.as_deref(), Some("background answer"));
    assert!(notices.lock().is_empty(), "the waiter reported the settlement");
    assert_eq!(registry.counts().waiters, 0);

    // Re-reads are idempotent.
    let again = registry
        .read(&owner("a"), &job, true, &Signal::new())
        .await
        .unwrap();
    assert_eq!(
        again.outcome.unwrap().output.as_deref(),
        Some("background answer")
    );
    assert_ends_empty(&registry).await;
}

/// A waiting read whose signal fires in the same moment the job settles (both before the
/// read is polled again) returns the output but does not claim the report — its caller discards
/// a result whose signal fired — so the held completion notice is emitted after all.
#[tokio::test(start_paused = true)]
async fn a_waiting_read_whose_signal_fires_at_settlement_leaves_the_report_to_the_notice() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let (spec, p) = producer("subagent", "research", "a");
    let job = registry.start(spec).unwrap();
    let (a, signal) = (owner("a"), Signal::new());
    let reader = registry.read(&a, &job, true, &signal);
    tokio::pin!(reader);
    assert!(poll!(&mut reader).is_pending());
    assert_eq!(registry.counts().waiters, 1);
    p.settle(completed("background answer"));
    settle_tasks().await;
    assert!(
        notices.lock().is_empty(),
        "held while the waiter may still deliver"
    );
    assert!(
        !registry.get(&owner("a"), &job).unwrap().reported,
        "not reported before a waiter delivers it"
    );
    signal.cancel(CancelCause::User);
    let read = reader.await.unwrap();
    assert_eq!(read.outcome.unwrap().output.as_deref(), Some("background answer"));
    assert!(!registry.get(&owner("a"), &job).unwrap().reported);
    assert_eq!(notices.lock().len(), 1, "the abandoned claim releases the notice");
    assert_eq!(registry.counts().waiters, 0);
    assert_ends_empty(&registry).await;
}

/// A waiter dropped after the settlement it was registered for (its call was aborted before
/// it was polled again) releases its claim on the report: the held notice is emitted.
#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_after_settlement_releases_the_held_notice() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let (spec, p) = producer("bash", "x", "a");
    let job = registry.start(spec).unwrap();
    {
        let (a, signal) = (owner("a"), Signal::new());
        let waiter = registry.wait_settled(&a, &job, None, &signal);
        tokio::pin!(waiter);
        assert!(poll!(&mut waiter).is_pending());
        p.settle(completed("x"));
        settle_tasks().await;
        assert!(notices.lock().is_empty());
    }
    assert_eq!(registry.counts().waiters, 0);
    assert!(!registry.get(&owner("a"), &job).unwrap().reported);
    assert_eq!(notices.lock().len(), 1);
    assert_eq!(notices.lock()[0].job.id, job);
    assert_ends_empty(&registry).await;
}

/// With several waiters, one that delivers claims the report (no notice) even if another was
/// cancelled; only when every waiter abandons is the held notice emitted — exactly once.
#[tokio::test(start_paused = true)]
async fn a_held_notice_is_suppressed_by_any_delivering_waiter_and_emitted_once_when_all_abandon() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let a = owner("a");

    let (spec, p) = producer("bash", "one", "a");
    let one = registry.start(spec).unwrap();
    let (cancelled, live) = (Signal::new(), Signal::new());
    let abandoning = registry.read(&a, &one, true, &cancelled);
    let delivering = registry.read(&a, &one, true, &live);
    tokio::pin!(abandoning, delivering);
    assert!(poll!(&mut abandoning).is_pending());
    assert!(poll!(&mut delivering).is_pending());
    p.settle(completed("one"));
    settle_tasks().await;
    cancelled.cancel(CancelCause::User);
    abandoning.await.unwrap();
    assert!(notices.lock().is_empty(), "another waiter may still deliver");
    assert!(!registry.get(&a, &one).unwrap().reported);
    let read = delivering.await.unwrap();
    assert_eq!(read.outcome.unwrap().output.as_deref(), Some("one"));
    assert!(registry.get(&a, &one).unwrap().reported);
    assert!(notices.lock().is_empty(), "the delivering waiter reported it");

    let (spec, q) = producer("bash", "two", "a");
    let two = registry.start(spec).unwrap();
    let (first, second) = (Signal::new(), Signal::new());
    let w1 = registry.read(&a, &two, true, &first);
    let w2 = registry.wait_settled(&a, &two, None, &second);
    tokio::pin!(w1, w2);
    assert!(poll!(&mut w1).is_pending());
    assert!(poll!(&mut w2).is_pending());
    q.settle(completed("two"));
    settle_tasks().await;
    first.cancel(CancelCause::User);
    second.cancel(CancelCause::User);
    w1.await.unwrap();
    assert!(notices.lock().is_empty(), "the second waiter still holds it");
    assert_eq!(w2.await, Ok(true));
    assert_eq!(notices.lock().len(), 1);
    assert_eq!(notices.lock()[0].job.id, two);
    assert!(!registry.get(&a, &two).unwrap().reported);
    assert_eq!(registry.counts().waiters, 0);
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_read_without_wait_reports_the_live_status() {
    let registry = JobRegistry::new();
    let (spec, p) = producer("bash", "x", "a");
    let job = registry.start(spec).unwrap();
    let read = registry
        .read(&owner("a"), &job, false, &Signal::new())
        .await
        .unwrap();
    assert_eq!((read.status, read.outcome), (JobStatus::Running, None));
    assert!(!registry.get(&owner("a"), &job).unwrap().reported);
    p.settle(completed(""));
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_stops_only_the_wait() {
    let registry = Arc::new(JobRegistry::new());
    let (notices, _guard) = record_notices(&registry);
    let (spec, p) = producer("bash", "x", "a");
    let job = registry.start(spec).unwrap();
    let signal = Signal::new();
    let reader = {
        let registry = registry.clone();
        let job = job.clone();
        let signal = signal.clone();
        tokio::spawn(async move { registry.read(&owner("a"), &job, true, &signal).await })
    };
    settle_tasks().await;
    signal.cancel(CancelCause::User);
    let err = reader.await.unwrap().unwrap_err();
    assert_eq!(err, JobError::Cancelled(job.clone()));
    assert_eq!(err.to_string(), "waiting for job bash-1 was cancelled");
    assert_eq!(
        registry.get(&owner("a"), &job).unwrap().status,
        JobStatus::Running
    );
    assert_eq!(registry.counts().waiters, 0);
    assert!(p.cancels().is_empty());

    // A pre-cancelled signal fails at once; the job keeps running.
    let err = registry.read(&owner("a"), &job, true, &signal).await.unwrap_err();
    assert_eq!(err, JobError::Cancelled(job.clone()));

    // With no waiter left the settlement is announced.
    p.settle(completed("x"));
    settle_tasks().await;
    assert_eq!(notices.lock().len(), 1);
    // A settled job reads even under a cancelled signal.
    assert_eq!(
        registry
            .read(&owner("a"), &job, true, &signal)
            .await
            .unwrap()
            .status,
        JobStatus::Completed
    );
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_timed_wait_returns_the_live_status_and_leaves_the_job_alive() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let (spec, p) = producer("bash", "x", "a");
    let job = registry.start(spec).unwrap();
    let start = tokio::time::Instant::now();
    let settled = registry
        .wait_settled(&owner("a"), &job, Some(Duration::from_secs(5)), &Signal::new())
        .await
        .unwrap();
    assert!(!settled);
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    let snapshot = registry.get(&owner("a"), &job).unwrap();
    assert_eq!((snapshot.status, snapshot.reported), (JobStatus::Running, false));
    assert_eq!(registry.counts().waiters, 0);
    p.settle(completed(""));
    settle_tasks().await;
    assert_eq!(notices.lock().len(), 1);
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_wait_unregisters_its_waiter() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let (spec, p) = producer("bash", "x", "a");
    let job = registry.start(spec).unwrap();
    {
        let signal = Signal::new();
        let a = owner("a");
        let wait = registry.wait_settled(&a, &job, None, &signal);
        tokio::pin!(wait);
        assert!(futures::poll!(wait.as_mut()).is_pending());
        assert_eq!(registry.counts().waiters, 1);
    }
    assert_eq!(registry.counts().waiters, 0);
    p.settle(completed(""));
    settle_tasks().await;
    assert_eq!(
        notices.lock().len(),
        1,
        "a dropped waiter does not swallow the notice"
    );
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn notices_name_the_job_and_reach_only_the_owner() {
    let registry = JobRegistry::new();
    let alice_heard = Arc::new(AtomicUsize::new(0));
    let heard = alice_heard.clone();
    let _alice = registry.notices().on_scoped(owner("alice"), move |_| {
        heard.fetch_add(1, Ordering::SeqCst);
        Ok(())
    });
    let (all, _guard) = record_notices(&registry);
    let (spec, p) = producer("subagent", "research", "bob");
    registry.start(spec).unwrap();
    p.settle(failed("error; diagnostic: boom"));
    settle_tasks().await;
    let notices = all.lock().clone();
    assert_eq!(notices.len(), 1);
    let notice = &notices[0];
    assert_eq!(notice.owner, owner("bob"));
    assert_eq!(
        notice.text,
        "background job subagent-1 (subagent: research) finished [status: failed, error; diagnostic: boom]. \
         Read its output with job_output."
    );
    assert_eq!(
        alice_heard.load(Ordering::SeqCst),
        0,
        "scoped listeners hear only their owner"
    );
    let message = notice.to_message();
    assert_eq!(message.text(), notice.text);
    assert_eq!(
        message.source,
        MessageSource::Plugin {
            plugin: "tool-jobs".into(),
            form: Some(PluginForm::Notice {
                summary: "subagent research [status: failed, error; diagnostic: boom]".into()
            }),
        }
    );
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn dispose_owner_cancels_and_awaits_done_then_drops_the_owners_records() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let slow = Duration::from_secs(3);
    let (spec, a1) = producer_with("subagent", "slow", "a", OnCancel::Kill, slow);
    registry.start(spec).unwrap();
    let (spec, a2) = producer_with("bash", "done already", "a", OnCancel::Kill, Duration::ZERO);
    registry.start(spec).unwrap();
    a2.settle(completed("x"));
    let (spec, b1) = producer_with("bash", "other owner", "b", OnCancel::Kill, Duration::ZERO);
    registry.start(spec).unwrap();
    settle_tasks().await;
    let announced = notices.lock().len();

    let start = tokio::time::Instant::now();
    registry.dispose_owner(&owner("a")).await;
    assert!(
        a1.released(),
        "dispose_owner returned only after done released its resources"
    );
    assert_eq!(start.elapsed(), slow);
    assert_eq!(a1.cancels(), vec![Some("owner disposed".to_owned())]);
    assert!(a2.cancels().is_empty(), "settled jobs are not cancelled");
    assert!(
        registry.list(&owner("a")).is_empty(),
        "the owner's records are dropped"
    );
    assert_eq!(
        notices.lock().len(),
        announced,
        "teardown settlements are not announced"
    );
    assert!(b1.cancels().is_empty());
    assert_eq!(
        registry.counts(),
        JobCounts {
            jobs: 1,
            active: 1,
            tasks: 1,
            ..JobCounts::default()
        }
    );

    // The session id may start jobs again (a resumed agent reuses it).
    let (spec, a3) = producer("bash", "again", "a");
    assert_eq!(registry.start(spec).unwrap(), id("bash-3"));
    a3.settle(completed(""));
    b1.settle(completed(""));
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn starts_are_refused_while_their_owner_is_being_disposed() {
    let registry = Arc::new(JobRegistry::new());
    let (spec, p) = producer_with("bash", "slow", "a", OnCancel::Kill, Duration::from_secs(10));
    registry.start(spec).unwrap();
    let disposal = {
        let registry = registry.clone();
        tokio::spawn(async move { registry.dispose_owner(&owner("a")).await })
    };
    settle_tasks().await;
    assert_eq!(registry.counts().disposing_owners, 1);
    let (spec, refused) = producer("bash", "late", "a");
    assert_eq!(registry.start(spec).unwrap_err(), JobError::OwnerDisposed);
    assert_eq!(refused.started(), 0);
    disposal.await.unwrap();
    assert!(p.released());
    assert_eq!(registry.counts().disposing_owners, 0);
    assert_ends_empty(&registry).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_racing_owner_disposal_is_torn_down_by_it() {
    let registry = Arc::new(JobRegistry::new());
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (spec, p) = killable("bash", "racing", "a");
    let JobSpec {
        kind,
        label,
        owner: o,
        starter,
    } = spec;
    let blocking = JobSpec {
        kind,
        label,
        owner: o,
        starter: Box::new(move || {
            // Blocks inside the starter until the disposal has begun.
            let _ = release_rx.recv();
            starter()
        }),
    };
    let starting = {
        let registry = registry.clone();
        tokio::task::spawn_blocking(move || registry.start(blocking))
    };
    while registry.counts().pending_starts == 0 {
        tokio::task::yield_now().await;
    }
    let disposal = {
        let registry = registry.clone();
        tokio::spawn(async move { registry.dispose_owner(&owner("a")).await })
    };
    while registry.counts().disposing_owners == 0 {
        tokio::task::yield_now().await;
    }
    release_tx.send(()).unwrap();
    assert_eq!(
        starting.await.unwrap().unwrap(),
        id("bash-1"),
        "registration after preflight cannot fail"
    );
    disposal.await.unwrap();
    assert_eq!(p.cancels(), vec![Some("owner disposed".to_owned())]);
    assert!(registry.list(&owner("a")).is_empty());
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn a_panicking_teardown_cancel_force_fails_and_does_not_stall_disposal() {
    let registry = JobRegistry::new();
    let (spec, p) = producer_with("bash", "stubborn", "a", OnCancel::Panic, Duration::ZERO);
    let job = registry.start(spec).unwrap();
    let (a, signal) = (owner("a"), Signal::new());
    let waiter = registry.wait_settled(&a, &job, None, &signal);
    let disposal = registry.dispose_owner(&a);
    let (waited, ()) = tokio::join!(waiter, disposal);
    // The waiter either saw the forced failure or the record was already dropped.
    assert!(
        matches!(waited, Ok(true) | Err(JobError::NotFound(_))),
        "{waited:?}"
    );
    assert_eq!(p.cancels(), vec![Some("owner disposed".to_owned())]);
    assert!(
        !p.released(),
        "done never ran to completion: its task was aborted"
    );
    assert!(registry.counts().is_empty());
    assert_ends_empty(&registry).await;
}

#[tokio::test(start_paused = true)]
async fn shutdown_cancels_and_awaits_every_job_then_refuses_starts() {
    let registry = JobRegistry::new();
    let (notices, _guard) = record_notices(&registry);
    let (spec, a) = producer_with("bash", "a", "a", OnCancel::Kill, Duration::from_secs(1));
    registry.start(spec).unwrap();
    let (spec, b) = producer_with("subagent", "b", "b", OnCancel::Kill, Duration::from_secs(2));
    registry.start(spec).unwrap();
    registry.shutdown().await;
    assert!(a.released() && b.released());
    assert_eq!(a.cancels(), vec![Some("jobs service disposed".to_owned())]);
    assert_eq!(b.cancels(), vec![Some("jobs service disposed".to_owned())]);
    assert!(notices.lock().is_empty());
    assert!(registry.counts().is_empty());
    let (spec, late) = producer("bash", "late", "a");
    assert_eq!(registry.start(spec).unwrap_err(), JobError::ShutDown);
    assert_eq!(late.started(), 0);
    registry.shutdown().await;
    assert!(registry.counts().is_empty());
}

#[tokio::test(start_paused = true)]
async fn dropping_the_registry_cancels_live_jobs() {
    let registry = JobRegistry::new();
    let (spec, p) = producer("bash", "x", "a");
    registry.start(spec).unwrap();
    drop(registry);
    assert_eq!(p.cancels(), vec![Some("jobs service disposed".to_owned())]);
    // The orphaned task ends once the producer settles; nothing is left to notify.
    p.settle(killed());
    settle_tasks().await;
}

#[tokio::test(start_paused = true)]
async fn listing_is_in_start_order_with_statuses() {
    let registry = JobRegistry::new();
    let (spec, p1) = producer("bash", "pnpm test", "a");
    registry.start(spec).unwrap();
    let (spec, p2) = producer("subagent", "open research", "a");
    registry.start(spec).unwrap();
    let (spec, p3) = producer("bash", "build", "a");
    registry.start(spec).unwrap();
    p3.settle(JobOutcome {
        status: JobStatus::Completed,
        output: None,
        detail: Some("exit code: 0".into()),
    });
    settle_tasks().await;
    let rows: Vec<(String, JobStatus)> = registry
        .list(&owner("a"))
        .into_iter()
        .map(|j| (format!("{} {} {}", j.id, j.kind, j.label), j.status))
        .collect();
    assert_eq!(
        rows,
        [
            ("bash-1 bash pnpm test".to_owned(), JobStatus::Running),
            ("subagent-1 subagent open research".to_owned(), JobStatus::Running),
            ("bash-2 bash build".to_owned(), JobStatus::Completed),
        ]
    );
    p1.settle(completed(""));
    p2.settle(completed(""));
    assert_ends_empty(&registry).await;
}

/// A job whose task is dropped before `done` resolved — the tokio runtime it was started on
/// shut down — settles `failed` instead of staying `running` with no task left to settle it:
/// otherwise a wait for it never returned, and the owner's disposal (or the registry's
/// shutdown) spun forever on a record that never became terminal.
#[tokio::test(start_paused = true)]
async fn a_job_whose_runtime_shut_down_settles_failed() {
    let registry = Arc::new(JobRegistry::new());
    let (spec, producer) = producer("bash", "orphan", "a");
    let starter = registry.clone();
    let id = std::thread::spawn(move || {
        let short_lived = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let id = short_lived.block_on(async { starter.start(spec) });
        drop(short_lived);
        id
    })
    .join()
    .expect("the short-lived runtime's thread")
    .expect("started");
    assert_eq!(producer.started(), 1);
    let job = registry.get(&owner("a"), &id).expect("the record is kept");
    assert_eq!(job.status, JobStatus::Failed, "{job:?}");
    assert_eq!(job.detail.as_deref(), Some(model_text::TASK_DROPPED));
    assert!(
        registry
            .wait_settled(&owner("a"), &id, None, &Signal::new())
            .await
            .expect("a wait returns")
    );
    registry.dispose_owner(&owner("a")).await;
    assert!(registry.list(&owner("a")).is_empty());
    assert_ends_empty(&registry).await;
}

/// A job started on a runtime that is already shut down (its task is dropped inside the spawn,
/// while the registry holds its lock) settles `failed` at once, without deadlocking the start.
#[tokio::test(start_paused = true)]
async fn a_job_started_on_a_shut_down_runtime_settles_failed() {
    let registry = Arc::new(JobRegistry::new());
    let (spec, producer) = producer("bash", "stillborn", "a");
    let starter = registry.clone();
    let id = std::thread::spawn(move || {
        let gone = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let handle = gone.handle().clone();
        drop(gone);
        let _entered = handle.enter();
        starter.start(spec)
    })
    .join()
    .expect("the start returned")
    .expect("started");
    assert_eq!(producer.started(), 1);
    let job = registry.get(&owner("a"), &id).expect("the record is kept");
    assert_eq!(job.status, JobStatus::Failed, "{job:?}");
    assert_eq!(job.detail.as_deref(), Some(model_text::TASK_DROPPED));
    registry.dispose_owner(&owner("a")).await;
    assert_ends_empty(&registry).await;
}

/// `JobReadout::claimed` and `unclaim`: only a read that marked a settled job reported holds a
/// claim; the job reads unreported again only once every outstanding claim is given back; a
/// kill's report is never undone; `unclaim` without a claim, for a foreign owner or an unknown
/// job does nothing.
#[tokio::test(start_paused = true)]
async fn unclaim_gives_back_only_outstanding_read_claims() {
    let reg = JobRegistry::new();
    let (notices, _notices) = record_notices(&reg);
    let (spec, p) = producer("bash", "x", "parent");
    let job = reg.start_job(spec).unwrap();
    let parent = owner("parent");
    assert!(
        !reg.read_job(&parent, &job).unwrap().claimed,
        "a live read claims nothing"
    );
    assert!(!reg.unclaim(&parent, &job));
    // Held for a waiter, so the claims decide whether the notice goes out.
    let waiter_signal = Signal::new();
    let waiter = reg.wait_settled(&parent, &job, None, &waiter_signal);
    tokio::pin!(waiter);
    assert!(poll!(&mut waiter).is_pending());
    p.settle(completed("out"));
    settle_tasks().await;
    let fired = Signal::cancelled_with(CancelCause::User);
    assert!(
        !reg.read_job_unless_cancelled(&parent, &job, &fired)
            .unwrap()
            .claimed
    );
    let first = reg
        .read_job_unless_cancelled(&parent, &job, &Signal::new())
        .unwrap();
    let second = reg.read_job(&parent, &job).unwrap();
    assert!(first.claimed && second.claimed && second.snapshot.reported);
    assert!(!reg.unclaim(&owner("other"), &job), "owner-fenced");
    assert!(!reg.unclaim(&parent, &id("bash-9")));
    assert!(!reg.unclaim(&parent, &job), "the second claim is outstanding");
    assert!(reg.get(&parent, &job).unwrap().reported);
    assert!(reg.unclaim(&parent, &job), "the last claim given back");
    assert!(!reg.get(&parent, &job).unwrap().reported);
    assert!(notices.lock().is_empty(), "held for the waiter");
    assert!(!reg.unclaim(&parent, &job), "nothing left to give back");
    // A kill reports the job for good: a claim made before it cannot undo it.
    let third = reg.read_job(&parent, &job).unwrap();
    assert!(third.claimed);
    assert!(matches!(
        reg.kill_job(&parent, &job, None),
        Ok(KillOutcome::AlreadyFinished(_))
    ));
    assert!(!reg.unclaim(&parent, &job));
    assert!(
        !reg.read_job(&parent, &job).unwrap().claimed,
        "reported by the kill"
    );
    waiter_signal.cancel(CancelCause::User);
    assert_eq!(waiter.await, Ok(true));
    assert!(reg.get(&parent, &job).unwrap().reported);
    assert!(notices.lock().is_empty(), "the kill reported the job");
    assert_ends_empty(&reg).await;
}
