//! [`CliError`]: every failure the program reports to its user. Each renders as one line on
//! stderr (`subagent: <message>`) and maps to a non-zero exit code.
//!
//! Messages embed text from outside the program — session ids and reasons read from a store,
//! a model's or server's error text, paths — so every such field is rendered through
//! [`single_line`]: a control character, escape sequence, line break or bidirectional control
//! in it is shown as a visible escape, and the message stays one inert line.

use std::path::{Path, PathBuf};

use crate::terminal_text::single_line;

/// `path` as one inert line of text.
fn path_line(path: &Path) -> String {
    single_line(&path.display().to_string()).into_owned()
}

/// Any displayable value (an I/O error, …) as one inert line of text.
fn text_line(value: &impl std::fmt::Display) -> String {
    single_line(&value.to_string()).into_owned()
}

/// A user-facing failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// The store directory is missing, not a directory, or cannot be listed.
    #[error("cannot read store {}: {}", path_line(dir), single_line(reason))]
    Store {
        /// The store directory.
        dir: PathBuf,
        /// Why.
        reason: String,
    },
    /// No session with this id is stored.
    #[error("no session `{}` in store {}", single_line(id), path_line(dir))]
    UnknownSession {
        /// The requested id.
        id: String,
        /// The store directory.
        dir: PathBuf,
    },
    /// A session log exists but cannot be read.
    #[error("cannot read session `{}`: {}", single_line(id), single_line(reason))]
    UnreadableSession {
        /// The session.
        id: String,
        /// Why.
        reason: String,
    },
    /// `subagent run` lacks a model setting.
    #[error("missing {what}: pass {flag} or set {env} (see `subagent run --help`)")]
    MissingModelSetting {
        /// The setting.
        what: &'static str,
        /// Its flag.
        flag: &'static str,
        /// Its environment variable.
        env: &'static str,
    },
    /// `subagent run` was given an empty (or blank) task.
    #[error("the task is empty: say what the coordinator should do")]
    EmptyTask,
    /// `subagent run --acp-config` named a file that cannot be read or is not an ACP provider
    /// configuration (a JSON object with the spec's keys: `command` required; `args`, `cwd`,
    /// `permission`, `env`, `providerName`, `disposeEofGraceMs`, `disposeGraceMs` and the crate's
    /// `maxOutputBytes` optional).
    #[error("cannot use ACP configuration {}: {}", path_line(path), single_line(reason))]
    AcpConfig {
        /// The configuration file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The host could not be composed.
    #[error("cannot start the host: {}", single_line(.0))]
    Host(String),
    /// The coordinator's run failed.
    #[error("{}", single_line(.0))]
    Run(String),
    /// `subagent check` found violations (already printed).
    #[error("{violations} invariant violation(s) in {}", path_line(dir))]
    Violations {
        /// The store directory.
        dir: PathBuf,
        /// How many.
        violations: usize,
    },
    /// A second Ctrl-C arrived while the program was winding down after the first: it exits
    /// without waiting for the shutdown to finish.
    #[error("interrupted again; exiting without waiting for shutdown")]
    Interrupted,
    /// Standard output was closed by its reader before everything was written
    /// (`subagent agents | head -1`): the program stops writing and exits quietly with 141, the
    /// status a shell reports for a program ended by `SIGPIPE`. Work already done (a run's
    /// session logs) is complete; only output is lost.
    #[error("standard output was closed by its reader")]
    OutputClosed,
    /// An I/O failure writing output or preparing a directory.
    #[error("{}: {}", single_line(context), text_line(source))]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

impl CliError {
    /// The process exit code: 1 for violations found by `check`, 130 (the conventional status
    /// after SIGINT) for [`CliError::Interrupted`], 141 (after SIGPIPE) for
    /// [`CliError::OutputClosed`], 2 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Violations { .. } => 1,
            Self::Interrupted => 130,
            Self::OutputClosed => 141,
            _ => 2,
        }
    }

    /// A failed write to standard output: [`CliError::OutputClosed`] for a closed pipe, an
    /// [`CliError::Io`] otherwise.
    pub fn from_stdout(source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::BrokenPipe {
            Self::OutputClosed
        } else {
            Self::Io {
                context: "cannot write to standard output".to_owned(),
                source,
            }
        }
    }
}
