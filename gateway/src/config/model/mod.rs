//! The configuration model: sandbox and global policy and settings, and a
//! minimal provider model (named environment sets attached to sandboxes).
//!
//! - **Writes** (`UpdateConfig`, provider create/update/attach/detach) run
//!   in one store transaction each. A write that changes nothing commits
//!   nothing. Each answers the [`Scope`] it affects, computed after the
//!   commit, which the caller hands to config delivery as a dirty mark
//!   (seed 002, "who marks what").
//! - **Reads** load every input of a sandbox's configuration in one
//!   consistent read transaction ([`ConfigModel::load`]) and build the full
//!   `GetSandboxConfigResponse` and, only when asked, the provider
//!   environment it names. Polling RPCs and pushed updates use the same
//!   builder, so both modes deliver identical snapshots.
//! - **Fingerprints** ([`fingerprint`]) identify a whole update's content
//!   (SHA-256 with a domain string; maps in sorted order). They may cover
//!   credentials, so they live in memory only.
//!
//! Effective configuration: a global policy, when one was ever set,
//! overrides the sandbox's (`policy_source` GLOBAL); a global setting
//! overrides a sandbox setting of the same key. `config_revision` is the sum
//! of the four monotonic counters it depends on (sandbox and global policy
//! versions and settings revisions), so it increases with every change.
//!
//! Providers take revisions from one counter (`provider_seq`), and so do
//! attachment epochs; a sandbox's `provider_env_revision` is the largest of
//! its epoch and its attached providers' revisions, which makes it increase
//! on every provider change it can see, detaches included. Provider
//! environment values are secrets: never logged, never in an error.

mod checks;
mod hash;
mod load;

pub use checks::policy_seed;
use checks::*;
pub use hash::{fingerprint, policy_hash};

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use openshell_proto::sandbox::{
    EffectiveSetting, GetSandboxConfigResponse, NetworkPolicyRule, PolicySource, SandboxPolicy,
    SettingScope, SettingValue, setting_value,
};
use openshell_proto::{
    AttachProviderResponse, GetSandboxProviderEnvironmentResponse, Provider, Sandbox, SandboxPhase,
    UpdateConfigRequest, UpdateConfigResponse,
};
use prost::Message;
use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, Row};
use tonic::Status;

use crate::sandboxes::{id_of, phase_of, store_status};
use crate::store::{PolicySeed, Store, StoreError};
use crate::validate::{self, quote};

/// The global scope's owner key.
const GLOBAL: &str = "";
pub const MAX_RULES: usize = 256;
pub const MAX_ENDPOINTS: usize = 64;
pub const MAX_BINARIES: usize = 64;
pub const MAX_SETTINGS: usize = 256;
pub const MAX_PROVIDERS_PER_SANDBOX: usize = 32;
const MAX_SETTING_STRING: usize = 16 * 1024;
const MAX_SETTING_BYTES: usize = 64 * 1024;
const MAX_ENV_VALUE: usize = 32 * 1024;
const MAX_KEY_LEN: usize = 128;
const MAX_POLICY_BYTES: usize = 1024 * 1024;
const PROTOCOLS: [&str; 6] = ["", "tcp", "rest", "http", "https", "grpc"];

/// Deadline of loading inputs and building the sandbox configuration.
pub const CONFIG_BUILD_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of building a provider environment.
pub const ENV_BUILD_TIMEOUT: Duration = Duration::from_secs(20);

/// Which sessions a committed write affects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Sandbox policy or settings, provider attach or detach.
    Sandbox(String),
    /// A provider record changed: every sandbox attaching it.
    Provider(String),
    /// Global policy or settings: every connected session.
    All,
}

/// What names a provider environment: it is rebuilt only when this changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnvIdentity {
    pub provider_env_revision: u64,
    pub provider_attachment_epoch: String,
    pub policy_hash: String,
}

