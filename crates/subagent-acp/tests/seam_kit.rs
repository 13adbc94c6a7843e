//! The seam's out-of-process helper kit as this provider relies on it (spec
//! `acp-and-tools.md` §1.17, ACP-51..58; upstream `out-of-process.spec.ts` and
//! `run-settlement.spec.ts`). The kit lives in `subagent`; these tests pin the behaviour the
//! `acp` provider depends on, with the provider's own prefix.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent::{CancelCause, ContentBlock, SessionId, Signal};
use futures::FutureExt;
use parking_lot::Mutex;
use subagent::capabilities::SubagentCapabilities;
use subagent::out_of_process::{
    assert_positive_finite, assert_usable_cwd, resolve_child_cwd, validate_configured_cwd,
};
use subagent::settle::{
    AbortListener, RunSettlement, SubprocessRunHandle, SubprocessRunParts, settle_run_result,
};
use subagent::{MAX_DIAGNOSTIC_BYTES, NO_START_CAPABILITIES, StopReason, SubagentResult, cap_diagnostic};

const P: &str = "subagent-acp";

#[derive(Debug, thiserror::Error)]
#[error("pipe torn")]
struct Torn;

/// spec: ACP-51 — the no-capabilities constant is all-false (a `const` value: callers get
/// copies and cannot change the shared advertisement).
#[test]
fn acp_51_no_capabilities_constant() {
    assert_eq!(
        serde_json::to_value(NO_START_CAPABILITIES).unwrap(),
        serde_json::json!({"outputSchema": false, "depthLimit": false, "toolFilter": false, "persona": false})
    );
    let copy = SubagentCapabilities {
        persona: true,
        ..NO_START_CAPABILITIES
    };
    assert_ne!(
        copy, NO_START_CAPABILITIES,
        "changing a copy leaves the shared constant as it was"
    );
    assert_eq!(NO_START_CAPABILITIES, SubagentCapabilities::default());
}

/// spec: ACP-52 — positive-finite validation rejects 0, negatives, NaN and +∞ with
/// `<prefix>: <name> must be a positive finite number`.
#[test]
fn acp_52_positive_finite() {
    assert_eq!(assert_positive_finite(P, "disposeGraceMs", 5.0), Ok(5.0));
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(
            assert_positive_finite(P, "disposeGraceMs", bad)
                .unwrap_err()
                .to_string(),
            "subagent-acp: disposeGraceMs must be a positive finite number"
        );
    }
}

/// spec: ACP-53 — cwd assertion accepts an absolute directory; rejects relative (`must be an
/// absolute path`) and missing or file (`not an accessible directory`).
#[test]
fn acp_53_cwd_assertion() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        assert_usable_cwd(P, "config cwd", dir.path()).unwrap(),
        dir.path()
    );
    assert!(
        assert_usable_cwd(P, "config cwd", "rel".as_ref())
            .unwrap_err()
            .to_string()
            .contains("must be an absolute path")
    );
    let file = dir.path().join("f");
    std::fs::write(&file, "").unwrap();
    for bad in [dir.path().join("missing"), file] {
        assert!(
            assert_usable_cwd(P, "config cwd", &bad)
                .unwrap_err()
                .to_string()
                .contains("not an accessible directory")
        );
    }
}

/// spec: ACP-54 — configured-cwd validation: absent passes through, empty fails, relative
/// resolves lexically against the launch directory.
#[test]
fn acp_54_configured_cwd() {
    assert_eq!(validate_configured_cwd(P, None), Ok(None));
    assert!(validate_configured_cwd(P, Some("")).is_err());
    let launch = std::env::current_dir().unwrap();
    assert_eq!(
        validate_configured_cwd(P, Some("./src/..")).unwrap(),
        Some(launch.clone())
    );
    assert_eq!(
        validate_configured_cwd(P, Some("src")).unwrap(),
        Some(launch.join("src"))
    );
}

/// spec: ACP-55 — child-cwd resolution: the override wins; else the parent is validated; else
/// `no working directory for the child`; a relative parent → `parent session cwd must be an
/// absolute path`.
#[test]
fn acp_55_child_cwd_resolution() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    assert_eq!(
        resolve_child_cwd(P, Some(a.path()), Some(b.path())).unwrap(),
        a.path()
    );
    assert_eq!(resolve_child_cwd(P, None, Some(b.path())).unwrap(), b.path());
    assert!(
        resolve_child_cwd(P, None, None)
            .unwrap_err()
            .to_string()
            .contains("no working directory for the child")
    );
    assert!(
        resolve_child_cwd(P, None, Some("rel".as_ref()))
            .unwrap_err()
            .to_string()
            .contains("parent session cwd must be an absolute path")
    );
}

fn settlement<'a>(
    output: &'a str,
    cancelled: bool,
    sink: Option<subagent::settle::ErrorSink<'a>>,
    listener: AbortListener,
) -> RunSettlement<'a> {
    RunSettlement {
        collect_output: Box::new(move || vec![ContentBlock::text(output)]),
        collect_diagnostic: None,
        cancelled: Box::new(move || cancelled),
        on_error: sink,
        listener,
    }
}

