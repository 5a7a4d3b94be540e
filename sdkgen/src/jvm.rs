//! JVM output: the typed raw stubs
//! `sdk-jvm/src/main/kotlin/dev/openshell/sdk/raw/RawStubs.kt`, one Kotlin
//! suspend function per RPC (and a `CompletableFuture` twin for Java) over
//! the raw boundary of `bindings/uniffi` (`RawClient`), so owner routing
//! applies as in every SDK.
//!
//! The message classes are protobuf-java's, generated at Maven build time
//! (`sdk-jvm/pom.xml`, protoc from Maven Central) and not committed. The
//! protos set no `java_package` or `java_multiple_files`, so a message is a
//! nested class of its file's outer class, in the proto package:
//! `openshell.v1.Openshell.HealthRequest`; the outer class is the file name
//! in camel case, with `OuterClass` appended when a top-level message, enum
//! or service has that name (protoc's rule): `openshell.peer.v1.PeerOuterClass`.

use std::fmt::Write as _;
use std::path::Path;

use prost_reflect::{FileDescriptor, MessageDescriptor};

use crate::{Contract, MARKER, Outputs, leading_comments};

/// Where the stubs go.
pub const STUBS: &str = "sdk-jvm/src/main/kotlin/dev/openshell/sdk/raw/RawStubs.kt";

/// protoc's outer class name of a file without `java_outer_classname`.
fn outer_class(file: &FileDescriptor) -> String {
    let base = Path::new(file.name())
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or(file.name());
    let mut name = String::new();
    let mut upper = true;
    for c in base.chars() {
        if c.is_ascii_alphanumeric() {
            if upper {
                name.push(c.to_ascii_uppercase());
            } else {
                name.push(c);
            }
            upper = c.is_ascii_digit();
        } else {
            upper = true;
        }
    }
    let taken = file.messages().any(|m| m.name() == name)
        || file.enums().any(|e| e.name() == name)
        || file.services().any(|s| s.name() == name);
    if taken {
        name.push_str("OuterClass");
    }
    name
}

/// The fully qualified Java class of a message.
fn java_type(message: &MessageDescriptor) -> String {
    let file = message.parent_file();
    let local = message
        .full_name()
        .strip_prefix(&format!("{}.", message.package_name()))
        .unwrap_or(message.name());
    format!("{}.{}.{local}", message.package_name(), outer_class(&file))
}

/// `ExecSandbox` -> `execSandbox`.
fn camel(name: &str) -> String {
    let mut chars = name.chars();
    match chars.next() {
        Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// A comment line safe inside a KDoc block (Kotlin comments nest).
fn kdoc(line: &str) -> String {
    line.replace("*/", "* /").replace("/*", "/ *")
}

pub fn generate(contract: &Contract, out: &mut Outputs) -> anyhow::Result<()> {
    out.insert(STUBS.into(), raw_stubs(contract)?);
    Ok(())
}

fn raw_stubs(contract: &Contract) -> anyhow::Result<String> {
    let service = contract.service()?;
    let mut stubs = String::new();
    let mut futures = String::new();
    for method in service.methods() {
        let (req, resp) = (java_type(&method.input()), java_type(&method.output()));
        let path = format!("/{}/{}", service.full_name(), method.name());
        let name = camel(method.name());
        let mut doc = format!("    /**\n     * Calls `{path}`.\n");
        for line in leading_comments(&method) {
            let _ = writeln!(doc, "     * {}", kdoc(&line));
        }
        let (signature, call, future_type) = match (
            method.is_client_streaming(),
            method.is_server_streaming(),
        ) {
            (false, false) => (
                format!(
                    "request: {req},\n        options: RawCallOptions = RawCallOptions.DEFAULT,\n    ): {resp}"
                ),
                format!("client.unary(\"{path}\", request, {resp}.parser(), options)"),
                resp.clone(),
            ),
            (false, true) => {
                doc.push_str(
                        "     * The stream carries one request, sent (and the send side closed) before this returns.\n",
                    );
                (
                    format!(
                        "request: {req},\n        options: RawCallOptions = RawCallOptions.DEFAULT,\n    ): RawStream<{req}, {resp}>"
                    ),
                    format!("client.serverStream(\"{path}\", request, {resp}.parser(), options)"),
                    format!("RawStream<{req}, {resp}>"),
                )
            }
            _ => {
                doc.push_str(
                        "     * Send requests with `send`, end them with `closeSend`, read with `next` or `messages`.\n",
                    );
                (
                    format!(
                        "options: RawCallOptions = RawCallOptions.DEFAULT,\n    ): RawStream<{req}, {resp}>"
                    ),
                    format!("client.stream(\"{path}\", {resp}.parser(), options)"),
                    format!("RawStream<{req}, {resp}>"),
                )
            }
        };
        doc.push_str("     */\n");
        let _ = write!(
            stubs,
            "\n{doc}    suspend fun {name}(\n        {signature} = {call}\n"
        );
        let args = if method.is_client_streaming() {
            "options"
        } else {
            "request, options"
        };
        let _ = write!(
            futures,
            "\n{doc}    @JvmOverloads\n    fun {name}(\n        {}\n    ): CompletableFuture<{future_type}> = scope.future {{ stubs.{name}({args}) }}\n",
            signature
                .split_once("\n    ):")
                .map(|(params, _)| params)
                .unwrap_or_default()
        );
    }
    Ok(format!(
        "// {MARKER}\n\
         @file:Suppress(\"ktlint\")\n\
         \n\
         package dev.openshell.sdk.raw\n\
         \n\
         import dev.openshell.sdk.OpenShellClient\n\
         import kotlinx.coroutines.CoroutineScope\n\
         import kotlinx.coroutines.future.future\n\
         import java.util.concurrent.CompletableFuture\n\
         \n\
         /**\n \
         * Typed raw stubs: one suspend function per RPC of `{service}`, with\n \
         * protobuf-java messages, over the core's raw boundary (owner routing,\n \
         * hints and the single unrouted retry as in every SDK). Get them with\n \
         * `client.raw`. Failures are `OpenShellException`s.\n \
         */\n\
         class RawStubs(\n    val client: RawClient,\n) {{{stubs}}}\n\
         \n\
         /**\n \
         * [RawStubs] for Java: every call returns a [CompletableFuture];\n \
         * `cancel(true)` cancels the call.\n \
         */\n\
         class RawStubsAsync(\n    val stubs: RawStubs,\n    private val scope: CoroutineScope,\n) {{{futures}\n    \
         companion object {{\n        \
         /** The async stubs of a client. */\n        \
         @JvmStatic\n        \
         fun of(client: OpenShellClient): RawStubsAsync = RawStubsAsync(client.raw, asyncScope())\n    \
         }}\n\
         }}\n",
        service = service.full_name(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_names_follow_protoc() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let contract = crate::compile(&root).unwrap();
        let pool = &contract.pool;
        let health = pool
            .get_message_by_name("openshell.v1.HealthRequest")
            .unwrap();
        assert_eq!(java_type(&health), "openshell.v1.Openshell.HealthRequest");
        let hello = pool
            .get_message_by_name("openshell.supervisor_host.v1.HostHello")
            .unwrap();
        assert_eq!(
            java_type(&hello),
            "openshell.supervisor_host.v1.SupervisorHostOuterClass.HostHello"
        );
        assert_eq!(camel("ExecSandbox"), "execSandbox");
        assert_eq!(kdoc("a /* b */"), "a / * b * /");
    }
}
