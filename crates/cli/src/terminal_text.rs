//! Untrusted text made safe to write to a terminal.
//!
//! Much of what the program prints is controlled by a model or read from a session log: a
//! child's label (the `description` a model gives the delegation tool), provider names, session
//! ids, error messages, message text. Written raw, such text could carry terminal escape
//! sequences (`ESC [2J` clears the screen, `ESC ]0;…BEL` sets the window title,
//! `ESC ]52;…` writes the clipboard), carriage returns and backspaces that overwrite what is
//! already shown, or bidirectional overrides that make text read differently from what it is —
//! and a newline inside a label breaks a tree's layout or forges a line.
//!
//! [`single_line`] and [`multi_line`] replace every such character by a visible escape, so
//! nothing is lost and the reader sees what was there:
//!
//! - C0 controls (U+0000–U+001F), DEL (U+007F) and C1 controls (U+0080–U+009F): `\n`, `\r`
//!   and `\t` for those three, `\u{1b}` (lowercase hex, as Rust writes it) for the others;
//! - the bidirectional controls (U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069) — the
//!   marks included, since an invisible mark is enough to reorder the neutral characters around
//!   it — and the line and paragraph separators U+2028, U+2029, which some terminals and
//!   viewers break lines at: `\u{202e}`.
//!
//! [`multi_line`], for message bodies, keeps `\n` and `\t`; [`single_line`], for labels, ids,
//! tree lines and error messages, escapes them too. A text that needs no escape is returned
//! borrowed, without allocating. The escape is for reading, not a reversible encoding: a
//! backslash already in the text is left as it is.
//!
//! The program's own escape codes (the live tree's in-place redraw) are written around
//! sanitized text, never through these functions.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` as one line for a terminal: every control character, `\n`, `\r` and `\t`
/// included, and every bidirectional control replaced by a visible escape (see the module
/// docs). Borrowed when nothing needed escaping.
pub fn single_line(text: &str) -> Cow<'_, str> {
    sanitize(text, false)
}

/// `text` for a terminal, keeping its line breaks (`\n`) and tabs: every other control
/// character (`\r` included) and every bidirectional control replaced by a visible escape (see
/// the module docs). Borrowed when nothing needed escaping.
pub fn multi_line(text: &str) -> Cow<'_, str> {
    sanitize(text, true)
}

/// [`single_line`] of an owned text, reusing it when nothing needed escaping.
pub fn single_line_owned(text: String) -> String {
    match single_line(&text) {
        Cow::Borrowed(_) => text,
        Cow::Owned(escaped) => escaped,
    }
}

/// The final answer of `subagent run` as it goes to stdout: byte for byte when stdout is not a
/// terminal, through [`multi_line`] when it is.
///
/// The answer is the model's product, meant to be piped into a file or another program, where
/// any rewriting would corrupt it (and where escape sequences do no harm), so it is kept exact
/// unless a terminal would interpret it. On a terminal it is shown for reading, with its line
/// breaks and tabs, and any control or bidirectional character as a visible escape.
pub fn final_answer(answer: &str, to_terminal: bool) -> Cow<'_, str> {
    if to_terminal {
        multi_line(answer)
    } else {
        Cow::Borrowed(answer)
    }
}

/// Whether `c` must be escaped; `keep_breaks` keeps `\n` and `\t`.
fn needs_escape(c: char, keep_breaks: bool) -> bool {
    match c {
        '\n' | '\t' => !keep_breaks,
        // C0, DEL and C1 (general category Cc).
        c if c.is_control() => true,
        '\u{061c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}'
        | '\u{2028}'
        | '\u{2029}' => true,
        _ => false,
    }
}

