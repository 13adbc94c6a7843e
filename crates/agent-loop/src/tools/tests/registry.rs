//! Layers, shadowing, restrictions and registration guards (spec §7, §11.1–11.3).

use std::sync::Arc;

use agent::Tools;
use agent::tools::{ToolRegistryError, ToolRestriction, codes};

use super::{ToolRegistry, call, code, names, run, sid, text, tool, tool_replying};

fn allow(names: &[&str]) -> ToolRestriction {
    ToolRestriction {
        allow: Some(names.iter().map(|n| (*n).to_owned()).collect()),
        deny: None,
    }
}

fn deny(names: &[&str]) -> ToolRestriction {
    ToolRestriction {
        allow: None,
        deny: Some(names.iter().map(|n| (*n).to_owned()).collect()),
    }
}

/// spec: SPN-63 — `restrict` masks inherited tools, keeps scope-local tools, and refuses masked
/// calls as `unknown tool` (code `UNKNOWN_TOOL`), in schemas, lookup and execution alike.
#[tokio::test]
async fn restrict_masks_inherited_keeps_local_and_refuses_masked_calls() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let _read = reg.register(None, tool("read")).unwrap();
    let _bash = reg.register(None, tool("bash")).unwrap();
    let _capture = reg.register(Some(&a), tool("capture")).unwrap();
    let _r = reg.restrict(Some(&a), allow(&["read"])).unwrap();

    assert_eq!(names(&reg, Some("a")), ["capture", "read"]);
    assert!(reg.get("bash", Some(&a)).is_none());
    assert!(reg.get("read", Some(&a)).is_some());

    let masked = reg
        .execute(&a, call("c1", "bash", "{}"), agent::Signal::new())
        .await;
    assert!(masked.result.is_error);
    assert_eq!(code(&masked), codes::UNKNOWN_TOOL);
    assert_eq!(
        masked.result.error.as_ref().unwrap().message,
        "unknown tool \"bash\""
    );
    assert_eq!(text(&masked), "Error: unknown tool \"bash\"");
    assert_eq!(run(&reg, "read", "a").await, "ran:read");
    assert_eq!(run(&reg, "capture", "a").await, "ran:capture");

    // Other scopes and the global view are untouched.
    assert_eq!(names(&reg, None), ["bash", "read"]);
    assert_eq!(names(&reg, Some("other")), ["bash", "read"]);
    assert_eq!(run(&reg, "bash", "other").await, "ran:bash");
}

/// spec: SPN-63 — restrictions filter the live inherited surface, including tools registered
/// globally after the restriction, and never the scope's own later registrations.
#[tokio::test]
async fn restrictions_apply_to_later_global_tools_but_not_to_own_ones() {
    let reg = ToolRegistry::new();
    let (denied, allowed) = (sid("denied"), sid("allowed"));
    let _read = reg.register(None, tool("read")).unwrap();
    let _bash = reg.register(None, tool("bash")).unwrap();
    let _d = reg.restrict(Some(&denied), deny(&["bash"])).unwrap();
    let _a = reg.restrict(Some(&allowed), allow(&["read"])).unwrap();

    let _web = reg.register(None, tool("web")).unwrap();
    let _dl = reg.register(Some(&denied), tool("denied-local")).unwrap();
    let _al = reg.register(Some(&allowed), tool("allowed-local")).unwrap();

    assert_eq!(names(&reg, Some("denied")), ["denied-local", "read", "web"]);
    assert_eq!(names(&reg, Some("allowed")), ["allowed-local", "read"]);
    assert_eq!(run(&reg, "web", "denied").await, "ran:web");
    assert_eq!(run(&reg, "web", "allowed").await, "Error: unknown tool \"web\"");
    assert_eq!(run(&reg, "denied-local", "denied").await, "ran:denied-local");
    assert_eq!(run(&reg, "allowed-local", "allowed").await, "ran:allowed-local");
}

/// spec: SPN-64 — several restrictions intersect and each one lifts independently.
#[test]
fn restrictions_intersect_and_lift_independently() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let _tools: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| reg.register(None, tool(n)).unwrap())
        .collect();
    let lift_allow = reg.restrict(Some(&a), allow(&["a", "b"])).unwrap();
    let lift_deny = reg.restrict(Some(&a), deny(&["b"])).unwrap();
    assert_eq!(names(&reg, Some("a")), ["a"]);

    lift_allow.dispose();
    // The deny remains after the allow-list is lifted.
    assert_eq!(names(&reg, Some("a")), ["a", "c"]);
    lift_deny.dispose();
    assert_eq!(names(&reg, Some("a")), ["a", "b", "c"]);
    assert_eq!(reg.counts().restrictions, 0);
}

