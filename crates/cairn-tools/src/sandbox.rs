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
//!   `/lib*`, `/etc`, `/opt`, `/proc`, `/sys`), read and write `/dev/null`,
//!   `/dev/zero`, `/dev/full`, read `/dev/urandom` and `/dev/random`;
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

/// What the running kernel can enforce, for `cairn tools` and for the
/// "refuse unsandboxed writes" decision.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SandboxStatus {
    /// The Landlock ABI version the kernel offers (0 = none).
    pub landlock_abi: u32,
    /// Filesystem rules are enforced (ABI ≥ 1).
    pub filesystem: bool,
    /// TCP bind/connect rules are enforced by Landlock (ABI ≥ 4).
    pub network_landlock: bool,
    /// Seccomp filters can be installed (socket and fork filters).
    pub seccomp: bool,
    /// A pids cgroup can be created to cap process counts.
    pub pids_cgroup: bool,
    /// Which pids cgroup (v1 or v2, where), or why there is none.
    pub pids_cgroup_note: String,
    /// Signal and abstract-socket scoping (ABI ≥ 6).
    pub scoping: bool,
    /// Tool processes get their own PID and mount namespace with a fresh
    /// `/proc` (see [`isolation_status`]).
    pub pid_namespace: bool,
    /// Why there is no PID namespace (empty when there is one).
    pub pid_namespace_note: String,
}

impl SandboxStatus {
    /// Whether every rule of a tool's policy can be enforced.
    pub fn fully_enforced(&self) -> bool {
        self.filesystem && self.seccomp
    }

    /// One line for humans.
    pub fn describe(&self) -> String {
        if !self.filesystem {
            return "Landlock unavailable: tools cannot be sandboxed on this kernel".to_string();
        }
        let pidns = match (self.pid_namespace, namespace_mode()) {
            (true, Ok(NamespaceMode::UserNamespace)) => "yes (through an unprivileged user namespace)".to_string(),
            (true, _) => "yes".to_string(),
            (false, _) => format!("no ({})", self.pid_namespace_note),
        };
        format!(
            "Landlock ABI {} (filesystem: yes, TCP rules: {}, scoping: {}), seccomp: {}, pids cgroup: {} ({}), \
             pid namespace: {pidns}",
            self.landlock_abi,
            yes(self.network_landlock),
            yes(self.scoping),
            yes(self.seccomp),
            yes(self.pids_cgroup),
            self.pids_cgroup_note,
        )
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// The Landlock ABI of the running kernel (0 when Landlock is missing or off).
pub fn landlock_abi() -> u32 {
    #[cfg(target_os = "linux")]
    {
        const LANDLOCK_CREATE_RULESET_VERSION: libc::c_long = 1;
        // SAFETY: landlock_create_ruleset with a NULL attr, size 0 and the
        // VERSION flag only returns the ABI version; it reads no memory.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        if v > 0 { v as u32 } else { 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

/// What this kernel can enforce.
pub fn landlock_status() -> SandboxStatus {
    let abi = landlock_abi();
    SandboxStatus {
        landlock_abi: abi,
        filesystem: abi >= 1,
        network_landlock: abi >= 4,
        seccomp: cfg!(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))),
        pids_cgroup: pids_cgroup_root().is_ok(),
        pids_cgroup_note: match pids_cgroup_root() {
            Ok(root) => root.describe(),
            Err(why) => why,
        },
        scoping: abi >= 6,
        pid_namespace: isolation_status().is_ok(),
        pid_namespace_note: isolation_status().err().unwrap_or_default(),
    }
}

/// Whether tool processes can get their own PID namespace and a fresh
/// `/proc` here, or why not (see [`namespace_mode`]).
pub fn isolation_status() -> Result<(), String> {
    namespace_mode().map(|_| ())
}

/// How tool processes get their own PID and mount namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceMode {
    /// Cairn holds `CAP_SYS_ADMIN` (root): a plain
    /// `unshare(CLONE_NEWPID | CLONE_NEWNS)`.
    Privileged,
    /// An unprivileged user: the child first enters a user namespace of
    /// its own that maps only cairn's uid and gid (so every file it creates
    /// belongs to the real user), in which it may mount `/proc`, tmpfs and
    /// overlayfs (with `userxattr`, kernel ≥ 5.11).
    UserNamespace,
}

/// How tool processes get their namespaces here, or why they cannot
/// (probed once per process: a throwaway child tries the privileged path,
/// then the user-namespace path, and a grandchild mounts `/proc`). Where
/// the distribution blocks unprivileged user namespaces the reason says
/// which setting does.
pub fn namespace_mode() -> Result<NamespaceMode, String> {
    static PROBE: std::sync::OnceLock<Result<NamespaceMode, String>> = std::sync::OnceLock::new();
    PROBE.get_or_init(probe_namespaces).clone()
}

/// The uid/gid maps an unprivileged child writes for itself (built in the
/// parent: the child may only issue raw syscalls).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserMaps {
    pub(crate) uid_map: Vec<u8>,
    pub(crate) gid_map: Vec<u8>,
}

impl UserMaps {
    /// `U U 1` and `G G 1` for the calling process's effective ids.
    pub(crate) fn current() -> Self {
        // SAFETY: geteuid/getegid cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Self { uid_map: format!("{uid} {uid} 1").into_bytes(), gid_map: format!("{gid} {gid} 1").into_bytes() }
    }

    /// The maps to use in `mode` (none for the privileged path).
    pub(crate) fn for_mode(mode: Result<NamespaceMode, String>) -> Option<Self> {
        matches!(mode, Ok(NamespaceMode::UserNamespace)).then(Self::current)
    }
}

/// Enter new user, mount and PID namespaces (the PID namespace applies to
/// the children) and map the caller's own uid and gid.
///
/// # Safety
/// Raw syscalls only; call between `fork` and `exec`.
#[cfg(target_os = "linux")]
pub(crate) unsafe fn enter_user_namespace(uid_map: &[u8], gid_map: &[u8]) -> std::io::Result<()> {
    // SAFETY: raw syscalls with valid NUL-terminated paths and buffers.
    unsafe {
        if libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // A non-dumpable process (cairn, see `protect_host_process`, and so
        // this fork of it) has its /proc files owned by the host's root,
        // which a user namespace's capabilities do not reach: the maps
        // could not be written. Dumpable only for the three writes; the
        // tool's own program becomes dumpable at exec anyway, and nothing
        // a tool runs can see this process (no ptrace, its own /proc).
        let dumpable = libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0);
        if dumpable == 0 && libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let written = write_proc_file(c"/proc/self/setgroups", b"deny")
            .and_then(|()| write_proc_file(c"/proc/self/uid_map", uid_map))
            .and_then(|()| write_proc_file(c"/proc/self/gid_map", gid_map));
        if dumpable == 0 && libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        written?;
    }
    Ok(())
}

