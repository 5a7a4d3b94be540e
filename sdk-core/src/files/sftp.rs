//! A small SFTP version 3 client over one byte stream, with any number of
//! requests in flight.
//!
//! Requests are numbered and written in order by one writer task; one
//! reader task hands every answer to the request waiting for its id. A
//! caller that wants a pipeline [`submit`](Sftp::submit)s requests and
//! awaits their answers later, in order: the stream stays full instead of
//! waiting a round trip per request. The writer's channel is bounded, so a
//! slow stream slows the submitter instead of growing a queue.
//!
//! Write data goes out as the [`Bytes`] it came in (a packet is a header
//! and the data, written one after the other); read data comes back as a
//! slice of the buffer the answer was read into.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

// Packet types (draft-ietf-secsh-filexfer-02).
const INIT: u8 = 1;
const VERSION: u8 = 2;
const OPEN: u8 = 3;
const CLOSE: u8 = 4;
const READ: u8 = 5;
const WRITE: u8 = 6;
const LSTAT: u8 = 7;
const FSETSTAT: u8 = 10;
const SETSTAT: u8 = 9;
const OPENDIR: u8 = 11;
const READDIR: u8 = 12;
const REMOVE: u8 = 13;
const MKDIR: u8 = 14;
const REALPATH: u8 = 16;
const STAT: u8 = 17;
const RENAME: u8 = 18;
const READLINK: u8 = 19;
const SYMLINK: u8 = 20;
const STATUS: u8 = 101;
const HANDLE: u8 = 102;
const DATA: u8 = 103;
const NAME: u8 = 104;
const ATTRS: u8 = 105;

/// Status codes.
pub(super) const FX_OK: u32 = 0;
pub(super) const FX_EOF: u32 = 1;
pub(super) const FX_NO_SUCH_FILE: u32 = 2;
pub(super) const FX_PERMISSION_DENIED: u32 = 3;
pub(super) const FX_OP_UNSUPPORTED: u32 = 8;

/// Open flags.
pub(super) const OPEN_READ: u32 = 0x01;
pub(super) const OPEN_WRITE: u32 = 0x02;
pub(super) const OPEN_CREATE: u32 = 0x08;
pub(super) const OPEN_EXCLUSIVE: u32 = 0x20;

const ATTR_SIZE: u32 = 0x01;
const ATTR_UIDGID: u32 = 0x02;
const ATTR_PERMISSIONS: u32 = 0x04;
const ATTR_ACMODTIME: u32 = 0x08;
const ATTR_EXTENDED: u32 = 0x8000_0000;

/// Largest answer taken from the server: a 256 KiB read is far below it,
/// a long directory batch too.
const MAX_ANSWER: usize = 8 << 20;
/// Packets queued for the writer task.
const WRITER_QUEUE: usize = 32;

/// The file type bits of `permissions` (`st_mode`).
pub(super) const S_IFMT: u32 = 0o170000;
pub(super) const S_IFDIR: u32 = 0o040000;
pub(super) const S_IFREG: u32 = 0o100000;
pub(super) const S_IFLNK: u32 = 0o120000;

/// File attributes as version 3 carries them (uid and gid are not used).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Attrs {
    pub size: Option<u64>,
    pub permissions: Option<u32>,
    pub atime: Option<u32>,
    pub mtime: Option<u32>,
}

impl Attrs {
    pub fn file_type(&self) -> Option<u32> {
        self.permissions.map(|mode| mode & S_IFMT)
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == Some(S_IFDIR)
    }

    pub fn is_symlink(&self) -> bool {
        self.file_type() == Some(S_IFLNK)
    }

    pub fn is_file(&self) -> bool {
        self.file_type() == Some(S_IFREG)
    }

    fn encode(&self, out: &mut BytesMut) {
        let mut flags = 0;
        if self.size.is_some() {
            flags |= ATTR_SIZE;
        }
        if self.permissions.is_some() {
            flags |= ATTR_PERMISSIONS;
        }
        if self.atime.is_some() && self.mtime.is_some() {
            flags |= ATTR_ACMODTIME;
        }
        out.put_u32(flags);
        if let Some(size) = self.size {
            out.put_u64(size);
        }
        if let Some(mode) = self.permissions {
            out.put_u32(mode);
        }
        if let (Some(atime), Some(mtime)) = (self.atime, self.mtime) {
            out.put_u32(atime);
            out.put_u32(mtime);
        }
    }

