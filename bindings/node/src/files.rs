//! File transfer: the core's `upload` / `download` of local paths, its
//! stream forms as handles, and `readFile` / `writeFile`.
//!
//! A path transfer runs wholly in the core (local reads and writes on the
//! tokio runtime, never a whole file in memory). The stream forms are for
//! bytes that live in JavaScript: [`NativeUploadSink::write`] resolves once
//! the core has taken the chunk, and the core waits while its requests in
//! flight are unanswered, so `@openshell/sdk`, which awaits each write
//! before it reads the next chunk from its source, gets backpressure end to
//! end. [`NativeDownloadSource::next`] hands out one chunk (at most the
//! core's 256 KiB) per call.
//!
//! # Progress
//!
//! The core calls its progress callback on the transfer's task, at most
//! every 100 ms and once at the end. Here that callback queues the report
//! onto a *weak* thread-safe function (it never keeps Node alive; a pending
//! transfer's Promise does). A JavaScript throw inside it would be fatal, so
//! `@openshell/sdk` passes a wrapper that never throws. Before a transfer's
//! Promise settles, the binding queues a `null` behind the reports and
//! awaits it: the queue is FIFO, so every report (the last one included)
//! has reached JavaScript before `await upload(...)` returns.
//!
//! # Cancellation and lifetime
//!
//! Each call carries the client's per-call token; a handle keeps it and
//! `cancel()` cancels it (the SFTP stream ends: an upload's temp file is
//! removed by the sandbox's server) and drops the core object. Dropping a
//! handle (garbage collection) drops the core object too, with the same
//! effect.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use napi::Status;
use napi::bindgen_prelude::{Buffer, PromiseRaw};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Result};
use napi_derive::napi;
use openshell_sdk::{
    CancellationToken, DownloadSource, Error, Progress, TransferOptions, TransferSummary,
    UploadSink,
};
use tokio::sync::Mutex;

use crate::client::{CancelToken, NativeClient};
use crate::errors::guard;

/// Where a transfer stands (byte and file counts as numbers: exact up to
/// 2^53).
#[napi(object)]
pub struct NativeProgress {
    pub bytes_done: f64,
    pub bytes_total: f64,
    pub files_done: f64,
    pub files_total: f64,
    pub current: String,
}

/// What a transfer did.
#[napi(object)]
pub struct NativeTransferSummary {
    pub files: f64,
    pub directories: f64,
    pub symlinks: f64,
    pub skipped_symlinks: f64,
    pub ignored: f64,
    pub skipped_other: f64,
    pub bytes: f64,
}

fn summary(s: TransferSummary) -> NativeTransferSummary {
    NativeTransferSummary {
        files: s.files as f64,
        directories: s.directories as f64,
        symlinks: s.symlinks as f64,
        skipped_symlinks: s.skipped_symlinks as f64,
        ignored: s.ignored as f64,
        skipped_other: s.skipped_other as f64,
        bytes: s.bytes as f64,
    }
}

/// The progress callback as napi holds it: weak, not callee-handled; `null`
/// is the barrier described in the module docs.
pub type ProgressJsFn =
    ThreadsafeFunction<Option<NativeProgress>, (), Option<NativeProgress>, Status, false, true>;

/// A transfer's progress reporting: the JavaScript function, when given.
#[derive(Clone, Default)]
struct Reports(Option<Arc<ProgressJsFn>>);

impl Reports {
    fn new(function: Option<ProgressJsFn>) -> Self {
        Self(function.map(Arc::new))
    }

    fn options(
        &self,
        call: openshell_sdk::CallOptions,
        ignore_file: Option<String>,
    ) -> TransferOptions {
        let mut options = TransferOptions::new().call_options(call);
        if let Some(name) = ignore_file {
            options = options.ignore_file(name);
        }
        if let Some(function) = self.0.clone() {
            options = options.progress(move |p: &Progress| {
                let report = NativeProgress {
                    bytes_done: p.bytes_done as f64,
                    bytes_total: p.bytes_total as f64,
                    files_done: p.files_done as f64,
                    files_total: p.files_total as f64,
                    current: p.current.clone(),
                };
                function.call(Some(report), ThreadsafeFunctionCallMode::NonBlocking);
            });
        }
        options
    }

    /// Resolves once every report queued so far has run in JavaScript.
    async fn flush(&self) {
        if let Some(function) = &self.0 {
            let _ = function.call_async(None).await;
        }
    }
}

