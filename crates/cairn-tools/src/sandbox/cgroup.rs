//! The pids cgroup that caps how many processes a `ProcessSpawn` call may
//! start: a cgroup v1 `pids` hierarchy, else a delegated cgroup v2 group;
//! creating, entering and removing it (stale groups are swept). It must not
//! touch any other controller.

use super::*;

/// A per-call pids cgroup (cgroup v1 `pids` controller, or a cgroup v2
/// child group with `pids` enabled): caps the process count and lists every
/// process of the call, even those that left its process group.
#[derive(Debug)]
pub struct PidsCgroup {
    dir: PathBuf,
    pub(super) procs: File,
}

/// Where cairn creates its per-call pids cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PidsRoot {
    /// The cgroup v1 `pids` hierarchy.
    V1(PathBuf),
    /// Cairn's own cgroup v2 group, with `pids` enabled for its children
    /// (cairn itself moved into a `cairn-<pid>-host` leaf when it had to,
    /// since a v2 group with processes cannot enable controllers).
    V2(PathBuf),
}

impl PidsRoot {
    /// The directory per-call groups go in.
    pub fn dir(&self) -> &Path {
        match self {
            PidsRoot::V1(d) | PidsRoot::V2(d) => d,
        }
    }

    pub(super) fn describe(&self) -> String {
        match self {
            PidsRoot::V1(d) => format!("cgroup v1 at {}", d.display()),
            PidsRoot::V2(d) => format!("cgroup v2 under {}", d.display()),
        }
    }
}

/// Where cairn may create pids cgroups, or why it may not (probed once per
/// process): the cgroup v1 `pids` hierarchy when it is writable, else the
/// cgroup v2 group cairn runs in when `pids` is available there and the
/// group is delegated (writable).
pub fn pids_cgroup_root() -> Result<PidsRoot, String> {
    static ROOT: std::sync::OnceLock<Result<PidsRoot, String>> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let v1 = Path::new("/sys/fs/cgroup/pids");
        let v1_why = if !v1.join("cgroup.procs").exists() {
            format!("no cgroup v1 pids hierarchy at {}", v1.display())
        } else if !is_writable_dir(v1) {
            format!("cannot create groups in {} (not root?)", v1.display())
        } else {
            sweep_stale(v1);
            return Ok(PidsRoot::V1(v1.to_path_buf()));
        };
        match v2_root() {
            Ok(dir) => {
                sweep_stale(&dir);
                Ok(PidsRoot::V2(dir))
            }
            Err(v2_why) => Err(format!("{v1_why}; {v2_why}")),
        }
    })
    .clone()
}

/// The mount point of the cgroup v2 hierarchy, from `/proc/self/mountinfo`
/// text.
pub(super) fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER"
        let (before, after) = line.split_once(" - ")?;
        let fstype = after.split_whitespace().next()?;
        (fstype == "cgroup2").then(|| before.split_whitespace().nth(4).map(PathBuf::from)).flatten()
    })
}

/// The calling process's cgroup v2 path (`0::/path` in `/proc/self/cgroup`).
pub(super) fn cgroup2_own_path(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(|p| p.trim().to_string())
}

pub(super) fn has_word(text: &str, word: &str) -> bool {
    text.split_whitespace().any(|w| w == word)
}

/// Cairn's own cgroup v2 group, made ready for per-call child groups with
/// `pids`, or why that is impossible.
pub(super) fn v2_root() -> Result<PathBuf, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mount = cgroup2_mount(&mountinfo).ok_or("no cgroup v2 hierarchy is mounted")?;
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let own = cgroup2_own_path(&own).ok_or("cairn is in no cgroup v2 group")?;
    let dir = mount.join(own.trim_start_matches('/'));
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    if !has_word(&read("cgroup.controllers"), "pids") {
        return Err(format!(
            "the cgroup v2 group {} does not offer the pids controller (not delegated, or bound to cgroup v1)",
            dir.display()
        ));
    }
    if !is_writable_dir(&dir) {
        return Err(format!("the cgroup v2 group {} is not delegated to cairn (not writable)", dir.display()));
    }
    if has_word(&read("cgroup.subtree_control"), "pids") {
        return Ok(dir);
    }
    enable_v2_pids(&dir)
        .map(|()| dir.clone())
        .map_err(|e| format!("cannot enable pids for children of the cgroup v2 group {}: {e}", dir.display()))
}

/// Enable `pids` in `dir`'s `cgroup.subtree_control`. A v2 group with
/// processes cannot enable controllers for its children, so cairn first
/// moves itself into a leaf `cairn-<pid>-host` (and back when enabling
/// fails, e.g. because other processes share the group).
pub(super) fn enable_v2_pids(dir: &Path) -> std::io::Result<()> {
    let control = dir.join("cgroup.subtree_control");
    if std::fs::write(&control, "+pids").is_ok() {
        return Ok(());
    }
    let leaf = dir.join(format!("cairn-{}-host", std::process::id()));
    std::fs::create_dir(&leaf)?;
    let me = std::process::id().to_string();
    if let Err(e) = std::fs::write(leaf.join("cgroup.procs"), &me) {
        let _ = std::fs::remove_dir(&leaf);
        return Err(e);
    }
    match std::fs::write(&control, "+pids") {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::write(dir.join("cgroup.procs"), &me);
            let _ = std::fs::remove_dir(&leaf);
            Err(e)
        }
    }
}

/// Remove the `cairn-<pid>-<n>` groups left by cairn processes that died
/// without cleaning up (SIGKILL), killing what is still in them first: a
/// tool's process that escaped its group where there was no PID namespace
/// to take it down with cairn.
pub(super) fn sweep_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("cairn-").and_then(|r| r.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let procs = std::fs::read_to_string(entry.path().join("cgroup.procs")).unwrap_or_default();
            for p in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill(2) with a pid listed by a cgroup cairn made.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
            // rmdir fails (harmlessly) while the group still has processes.
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

pub(super) fn is_writable_dir(dir: &Path) -> bool {
    let probe = dir.join(format!("cairn-probe-{}", std::process::id()));
    if std::fs::create_dir(&probe).is_ok() {
        let _ = std::fs::remove_dir(&probe);
        true
    } else {
        false
    }
}

impl PidsCgroup {
    pub(super) fn create(max: u32) -> Option<Self> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = pids_cgroup_root().ok()?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = root.dir().join(format!("cairn-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).ok()?;
        let ok = std::fs::write(dir.join("pids.max"), max.max(1).to_string()).is_ok();
        let procs = std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs")).ok();
        match (ok, procs) {
            (true, Some(procs)) => Some(Self { dir, procs }),
            _ => {
                let _ = std::fs::remove_dir(&dir);
                None
            }
        }
    }

    /// Pids currently in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// SIGKILL every process of the cgroup; true when it is empty.
    pub fn kill_all(&self) -> bool {
        let pids = self.pids();
        for pid in &pids {
            // SAFETY: kill(2) with a pid read from our own cgroup.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        pids.is_empty()
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        let _ = (&self.procs).flush();
        for _ in 0..100 {
            if self.kill_all() && std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
