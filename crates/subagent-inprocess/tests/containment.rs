//! Panic containment at the run's boundary (ARCHITECTURE, Errors and Concurrency: a misbehaving
//! child or host fails a future with a typed error and never unwinds into the caller; listener
//! calls are contained). Each test drives a run whose host-side piece panics at a place the
//! driver calls synchronously, and checks the failure lands on its own channel while the rest of
//! the run behaves and the host ends quiescent.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::{AgentHandle, CancelCause, Disposer};
use agent_loop::model::{ScriptEntry, chunks};
use common::*;
use futures::future::BoxFuture;
use subagent::StopReason;
use subagent::run::SubagentRun;
use subagent_inprocess::InProcessRunOptions;

/// Starts the real teardown (a dropped first teardown future finishes on a runtime task), then
/// panics at the call instead of returning a future.
struct PanicsAtTheCall(AgentHandle);

impl Disposer for PanicsAtTheCall {
    fn dispose(&self) -> BoxFuture<'static, ()> {
        drop(self.0.dispose());
        panic!("disposer refused at the call");
    }
}

/// Panics at the call without starting any teardown: the child is neither cancelled nor
/// released by the call. It holds the real handle, whose teardown starts only when the wrapper
/// (and so this disposer) is dropped.
struct RefusesAtTheCall(#[allow(dead_code)] AgentHandle);

impl Disposer for RefusesAtTheCall {
    fn dispose(&self) -> BoxFuture<'static, ()> {
        panic!("disposer refused before doing anything");
    }
}

/// Returns a future that panics when first polled, without starting any teardown: the child is
/// neither cancelled nor released by it (a host disposer written as an `async` block whose body
/// fails before it reaches the teardown). It holds the real handle, whose teardown starts only
/// when the wrapper (and so this disposer) is dropped.
struct RefusesInItsFuture(#[allow(dead_code)] AgentHandle);

impl Disposer for RefusesInItsFuture {
    fn dispose(&self) -> BoxFuture<'static, ()> {
        Box::pin(async { panic!("disposer failed before tearing anything down") })
    }
}

/// Waits (paused clock) until the child left the registry and its session was removed.
async fn until_released(host: &Host, id: &agent::SessionId) {
    while host.get(id).is_some() || host.session_count() > 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A started run on a child that hangs in its turn, whose handle's disposer is `disposer` (given
/// the real handle), after the child's turn began.
async fn hanging_run_disposed_by(
    host: &Host,
    disposer: impl Fn(AgentHandle) -> Arc<dyn Disposer> + Send + Sync + 'static,
) -> (subagent_inprocess::InProcessDriver, subagent_inprocess::LocalRun) {
    let driver = wrapped_driver(host, move |handle| {
        let agent = handle.agent().clone();
        AgentHandle::new(agent, disposer(handle))
    });
    let run = driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    (driver, run)
}

/// Waits until child `id` was released, then checks the driver and the host end quiescent.
async fn ends_released(host: Host, driver: &subagent_inprocess::InProcessDriver, id: &agent::SessionId) {
    until_released(&host, id).await;
    driver.wait().await;
    assert_eq!(driver.task_count(), 0);
    host.finish().await;
}

/// spec: DRV-5 — a host disposer that panics when called (not in its future) fails `dispose()`
/// with `HandleDisposalFailed` instead of unwinding into the caller: every call returns the same
/// failure, the result keeps its own channel, dropping the run does not panic, and the registries
/// end clean.
#[tokio::test(start_paused = true)]
async fn a_disposer_panicking_at_the_call_fails_dispose_not_its_caller() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (driver, run) = hanging_run_disposed_by(&host, |handle| Arc::new(PanicsAtTheCall(handle))).await;
    let id = run.id().clone();
    let first = run.dispose().await.unwrap_err();
    assert!(
        first.to_string().contains("disposer refused at the call"),
        "{first}"
    );
    let second = run.dispose().await.unwrap_err();
    assert_eq!(second.to_string(), first.to_string(), "memoized");
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    drop(run);
    ends_released(host, &driver, &id).await;
}

