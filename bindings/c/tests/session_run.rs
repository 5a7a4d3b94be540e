//! One run at a time per session, against the real gateway: a second
//! `openshell_config_session_run` / `openshell_host_session_run` of a
//! session while its first run is under way completes at once with
//! `failed_precondition` and changes nothing; the first run goes on, ends
//! when cancelled, and the session can run again afterwards.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use openshell_c::*;
use openshell_sdk::proto as pb;
use openshell_testkit::{Gateway, GatewayOptions, issue_host_token, sandbox_token};
use prost::Message;

/// One completion: status, error code, error message, value.
type Done = (i32, String, String, Vec<u8>);

/// The completions of one async call.
#[derive(Default)]
struct Slot {
    seen: Mutex<Vec<Done>>,
    changed: Condvar,
}

fn text(b: OsBytes) -> String {
    if b.len == 0 {
        return String::new();
    }
    String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(b.ptr, b.len) }).into_owned()
}

unsafe extern "C" fn record(user_data: usize, completion: *const OsCompletion) {
    let slot = unsafe { &*(user_data as *const Slot) };
    let c = unsafe { &*completion };
    let value = if c.value.len == 0 {
        Vec::new()
    } else {
        unsafe { std::slice::from_raw_parts(c.value.ptr, c.value.len) }.to_vec()
    };
    slot.seen
        .lock()
        .unwrap()
        .push((c.status, text(c.error.code), text(c.error.message), value));
    slot.changed.notify_all();
}

impl Slot {
    fn user_data(&self) -> usize {
        self as *const Slot as usize
    }

    /// The one completion, waited for up to `limit` (`None` if none came).
    fn within(&self, limit: Duration) -> Option<Done> {
        let deadline = Instant::now() + limit;
        let mut seen = self.seen.lock().unwrap();
        while seen.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            seen = self.changed.wait_timeout(seen, left).unwrap().0;
        }
        assert_eq!(seen.len(), 1, "a completion fired more than once");
        Some(seen[0].clone())
    }

    fn is_empty(&self) -> bool {
        self.seen.lock().unwrap().is_empty()
    }
}

fn bytes(s: &str) -> OsBytes {
    OsBytes {
        ptr: s.as_ptr(),
        len: s.len(),
    }
}

fn empty() -> OsBytes {
    OsBytes {
        ptr: std::ptr::null(),
        len: 0,
    }
}

fn client_options<'a>(endpoint: &'a str, token: &'a str) -> OsClientOptions {
    OsClientOptions {
        endpoint: bytes(endpoint),
        token: bytes(token),
        ca_pem: empty(),
        tls_server_name: empty(),
        connect_timeout_ms: 5000,
        default_timeout_ms: 0,
        exec_output_limit: 0,
        allow_cleartext_token: true,
        token_provider: None,
        token_provider_data: 0,
    }
}

/// Applies everything at once (answered from the callback's thread).
unsafe extern "C" fn apply_all(_: usize, _: OsBytes, _: i32, reply: *mut OsApplyReply) {
    unsafe { openshell_apply_reply(reply, empty()) };
}

unsafe extern "C" fn host_apply_all(_: usize, _: OsBytes, _: OsBytes, reply: *mut OsApplyReply) {
    unsafe { openshell_apply_reply(reply, empty()) };
}

