//! [`LineLimit`]: a bound on how long one protocol line from a peer may grow.
//!
//! ACP frames are newline-delimited JSON, and the protocol engine buffers a whole line before it
//! parses it. A peer that writes without ever ending its line — a broken or hostile child, or
//! client — would make that buffer grow until the process runs out of memory. Wrapped in a
//! `LineLimit`, such input fails the read with [`std::io::ErrorKind::InvalidData`] once a line
//! passes the limit: the connection ends as for any broken pipe, with a clear cause — the error
//! carries a typed [`LineTooLong`] (reach it with [`std::io::Error::get_ref`] and `downcast_ref`),
//! so a reader above can name the cause even where the protocol engine reports only that the
//! connection terminated.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// The longest line a peer may send by default: 64 MiB, far beyond any real frame (a frame
/// carrying a large file's content is a few megabytes) yet a bound on memory.
pub const DEFAULT_MAX_LINE: usize = 64 << 20;

/// The cause inside the [`std::io::Error`] a [`LineLimit`] fails with: a line passed `max` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the peer sent a line longer than {max} bytes")]
pub struct LineTooLong {
    /// The limit the line passed.
    pub max: usize,
}

/// An [`AsyncRead`] that fails once more than `max` bytes arrive without a newline.
///
/// Bytes pass through unchanged; the only effect is the error. Once failed, it stays failed
/// (every later read returns the same kind of error), so no reader resynchronizes in the middle
/// of an overlong line.
#[derive(Debug)]
pub struct LineLimit<R> {
    inner: R,
    max: usize,
    /// Bytes since the last newline.
    run: usize,
    failed: bool,
}

impl<R> LineLimit<R> {
    /// Wraps `inner`, allowing lines of at most `max` bytes (newline excluded).
    pub fn new(inner: R, max: usize) -> Self {
        Self {
            inner,
            max,
            run: 0,
            failed: false,
        }
    }

    fn overlong(&self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, LineTooLong { max: self.max })
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LineLimit<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.failed {
            return Poll::Ready(Err(self.overlong()));
        }
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let mut run = this.run;
                for piece in buf.filled()[before..].split_inclusive(|&b| b == b'\n') {
                    let ends_line = piece.last() == Some(&b'\n');
                    run = run.saturating_add(piece.len() - usize::from(ends_line));
                    if run > this.max {
                        this.failed = true;
                        // An erroring read hands out nothing (the `AsyncRead` contract).
                        buf.set_filled(before);
                        return Poll::Ready(Err(this.overlong()));
                    }
                    if ends_line {
                        run = 0;
                    }
                }
                this.run = run;
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// Lines up to the limit pass through unchanged, however they are split across reads.
    #[tokio::test]
    async fn lines_within_the_limit_pass_through() {
        let input: &[u8] = b"abcd\nefgh\n\nij";
        let mut limited = LineLimit::new(input, 4);
        let mut out = Vec::new();
        limited.read_to_end(&mut out).await.expect("within the limit");
        assert_eq!(out, input);
    }

    /// A line longer than the limit fails the read with `InvalidData`, whether it is the open
    /// last line or one between two newlines, and the reader stays failed.
    #[tokio::test]
    async fn an_overlong_line_fails_the_read_for_good() {
        for input in [&b"abcd\nefghi"[..], b"abcdefgh\nij\n"] {
            let mut limited = LineLimit::new(input, 4);
            let mut out = Vec::new();
            let err = limited.read_to_end(&mut out).await.expect_err("overlong");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{input:?}");
            assert!(err.to_string().contains("longer than 4 bytes"), "{err}");
            let cause = err.get_ref().and_then(|e| e.downcast_ref::<LineTooLong>());
            assert_eq!(
                cause,
                Some(&LineTooLong { max: 4 }),
                "the typed cause travels with it"
            );
            let again = limited.read(&mut [0u8; 8]).await.expect_err("still failed");
            assert_eq!(again.kind(), io::ErrorKind::InvalidData);
        }
    }

    /// A line is measured across reads: its part in one read counts with its part in the next.
    #[tokio::test]
    async fn a_line_split_across_reads_is_measured_whole() {
        let split = AsyncReadExt::chain(&b"ok\nabc"[..], &b"de\n"[..]);
        let mut limited = LineLimit::new(split, 4);
        let mut out = Vec::new();
        let err = limited.read_to_end(&mut out).await.expect_err("overlong");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let fits = AsyncReadExt::chain(&b"ok\nab"[..], &b"cd\n"[..]);
        let mut out = Vec::new();
        LineLimit::new(fits, 4).read_to_end(&mut out).await.expect("fits");
        assert_eq!(out, b"ok\nabcd\n");
    }

    /// An endless line arriving in small reads fails once its length passes the limit.
    #[tokio::test]
    async fn an_endless_line_is_cut_off_at_the_limit() {
        let (mut writer, reader) = tokio::io::duplex(8);
        let feeding = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            // Stops once the reader fails and drops its end.
            while writer.write_all(b"xxxx").await.is_ok() {}
        });
        let mut limited = LineLimit::new(reader, 1000);
        let mut sink = Vec::new();
        let err = limited.read_to_end(&mut sink).await.expect_err("cut off");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(sink.len() <= 1000 + 8, "read {} bytes", sink.len());
        drop(limited);
        feeding.await.expect("the feeder ends");
    }
}
