//! End to end, in process: a parent turn that delegates through the model-facing `subagent`
//! tool (provider `spawn`) is interrupted at **every** scheduling point of its life, once per
//! point, on the full host (JSON-lines store, delegation tools, background jobs, online
//! invariant checks, the seam's lifecycle companion): by its user's cancel (a foreground
//! delegation), and by the parent's disposal (a background delegation).
//!
//! The model's chunks arrive one scheduling point apart ([`agent_loop::model::Trickle`]), so the
//! points fall between chunks of the parent's and the child's streams, across the delegation's start and its result, not only
//! between whole steps. At each point:
//!
//! * (user cancel) the parent's turn ends `completed` when it had already ended, else
//!   `aborted {user}`;
//! * a child that was still running ends `aborted {parent}` (the user's cancel reaches it
//!   through the tool call's signal synchronously), one that had finished keeps `completed`;
//! * (parent disposal) the background child is drained with its parent and its job settles;
//! * every session append passed the online checks, every run that started also ended, and
//!   the store replays clean through the offline checker after shutdown.

use std::sync::Arc;

use agent::{
    AgentHandle, AgentRef, CancelCause, CancelOptions, ContentBlock, EventData, GenerateOptions, Message,
    ModelAdapter, ModelStream, SessionId, StreamChunk, TurnEndReason,
};
use agent_loop::model::{Trickle, chunks};
use futures::StreamExt;
use invariants::{InvariantObserver, SeamLifecycleCompanion};
use subagent::service::SubagentService;
use subagent_cli::host::{Host, HostOptions, build_host};

/// The parent delegates once (in the foreground, or in the background with `background`), then
/// answers; the child answers at once.
struct Script {
    /// The delegation tool the parent calls (`subagent` → `spawn`, `fork` → `fork`).
    tool: &'static str,
    background: bool,
}

impl Script {
    fn reply(&self, request: &GenerateOptions) -> Vec<StreamChunk> {
        if request.session_id.as_ref().map(SessionId::as_str) != Some("coordinator") {
            return chunks::text("child done");
        }
        let answered = request
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .any(|b| matches!(b, ContentBlock::ToolResult { .. }));
        if answered {
            chunks::text("parent done")
        } else {
            let mut args = serde_json::json!({"description": "sweep", "prompt": "do it"});
            if self.background {
                args["run_in_background"] = serde_json::json!(true);
            }
            chunks::tool_call("c1", self.tool, args)
        }
    }
}

impl ModelAdapter for Script {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        futures::stream::iter(self.reply(&request).into_iter().map(Ok)).boxed()
    }
}

/// The parent's script for the background sweeps.
const BACKGROUND: Script = Script {
    tool: "subagent",
    background: true,
};

/// The last `turn/end` reason of a log, if any.
fn last_turn_end(agent: &AgentRef) -> Option<TurnEndReason> {
    agent.session().events().iter().rev().find_map(|e| match &e.data {
        EventData::TurnEnd { reason, .. } => Some(reason.clone()),
        _ => None,
    })
}

/// One run of the full host with the online checks: the host, a parent `coordinator` whose
/// first turn (`go`) has been delivered, and what [`Sweep::finish`] checks at the end.
struct Sweep {
    dir: tempfile::TempDir,
    host: Host,
    handle: AgentHandle,
    parent: AgentRef,
    observer: Arc<InvariantObserver>,
    seam: Arc<SeamLifecycleCompanion>,
    seam_listening: agent::Registration,
}

impl Sweep {
    async fn new(script: Script) -> Self {
        Self::over(Arc::new(script)).await
    }

    /// [`Sweep::new`] over any parent/child script.
    async fn over(script: Arc<dyn ModelAdapter>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let adapter = Arc::new(Trickle::new(script));
        let mut options = HostOptions::new(dir.path(), adapter, "mock", "mock");
        let observer = InvariantObserver::shared();
        options.session_observers.push(observer.clone());
        let service = SubagentService::new();
        let seam = SeamLifecycleCompanion::new();
        let seam_listening = seam.listen(&service);
        options.subagents = Some(service);
        let host = build_host(options).expect("the host composes");
        let handle = host
            .create_agent(SessionId::from("coordinator"))
            .await
            .expect("parent");
        let parent = handle.agent().clone();
        parent.followup(Message::user_text("go")).expect("delivered");
        Self {
            dir,
            host,
            handle,
            parent,
            observer,
            seam,
            seam_listening,
        }
    }

