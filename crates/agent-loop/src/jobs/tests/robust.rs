//! Robustness of the job registry under cancellation and concurrency, alone and behind the
//! reference runtime's owner disposal (spec agent-spine §9.4; acp-and-tools §3.8 "Owner disposal
//! cancels the job and awaits `done`"): every run ends with the registry empty for every owner.

use std::sync::Arc;

use agent::jobs::{JobError, JobId};
use agent::tools::ToolOutput;

use super::*;
use crate::jobs::KillOutcome;
use crate::model::{ScriptedModel, chunks};
use crate::runtime::Runtime;
use crate::runtime::testkit::{builder, finish, tool, user};

fn owner(s: &str) -> SessionId {
    SessionId::from(s)
}

/// Every start the `spawn` tool attempted, in order.
type Starts = Arc<Mutex<Vec<Result<JobId, JobError>>>>;

/// A runtime whose agents may start jobs on `jobs` through the tool `spawn`, which yields
/// `before` times, starts a killable job owned by its caller, then yields `after` times. The
/// model calls `spawn` once, then answers.
fn runtime_with_spawn(
    jobs: &Arc<JobRegistry>,
    before: usize,
    after: usize,
) -> (Runtime, agent::Registration, Starts) {
    let model = ScriptedModel::new([
        chunks::tool_call("c1", "spawn", serde_json::json!({})),
        chunks::text("done"),
    ]);
    let rt = builder(&model).jobs(jobs.clone()).build();
    let started = Arc::new(Mutex::new(Vec::new()));
    let (registry, seen) = (jobs.clone(), started.clone());
    let guard = rt
        .services()
        .tools
        .register(
            None,
            tool("spawn", move |_, ctx| {
                let (registry, seen) = (registry.clone(), seen.clone());
                async move {
                    for _ in 0..before {
                        tokio::task::yield_now().await;
                    }
                    // A body that ignores its signal: the start lands whenever it gets here.
                    let (spec, _producer) = killable("work", "late", ctx.agent().as_str());
                    seen.lock().push(registry.start_job(spec));
                    for _ in 0..after {
                        tokio::task::yield_now().await;
                    }
                    Ok(ToolOutput::text("spawned"))
                }
            }),
        )
        .expect("tool registered");
    (rt, guard, started)
}

/// The agent's disposal at every scheduling point of a turn whose tool starts a background job
/// mid-call (ignoring its cancellation): whenever the start lands — before the disposal, while
/// the teardown awaits the turn, or refused — the disposal cancels and drops the agent's job,
/// so the registry ends empty for the owner with no task left; the runtime ends quiescent.
#[tokio::test(start_paused = true)]
async fn owner_disposal_at_every_point_leaves_no_job() {
    let mut landed_after = 0;
    let mut point = 0;
    loop {
        let jobs = Arc::new(JobRegistry::new());
        let (rt, guard, started) = runtime_with_spawn(&jobs, 3, 3);
        let handle = crate::runtime::testkit::create(&rt, "a").await;
        handle.agent().followup(user("go")).unwrap();
        for _ in 0..point {
            tokio::task::yield_now().await;
        }
        let before = started.lock().len();
        let ended = !crate::runtime::testkit::turn_ends(&**handle.agent()).is_empty();
        handle.dispose().await;
        let after = started.lock().clone();
        if before == 0 && after.iter().any(Result::is_ok) {
            landed_after += 1;
        }
        assert!(
            jobs.snapshots(&owner("a")).is_empty(),
            "point {point}: the disposed owner kept jobs {:?}",
            jobs.snapshots(&owner("a"))
        );
        assert_eq!(jobs.counts(), JobCounts::default(), "point {point}");
        drop(guard);
        finish(&rt, [handle]).await;
        assert_ends_empty(&jobs).await;
        if ended {
            break;
        }
        point += 1;
        assert!(point < 500, "the turn never ended");
    }
    assert!(landed_after > 0, "no point started the job during the teardown");
}

