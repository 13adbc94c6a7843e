//! Property test of the fork provider's seed (spec `inprocess-providers.md` §5) over generated
//! parent histories, through the seam's service on the reference runtime with a scripted model
//! and the online invariant checker.
//!
//! A parent is optionally created from a generated seed (completed turns with tool calls and
//! dangling calls, aborted/errored/interrupted/max-tokens/blocked turns, inbox splices, policy
//! events, ignorable unknown events, mid-log `session/end-seed` markers, its own
//! `subagent/descriptor` as if it were itself a fork child, and possibly an open turn at the
//! end), then driven through real turns (text, tool calls, model errors, max-tokens, aborts,
//! policy switches), and finally forked while idle, while its turn hangs on the model, or from
//! inside one of its own tool calls. For every case:
//!
//! * the child's seed is exactly the balanced completed-turn prefix of the parent's log at
//!   delegation time (`seedLength`, the end-seed marker, verbatim events), and its own first
//!   turn continues the numbering;
//! * the child's log replays clean (online and offline, and against the parent with
//!   [`check_store`]);
//! * the result holds only the child's own output;
//! * the parent's log is untouched by the delegation;
//! * the host ends quiescent (`Host::finish`).

#[path = "../../subagent-inprocess/tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Arc;

use agent::content::ContentBlock;
use agent::event::{CallConfig, EpochHeader, RequestHeaderReason, SpliceOutcome};
use agent::model::StreamChunk;
use agent::prefix::is_balanced;
use agent::tools::{ToolContext, ToolDefinition, ToolError, ToolHandler, ToolOutput};
use agent::{
    AgentRef, AgentRuntime, CallId, CancelCause, CancelOptions, CreateAgentOptions, EventData, InboxSplice,
    InboxTarget, LlmFailure, Message, MessageId, MessageSource, Role, SessionEvent, SessionId, SessionMeta,
    SurfaceMeta, SurfaceOp, TurnEndReason, balanced_completed_turn_prefix, next_turn_number,
};
use agent_loop::model::{ScriptEntry, chunks};
use async_trait::async_trait;
use common::*;
use invariants::synthetic::SyntheticLog;
use invariants::{check_store, replay_log};
use parking_lot::Mutex;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use serde_json::json;
use subagent::StopReason;
use subagent::SubagentResult;

// ---------------------------------------------------------------------------------------------
// The parent's generated seed
// ---------------------------------------------------------------------------------------------

/// An event between or inside turns that no turn rule constrains.
#[derive(Clone, Debug)]
enum Extra {
    /// A sandbox switch (valid mode, any source).
    Policy(&'static str, Option<&'static str>),
    /// A plugin-owned event of an unknown type, ignorable or not.
    Unknown(bool),
    /// A `session/end-seed` marker (the log of an earlier fork or replay).
    EndSeed,
    /// An inbox insert that was cancelled again (no pending work remains).
    CancelledInsert,
}

fn extra() -> impl Strategy<Value = Extra> {
    prop_oneof![
        (
            prop::sample::select(vec!["read-only", "workspace-write", "danger-full-access"]),
            prop::sample::select(vec![None, Some("delegation"), Some("user")]),
        )
            .prop_map(|(m, s)| Extra::Policy(m, s)),
        any::<bool>().prop_map(Extra::Unknown),
        Just(Extra::EndSeed),
        Just(Extra::CancelledInsert),
    ]
}

#[derive(Clone, Debug)]
struct SeedStep {
    /// Tool calls made in this step.
    calls: u8,
    /// Whether the calls got results (an interrupted step may leave them dangling).
    answered: bool,
    extras: Vec<Extra>,
}

#[derive(Clone, Debug)]
struct SeedTurn {
    before: Vec<Extra>,
    /// Whether the turn's prompt came through the inbox (insert before, claim inside).
    via_inbox: bool,
    /// The seed's own `subagent/descriptor` inside the turn (the parent was a subagent child).
    descriptor: bool,
    steps: Vec<SeedStep>,
    end: TurnEndReason,
}

#[derive(Clone, Debug)]
struct SeedPlan {
    turns: Vec<SeedTurn>,
    trailing: Vec<Extra>,
    /// An open turn at the very end (a log that was never repaired), with this many steps (the
    /// last one open, its tool call pending).
    open_tail: Option<u8>,
}

