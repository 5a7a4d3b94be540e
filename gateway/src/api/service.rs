//! The `OpenShell` gRPC service: maps each RPC onto the sandbox, session and
//! stream modules. Authentication already happened in the request layer,
//! which left a `Principal` in the request extensions.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use openshell_proto::open_shell_server::OpenShell;
use openshell_proto::*;
use tonic::{Request, Response, Status, Streaming};

use crate::api::request_layer::Authority;
use crate::api::ssh_sessions::{self, SshSessionConfig};
use crate::api::streams::Streams;
use crate::auth::Principal;
use crate::cluster::Cluster;
use crate::config::delivery::ConfigDelivery;
use crate::config::model::{self, ConfigModel};
use crate::sandboxes::{Sandboxes, id_of, store_status};
use crate::sessions::routing::{OWNER_TTL, RelayRouter};
use crate::sessions::{
    ConfigSink, FrameStream, GatewayStream, PushSetup, RelayStreamOut, Sessions,
};
use crate::store::OwnerRecord;

pub const WANT_OWNER: &str = "x-openshell-want-owner";
pub const OWNER: &str = "x-openshell-owner";

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub struct GatewayService {
    pub sandboxes: Arc<Sandboxes>,
    pub sessions: Arc<Sessions>,
    pub streams: Streams,
    pub router: Arc<RelayRouter>,
    pub cluster: Option<Arc<Cluster>>,
    pub config: ConfigModel,
    pub delivery: Arc<ConfigDelivery>,
    pub ssh: SshSessionConfig,
}

impl GatewayService {
    /// Placement and ownership for a new session in a cluster: a redirect
    /// when the ring places the sandbox elsewhere (and the supervisor can
    /// follow one), else the published ownership record.
    async fn place_session(
        &self,
        cluster: &Cluster,
        sandbox_id: &str,
        session_id: &str,
        hello: &SupervisorHello,
    ) -> Result<Option<SessionRedirect>, Status> {
        let me = cluster.replica_id().to_owned();
        let ring = cluster.ring();
        if hello.supports_session_redirect
            && !hello.redirected
            && let Some((owner, endpoint)) = cluster.placement(&ring, sandbox_id)
            && owner != me
            && !endpoint.is_empty()
        {
            return Ok(Some(SessionRedirect {
                peer_endpoint: endpoint,
                owner_replica_id: owner,
            }));
        }
        let off_ring = hello.redirected && ring.owner(sandbox_id).is_some_and(|owner| owner != me);
        let record = OwnerRecord {
            sandbox_id: sandbox_id.to_owned(),
            replica_id: me.clone(),
            peer_endpoint: cluster.config.peer_endpoint.clone(),
            session_id: session_id.to_owned(),
            instance_id: hello.instance_id.clone(),
            connection_epoch: hello.connection_epoch as i64,
        };
        let local_session = self.sessions.has_session(sandbox_id);
        let published = self
            .sandboxes
            .store
            .publish_owner(&record, OWNER_TTL, |existing| {
                if existing.instance_id == hello.instance_id {
                    // A newer connection of the same supervisor supersedes.
                    existing.connection_epoch > hello.connection_epoch as i64
                } else if existing.replica_id == me {
                    // Ours: only a live local session keeps out a stranger.
                    local_session
                } else {
                    // A stranger never supersedes a live replica's session.
                    cluster.is_live(&existing.replica_id)
                }
            })
            .await
            .map_err(store_status)?;
        match published {
            Ok(()) => {
                // Counted once admitted: a refused stranger is no admission.
                if off_ring {
                    self.sessions.metrics().offring_admissions.inc();
                }
                Ok(None)
            }
            Err(_) => Err(Status::unavailable(
                "supervisor session owned by another gateway replica",
            )),
        }
    }
}

