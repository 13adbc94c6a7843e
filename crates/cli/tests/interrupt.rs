//! [`TwoStage`] over the process's real Ctrl-C: SIGINT sent to this test process (its own
//! binary, so no other test shares the handler). The first SIGINT is announced and leaves work
//! that never ends running; the second abandons it. Readiness is observed (the announcement),
//! never slept for; every wait has a generous deadline so a regression fails instead of hanging.
#![cfg(unix)]

use std::process::Command;
use std::time::Duration;

use subagent_cli::interrupt::{Abandoned, TwoStage, ctrl_c};

/// How long a step may take before the test counts as hung.
const DEADLINE: Duration = Duration::from_secs(60);

/// Sends SIGINT to this process.
fn sigint_self() {
    let status = Command::new("kill")
        .args(["-INT", &std::process::id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_real_sigint_abandons_work_that_never_ends() {
    let stages = TwoStage::new(ctrl_c().expect("listen for SIGINT"));
    let stop = stages.first_interrupt();
    let (announced_tx, announced) = tokio::sync::oneshot::channel();
    let run = tokio::spawn(stages.run(std::future::pending::<()>(), move || {
        let _ = announced_tx.send(());
    }));

    sigint_self();
    tokio::time::timeout(DEADLINE, announced)
        .await
        .expect("the first SIGINT is announced")
        .expect("announced once");
    assert!(stop.has_arrived());
    assert!(
        !run.is_finished(),
        "one SIGINT only asks: the work is still awaited"
    );

    sigint_self();
    let outcome = tokio::time::timeout(DEADLINE, run)
        .await
        .expect("the second SIGINT ends the wait")
        .expect("no panic");
    assert_eq!(outcome, Err(Abandoned));
}
