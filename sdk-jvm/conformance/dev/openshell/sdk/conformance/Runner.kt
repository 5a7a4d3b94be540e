// The JVM runner of the conformance scenarios (conformance/scenarios.json at
// the repository root): performs every scenario's steps with the Kotlin SDK
// against the cluster at $OPENSHELL_ENDPOINT and prints what it observed, one
// JSON line per step (format: conformance/README.md, "Observations"). It
// never reads a step's `expect`: the harness judges every runner in one place.
//
// Usage: openshell-conformance-jvm [SCENARIOS_JSON] [--only ID ...]
// (the launcher `make conformance-jvm` writes next to the other binaries).
package dev.openshell.sdk.conformance

import com.google.gson.GsonBuilder
import com.google.gson.JsonElement
import com.google.gson.JsonParser
import dev.openshell.sdk.ClientConfig
import dev.openshell.sdk.OpenShellClient
import dev.openshell.sdk.errorClassFor
import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.info
import kotlinx.coroutines.TimeoutCancellationException
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeout
import java.io.File
import java.security.SecureRandom
import kotlin.system.exitProcess
import kotlin.time.Duration.Companion.seconds
import kotlin.time.TimeSource

private val STEP_LIMIT = 120.seconds
private const val TEXT_LIMIT = 4096
private val PLACEHOLDER = Regex("""\$\{([a-z][a-z0-9]*)\}""")
private val GSON = GsonBuilder().serializeNulls().disableHtmlEscaping().create()

/** A step's inputs, parsed JSON: maps, lists, strings, doubles, booleans, nulls. */
typealias Step = Map<String, Any?>

/** A step's `result` fields. */
typealias Result = MutableMap<String, Any?>

/** The runner could not carry the step out (not an SDK error). */
class StepFailed(
    message: String,
) : Exception(message)

fun emit(line: Map<String, Any?>) {
    println(GSON.toJson(line))
    System.out.flush()
}

/** Bytes as reported: lossy UTF-8 of at most 4096 bytes, plus the full length. */
fun Result.text(
    field: String,
    data: ByteArray,
) {
    val shown = if (data.size > TEXT_LIMIT) data.copyOf(TEXT_LIMIT) else data
    this[field] = String(shown, Charsets.UTF_8)
    this[field + "_bytes"] = data.size
}

fun plain(element: JsonElement?): Any? =
    when {
        element == null || element.isJsonNull -> null
        element.isJsonArray -> element.asJsonArray.map { plain(it) }
        element.isJsonObject -> element.asJsonObject.entrySet().associate { (k, v) -> k to plain(v) }
        element.asJsonPrimitive.isBoolean -> element.asBoolean
        element.asJsonPrimitive.isNumber -> element.asDouble
        else -> element.asString
    }

fun toJson(value: Any?): String = GSON.toJson(value)

fun strings(value: Any?): List<String> = (value as? List<*>).orEmpty().map { it.toString() }

fun number(value: Any?): Int = (value as? Double)?.toInt() ?: 0

fun seconds(value: Any?): kotlin.time.Duration? = (value as? Double)?.takeIf { it > 0 }?.seconds

class Scenario(
    val id: String,
    val requires: List<String>,
    val uses: List<String>,
    val steps: List<Step>,
)

