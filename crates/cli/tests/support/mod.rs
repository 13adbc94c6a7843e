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
