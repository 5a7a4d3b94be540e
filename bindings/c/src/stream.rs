//! Stream handles: watch, resumable event watches, streaming and
//! interactive exec, raw streams, and the stream forms of file transfer
//! (an upload sink takes chunks through `openshell_stream_send`, a download
//! source gives them through `openshell_stream_next`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use openshell_sdk::proto as pb;
use openshell_sdk::{
    Client, DownloadSource, Error, EventWatch, ExecEvent, ExecInput, ExecStream, LogLine, LogQuery,
    Metadata, RawReceiver, RawSender, SandboxWatch, UploadSink, WatchEvent, WatchOptions,
};
use prost::Message;

use crate::call::{Call, CallCancel, decode, exec_request};
use crate::complete::{OsCallback, Outcome, start};
use crate::types::{OS_INVALID, OS_OK, OsBytes, guard_sync, runtime};

/// `openshell_client_open` kind: `GetSandboxRequest` (the name) → a
/// stream of `Sandbox` snapshots as it changes.
pub const OS_STREAM_WATCH: u32 = 1;
/// `ExecSandboxRequest` → a stream of `ExecSandboxEvent`s ending with the
/// exit.
pub const OS_STREAM_EXEC: u32 = 2;
/// `ExecSandboxRequest` → `ExecSandboxEvent`s; send `ExecSandboxInput`
/// (`stdin` or `resize`); close-send closes stdin.
pub const OS_STREAM_INTERACTIVE: u32 = 3;
/// `WatchSandboxRequest` → `SandboxStreamEvent`s (each with its cursor):
/// the core's resumable watch (`Sandboxes::events`), which reopens the
/// stream after the last cursor when it breaks, and ends with
/// `out_of_range` when the gateway no longer holds what came after it.
/// [`openshell_stream_resumes`] counts the reopenings.
pub const OS_STREAM_EVENTS: u32 = 4;

pub(crate) enum Receiver {
    /// Nothing to receive (an upload sink): `next` ends at once.
    None,
    Watch(SandboxWatch),
    Events(EventWatch),
    Exec(ExecStream),
    Raw(RawReceiver),
    Download(DownloadSource),
}

pub(crate) enum Sender {
    None,
    Input(ExecInput),
    Raw(RawSender),
    /// `None` once finished or aborted.
    Upload(Box<tokio::sync::Mutex<Option<UploadSink>>>),
}

/// A stream. Receive with [`openshell_stream_next`], send with
/// [`openshell_stream_send`]; free with [`openshell_stream_free`].
pub struct OsStream {
    receiver: Arc<tokio::sync::Mutex<Receiver>>,
    pub(crate) sender: Arc<Sender>,
    pub(crate) cancel: CallCancel,
    /// An event watch's reopenings, as of its last event.
    resumes: Arc<AtomicU32>,
}

fn event_bytes(event: ExecEvent) -> Vec<u8> {
    use pb::exec_sandbox_event::Payload;
    let payload = match event {
        ExecEvent::Stdout(data) => Payload::Stdout(pb::ExecSandboxStdout {
            data: data.to_vec(),
        }),
        ExecEvent::Stderr(data) => Payload::Stderr(pb::ExecSandboxStderr {
            data: data.to_vec(),
        }),
        ExecEvent::Exit(code) => Payload::Exit(pb::ExecSandboxExit {
            exit_code: code,
            oom_killed: false,
        }),
    };
    pb::ExecSandboxEvent {
        payload: Some(payload),
    }
    .encode_to_vec()
}

/// A log line as the wire has it (the sandbox id is not kept by the core).
pub(crate) fn log_line_proto(line: LogLine) -> pb::SandboxLogLine {
    pb::SandboxLogLine {
        level: line.level,
        source: line.source,
        target: line.target,
        message: line.message,
        fields: line.fields.into_iter().collect(),
        event_time: line.time.map(prost_types::Timestamp::from),
        ..Default::default()
    }
}

fn watch_event_bytes(event: WatchEvent) -> Vec<u8> {
    use pb::sandbox_stream_event::Payload;
    let (payload, cursor) = match event {
        WatchEvent::Sandbox { sandbox, cursor } => (Payload::Sandbox(sandbox.proto), cursor),
        WatchEvent::Log { line, cursor } => (Payload::Log(log_line_proto(line)), cursor),
    };
    pb::SandboxStreamEvent {
        payload: Some(payload),
        cursor,
    }
    .encode_to_vec()
}

