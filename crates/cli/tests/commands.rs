//! The `subagent` binary: `demo`, `agents`, `log`, `check` and the error paths (one line on
//! stderr, non-zero exit, no panic).

use std::path::Path;
use std::process::{Command, Output};

fn subagent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_subagent"))
        .args(args)
        .env_remove("SUBAGENT_BASE_URL")
        .env_remove("SUBAGENT_API_KEY")
        .env_remove("SUBAGENT_MODEL")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A user error: exit code 2, exactly one line on stderr starting `subagent: `, no panic.
fn assert_user_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line on stderr, got: {err}");
    assert!(err.starts_with("subagent: "), "{err}");
    assert!(err.contains(needle), "{err:?} should contain {needle:?}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Runs the demo into `dir` and returns the coordinator id it reports.
fn demo_into(dir: &Path) -> String {
    let out = subagent(&["demo", "--store", dir.to_str().expect("utf-8 path")]);
    let text = stdout(&out);
    assert!(out.status.success(), "demo failed: {}\n{text}", stderr(&out));
    // A clean run logs nothing: the warnings subscriber `demo` installs stays quiet.
    assert_eq!(stderr(&out), "", "a clean demo writes nothing on stderr");
    assert!(text.contains("spawn \"survey the crates\""), "{text}");
    assert!(text.contains("fork \"review the briefing\""), "{text}");
    assert!(text.contains("background job subagent-1"), "{text}");
    assert!(
        text.contains("Final answer:\nHere is the briefing, reviewed. "),
        "{text}"
    );
    text.lines()
        .find_map(|l| l.strip_prefix("Session logs: "))
        .and_then(|l| l.split("(coordinator ").nth(1))
        .and_then(|l| l.split(',').next())
        .expect("the demo names its coordinator")
        .to_owned()
}

#[test]
fn demo_then_agents_log_and_check() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().to_str().expect("utf-8 path");
    let coordinator = demo_into(dir.path());

    let check = subagent(&["check", store]);
    assert!(check.status.success(), "{}{}", stdout(&check), stderr(&check));
    let summary = stdout(&check);
    assert!(summary.starts_with("replayed 5 logs ("), "{summary}");
    assert!(summary.trim_end().ends_with("events): 0 violations"), "{summary}");

    let agents = subagent(&["agents", "--store", store]);
    assert!(agents.status.success(), "{}", stderr(&agents));
    let tree = stdout(&agents);
    let lines: Vec<&str> = tree.lines().collect();
    assert_eq!(lines.len(), 5, "{tree}");
    assert!(
        lines[0].starts_with(&format!(
            "{coordinator}  (top-level)  depth 0  turns 2  last completed"
        )),
        "{tree}"
    );
    let children = &lines[1..];
    assert!(
        children
            .iter()
            .all(|l| l.starts_with("├─ ") || l.starts_with("└─ ")),
        "{tree}"
    );
    assert!(
        children
            .iter()
            .all(|l| l.contains("depth 1  turns 1  last completed")),
        "{tree}"
    );
    assert_eq!(
        children.iter().filter(|l| l.contains("  spawn \"")).count(),
        3,
        "{tree}"
    );
    assert_eq!(
        children
            .iter()
            .filter(|l| l.contains("  fork \"review the briefing\""))
            .count(),
        1,
        "{tree}"
    );
    assert_eq!(
        children
            .iter()
            .filter(|l| l.contains("background job subagent-1"))
            .count(),
        1,
        "{tree}"
    );

    let log = subagent(&["log", &coordinator, "--store", store]);
    assert!(log.status.success(), "{}", stderr(&log));
    let text = stdout(&log);
    assert!(text.starts_with(&format!("session {coordinator}\n")), "{text}");
    assert!(
        text.contains("── turn 1 ──") && text.contains("── turn 2 ended: completed ──"),
        "{text}"
    );
    assert!(
        text.contains("→ subagent [call-crates]") && text.contains("→ fork [call-review]"),
        "{text}"
    );
    assert!(text.contains("→ job_output [call-collect]"), "{text}");

    // A fork child's log marks its inherited prefix.
    let fork_id = children
        .iter()
        .find(|l| l.contains("  fork \""))
        .and_then(|l| {
            l.trim_start_matches(['├', '└', '─', ' '])
                .split_whitespace()
                .next()
        })
        .expect("fork child id")
        .to_owned();
    let fork_log = stdout(&subagent(&["log", &fork_id, "--store", store]));
    assert!(
        fork_log.contains("  provider  fork \"review the briefing\""),
        "{fork_log}"
    );
    assert!(fork_log.contains("── end of inherited prefix ──"), "{fork_log}");
    assert!(fork_log.lines().any(|l| l.starts_with("| ")), "{fork_log}");
}

