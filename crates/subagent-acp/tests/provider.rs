//! The `acp` provider end to end against the scripted mock ACP agent (spec `acp-and-tools.md`
//! §1.17).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent::{CancelCause, Signal};
use common::*;
use parking_lot::Mutex;
use subagent::StopReason;
use subagent::error::SubagentErrorCode;
use subagent::events::SubagentEvent;
use subagent::run::SubagentRun;
use subagent::service::StartError;
use subagent_acp::process::TeardownTier;
use subagent_acp::{AcpConfig, AcpProvider, PermissionPolicy, register, register_provider};

async fn start(host: &Host) -> Box<dyn SubagentRun> {
    host.service.start("acp", host.request()).await.expect("started")
}

fn start_message(err: StartError) -> String {
    match err {
        StartError::Subagent(e) => e.message().to_owned(),
        other => panic!("unexpected start error {other}"),
    }
}

async fn start_err(host: &Host) -> String {
    match host.service.start("acp", host.request()).await {
        Ok(_) => panic!("the start must reject"),
        Err(e) => start_message(e),
    }
}

/// Runs the mock with `script` (cwd = a scratch parent cwd) to completion; returns (stop, text).
async fn run_script(script: &[(&str, &str)]) -> (StopReason, String) {
    let dir = scratch();
    let result = run_config(Some(dir.path()), &mock_config(script)).await;
    (result.stop_reason, text(&result.output))
}

/// Registers `config` on a fresh host whose parent works in `cwd`, runs one delegation to its
/// result, disposes it and ends the host (checking it quiescent); the result.
async fn run_config(cwd: Option<&std::path::Path>, config: &AcpConfig) -> subagent::SubagentResult {
    let host = Host::new(cwd).await;
    let _p = register(&host.service, config).unwrap();
    let run = start(&host).await;
    let result = run.result().await.unwrap();
    run.dispose().await.unwrap();
    host.finish().await;
    result
}

/// spec: ACP-21 — streamed text becomes the output with `completed`; the run id is not the
/// child's fixed session id; two `dispose()` calls share one operation; another run gets another
/// id; the child process is gone after disposal.
#[tokio::test]
async fn acp_21_happy_path() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let _p = register(
        &host.service,
        &mock_config(&[
            ("MOCK_TEXT", "hello from the child"),
            ("MOCK_SESSION_ID", "fixed"),
        ]),
    )
    .unwrap();
    let run = start(&host).await;
    assert_ne!(run.id().as_str(), "fixed");
    assert!(run.local_agent().is_none());
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(text(&result.output), "hello from the child");
    assert_eq!(result.diagnostic, None);
    let first = run.dispose();
    let second = run.dispose();
    assert!(first.ptr_eq(&second), "dispose is memoized");
    first.await.unwrap();
    second.await.unwrap();
    let again = start(&host).await;
    assert_ne!(again.id(), run.id());
    assert_ne!(again.id().as_str(), "fixed");
    again.result().await.unwrap();
    again.dispose().await.unwrap();
    host.finish().await;
}

/// spec: ACP-22 — `max_tokens` maps through the full stack to `max-tokens`.
#[tokio::test]
async fn acp_22_max_tokens() {
    let (stop, text) = run_script(&[("MOCK_STOP", "max_tokens")]).await;
    assert_eq!(stop, StopReason::MaxTokens);
    assert_eq!(text, "mock child answer");
}

/// spec: ACP-23 — `refusal` maps through the full stack.
#[tokio::test]
async fn acp_23_refusal() {
    assert_eq!(
        run_script(&[("MOCK_STOP", "refusal")]).await.0,
        StopReason::Refusal
    );
}

/// spec: ACP-1 / ACP-2 through the full stack — `max_turn_requests` and an unknown stop reason
/// end `error`, never `completed`, keeping the streamed text.
#[tokio::test]
async fn acp_2_unknown_and_max_turn_requests_are_error_end_to_end() {
    let (stop, text) = run_script(&[("MOCK_STOP", "max_turn_requests")]).await;
    assert_eq!((stop, text.as_str()), (StopReason::Error, "mock child answer"));
    assert_eq!(
        run_script(&[("MOCK_STOP", "surprise")]).await.0,
        StopReason::Error
    );
}

/// spec: ACP-6 — an explicit `DSH_*` entry in config `env` reaches the child.
#[tokio::test]
async fn acp_6_explicit_dsh_env_reaches_the_child() {
    let (stop, text) = run_script(&[
        ("MOCK_ECHO_ENV", "DSH_PERMISSION_MODE"),
        ("DSH_PERMISSION_MODE", "explicit-mode"),
    ])
    .await;
    assert_eq!((stop, text.as_str()), (StopReason::Completed, "explicit-mode"));
}

/// spec: ACP-5 (end to end) — an ambient secret never reaches the child while an explicit key
/// does. The ambient variable is read from the test process environment as it is: `HOME`/`PATH`
/// survive and a name containing `TOKEN` set only in config survives because it is explicit.
#[tokio::test]
async fn acp_5_explicit_key_survives_end_to_end() {
    let (_, text) = run_script(&[("MOCK_ECHO_ENV", "DEEPSEEK_API_KEY"), ("DEEPSEEK_API_KEY", "k-1")]).await;
    assert_eq!(text, "k-1");
    let (_, path) = run_script(&[("MOCK_ECHO_ENV", "PATH")]).await;
    assert_eq!(
        path,
        std::env::var("PATH").unwrap_or_else(|_| "<PATH unset>".into())
    );
}

/// spec: ACP-11 — without a config cwd the parent session cwd is both the process cwd and the
/// announced session cwd.
#[tokio::test]
async fn acp_11_parent_cwd_fallback() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let _p = register(&host.service, &mock_config(&[("MOCK_ECHO_CWD", "1")])).unwrap();
    let run = start(&host).await;
    let result = run.result().await.unwrap();
    run.dispose().await.unwrap();
    let out = text(&result.output);
    let (real, announced) = out.split_once('\n').expect("two lines");
    assert_eq!(canonical(real), canonical(dir.path()));
    assert_eq!(canonical(announced), canonical(dir.path()));
    host.finish().await;
}

