//! Capabilities → kernel rules: the Landlock ruleset (files, TCP, scopes;
//! `/etc` by entries, its secrets left out) and the seccomp programs (no new processes without `ProcessSpawn`, no
//! sockets but `AF_UNIX` without `Network`, the always-on denials). Built
//! in the parent; applied by the child hook.

use super::{RawFilter, SandboxError, SandboxPolicy};
use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// The ABI whose rights cairn asks for (tested here); newer kernels keep
/// these semantics, older ones get the best they can enforce.
const ABI_TARGET: ABI = ABI::V6;

const SYSTEM_READ: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/proc", "/sys"];
/// `/etc` is readable by entries ([`etc_reads`]), never whole.
const ETC: &str = "/etc";
/// Under `/etc`, never readable whatever their modes: password and group
/// hashes (and their backups), TLS private keys, old password hashes.
const ETC_SECRETS: &[&str] = &["shadow", "shadow-", "gshadow", "gshadow-", "ssl/private", "security/opasswd"];
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
    // Listing `/etc` (and so `cat /etc/*release`) works; what is read is
    // decided entry by entry.
    add(Path::new(ETC), AccessFs::ReadDir.into())?;
    for p in etc_reads(Path::new(ETC)) {
        add(&p, read)?;
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

/// What of `etc` a sandboxed process may read: every entry any user may
/// read (a file readable by others, a directory readable and searchable
/// by others), except [`ETC_SECRETS`]; a directory whose whole tree
/// qualifies as one path, else its qualifying entries. Tools drop every
/// capability but a root tool still owns root's files, so the mode bits
/// for *others* are the test of what is meant for everyone (`shadow` is
/// 0640, SSH host keys 0600, `ssl/private` 0710). Symbolic links get no
/// rule: what they point to is decided by its own path.
pub(super) fn etc_reads(etc: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if public_tree(etc, etc, &mut out) {
        out = vec![etc.to_path_buf()];
    }
    out
}

/// Whether all of `dir` is public (then nothing is pushed); else its
/// public parts are pushed into `out`.
fn public_tree(etc: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    let mut parts = Vec::new();
    let mut whole = true;
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            whole = false;
            continue;
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        let secret = path.strip_prefix(etc).is_ok_and(|rel| ETC_SECRETS.iter().any(|s| rel == Path::new(s)));
        let public = if meta.is_dir() { mode & 0o005 == 0o005 } else { mode & 0o004 != 0 };
        if secret || !public {
            whole = false;
        } else if !meta.is_dir() || public_tree(etc, &path, &mut parts) {
            parts.push(path);
        } else {
            whole = false;
        }
    }
    if !whole {
        out.extend(parts);
    }
    whole
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
        let not_unix =
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, libc::AF_UNIX as u64).map_err(sc)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn etc_is_granted_by_entries_without_its_secrets() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let etc = dir.path();
        let file = |rel: &str, mode: u32| {
            let p = etc.join(rel);
            std::fs::create_dir_all(p.parent().unwrap_or(etc)).unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(&p, "x").unwrap_or_else(|e| panic!("{e}"));
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap_or_else(|e| panic!("{e}"));
        };
        file("passwd", 0o644);
        file("shadow", 0o640);
        file("gshadow", 0o644); // named: refused whatever its mode
        file("default/locale", 0o644);
        file("ssl/certs/ca.pem", 0o644);
        file("ssl/private/key.pem", 0o644);
        file("ssh/ssh_config", 0o644);
        file("ssh/ssh_host_ed25519_key", 0o600);
        std::fs::set_permissions(etc.join("ssl/private"), std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink("shadow", etc.join("link")).unwrap_or_else(|e| panic!("{e}"));
        let mut got = etc_reads(etc);
        got.sort();
        let want: Vec<PathBuf> =
            ["default", "passwd", "ssh/ssh_config", "ssl/certs"].into_iter().map(|r| etc.join(r)).collect();
        assert_eq!(got, want);
        // A tree with nothing to hide is one rule.
        let clean = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(clean.path().join("hosts"), "x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(etc_reads(clean.path()), vec![clean.path().to_path_buf()]);
    }
}
