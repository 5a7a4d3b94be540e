//! `NativeClient`: one core [`Client`] with the curated operations and the
//! raw boundary, each returning a Promise.
//!
//! Every method that touches the core is synchronous only up to
//! `env.spawn_future`: it checks its arguments, clones what the future
//! needs and hands the future to napi's tokio runtime, so no export runs
//! core code outside a runtime ("no reactor running") and a `&CancelToken`
//! argument can be borrowed. Timeouts cross as milliseconds, 64-bit
//! counters as `bigint`, messages as encoded protobuf `Buffer`s.
//!
//! # Cancellation
//!
//! napi's `AbortSignal` support only reaches its thread-pool tasks, so each
//! call takes an optional native [`CancelToken`] that `@openshell/sdk`
//! cancels from the caller's `AbortSignal`. Cancelling drops the core
//! future, which resets the RPC (for exec, the gateway kills the process
//! group). `close()` cancels the parent token of every call's token: calls
//! and handles in flight end with `cancelled`, and so does every later call.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use napi::bindgen_prelude::{BigInt, Buffer, PromiseRaw};
use napi::{Env, Result};
use napi_derive::napi;
use openshell_sdk::{
    CallOptions, CancellationToken, Client, ClientConfig, CreateSandbox, ExecRequest,
    ForwardTarget, ListSandboxes, Metadata,
};

use crate::errors::{guard, guard_sync, invalid, to_napi};
use crate::handles::{
    EventState, NativeExecStream, NativeForward, NativeInteractive, NativeRawStream, NativeWatch,
};
use crate::token::{JsTokenProvider, ProviderFn};
use crate::values::{NativeExecOutput, NativeSandbox, native_sandbox, pairs};

/// A cancellation token for one call, cancelled from JavaScript.
#[napi]
pub struct CancelToken {
    pub(crate) inner: CancellationToken,
}

impl Default for CancelToken {
    fn default() -> Self {
        Self::new()
    }
}

#[napi]
impl CancelToken {
    #[napi(constructor)]
    pub fn new() -> Self {
        Self {
            inner: CancellationToken::new(),
        }
    }

    /// Cancels the call (idempotent; safe from any callback).
    #[napi]
    pub fn cancel(&self) {
        self.inner.cancel();
    }

    #[napi(getter)]
    pub fn cancelled(&self) -> bool {
        self.inner.is_cancelled()
    }
}

/// The client configuration `@openshell/sdk` passes.
#[napi(object)]
pub struct NativeClientOptions {
    pub endpoint: String,
    pub token: Option<String>,
    pub ca_pem: Option<Buffer>,
    pub tls_server_name: Option<String>,
    pub connect_timeout_ms: Option<f64>,
    /// Default deadline of a call; 0 means none.
    pub timeout_ms: Option<f64>,
    pub exec_output_limit: Option<f64>,
    pub allow_cleartext_token: Option<bool>,
}

#[napi(object)]
pub struct NativeCreate {
    pub name: Option<String>,
    pub image: Option<String>,
    pub environment: Option<HashMap<String, String>>,
    pub command: Option<Vec<String>>,
    pub labels: Option<HashMap<String, String>>,
    pub tty: Option<bool>,
}

#[napi(object)]
pub struct NativeExecRequest {
    pub sandbox: String,
    pub command: Vec<String>,
    pub workdir: Option<String>,
    pub environment: Option<HashMap<String, String>>,
    pub stdin: Option<Buffer>,
    pub tty: Option<bool>,
    pub cols: Option<u32>,
    pub rows: Option<u32>,
    /// Run time limit of the command (the gateway kills it past this).
    pub exec_timeout_ms: Option<f64>,
    pub output_limit: Option<f64>,
}

#[napi(object)]
pub struct NativeHealth {
    pub status: String,
    pub version: String,
    pub served_by: Option<String>,
}

