//! The tool body: argument parsing, the calling agent, common request construction
//! (`acp-and-tools.md` §3.6) and dispatch to a route.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use subagent::SubagentError;
use subagent::agent::bus::panic_message;
use subagent::agent::tools::{ToolContext, ToolError, ToolHandler, ToolOutput};
use subagent::agent::{AgentRef, CancelCause, CancelOnDrop, ContentBlock, Services, Signal};
use subagent::continuation::{ContinuableStartSpec, ContinuationManager};
use subagent::provider::SubagentStartRequest;
use subagent::service::SubagentService;
use tokio::task::JoinError;
use tokio_util::task::TaskTracker;

use crate::config::SubagentToolConfig;
use crate::model_text;
use crate::route::{Route, resolve_route};
use crate::value::DelegationValue;
use crate::{background, continuable, foreground};

/// What every call of one instance shares: its configuration, the host's services, the
/// subagent service, the continuation manager (when the host gave one) and the trackers of the
/// foreground runs and continuable starts in flight.
pub(crate) struct Invocation {
    pub(crate) config: SubagentToolConfig,
    pub(crate) services: Services,
    pub(crate) subagents: SubagentService,
    /// Starts continuable children; `None` when the plugin was loaded without one, and then the
    /// continuable route answers `CONTINUATION_UNAVAILABLE`.
    pub(crate) continuation: Option<ContinuationManager>,
    /// Foreground runs execute on tracked tasks so that a call whose body is dropped (the
    /// registry drops a cancelled body; a host may abandon a call) still awaits its result and
    /// disposes its run. A dropped body cancels its run first (see `abandon_guard`).
    pub(crate) tracker: TaskTracker,
    /// Continuable starts execute on tracked tasks for the same reason: a dropped body never
    /// cuts a start (or its rollback) short; it cancels the start's signal instead, and the task
    /// ends as soon as the manager has answered — it never outlives the start.
    pub(crate) starts: TaskTracker,
}

impl Invocation {
    /// The start request of one call: `label` = description, `prompt` = one text block,
    /// `parent` = the calling agent, then only the configured extras — agent options, persona
    /// and tool filter unchanged, `maxDepth` only when numeric.
    fn request(&self, args: &DelegationArgs, parent: AgentRef, signal: Signal) -> SubagentStartRequest {
        let config = &self.config;
        let mut request =
            SubagentStartRequest::new(vec![ContentBlock::text(args.prompt.clone())], parent, signal);
        request.label = Some(args.description.clone());
        request.agent_options.clone_from(&config.agent_options);
        request.persona.clone_from(&config.persona);
        request.tool_filter.clone_from(&config.tool_filter);
        request.max_depth = config.request_max_depth().map(Value::from);
        request
    }

    /// The continuable start spec of one call (§3.9), built from [`request`](Self::request) so
    /// that every route shares one construction: provider from the configuration, `label` =
    /// description, the same prompt, parent and configured extras, and `signal` as the token
    /// that owns the start until the child accepts its prompt.
    fn continuable_spec(
        &self,
        args: &DelegationArgs,
        parent: AgentRef,
        signal: Signal,
    ) -> ContinuableStartSpec {
        let request = self.request(args, parent, signal);
        let mut spec = ContinuableStartSpec::new(
            self.config.provider.clone(),
            args.description.clone(),
            request.prompt,
            request.parent,
        );
        spec.agent_options = request.agent_options;
        spec.max_depth = request.max_depth;
        spec.tool_filter = request.tool_filter;
        spec.persona = request.persona;
        spec.signal = request.signal;
        spec
    }
}

/// The model's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
struct DelegationArgs {
    description: String,
    prompt: String,
    run_in_background: Option<bool>,
}

impl DelegationArgs {
    fn parse(arguments: &Value) -> Result<Self, ToolError> {
        let args = arguments
            .as_object()
            .ok_or_else(|| ToolError::invalid_args(model_text::ARGUMENTS_NOT_OBJECT))?;
        let string = |name: &str| match args.get(name) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(ToolError::invalid_args(model_text::string_param_required(name))),
        };
        let description = string(model_text::DESCRIPTION_PARAM)?;
        let prompt = string(model_text::PROMPT_PARAM)?;
        // A blank prompt is no task: refuse it here rather than start a child (and spend a model
        // call, or register a job) on an empty user message.
        if prompt.trim().is_empty() {
            return Err(ToolError::invalid_args(model_text::PROMPT_BLANK));
        }
        let run_in_background = match args.get(model_text::RUN_IN_BACKGROUND_PARAM) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => return Err(ToolError::invalid_args(model_text::RUN_IN_BACKGROUND_NOT_BOOLEAN)),
        };
        Ok(Self {
            description,
            prompt,
            run_in_background,
        })
    }
}

