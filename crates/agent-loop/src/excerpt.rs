//! Bounded quotes of model-supplied or damaged text in messages a model or a user reads.

/// The most bytes of a quoted value.
pub(crate) const EXCERPT_CAP: usize = 200;

/// `text` cut to at most [`EXCERPT_CAP`] bytes on a char boundary and marked `…` when cut, so
/// a refusal or failure never echoes a huge value back in full.
pub(crate) fn excerpt(mut text: String) -> String {
    if text.len() > EXCERPT_CAP {
        let mut end = EXCERPT_CAP;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_and_long_text_is_cut_on_a_char_boundary() {
        assert_eq!(excerpt("short".into()), "short");
        let long = "é".repeat(EXCERPT_CAP);
        let cut = excerpt(long);
        assert!(cut.ends_with('…'));
        assert!(cut.len() <= EXCERPT_CAP + '…'.len_utf8());
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }
}
