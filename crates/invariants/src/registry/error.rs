//! The registry's error and failure types.

use std::fmt;
use std::sync::Arc;

use agent::BoxError;

/// The stable machine-readable code of every [`InvariantError`].
pub const INVARIANT_CODE: &str = "INVARIANT";

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
    pub(super) package: Arc<str>,
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

/// Why [`InvariantRegistry::register`](super::InvariantRegistry::register) (or [`InvariantRegistry::register_async`](super::InvariantRegistry::register_async)) refused.
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