/// spec: SPN-64 — filter values are compiled (copied, by name) at registration: changing the
/// caller's filter afterwards has no effect, and the compiled name keeps masking a tool that
/// is unregistered and registered again.
#[test]
fn restrictions_are_compiled_at_registration() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let tool_a = reg.register(None, tool("a")).unwrap();
    let _b = reg.register(None, tool("b")).unwrap();
    let mut filter = deny(&["a"]);
    let _r = reg.restrict(Some(&a), filter.clone()).unwrap();
    filter.deny.as_mut().unwrap().push("b".to_owned());
    assert_eq!(names(&reg, Some("a")), ["b"]);

    drop(tool_a);
    assert_eq!(names(&reg, Some("a")), ["b"]);
    let _again = reg.register(None, tool("a")).unwrap();
    assert_eq!(names(&reg, Some("a")), ["b"]);
    assert_eq!(names(&reg, None), ["a", "b"]);
}

/// spec: SPN-65 — `restrict` fails loud when unscoped, empty, naming unknown names (listing the
/// known inherited names, or `(none)`), naming the scope's own registrations, or `run_code`;
/// a refused restriction registers nothing.
#[test]
fn restrict_fails_loud() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let _real = reg.register(None, tool("real")).unwrap();
    let _more = reg.register(None, tool("another")).unwrap();
    let _local = reg.register(Some(&a), tool("local")).unwrap();

    let err = reg.restrict(None, deny(&["real"])).unwrap_err();
    assert_eq!(err, ToolRegistryError::Unscoped);
    assert_eq!(err.to_string(), "tool restriction requires a scoped context");

    let err = reg.restrict(Some(&a), ToolRestriction::default()).unwrap_err();
    assert_eq!(err, ToolRegistryError::EmptyRestriction);
    assert_eq!(
        err.to_string(),
        "tool restriction is empty: name at least one tool in allow or deny"
    );

    let err = reg.restrict(Some(&a), allow(&["local"])).unwrap_err();
    assert_eq!(err, ToolRegistryError::OwnName("local".into()));
    assert_eq!(
        err.to_string(),
        "tool \"local\" is registered by this scope; a restriction filters only inherited tools"
    );

    let err = reg.restrict(Some(&a), allow(&["reall"])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown global tool \"reall\"; known global tools: another, real"
    );

    let err = reg
        .restrict(Some(&a), deny(&["ghost", "real", "wraith", "ghost"]))
        .unwrap_err();
    assert_eq!(
        err,
        ToolRegistryError::UnknownNames {
            names: "\"ghost\", \"wraith\"".into(),
            known: "another, real".into(),
        }
    );

    let err = reg.restrict(Some(&a), deny(&["run_code"])).unwrap_err();
    assert_eq!(err, ToolRegistryError::Reserved);
    assert_eq!(err.to_string(), "tool name \"run_code\" is reserved");

    let empty = ToolRegistry::new();
    let err = empty.restrict(Some(&a), deny(&["ghost"])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown global tool \"ghost\"; known global tools: (none)"
    );

    assert_eq!(reg.counts().restrictions, 0);
    assert_eq!(names(&reg, Some("a")), ["another", "local", "real"]);

    // An explicit empty allow-list is a real filter (it keeps nothing inherited), not a no-op.
    let _none = reg.restrict(Some(&a), allow(&[])).unwrap();
    assert_eq!(names(&reg, Some("a")), ["local"]);
}

/// spec: SPN-66 — a child's filter reaches tools it inherits from an ancestor scope; the
/// ancestor keeps its whole surface.
#[tokio::test]
async fn child_filter_reaches_tools_inherited_from_an_ancestor() {
    let reg = ToolRegistry::new();
    let (parent, child) = (sid("parent"), sid("child"));
    let _bash = reg.register(Some(&parent), tool("bash")).unwrap();
    let _read = reg.register(Some(&parent), tool("read")).unwrap();
    let _edge = reg.set_scope_parent(&child, &parent);

    assert_eq!(names(&reg, Some("child")), ["bash", "read"]);
    let _r = reg.restrict(Some(&child), deny(&["bash"])).unwrap();
    assert_eq!(names(&reg, Some("child")), ["read"]);
    assert_eq!(run(&reg, "bash", "child").await, "Error: unknown tool \"bash\"");
    assert_eq!(names(&reg, Some("parent")), ["bash", "read"]);
    assert_eq!(run(&reg, "bash", "parent").await, "ran:bash");
}

