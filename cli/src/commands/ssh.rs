//! `openshell ssh-proxy` (an ssh `ProxyCommand`) and `openshell ssh` (the
//! system ssh through it, the host key pinned).
//!
//! `ssh-proxy SANDBOX [--port N] [--owner REPLICA]` pumps stdin and stdout
//! over one `ForwardTcp` stream (sdk-core's `forward_io`) to the sandbox's
//! embedded SSH server (the `ssh` target) or, with `--port`, to TCP port N
//! on loopback inside it. The stream carries the owner hint
//! (`x-openshell-replica`): from a `GetSandbox` lookup, or, with `--owner`,
//! from the flag without any lookup. A wrong `--owner` costs what a stale
//! cache entry costs: a replica the edge cannot reach gets the core's single
//! unrouted retry, a live non-owner relays the stream.
//!
//! `ssh SANDBOX [-- ARGS]`: looks the sandbox and its owner up, asks the
//! gateway for the host key fingerprint (`CreateSshSession`, the session
//! token revoked at once: the proxy authenticates with the user's
//! credentials), makes sure the managed known_hosts holds a key with that
//! fingerprint (learning it with `ssh-keyscan` through a one-off local
//! forward when it does not), then runs
//! `ssh -o ProxyCommand='openshell ssh-proxy SANDBOX --owner OWNER'` with
//! strict host key checking against that file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ForwardTarget};
use tokio::net::TcpListener;

use super::check_name;
use crate::args::{SshArgs, SshConfigArgs, SshProxyArgs};
use crate::failure::{EXIT_REMOTE_COMMAND_FAILED, Failure, io};
use crate::known_hosts;
use crate::settings::{Settings, config_dir};

/// How long `ssh` waits for a new sandbox's supervisor to report its key.
const HOST_KEY_WAIT: Duration = Duration::from_secs(15);

pub async fn proxy(args: SshProxyArgs, settings: &Settings) -> Result<u8, Failure> {
    check_name("sandbox", &args.sandbox)?;
    let client = settings.connect().await?;
    if let Some(owner) = &args.owner {
        client.assume_owner(&args.sandbox, owner)?;
    }
    let target = match args.port {
        Some(port) => ForwardTarget::Tcp(port),
        None => ForwardTarget::Ssh,
    };
    client
        .forward_io(
            &args.sandbox,
            target,
            None,
            tokio::io::stdin(),
            stdout_closing_on_shutdown()?,
            CallOptions::new(),
        )
        .await?;
    Ok(0)
}

/// Stdout as a writer whose shutdown (the target's EOF) closes file
/// descriptor 1, so that ssh reads EOF from its `ProxyCommand`: tokio's own
/// stdout only flushes on shutdown, and ssh would wait for more.
fn stdout_closing_on_shutdown() -> Result<CloseOnShutdown<tokio::fs::File>, Failure> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let fd = std::io::stdout().as_raw_fd();
    // SAFETY: fd 1 is open for the life of the process and nothing else in
    // `ssh-proxy` writes to it (no println); from here it is owned here.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(CloseOnShutdown(Some(tokio::fs::File::from_std(
        std::fs::File::from(owned),
    ))))
}

/// A writer that is flushed and dropped (closed) on shutdown.
struct CloseOnShutdown<W>(Option<W>);

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for CloseOnShutdown<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.0.as_mut() {
            Some(w) => std::pin::Pin::new(w).poll_write(cx, buf),
            None => std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.0.as_mut() {
            Some(w) => std::pin::Pin::new(w).poll_flush(cx),
            None => std::task::Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if let Some(w) = self.0.as_mut() {
            std::task::ready!(std::pin::Pin::new(w).poll_flush(cx))?;
        }
        self.0 = None;
        std::task::Poll::Ready(Ok(()))
    }
}

pub async fn run(args: SshArgs, settings: &Settings) -> Result<u8, Failure> {
    ssh(args, settings)
        .await
        .map_err(|f| f.with_exit(EXIT_REMOTE_COMMAND_FAILED))
}

/// The alias under which a sandbox's keys are pinned.
fn alias_of(sandbox_id: &str) -> Result<String, Failure> {
    check_name("sandbox id", sandbox_id)?;
    Ok(format!("openshell-{sandbox_id}"))
}

/// A word for `sh -c` (what ssh runs a ProxyCommand with), with `%`
/// doubled for ssh's own token expansion.
fn proxy_word(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''").replace('%', "%%"))
}

