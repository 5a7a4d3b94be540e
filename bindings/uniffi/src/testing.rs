//! [`LocalCluster`]: the reference gateway's developer cluster
//! (`openshell-gateway up`: replicas behind an edge, optionally shared
//! supervisor hosts) for tests on the JVM, as `openshell_sdk::testing` starts
//! it for Rust, Python, TypeScript and Go, with the same faults on demand.
//! The executable is the options' `gateway_bin`, else `OPENSHELL_GATEWAY_BIN`,
//! else `openshell-gateway` on `PATH` (the Kotlin layer passes the one it
//! unpacked from the `openshell-gateway-bin` jar when that is on the classpath).

use std::sync::Arc;
use std::time::Duration;

use openshell_sdk::testing::{Fault, LocalCluster as CoreCluster, LocalClusterOptions};

use crate::errors::{OpenShellError, invalid};

/// How to start a [`LocalCluster`].
#[derive(Debug, Clone, uniffi::Record)]
pub struct LocalClusterConfig {
    /// Gateway replicas (`gw-0`..), at least 1.
    #[uniffi(default = 3)]
    pub replicas: u32,
    /// Shared supervisor hosts (`h-0`..); 0 runs one supervisor per sandbox.
    #[uniffi(default = 0)]
    pub hosts: u32,
    /// `push` or `poll`.
    #[uniffi(default = "push")]
    pub config_delivery: String,
    /// `auto`, `namespaces` or `none` (the gateway's `--isolation`).
    #[uniffi(default = "auto")]
    pub isolation: String,
    /// Start a process that dies unasked again (off: a test sees the crash).
    #[uniffi(default = false)]
    pub restart_crashed: bool,
    /// The `openshell-gateway` executable (its `openshell-supervisor` beside it).
    #[uniffi(default = None)]
    pub gateway_bin: Option<String>,
}

/// One fault to order; [`LocalCluster::fault`] carries it out and returns
/// once `up` has (a replica stopped, a route cut, ...).
#[derive(Debug, Clone, uniffi::Enum)]
pub enum ClusterFault {
    /// SIGTERM: the replica drains and redirects its sessions.
    StopReplica {
        id: String,
    },
    /// SIGKILL: its sessions move when their supervisors notice.
    KillReplica {
        id: String,
    },
    /// Starts a stopped or killed replica again.
    StartReplica {
        id: String,
    },
    /// The edge stops routing to the replica (it still runs).
    CutRoute {
        id: String,
    },
    RestoreRoute {
        id: String,
    },
    /// Stops the edge and starts it again on the same port.
    RestartEdge,
    /// SIGKILL to a shared host: its sandboxes lose their supervisor.
    KillHost {
        id: String,
    },
    StartHost {
        id: String,
    },
    /// Every store operation waits this long first.
    SlowStore {
        delay_ms: u64,
    },
    /// Every store operation fails.
    CutStore,
    /// Ends `SlowStore` and `CutStore`.
    RestoreStore,
}

impl From<ClusterFault> for Fault {
    fn from(fault: ClusterFault) -> Self {
        match fault {
            ClusterFault::StopReplica { id } => Fault::StopReplica(id),
            ClusterFault::KillReplica { id } => Fault::KillReplica(id),
            ClusterFault::StartReplica { id } => Fault::StartReplica(id),
            ClusterFault::CutRoute { id } => Fault::CutRoute(id),
            ClusterFault::RestoreRoute { id } => Fault::RestoreRoute(id),
            ClusterFault::RestartEdge => Fault::RestartEdge,
            ClusterFault::KillHost { id } => Fault::KillHost(id),
            ClusterFault::StartHost { id } => Fault::StartHost(id),
            ClusterFault::SlowStore { delay_ms } => {
                Fault::SlowStore(Duration::from_millis(delay_ms))
            }
            ClusterFault::CutStore => Fault::CutStore,
            ClusterFault::RestoreStore => Fault::RestoreStore,
        }
    }
}

/// A running local cluster; `stop()` ends it (and so does the JVM exiting:
/// `up` stops everything once its input closes).
#[derive(uniffi::Object)]
pub struct LocalCluster {
    inner: CoreCluster,
}

#[uniffi::export(async_runtime = "tokio")]
impl LocalCluster {
    /// Starts the cluster and waits until it serves (`invalid_config` for
    /// bad options; `cluster` for a missing executable, or a cluster that
    /// does not come up, with a message naming its log directory).
    #[uniffi::constructor]
    pub async fn start(config: LocalClusterConfig) -> Result<Arc<Self>, OpenShellError> {
        let replicas =
            usize::try_from(config.replicas).map_err(|_| invalid("replicas is too large"))?;
        let mut options = LocalClusterOptions::new()
            .replicas(replicas)
            .hosts(config.hosts)
            .config_delivery(config.config_delivery)
            .isolation(config.isolation)
            .restart_crashed(config.restart_crashed);
        if let Some(bin) = config.gateway_bin {
            options = options.gateway_bin(bin);
        }
        let inner = CoreCluster::start(options).await?;
        Ok(Arc::new(Self { inner }))
    }

    /// The edge's endpoint (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        self.inner.endpoint().to_owned()
    }

    /// The cluster's data directory (store, sandboxes, logs under `up/`).
    pub fn data_dir(&self) -> String {
        self.inner.data_dir().display().to_string()
    }

    /// The replicas' ids (`gw-0`, `gw-1`, ...).
    pub fn replica_ids(&self) -> Vec<String> {
        self.inner.replica_ids().to_vec()
    }

    /// The shared hosts' ids (`h-0`, ...; empty without hosts).
    pub fn host_ids(&self) -> Vec<String> {
        self.inner.host_ids().to_vec()
    }

    /// The replica holding the sandbox's session, as the cluster reports it.
    pub async fn owner_of(&self, sandbox: String) -> Result<Option<String>, OpenShellError> {
        Ok(self.inner.owner_of(&sandbox).await?)
    }

    /// Carries out one fault (`invalid_config` for an unknown replica or host).
    pub async fn fault(&self, fault: ClusterFault) -> Result<(), OpenShellError> {
        Ok(self.inner.fault(fault.into()).await?)
    }

    /// Stops every process of the cluster and removes its data directory.
    /// Idempotent; later faults fail.
    pub async fn stop(&self) -> Result<(), OpenShellError> {
        Ok(self.inner.close().await?)
    }
}
