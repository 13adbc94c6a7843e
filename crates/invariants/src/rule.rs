//! The rule catalogue: every [`RuleId`] the engine can report, with its owner and a summary.

use std::fmt;

/// Names one rule. Printed in its short form (`S4`, `SEQ`, `FORK-SEED`, …).
///
/// The set is closed: every value is one of the associated constants, all listed in
/// [`RuleId::ALL`]. The session rules keep the numbering of `inprocess-providers.md` §6.4
/// (there is no `S15` constant: S15 states which events are *unconstrained*, so nothing can
/// violate it).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(&'static str);

impl RuleId {
    /// S1: `seq` strictly increases.
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
    /// Spine §4.2 (3): surface markers only on surface events, `sourceEventSeqs` only on
    /// `assistant/message`, and every surface event declares `surfaceOp`.
    pub const SURFACE: Self = Self("SURFACE");
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
    /// A seeded session's layout: the seed of `seedLength` events ends with `turn/end` and is
    /// followed by `session/end-seed` (spine §4.7, providers §3.3, §5.3).
    pub const SEED: Self = Self("SEED");
    /// A subagent child records exactly one `subagent/descriptor` in its own suffix, before its
    /// first model request (seam §2.12).
    pub const DESCRIPTOR: Self = Self("DESCRIPTOR");
    /// A subagent child names its `parentSession`.
    pub const LINEAGE: Self = Self("LINEAGE");
    /// A subagent child's `delegationDepth` is one more than its parent's (seam §2.11).
    pub const DEPTH: Self = Self("DEPTH");
    /// A fork child's first `seedLength` events equal its parent's first `seedLength` events.
    pub const FORK_SEED: Self = Self("FORK-SEED");
    /// Two logs in one store carry the same session id.
    pub const DUPLICATE_SESSION: Self = Self("DUP-SESSION");
    /// A log line is not JSON, or not the shape of a session event.
    pub const PARSE: Self = Self("PARSE");
    /// The last line of a log is cut short (a crash artifact stores drop on load).
    pub const TORN: Self = Self("TORN");
    /// A log file or directory could not be read.
    pub const IO: Self = Self("IO");
    /// An append reached the post-commit notification without a matching pre-commit check
    /// (providers §6.3 (4)).
    pub const STAGE: Self = Self("STAGE");

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
        Self::PARSE,
        Self::TORN,
        Self::IO,
        Self::STAGE,
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
    /// session-log rules, `user-approval`, `sandbox-policy`, `subagent` for the seam's lineage
    /// rules, and `invariants` for the reader's own findings.
    pub fn owner(self) -> &'static str {
        match self.0 {
            "A1" | "A2" | "A3" => "user-approval",
            "X1" => "sandbox-policy",
            "DESCRIPTOR" | "LINEAGE" | "DEPTH" | "FORK-SEED" => "subagent",
            "PARSE" | "TORN" | "IO" | "DUP-SESSION" | "STAGE" => "invariants",
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
            "A1" => "approval/asked is turn-enclosed, names a tool and opens a fresh id",
            "A2" => "approval/decided is turn-enclosed, answers a pending id with a known outcome",
            "A3" => "approval/policy is ask or never",
            "X1" => "sandbox/mode is read-only, workspace-write or danger-full-access",
            "HEADER" => "the log starts with a valid session header",
            "SEED" => "a seed ends with turn/end and is followed by session/end-seed",
            "DESCRIPTOR" => "a subagent child records one descriptor in its own suffix before its first step",
            "LINEAGE" => "a subagent child names its parent session",
            "DEPTH" => "a subagent child's depth is its parent's plus one",
            "FORK-SEED" => "a fork child's seed equals its parent's prefix",
            "DUP-SESSION" => "session ids are unique within a store",
            "PARSE" => "every log line is one session event as JSON",
            "TORN" => "the last log line is complete",
            "IO" => "log files are readable",
            "STAGE" => "every committed append was checked before commit",
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
