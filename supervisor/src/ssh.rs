//! The embedded SSH server: every sandbox answers SSH without installing a
//! server in it.
//!
//! It never listens on a port. The gateway opens an `ssh` relay (the target
//! of `ForwardTcp`'s `ssh`, or a `RelayOpen` without a target) and the
//! supervisor runs one SSH connection over that relay stream, with russh.
//! The relay is the authentication: only a caller the gateway already
//! admitted (a user token, or an SSH session token for this very sandbox)
//! gets a relay, so the server offers the `none` method and accepts it for
//! any user name; there are no client keys or passwords to manage, and a
//! connection that reaches this server cannot come from anywhere else.
//!
//! Every channel runs as an exec of this sandbox ([`channel`]), through the
//! same machinery as `ExecSandbox`: inside the sandbox's namespaces, as its
//! uid, with the sandbox spec's environment (which the gateway sends in the
//! relay's target) and over it the one the client asks for. `shell` and
//! `exec` requests run the sandbox's
//! shell (with a pty after `pty-req`, resized by `window-change`, with the
//! `env` variables asked for); the `sftp` subsystem runs the built-in SFTP
//! server (`crate::sftp`) the same way, so scp and sftp see the sandbox's files
//! and nothing else. Port forwarding, agent and X11 forwarding are refused.
//!
//! The host key ([`HostKey`]) is one ed25519 key per sandbox, made on the
//! first start and kept in the sandbox's directory outside its working
//! directory (hidden from sandbox processes); its fingerprint goes to the
//! gateway in the session's hello, so clients can pin it.
//!
//! Input sent to channels and not read yet is bounded by one budget per
//! process ([`input_budget`]): past it, the connections sending more are
//! not read until programs read.

mod channel;
pub mod input_budget;

use std::collections::HashMap;
use std::future::Future;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use russh::keys::ssh_key::LineEnding;
use russh::keys::{HashAlg, PrivateKey};
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelId, ChannelOpenFailure, MethodKind, MethodSet};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::exec::ExecSettings;
use crate::relay::{self, RelayContext};
use crate::transport;

/// Bytes buffered in memory between the relay and the SSH server.
const PIPE_BUFFER: usize = 256 * 1024;
/// Session channels open at once on one SSH connection; more are refused
/// (`resource shortage`). Bounds the processes one connection can hold
/// (their unread input is the budget's, [`input_budget`]).
const MAX_CHANNELS: usize = 16;

/// The sandbox's SSH host key.
#[derive(Clone)]
pub struct HostKey {
    key: Arc<PrivateKey>,
}

impl std::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostKey")
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

impl HostKey {
    /// Loads the key at `path`, or makes one there (mode 0600) when there is
    /// none.
    pub fn load_or_create(path: &Path) -> anyhow::Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let key = PrivateKey::from_openssh(text.as_bytes())
                    .with_context(|| format!("SSH host key {}", path.display()))?;
                return Ok(Self { key: Arc::new(key) });
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                return Err(err).with_context(|| format!("SSH host key {}", path.display()));
            }
        }
        let key = Self::generate();
        let text = key
            .key
            .to_openssh(LineEnding::LF)
            .context("encoding the SSH host key")?;
        // Written beside its place and renamed, so a crash never leaves half
        // a key; never through a symlink.
        let tmp = path.with_extension("tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        file.write_all(text.as_bytes())
            .and_then(|()| file.sync_all())
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("creating {}", path.display()))?;
        Ok(key)
    }

    /// A fresh key that lives only in memory.
    pub fn generate() -> Self {
        let seed: [u8; 32] = rand_seed();
        let pair = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&seed);
        Self {
            key: Arc::new(PrivateKey::from(pair)),
        }
    }

    /// `SHA256:<base64>`, as OpenSSH prints it.
    pub fn fingerprint(&self) -> String {
        self.key
            .public_key()
            .fingerprint(HashAlg::Sha256)
            .to_string()
    }
}

fn rand_seed() -> [u8; 32] {
    let mut seed = [0u8; 32];
    // getrandom(2): the kernel's CSPRNG.
    let mut filled = 0;
    while filled < seed.len() {
        // SAFETY: writes at most the remaining length into `seed`.
        let n =
            unsafe { libc::getrandom(seed[filled..].as_mut_ptr().cast(), seed.len() - filled, 0) };
        if n > 0 {
            filled += n as usize;
        }
    }
    seed
}

/// The server's settings for one connection with `host_key`.
pub fn config(host_key: &HostKey) -> Arc<russh::server::Config> {
    Arc::new(russh::server::Config {
        server_id: russh::SshId::Standard("SSH-2.0-OpenShell".into()),
        methods: MethodSet::from(&[MethodKind::None][..]),
        keys: vec![(*host_key.key).clone()],
        auth_rejection_time: Duration::from_millis(100),
        auth_rejection_time_initial: Some(Duration::ZERO),
        inactivity_timeout: None,
        // A client that vanished without closing is noticed by the gateway
        // (HTTP/2 keepalive), which ends the relay and with it this
        // connection. No SSH keepalive: a connection stopped by the input
        // budget reads nothing, answers included, and must not be
        // mistaken for a dead one.
        keepalive_interval: None,
        nodelay: true,
        ..Default::default()
    })
}

