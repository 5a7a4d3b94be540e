//! Health and sandbox lifecycle: create, get, list, delete, watch, and
//! waiting for READY or for deletion.
//!
//! Waiting is driven by `WatchSandbox` (the first event is a snapshot, later
//! ones are changes), never by polling: [`Sandboxes::wait_ready`] returns as
//! soon as the gateway reports READY and is bounded by the call deadline.

use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use futures::StreamExt;
use futures::stream::BoxStream;
use openshell_proto as pb;
pub use openshell_proto::{DeletionOutcome, SandboxPhase, ServiceStatus};

use crate::client::{CallOptions, Client, DeadlineKind, Resolved};
use crate::error::Error;
use crate::metadata::SERVED_BY;
use crate::paths;
use crate::raw::{decode, stop_after_error};
use crate::routing::{owner_from, owner_lookup_metadata};

/// A sandbox as the gateway reported it.
///
/// The common fields are lifted out; everything else is in `proto`.
/// `Debug` leaves out the spec (its environment may hold secrets).
#[derive(Clone, PartialEq)]
pub struct Sandbox {
    /// Server-assigned id.
    pub id: String,
    /// Name (unique in its workspace).
    pub name: String,
    /// Lifecycle phase.
    pub phase: SandboxPhase,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Exit code of the main process once it ended.
    pub exit_code: Option<i32>,
    /// Increases on every change.
    pub resource_version: u64,
    /// The full message.
    pub proto: pb::Sandbox,
}

impl Sandbox {
    /// Lifts the common fields out of the wire message.
    pub fn from_proto(proto: pb::Sandbox) -> Self {
        // Copies the few fields it keeps, not the whole metadata and status.
        let (id, name, labels, resource_version) = match &proto.metadata {
            Some(m) => (
                m.id.clone(),
                m.name.clone(),
                m.labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                m.resource_version,
            ),
            None => Default::default(),
        };
        let (phase, exit_code) = proto
            .status
            .as_ref()
            .map_or((0, None), |s| (s.phase, s.exit_code));
        Self {
            id,
            name,
            phase: SandboxPhase::try_from(phase).unwrap_or(SandboxPhase::Unknown),
            labels,
            exit_code,
            resource_version,
            proto,
        }
    }

    /// Whether the sandbox is READY.
    pub fn is_ready(&self) -> bool {
        self.phase == SandboxPhase::Ready
    }

    /// Condition messages joined, for error reports.
    pub fn condition_messages(&self) -> String {
        self.proto
            .status
            .as_ref()
            .map(|s| {
                s.conditions
                    .iter()
                    .filter(|c| !c.message.is_empty())
                    .map(|c| format!("{}: {}", c.r#type, c.message))
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default()
    }
}

impl fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sandbox")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("phase", &self.phase)
            .field("labels", &self.labels)
            .field("exit_code", &self.exit_code)
            .field("resource_version", &self.resource_version)
            .finish_non_exhaustive()
    }
}

/// What `Health` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// Service status.
    pub status: ServiceStatus,
    /// Gateway version.
    pub version: String,
    /// The replica that answered (`x-openshell-served-by`), if it said.
    pub served_by: Option<String>,
}

/// A sandbox to create. Everything but the image is optional; without a name
/// the server generates one.
///
/// `Debug` shows environment keys only, never values.
#[derive(Clone, Default)]
pub struct CreateSandbox {
    name: Option<String>,
    template: pb::SandboxTemplate,
    environment: BTreeMap<String, String>,
    command: Vec<String>,
    labels: BTreeMap<String, String>,
    tty: bool,
    request_id: Option<String>,
}

impl CreateSandbox {
    /// An empty request (server-generated name, server-default image).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Sets the template image.
    pub fn image(mut self, image: impl Into<String>) -> Self {
        self.template.image = image.into();
        self
    }

    /// Sets the whole template (image, template labels and environment).
    pub fn template(mut self, template: pb::SandboxTemplate) -> Self {
        self.template = template;
        self
    }

