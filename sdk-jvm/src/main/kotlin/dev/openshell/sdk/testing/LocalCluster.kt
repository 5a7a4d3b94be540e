package dev.openshell.sdk.testing

import dev.openshell.sdk.ClientConfig
import dev.openshell.sdk.NativeThreads
import dev.openshell.sdk.OpenShellBlockingClient
import dev.openshell.sdk.OpenShellClient
import dev.openshell.sdk.ffi.ClusterFault
import dev.openshell.sdk.ffi.LocalClusterConfig
import dev.openshell.sdk.ffi.OpenShellException
import kotlinx.coroutines.runBlocking
import java.nio.file.Path
import kotlin.time.Duration
import dev.openshell.sdk.ffi.LocalCluster as NativeCluster

/**
 * The reference gateway's developer cluster for your tests
 * (`openshell-gateway up`): [Options.replicas] replicas behind an edge on a
 * free loopback port, a fresh data directory, optionally shared supervisor
 * hosts, and faults on demand (replicas stopped, killed and started, the
 * edge's route to a replica cut, the edge restarted, hosts killed, the store
 * slowed or cut). [close] stops every process by PID and removes the
 * directory; a JVM that dies (even by SIGKILL) takes the cluster with it.
 *
 * The executable is [Options.gatewayBin], else `OPENSHELL_GATEWAY_BIN`, else
 * the one in the `dev.openshell:openshell-gateway-bin` jar when it is on the
 * classpath (unpacked once per build into a cache directory), else
 * `openshell-gateway` on `PATH`.
 *
 * Kotlin: suspend functions. Java: [startBlocking], [blockingClient] and
 * [faultBlocking] / [ownerOfBlocking].
 */
