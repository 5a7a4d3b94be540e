package dev.openshell.sdk

import dev.openshell.sdk.ffi.ConfigSessionStats
import dev.openshell.sdk.ffi.HostSessionStats
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.SupervisorJob
import kotlinx.coroutines.cancel
import kotlinx.coroutines.future.future
import java.util.concurrent.CompletableFuture

/**
 * The futures of a session's Java face, on their own scope: [close] closes
 * the session and cancels what is still running.
 */
internal class SessionFutures(
    private val session: AutoCloseable,
) : AutoCloseable {
    private val scope = CoroutineScope(SupervisorJob() + Dispatchers.Default)

    /** A future that completes when [block] (a session's run) returned; `cancel(true)` cancels it. */
    fun run(block: suspend () -> Unit): CompletableFuture<Void?> =
        scope.future {
            block()
            null
        }

    fun <T> future(block: suspend () -> T): CompletableFuture<T> = scope.future { block() }

    override fun close() {
        session.close()
        scope.cancel()
    }
}

/**
 * The Java face of [ConfigSession]: [run] returns a [CompletableFuture]
 * that completes when the run ended (`cancel(true)` stops it); the apply
 * callback is a [ConfigApply] lambda that throws to reject. A failed
 * future's cause is an [dev.openshell.sdk.ffi.OpenShellException]
 * (`FailedPrecondition` for a second concurrent run).
 */
class AsyncConfigSession private constructor(
    /** The Kotlin session underneath. */
    val session: ConfigSession,
) : AutoCloseable {
    private val futures = SessionFutures(session)

    val instanceId: String get() = session.instanceId

    /** Holds the session until [stop], [close] or the future's cancellation. */
    fun run(): CompletableFuture<Void?> = futures.run(session::run)

    fun stop() = session.stop()

    fun stats(): ConfigSessionStats = session.stats()

    /** The next update to answer, or `null` once closed (sessions made by [withUpdates]). */
    fun nextUpdate(): CompletableFuture<ConfigUpdate?> = futures.future(session::nextUpdate)

    override fun close() = futures.close()

    companion object {
        @JvmStatic
        fun create(
            config: SessionConfig,
            sandboxId: String,
            apply: ConfigApply,
        ): AsyncConfigSession = AsyncConfigSession(ConfigSession.create(config, sandboxId, apply))

        @JvmStatic
        fun withUpdates(
            config: SessionConfig,
            sandboxId: String,
        ): AsyncConfigSession = AsyncConfigSession(ConfigSession.withUpdates(config, sandboxId))
    }
}

/** The Java face of [HostSession], as [AsyncConfigSession]. */
class AsyncHostSession private constructor(
    val session: HostSession,
) : AutoCloseable {
    private val futures = SessionFutures(session)

    val memberId: String get() = session.memberId

    fun run(): CompletableFuture<Void?> = futures.run(session::run)

    fun stop() = session.stop()

    fun stats(): HostSessionStats = session.stats()

    override fun close() = futures.close()

    companion object {
        @JvmStatic
        @JvmOverloads
        fun create(
            config: SessionConfig,
            memberId: String,
            apply: HostApply,
            capacity: Int = 0,
        ): AsyncHostSession = AsyncHostSession(HostSession.create(config, memberId, apply, capacity))
    }
}
