//! `list_agents` (`acp-and-tools.md` §4.4): the separately loadable discovery tool, a thin
//! projection of the seam's child listing (`subagent::listing`).
//!
//! The tool reads; it never resumes, wakes or authorizes anything. Each continuable entry's
//! status comes from the live agent registry at call time; one-shot entries are omitted (they
//! cannot take `send_message`), although the `descendants` walk still traverses them so the
//! continuable descendants below are listed; diagnostics pass through.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::{Serialize, Serializer};
use serde_json::Value;
use subagent::agent::tools::{ToolContext, ToolDefinition, ToolError, ToolHandler, ToolOutput};
use subagent::agent::{AgentRuntime, AgentStatus, Registration, Services, SessionId, Signal};
use subagent::error_chain;
use subagent::listing::{
    DescendantEntry, DiagnosticReason, ListingError, ListingServices, SubagentListEntry, list_children,
    list_descendants,
};

use crate::error::ControlToolError;
use crate::failure::{calling_agent, seam_failure};
use crate::model_text;

/// The `list_agents` plugin's name.
pub const LIST_AGENTS_PLUGIN_NAME: &str = "tool-subagent-list-agents";

/// The host services the `list_agents` plugin requires: the tool registry, the subagent
/// service's listing ([`AgentListing`]) and the live agent registry (`services.agents`).
pub const LIST_AGENTS_DEPENDENCIES: [&str; 3] = ["tools", "subagents", "agents"];

/// The child listing `list_agents` reads: the seam's [`list_children`] and
/// [`list_descendants`] over [`ListingServices`], or a host's own listing with the same
/// contract (for example over a shared store).
///
/// # Contract
/// * Rows come back in the seam's order (children by creation time then id; descendants in
///   stable pre-order) and the tool keeps that order.
/// * `signal` is the tool call's execution signal: an implementation forwards it to every read,
///   and a listing cancelled through it fails (`CANCELLED`, `subagent listing was cancelled`).
/// * Listing never loads, resumes or authorizes an agent.
#[async_trait]
pub trait AgentListing: Send + Sync + 'static {
    /// The direct subagent children of `parent`.
    async fn list_children(
        &self,
        parent: &SessionId,
        signal: &Signal,
    ) -> Result<Vec<SubagentListEntry>, ListingError>;

    /// Every subagent descendant of `root`, with its direct parent and depth.
    async fn list_descendants(
        &self,
        root: &SessionId,
        signal: &Signal,
    ) -> Result<Vec<DescendantEntry>, ListingError>;
}

#[async_trait]
impl AgentListing for ListingServices {
    async fn list_children(
        &self,
        parent: &SessionId,
        signal: &Signal,
    ) -> Result<Vec<SubagentListEntry>, ListingError> {
        list_children(self, parent, signal).await
    }

    async fn list_descendants(
        &self,
        root: &SessionId,
        signal: &Signal,
    ) -> Result<Vec<DescendantEntry>, ListingError> {
        list_descendants(self, root, signal).await
    }
}

/// Which part of the tree a call lists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ListScope {
    /// The caller's direct children (the default).
    #[default]
    Children,
    /// Every descendant, in stable pre-order, with parent id and depth.
    Descendants,
}

impl ListScope {
    /// Parses `{scope?}`: absent or `null` is [`Children`](Self::Children); otherwise exactly
    /// `"children"` or `"descendants"`. Undeclared keys are permitted.
    pub fn parse(arguments: &Value) -> Result<Self, ToolError> {
        let args = arguments.as_object().ok_or_else(|| {
            ToolError::invalid_args(model_text::arguments_not_object(model_text::LIST_AGENTS))
        })?;
        match args.get(model_text::SCOPE_PARAM) {
            None | Some(Value::Null) => Ok(Self::Children),
            Some(Value::String(s)) if s == model_text::SCOPE_CHILDREN => Ok(Self::Children),
            Some(Value::String(s)) if s == model_text::SCOPE_DESCENDANTS => Ok(Self::Descendants),
            Some(_) => Err(ToolError::invalid_args(model_text::SCOPE_INVALID)),
        }
    }
}

