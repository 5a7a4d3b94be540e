//! OpenShell core client: the Rust SDK, and the core the Python binding
//! (`bindings/python`) exports. Rust and Python are the languages served
//! today.
//!
//! # Quick start
//!
//! ```no_run
//! use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecRequest};
//!
//! # async fn run() -> Result<(), openshell_sdk::Error> {
//! // `make up`'s dev cluster; add `.token(...)` for a gateway with auth.
//! let config = ClientConfig::builder("http://127.0.0.1:17670").build()?;
//! let client = Client::connect(config).await?;
//!
//! let sandboxes = client.sandboxes();
//! let sandbox = sandboxes
//!     .create(CreateSandbox::new().image("alpine:3"), CallOptions::new())
//!     .await?;
//! sandboxes.wait_ready(&sandbox.name, CallOptions::new()).await?;
//!
//! let output = client
//!     .exec(ExecRequest::new(&sandbox.name, ["echo", "hello"]), CallOptions::new())
//!     .await?;
//! assert_eq!(output.stdout_text(), "hello\n");
//!
//! sandboxes.delete(&sandbox.name, CallOptions::new()).await?;
//! sandboxes.wait_deleted(&sandbox.name, CallOptions::new()).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Two layers, one call path
//!
//! - **Curated**: [`Client::health`], [`Client::sandboxes`] ([`Sandboxes`]:
//!   create, get, list, delete, wait_ready, wait_deleted, watch),
//!   [`Client::exec`], [`Client::exec_stream`], [`Client::exec_interactive`],
//!   [`Client::forward`], [`Client::forward_io`], [`Client::upload`],
//!   [`Client::download`] (and their stream forms). The data planes of
//!   exec, forward and file transfer run in Rust.
//! - **Raw** ([`raw`]): [`Client::raw_unary`] and [`Client::raw_stream`] call
//!   any method of the proto by path with encoded request bytes and string
//!   metadata. This is the boundary the bindings export; protobuf messages
//!   cross it as bytes and are native objects on each side.
//!
//! The curated layer encodes prost messages and goes through the same
//! internal call functions as the raw layer, so a token refresh, a deadline,
//! a cancellation or an owner-routing hint behaves the same for both.
//!
//! # Cancellation and deadlines
//!
//! Every operation takes [`CallOptions`]: a deadline and a
//! [`CancellationToken`]. Dropping a future or a stream handle cancels the
//! RPC as well. Unary calls and `wait_*` get the client's default deadline
//! when none is set; streams get no deadline unless one is set.
//!
//! # Errors
//!
//! One [`Error`] type with a stable string [`Error::code`] (`not_found`,
//! `unavailable`, `connect`, `tls`, `invalid_config`, `protocol`,
//! `output_limit`, ...), the gRPC code, the message and
//! [`Error::retryable`]. Tokens and environment values never appear in
//! errors, logs or `Debug` output.
//!
//! # Modules
//!
//! | module | purpose |
//! |---|---|
//! | [`metadata`] | request/response metadata pairs |
//! | [`error`] | [`Error`] and its codes |
//! | [`auth`] | bearer tokens, [`TokenProvider`], single-flight refresh |
//! | [`config`] | [`ClientConfig`] builder and validation, [`RoutingConfig`](config::RoutingConfig) |
//! | [`transport`] | the tonic channel: endpoint, TLS, keepalive |
//! | [`wire`] | gRPC framing without copies, both sides: request and response bodies, messages as slices of their chunks (the core's streams, the supervisor's relays, the gateway's relay routes) |
//! | [`routing`] | owner lookup and cache, replica hints, the single unrouted retry, counters |
//! | `client` | the [`Client`] handle, [`CallOptions`], per-operation deadlines |
//! | [`raw`] | the bytes boundary and the one call path |
//! | [`sandboxes`] | health and sandbox lifecycle |
//! | [`exec`] | buffered, streaming and interactive exec, the output collector |
//! | [`forward`] | local TCP listener pumped over `ForwardTcp`; one stream over any reader and writer |
//! | [`logs`] | sandbox log lines, and watches of status and logs that resume after a break |
//! | [`files`] | file transfer over the sandbox's SFTP server (a `ForwardTcp` stream to the `sftp` target): upload, download, streams, `read_file`/`write_file` |
//! | [`config_session`] | [`ConfigSession`]: the supervisor side of the session, with push config, poll fallback, redirects |
//! | [`host_session`] | [`HostSession`]: a shared supervisor host's session, carrying its sandboxes' sessions; placement redirects, `stay`, sticky redials |
//! | `testing` | (feature `testing`, on by default) `LocalCluster`: the reference gateway's developer cluster for a user's own tests, with faults |
//!
//! # Layering
//!
//! The module graph is acyclic: a module imports (`use crate::x`) only
//! modules of lower layers. `tests/module_layering.rs` checks it.
//!
//! | layer | module | may import |
//! |---|---|---|
//! | 0 | `metadata`, `paths` (method paths), `wire` | nothing of the crate |
//! | 1 | `error` | `metadata` |
//! | 2 | `auth` | `error` |
//! | 3 | `config` | `auth`, `error` |
//! | 4 | `transport` | `config`, `error` |
//! | 4 | `routing` | `config`, `error`, `metadata` |
//! | 5 | `client` | `auth`, `config`, `error`, `routing`, `transport` |
//! | 6 | `raw` | layers 0 to 5 |
//! | 7 | `sandboxes`, `exec`, `forward`, `config_session`, `ssh` | layers 0 to 6, never each other |
//! | 8 | `host_session` | layers 0 to 7 (it carries `config_session`s) |
//! | 8 | `files` | layers 0 to 7 (it rides `forward`'s stream) |
//! | 8 | `logs` | layers 0 to 7 (logs and resuming watches of `sandboxes`) |
//! | 9 | `testing` | layers 0 to 8 |
//!
//! Where a lower layer needs something of a higher one, it is passed in:
//! the router decides when a sandbox's owner must be looked up, and the
//! call layer hands it the lookup (`routing::OwnerLookup`, implemented by
//! `raw` for [`Client`]), so `routing` never imports `raw` or `client`.
//! [`RoutingConfig`](config::RoutingConfig) lives in `config` (a setting),
//! [`metadata`] reports invalid pairs with its own error that [`error`]
//! converts. The curated modules call through `raw`'s methods on
//! [`Client`], so everything shares one call path.

