package dev.openshell.sdk

import dev.openshell.sdk.ffi.OpenShellException
import kotlinx.coroutines.async
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.net.ConnectException
import java.net.InetSocketAddress
import java.net.Socket
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

/** Closing a handle or cancelling a coroutine ends the core's call: watches and forwards. */
class IoCancelTest {
    @Test
    fun `closing a watch ends a next in flight, cancelling a collector ends the flow, closing the client closes its forwards`() =
        runBlocking<Unit> {
            OpenShellClient.connect(TestCluster.endpoint).use { owner ->
                val name = owner.readySandbox("jvm-io-cancel")
                try {
                    val watch = owner.sandboxes.openWatch(name)
                    assertNotNull(withTimeout(20.seconds) { watch.next() })
                    val pending = async { runCatching { watch.next() } }
                    delay(200.milliseconds) // the next() is waiting: nothing changes in the sandbox
                    watch.close()
                    val outcome = withTimeout(5.seconds) { pending.await() }
                    assertTrue(outcome.exceptionOrNull() is OpenShellException.Cancelled, outcome.toString())
                    assertThrows<OpenShellException.Cancelled> { watch.next() }

                    val collector = launch { owner.sandboxes.followLogs(name).collect { } }
                    delay(300.milliseconds)
                    collector.cancel()
                    withTimeout(5.seconds) { collector.join() }

                    val client = OpenShellClient.connect(TestCluster.endpoint)
                    val forward = client.forward(name, 22)
                    client.close()
                    withTimeout(10.seconds) { forward.awaitClosed() }
                    assertTrue(forward.isClosed)
                    assertThrows<ConnectException> {
                        Socket().use { it.connect(InetSocketAddress("127.0.0.1", forward.localPort), 2_000) }
                    }
                    forward.close()
                } finally {
                    owner.sandboxes.delete(name)
                }
            }
        }
}
