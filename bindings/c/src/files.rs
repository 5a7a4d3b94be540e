//! File transfer: uploads and downloads of paths on the caller's machine
//! (the core does every read and write: a file is never held whole in
//! memory), the stream forms as `OsStream`s, and whole small files.
//!
//! A transfer's progress callback runs on a runtime thread, at most every
//! 100 ms and once at the end; like a completion callback it must not
//! block. For a path transfer every call comes before the completion; a
//! stream form's calls come until its stream is freed. Its `OsProgress`
//! (the `current` path included) is borrowed for the duration of the call.

use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use openshell_sdk::{Client, Error, Progress, TransferOptions, TransferSummary};

use crate::call::{Call, OsCallOptions, OsClient};
use crate::complete::{OsCallback, Outcome, start};
use crate::stream::{OsStream, Receiver, Sender, stream_ptr};
use crate::types::{OS_INVALID, OsBytes};

/// Where a transfer stands; borrowed for the duration of the callback.
#[repr(C)]
pub struct OsProgress {
    /// File bytes moved so far.
    pub bytes_done: u64,
    /// File bytes the transfer moves in all (an upload stream: so far).
    pub bytes_total: u64,
    /// Files completed.
    pub files_done: u64,
    /// Files the transfer moves in all.
    pub files_total: u64,
    /// The file being moved (its destination path).
    pub current: OsBytes,
}

/// A transfer's progress callback: `user_data` is `progress_data`.
pub type OsProgressCallback =
    Option<unsafe extern "C" fn(user_data: usize, progress: *const OsProgress)>;

/// How a transfer runs, passed by value; zero values mean "not set".
#[repr(C)]
pub struct OsTransferOptions {
    /// The name of ignore files (".gitignore" syntax) honoured in every
    /// directory of a tree; empty for none.
    pub ignore_file: OsBytes,
    /// Called with the transfer's progress; may be null. For a path
    /// transfer, only until its completion; for the stream forms
    /// (`openshell_client_upload_stream`, `openshell_client_download_stream`)
    /// also during later sends, nexts and the finish, until the stream is
    /// freed: whatever `progress_data` points to must live that long.
    pub progress: OsProgressCallback,
    /// Passed back to `progress`.
    pub progress_data: usize,
}

/// The length of a transfer summary value: seven little-endian `u64`s,
/// in this order: files, directories, symlinks, skipped symlinks, ignored
/// entries, other skipped entries, bytes.
pub const OS_TRANSFER_SUMMARY_LEN: usize = 56;

pub(crate) fn summary_bytes(s: &TransferSummary) -> Vec<u8> {
    let mut out = Vec::with_capacity(OS_TRANSFER_SUMMARY_LEN);
    for n in [
        s.files,
        s.directories,
        s.symlinks,
        s.skipped_symlinks,
        s.ignored,
        s.skipped_other,
        s.bytes,
    ] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out
}

/// The transfer options of `transfer`, bound to the call's deadline and
/// cancellation. Reads `ignore_file` now (the caller's memory is borrowed
/// for the export only).
fn transfer_options(transfer: &OsTransferOptions, call: &Call) -> Result<TransferOptions, Error> {
    let mut options = TransferOptions::new().call_options(call.options.clone());
    if let Some(name) = unsafe { transfer.ignore_file.to_opt_string("ignore file") }? {
        options = options.ignore_file(name);
    }
    if let Some(callback) = transfer.progress {
        let user_data = transfer.progress_data;
        options = options.progress(move |p: &Progress| {
            let progress = OsProgress {
                bytes_done: p.bytes_done,
                bytes_total: p.bytes_total,
                files_done: p.files_done,
                files_total: p.files_total,
                current: OsBytes::of(p.current.as_bytes()),
            };
            // A callback must not unwind into the transfer.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
                callback(user_data, &progress)
            }));
        });
    }
    Ok(options)
}

fn local_path_of(bytes: OsBytes) -> Result<PathBuf, Error> {
    let raw = unsafe { bytes.to_vec() };
    if raw.is_empty() {
        return Err(Error::invalid_config("the local path is empty"));
    }
    Ok(PathBuf::from(OsStr::from_bytes(&raw)))
}

