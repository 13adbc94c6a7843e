//! End to end, in process: the demo's host (scripted model, JSON-lines store, spawn and fork
//! providers, delegation tools, background jobs) runs the scripted coordinator; the live tree it
//! produced and the durable catalog read back from its store both show the parent with its four
//! children (two parallel `spawn`, one `fork`, one background `spawn`), and the store replays
//! clean through the invariant checker.

use std::sync::Arc;

use parking_lot::Mutex;
use subagent::StopReason;
use subagent_cli::catalog::read_catalog;
use subagent_cli::demo::{DELEGATIONS, run_demo};
use subagent_cli::tree::{NodeStatus, TreeChange, TreeSink};

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn demo_host_produces_the_delegation_tree_and_a_clean_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let changes: Arc<Mutex<Vec<TreeChange>>> = Arc::default();
    let seen = changes.clone();
    let sink: TreeSink = Arc::new(move |change, _tree| seen.lock().push(change.clone()));

    let outcome = run_demo(dir.path(), Some(sink)).await.expect("the demo runs");

    // The live tree: one root, four children, every run completed.
    let root = &outcome.tree[0];
    assert_eq!(root.id, outcome.coordinator);
    assert_eq!(root.parent, None);
    let children: Vec<_> = outcome
        .tree
        .iter()
        .filter(|n| n.parent.as_ref() == Some(&outcome.coordinator))
        .collect();
    assert_eq!(children.len(), 4, "{}", outcome.rendered_tree);
    for child in &children {
        assert_eq!(child.depth, 1);
        assert_eq!(
            child.status,
            NodeStatus::Ended(StopReason::Completed),
            "{child:?}"
        );
    }
    for d in DELEGATIONS {
        let provider = if d.tool == "fork" { "fork" } else { "spawn" };
        let node = children
            .iter()
            .find(|n| n.label.as_deref() == Some(d.label))
            .unwrap_or_else(|| panic!("no child labelled {:?}:\n{}", d.label, outcome.rendered_tree));
        assert_eq!(node.provider.as_deref(), Some(provider), "{}", d.label);
        assert_eq!(node.background_job.is_some(), d.background, "{}", d.label);
    }
    assert_eq!(outcome.model_calls, 10);
    assert!(
        outcome.answer.starts_with("Here is the briefing, reviewed."),
        "{}",
        outcome.answer
    );
    assert!(
        outcome.answer.contains("Review (fork): I inherited"),
        "{}",
        outcome.answer
    );

    // The lifecycle events fed the tree: four starts and four ends.
    let changes = changes.lock().clone();
    let started = changes
        .iter()
        .filter(|c| matches!(c, TreeChange::Started(_)))
        .count();
    let ended = changes
        .iter()
        .filter(|c| matches!(c, TreeChange::Ended(_)))
        .count();
    assert_eq!((started, ended), (4, 4));

    // The durable catalog says the same.
    let catalog = read_catalog(dir.path()).await.expect("catalog");
    assert!(catalog.unreadable.is_empty(), "{:?}", catalog.unreadable);
    let roots = catalog.roots();
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0].id, outcome.coordinator);
    assert_eq!(roots[0].turns, 2);
    assert_eq!(roots[0].last_stop.as_deref(), Some("completed"));
    let stored = catalog.children(&outcome.coordinator);
    assert_eq!(stored.len(), 4, "{}", catalog.render());
    let count = |provider: &str, background: bool| {
        stored
            .iter()
            .filter(|c| c.provider.as_deref() == Some(provider) && c.background == background)
            .count()
    };
    assert_eq!(
        count("spawn", false),
        2,
        "two parallel spawn children\n{}",
        catalog.render()
    );
    assert_eq!(count("fork", false), 1, "one fork child\n{}", catalog.render());
    assert_eq!(
        count("spawn", true),
        1,
        "one background spawn child\n{}",
        catalog.render()
    );
    let fork = stored
        .iter()
        .find(|c| c.provider.as_deref() == Some("fork"))
        .expect("fork child");
    assert!(
        fork.header.seed_length.is_some_and(|n| n > 0),
        "the fork child inherited the first turn"
    );
    let background = stored.iter().find(|c| c.background).expect("background child");
    assert_eq!(background.background_job.as_deref(), Some("subagent-1"));
    for child in &stored {
        assert_eq!((child.depth, child.turns), (1, 1), "{}", child.id);
        assert_eq!(child.last_stop.as_deref(), Some("completed"));
    }

    // The two spawn children were started from one assistant message (two tool calls).
    let parent = agent_loop::JsonlStore::new(dir.path())
        .load(&outcome.coordinator)
        .await
        .expect("coordinator log");
    let fan_out = parent
        .events
        .iter()
        .find_map(|e| match &e.data {
            agent::EventData::AssistantMessage { message, .. } => {
                let calls: Vec<&str> = message
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        agent::ContentBlock::ToolCall { name, .. } => Some(name.as_str()),
                        _ => None,
                    })
                    .collect();
                (calls.len() > 1).then_some(calls)
            }
            _ => None,
        })
        .expect("an assistant message with several tool calls");
    assert_eq!(fan_out, ["subagent", "subagent"]);

    // Invariant replay over the whole store.
    let report = invariants::check_store(dir.path()).expect("store readable");
    assert_eq!(report.logs, 5);
    assert!(report.is_clean(), "violations: {:#?}", report.violations);
}

