//! Cold resume of a continuable child from a **damaged** log, end to end on the host's JSON-lines
//! store: a child runs to settlement and is released, the host shuts down, the child's log file
//! is damaged (torn at a byte offset, a line deleted, duplicated, swapped with its neighbour, or
//! garbled), and a fresh host resumes the parent and sends the child a follow-up.
//!
//! For every damage:
//! * the read-only tools (the `agents` catalog, the offline checker) report the damaged log and
//!   leave it untouched;
//! * the follow-up either resumes the child or rejects with a typed seam error; nothing panics;
//! * a rejected resume leaves the file byte for byte as it was;
//! * an accepted resume keeps every intact line of the damaged file as the prefix of the new one
//!   (a torn last line is the only thing a resume may drop), the resumed epoch answers the
//!   follow-up, and every session append passes the online invariant checker;
//! * the host shuts down clean either way.
//!
//! A second test damages the parent's own log the same ways and resumes it through the runtime.

use std::path::Path;
use std::sync::Arc;

use agent::{
    AgentOptions, AgentRuntime, ContentBlock, GenerateOptions, ModelAdapter, ModelStream, ResumeAgentOptions,
    SessionId,
};
use agent_loop::model::chunks;
use futures::StreamExt;
use invariants::InvariantObserver;
use subagent::SubagentErrorCode;
use subagent::continuation::{ContinuableStartSpec, ContinuationManager};
use subagent_cli::host::{Host, HostOptions, build_host};

/// Every call answers with a short text.
struct Answer;

impl ModelAdapter for Answer {
    fn stream(&self, _: Arc<GenerateOptions>) -> ModelStream {
        futures::stream::iter(chunks::text("answer").into_iter().map(Ok)).boxed()
    }
}

const PARENT: &str = "coordinator";

fn host(dir: &Path) -> (Host, Arc<InvariantObserver>) {
    let mut options = HostOptions::new(dir, Arc::new(Answer), "mock", "mock");
    let observer = InvariantObserver::shared();
    options.session_observers.push(observer.clone());
    (build_host(options).expect("the host composes"), observer)
}

fn manager(host: &Host) -> ContinuationManager {
    host.continuation().clone()
}

