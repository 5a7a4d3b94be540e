//! Resource limits of a sandbox: memory, CPU and process count, through a
//! control group of its own.
//!
//! Every process the sandbox runs (its init, under `--isolation
//! namespaces`, and every exec, SSH channel and SFTP server) starts in the
//! sandbox's group, so the kernel counts them together: a memory hog is
//! killed by the group's OOM killer, a fork bomb hits the group's process
//! cap, a busy loop gets the group's CPU quota, and nothing outside the
//! group notices. A process joins between fork and exec (it writes `0` to
//! each hierarchy's `cgroup.procs`), so it never runs a single instruction
//! of the program outside the group; its descendants inherit the group and
//! cannot leave it (the group's files belong to the host's root).
//!
//! Groups live under `openshell/<sandbox id>` at the root of each hierarchy
//! that holds a controller: cgroup v2 where its unified hierarchy has the
//! controller (the supervisor enables it in the subtrees on the way), v1
//! otherwise. A sandbox without limits gets no group at all.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The directory under each hierarchy's root that holds sandbox groups.
const BASE: &str = "openshell";
/// The CFS period a CPU limit is a quota of.
const CPU_PERIOD_US: u64 = 100_000;

/// First argument that prints the controllers this host can limit with,
/// space-separated (the gateway asks before it starts).
pub const CHECK_COMMAND: &str = "__limits-check";

/// The limits as command-line flags (the gateway passes the sandbox's
/// effective limits; the supervisor fails to start when one cannot be set).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct LimitArgs {
    /// Memory the sandbox's processes may use together, in bytes.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    pub memory_limit: Option<u64>,
    /// CPU the sandbox's processes may use together, in thousandths of a
    /// core.
    #[arg(long, value_name = "MILLICPU", value_parser = clap::value_parser!(u64).range(1..))]
    pub cpu_limit: Option<u64>,
    /// Processes (and threads) the sandbox may run at once.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub pids_limit: Option<u64>,
}

impl LimitArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            memory: self.memory_limit,
            cpu_millis: self.cpu_limit,
            pids: self.pids_limit,
        }
    }
}

/// What one sandbox may use; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory in bytes (swap included where the host has swap accounting).
    pub memory: Option<u64>,
    /// CPU in thousandths of a core (`500`: half a core).
    pub cpu_millis: Option<u64>,
    /// Processes (and threads) at once.
    pub pids: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// These limits without those this host cannot enforce, and the
    /// controllers that are missing (a shared host runs its sandboxes with
    /// what it can enforce and says what it dropped).
    pub fn enforceable(&self) -> (Limits, Vec<Controller>) {
        let available = available();
        let mut limits = *self;
        let mut missing = Vec::new();
        for controller in self.controllers() {
            if !available.contains(&controller) {
                missing.push(controller);
                match controller {
                    Controller::Memory => limits.memory = None,
                    Controller::Cpu => limits.cpu_millis = None,
                    Controller::Pids => limits.pids = None,
                }
            }
        }
        (limits, missing)
    }

    /// The controllers these limits need.
    fn controllers(&self) -> Vec<Controller> {
        [
            (self.memory.is_some(), Controller::Memory),
            (self.cpu_millis.is_some(), Controller::Cpu),
            (self.pids.is_some(), Controller::Pids),
        ]
        .into_iter()
        .filter_map(|(wanted, controller)| wanted.then_some(controller))
        .collect()
    }
}

/// A cgroup controller the limits use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Memory,
    Cpu,
    Pids,
}

impl Controller {
    pub const ALL: [Controller; 3] = [Controller::Memory, Controller::Cpu, Controller::Pids];

    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
            Controller::Pids => "pids",
        }
    }
}

/// Where a controller is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hierarchy {
    root: PathBuf,
    v2: bool,
}