/// spec: SPN-66 — a child's own registrations stay outside its own filter.
#[tokio::test]
async fn child_filter_never_hides_its_own_registrations() {
    let reg = ToolRegistry::new();
    let (parent, child) = (sid("parent"), sid("child"));
    let _bash = reg.register(Some(&parent), tool("bash")).unwrap();
    let _read = reg.register(Some(&parent), tool("read")).unwrap();
    let _edge = reg.set_scope_parent(&child, &parent);
    let _report = reg.register(Some(&child), tool("report")).unwrap();
    let _r = reg.restrict(Some(&child), allow(&["read"])).unwrap();

    assert_eq!(names(&reg, Some("child")), ["read", "report"]);
    assert_eq!(run(&reg, "report", "child").await, "ran:report");
}

/// spec: SPN-66 — an ancestor's restriction reaches every scope nested inside it (through
/// several levels), a child's never affects its parent, and dropping the parent edge returns
/// the child to a flat (global-only) view.
#[tokio::test]
async fn ancestor_filters_reach_nested_scopes() {
    let reg = ToolRegistry::new();
    let (parent, child, grandchild) = (sid("parent"), sid("child"), sid("grandchild"));
    let _web = reg.register(None, tool("web")).unwrap();
    let _bash = reg.register(Some(&parent), tool("bash")).unwrap();
    let edge = reg.set_scope_parent(&child, &parent);
    let _edge2 = reg.set_scope_parent(&grandchild, &child);
    let _r = reg.restrict(Some(&parent), deny(&["web"])).unwrap();

    assert_eq!(names(&reg, Some("parent")), ["bash"]);
    assert_eq!(names(&reg, Some("child")), ["bash"]);
    assert_eq!(names(&reg, Some("grandchild")), ["bash"]);
    assert_eq!(
        run(&reg, "web", "grandchild").await,
        "Error: unknown tool \"web\""
    );

    let _child_r = reg.restrict(Some(&child), deny(&["bash"])).unwrap();
    assert_eq!(names(&reg, Some("grandchild")), Vec::<String>::new());
    assert_eq!(names(&reg, Some("parent")), ["bash"]);

    drop(edge);
    assert_eq!(names(&reg, Some("child")), ["web"]);
    assert_eq!(names(&reg, Some("grandchild")), ["web"]);
}

/// spec: SPN-66 — an ancestor's restriction filters what that ancestor *inherits*, never its
/// own registrations, so a nested scope sees exactly the surface the ancestor sees (plus its
/// own). The ancestor's `allow` list cannot even name its own tools (that is refused), so
/// applying it to them hid every tool the ancestor contributes from its nested scopes; and a
/// farther ancestor's `deny` of a global name hid a nearer ancestor's own tool of that name.
/// `schemas` and execution must agree.
#[tokio::test]
async fn an_ancestor_filter_never_hides_the_ancestors_own_tools_from_nested_scopes() {
    let reg = ToolRegistry::new();
    let (grand, parent, child) = (sid("grand"), sid("parent"), sid("child"));
    let _web = reg.register(None, tool("web")).unwrap();
    let _read = reg.register(None, tool("read")).unwrap();
    let _edge = reg.set_scope_parent(&child, &parent);
    let _edge2 = reg.set_scope_parent(&parent, &grand);

    // The parent exposes its own `bash` and only `read` of what it inherits.
    let _bash = reg.register(Some(&parent), tool("bash")).unwrap();
    let _r = reg.restrict(Some(&parent), allow(&["read"])).unwrap();
    assert_eq!(names(&reg, Some("parent")), ["bash", "read"]);
    assert_eq!(names(&reg, Some("child")), ["bash", "read"]);
    assert_eq!(run(&reg, "bash", "child").await, "ran:bash");
    assert!(reg.get("bash", Some(&child)).is_some());
    assert_eq!(run(&reg, "web", "child").await, "Error: unknown tool \"web\"");

    // A farther ancestor denies the global `web`; the parent's own `web` shadows it and
    // stays visible below the parent.
    drop(_r);
    let _g = reg.restrict(Some(&grand), deny(&["web"])).unwrap();
    let _own_web = reg
        .register(Some(&parent), tool_replying("web", "parent-web"))
        .unwrap();
    assert_eq!(names(&reg, Some("grand")), ["read"]);
    assert_eq!(names(&reg, Some("parent")), ["bash", "read", "web"]);
    assert_eq!(names(&reg, Some("child")), ["bash", "read", "web"]);
    assert_eq!(run(&reg, "web", "child").await, "parent-web");

    // The child's own restriction still reaches everything it inherits.
    let _c = reg.restrict(Some(&child), deny(&["bash", "web"])).unwrap();
    assert_eq!(names(&reg, Some("child")), ["read"]);
    assert_eq!(run(&reg, "web", "child").await, "Error: unknown tool \"web\"");
}

