//! Installing and revoking the report tool (`acp-and-tools.md` §5.1, checklist REP-13..21):
//! the package's setup contribution through the seam's continuation manager, and the
//! installer body on its own over a real child's scope.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use agent::model::ToolSchema;
use agent::prompt::{Prompt, PromptSection, RuntimeContext};
use agent::tools::{
    ExecutedTool, PostExecutePolicy, PreExecutePolicy, ToolCallRequest, ToolDefinition, ToolGuard,
    ToolRegistryError, ToolRestriction, ToolResultObserver, Tools,
};
use agent::{Ctx, Registration, Services, SessionId, Signal};
use agent_loop::runtime::SessionStoreEvent;
use async_trait::async_trait;
use common::*;
use parking_lot::Mutex;
use serde_json::json;
use subagent::SubagentErrorCode;
use subagent::continuation::{ReportDelivery, SetupRelease};
use tool_subagent_report::{
    DEPENDENCIES, InstalledPart, PLUGIN_NAME, ReportToolConfig, ReportToolPlugin, SETUP_KEY,
    ToolSubagentReportError, install_report_tool, model_text,
};

fn quiet() -> Option<ReportToolConfig> {
    Some(ReportToolConfig::new(ReportDelivery::Quiet))
}

fn has_report(rig: &Rig, agent: &str) -> bool {
    rig.tool_names(Some(agent)).contains(&"report".to_owned())
}

fn has_guidance(rig: &Rig, agent: &str) -> bool {
    rig.section_names(Some(agent)).contains(&"tool:report".to_owned())
}

/// A conflicting `report` in `agent`'s own layer.
fn conflicting_report(rig: &Rig, agent: &str) -> Registration {
    rig.rt
        .services()
        .tools
        .register(
            Some(&SessionId::from(agent)),
            ToolDefinition {
                name: "report".to_owned(),
                description: "conflicting report fixture".to_owned(),
                parameters: json!({"type": "object", "properties": {}}),
                concurrency_safe: true,
                handler: Arc::new(Inert),
            },
        )
        .expect("the fixture registers")
}

/// A tool body that answers nothing useful.
struct Inert;

#[async_trait]
impl agent::tools::ToolHandler for Inert {
    async fn execute(
        &self,
        _: serde_json::Value,
        _: agent::tools::ToolContext,
    ) -> Result<agent::tools::ToolOutput, agent::tools::ToolError> {
        Ok(agent::tools::ToolOutput::text("fixture"))
    }
}

// ---- registries whose removals fail --------------------------------------------------------

/// Wraps a guard so that undoing it undoes the real registration, then panics with `message`
/// while `failing` is set (a registry whose change notification fails).
fn failing_undo(guard: Registration, failing: Arc<AtomicBool>, message: &'static str) -> Registration {
    Registration::new(move || {
        drop(guard);
        if failing.load(Ordering::SeqCst) {
            panic!("{message}");
        }
    })
}

/// The host's prompt registry, whose section removals fail while `failing` is set.
struct FaultyPrompt {
    inner: Arc<dyn Prompt>,
    failing: Arc<AtomicBool>,
    message: &'static str,
}

impl Prompt for FaultyPrompt {
    fn section(&self, scope: Option<&SessionId>, section: PromptSection) -> Registration {
        failing_undo(
            self.inner.section(scope, section),
            self.failing.clone(),
            self.message,
        )
    }
    fn runtime_context(&self, scope: Option<&SessionId>, context: RuntimeContext) -> Registration {
        self.inner.runtime_context(scope, context)
    }
    fn sections(&self, agent: Option<&SessionId>) -> Vec<PromptSection> {
        self.inner.sections(agent)
    }
    fn runtime_contexts(&self, agent: Option<&SessionId>) -> Vec<RuntimeContext> {
        self.inner.runtime_contexts(agent)
    }
}

/// The host's tool registry, whose tool removals fail while `failing` is set.
struct FaultyTools {
    inner: Arc<dyn Tools>,
    failing: Arc<AtomicBool>,
    message: &'static str,
}

