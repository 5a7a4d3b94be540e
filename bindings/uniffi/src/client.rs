//! [`OpenShellClient`]: one core [`Client`] with the curated operations the
//! JVM SDK wraps (health, sandboxes, exec, routing counters).
//!
//! Timeouts cross as milliseconds (`None`: the client's default deadline for
//! unary calls and `wait_ready`, none for streams; `0`: no deadline). Every
//! call's cancellation token is a child of the client's, so `cancel_all()` ends
//! calls in flight with `cancelled`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use openshell_sdk::{
    AccessToken, CallOptions, CancellationToken, Client, ClientConfig, CreateSandbox,
    ListSandboxes, Sandbox,
};

use crate::errors::{OpenShellError, invalid};
use crate::exec::ExecSession;

/// A per-call `0`: about ten years, longer than any call lives.
const NO_DEADLINE: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// What a [`TokenSource`] hands out.
#[derive(Debug, Clone, uniffi::Record)]
pub struct TokenGrant {
    /// The bearer token.
    pub token: String,
    /// Its lifetime in milliseconds, when known (the core refreshes before).
    pub expires_in_ms: Option<u64>,
}

/// A token provider implemented on the JVM. The core calls it when it needs
/// a token (cached, single flight, forced after `unauthenticated`); it runs
/// on a blocking thread, never on a runtime worker.
#[uniffi::export(with_foreign)]
pub trait TokenSource: Send + Sync {
    /// A token; a fresh one from the source when `force_refresh` is set.
    fn token(&self, force_refresh: bool) -> Result<TokenGrant, OpenShellError>;
}

/// The core's provider over a [`TokenSource`].
struct ForeignTokenProvider(Arc<dyn TokenSource>);

impl openshell_sdk::TokenProvider for ForeignTokenProvider {
    fn token(
        &self,
        force_refresh: bool,
    ) -> BoxFuture<'_, Result<AccessToken, openshell_sdk::Error>> {
        let source = Arc::clone(&self.0);
        Box::pin(async move {
            let grant = tokio::task::spawn_blocking(move || source.token(force_refresh))
                .await
                .map_err(|e| {
                    openshell_sdk::Error::auth(format!("token source failed: {e}"), false)
                })?
                .map_err(OpenShellError::into_core)?;
            let token = AccessToken::new(grant.token);
            Ok(match grant.expires_in_ms {
                Some(ms) if ms > 0 => token.expires_in(Duration::from_millis(ms)),
                _ => token,
            })
        })
    }
}

/// How to connect.
#[derive(Debug, Clone, uniffi::Record)]
pub struct ClientOptions {
    /// `http://host:port` or `https://host:port`.
    pub endpoint: String,
    /// A static bearer token (or use a [`TokenSource`]).
    pub token: Option<String>,
    /// PEM of the CA that signed the gateway's certificate.
    pub ca_pem: Option<Vec<u8>>,
    /// The name the certificate must carry, when not the endpoint's host.
    pub tls_server_name: Option<String>,
    /// Owner routing: send sandbox calls with a hint naming the replica that
    /// holds the sandbox (`true` by default).
    pub owner_routing: bool,
    /// How long a connection attempt may take.
    pub connect_timeout_ms: Option<u64>,
    /// Default deadline of unary calls and waits; `0` means none.
    pub default_timeout_ms: Option<u64>,
    /// Cap of a buffered exec's output, in bytes.
    pub exec_output_limit: Option<u64>,
    /// Send a token over cleartext HTTP (loopback development only).
    pub allow_cleartext_token: bool,
}

/// A sandbox as the gateway reported it.
#[derive(Debug, Clone, uniffi::Record)]
pub struct SandboxInfo {
    pub id: String,
    pub name: String,
    /// `PROVISIONING`, `READY`, `ERROR`, `DELETING`, ...
    pub phase: String,
    pub labels: HashMap<String, String>,
    pub exit_code: Option<i32>,
    pub resource_version: i64,
}

/// A sandbox and the replica holding its session (`None` on a single
/// gateway, or when no replica holds it now).
#[derive(Debug, Clone, uniffi::Record)]
pub struct SandboxWithOwner {
    pub sandbox: SandboxInfo,
    pub owner: Option<String>,
}