/// Nearer layers shadow farther ones by name, in either registration order.
#[tokio::test]
async fn nearer_layers_shadow_farther_ones() {
    let reg = ToolRegistry::new();
    let (parent, child) = (sid("parent"), sid("child"));
    let _edge = reg.set_scope_parent(&child, &parent);
    let _own = reg
        .register(Some(&child), tool_replying("bash", "child-bash"))
        .unwrap();
    let _global = reg.register(None, tool_replying("bash", "global-bash")).unwrap();
    let _mid = reg
        .register(Some(&parent), tool_replying("bash", "parent-bash"))
        .unwrap();

    assert_eq!(run(&reg, "bash", "child").await, "child-bash");
    assert_eq!(run(&reg, "bash", "parent").await, "parent-bash");
    assert_eq!(run(&reg, "bash", "other").await, "global-bash");
    assert_eq!(names(&reg, Some("child")), ["bash"]);
}

/// Scoped tools are visible and executable for their scope only; the global view never
/// contains them.
#[tokio::test]
async fn scoped_tools_stay_in_their_layer() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let _shared = reg.register(None, tool("shared")).unwrap();
    let _mine = reg.register(Some(&a), tool("mine")).unwrap();

    assert_eq!(names(&reg, Some("a")), ["mine", "shared"]);
    assert_eq!(names(&reg, None), ["shared"]);
    assert_eq!(names(&reg, Some("other")), ["shared"]);
    assert!(reg.get("mine", None).is_none());
    assert_eq!(run(&reg, "mine", "a").await, "ran:mine");
    assert_eq!(run(&reg, "mine", "other").await, "Error: unknown tool \"mine\"");
}

/// A name no model could call — empty, or with whitespace or control characters anywhere — is
/// refused in every layer, with nothing registered. (Such names used to be accepted.)
#[test]
fn uncallable_names_are_refused() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    for name in [
        "",
        " ",
        "read file",
        " read",
        "read\t",
        "read\n",
        "re\u{7}ad",
        "\u{a0}",
    ] {
        for scope in [None, Some(&a)] {
            assert_eq!(
                reg.register(scope, tool(name)).unwrap_err(),
                ToolRegistryError::InvalidName(name.into()),
                "{name:?}"
            );
        }
    }
    assert_eq!(
        reg.register(None, tool("read file")).unwrap_err().to_string(),
        "tool name \"read file\" is not callable: it must be non-empty, without whitespace or control characters"
    );
    assert!(names(&reg, Some("a")).is_empty(), "nothing was registered");
    // Punctuation, digits and non-ASCII letters are callable names.
    let _ok =
        ["read_file", "fs.read-1", "lire_fichier_é"].map(|name| reg.register(None, tool(name)).unwrap());
}

/// One name per layer; `run_code` can never be registered.
#[test]
fn registration_rules() {
    let reg = ToolRegistry::new();
    let a = sid("a");
    let _x = reg.register(None, tool("x")).unwrap();
    let err = reg.register(None, tool("x")).unwrap_err();
    assert_eq!(err.to_string(), "tool \"x\" is already registered in this layer");
    let _y = reg.register(Some(&a), tool("y")).unwrap();
    assert_eq!(
        reg.register(Some(&a), tool("y")).unwrap_err(),
        ToolRegistryError::Duplicate("y".into())
    );
    // The same name in another layer is a shadow, not a duplicate.
    let _x_scoped = reg.register(Some(&a), tool("x")).unwrap();
    assert_eq!(
        reg.register(None, tool("run_code")).unwrap_err(),
        ToolRegistryError::Reserved
    );
    assert_eq!(
        reg.register(Some(&a), tool("run_code")).unwrap_err(),
        ToolRegistryError::Reserved
    );
    assert_eq!(reg.counts().tools, 3);
}

