// The JVM program of `make bench BENCH=languages` (and `make bench
// BENCH=jvm`): the JVM SDK (the Rust core through uniffi and JNA) against
// grpc-java on the same proto (protoc-gen-grpc-java stubs, and a ForwardTcp
// pump as a grpc-java user writes it), following the per-language contract
// of bench/src/contract.rs.
//
// Inputs (environment): OPENSHELL_ENDPOINT, OPENSHELL_TOKEN (optional),
// OPENSHELL_BENCH_SANDBOX (READY), OPENSHELL_BENCH_IPERF_PORT (an `iperf3 -s`
// on 127.0.0.1 that the sandbox reaches), OPENSHELL_BENCH_ROUNDS (default 5),
// OPENSHELL_BENCH_FORWARD_SECONDS (default 3), OPENSHELL_BENCH_EXEC_MIB
// (default 64). Without OPENSHELL_ENDPOINT it starts `openshell-gateway serve
// --dev` from $OPENSHELL_BIN_DIR, a sandbox and (when iperf3 is on PATH) its
// own `iperf3 -s` inside that sandbox, and stops them (the gateway by PID,
// iperf3 with its exec stream).
//
// Clients: `sdk` (the Kotlin API from coroutines: sandboxes.get, forward,
// execStream), `sdk-java` (the Java facade's CompletableFutures: unary only),
// `sdk-blocking` (OpenShellBlockingClient on the calling thread, and one
// platform thread per concurrent caller: unary only) and `grpc-java`
// (blocking stub for one call at a time, future stub for concurrent callers,
// the blocking stub's iterator for exec, the async stub for the forward
// pump).
//
// Per round, each figure runs the clients in a fresh random order: GetSandbox
// latency (100 batches of 10 per client, interleaved), 100 concurrent callers
// x 20 calls on one client, one iperf3 run through each forward, one exec of
// `head -c` streaming its stdout. Prints a table, then as the last line
// `BENCH_JSON {...}` with the medians over the rounds.
package dev.openshell.bench

import dev.openshell.sdk.ClientConfig
import dev.openshell.sdk.OpenShellAsyncClient
import dev.openshell.sdk.OpenShellBlockingClient
import dev.openshell.sdk.OpenShellClient
import dev.openshell.sdk.ffi.ExecEvent
import dev.openshell.sdk.forward
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.Job
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.coroutineScope
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import java.util.Locale
import java.util.concurrent.CompletableFuture
import kotlin.system.exitProcess
import kotlin.time.Duration.Companion.minutes
import kotlin.time.Duration.Companion.seconds

const val UNARY_WARMUP = 2000
const val UNARY_BATCHES = 100
const val UNARY_BATCH = 10
const val CALLERS = 100
const val CALLS_PER_CALLER = 20

/** One client's ways of calling and its figures of every round. */
class Arm(
    val name: String,
    /** One GetSandbox, as a lone caller makes it. */
    val get: suspend () -> Unit,
    /** [CALLERS] callers x [CALLS_PER_CALLER] calls at once: calls per second. */
    val concurrent: suspend (callers: Int, each: Int) -> Double,
    /** stdout bytes of `head -c`; null: not measured. */
    val exec: (suspend (bytes: Int) -> Int)? = null,
) {
    /** The forward's local port; 0: not measured. */
    var port = 0
    val p50 = mutableListOf<Double>()
    val p99 = mutableListOf<Double>()
    val conc = mutableListOf<Double>()
    val forward = mutableListOf<Double>()
    val execMiB = mutableListOf<Double>()
}

/** Calls per second of [callers] coroutines on Dispatchers.Default, each making [each] calls. */
suspend fun coroutineCallers(
    callers: Int,
    each: Int,
    call: suspend () -> Unit,
): Double {
    val start = System.nanoTime()
    coroutineScope {
        repeat(callers) {
            launch(Dispatchers.Default) { repeat(each) { call() } }
        }
    }
    return callers * each / ((System.nanoTime() - start) / 1e9)
}

/** Calls per second of [callers] platform threads, each making [each] blocking calls. */
fun threadCallers(
    callers: Int,
    each: Int,
    call: () -> Unit,
): Double {
    val failures = java.util.concurrent.ConcurrentLinkedQueue<Throwable>()
    val start = System.nanoTime()
    val threads =
        List(callers) {
            Thread {
                try {
                    repeat(each) { call() }
                } catch (e: Throwable) {
                    failures += e
                }
            }.apply { start() }
        }
    threads.forEach { it.join() }
    val rate = callers * each / ((System.nanoTime() - start) / 1e9)
    failures.peek()?.let { throw it }
    return rate
}

