//! The child hook: what is built in the parent before `fork` (the Landlock
//! ruleset fd, the seccomp programs, the mount plan: covers, keeps, the
//! private `/tmp`, the overlay) and the raw, async-signal-safe syscalls the
//! child issues between `fork` and `exec` (closing inherited descriptors,
//! dropping capabilities, the namespaces and mounts, then Landlock and
//! seccomp). It must not allocate in the child.

use super::*;

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
    /// Files bind-mounted over themselves read-only
    /// ([`SandboxPolicy::read_only_files`]).
    pins: Vec<std::ffi::CString>,
    /// Where to `chdir` once everything is mounted (the working directory,
    /// possibly re-exposed under a cover).
    cwd: Option<std::ffi::CString>,
}

/// A tmpfs mounted over `target`, with paths beneath it that stay visible
/// (`keeps`: cloned before the tmpfs covers them, moved back after).
#[derive(Debug)]
pub(super) struct Cover {
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
pub(super) struct Keep {
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
pub(super) const MAX_KEEPS: usize = 32;

/// One BPF instruction (layout of `struct sock_filter`).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(super) struct RawFilter {
    pub(super) code: u16,
    pub(super) jt: u8,
    pub(super) jf: u8,
    pub(super) k: u32,
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
        if !plan.covers.is_empty() || !plan.masks.is_empty() || !plan.pins.is_empty() {
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
    /// 0. mark every descriptor above 2 close-on-exec, and start a new
    ///    session (`setsid`): the process leads its own session and
    ///    process group and has no controlling terminal, so neither it nor
    ///    anything it starts can open `/dev/tty` and push input into
    ///    cairn's terminal with `TIOCSTI`, whatever its sandbox (a bypassed
    ///    call, a hook and an MCP server too); cairn kills the call by
    ///    that group;
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
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
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
pub(super) fn overlay_mount_args(
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
        overlay_flags(userxattr, crate::staging::overlay_volatile())
    );
    let target = std::ffi::CString::new(cwd.as_os_str().as_bytes())
        .map_err(|_| SandboxError::Overlay("the working directory holds a NUL byte".into()))?;
    let options = std::ffi::CString::new(options)
        .map_err(|_| SandboxError::Overlay("an overlay path holds a NUL byte".into()))?;
    Ok((target, options))
}

/// Whether overlays here are mounted from a user namespace (`userxattr`).
pub(super) fn userxattr() -> bool {
    matches!(namespace_mode(), Ok(NamespaceMode::UserNamespace))
}

/// The overlay options cairn always passes after the directories; from a
/// user namespace overlayfs needs `userxattr` (its opaque-directory marks
/// are then `user.overlay.*` xattrs, which the change-set reader checks),
/// which implies `redirect_dir=nofollow` and `metacopy=off` and refuses an
/// explicit `redirect_dir=off` (that means "follow" on this kernel).
/// With `volatile` (where the probe mounted it,
/// `staging::overlay_volatile`), overlayfs never syncs the staging
/// layer's file system, at unmount or on a tool's `fsync`: cairn syncs
/// the layer itself before recording a change set.
pub(crate) fn overlay_flags(userxattr: bool, volatile: bool) -> String {
    let base =
        if userxattr { "index=off,xino=off,userxattr" } else { "redirect_dir=off,metacopy=off,index=off,xino=off" };
    if volatile { format!("{base},volatile") } else { base.to_owned() }
}

pub(super) fn c_path(p: &Path) -> Result<std::ffi::CString, SandboxError> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| SandboxError::Mounts(format!("{} holds a NUL byte", p.display())))
}

/// The mounts of [`Prepared::with_mounts`], built in the parent.
pub(super) fn mount_plan(
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
    for f in policy.map(|p| p.read_only_files.as_slice()).unwrap_or_default() {
        plan.pins.push(c_path(f)?);
    }
    Ok(plan)
}

pub(super) fn cover(
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
pub(super) struct MountAttr {
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
pub(super) unsafe fn apply_mounts(plan: &MountPlan, ruleset_fd: i32) -> std::io::Result<()> {
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
        for pin in &plan.pins {
            if libc::mount(pin.as_ptr(), pin.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOENT) {
                    continue; // gone since it was found: nothing to write through
                }
                return Err(e);
            }
            // Read-only without touching the mount's other (possibly
            // locked) flags.
            const MOUNT_ATTR_RDONLY: u64 = 1;
            let attr = MountAttr { attr_set: MOUNT_ATTR_RDONLY, attr_clr: 0, propagation: 0, userns_fd: 0 };
            if libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                pin.as_ptr(),
                0u32,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
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
pub(super) unsafe fn apply_cover(c: &Cover, ruleset_fd: i32) -> std::io::Result<()> {
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
pub(super) unsafe fn add_path_rule(ruleset_fd: i32, path: *const libc::c_char, access: u64) -> std::io::Result<()> {
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
pub(super) struct LandlockPathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

/// `struct __user_cap_header_struct`.
#[cfg(target_os = "linux")]
#[repr(C)]
pub(super) struct CapHeader {
    version: u32,
    pid: i32,
}

/// `struct __user_cap_data_struct` (two of them for 64 capabilities).
#[cfg(target_os = "linux")]
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct CapData {
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
pub(super) unsafe fn close_inherited_fds() {
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
pub(super) unsafe fn drop_capabilities() -> std::io::Result<()> {
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
