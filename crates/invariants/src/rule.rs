//! The rule catalogue: every [`RuleId`] the engine can report, with its owner and a summary.

use std::fmt;

/// Names one rule. Printed in its short form (`S4`, `SEQ`, `FORK-SEED`, …).
///
/// The set is closed: every value is one of the associated constants, all listed in
/// [`RuleId::ALL`]. The session rules keep the numbering of `inprocess-providers.md` §6.4
/// (there is no `S15` constant: S15 states which events are *unconstrained*, so nothing can
/// violate it). The live companions of §6.6 keep theirs too, with the same kind of gaps: L1 and
/// L4 (the request and its messages are immutable) hold by construction in Rust, where a
/// request is an `Arc<GenerateOptions>` that nobody can mutate while it is shared, and B8 (a
/// start may name a provider that was removed since) only permits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(&'static str);

impl RuleId {
    /// S1: `seq` strictly increases (so no seq repeats an earlier event's).
    pub const S1: Self = Self("S1");
    /// S2: `turn/start` requires no open turn.
    pub const S2: Self = Self("S2");
    /// S3: `turn/start` numbers are contiguous from 1.
    pub const S3: Self = Self("S3");
    /// S4: `turn/end` names the open turn.
    pub const S4: Self = Self("S4");
    /// S5: `turn/end` requires no open step.
    pub const S5: Self = Self("S5");
    /// S6: `step/start` names the open turn.
    pub const S6: Self = Self("S6");
    /// S7: `step/start` requires no open step.
    pub const S7: Self = Self("S7");
    /// S8: `step/start` numbers are contiguous from 1 within a turn.
    pub const S8: Self = Self("S8");
    /// S9: `step/end` names the open turn and step.
    pub const S9: Self = Self("S9");
    /// S10: `assistant/chunk` and `assistant/message` name the open turn and step.
    pub const S10: Self = Self("S10");
    /// S11: `tool/call` names the open turn and step.
    pub const S11: Self = Self("S11");
    /// S12: an appended `tool/result` names the open step and answers a call of that step.
    pub const S12: Self = Self("S12");
    /// S13: a replacing `tool/result` stands inside an open turn.
    pub const S13: Self = Self("S13");
    /// S14: `todo/write`, `request/header` and `request/context` stand inside an open turn.
    pub const S14: Self = Self("S14");
    /// Spine §4.2 (1): seqs are contiguous from 0 (`events[i].seq == i`).
    pub const SEQ: Self = Self("SEQ");
    /// Spine §4.2 (3), (4): surface markers only on surface events, `sourceEventSeqs` only on
    /// `assistant/message`, every surface event declares `surfaceOp`, a `replace {start, end}`
    /// names current surface nodes (a `tool/result` replacement rewrites exactly one current
    /// `tool/result`, changing only its result's content), and an appended message's
    /// `sourceEventSeqs` names `assistant/chunk` events of its own step.
    pub const SURFACE: Self = Self("SURFACE");
    /// Spine §4.2 (2), §4.7 (1): an event's data is lossless JSON (no negative zero), and every
    /// `assistant/message` and `request/header` names its provider and model — what a session
    /// validates on each append and seed event, and a store on load.
    pub const EVENT: Self = Self("EVENT");
    /// A1: `approval/asked` inside an open turn, non-empty `toolName`, id not already pending.
    pub const A1: Self = Self("A1");
    /// A2: `approval/decided` inside an open turn, answering a pending id, with a known outcome.
    pub const A2: Self = Self("A2");
    /// A3: `approval/policy.policy` is `ask` or `never`.
    pub const A3: Self = Self("A3");
    /// X1: `sandbox/mode.mode` is `read-only`, `workspace-write` or `danger-full-access`.
    pub const X1: Self = Self("X1");
    /// The header (line 1 of a log file) is missing, malformed or invalid (spine §5).
    pub const HEADER: Self = Self("HEADER");
    /// A seeded session's layout: the seed of `seedLength` events is followed by
    /// `session/end-seed` unless it already ends with one (spine §4.7 (4)), and a subagent
    /// child's seed ends with `turn/end` (providers §3.3, §5.3: the fork provider clips to the
    /// balanced completed-turn prefix; the store's general fork need not, spine §4.8).
    pub const SEED: Self = Self("SEED");
    /// A subagent child records exactly one `subagent/descriptor` in its own suffix, before its
    /// first model request (seam §2.12).
    pub const DESCRIPTOR: Self = Self("DESCRIPTOR");
    /// A subagent child names its `parentSession`, and no session's `parentSession` chain in a
    /// store leads back to it.
    pub const LINEAGE: Self = Self("LINEAGE");
    /// A subagent child's `delegationDepth` is one more than its parent's (seam §2.11).
    pub const DEPTH: Self = Self("DEPTH");
    /// A fork child's first `seedLength` events equal its parent's first `seedLength` events.
    pub const FORK_SEED: Self = Self("FORK-SEED");
    /// Two logs in one store carry the same session id.
    pub const DUPLICATE_SESSION: Self = Self("DUP-SESSION");
    /// A log's file name is its session id (`<id>.jsonl`): a store finds a session by that name
    /// and refuses a file whose header names another, so a misnamed log is unloadable.
    pub const FILE_ID: Self = Self("FILE-ID");
    /// A settlement notice a parent received names a child whose `parentSession` is that parent
    /// (seam §2.14.8: notices go to the child's durable direct parent only).
    pub const NOTICE_PARENT: Self = Self("NOTICE-PARENT");
    /// A log line is not JSON, or not the shape of a session event.
    pub const PARSE: Self = Self("PARSE");
    /// The last line of a log is cut short (a crash artifact stores drop on load).
    pub const TORN: Self = Self("TORN");
    /// A log file or directory could not be read, or a log line is longer than
    /// [`MAX_LINE_BYTES`](crate::MAX_LINE_BYTES) (the log is read up to it).
    pub const IO: Self = Self("IO");
    /// An append reached the post-commit notification without a matching pre-commit check
    /// (providers §6.3 (4)).
    pub const STAGE: Self = Self("STAGE");
    /// G1: `agent/status` never repeats the previous status of the same agent (providers §6.6).
    pub const G1: Self = Self("G1");
    /// L2: a loop-built model request carries a session id (providers §6.6).
    pub const L2: Self = Self("L2");
    /// L3: the session a loop-built request names is live.
    pub const L3: Self = Self("L3");
    /// L5: a loop-built request is dispatched inside an open step (a `step/start` not yet
    /// closed).
    pub const L5: Self = Self("L5");
    /// L6: the session log of a loop-built request holds a `request/header`.
    pub const L6: Self = Self("L6");
    /// L7: a loop-built request's messages equal the history derived from its log at dispatch.
    pub const L7: Self = Self("L7");
    /// L8: a loop-built request's model, system, temperature, output cap, stop sequences and
    /// tools equal the latest `request/header`.
    pub const L8: Self = Self("L8");
    /// B1: subagent provider names are non-empty (providers §6.6, seam §2.20).
    pub const B1: Self = Self("B1");
    /// B2: `subagent/provider-added` is not repeated for a registered name.
    pub const B2: Self = Self("B2");
    /// B3: `subagent/provider-removed` names a registered provider.
    pub const B3: Self = Self("B3");
    /// B4: `subagent/start` has a non-empty provider, run id and child id.
    pub const B4: Self = Self("B4");
    /// B5: a run id is not started twice while open.
    pub const B5: Self = Self("B5");
    /// B6: `subagent/end` matches an open `subagent/start`.
    pub const B6: Self = Self("B6");
    /// B7: an end's provider, child id and `local` equal its start's.
    pub const B7: Self = Self("B7");

