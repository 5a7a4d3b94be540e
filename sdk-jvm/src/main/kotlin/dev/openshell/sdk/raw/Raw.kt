package dev.openshell.sdk.raw

import com.google.protobuf.InvalidProtocolBufferException
import com.google.protobuf.Message
import com.google.protobuf.Parser
import dev.openshell.sdk.OpenShellAsyncClient
import dev.openshell.sdk.OpenShellClient
import dev.openshell.sdk.ffi.MetadataEntry
import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.ffi.RawCall
import dev.openshell.sdk.millis
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.SupervisorJob
import kotlinx.coroutines.cancel
import kotlinx.coroutines.flow.Flow
import kotlinx.coroutines.flow.flow
import kotlinx.coroutines.future.future
import java.util.concurrent.CompletableFuture
import java.util.concurrent.atomic.AtomicBoolean
import kotlin.time.Duration
import kotlin.time.toKotlinDuration
import dev.openshell.sdk.ffi.OpenShellClient as NativeClient

/**
 * Response metadata of a raw call: headers then trailers, in the order
 * received (a key may repeat). Pass one in [RawCallOptions.responseMetadata];
 * a unary call fills it when it answers.
 */
class ResponseMetadata {
    @Volatile
    var entries: List<MetadataEntry> = emptyList()
        private set

    /** The replica that answered (`x-openshell-served-by`), if it said. */
    @Volatile
    var servedBy: String? = null
        private set

    /** The first value of `key`, or `null`. */
    operator fun get(key: String): String? = entries.firstOrNull { it.key == key }?.value

    /** Every value of `key`. */
    fun all(key: String): List<String> = entries.filter { it.key == key }.map { it.value }

    internal fun fill(
        entries: List<MetadataEntry>,
        servedBy: String?,
    ) {
        this.entries = entries
        this.servedBy = servedBy
    }
}

/**
 * How one raw call is made: request metadata (an `authorization` pair
 * replaces the client's token for this call), a deadline (`null`: the
 * client's default for unary calls, none for streams; `ZERO`: none) and
 * where to put the response metadata.
 */
class RawCallOptions(
    val metadata: List<MetadataEntry> = emptyList(),
    val timeout: Duration? = null,
    val responseMetadata: ResponseMetadata? = null,
) {
    /** Java: `RawCallOptions.builder().metadata("k", "v").timeout(Duration.ofSeconds(5)).build()`. */
    class Builder {
        private val metadata = mutableListOf<MetadataEntry>()
        private var timeout: Duration? = null
        private var responseMetadata: ResponseMetadata? = null

        fun metadata(
            key: String,
            value: String,
        ) = apply { metadata += MetadataEntry(key, value) }

        fun timeout(timeout: java.time.Duration?) = apply { this.timeout = timeout?.toKotlinDuration() }

        fun responseMetadata(sink: ResponseMetadata?) = apply { responseMetadata = sink }

        fun build(): RawCallOptions = RawCallOptions(metadata.toList(), timeout, responseMetadata)
    }

    companion object {
        /** No metadata, the default deadline. */
        @JvmField
        val DEFAULT = RawCallOptions()

        @JvmStatic
        fun builder(): Builder = Builder()

        /** Options with request metadata pairs. */
        fun of(
            vararg pairs: Pair<String, String>,
            timeout: Duration? = null,
            responseMetadata: ResponseMetadata? = null,
        ): RawCallOptions = RawCallOptions(pairs.map { MetadataEntry(it.first, it.second) }, timeout, responseMetadata)
    }
}

private fun <T : Message> Parser<T>.decode(
    path: String,
    bytes: ByteArray,
): T =
    try {
        parseFrom(bytes)
    } catch (e: InvalidProtocolBufferException) {
        throw OpenShellException.Protocol("protocol", "$path: undecodable message: ${e.message}", 2, false, null)
    }

/**
 * Any method of the gateway by path, with protobuf-java messages, through the
 * core's raw boundary (owner routing, hints and the single unrouted retry as
 * in every SDK). [RawStubs] (generated) wraps it with one typed function per
 * RPC.
 */
