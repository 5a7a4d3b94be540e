package dev.openshell.sdk

import com.sun.jna.CallbackThreadInitializer
import com.sun.jna.Native
import dev.openshell.sdk.ffi.uniffiRustFutureContinuationCallbackImpl

/**
 * Keeps the core's threads attached to the JVM between callbacks.
 *
 * A suspended call is woken by uniffi's continuation callback, called from
 * the core's runtime threads. Without an initializer JNA attaches such a
 * native thread for every callback and detaches it afterwards (a new
 * `java.lang.Thread` each time): `make bench BENCH=jvm` measured GetSandbox
 * p50 1.51x grpc-java that way and 1.17x with the threads kept attached
 * (BENCHMARKS.md). JNA detaches a kept thread when it exits; daemon threads
 * never hold the JVM open.
 */
internal object NativeThreads {
    private val installed: Unit by lazy {
        Native.setCallbackThreadInitializer(
            uniffiRustFutureContinuationCallbackImpl,
            CallbackThreadInitializer(true, false, "openshell-core"),
        )
    }

    /**
     * Idempotent; before the first async call: the companions of every entry
     * point (OpenShellClient, ConfigSession, HostSession, LocalCluster) call it.
     */
    fun install() = installed
}
