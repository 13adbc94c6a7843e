//! The session header (spec §5): immutable, validated metadata kept beside the log.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::SessionId;

/// The session format version this crate writes.
pub const SESSION_FORMAT_VERSION: u32 = 0;

/// The largest integer JSON readers can represent exactly (`2^53 - 1`).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// How a session came to be, for navigation. Only `subagent` exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// The session is a subagent child.
    Subagent,
}

/// Immutable metadata beside a session log. Never an event, never in model history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionHeader {
    /// Format version.
    pub version: u32,
    /// Equals the session id.
    pub id: SessionId,
    /// Creation time, epoch milliseconds (a safe integer).
    pub created_at: u64,
    /// Absolute working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The direct parent session (child lineage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session: Option<SessionId>,
    /// How many leading events came from a fork seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_length: Option<u64>,
    /// Navigation classification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// Durable recursion budget; absent means 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation_depth: Option<u64>,
    /// Composition the child ran under (unused by this runtime; kept for foreign logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_preset: Option<String>,
}

/// Metadata a creator supplies for a new session's header.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionMeta {
    /// Absolute working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The direct parent session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session: Option<SessionId>,
    /// Creation time override (epoch ms); default: now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<u64>,
    /// Seed length to record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_length: Option<u64>,
    /// Origin to record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Origin>,
    /// Delegation depth to record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegation_depth: Option<u64>,
    /// Agent preset to record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_preset: Option<String>,
}

/// A header or metadata field failed validation. The message names the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid session header field `{field}`: {reason}")]
pub struct HeaderError {
    /// The offending field, in its wire spelling (`createdAt`, `cwd`, …).
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl HeaderError {
    fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

fn check_safe(field: &'static str, v: Option<u64>) -> Result<(), HeaderError> {
    match v {
        Some(n) if n > MAX_SAFE_INTEGER => Err(HeaderError::new(field, format!("{n} is not a safe integer"))),
        _ => Ok(()),
    }
}

/// [`SessionMeta::validate`] over borrowed fields (so a header validates without cloning).
fn validate_meta_fields(
    created_at: Option<u64>,
    seed_length: Option<u64>,
    delegation_depth: Option<u64>,
    cwd: Option<&Path>,
    parent_session: Option<&SessionId>,
) -> Result<(), HeaderError> {
    check_safe("createdAt", created_at)?;
    check_safe("seedLength", seed_length)?;
    check_safe("delegationDepth", delegation_depth)?;
    if let Some(cwd) = cwd {
        if !cwd.is_absolute() {
            return Err(HeaderError::new(
                "cwd",
                format!("{} is not an absolute path", cwd.display()),
            ));
        }
        // The header is JSON: a path that is not Unicode has no lossless JSON form.
        if cwd.to_str().is_none() {
            return Err(HeaderError::new(
                "cwd",
                format!(
                    "{} is not valid UTF-8, which a session header cannot hold",
                    cwd.display()
                ),
            ));
        }
    }
    if let Some(p) = parent_session
        && p.as_str().is_empty()
    {
        return Err(HeaderError::new("parentSession", "must not be empty"));
    }
    Ok(())
}

impl SessionMeta {
    /// Parses metadata from untrusted JSON, naming the first offending field.
    pub fn from_json(value: &Value) -> Result<Self, HeaderError> {
        let obj = value
            .as_object()
            .ok_or_else(|| HeaderError::new("meta", "metadata must be a JSON object"))?;
        let uint = |field: &'static str| -> Result<Option<u64>, HeaderError> {
            match obj.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .filter(|n| *n <= MAX_SAFE_INTEGER)
                    .map(Some)
                    .ok_or_else(|| {
                        HeaderError::new(field, format!("{v} is not a non-negative safe integer"))
                    }),
            }
        };
        let string = |field: &'static str| -> Result<Option<String>, HeaderError> {
            match obj.get(field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(v) => Err(HeaderError::new(field, format!("{v} is not a string"))),
            }
        };
        let origin = match string("origin")? {
            None => None,
            Some(s) if s == "subagent" => Some(Origin::Subagent),
            Some(s) => return Err(HeaderError::new("origin", format!("{s:?} is not \"subagent\""))),
        };
        let meta = Self {
            cwd: string("cwd")?.map(PathBuf::from),
            parent_session: string("parentSession")?.map(SessionId::from),
            created_at: uint("createdAt")?,
            seed_length: uint("seedLength")?,
            origin,
            delegation_depth: uint("delegationDepth")?,
            agent_preset: string("agentPreset")?,
        };
        meta.validate()?;
        Ok(meta)
    }

    /// Validates every field: safe integers, an absolute UTF-8 `cwd`, non-empty ids.
    pub fn validate(&self) -> Result<(), HeaderError> {
        validate_meta_fields(
            self.created_at,
            self.seed_length,
            self.delegation_depth,
            self.cwd.as_deref(),
            self.parent_session.as_ref(),
        )
    }

    /// Builds the header for session `id`, validating the metadata; `now_ms` is used when no
    /// creation time was given.
    pub fn into_header(self, id: SessionId, now_ms: u64) -> Result<SessionHeader, HeaderError> {
        self.validate()?;
        if id.as_str().is_empty() {
            return Err(HeaderError::new("id", "must not be empty"));
        }
        let header = SessionHeader {
            version: SESSION_FORMAT_VERSION,
            id,
            created_at: self.created_at.unwrap_or(now_ms),
            cwd: self.cwd,
            parent_session: self.parent_session,
            seed_length: self.seed_length,
            origin: self.origin,
            delegation_depth: self.delegation_depth,
            agent_preset: self.agent_preset,
        };
        // `header.validate()` minus what was just checked: only `createdAt` may be new.
        check_safe("createdAt", Some(header.created_at))?;
        debug_assert_eq!(header.validate(), Ok(()));
        Ok(header)
    }
}