    /// The live children of the parent (the agents other than the parent).
    fn children(&self) -> Vec<AgentRef> {
        agent::AgentRuntime::list(self.host.runtime())
            .into_iter()
            .filter(|a| a.id().as_str() != "coordinator")
            .collect()
    }

    /// The live children and whether each had ended its turn.
    fn children_ended(&self) -> Vec<(AgentRef, bool)> {
        self.children()
            .into_iter()
            .map(|c| {
                let ended = last_turn_end(&c).is_some();
                (c, ended)
            })
            .collect()
    }

    /// After `point` yields, cancels the parent's turn as its user would and waits for it to
    /// settle; whatever the timing, the turn ends `completed` or `aborted {user}`.
    async fn cancel_after(&self, point: usize) {
        for _ in 0..point {
            tokio::task::yield_now().await;
        }
        self.parent.cancel(CancelCause::User, CancelOptions::default());
        self.host.settle(&self.parent).await;
        let end = last_turn_end(&self.parent).expect("the parent's turn ended");
        assert!(
            end == TurnEndReason::Completed
                || end
                    == TurnEndReason::Aborted {
                        reason: CancelCause::User
                    },
            "point {point}: {end:?}"
        );
    }

    /// Disposes the parent, shuts the host down and checks: no online violation, every run that
    /// started also ended, and the store replays clean.
    async fn finish(self, point: usize) {
        self.handle.dispose().await;
        self.host.shutdown().await.expect("shutdown");
        drop(self.seam_listening);
        let violations = self.observer.violations();
        assert!(violations.is_empty(), "point {point}: {violations:#?}");
        let violations = self.seam.violations();
        assert!(violations.is_empty(), "point {point}: {violations:#?}");
        assert_eq!(
            self.seam.open_runs(),
            0,
            "point {point}: every run that started also ended"
        );
        let report = invariants::check_store(self.dir.path()).expect("store");
        assert!(report.is_clean(), "point {point}: {:#?}", report.violations);
    }
}

/// What one point observed: whether the parent's turn completed, and the child's end (if a
/// child was published before the host shut down).
#[derive(Debug, PartialEq)]
struct Point {
    parent_completed: bool,
    child: Option<TurnEndReason>,
}

async fn cancel_at(tool: &'static str, point: usize) -> Point {
    let sweep = Sweep::new(Script {
        tool,
        background: false,
    })
    .await;
    let parent = sweep.parent.clone();
    for _ in 0..point {
        tokio::task::yield_now().await;
    }
    // What had ended before the interruption.
    let parent_ended = last_turn_end(&parent).is_some();
    let child_before = sweep.children_ended();
    parent.cancel(CancelCause::User, CancelOptions::default());
    sweep.host.settle(&parent).await;

    let parent_end = last_turn_end(&parent).expect("the parent's turn ended");
    if parent_ended {
        assert_eq!(parent_end, TurnEndReason::Completed, "point {point}");
    } else {
        assert_eq!(
            parent_end,
            TurnEndReason::Aborted {
                reason: CancelCause::User
            },
            "point {point}: the parent was still running"
        );
    }
    // Judge the child seen before the interruption by its own log.
    let mut child = None;
    for (c, ended_before) in &child_before {
        let end = last_turn_end(c);
        if *ended_before {
            assert_eq!(end, Some(TurnEndReason::Completed), "point {point}");
        } else if let Some(end) = &end {
            assert!(
                matches!(end, TurnEndReason::Aborted { reason } if *reason == CancelCause::Parent),
                "point {point}: a child still running when the user cancelled ended {end:?}"
            );
        }
        child = end;
    }
    // A call cancelled mid-await drops its run, whose disposal then finishes in the background
    // (on the driver's tracker): the child goes away without any further action.
    let mut spins = 0;
    while !sweep.children().is_empty() {
        tokio::task::yield_now().await;
        spins += 1;
        assert!(
            spins < 10_000,
            "point {point}: the foreground child was never disposed"
        );
    }
    sweep.finish(point).await;
    Point {
        parent_completed: parent_end == TurnEndReason::Completed,
        child,
    }
}