/// What the exports of this module share: the client, the call, the
/// sandbox and remote path as strings.
struct Prepared {
    client: Client,
    call: Call,
    sandbox: Result<String, Error>,
    remote: Result<String, Error>,
}

unsafe fn prepare(
    c: &OsClient,
    options: &OsCallOptions,
    sandbox: OsBytes,
    remote: OsBytes,
) -> Prepared {
    Prepared {
        client: c.client.clone(),
        call: Call::new(c, options),
        sandbox: unsafe { sandbox.to_string("sandbox") },
        remote: unsafe { remote.to_string("remote path") },
    }
}

/// Uploads `local_path` (a file, or a directory with everything in it) to
/// `remote` in `sandbox` (relative to the sandbox's working directory, or
/// absolute inside it); into `remote` under the local name when `remote`
/// is an existing directory. The completion's `value` is the transfer
/// summary ([`OS_TRANSFER_SUMMARY_LEN`] bytes). Local paths are bytes (not
/// necessarily UTF-8).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn openshell_client_upload(
    client: *const OsClient,
    sandbox: OsBytes,
    local_path: OsBytes,
    remote: OsBytes,
    transfer: OsTransferOptions,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let p = unsafe { prepare(c, &options, sandbox, remote) };
        let local = local_path_of(local_path);
        let transfer = transfer_options(&transfer, &p.call);
        async move {
            let (sandbox, remote, local, transfer) = (p.sandbox?, p.remote?, local?, transfer?);
            let upload = p.client.upload(&sandbox, &local, &remote, &transfer);
            let summary = Call::run(&p.call.token, upload).await?;
            Ok(Outcome::Value(summary_bytes(&summary)))
        }
    })
}

/// Downloads `remote` (a file or a directory) from `sandbox` to
/// `local_path`; into `local_path` under the remote name when it is an
/// existing directory. The completion's `value` is the transfer summary.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn openshell_client_download(
    client: *const OsClient,
    sandbox: OsBytes,
    remote: OsBytes,
    local_path: OsBytes,
    transfer: OsTransferOptions,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let p = unsafe { prepare(c, &options, sandbox, remote) };
        let local = local_path_of(local_path);
        let transfer = transfer_options(&transfer, &p.call);
        async move {
            let (sandbox, remote, local, transfer) = (p.sandbox?, p.remote?, local?, transfer?);
            let download = p.client.download(&sandbox, &remote, &local, &transfer);
            let summary = Call::run(&p.call.token, download).await?;
            Ok(Outcome::Value(summary_bytes(&summary)))
        }
    })
}

/// Starts an upload of bytes the caller sends to the file `remote`: the
/// completion's `handle` is an `OsStream` (send the bytes with
/// `openshell_stream_send`, then `openshell_stream_finish`) and its `value`
/// the absolute path the file will have. The file appears (mode 0644,
/// replacing any file there) only at the finish; freeing the stream before
/// leaves nothing behind. The stream stays bound to the call's
/// cancellation; `ignore_file` does not apply.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_upload_stream(
    client: *const OsClient,
    sandbox: OsBytes,
    remote: OsBytes,
    transfer: OsTransferOptions,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    let open = |client: Client, sandbox: String, remote: String, transfer: TransferOptions| async move {
        let sink = client.upload_stream(&sandbox, &remote, &transfer).await?;
        let target = sink.target().as_bytes().to_vec();
        let sender = Sender::Upload(Box::new(tokio::sync::Mutex::new(Some(sink))));
        Ok((Receiver::None, sender, target))
    };
    unsafe {
        open_stream_transfer(
            c, sandbox, remote, &transfer, &options, callback, user_data, open,
        )
    }
}

/// Starts a download of the file `remote`: the completion's `handle` is an
/// `OsStream` whose `openshell_stream_next` gives the file's bytes in
/// chunks (at most 256 KiB each), then `OS_END`; its `value` is the file's
/// size when the download started (8 bytes, little-endian) followed by its
/// absolute path. `ignore_file` does not apply.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_download_stream(
    client: *const OsClient,
    sandbox: OsBytes,
    remote: OsBytes,
    transfer: OsTransferOptions,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    let open = |client: Client, sandbox: String, remote: String, transfer: TransferOptions| async move {
        let source = client.download_stream(&sandbox, &remote, &transfer).await?;
        let mut value = source.size().to_le_bytes().to_vec();
        value.extend_from_slice(source.source().as_bytes());
        Ok((Receiver::Download(source), Sender::None, value))
    };
    unsafe {
        open_stream_transfer(
            c, sandbox, remote, &transfer, &options, callback, user_data, open,
        )
    }
}