    /// Sets a resource limit in the template's `resources.limits`
    /// (Kubernetes quantities: `limit("memory", "256Mi")`,
    /// `limit("cpu", "500m")`, `limit("pids", "128")`). The gateway checks
    /// them (`INVALID_ARGUMENT` naming a bad one) and fills in its defaults.
    pub fn limit(mut self, resource: impl Into<String>, quantity: impl Into<String>) -> Self {
        use prost_types::value::Kind;
        let resources = self.template.resources.get_or_insert_with(Default::default);
        let limits = resources
            .fields
            .entry("limits".to_owned())
            .or_insert_with(|| prost_types::Value {
                kind: Some(Kind::StructValue(Default::default())),
            });
        if !matches!(limits.kind, Some(Kind::StructValue(_))) {
            limits.kind = Some(Kind::StructValue(Default::default()));
        }
        if let Some(Kind::StructValue(table)) = &mut limits.kind {
            table.fields.insert(
                resource.into(),
                prost_types::Value {
                    kind: Some(Kind::StringValue(quantity.into())),
                },
            );
        }
        self
    }

    /// Adds an environment variable of every process in the sandbox.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.environment.insert(key.into(), value.into());
        self
    }

    /// Sets the main command (argv, no shell parsing).
    pub fn command<I, S>(mut self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.command = argv.into_iter().map(Into::into).collect();
        self
    }

    /// Adds a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Runs the main command with a terminal.
    pub fn tty(mut self, tty: bool) -> Self {
        self.tty = tty;
        self
    }

    /// Sets the idempotency key; one is generated when unset, so a retried
    /// create does not create twice.
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// The wire request.
    pub fn to_proto(&self) -> pb::CreateSandboxRequest {
        pb::CreateSandboxRequest {
            spec: Some(pb::SandboxSpec {
                environment: self.environment.clone().into_iter().collect(),
                template: Some(self.template.clone()),
                command: self.command.clone(),
                tty: self.tty,
                ..Default::default()
            }),
            name: self.name.clone().unwrap_or_default(),
            labels: self.labels.clone().into_iter().collect(),
            request_id: self
                .request_id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            ..Default::default()
        }
    }
}

impl fmt::Debug for CreateSandbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CreateSandbox")
            .field("name", &self.name)
            .field("image", &self.template.image)
            .field(
                "environment_keys",
                &self.environment.keys().collect::<Vec<_>>(),
            )
            .field("command", &self.command)
            .field("labels", &self.labels)
            .field("tty", &self.tty)
            .finish_non_exhaustive()
    }
}

/// Filter for [`Sandboxes::list`].
#[derive(Debug, Clone, Default)]
pub struct ListSandboxes {
    /// `k=v,k2=v2`: every pair must match.
    pub label_selector: Option<String>,
    /// Page size of each request (the server's default when `None`).
    pub page_size: Option<u32>,
}

/// The sandbox calls of a [`Client`]; get one with [`Client::sandboxes`].
#[derive(Debug, Clone)]
pub struct Sandboxes {
    pub(crate) client: Client,
}

impl Client {
    /// Liveness of the replica that answers.
    pub async fn health(&self, options: CallOptions) -> Result<Health, Error> {
        let resolved = Resolved::new(self, &options, DeadlineKind::Bounded);
        let (response, metadata): (pb::HealthResponse, _) = self
            .typed_unary(paths::HEALTH, &pb::HealthRequest {}, &resolved)
            .await?;
        Ok(Health {
            status: ServiceStatus::try_from(response.status).unwrap_or(ServiceStatus::Unspecified),
            version: response.version,
            served_by: metadata.get(SERVED_BY).map(str::to_owned),
        })
    }

    /// The sandbox calls.
    pub fn sandboxes(&self) -> Sandboxes {
        Sandboxes {
            client: self.clone(),
        }
    }
}

impl Sandboxes {
    /// Creates a sandbox; returns it as the server stored it (usually
    /// PROVISIONING). Pair with [`wait_ready`](Self::wait_ready).
    pub async fn create(
        &self,
        request: CreateSandbox,
        options: CallOptions,
    ) -> Result<Sandbox, Error> {
        let resolved = Resolved::new(&self.client, &options, DeadlineKind::Bounded);
        let (response, _): (pb::SandboxResponse, _) = self
            .client
            .typed_unary(paths::CREATE_SANDBOX, &request.to_proto(), &resolved)
            .await?;
        sandbox_of(paths::CREATE_SANDBOX, response)
    }

    /// Gets a sandbox by name (`not_found` if there is none).
    pub async fn get(&self, name: &str, options: CallOptions) -> Result<Sandbox, Error> {
        let resolved = Resolved::new(&self.client, &options, DeadlineKind::Bounded);
        self.get_resolved(name, &resolved).await
    }

