//! A live tree of one host's delegations: parent → children, each with provider, label, depth
//! and status.
//!
//! [`LiveTree::attach`] subscribes to the subagent service's lifecycle events
//! (`subagent/start` adds a child under its parent, `subagent/end` records its stop reason) and
//! to the runtime's agent events (`agent/status` moves a node between `running` and `idle`).
//! Labels come from each child's own `subagent/descriptor` event, read from its live session as
//! soon as it is there (an out-of-process child has no session here: it shows its provider
//! only, one level below its parent); a child is marked as a background job when its parent
//! owns a job with the child's label. Every change calls the tree's sink with what changed, so a
//! front end can redraw or print a line. Listener work is short and synchronous (no lock is held while the
//! sink runs).

use std::fmt::Write as _;
use std::sync::Arc;

use agent::{AgentEvent, AgentRuntime, AgentStatus, Registration, SessionId, SessionStore};
use agent_loop::jobs::JobRegistry;
use agent_loop::runtime::Runtime;
use parking_lot::Mutex;
use subagent::events::SubagentEvent;
use subagent::service::SubagentService;
use subagent::{DescriptorState, StopReason, fold_subagent_descriptor};

use crate::terminal_text::single_line_owned;

/// The status of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeStatus {
    /// Published, not running yet.
    Starting,
    /// Its driver is running.
    Running,
    /// Waiting for input.
    Idle,
    /// The run settled (children only).
    Ended(StopReason),
}

impl std::fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Starting => f.write_str("starting"),
            Self::Running => f.write_str("running"),
            Self::Idle => f.write_str("idle"),
            Self::Ended(reason) => write!(f, "{reason}"),
        }
    }
}

/// One agent in the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeNode {
    /// The agent's (session) id.
    pub id: SessionId,
    /// Its delegating parent (`None` for a root).
    pub parent: Option<SessionId>,
    /// The provider that ran it (children only).
    pub provider: Option<String>,
    /// Its label (from its descriptor; roots: the name they were added with).
    pub label: Option<String>,
    /// Its delegation depth.
    pub depth: u64,
    /// Its status.
    pub status: NodeStatus,
    /// The background job that owns its run, if any.
    pub background_job: Option<String>,
}

/// What changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeChange {
    /// A root was added.
    Root(SessionId),
    /// A child started (`subagent/start`).
    Started(SessionId),
    /// A child's run settled (`subagent/end`).
    Ended(SessionId),
    /// A node's status changed.
    Status(SessionId),
}

impl TreeChange {
    /// The node the change is about.
    pub fn id(&self) -> &SessionId {
        match self {
            Self::Root(id) | Self::Started(id) | Self::Ended(id) | Self::Status(id) => id,
        }
    }
}

/// Receives every change with the tree after it.
pub type TreeSink = Arc<dyn Fn(&TreeChange, &LiveTree) + Send + Sync>;

/// The live delegation tree (see the module docs).
pub struct LiveTree {
    runtime: Runtime,
    jobs: Arc<JobRegistry>,
    /// Nodes in the order they appeared.
    nodes: Mutex<Vec<TreeNode>>,
    sink: Option<TreeSink>,
}

impl std::fmt::Debug for LiveTree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveTree")
            .field("nodes", &self.nodes.lock().len())
            .finish()
    }
}

impl LiveTree {
    /// A tree over `runtime`'s agents and `subagents`' runs, calling `sink` on every change.
    /// Drop the returned registration to stop listening.
    pub fn attach(
        runtime: &Runtime,
        subagents: &SubagentService,
        jobs: &Arc<JobRegistry>,
        sink: Option<TreeSink>,
    ) -> (Arc<LiveTree>, Registration) {
        let tree = Arc::new(LiveTree {
            runtime: runtime.clone(),
            jobs: jobs.clone(),
            nodes: Mutex::new(Vec::new()),
            sink,
        });
        let weak = Arc::downgrade(&tree);
        let on_run = subagents.events().on(move |event| {
            if let Some(tree) = weak.upgrade() {
                tree.on_subagent_event(event);
            }
            Ok(())
        });
        let weak = Arc::downgrade(&tree);
        let on_agent = runtime.services().agent_events.on(move |event| {
            if let Some(tree) = weak.upgrade() {
                tree.on_agent_event(event);
            }
            Ok(())
        });
        (tree, Registration::all(vec![on_run, on_agent]))
    }

