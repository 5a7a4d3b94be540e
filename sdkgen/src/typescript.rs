//! TypeScript outputs (`sdk-typescript/src/gen/`):
//!
//! - `openshell/*_pb.ts`: protobuf-es message types and schemas, written by
//!   `@bufbuild/protoc-gen-es` (the package's pinned dev dependency). No
//!   `protoc`: sdkgen builds the plugin's `CodeGeneratorRequest` from the
//!   descriptors it already compiled (protox, with source info so comments
//!   carry over), runs the plugin with the request on stdin and takes the
//!   files of its `CodeGeneratorResponse`.
//! - `raw.ts`: `GeneratedRaw`, one typed method per RPC of the service, each
//!   going through the core's raw boundary (so owner routing applies);
//!   `RawCalls` (`client.raw`) extends it.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use prost::Message as _;
use prost_reflect::{MessageDescriptor, MethodDescriptor};
use prost_types::compiler::{CodeGeneratorRequest, CodeGeneratorResponse};

use crate::{Contract, MARKER, Outputs, leading_comments, owner_routed_field};

/// Where the TypeScript outputs go.
pub const GEN_DIR: &str = "sdk-typescript/src/gen";

/// The parameter protoc-gen-es runs with: TypeScript sources, ESM imports
/// ending in `.js` (NodeNext resolution).
const PARAMETER: &str = "target=ts,import_extension=js";

fn plugin(root: &Path, explicit: Option<&Path>) -> PathBuf {
    explicit
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.join("sdk-typescript/node_modules/.bin/protoc-gen-es"))
}

pub fn generate(
    root: &Path,
    explicit_plugin: Option<&Path>,
    contract: &Contract,
    out: &mut Outputs,
) -> anyhow::Result<()> {
    for (name, content) in messages(root, explicit_plugin, contract)? {
        out.insert(Path::new(GEN_DIR).join(name), content);
    }
    out.insert(Path::new(GEN_DIR).join("raw.ts"), raw_stubs(contract)?);
    out.insert(Path::new(GEN_DIR).join("index.ts"), index(contract));
    Ok(())
}

