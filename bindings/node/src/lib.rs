//! The Node binding of the OpenShell core client (`openshell-sdk`), built
//! with napi-rs. The idiomatic API (`Client`, errors, iterators, abort
//! signals, handles that keep the process alive) is TypeScript in
//! `sdk-typescript` (`@openshell/sdk`); this addon is the thin layer under
//! it and is not a public API.
//!
//! # What crosses the boundary
//!
//! - a client ([`client::NativeClient`]) built from an options object
//!   (endpoint, token or a token-provider function, CA PEM, timeouts);
//! - curated operations whose data planes stay in Rust: sandbox lifecycle,
//!   buffered exec (output collected in Rust under the cap), streaming and
//!   interactive exec (events in batches), forward (listener and byte
//!   pumps in Rust; JavaScript holds a handle);
//! - file transfer ([`files`]): uploads and downloads of local paths done
//!   wholly by the core, the stream forms as handles fed or drained chunk by
//!   chunk with backpressure, `readFile` / `writeFile`, progress through a
//!   weak callback;
//! - sandbox logs and watches that resume after a break ([`logs`]), events
//!   in batches;
//! - the raw boundary: a unary call (path, request bytes, metadata) and a
//!   stream handle, both through the core so owner routing applies;
//! - the supervisor side, [`config_session::NativeConfigSession`]: the
//!   core's config session, each snapshot answered from JavaScript (through
//!   `nextUpdate()` or a weak apply callback); and a shared supervisor
//!   host's session, [`host_session::NativeHostSession`], whose assigned
//!   sandboxes' snapshots go to a weak apply callback the same way;
//! - a local test cluster, [`testing::NativeLocalCluster`]: the core's
//!   `testing::LocalCluster` (`openshell-gateway up` and its faults) for
//!   `@openshell/sdk/testing`.
//!
//! Messages cross as encoded protobuf `Buffer`s, 64-bit counters as
//! `bigint`, durations as milliseconds.
//!
//! # Runtime and threads
//!
//! Futures run on napi's tokio runtime (feature `tokio_rt`). Every export
//! that touches the core hands its future to `env.spawn_future`, which
//! settles the Promise back on Node's main thread. The token-provider
//! callback is a weak thread-safe function: queued onto the main thread,
//! awaited on a worker, and it never keeps Node alive.
//!
//! # Cancellation and lifetime
//!
//! A per-call [`client::CancelToken`] (cancelled by the TypeScript layer
//! from an `AbortSignal`) or `close()` on the client drops the core future,
//! which cancels the RPC. Handles end their RPC on `cancel()` / `close()`
//! or when collected. Nothing here keeps the event loop alive: a pending
//! Promise does, for as long as it is pending, and `@openshell/sdk` refs
//! the event loop for each open handle (forward, watch) until it closes.
//!
//! # Panics and errors
//!
//! Every future is run under `catch_unwind` ([`errors::guard`]) and the
//! synchronous constructor too: a panic becomes a rejection with code
//! `panic`. Core errors become rejections that `@openshell/sdk` turns into
//! `OpenShellError` (`code`, `grpcStatus`, `message`, `servedBy`).

mod client;
mod config_session;
mod errors;
mod files;
mod handles;
mod host_session;
mod logs;
mod testing;
mod token;
mod values;

use napi_derive::napi;

/// The addon's version (the workspace version).
#[napi]
pub fn native_version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

/// The encoded `FileDescriptorSet` of proto/ (every RPC and message): lets
/// `@openshell/sdk` encode and decode any message with @bufbuild/protobuf.
#[napi]
pub fn descriptor_set() -> napi::bindgen_prelude::Buffer {
    openshell_sdk::proto::FILE_DESCRIPTOR_SET.to_vec().into()
}

/// The marker that starts an encoded core error's message.
#[napi]
pub fn error_marker() -> String {
    errors::MARKER.to_owned()
}

/// Panics on purpose inside a future: lets the tests check that a panic
/// becomes a rejection and the process keeps running.
#[napi]
pub fn panic_for_test(env: &napi::Env) -> napi::Result<napi::bindgen_prelude::PromiseRaw<'_, ()>> {
    env.spawn_future(errors::guard(async {
        if std::process::id() != 0 {
            // An unwind without the panic hook: no message on stderr.
            std::panic::resume_unwind(Box::new("deliberate panic for a test"));
        }
        Ok::<(), openshell_sdk::Error>(())
    }))
}