#[napi]
impl NativeClient {
    /// Uploads the local file or directory `local` to `remote`.
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn upload<'e>(
        &self,
        env: &'e Env,
        sandbox: String,
        local: String,
        remote: String,
        ignore_file: Option<String>,
        progress: Option<ProgressJsFn>,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeTransferSummary>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let reports = Reports::new(progress);
        env.spawn_future(guard(async move {
            let options = reports.options(call.options.clone(), ignore_file);
            let local = PathBuf::from(local);
            let done = call
                .run(client.upload(&sandbox, &local, &remote, &options))
                .await;
            drop(options);
            reports.flush().await;
            done.map(summary)
        }))
    }

    /// Downloads the file or directory `remote` to the local path `local`.
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn download<'e>(
        &self,
        env: &'e Env,
        sandbox: String,
        remote: String,
        local: String,
        ignore_file: Option<String>,
        progress: Option<ProgressJsFn>,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeTransferSummary>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let reports = Reports::new(progress);
        env.spawn_future(guard(async move {
            let options = reports.options(call.options.clone(), ignore_file);
            let local = PathBuf::from(local);
            let done = call
                .run(client.download(&sandbox, &remote, &local, &options))
                .await;
            drop(options);
            reports.flush().await;
            done.map(summary)
        }))
    }

    /// Opens an upload of bytes JavaScript supplies to the file `remote`.
    #[napi]
    pub fn upload_stream<'e>(
        &self,
        env: &'e Env,
        sandbox: String,
        remote: String,
        progress: Option<ProgressJsFn>,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeUploadSink>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let reports = Reports::new(progress);
        env.spawn_future(guard(async move {
            let options = reports.options(call.options.clone(), None);
            let token = call.token.clone();
            let sink = call
                .run(client.upload_stream(&sandbox, &remote, &options))
                .await?;
            Ok(NativeUploadSink {
                target: sink.target().to_owned(),
                sink: Arc::new(Mutex::new(Some(sink))),
                reports,
                cancel: token,
            })
        }))
    }

    /// Opens a download of the file `remote`, read chunk by chunk.
    #[napi]
    pub fn download_stream<'e>(
        &self,
        env: &'e Env,
        sandbox: String,
        remote: String,
        progress: Option<ProgressJsFn>,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeDownloadSource>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let reports = Reports::new(progress);
        env.spawn_future(guard(async move {
            let options = reports.options(call.options.clone(), None);
            let token = call.token.clone();
            let source = call
                .run(client.download_stream(&sandbox, &remote, &options))
                .await?;
            Ok(NativeDownloadSource {
                size: source.size() as f64,
                source_path: source.source().to_owned(),
                source: Arc::new(Mutex::new(Some(source))),
                reports,
                cancel: token,
            })
        }))
    }

    /// The whole file `remote` (at most the core's 64 MiB).
    #[napi]
    pub fn read_file<'e>(
        &self,
        env: &'e Env,
        sandbox: String,
        remote: String,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, Buffer>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let data = call
                .run(client.read_file(&sandbox, &remote, options))
                .await?;
            Ok(Buffer::from(data))
        }))
    }

    /// Writes `data` as the file `remote` (mode 0644), atomically.
    #[napi]
    pub fn write_file<'e>(
        &self,
        env: &'e Env,
        sandbox: String,
        remote: String,
        data: Buffer,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeTransferSummary>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        // Copied here: the Buffer's memory belongs to JavaScript.
        let data = data.to_vec();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            call.run(client.write_file(&sandbox, &remote, &data, options))
                .await
                .map(summary)
        }))
    }
}

/// Runs `fut` unless `token` is cancelled first.
async fn unless_cancelled<T>(
    token: &CancellationToken,
    fut: impl std::future::Future<Output = std::result::Result<T, Error>>,
) -> std::result::Result<T, Error> {
    tokio::select! {
        biased;
        _ = token.cancelled() => Err(Error::Cancelled),
        out = fut => out,
    }
}

/// An upload of bytes from JavaScript to one file.
#[napi]
pub struct NativeUploadSink {
    sink: Arc<Mutex<Option<UploadSink>>>,
    target: String,
    reports: Reports,
    cancel: CancellationToken,
}

#[napi]
impl NativeUploadSink {
    /// The absolute path the file will have.
    #[napi(getter)]
    pub fn target(&self) -> String {
        self.target.clone()
    }

