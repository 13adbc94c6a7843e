//! The host with continuable background delegations ([`HostOptions::continuable`]): the
//! coordinator's `subagent` call starts a durable child through the host's continuation manager,
//! the child reports an interim result with its `report` tool, its settlement notice wakes the
//! coordinator, which sends it a follow-up with
//! `send_message` (the released child cold-resumes from its log), and [`Host::run_turn`]
//! returns only once the coordinator has answered the second notice. Every session append
//! passes the online invariant checker, and the host shuts down with nothing resident.

mod support;

use std::sync::Arc;

use agent::{AgentRuntime, GenerateOptions, ModelAdapter, ModelStream, SessionId, StreamChunk};
use agent_loop::model::chunks;
use futures::StreamExt;
use subagent::descriptor::{SubagentDescriptor, fold_subagent_descriptor};
use subagent_cli::host::{Host, HostOptions, build_host};

const CHILD_TASK: &str = "CHILD-TASK: find the answer";
const COORDINATOR_TASK: &str = "delegate the research";
const INTERIM: &str = "INTERIM: half of it";
const FOLLOW_UP: &str = "FOLLOW-UP: and the second half?";

/// The coordinator delegates once and says it is waiting; on the child's first settlement
/// notice it sends the child a follow-up with `send_message` (the released child cold-resumes);
/// on the second it answers. The child reports an interim result with `report` in its first
/// turn, then answers each of its turns.
struct Coordinated;

/// Every message's content as JSON text (tool results included, whose text is not visible
/// text).
fn texts(options: &GenerateOptions) -> Vec<String> {
    options
        .messages
        .iter()
        .map(|m| serde_json::to_string(&m.content).expect("content serializes"))
        .collect()
}

fn count_source(options: &GenerateOptions, kind: &str) -> usize {
    options
        .messages
        .iter()
        .filter(|m| m.source.kind() == kind)
        .count()
}

fn reply(options: &GenerateOptions) -> Vec<StreamChunk> {
    let texts = texts(options);
    let mentions = |needle: &str| texts.iter().any(|t| t.contains(needle));
    // A `spawn` child never sees its parent's conversation; the coordinator's holds its task.
    if !mentions(COORDINATOR_TASK) {
        return if mentions(FOLLOW_UP) {
            chunks::text("the second finding")
        } else if count_source(options, "tool") == 0 {
            chunks::tool_call("report-1", "report", serde_json::json!({"output": INTERIM}))
        } else {
            chunks::text("the child's finding")
        };
    }
    let notices = count_source(options, "subagent-settled");
    let child = texts.iter().find_map(|t| {
        let (_, rest) = t.split_once("started subagent ")?;
        Some(rest.split('"').next()?.to_owned())
    });
    match (notices, child) {
        (0, None) => chunks::tool_call(
            "call-1",
            "subagent",
            serde_json::json!({"description": "research", "prompt": CHILD_TASK}),
        ),
        (0, Some(_)) => chunks::text("waiting for the child"),
        (1, Some(child)) if !mentions("message queued") => chunks::tool_call(
            "call-2",
            "send_message",
            serde_json::json!({"subagent_id": child, "message": FOLLOW_UP}),
        ),
        (1, _) => chunks::text("waiting for the child again"),
        _ => chunks::text("final: the child answered twice"),
    }
}

impl ModelAdapter for Coordinated {
    fn stream(&self, options: Arc<GenerateOptions>) -> ModelStream {
        futures::stream::iter(reply(&options).into_iter().map(Ok)).boxed()
    }
}