/// A listed continuable child's status, read from the live agent registry at call time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListedStatus {
    /// A live agent is running a turn right now.
    Running,
    /// A live agent is resident between turns (possibly waiting on agents it started).
    Idle,
    /// No live agent: the child exists only in storage — resumable, not terminal.
    Ready,
}

impl ListedStatus {
    /// The closed status vocabulary, in the order the model is told about it.
    pub const ALL: [Self; 3] = [Self::Running, Self::Idle, Self::Ready];

    /// The model-facing spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Idle => "idle",
            Self::Ready => "ready",
        }
    }

    /// The status of `id` in `agents`: no live agent → `ready`; a live agent whose status is
    /// running → `running`; otherwise `idle`.
    pub fn of(agents: &dyn AgentRuntime, id: &SessionId) -> Self {
        match agents.get(id) {
            None => Self::Ready,
            Some(agent) if agent.status() == AgentStatus::Running => Self::Running,
            Some(_) => Self::Idle,
        }
    }
}

impl fmt::Display for ListedStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ListedStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

fn reason_str<S: Serializer>(reason: &DiagnosticReason, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(reason.as_str())
}

/// Where a `descendants` entry sits in the tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TreePosition {
    /// The durable direct parent's session id (possibly an ordinary session not itself
    /// listed, such as a one-shot intermediate).
    pub parent: String,
    /// Edges from the caller (direct children are 1).
    pub depth: usize,
}

/// One model-facing entry, serialized as `{kind: "child", id, label, status, parent?, depth?}`
/// or `{kind: "diagnostic", id, reason, parent?, depth?}` (`parent` and `depth` only in scope
/// `descendants`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ListedAgent {
    /// A continuable child.
    Child {
        /// Its durable id.
        id: String,
        /// Its creation label (empty only when a foreign listing omitted it; the seam always
        /// records one for continuable children).
        label: String,
        /// Its live status.
        status: ListedStatus,
        /// Its position (scope `descendants`).
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        position: Option<TreePosition>,
    },
    /// A candidate whose identity could not be read.
    Diagnostic {
        /// Its session id.
        id: String,
        /// Why (`corrupt`, `unsupported` or `unavailable`).
        #[serde(serialize_with = "reason_str")]
        reason: DiagnosticReason,
        /// Its position (scope `descendants`).
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        position: Option<TreePosition>,
    },
}

impl ListedAgent {
    /// Projects one listing row: a diagnostic passes through; a `continuable` child becomes a
    /// child entry with its status from `agents`; any other mode (`one-shot`) is omitted
    /// (`None`).
    pub fn project(
        agents: &dyn AgentRuntime,
        entry: &SubagentListEntry,
        position: Option<TreePosition>,
    ) -> Option<Self> {
        match entry {
            SubagentListEntry::Diagnostic { id, reason } => Some(Self::Diagnostic {
                id: id.as_str().to_owned(),
                reason: *reason,
                position,
            }),
            SubagentListEntry::Child { id, mode, label, .. } => {
                (*mode == "continuable").then(|| Self::Child {
                    id: id.as_str().to_owned(),
                    label: label.clone().unwrap_or_default(),
                    status: ListedStatus::of(agents, id),
                    position,
                })
            }
        }
    }

    /// The entry's line: `<id> [<status>] — <label>` or `<id> [diagnostic: <reason>]`, with
    /// ` parent=<id> depth=<n>` for a positioned entry.
    pub fn line(&self) -> String {
        fn at(position: &Option<TreePosition>) -> Option<(&str, usize)> {
            position.as_ref().map(|p| (p.parent.as_str(), p.depth))
        }
        match self {
            Self::Child {
                id,
                label,
                status,
                position,
            } => model_text::child_line(id, status.as_str(), at(position), label),
            Self::Diagnostic { id, reason, position } => {
                model_text::diagnostic_line(id, reason.as_str(), at(position))
            }
        }
    }
}

