//! Shared supervisor hosts with real processes (`hosts_e2e.rs`,
//! `host_failover.rs`): replicas with `--driver hosts` behind one built-in
//! edge, real `openshell-supervisor host` processes, the SDK as the client.

use std::time::Duration;

use openshell_sdk::{CallOptions, Client, ClientConfig, CreateSandbox, ExecRequest};
use openshell_testkit::cluster::{ClusterOptions, TestCluster};
use openshell_testkit::{
    Edge, Gateway, HostOptions, SupervisorHost, eventually, issue_host_token,
    issue_host_token_in_database, metric_value,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::TOKEN;

pub const HOSTS_HELD: &str = "openshell_server_supervisor_hosts";

/// Replicas with `--driver hosts` behind one built-in edge: hosts and
/// clients dial the edge (the shared address).
pub struct Setup {
    pub cluster: TestCluster,
    pub edge: Edge,
    /// The replicas' PostgreSQL store, if not the shared SQLite file.
    pub database_url: Option<String>,
}

impl Setup {
    pub async fn start(replicas: usize, member_ttl_ms: u64) -> Self {
        Self::start_with(replicas, member_ttl_ms, &[]).await
    }

    /// [`Setup::start`] with further `serve` arguments for every replica.
    pub async fn start_with(replicas: usize, member_ttl_ms: u64, extra: &[&str]) -> Self {
        Self::start_on(replicas, member_ttl_ms, extra, None).await
    }

    /// [`Setup::start_with`] on the PostgreSQL store at `database_url`.
    pub async fn start_on(
        replicas: usize,
        member_ttl_ms: u64,
        extra: &[&str],
        database_url: Option<String>,
    ) -> Self {
        let mut extra_args: Vec<String> = vec![
            "--allow-test-flags".into(),
            "--member-refresh-ms".into(),
            "300".into(),
            "--member-ttl-ms".into(),
            member_ttl_ms.to_string(),
            "--driver".into(),
            "hosts".into(),
        ];
        extra_args.extend(extra.iter().map(|arg| arg.to_string()));
        let cluster = TestCluster::start(ClusterOptions {
            replicas,
            tokens: vec![TOKEN.into()],
            extra_args,
            database_url: database_url.clone(),
            ..ClusterOptions::default()
        });
        let routes = routes(&cluster);
        let routes: Vec<(&str, &str)> = routes
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        let edge = Edge::start(&routes);
        let setup = Self {
            cluster,
            edge,
            database_url,
        };
        setup.wait_ring(replicas as f64).await;
        setup
    }

    pub async fn wait_ring(&self, members: f64) {
        for gw in self.live() {
            let ok = eventually(Duration::from_secs(15), || {
                gw.metric("openshell_server_ring_members") == Some(members)
            })
            .await;
            assert!(ok, "ring never reached {members} members");
        }
    }

    pub fn live(&self) -> impl Iterator<Item = &Gateway> {
        self.cluster.replicas.iter().filter(|gw| gw.pid().is_some())
    }

    pub fn host(&self, id: &str, isolation: &str) -> SupervisorHost {
        let token = match &self.database_url {
            Some(url) => issue_host_token_in_database(url, self.cluster.shared_dir(), id),
            None => issue_host_token(&self.cluster.shared_dir().join("data"), id),
        };
        SupervisorHost::start(HostOptions {
            gateway: self.edge.url.clone(),
            host_id: id.to_owned(),
            token,
            isolation: isolation.to_owned(),
            extra_args: Vec::new(),
            launcher: Vec::new(),
        })
    }

    /// The replica holding the (one) host's session, once one does.
    pub async fn holder(&self) -> String {
        let mut holder = None;
        let found = eventually(Duration::from_secs(30), || {
            holder = self
                .cluster
                .live_ids()
                .into_iter()
                .find(|id| held(self.cluster.replica(id)) == 1.0);
            holder.is_some()
        })
        .await;
        assert!(found, "no replica holds the host");
        holder.unwrap()
    }

    pub async fn client(&self) -> Client {
        let config = ClientConfig::builder(self.edge.url.clone())
            .token(TOKEN)
            .owner_routing(true)
            .default_deadline(Some(Duration::from_secs(30)))
            .build()
            .unwrap();
        within(10, "connect", Client::connect(config))
            .await
            .unwrap()
    }

    /// Successful relays of `kind` (`exec`, `tcp`) served on `route`
    /// (`local`, `peer`) by `replica`.
    pub fn routed(&self, replica: &str, route: &str, kind: &str) -> f64 {
        routed_on(self.cluster.replica(replica), route, kind)
    }

    pub fn peer_relays(&self) -> f64 {
        self.live()
            .map(|gw| routed_on(gw, "peer", "exec") + routed_on(gw, "peer", "tcp"))
            .sum()
    }
}

pub fn routes(cluster: &TestCluster) -> Vec<(String, String)> {
    cluster
        .ids()
        .into_iter()
        .zip(&cluster.replicas)
        .map(|(id, gw)| (id, gw.url.clone()))
        .collect()
}

pub fn held(gw: &Gateway) -> f64 {
    gw.metric(HOSTS_HELD).unwrap_or(0.0)
}

pub fn routed_on(gw: &Gateway, route: &str, kind: &str) -> f64 {
    let text = gw.metrics();
    metric_value(
        &text,
        &format!(
            r#"openshell_server_routed_request_attempts_total{{operation="relay",route="{route}",relay_kind="{kind}",outcome="success"}}"#
        ),
    )
    .unwrap_or(0.0)
}

pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {secs} s"))
}

