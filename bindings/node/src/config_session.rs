//! `NativeConfigSession`: the supervisor side of the session protocol
//! (sdk-core's [`ConfigSession`]) for Node: pushed or polled configuration,
//! handed to JavaScript one snapshot at a time and answered explicitly.
//!
//! # How a snapshot reaches JavaScript and its answer comes back
//!
//! The core calls the apply function on a tokio blocking thread, one call at
//! a time, only for a snapshot that differs from the last applied one. Here
//! that function encodes the snapshot, gives it a fresh id, keeps the answer
//! channel under that id and delivers it one of two ways:
//!
//! - queued for `nextUpdate()` (the TypeScript async iterator), or
//! - passed to the apply callback, a *weak* thread-safe function queued onto
//!   Node's main thread (it never keeps the process alive by itself;
//!   `@openshell/sdk` refs the event loop while the session is open).
//!
//! Either way JavaScript answers with `ack(id, applied, reason)`, and the
//! blocking thread (never a worker, never the main thread) waits for that
//! answer or for `close()`. The core then answers the gateway (APPLIED, or
//! REJECTED with the scrubbed, bounded reason).
//!
//! `close()` cancels the session and drops every unanswered update, which
//! answers it REJECTED ("the session is closing").

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use napi::bindgen_prelude::{BigInt, Buffer, PromiseRaw};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Result, Status};
use napi_derive::napi;
use openshell_sdk::{
    ApplyOutcome, CancellationToken, ClientConfig, ConfigSession, ConfigSnapshot, DeliveryMode,
    Error,
};
use prost::Message;
use tokio::sync::{mpsc, oneshot, watch};

use crate::client::millis;
use crate::errors::{guard_napi, guard_sync, panic_error, to_napi};

/// What `@openshell/sdk` passes to build a session.
#[napi(object)]
pub struct NativeConfigSessionOptions {
    pub endpoint: String,
    pub sandbox_id: String,
    /// The sandbox's own token (never logged, never in an error).
    pub sandbox_token: String,
    pub poll_interval_ms: Option<f64>,
    /// Announce `supports_config_push` in the hello (default true).
    pub announce_push: Option<bool>,
    pub instance_id: Option<String>,
    pub ca_pem: Option<Buffer>,
    pub tls_server_name: Option<String>,
    pub connect_timeout_ms: Option<f64>,
    pub allow_cleartext_token: Option<bool>,
}

/// One snapshot to apply: the encoded messages and how it arrived.
#[napi(object)]
pub struct NativeConfigUpdate {
    /// Session-local id to answer with `ack`.
    pub id: u32,
    /// An encoded `openshell.sandbox.v1.GetSandboxConfigResponse`.
    pub sandbox_config: Buffer,
    /// An encoded `openshell.v1.GetSandboxProviderEnvironmentResponse`.
    pub provider_environment: Buffer,
    /// `push` or `poll`.
    pub mode: String,
}

/// The session's counters; 64-bit counters as `bigint`.
#[napi(object)]
pub struct NativeConfigSessionStats {
    pub mode: Option<String>,
    pub applied: BigInt,
    pub rejected: BigInt,
    pub duplicates: BigInt,
    pub updates_received: BigInt,
    pub last_update_id: BigInt,
    pub config_revision: BigInt,
    pub polls: BigInt,
    pub sessions_accepted: BigInt,
    pub redirects: BigInt,
    pub session_id: Option<String>,
    pub served_by: Option<String>,
}

/// The apply callback as napi holds it: weak, not callee-handled, its
/// return value ignored (it answers through `ack`). "Weak" is about the
/// event loop only: the function itself stays referenced (a napi reference
/// is a GC root) until the session is dropped, and `@openshell/sdk`'s
/// callback refers to its `ConfigSession`. So a started session that the
/// program drops without `close()` keeps running until the process exits
/// (an `unref()`'d one as well, like an unref'd `net.Server`); only
/// `close()` ends it. Deliberate: collecting a running session would end
/// it silently while the program may still expect its updates.
pub type ApplyJsFn =
    ThreadsafeFunction<NativeConfigUpdate, (), NativeConfigUpdate, Status, false, true>;

/// Told once that the session ended (weak, like [`ApplyJsFn`]).
pub type EndedJsFn = ThreadsafeFunction<(), (), (), Status, false, true>;

/// A snapshot as it waits for its answer.
struct Pending {
    sandbox_config: Vec<u8>,
    provider_environment: Vec<u8>,
    mode: DeliveryMode,
}

type Acks = Arc<Mutex<HashMap<u32, oneshot::Sender<ApplyOutcome>>>>;

fn mode_name(mode: DeliveryMode) -> &'static str {
    match mode {
        DeliveryMode::Push => "push",
        DeliveryMode::Poll => "poll",
    }
}

fn closing() -> ApplyOutcome {
    ApplyOutcome::Rejected("the session is closing".into())
}

