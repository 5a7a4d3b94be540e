//! Uploads: a local file or tree into the sandbox, and [`UploadSink`] for
//! bytes the caller supplies.
//!
//! Every file is written under a temp name next to its target, then gets
//! its mode and times, then is renamed over the target: whatever fails,
//! the target is either the old file or the whole new one.

use std::collections::VecDeque;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tonic::Code;

use super::ignore_rules::{IgnoreRules, MAX_IGNORE_FILE};
use super::progress::Reporter;
use super::session::{Session, local_error, rpc, shown, split_parent, temp_name_for};
use super::sftp::{Attrs, Failure, OPEN_CREATE, OPEN_EXCLUSIVE, OPEN_WRITE, Reply};
use super::{CHUNK, IN_FLIGHT, TransferOptions, TransferSummary};
use crate::client::Client;
use crate::error::Error;

/// One entry of a local tree, relative to its top.
enum Item {
    Dir {
        rel: PathBuf,
        mode: u32,
        mtime: u32,
    },
    File {
        rel: PathBuf,
        meta: std::fs::Metadata,
    },
    Symlink {
        rel: PathBuf,
        target: String,
    },
}

/// A local tree, walked once up front so the totals are known.
#[derive(Default)]
struct Plan {
    items: Vec<Item>,
    bytes: u64,
    files: u64,
    summary: TransferSummary,
}

fn time_of(seconds: i64) -> u32 {
    seconds.clamp(0, i64::from(u32::MAX)) as u32
}

/// Whether a relative link target, seen from the link's directory `dir`
/// (relative to the tree's top), stays inside the tree.
///
/// Only targets that first climb (`..`, through the real directories the
/// link sits in) and then only descend are kept: a `..` after a name could
/// climb out of a directory reached through another link (`s -> .` with
/// `e -> s/..` leaves the tree though each looks inside). Descending from a
/// directory inside the tree stays inside whether each name is a directory
/// or a link, since every link of the tree passes this same check.
pub(super) fn link_stays_inside(dir: &Path, target: &str) -> bool {
    if target.is_empty() || target.starts_with('/') {
        return false;
    }
    let mut depth = dir
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    let mut descended = false;
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if depth == 0 || descended {
                    return false;
                }
                depth -= 1;
            }
            _ => descended = true,
        }
    }
    true
}

/// A local name (or link target) that is not UTF-8: refused before
/// anything is written, since every remote path is text.
fn not_utf8(path: &Path) -> Error {
    rpc(
        Code::InvalidArgument,
        format!(
            "upload {}: the name (or the link's target) is not UTF-8, which file transfer does not carry",
            shown(&path.to_string_lossy())
        ),
    )
}

fn walk(top: &Path, ignore_file: Option<&str>) -> Result<Plan, Error> {
    let mut plan = Plan::default();
    let meta = std::fs::metadata(top).map_err(|e| local_error(&e, "upload", top))?;
    plan.items.push(Item::Dir {
        rel: PathBuf::new(),
        mode: meta.mode() & 0o7777,
        mtime: time_of(meta.mtime()),
    });
    let mut stack = vec![(PathBuf::new(), IgnoreRules::default())];
    while let Some((rel, rules)) = stack.pop() {
        let dir = top.join(&rel);
        let rules = match ignore_file {
            Some(name) => match std::fs::File::open(dir.join(name)) {
                Ok(file) => {
                    let mut text = String::new();
                    use std::io::Read;
                    let _ = file.take(MAX_IGNORE_FILE as u64).read_to_string(&mut text);
                    rules.with_file(&rel, &text)
                }
                Err(_) => rules,
            },
            None => rules,
        };
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| local_error(&e, "upload", &dir))?
            .collect::<Result<_, _>>()
            .map_err(|e| local_error(&e, "upload", &dir))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let child = rel.join(entry.file_name());
            let meta = std::fs::symlink_metadata(entry.path())
                .map_err(|e| local_error(&e, "upload", &entry.path()))?;
            let kind = meta.file_type();
            if rules.ignored(&child, kind.is_dir()) {
                plan.summary.ignored += 1;
                continue;
            }
            if entry.file_name().to_str().is_none() {
                return Err(not_utf8(&entry.path()));
            }
            if kind.is_dir() {
                plan.items.push(Item::Dir {
                    rel: child.clone(),
                    mode: meta.mode() & 0o7777,
                    mtime: time_of(meta.mtime()),
                });
                stack.push((child, rules.clone()));
            } else if kind.is_file() {
                plan.bytes += meta.len();
                plan.files += 1;
                plan.items.push(Item::File { rel: child, meta });
            } else if kind.is_symlink() {
                let target = std::fs::read_link(entry.path())
                    .map_err(|e| local_error(&e, "upload", &entry.path()))?;
                let Some(target) = target.to_str().map(str::to_owned) else {
                    return Err(not_utf8(&entry.path()));
                };
                if link_stays_inside(&rel, &target) {
                    plan.items.push(Item::Symlink { rel: child, target });
                } else {
                    plan.summary.skipped_symlinks += 1;
                }
            } else {
                plan.summary.skipped_other += 1;
            }
        }
    }
    Ok(plan)
}