    /// Gets a sandbox and the replica holding its supervisor session (`None`
    /// on single-replica gateways, or when no replica holds it now). The
    /// answer also refreshes the client's owner cache.
    pub async fn get_with_owner(
        &self,
        name: &str,
        options: CallOptions,
    ) -> Result<(Sandbox, Option<String>), Error> {
        let resolved = Resolved::new(&self.client, &options, DeadlineKind::Bounded);
        let request = pb::GetSandboxRequest {
            name: name.to_owned(),
            ..Default::default()
        };
        let (response, metadata): (pb::SandboxResponse, _) = self
            .client
            .typed_unary_with(
                paths::GET_SANDBOX,
                &request,
                owner_lookup_metadata(),
                &resolved,
            )
            .await?;
        let owner = owner_from(&metadata);
        self.client.inner.router.remember(name, owner.clone());
        Ok((sandbox_of(paths::GET_SANDBOX, response)?, owner))
    }

    async fn get_resolved(&self, name: &str, resolved: &Resolved) -> Result<Sandbox, Error> {
        let request = pb::GetSandboxRequest {
            name: name.to_owned(),
            ..Default::default()
        };
        let (response, _): (pb::SandboxResponse, _) = self
            .client
            .typed_unary(paths::GET_SANDBOX, &request, resolved)
            .await?;
        sandbox_of(paths::GET_SANDBOX, response)
    }

    /// Lists sandboxes, following every page. The deadline bounds the whole
    /// listing, not each page.
    pub async fn list(
        &self,
        filter: ListSandboxes,
        options: CallOptions,
    ) -> Result<Vec<Sandbox>, Error> {
        let resolved = Resolved::new(&self.client, &options, DeadlineKind::Bounded);
        let page_size = match filter.page_size {
            Some(n) => {
                i32::try_from(n).map_err(|_| Error::invalid_config("page size too large"))?
            }
            None => 0,
        };
        let mut out = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = pb::ListSandboxesRequest {
                page_size,
                page_token: page_token.clone(),
                label_selector: filter.label_selector.clone().unwrap_or_default(),
                ..Default::default()
            };
            let (response, _): (pb::ListSandboxesResponse, _) = self
                .client
                .typed_unary(paths::LIST_SANDBOXES, &request, &resolved)
                .await?;
            out.extend(response.sandboxes.into_iter().map(Sandbox::from_proto));
            if response.next_page_token.is_empty() {
                return Ok(out);
            }
            if response.next_page_token == page_token {
                return Err(Error::protocol(
                    "ListSandboxes returned the same page token twice",
                ));
            }
            page_token = response.next_page_token;
        }
    }

    /// Deletes a sandbox (`not_found` if there is none). Deletion may finish
    /// later: pair with [`wait_deleted`](Self::wait_deleted).
    pub async fn delete(&self, name: &str, options: CallOptions) -> Result<DeletionOutcome, Error> {
        let resolved = Resolved::new(&self.client, &options, DeadlineKind::Bounded);
        let request = pb::DeleteSandboxRequest {
            name: name.to_owned(),
            request_id: uuid::Uuid::new_v4().to_string(),
            ..Default::default()
        };
        let (response, _): (pb::DeleteSandboxResponse, _) = self
            .client
            .typed_unary(paths::DELETE_SANDBOX, &request, &resolved)
            .await?;
        Ok(DeletionOutcome::try_from(response.outcome).unwrap_or(DeletionOutcome::Unspecified))
    }

    /// Waits until the sandbox is READY and returns it. Fails with
    /// `failed_precondition` if it reaches ERROR (or a phase from which READY
    /// cannot follow), `not_found` if it does not exist, and
    /// `deadline_exceeded` when the deadline (default: the client's) passes.
    pub async fn wait_ready(&self, name: &str, options: CallOptions) -> Result<Sandbox, Error> {
        let resolved = Resolved::new(&self.client, &options, DeadlineKind::Bounded);
        let mut events = self.watch_resolved(name, &resolved)?;
        while let Some(sandbox) = events.next().await {
            let sandbox = sandbox?;
            if let Some(verdict) = ready_verdict(name, &sandbox) {
                return verdict.map(|()| sandbox);
            }
        }
        Err(Error::protocol(format!(
            "watch of sandbox {name} ended before it became ready"
        )))
    }

    /// Waits until the sandbox no longer exists. Returns at once if it does
    /// not exist.
    pub async fn wait_deleted(&self, name: &str, options: CallOptions) -> Result<(), Error> {
        let resolved = Resolved::new(&self.client, &options, DeadlineKind::Bounded);
        let mut events = self.watch_resolved(name, &resolved)?;
        loop {
            match events.next().await {
                Some(Ok(_snapshot)) => continue,
                Some(Err(err)) if err.code() == "not_found" => return Ok(()),
                Some(Err(err)) => return Err(err),
                None => break,
            }
        }
        // The watch ended without an error: confirm the sandbox is gone.
        match self.get_resolved(name, &resolved).await {
            Err(err) if err.code() == "not_found" => Ok(()),
            Err(err) => Err(err),
            Ok(sandbox) => Err(Error::protocol(format!(
                "watch of sandbox {name} ended while it still exists (phase {:?})",
                sandbox.phase
            ))),
        }
    }

    fn watch_resolved(&self, name: &str, resolved: &Resolved) -> Result<SandboxWatch, Error> {
        let request = pb::WatchSandboxRequest {
            sandbox: name.to_owned(),
            follow_status: true,
            ..Default::default()
        };
        let stream = self
            .client
            .typed_stream(paths::WATCH_SANDBOX, &request, resolved)?;
        let (_sender, receiver) = stream.split();
        Ok(SandboxWatch::from_frames(receiver.into_stream()))
    }
}

