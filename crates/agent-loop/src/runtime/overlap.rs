//! Overlapping transactions of one id: a creation (or resumption) in its setup window owns the
//! id, so the registrations its setup makes through the agent's scope — keyed by the id —
//! never reach another agent of that id.

use std::sync::Arc;

use futures::FutureExt;

use agent::prompt::{PERSONA_SECTION, PromptSection};
use agent::runtime::Setup;
use agent::{AgentError, AgentHandle, AgentRuntime, Ctx};

use super::Runtime;
use crate::model::{ScriptedModel, chunks};
use crate::runtime::testkit::*;

/// A setup that registers a scoped persona `text`, then waits for `go` before it commits.
fn persona_then_wait(text: &'static str, go: tokio::sync::oneshot::Receiver<()>) -> Option<Setup> {
    Some(Box::new(move |ctx: Ctx| {
        async move {
            ctx.prompt_section(PromptSection {
                name: PERSONA_SECTION.into(),
                order: 0,
                text: text.into(),
                tool: None,
            })?;
            let _ = go.await;
            Ok(None)
        }
        .boxed()
    }))
}

/// The system text of `handle`'s first turn (it runs one on the scripted model).
async fn first_system_text(model: &ScriptedModel, handle: &AgentHandle) -> Option<String> {
    handle.agent().followup(user("hi")).unwrap();
    handle.agent().when_idle().await;
    model.last_request().and_then(|r| r.system.clone())
}

/// What a second transaction of an id must yield while the first is in its setup window:
/// `Duplicate`, never a live agent (which would run under the first one's registrations).
async fn refused(
    model: &ScriptedModel,
    what: &str,
    second: Result<AgentHandle, AgentError>,
) -> Result<(), String> {
    match second {
        Err(AgentError::Duplicate(id)) if id.as_str() == "x" => Ok(()),
        Err(other) => Err(format!("{what}: unexpected error {other:?}")),
        Ok(handle) => {
            let system = first_system_text(model, &handle).await;
            handle.dispose().await;
            Err(format!(
                "{what} of \"x\" was published while another transaction of \"x\" was in its \
                 setup window; its system text was {system:?}"
            ))
        }
    }
}

/// spec: SPN-54 — scoped registrations are visible only to their agent: while a creation of
/// an id is in its setup window (its setup registered a scoped persona), a second creation of
/// the id is refused `Duplicate` at once instead of being published under the first one's
/// persona; the first then publishes with its own persona. Once a creation of the id failed
/// or was dropped mid-setup, the id is immediately reusable.
#[tokio::test(start_paused = true)]
async fn a_creation_in_setup_owns_its_id() {
    let model = ScriptedModel::new([chunks::text("ok"), chunks::text("ok"), chunks::text("ok")]);
    let rt = builder(&model).persona("deployment").build();

    let (go, wait) = tokio::sync::oneshot::channel();
    let mut first = create_options("x");
    first.setup = persona_then_wait("the first creation's persona", wait);
    let first = tokio::spawn({
        let rt: Runtime = rt.clone();
        async move { rt.create(first).await }
    });
    settle().await;
    assert!(AgentRuntime::get(&rt, &"x".into()).is_none(), "still in setup");

    let second = rt.create(create_options("x")).await;
    if let Err(why) = refused(&model, "a second creation", second).await {
        panic!("{why}");
    }

    go.send(()).unwrap();
    let handle = first.await.unwrap().expect("the first creation publishes");
    assert_eq!(
        first_system_text(&model, &handle).await.as_deref(),
        Some("the first creation's persona")
    );
    handle.dispose().await;

    // A creation dropped in its setup window frees the id at once.
    let (_go, wait) = tokio::sync::oneshot::channel();
    let mut dropped = create_options("x");
    dropped.setup = persona_then_wait("dropped", wait);
    let mut dropped = Box::pin(rt.create(dropped));
    assert!(futures::poll!(dropped.as_mut()).is_pending());
    drop(dropped);
    let again = rt
        .create(create_options("x"))
        .await
        .expect("the id is free again");
    assert_eq!(
        first_system_text(&model, &again).await.as_deref(),
        Some("deployment")
    );
    finish(&rt, [again]).await;
}

/// spec: SPN-54 — the same for resumption: while a resume of a stored session is in its setup
/// window, a second resume of it is refused `Duplicate` (it neither loads nor claims the log)
/// instead of being published under the first one's registrations.
#[tokio::test(start_paused = true)]
async fn a_resume_in_setup_owns_its_id() {
    let model = ScriptedModel::new([chunks::text("ok"), chunks::text("ok"), chunks::text("ok")]);
    let persistence = Arc::new(TestPersistence::default());
    let rt = builder(&model)
        .persona("deployment")
        .persistence(persistence.clone())
        .build();
    let stored = create(&rt, "x").await;
    stored.dispose().await;

    let (go, wait) = tokio::sync::oneshot::channel();
    let mut first = resume_options("x");
    first.setup = persona_then_wait("the first resume's persona", wait);
    let first = tokio::spawn({
        let rt: Runtime = rt.clone();
        async move { rt.resume(first).await }
    });
    settle().await;
    assert!(AgentRuntime::get(&rt, &"x".into()).is_none(), "still in setup");

    let second = rt.resume(resume_options("x")).await;
    if let Err(why) = refused(&model, "a second resume", second).await {
        panic!("{why}");
    }

    go.send(()).unwrap();
    let handle = first.await.unwrap().expect("the first resume publishes");
    assert_eq!(
        first_system_text(&model, &handle).await.as_deref(),
        Some("the first resume's persona")
    );
    finish(&rt, [handle]).await;
}