/// Cancels the parent's turn at every point until one lands after the turn completed.
async fn sweep_user_cancel(tool: &'static str) {
    let mut points = Vec::new();
    for point in 0..1000 {
        let seen = cancel_at(tool, point).await;
        let done = seen.parent_completed;
        if let Some(previous) = points.last() {
            let previous: &Point = previous;
            assert!(
                !previous.parent_completed || done,
                "point {point}: a later cancel un-completed the parent"
            );
        }
        points.push(seen);
        if done {
            break;
        }
    }
    let last = points.last().expect("points");
    assert!(
        last.parent_completed,
        "the parent never completed within 1000 points"
    );
    // The sweep crossed the child's whole life: points before the delegation started (no
    // child yet), points while the child ran (aborted by the parent's cancel), and points after
    // the tool call returned (the child already disposed, the parent's second step aborted).
    let first_child = points
        .iter()
        .position(
            |p| matches!(&p.child, Some(TurnEndReason::Aborted { reason }) if *reason == CancelCause::Parent),
        )
        .expect("some point cancelled a running child");
    assert!(first_child > 0, "{points:?}");
    assert!(
        points[first_child..]
            .iter()
            .any(|p| p.child.is_none() && !p.parent_completed),
        "some point fell between the delegation's end and the parent's: {points:?}"
    );
}

/// spec: DRV-16 — a user's cancel of a turn delegating through `spawn`, at every
/// scheduling point: the parent's turn and a still-running child both abort (the child with
/// cause `parent`), a finished one keeps its ending, nothing outlives the call, and every log
/// stays valid.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn user_cancel_of_a_spawn_delegation_at_every_point() {
    sweep_user_cancel("subagent").await;
}

/// spec: DRV-16 — the same sweep through `fork`: the seeded child is
/// cancelled the same way at every point, and its copied prefix keeps every log valid.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn user_cancel_of_a_fork_delegation_at_every_point() {
    sweep_user_cancel("fork").await;
}

/// A parent that delegates in the background, disposed (its handle) at every scheduling point:
/// the background child is owned by the parent's scope, so it is cancelled and disposed with the
/// parent whatever it was doing; its job settles; every run that started also ended; and every
/// log replays clean.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn disposal_of_a_parent_with_a_background_child_at_every_point() {
    let mut saw_child = false;
    for point in 0..1000 {
        let sweep = Sweep::new(BACKGROUND).await;
        let parent = sweep.parent.clone();
        for _ in 0..point {
            tokio::task::yield_now().await;
        }
        let parent_ended = last_turn_end(&parent).is_some();
        let live = sweep.children();
        let child_ended = live.iter().all(|c| last_turn_end(c).is_some());
        saw_child |= !live.is_empty();
        sweep.handle.dispose().await;
        // The parent's scope drained its background child.
        assert!(
            sweep.children().is_empty(),
            "point {point}: a child outlived its parent"
        );
        for child in &live {
            assert!(
                last_turn_end(child).is_some() || child.session().events().is_empty(),
                "point {point}: the child's turn never closed"
            );
        }
        assert!(
            sweep
                .host
                .jobs()
                .snapshots(parent.id())
                .iter()
                .all(|j| j.status.is_terminal()),
            "point {point}: a job outlived its owner"
        );
        sweep.finish(point).await;
        if parent_ended && child_ended {
            assert!(saw_child, "the sweep reached the background child");
            return;
        }
    }
    panic!("the parent and its child never both finished within 1000 points");
}