/// A sandbox to create; every field is optional.
#[derive(Debug, Clone, uniffi::Record)]
pub struct CreateSandboxRequest {
    pub name: Option<String>,
    pub image: Option<String>,
    pub environment: HashMap<String, String>,
    pub labels: HashMap<String, String>,
}

/// A command to run in a sandbox.
#[derive(Debug, Clone, uniffi::Record)]
pub struct ExecRequest {
    pub sandbox: String,
    pub command: Vec<String>,
    pub workdir: Option<String>,
    pub environment: HashMap<String, String>,
    /// Bytes written to stdin first (then stdin is closed, unless the exec
    /// is interactive).
    pub stdin: Option<Vec<u8>>,
    /// Run time limit of the command (the gateway kills it past this).
    pub exec_timeout_ms: Option<u64>,
    /// Output cap of a buffered exec, in bytes.
    pub output_limit: Option<u64>,
    /// Run the command on a pseudo-terminal (stdout and stderr merged).
    #[uniffi(default = false)]
    pub tty: bool,
    /// The terminal's width (with `tty`).
    #[uniffi(default = 0)]
    pub cols: u32,
    /// The terminal's height (with `tty`).
    #[uniffi(default = 0)]
    pub rows: u32,
}

/// A buffered exec's result.
#[derive(Debug, Clone, uniffi::Record)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The process's exit code (signals as 128+n, an expired timeout 124).
    pub exit_code: i32,
}

/// What `Health` answered.
#[derive(Debug, Clone, uniffi::Record)]
pub struct HealthInfo {
    /// `HEALTHY`, ...
    pub status: String,
    pub version: String,
    /// The replica that answered, if it said.
    pub served_by: Option<String>,
}

/// The client's owner-routing counters.
#[derive(Debug, Clone, uniffi::Record)]
pub struct RoutingStats {
    /// Owner-routed attempts sent with a replica hint.
    pub hinted: i64,
    /// Owner-routed attempts sent without one.
    pub unhinted: i64,
    /// Hinted attempts that never reached a gateway and were retried unhinted.
    pub unrouted_retries: i64,
    /// `GetSandbox` owner lookups sent.
    pub owner_lookups: i64,
    /// Attempts answered from the owner cache.
    pub cache_hits: i64,
}