class Runner(
    val client: OpenShellClient,
    val runId: String,
    val dataDir: String?,
    val control: String?,
) {
    val prefix = "cf-jvm-$runId-"
    private val named = sortedSetOf<String>()
    private val ready = mutableSetOf<String>()
    val capabilities =
        buildList {
            add("routing_stats")
            if (dataDir != null) add("push_config")
            if (control != null) add("replica_control")
        }

    fun name(alias: String): String = (prefix + alias).also { named.add(it) }

    /** `${alias}` -> that alias's sandbox name, `${run}` -> the run id, in any input. */
    fun subst(value: Any?): Any? =
        when (value) {
            is String -> {
                PLACEHOLDER.replace(value) { m ->
                    val alias = m.groupValues[1]
                    if (alias == "run") runId else name(alias)
                }
            }

            is List<*> -> {
                value.map { subst(it) }
            }

            is Map<*, *> -> {
                value.entries.associate { (k, v) -> subst(k) as String to subst(v) }
            }

            else -> {
                value
            }
        }

    fun stringMap(value: Any?): Map<String, String> =
        (subst(value) as? Map<*, *>).orEmpty().entries.associate { (k, v) -> k.toString() to v.toString() }

    /** The sandbox a step names: a literal `name`, a `sandbox` alias, else `main`. */
    fun target(step: Step): String =
        step["name"]?.let { subst(it).toString() }
            ?: (step["sandbox"] as? String)?.let { name(it) }
            ?: name("main")

    fun forget(alias: String) = ready.remove(alias)

    private suspend fun ensure(alias: String) {
        if (alias in ready) return
        val sandbox = name(alias)
        withTimeout(90.seconds) {
            try {
                client.sandboxes.create(name = sandbox)
            } catch (e: OpenShellException.AlreadyExists) {
                // Created by an earlier scenario: waiting is enough.
            }
            client.sandboxes.waitReady(sandbox)
        }
        ready.add(alias)
    }

    suspend fun run(scenario: Scenario) {
        val missing = scenario.requires.filter { it !in capabilities }
        if (missing.isNotEmpty()) {
            emit(mapOf("type" to "skip", "scenario" to scenario.id, "missing" to missing))
            return
        }
        for (alias in scenario.uses) {
            try {
                ensure(alias)
            } catch (e: Exception) {
                emit(mapOf("type" to "setup", "scenario" to scenario.id, "alias" to alias, "failure" to e.toString()))
                return
            }
        }
        scenario.steps.forEachIndexed { index, step ->
            val started = TimeSource.Monotonic.markNow()
            val outcome = perform(step)
            emit(
                linkedMapOf<String, Any?>(
                    "type" to "step",
                    "scenario" to scenario.id,
                    "step" to index,
                    "op" to step["op"],
                    "ms" to started.elapsedNow().inWholeMilliseconds,
                ) + outcome,
            )
        }
    }

    private suspend fun perform(step: Step): Map<String, Any?> {
        val opName = step["op"] as? String
        val op = OPS[opName] ?: return mapOf("failure" to "this runner does not know op '$opName'")
        return try {
            mapOf("result" to withTimeout(STEP_LIMIT) { op(this@Runner, step) })
        } catch (e: TimeoutCancellationException) {
            mapOf("failure" to "timed out after ${STEP_LIMIT.inWholeSeconds} s")
        } catch (e: OpenShellException) {
            val info = e.info
            mapOf(
                "error" to
                    mapOf(
                        "code" to info.code,
                        "grpc_status" to info.grpcStatus,
                        "message" to e.message,
                        "retryable" to info.retryable,
                        "served_by" to info.servedBy,
                        "class" to e.javaClass.simpleName,
                        "class_for_code" to errorClassFor(info.code).simpleName,
                    ),
            )
        } catch (e: StepFailed) {
            mapOf("failure" to e.message)
        } catch (e: Exception) {
            mapOf("failure" to e.toString())
        }
    }

    suspend fun cleanup() {
        for (sandbox in named) {
            runCatching {
                withTimeout(60.seconds) {
                    client.sandboxes.delete(sandbox)
                    client.sandboxes.waitDeleted(sandbox)
                }
            }
        }
        client.close()
    }
}

private fun randomId(): String {
    val bytes = ByteArray(4).also { SecureRandom().nextBytes(it) }
    return bytes.joinToString("") { "%02x".format(it) }
}

private fun scenarios(file: String): List<Scenario> {
    val doc = JsonParser.parseString(File(file).readText()).asJsonObject
    return doc.getAsJsonArray("scenarios").map { element ->
        val s = element.asJsonObject
        Scenario(
            id = s.get("id").asString,
            requires = strings(plain(s.get("requires"))),
            uses = strings(plain(s.get("uses"))),
            steps =
                (plain(s.get("steps")) as List<*>).map {
                    @Suppress("UNCHECKED_CAST")
                    (it as Step)
                },
        )
    }
}

fun main(args: Array<String>) {
    val at = args.indexOf("--only")
    val only = if (at >= 0) args.drop(at + 1).toSet() else emptySet()
    val positional = if (at >= 0) args.take(at) else args.toList()
    val file = positional.firstOrNull() ?: "conformance/scenarios.json"
    val runId =
        (System.getenv("OPENSHELL_CONFORMANCE_RUN") ?: randomId())
            .lowercase()
            .filter { it in 'a'..'z' || it in '0'..'9' }
            .take(12)
    val code =
        runBlocking {
            val client =
                try {
                    OpenShellClient.connect(ClientConfig.fromEnv().build())
                } catch (e: OpenShellException) {
                    System.err.println("conformance (jvm): $e")
                    return@runBlocking 1
                }
            val runner =
                Runner(
                    client,
                    runId,
                    System.getenv("OPENSHELL_CONFORMANCE_DATA_DIR")?.takeIf { it.isNotEmpty() },
                    System.getenv("OPENSHELL_CONFORMANCE_CONTROL")?.takeIf { it.isNotEmpty() },
                )
            emit(
                mapOf(
                    "type" to "hello",
                    "runner" to "jvm",
                    "run" to runId,
                    "sandbox_prefix" to runner.prefix,
                    "capabilities" to runner.capabilities,
                ),
            )
            try {
                for (scenario in scenarios(file)) {
                    if (only.isEmpty() || scenario.id in only) runner.run(scenario)
                }
            } catch (e: Exception) {
                System.err.println("conformance (jvm): $e")
            } finally {
                runner.cleanup()
            }
            0
        }
    exitProcess(code)
}
