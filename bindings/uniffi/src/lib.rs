//! uniffi exports of the OpenShell core client: the native half of the JVM
//! SDK (`sdk-jvm`, Kotlin and Java).
//!
//! # Runtime
//!
//! Every async export is marked `async_runtime = "tokio"`: uniffi wraps the
//! core's future in `async_compat::Compat`, so each poll runs inside a tokio
//! context: async-compat's global runtime, multi-threaded here (its
//! `multi-thread` feature), started on first use, which also runs the tasks
//! the core spawns (connections, relays). The *JVM* drives each call: the
//! generated Kotlin code polls the Rust future from a coroutine and suspends
//! until Rust wakes it, so no JVM thread blocks on a call. A JVM token
//! source is called on tokio's blocking pool, never on a worker.
//!
//! The unary calls also run on the calling thread for sdk-jvm's
//! `OpenShellBlockingClient` (`direct.rs`): the JVM thread polls the same
//! core future inside the same runtime context, entered through plain C
//! functions that JNA passes without reflection (arguments and answers in
//! uniffi's serialization, so the types stay the ones described here).
//!
//! # Who frees what
//!
//! Objects ([`OpenShellClient`], [`ExecSession`], [`LocalCluster`]) are `Arc`
//! handles; the Kotlin wrapper frees its reference on `close()` (or a
//! `Cleaner` after garbage collection). Records, strings and byte arrays are
//! copied across the boundary in a `RustBuffer`.
//!
//! # Cancellation
//!
//! A cancelled coroutine frees its Rust future, which drops the core future:
//! the RPC is reset on the wire (for exec, the gateway kills the process
//! group). `OpenShellClient::cancel_all` cancels every call of the client, now
//! and later; `ExecSession::cancel` ends one exec.
//!
//! # Errors
//!
//! [`OpenShellError`]: one variant per stable error code of the core
//! (`not_found`, `unavailable`, `deadline_exceeded`, ...); Kotlin sees a
//! sealed `OpenShellException` hierarchy.

mod client;
mod config_session;
mod direct;
mod errors;
mod exec;
mod files;
mod forward;
mod host_session;
mod logs;
mod raw;
mod settings;
mod ssh;
mod testing;

pub use client::{
    ClientOptions, CreateSandboxRequest, ExecOutput, ExecRequest, HealthInfo, OpenShellClient,
    RoutingStats, SandboxInfo, SandboxWithOwner, TokenGrant, TokenSource, connect,
};
pub use config_session::{
    ConfigApplier, ConfigSession, ConfigSessionStats, ConfigSnapshot, DeliveryMode, PendingUpdate,
    SessionOptions, SettingValue,
};
pub use errors::OpenShellError;
pub use exec::{ExecEvent, ExecSession};
pub use files::{TransferProgress, TransferProgressInfo, TransferSummary};
pub use forward::{ForwardHandle, ForwardStats, ForwardTarget};
pub use host_session::{HostApplier, HostSession, HostSessionStats};
pub use logs::{EventWatch, LogLine, LogQuery, SandboxLogs, WatchEvent, WatchOptions};
pub use raw::{MetadataEntry, RawAnswer, RawCall};
pub use settings::SettingWrite;
pub use ssh::SshSession;
pub use testing::{ClusterFault, LocalCluster, LocalClusterConfig};

uniffi::setup_scaffolding!();
