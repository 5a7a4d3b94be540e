//! The client: construction, the token provider, unary operations, raw
//! calls, forwards and routing counters.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use openshell_sdk::proto as pb;
use openshell_sdk::{
    AccessToken, CancellationToken, Client, ClientConfig, CreateSandbox, Error, ForwardHandle,
    ForwardTarget, ListSandboxes, Metadata, TokenProvider,
};
use prost::Message;
use tokio::sync::oneshot;

use crate::call::{Call, CallCancel, OsCallOptions, OsClient, decode, exec_request};
use crate::complete::{OsCallback, Outcome, start};
use crate::stream::{log_line_proto, log_query, open_stream, raw_stream};
use crate::types::{
    ErrorParts, OS_ERROR, OS_INVALID, OS_OK, OsBytes, OsErrorBox, OsOwnedBytes, guard_sync,
    put_error, runtime,
};

/// `openshell_client_call` op: `HealthRequest` → `HealthResponse`.
pub const OS_OP_HEALTH: u32 = 1;
/// `CreateSandboxRequest` → `Sandbox`.
pub const OS_OP_CREATE: u32 = 2;
/// `GetSandboxRequest` → `Sandbox` (owner-routed).
pub const OS_OP_GET: u32 = 3;
/// `ListSandboxesRequest` → `ListSandboxesResponse` with every page.
pub const OS_OP_LIST: u32 = 4;
/// `DeleteSandboxRequest` → `DeleteSandboxResponse`.
pub const OS_OP_DELETE: u32 = 5;
/// `GetSandboxRequest` → `Sandbox` once READY (error if it failed).
pub const OS_OP_WAIT_READY: u32 = 6;
/// `GetSandboxRequest` → empty once the sandbox is gone.
pub const OS_OP_WAIT_DELETED: u32 = 7;
/// `ExecSandboxRequest` → the output, as length-delimited
/// `ExecSandboxEvent`s: all stdout, all stderr, then the exit.
pub const OS_OP_EXEC: u32 = 8;
/// `GetSandboxLogsRequest` → `GetSandboxLogsResponse`: the sandbox's
/// recorded log lines, oldest first (`lines`, `since_ms`, `sources` and
/// `min_level` filter; 0 and empty: unset).
pub const OS_OP_LOGS: u32 = 9;

/// The token provider: called on a runtime thread when the core needs a
/// token (`force_refresh` after an `UNAUTHENTICATED` answer). It must not
/// block: it answers later, from any thread, with
/// [`openshell_token_reply`], exactly once per `reply`.
pub type OsTokenCallback =
    Option<unsafe extern "C" fn(user_data: usize, force_refresh: bool, reply: *mut OsTokenReply)>;

/// Client settings, passed by value; empty values mean "not set".
#[repr(C)]
pub struct OsClientOptions {
    /// `http://host:port` or `https://host:port`.
    pub endpoint: OsBytes,
    /// A static bearer token.
    pub token: OsBytes,
    /// PEM of the CA that signs the gateway's certificate.
    pub ca_pem: OsBytes,
    /// Name to check on the gateway's certificate.
    pub tls_server_name: OsBytes,
    /// 0: the library default.
    pub connect_timeout_ms: u64,
    /// Default deadline of unary calls: 0 the library default, -1 none.
    pub default_timeout_ms: i64,
    /// Cap on buffered exec output; 0: the library default.
    pub exec_output_limit: u64,
    /// Send a token over cleartext HTTP (loopback development only).
    pub allow_cleartext_token: bool,
    /// Called for tokens when set (instead of `token`).
    pub token_provider: OsTokenCallback,
    /// Passed back to `token_provider`.
    pub token_provider_data: usize,
}

/// The answer slot of one token-provider call; consumed by
/// [`openshell_token_reply`].
pub struct OsTokenReply(oneshot::Sender<Result<AccessToken, Error>>);

struct CallbackProvider {
    callback: unsafe extern "C" fn(usize, bool, *mut OsTokenReply),
    user_data: usize,
}

impl TokenProvider for CallbackProvider {
    fn token(&self, force_refresh: bool) -> BoxFuture<'_, Result<AccessToken, Error>> {
        Box::pin(async move {
            let (tx, rx) = oneshot::channel();
            let callback = self.callback;
            let user_data = self.user_data;
            let called = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let reply = Box::into_raw(Box::new(OsTokenReply(tx)));
                unsafe { callback(user_data, force_refresh, reply) }
            }));
            if called.is_err() {
                return Err(Error::auth("token provider could not be called", false));
            }
            rx.await
                .unwrap_or_else(|_| Err(Error::auth("token provider never answered", false)))
        })
    }
}