class RawClient internal constructor(
    private val native: NativeClient,
) {
    /** A unary call; fails with the call's [OpenShellException]. */
    suspend fun <Resp : Message> unary(
        path: String,
        request: Message,
        parser: Parser<Resp>,
        options: RawCallOptions = RawCallOptions.DEFAULT,
    ): Resp {
        val answer = native.rawUnary(path, request.toByteArray(), options.metadata, options.timeout.millis())
        options.responseMetadata?.fill(answer.metadata, answer.servedBy)
        return parser.decode(path, answer.bytes)
    }

    /** A unary call with an encoded request; the encoded response. */
    suspend fun unaryBytes(
        path: String,
        request: ByteArray,
        options: RawCallOptions = RawCallOptions.DEFAULT,
    ): ByteArray {
        val answer = native.rawUnary(path, request, options.metadata, options.timeout.millis())
        options.responseMetadata?.fill(answer.metadata, answer.servedBy)
        return answer.bytes
    }

    /** Opens a stream; nothing is sent until the first [RawStream.send] (or receive). */
    suspend fun <Req : Message, Resp : Message> stream(
        path: String,
        parser: Parser<Resp>,
        options: RawCallOptions = RawCallOptions.DEFAULT,
    ): RawStream<Req, Resp> = RawStream(path, native.rawStream(path, options.metadata, options.timeout.millis()), parser)

    /** A server-streaming call: its one request is sent, the send side closed. */
    suspend fun <Req : Message, Resp : Message> serverStream(
        path: String,
        request: Req,
        parser: Parser<Resp>,
        options: RawCallOptions = RawCallOptions.DEFAULT,
    ): RawStream<Req, Resp> {
        val stream = stream<Req, Resp>(path, parser, options)
        try {
            stream.send(request)
            stream.closeSend()
        } catch (e: Throwable) {
            stream.close()
            throw e
        }
        return stream
    }
}

/**
 * A raw stream of typed messages. [close] (or a failure of [next]) ends it;
 * closing resets the call. Receiving from one coroutine at a time.
 */
class RawStream<Req : Message, Resp : Message> internal constructor(
    private val path: String,
    private val call: RawCall,
    private val parser: Parser<Resp>,
) : AutoCloseable {
    private val closed = AtomicBoolean(false)
    private val scope = CoroutineScope(SupervisorJob() + Dispatchers.Default)

    private fun open(): RawCall {
        if (closed.get()) {
            throw OpenShellException.Cancelled("cancelled", "the stream was closed", 1, false, null)
        }
        return call
    }

    /** Sends one request (waits while the send queue is full). */
    suspend fun send(request: Req) = open().send(request.toByteArray())

    /** No more requests (a half-close). Idempotent. */
    fun closeSend() = open().closeSend()

    /** The next response; `null` once the server ended the stream with OK. */
    suspend fun next(): Resp? = open().next()?.let { parser.decode(path, it) }

    /** The responses; the stream is closed when the flow ends or its collector stops. */
    val messages: Flow<Resp> =
        flow {
            try {
                while (true) emit(next() ?: break)
            } finally {
                close()
            }
        }

    /** Response headers (waits for them). */
    suspend fun responseMetadata(): List<MetadataEntry> = open().responseMetadata()

    /** Trailers, once the stream ended with OK. */
    fun trailers(): List<MetadataEntry>? = open().trailers()

    /** Java: [send] as a future. */
    fun sendAsync(request: Req): CompletableFuture<Void?> =
        scope.future {
            send(request)
            null
        }

    /** Java: [next] as a future (`null` at the end). */
    fun nextAsync(): CompletableFuture<Resp?> = scope.future { next() }

    /** Cancels the call and frees the handle. Idempotent. */
    override fun close() {
        if (closed.compareAndSet(false, true)) {
            call.cancel()
            scope.cancel()
            call.close()
        }
    }
}

/** Typed raw stubs of this client, one suspend function per RPC. */
val OpenShellClient.raw: RawStubs get() = RawStubs(RawClient(native))

/** The Java face of [RawStubs]: every call returns a [CompletableFuture]. */
fun OpenShellAsyncClient.rawAsync(): RawStubsAsync = RawStubsAsync.of(client)

internal fun asyncScope(): CoroutineScope = CoroutineScope(SupervisorJob() + Dispatchers.Default)
