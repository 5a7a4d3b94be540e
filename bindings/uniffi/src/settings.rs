//! Configuration writes of a client (`UpdateConfig`, through the core's raw
//! unary call): a sandbox's or the global settings, which reach the
//! sandbox's [`crate::ConfigSession`] as new snapshots.

use openshell_sdk::proto::{UpdateConfigRequest, UpdateConfigResponse};
use prost::Message;

use crate::client::OpenShellClient;
use crate::config_session::SettingValue;
use crate::errors::OpenShellError;

const UPDATE_CONFIG: &str = "/openshell.v1.OpenShell/UpdateConfig";

/// What a configuration write answered.
#[derive(Debug, Clone, uniffi::Record)]
pub struct SettingWrite {
    /// Settings revision of the written scope.
    pub settings_revision: i64,
    /// A delete removed an existing setting.
    pub deleted: bool,
}

/// A write of setting `key` in sandbox `sandbox`'s scope (the global one
/// when `None`), without the write itself.
fn scoped(sandbox: Option<String>, key: String) -> UpdateConfigRequest {
    UpdateConfigRequest {
        global: sandbox.is_none(),
        sandbox: sandbox.unwrap_or_default(),
        setting_key: key,
        ..Default::default()
    }
}

impl OpenShellClient {
    async fn update_config(
        &self,
        request: UpdateConfigRequest,
        timeout_ms: Option<u64>,
    ) -> Result<SettingWrite, OpenShellError> {
        let (options, _) = self.options(timeout_ms);
        let call = self.client.raw_unary(
            UPDATE_CONFIG,
            request.encode_to_vec().into(),
            openshell_sdk::Metadata::default(),
            options,
        );
        let response = self.run(call).await?;
        let answer = UpdateConfigResponse::decode(response.bytes.clone()).map_err(|e| {
            openshell_sdk::Error::protocol(format!("UpdateConfig: undecodable answer: {e}"))
        })?;
        Ok(SettingWrite {
            settings_revision: crate::client::counter(answer.settings_revision),
            deleted: answer.deleted,
        })
    }
}

#[uniffi::export(async_runtime = "tokio")]
impl OpenShellClient {
    /// Sets one setting of sandbox `sandbox` (by name), or of every sandbox
    /// when `sandbox` is `None` (the global scope, which overrides).
    pub async fn set_setting(
        &self,
        sandbox: Option<String>,
        key: String,
        value: SettingValue,
        timeout_ms: Option<u64>,
    ) -> Result<SettingWrite, OpenShellError> {
        let request = UpdateConfigRequest {
            setting_value: Some(value.into_proto()),
            ..scoped(sandbox, key)
        };
        self.update_config(request, timeout_ms).await
    }

    /// Removes one setting from sandbox `sandbox`'s scope (or the global
    /// one when `None`).
    pub async fn delete_setting(
        &self,
        sandbox: Option<String>,
        key: String,
        timeout_ms: Option<u64>,
    ) -> Result<SettingWrite, OpenShellError> {
        let request = UpdateConfigRequest {
            delete_setting: true,
            ..scoped(sandbox, key)
        };
        self.update_config(request, timeout_ms).await
    }
}
