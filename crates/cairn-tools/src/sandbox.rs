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
//! - with `ProcessSpawn`, a pids cgroup (when cairn may create one) caps the
//!   number of processes of the call;
//! - signals and abstract unix sockets are scoped to the sandbox (ABI ≥ 6);
//! - nothing else: `$HOME`, `/tmp`, other users' files are invisible.
//!
//! Known gap: connecting to a *pathname* unix socket (e.g.
//! `/var/run/docker.sock`) is not a file access Landlock checks before ABI 9
//! (`ResolveUnix`), and `AF_UNIX` sockets stay allowed by seccomp; cairn asks
//! for ABI 6 rights (the newest it was tested with).

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
    /// Signal and abstract-socket scoping (ABI ≥ 6).
    pub scoping: bool,
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
        format!(
            "Landlock ABI {} (filesystem: yes, TCP rules: {}, scoping: {}), seccomp: {}, pids cgroup: {}",
            self.landlock_abi,
            yes(self.network_landlock),
            yes(self.scoping),
            yes(self.seccomp),
            yes(self.pids_cgroup)
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
        pids_cgroup: pids_cgroup_root().is_some(),
        scoping: abi >= 6,
    }
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
}

/// Everything the child needs, built in the parent.
#[derive(Debug, Default)]
pub struct Prepared {
    ruleset: Option<OwnedFd>,
    filters: Vec<Vec<RawFilter>>,
    cgroup: Option<PidsCgroup>,
}

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
}

// SAFETY: the pointers point into `Prepared::filters`, which the caller keeps
// alive (and unmoved: the inner Vecs' heap buffers do not move) until the
// spawn returns; the hook only reads them in the forked child.
unsafe impl Send for ChildHook {}
// SAFETY: see `Send`; the data is never mutated.
unsafe impl Sync for ChildHook {}

impl Prepared {
    /// Build the ruleset, filters and cgroup for `policy`.
    pub fn new(policy: &SandboxPolicy) -> Result<Self, SandboxError> {
        #[cfg(target_os = "linux")]
        {
            let ruleset = Some(linux::ruleset(policy)?);
            let filters = linux::filters(policy)?;
            let cgroup = if policy.process_spawn { PidsCgroup::create(policy.max_processes) } else { None };
            Ok(Self { ruleset, filters, cgroup })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = policy;
            Err(SandboxError::Landlock("Landlock exists only on Linux".into()))
        }
    }

    /// Only process bookkeeping (a pids cgroup), no Landlock or seccomp: for
    /// explicitly unsandboxed runs.
    pub fn unsandboxed(max_processes: u32) -> Self {
        Self { ruleset: None, filters: Vec::new(), cgroup: PidsCgroup::create(max_processes) }
    }

    /// The raw values for the child hook.
    pub fn hook(&self) -> ChildHook {
        ChildHook {
            ruleset_fd: self.ruleset.as_ref().map_or(-1, |f| f.as_raw_fd()),
            cgroup_fd: self.cgroup.as_ref().map_or(-1, |c| c.procs.as_raw_fd()),
            filters: self.filters.iter().map(|f| (f.len() as u16, f.as_ptr())).collect(),
        }
    }

    /// The pids cgroup of this call, if one was created.
    pub fn cgroup(&self) -> Option<&PidsCgroup> {
        self.cgroup.as_ref()
    }
}

impl ChildHook {
    /// Apply the sandbox to the calling (forked, single-threaded) process.
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
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if self.cgroup_fd >= 0 {
                    let zero = b"0";
                    if libc::write(self.cgroup_fd, zero.as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if self.ruleset_fd < 0 && self.filters.is_empty() {
                    return Ok(());
                }
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
}

/// A per-call pids cgroup (cgroup v1 `pids` controller or cgroup v2 with
/// `pids` enabled): caps the process count and lists every process of the
/// call, even those that left its process group.
#[derive(Debug)]
pub struct PidsCgroup {
    dir: PathBuf,
    procs: File,
}

/// The cgroup v1 `pids` hierarchy when cairn may create groups in it
/// (probed once per process).
fn pids_cgroup_root() -> Option<PathBuf> {
    static ROOT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let v1 = Path::new("/sys/fs/cgroup/pids");
        let usable = v1.join("cgroup.procs").exists() && is_writable_dir(v1);
        if usable {
            sweep_stale(v1);
        }
        usable.then(|| v1.to_path_buf())
    })
    .clone()
}

/// Remove empty `cairn-<pid>-<n>` groups left by cairn processes that died
/// before cleaning up.
fn sweep_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("cairn-").and_then(|r| r.split('-').next()) else { continue };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
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
        let root = pids_cgroup_root()?;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!("cairn-{}-{n}", std::process::id()));
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

    pub(super) fn filters(policy: &SandboxPolicy) -> Result<Vec<Vec<RawFilter>>, SandboxError> {
        let mut eperm: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        let mut enosys: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
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
            scoping: false,
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
    fn this_kernel_reports_landlock() {
        let s = landlock_status();
        assert!(s.landlock_abi >= 1, "the test machines have Landlock: {}", s.describe());
    }
}
