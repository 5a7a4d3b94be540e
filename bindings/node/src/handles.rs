//! Handles of running operations: exec streams (batched events),
//! interactive exec, sandbox watches, forwards and raw streams.
//!
//! Each handle owns its core object. `cancel()` / `close()` end it
//! explicitly and are idempotent; dropping the handle (garbage collection)
//! drops the core object, which cancels its RPC or closes its forward.
//! `@openshell/sdk` turns the `next...()` methods into async iterators whose
//! early `break` calls `cancel()`.
//!
//! Exec events cross in batches: `nextBatch()` waits for one event, then
//! takes what is already there (up to 256 events or 1 MiB of output)
//! without waiting, so a chatty process costs one JavaScript wake-up per
//! batch. An event is `{ kind, data, exitCode }` with kind 1 stdout,
//! 2 stderr, 3 exit; an empty batch means the stream has ended.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use napi::bindgen_prelude::{BigInt, Buffer, PromiseRaw};
use napi::{Env, Result};
use napi_derive::napi;
use openshell_sdk::{
    CancellationToken, Error, ExecEvent, ExecInput, ExecOutput, ExecStream, ForwardHandle,
    Metadata, OutputCollector, RawReceiver, RawSender, RawStream, SandboxWatch,
};

use crate::errors::guard;
use crate::values::{NativeExecOutput, NativeSandbox, native_sandbox, pairs};

const BATCH_BYTES: usize = 1024 * 1024;
const BATCH_EVENTS: usize = 256;

#[napi(object)]
pub struct NativeEvent {
    /// 1 stdout, 2 stderr, 3 exit.
    pub kind: u32,
    pub data: Buffer,
    pub exit_code: i32,
}

fn native_event(event: ExecEvent) -> NativeEvent {
    match event {
        ExecEvent::Stdout(data) => NativeEvent {
            kind: 1,
            data: Buffer::from(data.to_vec()),
            exit_code: 0,
        },
        ExecEvent::Stderr(data) => NativeEvent {
            kind: 2,
            data: Buffer::from(data.to_vec()),
            exit_code: 0,
        },
        ExecEvent::Exit(code) => NativeEvent {
            kind: 3,
            data: Buffer::from(Vec::new()),
            exit_code: code,
        },
    }
}

fn core_event(event: NativeEvent) -> std::result::Result<ExecEvent, Error> {
    match event.kind {
        1 => Ok(ExecEvent::Stdout(Bytes::from(event.data.to_vec()))),
        2 => Ok(ExecEvent::Stderr(Bytes::from(event.data.to_vec()))),
        3 => Ok(ExecEvent::Exit(event.exit_code)),
        other => Err(Error::invalid_config(format!(
            "exec event kind {other} is not 1, 2 or 3"
        ))),
    }
}

pub struct EventState {
    /// `None` once cancelled: dropping the core stream resets the HTTP/2
    /// stream, which is what makes the gateway kill the process group.
    stream: Option<ExecStream>,
    /// An error that followed events already handed out; reported next.
    pending_error: Option<Error>,
    done: bool,
}

pub type SharedEvents = Arc<tokio::sync::Mutex<EventState>>;

impl EventState {
    pub fn shared(stream: ExecStream) -> SharedEvents {
        Arc::new(tokio::sync::Mutex::new(Self {
            stream: Some(stream),
            pending_error: None,
            done: false,
        }))
    }

    fn cancel(&mut self) {
        self.stream = None;
        if !self.done && self.pending_error.is_none() {
            self.pending_error = Some(Error::Cancelled);
        }
    }

