//! Stream handles: watch, streaming and interactive exec, raw streams.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::StreamExt;
use openshell_sdk::proto as pb;
use openshell_sdk::{
    Client, Error, ExecEvent, ExecInput, ExecStream, Metadata, RawReceiver, RawSender, SandboxWatch,
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

enum Receiver {
    Watch(SandboxWatch),
    Exec(ExecStream),
    Raw(RawReceiver),
}

enum Sender {
    None,
    Input(ExecInput),
    Raw(RawSender),
}

/// A stream. Receive with [`openshell_stream_next`], send with
/// [`openshell_stream_send`]; free with [`openshell_stream_free`].
pub struct OsStream {
    receiver: Arc<tokio::sync::Mutex<Receiver>>,
    sender: Arc<Sender>,
    cancel: CallCancel,
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

fn handle(receiver: Receiver, sender: Sender, cancel: CallCancel) -> Outcome {
    let stream = OsStream {
        receiver: Arc::new(tokio::sync::Mutex::new(receiver)),
        sender: Arc::new(sender),
        cancel,
    };
    Outcome::Handle(Box::into_raw(Box::new(stream)) as usize)
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
        async move {
            let next = async {
                let mut receiver = receiver.lock().await;
                let item = match &mut *receiver {
                    Receiver::Watch(w) => {
                        w.next().await.map(|r| r.map(|s| s.proto.encode_to_vec()))
                    }
                    Receiver::Exec(e) => e.next().await.map(|r| r.map(event_bytes)),
                    Receiver::Raw(r) => r.recv().await.transpose().map(|r| r.map(|b| b.to_vec())),
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
/// an interactive exec, the request message on a raw stream.
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
            Sender::None => {}
            Sender::Input(input) => input.close(),
            Sender::Raw(raw) => raw.close(),
        }
        OS_OK
    })
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
