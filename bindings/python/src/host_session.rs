//! `NativeHostSession`: a shared supervisor host's session (sdk-core's
//! [`HostSession`]) for Python: one `ConnectHost` stream carrying the
//! session of every sandbox assigned to the host, whose configuration
//! snapshots Python answers one at a time per sandbox.
//!
//! The core serves every assigned sandbox itself (its `apply` mode) and
//! calls the apply function on a tokio blocking thread, one call at a time
//! per sandbox (calls for different sandboxes may overlap), only for a
//! snapshot that differs from that sandbox's last applied one. Here that
//! function encodes the snapshot, queues it as a pending update with a
//! fresh id and the sandbox id, and blocks that blocking thread (never a
//! worker, never holding the GIL) until Python answers `ack(id, applied,
//! reason)`, exactly as `NativeConfigSession` does. `close()` cancels the
//! session and drops every unanswered update, which answers it REJECTED.
//!
//! The host token goes into the core's client configuration and nowhere
//! else: not into `repr`, not into an error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openshell_sdk::{
    ApplyOutcome, CancellationToken, ClientConfig, ConfigSnapshot, Error, HostSession,
};
use prost::Message;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::sync::{mpsc, oneshot};

use crate::errors::{invalid_config, to_py};
use crate::runtime;
use crate::waker::spawn;

/// A snapshot waiting for Python's answer.
struct Pending {
    id: u64,
    sandbox_id: String,
    sandbox_config: Bytes,
    provider_environment: Bytes,
}

type Acks = Arc<Mutex<HashMap<u64, oneshot::Sender<ApplyOutcome>>>>;

fn closing() -> ApplyOutcome {
    ApplyOutcome::Rejected("the session is closing".into())
}

#[pyclass(frozen, module = "openshell_sdk._native", name = "NativeHostSession")]
pub struct NativeHostSession {
    pid: u32,
    session: HostSession,
    updates: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Pending>>>,
    acks: Acks,
    cancel: CancellationToken,
    /// Set when `run` ended: its error, if any (an unusable endpoint).
    ended: Arc<Mutex<Option<Option<Error>>>>,
    started: Mutex<bool>,
}

impl NativeHostSession {
    fn check_process(&self, py: Python<'_>) -> PyResult<()> {
        if self.pid != std::process::id() {
            return Err(invalid_config(
                py,
                "a HostSession does not survive fork(); start a new one in this process",
            ));
        }
        Ok(())
    }

    fn drop_pending(&self) {
        // Dropping the senders answers every waiting apply REJECTED.
        self.acks.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

#[pymethods]
impl NativeHostSession {
    /// Builds a host session; nothing connects until `start()`.
    #[new]
    #[pyo3(signature = (
        endpoint,
        member_id,
        host_token,
        *,
        capacity = 0,
        config_push = true,
        instance_id = None,
        ca_pem = None,
        tls_server_name = None,
        connect_timeout = None,
        allow_cleartext_token = false,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoint: String,
        member_id: String,
        host_token: String,
        capacity: u32,
        config_push: bool,
        instance_id: Option<String>,
        ca_pem: Option<Bytes>,
        tls_server_name: Option<String>,
        connect_timeout: Option<f64>,
        allow_cleartext_token: bool,
    ) -> PyResult<Self> {
        let mut builder = ClientConfig::builder(endpoint)
            .token(host_token)
            .allow_cleartext_token(allow_cleartext_token);
        if let Some(pem) = ca_pem {
            builder = builder.ca_pem(pem.to_vec());
        }
        if let Some(name) = tls_server_name {
            builder = builder.tls_server_name(name);
        }
        match connect_timeout {
            None => {}
            Some(s) if s.is_finite() && s > 0.0 => {
                builder = builder.connect_timeout(Duration::from_secs_f64(s));
            }
            Some(_) => {
                return Err(invalid_config(
                    py,
                    "connect_timeout must be a positive number of seconds",
                ));
            }
        }
        let config = builder.build().map_err(|e| to_py(py, &e))?;

        let (queue, updates) = mpsc::unbounded_channel::<Pending>();
        let acks: Acks = Arc::default();
        let cancel = CancellationToken::new();
        let next_id = Arc::new(AtomicU64::new(1));
        let apply = {
            let acks = acks.clone();
            let cancel = cancel.clone();
            move |sandbox_id: &str, snapshot: ConfigSnapshot| -> ApplyOutcome {
                if cancel.is_cancelled() {
                    return closing();
                }
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                let (answer, answered) = oneshot::channel();
                acks.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id, answer);
                // `close()` cancels, then drops the senders: checked after
                // the insert, one of the two always frees this thread.
                if cancel.is_cancelled() {
                    acks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                    return closing();
                }
                let pending = Pending {
                    id,
                    sandbox_id: sandbox_id.to_owned(),
                    sandbox_config: Bytes::from(snapshot.sandbox_config.encode_to_vec()),
                    provider_environment: Bytes::from(
                        snapshot.provider_environment.encode_to_vec(),
                    ),
                };
                if queue.send(pending).is_err() {
                    acks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                    return closing();
                }
                answered.blocking_recv().unwrap_or_else(|_| {
                    ApplyOutcome::Rejected(
                        "the session closed before the update was answered".into(),
                    )
                })
            }
        };
        let mut session = HostSession::builder(config, member_id)
            .apply(Arc::new(apply))
            .capacity(capacity)
            .config_push(config_push);
        if let Some(id) = instance_id {
            session = session.instance_id(id);
        }
        let session = session.build().map_err(|e| to_py(py, &e))?;
        Ok(Self {
            pid: std::process::id(),
            session,
            updates: Arc::new(tokio::sync::Mutex::new(updates)),
            acks,
            cancel,
            ended: Arc::default(),
            started: Mutex::new(false),
        })
    }

