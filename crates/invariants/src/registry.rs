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

use std::any::{Any, TypeId, type_name};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use agent::BoxError;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use regex::Regex;

/// The stable machine-readable code of every [`InvariantError`].
pub const INVARIANT_CODE: &str = "INVARIANT";

/// Locks a mutex, recovering the data after a panic elsewhere: every critical section in this
/// module leaves its data consistent (plain insertions, removals and `take`s).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// A companion's check failed: the reference's `InvariantError`, attributed to the package that
/// registered the check.
///
/// `Display` is the reference's text, `invariant violated by "<package>": <message>`;
/// [`InvariantError::code`] is always [`INVARIANT_CODE`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invariant violated by \"{package}\": {message}")]
pub struct InvariantError {
    /// The package that registered the violated check.
    pub package: String,
    /// What was violated, without the standard prefix.
    pub message: String,
}

impl InvariantError {
    /// A failure of `package`'s check.
    pub fn new(package: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            package: package.into(),
            message: message.into(),
        }
    }

    /// The stable code, [`INVARIANT_CODE`].
    pub fn code(&self) -> &'static str {
        INVARIANT_CODE
    }
}

/// The reporter an installer receives (the reference's `fail`), bound to the registering
/// package's name. Cheap to clone; hand it to listeners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvariantFailure {
    package: Arc<str>,
}

impl InvariantFailure {
    /// The package failures are attributed to.
    pub fn package(&self) -> &str {
        &self.package
    }

    /// The failure value for `message` (return it as the listener's `Err`).
    pub fn error(&self, message: impl Into<String>) -> InvariantError {
        InvariantError::new(&*self.package, message)
    }

    /// `Err` of [`InvariantFailure::error`], for `return failure.fail("…")`.
    pub fn fail<T>(&self, message: impl Into<String>) -> Result<T, InvariantError> {
        Err(self.error(message))
    }
}

/// Which filter list an invalid entry is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterList {
    /// `package_allowlist`.
    Allow,
    /// `package_blocklist`.
    Block,
}

impl fmt::Display for FilterList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Allow => "package_allowlist",
            Self::Block => "package_blocklist",
        })
    }
}

/// The configuration cannot start a registry (providers §6.1: blank, whitespace-padded,
/// duplicate or invalid filter entries fail startup).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// An entry is empty or only whitespace.
    #[error("invariants: {list} entries must be non-blank, got {entry:?}")]
    Blank {
        /// The list.
        list: FilterList,
        /// The entry.
        entry: String,
    },
    /// An entry has leading or trailing whitespace.
    #[error("invariants: {list} entries must have no surrounding whitespace, got {entry:?}")]
    Padded {
        /// The list.
        list: FilterList,
        /// The entry.
        entry: String,
    },
    /// The same source appears twice in one list.
    #[error("invariants: {list} contains duplicate regex {entry:?}")]
    Duplicate {
        /// The list.
        list: FilterList,
        /// The entry.
        entry: String,
    },
    /// An entry is not a valid regular expression.
    #[error("invariants: {list} contains invalid regex {entry:?}: {reason}")]
    Invalid {
        /// The list.
        list: FilterList,
        /// The entry.
        entry: String,
        /// The parser's message.
        reason: String,
    },
}

/// Why [`InvariantRegistry::register`] (or [`InvariantRegistry::register_async`]) refused.
/// In every case nothing stays registered and the name is free again (once any asynchronous
/// teardown the failed child had registered completes).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// The package name is empty or contains whitespace.
    #[error("invariants: packageName must be non-blank and contain no whitespace, got {0:?}")]
    MalformedName(String),
    /// Another active registration holds the name (even a filtered-out or disabled one, and
    /// one whose disposal has not completed yet).
    #[error("invariants: package \"{0}\" is already registered")]
    AlreadyRegistered(String),
    /// The registry was disposed.
    #[error("invariants: the registry is inactive (disposed); cannot register \"{0}\"")]
    Inactive(String),
    /// The installer declared a service the registry does not provide.
    #[error(
        "invariants: package \"{package}\" declares service `{service}`, which the registry does not provide"
    )]
    MissingService {
        /// The package.
        package: String,
        /// The declared service type.
        service: &'static str,
    },
    /// A publication hook refused the child scope; its effects were rolled back.
    #[error("invariants: publishing the child scope of \"{package}\" failed: {source}")]
    Publication {
        /// The package.
        package: String,
        /// The hook's error.
        #[source]
        source: BoxError,
    },
    /// The installer failed (synchronously or asynchronously); its effects were rolled back.
    #[error("invariants: the installer of \"{package}\" failed: {source}")]
    Installer {
        /// The package.
        package: String,
        /// The installer's error (an [`InvariantError`] when it called `fail`).
        #[source]
        source: BoxError,
    },
}

