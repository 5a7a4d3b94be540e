// The raw ops of scenarios.json: any method of the service by name, its
// messages built from proto JSON (DynamicMessage, JsonFormat) and sent
// through the SDK's raw client, so owner routing applies as for typed stubs.
package dev.openshell.sdk.conformance

import com.google.gson.JsonParser
import com.google.protobuf.Descriptors
import com.google.protobuf.DynamicMessage
import com.google.protobuf.InvalidProtocolBufferException
import com.google.protobuf.util.JsonFormat
import dev.openshell.sdk.ffi.MetadataEntry
import dev.openshell.sdk.raw.RawCallOptions
import dev.openshell.sdk.raw.ResponseMetadata
import dev.openshell.sdk.raw.raw
import openshell.v1.Openshell

private val SERVICE: Descriptors.ServiceDescriptor = Openshell.getDescriptor().findServiceByName("OpenShell")

private fun method(name: Any?): Pair<Descriptors.MethodDescriptor, String> {
    val method = SERVICE.findMethodByName(name.toString()) ?: throw StepFailed("no method $name in the service")
    return method to "/${SERVICE.fullName}/${method.name}"
}

private fun Runner.encode(
    type: Descriptors.Descriptor,
    body: Any?,
): DynamicMessage {
    val builder = DynamicMessage.newBuilder(type)
    try {
        JsonFormat.parser().merge(toJson(subst(body ?: emptyMap<String, Any?>())), builder)
    } catch (e: InvalidProtocolBufferException) {
        throw StepFailed("the step's message does not parse as ${type.fullName}: ${e.message}")
    }
    return builder.build()
}

private suspend fun rawUnaryOp(
    r: Runner,
    step: Step,
): Result {
    val (method, path) = method(step["method"])
    val request = r.encode(method.inputType, step["request"])
    val metadata =
        (r.subst(step["metadata"]) as? List<*>).orEmpty().map { strings(it) }.filter { it.size == 2 }.map {
            MetadataEntry(it[0], it[1])
        }
    val answered = ResponseMetadata()
    val options = RawCallOptions(metadata, responseMetadata = answered)
    val parser = DynamicMessage.getDefaultInstance(method.outputType).parserForType
    val response =
        r.client.raw.client
            .unary(path, request, parser, options)
    val json = JsonFormat.printer().preservingProtoFieldNames().print(response)
    return result(
        "metadata" to answered.entries.map { listOf(it.key, it.value) },
        "response" to plain(JsonParser.parseString(json)),
    )
}

private suspend fun rawStreamOp(
    r: Runner,
    step: Step,
): Result {
    val (method, path) = method(step["method"])
    val parser = DynamicMessage.getDefaultInstance(method.outputType).parserForType
    r.client.raw.client.stream<DynamicMessage, DynamicMessage>(path, parser).use { stream ->
        for (body in (step["messages"] as? List<*>).orEmpty()) stream.send(r.encode(method.inputType, body))
        stream.closeSend()
        var received = 0
        while (stream.next() != null) received++
        return result("received" to received)
    }
}

val RAW_OPS: Map<String, Op> =
    mapOf(
        "raw_unary" to ::rawUnaryOp,
        "raw_stream" to ::rawStreamOp,
    )
