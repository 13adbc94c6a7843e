//! The companions and the offline checker over logs the real runtime (`agent-loop`) writes:
//! a parent with three turns, a `spawn` child and a `fork` child (seeded with the parent's first
//! two turns), all captured as JSON-lines by `agent_loop::trace`.
//!
//! * Live: the registry mounts the standard companions; the whole run stays clean (ICMP-157,
//!   ICMP-160, ICMP-168 on real notifications and requests).
//! * Offline: the captured store is clean, and every single-point mutation — removing any
//!   `turn/end`, duplicating any `subagent/descriptor`, renumbering any `seq` — is reported by
//!   [`check_store`] as a violation naming that session and seq.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent::model::{GenerateOptions, ModelAdapter, ModelStream};
use agent::{
    AgentEvent, AgentHandle, AgentOptions, AgentRuntime, ContentBlock, CreateAgentOptions, EventBus, Message,
    SessionId, SessionMeta, SessionStore, Signal,
};
use agent_loop::ScriptedModel;
use agent_loop::model::chunks;
use agent_loop::runtime::Runtime;
use common::scratch;
use invariants::{
    DESCRIPTOR_TYPE, DirReport, INVARIANT_FAILURE_CODE, InvariantObserver, InvariantRegistry, RequestCheck,
    StandardCompanions, Violation, check_store, replay_jsonl_file,
};
use serde_json::Value;
use subagent::StopReason;
use subagent::provider::SubagentStartRequest;
use subagent::service::SubagentService;
use subagent_inprocess::InProcessDriver;

const MODEL: &str = "mock";

/// One captured log: its session id, header line and event lines (parsed).
#[derive(Clone, Debug)]
struct Log {
    file: String,
    session: String,
    header: Value,
    events: Vec<Value>,
}

impl Log {
    fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap();
        let mut lines = text.lines().map(|l| serde_json::from_str::<Value>(l).unwrap());
        let header = lines.next().expect("a header line");
        let session = header["id"].as_str().unwrap().to_owned();
        Self {
            file: path.file_name().unwrap().to_string_lossy().into_owned(),
            session,
            header,
            events: lines.collect(),
        }
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for v in std::iter::once(&self.header).chain(&self.events) {
            out.push_str(&serde_json::to_string(v).unwrap());
            out.push('\n');
        }
        out
    }

    fn kind(&self, i: usize) -> &str {
        self.events[i]["type"].as_str().unwrap_or("")
    }

    fn seq(&self, i: usize) -> u64 {
        self.events[i]["seq"].as_u64().unwrap()
    }

    fn positions(&self, kind: &str) -> Vec<usize> {
        (0..self.events.len()).filter(|&i| self.kind(i) == kind).collect()
    }

    /// Renumbers events from `from` on so that `seq == index` again.
    fn renumber_from(&mut self, from: usize) {
        for i in from..self.events.len() {
            self.events[i]["seq"] = Value::from(i as u64);
        }
    }
}

