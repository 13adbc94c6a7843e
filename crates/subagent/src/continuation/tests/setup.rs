//! Setup contributions (spec §2.14.12, checklist SET-*): the registry on its own, with real agents'
//! scopes as the children, then through the manager's fresh starts and cold resumes.

use agent::Ctx;
use agent::bus::BoxError;

use super::*;
use crate::continuation::ContinuableSetupRegistration;
use crate::continuation::setup::{SetupContribution, SetupRegistry, SetupRelease};

/// Who installed and who released, in order (`"install:<tag>@<child>"`, `"release:<tag>@<child>"`).
#[derive(Clone, Default)]
struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    fn push(&self, entry: String) {
        self.0.lock().push(entry);
    }

    fn entries(&self) -> Vec<String> {
        self.0.lock().clone()
    }

    fn count(&self, prefix: &str) -> usize {
        self.0.lock().iter().filter(|e| e.starts_with(prefix)).count()
    }

    /// A contribution tagged `tag` that journals its installs and releases.
    fn contribution(&self, tag: &'static str) -> SetupContribution {
        self.failing_release(tag, |_| false)
    }

    /// Like [`contribution`](Self::contribution); the release fails for the children `fails`
    /// picks.
    fn failing_release(
        &self,
        tag: &'static str,
        fails: impl Fn(&str) -> bool + Send + Sync + 'static,
    ) -> SetupContribution {
        let journal = self.clone();
        let fails = Arc::new(fails);
        Arc::new(move |ctx: &Ctx| {
            let child = child_of(ctx);
            journal.push(format!("install:{tag}@{child}"));
            let (journal, fails) = (journal.clone(), fails.clone());
            Ok(Box::new(move || {
                journal.push(format!("release:{tag}@{child}"));
                if fails(&child) {
                    Err(format!("release of {tag}@{child} exploded").into())
                } else {
                    Ok(())
                }
            }) as SetupRelease)
        })
    }
}

fn child_of(ctx: &Ctx) -> String {
    ctx.agent().expect("a child scope").id().to_string()
}

/// A contribution whose installer fails.
fn failing_installer(message: &'static str) -> SetupContribution {
    Arc::new(move |_: &Ctx| Err::<SetupRelease, BoxError>(message.into()))
}

/// The registry tests' fixture: a registry, a journal, and children that are real agents, so
/// each has its own scope.
struct Children {
    host: Host,
    handles: Vec<AgentHandle>,
    registry: Arc<SetupRegistry>,
    journal: Journal,
}

impl Children {
    async fn new() -> Self {
        Self {
            host: Host::new(vec![]).await,
            handles: Vec::new(),
            registry: Arc::default(),
            journal: Journal::default(),
        }
    }

    /// Registers the journalling contribution `tag`.
    fn register(&self, tag: &'static str) -> ContinuableSetupRegistration {
        self.registry.register(self.journal.contribution(tag))
    }

    /// A fresh child `id` set up and committed; its index.
    async fn committed(&mut self, id: &str) -> usize {
        let (index, ctx) = self.child(id).await;
        self.registry.apply(&ctx).expect("installed")().expect("committed");
        index
    }

    /// A fresh agent's scoped context (index into `handles`).
    async fn child(&mut self, id: &str) -> (usize, Ctx) {
        let handle = self
            .host
            .runtime
            .create(CreateAgentOptions::new(SessionId::from(id)))
            .await
            .expect("child created");
        let ctx = Ctx::scoped(self.host.runtime.services().clone(), handle.agent().clone());
        self.handles.push(handle);
        (self.handles.len() - 1, ctx)
    }

    /// Disposes child `index` (its scope unwinds, releasing its installations).
    async fn dispose(&self, index: usize) {
        self.handles[index].dispose().await;
    }

    async fn finish(mut self) {
        for handle in self.handles.drain(..) {
            handle.dispose().await;
        }
        self.host.finish().await;
    }
}