/// spec: DRV-5 — a host disposer that panics at the call before cancelling anything does not
/// leave `dispose()` waiting forever on a child nobody tears down: the run cancels the child
/// itself (cause `disposed`), so the result settles `aborted` and `dispose()` fails with the
/// disposer's panic. The child stays owned by its parent's scope, which releases it.
#[tokio::test(start_paused = true)]
async fn a_disposer_refusing_at_the_call_still_stops_the_child() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (driver, run) = hanging_run_disposed_by(&host, |handle| Arc::new(RefusesAtTheCall(handle))).await;
    let id = run.id().clone();
    let failure = tokio::time::timeout(Duration::from_secs(3600), run.dispose())
        .await
        .expect("dispose settles although the disposer started no teardown")
        .unwrap_err();
    assert!(
        failure
            .to_string()
            .contains("disposer refused before doing anything"),
        "{failure}"
    );
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    assert_eq!(
        run.child()
            .session()
            .events()
            .iter()
            .rev()
            .find_map(|e| match &e.data {
                agent::EventData::TurnEnd { reason, .. } => Some(reason.clone()),
                _ => None,
            }),
        Some(agent::TurnEndReason::Aborted {
            reason: CancelCause::Disposed
        }),
        "the child's turn was cancelled with cause disposed"
    );
    drop(run);
    ends_released(host, &driver, &id).await;
}

/// spec: DRV-5, §3.8 — a host disposer whose *future* panics before it cancelled anything (not
/// at the call) does not leave `dispose()` waiting forever on the result of a child nobody tears
/// down: the run cancels the child itself (cause `disposed`), so the result settles `aborted`
/// and `dispose()` fails with the disposer's panic. The child stays owned by its parent's scope,
/// which releases it.
#[tokio::test(start_paused = true)]
async fn a_disposer_failing_in_its_future_still_stops_the_child() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (driver, run) = hanging_run_disposed_by(&host, |handle| Arc::new(RefusesInItsFuture(handle))).await;
    let id = run.id().clone();
    let failure = tokio::time::timeout(Duration::from_secs(3600), run.dispose())
        .await
        .expect("dispose settles although the disposer's future started no teardown")
        .unwrap_err();
    assert!(
        failure
            .to_string()
            .contains("disposer failed before tearing anything down"),
        "{failure}"
    );
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    assert_eq!(
        last_turn_end(run.child()),
        Some(agent::TurnEndReason::Aborted {
            reason: CancelCause::Disposed
        }),
        "the child's turn was cancelled with cause disposed"
    );
    drop(run);
    ends_released(host, &driver, &id).await;
}

/// spec: DRV-5 — a run dropped undisposed whose host disposer panics at the call does not panic
/// in `drop` (where a panic during unwinding would abort the process); the child is still
/// released.
#[tokio::test(start_paused = true)]
async fn dropping_a_run_whose_disposer_panics_does_not_panic() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (driver, run) = hanging_run_disposed_by(&host, |handle| Arc::new(PanicsAtTheCall(handle))).await;
    let id = run.id().clone();
    drop(run);
    ends_released(host, &driver, &id).await;
}

/// spec: DRV-5, §3.8 — a run dropped undisposed whose host disposer's future panics before it
/// cancelled anything does not leave its background disposal (a task on the driver's tracker)
/// and its result task waiting on each other forever: the child is stopped and released, and the
/// driver's tracker empties.
#[tokio::test(start_paused = true)]
async fn dropping_a_run_whose_disposer_fails_in_its_future_releases_the_child() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (driver, run) = hanging_run_disposed_by(&host, |handle| Arc::new(RefusesInItsFuture(handle))).await;
    let id = run.id().clone();
    drop(run);
    tokio::time::timeout(Duration::from_secs(3600), driver.wait())
        .await
        .expect("the background disposal and the result task finish");
    ends_released(host, &driver, &id).await;
}

