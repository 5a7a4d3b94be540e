//! One transfer's SFTP session: a `ForwardTcp` stream to the sandbox's
//! `sftp` target, the SFTP client on it, the sandbox's working directory,
//! and how failures become [`Error`]s that name the path.
//!
//! The stream is [`Client::forward_io`] over an in-memory pipe, so it is
//! owner-routed exactly like a forward: hinted to the owner, with the single
//! unrouted retry when the edge proves it never forwarded the stream.
//! Nothing is retried after that: an upload that was seen by a server is
//! never replayed behind the caller's back.

use std::time::Duration;

use tokio::task::JoinHandle;
use tonic::Code;

use super::sftp::{self, Failure, Sftp};
use crate::client::{CallOptions, Client};
use crate::error::Error;
use crate::forward::{ForwardStats, ForwardTarget};
use crate::metadata::Metadata;

/// Bytes the pipe between the SFTP client and the forward holds.
const PIPE: usize = 1 << 20;
/// How long a broken stream's forward gets to say why it ended.
const WHY_WAIT: Duration = Duration::from_secs(10);
/// Longest path shown in an error message.
pub(super) const MAX_SHOWN_PATH: usize = 200;
/// What names an upload's temp file: `.<name>.openshell-part-<random>`.
pub(super) const TEMP_MARK: &str = ".openshell-part-";

/// A live session to one sandbox's SFTP server.
pub(super) struct Session {
    pub sftp: Sftp,
    /// The sandbox's working directory, as the server resolves ".".
    pub root: String,
    forward: Option<JoinHandle<Result<ForwardStats, Error>>>,
}

impl Session {
    /// Opens the stream, starts SFTP and asks for the working directory.
    pub async fn open(client: &Client, sandbox: &str, call: &CallOptions) -> Result<Self, Error> {
        if sandbox.is_empty() {
            return Err(Error::invalid_config("file transfer needs a sandbox name"));
        }
        let (ours, theirs) = tokio::io::duplex(PIPE);
        let (read, write) = tokio::io::split(theirs);
        let forward = {
            let client = client.clone();
            let sandbox = sandbox.to_owned();
            let call = call.clone();
            tokio::spawn(async move {
                client
                    .forward_io(&sandbox, ForwardTarget::Sftp, None, read, write, call)
                    .await
            })
        };
        let mut session = Session {
            sftp: match Sftp::start(ours).await {
                Ok(sftp) => sftp,
                Err(failure) => {
                    return Err(stream_failure(Some(forward), failure, "starting SFTP").await);
                }
            },
            root: String::new(),
            forward: Some(forward),
        };
        session.root = match session.sftp.realpath(".").await {
            Ok(root) => root,
            Err(failure) => return Err(session.fail(failure, "REALPATH", ".").await),
        };
        Ok(session)
    }

    /// The error for `failure` of `operation` on `path`. A broken stream is
    /// reported as the forward reports it (the gateway's status).
    pub async fn fail(&mut self, failure: Failure, operation: &str, path: &str) -> Error {
        match failure {
            Failure::Status { code, message } => status_error(code, &message, operation, path),
            failure => {
                stream_failure(
                    self.forward.take(),
                    failure,
                    &format!("{operation} {}", shown(path)),
                )
                .await
            }
        }
    }

    /// Ends the session: the request stream closes, the server exits.
    /// Waits (bounded) for the stream to end, so that the server has
    /// cleaned up by the time this returns.
    pub async fn close(mut self) {
        let forward = self.forward.take();
        drop(self);
        if let Some(forward) = forward {
            let _ = tokio::time::timeout(WHY_WAIT, forward).await;
        }
    }

    /// `path` as an absolute path inside the working directory; relative
    /// paths are taken from it. Anything else is `invalid_argument`,
    /// before anything is written.
    pub fn resolve(&self, path: &str) -> Result<String, Error> {
        resolve_in(&self.root, path)
    }
}

/// `path` resolved against `root` without the file system: `.` and `..`
/// are applied as written, and the result must be `root` or below it.
pub(super) fn resolve_in(root: &str, path: &str) -> Result<String, Error> {
    if path.contains('\0') {
        return Err(invalid(path, "contains a NUL byte"));
    }
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{root}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(outside(path, root));
                }
            }
            part => parts.push(part),
        }
    }
    let resolved = format!("/{}", parts.join("/"));
    if !is_within(root, &resolved) {
        return Err(outside(path, root));
    }
    Ok(resolved)
}

/// Whether `path` is `root` or below it (both absolute and normalized).
pub(super) fn is_within(root: &str, path: &str) -> bool {
    let root = root.trim_end_matches('/');
    root.is_empty() || path == root || path.starts_with(&format!("{root}/"))
}

fn invalid(path: &str, why: &str) -> Error {
    rpc(Code::InvalidArgument, format!("{}: {why}", shown(path)))
}

fn outside(path: &str, root: &str) -> Error {
    rpc(
        Code::InvalidArgument,
        format!(
            "{}: outside the sandbox's working directory {}",
            shown(path),
            shown(root)
        ),
    )
}

/// A path as error messages show it: at most [`MAX_SHOWN_PATH`] characters
/// (its end, which names the file), control characters escaped.
pub(super) fn shown(path: &str) -> String {
    let escaped: String = path.chars().flat_map(char::escape_debug).collect();
    let count = escaped.chars().count();
    if count <= MAX_SHOWN_PATH {
        return escaped;
    }
    let tail: String = escaped.chars().skip(count - (MAX_SHOWN_PATH - 3)).collect();
    format!("...{tail}")
}

