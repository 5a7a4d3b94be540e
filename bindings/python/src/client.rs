//! `NativeClient`: one core [`Client`] with the curated operations and the raw
//! boundary, as Python awaitables.
//!
//! Every async method must be called inside a running asyncio loop; it
//! returns an awaitable that drives the core future on the extension's
//! runtime (see [`crate::runtime`]). Messages cross as encoded protobuf
//! `bytes`; metadata as lists of `(key, value)` string pairs; timeouts as
//! float seconds.
//!
//! # Fork
//!
//! A client records the PID that built its core client. Used in a forked
//! child, it builds a new core client from the same configuration on the
//! child's runtime (connecting lazily); the parent's is leaked, never used.
//!
//! # Close
//!
//! `close()` fires a cancellation token that is the parent of every call's
//! token: calls, streams and forwards in flight end with `cancelled`, and so
//! does every later call.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openshell_sdk::{
    CallOptions, CancellationToken, Client, ClientConfig, CreateSandbox, ExecRequest,
    ForwardTarget, ListSandboxes, Metadata,
};
use prost::Message;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{invalid_config, to_py};
use crate::files::{self, ProgressChannel};
use crate::handles::{
    EventState, ExecStreamHandle, InteractiveHandle, NativeForward, RawStreamHandle, WatchHandle,
    wire_output,
};
use crate::logs;
use crate::runtime;
use crate::waker::run;

struct Live {
    pid: u32,
    client: Client,
}

#[pyclass(frozen, module = "openshell_sdk._native", name = "NativeClient")]
pub struct NativeClient {
    config: ClientConfig,
    live: Mutex<Live>,
    closed: CancellationToken,
    /// Calls wait on the calling thread and return completed awaitables
    /// (the sync API) instead of asyncio futures; so do this client's handles.
    blocking: bool,
}

fn seconds(py: Python<'_>, what: &str, value: Option<f64>) -> PyResult<Option<Duration>> {
    match value {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 => Ok(Some(Duration::from_secs_f64(s))),
        Some(_) => Err(invalid_config(
            py,
            format!("{what} must be a positive number of seconds"),
        )),
    }
}

fn metadata(pairs: Vec<(String, String)>) -> Metadata {
    Metadata::from(pairs)
}

