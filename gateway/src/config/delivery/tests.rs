//! Unit tests of push delivery: the slots, permits and backoff, and the
//! failure paths of live sessions over a real SQLite store with the tokio
//! clock paused.

use super::permits::*;
use super::session::*;
use super::*;
use prometheus_client::registry::Registry;

fn built(revision: u64) -> Built {
    Built::new(
        GetSandboxConfigResponse {
            config_revision: revision,
            ..Default::default()
        },
        GetSandboxProviderEnvironmentResponse::default(),
    )
}

fn sent(offer: Offer) -> ConfigUpdate {
    match offer {
        Offer::Send(update) => *update,
        other => panic!("expected a send, got {other:?}"),
    }
}

fn revision(update: &ConfigUpdate) -> u64 {
    update.sandbox_config.as_ref().unwrap().config_revision
}

#[test]
fn one_in_flight_and_the_newest_pending_wins() {
    let mut slots = Slots::default();
    let first = sent(slots.offer(built(1), false));
    assert_eq!(first.update_id, 1);
    assert!(matches!(slots.offer(built(2), false), Offer::Pending));
    assert!(matches!(slots.offer(built(3), false), Offer::Pending));
    // 3 replaced 2: answering 1 sends 3 as update 2.
    let next = slots
        .answer(1, ConfigApplyOutcome::Applied)
        .unwrap()
        .unwrap();
    assert_eq!((next.update_id, revision(&next)), (2, 3));
    assert!(!slots.has_pending());
    assert_eq!(
        slots
            .answer(2, ConfigApplyOutcome::Applied)
            .unwrap()
            .map(|u| u.update_id),
        None
    );
    assert_eq!(slots.in_flight_id(), None);
}

#[test]
fn identical_updates_are_not_sent() {
    let mut slots = Slots::default();
    sent(slots.offer(built(1), false));
    // Identical to the one in flight.
    assert!(matches!(slots.offer(built(1), false), Offer::Unchanged));
    slots.answer(1, ConfigApplyOutcome::Applied).unwrap();
    // Identical to the applied one.
    assert!(matches!(slots.offer(built(1), false), Offer::Unchanged));
    // A change goes out with the next id.
    assert_eq!(sent(slots.offer(built(2), false)).update_id, 2);
    // A pending build equal to what was just applied is dropped.
    assert!(matches!(slots.offer(built(3), false), Offer::Pending));
    assert!(matches!(slots.offer(built(2), false), Offer::Pending));
    assert!(
        slots
            .answer(2, ConfigApplyOutcome::IgnoredDuplicate)
            .unwrap()
            .is_none()
    );
    assert!(matches!(slots.offer(built(2), false), Offer::Unchanged));
}

#[test]
fn rejected_updates_are_sent_again_by_reconcile_not_by_a_mark() {
    let mut slots = Slots::default();
    sent(slots.offer(built(1), false));
    slots.answer(1, ConfigApplyOutcome::Applied).unwrap();
    sent(slots.offer(built(2), false));
    assert!(
        slots
            .answer(2, ConfigApplyOutcome::Rejected)
            .unwrap()
            .is_none()
    );
    // A mark (another write, a repeated notification) that rebuilds the
    // same content does not resend what was just refused.
    assert!(matches!(slots.offer(built(2), false), Offer::Unchanged));
    // Reconcile rebuilds the same content: it goes out again.
    let resent = sent(slots.offer(built(2), true));
    assert_eq!((resent.update_id, revision(&resent)), (3, 2));
    // Back to the applied content is unchanged once answered.
    slots.answer(3, ConfigApplyOutcome::Rejected).unwrap();
    assert!(matches!(slots.offer(built(1), false), Offer::Unchanged));
    // New content clears the memory: the refused content, written again
    // later, is sent on a mark.
    sent(slots.offer(built(4), false));
    slots.answer(4, ConfigApplyOutcome::Applied).unwrap();
    assert_eq!(revision(&sent(slots.offer(built(2), false))), 2);
}

#[test]
fn a_rejection_followed_by_newer_content_forgets_the_refused_one() {
    let mut slots = Slots::default();
    sent(slots.offer(built(1), false));
    slots.answer(1, ConfigApplyOutcome::Applied).unwrap();
    sent(slots.offer(built(2), false));
    assert!(matches!(slots.offer(built(3), false), Offer::Pending));
    // 2 refused; 3 goes out from the pending slot.
    let next = slots.answer(2, ConfigApplyOutcome::Rejected).unwrap();
    assert_eq!(revision(&next.expect("the pending build")), 3);
    // Written back to 2 while 3 is in flight: 2 is what must end up there.
    assert!(matches!(slots.offer(built(2), false), Offer::Pending));
}