/// Runs the scenario on the real runtime with capture into `dir` and the live companions
/// mounted; returns the companions and the session observer for inspection.
async fn generate(dir: &Path) -> (StandardCompanions, Arc<InvariantObserver>) {
    let companions = StandardCompanions::new();
    let model = ScriptedModel::new([
        chunks::text("parent one"),
        chunks::text("parent two"),
        chunks::text("spawned answer"),
        chunks::text("forked answer"),
        chunks::text("parent three"),
    ]);
    let observer = InvariantObserver::shared();
    let runtime = Runtime::builder()
        .model(MODEL, companions.request.wrap(model.adapter()))
        .session_observer(observer.clone())
        .build();
    let capture = agent_loop::trace::install(runtime.sessions(), dir);
    let service = SubagentService::new();

    let registry = InvariantRegistry::default();
    registry.provide::<EventBus<AgentEvent>>(runtime.services().agent_events.clone());
    registry.provide::<Arc<dyn SessionStore>>(runtime.services().sessions.clone());
    registry.provide(service.clone());
    let mounted = companions.register(&registry).expect("standard companions mount");
    assert!(mounted.iter().all(|r| r.is_installed()));

    let driver = InProcessDriver::new(runtime.services().clone());
    let spawn = subagent_spawn::register(&service, driver.clone()).unwrap();
    let fork = subagent_fork::register(&service, driver.clone()).unwrap();

    let parent_handle: AgentHandle = runtime
        .create(CreateAgentOptions {
            agent_options: AgentOptions {
                provider: Some(MODEL.into()),
                model: Some(MODEL.into()),
                ..AgentOptions::default()
            },
            meta: SessionMeta::default(),
            ..CreateAgentOptions::new(SessionId::from("parent"))
        })
        .await
        .unwrap();
    let parent = parent_handle.agent().clone();
    for text in ["first", "second"] {
        parent.followup(Message::user_text(text)).unwrap();
        parent.when_idle().await;
    }
    for provider in ["spawn", "fork"] {
        let mut request = SubagentStartRequest::new(
            vec![ContentBlock::text(format!("{provider} task"))],
            parent.clone(),
            Signal::new(),
        );
        request.label = Some(format!("{provider} task"));
        let run = service.start(provider, request).await.expect("started");
        let result = run.result().await.unwrap();
        assert_eq!(result.stop_reason, StopReason::Completed, "{provider}");
        run.dispose().await.unwrap();
    }
    parent.followup(Message::user_text("third")).unwrap();
    parent.when_idle().await;
    assert_eq!(
        companions.agent.status_of(parent.id()),
        Some(agent::AgentStatus::Idle),
        "the agent companion follows the parent's status"
    );
    assert_eq!(companions.seam.open_runs(), 0, "every start met its end");

    driver.wait().await;
    service.close().await;
    drop((spawn, fork));
    parent_handle.dispose().await;
    runtime.shutdown().await;
    for r in mounted {
        r.dispose().await;
    }
    registry.dispose().await;
    drop(capture);
    assert_eq!(model.remaining(), 0, "every scripted answer was used");
    (companions, observer)
}

fn read_logs(dir: &Path) -> Vec<Log> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    paths.sort();
    paths.iter().map(|p| Log::read(p)).collect()
}

/// Writes `logs` (with `mutated` replacing the log of the same file) into a fresh store and
/// checks it.
fn check_mutated(name: &str, logs: &[Log], mutated: &Log) -> DirReport {
    let dir = scratch(name);
    for log in logs {
        let text = if log.file == mutated.file {
            mutated.text()
        } else {
            log.text()
        };
        std::fs::write(dir.join(&log.file), text).unwrap();
    }
    check_store(&dir).unwrap()
}

fn names(report: &DirReport, session: &str, seq: u64) -> bool {
    report
        .violations
        .iter()
        .any(|v: &Violation| v.session.as_str() == session && v.seq == Some(seq))
}