pub(super) fn rpc(code: Code, message: String) -> Error {
    Error::Rpc {
        code,
        message,
        metadata: Metadata::new(),
    }
}

/// An SFTP status as the crate's error, naming the operation and path.
pub(super) fn status_error(code: u32, message: &str, operation: &str, path: &str) -> Error {
    let lower = message.to_ascii_lowercase();
    let grpc = match code {
        sftp::FX_NO_SUCH_FILE => Code::NotFound,
        sftp::FX_PERMISSION_DENIED => Code::PermissionDenied,
        sftp::FX_OP_UNSUPPORTED => Code::Unimplemented,
        _ if lower.contains("no space left") || lower.contains("quota") => Code::ResourceExhausted,
        _ if lower.contains("is a directory") || lower.contains("not a directory") => {
            Code::FailedPrecondition
        }
        _ => Code::Unknown,
    };
    let message = if message.is_empty() {
        format!("status {code}")
    } else {
        message.chars().take(200).collect()
    };
    rpc(grpc, format!("{operation} {}: {message}", shown(path)))
}

/// A local I/O failure as the crate's error, naming the path.
pub(super) fn local_error(err: &std::io::Error, operation: &str, path: &std::path::Path) -> Error {
    use std::io::ErrorKind;
    let code = match err.kind() {
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => Code::ResourceExhausted,
        ErrorKind::IsADirectory | ErrorKind::NotADirectory => Code::FailedPrecondition,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
        _ => Code::Unknown,
    };
    let path = shown(&path.to_string_lossy());
    rpc(code, format!("{operation} {path} (local): {err}"))
}

/// Why the stream broke: the forward's error when it has one.
async fn stream_failure(
    forward: Option<JoinHandle<Result<ForwardStats, Error>>>,
    failure: Failure,
    doing: &str,
) -> Error {
    if let Failure::Protocol(why) = &failure {
        return Error::protocol(format!("SFTP while {doing}: {why}"));
    }
    if let Some(forward) = forward
        && let Ok(Ok(Err(err))) = tokio::time::timeout(WHY_WAIT, forward).await
    {
        return err;
    }
    rpc(
        Code::Unavailable,
        format!(
            "the sandbox's SFTP stream ended during {}",
            doing.chars().take(MAX_SHOWN_PATH + 40).collect::<String>()
        ),
    )
}

/// A fresh temp name for `target` in its own directory.
pub(super) fn temp_name_for(target: &str) -> String {
    let (dir, name) = split_parent(target);
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{dir}/.{}{TEMP_MARK}{}", capped_name(name), &random[..12])
}

/// At most the first 180 bytes of a file name, cut at a character's edge:
/// a temp name built on it stays under the 255 bytes a name may have.
pub(super) fn capped_name(name: &str) -> &str {
    let mut end = name.len().min(180);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// `(parent, file name)` of an absolute normalized path.
pub(super) fn split_parent(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(0) => ("", &path[1..]),
        Some(at) => (&path[..at], &path[at + 1..]),
        None => ("", path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_stay_under_the_name_limit_in_bytes() {
        // 80 three-byte characters: 240 bytes, a valid name.
        let name = "\u{6587}".repeat(80);
        let capped = capped_name(&name);
        assert_eq!(capped.len(), 180);
        assert!(temp_name_for(&format!("/w/{name}")).len() - 3 < 255);
        assert_eq!(capped_name("abc"), "abc");
        // A cut inside a character steps back to its start.
        assert_eq!(
            capped_name(&format!("a{}", "\u{e9}".repeat(100))).len(),
            179
        );
    }

    #[test]
    fn paths_resolve_inside_the_root_only() {
        let root = "/sandbox";
        assert_eq!(resolve_in(root, "a/b").unwrap(), "/sandbox/a/b");
        assert_eq!(resolve_in(root, "./a/../b/").unwrap(), "/sandbox/b");
        assert_eq!(resolve_in(root, ".").unwrap(), "/sandbox");
        assert_eq!(resolve_in(root, "").unwrap(), "/sandbox");
        assert_eq!(resolve_in(root, "/sandbox/x").unwrap(), "/sandbox/x");
        for bad in ["/etc/passwd", "../x", "a/../../x", "/sandboxed", "/"] {
            let err = resolve_in(root, bad).unwrap_err();
            assert_eq!(err.code(), "invalid_argument", "{bad}");
            assert!(err.message().contains(bad), "{err}");
        }
        assert_eq!(resolve_in("/", "/etc").unwrap(), "/etc");
    }

    #[test]
    fn long_paths_are_capped_in_messages() {
        let long = format!("/w/{}", "x".repeat(1000));
        let err = status_error(2, "no such file", "open", &long);
        assert_eq!(err.code(), "not_found");
        assert!(err.message().len() < 300, "{}", err.message());
        assert!(shown("a\nb").contains("\\n"));
    }

    #[test]
    fn statuses_map_to_codes() {
        let code = |c, m| status_error(c, m, "write", "/w/f").code();
        assert_eq!(code(3, "denied"), "permission_denied");
        assert_eq!(code(4, "no space left on device"), "resource_exhausted");
        assert_eq!(code(4, "is a directory"), "failed_precondition");
        assert_eq!(code(4, "not a directory"), "failed_precondition");
        assert_eq!(code(4, "anything"), "unknown");
    }

    #[test]
    fn temp_names_sit_next_to_the_target() {
        let temp = temp_name_for("/w/dir/data.bin");
        assert!(
            temp.starts_with("/w/dir/.data.bin.openshell-part-"),
            "{temp}"
        );
        assert_eq!(split_parent("/a"), ("", "a"));
    }
}