/// spec: ACP-56 — settlement: success passes through and the listener is removed; a failure
/// after cancellation is `aborted` with the partial output; a failure is flattened to `error`
/// through the sink, a panicking sink is contained, and no sink works too.
#[tokio::test]
async fn acp_56_settlement() {
    let signal = Signal::new();
    let (listener, _watch) = AbortListener::attach(&signal, |_| {});
    let ok = SubagentResult::new(vec![ContentBlock::text("done")], StopReason::Completed);
    let settled = settle_run_result(
        async { Ok::<_, Torn>(ok.clone()) },
        settlement("partial", false, None, listener.clone()),
    )
    .await;
    assert_eq!(settled, ok);
    assert!(listener.is_removed());

    let aborted = settle_run_result(
        async { Err::<SubagentResult, _>(Torn) },
        settlement("partial", true, None, AbortListener::default()),
    )
    .await;
    assert_eq!(
        aborted,
        SubagentResult::aborted(vec![ContentBlock::text("partial")])
    );

    let calls = Arc::new(Mutex::new(Vec::new()));
    let record = calls.clone();
    let sink: subagent::settle::ErrorSink<'_> =
        Box::new(move |e, r| record.lock().push((e.to_string(), r.clone())));
    let failed = settle_run_result(
        async { Err::<SubagentResult, _>(Torn) },
        settlement("partial", false, Some(sink), AbortListener::default()),
    )
    .await;
    assert_eq!(failed.stop_reason, StopReason::Error);
    assert_eq!(failed.output, vec![ContentBlock::text("partial")]);
    assert_eq!(
        calls.lock().clone(),
        vec![("pipe torn".to_owned(), StopReason::Error)]
    );

    let panicking: subagent::settle::ErrorSink<'_> = Box::new(|_, _| panic!("sink exploded"));
    let contained = settle_run_result(
        async { Err::<SubagentResult, _>(Torn) },
        settlement("p", false, Some(panicking), AbortListener::default()),
    )
    .await;
    assert_eq!(contained.stop_reason, StopReason::Error);

    let no_sink = settle_run_result(
        async { Err::<SubagentResult, _>(Torn) },
        settlement("p", false, None, AbortListener::default()),
    )
    .await;
    assert_eq!(no_sink.stop_reason, StopReason::Error);
}

/// spec: ACP-57 — run handle: no local agent; `dispose()` memoized; cancel requested once;
/// teardown run once; the listener is removed before cancelling.
#[tokio::test]
async fn acp_57_run_handle() {
    let signal = Signal::new();
    let (listener, _watch) = AbortListener::attach(&signal, |_| {});
    let cancels = Arc::new(AtomicUsize::new(0));
    let teardowns = Arc::new(AtomicUsize::new(0));
    let removed_first = Arc::new(Mutex::new(None));
    let (c, t, observed, probe) = (
        cancels.clone(),
        teardowns.clone(),
        removed_first.clone(),
        listener.clone(),
    );
    let handle = SubprocessRunHandle::new(SubprocessRunParts {
        id: SessionId::from("run-1"),
        result: async { SubagentResult::aborted(vec![]) }.boxed(),
        listener,
        request_cancel: Box::new(move || {
            *observed.lock() = Some(probe.is_removed());
            c.fetch_add(1, Ordering::SeqCst);
        }),
        teardown: Box::new(move || {
            t.fetch_add(1, Ordering::SeqCst);
            async { Ok(()) }.boxed()
        }),
    });
    assert!(!handle.is_local());
    let first = handle.dispose();
    let second = handle.dispose();
    assert!(first.ptr_eq(&second));
    first.await.unwrap();
    second.await.unwrap();
    signal.cancel(CancelCause::User);
    handle.dispose().await.unwrap();
    assert_eq!(cancels.load(Ordering::SeqCst), 1);
    assert_eq!(teardowns.load(Ordering::SeqCst), 1);
    assert_eq!(*removed_first.lock(), Some(true));
}

/// spec: ACP-58 — diagnostic bound: exactly 4096 bytes pass unchanged; oversized multibyte
/// text is at most 4096 bytes, ends with `[diagnostic truncated]`, and has no replacement
/// character.
#[test]
fn acp_58_diagnostic_bound() {
    let exact = "a".repeat(MAX_DIAGNOSTIC_BYTES);
    assert_eq!(cap_diagnostic(&exact), exact);
    let oversized = "é€😀".repeat(1000);
    let capped = cap_diagnostic(&oversized);
    assert!(capped.len() <= 4096);
    assert!(capped.ends_with("[diagnostic truncated]"));
    assert!(!capped.contains('\u{FFFD}'));
}

/// spec: ACP-47 (Rust form) — the package is named `subagent-acp`, and among workspace crates
/// it depends on the seam (`subagent`) only, with the ACP SDK pinned exactly. Upstream pins
/// the plugin's named exports and its `subagents`/`subprocess` dependencies; in Rust the crate
/// manifest carries that shape.
#[test]
fn acp_47_package_shape() {
    assert_eq!(env!("CARGO_PKG_NAME"), "subagent-acp");
    let manifest = include_str!("../Cargo.toml");
    let dependencies = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    let path_deps: Vec<&str> = dependencies
        .lines()
        .filter(|line| line.contains("path ="))
        .map(|line| line.split('=').next().unwrap_or("").trim())
        .collect();
    assert_eq!(path_deps, ["subagent"]);
    // Exactly pinned, default features only (no `process`, no `stdio`).
    let sdk: Vec<&str> = dependencies
        .lines()
        .filter(|line| line.starts_with("agent-client-protocol"))
        .collect();
    assert_eq!(sdk, ["agent-client-protocol = \"=5.2.0\""]);
}
