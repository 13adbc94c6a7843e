//! The scripted coordinator of `subagent demo`.
//!
//! One [`ScriptedModel`] serves the coordinator **and** every child. Each script entry is the
//! same deterministic function of the request ([`respond`]); it routes on the request itself:
//!
//! * a request of the coordinator's session ([`GenerateOptions::session_id`]) is answered by
//!   the coordinator's script, whose stage is read off the conversation: which prompt opened the
//!   current turn and which of its tool calls already have results;
//! * any other request is a child's, answered by the canned reply for the task its own last
//!   prompt carries (the fork child additionally reads the history it inherited).
//!
//! The coordinator runs two turns:
//!
//! 1. [`TASK`]: two `spawn` children in parallel (two calls of the `subagent` tool in one
//!    assistant message), then a briefing built from their answers. The turn completes, so the
//!    conversation now has a completed turn a fork can inherit.
//! 2. [`FOLLOW_UP`]: a background `spawn` job (`run_in_background: true`), then a `fork` child
//!    that reviews the briefing it inherited, then `job_output` to collect the background job,
//!    then the final answer.
//!
//! Nothing depends on timing: every reply is a function of the request's content only.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;

use agent::{ContentBlock, GenerateOptions, MessageList, MessageSource, Role, SessionId, StreamChunk};
use agent_loop::model::chunks::{self, call};
use agent_loop::{ScriptEntry, ScriptedModel};
use futures::FutureExt as _;
use serde_json::json;

use crate::host::{Host, HostError, HostOptions, build_host};
use crate::tree::{LiveTree, TreeNode, TreeSink};

/// The model route (provider name) the demo's agents use.
pub const MODEL_PROVIDER: &str = "scripted";
/// The model name the demo's agents use.
pub const MODEL_NAME: &str = "demo-coordinator";

pub use crate::host::{FORK_TOOL, SPAWN_TOOL};

/// The coordinator's first prompt.
pub const TASK: &str = "Give me a short briefing on this workspace: what its crates are for and how \
                        well its documentation covers them.";
/// The coordinator's second prompt.
pub const FOLLOW_UP: &str = "Have a reviewer who knows this conversation check the briefing, and \
                             meanwhile count the test suites in the background.";

/// The delegations the coordinator makes: `(call id, tool, label, prompt, background)`.
pub const DELEGATIONS: [Delegation; 4] = [
    Delegation {
        call_id: "call-crates",
        tool: SPAWN_TOOL,
        label: "survey the crates",
        prompt: "List the crates of the workspace and say in one line what each one is for.",
        background: false,
    },
    Delegation {
        call_id: "call-docs",
        tool: SPAWN_TOOL,
        label: "audit the docs",
        prompt: "Check which user documents the workspace has and what each one covers.",
        background: false,
    },
    Delegation {
        call_id: "call-tests",
        tool: SPAWN_TOOL,
        label: "count the test suites",
        prompt: "Count the test suites of the workspace, crate by crate.",
        background: true,
    },
    Delegation {
        call_id: "call-review",
        tool: FORK_TOOL,
        label: "review the briefing",
        prompt: "Review the briefing you gave above and point out its most important gap.",
        background: false,
    },
];

/// The call id of the coordinator's `job_output` call.
pub const COLLECT_CALL: &str = "call-collect";

/// One scripted delegation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delegation {
    /// The coordinator's call id.
    pub call_id: &'static str,
    /// The delegation tool called (which provider).
    pub tool: &'static str,
    /// The `description` (the child's durable label).
    pub label: &'static str,
    /// The child's task.
    pub prompt: &'static str,
    /// Whether it runs as a background job.
    pub background: bool,
}

impl Delegation {
    fn call(&self) -> chunks::ScriptedCall {
        let mut args = json!({"description": self.label, "prompt": self.prompt});
        if self.background {
            args["run_in_background"] = json!(true);
        }
        call(self.call_id, self.tool, args)
    }
}

const CRATES: Delegation = DELEGATIONS[0];
const DOCS: Delegation = DELEGATIONS[1];
const TESTS: Delegation = DELEGATIONS[2];
const REVIEW: Delegation = DELEGATIONS[3];

/// The scripted model of a demo whose coordinator is `coordinator`: `entries` copies of the
/// routing function (one is consumed per model call; the demo makes 10 calls).
pub fn demo_model(coordinator: SessionId, entries: usize) -> ScriptedModel {
    let entry = ScriptEntry::respond(move |request| respond(&coordinator, request));
    ScriptedModel::new(std::iter::repeat_n(entry, entries))
}