fn turn_end() -> impl Strategy<Value = TurnEndReason> {
    prop_oneof![
        4 => Just(TurnEndReason::Completed),
        1 => Just(TurnEndReason::Aborted { reason: CancelCause::User }),
        1 => Just(TurnEndReason::Error { error: LlmFailure::unknown("seeded failure") }),
        1 => Just(TurnEndReason::Interrupted),
        1 => Just(TurnEndReason::MaxTokens),
        1 => Just(TurnEndReason::Blocked),
    ]
}

fn seed_step() -> impl Strategy<Value = SeedStep> {
    (0u8..3, any::<bool>(), prop::collection::vec(extra(), 0..2)).prop_map(|(calls, answered, extras)| {
        SeedStep {
            calls,
            answered,
            extras,
        }
    })
}

fn seed_turn() -> impl Strategy<Value = SeedTurn> {
    (
        prop::collection::vec(extra(), 0..2),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::collection::vec(seed_step(), 0..3),
        turn_end(),
    )
        .prop_map(|(before, via_inbox, descriptor, steps, end)| SeedTurn {
            before,
            via_inbox,
            descriptor,
            steps,
            end,
        })
}

fn seed_plan() -> impl Strategy<Value = SeedPlan> {
    (
        prop::collection::vec(seed_turn(), 0..4),
        prop::collection::vec(extra(), 0..3),
        prop::option::weighted(0.2, 1u8..3),
    )
        .prop_map(|(turns, trailing, open_tail)| SeedPlan {
            turns,
            trailing,
            open_tail,
        })
}

/// Renders seed events with `seq == index`, in the loop's shape.
#[derive(Default)]
struct Seed {
    events: Vec<SessionEvent>,
    ids: u64,
}

impl Seed {
    fn push(&mut self, data: EventData, surface: Option<SurfaceMeta>, ignorable: bool) {
        let seq = self.events.len() as u64;
        self.events.push(SessionEvent {
            seq,
            time: 1_000 + seq,
            data,
            surface,
            ignorable,
        });
    }

    fn id(&mut self, prefix: &str) -> String {
        self.ids += 1;
        format!("seed_{prefix}_{}", self.ids)
    }

    fn user(&mut self, text: &str) -> Message {
        Message {
            id: MessageId::new(self.id("msg")),
            role: Role::User,
            content: vec![ContentBlock::text(text)],
            source: MessageSource::User,
        }
    }

    fn extra(&mut self, e: &Extra) {
        match e {
            Extra::Policy(mode, source) => self.push(
                EventData::SandboxMode {
                    mode: (*mode).to_owned(),
                    source: source.map(str::to_owned),
                },
                None,
                false,
            ),
            Extra::Unknown(ignorable) => {
                let n = self.id("x");
                self.push(EventData::other("x/note", json!({"n": n})), None, *ignorable);
            }
            Extra::EndSeed => self.push(EventData::EndSeed, None, false),
            Extra::CancelledInsert => {
                let m = self.user("queued, then withdrawn");
                self.push(EventData::InboxSpliced(splice_insert(m)), None, false);
                self.push(
                    EventData::InboxSpliced(InboxSplice {
                        target: InboxTarget::NextTurn,
                        start: 0,
                        removed_count: Some(1),
                        inserted: vec![],
                        outcome: Some(SpliceOutcome::Canceled),
                    }),
                    None,
                    false,
                );
            }
        }
    }

