package dev.openshell.sdk

import dev.openshell.sdk.ffi.TransferProgress
import dev.openshell.sdk.ffi.TransferProgressInfo
import dev.openshell.sdk.ffi.TransferSummary
import java.nio.file.Path
import kotlin.time.Duration

// File transfer over the sandbox's SFTP server. Remote paths are relative to
// the sandbox's working directory (absolute ones must lie inside it). A file
// appears only once complete (written to a temporary name, renamed over the
// target). Failures name the path: NotFound, FailedPrecondition (a directory
// where a file is expected, or read_file past 64 MiB), PermissionDenied,
// ResourceExhausted, InvalidArgument.

/** Writes [data] as the file [remote] (mode 0644), replacing any file there atomically. */
suspend fun OpenShellClient.writeFile(
    sandbox: String,
    remote: String,
    data: ByteArray,
    timeout: Duration? = null,
): TransferSummary = native.writeFile(sandbox, remote, data, timeout.millis())

/** Writes [text] as UTF-8. */
suspend fun OpenShellClient.writeFile(
    sandbox: String,
    remote: String,
    text: String,
    timeout: Duration? = null,
): TransferSummary = writeFile(sandbox, remote, text.toByteArray(Charsets.UTF_8), timeout)

/** The whole file [remote] (at most 64 MiB, else `FailedPrecondition`: use [download]). */
suspend fun OpenShellClient.readFile(
    sandbox: String,
    remote: String,
    timeout: Duration? = null,
): ByteArray = native.readFile(sandbox, remote, timeout.millis())

/**
 * Uploads [local] (a file, or a directory with everything in it, keeping
 * modes and mtimes) to [remote]; into it, under the local name, when
 * [remote] is an existing directory. [ignoreFile] names ignore files
 * (".gitignore" syntax) honoured at every level; [progress] is called at
 * most every 100 ms and once at the end, on a core thread: keep it quick.
 */
suspend fun OpenShellClient.upload(
    sandbox: String,
    local: Path,
    remote: String,
    ignoreFile: String? = null,
    progress: ((TransferProgressInfo) -> Unit)? = null,
    timeout: Duration? = null,
): TransferSummary = native.upload(sandbox, local.toString(), remote, ignoreFile, progress?.let(::ProgressListener), timeout.millis())

/** Downloads [remote] (a file or a directory) to [local]; into it when [local] is an existing directory. */
suspend fun OpenShellClient.download(
    sandbox: String,
    remote: String,
    local: Path,
    ignoreFile: String? = null,
    progress: ((TransferProgressInfo) -> Unit)? = null,
    timeout: Duration? = null,
): TransferSummary = native.download(sandbox, remote, local.toString(), ignoreFile, progress?.let(::ProgressListener), timeout.millis())

/** A Kotlin function as the core's progress listener; an exception it throws is dropped. */
internal class ProgressListener(
    private val each: (TransferProgressInfo) -> Unit,
) : TransferProgress {
    override fun progress(progress: TransferProgressInfo) {
        runCatching { each(progress) }
    }
}