/// The same run under the online checks: every session append is checked (and would be vetoed)
/// by an `InvariantObserver`, every model request is checked against its log before it reaches
/// the scripted model, agent status notifications by the status companion, and the seam's
/// provider and run lifecycle by the seam companion subscribed before the providers were
/// registered.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn demo_host_runs_clean_under_the_online_checks() {
    use invariants::{AgentStatusCompanion, InvariantObserver, RequestCheck, SeamLifecycleCompanion};
    use subagent::service::SubagentService;
    use subagent_cli::demo::DemoSetup;

    let dir = tempfile::tempdir().expect("temp dir");
    let mut setup = DemoSetup::new(dir.path());
    let observer = InvariantObserver::shared();
    setup.options.session_observers.push(observer.clone());
    let service = SubagentService::new();
    let seam = SeamLifecycleCompanion::new();
    let seam_listening = seam.listen(&service);
    setup.options.subagents = Some(service);
    let requests = RequestCheck::new();
    setup.options.adapter = requests.wrap(setup.options.adapter.clone());
    let demo = setup.build().expect("the host composes");
    let status = AgentStatusCompanion::new();
    let status_listening = status.listen(&demo.host.runtime().services().agent_events);
    let requests_bound = requests.bind_store(std::sync::Arc::new(demo.host.runtime().sessions().clone()));

    assert!(requests.is_bound());

    let outcome = demo.run(None).await.expect("the demo runs");
    drop((seam_listening, status_listening, requests_bound));

    assert_eq!(observer.tracked(), 5, "the observer checked every session");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    assert!(status.violations().is_empty(), "{:#?}", status.violations());
    assert!(seam.violations().is_empty(), "{:#?}", seam.violations());
    assert_eq!(seam.open_runs(), 0, "every run that started also ended");
    assert!(requests.violations().is_empty(), "{:#?}", requests.violations());
    assert_eq!(
        outcome.model_calls, 10,
        "every model request passed the request check"
    );
    assert_eq!(
        requests.checked(),
        10,
        "every model request was checked against its log"
    );
    let children = outcome
        .tree
        .iter()
        .filter(|n| n.parent.as_ref() == Some(&outcome.coordinator))
        .count();
    assert_eq!(children, 4, "{}", outcome.rendered_tree);
    assert!(invariants::check_store(dir.path()).expect("store").is_clean());
}

