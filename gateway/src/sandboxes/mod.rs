//! Sandbox lifecycle: create, get, list, delete and watch, plus the phase
//! changes driven by supervisor sessions and the driver.
//!
//! Folder: this module (lifecycle: create, delete, recover, phases),
//! `driver` (the process driver: directories, supervisors, isolation),
//! `failover` (sandboxes of lost supervisor hosts and of the other driver),
//! `limits` (resource limits), `logs` (sandbox log lines) and `watch`
//! (WatchSandbox streams over the store's event log). May import
//! `auth`, `cluster`, `sessions`, `store` and `validate`; never `config`,
//! `api` or `serve`.
//!
//! Cancellation: tonic drops a handler's future when its client goes away.
//! The parts of create (insert, start the supervisor, record its pid) and
//! delete (mark, stop the supervisor, remove the record) that must not be
//! cut half-way run in a task of their own that the request only awaits, so
//! a cancelled call never leaves a supervisor that nobody recorded.

pub mod driver;
mod failover;
pub mod limits;
pub mod logs;
mod recovery;
pub mod watch;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use openshell_proto::datamodel::ObjectMeta;
use openshell_proto::{
    CreateSandboxRequest, DeleteSandboxRequest, DeleteSandboxResponse, DeletionOutcome,
    GetSandboxRequest, ListSandboxesRequest, ListSandboxesResponse, Sandbox, SandboxCondition,
    SandboxPhase, SandboxSpec, SandboxStatus,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tonic::Status;

use crate::auth;
use crate::cluster::Cluster;
use crate::metrics::{HostLostLabels, LimitLabels};
use crate::sandboxes::driver::{ProcessDriver, SupervisorExit};
use crate::sandboxes::limits::{LIMITS_NOT_ENFORCED, LimitPolicy, Limits};
use crate::sandboxes::watch::WatchHub;
use crate::sessions::hosts::{HOST_TTL, HostSessions};
use crate::sessions::routing::OWNER_TTL;
use crate::sessions::{SessionEnd, SessionHooks, Sessions};
use crate::store::{PolicySeed, Store, StoreError};
use crate::validate;

pub use failover::{Failover, HostLostPolicy};

const DEFAULT_PAGE: i32 = 100;
/// Condition type on a sandbox created with `spec.template.image`.
pub const IMAGE_IGNORED: &str = "ImageIgnored";
const MAX_PAGE: i32 = 1000;

pub struct Sandboxes {
    pub store: Store,
    pub hub: WatchHub,
    pub driver: ProcessDriver,
    pub sessions: Arc<Sessions>,
    pub cluster: Option<Arc<Cluster>>,
    /// This host's name: the driver manages supervisors of sandboxes whose
    /// `driver_host` matches.
    pub host: String,
    /// `--driver hosts`: sandboxes are assigned to shared supervisor hosts
    /// (told here of assignment changes) and no supervisor is started.
    pub pool: Option<Arc<HostSessions>>,
    /// Resource limit defaults and what this host can enforce.
    pub limits: LimitPolicy,
    /// `openshell_server_sandbox_limits_unenforced_total`.
    pub limits_unenforced: Family<LimitLabels, Counter>,
    /// `openshell_server_sandboxes_host_lost_total`.
    pub host_lost: Family<HostLostLabels, Counter>,
}

pub fn store_status(err: StoreError) -> Status {
    match err {
        StoreError::NotFound => Status::not_found("sandbox not found"),
        StoreError::Superseded(newer) => Status::aborted(format!(
            "a newer connection (epoch {newer}) of this supervisor host holds its session"
        )),
        StoreError::AlreadyExists => Status::already_exists("sandbox already exists"),
        StoreError::NoHost => Status::unavailable("no supervisor host is connected"),
        StoreError::HostsFull => Status::resource_exhausted(
            "every connected supervisor host serves as many sandboxes as its capacity allows",
        ),
        // Says which store and how long, nothing more (never the URL).
        err @ StoreError::TimedOut { .. } => {
            tracing::error!(%err, "store call timed out");
            Status::unavailable(format!("{err}; try again"))
        }
        other => {
            tracing::error!(err = %other, "store failure");
            Status::unavailable("sandbox store unavailable")
        }
    }
}

fn now() -> prost_types::Timestamp {
    prost_types::Timestamp::from(SystemTime::now())
}

pub fn phase_of(sandbox: &Sandbox) -> SandboxPhase {
    sandbox
        .status
        .as_ref()
        .map(|s| s.phase())
        .unwrap_or(SandboxPhase::Unspecified)
}

pub fn id_of(sandbox: &Sandbox) -> &str {
    sandbox
        .metadata
        .as_ref()
        .map(|m| m.id.as_str())
        .unwrap_or_default()
}

fn set_phase(sandbox: &mut Sandbox, phase: SandboxPhase, reason: &str, message: &str) {
    let status = sandbox.status.get_or_insert_with(SandboxStatus::default);
    status.set_phase(phase);
    let ready = if phase == SandboxPhase::Ready {
        "True"
    } else {
        "False"
    };
    status.conditions.retain(|c| c.r#type != "Ready");
    status.conditions.push(SandboxCondition {
        r#type: "Ready".into(),
        status: ready.into(),
        reason: reason.into(),
        message: message.into(),
        transition_time: Some(now()),
    });
}

fn is_terminal(phase: SandboxPhase) -> bool {
    matches!(
        phase,
        SandboxPhase::Ready | SandboxPhase::Completed | SandboxPhase::Stopped | SandboxPhase::Error
    )
}

impl Sandboxes {
    /// Creates a sandbox and starts its supervisor. `policy` is the
    /// create-time policy, already validated and taken out of the spec by
    /// the caller; it is stored with the record.
    pub async fn create(
        self: &Arc<Self>,
        req: CreateSandboxRequest,
        policy: Option<PolicySeed>,
    ) -> Result<Sandbox, Status> {
        validate::workspace(req.workspace_scope.as_ref())?;
        validate::unmodeled_create_inputs(&req)?;
        let name = if req.name.is_empty() {
            format!(
                "sandbox-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            )
        } else {
            req.name.clone()
        };
        validate::sandbox_name(&name)?;
        validate::labels("labels", &req.labels)?;
        validate::labels("annotations", &req.annotations)?;
        let mut spec = req.spec.unwrap_or_default();
        // Gateway-owned: AttachProvider / DetachProvider set it.
        spec.provider_attachment_epoch.clear();
        if !spec.providers.is_empty() {
            return Err(Status::invalid_argument(
                "spec.providers cannot be set at create: attach providers with AttachProvider",
            ));
        }
        validate::environment("spec.environment", &spec.environment)?;
        if let Some(template) = &spec.template {
            validate::environment("spec.template.environment", &template.environment)?;
        }
        validate::command("spec.command", &spec.command, false)?;
        // The limits it runs with, defaults included, stored in the spec.
        let resolved = self.limits.resolve(&mut spec.template)?;
        // Kept in the spec, but the process driver has no use for it.
        let image_given = spec.template.as_ref().is_some_and(|t| !t.image.is_empty());

        let id = uuid::Uuid::new_v4().to_string();
        let mut sandbox = Sandbox {
            metadata: Some(ObjectMeta {
                id: id.clone(),
                name,
                labels: req.labels,
                resource_version: 1,
                annotations: req.annotations,
                workspace: "default".into(),
                created_time: Some(now()),
                deletion_time: None,
            }),
            spec: Some(spec),
            status: None,
            host_key_fingerprint: String::new(),
        };
        set_phase(
            &mut sandbox,
            SandboxPhase::Provisioning,
            "Starting",
            "starting the supervisor",
        );
        if image_given {
            let status = sandbox.status.get_or_insert_with(SandboxStatus::default);
            status.conditions.push(SandboxCondition {
                r#type: IMAGE_IGNORED.into(),
                status: "True".into(),
                reason: "ProcessDriver".into(),
                message: "the process driver runs the sandbox on the gateway's host; \
                          spec.template.image is not used"
                    .into(),
                transition_time: Some(now()),
            });
        }
        if !resolved.unenforced.is_empty() {
            let names: Vec<&str> = resolved.unenforced.iter().map(|r| r.name()).collect();
            let status = sandbox.status.get_or_insert_with(SandboxStatus::default);
            status.conditions.push(SandboxCondition {
                r#type: LIMITS_NOT_ENFORCED.into(),
                status: "True".into(),
                reason: "NoCgroupController".into(),
                message: format!(
                    "this gateway's host cannot enforce {} limits (no writable cgroup \
                     controller); the sandbox runs without them",
                    names.join(", ")
                ),
                transition_time: Some(now()),
            });
        }
        let (token, token_hash) = auth::new_sandbox_token();
        let this = self.clone();
        let started = tokio::spawn(async move {
            let created = this
                .insert_and_start(sandbox, &token, &token_hash, policy.as_ref())
                .await;
            // Counted once the sandbox exists (also if its caller left).
            if created.is_ok() {
                for resource in &resolved.unenforced {
                    this.limits_unenforced
                        .get_or_create(&LimitLabels {
                            resource: resource.name(),
                        })
                        .inc();
                }
            }
            created
        });
        started.await.unwrap_or_else(|err| {
            tracing::error!(%err, "sandbox creation task failed");
            Err(Status::internal("sandbox creation failed"))
        })
    }

    /// Stores the new sandbox, starts its supervisor and records the
    /// supervisor's pid, holding the sandbox's driver lock throughout.
    async fn insert_and_start(
        &self,
        sandbox: Sandbox,
        token: &str,
        token_hash: &str,
        policy: Option<&PolicySeed>,
    ) -> Result<Sandbox, Status> {
        let id = id_of(&sandbox).to_owned();
        let _lifecycle = self.driver.lock(&id).await;
        if let Some(pool) = &self.pool {
            // Its host runs it: no process, no directory here.
            let host = self
                .store
                .insert_placed(&sandbox, token_hash, &self.host, policy, Some(HOST_TTL))
                .await
                .map_err(store_status)?;
            tracing::info!(
                sandbox_id = id,
                host = host.as_deref(),
                "sandbox assigned to a supervisor host"
            );
            if let Err(err) = self.driver.keep_token_copy(&id, token).await {
                tracing::warn!(sandbox_id = id, %err, "could not keep the token copy");
            }
            self.note(
                &id,
                "INFO",
                format!(
                    "sandbox created; assigned to supervisor host {}",
                    host.as_deref().unwrap_or("?")
                ),
            );
            self.hub.wake(id_of(&sandbox));
            pool.assignment_changed();
            return Ok(sandbox);
        }
        self.store
            .insert(&sandbox, token_hash, &self.host, policy)
            .await
            .map_err(store_status)?;
        self.note(
            &id,
            "INFO",
            "sandbox created; starting its supervisor".into(),
        );
        self.hub.wake(id_of(&sandbox));
        let limits = Limits::of_template(sandbox.spec.as_ref().and_then(|s| s.template.as_ref()));
        let pid = match self.driver.start(&id, token, &limits).await {
            Ok(pid) => pid,
            Err(err) => {
                tracing::error!(sandbox_id = id, %err, "could not start supervisor");
                return self
                    .update_phase(
                        &id,
                        SandboxPhase::Error,
                        "DriverFailed",
                        "could not start the supervisor",
                    )
                    .await;
            }
        };
        if pid == 0 {
            return Ok(sandbox);
        }
        match self
            .store
            .swap_supervisor(&id, 0, i64::from(pid), None)
            .await
        {
            Ok(true) => Ok(sandbox),
            // `supervisor.pid` names it; a delete finds it there.
            Err(err) => Err(store_status(err)),
            Ok(false) => {
                // Nothing else writes a pid of a sandbox being created.
                tracing::error!(sandbox_id = id, pid, "sandbox changed while starting");
                self.driver.stop_process(&id, pid).await;
                Err(Status::aborted("the sandbox changed while it was starting"))
            }
        }
    }

    pub async fn update_phase(
        &self,
        id: &str,
        phase: SandboxPhase,
        reason: &str,
        message: &str,
    ) -> Result<Sandbox, Status> {
        let sandbox = self
            .store
            .update(id, |s| set_phase(s, phase, reason, message))
            .await
            .map_err(store_status)?;
        let level = if phase == SandboxPhase::Error {
            "ERROR"
        } else {
            "INFO"
        };
        self.note(
            id,
            level,
            format!("phase {}: {reason}: {message}", phase.as_str_name()),
        );
        self.hub.wake(id_of(&sandbox));
        Ok(sandbox)
    }

    pub async fn get(&self, req: &GetSandboxRequest) -> Result<Sandbox, Status> {
        validate::workspace(req.workspace_scope.as_ref())?;
        validate::sandbox_name(&req.name)?;
        self.by_name(&req.name).await
    }

    pub async fn by_name(&self, name: &str) -> Result<Sandbox, Status> {
        match self.store.get_by_name(name).await {
            Ok(stored) => Ok(stored.sandbox),
            Err(StoreError::NotFound) => Err(Status::not_found(format!(
                "sandbox {} not found",
                validate::quote(name)
            ))),
            Err(err) => Err(store_status(err)),
        }
    }

    pub async fn list(&self, req: ListSandboxesRequest) -> Result<ListSandboxesResponse, Status> {
        validate::workspace(req.workspace_scope.as_ref())?;
        if req.page_size < 0 {
            return Err(Status::invalid_argument("page_size must not be negative"));
        }
        let page_size = match req.page_size {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        } as usize;
        let selector = validate::label_selector(&req.label_selector)?;
        let mut after = decode_page_token(&req.page_token)?;
        let mut page = Vec::new();
        // Scan in batches until the page is full or the table ends.
        loop {
            let batch = self
                .store
                .list_after(&after, (page_size as i64).max(100))
                .await
                .map_err(store_status)?;
            let exhausted = batch.len() < (page_size).max(100);
            for stored in batch {
                let meta = stored.sandbox.metadata.as_ref().expect("metadata");
                after = meta.name.clone();
                let matches = selector
                    .iter()
                    .all(|(k, v)| meta.labels.get(k).is_some_and(|have| have == v));
                if matches {
                    page.push(stored.sandbox);
                    if page.len() == page_size {
                        let more = !self
                            .store
                            .list_after(&after, 1)
                            .await
                            .map_err(store_status)?
                            .is_empty();
                        return Ok(ListSandboxesResponse {
                            sandboxes: page,
                            next_page_token: if more {
                                encode_page_token(&after)
                            } else {
                                String::new()
                            },
                        });
                    }
                }
            }
            if exhausted {
                return Ok(ListSandboxesResponse {
                    sandboxes: page,
                    next_page_token: String::new(),
                });
            }
        }
    }

    pub async fn delete(
        self: &Arc<Self>,
        req: DeleteSandboxRequest,
    ) -> Result<DeleteSandboxResponse, Status> {
        validate::workspace(req.workspace_scope.as_ref())?;
        validate::sandbox_name(&req.name)?;
        let id = match self.store.get_by_name(&req.name).await {
            Ok(stored) => id_of(&stored.sandbox).to_owned(),
            Err(StoreError::NotFound) => return self.absent(&req),
            Err(err) => return Err(store_status(err)),
        };
        let this = self.clone();
        let task_id = id.clone();
        let deleted = tokio::spawn(async move { this.mark_and_delete(&task_id).await });
        match deleted.await {
            Ok(Ok(())) => Ok(DeleteSandboxResponse {
                outcome: DeletionOutcome::Completed as i32,
                sandbox_id: id,
            }),
            // Deleted by someone else while this call waited for the lock.
            Ok(Err(StoreError::NotFound)) => self.absent(&req),
            Ok(Err(err)) => Err(store_status(err)),
            Err(err) => {
                tracing::error!(sandbox_id = id, %err, "sandbox deletion task failed");
                Err(Status::internal("sandbox deletion failed"))
            }
        }
    }

    fn absent(&self, req: &DeleteSandboxRequest) -> Result<DeleteSandboxResponse, Status> {
        if req.allow_missing {
            return Ok(DeleteSandboxResponse {
                outcome: DeletionOutcome::AlreadyAbsent as i32,
                sandbox_id: String::new(),
            });
        }
        Err(Status::not_found(format!(
            "sandbox {} not found",
            validate::quote(&req.name)
        )))
    }

    /// Marks the sandbox DELETING, stops its supervisor and removes it,
    /// holding the sandbox's driver lock (so a create still starting it
    /// has recorded its pid first).
    async fn mark_and_delete(&self, id: &str) -> Result<(), StoreError> {
        let _lifecycle = self.driver.lock(id).await;
        let stored = self.store.get_by_id(id).await?;
        let sandbox = self
            .store
            .update(id, |s| {
                set_phase(
                    s,
                    SandboxPhase::Deleting,
                    "Deleting",
                    "stopping the supervisor",
                );
                s.metadata
                    .get_or_insert_with(Default::default)
                    .deletion_time = Some(now());
            })
            .await?;
        self.hub.wake(id_of(&sandbox));
        self.finish_delete(id, stored.supervisor_pid).await
    }

    /// Stops the supervisor (the store's pid, else `supervisor.pid`),
    /// removes the directory and the record.
    async fn finish_delete(&self, id: &str, pid: i64) -> Result<(), StoreError> {
        self.sessions.close(id);
        let pid = i32::try_from(pid).ok().filter(|p| *p > 0);
        self.driver.stop(id, pid).await;
        self.store.delete(id).await?;
        if let Some(pool) = &self.pool {
            pool.assignment_changed();
        }
        self.hub.wake(id);
        tracing::info!(sandbox_id = id, "sandbox deleted");
        Ok(())
    }

    /// A supervisor's hello passed; the sandbox must exist and not be going away.
    pub async fn check_session_target(&self, sandbox_id: &str) -> Result<(), Status> {
        let stored = self
            .store
            .get_by_id(sandbox_id)
            .await
            .map_err(store_status)?;
        if phase_of(&stored.sandbox) == SandboxPhase::Deleting {
            return Err(Status::failed_precondition("sandbox is being deleted"));
        }
        Ok(())
    }
}

#[tonic::async_trait]
impl SessionHooks for Sandboxes {
    async fn heartbeat(&self, sandbox_id: &str, session_id: &str) -> bool {
        if self.cluster.is_none() {
            return true;
        }
        let renewal = self.store.renew_owner(sandbox_id, session_id);
        match tokio::time::timeout(Duration::from_secs(5), renewal).await {
            Ok(Ok(held)) => held,
            // A store hiccup is not a lost ownership; the next beat retries.
            _ => true,
        }
    }

    async fn accepted(&self, sandbox_id: &str, ssh_host_key_fingerprint: &str) {
        let fingerprint = if validate::host_key_fingerprint(ssh_host_key_fingerprint) {
            ssh_host_key_fingerprint
        } else {
            tracing::warn!(sandbox_id, "ignoring a malformed SSH host key fingerprint");
            ""
        };
        let result = self
            .store
            .update(sandbox_id, |s| {
                set_phase(
                    s,
                    SandboxPhase::Ready,
                    "SupervisorConnected",
                    "supervisor session accepted",
                );
                failover::clear_host_wait(s);
                s.host_key_fingerprint = fingerprint.to_owned();
            })
            .await
            .map_err(store_status);
        match result {
            Ok(sandbox) => self.hub.wake(id_of(&sandbox)),
            Err(status) => tracing::warn!(sandbox_id, %status, "could not mark sandbox ready"),
        }
        self.note(sandbox_id, "INFO", "supervisor session accepted".into());
    }

    async fn ended(&self, end: SessionEnd) {
        let (sandbox_id, session_id, lost) = match end {
            SessionEnd::Lost {
                sandbox_id,
                session_id,
            } => (sandbox_id, session_id, true),
            SessionEnd::Replaced {
                sandbox_id,
                session_id,
            } => (sandbox_id, session_id, false),
        };
        if self.cluster.is_some() {
            let _ = self.store.release_owner(&sandbox_id, &session_id).await;
        }
        if !lost {
            return;
        }
        // Another replica may already hold the supervisor's new session.
        if self.cluster.is_some()
            && matches!(self.store.owner(&sandbox_id, OWNER_TTL).await, Ok(Some(_)))
        {
            return;
        }
        // Decided inside the store's update, so that a new session of the
        // supervisor on this replica (registered before its `accepted` marks
        // the sandbox READY) is seen: the lost session's end must not turn a
        // reconnected sandbox UNKNOWN after the new session marked it READY.
        let mut marked = false;
        let updated = self
            .store
            .update(&sandbox_id, |s| {
                if phase_of(s) == SandboxPhase::Ready && !self.sessions.has_session(&sandbox_id) {
                    set_phase(
                        s,
                        SandboxPhase::Unknown,
                        "SupervisorDisconnected",
                        "supervisor session lost; waiting for it to reconnect",
                    );
                    marked = true;
                }
            })
            .await;
        self.note(
            &sandbox_id,
            "WARN",
            "supervisor session lost; waiting for it to reconnect".into(),
        );
        if let (Ok(sandbox), true) = (updated, marked) {
            self.hub.wake(id_of(&sandbox));
        }
    }
}

fn encode_page_token(after: &str) -> String {
    format!("n1.{}", hex::encode(after))
}

fn decode_page_token(token: &str) -> Result<String, Status> {
    if token.is_empty() {
        return Ok(String::new());
    }
    token
        .strip_prefix("n1.")
        .and_then(|h| hex::decode(h).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| Status::invalid_argument("page_token is not one this gateway issued"))
}

/// The environment an exec runs with: template, then sandbox, then request.
pub fn merged_environment(
    spec: Option<&SandboxSpec>,
    request: &HashMap<String, String>,
) -> HashMap<String, String> {
    let mut env = HashMap::new();
    if let Some(spec) = spec {
        if let Some(template) = &spec.template {
            env.extend(template.environment.clone());
        }
        env.extend(spec.environment.clone());
    }
    env.extend(request.clone());
    env
}
