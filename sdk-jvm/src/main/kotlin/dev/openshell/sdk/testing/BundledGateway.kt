package dev.openshell.sdk.testing

import java.io.IOException
import java.nio.file.Files
import java.nio.file.Path
import java.nio.file.StandardCopyOption
import java.nio.file.attribute.PosixFilePermissions

/**
 * The gateway executables of the `dev.openshell:openshell-gateway-bin` jar
 * (`openshell-gateway`, `openshell-supervisor`, `openshell-sandbox-init`
 * under `dev/openshell/gateway/<platform>/`, with a `build-id`), unpacked
 * once per build id into `$XDG_CACHE_HOME/openshell/jvm-gateway/<id>/`
 * (`~/.cache` without the variable). The directory appears whole or not at
 * all: it is filled under a temporary name and renamed, so JVMs racing to
 * unpack the same build end up running the same files. Where the cache is
 * not writable the files go to a fresh temporary directory of this JVM.
 */
internal object BundledGateway {
    const val ENV = "OPENSHELL_GATEWAY_BIN"
    private val executables = listOf("openshell-gateway", "openshell-supervisor", "openshell-sandbox-init")
    private val buildId = Regex("[0-9a-f]{8,64}")

    /** `null` when `OPENSHELL_GATEWAY_BIN` names one (the core reads it) or no bundle is on the classpath. */
    fun unlessNamed(): Path? = if (System.getenv(ENV).isNullOrEmpty()) gateway else null

    private val gateway: Path? by lazy { unpack() }

    /** The bundle's platform name for this JVM, or `null` where none is built. */
    private fun platform(): String? {
        if (!System.getProperty("os.name").orEmpty().startsWith("Linux")) return null
        return when (System.getProperty("os.arch")) {
            "amd64", "x86_64" -> "linux-x86-64"
            "aarch64" -> "linux-aarch64"
            else -> null
        }
    }

    private fun unpack(): Path? {
        val base = "/dev/openshell/gateway/${platform() ?: return null}/"
        val id =
            javaClass.getResourceAsStream(base + "build-id")?.use { it.readBytes().toString(Charsets.UTF_8).trim() }
                ?: return null
        check(buildId.matches(id)) { "the bundled gateway's build-id is malformed" }
        val cached = cacheRoot()?.resolve(id) ?: return unpackPrivately(base)
        if (executables.all { Files.isExecutable(cached.resolve(it)) }) return cached.resolve(executables[0])
        val staging =
            try {
                Files.createDirectories(cached.parent)
                Files.createTempDirectory(cached.parent, ".unpack-")
            } catch (_: IOException) {
                return unpackPrivately(base)
            }
        try {
            fill(staging, base)
            try {
                Files.move(staging, cached, StandardCopyOption.ATOMIC_MOVE)
            } catch (e: IOException) {
                // Another JVM renamed its copy first: use that one.
                if (!executables.all { Files.isExecutable(cached.resolve(it)) }) throw e
            }
        } finally {
            staging.toFile().deleteRecursively()
        }
        return cached.resolve(executables[0])
    }

    /** A copy in a fresh temporary directory of this JVM (no writable cache), removed when it exits. */
    private fun unpackPrivately(base: String): Path {
        val dir = Files.createTempDirectory("openshell-gateway-")
        // Deleted in reverse order of registration: the files, then the directory.
        dir.toFile().deleteOnExit()
        executables.forEach { dir.resolve(it).toFile().deleteOnExit() }
        return fill(dir, base).resolve(executables[0])
    }

    private fun fill(
        dir: Path,
        base: String,
    ): Path {
        for (name in executables) {
            val target = dir.resolve(name)
            val stream = javaClass.getResourceAsStream(base + name) ?: error("the bundled gateway lacks $name")
            stream.use { Files.copy(it, target, StandardCopyOption.REPLACE_EXISTING) }
            Files.setPosixFilePermissions(target, PosixFilePermissions.fromString("rwxr-xr-x"))
        }
        return dir
    }

    private fun cacheRoot(): Path? {
        val xdg = System.getenv("XDG_CACHE_HOME")
        val root =
            if (!xdg.isNullOrEmpty()) {
                Path.of(xdg)
            } else {
                System.getProperty("user.home")?.takeIf { it.isNotEmpty() }?.let { Path.of(it, ".cache") } ?: return null
            }
        return root.resolve("openshell").resolve("jvm-gateway")
    }
}
