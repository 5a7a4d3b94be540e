//! The host side of a shared supervisor host: a host session (`HostSession`
//! of the core) that serves the configuration of every sandbox assigned to
//! the host through one apply callback, answered through the same reply
//! handle as a config session's ([`openshell_apply_reply`]).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, mpsc};

use openshell_sdk::{ApplyOutcome, CancellationToken, ConfigSnapshot, Error, HostSession};

use crate::client::OsClientOptions;
use crate::complete::{OsCallback, Outcome, start_parts};
use crate::session::{OsApplyReply, RunClaim, already_running, client_config, snapshot_bytes};
use crate::types::{
    ErrorParts, OS_ERROR, OS_INVALID, OS_OK, OsBytes, OsCancel, OsErrorBox, OsOwnedBytes,
    guard_sync, put_error,
};

/// The apply callback of a host session: called on a blocking thread of the
/// library, one call at a time per sandbox (calls for different sandboxes
/// may overlap), only for a snapshot that differs from the sandbox's last
/// applied one. `sandbox_id` and `snapshot` are borrowed for the call;
/// `snapshot` is laid out as for [`OsApplyCallback`](crate::OsApplyCallback)
/// (two length-delimited messages, the second one's values secret). The
/// host answers with [`openshell_apply_reply`], exactly once, from any
/// thread; that sandbox's session waits for the answer.
pub type OsHostApplyCallback = Option<
    unsafe extern "C" fn(
        user_data: usize,
        sandbox_id: OsBytes,
        snapshot: OsBytes,
        reply: *mut OsApplyReply,
    ),
>;

/// Options of a host session, passed by value.
#[repr(C)]
pub struct OsHostSessionOptions {
    /// Most sandboxes the host serves at once; 0: no limit.
    pub capacity: u32,
    /// Sandbox sessions announce support for pushed configuration (else
    /// they poll `GetSandboxConfig`).
    pub config_push: bool,
    /// Identifies this host instance; empty: generated.
    pub instance_id: OsBytes,
    /// Required.
    pub apply: OsHostApplyCallback,
    /// Passed back to `apply`.
    pub apply_data: usize,
}

/// A host session. Run it with [`openshell_host_session_run`]; free it
/// with [`openshell_host_session_free`].
pub struct OsHostSession {
    session: HostSession,
    running: Arc<AtomicBool>,
}

/// Counters of a host session.
#[repr(C)]
#[derive(Default)]
pub struct OsHostSessionStats {
    /// Host sessions the gateway accepted.
    pub sessions_accepted: u64,
    /// Redirects followed.
    pub redirects: u64,
    /// Redials of the replica that held a lost session.
    pub sticky_redials: u64,
    /// Falls back to the shared address.
    pub fallbacks: u64,
    /// Sandboxes in the last assignment.
    pub assigned: u64,
    /// Whether the last hello carried `stay`.
    pub stay: bool,
}

fn build(
    client: &OsClientOptions,
    member_id: OsBytes,
    options: &OsHostSessionOptions,
) -> Result<HostSession, Error> {
    let config = client_config(client)?;
    let member_id = unsafe { member_id.to_string("member id") }?;
    let callback = options
        .apply
        .ok_or_else(|| Error::invalid_config("an apply function is required"))?;
    let user_data = options.apply_data;
    let apply = move |sandbox_id: &str, snapshot: ConfigSnapshot| -> ApplyOutcome {
        let bytes = snapshot_bytes(&snapshot);
        let (tx, rx) = mpsc::sync_channel(1);
        let called = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let reply = Box::into_raw(Box::new(OsApplyReply(tx)));
            unsafe {
                callback(
                    user_data,
                    OsBytes::of(sandbox_id.as_bytes()),
                    OsBytes::of(&bytes),
                    reply,
                )
            }
        }));
        if called.is_err() {
            return ApplyOutcome::Rejected("the apply callback could not be called".into());
        }
        rx.recv()
            .unwrap_or_else(|_| ApplyOutcome::Rejected("the apply callback never answered".into()))
    };
    let mut builder = HostSession::builder(config, member_id)
        .apply(std::sync::Arc::new(apply))
        .capacity(options.capacity)
        .config_push(options.config_push);
    if let Some(id) = unsafe { options.instance_id.to_opt_string("instance id") }? {
        builder = builder.instance_id(id);
    }
    builder.build()
}