/// The hierarchy that holds `controller` on this host, if any: a v1
/// mount of that controller, or the unified (v2) mount when it lists the
/// controller as available.
fn hierarchy(controller: Controller) -> Option<Hierarchy> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut unified = None;
    for line in mounts.lines() {
        // `id parent major:minor root mountpoint options ... - fstype source superoptions`
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mountpoint) = left.split(' ').nth(4) else {
            continue;
        };
        let mut right = right.split(' ');
        let (fstype, superoptions) = (right.next(), right.nth(1).unwrap_or(""));
        let root = PathBuf::from(unescape(mountpoint));
        match fstype {
            Some("cgroup")
                if superoptions
                    .split(',')
                    .any(|option| option == controller.name()) =>
            {
                return Some(Hierarchy { root, v2: false });
            }
            Some("cgroup2") if unified.is_none() => unified = Some(root),
            _ => {}
        }
    }
    let root = unified?;
    let available = fs::read_to_string(root.join("cgroup.controllers")).ok()?;
    available
        .split_whitespace()
        .any(|name| name == controller.name())
        .then_some(Hierarchy { root, v2: true })
}

/// Mount points in mountinfo escape spaces and a few other bytes as `\NNN`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(value) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The controllers this host can limit with (the gateway asks before it
/// starts: `__limits-check`). A hierarchy the supervisor cannot write to
/// does not count.
pub fn available() -> Vec<Controller> {
    Controller::ALL
        .into_iter()
        .filter(|controller| {
            hierarchy(*controller).is_some_and(|h| {
                let procs = h.root.join("cgroup.procs");
                nix::unistd::access(&procs, nix::unistd::AccessFlags::W_OK).is_ok()
            })
        })
        .collect()
}

/// A sandbox's control group: one directory per hierarchy it uses, and
/// each one's `cgroup.procs` open for writing, so that a process can join
/// between fork and exec with one `write`.
#[derive(Debug)]
pub struct Cgroup {
    dirs: Vec<(PathBuf, bool)>,
    procs: Vec<OwnedFd>,
    /// The memory hierarchy's directory (OOM kill counter), if limited.
    memory: Option<(PathBuf, bool)>,
}

impl Cgroup {
    /// Creates the group of `sandbox_id` with `limits` (a leftover group of
    /// the same sandbox, from a supervisor that died, is taken over).
    /// `None` when there is nothing to limit. Fails, naming the controller,
    /// when a limit cannot be set.
    pub fn create(sandbox_id: &str, limits: &Limits) -> anyhow::Result<Option<Self>> {
        if limits.is_empty() {
            return Ok(None);
        }
        if sandbox_id.is_empty() || sandbox_id.contains(['/', '\0']) || sandbox_id.starts_with('.')
        {
            bail!("a sandbox id unfit for a cgroup name");
        }
        let mut group = Self {
            dirs: Vec::new(),
            procs: Vec::new(),
            memory: None,
        };
        for controller in limits.controllers() {
            let hierarchy = hierarchy(controller).with_context(|| {
                format!(
                    "no cgroup hierarchy has the {} controller",
                    controller.name()
                )
            })?;
            let dir = hierarchy.root.join(BASE).join(sandbox_id);
            if !group.dirs.iter().any(|(known, _)| *known == dir) {
                if hierarchy.v2 {
                    enable_v2(&hierarchy.root, controller)?;
                }
                fs::create_dir_all(&dir)
                    .with_context(|| format!("create the {} cgroup", controller.name()))?;
                group.procs.push(open_procs(&dir)?);
                group.dirs.push((dir.clone(), hierarchy.v2));
            }
            set(&dir, hierarchy.v2, controller, limits)
                .with_context(|| format!("set the sandbox's {} limit", controller.name()))?;
            if controller == Controller::Memory {
                group.memory = Some((dir, hierarchy.v2));
            }
        }
        Ok(Some(group))
    }

    /// Moves process `pid` (and so everything it forks later) into the
    /// group.
    pub fn add(&self, pid: i32) -> io::Result<()> {
        let line = pid.to_string();
        for fd in &self.procs {
            write_fd(fd.as_raw_fd(), line.as_bytes())?;
        }
        Ok(())
    }

