//! Configuration at mount, registration lifecycle, schema and wording through the real tool
//! registry (`acp-and-tools.md` §3.2–§3.4).

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use common::{FakeProvider, Host, text};
use serde_json::{Value, json};
use subagent::agent::tools::ToolRegistryError;
use tool_subagent::{
    BackgroundMode, DEPENDENCIES, PLUGIN_NAME, SubagentToolConfig, SubagentToolPlugin, ToolSubagentError,
};

fn property_names(parameters: &Value) -> Vec<String> {
    let mut names: Vec<String> = parameters["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    names.sort();
    names
}

fn guidance_sections(host: &Host) -> Vec<(String, String)> {
    host.services()
        .prompt
        .sections(None)
        .into_iter()
        .filter(|s| s.name.starts_with("tool:subagent"))
        .map(|s| (s.name, s.text))
        .collect()
}

fn reply(name: &str, text: &str) -> FakeProvider {
    FakeProvider::replying(name, text, Arc::new(AtomicUsize::new(0)))
}

/// spec: TOOL-1 — continuable mode over a provider without continuable preparation fails load.
#[tokio::test(start_paused = true)]
async fn tool_1_continuable_mode_needs_continuable_preparation() {
    let host = Host::new();
    let _p = host.provider(reply("mock", "hi"));
    let mut config = SubagentToolConfig::new("mock");
    config.background_mode = BackgroundMode::Continuable;
    let error = SubagentToolPlugin::load(host.services(), &host.subagents, config.clone())
        .expect_err("continuable mode is refused");
    assert!(matches!(error, ToolSubagentError::ContinuableUnsupported { .. }));
    assert!(
        error
            .to_string()
            .contains("provider \"mock\" does not support `backgroundMode: continuable`"),
        "{error}"
    );
    assert!(
        !host.has_tool("subagent"),
        "a failed load leaves nothing registered"
    );
    assert_eq!(host.subagents.events().listener_count(), 0);
    // The same configuration mounts over a provider that can prepare continuable children.
    let _c = host.provider(reply("resumable", "hi").with_continuable());
    config.provider = "resumable".into();
    let plugin = host.load(config);
    assert!(plugin.is_mounted());
    host.close().await;
}

/// spec: TOOL-3 — the one-shot default schema has exactly `description`, `prompt`,
/// `run_in_background` (no provider selector, no mode), and the description mentions
/// `job_output`.
#[tokio::test(start_paused = true)]
async fn tool_3_one_shot_schema() {
    let host = Host::new();
    let _p = host.provider(reply("mock", "hi"));
    let _tool = host.load_json(json!({"provider": "mock"}));
    assert_eq!(
        property_names(&host.parameters("subagent")),
        ["description", "prompt", "run_in_background"]
    );
    assert_eq!(
        host.parameters("subagent")["required"],
        json!(["description", "prompt"])
    );
    assert!(host.description("subagent").contains("job_output"));
    host.close().await;
}

/// spec: TOOL-4 — with background disabled the schema has only `description` and `prompt` and
/// the description does not mention `job_output`.
#[tokio::test(start_paused = true)]
async fn tool_4_disabled_background_schema() {
    let host = Host::new();
    let _p = host.provider(reply("mock", "hi"));
    let _tool = host.load_json(json!({"provider": "mock", "enableRunInBackground": false}));
    assert_eq!(
        property_names(&host.parameters("subagent")),
        ["description", "prompt"]
    );
    assert!(!host.description("subagent").contains("job_output"));
    assert!(
        host.description("subagent")
            .ends_with(" This call waits for the subagent and returns its result.")
    );
    host.close().await;
}

/// spec: TOOL-6 — the tool is classified parallel-safe for every route (one definition serves
/// foreground and background calls).
#[tokio::test(start_paused = true)]
async fn tool_6_parallel_safe() {
    let host = Host::new();
    let _p = host.provider(reply("mock", "hi"));
    let _tool = host.load_json(json!({"provider": "mock"}));
    let definition = host.services().tools.get("subagent", None).expect("mounted");
    assert!(definition.concurrency_safe);
    host.close().await;
}

/// spec: TOOL-10 — two instances (`subagent` → spawn, `subagent_acp` → acp) coexist and each
/// routes to its own provider.
#[tokio::test(start_paused = true)]
async fn tool_10_two_instances_route_to_their_own_providers() {
    let mut host = Host::new();
    let _spawn = host.provider(reply("spawn", "from spawn"));
    let _acp = host.provider(reply("acp", "from acp").capability_less());
    let _a = host.load_json(json!({"provider": "spawn", "toolName": "subagent"}));
    let _b = host
        .load_json(json!({"provider": "acp", "toolName": "subagent_acp", "maxDepth": "provider-managed"}));
    let mut names: Vec<String> = host
        .services()
        .tools
        .schemas(None)
        .into_iter()
        .map(|s| s.name)
        .filter(|n| n.starts_with("subagent"))
        .collect();
    names.sort();
    assert_eq!(names, ["subagent", "subagent_acp"]);
    let parent = host.parent("parent").await;
    let args = json!({"description": "d", "prompt": "p"});
    assert_eq!(
        text(&host.call("subagent", &parent, args.clone()).await),
        "from spawn"
    );
    assert_eq!(text(&host.call("subagent_acp", &parent, args).await), "from acp");
    host.close().await;
}

/// spec: TOOL-13 — direct application with only `provider` registers `subagent` and sends no
/// `agentOptions` (and no depth cap).
#[tokio::test(start_paused = true)]
async fn tool_13_direct_application_defaults() {
    let mut host = Host::new();
    let provider = reply("bare", "ok").capability_less();
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let plugin = host.load(SubagentToolConfig::new("bare"));
    assert_eq!(plugin.tool_name(), "subagent");
    assert!(host.has_tool("subagent"));
    let parent = host.parent("parent").await;
    let result = host
        .call("subagent", &parent, json!({"description": "d", "prompt": "p"}))
        .await;
    assert!(!result.is_error, "{}", text(&result));
    let seen = requests.lock().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].request.agent_options.is_none());
    assert!(seen[0].request.max_depth.is_none());
    host.close().await;
}

