//! [`InvariantRegistry`]: the registry service of providers §6.1, the Rust design's equivalent
//! of the reference's `ctx.invariants`.
//!
//! The registry holds no product check itself. Each package registers one *companion* under its
//! exact package name with an installer; when the package is **selected** by the configuration,
//! the installer runs in a dedicated *child scope* ([`InstallCx`]) that owns every guard it
//! registers there, and the [`Registration`] it returns undoes all of it.
//!
//! What the reference builds on its dependency-injection framework maps as follows:
//!
//! | reference (Cordis) | here |
//! |---|---|
//! | child fiber of the service | [`InstallCx`]: a child scope owning [`agent::Registration`] guards and asynchronous teardowns |
//! | `installer.inject` | [`Installer::inject`]: the installer declares the service *types* it may read; [`InstallCx::service`] sees only those |
//! | `internal/plugin` (child publication) | [`InvariantRegistry::on_publish`]: hooks run when a child scope is published, before its installer; they may register into the child and may fail |
//! | the thenable disposer | [`InvariantRegistry::register`] (synchronous installer, joined before it returns) and [`InvariantRegistry::register_async`] (asynchronous installer, joined by awaiting) |
//! | `fail(message)` throwing `InvariantError` | [`InvariantFailure::fail`] returning an [`InvariantError`] value for the listener to return as its `Err` |
//! | disposing the service fiber | [`InvariantRegistry::dispose`] |
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use agent::EventBus;
//! use invariants::registry::{Installer, InvariantRegistry};
//!
//! struct Ping;
//! let registry = InvariantRegistry::default();
//! let bus = EventBus::<Ping>::new();
//! registry.provide(bus.clone());
//! let heard = Arc::new(AtomicUsize::new(0));
//! let counter = heard.clone();
//! let registration = registry
//!     .register(
//!         "agent",
//!         Installer::new(move |cx| {
//!             let bus = cx.service::<EventBus<Ping>>().expect("declared");
//!             cx.adopt(bus.on(move |_| {
//!                 counter.fetch_add(1, Ordering::SeqCst);
//!                 Ok(())
//!             }))?;
//!             Ok(())
//!         })
//!         .inject::<EventBus<Ping>>(),
//!     )
//!     .unwrap();
//! bus.emit_for(None, &Ping);
//! drop(registration); // removes the listener and releases the name
//! bus.emit_for(None, &Ping);
//! assert_eq!(heard.load(Ordering::SeqCst), 1);
//! assert!(!registry.is_reserved("agent"));
//! ```

mod config;
mod error;
mod scope;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use agent::BoxError;
use regex::Regex;

pub use config::RegistryConfig;
pub use error::{
    ChildInactive, ConfigError, FilterList, INVARIANT_CODE, InvariantError, InvariantFailure, RegistryError,
};
pub use scope::{AsyncInstaller, InstallCx, Installer};

use config::{compile, well_formed};
use scope::{Child, ChildState, Declared, Disposal, Service, finish_in_background};

/// Locks a mutex, recovering the data after a panic elsewhere: every critical section in this
/// module and its children leaves its data consistent (plain insertions, removals and `take`s).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One package's active registration (the reference's disposer).
///
/// [`Registration::dispose`] undoes the child scope's guards at once and completes when its
/// asynchronous teardowns have run and the name is released; disposal is memoized. Dropping
/// the registration starts the same disposal in the background. The registry owns the child
/// scope too: [`InvariantRegistry::dispose`] disposes every registration still active.
#[must_use = "dropping a Registration disposes it immediately"]
pub struct Registration {
    child: Option<Arc<Child>>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("package", &self.child.as_ref().map(|c| &*c.package))
            .field("installed", &self.is_installed())
            .finish()
    }
}

impl Registration {
    /// The registered package name.
    pub fn package(&self) -> &str {
        self.child.as_ref().map_or("", |c| &c.package)
    }

    /// Whether the package was selected and its installer ran (`false` when the registry is
    /// disabled or the filters exclude the package: the name is reserved, nothing installed).
    pub fn is_installed(&self) -> bool {
        self.child.as_ref().is_some_and(|c| c.installed)
    }

    /// Disposes the registration: the child scope's guards are undone before this returns; the
    /// future completes once the asynchronous teardowns ran and the name was released.
    pub fn dispose(mut self) -> impl Future<Output = ()> + Send + 'static {
        let disposal = self.child.take().map(|c| c.dispose());
        async move {
            if let Some(d) = disposal {
                d.await;
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            finish_in_background(child.dispose());
        }
    }
}

/// Disposes a child whose registration did not complete (also when the registering future is
/// dropped).
struct Rollback {
    child: Option<Arc<Child>>,
}

impl Rollback {
    fn into_registration(mut self) -> Registration {
        Registration {
            child: self.child.take(),
        }
    }

