//! Listing subagent children (spec §2.18): [`list_children`] and [`list_descendants`].
//!
//! Both read only the live session store, optional durable persistence, the projection registry
//! and an optional [`ProjectionCache`]. They never load an Agent, never resume anything and never
//! consult the continuation manager or providers. A live child is identified from its live
//! projection snapshot (zero log reads); a cold child costs zero log reads when the cache holds a
//! final identity for it (the cache rung), otherwise exactly one full log read per listing.

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use agent::projection::ProjectionRegistry;
use agent::{Origin, Session, SessionHeader, SessionId, SessionPersistence, SessionStore, Signal};
use futures::{FutureExt, StreamExt, TryStreamExt};
use serde_json::{Map, Value};

use crate::error::SubagentError;
use crate::projection::IDENTITY_PROJECTION;

/// How many cold children are read concurrently.
const COLD_CONCURRENCY: usize = 4;

/// The services a listing reads. Absent services produce the §2.18 preparation errors
/// (registry, store), a live-only listing (persistence), or one log read per cold child (cache).
#[derive(Clone, Default)]
pub struct ListingServices {
    /// The projection registry (required), with the seam's units registered
    /// ([`register_projections`](crate::projection::register_projections)): a registry without
    /// the `subagent` identity unit is refused like an absent one.
    pub projections: Option<ProjectionRegistry>,
    /// The live session store (required).
    pub store: Option<Arc<dyn SessionStore>>,
    /// Durable persistence (optional).
    pub persistence: Option<Arc<dyn SessionPersistence>>,
    /// The host's projection cache (optional): the cache rung for cold children.
    pub cache: Option<Arc<dyn ProjectionCache>>,
}

/// One projection-cache row (spec §0 "Projection cache"): the projection values a host folded
/// for a persisted session, as of one seq.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedSnapshot {
    /// The seq of the last event the values were folded through.
    pub as_of_seq: u64,
    /// The projection views by unit name (the seam reads only [`IDENTITY_PROJECTION`]).
    pub values: Map<String, Value>,
}

/// A host's projection cache (spec §0, optional): projection values folded earlier for a
/// persisted session, read without reading its log.
///
/// # Contract
/// * Listing reads it once per cold candidate, before any log read (the §2.18 cache rung), with
///   the header the persisted listing enumerated. A row is *final* — the candidate is listed
///   `inactive` from it with no log read — only when its `subagent` view is an identity (not
///   the `null` sentinel) whose `seq` is at least the header's `seedLength` (an identity from
///   the child's own suffix, not an ancestor's from a fork seed). Anything else — no row, no
///   `subagent` key, `null`, an ancestor's identity, a failed read (`Err`) or a panicking one —
///   falls through, silently, to the one log read.
/// * The read is raced against the listing's token; an abort during it fails the listing with
///   `CANCELLED`.
/// * The cache is trusted to be about the enumerated session: it is the host's job to drop or
///   rewrite a row when a session id is re-published.
#[async_trait::async_trait]
pub trait ProjectionCache: Send + Sync {
    /// The cached row for the session `header` enumerates, or `None` when there is none.
    async fn cached_snapshot(
        &self,
        header: &SessionHeader,
    ) -> Result<Option<CachedSnapshot>, agent::BoxError>;
}

/// Whether a listed child is live in the session store. Encodes neither outcome nor
/// resumability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    /// Live in the session store.
    Running,
    /// Only persisted.
    Inactive,
}

/// Why a candidate is listed as a diagnostic row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiagnosticReason {
    /// Its log (or a projection over it) is unusable, or its identity is missing.
    Corrupt,
    /// Kept for consumers; never produced.
    Unsupported,
    /// Its log could not be read this time (transient, never memoized).
    Unavailable,
}

/// One listing row, in candidate order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubagentListEntry {
    /// A child with an identity.
    Child {
        /// The child session id.
        id: SessionId,
        /// Live or not.
        activity: Activity,
        /// Whether some `origin: subagent` record names this child as parent.
        has_children: bool,
        /// `one-shot` or `continuable`.
        mode: &'static str,
        /// The descriptor's label (always present for continuables).
        label: Option<String>,
    },
    /// A candidate whose identity could not be served.
    Diagnostic {
        /// The child session id.
        id: SessionId,
        /// Why.
        reason: DiagnosticReason,
    },
}

impl Activity {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Inactive => "inactive",
        }
    }
}

impl DiagnosticReason {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Corrupt => "corrupt",
            Self::Unsupported => "unsupported",
            Self::Unavailable => "unavailable",
        }
    }
}

