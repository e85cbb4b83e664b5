//! Staged execution on Linux: a call's working tree becomes an overlay (the
//! real tree read-only below, a staging directory above) in the call's own
//! mount namespace (mounted by `sandbox::ChildHook`), so the command's file
//! effects land in the staging layer. This module owns the staging
//! directories, the probe that says whether overlays work here
//! ([`overlay_status`]: as root, or through an unprivileged user namespace
//! with `userxattr`; it writes through the overlay as a command would),
//! reading the upper layer into a typed
//! [`ChangeSet`] (created and modified files, deletions from whiteouts and
//! opaque directories), the diff a person is shown, and applying a change
//! set to the real tree idempotently (each file written to a temporary
//! name beside it, the file system synced, renamed, synced again;
//! deletions; so applying twice equals once).
//!
//! It must not decide what an effect needs (that is
//! `cairn_core::staged::ChangeSet::judge` and the approval gate) and never
//! writes the real tree except in [`apply`].

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cairn_core::staged::{Change, ChangeKind, ChangeSet, EntryKind, FileState};
use sha2::{Digest, Sha256};

use crate::sandbox::OverlayDirs;

/// Why staging failed.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    /// An I/O failure, with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The real tree changed under the staged run: applying would
    /// overwrite someone else's change, so nothing was applied.
    #[error(
        "{path} changed in the working tree while the command ran (it is neither as the command found it nor as it left it); nothing was applied"
    )]
    Conflict {
        /// The path, relative to the tree.
        path: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StagingError {
    let what = what.into();
    move |source| StagingError::Io { what, source }
}

/// One call's staging directory: `upper` and `work` for the overlay.
#[derive(Debug)]
pub struct Staging {
    root: PathBuf,
    dirs: OverlayDirs,
}

impl Staging {
    /// A fresh staging directory for one call under `base` (created).
    pub fn create(base: &Path, call: &str) -> Result<Self, StagingError> {
        fs::create_dir_all(base).map_err(io(format!("cannot create the staging directory {}", base.display())))?;
        let safe: String = call.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        let root = tempfile::Builder::new()
            .prefix(&format!("stage-{safe}-"))
            .tempdir_in(base)
            .map_err(io("cannot create a staging directory"))?
            .keep();
        let dirs = OverlayDirs { upper: root.join("upper"), work: root.join("work") };
        fs::create_dir(&dirs.upper).map_err(io("cannot create the staging layer"))?;
        fs::create_dir(&dirs.work).map_err(io("cannot create the overlay work directory"))?;
        Ok(Self { root, dirs })
    }

    /// The overlay's directories.
    pub fn dirs(&self) -> &OverlayDirs {
        &self.dirs
    }

    /// Read the staging layer against the real tree `lower`.
    pub fn read(&self, lower: &Path) -> Result<ChangeSet, StagingError> {
        read_layer(&self.dirs.upper, lower)
    }

    /// Make the staging layer durable (one `syncfs` of its file system
    /// rather than an fsync per file), before its change set is recorded.
    pub fn sync(&self, _changes: &ChangeSet) -> Result<(), StagingError> {
        sync_fs(&self.dirs.upper)
    }

    /// Remove the staging directory (best effort: a leftover is only disk).
    pub fn remove(self) {
        remove_tree(&self.root);
    }
}

/// `remove_dir_all`, also where overlayfs left a directory without
/// permissions (its `work/work` is mode 000): root removes it anyway, a
/// non-root user (whose overlay ran in a user namespace) must first give
/// the directories back their owner's rights.
fn remove_tree(path: &Path) {
    if fs::remove_dir_all(path).is_ok() {
        return;
    }
    fn open_up(dir: &Path) {
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
        if let Ok(entries) = fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(path);
    let _ = fs::remove_dir_all(path);
}

/// What the staged part of a call came to (it was applied, or there was
/// nothing to apply).
#[derive(Debug)]
pub struct Settled {
    /// The change set.
    pub changes: ChangeSet,
    /// Its tier (Write, or Destructive when a person approved it).
    pub risk: cairn_core::tool::Risk,
    /// The diff shown and recorded.
    pub diff: String,
    /// Who let it be applied (`None` for an empty change set).
    pub applied_by: Option<String>,
}

/// After a staged process exited: read its change set, have the turn
/// review it (`review`: the gate and the `toolStaged` record), apply it
/// or discard it, and remove the staging directory in every case. A
/// discarded effect is `ToolError::Rejected` with the reviewer's reason.
pub fn settle(
    staging: Staging,
    cwd: &Path,
    rules: &cairn_core::staged::StagedRules,
    review: &mut dyn FnMut(&cairn_core::staged::StagedReview<'_>) -> cairn_core::staged::StagedDecision,
) -> Result<Settled, cairn_core::tool::ToolError> {
    use cairn_core::staged::{StagedDecision, StagedReview};
    use cairn_core::tool::ToolError;
    let result = (|| {
        let changes = staging.read(cwd).map_err(|e| ToolError::Other(format!("cannot read the staged effect: {e}")))?;
        let judgement = changes.judge(rules);
        let diff = render_diff(&changes, &staging.dirs().upper, cwd, 64 * 1024);
        if changes.is_empty() {
            return Ok(Settled { changes, risk: judgement.risk, diff, applied_by: None });
        }
        // The new contents are durable before the change set is recorded,
        // so a resumed session can finish the apply.
        staging.sync(&changes).map_err(|e| ToolError::Other(format!("cannot make the staged effect durable: {e}")))?;
        let upper = staging.dirs().upper.display().to_string();
        let asked = StagedReview { changes: &changes, judgement: &judgement, diff: &diff, staging: &upper };
        match review(&asked) {
            StagedDecision::Apply { by } => {
                apply(&changes, &staging.dirs().upper, cwd).map_err(|e| {
                    ToolError::Other(format!("the staged change set was approved but applying it failed: {e}"))
                })?;
                Ok(Settled { changes, risk: judgement.risk, diff, applied_by: Some(by) })
            }
            StagedDecision::Discard { reason } => Err(ToolError::Rejected(reason)),
        }
    })();
    staging.remove();
    result
}

/// On resume, for a call whose change set was committed: apply it (again;
/// idempotent) and the receipt to settle it with, or `Unknown` when it
/// cannot be finished.
pub fn resume(
    staged: &cairn_core::events::ToolStagedPayload,
    cwd: &Path,
    base: &Path,
    invocation: &str,
    rules: &cairn_core::staged::StagedRules,
) -> cairn_core::tool::GuardVerdict {
    use cairn_core::tool::{GuardVerdict, ToolReceipt};
    match apply(&staged.change_set, Path::new(&staged.staging), cwd) {
        Ok(()) => {
            remove_leftovers(base, invocation);
            GuardVerdict::AlreadyDone(ToolReceipt {
                exit_code: 0,
                output_summary: format!(
                    "[cairn: resumed after an interruption: the committed change set was applied; the command was \
                     not re-run]\n{}",
                    staged.change_set.listing()
                ),
                structured_output: Some(serde_json::json!({
                    "staging": cairn_core::staged::StagingMode::Overlay,
                    "changeSet": staged.change_set,
                    "appliedBy": staged.verdict.by,
                    "resumed": true,
                })),
                affected_entities: staged.change_set.affected(),
                duration_ms: 0,
                tier: staged.change_set.judge(rules).risk,
                timestamp: crate::now_ms(),
                truncated: false,
            })
        }
        Err(_) => GuardVerdict::Unknown,
    }
}

/// Remove the staging directories of call `call` under `base` (after a
/// resume; best effort).
pub fn remove_leftovers(base: &Path, call: &str) {
    let safe: String = call.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let prefix = format!("stage-{safe}-");
    if let Ok(entries) = fs::read_dir(base) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                remove_tree(&e.path());
            }
        }
    }
}