/// Cancels the signal of a call's task when the tool body is dropped before that task answered
/// (a host abandoning the call without firing its signal), with `reason`:
///
/// * a foreground run — nobody will read its result, so its child must stop rather than work on
///   unobserved; the task still awaits the result and disposes the run;
/// * a continuable start not yet accepted — nobody will learn the child's id, so the start must
///   reject (and roll back) rather than leave a child the model never heard of.
fn abandon_guard(signal: &Signal, reason: &'static str) -> CancelOnDrop {
    signal.cancel_on_drop(CancelCause::Other {
        reason: reason.to_owned(),
    })
}

/// A call's task that ended without an answer: it panicked (every provider call in it is
/// contained; this is a last resort that still names the panic rather than the runtime's task
/// text), or the runtime cancelled it. `failed` words the detail for the route.
fn task_failure(join: JoinError, failed: fn(&str) -> String) -> ToolError {
    let detail = if join.is_panic() {
        panic_message(&*join.into_panic())
    } else {
        model_text::FOREGROUND_TASK_CANCELLED.to_owned()
    };
    ToolError::failed(failed(&detail))
}

/// The body of one mounted tool instance.
pub(crate) struct DelegationTool {
    pub(crate) invocation: Arc<Invocation>,
}

#[async_trait]
impl ToolHandler for DelegationTool {
    async fn execute(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args = DelegationArgs::parse(&arguments)?;
        let inv = &self.invocation;
        let Some(parent) = inv.services.agents.get(ctx.agent()) else {
            return Err(ToolError::failed(model_text::CALLING_AGENT_REQUIRED));
        };
        let route = resolve_route(
            inv.config.enable_run_in_background,
            inv.config.background_mode,
            args.run_in_background,
        )
        .map_err(ToolError::invalid_args)?;
        let provider = inv.config.provider.clone();
        let value = match route {
            Route::Foreground => {
                // The run listens to a child of the call's token, cancelled by `abandon` when
                // this body is dropped before the run's task has answered.
                let signal = ctx.signal.child();
                let abandon = abandon_guard(&signal, model_text::CALL_ABANDONED_REASON);
                let request = inv.request(&args, parent, signal);
                // Begun here, not on the task: the start's synchronous prefix (the delegated
                // policy capture among it) belongs to the call.
                let starting = foreground::begin_start(inv.subagents.clone(), provider.clone(), request);
                let task = inv.tracker.spawn(foreground::run(provider, starting));
                let joined = task.await;
                abandon.disarm();
                joined.map_err(|join| task_failure(join, model_text::foreground_task_failed))??
            }
            Route::OneShotBackground => {
                let request = inv.request(&args, parent, ctx.signal.clone());
                let Some(jobs) = &inv.services.jobs else {
                    return Err(ToolError::failed(model_text::JOBS_UNAVAILABLE));
                };
                let (value, hold) = background::start(
                    jobs,
                    inv.subagents.clone(),
                    provider,
                    args.description,
                    ctx.agent().clone(),
                    request,
                )?;
                // Until the job id reaches the model, the call still owns the job: a success the
                // pipeline discards (the call's signal fired as the body returned, so the call is
                // recorded as cancelled) would otherwise leave a job the model never heard of —
                // or, had it already settled, a completion notice naming it. The hold keeps the
                // job from announcing itself until the pipeline commits or discards the success.
                if let DelegationValue::Background { job_id } = &value {
                    background::kill_on_discard(&ctx, jobs.clone(), job_id, hold);
                }
                value
            }
            Route::Continuable => {
                // §3.9. Without a continuation manager there is nothing to start children
                // with: refuse with the seam's own error (the spec's "no agents service").
                let Some(manager) = &inv.continuation else {
                    return Err(continuable::failure(SubagentError::continuation_unavailable()));
                };
                // The start listens to a child of the call's token: cancelled with it, and by
                // `abandon` when this body is dropped before the manager answered.
                let signal = ctx.signal.child();
                let abandon = abandon_guard(&signal, model_text::START_ABANDONED_REASON);
                let spec = inv.continuable_spec(&args, parent, signal);
                // The manager's admission and policy capture run here, synchronously; the
                // rest of the start runs on a tracked task.
                let task = inv.starts.spawn(continuable::start(manager, spec));
                let joined = task.await;
                abandon.disarm();
                joined.map_err(|join| task_failure(join, model_text::continuable_start_failed))??
            }
        };
        Ok(value.into_output())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use subagent::agent::tools::codes;

    #[test]
    fn arguments_are_parsed_strictly() {
        let ok =
            DelegationArgs::parse(&json!({"description": "d", "prompt": "p", "run_in_background": null}));
        assert_eq!(
            ok.ok(),
            Some(DelegationArgs {
                description: "d".into(),
                prompt: "p".into(),
                run_in_background: None
            })
        );
        let extra = DelegationArgs::parse(&json!({"description": "d", "prompt": "p", "other": 1}));
        assert!(extra.is_ok(), "undeclared keys are permitted");
        for (args, message) in [
            (json!("text"), model_text::ARGUMENTS_NOT_OBJECT.to_owned()),
            (
                json!({"prompt": "p"}),
                model_text::string_param_required("description"),
            ),
            (
                json!({"description": "d", "prompt": 3}),
                model_text::string_param_required("prompt"),
            ),
            (
                json!({"description": "d", "prompt": " \n\t"}),
                model_text::PROMPT_BLANK.to_owned(),
            ),
            (
                json!({"description": "d", "prompt": "p", "run_in_background": "yes"}),
                model_text::RUN_IN_BACKGROUND_NOT_BOOLEAN.to_owned(),
            ),
        ] {
            let error = DelegationArgs::parse(&args).expect_err("malformed");
            assert_eq!(error.code, codes::INVALID_ARGS);
            assert_eq!(error.message, message);
        }
    }

    /// Arbitrary JSON, biased towards objects with the real field names.
    fn any_arguments() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            prop_oneof![Just(String::new()), "[ \t\n]{1,3}", any::<String>()].prop_map(Value::String),
        ];
        let json = leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{0,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        let text = prop_oneof![
            Just(String::new()),
            "[ \t\n\u{3000}]{1,3}",
            "[a-z ]{0,8}",
            any::<String>(),
        ];
        let string_field = prop_oneof![
            1 => Just(None),
            4 => text.prop_map(|s| Some(Value::String(s))),
            2 => json.clone().prop_map(Some),
        ];
        let flag = prop_oneof![
            2 => Just(None),
            1 => Just(Some(Value::Null)),
            2 => any::<bool>().prop_map(|b| Some(Value::Bool(b))),
            2 => json.clone().prop_map(Some),
        ];
        let object = (string_field.clone(), string_field, flag).prop_map(|(d, p, b)| {
            let mut map = serde_json::Map::new();
            for (key, value) in [
                (model_text::DESCRIPTION_PARAM, d),
                (model_text::PROMPT_PARAM, p),
                (model_text::RUN_IN_BACKGROUND_PARAM, b),
            ] {
                if let Some(value) = value {
                    map.insert(key.to_owned(), value);
                }
            }
            Value::Object(map)
        });
        prop_oneof![3 => object, 1 => json]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 512,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// The parse never panics, accepts exactly two string fields with a non-blank prompt
        /// and an optional boolean flag, keeps them verbatim, and refuses everything else as
        /// `INVALID_ARGS` naming the offending parameter.
        #[test]
        fn parse_accepts_exactly_the_documented_shape(arguments in any_arguments()) {
            let parsed = DelegationArgs::parse(&arguments);
            let field = |name: &str| arguments.get(name);
            let description = field(model_text::DESCRIPTION_PARAM).and_then(Value::as_str);
            let prompt = field(model_text::PROMPT_PARAM).and_then(Value::as_str);
            let flag = field(model_text::RUN_IN_BACKGROUND_PARAM);
            let flag_ok = matches!(flag, None | Some(Value::Null | Value::Bool(_)));
            match (description, prompt) {
                (Some(d), Some(p)) if !p.trim().is_empty() && flag_ok => {
                    let args = parsed.expect("the documented shape parses");
                    prop_assert_eq!(args.description.as_str(), d);
                    prop_assert_eq!(args.prompt.as_str(), p);
                    prop_assert_eq!(args.run_in_background, flag.and_then(Value::as_bool));
                }
                _ => {
                    let error = parsed.expect_err("anything else is refused");
                    prop_assert_eq!(error.code.as_str(), codes::INVALID_ARGS);
                    let named = if !arguments.is_object() {
                        "JSON object"
                    } else if description.is_none() {
                        "`description`"
                    } else if prompt.is_none_or(|p| p.trim().is_empty()) {
                        "`prompt`"
                    } else {
                        "`run_in_background`"
                    };
                    prop_assert!(error.message.contains(named), "{} lacks {}", error.message, named);
                }
            }
        }
    }
}
