//! The supervisor side: a config session (`ConfigSession` of the core) with
//! an apply callback answered through a reply handle.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use openshell_sdk::{
    ApplyOutcome, CancellationToken, ClientConfig, ConfigSession, ConfigSnapshot, DeliveryMode,
    Error,
};
use prost::Message;

use crate::client::OsClientOptions;
use crate::complete::{OsCallback, Outcome, start_parts};
use crate::types::{
    ErrorParts, OS_ERROR, OS_INVALID, OS_OK, OsBytes, OsCancel, OsErrorBox, OsOwnedBytes,
    guard_sync, put_error,
};

/// How a snapshot arrived: pushed over the session.
pub const OS_MODE_PUSH: i32 = 1;
/// How a snapshot arrived: polled with `GetSandboxConfig`.
pub const OS_MODE_POLL: i32 = 2;

/// The apply callback: called on a blocking thread of the library, one call
/// at a time, only for a snapshot that differs from the last applied one.
/// `snapshot` (borrowed for the call) is two length-delimited messages:
/// `GetSandboxConfigResponse`, then `GetSandboxProviderEnvironmentResponse`
/// (whose values are secrets). `mode` is `OS_MODE_PUSH` or `OS_MODE_POLL`.
/// The host answers with [`openshell_apply_reply`], exactly once, from any
/// thread; the session waits for that answer.
pub type OsApplyCallback = Option<
    unsafe extern "C" fn(user_data: usize, snapshot: OsBytes, mode: i32, reply: *mut OsApplyReply),
>;

/// The answer slot of one apply call; consumed by [`openshell_apply_reply`].
pub struct OsApplyReply(pub(crate) mpsc::SyncSender<ApplyOutcome>);

/// Answers an apply call and frees `reply`: an empty `reason` applies the
/// snapshot, a non-empty one rejects it (the reason goes to the gateway,
/// bounded and scrubbed of provider values by the core).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_apply_reply(reply: *mut OsApplyReply, reason: OsBytes) -> i32 {
    if reply.is_null() {
        return OS_INVALID;
    }
    guard_sync(|| {
        let reply = unsafe { Box::from_raw(reply) };
        let reason = String::from_utf8_lossy(&unsafe { reason.to_vec() }).into_owned();
        let outcome = if reason.is_empty() {
            ApplyOutcome::Applied
        } else {
            ApplyOutcome::Rejected(reason)
        };
        let _ = reply.0.send(outcome);
        OS_OK
    })
}

/// Options of a config session, passed by value.
#[repr(C)]
pub struct OsConfigSessionOptions {
    /// Interval of `GetSandboxConfig` polls while nothing is pushed; 0: 10 s.
    pub poll_interval_ms: u64,
    /// Announce support for pushed configuration in the hello.
    pub announce_push: bool,
    /// Identifies this supervisor instance; empty: generated.
    pub instance_id: OsBytes,
    pub apply: OsApplyCallback,
    /// Passed back to `apply`.
    pub apply_data: usize,
}

/// A config session. Run it with [`openshell_config_session_run`]; free
/// it with [`openshell_config_session_free`].
pub struct OsConfigSession {
    session: ConfigSession,
    running: Arc<AtomicBool>,
}

/// A session's run, held from the export that starts it until its future
/// ends (dropped, so also when it panics or its task is dropped): a second
/// run of the same session meanwhile is refused.
pub(crate) struct RunClaim(Arc<AtomicBool>);

impl RunClaim {
    /// The claim, or `None` while another run of the session holds it.
    pub(crate) fn claim(running: &Arc<AtomicBool>) -> Option<Self> {
        (!running.swap(true, Ordering::AcqRel)).then(|| Self(running.clone()))
    }
}