/// The reply to one request (see the module docs).
pub fn respond(coordinator: &SessionId, request: &GenerateOptions) -> Vec<StreamChunk> {
    if request.session_id.as_ref() == Some(coordinator) {
        coordinator_reply(&request.messages)
    } else {
        child_reply(&request.messages)
    }
}

/// The index of the last prompt from a direct caller (`source: user`) in `messages`, and its
/// text: where a scripted reply finds the task it answers (shared with the crate's tests).
pub fn last_prompt(messages: &MessageList) -> Option<(usize, String)> {
    messages
        .iter()
        .enumerate()
        .rev()
        .find(|(_, m)| m.role == Role::User && matches!(m.source, MessageSource::User))
        .map(|(i, m)| (i, m.text()))
}

/// The tool results in `messages` from message `from` on, by call id, with their visible text:
/// what a scripted reply reads of the calls it made (shared with the crate's tests).
pub fn results_since(messages: &MessageList, from: usize) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for message in messages.iter().skip(from) {
        for block in &message.content {
            if let ContentBlock::ToolResult {
                tool_call_id,
                content,
                ..
            } = block
            {
                out.insert(tool_call_id.to_string(), agent::content::visible_text(content));
            }
        }
    }
    out
}

fn coordinator_reply(messages: &MessageList) -> Vec<StreamChunk> {
    let Some((at, prompt)) = last_prompt(messages) else {
        return chunks::text("I have no task to work on.");
    };
    let results = results_since(messages, at);
    let got = |d: &Delegation| results.get(d.call_id).cloned();
    if prompt == TASK {
        return match (got(&CRATES), got(&DOCS)) {
            (Some(crates), Some(docs)) => chunks::text(format!(
                "Briefing from two parallel surveys.\n- Crates: {crates}\n- Documentation: {docs}"
            )),
            _ => chunks::tool_calls(
                Some("Two independent surveys: I'll run them in parallel as fresh subagents."),
                vec![CRATES.call(), DOCS.call()],
            ),
        };
    }
    if prompt == FOLLOW_UP {
        let Some(started) = got(&TESTS) else {
            return chunks::tool_calls(
                Some(
                    "Starting the test count as a background job, then forking a reviewer who knows this conversation.",
                ),
                vec![TESTS.call()],
            );
        };
        let Some(review) = got(&REVIEW) else {
            return chunks::tool_calls(None, vec![REVIEW.call()]);
        };
        let Some(counted) = results.get(COLLECT_CALL).cloned() else {
            let job = started
                .strip_prefix("started background subagent job ")
                .map_or("subagent-1", str::trim)
                .to_owned();
            return chunks::tool_calls(
                None,
                vec![call(
                    COLLECT_CALL,
                    "job_output",
                    json!({"job_id": job, "wait": true}),
                )],
            );
        };
        let counted = counted.lines().next().unwrap_or_default().to_owned();
        return chunks::text(format!(
            "Here is the briefing, reviewed. The workspace is a Rust implementation of the subagent seam: a spine of \
             contracts, a reference runtime, the seam itself with in-process `spawn` and `fork` \
             providers, the model-facing delegation tool and an invariant checker, composed by this \
             command-line host.\n- Review (fork): {review}\n- Tests (background spawn): {counted}"
        ));
    }
    chunks::text("I have nothing scripted for that request.")
}

fn child_reply(messages: &MessageList) -> Vec<StreamChunk> {
    let Some((at, prompt)) = last_prompt(messages) else {
        return chunks::text("I have no task to work on.");
    };
    let reply = if prompt == CRATES.prompt {
        "agent holds the spine contracts, agent-loop the reference runtime, subagent the seam, \
         subagent-inprocess/-spawn/-fork the in-process providers, tool-subagent the delegation \
         tool, invariants the log replay, and cli this program."
            .to_owned()
    } else if prompt == DOCS.prompt {
        "README.md starts newcomers with the demo and the test suite; docs/getting-started.md shows \
         how to register providers in a host of one's own."
            .to_owned()
    } else if prompt == TESTS.prompt {
        "every crate ships unit tests beside its code and integration suites under tests/; the cli \
         adds an end-to-end demo test, command tests and a replayed-SSE test."
            .to_owned()
    } else if prompt == REVIEW.prompt {
        // The fork child sees the parent's completed turn: read the briefing it inherited.
        let briefing = messages
            .iter()
            .take(at)
            .rev()
            .find(|m| m.role == Role::Assistant && !m.text().is_empty())
            .map(|m| m.text())
            .unwrap_or_default();
        let first_line = briefing.lines().next().unwrap_or("(nothing)");
        format!(
            "I inherited {} earlier messages, ending with \"{first_line}\". Its biggest gap: it never \
             says how to run the same host on a real model (`subagent run`).",
            at
        )
    } else {
        "I have nothing scripted for that task.".to_owned()
    };
    chunks::text(reply)
}

