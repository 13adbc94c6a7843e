//! Derived history (spec §4.6): the model-facing message list a log projects to.
//!
//! A loop-built model request's `messages` must equal [`derive_messages`] of the log at
//! dispatch time; the request-reconstruction invariant checks exactly that.

use std::sync::Arc;

use crate::event::{EventData, SessionEvent, SurfaceOp};
use crate::fold::AsEvent;
use crate::message::Message;

/// The message one event projects to, if any:
///
/// * `user/message` → its message (exact content and source);
/// * `assistant/message` with **non-empty** content → its message (empty-content records,
///   such as a usage-only step, project to nothing);
/// * `tool/result` → its user-role message carrying the tool-result block;
/// * every other type (chunks, boundaries, log-only events) → nothing.
pub fn event_message<E: AsEvent + ?Sized>(event: &E) -> Option<&Message> {
    match &event.as_event().data {
        EventData::UserMessage(message) | EventData::ToolResult { message, .. } => Some(message),
        EventData::AssistantMessage { message, .. } if !message.content.is_empty() => Some(message),
        _ => None,
    }
}

/// Projects a log's surface to the model-facing message history, in surface order.
///
/// The surface is built from the three surface types (`user/message`, `assistant/message`,
/// `tool/result`), each a node keyed by its seq:
///
/// * `surfaceOp: append` adds the node at the end. A surface event **without** surface
///   metadata (which the log validation rejects, but a hand-built log may contain) is treated
///   as an append too.
/// * `surfaceOp: replace {start, end}` replaces the current nodes from seq `start` through seq
///   `end` (inclusive, positions in the current surface) with this node, as compaction does.
///   A range that does not name current nodes in order (which the append contract rejects) is
///   treated as an append, so no content is ever dropped silently.
///
/// Each node then projects through [`event_message`]; nodes projecting to nothing are
/// skipped. Never panics. [`DerivedHistory`] computes the same projection incrementally for a
/// log that keeps growing.
pub fn derive_messages<I>(events: I) -> Vec<Message>
where
    I: IntoIterator,
    I::Item: AsEvent,
{
    // (seq, projection) per current surface node.
    let mut nodes: Vec<(u64, Option<Message>)> = Vec::new();
    for item in events {
        let event = item.as_event();
        if event.data.is_surface() {
            place(&mut nodes, event, event_message(event).cloned());
        }
    }
    nodes.into_iter().filter_map(|(_, message)| message).collect()
}

/// Places the surface node of `event` (a surface event) carrying `item` into `nodes`.
fn place<T>(nodes: &mut Vec<(u64, T)>, event: &SessionEvent, item: T) {
    let node = (event.seq, item);
    let replace = event
        .surface
        .as_ref()
        .and_then(|meta| meta.surface_op.as_ref())
        .and_then(|op| match op {
            SurfaceOp::Replace { start, end } => Some((*start, *end)),
            SurfaceOp::Append => None,
        });
    let range = replace.and_then(|(start, end)| {
        let first = nodes.iter().position(|(seq, _)| *seq == start)?;
        let last = nodes.iter().position(|(seq, _)| *seq == end)?;
        (first <= last).then_some(first..=last)
    });
    match range {
        Some(range) => {
            nodes.splice(range, [node]);
        }
        None => nodes.push(node),
    }
}

/// [`derive_messages`] kept up to date incrementally over one growing log.
///
/// [`update`](Self::update) takes the whole log each time (for example a
/// [`Session::events`](crate::Session::events) snapshot) and only visits the events it has not
/// seen; the surface nodes keep the shared events, so nothing is copied until
/// [`messages`](Self::messages) clones the projected messages. For one append-only log,
/// `messages()` after `update(log)` equals `derive_messages(log)`. A log shorter than the one
/// last seen is taken as a different log and projected from scratch.
#[derive(Clone, Debug, Default)]
pub struct DerivedHistory {
    /// (seq, event) per current surface node.
    nodes: Vec<(u64, Arc<SessionEvent>)>,
    /// How many leading events of the log were visited.
    seen: usize,
}

impl DerivedHistory {
    /// An empty projection (of an empty log).
    pub fn new() -> Self {
        Self::default()
    }

    /// Visits the events of `log` not seen yet.
    pub fn update(&mut self, log: &[Arc<SessionEvent>]) {
        if log.len() < self.seen {
            *self = Self::default();
        }
        for event in &log[self.seen..] {
            if event.data.is_surface() {
                place(&mut self.nodes, event, event.clone());
            }
        }
        self.seen = log.len();
    }

    /// The projected history, in surface order.
    pub fn messages(&self) -> Vec<Message> {
        let mut messages = Vec::with_capacity(self.nodes.len());
        messages.extend(
            self.nodes
                .iter()
                .filter_map(|(_, event)| event_message(event).cloned()),
        );
        messages
    }
}
