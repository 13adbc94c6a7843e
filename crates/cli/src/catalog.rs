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
    pub fn render(&self) -> String {
        let mut out = String::new();
        for root in self.roots() {
            let _ = writeln!(out, "{}", row_line(root));
            self.render_children(&root.id, "", &mut out);
        }
        out
    }

    fn render_children(&self, id: &SessionId, prefix: &str, out: &mut String) {
        let children = self.children(id);
        let n = children.len();
        for (i, child) in children.into_iter().enumerate() {
            let last = i + 1 == n;
            let (branch, cont) = if last {
                ("└─ ", "   ")
            } else {
                ("├─ ", "│  ")
            };
            let _ = writeln!(out, "{prefix}{branch}{}", row_line(child));
            self.render_children(&child.id, &format!("{prefix}{cont}"), out);
        }
    }
}

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
    // Background marks: a child whose label matches one of its parent's background calls.
    let mut marks: Vec<(usize, Option<String>)> = Vec::new();
    for (i, row) in catalog.sessions.iter().enumerate() {
        let (Some(parent), Some(label)) = (&row.header.parent_session, &row.label) else {
            continue;
        };
        let Some(parent_log) = logs.get(parent) else {
            continue;
        };
        let parent_row = catalog.get(parent);
        let own = match parent_row {
            Some(p) => own_events(&p.header, parent_log),
            None => parent_log.as_slice(),
        };
        if let Some(call) = background_calls(own)
            .into_iter()
            .find(|c| &c.description == label)
        {
            marks.push((i, call.job));
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
