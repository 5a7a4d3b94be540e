//! Go outputs: message types from `protoc-gen-go` (fed a
//! `CodeGeneratorRequest` built from the descriptors protox compiled, so no
//! `protoc` is involved) and the typed raw stubs `sdk-go/raw_generated.go`
//! (one method per RPC over the C ABI's raw boundary, so owner routing
//! applies).
//!
//! `protoc-gen-go` is built with the Go toolchain from the version pinned in
//! `sdk-go/go.mod` (`go build`, cached by Go), or taken from
//! `$SDKGEN_PROTOC_GEN_GO`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use prost::Message;
use prost_reflect::MessageDescriptor;
use prost_types::compiler::{CodeGeneratorRequest, CodeGeneratorResponse};

use crate::{Contract, MARKER, Outputs, leading_comments};

/// The Go module of `sdk-go`.
pub const MODULE: &str = "example.invalid/openshell/sdk-go";
const MODULE_DIR: &str = "sdk-go";

/// The Go toolchain: `$SDKGEN_GO`, else `go` on PATH, else /usr/local/go.
pub fn go_tool(name: &str) -> PathBuf {
    if let Ok(p) = std::env::var(format!("SDKGEN_{}", name.to_uppercase())) {
        return p.into();
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    Path::new("/usr/local/go/bin").join(name)
}

/// The Go package (import path suffix and name) of a proto package:
/// `openshell.sandbox.v1` -> `sandboxv1`, `openshell.v1` -> `openshellv1`,
/// `openshell.supervisor_host.v1` -> `supervisorhostv1`.
fn go_package(proto_package: &str) -> String {
    let parts: Vec<&str> = proto_package.split('.').collect();
    match parts.as_slice() {
        ["openshell", version] => format!("openshell{version}"),
        // `supervisor_host` -> `supervisorhost`: Go package names take no
        // underscores.
        [.., name, version] => format!("{}{version}", name.replace('_', "")),
        _ => proto_package.replace('.', ""),
    }
}

fn protoc_gen_go(root: &Path) -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("SDKGEN_PROTOC_GEN_GO") {
        return Ok(p.into());
    }
    // Built into the cargo target dir (Go's build cache makes a rebuild cheap).
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let dir = target.join("sdkgen");
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("protoc-gen-go");
    let status = Command::new(go_tool("go"))
        .current_dir(root.join(MODULE_DIR))
        .args(["build", "-o"])
        .arg(&out)
        .arg("google.golang.org/protobuf/cmd/protoc-gen-go")
        .status()
        .context("running `go build` for protoc-gen-go (is Go installed?)")?;
    if !status.success() {
        bail!("`go build google.golang.org/protobuf/cmd/protoc-gen-go` failed");
    }
    Ok(out)
}

pub fn generate(root: &Path, contract: &Contract, out: &mut Outputs) -> anyhow::Result<()> {
    message_packages(root, contract, out)?;
    let stubs = gofmt(&raw_stubs(contract)?)?;
    out.insert(Path::new(MODULE_DIR).join("raw_generated.go"), stubs);
    Ok(())
}

fn message_packages(root: &Path, contract: &Contract, out: &mut Outputs) -> anyhow::Result<()> {
    let mut mappings = Vec::new();
    for file in contract.pool.files() {
        if file.name().starts_with("openshell/") {
            let pkg = go_package(file.package_name());
            mappings.push(format!("M{}={MODULE}/proto/{pkg};{pkg}", file.name()));
        }
    }
    let request = CodeGeneratorRequest {
        file_to_generate: contract.files.clone(),
        parameter: Some(format!("module={MODULE},{}", mappings.join(","))),
        proto_file: contract.pool.file_descriptor_protos().cloned().collect(),
        ..Default::default()
    };
    let plugin = protoc_gen_go(root)?;
    let mut child = Command::new(&plugin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", plugin.display()))?;
    child
        .stdin
        .take()
        .context("plugin stdin")?
        .write_all(&request.encode_to_vec())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!("protoc-gen-go failed");
    }
    let response = CodeGeneratorResponse::decode(output.stdout.as_slice())
        .context("protoc-gen-go answered something that is not a CodeGeneratorResponse")?;
    if let Some(error) = response.error {
        bail!("protoc-gen-go: {error}");
    }
    for file in response.file {
        let name = file
            .name
            .context("protoc-gen-go returned a file without a name")?;
        out.insert(
            Path::new(MODULE_DIR).join(name),
            file.content.unwrap_or_default(),
        );
    }
    Ok(())
}