    fn decode(buf: &mut Bytes) -> Result<Self, String> {
        let flags = get_u32(buf)?;
        let mut attrs = Attrs::default();
        if flags & ATTR_SIZE != 0 {
            attrs.size = Some(get_u64(buf)?);
        }
        if flags & ATTR_UIDGID != 0 {
            get_u32(buf)?;
            get_u32(buf)?;
        }
        if flags & ATTR_PERMISSIONS != 0 {
            attrs.permissions = Some(get_u32(buf)?);
        }
        if flags & ATTR_ACMODTIME != 0 {
            attrs.atime = Some(get_u32(buf)?);
            attrs.mtime = Some(get_u32(buf)?);
        }
        if flags & ATTR_EXTENDED != 0 {
            for _ in 0..get_u32(buf)? {
                get_bytes(buf)?;
                get_bytes(buf)?;
            }
        }
        Ok(attrs)
    }
}

/// One entry of a NAME answer.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub name: String,
    /// The name's bytes were not UTF-8 (`name` has them replaced), or it
    /// holds U+FFFD: what a server that can only send text (the sandbox's,
    /// built on russh-sftp) puts for bytes that are not UTF-8.
    pub lossy: bool,
    pub attrs: Attrs,
}

/// What a request failed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Failure {
    /// The server answered with a status other than OK.
    Status { code: u32, message: String },
    /// The stream ended (or broke) before the answer.
    Closed,
    /// The server's answer made no sense.
    Protocol(String),
}

impl Failure {
    pub fn is_eof(&self) -> bool {
        matches!(self, Failure::Status { code: FX_EOF, .. })
    }
}

/// An answer, before it is checked against what was asked.
#[derive(Debug)]
pub(super) enum Answer {
    Status { code: u32, message: String },
    Handle(Bytes),
    Data(Bytes),
    Name(Vec<Entry>),
    Attrs(Attrs),
}

type Waiters = HashMap<u32, oneshot::Sender<Answer>>;

/// Requests waiting for their answers; `None` once the stream is gone.
#[derive(Default)]
struct Pending(Mutex<Option<Waiters>>);

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Waiters>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An answer on its way.
pub(super) struct Reply(oneshot::Receiver<Answer>);

impl Reply {
    pub async fn answer(self) -> Result<Answer, Failure> {
        self.0.await.map_err(|_| Failure::Closed)
    }

    /// An OK status, or the failure.
    pub async fn ok(self) -> Result<(), Failure> {
        match self.answer().await? {
            Answer::Status { code: FX_OK, .. } => Ok(()),
            other => Err(unexpected(other, "status")),
        }
    }

    /// Data read, or the failure (EOF included).
    pub async fn data(self) -> Result<Bytes, Failure> {
        match self.answer().await? {
            Answer::Data(data) => Ok(data),
            other => Err(unexpected(other, "data")),
        }
    }
}

fn unexpected(answer: Answer, wanted: &str) -> Failure {
    match answer {
        Answer::Status { code, message } => Failure::Status { code, message },
        other => Failure::Protocol(format!("expected {wanted}, got {other:?}")),
    }
}

/// One SFTP session; cheap to share by reference. Dropping it (with every
/// clone of its writer) ends the request stream.
pub(super) struct Sftp {
    writer: mpsc::Sender<Vec<Bytes>>,
    pending: Arc<Pending>,
    next_id: AtomicU32,
}

