//! Crash recovery across the whole stack: a deterministic multi-agent session runs into a store
//! (the demo's coordinator with two parallel one-shot `spawn` children, a background `spawn` job
//! and a `fork` child; a second coordinator with a continuable child that settles, is released,
//! and is cold-resumed by `send_message`), then power losses are simulated on a copy of the store:
//! one log cut short at every line boundary and in the middle of every fourth line, or its tail
//! left as zeros (blocks allocated, never written), or lost altogether (its directory entry never
//! synced); and every log at once cut at proportional points. For every cut:
//!
//! 1. every cut log loads through [`JsonlStore::load`] (a torn last line dropped, the file left
//!    as it was, exactly the whole lines kept) or fails with a typed [`StoreError`] (`Corrupt`
//!    without a whole header, `NotFound` when lost);
//! 2. [`invariants::check_store`] reports the damaged copy with typed findings, and the logs as
//!    a load keeps them break no rule but the ones a truncation explains (a fork child's seed
//!    longer than its cut parent, a child cut before its descriptor or inside its seed, a log
//!    with no whole header);
//! 3. each coordinator cold-resumes through the host ([`Host::resume_agent`], the path of the
//!    ACP `session/load`) and runs another turn on the scripted model — the continuable
//!    coordinator's turn cold-resumes its (possibly cut) child — or is refused with a typed
//!    error; every append passes the online invariant checker, the host shuts down clean, every
//!    log it wrote ends balanced and replays clean.
//!
//! Nothing may panic (a panic hook counts panics on every thread, the store's blocking tasks
//! included) or hang (every host phase runs under a timeout on the paused clock).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agent::{
    EventData, GenerateOptions, MessageList, ModelAdapter, ModelStream, SessionEvent, SessionId, StreamChunk,
};
use agent_loop::model::chunks;
use agent_loop::{JsonlStore, StoreError};
use futures::StreamExt;
use invariants::{InvariantObserver, RuleId};
use subagent_cli::demo::{DELEGATIONS, DEMO_PERSONA, FOLLOW_UP, TASK, last_prompt, results_since};
use subagent_cli::host::{Host, HostOptions, build_host};

/// The demo's coordinator.
const DEMO: &str = "demo";
/// The coordinator with a continuable child.
const CONTINUING: &str = "continuing";
const CONT_TASK: &str = "Delegate the research to a continuable child.";
const CONT_FOLLOW: &str = "Ask your child for the second half.";
const CHILD_TASK: &str = "CHILD-TASK: find the answer";
const CHILD_FOLLOW: &str = "CHILD-FOLLOW-UP: and the second half?";
const INTERIM: &str = "INTERIM: half of it";

/// How long (virtual time) one host phase may take before it counts as hung.
const HANG_GUARD: Duration = Duration::from_secs(3600);

/// Panics seen on any thread since the hook was installed (a panic inside a spawned or blocking
/// task is otherwise swallowed into a join error).
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

// ---------------------------------------------------------------------------------------------
// The scripted model: the demo's script for the demo's sessions, a small continuable script for
// the other coordinator and its child. Every reply is a function of the request only.

fn notices_since(messages: &MessageList, from: usize) -> usize {
    messages
        .iter()
        .skip(from)
        .filter(|m| m.source.kind() == "subagent-settled")
        .count()
}

fn continuing_reply(messages: &MessageList) -> Vec<StreamChunk> {
    let Some((at, prompt)) = last_prompt(messages) else {
        return chunks::text("no task");
    };
    let results = results_since(messages, at);
    let notified = notices_since(messages, at) > 0;
    if prompt == CONT_TASK {
        return match (results.contains_key("c-start"), notified) {
            (false, _) => chunks::tool_call(
                "c-start",
                "subagent",
                serde_json::json!({"description": "research", "prompt": CHILD_TASK}),
            ),
            (true, false) => chunks::text("waiting for the child"),
            (true, true) => chunks::text("the child finished"),
        };
    }
    if prompt == CONT_FOLLOW {
        let child = results_since(messages, 0)
            .values()
            .find_map(|text| Some(text.strip_prefix("started subagent ")?.trim().to_owned()));
        return match (results.get("c-send"), child, notified) {
            (None, Some(child), _) => chunks::tool_call(
                "c-send",
                "send_message",
                serde_json::json!({"subagent_id": child, "message": CHILD_FOLLOW}),
            ),
            (None, None, _) => chunks::text("no child to ask"),
            (Some(_), _, false) => chunks::text("waiting again"),
            (Some(_), _, true) => chunks::text("the child answered again"),
        };
    }
    chunks::text("nothing scripted")
}

