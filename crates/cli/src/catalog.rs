//! The durable catalog: every session of a store as a parent → child tree (`subagent agents`).
//!
//! Everything shown is derived from the logs: lineage from the header's `parentSession`, depth
//! from `delegationDepth`, provider and label from the child's own `subagent/descriptor`
//! event, turns and the last stop reason from the child's own `turn/start` / `turn/end` events
//! (a fork child's inherited prefix is not counted), and whether a child ran as a background job
//! from its parent's delegation call (`run_in_background: true` with the child's label as
//! `description`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use agent::{EventData, SessionEvent, SessionHeader, SessionId};
use agent_loop::JsonlStore;
use serde_json::Value;
use subagent::{DescriptorState, fold_subagent_descriptor};

use crate::error::CliError;
use crate::terminal_text::single_line_owned;

/// One stored session.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRow {
    /// The session id.
    pub id: SessionId,
    /// Its header.
    pub header: SessionHeader,
    /// The provider named by its descriptor (subagent children only).
    pub provider: Option<String>,
    /// The label named by its descriptor.
    pub label: Option<String>,
    /// The delegation depth (absent header field = 0).
    pub depth: u64,
    /// The number of turns the session ran itself.
    pub turns: u64,
    /// The kind of its last own `turn/end` reason (`completed`, `aborted`, …).
    pub last_stop: Option<String>,
    /// How many events the log holds (inherited ones included).
    pub events: usize,
    /// The background job id, when the parent started this child with `run_in_background`.
    pub background_job: Option<String>,
    /// Whether this child ran in the background (see the module docs).
    pub background: bool,
}

/// A store read as a forest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Catalog {
    /// Every readable session, ordered by creation time then id.
    pub sessions: Vec<SessionRow>,
    /// Logs that could not be read: `(id, error)`.
    pub unreadable: Vec<(SessionId, String)>,
}

impl Catalog {
    /// The row of session `id`.
    pub fn get(&self, id: &SessionId) -> Option<&SessionRow> {
        self.sessions.iter().find(|s| &s.id == id)
    }

    /// The direct children of `id`, in creation order.
    pub fn children(&self, id: &SessionId) -> Vec<&SessionRow> {
        self.sessions
            .iter()
            .filter(|s| s.header.parent_session.as_ref() == Some(id))
            .collect()
    }

    /// Sessions whose parent is not in the store (top-level sessions), in creation order.
    pub fn roots(&self) -> Vec<&SessionRow> {
        self.sessions
            .iter()
            .filter(|s| {
                s.header
                    .parent_session
                    .as_ref()
                    .is_none_or(|p| self.get(p).is_none())
            })
            .collect()
    }

    /// The tree as text: one line per session, children indented under their parent.
    ///
    /// Every session is shown exactly once. Lineage is read from logs, so it may be damaged:
    /// sessions whose parent chain never reaches a top-level session (a lineage cycle, or below
    /// one) are drawn after the forest, each unreached one starting a tree of its own marked
    /// `(lineage cycle: …)`. The drawing is iterative and indents at most
    /// [`MAX_DRAWN_LEVELS`] levels (deeper sessions line up at that level; their `depth` field
    /// still tells), so a deep or damaged lineage can neither exhaust the stack nor make the
    /// output grow faster than the number of sessions.
    pub fn render(&self) -> String {
        let index: HashMap<&SessionId, usize> = self
            .sessions
            .iter()
            .enumerate()
            .map(|(i, s)| (&s.id, i))
            .collect();
        let mut children: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut roots = Vec::new();
        for (i, session) in self.sessions.iter().enumerate() {
            match session.header.parent_session.as_ref().and_then(|p| index.get(p)) {
                Some(&parent) => children.entry(parent).or_default().push(i),
                None => roots.push(i),
            }
        }
        let mut shown = vec![false; self.sessions.len()];
        let mut out = String::new();
        for root in roots {
            self.render_tree(root, None, &children, &mut shown, &mut out);
        }
        for i in 0..self.sessions.len() {
            if !shown[i] {
                let parent = self.sessions[i]
                    .header
                    .parent_session
                    .as_ref()
                    .map(SessionId::as_str);
                let note = format!(
                    "  (lineage cycle: parent {} never leads to a top-level session)",
                    parent.unwrap_or_default()
                );
                self.render_tree(i, Some(single_line_owned(note)), &children, &mut shown, &mut out);
            }
        }
        out
    }

