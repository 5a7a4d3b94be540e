package dev.openshell.bench

import java.io.File
import java.net.ServerSocket
import java.nio.file.Files
import java.util.concurrent.TimeUnit

/** The contract's inputs (bench/src/contract.rs), from the environment. */
class Inputs(
    val endpoint: String?,
    val token: String?,
    val sandbox: String?,
    val iperfPort: Int,
    val rounds: Int,
    val forwardSeconds: Int,
    val execMiB: Int,
) {
    companion object {
        private fun positive(
            name: String,
            fallback: Int,
        ): Int {
            val value = System.getenv(name)?.takeIf { it.isNotEmpty() } ?: return fallback
            val n = value.toIntOrNull()
            require(n != null && n > 0) { "$name is not a positive number" }
            return n
        }

        fun fromEnv() =
            Inputs(
                endpoint = System.getenv("OPENSHELL_ENDPOINT")?.takeIf { it.isNotEmpty() },
                token = System.getenv("OPENSHELL_TOKEN")?.takeIf { it.isNotEmpty() },
                sandbox = System.getenv("OPENSHELL_BENCH_SANDBOX")?.takeIf { it.isNotEmpty() },
                iperfPort = System.getenv("OPENSHELL_BENCH_IPERF_PORT")?.toIntOrNull() ?: 0,
                rounds = positive("OPENSHELL_BENCH_ROUNDS", 5),
                forwardSeconds = positive("OPENSHELL_BENCH_FORWARD_SECONDS", 3),
                execMiB = positive("OPENSHELL_BENCH_EXEC_MIB", 64),
            )
    }
}

/** `head -c BYTES /dev/zero`: the exec figure's command. */
fun headCommand(bytes: Int) = listOf("head", "-c", bytes.toString(), "/dev/zero")

/** A port free on this host's loopback (closed again at once). */
fun freePort(): Int = ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress()).use { it.localPort }

/** The p-th percentile (0..1) of nanosecond samples, in microseconds. */
fun percentileUs(
    samples: LongArray,
    p: Double,
): Double {
    val sorted = samples.sortedArray()
    return sorted[((sorted.size - 1) * p + 0.5).toInt()] / 1e3
}

fun median(values: List<Double>): Double? {
    if (values.isEmpty()) return null
    val s = values.sorted()
    val mid = s.size / 2
    return if (s.size % 2 == 1) s[mid] else (s[mid - 1] + s[mid]) / 2
}

/**
 * One `iperf3 -c` run (one stream) into 127.0.0.1:[port] for [seconds]:
 * the receiver's Gbit/s.
 */
fun iperf3GbitS(
    port: Int,
    seconds: Int,
): Double {
    val process =
        ProcessBuilder("iperf3", "-c", "127.0.0.1", "-p", port.toString(), "-t", seconds.toString(), "-J")
            .redirectErrorStream(true)
            .start()
    val output = process.inputStream.bufferedReader().readText()
    if (!process.waitFor(seconds + 60L, TimeUnit.SECONDS)) {
        process.destroyForcibly()
        error("iperf3 -c to port $port did not end")
    }
    val received =
        Regex("\"sum_received\"\\s*:\\s*\\{[^}]*\"bits_per_second\"\\s*:\\s*([0-9.eE+-]+)")
            .find(output)
            ?.groupValues
            ?.get(1)
            ?.toDoubleOrNull()
    if (process.exitValue() != 0 || received == null) {
        val why = Regex("\"error\"\\s*:\\s*\"([^\"]*)\"").find(output)?.groupValues?.get(1) ?: "no report"
        error("iperf3 -c to port $port: exit ${process.exitValue()}, $why")
    }
    return received / 1e9
}

/**
 * `openshell-gateway serve --dev` from `$OPENSHELL_BIN_DIR` on a free
 * loopback port (standalone runs): [url] once ready; [close] stops it by its
 * PID (SIGTERM, SIGKILL after 30 s) and removes its directory.
 */
class Gateway private constructor(
    private val process: Process,
    private val dir: File,
    val url: String,
) : AutoCloseable {
    override fun close() {
        process.destroy()
        if (!process.waitFor(30, TimeUnit.SECONDS)) {
            process.destroyForcibly()
            process.waitFor(10, TimeUnit.SECONDS)
        }
        dir.deleteRecursively()
    }

    companion object {
        fun start(): Gateway {
            val bins =
                System.getenv("OPENSHELL_BIN_DIR")?.takeIf { it.isNotEmpty() }
                    ?: error("set OPENSHELL_ENDPOINT, or OPENSHELL_BIN_DIR to the release binaries")
            val dir = Files.createTempDirectory("openshell-jvm-bench-").toFile()
            val ready = File(dir, "ready.json")
            val process =
                ProcessBuilder(
                    File(bins, "openshell-gateway").path,
                    "serve",
                    "--listen",
                    "127.0.0.1:0",
                    "--metrics-listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    File(dir, "data").path,
                    "--ready-file",
                    ready.path,
                    "--stop-sandboxes-on-exit",
                    "--dev",
                ).redirectErrorStream(true)
                    .redirectOutput(File(dir, "gateway.log"))
                    .start()
            val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60)
            while (System.nanoTime() < deadline) {
                val url =
                    ready
                        .takeIf { it.exists() }
                        ?.readText()
                        ?.let { Regex("\"url\"\\s*:\\s*\"([^\"]+)\"").find(it)?.groupValues?.get(1) }
                if (url != null) return Gateway(process, dir, url.trimEnd('/'))
                if (!process.isAlive) {
                    dir.deleteRecursively()
                    error("the gateway exited before it was ready")
                }
                Thread.sleep(50)
            }
            Gateway(process, dir, "").close()
            error("the gateway did not start in 60 s")
        }
    }
}
