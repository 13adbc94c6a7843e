//! `subagent`: the command-line program of the subagent workspace.
//!
//! Subcommands: `demo` (a scripted coordinator, no network), `run` (the same host on a real
//! OpenAI-compatible model), `acp` (that host served over the Agent Client Protocol), `agents`
//! (the stored sessions as a tree), `log` (one session log, readable) and `check` (invariant
//! replay over a store). Failures print one line on stderr
//! (`subagent: <message>`) and exit non-zero: 1 when `check` found violations, 130 when a second
//! Ctrl-C (or SIGTERM) cut the shutdown of `demo`, `run` or `acp` short, 2 otherwise (a `demo`
//! or `run` stopped by one Ctrl-C or SIGTERM among them). `acp` stopped by
//! one Ctrl-C or SIGTERM exits 0 once its sessions are wound down.

use std::collections::HashSet;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use agent::SessionId;
use agent_loop::JsonlStore;
use agent_loop::model::{OpenAiCompatible, OpenAiConfig};
use clap::{Parser, Subcommand};
use parking_lot::Mutex;
use subagent_cli::catalog::{check_store_dir, read_catalog};
use subagent_cli::demo::{DemoError, DemoOutcome, run_demo_until};
use subagent_cli::host::{FORK_TOOL, SPAWN_TOOL, read_acp_config};
use subagent_cli::interrupt::{Abandoned, TwoStage, stop_signals};
use subagent_cli::serve::{ServeOptions, serve_until};
use subagent_cli::terminal_text::{final_answer, single_line, single_line_owned};
use subagent_cli::tree::{LiveTree, TreeChange, TreeNode, TreeSink, node_line, short_id};
use subagent_cli::workspace::Workspace;
use subagent_cli::{CliError, Host, HostOptions, build_host};

/// The default store directory.
const DEFAULT_STORE: &str = ".subagent";

/// The model settings' environment variables, after `run --help` and `acp --help`.
const MODEL_ENV_HELP: &str = "Environment variables (used when the flag is absent):\n  \
    SUBAGENT_BASE_URL  API base URL up to the version segment, e.g. https://api.openai.com/v1\n  \
    SUBAGENT_API_KEY   bearer token (optional for local servers)\n  \
    SUBAGENT_MODEL     model name, e.g. gpt-4o-mini";

/// `subagent run`'s default step limit per turn of every agent.
const DEFAULT_MAX_STEPS: u32 = 50;

/// What `subagent acp` says on stderr (the ACP client's log of its agent) on the first Ctrl-C
/// or SIGTERM.
const ACP_FIRST_INTERRUPT: &str = "subagent: interrupted; cancelling the running prompts and shutting down (press Ctrl-C again to exit at once)";
/// What `subagent run` and `subagent demo` print on the first Ctrl-C (or SIGTERM).
const FIRST_INTERRUPT: &str = "subagent: interrupted; cancelling the coordinator and shutting down (press Ctrl-C again to exit at once)";