/// A parent that delegates in the background; every unsettled job of the parent is killed
/// (`job_kill`'s registry call) at every scheduling point. A child still running at the kill
/// ends `aborted {parent}` and its job `killed`; a job that had already settled keeps its status;
/// nothing outlives its job; every run that started also ended; every log replays clean.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn job_kill_of_a_background_child_at_every_point() {
    let mut killed_running = 0;
    for point in 0..1000 {
        let sweep = Sweep::new(BACKGROUND).await;
        let (parent, jobs_of) = (sweep.parent.clone(), sweep.host.jobs().clone());
        for _ in 0..point {
            tokio::task::yield_now().await;
        }
        let live = sweep.children_ended();
        let jobs = jobs_of.snapshots(parent.id());
        for job in &jobs {
            if !job.status.is_terminal() {
                jobs_of
                    .kill_job(parent.id(), &job.id, Some("sweep".into()))
                    .expect("kill");
            }
        }
        // Let the kills and the parent's turn settle (virtual yields only).
        let mut spins = 0;
        while !jobs_of
            .snapshots(parent.id())
            .iter()
            .all(|j| j.status.is_terminal())
            || parent.status() != agent::AgentStatus::Idle
        {
            tokio::task::yield_now().await;
            spins += 1;
            assert!(spins < 100_000, "point {point}: the kill never settled");
        }
        let killed_now = jobs.iter().any(|j| !j.status.is_terminal());
        for (child, ended_before) in &live {
            let end = last_turn_end(child);
            if *ended_before {
                assert_eq!(end, Some(TurnEndReason::Completed), "point {point}");
            } else if killed_now {
                killed_running += 1;
                assert_eq!(
                    end,
                    Some(TurnEndReason::Aborted {
                        reason: CancelCause::Parent
                    }),
                    "point {point}: a killed child still running"
                );
            }
        }
        for job in jobs_of.snapshots(parent.id()) {
            match jobs.iter().find(|j| j.id == job.id).map(|j| j.status) {
                Some(status) if status.is_terminal() => assert_eq!(job.status, status, "point {point}"),
                Some(_) => assert_eq!(job.status, agent::jobs::JobStatus::Killed, "point {point}"),
                None => {}
            }
        }
        assert!(
            sweep.children().is_empty(),
            "point {point}: a child outlived its job"
        );
        let settled_alone = !jobs.is_empty() && !killed_now;
        sweep.finish(point).await;
        if settled_alone {
            assert!(killed_running > 0, "some point killed a running child");
            return;
        }
    }
    panic!("the job never settled on its own within 1000 points");
}

/// A user's cancel of a turn that delegated in the background, at every scheduling point: the
/// call's token does not own a background child, so a child that was started always runs to
/// `completed` and its job completes, whenever the parent's turn was cancelled.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn user_cancel_never_reaches_a_background_child() {
    let mut saw_child = false;
    for point in 0..1000 {
        let sweep = Sweep::new(BACKGROUND).await;
        let (parent, jobs) = (sweep.parent.clone(), sweep.host.jobs().clone());
        for _ in 0..point {
            tokio::task::yield_now().await;
        }
        let parent_ended = last_turn_end(&parent).is_some();
        parent.cancel(CancelCause::User, CancelOptions::default());
        parent.when_idle().await;
        // Wait (virtual yields only) for the jobs the turn started to settle on their own.
        let mut spins = 0;
        while !jobs.snapshots(parent.id()).iter().all(|j| j.status.is_terminal()) {
            tokio::task::yield_now().await;
            spins += 1;
            assert!(spins < 100_000, "point {point}: a background job never settled");
        }
        for job in jobs.snapshots(parent.id()) {
            saw_child = true;
            assert_eq!(
                job.status,
                agent::jobs::JobStatus::Completed,
                "point {point}: the user's cancel reached the background child"
            );
        }
        sweep.finish(point).await;
        if parent_ended {
            assert!(saw_child, "some point started the background child");
            return;
        }
    }
    panic!("the parent's turn never completed within 1000 points");
}

/// The user's cancel racing for real on a multi-threaded runtime, through both delegation
/// tools: whatever the timing, the parent's turn ends `completed` or `aborted {user}`, the host
/// shuts down clean, and every log passes the online and offline checks. (Nothing waits on
/// time; timing only changes which interleaving each iteration sees.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_cancel_races_on_a_multi_threaded_runtime() {
    for point in 0..20 {
        for tool in ["subagent", "fork"] {
            let sweep = Sweep::new(Script {
                tool,
                background: false,
            })
            .await;
            sweep.cancel_after(point).await;
            // A dropped run's background disposal may still be finishing on the other worker;
            // the host's shutdown awaits it, and `finish` checks what it left.
            sweep.finish(point).await;
        }
    }
}

