//! A minimal server-sent-events decoder (the subset chat-completion streams use).
//!
//! Bytes are fed in arbitrary pieces; complete events come out, as the raw bytes of their
//! data (UTF-8 is the caller's to check, so a damaged byte is never silently replaced). Only
//! `data:` fields matter (multiple `data:` lines of one event are joined with `\n`); `event:`, `id:`, `retry:` and
//! comments (`:`) are ignored. Lines end in `\n`, `\r\n` or `\r`. A byte-order mark at the
//! very start of the stream is skipped (as the SSE spec says; anywhere else it is part of a
//! field name).

/// Incremental SSE decoder.
#[derive(Debug, Default)]
pub(crate) struct SseDecoder {
    /// Bytes of the current, unterminated line.
    line: Vec<u8>,
    /// `data` of the event being assembled.
    data: Option<Vec<u8>>,
    /// Whether the previous byte was a `\r` (so a following `\n` is part of the same break).
    after_cr: bool,
    /// Whether the first line has been completed (only it may start with a byte-order mark).
    past_first_line: bool,
}

/// The UTF-8 byte-order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseDecoder {
    /// Feeds bytes; returns the `data` of every event completed by them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for &b in bytes {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    if let Some(data) = self.line_done(&line) {
                        out.push(data);
                    }
                }
                _ => {
                    self.after_cr = false;
                    self.line.push(b);
                }
            }
        }
        out
    }

    /// Ends the input: returns the pending event's data, if any (a stream that ended without
    /// the blank line that terminates its last event).
    pub(crate) fn finish(&mut self) -> Option<Vec<u8>> {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_done(&line);
        }
        self.data.take()
    }

    fn line_done(&mut self, mut line: &[u8]) -> Option<Vec<u8>> {
        if !self.past_first_line {
            self.past_first_line = true;
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if line.is_empty() {
            return self.data.take();
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => return None,
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &[][..]),
        };
        if field == b"data" {
            match &mut self.data {
                Some(d) => {
                    d.push(b'\n');
                    d.extend_from_slice(value);
                }
                None => self.data = Some(value.to_vec()),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_events_across_piece_boundaries() {
        let mut d = SseDecoder::default();
        let raw =
            b": keep-alive\r\n\r\ndata: {\"a\":1}\r\n\r\ndata: x\ndata: y\n\nevent: e\ndata: [DONE]\n\n";
        let mut out = Vec::new();
        for piece in raw.chunks(3) {
            out.extend(d.feed(piece));
        }
        assert_eq!(out, [&b"{\"a\":1}"[..], b"x\ny", b"[DONE]"]);
        assert_eq!(d.finish(), None);
    }

    #[test]
    fn finish_returns_an_unterminated_event() {
        let mut d = SseDecoder::default();
        assert!(d.feed(b"data: tail").is_empty());
        assert_eq!(d.finish().as_deref(), Some(&b"tail"[..]));
    }
}