    /// Starts the session on the extension's runtime. Idempotent.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        self.check_process(py)?;
        let mut started = self.started.lock().unwrap_or_else(|p| p.into_inner());
        if *started || self.cancel.is_cancelled() {
            return Ok(());
        }
        *started = true;
        let session = self.session.clone();
        let cancel = self.cancel.clone();
        let ended = self.ended.clone();
        runtime::handle().spawn(async move {
            let result = session.run(cancel.clone()).await;
            *ended.lock().unwrap_or_else(|p| p.into_inner()) = Some(result.err());
            // An unusable endpoint ends the session: wake every waiter.
            cancel.cancel();
        });
        Ok(())
    }

    /// The next update to answer: `(id, sandbox_id, sandbox_config,
    /// provider_environment)` (encoded messages), or `None` once the session
    /// is closed. Raises the session's error if it could not run.
    fn next_update<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.check_process(py)?;
        let updates = self.updates.clone();
        let cancel = self.cancel.clone();
        let ended = self.ended.clone();
        spawn(py, async move {
            let mut updates = updates.lock().await;
            let next = tokio::select! {
                biased;
                _ = cancel.cancelled() => None,
                next = updates.recv() => next,
            };
            match next {
                Some(p) => Ok(Some((
                    p.id,
                    p.sandbox_id,
                    p.sandbox_config,
                    p.provider_environment,
                ))),
                None => {
                    let failure = ended.lock().unwrap_or_else(|p| p.into_inner()).take();
                    match failure {
                        Some(Some(err)) => Err(err),
                        _ => Ok(None),
                    }
                }
            }
        })
    }

    /// Answers update `id`: applied, or rejected with `reason`. Returns
    /// False when the update was already answered or the session closed.
    #[pyo3(signature = (id, applied, reason = None))]
    fn ack(
        &self,
        py: Python<'_>,
        id: u64,
        applied: bool,
        reason: Option<String>,
    ) -> PyResult<bool> {
        self.check_process(py)?;
        let sender = self
            .acks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        let Some(sender) = sender else {
            return Ok(false);
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
        Ok(sender.send(outcome).is_ok())
    }

    /// The session's counters (see `openshell_sdk.HostSessionStats`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.session.stats();
        let dict = PyDict::new(py);
        dict.set_item("sessions_accepted", stats.sessions_accepted)?;
        dict.set_item("redirects", stats.redirects)?;
        dict.set_item("sticky_redials", stats.sticky_redials)?;
        dict.set_item("fallbacks", stats.fallbacks)?;
        dict.set_item("stay", stats.stay)?;
        dict.set_item("session_id", stats.session_id)?;
        dict.set_item("served_by", stats.served_by)?;
        dict.set_item("assigned", stats.assigned)?;
        Ok(dict)
    }

    /// The host's member id.
    #[getter]
    fn member_id(&self) -> String {
        self.session.member_id().to_owned()
    }

    /// The instance id every hello carries.
    #[getter]
    fn instance_id(&self) -> String {
        self.session.instance_id().to_owned()
    }

    /// Whether `close()` was called or the session could not run.
    #[getter]
    fn closed(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Ends the session (its stream closes) and answers every unanswered
    /// update REJECTED. Idempotent.
    fn close(&self) {
        self.cancel.cancel();
        self.drop_pending();
    }

    fn __repr__(&self) -> String {
        format!(
            "NativeHostSession(member_id={:?}, instance_id={:?}, closed={})",
            self.session.member_id(),
            self.session.instance_id(),
            self.cancel.is_cancelled()
        )
    }
}

impl Drop for NativeHostSession {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.drop_pending();
    }
}