/// The text of a listing: one [`line`](ListedAgent::line) per entry in order, or
/// `(no subagents)`.
pub fn render(entries: &[ListedAgent]) -> String {
    if entries.is_empty() {
        return model_text::NO_SUBAGENTS.to_owned();
    }
    entries
        .iter()
        .map(ListedAgent::line)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A listing failure as a tool error: a seam refusal keeps its code (`CANCELLED`,
/// `SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE`, `SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE`);
/// a persistence backend failure is `FAILED` with its error chain.
fn listing_failure(error: &ListingError) -> ToolError {
    match error {
        ListingError::Subagent(seam) => seam_failure(seam),
        ListingError::Persistence(backend) => ToolError::failed(error_chain(backend)),
    }
}

/// The body of `list_agents`.
struct ListAgentsTool {
    services: Services,
    listing: Arc<dyn AgentListing>,
}

#[async_trait]
impl ToolHandler for ListAgentsTool {
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let scope = ListScope::parse(&arguments)?;
        let caller = calling_agent(
            &self.services,
            &ctx,
            model_text::LIST_AGENTS_CALLING_AGENT_REQUIRED,
        )?;
        let agents = self.services.agents.as_ref();
        let entries: Vec<ListedAgent> = match scope {
            ListScope::Children => self
                .listing
                .list_children(caller.id(), &ctx.signal)
                .await
                .map_err(|e| listing_failure(&e))?
                .iter()
                .filter_map(|entry| ListedAgent::project(agents, entry, None))
                .collect(),
            ListScope::Descendants => self
                .listing
                .list_descendants(caller.id(), &ctx.signal)
                .await
                .map_err(|e| listing_failure(&e))?
                .iter()
                .filter_map(|row| {
                    let position = TreePosition {
                        parent: row.parent_id.as_str().to_owned(),
                        depth: row.depth,
                    };
                    ListedAgent::project(agents, &row.entry, Some(position))
                })
                .collect(),
        };
        let text = render(&entries);
        Ok(ToolOutput {
            value: serde_json::to_value(&entries).ok(),
            ..ToolOutput::text(text)
        })
    }
}

/// The loaded `list_agents` tool.
///
/// It is registered **once**, in the host's global tool layer, separately from
/// [`SubagentControlPlugin`](crate::SubagentControlPlugin), so a host can offer delivery
/// without discovery.
///
/// # What the tool guarantees
/// * `list_agents {scope?}` lists the calling agent's continuable children (`children`, the
///   default) or its whole subagent tree (`descendants`) through the [`AgentListing`] the
///   plugin was loaded with, forwarding the call's execution signal to it. Rows keep the
///   listing's order; one-shot rows are omitted; a continuable child's status is `running`,
///   `idle` or `ready` from `services.agents` at call time; diagnostics pass through.
/// * The value is the array of [`ListedAgent`]s; the text is [`render`]'s.
/// * A call without a live calling agent, or with a `scope` other than the two values, is
///   refused; a listing failure is an error with the seam's code and message.
/// * The listing is a snapshot that may race publication and disposal; it grants no authority
///   (`send_message` and `interrupt_agent` check again). It is concurrency-safe (read-only).
///
/// # Ownership, drop and cancellation
/// The plugin owns the registration; [`unload`](Self::unload) or dropping the plugin removes
/// the tool (a call already running finishes). It spawns no task. A cancelled call stops its
/// listing's reads: they observe the execution signal, and the registry drops the call.
pub struct ListAgentsPlugin {
    /// The tool's registration; `None` once unloaded. Never held across an `.await`.
    registration: Mutex<Option<Registration>>,
}

impl fmt::Debug for ListAgentsPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListAgentsPlugin")
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

impl ListAgentsPlugin {
    /// Registers `list_agents` in `services`' global tool layer, reading statuses from
    /// `services.agents` and rows from `listing` — typically the host's [`ListingServices`]
    /// (projection registry, live session store, persistence, optional cache).
    ///
    /// # Errors
    /// [`ControlToolError::Register`] when the registry refuses the tool (the name is already
    /// registered globally).
    pub fn load(services: &Services, listing: Arc<dyn AgentListing>) -> Result<Self, ControlToolError> {
        let registration = services.tools.register(
            None,
            ToolDefinition {
                name: model_text::LIST_AGENTS.to_owned(),
                description: model_text::LIST_AGENTS_DESCRIPTION.to_owned(),
                parameters: model_text::list_agents_parameters(),
                concurrency_safe: true,
                handler: Arc::new(ListAgentsTool {
                    services: services.clone(),
                    listing,
                }),
            },
        )?;
        Ok(Self {
            registration: Mutex::new(Some(registration)),
        })
    }

    /// Whether the tool is registered (the plugin was not unloaded).
    pub fn is_loaded(&self) -> bool {
        self.registration.lock().is_some()
    }

    /// Unregisters the tool. Idempotent.
    pub fn unload(&self) {
        let registration = self.registration.lock().take();
        drop(registration);
    }
}

impl Drop for ListAgentsPlugin {
    fn drop(&mut self) {
        self.unload();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use subagent::agent::tools::codes;

    #[test]
    fn scope_is_parsed_strictly() {
        for (args, scope) in [
            (json!({}), ListScope::Children),
            (json!({"scope": null}), ListScope::Children),
            (json!({"scope": "children"}), ListScope::Children),
            (
                json!({"scope": "descendants", "extra": 1}),
                ListScope::Descendants,
            ),
        ] {
            assert_eq!(ListScope::parse(&args).ok(), Some(scope), "{args}");
        }
        for args in [
            json!(null),
            json!({"scope": "all"}),
            json!({"scope": "Children"}),
            json!({"scope": 1}),
        ] {
            let error = ListScope::parse(&args).expect_err("malformed");
            assert_eq!(error.code, codes::INVALID_ARGS, "{args}");
        }
    }

    /// spec: CTRL-20 (vocabulary half) — the status vocabulary is exactly `running`, `idle`,
    /// `ready`, and that is how statuses serialize. (The reference pins the enum of its output
    /// schema; this runtime has no tool output schemas, so the closed enum is the type.)
    #[test]
    fn ctrl_20_status_vocabulary_is_closed() {
        let spelled: Vec<&str> = ListedStatus::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(spelled, ["running", "idle", "ready"]);
        let serialized: Vec<Value> = ListedStatus::ALL
            .iter()
            .map(|s| serde_json::to_value(s).unwrap_or_default())
            .collect();
        assert_eq!(serialized, [json!("running"), json!("idle"), json!("ready")]);
    }

    #[test]
    fn entries_serialize_in_spec_shape() {
        let child = ListedAgent::Child {
            id: "c".into(),
            label: "l".into(),
            status: ListedStatus::Ready,
            position: None,
        };
        assert_eq!(
            serde_json::to_value(&child).ok(),
            Some(json!({"kind": "child", "id": "c", "label": "l", "status": "ready"}))
        );
        let diagnostic = ListedAgent::Diagnostic {
            id: "d".into(),
            reason: DiagnosticReason::Unavailable,
            position: Some(TreePosition {
                parent: "p".into(),
                depth: 2,
            }),
        };
        assert_eq!(
            serde_json::to_value(&diagnostic).ok(),
            Some(
                json!({"kind": "diagnostic", "id": "d", "reason": "unavailable", "parent": "p", "depth": 2})
            )
        );
        assert_eq!(diagnostic.line(), "d [diagnostic: unavailable] parent=p depth=2");
        assert_eq!(child.line(), "c [ready] — l");
    }

    /// spec: CTRL-16 (rendering half) — an empty listing renders `(no subagents)`.
    #[test]
    fn ctrl_16_empty_rendering() {
        assert_eq!(render(&[]), "(no subagents)");
    }
}
