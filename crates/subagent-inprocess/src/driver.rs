//! [`InProcessDriver`]: the one implementation of an in-process one-shot start (spec
//! `inprocess-providers.md` §3.1–§3.5). Spawn and fork differ only in the seed they pass.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use subagent::agent::bus::panic_message;
use subagent::agent::prefix::is_balanced;
use subagent::agent::runtime::{Commit, Setup};
use subagent::agent::{
    AgentError, AgentHandle, ContentBlock, CreateAgentOptions, Ctx, Message, MessageSource, Services,
    SessionEvent, SessionId, Signal,
};
use subagent::compose::apply_child_composition;
use subagent::provider::ResolvedSubagentStartRequest;
use subagent::run::{RunFailure, SubagentRun};
use subagent::{
    ChildComposition, DelegatedPolicyOverrides, PolicyServices, SubagentError,
    append_delegated_policy_overrides, assert_output_schema, assert_subagent_max_depth,
    capture_delegated_policy_overrides, child_session_meta, delegation_depth_of, resolve_child_agent_options,
    resolve_child_depth,
};
use tokio_util::task::TaskTracker;

use crate::descriptor::DescriptorAppend;
use crate::error::StartFailure;
use crate::run::{Drive, LocalRun, RunState};
use crate::structured::StructuredCapture;

/// What distinguishes one in-process provider's start from another's.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InProcessRunOptions {
    /// A creation seed: the parent's balanced completed-turn prefix (`fork`), or `None` for a
    /// fresh child (`spawn`). An empty seed is the same as `None`: the child is created
    /// unseeded (no `session/end-seed` marker, no `seedLength`). A seed that is not balanced
    /// ([`is_balanced`]) rejects the start with
    /// [`StartFailure::UnbalancedSeed`].
    pub seed: Option<Vec<SessionEvent>>,
}

impl InProcessRunOptions {
    /// A fresh, unseeded child.
    pub fn fresh() -> Self {
        Self::default()
    }

    /// A child seeded with `seed`.
    pub fn seeded(seed: Vec<SessionEvent>) -> Self {
        Self { seed: Some(seed) }
    }
}

/// The shared in-process driver. Cheap to clone (shared).
///
/// Holds the host's [`Services`] (children are created through `services.agents`, owned by the
/// parent's scope), which optional policy services the host composes (for delegated policy
/// capture), and the tracker of the per-run result tasks it starts.
///
/// # Ownership, drop and cancellation
/// * The driver owns nothing per run after [`start`](Self::start) fulfils: the returned
///   [`LocalRun`] owns the child's handle and must be disposed by the caller.
/// * Result tasks are tracked; [`task_count`](Self::task_count) is zero once every run's result
///   settled (at the latest when every run was disposed) and [`wait`](Self::wait) awaits them.
/// * Dropping the driver does not affect accepted runs.
#[derive(Clone)]
pub struct InProcessDriver {
    inner: Arc<Inner>,
}

struct Inner {
    services: Services,
    policy: PolicyServices,
    tasks: TaskTracker,
}

impl fmt::Debug for InProcessDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessDriver")
            .field("policy", &self.inner.policy)
            .field("tasks", &self.inner.tasks.len())
            .finish()
    }
}

impl InProcessDriver {
    /// A driver creating children through `services.agents`, with no policy services composed.
    pub fn new(services: Services) -> Self {
        Self::with_policy(services, PolicyServices::default())
    }

    /// A driver for a host that composes the policy services `policy` (a sandbox-policy service
    /// makes the parent's explicit sandbox override reach the child; an approval service pins
    /// the child's approval policy to `never`).
    pub fn with_policy(services: Services, policy: PolicyServices) -> Self {
        Self {
            inner: Arc::new(Inner {
                services,
                policy,
                // Closed from the start and never reopened: closing only lets `wait` resolve
                // once the tracker is empty (tasks are still tracked), so concurrent `wait`s
                // need no close-wait-reopen, whose reopen could strand another waiter.
                tasks: {
                    let tasks = TaskTracker::new();
                    tasks.close();
                    tasks
                },
            }),
        }
    }

    /// The host services children are created through.
    pub fn services(&self) -> &Services {
        &self.inner.services
    }

    /// The policy services the driver assumes the host composes.
    pub fn policy_services(&self) -> PolicyServices {
        self.inner.policy
    }

    /// The number of result tasks still running.
    pub fn task_count(&self) -> usize {
        self.inner.tasks.len()
    }

    /// Waits until every result task started so far has finished.
    pub async fn wait(&self) {
        self.inner.tasks.wait().await;
    }

