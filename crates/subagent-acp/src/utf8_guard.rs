//! [`Utf8Guard`]: a line that is not UTF-8 is a malformed line, not a broken connection.
//!
//! ACP frames are newline-delimited JSON, which is UTF-8 text. The protocol engine answers a line
//! that is not JSON with a parse error and reads on, but it decodes each line as UTF-8 first and
//! ends the whole connection on a line that does not decode — so one stray byte from a child
//! (a library printing binary to stdout, a truncated multi-byte character) would fail the run
//! while a stray text line is shrugged off. Wrapped in a `Utf8Guard`, every byte of an invalid
//! UTF-8 sequence becomes NUL, a byte no JSON text may hold unescaped: the line decodes, fails
//! to parse, and is answered like any other malformed line while the connection goes on.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, ReadBuf};

/// How many bytes one read of the inner reader asks for.
const CHUNK: usize = 8 * 1024;

/// An [`AsyncRead`] whose output is always valid UTF-8: each byte of an invalid sequence is
/// replaced with NUL (`0x00`); every other byte passes through unchanged and in order.
///
/// A multi-byte character split across two reads is held back (at most three bytes) until its
/// rest arrives, so a split is never mistaken for an invalid sequence. A character still
/// incomplete at end of input is invalid. Read errors of the inner reader pass through.
#[derive(Debug)]
pub struct Utf8Guard<R> {
    inner: R,
    /// Checked bytes not yet handed out, from `pos` on.
    ready: Vec<u8>,
    pos: usize,
    /// The start of a character whose remaining bytes have not arrived yet.
    held: Vec<u8>,
}

impl<R> Utf8Guard<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            ready: Vec::with_capacity(CHUNK),
            pos: 0,
            held: Vec::new(),
        }
    }
}

/// Replaces each byte of every invalid sequence in `data` with NUL; an incomplete character at
/// its end is moved out into `held`.
fn sanitize(data: &mut Vec<u8>, held: &mut Vec<u8>) {
    let mut from = 0;
    while let Err(error) = std::str::from_utf8(&data[from..]) {
        let bad = from + error.valid_up_to();
        match error.error_len() {
            Some(len) => {
                data[bad..bad + len].fill(0);
                from = bad + len;
            }
            None => {
                held.extend(data.drain(bad..));
                return;
            }
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Utf8Guard<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.pos < this.ready.len() || buf.remaining() == 0 {
                let n = buf.remaining().min(this.ready.len() - this.pos);
                buf.put_slice(&this.ready[this.pos..this.pos + n]);
                this.pos += n;
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; CHUNK];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            this.ready.clear();
            this.pos = 0;
            this.ready.append(&mut this.held);
            if read.filled().is_empty() {
                // End of input: a character still incomplete is invalid.
                this.ready.fill(0);
                if this.ready.is_empty() {
                    return Poll::Ready(Ok(()));
                }
            } else {
                this.ready.extend_from_slice(read.filled());
                sanitize(&mut this.ready, &mut this.held);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    async fn guarded(input: impl AsyncRead + Unpin) -> Vec<u8> {
        let mut out = Vec::new();
        Utf8Guard::new(input)
            .read_to_end(&mut out)
            .await
            .expect("a guard never fails on content");
        out
    }

    /// Valid UTF-8, multi-byte characters included, passes through unchanged.
    #[tokio::test]
    async fn valid_text_passes_through() {
        let input = "{\"a\":\"héllo €𝄞\"}\nnext\n".as_bytes();
        assert_eq!(guarded(input).await, input);
    }

    /// Each byte of an invalid sequence becomes NUL; everything around it is kept.
    #[tokio::test]
    async fn invalid_sequences_become_nul_bytes() {
        assert_eq!(guarded(&b"a\xffb\n"[..]).await, b"a\0b\n");
        // A truncated three-byte character followed by ASCII, and a lone continuation byte.
        assert_eq!(guarded(&b"x\xe2\x82y\x80\n"[..]).await, b"x\0\0y\0\n");
        // An overlong encoding and a surrogate are invalid too.
        assert_eq!(guarded(&b"\xc0\xaf|\xed\xa0\x80\n"[..]).await, b"\0\0|\0\0\0\n");
    }

    /// A character split across reads is reassembled, not replaced; one still incomplete at end
    /// of input is replaced.
    #[tokio::test]
    async fn a_split_character_is_held_until_it_completes() {
        let euro = "€".as_bytes();
        let split = AsyncReadExt::chain(&euro[..1], AsyncReadExt::chain(&euro[1..2], &b"\xac\n"[..]));
        assert_eq!(guarded(split).await, "€\n".as_bytes());
        let cut = AsyncReadExt::chain(&b"ok\n"[..], &euro[..2]);
        assert_eq!(guarded(cut).await, b"ok\n\0\0");
    }

    /// A caller reading one byte at a time gets the same bytes.
    #[tokio::test]
    async fn tiny_reads_see_the_same_bytes() {
        let mut guard = Utf8Guard::new(&b"\xc3\xa9\xff\n"[..]);
        let mut out = Vec::new();
        let mut byte = [0u8; 1];
        while guard.read(&mut byte).await.expect("reads") == 1 {
            out.push(byte[0]);
        }
        assert_eq!(out, b"\xc3\xa9\0\n");
    }
}
