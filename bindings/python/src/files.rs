//! File transfer: the core's `upload` / `download` (paths on this machine:
//! the core reads and writes the files, Python never holds them), the
//! stream forms for Python's bytes and file objects ([`UploadSinkHandle`],
//! [`DownloadSourceHandle`]), and `read_file` / `write_file`.
//!
//! # Progress without the GIL on a worker
//!
//! The core calls a transfer's progress callback on the transfer's task (a
//! tokio worker, at most every 100 ms and once at the end). That callback
//! only stores the latest report in a [`ProgressChannel`] and wakes its
//! reader; it never takes the GIL. Python reads it on a thread of its own:
//!
//! - an async transfer's caller runs a task on its event loop that awaits
//!   [`ProgressChannel::next`] and calls the user's callback there;
//! - a blocking transfer's caller thread, waiting with the GIL released,
//!   takes the GIL every 100 ms anyway (for signals) and then delivers the
//!   latest report to the channel's `deliver` callable
//!   ([`crate::waker::block_ticking`]);
//! - the stream forms, called chunk by chunk, [`ProgressChannel::take`]
//!   the latest report between chunks.
//!
//! Reports that arrive faster than Python reads them are coalesced: only
//! the newest is kept.
//!
//! # Cancellation
//!
//! Cancelling a call (task cancelled, Ctrl-C, client closed) drops the
//! core's transfer: the sandbox's server removes the temp file when its
//! stream ends, so nothing is left half-written. A stream handle's
//! `abort()` / `close()` end it at once; dropping the handle does the same.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use openshell_sdk::{
    CallOptions, Client, DownloadSource, Error, Progress, TransferOptions, TransferSummary,
    UploadSink,
};
use pyo3::prelude::*;
use tokio::sync::Notify;

use crate::waker::{block_ticking, run, spawn};

/// `(files, directories, symlinks, skipped_symlinks, ignored, skipped_other,
/// bytes)`.
pub type WireSummary = (u64, u64, u64, u64, u64, u64, u64);

/// `(bytes_done, bytes_total, files_done, files_total, current)`.
pub type WireProgress = (u64, u64, u64, u64, String);

fn wire_summary(s: TransferSummary) -> WireSummary {
    (
        s.files,
        s.directories,
        s.symlinks,
        s.skipped_symlinks,
        s.ignored,
        s.skipped_other,
        s.bytes,
    )
}

fn wire_progress(p: Progress) -> WireProgress {
    (
        p.bytes_done,
        p.bytes_total,
        p.files_done,
        p.files_total,
        p.current,
    )
}

#[derive(Default)]
struct Latest {
    report: Option<Progress>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    latest: Mutex<Latest>,
    wake: Notify,
}

impl Shared {
    fn post(&self, progress: &Progress) {
        self.latest.lock().unwrap_or_else(|p| p.into_inner()).report = Some(progress.clone());
        self.wake.notify_one();
    }

    fn take(&self) -> Option<Progress> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .report
            .take()
    }
}

/// The latest progress report of one transfer (see the module docs).
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct ProgressChannel {
    shared: Arc<Shared>,
    /// Called with a `WireProgress` by a blocking transfer's ticks.
    deliver: Py<PyAny>,
}

#[pymethods]
impl ProgressChannel {
    #[new]
    fn new(deliver: Py<PyAny>) -> Self {
        Self {
            shared: Arc::default(),
            deliver,
        }
    }

    /// The next report (waits for one), or `None` once closed and read.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shared = Arc::clone(&self.shared);
        spawn(py, async move {
            loop {
                let woken = shared.wake.notified();
                {
                    let mut latest = shared.latest.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some(report) = latest.report.take() {
                        return Ok(Some(wire_progress(report)));
                    }
                    if latest.closed {
                        return Ok(None);
                    }
                }
                woken.await;
            }
        })
    }

    /// The report not read yet, if any; never waits.
    fn take(&self) -> Option<WireProgress> {
        self.shared.take().map(wire_progress)
    }

    /// No more reports come: `next()` answers what is left, then `None`.
    fn close(&self) {
        self.shared
            .latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed = true;
        self.shared.wake.notify_one();
    }
}

impl ProgressChannel {
    /// Delivers the report not read yet to `deliver` (with the GIL).
    fn deliver_latest(&self, py: Python<'_>) -> PyResult<()> {
        match self.shared.take() {
            Some(report) => self.deliver.call1(py, (wire_progress(report),)).map(drop),
            None => Ok(()),
        }
    }
}

/// The core's options of a transfer.
pub fn transfer_options(
    call: CallOptions,
    ignore_file: Option<String>,
    progress: Option<&Py<ProgressChannel>>,
) -> TransferOptions {
    let mut options = TransferOptions::new().call_options(call);
    if let Some(name) = ignore_file {
        options = options.ignore_file(name);
    }
    if let Some(channel) = progress {
        let shared = Arc::clone(&channel.get().shared);
        options = options.progress(move |p| shared.post(p));
    }
    options
}

/// Which way a path transfer goes.
pub enum Direction {
    Up { local: PathBuf, remote: String },
    Down { remote: String, local: PathBuf },
}

/// `Client::upload` / `Client::download` of paths; a blocking caller gets
/// its progress on its own thread (see the module docs).
pub fn transfer<'py>(
    py: Python<'py>,
    blocking: bool,
    client: Client,
    sandbox: String,
    direction: Direction,
    options: TransferOptions,
    progress: Option<Py<ProgressChannel>>,
) -> PyResult<Bound<'py, PyAny>> {
    let fut = async move {
        let summary = match direction {
            Direction::Up { local, remote } => {
                client.upload(&sandbox, &local, &remote, &options).await?
            }
            Direction::Down { remote, local } => {
                client.download(&sandbox, &remote, &local, &options).await?
            }
        };
        Ok(wire_summary(summary))
    };
    match (blocking, progress) {
        (true, Some(channel)) => block_ticking(py, fut, move |py| channel.get().deliver_latest(py)),
        (blocking, _) => run(py, blocking, fut),
    }
}

