//! [`Host::settle`] is event-driven: it waits for a background job or a continuable child on the
//! changes they signal, not on a timer. With the clock paused, a settle that has to wait
//! returns without the clock moving at all (the old poll slept 25 ms per round, so the paused
//! clock advanced in 25 ms steps while it waited).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::jobs::{JobHooks, JobOutcome, JobSpec, JobStatus};
use agent::{GenerateOptions, ModelAdapter, ModelStream, SessionId};
use agent_loop::model::chunks;
use futures::StreamExt;
use subagent_cli::host::{Host, HostOptions, build_host};

/// One poll period of the old `settle`: a settle that waited must not have moved the paused
/// clock this far (in fact it must not have moved it at all).
const OLD_POLL: Duration = Duration::from_millis(25);

/// Answers every call with a text, counting the calls.
struct Counting(Arc<AtomicUsize>);

impl ModelAdapter for Counting {
    fn stream(&self, _options: Arc<GenerateOptions>) -> ModelStream {
        self.0.fetch_add(1, Ordering::SeqCst);
        futures::stream::iter(chunks::text("ok").into_iter().map(Ok)).boxed()
    }
}

/// A settle waiting for a running background job (job notices on) returns once the job has
/// settled, its notice was delivered and the turn it started is done — with the paused clock
/// not advanced: the job's settlement and the notice's delivery wake it, no timer does. Before
/// the fix the clock advanced by the 25 ms poll period (this assertion failed with 25 ms).
#[tokio::test(start_paused = true)]
async fn settle_waits_for_a_background_job_without_the_clock_advancing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let calls = Arc::new(AtomicUsize::new(0));
    let mut options = HostOptions::new(dir.path(), Arc::new(Counting(calls.clone())), "mock", "mock");
    options.deliver_job_notices = true;
    let (host, observer) = support::observed_host(options);
    let agent = host.create_agent(SessionId::from("owner")).await.expect("agent");
    host.run_turn(agent.agent(), "hello")
        .await
        .expect("the first turn runs");
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let id = host
        .jobs()
        .start_job(JobSpec {
            kind: "test".into(),
            label: "gated".into(),
            owner: SessionId::from("owner"),
            starter: Box::new(move || JobHooks {
                cancel: Box::new(|_| {}),
                done: Box::pin(async move {
                    let _ = finished.await;
                    JobOutcome {
                        status: JobStatus::Completed,
                        output: Some("the job's output".into()),
                        detail: None,
                    }
                }),
            }),
        })
        .expect("the job starts");

    let start = tokio::time::Instant::now();
    let settle = host.settle(agent.agent());
    let release = async {
        // Polled after `settle`'s first check found the job running.
        tokio::task::yield_now().await;
        finish.send(()).expect("the job waits");
    };
    // A hang guard only (the clock is paused: nothing here waits for real time).
    tokio::time::timeout(Duration::from_secs(3600), async { tokio::join!(settle, release) })
        .await
        .expect("settle returns once the job settled and its notice was answered");
    let elapsed = start.elapsed();
    assert!(
        elapsed < OLD_POLL,
        "settle polled: the paused clock advanced {elapsed:?}"
    );
    assert_eq!(elapsed, Duration::ZERO, "settle waited on a timer");

    let job = host
        .jobs()
        .get(&SessionId::from("owner"), &id)
        .expect("the job is listed");
    assert!(job.status.is_terminal() && !job.reported, "{job:?}");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "settle waited for the turn the job's notice started"
    );
    agent.dispose().await;
    let jobs = host.jobs().clone();
    let agent_events = host.runtime().services().agent_events.clone();
    host.shutdown().await.expect("shutdown");
    assert!(jobs.counts().is_empty(), "{:?}", jobs.counts());
    assert_eq!(agent_events.listener_count(), 0, "the host's listeners are gone");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}

/// A coordinator that delegates one continuable child, says it is waiting, and answers once the
/// child's settlement notice arrived. The child's model call waits for `gate`.
struct Gated {
    /// Set once the child's model call has started.
    child_running: tokio::sync::watch::Sender<bool>,
    /// Opened by the test to let the child answer.
    gate: tokio::sync::watch::Sender<bool>,
}

impl ModelAdapter for Gated {
    fn stream(&self, options: Arc<GenerateOptions>) -> ModelStream {
        if options.session_id.as_ref().map(SessionId::as_str) != Some("coordinator") {
            self.child_running.send_replace(true);
            let mut gate = self.gate.subscribe();
            return futures::stream::once(async move {
                gate.wait_for(|open| *open)
                    .await
                    .expect("the model outlives its calls");
                futures::stream::iter(chunks::text("the child's finding").into_iter().map(Ok))
            })
            .flatten()
            .boxed();
        }
        let notices = options
            .messages
            .iter()
            .filter(|m| m.source.kind() == "subagent-settled")
            .count();
        let started = options
            .messages
            .iter()
            .any(|m| serde_json::to_string(&m.content).is_ok_and(|t| t.contains("started subagent ")));
        let reply = match (started, notices) {
            (false, _) => chunks::tool_call(
                "call-1",
                "subagent",
                serde_json::json!({"description": "research", "prompt": "find it"}),
            ),
            (true, 0) => chunks::text("waiting for the child"),
            (true, _) => chunks::text("final: the child answered"),
        };
        futures::stream::iter(reply.into_iter().map(Ok)).boxed()
    }
}