/// Waits (virtual time) until the manager has released every child.
async fn released(manager: &ContinuationManager) {
    for _ in 0..10_000 {
        if manager.resident().is_empty() && manager.task_count() == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("the child was never released");
}

/// Runs one continuable child of `coordinator` to settlement in `dir` and shuts the host down.
/// Returns the child's id.
async fn settled_child(dir: &Path) -> SessionId {
    let (host, observer) = host(dir);
    let parent = host.create_agent(SessionId::from(PARENT)).await.expect("parent");
    let manager = manager(&host);
    let (child, _) = manager
        .start_continuable(ContinuableStartSpec::new(
            "spawn",
            "research",
            vec![ContentBlock::text("first")],
            parent.agent().clone(),
        ))
        .await
        .expect("started");
    released(&manager).await;
    host.settle(parent.agent()).await;
    manager.dispose_all().await.expect("drained");
    parent.dispose().await;
    host.shutdown().await.expect("shutdown");
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    child
}

/// One way to damage a log.
#[derive(Clone, Debug)]
enum Damage {
    /// Cut the file after this many bytes.
    TearAt(usize),
    /// Delete line `n` (0 is the header).
    Delete(usize),
    /// Write line `n` twice.
    Duplicate(usize),
    /// Swap lines `n` and `n + 1`.
    Swap(usize),
    /// Replace the first `"` of line `n` with `#`.
    Garble(usize),
}

impl Damage {
    fn apply(&self, bytes: &[u8]) -> Vec<u8> {
        let text = std::str::from_utf8(bytes).expect("a log is UTF-8");
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        match *self {
            Damage::TearAt(at) => return bytes[..at].to_vec(),
            Damage::Delete(n) => {
                lines.remove(n);
            }
            Damage::Duplicate(n) => {
                let line = lines[n].clone();
                lines.insert(n, line);
            }
            Damage::Swap(n) => lines.swap(n, n + 1),
            Damage::Garble(n) => lines[n] = lines[n].replacen('"', "#", 1),
        }
        let mut out = lines.join("\n").into_bytes();
        out.push(b'\n');
        out
    }
}

/// The lines of `bytes` the store keeps: all but a torn last one (an event line that does not
/// parse, whether or not it ends in `\n` — the store's crash-repair rule).
fn intact_lines(bytes: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = bytes.split_inclusive(|b| *b == b'\n').collect();
    let torn = lines.len() > 1
        && lines.last().is_some_and(|line| {
            let json = line.strip_suffix(b"\n").unwrap_or(line);
            serde_json::from_slice::<agent::SessionEvent>(json).is_err()
        });
    if torn {
        lines.pop();
    }
    lines
}

/// A refused resume left the log byte for byte as it was.
fn assert_untouched(before: &[u8], after: &[u8], damage: &Damage) {
    assert!(
        after == before,
        "{damage:?}: a refused resume changed the log from\n{}\nto\n{}",
        String::from_utf8_lossy(before),
        String::from_utf8_lossy(after)
    );
}

/// An accepted resume kept every intact line of the damaged log as the prefix of the new one,
/// logged the prompt `text` it was given, and passed the online checks.
fn assert_continued(before: &[u8], after: &[u8], text: &str, observer: &InvariantObserver, damage: &Damage) {
    let kept = intact_lines(before);
    let now = intact_lines(after);
    assert!(
        now.len() > kept.len() && now[..kept.len()] == kept[..],
        "{damage:?}: a resume rewrote the intact lines"
    );
    assert!(
        String::from_utf8_lossy(after).contains(&format!("\"{text}\"")),
        "{damage:?}: the prompt is not in the log"
    );
    assert!(
        observer.violations().is_empty(),
        "{damage:?}: {:#?}",
        observer.violations()
    );
}

/// Resumes the parent in a fresh host over `dir` and sends the child a follow-up.
async fn resume_damaged(dir: &Path, child: &SessionId, damage: &Damage) {
    let (host, observer) = host(dir);
    let path = host.store().path_of(child).expect("path");
    let before = std::fs::read(&path).expect("damaged log");
    let parent = host
        .runtime()
        .resume(ResumeAgentOptions {
            session_id: SessionId::from(PARENT),
            agent_options: AgentOptions {
                provider: Some("mock".into()),
                model: Some("mock".into()),
                ..AgentOptions::default()
            },
            signal: None,
            setup: None,
            owner: None,
        })
        .await
        .expect("the parent's own log is intact");
    let manager = manager(&host);
    let outcome = manager
        .followup(parent.agent(), child, vec![ContentBlock::text("second")])
        .await;
    match &outcome {
        Ok(_) => {
            released(&manager).await;
            host.settle(parent.agent()).await;
        }
        Err(error) => {
            assert!(
                matches!(
                    error.code(),
                    SubagentErrorCode::NotResumable | SubagentErrorCode::ProviderFailed
                ),
                "{damage:?}: unexpected rejection {:?}: {error}",
                error.code()
            );
        }
    }
    manager.dispose_all().await.expect("drained");
    parent.dispose().await;
    host.shutdown().await.expect("shutdown");
    let after = std::fs::read(&path).expect("log");
    match outcome {
        Err(_) => assert_untouched(&before, &after, damage),
        Ok(_) => assert_continued(&before, &after, "second", &observer, damage),
    }
}

/// The read-only tools over a damaged store: the `agents` catalog lists the parent and either
/// lists the child or names it unreadable, and the offline checker reports instead of failing
/// (and never passes a log the catalog could not read).
async fn read_damaged_store(dir: &Path, child: &SessionId, damage: &Damage) {
    let catalog = subagent_cli::catalog::read_catalog(dir)
        .await
        .unwrap_or_else(|e| panic!("{damage:?}: the catalog failed as a whole: {e}"));
    assert!(
        catalog.get(&SessionId::from(PARENT)).is_some(),
        "{damage:?}: the parent is listed"
    );
    let listed = catalog.get(child).is_some();
    let unreadable = catalog.unreadable.iter().any(|(id, _)| id == child);
    assert!(
        listed != unreadable,
        "{damage:?}: the child is listed or named unreadable"
    );
    let report =
        invariants::check_store(dir).unwrap_or_else(|e| panic!("{damage:?}: the checker failed: {e}"));
    if unreadable {
        assert!(
            !report.is_clean(),
            "{damage:?}: the checker passed an unreadable log"
        );
    }
}

/// Every damage this test applies to a log `pristine`: a tear at every line boundary and inside
/// every line, and each line deleted, duplicated, garbled and swapped with the next.
fn every_damage(pristine: &[u8]) -> Vec<Damage> {
    let lines = intact_lines(pristine);
    let mut damages = Vec::new();
    let mut offset = 0;
    for line in &lines {
        // At the boundary (a clean truncation) and in the middle of the line (a torn write).
        damages.push(Damage::TearAt(offset));
        damages.push(Damage::TearAt(offset + line.len() / 2));
        offset += line.len();
    }
    for n in 0..lines.len() {
        damages.push(Damage::Delete(n));
        damages.push(Damage::Duplicate(n));
        damages.push(Damage::Garble(n));
        if n + 1 < lines.len() {
            damages.push(Damage::Swap(n));
        }
    }
    damages
}

/// A copy of the store at `from` whose log `file` is damaged by `damage`.
fn damaged_copy(from: &Path, file: &str, damage: &Damage) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(from).expect("store") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy");
    }
    let pristine = std::fs::read(from.join(file)).expect("log");
    std::fs::write(dir.path().join(file), damage.apply(&pristine)).expect("damage");
    dir
}

