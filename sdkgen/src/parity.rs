//! `docs/PARITY.md`: for every RPC of the service and every language, whether
//! an idiomatic (curated) API covers it or only the typed raw stub does.
//!
//! The curated entries below are checked against the languages' sources: an
//! entry whose function cannot be found fails generation, so the report
//! cannot claim an API that does not exist.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};

use crate::{Contract, MARKER, SERVICE, kind, owner_routed_field, snake_case};

/// A curated API of one language for one RPC.
struct Curated {
    rpc: &'static str,
    /// How users call it.
    api: &'static str,
    /// Text that must appear in the language's sources.
    needle: &'static str,
}

struct Language {
    name: &'static str,
    /// Directory (relative to the root) whose files are searched for needles;
    /// `None`: the language has no SDK yet.
    sources: Option<&'static str>,
    /// How every RPC is reachable raw, `{snake}` replaced by the method name.
    raw: &'static str,
    curated: &'static [Curated],
    /// Curated APIs for the RPCs of [`HOST_SERVICE`].
    host: &'static [Curated],
}

/// The shared supervisor host service: a table of its own below the main one.
const HOST_SERVICE: &str = "openshell.supervisor_host.v1.SupervisorHost";

const fn c(rpc: &'static str, api: &'static str, needle: &'static str) -> Curated {
    Curated { rpc, api, needle }
}

