//! Continuable setup contributions (spec §2.14.12): optional child-scoped capabilities (the
//! report tool, for one) installed into every continuable child's unpublished scope without the
//! manager knowing their names.
//!
//! The registry joins three owners of every installation — the contribution's registration,
//! the child's scope and the provisioning batch that made it — and releases each installation
//! exactly once, whichever owner gets there first.
//!
//! # Locks
//! Each contribution's own mutex guards its `removed` flag and its live installations; each
//! installation's release closure sits behind its own mutex (taken to release it once); a
//! batch's mutex guards its commit state; the registry's list of contributions has one more.
//! A keyed registration holds the list's mutex while it reads the `removed` flags of the listed
//! contributions (list, then contribution: no path takes them the other way round), so its check
//! and its registration are one step.
//! None is held while host code runs (an installer or a release), so an installer may register
//! or remove contributions — its own included — without deadlocking.

use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Weak};

use agent::bus::{BoxError, panic_message};
use agent::{Ctx, Registration};
use parking_lot::Mutex;

use crate::error::SubagentError;

/// Releases one installation of a [`SetupContribution`]. Called at most once: when the
/// contribution is removed, when the child's scope is disposed, or when the child's setup rolls
/// back — whichever comes first. An error (or a panic, contained) counts as a failed release;
/// see [`ContinuableSetupRegistration::remove`].
pub type SetupRelease = Box<dyn FnOnce() -> Result<(), BoxError> + Send>;

/// Installs one child-scoped capability into a continuable child's unpublished scope (the
/// child's scoped [`Ctx`]: register its tools, prompt sections and hooks there) and returns the
/// release for exactly that installation.
///
/// Called synchronously, inside the child's setup window, after its base composition, for every
/// fresh creation and every cold resume. An error (or a panic, contained) fails the child's
/// creation: the installations already made for that child are released and the error
/// propagates to the start or follow-up that materialized it. It may remove its own or another
/// registration (the child then fails with `ACTIVATION_SETUP_REVOKED`).
pub type SetupContribution = Arc<dyn Fn(&Ctx) -> Result<SetupRelease, BoxError> + Send + Sync>;

/// The manager's setup contributions, in registration order.
#[derive(Default)]
pub(crate) struct SetupRegistry {
    contributions: Mutex<Vec<Arc<Contribution>>>,
}

struct Contribution {
    /// The key it was registered under ([`SetupRegistry::register_keyed`]), if any.
    key: Option<&'static str>,
    install: SetupContribution,
    state: Mutex<ContributionState>,
}

#[derive(Default)]
struct ContributionState {
    removed: bool,
    next: u64,
    /// Every live (unreleased) installation, by a per-contribution number.
    installations: HashMap<u64, Arc<Installation>>,
}

/// One contribution installed into one child.
struct Installation {
    contribution: Weak<Contribution>,
    key: u64,
    /// Weak: the batch owns its installations, not the other way round.
    batch: Weak<Batch>,
    release: Mutex<Option<SetupRelease>>,
}

/// One child's provisioning: its installations, and whether one was released before the commit.
#[derive(Default)]
struct Batch {
    state: Mutex<BatchState>,
    installations: Mutex<Vec<Arc<Installation>>>,
}

#[derive(Default)]
struct BatchState {
    committed: bool,
    invalidated: bool,
}

/// A setup failure described by a message: a contained panic of an installer or a release, or a
/// context without a child scope.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SetupFailure(String);

impl Contribution {
    fn new(key: Option<&'static str>, install: SetupContribution) -> Arc<Self> {
        Arc::new(Self {
            key,
            install,
            state: Mutex::new(ContributionState::default()),
        })
    }
}

impl Installation {
    /// Releases this installation if nobody has: removes it from its contribution's live set,
    /// invalidates an uncommitted batch, then runs the release (outside every lock).
    fn release(&self) -> Result<(), BoxError> {
        let Some(release) = self.release.lock().take() else {
            return Ok(());
        };
        if let Some(contribution) = self.contribution.upgrade() {
            contribution.state.lock().installations.remove(&self.key);
        }
        if let Some(batch) = self.batch.upgrade() {
            let mut batch = batch.state.lock();
            if !batch.committed {
                batch.invalidated = true;
            }
        }
        match catch_unwind(AssertUnwindSafe(release)) {
            Ok(outcome) => outcome,
            Err(panic) => Err(Box::new(SetupFailure(panic_message(&*panic)))),
        }
    }
}

