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
///   Session appends and seeds refuse a range that does not name current nodes in order
///   ([`Session::append`](crate::Session::append), [`validate_log`](crate::session::validate_log));
///   in a hand-built log such a range is treated as an append, so no content is ever dropped
///   silently.
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

/// The `(start, end)` of a `surfaceOp: replace`, if `event` carries one.
pub(crate) fn replace_op(surface: Option<&crate::event::SurfaceMeta>) -> Option<(u64, u64)> {
    match surface?.surface_op.as_ref()? {
        SurfaceOp::Replace { start, end } => Some((*start, *end)),
        SurfaceOp::Append => None,
    }
}

/// The positions in `nodes` (current surface nodes, keyed by seq) that a replacement of seqs
/// `start` through `end` covers: both must be current nodes, `start` not after `end`.
fn replace_span<T>(nodes: &[(u64, T)], (start, end): (u64, u64)) -> Option<std::ops::RangeInclusive<usize>> {
    let first = nodes.iter().position(|(seq, _)| *seq == start)?;
    let last = nodes[first..].iter().position(|(seq, _)| *seq == end)?;
    Some(first..=first + last)
}

/// Places the surface node of `event` (a surface event) carrying `item` into `nodes`.
fn place<T>(nodes: &mut Vec<(u64, T)>, event: &SessionEvent, item: T) {
    let node = (event.seq, item);
    match replace_op(event.surface.as_ref()).and_then(|range| replace_span(nodes, range)) {
        Some(span) => {
            nodes.splice(span, [node]);
        }
        None => nodes.push(node),
    }
}

/// The current surface nodes of a log being validated, event by event: what the append
/// contract checks a `surfaceOp: replace {start, end}` against.
#[derive(Debug, Default)]
pub(crate) struct SurfaceNodes(Vec<(u64, ())>);

impl SurfaceNodes {
    /// The surface nodes of `events` (a valid log, in order).
    pub(crate) fn of<'a>(events: impl IntoIterator<Item = &'a Arc<SessionEvent>>) -> Self {
        let mut nodes = Self::default();
        for event in events {
            if event.data.is_surface() {
                place(&mut nodes.0, event, ());
            }
        }
        nodes
    }

    /// Checks the replacement of seqs `start` through `end` by `data`: the range names current
    /// surface nodes in surface order, and a `tool/result` replacement rewrites exactly one
    /// current `tool/result`, changing only its result's content. `event_at` looks an earlier
    /// event up by seq.
    pub(crate) fn check_replace<'a>(
        &self,
        (start, end): (u64, u64),
        data: &EventData,
        event_at: impl Fn(u64) -> Option<&'a SessionEvent>,
    ) -> Result<(), String> {
        let Some(span) = replace_span(&self.0, (start, end)) else {
            return Err(format!(
                "surfaceOp replace {{start: {start}, end: {end}}} must name current surface nodes, start not after end"
            ));
        };
        if !matches!(data, EventData::ToolResult { .. }) {
            return Ok(());
        }
        if span.start() != span.end() {
            return Err("a tool/result surface replacement must rewrite exactly one current node".to_owned());
        }
        match event_at(start).map(|e| &e.data) {
            Some(original @ EventData::ToolResult { .. }) if same_but_content(original, data) => Ok(()),
            Some(EventData::ToolResult { .. }) => {
                Err("a tool/result surface replacement may change only the result's content".to_owned())
            }
            _ => Err("a tool/result surface replacement must target a current tool/result".to_owned()),
        }
    }

    /// Places `event` (a surface event whose replacement, if any, was checked).
    pub(crate) fn place(&mut self, event: &SessionEvent) {
        place(&mut self.0, event, ());
    }
}

/// Whether two `tool/result` payloads agree in everything but the content of the result block
/// (the message's first block).
fn same_but_content(a: &EventData, b: &EventData) -> bool {
    let (
        EventData::ToolResult {
            turn,
            step,
            message,
            error,
            meta,
        },
        EventData::ToolResult {
            turn: turn_b,
            step: step_b,
            message: message_b,
            error: error_b,
            meta: meta_b,
        },
    ) = (a, b)
    else {
        return false;
    };
    let result_key = |m: &Message| match m.content.first() {
        Some(crate::ContentBlock::ToolResult {
            tool_call_id,
            is_error,
            ..
        }) => Ok((tool_call_id.clone(), *is_error)),
        other => Err(other.cloned()),
    };
    turn == turn_b
        && step == step_b
        && error == error_b
        && meta == meta_b
        && message.id == message_b.id
        && message.role == message_b.role
        && message.source == message_b.source
        && result_key(message) == result_key(message_b)
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
                if self.nodes.capacity() == 0 {
                    // The first node: allocated at the size growth would start with, directly
                    // (growing a list without a buffer takes the slower reserving path).
                    self.nodes = Vec::with_capacity(4);
                }
                place(&mut self.nodes, event, event.clone());
            }
        }
        self.seen = log.len();
    }

    /// The projected history, in surface order (the messages cloned).
    pub fn messages(&self) -> Vec<Message> {
        self.message_list().to_vec()
    }

    /// The projected history, in surface order, sharing the log's events: no message is
    /// copied (what a loop-built request carries).
    pub fn message_list(&self) -> MessageList {
        // Counted first, so that the shared list is allocated once, at its size: a filtered
        // iterator collected into an `Arc<[_]>` is collected into a `Vec` and then copied.
        let held = |node: &&(u64, Arc<SessionEvent>)| event_message(&node.1).is_some();
        let len = self.nodes.iter().filter(held).count();
        let mut events = self.nodes.iter().filter(held).map(|(_, event)| event.clone());
        // A mapped range has a trusted length: collected straight into the shared slice.
        MessageList(Repr::Log(
            (0..len)
                .map(|_| events.next().expect("as many held events as counted"))
                .collect(),
        ))
    }
}

