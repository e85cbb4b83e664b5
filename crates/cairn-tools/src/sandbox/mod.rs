//! The Linux sandbox: a Landlock ruleset and seccomp filters derived from a
//! tool's declared capabilities, applied in the child between `fork` and
//! `exec`.
//!
//! This module owns the translation "capabilities → kernel rules" and the
//! report of what the running kernel can enforce. It builds everything that
//! allocates (the ruleset fd, the BPF programs, the cgroup) in the parent;
//! the child only issues raw syscalls (async-signal-safe). It does not spawn
//! processes itself (see `process`).
//!
//! Rules (what a sandboxed process may do):
//! - read and execute the system directories (`/usr`, `/bin`, `/sbin`,
//!   `/lib*`, `/opt`, `/proc`, `/sys`) and of `/etc` what any user may read
//!   but its secrets (`shadow`, `gshadow`, `ssl/private`, … —
//!   `linux::etc_reads`; root's tools too), read and write `/dev/null`,
//!   `/dev/zero`, `/dev/full`, read `/dev/urandom` and `/dev/random`;
//! - read the configured `extra_read` paths: a program's install
//!   (`programs::install_reads`), developer configuration
//!   (`programs::developer_config`), `sandbox_read_paths`;
//! - read (and execute) the working directory only with `FileRead`;
//! - write the working directory and a private temp directory (`TMPDIR`)
//!   only with `FileWrite`;
//! - TCP bind/connect only with `Network` (Landlock ABI ≥ 4; with it, the
//!   name-resolution files `/etc/resolv.conf`, `/etc/hosts`, … are readable
//!   even when they link into `/run`), and without it
//!   a seccomp filter refuses `socket()` for every family but `AF_UNIX`, and
//!   `io_uring_setup`;
//! - without `ProcessSpawn`, a seccomp filter refuses `fork`, `vfork`,
//!   `clone` without `CLONE_THREAD` (threads stay allowed) and `clone3`
//!   (answered `ENOSYS` so libc falls back to `clone`); `execve` stays
//!   allowed because it replaces the process rather than adding one;
//! - with `ProcessSpawn`, a pids cgroup (when cairn may create one: cgroup v1
//!   `pids`, else a delegated cgroup v2 group) caps the number of processes
//!   of the call;
//! - signals and abstract unix sockets are scoped to the sandbox (ABI ≥ 6);
//! - with a mount namespace, `/tmp` is a private tmpfs of the call
//!   (writable with `FileWrite`; the call's own paths under `/tmp` are
//!   cloned before and moved back into it, read-only where it may not
//!   write them, since Landlock rights add up along a path);
//! - nothing else: `$HOME`, the host's `/tmp`, other users' files are
//!   invisible.
//!
//! Every tool process, sandboxed or not (see [`ChildHook::apply`]): no
//! descriptor above 2 survives its `exec` (cairn's own, and whatever cairn
//! inherited), no capabilities at all, seccomp refusing `ptrace`,
//! `process_vm_readv`, `process_vm_writev`, `pidfd_getfd` and device
//! `mknod`, and where the kernel allows ([`namespace_mode`]) its own PID
//! and mount namespace with a fresh `/proc` — as root directly, as any
//! other user through an unprivileged user namespace mapping only that
//! user — in which the paths the host hides ([`Prepared::with_mounts`]:
//! cairn's home, its sockets) are covered. Cairn itself is made
//! non-dumpable ([`protect_host_process`]). Together: a tool cannot read
//! cairn's `/proc/PID/environ`, `maps` or `mem`, nor any other process's,
//! nor reach cairn's control sockets.
//!
//! Layout: this module holds the policy types, the "run sandboxed or
//! not" decision and the rules' description; [`probe`] what the kernel can
//! enforce; [`hook`] the child hook (built in the parent, raw syscalls in
//! the child); `linux` capabilities → Landlock ruleset and seccomp
//! programs; [`cgroup`] the pids cgroup.
//!
//! Known gap: connecting to a *pathname* unix socket (e.g.
//! `/var/run/docker.sock`) is not a file access Landlock checks before ABI 9
//! (`ResolveUnix`), and `AF_UNIX` sockets stay allowed by seccomp; cairn asks
//! for ABI 6 rights (the newest it was tested with). That is why cairn's own
//! home is hidden rather than left to Landlock; other sockets stay reachable,
//! and without a mount namespace cairn's are too (`cairn tools` says so).