/// spec: ACP-13 — a configured cwd beats the parent cwd for both process and session.
#[tokio::test]
async fn acp_13_config_cwd_override() {
    let parent_dir = scratch();
    let override_dir = scratch();
    let mut config = mock_config(&[("MOCK_ECHO_CWD", "1")]);
    config.cwd = Some(path_str(override_dir.path()));
    let out = text(&run_config(Some(parent_dir.path()), &config).await.output);
    let (real, announced) = out.split_once('\n').unwrap();
    assert_eq!(canonical(real), canonical(override_dir.path()));
    assert_eq!(announced, path_str(override_dir.path()));
}

/// spec: ACP-14 — a relative config cwd is resolved against the launch directory at load; the
/// session gets the absolute form, the process reports its real path.
#[tokio::test]
async fn acp_14_relative_config_cwd() {
    let launch = std::env::current_dir().unwrap();
    let dir = tempfile::tempdir_in(&launch).unwrap();
    let relative = dir.path().strip_prefix(&launch).unwrap().display().to_string();
    let mut config = mock_config(&[("MOCK_ECHO_CWD", "1")]);
    config.cwd = Some(relative);
    let out = text(&run_config(None, &config).await.output);
    let (real, announced) = out.split_once('\n').unwrap();
    assert_eq!(
        announced,
        path_str(&launch.join(dir.path().strip_prefix(&launch).unwrap()))
    );
    assert!(std::path::Path::new(announced).is_absolute());
    assert_eq!(canonical(real), canonical(dir.path()));
}

/// A `touch`-a-sentinel command: proves whether anything was spawned.
fn sentinel_config(sentinel: &std::path::Path) -> AcpConfig {
    let mut config = AcpConfig::new("touch");
    config.args = vec![path_str(sentinel)];
    config
}

/// spec: ACP-12 — neither config cwd nor parent cwd: start rejects with `no working
/// directory` and the command never ran.
#[tokio::test]
async fn acp_12_no_working_directory() {
    let marks = scratch();
    let sentinel = marks.path().join("ran");
    let host = Host::new(None).await;
    let _p = register(&host.service, &sentinel_config(&sentinel)).unwrap();
    let message = start_err(&host).await;
    assert!(
        message.contains("no working directory for the child"),
        "{message}"
    );
    assert!(message.starts_with("subagent-acp: "), "{message}");
    assert!(!sentinel.exists());
    host.finish().await;
}

/// spec: ACP-15 — an empty config cwd fails load with `config cwd must not be empty`.
#[test]
fn acp_15_empty_config_cwd() {
    let mut config = AcpConfig::new(MOCK);
    config.cwd = Some(String::new());
    let err = config.load().unwrap_err().to_string();
    assert!(
        err.starts_with("subagent-acp: config cwd must not be empty"),
        "{err}"
    );
}

/// spec: ACP-16 — (POSIX) a config cwd without search permission fails load with `not an
/// accessible directory` (when the process really cannot enter it: root bypasses the check).
#[cfg(unix)]
#[test]
fn acp_16_unsearchable_config_cwd() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o600)).unwrap();
    let enterable = std::fs::read_dir(locked.join(".")).is_ok();
    let mut config = AcpConfig::new(MOCK);
    config.cwd = Some(path_str(&locked));
    let verdict = config.load();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    if enterable {
        assert!(verdict.is_ok(), "an enterable directory must pass");
    } else {
        let err = verdict.unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "subagent-acp: config cwd is not an accessible directory: {}",
                locked.display()
            )
        );
    }
}

/// spec: ACP-17 — a nonexistent config cwd fails load with `not an accessible directory`.
#[test]
fn acp_17_missing_config_cwd() {
    let dir = scratch();
    let missing = dir.path().join("nope");
    let mut config = AcpConfig::new(MOCK);
    config.cwd = Some(path_str(&missing));
    let err = config.load().unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "subagent-acp: config cwd is not an accessible directory: {}",
            missing.display()
        )
    );
}

/// A parent from a foreign host whose session header carries a relative `cwd` (the reference
/// runtime refuses to create one, so this implements the spine's `Agent` trait directly).
struct ForeignParent {
    id: agent::SessionId,
    options: agent::AgentOptions,
    session: Arc<agent::Session>,
    scope: Arc<agent::Scope>,
}

impl ForeignParent {
    fn with_cwd(cwd: &str) -> agent::AgentRef {
        let id = agent::SessionId::from("foreign-parent");
        let header = agent::SessionHeader {
            version: agent::header::SESSION_FORMAT_VERSION,
            id: id.clone(),
            created_at: 0,
            cwd: Some(cwd.into()),
            parent_session: None,
            seed_length: None,
            origin: None,
            delegation_depth: None,
            agent_preset: None,
        };
        Arc::new(Self {
            scope: Arc::new(agent::Scope::new(id.clone(), None)),
            session: Arc::new(agent::Session::new(header, None).unwrap()),
            options: agent::AgentOptions::default(),
            id,
        })
    }
}

impl agent::Agent for ForeignParent {
    fn id(&self) -> &agent::SessionId {
        &self.id
    }
    fn options(&self) -> &agent::AgentOptions {
        &self.options
    }
    fn session(&self) -> &Arc<agent::Session> {
        &self.session
    }
    fn scope(&self) -> &Arc<agent::Scope> {
        &self.scope
    }
    fn send(
        &self,
        _message: agent::Message,
        _target: agent::InboxTarget,
        _wake: bool,
    ) -> Result<agent::MessageId, agent::AgentError> {
        unreachable!("the provider never sends to its parent")
    }
    fn remove_pending(&self, _id: &agent::MessageId) -> Result<bool, agent::AgentError> {
        Ok(false)
    }
    fn inbox(&self) -> agent::agent::InboxSnapshot {
        agent::agent::InboxSnapshot::default()
    }
    fn cancel(&self, _cause: CancelCause, _options: agent::agent::CancelOptions) {}
    fn status(&self) -> agent::agent::AgentStatus {
        agent::agent::AgentStatus::Idle
    }
    fn when_idle(&self) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async {})
    }
    fn is_live(&self) -> bool {
        true
    }
}