    /// Draws the tree under `top` (its line first, with `note` appended), skipping sessions
    /// already shown.
    fn render_tree(
        &self,
        top: usize,
        note: Option<String>,
        children: &HashMap<usize, Vec<usize>>,
        shown: &mut [bool],
        out: &mut String,
    ) {
        shown[top] = true;
        let _ = writeln!(
            out,
            "{}{}",
            row_line(&self.sessions[top]),
            note.unwrap_or_default()
        );
        // Each frame: a session's unshown children still to draw (reversed) and the prefix of
        // their lines.
        let mut stack: Vec<(Vec<usize>, String)> = vec![(self.unshown(top, children, shown), String::new())];
        loop {
            let level = stack.len();
            let Some((pending, prefix)) = stack.last_mut() else {
                break;
            };
            let Some(child) = pending.pop() else {
                stack.pop();
                continue;
            };
            let last = pending.is_empty();
            let (branch, cont) = if last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            let _ = writeln!(out, "{prefix}{branch}{}", row_line(&self.sessions[child]));
            shown[child] = true;
            let below = if level < MAX_DRAWN_LEVELS {
                format!("{prefix}{cont}")
            } else {
                prefix.clone()
            };
            let grandchildren = self.unshown(child, children, shown);
            stack.push((grandchildren, below));
        }
    }

    /// The children of session `i` not shown yet, in reverse creation order (drawn by popping).
    fn unshown(&self, i: usize, children: &HashMap<usize, Vec<usize>>, shown: &[bool]) -> Vec<usize> {
        children
            .get(&i)
            .map(|c| c.iter().rev().copied().filter(|&c| !shown[c]).collect())
            .unwrap_or_default()
    }
}

/// How many levels [`Catalog::render`] indents at most.
pub const MAX_DRAWN_LEVELS: usize = 32;

/// One catalog line: `<id>  <provider> "<label>"  depth d  turns t  <last stop>`.
///
/// Every field is read from a log (the label is a model's delegation `description`), so the
/// line is passed through [`single_line`](crate::terminal_text::single_line): control
/// characters, line breaks and bidirectional controls are shown as visible escapes.
pub fn row_line(row: &SessionRow) -> String {
    let mut line = row.id.to_string();
    match (&row.provider, &row.label) {
        (Some(p), Some(l)) => {
            let _ = write!(line, "  {p} \"{l}\"");
        }
        (Some(p), None) => {
            let _ = write!(line, "  {p}");
        }
        (None, _) if row.header.parent_session.is_none() => line.push_str("  (top-level)"),
        (None, _) => line.push_str("  (child without descriptor)"),
    }
    if row.background {
        match &row.background_job {
            Some(job) => {
                let _ = write!(line, "  background job {job}");
            }
            None => line.push_str("  background"),
        }
    }
    let _ = write!(line, "  depth {}  turns {}", row.depth, row.turns);
    match &row.last_stop {
        Some(stop) => {
            let _ = write!(line, "  last {stop}");
        }
        None => line.push_str("  never ran"),
    }
    if let Some(n) = row.header.seed_length {
        let _ = write!(line, "  (inherited {n} events)");
    }
    single_line_owned(line)
}

/// The events a session produced itself: after its inherited seed prefix.
pub fn own_events<'a>(header: &SessionHeader, events: &'a [SessionEvent]) -> &'a [SessionEvent] {
    let seed = usize::try_from(header.seed_length.unwrap_or(0)).unwrap_or(usize::MAX);
    &events[seed.min(events.len())..]
}

/// Builds a row from a loaded session (without the background marks, which need the parent).
pub fn summarize(header: SessionHeader, events: &[SessionEvent]) -> SessionRow {
    let own = own_events(&header, events);
    let (provider, label) = match fold_subagent_descriptor(own.iter()) {
        Ok(DescriptorState::Supported(d)) => (Some(d.provider().to_owned()), d.label().map(str::to_owned)),
        Ok(DescriptorState::Unsupported { version }) => (Some(format!("(descriptor v{version})")), None),
        Ok(DescriptorState::Absent) => (None, None),
        Err(e) => (Some(format!("(corrupt descriptor: {e})")), None),
    };
    let mut turns = 0;
    let mut last_stop = None;
    for event in own {
        match &event.data {
            EventData::TurnStart { .. } => turns += 1,
            EventData::TurnEnd { reason, .. } => last_stop = Some(reason.kind().to_owned()),
            _ => {}
        }
    }
    SessionRow {
        id: header.id.clone(),
        depth: header.delegation_depth.unwrap_or(0),
        header,
        provider,
        label,
        turns,
        last_stop,
        events: events.len(),
        background_job: None,
        background: false,
    }
}

