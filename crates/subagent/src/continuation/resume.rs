//! Cold resume (spec §2.14.5): a follow-up to a continuable child with no resident Activation
//! re-materializes it from its persisted session.

use std::sync::Arc;

use agent::runtime::Setup;
use agent::{AgentError, AgentRef, Ctx, ResumeAgentOptions, SessionId, Signal};
use futures::FutureExt;

use super::activation::Activation;
use super::{Inner, check_signal, runtime_call, store_call};
use crate::compose::apply_child_composition;
use crate::composition::ChildComposition;
use crate::descriptor::{SubagentDescriptor, fold_subagent_descriptor};
use crate::error::{SubagentError, SubagentErrorCode};

impl Inner {
    /// Cold resume (spec §2.14.5): re-materializes the persisted child `child_id` as a new
    /// resident Activation (start edge emitted, watcher running) without delivering anything.
    /// Runs under the child lock `lock`.
    pub(super) async fn cold_resume(
        self: &Arc<Self>,
        parent: &AgentRef,
        child_id: &SessionId,
        lock: &super::ChildLock,
        signal: &Signal,
    ) -> Result<Arc<Activation>, SubagentError> {
        let persistence = self
            .services
            .persistence
            .clone()
            .ok_or_else(SubagentError::persistence_unavailable)?;
        let unavailable = |e: Option<AgentError>| {
            if signal.is_cancelled() {
                return check_signal(signal).expect_err("cancelled");
            }
            let error = SubagentError::child_unavailable(child_id.as_str());
            match e {
                Some(e) => error.with_source(e),
                None => error,
            }
        };
        // The store's reads are raced with the signal: an abort during a slow inspection or
        // load rejects at once (the read is dropped; reads have no effects to undo).
        // The store is host code: a panic in a read is contained as that read's failure.
        let header = match until_cancelled(signal, store_call(|| persistence.inspect(child_id))).await? {
            Ok(Some(header)) => header,
            Ok(None) => return Err(unavailable(None)),
            Err(e) => return Err(unavailable(Some(e))),
        };
        check_signal(signal)?;
        // A store answering with another session's header (corrupt or hostile) must not get that
        // session resumed and adopted under this child's id.
        if &header.id != child_id {
            return Err(SubagentError::child_session_mismatch(
                child_id.as_str(),
                header.id.as_str(),
            ));
        }
        self.admit(parent)?;
        self.authorize(parent, child_id, header.parent_session.as_ref())?;
        let loaded = until_cancelled(signal, store_call(|| persistence.load(child_id)))
            .await?
            .map_err(|e| unavailable(Some(e)))?;
        check_signal(signal)?;
        let own = loaded
            .events
            .get(header.seed_length.unwrap_or(0) as usize..)
            .unwrap_or(&[]);
        let state = fold_subagent_descriptor(own.iter())
            .map_err(|e| SubagentError::new(SubagentErrorCode::NotResumable, e.to_string()).with_source(e))?;
        let Some(SubagentDescriptor::Continuable(descriptor)) = state.into_supported() else {
            return Err(SubagentError::no_continuation_state(child_id.as_str()));
        };
        let resume = ResumeAgentOptions {
            session_id: child_id.clone(),
            agent_options: agent::AgentOptions {
                provider: descriptor.agent_provider.as_deref().map(Into::into),
                model: descriptor.agent_model.as_deref().map(Into::into),
                ..agent::AgentOptions::default()
            },
            signal: Some(signal.clone()),
            setup: Some(resume_setup(
                self.setup.clone(),
                ChildComposition {
                    persona: descriptor.persona.clone(),
                    tool_filter: descriptor.tool_filter.clone(),
                },
            )),
            owner: None,
        };
        // Registered before the admission check, so a drain starting meanwhile either finds
        // this record (and waits for it) or is found by the check: never neither.
        let materializing = self.begin_materialization(parent);
        self.admit(parent)?;
        let handle = runtime_call(|| self.services.agents.resume(resume))
            .await
            .map_err(|e| {
                if signal.is_cancelled() {
                    return check_signal(signal).expect_err("cancelled");
                }
                match seam_error_within(e) {
                    Ok(seam) => seam,
                    Err(e) => SubagentError::child_unavailable(child_id.as_str()).with_source(e),
                }
            })?;
        if handle.id() != child_id {
            // The runtime resumed what the store handed it at load time: not this child.
            let found = handle.id().clone();
            // The handle's disposal is host code: a panic there is contained (it fails nothing
            // more than this refusal already does). It runs as a tracked task holding the
            // in-flight record, so the foreign agent is still released — and drains still wait
            // for it — when this follow-up is dropped meanwhile.
            let released = self.tasks.spawn(async move {
                if let Err(panic) = super::contained(|| handle.dispose()).await {
                    tracing::warn!(panic = %panic,
                        "the handle disposal of an agent resumed as another session failed");
                }
                drop(materializing);
            });
            if let Err(e) = released.await {
                tracing::warn!(error = %e, "releasing an agent resumed as another session failed");
            }
            return Err(SubagentError::child_session_mismatch(
                child_id.as_str(),
                found.as_str(),
            ));
        }
        let parent_session = header
            .parent_session
            .clone()
            .unwrap_or_else(|| parent.id().clone());
        let activation = Activation::new(child_id.clone(), parent_session, descriptor.provider, handle);
        self.activations
            .lock()
            .insert(child_id.clone(), activation.clone());
        if let Err(e) = self.make_resident(&activation, parent, signal) {
            self.rollback(activation, materializing).await;
            return Err(e);
        }
        drop(materializing);
        self.spawn_watcher(&activation, lock.clone());
        Ok(activation)
    }
}

/// The [`SubagentError`] a runtime's resume failed with — directly (`AgentError::Other`) or from
/// the setup window (`AgentError::Setup`) — moved out unchanged (spec §2.14.5: a seam error
/// raised while re-materializing propagates as it is); any other failure is given back.
pub(super) fn seam_error_within(e: AgentError) -> Result<SubagentError, AgentError> {
    match e {
        AgentError::Other(source) => source
            .downcast::<SubagentError>()
            .map(|seam| *seam)
            .map_err(AgentError::Other),
        AgentError::Setup { id, source } => source
            .downcast::<SubagentError>()
            .map(|seam| *seam)
            .map_err(|source| AgentError::Setup { id, source }),
        other => Err(other),
    }
}

/// The setup window of a cold-resumed child: the child composition (no descriptor, no policy
/// re-capture), then the setup contributions, whose commit it returns.
fn resume_setup(contributions: Arc<super::setup::SetupRegistry>, composition: ChildComposition) -> Setup {
    Box::new(move |ctx: Ctx| {
        async move {
            apply_child_composition(&ctx, &composition)?;
            Ok(Some(contributions.apply(&ctx)?))
        }
        .boxed()
    })
}

/// `read`'s output, unless `signal` is cancelled first (then the `CANCELLED` rejection, and
/// `read` is dropped).
pub(super) async fn until_cancelled<F: std::future::Future>(
    signal: &Signal,
    read: F,
) -> Result<F::Output, SubagentError> {
    check_signal(signal)?;
    tokio::select! {
        biased;
        () = signal.cancelled() => Err(check_signal(signal).expect_err("cancelled")),
        output = read => Ok(output),
    }
}
