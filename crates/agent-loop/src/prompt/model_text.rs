//! Every text of prompt assembly that a model can see, in one place. The tests at the bottom pin
//! each string.

/// The line that opens a runtime-context snapshot message; the rendered contexts follow after
/// a blank line.
pub const SNAPSHOT_HEADER: &str =
    "Runtime context for this step. It replaces every earlier runtime-context snapshot.";

/// The snapshot message written when every runtime context has gone away after an earlier
/// snapshot was shown to the model.
pub const SNAPSHOT_CLEARED: &str =
    "Runtime context: none is active now. Earlier runtime-context snapshots no longer apply.";

/// The full text of a snapshot message for an already-joined, non-empty body.
pub fn snapshot_text(body: &str) -> String {
    format!("{SNAPSHOT_HEADER}\n\n{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_texts_are_pinned() {
        assert_eq!(
            snapshot_text("Mode: read-only."),
            "Runtime context for this step. It replaces every earlier runtime-context snapshot.\n\nMode: read-only."
        );
        assert_eq!(
            SNAPSHOT_CLEARED,
            "Runtime context: none is active now. Earlier runtime-context snapshots no longer apply."
        );
    }
}