#[derive(Parser, Debug)]
#[command(
    name = "subagent",
    version,
    about = "Delegate work from one agent to child agents through named providers (spawn, fork), \
             with durable session logs you can list, read and check."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a scripted coordinator (no network, no keys) that delegates to two parallel `spawn`
    /// children, a `fork` child and a background `spawn` job, showing a live tree. Ctrl-C or
    /// SIGTERM cancels its running turn and shuts it down, its logs balanced and durable (exit
    /// 2); a second Ctrl-C or SIGTERM exits 130 at once.
    Demo {
        /// Where to store the session logs.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_STORE)]
        store: PathBuf,
    },
    /// Run a task on a real model through an OpenAI-compatible endpoint, with read-only
    /// workspace tools (read_file, list_dir, grep; confined to the working directory) and the
    /// delegation tools `subagent` (provider spawn) and `fork` (provider fork); with
    /// `--acp-config`, also `acp` (an external agent over the Agent Client Protocol).
    #[command(after_help = MODEL_ENV_HELP)]
    Run {
        #[command(flatten)]
        model: ModelArgs,
        /// Where to store the session logs.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_STORE)]
        store: PathBuf,
        /// Background delegations start continuable children instead of one-shot jobs: durable
        /// children the coordinator can message and interrupt, which report back and announce
        /// when they settle. The run ends once the coordinator and every child have settled.
        #[arg(long)]
        continuable: bool,
        /// Also delegate to an external agent over the Agent Client Protocol, through the tool
        /// `acp`: a JSON file configuring the provider (`{"command": "my-acp-agent", "args":
        /// [...]}`; optional `cwd`, `permission` (`reject` or `allow`), `env`). Each delegation
        /// runs the command as a fresh subprocess for one prompt turn, in the working directory
        /// unless `cwd` says otherwise.
        #[arg(long, value_name = "FILE")]
        acp_config: Option<PathBuf>,
        /// The task.
        task: String,
    },
    /// Serve the coordinator over the Agent Client Protocol on stdin/stdout, so an ACP client
    /// (an editor, another harness's `acp` provider) can delegate to it: each ACP session gets
    /// its own coordinator (with the read-only workspace tools over the session's cwd and the
    /// delegation tools) on a real OpenAI-compatible model. Runs until stdin closes, or until
    /// Ctrl-C or SIGTERM: running prompts are then answered `cancelled` and every session is
    /// shut down (exit 0; a second Ctrl-C or SIGTERM exits 130 at once). Stdout carries only
    /// the protocol, warnings go to stderr.
    #[command(after_help = MODEL_ENV_HELP)]
    Acp {
        #[command(flatten)]
        model: ModelArgs,
        /// Where to store the session logs (resolved against the launch directory).
        #[arg(long, value_name = "DIR", default_value = DEFAULT_STORE)]
        store: PathBuf,
    },
    /// List the stored sessions as a parent → child tree (provider, label, depth, turns, last
    /// stop reason).
    Agents {
        /// The store directory.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_STORE)]
        store: PathBuf,
    },
    /// Print one session log in readable form.
    Log {
        /// The session id (see `subagent agents`).
        session_id: String,
        /// The store directory.
        #[arg(long, value_name = "DIR", default_value = DEFAULT_STORE)]
        store: PathBuf,
    },
    /// Replay every session log of a store through the invariant checker; exits 1 on any
    /// violation.
    Check {
        /// The store directory.
        #[arg(value_name = "DIR", default_value = DEFAULT_STORE)]
        dir: PathBuf,
    },
}

/// The model settings and limits `run` and `acp` share.
#[derive(clap::Args, Debug)]
struct ModelArgs {
    /// Model name.
    #[arg(long, env = "SUBAGENT_MODEL", value_name = "NAME")]
    model: Option<String>,
    /// API base URL, up to and including the version segment.
    #[arg(long, env = "SUBAGENT_BASE_URL", value_name = "URL")]
    base_url: Option<String>,
    /// API key sent as a bearer token (optional for local servers).
    #[arg(long, env = "SUBAGENT_API_KEY", value_name = "KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Output-token cap per model call.
    #[arg(long, value_name = "N", value_parser = parse_max_tokens)]
    max_tokens: Option<u64>,
    /// The most model calls one turn of any agent (the coordinator and every subagent) may
    /// make; a turn that needs more ends with an error.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_STEPS, value_parser = parse_max_steps)]
    max_steps: u32,
}

impl ModelArgs {
    /// The base URL and model name, each required (flag or environment variable).
    fn required(&self) -> Result<(String, String), CliError> {
        let required = |value: &Option<String>, what, flag, env| {
            value
                .clone()
                .filter(|s| !s.is_empty())
                .ok_or(CliError::MissingModelSetting { what, flag, env })
        };
        Ok((
            required(
                &self.base_url,
                "the API base URL",
                "--base-url",
                "SUBAGENT_BASE_URL",
            )?,
            required(&self.model, "the model name", "--model", "SUBAGENT_MODEL")?,
        ))
    }