/// Polls `check` every 20 ms for up to 30 s.
fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Creates a sandbox through the C ABI and returns its id.
fn create_sandbox(endpoint: &str, name: &str) -> String {
    let mut client = std::ptr::null_mut();
    let status = unsafe {
        openshell_client_new(
            client_options(endpoint, ""),
            &mut client,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, OS_OK);
    let request = pb::CreateSandboxRequest {
        name: name.to_owned(),
        ..Default::default()
    }
    .encode_to_vec();
    let slot = Slot::default();
    let status = unsafe {
        openshell_client_call(
            client,
            OS_OP_CREATE,
            OsBytes {
                ptr: request.as_ptr(),
                len: request.len(),
            },
            OsCallOptions {
                timeout_ms: 30_000,
                cancel: std::ptr::null(),
                output_limit: 0,
            },
            Some(record),
            slot.user_data(),
        )
    };
    assert_eq!(status, OS_OK);
    let (status, code, message, value) = slot.within(Duration::from_secs(60)).expect("created");
    assert_eq!(status, OS_OK, "create: {code}: {message}");
    unsafe { openshell_client_free(client) };
    let sandbox = pb::Sandbox::decode(value.as_slice()).expect("a Sandbox");
    sandbox.metadata.expect("metadata").id
}

/// The checks both kinds of session share: `run` starts a run with a
/// cancel token and a slot; `accepted` reads the session's accepted count.
fn one_run_at_a_time(
    what: &str,
    run: impl Fn(*const OsCancel, &Slot) -> i32,
    accepted: impl Fn() -> u64,
) {
    let first_cancel = openshell_cancel_new();
    let first = Slot::default();
    assert_eq!(run(first_cancel, &first), OS_OK);
    until("the first run's session accepted", || accepted() == 1);

    // A second run while the first one runs: refused at once.
    let second_cancel = openshell_cancel_new();
    let second = Slot::default();
    assert_eq!(run(second_cancel, &second), OS_OK);
    let refused = second.within(Duration::from_secs(20));
    unsafe { openshell_cancel_cancel(second_cancel) };
    let (status, code, message, _) = match refused {
        Some(done) => done,
        None => {
            // Not refused: it ran (until the cancel above); let it end.
            let _ = second.within(Duration::from_secs(20));
            panic!("a second run of the {what} while one ran was not refused");
        }
    };
    assert_eq!(
        (status, code.as_str()),
        (OS_ERROR, "failed_precondition"),
        "{message}"
    );
    assert!(message.contains("already running"), "{message}");

    // The first run goes on, unchanged.
    assert!(
        first.is_empty(),
        "the first run ended: {:?}",
        first.within(Duration::ZERO)
    );
    assert_eq!(accepted(), 1);
    unsafe { openshell_cancel_cancel(first_cancel) };
    let (status, code, message, _) = first
        .within(Duration::from_secs(20))
        .expect("the first run ends once cancelled");
    assert_eq!(status, OS_OK, "{code}: {message}");

    // Once it ended, the session runs again.
    let third_cancel = openshell_cancel_new();
    let third = Slot::default();
    assert_eq!(run(third_cancel, &third), OS_OK);
    until("the session accepted again", || accepted() == 2);
    unsafe { openshell_cancel_cancel(third_cancel) };
    let (status, code, message, _) = third
        .within(Duration::from_secs(20))
        .expect("the third run ends once cancelled");
    assert_eq!(status, OS_OK, "{code}: {message}");
    for token in [first_cancel, second_cancel, third_cancel] {
        unsafe { openshell_cancel_free(token) };
    }
}

#[test]
fn a_config_session_refuses_a_second_concurrent_run() {
    let gw = Gateway::start(GatewayOptions {
        extra_args: vec![
            "--config-delivery-mode".into(),
            "push".into(),
            "--driver".into(),
            "none".into(),
        ],
        ..GatewayOptions::dev()
    });
    let id = create_sandbox(&gw.url, "c-abi-twice");
    let token = sandbox_token(&gw.store_dir(), &id).expect("the sandbox's token");
    let options = OsConfigSessionOptions {
        poll_interval_ms: 0,
        announce_push: true,
        instance_id: empty(),
        apply: Some(apply_all),
        apply_data: 0,
    };
    let mut session = std::ptr::null_mut();
    let status = unsafe {
        openshell_config_session_new(
            client_options(&gw.url, &token),
            bytes(&id),
            options,
            &mut session,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, OS_OK);
    let session = session as usize;
    one_run_at_a_time(
        "config session",
        |cancel, slot| unsafe {
            openshell_config_session_run(
                session as *const OsConfigSession,
                cancel,
                Some(record),
                slot.user_data(),
            )
        },
        || {
            let mut stats = OsConfigSessionStats::default();
            unsafe { openshell_config_session_stats(session as *const _, &mut stats) };
            stats.sessions_accepted
        },
    );
    unsafe { openshell_config_session_free(session as *mut OsConfigSession) };
}

#[test]
fn a_host_session_refuses_a_second_concurrent_run() {
    let gw = Gateway::start(GatewayOptions {
        extra_args: vec![
            "--driver".into(),
            "hosts".into(),
            "--config-delivery-mode".into(),
            "push".into(),
        ],
        ..GatewayOptions::dev()
    });
    let host_id = "h-c-abi-twice";
    let token = issue_host_token(&gw.store_dir(), host_id);
    let options = OsHostSessionOptions {
        capacity: 0,
        config_push: true,
        instance_id: empty(),
        apply: Some(host_apply_all),
        apply_data: 0,
    };
    let mut session = std::ptr::null_mut();
    let status = unsafe {
        openshell_host_session_new(
            client_options(&gw.url, &token),
            bytes(host_id),
            options,
            &mut session,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(status, OS_OK);
    let session = session as usize;
    one_run_at_a_time(
        "host session",
        |cancel, slot| unsafe {
            openshell_host_session_run(
                session as *const OsHostSession,
                cancel,
                Some(record),
                slot.user_data(),
            )
        },
        || {
            let mut stats = OsHostSessionStats::default();
            unsafe { openshell_host_session_stats(session as *const _, &mut stats) };
            stats.sessions_accepted
        },
    );
    unsafe { openshell_host_session_free(session as *mut OsHostSession) };
}
