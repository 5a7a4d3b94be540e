//! No orphan supervisors, against the real gateway and supervisors:
//!
//! - creates cancelled at seeded random points, then list and delete
//!   everything: no supervisor of that gateway is left, nor any record;
//! - deletes cancelled mid-call still finish: the sandbox is gone and its
//!   supervisor stopped;
//! - a delete whose record lost its pid (or holds a stale one) stops the
//!   supervisor `supervisor.pid` names;
//! - a supervisor whose sandbox the gateway does not know (never did, or the
//!   record was deleted while the supervisor was away) exits on its own,
//!   non-zero, after its give-up period.
//!
//! Supervisors are found on the host's /proc by command line: the
//! `openshell-supervisor` processes whose `--workdir` lies in the gateway's
//! data directory (the supervisor and its sandbox init both carry it).
//! `ORPHANS_SEED` replays a run of the random tests; every failure message
//! names the seed.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use openshell_proto::*;
use openshell_testkit::{Gateway, GatewayOptions, is_running, signal};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Longest a cleanup or an exit is waited for.
const SETTLE: Duration = Duration::from_secs(20);

/// An `openshell-supervisor` process (supervisor or sandbox init) found on
/// the host.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SupervisorProcess {
    pid: i32,
    /// `--sandbox-id` (the init has none).
    sandbox_id: Option<String>,
    workdir: PathBuf,
}

fn arg_after(args: &[String], flag: &str) -> Option<String> {
    args.windows(2).find(|w| w[0] == flag).map(|w| w[1].clone())
}

/// Running `openshell-supervisor` processes whose `--workdir` lies under
/// `data_dir`.
fn supervisors_under(data_dir: &Path) -> Vec<SupervisorProcess> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let program = Path::new(args.first()?).file_name()?.to_str()?.to_owned();
            if program != "openshell-supervisor" {
                return None;
            }
            let workdir = PathBuf::from(arg_after(&args, "--workdir")?);
            (workdir.starts_with(data_dir) && is_running(pid)).then(|| SupervisorProcess {
                pid,
                sandbox_id: arg_after(&args, "--sandbox-id"),
                workdir,
            })
        })
        .collect()
}

/// Running supervisors of `sandbox_id` under `data_dir`.
fn supervisors_of(data_dir: &Path, sandbox_id: &str) -> Vec<i32> {
    supervisors_under(data_dir)
        .into_iter()
        .filter(|p| p.sandbox_id.as_deref() == Some(sandbox_id))
        .map(|p| p.pid)
        .collect()
}

/// Kills, by pid, whatever supervisor is still running under a data
/// directory when a test ends (passed or not), so no test leaks one.
struct Sweep(PathBuf);

impl Drop for Sweep {
    fn drop(&mut self) {
        for process in supervisors_under(&self.0) {
            signal(process.pid, libc::SIGKILL);
        }
    }
}

/// A supervisor a test started itself, killed by pid when dropped.
struct OwnSupervisor {
    child: Child,
    log: PathBuf,
}

impl OwnSupervisor {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits (bounded) for the process to exit on its own.
    async fn exit_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child.try_wait().unwrap()
    }
}

