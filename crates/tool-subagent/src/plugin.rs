//! [`SubagentToolPlugin`]: one loaded tool instance and its mount manager
//! (`acp-and-tools.md` §3.2, §3.3).
//!
//! The tool follows its provider's availability: it is registered (mounted) in the host's
//! **global** tool layer while a provider of the configured name is registered in the subagent
//! service, and unregistered when that provider is removed. There is no load-order dependency:
//! the manager subscribes to `subagent/provider-added` and `subagent/provider-removed`
//! *before* looking for the provider, mounts a provider already present at load, and mounts a
//! later one when it appears, deriving the wording from that exact provider object.
//!
//! The plugin owns every guard it makes (its two listeners, the tool, the guidance section).
//! [`unload`](SubagentToolPlugin::unload) (or dropping the plugin) drops them all and marks the
//! plugin unloaded first, so a notification already in delivery can never mount afterwards (no
//! "zombie mount").

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use subagent::SubagentError;
use subagent::agent::bus::{BoxError, panic_message};
use subagent::agent::prompt::PromptSection;
use subagent::agent::tools::ToolDefinition;
use subagent::agent::{Registration, Services};
use subagent::continuation::ContinuationManager;
use subagent::events::SubagentEvent;
use subagent::provider::SubagentProvider;
use subagent::service::SubagentService;
use tokio_util::task::TaskTracker;

use crate::config::{BackgroundMode, MaxDepth, SubagentToolConfig};
use crate::error::ToolSubagentError;
use crate::handler::{DelegationTool, Invocation};
use crate::model_text::{self, BackgroundExposure};

/// The plugin's name.
pub const PLUGIN_NAME: &str = "tool-subagent";

/// The host services the plugin requires: the tool registry, the subagent service and the
/// system prompt. The background job registry is optional and looked up per call.
pub const DEPENDENCIES: [&str; 3] = ["tools", "subagents", "systemPrompt"];

/// One loaded delegation tool instance: one provider, one tool name.
///
/// # Ownership and drop
/// The plugin owns its listeners and, while mounted, the tool's registration and (continuable
/// mode) its guidance section. Dropping the plugin is [`unload`](Self::unload). Calls already
/// running keep their runs: a foreground call still disposes its run, a background job belongs
/// to the job registry, a continuable start still finishes (accepted or rolled back), and every
/// continuable child belongs to the [`ContinuationManager`] the plugin was loaded with — never
/// to the plugin. [`shutdown`](Self::shutdown) additionally waits for the foreground runs and
/// continuable starts in flight.
pub struct SubagentToolPlugin {
    shared: Arc<Shared>,
}

impl fmt::Debug for SubagentToolPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubagentToolPlugin")
            .field("provider", &self.shared.invocation.config.provider)
            .field("tool_name", &self.shared.invocation.config.tool_name)
            .field("mounted", &self.is_mounted())
            .finish()
    }
}

/// State shared by the plugin handle and its listeners.
struct Shared {
    invocation: Arc<Invocation>,
    /// Protects the lifecycle: whether the plugin was unloaded, the mounted guard and the
    /// listener guards. Never held across an `.await`; guards are dropped after releasing it.
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    unloaded: bool,
    mounted: Option<Mount>,
    listeners: Vec<Registration>,
}

/// The tool as mounted over one provider object.
struct Mount {
    /// The exact provider the wording was derived from.
    provider: Arc<dyn SubagentProvider>,
    /// The tool and (continuable mode) the guidance section; dropping it unmounts.
    _registrations: Registration,
}

impl Mount {
    /// Whether this mount was made over exactly `provider` (the same object, not just the same
    /// name).
    fn is_over(&self, provider: &Arc<dyn SubagentProvider>) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.provider), Arc::as_ptr(provider))
    }
}