/// Releases every installation in `installations`, attempting each, and reports the failures as
/// one `ACTIVATION_SETUP_RELEASE_FAILED` naming `during`.
fn release_all(installations: &[Arc<Installation>], during: &str) -> Result<(), SubagentError> {
    let failures: Vec<BoxError> = installations.iter().filter_map(|i| i.release().err()).collect();
    if failures.is_empty() {
        return Ok(());
    }
    let failures: Vec<&(dyn std::error::Error + 'static)> = failures.iter().map(|e| &**e as _).collect();
    Err(SubagentError::setup_release_failed(during, &failures))
}

impl SetupRegistry {
    /// Registers `install` after every live contribution.
    pub(crate) fn register(self: &Arc<Self>, install: SetupContribution) -> ContinuableSetupRegistration {
        let contribution = Contribution::new(None, install);
        self.contributions.lock().push(contribution.clone());
        self.registration(contribution)
    }

    /// Registers `install` under `key` after every live contribution, unless a contribution
    /// registered under `key` is still live (not removed): then `SETUP_ALREADY_REGISTERED` and
    /// nothing changes. The check and the registration happen under the list's one lock, so two
    /// concurrent registrations under one key never both succeed.
    pub(crate) fn register_keyed(
        self: &Arc<Self>,
        key: &'static str,
        install: SetupContribution,
    ) -> Result<ContinuableSetupRegistration, SubagentError> {
        let contribution = Contribution::new(Some(key), install);
        {
            let mut contributions = self.contributions.lock();
            // A removed contribution may still be listed for a moment (its removal unlists it
            // after closing it): it no longer holds the key.
            let taken = contributions
                .iter()
                .any(|c| c.key == Some(key) && !c.state.lock().removed);
            if taken {
                return Err(SubagentError::setup_already_registered(key));
            }
            contributions.push(contribution.clone());
        }
        Ok(self.registration(contribution))
    }

    fn registration(self: &Arc<Self>, contribution: Arc<Contribution>) -> ContinuableSetupRegistration {
        ContinuableSetupRegistration {
            registry: Arc::downgrade(self),
            contribution,
        }
    }

    /// Installs every live contribution into the unpublished child `ctx`, in registration order,
    /// and returns the commit the runtime runs just before publication.
    ///
    /// On an installer's failure the installations made here are released (failures of those
    /// releases suppressed: the installer's error is the one that matters) and the error is
    /// returned. Otherwise the child's scope owns a guard that releases this child's
    /// installations when it is disposed, and the commit fails with `ACTIVATION_SETUP_REVOKED`
    /// if any of them was released before it ran.
    pub(crate) fn apply(&self, ctx: &Ctx) -> Result<agent::runtime::Commit, BoxError> {
        let batch = Arc::new(Batch::default());
        // A snapshot: contributions registered from now on affect later children only.
        let contributions = self.contributions.lock().clone();
        for contribution in contributions {
            if contribution.state.lock().removed {
                continue;
            }
            let installed = match catch_unwind(AssertUnwindSafe(|| (contribution.install)(ctx))) {
                Ok(installed) => installed,
                Err(panic) => Err(Box::new(SetupFailure(format!(
                    "a continuable setup contribution panicked: {}",
                    panic_message(&*panic)
                ))) as BoxError),
            };
            let release = match installed {
                Ok(release) => release,
                Err(e) => {
                    let made = std::mem::take(&mut *batch.installations.lock());
                    if let Err(suppressed) = release_all(&made, "setup rollback") {
                        tracing::debug!(error = %suppressed, "continuable setup rollback failed to release installations");
                    }
                    return Err(e);
                }
            };
            let mut state = contribution.state.lock();
            let key = state.next;
            state.next += 1;
            let installation = Arc::new(Installation {
                contribution: Arc::downgrade(&contribution),
                key,
                batch: Arc::downgrade(&batch),
                release: Mutex::new(Some(release)),
            });
            batch.installations.lock().push(installation.clone());
            // The installer may have removed its own registration (or another thread did since
            // the check above): its removal did not see this installation, so release it here.
            if state.removed {
                drop(state);
                if let Err(e) = installation.release() {
                    tracing::warn!(error = %e, "continuable setup installation revoked during setup failed to release");
                }
            } else {
                state.installations.insert(key, installation);
            }
        }
        let owned = batch.clone();
        let guard = Registration::new(move || {
            let installations = std::mem::take(&mut *owned.installations.lock());
            if let Err(e) = release_all(&installations, "child scope disposal") {
                tracing::warn!(error = %e, "continuable child scope disposal failed to release setup installations");
            }
        });
        if let Some(global) = ctx.own(guard)? {
            // No child scope to own it (a global context): nothing would ever release these.
            drop(global);
            return Err(Box::new(SetupFailure(
                "continuable setup contributions need the child's scoped context".to_owned(),
            )));
        }
        Ok(Box::new(move || {
            let mut state = batch.state.lock();
            if state.invalidated {
                return Err(Box::new(SubagentError::setup_revoked()) as BoxError);
            }
            state.committed = true;
            Ok(())
        }))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.contributions.lock().len()
    }
}

/// One registered [`SetupContribution`]. Dropping it removes the contribution (a failed release
/// is then logged); call [`remove`](Self::remove) to see the failure.
#[must_use = "dropping the registration removes the contribution at once"]
pub struct ContinuableSetupRegistration {
    registry: Weak<SetupRegistry>,
    contribution: Arc<Contribution>,
}

impl fmt::Debug for ContinuableSetupRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.contribution.state.lock();
        f.debug_struct("ContinuableSetupRegistration")
            .field("key", &self.contribution.key)
            .field("removed", &state.removed)
            .field("installations", &state.installations.len())
            .finish()
    }
}

