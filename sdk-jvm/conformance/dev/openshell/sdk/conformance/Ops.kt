// The runner's ops over the curated Kotlin API: sandboxes, exec, routing.
package dev.openshell.sdk.conformance

import dev.openshell.sdk.ExecSpec
import dev.openshell.sdk.OpenShellClient
import dev.openshell.sdk.ffi.ExecEvent
import java.io.ByteArrayOutputStream
import java.net.InetSocketAddress
import java.net.Socket
import kotlin.time.toJavaDuration

typealias Op = suspend (Runner, Step) -> Result

fun result(vararg pairs: Pair<String, Any?>): Result = linkedMapOf(*pairs)

fun Runner.execSpec(step: Step): ExecSpec {
    val stdin =
        (step["stdin"] as? String)?.toByteArray(Charsets.UTF_8)
            ?: (step["stdin_size"] as? Double)?.let { ByteArray(it.toInt()) }
    return ExecSpec(
        sandbox = target(step),
        command = strings(subst(step["command"])),
        environment = stringMap(step["env"]),
        stdin = stdin,
        execTimeout = seconds(step["exec_timeout"])?.toJavaDuration(),
    )
}

suspend fun execOp(
    r: Runner,
    step: Step,
): Result {
    val out = r.client.exec(r.execSpec(step))
    return result("exit_code" to out.exitCode).apply {
        text("stdout", out.stdout)
        text("stderr", out.stderr)
    }
}

fun Runner.counters(): Map<String, Any?> {
    val stats = client.routingStats()
    return mapOf("hinted" to stats.hinted, "unrouted_retry" to stats.unroutedRetries)
}

/** One request line to the harness's control port; anything but `ok` fails the step. */
fun askHarness(
    control: String,
    request: String,
) {
    val (host, port) = control.substringBeforeLast(':') to control.substringAfterLast(':').toInt()
    Socket().use { socket ->
        socket.connect(InetSocketAddress(host, port), 10_000)
        socket.soTimeout = 30_000
        socket.getOutputStream().write("$request\n".toByteArray())
        val answer = socket.getInputStream().bufferedReader().readLine()
        if (answer == null) throw StepFailed("the harness did not answer '$request'")
        if (answer.trim() != "ok") throw StepFailed("the harness refused '$request': ${answer.trim()}")
    }
}

private suspend fun execStreamOp(
    r: Runner,
    step: Step,
): Result {
    val stdout = ByteArrayOutputStream()
    val stderr = ByteArrayOutputStream()
    var exitCode: Int? = null
    var events = 0
    var exits = 0
    var last: String? = null
    r.client.execStream(r.execSpec(step)).collect { event ->
        events++
        when (event) {
            is ExecEvent.Stdout -> {
                stdout.write(event.data)
                last = "stdout"
            }

            is ExecEvent.Stderr -> {
                stderr.write(event.data)
                last = "stderr"
            }

            is ExecEvent.Exit -> {
                exits++
                exitCode = event.exitCode
                last = "exit"
            }
        }
    }
    return result(
        "exit_code" to exitCode,
        "events" to events,
        "exit_events" to exits,
        "last_event" to last,
    ).apply {
        text("stdout", stdout.toByteArray())
        text("stderr", stderr.toByteArray())
    }
}

private suspend fun unrouteOwnerThenExec(
    r: Runner,
    step: Step,
): Result {
    val control = r.control ?: throw StepFailed("no OPENSHELL_CONFORMANCE_CONTROL")
    val name = r.target(step)
    val owner =
        r.client.sandboxes
            .getWithOwner(name)
            .owner
            ?: throw StepFailed("GetSandbox $name named no owner replica")
    askHarness(control, "unroute $owner")
    val before = r.counters()
    val outcome = runCatching { execOp(r, step) }
    val after = r.counters()
    val restored = runCatching { askHarness(control, "restore") }
    val res = outcome.getOrThrow()
    restored.getOrThrow()
    res["unrouted_replica"] = owner
    res["routing_before"] = before
    res["routing_after"] = after
    return res
}

val BASIC_OPS: Map<String, Op> =
    mapOf(
        "create_sandbox" to { r, step ->
            val sandbox =
                r.client.sandboxes.create(
                    name = r.target(step),
                    environment = r.stringMap(step["env"]),
                    labels = r.stringMap(step["labels"]),
                )
            (step["sandbox"] as? String)?.let { r.forget(it) }
            result("name" to sandbox.name, "phase" to sandbox.phase, "labels" to sandbox.labels)
        },
        "wait_ready" to { r, step ->
            val sandbox = r.client.sandboxes.waitReady(r.target(step), seconds(step["timeout"]))
            result("name" to sandbox.name, "phase" to sandbox.phase)
        },
        "get_sandbox" to { r, step ->
            val sandbox = r.client.sandboxes.get(r.target(step))
            result("name" to sandbox.name, "phase" to sandbox.phase)
        },
        "list_sandboxes" to { r, step ->
            val selector = r.subst(step["label_selector"]) as? String
            result(
                "names" to
                    r.client.sandboxes
                        .list(selector)
                        .map { it.name },
            )
        },
        "delete_sandbox" to { r, step ->
            r.client.sandboxes.delete(r.target(step))
            result()
        },
        "wait_deleted" to { r, step ->
            r.client.sandboxes.waitDeleted(r.target(step), seconds(step["timeout"]))
            result()
        },
        "client_health" to { _, step ->
            OpenShellClient
                .connect(step["endpoint"].toString()) {
                    connectTimeout(java.time.Duration.ofSeconds(2))
                }.use { it.health() }
            result()
        },
        "exec" to ::execOp,
        "exec_stream" to ::execStreamOp,
        "exec_repeat" to { r, step ->
            val runs =
                (0 until number(step["count"])).map {
                    val out = r.client.exec(r.execSpec(step))
                    result("exit_code" to out.exitCode).apply { text("stdout", out.stdout) }
                }
            result("runs" to runs)
        },
        "routing_stats_delta" to { r, step ->
            val before = r.counters()
            repeat(number(step["count"])) { r.client.exec(r.execSpec(step)) }
            result("routing_before" to before, "routing_after" to r.counters())
        },
        "unroute_owner_then_exec" to ::unrouteOwnerThenExec,
    )

/** Every op this runner knows. */
val OPS: Map<String, Op> = BASIC_OPS + STREAM_OPS + FILES_LOGS_OPS + CONFIG_OPS + RAW_OPS
