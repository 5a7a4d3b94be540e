// The files, logs and watch ops of scenarios.json.
package dev.openshell.sdk.conformance

import dev.openshell.sdk.ExecSpec
import dev.openshell.sdk.LogFilter
import dev.openshell.sdk.SandboxWatch
import dev.openshell.sdk.WatchSpec
import dev.openshell.sdk.cursor
import dev.openshell.sdk.download
import dev.openshell.sdk.ffi.WatchEvent
import dev.openshell.sdk.logs
import dev.openshell.sdk.openWatch
import dev.openshell.sdk.readFile
import dev.openshell.sdk.upload
import dev.openshell.sdk.writeFile
import kotlinx.coroutines.delay
import kotlinx.coroutines.withTimeoutOrNull
import java.nio.file.Files
import java.security.SecureRandom
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds
import kotlin.time.TimeSource

private val LOGS_WAIT = 15.seconds
private val WATCH_WAIT = 20.seconds

/** Quiet time after the first event before watch_logs runs its command. */
private val SETTLE = 1.seconds

/** How long watch_logs waits for that quiet at most. */
private val SETTLE_LIMIT = 60.seconds

private fun Runner.text(value: Any?): String = subst(value) as? String ?: ""

private suspend fun writeFileOp(
    r: Runner,
    step: Step,
): Result {
    val summary = r.client.writeFile(r.target(step), r.text(step["path"]), r.text(step["content"]))
    return result("bytes" to summary.bytes)
}

private suspend fun readFileOp(
    r: Runner,
    step: Step,
): Result {
    val data = r.client.readFile(r.target(step), r.text(step["path"]))
    return result().apply { text("content", data) }
}

/** Random bytes to a local file, uploaded by path, downloaded by path to another, compared. */
private suspend fun fileRoundTripOp(
    r: Runner,
    step: Step,
): Result {
    val sandbox = r.target(step)
    val remote = r.text(step["remote"])
    val data = ByteArray(number(step["size"])).also { SecureRandom().nextBytes(it) }
    val dir = Files.createTempDirectory("conformance-files-")
    try {
        val sent = dir.resolve("sent.bin")
        val back = dir.resolve("back.bin")
        Files.write(sent, data)
        val summary = r.client.upload(sandbox, sent, remote)
        r.client.download(sandbox, remote, back)
        return result("bytes" to summary.bytes, "same" to Files.readAllBytes(back).contentEquals(data))
    } finally {
        dir.toFile().deleteRecursively()
    }
}

private suspend fun logsOp(
    r: Runner,
    step: Step,
): Result {
    val filter =
        LogFilter(
            tail = (step["tail"] as? Double)?.toInt(),
            sources = listOfNotNull(step["source"] as? String),
            minLevel = step["min_level"] as? String,
        )
    val waitFor = step["wait_for"] as? String
    val started = TimeSource.Monotonic.markNow()
    while (true) {
        val lines =
            r.client.sandboxes
                .logs(r.target(step), filter)
                .lines
        val messages = lines.map { it.message }
        if (waitFor == null || waitFor in messages || started.elapsedNow() > LOGS_WAIT) {
            return result("messages" to messages, "sources" to lines.map { it.source })
        }
        delay(200.milliseconds)
    }
}

private suspend fun SandboxWatch.nextWithin(limit: Duration): WatchEvent? = withTimeoutOrNull(limit) { next() }

/**
 * Follows the sandbox's supervisor lines, lets earlier steps' lines arrive,
 * runs the command and reads until its own `exec finished` line.
 */
private suspend fun watchLogsOp(
    r: Runner,
    step: Step,
): Result {
    val sandbox = r.target(step)
    val command = strings(r.subst(step["command"]))

    fun spec(resumeAfter: String?) = WatchSpec(status = false, logs = LogFilter(sources = listOf("sandbox")), resumeAfter = resumeAfter)
    var last: String
    var ordered = true
    r.client.sandboxes.openWatch(sandbox, spec(null)).use { watch ->
        val first = watch.nextWithin(WATCH_WAIT) ?: throw StepFailed("no event within $WATCH_WAIT")
        last = first.cursor
        val settling = TimeSource.Monotonic.markNow()
        while (true) {
            if (settling.elapsedNow() > SETTLE_LIMIT) {
                throw StepFailed("the watch did not go quiet for $SETTLE within $SETTLE_LIMIT")
            }
            val event = watch.nextWithin(SETTLE) ?: break
            ordered = ordered && event.cursor >= last
            last = event.cursor
        }
    }
    // A new watch resumes exactly after the last event seen.
    val opened = last
    r.client.sandboxes.openWatch(sandbox, spec(opened)).use { watch ->
        r.client.exec(ExecSpec(sandbox, command))
        val deadline = TimeSource.Monotonic.markNow() + WATCH_WAIT
        while (true) {
            val left = -deadline.elapsedNow()
            if (!left.isPositive()) throw StepFailed("no exec line within $WATCH_WAIT")
            val event = watch.nextWithin(left) ?: throw StepFailed("no exec line within $WATCH_WAIT")
            ordered = ordered && event.cursor >= last
            last = event.cursor
            val line = (event as? WatchEvent.Log)?.line ?: continue
            if (line.message == "exec finished" && command.isNotEmpty() && line.fields["argv0"] == command[0] && event.cursor > opened) {
                val code =
                    line.fields["exit_code"]?.toIntOrNull()
                        ?: throw StepFailed("an exec line without exit_code: ${line.fields}")
                return result("finished_exit_code" to code, "cursors_ordered" to ordered)
            }
        }
    }
}

private suspend fun watchEventsOp(
    r: Runner,
    step: Step,
): Result {
    val spec = WatchSpec(resumeAfter = step["resume_after"]?.toString())
    r.client.sandboxes.openWatch(r.target(step), spec).use { watch ->
        val event = watch.nextWithin(WATCH_WAIT) ?: throw StepFailed("no event within $WATCH_WAIT")
        return result("first" to if (event is WatchEvent.Log) "log" else "sandbox")
    }
}

val FILES_LOGS_OPS: Map<String, Op> =
    mapOf(
        "write_file" to ::writeFileOp,
        "read_file" to ::readFileOp,
        "file_round_trip" to ::fileRoundTripOp,
        "logs" to ::logsOp,
        "watch_logs" to ::watchLogsOp,
        "watch_events" to ::watchEventsOp,
    )