/// spec: ACP-18 — a relative parent cwd rejects start with `must be an absolute path`, before
/// spawning (sentinel absent).
#[tokio::test]
async fn acp_18_relative_parent_cwd() {
    let marks = scratch();
    let sentinel = marks.path().join("ran");
    let host = Host::new(None).await;
    let _p = register(&host.service, &sentinel_config(&sentinel)).unwrap();
    let request = subagent::provider::SubagentStartRequest::new(
        vec![agent::ContentBlock::text("task")],
        ForeignParent::with_cwd("relative/dir"),
        Signal::new(),
    );
    let message = start_message(host.service.start("acp", request).await.err().unwrap());
    assert_eq!(
        message,
        "subagent-acp: parent session cwd must be an absolute path: relative/dir"
    );
    assert!(!sentinel.exists());
    host.finish().await;
}

/// spec: ACP-19 — a parent cwd naming a file rejects with `not an accessible directory`.
#[tokio::test]
async fn acp_19_parent_cwd_is_a_file() {
    let dir = scratch();
    let file = dir.path().join("plain.txt");
    std::fs::write(&file, "x").unwrap();
    let host = Host::new(Some(&file)).await;
    let _p = register(&host.service, &sentinel_config(&dir.path().join("ran"))).unwrap();
    let message = start_err(&host).await;
    assert_eq!(
        message,
        format!(
            "subagent-acp: parent session cwd is not an accessible directory: {}",
            file.display()
        )
    );
    assert!(!dir.path().join("ran").exists());
    host.finish().await;
}

/// spec: ACP-20 — a vanished parent cwd rejects before spawning (sentinel absent).
#[tokio::test]
async fn acp_20_vanished_parent_cwd() {
    let marks = scratch();
    let sentinel = marks.path().join("ran");
    let gone = scratch();
    let gone_path = gone.path().to_path_buf();
    let host = Host::new(Some(&gone_path)).await;
    drop(gone);
    let _p = register(&host.service, &sentinel_config(&sentinel)).unwrap();
    let message = start_err(&host).await;
    assert!(
        message.contains("parent session cwd is not an accessible directory"),
        "{message}"
    );
    assert!(!sentinel.exists());
    host.finish().await;
}

/// spec: ACP-25 — a pre-aborted token rejects `aborted before the ACP child started` and the
/// command never runs.
#[tokio::test]
async fn acp_25_pre_aborted_token() {
    let dir = scratch();
    let sentinel = dir.path().join("ran");
    let host = Host::new(Some(dir.path())).await;
    let _p = register(&host.service, &sentinel_config(&sentinel)).unwrap();
    let signal = Signal::new();
    signal.cancel(CancelCause::User);
    let err = host
        .service
        .start("acp", host.request_with(signal))
        .await
        .err()
        .unwrap();
    let StartError::Subagent(err) = err else {
        panic!("seam error expected")
    };
    assert_eq!(
        err.message(),
        "subagent request was aborted before the ACP child started"
    );
    assert_eq!(err.code(), SubagentErrorCode::Cancelled);
    assert!(!sentinel.exists());
    host.finish().await;
}