    /// The OpenAI-compatible adapter for `base_url` and `model`.
    fn adapter(&self, base_url: String, model: &str) -> Result<OpenAiCompatible, CliError> {
        let api_key = self.api_key.clone().filter(|s| !s.is_empty());
        OpenAiCompatible::new(OpenAiConfig::new(base_url, api_key, model.to_owned()))
            .map_err(|e| CliError::Host(e.to_string()))
    }
}

/// `println!` on standard output that returns a failure instead of panicking: a reader that
/// closed the pipe (`subagent agents | head -1`) is [`CliError::OutputClosed`].
macro_rules! outln {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout().lock(), $($arg)*).map_err(CliError::from_stdout)
    };
}

/// `eprintln!` that never panics: a diagnostic on a closed or failing stderr is lost, and the
/// program goes on to its exit status.
macro_rules! errln {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// `print!` on standard output, failing like [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {
        write!(std::io::stdout().lock(), $($arg)*).map_err(CliError::from_stdout)
    };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            return fail(&CliError::Io {
                context: "cannot start the async runtime".to_owned(),
                source: e,
            });
        }
    };
    // `acp` reads stdin through tokio, in a blocking read that only the client's EOF ends: once
    // a signal has stopped the server, with the client still connected, that read never
    // returns. Everything else `acp` started has ended by the time it returns.
    let reads_stdin = matches!(cli.command, Command::Acp { .. });
    let result = runtime.block_on(dispatch(cli.command));
    // The abandoned work may be stuck in a blocking task (a file operation that never
    // returns), which dropping the runtime would wait for.
    if reads_stdin || matches!(result, Err(CliError::Interrupted)) {
        runtime.shutdown_background();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &CliError) -> ExitCode {
    if matches!(e, CliError::OutputClosed) {
        // The reader went away (`| head`): nothing to tell it, and stderr stays quiet as the
        // programs around it do.
        return ExitCode::from(e.exit_code());
    }
    let _ = std::io::stdout().flush();
    errln!("subagent: {e}");
    ExitCode::from(e.exit_code())
}

async fn dispatch(command: Command) -> Result<(), CliError> {
    match command {
        Command::Demo { store } => demo(&store).await,
        Command::Run {
            model,
            store,
            continuable,
            acp_config,
            task,
        } => run(&model, continuable, acp_config.as_deref(), &store, &task).await,
        Command::Acp { model, store } => acp(&model, &store).await,
        Command::Agents { store } => agents(&store).await,
        Command::Log { session_id, store } => log(&session_id, &store).await,
        Command::Check { dir } => check(&dir),
    }
}

/// A sink printing the tree: redrawn in place on a terminal, one line per event otherwise.
fn tree_printer(to_stderr: bool) -> TreeSink {
    let tty = if to_stderr {
        std::io::stderr().is_terminal()
    } else {
        std::io::stdout().is_terminal()
    };
    let emit = move |text: &str| {
        if to_stderr {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(text.as_bytes());
            let _ = err.flush();
        } else {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
        }
    };
    let drawn = Mutex::new(0usize);
    let announced: Mutex<HashSet<SessionId>> = Mutex::new(HashSet::new());
    Arc::new(move |change: &TreeChange, tree: &LiveTree| {
        if tty {
            // Render under the frame lock, so frames reach the terminal in state order. Lines
            // are cut to the terminal's width so that none wraps and the cursor arithmetic of
            // the next redraw stays exact.
            let mut drawn = drawn.lock();
            let width = terminal_width(to_stderr);
            let lines: Vec<String> = tree.render().lines().map(|l| fit_to_width(l, width)).collect();
            let mut frame = String::new();
            if *drawn > 0 {
                // Back to the first line of the previous frame, then clear to the end.
                frame.push_str(&format!("\x1b[{}F\x1b[J", *drawn));
            }
            for line in &lines {
                frame.push_str(line);
                frame.push('\n');
            }
            *drawn = lines.len();
            emit(&frame);
            return;
        }
        // Plain output: announce each node once its label is known (or when it ends), then
        // its end.
        let mut lines = String::new();
        let mut announced = announced.lock();
        let nodes = tree.nodes();
        for node in &nodes {
            let ended = matches!(change, TreeChange::Ended(id) if id == &node.id);
            if !announced.contains(&node.id) && (node.label.is_some() || ended) {
                announced.insert(node.id.clone());
                lines.push_str(&format!("  + {}\n", started_line(node, &nodes)));
            }
            if ended {
                lines.push_str(&format!("  = {}\n", node_line(node)));
            }
        }
        emit(&lines);
    })
}