/// The continuable route end to end through the host: start, settlement notice, a follow-up by
/// `send_message` (cold resume), a second notice, the coordinator's answer, clean shutdown.
#[tokio::test(start_paused = true)]
async fn a_continuable_child_settles_takes_a_follow_up_and_is_answered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut options = HostOptions::new(dir.path(), Arc::new(Coordinated), "mock", "mock");
    options.continuable = true;
    let (host, observer) = support::observed_host(options);
    let coordinator = host
        .create_agent(SessionId::from("coordinator"))
        .await
        .expect("coordinator");
    host.run_turn(coordinator.agent(), COORDINATOR_TASK)
        .await
        .expect("the turn runs");
    assert_eq!(
        Host::last_answer(coordinator.agent().as_ref()).as_deref(),
        Some("final: the child answered twice"),
        "run_turn waited for both notices and the coordinator's answer to the second"
    );
    assert!(
        host.continuation().resident().is_empty(),
        "the child was released"
    );
    let reports: Vec<String> = coordinator
        .agent()
        .session()
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            agent::EventData::UserMessage(m) if m.source.kind() == "subagent-report" => Some(m.text()),
            _ => None,
        })
        .collect();
    assert!(
        reports.len() == 1 && reports[0].contains(INTERIM),
        "the child's report reached the coordinator: {reports:?}"
    );
    let children: Vec<SessionId> = host
        .store()
        .list()
        .await
        .expect("listed")
        .into_iter()
        .map(|s| s.id)
        .filter(|id| id.as_str() != "coordinator")
        .collect();
    assert_eq!(children.len(), 1, "{children:?}");
    let loaded = agent::SessionPersistence::load(host.store().as_ref(), &children[0])
        .await
        .expect("the child's log loads");
    let state = fold_subagent_descriptor(loaded.events.iter()).expect("a valid descriptor");
    assert!(
        matches!(state.into_supported(), Some(SubagentDescriptor::Continuable(_))),
        "the child is continuable, so it can cold-resume"
    );
    let child_texts: Vec<String> = loaded
        .events
        .iter()
        .filter_map(|e| match &e.data {
            agent::EventData::AssistantMessage { message, .. } if !message.text().is_empty() => {
                Some(message.text())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        child_texts,
        ["the child's finding", "the second finding"],
        "the follow-up reached the child's durable log as its second turn"
    );
    let view = subagent_cli::logview::render_log(&loaded.header, &loaded.events);
    assert!(
        view.contains("── resumed ──") && !view.contains("inherited prefix"),
        "`subagent log` marks the cold resume as such (the child inherited nothing): {view}"
    );
    assert!(
        host.runtime().get(&children[0]).is_none(),
        "released children leave the registry"
    );
    coordinator.dispose().await;
    host.shutdown().await.expect("shutdown");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}

/// The coordinator of [`run_turn_returns_when_the_only_child_is_parked_by_an_interrupt`]: it
/// starts a continuable child, waits (in its model stream) until the child's first turn is
/// calling the model, sends the child a message (queued behind that turn), interrupts the child
/// and ends its own turn. The child's model call never ends on its own.
struct Interrupting {
    /// Set once the child's first model call has started.
    child_running: tokio::sync::watch::Sender<bool>,
}

impl ModelAdapter for Interrupting {
    fn stream(&self, options: Arc<GenerateOptions>) -> ModelStream {
        if options.session_id.as_ref().map(SessionId::as_str) != Some("coordinator") {
            // The child: its first turn stays in its model call until it is cancelled.
            self.child_running.send_replace(true);
            return futures::stream::pending().boxed();
        }
        let texts = texts(&options);
        let mentions = |needle: &str| texts.iter().any(|t| t.contains(needle));
        let child = texts.iter().find_map(|t| {
            let (_, rest) = t.split_once("started subagent ")?;
            Some(rest.split('"').next()?.to_owned())
        });
        let Some(child) = child else {
            return futures::stream::iter(chunks::tool_call(
                "call-1",
                "subagent",
                serde_json::json!({"description": "research", "prompt": CHILD_TASK}),
            ))
            .map(Ok)
            .boxed();
        };
        let reply = if !mentions("message queued") {
            chunks::tool_call(
                "call-2",
                "send_message",
                serde_json::json!({"subagent_id": child, "message": FOLLOW_UP}),
            )
        } else if !mentions("interrupt requested") {
            chunks::tool_call(
                "call-3",
                "interrupt_agent",
                serde_json::json!({"agent_id": child}),
            )
        } else {
            chunks::text("stopped the child")
        };
        // The message must reach a child that is running (so it is queued behind the turn the
        // interrupt aborts): wait for the child's model call before answering.
        let mut running = self.child_running.subscribe();
        futures::stream::once(async move {
            running
                .wait_for(|r| *r)
                .await
                .expect("the model outlives its calls");
            futures::stream::iter(reply.into_iter().map(Ok))
        })
        .flatten()
        .boxed()
    }
}

/// A continuable child that the coordinator messaged and then interrupted is left idle with the
/// message parked (spec §2.14.9: it runs only after a later waking send); it never settles and
/// announces nothing, so [`Host::run_turn`] must not wait for it: it returns once the
/// coordinator is idle, and [`Host::shutdown`] releases the parked child. Before the fix
/// `settle` polled for the resident child for ever (here: the hang guard fired).
///
/// spec: CONT-96
#[tokio::test(start_paused = true)]
async fn run_turn_returns_when_the_only_child_is_parked_by_an_interrupt() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (child_running, _) = tokio::sync::watch::channel(false);
    let mut options = HostOptions::new(
        dir.path(),
        Arc::new(Interrupting { child_running }),
        "mock",
        "mock",
    );
    options.continuable = true;
    let (host, observer) = support::observed_host(options);
    let coordinator = host
        .create_agent(SessionId::from("coordinator"))
        .await
        .expect("coordinator");
    // A hang guard only (the clock is paused: nothing here waits for real time).
    tokio::time::timeout(
        std::time::Duration::from_secs(3600),
        host.run_turn(coordinator.agent(), COORDINATOR_TASK),
    )
    .await
    .expect("run_turn does not wait for a child parked by an interrupt")
    .expect("the turn runs");
    assert_eq!(
        Host::last_answer(coordinator.agent().as_ref()).as_deref(),
        Some("stopped the child")
    );
    let resident = host.continuation().resident();
    assert_eq!(resident.len(), 1, "the interrupted child stays resident");
    assert!(
        host.continuation().awaits_input(&resident[0]),
        "the child is idle with its message parked"
    );
    let child = host.runtime().get(&resident[0]).expect("the child is live");
    assert_eq!(child.inbox().next_turn.len(), 1, "the message is parked, not run");
    coordinator.dispose().await;
    host.shutdown().await.expect("shutdown");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}

