//! The configuration of one delegation tool instance (`acp-and-tools.md` §3.2, §3.10) and its
//! load-time validation.
//!
//! There are two ways to configure an instance, matching the reference's two entry points:
//!
//! * **Config defaulting** — [`SubagentToolConfig::from_json`] reads the documented JSON shape
//!   (`provider`, `toolName`, `enableRunInBackground`, `backgroundMode`, `agentOptions`,
//!   `persona`, `toolFilter`, `maxDepth`), fills the defaults (`toolName: subagent`,
//!   `enableRunInBackground: true`, `backgroundMode: one-shot`, `maxDepth: 3`) and validates.
//! * **Direct application** — [`SubagentToolConfig::new`] and the public fields. An omitted
//!   `max_depth` then means "no cap" (the default `3` comes only from config defaulting), and
//!   [`SubagentToolConfig::validate`] (run again by the loader) still rejects an invalid cap.
//!
//! Absent optional settings stay absent: an omitted `agentOptions` never becomes `{}`, and a
//! `toolFilter` never gains a default `allow: []` (which would hide every tool).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use subagent::agent::AgentOptions;
use subagent::{DepthError, DepthValue, ToolFilter, assert_subagent_max_depth};

use crate::error::ToolSubagentError;
use crate::model_text::{self, BackgroundExposure};

/// The `maxDepth` default of config defaulting.
pub const DEFAULT_MAX_DEPTH: u64 = 3;

/// The spelling of [`MaxDepth::ProviderManaged`] in configuration.
pub const PROVIDER_MANAGED: &str = "provider-managed";

/// How background calls behave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackgroundMode {
    /// An omitted `run_in_background` runs in the foreground; `true` starts a one-shot
    /// background job.
    #[default]
    OneShot,
    /// An omitted or `true` `run_in_background` starts a continuable child; `false` runs in the
    /// foreground. Requires a provider with continuable preparation.
    Continuable,
}

/// The depth cap sent with every start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaxDepth {
    /// An absolute cap on the child's delegation depth (`0` forbids any child of a top-level
    /// agent). Must be a non-negative safe integer; requires the provider's `depthLimit`
    /// capability (checked at mount).
    Cap(u64),
    /// Send no cap and leave the recursion budget to the provider (out-of-process providers).
    ProviderManaged,
}

impl MaxDepth {
    /// Validates an untrusted number as a cap: NaN, ±∞, negative values (−0 included),
    /// fractions and values above 2^53 − 1 fail with
    /// `subagent maxDepth must be a non-negative safe integer`.
    pub fn from_number(value: f64) -> Result<Self, ToolSubagentError> {
        Ok(Self::Cap(validated_cap(value)?))
    }

    /// Reads a configured JSON value: `"provider-managed"`, or a number validated like
    /// [`MaxDepth::from_number`]. Anything else (another string, a boolean, …) fails with the
    /// same message.
    pub fn from_json(value: &Value) -> Result<Self, ToolSubagentError> {
        if value.as_str() == Some(PROVIDER_MANAGED) {
            return Ok(Self::ProviderManaged);
        }
        Ok(Self::Cap(validated_cap(value)?))
    }

    /// The cap a start request carries (`None` for provider-managed).
    pub fn cap(self) -> Option<u64> {
        match self {
            Self::Cap(n) => Some(n),
            Self::ProviderManaged => None,
        }
    }
}

fn validated_cap<V: DepthValue>(value: V) -> Result<u64, DepthError> {
    assert_subagent_max_depth(Some(value))?.ok_or(DepthError::InvalidMaxDepth)
}