impl SubagentListEntry {
    /// The wire shape: `{kind: 'child', id, activity, hasChildren, mode, label?}` (never a
    /// `seq`; the `label` key only when the descriptor had one) or `{kind: 'diagnostic', id,
    /// reason}`.
    pub fn view(&self) -> Value {
        match self {
            Self::Child {
                id,
                activity,
                has_children,
                mode,
                label,
            } => {
                let mut v = serde_json::json!({"kind": "child", "id": id.as_str(), "activity": activity.as_str(),
                    "hasChildren": has_children, "mode": mode});
                if let Some(label) = label {
                    v["label"] = Value::String(label.clone());
                }
                v
            }
            Self::Diagnostic { id, reason } => {
                serde_json::json!({"kind": "diagnostic", "id": id.as_str(), "reason": reason.as_str()})
            }
        }
    }

    /// The row's session id.
    pub fn id(&self) -> &SessionId {
        match self {
            Self::Child { id, .. } | Self::Diagnostic { id, .. } => id,
        }
    }
}

/// A [`list_descendants`] row: the entry plus its position in the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DescendantEntry {
    /// The row.
    pub entry: SubagentListEntry,
    /// The enumerated header's parent session.
    pub parent_id: SessionId,
    /// Edges from the root (direct children are 1).
    pub depth: usize,
}

