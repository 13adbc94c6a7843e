//! Installers and the child scope each selected companion is installed into.

use std::any::{Any, TypeId, type_name};
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use agent::BoxError;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use super::error::{ChildInactive, InvariantFailure};
use super::{RegistryInner, lock};

pub(super) type Service = Arc<dyn Any + Send + Sync>;
pub(super) type Declared = Vec<(TypeId, &'static str)>;
type SyncInstall = Box<dyn FnOnce(&InstallCx) -> Result<(), BoxError> + Send>;
type AsyncInstall = Box<dyn FnOnce(InstallCx) -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// A synchronous installer: installs one package's checks into its child scope.
///
/// The closure receives the child scope; everything it registers must be handed to
/// [`InstallCx::adopt`] (or [`InstallCx::on_dispose`]) so that disposal — or the rollback of a
/// failed installation — undoes it. Returning `Err` fails the registration.
pub struct Installer {
    pub(super) declared: Declared,
    pub(super) run: SyncInstall,
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
    /// [`InvariantRegistry::provide`](super::InvariantRegistry::provide)); only declared services are visible in its child scope.
    pub fn inject<T: Any + Send + Sync>(mut self) -> Self {
        self.declared.push((TypeId::of::<T>(), type_name::<T>()));
        self
    }
}

/// An asynchronous installer: like [`Installer`], but the installation completes when the
/// returned future does; [`InvariantRegistry::register_async`](super::InvariantRegistry::register_async) joins it before succeeding.
pub struct AsyncInstaller {
    pub(super) declared: Declared,
    pub(super) run: AsyncInstall,
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

/// The memoized disposal of one child scope.
pub(super) type Disposal = Shared<BoxFuture<'static, ()>>;

/// One reservation and its child scope.
pub(super) struct Child {
    pub(super) package: Arc<str>,
    /// The declared services, resolved at registration.
    pub(super) services: HashMap<TypeId, Service>,
    /// Protects the child's registrations; `None` once disposal began.
    pub(super) state: Mutex<Option<ChildState>>,
    /// The memoized disposal, once begun.
    pub(super) disposal: Mutex<Option<Disposal>>,
    /// Whether an installer ran (the package was selected).
    pub(super) installed: bool,
    pub(super) registry: Weak<RegistryInner>,
}

#[derive(Default)]
pub(super) struct ChildState {
    pub(super) guards: Vec<agent::Registration>,
    pub(super) teardowns: Vec<BoxFuture<'static, ()>>,
}

impl Child {
    /// Begins (or joins) the child's disposal: synchronously undoes every guard in reverse
    /// order, then returns the future that awaits the asynchronous teardowns (in reverse order)
    /// and finally releases the package's reservation.
    pub(super) fn dispose(self: &Arc<Self>) -> Disposal {
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
/// disposal (for example [`InvariantRegistry::dispose`](super::InvariantRegistry::dispose)).
pub(super) fn finish_in_background(disposal: Disposal) {
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
/// Disposing the scope (through [`Registration`](super::Registration), a failed installation, or the registry's
/// disposal) undoes every adopted guard in reverse order, then awaits every
/// [`on_dispose`](InstallCx::on_dispose) teardown in reverse order; only then is the package
/// name released. Adopting into a disposed scope undoes the guard at once and fails.
#[derive(Clone)]
pub struct InstallCx {
    pub(super) child: Arc<Child>,
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