/// The host key fingerprint the gateway vouches for (the sandbox's
/// `host_key_fingerprint`; no SSH session token is minted for it). A fresh
/// sandbox's supervisor may not have reported it yet: asked again, bounded.
/// `first` is the fingerprint of the lookup the caller already made.
async fn host_key_fingerprint(
    client: &Client,
    sandbox: &str,
    first: String,
) -> Result<String, Failure> {
    let started = tokio::time::Instant::now();
    let mut fp = first;
    loop {
        if !fp.is_empty() {
            if !known_hosts::valid_fingerprint(&fp) {
                return Err(Failure::new(
                    "protocol",
                    "the gateway's host key fingerprint is not of the form SHA256:<43 base64 characters>",
                ));
            }
            return Ok(fp);
        }
        if started.elapsed() >= HOST_KEY_WAIT {
            return Err(Failure::new(
                "failed_precondition",
                format!(
                    "sandbox {sandbox:?} has reported no SSH host key within {}s",
                    HOST_KEY_WAIT.as_secs()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        fp = client
            .sandboxes()
            .get(sandbox, CallOptions::new())
            .await?
            .proto
            .host_key_fingerprint;
    }
}

/// Learns the sandbox's host keys with `ssh-keyscan` through a local
/// listener that forwards each connection to the `ssh` target, and keeps
/// those with fingerprint `fp`.
async fn scan_host_keys(
    client: &Client,
    sandbox: &str,
    fp: &str,
) -> Result<Vec<known_hosts::HostKey>, Failure> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| io("binding a local port for ssh-keyscan", &e))?;
    let port = listener
        .local_addr()
        .map_err(|e| io("reading the local port", &e))?
        .port();
    let forwarding = {
        let client = client.clone();
        let sandbox = sandbox.to_owned();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let client = client.clone();
                let sandbox = sandbox.clone();
                tokio::spawn(async move {
                    let (read, write) = socket.into_split();
                    let _ = client
                        .forward_io(
                            &sandbox,
                            ForwardTarget::Ssh,
                            None,
                            read,
                            write,
                            CallOptions::new(),
                        )
                        .await;
                });
            }
        })
    };
    let scan = tokio::process::Command::new("ssh-keyscan")
        .args(["-T", "10", "-p", &port.to_string(), "127.0.0.1"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let scanned = tokio::time::timeout(Duration::from_secs(60), scan).await;
    forwarding.abort();
    let output = match scanned {
        Err(_) => {
            return Err(Failure::new(
                "deadline_exceeded",
                "ssh-keyscan took over 60s",
            ));
        }
        Ok(Err(e)) => return Err(io("running ssh-keyscan (install openssh-client)", &e)),
        Ok(Ok(output)) => output,
    };
    let keys = known_hosts::matching_scanned(&String::from_utf8_lossy(&output.stdout), fp);
    if keys.is_empty() {
        return Err(Failure::new(
            "host_key_mismatch",
            format!(
                "sandbox {sandbox:?} offered no SSH host key with the fingerprint the gateway reports ({fp})"
            ),
        ));
    }
    Ok(keys)
}

fn known_hosts_path() -> Result<PathBuf, Failure> {
    Ok(config_dir()?.join("known_hosts"))
}

/// The `ProxyCommand` running this executable's `ssh-proxy`.
fn proxy_command(
    sandbox: &str,
    owner: Option<&str>,
    endpoint: Option<&str>,
) -> Result<String, Failure> {
    let exe = std::env::current_exe().map_err(|e| io("finding the openshell executable", &e))?;
    let exe = exe
        .to_str()
        .ok_or_else(|| Failure::new("io", "the openshell executable's path is not UTF-8"))?;
    let mut proxy = proxy_word(exe);
    if let Some(endpoint) = endpoint {
        proxy.push_str(&format!(" --endpoint {}", proxy_word(endpoint)));
    }
    proxy.push_str(&format!(" ssh-proxy {}", proxy_word(sandbox)));
    if let Some(owner) = owner {
        proxy.push_str(&format!(" --owner {}", proxy_word(owner)));
    }
    Ok(proxy)
}

/// `ssh ... SANDBOX ARGS` with the proxy, the alias and the pinned file.
fn ssh_command(
    sandbox: &str,
    proxy: &str,
    alias: &str,
    known_hosts: &Path,
    args: &[String],
    settings: &Settings,
) -> Result<std::process::Command, Failure> {
    let known = known_hosts
        .to_str()
        .ok_or_else(|| Failure::new("io", "the known_hosts path is not UTF-8"))?;
    let mut cmd = std::process::Command::new("ssh");
    cmd.arg("-o")
        .arg(format!("ProxyCommand={proxy}"))
        .arg("-o")
        .arg(format!("HostKeyAlias={alias}"))
        .arg("-o")
        .arg(format!("UserKnownHostsFile=\"{known}\""))
        .args(["-o", "GlobalKnownHostsFile=/dev/null"])
        .args(["-o", "StrictHostKeyChecking=yes"])
        .args(["-o", "UpdateHostKeys=no"])
        .args(["-o", "CheckHostIP=no"])
        .arg(sandbox)
        .args(args);
    // The proxy reads the same settings from its environment: no token on
    // any command line.
    cmd.env("OPENSHELL_ENDPOINT", &settings.endpoint);
    match &settings.token {
        Some(token) => cmd.env("OPENSHELL_TOKEN", token),
        None => cmd.env_remove("OPENSHELL_TOKEN"),
    };
    match &settings.ca_file {
        Some(ca) => cmd.env("OPENSHELL_CA_FILE", ca),
        None => cmd.env_remove("OPENSHELL_CA_FILE"),
    };
    Ok(cmd)
}

/// What `ssh` and `ssh-config` need: the owner, the pinned alias and the
/// known_hosts file holding a key the gateway vouched for.
struct Prepared {
    owner: Option<String>,
    alias: String,
    known_hosts: PathBuf,
}

async fn prepare(sandbox: &str, settings: &Settings) -> Result<Prepared, Failure> {
    check_name("sandbox", sandbox)?;
    let client = settings.connect().await?;
    let (found, owner) = client
        .sandboxes()
        .get_with_owner(sandbox, CallOptions::new())
        .await?;
    let alias = alias_of(&found.id)?;
    let first = found.proto.host_key_fingerprint.clone();
    let fp = host_key_fingerprint(&client, sandbox, first).await?;
    let known = known_hosts_path()?;
    if !known_hosts::pinned(&known, &alias, &fp)? {
        let keys = scan_host_keys(&client, sandbox, &fp).await?;
        known_hosts::replace(&known, &alias, &keys)?;
    }
    Ok(Prepared {
        owner,
        alias,
        known_hosts: known,
    })
}

async fn ssh(args: SshArgs, settings: &Settings) -> Result<u8, Failure> {
    let prepared = prepare(&args.sandbox, settings).await?;
    let mut cmd = ssh_command(
        &args.sandbox,
        &proxy_command(&args.sandbox, prepared.owner.as_deref(), None)?,
        &prepared.alias,
        &prepared.known_hosts,
        &args.args,
        settings,
    )?;
    // ssh owns the terminal now; our own signal handling stays out of it
    // (Ctrl-C reaches ssh through the terminal's process group).
    let status = tokio::task::spawn_blocking(move || cmd.status())
        .await
        .map_err(|e| Failure::new("io", format!("waiting for ssh: {e}")))?
        .map_err(|e| io("running ssh (install openssh-client)", &e))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => (code & 0xff) as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        (None, None) => EXIT_REMOTE_COMMAND_FAILED,
    })
}