/// spec: DRV-5; ARCHITECTURE (Errors: no silent fallbacks) — a run dropped undisposed whose
/// background disposal fails (the host's disposer panicked) reports that failure as a warning
/// naming the child and the panic: nobody awaits a background disposal, so a failure it only
/// returned would vanish.
#[tokio::test(start_paused = true)]
async fn a_failed_background_disposal_is_logged() {
    let warnings = agent_loop::warnings::WarningCapture::new();
    let _subscriber = warnings.install();
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let (driver, run) = hanging_run_disposed_by(&host, |handle| Arc::new(PanicsAtTheCall(handle))).await;
    let id = run.id().clone();
    drop(run);
    ends_released(host, &driver, &id).await;
    let failures: Vec<_> = warnings
        .warnings()
        .into_iter()
        .filter(|w| w.mentions("disposer refused at the call"))
        .collect();
    assert_eq!(failures.len(), 1, "{:?}", warnings.warnings());
    assert!(failures[0].mentions(id.as_str()), "{:?}", failures[0]);
}

/// spec: §3.5 — after publication failures belong to `result`: a prompt delivery that panics
/// (rather than returning an error, DRV-5) is the same infrastructure fault. The start fulfils
/// with the published child, `result` rejects naming the panic, `dispose` succeeds, and nothing
/// is left behind.
#[tokio::test(start_paused = true)]
async fn a_panicking_prompt_delivery_fails_the_result_not_the_start() {
    let host = Host::new(vec![]).await;
    let (agents, sessions) = (host.agent_count(), host.session_count());
    let driver = wrapped_driver(&host, |handle| {
        HookedAgent::new(handle.agent())
            .on_send(|| panic!("delivery exploded"))
            .handle(handle)
    });
    let run = driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .expect("the child was published, so the start fulfils");
    assert!(host.get(run.id()).is_some());
    let failure = run.result().await.unwrap_err();
    assert!(failure.to_string().contains("delivery exploded"), "{failure}");
    run.dispose().await.unwrap();
    driver.wait().await;
    assert_eq!((host.agent_count(), host.session_count()), (agents, sessions));
    host.finish().await;
}

/// spec: DRV-18 — an abort in the handoff window runs the cancel action from the start itself;
/// a host child whose `cancel` panics there does not unwind out of the start: the run is
/// returned, its result is `{output: [], stopReason: aborted}` (the prompt is never delivered),
/// and disposal cleans up.
#[tokio::test(start_paused = true)]
async fn a_panicking_child_cancel_in_the_handoff_window_does_not_fail_the_start() {
    let host = Host::new(vec![]).await;
    let before = (host.agent_count(), host.session_count());
    let signal = agent::Signal::new();
    let at_handoff = signal.clone();
    let driver = wrapped_driver(&host, move |handle| {
        at_handoff.cancel(CancelCause::User);
        HookedAgent::new(handle.agent())
            .on_cancel(|| panic!("cancel exploded"))
            .handle(handle)
    });
    let run = driver
        .start(
            resolve(request_from(&host.parent, signal), "test"),
            InProcessRunOptions::fresh(),
        )
        .await
        .expect("the child was published, so the start fulfils");
    assert_eq!(
        run.result().await.unwrap(),
        subagent::SubagentResult::new(vec![], StopReason::Aborted)
    );
    run.dispose().await.unwrap();
    driver.wait().await;
    assert_eq!((host.agent_count(), host.session_count()), before);
    host.finish().await;
}

/// ARCHITECTURE (listener containment) — a settled observer registered with `on_settled` that
/// panics is contained: the result every awaiter sees is still the child's own (`completed`
/// with its text), not a task failure caused by the observer.
#[tokio::test(start_paused = true)]
async fn a_panicking_settled_observer_leaves_the_result_intact() {
    let host = Host::new(vec![chunks::text("the answer").into()]).await;
    let run = host
        .driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let accepted = run.on_settled(Box::new(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
        panic!("observer exploded");
    }));
    assert!(accepted.is_ok(), "registered before the result settled");
    let result = run
        .result()
        .await
        .expect("the observer's panic is not the run's failure");
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(text(&result.output), "the answer");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    run.dispose().await.unwrap();
    host.finish().await;
}
