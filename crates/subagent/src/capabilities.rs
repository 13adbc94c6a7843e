//! What a provider can honour at start (spec §2.3) and the data a continuable provider
//! contributes (spec §2.14.3).

use std::fmt;
use std::sync::Arc;

use agent::{Agent, SessionEvent, SessionId, Signal};
use serde::{Deserialize, Serialize};

use crate::error::SubagentError;

/// The four **start-time, one-shot** features a provider advertises. Each flag maps one-to-one
/// to a start-request field: `output_schema` → `outputSchema`, `depth_limit` → `maxDepth`,
/// `tool_filter` → `toolFilter`, `persona` → `persona`.
///
/// `start` rejects a request that uses a field whose flag is false
/// (`UNSUPPORTED_CAPABILITY`, before the provider is called), never accepting-then-ignoring it.
/// The flags do not gate continuable starts: the continuation manager composes continuable
/// children itself; the continuable capability is the presence of continuable preparation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubagentCapabilities {
    /// Honours `outputSchema` (structured output).
    pub output_schema: bool,
    /// Honours `maxDepth`.
    pub depth_limit: bool,
    /// Honours `toolFilter`.
    pub tool_filter: bool,
    /// Honours `persona`.
    pub persona: bool,
}

/// The shared advertisement of out-of-process providers: nothing. A child in another process
/// cannot be made to honour a parent-enforced schema, depth cap, tool filter or persona. Being a
/// `const` of a `Copy` type, it is immutable.
pub const NO_START_CAPABILITIES: SubagentCapabilities = SubagentCapabilities {
    output_schema: false,
    depth_limit: false,
    tool_filter: false,
    persona: false,
};

/// One start-time capability, in the fixed order `start` checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Capability {
    /// `outputSchema`.
    OutputSchema,
    /// `depthLimit` (requested through `maxDepth`).
    DepthLimit,
    /// `toolFilter`.
    ToolFilter,
    /// `persona`.
    Persona,
}

impl Capability {
    /// All four, in check order.
    pub const ORDER: [Self; 4] = [
        Self::OutputSchema,
        Self::DepthLimit,
        Self::ToolFilter,
        Self::Persona,
    ];

    /// The flag's wire name (`outputSchema`, `depthLimit`, `toolFilter`, `persona`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OutputSchema => "outputSchema",
            Self::DepthLimit => "depthLimit",
            Self::ToolFilter => "toolFilter",
            Self::Persona => "persona",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which capability-gated fields a start request uses (present = requested).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestedCapabilities {
    /// The request has an `outputSchema`.
    pub output_schema: bool,
    /// The request has a `maxDepth`.
    pub max_depth: bool,
    /// The request has a `toolFilter`.
    pub tool_filter: bool,
    /// The request has a `persona`.
    pub persona: bool,
}

impl SubagentCapabilities {
    /// All four features.
    pub const ALL: Self = Self {
        output_schema: true,
        depth_limit: true,
        tool_filter: true,
        persona: true,
    };

    /// Whether `capability` is advertised.
    pub fn supports(&self, capability: Capability) -> bool {
        match capability {
            Capability::OutputSchema => self.output_schema,
            Capability::DepthLimit => self.depth_limit,
            Capability::ToolFilter => self.tool_filter,
            Capability::Persona => self.persona,
        }
    }

    /// The first requested capability (in [`Capability::ORDER`]) this advertisement lacks.
    pub fn first_unsupported(&self, requested: RequestedCapabilities) -> Option<Capability> {
        Capability::ORDER.into_iter().find(|c| {
            let wanted = match c {
                Capability::OutputSchema => requested.output_schema,
                Capability::DepthLimit => requested.max_depth,
                Capability::ToolFilter => requested.tool_filter,
                Capability::Persona => requested.persona,
            };
            wanted && !self.supports(*c)
        })
    }

    /// The capability step of `start` (spec §2.5 step 2): rejects the first requested,
    /// unadvertised capability of provider `provider` with `UNSUPPORTED_CAPABILITY`
    /// (`subagent provider "<provider>" does not support the "<capability>" capability`).
    /// Capability checks precede value checks, so an invalid `maxDepth` on a provider without
    /// `depthLimit` fails here.
    pub fn check(&self, provider: &str, requested: RequestedCapabilities) -> Result<(), SubagentError> {
        match self.first_unsupported(requested) {
            Some(c) => Err(SubagentError::unsupported_capability(provider, c.as_str())),
            None => Ok(()),
        }
    }
}

/// What the continuation manager hands a provider's continuable preparation (spec §2.14.3).
///
/// The parent type defaults to the host's agent trait object (`parent: AgentRef`); it is a
/// parameter only so the data can be built in tests without a live agent.
pub struct ContinuableCreateRequest<P: ?Sized = dyn Agent> {
    /// The reserved child id (for diagnostics; the preparation's data belongs only to it).
    pub session_id: SessionId,
    /// The delegating agent, whose history a seeding provider reads.
    pub parent: Arc<P>,
    /// The caller's cancellation, valid until inbox acceptance; the preparation must observe it.
    pub signal: Signal,
}

impl<P: ?Sized> Clone for ContinuableCreateRequest<P> {
    fn clone(&self) -> Self {
        Self {
            session_id: self.session_id.clone(),
            parent: Arc::clone(&self.parent),
            signal: self.signal.clone(),
        }
    }
}

impl<P: ?Sized> fmt::Debug for ContinuableCreateRequest<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContinuableCreateRequest")
            .field("session_id", &self.session_id)
            .field("signal", &self.signal)
            .finish_non_exhaustive()
    }
}

