package dev.openshell.sdk

import dev.openshell.sdk.ffi.ExecEvent
import dev.openshell.sdk.ffi.ExecOutput
import dev.openshell.sdk.ffi.ExecSession
import dev.openshell.sdk.ffi.HealthInfo
import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.ffi.RoutingStats
import dev.openshell.sdk.ffi.SandboxInfo
import dev.openshell.sdk.ffi.SandboxWithOwner
import dev.openshell.sdk.ffi.connect
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.flow
import java.util.concurrent.atomic.AtomicBoolean
import kotlin.time.Duration
import dev.openshell.sdk.ffi.OpenShellClient as NativeClient

/** Milliseconds for the native layer: `null` is the client's default, `ZERO` none. */
internal fun Duration?.millis(): ULong? = this?.inWholeMilliseconds?.coerceAtLeast(0)?.toULong()

/** stdout as UTF-8 text. */
val ExecOutput.stdoutText: String get() = stdout.toString(Charsets.UTF_8)

/** stderr as UTF-8 text. */
val ExecOutput.stderrText: String get() = stderr.toString(Charsets.UTF_8)

/**
 * An OpenShell client: suspend functions over the Rust core (`bindings/uniffi`).
 *
 * Cancelling the coroutine of a call cancels the call itself: the Rust
 * future is dropped and the RPC reset (for exec, the gateway kills the
 * command). [close] cancels every call of the client and frees it.
 * Failures are [dev.openshell.sdk.ffi.OpenShellException]s, one subclass
 * per code (`NotFound`, `Unavailable`, ...), each with `code`, `detail`,
 * `grpcStatus`, `retryable` and `servedBy`.
 */
class OpenShellClient private constructor(
    internal val native: NativeClient,
) : AutoCloseable {
    /** Sandbox lifecycle. */
    val sandboxes: Sandboxes = Sandboxes(native)

    /** The endpoint this client calls. */
    val endpoint: String get() = native.endpoint()

    suspend fun health(timeout: Duration? = null): HealthInfo = native.health(timeout.millis())

    /** Runs a command and collects its output (under the output cap). */
    suspend fun exec(
        spec: ExecSpec,
        timeout: Duration? = null,
    ): ExecOutput = native.exec(spec.request(), timeout.millis())

    suspend fun exec(
        sandbox: String,
        command: List<String>,
        stdin: ByteArray? = null,
        environment: Map<String, String> = emptyMap(),
        workdir: String? = null,
        timeout: Duration? = null,
    ): ExecOutput = exec(ExecSpec(sandbox, command, workdir, environment, stdin), timeout)

    /**
     * The events of a command, as it runs; [ExecEvent.Exit] is the last.
     * Cold: each collection starts the command; a collector that stops early
     * (or is cancelled) ends it.
     */
    fun execStream(
        spec: ExecSpec,
        timeout: Duration? = null,
    ): Flow<ExecEvent> =
        flow {
            OwnedSession(native.execStream(spec.request(), timeout.millis())).drain { emit(it) }
        }

    fun execStream(
        sandbox: String,
        command: List<String>,
        environment: Map<String, String> = emptyMap(),
    ): Flow<ExecEvent> = execStream(ExecSpec(sandbox, command, environment = environment))

    /** Starts a command whose stdin stays open; close the [ExecProcess] to end it. */
    suspend fun execInteractive(
        spec: ExecSpec,
        timeout: Duration? = null,
    ): ExecProcess = ExecProcess(native.execInteractive(spec.request(), timeout.millis()))

    suspend fun execInteractive(
        sandbox: String,
        command: List<String>,
        environment: Map<String, String> = emptyMap(),
    ): ExecProcess = execInteractive(ExecSpec(sandbox, command, environment = environment))

    /** The client's owner-routing counters. */
    fun routingStats(): RoutingStats = native.routingStats()

    private val directMade = lazy { DirectCalls(native) }

    /** The calls of [OpenShellBlockingClient] (made on its first call). */
    internal val direct: DirectCalls by directMade

    /** Cancels every call of this client and frees it. Idempotent. */
    override fun close() {
        native.cancelAll()
        if (directMade.isInitialized()) direct.close()
        native.close()
    }

    companion object {
        init {
            NativeThreads.install()
        }

        /** Connects (fails with `connect` or `tls` when the gateway cannot be reached). */
        suspend fun connect(config: ClientConfig): OpenShellClient = OpenShellClient(connect(config.options(), config.tokenSource))

        /** Connects to `endpoint`; `configure` sets the rest. */
        suspend fun connect(
            endpoint: String,
            configure: ClientConfig.Builder.() -> Unit = {},
        ): OpenShellClient = connect(ClientConfig.builder(endpoint).apply(configure).build())

        /** Connects as [ClientConfig.fromEnv] says. */
        suspend fun fromEnv(configure: ClientConfig.Builder.() -> Unit = {}): OpenShellClient =
            connect(ClientConfig.fromEnv().apply(configure).build())
    }
}