    /// The descriptors [`join_self`] writes to: pass them into a child's
    /// pre-exec hook.
    pub fn procs_fds(&self) -> Vec<i32> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// How many processes the memory limit has killed so far (0 without a
    /// memory limit or where the kernel does not count).
    pub fn oom_kills(&self) -> u64 {
        let Some((dir, v2)) = &self.memory else {
            return 0;
        };
        let file = if *v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("oom_kill ")?.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// Removes the group's directories; call once its processes are gone
    /// (a directory that still holds a process stays, with a warning).
    pub fn remove(&self) {
        for (dir, _) in &self.dirs {
            remove_dir(dir);
        }
    }
}

/// Child side, between fork and exec: moves the calling process into the
/// groups whose `cgroup.procs` are `fds` (from [`Cgroup::procs_fds`]).
/// Only async-signal-safe calls.
pub fn join_self(fds: &[i32]) -> io::Result<()> {
    for fd in fds {
        write_fd(*fd, b"0")?;
    }
    Ok(())
}

fn write_fd(fd: i32, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: a write of a valid buffer to a descriptor we hold.
    let written = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    if written < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn open_procs(dir: &Path) -> anyhow::Result<OwnedFd> {
    let file = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))
        .with_context(|| format!("open {}", dir.join("cgroup.procs").display()))?;
    Ok(OwnedFd::from(file))
}

/// v2 hands a controller down only where every ancestor enables it for
/// its children: the hierarchy's root and `openshell/` (which holds no
/// process itself, as v2 requires of a group that enables controllers).
fn enable_v2(root: &Path, controller: Controller) -> anyhow::Result<()> {
    let base = root.join(BASE);
    fs::create_dir_all(&base).context("create the openshell cgroup")?;
    let wanted = format!("+{}", controller.name());
    for dir in [root, base.as_path()] {
        let control = dir.join("cgroup.subtree_control");
        let enabled = fs::read_to_string(&control).unwrap_or_default();
        if !enabled
            .split_whitespace()
            .any(|name| name == controller.name())
        {
            fs::write(&control, &wanted).with_context(|| {
                format!("enable {} in {}", controller.name(), control.display())
            })?;
        }
    }
    Ok(())
}

fn set(dir: &Path, v2: bool, controller: Controller, limits: &Limits) -> io::Result<()> {
    match (controller, v2) {
        (Controller::Memory, false) => {
            let bytes = limits.memory.unwrap_or(u64::MAX).to_string();
            // memsw (memory + swap) may never be below the memory limit:
            // lift it first, then set both to the limit, so swap adds
            // nothing.
            let memsw = dir.join("memory.memsw.limit_in_bytes");
            let has_memsw = memsw.exists();
            if has_memsw {
                fs::write(&memsw, "-1")?;
            }
            fs::write(dir.join("memory.limit_in_bytes"), &bytes)?;
            if has_memsw {
                fs::write(&memsw, &bytes)?;
            }
            Ok(())
        }
        (Controller::Memory, true) => {
            fs::write(
                dir.join("memory.max"),
                limits.memory.unwrap_or(u64::MAX).to_string(),
            )?;
            let swap = dir.join("memory.swap.max");
            if swap.exists() {
                fs::write(swap, "0")?;
            }
            Ok(())
        }
        (Controller::Cpu, false) => {
            let quota = limits
                .cpu_millis
                .map_or(-1, |m| (m * CPU_PERIOD_US / 1000) as i64);
            fs::write(dir.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
            fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())
        }
        (Controller::Cpu, true) => {
            let quota = limits
                .cpu_millis
                .map_or("max".to_owned(), |m| (m * CPU_PERIOD_US / 1000).to_string());
            fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}"))
        }
        (Controller::Pids, _) => fs::write(
            dir.join("pids.max"),
            limits.pids.map_or("max".to_owned(), |n| n.to_string()),
        ),
    }
}

/// Removes a sandbox group's directory, waiting briefly for the kernel to
/// let go of processes that just died.
fn remove_dir(dir: &Path) {
    for _ in 0..50 {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
    tracing::warn!(dir = %dir.display(), "could not remove the sandbox's cgroup");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/sys/fs/cgroup/a\040b"), "/sys/fs/cgroup/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn controllers_follow_the_limits() {
        let limits = Limits {
            memory: Some(1 << 26),
            cpu_millis: None,
            pids: Some(64),
        };
        assert_eq!(
            limits.controllers(),
            vec![Controller::Memory, Controller::Pids]
        );
        assert!(Limits::default().is_empty());
    }
}