/// A log query of the wire's fields (0 and empty: unset).
pub(crate) fn log_query(
    tail: u32,
    since: Option<SystemTime>,
    sources: Vec<String>,
    min_level: String,
) -> LogQuery {
    let mut query = LogQuery::new();
    if tail > 0 {
        query = query.tail(tail);
    }
    if let Some(since) = since {
        query = query.since(since);
    }
    for source in sources {
        query = query.source(source);
    }
    if !min_level.is_empty() {
        query = query.min_level(min_level);
    }
    query
}

fn watch_options(r: pb::WatchSandboxRequest) -> Result<WatchOptions, Error> {
    let since = match r.since_time {
        Some(t) if t.seconds < 0 || t.nanos < 0 => {
            return Err(Error::invalid_config("since must not be before 1970"));
        }
        Some(t) => Some(SystemTime::UNIX_EPOCH + Duration::new(t.seconds as u64, t.nanos as u32)),
        None => None,
    };
    let mut watch = WatchOptions::new()
        .status(r.follow_status)
        .stop_on_terminal(r.stop_on_terminal);
    if r.follow_logs {
        watch = watch.logs(log_query(
            r.log_tail_lines,
            since,
            r.log_sources,
            r.log_min_level,
        ));
    }
    if !r.resume_after_cursor.is_empty() {
        watch = watch.resume_after(r.resume_after_cursor);
    }
    Ok(watch)
}

pub(crate) fn handle(receiver: Receiver, sender: Sender, cancel: CallCancel) -> Outcome {
    Outcome::Handle(stream_ptr(receiver, sender, cancel))
}

/// A new `OsStream` as a raw pointer (owned by the caller).
pub(crate) fn stream_ptr(receiver: Receiver, sender: Sender, cancel: CallCancel) -> usize {
    let stream = OsStream {
        receiver: Arc::new(tokio::sync::Mutex::new(receiver)),
        sender: Arc::new(sender),
        cancel,
        resumes: Arc::new(AtomicU32::new(0)),
    };
    Box::into_raw(Box::new(stream)) as usize
}

pub(crate) async fn open_stream(
    client: Client,
    kind: u32,
    request: Vec<u8>,
    call: Call,
) -> Result<Outcome, Error> {
    let token = call.token.clone();
    match kind {
        OS_STREAM_WATCH => {
            let r: pb::GetSandboxRequest = decode(&request, "GetSandboxRequest")?;
            let sandboxes = client.sandboxes();
            let watch = Call::run(&token, sandboxes.watch(&r.name, call.options)).await?;
            Ok(handle(Receiver::Watch(watch), Sender::None, token))
        }
        OS_STREAM_EVENTS => {
            let r: pb::WatchSandboxRequest = decode(&request, "WatchSandboxRequest")?;
            let name = r.sandbox.clone();
            let watch = watch_options(r)?;
            let events = client.sandboxes().events(&name, watch, call.options);
            Ok(handle(Receiver::Events(events), Sender::None, token))
        }
        OS_STREAM_EXEC => {
            let request = exec_request(&request, call.output_limit)?;
            let stream = Call::run(&token, client.exec_stream(request, call.options)).await?;
            Ok(handle(Receiver::Exec(stream), Sender::None, token))
        }
        OS_STREAM_INTERACTIVE => {
            let request = exec_request(&request, call.output_limit)?;
            let interactive =
                Call::run(&token, client.exec_interactive(request, call.options)).await?;
            let (input, events) = interactive.into_parts();
            Ok(handle(Receiver::Exec(events), Sender::Input(input), token))
        }
        other => Err(Error::invalid_config(format!(
            "unknown stream kind {other}"
        ))),
    }
}

pub(crate) async fn raw_stream(
    client: Client,
    path: String,
    metadata: Metadata,
    call: Call,
) -> Result<Outcome, Error> {
    let token = call.token.clone();
    let stream = Call::run(&token, client.raw_stream(&path, metadata, call.options)).await?;
    let (sender, receiver) = stream.split();
    Ok(handle(Receiver::Raw(receiver), Sender::Raw(sender), token))
}

