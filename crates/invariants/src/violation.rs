//! One broken rule, located in a session log.

use std::fmt;
use std::path::{Path, PathBuf};

use agent::SessionId;

use crate::rule::RuleId;

/// One broken rule: which session, where in its log, which rule, and what was expected there.
///
/// `Display` reads `[S4] session "a" seq 5 (line 7): expected turn/end to name the open turn 1,
/// got turn 2`; a finding read from a file names it: `[S4] session "a" seq 5 in /logs/a.jsonl
/// (line 7): expected …`. Violations are values, never panics: the engine reports them and carries on
/// (offline) or turns them into a veto (online).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The session whose log breaks the rule (for a log file without a readable header, the file
    /// stem).
    pub session: SessionId,
    /// The offending event's `seq` as written, when the violation is about one event.
    pub seq: Option<u64>,
    /// The rule broken.
    pub rule: RuleId,
    /// What the rule expected at that point, and what was found instead.
    pub expected: String,
    /// The 1-based line of the log file, when the violation was found reading a file (the header
    /// is line 1, event `i` normally line `i + 2`).
    pub line: Option<u64>,
    /// The log file the violation was found in, when it was found reading one (session ids
    /// repeat across directories, so the session alone may not identify the log).
    pub file: Option<PathBuf>,
}

impl Violation {
    /// A violation about event `seq` (no file line).
    pub fn at(session: SessionId, seq: Option<u64>, rule: RuleId, expected: impl Into<String>) -> Self {
        Self {
            session,
            seq,
            rule,
            expected: expected.into(),
            line: None,
            file: None,
        }
    }

    /// The same violation located at file line `line`.
    pub fn on_line(mut self, line: u64) -> Self {
        self.line = Some(line);
        self
    }

    /// The same violation located in the log file `file`.
    pub fn in_file(mut self, file: &Path) -> Self {
        self.file = Some(file.to_owned());
        self
    }

    /// The text a veto carries, in the reference's failure form:
    /// `invariant violated by "<owner>": <violation>`.
    pub fn veto_text(&self) -> String {
        format!("invariant violated by \"{}\": {self}", self.rule.owner())
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] session \"{}\"", self.rule, self.session)?;
        if let Some(seq) = self.seq {
            write!(f, " seq {seq}")?;
        }
        if let Some(file) = &self.file {
            write!(f, " in {}", file.display())?;
        }
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        write!(f, ": expected {}", self.expected)
    }
}

impl std::error::Error for Violation {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_session_seq_rule_and_expectation() {
        let v = Violation::at(
            "a".into(),
            Some(5),
            RuleId::S4,
            "turn/end to name the open turn 1, got turn 2",
        )
        .on_line(7);
        assert_eq!(
            v.to_string(),
            "[S4] session \"a\" seq 5 (line 7): expected turn/end to name the open turn 1, got turn 2"
        );
        let v = Violation::at("b".into(), None, RuleId::HEADER, "a header line");
        assert_eq!(v.to_string(), "[HEADER] session \"b\": expected a header line");
        let v = v.in_file(Path::new("/logs/b.jsonl")).on_line(1);
        assert_eq!(
            v.to_string(),
            "[HEADER] session \"b\" in /logs/b.jsonl (line 1): expected a header line"
        );
        assert!(
            v.veto_text()
                .starts_with("invariant violated by \"session\": [HEADER]")
        );
    }
}