/// Schemas are ordered by name and carry exactly the model-facing fields.
#[test]
fn schemas_are_sorted_by_name() {
    let reg = ToolRegistry::new();
    let _g: Vec<_> = ["zeta", "alpha", "mid"]
        .iter()
        .map(|n| reg.register(None, tool(n)).unwrap())
        .collect();
    let schemas = reg.schemas(None);
    assert_eq!(
        schemas.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["alpha", "mid", "zeta"]
    );
    assert_eq!(schemas[0].description, "tool alpha");
    assert_eq!(
        schemas[0].parameters,
        serde_json::json!({"type": "object", "properties": {}})
    );
}

/// Every registration kind is undone by its guard; the registry ends empty, and a guard that
/// outlives its registry is harmless.
#[test]
fn registry_ends_empty_after_all_guards_drop() {
    let reg = ToolRegistry::new();
    let (a, b) = (sid("a"), sid("b"));
    let mut guards = vec![
        reg.register(None, tool("g")).unwrap(),
        reg.register(Some(&a), tool("own")).unwrap(),
        reg.register(Some(&b), tool("mid")).unwrap(),
        reg.set_scope_parent(&a, &b),
        reg.restrict(Some(&a), deny(&["g"])).unwrap(),
        reg.guard(None, Arc::new(|_| None)),
        reg.guard(Some(&a), Arc::new(|_| None)),
        reg.pre_execute(Some(&a), Arc::new(|_, d| d)),
        reg.post_execute(None, Arc::new(|_, _| None)),
        reg.on_result(Some(&a), Arc::new(|_, _| {})),
        reg.set_approval(Arc::new(super::pipeline::Approve(
            super::super::ApprovalOutcome::AllowedOnce,
        ))),
    ];
    let counts = reg.counts();
    assert_eq!(counts.tools, 3);
    assert_eq!(counts.restrictions, 1);
    assert_eq!(counts.guards, 2);
    assert_eq!(counts.pre_execute, 1);
    assert_eq!(counts.post_execute, 1);
    assert_eq!(counts.observers, 1);
    assert_eq!(counts.scope_parents, 1);
    assert_eq!(counts.approvals, 1);
    assert_eq!(counts.scope_layers, 2);
    assert_eq!(reg.len(), 11);
    assert!(!reg.is_empty());

    // Undo in an arbitrary order: the restriction outlives the tool it names.
    guards.swap(0, 4);
    while let Some(g) = guards.pop() {
        drop(g);
    }
    assert!(reg.is_empty());
    assert_eq!(reg.len(), 0);
    assert_eq!(reg.counts(), Default::default());

    let late = reg.register(None, tool("late")).unwrap();
    drop(reg);
    drop(late);
}

/// A registration guard dropped from inside a tool body (while the registry runs user code)
/// does not deadlock.
#[tokio::test]
async fn guards_can_be_dropped_from_user_code() {
    let reg = ToolRegistry::new();
    let slot: Arc<parking_lot::Mutex<Option<agent::Registration>>> = Arc::default();
    let s = slot.clone();
    let _t = reg
        .register(
            None,
            super::tool_with("unregister-self", false, move |_, _| {
                drop(s.lock().take());
                Box::pin(async { Ok(agent::tools::ToolOutput::text("done")) })
            }),
        )
        .unwrap();
    *slot.lock() = Some(reg.register(None, tool("victim")).unwrap());
    let _obs = reg.on_result(None, Arc::new(|_, _| {}));
    assert_eq!(run(&reg, "unregister-self", "a").await, "done");
    assert!(reg.get("victim", None).is_none());

    // A definition that owns another registration: removing it drops that guard too, which
    // re-enters the registry after the removal released the lock.
    let inner_guard = reg.register(None, tool("inner")).unwrap();
    let holder = reg
        .register(
            None,
            super::tool_with("holder", false, move |_, _| {
                let _ = &inner_guard;
                Box::pin(async { Ok(agent::tools::ToolOutput::text("held")) })
            }),
        )
        .unwrap();
    assert!(reg.get("inner", None).is_some());
    drop(holder);
    assert!(reg.get("inner", None).is_none());
    assert!(reg.get("holder", None).is_none());
}
