//! [`LocalCluster`]: the reference gateway's developer cluster
//! (`openshell-gateway up`, replicas behind an edge) for tests on the JVM,
//! as `openshell_sdk::testing` starts it for Rust, Python, TypeScript and
//! Go. The executable is found in `OPENSHELL_GATEWAY_BIN`, else on `PATH`.

use std::sync::Arc;

use openshell_sdk::testing::{LocalCluster as CoreCluster, LocalClusterOptions};
use tokio::sync::Mutex;

use crate::errors::OpenShellError;

/// A running local cluster; `stop()` ends it (and so does the JVM exiting:
/// `up` stops everything once its input closes).
#[derive(uniffi::Object)]
pub struct LocalCluster {
    endpoint: String,
    replica_ids: Vec<String>,
    inner: Mutex<Option<CoreCluster>>,
}

#[uniffi::export(async_runtime = "tokio")]
impl LocalCluster {
    /// Starts `replicas` gateways behind an edge and waits until they serve.
    #[uniffi::constructor]
    pub async fn start(replicas: u32) -> Result<Arc<Self>, OpenShellError> {
        let options = LocalClusterOptions::new().replicas(replicas as usize);
        let cluster = CoreCluster::start(options).await?;
        Ok(Arc::new(Self {
            endpoint: cluster.endpoint().to_owned(),
            replica_ids: cluster.replica_ids().to_vec(),
            inner: Mutex::new(Some(cluster)),
        }))
    }

    /// The edge's endpoint (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The replicas' ids (`gw-0`, `gw-1`, ...).
    pub fn replica_ids(&self) -> Vec<String> {
        self.replica_ids.clone()
    }

    /// The replica holding the sandbox's session, as the cluster reports it.
    pub async fn owner_of(&self, sandbox: String) -> Result<Option<String>, OpenShellError> {
        let inner = self.inner.lock().await;
        match inner.as_ref() {
            Some(cluster) => Ok(cluster.owner_of(&sandbox).await?),
            None => Err(openshell_sdk::Error::invalid_config("the cluster is stopped").into()),
        }
    }

    /// Stops every process of the cluster. Idempotent.
    pub async fn stop(&self) -> Result<(), OpenShellError> {
        let cluster = self.inner.lock().await.take();
        match cluster {
            Some(cluster) => Ok(cluster.stop().await?),
            None => Ok(()),
        }
    }
}