/// spec: ICMP-157 — real idle/running transitions pass the agent companion.
/// spec: ICMP-160 — every loop-built request of a real run equals its log's derivation and header.
/// spec: ICMP-168 — real provider add/remove and run start/end pairs pass the seam companion.
///
/// Then, over the captured store: it is clean, and removing any `turn/end`, duplicating any
/// `subagent/descriptor` or renumbering any `seq` is reported naming that session and seq.
#[tokio::test(start_paused = true)]
async fn captured_logs_detect_every_single_point_mutation() {
    let dir = scratch("runtime-capture");
    let (companions, observer) = generate(&dir).await;
    assert!(
        companions.violations().is_empty(),
        "{:#?}",
        companions.violations()
    );
    assert!(observer.violations().is_empty(), "{:#?}", observer.violations());
    assert!(
        companions.request.checked() >= 5,
        "the request check saw every model call, got {}",
        companions.request.checked()
    );

    let logs = read_logs(&dir);
    let by_origin: BTreeMap<&str, usize> = logs.iter().fold(BTreeMap::new(), |mut m, l| {
        *m.entry(l.header["origin"].as_str().unwrap_or("top")).or_default() += 1;
        m
    });
    assert_eq!(
        by_origin,
        BTreeMap::from([("subagent", 2), ("top", 1)]),
        "{logs:#?}"
    );
    assert!(
        logs.iter()
            .any(|l| l.header["seedLength"].as_u64().is_some_and(|n| n > 0)),
        "the fork child is seeded"
    );
    let baseline = check_store(&dir).unwrap();
    assert!(baseline.is_clean(), "{:#?}", baseline.violations);
    assert_eq!(baseline.logs, 3);

    let mut mutations = 0;
    for log in &logs {
        // Remove any single `turn/end`.
        for at in log.positions("turn/end") {
            let mut m = log.clone();
            m.events.remove(at);
            mutations += 1;
            if at < m.events.len() {
                // The next event now sits where the turn/end was, carrying the seq after it.
                let report = check_mutated("runtime-mut", &logs, &m);
                let seq = log.seq(at) + 1;
                assert!(
                    names(&report, &log.session, seq),
                    "removing turn/end at seq {} of {}: {:#?}",
                    log.seq(at),
                    log.session,
                    report.violations
                );
            } else {
                // The log's final turn/end: what remains is the shape of a crash inside a turn,
                // which stores repair on resume and the rules accept by design; the replay
                // reports the open turn instead.
                let dir = scratch("runtime-mut-final");
                std::fs::write(dir.join(&m.file), m.text()).unwrap();
                let report = replay_jsonl_file(&dir.join(&m.file)).unwrap();
                let turn = log.events[at]["data"]["turn"].as_u64();
                assert_eq!(report.open_turn, turn, "{}", log.session);
            }
        }
        // Duplicate any `subagent/descriptor`: verbatim (the copy repeats the seq) and
        // renumbered (only the descriptor count is wrong).
        for at in log.positions(DESCRIPTOR_TYPE) {
            let mut verbatim = log.clone();
            verbatim.events.insert(at + 1, log.events[at].clone());
            let report = check_mutated("runtime-mut", &logs, &verbatim);
            assert!(
                names(&report, &log.session, log.seq(at)),
                "{:#?}",
                report.violations
            );
            let mut renumbered = verbatim.clone();
            renumbered.renumber_from(at + 1);
            let report = check_mutated("runtime-mut", &logs, &renumbered);
            let dup = report
                .violations
                .iter()
                .find(|v| v.rule.as_str() == "DESCRIPTOR")
                .unwrap_or_else(|| panic!("{:#?}", report.violations));
            assert_eq!(
                (dup.session.as_str(), dup.seq),
                (log.session.as_str(), Some(log.seq(at) + 1))
            );
            mutations += 2;
        }
        // Renumber any `seq`, upwards and (past the first event) downwards.
        for i in 0..log.events.len() {
            let old = log.seq(i);
            for new in [Some(old + 1000), old.checked_sub(1)].into_iter().flatten() {
                let mut m = log.clone();
                m.events[i]["seq"] = Value::from(new);
                let report = check_mutated("runtime-mut", &logs, &m);
                let hit = report.violations.iter().any(|v| {
                    v.session.as_str() == log.session && v.seq == Some(new) && v.line == Some(i as u64 + 2)
                });
                assert!(
                    hit,
                    "renumbering seq {old} to {new} in {}: {:#?}",
                    log.session, report.violations
                );
                mutations += 1;
            }
        }
    }
    let descriptors: usize = logs.iter().map(|l| l.positions(DESCRIPTOR_TYPE).len()).sum();
    assert_eq!(descriptors, 2, "each child records its descriptor");
    assert!(mutations > 100, "{mutations} mutations checked");
}

/// An adapter in front of the checked one that prepends an unlogged message, as a loop bug that
/// injected context without logging it would.
struct Injecting(Arc<dyn ModelAdapter>);

impl ModelAdapter for Injecting {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        let mut forged = (*request).clone();
        forged.messages = std::iter::once(Message::user_text("<system-reminder>unlogged</system-reminder>"))
            .chain(request.messages.iter().cloned())
            .collect();
        self.0.stream(Arc::new(forged))
    }
}