    /// Rolls back now and waits for the release.
    async fn run(mut self) {
        if let Some(child) = self.child.take() {
            child.dispose().await;
        }
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            finish_in_background(child.dispose());
        }
    }
}

type PublishHook = Arc<dyn Fn(&InstallCx) -> Result<(), BoxError> + Send + Sync>;

struct RegistryState {
    active: bool,
    /// Every reserved name and its child scope (also the registry's ownership of the scope).
    reserved: HashMap<String, Arc<Child>>,
}

struct RegistryInner {
    enabled: bool,
    allow: Vec<Regex>,
    block: Vec<Regex>,
    services: Mutex<HashMap<TypeId, Service>>,
    hooks: Mutex<Vec<(u64, PublishHook)>>,
    next_hook: std::sync::atomic::AtomicU64,
    state: Mutex<RegistryState>,
}

impl RegistryInner {
    /// Releases `child`'s reservation if it still holds it.
    fn release(&self, child: &Arc<Child>) {
        let mut state = lock(&self.state);
        if state
            .reserved
            .get(&*child.package)
            .is_some_and(|c| Arc::ptr_eq(c, child))
        {
            state.reserved.remove(&*child.package);
        }
    }
}

/// The invariant registry service (providers §6.1). Cheap to clone (shared).
///
/// # Contract
/// * [`new`](Self::new) validates the configuration; [`Default`] applies the defaults.
/// * [`register`](Self::register) validates the name and reserves it **before** anything else
///   runs; the reservation holds while the registration is active, also when the package is
///   filtered out or the registry is disabled, and until its disposal has completed.
/// * A selected package's installer runs in a fresh child scope, after the publication hooks;
///   any failure disposes the scope (its listeners never fire again) and releases the name so
///   a retry succeeds.
/// * After [`dispose`](Self::dispose) the registry is inactive: registering fails.
///
/// Locking: one mutex guards the reservations and the active flag, others the provided
/// services and the publication hooks; none is held while an installer, a hook or a teardown
/// runs.
#[derive(Clone)]
pub struct InvariantRegistry {
    inner: Arc<RegistryInner>,
}

impl Default for InvariantRegistry {
    /// A registry with the default configuration (enabled, empty lists).
    fn default() -> Self {
        Self::new(RegistryConfig::default()).expect("the default configuration is valid")
    }
}

impl fmt::Debug for InvariantRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.inner.state);
        f.debug_struct("InvariantRegistry")
            .field("enabled", &self.inner.enabled)
            .field("active", &state.active)
            .field("reserved", &state.reserved.len())
            .finish()
    }
}

impl InvariantRegistry {
    /// A registry with `config`; fails on a blank, padded, duplicate or invalid filter entry.
    pub fn new(config: RegistryConfig) -> Result<Self, ConfigError> {
        let allow = compile(FilterList::Allow, &config.package_allowlist)?;
        let block = compile(FilterList::Block, &config.package_blocklist)?;
        Ok(Self {
            inner: Arc::new(RegistryInner {
                enabled: config.enabled,
                allow,
                block,
                services: Mutex::new(HashMap::new()),
                hooks: Mutex::new(Vec::new()),
                next_hook: std::sync::atomic::AtomicU64::new(0),
                state: Mutex::new(RegistryState {
                    active: true,
                    reserved: HashMap::new(),
                }),
            }),
        })
    }

    /// Whether the global switch is on.
    pub fn is_enabled(&self) -> bool {
        self.inner.enabled
    }

    /// Whether `package` is selected: the registry is enabled, the allowlist is empty or one of
    /// its patterns matches, and no blocklist pattern matches.
    pub fn is_selected(&self, package: &str) -> bool {
        self.inner.enabled
            && (self.inner.allow.is_empty() || self.inner.allow.iter().any(|re| re.is_match(package)))
            && !self.inner.block.iter().any(|re| re.is_match(package))
    }

    /// Whether a registration (active, or still disposing) holds `package`.
    pub fn is_reserved(&self, package: &str) -> bool {
        lock(&self.inner.state).reserved.contains_key(package)
    }

    /// Whether the registry is still active (not disposed).
    pub fn is_active(&self) -> bool {
        lock(&self.inner.state).active
    }

    /// Provides a service installers can declare (replacing an earlier one of the same type).
    pub fn provide<T: Any + Send + Sync>(&self, service: T) {
        lock(&self.inner.services).insert(TypeId::of::<T>(), Arc::new(service));
    }

    /// Adds a publication hook: it runs for every child scope published from now on, before the
    /// installer, and may register into the child. A failing hook fails the registration, which
    /// disposes the child (rolling back what the hook registered) and releases the name.
    /// Dropping the returned guard removes the hook.
    pub fn on_publish(
        &self,
        hook: impl Fn(&InstallCx) -> Result<(), BoxError> + Send + Sync + 'static,
    ) -> agent::Registration {
        let id = self
            .inner
            .next_hook
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        lock(&self.inner.hooks).push((id, Arc::new(hook)));
        let weak = Arc::downgrade(&self.inner);
        agent::Registration::new(move || {
            if let Some(inner) = weak.upgrade() {
                lock(&inner.hooks).retain(|(i, _)| *i != id);
            }
        })
    }