impl Sftp {
    /// Starts the reader and writer tasks on `stream` and exchanges
    /// INIT/VERSION.
    pub async fn start<S>(stream: S) -> Result<Self, Failure>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(stream);
        let (writer, queue) = mpsc::channel(WRITER_QUEUE);
        let pending = Arc::new(Pending(Mutex::new(Some(HashMap::new()))));
        tokio::spawn(write_packets(write, queue));
        let (version_tx, version_rx) = oneshot::channel();
        tokio::spawn(read_answers(read, Arc::clone(&pending), version_tx));
        let sftp = Sftp {
            writer,
            pending,
            next_id: AtomicU32::new(1),
        };
        let mut init = BytesMut::with_capacity(9);
        init.put_u32(5);
        init.put_u8(INIT);
        init.put_u32(3);
        sftp.writer
            .send(vec![init.freeze()])
            .await
            .map_err(|_| Failure::Closed)?;
        match version_rx.await {
            Ok(3) => Ok(sftp),
            Ok(other) => Err(Failure::Protocol(format!(
                "the server speaks SFTP version {other}, not 3"
            ))),
            Err(_) => Err(Failure::Closed),
        }
    }

    /// Sends one request built by `build` (given its id) and returns its
    /// answer to await later. Waits only while the writer's queue is full.
    async fn submit(&self, kind: u8, build: impl FnOnce(&mut BytesMut)) -> Result<Reply, Failure> {
        self.submit_with(kind, build, None).await
    }

    async fn submit_with(
        &self,
        kind: u8,
        build: impl FnOnce(&mut BytesMut),
        data: Option<Bytes>,
    ) -> Result<Reply, Failure> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut head = BytesMut::with_capacity(64);
        head.put_u32(0);
        head.put_u8(kind);
        head.put_u32(id);
        build(&mut head);
        let data_len = data.as_ref().map_or(0, Bytes::len);
        let len = u32::try_from(head.len() - 4 + data_len)
            .map_err(|_| Failure::Protocol("request too large".into()))?;
        head[..4].copy_from_slice(&len.to_be_bytes());
        let (tx, rx) = oneshot::channel();
        match self.pending.lock().as_mut() {
            Some(waiters) => {
                waiters.insert(id, tx);
            }
            None => return Err(Failure::Closed),
        }
        let mut packet = vec![head.freeze()];
        packet.extend(data);
        if self.writer.send(packet).await.is_err() {
            if let Some(waiters) = self.pending.lock().as_mut() {
                waiters.remove(&id);
            }
            return Err(Failure::Closed);
        }
        Ok(Reply(rx))
    }

    pub async fn realpath(&self, path: &str) -> Result<String, Failure> {
        let reply = self.submit(REALPATH, |b| put_str(b, path)).await?;
        match reply.answer().await? {
            Answer::Name(mut entries) if entries.len() == 1 => Ok(entries.remove(0).name),
            other => Err(unexpected(other, "one name")),
        }
    }

    async fn attrs(&self, kind: u8, path: &str) -> Result<Attrs, Failure> {
        let reply = self.submit(kind, |b| put_str(b, path)).await?;
        match reply.answer().await? {
            Answer::Attrs(attrs) => Ok(attrs),
            other => Err(unexpected(other, "attributes")),
        }
    }

    pub async fn stat(&self, path: &str) -> Result<Attrs, Failure> {
        self.attrs(STAT, path).await
    }

    pub async fn lstat(&self, path: &str) -> Result<Attrs, Failure> {
        self.attrs(LSTAT, path).await
    }

    async fn handle(reply: Reply) -> Result<Bytes, Failure> {
        match reply.answer().await? {
            Answer::Handle(handle) => Ok(handle),
            other => Err(unexpected(other, "a handle")),
        }
    }

    pub async fn open(&self, path: &str, flags: u32, attrs: Attrs) -> Result<Bytes, Failure> {
        let reply = self
            .submit(OPEN, |b| {
                put_str(b, path);
                b.put_u32(flags);
                attrs.encode(b);
            })
            .await?;
        Self::handle(reply).await
    }

    pub async fn opendir(&self, path: &str) -> Result<Bytes, Failure> {
        let reply = self.submit(OPENDIR, |b| put_str(b, path)).await?;
        Self::handle(reply).await
    }

    /// The next batch of entries; `None` at the end.
    pub async fn readdir(&self, handle: &Bytes) -> Result<Option<Vec<Entry>>, Failure> {
        let reply = self.submit(READDIR, |b| put_bytes(b, handle)).await?;
        match reply.answer().await? {
            Answer::Name(entries) => Ok(Some(entries)),
            other => match unexpected(other, "names") {
                failure if failure.is_eof() => Ok(None),
                failure => Err(failure),
            },
        }
    }

    pub async fn close(&self, handle: &Bytes) -> Result<(), Failure> {
        self.submit(CLOSE, |b| put_bytes(b, handle))
            .await?
            .ok()
            .await
    }

    /// Sends a READ; the answer is awaited later ([`Reply::data`]).
    pub async fn read(&self, handle: &Bytes, offset: u64, len: u32) -> Result<Reply, Failure> {
        self.submit(READ, |b| {
            put_bytes(b, handle);
            b.put_u64(offset);
            b.put_u32(len);
        })
        .await
    }

    /// Sends a WRITE; the answer is awaited later ([`Reply::ok`]).
    pub async fn write(&self, handle: &Bytes, offset: u64, data: Bytes) -> Result<Reply, Failure> {
        let len = data.len() as u32;
        self.submit_with(
            WRITE,
            |b| {
                put_bytes(b, handle);
                b.put_u64(offset);
                b.put_u32(len);
            },
            Some(data),
        )
        .await
    }

    pub async fn fsetstat(&self, handle: &Bytes, attrs: Attrs) -> Result<(), Failure> {
        self.submit(FSETSTAT, |b| {
            put_bytes(b, handle);
            attrs.encode(b);
        })
        .await?
        .ok()
        .await
    }

    pub async fn setstat(&self, path: &str, attrs: Attrs) -> Result<(), Failure> {
        self.submit(SETSTAT, |b| {
            put_str(b, path);
            attrs.encode(b);
        })
        .await?
        .ok()
        .await
    }

    pub async fn mkdir(&self, path: &str, attrs: Attrs) -> Result<(), Failure> {
        self.submit(MKDIR, |b| {
            put_str(b, path);
            attrs.encode(b);
        })
        .await?
        .ok()
        .await
    }

    pub async fn remove(&self, path: &str) -> Result<(), Failure> {
        self.submit(REMOVE, |b| put_str(b, path)).await?.ok().await
    }

    pub async fn rename(&self, from: &str, to: &str) -> Result<(), Failure> {
        self.submit(RENAME, |b| {
            put_str(b, from);
            put_str(b, to);
        })
        .await?
        .ok()
        .await
    }

    /// A link's target, and whether its bytes were not UTF-8.
    pub async fn readlink(&self, path: &str) -> Result<(String, bool), Failure> {
        let reply = self.submit(READLINK, |b| put_str(b, path)).await?;
        match reply.answer().await? {
            Answer::Name(mut entries) if entries.len() == 1 => {
                let entry = entries.remove(0);
                Ok((entry.name, entry.lossy))
            }
            other => Err(unexpected(other, "one name")),
        }
    }

    /// Creates `link` pointing at `target`. The two paths go in OpenSSH's
    /// order (target first), which is what the sandbox's server reads.
    pub async fn symlink(&self, target: &str, link: &str) -> Result<(), Failure> {
        self.submit(SYMLINK, |b| {
            put_str(b, target);
            put_str(b, link);
        })
        .await?
        .ok()
        .await
    }
}