/// The default base for staging directories: beside cairn's other
/// temporary files, never inside the working tree.
pub fn default_base() -> PathBuf {
    std::env::temp_dir().join("cairn-staging")
}

/// Whether staged execution works here (probed once: a throwaway child
/// mounts an overlay in a new mount namespace), or why not.
pub fn overlay_status() -> Result<(), String> {
    static PROBE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    PROBE.get_or_init(probe).clone()
}

/// What `cairn tools` says about staging here (`enabled`: the `staged`
/// setting).
pub fn describe(enabled: bool) -> String {
    if !enabled {
        return "off (staged = false in [tools]): shell runs directly on the tree; the parsed classification alone \
                decides, and a line it cannot classify needs a person (refused headless)"
            .to_owned();
    }
    match overlay_status() {
        Ok(()) => "overlay (shell, and tools that declare fileWrite, run in an overlay of the working tree; their observed effect decides the tier, \
                   and a Destructive effect is shown to a person before anything is applied)"
            .to_owned(),
        Err(why) => format!(
            "unavailable ({why}): shell runs directly on the tree; the parsed classification alone decides, and \
             a line it cannot classify needs a person (refused headless)"
        ),
    }
}

#[cfg(target_os = "linux")]
fn probe() -> Result<(), String> {
    use crate::sandbox::{NamespaceMode, UserMaps};
    let mode = crate::sandbox::namespace_mode().map_err(|why| format!("no private mount namespace: {why}"))?;
    let maps = UserMaps::for_mode(Ok(mode));
    let dir = tempfile::Builder::new()
        .prefix("cairn-overlay-probe-")
        .tempdir_in(std::env::temp_dir())
        .map_err(|e| format!("cannot create a probe directory: {e}"))?;
    let (lower, upper, work) = (dir.path().join("l"), dir.path().join("u"), dir.path().join("w"));
    for d in [&lower, &upper, &work] {
        fs::create_dir(d).map_err(|e| format!("cannot create a probe directory: {e}"))?;
    }
    std::fs::write(lower.join("f"), "probe").map_err(|e| format!("cannot create a probe file: {e}"))?;
    let options = format!(
        "lowerdir={},upperdir={},workdir={},{}",
        lower.display(),
        upper.display(),
        work.display(),
        crate::sandbox::overlay_flags(mode == NamespaceMode::UserNamespace)
    );
    // The probe writes through the overlay (a copy-up and a whiteout), as a
    // staged command would.
    let victim =
        std::ffi::CString::new(lower.join("f").as_os_str().as_encoded_bytes()).map_err(|_| "NUL".to_owned())?;
    let options = std::ffi::CString::new(options).map_err(|_| "a probe path holds a NUL".to_owned())?;
    let target = std::ffi::CString::new(lower.as_os_str().as_encoded_bytes()).map_err(|_| "NUL".to_owned())?;
    // SAFETY: the child issues raw syscalls only and leaves with _exit; the
    // strings were built before the fork.
    let code = unsafe {
        let pid = libc::fork();
        if pid < 0 {
            return Err(format!("cannot fork a probe: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            match &maps {
                None => {
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        libc::_exit(1);
                    }
                }
                Some(m) => {
                    if crate::sandbox::enter_user_namespace(&m.uid_map, &m.gid_map).is_err() {
                        libc::_exit(1);
                    }
                }
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                libc::_exit(2);
            }
            if libc::mount(c"overlay".as_ptr(), target.as_ptr(), c"overlay".as_ptr(), 0, options.as_ptr().cast()) != 0 {
                libc::_exit(3);
            }
            if libc::unlink(victim.as_ptr()) != 0 {
                libc::_exit(4);
            }
            libc::_exit(0);
        }
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0 {
            if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return Err("cannot wait for the probe".into());
            }
        }
        if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 127 }
    };
    match code {
        0 => Ok(()),
        1 => Err("the kernel refused a new mount namespace".into()),
        2 => Err("cannot make mounts private in a new mount namespace".into()),
        3 if maps.is_some() => Err("the kernel refused an overlayfs mount from a user namespace (needs Linux ≥ 5.11 \
                                    with `userxattr`, and a file system for the staging directory that takes user \
                                    xattrs)"
            .into()),
        3 => Err("the kernel refused an overlayfs mount (no overlay module, or not allowed here)".into()),
        4 => Err("an overlay mounts here but cannot record a deletion (whiteout) in its staging layer".into()),
        n => Err(format!("the overlay probe ended with status {n}")),
    }
}