/// A delegation call a parent made in the background: its description and the job id its
/// result announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackgroundCall {
    /// The call's `description` (the child's label).
    pub description: String,
    /// The job id from `started background subagent job <id>`, when the result is logged.
    pub job: Option<String>,
}

/// Every delegation call in `events` that asked for `run_in_background: true`.
pub fn background_calls(events: &[SessionEvent]) -> Vec<BackgroundCall> {
    #[cfg(test)]
    tests::SCANS.with(|scans| scans.set(scans.get() + 1));
    let mut calls: Vec<(agent::CallId, BackgroundCall)> = Vec::new();
    let mut results: HashMap<agent::CallId, String> = HashMap::new();
    for event in events {
        match &event.data {
            EventData::ToolCall {
                call_id, arguments, ..
            } => {
                let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else {
                    continue;
                };
                if args.get("run_in_background") != Some(&Value::Bool(true)) {
                    continue;
                }
                if let Some(Value::String(description)) = args.get("description") {
                    calls.push((
                        call_id.clone(),
                        BackgroundCall {
                            description: description.clone(),
                            job: None,
                        },
                    ));
                }
            }
            EventData::ToolResult { message, .. } => {
                if let agent::MessageSource::Tool { call_id, .. } = &message.source {
                    results.insert(call_id.clone(), tool_result_text(message));
                }
            }
            _ => {}
        }
    }
    calls
        .into_iter()
        .map(|(id, mut call)| {
            call.job = results.get(&id).and_then(|text| {
                text.strip_prefix("started background subagent job ")
                    .map(|j| j.trim().to_owned())
            });
            call
        })
        .collect()
}

/// The visible text of a tool-result message's result blocks.
pub fn tool_result_text(message: &agent::Message) -> String {
    message
        .content
        .iter()
        .map(|b| match b {
            agent::ContentBlock::ToolResult { content, .. } => agent::content::visible_text(content),
            other => agent::content::visible_text(std::slice::from_ref(other)),
        })
        .collect()
}

/// Reads every session of the store at `dir`.
///
/// Fails when `dir` does not exist, is not a directory or cannot be listed. Individual logs
/// that cannot be read — a damaged header included, which the store's listing skips — are
/// reported in [`Catalog::unreadable`].
pub async fn read_catalog(dir: &Path) -> Result<Catalog, CliError> {
    check_store_dir(dir)?;
    let store = JsonlStore::new(dir);
    let summaries = store.list().await.map_err(|e| CliError::Store {
        dir: dir.to_owned(),
        reason: e.to_string(),
    })?;
    let mut catalog = Catalog::default();
    // The store's listing skips a log whose header cannot be read; name those too, with the
    // error reading it gives, so a damaged log is never silently left out.
    let listed: std::collections::HashSet<SessionId> = summaries.iter().map(|s| s.id.clone()).collect();
    let (ids, unnamed) = log_ids(dir)?;
    for name in unnamed {
        catalog.unreadable.push((
            SessionId::from(name.as_str()),
            "the file name is not valid UTF-8, so it names no session".to_owned(),
        ));
    }
    for id in ids {
        if !listed.contains(&id)
            && let Err(e) = store.inspect(&id).await
        {
            catalog.unreadable.push((id, e.to_string()));
        }
    }
    let mut logs: BTreeMap<SessionId, Vec<SessionEvent>> = BTreeMap::new();
    for summary in summaries {
        match store.load(&summary.id).await {
            Ok(loaded) => {
                catalog.sessions.push(summarize(loaded.header, &loaded.events));
                logs.insert(summary.id, loaded.events);
            }
            Err(e) => catalog.unreadable.push((summary.id, e.to_string())),
        }
    }
    // Background marks: a child whose label matches one of its parent's background calls (the
    // first such call in the parent's log). Each parent's log is scanned once, into a table by
    // description, however many children it has — scanned per child, a parent with n delegations
    // made the catalog quadratic in n (every call's arguments parsed again for every child).
    // The first row of each id, as `Catalog::get` finds it.
    let mut rows: HashMap<&SessionId, &SessionRow> = HashMap::new();
    for row in &catalog.sessions {
        rows.entry(&row.id).or_insert(row);
    }
    let mut calls_by_parent: HashMap<&SessionId, HashMap<String, Option<String>>> = HashMap::new();
    let mut marks: Vec<(usize, Option<String>)> = Vec::new();
    for (i, row) in catalog.sessions.iter().enumerate() {
        let (Some(parent), Some(label)) = (&row.header.parent_session, &row.label) else {
            continue;
        };
        let Some(parent_log) = logs.get(parent) else {
            continue;
        };
        let calls = calls_by_parent.entry(parent).or_insert_with(|| {
            let own = match rows.get(parent) {
                Some(p) => own_events(&p.header, parent_log),
                None => parent_log.as_slice(),
            };
            let mut by_description = HashMap::new();
            for call in background_calls(own) {
                by_description.entry(call.description).or_insert(call.job);
            }
            by_description
        });
        if let Some(job) = calls.get(label) {
            marks.push((i, job.clone()));
        }
    }
    for (i, job) in marks {
        catalog.sessions[i].background = true;
        catalog.sessions[i].background_job = job;
    }
    Ok(catalog)
}