fn continuable_child_reply(messages: &MessageList) -> Vec<StreamChunk> {
    let mentions = |needle: &str| messages.iter().any(|m| m.text().contains(needle));
    if mentions(CHILD_FOLLOW) {
        chunks::text("the second finding")
    } else if !messages.iter().any(|m| m.source.kind() == "tool") {
        chunks::tool_call("report-1", "report", serde_json::json!({"output": INTERIM}))
    } else {
        chunks::text("the child's finding")
    }
}

struct Scripted;

impl ModelAdapter for Scripted {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        let demo = SessionId::from(DEMO);
        let session = request.session_id.as_ref().map(SessionId::as_str);
        let is_demo_child = || {
            request
                .messages
                .iter()
                .any(|m| DELEGATIONS.iter().any(|d| m.text() == d.prompt))
        };
        let reply = if session == Some(CONTINUING) {
            continuing_reply(&request.messages)
        } else if session == Some(DEMO) || is_demo_child() {
            subagent_cli::demo::respond(&demo, &request)
        } else {
            continuable_child_reply(&request.messages)
        };
        futures::stream::iter(reply.into_iter().map(Ok)).boxed()
    }
}

// ---------------------------------------------------------------------------------------------
// Hosts.

fn host(dir: &Path, continuable: bool) -> (Host, Arc<InvariantObserver>) {
    let mut options = HostOptions::new(dir, Arc::new(Scripted), "scripted", "crash-recovery");
    options.persona = Some(DEMO_PERSONA.to_owned());
    options.continuable = continuable;
    let observer = InvariantObserver::shared();
    options.session_observers.push(observer.clone());
    (build_host(options).expect("the host composes"), observer)
}

/// Runs `phase` under the hang guard.
async fn guarded<T>(what: &str, phase: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, phase)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

/// The pristine session: the demo's two turns, then a continuable child started, settled,
/// released and cold-resumed by a follow-up.
async fn pristine_store(dir: &Path) {
    let (demo_host, observer) = host(dir, false);
    guarded("the demo", async {
        let coordinator = demo_host.create_agent(SessionId::from(DEMO)).await.expect("demo");
        for prompt in [TASK, FOLLOW_UP] {
            demo_host
                .run_turn(coordinator.agent(), prompt)
                .await
                .expect("a demo turn");
        }
        let answer = Host::last_answer(coordinator.agent().as_ref()).unwrap_or_default();
        assert!(answer.starts_with("Here is the briefing, reviewed."), "{answer}");
        coordinator.dispose().await;
        demo_host.shutdown().await.expect("shutdown");
    })
    .await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());

    let (cont_host, observer) = host(dir, true);
    guarded("the continuable session", async {
        let coordinator = cont_host
            .create_agent(SessionId::from(CONTINUING))
            .await
            .expect("continuing");
        cont_host
            .run_turn(coordinator.agent(), CONT_TASK)
            .await
            .expect("turn");
        let answer = Host::last_answer(coordinator.agent().as_ref());
        assert_eq!(answer.as_deref(), Some("the child finished"));
        cont_host
            .run_turn(coordinator.agent(), CONT_FOLLOW)
            .await
            .expect("turn");
        let answer = Host::last_answer(coordinator.agent().as_ref());
        assert_eq!(answer.as_deref(), Some("the child answered again"));
        coordinator.dispose().await;
        cont_host.shutdown().await.expect("shutdown");
    })
    .await;
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
}

// ---------------------------------------------------------------------------------------------
// Logs and cuts.

/// The log files of a store, by file name, with their bytes.
fn logs(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("store") {
        let entry = entry.expect("entry");
        let name = entry.file_name().into_string().expect("UTF-8 name");
        if name.ends_with(".jsonl") {
            out.insert(name, std::fs::read(entry.path()).expect("log"));
        }
    }
    out
}

fn id_of(file: &str) -> SessionId {
    SessionId::new(file.strip_suffix(".jsonl").expect("a log"))
}

/// The lines of `bytes` a load keeps: every whole line, and a last line without its `\n` only
/// when it is a complete event (the store drops a torn last line). The header counts as a line.
fn kept_lines(bytes: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = bytes.split_inclusive(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|last| {
        !last.ends_with(b"\n") && (lines.len() == 1 || serde_json::from_slice::<SessionEvent>(last).is_err())
    }) {
        lines.pop();
    }
    lines
}

