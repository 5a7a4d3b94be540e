//! File transfer: files and directory trees in and out of a sandbox, over
//! the sandbox's SFTP server.
//!
//! Each transfer opens one `ForwardTcp` stream with the `sftp` target (see
//! [`ForwardTarget::Sftp`](crate::ForwardTarget::Sftp)): the sandbox's
//! supervisor runs its SFTP server as an exec of the sandbox (its
//! namespaces, uid and limits: a transfer can touch exactly what an exec
//! can), and the core speaks SFTP version 3 to it over the stream. The
//! stream is owner-routed like every forward, with the single unrouted
//! retry at open; nothing is replayed once a server saw it.
//!
//! - **Pipelined**: [`IN_FLIGHT`] requests of [`CHUNK`] bytes are in flight
//!   each way, so throughput is not bound by round trips.
//! - **Streamed**: a file is never held whole in memory (except by
//!   [`Client::read_file`], which is capped at [`READ_FILE_LIMIT`]).
//! - **Nothing half-written**: every file goes to a temp name in its target
//!   directory (`.<name>.openshell-part-<random>`), gets its mode and mtime,
//!   and is renamed over the target last (an existing file is replaced
//!   atomically). On a failure the temp file is removed; if the client dies
//!   the sandbox's server removes it when the stream ends. Downloads do the
//!   same locally.
//! - **Inside the working directory**: remote paths are relative to the
//!   sandbox's working directory, and absolute ones must lie inside it
//!   (`..` included): anything else is `invalid_argument`, before anything
//!   is written.
//! - **Errors name the path** (at most 200 characters of it) with the
//!   crate's codes: `not_found`, `failed_precondition` (a directory where a
//!   file is expected or the reverse), `resource_exhausted` (no space),
//!   `permission_denied`, `invalid_argument`.
//!
//! Trees keep modes and mtimes; symlinks are recreated when their target
//! stays inside the tree (relative, not climbing out), others are skipped
//! and counted; [`TransferOptions::ignore_file`] names ignore files
//! (".gitignore" syntax) honoured at every level.
//!
//! Bindings wrap [`Client::upload`] / [`Client::download`] (paths on the
//! caller's machine) and the stream forms [`UploadSink`] /
//! [`DownloadSource`] (bytes in and out of the host language, chunk by
//! chunk), plus [`Client::read_file`] / [`Client::write_file`].

use std::fmt;
use std::path::Path;

use bytes::Bytes;

use crate::client::{CallOptions, Client};
use crate::error::Error;

mod download;
mod ignore_rules;
mod progress;
mod session;
mod sftp;
mod upload;

pub use download::DownloadSource;
pub use progress::{PROGRESS_INTERVAL, Progress, ProgressFn};
pub use upload::UploadSink;

/// Bytes per SFTP read or write request.
pub const CHUNK: usize = 256 * 1024;
/// Requests in flight per file, each way.
pub const IN_FLIGHT: usize = 16;
/// The largest file [`Client::read_file`] returns (64 MiB); larger ones are
/// `failed_precondition` (use [`Client::download`] or
/// [`Client::download_stream`]).
pub const READ_FILE_LIMIT: u64 = 64 << 20;

/// How a transfer runs. Cheap to clone.
#[derive(Clone, Default)]
pub struct TransferOptions {
    /// The name of ignore files (for example ".gitignore") honoured in
    /// every directory of a tree, for uploads and downloads alike.
    pub ignore_file: Option<String>,
    /// Called at most every [`PROGRESS_INTERVAL`] and once at the end.
    pub progress: Option<ProgressFn>,
    /// Deadline (none unless set: transfers are streams) and cancellation.
    pub call: CallOptions,
}

impl TransferOptions {
    /// No ignore file, no progress, no deadline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`ignore_file`](Self::ignore_file).
    pub fn ignore_file(mut self, name: impl Into<String>) -> Self {
        self.ignore_file = Some(name.into());
        self
    }

    /// Sets [`progress`](Self::progress).
    pub fn progress(mut self, callback: impl Fn(&Progress) + Send + Sync + 'static) -> Self {
        self.progress = Some(std::sync::Arc::new(callback));
        self
    }

    /// Sets the deadline and cancellation token.
    pub fn call_options(mut self, call: CallOptions) -> Self {
        self.call = call;
        self
    }
}

impl fmt::Debug for TransferOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransferOptions")
            .field("ignore_file", &self.ignore_file)
            .field("progress", &self.progress.is_some())
            .field("call", &self.call)
            .finish()
    }
}