/** Sandbox lifecycle: create, get, list, delete, wait. */
class Sandboxes internal constructor(
    internal val native: NativeClient,
) {
    suspend fun create(
        spec: SandboxSpec,
        timeout: Duration? = null,
    ): SandboxInfo = native.createSandbox(spec.request(), timeout.millis())

    suspend fun create(
        name: String? = null,
        image: String? = null,
        environment: Map<String, String> = emptyMap(),
        labels: Map<String, String> = emptyMap(),
    ): SandboxInfo = create(SandboxSpec(name, image, environment, labels))

    suspend fun get(
        name: String,
        timeout: Duration? = null,
    ): SandboxInfo = native.getSandbox(name, timeout.millis())

    /** The sandbox and the replica holding it (refreshes the owner cache). */
    suspend fun getWithOwner(
        name: String,
        timeout: Duration? = null,
    ): SandboxWithOwner = native.getSandboxWithOwner(name, timeout.millis())

    suspend fun list(
        labelSelector: String? = null,
        timeout: Duration? = null,
    ): List<SandboxInfo> = native.listSandboxes(labelSelector, timeout.millis())

    /** Deletes a sandbox; the outcome (`COMPLETED`, `ACCEPTED` or `ALREADY_ABSENT`). */
    suspend fun delete(
        name: String,
        timeout: Duration? = null,
    ): String = native.deleteSandbox(name, timeout.millis())

    /** Waits until READY (`FailedPrecondition` when it failed to start). */
    suspend fun waitReady(
        name: String,
        timeout: Duration? = null,
    ): SandboxInfo = native.waitReady(name, timeout.millis())

    suspend fun waitDeleted(
        name: String,
        timeout: Duration? = null,
    ) = native.waitDeleted(name, timeout.millis())
}

/**
 * An exec session that is ended and freed once: by [close] or when its
 * events have been drained (or their collector stopped).
 */
internal class OwnedSession(
    private val session: ExecSession,
) : AutoCloseable {
    private val closed = AtomicBoolean(false)

    /** Pulls every event, then ends and frees the session however this returns. */
    suspend fun drain(each: suspend (ExecEvent) -> Unit) {
        try {
            while (true) {
                val event = open().next() ?: break
                each(event)
            }
        } finally {
            close()
        }
    }

    suspend fun write(data: ByteArray) = open().write(data)

    suspend fun resize(
        cols: Int,
        rows: Int,
    ) = open().resize(cols.toUInt(), rows.toUInt())

    fun closeStdin() = open().closeStdin()

    suspend fun next(): ExecEvent? = open().next()

    /** The session, or `Cancelled` once closed (not a destroyed-object error). */
    private fun open(): ExecSession {
        if (closed.get()) {
            throw OpenShellException.Cancelled("cancelled", "the exec was closed", 1, false, null)
        }
        return session
    }

    override fun close() {
        if (closed.compareAndSet(false, true)) {
            session.cancel()
            session.close()
        }
    }
}

/** A running interactive command: stdin, and its events as a [Flow]. */
class ExecProcess internal constructor(
    native: ExecSession,
) : AutoCloseable {
    private val session = OwnedSession(native)

    /** Writes to the command's stdin. */
    suspend fun write(data: ByteArray) = session.write(data)

    suspend fun write(text: String) = session.write(text.toByteArray(Charsets.UTF_8))

    /** Resizes the terminal of a `tty` exec (the program gets SIGWINCH); not after [closeStdin]. */
    suspend fun resize(
        cols: Int,
        rows: Int,
    ) = session.resize(cols, rows)

    /** Closes stdin: the command reads EOF. Idempotent. */
    fun closeStdin() = session.closeStdin()

    /** The events, once; [ExecEvent.Exit] is the last. Stopping early ends the command. */
    val events: Flow<ExecEvent> = flow { session.drain { emit(it) } }

    /** Ends the command (the gateway kills it) and frees the handle. Idempotent. */
    override fun close() = session.close()
}