/// What a power loss left of one log.
#[derive(Clone, Copy, Debug)]
enum Tear {
    /// The file ends after this many bytes.
    At(usize),
    /// The file keeps its length, but from this byte on holds the zeros of blocks that were
    /// allocated and never written.
    Zeroed(usize),
    /// The file is gone: its directory entry never reached the disk.
    Lost,
}

/// One simulated power loss: what it left of these logs, and whether the coordinators the cut
/// concerns are resumed from it.
#[derive(Clone, Debug)]
struct Cut {
    logs: Vec<(String, Tear)>,
    resume: bool,
}

impl Cut {
    fn touches(&self, file: &str) -> bool {
        self.logs.iter().any(|(f, _)| f == file)
    }
}

/// Every cut this test makes: each log alone cut at every line boundary and in the middle of
/// every fourth line (the header's included; every other one of those zero-filled), each log
/// alone lost, and every log at once cut at sixteenths of its length (every other one
/// zero-filled).
///
/// Every cut is loaded and checked. The resumes, the costly part, run for every cut of all the
/// logs, every loss, every cut in the middle of a line, the cut after the header and every other
/// line boundary of the
/// logs a resume reads (`resumed`: the coordinators' and the continuable child's); a cut of a
/// one-shot child's log changes no resume.
fn every_cut(pristine: &BTreeMap<String, Vec<u8>>, resumed: &BTreeSet<String>) -> Vec<Cut> {
    let mut cuts = Vec::new();
    for (file, bytes) in pristine {
        let read = resumed.contains(file);
        let mut offset = 0;
        for (i, line) in bytes.split_inclusive(|b| *b == b'\n').enumerate() {
            cuts.push(Cut {
                logs: vec![(file.clone(), Tear::At(offset))],
                resume: read && (i % 2 == 0 || i == 1),
            });
            if i % 4 == 0 {
                let middle = offset + line.len() / 2;
                let tear = if i % 8 == 0 {
                    Tear::At(middle)
                } else {
                    Tear::Zeroed(middle)
                };
                cuts.push(Cut {
                    logs: vec![(file.clone(), tear)],
                    resume: read,
                });
            }
            offset += line.len();
        }
        cuts.push(Cut {
            logs: vec![(file.clone(), Tear::Lost)],
            resume: read,
        });
    }
    for k in 1..16 {
        cuts.push(Cut {
            logs: pristine
                .iter()
                .map(|(file, bytes)| {
                    let at = bytes.len() * k / 16;
                    (
                        file.clone(),
                        if k % 2 == 0 {
                            Tear::At(at)
                        } else {
                            Tear::Zeroed(at)
                        },
                    )
                })
                .collect(),
            resume: true,
        });
    }
    cuts
}

/// A copy of the store at `from` with `cut` applied.
fn cut_copy(from: &Path, cut: &Cut) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(from).expect("store") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).expect("copy");
    }
    for (file, tear) in &cut.logs {
        let path = dir.path().join(file);
        let bytes = std::fs::read(&path).expect("log");
        match *tear {
            Tear::At(at) => std::fs::write(&path, &bytes[..at]),
            Tear::Zeroed(at) => {
                let mut zeroed = bytes[..at].to_vec();
                zeroed.resize(bytes.len(), 0);
                std::fs::write(&path, zeroed)
            }
            Tear::Lost => std::fs::remove_file(&path),
        }
        .expect("the power loss");
    }
    dir
}

/// A copy of `damaged` holding only the lines a load keeps of each log.
fn kept_copy(damaged: &BTreeMap<String, Vec<u8>>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (file, bytes) in damaged {
        std::fs::write(dir.path().join(file), kept_lines(bytes).concat()).expect("write");
    }
    dir
}

// ---------------------------------------------------------------------------------------------
// The checks.

/// Check 1: Every cut log loads with exactly its whole lines, or fails typed (only when not even its
/// header is whole); a load never writes.
async fn check_loads(dir: &Path, damaged: &BTreeMap<String, Vec<u8>>, cut: &Cut) {
    let store = JsonlStore::new(dir);
    for (file, _) in cut.logs.iter().filter(|(_, tear)| matches!(tear, Tear::Lost)) {
        match store.load(&id_of(file)).await {
            Err(StoreError::NotFound(_)) => {}
            other => panic!("{cut:?}: a lost log loads as {other:?}"),
        }
    }
    for (file, bytes) in damaged.iter().filter(|(file, _)| cut.touches(file)) {
        let kept = kept_lines(bytes);
        match store.load(&id_of(file)).await {
            Ok(loaded) => {
                assert_eq!(
                    loaded.events.len() + 1,
                    kept.len(),
                    "{cut:?}: {file} loaded other events than its whole lines"
                );
                assert_eq!(
                    loaded.repaired,
                    kept.concat().len() < bytes.len(),
                    "{cut:?}: {file}"
                );
            }
            Err(StoreError::Corrupt { .. }) if kept.is_empty() => {}
            Err(e) => panic!("{cut:?}: {file} with a whole header failed to load: {e}"),
        }
        assert_eq!(
            &std::fs::read(dir.join(file)).expect("log"),
            bytes,
            "{cut:?}: loading {file} changed it"
        );
    }
}

