//! The core's local test cluster ([`openshell_sdk::testing::LocalCluster`])
//! as a C handle: `sdk-go/openshelltest` is built on it.
//!
//! Process supervision stays in the core and in `up`; nothing here starts
//! or signals a process. Starting, every fault order, `owner_of` and
//! closing are async exports with the usual completion (exactly once). The
//! handle holds the cluster behind an `Arc`, so a call in flight keeps it
//! alive after [`openshell_local_cluster_free`]; the last reference going
//! stops the cluster through the core's `Drop` (it closes `up`'s input and
//! waits for it, at most 60 s, on that thread): close it first.
//!
//! A failure of the cluster completes with error code `cluster` and, when
//! the logs are kept, their directory in the error's `logs`; bad options
//! and unknown replica or host ids complete with `invalid_config`.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use openshell_sdk::Error;
use openshell_sdk::testing::{Fault, LocalCluster, LocalClusterOptions};

use crate::complete::{OsCallback, Outcome, start};
use crate::types::{OS_INVALID, OsBytes, OsOwnedBytes};

/// Options of a local cluster, passed by value; empty strings mean the
/// default.
#[repr(C)]
pub struct OsLocalClusterOptions {
    /// Gateway replicas (`gw-0`..), at least 1.
    pub replicas: u32,
    /// Shared supervisor hosts (`h-0`..); 0 runs one supervisor process per
    /// sandbox.
    pub hosts: u32,
    /// `push` (empty: the default) or `poll`.
    pub config_delivery: OsBytes,
    /// `auto` (empty: the default), `namespaces` or `none`.
    pub isolation: OsBytes,
    /// Start a process that died unasked again (`up --restart always`).
    pub restart_crashed: bool,
    /// The `openshell-gateway` to run (its `openshell-supervisor` beside
    /// it); empty: `OPENSHELL_GATEWAY_BIN`, then `PATH`.
    pub gateway_bin: OsBytes,
}

/// A running local cluster. Close it with [`openshell_local_cluster_close`],
/// free it with [`openshell_local_cluster_free`].
pub struct OsLocalCluster {
    cluster: Arc<LocalCluster>,
}

/// [`openshell_local_cluster_text`]: the edge's URL.
pub const OS_CLUSTER_ENDPOINT: i32 = 1;
/// The data directory (store, sandboxes, logs under `up/`).
pub const OS_CLUSTER_DATA_DIR: i32 = 2;
/// The replica ids, each followed by a NUL byte.
pub const OS_CLUSTER_REPLICA_IDS: i32 = 3;
/// The shared host ids, each followed by a NUL byte (empty without hosts).
pub const OS_CLUSTER_HOST_IDS: i32 = 4;

/// [`openshell_local_cluster_fault`]: SIGTERM to replica `id`; down until
/// started.
pub const OS_FAULT_STOP_REPLICA: u32 = 1;
/// SIGKILL to replica `id`; down until started.
pub const OS_FAULT_KILL_REPLICA: u32 = 2;
/// Starts replica `id` again on its old ports; completes once it serves.
pub const OS_FAULT_START_REPLICA: u32 = 3;
/// The edge loses its route to replica `id` (hinted calls to it take the
/// unrouted retry).
pub const OS_FAULT_CUT_ROUTE: u32 = 4;
/// Gives the edge its route to replica `id` back.
pub const OS_FAULT_RESTORE_ROUTE: u32 = 5;
/// Stops and starts the edge (`id` is ignored).
pub const OS_FAULT_RESTART_EDGE: u32 = 6;
/// SIGKILL to shared host `id`; down until started.
pub const OS_FAULT_KILL_HOST: u32 = 7;
/// Starts shared host `id` again.
pub const OS_FAULT_START_HOST: u32 = 8;
/// The store stops answering: every call that needs it fails `unavailable`
/// after its deadline (5 s), naming the store (`id` is ignored).
pub const OS_FAULT_CUT_STORE: u32 = 9;
/// Ends a slow or cut store (`id` is ignored).
pub const OS_FAULT_RESTORE_STORE: u32 = 10;

fn options_of(options: &OsLocalClusterOptions) -> Result<LocalClusterOptions, Error> {
    let mut out = LocalClusterOptions::new()
        .replicas(options.replicas as usize)
        .hosts(options.hosts)
        .restart_crashed(options.restart_crashed);
    if let Some(mode) = unsafe { options.config_delivery.to_opt_string("config delivery") }? {
        out = out.config_delivery(mode);
    }
    if let Some(isolation) = unsafe { options.isolation.to_opt_string("isolation") }? {
        out = out.isolation(isolation);
    }
    if let Some(bin) = unsafe { options.gateway_bin.to_opt_string("gateway executable") }? {
        out = out.gateway_bin(bin);
    }
    Ok(out)
}

