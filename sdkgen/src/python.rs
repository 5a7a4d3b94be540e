//! Python outputs: message modules from `grpc_tools.protoc` (imports made
//! package-relative), and the typed raw stubs `raw.py` (async) and
//! `raw_sync.py` (its sync twin) over the native raw boundary.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use prost_reflect::{MessageDescriptor, MethodDescriptor};

use crate::{
    Contract, MARKER, Outputs, SERVICE, kind, leading_comments, owner_routed_field, snake_case,
};

const PACKAGE_DIR: &str = "sdk-python/src/openshell_sdk";

/// The interpreter that has `grpc_tools`: `--python`, else `$SDKGEN_PYTHON`,
/// else the project venv, else `python3`.
fn python(root: &Path, explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_owned();
    }
    if let Ok(p) = std::env::var("SDKGEN_PYTHON") {
        return p.into();
    }
    let venv = root.join(".venv/bin/python");
    if venv.exists() {
        return venv;
    }
    "python3".into()
}

pub fn generate(
    root: &Path,
    explicit_python: Option<&Path>,
    contract: &Contract,
    out: &mut Outputs,
) -> anyhow::Result<()> {
    message_modules(root, explicit_python, contract, out)?;
    let stubs = Stubs::new(contract)?;
    let python = python(root, explicit_python);
    for (name, code) in [
        ("raw.py", stubs.async_module()),
        ("raw_sync.py", stubs.sync_module()),
    ] {
        let formatted = ruff_format(root, &python, name, &code)?;
        out.insert(Path::new(PACKAGE_DIR).join(name), formatted);
    }
    Ok(())
}