/// The usable width of the terminal on stdout (or stderr): its columns minus one, at least 20;
/// 79 when it cannot be measured.
fn terminal_width(stderr: bool) -> usize {
    let size = if stderr {
        terminal_size::terminal_size_of(std::io::stderr())
    } else {
        terminal_size::terminal_size_of(std::io::stdout())
    };
    size.map_or(79, |(terminal_size::Width(w), _)| {
        usize::from(w).saturating_sub(1).max(20)
    })
}

/// `line` (already inert: no control characters) cut to at most `width` terminal columns.
///
/// Columns are over-counted, never under-counted, so a cut line never wraps: a character below
/// U+1100 takes at most one column, and any other (East Asian wide characters and emoji, which
/// a model may put in a label, take two) is counted as two.
fn fit_to_width(line: &str, width: usize) -> String {
    let mut used = 0usize;
    line.chars()
        .take_while(|&c| {
            used += if c < '\u{1100}' { 1 } else { 2 };
            used <= width
        })
        .collect()
}

/// `<provider> "<label>"  depth d  (<id>) started under <parent>` (no status: it is not known
/// yet in plain output), escaped like [`node_line`] (the label is a model's).
fn started_line(node: &TreeNode, nodes: &[TreeNode]) -> String {
    let what = match (&node.provider, &node.label) {
        (Some(p), Some(l)) => format!("{p} \"{l}\""),
        (Some(p), None) => p.clone(),
        (None, Some(l)) => l.clone(),
        (None, None) => "agent".to_owned(),
    };
    let id = if node.parent.is_some() {
        short_id(&node.id)
    } else {
        node.id.to_string()
    };
    let job = node
        .background_job
        .as_ref()
        .map(|j| format!("  background job {j}"))
        .unwrap_or_default();
    let parent = node
        .parent
        .as_ref()
        .map(|p| {
            let name = nodes
                .iter()
                .find(|n| &n.id == p)
                .and_then(|n| n.label.clone().filter(|_| n.parent.is_none()))
                .unwrap_or_else(|| short_id(p));
            format!(" under {name}")
        })
        .unwrap_or_default();
    single_line_owned(format!(
        "{what}  depth {}{job}  ({id}) started{parent}",
        node.depth
    ))
}