use std::fs::File;
use std::io::Write as _;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

mod cgroup;
mod hook;
#[cfg(target_os = "linux")]
mod linux;
mod probe;

pub use cgroup::*;
pub use hook::*;
pub use probe::*;

/// The rules of one sandboxed call, derived from capabilities.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxPolicy {
    /// The working directory.
    pub cwd: PathBuf,
    /// Read (and execute) the working directory.
    pub read_cwd: bool,
    /// Write the working directory and the private temp dir.
    pub write_cwd: bool,
    /// TCP bind/connect and non-unix sockets.
    pub network: bool,
    /// Create new processes.
    pub process_spawn: bool,
    /// Private temp directory (writable when `write_cwd`, else readable).
    pub tmp_dir: Option<PathBuf>,
    /// Extra read+execute paths (the tool's own install directory, approved
    /// bypasses).
    pub extra_read: Vec<PathBuf>,
    /// Extra read+write paths (approved bypasses only).
    pub extra_write: Vec<PathBuf>,
    /// Process cap for the pids cgroup (when spawning is allowed).
    pub max_processes: u32,
    /// Staged execution: the working directory becomes an overlay in the
    /// call's own mount namespace (the real tree read-only below, this
    /// staging layer above), so every write lands in the staging layer.
    /// Needs the PID + mount namespace ([`isolation_status`] and
    /// [`crate::staging::overlay_status`]).
    pub overlay: Option<OverlayDirs>,
    /// An approved bypass: none of the file or network rules above apply
    /// (only what [`Prepared::unsandboxed`] keeps), but the overlay does.
    pub bypass: bool,
    /// Files of the working directory the call must not write although
    /// it may write the directory: each is bind-mounted over itself
    /// read-only in the call's mount namespace. An unstaged call gets the
    /// files that share their inode with a name outside the tree
    /// ([`linked_outside`]): Landlock checks the path written, so a write
    /// through such a hard link would change a file outside the tree.
    pub read_only_files: Vec<PathBuf>,
}

/// The most files [`linked_outside`] reports (each is one mount in the
/// call's namespace); a tree with more is refused unstaged.
pub const MAX_READ_ONLY_FILES: usize = 1024;

/// The regular files under `tree` whose inode has more links than the
/// tree holds (so at least one name outside it: writing the file in place
/// would change that file too), not following links, `None` past
/// [`MAX_READ_ONLY_FILES`]. A directory that cannot be read is skipped (a
/// sandboxed call cannot write into it either).
pub fn linked_outside(tree: &Path) -> Option<Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt as _;
    let mut seen: std::collections::HashMap<(u64, u64), (u64, Vec<PathBuf>)> = std::collections::HashMap::new();
    let mut dirs = vec![tree.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if meta.is_file() && meta.nlink() > 1 {
                let slot = seen.entry((meta.dev(), meta.ino())).or_insert_with(|| (meta.nlink(), Vec::new()));
                slot.1.push(entry.path());
            }
        }
    }
    let mut out: Vec<PathBuf> =
        seen.into_values().filter(|(links, names)| *links > names.len() as u64).flat_map(|(_, names)| names).collect();
    if out.len() > MAX_READ_ONLY_FILES {
        return None;
    }
    out.sort();
    Some(out)
}

/// The staging layer of an overlay: `upper` receives the writes, `work` is
/// overlayfs's scratch directory (same file system as `upper`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayDirs {
    /// The upper (staging) directory.
    pub upper: PathBuf,
    /// The work directory.
    pub work: PathBuf,
}

/// Why a sandbox could not be prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// Landlock refused the ruleset.
    #[error("cannot build the Landlock ruleset: {0}; run `cairn tools` to see what this kernel supports")]
    Landlock(String),
    /// Seccomp filter compilation failed.
    #[error("cannot build the seccomp filter: {0}")]
    Seccomp(String),
    /// Staged execution was asked where it cannot be set up.
    #[error("cannot stage this call in an overlay: {0}")]
    Overlay(String),
    /// The private `/tmp` or a hidden path cannot be set up.
    #[error("cannot prepare the call's mounts: {0}")]
    Mounts(String),
}