fn sanitize(text: &str, keep_breaks: bool) -> Cow<'_, str> {
    let Some(first) = text.find(|c| needs_escape(c, keep_breaks)) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        if !needs_escape(c, keep_breaks) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No raw control or bidi character is left.
    fn inert(s: &str, keep_breaks: bool) -> bool {
        !s.chars().any(|c| needs_escape(c, keep_breaks))
    }

    #[test]
    fn clean_text_is_borrowed_not_allocated() {
        for text in [
            "",
            "spawn \"survey the crates\"  depth 1",
            "ünïcödé — 日本語 ✓",
            "a\\u{1b} already escaped",
        ] {
            assert!(matches!(single_line(text), Cow::Borrowed(s) if s == text));
            assert!(matches!(multi_line(text), Cow::Borrowed(s) if s == text));
        }
        let body = "line one\n\tindented line two\n";
        assert!(matches!(multi_line(body), Cow::Borrowed(s) if s == body));
        let owned = String::from("clean");
        let ptr = owned.as_ptr();
        let kept = single_line_owned(owned);
        assert_eq!(kept.as_ptr(), ptr, "reused, not copied");
    }

    #[test]
    fn csi_sequences_are_escaped() {
        let text = "before\x1b[2J\x1b[1;1Hafter";
        assert_eq!(single_line(text), "before\\u{1b}[2J\\u{1b}[1;1Hafter");
        assert_eq!(multi_line(text), "before\\u{1b}[2J\\u{1b}[1;1Hafter");
    }

    #[test]
    fn osc_title_and_clipboard_writes_are_escaped() {
        assert_eq!(single_line("\x1b]0;pwned\x07label"), "\\u{1b}]0;pwned\\u{7}label");
        // An OSC 52 clipboard write ended by ST (ESC \).
        assert_eq!(
            single_line("\x1b]52;c;cm0gLXJmIH4=\x1b\\"),
            "\\u{1b}]52;c;cm0gLXJmIH4=\\u{1b}\\"
        );
    }

    #[test]
    fn carriage_return_and_backspace_cannot_overwrite() {
        assert_eq!(single_line("safe\rforged"), "safe\\rforged");
        assert_eq!(multi_line("safe\rforged"), "safe\\rforged");
        assert_eq!(multi_line("one\r\ntwo"), "one\\r\ntwo");
        assert_eq!(
            single_line("rm -rf /\x08\x08\x08ls"),
            "rm -rf /\\u{8}\\u{8}\\u{8}ls"
        );
        assert_eq!(single_line("nul\0del\x7f"), "nul\\u{0}del\\u{7f}");
    }

    #[test]
    fn c1_controls_are_escaped() {
        // U+009B is the one-character CSI; U+009D the one-character OSC.
        assert_eq!(
            single_line("a\u{9b}2Jb\u{9d}0;t\u{9c}"),
            "a\\u{9b}2Jb\\u{9d}0;t\\u{9c}"
        );
        assert_eq!(multi_line("\u{80}\u{9f}"), "\\u{80}\\u{9f}");
        // Just past C1 is ordinary text.
        assert!(matches!(single_line("\u{a0}é"), Cow::Borrowed(_)));
    }

    #[test]
    fn bidi_controls_are_escaped() {
        assert_eq!(single_line("invoice\u{202e}fdp.exe"), "invoice\\u{202e}fdp.exe");
        let all = "\u{61c}\u{200e}\u{200f}\u{202a}\u{202b}\u{202c}\u{202d}\u{202e}\u{2066}\u{2067}\u{2068}\u{2069}\u{2028}\u{2029}";
        let escaped = multi_line(all);
        assert!(inert(&escaped, false), "{escaped}");
        assert_eq!(escaped.matches("\\u{").count(), all.chars().count());
    }

    #[test]
    fn single_line_escapes_line_breaks_and_tabs() {
        let text = "label\n#3    [user] forged\tline";
        let line = single_line(text);
        assert_eq!(line, "label\\n#3    [user] forged\\tline");
        assert!(!line.contains('\n') && !line.contains('\t'));
    }

    #[test]
    fn multi_line_keeps_newlines_and_tabs_only() {
        let text = "first\n\tsecond \x1b[31mred\x1b[0m\nthird\u{202e}";
        let body = multi_line(text);
        assert_eq!(body, "first\n\tsecond \\u{1b}[31mred\\u{1b}[0m\nthird\\u{202e}");
        assert_eq!(body.lines().count(), 3);
        assert!(inert(&body, true));
    }

    #[test]
    fn the_final_answer_is_exact_when_piped_and_escaped_on_a_terminal() {
        let answer = "done\n\x1b]52;c;Y2xpcA==\x07\u{202e}";
        assert!(matches!(final_answer(answer, false), Cow::Borrowed(s) if s == answer));
        assert_eq!(
            final_answer(answer, true),
            "done\n\\u{1b}]52;c;Y2xpcA==\\u{7}\\u{202e}"
        );
    }

    #[test]
    fn every_control_character_is_escaped() {
        let all: String = (0u32..0x2100).filter_map(char::from_u32).collect();
        let line = single_line(&all);
        assert!(inert(&line, false));
        assert!(!line.chars().any(char::is_control));
        let body = multi_line(&all);
        assert!(inert(&body, true));
        assert_eq!(body.matches('\n').count(), 1);
        assert_eq!(body.matches('\t').count(), 1);
    }
}