async fn demo(store: &Path) -> Result<(), CliError> {
    log_warnings_to_stderr();
    // Ctrl-C (or SIGTERM) in two stages, as in `run`: the first cancels the coordinator's
    // running turn (its children with it) and lets the host shut down normally, so every log
    // ends balanced and durable; the demo then fails as interrupted (exit 2). A second
    // one, until that is over, abandons it: exit 130 at once.
    let interrupts = TwoStage::new(stop_signals().map_err(|e| CliError::Io {
        context: "cannot listen for Ctrl-C and SIGTERM".to_owned(),
        source: e,
    })?);
    outln!("subagent demo — a scripted coordinator on the embedded defaults (no network, no keys)")?;
    outln!(
        "providers: spawn (tool `{SPAWN_TOOL}`, fresh child) and fork (tool `{FORK_TOOL}`, inherits the conversation); \
         sessions in {}",
        single_line(&store.display().to_string())
    )?;
    outln!()?;
    let stop = interrupts.first_interrupt();
    let demo = run_demo_until(store, Some(tree_printer(false)), async move {
        stop.arrived().await;
    });
    let ran = interrupts
        .run(demo, || errln!("{FIRST_INTERRUPT}"))
        .await
        .map_err(|Abandoned| CliError::Interrupted)?;
    let (outcome, shutdown) = match ran {
        Ok(outcome) => (outcome, None),
        // The run finished: its answer is printed, then the shutdown's failure reported.
        Err(DemoError::Shutdown { outcome, shutdown }) => (*outcome, Some(shutdown)),
        // Stopped by the first Ctrl-C or SIGTERM: where the (balanced, durable) logs are, then
        // the interruption as the failure (exit 2, as for `run`).
        Err(e) => {
            if let DemoError::Interrupted { coordinator, .. } = &e {
                errln!(
                    "{}",
                    single_line(&format!(
                        "session logs: {} (coordinator {coordinator})",
                        store.display()
                    ))
                );
                return Err(CliError::Run(e.to_string()));
            }
            return Err(CliError::Run(format!("the demo failed: {e}")));
        }
    };
    let printed = print_demo_outcome(store, &outcome);
    match shutdown {
        // The failure is the news: a closed stdout must not hide it.
        Some(e) => Err(CliError::Run(format!(
            "the demo's host did not shut down cleanly: {e}"
        ))),
        None => printed,
    }
}

/// The demo's closing output: the tree (when stdout is no terminal), the answer, where the logs
/// are.
fn print_demo_outcome(store: &Path, outcome: &DemoOutcome) -> Result<(), CliError> {
    // The user's own path, but it reaches a terminal: control characters in it are shown inert.
    let store = store.display().to_string();
    let store = single_line(&store);
    outln!()?;
    if !std::io::stdout().is_terminal() {
        // On a terminal the live tree above is already the final one.
        outln!("Delegation tree:")?;
        out!("{}", outcome.rendered_tree)?;
        outln!()?;
    }
    outln!("Final answer:")?;
    outln!("{}", outcome.answer)?;
    outln!()?;
    outln!(
        "Session logs: {} (coordinator {}, {} model calls)",
        store,
        outcome.coordinator,
        outcome.model_calls
    )?;
    outln!("  subagent agents --store {}", store)?;
    outln!("  subagent log {} --store {}", outcome.coordinator, store)?;
    outln!("  subagent check {}", store)?;
    Ok(())
}

/// `--max-tokens`: a positive safe integer (the agent options' own rule), refused before
/// anything is created.
fn parse_max_tokens(value: &str) -> Result<u64, String> {
    const MAX: u64 = agent::header::MAX_SAFE_INTEGER;
    match value.parse::<u64>() {
        Ok(0) => Err("the output-token cap must be at least 1".to_owned()),
        Ok(n) if n <= MAX => Ok(n),
        Ok(_) => Err(format!("the output-token cap must be at most {MAX}")),
        Err(e) => Err(format!("{e} (expected a whole number of tokens from 1 to {MAX})")),
    }
}

/// `--max-steps`: a positive step count.
fn parse_max_steps(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(0) => Err("the step limit must be at least 1 (each turn needs one model call)".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!(
            "{e} (expected a whole number of steps from 1 to {})",
            u32::MAX
        )),
    }
}