#[test]
fn answers_must_match_the_update_in_flight() {
    let mut slots = Slots::default();
    assert_eq!(
        slots.answer(1, ConfigApplyOutcome::Applied).unwrap_err(),
        ResultError::UnknownUpdate
    );
    sent(slots.offer(built(1), false));
    assert_eq!(
        slots.answer(2, ConfigApplyOutcome::Applied).unwrap_err(),
        ResultError::UnknownUpdate
    );
    assert_eq!(
        slots.answer(0, ConfigApplyOutcome::Applied).unwrap_err(),
        ResultError::UnknownUpdate
    );
    slots.answer(1, ConfigApplyOutcome::Applied).unwrap();
    // Answered once: a second answer is unknown.
    assert_eq!(
        slots.answer(1, ConfigApplyOutcome::Applied).unwrap_err(),
        ResultError::UnknownUpdate
    );
}

#[test]
fn build_backoff_steps_and_resets() {
    let mut backoff = BuildBackoff::default();
    let delays: Vec<u64> = (0..8).map(|_| backoff.next_delay().as_secs()).collect();
    assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
    backoff.reset();
    assert_eq!(backoff.next_delay(), Duration::from_secs(1));
}

#[test]
fn permit_pool_is_sized_from_the_store_pool() {
    assert_eq!(Permits::sized_for_pool(10).size(), 20);
    assert_eq!(Permits::sized_for_pool(5).size(), 10);
    assert_eq!(Permits::sized_for_pool(1).size(), 4);
    assert_eq!(Permits::sized_for_pool(0).size(), 4);
}

#[tokio::test]
async fn permits_are_granted_in_fifo_order() {
    let mut registry = Registry::default();
    let metrics = Arc::new(ConfigMetrics::register(&mut registry));
    let permits = Arc::new(Permits::new(1));
    let held = permits.acquire(&metrics).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (permits, task_metrics, order) = (permits.clone(), metrics.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire(&task_metrics).await;
            order.lock().unwrap().push(i);
            tokio::task::yield_now().await;
        }));
        // Each waiter is queued before the next one asks.
        while metrics.builds_waiting.get() != i + 1 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(metrics.builds_waiting.get(), 5);
    drop(held);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
    assert_eq!(metrics.builds_waiting.get(), 0);
}

#[tokio::test]
async fn marks_merge_into_one() {
    let notify = Notify::new();
    for _ in 0..5 {
        notify.notify_one();
    }
    // One stored permit: the first wait returns, the second does not.
    notify.notified().await;
    let second = tokio::time::timeout(Duration::from_millis(50), notify.notified()).await;
    assert!(second.is_err());
}

// ------------------------------------------------ failure paths of sessions
//
// A real SQLite store in a temp dir, real `Sessions`, and the tokio clock
// paused once store I/O is done: a paused clock jumps to the next timer
// whenever the runtime idles, which would also fire store deadlines while
// SQLite's worker thread answers. Builds that must fail while the clock is
// paused stall inside their real deadline (`BuildStalls`) and touch no store.

use crate::config::model::BuildStalls;
use crate::sessions::ConfigSink;
use crate::store::Store;
use futures::StreamExt;
use openshell_proto::datamodel::ObjectMeta;
use openshell_proto::sandbox::{SettingValue, setting_value};
use openshell_proto::{Sandbox, UpdateConfigRequest};
use std::sync::atomic::Ordering;

struct Fixture {
    _dir: tempfile::TempDir,
    delivery: Arc<ConfigDelivery>,
    sessions: Arc<Sessions>,
    metrics: Arc<crate::metrics::Metrics>,
}

/// A live push session as the session layer would hold it.
struct Live {
    session: Arc<PushSession>,
    bootstrap: ConfigUpdate,
    rx: crate::sessions::GatewayStream,
    closed: CancellationToken,
}

fn sandbox_id(name: &str) -> String {
    format!("sb-{name}")
}