/// Builds a host session for host `member_id` (the id its host token was
/// issued for) with the host token in `client.token` (the client's token
/// provider is not used here). No I/O.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_host_session_new(
    client: OsClientOptions,
    member_id: OsBytes,
    options: OsHostSessionOptions,
    out: *mut *mut OsHostSession,
    error: *mut *mut OsErrorBox,
) -> i32 {
    if out.is_null() {
        return OS_INVALID;
    }
    guard_sync(|| match build(&client, member_id, &options) {
        Ok(session) => {
            let running = Arc::default();
            unsafe { *out = Box::into_raw(Box::new(OsHostSession { session, running })) };
            OS_OK
        }
        Err(err) => {
            unsafe { put_error(error, ErrorParts::of(&err)) };
            OS_ERROR
        }
    })
}

/// Runs the host session (hello, redirects, sticky redials, fallbacks, the
/// assigned sandboxes' sessions and their configuration) until `cancel` is
/// cancelled; then the callback fires (`OS_OK`). An unusable endpoint
/// completes with its error. `cancel` is required. One run at a time, as
/// for [`openshell_config_session_run`]:
/// a second run while one is under way completes at once with
/// `failed_precondition`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_host_session_run(
    session: *const OsHostSession,
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
                return Err(already_running("host session"));
            };
            session.run(token).await.map_err(|e| ErrorParts::of(&e))?;
            Ok(Outcome::Value(Vec::new()))
        }
    })
}

/// Writes the session's counters to `*out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_host_session_stats(
    session: *const OsHostSession,
    out: *mut OsHostSessionStats,
) -> i32 {
    let (Some(s), false) = (unsafe { session.as_ref() }, out.is_null()) else {
        return OS_INVALID;
    };
    guard_sync(|| {
        let st = s.session.stats();
        unsafe {
            *out = OsHostSessionStats {
                sessions_accepted: st.sessions_accepted,
                redirects: st.redirects,
                sticky_redials: st.sticky_redials,
                fallbacks: st.fallbacks,
                assigned: st.assigned as u64,
                stay: st.stay,
            }
        };
        OS_OK
    })
}

/// [`openshell_host_session_text`]: the replica holding the current session.
pub const OS_HOST_SERVED_BY: i32 = 1;
/// The gateway's id of the current session.
pub const OS_HOST_SESSION_ID: i32 = 2;
/// The instance id every hello carries.
pub const OS_HOST_INSTANCE_ID: i32 = 3;

/// One text of the session (`OS_HOST_SERVED_BY`, `OS_HOST_SESSION_ID` or
/// `OS_HOST_INSTANCE_ID`; empty when none or unknown); free with
/// `openshell_bytes_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_host_session_text(
    session: *const OsHostSession,
    which: i32,
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
        let text = match which {
            OS_HOST_SERVED_BY => s.session.stats().served_by.unwrap_or_default(),
            OS_HOST_SESSION_ID => s.session.stats().session_id.unwrap_or_default(),
            OS_HOST_INSTANCE_ID => s.session.instance_id().to_owned(),
            _ => String::new(),
        };
        OsOwnedBytes::from_vec(text.into_bytes())
    }))
    .unwrap_or_else(|_| empty())
}

/// Frees a host session (null is ignored). Cancel its run first: a running
/// session keeps going until its token is cancelled.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_host_session_free(session: *mut OsHostSession) {
    if !session.is_null() {
        let _ =
            std::panic::catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(session) })));
    }
}
