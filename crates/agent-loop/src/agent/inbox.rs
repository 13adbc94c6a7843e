//! The agent inbox (spec §8.2): two pending lists projected from durable
//! `agent/inbox/spliced` events.

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::{Mutex, ReentrantMutex};

use agent::event::SpliceOutcome;
use agent::{
    AgentError, AgentEvent, EventBus, EventData, InboxSnapshot, InboxSplice, InboxTarget, Message, MessageId,
    Session, SessionId,
};

/// Insertions up to this many messages are validated by scanning the lists.
const SCAN_LIMIT: usize = 8;

thread_local! {
    /// The inboxes this thread is delivering a notification of (keyed by address, valid while
    /// the delivery borrows the inbox), each with the notifications its listeners caused.
    static DELIVERING: RefCell<Vec<(usize, VecDeque<AgentEvent>)>> = const { RefCell::new(Vec::new()) };
}

/// Ends an inbox's delivery on its thread (even if a delivery unwinds).
struct Delivering(usize);

impl Drop for Delivering {
    fn drop(&mut self) {
        DELIVERING.with(|d| {
            let mut d = d.borrow_mut();
            if let Some(i) = d.iter().position(|(k, _)| *k == self.0) {
                d.swap_remove(i);
            }
        });
    }
}

/// The in-memory projection.
#[derive(Default)]
struct Lists {
    next_turn: Vec<Message>,
    next_step: Vec<Message>,
}

impl Lists {
    fn list(&self, target: InboxTarget) -> &Vec<Message> {
        match target {
            InboxTarget::NextTurn => &self.next_turn,
            InboxTarget::NextStep => &self.next_step,
        }
    }

    fn list_mut(&mut self, target: InboxTarget) -> &mut Vec<Message> {
        match target {
            InboxTarget::NextTurn => &mut self.next_turn,
            InboxTarget::NextStep => &mut self.next_step,
        }
    }

    /// Checks a normalised splice against the current lists: coordinates in range and no
    /// pending id twice across both lists afterwards. The reported duplicate is the first id met
    /// twice in the order kept items, inserted messages, the other list.
    ///
    /// The lists start empty and change only through validated splices, so they never hold an
    /// id twice: a pure removal (such as a claim) needs no id check, and a small insertion is
    /// checked by scanning instead of hashing every pending id.
    fn validate(&self, splice: &InboxSplice) -> Result<(), AgentError> {
        let list = self.list(splice.target);
        let start = usize::try_from(splice.start).unwrap_or(usize::MAX);
        let removed = usize::try_from(splice.removed_count.unwrap_or(0)).unwrap_or(usize::MAX);
        if start > list.len() || removed > list.len() - start {
            return Err(AgentError::Other(
                "invalid inbox splice: coordinates out of range".into(),
            ));
        }
        let inserted = &splice.inserted;
        if inserted.is_empty() {
            return Ok(());
        }
        let other = match splice.target {
            InboxTarget::NextTurn => &self.next_step,
            InboxTarget::NextStep => &self.next_turn,
        };
        let kept = || list[..start].iter().chain(&list[start + removed..]);
        if inserted.len() <= SCAN_LIMIT {
            for (i, message) in inserted.iter().enumerate() {
                if inserted[..i].iter().chain(kept()).any(|m| m.id == message.id) {
                    return Err(AgentError::DuplicateMessage(message.id.clone()));
                }
            }
            if let Some(message) = other.iter().find(|m| inserted.iter().any(|i| i.id == m.id)) {
                return Err(AgentError::DuplicateMessage(message.id.clone()));
            }
            return Ok(());
        }
        let mut ids: HashSet<&MessageId> = HashSet::new();
        for message in kept().chain(inserted).chain(other) {
            if !ids.insert(&message.id) {
                return Err(AgentError::DuplicateMessage(message.id.clone()));
            }
        }
        Ok(())
    }