/// The rules a tool with `capabilities` runs under, in words (for
/// `cairn tools` and approval prompts).
pub fn describe_rules(capabilities: &std::collections::BTreeSet<cairn_core::tool::Capability>) -> String {
    use cairn_core::tool::Capability as C;
    let has = |c| capabilities.contains(&c);
    let files = match (has(C::FileRead), has(C::FileWrite)) {
        (_, true) => "read+write the working directory and a private TMPDIR",
        (true, false) => "read the working directory",
        (false, false) => "no access to the working directory",
    };
    let net = if has(C::Network) { "network allowed" } else { "no network" };
    let spawn =
        if has(C::ProcessSpawn) || has(C::ShellExec) { "may start processes (capped)" } else { "no new processes" };
    format!("{files}; system directories read-only; {net}; {spawn}")
}

/// What to do with a process tool on this kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Run under the sandbox.
    Sandboxed,
    /// Run without it; the note goes into the receipt (never silent).
    Unsandboxed(String),
    /// Do not run; the message says why and how to opt in.
    Refuse(String),
}

/// The rule "where the kernel cannot enforce what a tool needs, Write and
/// Destructive tools do not run unsandboxed unless the user opted in".
pub fn decide(status: &SandboxStatus, risk: cairn_core::tool::Risk, allow_unsandboxed: bool) -> Decision {
    use cairn_core::tool::Risk;
    if status.fully_enforced() {
        return Decision::Sandboxed;
    }
    let why = status.describe();
    match (risk, allow_unsandboxed) {
        (Risk::ReadOnly, _) => Decision::Unsandboxed(format!("[cairn: ran without a sandbox: {why}]")),
        (_, true) => Decision::Unsandboxed(format!(
            "[cairn: ran without a sandbox because this session allows unsandboxed tools: {why}]"
        )),
        (risk, false) => Decision::Refuse(format!(
            "refusing to run a {risk:?} tool without a sandbox ({why}); start the session with unsandboxed tools \
             allowed (tools config `allow_unsandboxed`) if you accept the risk"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::tool::Risk;

    #[test]
    fn unsandboxable_kernels_refuse_writes_unless_opted_in() {
        let none = SandboxStatus {
            landlock_abi: 0,
            filesystem: false,
            network_landlock: false,
            seccomp: true,
            pids_cgroup: false,
            pids_cgroup_note: String::new(),
            scoping: false,
            pid_namespace: false,
            pid_namespace_note: String::new(),
        };
        assert!(matches!(decide(&none, Risk::Write, false), Decision::Refuse(_)));
        assert!(matches!(decide(&none, Risk::Destructive, false), Decision::Refuse(_)));
        assert!(matches!(decide(&none, Risk::Write, true), Decision::Unsandboxed(_)));
        assert!(matches!(decide(&none, Risk::ReadOnly, false), Decision::Unsandboxed(_)));
        let full = SandboxStatus { landlock_abi: 7, filesystem: true, network_landlock: true, scoping: true, ..none };
        assert_eq!(decide(&full, Risk::Destructive, false), Decision::Sandboxed);
    }

    #[test]
    fn rules_are_described_from_capabilities() {
        use cairn_core::tool::Capability;
        let none = describe_rules(&Default::default());
        assert_eq!(
            none,
            "no access to the working directory; system directories read-only; no network; no new processes"
        );
        let shell: std::collections::BTreeSet<_> =
            [Capability::FileRead, Capability::FileWrite, Capability::ProcessSpawn].into_iter().collect();
        assert!(describe_rules(&shell).starts_with("read+write the working directory"));
        assert!(describe_rules(&shell).ends_with("may start processes (capped)"));
    }

    #[test]
    fn the_cgroup_v2_group_is_found_from_proc_files() {
        let mountinfo = "24 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n\
                         31 24 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n\
                         32 24 0:28 / /sys/fs/cgroup/pids rw shared:10 - cgroup cgroup rw,pids\n";
        assert_eq!(cgroup2_mount(mountinfo), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(cgroup2_mount("32 24 0:28 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"), None);
        assert_eq!(cgroup2_own_path("8:pids:/\n0::/user.slice/cairn.scope\n"), Some("/user.slice/cairn.scope".into()));
        assert_eq!(cgroup2_own_path("8:pids:/\n"), None);
        assert!(has_word("cpu io pids", "pids") && !has_word("cpu pidsx", "pids"));
    }

    #[test]
    fn this_kernel_reports_landlock() {
        let s = landlock_status();
        assert!(s.landlock_abi >= 1, "the test machines have Landlock: {}", s.describe());
    }
}