/// Starts a local cluster; the completion's `handle` is the
/// `OsLocalCluster`, once it serves.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_local_cluster_start(
    options: OsLocalClusterOptions,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    start(callback, user_data, || {
        let options = options_of(&options);
        async move {
            let cluster = LocalCluster::start(options?).await?;
            let handle = Box::new(OsLocalCluster {
                cluster: Arc::new(cluster),
            });
            Ok(Outcome::Handle(Box::into_raw(handle) as usize))
        }
    })
}

/// One text of the cluster (`OS_CLUSTER_*`; empty for an unknown `which`);
/// free with `openshell_bytes_free`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_local_cluster_text(
    cluster: *const OsLocalCluster,
    which: i32,
) -> OsOwnedBytes {
    let empty = || OsOwnedBytes {
        ptr: std::ptr::null_mut(),
        len: 0,
        cap: 0,
    };
    let Some(c) = (unsafe { cluster.as_ref() }) else {
        return empty();
    };
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        let ids = |ids: &[String]| ids.iter().map(|id| format!("{id}\0")).collect::<String>();
        let text = match which {
            OS_CLUSTER_ENDPOINT => c.cluster.endpoint().to_owned(),
            OS_CLUSTER_DATA_DIR => c.cluster.data_dir().display().to_string(),
            OS_CLUSTER_REPLICA_IDS => ids(c.cluster.replica_ids()),
            OS_CLUSTER_HOST_IDS => ids(c.cluster.host_ids()),
            _ => String::new(),
        };
        OsOwnedBytes::from_vec(text.into_bytes())
    }))
    .unwrap_or_else(|_| empty())
}

/// One fault order (`OS_FAULT_*`) on replica or host `id`; completes once
/// `up` carried it out (`value` empty).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_local_cluster_fault(
    cluster: *const OsLocalCluster,
    fault: u32,
    id: OsBytes,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { cluster.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let cluster = c.cluster.clone();
        let id = unsafe { id.to_string("replica or host id") };
        async move {
            let id = id?;
            let order = match fault {
                OS_FAULT_STOP_REPLICA => Fault::StopReplica(id),
                OS_FAULT_KILL_REPLICA => Fault::KillReplica(id),
                OS_FAULT_START_REPLICA => Fault::StartReplica(id),
                OS_FAULT_CUT_ROUTE => Fault::CutRoute(id),
                OS_FAULT_RESTORE_ROUTE => Fault::RestoreRoute(id),
                OS_FAULT_RESTART_EDGE => Fault::RestartEdge,
                OS_FAULT_KILL_HOST => Fault::KillHost(id),
                OS_FAULT_START_HOST => Fault::StartHost(id),
                OS_FAULT_CUT_STORE => Fault::CutStore,
                OS_FAULT_RESTORE_STORE => Fault::RestoreStore,
                other => return Err(Error::invalid_config(format!("unknown fault {other}"))),
            };
            cluster.fault(order).await?;
            Ok(Outcome::Value(Vec::new()))
        }
    })
}

/// Every replica's store calls wait `delay_ms` first (a slow database)
/// until `OS_FAULT_RESTORE_STORE`; a delay past a call's deadline (5 s)
/// makes it fail `unavailable`. Completes once `up` carried it out.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_local_cluster_slow_store(
    cluster: *const OsLocalCluster,
    delay_ms: u64,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { cluster.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let cluster = c.cluster.clone();
        async move {
            cluster
                .fault(Fault::SlowStore(Duration::from_millis(delay_ms)))
                .await?;
            Ok(Outcome::Value(Vec::new()))
        }
    })
}

/// The replica holding `sandbox`'s supervisor session, as the gateway
/// reports it: the completion's `value` is its id, empty when no replica
/// holds it now (or the cluster has one replica).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_local_cluster_owner_of(
    cluster: *const OsLocalCluster,
    sandbox: OsBytes,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { cluster.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let cluster = c.cluster.clone();
        let sandbox = unsafe { sandbox.to_string("sandbox") };
        async move {
            let owner = cluster.owner_of(&sandbox?).await?;
            Ok(Outcome::Value(owner.unwrap_or_default().into_bytes()))
        }
    })
}

/// Stops every process of the cluster and removes its data directory
/// (kept, with its path in the error's `logs`, when the stop was not
/// clean). Later orders fail; a second close completes at once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_local_cluster_close(
    cluster: *const OsLocalCluster,
    callback: OsCallback,
    user_data: usize,
) -> i32 {
    let Some(c) = (unsafe { cluster.as_ref() }) else {
        return OS_INVALID;
    };
    start(callback, user_data, || {
        let cluster = c.cluster.clone();
        async move {
            cluster.close().await?;
            Ok(Outcome::Value(Vec::new()))
        }
    })
}

/// Frees the handle (null is ignored). A cluster not closed is stopped
/// when the last call using it ends, on that thread, waiting up to 60 s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openshell_local_cluster_free(cluster: *mut OsLocalCluster) {
    if !cluster.is_null() {
        let _ =
            std::panic::catch_unwind(AssertUnwindSafe(|| drop(unsafe { Box::from_raw(cluster) })));
    }
}