    /// Applies a validated splice; returns the removed messages.
    ///
    /// A pure removal of the whole list (such as a claim) hands the list itself over instead of
    /// copying it into a fresh vector, and a pure insertion at the end (such as a send) extends
    /// the list without the general splice.
    fn apply(&mut self, splice: &InboxSplice) -> Vec<Message> {
        let start = splice.start as usize;
        let removed = splice.removed_count.unwrap_or(0) as usize;
        let list = self.list_mut(splice.target);
        if splice.inserted.is_empty() {
            if start == 0 && removed == list.len() {
                return std::mem::take(list);
            }
            return list.drain(start..start + removed).collect();
        }
        if removed == 0 && start == list.len() {
            list.extend(splice.inserted.iter().cloned());
            return Vec::new();
        }
        list.splice(start..start + removed, splice.inserted.iter().cloned())
            .collect()
    }
}

/// The inbox of one agent.
///
/// Every mutation is validated, logged as one normalised `agent/inbox/spliced` event, and only
/// then applied to the projection, so synchronous session observers see the pre-splice lists.
/// Notifications (`InboxInserted`, `InboxDiscarded`, `InboxClaimed`) are emitted after the
/// projection changed, with only the re-entrant operation lock held. A notification caused by a
/// listener of another one of the same inbox (on the delivering thread) is not emitted from
/// inside the running delivery — later listeners would see it first — but queued and emitted
/// by the outer delivery once every listener has seen its event (spec: SPN-12; as nested status
/// changes are).
///
/// # Locking
/// * `op` serialises a whole mutation (validate → append → apply). It is re-entrant so that a
///   session observer mutating the same inbox from inside the append fails cleanly (the session
///   rejects the re-entrant append) instead of deadlocking. Session observers must not mutate
///   the inbox from *another* thread while an append is being published (the reference's
///   "observers that must write should defer" rule).
/// * `lists` protects the projection; it is held only for short reads and the apply.
pub(crate) struct Inbox {
    agent: SessionId,
    session: Arc<Session>,
    events: EventBus<AgentEvent>,
    op: ReentrantMutex<()>,
    lists: Mutex<Lists>,
}

impl Inbox {
    /// Builds the projection by replaying the splices of `log` (a snapshot of the session's
    /// log) from `header.seedLength` onward (a fork child never inherits its parent's pending
    /// work).
    pub(crate) fn new(
        session: Arc<Session>,
        log: &[Arc<agent::SessionEvent>],
        events: EventBus<AgentEvent>,
    ) -> Result<Self, AgentError> {
        let mut lists = Lists::default();
        let from = session.header().seed_length.unwrap_or(0) as usize;
        for event in log.iter().skip(from) {
            if let EventData::InboxSpliced(splice) = &event.data {
                lists.validate(splice).map_err(|e| {
                    AgentError::Other(
                        format!("invalid persisted inbox splice at session seq {}: {e}", event.seq).into(),
                    )
                })?;
                lists.apply(splice);
            }
        }
        Ok(Self {
            agent: session.id().clone(),
            session,
            events,
            op: ReentrantMutex::new(()),
            lists: Mutex::new(lists),
        })
    }