/// The detached data a provider's continuable preparation returns (spec §2.14.3): only an
/// optional creation seed — a completed-turn prefix of the parent's log with the creation
/// seed's durable contract (contiguous from seq 0, lossless JSON, balanced turns). No agent,
/// handle, prompt delivery, result, disposal or resume capability.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContinuableCreateSpec {
    /// The inherited prefix, or `None` for a fresh child (the `spawn` case).
    pub seed: Option<Vec<SessionEvent>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::SubagentErrorCode;
    use serde_json::json;

    /// spec: OOP-1 — `NO_START_CAPABILITIES` is all false (and, as a `const` of a `Copy`
    /// type, immutable: every use is a fresh copy).
    #[test]
    fn oop_1_no_start_capabilities_is_all_false() {
        assert_eq!(
            serde_json::to_value(NO_START_CAPABILITIES).unwrap(),
            json!({"outputSchema": false, "depthLimit": false, "toolFilter": false, "persona": false})
        );
        let copy = SubagentCapabilities {
            persona: true,
            ..NO_START_CAPABILITIES
        };
        assert!(copy.persona && !NO_START_CAPABILITIES.persona);
        assert!(
            Capability::ORDER
                .iter()
                .all(|c| !NO_START_CAPABILITIES.supports(*c))
        );
    }

    /// spec: §2.3, §2.5 step 2 — each of `outputSchema`, `maxDepth`, `toolFilter`, `persona`
    /// requested from a provider lacking it is rejected `UNSUPPORTED_CAPABILITY`, naming the
    /// capability (the service's test that the provider is never called cites the checklist).
    #[test]
    fn each_unsupported_capability_is_rejected() {
        let cases = [
            (
                RequestedCapabilities {
                    output_schema: true,
                    ..Default::default()
                },
                "outputSchema",
            ),
            (
                RequestedCapabilities {
                    max_depth: true,
                    ..Default::default()
                },
                "depthLimit",
            ),
            (
                RequestedCapabilities {
                    tool_filter: true,
                    ..Default::default()
                },
                "toolFilter",
            ),
            (
                RequestedCapabilities {
                    persona: true,
                    ..Default::default()
                },
                "persona",
            ),
        ];
        for (requested, name) in cases {
            let err = NO_START_CAPABILITIES.check("acp", requested).unwrap_err();
            assert_eq!(err.code(), SubagentErrorCode::UnsupportedCapability);
            assert_eq!(
                err.to_string(),
                format!("subagent provider \"acp\" does not support the \"{name}\" capability")
            );
            SubagentCapabilities::ALL.check("spawn", requested).unwrap();
        }
        NO_START_CAPABILITIES
            .check("acp", RequestedCapabilities::default())
            .unwrap();
    }

    /// spec: §2.3 — the first unsupported capability in the fixed order is the one reported.
    #[test]
    fn first_unsupported_follows_the_fixed_order() {
        let all = RequestedCapabilities {
            output_schema: true,
            max_depth: true,
            tool_filter: true,
            persona: true,
        };
        assert_eq!(
            NO_START_CAPABILITIES.first_unsupported(all),
            Some(Capability::OutputSchema)
        );
        let caps = SubagentCapabilities {
            output_schema: true,
            depth_limit: true,
            ..Default::default()
        };
        assert_eq!(caps.first_unsupported(all), Some(Capability::ToolFilter));
        assert_eq!(SubagentCapabilities::ALL.first_unsupported(all), None);
    }

    #[test]
    fn create_request_is_generic_over_the_parent() {
        let request = ContinuableCreateRequest::<str> {
            session_id: "child".into(),
            parent: Arc::from("parent"),
            signal: Signal::new(),
        };
        let copy = request.clone();
        assert!(Arc::ptr_eq(&copy.parent, &request.parent));
        assert!(format!("{request:?}").contains("child"));
        assert_eq!(ContinuableCreateSpec::default().seed, None);
    }
}
