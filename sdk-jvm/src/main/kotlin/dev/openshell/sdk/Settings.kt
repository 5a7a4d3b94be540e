package dev.openshell.sdk

import dev.openshell.sdk.ffi.SettingValue
import dev.openshell.sdk.ffi.SettingWrite
import kotlin.time.Duration

/**
 * Sets one setting (`UpdateConfig`) of sandbox [sandbox] (by name), or of
 * every sandbox when [sandbox] is `null` (the global scope, which
 * overrides). The sandbox's [ConfigSession] receives it as a new snapshot.
 */
suspend fun OpenShellClient.setSetting(
    sandbox: String?,
    key: String,
    value: SettingValue,
    timeout: Duration? = null,
): SettingWrite = native.setSetting(sandbox, key, value, timeout.millis())

/** [setSetting] with a string value. */
suspend fun OpenShellClient.setSetting(
    sandbox: String?,
    key: String,
    value: String,
    timeout: Duration? = null,
): SettingWrite = setSetting(sandbox, key, SettingValue.StringValue(value), timeout)

/** Removes one setting from sandbox [sandbox]'s scope (the global one when `null`). */
suspend fun OpenShellClient.deleteSetting(
    sandbox: String?,
    key: String,
    timeout: Duration? = null,
): SettingWrite = native.deleteSetting(sandbox, key, timeout.millis())
