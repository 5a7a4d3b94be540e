//! The C ABI of the OpenShell core client (`openshell-sdk`). `sdk-go` calls
//! it through cgo; any other C user can link the static or shared library
//! and include `include/openshell.h`, which cbindgen generates from this
//! crate (`build.rs`: every build fails when the checked-in header differs
//! from the generated one; `make generate` rewrites it).
//!
//! # Ownership
//!
//! - **Inputs are borrowed.** Every `OsBytes` argument (pointer + length,
//!   not NUL-terminated) and every struct passed by value is read during the
//!   call and copied; the library never keeps a caller's pointer after the
//!   export returns. A zero length may come with a null pointer.
//! - **Outputs are owned by the caller** and each kind has exactly one free
//!   function: `OsClient` → [`openshell_client_free`], `OsCancel` →
//!   [`openshell_cancel_free`], `OsStream` → [`openshell_stream_free`],
//!   `OsForward` → [`openshell_forward_free`], `OsErrorBox` →
//!   [`openshell_error_free`], `OsOwnedBytes` → [`openshell_bytes_free`].
//!   `OsConfigSession` → [`openshell_config_session_free`], `OsHostSession`
//!   → [`openshell_host_session_free`], `OsLocalCluster` →
//!   [`openshell_local_cluster_free`], `OsQueueBatch` → the next
//!   [`openshell_queue_take`] or [`openshell_queue_batch_free`]. An
//!   `OsTokenReply` is consumed by [`openshell_token_reply`], an
//!   `OsApplyReply` by [`openshell_apply_reply`].
//! - **A completion is borrowed for the duration of its callback**: its
//!   `value`, `served_by` and `error` views are valid only until the
//!   callback returns (copy what you keep). Its `handle`, when not null, is
//!   an owned `OsStream`, `OsForward` or `OsLocalCluster`.
//!
//! # Async calls and threads
//!
//! The library owns one multi-thread tokio runtime, started on first use.
//! An async export (`openshell_client_call`, `_open`, `_raw_unary`,
//! `_raw_stream`, `_forward`, `openshell_stream_next`, `_send`,
//! `openshell_local_cluster_start`, `_fault`, `_owner_of`, `_close`, the file
//! transfers `openshell_client_upload`, `_download`, `_upload_stream`,
//! `_download_stream`, `_read_file`, `_write_file` and
//! `openshell_stream_finish`) checks its
//! arguments, copies them, spawns the work and returns at once:
//!
//! - it returns [`OS_OK`] and later calls `callback(user_data, completion)`
//!   **exactly once**: with a value, an end of stream, or an error; also when
//!   the call is cancelled (error code `cancelled`) or its task is dropped;
//! - or it returns another status ([`OS_INVALID`], [`OS_PANIC`]) and the
//!   callback is never called.
//!
//! Callbacks run on a runtime worker thread: they must not block (hand the
//! completion to another thread and return) and must not call back into a
//! blocking export. A caller whose language pays to enter its code from a
//! foreign thread can pass [`openshell_queue_complete`] instead: the
//! completion is queued and the caller drains the queue from its own event
//! loop, woken through a file descriptor (`queue.rs`; what the Go SDK does). Every export may be called from any thread. Handles may
//! be used concurrently; at most one `openshell_stream_next` per stream
//! should be outstanding (later ones queue behind it).
//!
//! # Cancellation and deadlines
//!
//! `OsCallOptions.cancel` names an `OsCancel` token (may be null): cancelling
//! it drops the Rust future, which resets the RPC (for exec, the gateway
//! kills the process group). A stream or forward created by the call stays
//! bound to the token. `timeout_ms` is the call deadline (0: the client's
//! default for unary calls, none for streams). [`openshell_client_close`]
//! cancels every call, stream and forward of the client.
//!
//! # Panics and errors
//!
//! Every export catches panics: a synchronous one returns [`OS_PANIC`], an
//! async one completes with error code `panic`. Errors carry the core's
//! stable string code (`not_found`, `invalid_argument`, `unavailable`,
//! `invalid_config`, `cancelled`, `deadline_exceeded`, `cluster`, ...), the
//! gRPC status, the message (never a token), whether a retry may succeed,
//! the replica that served the call, and for `cluster` the directory of the
//! local cluster's kept logs.
//!
//! # File transfer
//!
//! `files.rs`: uploads and downloads of local paths run wholly in the core
//! (streamed, never a whole file in memory); the stream forms are
//! `OsStream`s (`openshell_stream_send` the bytes of an upload, then
//! `openshell_stream_finish`; `openshell_stream_next` the chunks of a
//! download). A transfer's optional progress callback runs on a runtime
//! thread, throttled by the core, and must not block either.
//!
//! # Local clusters
//!
//! `openshell_local_cluster_*` (`testing.rs`) start and drive the core's
//! local test cluster (the reference gateway's `up`), for tests of code that
//! uses the SDK.
//!
//! # Messages
//!
//! Requests and responses cross as encoded protobuf messages of
//! `proto/openshell/*.proto`; each operation below names its message types.

#![allow(clippy::missing_safety_doc)]

mod call;
mod client;
mod complete;
mod files;
mod host;
mod queue;
mod session;
mod stream;
mod testing;
mod types;

pub use call::{OsCallOptions, OsClient};
pub use client::*;
pub use complete::*;
pub use files::*;
pub use host::*;
pub use queue::*;
pub use session::*;
pub use stream::*;
pub use testing::*;
pub use types::*;