impl Drop for RunClaim {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The refusal of a second concurrent run: `failed_precondition` (the
/// session's state, not the arguments, is what is wrong), not retryable.
pub(crate) fn already_running(what: &str) -> ErrorParts {
    ErrorParts {
        code: "failed_precondition".to_owned(),
        message: format!(
            "the {what} is already running: one run at a time (the running one goes on)"
        ),
        served_by: String::new(),
        grpc_status: 9,
        retryable: false,
        logs: String::new(),
    }
}

/// Counters of a config session.
#[repr(C)]
#[derive(Default)]
pub struct OsConfigSessionStats {
    /// 0 before anything arrived, else `OS_MODE_PUSH` or `OS_MODE_POLL`.
    pub mode: i32,
    pub applied: u64,
    pub rejected: u64,
    pub duplicates: u64,
    pub updates_received: u64,
    pub last_update_id: u64,
    pub config_revision: u64,
    pub polls: u64,
    pub sessions_accepted: u64,
    pub redirects: u64,
}

pub(crate) fn snapshot_bytes(snapshot: &ConfigSnapshot) -> Vec<u8> {
    let mut out = Vec::new();
    snapshot
        .sandbox_config
        .encode_length_delimited(&mut out)
        .expect("a Vec grows as needed");
    snapshot
        .provider_environment
        .encode_length_delimited(&mut out)
        .expect("a Vec grows as needed");
    out
}

/// The client configuration of a session (config or host): the token is
/// the session's own (sandbox or host token), owner routing is off.
pub(crate) fn client_config(client: &OsClientOptions) -> Result<ClientConfig, Error> {
    let endpoint = unsafe { client.endpoint.to_string("endpoint") }?;
    let mut config = ClientConfig::builder(endpoint)
        .allow_cleartext_token(client.allow_cleartext_token)
        .owner_routing(false);
    if let Some(token) = unsafe { client.token.to_opt_string("token") }? {
        config = config.token(token);
    }
    let pem = unsafe { client.ca_pem.to_vec() };
    if !pem.is_empty() {
        config = config.ca_pem(pem);
    }
    if let Some(name) = unsafe { client.tls_server_name.to_opt_string("tls server name") }? {
        config = config.tls_server_name(name);
    }
    if client.connect_timeout_ms > 0 {
        config = config.connect_timeout(Duration::from_millis(client.connect_timeout_ms));
    }
    config.build()
}

fn build(
    client: &OsClientOptions,
    sandbox_id: OsBytes,
    options: &OsConfigSessionOptions,
) -> Result<ConfigSession, Error> {
    let config = client_config(client)?;
    let sandbox_id = unsafe { sandbox_id.to_string("sandbox id") }?;
    let callback = options
        .apply
        .ok_or_else(|| Error::invalid_config("an apply function is required"))?;
    let user_data = options.apply_data;
    let apply = move |snapshot: ConfigSnapshot, mode: DeliveryMode| -> ApplyOutcome {
        let bytes = snapshot_bytes(&snapshot);
        let (tx, rx) = mpsc::sync_channel(1);
        let mode = match mode {
            DeliveryMode::Push => OS_MODE_PUSH,
            DeliveryMode::Poll => OS_MODE_POLL,
        };
        let called = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let reply = Box::into_raw(Box::new(OsApplyReply(tx)));
            unsafe { callback(user_data, OsBytes::of(&bytes), mode, reply) }
        }));
        if called.is_err() {
            return ApplyOutcome::Rejected("the apply callback could not be called".into());
        }
        rx.recv()
            .unwrap_or_else(|_| ApplyOutcome::Rejected("the apply callback never answered".into()))
    };
    let mut builder = ConfigSession::builder(config, sandbox_id)
        .apply_with_mode(std::sync::Arc::new(apply))
        .config_push(options.announce_push);
    if options.poll_interval_ms > 0 {
        builder = builder.poll_interval(Duration::from_millis(options.poll_interval_ms));
    }
    if let Some(id) = unsafe { options.instance_id.to_opt_string("instance id") }? {
        builder = builder.instance_id(id);
    }
    builder.build()
}

/// Builds a config session for `sandbox_id` with the sandbox's token in
/// `client.token` (the client's token provider is not used here).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_config_session_new(
    client: OsClientOptions,
    sandbox_id: OsBytes,
    options: OsConfigSessionOptions,
    out: *mut *mut OsConfigSession,
    error: *mut *mut OsErrorBox,
) -> i32 {
    if out.is_null() {
        return OS_INVALID;
    }
    guard_sync(|| match build(&client, sandbox_id, &options) {
        Ok(session) => {
            let running = Arc::default();
            unsafe { *out = Box::into_raw(Box::new(OsConfigSession { session, running })) };
            OS_OK
        }
        Err(err) => {
            unsafe { put_error(error, ErrorParts::of(&err)) };
            OS_ERROR
        }
    })
}

/// Runs the session (startup poll, hello, pushed or polled updates,
/// redirects, reconnects) until `cancel` is cancelled; then the callback
/// fires (`OS_OK`). `cancel` is required. One run at a time: while a run of
/// this session is under way, another completes at once with
/// `failed_precondition` and changes nothing (the first goes on).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_config_session_run(
    session: *const OsConfigSession,
    cancel: *const OsCancel,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let (Some(s), Some(cancel)) = (unsafe { session.as_ref() }, unsafe { cancel.as_ref() }) else {
        return OS_INVALID;
    };
    start_parts(callback, user_data, || {
        let session = s.session.clone();
        let token: CancellationToken = cancel.0.clone();
        let claim = RunClaim::claim(&s.running);
        async move {
            let Some(_claim) = claim else {
                return Err(already_running("config session"));
            };
            session.run(token).await.map_err(|e| ErrorParts::of(&e))?;
            Ok(Outcome::Value(Vec::new()))
        }
    })
}

/// Writes the session's counters to `*out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_config_session_stats(
    session: *const OsConfigSession,
    out: *mut OsConfigSessionStats,
) -> i32 {
    let (Some(s), false) = (unsafe { session.as_ref() }, out.is_null()) else {
        return OS_INVALID;
    };
    guard_sync(|| {
        let st = s.session.stats();
        unsafe {
            *out = OsConfigSessionStats {
                mode: match st.mode {
                    None => 0,
                    Some(DeliveryMode::Push) => OS_MODE_PUSH,
                    Some(DeliveryMode::Poll) => OS_MODE_POLL,
                },
                applied: st.applied,
                rejected: st.rejected,
                duplicates: st.duplicates,
                updates_received: st.updates_received,
                last_update_id: st.last_update_id,
                config_revision: st.config_revision,
                polls: st.polls,
                sessions_accepted: st.sessions_accepted,
                redirects: st.redirects,
            }
        };
        OS_OK
    })
}

/// The replica holding the session now (empty when none); free with
/// `openshell_bytes_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_config_session_served_by(
    session: *const OsConfigSession,
) -> OsOwnedBytes {
    let empty = || OsOwnedBytes {
        ptr: std::ptr::null_mut(),
        len: 0,
        cap: 0,
    };
    let Some(s) = (unsafe { session.as_ref() }) else {
        return empty();
    };
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        OsOwnedBytes::from_vec(s.session.stats().served_by.unwrap_or_default().into_bytes())
    }))
    .unwrap_or_else(|_| empty())
}

/// Frees a session (null is ignored). Cancel its run first: a running
/// session keeps going until its token is cancelled.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_config_session_free(session: *mut OsConfigSession) {
    if !session.is_null() {
        let _ =
            std::panic::catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(session) })));
    }
}