#![warn(missing_docs)]

pub mod auth;
mod client;
pub mod config;
pub mod config_session;
pub mod error;
pub mod exec;
pub mod files;
pub mod forward;
pub mod host_session;
pub mod logs;
pub mod metadata;
pub mod raw;
pub mod routing;
pub mod sandboxes;
pub mod ssh;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;
pub mod wire;

pub use auth::{AccessToken, TokenProvider};
pub use client::{CallOptions, Client};
pub use config::{ClientConfig, ClientConfigBuilder};
pub use config_session::{
    ApplyFn, ApplyOutcome, ApplyWithModeFn, ConfigEvent, ConfigSession, ConfigSessionBuilder,
    ConfigSessionStats, ConfigSnapshot, DeliveryMode, SessionEvent, SessionHandle,
};
pub use error::{Error, Result};
pub use exec::{
    ExecEvent, ExecInput, ExecOutput, ExecRequest, ExecStream, InteractiveExec, OutputCollector,
};
pub use files::{
    DownloadSource, Progress, ProgressFn, TransferOptions, TransferSummary, UploadSink,
};
pub use forward::{ForwardHandle, ForwardStats, ForwardTarget};
pub use host_session::{
    AssignedSandbox, HostApplyFn, HostEvent, HostSession, HostSessionBuilder, HostStats,
    ResourceLimits,
};
pub use logs::{EventWatch, LogLine, LogQuery, Logs, WatchEvent, WatchOptions};
pub use metadata::Metadata;
pub use raw::{RawReceiver, RawResponse, RawSender, RawStream};
pub use routing::RoutingStats;
pub use sandboxes::{
    CreateSandbox, DeletionOutcome, Health, ListSandboxes, Sandbox, SandboxPhase, SandboxWatch,
    Sandboxes, ServiceStatus,
};
pub use ssh::SshSession;
pub use tokio_util::sync::CancellationToken;

/// The generated wire types and method table.
pub use openshell_proto as proto;

/// Method paths the curated layer calls.
pub(crate) mod paths {
    pub const HEALTH: &str = "/openshell.v1.OpenShell/Health";
    pub const CREATE_SANDBOX: &str = "/openshell.v1.OpenShell/CreateSandbox";
    pub const GET_SANDBOX: &str = "/openshell.v1.OpenShell/GetSandbox";
    pub const LIST_SANDBOXES: &str = "/openshell.v1.OpenShell/ListSandboxes";
    pub const DELETE_SANDBOX: &str = "/openshell.v1.OpenShell/DeleteSandbox";
    pub const WATCH_SANDBOX: &str = "/openshell.v1.OpenShell/WatchSandbox";
    pub const GET_SANDBOX_LOGS: &str = "/openshell.v1.OpenShell/GetSandboxLogs";
    pub const EXEC_SANDBOX: &str = "/openshell.v1.OpenShell/ExecSandbox";
    pub const EXEC_SANDBOX_INTERACTIVE: &str = "/openshell.v1.OpenShell/ExecSandboxInteractive";
    pub const FORWARD_TCP: &str = "/openshell.v1.OpenShell/ForwardTcp";
    pub const CREATE_SSH_SESSION: &str = "/openshell.v1.OpenShell/CreateSshSession";
    pub const REVOKE_SSH_SESSION: &str = "/openshell.v1.OpenShell/RevokeSshSession";

    #[cfg(test)]
    mod tests {
        use openshell_proto::StreamingKind::*;

        #[test]
        fn curated_paths_are_in_the_generated_method_table() {
            let expected = [
                (super::HEALTH, Unary),
                (super::CREATE_SANDBOX, Unary),
                (super::GET_SANDBOX, Unary),
                (super::LIST_SANDBOXES, Unary),
                (super::DELETE_SANDBOX, Unary),
                (super::WATCH_SANDBOX, ServerStreaming),
                (super::EXEC_SANDBOX, ServerStreaming),
                (super::EXEC_SANDBOX_INTERACTIVE, BidiStreaming),
                (super::FORWARD_TCP, BidiStreaming),
                (super::CREATE_SSH_SESSION, Unary),
                (super::REVOKE_SSH_SESSION, Unary),
            ];
            for (path, kind) in expected {
                let method = openshell_proto::method(path).unwrap_or_else(|| panic!("{path}"));
                assert_eq!(method.kind, kind, "{path}");
            }
        }
    }
}