/// `Some(Ok)` when ready, `Some(Err)` when READY can no longer come, `None`
/// to keep waiting.
fn ready_verdict(name: &str, sandbox: &Sandbox) -> Option<Result<(), Error>> {
    let failed = |what: &str| {
        let conditions = sandbox.condition_messages();
        let message = if conditions.is_empty() {
            format!("sandbox {name} is {what}")
        } else {
            format!("sandbox {name} is {what}: {conditions}")
        };
        Some(Err(Error::SandboxFailed {
            sandbox: name.to_owned(),
            message,
        }))
    };
    match sandbox.phase {
        SandboxPhase::Ready => Some(Ok(())),
        SandboxPhase::Error => failed("in phase ERROR"),
        SandboxPhase::Deleting => failed("being deleted"),
        SandboxPhase::Stopping | SandboxPhase::Stopped => failed("stopped"),
        SandboxPhase::Completed => failed("completed"),
        SandboxPhase::Unspecified
        | SandboxPhase::Provisioning
        | SandboxPhase::Unknown
        | SandboxPhase::Starting => None,
    }
}

fn sandbox_of(path: &str, response: pb::SandboxResponse) -> Result<Sandbox, Error> {
    response
        .sandbox
        .map(Sandbox::from_proto)
        .ok_or_else(|| Error::protocol(format!("{path}: answer without a sandbox")))
}

/// Snapshots of one sandbox, from [`Sandboxes::watch`](crate::Sandboxes::watch).
/// Dropping it cancels the watch.
pub struct SandboxWatch {
    inner: BoxStream<'static, Result<Sandbox, Error>>,
}

impl SandboxWatch {
    /// Over snapshots from elsewhere (the resuming watch of `logs`).
    pub(crate) fn from_stream(inner: BoxStream<'static, Result<Sandbox, Error>>) -> Self {
        Self { inner }
    }

    pub(crate) fn from_frames(frames: BoxStream<'static, Result<bytes::Bytes, Error>>) -> Self {
        let inner = frames
            .filter_map(|frame| async move {
                let frame = match frame {
                    Ok(frame) => frame,
                    Err(err) => return Some(Err(err)),
                };
                let event: pb::SandboxStreamEvent = match decode(paths::WATCH_SANDBOX, frame) {
                    Ok(event) => event,
                    Err(err) => return Some(Err(err)),
                };
                match event.payload {
                    Some(pb::sandbox_stream_event::Payload::Sandbox(s)) => {
                        Some(Ok(Sandbox::from_proto(s)))
                    }
                    Some(pb::sandbox_stream_event::Payload::Warning(w)) => {
                        tracing::debug!(warning = %w.message, "sandbox watch warning");
                        None
                    }
                    Some(pb::sandbox_stream_event::Payload::Log(_)) | None => None,
                }
            })
            .boxed();
        Self {
            inner: stop_after_error(inner),
        }
    }
}

