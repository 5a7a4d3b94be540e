//! The C ABI's contract, exercised through the exports as a C caller would:
//! argument refusals never call back, every accepted call completes exactly
//! once (errors and cancellation included), errors carry the core's code.

use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use openshell_c::*;

/// What one callback saw: (status, error code).
#[derive(Default)]
struct Seen(Mutex<Vec<(i32, String)>>);

unsafe extern "C" fn record(user_data: usize, completion: *const OsCompletion) {
    let seen = unsafe { &*(user_data as *const Seen) };
    let c = unsafe { &*completion };
    let code = if c.error.code.len == 0 {
        String::new()
    } else {
        let bytes = unsafe { std::slice::from_raw_parts(c.error.code.ptr, c.error.code.len) };
        String::from_utf8_lossy(bytes).into_owned()
    };
    seen.0.lock().unwrap().push((c.status, code));
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

fn options(endpoint: &str) -> OsClientOptions {
    OsClientOptions {
        endpoint: bytes(endpoint),
        token: empty(),
        ca_pem: empty(),
        tls_server_name: empty(),
        connect_timeout_ms: 2000,
        default_timeout_ms: 0,
        exec_output_limit: 0,
        allow_cleartext_token: false,
        token_provider: None,
        token_provider_data: 0,
    }
}

fn client(endpoint: &str) -> *mut OsClient {
    let mut out = std::ptr::null_mut();
    let status = unsafe { openshell_client_new(options(endpoint), &mut out, std::ptr::null_mut()) };
    assert_eq!(status, OS_OK);
    out
}

fn call_options(cancel: *const OsCancel, timeout_ms: u64) -> OsCallOptions {
    OsCallOptions {
        timeout_ms,
        cancel,
        output_limit: 0,
    }
}

/// Waits (bounded) until `seen` has `n` entries, then a little longer to
/// catch a second firing.
fn settled(seen: &Seen, n: usize) -> Vec<(i32, String)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.0.lock().unwrap().len() < n {
        assert!(Instant::now() < deadline, "no completion within 20 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    seen.0.lock().unwrap().clone()
}

#[test]
fn refused_arguments_never_call_back() {
    let seen = Seen::default();
    let ud = &seen as *const Seen as usize;
    let status = unsafe {
        openshell_client_call(
            std::ptr::null(),
            OS_OP_HEALTH,
            empty(),
            call_options(std::ptr::null(), 0),
            Some(record),
            ud,
        )
    };
    assert_eq!(status, OS_INVALID);
    let c = client("http://127.0.0.1:1");
    let status = unsafe {
        openshell_client_call(
            c,
            OS_OP_HEALTH,
            empty(),
            call_options(std::ptr::null(), 0),
            None,
            ud,
        )
    };
    assert_eq!(status, OS_INVALID);
    std::thread::sleep(Duration::from_millis(100));
    assert!(seen.0.lock().unwrap().is_empty());
    unsafe { openshell_client_free(c) };
}

#[test]
fn a_bad_endpoint_is_an_error_box_with_its_code() {
    let mut out = std::ptr::null_mut();
    let mut error = std::ptr::null_mut();
    let status =
        unsafe { openshell_client_new(options("ftp://127.0.0.1:1"), &mut out, &mut error) };
    assert_eq!(status, OS_ERROR);
    assert!(out.is_null() && !error.is_null());
    let view = unsafe { openshell_error_view(error) };
    let code = unsafe { std::slice::from_raw_parts(view.code.ptr, view.code.len) };
    assert_eq!(code, b"invalid_config");
    assert_eq!(view.grpc_status, 3);
    unsafe { openshell_error_free(error) };
}

#[test]
fn an_unreachable_gateway_completes_once_with_connect() {
    let seen = Seen::default();
    let c = client("http://127.0.0.1:1");
    let status = unsafe {
        openshell_client_call(
            c,
            OS_OP_HEALTH,
            empty(),
            call_options(std::ptr::null(), 0),
            Some(record),
            &seen as *const Seen as usize,
        )
    };
    assert_eq!(status, OS_OK);
    assert_eq!(settled(&seen, 1), vec![(OS_ERROR, "connect".to_owned())]);
    unsafe { openshell_client_free(c) };
}

#[test]
fn cancel_and_close_complete_a_hanging_call_exactly_once() {
    // A peer that accepts and never answers: the call hangs until cancelled.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    // Connections are kept open for the life of the test process.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in silent.incoming() {
            held.push(conn);
        }
    });
    let c = client(&format!("http://{addr}"));
    let seen = Seen::default();
    let cancel = openshell_cancel_new();
    let status = unsafe {
        openshell_client_call(
            c,
            OS_OP_HEALTH,
            empty(),
            call_options(cancel, 0),
            Some(record),
            &seen as *const Seen as usize,
        )
    };
    assert_eq!(status, OS_OK);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        seen.0.lock().unwrap().is_empty(),
        "completed before the cancel"
    );
    unsafe { openshell_cancel_cancel(cancel) };
    unsafe { openshell_cancel_cancel(cancel) };
    assert_eq!(settled(&seen, 1), vec![(OS_ERROR, "cancelled".to_owned())]);
    unsafe { openshell_cancel_free(cancel) };

    // close() ends a call in flight the same way.
    let closed = Seen::default();
    let status = unsafe {
        openshell_client_call(
            c,
            OS_OP_HEALTH,
            empty(),
            call_options(std::ptr::null(), 0),
            Some(record),
            &closed as *const Seen as usize,
        )
    };
    assert_eq!(status, OS_OK);
    std::thread::sleep(Duration::from_millis(200));
    unsafe { openshell_client_close(c) };
    assert_eq!(
        settled(&closed, 1),
        vec![(OS_ERROR, "cancelled".to_owned())]
    );
    unsafe { openshell_client_free(c) };
}

