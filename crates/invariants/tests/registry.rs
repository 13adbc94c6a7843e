//! The invariant registry service (providers §6.1), checklist IREG-123…139.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use agent::{BoxError, EventBus};
use invariants::registry::{ChildInactive, FilterList, INVARIANT_CODE};
use invariants::{
    AsyncInstaller, ConfigError, InstallCx, Installer, InvariantError, InvariantRegistry, Registration,
    RegistryConfig, RegistryError,
};
use tokio::sync::oneshot;

/// The test event every probe listens to.
struct Ping;

/// A registry over `config` providing a ping bus.
fn setup(config: RegistryConfig) -> (InvariantRegistry, EventBus<Ping>) {
    let registry = InvariantRegistry::new(config).expect("valid configuration");
    let bus = EventBus::<Ping>::new();
    registry.provide(bus.clone());
    (registry, bus)
}

fn lists(allow: &[&str], block: &[&str]) -> RegistryConfig {
    RegistryConfig {
        package_allowlist: allow.iter().map(|s| s.to_string()).collect(),
        package_blocklist: block.iter().map(|s| s.to_string()).collect(),
        ..RegistryConfig::default()
    }
}

/// A counter a probe listener bumps.
#[derive(Clone, Default)]
struct Probe(Arc<AtomicUsize>);