    async fn next_batch(&mut self) -> std::result::Result<Vec<NativeEvent>, Error> {
        if let Some(err) = self.pending_error.take() {
            self.done = true;
            return Err(err);
        }
        if self.done {
            return Ok(Vec::new());
        }
        let Some(stream) = self.stream.as_mut() else {
            self.done = true;
            return Err(Error::Cancelled);
        };
        let mut batch = Vec::new();
        let mut bytes = 0;
        // Adds an event; true at the exit event.
        fn take(event: ExecEvent, batch: &mut Vec<NativeEvent>, bytes: &mut usize) -> bool {
            let exit = matches!(event, ExecEvent::Exit(_));
            if let ExecEvent::Stdout(d) | ExecEvent::Stderr(d) = &event {
                *bytes += d.len();
            }
            batch.push(native_event(event));
            exit
        }
        let mut ended = match stream.next().await {
            None => true,
            Some(Err(err)) => {
                self.done = true;
                return Err(err);
            }
            Some(Ok(event)) => take(event, &mut batch, &mut bytes),
        };
        while !ended && batch.len() < BATCH_EVENTS {
            if bytes >= BATCH_BYTES {
                break;
            }
            match stream.next().now_or_never() {
                Some(Some(Ok(event))) => ended = take(event, &mut batch, &mut bytes),
                Some(Some(Err(err))) => {
                    self.pending_error = Some(err);
                    break;
                }
                Some(None) => ended = true,
                None => break,
            }
        }
        if ended {
            self.done = true;
        }
        Ok(batch)
    }

    /// The rest of the stream through the core's collector, under the
    /// stream's cap; `buffered` are events fetched but not handed out.
    async fn collect(
        &mut self,
        buffered: Vec<NativeEvent>,
    ) -> std::result::Result<ExecOutput, Error> {
        let result = self.collect_rest(buffered).await;
        self.done = true;
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    async fn collect_rest(
        &mut self,
        buffered: Vec<NativeEvent>,
    ) -> std::result::Result<ExecOutput, Error> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(self.pending_error.take().unwrap_or(Error::Cancelled));
        };
        let mut collector = OutputCollector::new(stream.output_limit());
        for event in buffered {
            if let Some(output) = collector.push(core_event(event)?)? {
                return Ok(output);
            }
        }
        if let Some(err) = self.pending_error.take() {
            return Err(err);
        }
        if self.done {
            return Err(Error::StreamClosed {
                message: "the exec stream has already ended".into(),
            });
        }
        stream.collect_into(collector).await
    }
}

/// Cancels an exec: the token ends a receive in flight, dropping the core
/// stream resets the call on the wire (the gateway kills the process).
fn cancel_events(events: &SharedEvents, token: &CancellationToken) {
    token.cancel();
    match events.try_lock() {
        Ok(mut state) => state.cancel(),
        Err(_) => {
            let events = Arc::clone(events);
            napi::bindgen_prelude::spawn(async move { events.lock().await.cancel() });
        }
    }
}

fn output(out: ExecOutput) -> NativeExecOutput {
    NativeExecOutput {
        stdout: Buffer::from(out.stdout),
        stderr: Buffer::from(out.stderr),
        exit_code: out.exit_code,
    }
}

#[napi]
pub struct NativeExecStream {
    pub(crate) events: SharedEvents,
    pub(crate) cancel: CancellationToken,
}

#[napi]
impl NativeExecStream {
    /// The next batch of events; empty once the stream has ended.
    #[napi]
    pub fn next_batch<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, Vec<NativeEvent>>> {
        let events = Arc::clone(&self.events);
        env.spawn_future(guard(async move { events.lock().await.next_batch().await }))
    }

    /// The rest of the output, collected by the core under the cap.
    #[napi]
    pub fn collect<'e>(
        &self,
        env: &'e Env,
        buffered: Vec<NativeEvent>,
    ) -> Result<PromiseRaw<'e, NativeExecOutput>> {
        let events = Arc::clone(&self.events);
        env.spawn_future(guard(async move {
            events.lock().await.collect(buffered).await.map(output)
        }))
    }

    /// Cancels the command's stream (the gateway kills the process group).
    #[napi]
    pub fn cancel(&self) {
        cancel_events(&self.events, &self.cancel);
    }
}

#[napi]
pub struct NativeInteractive {
    pub(crate) input: ExecInput,
    pub(crate) events: SharedEvents,
    pub(crate) cancel: CancellationToken,
}

