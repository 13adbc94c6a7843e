//! [`AcpProvider`]: the `acp` provider and its start flow (spec §1.6).

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::FutureExt;
use parking_lot::Mutex;
use subagent::agent::{Registration, SessionId};
use subagent::capabilities::SubagentCapabilities;
use subagent::out_of_process::resolve_child_cwd;
use subagent::provider::{ResolvedSubagentStartRequest, SubagentProvider, SubagentStartRequest};
use subagent::run::SubagentRun;
use subagent::service::SubagentService;
use subagent::settle::{
    AbortListener, RunSettlement, SubprocessRunHandle, SubprocessRunParts, settle_run_result,
};
use subagent::{NO_START_CAPABILITIES, StopReason, SubagentError, SubagentResult};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::config::{AcpConfig, AcpSettings, PREFIX};
use crate::connection::{BoundedOutputFold, Connection, SharedFold, prompt, prompt_blocks};
use crate::env::child_environment;
use crate::error::{AcpConfigError, AcpError, AcpRegisterError, ChildOutputError};
use crate::process::{ChildProcess, SpawnSpec};
use crate::run::{AcpRun, Canceller, TeardownCell, TeardownInputs, seam_teardown};

/// Receives each post-publication child failure that was flattened into an `error` result,
/// exactly once per failed run. It runs on the run's task: keep it quick. A panic inside it is
/// contained and cannot change the result.
pub type FailureSink = Arc<dyn Fn(&(dyn StdError + 'static), &StopReason) + Send + Sync>;

/// The fixed, secret-free diagnostic attached to a run whose prompt turn failed.
pub const PROMPT_FAILED_DIAGNOSTIC: &str = "subagent-acp: the ACP child failed during the prompt turn";

/// The diagnostic of a failed prompt turn: [`PROMPT_FAILED_DIAGNOSTIC`], followed by the cause
/// when the child's output broke the connection (fixed text built from a structured fact, never
/// the child's own output).
fn prompt_failed_diagnostic(cause: Option<&ChildOutputError>) -> String {
    match cause {
        Some(cause) => format!("{PROMPT_FAILED_DIAGNOSTIC}: {cause}"),
        None => PROMPT_FAILED_DIAGNOSTIC.to_owned(),
    }
}

/// The warning the default failure sink logs:
/// `subagent-acp "<provider>": child run failed (<reason>): <error>`.
pub fn failure_warning(provider: &str, reason: &StopReason, error: &(dyn StdError + 'static)) -> String {
    format!(
        "{PREFIX} \"{provider}\": child run failed ({}): {error}",
        reason.as_str()
    )
}

/// The `acp` provider: each start spawns a fresh child process and speaks ACP to it as the
/// client, running exactly one session with exactly one prompt turn.
///
/// # Contract
/// * **Capabilities.** None ([`NO_START_CAPABILITIES`]): the service rejects schema, depth,
///   tool-filter and persona requests before `start`. `label`, the descriptor and
///   `agentOptions` are ignored; the child starts fresh (`inherits_parent_context` is false).
/// * **Ownership.** Before `start` fulfils, the provider owns the child and reaps it (whole
///   process group) on every failure path before rejecting — also when the start future is
///   dropped (the teardown then continues on a runtime task). After it fulfils, the caller owns
///   the [`AcpRun`] and must dispose it.
/// * **Output bound.** A run keeps at most `maxOutputBytes` bytes of the child's text
///   ([`BoundedOutputFold`]); past it the text is dropped, the output ends with
///   [`OUTPUT_TRUNCATED_MARKER`](crate::connection::OUTPUT_TRUNCATED_MARKER) and one warning is
///   logged. The stop reason stays the child's.
/// * **Concurrency.** Starts are independent; the provider is shared immutable configuration.
/// * **Runtime.** `start` must run inside a tokio runtime; the run's tasks live on it.
#[derive(Clone)]
pub struct AcpProvider {
    settings: Arc<AcpSettings>,
    sink: Option<FailureSink>,
}

impl fmt::Debug for AcpProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AcpProvider")
            .field("name", &self.settings.provider_name)
            .field("command", &self.settings.command)
            .finish_non_exhaustive()
    }
}

impl AcpProvider {
    /// A provider over already validated settings.
    pub fn new(settings: AcpSettings) -> Self {
        Self {
            settings: Arc::new(settings),
            sink: None,
        }
    }

    /// Validates `config` ([`AcpConfig::load`]) and builds the provider.
    pub fn load(config: &AcpConfig) -> Result<Self, AcpConfigError> {
        config.load().map(Self::new)
    }

    /// Replaces the default failure sink (a `tracing` warning, see [`failure_warning`]).
    pub fn with_failure_sink(mut self, sink: FailureSink) -> Self {
        self.sink = Some(sink);
        self
    }

    /// The settings.
    pub fn settings(&self) -> &AcpSettings {
        &self.settings
    }

    /// Starts one run directly (the service's `start` calls this). Fails with
    /// [`AcpError::AbortedBeforeStart`] when the signal is already cancelled (nothing spawned) or
    /// fires during the handshake; every failure after spawning reaps the child first.
    pub async fn start_run(&self, request: &SubagentStartRequest) -> Result<AcpRun, AcpError> {
        if request.signal.is_cancelled() {
            return Err(AcpError::AbortedBeforeStart);
        }
        let runtime = Handle::try_current().map_err(|_| AcpError::NoRuntime)?;
        let parent_cwd = request.parent.session().header().cwd.clone();
        let cwd = resolve_child_cwd(PREFIX, self.settings.cwd.as_deref(), parent_cwd.as_deref())?;
        let id = SessionId::from(uuid::Uuid::new_v4().to_string());
        let spec = SpawnSpec {
            command: self.settings.command.clone(),
            args: self.settings.args.clone(),
            cwd: cwd.clone(),
            env: child_environment(std::env::vars_os(), &self.settings.env),
        };
        let (process, pipes) = ChildProcess::spawn(&spec);
        let pid = process.id();
        let mut startup = Startup {
            runtime,
            process: Some(process),
            connection: None,
            settings: self.settings.clone(),
            cancelled: CancellationToken::new(),
        };
        if let Some(error) = startup.process.as_ref().and_then(|p| p.spawn_error().cloned()) {
            startup.rollback().await;
            return Err(AcpError::Spawn {
                command: self.settings.command.display().to_string(),
                source: error,
            });
        }
        let Some(pipes) = pipes else {
            startup.rollback().await;
            return Err(AcpError::Pipes);
        };
        let fold: SharedFold = Arc::new(Mutex::new(BoundedOutputFold::new(
            self.settings.provider_name.clone(),
            self.settings.max_output_bytes,
        )));
        let signal = request.signal.clone();
        // The startup owns the connection task from its spawn (no `.await` in between): however
        // the handshake ends — failure, the signal, or this future being dropped — the rollback
        // closes the connection (the child's stdin sees EOF) and awaits its task.
        let connection = startup.connection.insert(Connection::spawn(
            pipes,
            fold.clone(),
            self.settings.permission,
            startup.cancelled.clone(),
        ));
        let handshake = async {
            connection.ready().await?;
            connection.initialize().await?;
            connection.new_session(&cwd).await
        };
        let session = tokio::select! {
            biased;
            _ = signal.cancelled() => Err(AcpError::AbortedBeforeStart),
            session = handshake => session,
        };
        let session = match session {
            Ok(_) if signal.is_cancelled() => Err(AcpError::AbortedBeforeStart),
            Err(_) if signal.is_cancelled() => Err(AcpError::AbortedBeforeStart),
            other => other,
        };
        let session = match session {
            Ok(session) => session,
            Err(error) => {
                startup.rollback().await;
                return Err(error);
            }
        };
        Ok(self.publish(startup, id, pid, session, fold, request))
    }

    /// Publication (§1.6 steps 9–10): attach the abort listener, send the prompt on a task of
    /// its own and hand the run to the caller.
    fn publish(
        &self,
        mut startup: Startup,
        id: SessionId,
        pid: Option<u32>,
        session: agent_client_protocol::v1::schema::SessionId,
        fold: SharedFold,
        request: &SubagentStartRequest,
    ) -> AcpRun {
        let runtime = startup.runtime.clone();
        let (process, connection) = startup.defuse();
        let fault = connection.as_ref().map(|c| c.fault().clone()).unwrap_or_default();
        let cx = connection
            .as_ref()
            .and_then(|c| c.context().cloned())
            .expect("a published start has an open connection");
        let canceller = Arc::new(Canceller::new(
            cx.clone(),
            session.clone(),
            startup.cancelled.clone(),
        ));
        let on_abort = canceller.clone();
        let (listener, watch) = AbortListener::attach(&request.signal, move |_cause| on_abort.cancel());
        let watch = runtime.spawn(watch);

        let blocks = prompt_blocks(&request.prompt);
        let local = canceller.token().clone();
        let sink = self.sink.clone();
        let provider = self.settings.provider_name.clone();
        let settlement = RunSettlement {
            collect_output: {
                let fold = fold.clone();
                Box::new(move || fold.lock().collect().unwrap_or_default())
            },
            collect_diagnostic: {
                let fault = fault.clone();
                Some(Box::new(move || {
                    Some(prompt_failed_diagnostic(fault.get().as_ref()))
                }))
            },
            cancelled: {
                let local = local.clone();
                Box::new(move || local.is_cancelled())
            },
            on_error: Some(Box::new(move |error, reason| match sink {
                Some(sink) => sink(error, reason),
                None => tracing::warn!("{}", failure_warning(&provider, reason, error)),
            })),
            listener: listener.clone(),
        };
        let turn = runtime.spawn(async move {
            let attempt = async {
                tokio::select! {
                    biased;
                    _ = local.cancelled() => Err(AcpError::Cancelled),
                    stop = prompt(&cx, &fault, session, blocks) => stop.map(|stop| {
                        SubagentResult::new(fold.lock().collect().unwrap_or_default(), stop)
                    }),
                }
            };
            settle_run_result(attempt, settlement).await
        });
        let result = async move {
            turn.await.unwrap_or_else(|_| {
                SubagentResult::new(Vec::new(), StopReason::Error)
                    .with_diagnostic("subagent-acp: the run's prompt task failed")
            })
        }
        .boxed()
        .shared();

        let after = {
            let result = result.clone();
            vec![
                async move {
                    let _ = watch.await;
                }
                .boxed(),
                async move {
                    result.await;
                }
                .boxed(),
            ]
        };
        let teardown = TeardownCell::new(
            runtime,
            TeardownInputs {
                process,
                connection,
                graces: self.settings.graces,
                after,
            },
        );
        let cell = teardown.clone();
        let handle = SubprocessRunHandle::new(SubprocessRunParts {
            id,
            result: result.boxed(),
            listener,
            request_cancel: Box::new(move || canceller.cancel()),
            teardown: Box::new(move || seam_teardown(cell)),
        });
        AcpRun::new(handle, teardown, pid)
    }
}

/// The unpublished child during startup. Rolling back (or dropping) it tears the child down.
struct Startup {
    runtime: Handle,
    process: Option<ChildProcess>,
    connection: Option<Connection>,
    settings: Arc<AcpSettings>,
    /// The run's local cancellation: once published, the run's [`Canceller`] fires it, which
    /// settles the result and revokes the permission policy (the connection answers every later
    /// permission request `cancelled`).
    cancelled: CancellationToken,
}

impl Startup {
    /// Hands the process and connection over to the published run.
    fn defuse(&mut self) -> (ChildProcess, Option<Connection>) {
        let process = self
            .process
            .take()
            .expect("a start is published at most once, with its process");
        (process, self.connection.take())
    }

    fn inputs(&mut self) -> Option<TeardownInputs> {
        self.process.take().map(|process| TeardownInputs {
            process,
            connection: self.connection.take(),
            graces: self.settings.graces,
            after: Vec::new(),
        })
    }

    /// Startup rollback: the teardown ladder to whole-tree exit (the child gets its EOF window
    /// first), awaited.
    async fn rollback(&mut self) {
        if let Some(inputs) = self.inputs() {
            let cell = TeardownCell::new(self.runtime.clone(), inputs);
            let _ = cell.start().await;
        }
    }
}

impl Drop for Startup {
    /// A dropped start future: the teardown continues on a runtime task.
    fn drop(&mut self) {
        if let Some(inputs) = self.inputs() {
            drop(TeardownCell::new(self.runtime.clone(), inputs).start());
        }
    }
}

#[async_trait]
impl SubagentProvider for AcpProvider {
    fn name(&self) -> &str {
        &self.settings.provider_name
    }

    fn capabilities(&self) -> SubagentCapabilities {
        NO_START_CAPABILITIES
    }

    fn inherits_parent_context(&self) -> bool {
        false
    }

    async fn start(
        &self,
        request: ResolvedSubagentStartRequest,
    ) -> Result<Box<dyn SubagentRun>, SubagentError> {
        match self.start_run(&request.request).await {
            Ok(run) => Ok(Box::new(run)),
            Err(error) => Err(error.into_start_error()),
        }
    }
}

/// Loads `config` and registers the provider with `service` — the Rust form of loading the
/// plugin. A misconfiguration fails here, never at the first delegation. Dropping the returned
/// guard unregisters the provider (emitting `subagent/provider-removed`) without touching runs
/// already handed out.
pub fn register(service: &SubagentService, config: &AcpConfig) -> Result<Registration, AcpRegisterError> {
    register_provider(service, AcpProvider::load(config)?)
}

/// Registers an already built provider (for example one with a custom failure sink).
pub fn register_provider(
    service: &SubagentService,
    provider: AcpProvider,
) -> Result<Registration, AcpRegisterError> {
    Ok(service.register_provider(Arc::new(provider))?)
}
