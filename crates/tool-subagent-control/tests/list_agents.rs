//! `list_agents` end to end (`acp-and-tools.md` §4.4, checklist CTRL-15 … CTRL-26): the tool
//! over the seam's real listing of a real host, and over a recording listing that serves fixed
//! rows (to pin the projection and rendering of rows a real host produces only rarely).

mod common;

use std::sync::Arc;

use agent::tools::ToolRegistryError;
use agent::{AgentError, AgentStatus, ContentBlock, Message, SessionId, SessionPersistence, Signal};
use agent_loop::model::ScriptEntry;
use async_trait::async_trait;
use common::{PARENT, Rig, answer, error, ok_text};
use parking_lot::Mutex;
use serde_json::{Value, json};
use subagent::SubagentError;
use subagent::listing::{
    Activity, DescendantEntry, DiagnosticReason, ListingError, ListingServices, SubagentListEntry,
};
use subagent::provider::SubagentStartRequest;
use tool_subagent_control::{
    AgentListing, ControlToolError, LIST_AGENTS_DEPENDENCIES, LIST_AGENTS_PLUGIN_NAME, ListAgentsPlugin,
};

// ---- a recording listing ------------------------------------------------------------------

/// Which listing a call asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asked {
    Children,
    Descendants,
}

/// A listing serving fixed rows (or a fixed failure) and recording every call: which listing,
/// for whom, and the signal it was given.
#[derive(Default)]
struct Recording {
    children: Vec<SubagentListEntry>,
    descendants: Vec<DescendantEntry>,
    failure: Option<fn() -> ListingError>,
    calls: Mutex<Vec<(Asked, SessionId, Signal)>>,
}

impl Recording {
    fn calls(&self) -> Vec<(Asked, SessionId, Signal)> {
        self.calls.lock().clone()
    }
}

#[async_trait]
impl AgentListing for Recording {
    async fn list_children(
        &self,
        parent: &SessionId,
        signal: &Signal,
    ) -> Result<Vec<SubagentListEntry>, ListingError> {
        self.calls
            .lock()
            .push((Asked::Children, parent.clone(), signal.clone()));
        match self.failure {
            Some(failure) => Err(failure()),
            None => Ok(self.children.clone()),
        }
    }

    async fn list_descendants(
        &self,
        root: &SessionId,
        signal: &Signal,
    ) -> Result<Vec<DescendantEntry>, ListingError> {
        self.calls
            .lock()
            .push((Asked::Descendants, root.clone(), signal.clone()));
        match self.failure {
            Some(failure) => Err(failure()),
            None => Ok(self.descendants.clone()),
        }
    }
}

fn child(id: &str, mode: &'static str, label: &str, activity: Activity) -> SubagentListEntry {
    SubagentListEntry::Child {
        id: SessionId::from(id),
        activity,
        has_children: false,
        mode,
        label: Some(label.to_owned()),
    }
}

fn diagnostic(id: &str, reason: DiagnosticReason) -> SubagentListEntry {
    SubagentListEntry::Diagnostic {
        id: SessionId::from(id),
        reason,
    }
}

fn at(entry: SubagentListEntry, parent: &str, depth: usize) -> DescendantEntry {
    DescendantEntry {
        entry,
        parent_id: SessionId::from(parent),
        depth,
    }
}

fn list(scope: Option<&str>) -> Value {
    match scope {
        Some(scope) => json!({"scope": scope}),
        None => json!({}),
    }
}

// ---- registration -------------------------------------------------------------------------

/// spec: CTRL-15 — `list_agents` is registered once, globally, with only the optional `scope`
/// (enum `children`, `descendants`) and nothing required; the description mentions
/// `send_message` and `interrupt_agent`. A second load into the same host is refused.
#[tokio::test(start_paused = true)]
async fn ctrl_15_list_agents_schema() {
    let rig = Rig::new(vec![]).await;
    assert_eq!(rig.tool_count("list_agents"), 1);
    let parameters = rig.parameters("list_agents");
    let names: Vec<&String> = parameters["properties"]
        .as_object()
        .map(|p| p.keys().collect())
        .unwrap_or_default();
    assert_eq!(names, ["scope"]);
    assert_eq!(
        parameters["properties"]["scope"]["enum"],
        json!(["children", "descendants"])
    );
    assert_eq!(parameters["required"], json!([]));
    let description = rig.description("list_agents");
    assert!(description.contains("send_message"), "{description}");
    assert!(description.contains("interrupt_agent"), "{description}");

    let listing = Arc::new(ListingServices::default());
    let again = ListAgentsPlugin::load(rig.rt.services(), listing).expect_err("a second load is refused");
    assert!(matches!(
        again,
        ControlToolError::Register(ToolRegistryError::Duplicate(ref name)) if name == "list_agents"
    ));
    assert_eq!(rig.tool_count("list_agents"), 1);
    rig.finish().await;
}

