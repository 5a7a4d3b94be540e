//! The `OpenShell` gRPC service: maps each RPC onto the sandbox, session and
//! stream modules. Authentication already happened in the request layer,
//! which left a `Principal` in the request extensions.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use openshell_proto::open_shell_server::OpenShell;
use openshell_proto::*;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Principal;
use crate::sandboxes::Sandboxes;
use crate::sessions::Sessions;
use crate::streams::Streams;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub struct GatewayService {
    pub sandboxes: Arc<Sandboxes>,
    pub sessions: Arc<Sessions>,
    pub streams: Streams,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn sandbox_principal<T>(request: &Request<T>) -> Result<String, Status> {
    match request.extensions().get::<Principal>() {
        Some(Principal::Sandbox(id)) => Ok(id.clone()),
        _ => Err(Status::unauthenticated("a sandbox token is required")),
    }
}

#[tonic::async_trait]
impl OpenShell for GatewayService {
    async fn health(&self, _: Request<HealthRequest>) -> Result<Response<HealthResponse>, Status> {
        let status = if self.sessions.is_shutting_down() {
            ServiceStatus::Unhealthy
        } else {
            ServiceStatus::Healthy
        };
        Ok(Response::new(HealthResponse {
            status: status as i32,
            version: VERSION.to_owned(),
        }))
    }

    async fn create_sandbox(
        &self,
        request: Request<CreateSandboxRequest>,
    ) -> Result<Response<SandboxResponse>, Status> {
        let sandbox = self.sandboxes.create(request.into_inner()).await?;
        Ok(Response::new(SandboxResponse {
            sandbox: Some(sandbox),
            service_urls: Default::default(),
        }))
    }

    async fn get_sandbox(
        &self,
        request: Request<GetSandboxRequest>,
    ) -> Result<Response<SandboxResponse>, Status> {
        let sandbox = self.sandboxes.get(request.get_ref()).await?;
        Ok(Response::new(SandboxResponse {
            sandbox: Some(sandbox),
            service_urls: Default::default(),
        }))
    }

    async fn list_sandboxes(
        &self,
        request: Request<ListSandboxesRequest>,
    ) -> Result<Response<ListSandboxesResponse>, Status> {
        Ok(Response::new(
            self.sandboxes.list(request.into_inner()).await?,
        ))
    }

    async fn delete_sandbox(
        &self,
        request: Request<DeleteSandboxRequest>,
    ) -> Result<Response<DeleteSandboxResponse>, Status> {
        Ok(Response::new(
            self.sandboxes.delete(request.into_inner()).await?,
        ))
    }

    type WatchSandboxStream = BoxStream<SandboxStreamEvent>;

    async fn watch_sandbox(
        &self,
        request: Request<WatchSandboxRequest>,
    ) -> Result<Response<Self::WatchSandboxStream>, Status> {
        let stream = self.sandboxes.watch(request.into_inner()).await?;
        Ok(Response::new(Box::pin(stream)))
    }

    type ExecSandboxStream = BoxStream<ExecSandboxEvent>;

    async fn exec_sandbox(
        &self,
        request: Request<ExecSandboxRequest>,
    ) -> Result<Response<Self::ExecSandboxStream>, Status> {
        let stream = self.streams.exec(request.into_inner()).await?;
        Ok(Response::new(Box::pin(stream)))
    }

    type ExecSandboxInteractiveStream = BoxStream<ExecSandboxEvent>;

    async fn exec_sandbox_interactive(
        &self,
        request: Request<Streaming<ExecSandboxInput>>,
    ) -> Result<Response<Self::ExecSandboxInteractiveStream>, Status> {
        let stream = self.streams.exec_interactive(request.into_inner()).await?;
        Ok(Response::new(Box::pin(stream)))
    }

    type ForwardTcpStream = BoxStream<TcpForwardFrame>;

    async fn forward_tcp(
        &self,
        request: Request<Streaming<TcpForwardFrame>>,
    ) -> Result<Response<Self::ForwardTcpStream>, Status> {
        let stream = self.streams.forward(request.into_inner()).await?;
        Ok(Response::new(Box::pin(stream)))
    }

    type ConnectSupervisorStream = BoxStream<GatewayMessage>;

    async fn connect_supervisor(
        &self,
        request: Request<Streaming<SupervisorMessage>>,
    ) -> Result<Response<Self::ConnectSupervisorStream>, Status> {
        let principal = sandbox_principal(&request)?;
        let mut inbound = request.into_inner();
        let hello = Sessions::read_hello(&mut inbound).await?;
        if hello.sandbox_id.is_empty() {
            return Err(Status::invalid_argument("hello.sandbox_id is required"));
        }
        if hello.sandbox_id != principal {
            return Err(Status::permission_denied(
                "the sandbox token does not belong to hello.sandbox_id",
            ));
        }
        if self.sessions.is_shutting_down() {
            return Err(Status::unavailable("gateway is shutting down"));
        }
        self.sandboxes.check_session_target(&principal).await?;
        let stream = self
            .sessions
            .accept(principal, inbound, self.sandboxes.clone())?;
        Ok(Response::new(Box::pin(stream)))
    }

    type RelayStreamStream = BoxStream<RelayFrame>;

    async fn relay_stream(
        &self,
        request: Request<Streaming<RelayFrame>>,
    ) -> Result<Response<Self::RelayStreamStream>, Status> {
        let principal = sandbox_principal(&request)?;
        let stream = self
            .sessions
            .claim(&principal, request.into_inner())
            .await?;
        Ok(Response::new(Box::pin(stream)))
    }
}
