package dev.openshell.sdk

import java.time.Instant
import kotlin.time.Duration

/**
 * An SSH session token for one sandbox (`CreateSshSession`): it lets a
 * client forward to that sandbox ([forwardSsh], or [forward] to a port)
 * without a user token, until [expiresAt] or until revoked.
 *
 * [token] is a secret: [toString] leaves it out. Pin [hostKeyFingerprint]
 * (OpenSSH's `SHA256:` form; empty until the sandbox's supervisor reported
 * its key) as the sandbox's host key.
 */
class SshSession internal constructor(
    val sandboxId: String,
    val token: String,
    val hostKeyFingerprint: String,
    /** When the token stops working; `null`: only when revoked. */
    val expiresAt: Instant?,
    /** The gateway address that issued it. */
    val gatewayHost: String,
    val gatewayPort: Int,
    /** `http` or `https`. */
    val gatewayScheme: String,
) {
    override fun toString(): String =
        "SshSession(sandboxId=$sandboxId, token=<redacted>, hostKeyFingerprint=$hostKeyFingerprint, " +
            "expiresAt=$expiresAt, gateway=$gatewayScheme://$gatewayHost:$gatewayPort)"
}

/** Issues an SSH session token for [sandbox] (needs a user token when the gateway has auth). */
suspend fun OpenShellClient.createSshSession(
    sandbox: String,
    timeout: Duration? = null,
): SshSession =
    native.createSshSession(sandbox, timeout.millis()).use { s ->
        SshSession(
            sandboxId = s.sandboxId(),
            token = s.token(),
            hostKeyFingerprint = s.hostKeyFingerprint(),
            expiresAt = s.expiresAtMs()?.let(Instant::ofEpochMilli),
            gatewayHost = s.gatewayHost(),
            gatewayPort = s.gatewayPort().toInt(),
            gatewayScheme = s.gatewayScheme(),
        )
    }

/**
 * Revokes an SSH session token: forwards can no longer open with it. `true`
 * when it was live; an unknown, expired or already revoked token is `false`.
 */
suspend fun OpenShellClient.revokeSshSession(
    token: String,
    timeout: Duration? = null,
): Boolean = native.revokeSshSession(token, timeout.millis())

suspend fun OpenShellClient.revokeSshSession(
    session: SshSession,
    timeout: Duration? = null,
): Boolean = revokeSshSession(session.token, timeout)
