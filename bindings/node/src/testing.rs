//! `NativeLocalCluster`: the core's local test cluster
//! ([`openshell_sdk::testing::LocalCluster`]) as a Node handle.
//!
//! `@openshell/sdk/testing` builds `startLocalCluster` and its
//! `LocalCluster` on this one class: every method returns a Promise settled
//! on Node's main thread, like the client's. Process supervision stays in
//! the core and in `up`; nothing here starts or signals a process.
//!
//! The handle owns the cluster behind an `Arc` (each call's future holds a
//! clone): `close()` stops it (every process by PID, the data directory
//! removed after a clean stop). `closeBlocking()` does the same on the
//! calling thread, for `process.on("exit")`, where no Promise settles any
//! more. `@openshell/sdk/testing` holds every running cluster until it is
//! stopped, so the last reference drops (the core's `Drop`: close `up`'s
//! input, wait for it) only when Node tears the addon down; and a Node
//! process that dies, even by SIGKILL, closes `up`'s input too, which stops
//! everything `up` started.

use std::sync::Arc;
use std::time::Duration;

use napi::bindgen_prelude::PromiseRaw;
use napi::{Env, Result};
use napi_derive::napi;
use openshell_sdk::testing::{Fault, LocalCluster, LocalClusterOptions};

use crate::errors::{guard, guard_sync, invalid, to_napi};

/// What `@openshell/sdk/testing` passes to start a cluster (absent: the
/// core's default).
#[napi(object)]
pub struct NativeLocalClusterOptions {
    pub replicas: Option<u32>,
    pub hosts: Option<u32>,
    pub config_delivery: Option<String>,
    pub isolation: Option<String>,
    pub restart_crashed: Option<bool>,
    /// The `openshell-gateway` to run (else the core's lookup:
    /// `OPENSHELL_GATEWAY_BIN`, then `PATH`).
    pub gateway_bin: Option<String>,
}

#[napi]
pub struct NativeLocalCluster {
    cluster: Arc<LocalCluster>,
    endpoint: String,
    data_dir: String,
    replica_ids: Vec<String>,
    host_ids: Vec<String>,
}

impl NativeLocalCluster {
    fn cluster(&self) -> Arc<LocalCluster> {
        self.cluster.clone()
    }

    fn fault<'e>(&self, env: &'e Env, fault: Fault) -> Result<PromiseRaw<'e, ()>> {
        let cluster = self.cluster();
        env.spawn_future(guard(async move { cluster.fault(fault).await }))
    }
}

#[napi]
impl NativeLocalCluster {
    /// Starts a cluster; resolves to a handle once it serves.
    #[napi]
    pub fn start(
        env: &Env,
        options: NativeLocalClusterOptions,
    ) -> Result<PromiseRaw<'_, NativeLocalCluster>> {
        let mut built = LocalClusterOptions::new();
        if let Some(n) = options.replicas {
            built = built.replicas(n as usize);
        }
        if let Some(n) = options.hosts {
            built = built.hosts(n);
        }
        if let Some(mode) = options.config_delivery {
            built = built.config_delivery(mode);
        }
        if let Some(isolation) = options.isolation {
            built = built.isolation(isolation);
        }
        if let Some(restart) = options.restart_crashed {
            built = built.restart_crashed(restart);
        }
        if let Some(path) = options.gateway_bin {
            built = built.gateway_bin(path);
        }
        env.spawn_future(guard(async move {
            let cluster = LocalCluster::start(built).await?;
            Ok(NativeLocalCluster {
                endpoint: cluster.endpoint().to_owned(),
                data_dir: cluster.data_dir().display().to_string(),
                replica_ids: cluster.replica_ids().to_vec(),
                host_ids: cluster.host_ids().to_vec(),
                cluster: Arc::new(cluster),
            })
        }))
    }

    #[napi(getter)]
    pub fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    #[napi(getter)]
    pub fn data_dir(&self) -> String {
        self.data_dir.clone()
    }

    #[napi(getter)]
    pub fn replica_ids(&self) -> Vec<String> {
        self.replica_ids.clone()
    }

    #[napi(getter)]
    pub fn host_ids(&self) -> Vec<String> {
        self.host_ids.clone()
    }

    /// Resolves to the owning replica's id, or `null`.
    #[napi]
    pub fn owner_of<'e>(
        &self,
        env: &'e Env,
        sandbox: String,
    ) -> Result<PromiseRaw<'e, Option<String>>> {
        let cluster = self.cluster();
        env.spawn_future(guard(async move { cluster.owner_of(&sandbox).await }))
    }

    #[napi]
    pub fn stop_replica<'e>(&self, env: &'e Env, id: String) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::StopReplica(id))
    }

    #[napi]
    pub fn kill_replica<'e>(&self, env: &'e Env, id: String) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::KillReplica(id))
    }

    #[napi]
    pub fn start_replica<'e>(&self, env: &'e Env, id: String) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::StartReplica(id))
    }

    #[napi]
    pub fn cut_route<'e>(&self, env: &'e Env, id: String) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::CutRoute(id))
    }

    #[napi]
    pub fn restore_route<'e>(&self, env: &'e Env, id: String) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::RestoreRoute(id))
    }

    #[napi]
    pub fn kill_host<'e>(&self, env: &'e Env, id: String) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::KillHost(id))
    }

    #[napi]
    pub fn start_host<'e>(&self, env: &'e Env, id: String) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::StartHost(id))
    }

    #[napi]
    pub fn restart_edge<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::RestartEdge)
    }

    /// Every replica's store calls wait `delay_ms` first, until
    /// `restoreStore()` (past a call's 5 s deadline they fail `unavailable`).
    #[napi]
    pub fn slow_store<'e>(&self, env: &'e Env, delay_ms: f64) -> Result<PromiseRaw<'e, ()>> {
        if !(delay_ms.is_finite() && (0.0..=600_000.0).contains(&delay_ms)) {
            return Err(invalid("a store delay is 0 to 600000 ms"));
        }
        let delay = Duration::from_millis(delay_ms.round() as u64);
        self.fault(env, Fault::SlowStore(delay))
    }

    /// The store stops answering (a frozen database) until `restoreStore()`.
    #[napi]
    pub fn cut_store<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::CutStore)
    }

    /// Ends `slowStore` and `cutStore`.
    #[napi]
    pub fn restore_store<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, ()>> {
        self.fault(env, Fault::RestoreStore)
    }

    /// Stops every process and removes the data directory (kept, with its
    /// path in the error, when the stop was not clean). Idempotent.
    #[napi]
    pub fn close<'e>(&self, env: &'e Env) -> Result<PromiseRaw<'e, ()>> {
        let cluster = self.cluster();
        env.spawn_future(guard(async move { cluster.close().await }))
    }

    /// [`NativeLocalCluster::close`] on this thread (at most the core's
    /// stop bound): for `process.on("exit")`, where Promises no longer run.
    #[napi]
    pub fn close_blocking(&self) -> Result<()> {
        guard_sync(|| {
            let cluster = self.cluster();
            napi::bindgen_prelude::block_on(async move { cluster.close().await })
                .map_err(|err| to_napi(&err))
        })
    }
}