impl SubagentToolPlugin {
    /// Loads one instance over `services` and `subagents`.
    ///
    /// Validates `config` ([`SubagentToolConfig::validate`]), subscribes to provider events,
    /// then mounts the provider if it is already registered. A mount failure then fails the
    /// load (nothing stays registered). When the provider is absent the tool is simply absent
    /// until it appears (logged at info level); a mount failure at that later point is returned
    /// from the provider-added notification, which makes the service unwind that provider's
    /// registration. A panic in the provider's code read at mount (`name()`, `capabilities()`,
    /// `continuable()`, `inherits_parent_context()`) is such a mount failure
    /// ([`ToolSubagentError::Provider`]), never an unwind.
    ///
    /// An instance loaded this way has no continuation manager: in `backgroundMode: continuable`
    /// it mounts as usual (the foreground route works), but every call taking the continuable
    /// route fails with the seam's `CONTINUATION_UNAVAILABLE` error
    /// (`continuable subagents require the agents service`) and starts nothing. Use
    /// [`load_with_continuation`](Self::load_with_continuation) to serve that route.
    pub fn load(
        services: &Services,
        subagents: &SubagentService,
        config: SubagentToolConfig,
    ) -> Result<Self, ToolSubagentError> {
        Self::load_inner(services, subagents, None, config)
    }

    /// Loads one instance like [`load`](Self::load), whose continuable route (`acp-and-tools.md`
    /// §3.9) starts children through `continuation`.
    ///
    /// `continuation` should be the host's manager over the same subagent service and services,
    /// `ContinuationManager::new(subagents.clone(), services.clone())` (or `with_policy`): the
    /// manager looks the provider up in its own service and creates children through its own
    /// agents service, while this instance mounts and words the tool from `subagents`, so a
    /// manager over other services would start children with a provider the tool was not
    /// mounted over. It is used only by calls taking the continuable route
    /// (`backgroundMode: continuable` with `run_in_background` omitted or `true`); other modes
    /// never touch it.
    ///
    /// # What a continuable call guarantees
    /// * It answers `{kind: "continuable", subagentId}` rendered `started subagent <id>` once the
    ///   child's inbox accepted the prompt. No job is registered, and the tool keeps nothing of
    ///   the child afterwards (no handle, no result, no task).
    /// * A rejection surfaces as a tool error with the seam's code and message
    ///   (`PERSISTENCE_UNAVAILABLE`, `DRAINING`, `DUPLICATE_CHILD`, depth errors, …); nothing is
    ///   left behind.
    ///
    /// # Ownership
    /// The plugin keeps a clone of the manager; every child it starts belongs to the manager.
    /// Unloading or shutting the plugin down never stops a child: the host ends them with the
    /// manager (`dispose_all`, or the drains).
    ///
    /// # Cancellation
    /// The call's execution signal owns the start until the child accepts its prompt:
    /// cancelling it earlier makes the start reject (`CANCELLED`) and leaves no agent, no
    /// Activation and no persisted child, without affecting sibling starts; cancelling it later
    /// does not affect the child. A call whose future is dropped before the manager answered
    /// cancels its start the same way (reason
    /// [`START_ABANDONED_REASON`](model_text::START_ABANDONED_REASON)); the start still runs to
    /// its end — acceptance or full rollback — on a task [`shutdown`](Self::shutdown) waits for.
    pub fn load_with_continuation(
        services: &Services,
        subagents: &SubagentService,
        continuation: ContinuationManager,
        config: SubagentToolConfig,
    ) -> Result<Self, ToolSubagentError> {
        Self::load_inner(services, subagents, Some(continuation), config)
    }

    /// The loader both public entry points share.
    fn load_inner(
        services: &Services,
        subagents: &SubagentService,
        continuation: Option<ContinuationManager>,
        config: SubagentToolConfig,
    ) -> Result<Self, ToolSubagentError> {
        config.validate()?;
        let shared = Arc::new(Shared {
            invocation: Arc::new(Invocation {
                config,
                services: services.clone(),
                subagents: subagents.clone(),
                continuation,
                tracker: TaskTracker::new(),
                starts: TaskTracker::new(),
            }),
            slot: Mutex::new(Slot::default()),
        });
        let plugin = Self { shared };
        // Subscribe before checking presence, so no registry change is missed.
        let weak: Weak<Shared> = Arc::downgrade(&plugin.shared);
        let listener = subagents.events().on(move |event: &SubagentEvent| {
            let Some(shared) = weak.upgrade() else {
                return Ok(());
            };
            match event {
                SubagentEvent::ProviderAdded(provider) => {
                    shared.on_added(provider).map_err(|e| Box::new(e) as BoxError)
                }
                SubagentEvent::ProviderRemoved(name) => {
                    shared.on_removed(name);
                    Ok(())
                }
                _ => Ok(()),
            }
        });
        plugin.shared.slot.lock().listeners.push(listener);
        let config = &plugin.shared.invocation.config;
        match subagents.get_provider(&config.provider) {
            // On failure `plugin` is dropped, which unloads it.
            Some(provider) => plugin.shared.on_added(&provider)?,
            None => tracing::info!(
                "subagent provider \"{}\" not registered yet; the \"{}\" tool will register when it appears",
                config.provider,
                config.tool_name
            ),
        }
        Ok(plugin)
    }