#[napi]
impl NativeInteractive {
    #[napi]
    pub fn write<'e>(&self, env: &'e Env, data: Buffer) -> Result<PromiseRaw<'e, ()>> {
        let input = self.input.clone();
        let data = Bytes::from(data.to_vec());
        env.spawn_future(guard(async move { input.write(data).await }))
    }

    #[napi]
    pub fn resize<'e>(&self, env: &'e Env, cols: u32, rows: u32) -> Result<PromiseRaw<'e, ()>> {
        let input = self.input.clone();
        env.spawn_future(guard(async move { input.resize(cols, rows).await }))
    }

    /// Closes stdin (EOF). Idempotent.
    #[napi]
    pub fn close_stdin(&self) {
        self.input.close();
    }

    #[napi]
    pub fn next_batch<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, Vec<NativeEvent>>> {
        let events = Arc::clone(&self.events);
        env.spawn_future(guard(async move { events.lock().await.next_batch().await }))
    }

    #[napi]
    pub fn collect<'e>(
        &self,
        env: &'e Env,
        buffered: Vec<NativeEvent>,
    ) -> Result<PromiseRaw<'e, NativeExecOutput>> {
        let events = Arc::clone(&self.events);
        env.spawn_future(guard(async move {
            events.lock().await.collect(buffered).await.map(output)
        }))
    }

    #[napi]
    pub fn cancel(&self) {
        cancel_events(&self.events, &self.cancel);
    }
}

#[napi]
pub struct NativeWatch {
    watch: Arc<tokio::sync::Mutex<Option<SandboxWatch>>>,
    cancel: CancellationToken,
}

impl NativeWatch {
    pub fn new(watch: SandboxWatch, cancel: CancellationToken) -> Self {
        Self {
            watch: Arc::new(tokio::sync::Mutex::new(Some(watch))),
            cancel,
        }
    }
}

#[napi]
impl NativeWatch {
    /// The next snapshot, or `null` when the watch ended.
    #[napi]
    pub fn next<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, Option<NativeSandbox>>> {
        let watch = Arc::clone(&self.watch);
        env.spawn_future(guard(async move {
            let mut guard = watch.lock().await;
            let Some(watch) = guard.as_mut() else {
                return Ok(None);
            };
            match watch.next().await {
                None => Ok(None),
                Some(Ok(sandbox)) => Ok(Some(native_sandbox(sandbox))),
                Some(Err(err)) => Err(err),
            }
        }))
    }

    #[napi]
    pub fn cancel(&self) {
        self.cancel.cancel();
        match self.watch.try_lock() {
            Ok(mut watch) => drop(watch.take()),
            Err(_) => {
                let watch = Arc::clone(&self.watch);
                napi::bindgen_prelude::spawn(async move { drop(watch.lock().await.take()) });
            }
        }
    }
}

#[napi(object)]
pub struct NativeAddress {
    pub address: String,
    /// `IPv4` or `IPv6`, as `net.AddressInfo` says it.
    pub family: String,
    pub port: u32,
}

#[napi(object)]
pub struct NativeForwardStats {
    pub connections_accepted: BigInt,
    pub connections_active: BigInt,
    pub connections_failed: BigInt,
    pub bytes_in: BigInt,
    pub bytes_out: BigInt,
}

/// A running forward: the listener and its byte pumps live in Rust.
#[napi]
pub struct NativeForward {
    pub(crate) handle: Arc<ForwardHandle>,
}

#[napi]
impl NativeForward {
    #[napi(getter)]
    pub fn local_address(&self) -> NativeAddress {
        let addr = self.handle.local_addr();
        NativeAddress {
            address: addr.ip().to_string(),
            family: if addr.is_ipv4() { "IPv4" } else { "IPv6" }.to_owned(),
            port: u32::from(addr.port()),
        }
    }

    #[napi(getter)]
    pub fn sandbox(&self) -> String {
        self.handle.sandbox().to_owned()
    }

