//! What keeps the process driver's world and the store in step outside of
//! requests: supervisors that exited, recovery at start (adopt, replace or
//! restart each local sandbox's supervisor), following other replicas'
//! sandbox events, and stopping every supervisor on exit.

use super::*;

impl Sandboxes {
    pub async fn on_supervisor_exit(&self, exit: SupervisorExit) {
        let Ok(stored) = self.store.get_by_id(&exit.sandbox_id).await else {
            return;
        };
        // A replaced or deliberately stopped supervisor is not a failure.
        if stored.supervisor_pid != i64::from(exit.pid)
            || phase_of(&stored.sandbox) == SandboxPhase::Deleting
            || self.sessions.is_shutting_down()
        {
            return;
        }
        tracing::warn!(
            sandbox_id = exit.sandbox_id,
            status = exit.status,
            "supervisor exited"
        );
        let _ = self
            .update_phase(
                &exit.sandbox_id,
                SandboxPhase::Error,
                "SupervisorExited",
                &format!("supervisor exited: {}", exit.status),
            )
            .await;
    }

    /// At start-up: finish interrupted deletions, adopt live supervisors,
    /// restart dead ones (claiming each with a compare-and-swap so replicas
    /// starting together start one supervisor, not several), and mark
    /// sandboxes whose session nobody holds as waiting.
    pub async fn recover(&self) -> anyhow::Result<()> {
        for mut stored in self.store.all().await? {
            let id = id_of(&stored.sandbox).to_owned();
            let phase = phase_of(&stored.sandbox);
            if stored.driver_host != self.host {
                continue;
            }
            let _lifecycle = self.driver.lock(&id).await;
            if phase == SandboxPhase::Deleting {
                self.finish_delete(&id, stored.supervisor_pid).await.ok();
                continue;
            }
            if self.pool.is_none() && self.adopt_from_host(&id).await? {
                // It ran on a supervisor host (`--driver hosts` before):
                // it gets a supervisor here like any whose supervisor is
                // gone (no pid is recorded for a pooled sandbox).
                stored.supervisor_pid = 0;
            }
            let held_elsewhere = self.cluster.is_some()
                && matches!(self.store.owner(&id, OWNER_TTL).await, Ok(Some(_)));
            if phase == SandboxPhase::Ready && !held_elsewhere {
                self.update_phase(
                    &id,
                    SandboxPhase::Unknown,
                    "GatewayRestarted",
                    "waiting for the supervisor to reconnect",
                )
                .await
                .ok();
            }
            if self.pool.is_some() {
                // Pooled: its host runs it; there is no supervisor to adopt.
                // A supervisor of its own (the process driver ran before)
                // stops: the lost-host sweep restarts the sandbox on a host.
                if let Ok(pid) = i32::try_from(stored.supervisor_pid)
                    && pid > 0
                {
                    if crate::sandboxes::driver::is_our_supervisor(pid, &id) {
                        tracing::info!(
                            sandbox_id = id,
                            pid,
                            "stopping a process-driver supervisor"
                        );
                        self.driver.stop_process(&id, pid).await;
                    }
                    self.store
                        .swap_supervisor(&id, stored.supervisor_pid, 0, None)
                        .await?;
                }
                continue;
            }
            let mut alive = i32::try_from(stored.supervisor_pid)
                .is_ok_and(|pid| crate::sandboxes::driver::is_our_supervisor(pid, &id));
            if !alive
                && let Some(pid) = self.driver.pid_file_supervisor(&id)
                && self
                    .store
                    .swap_supervisor(&id, stored.supervisor_pid, i64::from(pid), None)
                    .await?
            {
                // Started by a gateway that stopped before recording it.
                tracing::info!(sandbox_id = id, pid, "found a supervisor by supervisor.pid");
                stored.supervisor_pid = i64::from(pid);
                alive = true;
            }
            if alive && !self.driver.runs_as_configured(stored.supervisor_pid as i32) {
                // Started under another isolation mode (or by a release that
                // passed the token in its environment): replace it.
                tracing::info!(
                    sandbox_id = id,
                    pid = stored.supervisor_pid,
                    "replacing a supervisor started with other isolation"
                );
                self.driver
                    .stop_process(&id, stored.supervisor_pid as i32)
                    .await;
                alive = false;
            }
            if alive {
                tracing::info!(
                    sandbox_id = id,
                    pid = stored.supervisor_pid,
                    "adopted running supervisor"
                );
                continue;
            }
            let claim = -i64::from(std::process::id());
            if !self
                .store
                .swap_supervisor(&id, stored.supervisor_pid, claim, None)
                .await?
            {
                continue;
            }
            let (token, hash) = auth::new_sandbox_token();
            let limits = Limits::of_template(
                stored
                    .sandbox
                    .spec
                    .as_ref()
                    .and_then(|spec| spec.template.as_ref()),
            );
            match self.driver.start(&id, &token, &limits).await {
                Ok(pid) => {
                    self.store
                        .swap_supervisor(&id, claim, i64::from(pid), Some(&hash))
                        .await?;
                    tracing::info!(sandbox_id = id, pid, "restarted supervisor");
                }
                Err(err) => {
                    tracing::error!(sandbox_id = id, %err, "could not restart supervisor");
                    self.store.swap_supervisor(&id, claim, 0, None).await?;
                    self.update_phase(
                        &id,
                        SandboxPhase::Error,
                        "DriverFailed",
                        "could not start the supervisor",
                    )
                    .await
                    .ok();
                }
            }
        }
        Ok(())
    }