impl Probe {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Subscribes `probe` to the ping bus inside the child scope.
fn listen(cx: &InstallCx, probe: &Probe) -> Result<(), BoxError> {
    let bus = cx.service::<EventBus<Ping>>().ok_or("ping bus declared")?;
    let p = probe.clone();
    cx.adopt(bus.on(move |_| {
        p.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }))?;
    Ok(())
}

/// An installer subscribing `probe` to the ping bus.
fn probe_installer(probe: &Probe) -> Installer {
    let probe = probe.clone();
    Installer::new(move |cx| listen(cx, &probe)).inject::<EventBus<Ping>>()
}

fn register_probe(registry: &InvariantRegistry, package: &str, probe: &Probe) -> Registration {
    registry
        .register(package, probe_installer(probe))
        .expect("registered")
}

fn ping(bus: &EventBus<Ping>) {
    bus.emit_for(None, &Ping);
}

/// spec: IREG-123 — direct construction applies the defaults (enabled, empty lists).
#[test]
fn ireg_123_direct_construction_applies_defaults() {
    let config = RegistryConfig::default();
    assert!(config.enabled);
    assert!(config.package_allowlist.is_empty() && config.package_blocklist.is_empty());
    let registry = InvariantRegistry::default();
    assert!(registry.is_enabled());
    let bus = EventBus::<Ping>::new();
    registry.provide(bus.clone());
    let probe = Probe::default();
    let registration = register_probe(&registry, "agent", &probe);
    assert!(registration.is_installed());
    ping(&bus);
    assert_eq!(probe.count(), 1);
}

/// spec: IREG-124 — enabled by default; empty lists admit all and exclude none.
#[test]
fn ireg_124_empty_lists_admit_all() {
    for config in [RegistryConfig::default(), lists(&[], &[])] {
        let (registry, bus) = setup(config);
        let probe = Probe::default();
        let _r = register_probe(&registry, "session", &probe);
        assert!(registry.is_selected("session") && registry.is_selected("@any/thing"));
        ping(&bus);
        assert_eq!(probe.count(), 1);
    }
}

/// spec: IREG-125 — a disabled service still reserves names but runs no installer.
#[test]
fn ireg_125_disabled_reserves_but_runs_nothing() {
    let (registry, bus) = setup(RegistryConfig {
        enabled: false,
        ..RegistryConfig::default()
    });
    let probe = Probe::default();
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let registration = registry
        .register(
            "session",
            Installer::new(move |cx| {
                flag.store(true, Ordering::SeqCst);
                listen(cx, &Probe::default())
            }),
        )
        .unwrap();
    assert!(!registration.is_installed());
    assert!(!ran.load(Ordering::SeqCst), "no installer runs");
    assert!(matches!(
        registry.register("session", Installer::empty()),
        Err(RegistryError::AlreadyRegistered(name)) if name == "session"
    ));
    assert_eq!(
        registry
            .register("session", Installer::empty())
            .unwrap_err()
            .to_string(),
        "invariants: package \"session\" is already registered"
    );
    let _other = register_probe(&registry, "other", &probe);
    ping(&bus);
    assert_eq!(probe.count(), 0);
    drop(registration);
    assert!(!registry.is_reserved("session"));
}

/// spec: IREG-126 — patterns are unanchored, case-sensitive regex sources.
#[test]
fn ireg_126_patterns_are_unanchored_and_case_sensitive() {
    let cases = [
        (&["session"][..], "@scope/session-extra", true),
        (&["^@scope/session$"][..], "@scope/session-extra", false),
        (&["^@scope/session$"][..], "@scope/session", true),
        (&["Session"][..], "@scope/session", false),
    ];
    for (allow, package, selected) in cases {
        let (registry, bus) = setup(lists(allow, &[]));
        let probe = Probe::default();
        let registration = register_probe(&registry, package, &probe);
        ping(&bus);
        assert_eq!(registration.is_installed(), selected, "{allow:?} vs {package}");
        assert_eq!(probe.count(), usize::from(selected));
    }
}

/// spec: IREG-127 — the blocklist overrides the allowlist.
#[test]
fn ireg_127_blocklist_overrides_allowlist() {
    let (registry, bus) = setup(lists(&["^subagent"], &["spawn"]));
    let spawn = Probe::default();
    let fork = Probe::default();
    let _a = register_probe(&registry, "subagent-spawn", &spawn);
    let _b = register_probe(&registry, "subagent-fork", &fork);
    ping(&bus);
    assert_eq!((spawn.count(), fork.count()), (0, 1));
}

/// spec: IREG-128 — zero-match patterns are accepted for packages registered later.
#[test]
fn ireg_128_zero_match_patterns_are_accepted() {
    let (registry, bus) = setup(lists(&["^later-invariants$"], &["^nothing-yet$"]));
    let now = Probe::default();
    let later = Probe::default();
    let _a = register_probe(&registry, "session", &now);
    let _b = register_probe(&registry, "later-invariants", &later);
    ping(&bus);
    assert_eq!((now.count(), later.count()), (0, 1));
}

/// spec: IREG-129 — the same source in both lists resolves to blocked.
#[test]
fn ireg_129_same_source_in_both_lists_is_blocked() {
    let (registry, bus) = setup(lists(&["agent"], &["agent"]));
    let probe = Probe::default();
    let registration = register_probe(&registry, "agent-loop", &probe);
    ping(&bus);
    assert!(!registration.is_installed());
    assert_eq!(probe.count(), 0);
    assert!(registry.is_reserved("agent-loop"));
}

/// spec: IREG-130 — blank, padded, duplicate and invalid filter entries fail startup.
#[test]
fn ireg_130_malformed_filter_entries_fail_startup() {
    let cases: [(RegistryConfig, &str); 8] = [
        (lists(&[""], &[]), "non-blank"),
        (lists(&[" "], &[]), "non-blank"),
        (lists(&[" session"], &[]), "surrounding whitespace"),
        (lists(&[], &["session "]), "surrounding whitespace"),
        (lists(&["session", "session"], &[]), "duplicate regex"),
        (lists(&[], &["agent", "agent"]), "duplicate regex"),
        (lists(&["["], &[]), "invalid regex"),
        (lists(&[], &["("]), "invalid regex"),
    ];
    for (config, message) in cases {
        let err = InvariantRegistry::new(config.clone()).expect_err("startup fails");
        assert!(err.to_string().contains(message), "{config:?}: {err}");
    }
    assert_eq!(
        InvariantRegistry::new(lists(&[], &["agent", "agent"])).unwrap_err(),
        ConfigError::Duplicate {
            list: FilterList::Block,
            entry: "agent".into()
        }
    );
    assert_eq!(
        InvariantRegistry::new(lists(&[" session"], &[]))
            .unwrap_err()
            .to_string(),
        "invariants: package_allowlist entries must have no surrounding whitespace, got \" session\""
    );
}

/// spec: IREG-131 — malformed package names are rejected (and reserve nothing).
#[test]
fn ireg_131_malformed_package_names_are_rejected() {
    let registry = InvariantRegistry::default();
    for name in ["", " ", " package", "pack age", "package\n", "tab\tbed"] {
        let err = registry
            .register(name, Installer::empty())
            .expect_err("malformed");
        assert!(matches!(err, RegistryError::MalformedName(ref n) if n == name));
        assert!(err.to_string().contains("packageName"), "{err}");
    }
    assert!(!registry.is_reserved(""));
}

/// spec: IREG-132 — installer-declared services are available in its child scope (the Rust
/// equivalent of Cordis `inject`: the installer declares service types; its scope sees exactly
/// those, and a declared service the registry lacks fails the registration).
#[test]
fn ireg_132_declared_services_are_available() {
    #[derive(Clone, Debug, PartialEq)]
    struct ProbeService(&'static str);
    #[derive(Clone)]
    struct Undeclared;
    let registry = InvariantRegistry::default();
    registry.provide(ProbeService("probe"));
    registry.provide(Undeclared);
    let seen = Arc::new(std::sync::Mutex::new(None));
    let out = seen.clone();
    let _r = registry
        .register(
            "probe",
            Installer::new(move |cx| {
                *out.lock().unwrap() = Some((
                    cx.service::<ProbeService>(),
                    cx.service::<Undeclared>().is_some(),
                    cx.package().to_owned(),
                ));
                Ok(())
            })
            .inject::<ProbeService>(),
        )
        .unwrap();
    assert_eq!(
        seen.lock().unwrap().take(),
        Some((Some(ProbeService("probe")), false, "probe".to_owned()))
    );
    struct Missing;
    let err = registry
        .register("needs-missing", Installer::empty().inject::<Missing>())
        .unwrap_err();
    assert!(matches!(err, RegistryError::MissingService { .. }), "{err}");
    assert!(!registry.is_reserved("needs-missing"));
}

/// spec: IREG-133 — failures carry the package name, code `INVARIANT` and the standard prefix.
#[test]
fn ireg_133_failures_are_attributed() {
    let (registry, bus) = setup(RegistryConfig::default());
    let _r = registry
        .register(
            "session",
            Installer::new(|cx| {
                let bus = cx.service::<EventBus<Ping>>().ok_or("declared")?;
                let failure = cx.failure();
                cx.adopt(bus.on(move |_| Err(failure.error("seq must strictly increase").into())))?;
                Ok(())
            })
            .inject::<EventBus<Ping>>(),
        )
        .unwrap();
    let err = bus.try_emit_for(None, &Ping).unwrap_err();
    assert_eq!(
        err.message,
        "invariant violated by \"session\": seq must strictly increase"
    );
    let e = InvariantError::new("session", "seq must strictly increase");
    assert_eq!((e.code(), INVARIANT_CODE), ("INVARIANT", "INVARIANT"));
    assert_eq!(e.package, "session");
    assert_eq!(e.to_string(), err.message);
}

/// spec: IREG-134 — disposal removes listeners and allows re-registration (from fresh state).
#[tokio::test]
async fn ireg_134_disposal_removes_listeners_and_frees_the_name() {
    let (registry, bus) = setup(RegistryConfig::default());
    let first = Probe::default();
    let registration = register_probe(&registry, "session", &first);
    ping(&bus);
    registration.dispose().await;
    assert_eq!(bus.listener_count(), 0);
    ping(&bus);
    assert_eq!(first.count(), 1);
    let second = Probe::default();
    let _again = register_probe(&registry, "session", &second);
    ping(&bus);
    assert_eq!((first.count(), second.count()), (1, 1));
}

/// spec: IREG-135 — the name stays reserved until asynchronous disposal completes.
#[tokio::test]
async fn ireg_135_name_reserved_until_async_disposal_completes() {
    let registry = InvariantRegistry::default();
    let (finish, barrier) = oneshot::channel::<()>();
    let registration = registry
        .register(
            "session",
            Installer::new(move |cx| {
                cx.on_dispose(async move {
                    let _ = barrier.await;
                })?;
                Ok(())
            }),
        )
        .unwrap();
    let disposing = tokio::spawn(registration.dispose());
    tokio::task::yield_now().await;
    assert!(registry.is_reserved("session"));
    assert!(matches!(
        registry.register("session", Installer::empty()),
        Err(RegistryError::AlreadyRegistered(_))
    ));
    finish.send(()).unwrap();
    disposing.await.unwrap();
    assert!(!registry.is_reserved("session"));
    let replacement = registry.register("session", Installer::empty()).unwrap();
    replacement.dispose().await;
}

/// spec: IREG-136 — a failing installer rolls back its listeners and the reservation.
#[test]
fn ireg_136_failing_installer_rolls_back() {
    let (registry, bus) = setup(RegistryConfig::default());
    let leaked = Probe::default();
    let l = leaked.clone();
    let err = registry
        .register(
            "session",
            Installer::new(move |cx| {
                listen(cx, &l)?;
                Err("installer failed".into())
            })
            .inject::<EventBus<Ping>>(),
        )
        .unwrap_err();
    assert!(matches!(err, RegistryError::Installer { .. }));
    assert!(err.to_string().contains("installer failed"), "{err}");
    ping(&bus);
    assert_eq!(leaked.count(), 0);
    assert_eq!(bus.listener_count(), 0);
    let retry = Probe::default();
    let _r = register_probe(&registry, "session", &retry);
    ping(&bus);
    assert_eq!(retry.count(), 1);
}

/// spec: IREG-137 — a failing child-scope publication rolls back its effects and the reservation
/// (Rust equivalent of the Cordis `internal/plugin` hook: [`InvariantRegistry::on_publish`]).
#[test]
fn ireg_137_failing_publication_rolls_back() {
    let (registry, bus) = setup(RegistryConfig::default());
    let leaked = Probe::default();
    let reject = Arc::new(AtomicBool::new(true));
    let (l, r, hook_bus) = (leaked.clone(), reject.clone(), bus.clone());
    let hook = registry.on_publish(move |cx| {
        if !r.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        let l = l.clone();
        cx.adopt(hook_bus.on(move |_| {
            l.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))?;
        Err("publication failed".into())
    });
    let installer_ran = Arc::new(AtomicBool::new(false));
    let flag = installer_ran.clone();
    let err = registry
        .register(
            "publication-probe",
            Installer::new(move |_| {
                flag.store(true, Ordering::SeqCst);
                Ok(())
            }),
        )
        .unwrap_err();
    assert!(matches!(err, RegistryError::Publication { .. }), "{err}");
    assert!(err.to_string().contains("publication failed"));
    assert!(!installer_ran.load(Ordering::SeqCst));
    ping(&bus);
    assert_eq!(leaked.count(), 0);
    drop(hook);
    let retry = registry
        .register("publication-probe", Installer::empty())
        .expect("the name was released");
    drop(retry);
}

/// spec: IREG-138 — an asynchronous installer failure is joined and rolled back.
#[tokio::test]
async fn ireg_138_async_failure_is_joined_and_rolled_back() {
    let (registry, bus) = setup(RegistryConfig::default());
    let leaked = Probe::default();
    let l = leaked.clone();
    let pending = registry.register_async(
        "async-probe",
        AsyncInstaller::new(move |cx: InstallCx| async move {
            listen(&cx, &l)?;
            tokio::task::yield_now().await;
            Err(cx.failure().error("asynchronous check failed").into())
        })
        .inject::<EventBus<Ping>>(),
    );
    // Reserved before the future is even polled.
    assert!(registry.is_reserved("async-probe"));
    let err = pending.await.unwrap_err();
    match &err {
        RegistryError::Installer { source, .. } => {
            let inv = source.downcast_ref::<InvariantError>().expect("the fail() value");
            assert_eq!(inv.message, "asynchronous check failed");
            assert_eq!(inv.package, "async-probe");
        }
        other => panic!("unexpected {other}"),
    }
    ping(&bus);
    assert_eq!(leaked.count(), 0);
    assert!(!registry.is_reserved("async-probe"));
    let retry = registry
        .register_async(
            "async-probe",
            AsyncInstaller::new(|_cx: InstallCx| async {
                tokio::task::yield_now().await;
                Ok(())
            }),
        )
        .await
        .expect("the retry succeeds");
    assert!(retry.is_installed());
    retry.dispose().await;
}

/// spec: IREG-139 — registering on a disposed service fails ("inactive"); disposing the service
/// disposes the registrations it still owns.
#[tokio::test]
async fn ireg_139_registering_on_a_disposed_registry_fails() {
    let (registry, bus) = setup(RegistryConfig::default());
    let probe = Probe::default();
    let kept = register_probe(&registry, "kept", &probe);
    registry.dispose().await;
    assert!(!registry.is_active());
    ping(&bus);
    assert_eq!(probe.count(), 0, "the registry's disposal removed the listener");
    assert!(!registry.is_reserved("kept"));
    let err = registry.register("session", Installer::empty()).unwrap_err();
    assert!(matches!(err, RegistryError::Inactive(_)));
    assert!(err.to_string().contains("inactive"), "{err}");
    assert!(
        registry
            .register_async("session", AsyncInstaller::new(|_cx: InstallCx| async { Ok(()) }))
            .await
            .is_err()
    );
    drop(kept);
}

/// A child scope keeps nothing after disposal: adopting into it undoes the guard at once.
#[tokio::test]
async fn a_disposed_child_scope_refuses_registrations() {
    let (registry, bus) = setup(RegistryConfig::default());
    let kept: Arc<std::sync::Mutex<Option<InstallCx>>> = Arc::default();
    let k = kept.clone();
    let registration = registry
        .register(
            "late",
            Installer::new(move |cx| {
                *k.lock().unwrap() = Some(cx.clone());
                Ok(())
            }),
        )
        .unwrap();
    registration.dispose().await;
    let cx = kept.lock().unwrap().take().unwrap();
    assert!(!cx.is_active());
    let err = cx.adopt(bus.on(|_| Ok(()))).unwrap_err();
    assert_eq!(err, ChildInactive("late".into()));
    assert_eq!(bus.listener_count(), 0);
}

/// Dropping a pending asynchronous registration rolls it back.
#[tokio::test]
async fn dropping_a_pending_async_registration_rolls_back() {
    let (registry, bus) = setup(RegistryConfig::default());
    let probe = Probe::default();
    let p = probe.clone();
    let (_hold, never) = oneshot::channel::<()>();
    let pending = registry.register_async(
        "pending",
        AsyncInstaller::new(move |cx: InstallCx| async move {
            listen(&cx, &p)?;
            let _ = never.await;
            Ok(())
        })
        .inject::<EventBus<Ping>>(),
    );
    let task = tokio::spawn(pending);
    tokio::task::yield_now().await;
    assert_eq!(bus.listener_count(), 1);
    task.abort();
    let _ = task.await;
    assert_eq!(bus.listener_count(), 0);
    assert!(!registry.is_reserved("pending"));
}