    /// One step: header (first step), streamed text, the assistant message with `calls` tool
    /// calls, and their results when `answered`.
    fn step(&mut self, turn: u64, step: u64, plan: &SeedStep, open: bool) {
        self.push(EventData::StepStart { turn, step }, None, false);
        if step == 1 {
            let prompt = self.user(&format!("seeded prompt {turn}"));
            self.push(EventData::UserMessage(prompt), Some(SurfaceMeta::append()), false);
            self.push(
                EventData::RequestHeader {
                    header: Box::new(EpochHeader {
                        config: CallConfig {
                            provider: MODEL.into(),
                            model: MODEL.into(),
                            ..CallConfig::default()
                        },
                        system: Some("seeded system".into()),
                        ..EpochHeader::default()
                    }),
                    reason: RequestHeaderReason::Initial,
                },
                None,
                false,
            );
        }
        plan.extras.iter().for_each(|e| self.extra(e));
        let text = format!("seeded answer {turn}.{step}");
        let chunk_seq = self.events.len() as u64;
        self.push(
            EventData::AssistantChunk {
                turn,
                step,
                chunk: StreamChunk::TextDelta {
                    index: 0,
                    text: text.clone(),
                },
            },
            None,
            false,
        );
        let calls: Vec<CallId> = (0..plan.calls).map(|_| CallId::new(self.id("call"))).collect();
        let mut content = vec![ContentBlock::text(&text)];
        content.extend(
            calls
                .iter()
                .map(|c| ContentBlock::tool_call(c.clone(), "echo", "{}")),
        );
        let message = Message {
            id: MessageId::new(self.id("msg")),
            role: Role::Assistant,
            content,
            source: MessageSource::Model {
                provider: MODEL.into(),
                model: MODEL.into(),
                replay_state: None,
            },
        };
        self.push(
            EventData::AssistantMessage {
                turn,
                step,
                message,
                usage: None,
                interrupted: false,
            },
            Some(SurfaceMeta {
                surface_op: Some(SurfaceOp::Append),
                source_event_seqs: Some(vec![chunk_seq]),
            }),
            false,
        );
        for c in &calls {
            self.push(
                EventData::ToolCall {
                    turn,
                    step,
                    call_id: c.clone(),
                    name: "echo".into(),
                    arguments: "{}".into(),
                },
                None,
                false,
            );
        }
        if plan.answered && !open {
            for c in calls {
                let mut m = Message::tool_result(c, vec![ContentBlock::text("seeded ok")], false);
                m.id = MessageId::new(self.id("msg"));
                self.push(
                    EventData::ToolResult {
                        turn,
                        step,
                        message: m,
                        error: None,
                        meta: None,
                    },
                    Some(SurfaceMeta::append()),
                    false,
                );
            }
        }
        if !open {
            self.push(EventData::StepEnd { turn, step }, None, false);
        }
    }

    fn render(plan: &SeedPlan) -> Vec<SessionEvent> {
        let mut s = Seed::default();
        let mut turn = 0;
        for t in &plan.turns {
            turn += 1;
            t.before.iter().for_each(|e| s.extra(e));
            if t.via_inbox {
                let m = s.user("inbox prompt");
                s.push(EventData::InboxSpliced(splice_insert(m)), None, false);
            }
            s.push(EventData::TurnStart { turn }, None, false);
            if t.via_inbox {
                s.push(EventData::InboxSpliced(claim()), None, false);
            }
            if t.descriptor {
                s.push(
                    EventData::other(
                        invariants::DESCRIPTOR_TYPE,
                        json!({"version": 2, "mode": "one-shot", "provider": "fork"}),
                    ),
                    None,
                    false,
                );
            }
            for (i, step) in t.steps.iter().enumerate() {
                s.step(turn, i as u64 + 1, step, false);
            }
            s.push(
                EventData::TurnEnd {
                    turn,
                    reason: t.end.clone(),
                },
                None,
                false,
            );
        }
        plan.trailing.iter().for_each(|e| s.extra(e));
        if let Some(steps) = plan.open_tail {
            turn += 1;
            s.push(EventData::TurnStart { turn }, None, false);
            let step = SeedStep {
                calls: 1,
                answered: false,
                extras: vec![],
            };
            for i in 1..=u64::from(steps) {
                s.step(turn, i, &step, i == u64::from(steps));
            }
        }
        s.events
    }
}

fn splice_insert(m: Message) -> InboxSplice {
    InboxSplice {
        target: InboxTarget::NextTurn,
        start: 0,
        removed_count: None,
        inserted: vec![m],
        outcome: None,
    }
}

fn claim() -> InboxSplice {
    InboxSplice {
        target: InboxTarget::NextTurn,
        start: 0,
        removed_count: Some(1),
        inserted: vec![],
        outcome: None,
    }
}

// ---------------------------------------------------------------------------------------------
// What the live parent does, and how it is forked
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Action {
    Text,
    /// A step with this many calls of the global `echo` tool, then a text step.
    Tools(u8),
    /// The model call fails (the script is empty): the turn ends `error`.
    ModelError,
    MaxTokens,
    /// The model hangs and the parent is cancelled: the turn ends `aborted`.
    Aborted,
    /// A sandbox switch appended between turns.
    Policy(&'static str),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => Just(Action::Text),
        2 => (1u8..3).prop_map(Action::Tools),
        1 => Just(Action::ModelError),
        1 => Just(Action::MaxTokens),
        1 => Just(Action::Aborted),
        1 => prop::sample::select(vec!["read-only", "workspace-write"]).prop_map(Action::Policy),
    ]
}