/// Cold resume from every kind of damage at every line of a settled child's log (and a tear at
/// every line boundary and inside every line): typed rejections that leave the file untouched,
/// or resumes that keep what was intact.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn cold_resume_from_damaged_logs() {
    let pristine_dir = tempfile::tempdir().expect("temp dir");
    let child = settled_child(pristine_dir.path()).await;
    let child_file = format!("{}.jsonl", child.as_str());
    let pristine = std::fs::read(pristine_dir.path().join(&child_file)).expect("child log");
    assert!(
        intact_lines(&pristine).len() > 5,
        "a settled child's log has a header and a turn"
    );
    let (mut accepted, mut rejected) = (0, 0);
    for damage in &every_damage(&pristine) {
        let dir = damaged_copy(pristine_dir.path(), &child_file, damage);
        let before = std::fs::read(dir.path().join(&child_file)).expect("damaged");
        read_damaged_store(dir.path(), &child, damage).await;
        assert_eq!(
            std::fs::read(dir.path().join(&child_file)).expect("log"),
            before,
            "{damage:?}: reading the store changed the log"
        );
        resume_damaged(dir.path(), &child, damage).await;
        let after = std::fs::read(dir.path().join(&child_file)).expect("log");
        if after == before {
            rejected += 1;
        } else {
            accepted += 1;
        }
    }
    assert!(
        accepted > 0 && rejected > 0,
        "accepted {accepted}, rejected {rejected}"
    );
}

/// Resuming the **parent** (a top-level agent, through the runtime) from every damage of its
/// own log: a typed [`agent::AgentError`] that leaves the file untouched, or a live agent whose
/// next turn runs and keeps every intact line of the damaged file.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn resume_of_a_top_level_agent_from_damaged_logs() {
    let pristine_dir = tempfile::tempdir().expect("temp dir");
    settled_child(pristine_dir.path()).await;
    let parent_file = format!("{PARENT}.jsonl");
    let pristine = std::fs::read(pristine_dir.path().join(&parent_file)).expect("parent log");
    assert!(
        intact_lines(&pristine).len() > 5,
        "the parent ran a turn for the notice"
    );
    let (mut accepted, mut rejected) = (0, 0);
    for damage in &every_damage(&pristine) {
        let dir = damaged_copy(pristine_dir.path(), &parent_file, damage);
        let path = dir.path().join(&parent_file);
        let before = std::fs::read(&path).expect("damaged");
        let (host, observer) = host(dir.path());
        let resumed = host
            .runtime()
            .resume(ResumeAgentOptions {
                session_id: SessionId::from(PARENT),
                agent_options: AgentOptions {
                    provider: Some("mock".into()),
                    model: Some("mock".into()),
                    ..AgentOptions::default()
                },
                signal: None,
                setup: None,
                owner: None,
            })
            .await;
        let ran = match resumed {
            Ok(handle) => {
                host.run_turn(handle.agent(), "again").await.expect("a turn runs");
                handle.dispose().await;
                true
            }
            Err(error) => {
                // A typed refusal naming what is wrong, never a panic.
                assert!(!error.to_string().is_empty(), "{damage:?}");
                false
            }
        };
        host.shutdown().await.expect("shutdown");
        let after = std::fs::read(&path).expect("log");
        if ran {
            accepted += 1;
            assert_continued(&before, &after, "again", &observer, damage);
        } else {
            rejected += 1;
            assert_untouched(&before, &after, damage);
        }
    }
    assert!(
        accepted > 0 && rejected > 0,
        "accepted {accepted}, rejected {rejected}"
    );
}