/// Receives the next message: the completion's `value` (status `OS_OK`),
/// `OS_END` when the stream ended, or an error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_stream_next(
    stream: *const OsStream,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(s) = (unsafe { stream.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let receiver = s.receiver.clone();
        let cancel = s.cancel.clone();
        let resumes = s.resumes.clone();
        async move {
            let next = async {
                let mut receiver = receiver.lock().await;
                let item = match &mut *receiver {
                    Receiver::None => None,
                    Receiver::Watch(w) => {
                        w.next().await.map(|r| r.map(|s| s.proto.encode_to_vec()))
                    }
                    Receiver::Events(w) => {
                        let item = w.next().await.map(|r| r.map(watch_event_bytes));
                        resumes.store(w.resumes(), Ordering::Relaxed);
                        item
                    }
                    Receiver::Exec(e) => e.next().await.map(|r| r.map(event_bytes)),
                    Receiver::Raw(r) => r.recv().await.transpose().map(|r| r.map(|b| b.to_vec())),
                    Receiver::Download(d) => {
                        d.next_chunk().await.transpose().map(|r| r.map(Vec::from))
                    }
                };
                match item {
                    None => Ok(Outcome::End),
                    Some(Ok(bytes)) => Ok(Outcome::Value(bytes)),
                    Some(Err(e)) => Err(e),
                }
            };
            Call::run(&cancel, next).await
        }
    })
}

/// Sends one message: an encoded `ExecSandboxInput` (stdin or resize) on
/// an interactive exec, the request message on a raw stream, the next
/// bytes of the file on an upload stream (any length; the core sends them
/// in chunks and waits only when its window is full).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_stream_send(
    stream: *const OsStream,
    message: OsBytes,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(s) = (unsafe { stream.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let sender = s.sender.clone();
        let cancel = s.cancel.clone();
        let message = unsafe { message.to_vec() };
        async move {
            let send = async {
                match &*sender {
                    Sender::None => Err(Error::invalid_config("this stream takes no messages")),
                    Sender::Raw(raw) => raw.send(message.into()).await,
                    Sender::Upload(sink) => match sink.lock().await.as_mut() {
                        Some(sink) => sink.write(message.into()).await,
                        None => Err(Error::invalid_config("the upload already finished")),
                    },
                    Sender::Input(input) => {
                        use pb::exec_sandbox_input::Payload;
                        let m: pb::ExecSandboxInput = decode(&message, "ExecSandboxInput")?;
                        match m.payload {
                            Some(Payload::Stdin(data)) => input.write(data).await,
                            Some(Payload::Resize(r)) => input.resize(r.cols, r.rows).await,
                            _ => Err(Error::invalid_config(
                                "an interactive exec takes stdin or resize messages",
                            )),
                        }
                    }
                }
            };
            Call::run(&cancel, send).await?;
            Ok(Outcome::Value(Vec::new()))
        }
    })
}

/// Ends the sending side (stdin EOF for an interactive exec). Idempotent.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_stream_close_send(stream: *const OsStream) -> i32 {
    let Some(s) = (unsafe { stream.as_ref() }) else {
        return OS_INVALID;
    };
    guard_sync(|| {
        match &*s.sender {
            Sender::None | Sender::Upload(_) => {}
            Sender::Input(input) => input.close(),
            Sender::Raw(raw) => raw.close(),
        }
        OS_OK
    })
}

/// How many times an event watch (`OS_STREAM_EVENTS`) opened a new stream
/// after a broken one, as of the last event it returned (0 for other
/// streams and for null).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_stream_resumes(stream: *const OsStream) -> u32 {
    match unsafe { stream.as_ref() } {
        Some(s) => s.resumes.load(Ordering::Relaxed),
        None => 0,
    }
}

/// Cancels the stream: the RPC is reset (for exec, the gateway kills the
/// process) and pending and later operations end with `cancelled`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_stream_cancel(stream: *const OsStream) {
    if let Some(s) = unsafe { stream.as_ref() } {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            s.cancel.cancel();
            if let Sender::Raw(raw) = &*s.sender {
                raw.cancel();
            }
        }));
    }
}

/// Cancels and frees a stream (null is ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_stream_free(stream: *mut OsStream) {
    if !stream.is_null() {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let s = unsafe { Box::from_raw(stream) };
            s.cancel.cancel();
            let _guard = runtime().enter();
            drop(s);
        }));
    }
}
