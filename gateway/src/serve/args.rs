//! The `serve` command line: every flag of one replica, and what follows
//! from them alone (user tokens, the paths sandboxes must not see).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;

use crate::config::delivery::{self, DeliveryMode};
use crate::sandboxes::HostLostPolicy;
use crate::sandboxes::driver::{DriverKind, IsolationArg};
use crate::sandboxes::limits::{self, Limits, LimitsMode};
use crate::secret::Secret;

/// Default of `--max-streams-per-connection`: far above what one SDK
/// client or an edge connection carries, low enough to bound one peer.
pub const DEFAULT_STREAMS_PER_CONNECTION: u32 = 4096;

// Secrets are `Secret`s: `Debug` redacts them.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:17670")]
    pub listen: SocketAddr,
    /// Prometheus `/metrics` listen address.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub metrics_listen: SocketAddr,
    /// Directory for the SQLite store and sandbox directories. Replicas on
    /// one host may share it.
    #[arg(long, default_value = "openshell-data")]
    pub data_dir: PathBuf,
    /// Store URL: `sqlite://PATH` (default `<data-dir>/gateway.db`) or
    /// `postgres://...` for replicas on several hosts.
    #[arg(long, env = "OPENSHELL_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<Secret>,
    /// Connections in the store's pool. Config build permits follow it
    /// (2 x, at least 4).
    #[arg(long, default_value_t = crate::store::POOL_SIZE,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub database_max_connections: u32,
    /// Deadline of every store call (waiting for a connection included);
    /// PostgreSQL's `statement_timeout` too. A call past it answers
    /// UNAVAILABLE.
    #[arg(long, default_value_t = crate::store::DEFAULT_DEADLINE.as_millis() as u64,
          value_parser = clap::value_parser!(u64).range(100..=600_000))]
    pub database_timeout_ms: u64,
    /// Shared secret of the cluster's peer service. Setting it makes this
    /// replica a cluster member.
    #[arg(long, env = "OPENSHELL_PEER_TOKEN", hide_env_values = true)]
    pub peer_token: Option<Secret>,
    /// URL other replicas and redirected supervisors use to reach this
    /// replica (default: its listen address).
    #[arg(long)]
    pub peer_endpoint: Option<String>,
    /// Heartbeat period advertised to supervisors; a session silent for
    /// three periods (at least 15 s) is closed.
    #[arg(long, default_value_t = 15_000, hide = true)]
    pub heartbeat_ms: u64,
    /// A supervisor session with messages queued whose stream the
    /// transport has not polled for this long (its supervisor stopped
    /// reading) is closed.
    #[arg(long, default_value_t = crate::sessions::DRAIN_TIMEOUT.as_millis() as u64, hide = true)]
    pub session_drain_timeout_ms: u64,
    /// How often membership is refreshed.
    #[arg(long, default_value_t = 10_000, hide = true)]
    pub member_refresh_ms: u64,
    /// How long a member stays live without a refresh (database time).
    #[arg(long, default_value_t = 30_000, hide = true)]
    pub member_ttl_ms: u64,
    /// This replica's id, sent as `x-openshell-served-by`.
    #[arg(long, default_value = "gw-0")]
    pub replica_id: String,
    /// A user bearer token (repeatable).
    #[arg(
        long = "token",
        env = "OPENSHELL_GATEWAY_TOKENS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub tokens: Vec<Secret>,
    /// File with one user token per line.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// No user authentication. Only allowed on a loopback listen address.
    #[arg(long)]
    pub dev: bool,
    /// Allow the hidden test and benchmark flags (`--driver none`, the
    /// `--*-ms` tuning knobs); without it they are refused. Never in
    /// production.
    #[arg(long)]
    pub allow_test_flags: bool,
    /// PEM certificate chain; serve TLS with --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// The supervisor binary (default: next to this binary).
    #[arg(long)]
    pub supervisor_bin: Option<PathBuf>,
    /// URL supervisors dial (default: this replica's listen address).
    #[arg(long)]
    pub supervisor_url: Option<String>,
    /// CA file supervisors trust for an https supervisor URL (default: --tls-cert).
    #[arg(long)]
    pub supervisor_ca: Option<PathBuf>,
    /// CA file (PEM) this replica trusts for other replicas' https peer
    /// endpoints: peer relays and config notifications (default:
    /// --supervisor-ca, else --tls-cert, else the system roots).
    #[arg(long)]
    pub peer_ca: Option<PathBuf>,
    /// Concurrent HTTP/2 streams one client connection may open (further
    /// streams wait for a free slot on the client side).
    #[arg(long, default_value_t = DEFAULT_STREAMS_PER_CONNECTION, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_streams_per_connection: u32,
    /// Concurrent execs (exec and interactive exec) per sandbox on the
    /// replica holding its session; more answer RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = crate::sessions::caps::DEFAULT_EXECS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_execs_per_sandbox: u32,
    /// Concurrent relays of every kind (execs and TCP forwards, SSH
    /// included) per sandbox; more answer RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = crate::sessions::caps::DEFAULT_RELAYS, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_relays_per_sandbox: u32,
    /// Lifetime of a CreateSshSession token, in seconds; 0: tokens never
    /// expire (RevokeSshSession or deleting the sandbox still ends them).
    #[arg(long, default_value_t = crate::api::ssh_sessions::DEFAULT_TTL_SECS)]
    pub ssh_session_ttl_secs: u64,
    /// How often ended (expired or revoked) SSH sessions are deleted from
    /// the store, a bounded batch per pass.
    #[arg(long, default_value_t = crate::api::ssh_sessions::DEFAULT_PURGE_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub ssh_session_purge_secs: u64,
    /// Log lines kept per sandbox (its supervisor's and the gateway's about
    /// it), the newest; they live as long as the sandbox. A watcher or
    /// reader behind what was trimmed is told so (OUT_OF_RANGE).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub sandbox_log_lines: u32,
    /// Take the address clients dialled (the gateway address of
    /// CreateSshSession) from the edge's `x-openshell-forwarded-authority`
    /// header. For replicas that sit behind the built-in edge, which
    /// replaces any copy a client sends.
    #[arg(long)]
    pub trust_forwarded_authority: bool,
    /// Stop every supervisor when the gateway exits (they restart with it).
    #[arg(long)]
    pub stop_sandboxes_on_exit: bool,
    /// Stop every supervisor when the gateway exits after the process that
    /// started it died (`up` passes it: a dead `up` takes the sandboxes
    /// with it, while one replica that `up` stops leaves them to the
    /// others).
    #[arg(long)]
    pub stop_sandboxes_if_orphaned: bool,
    /// Test fault: a JSON file `{"delay_ms": N, "down": bool}`, re-read
    /// every 100 ms (`up --control stdin` writes it on `slow-store` and
    /// `cut-store`): every store call waits `delay_ms` first, and while
    /// `down` fails after its deadline as on a frozen database. No file: no
    /// fault.
    #[arg(long, hide = true)]
    pub store_fault_file: Option<PathBuf>,
    /// Write `{"grpc":..,"metrics":..,"replica_id":..,"pid":..}` here once serving.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// How supervisors get configuration changes: `poll` (they ask every
    /// 10 s) or `push` (this replica pushes each change over the session to
    /// supervisors that support it). Setting poll and restarting rolls back.
    #[arg(
        long,
        value_enum,
        env = "OPENSHELL_CONFIG_DELIVERY_MODE",
        default_value = "poll"
    )]
    pub config_delivery_mode: DeliveryMode,
    /// Interval of the per-session config reconcile (push mode).
    #[arg(long, default_value_t = delivery::RECONCILE_INTERVAL.as_millis() as u64, hide = true)]
    pub config_reconcile_ms: u64,
    /// How long owner lookups for config notifications are cached.
    #[arg(long, default_value_t = delivery::OWNER_CACHE_TTL.as_millis() as u64, hide = true)]
    pub config_owner_cache_ms: u64,
    /// Tests and benchmarks only: every push build waits this long (holding
    /// its build permit) before reading the store, as a slow store would.
    #[arg(long, default_value_t = 0, hide = true)]
    pub config_build_delay_ms: u64,
    /// Tests only: answer PeerNotifyConfigUpdate with UNIMPLEMENTED, as a
    /// replica from before push config does (senders count
    /// `unsupported_peer`).
    #[arg(long, hide = true)]
    pub no_peer_config_notify: bool,
    /// Tests only: answer PeerRelayFrames with UNIMPLEMENTED, as a replica
    /// from before it does (requesters fall back to PeerRelay).
    #[arg(long, hide = true)]
    pub no_peer_relay_frames: bool,
    /// How sandboxes run: `process` (one supervisor process per sandbox,
    /// started by this replica) or `hosts` (each new sandbox is assigned to
    /// the connected shared supervisor host serving the fewest; see
    /// `host-token`). Tests and benchmarks only (needs `--allow-test-flags`):
    /// `none` creates sandbox records and directories but starts no
    /// supervisor, and writes each sandbox's token to
    /// `<data-dir>/sandboxes/<id>/token` (mode 0600) so that a test can run
    /// the supervisor side itself.
    #[arg(long, value_enum, default_value = "process")]
    pub driver: DriverKind,
    /// `--driver hosts`: seconds a supervisor host may have no session
    /// before it counts as lost and `--host-lost-policy` applies to its
    /// sandboxes (at least 20: a live host's seat is renewed every 5 s at
    /// most, and a silent session is closed after 15 s).
    #[arg(long, value_name = "SECONDS", default_value_t = 45,
          value_parser = clap::value_parser!(u64).range(20..=86_400))]
    pub host_lost_after: u64,
    /// Test knob: `--host-lost-after` in milliseconds, below its minimum.
    #[arg(long, hide = true)]
    pub host_lost_after_ms: Option<u64>,
    /// What becomes of a lost host's sandboxes: `restart` starts each again
    /// on a live host with room (condition `HostLost`, reason `Restarted`;
    /// their files stayed on the lost host), `error` leaves them assigned
    /// to it in phase ERROR until it returns.
    #[arg(long, value_enum, default_value = "restart")]
    pub host_lost_policy: HostLostPolicy,
    /// How sandbox processes are isolated: `namespaces` (their own user, PID
    /// and mount namespaces as an unprivileged uid, the data directory and
    /// the gateway's secret files hidden; needs root), `none`, or `auto`
    /// (namespaces where available, else none with a warning).
    #[arg(long, value_enum, env = "OPENSHELL_ISOLATION", default_value = "auto")]
    pub isolation: IsolationArg,
    /// A resource limit this host cannot enforce (no writable cgroup
    /// controller for it): `auto` runs the sandbox without it (condition
    /// `LimitsNotEnforced`, metric
    /// `openshell_server_sandbox_limits_unenforced_total`), `required`
    /// refuses the sandbox (FAILED_PRECONDITION).
    #[arg(long, value_enum, default_value = "auto")]
    pub resource_limits: LimitsMode,
    /// An IPv4 network (`a.b.c.d/n`) no sandbox may reach, whatever its
    /// network policy allows (repeatable): the database's, the other
    /// replicas', the edge's. This host's own addresses, link-local ones
    /// and the gateway's are always denied.
    #[arg(long, value_name = "CIDR", value_parser = parse_cidr)]
    pub sandbox_egress_deny: Vec<String>,
    /// Benchmarks only: isolated sandboxes get every namespace but the
    /// network one (they keep the host's network), to measure what the
    /// network namespace alone costs.
    #[arg(long, hide = true)]
    pub sandbox_host_network: bool,
    /// Memory limit of a sandbox whose template sets none (`512Mi`, `2Gi`;
    /// `0`: none).
    #[arg(long, value_name = "QUANTITY", default_value = "4Gi",
          value_parser = |s: &str| optional(s, limits::parse_memory))]
    pub sandbox_memory: Optional,
    /// CPU limit of a sandbox whose template sets none (`500m`, `2`; `0`:
    /// none).
    #[arg(long, value_name = "QUANTITY", default_value = "0",
          value_parser = |s: &str| optional(s, limits::parse_cpu))]
    pub sandbox_cpu: Optional,
    /// Process (and thread) limit of a sandbox whose template sets none
    /// (`0`: none).
    #[arg(long, value_name = "N", default_value = "1024",
          value_parser = |s: &str| optional(s, limits::parse_pids))]
    pub sandbox_pids: Optional,
    /// Tests only: keep a copy of each sandbox token in
    /// `<data-dir>/sandboxes/<id>/token` (mode 0600, hidden from sandboxes)
    /// so a test can act as the sandbox's supervisor.
    #[arg(long, hide = true)]
    pub expose_sandbox_tokens: bool,
    /// Tests only: write the final `/metrics` text to
    /// `DIR/<replica id>.metrics` as the replica exits (after its shutdown
    /// redirects), so a test can read the counters of a replica that is gone.
    #[arg(long, value_name = "DIR", hide = true)]
    pub metrics_on_exit: Option<PathBuf>,
}

