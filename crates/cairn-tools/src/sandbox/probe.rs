//! What the running kernel can enforce, and the probes that find out:
//! Landlock's ABI, whether a PID and mount namespace can be made (as root,
//! or through an unprivileged user namespace), and the host process's own
//! protection (non-dumpable). It also holds the few raw steps the probes
//! and the child hook share (entering a user namespace, mounting a fresh
//! `/proc`, waiting for a child). It must not decide what a tool may do.

use super::*;

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

pub(super) fn yes(b: bool) -> &'static str {
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
pub(super) unsafe fn write_proc_file(path: &std::ffi::CStr, data: &[u8]) -> std::io::Result<()> {
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
pub(super) fn userns_blocker() -> Option<String> {
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
pub(super) fn probe_namespaces() -> Result<NamespaceMode, String> {
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
pub(super) fn probe_namespaces() -> Result<NamespaceMode, String> {
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
pub(super) fn probe_pid_namespace(maps: Option<&UserMaps>) -> Result<(), String> {
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
pub(super) unsafe fn wait_exit_code(pid: libc::pid_t) -> i32 {
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
pub(super) unsafe fn mount_fresh_proc() -> std::io::Result<()> {
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