    /// The configuration (validated).
    pub fn config(&self) -> &SubagentToolConfig {
        &self.shared.invocation.config
    }

    /// The model-facing tool name.
    pub fn tool_name(&self) -> &str {
        &self.shared.invocation.config.tool_name
    }

    /// Whether the tool is currently registered.
    pub fn is_mounted(&self) -> bool {
        self.shared.slot.lock().mounted.is_some()
    }

    /// Unmounts the tool and its guidance and stops listening; the plugin never mounts again.
    /// Idempotent. Providers are untouched.
    pub fn unload(&self) {
        let (mounted, listeners) = {
            let mut slot = self.shared.slot.lock();
            slot.unloaded = true;
            (slot.mounted.take(), std::mem::take(&mut slot.listeners))
        };
        drop(mounted);
        drop(listeners);
    }

    /// Unloads, then waits until every foreground run started through this instance has been
    /// disposed and every continuable start through it has ended (the child accepted its
    /// prompt, or the start rejected and rolled back). Continuable children themselves are the
    /// manager's and keep running.
    pub async fn shutdown(self) {
        self.unload();
        let invocation = &self.shared.invocation;
        for tracker in [&invocation.tracker, &invocation.starts] {
            tracker.close();
            tracker.wait().await;
        }
    }

    /// The number of foreground runs in flight (for tests asserting quiescence).
    pub fn foreground_runs(&self) -> usize {
        self.shared.invocation.tracker.len()
    }

    /// The number of continuable starts in flight: started by a call and not yet answered by
    /// the manager (for tests asserting quiescence). A start outlives its call only when the
    /// call was cancelled or dropped first, and then only until the manager answers.
    pub fn continuable_starts(&self) -> usize {
        self.shared.invocation.starts.len()
    }
}

/// spec: TOOL-28 — without the subagent service, no `subagent` tool is registered. Upstream the
/// plugin injects the service and never runs without it; here the service is a required
/// argument of [`SubagentToolPlugin::load`] and [`Services`] has no slot to find one in, so a
/// host without a subagent service cannot load the plugin, and so never registers its tool.
/// The two doctests pin that: the same load compiles with a service and does not compile
/// without one.
///
/// ```
/// use subagent::agent::Services;
/// use subagent::service::SubagentService;
/// use tool_subagent::{SubagentToolConfig, SubagentToolPlugin};
///
/// fn host(services: &Services, subagents: &SubagentService) {
///     let _plugin = SubagentToolPlugin::load(services, subagents, SubagentToolConfig::new("spawn"));
/// }
/// ```
///
/// ```compile_fail,E0061
/// use subagent::agent::Services;
/// use subagent::service::SubagentService;
/// use tool_subagent::{SubagentToolConfig, SubagentToolPlugin};
///
/// fn host(services: &Services) {
///     let _plugin = SubagentToolPlugin::load(services, SubagentToolConfig::new("spawn"));
/// }
/// ```
#[cfg(doctest)]
pub struct LoadingNeedsTheSubagentService;

impl Drop for SubagentToolPlugin {
    fn drop(&mut self) {
        self.unload();
    }
}

impl Shared {
    /// `subagent/provider-added`: mounts when the name matches, the plugin is loaded and the
    /// tool is not already mounted over this very provider object. A mount over another object
    /// of that name is replaced: that provider was removed, and its removal notice has not
    /// reached this plugin yet (a removal and a re-registration racing, or a re-registration
    /// made from inside the removal notice).
    fn on_added(&self, provider: &Arc<dyn SubagentProvider>) -> Result<(), ToolSubagentError> {
        if contained(None, "name()", || {
            provider.name() != self.invocation.config.provider
        })? {
            return Ok(());
        }
        let mut slot = self.slot.lock();
        if slot.unloaded || slot.mounted.as_ref().is_some_and(|m| m.is_over(provider)) {
            return Ok(());
        }
        // Read under the slot lock, which every mount and unmount holds: a notice that arrives
        // after its provider was removed again (a removal racing the registration) mounts
        // nothing — that removal's notice found nothing to unmount, or is still to come.
        let current = self
            .invocation
            .subagents
            .get_provider(&self.invocation.config.provider);
        if !current.is_some_and(|current| std::ptr::addr_eq(Arc::as_ptr(&current), Arc::as_ptr(provider))) {
            return Ok(());
        }
        // Unmount the predecessor first: the new tool registers under the same name.
        drop(slot.mounted.take());
        slot.mounted = Some(Mount {
            provider: provider.clone(),
            _registrations: self.mount(provider.as_ref())?,
        });
        Ok(())
    }