/// `rel` (a tree-relative local path) under the remote directory `base`.
pub(super) fn remote_join(base: &str, rel: &Path) -> String {
    let mut out = base.trim_end_matches('/').to_owned();
    for part in rel.components() {
        if let Component::Normal(name) = part {
            out.push('/');
            out.push_str(&name.to_string_lossy());
        }
    }
    if out.is_empty() { "/".into() } else { out }
}

/// The file name of `local`, for a target inside a directory.
fn local_name(local: &Path) -> Result<String, Error> {
    let name = std::fs::canonicalize(local)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    name.ok_or_else(|| {
        rpc(
            Code::InvalidArgument,
            format!(
                "upload {}: has no file name",
                shown(&local.to_string_lossy())
            ),
        )
    })
}

pub(super) async fn upload(
    client: &Client,
    sandbox: &str,
    local: &Path,
    remote: &str,
    options: &TransferOptions,
) -> Result<TransferSummary, Error> {
    let meta = std::fs::metadata(local).map_err(|e| local_error(&e, "upload", local))?;
    let mut session = Session::open(client, sandbox, &options.call).await?;
    let result = upload_in(&mut session, &meta, local, remote, options).await;
    session.close().await;
    result
}

async fn upload_in(
    session: &mut Session,
    meta: &std::fs::Metadata,
    local: &Path,
    remote: &str,
    options: &TransferOptions,
) -> Result<TransferSummary, Error> {
    let mut target = session.resolve(remote)?;
    // An existing directory takes the upload inside it.
    match session.sftp.stat(&target).await {
        Ok(attrs) if attrs.is_dir() => {
            target = session.resolve(&format!("{target}/{}", local_name(local)?))?;
        }
        Ok(_) => {}
        Err(Failure::Status { code, .. }) if code == super::sftp::FX_NO_SUCH_FILE => {
            if remote.ends_with('/') {
                return Err(rpc(
                    Code::NotFound,
                    format!("upload {}: no such directory", shown(&target)),
                ));
            }
        }
        Err(failure) => return Err(session.fail(failure, "upload", &target).await),
    }
    // The parent must exist, as a directory.
    let (parent, _) = split_parent(&target);
    let parent = if parent.is_empty() { "/" } else { parent };
    match session.sftp.stat(parent).await {
        Ok(attrs) if attrs.is_dir() => {}
        Ok(_) => {
            return Err(rpc(
                Code::FailedPrecondition,
                format!(
                    "upload {}: {} is not a directory",
                    shown(&target),
                    shown(parent)
                ),
            ));
        }
        Err(failure) => return Err(session.fail(failure, "upload", parent).await),
    }
    if meta.is_dir() {
        upload_tree(session, local, &target, options).await
    } else if meta.is_file() {
        if let Ok(existing) = session.sftp.stat(&target).await
            && existing.is_dir()
        {
            return Err(rpc(
                Code::FailedPrecondition,
                format!("upload {}: is a directory", shown(&target)),
            ));
        }
        let mut reporter = Reporter::new(options.progress.clone(), meta.len(), 1);
        let mut summary = TransferSummary::default();
        put_file(session, local, &target, meta, &mut reporter).await?;
        summary.files = 1;
        summary.bytes = meta.len();
        reporter.finish();
        Ok(summary)
    } else {
        Err(rpc(
            Code::FailedPrecondition,
            format!(
                "upload {}: not a regular file or directory",
                shown(&local.to_string_lossy())
            ),
        ))
    }
}