#[cfg(not(target_os = "linux"))]
fn probe() -> Result<(), String> {
    Err("overlay staging exists only on Linux".into())
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The state of `path` (not following a final symlink), or `None`.
fn state(path: &Path) -> Result<Option<FileState>, StagingError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("cannot stat {}", path.display()))(e)),
    };
    let mode = meta.permissions().mode() & 0o7777;
    let ft = meta.file_type();
    Ok(Some(if ft.is_dir() {
        FileState { kind: EntryKind::Dir, size: 0, sha256: String::new(), mode }
    } else if ft.is_symlink() {
        let target = fs::read_link(path).map_err(io(format!("cannot read link {}", path.display())))?;
        let digest = Sha256::digest(target.as_os_str().as_encoded_bytes());
        FileState { kind: EntryKind::Symlink, size: meta.len(), sha256: hex(&digest), mode }
    } else {
        let sha256 = sha256_file(path).map_err(io(format!("cannot read {}", path.display())))?;
        FileState { kind: EntryKind::File, size: meta.len(), sha256, mode }
    }))
}

/// Whether `meta` is an overlayfs whiteout (a 0/0 character device).
fn is_whiteout(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    meta.file_type().is_char_device() && meta.rdev() == 0
}

/// Whether the upper directory `path` is opaque (hides the lower one).
fn is_opaque(path: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
        let mut value = [0u8; 4];
        for name in [c"trusted.overlay.opaque", c"user.overlay.opaque"] {
            // SAFETY: valid NUL-terminated strings and a buffer of the given size.
            let n = unsafe { libc::lgetxattr(c.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
            if n >= 1 && value[0] == b'y' {
                return true;
            }
        }
        false
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        false
    }
}

/// Read the upper layer `upper` over `lower` into a change set.
pub fn read_layer(upper: &Path, lower: &Path) -> Result<ChangeSet, StagingError> {
    let mut changes = BTreeMap::new();
    walk_upper(upper, lower, "", &mut changes)?;
    Ok(ChangeSet { changes: changes.into_values().collect() })
}

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() { name.to_owned() } else { format!("{rel}/{name}") }
}

