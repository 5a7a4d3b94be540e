package dev.openshell.sdk

import dev.openshell.sdk.ffi.ForwardHandle
import dev.openshell.sdk.ffi.ForwardStats
import dev.openshell.sdk.ffi.ForwardTarget
import java.util.concurrent.atomic.AtomicBoolean
import kotlin.time.Duration

/**
 * A running forward: a local TCP listener whose every connection is pumped,
 * by the Rust core, to a port (or the SSH server) inside a sandbox.
 *
 * [close] stops it: the listener closes, so new connections are refused,
 * and active ones end. [close] returns at once; [awaitClosed] returns once
 * the listener is closed and every connection has ended. Closing the client
 * closes its forwards too.
 */
class Forward internal constructor(
    private val handle: ForwardHandle,
) : AutoCloseable {
    private val closed = AtomicBoolean(false)

    /** The local listener's address, `host:port`. */
    val localAddress: String = handle.localAddress()

    /** The local listener's port. */
    val localPort: Int = handle.localPort().toInt()

    /** The sandbox this forward reaches. */
    val sandbox: String = handle.sandbox()

    /** The port inside the sandbox (0 for the SSH server). */
    val remotePort: Int = handle.remotePort().toInt()

    /** The counters now (accepted, active and failed connections, bytes each way). */
    fun stats(): ForwardStats = handle.stats()

    /** Whether it was closed (by [close], a timeout or the client's close). */
    val isClosed: Boolean get() = closed.get() || handle.isClosed()

    /**
     * Suspends until the forward has stopped: the listener is closed and
     * every connection ended. Returns only after a close (or timeout); after
     * [close] it still waits for the listener, which the core closes
     * asynchronously.
     */
    suspend fun awaitClosed() {
        handle.waitClosed()
    }

    /**
     * Stops the forward. Idempotent, and returns at once: use [awaitClosed]
     * to know that the port refuses connections. The native handle stays
     * readable ([stats], [awaitClosed]) and is freed with this object.
     */
    override fun close() {
        if (closed.compareAndSet(false, true)) handle.shutdown()
    }

    override fun toString(): String = "Forward($localAddress -> $sandbox:$remotePort${if (isClosed) ", closed" else ""})"
}

/**
 * Listens on [localAddress] and forwards every connection to [remotePort]
 * on the sandbox's own loopback.
 *
 * Without [sshSessionToken] the sandbox is looked up first (learning its
 * owner for routing), so a missing one fails here with
 * `OpenShellException.NotFound`; a port outside 1..65535 is `InvalidConfig`.
 * With a token ([SshSession.token]) every connection's stream carries it:
 * a client without a user token may forward to that token's sandbox; a
 * refused connection is closed and counted in [ForwardStats.connectionsFailed].
 * [timeout], when set, closes the forward once it passes.
 */
suspend fun OpenShellClient.forward(
    sandbox: String,
    remotePort: Int,
    localAddress: String = "127.0.0.1:0",
    sshSessionToken: String? = null,
    timeout: Duration? = null,
): Forward {
    // Out of range goes down as 0, which the core refuses (`invalid_config`).
    val target = ForwardTarget.Tcp((if (remotePort in 1..65535) remotePort else 0).toUShort())
    return Forward(native.forward(sandbox, target, localAddress, sshSessionToken, timeout.millis()))
}

/** Like [forward], to the sandbox's embedded SSH server (an ssh client connects to [Forward.localAddress]). */
suspend fun OpenShellClient.forwardSsh(
    sandbox: String,
    localAddress: String = "127.0.0.1:0",
    sshSessionToken: String? = null,
    timeout: Duration? = null,
): Forward = Forward(native.forward(sandbox, ForwardTarget.Ssh, localAddress, sshSessionToken, timeout.millis()))
