//! Read-only workspace tools for `subagent run`: `read_file`, `list_dir` and `grep`.
//!
//! Every path a model names is resolved against the workspace root (the working directory the
//! host was started in), **canonicalized** (so `..` and symbolic links are followed to their
//! real target) and refused unless the result lies inside the canonical root
//! ([`WorkspaceError::OutsideWorkspace`]). The tools never write. File-system work runs on
//! tokio's blocking pool, never on a runtime thread. A cancelled call, or one whose future is
//! dropped (as the tool pipeline does once the step's signal fires), tells its work to stop:
//! walks check between entries and every read is bounded, so the work ends shortly after. A
//! cancelled call that is still polled answers once its work has ended.
//!
//! Output and memory are bounded: `read_file` reads and returns at most [`MAX_READ_BYTES`], `list_dir` at most
//! [`MAX_DIR_ENTRIES`] entries and `grep` at most [`MAX_GREP_MATCHES`] matching lines (in a walk over a
//! directory, files larger than [`MAX_GREP_FILE_BYTES`] and files that are not UTF-8 text are
//! skipped; a file named by `grep`'s `path` that cannot be searched is an error saying why,
//! never "no matches"). Every
//! model-visible text is in [`crate::model_text`].

use std::fmt;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agent::tools::{ToolContext, ToolDefinition, ToolError, ToolHandler, ToolOutput, codes};
use async_trait::async_trait;
use serde_json::{Map, Value};

use crate::model_text;

/// The most bytes `read_file` returns from one file.
pub const MAX_READ_BYTES: usize = 64 * 1024;
/// The most entries `list_dir` returns.
pub const MAX_DIR_ENTRIES: usize = 500;
/// The most matching lines `grep` returns.
pub const MAX_GREP_MATCHES: usize = 200;
/// Files larger than this are skipped by `grep`.
pub const MAX_GREP_FILE_BYTES: u64 = 1024 * 1024;
/// Directory names `grep` never descends into.
pub const SKIPPED_DIRS: [&str; 4] = [".git", "target", "node_modules", ".subagent"];

/// Tool error code of a path outside the workspace.
pub const OUTSIDE_WORKSPACE: &str = "OUTSIDE_WORKSPACE";
/// Tool error code of a path that does not exist.
pub const NOT_FOUND: &str = "NOT_FOUND";

/// Why a workspace tool refused or failed. Rendered to the model as the tool's error text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkspaceError {
    /// The workspace root itself cannot be resolved.
    #[error("{}", model_text::root_unresolvable(&root.display().to_string(), &source.to_string()))]
    Root {
        /// The root as given.
        root: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The path resolves outside the workspace root.
    #[error("{}", model_text::outside_workspace(path))]
    OutsideWorkspace {
        /// The path as the model gave it.
        path: String,
    },
    /// The path does not exist.
    #[error("{}", model_text::not_found(path))]
    NotFound {
        /// The path as the model gave it.
        path: String,
    },
    /// The path is not a regular file (for `read_file`) or not a directory (for `list_dir`).
    #[error("{}", model_text::wrong_kind(path, expected))]
    WrongKind {
        /// The path as the model gave it.
        path: String,
        /// `file` or `directory`.
        expected: &'static str,
    },
    /// The file is not UTF-8 text.
    #[error("{}", model_text::not_text(path))]
    NotText {
        /// The path as the model gave it.
        path: String,
    },
    /// The file named to `grep` is larger than [`MAX_GREP_FILE_BYTES`].
    #[error("{}", model_text::too_large_to_grep(path, MAX_GREP_FILE_BYTES))]
    TooLargeToGrep {
        /// The path as the model gave it.
        path: String,
    },
    /// Any other I/O failure.
    #[error("{}", model_text::cannot_read(path, &source.to_string()))]
    Io {
        /// The path as the model gave it.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Malformed arguments.
    #[error("{0}")]
    InvalidArgs(String),
    /// The tool call was cancelled; a walk stopped between two entries.
    #[error("{}", model_text::CANCELLED)]
    Cancelled,
}

impl WorkspaceError {
    /// The tool error code this failure is reported with.
    pub fn code(&self) -> &'static str {
        match self {
            Self::OutsideWorkspace { .. } => OUTSIDE_WORKSPACE,
            Self::NotFound { .. } => NOT_FOUND,
            Self::InvalidArgs(_) => codes::INVALID_ARGS,
            Self::Cancelled => codes::CANCELLED,
            _ => codes::FAILED,
        }
    }
}