impl Stream for SandboxWatch {
    type Item = Result<Sandbox, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

impl fmt::Debug for SandboxWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxWatch").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use prost::Message;

    fn snapshot(name: &str, phase: SandboxPhase) -> pb::Sandbox {
        pb::Sandbox {
            metadata: Some(pb::datamodel::ObjectMeta {
                id: "id-1".into(),
                name: name.into(),
                resource_version: 3,
                ..Default::default()
            }),
            spec: Some(pb::SandboxSpec {
                environment: [("API_KEY".to_owned(), "hunter2-secret".to_owned())].into(),
                ..Default::default()
            }),
            status: Some(pb::SandboxStatus {
                phase: phase as i32,
                conditions: vec![pb::SandboxCondition {
                    r#type: "Ready".into(),
                    message: "image pull failed".into(),
                    ..Default::default()
                }],
                exit_code: None,
            }),
            host_key_fingerprint: String::new(),
        }
    }

    fn frame(payload: pb::sandbox_stream_event::Payload) -> Result<Bytes, Error> {
        Ok(Bytes::from(
            pb::SandboxStreamEvent {
                payload: Some(payload),
                cursor: String::new(),
            }
            .encode_to_vec(),
        ))
    }

    #[test]
    fn lifts_fields_and_redacts_the_spec() {
        let s = Sandbox::from_proto(snapshot("a", SandboxPhase::Ready));
        assert_eq!(s.name, "a");
        assert_eq!(s.id, "id-1");
        assert!(s.is_ready());
        assert_eq!(s.resource_version, 3);
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[test]
    fn create_request_maps_to_the_wire_and_debug_hides_env_values() {
        let req = CreateSandbox::new()
            .name("box")
            .image("alpine:3")
            .env("TOKEN", "env-secret-value")
            .command(["sleep", "inf"])
            .label("team", "a");
        let text = format!("{req:?}");
        assert!(!text.contains("env-secret-value"), "{text}");
        assert!(text.contains("TOKEN"));
        let wire = req.to_proto();
        assert_eq!(wire.name, "box");
        let spec = wire.spec.unwrap();
        assert_eq!(spec.template.unwrap().image, "alpine:3");
        assert_eq!(spec.environment["TOKEN"], "env-secret-value");
        assert_eq!(spec.command, vec!["sleep", "inf"]);
        assert_eq!(wire.labels["team"], "a");
        assert!(!wire.request_id.is_empty());
        assert_eq!(CreateSandbox::new().to_proto().name, "");
    }

    #[test]
    fn ready_verdicts() {
        let verdict = |p| ready_verdict("a", &Sandbox::from_proto(snapshot("a", p)));
        assert!(verdict(SandboxPhase::Provisioning).is_none());
        assert!(verdict(SandboxPhase::Starting).is_none());
        assert!(verdict(SandboxPhase::Ready).unwrap().is_ok());
        let err = verdict(SandboxPhase::Error).unwrap().unwrap_err();
        assert_eq!(err.code(), "failed_precondition");
        assert!(err.to_string().contains("image pull failed"));
        assert!(verdict(SandboxPhase::Deleting).unwrap().is_err());
    }

    #[tokio::test]
    async fn watch_decodes_snapshots_and_skips_warnings() {
        let frames = futures::stream::iter(vec![
            frame(pb::sandbox_stream_event::Payload::Sandbox(snapshot(
                "a",
                SandboxPhase::Provisioning,
            ))),
            frame(pb::sandbox_stream_event::Payload::Warning(
                pb::SandboxStreamWarning {
                    message: "slow".into(),
                },
            )),
            frame(pb::sandbox_stream_event::Payload::Sandbox(snapshot(
                "a",
                SandboxPhase::Ready,
            ))),
            Ok(Bytes::from_static(b"\xff\xff")),
        ])
        .boxed();
        let got: Vec<_> = SandboxWatch::from_frames(frames).collect().await;
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].as_ref().unwrap().phase, SandboxPhase::Provisioning);
        assert_eq!(got[1].as_ref().unwrap().phase, SandboxPhase::Ready);
        assert_eq!(got[2].as_ref().unwrap_err().code(), "protocol");
    }
}
