//! A minimal server-sent-events decoder (the subset chat-completion streams use).
//!
//! Bytes are fed in arbitrary pieces; complete events come out, as the raw bytes of their
//! data (UTF-8 is the caller's to check, so a damaged byte is never silently replaced) and
//! whether their type (`event:`, the last one of the event) is `error`. Only `data:` and
//! `event:` fields matter (multiple `data:` lines of one event are joined with `\n`); `id:`,
//! `retry:` and comments (`:`) are ignored. Lines end in `\n`, `\r\n` or `\r`. A byte-order mark at the
//! very start of the stream is skipped (as the SSE spec says; anywhere else it is part of a
//! field name). An event (its data and current line) may hold at most [`MAX_EVENT_BYTES`]: a
//! server that sends more without ending the event stops the decoding (see
//! [`SseDecoder::too_large`]) instead of growing the buffer without bound.

/// The most bytes one event may buffer (16 MiB).
pub(crate) const MAX_EVENT_BYTES: usize = 16 << 20;

/// One complete event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SseEvent {
    /// The raw bytes of its data.
    pub(crate) data: Vec<u8>,
    /// Whether its type is `error` (an `event: error` field, as some providers send their
    /// in-stream errors with).
    pub(crate) error: bool,
}

/// Incremental SSE decoder.
#[derive(Debug)]
pub(crate) struct SseDecoder {
    /// Bytes of the current, unterminated line.
    line: Vec<u8>,
    /// `data` of the event being assembled.
    data: Option<Vec<u8>>,
    /// Whether the event being assembled is of type `error` (its last `event:` field says so).
    error: bool,
    /// Whether the previous byte was a `\r` (so a following `\n` is part of the same break).
    after_cr: bool,
    /// Whether the first line has been completed (only it may start with a byte-order mark).
    past_first_line: bool,
    /// The most bytes the current event may buffer.
    limit: usize,
    /// Whether an event outgrew `limit` (nothing more is decoded).
    too_large: bool,
}

impl Default for SseDecoder {
    fn default() -> Self {
        Self::with_limit(MAX_EVENT_BYTES)
    }
}

/// The UTF-8 byte-order mark.
const BOM: &[u8] = b"\xEF\xBB\xBF";

impl SseDecoder {
    /// A decoder whose events may buffer at most `limit` bytes.
    pub(crate) fn with_limit(limit: usize) -> Self {
        Self {
            line: Vec::new(),
            data: None,
            error: false,
            after_cr: false,
            past_first_line: false,
            limit,
            too_large: false,
        }
    }

    /// Whether an event outgrew the limit; the decoder then ignores all further input.
    pub(crate) fn too_large(&self) -> bool {
        self.too_large
    }

    /// Feeds bytes; returns every event completed by them (before the limit was outgrown, if
    /// it was).
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut out = Vec::new();
        if self.too_large {
            return out;
        }
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
                    if self.line.len() + self.data.as_ref().map_or(0, Vec::len) >= self.limit {
                        self.too_large = true;
                        self.line = Vec::new();
                        self.data = None;
                        return out;
                    }
                    self.line.push(b);
                }
            }
        }
        out
    }

    /// Ends the input: returns the pending event, if it has data (a stream that ended without
    /// the blank line that terminates its last event).
    pub(crate) fn finish(&mut self) -> Option<SseEvent> {
        if self.too_large {
            return None;
        }
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_done(&line);
        }
        self.dispatch()
    }

    /// Ends the event being assembled: returns it if it has data; the next one starts with
    /// no data and the default type.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let error = std::mem::take(&mut self.error);
        self.data.take().map(|data| SseEvent { data, error })
    }

    fn line_done(&mut self, mut line: &[u8]) -> Option<SseEvent> {
        if !self.past_first_line {
            self.past_first_line = true;
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if line.is_empty() {
            return self.dispatch();
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => return None,
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &[][..]),
        };
        if field == b"event" {
            self.error = value == b"error";
        } else if field == b"data" {
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

    /// The data of each event.
    fn datas(events: &[SseEvent]) -> Vec<&[u8]> {
        events.iter().map(|e| e.data.as_slice()).collect()
    }

    #[test]
    fn decodes_events_across_piece_boundaries() {
        let mut d = SseDecoder::default();
        let raw =
            b": keep-alive\r\n\r\ndata: {\"a\":1}\r\n\r\ndata: x\ndata: y\n\nevent: e\ndata: [DONE]\n\n";
        let mut out = Vec::new();
        for piece in raw.chunks(3) {
            out.extend(d.feed(piece));
        }
        assert_eq!(datas(&out), [&b"{\"a\":1}"[..], b"x\ny", b"[DONE]"]);
        assert!(out.iter().all(|e| !e.error));
        assert_eq!(d.finish(), None);
    }

    #[test]
    fn an_event_may_not_outgrow_the_limit() {
        // Exactly at the limit (line plus data) is fine, whatever the framing.
        let mut d = SseDecoder::with_limit(16);
        let raw = b"data: 0123456789\ndata\n\n";
        let mut out = Vec::new();
        for piece in raw.chunks(1) {
            out.extend(d.feed(piece));
        }
        assert_eq!(datas(&out), [&b"0123456789\n"[..]]);
        assert!(!d.too_large());
        // One byte more: in one line, across data lines, or in a comment. Events completed
        // before the overflow still come out; nothing after it does.
        for raw in [
            &b"data: 0123456789A"[..],
            b"data: 012345\ndata: 6789A\n",
            b": keep-alive, padded out\n",
        ] {
            let mut d = SseDecoder::with_limit(16);
            let mut input = b"data: x\n\n".to_vec();
            input.extend_from_slice(raw);
            input.extend_from_slice(b"\n\ndata: y\n\n");
            assert_eq!(datas(&d.feed(&input)), [b"x"], "{raw:?}");
            assert!(d.too_large(), "{raw:?}");
            assert!(d.feed(b"data: z\n\n").is_empty());
            assert_eq!(d.finish(), None);
        }
    }

    #[test]
    fn an_event_is_an_error_when_its_last_type_field_says_so() {
        let mut d = SseDecoder::default();
        let raw = concat!(
            "event: error\ndata: x\n\n",
            // The type is the event's own: it does not carry over to the next event.
            "data: y\n\n",
            "event: error\nevent: message\ndata: z\n\n",
            "event: message\nevent: error\ndata: v\n\n",
            // An event without data is not dispatched, and neither is its type.
            "event: error\n\ndata: w\n\n",
            "event: error\ndata: tail",
        );
        let mut out = Vec::new();
        for piece in raw.as_bytes().chunks(2) {
            out.extend(d.feed(piece));
        }
        out.extend(d.finish());
        let got: Vec<(&[u8], bool)> = out.iter().map(|e| (e.data.as_slice(), e.error)).collect();
        assert_eq!(
            got,
            [
                (&b"x"[..], true),
                (b"y", false),
                (b"z", false),
                (b"v", true),
                (b"w", false),
                (b"tail", true),
            ]
        );
    }

    #[test]
    fn finish_returns_an_unterminated_event() {
        let mut d = SseDecoder::default();
        assert!(d.feed(b"data: tail").is_empty());
        assert_eq!(d.finish().map(|e| e.data).as_deref(), Some(&b"tail"[..]));
    }
}