impl From<WorkspaceError> for ToolError {
    fn from(e: WorkspaceError) -> Self {
        ToolError::new(e.code(), e.to_string())
    }
}

/// A workspace root: the canonical directory every tool path must stay inside.
#[derive(Clone, PartialEq, Eq)]
pub struct Workspace {
    root: Arc<PathBuf>,
}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workspace").field("root", &self.root).finish()
    }
}

/// A directory entry's name as one line of a listing: a name holding a line break or another
/// control character — which could pose as further entries, or as text after the listing — is
/// shown as a quoted, escaped string literal instead.
fn entry_line(name: &str) -> String {
    if name.chars().any(char::is_control) {
        format!("{name:?}")
    } else {
        name.to_owned()
    }
}

impl Workspace {
    /// A workspace rooted at `root` (canonicalized now).
    pub fn new(root: impl AsRef<Path>) -> Result<Self, WorkspaceError> {
        let root = root.as_ref();
        let canonical = fs::canonicalize(root).map_err(|source| WorkspaceError::Root {
            root: root.to_owned(),
            source,
        })?;
        Ok(Self {
            root: Arc::new(canonical),
        })
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves a model-supplied path: relative paths are taken from the root, the result is
    /// canonicalized and must lie inside the root. An empty path or `.` is the root itself.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, WorkspaceError> {
        let given = Path::new(path);
        let joined = if given.is_absolute() {
            given.to_owned()
        } else {
            self.root.join(given)
        };
        let outside = || WorkspaceError::OutsideWorkspace {
            path: path.to_owned(),
        };
        match fs::canonicalize(&joined) {
            Ok(real) if real.starts_with(&*self.root) => Ok(real),
            Ok(_) => Err(outside()),
            // Do not reveal anything about what lies outside the workspace: a path that cannot
            // be resolved is outside when it leaves the root lexically or when the nearest part
            // of it that exists resolves outside (through a symbolic link), whatever the reason
            // it cannot be resolved — otherwise "does not exist", "not a directory" or
            // "permission denied" would tell what exists behind a link that points out.
            Err(_) if !lexically_inside(&self.root, &joined) || !self.resolves_inside(&joined) => {
                Err(outside())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(WorkspaceError::NotFound {
                path: path.to_owned(),
            }),
            Err(source) => Err(WorkspaceError::Io {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Whether the nearest ancestor of `unresolvable` (a path that cannot be canonicalized)
    /// that can be canonicalized lies inside the root.
    fn resolves_inside(&self, unresolvable: &Path) -> bool {
        unresolvable
            .ancestors()
            .skip(1)
            .find_map(|ancestor| fs::canonicalize(ancestor).ok())
            .is_some_and(|real| real.starts_with(&*self.root))
    }

    /// The path relative to the root, for display (`.` for the root).
    pub fn display(&self, real: &Path) -> String {
        match real.strip_prefix(&*self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel.display().to_string(),
            Err(_) => real.display().to_string(),
        }
    }

    /// Reads a UTF-8 file: at most [`MAX_READ_BYTES`] from byte `offset`.
    pub fn read_file(&self, path: &str, offset: u64) -> Result<String, WorkspaceError> {
        let real = self.resolve(path)?;
        let io_err = |source| WorkspaceError::Io {
            path: path.to_owned(),
            source,
        };
        let Some((file, len)) = open_regular(&real).map_err(io_err)? else {
            return Err(WorkspaceError::WrongKind {
                path: path.to_owned(),
                expected: "file",
            });
        };
        // Only the shown window is read, however large the file is.
        let start = offset.min(len);
        let slice = read_window(file, start, MAX_READ_BYTES as u64).map_err(io_err)?;
        let total = len.max(start + slice.len() as u64);
        let Some(text) = window_text(&slice) else {
            // An offset inside a character of a text file: the offset is wrong, not the file.
            let inside = slice
                .iter()
                .take(3)
                .take_while(|&&b| (0x80..0xc0).contains(&b))
                .count();
            if inside > 0 && window_text(&slice[inside..]).is_some() {
                return Err(WorkspaceError::InvalidArgs(model_text::offset_inside_character(
                    path,
                    start,
                    start + inside as u64,
                )));
            }
            return Err(WorkspaceError::NotText {
                path: path.to_owned(),
            });
        };
        let shown = start + text.len() as u64;
        if shown < total {
            Ok(format!(
                "{text}\n{}",
                model_text::read_truncated(start, shown, total)
            ))
        } else {
            Ok(text)
        }
    }

    /// Lists a directory: one entry per line, directories with a trailing `/`, sorted.
    pub fn list_dir(&self, path: &str) -> Result<String, WorkspaceError> {
        self.list_dir_until(path, &AtomicBool::new(false))
    }

    /// [`list_dir`](Self::list_dir), stopping with [`WorkspaceError::Cancelled`] between two
    /// entries once `stop` is set. Memory is bounded by what is shown, not by the directory's
    /// size: only the first [`MAX_DIR_ENTRIES`] names in order are kept while the rest are
    /// counted.
    fn list_dir_until(&self, path: &str, stop: &AtomicBool) -> Result<String, WorkspaceError> {
        let real = self.resolve(path)?;
        let io_err = |source| WorkspaceError::Io {
            path: path.to_owned(),
            source,
        };
        if !fs::metadata(&real).map_err(io_err)?.is_dir() {
            return Err(WorkspaceError::WrongKind {
                path: path.to_owned(),
                expected: "directory",
            });
        }
        // The first `MAX_DIR_ENTRIES` names in order: a max-heap that drops its largest.
        let mut first = std::collections::BinaryHeap::with_capacity(MAX_DIR_ENTRIES + 1);
        let mut total = 0usize;
        for entry in fs::read_dir(&real).map_err(io_err)? {
            if stop.load(Ordering::Relaxed) {
                return Err(WorkspaceError::Cancelled);
            }
            let entry = entry.map_err(io_err)?;
            let mut name = entry_line(&entry.file_name().to_string_lossy());
            if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                name.push('/');
            }
            total += 1;
            first.push(name);
            if first.len() > MAX_DIR_ENTRIES {
                first.pop();
            }
        }
        if total == 0 {
            return Ok(model_text::dir_empty(&self.display(&real)));
        }
        let names = first.into_sorted_vec();
        let mut out = names.join("\n");
        if total > MAX_DIR_ENTRIES {
            out.push('\n');
            out.push_str(&model_text::dir_truncated(MAX_DIR_ENTRIES, total));
        }
        Ok(out)
    }

    /// Searches files under `path` for lines containing `pattern` (a literal string;
    /// case-insensitive when `ignore_case`). Lines read `file:line: text`.
    pub fn grep(&self, pattern: &str, path: &str, ignore_case: bool) -> Result<String, WorkspaceError> {
        self.grep_until(pattern, path, ignore_case, &AtomicBool::new(false))
    }

    /// [`grep`](Self::grep), stopping with [`WorkspaceError::Cancelled`] between two entries
    /// of the walk once `stop` is set.
    fn grep_until(
        &self,
        pattern: &str,
        path: &str,
        ignore_case: bool,
        stop: &AtomicBool,
    ) -> Result<String, WorkspaceError> {
        if pattern.is_empty() {
            return Err(WorkspaceError::InvalidArgs(model_text::EMPTY_PATTERN.to_owned()));
        }
        let real = self.resolve(path)?;
        let needle = if ignore_case {
            pattern.to_lowercase()
        } else {
            pattern.to_owned()
        };
        // A file named by `path` that cannot be searched is an error that says why; inside a
        // walk such files are skipped (see the module docs).
        let named_file = match fs::metadata(&real) {
            Ok(meta) if meta.is_dir() => false,
            Ok(meta) if meta.is_file() => true,
            Ok(_) => {
                return Err(WorkspaceError::WrongKind {
                    path: path.to_owned(),
                    expected: "file or directory",
                });
            }
            Err(source) => {
                return Err(WorkspaceError::Io {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let mut matches = Vec::new();
        let mut truncated = false;
        let mut stack = vec![real];
        'walk: while let Some(current) = stack.pop() {
            if stop.load(Ordering::Relaxed) {
                return Err(WorkspaceError::Cancelled);
            }
            if named_file {
                let text = searchable_text(&current).map_err(|skip| skip.into_error(path))?;
                self.grep_text(
                    &current,
                    &text,
                    &needle,
                    ignore_case,
                    &mut matches,
                    &mut truncated,
                );
                break;
            }
            let Ok(meta) = fs::symlink_metadata(&current) else {
                continue;
            };
            if meta.is_dir() {
                let Ok(entries) = fs::read_dir(&current) else {
                    continue;
                };
                let mut children: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
                children.sort();
                // Depth-first in name order: push in reverse so the first name pops first.
                for child in children.into_iter().rev() {
                    let skip = child
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| SKIPPED_DIRS.contains(&n));
                    if !skip {
                        stack.push(child);
                    }
                }
                continue;
            }
            if !meta.is_file() || meta.len() > MAX_GREP_FILE_BYTES {
                continue;
            }
            let Ok(text) = searchable_text(&current) else {
                continue;
            };
            if self.grep_text(
                &current,
                &text,
                &needle,
                ignore_case,
                &mut matches,
                &mut truncated,
            ) {
                break 'walk;
            }
        }
        if matches.is_empty() {
            return Ok(model_text::no_matches(pattern));
        }
        let mut out = matches.join("\n");
        if truncated {
            out.push('\n');
            out.push_str(&model_text::grep_truncated(MAX_GREP_MATCHES));
        }
        Ok(out)
    }

    /// Adds the lines of `text` (the content of `file`) that contain `needle` to `matches`;
    /// returns `true`, with `truncated` set, once a match beyond [`MAX_GREP_MATCHES`] is found.
    fn grep_text(
        &self,
        file: &Path,
        text: &str,
        needle: &str,
        ignore_case: bool,
        matches: &mut Vec<String>,
        truncated: &mut bool,
    ) -> bool {
        for (i, line) in text.lines().enumerate() {
            let hit = if ignore_case {
                line.to_lowercase().contains(needle)
            } else {
                line.contains(needle)
            };
            if hit {
                if matches.len() == MAX_GREP_MATCHES {
                    *truncated = true;
                    return true;
                }
                let shown: String = line.chars().take(300).collect();
                matches.push(format!("{}:{}: {}", self.display(file), i + 1, shown.trim_end()));
            }
        }
        false
    }
}

/// Why `grep` does not search a file.
enum Unsearchable {
    /// It is no longer a regular file.
    NotFile,
    /// It is larger than [`MAX_GREP_FILE_BYTES`].
    TooLarge,
    /// It is not UTF-8 text.
    NotText,
    /// It cannot be opened or read.
    Io(io::Error),
}

impl Unsearchable {
    /// The failure of a `grep` whose `path` named this file.
    fn into_error(self, path: &str) -> WorkspaceError {
        let path = path.to_owned();
        match self {
            Self::NotFile => WorkspaceError::WrongKind {
                path,
                expected: "file or directory",
            },
            Self::TooLarge => WorkspaceError::TooLargeToGrep { path },
            Self::NotText => WorkspaceError::NotText { path },
            Self::Io(source) => WorkspaceError::Io { path, source },
        }
    }
}

/// The content of `file` for `grep`: a regular file of at most [`MAX_GREP_FILE_BYTES`] of
/// UTF-8 text. Opened and read with bounds: the file may have been replaced or grown since it
/// was looked at.
fn searchable_text(file: &Path) -> Result<String, Unsearchable> {
    let Some((file, _)) = open_regular(file).map_err(Unsearchable::Io)? else {
        return Err(Unsearchable::NotFile);
    };
    let bytes = read_window(file, 0, MAX_GREP_FILE_BYTES + 1).map_err(Unsearchable::Io)?;
    if bytes.len() as u64 > MAX_GREP_FILE_BYTES {
        return Err(Unsearchable::TooLarge);
    }
    String::from_utf8(bytes).map_err(|_| Unsearchable::NotText)
}

/// Whether `path` stays inside `root` once `.` and `..` are applied lexically (used only for a
/// path that does not exist, to choose between "not found" and "outside").
fn lexically_inside(root: &Path, path: &Path) -> bool {
    let mut parts: Vec<Component<'_>> = Vec::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    let normal: PathBuf = parts.iter().collect();
    normal.starts_with(root)
}

fn object(arguments: &Value) -> Result<&Map<String, Value>, WorkspaceError> {
    arguments
        .as_object()
        .ok_or_else(|| WorkspaceError::InvalidArgs(model_text::ARGUMENTS_NOT_OBJECT.to_owned()))
}

fn string_arg<'a>(
    args: &'a Map<String, Value>,
    name: &str,
    default: Option<&'a str>,
) -> Result<&'a str, WorkspaceError> {
    match args.get(name) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => {
            default.ok_or_else(|| WorkspaceError::InvalidArgs(model_text::string_required(name)))
        }
        Some(_) => Err(WorkspaceError::InvalidArgs(model_text::string_expected(name))),
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Read,
    List,
    Grep,
}

struct WorkspaceTool {
    workspace: Workspace,
    kind: Kind,
}

impl WorkspaceTool {
    fn run(
        workspace: &Workspace,
        kind: Kind,
        arguments: &Value,
        stop: &AtomicBool,
    ) -> Result<String, WorkspaceError> {
        let args = object(arguments)?;
        match kind {
            Kind::Read => {
                let path = string_arg(args, "path", None)?;
                let offset = match args.get("offset") {
                    None | Some(Value::Null) => 0,
                    Some(v) => v
                        .as_u64()
                        .ok_or_else(|| WorkspaceError::InvalidArgs(model_text::BAD_OFFSET.to_owned()))?,
                };
                workspace.read_file(path, offset)
            }
            Kind::List => workspace.list_dir_until(string_arg(args, "path", Some("."))?, stop),
            Kind::Grep => {
                let pattern = string_arg(args, "pattern", None)?;
                let path = string_arg(args, "path", Some("."))?;
                let ignore_case = match args.get("ignore_case") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => {
                        return Err(WorkspaceError::InvalidArgs(
                            model_text::BAD_IGNORE_CASE.to_owned(),
                        ));
                    }
                };
                workspace.grep_until(pattern, path, ignore_case, stop)
            }
        }
    }
}

#[async_trait]
impl ToolHandler for WorkspaceTool {
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let workspace = self.workspace.clone();
        let kind = self.kind;
        let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
        let mut work = tokio::task::spawn_blocking({
            let stop = stop.0.clone();
            move || Self::run(&workspace, kind, &arguments, &stop)
        });
        let joined = tokio::select! {
            // A cancelled call answers `CANCELLED`, even when its work is ready too.
            biased;
            () = ctx.signal.cancelled() => {
                // Told to stop, the work ends at its next entry (every read is bounded); a
                // caller that keeps polling gets the answer once it has. (The tool pipeline
                // drops the call instead: `stop` is then raised by its drop.)
                stop.raise();
                let _ = work.await;
                return Err(ToolError::new(codes::CANCELLED, model_text::CANCELLED));
            }
            joined = &mut work => joined,
        };
        match joined {
            Ok(Ok(text)) => Ok(ToolOutput::text(text)),
            Ok(Err(e)) => Err(e.into()),
            Err(join) => Err(ToolError::failed(model_text::tool_task_failed(&join.to_string()))),
        }
    }
}

/// The stop flag of one call's blocking work, raised when the call is cancelled or its future
/// dropped (a blocking task cannot be aborted; this is how it learns that nobody waits for it).
struct StopOnDrop(Arc<AtomicBool>);

impl StopOnDrop {
    fn raise(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.raise();
    }
}

/// The three read-only tools over `workspace`, ready to register in a tool registry.
pub fn workspace_tools(workspace: &Workspace) -> Vec<ToolDefinition> {
    let def = |name: &str, description: &str, parameters: Value, kind: Kind| ToolDefinition {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters,
        concurrency_safe: true,
        handler: Arc::new(WorkspaceTool {
            workspace: workspace.clone(),
            kind,
        }),
    };
    vec![
        def(
            model_text::READ_FILE,
            model_text::READ_FILE_DESCRIPTION,
            model_text::read_file_parameters(),
            Kind::Read,
        ),
        def(
            model_text::LIST_DIR,
            model_text::LIST_DIR_DESCRIPTION,
            model_text::list_dir_parameters(),
            Kind::List,
        ),
        def(
            model_text::GREP,
            model_text::GREP_DESCRIPTION,
            model_text::grep_parameters(),
            Kind::Grep,
        ),
    ]
}

/// Opens `real` for reading if it is a regular file, with its length; `None` for anything else
/// (a directory, a FIFO, a device). The kind is read from the open handle, so a path replaced
/// after the caller looked at it is still caught, and the open never blocks (`O_NONBLOCK`,
/// which has no effect on regular files; a FIFO opened without it waits for a writer).
fn open_regular(real: &Path) -> io::Result<Option<(fs::File, u64)>> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let file = options.open(real)?;
    let meta = file.metadata()?;
    Ok(meta.is_file().then_some((file, meta.len())))
}

/// A window of a file as text: all of it when it is UTF-8, cut back to the last character
/// boundary when its end splits a character; `None` when it is not UTF-8 text (an empty window
/// is the empty text).
fn window_text(window: &[u8]) -> Option<String> {
    match std::str::from_utf8(window) {
        Ok(text) => Some(text.to_owned()),
        Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => {
            Some(String::from_utf8_lossy(&window[..e.valid_up_to()]).into_owned())
        }
        Err(_) => None,
    }
}

/// Reads at most `limit` bytes of `file` from byte `start`.
fn read_window(file: fs::File, start: u64, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::{Read as _, Seek as _};
    let mut file = file;
    file.seek(io::SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().expect("temp dir");
        fs::create_dir_all(dir.path().join("inside/sub")).expect("mkdir");
        fs::write(dir.path().join("inside/a.txt"), "alpha\nbeta\nGamma beta\n").expect("write");
        fs::write(dir.path().join("inside/sub/b.rs"), "fn beta() {}\n").expect("write");
        fs::write(dir.path().join("secret.txt"), "top secret\n").expect("write");
        let ws = Workspace::new(dir.path().join("inside")).expect("workspace");
        (dir, ws)
    }

    #[test]
    fn reads_lists_and_greps_inside() {
        let (_dir, ws) = fixture();
        assert_eq!(
            ws.read_file("a.txt", 0).expect("read"),
            "alpha\nbeta\nGamma beta\n"
        );
        assert_eq!(ws.read_file("a.txt", 6).expect("read"), "beta\nGamma beta\n");
        assert_eq!(ws.list_dir(".").expect("list"), "a.txt\nsub/");
        assert_eq!(
            ws.grep("beta", ".", false).expect("grep"),
            "a.txt:2: beta\na.txt:3: Gamma beta\nsub/b.rs:1: fn beta() {}"
        );
        assert_eq!(ws.grep("gamma", ".", true).expect("grep"), "a.txt:3: Gamma beta");
        assert_eq!(
            ws.grep("zeta", "sub", false).expect("grep"),
            "no matches for \"zeta\""
        );
    }

    /// A listing keeps only what it shows: the first `MAX_DIR_ENTRIES` names in order, and the
    /// count of the rest.
    #[test]
    fn a_large_directory_lists_its_first_names_in_order() {
        let (_dir, ws) = fixture();
        let many = ws.root().join("many");
        fs::create_dir(&many).expect("mkdir");
        // Created in reverse order, so the names the listing keeps arrive last.
        for i in (0..MAX_DIR_ENTRIES + 25).rev() {
            fs::write(many.join(format!("f{i:04}")), "").expect("write");
        }
        let listed = ws.list_dir("many").expect("list");
        let lines: Vec<&str> = listed.lines().collect();
        assert_eq!(lines.len(), MAX_DIR_ENTRIES + 1);
        assert_eq!(lines[0], "f0000");
        assert_eq!(lines[MAX_DIR_ENTRIES - 1], format!("f{:04}", MAX_DIR_ENTRIES - 1));
        assert_eq!(
            lines[MAX_DIR_ENTRIES],
            model_text::dir_truncated(MAX_DIR_ENTRIES, MAX_DIR_ENTRIES + 25)
        );
    }

    /// A cancelled call's walk stops between two entries instead of running on.
    #[test]
    fn a_stopped_walk_ends_cancelled() {
        let (_dir, ws) = fixture();
        let stop = AtomicBool::new(true);
        assert!(matches!(
            ws.grep_until("beta", ".", false, &stop),
            Err(WorkspaceError::Cancelled)
        ));
        assert!(matches!(
            ws.list_dir_until(".", &stop),
            Err(WorkspaceError::Cancelled)
        ));
        assert_eq!(WorkspaceError::Cancelled.code(), codes::CANCELLED);
    }

    /// A tool call whose signal is cancelled answers `CANCELLED` once its blocking work has
    /// ended.
    #[tokio::test]
    async fn a_cancelled_call_answers_cancelled_after_its_work_ends() {
        let (_dir, ws) = fixture();
        let tools = workspace_tools(&ws);
        let grep = tools.iter().find(|t| t.name == "grep").expect("grep tool");
        let signal = agent::Signal::cancelled_with(agent::CancelCause::User);
        let execution = Arc::new(agent::tools::ToolExecution {
            id: agent::tools::ExecutionId::next(),
            agent: agent::SessionId::from("agent"),
            call_id: agent::CallId::from("call"),
            name: "grep".to_owned(),
            arguments: serde_json::json!({"pattern": "beta"}),
        });
        let ctx = ToolContext::new(execution, signal);
        let err = grep
            .handler
            .execute(serde_json::json!({"pattern": "beta"}), ctx)
            .await
            .expect_err("cancelled");
        assert_eq!(err.code, codes::CANCELLED);
    }

    /// Dropping a call (as the tool pipeline does on cancellation) raises its work's stop flag.
    #[test]
    fn a_dropped_call_raises_its_stop_flag() {
        let flag = Arc::new(AtomicBool::new(false));
        drop(StopOnDrop(flag.clone()));
        assert!(flag.load(Ordering::Relaxed));
    }

    #[test]
    fn refuses_paths_outside_the_root() {
        let (dir, ws) = fixture();
        for path in [
            "../secret.txt",
            "sub/../../secret.txt",
            "../missing.txt",
            "/etc/hostname",
        ] {
            let err = ws.read_file(path, 0).expect_err(path);
            assert_eq!(err.code(), OUTSIDE_WORKSPACE, "{path}: {err}");
        }
        let absolute = dir.path().join("secret.txt");
        let err = ws
            .read_file(&absolute.display().to_string(), 0)
            .expect_err("absolute outside");
        assert!(matches!(err, WorkspaceError::OutsideWorkspace { .. }));
        assert!(matches!(
            ws.list_dir(".."),
            Err(WorkspaceError::OutsideWorkspace { .. })
        ));
        assert!(matches!(
            ws.grep("secret", "..", false),
            Err(WorkspaceError::OutsideWorkspace { .. })
        ));
        assert!(matches!(
            ws.read_file("nope.txt", 0),
            Err(WorkspaceError::NotFound { .. })
        ));
        assert!(matches!(
            ws.read_file("sub", 0),
            Err(WorkspaceError::WrongKind { .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn refuses_symlinks_that_escape() {
        let (dir, ws) = fixture();
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), ws.root().join("link.txt"))
            .expect("symlink");
        let err = ws.read_file("link.txt", 0).expect_err("escaping symlink");
        assert_eq!(err.code(), OUTSIDE_WORKSPACE);
    }

    /// A symbolic link that points out of the workspace is no oracle for what lies behind it:
    /// every path through it is refused alike, whether what it names exists there, is missing,
    /// or is a file used as a directory.
    #[cfg(unix)]
    #[test]
    fn an_escaping_symlink_reveals_nothing_about_what_lies_outside() {
        let (dir, ws) = fixture();
        std::os::unix::fs::symlink(dir.path(), ws.root().join("out")).expect("symlink");
        for path in [
            "out/secret.txt",
            "out/missing.txt",
            "out/secret.txt/more",
            "out/missing/more",
            "out/inside/../missing.txt",
        ] {
            let err = ws.read_file(path, 0).expect_err(path);
            assert!(
                matches!(err, WorkspaceError::OutsideWorkspace { .. }),
                "read_file {path}: {err:?}"
            );
            let err = ws.list_dir(path).expect_err(path);
            assert!(
                matches!(err, WorkspaceError::OutsideWorkspace { .. }),
                "list_dir {path}: {err:?}"
            );
        }
        // Inside the workspace, a missing path is still "not found".
        assert!(matches!(
            ws.read_file("sub/missing/more.txt", 0),
            Err(WorkspaceError::NotFound { .. })
        ));
        assert!(matches!(
            ws.read_file("out/inside/missing.txt", 0),
            Err(WorkspaceError::NotFound { .. })
        ));
    }

    /// `grep` on one named file that it cannot search says why instead of answering "no
    /// matches" for text it never looked at; a walk over a directory still skips such files.
    #[test]
    fn grep_on_a_named_file_it_cannot_search_says_why() {
        let (_dir, ws) = fixture();
        let limit = usize::try_from(MAX_GREP_FILE_BYTES).expect("limit");
        fs::write(
            ws.root().join("big.log"),
            format!("{}\nneedle\n", "x".repeat(limit)),
        )
        .expect("write");
        fs::write(ws.root().join("latin1.txt"), b"caf\xe9 needle\n").expect("write");
        let err = ws
            .grep("needle", "big.log", false)
            .expect_err("too large to search");
        assert!(matches!(err, WorkspaceError::TooLargeToGrep { .. }), "{err:?}");
        assert!(err.to_string().contains("read_file"), "{err}");
        let err = ws.grep("needle", "latin1.txt", false).expect_err("not text");
        assert!(matches!(err, WorkspaceError::NotText { .. }), "{err:?}");
        assert_eq!(
            ws.grep("needle", ".", false).expect("grep"),
            model_text::no_matches("needle")
        );
        assert_eq!(
            ws.grep("beta", "a.txt", false).expect("grep"),
            "a.txt:2: beta\na.txt:3: Gamma beta"
        );
    }

    /// A huge (sparse) file costs one window to read, not its size: only the shown bytes are
    /// read, and the notice gives the real length.
    #[test]
    fn a_huge_file_is_read_one_window_at_a_time() {
        let (_dir, ws) = fixture();
        let huge: u64 = 1 << 40;
        let file = fs::File::create(ws.root().join("huge.bin")).expect("create");
        if file.set_len(huge).is_err() {
            return; // a file system without sparse files of this size: nothing to show here
        }
        let text = ws.read_file("huge.bin", huge - 10).expect("read");
        assert_eq!(
            text,
            "\0".repeat(10),
            "the last ten bytes, and nothing is left to show"
        );
        let text = ws.read_file("huge.bin", 0).expect("read");
        assert!(
            text.ends_with(&format!(
                "[truncated: showed bytes 0..{MAX_READ_BYTES} of {huge}; call read_file again with offset {MAX_READ_BYTES}]"
            )),
            "{}",
            &text[text.len() - 120..]
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_not_a_file_and_reading_it_does_not_block() {
        let (_dir, ws) = fixture();
        let fifo = ws.root().join("pipe.txt");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let err = ws.read_file("pipe.txt", 0).expect_err("a FIFO is no file");
        assert!(matches!(err, WorkspaceError::WrongKind { .. }), "{err:?}");
        let found = ws.grep("anything", ".", false).expect("grep skips it");
        assert!(!found.contains("pipe.txt"), "{found}");
        let err = ws
            .grep("anything", "pipe.txt", false)
            .expect_err("a FIFO is not searched");
        assert!(matches!(err, WorkspaceError::WrongKind { .. }), "{err:?}");
    }

    /// A name holding a line break (or another control character) is listed as one escaped
    /// entry: it cannot pose as further entries of the listing.
    #[cfg(unix)]
    #[test]
    fn a_name_with_a_line_break_is_listed_as_one_escaped_entry() {
        let (_dir, ws) = fixture();
        let sub = ws.root().join("names");
        fs::create_dir(&sub).expect("mkdir");
        fs::write(sub.join("a\nforged.txt"), "x").expect("write");
        fs::write(sub.join("b\x1b[2J.txt"), "x").expect("write");
        fs::write(sub.join("plain.txt"), "x").expect("write");
        let listed = ws.list_dir("names").expect("listed");
        let lines: Vec<&str> = listed.lines().collect();
        assert_eq!(
            lines,
            ["\"a\\nforged.txt\"", "\"b\\u{1b}[2J.txt\"", "plain.txt"],
            "{listed}"
        );
    }

    /// An offset that falls inside a multi-byte character of a UTF-8 file is refused as an
    /// offset, naming the next character boundary, not reported as a file that is not text.
    #[test]
    fn an_offset_inside_a_character_names_the_next_boundary() {
        let (_dir, ws) = fixture();
        // "日本" is six bytes; "é" two.
        fs::write(ws.root().join("ja.txt"), "日本語のテキスト\ncafé\n").expect("write");
        let err = ws.read_file("ja.txt", 1).expect_err("inside 日");
        assert_eq!(err.code(), codes::INVALID_ARGS, "{err}");
        assert_eq!(
            err.to_string(),
            model_text::offset_inside_character("ja.txt", 1, 3)
        );
        let err = ws.read_file("ja.txt", 5).expect_err("inside 本");
        assert_eq!(
            err.to_string(),
            model_text::offset_inside_character("ja.txt", 5, 6)
        );
        assert_eq!(
            ws.read_file("ja.txt", 3).expect("a boundary"),
            "本語のテキスト\ncafé\n"
        );
        // A file that is not text is still named so.
        fs::write(ws.root().join("bin.dat"), b"\x00\x9f\x92\xff\xfe").expect("write");
        assert!(matches!(
            ws.read_file("bin.dat", 2),
            Err(WorkspaceError::NotText { .. })
        ));
    }

    #[test]
    fn read_is_capped() {
        let (_dir, ws) = fixture();
        fs::write(ws.root().join("big.txt"), "x".repeat(MAX_READ_BYTES + 10)).expect("write");
        let text = ws.read_file("big.txt", 0).expect("read");
        assert!(text.ends_with(&format!(
            "[truncated: showed bytes 0..{MAX_READ_BYTES} of {}; call read_file again with offset {MAX_READ_BYTES}]",
            MAX_READ_BYTES + 10
        )));
    }
}