/// Answers a token-provider call and frees `reply`. A non-empty `error`
/// fails the call (`auth`, retryable as told); otherwise `token` is the
/// token, valid for `expires_in_ms` (0: unknown).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_token_reply(
    reply: *mut OsTokenReply,
    token: OsBytes,
    expires_in_ms: u64,
    error: OsBytes,
    retryable: bool,
) -> i32 {
    if reply.is_null() {
        return OS_INVALID;
    }
    guard_sync(|| {
        let reply = unsafe { Box::from_raw(reply) };
        let answer = (|| {
            let error = String::from_utf8_lossy(&unsafe { error.to_vec() }).into_owned();
            if !error.is_empty() {
                return Err(Error::auth(
                    format!("token provider failed: {error}"),
                    retryable,
                ));
            }
            let token = unsafe { token.to_string("token") }?;
            if token.is_empty() {
                return Err(Error::auth("token provider returned no token", false));
            }
            let token = AccessToken::new(token);
            Ok(if expires_in_ms > 0 {
                token.expires_in(Duration::from_millis(expires_in_ms))
            } else {
                token
            })
        })();
        let _ = reply.0.send(answer);
        OS_OK
    })
}

fn config_of(options: &OsClientOptions) -> Result<ClientConfig, Error> {
    let endpoint = unsafe { options.endpoint.to_string("endpoint") }?;
    let mut builder =
        ClientConfig::builder(endpoint).allow_cleartext_token(options.allow_cleartext_token);
    if let Some(token) = unsafe { options.token.to_opt_string("token") }? {
        builder = builder.token(token);
    }
    if let Some(callback) = options.token_provider {
        builder = builder.token_provider(Arc::new(CallbackProvider {
            callback,
            user_data: options.token_provider_data,
        }));
    }
    let pem = unsafe { options.ca_pem.to_vec() };
    if !pem.is_empty() {
        builder = builder.ca_pem(pem);
    }
    if let Some(name) = unsafe { options.tls_server_name.to_opt_string("tls server name") }? {
        builder = builder.tls_server_name(name);
    }
    if options.connect_timeout_ms > 0 {
        builder = builder.connect_timeout(Duration::from_millis(options.connect_timeout_ms));
    }
    match options.default_timeout_ms {
        0 => {}
        t if t < 0 => builder = builder.default_deadline(None),
        t => builder = builder.default_deadline(Some(Duration::from_millis(t as u64))),
    }
    if options.exec_output_limit > 0 {
        builder = builder.exec_output_limit(options.exec_output_limit as usize);
    }
    builder.build()
}

/// Builds a client; nothing connects until the first call. On success
/// writes `*out` and returns [`OS_OK`]; on a bad setting writes `*error`
/// (when not null) and returns [`OS_ERROR`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_new(
    options: OsClientOptions,
    out: *mut *mut OsClient,
    error: *mut *mut OsErrorBox,
) -> i32 {
    if out.is_null() {
        return OS_INVALID;
    }
    guard_sync(|| {
        let built =
            config_of(&options).and_then(|config| runtime().block_on(Client::connect_lazy(config)));
        match built {
            Ok(client) => {
                let handle = OsClient {
                    client,
                    closed: CancellationToken::new(),
                };
                unsafe { *out = Box::into_raw(Box::new(handle)) };
                OS_OK
            }
            Err(err) => {
                unsafe { put_error(error, ErrorParts::of(&err)) };
                OS_ERROR
            }
        }
    })
}

/// Cancels every call, stream and forward of the client, now and later.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_close(client: *const OsClient) {
    if let Some(c) = unsafe { client.as_ref() } {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| c.closed.cancel()));
    }
}

/// Closes and frees a client (null is ignored). Streams and forwards it
/// made stay valid handles (closed) until freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_free(client: *mut OsClient) {
    if !client.is_null() {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let c = unsafe { Box::from_raw(client) };
            c.closed.cancel();
            drop(c);
        }));
    }
}