    /// Sends `data`; resolves once the core has taken it (it waits while
    /// its requests in flight are unanswered).
    #[napi]
    pub fn write<'e>(&self, env: &'e Env, data: Buffer) -> Result<PromiseRaw<'e, ()>> {
        let sink = Arc::clone(&self.sink);
        let token = self.cancel.clone();
        // Copied here: the Buffer's memory belongs to JavaScript.
        let data = Bytes::from(data.to_vec());
        env.spawn_future(guard(async move {
            let mut guard = sink.lock().await;
            let Some(sink) = guard.as_mut() else {
                return Err(ended());
            };
            let written = unless_cancelled(&token, sink.write(data)).await;
            if written.is_err() {
                // A failed upload has removed its temp file; nothing more goes.
                guard.take();
            }
            written
        }))
    }

    /// Sends the rest and renames the file into place.
    #[napi]
    pub fn finish<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, NativeTransferSummary>> {
        let sink = Arc::clone(&self.sink);
        let token = self.cancel.clone();
        let reports = self.reports.clone();
        env.spawn_future(guard(async move {
            let Some(sink) = sink.lock().await.take() else {
                return Err(ended());
            };
            let done = unless_cancelled(&token, sink.finish()).await;
            reports.flush().await;
            done.map(summary)
        }))
    }

    /// Gives the upload up: the temp file is removed, the target is left
    /// as it was. Idempotent.
    #[napi]
    pub fn abort<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, ()>> {
        let sink = Arc::clone(&self.sink);
        env.spawn_future(guard(async move {
            if let Some(sink) = sink.lock().await.take() {
                sink.abort().await;
            }
            Ok::<(), Error>(())
        }))
    }

    /// Cancels the upload at once (a write in flight fails `cancelled`).
    #[napi]
    pub fn cancel(&self) {
        self.cancel.cancel();
        match self.sink.try_lock() {
            Ok(mut sink) => drop(sink.take()),
            Err(_) => {
                let sink = Arc::clone(&self.sink);
                napi::bindgen_prelude::spawn(async move { drop(sink.lock().await.take()) });
            }
        }
    }
}

/// A write or finish after the upload ended (`stream_closed`, as the
/// exec handles report a stream used after its end).
fn ended() -> Error {
    Error::StreamClosed {
        message: "the upload already finished, failed or was cancelled".into(),
    }
}

/// A download of one file, read by JavaScript chunk by chunk.
#[napi]
pub struct NativeDownloadSource {
    source: Arc<Mutex<Option<DownloadSource>>>,
    size: f64,
    source_path: String,
    reports: Reports,
    cancel: CancellationToken,
}

#[napi]
impl NativeDownloadSource {
    /// The file's size when the download started.
    #[napi(getter)]
    pub fn size(&self) -> f64 {
        self.size
    }

    /// The absolute path of the file in the sandbox.
    #[napi(getter)]
    pub fn source(&self) -> String {
        self.source_path.clone()
    }

    /// The next chunk, or `null` at the end (or once closed).
    #[napi]
    pub fn next<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, Option<Buffer>>> {
        let source = Arc::clone(&self.source);
        let token = self.cancel.clone();
        let reports = self.reports.clone();
        env.spawn_future(guard(async move {
            let mut guard = source.lock().await;
            let Some(source) = guard.as_mut() else {
                return Ok(None);
            };
            match unless_cancelled(&token, source.next_chunk()).await {
                Ok(Some(chunk)) => Ok(Some(Buffer::from(chunk.to_vec()))),
                Ok(None) => {
                    guard.take();
                    drop(guard);
                    reports.flush().await;
                    Ok(None)
                }
                Err(err) => {
                    guard.take();
                    Err(err)
                }
            }
        }))
    }

    /// Ends the download (the rest is not read). Idempotent.
    #[napi]
    pub fn close<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, ()>> {
        let source = Arc::clone(&self.source);
        env.spawn_future(guard(async move {
            if let Some(mut source) = source.lock().await.take() {
                source.close().await;
            }
            Ok::<(), Error>(())
        }))
    }

    /// Cancels the download at once (a read in flight fails `cancelled`).
    #[napi]
    pub fn cancel(&self) {
        self.cancel.cancel();
        match self.source.try_lock() {
            Ok(mut source) => drop(source.take()),
            Err(_) => {
                let source = Arc::clone(&self.source);
                napi::bindgen_prelude::spawn(async move { drop(source.lock().await.take()) });
            }
        }
    }
}