#[test]
fn unknown_session_is_one_line_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().to_str().expect("utf-8 path");
    assert_user_error(
        &subagent(&["log", "no-such-session", "--store", store]),
        "no session `no-such-session`",
    );
    assert_user_error(
        &subagent(&["log", "../escape", "--store", store]),
        "no session `../escape`",
    );
}

#[test]
fn unreadable_store_is_one_line_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing");
    let missing = missing.to_str().expect("utf-8 path");
    assert_user_error(&subagent(&["agents", "--store", missing]), "cannot read store");
    assert_user_error(&subagent(&["log", "x", "--store", missing]), "cannot read store");
    assert_user_error(&subagent(&["check", missing]), "cannot read store");
    let file = dir.path().join("file.txt");
    std::fs::write(&file, "not a store").expect("write");
    assert_user_error(
        &subagent(&["agents", "--store", file.to_str().expect("utf-8")]),
        "not a directory",
    );
}

#[test]
fn empty_store_lists_nothing_and_checks_clean() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().to_str().expect("utf-8 path");
    let agents = subagent(&["agents", "--store", store]);
    assert!(agents.status.success());
    assert!(stdout(&agents).starts_with("no sessions in "));
    let check = subagent(&["check", store]);
    assert!(check.status.success());
    assert_eq!(stdout(&check), "replayed 0 logs (0 events): 0 violations\n");
}

#[test]
fn check_fails_on_violations() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A header, then a turn that ends without having started.
    std::fs::write(
        dir.path().join("broken.jsonl"),
        concat!(
            r#"{"version":0,"id":"broken","createdAt":1}"#,
            "\n",
            r#"{"type":"turn/end","seq":0,"time":1,"data":{"turn":1,"reason":{"kind":"completed"}}}"#,
            "\n"
        ),
    )
    .expect("write");
    let out = subagent(&["check", dir.path().to_str().expect("utf-8")]);
    assert_eq!(out.status.code(), Some(1), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("session \"broken\""), "{text}");
    let summary = text.lines().last().expect("summary");
    assert!(summary.starts_with("replayed 1 logs (1 events): "), "{summary}");
    assert!(!summary.ends_with(" 0 violations"), "{summary}");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("subagent: ") && err.contains("invariant violation"),
        "{err}"
    );
}

#[test]
fn run_without_model_settings_is_one_line_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().to_str().expect("utf-8 path");
    assert_user_error(
        &subagent(&["run", "--store", store, "do it"]),
        "SUBAGENT_BASE_URL",
    );
    assert_user_error(
        &subagent(&[
            "run",
            "--store",
            store,
            "--base-url",
            "http://127.0.0.1:9/v1",
            "do it",
        ]),
        "SUBAGENT_MODEL",
    );
}

/// A missing, malformed, misspelt, oversized or non-regular `--acp-config` file is one user
/// error naming the file, before any store, host or model is touched.
#[test]
fn run_with_a_bad_acp_config_is_one_line_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    let store = store.to_str().expect("utf-8 path");
    let run = |config: &Path| {
        subagent(&[
            "run",
            "--store",
            store,
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--acp-config",
            config.to_str().expect("utf-8 path"),
            "do it",
        ])
    };
    let missing = dir.path().join("missing.json");
    assert_user_error(&run(&missing), "cannot use ACP configuration");
    for (name, text, needle) in [
        ("garbled.json", "{not json", "key must be a string"),
        ("no-command.json", "{}", "missing field `command`"),
        (
            "misspelt.json",
            r#"{"command": "a", "permisions": "allow"}"#,
            "unknown field `permisions`",
        ),
        (
            "bad-policy.json",
            r#"{"command": "a", "permission": "maybe"}"#,
            "unknown variant `maybe`",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        let out = run(&path);
        assert_user_error(&out, needle);
        assert!(stderr(&out).contains(name), "the file is named: {}", stderr(&out));
    }
    // Not a regular file (a directory; on Unix a device, whose endless bytes would exhaust
    // memory), or a file far larger than any configuration: refused, not read.
    assert_user_error(&run(dir.path()), "not a regular file");
    #[cfg(unix)]
    assert_user_error(&run(Path::new("/dev/zero")), "not a regular file");
    let huge = dir.path().join("huge.json");
    let file = std::fs::File::create(&huge).expect("create");
    file.set_len(subagent_cli::host::MAX_ACP_CONFIG_BYTES + 1)
        .expect("sparse length");
    assert_user_error(&run(&huge), "larger than");
    assert!(!dir.path().join("store").exists(), "nothing was stored");
}

