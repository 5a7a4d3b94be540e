package dev.openshell.sdk

import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.ffi.TokenGrant
import dev.openshell.sdk.ffi.TokenSource
import kotlinx.coroutines.async
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.util.concurrent.atomic.AtomicInteger
import kotlin.time.Duration.Companion.seconds

class ClientOptionsTest {
    @Test
    fun `a token source on the JVM is called by the core`() =
        runBlocking {
            val calls = AtomicInteger()
            val source =
                object : TokenSource {
                    override fun token(forceRefresh: Boolean): TokenGrant {
                        calls.incrementAndGet()
                        return TokenGrant("jvm-token-${calls.get()}", 60_000uL)
                    }
                }
            OpenShellClient.connect(TestCluster.endpoint) { tokenSource(source) }.use { client ->
                client.sandboxes.list()
                assertTrue(calls.get() >= 1, "calls ${calls.get()}")
                // Cached: a second call does not ask again.
                val before = calls.get()
                client.health()
                assertEquals(before, calls.get())
            }

            val failing =
                object : TokenSource {
                    override fun token(forceRefresh: Boolean): TokenGrant = throw IllegalStateException("no token today")
                }
            OpenShellClient.connect(TestCluster.endpoint) { tokenSource(failing) }.use { client ->
                val err = assertThrows<OpenShellException.Auth> { client.sandboxes.list() }
                assertEquals("auth", err.code)
                assertTrue("no token today" in err.detail, err.detail)
            }
        }

    @Test
    fun `an exec timeout kills the command and close cancels calls in flight`() =
        runBlocking {
            val client = OpenShellClient.connect(TestCluster.endpoint) { defaultTimeout(java.time.Duration.ofSeconds(60)) }
            val name = client.readySandbox("jvm-timeouts")
            try {
                val spec = ExecSpec(name, listOf("sleep", "30"), execTimeout = java.time.Duration.ofSeconds(1))
                assertEquals(124, client.exec(spec).exitCode)

                val marker = unique("close")
                val call =
                    async {
                        runCatching {
                            client.exec(ExecSpec(name, listOf("sleep", "300"), environment = mapOf("TEST_MARKER" to marker)))
                        }
                    }
                until("the command runs", 20.seconds) { markedPids(marker).isNotEmpty() }
                client.close()
                val failure = call.await().exceptionOrNull()
                assertTrue(failure is OpenShellException.Cancelled, "$failure")
                until("the command is killed", 20.seconds) { markedPids(marker).isEmpty() }
            } finally {
                OpenShellClient.connect(TestCluster.endpoint).use { runCatching { it.sandboxes.delete(name) } }
            }
        }
}