fn walk_upper(upper: &Path, lower: &Path, rel: &str, out: &mut BTreeMap<String, Change>) -> Result<(), StagingError> {
    let dir = upper.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(io(format!("cannot list {}", dir.display())))?
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for name in names {
        let name = name.to_string_lossy().into_owned();
        let path = join(rel, &name);
        let up = upper.join(&path);
        let low = lower.join(&path);
        let meta = fs::symlink_metadata(&up).map_err(io(format!("cannot stat {}", up.display())))?;
        let before = state(&low)?;
        if is_whiteout(&meta) {
            deleted_tree(lower, &path, out)?;
            continue;
        }
        let after = state(&up)?;
        if meta.is_dir() {
            let lower_is_dir = before.as_ref().is_some_and(|b| b.kind == EntryKind::Dir);
            if !lower_is_dir {
                if before.is_some() {
                    deleted_tree(lower, &path, out)?;
                }
                out.insert(path.clone(), change(&path, ChangeKind::Created, None, after));
            } else if is_opaque(&up) {
                // Everything below was removed, then the directory refilled.
                for child in list(&low)? {
                    deleted_tree(lower, &join(&path, &child), out)?;
                }
                if before.as_ref().map(|b| b.mode) != after.as_ref().map(|a| a.mode) {
                    out.insert(path.clone(), change(&path, ChangeKind::Modified, before, after));
                }
            } else if before.as_ref().map(|b| b.mode) != after.as_ref().map(|a| a.mode) {
                out.insert(path.clone(), change(&path, ChangeKind::Modified, before, after));
            }
            walk_upper(upper, lower, &path, out)?;
            continue;
        }
        match before {
            None => {
                out.insert(path.clone(), change(&path, ChangeKind::Created, None, after));
            }
            Some(b) if b.kind == EntryKind::Dir => {
                deleted_tree(lower, &path, out)?;
                out.insert(path.clone(), change(&path, ChangeKind::Created, None, after));
            }
            Some(b) if Some(&b) == after.as_ref() => {} // copied up, unchanged
            Some(b) => {
                let mut c = change(&path, ChangeKind::Modified, Some(b.clone()), after.clone());
                if b.kind == EntryKind::File && after.as_ref().is_some_and(|a| a.kind == EntryKind::File) {
                    c.lines = line_kept(&low, &up);
                }
                out.insert(path.clone(), c);
            }
        }
    }
    Ok(())
}