/// spec: CTRL-20 — the description says `you are told when one finishes` and `resumable, not
/// terminal`; the status vocabulary is exactly `running`, `idle`, `ready` (pinned on
/// `ListedStatus` in the crate's unit tests; every status a listing produces is one of them).
#[tokio::test(start_paused = true)]
async fn ctrl_20_description_and_status_vocabulary() {
    let rig = Rig::new(vec![]).await;
    let description = rig.description("list_agents");
    assert!(
        description.contains("you are told when one finishes"),
        "{description}"
    );
    assert!(description.contains("resumable, not terminal"), "{description}");
    for status in ["running", "idle", "ready"] {
        assert!(description.contains(status), "{status}");
    }
    assert_eq!(
        tool_subagent_control::ListedStatus::ALL.map(|s| s.as_str()),
        ["running", "idle", "ready"]
    );
    rig.finish().await;
}

/// spec: CTRL-22 — unloading the plugin removes `list_agents` (dropping it does the same).
#[tokio::test(start_paused = true)]
async fn ctrl_22_unloading_removes_list_agents() {
    let mut rig = Rig::new(vec![]).await;
    let plugin = rig.list.take().expect("loaded");
    assert!(plugin.is_loaded());
    plugin.unload();
    assert!(!plugin.is_loaded());
    assert_eq!(rig.tool_count("list_agents"), 0);
    let (code, _) = error(&rig.call("list_agents", PARENT, list(None)).await);
    assert_eq!(code, "UNKNOWN_TOOL");
    drop(plugin);
    let plugin =
        ListAgentsPlugin::load(rig.rt.services(), Arc::new(ListingServices::default())).expect("reloads");
    assert_eq!(rig.tool_count("list_agents"), 1);
    drop(plugin);
    assert_eq!(rig.tool_count("list_agents"), 0);
    rig.finish().await;
}

/// spec: CTRL-23 — plugin shape: name `tool-subagent-list-agents`, dependencies `tools`,
/// `subagents`, `agents`. (Rust equivalent of the namespace export: the two constants; the
/// listing and the live agent registry are what the loader takes.)
#[test]
fn ctrl_23_plugin_shape() {
    assert_eq!(LIST_AGENTS_PLUGIN_NAME, "tool-subagent-list-agents");
    assert_eq!(LIST_AGENTS_DEPENDENCIES, ["tools", "subagents", "agents"]);
}

// ---- the real listing ---------------------------------------------------------------------

/// spec: CTRL-16 — a parent without subagents gets `(no subagents)` and the value `[]`.
#[tokio::test(start_paused = true)]
async fn ctrl_16_an_empty_listing() {
    let rig = Rig::new(vec![]).await;
    for scope in [None, Some("children"), Some("descendants")] {
        let result = rig.call("list_agents", PARENT, list(scope)).await;
        assert_eq!(ok_text(&result), "(no subagents)");
        assert_eq!(result.value, Some(json!([])));
    }
    rig.finish().await;
}