async fn run(
    settings: &ModelArgs,
    continuable: bool,
    acp_config: Option<&Path>,
    store: &Path,
    task: &str,
) -> Result<(), CliError> {
    log_warnings_to_stderr();
    let (base_url, model) = settings.required()?;
    if task.trim().is_empty() {
        return Err(CliError::EmptyTask);
    }
    let acp = acp_config.map(read_acp_config).transpose()?;
    let adapter = settings.adapter(base_url, &model)?;
    let cwd = std::env::current_dir().map_err(|e| CliError::Io {
        context: "cannot determine the working directory".to_owned(),
        source: e,
    })?;
    let workspace = Workspace::new(&cwd).map_err(|e| CliError::Host(e.to_string()))?;
    let mut options = HostOptions::new(store, Arc::new(adapter), "openai", model);
    options.max_tokens = settings.max_tokens;
    options.max_steps_per_turn = Some(settings.max_steps);
    options.continuable = continuable;
    options.acp = acp;
    options.persona = Some(subagent_cli::model_text::run_persona(workspace.root()));
    options.workspace = Some(workspace);
    options.deliver_job_notices = true;
    let host = build_host(options).map_err(|e| CliError::Host(e.to_string()))?;
    let (tree, listening) = LiveTree::attach(
        host.runtime(),
        host.subagents(),
        host.jobs(),
        Some(tree_printer(true)),
    );
    let id = SessionId::new(format!(
        "run-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    // Ctrl-C (or SIGTERM) in two stages. The first cancels the coordinator's turn (its
    // children with it) and lets the host shut down normally, so every log ends balanced and
    // durable and every child process is torn down. A second one, at any point until the
    // shutdown is over, abandons it: the program exits at once (a log may then end in a torn
    // line, which the store drops on load).
    let interrupts = TwoStage::new(stop_signals().map_err(|e| CliError::Io {
        context: "cannot listen for Ctrl-C and SIGTERM".to_owned(),
        source: e,
    })?);
    let stop = interrupts.first_interrupt();
    let graceful = async {
        let outcome = async {
            let handle = host.create_agent(id.clone()).await?;
            tree.add_root(id.clone(), "coordinator");
            let agent = handle.agent().clone();
            // Only the coordinator is waited for: a background job (which a user cancel does
            // not reach) may never settle — its model may stall — and disposing of the
            // coordinator below ends it.
            let turn = tokio::select! {
                // The prompt is delivered (its turn started) before Ctrl-C is looked at, so a
                // Ctrl-C that came first aborts the turn rather than leaving none.
                biased;
                turn = host.run_turn(&agent, task) => turn,
                () = stop.arrived() => {
                    agent.cancel(agent::CancelCause::User, agent::CancelOptions::default());
                    agent.when_idle().await;
                    Ok(())
                }
            };
            let answer = Host::last_answer(agent.as_ref());
            let last = last_turn_failure(agent.as_ref());
            handle.dispose().await;
            turn.map(|()| (answer, last))
        }
        .await;
        // Let the last `subagent/end` events reach the tree before it stops listening.
        host.subagents().close().await;
        drop(listening);
        (outcome, host.shutdown().await)
    };
    let (outcome, shutdown) = interrupts
        .run(graceful, || errln!("{FIRST_INTERRUPT}"))
        .await
        .map_err(|Abandoned| CliError::Interrupted)?;
    // A failed shutdown is reported with whatever else failed, never instead of it, and never
    // keeps a finished answer from being printed.
    let shutdown = shutdown
        .err()
        .map(|e| format!("the host did not shut down cleanly: {e}"));
    let (answer, failure) = match outcome {
        Ok(finished) => finished,
        Err(e) => {
            let failures: Vec<String> = std::iter::once(e.to_string()).chain(shutdown).collect();
            return Err(CliError::Run(failures.join("; ")));
        }
    };
    errln!(
        "{}",
        single_line(&format!("session logs: {} (coordinator {id})", store.display()))
    );
    // The answer is printed exactly as the model gave it when stdout is a pipe or a file (it
    // is the product, meant for other programs); on a terminal, control and bidirectional
    // characters in it are shown as visible escapes (see `final_answer`).
    let terminal = std::io::stdout().is_terminal();
    let failures: Vec<String> = failure
        .map(|failure| format!("the coordinator's turn {failure}"))
        .into_iter()
        .chain(shutdown)
        .collect();
    if !failures.is_empty() {
        if let Some(answer) = &answer {
            // The failure below is the news: a closed stdout must not hide it.
            let _ = outln!("{}", final_answer(answer, terminal));
        }
        return Err(CliError::Run(failures.join("; ")));
    }
    outln!("{}", final_answer(&answer.unwrap_or_default(), terminal))?;
    Ok(())
}

/// `subagent acp`: serves ACP on stdin/stdout until stdin closes or the first Ctrl-C or SIGTERM
/// (see [`subagent_cli::serve`]).
async fn acp(settings: &ModelArgs, store: &Path) -> Result<(), CliError> {
    let (base_url, model) = settings.required()?;
    // Stdout carries the protocol; warnings (an ignored MCP server, a host that failed to shut
    // down) go to stderr, which ACP clients keep as the agent's log.
    log_warnings_to_stderr();
    let adapter = settings.adapter(base_url, &model)?;
    let store_dir = std::path::absolute(store).map_err(|e| CliError::Io {
        context: format!("cannot resolve the store directory {}", store.display()),
        source: e,
    })?;
    let options = ServeOptions {
        adapter: Arc::new(adapter),
        model_provider: "openai".to_owned(),
        model_name: model,
        max_tokens: settings.max_tokens,
        max_steps_per_turn: Some(settings.max_steps),
        store_dir,
        session_observers: Vec::new(),
    };
    // Ctrl-C (or SIGTERM) in two stages, as in `run`. The first stops serving: the running
    // prompts are cancelled (answered `cancelled`), every session's host shuts down normally
    // (its log balanced and durable), and the program exits 0. A second one, until that is
    // over, abandons it: exit 130 at once.
    let interrupts = TwoStage::new(stop_signals().map_err(|e| CliError::Io {
        context: "cannot listen for Ctrl-C and SIGTERM".to_owned(),
        source: e,
    })?);
    let stop = interrupts.first_interrupt();
    let served = serve_until(options, tokio::io::stdin(), tokio::io::stdout(), async move {
        stop.arrived().await;
    });
    interrupts
        .run(served, || errln!("{ACP_FIRST_INTERRUPT}"))
        .await
        .map_err(|Abandoned| CliError::Interrupted)?
}

/// Sends warnings and errors to stderr (`run`, `demo`, `acp`), so failures that are only logged —
/// a teardown step that failed while the host shut down, a settlement notice that could not be
/// delivered — are seen. The protocol library's own warnings (an ACP provider's, or `acp`'s
/// server side) repeat every error response already sent to the peer; only its errors are
/// kept. Installing twice is a no-op.
///
/// A warning's fields quote what a model or a log holds (a repeated tool call's id and name, an
/// error's text), which the formatter writes as it is: each event goes out through
/// [`InertLogLine`], as one line with every control and bidirectional character escaped.
fn log_warnings_to_stderr() {
    use tracing_subscriber::layer::SubscriberExt as _;
    let filter = tracing_subscriber::filter::Targets::new()
        .with_default(tracing::Level::WARN)
        .with_target("agent_client_protocol", tracing::Level::ERROR);
    let subscriber = tracing_subscriber::fmt()
        .with_writer(InertLogLine::default)
        .with_ansi(false)
        .finish()
        .with(filter);
    // Fails only when a subscriber is already installed, which then keeps reporting.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

/// One formatted diagnostic event on its way to stderr: collected while the formatter writes
/// it, then written as one inert line ([`single_line`]) when the formatter lets go of it (the
/// formatter takes one writer per event).
#[derive(Default)]
struct InertLogLine(Vec<u8>);

impl std::io::Write for InertLogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for InertLogLine {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.0);
        errln!("{}", single_line(text.strip_suffix('\n').unwrap_or(&text)));
    }
}

/// The failure of the agent's last turn, if it did not complete.
fn last_turn_failure(agent: &dyn agent::Agent) -> Option<String> {
    agent
        .session()
        .events()
        .iter()
        .rev()
        .find_map(|e| match &e.data {
            agent::EventData::TurnEnd { reason, .. } => match reason {
                agent::TurnEndReason::Completed => Some(None),
                agent::TurnEndReason::Error { error } => Some(Some(format!("failed: {error}"))),
                agent::TurnEndReason::Aborted { reason } => Some(Some(format!("was aborted ({reason})"))),
                other => Some(Some(format!("ended with `{}`", other.kind()))),
            },
            _ => None,
        })?
}

async fn agents(store: &Path) -> Result<(), CliError> {
    let catalog = read_catalog(store).await?;
    for (id, error) in &catalog.unreadable {
        errln!(
            "subagent: skipping unreadable session `{}`: {}",
            single_line(id.as_str()),
            single_line(error)
        );
    }
    if catalog.sessions.is_empty() {
        outln!("no sessions in {}", single_line(&store.display().to_string()))?;
        return Ok(());
    }
    out!("{}", catalog.render())?;
    Ok(())
}

async fn log(session_id: &str, store: &Path) -> Result<(), CliError> {
    check_store_dir(store)?;
    let id = SessionId::from(session_id);
    let db = JsonlStore::new(store);
    let loaded = db.load(&id).await.map_err(|e| match e {
        agent_loop::StoreError::NotFound(_) | agent_loop::StoreError::InvalidId(_) => {
            CliError::UnknownSession {
                id: session_id.to_owned(),
                dir: store.to_owned(),
            }
        }
        other => CliError::UnreadableSession {
            id: session_id.to_owned(),
            reason: other.to_string(),
        },
    })?;
    if loaded.repaired {
        errln!("subagent: note: the log's last line was torn (an interrupted write) and is not shown");
    }
    out!(
        "{}",
        subagent_cli::logview::render_log(&loaded.header, &loaded.events)
    )?;
    Ok(())
}

fn check(dir: &Path) -> Result<(), CliError> {
    let report = invariants::check_store(dir).map_err(|e| CliError::Store {
        dir: dir.to_owned(),
        reason: match std::error::Error::source(&e) {
            Some(source) => source.to_string(),
            None => e.to_string(),
        },
    })?;
    // A violation names the session (a log's id or file name) and may quote what the log
    // holds: one inert line each.
    for violation in &report.violations {
        outln!("{}", single_line(&violation.to_string()))?;
    }
    outln!(
        "replayed {} logs ({} events): {} violations",
        report.logs,
        report.events,
        report.violations.len()
    )?;
    if report.is_clean() {
        Ok(())
    } else {
        Err(CliError::Violations {
            dir: dir.to_owned(),
            violations: report.violations.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The live tree's lines are cut to the terminal's width in columns, not characters: a
    /// label of wide characters (two columns each) cut at `width` characters would wrap, and
    /// every later redraw (which moves up one row per line) would leave stale rows behind.
    #[test]
    fn tree_lines_are_cut_to_columns_so_none_wraps() {
        let label = format!("spawn \"{}\"  depth 1  running  (abcd1234)", "調査".repeat(30));
        let cut = fit_to_width(&label, 20);
        assert_eq!(cut, "spawn \"調査調査調査");
        let columns: usize = cut.chars().map(|c| if c < '\u{1100}' { 1 } else { 2 }).sum();
        assert!(columns <= 20, "{cut}: {columns} columns");
        assert_eq!(fit_to_width("ascii only", 20), "ascii only");
        assert_eq!(fit_to_width(&"x".repeat(30), 20), "x".repeat(20));
        // A wide character that would straddle the last column is left out whole.
        assert_eq!(fit_to_width("abc調", 4), "abc");
    }
}
