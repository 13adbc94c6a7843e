//! Support shared by this crate's integration tests (each test target includes what it uses).

#![allow(dead_code)]

pub mod sse;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The mock ACP agent's executable, built once per test process. `cargo test --workspace`
/// has already built it next to this test's own executable; a narrower run builds it here.
pub fn mock_acp_agent() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test knows its executable");
        let sibling = exe
            .parent()
            .and_then(Path::parent)
            .map(|dir| dir.join(format!("mock_acp_agent{}", std::env::consts::EXE_SUFFIX)));
        if let Some(path) = sibling.filter(|p| p.is_file()) {
            return path;
        }
        escargot::CargoBuild::new()
            .package("subagent-acp")
            .bin("mock_acp_agent")
            .run()
            .expect("the mock ACP agent builds")
            .path()
            .to_owned()
    })
}

/// Loads the only session stored in `store`, checks that its header records `cwd`, and returns
/// the kinds of its turn ends, in order.
pub async fn only_session_turn_ends(store: &Path, cwd: &Path) -> Vec<String> {
    let stored = agent_loop::JsonlStore::new(store);
    let sessions = agent::SessionPersistence::list(&stored).await.expect("listed");
    assert_eq!(sessions.len(), 1, "one session stored: {sessions:?}");
    let loaded = agent::SessionPersistence::load(&stored, &sessions[0].id)
        .await
        .expect("the session's log loads");
    assert_eq!(loaded.header.cwd.as_deref(), Some(cwd));
    loaded
        .events
        .iter()
        .filter_map(|e| match &e.data {
            agent::EventData::TurnEnd { reason, .. } => Some(reason.kind().to_owned()),
            _ => None,
        })
        .collect()
}

/// Builds the host `options` describe with a fresh invariant observer on every session it
/// publishes, and returns both (the observer for the test's end-of-run checks).
pub fn observed_host(
    mut options: subagent_cli::host::HostOptions,
) -> (
    subagent_cli::host::Host,
    std::sync::Arc<invariants::InvariantObserver>,
) {
    let observer = invariants::InvariantObserver::shared();
    options.session_observers.push(observer.clone());
    let host = subagent_cli::host::build_host(options).expect("the host composes");
    (host, observer)
}