/// The rules a truncation alone may break in logs that keep only whole lines.
fn truncation_rules() -> BTreeSet<RuleId> {
    [
        RuleId::HEADER,
        RuleId::FORK_SEED,
        RuleId::SEED,
        RuleId::DESCRIPTOR,
    ]
    .into_iter()
    .collect()
}

/// Check 2: The checker reports a damaged store with typed findings — a torn tail of a log with a
/// whole header as `TORN` — and the lines a load keeps break only the rules a truncation
/// explains.
fn check_checker(dir: &Path, damaged: &BTreeMap<String, Vec<u8>>, cut: &Cut) {
    let report = invariants::check_store(dir).unwrap_or_else(|e| panic!("{cut:?}: {e}"));
    let torn: Vec<&String> = damaged
        .iter()
        .filter(|(_, bytes)| kept_lines(bytes).concat().len() < bytes.len())
        .map(|(file, _)| file)
        .collect();
    for file in &torn {
        let named = |v: &&invariants::Violation| {
            v.rule == RuleId::TORN
                && v.file
                    .as_ref()
                    .and_then(|f| f.file_name())
                    .and_then(|f| f.to_str())
                    == Some(file.as_str())
        };
        let header = !kept_lines(&damaged[*file]).is_empty();
        assert!(
            !header || report.violations.iter().any(|v| named(&v)),
            "{cut:?}: the torn tail of {file} is not reported: {:#?}",
            report.violations
        );
    }
    let kept;
    let report = if torn.is_empty() {
        report
    } else {
        kept = kept_copy(damaged);
        invariants::check_store(kept.path()).expect("readable")
    };
    let allowed = truncation_rules();
    let unexpected: Vec<_> = report
        .violations
        .iter()
        .filter(|v| !allowed.contains(&v.rule))
        .collect();
    assert!(unexpected.is_empty(), "{cut:?}: {unexpected:#?}");
}

/// Whether a log's events end with every turn closed.
fn balanced(events: &[SessionEvent]) -> bool {
    let mut open = false;
    for e in events {
        match e.data {
            EventData::TurnStart { .. } => open = true,
            EventData::TurnEnd { .. } => open = false,
            _ => {}
        }
    }
    !open
}

/// Check 3: Cold-resumes `coordinator` on a fresh host over `dir` and runs `prompt`: a refused
/// resume is typed and leaves the log as it was; an accepted one answers. Returns the answer.
async fn resume_and_run(
    dir: &Path,
    continuable: bool,
    coordinator: &str,
    prompt: &str,
    cut: &Cut,
) -> Option<String> {
    let file = dir.join(format!("{coordinator}.jsonl"));
    let before = std::fs::read(&file).ok();
    let (host, observer) = host(dir, continuable);
    let answer = guarded(&format!("{cut:?}: resuming {coordinator}"), async {
        let answer = match host.resume_agent(SessionId::from(coordinator)).await {
            Ok(handle) => {
                host.run_turn(handle.agent(), prompt)
                    .await
                    .expect("a resumed turn runs");
                let answer = Host::last_answer(handle.agent().as_ref()).unwrap_or_default();
                handle.dispose().await;
                Some(answer)
            }
            Err(e) => {
                assert!(!e.to_string().is_empty(), "{cut:?}");
                None
            }
        };
        host.shutdown().await.expect("the host shuts down clean");
        answer
    })
    .await;
    assert!(
        observer.violations().is_empty(),
        "{cut:?}: resuming {coordinator}: {:#?}",
        observer.violations()
    );
    if answer.is_none() {
        assert_eq!(
            std::fs::read(&file).ok(),
            before,
            "{cut:?}: a refused resume wrote"
        );
    }
    answer
}

