//! Robustness of the job registry under cancellation and concurrency, alone and behind the
//! reference runtime's owner disposal (spec agent-spine §9.4; acp-and-tools §3.8 "Owner disposal
//! cancels the job and awaits `done`"): every run ends with the registry empty for every owner.

use std::sync::Arc;

use agent::jobs::{JobError, JobId};
use agent::tools::ToolOutput;

use super::*;
use crate::model::{ScriptedModel, chunks};
use crate::runtime::Runtime;
use crate::runtime::testkit::{builder, finish, tool, user};

fn owner(s: &str) -> SessionId {
    SessionId::from(s)
}

/// A runtime whose agents may start jobs on `jobs` through the tool `spawn`, which yields
/// `before` times, starts a killable job owned by its caller, then yields `after` times. The
/// model calls `spawn` once, then answers.
fn runtime_with_spawn(
    jobs: &Arc<JobRegistry>,
    before: usize,
    after: usize,
) -> (
    Runtime,
    agent::Registration,
    Arc<Mutex<Vec<Result<JobId, JobError>>>>,
) {
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
