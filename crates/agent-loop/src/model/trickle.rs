//! [`Trickle`]: a model adapter wrapper whose chunks arrive one scheduling point apart.

use std::sync::Arc;

use agent::{GenerateOptions, ModelAdapter, ModelStream};
use futures::StreamExt;

/// Wraps a [`ModelAdapter`] so that its stream yields to the tokio scheduler before every item.
///
/// Meant for tests that explore interleavings (cancellation sweeps): on a current-thread
/// runtime, every chunk then lands in a scheduler tick of its own, so another task can act
/// between any two chunks. The items, their order and the request are passed through unchanged.
///
/// Each item waits for **two** `yield_now`s: the agent loop first probes a stream for a ready
/// item with a poll whose wake-up it does not wait for, which spends one of them; the second is
/// a real trip through the scheduler. The wrapper adds no timers, so a paused clock never has
/// to advance for it.
pub struct Trickle {
    inner: Arc<dyn ModelAdapter>,
}

impl Trickle {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ModelAdapter>) -> Self {
        Self { inner }
    }
}

impl ModelAdapter for Trickle {
    fn stream(&self, request: Arc<GenerateOptions>) -> ModelStream {
        self.inner
            .stream(request)
            .then(|item| async move {
                tokio::task::yield_now().await;
                tokio::task::yield_now().await;
                item
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::ScriptedModel;
    use crate::model::chunks;

    /// The wrapped stream passes every chunk through in order, and another task gets to run
    /// between any two of them.
    #[tokio::test(start_paused = true)]
    async fn chunks_pass_through_one_tick_apart() {
        let model = ScriptedModel::new(vec![chunks::text("hello")]);
        let trickle = Trickle::new(model.adapter());
        let request = Arc::new(GenerateOptions::new("mock", "mock", vec![]));
        let ticks = Arc::new(AtomicUsize::new(0));
        let ticker = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                loop {
                    ticks.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                }
            }
        });
        let mut stream = trickle.stream(request);
        let mut seen = Vec::new();
        let mut last = ticks.load(Ordering::SeqCst);
        while let Some(item) = stream.next().await {
            let now = ticks.load(Ordering::SeqCst);
            assert!(now > last, "another task ran before chunk {}", seen.len());
            last = now;
            seen.push(item.expect("chunk"));
        }
        ticker.abort();
        assert_eq!(seen, chunks::text("hello"));
    }
}