class LocalCluster private constructor(
    private val native: NativeCluster,
) : AutoCloseable {
    /** The edge's endpoint (`http://127.0.0.1:PORT`): what clients dial. */
    val endpoint: String = native.endpoint()

    /** The cluster's data directory (store, sandboxes, logs under `up/`). */
    val dataDir: Path = Path.of(native.dataDir())

    /** The replicas' ids (`gw-0`, ...). */
    val replicaIds: List<String> = native.replicaIds()

    /** The shared hosts' ids (`h-0`, ...; empty without [Options.hosts]). */
    val hostIds: List<String> = native.hostIds()

    /** A client of this cluster; `configure` sets the rest of its config. */
    suspend fun client(configure: ClientConfig.Builder.() -> Unit = {}): OpenShellClient = OpenShellClient.connect(endpoint, configure)

    /** A blocking client of this cluster (for Java). */
    @Throws(OpenShellException::class)
    fun blockingClient(): OpenShellBlockingClient = OpenShellBlockingClient.connect(ClientConfig.builder(endpoint).build())

    /** The replica holding the sandbox's session (`null` while none does). */
    suspend fun ownerOf(sandbox: String): String? = native.ownerOf(sandbox)

    /** [ownerOf] on the calling thread (for Java). */
    @Throws(OpenShellException::class)
    fun ownerOfBlocking(sandbox: String): String? = runBlocking { ownerOf(sandbox) }

    /**
     * Carries out one fault and returns once `up` has; an unknown replica
     * or host fails with `InvalidConfig`. The named ones below are shorthands.
     */
    suspend fun fault(fault: ClusterFault) = native.fault(fault)

    /** [fault] on the calling thread (for Java). */
    @Throws(OpenShellException::class)
    fun faultBlocking(fault: ClusterFault) = runBlocking { fault(fault) }

    /** SIGTERM: the replica drains and redirects its sessions to the others. */
    suspend fun stopReplica(id: String) = fault(ClusterFault.StopReplica(id))

    /** SIGKILL: its sessions move once their supervisors notice. */
    suspend fun killReplica(id: String) = fault(ClusterFault.KillReplica(id))

    suspend fun startReplica(id: String) = fault(ClusterFault.StartReplica(id))

    /** The edge stops routing to the replica (the replica keeps running). */
    suspend fun cutRoute(id: String) = fault(ClusterFault.CutRoute(id))

    suspend fun restoreRoute(id: String) = fault(ClusterFault.RestoreRoute(id))

    /** Stops the edge and starts it again on the same port. */
    suspend fun restartEdge() = fault(ClusterFault.RestartEdge)

    /** SIGKILL to a shared host: its sandboxes lose their supervisor. */
    suspend fun killHost(id: String) = fault(ClusterFault.KillHost(id))

    suspend fun startHost(id: String) = fault(ClusterFault.StartHost(id))

    /** Every store operation waits [delay] first, until [restoreStore]. */
    suspend fun slowStore(delay: Duration) = fault(ClusterFault.SlowStore(delay.inWholeMilliseconds.coerceAtLeast(0).toULong()))

    /** Every store operation fails, until [restoreStore]. */
    suspend fun cutStore() = fault(ClusterFault.CutStore)

    suspend fun restoreStore() = fault(ClusterFault.RestoreStore)

    /** Stops every process and removes the data directory. Idempotent. */
    suspend fun stop() = native.stop()

    override fun close() {
        try {
            runBlocking { native.stop() }
        } finally {
            native.close()
        }
    }

    /** How to start a cluster. Java: [Options.builder]. */
    data class Options(
        /** Gateway replicas (`gw-0`..), at least 1. */
        val replicas: Int = 3,
        /** Shared supervisor hosts (`h-0`..); 0 runs one supervisor per sandbox. */
        val hosts: Int = 0,
        /** `push` or `poll`. */
        val configDelivery: String = "push",
        /** `auto`, `namespaces` or `none` (the gateway's `--isolation`). */
        val isolation: String = "auto",
        /** Start a process that dies unasked again (off: a test sees the crash). */
        val restartCrashed: Boolean = false,
        /** The `openshell-gateway` executable (its `openshell-supervisor` beside it). */
        val gatewayBin: Path? = null,
    ) {
        internal fun config(): LocalClusterConfig {
            require(replicas > 0) { "replicas must be at least 1" }
            require(hosts >= 0) { "hosts must not be negative" }
            return LocalClusterConfig(
                replicas = replicas.toUInt(),
                hosts = hosts.toUInt(),
                configDelivery = configDelivery,
                isolation = isolation,
                restartCrashed = restartCrashed,
                gatewayBin = (gatewayBin ?: BundledGateway.unlessNamed())?.toString(),
            )
        }

        class Builder internal constructor() {
            private var options = Options()

            fun replicas(n: Int) = apply { options = options.copy(replicas = n) }

            fun hosts(n: Int) = apply { options = options.copy(hosts = n) }

            fun configDelivery(mode: String) = apply { options = options.copy(configDelivery = mode) }

            fun isolation(mode: String) = apply { options = options.copy(isolation = mode) }

            fun restartCrashed(restart: Boolean) = apply { options = options.copy(restartCrashed = restart) }

            fun gatewayBin(path: Path?) = apply { options = options.copy(gatewayBin = path) }

            fun build() = options
        }

        companion object {
            @JvmStatic
            fun builder() = Builder()
        }
    }

    companion object {
        init {
            NativeThreads.install()
        }

        /** Starts a cluster and waits until it serves. */
        suspend fun start(options: Options = Options()): LocalCluster = LocalCluster(NativeCluster.start(options.config()))

        suspend fun start(replicas: Int): LocalCluster = start(Options(replicas = replicas))

        /** [start] for Java, blocking the calling thread. */
        @JvmStatic
        @Throws(OpenShellException::class)
        fun startBlocking(options: Options): LocalCluster = runBlocking { start(options) }

        @JvmStatic
        @JvmOverloads
        @Throws(OpenShellException::class)
        fun startBlocking(replicas: Int = 3): LocalCluster = startBlocking(Options(replicas = replicas))
    }
}