/// Registering into a child scope that was already disposed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invariants: the child scope of \"{0}\" is inactive: it was disposed")]
pub struct ChildInactive(pub String);

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// The registry's configuration (providers §6.1). [`Default`] is the reference's defaults:
/// enabled, both lists empty (admit every package, exclude none).
///
/// List entries are regular-expression sources in the `regex` crate's syntax, matched
/// **unanchored** and **case-sensitively** against the whole package name (write `^…$` to
/// anchor; `/re/flags` literals are not parsed — an inline `(?i)` group is the Rust way to ask
/// for case-insensitivity). A pattern may match no package yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryConfig {
    /// The global switch. A disabled registry still reserves names but runs no installer.
    pub enabled: bool,
    /// When non-empty, only packages matching at least one entry are selected.
    pub package_allowlist: Vec<String>,
    /// Packages matching any entry are never selected (this wins over the allowlist).
    pub package_blocklist: Vec<String>,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            package_allowlist: Vec::new(),
            package_blocklist: Vec::new(),
        }
    }
}

fn compile(list: FilterList, entries: &[String]) -> Result<Vec<Regex>, ConfigError> {
    let mut out: Vec<Regex> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        if entry.trim().is_empty() {
            return Err(ConfigError::Blank {
                list,
                entry: entry.clone(),
            });
        }
        if entry.trim() != entry {
            return Err(ConfigError::Padded {
                list,
                entry: entry.clone(),
            });
        }
        if entries[..i].contains(entry) {
            return Err(ConfigError::Duplicate {
                list,
                entry: entry.clone(),
            });
        }
        let re = Regex::new(entry).map_err(|e| ConfigError::Invalid {
            list,
            entry: entry.clone(),
            reason: e.to_string(),
        })?;
        out.push(re);
    }
    Ok(out)
}

/// Whether `package` is a well-formed package name: non-empty, no whitespace anywhere.
fn well_formed(package: &str) -> bool {
    !package.is_empty() && !package.chars().any(char::is_whitespace)
}

// ---------------------------------------------------------------------------------------------
// Installers
// ---------------------------------------------------------------------------------------------

type Service = Arc<dyn Any + Send + Sync>;
type Declared = Vec<(TypeId, &'static str)>;
type SyncInstall = Box<dyn FnOnce(&InstallCx) -> Result<(), BoxError> + Send>;
type AsyncInstall = Box<dyn FnOnce(InstallCx) -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// A synchronous installer: installs one package's checks into its child scope.
///
/// The closure receives the child scope; everything it registers must be handed to
/// [`InstallCx::adopt`] (or [`InstallCx::on_dispose`]) so that disposal — or the rollback of a
/// failed installation — undoes it. Returning `Err` fails the registration.
pub struct Installer {
    declared: Declared,
    run: SyncInstall,
}

impl fmt::Debug for Installer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Installer")
            .field("inject", &self.declared.iter().map(|d| d.1).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Installer {
    /// An installer running `install`.
    pub fn new(install: impl FnOnce(&InstallCx) -> Result<(), BoxError> + Send + 'static) -> Self {
        Self {
            declared: Vec::new(),
            run: Box::new(install),
        }
    }

    /// An installer that installs nothing. Companions of packages with no runtime invariant
    /// register one so name reservation and selection behave the same (providers §6.2, §6.7);
    /// keep the justification — "No runtime invariant: …" — next to the call.
    pub fn empty() -> Self {
        Self::new(|_| Ok(()))
    }

    /// Declares that the installer reads the service of type `T` (provided with
    /// [`InvariantRegistry::provide`]); only declared services are visible in its child scope.
    pub fn inject<T: Any + Send + Sync>(mut self) -> Self {
        self.declared.push((TypeId::of::<T>(), type_name::<T>()));
        self
    }
}

/// An asynchronous installer: like [`Installer`], but the installation completes when the
/// returned future does; [`InvariantRegistry::register_async`] joins it before succeeding.
pub struct AsyncInstaller {
    declared: Declared,
    run: AsyncInstall,
}

impl fmt::Debug for AsyncInstaller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncInstaller")
            .field("inject", &self.declared.iter().map(|d| d.1).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl AsyncInstaller {
    /// An installer running `install` to completion.
    pub fn new<F, Fut>(install: F) -> Self
    where
        F: FnOnce(InstallCx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        Self {
            declared: Vec::new(),
            run: Box::new(move |cx| install(cx).boxed()),
        }
    }

    /// Declares a service the installer reads (see [`Installer::inject`]).
    pub fn inject<T: Any + Send + Sync>(mut self) -> Self {
        self.declared.push((TypeId::of::<T>(), type_name::<T>()));
        self
    }
}

// ---------------------------------------------------------------------------------------------
// The child scope
// ---------------------------------------------------------------------------------------------

/// The memoized disposal of one child scope.
type Disposal = Shared<BoxFuture<'static, ()>>;

/// One reservation and its child scope.
struct Child {
    package: Arc<str>,
    /// The declared services, resolved at registration.
    services: HashMap<TypeId, Service>,
    /// Protects the child's registrations; `None` once disposal began.
    state: Mutex<Option<ChildState>>,
    /// The memoized disposal, once begun.
    disposal: Mutex<Option<Disposal>>,
    /// Whether an installer ran (the package was selected).
    installed: bool,
    registry: Weak<RegistryInner>,
}

#[derive(Default)]
struct ChildState {
    guards: Vec<agent::Registration>,
    teardowns: Vec<BoxFuture<'static, ()>>,
}

impl Child {
    /// Begins (or joins) the child's disposal: synchronously undoes every guard in reverse
    /// order, then returns the future that awaits the asynchronous teardowns (in reverse order)
    /// and finally releases the package's reservation.
    fn dispose(self: &Arc<Self>) -> Disposal {
        let (shared, guards) = {
            let mut slot = lock(&self.disposal);
            if let Some(d) = slot.as_ref() {
                return d.clone();
            }
            let ChildState {
                guards,
                mut teardowns,
            } = lock(&self.state).take().unwrap_or_default();
            // Whoever comes first — this call, right below, or a concurrent poll of the
            // disposal — undoes the guards; the name is released only after that.
            let guards = Arc::new(Mutex::new(guards));
            let pending = guards.clone();
            let me = self.clone();
            let fut: BoxFuture<'static, ()> = async move {
                undo_in_reverse(&pending);
                while let Some(t) = teardowns.pop() {
                    t.await;
                }
                if let Some(registry) = me.registry.upgrade() {
                    registry.release(&me);
                }
            }
            .boxed();
            let shared = fut.shared();
            *slot = Some(shared.clone());
            (shared, guards)
        };
        // Undone outside the locks, so a guard's undo may touch this registration safely.
        undo_in_reverse(&guards);
        shared
    }
}

/// Undoes the guards still held, last first.
fn undo_in_reverse(guards: &Mutex<Vec<agent::Registration>>) {
    let mut taken = std::mem::take(&mut *lock(guards));
    while let Some(g) = taken.pop() {
        drop(g);
    }
}

/// Drives a disposal that nobody awaits: to completion at once when it is ready, else on the
/// current tokio runtime; without one the reservation stays until something awaits the
/// disposal (for example [`InvariantRegistry::dispose`]).
fn finish_in_background(disposal: Disposal) {
    if disposal.clone().now_or_never().is_some() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => {
            drop(handle.spawn(disposal));
        }
        Err(_) => tracing::warn!(
            "invariants: a child scope's asynchronous teardown was left pending (no tokio runtime); its name stays reserved until the registry is disposed"
        ),
    }
}

/// A companion's child scope: the registrations its installer (and the publication hooks) made,
/// and the services it declared. Cheap to clone; every clone names the same scope.
///
/// Disposing the scope (through [`Registration`], a failed installation, or the registry's
/// disposal) undoes every adopted guard in reverse order, then awaits every
/// [`on_dispose`](InstallCx::on_dispose) teardown in reverse order; only then is the package
/// name released. Adopting into a disposed scope undoes the guard at once and fails.
#[derive(Clone)]
pub struct InstallCx {
    child: Arc<Child>,
}

impl fmt::Debug for InstallCx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstallCx")
            .field("package", &self.package())
            .field("active", &self.is_active())
            .finish()
    }
}

