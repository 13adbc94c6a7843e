//! The tool's canonical output value (`acp-and-tools.md` §3.4) and its rendering.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use subagent::agent::tools::ToolOutput;

use crate::model_text;

/// What a successful call returns, serialized as `{kind: "foreground", runId, output}`,
/// `{kind: "background", jobId}` or `{kind: "continuable", subagentId}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum DelegationValue {
    /// A completed foreground run.
    Foreground {
        /// The run id.
        run_id: String,
        /// The child's full output, as canonical JSON content blocks.
        output: Vec<Value>,
    },
    /// A one-shot background job was started.
    Background {
        /// The job id (`subagent-<n>`).
        job_id: String,
    },
    /// A continuable child was started.
    Continuable {
        /// The durable child id.
        subagent_id: String,
    },
}

impl DelegationValue {
    /// The single text the model sees: the foreground output's text, or
    /// `started background subagent job <id>`, or `started subagent <id>`.
    pub fn render(&self) -> String {
        match self {
            Self::Foreground { output, .. } => model_text::foreground_text(output),
            Self::Background { job_id } => model_text::background_started(job_id),
            Self::Continuable { subagent_id } => model_text::continuable_started(subagent_id),
        }
    }

    /// The tool output: one text block with [`render`](Self::render) and the value itself.
    pub fn into_output(self) -> ToolOutput {
        let text = self.render();
        // Serializing an enum of strings and JSON values cannot fail; keep the text either way.
        let value = serde_json::to_value(&self).ok();
        ToolOutput {
            value,
            ..ToolOutput::text(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_serialize_in_spec_shape() {
        let fg = DelegationValue::Foreground {
            run_id: "r".into(),
            output: vec![json!({"type": "text", "text": "hi"})],
        };
        assert_eq!(
            serde_json::to_value(&fg).ok(),
            Some(json!({"kind": "foreground", "runId": "r", "output": [{"type": "text", "text": "hi"}]}))
        );
        assert_eq!(fg.render(), "hi");
        let bg = DelegationValue::Background {
            job_id: "subagent-1".into(),
        };
        assert_eq!(
            serde_json::to_value(&bg).ok(),
            Some(json!({"kind": "background", "jobId": "subagent-1"}))
        );
        assert_eq!(bg.render(), "started background subagent job subagent-1");
        let ct = DelegationValue::Continuable {
            subagent_id: "c".into(),
        };
        assert_eq!(
            serde_json::to_value(&ct).ok(),
            Some(json!({"kind": "continuable", "subagentId": "c"}))
        );
        assert_eq!(ct.render(), "started subagent c");
    }
}