    /// Adds a root node (a top-level agent) named `label`.
    pub fn add_root(&self, id: SessionId, label: impl Into<String>) {
        let depth = self.depth_of(&id);
        self.nodes.lock().push(TreeNode {
            id: id.clone(),
            parent: None,
            provider: None,
            label: Some(label.into()),
            depth,
            status: NodeStatus::Idle,
            background_job: None,
        });
        self.notify(&TreeChange::Root(id));
    }

    /// A snapshot of every node, in the order they appeared.
    pub fn nodes(&self) -> Vec<TreeNode> {
        self.refresh();
        self.nodes.lock().clone()
    }

    /// The node `id`.
    pub fn node(&self, id: &SessionId) -> Option<TreeNode> {
        self.nodes().into_iter().find(|n| &n.id == id)
    }

    /// The tree as text, one line per node, children indented under their parent.
    pub fn render(&self) -> String {
        let nodes = self.nodes();
        let mut out = String::new();
        for root in nodes.iter().filter(|n| {
            n.parent
                .as_ref()
                .is_none_or(|p| !nodes.iter().any(|m| &m.id == p))
        }) {
            let _ = writeln!(out, "{}", node_line(root));
            render_children(&nodes, &root.id, "", &mut out);
        }
        out
    }

    fn on_subagent_event(&self, event: &SubagentEvent) {
        match event {
            SubagentEvent::Start(info) => {
                // A local child's header records its depth; an out-of-process child (`acp`)
                // has no session here, and sits one level below its parent.
                let depth = if info.local {
                    self.depth_of(&info.id)
                } else {
                    self.depth_of(&info.parent) + 1
                };
                // The child's driver started when its prompt was delivered, before this event.
                let status = match AgentRuntime::get(&self.runtime, &info.id).map(|a| a.status()) {
                    Some(AgentStatus::Running) => NodeStatus::Running,
                    Some(AgentStatus::Idle) => NodeStatus::Idle,
                    None => NodeStatus::Starting,
                };
                {
                    let mut nodes = self.nodes.lock();
                    // A continuable child runs again (a follow-up, a cold resume) under the same
                    // id: its node is the one to move, not a second node for one session that
                    // no later status or end would reach.
                    match nodes.iter_mut().find(|n| n.id == info.id) {
                        Some(node) => node.status = status,
                        None => nodes.push(TreeNode {
                            id: info.id.clone(),
                            parent: Some(info.parent.clone()),
                            provider: Some(info.provider.clone()),
                            label: None,
                            depth,
                            status,
                            background_job: None,
                        }),
                    }
                }
                self.notify(&TreeChange::Started(info.id.clone()));
            }
            SubagentEvent::End(end) => {
                let changed = {
                    let mut nodes = self.nodes.lock();
                    match nodes.iter_mut().find(|n| n.id == end.info.id) {
                        Some(node) => {
                            node.status = NodeStatus::Ended(end.stop_reason.clone());
                            true
                        }
                        None => false,
                    }
                };
                if changed {
                    self.notify(&TreeChange::Ended(end.info.id.clone()));
                }
            }
            _ => {}
        }
    }

    fn on_agent_event(&self, event: &AgentEvent) {
        let AgentEvent::Status { agent, status } = event else {
            return;
        };
        let changed = {
            let mut nodes = self.nodes.lock();
            match nodes.iter_mut().find(|n| &n.id == agent) {
                Some(node) if !matches!(node.status, NodeStatus::Ended(_)) => {
                    node.status = match status {
                        AgentStatus::Running => NodeStatus::Running,
                        AgentStatus::Idle => NodeStatus::Idle,
                    };
                    true
                }
                _ => false,
            }
        };
        if changed {
            self.notify(&TreeChange::Status(agent.clone()));
        }
    }

    fn notify(&self, change: &TreeChange) {
        self.refresh();
        if let Some(sink) = &self.sink {
            sink(change, self);
        }
    }

