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
//! deletions; so applying twice equals once), and the facts the judgement
//! needs that only files can tell (an append; a version git stores, read
//! from `.git/objects` as files, never by running git).
//!
//! It must not decide what an effect needs (that is
//! `cairn_core::staged::ChangeSet::judge` and the approval gate), never
//! writes the real tree except in [`apply`], and never touches a path of
//! the tree or the layer except through [`Beneath`] (no link followed,
//! nothing but regular files opened).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use cairn_core::staged::{Change, ChangeKind, ChangeSet, EntryKind, FileState};

use crate::beneath::{self, Beneath, writable};
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
    /// The command left a FIFO, socket or device in the tree: cairn
    /// applies regular files, directories and links only, and never opens
    /// anything else.
    #[error(
        "the command left {path}, which is not a regular file, directory or link (a FIFO, socket or device); cairn \
         never applies those, so nothing was applied: remove it in the command, or create it outside the tree"
    )]
    Special {
        /// The path, relative to the tree, escaped for display.
        path: String,
    },
    /// The command nested directories deeper than cairn reads.
    #[error(
        "the command nested directories more than {MAX_DEPTH} levels deep (at {path}); cairn does not read or apply \
         such a tree, so nothing was applied"
    )]
    TooDeep {
        /// The path where the limit was passed, escaped for display.
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
    writers: Writers,
}

/// Whether anything may still write the files of a staging layer, which
/// decides whether [`apply`] may move them into the tree (a file moved
/// while a process of the command still held it open would take that
/// process's later writes into the tree, unreviewed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writers {
    /// None: every process of the command is gone
    /// (`process::RunOutcome::contained`), or the layer is cairn's own
    /// plain directory. Created files are moved.
    Gone,
    /// Not known: every file is copied (what a lingering writer does to
    /// the layer afterwards stays there).
    Unknown,
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
        Ok(Self { root, dirs, writers: Writers::Unknown })
    }

    /// The command that wrote the layer ended as `outcome` says: when all
    /// its processes are gone, the layer's files may be moved.
    pub fn ran(&mut self, outcome: &crate::process::RunOutcome) {
        self.writers = if outcome.contained { Writers::Gone } else { Writers::Unknown };
    }

    /// The overlay's directories.
    pub fn dirs(&self) -> &OverlayDirs {
        &self.dirs
    }

    /// Read the staging layer against the real tree `lower`.
    pub fn read(&self, lower: &Path) -> Result<ChangeSet, StagingError> {
        read_layer(&self.dirs.upper, lower)
    }

    /// [`Staging::read`], and the bytes of the created files read while a
    /// diff of `cap` bytes could still show them ([`Created`]).
    fn read_for_diff(&self, lower: &Path, cap: usize) -> Result<(ChangeSet, Created), StagingError> {
        read_layer_keeping(&self.dirs.upper, lower, cap as u64)
    }

    /// Make the staging layer durable (one `syncfs` of its file system
    /// rather than an fsync per file), before its change set is recorded.
    pub fn sync(&self, _changes: &ChangeSet) -> Result<(), StagingError> {
        sync_fs(&self.dirs.upper)
    }

    /// Remove the staging directory (best effort: a leftover is only disk).
    pub fn remove(self) {
        crate::calltemp::remove_tree(&self.root);
    }
}

