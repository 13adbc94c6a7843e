//! [`StoreDir`]: a store's directory, created on first use and made durable before any log in it
//! is reported durable.
//!
//! A log's first flush syncs the file and the store directory (the entry naming the file). That
//! alone does not survive a crash when the store directory is new: the entry naming the
//! directory lives in its parent, and so on up to the first directory that already existed. So
//! the first writer to create a log creates the directory chain and syncs the parent of every
//! directory it made — and of the store directory itself, which an earlier process may have made
//! without syncing its parent — once per store, before its log's header is written. Writers of
//! the same store that start meanwhile wait for it.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::error::StoreError;

/// The directory a store writes its logs to.
#[derive(Debug)]
pub(crate) struct StoreDir {
    path: PathBuf,
    /// Whether the directory exists and its chain of entries is durable. Held while that is
    /// being done, so a second first writer waits instead of racing past an unsynced parent.
    ready: Mutex<bool>,
    /// The directories synced so far, in order (tests read it).
    #[cfg(test)]
    synced: Mutex<Vec<PathBuf>>,
}

impl StoreDir {
    /// The directory at `path`; no I/O happens until [`ensure`](Self::ensure).
    pub(crate) fn new(path: PathBuf) -> Self {
        Self {
            path,
            ready: Mutex::new(false),
            #[cfg(test)]
            synced: Mutex::new(Vec::new()),
        }
    }

    /// The directory's path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the directory (and any missing ancestors) and syncs the parent of each directory
    /// created and of the store directory, the first time it is called on this store; later
    /// calls return at once. Blocking: call it on a thread that may block. A failure is returned
    /// and the next call tries again.
    pub(crate) fn ensure(&self) -> Result<(), StoreError> {
        let mut ready = self.ready.lock();
        if *ready {
            return Ok(());
        }
        let missing = self.missing_ancestors()?;
        fs::create_dir_all(&self.path).map_err(|e| StoreError::io(&self.path, e))?;
        // The parents whose entries changed (deepest first), then the store directory's own
        // parent when it already existed (its entry may never have been synced).
        let mut parents: Vec<&Path> = missing.iter().map(|dir| parent_of(dir)).collect();
        let own_parent = parent_of(&self.path);
        if !parents.contains(&own_parent) {
            parents.push(own_parent);
        }
        for parent in parents {
            self.sync(parent)?;
        }
        *ready = true;
        Ok(())
    }

    /// Syncs the directory at `path` (its entries become durable).
    pub(crate) fn sync(&self, path: &Path) -> Result<(), StoreError> {
        File::open(path)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| StoreError::io(path, e))?;
        #[cfg(test)]
        self.synced.lock().push(path.to_owned());
        Ok(())
    }

    /// The directories synced so far, in order.
    #[cfg(test)]
    pub(crate) fn synced(&self) -> Vec<PathBuf> {
        self.synced.lock().clone()
    }

    /// `self.path` and every ancestor of it that does not exist, deepest first.
    fn missing_ancestors(&self) -> Result<Vec<PathBuf>, StoreError> {
        let mut missing = Vec::new();
        let mut dir = self.path.as_path();
        loop {
            match fs::symlink_metadata(dir) {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    missing.push(dir.to_owned());
                    match dir.parent() {
                        Some(parent) if !parent.as_os_str().is_empty() => dir = parent,
                        _ => break,
                    }
                }
                Err(e) => return Err(StoreError::io(dir, e)),
            }
        }
        Ok(missing)
    }
}

/// The directory holding the entry for `path` (`.` for a relative path of one component).
fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new store directory under new ancestors is created, and the entry of every directory
    /// made is synced in its parent (deepest first) — the store directory's own entry included —
    /// before any log is written; the second call does nothing.
    #[test]
    fn creating_the_directory_syncs_every_parent_entry_it_changed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().to_owned();
        let store = StoreDir::new(root.join("a").join("b").join("logs"));
        store.ensure().expect("created");
        assert!(store.path().is_dir());
        assert_eq!(
            *store.synced.lock(),
            vec![root.join("a").join("b"), root.join("a"), root.clone()],
        );
        store.ensure().expect("again");
        assert_eq!(store.synced.lock().len(), 3, "the second call syncs nothing");
    }

    /// An existing store directory still gets its entry synced once (an earlier process may
    /// have created it without).
    #[test]
    fn an_existing_directory_has_its_own_entry_synced_once() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = StoreDir::new(tmp.path().join("logs"));
        fs::create_dir(store.path()).expect("mkdir");
        store.ensure().expect("ready");
        assert_eq!(*store.synced.lock(), vec![tmp.path().to_owned()]);
    }

    /// A relative store path of one component has `.` as its parent.
    #[test]
    fn a_one_component_relative_path_syncs_the_working_directory() {
        assert_eq!(parent_of(Path::new("logs")), Path::new("."));
        assert_eq!(parent_of(Path::new("a/logs")), Path::new("a"));
    }

    /// A path that cannot become a directory (a file is in the way) is an error, and the next
    /// call tries again once the obstacle is gone.
    #[test]
    fn a_failed_creation_is_retried() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let blocker = tmp.path().join("logs");
        fs::write(&blocker, b"not a directory").expect("file");
        let store = StoreDir::new(blocker.clone());
        assert!(store.ensure().is_err());
        fs::remove_file(&blocker).expect("rm");
        store.ensure().expect("created on retry");
        assert!(blocker.is_dir());
    }
}