/// spec: TOOL-15 — a provider registered after the tool: the tool is absent, then appears and
/// works.
#[tokio::test(start_paused = true)]
async fn tool_15_provider_after_tool() {
    let mut host = Host::new();
    let plugin = host.load(SubagentToolConfig::new("mock"));
    assert!(!plugin.is_mounted());
    assert!(!host.has_tool("subagent"));
    let _p = host.provider(reply("mock", "late but fine"));
    assert!(plugin.is_mounted());
    assert!(host.has_tool("subagent"));
    let parent = host.parent("parent").await;
    let result = host
        .call("subagent", &parent, json!({"description": "d", "prompt": "p"}))
        .await;
    assert_eq!(text(&result), "late but fine");
    host.close().await;
}

/// spec: TOOL-16 — in continuable mode the guidance is absent (empty) while the provider is
/// absent, and so is the schema; both appear with the provider.
#[tokio::test(start_paused = true)]
async fn tool_16_continuable_guidance_follows_the_provider() {
    let host = Host::new();
    let _tool = host.load_json(json!({
        "provider": "later-continuable",
        "backgroundMode": "continuable",
        "maxDepth": "provider-managed",
    }));
    assert!(guidance_sections(&host).is_empty());
    assert!(!host.has_tool("subagent"));
    let provider = host.provider(reply("later-continuable", "hi").with_continuable());
    let sections = guidance_sections(&host);
    assert_eq!(sections.len(), 1);
    assert_eq!(sections[0].0, "tool:subagent");
    assert!(
        sections[0]
            .1
            .contains("Use subagent in the background by default")
    );
    assert!(host.has_tool("subagent"));
    drop(provider);
    assert!(guidance_sections(&host).is_empty());
    assert!(!host.has_tool("subagent"));
    host.close().await;
}