/// An SSH session as `CreateSshSession` issued it (`@openshell/sdk` keeps
/// the token out of what inspection and JSON print).
#[napi(object)]
pub struct NativeSshSession {
    pub sandbox_id: String,
    pub token: String,
    pub host_key_fingerprint: String,
    /// Milliseconds since the epoch; absent when the token never expires.
    pub expires_at_ms: Option<f64>,
    pub gateway_host: String,
    pub gateway_port: u32,
    pub gateway_scheme: String,
}

#[napi(object)]
pub struct NativeRoutingStats {
    pub hinted: BigInt,
    pub unhinted: BigInt,
    pub unrouted_retries: BigInt,
    pub owner_lookups: BigInt,
    pub cache_hits: BigInt,
}

#[napi(object)]
pub struct NativeRawResponse {
    pub bytes: Buffer,
    pub metadata: Vec<Vec<String>>,
}

/// A per-call `timeoutMs: 0`: about ten years, longer than any call lives
/// (and within what the `grpc-timeout` header can carry).
const NO_DEADLINE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

pub(crate) fn millis(what: &str, value: Option<f64>) -> Result<Option<Duration>> {
    match value {
        None => Ok(None),
        Some(ms) if ms.is_finite() && ms > 0.0 => Ok(Some(Duration::from_secs_f64(ms / 1000.0))),
        Some(_) => Err(invalid(format!(
            "{what} must be a positive number of milliseconds"
        ))),
    }
}

fn limit(what: &str, value: Option<f64>) -> Result<Option<usize>> {
    match value {
        None => Ok(None),
        Some(n) if n.is_finite() && n >= 1.0 && n.fract() == 0.0 => Ok(Some(n as usize)),
        Some(_) => Err(invalid(format!("{what} must be a positive whole number"))),
    }
}

fn metadata_of(pairs: Option<Vec<Vec<String>>>) -> Result<Metadata> {
    let mut out = Vec::new();
    for pair in pairs.unwrap_or_default() {
        match <[String; 2]>::try_from(pair) {
            Ok([k, v]) => out.push((k, v)),
            Err(_) => return Err(invalid("metadata entries must be [key, value] pairs")),
        }
    }
    Ok(Metadata::from(out))
}

/// One call's options and its cancellation.
pub(crate) struct Call {
    pub(crate) options: CallOptions,
    /// The call's own token (a child of the client's).
    pub(crate) token: CancellationToken,
    /// The caller's token (from its `AbortSignal`), if any.
    user: Option<CancellationToken>,
}

impl Call {
    /// Runs `fut` until it ends or the caller cancels; either cancellation
    /// drops `fut`, which cancels the RPC.
    pub(crate) async fn run<T>(
        self,
        fut: impl std::future::Future<Output = std::result::Result<T, openshell_sdk::Error>>,
    ) -> std::result::Result<T, openshell_sdk::Error> {
        let user = self.user.unwrap_or_default();
        let token = self.token;
        tokio::select! {
            biased;
            _ = user.cancelled() => Err(openshell_sdk::Error::Cancelled),
            _ = token.cancelled() => Err(openshell_sdk::Error::Cancelled),
            out = fut => out,
        }
    }
}

#[napi]
pub struct NativeClient {
    config: ClientConfig,
    pub(crate) client: Client,
    closed: CancellationToken,
}

