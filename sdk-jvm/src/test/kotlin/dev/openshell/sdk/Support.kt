package dev.openshell.sdk

import dev.openshell.sdk.testing.LocalCluster
import kotlinx.coroutines.delay
import java.io.File
import java.util.UUID
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.TimeSource

/** One 3-replica cluster behind the edge for the whole test run. */
object TestCluster {
    val cluster: LocalCluster by lazy {
        LocalCluster.startBlocking(3).also { started ->
            Runtime.getRuntime().addShutdownHook(Thread { started.close() })
        }
    }

    val endpoint: String get() = cluster.endpoint
}

fun unique(prefix: String): String = "$prefix-${UUID.randomUUID().toString().take(8)}"

/** Host PIDs of live processes whose environment holds TEST_MARKER=marker. */
fun markedPids(marker: String): List<Int> {
    val want = "TEST_MARKER=$marker"
    return File("/proc").listFiles().orEmpty().mapNotNull { dir ->
        val pid = dir.name.toIntOrNull() ?: return@mapNotNull null
        val env = runCatching { File(dir, "environ").readBytes().toString(Charsets.UTF_8) }.getOrNull()
        if (env == null || want !in env.split('\u0000')) return@mapNotNull null
        val stat = runCatching { File(dir, "stat").readText() }.getOrNull() ?: return@mapNotNull null
        val state = stat.substringAfterLast(") ", "")
        if (state.startsWith("Z")) null else pid
    }
}

suspend fun until(
    what: String,
    within: Duration,
    check: () -> Boolean,
) {
    val start = TimeSource.Monotonic.markNow()
    while (!check()) {
        if (start.elapsedNow() > within) throw AssertionError("timed out waiting until $what")
        delay(50.milliseconds)
    }
}

/** A ready sandbox of its own; deleted by the caller. */
suspend fun OpenShellClient.readySandbox(prefix: String): String {
    val name = unique(prefix)
    sandboxes.create(name = name, labels = mapOf("suite" to "jvm"))
    sandboxes.waitReady(name)
    return name
}
