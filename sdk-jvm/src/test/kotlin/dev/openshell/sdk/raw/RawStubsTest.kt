package dev.openshell.sdk.raw

import com.google.protobuf.ByteString
import com.google.protobuf.util.JsonFormat
import dev.openshell.sdk.ClientConfig
import dev.openshell.sdk.OpenShellAsyncClient
import dev.openshell.sdk.OpenShellClient
import dev.openshell.sdk.TestCluster
import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.readySandbox
import dev.openshell.sdk.unique
import kotlinx.coroutines.flow.toList
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import openshell.v1.Openshell
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.assertThrows
import java.util.concurrent.ExecutionException
import java.util.concurrent.TimeUnit
import kotlin.time.Duration.Companion.seconds

/** The generated typed raw stubs against the 3-replica cluster. */
class RawStubsTest {
    private suspend fun client() = OpenShellClient.connect(TestCluster.endpoint)

    private fun getRequest(name: String) =
        Openshell.GetSandboxRequest
            .newBuilder()
            .setName(name)
            .build()

    @Test
    fun `a unary stub answers with the owner header when asked`() =
        runBlocking<Unit> {
            client().use { client ->
                val health = client.raw.health(Openshell.HealthRequest.getDefaultInstance())
                assertEquals(Openshell.ServiceStatus.SERVICE_STATUS_HEALTHY, health.status)

                val name = client.readySandbox("jvm-raw")
                try {
                    val md = ResponseMetadata()
                    val options = RawCallOptions.of("x-openshell-want-owner" to "1", responseMetadata = md)
                    val got = client.raw.getSandbox(getRequest(name), options)
                    assertEquals(name, got.sandbox.metadata.name)
                    val owner = md["x-openshell-owner"]
                    assertNotNull(owner, "x-openshell-owner in ${md.entries}")
                    assertTrue(owner!!.startsWith("gw-"), owner)
                    assertNotNull(md.servedBy)
                    // The curated lookup names the same owner.
                    assertEquals(owner, client.sandboxes.getWithOwner(name).owner)
                    // Proto JSON with proto field names, as the conformance runner reports it.
                    val json = JsonFormat.printer().preservingProtoFieldNames().print(got)
                    assertTrue("\"name\": \"$name\"" in json, json)
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }

    @Test
    fun `an owner-routed server stream and a bidirectional stream`() =
        runBlocking<Unit> {
            client().use { client ->
                val name = client.readySandbox("jvm-raw-stream")
                try {
                    val before = client.routingStats()
                    val exec =
                        Openshell.ExecSandboxRequest
                            .newBuilder()
                            .setSandbox(name)
                            .addAllCommand(listOf("sh", "-c", "echo out; echo err >&2; exit 4"))
                            .build()
                    val events =
                        withTimeout(60.seconds) {
                            client.raw
                                .execSandbox(exec)
                                .messages
                                .toList()
                        }
                    val stdout = events.filter { it.hasStdout() }.joinToString("") { it.stdout.data.toStringUtf8() }
                    val stderr = events.filter { it.hasStderr() }.joinToString("") { it.stderr.data.toStringUtf8() }
                    assertEquals("out\n", stdout)
                    assertEquals("err\n", stderr)
                    assertEquals(4, events.last().exit.exitCode)
                    // Owner routing applied: the exec went out with a replica hint.
                    assertTrue(client.routingStats().hinted > before.hinted, "${client.routingStats()}")

                    // Interactive exec: start, stdin, close-send (EOF), events to the exit.
                    client.raw.execSandboxInteractive().use { stream ->
                        val start =
                            exec
                                .toBuilder()
                                .clearCommand()
                                .addCommand("cat")
                                .build()
                        stream.send(
                            Openshell.ExecSandboxInput
                                .newBuilder()
                                .setStart(start)
                                .build(),
                        )
                        stream.send(
                            Openshell.ExecSandboxInput
                                .newBuilder()
                                .setStdin(ByteString.copyFromUtf8("ping"))
                                .build(),
                        )
                        stream.closeSend()
                        val out = StringBuilder()
                        var exit: Int? = null
                        withTimeout(60.seconds) {
                            while (true) {
                                val event = stream.next() ?: break
                                if (event.hasStdout()) out.append(event.stdout.data.toStringUtf8())
                                if (event.hasExit()) exit = event.exit.exitCode
                            }
                        }
                        assertEquals("ping", out.toString())
                        assertEquals(0, exit)
                        assertNull(stream.next())
                    }
                } finally {
                    client.sandboxes.delete(name)
                }
            }
        }

    @Test
    fun `bad input fails with the gateway's code`() =
        runBlocking<Unit> {
            client().use { client ->
                val missing = assertThrows<OpenShellException.NotFound> { client.raw.getSandbox(getRequest(unique("missing"))) }
                assertEquals("not_found", missing.code)
                assertEquals(5, missing.grpcStatus)

                // Bytes that are no GetSandboxRequest (field 1 as a varint, not a
                // string): the server cannot parse it, INTERNAL as gRPC's status
                // code table says for parse errors.
                val undecodable =
                    assertThrows<OpenShellException.Internal> {
                        client.raw.client.unaryBytes("/openshell.v1.OpenShell/GetSandbox", byteArrayOf(0x08, 0x01))
                    }
                assertEquals(13, undecodable.grpcStatus)

                // A path the gateway does not serve.
                val unknown =
                    assertThrows<OpenShellException.Unimplemented> {
                        client.raw.client.unaryBytes("/openshell.v1.OpenShell/NoSuchMethod", ByteArray(0))
                    }
                assertEquals(12, unknown.grpcStatus)
                // A malformed path never leaves the client.
                assertThrows<OpenShellException.InvalidConfig> { client.raw.client.unaryBytes("Health", ByteArray(0)) }
            }
        }

    @Test
    fun `the Java futures`() {
        val async = OpenShellAsyncClient.connect(ClientConfig.builder(TestCluster.endpoint).build()).get(30, TimeUnit.SECONDS)
        async.use {
            val raw = RawStubsAsync.of(async.client)
            val health = raw.health(Openshell.HealthRequest.getDefaultInstance()).get(30, TimeUnit.SECONDS)
            assertEquals(Openshell.ServiceStatus.SERVICE_STATUS_HEALTHY, health.status)
            val failed = assertThrows<ExecutionException> { raw.getSandbox(getRequest(unique("missing"))).get(30, TimeUnit.SECONDS) }
            assertTrue(failed.cause is OpenShellException.NotFound, "${failed.cause}")
        }
    }
}