fn create_request(bytes: &[u8]) -> Result<CreateSandbox, Error> {
    let r: pb::CreateSandboxRequest = decode(bytes, "CreateSandboxRequest")?;
    let mut create = CreateSandbox::new();
    if !r.name.is_empty() {
        create = create.name(r.name);
    }
    if !r.request_id.is_empty() {
        create = create.request_id(r.request_id);
    }
    let mut labels: Vec<_> = r.labels.into_iter().collect();
    labels.sort();
    for (k, v) in labels {
        create = create.label(k, v);
    }
    if let Some(spec) = r.spec {
        if let Some(template) = spec.template {
            create = create.template(template);
        }
        let mut env: Vec<_> = spec.environment.into_iter().collect();
        env.sort();
        for (k, v) in env {
            create = create.env(k, v);
        }
        if !spec.command.is_empty() {
            create = create.command(spec.command);
        }
        create = create.tty(spec.tty);
    }
    Ok(create)
}

fn delimited(events: &[pb::ExecSandboxEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in events {
        e.encode_length_delimited(&mut out)
            .expect("a Vec grows as needed");
    }
    out
}

async fn run_op(client: Client, op: u32, request: Vec<u8>, call: Call) -> Result<Outcome, Error> {
    use pb::exec_sandbox_event::Payload;
    let options = call.options.clone();
    let sandboxes = client.sandboxes();
    let token = call.token.clone();
    let value = match op {
        OS_OP_HEALTH => {
            let h = Call::run(&token, client.health(options)).await?;
            pb::HealthResponse {
                status: h.status as i32,
                version: h.version,
            }
            .encode_to_vec()
        }
        OS_OP_CREATE => {
            let create = create_request(&request)?;
            let s = Call::run(&token, sandboxes.create(create, options)).await?;
            s.proto.encode_to_vec()
        }
        OS_OP_GET | OS_OP_WAIT_READY | OS_OP_WAIT_DELETED => {
            let r: pb::GetSandboxRequest = decode(&request, "GetSandboxRequest")?;
            match op {
                OS_OP_GET => Call::run(&token, sandboxes.get(&r.name, options))
                    .await?
                    .proto
                    .encode_to_vec(),
                OS_OP_WAIT_READY => Call::run(&token, sandboxes.wait_ready(&r.name, options))
                    .await?
                    .proto
                    .encode_to_vec(),
                _ => {
                    Call::run(&token, sandboxes.wait_deleted(&r.name, options)).await?;
                    Vec::new()
                }
            }
        }
        OS_OP_LIST => {
            let r: pb::ListSandboxesRequest = decode(&request, "ListSandboxesRequest")?;
            let filter = ListSandboxes {
                label_selector: (!r.label_selector.is_empty()).then_some(r.label_selector),
                page_size: u32::try_from(r.page_size).ok().filter(|n| *n > 0),
            };
            let list = Call::run(&token, sandboxes.list(filter, options)).await?;
            pb::ListSandboxesResponse {
                sandboxes: list.into_iter().map(|s| s.proto).collect(),
                ..Default::default()
            }
            .encode_to_vec()
        }
        OS_OP_DELETE => {
            let r: pb::DeleteSandboxRequest = decode(&request, "DeleteSandboxRequest")?;
            let outcome = Call::run(&token, sandboxes.delete(&r.name, options)).await?;
            pb::DeleteSandboxResponse {
                outcome: outcome as i32,
                ..Default::default()
            }
            .encode_to_vec()
        }
        OS_OP_EXEC => {
            let request = exec_request(&request, call.output_limit)?;
            let out = Call::run(&token, client.exec(request, options)).await?;
            delimited(&[
                pb::ExecSandboxEvent {
                    payload: Some(Payload::Stdout(pb::ExecSandboxStdout {
                        data: out.stdout.to_vec(),
                    })),
                },
                pb::ExecSandboxEvent {
                    payload: Some(Payload::Stderr(pb::ExecSandboxStderr {
                        data: out.stderr.to_vec(),
                    })),
                },
                pb::ExecSandboxEvent {
                    payload: Some(Payload::Exit(pb::ExecSandboxExit {
                        exit_code: out.exit_code,
                        oom_killed: false,
                    })),
                },
            ])
        }
        OS_OP_LOGS => {
            let r: pb::GetSandboxLogsRequest = decode(&request, "GetSandboxLogsRequest")?;
            let since = (r.since_ms > 0).then(|| {
                std::time::SystemTime::UNIX_EPOCH + Duration::from_millis(r.since_ms as u64)
            });
            let query = log_query(r.lines, since, r.sources, r.min_level);
            let logs = Call::run(&token, sandboxes.logs(&r.sandbox, &query, options)).await?;
            pb::GetSandboxLogsResponse {
                logs: logs.lines.into_iter().map(log_line_proto).collect(),
                buffer_total: logs.buffer_total,
            }
            .encode_to_vec()
        }
        other => {
            return Err(Error::invalid_config(format!("unknown operation {other}")));
        }
    };
    Ok(Outcome::Value(value))
}

/// Runs a curated operation (`OS_OP_*`) with its encoded request; the
/// completion's `value` is the encoded response.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_call(
    client: *const OsClient,
    op: u32,
    request: OsBytes,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let call = Call::new(c, &options);
        let request = unsafe { request.to_vec() };
        let client = c.client.clone();
        async move { run_op(client, op, request, call).await }
    })
}