/// The configuration of one tool instance (one provider, one tool name).
#[derive(Clone, Debug, PartialEq)]
pub struct SubagentToolConfig {
    /// The provider name every start uses. The model never selects a provider.
    pub provider: String,
    /// The model-facing tool name; unique per loaded instance (default `subagent`).
    pub tool_name: String,
    /// Whether `run_in_background` is exposed (default `true`). When `false` the parameter is
    /// omitted from the schema **and** a forced `true` is refused at execution.
    pub enable_run_in_background: bool,
    /// One-shot (default) or continuable background runs.
    pub background_mode: BackgroundMode,
    /// Agent options forwarded unchanged to every start; absent when not configured.
    pub agent_options: Option<AgentOptions>,
    /// Per-child persona (requires the provider's `persona` capability, checked per start by
    /// the service).
    pub persona: Option<String>,
    /// Per-child tool filter, forwarded unchanged (requires the provider's `toolFilter`
    /// capability). Must name `allow` or `deny`.
    pub tool_filter: Option<ToolFilter>,
    /// The depth cap; `None` (direct application only) sends no cap.
    pub max_depth: Option<MaxDepth>,
}

impl SubagentToolConfig {
    /// A direct-application configuration for `provider` with every default of direct
    /// application: tool name `subagent`, background runs enabled in one-shot mode, no agent
    /// options, persona or tool filter, and **no** depth cap.
    pub fn new(provider: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            tool_name: model_text::DEFAULT_TOOL_NAME.to_owned(),
            enable_run_in_background: true,
            background_mode: BackgroundMode::OneShot,
            agent_options: None,
            persona: None,
            tool_filter: None,
            max_depth: None,
        }
    }

    /// Reads and validates the JSON configuration with config defaulting (see the module
    /// documentation). Unknown keys are refused; `null` reads as absent.
    pub fn from_json(value: &Value) -> Result<Self, ToolSubagentError> {
        let raw: RawConfig = serde_json::from_value(value.clone())
            .map_err(|e| ToolSubagentError::InvalidConfig(e.to_string()))?;
        let max_depth = match raw.max_depth {
            None | Some(Value::Null) => MaxDepth::Cap(DEFAULT_MAX_DEPTH),
            Some(v) => MaxDepth::from_json(&v)?,
        };
        let agent_options = raw.agent_options.map(RawAgentOptions::into_options).transpose()?;
        let config = Self {
            provider: raw.provider,
            tool_name: raw
                .tool_name
                .unwrap_or_else(|| model_text::DEFAULT_TOOL_NAME.to_owned()),
            enable_run_in_background: raw.enable_run_in_background.unwrap_or(true),
            background_mode: raw.background_mode.unwrap_or_default(),
            agent_options,
            persona: raw.persona,
            tool_filter: raw.tool_filter.map(|f| ToolFilter {
                allow: f.allow,
                deny: f.deny,
            }),
            max_depth: Some(max_depth),
        };
        config.validate()?;
        Ok(config)
    }

    /// The load-time checks that need no provider: the depth cap is a non-negative safe
    /// integer, `maxTokens` is a positive safe integer, the tool name is not empty, and an
    /// explicit tool filter names `allow` or `deny`.
    pub fn validate(&self) -> Result<(), ToolSubagentError> {
        if let Some(MaxDepth::Cap(n)) = self.max_depth {
            validated_cap(n)?;
        }
        if let Some(options) = &self.agent_options
            && let Some(n) = options.max_tokens
            && (n == 0 || n.as_depth().is_none())
        {
            return Err(ToolSubagentError::InvalidMaxTokens);
        }
        if self.tool_name.is_empty() {
            return Err(ToolSubagentError::EmptyToolName);
        }
        if let Some(filter) = &self.tool_filter
            && filter.allow.is_none()
            && filter.deny.is_none()
        {
            return Err(ToolSubagentError::EmptyToolFilter);
        }
        Ok(())
    }

    /// How this instance exposes background runs.
    pub fn exposure(&self) -> BackgroundExposure {
        match (self.enable_run_in_background, self.background_mode) {
            (false, _) => BackgroundExposure::Disabled,
            (true, BackgroundMode::OneShot) => BackgroundExposure::OneShot,
            (true, BackgroundMode::Continuable) => BackgroundExposure::Continuable,
        }
    }

    /// The numeric cap a start request carries (`None` for provider-managed or no cap).
    pub fn request_max_depth(&self) -> Option<u64> {
        self.max_depth.and_then(MaxDepth::cap)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    provider: String,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    enable_run_in_background: Option<bool>,
    #[serde(default)]
    background_mode: Option<BackgroundMode>,
    #[serde(default)]
    agent_options: Option<RawAgentOptions>,
    #[serde(default)]
    persona: Option<String>,
    #[serde(default)]
    tool_filter: Option<RawToolFilter>,
    #[serde(default)]
    max_depth: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawAgentOptions {
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_tokens: Option<Value>,
}

impl RawAgentOptions {
    fn into_options(self) -> Result<AgentOptions, ToolSubagentError> {
        let max_tokens = match self.max_tokens {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_depth() {
                Some(n) if n >= 1 => Some(n),
                _ => return Err(ToolSubagentError::InvalidMaxTokens),
            },
        };
        Ok(AgentOptions {
            provider: self.provider.map(Into::into),
            model: self.model.map(Into::into),
            max_tokens,
            ..AgentOptions::default()
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolFilter {
    #[serde(default)]
    allow: Option<Vec<String>>,
    #[serde(default)]
    deny: Option<Vec<String>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DEPTH_MESSAGE: &str = "subagent maxDepth must be a non-negative safe integer";

    /// spec: TOOL-31 — `'1'`, NaN, ±∞, −1, 1.5, −0 and 2^53 fail load with the depth message.
    #[test]
    fn tool_31_invalid_max_depths_fail_load() {
        let json_values = [
            json!("1"),
            json!(-1),
            json!(1.5),
            serde_json::from_str::<Value>("-0").expect("valid JSON"),
            json!(-0.0),
            json!(9_007_199_254_740_992u64),
            json!(true),
            json!("provider"),
        ];
        for value in json_values {
            let error = SubagentToolConfig::from_json(&json!({"provider": "p", "maxDepth": value}))
                .expect_err(&format!("{value} must be refused"));
            assert_eq!(error.to_string(), DEPTH_MESSAGE, "{value}");
        }
        for number in [
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1.0,
            1.5,
            -0.0,
            9_007_199_254_740_992.0,
        ] {
            let error = MaxDepth::from_number(number).expect_err("invalid cap");
            assert_eq!(error.to_string(), DEPTH_MESSAGE, "{number}");
        }
        assert_eq!(MaxDepth::from_number(0.0).ok(), Some(MaxDepth::Cap(0)));
        assert_eq!(
            MaxDepth::from_number(9_007_199_254_740_991.0).ok(),
            Some(MaxDepth::Cap(9_007_199_254_740_991))
        );
    }

    /// spec: TOOL-32 — direct application still validates the cap.
    #[test]
    fn tool_32_direct_application_validates_max_depth() {
        let mut config = SubagentToolConfig::new("unused");
        config.max_depth = Some(MaxDepth::Cap(9_007_199_254_740_992));
        assert_eq!(
            config.validate().expect_err("unsafe cap").to_string(),
            DEPTH_MESSAGE
        );
        assert_eq!(
            MaxDepth::from_number(f64::NAN).expect_err("NaN").to_string(),
            DEPTH_MESSAGE
        );
        // An omitted cap on direct application means "no cap".
        let direct = SubagentToolConfig::new("unused");
        direct.validate().expect("direct defaults are valid");
        assert_eq!(direct.max_depth, None);
        assert_eq!(direct.request_max_depth(), None);
    }

    /// spec: TOOL-35 — an explicit empty tool filter fails load.
    #[test]
    fn tool_35_empty_tool_filter_fails_load() {
        let error = SubagentToolConfig::from_json(&json!({"provider": "p", "toolFilter": {}}))
            .expect_err("empty filter");
        assert!(error.to_string().contains("names neither `allow` nor `deny`"));
        assert_eq!(
            error.to_string(),
            "tool-subagent: `toolFilter` is configured but names neither `allow` nor `deny` — remove the key or fill the filter"
        );
    }

    /// spec: TOOL-33, TOOL-34 — a deny-only filter stays deny-only; omitted agent options stay
    /// absent.
    #[test]
    fn absent_settings_stay_absent() {
        let config =
            SubagentToolConfig::from_json(&json!({"provider": "p", "toolFilter": {"deny": ["subagent"]}}))
                .expect("valid");
        assert_eq!(
            config.tool_filter,
            Some(ToolFilter {
                allow: None,
                deny: Some(vec!["subagent".into()])
            })
        );
        assert_eq!(config.agent_options, None);
        assert_eq!(config.persona, None);
    }

    /// spec: TOOL-51 (config half) — config defaulting fills tool name, background settings and
    /// `maxDepth: 3`.
    #[test]
    fn config_defaulting() {
        let config = SubagentToolConfig::from_json(&json!({"provider": "spawn"})).expect("valid");
        assert_eq!(config.tool_name, "subagent");
        assert!(config.enable_run_in_background);
        assert_eq!(config.background_mode, BackgroundMode::OneShot);
        assert_eq!(config.max_depth, Some(MaxDepth::Cap(3)));
        assert_eq!(config.request_max_depth(), Some(3));
        assert_eq!(config.exposure(), BackgroundExposure::OneShot);
    }

    #[test]
    fn full_shape_parses() {
        let config = SubagentToolConfig::from_json(&json!({
            "provider": "acp",
            "toolName": "subagent_acp",
            "enableRunInBackground": false,
            "backgroundMode": "continuable",
            "agentOptions": {"provider": "openai", "model": "m", "maxTokens": 100},
            "persona": "",
            "toolFilter": {"allow": ["read"], "deny": []},
            "maxDepth": "provider-managed",
        }))
        .expect("valid");
        assert_eq!(config.tool_name, "subagent_acp");
        assert_eq!(config.exposure(), BackgroundExposure::Disabled);
        assert_eq!(config.background_mode, BackgroundMode::Continuable);
        assert_eq!(
            serde_json::to_value(config.agent_options.as_ref()).expect("serializable"),
            json!({"provider": "openai", "model": "m", "maxTokens": 100})
        );
        assert_eq!(config.persona.as_deref(), Some(""));
        assert_eq!(config.max_depth, Some(MaxDepth::ProviderManaged));
        assert_eq!(config.request_max_depth(), None);
    }

    #[test]
    fn malformed_configurations_fail_load() {
        for (value, message) in [
            (
                json!({}),
                "tool-subagent: invalid configuration: missing field `provider`",
            ),
            (
                json!({"provider": "p", "toolname": "x"}),
                "tool-subagent: invalid configuration: unknown field `toolname`",
            ),
            (
                json!({"provider": "p", "agentOptions": {"maxTokens": 0}}),
                "tool-subagent: `agentOptions.maxTokens` must be a positive safe integer",
            ),
            (
                json!({"provider": "p", "agentOptions": {"maxTokens": 1.5}}),
                "tool-subagent: `agentOptions.maxTokens` must be a positive safe integer",
            ),
            (
                json!({"provider": "p", "toolName": ""}),
                "tool-subagent: `toolName` must be a non-empty string",
            ),
        ] {
            let error = SubagentToolConfig::from_json(&value).expect_err("malformed");
            assert!(error.to_string().starts_with(message), "{error}");
        }
        let mut direct = SubagentToolConfig::new("p");
        direct.agent_options = Some(AgentOptions {
            max_tokens: Some(0),
            ..AgentOptions::default()
        });
        assert!(matches!(
            direct.validate(),
            Err(ToolSubagentError::InvalidMaxTokens)
        ));
    }
}
