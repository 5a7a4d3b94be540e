package dev.openshell.sdk

import dev.openshell.sdk.ffi.ClientOptions
import dev.openshell.sdk.ffi.TokenSource

/**
 * How to reach a gateway. Built with [builder] (Java and Kotlin) or read
 * from the environment with [fromEnv]: `OPENSHELL_ENDPOINT` (default
 * `http://127.0.0.1:17670`, `make up`'s dev cluster) and `OPENSHELL_TOKEN`.
 *
 * Tokens never appear in [toString].
 */
class ClientConfig private constructor(
    builder: Builder,
) {
    val endpoint: String = builder.endpoint
    internal val token: String? = builder.token
    internal val tokenSource: TokenSource? = builder.tokenSource
    val caPem: ByteArray? = builder.caPem
    val tlsServerName: String? = builder.tlsServerName
    val ownerRouting: Boolean = builder.ownerRouting
    val connectTimeout: java.time.Duration? = builder.connectTimeout
    val defaultTimeout: java.time.Duration? = builder.defaultTimeout
    val execOutputLimit: Long? = builder.execOutputLimit
    val allowCleartextToken: Boolean = builder.allowCleartextToken

    internal fun options(): ClientOptions =
        ClientOptions(
            endpoint = endpoint,
            token = token,
            caPem = caPem,
            tlsServerName = tlsServerName,
            ownerRouting = ownerRouting,
            connectTimeoutMs = connectTimeout?.toMillis()?.toULong(),
            defaultTimeoutMs = defaultTimeout?.toMillis()?.toULong(),
            execOutputLimit = execOutputLimit?.toULong(),
            allowCleartextToken = allowCleartextToken,
        )

    override fun toString(): String =
        "ClientConfig(endpoint=$endpoint, token=${if (token != null || tokenSource != null) "<set>" else "none"}, " +
            "ownerRouting=$ownerRouting)"

    /** A mutable builder; every setter returns it. */
    class Builder internal constructor(
        internal var endpoint: String,
    ) {
        internal var token: String? = null
        internal var tokenSource: TokenSource? = null
        internal var caPem: ByteArray? = null
        internal var tlsServerName: String? = null
        internal var ownerRouting: Boolean = true
        internal var connectTimeout: java.time.Duration? = null
        internal var defaultTimeout: java.time.Duration? = null
        internal var execOutputLimit: Long? = null
        internal var allowCleartextToken: Boolean = false

        fun endpoint(endpoint: String) = apply { this.endpoint = endpoint }

        /** A static bearer token. */
        fun token(token: String?) = apply { this.token = token }

        /** A token provider, called by the core when it needs a token. */
        fun tokenSource(source: TokenSource?) = apply { this.tokenSource = source }

        /** PEM of the CA that signed the gateway's certificate. */
        fun caPem(pem: ByteArray?) = apply { this.caPem = pem }

        fun tlsServerName(name: String?) = apply { this.tlsServerName = name }

        /** Route sandbox calls to the replica that holds the sandbox (on by default). */
        fun ownerRouting(enabled: Boolean) = apply { this.ownerRouting = enabled }

        fun connectTimeout(timeout: java.time.Duration?) = apply { this.connectTimeout = timeout }

        /** Default deadline of unary calls and waits; [java.time.Duration.ZERO] means none. */
        fun defaultTimeout(timeout: java.time.Duration?) = apply { this.defaultTimeout = timeout }

        fun execOutputLimit(bytes: Long?) = apply { this.execOutputLimit = bytes }

        /** Send a token over cleartext HTTP (loopback development only). */
        fun allowCleartextToken(allow: Boolean) = apply { this.allowCleartextToken = allow }

        fun build(): ClientConfig = ClientConfig(this)
    }

    companion object {
        /** The endpoint of `make up`'s dev cluster. */
        const val DEFAULT_ENDPOINT = "http://127.0.0.1:17670"

        @JvmStatic
        fun builder(endpoint: String): Builder = Builder(endpoint)

        /** A builder from `OPENSHELL_ENDPOINT` and `OPENSHELL_TOKEN`. */
        @JvmStatic
        fun fromEnv(): Builder =
            Builder(System.getenv("OPENSHELL_ENDPOINT")?.takeIf { it.isNotEmpty() } ?: DEFAULT_ENDPOINT)
                .token(System.getenv("OPENSHELL_TOKEN")?.takeIf { it.isNotEmpty() })
    }
}