    /// Wakes this replica's watchers for changes any replica wrote, by
    /// following `sandbox_events` (local writes wake them directly too;
    /// watchers read the events themselves).
    pub async fn follow_events(self: Arc<Self>) {
        const BATCH: i64 = 500;
        let mut last = loop {
            match self.store.last_event_seq().await {
                Ok(seq) => break seq,
                Err(err) => {
                    // Watchers still re-read every second meanwhile.
                    tracing::warn!(%err, "cannot read the event log yet; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pruned = tokio::time::Instant::now();
        loop {
            tick.tick().await;
            let mut woken = std::collections::HashSet::new();
            // Everything new, however much arrived since the last tick.
            loop {
                let events = match self.store.events_after(last, BATCH).await {
                    Ok(events) => events,
                    Err(err) => {
                        tracing::warn!(%err, "reading sandbox events failed");
                        break;
                    }
                };
                let full = events.len() as i64 == BATCH;
                for event in events {
                    last = event.seq;
                    if woken.insert(event.sandbox_id.clone()) {
                        self.hub.wake(&event.sandbox_id);
                    }
                }
                if !full {
                    break;
                }
            }
            if pruned.elapsed() > Duration::from_secs(60) {
                pruned = tokio::time::Instant::now();
                if let Err(err) = self.store.prune_events(crate::store::DELETED_TTL).await {
                    tracing::debug!(%err, "pruning the event log failed; next time");
                }
            }
        }
    }

    /// Stops every supervisor (used by `--stop-sandboxes-on-exit`).
    pub async fn stop_all_supervisors(&self) {
        let Ok(all) = self.store.all().await else {
            return;
        };
        for stored in all {
            if stored.driver_host == self.host
                && let Ok(pid) = i32::try_from(stored.supervisor_pid)
                && pid > 0
            {
                self.driver.stop_process(id_of(&stored.sandbox), pid).await;
            }
        }
    }
}

/// How often supervisors' status files are looked at.
const STATUS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
/// Reason of the Ready condition of a sandbox whose supervisor cannot reach
/// the gateway.
pub const CANNOT_CONNECT: &str = "SupervisorCannotConnect";

impl Sandboxes {
    /// Shows why a local supervisor cannot reach the gateway (its status
    /// file: a refused connect, a TLS failure) in its sandbox's Ready
    /// condition while the sandbox waits for a session (PROVISIONING or
    /// UNKNOWN), so the cause is in `GetSandbox` and not only in the
    /// supervisor's log. An accepted session sets the condition back.
    pub async fn report_unreachable_gateways(self: Arc<Self>) {
        let mut tick = tokio::time::interval(STATUS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Ok(entries) = std::fs::read_dir(self.driver.sandboxes_root()) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(text) = std::fs::read_to_string(entry.path().join(driver::STATUS_FILE))
                else {
                    continue;
                };
                let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                self.report_unreachable(&id, text.trim()).await;
            }
        }
    }

    async fn report_unreachable(&self, id: &str, reason: &str) {
        // Written by our own supervisor (no client input); bounded anyway.
        let reason: String = reason.chars().take(240).collect();
        let message = format!("the supervisor cannot reach the gateway: {reason}");
        let Ok(stored) = self.store.get_by_id(id).await else {
            return;
        };
        if !waiting_for_session(&stored.sandbox, &message) {
            return;
        }
        // Checked again under the row lock: a session accepted since the
        // read above has made the sandbox READY, which stays.
        let updated = self
            .store
            .update(id, |sandbox| {
                if waiting_for_session(sandbox, &message) {
                    let phase = phase_of(sandbox);
                    set_phase(sandbox, phase, CANNOT_CONNECT, &message);
                }
            })
            .await;
        match updated {
            Ok(sandbox) => self.hub.wake(id_of(&sandbox)),
            Err(err) => {
                tracing::debug!(sandbox_id = id, %err, "could not show the supervisor's trouble")
            }
        }
    }
}

/// PROVISIONING or UNKNOWN, and not already showing `message`.
fn waiting_for_session(sandbox: &Sandbox, message: &str) -> bool {
    let shown = sandbox
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.r#type == "Ready"))
        .is_some_and(|c| c.reason == CANNOT_CONNECT && c.message == message);
    !shown
        && matches!(
            phase_of(sandbox),
            SandboxPhase::Provisioning | SandboxPhase::Unknown
        )
}
