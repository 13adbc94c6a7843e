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
        Self::new(prefixed_simple_uuid(*b"ses_", *uuid::Uuid::new_v4().as_bytes()).as_str())
    }
}

impl MessageId {
    /// Mints a fresh random message id (`msg_` followed by a UUID v4 in simple form).
    ///
    /// Message ids are minted on the hot path (every assistant message and tool result), so
    /// their random bits come from a per-thread generator seeded once from the operating
    /// system's randomness rather than from one system call per id. Ids stay unique (each
    /// thread's sequence is a bijection of a counter, and threads start from independent
    /// 128-bit seeds); they are not meant to be unpredictable.
    pub fn generate() -> Self {
        let mut bytes = fast_random_bytes();
        // The version (4) and RFC 4122 variant bits, as `uuid::Builder::from_random_bytes` sets.
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        Self::new(prefixed_simple_uuid(*b"msg_", bytes).as_str())
    }
}

/// A four-byte prefix followed by the lower-case simple (32 hex digits, no hyphens) form of a
/// UUID, formatted on the stack with a table lookup per nibble.
struct PrefixedUuid([u8; 4 + 32]);

impl PrefixedUuid {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("the prefix and hex digits are ASCII")
    }
}

fn prefixed_simple_uuid(prefix: [u8; 4], bytes: [u8; 16]) -> PrefixedUuid {
    /// The two lower-case hex digits of every byte value.
    const HEX_PAIRS: [[u8; 2]; 256] = {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut pairs = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            pairs[i] = [HEX[i >> 4], HEX[i & 0x0f]];
            i += 1;
        }
        pairs
    };
    let mut buf = [0u8; 4 + 32];
    buf[..4].copy_from_slice(&prefix);
    for i in 0..16 {
        let [hi, lo] = HEX_PAIRS[usize::from(bytes[i])];
        buf[4 + 2 * i] = hi;
        buf[5 + 2 * i] = lo;
    }
    PrefixedUuid(buf)
}

/// 16 random-looking bytes from a per-thread SplitMix64 pair seeded from a UUID v4.
fn fast_random_bytes() -> [u8; 16] {
    use std::cell::Cell;

    thread_local! {
        static STATE: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
    }
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    STATE.with(|state| {
        let (a, b) = state.get().unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair());
        let (a, b) = (a.wrapping_add(GAMMA), b.wrapping_add(GAMMA));
        state.set(Some((a, b)));
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&mix(a).to_le_bytes());
        bytes[8..].copy_from_slice(&mix(b).to_le_bytes());
        bytes
    })
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

    #[test]
    fn stack_formatting_matches_the_uuid_crate() {
        for seed in [[0u8; 16], [0xff; 16], *uuid::Uuid::new_v4().as_bytes()] {
            let mut bytes = seed;
            bytes[6] = (bytes[6] & 0x0f) | 0x40;
            bytes[8] = (bytes[8] & 0x3f) | 0x80;
            let expected = uuid::Builder::from_random_bytes(seed).into_uuid();
            assert_eq!(*expected.as_bytes(), bytes);
            assert_eq!(
                prefixed_simple_uuid(*b"msg_", bytes).as_str(),
                format!("msg_{}", expected.simple())
            );
        }
        let id = SessionId::generate();
        let hex = id.as_str().strip_prefix("ses_").expect("ses_ prefix");
        assert_eq!(uuid::Uuid::parse_str(hex).unwrap().simple().to_string(), hex);
        assert_eq!(uuid::Uuid::parse_str(hex).unwrap().get_version_num(), 4);
    }

    #[test]
    fn message_ids_are_v4_uuids_unique_across_threads() {
        let mint = || (0..1000).map(|_| MessageId::generate()).collect::<Vec<_>>();
        let other = std::thread::spawn(mint).join().unwrap();
        let mut all: Vec<MessageId> = mint().into_iter().chain(other).collect();
        for id in &all {
            let hex = id.as_str().strip_prefix("msg_").expect("msg_ prefix");
            let uuid = uuid::Uuid::parse_str(hex).expect("a simple UUID");
            assert_eq!(uuid.get_version_num(), 4, "{id}");
            assert_eq!(hex, uuid.simple().to_string());
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 2000);
    }
}