/// spec: ACP-24 — aborting the request token mid-prompt (after the ready file appears)
/// settles `aborted` with the partial text; disposal reaps the child.
#[tokio::test]
async fn acp_24_abort_mid_prompt() {
    let dir = scratch();
    let ready = dir.path().join("ready");
    let host = Host::new(Some(dir.path())).await;
    let _p = register(
        &host.service,
        &mock_config(&[("MOCK_HANG", "1"), ("MOCK_READY_FILE", &path_str(&ready))]),
    )
    .unwrap();
    let signal = Signal::new();
    let run = host
        .service
        .start("acp", host.request_with(signal.clone()))
        .await
        .unwrap();
    wait_for(&ready).await;
    signal.cancel(CancelCause::User);
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert_eq!(text(&result.output), "mock child answer");
    assert_eq!(result.diagnostic, None);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: ACP-31 — the request token bridges to `session/cancel`: the child answers
/// `cancelled` and exits on its own at EOF, so teardown ends in tier 1.
#[tokio::test]
async fn acp_31_token_bridges_to_session_cancel() {
    let dir = scratch();
    let ready = dir.path().join("ready");
    let host = Host::new(Some(dir.path())).await;
    let provider = AcpProvider::load(&mock_config(&[
        ("MOCK_HANG", "1"),
        ("MOCK_READY_FILE", &path_str(&ready)),
    ]))
    .unwrap();
    let signal = Signal::new();
    let run = provider
        .start_run(&host.request_with(signal.clone()))
        .await
        .unwrap();
    let pid = run.pid().unwrap();
    wait_for(&ready).await;
    signal.cancel(CancelCause::User);
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    run.dispose().await.unwrap();
    assert!(matches!(
        run.teardown_report(),
        Some(subagent_acp::process::TeardownReport::Exited {
            tier: TeardownTier::Eof,
            ..
        })
    ));
    assert!(!alive(pid));
    host.finish().await;
}

/// spec: ACP-26 — a `session/new` without session id rejects `ACP child published without a
/// session id`, and the EOF-flush marker proves rollback gave the child its EOF window.
#[tokio::test]
async fn acp_26_missing_session_id() {
    let dir = scratch();
    let flushed = dir.path().join("flushed");
    let host = Host::new(Some(dir.path())).await;
    let _p = register(
        &host.service,
        &mock_config(&[
            ("MOCK_MISSING_SESSION_ID", "1"),
            ("MOCK_FLUSH_ON_EOF", &path_str(&flushed)),
        ]),
    )
    .unwrap();
    let message = start_err(&host).await;
    assert_eq!(message, "ACP child published without a session id");
    assert!(flushed.exists(), "the rollback gave the child its EOF window");
    host.finish().await;
}

/// spec: ACP-30 — abort during a gated `session/new` rejects `aborted before the ACP child
/// started`; the prompt is never issued (no ready file) and the child is reaped.
#[tokio::test]
async fn acp_30_abort_during_session_new() {
    let dir = scratch();
    let (gate_ready, gate_go, prompted, pidfile) = (
        dir.path().join("ns-ready"),
        dir.path().join("ns-go"),
        dir.path().join("prompted"),
        dir.path().join("pid"),
    );
    let host = Host::new(Some(dir.path())).await;
    let _p = register(
        &host.service,
        &mock_config(&[
            ("MOCK_NEWSESSION_READY", &path_str(&gate_ready)),
            ("MOCK_NEWSESSION_GO", &path_str(&gate_go)),
            ("MOCK_READY_FILE", &path_str(&prompted)),
            ("MOCK_PID_FILE", &path_str(&pidfile)),
        ]),
    )
    .unwrap();
    let signal = Signal::new();
    let starting = host.service.start("acp", host.request_with(signal.clone()));
    let aborter = async {
        wait_for(&gate_ready).await;
        signal.cancel(CancelCause::User);
    };
    let (outcome, ()) = tokio::join!(starting, aborter);
    let message = start_message(outcome.err().expect("start rejects"));
    assert_eq!(
        message,
        "subagent request was aborted before the ACP child started"
    );
    assert!(!prompted.exists(), "the prompt was never issued");
    let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().parse().unwrap();
    assert!(!alive(pid), "startup rollback reaped the child");
    host.finish().await;
}

/// spec: ACP-26 / ACP-30 (§1.6 rollback, §1.10, §1.11 tier 1) — the request signal fires after
/// the connection task was spawned but before it reported ready: start rejects `aborted before
/// the ACP child started`, no connection task is left, and the rollback closed the child's stdin
/// so the child exited at the EOF tier (its EOF-flush marker exists) rather than waiting out the
/// EOF grace and being SIGTERMed. Deterministic: the test runs on a current-thread runtime and
/// polls the start exactly once (nothing yields before `Connection` is spawned and then awaits its
/// readiness), so the cancel lands before the connection task's first poll.
#[tokio::test]
async fn abort_between_connection_spawn_and_ready_rolls_back_at_the_eof_tier() {
    let dir = scratch();
    let (flushed, pidfile) = (dir.path().join("flushed"), dir.path().join("pid"));
    let host = Host::new(Some(dir.path())).await;
    let provider = AcpProvider::load(&mock_config(&[
        ("MOCK_FLUSH_ON_EOF", &path_str(&flushed)),
        ("MOCK_FLUSH_DELAY_MS", "0"),
        ("MOCK_PID_FILE", &path_str(&pidfile)),
    ]))
    .unwrap();
    let signal = Signal::new();
    let request = host.request_with(signal.clone());
    let runtime = tokio::runtime::Handle::current();
    let baseline = runtime.metrics().num_alive_tasks();
    let outcome = {
        let mut starting = std::pin::pin!(provider.start_run(&request));
        assert!(
            futures::poll!(&mut starting).is_pending(),
            "the start waits for the connection"
        );
        assert!(
            runtime.metrics().num_alive_tasks() > baseline,
            "the connection task was spawned"
        );
        signal.cancel(CancelCause::User);
        tokio::time::timeout(BOUND, starting)
            .await
            .expect("the rollback ends")
    };
    let message = outcome.expect_err("start rejects").to_string();
    assert_eq!(
        message,
        "subagent request was aborted before the ACP child started"
    );
    assert!(
        flushed.exists(),
        "the rollback closed the child's stdin: it exited at the EOF tier"
    );
    let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().parse().unwrap();
    assert!(!alive(pid), "startup rollback reaped the child");
    assert_eq!(
        runtime.metrics().num_alive_tasks(),
        baseline,
        "no connection or teardown task outlives the rejected start"
    );
    host.finish().await;
}

/// spec: ACP-32 — default reject policy: the child asks permission, gets `cancelled`, returns
/// cancelled → `aborted`.
#[tokio::test]
async fn acp_32_default_reject_policy() {
    let (stop, text) = run_script(&[("MOCK_PERMISSION", "1")]).await;
    assert_eq!(stop, StopReason::Aborted);
    assert_eq!(text, "mock child answer");
}

/// spec: ACP-33 — the allow policy approves via the allow option → `completed` with the
/// child's text.
#[tokio::test]
async fn acp_33_allow_policy() {
    let dir = scratch();
    let mut config = mock_config(&[("MOCK_PERMISSION", "1")]);
    config.permission = PermissionPolicy::Allow;
    let result = run_config(Some(dir.path()), &config).await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(text(&result.output), "mock child answer (permitted)");
}

/// spec: ACP-50 — with `permission: allow` the child acts in the configured cwd: it asks
/// permission, is granted it, and writes `proof.txt` there, which the test reads back
/// independently (nothing lands in the parent's cwd). Rust form, keyless: upstream's real
/// agent writes the file with its bash tool on a model key; here the scripted mock writes it
/// once the provider's policy has granted the request.
#[tokio::test]
async fn acp_50_allowed_child_writes_in_the_configured_cwd() {
    let parent_dir = scratch();
    let configured = scratch();
    let mut config = mock_config(&[("MOCK_PERMISSION", "1"), ("MOCK_WRITE_FILE", "proof.txt")]);
    config.permission = PermissionPolicy::Allow;
    config.cwd = Some(path_str(configured.path()));
    let result = run_config(Some(parent_dir.path()), &config).await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(
        std::fs::read_to_string(configured.path().join("proof.txt")).expect("the proof was written"),
        "proof"
    );
    assert!(!parent_dir.path().join("proof.txt").exists());

    // Under the default reject policy the same child writes nothing.
    let refused = scratch();
    let mut config = mock_config(&[("MOCK_PERMISSION", "1"), ("MOCK_WRITE_FILE", "proof.txt")]);
    config.cwd = Some(path_str(refused.path()));
    let result = run_config(Some(parent_dir.path()), &config).await;
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert!(!refused.path().join("proof.txt").exists());
}

/// spec: ACP-24 / ACP-31 with ACP-33 (§1.8, §1.10, §2.6) — once the run was cancelled, the
/// `allow` policy no longer approves anything: a permission request the child sends after
/// `session/cancel` (a tool call racing the cancellation, before teardown ends the child) is
/// answered `cancelled`, as ACP requires of a client that cancelled the turn. Approving it would
/// let the child act (write files, run commands) after the user stopped the delegation.
#[tokio::test]
async fn allow_policy_answers_cancelled_after_the_run_was_cancelled() {
    let dir = scratch();
    let ready = dir.path().join("ready");
    let outcome = dir.path().join("late-permission");
    let host = Host::new(Some(dir.path())).await;
    let mut config = mock_config(&[
        ("MOCK_HANG", "1"),
        ("MOCK_READY_FILE", &path_str(&ready)),
        ("MOCK_ASK_AFTER_CANCEL", &path_str(&outcome)),
    ]);
    config.permission = PermissionPolicy::Allow;
    let _p = register(&host.service, &config).unwrap();
    let signal = Signal::new();
    let run = host
        .service
        .start("acp", host.request_with(signal.clone()))
        .await
        .unwrap();
    wait_for(&ready).await;
    signal.cancel(CancelCause::User);
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    // The connection stays open until disposal, so the child gets its answer first.
    wait_for(&outcome).await;
    assert_eq!(
        std::fs::read_to_string(&outcome).unwrap(),
        "cancelled",
        "a cancelled run must not approve the child's late permission request"
    );
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: ACP-34 — the allow policy with only reject-shaped options answers `cancelled` →
/// `aborted`.
#[tokio::test]
async fn acp_34_allow_without_allow_option() {
    let dir = scratch();
    let mut config = mock_config(&[("MOCK_PERMISSION", "1"), ("MOCK_NO_ALLOW", "1")]);
    config.permission = PermissionPolicy::Allow;
    let result = run_config(Some(dir.path()), &config).await;
    assert_eq!(result.stop_reason, StopReason::Aborted);
}

/// spec: ACP-35 (end to end) — a thought chunk is consumed but excluded from the output.
#[tokio::test]
async fn acp_35_thought_excluded_end_to_end() {
    let (stop, text) = run_script(&[("MOCK_THOUGHT", "1")]).await;
    assert_eq!(
        (stop, text.as_str()),
        (StopReason::Completed, "mock child answer")
    );
}

/// spec: ACP-36 — a direct start of a nonexistent binary rejects after cleanup.
#[tokio::test]
async fn acp_36_direct_spawn_of_missing_binary() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let provider = AcpProvider::load(&AcpConfig::new("/nonexistent/acp-agent-binary")).unwrap();
    let err = provider.start_run(&host.request()).await.unwrap_err();
    assert!(matches!(err, subagent_acp::AcpError::Spawn { .. }), "{err}");
    assert!(err.to_string().contains("/nonexistent/acp-agent-binary"), "{err}");
    host.finish().await;
}

/// spec: ACP-39 — a nonexistent command configured on the registered provider makes `start`
/// reject.
#[tokio::test]
async fn acp_39_missing_command_through_the_service() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let _p = register(&host.service, &AcpConfig::new("definitely-not-an-acp-agent-xyz")).unwrap();
    let message = start_err(&host).await;
    assert!(
        message.starts_with("subagent-acp: failed to spawn definitely-not-an-acp-agent-xyz"),
        "{message}"
    );
    host.finish().await;
}

