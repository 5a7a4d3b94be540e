package dev.openshell.sdk

import dev.openshell.sdk.ffi.OpenShellException
import dev.openshell.sdk.ffi.SessionOptions
import dev.openshell.sdk.ffi.SettingValue

/**
 * How a supervisor-side session ([ConfigSession], [HostSession]) reaches the
 * gateway: the endpoint (the edge of a cluster) and the sandbox's (or the
 * host's) own token. The token never appears in [toString].
 */
class SessionConfig private constructor(
    builder: Builder,
) {
    val endpoint: String = builder.endpoint
    internal val token: String = builder.token
    val caPem: ByteArray? = builder.caPem
    val tlsServerName: String? = builder.tlsServerName
    val connectTimeout: java.time.Duration? = builder.connectTimeout
    val allowCleartextToken: Boolean = builder.allowCleartextToken

    /** `GetSandboxConfig` interval while nothing is pushed (default 10 s, at least 100 ms; [ConfigSession] only). */
    val pollInterval: java.time.Duration? = builder.pollInterval

    /** Whether hellos announce config push (default true; off, configuration is polled). */
    val announcePush: Boolean = builder.announcePush

    /** The instance id every hello carries (default: a new UUID). */
    val instanceId: String? = builder.instanceId

    internal fun options(): SessionOptions =
        SessionOptions(
            endpoint = endpoint,
            token = token,
            caPem = caPem,
            tlsServerName = tlsServerName,
            connectTimeoutMs = connectTimeout?.toMillis()?.coerceAtLeast(0)?.toULong(),
            allowCleartextToken = allowCleartextToken,
            pollIntervalMs = pollInterval?.toMillis()?.coerceAtLeast(0)?.toULong(),
            announcePush = announcePush,
            instanceId = instanceId,
        )

    override fun toString(): String =
        "SessionConfig(endpoint=$endpoint, token=<set>, announcePush=$announcePush, pollInterval=$pollInterval)"

    /** A mutable builder; every setter returns it. */
    class Builder internal constructor(
        internal var endpoint: String,
        internal var token: String,
    ) {
        internal var caPem: ByteArray? = null
        internal var tlsServerName: String? = null
        internal var connectTimeout: java.time.Duration? = null
        internal var allowCleartextToken: Boolean = false
        internal var pollInterval: java.time.Duration? = null
        internal var announcePush: Boolean = true
        internal var instanceId: String? = null

        fun caPem(pem: ByteArray?) = apply { caPem = pem }

        fun tlsServerName(name: String?) = apply { tlsServerName = name }

        fun connectTimeout(timeout: java.time.Duration?) = apply { connectTimeout = timeout }

        /** Send the token over cleartext HTTP (loopback development only). */
        fun allowCleartextToken(allow: Boolean) = apply { allowCleartextToken = allow }

        fun pollInterval(interval: java.time.Duration?) = apply { pollInterval = interval }

        fun announcePush(announce: Boolean) = apply { announcePush = announce }

        fun instanceId(id: String?) = apply { instanceId = id }

        fun build(): SessionConfig = SessionConfig(this)
    }

    companion object {
        @JvmStatic
        fun builder(
            endpoint: String,
            token: String,
        ): Builder = Builder(endpoint, token)
    }
}

/**
 * One full configuration of a sandbox. [environment] holds the provider
 * environment, whose values are secrets: [toString] shows only its keys.
 */
class ConfigSnapshot internal constructor(
    raw: dev.openshell.sdk.ffi.ConfigSnapshot,
) {
    /** Increases whenever anything but the provider environment changes. */
    val configRevision: Long = raw.configRevision
    val providerEnvRevision: Long = raw.providerEnvRevision
    val policyVersion: Long = raw.policyVersion
    val policyHash: String = raw.policyHash

    /** `SANDBOX`, `GLOBAL` or `UNSPECIFIED`. */
    val policySource: String = raw.policySource

    /** The effective settings (a global value overrides the sandbox's). */
    val settings: Map<String, SettingValue> = raw.settings

    /** Keys of the settings whose value comes from the global scope. */
    val globalKeys: List<String> = raw.globalKeys

    /** The provider environment (secret values). */
    val environment: Map<String, String> = raw.environment

    /** How it arrived (`null` for a [HostSession]'s snapshots). */
    val mode: DeliveryMode? = raw.mode

    /** The encoded `openshell.sandbox.v1.GetSandboxConfigResponse` (for protobuf users). */
    val sandboxConfigProto: ByteArray = raw.sandboxConfigProto

    /** The encoded `openshell.v1.GetSandboxProviderEnvironmentResponse` (secret values). */
    val providerEnvironmentProto: ByteArray = raw.providerEnvironmentProto

    fun setting(key: String): SettingValue? = settings[key]

    /** A string setting's value (`null` when absent or not a string). */
    fun stringSetting(key: String): String? = (settings[key] as? SettingValue.StringValue)?.value

    /** The string-valued settings. */
    val stringSettings: Map<String, String>
        get() = settings.mapNotNull { (k, v) -> (v as? SettingValue.StringValue)?.let { k to it.value } }.toMap()

    override fun toString(): String =
        "ConfigSnapshot(configRevision=$configRevision, providerEnvRevision=$providerEnvRevision, mode=$mode, " +
            "settings=${settings.keys.sorted()}, environmentKeys=${environment.keys.sorted()})"
}

/** How configuration arrives. */
typealias DeliveryMode = dev.openshell.sdk.ffi.DeliveryMode

/**
 * What an apply callback throws to reject a configuration; any other
 * exception rejects it too, with its message. The reason goes to the
 * gateway (scrubbed of provider values and bounded): never put
 * configuration values in it.
 */
class ConfigRejected(
    val reason: String,
) : Exception(reason)

/** The rejection the native layer understands, for any throwable. */
internal fun rejectionOf(t: Throwable): OpenShellException {
    if (t is OpenShellException) return t
    val reason = (t as? ConfigRejected)?.reason ?: t.message?.takeIf { it.isNotBlank() } ?: t.javaClass.simpleName
    return OpenShellException.FailedPrecondition("rejected", reason, 9, false, null)
}
