//! Every text this crate puts in front of a model, in one place, pinned by `insta` snapshots
//! below:
//!
//! * the read-only workspace tools of `subagent run`: names, descriptions, argument schemas,
//!   truncation notes, and the failures they report (rendered by
//!   [`WorkspaceError`](crate::workspace::WorkspaceError));
//! * the coordinator personas of `subagent run` and `subagent demo`;
//! * the failure that ends a turn at the host's step limit
//!   ([`StepLimit`](crate::host::StepLimit)), which the user, the session log and — as a
//!   failed delegation — a child's parent see.
//!
//! The scripted demo's prompts and canned answers are data of the script itself
//! ([`crate::demo`]); they are what the scripted "model" says, not what a model is shown.

use std::path::Path;

use serde_json::{Value, json};

use crate::host::{FORK_TOOL, SPAWN_TOOL};

/// Name of the file-reading tool.
pub const READ_FILE: &str = "read_file";
/// Name of the directory-listing tool.
pub const LIST_DIR: &str = "list_dir";
/// Name of the search tool.
pub const GREP: &str = "grep";

/// `read_file`'s description.
pub const READ_FILE_DESCRIPTION: &str = "Read a UTF-8 text file of the workspace (the working directory). Paths are relative to the \
     workspace root; paths outside it are refused. Returns at most 64 KiB; pass `offset` to continue.";

/// `list_dir`'s description.
pub const LIST_DIR_DESCRIPTION: &str = "List the entries of a workspace directory (directories end with `/`). Paths outside the \
     workspace are refused.";

/// `grep`'s description.
pub const GREP_DESCRIPTION: &str = "Search the workspace's text files for lines containing a literal string. Returns \
     `file:line: text` rows (at most 200). Skips .git, target and node_modules.";

/// `read_file`'s argument schema.
pub fn read_file_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File path, relative to the workspace root."},
            "offset": {"type": "integer", "minimum": 0, "description": "Byte offset to start from (default 0)."}
        },
        "required": ["path"]
    })
}

/// `list_dir`'s argument schema.
pub fn list_dir_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Directory path, relative to the workspace root (default `.`)."}
        }
    })
}

/// `grep`'s argument schema.
pub fn grep_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "The literal text to find."},
            "path": {"type": "string", "description": "File or directory to search (default `.`)."},
            "ignore_case": {"type": "boolean", "description": "Match case-insensitively (default false)."}
        },
        "required": ["pattern"]
    })
}

// ---- results -------------------------------------------------------------------------------

/// The note after a `read_file` result cut at the byte cap.
pub fn read_truncated(start: u64, shown: u64, total: u64) -> String {
    format!("[truncated: showed bytes {start}..{shown} of {total}; call read_file again with offset {shown}]")
}

/// `list_dir` of an empty directory.
pub fn dir_empty(path: &str) -> String {
    format!("{path} is empty")
}

/// The note after a `list_dir` result cut at the entry cap.
pub fn dir_truncated(shown: usize, total: usize) -> String {
    format!("[truncated: {shown} of {total} entries]")
}

/// `grep` without a match.
pub fn no_matches(pattern: &str) -> String {
    format!("no matches for {pattern:?}")
}

/// The note after a `grep` result cut at the match cap.
pub fn grep_truncated(max: usize) -> String {
    format!("[truncated at {max} matches]")
}

// ---- failures ------------------------------------------------------------------------------

/// A path that resolves outside the workspace.
pub fn outside_workspace(path: &str) -> String {
    format!("path {path:?} is outside the workspace; only paths under the working directory can be read")
}

/// A path that does not exist.
pub fn not_found(path: &str) -> String {
    format!("path {path:?} does not exist")
}

/// A path of the wrong kind (`file` or `directory` expected).
pub fn wrong_kind(path: &str, expected: &str) -> String {
    format!("path {path:?} is not a {expected}")
}

/// A file that is not UTF-8 text.
pub fn not_text(path: &str) -> String {
    format!("file {path:?} is not UTF-8 text")
}

/// A file named to `grep` that is too large to search.
pub fn too_large_to_grep(path: &str, limit: u64) -> String {
    format!(
        "file {path:?} is larger than {limit} bytes, the most grep searches; read it in parts with \
         read_file"
    )
}

/// A `read_file` offset that falls inside a multi-byte character of a text file.
pub fn offset_inside_character(path: &str, offset: u64, next_boundary: u64) -> String {
    format!(
        "`offset` {offset} falls inside a multi-byte character of {path:?}; the next character \
         starts at offset {next_boundary}"
    )
}

