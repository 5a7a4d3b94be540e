//! Helpers for the gateway integration tests: a raw tonic client for the
//! real gateway started by testkit, and small bounded waits.
#![allow(dead_code)]

pub mod forward;
pub mod hosts;
pub mod raw_call;
pub mod raw_host;

use std::time::Duration;

use openshell_proto::open_shell_client::OpenShellClient;
use openshell_proto::*;
use openshell_testkit::{Gateway, GatewayOptions};
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

pub const TOKEN: &str = "gw-test-token-5e1f0c";

#[derive(Clone)]
pub struct Bearer(pub Option<String>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

/// A raw client whose calls pass through interceptor `I`.
pub type ClientWith<I> = OpenShellClient<InterceptedService<Channel, I>>;

pub type Client = ClientWith<Bearer>;

pub fn start() -> Gateway {
    Gateway::start(GatewayOptions::with_token(TOKEN))
}

pub async fn client_with(gw: &Gateway, token: Option<&str>) -> Client {
    let channel = Channel::from_shared(gw.url.clone())
        .unwrap()
        .connect()
        .await
        .expect("connect to gateway");
    OpenShellClient::with_interceptor(channel, Bearer(token.map(str::to_owned)))
        .max_decoding_message_size(16 * 1024 * 1024)
        .max_encoding_message_size(16 * 1024 * 1024)
}

pub async fn client(gw: &Gateway) -> Client {
    client_with(gw, Some(TOKEN)).await
}

pub fn phase(sandbox: &Sandbox) -> SandboxPhase {
    sandbox
        .status
        .as_ref()
        .map(|s| s.phase())
        .unwrap_or_default()
}

/// Creates a sandbox and waits (watch, at most 30 s) until it is READY.
pub async fn create_ready<I: Interceptor>(client: &mut ClientWith<I>, name: &str) -> Sandbox {
    client
        .create_sandbox(CreateSandboxRequest {
            name: name.to_owned(),
            ..Default::default()
        })
        .await
        .expect("create sandbox");
    wait_phase(client, name, SandboxPhase::Ready).await
}

pub async fn wait_phase<I: Interceptor>(
    client: &mut ClientWith<I>,
    name: &str,
    want: SandboxPhase,
) -> Sandbox {
    let mut stream = client
        .watch_sandbox(WatchSandboxRequest {
            sandbox: name.to_owned(),
            follow_status: true,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = stream.message().await.expect("watch event") {
            if let Some(sandbox_stream_event::Payload::Sandbox(sandbox)) = event.payload
                && phase(&sandbox) == want
            {
                return sandbox;
            }
        }
        panic!("watch ended before {want:?}");
    })
    .await;
    waited.unwrap_or_else(|_| panic!("sandbox {name} not {want:?} within 30 s"))
}

#[derive(Debug)]
pub struct ExecResult {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit_code: Option<i32>,
}

impl ExecResult {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
}

pub async fn collect(mut stream: tonic::Streaming<ExecSandboxEvent>) -> Result<ExecResult, Status> {
    let mut result = ExecResult {
        stdout: Vec::new(),
        stderr: Vec::new(),
        exit_code: None,
    };
    while let Some(event) = stream.message().await? {
        match event.payload {
            Some(exec_sandbox_event::Payload::Stdout(out)) => result.stdout.extend(out.data),
            Some(exec_sandbox_event::Payload::Stderr(err)) => result.stderr.extend(err.data),
            Some(exec_sandbox_event::Payload::Exit(exit)) => {
                assert!(result.exit_code.is_none(), "two exit events");
                result.exit_code = Some(exit.exit_code);
            }
            None => {}
        }
    }
    Ok(result)
}

pub fn exec_request(sandbox: &str, argv: &[&str]) -> ExecSandboxRequest {
    ExecSandboxRequest {
        sandbox: sandbox.to_owned(),
        command: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

pub async fn exec(client: &mut Client, request: ExecSandboxRequest) -> Result<ExecResult, Status> {
    let stream = client.exec_sandbox(request).await?.into_inner();
    tokio::time::timeout(Duration::from_secs(60), collect(stream))
        .await
        .expect("exec finished within 60 s")
}

/// The network namespace of `sandbox` (its own under isolation, else the
/// test's): test servers bound there are what its forwards reach.
pub async fn sandbox_net(
    client: &mut Client,
    sandbox: &str,
) -> openshell_testkit::netns::SandboxNet {
    let out = exec(
        client,
        exec_request(sandbox, &openshell_testkit::netns::PRINT_NETNS),
    )
    .await
    .expect("exec");
    openshell_testkit::netns::SandboxNet::from_link(&out.stdout_text())
        .expect("the sandbox's network namespace")
}

pub async fn sh(client: &mut Client, sandbox: &str, script: &str) -> ExecResult {
    exec(client, exec_request(sandbox, &["sh", "-c", script]))
        .await
        .expect("exec")
}