/// The ids of the session logs (`<id>.jsonl`) in `dir`, sorted, and (lossily decoded) the
/// names of `*.jsonl` entries whose stem is not UTF-8, which no session id can name.
fn log_ids(dir: &Path) -> Result<(Vec<SessionId>, Vec<String>), CliError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CliError::Store {
        dir: dir.to_owned(),
        reason: e.to_string(),
    })?;
    let mut ids = Vec::new();
    let mut unnamed = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| CliError::Store {
                dir: dir.to_owned(),
                reason: e.to_string(),
            })?
            .path();
        if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
            continue;
        }
        match path.file_stem().map(|s| s.to_str().ok_or(s)) {
            Some(Ok(stem)) => ids.push(SessionId::from(stem)),
            Some(Err(raw)) => unnamed.push(raw.to_string_lossy().into_owned()),
            None => {}
        }
    }
    ids.sort();
    unnamed.sort();
    Ok((ids, unnamed))
}

/// Fails unless `dir` is an existing, listable directory.
pub fn check_store_dir(dir: &Path) -> Result<(), CliError> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => match std::fs::read_dir(dir) {
            Ok(_) => Ok(()),
            Err(e) => Err(CliError::Store {
                dir: dir.to_owned(),
                reason: e.to_string(),
            }),
        },
        Ok(_) => Err(CliError::Store {
            dir: dir.to_owned(),
            reason: "not a directory".to_owned(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CliError::Store {
            dir: dir.to_owned(),
            reason: "no such directory".to_owned(),
        }),
        Err(e) => Err(CliError::Store {
            dir: dir.to_owned(),
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, parent: Option<&str>, created_at: u64) -> SessionRow {
        let header = agent::SessionMeta {
            parent_session: parent.map(SessionId::from),
            created_at: Some(created_at),
            ..agent::SessionMeta::default()
        }
        .into_header(SessionId::from(id), created_at)
        .expect("header");
        SessionRow {
            id: SessionId::from(id),
            depth: u64::from(parent.is_some()),
            header,
            provider: None,
            label: None,
            turns: 0,
            last_stop: None,
            events: 0,
            background_job: None,
            background: false,
        }
    }

    fn catalog(rows: Vec<SessionRow>) -> Catalog {
        Catalog {
            sessions: rows,
            unreadable: Vec::new(),
        }
    }

    /// Ids in drawing order, with the drawing (branches and indentation) stripped.
    fn drawn_ids(text: &str) -> Vec<String> {
        text.lines()
            .map(|l| {
                l.trim_start_matches(['│', '├', '└', '─', ' '])
                    .split("  ")
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn a_forest_is_drawn_parent_first_with_branches() {
        let c = catalog(vec![
            row("r", None, 1),
            row("a", Some("r"), 2),
            row("b", Some("r"), 3),
            row("a1", Some("a"), 4),
            row("t", None, 5),
        ]);
        let child = "(child without descriptor)  depth 1  turns 0  never ran";
        let top = "(top-level)  depth 0  turns 0  never ran";
        assert_eq!(
            c.render(),
            format!("r  {top}\n├─ a  {child}\n│  └─ a1  {child}\n└─ b  {child}\nt  {top}\n")
        );
    }

    /// Sessions on a lineage cycle (or only below one) are never reached from a top-level
    /// session; they are drawn after the forest, once each, the first of each group marked.
    #[test]
    fn a_lineage_cycle_is_drawn_once_and_marked() {
        let c = catalog(vec![
            row("t", None, 1),
            row("a", Some("b"), 2),
            row("b", Some("a"), 3),
            row("below", Some("b"), 4),
            row("self", Some("self"), 5),
        ]);
        let text = c.render();
        assert_eq!(drawn_ids(&text), ["t", "a", "b", "below", "self"], "{text}");
        let marked: Vec<&str> = text.lines().filter(|l| l.contains("(lineage cycle: ")).collect();
        assert_eq!(marked.len(), 2, "{text}");
        assert!(
            marked[0].starts_with("a  ")
                && marked[0].ends_with("(lineage cycle: parent b never leads to a top-level session)"),
            "{text}"
        );
        assert!(marked[1].starts_with("self  "), "{text}");
    }

    /// A lineage deeper than any real delegation — damaged or hostile logs — is drawn without
    /// recursion (no stack overflow) and with bounded indentation (output linear in the number
    /// of sessions).
    #[test]
    fn a_very_deep_lineage_is_drawn_with_bounded_indentation() {
        let n = 20_000;
        let rows = (0..n)
            .map(|i| {
                let parent = (i > 0).then(|| format!("s{}", i - 1));
                row(&format!("s{i}"), parent.as_deref(), i as u64 + 1)
            })
            .collect();
        let text = catalog(rows).render();
        assert_eq!(text.lines().count(), n);
        let widest = text.lines().map(|l| l.chars().count()).max().unwrap_or_default();
        assert!(widest < MAX_DRAWN_LEVELS * 3 + 80, "{widest}");
        assert!(text.lines().last().is_some_and(|l| l.contains("└─ s19999  ")));
    }

    thread_local! {
        /// How many logs [`background_calls`] scanned on this thread.
        pub(super) static SCANS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Writes session `id` (a child of `parent` when given, with a one-shot descriptor labelled
    /// `label` when given) holding `calls` background delegation calls described as given.
    async fn write_session(
        store: &JsonlStore,
        id: &str,
        parent: Option<&str>,
        label: Option<&str>,
        calls: &[&str],
    ) {
        let header = agent::SessionMeta {
            created_at: Some(1),
            parent_session: parent.map(SessionId::from),
            origin: parent.map(|_| agent::Origin::Subagent),
            delegation_depth: parent.map(|_| 1),
            ..agent::SessionMeta::default()
        }
        .into_header(SessionId::from(id), 1)
        .expect("header");
        let session = agent::Session::new(header.clone(), None).expect("session");
        if let Some(label) = label {
            let descriptor =
                subagent::descriptor::SubagentDescriptor::one_shot("spawn", Some(label.to_owned()));
            session
                .append_at(descriptor.to_event_data(), None, 2)
                .expect("descriptor");
        }
        if !calls.is_empty() {
            session
                .append_at(EventData::TurnStart { turn: 1 }, None, 2)
                .expect("turn");
            session
                .append_at(EventData::StepStart { turn: 1, step: 1 }, None, 2)
                .expect("step");
        }
        for (i, description) in calls.iter().enumerate() {
            let arguments = serde_json::json!({
                "description": description, "prompt": "p", "run_in_background": true,
            });
            let call = EventData::ToolCall {
                turn: 1,
                step: 1,
                call_id: agent::CallId::from(format!("call{i}").as_str()),
                name: "subagent".to_owned(),
                arguments: arguments.to_string(),
            };
            session.append_at(call, None, 2).expect("call");
        }
        let sid = SessionId::from(id);
        store.create(&header).expect("create");
        for event in session.events().iter() {
            store.append(&sid, event).expect("append");
        }
        store.flush(&sid).await.expect("flush");
        store.close(&sid).await.expect("close");
    }

    /// A parent's log is scanned for background calls once, however many children it has
    /// (scanned per child, a parent with n delegations made `subagent agents` quadratic in n:
    /// for 1000 background children, 5.33 G instructions instead of 82 M under callgrind);
    /// children are still marked from their parent's calls by label, and only those.
    #[tokio::test]
    async fn a_parents_background_calls_are_read_once_for_all_its_children() {
        let dir = tempfile::tempdir().expect("store dir");
        let store = JsonlStore::new(dir.path());
        write_session(&store, "p", None, None, &["a", "b", "a"]).await;
        for (id, label) in [("c1", "a"), ("c2", "b"), ("c3", "x"), ("c4", "a")] {
            write_session(&store, id, Some("p"), Some(label), &[]).await;
        }
        SCANS.with(|scans| scans.set(0));
        let catalog = read_catalog(dir.path()).await.expect("catalog");
        assert_eq!(
            SCANS.with(std::cell::Cell::get),
            1,
            "one scan of the parent's log"
        );
        let background: Vec<&str> = catalog
            .sessions
            .iter()
            .filter(|row| row.background)
            .map(|row| row.id.as_str())
            .collect();
        assert_eq!(background.len(), 3, "{background:?}");
        for id in ["c1", "c2", "c4"] {
            assert!(background.contains(&id), "{id} in {background:?}");
        }
    }
}
