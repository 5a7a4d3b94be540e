package dev.openshell.sdk

import dev.openshell.sdk.ffi.ExecEvent
import dev.openshell.sdk.ffi.ExecOutput
import dev.openshell.sdk.ffi.HealthInfo
import dev.openshell.sdk.ffi.RoutingStats
import dev.openshell.sdk.ffi.SandboxInfo
import dev.openshell.sdk.ffi.SandboxWithOwner
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.SupervisorJob
import kotlinx.coroutines.cancel
import kotlinx.coroutines.future.future
import java.util.concurrent.CompletableFuture
import kotlin.time.Duration
import kotlin.time.toKotlinDuration

private fun java.time.Duration?.kotlin(): Duration? = this?.toKotlinDuration()

/**
 * The Java face of [OpenShellClient]: every call returns a
 * [CompletableFuture]; `future.cancel(true)` cancels the call (the Rust
 * future is dropped and the RPC reset). A failed future's cause is an
 * [dev.openshell.sdk.ffi.OpenShellException] subclass. [close] cancels every
 * call in flight and frees the client.
 */
class OpenShellAsyncClient private constructor(
    /** The Kotlin client underneath. */
    val client: OpenShellClient,
) : AutoCloseable {
    private val scope = CoroutineScope(SupervisorJob() + Dispatchers.Default)

    val endpoint: String get() = client.endpoint

    @JvmOverloads
    fun health(timeout: java.time.Duration? = null): CompletableFuture<HealthInfo> = scope.future { client.health(timeout.kotlin()) }

    @JvmOverloads
    fun createSandbox(
        spec: SandboxSpec,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<SandboxInfo> = scope.future { client.sandboxes.create(spec, timeout.kotlin()) }

    @JvmOverloads
    fun getSandbox(
        name: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<SandboxInfo> = scope.future { client.sandboxes.get(name, timeout.kotlin()) }

    @JvmOverloads
    fun getSandboxWithOwner(
        name: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<SandboxWithOwner> = scope.future { client.sandboxes.getWithOwner(name, timeout.kotlin()) }

    @JvmOverloads
    fun listSandboxes(
        labelSelector: String? = null,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<List<SandboxInfo>> = scope.future { client.sandboxes.list(labelSelector, timeout.kotlin()) }

    @JvmOverloads
    fun deleteSandbox(
        name: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<String> = scope.future { client.sandboxes.delete(name, timeout.kotlin()) }

    @JvmOverloads
    fun waitReady(
        name: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<SandboxInfo> = scope.future { client.sandboxes.waitReady(name, timeout.kotlin()) }

    @JvmOverloads
    fun waitDeleted(
        name: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<Void?> =
        scope.future {
            client.sandboxes.waitDeleted(name, timeout.kotlin())
            null
        }

    @JvmOverloads
    fun exec(
        spec: ExecSpec,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<ExecOutput> = scope.future { client.exec(spec, timeout.kotlin()) }

    fun exec(
        sandbox: String,
        command: List<String>,
    ): CompletableFuture<ExecOutput> = exec(ExecSpec(sandbox, command))

    /** Starts a command whose events are pulled with [AsyncExecProcess.next]. */
    @JvmOverloads
    fun execInteractive(
        spec: ExecSpec,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<AsyncExecProcess> =
        scope.future {
            AsyncExecProcess(client.native.execInteractive(spec.request(), timeout.kotlin().millis()), scope)
        }

    /** Sets a string setting of sandbox [sandbox] (`null`: the global scope); see [setSetting]. */
    @JvmOverloads
    fun setSetting(
        sandbox: String?,
        key: String,
        value: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<dev.openshell.sdk.ffi.SettingWrite> = scope.future { client.setSetting(sandbox, key, value, timeout.kotlin()) }

    @JvmOverloads
    fun deleteSetting(
        sandbox: String?,
        key: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<dev.openshell.sdk.ffi.SettingWrite> = scope.future { client.deleteSetting(sandbox, key, timeout.kotlin()) }

    // Forward, files, logs and SSH sessions (Forward.kt, Files.kt, Logs.kt, Ssh.kt).

    /** Forwards connections to a local listener to [remotePort] in the sandbox; close the [Forward] to stop. */
    @JvmOverloads
    fun forward(
        sandbox: String,
        remotePort: Int,
        localAddress: String = "127.0.0.1:0",
        sshSessionToken: String? = null,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<Forward> = scope.future { client.forward(sandbox, remotePort, localAddress, sshSessionToken, timeout.kotlin()) }

    /** Forwards to the sandbox's SSH server. */
    @JvmOverloads
    fun forwardSsh(
        sandbox: String,
        localAddress: String = "127.0.0.1:0",
        sshSessionToken: String? = null,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<Forward> = scope.future { client.forwardSsh(sandbox, localAddress, sshSessionToken, timeout.kotlin()) }

    @JvmOverloads
    fun writeFile(
        sandbox: String,
        remote: String,
        data: ByteArray,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<dev.openshell.sdk.ffi.TransferSummary> = scope.future { client.writeFile(sandbox, remote, data, timeout.kotlin()) }

    @JvmOverloads
    fun readFile(
        sandbox: String,
        remote: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<ByteArray> = scope.future { client.readFile(sandbox, remote, timeout.kotlin()) }

    @JvmOverloads
    fun upload(
        sandbox: String,
        local: java.nio.file.Path,
        remote: String,
        ignoreFile: String? = null,
        progress: java.util.function.Consumer<dev.openshell.sdk.ffi.TransferProgressInfo>? = null,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<dev.openshell.sdk.ffi.TransferSummary> =
        scope.future { client.upload(sandbox, local, remote, ignoreFile, progress?.let { p -> { p.accept(it) } }, timeout.kotlin()) }

    @JvmOverloads
    fun download(
        sandbox: String,
        remote: String,
        local: java.nio.file.Path,
        ignoreFile: String? = null,
        progress: java.util.function.Consumer<dev.openshell.sdk.ffi.TransferProgressInfo>? = null,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<dev.openshell.sdk.ffi.TransferSummary> =
        scope.future { client.download(sandbox, remote, local, ignoreFile, progress?.let { p -> { p.accept(it) } }, timeout.kotlin()) }

    @JvmOverloads
    fun logs(
        name: String,
        filter: LogFilter = LogFilter(),
        timeout: java.time.Duration? = null,
    ): CompletableFuture<SandboxLogs> = scope.future { client.sandboxes.logs(name, filter, timeout.kotlin()) }

    /** Opens a watch of the sandbox, pulled with [AsyncSandboxWatch.next]. */
    @JvmOverloads
    fun watch(
        name: String,
        spec: WatchSpec = WatchSpec(),
        timeout: java.time.Duration? = null,
    ): CompletableFuture<AsyncSandboxWatch> =
        scope.future {
            AsyncSandboxWatch(client.sandboxes.openWatch(name, spec, timeout.kotlin()), scope)
        }

    @JvmOverloads
    fun createSshSession(
        sandbox: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<SshSession> = scope.future { client.createSshSession(sandbox, timeout.kotlin()) }

    @JvmOverloads
    fun revokeSshSession(
        token: String,
        timeout: java.time.Duration? = null,
    ): CompletableFuture<Boolean> = scope.future { client.revokeSshSession(token, timeout.kotlin()) }

    fun routingStats(): RoutingStats = client.routingStats()

    override fun close() {
        scope.cancel()
        client.close()
    }

    companion object {
        @JvmStatic
        fun connect(config: ClientConfig): CompletableFuture<OpenShellAsyncClient> =
            CoroutineScope(Dispatchers.Default).future { OpenShellAsyncClient(OpenShellClient.connect(config)) }
    }
}

/** A running command for Java: stdin and pulled events. */
class AsyncExecProcess internal constructor(
    native: dev.openshell.sdk.ffi.ExecSession,
    private val scope: CoroutineScope,
) : AutoCloseable {
    private val session = OwnedSession(native)

    /** The next event, or `null` after the exit event. */
    fun next(): CompletableFuture<ExecEvent?> = scope.future { session.next() }

    fun write(data: ByteArray): CompletableFuture<Void?> =
        scope.future {
            session.write(data)
            null
        }

    /** Resizes the terminal of a `tty` exec. */
    fun resize(
        cols: Int,
        rows: Int,
    ): CompletableFuture<Void?> =
        scope.future {
            session.resize(cols, rows)
            null
        }

    fun closeStdin() = session.closeStdin()

    /** Ends the command and frees the handle. Idempotent. */
    override fun close() = session.close()
}