/// Why the session ended other than by `close()`.
enum Failure {
    /// `run` returned an error (an unusable endpoint, a rejected token).
    Run(Error),
    /// `run` panicked (a bug): reported as a `panic` error, never a hang.
    Panic(String),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[napi]
pub struct NativeConfigSession {
    session: ConfigSession,
    updates: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<NativeConfigUpdate>>>,
    acks: Acks,
    cancel: CancellationToken,
    /// Becomes true when `run` ended (or `close()` came before `start()`).
    ended: watch::Sender<bool>,
    /// How `run` failed (its error, or a panic), for `nextUpdate` /
    /// `waitClosed`.
    failure: Arc<Mutex<Option<Failure>>>,
    started: Mutex<bool>,
    /// Set by `panicInRunForTest`: `run` panics at once.
    panic_in_run: AtomicBool,
}

impl NativeConfigSession {
    fn drop_pending(&self) {
        // Dropping the senders answers every waiting apply REJECTED.
        lock(&self.acks).clear();
    }
}

#[napi]
impl NativeConfigSession {
    /// Builds a session (nothing connects until `start()`). With `apply`,
    /// every update goes to that function; without it, to `nextUpdate()`.
    #[napi(constructor)]
    pub fn new(options: NativeConfigSessionOptions, apply: Option<ApplyJsFn>) -> Result<Self> {
        guard_sync(|| {
            let mut builder = ClientConfig::builder(options.endpoint)
                .token(options.sandbox_token)
                .allow_cleartext_token(options.allow_cleartext_token.unwrap_or(false));
            if let Some(pem) = options.ca_pem {
                builder = builder.ca_pem(pem.to_vec());
            }
            if let Some(name) = options.tls_server_name {
                builder = builder.tls_server_name(name);
            }
            if let Some(t) = millis("connectTimeoutMs", options.connect_timeout_ms)? {
                builder = builder.connect_timeout(t);
            }
            let config = builder.build().map_err(|e| to_napi(&e))?;

            let (queue, updates) = mpsc::unbounded_channel::<NativeConfigUpdate>();
            let acks: Acks = Arc::default();
            let cancel = CancellationToken::new();
            let next_id = AtomicU32::new(1);
            let deliver = {
                let acks = acks.clone();
                let cancel = cancel.clone();
                move |pending: Pending| -> ApplyOutcome {
                    if cancel.is_cancelled() {
                        return closing();
                    }
                    let id = next_id.fetch_add(1, Ordering::Relaxed);
                    let (answer, answered) = oneshot::channel();
                    lock(&acks).insert(id, answer);
                    // `close()` cancels, then drops the senders: checked
                    // after the insert, one of the two always frees us.
                    if cancel.is_cancelled() {
                        lock(&acks).remove(&id);
                        return closing();
                    }
                    let update = NativeConfigUpdate {
                        id,
                        sandbox_config: pending.sandbox_config.into(),
                        provider_environment: pending.provider_environment.into(),
                        mode: mode_name(pending.mode).to_owned(),
                    };
                    let delivered = match &apply {
                        Some(f) => {
                            f.call(update, ThreadsafeFunctionCallMode::NonBlocking) == Status::Ok
                        }
                        None => queue.send(update).is_ok(),
                    };
                    if !delivered {
                        lock(&acks).remove(&id);
                        return closing();
                    }
                    // A blocking thread of the runtime: waiting here holds
                    // up nothing but this session's next update.
                    answered.blocking_recv().unwrap_or_else(|_| closing())
                }
            };
            let apply_fn = move |snapshot: ConfigSnapshot, mode: DeliveryMode| {
                deliver(Pending {
                    sandbox_config: snapshot.sandbox_config.encode_to_vec(),
                    provider_environment: snapshot.provider_environment.encode_to_vec(),
                    mode,
                })
            };
            let mut session = ConfigSession::builder(config, options.sandbox_id)
                .apply_with_mode(Arc::new(apply_fn))
                .config_push(options.announce_push.unwrap_or(true));
            if let Some(interval) = millis("pollIntervalMs", options.poll_interval_ms)? {
                session = session.poll_interval(interval);
            }
            if let Some(id) = options.instance_id {
                session = session.instance_id(id);
            }
            let session = session.build().map_err(|e| to_napi(&e))?;
            Ok(Self {
                session,
                updates: Arc::new(tokio::sync::Mutex::new(updates)),
                acks,
                cancel,
                ended: watch::channel(false).0,
                failure: Arc::default(),
                started: Mutex::new(false),
                panic_in_run: AtomicBool::new(false),
            })
        })
    }