impl NativeClient {
    pub(crate) fn call(
        &self,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<Call> {
        let token = self.closed.child_token();
        let mut options = CallOptions::new().cancel_token(token.clone());
        match timeout_ms {
            // 0: no deadline for this call, as for the client's `timeoutMs`.
            // The core has no per-call "none" that overrides the client's
            // default, so this is a deadline no call reaches.
            Some(0.0) => options = options.deadline(NO_DEADLINE),
            other => {
                if let Some(d) = millis("timeoutMs", other)? {
                    options = options.deadline(d);
                }
            }
        }
        Ok(Call {
            options,
            token,
            user: cancel.map(|c| c.inner.clone()),
        })
    }
}

fn exec_request(request: NativeExecRequest) -> Result<ExecRequest> {
    let mut out = ExecRequest::new(request.sandbox, request.command);
    out.workdir = request.workdir;
    out.environment = request
        .environment
        .unwrap_or_default()
        .into_iter()
        .collect();
    if let Some(stdin) = request.stdin {
        out.stdin = bytes::Bytes::from(stdin.to_vec());
    }
    out.tty = request.tty.unwrap_or(false);
    out.cols = request.cols.unwrap_or(0);
    out.rows = request.rows.unwrap_or(0);
    out.timeout = millis("execTimeoutMs", request.exec_timeout_ms)?;
    out.output_limit = limit("outputLimit", request.output_limit)?;
    Ok(out)
}

#[napi]
impl NativeClient {
    /// Builds a client; nothing connects until the first call. A provider
    /// is held weakly: it never keeps the process alive.
    #[napi(constructor)]
    pub fn new(
        env: &Env,
        options: NativeClientOptions,
        token_provider: Option<ProviderFn>,
    ) -> Result<Self> {
        guard_sync(|| {
            let mut builder = ClientConfig::builder(options.endpoint)
                .allow_cleartext_token(options.allow_cleartext_token.unwrap_or(false));
            if let Some(token) = options.token {
                builder = builder.token(token);
            }
            if let Some(provider) = token_provider {
                builder = builder.token_provider(Arc::new(JsTokenProvider::new(provider)));
            }
            if let Some(pem) = options.ca_pem {
                builder = builder.ca_pem(pem.to_vec());
            }
            if let Some(name) = options.tls_server_name {
                builder = builder.tls_server_name(name);
            }
            if let Some(t) = millis("connectTimeoutMs", options.connect_timeout_ms)? {
                builder = builder.connect_timeout(t);
            }
            match options.timeout_ms {
                Some(0.0) => builder = builder.default_deadline(None),
                other => {
                    if let Some(t) = millis("timeoutMs", other)? {
                        builder = builder.default_deadline(Some(t));
                    }
                }
            }
            if let Some(n) = limit("execOutputLimit", options.exec_output_limit)? {
                builder = builder.exec_output_limit(n);
            }
            let config = builder.build().map_err(|e| to_napi(&e))?;
            // connect_lazy does no I/O but needs a runtime context.
            let client = napi::bindgen_prelude::block_on(Client::connect_lazy(config.clone()))
                .map_err(|e| to_napi(&e))?;
            let _ = env;
            Ok(Self {
                config,
                client,
                closed: CancellationToken::new(),
            })
        })
    }

    #[napi(getter)]
    pub fn endpoint(&self) -> String {
        self.config.endpoint().to_string()
    }

    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Cancels every call, stream and forward of this client, now and later.
    #[napi]
    pub fn close(&self) {
        self.closed.cancel();
    }

