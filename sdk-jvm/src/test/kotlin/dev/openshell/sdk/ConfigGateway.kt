package dev.openshell.sdk

import java.io.File
import java.nio.file.Files
import java.util.concurrent.TimeUnit

/**
 * One `openshell-gateway serve --dev` replica for the session tests, as the
 * Go and Python suites start it: with `--driver none` (and
 * `--allow-test-flags`) sandboxes get a record and a token file
 * (`<data dir>/sandboxes/<id>/token`) and no supervisor, so the session
 * under test is the sandbox's only one; with `--driver hosts` sandboxes
 * are placed on shared supervisor hosts. Stopped by its PID.
 */
class ConfigGateway private constructor(
    private val process: Process,
    val endpoint: String,
    val dataDir: File,
    private val tmp: File,
) : AutoCloseable {
    /** The sandbox's token, as the gateway keeps it for tests. */
    fun sandboxToken(sandboxId: String): String = File(dataDir, "sandboxes/$sandboxId/token").readText().trim()

    /** Host [hostId]'s token, issued by the real `host-token` subcommand. */
    fun hostToken(hostId: String): String {
        val out = File(tmp, "$hostId.token")
        val issued =
            ProcessBuilder(gatewayBin(), "host-token", "--data-dir", dataDir.path, "--host-id", hostId, "--out", out.path)
                .redirectErrorStream(true)
                .redirectOutput(File(tmp, "host-token.log"))
                .start()
        check(issued.waitFor(60, TimeUnit.SECONDS) && issued.exitValue() == 0) { "host-token failed" }
        return out.readText().trim()
    }

    override fun close() {
        process.destroy()
        if (!process.waitFor(10, TimeUnit.SECONDS)) {
            process.destroyForcibly()
            process.waitFor(10, TimeUnit.SECONDS)
        }
        tmp.deleteRecursively()
    }

    companion object {
        private fun gatewayBin(): String = System.getenv("OPENSHELL_GATEWAY_BIN")?.takeIf { it.isNotEmpty() } ?: "openshell-gateway"

        /** A gateway delivering configuration in [mode] (`push` or `poll`); [driver] `none` or `hosts`. */
        fun start(
            mode: String,
            driver: String = "none",
        ): ConfigGateway {
            val tmp = Files.createTempDirectory("openshell-jvm-cfg-").toFile()
            val ready = File(tmp, "ready.json")
            val data = File(tmp, "data")
            val args =
                mutableListOf(
                    gatewayBin(),
                    "serve",
                    "--dev",
                    "--listen",
                    "127.0.0.1:0",
                    "--metrics-listen",
                    "127.0.0.1:0",
                    "--data-dir",
                    data.path,
                    "--ready-file",
                    ready.path,
                    "--config-delivery-mode",
                    mode,
                    "--driver",
                    driver,
                )
            if (driver == "none") args += "--allow-test-flags"
            val process =
                ProcessBuilder(args)
                    .redirectErrorStream(true)
                    .redirectOutput(File(tmp, "serve.log"))
                    .start()
            val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(90)
            while (System.nanoTime() < deadline) {
                val url =
                    runCatching { Regex("\"url\"\\s*:\\s*\"([^\"]+)\"").find(ready.readText())?.groupValues?.get(1) }
                        .getOrNull()
                if (url != null) return ConfigGateway(process, url.trimEnd('/'), data, tmp)
                if (!process.isAlive) {
                    val log = runCatching { File(tmp, "serve.log").readText().takeLast(2000) }.getOrDefault("")
                    tmp.deleteRecursively()
                    error("the gateway exited before it was ready: $log")
                }
                Thread.sleep(50)
            }
            process.destroyForcibly()
            tmp.deleteRecursively()
            error("the gateway did not start in 90 s")
        }
    }
}
