// The interactive and forward ops of scenarios.json.
package dev.openshell.sdk.conformance

import dev.openshell.sdk.ExecSpec
import dev.openshell.sdk.ffi.ExecEvent
import dev.openshell.sdk.forward
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.channels.ReceiveChannel
import kotlinx.coroutines.coroutineScope
import kotlinx.coroutines.delay
import kotlinx.coroutines.flow.produceIn
import kotlinx.coroutines.launch
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeoutOrNull
import java.io.ByteArrayOutputStream
import java.io.File
import java.net.InetSocketAddress
import java.net.Socket
import java.security.SecureRandom
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds

/** How long the echo server may take to say it listens. */
private val LISTENING_WITHIN = 20.seconds

private suspend fun interactiveOp(
    r: Runner,
    step: Step,
): Result {
    val tty = step["tty"] == true
    val spec =
        ExecSpec(
            sandbox = r.target(step),
            command = strings(r.subst(step["command"])),
            tty = tty,
            cols = if (tty) (step["cols"] as? Double)?.toInt() ?: 80 else 0,
            rows = if (tty) (step["rows"] as? Double)?.toInt() ?: 24 else 0,
        )
    val output = ByteArrayOutputStream()
    val stdout = ByteArrayOutputStream()
    var exitCode: Int? = null

    fun take(event: ExecEvent) {
        when (event) {
            is ExecEvent.Stdout -> {
                output.write(event.data)
                stdout.write(event.data)
            }

            is ExecEvent.Stderr -> {
                output.write(event.data)
            }

            is ExecEvent.Exit -> {
                exitCode = event.exitCode
            }
        }
    }
    r.client.execInteractive(spec).use { process ->
        coroutineScope {
            val events: ReceiveChannel<ExecEvent> = process.events.produceIn(this)
            for (action in (step["actions"] as? List<*>).orEmpty().map { it as Map<*, *> }) {
                when {
                    action["wait_output"] != null -> {
                        val wanted = action["wait_output"].toString().toByteArray()
                        while (!output.toByteArray().contains(wanted)) {
                            val event = events.receiveCatching().getOrNull()
                            if (event == null || event is ExecEvent.Exit) {
                                event?.let(::take)
                                throw StepFailed("the process ended before '${String(wanted)}'")
                            }
                            take(event)
                        }
                    }

                    action["resize"] != null -> {
                        val size = action["resize"] as List<*>
                        if (size.size == 2) process.resize(number(size[0]), number(size[1]))
                    }

                    action["write"] != null -> {
                        process.write(action["write"].toString())
                    }

                    action["close_stdin"] == true -> {
                        process.closeStdin()
                    }
                }
            }
            for (event in events) take(event)
        }
    }
    return result("exit_code" to exitCode).apply {
        text("stdout", stdout.toByteArray())
        text("output", output.toByteArray())
    }
}

private fun ByteArray.contains(part: ByteArray): Boolean {
    if (part.isEmpty()) return true
    return (0..size - part.size).any { at -> part.indices.all { this[at + it] == part[it] } }
}

/** testkit/scripts/sandbox-echo.py, from the checkout the launcher names. */
private fun echoScript(): String {
    val root = System.getProperty("openshell.repo") ?: throw StepFailed("no -Dopenshell.repo to find testkit/scripts/sandbox-echo.py in")
    return File(root, "testkit/scripts/sandbox-echo.py").readText()
}

/**
 * Starts the echo server in the sandbox through an exec stream (the sandbox
 * has a network of its own, so 127.0.0.1 is its loopback) and returns the
 * port of its `listening PORT` line; the channel's consumer (this op) ends
 * the stream, which kills the server.
 */
private suspend fun startEcho(events: ReceiveChannel<ExecEvent>): Int {
    val stdout = ByteArrayOutputStream()

    suspend fun firstLine(): String {
        while (true) {
            when (val event = events.receive()) {
                is ExecEvent.Exit -> {
                    throw StepFailed("the echo server exited with ${event.exitCode}")
                }

                is ExecEvent.Stdout -> {
                    stdout.write(event.data)
                }

                is ExecEvent.Stderr -> {}
            }
            val text = stdout.toString(Charsets.UTF_8)
            if ('\n' in text) return text.substringBefore('\n')
        }
    }
    val line =
        withTimeoutOrNull(LISTENING_WITHIN) { firstLine() }
            ?: throw StepFailed("the echo server did not listen within $LISTENING_WITHIN")
    return line.removePrefix("listening ").toIntOrNull()?.takeIf { line.startsWith("listening ") }
        ?: throw StepFailed("the echo server said '$line'")
}

/** One connection: sends the payload, half-closes, reads everything back. */
private fun echoOnce(
    port: Int,
    payload: ByteArray,
): Boolean =
    runCatching {
        Socket().use { socket ->
            socket.connect(InetSocketAddress("127.0.0.1", port), 10_000)
            socket.soTimeout = 60_000
            val writer =
                Thread {
                    runCatching {
                        socket.getOutputStream().write(payload)
                        socket.shutdownOutput()
                    }
                }.apply { start() }
            val got = socket.getInputStream().readBytes()
            writer.join(60_000)
            got.contentEquals(payload)
        }
    }.getOrDefault(false)

private suspend fun forwardOp(
    r: Runner,
    step: Step,
): Result {
    val sandbox = r.target(step)
    step["remote_port"]?.let { port ->
        r.client.forward(sandbox, number(port)).close()
        return result()
    }
    return coroutineScope {
        val echo = r.client.execStream(ExecSpec(sandbox, listOf("python3", "-c", echoScript()))).produceIn(this)
        try {
            val port = startEcho(echo)
            // Keep draining the server's events while the forward runs.
            val drain = launch { for (ignored in echo) Unit }
            val size = number(step["bytes_per_connection"])
            val forward = r.client.forward(sandbox, port)
            val (echoed, accepted) =
                forward.use {
                    val echoed =
                        (0 until number(step["connections"]))
                            .map { i ->
                                async(Dispatchers.IO) {
                                    val payload = ByteArray(size).also { SecureRandom().nextBytes(it) }
                                    if (size > 0) payload[size - 1] = (i % 256).toByte()
                                    echoOnce(forward.localPort, payload)
                                }
                            }.awaitAll()
                    echoed to forward.stats().connectionsAccepted
                }
            val refuses = refusesWithin(forward.localPort)
            drain.cancelAndJoin()
            result("echoed" to echoed, "accepted" to accepted, "closed_refuses" to refuses)
        } finally {
            echo.cancel()
        }
    }
}

/** Whether a closed forward's port refuses connections (it closes asynchronously: up to 5 s). */
private suspend fun refusesWithin(port: Int): Boolean =
    withContext(Dispatchers.IO) {
        repeat(100) {
            val connected =
                runCatching { Socket().use { it.connect(InetSocketAddress("127.0.0.1", port), 1_000) } }.isSuccess
            if (!connected) return@withContext true
            delay(50.milliseconds)
        }
        false
    }

val STREAM_OPS: Map<String, Op> =
    mapOf(
        "interactive" to ::interactiveOp,
        "forward" to ::forwardOp,
    )
