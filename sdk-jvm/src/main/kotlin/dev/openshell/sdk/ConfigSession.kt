package dev.openshell.sdk

import dev.openshell.sdk.ffi.ConfigApplier
import dev.openshell.sdk.ffi.ConfigSessionStats
import dev.openshell.sdk.ffi.HostApplier
import dev.openshell.sdk.ffi.HostSessionStats
import dev.openshell.sdk.ffi.OpenShellException
import kotlinx.coroutines.NonCancellable
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.flow
import kotlinx.coroutines.withContext
import java.util.concurrent.atomic.AtomicBoolean
import kotlin.coroutines.cancellation.CancellationException
import dev.openshell.sdk.ffi.ConfigSession as NativeConfigSession
import dev.openshell.sdk.ffi.HostSession as NativeHostSession

/** Applies a sandbox's configuration; throwing (e.g. [ConfigRejected]) rejects it. */
fun interface ConfigApply {
    @Throws(Exception::class)
    fun apply(snapshot: ConfigSnapshot)
}

/** Applies an assigned sandbox's configuration; throwing rejects it. */
fun interface HostApply {
    @Throws(Exception::class)
    fun apply(
        sandboxId: String,
        snapshot: ConfigSnapshot,
    )
}

private class ForeignConfigApplier(
    private val apply: ConfigApply,
) : ConfigApplier {
    override fun apply(snapshot: dev.openshell.sdk.ffi.ConfigSnapshot) {
        try {
            apply.apply(ConfigSnapshot(snapshot))
        } catch (t: Throwable) {
            throw rejectionOf(t)
        }
    }
}

private class ForeignHostApplier(
    private val apply: HostApply,
) : HostApplier {
    override fun apply(
        sandboxId: String,
        snapshot: dev.openshell.sdk.ffi.ConfigSnapshot,
    ) {
        try {
            apply.apply(sandboxId, ConfigSnapshot(snapshot))
        } catch (t: Throwable) {
            throw rejectionOf(t)
        }
    }
}

/**
 * What [ConfigSession] and [HostSession] do with their native session:
 * [run] runs it, and a cancelled coroutine stops the run and waits
 * (without being cancellable) until it returned, so no apply call outlives
 * it; [close] shuts the session down and frees it, once.
 */
internal class NativeRun(
    private val runNative: suspend () -> Unit,
    private val stopNative: () -> Unit,
    private val waitStopped: suspend () -> Unit,
    private val shutdown: () -> Unit,
    private val free: () -> Unit,
) : AutoCloseable {
    private val closed = AtomicBoolean(false)

    suspend fun run() {
        try {
            runNative()
        } catch (e: CancellationException) {
            stopNative()
            withContext(NonCancellable) { waitStopped() }
            throw e
        }
    }

    override fun close() {
        if (closed.compareAndSet(false, true)) {
            shutdown()
            free()
        }
    }
}

/**
 * A pushed or polled configuration waiting for its answer: [ack] once it
 * is in force, or [reject]. The next update waits until this one is
 * answered, so answer every one.
 */
class ConfigUpdate internal constructor(
    private val session: NativeConfigSession,
    /** The update's id within this session. */
    val id: Long,
    val snapshot: ConfigSnapshot,
) {
    private val answered = AtomicBoolean(false)

    /** How it arrived. */
    val mode: DeliveryMode? get() = snapshot.mode

    /** Answers *applied*. False when already answered or the run stopped meanwhile (then it was rejected). */
    fun ack(): Boolean = answered.compareAndSet(false, true) && session.ack(id.toULong())

    /** Answers *rejected* (the reason is scrubbed and bounded; never put configuration values in it). */
    fun reject(reason: String): Boolean = answered.compareAndSet(false, true) && session.reject(id.toULong(), reason)

    val isAnswered: Boolean get() = answered.get()

    override fun toString(): String = "ConfigUpdate(id=$id, $snapshot)"
}

/**
 * The supervisor side of one sandbox's session (`ConnectSupervisor`),
 * authenticated with the sandbox's own token: the core's protocol (startup
 * poll, hello, bootstrap, pushed updates answered in order, heartbeats,
 * redirects, reconnects, polling when the gateway does not push).
 *
 * Snapshots are answered either by the [ConfigApply] given to [create]
 * (called on a native blocking thread, one at a time, only for a snapshot
 * that differs from the last applied one), or, for a session made by
 * [withUpdates], by collecting [updates] and answering each
 * [ConfigUpdate]. [run] holds the session; [close] ends it.
 */