impl InstallCx {
    /// The package this scope belongs to.
    pub fn package(&self) -> &str {
        &self.child.package
    }

    /// The failure reporter bound to this package (the reference's `fail`).
    pub fn failure(&self) -> InvariantFailure {
        InvariantFailure {
            package: self.child.package.clone(),
        }
    }

    /// A declared service of type `T` (see [`Installer::inject`]); `None` for a type the
    /// installer did not declare, even when the registry provides it.
    pub fn service<T: Any + Clone + Send + Sync>(&self) -> Option<T> {
        self.child
            .services
            .get(&TypeId::of::<T>())
            .and_then(|s| s.downcast_ref::<T>())
            .cloned()
    }

    /// Whether the scope is still active (not disposed).
    pub fn is_active(&self) -> bool {
        lock(&self.child.state).is_some()
    }

    /// Hands `guard` to the scope, which undoes it at disposal. On a disposed scope the guard
    /// is undone at once and [`ChildInactive`] is returned.
    pub fn adopt(&self, guard: agent::Registration) -> Result<(), ChildInactive> {
        let mut state = lock(&self.child.state);
        match state.as_mut() {
            Some(s) => {
                s.guards.push(guard);
                Ok(())
            }
            None => {
                drop(state);
                drop(guard);
                Err(ChildInactive(self.package().to_owned()))
            }
        }
    }

    /// Registers an asynchronous teardown, awaited when the scope is disposed; the package
    /// name stays reserved until it completes. On a disposed scope the teardown is dropped
    /// without running and [`ChildInactive`] is returned.
    pub fn on_dispose(
        &self,
        teardown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ChildInactive> {
        let mut state = lock(&self.child.state);
        match state.as_mut() {
            Some(s) => {
                s.teardowns.push(teardown.boxed());
                Ok(())
            }
            None => Err(ChildInactive(self.package().to_owned())),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// The registry
// ---------------------------------------------------------------------------------------------

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
