//! `NativeHostSession`: a shared supervisor host's session (sdk-core's
//! [`HostSession`]) for Node: one `ConnectHost` stream carrying the session
//! of every sandbox assigned to the host, each sandbox's configuration
//! handed to JavaScript one snapshot at a time and answered explicitly.
//!
//! The core serves every assigned sandbox itself (its `apply` mode) and
//! calls the apply function on a tokio blocking thread, one call at a time
//! per sandbox (calls for different sandboxes may overlap), only for a
//! snapshot that differs from that sandbox's last applied one. Here that
//! function encodes the snapshot, gives it a fresh id, keeps the answer
//! channel under that id and passes it to the apply callback, a *weak*
//! thread-safe function queued onto Node's main thread (`@openshell/sdk`
//! refs the event loop while the session is open). JavaScript answers with
//! `ack(id, applied, reason)`; the blocking thread waits for that answer or
//! for `close()`, exactly as for `NativeConfigSession`.
//!
//! The host token goes into the core's client configuration and nowhere
//! else.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use napi::bindgen_prelude::{BigInt, Buffer, PromiseRaw};
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi::{Env, Result, Status};
use napi_derive::napi;
use openshell_sdk::{
    ApplyOutcome, CancellationToken, ClientConfig, ConfigSnapshot, Error, HostSession,
};
use prost::Message;
use tokio::sync::{oneshot, watch};

use crate::client::millis;
use crate::config_session::EndedJsFn;
use crate::errors::{guard_napi, guard_sync, panic_error, to_napi};

/// What `@openshell/sdk` passes to build a host session.
#[napi(object)]
pub struct NativeHostSessionOptions {
    /// The gateway's shared address (the edge of a cluster).
    pub endpoint: String,
    /// The host's member id (the id its host token was issued for).
    pub member_id: String,
    /// The host token (never logged, never in an error).
    pub host_token: String,
    /// Most sandboxes served at once (0 or absent: no limit).
    pub capacity: Option<u32>,
    /// Sandbox sessions announce `supports_config_push` (default true).
    pub config_push: Option<bool>,
    pub instance_id: Option<String>,
    pub ca_pem: Option<Buffer>,
    pub tls_server_name: Option<String>,
    pub connect_timeout_ms: Option<f64>,
    pub allow_cleartext_token: Option<bool>,
}

/// One assigned sandbox's snapshot to apply.
#[napi(object)]
pub struct NativeHostUpdate {
    /// Session-local id to answer with `ack`.
    pub id: u32,
    pub sandbox_id: String,
    /// An encoded `openshell.sandbox.v1.GetSandboxConfigResponse`.
    pub sandbox_config: Buffer,
    /// An encoded `openshell.v1.GetSandboxProviderEnvironmentResponse`.
    pub provider_environment: Buffer,
}

/// The host session's counters; 64-bit counters as `bigint`.
#[napi(object)]
pub struct NativeHostSessionStats {
    pub sessions_accepted: BigInt,
    pub redirects: BigInt,
    pub sticky_redials: BigInt,
    pub fallbacks: BigInt,
    pub stay: bool,
    pub session_id: Option<String>,
    pub served_by: Option<String>,
    pub assigned: u32,
}

/// The apply callback as napi holds it: weak, not callee-handled (see
/// `config_session::ApplyJsFn`: only `close()` ends a started session).
pub type HostApplyJsFn =
    ThreadsafeFunction<NativeHostUpdate, (), NativeHostUpdate, Status, false, true>;

type Acks = Arc<Mutex<HashMap<u32, oneshot::Sender<ApplyOutcome>>>>;

fn closing() -> ApplyOutcome {
    ApplyOutcome::Rejected("the session is closing".into())
}

