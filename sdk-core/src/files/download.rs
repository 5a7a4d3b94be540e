//! Downloads: a sandbox file or tree to the local disk, and
//! [`DownloadSource`] for bytes the caller consumes.
//!
//! Locally as remotely, a file is written under a temp name next to its
//! target, gets its mode and times, and is renamed over the target last.

use std::collections::VecDeque;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use tonic::Code;

use super::ignore_rules::{IgnoreRules, MAX_IGNORE_FILE};
use super::progress::Reporter;
use super::session::{Session, TEMP_MARK, capped_name, local_error, rpc, shown, split_parent};
use super::sftp::{Attrs, Failure, OPEN_READ, Reply, Sftp};
use super::upload::{link_stays_inside, remote_join};
use super::{CHUNK, IN_FLIGHT, TransferOptions, TransferSummary};
use crate::client::Client;
use crate::error::Error;

/// The pipelined read side of one remote file: [`IN_FLIGHT`] reads of
/// [`CHUNK`] ahead, answered in order.
struct Reader {
    handle: Bytes,
    size: u64,
    next_offset: u64,
    in_flight: VecDeque<(u64, u32, Reply)>,
    done: bool,
}

impl Reader {
    fn new(handle: Bytes, size: u64) -> Self {
        Self {
            handle,
            size,
            next_offset: 0,
            in_flight: VecDeque::new(),
            done: false,
        }
    }

    /// The next bytes of the file (the size it had at open), `None` at its
    /// end.
    async fn next(&mut self, sftp: &Sftp) -> Result<Option<Bytes>, Failure> {
        while !self.done && self.in_flight.len() < IN_FLIGHT && self.next_offset < self.size {
            let len = (self.size - self.next_offset).min(CHUNK as u64) as u32;
            let reply = sftp.read(&self.handle, self.next_offset, len).await?;
            self.in_flight.push_back((self.next_offset, len, reply));
            self.next_offset += u64::from(len);
        }
        let Some((offset, len, reply)) = self.in_flight.pop_front() else {
            self.done = true;
            return Ok(None);
        };
        match reply.data().await {
            Ok(data) if data.is_empty() => self.shrunk(),
            Ok(data) => {
                let got = data.len().min(len as usize) as u32;
                if got < len {
                    // A short read: the rest is asked for first.
                    let rest = sftp
                        .read(&self.handle, offset + u64::from(got), len - got)
                        .await?;
                    self.in_flight
                        .push_front((offset + u64::from(got), len - got, rest));
                }
                Ok(Some(data.slice(..got as usize)))
            }
            Err(failure) if failure.is_eof() => self.shrunk(),
            Err(failure) => Err(failure),
        }
    }

    /// The file ended before its size: what was read is all there is.
    fn shrunk(&mut self) -> Result<Option<Bytes>, Failure> {
        self.done = true;
        self.in_flight.clear();
        Ok(None)
    }
}

/// One entry of a remote tree, relative to its top.
enum Item {
    Dir { rel: PathBuf, attrs: Attrs },
    File { rel: PathBuf, attrs: Attrs },
    Symlink { rel: PathBuf, target: String },
}

#[derive(Default)]
struct Plan {
    items: Vec<Item>,
    bytes: u64,
    files: u64,
    summary: TransferSummary,
}

fn system_time(seconds: Option<u32>) -> Option<std::time::SystemTime> {
    seconds.map(|s| UNIX_EPOCH + Duration::from_secs(s.into()))
}

/// A fresh local temp path next to `dest`.
fn local_temp(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let random = uuid::Uuid::new_v4().simple().to_string();
    dest.with_file_name(format!(
        ".{}{TEMP_MARK}{}",
        capped_name(&name),
        &random[..12]
    ))
}

/// A local temp file, removed on drop unless it was renamed into place:
/// a download whose future is dropped (Ctrl-C) leaves nothing either.
struct LocalTemp(Option<PathBuf>);