/// Every failure a sink was told about: the error's text and the stop reason.
type SinkCalls = Arc<Mutex<Vec<(String, StopReason)>>>;

/// A failure sink that records every call.
fn recording_sink() -> (subagent_acp::FailureSink, SinkCalls) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let sink: subagent_acp::FailureSink = Arc::new(move |error, reason| {
        record.lock().push((error.to_string(), reason.clone()));
    });
    (sink, seen)
}

/// spec: ACP-40 — a crash during the prompt yields `error` (keeping the streamed text and a
/// fixed diagnostic) and the sink receives exactly one non-empty error with reason `error`.
#[tokio::test]
async fn acp_40_crash_during_prompt() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let (sink, seen) = recording_sink();
    let provider = AcpProvider::load(&mock_config(&[("MOCK_CRASH_ON_PROMPT", "1")]))
        .unwrap()
        .with_failure_sink(sink);
    let _p = register_provider(&host.service, provider).unwrap();
    let run = start(&host).await;
    let result = run.result().await.unwrap();
    run.dispose().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(text(&result.output), "mock child answer");
    assert_eq!(
        result.diagnostic.as_deref(),
        Some("subagent-acp: the ACP child failed during the prompt turn")
    );
    let seen = seen.lock().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(!seen[0].0.is_empty());
    assert_eq!(seen[0].1, StopReason::Error);
    host.finish().await;
}

/// spec: ACP-41 — through the registered provider, the crash produces exactly one warning of the
/// form `subagent-acp "acp": child run failed (error): …` (the default sink's text).
#[tokio::test]
async fn acp_41_failure_warning_text() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let warnings = Arc::new(Mutex::new(Vec::new()));
    let record = warnings.clone();
    let provider = AcpProvider::load(&mock_config(&[("MOCK_CRASH_ON_PROMPT", "1")])).unwrap();
    let name = provider.settings().provider_name.clone();
    let provider = provider.with_failure_sink(Arc::new(move |error, reason| {
        record
            .lock()
            .push(subagent_acp::failure_warning(&name, reason, error));
    }));
    let _p = register_provider(&host.service, provider).unwrap();
    let run = start(&host).await;
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Error);
    run.dispose().await.unwrap();
    let warnings = warnings.lock().clone();
    assert_eq!(warnings.len(), 1);
    assert!(
        warnings[0].starts_with("subagent-acp \"acp\": child run failed (error): "),
        "{}",
        warnings[0]
    );
    host.finish().await;
}

/// spec: ACP-42 — a panicking sink still yields `error`, never a failed result.
#[tokio::test]
async fn acp_42_panicking_sink_is_contained() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let provider = AcpProvider::load(&mock_config(&[("MOCK_CRASH_ON_PROMPT", "1")]))
        .unwrap()
        .with_failure_sink(Arc::new(|_, _| panic!("sink exploded")));
    let _p = register_provider(&host.service, provider).unwrap();
    let run = start(&host).await;
    let result = run.result().await.expect("the result never fails");
    assert_eq!(result.stop_reason, StopReason::Error);
    run.dispose().await.unwrap();
    host.finish().await;
}