#[async_trait]
impl Tools for FaultyTools {
    fn register(
        &self,
        scope: Option<&SessionId>,
        def: ToolDefinition,
    ) -> Result<Registration, ToolRegistryError> {
        let guard = self.inner.register(scope, def)?;
        Ok(failing_undo(guard, self.failing.clone(), self.message))
    }
    fn restrict(
        &self,
        scope: Option<&SessionId>,
        filter: ToolRestriction,
    ) -> Result<Registration, ToolRegistryError> {
        self.inner.restrict(scope, filter)
    }
    fn guard(&self, scope: Option<&SessionId>, guard: ToolGuard) -> Registration {
        self.inner.guard(scope, guard)
    }
    fn pre_execute(&self, scope: Option<&SessionId>, policy: PreExecutePolicy) -> Registration {
        self.inner.pre_execute(scope, policy)
    }
    fn post_execute(&self, scope: Option<&SessionId>, policy: PostExecutePolicy) -> Registration {
        self.inner.post_execute(scope, policy)
    }
    fn on_result(&self, scope: Option<&SessionId>, observer: ToolResultObserver) -> Registration {
        self.inner.on_result(scope, observer)
    }
    fn set_scope_parent(&self, scope: &SessionId, parent: &SessionId) -> Registration {
        self.inner.set_scope_parent(scope, parent)
    }
    fn get(&self, name: &str, scope: Option<&SessionId>) -> Option<ToolDefinition> {
        self.inner.get(name, scope)
    }
    fn schemas(&self, scope: Option<&SessionId>) -> Vec<ToolSchema> {
        self.inner.schemas(scope)
    }
    async fn execute(&self, scope: &SessionId, call: ToolCallRequest, ctx_signal: Signal) -> ExecutedTool {
        self.inner.execute(scope, call, ctx_signal).await
    }
}

