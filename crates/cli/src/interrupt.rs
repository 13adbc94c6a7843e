//! Ctrl-C in two stages, for commands that wind down gracefully: the first interrupt asks the
//! work to stop (it keeps running while it cancels, disposes and makes its logs durable); a
//! second one abandons it, so the program can exit at once even when the graceful path hangs.
//!
//! [`TwoStage::run`] drives the work and the interrupt source together and returns a typed
//! outcome ([`Abandoned`] on the second interrupt). The work learns of the first interrupt
//! through a [`FirstInterrupt`] handle. The source is any stream of `()`, so tests can drive it;
//! [`ctrl_c`] is the process's own Ctrl-C, [`stop_signals`] its Ctrl-C and SIGTERM.
//!
//! ```
//! # async fn demo() {
//! use subagent_cli::interrupt::{Abandoned, TwoStage};
//!
//! let (tx, rx) = futures::channel::mpsc::unbounded::<()>();
//! let stages = TwoStage::new(rx);
//! let stop = stages.first_interrupt();
//! tx.unbounded_send(()).unwrap(); // the first interrupt: the work winds down
//! let outcome = stages.run(async move { stop.arrived().await; "stopped" }, || {}).await;
//! assert_eq!(outcome, Ok("stopped"));
//! # }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo());
//! ```

use std::future::Future;
use std::pin::pin;

use futures::{Stream, StreamExt as _};
use tokio::sync::watch;

/// The work was abandoned: a second interrupt arrived before it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abandoned;

/// Tells a piece of work that the first interrupt has arrived (cheap to clone).
#[derive(Clone, Debug)]
pub struct FirstInterrupt(watch::Receiver<bool>);

impl FirstInterrupt {
    /// Resolves once the first interrupt has arrived — at once if it already has; never if none
    /// arrives.
    pub async fn arrived(&self) {
        let mut seen = self.0.clone();
        if seen.wait_for(|arrived| *arrived).await.is_err() {
            // The [`TwoStage`] is gone without a first interrupt: none will come.
            std::future::pending::<()>().await;
        }
    }

    /// Whether the first interrupt has arrived.
    pub fn has_arrived(&self) -> bool {
        *self.0.borrow()
    }
}

/// A source of interrupts and the two-stage policy over it: the first interrupt asks, the second
/// abandons.
#[derive(Debug)]
pub struct TwoStage<S> {
    source: S,
    first: watch::Sender<bool>,
}

impl<S: Stream<Item = ()> + Unpin> TwoStage<S> {
    /// Listens to `source`: each item is one interrupt; a source that ends delivers no more.
    pub fn new(source: S) -> Self {
        let (first, _) = watch::channel(false);
        Self { source, first }
    }

    /// A handle through which work learns of the first interrupt.
    pub fn first_interrupt(&self) -> FirstInterrupt {
        FirstInterrupt(self.first.subscribe())
    }

    /// Runs `work` to its end while listening for interrupts. On the first, marks every
    /// [`FirstInterrupt`] handle, then calls `on_first` (say, to tell the user that another
    /// interrupt exits at once), so a handle is marked by the time the announcement is made;
    /// the work keeps running and is expected to wind down. On the
    /// second, drops `work` unfinished and returns [`Abandoned`]. Work that is ready wins over an
    /// interrupt that arrives at the same time.
    pub async fn run<F: Future>(mut self, work: F, on_first: impl FnOnce()) -> Result<F::Output, Abandoned> {
        let mut work = pin!(work);
        let mut on_first = Some(on_first);
        let mut listening = true;
        loop {
            tokio::select! {
                biased;
                output = &mut work => return Ok(output),
                interrupt = self.source.next(), if listening => match (interrupt, on_first.take()) {
                    (None, not_yet) => {
                        listening = false;
                        on_first = not_yet;
                    }
                    (Some(()), Some(notify)) => {
                        // Mark first: whoever hears the announcement (on another thread, say)
                        // must find every handle marked already.
                        self.first.send_replace(true);
                        notify();
                    }
                    (Some(()), None) => return Err(Abandoned),
                },
            }
        }
    }
}

/// The process's Ctrl-C (SIGINT on Unix) as a stream of interrupts, from this call on. While
/// the stream lives, Ctrl-C no longer ends the process by itself; afterwards it stays caught
/// (tokio keeps its handler), so listen for as long as the program may run. Call it inside a
/// tokio runtime with signals enabled.
///
/// # Errors
/// The signal handler cannot be installed.
pub fn ctrl_c() -> std::io::Result<impl Stream<Item = ()> + Unpin> {
    #[cfg(unix)]
    let mut signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    #[cfg(windows)]
    let mut signal = tokio::signal::windows::ctrl_c()?;
    Ok(futures::stream::poll_fn(move |cx| signal.poll_recv(cx)))
}