#[test]
fn a_deadline_completes_with_deadline_exceeded() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let c = client(&format!("http://{addr}"));
    let seen = Seen::default();
    let status = unsafe {
        openshell_client_call(
            c,
            OS_OP_HEALTH,
            empty(),
            call_options(std::ptr::null(), 300),
            Some(record),
            &seen as *const Seen as usize,
        )
    };
    assert_eq!(status, OS_OK);
    assert_eq!(
        settled(&seen, 1),
        vec![(OS_ERROR, "deadline_exceeded".to_owned())]
    );
    unsafe { openshell_client_free(c) };
    drop(silent);
}

#[test]
fn bad_request_bytes_complete_with_invalid_config() {
    let c = client("http://127.0.0.1:1");
    let seen = Seen::default();
    let garbage = [0xffu8, 0xff, 0xff];
    let status = unsafe {
        openshell_client_call(
            c,
            OS_OP_GET,
            OsBytes {
                ptr: garbage.as_ptr(),
                len: garbage.len(),
            },
            call_options(std::ptr::null(), 0),
            Some(record),
            &seen as *const Seen as usize,
        )
    };
    assert_eq!(status, OS_OK);
    assert_eq!(
        settled(&seen, 1),
        vec![(OS_ERROR, "invalid_config".to_owned())]
    );
    unsafe { openshell_client_free(c) };
}

fn error_code(error: *mut OsErrorBox) -> String {
    let view = unsafe { openshell_error_view(error) };
    let code = unsafe { std::slice::from_raw_parts(view.code.ptr, view.code.len) };
    let code = String::from_utf8_lossy(code).into_owned();
    unsafe { openshell_error_free(error) };
    code
}

#[test]
fn a_blocking_call_reports_errors_and_ends_when_cancelled_from_another_thread() {
    let c = client("http://127.0.0.1:1");
    let mut out = OsOwnedBytes {
        ptr: std::ptr::null_mut(),
        len: 0,
        cap: 0,
    };
    let mut error = std::ptr::null_mut();
    let status = unsafe {
        openshell_client_call_blocking(
            c,
            OS_OP_HEALTH,
            empty(),
            call_options(std::ptr::null(), 0),
            &mut out,
            &mut error,
        )
    };
    assert_eq!(status, OS_ERROR);
    assert_eq!(error_code(error), "connect");
    unsafe { openshell_client_free(c) };

    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in silent.incoming() {
            held.push(conn);
        }
    });
    let c = client(&format!("http://{addr}"));
    let cancel = openshell_cancel_new() as usize;
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        unsafe { openshell_cancel_cancel(cancel as *const OsCancel) };
    });
    let started = Instant::now();
    let mut error = std::ptr::null_mut();
    let status = unsafe {
        openshell_client_call_blocking(
            c,
            OS_OP_HEALTH,
            empty(),
            call_options(cancel as *const OsCancel, 0),
            &mut out,
            &mut error,
        )
    };
    assert_eq!(status, OS_ERROR);
    assert_eq!(error_code(error), "cancelled");
    assert!(started.elapsed() < Duration::from_secs(10));
    canceller.join().unwrap();
    unsafe { openshell_cancel_free(cancel as *mut OsCancel) };
    unsafe { openshell_client_free(c) };
}

unsafe extern "C" fn never_called(_: usize, _: OsBytes, _: OsBytes, reply: *mut OsApplyReply) {
    unsafe { openshell_apply_reply(reply, empty()) };
}

fn host_options(apply: OsHostApplyCallback) -> OsHostSessionOptions {
    OsHostSessionOptions {
        capacity: 0,
        config_push: true,
        instance_id: bytes("inst-1"),
        apply,
        apply_data: 0,
    }
}