const LANGUAGES: &[Language] = &[
    Language {
        name: "Rust",
        sources: Some("sdk-core/src"),
        raw: "`Client::raw_unary` / `raw_stream` (prost types)",
        curated: &[
            c("Health", "`Client::health`", "pub async fn health("),
            c(
                "CreateSandbox",
                "`sandboxes().create`",
                "pub async fn create(",
            ),
            c("GetSandbox", "`sandboxes().get`", "pub async fn get("),
            c("ListSandboxes", "`sandboxes().list`", "pub async fn list("),
            c(
                "DeleteSandbox",
                "`sandboxes().delete`",
                "pub async fn delete(",
            ),
            c(
                "WatchSandbox",
                "`sandboxes().watch` / `events` / `wait_ready` / `wait_deleted`",
                "pub fn events(",
            ),
            c("GetSandboxLogs", "`sandboxes().logs`", "pub async fn logs("),
            c(
                "ExecSandbox",
                "`Client::exec` / `exec_stream`",
                "pub async fn exec_stream(",
            ),
            c(
                "ExecSandboxInteractive",
                "`Client::exec_interactive`",
                "pub async fn exec_interactive(",
            ),
            c(
                "ForwardTcp",
                "`Client::forward` / `forward_to`; files: `upload` / `download` / `read_file` / `write_file`",
                "pub async fn forward_to(",
            ),
            c(
                "CreateSshSession",
                "`Client::create_ssh_session`",
                "pub async fn create_ssh_session(",
            ),
            c(
                "RevokeSshSession",
                "`Client::revoke_ssh_session`",
                "pub async fn revoke_ssh_session(",
            ),
            c(
                "GetSandboxConfig",
                "`ConfigSession` (polls it when not pushed)",
                "pub struct ConfigSession",
            ),
            c(
                "GetSandboxProviderEnvironment",
                "`ConfigSession` (polls it when not pushed)",
                "pub struct ConfigSession",
            ),
            c(
                "ConnectSupervisor",
                "`ConfigSession` (supervisor side; relays via `session_events`)",
                "pub struct ConfigSession",
            ),
        ],
        host: &[c(
            "ConnectHost",
            "`HostSession` (host side; relays via `sandbox_session`)",
            "pub struct HostSession",
        )],
    },
    Language {
        name: "Python",
        sources: Some("sdk-python/src/openshell_sdk"),
        raw: "`client.raw.{snake}`",
        curated: &[
            c("Health", "`client.health`", "async def health("),
            c(
                "CreateSandbox",
                "`client.sandboxes.create`",
                "async def create(",
            ),
            c("GetSandbox", "`client.sandboxes.get`", "async def get("),
            c(
                "ListSandboxes",
                "`client.sandboxes.list`",
                "async def list(",
            ),
            c(
                "DeleteSandbox",
                "`client.sandboxes.delete`",
                "async def delete(",
            ),
            c(
                "WatchSandbox",
                "`client.sandboxes.watch` / `events` / `wait_ready` / `wait_deleted`",
                "def events(",
            ),
            c(
                "GetSandboxLogs",
                "`client.sandboxes.logs`",
                "async def logs(",
            ),
            c(
                "ExecSandbox",
                "`client.exec` / `exec_stream`",
                "def exec_stream(",
            ),
            c(
                "ExecSandboxInteractive",
                "`client.exec_interactive`",
                "async def exec_interactive(",
            ),
            c(
                "ForwardTcp",
                "`client.forward`; files: `upload` / `download` / `read_file` / `write_file`",
                "async def upload(",
            ),
            c(
                "CreateSshSession",
                "`client.create_ssh_session`",
                "async def create_ssh_session(",
            ),
            c(
                "RevokeSshSession",
                "`client.revoke_ssh_session`",
                "async def revoke_ssh_session(",
            ),
            c(
                "GetSandboxConfig",
                "`ConfigSession` (polls it when not pushed)",
                "class ConfigSession(",
            ),
            c(
                "GetSandboxProviderEnvironment",
                "`ConfigSession` (polls it when not pushed)",
                "class ConfigSession(",
            ),
            c(
                "ConnectSupervisor",
                "`ConfigSession` (supervisor side, configuration only)",
                "class ConfigSession(",
            ),
        ],
        host: &[c(
            "ConnectHost",
            "`HostSession` / `SyncHostSession` (configuration only)",
            "class HostSession(",
        )],
    },
    Language {
        name: "TypeScript",
        sources: Some("sdk-typescript/src"),
        raw: "`client.raw.<method>` (camelCase; protobuf-es types)",
        curated: &[
            c("Health", "`client.health`", "async health("),
            c(
                "CreateSandbox",
                "`client.sandboxes.create`",
                "  create(options: CreateSandboxOptions",
            ),
            c("GetSandbox", "`client.sandboxes.get`", "  get(name: string"),
            c(
                "ListSandboxes",
                "`client.sandboxes.list`",
                "  list(options: ListSandboxesOptions",
            ),
            c(
                "DeleteSandbox",
                "`client.sandboxes.delete`",
                "  delete(name: string",
            ),
            c(
                "WatchSandbox",
                "`client.sandboxes.watch` / `events` / `waitReady` / `waitDeleted`",
                "  events(name: string, options: EventsOptions",
            ),
            c(
                "GetSandboxLogs",
                "`client.sandboxes.logs`",
                "  logs(name: string, options: LogsOptions",
            ),
            c(
                "ExecSandbox",
                "`client.exec` / `execStream`",
                "  execStream(sandbox: string",
            ),
            c(
                "ExecSandboxInteractive",
                "`client.execInteractive`",
                "async execInteractive(",
            ),
            c(
                "ForwardTcp",
                "`client.forward`; files: `upload` / `download` / `readFile` / `writeFile`",
                "  readFile(sandbox: string, remote: string",
            ),
            c(
                "CreateSshSession",
                "`client.sshSessions.create`",
                "create(sandbox: string, options: CallOptions = {}): Promise<SshSession>",
            ),
            c(
                "RevokeSshSession",
                "`client.sshSessions.revoke`",
                "revoke(session: SshSession | string",
            ),
            c(
                "GetSandboxConfig",
                "`ConfigSession` (polls it when not pushed)",
                "export class ConfigSession ",
            ),
            c(
                "GetSandboxProviderEnvironment",
                "`ConfigSession` (polls it when not pushed)",
                "export class ConfigSession ",
            ),
            c(
                "ConnectSupervisor",
                "`ConfigSession` (supervisor side, configuration only)",
                "export class ConfigSession ",
            ),
        ],
        host: &[c(
            "ConnectHost",
            "`HostSession` (configuration only)",
            "export class HostSession ",
        )],
    },
    Language {
        name: "Go",
        sources: Some("sdk-go"),
        raw: "`client.Raw().<Method>` (typed; protoc-gen-go messages)",
        curated: &[
            c("Health", "`client.Health`", "func (c *Client) Health("),
            c(
                "CreateSandbox",
                "`Sandboxes().Create`",
                "func (s *Sandboxes) Create(",
            ),
            c(
                "GetSandbox",
                "`Sandboxes().Get`",
                "func (s *Sandboxes) Get(",
            ),
            c(
                "ListSandboxes",
                "`Sandboxes().List`",
                "func (s *Sandboxes) List(",
            ),
            c(
                "DeleteSandbox",
                "`Sandboxes().Delete`",
                "func (s *Sandboxes) Delete(",
            ),
            c(
                "WatchSandbox",
                "`Sandboxes().Watch` / `Events` / `WaitReady` / `WaitDeleted`",
                "func (s *Sandboxes) Events(",
            ),
            c(
                "GetSandboxLogs",
                "`Sandboxes().Logs`",
                "func (s *Sandboxes) Logs(",
            ),
            c(
                "ExecSandbox",
                "`client.Exec` / `ExecStream`",
                "func (c *Client) ExecStream(",
            ),
            c(
                "ExecSandboxInteractive",
                "`client.ExecInteractive`",
                "func (c *Client) ExecInteractive(",
            ),
            c(
                "ForwardTcp",
                "`client.Forward`; files: `Upload` / `Download` / `ReadFile` / `WriteFile`",
                "func (c *Client) Upload(",
            ),
            c(
                "CreateSshSession",
                "`SSHSessions().Create`",
                "func (s *SSHSessions) Create(",
            ),
            c(
                "RevokeSshSession",
                "`SSHSessions().Revoke`",
                "func (s *SSHSessions) Revoke(",
            ),
            c(
                "GetSandboxConfig",
                "`ConfigSession` (polls it when not pushed)",
                "func NewConfigSession(",
            ),
            c(
                "GetSandboxProviderEnvironment",
                "`ConfigSession` (polls it when not pushed)",
                "func NewConfigSession(",
            ),
            c(
                "ConnectSupervisor",
                "`ConfigSession` (supervisor side, configuration only)",
                "func NewConfigSession(",
            ),
        ],
        host: &[c(
            "ConnectHost",
            "`NewHostSession` (configuration only)",
            "func NewHostSession(",
        )],
    },
    Language {
        name: "JVM",
        sources: Some("sdk-jvm/src/main"),
        raw: "`client.raw.<method>` (Kotlin, camelCase; Java: `RawStubsAsync.of(client)`; protobuf-java messages)",
        curated: &[
            c("Health", "`client.health`", "suspend fun health("),
            c(
                "CreateSandbox",
                "`client.sandboxes.create`",
                "suspend fun create(",
            ),
            c("GetSandbox", "`client.sandboxes.get`", "suspend fun get("),
            c(
                "ListSandboxes",
                "`client.sandboxes.list`",
                "suspend fun list(",
            ),
            c(
                "DeleteSandbox",
                "`client.sandboxes.delete`",
                "suspend fun delete(",
            ),
            c(
                "WatchSandbox",
                "`client.sandboxes.events` / `openWatch` / `followLogs` / `waitReady` / `waitDeleted`",
                "fun Sandboxes.events(",
            ),
            c(
                "GetSandboxLogs",
                "`client.sandboxes.logs`",
                "suspend fun Sandboxes.logs(",
            ),
            c(
                "ExecSandbox",
                "`client.exec` / `execStream`",
                "fun execStream(",
            ),
            c(
                "ExecSandboxInteractive",
                "`client.execInteractive`",
                "suspend fun execInteractive(",
            ),
            c(
                "ForwardTcp",
                "`client.forward` / `forwardSsh`; files: `upload` / `download` / `readFile` / `writeFile`",
                "suspend fun OpenShellClient.upload(",
            ),
            c(
                "UpdateConfig",
                "`client.setSetting` / `deleteSetting` (settings only)",
                "suspend fun OpenShellClient.setSetting(",
            ),
            c(
                "CreateSshSession",
                "`client.createSshSession`",
                "suspend fun OpenShellClient.createSshSession(",
            ),
            c(
                "RevokeSshSession",
                "`client.revokeSshSession`",
                "suspend fun OpenShellClient.revokeSshSession(",
            ),
            c(
                "GetSandboxConfig",
                "`ConfigSession` (polls it when not pushed)",
                "class ConfigSession private constructor(",
            ),
            c(
                "GetSandboxProviderEnvironment",
                "`ConfigSession` (polls it when not pushed)",
                "class ConfigSession private constructor(",
            ),
            c(
                "ConnectSupervisor",
                "`ConfigSession` (supervisor side, configuration only)",
                "class ConfigSession private constructor(",
            ),
        ],
        host: &[c(
            "ConnectHost",
            "`HostSession` (configuration only)",
            "class HostSession private constructor(",
        )],
    },
];