    /// Validates and reserves `package` and builds its child scope (not yet published).
    fn reserve(&self, package: &str, declared: &Declared) -> Result<Arc<Child>, RegistryError> {
        if !well_formed(package) {
            return Err(RegistryError::MalformedName(package.to_owned()));
        }
        let installed = self.is_selected(package);
        let mut services = HashMap::new();
        if installed {
            let provided = lock(&self.inner.services);
            for (id, name) in declared {
                let service = provided.get(id).ok_or_else(|| RegistryError::MissingService {
                    package: package.to_owned(),
                    service: name,
                })?;
                services.insert(*id, service.clone());
            }
        }
        let child = Arc::new(Child {
            package: Arc::from(package),
            services,
            state: Mutex::new(Some(ChildState::default())),
            disposal: Mutex::new(None),
            installed,
            registry: Arc::downgrade(&self.inner),
        });
        let mut state = lock(&self.inner.state);
        if !state.active {
            return Err(RegistryError::Inactive(package.to_owned()));
        }
        if state.reserved.contains_key(package) {
            return Err(RegistryError::AlreadyRegistered(package.to_owned()));
        }
        state.reserved.insert(package.to_owned(), child.clone());
        Ok(child)
    }

    /// Runs the publication hooks on a freshly reserved child.
    fn publish(&self, cx: &InstallCx) -> Result<(), RegistryError> {
        let hooks: Vec<PublishHook> = lock(&self.inner.hooks).iter().map(|(_, h)| h.clone()).collect();
        for hook in hooks {
            hook(cx).map_err(|source| RegistryError::Publication {
                package: cx.package().to_owned(),
                source,
            })?;
        }
        Ok(())
    }

    /// Registers `package`'s companion with a synchronous installer, joined before this
    /// returns.
    ///
    /// Fails with [`RegistryError::MalformedName`] (nothing reserved),
    /// [`RegistryError::Inactive`], [`RegistryError::AlreadyRegistered`],
    /// [`RegistryError::MissingService`], or — after the child scope was rolled back and the
    /// name released — [`RegistryError::Publication`] / [`RegistryError::Installer`]. When the
    /// package is not selected the name is reserved and nothing runs.
    pub fn register(&self, package: &str, installer: Installer) -> Result<Registration, RegistryError> {
        let child = self.reserve(package, &installer.declared)?;
        let rollback = Rollback {
            child: Some(child.clone()),
        };
        if !child.installed {
            return Ok(rollback.into_registration());
        }
        let cx = InstallCx { child };
        // On failure, dropping `rollback` disposes the child and releases the name (at once,
        // unless a teardown of the child is still pending).
        self.publish(&cx)?;
        (installer.run)(&cx).map_err(|source| RegistryError::Installer {
            package: package.to_owned(),
            source,
        })?;
        Ok(rollback.into_registration())
    }

    /// Registers `package`'s companion with an asynchronous installer.
    ///
    /// Validation and the reservation happen **before** this returns (so a second
    /// registration of the same name fails even while this one is pending); the returned future
    /// joins the installer and resolves to the registration, or to the error after the child
    /// scope's rollback — asynchronous teardowns included — has completed and the name is free.
    /// Dropping the future before it completes rolls back the same way.
    pub fn register_async(
        &self,
        package: &str,
        installer: AsyncInstaller,
    ) -> impl Future<Output = Result<Registration, RegistryError>> + Send + 'static {
        let this = self.clone();
        let package = package.to_owned();
        let reserved = self.reserve(&package, &installer.declared);
        async move {
            let child = reserved?;
            let rollback = Rollback {
                child: Some(child.clone()),
            };
            if !child.installed {
                return Ok(rollback.into_registration());
            }
            let cx = InstallCx { child };
            let installed = match this.publish(&cx) {
                Ok(()) => (installer.run)(cx)
                    .await
                    .map_err(|source| RegistryError::Installer {
                        package: package.clone(),
                        source,
                    }),
                Err(e) => Err(e),
            };
            match installed {
                Ok(()) => Ok(rollback.into_registration()),
                Err(e) => {
                    rollback.run().await;
                    Err(e)
                }
            }
        }
    }

    /// Disposes the registry: it becomes inactive at once (registering fails), and the future
    /// completes when every registration still active has been disposed and released.
    pub fn dispose(&self) -> impl Future<Output = ()> + Send + 'static {
        let children: Vec<Arc<Child>> = {
            let mut state = lock(&self.inner.state);
            state.active = false;
            state.reserved.values().cloned().collect()
        };
        let disposals: Vec<Disposal> = children.iter().map(Child::dispose).collect();
        async move {
            futures::future::join_all(disposals).await;
        }
    }
}
