//! Identifiers shared by agents, sessions, messages and tool calls.
//!
//! Every identifier is a cheap-to-clone newtype over `Arc<str>` and serializes as a plain JSON
//! string, so logs written by this crate read the same as logs written by other implementations.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

macro_rules! string_id {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Wraps an existing identifier string. No validation happens here: ids are opaque.
            pub fn new(value: impl Into<Arc<str>>) -> Self {
                Self(value.into())
            }

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), &*self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(value: &str) -> Self {
                Self::new(value)
            }
        }

        impl From<String> for $name {
            fn from(value: String) -> Self {
                Self::new(value)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

string_id!(
    /// The single identity shared by a live agent and its session. A subagent child's run id
    /// equals its `SessionId`.
    SessionId
);
string_id!(
    /// Stable identity of one [`Message`](crate::Message), preserved from inbox delivery through
    /// the log and the model request. Inbox operations and duplicate checks key on it.
    MessageId
);
string_id!(
    /// Correlates a tool call with its result. Minted by the model adapter; it **may repeat
    /// across steps**, so it is never a unique execution key.
    CallId
);

impl SessionId {
    /// Mints a fresh random session id (`ses_` followed by a UUID v4 in simple form).
    pub fn generate() -> Self {
        Self::new(format!("ses_{}", uuid::Uuid::new_v4().simple()))
    }
}

impl MessageId {
    /// Mints a fresh random message id (`msg_` followed by a UUID v4 in simple form).
    pub fn generate() -> Self {
        Self::new(format!("msg_{}", uuid::Uuid::new_v4().simple()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_serialize_as_plain_strings() {
        let id = SessionId::from("abc");
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"abc\"");
        let back: SessionId = serde_json::from_str("\"abc\"").unwrap();
        assert_eq!(back, id);
    }

    #[test]
    fn generated_ids_are_unique() {
        assert_ne!(MessageId::generate(), MessageId::generate());
        assert!(SessionId::generate().as_str().starts_with("ses_"));
    }
}