/// `Client::read_file`: the whole file as `bytes` (at most 64 MiB).
pub fn read_file<'py>(
    py: Python<'py>,
    blocking: bool,
    client: Client,
    sandbox: String,
    remote: String,
    call: CallOptions,
) -> PyResult<Bound<'py, PyAny>> {
    run(py, blocking, async move {
        let data = client.read_file(&sandbox, &remote, call).await?;
        Ok(Bytes::from(data))
    })
}

/// `Client::write_file`.
pub fn write_file<'py>(
    py: Python<'py>,
    blocking: bool,
    client: Client,
    sandbox: String,
    remote: String,
    data: Bytes,
    call: CallOptions,
) -> PyResult<Bound<'py, PyAny>> {
    run(py, blocking, async move {
        let summary = client.write_file(&sandbox, &remote, &data, call).await?;
        Ok(wire_summary(summary))
    })
}

/// `Client::upload_stream`: a handle to write chunks to.
pub fn upload_stream<'py>(
    py: Python<'py>,
    blocking: bool,
    client: Client,
    sandbox: String,
    remote: String,
    options: TransferOptions,
) -> PyResult<Bound<'py, PyAny>> {
    run(py, blocking, async move {
        let sink = client.upload_stream(&sandbox, &remote, &options).await?;
        Ok(UploadSinkHandle {
            target: sink.target().to_owned(),
            sink: Arc::new(tokio::sync::Mutex::new(Some(sink))),
            blocking,
        })
    })
}

/// `Client::download_stream`: a handle to read chunks from.
pub fn download_stream<'py>(
    py: Python<'py>,
    blocking: bool,
    client: Client,
    sandbox: String,
    remote: String,
    options: TransferOptions,
) -> PyResult<Bound<'py, PyAny>> {
    run(py, blocking, async move {
        let source = client.download_stream(&sandbox, &remote, &options).await?;
        Ok(DownloadSourceHandle {
            size: source.size(),
            path: source.source().to_owned(),
            source: Arc::new(tokio::sync::Mutex::new(Some(source))),
            blocking,
        })
    })
}

fn ended(what: &str) -> Error {
    Error::StreamClosed {
        message: format!("the {what} already finished or was aborted"),
    }
}

/// An upload of bytes Python supplies: `write` chunks, then `finish`.
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct UploadSinkHandle {
    /// `None` once finished or aborted.
    sink: Arc<tokio::sync::Mutex<Option<UploadSink>>>,
    target: String,
    blocking: bool,
}

#[pymethods]
impl UploadSinkHandle {
    /// The absolute path the file gets in the sandbox.
    #[getter]
    fn target(&self) -> String {
        self.target.clone()
    }

    /// Sends `data`; waits only while the core's requests in flight are
    /// unanswered. A failure ends the upload (nothing is left behind).
    fn write<'py>(&self, py: Python<'py>, data: Bytes) -> PyResult<Bound<'py, PyAny>> {
        let sink = Arc::clone(&self.sink);
        run(py, self.blocking, async move {
            let mut guard = sink.lock().await;
            let Some(upload) = guard.as_mut() else {
                return Err(ended("upload"));
            };
            let written = upload.write(data).await;
            if written.is_err() {
                // The core ended the upload; nothing more can be written.
                guard.take();
            }
            written
        })
    }

    /// Sends what is buffered and renames the file into place.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sink = Arc::clone(&self.sink);
        run(py, self.blocking, async move {
            let upload = sink.lock().await.take().ok_or_else(|| ended("upload"))?;
            Ok(wire_summary(upload.finish().await?))
        })
    }

    /// Gives the upload up: the temp file is removed, any file at the
    /// target stays as it was. Idempotent; returns at once.
    fn abort(&self) {
        let sink = Arc::clone(&self.sink);
        crate::runtime::handle().spawn(async move {
            let upload = sink.lock().await.take();
            if let Some(upload) = upload {
                upload.abort().await;
            }
        });
    }
}

/// A download Python reads chunk by chunk.
#[pyclass(frozen, module = "openshell_sdk._native")]
pub struct DownloadSourceHandle {
    /// `None` once closed.
    source: Arc<tokio::sync::Mutex<Option<DownloadSource>>>,
    size: u64,
    path: String,
    blocking: bool,
}

#[pymethods]
impl DownloadSourceHandle {
    /// The file's size when the download started.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The absolute path of the file in the sandbox.
    #[getter]
    fn source(&self) -> String {
        self.path.clone()
    }

    /// The next chunk (at most 256 KiB), `None` at the end.
    fn next_chunk<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let source = Arc::clone(&self.source);
        run(py, self.blocking, async move {
            let mut guard = source.lock().await;
            let Some(download) = guard.as_mut() else {
                return Ok(None);
            };
            let chunk = download.next_chunk().await;
            if !matches!(chunk, Ok(Some(_))) {
                guard.take();
            }
            chunk
        })
    }

    /// Ends the download (the rest is not read). Idempotent; returns at once.
    fn close(&self) {
        let source = Arc::clone(&self.source);
        crate::runtime::handle().spawn(async move {
            let download = source.lock().await.take();
            if let Some(mut download) = download {
                download.close().await;
            }
        });
    }
}