/// A settle (here `run_turn`'s) that waits on a resident continuable child finishes once the
/// child settles and announces (and the coordinator answered the notice), with the paused clock
/// not advanced: the child's release and the notice's delivery wake it, no timer does. Before
/// the fix the clock advanced by the 25 ms poll period (this assertion failed with 25 ms).
#[tokio::test(start_paused = true)]
async fn settle_waits_for_a_continuable_child_without_the_clock_advancing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (child_running, _) = tokio::sync::watch::channel(false);
    let (gate, _) = tokio::sync::watch::channel(false);
    let model = Arc::new(Gated { child_running, gate });
    let mut options = HostOptions::new(dir.path(), model.clone(), "mock", "mock");
    options.continuable = true;
    let (host, observer) = support::observed_host(options);
    let coordinator = host
        .create_agent(SessionId::from("coordinator"))
        .await
        .expect("coordinator");

    let start = tokio::time::Instant::now();
    let turn = host.run_turn(coordinator.agent(), "delegate the research");
    let release = async {
        let mut running = model.child_running.subscribe();
        running.wait_for(|r| *r).await.expect("the model lives");
        // The coordinator's own turn ends while the child still works: from here on only the
        // child keeps the settle waiting.
        coordinator.agent().when_idle().await;
        assert_eq!(
            host.continuation().resident().len(),
            1,
            "the child is resident and working"
        );
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        model.gate.send_replace(true);
    };
    // A hang guard only (the clock is paused: nothing here waits for real time).
    let (turn, ()) = tokio::time::timeout(Duration::from_secs(3600), async { tokio::join!(turn, release) })
        .await
        .expect("settle returns once the child announced and the coordinator answered");
    turn.expect("the turn runs");
    let elapsed = start.elapsed();
    assert!(
        elapsed < OLD_POLL,
        "settle polled: the paused clock advanced {elapsed:?}"
    );
    assert_eq!(elapsed, Duration::ZERO, "settle waited on a timer");
    assert_eq!(
        Host::last_answer(coordinator.agent().as_ref()).as_deref(),
        Some("final: the child answered"),
        "settle waited for the child's notice and the coordinator's answer to it"
    );
    assert!(
        host.continuation().resident().is_empty(),
        "the child was released"
    );
    assert!(host.continuation().notices_under_way().is_empty());
    coordinator.dispose().await;
    let agent_events = host.runtime().services().agent_events.clone();
    host.shutdown().await.expect("shutdown");
    assert_eq!(agent_events.listener_count(), 0, "the host's listeners are gone");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}

/// A job settled by a kill is reported, so no notice is emitted and the owner runs no turn for
/// it: the only sign of it is the job registry's change counter, and that alone wakes a settle
/// waiting on the job — at once, the paused clock not advanced.
#[tokio::test(start_paused = true)]
async fn settle_wakes_on_a_killed_job_that_emits_no_notice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let calls = Arc::new(AtomicUsize::new(0));
    let mut options = HostOptions::new(dir.path(), Arc::new(Counting(calls.clone())), "mock", "mock");
    options.deliver_job_notices = true;
    let host: Host = build_host(options).expect("the host composes");
    let owner = SessionId::from("owner");
    let agent = host.create_agent(owner.clone()).await.expect("agent");
    let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
    let cancel = std::sync::Mutex::new(Some(cancel));
    let id = host
        .jobs()
        .start_job(JobSpec {
            kind: "test".into(),
            label: "killed".into(),
            owner: owner.clone(),
            starter: Box::new(move || JobHooks {
                cancel: Box::new(move |_| {
                    if let Some(cancel) = cancel.lock().expect("not poisoned").take() {
                        let _ = cancel.send(());
                    }
                }),
                done: Box::pin(async move {
                    let _ = cancelled.await;
                    JobOutcome {
                        status: JobStatus::Killed,
                        output: None,
                        detail: None,
                    }
                }),
            }),
        })
        .expect("the job starts");

    let start = tokio::time::Instant::now();
    let settle = host.settle(agent.agent());
    let kill = async {
        tokio::task::yield_now().await;
        host.jobs().kill_job(&owner, &id, None).expect("killed");
    };
    // A hang guard only (the clock is paused: nothing here waits for real time).
    tokio::time::timeout(Duration::from_secs(3600), async { tokio::join!(settle, kill) })
        .await
        .expect("settle returns once the killed job settled");
    assert_eq!(start.elapsed(), Duration::ZERO, "settle waited on a timer");
    let job = host.jobs().get(&owner, &id).expect("listed");
    assert!(job.status.is_terminal() && job.reported, "{job:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no turn ran for the killed job");
    agent.dispose().await;
    let jobs = host.jobs().clone();
    host.shutdown().await.expect("shutdown");
    assert!(jobs.counts().is_empty(), "{:?}", jobs.counts());
}
