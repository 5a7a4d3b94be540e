package dev.openshell.sdk

import dev.openshell.sdk.ffi.OpenShellException

/** The fields every [OpenShellException] carries, whatever its class. */
data class ErrorInfo(
    /** The core's stable code (`not_found`, `unavailable`, ...), as every SDK reports it. */
    val code: String,
    /** What went wrong (never a token). */
    val detail: String,
    /** The gRPC status code (0-16; `2` for errors that are not a call's status). */
    val grpcStatus: Int,
    /** Whether the same call may succeed if tried again. */
    val retryable: Boolean,
    /** The replica that answered, when it said. */
    val servedBy: String?,
)

/**
 * The error's fields without matching its class first: every subclass of the
 * sealed hierarchy carries the same five, generated as properties of each.
 */
val OpenShellException.info: ErrorInfo
    get() {
        fun <T> field(name: String): T {
            @Suppress("UNCHECKED_CAST")
            return javaClass.getMethod(name).invoke(this) as T
        }
        return ErrorInfo(field("getCode"), field("getDetail"), field("getGrpcStatus"), field("getRetryable"), field("getServedBy"))
    }

/** The subclasses of [OpenShellException], by the code each stands for. */
private val CLASSES: Map<String, Class<out OpenShellException>> =
    OpenShellException::class.java.classes
        .filter { OpenShellException::class.java.isAssignableFrom(it) && it != OpenShellException::class.java }
        .associate { cls ->
            val code = cls.simpleName.replace(Regex("(?<=[a-z])(?=[A-Z])"), "_").lowercase()
            @Suppress("UNCHECKED_CAST")
            code to (cls as Class<out OpenShellException>)
        }

/**
 * The exception class the SDK raises for a core code (`not_found` ->
 * `OpenShellException.NotFound`); codes the SDK does not know -> `Other`.
 */
fun errorClassFor(code: String): Class<out OpenShellException> = CLASSES[code] ?: OpenShellException.Other::class.java