/// An `--acp-config` file that parses but is not a configuration — a JSON array, string or
/// number, or an object the provider refuses at load (an empty command, a NUL byte, an
/// environment name with `=`, a zero grace) — is one user error naming the file and the
/// reason, before any store, host or model is touched (never "cannot start the host: cannot
/// register provider acp", which names no file, nor serde's "expected struct AcpConfig with N
/// elements").
#[test]
fn run_with_an_acp_config_that_does_not_load_names_the_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("store");
    let store = store.to_str().expect("utf-8 path");
    let mut wrong = Vec::new();
    for (name, text, needle) in [
        // serde would take these eight values, in field order, as a configuration.
        (
            "array.json",
            r#"["acp", "true", [], null, "reject", {}, 1, 1]"#,
            "must be a JSON object",
        ),
        ("empty-array.json", "[]", "must be a JSON object"),
        ("string.json", r#""my-acp-agent""#, "must be a JSON object"),
        ("null.json", "null", "must be a JSON object"),
        (
            "empty-command.json",
            r#"{"command": ""}"#,
            "config command must not be empty",
        ),
        (
            "nul-arg.json",
            r#"{"command": "a", "args": ["b\u0000c"]}"#,
            "config args[0] must not contain a NUL byte",
        ),
        (
            "env-name.json",
            r#"{"command": "a", "env": {"A=B": "1"}}"#,
            "must be non-empty and contain neither '=' nor a NUL byte",
        ),
        (
            "grace.json",
            r#"{"command": "a", "disposeGraceMs": 0}"#,
            "disposeGraceMs must be a positive finite number",
        ),
        (
            "empty-cwd.json",
            r#"{"command": "a", "cwd": ""}"#,
            "config cwd must not be empty",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        let out = subagent(&[
            "run",
            "--store",
            store,
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--acp-config",
            path.to_str().expect("utf-8 path"),
            "do it",
        ]);
        let err = stderr(&out);
        let one_user_error = out.status.code() == Some(2)
            && err.lines().count() == 1
            && err.starts_with(&format!(
                "subagent: cannot use ACP configuration {}",
                path.display()
            ))
            && err.contains(needle);
        if !one_user_error {
            wrong.push(format!(
                "{name}: {:?} {err:?} (wanted {needle:?})",
                out.status.code()
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(!dir.path().join("store").exists(), "nothing was stored");
}

/// `subagent acp` needs the same model settings as `run`, and says so before serving anything.
#[test]
fn acp_without_model_settings_is_one_line_error() {
    let out = subagent(&["acp"]);
    assert_user_error(&out, "SUBAGENT_BASE_URL");
    assert!(out.stdout.is_empty(), "nothing on the protocol channel");
    assert_user_error(
        &subagent(&["acp", "--base-url", "http://127.0.0.1:9/v1"]),
        "SUBAGENT_MODEL",
    );
}

#[test]
fn run_help_documents_the_environment() {
    let out = subagent(&["run", "--help"]);
    assert!(out.status.success());
    let help = stdout(&out);
    for var in ["SUBAGENT_BASE_URL", "SUBAGENT_API_KEY", "SUBAGENT_MODEL"] {
        assert!(help.contains(var), "{var} missing from:\n{help}");
    }
}

#[test]
fn agents_names_a_log_whose_header_is_damaged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().to_str().expect("utf-8 path");
    std::fs::write(
        dir.path().join("good.jsonl"),
        concat!(r#"{"version":0,"id":"good","createdAt":1}"#, "\n"),
    )
    .expect("write");
    // A crash during creation left an empty file; another log's header was overwritten.
    std::fs::write(dir.path().join("empty.jsonl"), "").expect("write");
    std::fs::write(dir.path().join("garbled.jsonl"), "#not a header\n").expect("write");
    let agents = subagent(&["agents", "--store", store]);
    assert!(agents.status.success(), "{}", stderr(&agents));
    assert!(stdout(&agents).contains("good"), "{}", stdout(&agents));
    let err = stderr(&agents);
    for id in ["empty", "garbled"] {
        assert!(
            err.contains(&format!("skipping unreadable session `{id}`")),
            "{id} is named: {err}"
        );
    }
    assert!(!err.contains("panicked"), "{err}");
}
