//! The seam's lifecycle under cancellation: a one-shot `spawn` started through the service, its
//! request signal cancelled at **every** scheduling point, once per point (counted in
//! `yield_now` calls on a paused current-thread runtime, with the model's chunks one scheduling
//! point apart). At every point the lifecycle stays exact:
//!
//! * a start that rejects emits nothing; a start that fulfils emits one `subagent/start`, and
//!   exactly one `subagent/end` follows it, with the run's own stop reason and output;
//! * the seam's lifecycle companion records no violation and no open run, the service has no
//!   pending run after `close`, and the host ends quiescent with a clean invariant record.

#[path = "../../subagent-inprocess/tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use agent::{CancelCause, Signal};
use agent_loop::ScriptedModel;
use agent_loop::model::chunks;
use common::*;
use invariants::SeamLifecycleCompanion;
use parking_lot::Mutex;
use subagent::StopReason;
use subagent::events::{SubagentEvent, SubagentRunEndInfo};

/// Starts one delegation through the service and cancels its request signal after `point`
/// yields. Returns the run's stop reason, or `None` when the start rejected.
async fn cancel_at(point: usize) -> Option<StopReason> {
    let script = ScriptedModel::new(vec![chunks::text("done")]);
    let host = Host::trickled(&script).await;
    let provider = subagent_spawn::register(&host.service, host.driver.clone()).expect("registered");
    let seam = SeamLifecycleCompanion::new();
    let listening = seam.listen(&host.service);
    let ends: Arc<Mutex<Vec<SubagentRunEndInfo>>> = Arc::default();
    let starts = Arc::new(Mutex::new(0usize));
    let recorder = host.service.events().on({
        let (ends, starts) = (ends.clone(), starts.clone());
        move |e: &SubagentEvent| {
            match e {
                SubagentEvent::Start(_) => *starts.lock() += 1,
                SubagentEvent::End(end) => ends.lock().push(end.clone()),
                _ => {}
            }
            Ok(())
        }
    });
    let signal = Signal::new();
    let start = {
        let service = host.service.clone();
        let request = request_from(&host.parent, signal.clone());
        tokio::spawn(async move { service.start("spawn", request).await })
    };
    for _ in 0..point {
        tokio::task::yield_now().await;
    }
    signal.cancel(CancelCause::Other {
        reason: "sweep".into(),
    });
    let outcome = match start.await.expect("start task") {
        Err(_) => None,
        Ok(run) => {
            let result = run.result().await.expect("result");
            run.dispose().await.expect("disposed");
            Some(result)
        }
    };
    host.service.close().await;
    let ends = ends.lock().clone();
    match &outcome {
        None => {
            assert_eq!(
                *starts.lock(),
                0,
                "point {point}: a rejected start announced itself"
            );
            assert!(ends.is_empty(), "point {point}: a rejected start ended");
        }
        Some(result) => {
            assert_eq!(*starts.lock(), 1, "point {point}");
            assert_eq!(ends.len(), 1, "point {point}: exactly one end edge");
            assert_eq!(ends[0].stop_reason, result.stop_reason, "point {point}");
            let output = (!result.output.is_empty()).then(|| result.output.clone());
            assert_eq!(ends[0].last_assistant_message, output, "point {point}");
        }
    }
    drop((recorder, listening, provider));
    assert!(
        seam.violations().is_empty(),
        "point {point}: {:#?}",
        seam.violations()
    );
    assert_eq!(seam.open_runs(), 0, "point {point}");
    assert_eq!(host.service.pending_runs(), 0, "point {point}");
    host.finish().await;
    outcome.map(|r| r.stop_reason)
}

/// spec: SEAM-105, SEAM-107, SEAM-108 — lifecycle after fulfilment only, start before end, one
/// end per start (carrying the output, omitted when empty), at every point a request signal can
/// fire: rejected starts are silent, aborted and completed runs each end once with their own
/// stop reason and output.
#[tokio::test(start_paused = true)]
async fn lifecycle_at_every_cancellation_point() {
    let mut outcomes = Vec::new();
    for point in 0..500 {
        let outcome = cancel_at(point).await;
        let done = outcome == Some(StopReason::Completed);
        outcomes.push(outcome);
        if done {
            assert_eq!(outcomes[0], None, "a cancel before any progress rejects");
            assert!(
                outcomes.contains(&Some(StopReason::Aborted)),
                "some point aborted a running child: {outcomes:?}"
            );
            return;
        }
    }
    panic!("the child never completed within 500 points");
}

/// Two `close()` calls waiting at once on the same pending run both return once its `end`
/// edge is out (neither reopening the service under the other's wait).
#[tokio::test(start_paused = true)]
async fn concurrent_closes_both_return() {
    let script = ScriptedModel::new(vec![chunks::text("done")]);
    let host = Host::trickled(&script).await;
    let provider = subagent_spawn::register(&host.service, host.driver.clone()).expect("registered");
    let run = host
        .service
        .start("spawn", request_from(&host.parent, Signal::new()))
        .await
        .expect("started");
    let first = tokio::spawn({
        let service = host.service.clone();
        async move { service.close().await }
    });
    let second = tokio::spawn({
        let service = host.service.clone();
        async move { service.close().await }
    });
    tokio::task::yield_now().await;
    run.result().await.expect("result");
    run.dispose().await.expect("disposed");
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        first.await.expect("first close");
        second.await.expect("second close");
    })
    .await
    .expect("both closes return");
    drop(provider);
    host.finish().await;
}