async fn fixture(reconcile: Duration, names: &[&str]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("store.db").display());
    let store = Store::open(&url, Default::default()).await.unwrap();
    for name in names {
        let sandbox = Sandbox {
            metadata: Some(ObjectMeta {
                id: sandbox_id(name),
                name: (*name).to_owned(),
                resource_version: 1,
                workspace: "default".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        store
            .insert(&sandbox, &format!("token-hash-{name}"), "test-host", None)
            .await
            .unwrap();
    }
    let metrics = crate::metrics::Metrics::new();
    let sessions = Sessions::new(
        metrics.clone(),
        Duration::from_secs(15),
        crate::sessions::DRAIN_TIMEOUT,
    );
    let delivery = ConfigDelivery::new(
        DeliveryConfig {
            mode: DeliveryMode::Push,
            reconcile_interval: reconcile,
            owner_cache_ttl: OWNER_CACHE_TTL,
            pool_size: crate::store::POOL_SIZE,
            build_delay: Duration::ZERO,
        },
        ConfigModel::new(store),
        sessions.clone(),
        None,
        metrics.clone(),
    );
    Fixture {
        _dir: dir,
        delivery,
        sessions,
        metrics,
    }
}

/// No reconcile within any test's horizon.
const NO_RECONCILE: Duration = Duration::from_secs(24 * 3600);

impl Fixture {
    fn stalls(&self) -> &BuildStalls {
        &self.delivery.model.stalls
    }

    /// Bootstraps a push session and registers it (its task not started).
    async fn connect(&self, name: &str, session_id: &str) -> Live {
        let (bootstrap, session) = self
            .delivery
            .bootstrap(&sandbox_id(name), session_id)
            .await
            .expect("bootstrap");
        let (tx, rx, closed) = self
            .sessions
            .register_for_test(&sandbox_id(name), session_id);
        session.started(tx, closed.clone());
        Live {
            session,
            bootstrap,
            rx,
            closed,
        }
    }

    /// A value of the replica's metrics text (0 when absent).
    fn sample(&self, sample: &str) -> f64 {
        let text = self.metrics.render();
        text.lines()
            .find_map(|line| {
                let (name, value) = line.rsplit_once(' ')?;
                (name == sample).then(|| value.parse().unwrap())
            })
            .unwrap_or(0.0)
    }

    fn builds(&self, part: &str, trigger: &str, outcome: &str) -> f64 {
        self.sample(&format!(
            r#"openshell_server_config_build_duration_seconds_count{{part="{part}",trigger="{trigger}",outcome="{outcome}"}}"#
        ))
    }

    fn closed(&self, reason: &str) -> f64 {
        self.sample(&format!(
            r#"openshell_server_config_sessions_closed_total{{reason="{reason}"}}"#
        ))
    }
}

fn answer(live: &Live, update_id: u64) {
    live.session.result(ConfigUpdateResult {
        update_id,
        outcome: ConfigApplyOutcome::Applied as i32,
        ..Default::default()
    });
}

/// Lets woken tasks run (the paused clock does not move).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

/// Waits, moving the paused clock 100 ms a step, until `check` holds; at
/// most `limit` of paused time.
async fn paused_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        settle().await;
    }
    check()
}

fn setting_write(name: &str, key: &str, value: &str) -> UpdateConfigRequest {
    UpdateConfigRequest {
        sandbox: name.to_owned(),
        setting_key: key.to_owned(),
        setting_value: Some(SettingValue {
            value: Some(setting_value::Value::StringValue(value.to_owned())),
        }),
        ..Default::default()
    }
}

fn config_update(message: Result<GatewayMessage, Status>) -> ConfigUpdate {
    match message.expect("no error on the session").payload {
        Some(gateway_message::Payload::ConfigUpdate(update)) => update,
        other => panic!("expected a ConfigUpdate, got {other:?}"),
    }
}

#[tokio::test]
async fn an_unanswered_bootstrap_closes_the_session_after_2_minutes() {
    let f = fixture(NO_RECONCILE, &["silent", "answers"]).await;
    let silent = f.connect("silent", "s-1").await;
    let answers = f.connect("answers", "s-2").await;
    answer(&answers, answers.bootstrap.update_id);
    tokio::time::pause();
    f.delivery.start(&silent.session);
    f.delivery.start(&answers.session);
    settle().await;

    tokio::time::advance(BOOTSTRAP_ANSWER_TIMEOUT - Duration::from_millis(1)).await;
    settle().await;
    assert!(!silent.closed.is_cancelled(), "closed before 2 minutes");
    // Timers fire on whole milliseconds.
    tokio::time::advance(Duration::from_millis(2)).await;
    settle().await;
    assert!(silent.closed.is_cancelled(), "still open at 2 minutes");
    assert_eq!(f.closed("bootstrap_timeout"), 1.0);

    // A session that answered its bootstrap has no such deadline.
    tokio::time::advance(Duration::from_secs(600)).await;
    settle().await;
    assert!(!answers.closed.is_cancelled());
    assert_eq!(f.closed("bootstrap_timeout"), 1.0);
}