/// [`openshell_client_call`] on the calling thread: drives the operation
/// to its end and returns [`OS_OK`] with the encoded response in `*out`
/// (free it with `openshell_bytes_free`), or [`OS_ERROR`] with `*error`.
/// It blocks the calling thread (a cancel token cancelled from another
/// thread still ends it at once); never call it from a completion callback.
/// It saves the hand-offs to and from the runtime's threads that an async
/// call makes (what a Go call through cgo pays per call).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_call_blocking(
    client: *const OsClient,
    op: u32,
    request: OsBytes,
    options: OsCallOptions,
    out: *mut OsOwnedBytes,
    error: *mut *mut OsErrorBox,
) -> i32 {
    let (Some(c), false) = (unsafe { client.as_ref() }, out.is_null()) else {
        return OS_INVALID;
    };
    guard_sync(|| {
        let call = Call::new(c, &options);
        let request = unsafe { request.to_vec() };
        let fut = run_op(c.client.clone(), op, request, call);
        match runtime().block_on(fut) {
            Ok(Outcome::Value(bytes)) => {
                unsafe { *out = OsOwnedBytes::from_vec(bytes) };
                OS_OK
            }
            Ok(_) => unreachable!("operations answer with a value"),
            Err(err) => {
                unsafe { put_error(error, ErrorParts::of(&err)) };
                OS_ERROR
            }
        }
    })
}

/// `OS_STREAM_*`: opens a stream; the completion's `handle` is the
/// `OsStream`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_open(
    client: *const OsClient,
    kind: u32,
    request: OsBytes,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let call = Call::new(c, &options);
        let request = unsafe { request.to_vec() };
        let token = call.token.clone();
        let client = c.client.clone();
        async move {
            let out = open_stream(client, kind, request, call).await;
            if out.is_err() {
                token.cancel();
            }
            out
        }
    })
}

/// Metadata as `key \0 value \0` pairs.
pub(crate) fn metadata_of(bytes: &[u8]) -> Result<Metadata, Error> {
    if bytes.is_empty() {
        return Ok(Metadata::new());
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Error::invalid_config("metadata is not valid UTF-8"))?;
    let parts: Vec<&str> = text
        .strip_suffix('\0')
        .unwrap_or(text)
        .split('\0')
        .collect();
    if !parts.len().is_multiple_of(2) {
        return Err(Error::invalid_config("metadata must be key, value pairs"));
    }
    Ok(Metadata::from(
        parts
            .chunks(2)
            .map(|kv| (kv[0].to_owned(), kv[1].to_owned()))
            .collect::<Vec<_>>(),
    ))
}

/// A unary call of any method by path (`/openshell.v1.OpenShell/GetSandbox`)
/// through the core, so owner routing applies. `metadata` is `key \0 value
/// \0` pairs. The completion's `value` is the encoded response, `served_by`
/// the replica that answered and `metadata` the response metadata.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_raw_unary(
    client: *const OsClient,
    path: OsBytes,
    request: OsBytes,
    metadata: OsBytes,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let call = Call::new(c, &options);
        let path = unsafe { path.to_string("path") };
        let request = bytes::Bytes::from(unsafe { request.to_vec() });
        let metadata = metadata_of(&unsafe { metadata.to_vec() });
        let client = c.client.clone();
        async move {
            let (path, metadata) = (path?, metadata?);
            let token = call.token.clone();
            let answer = Call::run(
                &token,
                client.raw_unary(&path, request, metadata, call.options),
            )
            .await;
            let answer = answer?;
            let served_by = answer.served_by().unwrap_or_default().to_owned();
            let mut metadata = Vec::new();
            for (k, v) in answer.metadata.iter() {
                metadata.extend_from_slice(k.as_bytes());
                metadata.push(0);
                metadata.extend_from_slice(v.as_bytes());
                metadata.push(0);
            }
            Ok(Outcome::Answer(answer.bytes.to_vec(), served_by, metadata))
        }
    })
}