/// Claims the relay and serves one SSH connection over it until it ends
/// or `cancel` resolves. `environment`: the sandbox's spec environment,
/// which every channel starts with (the relay's `SshRelayTarget`).
pub async fn run(
    ctx: &RelayContext,
    channel_id: &str,
    host_key: Option<&HostKey>,
    exec: Arc<ExecSettings>,
    environment: HashMap<String, String>,
    cancel: impl Future<Output = ()>,
) {
    // Built per connection from the sandbox's key: a host serving many
    // sandboxes keeps one key each, not one server configuration each.
    let Some(server) = host_key.map(config) else {
        relay::report_failure(ctx, channel_id, "this sandbox has no SSH server".into()).await;
        return;
    };
    let mut cancel = pin!(cancel);
    let claimed = tokio::select! {
        _ = cancel.as_mut() => return,
        claimed = relay::claim(ctx, channel_id) => claimed,
    };
    let claimed = match claimed {
        Ok(claimed) => claimed,
        Err(status) => {
            debug!(channel_id, error = %transport::describe_status(&status), "claiming ssh relay failed");
            relay::report_failure(
                ctx,
                channel_id,
                format!("claim relay: {}", transport::describe_status(&status)),
            )
            .await;
            return;
        }
    };
    // The SSH server runs on one end of an in-memory pipe; the relay pump
    // moves the other end's bytes, half-closes included. When the relay
    // ends, the pipe closes, the connection ends, and every channel's
    // process is killed (its channel task sees the channel gone).
    let (ours, theirs) = tokio::io::duplex(PIPE_BUFFER);
    // Russh reads its end only while the connection is within the input
    // budget; `ended` lets a stopped connection end with the relay.
    let input = input_budget::budget().connection();
    let ended = CancellationToken::new();
    let theirs = input_budget::GatedStream::new(theirs, input.clone(), ended.clone());
    let connection = Connection {
        exec,
        environment: Arc::new(environment),
        channels: Arc::new(AtomicUsize::new(0)),
        input,
        inputs: HashMap::new(),
    };
    let id = channel_id.to_owned();
    // Its version exchange needs the pump running: a task of its own.
    tokio::spawn(async move {
        let result = match russh::server::run_stream(server, theirs, connection).await {
            Ok(session) => session.await,
            Err(err) => Err(err),
        };
        if let Err(err) = result {
            debug!(channel_id = id, error = %err, "ssh connection ended with an error");
        }
    });
    let pumping = crate::forward::pump_watching(
        ours,
        claimed.out,
        claimed.inbound,
        cancel.as_mut(),
        ended.clone(),
    );
    // `ended` fires when the gateway ended the relay: a connection stopped
    // by the budget then reads EOF, and the pipe's end it held goes away.
    pumping.await;
    ended.cancel();
    debug!(channel_id, "ssh relay finished");
}

/// One SSH connection: accepts the `none` authentication and session
/// channels (up to [`MAX_CHANNELS`] at once), each served by its own task.
struct Connection {
    exec: Arc<ExecSettings>,
    /// The sandbox's spec environment.
    environment: Arc<HashMap<String, String>>,
    /// Session channels open now.
    channels: Arc<AtomicUsize>,
    /// This connection's share of the input budget, and each channel's.
    input: Arc<input_budget::ConnectionInput>,
    inputs: HashMap<ChannelId, Arc<input_budget::ChannelInput>>,
}

impl Connection {
    fn charge(&self, channel: ChannelId, cost: usize) {
        if let Some(input) = self.inputs.get(&channel) {
            input.charge(cost);
        }
    }
}

/// Counts one open channel until dropped.
struct OpenChannel(Arc<AtomicUsize>);

impl Drop for OpenChannel {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl russh::server::Handler for Connection {
    type Error = russh::Error;

    /// The relay already authenticated the caller (see the module doc).
    async fn auth_none(&mut self, _user: &str) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let open = self.channels.fetch_add(1, Ordering::AcqRel);
        let counted = OpenChannel(self.channels.clone());
        if open >= MAX_CHANNELS {
            debug!(
                open,
                "ssh channel refused: too many open on this connection"
            );
            drop(counted);
            reply.reject(ChannelOpenFailure::ResourceShortage).await;
            return Ok(());
        }
        reply.accept().await;
        let (exec, environment) = (self.exec.clone(), self.environment.clone());
        let input = input_budget::ChannelInput::new(self.input.clone());
        self.inputs.retain(|_, input| !input.is_closed());
        self.inputs.insert(channel.id(), input.clone());
        tokio::spawn(async move {
            let _counted = counted;
            channel::serve(channel, exec, &environment, input).await;
        });
        Ok(())
    }

    // Input is counted here, in the connection's loop, before it reads the
    // next packet: the channel's task may not have run yet.
    async fn data(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.charge(channel, input_budget::data_cost(data.len()));
        Ok(())
    }

    async fn channel_eof(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.charge(channel, input_budget::FRAME_CHARGE);
        Ok(())
    }

    async fn window_change_request(
        &mut self,
        channel: ChannelId,
        _col_width: u32,
        _row_height: u32,
        _pix_width: u32,
        _pix_height: u32,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.charge(channel, input_budget::FRAME_CHARGE);
        Ok(())
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        _cols: u32,
        _rows: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn env_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        _value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if channel::acceptable_env_name(name) {
            session.channel_success(channel)
        } else {
            session.channel_failure(channel)
        }
    }

    async fn shell_request(
        &mut self,
        channel: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        _command: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        session.channel_success(channel)
    }

    async fn subsystem_request(
        &mut self,
        channel: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if name == channel::SFTP {
            session.channel_success(channel)
        } else {
            session.channel_failure(channel)
        }
    }
}
