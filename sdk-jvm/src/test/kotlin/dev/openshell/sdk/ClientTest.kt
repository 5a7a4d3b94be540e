package dev.openshell.sdk

import dev.openshell.sdk.ffi.ExecEvent
import dev.openshell.sdk.ffi.OpenShellException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeoutOrNull
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import kotlin.time.Duration.Companion.seconds

class ClientTest {
    private suspend fun client() = OpenShellClient.connect(TestCluster.endpoint)

    @Test
    fun `create wait exec list delete`() =
        runBlocking {
            client().use { client ->
                assertEquals("HEALTHY", client.health().status)
                val name = unique("jvm-life")
                val created =
                    client.sandboxes.create(
                        name = name,
                        environment = mapOf("GREETING" to "hi"),
                        labels = mapOf("suite" to "jvm"),
                    )
                assertEquals(name, created.name)
                val ready = client.sandboxes.waitReady(name, timeout = 60.seconds)
                assertEquals("READY", ready.phase)

                val out = client.exec(name, listOf("sh", "-c", "echo \$GREETING; echo oops >&2; exit 3"))
                assertEquals("hi\n", out.stdoutText)
                assertEquals("oops\n", out.stderrText)
                assertEquals(3, out.exitCode)

                val piped = client.exec(name, listOf("cat"), stdin = "piped".toByteArray())
                assertEquals("piped", piped.stdoutText)

                assertTrue(client.sandboxes.list("suite=jvm").any { it.name == name })
                assertTrue(client.sandboxes.delete(name) in setOf("COMPLETED", "ACCEPTED"))
                client.sandboxes.waitDeleted(name, timeout = 60.seconds)
                val gone = assertThrows<OpenShellException.NotFound> { client.sandboxes.get(name) }
                assertEquals("not_found", gone.code)
            }
        }

    @Test
    fun `a missing sandbox is NotFound with the gRPC code`() =
        runBlocking {
            client().use { client ->
                val err = assertThrows<OpenShellException.NotFound> { client.sandboxes.get(unique("missing")) }
                assertEquals("not_found", err.code)
                assertEquals(5, err.grpcStatus)
                assertTrue(err is OpenShellException)
                val exec = assertThrows<OpenShellException> { client.exec(unique("missing"), listOf("true")) }
                assertEquals("not_found", exec.errorCode())
                assertEquals(5, exec.grpcStatusCode())
            }
        }

    @Test
    fun `streaming exec as a Flow, and interactive exec with stdin`() =
        runBlocking {
            client().use { client ->
                val name = client.readySandbox("jvm-stream")
                try {
                    val events = mutableListOf<ExecEvent>()
                    client.execStream(name, listOf("sh", "-c", "echo one; echo two >&2; exit 2")).collect { events += it }
                    val stdout = events.filterIsInstance<ExecEvent.Stdout>().joinToString("") { it.data.toString(Charsets.UTF_8) }
                    val stderr = events.filterIsInstance<ExecEvent.Stderr>().joinToString("") { it.data.toString(Charsets.UTF_8) }
                    assertEquals("one\n", stdout)
                    assertEquals("two\n", stderr)
                    assertEquals(ExecEvent.Exit(2), events.last())

                    val interactive = client.execInteractive(name, listOf("sh", "-c", "while read line; do echo got:\$line; done; exit 7"))
                    interactive.use { process ->
                        process.write("ping\n")
                        process.write("pong\n".toByteArray())
                        process.closeStdin()
                        val out = StringBuilder()
                        var exit: Int? = null
                        process.events.collect { event ->
                            when (event) {
                                is ExecEvent.Stdout -> {
                                    out.append(event.data.toString(Charsets.UTF_8))
                                }

                                is ExecEvent.Stderr -> {}

                                is ExecEvent.Exit -> {
                                    exit = event.exitCode
                                }
                            }
                        }
                        assertEquals("got:ping\ngot:pong\n", out.toString())
                        assertEquals(7, exit)
                    }
                    // A closed process says cancelled, not "destroyed".
                    val closed = assertThrows<OpenShellException.Cancelled> { interactive.write("late") }
                    assertEquals("cancelled", closed.code)
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }

    @Test
    fun `owner routing sends hinted execs with no unrouted retries`() =
        runBlocking {
            client().use { client ->
                val name = client.readySandbox("jvm-route")
                try {
                    val owner = client.sandboxes.getWithOwner(name).owner
                    assertNotNull(owner)
                    assertTrue(owner in TestCluster.cluster.replicaIds, "owner $owner")
                    assertEquals(owner, TestCluster.cluster.ownerOf(name))
                    val before = client.routingStats()
                    repeat(5) { i ->
                        assertEquals("$i\n", client.exec(name, listOf("echo", "$i")).stdoutText)
                    }
                    val after = client.routingStats()
                    assertEquals(5L, after.hinted - before.hinted, "stats $before -> $after")
                    assertEquals(0L, after.unroutedRetries)
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }

    @Test
    fun `routing off sends no hints`() =
        runBlocking {
            OpenShellClient.connect(TestCluster.endpoint) { ownerRouting(false) }.use { client ->
                val name = client.readySandbox("jvm-noroute")
                try {
                    assertEquals("x\n", client.exec(name, listOf("echo", "x")).stdoutText)
                    val stats = client.routingStats()
                    assertEquals(0L, stats.hinted)
                    assertEquals(0L, stats.ownerLookups)
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }

    @Test
    fun `a cancelled coroutine kills the command on the gateway`() =
        runBlocking {
            client().use { client ->
                val name = client.readySandbox("jvm-cancel")
                try {
                    // A streaming exec: cancel the collecting coroutine.
                    val marker = unique("stream")
                    val started = CompletableDeferred<Unit>()
                    val job =
                        launch {
                            client
                                .execStream(name, listOf("sh", "-c", "echo started; exec sleep 300"), mapOf("TEST_MARKER" to marker))
                                .collect { started.complete(Unit) }
                        }
                    started.await()
                    until("the streamed command runs", 20.seconds) { markedPids(marker).isNotEmpty() }
                    job.cancel()
                    job.join()
                    until("the streamed command is killed", 20.seconds) { markedPids(marker).isEmpty() }

                    // A buffered exec: a timeout cancels the suspended call.
                    val marker2 = unique("unary")
                    val spec = ExecSpec(name, listOf("sleep", "300"), environment = mapOf("TEST_MARKER" to marker2))
                    val result =
                        withTimeoutOrNull(20.seconds) {
                            launch { until("the command runs", 20.seconds) { markedPids(marker2).isNotEmpty() } }
                            withTimeoutOrNull(3.seconds) { client.exec(spec) }
                        }
                    assertEquals(null, result)
                    until("the buffered command is killed", 20.seconds) { markedPids(marker2).isEmpty() }

                    // The client still works after the cancellations.
                    assertEquals("ok\n", client.exec(name, listOf("echo", "ok")).stdoutText)
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }
}