impl SessionHeader {
    /// Validates a header (for example one read from disk). A `version` newer than
    /// [`SESSION_FORMAT_VERSION`] is refused: a log in a format this crate does not know must
    /// not be read as if it were its own, nor continued in the older format.
    pub fn validate(&self) -> Result<(), HeaderError> {
        if self.version > SESSION_FORMAT_VERSION {
            return Err(HeaderError::new(
                "version",
                format!(
                    "format version {} is newer than this crate reads ({SESSION_FORMAT_VERSION})",
                    self.version
                ),
            ));
        }
        if self.id.as_str().is_empty() {
            return Err(HeaderError::new("id", "must not be empty"));
        }
        check_safe("createdAt", Some(self.created_at))?;
        // The checks of `self.meta().validate()`, on borrowed fields.
        validate_meta_fields(
            Some(self.created_at),
            self.seed_length,
            self.delegation_depth,
            self.cwd.as_deref(),
            self.parent_session.as_ref(),
        )
    }

    /// The header's metadata, for re-creating a session with the same fields (resume).
    pub fn meta(&self) -> SessionMeta {
        SessionMeta {
            cwd: self.cwd.clone(),
            parent_session: self.parent_session.clone(),
            created_at: Some(self.created_at),
            seed_length: self.seed_length,
            origin: self.origin,
            delegation_depth: self.delegation_depth,
            agent_preset: self.agent_preset.clone(),
        }
    }

    /// The delegation depth, with absent meaning 0.
    pub fn depth(&self) -> u64 {
        self.delegation_depth.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// spec: SPN-61
    #[test]
    fn spn_61_meta_attaches_origin_and_depth_and_rejects_bad_scalars() {
        let meta = SessionMeta::from_json(&json!({"origin": "subagent", "delegationDepth": 2, "cwd": "/w"}))
            .unwrap();
        let h = meta.into_header("s".into(), 7).unwrap();
        assert_eq!(h.origin, Some(Origin::Subagent));
        assert_eq!(h.delegation_depth, Some(2));
        assert_eq!(h.created_at, 7);
        let err = SessionMeta::from_json(&json!({"delegationDepth": -1})).unwrap_err();
        assert_eq!(err.field, "delegationDepth");
        let err = SessionMeta::from_json(&json!({"delegationDepth": 1.5})).unwrap_err();
        assert_eq!(err.field, "delegationDepth");
        let err = SessionMeta::from_json(&json!({"seedLength": 9007199254740992u64})).unwrap_err();
        assert_eq!(err.field, "seedLength");
        let err = SessionMeta::from_json(&json!({"cwd": "rel/path"})).unwrap_err();
        assert_eq!(err.field, "cwd");
        assert_eq!(
            err.to_string(),
            "invalid session header field `cwd`: rel/path is not an absolute path"
        );
        let err = SessionMeta::from_json(&json!({"origin": "user"})).unwrap_err();
        assert_eq!(err.field, "origin");
    }

    #[test]
    fn a_header_of_a_newer_format_version_is_invalid() {
        let mut h = SessionMeta::default().into_header("s".into(), 1).unwrap();
        assert_eq!(h.validate(), Ok(()));
        h.version = SESSION_FORMAT_VERSION + 1;
        let err = h.validate().unwrap_err();
        assert_eq!(err.field, "version");
    }

    #[test]
    fn header_round_trips_with_spec_field_names() {
        let raw = json!({"version": 0, "id": "s", "createdAt": 1, "cwd": "/x", "parentSession": "p", "seedLength": 3, "origin": "subagent", "delegationDepth": 1});
        let h: SessionHeader = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(serde_json::to_value(&h).unwrap(), raw);
    }

    #[test]
    fn into_header_checks_a_clock_supplied_created_at() {
        let err = SessionMeta::default()
            .into_header("s".into(), MAX_SAFE_INTEGER + 1)
            .unwrap_err();
        assert_eq!(err.field, "createdAt");
        let h = SessionMeta::default().into_header("s".into(), 5).unwrap();
        assert_eq!(h.created_at, 5);
        assert_eq!(h.validate(), Ok(()));
        let err = SessionMeta::default().into_header("".into(), 5).unwrap_err();
        assert_eq!(err.field, "id");
    }

    /// spec: agent-spine §5 ("non-JSON metadata fails creation") — a `cwd` that is not UTF-8
    /// has no lossless JSON form: the header (and so the creation) is refused, naming the field,
    /// instead of being accepted and failing only where it is written.
    #[cfg(unix)]
    #[test]
    fn a_cwd_that_is_not_utf8_is_invalid() {
        use std::os::unix::ffi::OsStrExt as _;
        let cwd = PathBuf::from(std::ffi::OsStr::from_bytes(b"/tmp/\xff"));
        let meta = SessionMeta {
            cwd: Some(cwd),
            ..SessionMeta::default()
        };
        let err = meta.validate().unwrap_err();
        assert_eq!(err.field, "cwd");
        assert!(err.to_string().contains("not valid UTF-8"), "{err}");
        let err = meta.into_header("s".into(), 1).unwrap_err();
        assert_eq!(err.field, "cwd");
    }
}
