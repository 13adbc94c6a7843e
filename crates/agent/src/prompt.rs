//! Prompt assembly contracts (spec §12): ordered sections and runtime contexts.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::ids::SessionId;

/// The global section name of the deployment persona (order 0). A scoped section with this name
/// replaces it for one agent.
pub const PERSONA_SECTION: &str = "deployment:persona";

/// The plugin name of runtime-context snapshot messages.
pub const PROMPT_PLUGIN: &str = "system-prompt";

/// One named, ordered piece of system text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptSection {
    /// Name; a scoped section shadows a global one of the same name for its agent.
    pub name: String,
    /// Sort key (ascending; ties by registration order). Bands: -100 identity, 0 persona,
    /// 100–199 tool guidance.
    pub order: i32,
    /// The text; persona text may contain `{{var}}` groups interpolated strictly.
    pub text: String,
    /// The tool this section is guidance for, if any. Such a section belongs only to the
    /// assemblies of agents that see that tool: an agent for which the tool is absent or
    /// restricted away gets nothing from it (see [`Prompt::sections`]), so guidance never
    /// recommends a tool the model cannot call.
    pub tool: Option<String>,
}

/// Renders a runtime context's text for one agent; `None` contributes nothing this time.
pub type ContextRenderer = Arc<dyn Fn(&SessionId) -> Option<String> + Send + Sync>;

/// One named, ordered contribution to the runtime-context snapshot (separate from system text).
#[derive(Clone)]
pub struct RuntimeContext {
    /// Name (appears in the snapshot's sections).
    pub name: String,
    /// Sort key (the subagent delegation statement uses 120; policy services 110 and 115).
    pub order: i32,
    /// Renders the text at each pre-step.
    pub render: ContextRenderer,
}

impl fmt::Debug for RuntimeContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeContext")
            .field("name", &self.name)
            .field("order", &self.order)
            .finish()
    }
}

impl RuntimeContext {
    /// A context that always renders the same text. A `&'static str` is kept as it is, not
    /// copied into each context (every delegated child registers the same statement).
    pub fn fixed(name: impl Into<String>, order: i32, text: impl Into<Cow<'static, str>>) -> Self {
        let text: Cow<'static, str> = text.into();
        Self {
            name: name.into(),
            order,
            render: Arc::new(move |_| Some(text.as_ref().to_owned())),
        }
    }
}

/// The prompt registry: global or scoped sections and runtime contexts.
///
/// # Contract
/// * Registrations return guards; dropping one, from any thread, removes the entry.
///   Registration cannot fail: two entries with one name in one layer are allowed and the
///   implementation picks one (the reference registry: the later).
/// * A scoped section shadows the global section of the same name for that agent only.
/// * A section bound to a tool ([`PromptSection::tool`]) is visible only where that tool is:
///   [`sections`](Prompt::sections) leaves it out for an agent that does not see the tool in
///   the host's tool registry ([`Tools::get`](crate::tools::Tools::get) answers `None`), and
///   an implementation that cannot tell leaves it out.
/// * Rendering (ordering, persona interpolation, snapshots) is the runtime's job. The driver
///   reads [`sections`](Prompt::sections) and [`runtime_contexts`](Prompt::runtime_contexts) at
///   every pre-step, on the agent's driver task and concurrently for many agents: both must be
///   quick and must not block.
/// * A [`ContextRenderer`] is called synchronously at each pre-step of each agent that sees it,
///   on that agent's driver task; it must not block. A panic in it ends that turn with an
///   `error`.
pub trait Prompt: Send + Sync + 'static {
    /// Registers a system-text section.
    fn section(&self, scope: Option<&SessionId>, section: PromptSection) -> crate::Registration;

    /// Registers a runtime-context contribution.
    fn runtime_context(&self, scope: Option<&SessionId>, context: RuntimeContext) -> crate::Registration;

    /// The sections `agent` sees (its own shadow global ones by name), sorted by ascending
    /// `order`, ties by registration order. `None` means the global view. Sections bound to a
    /// tool `agent` does not see are left out.
    fn sections(&self, agent: Option<&SessionId>) -> Vec<PromptSection>;

    /// The runtime contexts `agent` sees, sorted like [`Prompt::sections`].
    fn runtime_contexts(&self, agent: Option<&SessionId>) -> Vec<RuntimeContext>;
}