impl EnvIdentity {
    pub fn of(config: &GetSandboxConfigResponse) -> Self {
        Self {
            provider_env_revision: config.provider_env_revision,
            provider_attachment_epoch: config.provider_attachment_epoch.clone(),
            policy_hash: config.policy_hash.clone(),
        }
    }
}

/// One load of a sandbox's configuration.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: GetSandboxConfigResponse,
    /// Present when the caller asked for the environment.
    pub environment: Option<GetSandboxProviderEnvironmentResponse>,
    /// Time spent on the sandbox configuration and on the environment.
    pub config_time: Duration,
    pub env_time: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("sandbox not found")]
    NotFound,
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("sandbox configuration build timed out")]
    ConfigTimeout,
    #[error("provider environment build timed out")]
    EnvTimeout,
}

impl BuildError {
    pub fn status(self) -> Status {
        match self {
            BuildError::NotFound => Status::not_found("sandbox not found"),
            BuildError::Store(err) => store_status(err),
            BuildError::ConfigTimeout | BuildError::EnvTimeout => {
                Status::unavailable("configuration store is slow; try again")
            }
        }
    }
}

#[derive(Clone)]
pub struct ConfigModel {
    pub store: Store,
    /// Unit-test seam: stalls a part of the build so its real deadline
    /// fires (see `config::delivery::tests`).
    #[cfg(test)]
    pub(crate) stalls: std::sync::Arc<BuildStalls>,
}

/// Unit-test seam: while a flag is set, that part of every build waits
/// forever inside its deadline (a store or credential source that stopped
/// answering); `stalled` is told each time one starts to wait.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct BuildStalls {
    pub(crate) config: std::sync::atomic::AtomicBool,
    pub(crate) environment: std::sync::atomic::AtomicBool,
    pub(crate) stalled: tokio::sync::Notify,
}

