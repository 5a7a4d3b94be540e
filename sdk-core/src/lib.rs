//! OpenShell core client: the Rust SDK, and the core every language binding
//! (Python, TypeScript, Go) exports.
//!
//! # Quick start
//!
//! ```no_run
//! use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecRequest};
//!
//! # async fn run() -> Result<(), openshell_sdk::Error> {
//! let config = ClientConfig::builder("http://127.0.0.1:17670")
//!     .token("my-token")
//!     .build()?;
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
//!   [`Client::forward`]. The data planes of exec and forward run in Rust.
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
//! | [`config`] | [`ClientConfig`] builder and validation |
//! | [`transport`] | the tonic channel: endpoint, TLS, keepalive |
//! | [`auth`] | bearer tokens, [`TokenProvider`], single-flight refresh |
//! | [`raw`] | the bytes boundary and the one call path |
//! | [`routing`] | owner lookup and cache, replica hints, the single unrouted retry, counters |
//! | [`sandboxes`] | health and sandbox lifecycle |
//! | [`exec`] | buffered, streaming and interactive exec |
//! | [`forward`] | local TCP listener pumped over `ForwardTcp` |
//! | [`supervisor`] | [`ConfigSession`]: the supervisor session with push config, poll fallback, redirects |
//! | [`error`] | [`Error`] and its codes |
//! | [`metadata`] | request/response metadata pairs |

#![warn(missing_docs)]

pub mod auth;
mod client;
pub mod config;
pub mod error;
pub mod exec;
pub mod forward;
pub mod metadata;
pub mod raw;
pub mod routing;
pub mod sandboxes;
pub mod supervisor;
pub mod transport;

pub use auth::{AccessToken, TokenProvider};
pub use client::{CallOptions, Client};
pub use config::{ClientConfig, ClientConfigBuilder};
pub use error::{Error, Result};
pub use exec::{ExecEvent, ExecInput, ExecOutput, ExecRequest, ExecStream, InteractiveExec};
pub use forward::{ForwardHandle, ForwardStats};
pub use metadata::Metadata;
pub use raw::{RawReceiver, RawResponse, RawSender, RawStream};
pub use routing::RoutingStats;
pub use sandboxes::{
    CreateSandbox, DeletionOutcome, Health, ListSandboxes, Sandbox, SandboxPhase, SandboxWatch,
    Sandboxes, ServiceStatus,
};
pub use supervisor::{
    ApplyFn, ApplyOutcome, ApplyWithModeFn, ConfigEvent, ConfigSession, ConfigSessionBuilder,
    ConfigSessionStats, ConfigSnapshot, DeliveryMode, SessionEvent, SessionHandle,
};
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
    pub const EXEC_SANDBOX: &str = "/openshell.v1.OpenShell/ExecSandbox";
    pub const EXEC_SANDBOX_INTERACTIVE: &str = "/openshell.v1.OpenShell/ExecSandboxInteractive";
    pub const FORWARD_TCP: &str = "/openshell.v1.OpenShell/ForwardTcp";

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
            ];
            for (path, kind) in expected {
                let method = openshell_proto::method(path).unwrap_or_else(|| panic!("{path}"));
                assert_eq!(method.kind, kind, "{path}");
            }
        }
    }
}
