// config_session: takes over a sandbox's session with the SDK's
// ConfigSession on the sandbox's own token (its real supervisor stopped
// first), writes the step's settings one at a time and reports what the
// session saw: its counters, when each write arrived, the last applied
// settings.
package dev.openshell.sdk.conformance

import dev.openshell.sdk.ConfigApply
import dev.openshell.sdk.ConfigRejected
import dev.openshell.sdk.ConfigSession
import dev.openshell.sdk.SessionConfig
import dev.openshell.sdk.deleteSetting
import dev.openshell.sdk.ffi.DeliveryMode
import dev.openshell.sdk.setSetting
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.NonCancellable
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.coroutineScope
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import java.io.File
import java.util.concurrent.atomic.AtomicReference
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds
import kotlin.time.DurationUnit
import kotlin.time.TimeSource

/** How long one write may take to reach the session. */
private val ARRIVAL_LIMIT = 15.seconds

private suspend fun waitFor(
    limit: Duration,
    check: () -> Boolean,
): Boolean {
    val started = TimeSource.Monotonic.markNow()
    while (!check()) {
        if (started.elapsedNow() > limit) return false
        delay(20.milliseconds)
    }
    return true
}

private fun running(pid: Long): Boolean {
    val stat = runCatching { File("/proc/$pid/stat").readText() }.getOrNull() ?: return false
    val state = stat.substringAfterLast(')').trim().substringBefore(' ')
    return state.isNotEmpty() && state != "Z" && state != "X"
}

/**
 * The sandbox token, after stopping the sandbox's supervisor by its PID so
 * the step's session is the sandbox's only one.
 */
private suspend fun takeOver(
    dataDir: String,
    sandboxId: String,
): String {
    val folder = File(dataDir, "sandboxes/$sandboxId")
    val pid =
        File(folder, "supervisor.pid").readText().trim().toLongOrNull()
            ?: throw StepFailed("supervisor.pid of $sandboxId holds no PID")
    // Guard against a reused PID: it must be this sandbox's supervisor.
    val args = runCatching { File("/proc/$pid/cmdline").readText().split('\u0000') }.getOrDefault(emptyList())
    if (args.none { it.endsWith("openshell-supervisor") } || sandboxId !in args) {
        throw StepFailed("process $pid is not the supervisor of sandbox $sandboxId")
    }
    val token = File(folder, "token").readText().trim()
    val process = ProcessHandle.of(pid).orElseThrow { StepFailed("supervisor $pid is gone") }
    if (!process.destroy()) throw StepFailed("could not signal supervisor $pid")
    if (!waitFor(10.seconds) { !running(pid) }) throw StepFailed("supervisor $pid did not stop within 10 s")
    return token
}

private suspend fun configSessionOp(
    r: Runner,
    step: Step,
): Result {
    val dataDir = r.dataDir ?: throw StepFailed("no OPENSHELL_CONFORMANCE_DATA_DIR")
    val name = r.target(step)
    val sandbox = r.client.sandboxes.get(name)
    val token = takeOver(dataDir, sandbox.id)
    val reject = step["reject"] as? Map<*, *>
    val refusedKey = reject?.get("setting")?.toString()
    val refusedValue = reject?.get("value")?.toString()
    val lastApplied = AtomicReference<Map<String, String>?>(null)
    val apply =
        ConfigApply { snapshot ->
            val settings = snapshot.stringSettings
            if (refusedKey != null && settings[refusedKey] == refusedValue) {
                throw ConfigRejected("$refusedKey must not be $refusedValue")
            }
            lastApplied.set(settings)
        }
    val config =
        SessionConfig
            .builder(r.client.endpoint, token)
            .allowCleartextToken(true)
            .announcePush(step["announce_push"] as? Boolean ?: true)
            .pollInterval(java.time.Duration.ofMillis(((step["poll_interval"] as? Double) ?: 10.0).times(1000).toLong()))
            .build()
    val globals = mutableListOf<String>()
    return ConfigSession.create(config, sandbox.id, apply).use { session ->
        coroutineScope {
            val running = launch(Dispatchers.IO) { session.run() }
            try {
                var bootstrap: Boolean? = null
                // Accepted, not merely polled: the startup poll sets a mode first.
                val accepted = waitFor(30.seconds) { session.stats().let { it.sessionsAccepted > 0 && it.mode != null } }
                if (accepted && session.stats().mode == DeliveryMode.PUSH) {
                    bootstrap = waitFor(10.seconds) { session.stats().lastUpdateId >= 1 }
                }
                val writes = mutableListOf<Result>()
                if (bootstrap != false) {
                    for (write in (r.subst(step["writes"]) as? List<*>).orEmpty().map { it as Map<*, *> }) {
                        val key = write["setting"].toString()
                        val value = write["value"].toString()
                        val global = write["global"] == true
                        val rejectedBefore = session.stats().rejected
                        val started = TimeSource.Monotonic.markNow()
                        r.client.setSetting(if (global) null else name, key, value)
                        if (global) globals.add(key)
                        val arrived =
                            if (key == refusedKey && value == refusedValue) {
                                waitFor(ARRIVAL_LIMIT) { session.stats().rejected > rejectedBefore }
                            } else {
                                waitFor(ARRIVAL_LIMIT) { lastApplied.get()?.get(key) == value }
                            }
                        writes.add(
                            result(
                                "setting" to key,
                                "value" to value,
                                "arrived" to arrived,
                                "seconds" to started.elapsedNow().toDouble(DurationUnit.SECONDS),
                            ),
                        )
                        if (!arrived) break
                    }
                }
                // A value shows in lastApplied while the apply function runs,
                // before the core has answered the update: observed once every
                // update received was answered (bounded).
                waitFor(5.seconds) { session.stats().let { it.lastUpdateId == it.updatesReceived } }
                // Observed before the clean-up, whose deletions also arrive.
                val stats = session.stats()
                result(
                    "stats" to
                        mapOf(
                            "mode" to stats.mode?.name?.lowercase(),
                            "sessions_accepted" to stats.sessionsAccepted,
                            "updates_received" to stats.updatesReceived,
                            "last_update_id" to stats.lastUpdateId,
                            "rejected" to stats.rejected,
                            "polls" to stats.polls,
                            "served_by" to stats.servedBy,
                        ),
                    "bootstrap_answered" to bootstrap,
                    "writes" to writes,
                    "applied_settings" to (lastApplied.get() ?: emptyMap()),
                )
            } finally {
                withContext(NonCancellable) {
                    // Global settings would reach every later session: removed again.
                    for (key in globals) runCatching { r.client.deleteSetting(null, key) }
                    session.stop()
                    running.cancelAndJoin()
                }
            }
        }
    }
}

val CONFIG_OPS: Map<String, Op> = mapOf("config_session" to ::configSessionOp)