/// A listing failure: a refused or cancelled listing (stable [`SubagentError`] codes), or the
/// persisted listing's own backend error, propagated unchanged.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    /// `SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE`, `SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE`
    /// or `CANCELLED`.
    #[error(transparent)]
    Subagent(#[from] SubagentError),
    /// The persisted listing failed (token not aborted): the backend error, unchanged.
    #[error(transparent)]
    Persistence(#[from] agent::AgentError),
}

impl DescendantEntry {
    /// The wire shape: the entry's view plus `parentId` and `depth`.
    pub fn view(&self) -> Value {
        let mut v = self.entry.view();
        v["parentId"] = Value::String(self.parent_id.as_str().to_owned());
        v["depth"] = Value::from(self.depth);
        v
    }
}

/// One corpus record: a live session (wins its id wholesale) or a persisted header.
#[derive(Clone)]
enum Record {
    Live(Arc<Session>),
    Cold(SessionHeader),
}

impl Record {
    fn header(&self) -> &SessionHeader {
        match self {
            Self::Live(s) => s.header(),
            Self::Cold(h) => h,
        }
    }
}

struct Corpus {
    records: HashMap<SessionId, Record>,
    with_subagent_children: HashSet<SessionId>,
}

fn is_subagent(h: &SessionHeader) -> bool {
    h.origin == Some(Origin::Subagent)
}

fn sort_siblings(records: &mut [&Record]) {
    records.sort_by(|a, b| {
        let (a, b) = (a.header(), b.header());
        a.created_at
            .cmp(&b.created_at)
            .then_with(|| a.id.as_str().cmp(b.id.as_str()))
    });
}

fn check(signal: &Signal) -> Result<(), SubagentError> {
    if signal.is_cancelled() {
        Err(SubagentError::listing_cancelled())
    } else {
        Ok(())
    }
}

/// Whether `registry` carries the seam's identity unit ([`IDENTITY_PROJECTION`]). Every row is
/// read from that unit: without it (the units were never registered, or were unregistered with
/// the service) no child could be identified, and a listing would misreport every settled child
/// as `corrupt` and hide every live one. Such a registry counts as unavailable.
fn has_identity_unit(registry: &ProjectionRegistry) -> bool {
    registry.names().iter().any(|name| name == IDENTITY_PROJECTION)
}

/// §2.18 preparation: service checks, the persisted listing and the merged corpus.
async fn prepare(
    services: &ListingServices,
    signal: &Signal,
) -> Result<(ProjectionRegistry, Corpus), ListingError> {
    let registry = services
        .projections
        .clone()
        .filter(has_identity_unit)
        .ok_or_else(SubagentError::projections_unavailable)?;
    let store = services
        .store
        .clone()
        .ok_or_else(SubagentError::session_store_unavailable)?;
    check(signal)?;
    let mut records: HashMap<SessionId, Record> = HashMap::new();
    if let Some(persistence) = &services.persistence {
        let listed = match signal.run(persistence.list()).await {
            Err(_) => return Err(SubagentError::listing_cancelled().into()),
            Ok(Err(e)) if signal.is_cancelled() => {
                return Err(SubagentError::listing_cancelled().with_source(e).into());
            }
            Ok(Err(e)) => return Err(ListingError::Persistence(e)),
            Ok(Ok(headers)) => headers,
        };
        check(signal)?;
        for header in listed {
            records.insert(header.id.clone(), Record::Cold(header));
        }
    }
    for session in store.list() {
        records.insert(session.id().clone(), Record::Live(session));
    }
    let with_subagent_children = records
        .values()
        .map(Record::header)
        .filter(|h| is_subagent(h))
        .filter_map(|h| h.parent_session.clone())
        .collect();
    Ok((
        registry,
        Corpus {
            records,
            with_subagent_children,
        },
    ))
}

/// An identity view read from a snapshot: `Ok(None)` is "no identity".
fn identity_of(view: Option<&Value>) -> Option<(&'static str, Option<String>)> {
    let view = view?.as_object()?;
    let mode = match view.get("mode")?.as_str()? {
        "one-shot" => "one-shot",
        "continuable" => "continuable",
        _ => return None,
    };
    let label = view.get("label").and_then(Value::as_str).map(str::to_owned);
    Some((mode, label))
}

/// The cache rung (spec §2.18, cold step 1): the identity `cache` holds for `header`'s session
/// when it is final (see [`ProjectionCache`]); `Ok(None)` falls through to the log read. Only an
/// abort during the read is an error (`CANCELLED`).
async fn cached_identity(
    cache: Option<&Arc<dyn ProjectionCache>>,
    header: &SessionHeader,
    signal: &Signal,
) -> Result<Option<(&'static str, Option<String>)>, SubagentError> {
    let Some(cache) = cache else {
        return Ok(None);
    };
    // The cache is host code: a panic, at the call or while polled, is a failed read.
    let read = AssertUnwindSafe(async { cache.cached_snapshot(header).await }).catch_unwind();
    let row = match signal.run(read).await {
        Err(_) => return Err(SubagentError::listing_cancelled()),
        Ok(Ok(Ok(Some(row)))) => row,
        Ok(_) => return Ok(None),
    };
    let Some(view) = row.values.get(IDENTITY_PROJECTION) else {
        return Ok(None);
    };
    let own = view
        .get("seq")
        .and_then(Value::as_u64)
        .is_some_and(|seq| seq >= header.seed_length.unwrap_or(0));
    Ok(if own { identity_of(Some(view)) } else { None })
}

/// The registry's snapshot of `session`; a panicking unit is a fold failure (`None`).
fn snapshot(registry: &ProjectionRegistry, session: &Session) -> Option<serde_json::Map<String, Value>> {
    catch_unwind(AssertUnwindSafe(|| registry.snapshot(session))).ok()
}

fn witness_matches(enumerated: &SessionHeader, inspected: &SessionHeader) -> bool {
    enumerated.version == inspected.version
        && enumerated.id == inspected.id
        && enumerated.created_at == inspected.created_at
        && enumerated.cwd == inspected.cwd
        && enumerated.parent_session == inspected.parent_session
        && enumerated.seed_length == inspected.seed_length
        && enumerated.delegation_depth == inspected.delegation_depth
}

/// Resolves one candidate: `Ok(None)` omits it (a live child inside its creation window).
async fn resolve(
    registry: &ProjectionRegistry,
    persistence: Option<&Arc<dyn SessionPersistence>>,
    cache: Option<&Arc<dyn ProjectionCache>>,
    corpus: &Corpus,
    record: &Record,
    signal: &Signal,
) -> Result<Option<SubagentListEntry>, SubagentError> {
    // One unit of tokio's cooperative budget per row: a listing of many children whose reads
    // all complete at once (an in-memory store) still lets other tasks on its thread run.
    tokio::task::consume_budget().await;
    let header = record.header();
    let id = header.id.clone();
    let has_children = corpus.with_subagent_children.contains(&id);
    let diagnostic = |reason| {
        Ok(Some(SubagentListEntry::Diagnostic {
            id: id.clone(),
            reason,
        }))
    };
    let child = |activity, (mode, label)| {
        Ok(Some(SubagentListEntry::Child {
            id: id.clone(),
            activity,
            has_children,
            mode,
            label,
        }))
    };
    match record {
        Record::Live(session) => match snapshot(registry, session) {
            None => diagnostic(DiagnosticReason::Corrupt),
            Some(values) => match identity_of(values.get(IDENTITY_PROJECTION)) {
                None => Ok(None),
                Some(identity) => child(Activity::Running, identity),
            },
        },
        Record::Cold(enumerated) => {
            if let Some(identity) = cached_identity(cache, enumerated, signal).await? {
                return child(Activity::Inactive, identity);
            }
            let Some(persistence) = persistence else {
                return diagnostic(DiagnosticReason::Unavailable);
            };
            check(signal)?;
            let loaded = match signal.run(persistence.load(&id)).await {
                Err(_) => return Err(SubagentError::listing_cancelled()),
                Ok(Err(e)) if signal.is_cancelled() => {
                    return Err(SubagentError::listing_cancelled().with_source(e));
                }
                Ok(Err(_)) => return diagnostic(DiagnosticReason::Unavailable),
                Ok(Ok(loaded)) => loaded,
            };
            check(signal)?;
            if !witness_matches(enumerated, &loaded.header) {
                return diagnostic(DiagnosticReason::Corrupt);
            }
            let Ok(session) = Session::new(loaded.header, Some(loaded.events)) else {
                return diagnostic(DiagnosticReason::Corrupt);
            };
            match snapshot(registry, &session).and_then(|v| identity_of(v.get(IDENTITY_PROJECTION))) {
                None => diagnostic(DiagnosticReason::Corrupt),
                Some(identity) => child(Activity::Inactive, identity),
            }
        }
    }
}

/// Resolves candidates in order (cold reads at bounded concurrency), then the final token check.
async fn resolve_all(
    registry: &ProjectionRegistry,
    services: &ListingServices,
    corpus: &Corpus,
    candidates: &[&Record],
    signal: &Signal,
) -> Result<Vec<Option<SubagentListEntry>>, SubagentError> {
    let persistence = services.persistence.as_ref();
    let cache = services.cache.as_ref();
    // The (lazy, not yet polled) reads are collected before they meet the stream: with the
    // creating closure inside the stream's type, the compiler cannot prove the listing future
    // `Send` (rust-lang/rust#102211), which made listings unspawnable on a multi-threaded
    // runtime. `buffered` still starts each read only when one of its slots is free.
    let reads: Vec<_> = candidates
        .iter()
        .map(|record| resolve(registry, persistence, cache, corpus, record, signal))
        .collect();
    // `try_collect` stops at the first refusal (`CANCELLED`), dropping in-flight reads.
    let rows: Vec<_> = futures::stream::iter(reads)
        .buffered(COLD_CONCURRENCY)
        .try_collect()
        .await?;
    check(signal)?;
    Ok(rows)
}

/// The direct `origin: subagent` children of `parent`, ordered by `createdAt` then id
/// (spec §2.18). An unknown parent yields `[]`.
pub async fn list_children(
    services: &ListingServices,
    parent: &SessionId,
    signal: &Signal,
) -> Result<Vec<SubagentListEntry>, ListingError> {
    let (registry, corpus) = prepare(services, signal).await?;
    let mut candidates: Vec<&Record> = corpus
        .records
        .values()
        .filter(|r| {
            let h = r.header();
            is_subagent(h) && h.parent_session.as_ref() == Some(parent)
        })
        .collect();
    sort_siblings(&mut candidates);
    let rows = resolve_all(&registry, services, &corpus, &candidates, signal).await?;
    Ok(rows.into_iter().flatten().collect())
}

/// Every `origin: subagent` descendant of `root` in stable pre-order (spec §2.18). Every node is
/// traversed (ordinary forks, omitted and diagnosed nodes included); the walk is iterative and a
/// parent cycle never revisits the root or loops.
pub async fn list_descendants(
    services: &ListingServices,
    root: &SessionId,
    signal: &Signal,
) -> Result<Vec<DescendantEntry>, ListingError> {
    let (registry, corpus) = prepare(services, signal).await?;
    let mut children: HashMap<&SessionId, Vec<&Record>> = HashMap::new();
    for record in corpus.records.values() {
        if let Some(parent) = &record.header().parent_session {
            children.entry(parent).or_default().push(record);
        }
    }
    for siblings in children.values_mut() {
        sort_siblings(siblings);
    }
    let mut visited: HashSet<&SessionId> = HashSet::from([root]);
    let mut order: Vec<(&Record, usize)> = Vec::new();
    // Stack of (record, depth); siblings pushed in reverse so they pop in order.
    let mut stack: Vec<(&Record, usize)> = children
        .get(root)
        .map(|c| c.iter().rev().map(|r| (*r, 1)).collect())
        .unwrap_or_default();
    while let Some((record, depth)) = stack.pop() {
        let id = &record.header().id;
        if !visited.insert(id) {
            continue;
        }
        order.push((record, depth));
        if let Some(below) = children.get(id) {
            stack.extend(below.iter().rev().map(|r| (*r, depth + 1)));
        }
    }
    let candidates: Vec<(&Record, usize)> = order
        .into_iter()
        .filter(|(r, _)| is_subagent(r.header()))
        .collect();
    let records: Vec<&Record> = candidates.iter().map(|(r, _)| *r).collect();
    let rows = resolve_all(&registry, services, &corpus, &records, signal).await?;
    Ok(rows
        .into_iter()
        .zip(candidates)
        .filter_map(|(row, (record, depth))| {
            let parent_id = record.header().parent_session.clone()?;
            row.map(|entry| DescendantEntry {
                entry,
                parent_id,
                depth,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests;