    /// Every rule, in catalogue order.
    pub const ALL: &'static [Self] = &[
        Self::S1,
        Self::S2,
        Self::S3,
        Self::S4,
        Self::S5,
        Self::S6,
        Self::S7,
        Self::S8,
        Self::S9,
        Self::S10,
        Self::S11,
        Self::S12,
        Self::S13,
        Self::S14,
        Self::SEQ,
        Self::SURFACE,
        Self::EVENT,
        Self::A1,
        Self::A2,
        Self::A3,
        Self::X1,
        Self::HEADER,
        Self::SEED,
        Self::DESCRIPTOR,
        Self::LINEAGE,
        Self::DEPTH,
        Self::FORK_SEED,
        Self::DUPLICATE_SESSION,
        Self::FILE_ID,
        Self::NOTICE_PARENT,
        Self::PARSE,
        Self::TORN,
        Self::IO,
        Self::STAGE,
        Self::G1,
        Self::L2,
        Self::L3,
        Self::L5,
        Self::L6,
        Self::L7,
        Self::L8,
        Self::B1,
        Self::B2,
        Self::B3,
        Self::B4,
        Self::B5,
        Self::B6,
        Self::B7,
    ];

    /// The short form (`"S4"`).
    pub const fn as_str(self) -> &'static str {
        self.0
    }

    /// Looks a rule up by its short form.
    pub fn parse(short: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| r.0 == short)
    }

    /// The package (in the reference's vocabulary) that owns the rule: `session` for the
    /// session-log rules, `user-approval`, `sandbox-policy`, `agent` for the status rule,
    /// `agent-loop` for request reconstruction, `subagent` for the seam's lineage and lifecycle
    /// rules, and `invariants` for the reader's own findings.
    pub fn owner(self) -> &'static str {
        match self.0 {
            "A1" | "A2" | "A3" => "user-approval",
            "X1" => "sandbox-policy",
            "G1" => "agent",
            "L2" | "L3" | "L5" | "L6" | "L7" | "L8" => "agent-loop",
            "DESCRIPTOR" | "LINEAGE" | "DEPTH" | "FORK-SEED" | "NOTICE-PARENT" | "B1" | "B2" | "B3"
            | "B4" | "B5" | "B6" | "B7" => "subagent",
            "PARSE" | "TORN" | "IO" | "DUP-SESSION" | "FILE-ID" | "STAGE" => "invariants",
            _ => "session",
        }
    }

    /// A one-line statement of what the rule requires.
    pub fn summary(self) -> &'static str {
        match self.0 {
            "S1" => "seq strictly increases",
            "S2" => "turn/start requires no open turn",
            "S3" => "turn numbers are contiguous from 1",
            "S4" => "turn/end names the open turn",
            "S5" => "turn/end requires no open step",
            "S6" => "step/start names the open turn",
            "S7" => "step/start requires no open step",
            "S8" => "step numbers are contiguous from 1 within a turn",
            "S9" => "step/end names the open turn and step",
            "S10" => "assistant/chunk and assistant/message name the open turn and step",
            "S11" => "tool/call names the open turn and step",
            "S12" => "an appended tool/result answers a pending call of the open step",
            "S13" => "a replacing tool/result stands inside an open turn",
            "S14" => "todo/write, request/header and request/context stand inside an open turn",
            "SEQ" => "seqs are contiguous from 0",
            "SURFACE" => "surface metadata appears exactly on surface events",
            "EVENT" => "event data is lossless JSON and model events name provider and model",
            "A1" => "approval/asked is turn-enclosed, names a tool and opens a fresh id",
            "A2" => "approval/decided is turn-enclosed, answers a pending id with a known outcome",
            "A3" => "approval/policy is ask or never",
            "X1" => "sandbox/mode is read-only, workspace-write or danger-full-access",
            "HEADER" => "the log starts with a valid session header",
            "SEED" => "a seed is followed by session/end-seed; a subagent child's seed ends with turn/end",
            "DESCRIPTOR" => "a subagent child records one descriptor in its own suffix before its first step",
            "LINEAGE" => "a subagent child names its parent session; parent chains have no cycle",
            "DEPTH" => "a subagent child's depth is its parent's plus one",
            "FORK-SEED" => "a fork child's seed equals its parent's prefix",
            "DUP-SESSION" => "session ids are unique within a store",
            "FILE-ID" => "a log's file name is its session id",
            "NOTICE-PARENT" => "a settlement notice names a child of the receiving session",
            "PARSE" => "every log line is one session event as JSON",
            "TORN" => "the last log line is complete",
            "IO" => "log files are readable",
            "STAGE" => "every committed append was checked before commit",
            "G1" => "agent/status never repeats the agent's previous status",
            "L2" => "a loop-built request carries a session id",
            "L3" => "a loop-built request names a live session",
            "L5" => "a loop-built request is dispatched inside an open step",
            "L6" => "a loop-built request's log holds a request/header",
            "L7" => "a loop-built request's messages equal the derived history",
            "L8" => "a loop-built request's settings equal the latest request/header",
            "B1" => "subagent provider names are non-empty",
            "B2" => "subagent/provider-added is not repeated for a registered name",
            "B3" => "subagent/provider-removed names a registered provider",
            "B4" => "subagent/start names a provider, a run id and a child id",
            "B5" => "a run id is not started twice while open",
            "B6" => "subagent/end matches an open subagent/start",
            "B7" => "subagent/end carries its start's provider, child id and locality",
            _ => "",
        }
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl fmt::Debug for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RuleId({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_is_unique_and_described() {
        for (i, r) in RuleId::ALL.iter().enumerate() {
            assert!(!r.summary().is_empty(), "{r} has no summary");
            assert_eq!(RuleId::parse(r.as_str()), Some(*r));
            assert!(!RuleId::ALL[..i].contains(r), "{r} listed twice");
        }
        assert_eq!(RuleId::parse("S15"), None);
        assert_eq!(RuleId::S4.owner(), "session");
        assert_eq!(RuleId::DEPTH.owner(), "subagent");
    }
}