/// spec: TOOL-17 — removing the provider removes the tool; re-registering it with
/// `inheritsParentContext: true` re-derives the `inherits this conversation` wording.
#[tokio::test(start_paused = true)]
async fn tool_17_provider_lifecycle_rederives_wording() {
    let host = Host::new();
    let backend = host.provider(reply("mock", "hi"));
    let plugin = host.load_json(json!({"provider": "mock"}));
    assert!(
        host.description("subagent")
            .contains("does not see this conversation")
    );
    drop(backend);
    assert!(!host.has_tool("subagent"));
    assert!(!plugin.is_mounted());
    let _again = host.provider(reply("mock", "hi").inheriting(true));
    assert!(plugin.is_mounted());
    let description = host.description("subagent");
    assert!(description.contains("inherits this conversation"));
    assert!(!description.contains("does not see this conversation"));
    host.close().await;
}

/// spec: TOOL-18 — unloading the plugin removes the tool and its guidance section but not the
/// provider; a plugin unloaded while waiting never mounts later.
#[tokio::test(start_paused = true)]
async fn tool_18_unload_unmounts_and_never_zombie_mounts() {
    let host = Host::new();
    let _provider = host.provider(reply("continuable", "hi").with_continuable());
    let mounted = host.load_json(json!({
        "provider": "continuable",
        "backgroundMode": "continuable",
        "maxDepth": "provider-managed",
    }));
    assert!(host.has_tool("subagent"));
    assert_eq!(guidance_sections(&host).len(), 1);
    mounted.unload();
    assert!(!host.has_tool("subagent"));
    assert!(guidance_sections(&host).is_empty());
    assert!(host.subagents.get_provider("continuable").is_some());
    drop(mounted);

    let listeners = host.subagents.events().listener_count();
    let waiting = host.load_json(json!({"provider": "later", "toolName": "subagent_later"}));
    assert_eq!(host.subagents.events().listener_count(), listeners + 1);
    waiting.shutdown().await;
    assert_eq!(host.subagents.events().listener_count(), listeners);
    let _later = host.provider(reply("later", "hi"));
    assert!(!host.has_tool("subagent_later"));
    host.close().await;
}

/// spec: TOOL-19 — registering and removing a differently named provider leaves the tool and
/// its wording untouched.
#[tokio::test(start_paused = true)]
async fn tool_19_other_providers_are_ignored() {
    let host = Host::new();
    let _mock = host.provider(reply("mock", "hi"));
    let plugin = host.load_json(json!({"provider": "mock"}));
    let before = host.description("subagent");
    let other = host.provider(reply("other", "hi").inheriting(true));
    assert!(plugin.is_mounted());
    assert_eq!(host.description("subagent"), before);
    assert!(before.contains("does not see this conversation"));
    drop(other);
    assert!(plugin.is_mounted());
    assert!(host.has_tool("subagent"));
    assert_eq!(host.description("subagent"), before);
    host.close().await;
}

/// spec: TOOL-20 — a fresh-context provider yields `does not see this conversation` and a
/// prompt parameter asking for everything the child needs.
#[tokio::test(start_paused = true)]
async fn tool_20_fresh_wording_through_the_registry() {
    let host = Host::new();
    let _p = host.provider(reply("mock", "hi"));
    let _tool = host.load_json(json!({"provider": "mock"}));
    assert!(
        host.description("subagent")
            .contains("does not see this conversation")
    );
    let prompt = host.parameters("subagent")["properties"]["prompt"]["description"].clone();
    assert!(
        prompt
            .as_str()
            .unwrap_or("")
            .contains("include everything it needs")
    );
    host.close().await;
}