/// [`openshell_client_raw_unary`] on the calling thread (see
/// [`openshell_client_call_blocking`]): [`OS_OK`] with the encoded response
/// in `*out` and the response metadata (`key \0 value \0` pairs) in
/// `*out_metadata`, both freed with `openshell_bytes_free`; or [`OS_ERROR`]
/// with `*error`. `out_metadata` may be NULL: the response metadata is then
/// not copied out (what curated calls that only want the message pass).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_raw_unary_blocking(
    client: *const OsClient,
    path: OsBytes,
    request: OsBytes,
    metadata: OsBytes,
    options: OsCallOptions,
    out: *mut OsOwnedBytes,
    out_metadata: *mut OsOwnedBytes,
    error: *mut *mut OsErrorBox,
) -> i32 {
    let (Some(c), false) = (unsafe { client.as_ref() }, out.is_null()) else {
        return OS_INVALID;
    };
    guard_sync(|| {
        let call = Call::new(c, &options);
        let path = unsafe { path.to_string("path") };
        let request = bytes::Bytes::from(unsafe { request.to_vec() });
        let metadata = metadata_of(&unsafe { metadata.to_vec() });
        let client = c.client.clone();
        let answer = runtime().block_on(async move {
            let (path, metadata) = (path?, metadata?);
            let token = call.token.clone();
            Call::run(
                &token,
                client.raw_unary(&path, request, metadata, call.options),
            )
            .await
        });
        match answer {
            Ok(answer) => {
                if !out_metadata.is_null() {
                    let mut pairs = Vec::new();
                    for (k, v) in answer.metadata.iter() {
                        pairs.extend_from_slice(k.as_bytes());
                        pairs.push(0);
                        pairs.extend_from_slice(v.as_bytes());
                        pairs.push(0);
                    }
                    unsafe { *out_metadata = OsOwnedBytes::from_vec(pairs) };
                }
                // Bytes -> Vec moves the buffer when nothing else shares it.
                unsafe { *out = OsOwnedBytes::from_vec(Vec::from(answer.bytes)) };
                OS_OK
            }
            Err(err) => {
                unsafe { put_error(error, ErrorParts::of(&err)) };
                OS_ERROR
            }
        }
    })
}

/// A stream on any method by path; the completion's `handle` is the
/// `OsStream` (send encoded requests, receive encoded responses).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_raw_stream(
    client: *const OsClient,
    path: OsBytes,
    metadata: OsBytes,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let call = Call::new(c, &options);
        let path = unsafe { path.to_string("path") };
        let metadata = metadata_of(&unsafe { metadata.to_vec() });
        let client = c.client.clone();
        let token = call.token.clone();
        async move {
            let out = match (path, metadata) {
                (Ok(path), Ok(metadata)) => raw_stream(client, path, metadata, call).await,
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            if out.is_err() {
                token.cancel();
            }
            out
        }
    })
}

/// A running forward. Free with [`openshell_forward_free`].
pub struct OsForward {
    handle: Arc<ForwardHandle>,
    token: CallCancel,
}

/// Counters of a forward.
#[repr(C)]
#[derive(Default)]
pub struct OsForwardStats {
    pub connections_accepted: u64,
    pub connections_active: u64,
    pub connections_failed: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// Owner-routing counters of a client.
#[repr(C)]
#[derive(Default)]
pub struct OsRoutingStats {
    pub hinted: u64,
    pub unhinted: u64,
    pub unrouted_retries: u64,
    pub owner_lookups: u64,
    pub cache_hits: u64,
}

/// Forwards a local listener (`local_addr`, default `127.0.0.1:0`) to
/// `remote_port` of the sandbox; the completion's `handle` is the
/// `OsForward`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_forward(
    client: *const OsClient,
    sandbox: OsBytes,
    remote_port: u32,
    local_addr: OsBytes,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    unsafe {
        openshell_client_forward_to(
            client,
            sandbox,
            remote_port,
            OsBytes::empty(),
            local_addr,
            options,
            callback,
            user_data,
        )
    }
}