#[tokio::test]
async fn the_bootstrap_build_gives_up_after_45_s_including_the_permit_wait() {
    let f = fixture(NO_RECONCILE, &["queued"]).await;
    let cm = &f.metrics.config;
    let mut held = Vec::new();
    for _ in 0..f.delivery.permits.size() {
        held.push(f.delivery.permits.acquire(cm).await);
    }
    tokio::time::pause();
    let started = tokio::time::Instant::now();
    let Err(err) = f.delivery.bootstrap(&sandbox_id("queued"), "s-1").await else {
        panic!("bootstrapped without a permit");
    };
    let waited = started.elapsed();
    assert!(
        waited >= BOOTSTRAP_BUILD_TIMEOUT
            && waited < BOOTSTRAP_BUILD_TIMEOUT + Duration::from_millis(10),
        "gave up after {waited:?}"
    );
    assert_eq!(BOOTSTRAP_BUILD_TIMEOUT, Duration::from_secs(45));
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(
        err.message(),
        "configuration bootstrap timed out; reconnect later"
    );
    // Unregistered: nothing counted, nothing left to mark.
    assert_eq!(f.sample("openshell_server_config_push_sessions"), 0.0);
    assert!(f.delivery.push.lock().unwrap().is_empty());

    // With permits free the same bootstrap succeeds.
    drop(held);
    tokio::time::resume();
    let live = f.connect("queued", "s-2").await;
    assert_eq!(live.bootstrap.update_id, 1);
}