/// Concatenated hand-written sources of a language (generated files left out).
fn sources_text(root: &Path, dir: &str) -> anyhow::Result<String> {
    let mut text = String::new();
    let mut stack = vec![root.join(dir)];
    while let Some(dir) = stack.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("rs" | "py" | "ts" | "go" | "kt" | "java")
            ) {
                let content = std::fs::read_to_string(&path)?;
                if !content.contains(MARKER) {
                    text.push_str(&content);
                }
            }
        }
    }
    Ok(text)
}

pub fn report(root: &Path, contract: &Contract) -> anyhow::Result<String> {
    let service = contract.service()?;
    let rpcs: Vec<_> = service.methods().collect();
    for lang in LANGUAGES {
        let source = match lang.sources {
            Some(dir) => sources_text(root, dir)?,
            None => String::new(),
        };
        for entry in lang.curated {
            if !rpcs.iter().any(|m| m.name() == entry.rpc) {
                bail!(
                    "parity: {} lists {} as curated, but {SERVICE} has no such RPC",
                    lang.name,
                    entry.rpc
                );
            }
            if !source.contains(entry.needle) {
                bail!(
                    "parity: {} lists {} as curated by {}, but `{}` is not in {}",
                    lang.name,
                    entry.rpc,
                    entry.api,
                    entry.needle,
                    lang.sources.unwrap_or("-")
                );
            }
        }
    }

    let mut md = format!(
        "<!-- {MARKER} -->\n\
         # API parity\n\
         \n\
         Every RPC of `{SERVICE}` and how each language reaches it. **curated**: an\n\
         idiomatic API of the SDK covers it (the cell names it); **raw only**: only the\n\
         typed raw stub does. Every RPC is reachable raw from every SDK, through the\n\
         core's raw boundary, so owner routing applies either way. **not yet**: the\n\
         language's SDK does not exist yet.\n\
         \n\
         Raw access per language: "
    );
    let raws: Vec<String> = LANGUAGES
        .iter()
        .filter(|l| l.sources.is_some())
        .map(|l| format!("{} {}", l.name, l.raw.replace("{snake}", "<method>")))
        .collect();
    md.push_str(&raws.join("; "));
    md.push_str(".\n\n| RPC | kind | owner-routed field |");
    for lang in LANGUAGES {
        let _ = write!(md, " {} |", lang.name);
    }
    md.push_str("\n|---|---|---|");
    for _ in LANGUAGES {
        md.push_str("---|");
    }
    md.push('\n');
    let mut counts = vec![(0usize, 0usize); LANGUAGES.len()];
    for method in &rpcs {
        let routed = owner_routed_field(&contract.pool, method)?
            .map(|f| format!("`{f}`"))
            .unwrap_or_default();
        let _ = write!(
            md,
            "| `{}` | {} | {routed} |",
            method.name(),
            snake_case(kind(method)).replace('_', " ")
        );
        for (i, lang) in LANGUAGES.iter().enumerate() {
            let cell = if lang.sources.is_none() {
                "not yet".to_owned()
            } else if let Some(entry) = lang.curated.iter().find(|e| e.rpc == method.name()) {
                counts[i].0 += 1;
                format!("curated: {}", entry.api)
            } else {
                counts[i].1 += 1;
                "raw only".to_owned()
            };
            let _ = write!(md, " {cell} |");
        }
        md.push('\n');
    }
    md.push_str("\nTotals: ");
    let totals: Vec<String> = LANGUAGES
        .iter()
        .zip(&counts)
        .map(|(lang, (curated, raw))| match lang.sources {
            Some(_) => format!("{} {curated} curated, {raw} raw only", lang.name),
            None => format!("{} not yet", lang.name),
        })
        .collect();
    md.push_str(&totals.join("; "));
    md.push_str(&format!(" (of {} RPCs).\n", rpcs.len()));
    host_table(root, contract, &mut md)?;
    Ok(md)
}

