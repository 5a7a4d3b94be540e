package dev.openshell.sdk

import dev.openshell.sdk.ffi.ClusterFault
import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.testing.LocalCluster
import kotlinx.coroutines.runBlocking
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNotEquals
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.nio.file.Files
import java.nio.file.Path
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds
import kotlin.time.TimeSource

/** LocalCluster's options and faults, on clusters of its own (not the shared one). */
class LocalClusterTest {
    /** How many times the sandbox's marker command ran (each run appends a line). */
    private suspend fun countRun(
        client: OpenShellClient,
        sandbox: String,
    ): String = client.exec(sandbox, listOf("sh", "-c", "echo x >> runs; wc -l < runs")).stdoutText.trim()

    @Test
    fun `a killed owner costs no exec, and store and route faults are what clients see`(): Unit =
        runBlocking {
            LocalCluster.start(LocalCluster.Options(replicas = 2)).use { cluster ->
                assertEquals(listOf("gw-0", "gw-1"), cluster.replicaIds)
                assertEquals(emptyList<String>(), cluster.hostIds)
                assertTrue(Files.isDirectory(cluster.dataDir))
                cluster.client().use { client ->
                    val name = client.readySandbox("jvm-cluster")
                    assertEquals("1", countRun(client, name))
                    val owner = checkNotNull(cluster.ownerOf(name)) { "the sandbox has no owner" }

                    cluster.killReplica(owner)
                    assertEquals("2", countRun(client, name), "an exec ran twice or not at all")
                    val moved = cluster.ownerOf(name)
                    assertNotNull(moved)
                    assertNotEquals(owner, moved)
                    cluster.startReplica(owner)

                    cluster.slowStore(400.milliseconds)
                    val begun = TimeSource.Monotonic.markNow()
                    assertEquals(0, client.exec(name, listOf("true")).exitCode)
                    assertTrue(begun.elapsedNow() >= 400.milliseconds, "the store was slowed")
                    cluster.cutStore()
                    assertThrows<OpenShellException.Unavailable> { client.sandboxes.create(name = unique("jvm-during-cut")) }
                    cluster.restoreStore()
                    assertEquals("3", countRun(client, name))
                    assertTrue(client.sandboxes.list().none { it.name.startsWith("jvm-during-cut") })

                    val unknown = assertThrows<OpenShellException.InvalidConfig> { cluster.killReplica("gw-9") }
                    assertTrue("no replica" in unknown.message.orEmpty(), unknown.message)
                    assertThrows<OpenShellException.InvalidConfig> { cluster.killHost("h-0") }
                    // Java's shape of the same.
                    assertThrows<OpenShellException.InvalidConfig> { cluster.faultBlocking(ClusterFault.StartHost("h-0")) }
                    assertEquals(cluster.ownerOf(name), cluster.ownerOfBlocking(name))
                    client.sandboxes.delete(name)
                }
            }
        }

    @Test
    fun `bad options fail before anything starts`(): Unit =
        runBlocking {
            assertThrows<IllegalArgumentException> { LocalCluster.start(LocalCluster.Options(replicas = 0)) }
            val delivery =
                assertThrows<OpenShellException.InvalidConfig> {
                    LocalCluster.start(LocalCluster.Options(configDelivery = "pigeon"))
                }
            assertTrue("config_delivery" in delivery.message.orEmpty(), delivery.message)
            assertThrows<OpenShellException.InvalidConfig> { LocalCluster.start(LocalCluster.Options(isolation = "vm")) }
            val missing = Path.of("/nonexistent/openshell-gateway")
            // As in Python and TypeScript: a cluster error naming the path.
            val absent = assertThrows<OpenShellException.Cluster> { LocalCluster.start(LocalCluster.Options(gatewayBin = missing)) }
            assertTrue("does not exist" in absent.message.orEmpty(), absent.message)
        }

    @Test
    fun `a stopped cluster refuses faults and stops again quietly`(): Unit =
        runBlocking {
            val cluster =
                LocalCluster.startBlocking(
                    LocalCluster.Options
                        .builder()
                        .replicas(1)
                        .build(),
                )
            val endpoint = cluster.endpoint
            cluster.stop()
            assertThrows<OpenShellException> { cluster.killReplica("gw-0") }
            cluster.stop()
            cluster.close()
            assertThrows<OpenShellException> { OpenShellClient.connect(endpoint).use { it.health(2.seconds) } }
        }
}