    /// Starts one in-process one-shot child (spec §3.2).
    ///
    /// Runs synchronously, **at call time** (before the returned future is first polled):
    /// the output-schema assertion (`UNSUPPORTED_SCHEMA`, as the service does), `maxDepth`
    /// validation, the already-cancelled check (`subagent request was aborted before
    /// child publication`, nothing created), the child-depth resolution, the seed's balance
    /// ([`StartFailure::UnbalancedSeed`], nothing created), and the capture of the
    /// parent's delegated policy — so a parent switch made after this call belongs to the
    /// parent's future. The future then creates the child through `services.agents` with the
    /// request signal as creation token and the parent as owner, composes it in the setup window
    /// (policy events after any seed, delegation statement, persona, tool filter, structured
    /// runtime, descriptor interceptor), and on publication hands the signal over to the live run
    /// and delivers the prompt.
    ///
    /// Fulfilment **is** publication: on `Ok` the child is registered and the caller owns the
    /// returned [`LocalRun`]; on `Err` nothing was published (the creation transaction rolled
    /// back and quiesced). Dropping the future before it completes rolls the creation back too.
    /// A failure after publication — the prompt delivery returning an error or panicking — fails
    /// the run's result, not the start.
    pub fn start(
        &self,
        request: ResolvedSubagentStartRequest,
        options: InProcessRunOptions,
    ) -> BoxFuture<'static, Result<LocalRun, SubagentError>> {
        self.start_as(request, options, std::convert::identity)
    }

    /// [`start`](Self::start), fulfilling with the run already boxed as the
    /// `Box<dyn SubagentRun>` a provider's [`SubagentProvider::start`] returns: a provider can
    /// return this future as its own, with no second future (and allocation) around it.
    /// Everything else — what runs at call time, publication, drop — is exactly `start`'s.
    ///
    /// [`SubagentProvider::start`]: subagent::provider::SubagentProvider::start
    pub fn start_boxed(
        &self,
        request: ResolvedSubagentStartRequest,
        options: InProcessRunOptions,
    ) -> BoxFuture<'static, Result<Box<dyn SubagentRun>, SubagentError>> {
        self.start_as(request, options, |run| Box::new(run) as Box<dyn SubagentRun>)
    }

    /// [`start`](Self::start), with the published run passed through `wrap`.
    fn start_as<T: Send + 'static>(
        &self,
        request: ResolvedSubagentStartRequest,
        options: InProcessRunOptions,
        wrap: fn(LocalRun) -> T,
    ) -> BoxFuture<'static, Result<T, SubagentError>> {
        // The output schema (already asserted by the service; re-checked for direct callers,
        // which would otherwise start a child whose every capture fails).
        if let Some(schema) = &request.request.output_schema
            && let Err(e) = assert_output_schema(schema)
        {
            return futures::future::ready(Err(e)).boxed();
        }
        match self.prepare(request, options) {
            // The creation future itself, boxed: it wraps the run and converts a failure at its
            // end, so no combinator (and no move into one) sits around it.
            Ok(plan) => self.clone().create(plan, wrap).boxed(),
            Err(failure) => futures::future::ready(Err(failure.into())).boxed(),
        }
    }

    /// The synchronous prefix of a start (spec §3.2 steps 1–5).
    fn prepare(
        &self,
        resolved: ResolvedSubagentStartRequest,
        options: InProcessRunOptions,
    ) -> Result<Plan, StartFailure> {
        // Fields are read (and moved out) in place: the request is never moved whole.
        // 1. maxDepth (already validated by the service; re-checked for direct callers).
        let max_depth = match resolved.max_depth {
            Some(d) => assert_subagent_max_depth(Some(d))?,
            None => assert_subagent_max_depth(resolved.request.max_depth.as_ref())?,
        };
        // 2. Already cancelled: nothing is created.
        if resolved.request.signal.is_cancelled() {
            return Err(StartFailure::AbortedBeforePublication);
        }
        // 3. Depth: the persisted header is the floor; runtime options may only deepen it.
        let parent = resolved.request.parent.clone();
        let parent_depth = delegation_depth_of(
            parent.session().header().delegation_depth,
            parent.options().subagent_depth,
        )?;
        let child_depth = resolve_child_depth(parent_depth, max_depth)?;
        // 4. Child id and seed boundary.
        let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let child_id = SessionId::new(&*uuid::Uuid::new_v4().hyphenated().encode_lower(&mut id));
        // An empty seed is no seed (spec §5.1): the child is created unseeded — no end-seed
        // marker, no `seedLength` — whichever way the caller spelled it.
        let seed = options.seed.filter(|s| !s.is_empty());
        // A seed the child's first turn could not continue (an open turn or step, a turn closed
        // over an open step) is refused here, before anything exists: created, the child would
        // run on a log that breaks the session invariants (spine §4.7 item 5).
        if seed.as_ref().is_some_and(|s| !is_balanced(s)) {
            return Err(StartFailure::UnbalancedSeed);
        }
        let boundary = seed.as_ref().map_or(0, Vec::len);
        // 5. Delegated policy, captured now.
        let policy = capture_delegated_policy_overrides(parent.session(), self.inner.policy);
        let structured = resolved.request.output_schema.map(StructuredCapture::new);
        let create = CreateAgentOptions {
            session_id: child_id,
            meta: child_session_meta(parent.session().header(), child_depth, boundary as u64),
            seed,
            agent_options: resolve_child_agent_options(
                parent.options(),
                resolved.request.agent_options.as_ref(),
                child_depth,
            ),
            signal: Some(resolved.request.signal.clone()),
            setup: Some(setup(
                policy,
                ChildComposition {
                    persona: resolved.request.persona,
                    tool_filter: resolved.request.tool_filter,
                },
                structured.clone(),
                // Into its shared allocation at once: the event is not moved again through the
                // setup closure, its box and its future.
                Arc::new(DescriptorAppend::new(resolved.descriptor_event)),
            )),
            owner: Some(parent),
        };
        Ok(Plan {
            create,
            signal: resolved.request.signal,
            prompt: resolved.request.prompt,
            boundary,
            structured,
        })
    }

    /// The asynchronous part of a start (spec §3.2 steps 6–9), fulfilling with the published
    /// run passed through `wrap`. The plan is taken apart before the future is built, so the
    /// future holds each part once (an `async fn` would keep the whole plan as its argument
    /// beside the parts taken out of it).
    fn create<T: Send + 'static>(
        self,
        plan: Plan,
        wrap: fn(LocalRun) -> T,
    ) -> impl Future<Output = Result<T, SubagentError>> + Send + 'static {
        let Plan {
            create,
            signal,
            prompt,
            boundary,
            structured,
        } = plan;
        async move {
            // 6. The creation transaction: fulfilment is publication.
            let handle: AgentHandle = match self.inner.services.agents.create(create).await {
                Ok(handle) => handle,
                Err(e) => return Err(StartFailure::from(e).into()),
            };
            // 7. Hand the signal over to the live run: the listener is installed from here on; the
            //    signal is checked once more (an already-cancelled token fires no listener).
            let state = RunState::new(handle);
            state.listen(&signal);
            if signal.is_cancelled() {
                state.fire();
            }
            // 8.1 Deliver the prompt verbatim unless cancelled; the child's turn opens now. The child
            //     is published, so a delivery that fails — returning an error or panicking (a
            //     misbehaving host agent) — is the result's infrastructure fault, never the start's;
            //     except that a child no longer live was drained by its owner (the parent disposed,
            //     or the runtime shut down, since publication): that is a cancellation.
            let delivered = if state.is_cancelled() {
                Ok(false)
            } else {
                let message = Message::user(prompt, MessageSource::User);
                match catch_unwind(AssertUnwindSafe(|| state.child().followup(message))) {
                    Ok(Ok(_)) => {
                        state.cancel_if_fired_during_delivery();
                        Ok(true)
                    }
                    Ok(Err(_)) if !state.child().is_live() => {
                        state.drained();
                        Ok(false)
                    }
                    Ok(Err(e)) => Err(RunFailure::new(e)),
                    Err(panic) => Err(RunFailure::new(PromptDeliveryPanicked(panic_message(&*panic)))),
                }
            };
            // 8.2–9. The result task, then the run.
            Ok(wrap(LocalRun::launch(
                Drive {
                    state,
                    signal,
                    delivered,
                    boundary,
                    structured,
                },
                &self.inner.tasks,
            )))
        }
    }
}

