//! [`ReportToolConfig`]: the deployment's report policy (`acp-and-tools.md` §5.3).
//!
//! The one key, `reportDelivery`, is chosen by whoever deploys the package, never by the
//! reporting child: `next-step` (the default) wakes the parent, `quiet` leaves it for the
//! parent's next step without waking it.

use serde_json::Value;
use subagent::continuation::ReportDelivery;

use crate::error::ToolSubagentReportError;

/// The JSON name of the delivery key.
pub const REPORT_DELIVERY_KEY: &str = "reportDelivery";

/// The JSON spelling of [`ReportDelivery::NextStep`].
pub const NEXT_STEP: &str = "next-step";

/// The JSON spelling of [`ReportDelivery::Quiet`].
pub const QUIET: &str = "quiet";

/// The configuration of the report package.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportToolConfig {
    /// How every accepted report is scheduled on the parent (default
    /// [`ReportDelivery::NextStep`]).
    pub report_delivery: ReportDelivery,
}

impl ReportToolConfig {
    /// A configuration with `delivery`.
    pub fn new(delivery: ReportDelivery) -> Self {
        Self {
            report_delivery: delivery,
        }
    }

    /// Reads the JSON configuration: an object whose only key, `reportDelivery`, is absent or
    /// `null` (the default, `next-step`), `"next-step"` or `"quiet"`. Anything else — another
    /// value, another type, an unknown key, a non-object — fails with
    /// [`ToolSubagentReportError::InvalidConfig`]; nothing is loaded then.
    pub fn from_json(value: &Value) -> Result<Self, ToolSubagentReportError> {
        let invalid = |detail: String| Err(ToolSubagentReportError::InvalidConfig(detail));
        let Some(object) = value.as_object() else {
            return invalid(format!("expected an object, got {}", json_kind(value)));
        };
        if let Some(unknown) = object.keys().find(|k| *k != REPORT_DELIVERY_KEY) {
            return invalid(format!(
                "unknown key `{unknown}` (the only key is `{REPORT_DELIVERY_KEY}`)"
            ));
        }
        let delivery = match object.get(REPORT_DELIVERY_KEY) {
            None | Some(Value::Null) => ReportDelivery::default(),
            Some(Value::String(s)) if s == NEXT_STEP => ReportDelivery::NextStep,
            Some(Value::String(s)) if s == QUIET => ReportDelivery::Quiet,
            Some(other) => {
                return invalid(format!(
                    "`{REPORT_DELIVERY_KEY}` must be \"{NEXT_STEP}\" or \"{QUIET}\", got {other}"
                ));
            }
        };
        Ok(Self::new(delivery))
    }
}

/// The JSON spelling of `delivery`.
pub fn delivery_name(delivery: ReportDelivery) -> &'static str {
    match delivery {
        ReportDelivery::NextStep => NEXT_STEP,
        ReportDelivery::Quiet => QUIET,
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// spec: REP-21 — `reportDelivery` defaults to `next-step`; the two documented values are
    /// read; every other value (and any other key or shape) is rejected.
    #[test]
    fn rep_21_delivery_defaults_to_next_step_and_other_values_are_rejected() {
        assert_eq!(
            ReportToolConfig::default().report_delivery,
            ReportDelivery::NextStep
        );
        for (value, delivery) in [
            (json!({}), ReportDelivery::NextStep),
            (json!({"reportDelivery": null}), ReportDelivery::NextStep),
            (json!({"reportDelivery": "next-step"}), ReportDelivery::NextStep),
            (json!({"reportDelivery": "quiet"}), ReportDelivery::Quiet),
        ] {
            let config = ReportToolConfig::from_json(&value).expect("valid");
            assert_eq!(config.report_delivery, delivery, "{value}");
            assert_eq!(
                ReportToolConfig::from_json(&json!({"reportDelivery": delivery_name(delivery)}))
                    .expect("round trip")
                    .report_delivery,
                delivery
            );
        }
        for value in [
            json!({"reportDelivery": "wakeup"}),
            json!({"reportDelivery": "shout"}),
            json!({"reportDelivery": "Quiet"}),
            json!({"reportDelivery": true}),
            json!({"reportDelivery": "quiet", "other": 1}),
            json!("quiet"),
            json!(null),
        ] {
            let error = ReportToolConfig::from_json(&value).expect_err("rejected");
            assert!(
                matches!(error, ToolSubagentReportError::InvalidConfig(_)),
                "{value}: {error:?}"
            );
            assert!(
                error
                    .to_string()
                    .starts_with("tool-subagent-report: invalid configuration: ")
            );
        }
        let error = ReportToolConfig::from_json(&json!({"reportDelivery": "wakeup"})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "tool-subagent-report: invalid configuration: `reportDelivery` must be \"next-step\" or \"quiet\", got \"wakeup\""
        );
    }
}