impl Drop for LocalTemp {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Mode and times onto a local file or directory.
/// Times first: the open needs read permission, which the mode may take.
fn set_local_attrs(path: &Path, attrs: &Attrs) -> std::io::Result<()> {
    if let (Some(atime), Some(mtime)) = (system_time(attrs.atime), system_time(attrs.mtime)) {
        let times = std::fs::FileTimes::new()
            .set_accessed(atime)
            .set_modified(mtime);
        std::fs::File::open(path)?.set_times(times)?;
    }
    if let Some(mode) = attrs.permissions {
        // No setuid, setgid or sticky bit from the sandbox.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o777))?;
    }
    Ok(())
}

pub(super) async fn download(
    client: &Client,
    sandbox: &str,
    remote: &str,
    local: &Path,
    options: &TransferOptions,
) -> Result<TransferSummary, Error> {
    let mut session = Session::open(client, sandbox, &options.call).await?;
    let result = download_in(&mut session, remote, local, options).await;
    session.close().await;
    result
}

async fn download_in(
    session: &mut Session,
    remote: &str,
    local: &Path,
    options: &TransferOptions,
) -> Result<TransferSummary, Error> {
    let source = session.resolve(remote)?;
    let attrs = match session.sftp.stat(&source).await {
        Ok(attrs) => attrs,
        Err(failure) => return Err(session.fail(failure, "download", &source).await),
    };
    let mut dest = local.to_path_buf();
    if std::fs::metadata(local).is_ok_and(|m| m.is_dir()) {
        let (_, name) = split_parent(&source);
        if !name.is_empty() {
            dest = local.join(name);
        }
    }
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match std::fs::metadata(&parent) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(rpc(
                Code::FailedPrecondition,
                format!(
                    "download {} (local): not a directory",
                    shown(&parent.to_string_lossy())
                ),
            ));
        }
        Err(err) => return Err(local_error(&err, "download", &parent)),
    }
    let existing = std::fs::symlink_metadata(&dest).ok();
    if attrs.is_dir() {
        if existing.as_ref().is_some_and(|m| !m.is_dir()) {
            return Err(rpc(
                Code::FailedPrecondition,
                format!(
                    "download {} (local): not a directory",
                    shown(&dest.to_string_lossy())
                ),
            ));
        }
        download_tree(session, &source, &dest, attrs, options).await
    } else if attrs.is_file() {
        if existing.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(rpc(
                Code::FailedPrecondition,
                format!(
                    "download {} (local): is a directory",
                    shown(&dest.to_string_lossy())
                ),
            ));
        }
        let size = attrs.size.unwrap_or(0);
        let mut reporter = Reporter::new(options.progress.clone(), size, 1);
        let bytes = get_file(session, &source, &dest, attrs, &mut reporter).await?;
        reporter.finish();
        Ok(TransferSummary {
            files: 1,
            bytes,
            ..Default::default()
        })
    } else {
        Err(rpc(
            Code::FailedPrecondition,
            format!(
                "download {}: not a regular file or directory",
                shown(&source)
            ),
        ))
    }
}

/// Reads a small remote file whole (an ignore file), up to `limit` bytes.
async fn read_small(sftp: &Sftp, path: &str, limit: usize) -> Result<Vec<u8>, Failure> {
    let handle = sftp.open(path, OPEN_READ, Attrs::default()).await?;
    let mut reader = Reader::new(handle.clone(), limit as u64);
    let mut out = Vec::new();
    while let Some(chunk) = reader.next(sftp).await? {
        out.extend_from_slice(&chunk);
    }
    let _ = sftp.close(&handle).await;
    Ok(out)
}