async fn upload_tree(
    session: &mut Session,
    local: &Path,
    target: &str,
    options: &TransferOptions,
) -> Result<TransferSummary, Error> {
    let top = local.to_path_buf();
    let ignore_file = options.ignore_file.clone();
    let plan = tokio::task::spawn_blocking(move || walk(&top, ignore_file.as_deref()))
        .await
        .map_err(|e| Error::protocol(format!("walking the local tree: {e}")))??;
    let mut reporter = Reporter::new(options.progress.clone(), plan.bytes, plan.files);
    let mut summary = plan.summary;
    let mut dirs = Vec::new();
    for item in &plan.items {
        match item {
            Item::Dir { rel, mode, mtime } => {
                let path = remote_join(target, rel);
                make_dir(session, &path).await?;
                summary.directories += 1;
                dirs.push((path, *mode, *mtime));
            }
            Item::File { rel, meta } => {
                let path = remote_join(target, rel);
                put_file(session, &local.join(rel), &path, meta, &mut reporter).await?;
                summary.files += 1;
                summary.bytes += meta.len();
            }
            Item::Symlink { rel, target: link } => {
                let path = remote_join(target, rel);
                // An existing entry is replaced, as a file would be.
                if let Ok(attrs) = session.sftp.lstat(&path).await
                    && !attrs.is_dir()
                {
                    let _ = session.sftp.remove(&path).await;
                }
                if let Err(failure) = session.sftp.symlink(link, &path).await {
                    return Err(session.fail(failure, "upload symlink", &path).await);
                }
                summary.symlinks += 1;
            }
        }
    }
    // Modes and times last, deepest first: writing inside a directory
    // changes its mtime, and a read-only one would refuse its contents.
    for (path, mode, mtime) in dirs.iter().rev() {
        let attrs = Attrs {
            permissions: Some(*mode),
            atime: Some(*mtime),
            mtime: Some(*mtime),
            ..Attrs::default()
        };
        if let Err(failure) = session.sftp.setstat(path, attrs).await {
            return Err(session.fail(failure, "upload", path).await);
        }
    }
    reporter.finish();
    Ok(summary)
}

/// Creates `path` as a directory, or finds one there.
async fn make_dir(session: &mut Session, path: &str) -> Result<(), Error> {
    let attrs = Attrs {
        permissions: Some(0o700),
        ..Attrs::default()
    };
    let created = session.sftp.mkdir(path, attrs).await;
    match created {
        Ok(()) => Ok(()),
        Err(failure @ Failure::Status { .. }) => match session.sftp.stat(path).await {
            Ok(attrs) if attrs.is_dir() => Ok(()),
            Ok(_) => Err(rpc(
                Code::FailedPrecondition,
                format!("upload {}: not a directory", shown(path)),
            )),
            Err(_) => Err(session.fail(failure, "upload", path).await),
        },
        Err(failure) => Err(session.fail(failure, "upload", path).await),
    }
}

/// The pipelined write side of one remote file open under its temp name.
struct Writer {
    handle: Bytes,
    offset: u64,
    in_flight: VecDeque<(Reply, u64)>,
}

impl Writer {
    async fn open(session: &mut Session, temp: &str, target: &str) -> Result<Self, Error> {
        let attrs = Attrs {
            permissions: Some(0o600),
            ..Attrs::default()
        };
        let flags = OPEN_WRITE | OPEN_CREATE | OPEN_EXCLUSIVE;
        match session.sftp.open(temp, flags, attrs).await {
            Ok(handle) => Ok(Self {
                handle,
                offset: 0,
                in_flight: VecDeque::new(),
            }),
            Err(failure) => Err(session.fail(failure, "upload", target).await),
        }
    }

    /// Sends `data` at the current offset; waits only for the oldest
    /// answer once [`IN_FLIGHT`] are outstanding. Returns the bytes whose
    /// write was confirmed.
    async fn write(&mut self, session: &Session, data: Bytes) -> Result<u64, Failure> {
        let len = data.len() as u64;
        let reply = session.sftp.write(&self.handle, self.offset, data).await?;
        self.offset += len;
        self.in_flight.push_back((reply, len));
        let mut confirmed = 0;
        while self.in_flight.len() >= IN_FLIGHT {
            confirmed += self.wait_one().await?;
        }
        Ok(confirmed)
    }

    async fn wait_one(&mut self) -> Result<u64, Failure> {
        match self.in_flight.pop_front() {
            Some((reply, len)) => reply.ok().await.map(|()| len),
            None => Ok(0),
        }
    }

    /// Waits for every outstanding write; the bytes confirmed.
    async fn drain(&mut self) -> Result<u64, Failure> {
        let mut confirmed = 0;
        while !self.in_flight.is_empty() {
            confirmed += self.wait_one().await?;
        }
        Ok(confirmed)
    }