/// Every log the resumes wrote (new or changed) loads, ends balanced and breaks no rule; the
/// others break only the rules their cut explains.
async fn check_written(dir: &Path, damaged: &BTreeMap<String, Vec<u8>>, cut: &Cut) {
    let now = logs(dir);
    let written: BTreeSet<&String> = now
        .iter()
        .filter(|(file, bytes)| damaged.get(*file) != Some(*bytes))
        .map(|(file, _)| file)
        .collect();
    let store = JsonlStore::new(dir);
    for file in &written {
        let loaded = store
            .load(&id_of(file))
            .await
            .unwrap_or_else(|e| panic!("{cut:?}: written log {file} does not load: {e}"));
        assert!(!loaded.repaired, "{cut:?}: {file}");
        assert!(balanced(&loaded.events), "{cut:?}: {file} ends inside a turn");
    }
    let report = invariants::check_store(dir).expect("readable");
    let unexpected: Vec<_> = report
        .violations
        .iter()
        .filter(|v| {
            let file = v
                .file
                .as_ref()
                .and_then(|f| f.file_name())
                .and_then(|f| f.to_str());
            let in_written = file.is_some_and(|f| written.iter().any(|w| w.as_str() == f));
            in_written || !kept_rule(v.rule)
        })
        .collect();
    assert!(unexpected.is_empty(), "{cut:?}: {unexpected:#?}");
}

/// The rules an untouched cut log may break as it lies on disk (its torn tail included).
fn kept_rule(rule: RuleId) -> bool {
    truncation_rules().contains(&rule) || rule == RuleId::TORN || rule == RuleId::PARSE
}

/// The logs a resume reads: the two coordinators' and the continuable child's.
fn resumed_logs(pristine: &BTreeMap<String, Vec<u8>>) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = [DEMO, CONTINUING].iter().map(|c| format!("{c}.jsonl")).collect();
    for (file, bytes) in pristine {
        let header = bytes.split(|b| *b == b'\n').next().expect("a header");
        let header: serde_json::Value = serde_json::from_slice(header).expect("header JSON");
        if header["parentSession"] == CONTINUING {
            out.insert(file.clone());
        }
    }
    out
}

/// Every cut of a multi-agent store loads or fails typed, checks with typed findings, and
/// resumes its coordinators into another clean turn or refuses them typed; nothing panics or
/// hangs.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_power_loss_cut_loads_checks_and_resumes_typed() {
    count_panics();
    let pristine_dir = tempfile::tempdir().expect("temp dir");
    pristine_store(pristine_dir.path()).await;
    let pristine = logs(pristine_dir.path());
    assert_eq!(
        pristine.len(),
        7,
        "two coordinators, five children: {:?}",
        pristine.keys()
    );
    let report = invariants::check_store(pristine_dir.path()).expect("readable");
    assert!(report.is_clean(), "{:#?}", report.violations);
    let resumed = resumed_logs(&pristine);
    assert_eq!(resumed.len(), 3, "{resumed:?}");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);

    let demo_file = format!("{DEMO}.jsonl");
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for cut in &every_cut(&pristine, &resumed) {
        let dir = cut_copy(pristine_dir.path(), cut);
        let damaged = logs(dir.path());
        check_loads(dir.path(), &damaged, cut).await;
        check_checker(dir.path(), &damaged, cut);
        let all = cut.logs.len() > 1;
        if cut.resume && (all || cut.touches(&demo_file)) {
            let answer = resume_and_run(dir.path(), false, DEMO, TASK, cut).await;
            if let Some(answer) = &answer {
                assert!(
                    answer.starts_with("Briefing from two parallel surveys."),
                    "{cut:?}: {answer}"
                );
            }
            *outcomes
                .entry(format!("demo resumed: {}", answer.is_some()))
                .or_default() += 1;
        }
        if cut.resume && (all || !cut.touches(&demo_file)) {
            let answer = resume_and_run(dir.path(), true, CONTINUING, CONT_FOLLOW, cut).await;
            *outcomes.entry(format!("continuing: {answer:?}")).or_default() += 1;
        }
        if cut.resume {
            check_written(dir.path(), &damaged, cut).await;
        }
        assert_eq!(PANICS.load(Ordering::SeqCst), 0, "{cut:?}: something panicked");
    }
    // Every path was taken: refused and accepted resumes of both coordinators; a follow-up the
    // cut child answered, one whose send was refused (the child's log has no whole header), and
    // one the coordinator could not make (its log lost the child's start).
    for outcome in [
        "demo resumed: false",
        "demo resumed: true",
        "continuing: None",
        "continuing: Some(\"the child answered again\")",
        "continuing: Some(\"waiting again\")",
        "continuing: Some(\"no child to ask\")",
    ] {
        assert!(outcomes.contains_key(outcome), "never {outcome}: {outcomes:#?}");
    }
}