/// The host's services with the prompt and/or tool registry replaced by failing wrappers.
fn faulty_services(
    rig: &Rig,
    prompt: Option<(&Arc<AtomicBool>, &'static str)>,
    tools: Option<(&Arc<AtomicBool>, &'static str)>,
) -> Services {
    let mut services = rig.rt.services().clone();
    if let Some((failing, message)) = prompt {
        services.prompt = Arc::new(FaultyPrompt {
            inner: services.prompt.clone(),
            failing: failing.clone(),
            message,
        });
    }
    if let Some((failing, message)) = tools {
        services.tools = Arc::new(FaultyTools {
            inner: services.tools.clone(),
            failing: failing.clone(),
            message,
        });
    }
    services
}

// ---- the tests -----------------------------------------------------------------------------

/// spec: REP-13 — unloading the package revokes the tool and its section from a resident child
/// at once (its next call fails); loading it again does not grant them to that same residency.
/// The child's next residency (a cold resume) gets them again.
#[tokio::test(start_paused = true)]
async fn rep_13_unloading_revokes_at_once_and_reloading_waits_for_the_next_residency() {
    let mut rig = Rig::new(quiet()).await;
    rig.models.hold("child");
    let child = rig.start(rig.parent(), "child", "child task").await;
    assert!(has_report(&rig, "child"));
    assert!(has_guidance(&rig, "child"));
    rig.plugin.as_ref().expect("loaded").unload().expect("unloads");
    assert!(!rig.plugin.as_ref().expect("plugin").is_loaded());
    assert!(!has_report(&rig, "child"));
    assert!(!has_guidance(&rig, "child"));
    assert!(
        rig.manager.is_resident(&"child".into()),
        "the child stays resident"
    );
    let result = rig.report("child", "revoked").await;
    assert!(result.is_error, "{}", text(&result));
    assert!(reports(rig.parent()).is_empty());

    rig.plugin = Some(
        ReportToolPlugin::load(&rig.manager, ReportToolConfig::new(ReportDelivery::Quiet))
            .expect("loads again once unloaded"),
    );
    assert!(!has_report(&rig, "child"), "no retrofit of a resident child");
    assert!(!has_guidance(&rig, "child"));

    // The residency ends; a follow-up cold-resumes the child, which gets the grant.
    rig.models.release("child");
    rig.settle().await;
    rig.parent().when_idle().await;
    assert!(rig.agent("child").is_none());
    rig.models.hold("child");
    rig.manager
        .followup(rig.parent(), child.id(), vec![agent::ContentBlock::text("again")])
        .await
        .expect("the child cold-resumes");
    assert!(has_report(&rig, "child"));
    assert!(has_guidance(&rig, "child"));
    let result = rig.report("child", "after resume").await;
    assert!(!result.is_error, "{}", text(&result));
    rig.finish().await;
}

/// spec: REP-14 — a name conflict in the child's layer makes the installation fail with
/// `already registered in this scope` and leaves no guidance section.
#[tokio::test(start_paused = true)]
async fn rep_14_a_name_conflict_fails_the_installation_and_rolls_back_the_section() {
    let rig = Rig::new(None).await;
    rig.models.hold("child");
    let child = rig.start(rig.parent(), "child", "child task").await;
    let conflict = conflicting_report(&rig, "child");
    let ctx = Ctx::scoped(rig.rt.services().clone(), child.clone());
    let error = install_report_tool(&ctx, &rig.manager, ReportDelivery::Quiet).unwrap_err();
    assert!(matches!(error, ToolSubagentReportError::Register(_)), "{error:?}");
    assert!(
        error.to_string().contains("already registered in this scope"),
        "{error}"
    );
    // The conflicting tool is visible, so a surviving (tool-bound) section would show.
    assert!(has_report(&rig, "child"));
    assert!(!has_guidance(&rig, "child"));
    drop(conflict);
    assert!(!has_report(&rig, "child"));
    rig.finish().await;
}

/// spec: REP-15 — the tool's registration fails and rolling back the section fails too: the
/// error aggregates both (the registration's first), and the section is gone.
#[tokio::test(start_paused = true)]
async fn rep_15_a_failed_rollback_aggregates_with_the_registration_failure() {
    let rig = Rig::new(None).await;
    rig.models.hold("child");
    let child = rig.start(rig.parent(), "child", "child task").await;
    let conflict = conflicting_report(&rig, "child");
    let failing = Arc::new(AtomicBool::new(true));
    let services = faulty_services(&rig, Some((&failing, "prompt rollback listener failed")), None);
    let ctx = Ctx::scoped(services, child.clone());
    let error = install_report_tool(&ctx, &rig.manager, ReportDelivery::Quiet).unwrap_err();
    let ToolSubagentReportError::RollbackFailed {
        registration,
        rollback,
    } = &error
    else {
        panic!("an aggregate: {error:?}");
    };
    assert!(matches!(**registration, ToolSubagentReportError::Register(_)));
    assert_eq!(rollback.part, InstalledPart::Section);
    assert_eq!(rollback.message, "prompt rollback listener failed");
    let failures = error.failures();
    assert_eq!(failures.len(), 2);
    assert!(
        failures[0].contains("already registered in this scope"),
        "{failures:?}"
    );
    assert!(
        failures[1].contains("prompt rollback listener failed"),
        "{failures:?}"
    );
    // The aggregate names the crate once, then each cause.
    assert_eq!(
        error.to_string(),
        "tool-subagent-report: failed to register the report tool and roll back its prompt \
         guidance: tool \"report\" is already registered in this scope; removing the report guidance \
         section failed: prompt rollback listener failed",
        "{error}"
    );
    assert!(!has_guidance(&rig, "child"));
    drop(conflict);
    rig.finish().await;
}

/// spec: REP-16 — revocation attempts both removals even when the first fails, aggregates both
/// failures (tool, then section), and leaves neither registration; a second revocation is a
/// no-op.
#[tokio::test(start_paused = true)]
async fn rep_16_revocation_attempts_both_removals_and_aggregates_their_failures() {
    let rig = Rig::new(None).await;
    rig.models.hold("child");
    let child = rig.start(rig.parent(), "child", "child task").await;
    let failing = Arc::new(AtomicBool::new(false));
    let services = faulty_services(
        &rig,
        Some((&failing, "prompt removal listener failed")),
        Some((&failing, "tool removal listener failed")),
    );
    let ctx = Ctx::scoped(services, child.clone());
    let installation = install_report_tool(&ctx, &rig.manager, ReportDelivery::Quiet).expect("installed");
    assert_eq!(installation.child().as_str(), "child");
    assert!(has_report(&rig, "child"));
    assert!(has_guidance(&rig, "child"));
    failing.store(true, Ordering::SeqCst);
    let error = installation.revoke().unwrap_err();
    let ToolSubagentReportError::RevokeFailed { failures } = &error else {
        panic!("an aggregate: {error:?}");
    };
    let parts: Vec<(InstalledPart, &str)> = failures.iter().map(|f| (f.part, f.message.as_str())).collect();
    assert_eq!(
        parts,
        [
            (InstalledPart::Tool, "tool removal listener failed"),
            (InstalledPart::Section, "prompt removal listener failed"),
        ]
    );
    assert!(installation.is_revoked());
    assert!(!has_report(&rig, "child"));
    assert!(!has_guidance(&rig, "child"));
    installation.revoke().expect("already revoked: nothing to do");
    drop(installation);
    rig.finish().await;
}

/// spec: REP-16 — the child's disposal removes an installation made through the installer
/// whose handle is still held elsewhere: the scope shares the guards.
#[tokio::test(start_paused = true)]
async fn rep_16_the_childs_disposal_revokes_a_held_installation() {
    let rig = Rig::new(None).await;
    rig.models.hold("child");
    let child = rig.start(rig.parent(), "child", "child task").await;
    let ctx = Ctx::scoped(rig.rt.services().clone(), child.clone());
    let installation = install_report_tool(&ctx, &rig.manager, ReportDelivery::Quiet).expect("installed");
    assert!(has_report(&rig, "child"));
    rig.manager
        .drain_continuable_children(rig.parent(), &["child".into()])
        .await
        .expect("drained");
    assert!(installation.is_revoked());
    let tools = rig.rt.tool_registry().expect("registry").counts();
    assert_eq!(tools.tools, 0);
    installation.revoke().expect("nothing left to revoke");
    // A context whose scope is gone installs nothing.
    let error = install_report_tool(&ctx, &rig.manager, ReportDelivery::Quiet).unwrap_err();
    assert!(matches!(error, ToolSubagentReportError::Scope(_)), "{error:?}");
    assert_eq!(rig.rt.tool_registry().expect("registry").counts().tools, 0);
    // Nor does the global context: the tool is never global.
    let error = install_report_tool(
        &Ctx::global(rig.rt.services().clone()),
        &rig.manager,
        ReportDelivery::Quiet,
    )
    .unwrap_err();
    assert!(matches!(error, ToolSubagentReportError::NotScoped), "{error:?}");
    assert!(rig.tool_names(None).is_empty());
    drop(installation);
    rig.finish().await;
}

/// spec: REP-17 — the guidance is scoped: present for each continuable child (its own copy,
/// with the two load-bearing phrases), absent for the parent and the global assembly; one
/// sibling's teardown leaves the other's guidance in place.
#[tokio::test(start_paused = true)]
async fn rep_17_guidance_is_scoped_to_each_child() {
    let rig = Rig::new(quiet()).await;
    rig.models.hold("first");
    rig.models.hold("second");
    rig.start(rig.parent(), "first", "first child").await;
    rig.start(rig.parent(), "second", "second child").await;
    let guidance = rig
        .sections(Some("first"))
        .into_iter()
        .find(|s| s.name == "tool:report")
        .expect("the child's guidance");
    assert!(
        guidance
            .text
            .contains("Deliver your result with the report tool before you finish")
    );
    assert!(guidance.text.contains("reporting never ends your turn"));
    assert_eq!(guidance.order, model_text::GUIDANCE_ORDER);
    assert_eq!(guidance.order, 117);
    assert!(!has_guidance(&rig, PARENT));
    assert!(!rig.section_names(None).contains(&"tool:report".to_owned()));
    assert!(has_guidance(&rig, "second"));
    rig.manager
        .drain_continuable_children(rig.parent(), &["first".into()])
        .await
        .expect("drained");
    assert!(!has_guidance(&rig, "first"));
    assert!(has_guidance(&rig, "second"), "the sibling keeps its own");
    assert!(has_report(&rig, "second"));
    rig.finish().await;
}

/// Records the sessions the store announces.
fn announced(rig: &Rig) -> (Arc<Mutex<Vec<String>>>, Registration) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    let listener = rig.rt.sessions().events().on(move |event: &SessionStoreEvent| {
        if let SessionStoreEvent::Created(session) = event {
            sink.lock().push(session.id().to_string());
        }
        Ok(())
    });
    (seen, listener)
}

/// After a refused start: only the parent exists, live or persisted, and no report tool or
/// guidance survives anywhere.
async fn nothing_materialized(rig: &Rig, child: &str) {
    assert_eq!(rig.agents(), [PARENT]);
    let live: Vec<String> = agent::SessionStore::list(rig.rt.sessions())
        .iter()
        .map(|s| s.id().to_string())
        .collect();
    assert_eq!(live, [PARENT]);
    assert!(
        agent::SessionPersistence::load(rig.store.as_ref(), &SessionId::from(child))
            .await
            .is_err(),
        "nothing persisted for the refused child"
    );
    assert_eq!(rig.rt.tool_registry().expect("registry").counts().tools, 0);
    assert!(!rig.section_names(Some(child)).contains(&"tool:report".to_owned()));
}

/// spec: REP-18 — a setup contribution (here: the report installer) that revokes itself during
/// setup fails the start with `ACTIVATION_SETUP_REVOKED`: no session announced, only the parent
/// agent exists, and the installation was undone.
#[tokio::test(start_paused = true)]
async fn rep_18_a_self_revoking_contribution_fails_the_start() {
    let rig = Rig::new(None).await;
    let remover: Arc<Mutex<Option<subagent::continuation::ContinuableSetupRemover>>> = Arc::default();
    let slot = remover.clone();
    let manager = rig.manager.clone();
    let registration = rig.manager.register_continuable_setup(Arc::new(move |ctx: &Ctx| {
        let installation = install_report_tool(ctx, &manager, ReportDelivery::Quiet)?;
        assert!(!installation.is_revoked());
        if let Some(remover) = slot.lock().as_ref() {
            remover.remove()?;
        }
        Ok(installation.into_release())
    }));
    *remover.lock() = Some(registration.remover());
    let (seen, listener) = announced(&rig);
    let error = rig
        .manager
        .start_continuable(rig.spec(rig.parent(), "racing", "racing child"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), SubagentErrorCode::ActivationSetupRevoked, "{error}");
    assert!(seen.lock().is_empty(), "announced: {:?}", seen.lock());
    nothing_materialized(&rig, "racing").await;
    drop(listener);
    drop(remover.lock().take());
    drop(registration);
    rig.finish().await;
}

/// spec: REP-19 — the package's installation revoked after it was made but before the child is
/// published (a later contribution unloads the package): the start fails
/// `ACTIVATION_SETUP_REVOKED`, the installation was undone, and no session exists besides the
/// parent's.
#[tokio::test(start_paused = true)]
async fn rep_19_revocation_before_publication_fails_the_start() {
    let rig = Rig::new(None).await;
    let plugin = Arc::new(
        ReportToolPlugin::load(&rig.manager, ReportToolConfig::new(ReportDelivery::Quiet)).expect("loads"),
    );
    let installed_then_revoked = Arc::new(AtomicBool::new(false));
    let witness = installed_then_revoked.clone();
    let weak: Weak<ReportToolPlugin> = Arc::downgrade(&plugin);
    let services = rig.rt.services().clone();
    let later = rig.manager.register_continuable_setup(Arc::new(move |ctx: &Ctx| {
        let child = ctx.agent().expect("a child scope").id().clone();
        let installed = services.tools.get("report", Some(&child)).is_some();
        if let Some(plugin) = weak.upgrade() {
            plugin.unload()?;
        }
        let gone = services.tools.get("report", Some(&child)).is_none();
        witness.store(installed && gone, Ordering::SeqCst);
        Ok(Box::new(|| Ok(())) as SetupRelease)
    }));
    let (seen, listener) = announced(&rig);
    let error = rig
        .manager
        .start_continuable(rig.spec(rig.parent(), "revoked", "revoked child"))
        .await
        .unwrap_err();
    assert_eq!(error.code(), SubagentErrorCode::ActivationSetupRevoked, "{error}");
    assert!(
        installed_then_revoked.load(Ordering::SeqCst),
        "the report tool was installed, then removed by the revocation"
    );
    assert!(!plugin.is_loaded());
    assert!(seen.lock().is_empty(), "announced: {:?}", seen.lock());
    nothing_materialized(&rig, "revoked").await;
    drop(listener);
    drop(later);
    drop(plugin);
    rig.finish().await;
}

/// spec: REP-21 — the package's shape: its name, the services it requires, `reportDelivery`
/// defaulting to `next-step` (other values rejected), and loading registers nothing but the
/// setup contribution — no global tool or section.
#[tokio::test(start_paused = true)]
async fn rep_21_plugin_shape_and_configuration() {
    assert_eq!(PLUGIN_NAME, "tool-subagent-report");
    assert_eq!(DEPENDENCIES, ["subagents", "tools", "systemPrompt"]);
    let rig = Rig::new(None).await;
    let config = ReportToolConfig::from_json(&json!({})).expect("valid");
    assert_eq!(config.report_delivery, ReportDelivery::NextStep);
    for bad in ["wakeup", "shout"] {
        let error = ReportToolConfig::from_json(&json!({"reportDelivery": bad})).unwrap_err();
        assert!(matches!(error, ToolSubagentReportError::InvalidConfig(_)));
    }
    let plugin = ReportToolPlugin::load(&rig.manager, config).expect("loads");
    assert_eq!(plugin.config().report_delivery, ReportDelivery::NextStep);
    assert!(plugin.is_loaded());
    assert!(rig.tool_names(None).is_empty());
    assert!(rig.sections(None).is_empty());
    assert!(!has_report(&rig, PARENT));
    plugin.unload().expect("unloads");
    plugin.unload().expect("idempotent");
    assert!(!plugin.is_loaded());
    drop(plugin);
    rig.finish().await;
}

/// Dropping the plugin unloads it like `unload`: a resident child loses the tool at once.
#[tokio::test(start_paused = true)]
async fn dropping_the_plugin_revokes_like_unloading() {
    let mut rig = Rig::new(quiet()).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    assert!(has_report(&rig, "child"));
    drop(rig.plugin.take());
    assert!(!has_report(&rig, "child"));
    assert!(!has_guidance(&rig, "child"));
    rig.finish().await;
}

/// Calls the body of `definition` directly, as `caller`, under `signal` (what the pipeline does
/// once it has resolved the call).
async fn call_body(
    definition: &ToolDefinition,
    caller: &str,
    output: &str,
    signal: Signal,
) -> Result<agent::tools::ToolOutput, agent::tools::ToolError> {
    let execution = agent::tools::ToolExecution {
        id: agent::tools::ExecutionId::next(),
        agent: SessionId::from(caller),
        call_id: "direct".into(),
        name: "report".to_owned(),
        arguments: json!({"output": output}),
    };
    definition
        .handler
        .execute(
            json!({"output": output}),
            agent::tools::ToolContext::new(Arc::new(execution), signal),
        )
        .await
}

/// The body itself refuses what the pipeline would not have dispatched: a call resolved just
/// before the revocation (`FAILED`, the revocation text), a caller that is not the child the
/// tool was installed for (`UNAUTHORIZED`, the seam's text), a cancelled token (`CANCELLED`).
/// None delivers anything; a good call through the same body does.
#[tokio::test(start_paused = true)]
async fn the_body_refuses_revoked_foreign_and_cancelled_calls() {
    let rig = Rig::new(quiet()).await;
    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    let definition = rig
        .rt
        .services()
        .tools
        .get("report", Some(&"child".into()))
        .expect("installed");

    let error = call_body(&definition, PARENT, "foreign", Signal::new())
        .await
        .unwrap_err();
    assert_eq!(error.code, "UNAUTHORIZED");
    assert_eq!(
        error.message,
        "agent \"parent\" is not a live continuable subagent and cannot report"
    );
    let cancelled = Signal::new();
    cancelled.cancel(agent::CancelCause::User);
    let error = call_body(&definition, "child", "cancelled", cancelled)
        .await
        .unwrap_err();
    assert_eq!(error.code, "CANCELLED");
    assert!(reports(rig.parent()).is_empty());

    let output = call_body(&definition, "child", "direct", Signal::new())
        .await
        .expect("delivered");
    let id = output.value.as_ref().expect("value")["messageId"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(reports(rig.parent()).len(), 1);
    assert_eq!(reports(rig.parent())[0].id, id);

    rig.plugin.as_ref().expect("loaded").unload().expect("unloads");
    let error = call_body(&definition, "child", "late", Signal::new())
        .await
        .unwrap_err();
    assert_eq!(error.code, "FAILED");
    assert_eq!(error.message, model_text::REVOKED);
    assert_eq!(reports(rig.parent()).len(), 1, "nothing more delivered");
    drop(definition);
    rig.finish().await;
}

/// spec: §2.14.12 (subagent-seam.md) — a child whose setup fails after the report tool was
/// installed (a later contribution refuses, or the start is cancelled inside the setup window)
/// is not established, and the installation was released: no `report` tool, no guidance, no
/// layer left for it.
#[tokio::test(start_paused = true)]
async fn a_setup_failing_after_installation_leaves_no_report_registrations() {
    let rig = Rig::new(quiet()).await;
    let refusing = rig.manager.register_continuable_setup(Arc::new(|_: &Ctx| {
        Err::<SetupRelease, agent::bus::BoxError>("a later contribution refused".into())
    }));
    let error = rig
        .manager
        .start_continuable(rig.spec(rig.parent(), "refused", "refused child"))
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("a later contribution refused"),
        "{error}"
    );
    nothing_materialized(&rig, "refused").await;
    drop(refusing);

    let signal = Signal::new();
    let cancel = signal.clone();
    let cancelling = rig.manager.register_continuable_setup(Arc::new(move |_: &Ctx| {
        cancel.cancel(agent::CancelCause::User);
        Ok(Box::new(|| Ok(())) as SetupRelease)
    }));
    let mut spec = rig.spec(rig.parent(), "aborted", "aborted child");
    spec.signal = signal;
    rig.manager
        .start_continuable(spec)
        .await
        .expect_err("the start was cancelled during setup");
    nothing_materialized(&rig, "aborted").await;
    assert_eq!(rig.rt.tool_registry().expect("registry").counts().scope_layers, 0);
    drop(cancelling);
    rig.finish().await;
}

/// spec: REP-21 (the package is one setup contribution) — loading the package a second time over
/// the same manager is refused at load with `AlreadyLoaded` (its source the seam's
/// `SETUP_ALREADY_REGISTERED` naming [`SETUP_KEY`]) and registers nothing: the first copy keeps
/// installing, so a continuable child still gets exactly one `report` tool and one guidance
/// section. Once the first copy is unloaded, a new load succeeds and installs into later
/// children.
#[tokio::test(start_paused = true)]
async fn loading_twice_is_refused_at_load_and_the_first_copy_keeps_working() {
    let mut rig = Rig::new(quiet()).await;
    let error = ReportToolPlugin::load(&rig.manager, ReportToolConfig::default())
        .expect_err("a second load over the same manager");
    let ToolSubagentReportError::AlreadyLoaded(seam) = &error else {
        panic!("{error:?}")
    };
    assert_eq!(seam.code(), SubagentErrorCode::SetupAlreadyRegistered, "{seam}");
    assert!(seam.message().contains(&format!("\"{SETUP_KEY}\"")), "{seam}");
    assert_eq!(
        error.to_string(),
        "tool-subagent-report: already loaded over this continuation manager: a continuable-subagent \
         setup contribution keyed \"tool-subagent-report\" is already registered; remove it before \
         registering another"
    );
    assert!(rig.plugin.as_ref().expect("the first copy").is_loaded());

    rig.models.hold("child");
    rig.start(rig.parent(), "child", "child task").await;
    let count = |rig: &Rig, agent: &str| {
        (
            rig.tool_names(Some(agent))
                .iter()
                .filter(|name| *name == "report")
                .count(),
            rig.sections(Some(agent))
                .iter()
                .filter(|s| s.name == "tool:report")
                .count(),
        )
    };
    assert_eq!(
        count(&rig, "child"),
        (1, 1),
        "exactly one report tool and section"
    );
    let result = rig.report("child", "still works").await;
    assert!(!result.is_error, "{}", text(&result));

    rig.plugin
        .take()
        .expect("the first copy")
        .unload()
        .expect("unloads");
    assert!(!has_report(&rig, "child"));
    rig.plugin = Some(
        ReportToolPlugin::load(&rig.manager, ReportToolConfig::default())
            .expect("loads once the first is unloaded"),
    );
    rig.models.hold("c2");
    rig.start(rig.parent(), "c2", "t").await;
    assert_eq!(count(&rig, "c2"), (1, 1));
    rig.finish().await;
}
