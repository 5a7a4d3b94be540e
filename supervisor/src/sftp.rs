//! The SFTP server behind the embedded SSH server's `sftp` subsystem:
//! `openshell-supervisor __sftp-server`, or the exec helper with `--sftp`
//! inside a sandbox. It imports nothing of the SSH server (which runs it as
//! an exec): the exec helper reaches it without a cycle.
//!
//! It runs as an exec like any other: inside the sandbox's namespaces, as
//! the sandbox's uid, in its working directory, so it sees exactly what a
//! shell in the sandbox sees and nothing more. It speaks SFTP version 3
//! (what OpenSSH's `sftp` and `scp` use) on stdin and stdout, one request
//! at a time, with plain file system calls. Requests may be pipelined: they
//! queue in the pipe and are answered in order.
//!
//! What the SDK's file transfer relies on (the `sftp` relay target, see
//! `sftp_relay`):
//! - packets up to [`MAX_PACKET`], so 256 KiB writes fit;
//! - RENAME replaces an existing target atomically (rename(2)), unlike
//!   OpenSSH's server, which refuses one;
//! - a file this session created under an upload temp name
//!   ([`is_upload_temp`]) and did not rename or remove is deleted when the
//!   session ends (the client is gone or its stream broke), so a failed
//!   upload leaves nothing half-written;
//! - errors carry a code and a stable message: NO_SUCH_FILE,
//!   PERMISSION_DENIED, and FAILURE with "no space left ..." (ENOSPC,
//!   EDQUOT), "is a directory" (EISDIR) or "not a directory" (ENOTDIR).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use russh_sftp::protocol::{
    Attrs, Data, File as Entry, FileAttributes, Handle, Name, OpenFlags, Status, StatusCode,
    Version,
};
use russh_sftp::server::StatusReply;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Largest read answered at once (OpenSSH asks for 32 KiB or 255 KiB).
const MAX_READ: u32 = 256 * 1024;
/// Directory entries per READDIR answer.
const DIR_BATCH: usize = 128;
/// Largest packet taken from the client: a 256 KiB write and its header.
pub const MAX_PACKET: u32 = 256 * 1024 + 4096;
/// What names an upload temp file: `.<name>.openshell-part-<random>`.
pub const UPLOAD_TEMP_MARK: &str = ".openshell-part-";

/// Whether `path`'s file name is an upload temp name.
pub fn is_upload_temp(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| {
            name.starts_with('.')
                && name
                    .find(UPLOAD_TEMP_MARK)
                    .is_some_and(|at| at > 1 && at + UPLOAD_TEMP_MARK.len() < name.len())
        })
}

/// Serves SFTP on stdin and stdout until the client goes away; the exit
/// code.
pub fn serve_stdio() -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("sftp-server: {err}");
            return 1;
        }
    };
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    runtime.block_on(async move {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let (cleaned_tx, cleaned_rx) = tokio::sync::oneshot::channel();
        let stdio = Stdio {
            input: tokio::io::stdin(),
            output: tokio::io::stdout(),
            _done: done_tx,
        };
        let mut server = Server::new(cwd);
        server.cleaned = Some(cleaned_tx);
        let config = russh_sftp::server::Config {
            max_client_packet_len: MAX_PACKET,
        };
        russh_sftp::server::run_with_config(stdio, server, config).await;
        // The server task drops the stream and the handler (which removes
        // its leftover temp files first) when the client is gone.
        let _ = done_rx.await;
        let _ = cleaned_rx.await;
    });
    0
}

/// Stdin and stdout as one stream; dropping it says the server ended.
struct Stdio {
    input: tokio::io::Stdin,
    output: tokio::io::Stdout,
    _done: tokio::sync::oneshot::Sender<()>,
}

impl AsyncRead for Stdio {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.input).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stdio {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.output).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.output).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.output).poll_shutdown(cx)
    }
}

enum Open {
    File(File),
    /// Entries not yet returned; `None` once the last batch went out.
    Dir(Option<Vec<Entry>>),
}

pub struct Server {
    cwd: PathBuf,
    handles: HashMap<String, Open>,
    next_handle: u64,
    /// Upload temp files this session created and nobody renamed yet.
    temp_files: HashSet<PathBuf>,
    /// Dropped once the temp files are gone (after `Drop::drop`).
    cleaned: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.handles.clear();
        for path in self.temp_files.drain() {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => eprintln!(
                    "sftp-server: removing {}: {}",
                    path.display(),
                    crate::os_error::describe(&err)
                ),
            }
        }
    }
}