/// spec: ACP-43 — a child that crashes on `session/cancel` still settles `aborted` (and the
/// sink is not told: the failure is the cancellation surfacing).
#[tokio::test]
async fn acp_43_crash_on_cancel_is_aborted() {
    let dir = scratch();
    let ready = dir.path().join("ready");
    let host = Host::new(Some(dir.path())).await;
    let (sink, seen) = recording_sink();
    let provider = AcpProvider::load(&mock_config(&[
        ("MOCK_HANG", "1"),
        ("MOCK_CRASH_ON_CANCEL", "1"),
        ("MOCK_READY_FILE", &path_str(&ready)),
    ]))
    .unwrap()
    .with_failure_sink(sink);
    let _p = register_provider(&host.service, provider).unwrap();
    let signal = Signal::new();
    let run = host
        .service
        .start("acp", host.request_with(signal.clone()))
        .await
        .unwrap();
    wait_for(&ready).await;
    signal.cancel(CancelCause::User);
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    run.dispose().await.unwrap();
    assert!(seen.lock().is_empty());
    host.finish().await;
}

/// spec: ACP-44 — a child that ignores `session/cancel` (and stdin EOF) settles `aborted`
/// promptly (bound 4 s) and `dispose()` still reaps it.
#[tokio::test]
async fn acp_44_ignored_cancel_settles_and_is_reaped() {
    let dir = scratch();
    let ready = dir.path().join("ready");
    let host = Host::new(Some(dir.path())).await;
    let mut config = mock_config(&[
        ("MOCK_HANG", "1"),
        ("MOCK_IGNORE_CANCEL", "1"),
        ("MOCK_IGNORE_EOF", "1"),
        ("MOCK_READY_FILE", &path_str(&ready)),
    ]);
    config.dispose_eof_grace_ms = 200.0;
    config.dispose_grace_ms = 200.0;
    let provider = AcpProvider::load(&config).unwrap();
    let signal = Signal::new();
    let run = provider
        .start_run(&host.request_with(signal.clone()))
        .await
        .unwrap();
    let pid = run.pid().unwrap();
    wait_for(&ready).await;
    let began = Instant::now();
    signal.cancel(CancelCause::User);
    let result = tokio::time::timeout(Duration::from_secs(4), run.result())
        .await
        .expect("settles without the child's cooperation")
        .unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert!(began.elapsed() < Duration::from_secs(4));
    assert!(alive(pid), "settlement did not need the child to exit");
    run.dispose().await.unwrap();
    assert!(!alive(pid));
    host.finish().await;
}

/// spec: ACP-27 — a SIGTERM-trapping child with 150 ms/150 ms graces: `dispose()` returns
/// within 4 s via SIGKILL.
#[cfg(unix)]
#[tokio::test]
async fn acp_27_sigterm_trap_dispose_via_sigkill() {
    let dir = scratch();
    let ready = dir.path().join("ready");
    let host = Host::new(Some(dir.path())).await;
    let mut config = mock_config(&[("MOCK_TRAP_SIGTERM", "1"), ("MOCK_READY_FILE", &path_str(&ready))]);
    config.dispose_eof_grace_ms = 150.0;
    config.dispose_grace_ms = 150.0;
    let provider = AcpProvider::load(&config).unwrap();
    let run = provider.start_run(&host.request()).await.unwrap();
    let pid = run.pid().unwrap();
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
    wait_for(&ready).await;
    let began = Instant::now();
    tokio::time::timeout(Duration::from_secs(4), run.dispose())
        .await
        .expect("dispose within 4 s")
        .unwrap();
    assert!(began.elapsed() < Duration::from_secs(4));
    assert!(matches!(
        run.teardown_report(),
        Some(subagent_acp::process::TeardownReport::Exited {
            tier: TeardownTier::Kill,
            ..
        })
    ));
    assert!(!alive(pid));
    host.finish().await;
}

/// spec: ACP-37 — dispose graces configured on the registered provider reach the run: with
/// 100 ms/100 ms a SIGTERM-trapping child is escalated to SIGKILL within 4 s (the defaults
/// would take 9 s).
#[cfg(unix)]
#[tokio::test]
async fn acp_37_configured_graces_reach_the_run() {
    let dir = scratch();
    let ready = dir.path().join("ready");
    let pidfile = dir.path().join("pid");
    let host = Host::new(Some(dir.path())).await;
    let mut config = mock_config(&[
        ("MOCK_TRAP_SIGTERM", "1"),
        ("MOCK_READY_FILE", &path_str(&ready)),
        ("MOCK_PID_FILE", &path_str(&pidfile)),
    ]);
    config.dispose_eof_grace_ms = 100.0;
    config.dispose_grace_ms = 100.0;
    let _p = register(&host.service, &config).unwrap();
    let run = start(&host).await;
    wait_for(&ready).await;
    let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().parse().unwrap();
    let began = Instant::now();
    tokio::time::timeout(Duration::from_secs(4), run.dispose())
        .await
        .expect("escalated within 4 s")
        .unwrap();
    assert!(began.elapsed() < Duration::from_secs(4));
    assert!(!alive(pid));
    host.finish().await;
}

/// spec: ACP-28 — the EOF window outlasts the SIGTERM grace: a 400 ms EOF flush completes under
/// EOF grace 2000 ms / SIGTERM grace 50 ms (no signal was needed).
#[tokio::test]
async fn acp_28_eof_window_outlasts_sigterm_grace() {
    let dir = scratch();
    let flushed = dir.path().join("flushed");
    let host = Host::new(Some(dir.path())).await;
    let mut config = mock_config(&[
        ("MOCK_FLUSH_ON_EOF", &path_str(&flushed)),
        ("MOCK_FLUSH_DELAY_MS", "400"),
    ]);
    config.dispose_eof_grace_ms = 2000.0;
    config.dispose_grace_ms = 50.0;
    let provider = AcpProvider::load(&config).unwrap();
    let run = provider.start_run(&host.request()).await.unwrap();
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    assert!(flushed.exists(), "the flush completed inside the EOF window");
    let Some(subagent_acp::process::TeardownReport::Exited { status, tier }) = run.teardown_report() else {
        panic!("the child existed")
    };
    assert_eq!(tier, TeardownTier::Eof);
    assert_eq!(status.and_then(|s| s.code()), Some(0));
    host.finish().await;
}