/// Moves the store directory away and puts a file in its place at the first event any session
/// commits, so that every later log write fails.
struct BlockStore {
    store: std::path::PathBuf,
    moved: std::path::PathBuf,
    done: std::sync::atomic::AtomicBool,
}

impl agent::SessionObserver for BlockStore {
    fn committed(&self, _: &agent::Session, _: &Arc<agent::SessionEvent>) {
        if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::fs::rename(&self.store, &self.moved).expect("the store moves away");
            std::fs::write(&self.store, "not a directory").expect("a file takes its place");
        }
    }
}

/// A demo whose logs cannot be made durable still finishes its run: the shutdown's failure comes
/// with the finished outcome (its answer included), never instead of it. Before the fix the
/// outcome was dropped and only the shutdown's error returned.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_failed_shutdown_keeps_the_finished_outcome() {
    use subagent_cli::demo::{DemoError, DemoSetup};

    let root = tempfile::tempdir().expect("temp dir");
    let store = root.path().join("store");
    let mut setup = DemoSetup::new(&store);
    setup.options.session_observers.push(Arc::new(BlockStore {
        store: store.clone(),
        moved: root.path().join("moved"),
        done: Default::default(),
    }));
    let demo = setup.build().expect("the host composes");
    match demo.run(None).await {
        Err(DemoError::Shutdown { outcome, shutdown }) => {
            assert!(
                outcome.answer.starts_with("Here is the briefing, reviewed."),
                "{}",
                outcome.answer
            );
            assert!(
                matches!(shutdown, subagent_cli::host::HostError::Persist { .. }),
                "{shutdown:?}"
            );
        }
        other => panic!("expected a finished run with a failed shutdown, got {other:?}"),
    }
}

/// Checks the store of a demo stopped early: the coordinator's last turn was aborted after
/// `turns` turns, every log is intact (no torn line to drop: durable) and balanced (every
/// `turn/start` has its `turn/end`, every child run ended), and the whole store replays clean.
/// Returns the coordinator's children.
async fn assert_stopped_cleanly(
    dir: &std::path::Path,
    coordinator: &agent::SessionId,
    turns: u64,
) -> Vec<subagent_cli::catalog::SessionRow> {
    let catalog = read_catalog(dir).await.expect("catalog");
    assert!(catalog.unreadable.is_empty(), "{:?}", catalog.unreadable);
    let root = catalog.get(coordinator).expect("the coordinator's log");
    assert_eq!(root.turns, turns, "{}", catalog.render());
    assert_eq!(root.last_stop.as_deref(), Some("aborted"), "{}", catalog.render());
    let store = agent_loop::JsonlStore::new(dir);
    for row in &catalog.sessions {
        let loaded = store.load(&row.id).await.expect("every log loads");
        assert!(!loaded.repaired, "{}: a torn last line", row.id);
        let count = |start: bool| {
            loaded
                .events
                .iter()
                .filter(|e| match &e.data {
                    agent::EventData::TurnStart { .. } => start,
                    agent::EventData::TurnEnd { .. } => !start,
                    _ => false,
                })
                .count()
        };
        assert_eq!(count(true), count(false), "{}: a turn left open", row.id);
    }
    let report = invariants::check_store(dir).expect("store readable");
    assert_eq!(report.logs, catalog.sessions.len());
    assert!(report.is_clean(), "violations: {:#?}", report.violations);
    catalog.children(coordinator).into_iter().cloned().collect()
}

