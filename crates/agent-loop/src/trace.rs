//! Session-log capture for tests and diagnostics.
//!
//! When the environment variable [`TRACE_DIR_ENV`] (`SUBAGENT_TRACE_DIR`) is set, every runtime
//! built by [`RuntimeBuilder`](crate::runtime::RuntimeBuilder) writes each session it announces
//! to `<dir>/<executable>/<thread>/<session-id>.jsonl` in the JSON-lines store format (header on
//! line 1, one event per line). Test harnesses name each test's thread after the test, so every
//! test gets its own directory (its own store, for cross-session replay); `cargo xtask
//! check-invariants` replays them all.
//!
//! Capture is best-effort diagnostics: an I/O failure is logged with `tracing::warn!` and never
//! affects the session. Writes are small synchronous appends made from the session's observer,
//! so capture is meant for tests and debugging, not for production hot paths (use a
//! [`JsonlStore`](crate::store::JsonlStore) there).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent::{Registration, Session, SessionEvent, SessionObserver};
use parking_lot::Mutex;

use crate::runtime::{MemorySessionStore, SessionStoreEvent};

/// The environment variable that switches capture on.
pub const TRACE_DIR_ENV: &str = "SUBAGENT_TRACE_DIR";

/// Installs capture on `store` when [`TRACE_DIR_ENV`] is set; `None` otherwise. Dropping the
/// returned guard stops capturing sessions announced later.
pub fn install_from_env(store: &MemorySessionStore) -> Option<Registration> {
    let dir = std::env::var_os(TRACE_DIR_ENV)?;
    Some(install(store, &directory_for_this_thread(Path::new(&dir))))
}

/// Captures every session `store` announces from now on into `dir` (flat: one file per
/// session; a reused id goes to the sibling store `dir#2`, `dir#3`, …).
pub fn install(store: &MemorySessionStore, dir: &Path) -> Registration {
    let dir = dir.to_owned();
    store.events().on(move |event| {
        if let SessionStoreEvent::Created(session) = event {
            match TraceFile::create(&dir, session) {
                Ok(file) => session.add_observer(Arc::new(file)),
                Err(e) => tracing::warn!(session = %session.id(), error = %e, "session trace capture failed"),
            }
        }
        Ok(())
    })
}

/// Removes this thread's capture of session `id`, if capture is on — for a test whose session
/// log is deliberately ill-formed input (a hostile seed, say): `cargo xtask check-invariants`
/// would rightly flag it, and it is no log a runtime wrote on its own. Call it after the
/// session's last append (once its runtime is finished).
///
/// # Panics
/// When capture is on but the session has no capture file here: the test's premise (which
/// session it built) is wrong.
pub fn discard_capture(id: &str) {
    if let Some(root) = std::env::var_os(TRACE_DIR_ENV) {
        let file = directory_for_this_thread(Path::new(&root)).join(format!("{}.jsonl", sanitize(id)));
        if let Err(e) = std::fs::remove_file(&file) {
            panic!("no capture of session {id:?} at {}: {e}", file.display());
        }
    }
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `<root>/<executable stem>/<thread name>`.
pub fn directory_for_this_thread(root: &Path) -> PathBuf {
    let exe = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "process".into());
    let thread = std::thread::current()
        .name()
        .map(sanitize)
        .unwrap_or_else(|| format!("{:?}", std::thread::current().id()));
    root.join(sanitize(&exe)).join(thread)
}

/// The directory of store generation `generation` (1: `dir` itself, then `dir#2`, `dir#3`, …).
fn store_generation(dir: &Path, generation: u32) -> PathBuf {
    if generation == 1 {
        return dir.to_owned();
    }
    let mut sibling = dir.as_os_str().to_owned();
    sibling.push(format!("#{generation}"));
    PathBuf::from(sibling)
}

/// The latest generation holding a capture named `name` (captures of one id fill generations
/// 1, 2, … in order); 1 when there is none.
fn latest_generation(dir: &Path, name: &str) -> u32 {
    let mut generation = 1;
    while store_generation(dir, generation + 1).join(name).exists() {
        generation += 1;
    }
    generation
}

/// One session's capture file.
struct TraceFile {
    state: Mutex<TraceState>,
}

struct TraceState {
    file: File,
    /// The next seq to write.
    next: u64,
}