/// spec: CTRL-19 — a real settled continuable child is listed `<id> [ready] — <label>` while a
/// real one-shot sibling (persisted, with its own descriptor) is omitted.
#[tokio::test(start_paused = true)]
async fn ctrl_19_a_settled_continuable_child_is_ready_and_a_one_shot_is_omitted() {
    let rig = Rig::new(vec![answer("once"), answer("done")]).await;
    let mut request = SubagentStartRequest::new(
        vec![ContentBlock::text("one-shot task")],
        rig.parent().clone(),
        Signal::new(),
    );
    request.label = Some("finished once".to_owned());
    let run = rig
        .subagents
        .start("spawn", request)
        .await
        .expect("the one-shot starts");
    let result = run.result().await.expect("the one-shot finishes");
    assert_eq!(result.stop_reason, subagent::StopReason::Completed);
    run.dispose().await.expect("the one-shot is disposed");
    let one_shot = run.id().clone();
    let child = rig
        .start(rig.parent(), "child", "summarize the doc", "child task")
        .await;
    rig.until_released(&child).await;
    let persisted: Vec<SessionId> = SessionPersistence::list(rig.store.as_ref())
        .await
        .expect("the store lists")
        .into_iter()
        .map(|h| h.id)
        .collect();
    assert!(persisted.contains(&one_shot), "the one-shot child is persisted");
    // The seam lists both children; the tool omits the one-shot one.
    let listing = ListingServices {
        projections: Some(rig.projections.clone()),
        store: Some(rig.rt.services().sessions.clone()),
        persistence: Some(rig.store.clone() as Arc<dyn SessionPersistence>),
        cache: None,
    };
    let rows = AgentListing::list_children(&listing, &SessionId::from(PARENT), &Signal::new())
        .await
        .expect("the seam lists");
    let mut modes: Vec<(String, &str)> = rows
        .iter()
        .filter_map(|row| match row {
            SubagentListEntry::Child { id, mode, .. } => Some((id.to_string(), *mode)),
            SubagentListEntry::Diagnostic { .. } => None,
        })
        .collect();
    modes.sort();
    let mut expected = vec![
        (one_shot.to_string(), "one-shot"),
        ("child".to_owned(), "continuable"),
    ];
    expected.sort();
    assert_eq!(modes, expected);

    let result = rig.call("list_agents", PARENT, list(None)).await;
    assert_eq!(ok_text(&result), "child [ready] — summarize the doc");
    assert_eq!(
        result.value,
        Some(json!([{"kind": "child", "id": "child", "label": "summarize the doc", "status": "ready"}]))
    );
    let result = rig.call("list_agents", PARENT, list(Some("descendants"))).await;
    assert_eq!(
        ok_text(&result),
        "child [ready] parent=parent depth=1 — summarize the doc"
    );
    assert!(rig.agent("child").is_none(), "listing resumes nothing");
    rig.finish().await;
}

/// spec: CTRL-24 — scope `descendants` renders the real tree in pre-order with
/// `parent=<id> depth=<n>`: a branch that finished its own turn but stays resident waiting on
/// its child is `idle` at depth 1; that running leaf is `running` at depth 2. Scope `children`
/// lists the branch only.
#[tokio::test(start_paused = true)]
async fn ctrl_24_descendants_in_pre_order_with_positions() {
    let mut rig = Rig::new(vec![ScriptEntry::hang(), answer("branch done")]).await;
    let gate = rig.gate("branch");
    rig.start(rig.parent(), "branch", "waiting branch", "branch work")
        .await;
    let branch = rig.agent("branch").expect("the branch is live");
    rig.start(&branch, "leaf", "nested leaf", "leaf work").await;
    rig.until("the leaf's request", |rig| rig.model.requests().len() == 1)
        .await;
    gate.send_replace(true);
    rig.until("the branch waits between turns", |rig| {
        rig.model.requests().len() == 2 && branch.status() == AgentStatus::Idle
    })
    .await;
    assert!(rig.manager.is_resident(&SessionId::from("branch")));

    let result = rig.call("list_agents", PARENT, list(Some("descendants"))).await;
    assert_eq!(
        ok_text(&result),
        "branch [idle] parent=parent depth=1 — waiting branch\n\
         leaf [running] parent=branch depth=2 — nested leaf"
    );
    assert_eq!(
        result.value,
        Some(json!([
            {"kind": "child", "id": "branch", "label": "waiting branch", "status": "idle",
             "parent": "parent", "depth": 1},
            {"kind": "child", "id": "leaf", "label": "nested leaf", "status": "running",
             "parent": "branch", "depth": 2},
        ]))
    );
    let result = rig.call("list_agents", PARENT, list(None)).await;
    assert_eq!(ok_text(&result), "branch [idle] — waiting branch");
    rig.finish().await;
}

/// §4.4 errors — a host whose listing lacks the projection registry refuses with the seam's
/// `SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE`; one without the session store with
/// `SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE`.
#[tokio::test(start_paused = true)]
async fn listing_preparation_errors_keep_the_seam_code() {
    for (projections, store, expected) in [
        (false, true, SubagentError::projections_unavailable()),
        (true, false, SubagentError::session_store_unavailable()),
    ] {
        let mut rig = Rig::new(vec![]).await;
        drop(rig.list.take());
        let listing = ListingServices {
            projections: projections.then(|| rig.projections.clone()),
            store: store.then(|| rig.rt.services().sessions.clone()),
            persistence: None,
            cache: None,
        };
        let plugin = ListAgentsPlugin::load(rig.rt.services(), Arc::new(listing)).expect("loads");
        let (code, message) = error(&rig.call("list_agents", PARENT, list(None)).await);
        assert_eq!(code, expected.code().as_str());
        assert_eq!(message, expected.message());
        drop(plugin);
        rig.finish().await;
    }
}

