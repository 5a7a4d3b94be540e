package dev.openshell.sdk

import dev.openshell.sdk.ffi.ExecEvent
import dev.openshell.sdk.ffi.OpenShellException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.io.File
import java.net.ConnectException
import java.net.InetSocketAddress
import java.net.Socket
import kotlin.random.Random
import kotlin.time.Duration.Companion.seconds

/** Interactive exec on a pty with a resize, and TCP forwards (to a port and to the SSH server). */
class TtyForwardTest {
    private suspend fun client() = OpenShellClient.connect(TestCluster.endpoint)

    @Test
    fun `a tty exec has its size, and a resize reaches the program`() =
        runBlocking<Unit> {
            client().use { client ->
                val name = client.readySandbox("jvm-tty")
                try {
                    val spec =
                        ExecSpec
                            .builder(name, "sh", "-c", "stty size; read line; stty size; echo \"got:\$line\"; exit 7")
                            .tty(80, 24)
                            .build()
                    val output = StringBuffer()
                    val exit = CompletableDeferred<Int>()
                    client.execInteractive(spec).use { process ->
                        val reader =
                            launch {
                                process.events.collect { event ->
                                    when (event) {
                                        is ExecEvent.Stdout -> output.append(event.data.toString(Charsets.UTF_8))
                                        is ExecEvent.Stderr -> output.append(event.data.toString(Charsets.UTF_8))
                                        is ExecEvent.Exit -> exit.complete(event.exitCode)
                                    }
                                }
                            }
                        until("the first stty size", 30.seconds) { "24 80" in output }
                        process.resize(100, 30)
                        process.write("hello\n")
                        assertEquals(7, withTimeout(30.seconds) { exit.await() })
                        reader.join()
                        assertTrue("30 100" in output, output.toString())
                        assertTrue("got:hello" in output, output.toString())
                        // Bad input: the process is gone and its handle closed.
                        process.close()
                        assertThrows<OpenShellException.Cancelled> { process.resize(10, 10) }
                    }
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }

    @Test
    fun `a forward carries concurrent connections to an echo server, counts them and refuses after close`() =
        runBlocking<Unit> {
            client().use { client ->
                val name = client.readySandbox("jvm-fwd")
                try {
                    // Bad input first: a missing sandbox, a port out of range.
                    val missing = assertThrows<OpenShellException.NotFound> { client.forward(unique("no-such"), 80) }
                    assertEquals("not_found", missing.code)
                    assertThrows<OpenShellException.InvalidConfig> { client.forward(name, 0) }
                    assertThrows<OpenShellException.InvalidConfig> { client.forward(name, 70000) }

                    val script = File("../testkit/scripts/sandbox-echo.py").readText()
                    val port = CompletableDeferred<Int>()
                    val server =
                        launch {
                            val stdout = StringBuilder()
                            client.execStream(name, listOf("python3", "-c", script)).collect { event ->
                                if (event is ExecEvent.Stdout) {
                                    stdout.append(event.data.toString(Charsets.UTF_8))
                                    val line = stdout.lines().first()
                                    if (stdout.contains('\n')) port.complete(line.removePrefix("listening ").toInt())
                                }
                            }
                        }
                    try {
                        val remote = withTimeout(30.seconds) { port.await() }
                        val forward = client.forward(name, remote)
                        assertEquals(remote, forward.remotePort)
                        assertEquals(name, forward.sandbox)
                        assertTrue(forward.localAddress.endsWith(":${forward.localPort}"))
                        val payloads = List(4) { i -> Random.nextBytes(64 * 1024 + i) }
                        val echoed =
                            withContext(Dispatchers.IO) {
                                payloads
                                    .map { payload ->
                                        async {
                                            Socket("127.0.0.1", forward.localPort).use { socket ->
                                                socket.soTimeout = 30_000
                                                val writer =
                                                    launch {
                                                        socket.getOutputStream().write(payload)
                                                        socket.shutdownOutput()
                                                    }
                                                val back = socket.getInputStream().readBytes()
                                                writer.join()
                                                back
                                            }
                                        }
                                    }.awaitAll()
                            }
                        payloads.zip(echoed).forEach { (sent, back) -> assertArrayEquals(sent, back) }
                        val stats = forward.stats()
                        assertEquals(4L, stats.connectionsAccepted)
                        assertEquals(0L, stats.connectionsFailed)
                        assertEquals(payloads.sumOf { it.size.toLong() }, stats.bytesOut)

                        forward.close()
                        assertTrue(forward.isClosed)
                        withTimeout(10.seconds) { forward.awaitClosed() }
                        assertThrows<ConnectException> {
                            Socket().use { it.connect(InetSocketAddress("127.0.0.1", forward.localPort), 2_000) }
                        }
                    } finally {
                        server.cancel()
                    }
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }

    @Test
    fun `an SSH session token opens a forward to the sandbox's SSH server and can be revoked`() =
        runBlocking<Unit> {
            client().use { client ->
                val name = client.readySandbox("jvm-ssh")
                try {
                    assertThrows<OpenShellException.NotFound> { client.createSshSession(unique("no-such")) }
                    val session = client.createSshSession(name)
                    assertTrue(session.token.isNotEmpty())
                    assertFalse(session.token in session.toString(), "toString must not show the token")
                    assertTrue(session.gatewayScheme in setOf("http", "https"))

                    client.forwardSsh(name, sshSessionToken = session.token).use { forward ->
                        val banner =
                            withContext(Dispatchers.IO) {
                                Socket("127.0.0.1", forward.localPort).use { socket ->
                                    socket.soTimeout = 30_000
                                    socket.getInputStream().bufferedReader().readLine()
                                }
                            }
                        assertTrue(banner.startsWith("SSH-2.0-"), banner)
                        assertEquals(1L, forward.stats().connectionsAccepted)
                    }
                    assertTrue(client.revokeSshSession(session))
                    assertFalse(client.revokeSshSession(session.token))
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }
}