/// spec: TOOL-21 — an inheriting provider yields `inherits this conversation`, never `does not
/// see this conversation`, and a prompt parameter mentioning completed turns.
#[tokio::test(start_paused = true)]
async fn tool_21_inheriting_wording_through_the_registry() {
    let host = Host::new();
    let _p = host.provider(reply("mock", "hi").inheriting(true));
    let _tool = host.load_json(json!({"provider": "mock", "toolName": "subagent"}));
    let description = host.description("subagent");
    assert!(description.contains("inherits this conversation"));
    assert!(!description.contains("does not see this conversation"));
    let prompt = host.parameters("subagent")["properties"]["prompt"]["description"].clone();
    assert!(prompt.as_str().unwrap_or("").contains("completed turns"));
    host.close().await;
}

/// spec: TOOL-29 — the plugin's name and its required services.
#[test]
fn tool_29_plugin_shape() {
    assert_eq!(PLUGIN_NAME, "tool-subagent");
    assert_eq!(DEPENDENCIES, ["tools", "subagents", "systemPrompt"]);
}

/// spec: TOOL-53 — a numeric `maxDepth` over a provider without `depthLimit` fails the load when
/// the provider is present, and fails (unwinding) the provider's registration when it arrives
/// later; the message points at `provider-managed`.
#[tokio::test(start_paused = true)]
async fn tool_53_numeric_cap_needs_depth_limit() {
    let host = Host::new();
    let present = host.provider(reply("acp", "hi").capability_less());
    let error = SubagentToolPlugin::load(
        host.services(),
        &host.subagents,
        SubagentToolConfig::from_json(&json!({"provider": "acp"})).expect("valid"),
    )
    .expect_err("a numeric cap cannot be enforced");
    assert_eq!(
        error.to_string(),
        "tool-subagent: provider \"acp\" cannot enforce maxDepth (no depthLimit capability) — set maxDepth: \
         'provider-managed' to leave the recursion budget to the provider"
    );
    assert!(!host.has_tool("subagent"));
    drop(present);

    let waiting = host.load_json(json!({"provider": "acp", "maxDepth": 0}));
    let refused = host
        .subagents
        .register_provider(Arc::new(reply("acp", "hi").capability_less()))
        .expect_err("the mount failure unwinds the provider's registration");
    assert!(refused.to_string().contains("provider-managed"), "{refused}");
    assert!(host.subagents.get_provider("acp").is_none());
    assert!(!waiting.is_mounted());
    // A provider that can enforce the cap mounts.
    let _ok = host.provider(reply("acp", "hi"));
    assert!(waiting.is_mounted());
    host.close().await;
}

/// spec: TOOL-53 — a later tool refusing a provider at mount unwinds its registration, and the
/// earlier tool that had mounted over it unmounts with it: no tool stays visible for a provider
/// that is not registered.
#[tokio::test(start_paused = true)]
async fn a_refused_registration_unmounts_the_tools_that_mounted_over_it() {
    let host = Host::new();
    let managed = host
        .load_json(json!({"provider": "acp", "maxDepth": "provider-managed", "toolName": "subagent_acp"}));
    let capped = host.load_json(json!({"provider": "acp", "maxDepth": 3, "toolName": "subagent_strict"}));
    let refused = host
        .subagents
        .register_provider(Arc::new(reply("acp", "hi").capability_less()))
        .expect_err("the capped tool refuses a capability-less provider");
    assert!(refused.to_string().contains("provider-managed"), "{refused}");
    assert!(host.subagents.get_provider("acp").is_none());
    assert!(!capped.is_mounted());
    assert!(
        !managed.is_mounted(),
        "the managed tool unmounted with the provider"
    );
    assert!(!host.has_tool("subagent_acp"));
    // A provider both can use mounts both.
    let _ok = host.provider(reply("acp", "hi"));
    assert!(managed.is_mounted() && capped.is_mounted());
    assert!(host.has_tool("subagent_acp") && host.has_tool("subagent_strict"));
    host.close().await;
}