// ---- fixed rows ---------------------------------------------------------------------------

/// spec: CTRL-17 — rows render in the listing's order with statuses from the live agent
/// registry: no live agent → `[ready]`, a live agent running a turn → `[running]`, a resident
/// agent between turns → `[idle]`, a diagnostic → `[diagnostic: corrupt]`; a one-shot row is
/// omitted. The listing's own `activity` is not what decides the status.
#[tokio::test(start_paused = true)]
async fn ctrl_17_rendering_with_registry_statuses() {
    let listing = Arc::new(Recording {
        children: vec![
            child("one-shot-child", "one-shot", "finished once", Activity::Inactive),
            child("stored-child", "continuable", "real child", Activity::Running),
            child("running-child", "continuable", "still working", Activity::Running),
            child(
                "waiting-child",
                "continuable",
                "waiting on descendants",
                Activity::Running,
            ),
            diagnostic("broken-child", DiagnosticReason::Corrupt),
        ],
        ..Recording::default()
    });
    let mut rig = Rig::with_listing(vec![ScriptEntry::hang()], listing.clone()).await;
    let running = rig.other_agent("running-child").await;
    running
        .followup(Message::user_text("work"))
        .expect("the agent takes work");
    rig.until("the running agent's request", |rig| {
        rig.model.requests().len() == 1
    })
    .await;
    assert_eq!(running.status(), AgentStatus::Running);
    let waiting = rig.other_agent("waiting-child").await;
    assert_eq!(waiting.status(), AgentStatus::Idle);

    let result = rig.call("list_agents", PARENT, list(None)).await;
    assert_eq!(
        ok_text(&result),
        "stored-child [ready] — real child\n\
         running-child [running] — still working\n\
         waiting-child [idle] — waiting on descendants\n\
         broken-child [diagnostic: corrupt]"
    );
    assert_eq!(
        result.value.as_ref().and_then(Value::as_array).map(Vec::len),
        Some(4)
    );
    assert_eq!(
        result.value.as_ref().map(|v| v[3].clone()),
        Some(json!({"kind": "diagnostic", "id": "broken-child", "reason": "corrupt"}))
    );
    rig.finish().await;
}

/// spec: CTRL-18 — an omitted scope calls the children listing, once, with the caller's id and
/// the call's own token (cancelling the call's token cancels the one the listing got).
#[tokio::test(start_paused = true)]
async fn ctrl_18_omitted_scope_lists_children_with_the_calls_token() {
    let listing = Arc::new(Recording::default());
    let rig = Rig::with_listing(vec![], listing.clone()).await;
    let signal = Signal::new();
    let result = rig
        .call_with("list_agents", PARENT, list(None), signal.clone())
        .await;
    assert_eq!(ok_text(&result), "(no subagents)");
    let calls = listing.calls();
    assert_eq!(calls.len(), 1);
    let (asked, id, forwarded) = &calls[0];
    assert_eq!((*asked, id.as_str()), (Asked::Children, PARENT));
    assert!(!forwarded.is_cancelled());
    signal.cancel(agent::CancelCause::User);
    assert!(forwarded.is_cancelled(), "the listing got the call's token");
    rig.finish().await;
}

/// spec: CTRL-26 — an explicit `descendants` scope calls the descendants listing, once, with
/// the caller's id and the call's own token.
#[tokio::test(start_paused = true)]
async fn ctrl_26_explicit_descendants_lists_descendants_with_the_calls_token() {
    let listing = Arc::new(Recording::default());
    let rig = Rig::with_listing(vec![], listing.clone()).await;
    let signal = Signal::new();
    let result = rig
        .call_with("list_agents", PARENT, list(Some("descendants")), signal.clone())
        .await;
    assert_eq!(ok_text(&result), "(no subagents)");
    let calls = listing.calls();
    assert_eq!(calls.len(), 1);
    let (asked, id, forwarded) = &calls[0];
    assert_eq!((*asked, id.as_str()), (Asked::Descendants, PARENT));
    signal.cancel(agent::CancelCause::User);
    assert!(forwarded.is_cancelled(), "the listing got the call's token");
    rig.finish().await;
}