fn change(path: &str, kind: ChangeKind, before: Option<FileState>, after: Option<FileState>) -> Change {
    Change { path: path.to_owned(), kind, before, after, lines: None }
}

fn list(dir: &Path) -> Result<Vec<String>, StagingError> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map_err(io(format!("cannot list {}", dir.display())))?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// `path` of the lower tree and everything below it, as deletions.
fn deleted_tree(lower: &Path, path: &str, out: &mut BTreeMap<String, Change>) -> Result<(), StagingError> {
    let Some(before) = state(&lower.join(path))? else { return Ok(()) };
    if before.kind == EntryKind::Dir {
        for child in list(&lower.join(path))? {
            deleted_tree(lower, &join(path, &child), out)?;
        }
    }
    out.insert(path.to_owned(), change(path, ChangeKind::Deleted, Some(before), None));
    Ok(())
}

/// Largest file whose lines are compared (and diffed for a person).
const TEXT_LIMIT: u64 = 1 << 20;

fn text_of(path: &Path) -> Option<String> {
    let meta = fs::metadata(path).ok()?;
    if meta.len() > TEXT_LIMIT {
        return None;
    }
    let bytes = fs::read(path).ok()?;
    if bytes.contains(&0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// For two text files: (old line count, old lines kept in order).
fn line_kept(old: &Path, new: &Path) -> Option<(u64, u64)> {
    let (a, b) = (text_of(old)?, text_of(new)?);
    let old_lines = a.lines().count() as u64;
    let patch = diffy::create_patch(&a, &b);
    let removed: u64 =
        patch.hunks().iter().flat_map(|h| h.lines()).filter(|l| matches!(l, diffy::Line::Delete(_))).count() as u64;
    Some((old_lines, old_lines.saturating_sub(removed)))
}

/// What a person is shown: a unified diff per text file, size and hash for
/// binary files, deletions listed. Cut at `cap` bytes.
pub fn render_diff(changes: &ChangeSet, upper: &Path, lower: &Path, cap: usize) -> String {
    let mut out = String::new();
    for c in &changes.changes {
        if out.len() > cap {
            out.push_str("[diff cut]\n");
            break;
        }
        let low = lower.join(&c.path);
        let up = upper.join(&c.path);
        match c.kind {
            ChangeKind::Deleted => out.push_str(&format!("deleted: {}\n", c.path)),
            ChangeKind::Created | ChangeKind::Modified => {
                let is_file = c.after.as_ref().is_some_and(|a| a.kind == EntryKind::File);
                if !is_file {
                    continue;
                }
                let old = if c.kind == ChangeKind::Created { Some(String::new()) } else { text_of(&low) };
                match (old, text_of(&up)) {
                    (Some(a), Some(b)) => {
                        let patch = diffy::create_patch(&a, &b).to_string();
                        let body = patch.split_once('\n').and_then(|(_, r)| r.split_once('\n')).map_or("", |(_, r)| r);
                        out.push_str(&format!("--- a/{}\n+++ b/{}\n{body}", c.path, c.path));
                    }
                    _ => {
                        let state = c.after.as_ref();
                        out.push_str(&format!(
                            "binary {}: {} bytes, sha256 {}\n",
                            c.path,
                            state.map_or(0, |s| s.size),
                            state.map_or("", |s| s.sha256.as_str())
                        ));
                    }
                }
            }
        }
    }
    if out.len() > cap {
        let mut cut = cap;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("\n[diff cut]\n");
    }
    out
}

/// Apply `changes` from the staging layer `upper` to the real tree `cwd`.
/// Idempotent: a file already equal to its staged state is left alone,
/// each write goes to a temporary name in the target directory, made
/// durable (`syncfs`) before it is renamed over the target, deletions of
/// missing paths are no-ops; so a crash during the apply is finished by
/// applying again.
pub fn apply(changes: &ChangeSet, upper: &Path, cwd: &Path) -> Result<(), StagingError> {
    // First, before touching anything: every path must be as the command
    // found it (not applied yet) or as it left it (applied already);
    // anything else is a concurrent change that applying would destroy.
    for c in &changes.changes {
        let now = state(&cwd.join(&c.path))?;
        if now != c.before && now != c.after {
            return Err(StagingError::Conflict { path: c.path.clone() });
        }
    }
    // Deletions deepest first, then creations and modifications in path
    // order (parents before children).
    let mut deletions: Vec<&Change> = changes.changes.iter().filter(|c| c.kind == ChangeKind::Deleted).collect();
    deletions.sort_by(|a, b| b.path.cmp(&a.path));
    for c in deletions {
        let target = cwd.join(&c.path);
        match fs::symlink_metadata(&target) {
            Ok(m) if m.is_dir() => {
                fs::remove_dir_all(&target).map_err(io(format!("cannot delete {}", target.display())))?
            }
            Ok(_) => fs::remove_file(&target).map_err(io(format!("cannot delete {}", target.display())))?,
            Err(_) => {}
        }
    }
    // Files and symlinks are written to temporary names first, made
    // durable with one `syncfs`, then renamed into place, and the renames
    // made durable with another (a crash in between is finished by the
    // next apply: the change set is in the log).
    let mut renames: Vec<(PathBuf, PathBuf)> = Vec::new();
    for c in changes.changes.iter().filter(|c| c.kind != ChangeKind::Deleted) {
        let Some(after) = &c.after else { continue };
        let target = cwd.join(&c.path);
        let source = upper.join(&c.path);
        if state(&target)?.as_ref() == Some(after) {
            continue;
        }
        match after.kind {
            EntryKind::Dir => {
                if fs::symlink_metadata(&target).is_ok_and(|m| !m.is_dir()) {
                    fs::remove_file(&target).map_err(io(format!("cannot replace {}", target.display())))?;
                }
                fs::create_dir_all(&target).map_err(io(format!("cannot create {}", target.display())))?;
                fs::set_permissions(&target, fs::Permissions::from_mode(after.mode))
                    .map_err(io(format!("cannot set the mode of {}", target.display())))?;
            }
            EntryKind::Symlink => {
                let link = fs::read_link(&source).map_err(io(format!("cannot read {}", source.display())))?;
                let tmp = temp_name(&target);
                let _ = fs::remove_file(&tmp);
                std::os::unix::fs::symlink(&link, &tmp).map_err(io(format!("cannot create {}", tmp.display())))?;
                renames.push((tmp, target));
            }
            EntryKind::File => {
                let tmp = temp_name(&target);
                let mut src = fs::File::open(&source).map_err(io(format!("cannot read {}", source.display())))?;
                let mut dst = fs::File::create(&tmp).map_err(io(format!("cannot write {}", tmp.display())))?;
                std::io::copy(&mut src, &mut dst).map_err(io(format!("cannot write {}", tmp.display())))?;
                dst.set_permissions(fs::Permissions::from_mode(after.mode))
                    .map_err(io(format!("cannot set the mode of {}", tmp.display())))?;
                dst.flush().map_err(io("flush"))?;
                renames.push((tmp, target));
            }
        }
    }
    if renames.is_empty() && changes.changes.iter().all(|c| c.kind != ChangeKind::Deleted) {
        return Ok(());
    }
    sync_fs(cwd)?;
    for (tmp, target) in &renames {
        replace(tmp, target)?;
    }
    sync_fs(cwd)
}

/// Flush the file system holding `path` (`syncfs`).
fn sync_fs(path: &Path) -> Result<(), StagingError> {
    let dir = fs::File::open(path).map_err(io(format!("cannot open {}", path.display())))?;
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: syncfs on a file descriptor we own.
        if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
            return Err(io(format!("cannot sync the file system of {}", path.display()))(
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        dir.sync_all().map_err(io(format!("cannot sync {}", path.display())))
    }
}

/// A temporary name beside `target` (same directory, so the rename is
/// atomic).
fn temp_name(target: &Path) -> PathBuf {
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    target.with_file_name(format!(".{name}.cairn-apply"))
}

fn replace(tmp: &Path, target: &Path) -> Result<(), StagingError> {
    if fs::symlink_metadata(target).is_ok_and(|m| m.is_dir()) {
        fs::remove_dir_all(target).map_err(io(format!("cannot replace {}", target.display())))?;
    }
    fs::rename(tmp, target).map_err(io(format!("cannot rename onto {}", target.display())))
}