    #[napi]
    pub fn health<'e>(
        &self,
        env: &'e Env,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeHealth>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let h = call.run(client.health(options)).await?;
            let status = h.status.as_str_name();
            Ok(NativeHealth {
                status: status
                    .strip_prefix("SERVICE_STATUS_")
                    .unwrap_or(status)
                    .to_owned(),
                version: h.version,
                served_by: h.served_by,
            })
        }))
    }

    #[napi]
    pub fn create_sandbox<'e>(
        &self,
        env: &'e Env,
        request: NativeCreate,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeSandbox>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let mut create = CreateSandbox::new().tty(request.tty.unwrap_or(false));
        if let Some(name) = request.name {
            create = create.name(name);
        }
        if let Some(image) = request.image {
            create = create.image(image);
        }
        let mut env_vars: Vec<_> = request
            .environment
            .unwrap_or_default()
            .into_iter()
            .collect();
        env_vars.sort();
        for (k, v) in env_vars {
            create = create.env(k, v);
        }
        if let Some(command) = request.command {
            create = create.command(command);
        }
        let mut labels: Vec<_> = request.labels.unwrap_or_default().into_iter().collect();
        labels.sort();
        for (k, v) in labels {
            create = create.label(k, v);
        }
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let sandbox = call.run(client.sandboxes().create(create, options)).await?;
            Ok(native_sandbox(sandbox))
        }))
    }

    #[napi]
    pub fn get_sandbox<'e>(
        &self,
        env: &'e Env,
        name: String,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeSandbox>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let sandboxes = client.sandboxes();
            Ok(native_sandbox(
                call.run(sandboxes.get(&name, options)).await?,
            ))
        }))
    }

    /// Every page of the listing.
    #[napi]
    pub fn list_sandboxes<'e>(
        &self,
        env: &'e Env,
        label_selector: Option<String>,
        page_size: Option<u32>,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, Vec<NativeSandbox>>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let filter = ListSandboxes {
            label_selector,
            page_size,
        };
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let list = call.run(client.sandboxes().list(filter, options)).await?;
            Ok(list.into_iter().map(native_sandbox).collect::<Vec<_>>())
        }))
    }

    /// Deletes a sandbox; resolves to the outcome's name (`DELETED`, ...).
    #[napi]
    pub fn delete_sandbox<'e>(
        &self,
        env: &'e Env,
        name: String,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, String>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let sandboxes = client.sandboxes();
            let outcome = call.run(sandboxes.delete(&name, options)).await?;
            let outcome = outcome.as_str_name();
            Ok(outcome
                .strip_prefix("DELETION_OUTCOME_")
                .unwrap_or(outcome)
                .to_owned())
        }))
    }

    #[napi]
    pub fn wait_ready<'e>(
        &self,
        env: &'e Env,
        name: String,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeSandbox>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let sandboxes = client.sandboxes();
            Ok(native_sandbox(
                call.run(sandboxes.wait_ready(&name, options)).await?,
            ))
        }))
    }

    #[napi]
    pub fn wait_deleted<'e>(
        &self,
        env: &'e Env,
        name: String,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, ()>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let sandboxes = client.sandboxes();
            call.run(sandboxes.wait_deleted(&name, options)).await
        }))
    }

    /// Snapshots of one sandbox as they change.
    #[napi]
    pub fn watch<'e>(
        &self,
        env: &'e Env,
        name: String,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeWatch>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let token = call.token.clone();
            let sandboxes = client.sandboxes();
            let watch = call.run(sandboxes.watch(&name, options)).await?;
            Ok(NativeWatch::new(watch, token))
        }))
    }

    /// Buffered exec: output collected in Rust under the output cap.
    #[napi]
    pub fn exec<'e>(
        &self,
        env: &'e Env,
        request: NativeExecRequest,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeExecOutput>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let request = exec_request(request)?;
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let out = call.run(client.exec(request, options)).await?;
            Ok(NativeExecOutput {
                stdout: Buffer::from(out.stdout),
                stderr: Buffer::from(out.stderr),
                exit_code: out.exit_code,
            })
        }))
    }

    /// Streaming exec: a handle whose `nextBatch()` yields event batches.
    #[napi]
    pub fn exec_stream<'e>(
        &self,
        env: &'e Env,
        request: NativeExecRequest,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeExecStream>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let request = exec_request(request)?;
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let token = call.token.clone();
            let stream = call.run(client.exec_stream(request, options)).await?;
            Ok(NativeExecStream {
                events: EventState::shared(stream),
                cancel: token,
            })
        }))
    }

    /// Interactive exec: stdin, resize and event batches.
    #[napi]
    pub fn exec_interactive<'e>(
        &self,
        env: &'e Env,
        request: NativeExecRequest,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeInteractive>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let request = exec_request(request)?;
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let token = call.token.clone();
            let interactive = call.run(client.exec_interactive(request, options)).await?;
            let (input, events) = interactive.into_parts();
            Ok(NativeInteractive {
                input,
                events: EventState::shared(events),
                cancel: token,
            })
        }))
    }

    /// Forwards a local listener to `remotePort` of the sandbox's host;
    /// each connection's stream carries `sshSessionToken` when given.
    #[napi]
    #[allow(clippy::too_many_arguments)]
    pub fn forward<'e>(
        &self,
        env: &'e Env,
        sandbox: String,
        remote_port: u32,
        local_address: Option<String>,
        ssh_session_token: Option<String>,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeForward>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let port = u16::try_from(remote_port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| invalid("remotePort must be between 1 and 65535"))?;
        let local = local_address.unwrap_or_else(|| "127.0.0.1:0".to_owned());
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let forward = client.forward_to(
                &sandbox,
                ForwardTarget::Tcp(port),
                ssh_session_token.as_deref(),
                local,
                options,
            );
            let handle = call.run(forward).await?;
            Ok(NativeForward {
                handle: Arc::new(handle),
            })
        }))
    }

    /// Issues an SSH session token for `sandbox`.
    #[napi]
    pub fn create_ssh_session<'e>(
        &self,
        env: &'e Env,
        sandbox: String,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeSshSession>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let s = call
                .run(client.create_ssh_session(&sandbox, options))
                .await?;
            let expires_at_ms = s.expires_at.map(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis() as f64
            });
            Ok(NativeSshSession {
                sandbox_id: s.sandbox_id,
                token: s.token,
                host_key_fingerprint: s.host_key_fingerprint,
                expires_at_ms,
                gateway_host: s.gateway_host,
                gateway_port: u32::from(s.gateway_port),
                gateway_scheme: s.gateway_scheme,
            })
        }))
    }

    /// Revokes an SSH session token; resolves to whether it was live.
    #[napi]
    pub fn revoke_ssh_session<'e>(
        &self,
        env: &'e Env,
        token: String,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, bool>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            call.run(client.revoke_ssh_session(&token, options)).await
        }))
    }

    /// Raw unary call through the core (owner routing applies).
    #[napi]
    pub fn raw_unary<'e>(
        &self,
        env: &'e Env,
        path: String,
        request: Buffer,
        metadata: Option<Vec<Vec<String>>>,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeRawResponse>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let metadata = metadata_of(metadata)?;
        let request = bytes::Bytes::from(request.to_vec());
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let answer = call
                .run(client.raw_unary(&path, request, metadata, options))
                .await?;
            Ok(NativeRawResponse {
                bytes: Buffer::from(answer.bytes.to_vec()),
                metadata: pairs(&answer.metadata),
            })
        }))
    }

    /// Raw stream on any method: a handle to send, receive and cancel.
    #[napi]
    pub fn raw_stream<'e>(
        &self,
        env: &'e Env,
        path: String,
        metadata: Option<Vec<Vec<String>>>,
        timeout_ms: Option<f64>,
        cancel: Option<&CancelToken>,
    ) -> Result<PromiseRaw<'e, NativeRawStream>> {
        let call = self.call(timeout_ms, cancel)?;
        let client = self.client.clone();
        let metadata = metadata_of(metadata)?;
        env.spawn_future(guard(async move {
            let options = call.options.clone();
            let token = call.token.clone();
            let stream = call
                .run(client.raw_stream(&path, metadata, options))
                .await?;
            Ok(NativeRawStream::new(stream, token))
        }))
    }

    /// Owner-routing counters of the core client.
    #[napi]
    pub fn routing_stats(&self) -> NativeRoutingStats {
        let s = self.client.routing_stats();
        NativeRoutingStats {
            hinted: BigInt::from(s.hinted),
            unhinted: BigInt::from(s.unhinted),
            unrouted_retries: BigInt::from(s.unrouted_retries),
            owner_lookups: BigInt::from(s.owner_lookups),
            cache_hits: BigInt::from(s.cache_hits),
        }
    }
}