/// spec: CTRL-25 — scope `descendants` omits a one-shot intermediate but lists the continuable
/// leaf beneath it (its parent being that intermediate) and a positioned diagnostic.
#[tokio::test(start_paused = true)]
async fn ctrl_25_descendants_omit_one_shot_intermediates() {
    let listing = Arc::new(Recording {
        descendants: vec![
            at(
                child(
                    "one-shot-mid",
                    "one-shot",
                    "one-shot intermediate",
                    Activity::Inactive,
                ),
                PARENT,
                1,
            ),
            at(
                child("deep-leaf", "continuable", "deep leaf", Activity::Inactive),
                "one-shot-mid",
                2,
            ),
            at(
                diagnostic("broken-node", DiagnosticReason::Unavailable),
                PARENT,
                1,
            ),
        ],
        ..Recording::default()
    });
    let rig = Rig::with_listing(vec![], listing).await;
    let result = rig.call("list_agents", PARENT, list(Some("descendants"))).await;
    assert_eq!(
        ok_text(&result),
        "deep-leaf [ready] parent=one-shot-mid depth=2 — deep leaf\n\
         broken-node [diagnostic: unavailable] parent=parent depth=1"
    );
    assert_eq!(
        result.value,
        Some(json!([
            {"kind": "child", "id": "deep-leaf", "label": "deep leaf", "status": "ready",
             "parent": "one-shot-mid", "depth": 2},
            {"kind": "diagnostic", "id": "broken-node", "reason": "unavailable",
             "parent": "parent", "depth": 1},
        ]))
    );
    rig.finish().await;
}

/// spec: CTRL-21 — `list_agents` without a (live) calling agent fails `requires a calling
/// agent`, and the listing is never asked.
#[tokio::test(start_paused = true)]
async fn ctrl_21_list_agents_requires_a_calling_agent() {
    let listing = Arc::new(Recording::default());
    let rig = Rig::with_listing(vec![], listing.clone()).await;
    let (_, message) = error(&rig.call("list_agents", "ghost", list(None)).await);
    assert_eq!(
        message,
        "list_agents requires a calling agent (exec.agent was undefined)"
    );
    assert!(listing.calls().is_empty());
    rig.finish().await;
}

/// A `scope` other than the two values is refused `INVALID_ARGS` before the listing is asked;
/// a persistence failure of the listing is `FAILED` with its error chain.
#[tokio::test(start_paused = true)]
async fn bad_scopes_and_backend_failures_are_typed_errors() {
    let listing = Arc::new(Recording::default());
    let rig = Rig::with_listing(vec![], listing.clone()).await;
    for scope in [json!("all"), json!(2), json!(["children"])] {
        let (code, message) = error(&rig.call("list_agents", PARENT, json!({"scope": scope})).await);
        assert_eq!(code, "INVALID_ARGS");
        assert_eq!(
            message,
            "list_agents argument `scope` must be \"children\" or \"descendants\" when present"
        );
    }
    assert!(listing.calls().is_empty());
    rig.finish().await;

    let failing = Arc::new(Recording {
        failure: Some(|| ListingError::Persistence(AgentError::Persistence("disk gone".into()))),
        ..Recording::default()
    });
    let rig = Rig::with_listing(vec![], failing).await;
    let (code, message) = error(&rig.call("list_agents", PARENT, list(None)).await);
    assert_eq!(code, "FAILED");
    assert_eq!(message, "persistence: disk gone");
    rig.finish().await;
}

/// §4.4 — "one line per entry": a label is the delegating model's free text, and a line
/// break in it is rendered as a space, so it can neither split its entry nor forge another
/// (here a fake direct child); the value keeps the label verbatim.
#[tokio::test(start_paused = true)]
async fn a_label_with_line_breaks_stays_on_its_entry_line() {
    let rig = Rig::new(vec![answer("done")]).await;
    let label = "first part\nforged [idle] — fake child\r\nlast\u{2028}part";
    let child = rig.start(rig.parent(), "child", label, "child task").await;
    rig.until_released(&child).await;
    for scope in [None, Some("descendants")] {
        let result = rig.call("list_agents", PARENT, list(scope)).await;
        let text = ok_text(&result);
        assert_eq!(text.lines().count(), 1, "one entry, one line: {text:?}");
        assert!(text.starts_with("child [ready]"), "{text:?}");
        assert!(
            text.ends_with("— first part forged [idle] — fake child  last part"),
            "{text:?}"
        );
        assert_eq!(result.value.as_ref().expect("a value")[0]["label"], json!(label));
    }
    rig.finish().await;
}