/// The RPCs of [`HOST_SERVICE`] (a shared supervisor host's session) and
/// the API of each language that holds it, checked against the sources like
/// the main table.
fn host_table(root: &Path, contract: &Contract, md: &mut String) -> anyhow::Result<()> {
    let service = contract
        .pool
        .get_service_by_name(HOST_SERVICE)
        .with_context(|| format!("service {HOST_SERVICE} is not in proto/"))?;
    let rpcs: Vec<_> = service.methods().collect();
    let _ = write!(
        md,
        "\n## `{HOST_SERVICE}`\n\n\
         The session of a shared supervisor host (one session carrying the sessions of\n\
         every sandbox assigned to the host), held by each SDK's host session.\n\n\
         | RPC | kind |"
    );
    for lang in LANGUAGES {
        let _ = write!(md, " {} |", lang.name);
    }
    md.push_str("\n|---|---|");
    for _ in LANGUAGES {
        md.push_str("---|");
    }
    md.push('\n');
    for lang in LANGUAGES {
        let source = match lang.sources {
            Some(dir) => sources_text(root, dir)?,
            None => String::new(),
        };
        for entry in lang.host {
            if !rpcs.iter().any(|m| m.name() == entry.rpc) {
                bail!(
                    "parity: {} lists {} as curated, but {HOST_SERVICE} has no such RPC",
                    lang.name,
                    entry.rpc
                );
            }
            if !source.contains(entry.needle) {
                bail!(
                    "parity: {} lists {} as curated by {}, but `{}` is not in {}",
                    lang.name,
                    entry.rpc,
                    entry.api,
                    entry.needle,
                    lang.sources.unwrap_or("-")
                );
            }
        }
    }
    for method in &rpcs {
        let _ = write!(
            md,
            "| `{}` | {} |",
            method.name(),
            snake_case(kind(method)).replace('_', " ")
        );
        for lang in LANGUAGES {
            let cell = match lang.host.iter().find(|e| e.rpc == method.name()) {
                _ if lang.sources.is_none() => "not yet".to_owned(),
                Some(entry) => format!("curated: {}", entry.api),
                None => "none".to_owned(),
            };
            let _ = write!(md, " {cell} |");
        }
        md.push('\n');
    }
    Ok(())
}
