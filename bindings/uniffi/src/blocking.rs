//! Blocking twins of the client's unary calls, for JVM code that waits on
//! its own thread (a servlet, a JDBC-style service, grpc-java's blocking
//! stubs' users): `OpenShellBlockingClient` in `sdk-jvm`.
//!
//! Each twin crosses the boundary once. The suspend path crosses it five
//! times per call (create, poll, wake callback, complete, free: uniffi's
//! future protocol) and hands the answer from a runtime worker to the
//! coroutine's thread; here the calling thread polls the core's future itself
//! inside the runtime's context and is woken once, when the answer is in.
//!
//! Deadlines and `cancel_all()` end a blocking call as they end a suspend
//! one (`deadline_exceeded`, `cancelled`); a Java thread interrupt does not
//! reach native code, so it does not.

use std::future::Future;

use crate::client::{
    CreateSandboxRequest, ExecOutput, ExecRequest, HealthInfo, OpenShellClient, SandboxInfo,
    SandboxWithOwner,
};
use crate::errors::OpenShellError;

/// Runs `fut` to its end on the calling thread, inside the tokio context
/// every async export uses (async-compat's runtime). On a runtime worker (a
/// JVM callback that calls back in), the worker first hands its other tasks
/// away (`block_in_place`), so they keep running.
fn block_on<F: Future>(fut: F) -> F::Output {
    tokio::task::block_in_place(|| futures::executor::block_on(async_compat::Compat::new(fut)))
}

#[uniffi::export]
impl OpenShellClient {
    /// [`OpenShellClient::health`] on the calling thread.
    pub fn health_blocking(&self, timeout_ms: Option<u64>) -> Result<HealthInfo, OpenShellError> {
        block_on(self.health(timeout_ms))
    }

    /// [`OpenShellClient::create_sandbox`] on the calling thread.
    pub fn create_sandbox_blocking(
        &self,
        request: CreateSandboxRequest,
        timeout_ms: Option<u64>,
    ) -> Result<SandboxInfo, OpenShellError> {
        block_on(self.create_sandbox(request, timeout_ms))
    }

    /// [`OpenShellClient::get_sandbox`] on the calling thread.
    pub fn get_sandbox_blocking(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<SandboxInfo, OpenShellError> {
        block_on(self.get_sandbox(name, timeout_ms))
    }

    /// [`OpenShellClient::get_sandbox_with_owner`] on the calling thread.
    pub fn get_sandbox_with_owner_blocking(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<SandboxWithOwner, OpenShellError> {
        block_on(self.get_sandbox_with_owner(name, timeout_ms))
    }

    /// [`OpenShellClient::list_sandboxes`] on the calling thread.
    pub fn list_sandboxes_blocking(
        &self,
        label_selector: Option<String>,
        timeout_ms: Option<u64>,
    ) -> Result<Vec<SandboxInfo>, OpenShellError> {
        block_on(self.list_sandboxes(label_selector, timeout_ms))
    }

    /// [`OpenShellClient::delete_sandbox`] on the calling thread.
    pub fn delete_sandbox_blocking(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<String, OpenShellError> {
        block_on(self.delete_sandbox(name, timeout_ms))
    }

    /// [`OpenShellClient::wait_ready`] on the calling thread.
    pub fn wait_ready_blocking(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<SandboxInfo, OpenShellError> {
        block_on(self.wait_ready(name, timeout_ms))
    }

    /// [`OpenShellClient::wait_deleted`] on the calling thread.
    pub fn wait_deleted_blocking(
        &self,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<(), OpenShellError> {
        block_on(self.wait_deleted(name, timeout_ms))
    }

    /// [`OpenShellClient::exec`] on the calling thread (the gateway runs the
    /// command once: a blocking exec is the same single RPC).
    pub fn exec_blocking(
        &self,
        request: ExecRequest,
        timeout_ms: Option<u64>,
    ) -> Result<ExecOutput, OpenShellError> {
        block_on(self.exec(request, timeout_ms))
    }
}