/// What a transfer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferSummary {
    /// Regular files written.
    pub files: u64,
    /// Directories created (or found) in a tree.
    pub directories: u64,
    /// Symlinks recreated.
    pub symlinks: u64,
    /// Symlinks skipped: their target leaves the tree.
    pub skipped_symlinks: u64,
    /// Entries left out by the ignore files (a directory counts once).
    pub ignored: u64,
    /// Other entries skipped (sockets, devices, fifos).
    pub skipped_other: u64,
    /// File bytes moved.
    pub bytes: u64,
}

impl Client {
    /// Uploads `local` (a file, or a directory with everything in it) to
    /// `remote` in `sandbox`. When `remote` is an existing directory the
    /// upload goes inside it under `local`'s name (as `scp` does).
    pub async fn upload(
        &self,
        sandbox: &str,
        local: &Path,
        remote: &str,
        options: &TransferOptions,
    ) -> Result<TransferSummary, Error> {
        upload::upload(self, sandbox, local, remote, options).await
    }

    /// Downloads `remote` (a file or a directory) from `sandbox` to
    /// `local`. When `local` is an existing directory the download goes
    /// inside it under `remote`'s name.
    pub async fn download(
        &self,
        sandbox: &str,
        remote: &str,
        local: &Path,
        options: &TransferOptions,
    ) -> Result<TransferSummary, Error> {
        download::download(self, sandbox, remote, local, options).await
    }

    /// Starts an upload of bytes the caller supplies to the file `remote`:
    /// [`UploadSink::write`] them, then [`UploadSink::finish`]. The file
    /// appears (mode 0644, replacing any file there) only at `finish`;
    /// dropping the sink or [`UploadSink::abort`] leaves nothing behind.
    pub async fn upload_stream(
        &self,
        sandbox: &str,
        remote: &str,
        options: &TransferOptions,
    ) -> Result<UploadSink, Error> {
        UploadSink::open(self, sandbox, remote, options).await
    }

    /// Starts a download of the file `remote`, read chunk by chunk with
    /// [`DownloadSource::next_chunk`]; [`DownloadSource::size`] is known
    /// up front.
    pub async fn download_stream(
        &self,
        sandbox: &str,
        remote: &str,
        options: &TransferOptions,
    ) -> Result<DownloadSource, Error> {
        DownloadSource::open(self, sandbox, remote, options).await
    }

    /// The whole content of the file `remote`, at most [`READ_FILE_LIMIT`]
    /// bytes (`failed_precondition` beyond, before anything is read).
    pub async fn read_file(
        &self,
        sandbox: &str,
        remote: &str,
        options: CallOptions,
    ) -> Result<Vec<u8>, Error> {
        let options = TransferOptions::new().call_options(options);
        let mut source = self.download_stream(sandbox, remote, &options).await?;
        if source.size() > READ_FILE_LIMIT {
            let message = format!(
                "read_file {}: the file has {} bytes, more than read_file's limit of {} MiB; use download or download_stream",
                session::shown(remote),
                source.size(),
                READ_FILE_LIMIT >> 20
            );
            source.close().await;
            return Err(session::rpc(tonic::Code::FailedPrecondition, message));
        }
        let mut data = Vec::with_capacity(source.size() as usize);
        while let Some(chunk) = source.next_chunk().await? {
            if data.len() as u64 + chunk.len() as u64 > READ_FILE_LIMIT {
                source.close().await;
                return Err(session::rpc(
                    tonic::Code::FailedPrecondition,
                    format!(
                        "read_file {}: the file grew past read_file's limit of {} MiB",
                        session::shown(remote),
                        READ_FILE_LIMIT >> 20
                    ),
                ));
            }
            data.extend_from_slice(&chunk);
        }
        Ok(data)
    }

    /// Writes `data` as the file `remote` (mode 0644), replacing any file
    /// there atomically.
    pub async fn write_file(
        &self,
        sandbox: &str,
        remote: &str,
        data: &[u8],
        options: CallOptions,
    ) -> Result<TransferSummary, Error> {
        let options = TransferOptions::new().call_options(options);
        let mut sink = self.upload_stream(sandbox, remote, &options).await?;
        for chunk in data.chunks(CHUNK) {
            sink.write(Bytes::copy_from_slice(chunk)).await?;
        }
        sink.finish().await
    }
}