fn parse_cidr(text: &str) -> Result<String, String> {
    let (addr, prefix) = text.split_once('/').unwrap_or((text, "32"));
    let ok =
        addr.parse::<std::net::Ipv4Addr>().is_ok() && prefix.parse::<u8>().is_ok_and(|p| p <= 32);
    if ok {
        Ok(format!("{addr}/{prefix}"))
    } else {
        Err(format!("{text:?} is not an IPv4 network (a.b.c.d/n)"))
    }
}

/// A default limit: `0` is none.
pub type Optional = Option<u64>;

fn optional(text: &str, parse: fn(&str) -> Result<u64, String>) -> Result<Optional, String> {
    if text.trim() == "0" {
        return Ok(None);
    }
    parse(text.trim()).map(Some)
}

impl ServeArgs {
    /// `--host-lost-after` (or its test knob in milliseconds).
    pub fn host_lost_after(&self) -> std::time::Duration {
        match self.host_lost_after_ms {
            Some(ms) => std::time::Duration::from_millis(ms.max(1)),
            None => std::time::Duration::from_secs(self.host_lost_after),
        }
    }
}

/// The `--sandbox-*` defaults.
pub fn default_limits(args: &ServeArgs) -> Limits {
    Limits {
        memory: args.sandbox_memory,
        cpu_millis: args.sandbox_cpu,
        pids: args.sandbox_pids,
    }
}

/// What sandbox processes must not see besides the data directory: the
/// store when it lives elsewhere, the tokens file, the TLS key.
pub fn hidden_paths(args: &ServeArgs, data_dir: &Path) -> Vec<PathBuf> {
    let mut hide = Vec::new();
    if let Some(path) = args
        .database_url
        .as_ref()
        .and_then(|url| url.expose().strip_prefix("sqlite://"))
        .map(|rest| rest.split('?').next().unwrap_or(rest))
        .and_then(|path| std::path::absolute(path).ok())
        .filter(|path| !path.starts_with(data_dir))
    {
        // The database and its -wal and -shm companions.
        hide.extend(path.parent().map(Path::to_path_buf));
    }
    for file in [&args.tokens_file, &args.tls_key].into_iter().flatten() {
        hide.extend(std::path::absolute(file).ok());
    }
    hide
}

pub fn user_tokens(args: &ServeArgs) -> anyhow::Result<Vec<String>> {
    let mut tokens: Vec<String> = args
        .tokens
        .iter()
        .map(|t| t.expose().trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect();
    if let Some(path) = &args.tokens_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading tokens file {}", path.display()))?;
        tokens.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned),
        );
    }
    Ok(tokens)
}
