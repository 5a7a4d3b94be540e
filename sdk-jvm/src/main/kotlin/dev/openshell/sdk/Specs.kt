package dev.openshell.sdk

import dev.openshell.sdk.ffi.CreateSandboxRequest
import dev.openshell.sdk.ffi.ExecRequest

/** A sandbox to create; every field is optional. Java: [SandboxSpec.builder]. */
data class SandboxSpec(
    val name: String? = null,
    val image: String? = null,
    val environment: Map<String, String> = emptyMap(),
    val labels: Map<String, String> = emptyMap(),
) {
    internal fun request() = CreateSandboxRequest(name, image, environment, labels)

    class Builder internal constructor() {
        private var name: String? = null
        private var image: String? = null
        private val environment = linkedMapOf<String, String>()
        private val labels = linkedMapOf<String, String>()

        fun name(name: String?) = apply { this.name = name }

        fun image(image: String?) = apply { this.image = image }

        fun env(
            key: String,
            value: String,
        ) = apply { environment[key] = value }

        fun label(
            key: String,
            value: String,
        ) = apply { labels[key] = value }

        fun build() = SandboxSpec(name, image, environment.toMap(), labels.toMap())
    }

    companion object {
        @JvmStatic
        fun builder(): Builder = Builder()
    }
}

/** A command to run in a sandbox. Java: [ExecSpec.builder]. */
data class ExecSpec(
    val sandbox: String,
    val command: List<String>,
    val workdir: String? = null,
    val environment: Map<String, String> = emptyMap(),
    /** Written to stdin first. */
    val stdin: ByteArray? = null,
    /** Run time limit of the command: the gateway kills it past this (exit 124). */
    val execTimeout: java.time.Duration? = null,
    /** Output cap of a buffered exec, in bytes. */
    val outputLimit: Long? = null,
    /** Run on a pseudo-terminal (stdout and stderr arrive merged, as stdout). */
    val tty: Boolean = false,
    /** The terminal's width, with [tty]. */
    val cols: Int = 0,
    /** The terminal's height, with [tty]. */
    val rows: Int = 0,
) {
    internal fun request() =
        ExecRequest(
            sandbox = sandbox,
            command = command,
            workdir = workdir,
            environment = environment,
            stdin = stdin,
            execTimeoutMs = execTimeout?.toMillis()?.toULong(),
            outputLimit = outputLimit?.toULong(),
            tty = tty,
            cols = cols.coerceAtLeast(0).toUInt(),
            rows = rows.coerceAtLeast(0).toUInt(),
        )

    class Builder internal constructor(
        private val sandbox: String,
        private val command: List<String>,
    ) {
        private var workdir: String? = null
        private val environment = linkedMapOf<String, String>()
        private var stdin: ByteArray? = null
        private var execTimeout: java.time.Duration? = null
        private var outputLimit: Long? = null
        private var tty = false
        private var cols = 0
        private var rows = 0

        fun workdir(dir: String?) = apply { this.workdir = dir }

        fun env(
            key: String,
            value: String,
        ) = apply { environment[key] = value }

        fun stdin(data: ByteArray?) = apply { this.stdin = data }

        fun execTimeout(timeout: java.time.Duration?) = apply { this.execTimeout = timeout }

        fun outputLimit(bytes: Long?) = apply { this.outputLimit = bytes }

        /** A pseudo-terminal of `cols` x `rows`. */
        fun tty(
            cols: Int,
            rows: Int,
        ) = apply {
            this.tty = true
            this.cols = cols
            this.rows = rows
        }

        fun build() = ExecSpec(sandbox, command, workdir, environment.toMap(), stdin, execTimeout, outputLimit, tty, cols, rows)
    }

    companion object {
        @JvmStatic
        fun builder(
            sandbox: String,
            vararg command: String,
        ): Builder = Builder(sandbox, command.toList())

        @JvmStatic
        fun builder(
            sandbox: String,
            command: List<String>,
        ): Builder = Builder(sandbox, command)
    }
}