impl Server {
    pub fn new(cwd: PathBuf) -> Self {
        Self {
            cwd,
            handles: HashMap::new(),
            next_handle: 0,
            temp_files: HashSet::new(),
            cleaned: None,
        }
    }

    fn path(&self, path: &str) -> PathBuf {
        if path.is_empty() {
            self.cwd.clone()
        } else {
            self.cwd.join(path)
        }
    }

    fn keep(&mut self, open: Open) -> String {
        self.next_handle += 1;
        let handle = self.next_handle.to_string();
        self.handles.insert(handle.clone(), open);
        handle
    }

    fn file(&self, handle: &str) -> Result<&File, StatusReply> {
        match self.handles.get(handle) {
            Some(Open::File(file)) => Ok(file),
            _ => Err(StatusCode::Failure.with_message("invalid handle")),
        }
    }
}

fn ok(id: u32) -> Status {
    Status {
        id,
        status_code: StatusCode::Ok,
        error_message: "Ok".into(),
        language_tag: "en-US".into(),
    }
}

fn failed(err: io::Error) -> StatusReply {
    let (code, message) = error_status(&err);
    code.with_message(message)
}

/// An error's status code and message; the messages a client may match
/// on are stable (see the module doc).
fn error_status(err: &io::Error) -> (StatusCode, String) {
    match err.raw_os_error() {
        Some(libc::ENOSPC) => (StatusCode::Failure, "no space left on device".into()),
        Some(libc::EDQUOT) => (
            StatusCode::Failure,
            "no space left: disk quota exceeded".into(),
        ),
        Some(libc::EISDIR) => (StatusCode::Failure, "is a directory".into()),
        Some(libc::ENOTDIR) => (StatusCode::Failure, "not a directory".into()),
        _ => {
            let code = match err.kind() {
                io::ErrorKind::NotFound => StatusCode::NoSuchFile,
                io::ErrorKind::PermissionDenied => StatusCode::PermissionDenied,
                _ => StatusCode::Failure,
            };
            (code, crate::os_error::describe(err))
        }
    }
}

/// Attributes as SFTP v3 carries them; `permissions` keeps the file type.
pub fn attributes(meta: &fs::Metadata) -> FileAttributes {
    FileAttributes {
        size: Some(meta.len()),
        uid: Some(meta.uid()),
        user: None,
        gid: Some(meta.gid()),
        group: None,
        permissions: Some(meta.mode()),
        atime: Some(meta.atime().clamp(0, i64::from(u32::MAX)) as u32),
        mtime: Some(meta.mtime().clamp(0, i64::from(u32::MAX)) as u32),
    }
}

/// `.` and `..` resolved without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(name) => out.push(name),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

fn set_attributes(path: &Path, file: Option<&File>, attrs: &FileAttributes) -> io::Result<()> {
    if let Some(size) = attrs.size {
        match file {
            Some(file) => file.set_len(size)?,
            None => OpenOptions::new().write(true).open(path)?.set_len(size)?,
        }
    }
    if let Some(mode) = attrs.permissions {
        let perms = fs::Permissions::from_mode(mode & 0o7777);
        match file {
            Some(file) => file.set_permissions(perms)?,
            None => fs::set_permissions(path, perms)?,
        }
    }
    if let (Some(atime), Some(mtime)) = (attrs.atime, attrs.mtime) {
        let times = fs::FileTimes::new()
            .set_accessed(std::time::UNIX_EPOCH + std::time::Duration::from_secs(atime.into()))
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(mtime.into()));
        match file {
            Some(file) => file.set_times(times)?,
            // By path: a directory (or a file without write permission)
            // cannot be opened for writing, and needs no opening.
            None => set_times_at(path, atime, mtime)?,
        }
    }
    Ok(())
}