    /// Sets mode and times, closes, renames over `target`.
    async fn commit(
        mut self,
        session: &Session,
        temp: &str,
        target: &str,
        attrs: Attrs,
    ) -> Result<(), Failure> {
        self.drain().await?;
        session.sftp.fsetstat(&self.handle, attrs).await?;
        session.sftp.close(&self.handle).await?;
        session.sftp.rename(temp, target).await
    }

    /// After a failure: closes and removes the temp file (best effort; the
    /// server removes it at the end of the session anyway).
    async fn discard(self, session: &Session, temp: &str) {
        let _ = session.sftp.close(&self.handle).await;
        let _ = session.sftp.remove(temp).await;
    }
}

async fn put_file(
    session: &mut Session,
    local: &Path,
    target: &str,
    meta: &std::fs::Metadata,
    reporter: &mut Reporter,
) -> Result<(), Error> {
    reporter.current(target);
    let mut file = tokio::fs::File::open(local)
        .await
        .map_err(|e| local_error(&e, "upload", local))?;
    let temp = temp_name_for(target);
    let mut writer = Writer::open(session, &temp, target).await?;
    let sent = async {
        loop {
            let mut buf = BytesMut::with_capacity(CHUNK);
            while buf.len() < CHUNK {
                let n = file
                    .read_buf(&mut buf)
                    .await
                    .map_err(|e| Err(local_error(&e, "upload", local)))?;
                if n == 0 {
                    break;
                }
            }
            if buf.is_empty() {
                return Ok(());
            }
            let confirmed = writer.write(session, buf.freeze()).await.map_err(Ok)?;
            reporter.bytes(confirmed);
        }
    }
    .await;
    let sent = match sent {
        Ok(()) => writer.drain().await.map(|n| reporter.bytes(n)).map_err(Ok),
        Err(err) => Err(err),
    };
    let attrs = Attrs {
        permissions: Some(meta.mode() & 0o777),
        atime: Some(time_of(meta.atime())),
        mtime: Some(time_of(meta.mtime())),
        ..Attrs::default()
    };
    let result = match sent {
        Ok(()) => writer
            .commit(session, &temp, target, attrs)
            .await
            .map_err(Ok),
        Err(err) => {
            writer.discard(session, &temp).await;
            Err(err)
        }
    };
    match result {
        Ok(()) => {
            reporter.file_done();
            Ok(())
        }
        // Failure (Ok) is the server's or the stream's; Err is local.
        Err(Ok(failure)) => {
            let err = session.fail(failure, "upload", target).await;
            let _ = session.sftp.remove(&temp).await;
            Err(err)
        }
        Err(Err(err)) => Err(err),
    }
}

/// An upload of bytes the caller supplies, to one file. See
/// [`Client::upload_stream`].
///
/// [`write`](Self::write) buffers up to one chunk and keeps
/// [`IN_FLIGHT`] chunks in flight; [`finish`](Self::finish) renames the
/// file into place. Dropping the sink before `finish` ends the stream, and
/// the sandbox's server removes the temp file; [`abort`](Self::abort)
/// removes it at once.
pub struct UploadSink {
    session: Option<Session>,
    writer: Option<Writer>,
    temp: String,
    target: String,
    pending: BytesMut,
    reporter: Reporter,
    bytes: u64,
}