/** Calls per second of [callers] CompletableFuture chains of [each] calls (no thread waits). */
fun <T> futureCallers(
    callers: Int,
    each: Int,
    call: () -> CompletableFuture<T>,
): Double {
    fun chain(left: Int): CompletableFuture<Unit> =
        if (left == 0) CompletableFuture.completedFuture(Unit) else call().thenCompose { chain(left - 1) }
    val start = System.nanoTime()
    CompletableFuture.allOf(*Array(callers) { chain(each) }).join()
    return callers * each / ((System.nanoTime() - start) / 1e9)
}

/**
 * `iperf3 -s` inside [sandbox] (its own loopback: a forward's target), on a
 * port free on this host so it is free in the sandbox without isolation too;
 * the job's cancellation ends the command.
 */
suspend fun iperf3Server(
    scope: CoroutineScope,
    client: OpenShellClient,
    sandbox: String,
): Pair<Int, Job> {
    val port = freePort()
    val listening = CompletableDeferred<Unit>()
    val command = listOf("iperf3", "-s", "--forceflush", "-B", "127.0.0.1", "-p", port.toString())
    val job =
        scope.launch(Dispatchers.Default) {
            val output = StringBuilder()
            try {
                client.execStream(sandbox, command).collect { event ->
                    when (event) {
                        is ExecEvent.Stdout -> {
                            output.append(event.data.toString(Charsets.UTF_8))
                        }

                        is ExecEvent.Stderr -> {
                            output.append(event.data.toString(Charsets.UTF_8))
                        }

                        is ExecEvent.Exit -> {
                            listening.completeExceptionally(
                                IllegalStateException("iperf3 -s exited with ${event.exitCode}: $output"),
                            )
                        }
                    }
                    if (!listening.isCompleted && "Server listening" in output) listening.complete(Unit)
                }
            } catch (e: Throwable) {
                listening.completeExceptionally(e)
                throw e
            }
        }
    try {
        withTimeout(10.seconds) { listening.await() }
    } catch (e: Throwable) {
        job.cancelAndJoin()
        throw e
    }
    return port to job
}

fun main() {
    try {
        runBlocking { bench(Inputs.fromEnv()) }
    } catch (e: Throwable) {
        System.err.println("bench: $e")
        exitProcess(1)
    }
    exitProcess(0)
}

suspend fun bench(inputs: Inputs) =
    coroutineScope {
        val gateway = if (inputs.endpoint == null) Gateway.start() else null
        val endpoint = inputs.endpoint ?: gateway!!.url
        val config =
            ClientConfig
                .builder(endpoint)
                .token(inputs.token)
                .allowCleartextToken(inputs.token != null)
                .build()
        val client = OpenShellClient.connect(config)
        val javaClient = OpenShellAsyncClient.connect(config).join()
        val blockingClient = OpenShellBlockingClient.connect(config)
        var created: String? = null
        var iperf: Job? = null
        val grpc: GrpcJava
        try {
            val sandbox =
                inputs.sandbox ?: run {
                    val sb = client.sandboxes.create(name = "jvm-bench")
                    created = sb.name
                    client.sandboxes.waitReady(sb.name, 2.minutes)
                    sb.name
                }
            var iperfPort = inputs.iperfPort
            if (iperfPort == 0 && ProcessBuilder("sh", "-c", "command -v iperf3").start().waitFor() == 0) {
                val (port, job) = iperf3Server(this, client, sandbox)
                iperfPort = port
                iperf = job
            }
            grpc = GrpcJava(endpoint, inputs.token, sandbox)
            try {
                measure(inputs, client, javaClient, blockingClient, grpc, sandbox, iperfPort)
            } finally {
                grpc.close()
            }
        } finally {
            iperf?.cancelAndJoin()
            created?.let { runCatching { client.sandboxes.delete(it) } }
            javaClient.close()
            blockingClient.close()
            client.close()
            gateway?.close()
        }
    }

suspend fun measure(
    inputs: Inputs,
    client: OpenShellClient,
    javaClient: OpenShellAsyncClient,
    blockingClient: OpenShellBlockingClient,
    grpc: GrpcJava,
    sandbox: String,
    iperfPort: Int,
) {
    val sdk =
        Arm(
            "sdk",
            get = { client.sandboxes.get(sandbox) },
            concurrent = { callers, each -> coroutineCallers(callers, each) { client.sandboxes.get(sandbox) } },
            exec = { bytes ->
                var total = 0
                var exit = -1
                client.execStream(sandbox, headCommand(bytes)).collect { event ->
                    when (event) {
                        is ExecEvent.Stdout -> {
                            total += event.data.size
                        }

                        is ExecEvent.Exit -> {
                            exit = event.exitCode
                        }

                        is ExecEvent.Stderr -> {}
                    }
                }
                check(exit == 0) { "head exited with $exit" }
                total
            },
        )
    val sdkJava =
        Arm(
            "sdk-java",
            get = { javaClient.getSandbox(sandbox).join() },
            concurrent = { callers, each -> futureCallers(callers, each) { javaClient.getSandbox(sandbox) } },
        )
    val sdkBlocking =
        Arm(
            "sdk-blocking",
            get = { blockingClient.getSandbox(sandbox) },
            concurrent = { callers, each -> threadCallers(callers, each) { blockingClient.getSandbox(sandbox) } },
        )
    val native =
        Arm(
            "grpc-java",
            get = { grpc.get() },
            concurrent = { callers, each -> coroutineCallers(callers, each) { grpc.getAsync() } },
            exec = { bytes -> grpc.exec(bytes) },
        )
    val arms = listOf(sdk, sdkJava, sdkBlocking, native)

    val closers = mutableListOf<AutoCloseable>()
    try {
        if (iperfPort > 0) {
            val fwd = client.forward(sandbox, iperfPort)
            closers += fwd
            sdk.port = fwd.localPort
            val pump = grpc.forward(iperfPort)
            closers += pump
            native.port = pump.port
        }
        rounds(inputs, arms)
    } finally {
        closers.forEach { it.close() }
    }
    report(inputs, arms)
}