/// Formats generated code with the project's formatter (`ruff format`, the
/// version `scripts/setup.sh` pins, with `sdk-python/pyproject.toml`), so the
/// stubs read like the hand-written code and pass `ruff format --check`.
fn ruff_format(root: &Path, python: &Path, name: &str, code: &str) -> anyhow::Result<String> {
    use std::io::Write as _;
    let mut child = Command::new(python)
        .args(["-m", "ruff", "format", "--stdin-filename"])
        .arg(format!("src/openshell_sdk/{name}"))
        .arg("-")
        .current_dir(root.join("sdk-python"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "running {} -m ruff (scripts/setup.sh installs it)",
                python.display()
            )
        })?;
    child
        .stdin
        .take()
        .context("ruff stdin")?
        .write_all(code.as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        bail!("ruff format failed on generated {name} ({})", output.status);
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// `openshell/openshell.proto` -> `openshell_pb2`.
fn module_of(proto_file: &str) -> String {
    let stem = Path::new(proto_file)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{stem}_pb2")
}

/// The client service's file and every file it imports (transitively), except
/// the well-known types that `protobuf` ships.
fn client_files(contract: &Contract) -> anyhow::Result<Vec<String>> {
    let service = contract.service()?;
    let mut files = vec![service.parent_file()];
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    while let Some(file) = files.pop() {
        if !seen.insert(file.name().to_owned()) {
            continue;
        }
        if !file.name().starts_with("google/") {
            out.push(file.name().to_owned());
        }
        files.extend(file.dependencies());
    }
    out.sort();
    Ok(out)
}

fn message_modules(
    root: &Path,
    explicit: Option<&Path>,
    contract: &Contract,
    out: &mut Outputs,
) -> anyhow::Result<()> {
    let python = python(root, explicit);
    let client_files = client_files(contract)?;
    let tmp = tempfile::tempdir()?;
    let status = Command::new(&python)
        .args(["-m", "grpc_tools.protoc", "-I"])
        .arg(root.join("proto"))
        .arg(format!("--python_out={}", tmp.path().display()))
        .arg(format!("--pyi_out={}", tmp.path().display()))
        .args(&client_files)
        .status()
        .with_context(|| {
            format!(
                "running {} -m grpc_tools.protoc (install grpcio-tools: scripts/setup.sh)",
                python.display()
            )
        })?;
    if !status.success() {
        bail!(
            "grpc_tools.protoc failed ({status}); is grpcio-tools installed for {}?",
            python.display()
        );
    }
    let dir = Path::new(PACKAGE_DIR).join("_proto");
    for file in &client_files {
        let module = module_of(file);
        for ext in ["py", "pyi"] {
            let produced = tmp.path().join("openshell").join(format!("{module}.{ext}"));
            let text = std::fs::read_to_string(&produced)
                .with_context(|| format!("reading {}", produced.display()))?;
            out.insert(
                dir.join(format!("{module}.{ext}")),
                format!("# {MARKER}\n{}", relative_imports(&text)),
            );
        }
    }
    out.insert(
        dir.join("__init__.py"),
        format!(
            "# {MARKER}\n\"\"\"Protobuf message modules of the OpenShell contract \
             (`proto/openshell/*.proto`).\"\"\"\n"
        ),
    );
    Ok(())
}

/// protoc writes `from openshell import datamodel_pb2`; inside the package
/// the modules sit side by side.
fn relative_imports(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix("from openshell import ") {
            Some(rest) => format!("from openshell_sdk._proto import {rest}"),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

struct Rpc {
    name: String,
    snake: String,
    path: String,
    kind: &'static str,
    request: String,
    response: String,
    owner_field: Option<String>,
    doc: Vec<String>,
}

struct Stubs {
    rpcs: Vec<Rpc>,
    /// `from ._proto import ...` lines the types need.
    imports: Vec<String>,
}

/// How the stubs name a message type: `pb.Name` for the service's own
/// module (`openshell_pb2`), `<module>.Name` for the others.
fn py_type(message: &MessageDescriptor, service_module: &str) -> (String, String) {
    let module = module_of(message.parent_file().name());
    let package = message.package_name();
    let local = message
        .full_name()
        .strip_prefix(&format!("{package}."))
        .unwrap_or(message.full_name())
        .to_owned();
    let alias = if module == service_module {
        "pb".to_owned()
    } else {
        module.clone()
    };
    (module, format!("{alias}.{local}"))
}

impl Stubs {
    fn new(contract: &Contract) -> anyhow::Result<Self> {
        let service = contract.service()?;
        let service_module = module_of(service.parent_file().name());
        let mut modules = std::collections::BTreeSet::new();
        let rpcs = service
            .methods()
            .map(|m: MethodDescriptor| {
                let (request_module, request) = py_type(&m.input(), &service_module);
                let (response_module, response) = py_type(&m.output(), &service_module);
                modules.insert(request_module);
                modules.insert(response_module);
                Ok(Rpc {
                    name: m.name().to_owned(),
                    snake: snake_case(m.name()),
                    path: format!("/{SERVICE}/{}", m.name()),
                    kind: kind(&m),
                    request,
                    response,
                    owner_field: owner_routed_field(&contract.pool, &m)?,
                    doc: leading_comments(&m),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let imports = modules
            .into_iter()
            .map(|m| {
                if m == service_module {
                    format!("from ._proto import {m} as pb")
                } else {
                    format!("from ._proto import {m}")
                }
            })
            .collect();
        Ok(Self { rpcs, imports })
    }

    fn table(&self, code: &mut String) {
        code.push_str("METHODS: tuple[MethodInfo, ...] = (\n");
        for rpc in &self.rpcs {
            let kind = snake_case(rpc.kind);
            let owner = match &rpc.owner_field {
                Some(f) => format!("\"{f}\""),
                None => "None".into(),
            };
            let _ = write!(
                code,
                "    MethodInfo(\n        name=\"{}\",\n        path=\"{}\",\n        \
                 kind=\"{kind}\",\n        owner_routed_field={owner},\n    ),\n",
                rpc.name, rpc.path
            );
        }
        code.push_str(")\n");
    }

    fn docstring(rpc: &Rpc, extra: &str) -> String {
        let mut lines = vec![format!(
            "``{}`` ({}).",
            rpc.name,
            snake_case(rpc.kind).replace('_', " ")
        )];
        if !rpc.doc.is_empty() {
            lines.push(String::new());
            lines.extend(rpc.doc.iter().cloned());
        }
        if let Some(field) = &rpc.owner_field {
            lines.push(String::new());
            lines.push(format!(
                "Owner-routed by the core on request field ``{field}``."
            ));
        }
        if !extra.is_empty() {
            lines.push(String::new());
            lines.push(extra.to_owned());
        }
        let mut out = String::from("        \"\"\"");
        for (i, line) in lines.iter().enumerate() {
            if i > 0 {
                out.push('\n');
                if !line.is_empty() {
                    out.push_str("        ");
                }
            }
            out.push_str(&line.replace("\"\"\"", "'''").replace('\\', "\\\\"));
        }
        if lines.len() > 1 {
            out.push_str("\n        ");
        }
        out.push_str("\"\"\"\n");
        out
    }

    fn async_module(&self) -> String {
        let mut code = format!(
            "# {MARKER}\n\
             \"\"\"Typed raw stubs: one method per RPC of ``{SERVICE}``.\n\
             \n\
             Each stub encodes its request message, calls the core's raw boundary\n\
             (``openshell_sdk._native``) and decodes the answer, so deadlines,\n\
             cancellation, auth and owner routing are the core's, exactly as for the\n\
             curated API. Get one from ``AsyncClient.raw``.\n\
             \n\
             - unary RPCs: ``await raw.get_sandbox(request)`` returns the response\n\
             \x20 message; ``*_with_metadata`` also returns the response metadata;\n\
             - server-streaming RPCs return a ``ServerStream`` (async iterator);\n\
             - client- and bidi-streaming RPCs return a ``BidiStream`` (``send``,\n\
             \x20 ``close_send``, ``recv``, async iteration).\n\
             \"\"\"\n\
             \n\
             from __future__ import annotations\n\
             \n\
             {imports}\n\
             from ._raw_runtime import (\n\
             \x20   BidiStream,\n\
             \x20   MetadataLike,\n\
             \x20   MethodInfo,\n\
             \x20   RawResponse,\n\
             \x20   RawStubBase,\n\
             \x20   ServerStream,\n\
             )\n\
             \n\
             __all__ = [\"METHODS\", \"SERVICE\", \"AsyncRaw\"]\n\
             \n\
             SERVICE = \"{SERVICE}\"\n\
             \n",
            imports = self.imports.join("\n"),
        );
        self.table(&mut code);
        code.push_str(
            "\n\nclass AsyncRaw(RawStubBase):\n    \
             \"\"\"Every RPC of the service, typed. Get one from ``AsyncClient.raw``.\"\"\"\n",
        );
        for rpc in &self.rpcs {
            code.push('\n');
            match rpc.kind {
                "Unary" => {
                    let _ = write!(
                        code,
                        "    async def {snake}(\n        self,\n        request: {req},\n        \
                         *,\n        metadata: MetadataLike = (),\n        \
                         timeout: float | None = None,\n    ) -> {resp}:\n{doc}        \
                         response = await self._unary(\n            \"{path}\",\n            \
                         request,\n            {resp},\n            metadata,\n            \
                         timeout,\n        )\n        return response.message\n\n",
                        snake = rpc.snake,
                        req = rpc.request,
                        resp = rpc.response,
                        path = rpc.path,
                        doc = Self::docstring(rpc, ""),
                    );
                    let _ = write!(
                        code,
                        "    async def {snake}_with_metadata(\n        self,\n        \
                         request: {req},\n        *,\n        metadata: MetadataLike = (),\n        \
                         timeout: float | None = None,\n    ) -> RawResponse[{resp}]:\n{doc}        \
                         return await self._unary(\n            \"{path}\",\n            \
                         request,\n            {resp},\n            metadata,\n            \
                         timeout,\n        )\n",
                        snake = rpc.snake,
                        req = rpc.request,
                        resp = rpc.response,
                        path = rpc.path,
                        doc =
                            Self::docstring(rpc, "Returns the message with the response metadata."),
                    );
                }
                "ServerStreaming" => {
                    let _ = write!(
                        code,
                        "    def {snake}(\n        self,\n        request: {req},\n        \
                         *,\n        metadata: MetadataLike = (),\n        \
                         timeout: float | None = None,\n    ) -> ServerStream[{resp}]:\n{doc}        \
                         return self._server_stream(\n            \"{path}\",\n            \
                         request,\n            {resp},\n            metadata,\n            \
                         timeout,\n        )\n",
                        snake = rpc.snake,
                        req = rpc.request,
                        resp = rpc.response,
                        path = rpc.path,
                        doc = Self::docstring(rpc, "The call starts on first iteration."),
                    );
                }
                _ => {
                    let _ = write!(
                        code,
                        "    def {snake}(\n        self,\n        *,\n        \
                         metadata: MetadataLike = (),\n        \
                         timeout: float | None = None,\n    ) -> BidiStream[{req}, {resp}]:\n{doc}        \
                         return self._bidi_stream(\n            \"{path}\",\n            \
                         {resp},\n            metadata,\n            timeout,\n        )\n",
                        snake = rpc.snake,
                        req = rpc.request,
                        resp = rpc.response,
                        path = rpc.path,
                        doc = Self::docstring(
                            rpc,
                            "The call starts with the first ``send`` (or ``recv``)."
                        ),
                    );
                }
            }
        }
        code
    }

    fn sync_module(&self) -> String {
        let mut code = format!(
            "# {MARKER}\n\
             \"\"\"The sync twin of ``raw``: the same stubs over the sync client's blocking\n\
             native calls (no event loop). Get one from ``Client.raw``.\n\
             \"\"\"\n\
             \n\
             from __future__ import annotations\n\
             \n\
             from ._blocking import run\n\
             {imports}\n\
             from ._raw_runtime import MetadataLike, RawResponse, SyncBidiStream, SyncServerStream\n\
             from .raw import AsyncRaw\n\
             \n\
             __all__ = [\"SyncRaw\"]\n\
             \n\
             \n\
             class SyncRaw:\n    \
             \"\"\"Every RPC of the service, typed, blocking. Get one from ``Client.raw``.\"\"\"\n\
             \n    \
             def __init__(self, raw: AsyncRaw) -> None:\n        \
             self._raw = raw\n",
            imports = self.imports.join("\n"),
        );
        for rpc in &self.rpcs {
            code.push('\n');
            match rpc.kind {
                "Unary" => {
                    for (suffix, ret) in [
                        ("", rpc.response.clone()),
                        ("_with_metadata", format!("RawResponse[{}]", rpc.response)),
                    ] {
                        let doc = if suffix.is_empty() {
                            Self::docstring(rpc, "")
                        } else {
                            Self::docstring(rpc, "Returns the message with the response metadata.")
                        };
                        let _ = write!(
                            code,
                            "    def {snake}{suffix}(\n        self,\n        request: {req},\n        \
                             *,\n        metadata: MetadataLike = (),\n        \
                             timeout: float | None = None,\n    ) -> {ret}:\n{doc}        \
                             return run(\n            \
                             self._raw.{snake}{suffix}(request, metadata=metadata, timeout=timeout)\n        \
                             )\n",
                            snake = rpc.snake,
                            req = rpc.request,
                        );
                        if suffix.is_empty() {
                            code.push('\n');
                        }
                    }
                }
                "ServerStreaming" => {
                    let _ = write!(
                        code,
                        "    def {snake}(\n        self,\n        request: {req},\n        \
                         *,\n        metadata: MetadataLike = (),\n        \
                         timeout: float | None = None,\n    ) -> SyncServerStream[{resp}]:\n{doc}        \
                         return SyncServerStream(\n            \
                         self._raw.{snake}(request, metadata=metadata, timeout=timeout)\n        \
                         )\n",
                        snake = rpc.snake,
                        req = rpc.request,
                        resp = rpc.response,
                        doc = Self::docstring(rpc, "The call starts on first iteration."),
                    );
                }
                _ => {
                    let _ = write!(
                        code,
                        "    def {snake}(\n        self,\n        *,\n        \
                         metadata: MetadataLike = (),\n        \
                         timeout: float | None = None,\n    ) -> SyncBidiStream[{req}, {resp}]:\n{doc}        \
                         return SyncBidiStream(self._raw.{snake}(metadata=metadata, timeout=timeout))\n",
                        snake = rpc.snake,
                        req = rpc.request,
                        resp = rpc.response,
                        doc = Self::docstring(
                            rpc,
                            "The call starts with the first ``send`` (or ``recv``)."
                        ),
                    );
                }
            }
        }
        code
    }
}