impl Drop for OwnSupervisor {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id() as i32, libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

/// Starts `openshell-supervisor` for `sandbox_id` with `token` (through a
/// `--token-file` it deletes), giving up after `give_up`.
fn start_supervisor(
    gw: &Gateway,
    dir: &Path,
    sandbox_id: &str,
    token: &str,
    give_up: Duration,
) -> OwnSupervisor {
    let workdir = dir.join("work");
    std::fs::create_dir_all(&workdir).unwrap();
    let token_file = dir.join("token-for-supervisor");
    std::fs::write(&token_file, token).unwrap();
    let log = dir.join("own-supervisor.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(openshell_testkit::bin("openshell-supervisor"))
        .arg("--gateway")
        .arg(&gw.url)
        .arg("--sandbox-id")
        .arg(sandbox_id)
        .arg("--workdir")
        .arg(&workdir)
        .arg("--token-file")
        .arg(&token_file)
        .arg("--give-up-after-ms")
        .arg(give_up.as_millis().to_string())
        .env_clear()
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start openshell-supervisor");
    OwnSupervisor { child, log }
}

fn seed() -> u64 {
    match std::env::var("ORPHANS_SEED") {
        Ok(seed) => seed.parse().expect("ORPHANS_SEED is a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

async fn open_store(gw: &Gateway) -> sqlx::SqlitePool {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
    let options = SqliteConnectOptions::new()
        .filename(gw.store_dir().join("store").join("gateway.db"))
        .busy_timeout(Duration::from_secs(10));
    SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("open the gateway's store")
}

async fn stored_rows(gw: &Gateway) -> i64 {
    let pool = open_store(gw).await;
    let count = sqlx::query_scalar("SELECT count(*) FROM sandboxes")
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    count
}

async fn set_stored_pid(gw: &Gateway, sandbox_id: &str, pid: i64) {
    let pool = open_store(gw).await;
    let updated = sqlx::query("UPDATE sandboxes SET supervisor_pid = $1 WHERE id = $2")
        .bind(pid)
        .bind(sandbox_id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(updated.rows_affected(), 1);
    pool.close().await;
}

async fn names(client: &mut Client) -> Vec<(String, String)> {
    client
        .list_sandboxes(ListSandboxesRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("list sandboxes")
        .into_inner()
        .sandboxes
        .into_iter()
        .map(|s| {
            let meta = s.metadata.unwrap();
            (meta.name, meta.id)
        })
        .collect()
}

async fn delete(client: &mut Client, name: &str) -> Result<(), tonic::Status> {
    client
        .delete_sandbox(DeleteSandboxRequest {
            name: name.to_owned(),
            allow_missing: true,
            ..Default::default()
        })
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_creates_leave_no_supervisor_behind() {
    const CREATES: usize = 20;
    let seed = seed();
    eprintln!("ORPHANS_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let gw = start();
    let data = gw.store_dir();
    let _sweep = Sweep(data.clone());
    let mut client = client(&gw).await;
    // Cancel points spread over twice what one whole create takes here.
    let timed = Instant::now();
    client
        .create_sandbox(CreateSandboxRequest {
            name: "timed".into(),
            ..Default::default()
        })
        .await
        .expect("create");
    let max_cancel_ms = (2 * timed.elapsed().as_millis() as u64).max(5);
    eprintln!("cancelling after 0..{max_cancel_ms} ms");

    let mut cancelled = 0;
    for n in 0..CREATES {
        let after = Duration::from_millis(rng.random_range(0..max_cancel_ms));
        let call = client.create_sandbox(CreateSandboxRequest {
            name: format!("cancelled-{n}"),
            ..Default::default()
        });
        match tokio::time::timeout(after, call).await {
            Err(_) => cancelled += 1,
            Ok(result) => {
                result.unwrap_or_else(|err| panic!("seed {seed}: create {n}: {err}"));
            }
        }
    }
    eprintln!("{cancelled} of {CREATES} creates cancelled");

    // List and delete until nothing is listed (a cancelled create may still
    // be recording its sandbox when the first list runs). Bounded well
    // below the supervisors' 30 s give-up, so no orphan can leave on its own
    // before it is seen.
    let mut ids = Vec::new();
    let started = Instant::now();
    for _ in 0..20 {
        let listed = names(&mut client).await;
        for (name, id) in &listed {
            ids.push(id.clone());
            delete(&mut client, name)
                .await
                .unwrap_or_else(|err| panic!("seed {seed}: delete {name}: {err}"));
        }
        if listed.is_empty() && supervisors_under(&data).is_empty() {
            break;
        }
        assert!(
            started.elapsed() < SETTLE,
            "seed {seed}: sandboxes or supervisors still there after {SETTLE:?}: {:?}\n{}",
            supervisors_under(&data),
            gw.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ids.sort();
    ids.dedup();
    eprintln!("{} sandboxes were recorded and deleted", ids.len());

    let left = supervisors_under(&data);
    assert!(
        left.is_empty(),
        "seed {seed}: supervisors left: {left:?}\n{}",
        gw.log()
    );
    for id in &ids {
        assert!(supervisors_of(&data, id).is_empty(), "seed {seed}: {id}");
    }
    assert!(names(&mut client).await.is_empty(), "seed {seed}");
    assert_eq!(stored_rows(&gw).await, 0, "seed {seed}: records left");
    let dirs: Vec<_> = std::fs::read_dir(data.join("sandboxes"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(dirs.is_empty(), "seed {seed}: directories left: {dirs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_deletes_still_stop_the_supervisor() {
    const SANDBOXES: usize = 6;
    const MAX_CANCEL_MS: u64 = 40;
    let seed = seed();
    eprintln!("ORPHANS_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let gw = start();
    let data = gw.store_dir();
    let _sweep = Sweep(data.clone());
    let mut client = client(&gw).await;
    let mut sandboxes = Vec::new();
    for n in 0..SANDBOXES {
        let name = format!("doomed-{n}");
        let id = create_ready(&mut client, &name).await.metadata.unwrap().id;
        assert_eq!(supervisors_of(&data, &id).len(), 1, "{id}");
        sandboxes.push((name, id));
    }

    // Even ones: the call is dropped once the sandbox is seen DELETING, so
    // the handler is mid-way for sure. Odd ones: dropped after a random
    // 0..MAX_CANCEL_MS.
    let mut watcher = client.clone();
    let mut mid_call = 0;
    for (n, (name, _)) in sandboxes.iter().enumerate() {
        if n % 2 == 0 {
            let cancelled = tokio::time::timeout(
                SETTLE,
                delete_dropped_when_deleting(&mut client, &mut watcher, name),
            )
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: {name} never DELETING"));
            mid_call += usize::from(cancelled);
        } else {
            let after = Duration::from_millis(rng.random_range(0..MAX_CANCEL_MS));
            let _ = tokio::time::timeout(after, delete(&mut client, name)).await;
        }
    }
    eprintln!("{mid_call} deletes dropped while DELETING");
    assert!(mid_call > 0, "seed {seed}: no delete was cut mid-call");

    // A delete that started finishes; one dropped before it reached the
    // gateway leaves the sandbox as it was. Nothing is left half-way.
    let started = Instant::now();
    let settled = loop {
        let listed = names(&mut client).await;
        let mut settled = true;
        for (n, (name, id)) in sandboxes.iter().enumerate() {
            let present = listed.iter().any(|(_, listed)| listed == id);
            let running = supervisors_of(&data, id).len();
            let must_be_gone = n % 2 == 0;
            settled &= match (present, running) {
                (false, 0) => true,
                (true, 1) => {
                    !must_be_gone && phase_of(&mut client, name).await != SandboxPhase::Deleting
                }
                _ => false,
            };
        }
        if settled || started.elapsed() > SETTLE {
            break settled;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        settled,
        "seed {seed}: sandboxes {:?}, supervisors {:?}\n{}",
        names(&mut client).await,
        supervisors_under(&data),
        gw.log()
    );
    for (n, (_, id)) in sandboxes.iter().enumerate().filter(|(n, _)| n % 2 == 0) {
        assert!(
            !data.join("sandboxes").join(id).exists(),
            "seed {seed}: directory of sandbox {n} left"
        );
    }
}

/// Starts deleting `name` and drops the call as soon as the sandbox is
/// seen DELETING; true when it was (false: the delete finished first).
async fn delete_dropped_when_deleting(
    client: &mut Client,
    watcher: &mut Client,
    name: &str,
) -> bool {
    let mut stream = watcher
        .watch_sandbox(WatchSandboxRequest {
            sandbox: name.to_owned(),
            follow_status: true,
            ..Default::default()
        })
        .await
        .expect("watch")
        .into_inner();
    // The snapshot first: the watch follows changes from before the delete.
    stream.message().await.expect("snapshot").expect("snapshot");
    let deleting = async {
        while let Ok(Some(event)) = stream.message().await {
            if let Some(sandbox_stream_event::Payload::Sandbox(sandbox)) = event.payload
                && phase(&sandbox) == SandboxPhase::Deleting
            {
                return true;
            }
        }
        false
    };
    tokio::select! {
        biased;
        seen = deleting => seen,
        _ = delete(client, name) => false,
    }
}

async fn phase_of(client: &mut Client, name: &str) -> SandboxPhase {
    match client
        .get_sandbox(GetSandboxRequest {
            name: name.to_owned(),
            ..Default::default()
        })
        .await
    {
        Ok(response) => phase(&response.into_inner().sandbox.unwrap()),
        Err(_) => SandboxPhase::Unspecified,
    }
}

#[tokio::test]
async fn delete_without_a_stored_pid_uses_the_pid_file() {
    let gw = start();
    let data = gw.store_dir();
    let _sweep = Sweep(data.clone());
    let mut client = client(&gw).await;
    // One record lost its pid, one holds a pid that is no supervisor (this
    // test process).
    for (name, stored_pid) in [
        ("lost-pid", 0),
        ("stale-pid", i64::from(std::process::id())),
    ] {
        let id = create_ready(&mut client, name).await.metadata.unwrap().id;
        let pids = supervisors_of(&data, &id);
        assert_eq!(pids.len(), 1, "{name}: {pids:?}");
        let pid_file = data.join("sandboxes").join(&id).join("supervisor.pid");
        let named: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(named, pids[0], "{name}");
        set_stored_pid(&gw, &id, stored_pid).await;

        delete(&mut client, name).await.expect("delete");
        // The delete waited for the supervisor to go.
        assert!(!is_running(pids[0]), "{name}: supervisor still running");
        assert!(supervisors_of(&data, &id).is_empty(), "{name}");
        assert!(!pid_file.exists(), "{name}");
        assert!(
            gw.log()
                .contains("stopping the supervisor supervisor.pid names"),
            "{name}: {}",
            gw.log()
        );
    }
    assert!(supervisors_under(&data).is_empty());
    assert_eq!(stored_rows(&gw).await, 0);
}

#[tokio::test]
async fn a_supervisor_of_an_unknown_sandbox_gives_up() {
    const GIVE_UP: Duration = Duration::from_secs(2);
    let gw = start();
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweep(dir.path().to_owned());
    let started = Instant::now();
    let mut supervisor = start_supervisor(
        &gw,
        dir.path(),
        &uuid::Uuid::new_v4().to_string(),
        "a-token-this-gateway-never-issued",
        GIVE_UP,
    );
    let status = supervisor
        .exit_within(SETTLE)
        .await
        .unwrap_or_else(|| panic!("supervisor still running:\n{}", supervisor.log()));
    let took = started.elapsed();
    assert!(!status.success(), "{status}\n{}", supervisor.log());
    assert!(took >= GIVE_UP, "gave up after {took:?}");
    let log = supervisor.log();
    assert!(
        log.contains("giving up: the gateway has answered UNAUTHENTICATED or NOT_FOUND"),
        "{log}"
    );
}

#[tokio::test]
async fn a_supervisor_whose_sandbox_was_deleted_while_away_gives_up() {
    const GIVE_UP: Duration = Duration::from_secs(2);
    // No driver process: the test runs the supervisor itself, with a short
    // give-up period.
    let mut gw = Gateway::start(GatewayOptions {
        extra_args: ["--allow-test-flags", "--driver", "none"]
            .map(String::from)
            .to_vec(),
        ..GatewayOptions::with_token(TOKEN)
    });
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweep(dir.path().to_owned());
    let mut client = client(&gw).await;
    let id = client
        .create_sandbox(CreateSandboxRequest {
            name: "deleted-behind".into(),
            ..Default::default()
        })
        .await
        .expect("create")
        .into_inner()
        .sandbox
        .unwrap()
        .metadata
        .unwrap()
        .id;
    let token = openshell_testkit::sandbox_token(&gw.store_dir(), &id).expect("token file");
    let mut supervisor = start_supervisor(&gw, dir.path(), &id, &token, GIVE_UP);
    wait_phase(&mut client, "deleted-behind", SandboxPhase::Ready).await;
    drop(client);

    // While the gateway is down, the record goes.
    gw.stop();
    let pool = open_store(&gw).await;
    sqlx::query("DELETE FROM sandboxes WHERE id = $1")
        .bind(&id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    gw.restart();
    let back = Instant::now();

    let status = supervisor
        .exit_within(SETTLE)
        .await
        .unwrap_or_else(|| panic!("supervisor still running:\n{}", supervisor.log()));
    assert!(!status.success(), "{status}\n{}", supervisor.log());
    assert!(back.elapsed() >= GIVE_UP);
    let log = supervisor.log();
    assert!(log.contains("giving up"), "{log}");
    assert!(log.contains("supervisor stopped"), "{log}");
}