class ConfigSession private constructor(
    internal val native: NativeConfigSession,
    private val answersUpdates: Boolean,
) : AutoCloseable {
    private val control = NativeRun(native::run, native::stop, native::waitStopped, native::shutdown, native::close)

    /** The instance id every hello carries. */
    val instanceId: String = native.instanceId()

    /**
     * Holds the session until [stop], [close] or this coroutine's
     * cancellation; returns once an apply call in flight returned. A second
     * run while one is under way throws [OpenShellException.FailedPrecondition]
     * at once (the first goes on); afterwards the session may run again.
     * Throws only for an unusable endpoint (`InvalidConfig`, `Tls`).
     */
    suspend fun run() = control.run()

    /** Stops the current run (it returns once an apply in flight returned). */
    fun stop() = native.stop()

    /** The session's counters. */
    fun stats(): ConfigSessionStats = native.stats()

    /**
     * The updates to answer, for a session made by [withUpdates]; the flow
     * ends when the session is closed. Collect it once at a time.
     */
    val updates: Flow<ConfigUpdate>
        get() {
            check(answersUpdates) { "this session answers through its ConfigApply; use withUpdates for updates" }
            return flow {
                while (true) {
                    val next = native.nextUpdate() ?: break
                    emit(ConfigUpdate(native, next.id.toLong(), ConfigSnapshot(next.snapshot)))
                }
            }
        }

    /** The next update to answer, or `null` once closed ([withUpdates] sessions). */
    suspend fun nextUpdate(): ConfigUpdate? {
        check(answersUpdates) { "this session answers through its ConfigApply; use withUpdates for updates" }
        val next = native.nextUpdate() ?: return null
        return ConfigUpdate(native, next.id.toLong(), ConfigSnapshot(next.snapshot))
    }

    /** Ends any run for good, rejects unanswered updates and frees the session. Idempotent. */
    override fun close() = control.close()

    override fun toString(): String = "ConfigSession(instanceId=$instanceId)"

    companion object {
        init {
            NativeThreads.install()
        }

        /** A session of sandbox [sandboxId] answering through [apply]. Nothing connects before [run]. */
        @JvmStatic
        fun create(
            config: SessionConfig,
            sandboxId: String,
            apply: ConfigApply,
        ): ConfigSession = ConfigSession(NativeConfigSession(config.options(), sandboxId, ForeignConfigApplier(apply)), false)

        /** A session of sandbox [sandboxId] whose snapshots are answered through [updates]. */
        @JvmStatic
        fun withUpdates(
            config: SessionConfig,
            sandboxId: String,
        ): ConfigSession = ConfigSession(NativeConfigSession(config.options(), sandboxId, null), true)
    }
}

/**
 * A shared supervisor host's session (`ConnectHost`), authenticated with
 * the host's token: it carries the session of every sandbox the gateway
 * assigns to the host and serves each one's configuration through one
 * [HostApply] (called on a native blocking thread, one call at a time per
 * sandbox; calls for different sandboxes may overlap). [run] as for
 * [ConfigSession]. [SessionConfig.pollInterval] does not apply.
 */
class HostSession private constructor(
    internal val native: NativeHostSession,
) : AutoCloseable {
    private val control = NativeRun(native::run, native::stop, native::waitStopped, native::shutdown, native::close)

    /** The host's member id (the id its token was issued for). */
    val memberId: String = native.memberId()

    val instanceId: String = native.instanceId()

    /** Holds the host session and serves its sandboxes; see [ConfigSession.run]. */
    suspend fun run() = control.run()

    fun stop() = native.stop()

    fun stats(): HostSessionStats = native.stats()

    override fun close() = control.close()

    override fun toString(): String = "HostSession(memberId=$memberId, instanceId=$instanceId)"

    companion object {
        init {
            NativeThreads.install()
        }

        /** The session of host [memberId] (its token in [config]); [capacity] 0: no limit. */
        @JvmStatic
        @JvmOverloads
        fun create(
            config: SessionConfig,
            memberId: String,
            apply: HostApply,
            capacity: Int = 0,
        ): HostSession {
            require(capacity >= 0) { "capacity must not be negative" }
            return HostSession(NativeHostSession(config.options(), memberId, capacity.toUInt(), ForeignHostApplier(apply)))
        }
    }
}