    /// Starts the session on napi's runtime. Idempotent. `on_ended` (weak:
    /// it never keeps Node alive) is called once the session has ended.
    #[napi]
    pub fn start(&self, on_ended: Option<EndedJsFn>) {
        let mut started = lock(&self.started);
        if *started || self.cancel.is_cancelled() {
            return;
        }
        *started = true;
        let session = self.session.clone();
        let cancel = self.cancel.clone();
        let ended = self.ended.clone();
        let failure = self.failure.clone();
        let panic_in_run = self.panic_in_run.load(Ordering::Relaxed);
        let run = {
            let cancel = cancel.clone();
            async move {
                if panic_in_run {
                    // An unwind without the panic hook: no message on stderr.
                    std::panic::resume_unwind(Box::new("deliberate panic in run for a test"));
                }
                session.run(cancel).await
            }
        };
        napi::bindgen_prelude::spawn(async move {
            // A panic in `run` must still end the session: otherwise
            // `ended` never flips and every waiter hangs.
            match AssertUnwindSafe(run).catch_unwind().await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => *lock(&failure) = Some(Failure::Run(err)),
                Err(payload) => {
                    let what = payload
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".to_owned());
                    *lock(&failure) = Some(Failure::Panic(what));
                }
            }
            // An unusable endpoint (or a panic) ends the session: wake every waiter.
            cancel.cancel();
            ended.send_replace(true);
            if let Some(f) = on_ended {
                f.call((), ThreadsafeFunctionCallMode::NonBlocking);
            }
        });
    }

    /// Makes the next `start()` run a session that panics at once: lets the
    /// tests check that waiters get a `panic` error instead of hanging.
    #[napi]
    pub fn panic_in_run_for_test(&self) {
        self.panic_in_run.store(true, Ordering::Relaxed);
    }

    /// The next update to answer, or `null` once the session is closed.
    /// Rejects with the session's error if it could not run.
    #[napi]
    pub fn next_update<'e>(
        &self,
        env: &'e Env,
    ) -> Result<PromiseRaw<'e, Option<NativeConfigUpdate>>> {
        let updates = self.updates.clone();
        let cancel = self.cancel.clone();
        let failure = self.failure.clone();
        let ended = self.ended.subscribe();
        env.spawn_future(guard_napi(async move {
            let mut updates = updates.lock().await;
            let next = tokio::select! {
                biased;
                next = updates.recv() => next,
                _ = cancel.cancelled() => None,
            };
            if next.is_some() {
                return Ok(next);
            }
            ended_result(ended, &failure).await.map(|()| None)
        }))
    }

    /// Resolves when the session ended (after `close()`); rejects with the
    /// session's error if it could not run.
    #[napi]
    pub fn wait_closed<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, ()>> {
        let ended = self.ended.subscribe();
        let failure = self.failure.clone();
        env.spawn_future(guard_napi(
            async move { ended_result(ended, &failure).await },
        ))
    }

    /// Answers update `id`: applied, or rejected with `reason` (sent to the
    /// gateway scrubbed of provider values and bounded). False when the
    /// update was already answered or the session closed.
    #[napi]
    pub fn ack(&self, id: u32, applied: bool, reason: Option<String>) -> bool {
        let Some(sender) = lock(&self.acks).remove(&id) else {
            return false;
        };
        let outcome = if applied {
            ApplyOutcome::Applied
        } else {
            ApplyOutcome::Rejected(
                reason
                    .filter(|r| !r.trim().is_empty())
                    .unwrap_or_else(|| "rejected by the application".into()),
            )
        };
        sender.send(outcome).is_ok()
    }

    #[napi]
    pub fn stats(&self) -> NativeConfigSessionStats {
        let s = self.session.stats();
        NativeConfigSessionStats {
            mode: s.mode.map(|m| mode_name(m).to_owned()),
            applied: BigInt::from(s.applied),
            rejected: BigInt::from(s.rejected),
            duplicates: BigInt::from(s.duplicates),
            updates_received: BigInt::from(s.updates_received),
            last_update_id: BigInt::from(s.last_update_id),
            config_revision: BigInt::from(s.config_revision),
            polls: BigInt::from(s.polls),
            sessions_accepted: BigInt::from(s.sessions_accepted),
            redirects: BigInt::from(s.redirects),
            session_id: s.session_id,
            served_by: s.served_by,
        }
    }

    /// The instance id every hello carries.
    #[napi(getter)]
    pub fn instance_id(&self) -> String {
        self.session.instance_id().to_owned()
    }

    /// Whether `close()` was called or the session could not run.
    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Ends the session (its stream closes; the gateway sees the supervisor
    /// leave) and answers every unanswered update REJECTED. Idempotent.
    #[napi]
    pub fn close(&self) {
        self.cancel.cancel();
        self.drop_pending();
        if !*lock(&self.started) {
            self.ended.send_replace(true);
        }
    }
}

/// Waits until `run` ended: its error, if it had one.
async fn ended_result(
    mut ended: watch::Receiver<bool>,
    failure: &Mutex<Option<Failure>>,
) -> Result<()> {
    let _ = ended.wait_for(|done| *done).await;
    match lock(failure).as_ref() {
        Some(Failure::Run(err)) => Err(to_napi(err)),
        Some(Failure::Panic(what)) => Err(panic_error(Box::new(what.clone()))),
        None => Ok(()),
    }
}

impl Drop for NativeConfigSession {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.drop_pending();
    }
}