/// The working tree as the judge compares it with the host's locations
/// (`cairn_core::authority`): canonical, or as given when it cannot be
/// resolved.
fn tree_of(cwd: &Path) -> PathBuf {
    cwd.canonicalize().unwrap_or_else(|_| cwd.to_path_buf())
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

/// After a staged process exited: read its change set, keep the prior
/// state of every path it changes in `store` (when given), have the turn
/// review it (`review`: the gate and the `toolStaged` record), apply it
/// or discard it, and remove the staging directory in every case. A
/// discarded effect is `ToolError::Rejected` with the reviewer's reason.
pub fn settle(
    staging: Staging,
    cwd: &Path,
    rules: &cairn_core::staged::StagedRules,
    store: Option<&crate::undo::PreimageStore>,
    review: &mut dyn FnMut(&cairn_core::staged::StagedReview<'_>) -> cairn_core::staged::StagedDecision,
) -> Result<Settled, cairn_core::tool::ToolError> {
    use cairn_core::staged::{StagedDecision, StagedReview, StagedRules};
    use cairn_core::tool::ToolError;
    let result = (|| {
        let (changes, created) = staging.read_for_diff(cwd, DIFF_CAP).map_err(|e| match e {
            StagingError::Special { .. } | StagingError::TooDeep { .. } => ToolError::Rejected(e.to_string()),
            e => ToolError::Other(format!("cannot read the staged effect: {e}")),
        })?;
        let tree = tree_of(cwd);
        let here =
            StagedRules { authority: crate::hookspath::authority_here(&rules.authority, &tree), ..rules.clone() };
        let judgement = changes.judge(&here, &tree);
        let diff = render_diff_from(&changes, created, &staging.dirs().upper, cwd, DIFF_CAP);
        if changes.is_empty() {
            return Ok(Settled { changes, risk: judgement.risk, diff, applied_by: None });
        }
        // The new contents are durable before the change set is recorded,
        // so a resumed session can finish the apply.
        staging.sync(&changes).map_err(|e| ToolError::Other(format!("cannot make the staged effect durable: {e}")))?;
        // The prior state of every path is kept (and durable) before the
        // change set is recorded, so the effect can be undone.
        let preimages = match store {
            Some(store) => store.keep(cwd, &changes),
            None => cairn_core::staged::Preimages::NotKept { reason: "no pre-image store is configured".to_owned() },
        };
        let upper = staging.dirs().upper.display().to_string();
        let asked = StagedReview {
            changes: &changes,
            judgement: &judgement,
            diff: &diff,
            staging: &upper,
            preimages: &preimages,
        };
        match review(&asked) {
            StagedDecision::Apply { by } => {
                apply(&changes, &staging.dirs().upper, cwd, staging.writers).map_err(|e| {
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

/// The most bytes of diff a person is shown for one staged effect.
const DIFF_CAP: usize = 64 * 1024;

/// Bytes of created files the change-set reader kept for the diff (path →
/// bytes), at most the diff's cap in all: a created file's diff is made
/// from the bytes that were hashed instead of reading the file again
/// (issue 49.10). A file not here is read from the layer as before.
#[derive(Debug, Default)]
struct Created {
    bytes: std::collections::HashMap<String, Vec<u8>>,
    /// Bytes still to be kept.
    budget: u64,
}

/// On resume, for a call whose change set was committed: apply it (again;
/// idempotent) and the receipt to settle it with, or `Unknown` when it
/// cannot be finished.
pub fn resume(
    staged: &cairn_core::staged::StagedCommit<'_>,
    cwd: &Path,
    base: &Path,
    invocation: &str,
    rules: &cairn_core::staged::StagedRules,
) -> cairn_core::tool::GuardVerdict {
    use cairn_core::tool::{GuardVerdict, ToolReceipt};
    // Copied, not moved: nothing here says what became of the processes
    // of the run that wrote the layer.
    match apply(staged.changes, Path::new(staged.staging), cwd, Writers::Unknown) {
        Ok(()) => {
            remove_temporaries(staged.changes, cwd);
            remove_leftovers(base, invocation);
            GuardVerdict::AlreadyDone(ToolReceipt {
                exit_code: 0,
                output_summary: format!(
                    "[cairn: resumed after an interruption: the committed change set was applied; the command was \
                     not re-run]\n{}",
                    staged.changes.listing()
                ),
                structured_output: Some(serde_json::json!({
                    "staging": cairn_core::staged::StagingMode::Overlay,
                    "changeSet": staged.changes,
                    "appliedBy": staged.approved_by,
                    "resumed": true,
                })),
                affected_entities: staged.changes.affected(),
                duration_ms: 0,
                tier: staged.changes.judge(rules, &tree_of(cwd)).risk,
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
                crate::calltemp::remove_tree(&e.path());
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
    overlay_probe().clone().map(|_| ())
}

/// Whether the staging overlay is mounted `volatile` here (the probe
/// mounted one; Linux ≥ 5.10). Without it, overlayfs syncs the staging
/// layer's whole file system when the call's mount namespace goes away
/// (`syncfs` at unmount), which on a disk shared with other writers cost
/// every staged call, even `true`, tens of milliseconds to seconds
/// (issue 49.10), and turns a tool's own `fsync` calls into real flushes
/// of a layer that may be discarded. Durability does not depend on it:
/// cairn makes the layer durable itself (`Staging::sync`) before a change
/// set is recorded, and never mounts a staging layer twice (the next
/// mount of a volatile layer is refused by overlayfs; a resumed apply
/// reads the layer as plain files).
pub(crate) fn overlay_volatile() -> bool {
    matches!(overlay_probe(), Ok(true))
}

/// The probe's answer: `Ok(volatile)` or why overlays do not work.
fn overlay_probe() -> &'static Result<bool, String> {
    static PROBE: std::sync::OnceLock<Result<bool, String>> = std::sync::OnceLock::new();
    PROBE.get_or_init(|| match probe(true) {
        Ok(()) => Ok(true),
        Err(_) => probe(false).map(|()| false),
    })
}

/// What decides a shell line where it runs directly on the tree.
const UNSTAGED: &str = "shell runs directly on the tree; its parsed words alone decide (docs/tools.md, \
                        \"The shapes table\"): a line that can overwrite a file, extracts, patches, runs git, or \
                        cannot be classified needs a person (refused headless)";

/// What `cairn tools` says about staging here (`enabled`: the `staged`
/// setting).
pub fn describe(enabled: bool) -> String {
    if !enabled {
        return format!("off (staged = false in [tools]): {UNSTAGED}");
    }
    match overlay_status() {
        Ok(()) => "overlay (shell, and tools that declare fileWrite, run in an overlay of the working tree; their observed effect decides the tier, \
                   and a Destructive effect is shown to a person before anything is applied)"
            .to_owned(),
        Err(why) => format!("unavailable ({why}): {UNSTAGED}"),
    }
}

#[cfg(target_os = "linux")]
fn probe(volatile: bool) -> Result<(), String> {
    use crate::sandbox::{NamespaceMode, UserMaps};
    let mode = crate::sandbox::namespace_mode().map_err(|why| format!("no private mount namespace: {why}"))?;
    let maps = UserMaps::for_mode(Ok(mode));
    let dir = tempfile::Builder::new()
        .prefix(crate::calltemp::PROBE)
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
        crate::sandbox::overlay_flags(mode == NamespaceMode::UserNamespace, volatile)
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
    // The overlay left its work directory mode 000 (and a whiteout in it),
    // which a non-root owner cannot list: `TempDir`'s own removal would
    // fail silently and leave a probe directory behind on every run.
    crate::calltemp::remove_tree(&dir.keep());
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
fn probe(_volatile: bool) -> Result<(), String> {
    Err("overlay staging exists only on Linux".into())
}

fn io_at(what: String) -> impl FnOnce(std::io::Error) -> StagingError {
    move |source| StagingError::Io { what, source }
}

/// Read the upper layer `upper` over `lower` into a change set. Every
/// path on both sides is read beneath its directory (`beneath`): nothing
/// is followed, nothing but regular files is opened. A result that holds a
/// FIFO, socket or device is refused ([`StagingError::Special`]); a name
/// that is not UTF-8 is refused too.
pub fn read_layer(upper: &Path, lower: &Path) -> Result<ChangeSet, StagingError> {
    read_layer_keeping(upper, lower, 0).map(|(changes, _)| changes)
}

/// [`read_layer`], keeping the bytes of created files as they are hashed
/// while fewer than `keep` bytes are kept in all (for the diff).
fn read_layer_keeping(upper: &Path, lower: &Path, keep: u64) -> Result<(ChangeSet, Created), StagingError> {
    let up = Beneath::open_layer(upper).map_err(io(format!("cannot open the staging layer {}", upper.display())))?;
    let low = Beneath::open(lower).map_err(io(format!("cannot open the working tree {}", lower.display())))?;
    let git = GitStore::find(lower);
    let mut changes = BTreeMap::new();
    let mut created = Created { budget: keep, ..Created::default() };
    walk_upper(&up, &low, git.as_ref(), "", true, &mut changes, &mut created)?;
    Ok((ChangeSet { changes: changes.into_values().collect() }, created))
}

/// The deepest path a change set may hold (directories below the tree):
/// reading and applying recurse once per level, and no real build nests
/// this deep.
const MAX_DEPTH: usize = beneath::MAX_DEPTH;

fn join(rel: &str, name: &str) -> String {
    if rel.is_empty() { name.to_owned() } else { format!("{rel}/{name}") }
}

/// The state of `rel` under `tree`, as the change set records it: the
/// permission bits cairn would write (never setuid/setgid).
fn recorded(tree: &Beneath, rel: &str) -> Result<Option<FileState>, StagingError> {
    tree.recorded(rel).map_err(io_at(format!("cannot read {}", tree.show(rel))))
}

fn before_state(low: &Beneath, rel: &str) -> Result<Option<FileState>, StagingError> {
    low.state(rel).map_err(io_at(format!("cannot read {}", low.show(rel))))
}

/// Read the upper layer's directory `rel` into `out`; `in_lower`: `rel` is
/// a directory of the lower tree too (else nothing below it existed
/// before, and the lower tree is not asked: a build's new output
/// directory costs one lookup per file, not two).
fn walk_upper(
    up: &Beneath,
    low: &Beneath,
    git: Option<&GitStore>,
    rel: &str,
    in_lower: bool,
    out: &mut BTreeMap<String, Change>,
    created: &mut Created,
) -> Result<(), StagingError> {
    if rel.split('/').count() > MAX_DEPTH {
        return Err(StagingError::TooDeep { path: cairn_core::staged::shown(rel) });
    }
    let names = up.list(rel).map_err(io_at(format!("cannot list {}", up.show(rel))))?;
    for name in names {
        let path = join(rel, &name);
        let node = up.node(&path).map_err(io_at(format!("cannot stat {}", up.show(&path))))?.ok_or_else(|| {
            StagingError::Io {
                what: format!("{} vanished from the staging layer", up.show(&path)),
                source: std::io::ErrorKind::NotFound.into(),
            }
        })?;
        let before = if in_lower { before_state(low, &path)? } else { None };
        if node.whiteout {
            deleted_tree(low, &path, before, out)?;
            continue;
        }
        if node.kind == EntryKind::Special {
            return Err(StagingError::Special { path: cairn_core::staged::shown(&path) });
        }
        // A new file's bytes are kept for the diff while they fit its
        // budget (read once, for the digest and the diff).
        let keep = if before.is_none() && node.kind == EntryKind::File { created.budget.min(TEXT_LIMIT) } else { 0 };
        let (state, bytes) =
            up.state_keeping(&path, node, keep).map_err(io_at(format!("cannot read {}", up.show(&path))))?;
        if let Some(bytes) = bytes {
            created.budget = created.budget.saturating_sub(bytes.len() as u64);
            created.bytes.insert(path.clone(), bytes);
        }
        let after = Some(writable(state));
        if node.kind == EntryKind::Dir {
            let lower_is_dir = before.as_ref().is_some_and(|b| b.kind == EntryKind::Dir);
            if !lower_is_dir {
                // New, or another kind of entry replaced by a directory
                // (one change: its before state is what the apply must
                // find there).
                let kind = if before.is_some() { ChangeKind::Modified } else { ChangeKind::Created };
                out.insert(path.clone(), change(&path, kind, before, after));
            } else if up.is_opaque(&path) {
                // Everything below was removed, then the directory refilled.
                for child in low.list(&path).map_err(io_at(format!("cannot list {}", low.show(&path))))? {
                    deleted_tree(low, &join(&path, &child), None, out)?;
                }
                if before.as_ref().map(|b| b.mode) != after.as_ref().map(|a| a.mode) {
                    out.insert(path.clone(), change(&path, ChangeKind::Modified, before, after));
                }
            } else if before.as_ref().map(|b| b.mode) != after.as_ref().map(|a| a.mode) {
                out.insert(path.clone(), change(&path, ChangeKind::Modified, before, after));
            }
            walk_upper(up, low, git, &path, lower_is_dir, out, created)?;
            continue;
        }
        match before {
            None => {
                out.insert(path.clone(), change(&path, ChangeKind::Created, None, after));
            }
            Some(b) if b.kind == EntryKind::Dir => {
                // A directory replaced by a file or link: everything below
                // it is deleted, and the path itself changes kind.
                for child in low.list(&path).map_err(io_at(format!("cannot list {}", low.show(&path))))? {
                    deleted_tree(low, &join(&path, &child), None, out)?;
                }
                out.insert(path.clone(), change(&path, ChangeKind::Modified, Some(b), after));
            }
            Some(b) if Some(&b) == after.as_ref() => {} // copied up, unchanged
            Some(b) => {
                let mut c = change(&path, ChangeKind::Modified, Some(b.clone()), after.clone());
                let both_files = b.kind == EntryKind::File && after.as_ref().is_some_and(|a| a.kind == EntryKind::File);
                let content_changed = after.as_ref().is_some_and(|a| a.sha256 != b.sha256 || a.size != b.size);
                if both_files && content_changed {
                    c.lines = line_kept(low, up, &path);
                    c.appends = beneath::starts_with(up, &path, low, &path).unwrap_or(false);
                    c.discards_uncommitted = git.is_some_and(|g| g.discards(low, up, &path));
                }
                out.insert(path.clone(), c);
            }
        }
    }
    Ok(())
}

fn change(path: &str, kind: ChangeKind, before: Option<FileState>, after: Option<FileState>) -> Change {
    Change { path: path.to_owned(), kind, before, after, lines: None, appends: false, discards_uncommitted: false }
}

/// `path` of the lower tree and everything below it, as deletions
/// (`known`: its state, when the caller has read it already).
fn deleted_tree(
    low: &Beneath,
    path: &str,
    known: Option<FileState>,
    out: &mut BTreeMap<String, Change>,
) -> Result<(), StagingError> {
    if path.split('/').count() > MAX_DEPTH {
        return Err(StagingError::TooDeep { path: cairn_core::staged::shown(path) });
    }
    let before = match known {
        Some(state) => state,
        None => match before_state(low, path)? {
            Some(state) => state,
            None => return Ok(()),
        },
    };
    if before.kind == EntryKind::Dir {
        for child in low.list(path).map_err(io_at(format!("cannot list {}", low.show(path))))? {
            deleted_tree(low, &join(path, &child), None, out)?;
        }
    }
    out.insert(path.to_owned(), change(path, ChangeKind::Deleted, Some(before), None));
    Ok(())
}

/// Largest file whose lines are compared (and diffed for a person).
const TEXT_LIMIT: u64 = 1 << 20;

fn text_of(tree: &Beneath, rel: &str) -> Option<String> {
    let file = tree.open_file(rel).ok()?;
    let len = file.metadata().ok()?.len();
    if len > TEXT_LIMIT {
        return None;
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(TEXT_LIMIT + 1).read_to_end(&mut bytes).ok()?;
    text(bytes)
}

/// `bytes` as text to compare or diff: `None` when over [`TEXT_LIMIT`],
/// holding a NUL, or not UTF-8 (such a file is shown by size and hash).
fn text(bytes: Vec<u8>) -> Option<String> {
    if bytes.len() as u64 > TEXT_LIMIT || bytes.contains(&0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// For two text files: (old line count, old lines kept in order).
fn line_kept(low: &Beneath, up: &Beneath, rel: &str) -> Option<(u64, u64)> {
    let (a, b) = (text_of(low, rel)?, text_of(up, rel)?);
    let old_lines = a.lines().count() as u64;
    let patch = diffy::create_patch(&a, &b);
    let removed: u64 =
        patch.hunks().iter().flat_map(|h| h.lines()).filter(|l| matches!(l, diffy::Line::Delete(_))).count() as u64;
    Some((old_lines, old_lines.saturating_sub(removed)))
}

/// The object store of the git repository a working tree belongs to, read
/// as files only (cairn never runs git on a tree a tool may have written:
/// a planted `core.fsmonitor` would run as cairn). Only SHA-1 stores.
///
/// Every file it reads may have been written by a tool (`.git`,
/// `commondir`, `config`, the pack indexes, the loose objects): each is
/// read through [`Beneath`] (no link followed, regular files only) and
/// within [`GIT_TEXT_CAP`]; a pack index is searched in place, never read
/// whole. A pointer read from a file inside the tree (`gitdir:`,
/// `commondir`) is followed only beneath the tree, except a linked
/// worktree's `gitdir:` whose directory (outside the tree) names this
/// `.git` back, as git writes it. Anything else (a link, a device, a file
/// too long, a pointer elsewhere) means "no git information": the change
/// set is judged without it, and nothing is followed.
struct GitStore {
    objects: Beneath,
    /// The pack indexes, opened once (at the first lookup a loose object
    /// does not answer) for the whole change set.
    packs: std::cell::OnceCell<Vec<PackIndex>>,
}

/// Longest `.git` file, `commondir` or `config` cairn reads.
const GIT_TEXT_CAP: u64 = 64 * 1024;

/// Most names of `objects/pack` cairn looks at (a repository has a few
/// dozen packs; a planted directory of millions of names must not cost
/// the judgement its memory).
const MAX_PACK_NAMES: usize = 4096;

/// A pack index (version 2) searched with `pread`: its fan-out table and
/// the open file.
struct PackIndex {
    file: fs::File,
    fan: [u32; 256],
}

impl GitStore {
    /// The store of the repository holding `tree` (the nearest `.git`
    /// directory, or a `.git` file's `gitdir:` with its `commondir`), or
    /// `None` when there is none or it cannot be read safely.
    fn find(tree: &Path) -> Option<Self> {
        let mut dir = Some(tree);
        while let Some(d) = dir {
            // A directory this user cannot read holds no git information
            // cairn can use.
            let Ok(here) = Beneath::open(d) else {
                dir = d.parent();
                continue;
            };
            match here.node(".git") {
                Ok(None) => dir = d.parent(),
                // Inside the tree (the tree's own `.git`), a tool may
                // have written every byte; above it, the user did.
                Ok(Some(node)) => return Self::at(&here, node.kind, d == tree, tree),
                Err(_) => return None,
            }
        }
        None
    }

    /// The store named by `here/.git` (a `kind`); `in_tree`: `here` is
    /// the working tree itself.
    fn at(here: &Beneath, kind: EntryKind, in_tree: bool, tree: &Path) -> Option<Self> {
        // The git directory, and its path relative to `here` while it is
        // beneath the tree (pointers read from it must stay there too).
        let (gitdir, mut beneath_tree): (Beneath, Option<String>) = match kind {
            EntryKind::Dir => (here.sub(".git").ok()??, in_tree.then(|| ".git".to_owned())),
            EntryKind::File => {
                let text = here.read_capped(".git", GIT_TEXT_CAP).ok()??;
                let text = String::from_utf8(text).ok()?;
                let target = text.lines().next()?.trim().strip_prefix("gitdir:")?.trim().to_owned();
                match lexical_beneath("", &target) {
                    Some(rel) => (here.sub(&rel).ok()??, in_tree.then_some(rel)),
                    None if !in_tree => (Beneath::open(&here.path().join(&target)).ok()?, None),
                    None => (linked_worktree(here, &target, tree)?, None),
                }
            }
            EntryKind::Symlink | EntryKind::Special => return None,
        };
        let common = match gitdir.read_capped("commondir", GIT_TEXT_CAP).ok()? {
            None => gitdir,
            Some(bytes) => {
                let text = String::from_utf8(bytes).ok()?;
                let pointer = text.lines().next().unwrap_or("").trim();
                match beneath_tree.take() {
                    Some(at) => here.sub(&lexical_beneath(&at, pointer)?).ok()??,
                    None => Beneath::open(&gitdir.path().join(pointer)).ok()?,
                }
            }
        };
        let config = common.read_capped("config", GIT_TEXT_CAP).ok()?.unwrap_or_default();
        let config = String::from_utf8_lossy(&config);
        if config.contains("objectformat = sha256") || config.contains("objectFormat = sha256") {
            return None;
        }
        Some(Self { objects: common.sub("objects").ok()??, packs: std::cell::OnceCell::new() })
    }

    /// Whether the blob with the bytes of `file` is stored.
    fn stores(&self, file: &fs::File) -> bool {
        let Some(id) = blob_id(file) else { return false };
        let text = beneath::hex(&id);
        // A loose object is a regular file (a link there is not followed).
        if matches!(self.objects.node(&format!("{}/{}", &text[..2], &text[2..])), Ok(Some(n)) if n.kind == EntryKind::File)
        {
            return true;
        }
        let packs = self.packs.get_or_init(|| pack_indexes(&self.objects));
        packs.iter().any(|idx| idx.has(&id))
    }

    /// Whether changing `rel` from the lower to the upper content discards
    /// uncommitted work: the new bytes are a blob git stores, the old are
    /// not.
    fn discards(&self, low: &Beneath, up: &Beneath, rel: &str) -> bool {
        let (Ok(old), Ok(new)) = (low.open_file(rel), up.open_file(rel)) else { return false };
        self.stores(&new) && !self.stores(&old)
    }
}

/// `base` (a plain relative path) joined with the relative `pointer`,
/// resolved by name: `None` when `pointer` is absolute or climbs above
/// the directory `base` is relative to.
fn lexical_beneath(base: &str, pointer: &str) -> Option<String> {
    if pointer.starts_with('/') || pointer.is_empty() {
        return None;
    }
    let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
    for part in pointer.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            name => parts.push(name),
        }
    }
    Some(parts.join("/"))
}

/// A linked worktree's git directory (`gitdir: /repo/.git/worktrees/x` in
/// the tree's `.git` file): followed only when it lies outside the tree
/// and its own `gitdir` file names the tree's `.git` back, as `git
/// worktree add` writes it (a tool cannot write outside the tree, so it
/// cannot forge that answer).
fn linked_worktree(here: &Beneath, target: &str, tree: &Path) -> Option<Beneath> {
    let dir = Beneath::open(&here.path().join(target)).ok()?;
    let real = dir.real_path().ok()?;
    let tree_real = fs::canonicalize(tree).ok()?;
    if real.starts_with(&tree_real) {
        return None;
    }
    let back = dir.read_capped("gitdir", GIT_TEXT_CAP).ok()??;
    let back = String::from_utf8(back).ok()?;
    let dot_git = tree_real.join(".git");
    let named = Path::new(back.trim());
    (named == dot_git || fs::canonicalize(named).ok()? == dot_git).then_some(dir)
}

/// The version-2 pack indexes of `objects/pack` (at most
/// [`MAX_PACK_NAMES`] names looked at; each opened through [`Beneath`]).
fn pack_indexes(objects: &Beneath) -> Vec<PackIndex> {
    let Ok(Some(dir)) = objects.dir("pack") else { return Vec::new() };
    let Ok(listing) = rustix::fs::Dir::read_from(&dir) else { return Vec::new() };
    let mut names = Vec::new();
    for entry in listing.take(MAX_PACK_NAMES).flatten() {
        if let Ok(name) = entry.file_name().to_str()
            && name.ends_with(".idx")
        {
            names.push(name.to_owned());
        }
    }
    names.iter().filter_map(|name| PackIndex::open(objects, &format!("pack/{name}"))).collect()
}

impl PackIndex {
    /// Header: magic `\377tOc`, version 2; then 256 big-endian fan-out
    /// counts; then the sorted 20-byte ids.
    const HEADER: u64 = 8;
    const IDS: u64 = Self::HEADER + 256 * 4;

    fn open(objects: &Beneath, rel: &str) -> Option<Self> {
        let file = objects.open_file(rel).ok()?;
        let mut head = [0u8; Self::IDS as usize];
        read_exact_at(&file, &mut head, 0)?;
        if head[..4] != [0xff, b't', b'O', b'c'] || head[4..8] != [0, 0, 0, 2] {
            return None;
        }
        let mut fan = [0u32; 256];
        for (i, slot) in fan.iter_mut().enumerate() {
            let at = Self::HEADER as usize + i * 4;
            *slot = u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
        }
        let len = file.metadata().ok()?.len();
        if fan.windows(2).any(|w| w[0] > w[1]) || Self::IDS + u64::from(fan[255]) * 20 > len {
            return None;
        }
        Some(Self { file, fan })
    }

    /// Whether the index lists `id` (a binary search of the ids whose
    /// first byte is `id`'s, 20 bytes read per step).
    fn has(&self, id: &[u8; 20]) -> bool {
        let first = id[0] as usize;
        let (mut a, mut b) = (if first == 0 { 0 } else { self.fan[first - 1] }, self.fan[first]);
        let mut probe = [0u8; 20];
        while a < b {
            let mid = a + (b - a) / 2;
            if read_exact_at(&self.file, &mut probe, Self::IDS + u64::from(mid) * 20).is_none() {
                return false;
            }
            match probe[..].cmp(&id[..]) {
                std::cmp::Ordering::Equal => return true,
                std::cmp::Ordering::Less => a = mid + 1,
                std::cmp::Ordering::Greater => b = mid,
            }
        }
        false
    }
}

/// Fill `buf` from `file` at `offset`; `None` when the file is shorter.
fn read_exact_at(file: &fs::File, buf: &mut [u8], offset: u64) -> Option<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset).ok()
}

/// git's id of a blob with `file`'s bytes: SHA-1 of `blob <len>\0<bytes>`.
fn blob_id(file: &fs::File) -> Option<[u8; 20]> {
    use sha1::Digest as _;
    let len = file.metadata().ok()?.len();
    let mut hasher = sha1::Sha1::new();
    hasher.update(format!("blob {len}\0").as_bytes());
    let mut reader = file;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Some(hasher.finalize().into())
}

/// What a person is shown: a unified diff per text file, size and hash for
/// binary files, deletions listed; every name escaped
/// (`cairn_core::staged::shown`). Cut at `cap` bytes.
pub fn render_diff(changes: &ChangeSet, upper: &Path, lower: &Path, cap: usize) -> String {
    render_diff_from(changes, Created::default(), upper, lower, cap)
}

/// [`render_diff`], a created file's text taken from `created` when the
/// reader kept it.
fn render_diff_from(changes: &ChangeSet, mut created: Created, upper: &Path, lower: &Path, cap: usize) -> String {
    use cairn_core::staged::shown;
    let (Ok(up), Ok(low)) = (Beneath::open_own(upper), Beneath::open(lower)) else {
        return changes.listing();
    };
    let mut out = String::new();
    for c in &changes.changes {
        if out.len() > cap {
            out.push_str("[diff cut]\n");
            break;
        }
        let name = shown(&c.path);
        match c.kind {
            ChangeKind::Deleted => out.push_str(&format!("deleted: {name}\n")),
            ChangeKind::Created | ChangeKind::Modified => {
                let is_file = c.after.as_ref().is_some_and(|a| a.kind == EntryKind::File);
                if !is_file {
                    continue;
                }
                let old = if c.kind == ChangeKind::Created { Some(String::new()) } else { text_of(&low, &c.path) };
                let kept = if c.kind == ChangeKind::Created { created.bytes.remove(&c.path) } else { None };
                let new = match kept {
                    Some(bytes) => text(bytes),
                    None => text_of(&up, &c.path),
                };
                match (old, new) {
                    (Some(a), Some(b)) => {
                        let patch = diffy::create_patch(&a, &b).to_string();
                        let body = patch.split_once('\n').and_then(|(_, r)| r.split_once('\n')).map_or("", |(_, r)| r);
                        out.push_str(&format!("--- a/{name}\n+++ b/{name}\n{body}"));
                    }
                    _ => {
                        let state = c.after.as_ref();
                        out.push_str(&format!(
                            "binary {name}: {} bytes, sha256 {}{}\n",
                            state.map_or(0, |s| s.size),
                            state.map_or("", |s| s.sha256.as_str()),
                            if c.appends { " (appended to)" } else { "" }
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
/// Every path is resolved beneath a descriptor of `cwd` and of `upper`
/// ([`Beneath`]): no link is followed on either side, nothing leaves the
/// tree. Idempotent: a path already in its staged state is left alone,
/// each file is written to a fresh temporary name (`O_EXCL`, random) in
/// its directory with the reviewed bytes (checked by hash while copied,
/// holes kept, setuid/setgid dropped), made durable (`syncfs`) before it is
/// renamed over the target within the same directory descriptor;
/// deletions of missing paths are no-ops; so a crash during the apply is
/// finished by applying again. A change set whose result holds a FIFO,
/// socket or device is refused before anything is touched.
///
/// A created file whose staged copy can stand in the tree as it is (same
/// file system, one link, owned as a file cairn creates there would be,
/// no extended attributes, no default ACL on its directory) is not copied
/// but moved (`renameat2(RENAME_NOREPLACE)`) after its bytes were hashed
/// and its mode set, and checked to be the inode that was hashed once it
/// is in place ([`Movable`]; issue 49.10: the copy was most of a staged
/// build's extra time). Its bytes are durable already: the layer is
/// synced before its change set is recorded (`Staging::sync`), which
/// [`settle`] sees to. The command's processes
/// must be gone (`writers`, [`Writers::Gone`]: the call's PID namespace
/// ended with it, `process::RunOutcome::contained`), so nothing of the
/// command still holds the moved file open; else every file is copied.
pub fn apply(changes: &ChangeSet, upper: &Path, cwd: &Path, writers: Writers) -> Result<(), StagingError> {
    let tree = Beneath::open(cwd).map_err(io(format!("cannot open the working tree {}", cwd.display())))?;
    // The staging layer is opened only when something must be copied from
    // it: a finished apply re-applied after the layer was removed is a
    // no-op.
    let mut stage: Option<Beneath> = None;
    // First, before touching anything: every path must be as the command
    // found it (not applied yet) or as it left it (applied already);
    // anything else is a concurrent change that applying would destroy.
    // The states read here serve the "already applied" test below too:
    // the deletions in between remove only paths of their own.
    let mut found = Vec::with_capacity(changes.changes.len());
    let mut absent = std::collections::HashSet::new();
    for c in &changes.changes {
        if c.after.as_ref().is_some_and(|a| a.kind == EntryKind::Special) {
            return Err(StagingError::Special { path: cairn_core::staged::shown(&c.path) });
        }
        // Below a directory the tree did not have a moment ago nothing
        // exists either: not looked up (a build's new output directory
        // costs one lookup, not one per file; issue 49.10).
        let parent = c.path.rsplit_once('/').map(|(parent, _)| parent);
        let now = if parent.is_some_and(|p| absent.contains(p)) { None } else { recorded(&tree, &c.path)? };
        if now.is_none() && c.after.as_ref().is_some_and(|a| a.kind == EntryKind::Dir) {
            absent.insert(c.path.as_str());
        }
        if now != c.before.clone().map(writable) && now != c.after {
            return Err(StagingError::Conflict { path: cairn_core::staged::shown(&c.path) });
        }
        found.push(now);
    }
    // Deletions deepest first, then creations and modifications in path
    // order (parents before children).
    let mut deletions: Vec<&Change> = changes.changes.iter().filter(|c| c.kind == ChangeKind::Deleted).collect();
    deletions.sort_by(|a, b| b.path.cmp(&a.path));
    for c in &deletions {
        tree.remove(&c.path).map_err(io_at(format!("cannot delete {}", tree.show(&c.path))))?;
    }
    // Files and symlinks are written to temporary names first, made
    // durable with one `syncfs`, then renamed into place, and the renames
    // made durable with another (a crash in between is finished by the
    // next apply: the change set is in the log). A failure on the way
    // (ENOSPC, EIO, a refused copy) removes every temporary not renamed
    // yet: nothing of cairn's is left in the tree. Files moved from the
    // layer are checked in that step and moved with the renames.
    let mut plan = Plan::default();
    let written = write_temporaries(changes, &found, &tree, upper, &mut stage, writers, &mut plan);
    if let Err(e) = written {
        discard_temporaries(&tree, &plan.renames);
        return Err(e);
    }
    if plan.renames.is_empty() && plan.moves.is_empty() && deletions.is_empty() && plan.dir_modes.is_empty() {
        return Ok(());
    }
    // Only copies need flushing before they are renamed: a moved file's
    // bytes were made durable with its layer.
    if !plan.renames.is_empty()
        && let Err(e) = tree.sync()
    {
        discard_temporaries(&tree, &plan.renames);
        return Err(StagingError::Io { what: format!("cannot sync the file system of {}", cwd.display()), source: e });
    }
    for (i, (temp, rel)) in plan.renames.iter().enumerate() {
        if let Err(e) = tree.rename_into(temp, rel) {
            discard_temporaries(&tree, &plan.renames[i..]);
            return Err(StagingError::Io { what: format!("cannot rename onto {}", tree.show(rel)), source: e });
        }
    }
    if let Some(stage) = &stage {
        for m in &plan.moves {
            move_into(stage, &tree, m)?;
        }
    }
    plan.dir_modes.sort_by(|a, b| b.0.cmp(a.0));
    for (rel, mode) in &plan.dir_modes {
        tree.set_dir_mode(rel, *mode).map_err(io_at(format!("cannot set the mode of {}", tree.show(rel))))?;
    }
    make_durable(&tree, changes, &plan).map_err(io(format!("cannot sync the file system of {}", cwd.display())))
}

/// What [`write_temporaries`] prepared: temporaries to rename (each
/// pushed as it is made, so a failure leaves the list to remove), staged
/// files to move, directories whose mode is set last.
#[derive(Default)]
struct Plan<'a> {
    renames: Vec<(String, &'a str)>,
    moves: Vec<Move<'a>>,
    dir_modes: Vec<(&'a str, u32)>,
}

/// A staged file checked to be moved ([`Movable`]): open (so its inode
/// stays the one hashed), its device and inode, where it goes, and its
/// reviewed state.
struct Move<'a> {
    file: fs::File,
    inode: (u64, u64),
    rel: &'a str,
    after: &'a FileState,
}

/// Most directories [`make_durable`] flushes one by one; past this, one
/// `syncfs` is cheaper (the pre-image store's rule too).
const FEW_DIRS: usize = 16;

/// Make an apply's renames, moves, deletions and modes durable: `fsync`
/// of each directory that holds a changed name (and each changed
/// directory), or one `syncfs` when there are many. Flushing only these
/// leaves the other writers of a shared disk alone (a `syncfs` writes
/// their dirty data too: seconds on a disk busy with builds).
fn make_durable(tree: &Beneath, changes: &ChangeSet, plan: &Plan<'_>) -> std::io::Result<()> {
    let mut dirs: Vec<&str> = changes
        .changes
        .iter()
        .map(|c| c.path.rsplit_once('/').map_or("", |(parent, _)| parent))
        .chain(plan.dir_modes.iter().map(|(rel, _)| *rel))
        .collect();
    dirs.sort_unstable();
    dirs.dedup();
    if dirs.len() > FEW_DIRS {
        return tree.sync();
    }
    for dir in dirs {
        if let Some(fd) = tree.dir(dir)? {
            rustix::fs::fsync(&fd)?;
        }
    }
    Ok(())
}

/// [`apply`]'s second step: every created or modified file and link of
/// `changes` not already in its staged state (`found`) written to a
/// temporary beside it, or checked to be moved as it is ([`Movable`]),
/// every directory created.
fn write_temporaries<'a>(
    changes: &'a ChangeSet,
    found: &[Option<FileState>],
    tree: &Beneath,
    upper: &Path,
    stage: &mut Option<Beneath>,
    writers: Writers,
    plan: &mut Plan<'a>,
) -> Result<(), StagingError> {
    let mut movable = Movable::new(tree);
    let may_hold = move_budget();
    for (c, now) in changes.changes.iter().zip(found).filter(|(c, _)| c.kind != ChangeKind::Deleted) {
        let Some(after) = &c.after else { continue };
        if now.as_ref() == Some(after) {
            continue;
        }
        let at = |what: &str| io_at(format!("cannot {what} {}", tree.show(&c.path)));
        match after.kind {
            EntryKind::Dir => {
                if tree.node(&c.path).map_err(at("stat"))?.is_some_and(|n| n.kind != EntryKind::Dir) {
                    tree.remove(&c.path).map_err(at("replace"))?;
                }
                // Writable by its owner until its contents are in place (a
                // non-root cairn could not fill a `chmod 555` directory);
                // its own mode is set last, deepest first.
                tree.make_dir(&c.path, after.mode | 0o700).map_err(at("create"))?;
                plan.dir_modes.push((&c.path, after.mode));
            }
            EntryKind::Symlink => {
                let link = staged(stage, upper, &c.path)?.read_link(&c.path).map_err(at("read the staged link for"))?;
                let temp = tree.symlink_temp(&c.path, &link).map_err(at("create a link for"))?;
                plan.renames.push((temp, &c.path));
            }
            EntryKind::File => {
                let (source, st) =
                    staged(stage, upper, &c.path)?.open_regular(&c.path).map_err(at("read the staged content of"))?;
                if writers == Writers::Gone
                    && plan.moves.len() < may_hold
                    && c.kind == ChangeKind::Created
                    && now.is_none()
                    && movable.check(&st, &source, &c.path).map_err(at("stat"))?
                {
                    let (size, digest, _) = beneath::hash_keeping(&source, Some(st.st_size as u64), 0)
                        .map_err(at("read the staged content of"))?;
                    if size != after.size || digest != after.sha256 {
                        return Err(StagingError::Io {
                            what: format!(
                                "the staged content of {} changed after it was reviewed; nothing of it was applied",
                                tree.show(&c.path)
                            ),
                            source: std::io::ErrorKind::InvalidData.into(),
                        });
                    }
                    rustix::fs::fchmod(&source, rustix::fs::Mode::from_raw_mode(after.mode & beneath::WRITABLE_MODE))
                        .map_err(|e| at("set the mode of")(e.into()))?;
                    plan.moves.push(Move { file: source, inode: (st.st_dev, st.st_ino), rel: &c.path, after });
                    continue;
                }
                let temp = tree.write_temp(&c.path, &source, after.mode, &after.sha256).map_err(at("write"))?;
                plan.renames.push((temp, &c.path));
            }
            EntryKind::Special => return Err(StagingError::Special { path: cairn_core::staged::shown(&c.path) }),
        }
    }
    Ok(())
}

/// Descriptors an apply leaves for everything else of the process (its
/// other threads, the tree's and the layer's directory handles, a
/// copy's temporaries).
const SPARE_DESCRIPTORS: u64 = 64;

/// How many staged files one apply may hold open to move them: each
/// [`Move`] keeps its file open until it is renamed (so the inode checked
/// is the one placed), and a build creating more files than the soft
/// open-file limit allows must not fail with "too many open files" (the
/// common default is 1,024). Past the budget, files are copied, which
/// holds nothing open. Measured at each apply from the limit and the
/// descriptors open now, so an embedding application's own use counts.
fn move_budget() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
    let open = std::fs::read_dir("/proc/self/fd").map_or(limit, |dir| dir.count() as u64);
    usize::try_from(limit.saturating_sub(open).saturating_sub(SPARE_DESCRIPTORS)).unwrap_or(usize::MAX)
}

/// Whether a staged file may be moved into the tree as it is rather than
/// copied: only when the moved file is what a copy would have made. It
/// must be on the tree's file system (a rename cannot cross), have one
/// link (no other name, in the layer or anywhere, reaches its inode), be
/// owned by cairn's user and the group a file created in its directory
/// would get (a setgid directory's), and carry no extended attribute (a
/// file capability, an overlayfs mark, a label), in a directory without
/// a default ACL (a copy would inherit it). Anything else is copied.
struct Movable<'t> {
    tree: &'t Beneath,
    uid: u32,
    gid: u32,
    /// Per directory of the tree: its device and the group of a file
    /// created in it, or `None` when it has a default ACL.
    dirs: std::collections::HashMap<String, Option<(u64, u32)>>,
}

impl<'t> Movable<'t> {
    fn new(tree: &'t Beneath) -> Self {
        Self {
            tree,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            dirs: Default::default(),
        }
    }

    /// `st`: the `fstat` of the open staged file `source`.
    fn check(&mut self, st: &rustix::fs::Stat, source: &fs::File, rel: &str) -> std::io::Result<bool> {
        let parent = rel.rsplit_once('/').map_or("", |(parent, _)| parent);
        if !self.dirs.contains_key(parent) {
            let info = match self.tree.dir(parent)? {
                None => None,
                Some(fd) => {
                    let st = rustix::fs::fstat(&fd)?;
                    let mut probe = [0u8; 1];
                    let acl = match rustix::fs::fgetxattr(&fd, "system.posix_acl_default", &mut probe[..]) {
                        Ok(_) | Err(rustix::io::Errno::RANGE) => true,
                        Err(_) => false,
                    };
                    let gid = if st.st_mode & libc::S_ISGID != 0 { st.st_gid } else { self.gid };
                    (!acl).then_some((st.st_dev, gid))
                }
            };
            self.dirs.insert(parent.to_owned(), info);
        }
        let Some(Some((dev, gid))) = self.dirs.get(parent).copied() else { return Ok(false) };
        if st.st_dev != dev || st.st_nlink != 1 || st.st_uid != self.uid || st.st_gid != gid {
            return Ok(false);
        }
        Ok(rustix::fs::flistxattr_query(source)? == 0)
    }
}

/// Move the checked staged file `file` (see [`Movable`]) from the layer
/// onto `rel` of the tree, which must not exist (`RENAME_NOREPLACE`),
/// then check that the inode now at `rel` is the one that was hashed (a
/// name of the layer swapped in between would otherwise be applied
/// unreviewed: it is removed again and the apply fails). Where the
/// rename cannot be made (another mount of the same file system, a
/// directory of the layer the command made read-only), the file is
/// copied instead, flushed and renamed.
fn move_into(stage: &Beneath, tree: &Beneath, m: &Move<'_>) -> Result<(), StagingError> {
    let Move { file, inode: hashed, rel, after } = m;
    let fail = |what: &str| io_at(format!("cannot {what} {}", tree.show(rel)));
    let (from, name) = stage.parent(rel).map_err(fail("find the staged"))?.ok_or_else(|| StagingError::Io {
        what: format!("the staged directory of {} is missing", tree.show(rel)),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    let (to, _) = tree.parent(rel).map_err(fail("open the directory of"))?.ok_or_else(|| StagingError::Io {
        what: format!("the parent of {} is missing", tree.show(rel)),
        source: std::io::ErrorKind::NotFound.into(),
    })?;
    match rustix::fs::renameat_with(&from, name, &to, name, rustix::fs::RenameFlags::NOREPLACE) {
        Ok(()) => {}
        Err(rustix::io::Errno::EXIST) => return Err(StagingError::Conflict { path: cairn_core::staged::shown(rel) }),
        Err(
            rustix::io::Errno::XDEV | rustix::io::Errno::ACCESS | rustix::io::Errno::PERM | rustix::io::Errno::INVAL,
        ) => {
            let temp = tree.write_temp(rel, file, after.mode, &after.sha256).map_err(fail("write"))?;
            let flushed = rustix::fs::openat(
                &to,
                temp.as_str(),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .and_then(|fd| rustix::fs::fsync(&fd));
            if let Err(e) = flushed.map_err(std::io::Error::from).and_then(|()| tree.rename_into(&temp, rel)) {
                let _ = tree.remove_temp(rel, &temp);
                return Err(fail("write")(e));
            }
            return Ok(());
        }
        Err(e) => return Err(fail("move the staged file onto")(e.into())),
    }
    let placed =
        rustix::fs::statat(&to, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).map_err(|e| fail("stat")(e.into()))?;
    if (placed.st_dev, placed.st_ino) != *hashed {
        let _ = rustix::fs::unlinkat(&to, name, rustix::fs::AtFlags::empty());
        return Err(StagingError::Io {
            what: format!(
                "the staged file of {} was replaced after it was checked; it was not applied",
                tree.show(rel)
            ),
            source: std::io::ErrorKind::InvalidData.into(),
        });
    }
    Ok(())
}

/// Remove the temporaries `renames` names (best effort: one that cannot
/// be removed now is removed by the next apply's resume or left as
/// disk; the error the caller returns says what failed).
fn discard_temporaries(tree: &Beneath, renames: &[(String, &str)]) {
    for (temp, rel) in renames {
        let _ = tree.remove_temp(rel, temp);
    }
}

/// The staging layer, opened on first use (for `rel`).
fn staged<'a>(slot: &'a mut Option<Beneath>, upper: &Path, rel: &str) -> Result<&'a Beneath, StagingError> {
    if slot.is_none() {
        let opened = Beneath::open_own(upper)
            .map_err(io_at(format!("cannot open the staging layer {} to apply {rel}", upper.display())))?;
        *slot = Some(opened);
    }
    slot.as_ref().ok_or_else(|| StagingError::Io {
        what: format!("cannot open the staging layer {}", upper.display()),
        source: std::io::ErrorKind::NotFound.into(),
    })
}

/// Remove the temporaries an interrupted apply of `changes` left in the
/// directories it writes (best effort; only cairn's random names).
pub fn remove_temporaries(changes: &ChangeSet, cwd: &Path) {
    let Ok(tree) = Beneath::open(cwd) else { return };
    let mut dirs: Vec<&str> =
        changes.changes.iter().map(|c| c.path.rsplit_once('/').map_or("", |(parent, _)| parent)).collect();
    dirs.sort_unstable();
    dirs.dedup();
    for dir in dirs {
        let _ = tree.remove_temps(dir);
    }
}

/// Flush the file system holding `path` (`syncfs`).
fn sync_fs(path: &Path) -> Result<(), StagingError> {
    beneath::sync_dir(path).map_err(io(format!("cannot sync the file system of {}", path.display())))
}