/// A `provider-added` notice that reaches the tool after its provider was removed again (a
/// removal racing the registration: the removal's notice found nothing to unmount) mounts
/// nothing, so no tool is left over a provider that is not registered.
#[tokio::test(start_paused = true)]
async fn a_late_added_notice_for_a_removed_provider_mounts_nothing() {
    let host = Host::new();
    let tool = host.load_json(json!({"provider": "acp", "maxDepth": "provider-managed"}));
    let gone: Arc<dyn subagent::provider::SubagentProvider> = Arc::new(reply("acp", "hi"));
    host.subagents
        .events()
        .emit(&subagent::events::SubagentEvent::ProviderAdded(gone));
    assert!(!tool.is_mounted());
    assert!(!host.has_tool("subagent"));
    host.close().await;
}

/// spec: TOOL-54 — `provider-managed` mounts over a capability-less provider and sends no
/// `maxDepth`.
#[tokio::test(start_paused = true)]
async fn tool_54_provider_managed_sends_no_cap() {
    let mut host = Host::new();
    let provider = reply("acp", "ok").capability_less();
    let requests = provider.requests.clone();
    let _p = host.provider(provider);
    let _tool = host.load_json(json!({"provider": "acp", "maxDepth": "provider-managed"}));
    assert!(host.has_tool("subagent"));
    let parent = host.parent("parent").await;
    let result = host
        .call("subagent", &parent, json!({"description": "d", "prompt": "p"}))
        .await;
    assert!(!result.is_error, "{}", text(&result));
    assert_eq!(requests.lock()[0].request.max_depth, None);
    assert_eq!(requests.lock()[0].max_depth, None);
    host.close().await;
}

/// Two instances with the same tool name: the registry refuses the second mount.
#[tokio::test(start_paused = true)]
async fn duplicate_tool_names_are_refused_at_mount() {
    let host = Host::new();
    let _a = host.provider(reply("a", "hi"));
    let _b = host.provider(reply("b", "hi"));
    let _first = host.load_json(json!({"provider": "a"}));
    let error = SubagentToolPlugin::load(
        host.services(),
        &host.subagents,
        SubagentToolConfig::from_json(&json!({"provider": "b"})).expect("valid"),
    )
    .expect_err("duplicate name");
    assert!(matches!(error, ToolSubagentError::Register(_)));
    assert_eq!(
        error.to_string(),
        "tool \"subagent\" is already registered in this layer"
    );
    host.close().await;
}

/// A `toolName` no model could call (whitespace only, or with whitespace inside) passes the
/// config's non-empty check but is refused at mount by the registry, with a typed error and
/// nothing mounted (neither the tool nor its guidance).
#[tokio::test(start_paused = true)]
async fn uncallable_tool_names_are_refused_at_mount() {
    let host = Host::new();
    let _p = host.provider(reply("spawn", "hi").with_continuable());
    let tools_before = host.services().tools.schemas(None).len();
    let guidance_before = guidance_sections(&host);
    for name in ["   ", "ask agent"] {
        let config = json!({"provider": "spawn", "toolName": name, "backgroundMode": "continuable"});
        let error = SubagentToolPlugin::load(
            host.services(),
            &host.subagents,
            SubagentToolConfig::from_json(&config).expect("passes the config check"),
        )
        .expect_err("refused at mount");
        assert!(
            matches!(&error, ToolSubagentError::Register(ToolRegistryError::InvalidName(n)) if n == name),
            "{error}"
        );
        assert!(!host.has_tool(name));
    }
    assert_eq!(
        host.services().tools.schemas(None).len(),
        tools_before,
        "no tool mounted"
    );
    assert_eq!(guidance_sections(&host), guidance_before, "no guidance mounted");
    host.close().await;
}