fn pairs(metadata: &Metadata) -> Vec<(String, String)> {
    metadata
        .iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

const GET_SANDBOX: &str = "/openshell.v1.OpenShell/GetSandbox";

/// Whether an encoded message has top-level field `number`, read without
/// decoding the message (a malformed one is a `protocol` error).
fn has_field(mut message: &[u8], number: u32) -> Result<bool, openshell_sdk::Error> {
    use prost::encoding::{DecodeContext, decode_key, skip_field};
    let malformed = |e: prost::DecodeError| {
        openshell_sdk::Error::protocol(format!("{GET_SANDBOX}: malformed answer: {e}"))
    };
    while !message.is_empty() {
        let (tag, wire_type) = decode_key(&mut message).map_err(malformed)?;
        if tag == number {
            return Ok(true);
        }
        skip_field(wire_type, tag, &mut message, DecodeContext::default()).map_err(malformed)?;
    }
    Ok(false)
}

fn encode_sandbox(sandbox: &openshell_sdk::Sandbox) -> Bytes {
    Bytes::from(sandbox.proto.encode_to_vec())
}

fn connect_lazy(py: Python<'_>, config: &ClientConfig) -> PyResult<Client> {
    let handle = runtime::handle();
    let config = config.clone();
    // No I/O happens here; the runtime context is what connect_lazy needs.
    py.detach(|| handle.block_on(Client::connect_lazy(config)))
        .map_err(|e| to_py(py, &e))
}

impl NativeClient {
    /// The core client of this process, rebuilt after a fork.
    fn client(&self, py: Python<'_>) -> PyResult<Client> {
        let pid = std::process::id();
        {
            let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            if live.pid == pid {
                return Ok(live.client.clone());
            }
        }
        let fresh = connect_lazy(py, &self.config)?;
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if live.pid != pid {
            let old = std::mem::replace(&mut *live, Live { pid, client: fresh });
            // The parent's channel belongs to a runtime that does not run here.
            std::mem::forget(old);
        }
        Ok(live.client.clone())
    }

    /// Options of a call that hands out no handle: the client's own token
    /// (the core derives the call's token from it), no token of its own.
    fn unary_options(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<CallOptions> {
        let mut options = CallOptions::new().cancel_token(self.closed.clone());
        if let Some(d) = seconds(py, "timeout", timeout)? {
            options = options.deadline(d);
        }
        Ok(options)
    }

    fn options(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<(CallOptions, CancellationToken)> {
        let token = self.closed.child_token();
        let mut options = CallOptions::new().cancel_token(token.clone());
        if let Some(d) = seconds(py, "timeout", timeout)? {
            options = options.deadline(d);
        }
        Ok((options, token))
    }
}

/// The exec request as `openshell_sdk` passes it (a dict with every key).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct ExecArgs {
    sandbox: String,
    command: Vec<String>,
    workdir: Option<String>,
    environment: BTreeMap<String, String>,
    stdin: Option<Bytes>,
    tty: bool,
    cols: u32,
    rows: u32,
    exec_timeout: Option<f64>,
    output_limit: Option<usize>,
}

impl ExecArgs {
    fn into_request(self, py: Python<'_>) -> PyResult<ExecRequest> {
        let mut request = ExecRequest::new(self.sandbox, self.command);
        request.workdir = self.workdir;
        request.environment = self.environment;
        if let Some(stdin) = self.stdin {
            request.stdin = stdin;
        }
        request.tty = self.tty;
        request.cols = self.cols;
        request.rows = self.rows;
        request.timeout = seconds(py, "exec timeout", self.exec_timeout)?;
        request.output_limit = self.output_limit;
        Ok(request)
    }
}

#[pymethods]
impl NativeClient {
    /// Builds a client; no I/O happens until the first call.
    #[new]
    #[pyo3(signature = (
        endpoint,
        *,
        token = None,
        token_provider = None,
        ca_pem = None,
        tls_server_name = None,
        connect_timeout = None,
        default_timeout = None,
        no_default_timeout = false,
        exec_output_limit = None,
        allow_cleartext_token = false,
        blocking = false,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoint: String,
        token: Option<String>,
        token_provider: Option<Py<PyAny>>,
        ca_pem: Option<Bytes>,
        tls_server_name: Option<String>,
        connect_timeout: Option<f64>,
        default_timeout: Option<f64>,
        no_default_timeout: bool,
        exec_output_limit: Option<usize>,
        allow_cleartext_token: bool,
        blocking: bool,
    ) -> PyResult<Self> {
        let mut builder =
            ClientConfig::builder(endpoint).allow_cleartext_token(allow_cleartext_token);
        if let Some(token) = token {
            builder = builder.token(token);
        }
        if let Some(provider) = token_provider {
            builder =
                builder.token_provider(Arc::new(crate::token::PyTokenProvider::new(provider)));
        }
        if let Some(pem) = ca_pem {
            builder = builder.ca_pem(pem.to_vec());
        }
        if let Some(name) = tls_server_name {
            builder = builder.tls_server_name(name);
        }
        if let Some(t) = seconds(py, "connect_timeout", connect_timeout)? {
            builder = builder.connect_timeout(t);
        }
        if no_default_timeout {
            builder = builder.default_deadline(None);
        } else if let Some(t) = seconds(py, "default_timeout", default_timeout)? {
            builder = builder.default_deadline(Some(t));
        }
        if let Some(limit) = exec_output_limit {
            builder = builder.exec_output_limit(limit);
        }
        let config = builder.build().map_err(|e| to_py(py, &e))?;
        let client = connect_lazy(py, &config)?;
        Ok(Self {
            config,
            live: Mutex::new(Live {
                pid: std::process::id(),
                client,
            }),
            closed: CancellationToken::new(),
            blocking,
        })
    }

    /// Whether calls block (the sync API) instead of returning asyncio futures.
    #[getter]
    fn blocking(&self) -> bool {
        self.blocking
    }

    /// The endpoint URI.
    #[getter]
    fn endpoint(&self) -> String {
        self.config.endpoint().to_string()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Cancels every call, stream and forward of this client, now and later.
    fn close(&self) {
        self.closed.cancel();
    }

    /// Connects now (instead of on the first call); fails with `connect` or
    /// `tls` when the endpoint cannot be reached.
    fn connect<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let this = slf.get();
        let config = this.config.clone();
        let closed = this.closed.clone();
        let owner: Py<NativeClient> = slf.clone().unbind();
        let pid = std::process::id();
        run(slf.py(), this.blocking, async move {
            let client = tokio::select! {
                biased;
                _ = closed.cancelled() => Err(openshell_sdk::Error::Cancelled),
                c = Client::connect(config) => c,
            }?;
            // Swap the connected client in (calls already running keep theirs).
            let mut live = owner.get().live.lock().unwrap_or_else(|p| p.into_inner());
            if live.pid == pid {
                live.client = client;
            }
            Ok(())
        })
    }

    /// Liveness: `(status, version, served_by)`.
    #[pyo3(signature = (*, timeout = None))]
    fn health<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        run(py, self.blocking, async move {
            let h = client.health(options).await?;
            Ok((h.status as i32, h.version, h.served_by))
        })
    }

    /// Creates a sandbox; returns the encoded `Sandbox`.
    #[pyo3(signature = (*, name = None, image = None, environment = None, command = None, labels = None, tty = false, timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn create_sandbox<'py>(
        &self,
        py: Python<'py>,
        name: Option<String>,
        image: Option<String>,
        environment: Option<BTreeMap<String, String>>,
        command: Option<Vec<String>>,
        labels: Option<BTreeMap<String, String>>,
        tty: bool,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        let mut request = CreateSandbox::new().tty(tty);
        if let Some(name) = name {
            request = request.name(name);
        }
        if let Some(image) = image {
            request = request.image(image);
        }
        for (k, v) in environment.unwrap_or_default() {
            request = request.env(k, v);
        }
        if let Some(command) = command {
            request = request.command(command);
        }
        for (k, v) in labels.unwrap_or_default() {
            request = request.label(k, v);
        }
        run(py, self.blocking, async move {
            let sandbox = client.sandboxes().create(request, options).await?;
            Ok(encode_sandbox(&sandbox))
        })
    }

    /// Gets a sandbox; returns the encoded `SandboxResponse` as the gateway
    /// sent it (checked to carry a sandbox). One plain RPC: it takes the
    /// raw byte path, so the message is decoded once, in Python.
    #[pyo3(signature = (name, *, timeout = None))]
    fn get_sandbox<'py>(
        &self,
        py: Python<'py>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        let request = Bytes::from(
            openshell_sdk::proto::GetSandboxRequest {
                name,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        run(py, self.blocking, async move {
            let answer = client
                .raw_unary(GET_SANDBOX, request, Metadata::new(), options)
                .await?;
            if !has_field(&answer.bytes, 1)? {
                return Err(openshell_sdk::Error::protocol(format!(
                    "{GET_SANDBOX}: answer without a sandbox"
                )));
            }
            Ok(answer.bytes)
        })
    }

    /// Lists sandboxes over every page; returns encoded `Sandbox`es.
    #[pyo3(signature = (*, label_selector = None, page_size = None, timeout = None))]
    fn list_sandboxes<'py>(
        &self,
        py: Python<'py>,
        label_selector: Option<String>,
        page_size: Option<u32>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        let filter = ListSandboxes {
            label_selector,
            page_size,
        };
        run(py, self.blocking, async move {
            let sandboxes = client.sandboxes().list(filter, options).await?;
            Ok(sandboxes.iter().map(encode_sandbox).collect::<Vec<_>>())
        })
    }

    /// Deletes a sandbox; returns the `DeletionOutcome` number.
    #[pyo3(signature = (name, *, timeout = None))]
    fn delete_sandbox<'py>(
        &self,
        py: Python<'py>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        run(py, self.blocking, async move {
            let outcome = client.sandboxes().delete(&name, options).await?;
            Ok(outcome as i32)
        })
    }

    /// Waits until READY; returns the encoded `Sandbox`.
    #[pyo3(signature = (name, *, timeout = None))]
    fn wait_ready<'py>(
        &self,
        py: Python<'py>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        run(py, self.blocking, async move {
            let sandbox = client.sandboxes().wait_ready(&name, options).await?;
            Ok(encode_sandbox(&sandbox))
        })
    }

    /// Waits until the sandbox no longer exists.
    #[pyo3(signature = (name, *, timeout = None))]
    fn wait_deleted<'py>(
        &self,
        py: Python<'py>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        run(py, self.blocking, async move {
            client.sandboxes().wait_deleted(&name, options).await?;
            Ok(())
        })
    }

    /// Watches a sandbox: a handle whose `next()` yields encoded `Sandbox`es.
    #[pyo3(signature = (name, *, timeout = None))]
    fn watch<'py>(
        &self,
        py: Python<'py>,
        name: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let blocking = self.blocking;
        let client = self.client(py)?;
        let (options, cancel) = self.options(py, timeout)?;
        run(py, self.blocking, async move {
            let watch = client.sandboxes().watch(&name, options).await?;
            Ok(WatchHandle {
                watch: Arc::new(tokio::sync::Mutex::new(Some(watch))),
                cancel,
                blocking,
            })
        })
    }

    /// Buffered exec: `(stdout, stderr, exit_code)`.
    #[pyo3(signature = (request, *, timeout = None))]
    fn exec<'py>(
        &self,
        py: Python<'py>,
        request: ExecArgs,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        let request = request.into_request(py)?;
        run(py, self.blocking, async move {
            Ok(wire_output(client.exec(request, options).await?))
        })
    }

    /// Streaming exec: a handle whose `next_batch()` yields event batches.
    #[pyo3(signature = (request, *, timeout = None))]
    fn exec_stream<'py>(
        &self,
        py: Python<'py>,
        request: ExecArgs,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let blocking = self.blocking;
        let client = self.client(py)?;
        let (options, cancel) = self.options(py, timeout)?;
        let request = request.into_request(py)?;
        run(py, self.blocking, async move {
            let stream = client.exec_stream(request, options).await?;
            Ok(ExecStreamHandle {
                events: Arc::new(tokio::sync::Mutex::new(EventState::new(stream))),
                cancel,
                blocking,
            })
        })
    }

    /// Interactive exec: stdin, resize and event batches.
    #[pyo3(signature = (request, *, timeout = None))]
    fn exec_interactive<'py>(
        &self,
        py: Python<'py>,
        request: ExecArgs,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let blocking = self.blocking;
        let client = self.client(py)?;
        let (options, cancel) = self.options(py, timeout)?;
        let request = request.into_request(py)?;
        run(py, self.blocking, async move {
            let interactive = client.exec_interactive(request, options).await?;
            let (input, events) = interactive.into_parts();
            Ok(InteractiveHandle {
                input,
                events: Arc::new(tokio::sync::Mutex::new(EventState::new(events))),
                cancel,
                blocking,
            })
        })
    }

    /// Forwards `local_address` to `remote_port` inside the sandbox's host;
    /// every connection's stream carries `ssh_session_token` when given.
    #[pyo3(signature = (sandbox, remote_port, *, local_address = "127.0.0.1:0".to_owned(), ssh_session_token = None, timeout = None))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        sandbox: String,
        remote_port: u16,
        local_address: String,
        ssh_session_token: Option<String>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let blocking = self.blocking;
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        run(py, self.blocking, async move {
            let handle = client
                .forward_to(
                    &sandbox,
                    ForwardTarget::Tcp(remote_port),
                    ssh_session_token.as_deref(),
                    local_address,
                    options,
                )
                .await?;
            Ok(NativeForward {
                handle: Arc::new(handle),
                blocking,
            })
        })
    }

    /// Issues an SSH session token for `sandbox`: `(sandbox_id, token,
    /// host_key_fingerprint, expires_at, gateway_host, gateway_port,
    /// gateway_scheme)`, `expires_at` in float seconds since the epoch (or
    /// `None`: no expiry).
    #[pyo3(signature = (sandbox, *, timeout = None))]
    fn create_ssh_session<'py>(
        &self,
        py: Python<'py>,
        sandbox: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        run(py, self.blocking, async move {
            let s = client.create_ssh_session(&sandbox, options).await?;
            let expires_at = s.expires_at.map(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs_f64()
            });
            Ok((
                s.sandbox_id,
                s.token,
                s.host_key_fingerprint,
                expires_at,
                s.gateway_host,
                s.gateway_port,
                s.gateway_scheme,
            ))
        })
    }

    /// Revokes an SSH session token; `True` when it was live.
    #[pyo3(signature = (token, *, timeout = None))]
    fn revoke_ssh_session<'py>(
        &self,
        py: Python<'py>,
        token: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        run(py, self.blocking, async move {
            client.revoke_ssh_session(&token, options).await
        })
    }

    /// Raw unary call: `(response_bytes, response_metadata)`.
    #[pyo3(signature = (path, request, *, metadata = Vec::new(), timeout = None))]
    fn raw_unary<'py>(
        &self,
        py: Python<'py>,
        path: String,
        request: Bytes,
        metadata: Vec<(String, String)>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        run(py, self.blocking, async move {
            let answer = client
                .raw_unary(&path, request, self::metadata(metadata), options)
                .await?;
            Ok((answer.bytes, pairs(&answer.metadata)))
        })
    }

    /// Raw stream on any method: a handle to send, receive, close and cancel.
    #[pyo3(signature = (path, *, metadata = Vec::new(), timeout = None))]
    fn raw_stream<'py>(
        &self,
        py: Python<'py>,
        path: String,
        metadata: Vec<(String, String)>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let blocking = self.blocking;
        let client = self.client(py)?;
        let (options, cancel) = self.options(py, timeout)?;
        run(py, self.blocking, async move {
            let stream = client
                .raw_stream(&path, self::metadata(metadata), options)
                .await?;
            let (sender, receiver) = stream.split();
            Ok(RawStreamHandle {
                sender,
                receiver: Arc::new(tokio::sync::Mutex::new(Some(receiver))),
                trailers: Arc::new(Mutex::new(None)),
                cancel,
                blocking,
            })
        })
    }

    /// Uploads the local file or directory `local` to `remote`:
    /// a `WireSummary`. The core reads the files.
    #[pyo3(signature = (sandbox, local, remote, *, ignore_file = None, progress = None, timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn upload<'py>(
        &self,
        py: Python<'py>,
        sandbox: String,
        local: PathBuf,
        remote: String,
        ignore_file: Option<String>,
        progress: Option<Py<ProgressChannel>>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let (call, _) = self.options(py, timeout)?;
        let options = files::transfer_options(call, ignore_file, progress.as_ref());
        let direction = files::Direction::Up { local, remote };
        files::transfer(
            py,
            self.blocking,
            client,
            sandbox,
            direction,
            options,
            progress,
        )
    }

    /// Downloads the file or directory `remote` to `local`: a `WireSummary`.
    /// The core writes the files.
    #[pyo3(signature = (sandbox, remote, local, *, ignore_file = None, progress = None, timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn download<'py>(
        &self,
        py: Python<'py>,
        sandbox: String,
        remote: String,
        local: PathBuf,
        ignore_file: Option<String>,
        progress: Option<Py<ProgressChannel>>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let (call, _) = self.options(py, timeout)?;
        let options = files::transfer_options(call, ignore_file, progress.as_ref());
        let direction = files::Direction::Down { remote, local };
        files::transfer(
            py,
            self.blocking,
            client,
            sandbox,
            direction,
            options,
            progress,
        )
    }

    /// Starts an upload of chunks Python writes: an `UploadSinkHandle`.
    #[pyo3(signature = (sandbox, remote, *, progress = None, timeout = None))]
    fn upload_stream<'py>(
        &self,
        py: Python<'py>,
        sandbox: String,
        remote: String,
        progress: Option<Py<ProgressChannel>>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let (call, _) = self.options(py, timeout)?;
        let options = files::transfer_options(call, None, progress.as_ref());
        files::upload_stream(py, self.blocking, client, sandbox, remote, options)
    }

    /// Starts a download Python reads chunk by chunk: a `DownloadSourceHandle`.
    #[pyo3(signature = (sandbox, remote, *, progress = None, timeout = None))]
    fn download_stream<'py>(
        &self,
        py: Python<'py>,
        sandbox: String,
        remote: String,
        progress: Option<Py<ProgressChannel>>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let (call, _) = self.options(py, timeout)?;
        let options = files::transfer_options(call, None, progress.as_ref());
        files::download_stream(py, self.blocking, client, sandbox, remote, options)
    }

    /// The whole file `remote` as `bytes` (at most 64 MiB).
    #[pyo3(signature = (sandbox, remote, *, timeout = None))]
    fn read_file<'py>(
        &self,
        py: Python<'py>,
        sandbox: String,
        remote: String,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let (call, _) = self.options(py, timeout)?;
        files::read_file(py, self.blocking, client, sandbox, remote, call)
    }

    /// Writes `data` as the file `remote` (mode 0644): a `WireSummary`.
    #[pyo3(signature = (sandbox, remote, data, *, timeout = None))]
    fn write_file<'py>(
        &self,
        py: Python<'py>,
        sandbox: String,
        remote: String,
        data: Bytes,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let (call, _) = self.options(py, timeout)?;
        files::write_file(py, self.blocking, client, sandbox, remote, data, call)
    }

    /// A sandbox's recorded log lines: `(lines, buffer_total)`.
    #[pyo3(signature = (name, *, tail = None, since_us = None, sources = Vec::new(), min_level = None, timeout = None))]
    #[allow(clippy::too_many_arguments)]
    fn sandbox_logs<'py>(
        &self,
        py: Python<'py>,
        name: String,
        tail: Option<u32>,
        since_us: Option<i64>,
        sources: Vec<String>,
        min_level: Option<String>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let client = self.client(py)?;
        let options = self.unary_options(py, timeout)?;
        let query = logs::log_query(tail, since_us, sources, min_level);
        logs::logs(py, self.blocking, client, name, query, options)
    }

    /// Follows a sandbox (status, logs or both), resuming after breaks: an
    /// `EventWatchHandle`. Returns at once; the stream opens on the first batch.
    #[pyo3(signature = (
        name, *, status = true, logs = false, tail = None, since_us = None, sources = Vec::new(),
        min_level = None, resume_after = None, stop_on_terminal = false, timeout = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn sandbox_events(
        &self,
        py: Python<'_>,
        name: String,
        status: bool,
        logs: bool,
        tail: Option<u32>,
        since_us: Option<i64>,
        sources: Vec<String>,
        min_level: Option<String>,
        resume_after: Option<String>,
        stop_on_terminal: bool,
        timeout: Option<f64>,
    ) -> PyResult<logs::EventWatchHandle> {
        let client = self.client(py)?;
        let (options, cancel) = self.options(py, timeout)?;
        let args = logs::WatchArgs {
            status,
            logs: logs.then(|| logs::log_query(tail, since_us, sources, min_level)),
            resume_after,
            stop_on_terminal,
        };
        Ok(logs::events(
            &client,
            &name,
            args,
            options,
            cancel,
            self.blocking,
        ))
    }

    /// Owner-routing counters of the core client, when the core has them.
    fn routing_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.client(py)?.routing_stats();
        let dict = PyDict::new(py);
        dict.set_item("hinted", stats.hinted)?;
        dict.set_item("unhinted", stats.unhinted)?;
        dict.set_item("unrouted_retries", stats.unrouted_retries)?;
        dict.set_item("owner_lookups", stats.owner_lookups)?;
        dict.set_item("cache_hits", stats.cache_hits)?;
        Ok(dict)
    }

    fn __repr__(&self) -> String {
        format!(
            "NativeClient(endpoint={:?})",
            self.config.endpoint().to_string()
        )
    }
}