/// `job_kill` of a background child racing its settlement for real on a multi-threaded
/// runtime: whatever the timing, a killed job ends `killed` (or `completed`, when the kill lost
/// the race to its settlement), never stuck `stopping`; an untouched job completes; and every
/// log passes the online and offline checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_kill_races_settlement_on_a_multi_threaded_runtime() {
    for point in 0..24 {
        let sweep = Sweep::new(BACKGROUND).await;
        let (parent, jobs) = (sweep.parent.clone(), sweep.host.jobs().clone());
        for _ in 0..point {
            tokio::task::yield_now().await;
        }
        let mut killed = Vec::new();
        for job in jobs.snapshots(parent.id()) {
            if let Ok(agent_loop::jobs::KillOutcome::Requested(_)) =
                jobs.kill_job(parent.id(), &job.id, Some("race".into()))
            {
                killed.push(job.id.clone());
            }
        }
        sweep.host.settle(&parent).await;
        tokio::time::timeout(std::time::Duration::from_secs(60), async {
            while !jobs.snapshots(parent.id()).iter().all(|j| j.status.is_terminal()) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("point {point}: a job never settled"));
        for job in jobs.snapshots(parent.id()) {
            let expected: &[agent::jobs::JobStatus] = if killed.contains(&job.id) {
                // A kill that raced the job's own settlement may find it already completed.
                &[agent::jobs::JobStatus::Killed, agent::jobs::JobStatus::Completed]
            } else {
                &[agent::jobs::JobStatus::Completed]
            };
            assert!(
                expected.contains(&job.status),
                "point {point}: {:?} ended {:?}",
                job.id,
                job.status
            );
        }
        sweep.finish(point).await;
    }
}

/// The parent delegates four times in one response — two `subagent` and two `fork` calls, run
/// side by side — then answers; every child answers at once.
struct Parallel;

impl ModelAdapter for Parallel {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        let chunks = if request.session_id.as_ref().map(SessionId::as_str) != Some("coordinator") {
            chunks::text("child done")
        } else if request
            .messages
            .iter()
            .flat_map(|m| &m.content)
            .any(|b| matches!(b, ContentBlock::ToolResult { .. }))
        {
            chunks::text("parent done")
        } else {
            let call = |id: &str, tool: &str| {
                chunks::call(
                    id,
                    tool,
                    serde_json::json!({"description": id, "prompt": "do it"}),
                )
            };
            chunks::tool_calls(
                None,
                vec![
                    call("s1", "subagent"),
                    call("f1", "fork"),
                    call("s2", "subagent"),
                    call("f2", "fork"),
                ],
            )
        };
        futures::stream::iter(chunks.into_iter().map(Ok)).boxed()
    }
}

/// A user's cancel racing four parallel delegations (two `spawn`, two `fork`) for real on a
/// multi-threaded runtime: whatever the timing, the parent's turn ends `completed` or
/// `aborted {user}`, and the host shuts down clean with every log passing the online and
/// offline checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_cancel_races_parallel_delegations_on_a_multi_threaded_runtime() {
    for point in 0..24 {
        let sweep = Sweep::over(Arc::new(Parallel)).await;
        sweep.cancel_after(point).await;
        sweep.finish(point).await;
    }
}

/// The same four parallel delegations with the user's cancel at every scheduling point on a
/// paused current-thread runtime: the parent's turn ends `aborted {user}` until it had
/// completed, every child that was still running then ends `aborted {parent}`, and every log
/// passes the online and offline checks.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn user_cancel_of_parallel_delegations_at_every_point() {
    for point in 0..2000 {
        let sweep = Sweep::over(Arc::new(Parallel)).await;
        let parent = sweep.parent.clone();
        for _ in 0..point {
            tokio::task::yield_now().await;
        }
        let parent_ended = last_turn_end(&parent).is_some();
        let children = sweep.children_ended();
        parent.cancel(CancelCause::User, CancelOptions::default());
        sweep.host.settle(&parent).await;
        let expected = if parent_ended {
            TurnEndReason::Completed
        } else {
            TurnEndReason::Aborted {
                reason: CancelCause::User,
            }
        };
        assert_eq!(last_turn_end(&parent), Some(expected), "point {point}");
        for (child, ended_before) in &children {
            let end = last_turn_end(child);
            if *ended_before {
                assert_eq!(end, Some(TurnEndReason::Completed), "point {point}");
            } else if let Some(end) = end {
                assert_eq!(
                    end,
                    TurnEndReason::Aborted {
                        reason: CancelCause::Parent
                    },
                    "point {point}: a child still running when the user cancelled"
                );
            }
        }
        sweep.finish(point).await;
        if parent_ended {
            assert!(point > 0);
            return;
        }
    }
    panic!("the parent never completed within 2000 points");
}