fn revoked(e: BoxError) -> SubagentError {
    *e.downcast::<SubagentError>().expect("a seam error")
}

/// spec: SET-1 — contributions install in registration order; the commit succeeds and installs
/// nothing more.
#[tokio::test]
async fn set_1_contributions_install_in_registration_order() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let _first = children.register("first");
    let _second = children.register("second");
    let (_, ctx) = children.child("c1").await;
    let commit = registry.apply(&ctx).expect("installed");
    assert_eq!(journal.entries(), ["install:first@c1", "install:second@c1"]);
    commit().expect("committed");
    assert_eq!(journal.entries(), ["install:first@c1", "install:second@c1"]);
    children.finish().await;
    assert_eq!(journal.count("release:"), 2, "the child's disposal released both");
}

/// spec: SET-2 — repeated removal plus a later child disposal release an installation once.
#[tokio::test]
async fn set_2_repeated_removal_then_child_disposal_release_once() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let registration = children.register("cap");
    let index = children.committed("c1").await;
    registration.remove().unwrap();
    registration.remove().unwrap();
    assert!(registration.is_removed());
    children.dispose(index).await;
    drop(registration);
    assert_eq!(journal.count("release:"), 1);
    assert_eq!(registry.len(), 0);
    children.finish().await;
}

/// spec: SET-3 — a child disposal then the removal release an installation once.
#[tokio::test]
async fn set_3_child_disposal_then_removal_release_once() {
    let mut children = Children::new().await;
    let journal = children.journal.clone();
    let registration = children.register("cap");
    let index = children.committed("c1").await;
    children.dispose(index).await;
    assert_eq!(journal.count("release:"), 1);
    registration.remove().unwrap();
    assert_eq!(journal.count("release:"), 1);
    children.finish().await;
}

/// spec: SET-4 — a contribution removed before a child is built is skipped.
#[tokio::test]
async fn set_4_a_removed_contribution_is_skipped() {
    let mut children = Children::new().await;
    let journal = children.journal.clone();
    let gone = children.register("gone");
    let _kept = children.register("kept");
    gone.remove().unwrap();
    children.committed("c1").await;
    assert_eq!(journal.entries(), ["install:kept@c1"]);
    children.finish().await;
}

/// spec: SET-5 — removal before the commit releases the installation at once and makes the
/// commit fail (`ACTIVATION_SETUP_REVOKED`, "revoked while this child was being built").
#[tokio::test]
async fn set_5_removal_before_commit_fails_the_commit() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let registration = children.register("cap");
    let (_, ctx) = children.child("c1").await;
    let commit = registry.apply(&ctx).unwrap();
    registration.remove().unwrap();
    assert_eq!(journal.entries(), ["install:cap@c1", "release:cap@c1"]);
    let e = revoked(commit().unwrap_err());
    assert_eq!(e.code(), SubagentErrorCode::ActivationSetupRevoked);
    assert!(
        e.to_string().contains("revoked while this child was being built"),
        "{e}"
    );
    children.finish().await;
    assert_eq!(
        journal.count("release:"),
        1,
        "the child's disposal does not release it again"
    );
}

/// spec: SET-6 — a contribution that revokes itself inside its installer is released once and
/// the commit fails ("revoked").
#[tokio::test]
async fn set_6_an_installer_revoking_itself_fails_the_commit() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let remover: Arc<Mutex<Option<crate::continuation::ContinuableSetupRemover>>> = Arc::default();
    let installer = journal.contribution("self");
    let slot = remover.clone();
    let registration = registry.register(Arc::new(move |ctx: &Ctx| {
        let release = installer(ctx)?;
        slot.lock()
            .as_ref()
            .expect("remover set")
            .remove()
            .expect("removed");
        Ok(release)
    }));
    *remover.lock() = Some(registration.remover());
    let (_, ctx) = children.child("c1").await;
    let commit = registry.apply(&ctx).unwrap();
    assert_eq!(journal.entries(), ["install:self@c1", "release:self@c1"]);
    let e = revoked(commit().unwrap_err());
    assert_eq!(e.code(), SubagentErrorCode::ActivationSetupRevoked);
    assert!(e.to_string().contains("revoked"), "{e}");
    assert!(registration.is_removed());
    children.finish().await;
    assert_eq!(journal.count("release:"), 1);
}