/// spec: ACP-29 — an EOF-ignoring child: POSIX records the SIGTERM marker; `dispose()` returns
/// within 5 s.
#[cfg(unix)]
#[tokio::test]
async fn acp_29_eof_ignoring_child_gets_sigterm() {
    let dir = scratch();
    let (ready, marker) = (dir.path().join("ready"), dir.path().join("sigterm"));
    let host = Host::new(Some(dir.path())).await;
    let mut config = mock_config(&[
        ("MOCK_IGNORE_EOF", "1"),
        ("MOCK_READY_FILE", &path_str(&ready)),
        ("MOCK_SIGTERM_FILE", &path_str(&marker)),
    ]);
    config.dispose_eof_grace_ms = 200.0;
    config.dispose_grace_ms = 3000.0;
    let _p = register(&host.service, &config).unwrap();
    let run = start(&host).await;
    run.result().await.unwrap();
    wait_for(&ready).await;
    let began = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), run.dispose())
        .await
        .expect("dispose within 5 s")
        .unwrap();
    assert!(began.elapsed() < Duration::from_secs(5));
    assert!(marker.exists(), "the child saw SIGTERM");
    host.finish().await;
}

/// spec: ACP-45 — capabilities are all false (and the service rejects a capability-gated
/// request before any spawn).
#[tokio::test]
async fn acp_45_capabilities_all_false() {
    use subagent::provider::SubagentProvider;
    let provider = AcpProvider::load(&AcpConfig::new(MOCK)).unwrap();
    assert_eq!(provider.capabilities(), subagent::NO_START_CAPABILITIES);
    let caps = provider.capabilities();
    assert!(!caps.output_schema && !caps.depth_limit && !caps.tool_filter && !caps.persona);
    assert!(!provider.inherits_parent_context());
    assert!(provider.continuable().is_none());

    let dir = scratch();
    let sentinel = dir.path().join("ran");
    let host = Host::new(Some(dir.path())).await;
    let _p = register(&host.service, &sentinel_config(&sentinel)).unwrap();
    let mut request = host.request();
    request.persona = Some("reviewer".into());
    let err = host.service.start("acp", request).await.err().unwrap();
    assert!(start_message(err).contains("does not support the \"persona\" capability"));
    assert!(!sentinel.exists());
    host.finish().await;
}

/// spec: ACP-46 — unloading (dropping the registration) unregisters the provider: the registry
/// ends empty and `subagent/provider-removed` fires.
#[tokio::test]
async fn acp_46_unload_unregisters() {
    let host = Host::new(None).await;
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let _l = host.service.events().on(move |e| {
        if let SubagentEvent::ProviderRemoved(name) = e {
            seen.lock().push(name.clone());
        }
        Ok(())
    });
    let registration = register(&host.service, &AcpConfig::new(MOCK)).unwrap();
    assert_eq!(host.service.list(), vec!["acp".to_owned()]);
    drop(registration);
    assert!(host.service.list().is_empty());
    assert_eq!(events.lock().clone(), vec!["acp".to_owned()]);
    host.finish().await;
}

/// A run dropped undisposed still reaps its child (teardown in the background).
#[tokio::test]
async fn dropped_run_reaps_its_child() {
    let dir = scratch();
    let ready = dir.path().join("ready");
    let host = Host::new(Some(dir.path())).await;
    let mut config = mock_config(&[("MOCK_HANG", "1"), ("MOCK_READY_FILE", &path_str(&ready))]);
    config.dispose_eof_grace_ms = 200.0;
    let provider = AcpProvider::load(&config).unwrap();
    let run = provider.start_run(&host.request()).await.unwrap();
    let pid = run.pid().unwrap();
    wait_for(&ready).await;
    drop(run);
    let deadline = Instant::now() + BOUND;
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the dropped run's child was never reaped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    host.finish().await;
}

/// A child that exits without speaking ACP fails the start (after reaping), never publishes.
#[tokio::test]
async fn silent_exit_fails_the_start() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let _p = register(&host.service, &AcpConfig::new("true")).unwrap();
    let message = start_err(&host).await;
    assert!(message.starts_with("ACP initialize failed"), "{message}");
    host.finish().await;
}

/// Lifecycle events: `subagent/start` and `subagent/end` with `local: false` and the output.
#[tokio::test]
async fn lifecycle_events_are_remote() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let _l = host.service.events().on(move |e| {
        match e {
            SubagentEvent::Start(info) => record.lock().push(format!("start local={}", info.local)),
            SubagentEvent::End(end) => record.lock().push(format!(
                "end {} {}",
                end.stop_reason.as_str(),
                end.last_assistant_message
                    .as_deref()
                    .map(text)
                    .unwrap_or_default()
            )),
            _ => {}
        }
        Ok(())
    });
    let _p = register(&host.service, &mock_config(&[])).unwrap();
    let run = start(&host).await;
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    host.service.close().await;
    assert_eq!(
        seen.lock().clone(),
        vec![
            "start local=false".to_owned(),
            "end completed mock child answer".to_owned()
        ]
    );
    host.finish().await;
}

/// A start future dropped mid-handshake (the tool pipeline drops a cancelled call's body) still
/// reaps its unpublished child.
#[tokio::test]
async fn dropped_start_reaps_the_child() {
    let dir = scratch();
    let (gate_ready, gate_go, pidfile) = (
        dir.path().join("ns-ready"),
        dir.path().join("ns-go"),
        dir.path().join("pid"),
    );
    let host = Host::new(Some(dir.path())).await;
    let mut config = mock_config(&[
        ("MOCK_NEWSESSION_READY", &path_str(&gate_ready)),
        ("MOCK_NEWSESSION_GO", &path_str(&gate_go)),
        ("MOCK_PID_FILE", &path_str(&pidfile)),
    ]);
    config.dispose_eof_grace_ms = 200.0;
    let _p = register(&host.service, &config).unwrap();
    {
        let starting = host.service.start("acp", host.request());
        tokio::select! {
            _ = starting => panic!("the gate keeps session/new pending"),
            _ = wait_for(&gate_ready) => {}
        }
    }
    let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().parse().unwrap();
    let deadline = Instant::now() + BOUND;
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the dropped start's child was never reaped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    host.finish().await;
}

/// A start outside any tokio runtime fails with a typed error instead of panicking.
#[test]
fn start_outside_a_runtime_is_a_typed_error() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = scratch();
    let host = runtime.block_on(Host::new(Some(dir.path())));
    let request = host.request();
    let provider = AcpProvider::load(&mock_config(&[])).unwrap();
    let outcome = futures::executor::block_on(provider.start_run(&request));
    assert!(matches!(outcome, Err(subagent_acp::AcpError::NoRuntime)));
    runtime.block_on(host.finish());
}