#[test]
fn a_host_session_refuses_bad_input_with_invalid_config_and_runs_until_cancelled() {
    let mut session = std::ptr::null_mut();
    let mut error = std::ptr::null_mut();
    // An empty member id, then no apply callback: invalid_config, no session.
    for (member, apply) in [(" ", Some(never_called as _)), ("h-0", None)] {
        let status = unsafe {
            openshell_host_session_new(
                options("http://127.0.0.1:1"),
                bytes(member),
                host_options(apply),
                &mut session,
                &mut error,
            )
        };
        assert_eq!(status, OS_ERROR);
        assert!(session.is_null());
        assert_eq!(error_code(error), "invalid_config");
    }
    let status = unsafe {
        openshell_host_session_new(
            options("http://127.0.0.1:1"),
            bytes("h-0"),
            host_options(Some(never_called)),
            &mut session,
            &mut error,
        )
    };
    assert_eq!(status, OS_OK);
    let text = |which| unsafe {
        let b = openshell_host_session_text(session, which);
        let s = String::from_utf8_lossy(std::slice::from_raw_parts(b.ptr, b.len)).into_owned();
        openshell_bytes_free(b);
        s
    };
    assert_eq!(text(OS_HOST_INSTANCE_ID), "inst-1");
    assert_eq!(text(OS_HOST_SESSION_ID), "");
    // Without a cancel token the run is refused and never calls back.
    let seen = Seen::default();
    let ud = &seen as *const Seen as usize;
    let refused =
        unsafe { openshell_host_session_run(session, std::ptr::null(), Some(record), ud) };
    assert_eq!(refused, OS_INVALID);
    // With one, it runs (nothing is reachable) until cancelled: OS_OK once.
    let cancel = openshell_cancel_new();
    assert_eq!(
        unsafe { openshell_host_session_run(session, cancel, Some(record), ud) },
        OS_OK
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut stats = OsHostSessionStats::default();
    assert_eq!(
        unsafe { openshell_host_session_stats(session, &mut stats) },
        OS_OK
    );
    assert_eq!((stats.sessions_accepted, stats.assigned), (0, 0));
    unsafe { openshell_cancel_cancel(cancel) };
    assert_eq!(settled(&seen, 1), vec![(OS_OK, String::new())]);
    unsafe {
        openshell_cancel_free(cancel);
        openshell_host_session_free(session);
    }
}

/// What a local cluster's start completed with: (status, code, logs).
#[derive(Default)]
struct Started(Mutex<Option<(i32, String, String)>>);

unsafe extern "C" fn record_start(user_data: usize, completion: *const OsCompletion) {
    let started = unsafe { &*(user_data as *const Started) };
    let c = unsafe { &*completion };
    let text = |b: OsBytes| match b.len {
        0 => String::new(),
        n => String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(b.ptr, n) }).into_owned(),
    };
    if !c.handle.is_null() {
        unsafe { openshell_local_cluster_free(c.handle as *mut OsLocalCluster) };
    }
    *started.0.lock().unwrap() = Some((c.status, text(c.error.code), text(c.error.logs)));
}

fn start_cluster(replicas: u32, gateway_bin: &str) -> (i32, String, String) {
    let started = Started::default();
    let options = OsLocalClusterOptions {
        replicas,
        hosts: 0,
        config_delivery: empty(),
        isolation: empty(),
        restart_crashed: false,
        gateway_bin: bytes(gateway_bin),
    };
    let status = unsafe {
        openshell_local_cluster_start(
            options,
            Some(record_start),
            &started as *const Started as usize,
        )
    };
    assert_eq!(status, OS_OK);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(outcome) = started.0.lock().unwrap().take() {
            return outcome;
        }
        assert!(Instant::now() < deadline, "no completion within 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_local_cluster_start_reports_bad_options_and_a_failed_start_with_its_logs() {
    let (status, code, logs) = start_cluster(0, "/bin/false");
    assert_eq!(
        (status, code.as_str(), logs.as_str()),
        (OS_ERROR, "invalid_config", "")
    );
    // `up` exits at once: the start fails, its logs kept and named.
    let (status, code, logs) = start_cluster(1, "/bin/false");
    assert_eq!((status, code.as_str()), (OS_ERROR, "cluster"));
    assert!(
        std::path::Path::new(&logs).join("up.log").is_file(),
        "{logs}"
    );
    std::fs::remove_dir_all(&logs).unwrap();
    let refused = unsafe {
        openshell_local_cluster_fault(
            std::ptr::null(),
            OS_FAULT_KILL_REPLICA,
            empty(),
            Some(record),
            0,
        )
    };
    assert_eq!(refused, OS_INVALID);
}