/// The process's requests to stop as one stream of interrupts, from this call on: Ctrl-C
/// (SIGINT) and, on Unix, SIGTERM — what `kill`, `timeout`, service managers and container
/// runtimes send — so either winds the work down (and a second of either abandons it) instead
/// of SIGTERM killing the process with its turns open and its child processes (an `acp`
/// provider's agents, in process groups of their own) left running. Both stay caught as
/// [`ctrl_c`] describes. Call it inside a tokio runtime with signals enabled.
///
/// # Errors
/// A signal handler cannot be installed.
pub fn stop_signals() -> std::io::Result<impl Stream<Item = ()> + Unpin> {
    let interrupt = ctrl_c()?;
    #[cfg(unix)]
    let terminate = {
        let mut signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        futures::stream::poll_fn(move |cx| signal.poll_recv(cx))
    };
    #[cfg(not(unix))]
    let terminate = futures::stream::pending::<()>();
    Ok(futures::stream::select(interrupt, terminate))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::channel::mpsc;

    use super::*;

    /// A fake interrupt source: each `()` sent is one interrupt.
    fn source() -> (mpsc::UnboundedSender<()>, TwoStage<mpsc::UnboundedReceiver<()>>) {
        let (tx, rx) = mpsc::unbounded();
        (tx, TwoStage::new(rx))
    }

    /// Lets every other task run until none can progress (virtual time only).
    async fn settle() {
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn work_that_ends_is_its_output_without_interrupts() {
        let (_tx, stages) = source();
        let notified = AtomicUsize::new(0);
        let out = stages
            .run(async { 7 }, || {
                notified.fetch_add(1, Ordering::SeqCst);
            })
            .await;
        assert_eq!(out, Ok(7));
        assert_eq!(notified.load(Ordering::SeqCst), 0);
    }

    /// Every handle is marked before `on_first` runs, so whoever hears the announcement — on
    /// another thread, say — finds it marked. (Announced first, a listener on another worker
    /// could see the announcement and still find the handle unmarked.)
    #[tokio::test(start_paused = true)]
    async fn handles_are_marked_before_the_announcement() {
        let (tx, stages) = source();
        let stop = stages.first_interrupt();
        let marked_when_announced = Arc::new(AtomicUsize::new(0));
        let seen = marked_when_announced.clone();
        let run = tokio::spawn(stages.run(std::future::pending::<()>(), move || {
            seen.store(usize::from(stop.has_arrived()) + 1, Ordering::SeqCst);
        }));
        tx.unbounded_send(()).expect("first");
        settle().await;
        assert_eq!(
            marked_when_announced.load(Ordering::SeqCst),
            2,
            "announced, and marked by then"
        );
        tx.unbounded_send(()).expect("second");
        assert_eq!(run.await.expect("no panic"), Err(Abandoned));
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_interrupt_abandons_work_that_never_ends() {
        let (tx, stages) = source();
        let stop = stages.first_interrupt();
        let notified = Arc::new(AtomicUsize::new(0));
        let n = notified.clone();
        let run = tokio::spawn(stages.run(std::future::pending::<()>(), move || {
            n.fetch_add(1, Ordering::SeqCst);
        }));
        settle().await;
        assert!(!stop.has_arrived());

        tx.unbounded_send(()).expect("first");
        settle().await;
        assert_eq!(
            notified.load(Ordering::SeqCst),
            1,
            "the first interrupt is announced once"
        );
        assert!(stop.has_arrived());
        assert!(
            !run.is_finished(),
            "the first interrupt only asks: the work keeps running"
        );

        tx.unbounded_send(()).expect("second");
        let out = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("the second interrupt ends the wait")
            .expect("no panic");
        assert_eq!(out, Err(Abandoned));
        assert_eq!(notified.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_interrupt_reaches_the_work_which_winds_down() {
        let (tx, stages) = source();
        let stop = stages.first_interrupt();
        tx.unbounded_send(()).expect("first");
        let out = stages
            .run(
                async move {
                    stop.arrived().await;
                    // Winding down takes a while; a single interrupt lets it finish.
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    "wound down"
                },
                || {},
            )
            .await;
        assert_eq!(out, Ok("wound down"));
    }

    #[tokio::test(start_paused = true)]
    async fn two_interrupts_during_a_hung_teardown_abandon_it() {
        // No interrupt while the work ran normally; two once its teardown hangs: the first
        // only asks, the second abandons.
        let (tx, stages) = source();
        let teardown_started = Arc::new(tokio::sync::Notify::new());
        let started = teardown_started.clone();
        let run = tokio::spawn(stages.run(
            async move {
                started.notify_one();
                std::future::pending::<()>().await;
            },
            || {},
        ));
        teardown_started.notified().await;
        tx.unbounded_send(()).expect("first");
        tx.unbounded_send(()).expect("second");
        let out = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .expect("abandoned")
            .expect("no panic");
        assert_eq!(out, Err(Abandoned));
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_that_ends_leaves_the_work_alone() {
        let (tx, stages) = source();
        let stop = stages.first_interrupt();
        tx.unbounded_send(()).expect("first");
        drop(tx);
        let out = stages
            .run(
                async move {
                    stop.arrived().await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    1
                },
                || {},
            )
            .await;
        assert_eq!(out, Ok(1));
    }

    #[tokio::test(start_paused = true)]
    async fn ready_work_wins_over_a_simultaneous_second_interrupt() {
        let (tx, stages) = source();
        tx.unbounded_send(()).expect("first");
        tx.unbounded_send(()).expect("second");
        assert_eq!(stages.run(async { "done" }, || {}).await, Ok("done"));
    }

    #[tokio::test(start_paused = true)]
    async fn first_interrupt_handles_wait_forever_without_one() {
        let (_tx, stages) = source();
        let stop = stages.first_interrupt();
        drop(stages);
        let waited = tokio::time::timeout(Duration::from_secs(3600), stop.arrived()).await;
        assert!(waited.is_err(), "no interrupt, no wake-up");
    }
}