/// # Safety
/// Raw syscalls only.
#[cfg(target_os = "linux")]
unsafe fn write_proc_file(path: &std::ffi::CStr, data: &[u8]) -> std::io::Result<()> {
    // SAFETY: a valid path and buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(fd, data.as_ptr().cast(), data.len());
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if n != data.len() as isize {
            return Err(err);
        }
    }
    Ok(())
}

/// Why unprivileged user namespaces are blocked here, when a known
/// setting says so.
fn userns_blocker() -> Option<String> {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return Some(
            "the distribution blocks unprivileged user namespaces (kernel.unprivileged_userns_clone = 0)".into(),
        );
    }
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return Some("user namespaces are turned off (user.max_user_namespaces = 0)".into());
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        return Some(
            "the distribution's AppArmor blocks unprivileged user namespaces \
             (kernel.apparmor_restrict_unprivileged_userns = 1)"
                .into(),
        );
    }
    None
}

#[cfg(target_os = "linux")]
fn probe_namespaces() -> Result<NamespaceMode, String> {
    let root_why = match probe_pid_namespace(None) {
        Ok(()) => return Ok(NamespaceMode::Privileged),
        Err(why) => why,
    };
    match probe_pid_namespace(Some(&UserMaps::current())) {
        Ok(()) => Ok(NamespaceMode::UserNamespace),
        Err(user_why) => {
            let blocker = userns_blocker().map(|b| format!("; {b}")).unwrap_or_default();
            Err(format!("{root_why}; through an unprivileged user namespace: {user_why}{blocker}"))
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn probe_namespaces() -> Result<NamespaceMode, String> {
    Err("PID namespaces exist only on Linux".into())
}

/// Make the calling process (cairn itself) non-dumpable: other processes of
/// the same user, tools included, can no longer open its `/proc/PID/environ`,
/// `maps` or `mem`, nor ptrace it, unless they hold `CAP_SYS_PTRACE` (which
/// every tool process drops, see [`ChildHook::apply`]). Also turns off core
/// dumps, which would hold the same secrets. Call it first thing in `main`.
pub fn protect_host_process() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl(PR_SET_DUMPABLE, 0) only changes a flag of the
        // calling process.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether the calling process is dumpable (`PR_GET_DUMPABLE`).
pub fn host_process_dumpable() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_GET_DUMPABLE reads a flag of the calling process.
        unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) != 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        true
    }
}

/// One way into the namespaces: privileged (`maps` = `None`) or through a
/// user namespace.
#[cfg(target_os = "linux")]
fn probe_pid_namespace(maps: Option<&UserMaps>) -> Result<(), String> {
    // SAFETY: the forked children issue only raw, async-signal-safe
    // syscalls and leave with _exit; the parent only waits.
    unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return Err(format!("cannot fork a probe: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            let entered = match maps {
                None => {
                    if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) == 0 {
                        0
                    } else {
                        1
                    }
                }
                Some(m) => match enter_user_namespace(&m.uid_map, &m.gid_map) {
                    Ok(()) => 0,
                    Err(e) if e.raw_os_error() == Some(libc::EPERM) || e.raw_os_error() == Some(libc::ENOSPC) => 1,
                    Err(_) => 4,
                },
            };
            if entered != 0 {
                libc::_exit(entered);
            }
            let inner = libc::fork();
            if inner < 0 {
                libc::_exit(2);
            }
            if inner == 0 {
                libc::_exit(mount_fresh_proc().map_or(3, |_| 0));
            }
            let code = wait_exit_code(inner);
            libc::_exit(code);
        }
        match (wait_exit_code(pid), maps) {
            (0, _) => Ok(()),
            (1, None) => Err("the kernel refused a new PID namespace (needs CAP_SYS_ADMIN)".into()),
            (1, Some(_)) => Err("the kernel refused a new user namespace".into()),
            (4, _) => Err("cannot write the uid/gid map of a new user namespace".into()),
            (2, _) => Err("cannot fork into a new PID namespace".into()),
            (3, _) => Err("cannot mount a fresh /proc in a new mount namespace".into()),
            (n, _) => Err(format!("the namespace probe ended with status {n}")),
        }
    }
}

/// Wait for `pid`; its exit code, or 128 + the signal that killed it.
///
/// # Safety
/// Async-signal-safe (raw waitpid only); `pid` must be a child.
#[cfg(target_os = "linux")]
unsafe fn wait_exit_code(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return 127;
        }
    }
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        127
    }
}

