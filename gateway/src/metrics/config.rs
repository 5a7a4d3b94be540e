//! Metrics of push config delivery (registered with the replica's others;
//! the delivery code in `config::delivery` records them).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
];

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// sandbox_config or provider_environment.
    pub part: &'static str,
    /// request (a poll RPC), bootstrap, mark, reconcile or retry.
    pub trigger: &'static str,
    /// ok or error.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// initial (the bootstrap) or update.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// applied, ignored_duplicate, rejected or unspecified.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotifyLabels {
    /// sandbox, provider or all.
    pub scope: &'static str,
    /// ok, stale_owner, unsupported_peer, error (the call failed) or
    /// skipped (a member with no known endpoint).
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    /// sandbox, provider or all.
    pub scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// local (a write on this replica), peer (a notification), reconcile,
    /// or join (the catch-up after this replica joined the cluster).
    pub source: &'static str,
}

/// Config delivery metrics (registered by `Metrics::new`).
pub struct ConfigMetrics {
    pub push_sessions: Gauge,
    pub builds_waiting: Gauge,
    pub build_duration: Family<BuildLabels, Histogram, fn() -> Histogram>,
    pub build_wait: Histogram,
    pub updates_sent: Family<KindLabels, Counter>,
    pub unchanged: Counter,
    pub results: Family<OutcomeLabels, Counter>,
    /// Results the gateway refused (reason unknown_update, invalid_outcome).
    pub results_rejected: Family<ReasonLabels, Counter>,
    /// Push sessions closed by delivery (bootstrap_timeout, unknown_update),
    /// and supervisor sessions closed because their stream stopped draining
    /// (not_draining).
    pub sessions_closed: Family<ReasonLabels, Counter>,
    pub peer_notifies: Family<NotifyLabels, Counter>,
    /// Push sessions that ended with changes they never delivered and
    /// passed them on to the sandbox's current session.
    pub handovers: Counter,
    /// Member lists of provider and global notifications, by source: store
    /// (read at write time) or ring (the store failed; a replica that joined
    /// since the last ring refresh is missed and catches up on its own).
    pub notify_members: Family<SourceLabels, Counter>,
    pub marks: Family<SourceLabels, Counter>,
    /// Committed configuration writes on this replica (publications), by
    /// the scope they mark. With the build counts of
    /// `build_duration` this gives the writes-to-builds ratio of a burst.
    pub publications: Family<ScopeLabels, Counter>,
}

impl ConfigMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            push_sessions: Gauge::default(),
            builds_waiting: Gauge::default(),
            build_duration: Family::new_with_constructor(histogram as fn() -> Histogram),
            build_wait: histogram(),
            updates_sent: Family::default(),
            unchanged: Counter::default(),
            results: Family::default(),
            results_rejected: Family::default(),
            sessions_closed: Family::default(),
            peer_notifies: Family::default(),
            handovers: Counter::default(),
            notify_members: Family::default(),
            marks: Family::default(),
            publications: Family::default(),
        };
        registry.register(
            "openshell_server_config_push_sessions",
            "Supervisor sessions with pushed configuration on this replica",
            metrics.push_sessions.clone(),
        );
        registry.register(
            "openshell_server_config_builds_waiting",
            "Config builds waiting for a build permit",
            metrics.builds_waiting.clone(),
        );
        registry.register(
            "openshell_server_config_build_duration_seconds",
            "Config build time by part, trigger and outcome",
            metrics.build_duration.clone(),
        );
        registry.register(
            "openshell_server_config_build_wait_seconds",
            "Time config builds waited for a build permit",
            metrics.build_wait.clone(),
        );
        registry.register(
            "openshell_server_config_updates_sent",
            "ConfigUpdates sent to supervisors, by kind (initial, update)",
            metrics.updates_sent.clone(),
        );
        registry.register(
            "openshell_server_config_unchanged",
            "Config builds not sent because the supervisor has or will have them",
            metrics.unchanged.clone(),
        );
        registry.register(
            "openshell_server_config_results",
            "ConfigUpdateResults received, by outcome",
            metrics.results.clone(),
        );
        registry.register(
            "openshell_server_config_results_rejected",
            "ConfigUpdateResults the gateway refused, by reason",
            metrics.results_rejected.clone(),
        );
        registry.register(
            "openshell_server_config_sessions_closed",
            "Push sessions closed by config delivery, and sessions whose stream stopped draining, by reason",
            metrics.sessions_closed.clone(),
        );
        registry.register(
            "openshell_server_config_peer_notifies",
            "PeerNotifyConfigUpdate calls sent, by scope and outcome",
            metrics.peer_notifies.clone(),
        );
        registry.register(
            "openshell_server_config_handovers",
            "Push sessions that ended with undelivered changes and passed them to the sandbox's current session",
            metrics.handovers.clone(),
        );
        registry.register(
            "openshell_server_config_notify_members",
            "Member lists read for provider and global notifications, by source (store, ring)",
            metrics.notify_members.clone(),
        );
        registry.register(
            "openshell_server_config_marks",
            "Push sessions marked dirty, by source (local, peer, reconcile, join)",
            metrics.marks.clone(),
        );
        registry.register(
            "openshell_server_config_publications",
            "Committed configuration writes on this replica, by scope (sandbox, provider, all)",
            metrics.publications.clone(),
        );
        // Fixed series start at zero.
        for kind in ["initial", "update"] {
            let _ = metrics.updates_sent.get_or_create(&KindLabels { kind });
        }
        for outcome in ["applied", "ignored_duplicate", "rejected"] {
            let _ = metrics.results.get_or_create(&OutcomeLabels { outcome });
        }
        for source in ["local", "peer", "reconcile", "join"] {
            let _ = metrics.marks.get_or_create(&SourceLabels { source });
        }
        for scope in ["sandbox", "provider", "all"] {
            let _ = metrics.publications.get_or_create(&ScopeLabels { scope });
        }
        metrics
    }

    pub(crate) fn build(
        &self,
        part: &'static str,
        trigger: &'static str,
        ok: bool,
        took: Duration,
    ) {
        self.build_duration
            .get_or_create(&BuildLabels {
                part,
                trigger,
                outcome: if ok { "ok" } else { "error" },
            })
            .observe(took.as_secs_f64());
    }

    pub(crate) fn closed(&self, reason: &'static str) {
        self.sessions_closed
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub(crate) fn notified(&self, scope: &'static str, outcome: &'static str) {
        self.peer_notifies
            .get_or_create(&NotifyLabels { scope, outcome })
            .inc();
    }

    pub(crate) fn notify_members(&self, source: &'static str) {
        self.notify_members
            .get_or_create(&SourceLabels { source })
            .inc();
    }

    pub(crate) fn mark(&self, source: &'static str) {
        self.marks.get_or_create(&SourceLabels { source }).inc();
    }
}