/// spec: SET-7 — removal attempts every installation's release, then fails with one
/// `ACTIVATION_SETUP_RELEASE_FAILED` counting the failures.
#[tokio::test]
async fn set_7_removal_attempts_every_release_then_fails() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let registration = registry.register(journal.failing_release("cap", |child| child == "c1"));
    for id in ["c1", "c2", "c3"] {
        children.committed(id).await;
    }
    let e = registration.remove().unwrap_err();
    assert_eq!(e.code(), SubagentErrorCode::ActivationSetupReleaseFailed);
    assert!(
        e.to_string().contains("failed to release 1 installation(s)"),
        "{e}"
    );
    assert!(e.to_string().contains("release of cap@c1 exploded"), "{e}");
    assert_eq!(
        journal.entries()[3..],
        ["release:cap@c1", "release:cap@c2", "release:cap@c3"]
    );
    children.finish().await;
    assert_eq!(journal.count("release:"), 3);
}

/// spec: SET-8 — a child's disposal attempts every release even after one fails (the failure is
/// logged: a scope's unwinding has no caller to fail).
#[tokio::test]
async fn set_8_child_disposal_attempts_every_release() {
    let warnings = WarningCapture::new();
    let _installed = warnings.install();
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let _a = registry.register(journal.failing_release("a", |_| true));
    let _b = children.register("b");
    let index = children.committed("c1").await;
    children.dispose(index).await;
    assert_eq!(journal.count("release:a@c1"), 1);
    assert_eq!(journal.count("release:b@c1"), 1);
    assert_eq!(warnings.mentioning("failed to release 1 installation(s)"), 1);
    children.finish().await;
}

/// spec: SET-9 — a failing later installer rolls back the earlier installations (not later
/// ones, which never ran) and its error propagates.
#[tokio::test]
async fn set_9_a_failing_installer_rolls_back_earlier_installations() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let _first = children.register("first");
    let _boom = registry.register(failing_installer("boom"));
    let _third = children.register("third");
    let (_, ctx) = children.child("c1").await;
    let Err(e) = registry.apply(&ctx) else {
        panic!("the setup fails")
    };
    assert_eq!(e.to_string(), "boom");
    assert_eq!(journal.entries(), ["install:first@c1", "release:first@c1"]);
    children.finish().await;
    assert_eq!(journal.count("release:"), 1);
}

/// spec: SET-9 — a panicking installer is a failing one: contained, the earlier installations
/// rolled back, the panic's message the error.
#[tokio::test]
async fn set_9_a_panicking_installer_is_contained_and_rolled_back() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let _first = children.register("first");
    let _panics = registry.register(Arc::new(|_: &Ctx| -> Result<SetupRelease, BoxError> {
        panic!("installer exploded")
    }));
    let (_, ctx) = children.child("c1").await;
    let Err(e) = registry.apply(&ctx) else {
        panic!("the setup fails")
    };
    assert!(e.to_string().contains("installer exploded"), "{e}");
    assert_eq!(journal.entries(), ["install:first@c1", "release:first@c1"]);
    children.finish().await;
}

/// spec: SET-10 — a contribution revoked by a later installer that then fails is released
/// exactly once.
#[tokio::test]
async fn set_10_revoked_then_rolled_back_releases_once() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let first = children.register("first");
    let remover = first.remover();
    let _second = registry.register(Arc::new(move |_: &Ctx| -> Result<SetupRelease, BoxError> {
        remover.remove().expect("removed");
        Err("second failed after revoking the first".into())
    }));
    let (_, ctx) = children.child("c1").await;
    let Err(e) = registry.apply(&ctx) else {
        panic!("the setup fails")
    };
    assert_eq!(e.to_string(), "second failed after revoking the first");
    assert_eq!(journal.entries(), ["install:first@c1", "release:first@c1"]);
    drop(first);
    children.finish().await;
    assert_eq!(journal.count("release:"), 1);
}