#[tokio::test]
async fn a_stalled_provider_environment_fails_the_build_after_20_s() {
    let f = fixture(NO_RECONCILE, &["env"]).await;
    f.stalls().environment.store(true, Ordering::SeqCst);
    let delivery = f.delivery.clone();
    let bootstrap =
        tokio::spawn(async move { delivery.bootstrap(&sandbox_id("env"), "s-1").await });
    // The sandbox configuration is built (real store I/O); the environment
    // now waits.
    tokio::time::timeout(Duration::from_secs(10), f.stalls().stalled.notified())
        .await
        .expect("the environment build never started");
    tokio::time::pause();
    let started = tokio::time::Instant::now();
    let err = match bootstrap.await.unwrap() {
        Ok(_) => panic!("a stalled environment still bootstrapped"),
        Err(err) => err,
    };
    let waited = started.elapsed();
    assert!(
        waited >= crate::config::model::ENV_BUILD_TIMEOUT
            && waited < crate::config::model::ENV_BUILD_TIMEOUT + Duration::from_millis(10),
        "gave up after {waited:?}"
    );
    assert_eq!(
        crate::config::model::ENV_BUILD_TIMEOUT,
        Duration::from_secs(20)
    );
    // Inside the 45 s bootstrap deadline: a failed build, not a timeout.
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert_eq!(
        err.message(),
        "configuration bootstrap failed; reconnect later"
    );
    assert_eq!(f.builds("provider_environment", "bootstrap", "error"), 1.0);
    assert_eq!(f.builds("sandbox_config", "bootstrap", "ok"), 0.0);
    assert!(f.delivery.push.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_result_for_no_update_in_flight_closes_the_session() {
    let f = fixture(NO_RECONCILE, &["twice", "unknown"]).await;
    let twice = f.connect("twice", "s-1").await;
    let unknown = f.connect("unknown", "s-2").await;
    f.delivery.start(&twice.session);
    f.delivery.start(&unknown.session);

    // The bootstrap answered once is fine; answered again, it is unknown.
    answer(&twice, 1);
    assert!(!twice.closed.is_cancelled());
    answer(&twice, 1);
    assert!(twice.closed.is_cancelled());
    // An id never sent.
    answer(&unknown, 7);
    assert!(unknown.closed.is_cancelled());

    assert_eq!(f.closed("unknown_update"), 2.0);
    assert_eq!(
        f.sample(r#"openshell_server_config_results_rejected_total{reason="unknown_update"}"#),
        2.0
    );
    assert_eq!(
        f.sample(r#"openshell_server_config_results_total{outcome="applied"}"#),
        1.0
    );
    // The delivery tasks end with their sessions.
    assert!(twice.session.stop.is_cancelled());
    assert!(unknown.session.stop.is_cancelled());
}

#[tokio::test]
async fn a_write_cuts_a_build_backoff_short() {
    let f = fixture(NO_RECONCILE, &["flaky"]).await;
    let mut live = f.connect("flaky", "s-1").await;
    answer(&live, 1);
    f.delivery.start(&live.session);
    // The store stops answering: builds time out (5 s) and back off 1, 2,
    // 4, 8 s; the next retry is 16 s away.
    f.stalls().config.store(true, Ordering::SeqCst);
    tokio::time::pause();
    let started = tokio::time::Instant::now();
    f.delivery.publish(Scope::Sandbox(sandbox_id("flaky")));
    let failed = || {
        f.builds("sandbox_config", "mark", "error") + f.builds("sandbox_config", "retry", "error")
    };
    assert!(
        paused_until(Duration::from_secs(120), || failed() >= 5.0).await,
        "{} failed builds",
        failed()
    );
    let took = started.elapsed().as_secs_f64();
    // 5 + 1 + 5 + 2 + 5 + 4 + 5 + 8 + 5 s.
    assert!((40.0..40.2).contains(&took), "five failures took {took} s");
    assert_eq!(f.builds("sandbox_config", "mark", "error"), 1.0);
    assert!(
        !live.closed.is_cancelled(),
        "a failed build closed the session"
    );

    // The store answers again and a write commits: its mark builds now,
    // not 16 s later.
    f.stalls().config.store(false, Ordering::SeqCst);
    tokio::time::resume();
    let (_, scope) = f
        .delivery
        .model
        .update_config(setting_write("flaky", "after", "recovered"))
        .await
        .unwrap();
    let written = std::time::Instant::now();
    f.delivery
        .publish(scope.expect("a write marks its sandbox"));
    let update = tokio::time::timeout(Duration::from_secs(5), live.rx.next())
        .await
        .expect("the write waited for the backoff")
        .expect("session open");
    let update = config_update(update);
    let took = written.elapsed();
    assert_eq!(update.update_id, 2);
    let settings = &update.sandbox_config.unwrap().settings;
    assert!(settings.contains_key("after"), "{settings:?}");
    assert_eq!(f.builds("sandbox_config", "mark", "ok"), 1.0);
    assert_eq!(f.builds("sandbox_config", "retry", "ok"), 0.0);
    eprintln!(
        "FIGURE write after 5 failed builds->update queued: {:.1} ms (next retry was 16 s away)",
        took.as_secs_f64() * 1000.0
    );
}

#[tokio::test]
async fn the_first_reconcile_lands_30_to_60_s_after_registration() {
    const SESSIONS: usize = 20;
    let names: Vec<String> = (0..SESSIONS).map(|i| format!("r{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let f = fixture(RECONCILE_INTERVAL, &refs).await;
    let mut lives = Vec::new();
    for (i, name) in refs.iter().enumerate() {
        let live = f.connect(name, &format!("s-{i}")).await;
        answer(&live, 1);
        lives.push(live);
    }
    // Reconcile builds stall (no store I/O on a paused clock).
    f.stalls().config.store(true, Ordering::SeqCst);
    tokio::time::pause();
    for live in &lives {
        f.delivery.start(&live.session);
    }
    settle().await;
    let reconciles = || f.sample(r#"openshell_server_config_marks_total{source="reconcile"}"#);
    tokio::time::advance(RECONCILE_INTERVAL - Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(reconciles(), 0.0, "a reconcile before 30 s");
    // Then second by second until just before 60 s: all first passes, no
    // second one (that is 30 s after the first, at 60 s or later).
    let mut per_second = Vec::new();
    let mut last = 0.0;
    for _ in 0..30 {
        tokio::time::advance(Duration::from_secs(1)).await;
        settle().await;
        let now = reconciles();
        per_second.push(now - last);
        last = now;
    }
    // Now 59.999 s in; the last possible first pass is due before 60 s.
    tokio::time::advance(Duration::from_micros(999)).await;
    settle().await;
    assert_eq!(reconciles(), SESSIONS as f64, "per second: {per_second:?}");
    let seconds_used = per_second.iter().filter(|n| **n > 0.0).count();
    assert!(
        seconds_used >= 3,
        "first reconciles bunch up: {per_second:?}"
    );
}
