package dev.openshell.sdk

import dev.openshell.sdk.ffi.LogLine
import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.ffi.TransferProgressInfo
import dev.openshell.sdk.ffi.WatchEvent
import kotlinx.coroutines.delay
import kotlinx.coroutines.flow.first
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import kotlinx.coroutines.withTimeoutOrNull
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.nio.file.Files
import java.util.concurrent.CopyOnWriteArrayList
import kotlin.random.Random
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds
import kotlin.time.TimeSource

/** Files in and out of a sandbox, its logs, and watches of its logs and status. */
class FilesLogsTest {
    private suspend fun client() = OpenShellClient.connect(TestCluster.endpoint)

    @Test
    fun `files as bytes and as local paths, with the errors of bad paths`() =
        runBlocking<Unit> {
            client().use { client ->
                val name = client.readySandbox("jvm-files")
                val dir = Files.createTempDirectory("jvm-files-")
                try {
                    val written = client.writeFile(name, "note.txt", "hello from the JVM\n")
                    assertEquals(19L, written.bytes)
                    assertEquals("hello from the JVM\n", client.readFile(name, "note.txt").toString(Charsets.UTF_8))
                    assertEquals("hello from the JVM\n", client.exec(name, listOf("cat", "note.txt")).stdoutText)

                    val data = Random.nextBytes(3 * 1024 * 1024 + 17)
                    val sent = dir.resolve("sent.bin").also { Files.write(it, data) }
                    val progress = CopyOnWriteArrayList<TransferProgressInfo>()
                    val up = client.upload(name, sent, "blob.bin", progress = { progress += it })
                    assertEquals(data.size.toLong(), up.bytes)
                    assertEquals(1L, up.files)
                    assertTrue(progress.isNotEmpty())
                    assertEquals(data.size.toLong(), progress.last().bytesDone)
                    val back = dir.resolve("back.bin")
                    val down = client.download(name, "blob.bin", back)
                    assertEquals(data.size.toLong(), down.bytes)
                    assertArrayEquals(data, Files.readAllBytes(back))

                    val missing = assertThrows<OpenShellException.NotFound> { client.readFile(name, "no-such-file") }
                    assertEquals("not_found", missing.code)
                    assertThrows<OpenShellException.InvalidArgument> { client.writeFile(name, "../escape.txt", "x") }
                    assertThrows<OpenShellException.NotFound> { client.download(name, "no-such-file", dir.resolve("x")) }
                    assertThrows<OpenShellException.NotFound> { client.upload(name, dir.resolve("no-such-local"), "x") }
                    assertThrows<OpenShellException.NotFound> { client.readFile(unique("no-such"), "note.txt") }
                } finally {
                    dir.toFile().deleteRecursively()
                    client.sandboxes.delete(name)
                }
            }
        }

    @Test
    fun `logs with filters, a followed exec line with its fields, and status events`() =
        runBlocking<Unit> {
            client().use { client ->
                val name = client.readySandbox("jvm-logs")
                try {
                    assertEquals(4, client.exec(name, listOf("sh", "-c", "exit 4")).exitCode)
                    val sandboxOnly = LogFilter(sources = listOf("sandbox"))
                    val start = TimeSource.Monotonic.markNow()
                    var logs = client.sandboxes.logs(name, sandboxOnly)
                    while (logs.lines.none { it.message == "exec finished" } && start.elapsedNow() < 15.seconds) {
                        delay(200.milliseconds)
                        logs = client.sandboxes.logs(name, sandboxOnly)
                    }
                    assertTrue(logs.lines.any { it.message == "exec finished" }, logs.toString())
                    assertEquals(setOf("sandbox"), logs.lines.map { it.source }.toSet())
                    assertTrue(logs.bufferTotal >= logs.lines.size)
                    assertEquals(
                        1,
                        client.sandboxes
                            .logs(name, LogFilter(tail = 1))
                            .lines.size,
                    )
                    val warnings = client.sandboxes.logs(name, LogFilter(minLevel = "WARN")).lines
                    assertTrue(warnings.all { it.level in setOf("WARN", "ERROR") }, warnings.toString())
                    assertThrows<OpenShellException.InvalidArgument> { client.sandboxes.logs(name, LogFilter(minLevel = "LOUD")) }
                    assertThrows<OpenShellException.NotFound> { client.sandboxes.logs(unique("no-such")) }

                    // Follow the supervisor's lines: an exec run after the watch opened is seen with its fields.
                    client.sandboxes
                        .openWatch(
                            name,
                            WatchSpec(status = false, logs = LogFilter(sources = listOf("sandbox"), tail = 1)),
                        ).use { watch ->
                            // The replayed line (and a snapshot) first; then wait for quiet, so what follows is new.
                            assertTrue(withTimeout(20.seconds) { watch.next() } != null)
                            val settle = TimeSource.Monotonic.markNow()
                            while (withTimeoutOrNull(1.seconds) { watch.next() } != null) {
                                assertTrue(settle.elapsedNow() < 30.seconds, "the watch never went quiet")
                            }
                            val opened = watch.cursor!!
                            assertEquals(6, client.exec(name, listOf("sh", "-c", "exit 6")).exitCode)
                            var last = opened
                            var finished: LogLine? = null
                            withTimeout(20.seconds) {
                                while (finished == null) {
                                    val event = watch.next() as? WatchEvent.Log ?: continue
                                    assertTrue(event.cursor >= last, "cursors in order: ${event.cursor} after $last")
                                    last = event.cursor
                                    val line = event.line
                                    if (line.message == "exec finished" && line.fields["argv0"] == "sh" &&
                                        event.cursor > opened
                                    ) {
                                        finished = line
                                    }
                                }
                            }
                            assertEquals("6", finished!!.fields["exit_code"])
                            assertTrue(finished!!.time != null)
                        }

                    // Status: the first event of a plain watch is the sandbox itself.
                    val first = withTimeout(20.seconds) { client.sandboxes.events(name).first() }
                    assertTrue(first is WatchEvent.Sandbox && first.sandbox.name == name, first.toString())
                    val resumed = withTimeout(20.seconds) { client.sandboxes.followLogs(name, LogFilter(tail = 1)).first() }
                    assertTrue(resumed.message.isNotEmpty())
                    // Bad input surfaces from the first event.
                    assertThrows<OpenShellException.InvalidArgument> {
                        withTimeout(20.seconds) { client.sandboxes.events(name, WatchSpec(resumeAfter = "garbage")).first() }
                    }
                    assertThrows<OpenShellException.NotFound> {
                        withTimeout(20.seconds) { client.sandboxes.events(unique("no-such")).first() }
                    }
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }
}