/// Any other read failure.
pub fn cannot_read(path: &str, reason: &str) -> String {
    format!("cannot read {path:?}: {reason}")
}

/// The workspace root cannot be resolved.
pub fn root_unresolvable(root: &str, reason: &str) -> String {
    format!("workspace root {root} cannot be resolved: {reason}")
}

/// The arguments are not an object.
pub const ARGUMENTS_NOT_OBJECT: &str = "arguments must be a JSON object";
/// `grep` with an empty pattern.
pub const EMPTY_PATTERN: &str = "grep `pattern` must not be empty";
/// `read_file` with a bad offset.
pub const BAD_OFFSET: &str = "`offset` must be a non-negative integer";
/// `grep` with a non-boolean `ignore_case`.
pub const BAD_IGNORE_CASE: &str = "`ignore_case` must be a boolean";

/// A required string argument is missing.
pub fn string_required(name: &str) -> String {
    format!("`{name}` is required and must be a string")
}

/// A string argument has another type.
pub fn string_expected(name: &str) -> String {
    format!("`{name}` must be a string")
}

/// The tool body was cancelled.
pub const CANCELLED: &str = "cancelled";

/// The blocking task of a tool body failed.
pub fn tool_task_failed(detail: &str) -> String {
    format!("workspace tool failed: {detail}")
}

// ---- limits --------------------------------------------------------------------------------

/// The error that ends a turn about to take model step `limit + 1`.
pub fn step_limit_reached(limit: u32) -> String {
    format!(
        "step limit reached: the turn took {limit} model steps without finishing (the limit is \
         {limit} steps per turn; raise it with --max-steps)"
    )
}

// ---- personas ------------------------------------------------------------------------------

/// The persona of `subagent run`'s coordinator, working in `root`.
pub fn run_persona(root: &Path) -> String {
    format!(
        "You are a careful assistant working in the workspace at {}. You can read it with {READ_FILE}, \
         {LIST_DIR} and {GREP} (read-only; paths outside the workspace are refused). Delegate \
         self-contained subtasks with the `{SPAWN_TOOL}` tool (a fresh subagent that does not see \
         this conversation) and work that builds on this conversation with the `{FORK_TOOL}` tool \
         (a subagent that inherits the completed turns). Independent delegations can go in one \
         message to run in parallel. Finish with a concise answer.",
        root.display()
    )
}

/// The persona of the scripted demo's agents.
pub const DEMO_PERSONA: &str = "You are the coordinator of a small team of subagents. Delegate \
     self-contained work with `subagent`, work that builds on this conversation with `fork`, and \
     long-running work in the background; collect background jobs with `job_output`.";

#[cfg(test)]
mod tests {
    use super::*;

    /// Tool names, descriptions and argument schemas.
    #[test]
    fn workspace_tools_are_pinned() {
        let tools = json!([
            {"name": READ_FILE, "description": READ_FILE_DESCRIPTION, "parameters": read_file_parameters()},
            {"name": LIST_DIR, "description": LIST_DIR_DESCRIPTION, "parameters": list_dir_parameters()},
            {"name": GREP, "description": GREP_DESCRIPTION, "parameters": grep_parameters()},
        ]);
        insta::assert_snapshot!(serde_json::to_string_pretty(&tools).unwrap_or_default());
    }

    /// Results notes and failures.
    #[test]
    fn results_and_failures_are_pinned() {
        let lines = [
            read_truncated(0, 65536, 70000),
            dir_empty("src"),
            dir_truncated(500, 612),
            no_matches("needle"),
            grep_truncated(200),
            outside_workspace("../secret"),
            not_found("missing.txt"),
            wrong_kind("src", "file"),
            not_text("image.png"),
            too_large_to_grep("build.log", 1048576),
            offset_inside_character("notes.md", 65536, 65538),
            cannot_read("locked.txt", "Permission denied (os error 13)"),
            root_unresolvable("/gone", "No such file or directory (os error 2)"),
            ARGUMENTS_NOT_OBJECT.to_owned(),
            EMPTY_PATTERN.to_owned(),
            BAD_OFFSET.to_owned(),
            BAD_IGNORE_CASE.to_owned(),
            string_required("path"),
            string_expected("pattern"),
            CANCELLED.to_owned(),
            tool_task_failed("task panicked"),
            step_limit_reached(50),
        ];
        insta::assert_snapshot!(lines.join("\n"));
    }

    /// Both personas.
    #[test]
    fn personas_are_pinned() {
        insta::assert_snapshot!(format!(
            "{}\n---\n{DEMO_PERSONA}",
            run_persona(Path::new("/home/me/project"))
        ));
    }
}