/// [`openshell_client_forward`] with an SSH session token (from
/// `CreateSshSession`; empty for none) that every connection's stream
/// carries: a client without a user token can then forward to the token's
/// sandbox. The gateway checks the token per connection; a refused
/// connection is closed and counted in `connections_failed`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn openshell_client_forward_to(
    client: *const OsClient,
    sandbox: OsBytes,
    remote_port: u32,
    ssh_session_token: OsBytes,
    local_addr: OsBytes,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let call = Call::new(c, &options);
        let sandbox = unsafe { sandbox.to_string("sandbox") };
        let local = unsafe { local_addr.to_opt_string("local address") };
        let session = unsafe { ssh_session_token.to_opt_string("ssh session token") };
        let client = c.client.clone();
        let token = call.token.clone();
        async move {
            let started = async {
                let sandbox = sandbox?;
                let local = local?.unwrap_or_else(|| "127.0.0.1:0".to_owned());
                let session = session?;
                let port = u16::try_from(remote_port)
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| {
                        Error::invalid_config("remote port must be between 1 and 65535")
                    })?;
                let forward = client.forward_to(
                    &sandbox,
                    ForwardTarget::Tcp(port),
                    session.as_deref(),
                    local,
                    call.options,
                );
                Call::run(&token, forward).await
            };
            let handle = match started.await {
                Ok(handle) => handle,
                Err(e) => {
                    token.cancel();
                    return Err(e);
                }
            };
            // The forward ends when the call's token is cancelled.
            let handle = Arc::new(handle);
            let watched = handle.clone();
            let cancelled = token.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = cancelled.cancelled() => watched.close(),
                    _ = watched.closed() => {}
                }
            });
            let ptr = Box::into_raw(Box::new(OsForward { handle, token }));
            Ok(Outcome::Handle(ptr as usize))
        }
    })
}

/// The forward's local address (`127.0.0.1:PORT`); free with
/// `openshell_bytes_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_forward_local_addr(forward: *const OsForward) -> OsOwnedBytes {
    let empty = || OsOwnedBytes {
        ptr: std::ptr::null_mut(),
        len: 0,
        cap: 0,
    };
    let Some(f) = (unsafe { forward.as_ref() }) else {
        return empty();
    };
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        OsOwnedBytes::from_vec(f.handle.local_addr().to_string().into_bytes())
    }))
    .unwrap_or_else(|_| empty())
}

/// Writes the forward's counters to `*out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_forward_stats(
    forward: *const OsForward,
    out: *mut OsForwardStats,
) -> i32 {
    let (Some(f), false) = (unsafe { forward.as_ref() }, out.is_null()) else {
        return OS_INVALID;
    };
    guard_sync(|| {
        let s = f.handle.stats();
        unsafe {
            *out = OsForwardStats {
                connections_accepted: s.connections_accepted,
                connections_active: s.connections_active,
                connections_failed: s.connections_failed,
                bytes_in: s.bytes_in,
                bytes_out: s.bytes_out,
            }
        };
        OS_OK
    })
}

/// Stops the listener and ends every connection (idempotent).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_forward_close(forward: *const OsForward) {
    if let Some(f) = unsafe { forward.as_ref() } {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| f.handle.close()));
    }
}

/// Closes and frees a forward (null is ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_forward_free(forward: *mut OsForward) {
    if !forward.is_null() {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let f = unsafe { Box::from_raw(forward) };
            f.handle.close();
            f.token.cancel();
            // Dropping a handle needs the runtime (its tasks are aborted).
            let _guard = runtime().enter();
            drop(f);
        }));
    }
}

/// Writes the client's owner-routing counters to `*out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_routing_stats(
    client: *const OsClient,
    out: *mut OsRoutingStats,
) -> i32 {
    let (Some(c), false) = (unsafe { client.as_ref() }, out.is_null()) else {
        return OS_INVALID;
    };
    guard_sync(|| {
        let s = c.client.routing_stats();
        unsafe {
            *out = OsRoutingStats {
                hinted: s.hinted,
                unhinted: s.unhinted,
                unrouted_retries: s.unrouted_retries,
                owner_lookups: s.owner_lookups,
                cache_hits: s.cache_hits,
            }
        };
        OS_OK
    })
}
