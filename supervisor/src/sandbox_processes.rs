//! Every process the sandbox starts stays under the supervisor.
//!
//! The supervisor makes itself a child subreaper (Linux), so a process whose
//! parent exits (a daemon, `cmd &` in a finished exec) is re-parented to the
//! supervisor instead of to init. That lets shutdown find and kill the whole
//! sandbox by walking `/proc` for our children until none are left, and it
//! obliges us to reap such adopted orphans: exec children that tokio waits
//! on are tracked here and left alone, everything else is reaped by pid.

use std::collections::HashSet;
use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// Direct children that tokio waits on. Held while spawning, so the reaper
/// never sees such a child before it is recorded.
static TRACKED: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

/// Becomes the child subreaper of this process tree.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes plain integers.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Spawns a child that tokio will wait on.
pub fn spawn_tracked(command: &mut Command) -> io::Result<Child> {
    let mut tracked = TRACKED.lock().unwrap();
    let child = command.spawn()?;
    if let Some(pid) = child.id() {
        tracked.get_or_insert_with(HashSet::new).insert(pid as i32);
    }
    Ok(child)
}

/// Records a child spawned elsewhere that its owner waits on.
pub fn track(pid: i32) {
    TRACKED
        .lock()
        .unwrap()
        .get_or_insert_with(HashSet::new)
        .insert(pid);
}

/// The child was waited for; its pid may be reused from now on.
pub fn untrack(pid: i32) {
    if let Some(set) = TRACKED.lock().unwrap().as_mut() {
        set.remove(&pid);
    }
}

/// Our children as (pid, is_zombie).
fn children() -> Vec<(i32, bool)> {
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (_, rest) = stat.rsplit_once(')')?;
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid: i32 = fields.next()?.parse().ok()?;
            (ppid == me).then_some((pid, state == "Z"))
        })
        .collect()
}

/// Reaps adopted orphans that have exited (not tokio's children).
pub fn reap_orphans() {
    let tracked = TRACKED.lock().unwrap();
    for (pid, zombie) in children() {
        let is_tracked = tracked.as_ref().is_some_and(|s| s.contains(&pid));
        if zombie && !is_tracked {
            // SAFETY: waitpid on a specific pid with WNOHANG.
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
    }
}

/// Least time between two reaping passes.
const REAP_EVERY: Duration = Duration::from_secs(2);

/// Reaps adopted orphans after a child ended: at most one pass per
/// [`REAP_EVERY`], none while no child ends. A pass reads every process's
/// `stat` (the kernel lists no children here), so an idle supervisor or
/// host, whose runtime may have one thread, never pays for it. `SIGCHLD`s
/// that arrive during a pass or the pause are coalesced into the next
/// pass, so no zombie is missed.
pub async fn reap_loop() {
    let mut ended = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()) {
        Ok(ended) => Some(ended),
        Err(err) => {
            tracing::warn!(error = %err, "no SIGCHLD handler; reaping orphans every 2 s");
            None
        }
    };
    loop {
        if let Some(ended) = ended.as_mut() {
            ended.recv().await;
        }
        reap_orphans();
        tokio::time::sleep(REAP_EVERY).await;
    }
}

/// Kills every process left under the supervisor (and their groups), until
/// none is left or `limit` passes.
pub async fn kill_all(limit: Duration) {
    kill_children(limit, |_| true).await;
}

/// Kills what one sandbox left under the supervisor without isolation
/// (host mode, `--isolation none`): the children started with the
/// sandbox's `OPENSHELL_SANDBOX_ID` in their environment (every exec gets
/// it) and their groups. Best effort: a process that replaced its
/// environment or left its group escapes until [`kill_all`].
pub async fn kill_sandbox(sandbox_id: &str, limit: Duration) {
    let mut marker = format!("OPENSHELL_SANDBOX_ID={sandbox_id}").into_bytes();
    marker.push(0);
    kill_children(limit, |pid| started_with(pid, &marker)).await;
}

/// Whether the initial environment of `pid` holds `entry` (NUL-ended).
fn started_with(pid: i32, entry: &[u8]) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    environ
        .split_inclusive(|byte| *byte == 0)
        .any(|item| item == entry)
}

async fn kill_children(limit: Duration, selected: impl Fn(i32) -> bool) {
    let started = Instant::now();
    loop {
        reap_orphans();
        let live: Vec<i32> = children()
            .into_iter()
            .filter(|(pid, zombie)| !zombie && selected(*pid))
            .map(|(pid, _)| pid)
            .collect();
        if live.is_empty() || started.elapsed() > limit {
            return;
        }
        for pid in live {
            // SAFETY: kill(2) has no memory-safety preconditions. The pid is
            // our own child, so it cannot have been reused by a stranger.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