    /// `subagent/provider-removed`: unmounts when the name matches, unless the tool is mounted
    /// over the provider registered under that name *now* — then the notice is about its
    /// predecessor, whose replacement's `provider-added` already reached this plugin.
    fn on_removed(&self, name: &str) {
        if name != self.invocation.config.provider {
            return;
        }
        let stale = {
            let mut slot = self.slot.lock();
            // Read under the slot lock: a re-registration's mount cannot slip in between.
            let current = self.invocation.subagents.get_provider(name);
            match (&slot.mounted, &current) {
                (Some(mount), Some(current)) if mount.is_over(current) => None,
                _ => slot.mounted.take(),
            }
        };
        drop(stale);
    }

    /// The mount-time checks, then the registrations: the tool in the global layer and, in
    /// continuable mode with background enabled, the guidance section.
    fn mount(&self, provider: &dyn SubagentProvider) -> Result<Registration, ToolSubagentError> {
        let config = &self.invocation.config;
        // `on_added` matched the name: it is the configured one.
        let name = config.provider.as_str();
        let ask = |method: &str, call: &dyn Fn() -> bool| contained(Some(name), method, call);
        if matches!(config.max_depth, Some(MaxDepth::Cap(_)))
            && !ask("capabilities()", &|| provider.capabilities().depth_limit)?
        {
            return Err(ToolSubagentError::UnenforceableMaxDepth {
                provider: name.to_owned(),
            });
        }
        if config.background_mode == BackgroundMode::Continuable
            && !ask("continuable()", &|| provider.continuable().is_some())?
        {
            return Err(ToolSubagentError::ContinuableUnsupported {
                provider: name.to_owned(),
            });
        }
        let exposure = config.exposure();
        let inherits = ask("inherits_parent_context()", &|| {
            provider.inherits_parent_context()
        })?;
        let services = &self.invocation.services;
        let tool = services.tools.register(
            None,
            ToolDefinition {
                name: config.tool_name.clone(),
                description: model_text::tool_description(inherits, exposure),
                parameters: model_text::tool_parameters(inherits, exposure),
                // Children never mutate the parent session; the one parent-owned write (a job
                // registration) is a synchronous, commutative insert.
                concurrency_safe: true,
                handler: Arc::new(DelegationTool {
                    invocation: self.invocation.clone(),
                }),
            },
        )?;
        let mut guards = vec![tool];
        if exposure == BackgroundExposure::Continuable {
            guards.push(services.prompt.section(
                None,
                PromptSection {
                    name: model_text::guidance_section_name(&config.tool_name),
                    order: model_text::GUIDANCE_ORDER,
                    text: model_text::guidance(&config.tool_name),
                    // Guidance only for agents that see the tool: a child whose tool filter
                    // denies it sees neither schema nor guidance.
                    tool: Some(config.tool_name.clone()),
                },
            ));
        }
        Ok(Registration::all(guards))
    }
}

/// Calls provider code with its panic contained: a panic in `call` becomes
/// [`ToolSubagentError::Provider`] with the seam's `PROVIDER_FAILED` error naming `provider`
/// (when known), `method` and the panic, so a misbehaving provider fails the mount instead of
/// unwinding through the host's load or the service's registration.
fn contained<T>(
    provider: Option<&str>,
    method: &str,
    call: impl FnOnce() -> T,
) -> Result<T, ToolSubagentError> {
    catch_unwind(AssertUnwindSafe(call)).map_err(|payload| {
        ToolSubagentError::Provider(SubagentError::provider_panicked(
            provider,
            method,
            &panic_message(&*payload),
        ))
    })
}