/// `gofmt` of generated code.
fn gofmt(code: &str) -> anyhow::Result<String> {
    let mut child = Command::new(go_tool("gofmt"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("running gofmt")?;
    child
        .stdin
        .take()
        .context("gofmt stdin")?
        .write_all(code.as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!("gofmt rejected the generated Go code");
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// `pkg.Type` of a message (nested types joined with `_`, as protoc-gen-go).
fn go_type(message: &MessageDescriptor) -> String {
    let pkg = go_package(message.package_name());
    let local = message
        .full_name()
        .strip_prefix(&format!("{}.", message.package_name()))
        .unwrap_or(message.name())
        .replace('.', "_");
    format!("{pkg}.{local}")
}

fn raw_stubs(contract: &Contract) -> anyhow::Result<String> {
    let service = contract.service()?;
    let mut imports = std::collections::BTreeSet::new();
    let mut body = String::new();
    for method in service.methods() {
        let input = method.input();
        let output = method.output();
        for m in [&input, &output] {
            imports.insert(go_package(m.package_name()));
        }
        let (req, resp) = (go_type(&input), go_type(&output));
        let path = format!("/{}/{}", service.full_name(), method.name());
        let name = method.name();
        let comments = leading_comments(&method);
        let _ = writeln!(body);
        let _ = writeln!(body, "// {name} calls {path}.");
        for line in &comments {
            let _ = writeln!(body, "// {line}");
        }
        match (method.is_client_streaming(), method.is_server_streaming()) {
            (false, false) => {
                let _ = writeln!(
                    body,
                    "func (r *Raw) {name}(ctx context.Context, req *{req}, opts ...CallOption) (*{resp}, error) {{\n\
                     \tresp := new({resp})\n\
                     \tif err := r.unary(ctx, {path:?}, req, resp, opts); err != nil {{\n\
                     \t\treturn nil, err\n\
                     \t}}\n\
                     \treturn resp, nil\n\
                     }}"
                );
            }
            (false, true) => {
                let _ = writeln!(
                    body,
                    "// The stream carries one request, sent before this returns.\n\
                     func (r *Raw) {name}(ctx context.Context, req *{req}, opts ...CallOption) (*RawStream[*{req}, *{resp}], error) {{\n\
                     \ts, err := openRawStream[*{req}, *{resp}](ctx, r.c, {path:?}, func() *{resp} {{ return new({resp}) }}, opts)\n\
                     \tif err != nil {{\n\
                     \t\treturn nil, err\n\
                     \t}}\n\
                     \tif err := s.Send(ctx, req); err != nil {{\n\
                     \t\ts.Close()\n\
                     \t\treturn nil, err\n\
                     \t}}\n\
                     \ts.CloseSend()\n\
                     \treturn s, nil\n\
                     }}"
                );
            }
            _ => {
                let _ = writeln!(
                    body,
                    "func (r *Raw) {name}(ctx context.Context, opts ...CallOption) (*RawStream[*{req}, *{resp}], error) {{\n\
                     \treturn openRawStream[*{req}, *{resp}](ctx, r.c, {path:?}, func() *{resp} {{ return new({resp}) }}, opts)\n\
                     }}"
                );
            }
        }
    }
    let mut code = format!(
        "// Code generated by sdkgen from proto/; DO NOT EDIT.\n// {MARKER}\n\npackage openshell\n\nimport (\n\t\"context\"\n\n"
    );
    for pkg in imports {
        let _ = writeln!(code, "\t\"{MODULE}/proto/{pkg}\"");
    }
    code.push_str(")\n");
    code.push_str(&body);
    Ok(code)
}