impl Drop for DerivedHistory {
    /// The events it holds go back to the thread's pool of event allocations when it holds the
    /// last reference (its session dropped first), as the session's own events do.
    fn drop(&mut self) {
        crate::session::recycle_events(self.nodes.drain(..).map(|(_, event)| event));
    }
}

/// The conversation of a model request: an immutable list of [`Message`]s.
///
/// A list built from a log ([`DerivedHistory::message_list`]) shares the log's events instead
/// of copying their messages, so cloning or building one never copies a message; one built
/// from a `Vec<Message>` (`From`, `collect`) owns its messages. Either way it reads as a slice:
/// [`len`](Self::len), indexing, [`iter`](Self::iter) (double-ended, exact-size), and it
/// compares equal to another list, a `Vec<Message>` or a `[Message]` with the same messages in
/// the same order.
#[derive(Clone)]
pub struct MessageList(Repr);

#[derive(Clone)]
enum Repr {
    Owned(Arc<[Message]>),
    /// Events each of which projects to a message ([`event_message`] is `Some`).
    Log(Arc<[Arc<SessionEvent>]>),
}

/// The message of an event a [`MessageList`] holds (checked when the list was built).
fn held_message(event: &Arc<SessionEvent>) -> &Message {
    event_message(event).expect("a message list holds only events that project to a message")
}

impl MessageList {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// The number of messages.
    pub fn len(&self) -> usize {
        match &self.0 {
            Repr::Owned(messages) => messages.len(),
            Repr::Log(events) => events.len(),
        }
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The message at `index`, if any.
    pub fn get(&self, index: usize) -> Option<&Message> {
        match &self.0 {
            Repr::Owned(messages) => messages.get(index),
            Repr::Log(events) => events.get(index).map(held_message),
        }
    }

    /// The first message, if any.
    pub fn first(&self) -> Option<&Message> {
        self.get(0)
    }

    /// The last message, if any.
    pub fn last(&self) -> Option<&Message> {
        self.len().checked_sub(1).and_then(|last| self.get(last))
    }

    /// The messages in order.
    pub fn iter(&self) -> MessageIter<'_> {
        MessageIter(match &self.0 {
            Repr::Owned(messages) => IterRepr::Owned(messages.iter()),
            Repr::Log(events) => IterRepr::Log(events.iter()),
        })
    }

    /// Whether `a` and `b` share one allocation (as clones of one list do), like
    /// [`Arc::ptr_eq`]; two lists with equal messages built separately do not.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        match (&a.0, &b.0) {
            (Repr::Owned(a), Repr::Owned(b)) => Arc::ptr_eq(a, b),
            (Repr::Log(a), Repr::Log(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The messages, cloned into a vector.
    pub fn to_vec(&self) -> Vec<Message> {
        self.iter().cloned().collect()
    }
}

impl Default for MessageList {
    fn default() -> Self {
        Self(Repr::Owned(Arc::new([])))
    }
}

impl std::fmt::Debug for MessageList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl From<Vec<Message>> for MessageList {
    fn from(messages: Vec<Message>) -> Self {
        Self(Repr::Owned(messages.into()))
    }
}

impl FromIterator<Message> for MessageList {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        Self(Repr::Owned(iter.into_iter().collect()))
    }
}

impl std::ops::Index<usize> for MessageList {
    type Output = Message;

    /// # Panics
    /// When `index` is out of bounds, as a slice does.
    fn index(&self, index: usize) -> &Message {
        match &self.0 {
            Repr::Owned(messages) => &messages[index],
            Repr::Log(events) => held_message(&events[index]),
        }
    }
}

impl<'a> IntoIterator for &'a MessageList {
    type Item = &'a Message;
    type IntoIter = MessageIter<'a>;

    fn into_iter(self) -> MessageIter<'a> {
        self.iter()
    }
}

impl PartialEq for MessageList {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<[Message]> for MessageList {
    fn eq(&self, other: &[Message]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<Vec<Message>> for MessageList {
    fn eq(&self, other: &Vec<Message>) -> bool {
        *self == **other
    }
}

/// The iterator of [`MessageList::iter`].
#[derive(Clone, Debug)]
pub struct MessageIter<'a>(IterRepr<'a>);

#[derive(Clone, Debug)]
enum IterRepr<'a> {
    Owned(std::slice::Iter<'a, Message>),
    Log(std::slice::Iter<'a, Arc<SessionEvent>>),
}

impl<'a> Iterator for MessageIter<'a> {
    type Item = &'a Message;

    fn next(&mut self) -> Option<&'a Message> {
        match &mut self.0 {
            IterRepr::Owned(messages) => messages.next(),
            IterRepr::Log(events) => events.next().map(held_message),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let len = self.len();
        (len, Some(len))
    }
}

impl DoubleEndedIterator for MessageIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match &mut self.0 {
            IterRepr::Owned(messages) => messages.next_back(),
            IterRepr::Log(events) => events.next_back().map(held_message),
        }
    }
}

impl ExactSizeIterator for MessageIter<'_> {
    fn len(&self) -> usize {
        match &self.0 {
            IterRepr::Owned(messages) => messages.len(),
            IterRepr::Log(events) => events.len(),
        }
    }
}
