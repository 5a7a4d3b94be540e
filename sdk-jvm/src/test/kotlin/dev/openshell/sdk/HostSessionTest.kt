package dev.openshell.sdk

import dev.openshell.sdk.ffi.OpenShellException
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.util.Collections
import kotlin.time.Duration.Companion.seconds

/**
 * [HostSession] against a real `--driver hosts` replica (see
 * [ConfigGateway]) with a host token from the real `host-token`
 * subcommand: a sandbox created on the gateway is assigned to the host,
 * whose session applies (and rejects) its configuration.
 */
class HostSessionTest {
    @Test
    fun `a host session serves an assigned sandbox`() =
        runBlocking {
            ConfigGateway.start("push", driver = "hosts").use { gateway ->
                val hostId = unique("h-jvm")
                val token = gateway.hostToken(hostId)
                val seen = Collections.synchronizedList(mutableListOf<Pair<String, String?>>())
                val apply =
                    HostApply { sandboxId, snapshot ->
                        val color = snapshot.stringSetting("color")
                        seen += sandboxId to color
                        if (color == "plaid") throw ConfigRejected("no plaid")
                    }
                val config = SessionConfig.builder(gateway.endpoint, token).allowCleartextToken(true).build()
                HostSession.create(config, hostId, apply, capacity = 10).use { host ->
                    assertFalse(host.toString().contains(token))
                    assertEquals(hostId, host.memberId)
                    val run = launch(Dispatchers.Default) { host.run() }
                    until("the host session accepted", 30.seconds) { host.stats().sessionId != null }
                    val accepted = host.stats()
                    assertEquals(1L, accepted.sessionsAccepted)
                    assertTrue(accepted.servedBy != null)

                    val refused = assertThrows<OpenShellException.FailedPrecondition> { host.run() }
                    assertTrue("already running" in refused.detail)

                    OpenShellClient.connect(gateway.endpoint).use { client ->
                        val name = unique("jvm-host")
                        val sandbox = client.sandboxes.create(name = name)
                        until("the first snapshot", 20.seconds) { seen.size >= 1 }
                        assertEquals(1L, host.stats().assigned)
                        for (color in listOf("blue", "plaid")) {
                            client.setSetting(name, "color", color)
                            until("color=$color applied", 20.seconds) { seen.lastOrNull()?.second == color }
                        }
                        assertEquals(listOf(sandbox.id to null, sandbox.id to "blue", sandbox.id to "plaid"), seen.toList())
                        client.sandboxes.delete(name)
                        until("the sandbox leaves the assignment", 20.seconds) { host.stats().assigned == 0L }
                    }
                    host.stop()
                    withTimeout(20.seconds) { run.join() }
                }
            }
        }
}