/// The entries of one remote directory.
async fn list(sftp: &Sftp, dir: &str) -> Result<Vec<super::sftp::Entry>, Failure> {
    let handle = sftp.opendir(dir).await?;
    let mut entries = Vec::new();
    loop {
        match sftp.readdir(&handle).await {
            Ok(Some(batch)) => entries.extend(batch),
            Ok(None) => break,
            Err(failure) => {
                let _ = sftp.close(&handle).await;
                return Err(failure);
            }
        }
    }
    let _ = sftp.close(&handle).await;
    entries.retain(|e| e.name != "." && e.name != "..");
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

async fn walk(
    session: &mut Session,
    top: &str,
    top_attrs: Attrs,
    ignore_file: Option<&str>,
) -> Result<Plan, Error> {
    let mut plan = Plan::default();
    plan.items.push(Item::Dir {
        rel: PathBuf::new(),
        attrs: top_attrs,
    });
    let mut stack = vec![(PathBuf::new(), IgnoreRules::default())];
    while let Some((rel, rules)) = stack.pop() {
        let dir = remote_join(top, &rel);
        let entries = match list(&session.sftp, &dir).await {
            Ok(entries) => entries,
            Err(failure) => return Err(session.fail(failure, "download", &dir).await),
        };
        let rules = match ignore_file {
            Some(name) if entries.iter().any(|e| e.name == name && e.attrs.is_file()) => {
                let path = format!("{dir}/{name}");
                match read_small(&session.sftp, &path, MAX_IGNORE_FILE).await {
                    Ok(text) => rules.with_file(&rel, &String::from_utf8_lossy(&text)),
                    Err(failure) => return Err(session.fail(failure, "download", &path).await),
                }
            }
            _ => rules,
        };
        for entry in entries {
            // The sandbox is the other side: a name that is not one plain
            // component (`../x`, `/etc/x`) would place a file outside `dest`.
            if entry.lossy {
                return Err(not_utf8(&dir, &entry.name));
            }
            if entry.name.is_empty() || entry.name.contains(['/', '\0']) {
                return Err(rpc(
                    Code::FailedPrecondition,
                    format!(
                        "download {}: the sandbox listed an entry whose name is not a plain file name: {}",
                        shown(&dir),
                        shown(&entry.name)
                    ),
                ));
            }
            let child = rel.join(&entry.name);
            let attrs = entry.attrs;
            if rules.ignored(&child, attrs.is_dir()) {
                plan.summary.ignored += 1;
                continue;
            }
            if attrs.is_dir() {
                plan.items.push(Item::Dir {
                    rel: child.clone(),
                    attrs,
                });
                stack.push((child, rules.clone()));
            } else if attrs.is_file() {
                plan.bytes += attrs.size.unwrap_or(0);
                plan.files += 1;
                plan.items.push(Item::File { rel: child, attrs });
            } else if attrs.is_symlink() {
                let path = remote_join(top, &child);
                let target = match session.sftp.readlink(&path).await {
                    Ok((target, false)) => target,
                    Ok((target, true)) => return Err(not_utf8(&path, &target)),
                    Err(failure) => return Err(session.fail(failure, "download", &path).await),
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

/// A name the sandbox gave in bytes that are not UTF-8: refused, since
/// every path here is text (a replaced name would copy to another file).
fn not_utf8(path: &str, name: &str) -> Error {
    rpc(
        Code::FailedPrecondition,
        format!(
            "download {}: a name is not UTF-8 (or holds U+FFFD), which file transfer does not carry: {}",
            shown(path),
            shown(name)
        ),
    )
}

async fn download_tree(
    session: &mut Session,
    source: &str,
    dest: &Path,
    top_attrs: Attrs,
    options: &TransferOptions,
) -> Result<TransferSummary, Error> {
    let plan = walk(session, source, top_attrs, options.ignore_file.as_deref()).await?;
    let mut reporter = Reporter::new(options.progress.clone(), plan.bytes, plan.files);
    let mut summary = plan.summary;
    let mut dirs = Vec::new();
    for item in &plan.items {
        match item {
            Item::Dir { rel, attrs } => {
                let path = dest.join(rel);
                match std::fs::create_dir(&path) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
                        // A link in its place is not followed: it could lead
                        // the files below out of `dest`.
                        if !std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                            return Err(rpc(
                                Code::FailedPrecondition,
                                format!(
                                    "download {} (local): not a directory",
                                    shown(&path.to_string_lossy())
                                ),
                            ));
                        }
                    }
                    Err(err) => return Err(local_error(&err, "download", &path)),
                }
                // Writable by us until the end, whatever its final mode (a
                // real directory by now: a link in its place was refused).
                let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700));
                summary.directories += 1;
                dirs.push((path, *attrs));
            }
            Item::File { rel, attrs } => {
                let from = remote_join(source, rel);
                summary.bytes +=
                    get_file(session, &from, &dest.join(rel), *attrs, &mut reporter).await?;
                summary.files += 1;
            }
            Item::Symlink { rel, target } => {
                let path = dest.join(rel);
                if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_dir()) {
                    let _ = std::fs::remove_file(&path);
                }
                std::os::unix::fs::symlink(target, &path)
                    .map_err(|e| local_error(&e, "download", &path))?;
                summary.symlinks += 1;
            }
        }
    }
    for (path, attrs) in dirs.iter().rev() {
        set_local_attrs(path, attrs).map_err(|e| local_error(&e, "download", path))?;
    }
    reporter.finish();
    Ok(summary)
}