    /// Holds the operation lock: no other thread mutates the inbox until the guard drops (this
    /// thread may, re-entrantly). The agent holds it across `send`'s phase read and append and
    /// across `cancel`'s clear and abort decision, so the two never interleave (spec: SPN-16).
    pub(crate) fn exclusive(&self) -> parking_lot::ReentrantMutexGuard<'_, ()> {
        self.op.lock()
    }

    /// A copy of both lists.
    pub(crate) fn snapshot(&self) -> InboxSnapshot {
        let lists = self.lists.lock();
        InboxSnapshot {
            next_turn: lists.next_turn.clone(),
            next_step: lists.next_step.clone(),
        }
    }

    /// Whether either list holds work.
    pub(crate) fn has_pending(&self) -> bool {
        let lists = self.lists.lock();
        !lists.next_turn.is_empty() || !lists.next_step.is_empty()
    }

    /// Whether `next-turn` holds a queued prompt.
    pub(crate) fn has_queued_prompt(&self) -> bool {
        !self.lists.lock().next_turn.is_empty()
    }

    /// Whether `next-step` is empty.
    pub(crate) fn next_step_is_empty(&self) -> bool {
        self.lists.lock().next_step.is_empty()
    }

    /// Appends `message` to `target` (durable insert).
    pub(crate) fn append(&self, target: InboxTarget, message: Message) -> Result<(), AgentError> {
        let _op = self.op.lock();
        // At the end of the list (`mutate` clamps the start to the list's length).
        self.mutate(target, usize::MAX, 0, vec![message], false).map(drop)
    }

    /// Durably cancels all pending work: `next-step` first, then `next-turn`. An empty clear logs
    /// nothing. Returns the cancelled messages.
    ///
    /// It cancels exactly the messages pending when it is called. The discard listeners of the
    /// `next-step` splice run (on this thread) before the `next-turn` one and may edit the
    /// lists: what they send stays pending, what they remove is gone already, and the
    /// `next-turn` messages of the call that are still pending are cancelled — one splice per
    /// contiguous run of them (one in the common case). (Cancelling the `next-turn` list's first
    /// *n* entries instead, n counted at the call, dropped a listener's send whenever it had
    /// also removed a queued prompt, and kept it otherwise.)
    pub(crate) fn clear(&self) -> Result<Vec<Message>, AgentError> {
        let _op = self.op.lock();
        let (steps, mut turns) = {
            let lists = self.lists.lock();
            if lists.next_step.is_empty() && lists.next_turn.is_empty() {
                // Nothing pending: nothing to log or cancel.
                return Ok(Vec::new());
            }
            let turns: Vec<MessageId> = lists.next_turn.iter().map(|m| m.id.clone()).collect();
            (lists.next_step.len(), turns)
        };
        let mut removed = self.mutate(InboxTarget::NextStep, 0, steps, Vec::new(), true)?;
        // Each pass cancels at least one id of `turns` and forgets it, so this ends even if a
        // listener re-sends a message it saw cancelled (that send stays pending).
        while let Some((start, len)) = self.pending_run(&turns) {
            let cancelled = self.mutate(InboxTarget::NextTurn, start, len, Vec::new(), true)?;
            if cancelled.is_empty() {
                break;
            }
            turns.retain(|id| !cancelled.iter().any(|m| &m.id == id));
            if removed.is_empty() {
                removed = cancelled;
            } else {
                removed.extend(cancelled);
            }
        }
        Ok(removed)
    }

    /// The first contiguous run of `ids` in the `next-turn` list, as `(start, len)`.
    fn pending_run(&self, ids: &[MessageId]) -> Option<(usize, usize)> {
        if ids.is_empty() {
            return None;
        }
        let lists = self.lists.lock();
        let listed = |m: &Message| ids.contains(&m.id);
        let start = lists.next_turn.iter().position(listed)?;
        let len = lists
            .next_turn
            .iter()
            .skip(start)
            .take_while(|m| listed(m))
            .count();
        Some((start, len))
    }

    /// Removes a pending message from either list as a durable cancellation.
    pub(crate) fn remove(&self, id: &MessageId) -> Result<bool, AgentError> {
        let _op = self.op.lock();
        let Some((target, index)) = self.locate(id) else {
            return Ok(false);
        };
        self.mutate(target, index, 1, Vec::new(), true)?;
        Ok(true)
    }

    /// Replaces a pending message in place (a durable cancellation that inserts the
    /// replacement).
    pub(crate) fn replace(&self, id: &MessageId, message: Message) -> Result<bool, AgentError> {
        let _op = self.op.lock();
        let Some((target, index)) = self.locate(id) else {
            return Ok(false);
        };
        self.mutate(target, index, 1, vec![message], true)?;
        Ok(true)
    }

    /// Claims the batch for one step: every `next-step` item plus, for `next-turn`, the first
    /// queued prompt, as pure-deletion splices; then one `InboxClaimed` per message.
    ///
    /// If the `next-turn` splice fails to log, the `next-step` items the first splice already
    /// removed are still notified as claimed (the log says they were) before the error returns.
    pub(crate) fn claim(&self, target: InboxTarget, turn: u64) -> Result<Vec<Message>, AgentError> {
        let (claimed, failed) = {
            let _op = self.op.lock();
            let steps = self.lists.lock().next_step.len();
            // (An empty `next-step` list has nothing to claim: no splice.)
            let mut claimed = if steps == 0 {
                Vec::new()
            } else {
                self.mutate(InboxTarget::NextStep, 0, steps, Vec::new(), false)?
            };
            let mut failed = None;
            if target == InboxTarget::NextTurn {
                match self.mutate(InboxTarget::NextTurn, 0, 1, Vec::new(), false) {
                    Ok(prompt) if claimed.is_empty() => claimed = prompt,
                    Ok(prompt) => claimed.extend(prompt),
                    Err(err) => failed = Some(err),
                }
            }
            (claimed, failed)
        };
        for message in &claimed {
            self.notify(|| AgentEvent::InboxClaimed {
                agent: self.agent.clone(),
                message: message.id.clone(),
                turn,
            });
        }
        match failed {
            Some(err) => Err(err),
            None => Ok(claimed),
        }
    }

    /// Emits `event`, or, from inside a delivery of this inbox's notifications on this thread,
    /// queues it for that delivery to emit once its event reached every listener.
    ///
    /// The event is built (`event()`) only when it is emitted or queued: with no listener on the
    /// bus and no delivery of this inbox running on this thread (which would emit it later, to
    /// the listeners registered by then), nobody hears it and nothing is built.
    fn notify(&self, event: impl FnOnce() -> AgentEvent) {
        let key = std::ptr::from_ref(self) as usize;
        let silent = !self.events.has_listeners();
        let Some(event) = DELIVERING.with(|d| {
            let mut d = d.borrow_mut();
            match d.iter_mut().find(|(k, _)| *k == key) {
                Some((_, queued)) => {
                    queued.push_back(event());
                    None
                }
                None if silent => None,
                None => {
                    d.push((key, VecDeque::new()));
                    Some(event())
                }
            }
        }) else {
            return;
        };
        let _delivering = Delivering(key);
        self.events.emit(&event);
        while let Some(next) = DELIVERING.with(|d| {
            d.borrow_mut()
                .iter_mut()
                .find(|(k, _)| *k == key)
                .and_then(|(_, queued)| queued.pop_front())
        }) {
            self.events.emit(&next);
        }
    }

    fn locate(&self, id: &MessageId) -> Option<(InboxTarget, usize)> {
        let lists = self.lists.lock();
        [InboxTarget::NextTurn, InboxTarget::NextStep]
            .into_iter()
            .find_map(|t| lists.list(t).iter().position(|m| &m.id == id).map(|i| (t, i)))
    }

    /// One normalised mutation; the caller holds `op`. Returns the removed messages.
    fn mutate(
        &self,
        target: InboxTarget,
        start: usize,
        delete: usize,
        inserted: Vec<Message>,
        cancel: bool,
    ) -> Result<Vec<Message>, AgentError> {
        let splice = {
            let lists = self.lists.lock();
            let len = lists.list(target).len();
            let start = start.min(len);
            let delete = delete.min(len - start);
            if delete == 0 && inserted.is_empty() {
                return Ok(Vec::new());
            }
            let splice = InboxSplice {
                target,
                start: start as u64,
                removed_count: (delete > 0).then_some(delete as u64),
                inserted,
                outcome: (cancel && delete > 0).then_some(SpliceOutcome::Canceled),
            };
            lists.validate(&splice)?;
            splice
        };
        // The logged event keeps the splice; the projection copies the inserted messages
        // from it.
        let event = self.session.append(EventData::InboxSpliced(splice), None)?;
        let EventData::InboxSpliced(splice) = &event.data else {
            unreachable!("the appended event is the splice")
        };
        let removed = self.lists.lock().apply(splice);
        if cancel && !removed.is_empty() {
            self.notify(|| AgentEvent::InboxDiscarded {
                agent: self.agent.clone(),
                messages: removed.iter().map(|m| m.id.clone()).collect(),
            });
        }
        for message in &splice.inserted {
            self.notify(|| AgentEvent::InboxInserted {
                agent: self.agent.clone(),
                message: message.id.clone(),
            });
        }
        Ok(removed)
    }
}