fn put_str(out: &mut BytesMut, value: &str) {
    put_bytes(out, value.as_bytes());
}

fn put_bytes(out: &mut BytesMut, value: &[u8]) {
    out.put_u32(value.len() as u32);
    out.put_slice(value);
}

fn short() -> String {
    "a short answer".into()
}

fn get_u32(buf: &mut Bytes) -> Result<u32, String> {
    if buf.remaining() < 4 {
        return Err(short());
    }
    Ok(buf.get_u32())
}

fn get_u64(buf: &mut Bytes) -> Result<u64, String> {
    if buf.remaining() < 8 {
        return Err(short());
    }
    Ok(buf.get_u64())
}

fn get_bytes(buf: &mut Bytes) -> Result<Bytes, String> {
    let len = get_u32(buf)? as usize;
    if buf.remaining() < len {
        return Err(short());
    }
    Ok(buf.split_to(len))
}

fn get_string(buf: &mut Bytes) -> Result<String, String> {
    Ok(String::from_utf8_lossy(&get_bytes(buf)?).into_owned())
}

/// Decodes an answer's body (after type and id).
fn decode_answer(kind: u8, mut body: Bytes) -> Result<Answer, String> {
    let body = &mut body;
    Ok(match kind {
        STATUS => {
            let code = get_u32(body)?;
            // Version 3 servers may leave out message and language.
            let message = if body.has_remaining() {
                get_string(body)?
            } else {
                String::new()
            };
            Answer::Status { code, message }
        }
        HANDLE => Answer::Handle(get_bytes(body)?),
        DATA => Answer::Data(get_bytes(body)?),
        NAME => {
            let count = get_u32(body)?;
            let mut entries = Vec::with_capacity(count.min(1024) as usize);
            for _ in 0..count {
                let raw = get_bytes(body)?;
                let name = String::from_utf8_lossy(&raw).into_owned();
                let lossy = name.contains(char::REPLACEMENT_CHARACTER);
                let _long_name = get_bytes(body)?;
                let attrs = Attrs::decode(body)?;
                entries.push(Entry { name, lossy, attrs });
            }
            Answer::Name(entries)
        }
        ATTRS => Answer::Attrs(Attrs::decode(body)?),
        other => return Err(format!("unknown answer type {other}")),
    })
}

