package dev.openshell.sdk

import dev.openshell.sdk.ffi.EventWatch
import dev.openshell.sdk.ffi.LogLine
import dev.openshell.sdk.ffi.LogQuery
import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.ffi.WatchEvent
import dev.openshell.sdk.ffi.WatchOptions
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.flow
import kotlinx.coroutines.flow.mapNotNull
import kotlinx.coroutines.future.future
import java.time.Instant
import java.util.concurrent.CompletableFuture
import java.util.concurrent.atomic.AtomicBoolean
import kotlin.time.Duration

/** Which log lines to read or follow; everything by default. Java: [LogFilter.builder]. */
data class LogFilter(
    /** Only the newest lines (of those that match). */
    val tail: Int? = null,
    /** Only lines written at or after this time. */
    val since: Instant? = null,
    /** Only lines of these sources (`gateway`, `sandbox`); all when empty. */
    val sources: List<String> = emptyList(),
    /** Only lines at this level or above (TRACE, DEBUG, INFO, WARN, ERROR). */
    val minLevel: String? = null,
) {
    internal fun query() = LogQuery(tail?.coerceAtLeast(0)?.toUInt(), since?.toEpochMilli(), sources, minLevel)

    class Builder internal constructor() {
        private var tail: Int? = null
        private var since: Instant? = null
        private val sources = mutableListOf<String>()
        private var minLevel: String? = null

        fun tail(lines: Int?) = apply { tail = lines }

        fun since(time: Instant?) = apply { since = time }

        fun source(source: String) = apply { sources += source }

        fun minLevel(level: String?) = apply { minLevel = level }

        fun build() = LogFilter(tail, since, sources.toList(), minLevel)
    }

    companion object {
        @JvmStatic
        fun builder(): Builder = Builder()
    }
}

/** What a sandbox watch follows: status snapshots by default. Java: [WatchSpec.builder]. */
data class WatchSpec(
    /** Status snapshots (the current state first, unless resuming). */
    val status: Boolean = true,
    /** Follow log lines matching this filter (its `tail`, 200 when unset, replayed first unless resuming). */
    val logs: LogFilter? = null,
    /** Start after this cursor ([WatchEvent] carries one): exactly the events that came later. */
    val resumeAfter: String? = null,
    /** End once the sandbox is READY, COMPLETED, STOPPED or in ERROR. */
    val stopOnTerminal: Boolean = false,
) {
    internal fun options() = WatchOptions(status, logs?.query(), resumeAfter, stopOnTerminal)

    class Builder internal constructor() {
        private var status = true
        private var logs: LogFilter? = null
        private var resumeAfter: String? = null
        private var stopOnTerminal = false

        fun status(on: Boolean) = apply { status = on }

        fun logs(filter: LogFilter?) = apply { logs = filter }

        fun resumeAfter(cursor: String?) = apply { resumeAfter = cursor }

        fun stopOnTerminal(on: Boolean) = apply { stopOnTerminal = on }

        fun build() = WatchSpec(status, logs, resumeAfter, stopOnTerminal)
    }

    companion object {
        @JvmStatic
        fun builder(): Builder = Builder()
    }
}

/** A sandbox's recorded log lines. */
data class SandboxLogs(
    /** Oldest first. */
    val lines: List<LogLine>,
    /** Lines the gateway holds for the sandbox (before the filter). */
    val bufferTotal: Long,
)

/** The event's cursor: resume after it to get what followed. */
val WatchEvent.cursor: String
    get() =
        when (this) {
            is WatchEvent.Sandbox -> cursor
            is WatchEvent.Log -> cursor
        }

/** When the line was written (the writer's clock), if it said. */
val LogLine.time: Instant? get() = timeMs?.let(Instant::ofEpochMilli)

/**
 * A running watch of one sandbox, pulled with [next]. The core resumes a
 * broken stream after the last cursor it delivered (on any replica), so
 * nothing is lost or repeated; a cursor the gateway no longer holds ends it
 * with `OutOfRange`. [close] ends the watch (a [next] in flight fails with
 * `Cancelled`).
 */
class SandboxWatch internal constructor(
    private val watch: EventWatch,
) : AutoCloseable {
    private val closed = AtomicBoolean(false)

    /** The next event, or `null` once the watch ended (`stopOnTerminal`, or nothing to follow). */
    suspend fun next(): WatchEvent? = open().next()

    /** The cursor of the last event returned. */
    val cursor: String? get() = if (closed.get()) null else watch.cursor()

    /** How many times the watch opened a new stream after a broken one. */
    val resumes: Int get() = if (closed.get()) 0 else watch.resumes().toInt()

    private fun open(): EventWatch {
        if (closed.get()) throw OpenShellException.Cancelled("cancelled", "the watch was closed", 1, false, null)
        return watch
    }

    /** Ends the watch and frees it. Idempotent. */
    override fun close() {
        if (closed.compareAndSet(false, true)) {
            watch.cancel()
            watch.close()
        }
    }
}

/** The sandbox's recorded log lines, oldest first (`NotFound` for a missing sandbox). */
suspend fun Sandboxes.logs(
    name: String,
    filter: LogFilter = LogFilter(),
    timeout: Duration? = null,
): SandboxLogs {
    val logs = native.sandboxLogs(name, filter.query(), timeout.millis())
    return SandboxLogs(logs.lines, logs.bufferTotal.toLong())
}

/**
 * Opens a watch of [name] (see [SandboxWatch]); close it when done. Errors
 * (a missing sandbox, a stale cursor) come from the first [SandboxWatch.next].
 * [timeout], when set, bounds the whole watch.
 */
suspend fun Sandboxes.openWatch(
    name: String,
    spec: WatchSpec = WatchSpec(),
    timeout: Duration? = null,
): SandboxWatch = SandboxWatch(native.watchSandbox(name, spec.options(), timeout.millis()))

/**
 * The events of a sandbox watch as a cold [Flow]: each collection opens a
 * watch; a collector that stops early (or is cancelled) ends it.
 */
fun Sandboxes.events(
    name: String,
    spec: WatchSpec = WatchSpec(),
    timeout: Duration? = null,
): Flow<WatchEvent> =
    flow {
        openWatch(name, spec, timeout).use { watch ->
            while (true) emit(watch.next() ?: break)
        }
    }

/** Follows the sandbox's log lines (no status events) as they are written; [filter]'s `tail` lines come first. */
fun Sandboxes.followLogs(
    name: String,
    filter: LogFilter = LogFilter(),
    timeout: Duration? = null,
): Flow<LogLine> = events(name, WatchSpec(status = false, logs = filter), timeout).mapNotNull { (it as? WatchEvent.Log)?.line }

/** A sandbox watch for Java: [next] as a [CompletableFuture]. */
class AsyncSandboxWatch internal constructor(
    /** The Kotlin watch underneath. */
    val watch: SandboxWatch,
    private val scope: CoroutineScope,
) : AutoCloseable {
    /** The next event, or `null` once the watch ended. */
    fun next(): CompletableFuture<WatchEvent?> = scope.future { watch.next() }

    /** The cursor of the last event returned. */
    val cursor: String? get() = watch.cursor

    /** Ends the watch. Idempotent. */
    override fun close() = watch.close()
}