suspend fun rounds(
    inputs: Inputs,
    arms: List<Arm>,
) {
    // Warm-up: connections, the owner cache, and the JIT (every path is
    // compiled before it is measured).
    for (arm in arms) {
        repeat(UNARY_WARMUP) { arm.get() }
        repeat(3) { arm.concurrent(CALLERS, 5) }
        arm.exec?.invoke(8 shl 20)
        if (arm.port != 0) iperf3GbitS(arm.port, 1)
    }
    val execBytes = inputs.execMiB shl 20
    repeat(inputs.rounds) { round ->
        val latencies = arms.map { LongArray(UNARY_BATCHES * UNARY_BATCH) }
        val filled = IntArray(arms.size)
        repeat(UNARY_BATCHES) {
            for (i in arms.indices.shuffled()) {
                repeat(UNARY_BATCH) {
                    val start = System.nanoTime()
                    arms[i].get()
                    latencies[i][filled[i]++] = System.nanoTime() - start
                }
            }
        }
        arms.forEachIndexed { i, arm ->
            arm.p50 += percentileUs(latencies[i], 0.5)
            arm.p99 += percentileUs(latencies[i], 0.99)
        }
        for (i in arms.indices.shuffled()) {
            arms[i].conc += arms[i].concurrent(CALLERS, CALLS_PER_CALLER)
        }
        for (i in arms.indices.shuffled()) {
            if (arms[i].port == 0) continue
            arms[i].forward += iperf3GbitS(arms[i].port, inputs.forwardSeconds)
        }
        for (i in arms.indices.shuffled()) {
            val exec = arms[i].exec ?: continue
            val start = System.nanoTime()
            val got = exec(execBytes)
            check(got == execBytes) { "${arms[i].name} exec: $got of $execBytes bytes" }
            arms[i].execMiB += inputs.execMiB / ((System.nanoTime() - start) / 1e9)
        }
        System.err.println("jvm: round ${round + 1} of ${inputs.rounds} done")
    }
}

fun report(
    inputs: Inputs,
    arms: List<Arm>,
) {
    println(
        "jvm: JVM SDK vs grpc-java (${System.getProperty("java.vm.name")} ${System.getProperty("java.version")}), " +
            "${inputs.rounds} rounds (medians); per round ${UNARY_BATCHES * UNARY_BATCH} GetSandbox calls per client, " +
            "$CALLERS concurrent callers x $CALLS_PER_CALLER, one iperf3 -t ${inputs.forwardSeconds} per forward, " +
            "one exec of ${inputs.execMiB} MiB stdout",
    )

    fun cell(
        v: Double?,
        digits: Int,
    ) = v?.let { String.format(Locale.ROOT, "%.${digits}f", it) } ?: "-"
    println(
        String.format(Locale.ROOT, "  %-12s %10s %10s %12s %12s %12s", "client", "p50 us", "p99 us", "conc/s", "fwd Gbit/s", "exec MiB/s"),
    )
    val rows = mutableListOf<String>()
    for (arm in arms) {
        val figures =
            listOf(median(arm.p50), median(arm.p99), median(arm.conc), median(arm.forward), median(arm.execMiB))
        println(
            String.format(
                Locale.ROOT,
                "  %-12s %10s %10s %12s %12s %12s",
                arm.name,
                cell(figures[0], 1),
                cell(figures[1], 1),
                cell(figures[2], 0),
                cell(figures[3], 2),
                cell(figures[4], 0),
            ),
        )

        fun json(v: Double?) = v?.toString() ?: "null"
        rows +=
            "{\"client\":\"${arm.name}\",\"unary_p50_us\":${json(figures[0])},\"unary_p99_us\":${json(figures[1])}," +
            "\"concurrent_per_s\":${json(figures[2])},\"forward_gbit_s\":${json(figures[3])}," +
            "\"exec_stdout_mib_s\":${json(figures[4])}}"
    }
    println("BENCH_JSON {\"language\":\"jvm\",\"rows\":[${rows.joinToString(",")}]}")
}