async fn write_packets<W: AsyncWrite>(write: W, mut queue: mpsc::Receiver<Vec<Bytes>>) {
    tokio::pin!(write);
    while let Some(packet) = queue.recv().await {
        for piece in packet {
            if write.write_all(&piece).await.is_err() {
                return;
            }
        }
        // Whatever is queued goes out before the flush.
        if queue.is_empty() && write.flush().await.is_err() {
            return;
        }
    }
    // Every sender is gone: the session is over, end the request stream.
    let _ = write.shutdown().await;
}

async fn read_answers<R: AsyncRead>(read: R, pending: Arc<Pending>, version: oneshot::Sender<u32>) {
    tokio::pin!(read);
    let mut version = Some(version);
    let mut buf = BytesMut::new();
    while let Ok(len) = read.read_u32().await {
        let len = len as usize;
        if !(5..=MAX_ANSWER).contains(&len) {
            tracing::debug!(len, "sftp: answer length out of range");
            break;
        }
        buf.reserve(len);
        buf.resize(len, 0);
        if read.read_exact(&mut buf[..len]).await.is_err() {
            break;
        }
        let mut packet = buf.split().freeze();
        let kind = packet.get_u8();
        if kind == VERSION {
            if let Some(tx) = version.take() {
                let _ = tx.send(packet.get_u32());
            }
            continue;
        }
        let id = packet.get_u32();
        let answer = match decode_answer(kind, packet) {
            Ok(answer) => answer,
            Err(why) => {
                tracing::debug!(why, "sftp: undecodable answer");
                break;
            }
        };
        let waiter = pending.lock().as_mut().and_then(|w| w.remove(&id));
        match waiter {
            Some(tx) => {
                let _ = tx.send(answer);
            }
            None => tracing::debug!(id, "sftp: answer to no request"),
        }
    }
    // The stream is gone: every waiting request learns it now.
    pending.lock().take();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip() {
        let attrs = Attrs {
            size: Some(1 << 33),
            permissions: Some(S_IFREG | 0o640),
            atime: Some(7),
            mtime: Some(1_700_000_000),
        };
        let mut buf = BytesMut::new();
        attrs.encode(&mut buf);
        let back = Attrs::decode(&mut buf.freeze()).unwrap();
        assert_eq!(back, attrs);
        assert!(back.is_file() && !back.is_dir() && !back.is_symlink());
    }

    #[test]
    fn answers_decode() {
        let mut body = BytesMut::new();
        body.put_u32(2);
        put_str(&mut body, "no such file");
        put_str(&mut body, "en");
        match decode_answer(STATUS, body.freeze()).unwrap() {
            Answer::Status { code, message } => {
                assert_eq!((code, message.as_str()), (2, "no such file"));
            }
            other => panic!("{other:?}"),
        }
        let mut body = BytesMut::new();
        body.put_u32(1);
        put_str(&mut body, "a");
        put_str(&mut body, "-rw a");
        Attrs {
            size: Some(3),
            ..Default::default()
        }
        .encode(&mut body);
        match decode_answer(NAME, body.freeze()).unwrap() {
            Answer::Name(entries) => {
                assert_eq!(entries[0].name, "a");
                assert_eq!(entries[0].attrs.size, Some(3));
            }
            other => panic!("{other:?}"),
        }
        assert!(decode_answer(DATA, Bytes::from_static(&[0, 0, 0, 9])).is_err());
    }
}