/// A stop that has already come when the demo starts (a Ctrl-C or SIGTERM before its first
/// turn got anywhere) aborts the first turn — delivered, never left out — starts no other,
/// and shuts the host down normally: the demo ends `Interrupted` with a clean store. Before,
/// the demo could not be stopped at all: a signal killed `subagent demo` outright, leaving
/// its turn open.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_demo_stopped_before_it_starts_ends_cleanly() {
    use subagent_cli::demo::{DemoError, run_demo_until};

    let dir = tempfile::tempdir().expect("temp dir");
    let err = run_demo_until(dir.path(), None, async {})
        .await
        .expect_err("a stopped demo does not finish");
    let DemoError::Interrupted {
        coordinator,
        store_dir,
        shutdown: None,
    } = &err
    else {
        panic!("expected a demo interrupted and shut down cleanly, got {err:?}");
    };
    assert_eq!(store_dir, dir.path());
    assert_eq!(err.to_string(), "the demo was interrupted before it finished");
    assert_stopped_cleanly(dir.path(), coordinator, 1).await;
}

/// The demo's scripted model, each call held back by `delay` (virtual time), so that a stop
/// can come while a child's model call is still running.
struct Slow {
    inner: Arc<dyn agent::ModelAdapter>,
    delay: std::time::Duration,
}

impl agent::ModelAdapter for Slow {
    fn stream(&self, request: Arc<agent::GenerateOptions>) -> agent::ModelStream {
        use futures::StreamExt as _;
        let inner = self.inner.clone();
        let delay = self.delay;
        futures::stream::once(async move {
            tokio::time::sleep(delay).await;
            inner.stream(request)
        })
        .flatten()
        .boxed()
    }
}

/// Runs the demo on a slowed model, stopped by the tree sink as its `nth` child starts;
/// expects it `Interrupted` after `turns` turns with a clean store and returns the
/// coordinator's children.
async fn stop_at_start(nth: usize, turns: u64) -> Vec<subagent_cli::catalog::SessionRow> {
    use subagent_cli::demo::{DemoError, DemoSetup};

    let dir = tempfile::tempdir().expect("temp dir");
    let mut setup = DemoSetup::new(dir.path());
    setup.options.adapter = Arc::new(Slow {
        inner: setup.options.adapter.clone(),
        delay: std::time::Duration::from_secs(1),
    });
    let stop = Arc::new(tokio::sync::Notify::new());
    let fire = stop.clone();
    let started = std::sync::atomic::AtomicUsize::new(0);
    let sink: TreeSink = Arc::new(move |change, _tree| {
        if matches!(change, TreeChange::Started(_))
            && started.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == nth
        {
            fire.notify_one();
        }
    });
    let demo = setup.build().expect("the host composes");
    let err = demo
        .run_until(Some(sink), async move { stop.notified().await })
        .await
        .expect_err("a stopped demo does not finish");
    let DemoError::Interrupted {
        coordinator,
        shutdown: None,
        ..
    } = &err
    else {
        panic!("expected a demo interrupted and shut down cleanly, got {err:?}");
    };
    assert_stopped_cleanly(dir.path(), coordinator, turns).await
}

/// A Ctrl-C while the first turn's two parallel `spawn` children are running cancels them with
/// the coordinator's turn: each run ends aborted (its log balanced), no second turn starts,
/// and the demo shuts down cleanly.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_demo_stopped_while_its_children_run_ends_cleanly() {
    let children = stop_at_start(1, 1).await;
    assert!(!children.is_empty(), "the stop came once a child had started");
    for child in &children {
        assert!(!child.background, "{}", child.id);
        assert_eq!(child.last_stop.as_deref(), Some("aborted"), "{}", child.id);
    }
}

/// A Ctrl-C once the second turn's background job has started: the coordinator's turn is
/// aborted, disposing the coordinator ends the background child (which a user cancel does not
/// reach), and the demo shuts down cleanly with no run left open.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_demo_stopped_during_its_background_job_ends_cleanly() {
    let children = stop_at_start(3, 2).await;
    let background = children
        .iter()
        .find(|c| c.background)
        .unwrap_or_else(|| panic!("the background child started: {children:?}"));
    assert_eq!(background.last_stop.as_deref(), Some("aborted"));
    assert!(
        children.iter().all(|c| c.provider.as_deref() != Some("fork")),
        "no delegation went on past the stop: {children:?}"
    );
}