impl TraceFile {
    fn create(dir: &Path, session: &Session) -> std::io::Result<Self> {
        let name = format!("{}.jsonl", sanitize(session.id().as_str()));
        // A reused id (a resumed session, or an id reopened after disposal) starts a new store
        // generation in a sibling directory, so each directory stays a store with unique ids.
        // A child starts looking at its parent's latest generation, so it lands in the same
        // store as the parent it was delegated by (a child of a re-created parent would
        // otherwise be replayed against the parent's first, unrelated, capture).
        let mut generation = match &session.header().parent_session {
            Some(parent) => latest_generation(dir, &format!("{}.jsonl", sanitize(parent.as_str()))),
            None => 1,
        };
        let (path, file) = loop {
            let store = store_generation(dir, generation);
            std::fs::create_dir_all(&store)?;
            let path = store.join(&name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => generation += 1,
                Err(e) => return Err(e),
            }
        };
        let mut state = TraceState { file, next: 0 };
        let header = serde_json::to_string(session.header()).map_err(std::io::Error::other)?;
        writeln!(state.file, "{header}")?;
        state.catch_up(session)?;
        tracing::debug!(path = %path.display(), "capturing session log");
        Ok(Self {
            state: Mutex::new(state),
        })
    }
}

impl TraceState {
    fn write(&mut self, event: &SessionEvent) -> std::io::Result<()> {
        let line = serde_json::to_string(event).map_err(std::io::Error::other)?;
        writeln!(self.file, "{line}")?;
        self.next = event.seq + 1;
        Ok(())
    }

    /// Writes every event of `session` not written yet.
    fn catch_up(&mut self, session: &Session) -> std::io::Result<()> {
        let events = session.events();
        for event in events.iter().skip(self.next as usize) {
            self.write(event)?;
        }
        Ok(())
    }
}

impl SessionObserver for TraceFile {
    fn committed(&self, session: &Session, event: &Arc<SessionEvent>) {
        let mut state = self.state.lock();
        let result = if event.seq == state.next {
            state.write(event)
        } else if event.seq > state.next {
            state.catch_up(session)
        } else {
            Ok(())
        };
        if let Err(e) = result {
            tracing::warn!(session = %session.id(), error = %e, "session trace capture failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent::{EventData, SessionId, SessionMeta};

    #[test]
    fn captures_header_prior_events_and_later_appends() {
        let dir = tempfile::tempdir().unwrap();
        let store = MemorySessionStore::new(None);
        let _guard = install(&store, dir.path());
        let header = SessionMeta::default().into_header("s1".into(), 1).unwrap();
        let session = Arc::new(Session::new(header, Some(vec![])).unwrap());
        let entered = agent::SessionStore::enter(&store, session.clone()).unwrap();
        store.announce(&session).unwrap();
        session.append(EventData::TurnStart { turn: 1 }, None).unwrap();
        let text = std::fs::read_to_string(dir.path().join("s1.jsonl")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[1].contains("session/end-seed"));
        assert!(lines[2].contains("turn/start"));
        drop(entered);
    }

    /// A re-created id goes to the next store generation, and a child delegated by it goes to
    /// the same generation as that parent — not to the first one, where the parent's unrelated
    /// earlier capture lives and a replay would judge the child's seed against it.
    #[test]
    fn a_child_is_captured_beside_its_parents_latest_capture() {
        let dir = tempfile::tempdir().unwrap();
        let store = MemorySessionStore::new(None);
        let _guard = install(&store, dir.path());
        let announce = |id: &str, parent: Option<&str>| {
            let meta = SessionMeta {
                parent_session: parent.map(SessionId::from),
                ..SessionMeta::default()
            };
            let session = Arc::new(Session::new(meta.into_header(id.into(), 1).unwrap(), None).unwrap());
            let entered = agent::SessionStore::enter(&store, session.clone()).unwrap();
            store.announce(&session).unwrap();
            entered
        };
        drop(announce("p", None));
        drop(announce("c1", Some("p")));
        drop(announce("p", None));
        drop(announce("c2", Some("p")));
        drop(announce("c1", Some("p")));
        let generation_2 = store_generation(dir.path(), 2);
        let generation_3 = store_generation(dir.path(), 3);
        assert!(dir.path().join("p.jsonl").exists() && dir.path().join("c1.jsonl").exists());
        assert!(generation_2.join("p.jsonl").exists());
        assert!(
            generation_2.join("c2.jsonl").exists(),
            "beside the re-created parent"
        );
        assert!(generation_2.join("c1.jsonl").exists(), "a reused child id too");
        assert!(!dir.path().join("c2.jsonl").exists());
        assert!(!generation_3.exists());
    }
}