pub async fn ready_sandbox(client: &Client, name: &str) -> String {
    client
        .sandboxes()
        .create(CreateSandbox::new().name(name), CallOptions::new())
        .await
        .expect("create");
    wait_ready(client, name).await
}

pub async fn wait_ready(client: &Client, name: &str) -> String {
    client
        .sandboxes()
        .wait_ready(name, CallOptions::new().deadline(Duration::from_secs(30)))
        .await
        .expect("ready")
        .id
}

/// An echo server on one port number in each of `sandboxes`' networks.
pub async fn echo_server(client: &Client, sandboxes: &[&str]) -> u16 {
    let mut port = 0;
    for sandbox in sandboxes {
        let link = sh(client, sandbox, "readlink /proc/self/ns/net").await;
        let net = openshell_testkit::netns::SandboxNet::from_link(&link).expect("netns");
        if port != 0 && net.is_own() {
            continue;
        }
        let listener = net.listen(("127.0.0.1", port)).unwrap();
        port = listener.local_addr().unwrap().port();
        openshell_testkit::netns::serve_echo(listener);
    }
    port
}

pub async fn forward_once(client: &Client, sandbox: &str, port: u16) {
    let handle = client
        .forward(sandbox, port, "127.0.0.1:0", CallOptions::new())
        .await
        .expect("forward");
    let mut socket = tokio::net::TcpStream::connect(handle.local_addr())
        .await
        .unwrap();
    socket.write_all(b"ping").await.unwrap();
    socket.shutdown().await.unwrap();
    let mut back = Vec::new();
    within(10, "echo", socket.read_to_end(&mut back))
        .await
        .unwrap();
    assert_eq!(back, b"ping");
    handle.close();
}

pub async fn sh(client: &Client, sandbox: &str, script: &str) -> String {
    let out = client
        .exec(
            ExecRequest::new(sandbox, ["sh", "-c", script]),
            CallOptions::new(),
        )
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 0, "{script}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `kept` into `sandbox`'s working directory and starts a detached
/// `sleep 600` there, marked with a fresh `OPENSHELL_TEST_MARK`; returns
/// the sleep's host PIDs once they show (at most 5 s).
pub async fn keep_a_file_and_a_sleeper(client: &Client, sandbox: &str) -> Vec<i32> {
    let mark = openshell_testkit::marker();
    let out = client
        .exec(
            ExecRequest::new(
                sandbox,
                [
                    "sh",
                    "-c",
                    "echo kept > kept; setsid sleep 600 </dev/null >/dev/null 2>&1 & echo started",
                ],
            )
            .env("OPENSHELL_TEST_MARK", &mark),
            CallOptions::new(),
        )
        .await
        .expect("exec");
    assert_eq!(out.stdout, b"started\n");
    let mut pids = Vec::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            pids = openshell_testkit::pids_with_env("OPENSHELL_TEST_MARK", &mark);
            !pids.is_empty()
        })
        .await,
        "the marked sleep never showed"
    );
    pids
}