/// spec: SET-11 — disposing one child never releases another child's installations.
#[tokio::test]
async fn set_11_children_are_never_cross_released() {
    let mut children = Children::new().await;
    let journal = children.journal.clone();
    let _cap = children.register("cap");
    let one = children.committed("c1").await;
    children.committed("c2").await;
    children.dispose(one).await;
    assert_eq!(journal.count("release:"), 1);
    assert_eq!(journal.count("release:cap@c1"), 1);
    children.finish().await;
    assert_eq!(journal.count("release:cap@c2"), 1);
}

/// spec: SET-1 — through the manager: a fresh continuable child and its cold resume each get the
/// contribution installed in their setup window, and each residency's end releases it. A
/// contribution registered later reaches only later children (no retrofitting).
#[tokio::test(start_paused = true)]
async fn set_1_fresh_and_cold_resumed_children_get_contributions() {
    let host = Host::new(by_session(4)).await;
    let journal = Journal::default();
    let _cap = host
        .manager
        .register_continuable_setup(journal.contribution("cap"));
    let (child, _) = host.manager.start_continuable(host.spec("first")).await.unwrap();
    host.settle().await;
    host.parent.when_idle().await;
    host.settle().await;
    let c = child.as_str();
    assert_eq!(
        journal.entries(),
        [format!("install:cap@{c}"), format!("release:cap@{c}")]
    );
    let _late = host
        .manager
        .register_continuable_setup(journal.contribution("late"));
    host.cold_resume_and_settle(&child, "again").await;
    assert_eq!(journal.count(&format!("install:cap@{c}")), 2);
    assert_eq!(journal.count(&format!("install:late@{c}")), 1);
    assert_eq!(journal.count(&format!("release:cap@{c}")), 2);
    assert_eq!(journal.count(&format!("release:late@{c}")), 1);
    host.finish().await;
}

/// spec: SET-6 — through the manager: a contribution that revokes itself during the setup fails
/// the start with `ACTIVATION_SETUP_REVOKED`; no child is announced or left registered and
/// nothing the installer made survives.
#[tokio::test(start_paused = true)]
async fn set_6_a_self_revoking_contribution_fails_the_start() {
    let host = Host::new(vec![]).await;
    let journal = Journal::default();
    let installer = journal.contribution("self");
    let remover: Arc<Mutex<Option<crate::continuation::ContinuableSetupRemover>>> = Arc::default();
    let slot = remover.clone();
    let registration = host
        .manager
        .register_continuable_setup(Arc::new(move |ctx: &Ctx| {
            let release = installer(ctx)?;
            if let Some(remover) = slot.lock().as_ref() {
                remover.remove().expect("removed");
            }
            Ok(release)
        }));
    *remover.lock() = Some(registration.remover());
    let e = host
        .manager
        .start_continuable(host.spec("task"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), SubagentErrorCode::ActivationSetupRevoked, "{e}");
    assert!(host.starts().is_empty(), "no session announced");
    assert_eq!(host.agent_count(), 1, "only the parent");
    assert_eq!(journal.count("install:"), 1);
    assert_eq!(journal.count("release:"), 1);
    host.finish().await;
}

/// spec: SET-5 — through the manager: removing a contribution releases its installation in a
/// resident child at once, without waiting for that child to settle.
#[tokio::test(start_paused = true)]
async fn set_5_removal_releases_resident_installations_at_once() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let journal = Journal::default();
    let cap = host
        .manager
        .register_continuable_setup(journal.contribution("cap"));
    let (child, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    assert!(host.manager.is_resident(&child));
    cap.remove().unwrap();
    assert_eq!(journal.count("release:"), 1, "{:?}", journal.entries());
    assert!(host.manager.is_resident(&child), "the child stays resident");
    host.finish().await;
    assert_eq!(
        journal.count("release:"),
        1,
        "the child's disposal does not release it again"
    );
}