/// Downloads one file to `dest` through a local temp file; the bytes.
async fn get_file(
    session: &mut Session,
    source: &str,
    dest: &Path,
    attrs: Attrs,
    reporter: &mut Reporter,
) -> Result<u64, Error> {
    reporter.current(source);
    let handle = match session.sftp.open(source, OPEN_READ, Attrs::default()).await {
        Ok(handle) => handle,
        Err(failure) => return Err(session.fail(failure, "download", source).await),
    };
    let temp = local_temp(dest);
    let opened = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp);
    let file = match opened {
        Ok(file) => file,
        Err(err) => {
            let _ = session.sftp.close(&handle).await;
            return Err(local_error(&err, "download", dest));
        }
    };
    let mut guard = LocalTemp(Some(temp.clone()));
    let mut file = tokio::fs::File::from_std(file);
    let mut reader = Reader::new(handle.clone(), attrs.size.unwrap_or(0));
    let mut bytes = 0u64;
    // Err(Ok(failure)): the server's or the stream's; Err(Err(error)): local.
    let copied: Result<(), Result<Failure, Error>> = async {
        while let Some(chunk) = reader.next(&session.sftp).await.map_err(Ok)? {
            file.write_all(&chunk)
                .await
                .map_err(|e| Err(local_error(&e, "download", dest)))?;
            bytes += chunk.len() as u64;
            reporter.bytes(chunk.len() as u64);
        }
        file.flush()
            .await
            .map_err(|e| Err(local_error(&e, "download", dest)))?;
        Ok(())
    }
    .await;
    drop(file);
    let _ = session.sftp.close(&handle).await;
    let finished = copied.and_then(|()| {
        set_local_attrs(&temp, &attrs)
            .and_then(|()| std::fs::rename(&temp, dest))
            .map_err(|e| Err(local_error(&e, "download", dest)))
    });
    match finished {
        Ok(()) => {
            guard.0 = None;
            reporter.file_done();
            Ok(bytes)
        }
        Err(err) => {
            drop(guard);
            Err(match err {
                Ok(failure) => session.fail(failure, "download", source).await,
                Err(err) => err,
            })
        }
    }
}

/// A download of one file, consumed chunk by chunk. See
/// [`Client::download_stream`]. Dropping it ends the stream.
pub struct DownloadSource {
    session: Option<Session>,
    reader: Reader,
    source: String,
    reporter: Reporter,
}

impl std::fmt::Debug for DownloadSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DownloadSource")
            .field("source", &self.source)
            .field("size", &self.reader.size)
            .finish()
    }
}

impl DownloadSource {
    pub(super) async fn open(
        client: &Client,
        sandbox: &str,
        remote: &str,
        options: &TransferOptions,
    ) -> Result<Self, Error> {
        let mut session = Session::open(client, sandbox, &options.call).await?;
        match Self::start(&mut session, remote).await {
            Ok((source, handle, size)) => {
                let mut reporter = Reporter::new(options.progress.clone(), size, 1);
                reporter.current(&source);
                Ok(Self {
                    session: Some(session),
                    reader: Reader::new(handle, size),
                    source,
                    reporter,
                })
            }
            Err(err) => {
                session.close().await;
                Err(err)
            }
        }
    }

    async fn start(session: &mut Session, remote: &str) -> Result<(String, Bytes, u64), Error> {
        let source = session.resolve(remote)?;
        let attrs = match session.sftp.stat(&source).await {
            Ok(attrs) => attrs,
            Err(failure) => return Err(session.fail(failure, "download", &source).await),
        };
        if attrs.is_dir() {
            return Err(rpc(
                Code::FailedPrecondition,
                format!("download {}: is a directory", shown(&source)),
            ));
        }
        if !attrs.is_file() {
            return Err(rpc(
                Code::FailedPrecondition,
                format!("download {}: not a regular file", shown(&source)),
            ));
        }
        match session
            .sftp
            .open(&source, OPEN_READ, Attrs::default())
            .await
        {
            Ok(handle) => Ok((source, handle, attrs.size.unwrap_or(0))),
            Err(failure) => Err(session.fail(failure, "download", &source).await),
        }
    }

    /// The file's size when the download started.
    pub fn size(&self) -> u64 {
        self.reader.size
    }

    /// The absolute path of the file in the sandbox.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The next chunk (at most [`CHUNK`] bytes), `None` at the end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, Error> {
        let Some(session) = self.session.as_mut() else {
            return Ok(None);
        };
        match self.reader.next(&session.sftp).await {
            Ok(Some(chunk)) => {
                self.reporter.bytes(chunk.len() as u64);
                Ok(Some(chunk))
            }
            Ok(None) => {
                self.reporter.file_done();
                self.reporter.finish();
                self.close().await;
                Ok(None)
            }
            Err(failure) => {
                let err = session.fail(failure, "download", &self.source).await;
                self.close().await;
                Err(err)
            }
        }
    }

    /// Ends the download (the rest is not read).
    pub async fn close(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.sftp.close(&self.reader.handle).await;
            session.close().await;
        }
    }
}