impl GatewayService {
    /// A sandbox session whose hello passed its checks: placement (a
    /// redirect when the ring places it elsewhere and the supervisor can
    /// follow one), ownership, push setup and acceptance. A session inside
    /// a host session comes here too, with a hello that cannot follow a
    /// redirect.
    pub async fn start_session(
        &self,
        sandbox_id: String,
        hello: &SupervisorHello,
        inbound: impl Stream<Item = Result<SupervisorMessage, Status>> + Send + Unpin + 'static,
    ) -> Result<GatewayStream, Status> {
        if self.sessions.is_shutting_down() {
            return Err(Status::unavailable("gateway is shutting down"));
        }
        self.sandboxes.check_session_target(&sandbox_id).await?;
        self.sessions.refuse_stale(&sandbox_id, hello)?;
        let session_id = uuid::Uuid::new_v4().to_string();
        if let Some(cluster) = &self.cluster
            && let Some(redirect) = self
                .place_session(cluster, &sandbox_id, &session_id, hello)
                .await?
        {
            tracing::info!(
                sandbox_id,
                owner = redirect.owner_replica_id,
                "redirecting supervisor to its ring owner"
            );
            self.sessions
                .metrics()
                .session_redirects
                .get_or_create(&crate::metrics::RedirectLabels { reason: "connect" })
                .inc();
            return Ok(Sessions::redirect_stream(redirect));
        }
        // Push when both sides support it: the bootstrap goes inside
        // SessionAccepted and the supervisor stops polling.
        let push = if self.delivery.push_for(hello.supports_config_push) {
            Some(self.delivery.bootstrap(&sandbox_id, &session_id).await?)
        } else {
            None
        };
        let setup = push.as_ref().map(|(bootstrap, session)| PushSetup {
            bootstrap: bootstrap.clone(),
            sink: session.clone() as Arc<dyn ConfigSink>,
        });
        let stream = match self.sessions.accept(
            sandbox_id,
            session_id,
            hello,
            inbound,
            self.sandboxes.clone(),
            setup,
        ) {
            Ok(stream) => stream,
            Err(status) => {
                if let Some((_, session)) = &push {
                    session.ended();
                }
                return Err(status);
            }
        };
        if let Some((_, session)) = &push {
            self.delivery.start(session);
        }
        Ok(stream)
    }

    /// Whether a supervisor principal may act for `sandbox_id`: a sandbox
    /// token for its own sandbox, a host token for a sandbox assigned to
    /// its host. `what` names the refused action.
    async fn check_supervisor_for(
        &self,
        principal: &Principal,
        sandbox_id: &str,
        what: &str,
    ) -> Result<(), Status> {
        match principal {
            Principal::Sandbox(own) if own == sandbox_id => Ok(()),
            Principal::Sandbox(_) => Err(Status::permission_denied(format!(
                "a sandbox token may only read its own sandbox's {what}"
            ))),
            Principal::Host(host) => {
                let assigned = self
                    .sandboxes
                    .store
                    .sandbox_host(sandbox_id)
                    .await
                    .map_err(store_status)?;
                if assigned.as_deref() == Some(host.as_str()) {
                    Ok(())
                } else {
                    Err(Status::permission_denied(format!(
                        "a host token may only read the {what} of sandboxes assigned to its host"
                    )))
                }
            }
            _ => Ok(()),
        }
    }

