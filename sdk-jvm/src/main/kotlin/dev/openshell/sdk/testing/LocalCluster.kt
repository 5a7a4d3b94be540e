package dev.openshell.sdk.testing

import dev.openshell.sdk.NativeThreads
import kotlinx.coroutines.runBlocking
import dev.openshell.sdk.ffi.LocalCluster as NativeCluster

/**
 * The reference gateway's developer cluster for tests (`openshell-gateway
 * up`: replicas behind an edge, on a free loopback port). The executable
 * comes from `OPENSHELL_GATEWAY_BIN`, else `PATH`. [close] stops every
 * process; so does the JVM exiting.
 */
class LocalCluster private constructor(
    private val native: NativeCluster,
) : AutoCloseable {
    /** The edge's endpoint. */
    val endpoint: String = native.endpoint()

    /** The replicas' ids (`gw-0`, ...). */
    val replicaIds: List<String> = native.replicaIds()

    /** The replica holding the sandbox's session. */
    suspend fun ownerOf(sandbox: String): String? = native.ownerOf(sandbox)

    suspend fun stop() = native.stop()

    override fun close() {
        runBlocking { native.stop() }
        native.close()
    }

    companion object {
        init {
            NativeThreads.install()
        }

        suspend fun start(replicas: Int = 3): LocalCluster {
            require(replicas > 0) { "replicas must be at least 1" }
            return LocalCluster(NativeCluster.start(replicas.toUInt()))
        }

        /** [start] for Java, blocking the calling thread. */
        @JvmStatic
        @JvmOverloads
        fun startBlocking(replicas: Int = 3): LocalCluster = runBlocking { start(replicas) }
    }
}
