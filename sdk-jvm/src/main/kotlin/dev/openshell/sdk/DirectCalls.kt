package dev.openshell.sdk

import com.sun.jna.Native
import com.sun.jna.Pointer
import dev.openshell.sdk.ffi.FfiConverter
import dev.openshell.sdk.ffi.FfiConverterTypeOpenShellError
import dev.openshell.sdk.ffi.InternalException
import java.lang.ref.Cleaner
import java.lang.ref.Reference
import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.nio.channels.ClosedByInterruptException
import java.nio.channels.spi.AbstractInterruptibleChannel
import java.util.concurrent.atomic.AtomicLong
import dev.openshell.sdk.ffi.OpenShellClient as NativeClient

/**
 * The native library's plain C functions behind [OpenShellBlockingClient]
 * (`bindings/uniffi/src/direct.rs`), bound with JNA's direct mapping: integers,
 * a byte array and a pointer, so no JNA `Structure` and no reflection per call.
 */
@Suppress("ktlint:standard:function-naming") // JNA binds by the C names
private object DirectLib {
    init {
        // The library uniffi's bindings load (their override property, else the
        // same name): JNA keeps one NativeLibrary per name, so this binds to the
        // copy already loaded.
        val name =
            System.getProperty("uniffi.component.openshell_uniffi.libraryOverride")
                ?: "openshell_uniffi"
        Native.register(DirectLib::class.java, name)
    }

    external fun openshell_jvm_call(
        client: Long,
        method: Int,
        args: ByteArray,
        argsLen: Long,
        timeoutMs: Long,
        callId: Long,
    ): Pointer?

    external fun openshell_jvm_cancel(callId: Long)

    external fun openshell_jvm_forget(callId: Long)

    external fun openshell_jvm_reply_free(reply: Pointer?)

    external fun openshell_jvm_release(client: Long)
}

/**
 * One client's blocking calls. Holds a strong reference to the native client
 * (`direct_ref`) while it is open or a call runs: [close] (the client's) makes
 * later calls fail at once and releases the reference when the last running
 * call returns, so a running call never meets a freed client and a closed
 * client's connections end without waiting for garbage collection. A
 * [Cleaner] releases it for a client dropped without `close()`.
 */
internal class DirectCalls(
    native: NativeClient,
) {
    private val ref: Long = native.directRef().toLong()

    /** Calls running, plus [CLOSED] once closed. */
    private val state = AtomicLong(0)

    private val release: Cleaner.Cleanable =
        ref.let { ref -> CLEANER.register(this) { DirectLib.openshell_jvm_release(ref) } }

    /**
     * Runs call [method] with [args] (uniffi's serialization, written by
     * [Args]) and reads its answer with [read]; an [OpenShellException]
     * subclass for the core's errors.
     */
    fun <T> call(
        method: Method,
        args: Args,
        timeoutMs: ULong?,
        read: (ByteBuffer) -> T,
    ): T {
        val entered = state.updateAndGet { if (it and CLOSED != 0L) it else it + 1 }
        check(entered and CLOSED == 0L) { "the client is closed" }
        try {
            return callOpen(method, args, timeoutMs, read)
        } finally {
            if (state.decrementAndGet() == CLOSED) release.clean()
        }
    }

    private fun <T> callOpen(
        method: Method,
        args: Args,
        timeoutMs: ULong?,
        read: (ByteBuffer) -> T,
    ): T {
        val reply =
            CancelOnInterrupt(NEXT_CALL_ID.getAndIncrement()).run { callId ->
                DirectLib.openshell_jvm_call(
                    ref,
                    method.number,
                    args.bytes,
                    args.length.toLong(),
                    timeoutMs?.toLong() ?: -1L,
                    callId,
                )
            } ?: throw InternalException("the native call returned no reply")
        try {
            val length = reply.getLong(0)
            val status = reply.getByte(8).toInt()
            val payload = reply.getByteBuffer(HEADER, length).order(ByteOrder.BIG_ENDIAN)
            return when (status) {
                0 -> read(payload)
                1 -> throw FfiConverterTypeOpenShellError.read(payload)
                else -> throw InternalException(Charsets.UTF_8.decode(payload).toString())
            }
        } finally {
            DirectLib.openshell_jvm_reply_free(reply)
            Reference.reachabilityFence(this)
        }
    }

    /**
     * Later calls throw [IllegalStateException]; calls running end by the
     * client's cancel, and the last of them releases the reference. Idempotent.
     */
    fun close() {
        if (state.getAndUpdate { it or CLOSED } == 0L) release.clean()
    }

    /**
     * Makes a [Thread.interrupt] of the calling thread cancel call [callId]:
     * the JDK's hook for interruptible I/O ([AbstractInterruptibleChannel]'s
     * `begin`/`end`) calls [implCloseChannel] on the interrupting thread. The
     * call then ends `cancelled` (its RPC reset, an exec's process killed) and
     * the thread keeps its interrupt flag, as with grpc-java's blocking stubs.
     */
    private class CancelOnInterrupt(
        private val callId: Long,
    ) : AbstractInterruptibleChannel() {
        private var returned = false
        private var cancelSent = false

        fun <R> run(call: (Long) -> R): R {
            begin()
            try {
                return call(callId)
            } finally {
                synchronized(this) {
                    returned = true
                    // A cancel may have come after the native call ended.
                    if (cancelSent) DirectLib.openshell_jvm_forget(callId)
                }
                try {
                    end(true)
                } catch (_: ClosedByInterruptException) {
                    // The call's own answer stands; the flag stays set.
                }
            }
        }

        override fun implCloseChannel() {
            synchronized(this) {
                if (!returned) {
                    cancelSent = true
                    DirectLib.openshell_jvm_cancel(callId)
                }
            }
        }
    }

    /** The call numbers of `direct.rs`'s `Method`. */
    enum class Method(
        val number: Int,
    ) {
        HEALTH(0),
        CREATE_SANDBOX(1),
        GET_SANDBOX(2),
        GET_SANDBOX_WITH_OWNER(3),
        LIST_SANDBOXES(4),
        DELETE_SANDBOX(5),
        WAIT_READY(6),
        WAIT_DELETED(7),
        EXEC(8),
    }

    /** A call's arguments in uniffi's serialization (big-endian, as it writes). */
    class Args private constructor(
        val bytes: ByteArray,
        val length: Int,
    ) {
        companion object {
            val NONE = Args(ByteArray(0), 0)

            /** One value, written by its generated converter. */
            fun <T> of(
                value: T,
                converter: FfiConverter<T, *>,
            ): Args {
                val buf = ByteBuffer.allocate(converter.allocationSize(value).toInt()).order(ByteOrder.BIG_ENDIAN)
                converter.write(value, buf)
                return Args(buf.array(), buf.position())
            }
        }
    }

    private companion object {
        /** Bytes before a reply's payload: its length (u64), its status (u8). */
        const val HEADER = 9L

        /** Ids of the calls in this process (`direct.rs` keys cancels by them). */
        val NEXT_CALL_ID = AtomicLong(1)

        /** [state]'s closed flag, above any count of calls. */
        const val CLOSED = 1L shl 62
        val CLEANER: Cleaner = Cleaner.create()
    }
}