/// Where the parent is when it forks.
#[derive(Clone, Copy, Debug)]
enum ForkAt {
    /// Between turns, through the service directly.
    Idle,
    /// While its next turn hangs on the model.
    Hanging,
    /// From inside one of its own tool calls (the usual delegation).
    InTool,
}

/// What the child's model does.
#[derive(Clone, Copy, Debug)]
enum ChildReply {
    Text,
    /// An empty response: the child produces no message of its own.
    Empty,
    /// A tool call, then a text answer.
    ToolThenText,
}

#[derive(Clone, Debug)]
struct Case {
    /// `None`: an unseeded parent.
    seed: Option<SeedPlan>,
    /// The seeded parent records `seedLength`/`parentSession` (only for a seed that is itself
    /// a balanced completed-turn prefix).
    fork_child_header: bool,
    actions: Vec<Action>,
    at: ForkAt,
    child: ChildReply,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::option::weighted(0.6, seed_plan()),
        any::<bool>(),
        prop::collection::vec(action(), 0..4),
        prop::sample::select(vec![ForkAt::Idle, ForkAt::Hanging, ForkAt::InTool]),
        prop::sample::select(vec![
            ChildReply::Text,
            ChildReply::Empty,
            ChildReply::ToolThenText,
        ]),
    )
        .prop_map(|(seed, fork_child_header, actions, at, child)| Case {
            seed,
            fork_child_header,
            actions,
            at,
            child,
        })
}

const CHILD_TEXT: &str = "the child's own answer";

/// Forks `host_parent` through the service, recording the parent's log at delegation time,
/// the result, and the child's header and log (read before disposal).
async fn delegate(host_parent: &AgentRef, service: &subagent::service::SubagentService) -> Delegation {
    let snapshot = events_of(host_parent);
    let run = service
        .start(
            subagent_fork::DEFAULT_NAME,
            request_from(host_parent, agent::Signal::new()),
        )
        .await
        .expect("fork started");
    let result = run.result().await.expect("result resolves");
    let child = run.local_agent().expect("local child");
    let header = child.session().header().clone();
    let events = events_of(&child);
    run.dispose().await.expect("disposed");
    Delegation {
        snapshot,
        result,
        header,
        events,
    }
}

struct Delegation {
    snapshot: Vec<SessionEvent>,
    result: SubagentResult,
    header: agent::SessionHeader,
    events: Vec<SessionEvent>,
}

/// The parent's `delegate` tool: forks from inside the parent's open turn.
struct DelegateTool {
    parent: Mutex<Option<AgentRef>>,
    service: subagent::service::SubagentService,
    out: Arc<Mutex<Option<Delegation>>>,
}

#[async_trait]
impl ToolHandler for DelegateTool {
    async fn execute(&self, _: serde_json::Value, _: ToolContext) -> Result<ToolOutput, ToolError> {
        let parent = self.parent.lock().clone().expect("parent set");
        let d = delegate(&parent, &self.service).await;
        let text = text(&d.result.output);
        *self.out.lock() = Some(d);
        Ok(ToolOutput::text(format!("delegated: {text}")))
    }
}

fn push_child_script(host: &Host, reply: ChildReply) {
    match reply {
        ChildReply::Text => host.model.push(chunks::text(CHILD_TEXT)),
        ChildReply::Empty => host.model.push(chunks::empty()),
        ChildReply::ToolThenText => {
            host.model
                .push(chunks::tool_call("child_call", "echo", json!({})));
            host.model.push(chunks::text(CHILD_TEXT));
        }
    }
}

async fn wait_for_requests(host: &Host, n: usize) {
    while host.model.requests().len() < n {
        tokio::task::yield_now().await;
    }
}