/// utimensat(2) on `path`, following symlinks.
fn set_times_at(path: &Path, atime: u32, mtime: u32) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let time = |secs: u32| libc::timespec {
        tv_sec: secs.into(),
        tv_nsec: 0,
    };
    let times = [time(atime), time(mtime)];
    // SAFETY: a NUL-terminated path and two timespecs, as utimensat takes.
    if unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl russh_sftp::server::Handler for Server {
    type Error = StatusReply;

    fn unimplemented(&self) -> Self::Error {
        StatusReply::new(StatusCode::OpUnsupported)
    }

    async fn init(
        &mut self,
        _version: u32,
        _extensions: HashMap<String, String>,
    ) -> Result<Version, Self::Error> {
        Ok(Version::new())
    }

    async fn realpath(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let full = self.path(&path);
        let resolved = fs::canonicalize(&full).unwrap_or_else(|_| normalize(&full));
        let name = resolved.to_string_lossy().into_owned();
        Ok(Name {
            id,
            files: vec![Entry::dummy(name)],
        })
    }

    async fn stat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let meta = fs::metadata(self.path(&path)).map_err(failed)?;
        Ok(Attrs {
            id,
            attrs: attributes(&meta),
        })
    }

    async fn lstat(&mut self, id: u32, path: String) -> Result<Attrs, Self::Error> {
        let meta = fs::symlink_metadata(self.path(&path)).map_err(failed)?;
        Ok(Attrs {
            id,
            attrs: attributes(&meta),
        })
    }

    async fn fstat(&mut self, id: u32, handle: String) -> Result<Attrs, Self::Error> {
        let meta = self.file(&handle)?.metadata().map_err(failed)?;
        Ok(Attrs {
            id,
            attrs: attributes(&meta),
        })
    }

    async fn open(
        &mut self,
        id: u32,
        filename: String,
        pflags: OpenFlags,
        attrs: FileAttributes,
    ) -> Result<Handle, Self::Error> {
        let mut options = OpenOptions::new();
        options
            .read(pflags.contains(OpenFlags::READ))
            .write(pflags.contains(OpenFlags::WRITE))
            .append(pflags.contains(OpenFlags::APPEND));
        if pflags.contains(OpenFlags::CREATE) {
            if pflags.contains(OpenFlags::EXCLUDE) {
                options.create_new(true);
            } else {
                options.create(true);
            }
        }
        if pflags.contains(OpenFlags::TRUNCATE) {
            options.truncate(true);
        }
        options.mode(attrs.permissions.map_or(0o666, |mode| mode & 0o7777));
        let path = self.path(&filename);
        let file = options.open(&path).map_err(failed)?;
        if pflags.contains(OpenFlags::CREATE) && is_upload_temp(&path) {
            self.temp_files.insert(normalize(&path));
        }
        Ok(Handle {
            id,
            handle: self.keep(Open::File(file)),
        })
    }

    async fn read(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        len: u32,
    ) -> Result<Data, Self::Error> {
        let file = self.file(&handle)?;
        let mut data = vec![0u8; len.min(MAX_READ) as usize];
        let n = file.read_at(&mut data, offset).map_err(failed)?;
        if n == 0 && !data.is_empty() {
            return Err(StatusReply::new(StatusCode::Eof));
        }
        data.truncate(n);
        Ok(Data { id, data })
    }

    async fn write(
        &mut self,
        id: u32,
        handle: String,
        offset: u64,
        data: Vec<u8>,
    ) -> Result<Status, Self::Error> {
        self.file(&handle)?
            .write_all_at(&data, offset)
            .map_err(failed)?;
        Ok(ok(id))
    }

    async fn close(&mut self, id: u32, handle: String) -> Result<Status, Self::Error> {
        match self.handles.remove(&handle) {
            Some(_) => Ok(ok(id)),
            None => Err(StatusCode::Failure.with_message("invalid handle")),
        }
    }

    async fn setstat(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        set_attributes(&self.path(&path), None, &attrs).map_err(failed)?;
        Ok(ok(id))
    }

    async fn fsetstat(
        &mut self,
        id: u32,
        handle: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        let file = self.file(&handle)?;
        set_attributes(Path::new(""), Some(file), &attrs).map_err(failed)?;
        Ok(ok(id))
    }

    async fn opendir(&mut self, id: u32, path: String) -> Result<Handle, Self::Error> {
        let dir = self.path(&path);
        let mut entries = Vec::new();
        for entry in fs::read_dir(&dir).map_err(failed)? {
            let entry = entry.map_err(failed)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let attrs = match entry.metadata() {
                Ok(meta) => attributes(&meta),
                Err(_) => FileAttributes::empty(),
            };
            entries.push(Entry::new(name, attrs));
        }
        Ok(Handle {
            id,
            handle: self.keep(Open::Dir(Some(entries))),
        })
    }

    async fn readdir(&mut self, id: u32, handle: String) -> Result<Name, Self::Error> {
        let Some(Open::Dir(rest)) = self.handles.get_mut(&handle) else {
            return Err(StatusCode::Failure.with_message("invalid handle"));
        };
        let Some(entries) = rest else {
            return Err(StatusReply::new(StatusCode::Eof));
        };
        let batch: Vec<Entry> = entries.drain(..entries.len().min(DIR_BATCH)).collect();
        if entries.is_empty() {
            *rest = None;
        }
        if batch.is_empty() {
            return Err(StatusReply::new(StatusCode::Eof));
        }
        Ok(Name { id, files: batch })
    }

    async fn remove(&mut self, id: u32, filename: String) -> Result<Status, Self::Error> {
        let path = self.path(&filename);
        fs::remove_file(&path).map_err(failed)?;
        self.temp_files.remove(&normalize(&path));
        Ok(ok(id))
    }

    async fn mkdir(
        &mut self,
        id: u32,
        path: String,
        attrs: FileAttributes,
    ) -> Result<Status, Self::Error> {
        let path = self.path(&path);
        fs::create_dir(&path).map_err(failed)?;
        if let Some(mode) = attrs.permissions {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))
                .map_err(failed)?;
        }
        Ok(ok(id))
    }

    async fn rmdir(&mut self, id: u32, path: String) -> Result<Status, Self::Error> {
        fs::remove_dir(self.path(&path)).map_err(failed)?;
        Ok(ok(id))
    }

    async fn rename(
        &mut self,
        id: u32,
        oldpath: String,
        newpath: String,
    ) -> Result<Status, Self::Error> {
        // rename(2): an existing target is replaced atomically.
        let from = self.path(&oldpath);
        fs::rename(&from, self.path(&newpath)).map_err(failed)?;
        self.temp_files.remove(&normalize(&from));
        Ok(ok(id))
    }

    async fn readlink(&mut self, id: u32, path: String) -> Result<Name, Self::Error> {
        let target = fs::read_link(self.path(&path)).map_err(failed)?;
        Ok(Name {
            id,
            files: vec![Entry::dummy(target.to_string_lossy().into_owned())],
        })
    }

    async fn symlink(
        &mut self,
        id: u32,
        linkpath: String,
        targetpath: String,
    ) -> Result<Status, Self::Error> {
        // OpenSSH sends SSH_FXP_SYMLINK's two paths in the reverse of the
        // draft's order (its PROTOCOL file says so), so the field named
        // `linkpath` holds the link's target and `targetpath` the new link.
        std::os::unix::fs::symlink(&linkpath, self.path(&targetpath)).map_err(failed)?;
        Ok(ok(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_temp_names() {
        assert!(is_upload_temp(Path::new(
            "/w/.data.bin.openshell-part-1a2b"
        )));
        assert!(is_upload_temp(Path::new(".x.openshell-part-z")));
        assert!(!is_upload_temp(Path::new(
            "/w/data.bin.openshell-part-1a2b"
        )));
        assert!(!is_upload_temp(Path::new("/w/.data.bin.openshell-part-")));
        assert!(!is_upload_temp(Path::new("/w/.openshell-part-abc")));
        assert!(!is_upload_temp(Path::new("/w/.data.bin")));
    }

    #[test]
    fn errors_map_to_codes_and_stable_messages() {
        let status = |errno| error_status(&io::Error::from_raw_os_error(errno));
        assert_eq!(status(libc::ENOENT).0, StatusCode::NoSuchFile);
        assert_eq!(status(libc::EACCES).0, StatusCode::PermissionDenied);
        assert_eq!(
            status(libc::ENOSPC),
            (StatusCode::Failure, "no space left on device".into())
        );
        assert!(status(libc::EDQUOT).1.starts_with("no space left"));
        assert_eq!(status(libc::EISDIR).1, "is a directory");
        assert_eq!(status(libc::ENOTDIR).1, "not a directory");
    }

    /// A session that ends leaves no temp file it created, and keeps what
    /// it renamed into place.
    #[tokio::test]
    async fn leftover_temp_files_are_removed_at_the_end() {
        use russh_sftp::server::Handler as _;
        let dir = tempfile::tempdir().unwrap();
        let mut server = Server::new(dir.path().to_path_buf());
        let create = OpenFlags::CREATE | OpenFlags::WRITE | OpenFlags::TRUNCATE;
        for name in [".a.openshell-part-1", ".b.openshell-part-2", "plain"] {
            server
                .open(1, name.into(), create, FileAttributes::empty())
                .await
                .unwrap();
        }
        fs::write(dir.path().join("b"), b"old").unwrap();
        server
            .rename(2, ".b.openshell-part-2".into(), "b".into())
            .await
            .unwrap();
        drop(server);
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["b", "plain"]);
        assert!(fs::read(dir.path().join("b")).unwrap().is_empty());
    }

    #[test]
    fn paths_normalize_without_the_file_system() {
        assert_eq!(normalize(Path::new("/a/b/../c/./d")), Path::new("/a/c/d"));
        assert_eq!(normalize(Path::new("/../..")), Path::new("/"));
    }
}
