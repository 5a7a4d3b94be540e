//! `NativeLocalCluster`: the core's local test cluster
//! ([`openshell_sdk::testing::LocalCluster`]) as a Python handle.
//!
//! `openshell_sdk.testing` builds its `LocalCluster` and `AsyncLocalCluster`
//! on this one class: every method returns an awaitable, completed on the
//! calling thread (GIL released) for a handle started with
//! `blocking=True`. Process supervision stays in the core and in `up`;
//! nothing here starts or signals a process.
//!
//! The handle owns the cluster behind an `Arc`: `close()` stops it (every
//! process by PID, the data directory removed after a clean stop), and the
//! last reference dropping without a close does the same through the core's
//! `Drop` (it closes `up`'s input and waits for it).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openshell_sdk::testing::{Fault, LocalCluster, LocalClusterOptions};
use pyo3::prelude::*;

use crate::waker::run;

#[pyclass(frozen, module = "openshell_sdk._native", name = "NativeLocalCluster")]
pub struct NativeLocalCluster {
    cluster: Arc<LocalCluster>,
    blocking: bool,
    endpoint: String,
    data_dir: String,
    replica_ids: Vec<String>,
    host_ids: Vec<String>,
}

impl NativeLocalCluster {
    fn fault<'py>(&self, py: Python<'py>, fault: Fault) -> PyResult<Bound<'py, PyAny>> {
        let cluster = self.cluster.clone();
        run(py, self.blocking, async move { cluster.fault(fault).await })
    }
}

#[pymethods]
impl NativeLocalCluster {
    /// Starts a cluster; resolves to a `NativeLocalCluster` once it serves.
    #[staticmethod]
    #[pyo3(signature = (*, replicas, hosts, config_delivery, isolation, restart_crashed, gateway_bin, blocking))]
    #[allow(clippy::too_many_arguments)]
    fn start<'py>(
        py: Python<'py>,
        replicas: usize,
        hosts: u32,
        config_delivery: String,
        isolation: String,
        restart_crashed: bool,
        gateway_bin: Option<PathBuf>,
        blocking: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut options = LocalClusterOptions::new()
            .replicas(replicas)
            .hosts(hosts)
            .config_delivery(config_delivery)
            .isolation(isolation)
            .restart_crashed(restart_crashed);
        if let Some(path) = gateway_bin {
            options = options.gateway_bin(path);
        }
        run(py, blocking, async move {
            let cluster = LocalCluster::start(options).await?;
            Ok(NativeLocalCluster {
                endpoint: cluster.endpoint().to_owned(),
                data_dir: cluster.data_dir().display().to_string(),
                replica_ids: cluster.replica_ids().to_vec(),
                host_ids: cluster.host_ids().to_vec(),
                cluster: Arc::new(cluster),
                blocking,
            })
        })
    }

    #[getter]
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    #[getter]
    fn data_dir(&self) -> &str {
        &self.data_dir
    }

    #[getter]
    fn replica_ids(&self) -> Vec<String> {
        self.replica_ids.clone()
    }

    #[getter]
    fn host_ids(&self) -> Vec<String> {
        self.host_ids.clone()
    }

    /// Resolves to the owning replica's id, or `None`.
    fn owner_of<'py>(&self, py: Python<'py>, sandbox: String) -> PyResult<Bound<'py, PyAny>> {
        let cluster = self.cluster.clone();
        run(py, self.blocking, async move {
            cluster.owner_of(&sandbox).await
        })
    }

    fn stop_replica<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        self.fault(py, Fault::StopReplica(id))
    }

    fn kill_replica<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        self.fault(py, Fault::KillReplica(id))
    }

    fn start_replica<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        self.fault(py, Fault::StartReplica(id))
    }

    fn cut_route<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        self.fault(py, Fault::CutRoute(id))
    }

    fn restore_route<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        self.fault(py, Fault::RestoreRoute(id))
    }

    fn kill_host<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        self.fault(py, Fault::KillHost(id))
    }

    fn start_host<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        self.fault(py, Fault::StartHost(id))
    }

    fn restart_edge<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let cluster = self.cluster.clone();
        run(
            py,
            self.blocking,
            async move { cluster.restart_edge().await },
        )
    }

    /// Every replica's store calls wait `delay_ms` first (0 with
    /// `cut=False` restores the store); `cut=True` makes them fail after
    /// their deadline, as on a frozen database.
    fn set_store<'py>(
        &self,
        py: Python<'py>,
        delay_ms: u64,
        cut: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.fault(
            py,
            match (cut, delay_ms) {
                (true, _) => Fault::CutStore,
                (false, 0) => Fault::RestoreStore,
                (false, ms) => Fault::SlowStore(Duration::from_millis(ms)),
            },
        )
    }

    /// Stops every process and removes the data directory (kept, with its
    /// path in the error, when the stop was not clean). Idempotent.
    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let cluster = self.cluster.clone();
        run(py, self.blocking, async move { cluster.close().await })
    }
}