/// `openshell ssh-config SANDBOX`: a `Host` block for ssh_config with the
/// proxy (endpoint included; the token is read by the proxy from the
/// environment or the config file, never written here), the owner and the
/// pinned host key.
pub async fn config(args: SshConfigArgs, settings: &Settings) -> Result<u8, Failure> {
    let host = args.host.clone().unwrap_or_else(|| args.sandbox.clone());
    check_name("host", &host)?;
    let prepared = prepare(&args.sandbox, settings).await?;
    let mut proxy = proxy_command(
        &args.sandbox,
        prepared.owner.as_deref(),
        Some(&settings.endpoint),
    )?;
    if let Some(ca) = &settings.ca_file {
        let ca = ca
            .to_str()
            .ok_or_else(|| Failure::new("io", "the CA file's path is not UTF-8"))?;
        proxy.push_str(&format!(" --ca-file {}", proxy_word(ca)));
    }
    println!("Host {host}");
    println!("  ProxyCommand {proxy}");
    println!("  HostKeyAlias {}", prepared.alias);
    println!(
        "  UserKnownHostsFile \"{}\"",
        prepared.known_hosts.display()
    );
    println!("  StrictHostKeyChecking yes");
    println!("  UpdateHostKeys no");
    println!("  CheckHostIP no");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_words_survive_sh_and_ssh_tokens() {
        assert_eq!(proxy_word("/a b/openshell"), "'/a b/openshell'");
        assert_eq!(proxy_word("it's"), r"'it'\''s'");
        assert_eq!(proxy_word("50%"), "'50%%'");
    }

    #[test]
    fn the_ssh_command_carries_no_token() {
        let settings = Settings {
            endpoint: "http://127.0.0.1:1".into(),
            token: Some("tok-secret-9".into()),
            ca_file: None,
        };
        let proxy = proxy_command("box", Some("gw-1"), None).unwrap();
        let cmd = ssh_command(
            "box",
            &proxy,
            "openshell-id",
            Path::new("/tmp/kh"),
            &["uname".into()],
            &settings,
        )
        .unwrap();
        let argv: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(argv.iter().all(|a| !a.contains("tok-secret-9")), "{argv:?}");
        assert!(
            argv.iter()
                .any(|a| a.starts_with("ProxyCommand=")
                    && a.ends_with("ssh-proxy 'box' --owner 'gw-1'")),
            "{argv:?}"
        );
        assert!(argv.contains(&"StrictHostKeyChecking=yes".to_owned()));
        assert_eq!(argv.last().unwrap(), "uname");
    }
}