/// spec: TOOL-45 — in continuable mode the tool is classified parallel-safe too.
#[tokio::test(start_paused = true)]
async fn tool_45_continuable_mode_is_parallel_safe() {
    let host = Host::new();
    let _p = host.provider(reply("spawn", "hi").with_continuable());
    let _tool = host.load_json(json!({"provider": "spawn", "backgroundMode": "continuable"}));
    let definition = host.services().tools.get("subagent", None).expect("mounted");
    assert!(definition.concurrency_safe);
    host.close().await;
}

/// A third-party provider whose descriptive methods panic (`wild` names the one that does).
struct WildProvider {
    panics_in: &'static str,
}

impl WildProvider {
    fn check(&self, method: &str) {
        if self.panics_in == method {
            panic!("{method} exploded");
        }
    }
}

#[async_trait::async_trait]
impl subagent::provider::SubagentProvider for WildProvider {
    fn name(&self) -> &str {
        "wild"
    }

    fn capabilities(&self) -> subagent::SubagentCapabilities {
        self.check("capabilities()");
        subagent::SubagentCapabilities::ALL
    }

    fn inherits_parent_context(&self) -> bool {
        self.check("inherits_parent_context()");
        false
    }

    async fn start(
        &self,
        _request: subagent::provider::ResolvedSubagentStartRequest,
    ) -> Result<Box<dyn subagent::run::SubagentRun>, subagent::SubagentError> {
        Err(subagent::SubagentError::continuation_unavailable())
    }

    fn continuable(&self) -> Option<&dyn subagent::provider::PrepareContinuable> {
        self.check("continuable()");
        None
    }
}

/// A provider whose `capabilities()`, `continuable()` or `inherits_parent_context()` panics
/// while the tool mounts over it does not unwind through the host: present at load, the load
/// fails with a typed `PROVIDER_FAILED` error naming the provider, the method and the panic;
/// arriving later, its registration is refused with that message. Either way no tool is
/// registered, and the waiting plugin still mounts over a well-behaved provider of that name.
#[tokio::test(start_paused = true)]
async fn a_panicking_provider_fails_the_mount_with_a_typed_error() {
    for (method, config) in [
        ("capabilities()", json!({"provider": "wild", "maxDepth": 2})),
        (
            "continuable()",
            json!({"provider": "wild", "backgroundMode": "continuable", "maxDepth": "provider-managed"}),
        ),
        ("inherits_parent_context()", json!({"provider": "wild"})),
    ] {
        let message = format!("subagent provider \"wild\" panicked in {method}: {method} exploded");
        let host = Host::new();
        let config = SubagentToolConfig::from_json(&config).expect("valid");
        let present = host
            .subagents
            .register_provider(Arc::new(WildProvider { panics_in: method }))
            .expect("registration reads only the name");
        let loaded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            SubagentToolPlugin::load(host.services(), &host.subagents, config.clone())
        }));
        let error = loaded
            .unwrap_or_else(|_| panic!("{method}: the provider's panic unwound out of load"))
            .expect_err("the mount fails");
        assert!(
            matches!(&error, ToolSubagentError::Provider(e) if e.code() == subagent::SubagentErrorCode::ProviderFailed),
            "{method}: {error:?}"
        );
        assert_eq!(error.to_string(), message, "{method}");
        assert!(!host.has_tool("subagent"), "{method}");
        drop(present);

        let waiting = host.load(config);
        let refused = host
            .subagents
            .register_provider(Arc::new(WildProvider { panics_in: method }))
            .expect_err("the mount failure unwinds the provider's registration");
        assert!(refused.to_string().contains(&message), "{method}: {refused}");
        assert!(host.subagents.get_provider("wild").is_none(), "{method}");
        assert!(!waiting.is_mounted(), "{method}");
        if method != "continuable()" {
            // (This provider has no continuable preparation, so only the other configurations
            // can mount over it.)
            let _fine = host
                .subagents
                .register_provider(Arc::new(WildProvider { panics_in: "" }))
                .expect("a well-behaved provider mounts");
            assert!(waiting.is_mounted(), "{method}");
        }
        host.close().await;
    }
}