pub use crate::model_text::DEMO_PERSONA;

/// How many script entries the demo's model holds (it makes 10 calls; the rest is slack so a
/// changed script fails with a scripted answer rather than an exhausted script).
pub const DEMO_SCRIPT_ENTRIES: usize = 64;

/// What a finished demo produced.
#[derive(Clone, Debug)]
pub struct DemoOutcome {
    /// The coordinator's session id.
    pub coordinator: SessionId,
    /// The coordinator's final answer.
    pub answer: String,
    /// The delegation tree as it ended.
    pub tree: Vec<TreeNode>,
    /// The tree rendered as text.
    pub rendered_tree: String,
    /// The store directory holding every session log.
    pub store_dir: PathBuf,
    /// How many model calls were made (coordinator and children).
    pub model_calls: usize,
}

/// Why the demo did not finish cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The host could not be composed, or the coordinator's run failed; `shutdown` is the
    /// host's shutdown failure when that failed too.
    #[error("{run}{}", shutdown.as_ref().map(|e| format!("; the host did not shut down cleanly either: {e}")).unwrap_or_default())]
    Run {
        /// Why the run failed.
        run: HostError,
        /// Why the shutdown after it failed, if it did.
        shutdown: Option<HostError>,
    },
    /// The run finished — `outcome` holds its answer — but the host did not shut down cleanly
    /// (some session log may not be durable).
    #[error("the host did not shut down cleanly: {shutdown}")]
    Shutdown {
        /// What the finished run produced.
        outcome: Box<DemoOutcome>,
        /// Why the shutdown failed.
        shutdown: HostError,
    },
    /// The demo was stopped ([`DemoHost::run_until`]'s `stop` resolved) before it finished: the
    /// coordinator's running turn was cancelled (its children with it), no further turn was
    /// started, and the host was shut down — every log balanced and, unless `shutdown` says
    /// otherwise, durable.
    #[error("the demo was interrupted before it finished{}", shutdown.as_ref().map(|e| format!("; the host did not shut down cleanly either: {e}")).unwrap_or_default())]
    Interrupted {
        /// The coordinator's session id.
        coordinator: SessionId,
        /// The store directory holding every session log.
        store_dir: PathBuf,
        /// Why the shutdown after the stop failed, if it did.
        shutdown: Option<HostError>,
    },
}

impl From<HostError> for DemoError {
    fn from(run: HostError) -> Self {
        Self::Run { run, shutdown: None }
    }
}

/// The demo before it runs: the coordinator's id, the scripted model and the host options
/// (adjust them — add session observers, pass a pre-subscribed subagent service — before
/// [`DemoSetup::build`]).
#[derive(Debug)]
pub struct DemoSetup {
    /// The coordinator's session id (`coordinator-<12 hex digits>`).
    pub coordinator: SessionId,
    /// The scripted model serving the coordinator and every child.
    pub model: ScriptedModel,
    /// The host options (scripted model, persona, store directory).
    pub options: HostOptions,
}