#[cfg(test)]
impl BuildStalls {
    pub(crate) async fn maybe_stall(&self, flag: &std::sync::atomic::AtomicBool) {
        if flag.load(std::sync::atomic::Ordering::SeqCst) {
            self.stalled.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

/// A scope row.
#[derive(Debug, Default, Clone)]
struct ScopeRow {
    policy_version: i64,
    policy: Vec<u8>,
    policy_hash: String,
    settings_revision: i64,
}

// ------------------------------------------------------------ the model

fn placeholders(from: usize, count: usize) -> String {
    (from..from + count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ensure_not_deleting(sandbox: &Sandbox) -> Result<(), Status> {
    if phase_of(sandbox) == SandboxPhase::Deleting {
        return Err(Status::failed_precondition("sandbox is being deleted"));
    }
    Ok(())
}

type Tx = sqlx::Transaction<'static, sqlx::Any>;

impl ConfigModel {
    pub fn new(store: Store) -> Self {
        Self {
            store,
            #[cfg(test)]
            stalls: Default::default(),
        }
    }

    /// Runs a write transaction within the store's deadline (UNAVAILABLE,
    /// naming the store, when it passes).
    async fn within_deadline<T>(
        &self,
        write: impl std::future::Future<Output = Result<T, Status>>,
    ) -> Result<T, Status> {
        tokio::time::timeout(self.store.deadline(), write)
            .await
            .unwrap_or_else(|_| Err(store_status(self.store.timed_out())))
    }

    async fn scope_row(
        &self,
        tx: &mut Tx,
        owner: &str,
        lock: bool,
    ) -> Result<ScopeRow, StoreError> {
        let sql = format!(
            "SELECT policy_version, policy, policy_hash, settings_revision FROM config_scopes \
             WHERE owner = $1{}",
            if lock {
                self.store.dialect().lock_row()
            } else {
                ""
            }
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(owner)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(row
            .map(|r| ScopeRow {
                policy_version: r.get(0),
                policy: r.get(1),
                policy_hash: r.get(2),
                settings_revision: r.get(3),
            })
            .unwrap_or_default())
    }

    async fn save_scope(&self, tx: &mut Tx, owner: &str, row: &ScopeRow) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO config_scopes (owner, policy_version, policy, policy_hash, settings_revision)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (owner) DO UPDATE SET policy_version = $6, policy = $7,
                policy_hash = $8, settings_revision = $9",
        )
        .bind(owner)
        .bind(row.policy_version)
        .bind(row.policy.clone())
        .bind(&row.policy_hash)
        .bind(row.settings_revision)
        .bind(row.policy_version)
        .bind(row.policy.clone())
        .bind(&row.policy_hash)
        .bind(row.settings_revision)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// The sandbox row, locked for the transaction.
    async fn locked_sandbox(&self, tx: &mut Tx, id: &str) -> Result<Option<Sandbox>, StoreError> {
        let sql = format!(
            "SELECT record FROM sandboxes WHERE id = $1{}",
            self.store.dialect().lock_row()
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
        match row {
            Some(row) => Ok(Some(Sandbox::decode(row.get::<Vec<u8>, _>(0).as_slice())?)),
            None => Ok(None),
        }
    }

    async fn next_provider_seq(&self, tx: &mut Tx) -> Result<i64, StoreError> {
        sqlx::query(
            "INSERT INTO config_counters (name, value) VALUES ('provider_seq', 0)
             ON CONFLICT (name) DO NOTHING",
        )
        .execute(&mut **tx)
        .await?;
        sqlx::query("UPDATE config_counters SET value = value + 1 WHERE name = 'provider_seq'")
            .execute(&mut **tx)
            .await?;
        let row = sqlx::query("SELECT value FROM config_counters WHERE name = 'provider_seq'")
            .fetch_one(&mut **tx)
            .await?;
        Ok(row.get(0))
    }

    async fn sandbox_id_by_name(&self, name: &str) -> Result<String, Status> {
        validate::sandbox_name(name)?;
        match self.store.get_by_name(name).await {
            Ok(stored) => Ok(id_of(&stored.sandbox).to_owned()),
            Err(StoreError::NotFound) => Err(Status::not_found(format!(
                "sandbox {} not found",
                quote(name)
            ))),
            Err(err) => Err(store_status(err)),
        }
    }

    // -------------------------------------------------------- UpdateConfig

    /// Validates, then writes a policy or one setting of a sandbox or the
    /// global scope. Returns the answer and the scope to mark (None when
    /// nothing changed).
    pub async fn update_config(
        &self,
        req: UpdateConfigRequest,
    ) -> Result<(UpdateConfigResponse, Option<Scope>), Status> {
        // Shape first: nothing is read or written for a malformed request.
        if req.global && !req.sandbox.is_empty() {
            return Err(Status::invalid_argument(
                "a global update names no sandbox (clear sandbox or global)",
            ));
        }
        if !req.global && req.sandbox.is_empty() {
            return Err(Status::invalid_argument(
                "sandbox is required (or set global)",
            ));
        }
        let setting = !req.setting_key.is_empty();
        match (req.policy.is_some(), setting) {
            (true, true) => {
                return Err(Status::invalid_argument(
                    "set either policy or setting_key, not both",
                ));
            }
            (false, false) => {
                if req.delete_setting || req.setting_value.is_some() {
                    return Err(Status::invalid_argument(
                        "setting_key is required with setting_value or delete_setting",
                    ));
                }
                return Err(Status::invalid_argument(
                    "nothing to update: set policy or setting_key",
                ));
            }
            (true, false) if req.delete_setting || req.setting_value.is_some() => {
                return Err(Status::invalid_argument(
                    "setting_value and delete_setting need setting_key, not policy",
                ));
            }
            _ => {}
        }
        let policy = req.policy.as_ref().map(checked_policy).transpose()?;
        if setting {
            validate_setting(
                &req.setting_key,
                req.setting_value.as_ref(),
                req.delete_setting,
            )?;
        }
        let owner = if req.global {
            GLOBAL.to_owned()
        } else {
            self.sandbox_id_by_name(&req.sandbox).await?
        };

        // The whole transaction is one store call: it has the store's deadline.
        self.within_deadline(async {
            let mut tx = self.store.begin_write().await.map_err(store_status)?;
            if !req.global {
                match self
                    .locked_sandbox(&mut tx, &owner)
                    .await
                    .map_err(store_status)?
                {
                    Some(sandbox) => ensure_not_deleting(&sandbox)?,
                    None => {
                        return Err(Status::not_found(format!(
                            "sandbox {} not found",
                            quote(&req.sandbox)
                        )));
                    }
                }
            }
            let mut row = self
                .scope_row(&mut tx, &owner, true)
                .await
                .map_err(store_status)?;
            let mut changed = false;
            let mut deleted = false;
            if let Some(mut policy) = policy {
                let hash = policy_hash(&policy);
                if row.policy_version == 0 || row.policy_hash != hash {
                    row.policy_version += 1;
                    policy.version = row.policy_version as u32;
                    row.policy = policy.encode_to_vec();
                    row.policy_hash = hash;
                    changed = true;
                }
            } else {
                let existing =
                    sqlx::query("SELECT value FROM config_settings WHERE owner = $1 AND key = $2")
                        .bind(&owner)
                        .bind(&req.setting_key)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(|e| store_status(e.into()))?
                        .map(|r| r.get::<Vec<u8>, _>(0));
                if req.delete_setting {
                    if existing.is_some() {
                        sqlx::query("DELETE FROM config_settings WHERE owner = $1 AND key = $2")
                            .bind(&owner)
                            .bind(&req.setting_key)
                            .execute(&mut *tx)
                            .await
                            .map_err(|e| store_status(e.into()))?;
                        changed = true;
                        deleted = true;
                    }
                } else {
                    let value = req
                        .setting_value
                        .as_ref()
                        .expect("validated")
                        .encode_to_vec();
                    if existing.as_ref() != Some(&value) {
                        if existing.is_none() {
                            let count = sqlx::query(
                                "SELECT COUNT(*) FROM config_settings WHERE owner = $1",
                            )
                            .bind(&owner)
                            .fetch_one(&mut *tx)
                            .await
                            .map_err(|e| store_status(e.into()))?
                            .get::<i64, _>(0);
                            if count as usize >= MAX_SETTINGS {
                                return Err(Status::resource_exhausted(format!(
                                    "the scope already has {MAX_SETTINGS} settings"
                                )));
                            }
                        }
                        sqlx::query(
                            "INSERT INTO config_settings (owner, key, value) VALUES ($1, $2, $3)
                             ON CONFLICT (owner, key) DO UPDATE SET value = $4",
                        )
                        .bind(&owner)
                        .bind(&req.setting_key)
                        .bind(value.clone())
                        .bind(value)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| store_status(e.into()))?;
                        changed = true;
                    }
                }
                if changed {
                    row.settings_revision += 1;
                }
            }
            if changed {
                self.save_scope(&mut tx, &owner, &row)
                    .await
                    .map_err(store_status)?;
                tx.commit().await.map_err(|e| store_status(e.into()))?;
            } else {
                drop(tx);
            }
            let response = UpdateConfigResponse {
                version: row.policy_version as u32,
                policy_hash: row.policy_hash.clone(),
                settings_revision: row.settings_revision as u64,
                deleted,
            };
            let scope = match (changed, req.global) {
                (false, _) => None,
                (true, true) => Some(Scope::All),
                (true, false) => Some(Scope::Sandbox(owner)),
            };
            Ok((response, scope))
        })
        .await
    }

    // -------------------------------------------------------- providers

    fn public_view(provider: &Provider) -> Provider {
        let mut keys: Vec<String> = provider.environment.keys().cloned().collect();
        keys.sort();
        Provider {
            name: provider.name.clone(),
            environment: Default::default(),
            revision: provider.revision,
            environment_keys: keys,
        }
    }

    pub async fn create_provider(&self, provider: Option<Provider>) -> Result<Provider, Status> {
        let provider = validate_provider(provider.as_ref())?;
        // The whole transaction is one store call: it has the store's deadline.
        self.within_deadline(async {
            let mut tx = self.store.begin_write().await.map_err(store_status)?;
            let exists = sqlx::query("SELECT name FROM providers WHERE name = $1")
                .bind(&provider.name)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| store_status(e.into()))?;
            if exists.is_some() {
                return Err(Status::already_exists(format!(
                    "provider {} already exists",
                    quote(&provider.name)
                )));
            }
            let revision = self
                .next_provider_seq(&mut tx)
                .await
                .map_err(store_status)?;
            let record = Provider {
                name: provider.name.clone(),
                environment: provider.environment.clone(),
                revision: revision as u64,
                environment_keys: Vec::new(),
            };
            sqlx::query("INSERT INTO providers (name, record, revision) VALUES ($1, $2, $3)")
                .bind(&record.name)
                .bind(record.encode_to_vec())
                .bind(revision)
                .execute(&mut *tx)
                .await
                .map_err(|e| match StoreError::from(e) {
                    StoreError::Db(sqlx::Error::Database(d)) if d.is_unique_violation() => {
                        Status::already_exists(format!(
                            "provider {} already exists",
                            quote(&record.name)
                        ))
                    }
                    other => store_status(other),
                })?;
            tx.commit().await.map_err(|e| store_status(e.into()))?;
            tracing::info!(provider = record.name, revision, "provider created");
            Ok(Self::public_view(&record))
        })
        .await
    }

    /// Replaces a provider's environment. Marks every sandbox attaching it.
    pub async fn update_provider(
        &self,
        provider: Option<Provider>,
    ) -> Result<(Provider, Option<Scope>), Status> {
        let provider = validate_provider(provider.as_ref())?;
        // The whole transaction is one store call: it has the store's deadline.
        self.within_deadline(async {
            let mut tx = self.store.begin_write().await.map_err(store_status)?;
            let sql = format!(
                "SELECT record FROM providers WHERE name = $1{}",
                self.store.dialect().lock_row()
            );
            let existing = sqlx::query(AssertSqlSafe(sql))
                .bind(&provider.name)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| store_status(e.into()))?
                .ok_or_else(|| {
                    Status::not_found(format!("provider {} not found", quote(&provider.name)))
                })?;
            let existing = Provider::decode(existing.get::<Vec<u8>, _>(0).as_slice())
                .map_err(|e| store_status(e.into()))?;
            if existing.environment == provider.environment {
                return Ok((Self::public_view(&existing), None));
            }
            let revision = self
                .next_provider_seq(&mut tx)
                .await
                .map_err(store_status)?;
            let record = Provider {
                name: provider.name.clone(),
                environment: provider.environment.clone(),
                revision: revision as u64,
                environment_keys: Vec::new(),
            };
            sqlx::query("UPDATE providers SET record = $1, revision = $2 WHERE name = $3")
                .bind(record.encode_to_vec())
                .bind(revision)
                .bind(&record.name)
                .execute(&mut *tx)
                .await
                .map_err(|e| store_status(e.into()))?;
            tx.commit().await.map_err(|e| store_status(e.into()))?;
            tracing::info!(provider = record.name, revision, "provider updated");
            Ok((
                Self::public_view(&record),
                Some(Scope::Provider(record.name.clone())),
            ))
        })
        .await
    }

    /// Attaches (or detaches) a provider. Returns the answer, the updated
    /// sandbox (for watchers) and the scope to mark.
    pub async fn set_attachment(
        &self,
        sandbox: &str,
        provider: &str,
        attach: bool,
    ) -> Result<(AttachProviderResponse, Sandbox, Scope), Status> {
        provider_name(provider)?;
        let id = self.sandbox_id_by_name(sandbox).await?;
        // The whole transaction is one store call: it has the store's deadline.
        self.within_deadline(async {
            let mut tx = self.store.begin_write().await.map_err(store_status)?;
            let mut record = self
                .locked_sandbox(&mut tx, &id)
                .await
                .map_err(store_status)?
                .ok_or_else(|| {
                    Status::not_found(format!("sandbox {} not found", quote(sandbox)))
                })?;
            ensure_not_deleting(&record)?;
            let exists = sqlx::query("SELECT name FROM providers WHERE name = $1")
                .bind(provider)
                .fetch_optional(&mut *tx)
                .await
                .map_err(|e| store_status(e.into()))?
                .is_some();
            let spec = record.spec.get_or_insert_with(Default::default);
            let attached = spec.providers.iter().any(|p| p == provider);
            if attach {
                if !exists {
                    return Err(Status::not_found(format!(
                        "provider {} not found",
                        quote(provider)
                    )));
                }
                if attached {
                    return Err(Status::already_exists(format!(
                        "provider {} is already attached to sandbox {}",
                        quote(provider),
                        quote(sandbox)
                    )));
                }
                if spec.providers.len() >= MAX_PROVIDERS_PER_SANDBOX {
                    return Err(Status::resource_exhausted(format!(
                        "a sandbox holds at most {MAX_PROVIDERS_PER_SANDBOX} providers"
                    )));
                }
                spec.providers.push(provider.to_owned());
            } else {
                if !attached {
                    return Err(Status::not_found(format!(
                        "provider {} is not attached to sandbox {}",
                        quote(provider),
                        quote(sandbox)
                    )));
                }
                spec.providers.retain(|p| p != provider);
            }
            let epoch = self
                .next_provider_seq(&mut tx)
                .await
                .map_err(store_status)?;
            spec.provider_attachment_epoch = epoch.to_string();
            let meta = record.metadata.get_or_insert_with(Default::default);
            meta.resource_version += 1;
            let version = meta.resource_version as i64;
            sqlx::query("UPDATE sandboxes SET record = $1, resource_version = $2 WHERE id = $3")
                .bind(record.encode_to_vec())
                .bind(version)
                .bind(&id)
                .execute(&mut *tx)
                .await
                .map_err(|e| store_status(e.into()))?;
            self.store
                .record_event(
                    &mut tx,
                    &id,
                    crate::store::EventKind::Status,
                    Some(record.encode_to_vec()),
                )
                .await
                .map_err(store_status)?;
            tx.commit().await.map_err(|e| store_status(e.into()))?;
            let spec = record.spec.as_ref().expect("set above");
            tracing::info!(
                sandbox_id = id,
                provider,
                attach,
                epoch,
                "provider attachment changed"
            );
            Ok((
                AttachProviderResponse {
                    providers: spec.providers.clone(),
                    provider_attachment_epoch: spec.provider_attachment_epoch.clone(),
                },
                record,
                Scope::Sandbox(id),
            ))
        })
        .await
    }

    /// Ids of the sandboxes attaching `provider` (read after the write
    /// committed, so an attach that committed before it is seen).
    pub async fn sandboxes_attaching(&self, provider: &str) -> Result<Vec<String>, StoreError> {
        Ok(self
            .store
            .all()
            .await?
            .into_iter()
            .filter(|s| {
                s.sandbox
                    .spec
                    .as_ref()
                    .is_some_and(|spec| spec.providers.iter().any(|p| p == provider))
            })
            .map(|s| id_of(&s.sandbox).to_owned())
            .collect())
    }

    // -------------------------------------------------------- reads
}

#[cfg(test)]
mod tests;
