//! [`Host::shutdown`] makes this host's own session logs durable, and only those: the store
//! directory may hold other logs (another process's, or files this store cannot name), whose
//! flush is none of its business and must not fail — or cut short — this run's shutdown.

use std::path::Path;
use std::sync::Arc;

use agent::{GenerateOptions, ModelAdapter, ModelStream, SessionId};
use agent_loop::JsonlStore;
use agent_loop::model::chunks;
use futures::StreamExt;
use subagent_cli::host::{Host, HostOptions, build_host};

/// Every call answers with a short text.
struct Answer;

impl ModelAdapter for Answer {
    fn stream(&self, _: Arc<GenerateOptions>) -> ModelStream {
        futures::stream::iter(chunks::text("answer").into_iter().map(Ok)).boxed()
    }
}

fn host(dir: &Path) -> Host {
    build_host(HostOptions::new(dir, Arc::new(Answer), "mock", "mock")).expect("the host composes")
}

/// One answered turn of a top-level agent `id` in `dir`, then the host's shutdown.
async fn answered_turn(dir: &Path, id: &str) -> Result<(), subagent_cli::host::HostError> {
    let host = host(dir);
    let agent = host.create_agent(SessionId::from(id)).await.expect("agent");
    host.run_turn(agent.agent(), "hello")
        .await
        .expect("the turn runs");
    agent.dispose().await;
    host.shutdown().await
}

/// Writes into `dir` a log with a valid header for `id` (which the store may refuse to name):
/// a real header line, renamed.
async fn foreign_log(dir: &Path, id: &str) {
    let scratch = tempfile::tempdir().expect("temp dir");
    answered_turn(scratch.path(), "foreign")
        .await
        .expect("a clean shutdown");
    let text = std::fs::read_to_string(scratch.path().join("foreign.jsonl")).expect("the log");
    let header = text.lines().next().expect("a header line");
    let renamed = header.replacen(
        "\"foreign\"",
        &serde_json::to_string(id).expect("an id encodes"),
        1,
    );
    assert_ne!(renamed, header, "the header names its session");
    std::fs::write(dir.join(format!("{id}.jsonl")), format!("{renamed}\n")).expect("written");
}

/// A store directory that also holds logs the store refuses to name — an id with a `\`, an id
/// over 200 bytes — and a foreign session it can: the host's shutdown succeeds, its own log is
/// durable and complete, and the foreign files are left byte for byte as they were. Before the
/// fix the shutdown flushed every listed log and failed on the first unnameable one (exit 2 in
/// `subagent run`, before the answer was printed).
#[tokio::test]
async fn shutdown_flushes_only_the_hosts_own_sessions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let long = "x".repeat(201);
    for id in ["back\\slash", long.as_str()] {
        foreign_log(dir.path(), id).await;
    }
    answered_turn(dir.path(), "other-process")
        .await
        .expect("the other run");
    let before: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(dir.path())
        .expect("listed")
        .map(|e| {
            let path = e.expect("an entry").path();
            let bytes = std::fs::read(&path).expect("read");
            (path, bytes)
        })
        .collect();
    assert_eq!(before.len(), 3);

    answered_turn(dir.path(), "coordinator")
        .await
        .expect("the shutdown ignores the logs it did not write");

    for (path, bytes) in before {
        assert_eq!(
            std::fs::read(&path).expect("still there"),
            bytes,
            "{}",
            path.display()
        );
    }
    let loaded = JsonlStore::new(dir.path())
        .load(&SessionId::from("coordinator"))
        .await
        .expect("the host's own log loads");
    assert!(!loaded.repaired);
    assert!(
        loaded.events.iter().any(|e| matches!(&e.data,
            agent::EventData::AssistantMessage { message, .. } if message.text() == "answer")),
        "the answer is in the durable log"
    );
}