impl ContinuableSetupRegistration {
    /// Removes the contribution: closed to new installations first (a child being set up right
    /// now skips it or, if already installed there, fails its commit with
    /// `ACTIVATION_SETUP_REVOKED`), then every installation it still has — in resident children
    /// and in children being provisioned — is released at once, each exactly once.
    ///
    /// Idempotent: a second call does nothing. Every release is attempted; if any failed the
    /// result is one `ACTIVATION_SETUP_RELEASE_FAILED` counting them.
    pub fn remove(&self) -> Result<(), SubagentError> {
        remove(&self.registry, &self.contribution)
    }

    /// Whether [`remove`](Self::remove) has run (from this handle or by dropping it).
    pub fn is_removed(&self) -> bool {
        self.contribution.state.lock().removed
    }

    /// The key the contribution was registered under
    /// ([`register_continuable_setup_keyed`](crate::continuation::ContinuationManager::register_continuable_setup_keyed)),
    /// or `None` for an unkeyed registration. Once the contribution is removed the key is free
    /// again, though this still reports it.
    pub fn key(&self) -> Option<&'static str> {
        self.contribution.key
    }

    /// A handle that removes the contribution too, for an installer that revokes its own
    /// registration: it does not keep the contribution registered.
    pub fn remover(&self) -> ContinuableSetupRemover {
        ContinuableSetupRemover {
            registry: self.registry.clone(),
            contribution: Arc::downgrade(&self.contribution),
        }
    }
}

impl Drop for ContinuableSetupRegistration {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            tracing::warn!(error = %e, "dropping a continuable setup registration failed to release installations");
        }
    }
}

/// A non-owning handle that can remove one contribution (see
/// [`ContinuableSetupRegistration::remover`]). It does nothing once the registration is gone.
#[derive(Clone)]
pub struct ContinuableSetupRemover {
    registry: Weak<SetupRegistry>,
    contribution: Weak<Contribution>,
}

impl fmt::Debug for ContinuableSetupRemover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContinuableSetupRemover").finish_non_exhaustive()
    }
}

impl ContinuableSetupRemover {
    /// Removes the contribution as [`ContinuableSetupRegistration::remove`] does; `Ok` when it is
    /// already gone.
    pub fn remove(&self) -> Result<(), SubagentError> {
        match self.contribution.upgrade() {
            Some(contribution) => remove(&self.registry, &contribution),
            None => Ok(()),
        }
    }
}

/// Closes `contribution` to new installations, unlists it, then releases every installation it
/// still has (oldest first), each exactly once; idempotent.
fn remove(registry: &Weak<SetupRegistry>, contribution: &Arc<Contribution>) -> Result<(), SubagentError> {
    let installations: Vec<Arc<Installation>> = {
        let mut state = contribution.state.lock();
        if state.removed {
            return Ok(());
        }
        state.removed = true;
        let mut live: Vec<_> = state.installations.drain().collect();
        live.sort_unstable_by_key(|(key, _)| *key);
        live.into_iter().map(|(_, installation)| installation).collect()
    };
    if let Some(registry) = registry.upgrade() {
        registry
            .contributions
            .lock()
            .retain(|c| !Arc::ptr_eq(c, contribution));
    }
    release_all(&installations, "contribution removal")
}