/// The per-owner limit and the registry's bookkeeping under concurrent starts (some of whose
/// starters panic), kills, settlements and owner disposals on a multi-threaded runtime, in
/// whatever interleaving happens: never more than `limit` jobs of the owner exist at once, every
/// reservation is released, a job killed before it settled never notifies, no job notifies
/// twice, and the registry ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_starts_kills_settlements_and_disposals_keep_the_limit() {
    const LIMIT: usize = 3;
    for round in 0..20 {
        let registry = Arc::new(JobRegistry::with_config(super::super::JobRegistryConfig {
            limit: LIMIT,
            ..Default::default()
        }));
        let (notices, guard) = record_notices(&registry);
        let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let kills = Arc::new(Mutex::new(Vec::new()));
        let starters: Vec<_> = (0..4)
            .map(|t| {
                let (registry, live, most) = (registry.clone(), live.clone(), most.clone());
                tokio::spawn(async move {
                    let mut outcomes = Vec::new();
                    for n in 0..6 {
                        let (live, most) = (live.clone(), most.clone());
                        let spec = JobSpec {
                            kind: "work".into(),
                            label: format!("{t}-{n}"),
                            owner: owner("o"),
                            starter: Box::new(move || {
                                let now = live.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                                most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                                if n % 3 == 2 {
                                    live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                                    panic!("starter exploded");
                                }
                                let token = tokio_util::sync::CancellationToken::new();
                                let cancel = token.clone();
                                JobHooks {
                                    cancel: Box::new(move |_| cancel.cancel()),
                                    done: Box::pin(async move {
                                        let outcome = tokio::select! {
                                            () = token.cancelled() => killed(),
                                            () = async {
                                                for _ in 0..(n * 2) {
                                                    tokio::task::yield_now().await;
                                                }
                                            } => completed("ok"),
                                        };
                                        live.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                                        outcome
                                    }),
                                }
                            }),
                        };
                        let registry = registry.clone();
                        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
                            registry.start_job(spec)
                        }));
                        outcomes.push(started.map_err(|_| ()));
                        tokio::task::yield_now().await;
                    }
                    outcomes
                })
            })
            .collect();
        let killer = {
            let (registry, kills) = (registry.clone(), kills.clone());
            tokio::spawn(async move {
                for _ in 0..20 {
                    for job in registry.snapshots(&owner("o")) {
                        if let Ok(KillOutcome::Requested(_)) = registry.kill_job(&owner("o"), &job.id, None) {
                            kills.lock().push(job.id);
                        }
                    }
                    tokio::task::yield_now().await;
                }
            })
        };
        let disposer = {
            let registry = registry.clone();
            tokio::spawn(async move {
                for _ in 0..round % 5 {
                    tokio::task::yield_now().await;
                }
                registry.dispose_owner_jobs(&owner("o")).await;
            })
        };
        for s in starters {
            for outcome in s.await.unwrap() {
                match outcome {
                    Ok(Ok(_)) | Err(()) => {}
                    Ok(Err(e)) => assert!(
                        matches!(e, JobError::LimitReached(LIMIT) | JobError::OwnerDisposed),
                        "round {round}: {e:?}"
                    ),
                }
            }
        }
        killer.await.unwrap();
        disposer.await.unwrap();
        registry.dispose_owner_jobs(&owner("o")).await;
        assert!(
            most.load(std::sync::atomic::Ordering::SeqCst) <= LIMIT,
            "round {round}: {} jobs at once",
            most.load(std::sync::atomic::Ordering::SeqCst)
        );
        assert_eq!(registry.counts(), JobCounts::default(), "round {round}");
        let notices = notices.lock().clone();
        let mut ids: Vec<&JobId> = notices.iter().map(|n| &n.job.id).collect();
        ids.sort();
        let before = ids.len();
        ids.dedup();
        assert_eq!(ids.len(), before, "round {round}: a job notified twice");
        for id in kills.lock().iter() {
            assert!(!ids.contains(&id), "round {round}: killed job {id:?} notified");
        }
        drop(guard);
        assert_ends_empty(&registry).await;
    }
}