/// spec: ICMP-162 — on the real runtime, a loop-built request with an unlogged prefix fails the
/// call with an `INVARIANT` error finish before the wrapped adapter streams, and the turn fails.
#[tokio::test(start_paused = true)]
async fn an_unlogged_prefix_fails_the_turn_on_the_real_runtime() {
    let model = ScriptedModel::new([chunks::text("never streamed")]);
    let check = RequestCheck::new();
    let runtime = Runtime::builder()
        .model(MODEL, Arc::new(Injecting(check.wrap(model.adapter()))))
        .build();
    let _bound = check.bind_store(runtime.services().sessions.clone());
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = errors.clone();
    let _listener = runtime.services().agent_events.on(move |e| {
        if let AgentEvent::Error { failure, .. } = e {
            seen.lock().unwrap().push(failure.clone());
        }
        Ok(())
    });
    let handle = runtime
        .create(CreateAgentOptions {
            agent_options: AgentOptions {
                provider: Some(MODEL.into()),
                model: Some(MODEL.into()),
                ..AgentOptions::default()
            },
            ..CreateAgentOptions::new(SessionId::from("desync"))
        })
        .await
        .unwrap();
    handle.agent().followup(Message::user_text("hi")).unwrap();
    handle.agent().when_idle().await;
    assert_eq!(model.remaining(), 1, "the wrapped adapter never streamed");
    assert!(model.requests().is_empty());
    let found = check.violations();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        (found[0].rule.as_str(), found[0].session.as_str()),
        ("L7", "desync")
    );
    let errors = errors.lock().unwrap().clone();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code, INVARIANT_FAILURE_CODE);
    assert!(
        errors[0]
            .message
            .contains("diverges from the dispatch-time durable derivation")
    );
    handle.dispose().await;
    runtime.shutdown().await;
}

/// spec: ISES-153 — on the real runtime: with the checker among the store's observers, a seed
/// that breaks a session rule makes the creation itself fail (the checker primes the session as
/// the store enters it), with nothing left live; a valid seed creates its agent, and the two
/// sessions are tracked independently.
#[tokio::test(start_paused = true)]
async fn ises_153_a_bad_seed_fails_the_creation_on_the_runtime() {
    use agent::{EventData, SessionEvent, TurnEndReason};
    let event = |seq: u64, data: EventData| SessionEvent {
        seq,
        time: 1,
        data,
        surface: None,
        ignorable: false,
    };
    let options = |id: &str, seed: Vec<SessionEvent>| CreateAgentOptions {
        agent_options: AgentOptions {
            provider: Some(MODEL.into()),
            model: Some(MODEL.into()),
            ..AgentOptions::default()
        },
        seed: Some(seed),
        ..CreateAgentOptions::new(SessionId::from(id))
    };
    let observer = InvariantObserver::shared();
    let runtime = Runtime::builder()
        .model(MODEL, ScriptedModel::new([chunks::text("ok")]).adapter())
        .session_observer(observer.clone())
        .build();

    let misnumbered = vec![
        event(0, EventData::TurnStart { turn: 5 }),
        event(
            1,
            EventData::TurnEnd {
                turn: 5,
                reason: TurnEndReason::Completed,
            },
        ),
    ];
    let err = runtime
        .create(options("bad", misnumbered))
        .await
        .expect_err("a misnumbered seed is refused");
    match &err {
        agent::AgentError::Log(agent::LogError::Refused { session, reason }) => {
            assert_eq!(session.as_str(), "bad");
            assert!(reason.contains("[S3]"), "{reason}");
        }
        other => panic!("expected a refused session, got {other:?}"),
    }
    assert!(AgentRuntime::list(&runtime).is_empty());
    assert!(runtime.sessions().get(&SessionId::from("bad")).is_none());

    let balanced = vec![
        event(0, EventData::TurnStart { turn: 1 }),
        event(
            1,
            EventData::TurnEnd {
                turn: 1,
                reason: TurnEndReason::Completed,
            },
        ),
    ];
    let good = runtime
        .create(options("good", balanced))
        .await
        .expect("a valid seed creates");
    good.agent().followup(Message::user_text("go")).expect("accepted");
    good.agent().when_idle().await;
    assert_eq!(observer.open_turn(&SessionId::from("good")), None);
    let found: Vec<String> = observer
        .violations()
        .iter()
        .map(|v| v.session.to_string())
        .collect();
    assert!(!found.is_empty() && found.iter().all(|s| s == "bad"), "{found:?}");
    good.dispose().await;
    runtime.shutdown().await;
    agent_loop::runtime::assert_quiescent(&runtime);
}