/// The live tree of `run --continuable` shows a cold-resumed child once: its follow-up run (a
/// second `subagent/start` for the same child) moves the child's node back to running and its
/// end settles that node, instead of adding a second node for the same session that no status
/// or end event ever reaches (drawn for ever as `starting`, its end line printed twice).
#[tokio::test(start_paused = true)]
async fn the_live_tree_shows_a_cold_resumed_child_once() {
    use subagent_cli::tree::{LiveTree, NodeStatus, TreeChange};
    let dir = tempfile::tempdir().expect("temp dir");
    let mut options = HostOptions::new(dir.path(), Arc::new(Coordinated), "mock", "mock");
    options.continuable = true;
    let host: Host = build_host(options).expect("the host composes");
    let changes: Arc<parking_lot::Mutex<Vec<TreeChange>>> = Arc::default();
    let sink = {
        let changes = changes.clone();
        Arc::new(move |change: &TreeChange, _: &LiveTree| changes.lock().push(change.clone()))
    };
    let (tree, listening) = LiveTree::attach(host.runtime(), host.subagents(), host.jobs(), Some(sink));
    let coordinator = host
        .create_agent(SessionId::from("coordinator"))
        .await
        .expect("coordinator");
    tree.add_root(SessionId::from("coordinator"), "coordinator");
    host.run_turn(coordinator.agent(), COORDINATOR_TASK)
        .await
        .expect("the turn runs");
    coordinator.dispose().await;
    host.subagents().close().await;
    drop(listening);
    let changes = changes.lock().clone();
    let starts: Vec<&SessionId> = changes
        .iter()
        .filter_map(|c| match c {
            TreeChange::Started(id) => Some(id),
            _ => None,
        })
        .collect();
    assert_eq!(starts.len(), 2, "the child ran twice (cold resume): {changes:?}");
    assert_eq!(starts[0], starts[1]);
    let nodes = tree.nodes();
    assert_eq!(nodes.len(), 2, "one node per session: {nodes:#?}");
    let child = nodes
        .iter()
        .find(|n| &n.id == starts[0])
        .expect("the child's node");
    assert!(
        matches!(child.status, NodeStatus::Ended(_)),
        "the child's second run ended: {child:#?}"
    );
    let rendered = tree.render();
    assert_eq!(rendered.lines().count(), 2, "{rendered}");
    host.shutdown().await.expect("shutdown");
}
