//! File transfer over the sandbox's SFTP server: bytes in and out
//! (`write_file`, `read_file`) and paths on this machine (`upload`,
//! `download`). The core does the I/O, local and remote; only the bytes of
//! `write_file`/`read_file` cross the boundary.
//!
//! A [`TransferProgress`] implemented on the JVM is called on the
//! transfer's own task (at most every 100 ms, and once at the end), so it
//! must return quickly.

use std::path::PathBuf;
use std::sync::Arc;

use openshell_sdk::TransferOptions;

use crate::client::{OpenShellClient, counter};
use crate::errors::{OpenShellError, invalid};

/// What a transfer did.
#[derive(Debug, Clone, uniffi::Record)]
pub struct TransferSummary {
    /// Regular files written.
    pub files: i64,
    /// Directories created (or found) in a tree.
    pub directories: i64,
    /// Symlinks recreated.
    pub symlinks: i64,
    /// Symlinks skipped: their target leaves the tree.
    pub skipped_symlinks: i64,
    /// Entries left out by the ignore files (a directory counts once).
    pub ignored: i64,
    /// Other entries skipped (sockets, devices, fifos).
    pub skipped_other: i64,
    /// File bytes moved.
    pub bytes: i64,
}

/// How far a transfer is.
#[derive(Debug, Clone, uniffi::Record)]
pub struct TransferProgressInfo {
    pub bytes_done: i64,
    pub bytes_total: i64,
    pub files_done: i64,
    pub files_total: i64,
    /// The file being moved (its destination), or the last one.
    pub current: String,
}

/// A progress listener implemented on the JVM.
#[uniffi::export(with_foreign)]
pub trait TransferProgress: Send + Sync {
    fn progress(&self, progress: TransferProgressInfo);
}

fn summary(s: openshell_sdk::TransferSummary) -> TransferSummary {
    TransferSummary {
        files: counter(s.files),
        directories: counter(s.directories),
        symlinks: counter(s.symlinks),
        skipped_symlinks: counter(s.skipped_symlinks),
        ignored: counter(s.ignored),
        skipped_other: counter(s.skipped_other),
        bytes: counter(s.bytes),
    }
}

impl OpenShellClient {
    /// An upload or a download: `call`, given the checked local path and
    /// the transfer's options.
    async fn transfer<F>(
        &self,
        local_path: String,
        ignore_file: Option<String>,
        progress: Option<Arc<dyn TransferProgress>>,
        timeout_ms: Option<u64>,
        call: impl FnOnce(PathBuf, TransferOptions) -> F,
    ) -> Result<TransferSummary, OpenShellError>
    where
        F: Future<Output = Result<openshell_sdk::TransferSummary, openshell_sdk::Error>>,
    {
        if local_path.is_empty() {
            return Err(invalid("a transfer needs a local path"));
        }
        let (call_options, _) = self.options(timeout_ms);
        let mut options = TransferOptions::new().call_options(call_options);
        if let Some(name) = ignore_file {
            options = options.ignore_file(name);
        }
        if let Some(listener) = progress {
            options = options.progress(move |p| {
                listener.progress(TransferProgressInfo {
                    bytes_done: counter(p.bytes_done),
                    bytes_total: counter(p.bytes_total),
                    files_done: counter(p.files_done),
                    files_total: counter(p.files_total),
                    current: p.current.clone(),
                })
            });
        }
        let done = self.run(call(PathBuf::from(local_path), options)).await?;
        Ok(summary(done))
    }
}

#[uniffi::export(async_runtime = "tokio")]
impl OpenShellClient {
    /// Writes `data` as the file `remote` (mode 0644), replacing any file
    /// there atomically.
    pub async fn write_file(
        &self,
        sandbox: String,
        remote: String,
        data: Vec<u8>,
        timeout_ms: Option<u64>,
    ) -> Result<TransferSummary, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let done = self
            .run(self.client.write_file(&sandbox, &remote, &data, options))
            .await?;
        Ok(summary(done))
    }

    /// The whole file `remote` (at most 64 MiB: `failed_precondition`
    /// beyond; use `download` for larger ones).
    pub async fn read_file(
        &self,
        sandbox: String,
        remote: String,
        timeout_ms: Option<u64>,
    ) -> Result<Vec<u8>, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        self.run(self.client.read_file(&sandbox, &remote, options))
            .await
    }

    /// Uploads `local_path` (a file, or a directory with everything in it)
    /// to `remote`; into it, under the local name, when `remote` is an
    /// existing directory.
    pub async fn upload(
        &self,
        sandbox: String,
        local_path: String,
        remote: String,
        ignore_file: Option<String>,
        progress: Option<Arc<dyn TransferProgress>>,
        timeout_ms: Option<u64>,
    ) -> Result<TransferSummary, OpenShellError> {
        let upload = |local: PathBuf, options: TransferOptions| async move {
            self.client
                .upload(&sandbox, &local, &remote, &options)
                .await
        };
        self.transfer(local_path, ignore_file, progress, timeout_ms, upload)
            .await
    }

    /// Downloads `remote` (a file or a directory) to `local_path`; into it,
    /// under the remote name, when `local_path` is an existing directory.
    pub async fn download(
        &self,
        sandbox: String,
        remote: String,
        local_path: String,
        ignore_file: Option<String>,
        progress: Option<Arc<dyn TransferProgress>>,
        timeout_ms: Option<u64>,
    ) -> Result<TransferSummary, OpenShellError> {
        let download = |local: PathBuf, options: TransferOptions| async move {
            self.client
                .download(&sandbox, &remote, &local, &options)
                .await
        };
        self.transfer(local_path, ignore_file, progress, timeout_ms, download)
            .await
    }
}