/// spec: §2.14.12 (Rust addition: keyed contributions) — a second keyed registration under a
/// live key is refused with `SETUP_ALREADY_REGISTERED` naming the key, registers nothing, and
/// leaves the first contribution installing (once) as before; once the first is removed — or
/// dropped — the key registers again.
#[tokio::test]
async fn set_keyed_registration_is_refused_while_the_key_is_live() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let first = registry
        .register_keyed("cap", journal.contribution("first"))
        .expect("the first keyed registration");
    assert_eq!(first.key(), Some("cap"));
    let refused = registry
        .register_keyed("cap", journal.contribution("second"))
        .expect_err("a second live registration under the key");
    assert_eq!(refused.code(), SubagentErrorCode::SetupAlreadyRegistered);
    assert_eq!(
        refused.to_string(),
        "a continuable-subagent setup contribution keyed \"cap\" is already registered; \
         remove it before registering another"
    );
    assert_eq!(registry.len(), 1, "the refusal registered nothing");
    assert!(!first.is_removed(), "the refusal left the first registered");
    children.committed("c1").await;
    assert_eq!(journal.entries(), ["install:first@c1"]);

    first.remove().expect("removed");
    let again = registry
        .register_keyed("cap", journal.contribution("again"))
        .expect("the key is free once the first is removed");
    children.committed("c2").await;
    assert_eq!(journal.count("install:again@c2"), 1);
    assert_eq!(journal.count("install:first@c2"), 0);

    drop(again);
    let _last = registry
        .register_keyed("cap", journal.contribution("last"))
        .expect("the key is free once the registration is dropped");
    drop(first);
    children.finish().await;
}

/// spec: §2.14.12 (Rust addition: keyed contributions) — unkeyed registrations neither hold nor
/// check a key, and a different key is independent: all of them install beside the keyed one.
#[tokio::test]
async fn set_keyed_registration_leaves_unkeyed_and_other_keys_alone() {
    let mut children = Children::new().await;
    let (registry, journal) = (children.registry.clone(), children.journal.clone());
    let _keyed = registry
        .register_keyed("cap", journal.contribution("keyed"))
        .expect("registered");
    let unkeyed = children.register("plain");
    assert_eq!(unkeyed.key(), None);
    let _twice = children.register("plain2");
    let _other = registry
        .register_keyed("other", journal.contribution("other"))
        .expect("another key is independent");
    children.committed("c1").await;
    assert_eq!(
        journal.entries(),
        [
            "install:keyed@c1",
            "install:plain@c1",
            "install:plain2@c1",
            "install:other@c1"
        ]
    );
    children.finish().await;
}

/// spec: §2.14.12 (Rust addition: keyed contributions) — through the manager: a refused second
/// keyed registration leaves the first in force, so a continuable child still gets exactly one
/// installation and starts normally.
#[tokio::test(start_paused = true)]
async fn set_keyed_refusal_through_the_manager_keeps_the_first_installing() {
    let host = Host::new(vec![ScriptEntry::hang()]).await;
    let journal = Journal::default();
    let _first = host
        .manager
        .register_continuable_setup_keyed("cap", journal.contribution("first"))
        .expect("registered");
    let refused = host
        .manager
        .register_continuable_setup_keyed("cap", journal.contribution("second"))
        .expect_err("refused");
    assert_eq!(
        refused.code(),
        SubagentErrorCode::SetupAlreadyRegistered,
        "{refused}"
    );
    let (child, _) = host.manager.start_continuable(host.spec("task")).await.unwrap();
    assert!(host.manager.is_resident(&child));
    assert_eq!(journal.entries(), [format!("install:first@{}", child.as_str())]);
    host.finish().await;
    assert_eq!(journal.count("release:first@"), 1);
}