/// The panic of a published child's prompt delivery, reported as the run's infrastructure
/// fault on its result.
#[derive(Debug, thiserror::Error)]
#[error("subagent prompt delivery panicked: {0}")]
struct PromptDeliveryPanicked(String);

/// The prepared creation of one child.
struct Plan {
    create: CreateAgentOptions,
    signal: Signal,
    prompt: Vec<ContentBlock>,
    boundary: usize,
    structured: Option<Arc<StructuredCapture>>,
}

/// The setup window (spec §3.2 step 6): composes the unpublished child, never drives it.
fn setup(
    policy: DelegatedPolicyOverrides,
    composition: ChildComposition,
    structured: Option<Arc<StructuredCapture>>,
    descriptor: Arc<DescriptorAppend>,
) -> Setup {
    Box::new(move |ctx: Ctx| {
        async move {
            compose(&ctx, &policy, &composition, structured.as_ref(), descriptor)?;
            Ok(None::<Commit>)
        }
        .boxed()
    })
}

fn compose(
    ctx: &Ctx,
    policy: &DelegatedPolicyOverrides,
    composition: &ChildComposition,
    structured: Option<&Arc<StructuredCapture>>,
    descriptor: Arc<DescriptorAppend>,
) -> Result<(), AgentError> {
    let child = ctx.agent().ok_or_else(|| {
        AgentError::Inactive(subagent::agent::ScopeInactive(SessionId::from(
            "<global context>",
        )))
    })?;
    // 6.1 Delegated policy, after any seed and its end-seed marker.
    append_delegated_policy_overrides(child.session(), policy)?;
    // 6.2 Composition: delegation statement, persona, tool filter.
    apply_child_composition(ctx, composition)?;
    // 6.3 Structured runtime.
    if let Some(structured) = structured {
        structured.attach(ctx)?;
    }
    // 6.4 The descriptor, inside the first turn.
    drop(ctx.on_pre_step(descriptor)?);
    Ok(())
}
