//! What both benchmark targets (and `examples/spawn_profile.rs`) share: the instant model, the host (one reference runtime, one
//! parent, the `spawn` provider registered on a service) and one delegation's start request.

use std::sync::Arc;

use agent::{
    AgentOptions, AgentRuntime, ContentBlock, CreateAgentOptions, GenerateOptions, ModelAdapter, ModelStream,
    SessionId, Signal,
};
use agent_loop::model::chunks;
use agent_loop::runtime::Runtime;
use futures::StreamExt;
use subagent::provider::SubagentStartRequest;
use subagent::service::SubagentService;
use subagent_inprocess::InProcessDriver;

/// A model that answers every call at once with one short text.
pub struct InstantModel;

impl ModelAdapter for InstantModel {
    fn stream(&self, _: Arc<GenerateOptions>) -> ModelStream {
        futures::stream::iter(chunks::text("done").into_iter().map(Ok)).boxed()
    }
}

/// A host with one parent agent and the `spawn` provider registered.
pub struct Bench {
    pub runtime: Runtime,
    pub service: SubagentService,
    pub parent: agent::AgentRef,
    _parent_handle: agent::AgentHandle,
    _provider: agent::Registration,
}

/// A reference runtime whose only model is the instant one.
pub fn instant_runtime() -> Runtime {
    Runtime::builder()
        .model("instant", Arc::new(InstantModel))
        .build()
}

/// Options creating agent `id` on the instant model.
pub fn instant_agent(id: SessionId) -> CreateAgentOptions {
    CreateAgentOptions {
        agent_options: AgentOptions {
            provider: Some("instant".into()),
            model: Some("instant".into()),
            ..AgentOptions::default()
        },
        ..CreateAgentOptions::new(id)
    }
}

impl Bench {
    /// Builds the host on the current tokio runtime.
    pub async fn new() -> Self {
        let runtime = instant_runtime();
        let parent_handle = runtime
            .create(instant_agent(SessionId::from("parent")))
            .await
            .expect("parent");
        let service = SubagentService::new();
        let driver = InProcessDriver::new(runtime.services().clone());
        let provider = subagent_spawn::register(&service, driver).expect("registered");
        Self {
            parent: parent_handle.agent().clone(),
            runtime,
            service,
            _parent_handle: parent_handle,
            _provider: provider,
        }
    }

    /// One delegation's start request: a one-word task from the parent, never cancelled.
    pub fn request(&self) -> SubagentStartRequest {
        SubagentStartRequest::new(
            vec![ContentBlock::text("task")],
            self.parent.clone(),
            Signal::new(),
        )
    }

    /// One one-shot delegation: start → result (asserted `completed`) → dispose.
    #[allow(dead_code)] // used by `benches/spawn.rs` and the profiling example, not the fan-out
    pub async fn delegate_once(&self) -> subagent::result::SubagentResult {
        let run = self
            .service
            .start("spawn", self.request())
            .await
            .expect("started");
        let result = run.result().await.expect("result");
        assert!(result.stop_reason.is_completed());
        run.dispose().await.expect("disposed");
        result
    }

    /// What a delegation costs the reference runtime alone, without the seam: create agent `id`
    /// on the instant model, give it the task, wait for its one turn, dispose of it.
    #[allow(dead_code)] // used by `benches/spawn.rs` and the profiling example, not the fan-out
    pub async fn bare_cycle(&self, id: SessionId) {
        let handle = self.runtime.create(instant_agent(id)).await.expect("child");
        handle
            .agent()
            .followup(agent::Message::user_text("task"))
            .expect("accepted");
        handle.agent().when_idle().await;
        handle.dispose().await;
    }

    /// Number of live agents on the runtime (the parent counts as one).
    pub fn live_agents(&self) -> usize {
        AgentRuntime::list(&self.runtime).len()
    }

    /// Closes the service and shuts the runtime down.
    pub async fn close(self) {
        self.service.close().await;
        self.runtime.shutdown().await;
    }
}