    /// Fills labels from live sessions' descriptors and background marks from the job registry.
    fn refresh(&self) {
        let missing: Vec<(SessionId, Option<SessionId>, Option<String>)> = self
            .nodes
            .lock()
            .iter()
            .filter(|n| n.parent.is_some() && (n.label.is_none() || n.background_job.is_none()))
            .map(|n| (n.id.clone(), n.parent.clone(), n.label.clone()))
            .collect();
        if missing.is_empty() {
            return;
        }
        let mut updates = Vec::new();
        for (id, parent, label) in missing {
            let label = label.or_else(|| self.label_of(&id));
            let job = match (&parent, &label) {
                (Some(parent), Some(label)) => self
                    .jobs
                    .snapshots(parent)
                    .into_iter()
                    .find(|j| j.kind == tool_subagent::background::JOB_KIND && &j.label == label)
                    .map(|j| j.id.0),
                _ => None,
            };
            updates.push((id, label, job));
        }
        let mut nodes = self.nodes.lock();
        for (id, label, job) in updates {
            if let Some(node) = nodes.iter_mut().find(|n| n.id == id) {
                if node.label.is_none() {
                    node.label = label;
                }
                if node.background_job.is_none() {
                    node.background_job = job;
                }
            }
        }
    }

    /// The label in the live session's own descriptor.
    fn label_of(&self, id: &SessionId) -> Option<String> {
        let session = self.runtime.sessions().get(id)?;
        let events = session.events();
        let seed = usize::try_from(session.header().seed_length.unwrap_or(0)).unwrap_or(usize::MAX);
        let own = &events[seed.min(events.len())..];
        match fold_subagent_descriptor(own.iter()) {
            Ok(DescriptorState::Supported(d)) => d.label().map(str::to_owned),
            _ => None,
        }
    }

    fn depth_of(&self, id: &SessionId) -> u64 {
        self.runtime
            .sessions()
            .get(id)
            .and_then(|s| s.header().delegation_depth)
            .unwrap_or(0)
    }
}

fn render_children(nodes: &[TreeNode], parent: &SessionId, prefix: &str, out: &mut String) {
    let children: Vec<&TreeNode> = nodes
        .iter()
        .filter(|n| n.parent.as_ref() == Some(parent))
        .collect();
    let n = children.len();
    for (i, child) in children.into_iter().enumerate() {
        let (branch, cont) = if i + 1 == n {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        let _ = writeln!(out, "{prefix}{branch}{}", node_line(child));
        render_children(nodes, &child.id, &format!("{prefix}{cont}"), out);
    }
}

/// One node as text: `<provider> "<label>"  depth d  [background job <id>]  <status>  (<id>)`.
///
/// The label comes from a model (the delegation call's `description`) and the other fields may
/// too, so the line is passed through
/// [`single_line`](crate::terminal_text::single_line): control characters, line breaks and
/// bidirectional controls in it are shown as visible escapes, never written raw.
pub fn node_line(node: &TreeNode) -> String {
    let mut line = String::new();
    match (&node.provider, &node.label) {
        (Some(p), Some(l)) => {
            let _ = write!(line, "{p} \"{l}\"");
        }
        (Some(p), None) => line.push_str(p),
        (None, Some(l)) => line.push_str(l),
        (None, None) => line.push_str("agent"),
    }
    let _ = write!(line, "  depth {}", node.depth);
    if let Some(job) = &node.background_job {
        let _ = write!(line, "  background job {job}");
    }
    let id = if node.parent.is_some() {
        short_id(&node.id)
    } else {
        node.id.to_string()
    };
    let _ = write!(line, "  {}  ({id})", node.status);
    single_line_owned(line)
}

/// The first 8 characters of an id (whole ids are in `subagent agents`).
pub fn short_id(id: &SessionId) -> String {
    id.as_str().chars().take(8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_line_shows_a_hostile_label_provider_and_id_on_one_inert_line() {
        let node = TreeNode {
            id: SessionId::new("\x1b[2Jchild-id"),
            parent: Some(SessionId::new("parent")),
            provider: Some("spawn\u{9b}31m".to_owned()),
            label: Some("evil\x1b]0;pwned\x07\r\nforged\u{202e}".to_owned()),
            depth: 1,
            status: NodeStatus::Running,
            background_job: None,
        };
        assert_eq!(
            node_line(&node),
            "spawn\\u{9b}31m \"evil\\u{1b}]0;pwned\\u{7}\\r\\nforged\\u{202e}\"  depth 1  running  (\\u{1b}[2Jchil)"
        );
    }
}