/// A counter as a signed long (what Java reads without unsigned types).
pub(crate) fn counter(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn millis(value: Option<u64>) -> Option<Duration> {
    value.map(Duration::from_millis)
}

fn proto_name(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_owned()
}

pub(crate) fn sandbox_info(sandbox: Sandbox) -> SandboxInfo {
    SandboxInfo {
        phase: proto_name(sandbox.phase.as_str_name(), "SANDBOX_PHASE_"),
        id: sandbox.id,
        name: sandbox.name,
        labels: sandbox.labels.into_iter().collect(),
        exit_code: sandbox.exit_code,
        resource_version: i64::try_from(sandbox.resource_version).unwrap_or(i64::MAX),
    }
}

fn sorted(map: HashMap<String, String>) -> Vec<(String, String)> {
    let mut pairs: Vec<_> = map.into_iter().collect();
    pairs.sort();
    pairs
}

fn exec_request(request: ExecRequest) -> Result<openshell_sdk::ExecRequest, OpenShellError> {
    let mut out = openshell_sdk::ExecRequest::new(request.sandbox, request.command);
    out.workdir = request.workdir;
    for (k, v) in sorted(request.environment) {
        out = out.env(k, v);
    }
    if let Some(stdin) = request.stdin {
        out = out.stdin(stdin);
    }
    if let Some(t) = millis(request.exec_timeout_ms) {
        out = out.timeout(t);
    }
    if let Some(limit) = request.output_limit {
        let limit = usize::try_from(limit).map_err(|_| invalid("output_limit is too large"))?;
        out = out.output_limit(limit);
    }
    if request.tty {
        out = out.tty(request.cols, request.rows);
    }
    Ok(out)
}

/// Connects to a gateway: checks the options, then dials (`connect` or
/// `tls` when the endpoint cannot be reached).
#[uniffi::export(async_runtime = "tokio")]
pub async fn connect(
    options: ClientOptions,
    token_source: Option<Arc<dyn TokenSource>>,
) -> Result<Arc<OpenShellClient>, OpenShellError> {
    let mut builder = ClientConfig::builder(options.endpoint)
        .owner_routing(options.owner_routing)
        .allow_cleartext_token(options.allow_cleartext_token);
    if let Some(token) = options.token {
        builder = builder.token(token);
    }
    if let Some(source) = token_source {
        builder = builder.token_provider(Arc::new(ForeignTokenProvider(source)));
    }
    if let Some(pem) = options.ca_pem {
        builder = builder.ca_pem(pem);
    }
    if let Some(name) = options.tls_server_name {
        builder = builder.tls_server_name(name);
    }
    if let Some(t) = millis(options.connect_timeout_ms) {
        builder = builder.connect_timeout(t);
    }
    match options.default_timeout_ms {
        Some(0) => builder = builder.default_deadline(None),
        Some(ms) => builder = builder.default_deadline(Some(Duration::from_millis(ms))),
        None => {}
    }
    if let Some(limit) = options.exec_output_limit {
        let limit =
            usize::try_from(limit).map_err(|_| invalid("exec_output_limit is too large"))?;
        builder = builder.exec_output_limit(limit);
    }
    let config = builder.build()?;
    let client = Client::connect(config).await?;
    Ok(Arc::new(OpenShellClient {
        client,
        closed: CancellationToken::new(),
    }))
}

/// A connected client. Cheap to share between threads and coroutines.
#[derive(uniffi::Object)]
pub struct OpenShellClient {
    pub(crate) client: Client,
    pub(crate) closed: CancellationToken,
}

impl OpenShellClient {
    pub(crate) fn options(&self, timeout_ms: Option<u64>) -> (CallOptions, CancellationToken) {
        let token = self.closed.child_token();
        let mut options = CallOptions::new().cancel_token(token.clone());
        match timeout_ms {
            Some(0) => options = options.deadline(NO_DEADLINE),
            Some(ms) => options = options.deadline(Duration::from_millis(ms)),
            None => {}
        }
        (options, token)
    }

    /// Runs `fut` until it ends or the client closes.
    pub(crate) async fn run<T>(
        &self,
        fut: impl Future<Output = Result<T, openshell_sdk::Error>>,
    ) -> Result<T, OpenShellError> {
        tokio::select! {
            biased;
            _ = self.closed.cancelled() => Err(openshell_sdk::Error::Cancelled.into()),
            out = fut => Ok(out?),
        }
    }
}

#[uniffi::export(async_runtime = "tokio")]
impl OpenShellClient {
    /// The endpoint this client calls.
    pub fn endpoint(&self) -> String {
        self.client.config().endpoint().to_string()
    }

    /// Cancels every call and exec of this client, now and later. Idempotent.
    /// (Not `close`: that name is the generated class's `AutoCloseable`.)
    pub fn cancel_all(&self) {
        self.closed.cancel();
    }

    /// Whether `cancel_all()` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    pub async fn health(&self, timeout_ms: Option<u64>) -> Result<HealthInfo, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let health = self.run(self.client.health(options)).await?;
        Ok(HealthInfo {
            status: proto_name(health.status.as_str_name(), "SERVICE_STATUS_"),
            version: health.version,
            served_by: health.served_by,
        })
    }

    pub async fn create_sandbox(
        &self,
        request: CreateSandboxRequest,
        timeout_ms: Option<u64>,
    ) -> Result<SandboxInfo, OpenShellError> {
        let mut create = CreateSandbox::new();
        if let Some(name) = request.name {
            create = create.name(name);
        }
        if let Some(image) = request.image {
            create = create.image(image);
        }
        for (k, v) in sorted(request.environment) {
            create = create.env(k, v);
        }
        for (k, v) in sorted(request.labels) {
            create = create.label(k, v);
        }
        let (options, _) = self.options(timeout_ms);
        let sandboxes = self.client.sandboxes();
        Ok(sandbox_info(
            self.run(sandboxes.create(create, options)).await?,
        ))
    }

    pub async fn get_sandbox(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<SandboxInfo, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let sandboxes = self.client.sandboxes();
        Ok(sandbox_info(self.run(sandboxes.get(&name, options)).await?))
    }

    /// Gets a sandbox and the replica holding it (refreshes the owner cache).
    pub async fn get_sandbox_with_owner(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<SandboxWithOwner, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let sandboxes = self.client.sandboxes();
        let (sandbox, owner) = self.run(sandboxes.get_with_owner(&name, options)).await?;
        Ok(SandboxWithOwner {
            sandbox: sandbox_info(sandbox),
            owner,
        })
    }

    /// Every page of the listing, optionally filtered by a label selector.
    pub async fn list_sandboxes(
        &self,
        label_selector: Option<String>,
        timeout_ms: Option<u64>,
    ) -> Result<Vec<SandboxInfo>, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let filter = ListSandboxes {
            label_selector,
            page_size: None,
        };
        let list = self
            .run(self.client.sandboxes().list(filter, options))
            .await?;
        Ok(list.into_iter().map(sandbox_info).collect())
    }

    /// Deletes a sandbox; the outcome's name (`COMPLETED`, `ACCEPTED`, `ALREADY_ABSENT`).
    pub async fn delete_sandbox(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<String, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let sandboxes = self.client.sandboxes();
        let outcome = self.run(sandboxes.delete(&name, options)).await?;
        Ok(proto_name(outcome.as_str_name(), "DELETION_OUTCOME_"))
    }

    /// Waits until the sandbox is READY (`failed_precondition` if it failed).
    pub async fn wait_ready(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<SandboxInfo, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let sandboxes = self.client.sandboxes();
        Ok(sandbox_info(
            self.run(sandboxes.wait_ready(&name, options)).await?,
        ))
    }

    /// Waits until the sandbox is gone.
    pub async fn wait_deleted(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<(), OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let sandboxes = self.client.sandboxes();
        self.run(sandboxes.wait_deleted(&name, options)).await
    }

    /// Runs a command and collects its output (under the output cap).
    pub async fn exec(
        &self,
        request: ExecRequest,
        timeout_ms: Option<u64>,
    ) -> Result<ExecOutput, OpenShellError> {
        let request = exec_request(request)?;
        let (options, _) = self.options(timeout_ms);
        let out = self.run(self.client.exec(request, options)).await?;
        Ok(ExecOutput {
            stdout: out.stdout.to_vec(),
            stderr: out.stderr.to_vec(),
            exit_code: out.exit_code,
        })
    }

    /// Runs a command and streams its events (no stdin after `request.stdin`).
    pub async fn exec_stream(
        &self,
        request: ExecRequest,
        timeout_ms: Option<u64>,
    ) -> Result<Arc<ExecSession>, OpenShellError> {
        let request = exec_request(request)?;
        let (options, token) = self.options(timeout_ms);
        let stream = self.run(self.client.exec_stream(request, options)).await?;
        Ok(Arc::new(ExecSession::new(None, stream, token)))
    }

    /// Starts a command whose stdin stays open: `write` and `close_stdin`.
    pub async fn exec_interactive(
        &self,
        request: ExecRequest,
        timeout_ms: Option<u64>,
    ) -> Result<Arc<ExecSession>, OpenShellError> {
        let request = exec_request(request)?;
        let (options, token) = self.options(timeout_ms);
        let interactive = self
            .run(self.client.exec_interactive(request, options))
            .await?;
        let (input, events) = interactive.into_parts();
        Ok(Arc::new(ExecSession::new(Some(input), events, token)))
    }

    /// The client's owner-routing counters.
    pub fn routing_stats(&self) -> RoutingStats {
        let s = self.client.routing_stats();
        RoutingStats {
            hinted: counter(s.hinted),
            unhinted: counter(s.unhinted),
            unrouted_retries: counter(s.unrouted_retries),
            owner_lookups: counter(s.owner_lookups),
            cache_hits: counter(s.cache_hits),
        }
    }
}