async fn run_case(case: Case, dir: PathBuf) -> Result<(), TestCaseError> {
    let mut host = Host::new(vec![]).await;
    let _fork = subagent_fork::register(&host.service, host.driver.clone()).expect("registered");
    let echo = global_tool(
        &host,
        counting_tool("echo", Arc::new(std::sync::atomic::AtomicUsize::new(0))),
    );
    let out: Arc<Mutex<Option<Delegation>>> = Arc::new(Mutex::new(None));
    let delegate_tool = Arc::new(DelegateTool {
        parent: Mutex::new(None),
        service: host.service.clone(),
        out: out.clone(),
    });
    let delegate_reg = global_tool(
        &host,
        ToolDefinition {
            name: "delegate".into(),
            description: "forks".into(),
            parameters: json!({"type": "object"}),
            concurrency_safe: false,
            handler: delegate_tool.clone(),
        },
    );

    // The parent: replaced by a seeded one when the case says so.
    let seed = case.seed.as_ref().map(Seed::render);
    let seed_is_prefix = seed
        .as_ref()
        .is_some_and(|s| !s.is_empty() && balanced_completed_turn_prefix(s).len() == s.len());
    let open_seed = seed.as_ref().is_some_and(|s| !is_balanced(s));
    if let Some(seed) = seed.clone() {
        host.parent_handle.take().expect("parent").dispose().await;
        let mut meta = SessionMeta {
            cwd: Some(PathBuf::from(CWD)),
            ..SessionMeta::default()
        };
        if case.fork_child_header && seed_is_prefix {
            meta.parent_session = Some(SessionId::from("grandparent"));
            meta.seed_length = Some(seed.len() as u64);
        }
        let handle = host
            .runtime
            .create(CreateAgentOptions {
                meta,
                seed: Some(seed),
                agent_options: routed(),
                ..CreateAgentOptions::new(SessionId::from("parent"))
            })
            .await
            .expect("seeded parent created");
        host.parent = handle.agent().clone();
        host.parent_handle = Some(handle);
    }
    *delegate_tool.parent.lock() = Some(host.parent.clone());

    // A parent whose seed ends inside an open turn cannot run turns of its own (its next
    // `turn/start` would break S2); it is forked as it is.
    let actions: &[Action] = if open_seed { &[] } else { &case.actions };
    for a in actions {
        let before = host.model.requests().len();
        match a {
            Action::Text => {
                host.model.push(chunks::text("parent answer"));
                host.parent_turn("parent text turn").await;
            }
            Action::Tools(n) => {
                let calls = (0..*n)
                    .map(|i| chunks::call(format!("p{before}_{i}"), "echo", json!({})))
                    .collect();
                host.model.push(chunks::tool_calls(None, calls));
                host.model.push(chunks::text("parent after tools"));
                host.parent_turn("parent tool turn").await;
            }
            Action::ModelError => host.parent_turn("parent failing turn").await,
            Action::MaxTokens => {
                host.model.push(chunks::max_tokens_text("cut o"));
                host.parent_turn("parent long turn").await;
            }
            Action::Aborted => {
                host.model.push(ScriptEntry::hang());
                host.parent
                    .followup(Message::user_text("parent hanging turn"))
                    .expect("delivered");
                wait_for_requests(&host, before + 1).await;
                host.parent.cancel(CancelCause::User, CancelOptions::default());
                host.parent.when_idle().await;
            }
            Action::Policy(mode) => {
                host.parent
                    .session()
                    .append(
                        EventData::SandboxMode {
                            mode: (*mode).to_owned(),
                            source: None,
                        },
                        None,
                    )
                    .expect("policy appended");
            }
        }
    }

    let at = if open_seed { ForkAt::Idle } else { case.at };
    let d = match at {
        ForkAt::Idle => {
            push_child_script(&host, case.child);
            let before = events_of(&host.parent);
            let d = delegate(&host.parent, &host.service).await;
            prop_assert_eq!(&events_of(&host.parent), &before, "the parent's log changed");
            d
        }
        ForkAt::Hanging => {
            let before = host.model.requests().len();
            host.model.push(ScriptEntry::hang());
            host.parent
                .followup(Message::user_text("parent turn in flight"))
                .expect("delivered");
            wait_for_requests(&host, before + 1).await;
            push_child_script(&host, case.child);
            let during = events_of(&host.parent);
            let d = delegate(&host.parent, &host.service).await;
            prop_assert_eq!(&events_of(&host.parent), &during, "the parent's log changed");
            host.parent.cancel(CancelCause::User, CancelOptions::default());
            host.parent.when_idle().await;
            d
        }
        ForkAt::InTool => {
            host.model
                .push(chunks::tool_call("p_delegate", "delegate", json!({})));
            push_child_script(&host, case.child);
            host.model.push(chunks::text("parent after delegating"));
            host.parent_turn("parent delegates").await;
            let d = out.lock().take();
            prop_assert!(d.is_some(), "the delegate tool ran");
            let d = d.unwrap();
            // Everything the parent logged after delegating is its own turn's work.
            let after = events_of(&host.parent);
            prop_assert_eq!(&after[..d.snapshot.len()], &d.snapshot[..]);
            for e in &after[d.snapshot.len()..] {
                prop_assert!(
                    !matches!(e.type_name(), "subagent/descriptor" | "session/end-seed"),
                    "child event {} in the parent",
                    e.type_name()
                );
                if let EventData::AssistantMessage { message, .. } = &e.data {
                    prop_assert!(!message.text().contains(CHILD_TEXT));
                }
            }
            d
        }
    };

    // The seed: exactly the balanced completed-turn prefix of the parent's log at delegation.
    let prefix = balanced_completed_turn_prefix(&d.snapshot);
    prop_assert!(
        is_balanced(prefix) || seed.is_some(),
        "an unseeded parent's prefix is balanced"
    );
    prop_assert!(
        d.snapshot[prefix.len()..]
            .iter()
            .all(|e| e.type_name() != "turn/end")
    );
    let n = prefix.len();
    if n == 0 {
        prop_assert_eq!(d.header.seed_length, None);
        prop_assert!(!d.events.iter().any(|e| e.type_name() == "session/end-seed"));
    } else {
        prop_assert_eq!(prefix.last().unwrap().type_name(), "turn/end");
        prop_assert_eq!(d.header.seed_length, Some(n as u64));
        prop_assert_eq!(&d.events[..n], prefix);
        prop_assert_eq!(d.events[n].type_name(), "session/end-seed");
    }
    prop_assert_eq!(d.header.parent_session.as_ref(), Some(host.parent.id()));
    // The child's own first turn continues the seed's numbering.
    let own_first_turn = d.events[n..].iter().find_map(|e| match e.data {
        EventData::TurnStart { turn } => Some(turn),
        _ => None,
    });
    prop_assert_eq!(own_first_turn, Some(next_turn_number(prefix)));
    // Only child-owned output.
    prop_assert_eq!(d.result.stop_reason, StopReason::Completed);
    match case.child {
        ChildReply::Empty => prop_assert_eq!(d.result.output, Vec::<ContentBlock>::new()),
        ChildReply::Text | ChildReply::ToolThenText => {
            prop_assert_eq!(text(&d.result.output), CHILD_TEXT);
        }
    }
    // The child's log replays clean on its own and against its parent.
    let report = replay_log(Some(&d.header), &d.events);
    prop_assert!(report.is_clean(), "{:#?}", report.violations);
    let parent_log = SyntheticLog {
        header: host.parent.session().header().clone(),
        events: events_of(&host.parent),
    };
    let child_log = SyntheticLog {
        header: d.header.clone(),
        events: d.events.clone(),
    };
    // Each log under its session's id, as a store names them.
    for log in [&parent_log, &child_log] {
        let file = dir.join(format!("{}.jsonl", log.header.id));
        std::fs::write(file, log.to_jsonl()).expect("written");
    }
    let store = check_store(&dir).expect("store read");
    prop_assert!(store.violations.is_empty(), "{:#?}", store.violations);
    prop_assert!(
        host.observer.violations().is_empty(),
        "{:?}",
        host.observer.violations()
    );

    drop((echo, delegate_reg));
    *delegate_tool.parent.lock() = None;
    host.finish().await;
    Ok(())
}

/// spec: §5.1–§5.3 (FRK-88, FRK-90, FRK-92) — over generated parent histories, the fork
/// child's seed is exactly the parent's balanced completed-turn prefix at delegation time, the
/// child's log is invariant-clean and matches its parent, the result holds only the child's own
/// output, the parent's log is untouched, and the host ends quiescent.
#[test]
fn fork_seed_is_the_balanced_completed_turn_prefix() {
    // Fixed seed, nothing persisted: the same cases on every run.
    let mut runner = TestRunner::new(Config {
        cases: 64,
        rng_seed: RngSeed::Fixed(0x5eed_f0e4),
        failure_persistence: None,
        ..Config::default()
    });
    let tmp = tempfile::tempdir().expect("temp dir");
    let counter = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(&case(), |case| {
            let dir = tmp.path().join(
                counter
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                    .to_string(),
            );
            std::fs::create_dir(&dir).expect("case dir");
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("runtime")
                .block_on(run_case(case, dir))
        })
        .unwrap();
}