impl std::fmt::Debug for UploadSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadSink")
            .field("target", &self.target)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl UploadSink {
    pub(super) async fn open(
        client: &Client,
        sandbox: &str,
        remote: &str,
        options: &TransferOptions,
    ) -> Result<Self, Error> {
        let mut session = Session::open(client, sandbox, &options.call).await?;
        let target = match session.resolve(remote) {
            Ok(target) => target,
            Err(err) => {
                session.close().await;
                return Err(err);
            }
        };
        if let Ok(attrs) = session.sftp.stat(&target).await
            && attrs.is_dir()
        {
            session.close().await;
            return Err(rpc(
                Code::FailedPrecondition,
                format!("upload {}: is a directory", shown(&target)),
            ));
        }
        let temp = temp_name_for(&target);
        let writer = match Writer::open(&mut session, &temp, &target).await {
            Ok(writer) => writer,
            Err(err) => {
                session.close().await;
                return Err(err);
            }
        };
        let mut reporter = Reporter::new(options.progress.clone(), 0, 1);
        reporter.current(&target);
        Ok(Self {
            session: Some(session),
            writer: Some(writer),
            temp,
            target,
            pending: BytesMut::new(),
            reporter,
            bytes: 0,
        })
    }

    /// The absolute path the file will have.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Sends `data` (in chunks of [`CHUNK`]); waits only when
    /// [`IN_FLIGHT`] chunks are unanswered. A failure ends the upload
    /// (the temp file is removed).
    pub async fn write(&mut self, mut data: Bytes) -> Result<(), Error> {
        self.bytes += data.len() as u64;
        self.reporter.state.bytes_total = self.bytes;
        if !self.pending.is_empty() {
            let room = CHUNK - self.pending.len();
            let take = room.min(data.len());
            self.pending.extend_from_slice(&data.split_to(take));
            if self.pending.len() == CHUNK {
                let chunk = self.pending.split().freeze();
                self.send(chunk).await?;
            }
        }
        while data.len() >= CHUNK {
            let chunk = data.split_to(CHUNK);
            self.send(chunk).await?;
        }
        self.pending.extend_from_slice(&data);
        Ok(())
    }

    async fn send(&mut self, chunk: Bytes) -> Result<(), Error> {
        let (Some(session), Some(writer)) = (self.session.as_ref(), self.writer.as_mut()) else {
            return Err(Self::ended());
        };
        match writer.write(session, chunk).await {
            Ok(confirmed) => {
                self.reporter.bytes(confirmed);
                Ok(())
            }
            Err(failure) => Err(self.failed(failure).await),
        }
    }

    fn ended() -> Error {
        rpc(
            Code::FailedPrecondition,
            "the upload already finished or failed".into(),
        )
    }

    async fn failed(&mut self, failure: Failure) -> Error {
        let Some(mut session) = self.session.take() else {
            return Self::ended();
        };
        let err = session.fail(failure, "upload", &self.target).await;
        if let Some(writer) = self.writer.take() {
            writer.discard(&session, &self.temp).await;
        }
        session.close().await;
        err
    }

    /// Sends what is buffered, waits for every write, sets mode 0644 and
    /// the time, and renames the file into place.
    pub async fn finish(mut self) -> Result<super::TransferSummary, Error> {
        if !self.pending.is_empty() {
            let chunk = self.pending.split().freeze();
            self.send(chunk).await?;
        }
        let (Some(session), Some(mut writer)) = (self.session.take(), self.writer.take()) else {
            return Err(Self::ended());
        };
        let mut session = session;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs().min(u64::from(u32::MAX)) as u32);
        let attrs = Attrs {
            permissions: Some(0o644),
            atime: Some(now),
            mtime: Some(now),
            ..Attrs::default()
        };
        let drained = writer.drain().await;
        let result = match drained {
            Ok(confirmed) => {
                self.reporter.bytes(confirmed);
                writer
                    .commit(&session, &self.temp, &self.target, attrs)
                    .await
            }
            Err(failure) => {
                writer.discard(&session, &self.temp).await;
                Err(failure)
            }
        };
        let result = match result {
            Ok(()) => {
                self.reporter.file_done();
                self.reporter.finish();
                Ok(super::TransferSummary {
                    files: 1,
                    bytes: self.bytes,
                    ..Default::default()
                })
            }
            Err(failure) => {
                let err = session.fail(failure, "upload", &self.target).await;
                let _ = session.sftp.remove(&self.temp).await;
                Err(err)
            }
        };
        session.close().await;
        result
    }

    /// Gives the upload up: the temp file is removed, the target is left
    /// as it was.
    pub async fn abort(mut self) {
        if let Some(session) = self.session.take() {
            if let Some(mut writer) = self.writer.take() {
                let _ = writer.drain().await;
                writer.discard(&session, &self.temp).await;
            }
            session.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_inside_the_tree_only() {
        assert!(link_stays_inside(Path::new(""), "a/b"));
        assert!(link_stays_inside(Path::new("x/y"), "../../z"));
        assert!(!link_stays_inside(Path::new("x"), "../../z"));
        assert!(!link_stays_inside(Path::new(""), "../z"));
        assert!(!link_stays_inside(Path::new(""), "/etc/passwd"));
        assert!(link_stays_inside(Path::new("x"), "./../x/./f"));
        // A climb after a name could go through another link (`s -> .`).
        assert!(link_stays_inside(Path::new(""), "."));
        assert!(!link_stays_inside(Path::new(""), "s/.."));
        assert!(!link_stays_inside(Path::new("x/y"), "a/../../b"));
        assert!(!link_stays_inside(Path::new("x"), ""));
    }

    #[test]
    fn remote_paths_join() {
        assert_eq!(remote_join("/w/t", Path::new("a/b")), "/w/t/a/b");
        assert_eq!(remote_join("/w/t", Path::new("")), "/w/t");
    }
}
