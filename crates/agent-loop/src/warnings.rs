//! [`WarningCapture`]: the `tracing` warnings emitted on one thread, recorded for tests.
//!
//! The runtime and the seam report what they contain — a panicking hook, a notice that could
//! not be delivered, a failed flush — as `tracing` warnings rather than errors. Tests assert
//! those reports (or their absence) by installing a capture as the thread's default subscriber
//! for the duration of the test.

use std::fmt::Write as _;
use std::sync::Arc;

use parking_lot::Mutex;

/// Records the WARN-level `tracing` events emitted on the current thread while installed.
///
/// Cheap to clone: clones share one record. [`install`](Self::install) makes it the thread's
/// default subscriber until the returned guard is dropped; events from other threads (a
/// multi-threaded runtime's workers) are not seen. Spans are ignored; every event field is
/// recorded.
#[derive(Clone, Debug, Default)]
pub struct WarningCapture {
    events: Arc<Mutex<Vec<CapturedWarning>>>,
}

/// One recorded warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedWarning {
    /// The event's message (its `message` field, as formatted by `tracing`).
    pub message: String,
    /// Every other field, as ` name=value` pairs in emission order (values `Debug`-formatted).
    pub fields: String,
}

impl CapturedWarning {
    /// Whether the message or any field contains `needle`.
    pub fn mentions(&self, needle: &str) -> bool {
        self.message.contains(needle) || self.fields.contains(needle)
    }
}

impl WarningCapture {
    /// An empty capture.
    pub fn new() -> Self {
        Self::default()
    }

    /// Installs the capture as this thread's default subscriber until the guard is dropped.
    #[must_use = "the capture stops when the guard is dropped"]
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        tracing::subscriber::set_default(self.clone())
    }

    /// Every warning recorded so far, in order.
    pub fn warnings(&self) -> Vec<CapturedWarning> {
        self.events.lock().clone()
    }

    /// The messages of every warning recorded so far, in order.
    pub fn messages(&self) -> Vec<String> {
        self.events.lock().iter().map(|w| w.message.clone()).collect()
    }

    /// How many warnings were recorded.
    pub fn len(&self) -> usize {
        self.events.lock().len()
    }

    /// Whether none was recorded.
    pub fn is_empty(&self) -> bool {
        self.events.lock().is_empty()
    }

    /// How many recorded warnings mention `needle` (in the message or a field).
    pub fn mentioning(&self, needle: &str) -> usize {
        self.events.lock().iter().filter(|w| w.mentions(needle)).count()
    }
}

struct Fields<'a>(&'a mut CapturedWarning);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.message = format!("{value:?}");
        } else {
            let _ = write!(self.0.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0.message = value.to_owned();
        } else {
            let _ = write!(self.0.fields, " {}={value:?}", field.name());
        }
    }
}

impl tracing::Subscriber for WarningCapture {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        let _ = metadata;
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut warning = CapturedWarning {
                message: String::new(),
                fields: String::new(),
            };
            event.record(&mut Fields(&mut warning));
            self.events.lock().push(warning);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_this_threads_warnings_with_their_fields_only() {
        let capture = WarningCapture::new();
        {
            let _guard = capture.install();
            tracing::info!("not a warning");
            tracing::warn!(job = %"j-1", "cancel panicked");
            tracing::error!("an error is not a warning");
            std::thread::spawn(|| tracing::warn!("another thread"))
                .join()
                .unwrap();
        }
        tracing::warn!("after the guard");
        assert_eq!(capture.messages(), ["cancel panicked"]);
        assert_eq!(capture.warnings()[0].fields, " job=j-1");
        assert_eq!(capture.mentioning("j-1"), 1);
        assert_eq!(capture.len(), 1);
    }
}
