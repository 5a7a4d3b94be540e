package dev.openshell.sdk

import dev.openshell.sdk.ffi.OpenShellException
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import kotlinx.coroutines.withTimeoutOrNull
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.util.Collections
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicBoolean
import kotlin.time.Duration.Companion.seconds

/**
 * [ConfigSession] against real gateways (see [ConfigGateway]) in push and
 * in poll mode, on the sandbox's own token; configuration is written with
 * `UpdateConfig` through a normal client ([setSetting]).
 */
class ConfigSessionTest {
    /** A gateway in [mode] with one sandbox: its id, token and a client. */
    private class Fixture(
        mode: String,
    ) : AutoCloseable {
        val gateway = ConfigGateway.start(mode)
        val client = runBlocking { OpenShellClient.connect(gateway.endpoint) }
        val name = unique("jvm-cfg")
        val id = runBlocking { client.sandboxes.create(name = name).id }
        val token = gateway.sandboxToken(id)

        fun config(configure: SessionConfig.Builder.() -> Unit = {}): SessionConfig =
            SessionConfig
                .builder(gateway.endpoint, token)
                .allowCleartextToken(true)
                .apply(configure)
                .build()

        override fun close() {
            client.close()
            gateway.close()
        }
    }

    /** What an apply callback saw; `verdict=no` is refused. */
    private class Applied : ConfigApply {
        val snapshots: MutableList<ConfigSnapshot> = Collections.synchronizedList(mutableListOf())

        override fun apply(snapshot: ConfigSnapshot) {
            if (snapshot.stringSetting("verdict") == "no") throw ConfigRejected("verdict must not be no")
            snapshots += snapshot
        }

        fun setting(key: String): String? = synchronized(snapshots) { snapshots.lastOrNull()?.stringSetting(key) }
    }

    @Test
    fun `push - bootstrap, an update applied and acknowledged, a rejection`() =
        runBlocking {
            Fixture("push").use { f ->
                val applied = Applied()
                ConfigSession.create(f.config(), f.id, applied).use { session ->
                    val run = launch(Dispatchers.Default) { session.run() }
                    until("accepted in push mode", 20.seconds) {
                        session.stats().let { it.sessionsAccepted >= 1 && it.mode == DeliveryMode.PUSH }
                    }
                    until("the bootstrap answered", 10.seconds) { session.stats().lastUpdateId >= 1 }
                    f.client.setSetting(f.name, "color", "blue")
                    until("color=blue applied", 20.seconds) { applied.setting("color") == "blue" }
                    assertEquals(DeliveryMode.PUSH, applied.snapshots.last().mode)
                    f.client.setSetting(f.name, "verdict", "no")
                    until("verdict=no rejected", 20.seconds) { session.stats().rejected == 1L }
                    until("every update answered", 10.seconds) { session.stats().let { it.lastUpdateId == it.updatesReceived } }
                    val stats = session.stats()
                    assertTrue(stats.updatesReceived >= 3, "stats $stats")
                    assertNotNull(stats.servedBy, "stats $stats")
                    assertNotNull(stats.sessionId)
                    assertTrue(stats.applied >= 1)
                    assertFalse(applied.snapshots.any { it.stringSetting("verdict") == "no" })
                    assertFalse(session.toString().contains(f.token))
                    session.stop()
                    withTimeout(15.seconds) { run.join() }
                }
            }
        }

    @Test
    fun `updates - each answered with ack or reject`() =
        runBlocking {
            Fixture("push").use { f ->
                ConfigSession.withUpdates(f.config(), f.id).use { session ->
                    val run = launch(Dispatchers.Default) { session.run() }
                    val seen = Collections.synchronizedList(mutableListOf<String?>())
                    val answering =
                        launch(Dispatchers.Default) {
                            session.updates.collect { update ->
                                val color = update.snapshot.stringSetting("color")
                                seen += color
                                if (color == "plaid") assertTrue(update.reject("no plaid")) else assertTrue(update.ack())
                                assertFalse(update.ack(), "answered twice")
                            }
                        }
                    until("accepted in push mode", 20.seconds) { session.stats().mode == DeliveryMode.PUSH }
                    f.client.setSetting(f.name, "color", "green")
                    until("color=green answered", 20.seconds) { "green" in seen }
                    f.client.setSetting(f.name, "color", "plaid")
                    until("color=plaid rejected", 20.seconds) { session.stats().rejected == 1L }
                    val stats = session.stats()
                    assertTrue(stats.applied >= 2, "stats $stats")
                    session.stop()
                    withTimeout(15.seconds) { run.join() }
                    session.close()
                    // Closing ends the updates flow.
                    withTimeout(10.seconds) { answering.join() }
                }
            }
        }

