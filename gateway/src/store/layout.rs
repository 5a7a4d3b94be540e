//! The data directory: `store/` (the embedded SQLite store) beside
//! `sandboxes/` (one directory per sandbox), both readable by the gateway's
//! user only. The store was once `gateway.db` at the top; such a directory
//! is moved into place on start, nothing lost.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Directory of the embedded store under the data directory.
pub const STORE_DIR: &str = "store";
/// The embedded store's file name.
pub const STORE_FILE: &str = "gateway.db";
/// SQLite's companions of a database file, moved with it.
const COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// Creates `store/` and `sandboxes/` (mode 0700), moves a store left at the
/// top by an earlier release, and returns the store file's path.
pub fn prepare(data_dir: &Path) -> io::Result<PathBuf> {
    let store_dir = data_dir.join(STORE_DIR);
    for dir in [&store_dir, &data_dir.join("sandboxes")] {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let store = store_dir.join(STORE_FILE);
    let old = data_dir.join(STORE_FILE);
    if old.exists() {
        if store.exists() {
            tracing::warn!(
                old = %old.display(),
                store = %store.display(),
                "both an old and a current store file exist; using the current one and \
                 leaving the old one alone"
            );
        } else {
            // Companions first: should the move stop half-way, the old file
            // still stands and the next start finishes the job, with every
            // page the -wal holds already beside the new place.
            for suffix in COMPANIONS {
                let from = data_dir.join(format!("{STORE_FILE}{suffix}"));
                if from.exists() {
                    std::fs::rename(&from, store_dir.join(format!("{STORE_FILE}{suffix}")))?;
                }
            }
            std::fs::rename(&old, &store)?;
            tracing::info!(store = %store.display(), "moved the store into its own directory");
        }
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_store_moves_with_its_companions() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("gateway.db"), b"db").unwrap();
        std::fs::write(dir.path().join("gateway.db-wal"), b"wal").unwrap();
        let store = prepare(dir.path()).unwrap();
        assert_eq!(store, dir.path().join("store/gateway.db"));
        assert_eq!(std::fs::read(&store).unwrap(), b"db");
        assert_eq!(
            std::fs::read(dir.path().join("store/gateway.db-wal")).unwrap(),
            b"wal"
        );
        assert!(!dir.path().join("gateway.db").exists());
        let mode = std::fs::metadata(dir.path().join("store"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // A second start changes nothing.
        assert_eq!(prepare(dir.path()).unwrap(), store);
    }

    #[test]
    fn a_current_store_wins_over_a_stray_old_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("store")).unwrap();
        std::fs::write(dir.path().join("store/gateway.db"), b"new").unwrap();
        std::fs::write(dir.path().join("gateway.db"), b"old").unwrap();
        let store = prepare(dir.path()).unwrap();
        assert_eq!(std::fs::read(store).unwrap(), b"new");
        assert_eq!(
            std::fs::read(dir.path().join("gateway.db")).unwrap(),
            b"old"
        );
    }
}