    async fn attachment(
        &self,
        sandbox: &str,
        provider: &str,
        attach: bool,
    ) -> Result<Response<AttachProviderResponse>, Status> {
        let (response, record, scope) = self
            .config
            .set_attachment(sandbox, provider, attach)
            .await?;
        self.sandboxes.hub.wake(crate::sandboxes::id_of(&record));
        self.delivery.publish(scope);
        Ok(Response::new(response))
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The caller of a supervisor method: a sandbox token or a host token.
fn supervisor_principal<T>(request: &Request<T>) -> Result<Principal, Status> {
    match request.extensions().get::<Principal>() {
        Some(principal @ (Principal::Sandbox(_) | Principal::Host(_))) => Ok(principal.clone()),
        _ => Err(Status::unauthenticated(
            "a sandbox token or a host token is required",
        )),
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
        let mut request = request.into_inner();
        // A create-time policy becomes the sandbox's policy scope, as if
        // UpdateConfig had set it; the spec does not keep a copy that later
        // updates would leave stale.
        let policy = request
            .spec
            .as_mut()
            .and_then(|spec| spec.policy.take())
            .map(|policy| model::policy_seed(&policy))
            .transpose()?;
        let sandbox = self.sandboxes.create(request, policy).await?;
        Ok(Response::new(SandboxResponse {
            sandbox: Some(sandbox),
            service_urls: Default::default(),
        }))
    }

    async fn get_sandbox(
        &self,
        request: Request<GetSandboxRequest>,
    ) -> Result<Response<SandboxResponse>, Status> {
        let want_owner = request.metadata().contains_key(WANT_OWNER);
        let sandbox = self.sandboxes.get(request.get_ref()).await?;
        let owner = match want_owner {
            true => self.router.owner_of(id_of(&sandbox)).await,
            false => None,
        };
        let mut response = Response::new(SandboxResponse {
            sandbox: Some(sandbox),
            service_urls: Default::default(),
        });
        if let Some(owner) = owner
            && let Ok(value) = owner.parse()
        {
            response.metadata_mut().insert(OWNER, value);
        }
        Ok(response)
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

    async fn get_sandbox_logs(
        &self,
        request: Request<GetSandboxLogsRequest>,
    ) -> Result<Response<GetSandboxLogsResponse>, Status> {
        Ok(Response::new(
            self.sandboxes.get_logs(request.into_inner()).await?,
        ))
    }

    /// Each message names its sandbox; a sandbox token pushes for its own,
    /// a host token for the sandboxes assigned to it (checked once per
    /// sandbox per stream).
    async fn push_sandbox_logs(
        &self,
        request: Request<Streaming<PushSandboxLogsRequest>>,
    ) -> Result<Response<PushSandboxLogsResponse>, Status> {
        let principal = supervisor_principal(&request)?;
        let mut messages = request.into_inner();
        let mut allowed = std::collections::HashSet::new();
        while let Some(message) = messages.message().await? {
            if message.sandbox_id.is_empty() {
                return Err(Status::invalid_argument("sandbox_id is required"));
            }
            if !allowed.contains(&message.sandbox_id) {
                self.check_supervisor_for(&principal, &message.sandbox_id, "logs")
                    .await?;
                allowed.insert(message.sandbox_id.clone());
            }
            let mark = (!message.pusher.is_empty() && message.sequence > 0).then(|| {
                let sequence = i64::try_from(message.sequence).unwrap_or(i64::MAX);
                (message.pusher.as_str(), sequence)
            });
            self.sandboxes
                .push_logs(&message.sandbox_id, message.logs, mark)
                .await?;
        }
        Ok(Response::new(PushSandboxLogsResponse {}))
    }

    type ExecSandboxStream = BoxStream<ExecSandboxEvent>;

    /// Served by the raw relay route (`raw_routes`), which takes the path
    /// before this service sees it; so are the three below.
    async fn exec_sandbox(
        &self,
        _: Request<ExecSandboxRequest>,
    ) -> Result<Response<Self::ExecSandboxStream>, Status> {
        Err(Status::internal(RAW_ROUTE_ONLY))
    }

    type ExecSandboxInteractiveStream = BoxStream<ExecSandboxEvent>;

    async fn exec_sandbox_interactive(
        &self,
        _: Request<Streaming<ExecSandboxInput>>,
    ) -> Result<Response<Self::ExecSandboxInteractiveStream>, Status> {
        Err(Status::internal(RAW_ROUTE_ONLY))
    }

    type ForwardTcpStream = BoxStream<TcpForwardFrame>;

    async fn forward_tcp(
        &self,
        _: Request<Streaming<TcpForwardFrame>>,
    ) -> Result<Response<Self::ForwardTcpStream>, Status> {
        Err(Status::internal(RAW_ROUTE_ONLY))
    }

    async fn create_ssh_session(
        &self,
        request: Request<CreateSshSessionRequest>,
    ) -> Result<Response<CreateSshSessionResponse>, Status> {
        let authority = request.extensions().get::<Authority>().cloned();
        let response = ssh_sessions::create(
            &self.sandboxes,
            &self.ssh,
            authority.as_ref().map(|a| a.0.as_str()),
            request.into_inner(),
        )
        .await?;
        Ok(Response::new(response))
    }

    async fn revoke_ssh_session(
        &self,
        request: Request<RevokeSshSessionRequest>,
    ) -> Result<Response<RevokeSshSessionResponse>, Status> {
        Ok(Response::new(
            ssh_sessions::revoke(
                &self.sandboxes,
                &self.streams.ssh_forwards,
                request.into_inner(),
            )
            .await?,
        ))
    }

    type ConnectSupervisorStream = BoxStream<GatewayMessage>;

    async fn connect_supervisor(
        &self,
        request: Request<Streaming<SupervisorMessage>>,
    ) -> Result<Response<Self::ConnectSupervisorStream>, Status> {
        let principal = match request.extensions().get::<Principal>() {
            Some(Principal::Sandbox(id)) => id.clone(),
            _ => return Err(Status::unauthenticated("a sandbox token is required")),
        };
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
        let stream = self.start_session(principal, &hello, inbound).await?;
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_sandbox_config(
        &self,
        request: Request<openshell_proto::sandbox::GetSandboxConfigRequest>,
    ) -> Result<Response<openshell_proto::sandbox::GetSandboxConfigResponse>, Status> {
        let caller = request.extensions().get::<Principal>().cloned();
        let sandbox_id = request.into_inner().sandbox_id;
        if sandbox_id.is_empty() {
            return Err(Status::invalid_argument("sandbox_id is required"));
        }
        if let Some(caller) = &caller {
            self.check_supervisor_for(caller, &sandbox_id, "configuration")
                .await?;
        }
        let loaded = self.delivery.build_for_request(&sandbox_id, false).await?;
        Ok(Response::new(loaded.config))
    }

    async fn get_sandbox_provider_environment(
        &self,
        request: Request<GetSandboxProviderEnvironmentRequest>,
    ) -> Result<Response<GetSandboxProviderEnvironmentResponse>, Status> {
        let principal = supervisor_principal(&request)?;
        let sandbox_id = request.into_inner().sandbox_id;
        if sandbox_id.is_empty() {
            return Err(Status::invalid_argument("sandbox_id is required"));
        }
        self.check_supervisor_for(&principal, &sandbox_id, "provider environment")
            .await?;
        let loaded = self.delivery.build_for_request(&sandbox_id, true).await?;
        Ok(Response::new(loaded.environment.unwrap_or_default()))
    }

    async fn update_config(
        &self,
        request: Request<UpdateConfigRequest>,
    ) -> Result<Response<UpdateConfigResponse>, Status> {
        let (response, scope) = self.config.update_config(request.into_inner()).await?;
        if let Some(scope) = scope {
            self.delivery.publish(scope);
        }
        Ok(Response::new(response))
    }

    async fn create_provider(
        &self,
        request: Request<CreateProviderRequest>,
    ) -> Result<Response<ProviderResponse>, Status> {
        let provider = self
            .config
            .create_provider(request.into_inner().provider)
            .await?;
        Ok(Response::new(ProviderResponse {
            provider: Some(provider),
        }))
    }

    async fn update_provider(
        &self,
        request: Request<UpdateProviderRequest>,
    ) -> Result<Response<ProviderResponse>, Status> {
        let (provider, scope) = self
            .config
            .update_provider(request.into_inner().provider)
            .await?;
        if let Some(scope) = scope {
            self.delivery.publish(scope);
        }
        Ok(Response::new(ProviderResponse {
            provider: Some(provider),
        }))
    }

    async fn attach_provider(
        &self,
        request: Request<AttachProviderRequest>,
    ) -> Result<Response<AttachProviderResponse>, Status> {
        let request = request.into_inner();
        self.attachment(&request.sandbox, &request.provider, true)
            .await
    }

    async fn detach_provider(
        &self,
        request: Request<DetachProviderRequest>,
    ) -> Result<Response<AttachProviderResponse>, Status> {
        let request = request.into_inner();
        self.attachment(&request.sandbox, &request.provider, false)
            .await
    }

    type RelayStreamStream = BoxStream<RelayFrame>;

    async fn relay_stream(
        &self,
        _: Request<Streaming<RelayFrame>>,
    ) -> Result<Response<Self::RelayStreamStream>, Status> {
        Err(Status::internal(RAW_ROUTE_ONLY))
    }
}

/// What the generated methods of the raw relay routes answer: never sent
/// while `raw_routes` wraps this service, as `serve` does.
const RAW_ROUTE_ONLY: &str = "this method is served by the gateway's relay route";

impl GatewayService {
    /// Serves a supervisor's `RelayStream` (`frames`: its encoded messages)
    /// for the caller its token names: a sandbox claims only its own
    /// relays, a host only those of the sandboxes assigned to it now.
    pub async fn claim_relay(
        &self,
        principal: Option<Principal>,
        frames: FrameStream,
    ) -> Result<RelayStreamOut, Status> {
        match principal {
            Some(Principal::Host(host)) => {
                // The sandboxes assigned to the host now: a relay of any
                // other sandbox is not the host's to claim.
                let assigned: Vec<String> = self
                    .sandboxes
                    .store
                    .host_assignment(&host)
                    .await
                    .map_err(store_status)?
                    .iter()
                    .map(|s| id_of(s).to_owned())
                    .collect();
                self.sessions
                    .claim(|sandbox| assigned.iter().any(|a| a == sandbox), frames)
                    .await
            }
            Some(Principal::Sandbox(own)) => {
                self.sessions.claim(|sandbox| sandbox == own, frames).await
            }
            _ => Err(Status::unauthenticated(
                "a sandbox token or a host token is required",
            )),
        }
    }
}
