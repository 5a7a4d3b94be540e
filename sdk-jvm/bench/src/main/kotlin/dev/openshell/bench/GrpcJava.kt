package dev.openshell.bench

import com.google.common.util.concurrent.ListenableFuture
import com.google.common.util.concurrent.MoreExecutors
import com.google.protobuf.ByteString
import io.grpc.ManagedChannel
import io.grpc.ManagedChannelBuilder
import io.grpc.Metadata
import io.grpc.stub.ClientCallStreamObserver
import io.grpc.stub.ClientResponseObserver
import io.grpc.stub.MetadataUtils
import kotlinx.coroutines.suspendCancellableCoroutine
import openshell.v1.OpenShellGrpc
import openshell.v1.Openshell.ExecSandboxEvent
import openshell.v1.Openshell.ExecSandboxRequest
import openshell.v1.Openshell.GetSandboxRequest
import openshell.v1.Openshell.TcpForwardFrame
import openshell.v1.Openshell.TcpForwardInit
import openshell.v1.Openshell.TcpRelayTarget
import java.io.IOException
import java.net.InetAddress
import java.net.ServerSocket
import java.net.Socket
import java.util.concurrent.CountDownLatch
import java.util.concurrent.ExecutionException
import java.util.concurrent.TimeUnit
import kotlin.concurrent.thread
import kotlin.coroutines.resume
import kotlin.coroutines.resumeWithException

/** The core's forward frame size. */
const val FRAME_SIZE = 64 * 1024

/**
 * grpc-java on the same proto (protoc and protoc-gen-grpc-java at build
 * time): one channel, the generated blocking, future and async stubs, the
 * way a grpc-java user calls them.
 */
class GrpcJava(
    endpoint: String,
    token: String?,
    private val sandbox: String,
) : AutoCloseable {
    val channel: ManagedChannel

    init {
        require(endpoint.startsWith("http://")) { "the benchmark's grpc-java client speaks cleartext only" }
        var builder = ManagedChannelBuilder.forTarget(endpoint.removePrefix("http://")).usePlaintext()
        if (token != null) {
            val headers = Metadata()
            headers.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER), "Bearer $token")
            builder = builder.intercept(MetadataUtils.newAttachHeadersInterceptor(headers))
        }
        channel = builder.build()
    }

    private val blocking = OpenShellGrpc.newBlockingStub(channel)
    private val future = OpenShellGrpc.newFutureStub(channel)
    private val async = OpenShellGrpc.newStub(channel)
    private val getRequest = GetSandboxRequest.newBuilder().setName(sandbox).build()

    /** GetSandbox through the blocking stub (on the calling thread). */
    fun get() {
        blocking.getSandbox(getRequest)
    }

    /** GetSandbox through the future stub, awaited (for many callers at once). */
    suspend fun getAsync() {
        future.getSandbox(getRequest).await()
    }

    /** ExecSandbox through the blocking stub's iterator: stdout bytes. */
    fun exec(bytes: Int): Int {
        val request =
            ExecSandboxRequest
                .newBuilder()
                .setSandbox(sandbox)
                .addAllCommand(headCommand(bytes))
                .build()
        var total = 0
        var exit = -1
        for (event in blocking.execSandbox(request)) {
            when (event.payloadCase) {
                ExecSandboxEvent.PayloadCase.STDOUT -> {
                    total += event.stdout.data.size()
                }

                ExecSandboxEvent.PayloadCase.EXIT -> {
                    exit = event.exit.exitCode
                }

                else -> {}
            }
        }
        check(exit == 0) { "exec ended with exit $exit" }
        return total
    }

    /** A forward to [port] in the sandbox, pumped by [GrpcForward]. */
    fun forward(port: Int) = GrpcForward(async, sandbox, port)

    override fun close() {
        channel.shutdownNow()
        channel.awaitTermination(10, TimeUnit.SECONDS)
    }
}

/** Waits for a Guava future without holding a thread; cancelling the coroutine cancels the call. */
suspend fun <T> ListenableFuture<T>.await(): T =
    suspendCancellableCoroutine { cont ->
        addListener({
            try {
                cont.resume(get())
            } catch (e: ExecutionException) {
                cont.resumeWithException(e.cause ?: e)
            }
        }, MoreExecutors.directExecutor())
        cont.invokeOnCancellation { cancel(true) }
    }

/**
 * grpc-java's forward as its user writes it: a local listener whose
 * connections are each pumped over one ForwardTcp stream (async stub), one
 * reading thread per connection that sends 64 KiB data frames while the
 * stream is ready (grpc-java's outbound flow control), the received frames
 * written to the socket from grpc's callback (its inbound flow control:
 * the next frame is requested once the write returns). Local EOF
 * half-closes the stream, the gateway's eof frame half-closes the
 * connection, the stream's end ends it.
 */
class GrpcForward(
    private val stub: OpenShellGrpc.OpenShellStub,
    private val sandbox: String,
    private val target: Int,
) : AutoCloseable {
    private val server = ServerSocket(0, 50, InetAddress.getLoopbackAddress())
    val port: Int = server.localPort

    init {
        thread(isDaemon = true, name = "grpc-forward-accept") {
            while (true) {
                val socket =
                    try {
                        server.accept()
                    } catch (_: IOException) {
                        break
                    }
                thread(isDaemon = true, name = "grpc-forward-pump") { pump(socket) }
            }
        }
    }

    private fun pump(socket: Socket) {
        socket.tcpNoDelay = true
        val ended = CountDownLatch(1)
        val ready = Object()
        val output = socket.getOutputStream()
        lateinit var requests: ClientCallStreamObserver<TcpForwardFrame>
        val responses =
            object : ClientResponseObserver<TcpForwardFrame, TcpForwardFrame> {
                override fun beforeStart(stream: ClientCallStreamObserver<TcpForwardFrame>) {
                    requests = stream
                    stream.setOnReadyHandler { synchronized(ready) { ready.notifyAll() } }
                }

                override fun onNext(frame: TcpForwardFrame) {
                    try {
                        when (frame.payloadCase) {
                            TcpForwardFrame.PayloadCase.DATA -> {
                                frame.data.writeTo(output)
                            }

                            TcpForwardFrame.PayloadCase.EOF -> {
                                socket.shutdownOutput()
                            }

                            else -> {}
                        }
                    } catch (e: IOException) {
                        requests.cancel("the local connection failed", e)
                    }
                }

                override fun onError(t: Throwable) = end()

                override fun onCompleted() = end()

                private fun end() {
                    ended.countDown()
                    socket.close()
                    synchronized(ready) { ready.notifyAll() }
                }
            }
        stub.forwardTcp(responses)
        val init =
            TcpForwardInit
                .newBuilder()
                .setSandbox(sandbox)
                .setTcp(TcpRelayTarget.newBuilder().setHost("127.0.0.1").setPort(target))
        requests.onNext(TcpForwardFrame.newBuilder().setInit(init).build())
        val input = socket.getInputStream()
        val buffer = ByteArray(FRAME_SIZE)
        try {
            while (true) {
                val n = input.read(buffer)
                if (n < 0) {
                    requests.onCompleted()
                    break
                }
                synchronized(ready) {
                    while (!requests.isReady && ended.count > 0) ready.wait(100)
                }
                if (ended.count == 0L) break
                requests.onNext(TcpForwardFrame.newBuilder().setData(ByteString.copyFrom(buffer, 0, n)).build())
            }
        } catch (e: IOException) {
            if (ended.count > 0) requests.cancel("the local connection failed", e)
        }
        ended.await(60, TimeUnit.SECONDS)
        socket.close()
    }

    override fun close() = server.close()
}