/// spec: §1.5, §1.11 — a run dropped undisposed whose background teardown is cut short by its
/// runtime shutting down (a host exiting with a run still live) leaves no helper of the child
/// running: the last resort kills the child's whole process group, not only the child.
#[cfg(target_os = "linux")]
#[test]
fn a_run_whose_runtime_shuts_down_mid_teardown_leaves_no_helper() {
    let dir = scratch();
    let helper_pid = dir.path().join("helper.pid");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let host = Host::new(Some(dir.path())).await;
        let mut config = AcpConfig::new("sh");
        config.args = vec![
            "-c".into(),
            format!("sleep 600 & echo $! > '{}'; exec '{MOCK}'", helper_pid.display()),
        ];
        // The helper keeps the group alive, so the teardown stays in this (long) EOF window.
        config.dispose_eof_grace_ms = 3_600_000.0;
        config.dispose_grace_ms = 3_600_000.0;
        let provider = AcpProvider::load(&config).unwrap();
        let run = provider.start_run(&host.request()).await.unwrap();
        assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
        wait_for(&helper_pid).await;
        drop(run);
        host.finish().await;
    });
    drop(runtime);
    let helper: u32 = std::fs::read_to_string(&helper_pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    wait_ended(helper, "the dropped run's helper outlived the runtime");
}

/// The diagnostic of a prompt turn the child's output broke.
fn broken_output_diagnostic(cause: &str) -> String {
    format!("subagent-acp: the ACP child failed during the prompt turn: {cause}")
}

/// A line longer than the limit ends the connection during the prompt: the run settles `error`
/// and both the diagnostic and the error the sink receives name the cause — the over-long line —
/// instead of an opaque terminated connection (spec §1.9 flattening; §1.13 fixed diagnostic).
#[tokio::test]
async fn an_overlong_line_during_the_prompt_names_its_cause() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let (sink, seen) = recording_sink();
    let long = format!("long:{}", subagent_acp::DEFAULT_MAX_LINE + 1);
    let provider = AcpProvider::load(&mock_config(&[("MOCK_BAD_LINE", &long)]))
        .unwrap()
        .with_failure_sink(sink);
    let _p = register_provider(&host.service, provider).unwrap();
    let run = start(&host).await;
    let result = run.result().await.unwrap();
    run.dispose().await.unwrap();
    let cause = format!(
        "the agent wrote a line longer than {} bytes",
        subagent_acp::DEFAULT_MAX_LINE
    );
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.diagnostic, Some(broken_output_diagnostic(&cause)));
    let seen = seen.lock().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, format!("ACP prompt failed: {cause}"));
    host.finish().await;
}

/// A line longer than the limit before the handshake completes fails the start with the cause
/// named (not an opaque terminated connection); the child is reaped first.
#[tokio::test]
async fn an_overlong_line_during_the_handshake_names_its_cause() {
    let dir = scratch();
    let host = Host::new(Some(dir.path())).await;
    let long = format!("long:{}", subagent_acp::DEFAULT_MAX_LINE + 1);
    let config = mock_config(&[("MOCK_BAD_LINE", &long), ("MOCK_BAD_LINE_AT_START", "1")]);
    let _p = register(&host.service, &config).unwrap();
    let message = start_err(&host).await;
    assert!(
        message.ends_with(&format!(
            " failed: the agent wrote a line longer than {} bytes",
            subagent_acp::DEFAULT_MAX_LINE
        )),
        "{message}"
    );
    assert!(message.starts_with("ACP "), "{message}");
    host.finish().await;
}

/// A line that is not UTF-8 is a malformed line like one that is not JSON: it is answered with
/// a parse error and the connection goes on, so the run completes with the child's text
/// (spec §2.1: one JSON message per line; a stray line does not end the session).
#[tokio::test]
async fn a_line_that_is_not_utf8_is_tolerated_like_one_that_is_not_json() {
    for kind in ["json", "utf8"] {
        let (stop, text) = run_script(&[("MOCK_BAD_LINE", kind)]).await;
        assert_eq!(
            (stop, text.as_str()),
            (StopReason::Completed, "mock child answer"),
            "{kind}"
        );
    }
}

/// The text `MOCK_STREAM_CHUNKS=<n>:<size>` streams: chunk `i` is `size` copies of `a + i % 26`.
fn streamed_text(n: usize, size: usize) -> String {
    (0..n)
        .flat_map(|i| std::iter::repeat_n(char::from(b'a' + (i % 26) as u8), size))
        .collect()
}

/// The collected output is bounded by `maxOutputBytes` (this crate's extension: §1.7 sets no
/// bound, so a child streaming chunks forever grew the parent's memory until cancellation). A
/// child streaming 12 800 bytes under a 1000-byte bound yields exactly the first 1000 bytes of
/// its text, then the `[output truncated]` marker, in one text block; the run still settles with
/// the child's own stop reason (`completed`, `max-tokens`) and no diagnostic, and disposal and
/// the host end normally. Text of exactly the bound is kept whole, without the marker.
#[tokio::test]
async fn collected_output_stops_at_max_output_bytes() {
    const MARKER: &str = "\n[output truncated]";
    for (stop, expected) in [
        ("end_turn", StopReason::Completed),
        ("max_tokens", StopReason::MaxTokens),
    ] {
        let dir = scratch();
        let mut config = mock_config(&[("MOCK_STREAM_CHUNKS", "200:64"), ("MOCK_STOP", stop)]);
        config.max_output_bytes = 1000.0;
        let result = run_config(Some(dir.path()), &config).await;
        assert_eq!(result.stop_reason, expected);
        assert_eq!(result.diagnostic, None);
        assert_eq!(result.output.len(), 1, "one text block");
        let output = text(&result.output);
        assert_eq!(output.len(), 1000 + MARKER.len(), "the output stops at the bound");
        assert_eq!(output, format!("{}{MARKER}", &streamed_text(200, 64)[..1000]));
    }
    let dir = scratch();
    let mut config = mock_config(&[("MOCK_STREAM_CHUNKS", "10:100")]);
    config.max_output_bytes = 1000.0;
    let result = run_config(Some(dir.path()), &config).await;
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(text(&result.output), streamed_text(10, 100));
}