    #[napi(getter)]
    pub fn remote_port(&self) -> u32 {
        u32::from(self.handle.remote_port())
    }

    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.handle.is_closed()
    }

    #[napi]
    pub fn stats(&self) -> NativeForwardStats {
        let s = self.handle.stats();
        NativeForwardStats {
            connections_accepted: BigInt::from(s.connections_accepted),
            connections_active: BigInt::from(s.connections_active),
            connections_failed: BigInt::from(s.connections_failed),
            bytes_in: BigInt::from(s.bytes_in),
            bytes_out: BigInt::from(s.bytes_out),
        }
    }

    /// Stops listening and ends every connection. Idempotent.
    #[napi]
    pub fn close(&self) {
        self.handle.close();
    }

    /// Resolves once the listener is closed and every connection ended.
    #[napi]
    pub fn wait_closed<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, ()>> {
        let handle = Arc::clone(&self.handle);
        env.spawn_future(guard(async move {
            handle.closed().await;
            Ok::<(), openshell_sdk::Error>(())
        }))
    }
}

/// A raw stream on any method.
#[napi]
pub struct NativeRawStream {
    sender: RawSender,
    receiver: Arc<tokio::sync::Mutex<Option<RawReceiver>>>,
    trailers: Arc<Mutex<Option<Metadata>>>,
    cancel: CancellationToken,
}

impl NativeRawStream {
    pub fn new(stream: RawStream, cancel: CancellationToken) -> Self {
        let (sender, receiver) = stream.split();
        Self {
            sender,
            receiver: Arc::new(tokio::sync::Mutex::new(Some(receiver))),
            trailers: Arc::new(Mutex::new(None)),
            cancel,
        }
    }
}

#[napi]
impl NativeRawStream {
    /// Sends one encoded message (the first one starts the call).
    #[napi]
    pub fn send<'e>(&self, env: &'e Env, message: Buffer) -> Result<PromiseRaw<'e, ()>> {
        let sender = self.sender.clone();
        let message = Bytes::from(message.to_vec());
        env.spawn_future(guard(async move { sender.send(message).await }))
    }

    /// Half-closes the call. Idempotent.
    #[napi]
    pub fn close_send(&self) {
        self.sender.close();
    }

    /// The next encoded message, or `null` when the server ended it OK.
    #[napi]
    pub fn recv<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, Option<Buffer>>> {
        let receiver = Arc::clone(&self.receiver);
        let trailers = Arc::clone(&self.trailers);
        env.spawn_future(guard(async move {
            let mut guard = receiver.lock().await;
            let receiver = guard.as_mut().ok_or(Error::Cancelled)?;
            let message = receiver.recv().await?;
            if message.is_none() {
                *trailers.lock().unwrap_or_else(|p| p.into_inner()) = receiver.trailers().cloned();
            }
            Ok(message.map(|m| Buffer::from(m.to_vec())))
        }))
    }

    /// Response headers as `[key, value]` pairs; waits for them.
    #[napi]
    pub fn response_metadata<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, Vec<Vec<String>>>> {
        let receiver = Arc::clone(&self.receiver);
        env.spawn_future(guard(async move {
            let mut guard = receiver.lock().await;
            let metadata = guard
                .as_mut()
                .ok_or(Error::Cancelled)?
                .response_metadata()
                .await?;
            Ok(pairs(&metadata))
        }))
    }

    /// Trailers once the stream ended OK, else `null`.
    #[napi]
    pub fn trailers(&self) -> Option<Vec<Vec<String>>> {
        self.trailers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(pairs)
    }

    #[napi]
    pub fn cancel(&self) {
        self.sender.cancel();
        self.cancel.cancel();
        match self.receiver.try_lock() {
            Ok(mut receiver) => drop(receiver.take()),
            Err(_) => {
                let receiver = Arc::clone(&self.receiver);
                napi::bindgen_prelude::spawn(async move { drop(receiver.lock().await.take()) });
            }
        }
    }
}