/// A provider replaced under the same name while its removal is still being announced stays
/// served: here a supervisor that heard `provider-removed` first re-registers a fresh provider
/// from inside the notification — the order in which the plugin hears of a removal and a
/// re-registration racing on two threads. The tool ends mounted over the replacement, with
/// wording derived from it, and routes to it.
#[tokio::test(start_paused = true)]
async fn a_provider_replaced_during_its_removal_stays_mounted() {
    let mut host = Host::new();
    let replacement = Arc::new(parking_lot::Mutex::new(None::<agent::Registration>));
    let (subagents, slot) = (host.subagents.clone(), replacement.clone());
    let supervisor = host.subagents.events().on(move |event| {
        if let subagent::events::SubagentEvent::ProviderRemoved(name) = event
            && name == "mock"
            && slot.lock().is_none()
        {
            let guard = subagents
                .register_provider(Arc::new(reply("mock", "from the replacement").inheriting(true)))
                .map_err(|e| Box::new(e) as agent::bus::BoxError)?;
            *slot.lock() = Some(guard);
        }
        Ok(())
    });
    let original = host.provider(reply("mock", "from the original"));
    let plugin = host.load_json(json!({"provider": "mock"}));
    assert!(plugin.is_mounted());
    drop(original);
    assert!(
        replacement.lock().is_some(),
        "the supervisor re-registered the provider"
    );
    assert!(host.subagents.get_provider("mock").is_some());
    assert!(
        plugin.is_mounted() && host.has_tool("subagent"),
        "a provider of the configured name is registered, so the tool must be mounted"
    );
    assert!(
        host.description("subagent")
            .contains("inherits this conversation")
    );
    let parent = host.parent("parent").await;
    let outcome = host
        .call("subagent", &parent, json!({"description": "d", "prompt": "p"}))
        .await;
    assert_eq!(text(&outcome), "from the replacement");
    drop(supervisor);
    drop(replacement.lock().take());
    assert!(!plugin.is_mounted());
    host.close().await;
}

/// spec: TOOL-47 — the continuable guidance is empty for an agent whose tool restriction hides
/// the tool: the agent that cannot see `subagent` gets no `tool:subagent` section, while an
/// unrestricted agent of the same host (and the global view) still gets the guidance, and lifting
/// the restriction brings it back.
#[tokio::test(start_paused = true)]
async fn tool_47_guidance_is_empty_where_a_restriction_hides_the_tool() {
    let mut host = Host::new();
    let _p = host.provider(reply("spawn", "hi").with_continuable());
    let _tool = host.load_json(json!({"provider": "spawn", "backgroundMode": "continuable"}));
    let restricted = host.parent("restricted").await;
    let open = host.parent("open").await;
    let guidance_for = |agent: &agent::SessionId| -> Vec<String> {
        host.services()
            .prompt
            .sections(Some(agent))
            .into_iter()
            .filter(|s| s.name == "tool:subagent")
            .map(|s| s.text)
            .filter(|text| !text.is_empty())
            .collect()
    };
    let restriction = host
        .services()
        .tools
        .restrict(
            Some(&restricted),
            agent::tools::ToolRestriction {
                allow: None,
                deny: Some(vec!["subagent".to_owned()]),
            },
        )
        .expect("the restriction applies");
    assert!(host.services().tools.get("subagent", Some(&restricted)).is_none());
    assert!(host.services().tools.get("subagent", Some(&open)).is_some());
    assert_eq!(guidance_for(&restricted), Vec::<String>::new());
    let open_guidance = guidance_for(&open);
    assert_eq!(open_guidance.len(), 1);
    assert!(open_guidance[0].contains("Use subagent in the background by default"));
    assert_eq!(guidance_sections(&host).len(), 1, "the global view still has it");
    drop(restriction);
    assert_eq!(guidance_for(&restricted), open_guidance);
    host.close().await;
}