/// Runs protoc-gen-es on the contract: file name -> content.
fn messages(
    root: &Path,
    explicit_plugin: Option<&Path>,
    contract: &Contract,
) -> anyhow::Result<Vec<(String, String)>> {
    let plugin = plugin(root, explicit_plugin);
    if !plugin.exists() {
        bail!(
            "{} is missing: run `make node` (npm ci in sdk-typescript) first",
            plugin.display()
        );
    }
    let request = CodeGeneratorRequest {
        file_to_generate: contract.files.clone(),
        parameter: Some(PARAMETER.to_owned()),
        // Dependencies come before the files that import them, as protoc
        // sends them.
        proto_file: contract.pool.file_descriptor_protos().cloned().collect(),
        compiler_version: None,
    };
    let mut child = Command::new(&plugin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", plugin.display()))?;
    let input = request.encode_to_vec();
    let mut stdin = child.stdin.take().context("plugin stdin")?;
    // Written from a thread: the plugin may answer before reading it all.
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let output = child.wait_with_output().context("running protoc-gen-es")?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("writing the plugin's stdin panicked"))?
        .context("writing the plugin's stdin")?;
    if !output.status.success() {
        bail!(
            "protoc-gen-es failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let response = CodeGeneratorResponse::decode(output.stdout.as_slice())
        .context("decoding the plugin's CodeGeneratorResponse")?;
    if let Some(error) = response.error {
        bail!("protoc-gen-es: {error}");
    }
    let mut files = Vec::new();
    for file in response.file {
        let name = file.name.context("a plugin file without a name")?;
        if file.insertion_point.is_some() {
            bail!("protoc-gen-es: insertion points are not supported ({name})");
        }
        let content = file.content.unwrap_or_default();
        files.push((name, format!("// {MARKER}\n{content}")));
    }
    if files.is_empty() {
        bail!("protoc-gen-es wrote no file");
    }
    Ok(files)
}

/// `index.ts`: every message module, as `@openshell/sdk/proto` exports it.
fn index(contract: &Contract) -> String {
    let mut out = format!(
        "// {MARKER}\n\
         // The protobuf-es types and schemas of every message of proto/\n\
         // (`import {{ GetSandboxRequestSchema }} from \"@openshell/sdk/proto\"`).\n"
    );
    for file in &contract.files {
        let stem = Path::new(file).with_extension("");
        let _ = writeln!(out, "export * from \"./{}_pb.js\";", stem.display());
    }
    out
}

/// `GetSandbox` -> `getSandbox`.
pub fn camel_case(name: &str) -> String {
    let mut chars = name.chars();
    match chars.next() {
        Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// The namespace a generated file is imported as: `openshell/sandbox.proto`
/// -> `sandbox_pb`.
fn module_alias(file: &str) -> String {
    let stem = Path::new(file)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(
        "{}_pb",
        stem.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    )
}

/// How protoc-gen-es names a message: its path inside the package, `_`-joined.
fn es_name(message: &MessageDescriptor) -> String {
    let package = message.package_name();
    let full = message.full_name();
    let local = if package.is_empty() {
        full
    } else {
        &full[package.len() + 1..]
    };
    local.replace('.', "_")
}

/// `sandbox_pb.GetSandboxConfigRequest` and the file it lives in.
fn type_ref(message: &MessageDescriptor) -> (String, String) {
    let file = message.parent_file().name().to_owned();
    (
        format!("{}.{}", module_alias(&file), es_name(message)),
        file,
    )
}

fn js_doc(out: &mut String, lines: &[String]) {
    if lines.is_empty() {
        return;
    }
    out.push_str("  /**\n");
    for line in lines {
        let _ = writeln!(out, "   * {}", line.replace("*/", "* /"));
    }
    out.push_str("   */\n");
}

fn method_stub(
    out: &mut String,
    contract: &Contract,
    method: &MethodDescriptor,
) -> anyhow::Result<()> {
    let (input, _) = type_ref(&method.input());
    let (output, _) = type_ref(&method.output());
    let path = format!("/{}/{}", method.parent_service().full_name(), method.name());
    let mut doc = leading_comments(method);
    match owner_routed_field(&contract.pool, method)? {
        Some(field) => doc.push(format!(
            "Owner-routed by the request's `{field}` (the core sends it to the sandbox's owner replica)."
        )),
        None => doc.push("Any replica answers it.".to_owned()),
    }
    let name = camel_case(method.name());
    match (method.is_client_streaming(), method.is_server_streaming()) {
        (false, false) => {
            doc.push(format!("Unary `{path}`."));
            js_doc(out, &doc);
            let _ = writeln!(
                out,
                "  {name}(\n    request: MessageInitShape<typeof {input}Schema> = {{}},\n    \
                 options: RawCallOptions = {{}},\n  ): Promise<{output}> {{\n    \
                 return this.typedUnary(\"{path}\", {input}Schema, {output}Schema, request, options);\n  }}\n"
            );
        }
        (false, true) => {
            doc.push(format!(
                "Server streaming `{path}`: sends the request, then iterate the replies."
            ));
            js_doc(out, &doc);
            let _ = writeln!(
                out,
                "  {name}(\n    request: MessageInitShape<typeof {input}Schema> = {{}},\n    \
                 options: RawCallOptions = {{}},\n  ): Promise<TypedStream<typeof {input}Schema, typeof {output}Schema>> {{\n    \
                 return this.typedStream(\"{path}\", {input}Schema, {output}Schema, request, options);\n  }}\n"
            );
        }
        (true, server) => {
            let what = if server { "Bidi" } else { "Client" };
            doc.push(format!(
                "{what} streaming `{path}`: `send` requests, `closeSend`, iterate the replies."
            ));
            js_doc(out, &doc);
            let _ = writeln!(
                out,
                "  {name}(\n    options: RawCallOptions = {{}},\n  ): Promise<TypedStream<typeof {input}Schema, typeof {output}Schema>> {{\n    \
                 return this.typedStream(\"{path}\", {input}Schema, {output}Schema, undefined, options);\n  }}\n"
            );
        }
    }
    Ok(())
}

/// `raw.ts`: the typed stub class.
fn raw_stubs(contract: &Contract) -> anyhow::Result<String> {
    let service = contract.service()?;
    let mut files = std::collections::BTreeSet::new();
    for method in service.methods() {
        files.insert(type_ref(&method.input()).1);
        files.insert(type_ref(&method.output()).1);
    }
    let mut out = format!(
        "// {MARKER}\n\
         // Typed raw stubs: one method per RPC of `{}`, each through the\n\
         // core's raw boundary (owner routing applies). `client.raw` has them all.\n\
         import type {{ MessageInitShape }} from \"@bufbuild/protobuf\";\n\
         import {{ type RawCallOptions, TypedRawBase, type TypedStream }} from \"../typed-raw.js\";\n",
        service.full_name()
    );
    for file in &files {
        let stem = Path::new(file).with_extension("");
        let _ = writeln!(
            out,
            "import * as {} from \"./{}_pb.js\";",
            module_alias(file),
            stem.display()
        );
    }
    out.push_str(
        "\n/** One typed method per RPC; requests are message init objects or messages. */\n\
         export abstract class GeneratedRaw extends TypedRawBase {\n",
    );
    for method in service.methods() {
        method_stub(&mut out, contract, &method)?;
    }
    // No blank line before the closing brace.
    while out.ends_with("\n\n") {
        out.pop();
    }
    out.push_str("}\n");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(camel_case("GetSandbox"), "getSandbox");
        assert_eq!(camel_case("ForwardTcp"), "forwardTcp");
        assert_eq!(module_alias("openshell/sandbox.proto"), "sandbox_pb");
    }
}
