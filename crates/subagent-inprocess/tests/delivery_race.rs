//! Interruptions landing between the child's publication and the prompt's delivery (spec
//! `inprocess-providers.md` §3.2 steps 7–8, §3.4, §3.6). On a multi-threaded runtime another
//! thread can cancel the request signal, or dispose the parent, after the start's last look and
//! before (or while) the prompt reaches the child's inbox. Each interleaving is reproduced
//! deterministically by acting exactly at that point: from the child's delivery, or from the
//! runtime's creation returning the handle.

mod common;

use std::sync::Arc;

use agent::{CancelCause, Signal, TurnEndReason};
use agent_loop::model::chunks;
use common::*;
use futures::FutureExt;
use parking_lot::Mutex;
use subagent::StopReason;
use subagent::run::SubagentRun;
use subagent_inprocess::InProcessRunOptions;

/// spec: §3.4 (after publication), DRV-16 — a request-signal cancellation that lands after the
/// start's last check but before the prompt is in the child's inbox still stops the child: the
/// delivered prompt's turn is aborted with cause `parent`, the model is never asked for the
/// answer, and the result is `aborted` — never a `completed` run of a cancelled request.
#[tokio::test(start_paused = true)]
async fn a_cancel_racing_the_prompt_delivery_is_not_lost() {
    let host = Host::new(vec![chunks::text("the full answer").into()]).await;
    let signal = Signal::new();
    let racing = signal.clone();
    let driver = wrapped_driver(&host, move |handle| {
        // The racing thread's cancel lands right before the prompt is enqueued.
        let racing = racing.clone();
        HookedAgent::new(handle.agent())
            .on_send(move || {
                racing.cancel(CancelCause::User);
                Ok(())
            })
            .handle(handle)
    });
    let run = driver
        .start(
            resolve(request_from(&host.parent, signal), "test"),
            InProcessRunOptions::fresh(),
        )
        .await
        .unwrap();
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted, "{result:?}");
    assert!(result.output.is_empty(), "{result:?}");
    assert!(
        host.model.requests().is_empty(),
        "the cancelled child never asked the model"
    );
    assert_eq!(
        last_turn_end(run.child()),
        Some(TurnEndReason::Aborted {
            reason: CancelCause::Parent
        })
    );
    run.dispose().await.unwrap();
    driver.wait().await;
    host.finish().await;
}

/// spec: §3.6, §3.4 (after publication) — a parent disposed (from another thread) after the
/// child's publication and before the prompt's delivery drains the child before it could take
/// the prompt. That is the owner's cancellation, not an infrastructure fault: the start fulfils
/// with the published child, the result is `{output: [], stopReason: aborted}` — as for a
/// parent disposal at any later point — and nothing is left behind.
#[tokio::test(start_paused = true)]
async fn a_parent_disposed_before_the_prompt_delivery_reports_aborted() {
    let mut host = Host::new(vec![chunks::text("the full answer").into()]).await;
    let parent = Mutex::new(host.parent_handle.take());
    let disposal = Arc::new(Mutex::new(None));
    let in_flight = disposal.clone();
    let driver = wrapped_driver(&host, move |handle| {
        if let Some(parent) = parent.lock().take() {
            // The parent's teardown (memoized) drains its owned child at once.
            let mut teardown = parent.dispose();
            if (&mut teardown).now_or_never().is_none() {
                *in_flight.lock() = Some(teardown);
            }
            assert!(
                !handle.agent().is_live(),
                "the child is being drained with its owner"
            );
        }
        handle
    });
    let run = driver
        .start(resolve(host.request(), "test"), InProcessRunOptions::fresh())
        .await
        .expect("the child was published, so the start fulfils");
    assert_eq!(
        run.result()
            .await
            .expect("a drained child is a cancellation, not a fault"),
        subagent::SubagentResult::new(vec![], StopReason::Aborted)
    );
    assert!(host.model.requests().is_empty());
    run.dispose().await.unwrap();
    let teardown = disposal.lock().take();
    if let Some(teardown) = teardown {
        teardown.await;
    }
    driver.wait().await;
    host.finish().await;
}