/// Why the session ended other than by `close()`.
enum Failure {
    Run(Error),
    Panic(String),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[napi]
pub struct NativeHostSession {
    session: HostSession,
    acks: Acks,
    cancel: CancellationToken,
    ended: watch::Sender<bool>,
    failure: Arc<Mutex<Option<Failure>>>,
    started: Mutex<bool>,
}

#[napi]
impl NativeHostSession {
    /// Builds a host session (nothing connects until `start()`); every
    /// snapshot goes to `apply`.
    #[napi(constructor)]
    pub fn new(options: NativeHostSessionOptions, apply: HostApplyJsFn) -> Result<Self> {
        guard_sync(|| {
            let mut builder = ClientConfig::builder(options.endpoint)
                .token(options.host_token)
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

            let acks: Acks = Arc::default();
            let cancel = CancellationToken::new();
            let next_id = AtomicU32::new(1);
            let apply_fn = {
                let acks = acks.clone();
                let cancel = cancel.clone();
                move |sandbox_id: &str, snapshot: ConfigSnapshot| -> ApplyOutcome {
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
                    let update = NativeHostUpdate {
                        id,
                        sandbox_id: sandbox_id.to_owned(),
                        sandbox_config: snapshot.sandbox_config.encode_to_vec().into(),
                        provider_environment: snapshot.provider_environment.encode_to_vec().into(),
                    };
                    if apply.call(update, ThreadsafeFunctionCallMode::NonBlocking) != Status::Ok {
                        lock(&acks).remove(&id);
                        return closing();
                    }
                    answered.blocking_recv().unwrap_or_else(|_| closing())
                }
            };
            let mut session = HostSession::builder(config, options.member_id)
                .apply(Arc::new(apply_fn))
                .capacity(options.capacity.unwrap_or(0))
                .config_push(options.config_push.unwrap_or(true));
            if let Some(id) = options.instance_id {
                session = session.instance_id(id);
            }
            let session = session.build().map_err(|e| to_napi(&e))?;
            Ok(Self {
                session,
                acks,
                cancel,
                ended: watch::channel(false).0,
                failure: Arc::default(),
                started: Mutex::new(false),
            })
        })
    }

    /// Starts the session on napi's runtime. Idempotent. `on_ended` (weak)
    /// is called once the session has ended.
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
        let run = {
            let cancel = cancel.clone();
            async move { session.run(cancel).await }
        };
        napi::bindgen_prelude::spawn(async move {
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
            cancel.cancel();
            ended.send_replace(true);
            if let Some(f) = on_ended {
                f.call((), ThreadsafeFunctionCallMode::NonBlocking);
            }
        });
    }

    /// Resolves when the session ended; rejects with its error if it could
    /// not run.
    #[napi]
    pub fn wait_closed<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, ()>> {
        let mut ended = self.ended.subscribe();
        let failure = self.failure.clone();
        env.spawn_future(guard_napi(async move {
            let _ = ended.wait_for(|done| *done).await;
            match lock(&failure).as_ref() {
                Some(Failure::Run(err)) => Err(to_napi(err)),
                Some(Failure::Panic(what)) => Err(panic_error(Box::new(what.clone()))),
                None => Ok(()),
            }
        }))
    }

    /// Answers update `id`: applied, or rejected with `reason`. False when
    /// the update was already answered or the session closed.
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
    pub fn stats(&self) -> NativeHostSessionStats {
        let s = self.session.stats();
        NativeHostSessionStats {
            sessions_accepted: BigInt::from(s.sessions_accepted),
            redirects: BigInt::from(s.redirects),
            sticky_redials: BigInt::from(s.sticky_redials),
            fallbacks: BigInt::from(s.fallbacks),
            stay: s.stay,
            session_id: s.session_id,
            served_by: s.served_by,
            assigned: u32::try_from(s.assigned).unwrap_or(u32::MAX),
        }
    }

    /// The host's member id.
    #[napi(getter)]
    pub fn member_id(&self) -> String {
        self.session.member_id().to_owned()
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

    /// Ends the session and answers every unanswered update REJECTED.
    /// Idempotent.
    #[napi]
    pub fn close(&self) {
        self.cancel.cancel();
        lock(&self.acks).clear();
        if !*lock(&self.started) {
            self.ended.send_replace(true);
        }
    }
}

impl Drop for NativeHostSession {
    fn drop(&mut self) {
        self.cancel.cancel();
        lock(&self.acks).clear();
    }
}