impl DemoSetup {
    /// The demo's setup over the store at `store_dir`.
    pub fn new(store_dir: &Path) -> Self {
        let coordinator = SessionId::new(format!(
            "coordinator-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        let model = demo_model(coordinator.clone(), DEMO_SCRIPT_ENTRIES);
        let mut options = HostOptions::new(store_dir, model.adapter(), MODEL_PROVIDER, MODEL_NAME);
        options.persona = Some(DEMO_PERSONA.to_owned());
        Self {
            coordinator,
            model,
            options,
        }
    }

    /// Composes the host.
    pub fn build(self) -> Result<DemoHost, HostError> {
        let store_dir = self.options.store_dir.clone();
        Ok(DemoHost {
            host: build_host(self.options)?,
            coordinator: self.coordinator,
            model: self.model,
            store_dir,
        })
    }
}

/// The demo's composed host, ready to run.
#[derive(Debug)]
pub struct DemoHost {
    /// The host.
    pub host: Host,
    /// The coordinator's session id.
    pub coordinator: SessionId,
    /// The scripted model.
    pub model: ScriptedModel,
    store_dir: PathBuf,
}

impl DemoHost {
    /// Creates the coordinator, runs its two turns (see the module docs) while `sink` hears
    /// every change of the delegation tree, then shuts the host down (every log durable).
    ///
    /// A failed shutdown never hides the run's own failure, nor discards a finished run's
    /// outcome: both are in the [`DemoError`].
    pub async fn run(self, sink: Option<TreeSink>) -> Result<DemoOutcome, DemoError> {
        self.run_until(sink, std::future::pending()).await
    }

    /// [`DemoHost::run`], stopped early once `stop` resolves (say, on the first Ctrl-C): the
    /// coordinator's running turn is cancelled — its foreground children with it; disposing the
    /// coordinator ends its background job — no further turn starts, and the host shuts down
    /// normally, so every log ends balanced and durable. The first turn's prompt is delivered
    /// before `stop` is looked at, so a `stop` that has already resolved leaves the coordinator
    /// with one aborted turn. A demo stopped before its last turn settled is
    /// [`DemoError::Interrupted`]; once it has, the stop changes nothing and the outcome is
    /// the finished run's.
    pub async fn run_until(
        self,
        sink: Option<TreeSink>,
        stop: impl Future<Output = ()>,
    ) -> Result<DemoOutcome, DemoError> {
        let DemoHost {
            host,
            coordinator,
            model,
            store_dir,
        } = self;
        let (tree, listening) = LiveTree::attach(host.runtime(), host.subagents(), host.jobs(), sink);
        let outcome = drive(&host, &tree, &coordinator, stop).await;
        // Every run has settled; wait for their `subagent/end` events before reading the tree.
        host.subagents().close().await;
        let rendered_tree = tree.render();
        let nodes = tree.nodes();
        drop(listening);
        let shutdown = host.shutdown().await;
        let answer = match outcome {
            Ok(Driven::Answered(answer)) => answer,
            Ok(Driven::Stopped) => {
                return Err(DemoError::Interrupted {
                    coordinator,
                    store_dir,
                    shutdown: shutdown.err(),
                });
            }
            Err(run) => {
                return Err(DemoError::Run {
                    run,
                    shutdown: shutdown.err(),
                });
            }
        };
        let outcome = DemoOutcome {
            coordinator,
            answer,
            tree: nodes,
            rendered_tree,
            store_dir,
            model_calls: DEMO_SCRIPT_ENTRIES - model.remaining(),
        };
        match shutdown {
            Ok(()) => Ok(outcome),
            Err(shutdown) => Err(DemoError::Shutdown {
                outcome: Box::new(outcome),
                shutdown,
            }),
        }
    }
}

/// Runs the scripted demo into the store at `store_dir` ([`DemoSetup::new`], then
/// [`DemoHost::run`]).
pub async fn run_demo(store_dir: &Path, sink: Option<TreeSink>) -> Result<DemoOutcome, DemoError> {
    run_demo_until(store_dir, sink, std::future::pending()).await
}

/// Runs the scripted demo into the store at `store_dir` until `stop` resolves
/// ([`DemoSetup::new`], then [`DemoHost::run_until`]): a demo stopped before it finished is
/// [`DemoError::Interrupted`], its host shut down and its logs balanced and durable.
pub async fn run_demo_until(
    store_dir: &Path,
    sink: Option<TreeSink>,
    stop: impl Future<Output = ()>,
) -> Result<DemoOutcome, DemoError> {
    DemoSetup::new(store_dir).build()?.run_until(sink, stop).await
}

/// How the coordinator's turns ended.
enum Driven {
    /// Both turns ran; the coordinator's final answer.
    Answered(String),
    /// The stop came first: the running turn was cancelled, no further turn started.
    Stopped,
}

/// The coordinator's two turns, until `stop` resolves; disposes the coordinator on every path.
async fn drive(
    host: &Host,
    tree: &LiveTree,
    coordinator: &SessionId,
    stop: impl Future<Output = ()>,
) -> Result<Driven, HostError> {
    let handle = host.create_agent(coordinator.clone()).await?;
    tree.add_root(coordinator.clone(), "coordinator");
    let agent = handle.agent().clone();
    let mut stop = pin!(stop);
    let mut stopped = false;
    let mut result = Ok(());
    for (n, prompt) in [TASK, FOLLOW_UP].into_iter().enumerate() {
        // No further turn once the stop has come (say, while the last turn was settling).
        if n > 0 && stop.as_mut().now_or_never().is_some() {
            stopped = true;
            break;
        }
        result = tokio::select! {
            // The prompt is delivered (its turn started) before `stop` is looked at, so a stop
            // that came first aborts the turn rather than racing it.
            biased;
            turn = host.run_turn(&agent, prompt) => turn,
            () = &mut stop => {
                agent.cancel(agent::CancelCause::User, agent::CancelOptions::default());
                agent.when_idle().await;
                stopped = true;
                Ok(())
            }
        };
        if stopped || result.is_err() {
            break;
        }
    }
    let answer = Host::last_answer(agent.as_ref()).unwrap_or_default();
    handle.dispose().await;
    result.map(|()| {
        if stopped {
            Driven::Stopped
        } else {
            Driven::Answered(answer)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent::{FinishReason, Message};

    fn request(session: &str, messages: Vec<Message>) -> GenerateOptions {
        let mut r = GenerateOptions::new(MODEL_PROVIDER, MODEL_NAME, messages);
        r.session_id = Some(SessionId::from(session));
        r
    }

    fn calls(chunks: &[StreamChunk]) -> Vec<(String, String)> {
        chunks
            .iter()
            .filter_map(|c| match c {
                StreamChunk::BlockEnd {
                    block: ContentBlock::ToolCall { name, arguments, .. },
                    ..
                } => Some((name.clone(), arguments.clone())),
                _ => None,
            })
            .collect()
    }

    fn finish(chunks: &[StreamChunk]) -> FinishReason {
        match chunks.last() {
            Some(StreamChunk::Finish { reason, .. }) => reason.clone(),
            other => panic!("no finish: {other:?}"),
        }
    }

    fn result(call_id: &str, text: &str) -> Message {
        Message::tool_result(call_id.into(), vec![ContentBlock::text(text)], false)
    }

    #[test]
    fn the_first_turn_fans_out_two_spawn_calls_then_briefs() {
        let c = SessionId::from("coord");
        let first = respond(&c, &request("coord", vec![Message::user_text(TASK)]));
        let names: Vec<String> = calls(&first).into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, [SPAWN_TOOL, SPAWN_TOOL]);
        assert_eq!(finish(&first), FinishReason::ToolCalls);
        let second = respond(
            &c,
            &request(
                "coord",
                vec![
                    Message::user_text(TASK),
                    result("call-crates", "A"),
                    result("call-docs", "B"),
                ],
            ),
        );
        assert_eq!(finish(&second), FinishReason::Stop);
        assert!(calls(&second).is_empty());
    }

    #[test]
    fn the_second_turn_goes_background_fork_collect_answer() {
        let c = SessionId::from("coord");
        let mut history = vec![Message::user_text(TASK), Message::user_text(FOLLOW_UP)];
        let step = |h: &Vec<Message>| calls(&respond(&c, &request("coord", h.clone())));
        let first = step(&history);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].0, SPAWN_TOOL);
        assert!(first[0].1.contains("\"run_in_background\":true"));
        history.push(result("call-tests", "started background subagent job subagent-7"));
        assert_eq!(step(&history)[0].0, FORK_TOOL);
        history.push(result("call-review", "looks fine"));
        assert_eq!(
            step(&history),
            [(
                "job_output".to_owned(),
                r#"{"job_id":"subagent-7","wait":true}"#.to_owned()
            )]
        );
        history.push(result(COLLECT_CALL, "counted\n[status: completed]"));
        let last = respond(&c, &request("coord", history));
        assert_eq!(finish(&last), FinishReason::Stop);
    }

    #[test]
    fn children_are_answered_by_their_prompt() {
        let c = SessionId::from("coord");
        for d in DELEGATIONS {
            let reply = respond(&c, &request("child", vec![Message::user_text(d.prompt)]));
            assert_eq!(finish(&reply), FinishReason::Stop, "{}", d.label);
            assert!(calls(&reply).is_empty());
        }
    }
}