    @Test
    fun `poll - a gateway that does not push is polled`() =
        runBlocking {
            Fixture("poll").use { f ->
                val applied = Applied()
                val config = f.config { pollInterval(java.time.Duration.ofMillis(200)) }
                ConfigSession.create(config, f.id, applied).use { session ->
                    val run = launch(Dispatchers.Default) { session.run() }
                    until("poll mode", 20.seconds) { session.stats().mode == DeliveryMode.POLL }
                    f.client.setSetting(f.name, "color", "red")
                    until("color=red applied", 20.seconds) { applied.setting("color") == "red" }
                    assertEquals(DeliveryMode.POLL, applied.snapshots.last().mode)
                    val stats = session.stats()
                    assertTrue(stats.polls >= 2, "stats $stats")
                    assertEquals(0L, stats.updatesReceived)
                    session.stop()
                    withTimeout(15.seconds) { run.join() }
                }
            }
        }

    @Test
    fun `a second concurrent run is refused and the first goes on`() =
        runBlocking {
            Fixture("push").use { f ->
                val applied = Applied()
                ConfigSession.create(f.config(), f.id, applied).use { session ->
                    val first = launch(Dispatchers.Default) { session.run() }
                    until("accepted in push mode", 20.seconds) { session.stats().mode == DeliveryMode.PUSH }
                    val before = session.stats()
                    val refused =
                        withTimeout(20.seconds) {
                            assertThrows<OpenShellException.FailedPrecondition> { session.run() }
                        }
                    assertEquals("failed_precondition", refused.code)
                    assertEquals(9, refused.grpcStatus)
                    assertTrue("already running" in refused.detail)
                    assertTrue(first.isActive)
                    f.client.setSetting(f.name, "color", "teal")
                    until("color=teal applied", 20.seconds) { applied.setting("color") == "teal" }
                    assertEquals(before.sessionsAccepted, session.stats().sessionsAccepted)
                    session.stop()
                    withTimeout(15.seconds) { first.join() }
                    // Once it ended, the session runs again.
                    val second = launch(Dispatchers.Default) { session.run() }
                    until("accepted again", 20.seconds) { session.stats().sessionsAccepted > before.sessionsAccepted }
                    session.stop()
                    withTimeout(15.seconds) { second.join() }
                }
            }
        }

    @Test
    fun `run returns after the apply in flight, and cancelling the coroutine stops it`() =
        runBlocking {
            Fixture("push").use { f ->
                val started = CountDownLatch(1)
                val finished = AtomicBoolean(false)
                val apply =
                    ConfigApply { snapshot ->
                        if (snapshot.stringSetting("slow") == "yes") {
                            started.countDown()
                            Thread.sleep(1500)
                            finished.set(true)
                        }
                    }
                ConfigSession.create(f.config(), f.id, apply).use { session ->
                    val scope = CoroutineScope(Dispatchers.Default)
                    val run = scope.async { session.run() }
                    until("accepted", 20.seconds) { session.stats().mode == DeliveryMode.PUSH }
                    f.client.setSetting(f.name, "slow", "yes")
                    assertTrue(started.await(20, TimeUnit.SECONDS), "the slow apply started")
                    run.cancel()
                    withTimeout(15.seconds) { run.join() }
                    assertTrue(finished.get(), "run returned before the apply in flight")
                }
            }
        }

    @Test
    fun `a bad token is never accepted, and bad input is InvalidConfig`() =
        runBlocking {
            Fixture("push").use { f ->
                val applied = Applied()
                val bad = SessionConfig.builder(f.gateway.endpoint, "not-a-token").allowCleartextToken(true).build()
                ConfigSession.create(bad, f.id, applied).use { session ->
                    val run = launch(Dispatchers.Default) { session.run() }
                    // Bounded: the session keeps retrying, never accepted.
                    assertNull(withTimeoutOrNull(3.seconds) { until("accepted", 3.seconds) { session.stats().sessionsAccepted > 0 } })
                    assertEquals(0L, session.stats().sessionsAccepted)
                    assertTrue(applied.snapshots.isEmpty())
                    session.stop()
                    withTimeout(15.seconds) { run.join() }
                }
                assertThrows<OpenShellException.InvalidConfig> { ConfigSession.create(f.config(), " ", applied) }
                assertThrows<OpenShellException.InvalidConfig> {
                    ConfigSession.create(f.config { pollInterval(java.time.Duration.ofMillis(1)) }, f.id, applied)
                }
                val cleartext = SessionConfig.builder("http://example.invalid:1", f.token).build()
                val err = assertThrows<OpenShellException.InvalidConfig> { ConfigSession.create(cleartext, f.id, applied) }
                assertFalse(err.detail.contains(f.token))
            }
        }
}