/// In a new mount namespace: stop mount events from propagating back to the
/// host (`/` private, recursively) and mount a `/proc` that shows only the
/// calling process's PID namespace.
///
/// # Safety
/// Raw syscalls only; call between `fork` and `exec`.
#[cfg(target_os = "linux")]
unsafe fn mount_fresh_proc() -> std::io::Result<()> {
    // SAFETY: NUL-terminated literals and null pointers as mount(2) allows.
    unsafe {
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        if libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

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

/// Everything the child needs, built in the parent.
#[derive(Debug, Default)]
pub struct Prepared {
    ruleset: Option<OwnedFd>,
    filters: Vec<Vec<RawFilter>>,
    cgroup: Option<PidsCgroup>,
    pid_namespace: bool,
    proc_access: u64,
    /// Overlay target (the working directory) and mount options.
    overlay: Option<(std::ffi::CString, std::ffi::CString)>,
    overlay_access: u64,
    /// The uid/gid maps when the namespaces come through a user namespace.
    user_maps: Option<UserMaps>,
    /// Private `/tmp` and hidden paths, mounted in the call's namespace
    /// (boxed: the hook points into it).
    mounts: Option<Box<MountPlan>>,
}

/// Mounts made in the call's own mount namespace after `/proc` and the
/// overlay: a private tmpfs on `/tmp`, empty read-only tmpfs over hidden
/// directories, `/dev/null` over hidden non-directories (sockets). Built in
/// the parent; the child only walks it.
#[derive(Debug, Default)]
pub(crate) struct MountPlan {
    covers: Vec<Cover>,
    masks: Vec<std::ffi::CString>,
    /// Where to `chdir` once everything is mounted (the working directory,
    /// possibly re-exposed under a cover).
    cwd: Option<std::ffi::CString>,
}

/// A tmpfs mounted over `target`, with paths beneath it that stay visible
/// (`keeps`: cloned before the tmpfs covers them, moved back after).
#[derive(Debug)]
struct Cover {
    target: std::ffi::CString,
    /// A private, writable `/tmp` (else an empty read-only cover).
    writable: bool,
    /// The Landlock rights the cover gets (0: none).
    access: u64,
    /// Optional: skip the cover (rather than fail) where the kernel lacks
    /// the mount API to re-expose its keeps.
    optional: bool,
    keeps: Vec<Keep>,
}

/// A path kept visible under a cover.
#[derive(Debug)]
struct Keep {
    path: std::ffi::CString,
    /// The directories to create in the cover, outermost first (the last
    /// is the path itself when it is a directory).
    dirs: Vec<std::ffi::CString>,
    is_dir: bool,
    /// Re-exposed read-only (under a cover with a write rule, everything
    /// but a writable working directory or temp directory).
    read_only: bool,
}

/// Most paths one cover keeps visible (the child's fd array is fixed).
const MAX_KEEPS: usize = 32;

/// One BPF instruction (layout of `struct sock_filter`).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct RawFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// Raw values the `pre_exec` hook uses: plain integers and pointers only.
#[derive(Debug)]
pub struct ChildHook {
    ruleset_fd: i32,
    cgroup_fd: i32,
    filters: Vec<(u16, *const RawFilter)>,
    pid_namespace: bool,
    proc_access: u64,
    overlay_target: *const libc::c_char,
    overlay_options: *const libc::c_char,
    overlay_access: u64,
    uid_map: (*const u8, usize),
    gid_map: (*const u8, usize),
    mounts: *const MountPlan,
}

// SAFETY: the pointers point into `Prepared` (its filters, strings, maps and
// boxed mount plan), which the caller keeps
// alive (and unmoved: the inner Vecs' heap buffers do not move) until the
// spawn returns; the hook only reads them in the forked child.
unsafe impl Send for ChildHook {}
// SAFETY: see `Send`; the data is never mutated.
unsafe impl Sync for ChildHook {}

impl Prepared {
    /// Build the ruleset, filters and cgroup for `policy`; with
    /// `pid_namespace`, the child also gets its own PID namespace and
    /// `/proc` when this kernel allows it ([`isolation_status`]).
    pub fn new(policy: &SandboxPolicy, pid_namespace: bool) -> Result<Self, SandboxError> {
        #[cfg(target_os = "linux")]
        {
            let ruleset = Some(linux::ruleset(policy)?);
            let filters = linux::filters(Some(policy))?;
            let cgroup = if policy.process_spawn { PidsCgroup::create(policy.max_processes) } else { None };
            let pid_namespace = pid_namespace && isolation_status().is_ok();
            let overlay = match &policy.overlay {
                None => None,
                Some(_) if !pid_namespace => {
                    return Err(SandboxError::Overlay(
                        "the call cannot get its own mount namespace here (see `cairn tools`)".into(),
                    ));
                }
                Some(dirs) => Some(overlay_mount_args(&policy.cwd, dirs, userxattr())?),
            };
            Ok(Self {
                ruleset,
                filters,
                cgroup,
                pid_namespace,
                proc_access: linux::proc_access(),
                overlay,
                overlay_access: if policy.write_cwd { linux::write_access() } else { linux::proc_access() },
                user_maps: if pid_namespace { UserMaps::for_mode(namespace_mode()) } else { None },
                mounts: None,
            })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (policy, pid_namespace);
            Err(SandboxError::Landlock("Landlock exists only on Linux".into()))
        }
    }

    /// No file or network rules, for explicitly unsandboxed runs (an
    /// approved bypass, `allow_unsandboxed`): the process still gets its
    /// pids cgroup, drops every capability, keeps the seccomp filter against
    /// reading other processes' memory, gets its own PID namespace when
    /// asked and possible, and (where Landlock exists) a Landlock domain
    /// that only refuses block-device creation: being in any domain denies
    /// ptrace-class access (`/proc/PID/environ`, `mem`) to processes outside
    /// it, cairn and the user's shell included. Cairn's secrets are not part
    /// of what a bypass grants.
    pub fn unsandboxed(max_processes: u32, pid_namespace: bool) -> Result<Self, SandboxError> {
        #[cfg(target_os = "linux")]
        let (ruleset, filters) = (linux::scope_only_ruleset(), linux::filters(None)?);
        #[cfg(not(target_os = "linux"))]
        let (ruleset, filters) = (None, Vec::new());
        let pid_namespace = pid_namespace && isolation_status().is_ok();
        Ok(Self {
            ruleset,
            filters,
            cgroup: PidsCgroup::create(max_processes),
            pid_namespace,
            proc_access: 0,
            overlay: None,
            overlay_access: 0,
            user_maps: if pid_namespace { UserMaps::for_mode(namespace_mode()) } else { None },
            mounts: None,
        })
    }

    /// Add the mounts of the call's own mount namespace (nothing without
    /// one): with `private_tmp`, a private writable tmpfs on `/tmp` (the
    /// paths the call needs under it — working directory, `TMPDIR`, extra
    /// read and write paths — stay visible; Landlock rights on it when the
    /// policy writes), and an empty read-only tmpfs over each directory of
    /// `hidden` (`/dev/null` over each other file, e.g. a socket), keeping
    /// the call's own paths beneath it visible. A hidden directory that
    /// *is* the working directory cannot be covered and is left to the
    /// host (which hides its sockets instead). `program` (the executable,
    /// e.g. an external tool installed in cairn's home) stays visible too.
    pub fn with_mounts(
        mut self,
        cwd: &Path,
        policy: Option<&SandboxPolicy>,
        program: Option<&Path>,
        hidden: &[PathBuf],
        private_tmp: bool,
    ) -> Result<Self, SandboxError> {
        if !self.pid_namespace {
            return Ok(self);
        }
        let plan = mount_plan(cwd, policy, program, hidden, private_tmp)?;
        if !plan.covers.is_empty() || !plan.masks.is_empty() {
            self.mounts = Some(Box::new(plan));
        }
        Ok(self)
    }

    /// Add `policy`'s overlay to an unsandboxed preparation (an approved
    /// bypass of a staged call: the rules are lifted, the staging is not).
    pub fn with_overlay(mut self, policy: &SandboxPolicy) -> Result<Self, SandboxError> {
        #[cfg(target_os = "linux")]
        if let Some(dirs) = &policy.overlay {
            if !self.pid_namespace {
                return Err(SandboxError::Overlay(
                    "the call cannot get its own mount namespace here (see `cairn tools`)".into(),
                ));
            }
            self.overlay = Some(overlay_mount_args(&policy.cwd, dirs, userxattr())?);
            self.overlay_access = 0;
        }
        #[cfg(not(target_os = "linux"))]
        if policy.overlay.is_some() {
            return Err(SandboxError::Overlay("overlays exist only on Linux".into()));
        }
        Ok(self)
    }

    /// The raw values for the child hook.
    pub fn hook(&self) -> ChildHook {
        ChildHook {
            ruleset_fd: self.ruleset.as_ref().map_or(-1, |f| f.as_raw_fd()),
            cgroup_fd: self.cgroup.as_ref().map_or(-1, |c| c.procs.as_raw_fd()),
            filters: self.filters.iter().map(|f| (f.len() as u16, f.as_ptr())).collect(),
            pid_namespace: self.pid_namespace,
            proc_access: self.proc_access,
            overlay_target: self.overlay.as_ref().map_or(std::ptr::null(), |(t, _)| t.as_ptr()),
            overlay_options: self.overlay.as_ref().map_or(std::ptr::null(), |(_, o)| o.as_ptr()),
            overlay_access: self.overlay_access,
            uid_map: self.user_maps.as_ref().map_or((std::ptr::null(), 0), |m| (m.uid_map.as_ptr(), m.uid_map.len())),
            gid_map: self.user_maps.as_ref().map_or((std::ptr::null(), 0), |m| (m.gid_map.as_ptr(), m.gid_map.len())),
            mounts: self.mounts.as_deref().map_or(std::ptr::null(), |m| m as *const MountPlan),
        }
    }

    /// The pids cgroup of this call, if one was created.
    pub fn cgroup(&self) -> Option<&PidsCgroup> {
        self.cgroup.as_ref()
    }

    /// Whether the call runs in its own PID namespace.
    pub fn pid_namespace(&self) -> bool {
        self.pid_namespace
    }
}

impl ChildHook {
    /// Apply the sandbox to the calling (forked, single-threaded) process,
    /// in this order:
    /// 0. mark every descriptor above 2 close-on-exec;
    /// 1. die with cairn (`PR_SET_PDEATHSIG`), join the call's pids cgroup;
    /// 2. with a PID namespace: `unshare(CLONE_NEWPID | CLONE_NEWNS)` (not
    ///    root: `CLONE_NEWUSER` too, and the uid/gid maps) and fork; this
    ///    process stays outside as a waiter that closes every fd and exits
    ///    with the tool's status, the new child (PID 1 inside) makes mounts
    ///    private, mounts a fresh `/proc` (only the call's own processes are
    ///    visible; cairn is not), the overlay, the private `/tmp` and the
    ///    covers over hidden paths, and goes on;
    /// 3. drop every capability: securebits `NOROOT` (locked) so a root tool
    ///    gains none at `exec`, the bounding set, the ambient set, then
    ///    effective/permitted/inheritable via `capset`;
    /// 4. `PR_SET_NO_NEW_PRIVS`, the Landlock ruleset (when sandboxed), the
    ///    seccomp filters (always at least `ptrace`, `process_vm_readv`,
    ///    `process_vm_writev`, `pidfd_getfd` and device `mknod` refused).
    ///
    /// # Safety
    /// Call only in the child between `fork` and `exec` (`pre_exec`): it
    /// issues raw syscalls and allocates nothing.
    pub unsafe fn apply(&self) -> std::io::Result<()> {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: plain syscalls with valid arguments; the kernel copies
            // the filter memory, which the parent keeps alive.
            unsafe {
                close_inherited_fds();
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if self.cgroup_fd >= 0 {
                    let zero = b"0";
                    if libc::write(self.cgroup_fd, zero.as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if self.pid_namespace {
                    self.enter_pid_namespace()?;
                }
                drop_capabilities()?;
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if self.ruleset_fd >= 0 && libc::syscall(libc::SYS_landlock_restrict_self, self.ruleset_fd, 0u32) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                for &(len, ptr) in &self.filters {
                    let prog = libc::sock_fprog { len, filter: ptr as *mut libc::sock_filter };
                    if libc::syscall(
                        libc::SYS_seccomp,
                        libc::SECCOMP_SET_MODE_FILTER,
                        0u32,
                        &prog as *const libc::sock_fprog,
                    ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
            }
            Ok(())
        }
        #[cfg(not(target_os = "linux"))]
        {
            Ok(())
        }
    }

    /// Step 2 of [`ChildHook::apply`]: returns only in the new namespace's
    /// first process; the process that called it waits and exits.
    ///
    /// # Safety
    /// As [`ChildHook::apply`].
    #[cfg(target_os = "linux")]
    unsafe fn enter_pid_namespace(&self) -> std::io::Result<()> {
        // SAFETY: raw syscalls only; the waiter never returns into the
        // caller's code (it leaves with _exit).
        unsafe {
            if self.uid_map.0.is_null() {
                if libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else {
                enter_user_namespace(
                    std::slice::from_raw_parts(self.uid_map.0, self.uid_map.1),
                    std::slice::from_raw_parts(self.gid_map.0, self.gid_map.1),
                )?;
            }
            // Entering a user namespace may clear the parent-death signal.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let pid = libc::fork();
            if pid < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if pid > 0 {
                // The waiter (the process cairn sees, the group leader):
                // hold no pipe end the tool's readers or the spawn's error
                // pipe wait on, then pass the tool's status on. It keeps
                // PR_SET_PDEATHSIG; when it dies, PID 1 inside gets SIGKILL
                // and the kernel kills the whole namespace.
                if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
                    for fd in 0..1024 {
                        libc::close(fd);
                    }
                }
                let code = wait_exit_code(pid);
                libc::_exit(code);
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            mount_fresh_proc()?;
            // The ruleset's /proc rule names the host's procfs; the fresh
            // one is another filesystem and needs its own rule.
            if self.ruleset_fd >= 0 && self.proc_access != 0 {
                let fd = libc::open(c"/proc".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let attr = LandlockPathBeneath { allowed_access: self.proc_access, parent_fd: fd };
                const LANDLOCK_RULE_PATH_BENEATH: u32 = 1;
                let r = libc::syscall(
                    libc::SYS_landlock_add_rule,
                    self.ruleset_fd,
                    LANDLOCK_RULE_PATH_BENEATH,
                    &attr as *const LandlockPathBeneath,
                    0u32,
                );
                libc::close(fd);
                if r != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if !self.overlay_target.is_null() {
                self.mount_overlay()?;
            }
            if !self.mounts.is_null() {
                apply_mounts(&*self.mounts, self.ruleset_fd)?;
            }
        }
        Ok(())
    }

    /// Staged execution, inside the new mount namespace: mount the overlay
    /// over the working directory, move into it (the spawn's `chdir` went
    /// to the directory below), and give the ruleset a rule for the overlay
    /// (another file system: the rule on the real directory does not reach
    /// it).
    ///
    /// # Safety
    /// As [`ChildHook::apply`]; the pointers are valid NUL-terminated
    /// strings owned by `Prepared`.
    #[cfg(target_os = "linux")]
    unsafe fn mount_overlay(&self) -> std::io::Result<()> {
        // SAFETY: raw syscalls with valid NUL-terminated strings.
        unsafe {
            if libc::mount(
                c"overlay".as_ptr(),
                self.overlay_target,
                c"overlay".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                self.overlay_options.cast(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::chdir(self.overlay_target) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if self.ruleset_fd >= 0 && self.overlay_access != 0 {
                let fd = libc::open(self.overlay_target, libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let attr = LandlockPathBeneath { allowed_access: self.overlay_access, parent_fd: fd };
                const LANDLOCK_RULE_PATH_BENEATH: u32 = 1;
                let r = libc::syscall(
                    libc::SYS_landlock_add_rule,
                    self.ruleset_fd,
                    LANDLOCK_RULE_PATH_BENEATH,
                    &attr as *const LandlockPathBeneath,
                    0u32,
                );
                libc::close(fd);
                if r != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

/// The overlay's target and mount options, built in the parent. Paths
/// overlayfs cannot take in its option string (`,`, `:`, `\\`, a NUL) are
/// refused: staging them is not possible, and saying so beats guessing.
#[cfg(target_os = "linux")]
fn overlay_mount_args(
    cwd: &Path,
    dirs: &OverlayDirs,
    userxattr: bool,
) -> Result<(std::ffi::CString, std::ffi::CString), SandboxError> {
    use std::os::unix::ffi::OsStrExt;
    let plain = |p: &Path| -> Result<String, SandboxError> {
        let text = p.to_str().ok_or_else(|| SandboxError::Overlay(format!("{} is not UTF-8", p.display())))?;
        if text.contains([',', ':', '\\', '\0']) || !p.is_absolute() {
            return Err(SandboxError::Overlay(format!(
                "{text} holds a character overlayfs cannot take in a mount option (`,`, `:` or `\\`), or is relative"
            )));
        }
        Ok(text.to_owned())
    };
    let options = format!(
        "lowerdir={},upperdir={},workdir={},{}",
        plain(cwd)?,
        plain(&dirs.upper)?,
        plain(&dirs.work)?,
        overlay_flags(userxattr)
    );
    let target = std::ffi::CString::new(cwd.as_os_str().as_bytes())
        .map_err(|_| SandboxError::Overlay("the working directory holds a NUL byte".into()))?;
    let options = std::ffi::CString::new(options)
        .map_err(|_| SandboxError::Overlay("an overlay path holds a NUL byte".into()))?;
    Ok((target, options))
}

/// Whether overlays here are mounted from a user namespace (`userxattr`).
fn userxattr() -> bool {
    matches!(namespace_mode(), Ok(NamespaceMode::UserNamespace))
}

/// The overlay options cairn always passes after the directories; from a
/// user namespace overlayfs needs `userxattr` (its opaque-directory marks
/// are then `user.overlay.*` xattrs, which the change-set reader checks),
/// which implies `redirect_dir=nofollow` and `metacopy=off` and refuses an
/// explicit `redirect_dir=off` (that means "follow" on this kernel).
pub(crate) fn overlay_flags(userxattr: bool) -> &'static str {
    if userxattr { "index=off,xino=off,userxattr" } else { "redirect_dir=off,metacopy=off,index=off,xino=off" }
}

fn c_path(p: &Path) -> Result<std::ffi::CString, SandboxError> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| SandboxError::Mounts(format!("{} holds a NUL byte", p.display())))
}

/// The mounts of [`Prepared::with_mounts`], built in the parent.
fn mount_plan(
    cwd: &Path,
    policy: Option<&SandboxPolicy>,
    program: Option<&Path>,
    hidden: &[PathBuf],
    private_tmp: bool,
) -> Result<MountPlan, SandboxError> {
    let canon = |p: &Path| std::fs::canonicalize(p).ok();
    // The call's own paths, with whether it may write them.
    let bypass = policy.is_none_or(|p| p.bypass);
    let mut needed: Vec<(PathBuf, bool)> = Vec::new();
    needed.push((cwd.to_path_buf(), bypass || policy.is_some_and(|p| p.write_cwd)));
    if let Some(p) = policy {
        if let Some(t) = &p.tmp_dir {
            needed.push((t.clone(), bypass || p.write_cwd));
        }
        needed.extend(p.extra_read.iter().map(|e| (e.clone(), bypass)));
        needed.extend(p.extra_write.iter().map(|e| (e.clone(), true)));
    }
    if let Some(dir) = program.filter(|p| p.is_absolute()).and_then(Path::parent) {
        needed.push((dir.to_path_buf(), bypass));
    }
    let mut needed: Vec<(PathBuf, bool)> = needed.into_iter().filter_map(|(p, w)| canon(&p).map(|c| (c, w))).collect();
    needed.sort();
    needed.dedup_by(|a, b| {
        a.0 == b.0 && {
            b.1 |= a.1;
            true
        }
    });
    let mut plan = MountPlan { cwd: Some(c_path(cwd)?), ..MountPlan::default() };
    let tmp = Path::new("/tmp");
    if private_tmp && canon(tmp).as_deref() == Some(tmp) && !needed.iter().any(|(p, _)| tmp.starts_with(p)) {
        #[cfg(target_os = "linux")]
        let access = policy.filter(|p| p.write_cwd && !p.bypass).map_or(0, |_| linux::write_access());
        #[cfg(not(target_os = "linux"))]
        let access = 0;
        plan.covers.push(cover(tmp, true, access, true, &needed)?);
    }
    for h in hidden {
        let Some(h) = canon(h) else { continue };
        if h.is_dir() {
            // The working directory itself cannot be covered (the host
            // hides the sockets in it instead).
            if needed.iter().any(|(p, _)| *p == h) || h == Path::new("/") {
                continue;
            }
            plan.covers.push(cover(&h, false, 0, false, &needed)?);
        } else {
            plan.masks.push(c_path(&h)?);
        }
    }
    Ok(plan)
}

fn cover(
    target: &Path,
    writable: bool,
    access: u64,
    optional: bool,
    needed: &[(PathBuf, bool)],
) -> Result<Cover, SandboxError> {
    let mut keeps = Vec::new();
    // Sorted: an ancestor is moved back before what it contains.
    for (path, write) in needed.iter().filter(|(p, _)| p.starts_with(target) && p != target) {
        let is_dir = path.is_dir();
        let mut dirs = Vec::new();
        let rel = path.strip_prefix(target).unwrap_or(path);
        let mut at = target.to_path_buf();
        let count = rel.components().count();
        for (i, c) in rel.components().enumerate() {
            at.push(c);
            if i + 1 < count || is_dir {
                dirs.push(c_path(&at)?);
            }
        }
        // Landlock rights add up along a path: under a cover with a write
        // rule (the private /tmp of a writing call), a kept path the call
        // may not write is re-exposed read-only. Elsewhere Landlock alone
        // decides, as it does on the host.
        keeps.push(Keep { path: c_path(path)?, dirs, is_dir, read_only: !write && access != 0 });
    }
    if keeps.len() > MAX_KEEPS {
        return Err(SandboxError::Mounts(format!(
            "more than {MAX_KEEPS} paths of the call lie under {}",
            target.display()
        )));
    }
    Ok(Cover { target: c_path(target)?, writable, access, optional, keeps })
}

/// `struct mount_attr` (`mount_setattr(2)`).
#[cfg(target_os = "linux")]
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Make the mounts of `plan` (see [`MountPlan`]), then `chdir` back into
/// the working directory.
///
/// # Safety
/// As [`ChildHook::apply`]; `plan` is alive and unmoved.
#[cfg(target_os = "linux")]
unsafe fn apply_mounts(plan: &MountPlan, ruleset_fd: i32) -> std::io::Result<()> {
    // SAFETY: raw syscalls with valid NUL-terminated strings.
    unsafe {
        for c in &plan.covers {
            apply_cover(c, ruleset_fd)?;
        }
        for mask in &plan.masks {
            if libc::mount(c"/dev/null".as_ptr(), mask.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0
            {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ENOENT) {
                    return Err(e);
                }
            }
        }
        if let Some(cwd) = &plan.cwd
            && libc::chdir(cwd.as_ptr()) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One [`Cover`]: clone what it keeps, mount the tmpfs, put the clones back
/// (read-only where they are not written), then make the tmpfs read-only
/// or give it its Landlock rule.
///
/// # Safety
/// As [`apply_mounts`].
#[cfg(target_os = "linux")]
unsafe fn apply_cover(c: &Cover, ruleset_fd: i32) -> std::io::Result<()> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    const MOUNT_ATTR_RDONLY: u64 = 1;
    let err = std::io::Error::last_os_error;
    let mut fds = [-1i32; MAX_KEEPS];
    let close_all = |fds: &[i32; MAX_KEEPS]| {
        for &fd in fds.iter().filter(|fd| **fd >= 0) {
            // SAFETY: fds this function opened.
            unsafe { libc::close(fd) };
        }
    };
    // SAFETY: raw syscalls with valid strings and local structs.
    unsafe {
        for (i, k) in c.keeps.iter().enumerate() {
            let fd = libc::syscall(
                libc::SYS_open_tree,
                libc::AT_FDCWD,
                k.path.as_ptr(),
                OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
            ) as i32;
            if fd < 0 {
                let e = err();
                match e.raw_os_error() {
                    // Not visible here: nothing to keep.
                    Some(libc::ENOENT) => continue,
                    Some(libc::ENOSYS) if c.optional => {
                        close_all(&fds);
                        return Ok(());
                    }
                    _ => {
                        close_all(&fds);
                        return Err(e);
                    }
                }
            }
            fds[i] = fd;
            if k.read_only {
                let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
                if libc::syscall(
                    libc::SYS_mount_setattr,
                    fd,
                    c"".as_ptr(),
                    libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
                    &attr as *const MountAttr,
                    std::mem::size_of::<MountAttr>(),
                ) != 0
                {
                    let e = err();
                    close_all(&fds);
                    return Err(e);
                }
            }
        }
        let options = if c.writable { c"mode=1777" } else { c"mode=0755,size=4k" };
        if libc::mount(
            c"tmpfs".as_ptr(),
            c.target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            options.as_ptr().cast(),
        ) != 0
        {
            let e = err();
            close_all(&fds);
            // Not visible in this namespace (under an earlier cover): there
            // is nothing to hide.
            return if e.raw_os_error() == Some(libc::ENOENT) { Ok(()) } else { Err(e) };
        }
        for (i, k) in c.keeps.iter().enumerate() {
            if fds[i] < 0 {
                continue;
            }
            for d in &k.dirs {
                libc::mkdir(d.as_ptr(), 0o755);
            }
            if !k.is_dir {
                let f = libc::open(k.path.as_ptr(), libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC, 0o644);
                if f >= 0 {
                    libc::close(f);
                }
            }
            if libc::syscall(
                libc::SYS_move_mount,
                fds[i],
                c"".as_ptr(),
                libc::AT_FDCWD,
                k.path.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            ) != 0
            {
                let e = err();
                close_all(&fds);
                return Err(e);
            }
        }
        close_all(&fds);
        if !c.writable
            && libc::mount(
                std::ptr::null(),
                c.target.as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                std::ptr::null(),
            ) != 0
        {
            return Err(err());
        }
        if ruleset_fd >= 0 && c.access != 0 {
            add_path_rule(ruleset_fd, c.target.as_ptr(), c.access)?;
        }
    }
    Ok(())
}

/// Add a Landlock path-beneath rule for `path` (opened `O_PATH`).
///
/// # Safety
/// Raw syscalls only; `path` is a valid NUL-terminated string.
#[cfg(target_os = "linux")]
unsafe fn add_path_rule(ruleset_fd: i32, path: *const libc::c_char, access: u64) -> std::io::Result<()> {
    // SAFETY: valid arguments for open and landlock_add_rule.
    unsafe {
        let fd = libc::open(path, libc::O_PATH | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let attr = LandlockPathBeneath { allowed_access: access, parent_fd: fd };
        const LANDLOCK_RULE_PATH_BENEATH: u32 = 1;
        let r = libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset_fd,
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const LandlockPathBeneath,
            0u32,
        );
        let e = std::io::Error::last_os_error();
        libc::close(fd);
        if r != 0 {
            return Err(e);
        }
    }
    Ok(())
}

/// `struct landlock_path_beneath_attr` (packed in the kernel's ABI).
#[cfg(target_os = "linux")]
#[repr(C, packed)]
struct LandlockPathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

/// `struct __user_cap_header_struct`.
#[cfg(target_os = "linux")]
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct` (two of them for 64 capabilities).
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Step 0 of [`ChildHook::apply`]: every descriptor above 2 the tool
/// would inherit — cairn's own, and whatever cairn itself inherited (a
/// directory fd would let `/proc/self/fd/N` walk around the overlay and
/// the Landlock rules) — is marked close-on-exec, so `exec` closes it.
/// Marked rather than closed: the spawn's error pipe and the hook's own
/// fds (ruleset, cgroup) must live until `exec`.
///
/// # Safety
/// Raw syscalls only; call between `fork` and `exec`.
#[cfg(target_os = "linux")]
unsafe fn close_inherited_fds() {
    // SAFETY: close_range and fcntl on descriptor numbers only.
    unsafe {
        if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) == 0 {
            return;
        }
        // No close_range (kernel < 5.11): every fd up to the limit.
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur.min(1 << 20) as i32
        } else {
            65536
        };
        for fd in 3..max {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// Step 3 of [`ChildHook::apply`]: leave the calling process (and what it
/// executes) with no capability at all, even when it runs as root.
///
/// # Safety
/// Raw syscalls only; call between `fork` and `exec`.
#[cfg(target_os = "linux")]
unsafe fn drop_capabilities() -> std::io::Result<()> {
    const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    const CAP_SETPCAP: u32 = 8;
    // SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE |
    // SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED.
    const SECUREBITS: libc::c_ulong = 0x01 | 0x02 | 0x40 | 0x80;
    let err = std::io::Error::last_os_error;
    // SAFETY: capget/capset/prctl with valid pointers to local structs.
    unsafe {
        let mut header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
        let mut data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
        if libc::syscall(libc::SYS_capget, &mut header as *mut CapHeader, data.as_mut_ptr()) != 0 {
            return Err(err());
        }
        // Without CAP_SETPCAP there is no bounding set to clear that could
        // matter: NO_NEW_PRIVS (set next) keeps exec from adding any.
        if data[0].effective & (1 << CAP_SETPCAP) != 0 {
            if libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0) != 0 {
                return Err(err());
            }
            for cap in 0..64 {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                    if err().raw_os_error() == Some(libc::EINVAL) {
                        break; // past the last capability this kernel knows
                    }
                    return Err(err());
                }
            }
        }
        if libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0
            && err().raw_os_error() != Some(libc::EINVAL)
        {
            return Err(err());
        }
        let header = CapHeader { version: CAPABILITY_VERSION_3, pid: 0 };
        let none = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
        if libc::syscall(libc::SYS_capset, &header as *const CapHeader, none.as_ptr()) != 0 {
            return Err(err());
        }
    }
    Ok(())
}

/// A per-call pids cgroup (cgroup v1 `pids` controller, or a cgroup v2
/// child group with `pids` enabled): caps the process count and lists every
/// process of the call, even those that left its process group.
#[derive(Debug)]
pub struct PidsCgroup {
    dir: PathBuf,
    procs: File,
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

    fn describe(&self) -> String {
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
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER"
        let (before, after) = line.split_once(" - ")?;
        let fstype = after.split_whitespace().next()?;
        (fstype == "cgroup2").then(|| before.split_whitespace().nth(4).map(PathBuf::from)).flatten()
    })
}

/// The calling process's cgroup v2 path (`0::/path` in `/proc/self/cgroup`).
fn cgroup2_own_path(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(|p| p.trim().to_string())
}

fn has_word(text: &str, word: &str) -> bool {
    text.split_whitespace().any(|w| w == word)
}

/// Cairn's own cgroup v2 group, made ready for per-call child groups with
/// `pids`, or why that is impossible.
fn v2_root() -> Result<PathBuf, String> {
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
fn enable_v2_pids(dir: &Path) -> std::io::Result<()> {
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
fn sweep_stale(root: &Path) {
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

fn is_writable_dir(dir: &Path) -> bool {
    let probe = dir.join(format!("cairn-probe-{}", std::process::id()));
    if std::fs::create_dir(&probe).is_ok() {
        let _ = std::fs::remove_dir(&probe);
        true
    } else {
        false
    }
}

impl PidsCgroup {
    fn create(max: u32) -> Option<Self> {
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

#[cfg(target_os = "linux")]
mod linux {
    use super::{RawFilter, SandboxError, SandboxPolicy};
    use landlock::{
        ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
        Scope,
    };
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
        TargetArch,
    };
    use std::collections::BTreeMap;
    use std::os::fd::OwnedFd;
    use std::path::Path;

    /// The ABI whose rights cairn asks for (tested here); newer kernels keep
    /// these semantics, older ones get the best they can enforce.
    const ABI_TARGET: ABI = ABI::V6;

    const SYSTEM_READ: &[&str] =
        &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys"];
    const DEV_RW: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];
    const DEV_R: &[&str] = &["/dev/urandom", "/dev/random"];
    const NET_CONFIG: &[&str] = &["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf"];

    fn ll(e: impl std::fmt::Display) -> SandboxError {
        SandboxError::Landlock(e.to_string())
    }

    pub(super) fn ruleset(policy: &SandboxPolicy) -> Result<OwnedFd, SandboxError> {
        let all = AccessFs::from_all(ABI_TARGET);
        let read = AccessFs::from_read(ABI_TARGET);
        let read_write_dir = all;
        let file_rw: BitFlags<AccessFs> = AccessFs::ReadFile | AccessFs::WriteFile;
        let mut ruleset = Ruleset::default().handle_access(all).map_err(ll)?;
        if !policy.network {
            ruleset = ruleset.handle_access(AccessNet::from_all(ABI_TARGET)).map_err(ll)?;
        }
        ruleset = ruleset.scope(Scope::from_all(ABI_TARGET)).map_err(ll)?;
        let mut created = ruleset.create().map_err(ll)?;

        let mut add = |path: &Path, access: BitFlags<AccessFs>| -> Result<(), SandboxError> {
            let Ok(fd) = PathFd::new(path) else { return Ok(()) };
            // A file gets only the rights that apply to files.
            let access = if path.is_dir() { access } else { access & AccessFs::from_file(ABI_TARGET) };
            (&mut created).add_rule(PathBeneath::new(fd, access)).map(|_| ()).map_err(ll)
        };
        for p in SYSTEM_READ {
            add(Path::new(p), read)?;
        }
        for p in DEV_RW {
            add(Path::new(p), file_rw)?;
        }
        for p in DEV_R {
            add(Path::new(p), AccessFs::ReadFile.into())?;
        }
        if policy.network {
            // Name resolution: these are often symlinks into /run (systemd
            // resolved); the rule lands on the file they point to.
            for p in NET_CONFIG {
                add(Path::new(p), AccessFs::ReadFile.into())?;
            }
        }
        if policy.write_cwd {
            add(&policy.cwd, read_write_dir)?;
        } else if policy.read_cwd {
            add(&policy.cwd, read)?;
        }
        if let Some(tmp) = &policy.tmp_dir {
            add(tmp, if policy.write_cwd { read_write_dir } else { read })?;
        }
        for p in &policy.extra_read {
            add(p, read)?;
        }
        for p in &policy.extra_write {
            add(p, read_write_dir)?;
        }
        let fd: Option<OwnedFd> = created.into();
        fd.ok_or_else(|| SandboxError::Landlock("this kernel does not support Landlock".into()))
    }

    #[cfg(target_arch = "x86_64")]
    const ARCH: Option<TargetArch> = Some(TargetArch::x86_64);
    #[cfg(target_arch = "aarch64")]
    const ARCH: Option<TargetArch> = Some(TargetArch::aarch64);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    const ARCH: Option<TargetArch> = None;

    fn sc(e: impl std::fmt::Display) -> SandboxError {
        SandboxError::Seccomp(e.to_string())
    }

    fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<Vec<RawFilter>, SandboxError> {
        let arch = ARCH.ok_or_else(|| SandboxError::Seccomp("unsupported CPU architecture".into()))?;
        let filter =
            SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno as u32), arch).map_err(sc)?;
        let prog: BpfProgram = filter.try_into().map_err(sc)?;
        Ok(prog.iter().map(|f| RawFilter { code: f.code, jt: f.jt, jf: f.jf, k: f.k }).collect())
    }

    /// A ruleset that handles only `MakeBlock` and allows it nowhere: no
    /// file or network rule in practice, but a Landlock domain, which scopes
    /// ptrace-class access to the domain. `None` without Landlock.
    pub(super) fn scope_only_ruleset() -> Option<OwnedFd> {
        let created = Ruleset::default().handle_access(AccessFs::MakeBlock).ok()?.create().ok()?;
        created.into()
    }

    /// The Landlock rights the system directories (and so `/proc`) get.
    pub(super) fn proc_access() -> u64 {
        AccessFs::from_read(ABI_TARGET).bits()
    }

    /// The Landlock rights a writable working directory gets (so its
    /// overlay gets the same).
    pub(super) fn write_access() -> u64 {
        // Only what this kernel handles: a rule naming more is refused.
        let kernel = ABI::from(super::landlock_abi() as i32);
        (AccessFs::from_all(ABI_TARGET) & AccessFs::from_all(kernel)).bits()
    }

    /// Rules every tool process gets, sandboxed or not: no reading or
    /// writing another process's memory (`ptrace`, `process_vm_readv`,
    /// `process_vm_writev`), no stealing its file descriptors
    /// (`pidfd_getfd`), no device nodes (`mknod`/`mknodat` of a character
    /// or block device; FIFOs and plain files stay allowed).
    fn hardening(eperm: &mut BTreeMap<i64, Vec<SeccompRule>>) -> Result<(), SandboxError> {
        for nr in [libc::SYS_ptrace, libc::SYS_process_vm_readv, libc::SYS_process_vm_writev, libc::SYS_pidfd_getfd] {
            eperm.insert(nr, vec![]);
        }
        let device = |arg: u8| -> Result<Vec<SeccompRule>, SandboxError> {
            [libc::S_IFCHR, libc::S_IFBLK]
                .into_iter()
                .map(|kind| {
                    let cond = SeccompCondition::new(
                        arg,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::MaskedEq(libc::S_IFMT as u64),
                        kind as u64,
                    )
                    .map_err(sc)?;
                    SeccompRule::new(vec![cond]).map_err(sc)
                })
                .collect()
        };
        eperm.insert(libc::SYS_mknodat, device(2)?);
        #[cfg(target_arch = "x86_64")]
        eperm.insert(libc::SYS_mknod, device(1)?);
        Ok(())
    }

    /// The seccomp programs for `policy` (`None`: unsandboxed, only the
    /// hardening rules).
    pub(super) fn filters(policy: Option<&SandboxPolicy>) -> Result<Vec<Vec<RawFilter>>, SandboxError> {
        let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        let mut enosys: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        hardening(&mut eperm)?;
        let Some(policy) = policy else {
            return Ok(vec![compile(eperm, libc::EPERM)?]);
        };
        if !policy.network {
            let not_unix = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, libc::AF_UNIX as u64)
                .map_err(sc)?;
            eperm.insert(libc::SYS_socket, vec![SeccompRule::new(vec![not_unix]).map_err(sc)?]);
            eperm.insert(libc::SYS_io_uring_setup, vec![]);
        }
        if !policy.process_spawn {
            let no_thread =
                SeccompCondition::new(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64), 0)
                    .map_err(sc)?;
            eperm.insert(libc::SYS_clone, vec![SeccompRule::new(vec![no_thread]).map_err(sc)?]);
            #[cfg(target_arch = "x86_64")]
            {
                eperm.insert(libc::SYS_fork, vec![]);
                eperm.insert(libc::SYS_vfork, vec![]);
            }
            enosys.insert(libc::SYS_clone3, vec![]);
        }
        let mut out = Vec::new();
        if !eperm.is_empty() {
            out.push(compile(eperm, libc::EPERM)?);
        }
        if !enosys.is_empty() {
            out.push(compile(enosys, libc::ENOSYS)?);
        }
        Ok(out)
    }
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
