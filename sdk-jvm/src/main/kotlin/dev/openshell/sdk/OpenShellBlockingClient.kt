package dev.openshell.sdk

import dev.openshell.sdk.DirectCalls.Args
import dev.openshell.sdk.DirectCalls.Method
import dev.openshell.sdk.ffi.CreateSandboxRequest
import dev.openshell.sdk.ffi.ExecOutput
import dev.openshell.sdk.ffi.ExecRequest
import dev.openshell.sdk.ffi.FfiConverterOptionalString
import dev.openshell.sdk.ffi.FfiConverterSequenceTypeSandboxInfo
import dev.openshell.sdk.ffi.FfiConverterString
import dev.openshell.sdk.ffi.FfiConverterTypeCreateSandboxRequest
import dev.openshell.sdk.ffi.FfiConverterTypeExecOutput
import dev.openshell.sdk.ffi.FfiConverterTypeExecRequest
import dev.openshell.sdk.ffi.FfiConverterTypeHealthInfo
import dev.openshell.sdk.ffi.FfiConverterTypeSandboxInfo
import dev.openshell.sdk.ffi.FfiConverterTypeSandboxWithOwner
import dev.openshell.sdk.ffi.HealthInfo
import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.ffi.RoutingStats
import dev.openshell.sdk.ffi.SandboxInfo
import dev.openshell.sdk.ffi.SandboxWithOwner
import kotlinx.coroutines.runBlocking
import kotlin.time.toKotlinDuration

private fun java.time.Duration?.ms(): ULong? = this?.toKotlinDuration().millis()

private fun String.args() = Args.of(this, FfiConverterString)

private fun String?.selectorArgs() = Args.of(this, FfiConverterOptionalString)

private fun CreateSandboxRequest.args() = Args.of(this, FfiConverterTypeCreateSandboxRequest)

private fun ExecRequest.args() = Args.of(this, FfiConverterTypeExecRequest)

/**
 * The blocking face of [OpenShellClient], for code that waits on its own
 * thread (as with grpc-java's blocking stubs): each call returns its answer
 * or throws its [OpenShellException] (declared, so Java can catch each
 * subclass) on the calling thread. It is the lowest-latency way to make a
 * lone unary call: no coroutine hand-off, and the call enters the Rust core
 * through plain native functions (the call, then freeing its answer) instead
 * of uniffi's generated call path, whose JNA structures cost about 10 us
 * each; arguments and answers keep uniffi's types and serialization.
 *
 * Owner routing, hints, the unrouted retry and token refresh are the same
 * core's. A call ends at its deadline (the `timeout` argument, or the
 * config's default), when [close] is called from another thread, or when
 * the calling thread is interrupted (`Future.cancel(true)`, an executor's
 * `shutdownNow`): then it throws `Cancelled`, its RPC is reset (an exec's
 * process killed) and the thread keeps its interrupt flag; a thread already
 * interrupted sends nothing. Do not call it from a
 * coroutine (it blocks the thread) or from a callback the core makes (a
 * config apply callback, a token source): use the suspend API there.
 *
 * Streams, forwards, files and sessions stay on [client] (the Kotlin API)
 * or [OpenShellAsyncClient]. Thread-safe; share one per process.
 */
class OpenShellBlockingClient(
    /** The Kotlin client underneath (closed with this one). */
    val client: OpenShellClient,
) : AutoCloseable {
    private val direct get() = client.direct

    val endpoint: String get() = client.endpoint

    @JvmOverloads
    @Throws(OpenShellException::class)
    fun health(timeout: java.time.Duration? = null): HealthInfo =
        direct.call(Method.HEALTH, Args.NONE, timeout.ms(), FfiConverterTypeHealthInfo::read)

    @JvmOverloads
    @Throws(OpenShellException::class)
    fun createSandbox(
        spec: SandboxSpec,
        timeout: java.time.Duration? = null,
    ): SandboxInfo = direct.call(Method.CREATE_SANDBOX, spec.request().args(), timeout.ms(), FfiConverterTypeSandboxInfo::read)

    @JvmOverloads
    @Throws(OpenShellException::class)
    fun getSandbox(
        name: String,
        timeout: java.time.Duration? = null,
    ): SandboxInfo = direct.call(Method.GET_SANDBOX, name.args(), timeout.ms(), FfiConverterTypeSandboxInfo::read)

    /** The sandbox and the replica holding it (refreshes the owner cache). */
    @JvmOverloads
    @Throws(OpenShellException::class)
    fun getSandboxWithOwner(
        name: String,
        timeout: java.time.Duration? = null,
    ): SandboxWithOwner = direct.call(Method.GET_SANDBOX_WITH_OWNER, name.args(), timeout.ms(), FfiConverterTypeSandboxWithOwner::read)

    @JvmOverloads
    @Throws(OpenShellException::class)
    fun listSandboxes(
        labelSelector: String? = null,
        timeout: java.time.Duration? = null,
    ): List<SandboxInfo> =
        direct.call(Method.LIST_SANDBOXES, labelSelector.selectorArgs(), timeout.ms(), FfiConverterSequenceTypeSandboxInfo::read)

    /** Deletes a sandbox; the outcome (`COMPLETED`, `ACCEPTED` or `ALREADY_ABSENT`). */
    @JvmOverloads
    @Throws(OpenShellException::class)
    fun deleteSandbox(
        name: String,
        timeout: java.time.Duration? = null,
    ): String = direct.call(Method.DELETE_SANDBOX, name.args(), timeout.ms(), FfiConverterString::read)

    /** Waits until READY (`FailedPrecondition` when it failed to start). */
    @JvmOverloads
    @Throws(OpenShellException::class)
    fun waitReady(
        name: String,
        timeout: java.time.Duration? = null,
    ): SandboxInfo = direct.call(Method.WAIT_READY, name.args(), timeout.ms(), FfiConverterTypeSandboxInfo::read)

    @JvmOverloads
    @Throws(OpenShellException::class)
    fun waitDeleted(
        name: String,
        timeout: java.time.Duration? = null,
    ) = direct.call(Method.WAIT_DELETED, name.args(), timeout.ms()) {}

    /** Runs a command and collects its output (under the output cap); run once, never retried. */
    @JvmOverloads
    @Throws(OpenShellException::class)
    fun exec(
        spec: ExecSpec,
        timeout: java.time.Duration? = null,
    ): ExecOutput = direct.call(Method.EXEC, spec.request().args(), timeout.ms(), FfiConverterTypeExecOutput::read)

    @Throws(OpenShellException::class)
    fun exec(
        sandbox: String,
        command: List<String>,
    ): ExecOutput = exec(ExecSpec(sandbox, command))

    fun routingStats(): RoutingStats = client.routingStats()

    /**
     * Cancels every call of the client (blocked ones end with `Cancelled`)
     * and frees it. Idempotent; a call made after it throws
     * [IllegalStateException].
     */
    override fun close() = client.close()

    companion object {
        /** Connects on the calling thread (fails with `Connect` or `Tls` when the gateway cannot be reached). */
        @JvmStatic
        @Throws(OpenShellException::class)
        fun connect(config: ClientConfig): OpenShellBlockingClient =
            OpenShellBlockingClient(runBlocking { OpenShellClient.connect(config) })
    }
}
