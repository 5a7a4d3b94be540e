//! Reading a sandbox's configuration and provider environment from the
//! store: what `GetSandboxConfig`, `GetSandboxProviderEnvironment` and the
//! push builds return.

use super::*;

impl ConfigModel {
    /// Loads every input of a sandbox's configuration in one consistent read
    /// and builds it. The provider environment is built only when
    /// `want_env` says so for the identity the configuration names.
    pub async fn load(
        &self,
        sandbox_id: &str,
        want_env: impl FnOnce(&EnvIdentity) -> bool,
    ) -> Result<Loaded, BuildError> {
        let started = Instant::now();
        // Waiting for a connection counts against the deadline too.
        let (mut tx, config, providers) = tokio::time::timeout(CONFIG_BUILD_TIMEOUT, async {
            #[cfg(test)]
            self.stalls.maybe_stall(&self.stalls.config).await;
            let mut tx = self.store.begin_read().await?;
            let (config, providers) = self.load_config(&mut tx, sandbox_id).await?;
            Ok::<_, BuildError>((tx, config, providers))
        })
        .await
        .map_err(|_| BuildError::ConfigTimeout)??;
        let config_time = started.elapsed();
        let identity = EnvIdentity::of(&config);
        let mut environment = None;
        let mut env_time = Duration::ZERO;
        if want_env(&identity) {
            let env_started = Instant::now();
            let env = tokio::time::timeout(ENV_BUILD_TIMEOUT, async {
                #[cfg(test)]
                self.stalls.maybe_stall(&self.stalls.environment).await;
                self.load_environment(&mut tx, &providers, &identity).await
            })
            .await
            .map_err(|_| BuildError::EnvTimeout)??;
            env_time = env_started.elapsed();
            environment = Some(env);
        }
        tokio::time::timeout(CONFIG_BUILD_TIMEOUT, tx.commit())
            .await
            .map_err(|_| BuildError::ConfigTimeout)?
            .map_err(StoreError::from)?;
        Ok(Loaded {
            config,
            environment,
            config_time,
            env_time,
        })
    }

    /// The configuration and the attached provider names (in order).
    async fn load_config(
        &self,
        tx: &mut Tx,
        sandbox_id: &str,
    ) -> Result<(GetSandboxConfigResponse, Vec<String>), BuildError> {
        let row = sqlx::query("SELECT record FROM sandboxes WHERE id = $1")
            .bind(sandbox_id)
            .fetch_optional(&mut **tx)
            .await
            .map_err(StoreError::from)?
            .ok_or(BuildError::NotFound)?;
        let sandbox =
            Sandbox::decode(row.get::<Vec<u8>, _>(0).as_slice()).map_err(StoreError::from)?;
        let spec = sandbox.spec.unwrap_or_default();
        let local = self.scope_row(tx, sandbox_id, false).await?;
        let global = self.scope_row(tx, GLOBAL, false).await?;

        let mut settings = BTreeMap::new();
        let rows = sqlx::query(
            "SELECT owner, key, value FROM config_settings WHERE owner = $1 OR owner = $2",
        )
        .bind(sandbox_id)
        .bind(GLOBAL)
        .fetch_all(&mut **tx)
        .await
        .map_err(StoreError::from)?;
        // Sandbox values first; global values override them.
        let mut ordered: Vec<(bool, String, Vec<u8>)> = rows
            .iter()
            .map(|r| {
                let owner: String = r.get(0);
                (owner == GLOBAL, r.get(1), r.get(2))
            })
            .collect();
        ordered.sort_by_key(|(global, _, _)| *global);
        for (global, key, value) in ordered {
            let value = SettingValue::decode(value.as_slice()).map_err(StoreError::from)?;
            let scope = if global {
                SettingScope::Global
            } else {
                SettingScope::Sandbox
            };
            settings.insert(
                key,
                EffectiveSetting {
                    value: Some(value),
                    scope: scope as i32,
                },
            );
        }

        let (policy_row, source) = if global.policy_version > 0 {
            (&global, PolicySource::Global)
        } else {
            (&local, PolicySource::Sandbox)
        };
        let policy = if policy_row.policy.is_empty() {
            SandboxPolicy::default()
        } else {
            SandboxPolicy::decode(policy_row.policy.as_slice()).map_err(StoreError::from)?
        };
        let hash = if policy_row.policy_version == 0 {
            policy_hash(&policy)
        } else {
            policy_row.policy_hash.clone()
        };

        // provider_env_revision: the largest of the attachment epoch and the
        // attached providers' revisions.
        let mut provider_env_revision: u64 = spec.provider_attachment_epoch.parse().unwrap_or(0);
        if !spec.providers.is_empty() {
            let sql = format!(
                "SELECT revision FROM providers WHERE name IN ({})",
                placeholders(1, spec.providers.len())
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for name in &spec.providers {
                query = query.bind(name.clone());
            }
            for row in query.fetch_all(&mut **tx).await.map_err(StoreError::from)? {
                provider_env_revision = provider_env_revision.max(row.get::<i64, _>(0) as u64);
            }
        }

        let config = GetSandboxConfigResponse {
            policy: Some(policy),
            version: policy_row.policy_version as u32,
            policy_hash: hash,
            settings,
            config_revision: (local.policy_version
                + local.settings_revision
                + global.policy_version
                + global.settings_revision) as u64,
            policy_source: source as i32,
            global_policy_version: global.policy_version as u32,
            provider_env_revision,
            provider_attachment_epoch: spec.provider_attachment_epoch.clone(),
        };
        Ok((config, spec.providers))
    }

    /// Resolves the environment of the attached providers, merged in
    /// attachment order (a later provider's value wins).
    async fn load_environment(
        &self,
        tx: &mut Tx,
        providers: &[String],
        identity: &EnvIdentity,
    ) -> Result<GetSandboxProviderEnvironmentResponse, BuildError> {
        let mut env = GetSandboxProviderEnvironmentResponse {
            environment: Default::default(),
            provider_env_revision: identity.provider_env_revision,
            provider_attachment_epoch: identity.provider_attachment_epoch.clone(),
            policy_hash: identity.policy_hash.clone(),
        };
        if providers.is_empty() {
            return Ok(env);
        }
        let sql = format!(
            "SELECT name, record FROM providers WHERE name IN ({})",
            placeholders(1, providers.len())
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for name in providers {
            query = query.bind(name.clone());
        }
        let mut records = std::collections::HashMap::new();
        for row in query.fetch_all(&mut **tx).await.map_err(StoreError::from)? {
            let name: String = row.get(0);
            let record =
                Provider::decode(row.get::<Vec<u8>, _>(1).as_slice()).map_err(StoreError::from)?;
            records.insert(name, record);
        }
        for name in providers {
            if let Some(record) = records.remove(name) {
                env.environment.extend(record.environment);
            }
        }
        Ok(env)
    }
}