/// The stream forms' shared part: checks the arguments, runs `open` (the
/// stream's halves and the completion's `value`) bound to the call's
/// cancellation, and completes with the stream as `handle`. The stream
/// keeps the call's token: cancelling the call ends it.
#[allow(clippy::too_many_arguments)]
unsafe fn open_stream_transfer<F, Fut>(
    c: &OsClient,
    sandbox: OsBytes,
    remote: OsBytes,
    transfer: &OsTransferOptions,
    options: &OsCallOptions,
    callback: OsCallback,
    user_data: usize,
    open: F,
) -> i32
where
    F: FnOnce(Client, String, String, TransferOptions) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(Receiver, Sender, Vec<u8>), Error>> + Send,
{
    start(callback, user_data, || {
        let p = unsafe { prepare(c, options, sandbox, remote) };
        let transfer = transfer_options(transfer, &p.call);
        async move {
            let token = p.call.token.clone();
            let opened = async {
                let (sandbox, remote, transfer) = (p.sandbox?, p.remote?, transfer?);
                Call::run(&token, open(p.client, sandbox, remote, transfer)).await
            };
            match opened.await {
                Ok((receiver, sender, value)) => Ok(Outcome::HandleValue(
                    stream_ptr(receiver, sender, token),
                    value,
                )),
                Err(err) => {
                    token.cancel();
                    Err(err)
                }
            }
        }
    })
}

/// The whole content of the file `remote` (the completion's `value`), at
/// most 64 MiB: a larger file is `failed_precondition`, before anything is
/// read.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_read_file(
    client: *const OsClient,
    sandbox: OsBytes,
    remote: OsBytes,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let p = unsafe { prepare(c, &options, sandbox, remote) };
        async move {
            let (sandbox, remote) = (p.sandbox?, p.remote?);
            let read = p
                .client
                .read_file(&sandbox, &remote, p.call.options.clone());
            Ok(Outcome::Value(Call::run(&p.call.token, read).await?))
        }
    })
}

/// Writes `data` as the file `remote` (mode 0644), replacing any file there
/// atomically. The completion's `value` is the transfer summary.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_client_write_file(
    client: *const OsClient,
    sandbox: OsBytes,
    remote: OsBytes,
    data: OsBytes,
    options: OsCallOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { client.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let p = unsafe { prepare(c, &options, sandbox, remote) };
        let data = unsafe { data.to_vec() };
        async move {
            let (sandbox, remote) = (p.sandbox?, p.remote?);
            let write = p
                .client
                .write_file(&sandbox, &remote, &data, p.call.options.clone());
            let summary = Call::run(&p.call.token, write).await?;
            Ok(Outcome::Value(summary_bytes(&summary)))
        }
    })
}

/// Ends an upload stream: with `commit`, sends what is buffered, waits for
/// every write and renames the file into place (the completion's `value`
/// is the transfer summary, see `openshell_client_upload`); without, gives
/// it up (the temp file is removed, the target is left as it was; an empty
/// value). Either way later sends fail. On any other stream: an error.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_stream_finish(
    stream: *const OsStream,
    commit: bool,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(s) = (unsafe { stream.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let sender = s.sender.clone();
        let cancel = s.cancel.clone();
        async move {
            let finish = async {
                let Sender::Upload(sink) = &*sender else {
                    return Err(Error::invalid_config("only an upload stream finishes"));
                };
                let Some(sink) = sink.lock().await.take() else {
                    return Err(Error::invalid_config("the upload already finished"));
                };
                if commit {
                    let summary = sink.finish().await?;
                    Ok(Outcome::Value(summary_bytes(&summary)))
                } else {
                    sink.abort().await;
                    Ok(Outcome::Value(Vec::new()))
                }
            };
            Call::run(&cancel, finish).await
        }
    })
}
