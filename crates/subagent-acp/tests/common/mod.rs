//! The host shared by the ACP integration tests: the reference runtime (`agent-loop`) with a
//! parent agent whose session header carries a chosen `cwd`, a subagent service, and the
//! scripted mock ACP agent binary (spec §1.16) as the child.
//!
//! Every test ends with [`Host::finish`], which disposes the parent, waits for the service's
//! pending lifecycle emissions, shuts the runtime down and asserts quiescence.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agent::{
    AgentHandle, AgentRef, AgentRuntime, ContentBlock, CreateAgentOptions, SessionId, SessionMeta, Signal,
};
use agent_loop::runtime::{Runtime, RuntimeBuilder, assert_quiescent};
use subagent::provider::SubagentStartRequest;
use subagent::service::SubagentService;
use subagent_acp::AcpConfig;

/// The mock agent built with this crate.
pub const MOCK: &str = env!("CARGO_BIN_EXE_mock_acp_agent");

/// Upper bound for any wait on a real subprocess condition (cold start varies; this bounds a
/// hang, it is not a timing assertion).
pub const BOUND: Duration = Duration::from_secs(30);

pub struct Host {
    pub runtime: Runtime,
    pub service: SubagentService,
    pub parent_handle: Option<AgentHandle>,
    pub parent: AgentRef,
}

impl Host {
    /// A host whose parent session header has `cwd` (or none).
    pub async fn new(cwd: Option<&Path>) -> Self {
        let runtime = RuntimeBuilder::new().build();
        let handle = runtime
            .create(CreateAgentOptions {
                meta: SessionMeta {
                    cwd: cwd.map(Path::to_path_buf),
                    ..SessionMeta::default()
                },
                ..CreateAgentOptions::new(SessionId::from("parent"))
            })
            .await
            .expect("parent created");
        let parent = handle.agent().clone();
        Self {
            runtime,
            service: SubagentService::new(),
            parent_handle: Some(handle),
            parent,
        }
    }

    /// A request from the parent with the text prompt `child task` and a fresh signal.
    pub fn request(&self) -> SubagentStartRequest {
        self.request_with(Signal::new())
    }

    pub fn request_with(&self, signal: Signal) -> SubagentStartRequest {
        SubagentStartRequest::new(
            vec![ContentBlock::text("child task")],
            self.parent.clone(),
            signal,
        )
    }

    /// Disposes everything and asserts quiescence.
    pub async fn finish(mut self) {
        if let Some(parent) = self.parent_handle.take() {
            parent.dispose().await;
        }
        tokio::time::timeout(BOUND, self.service.close())
            .await
            .expect("service lifecycle emissions settle");
        self.runtime.shutdown().await;
        assert_eq!(self.service.pending_runs(), 0, "service tasks left");
        assert_eq!(AgentRuntime::list(&self.runtime).len(), 0, "agents left");
        assert_quiescent(&self.runtime);
    }
}

/// A config running the mock agent with the given `MOCK_*` script (explicit env).
pub fn mock_config(script: &[(&str, &str)]) -> AcpConfig {
    let mut config = AcpConfig::new(MOCK);
    for (k, v) in script {
        config.env.insert((*k).to_owned(), (*v).to_owned());
    }
    config
}

/// A scratch directory, removed on drop.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("scratch dir")
}

pub fn path_str(p: &Path) -> String {
    p.display().to_string()
}

/// Polls until `path` exists, within [`BOUND`] (a bounded condition wait, never a fixed sleep).
pub async fn wait_for(path: &Path) {
    let deadline = Instant::now() + BOUND;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether any process of the group led by `pid` is alive.
pub fn alive(pid: u32) -> bool {
    subagent_acp::process::group_alive(pid)
}

/// The visible text of blocks.
pub fn text(blocks: &[ContentBlock]) -> String {
    agent::content::visible_text(blocks)
}

pub fn canonical(p: impl AsRef<Path>) -> PathBuf {
    std::fs::canonicalize(p).expect("canonicalizable")
}

/// Whether process `pid` has ended: it is gone, or a zombie waiting to be reaped by whoever
/// adopted it (Linux: read from `/proc`).
#[cfg(target_os = "linux")]
pub fn process_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| matches!(state, 'Z' | 'X')),
    }
}

/// Polls (bounded by [`BOUND`], blocking the thread) until process `pid` has ended.
#[cfg(target_os = "linux")]
pub fn wait_ended(pid: u32, what: &str) {
    let deadline = Instant::now() + BOUND;
    while !process_ended(pid) {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
