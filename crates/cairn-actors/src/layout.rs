//! The on-disk layout of a world, the registry file, the world lock and the
//! path rules for broker requests. Owns file placement only: it never runs
//! actors or routes messages.
//!
//! ```text
//! DIR/.lock                          one running world per directory
//! DIR/broker/registry.json           actors, versions, subscriptions, counters
//! DIR/broker/versions/<id>/<n>/      actor.wasm|actor.wat, source/, meta.json, snapshot/
//!                                    (the running version and the newest few others)
//! DIR/broker/mailbox/<id>.jsonl      queued (not yet delivered) messages
//! DIR/broker/journal.jsonl           the world's journal (live checks' verdicts)
//! DIR/actor/<id>/public|source       readable by every actor as /actor/<id>/...
//! DIR/actor/<id>/status.json|stderr.log   written by the broker
//! DIR/data/<id>/                     the actor's private /data
//! DIR/archive/<id>-<n>/              what `remove` moved away
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors of the layout layer.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// An I/O failure, with the path involved.
    #[error("{path}: {source}")]
    Io {
        /// The path the operation was on.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The registry file is not valid.
    #[error("{path}: registry is not valid JSON ({msg}); restore it from a backup or remove the world")]
    BadRegistry {
        /// Registry path.
        path: PathBuf,
        /// Parser message.
        msg: String,
    },
    /// Another `cairn world run` holds the lock.
    #[error("{0}: another process is running this world (lock held); stop it first")]
    Locked(PathBuf),
    /// A request path broke the path rules.
    #[error("path {0:?} refused: {1}")]
    BadPath(String, &'static str),
    /// A tree to copy is larger than the copy may be.
    #[error("{0}: too large to copy: {1}")]
    TooLarge(PathBuf, String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LayoutError + '_ {
    move |source| LayoutError::Io { path: path.to_owned(), source }
}

/// What the user wants an actor to be doing; survives restarts of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Desired {
    /// Started when the world runs, restarted after crashes.
    Running,
    /// Kept, not started.
    Stopped,
}

/// One actor in the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorEntry {
    /// Current version number (1-based).
    pub version: u32,
    /// Highest version number ever installed.
    pub latest: u32,
    /// Who spawned it (may upgrade/stop/remove it besides the agent and console).
    pub spawner: String,
    /// Running or stopped.
    pub desired: Desired,
    /// Actors (or natives) receiving this actor's messages without `to`.
    #[serde(default)]
    pub subscribers: BTreeSet<String>,
    /// Whether the spawn request declared outgoing HTTP (it may then send
    /// to the native `http`).
    #[serde(default)]
    pub http: bool,
    /// Set by an upgrade, cleared by a rollback: the crash-loop watch,
    /// kept in the registry so a host crash between an upgrade's crashes
    /// does not forget them (the new version would else crash-loop for
    /// ever).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<UpgradeWatch>,
    /// Limits the spawn request set for this actor, each at most the
    /// world's (see `runtime::Limits`); absent ones are the world's.
    #[serde(default, skip_serializing_if = "ActorLimits::is_empty")]
    pub limits: ActorLimits,
}

/// Per-actor limits below the world's, as a spawn request gave them (or
/// its spawner had, for those it did not give: an actor's child never gets
/// more than the actor). Each is a cap on the field of the same name of
/// `runtime::Limits`; the broker applies the lower of it and the world's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorLimits {
    /// All linear memories together, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// All table elements together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_elements: Option<u64>,
    /// Core instances of an instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<u64>,
    /// Linear memories of an instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memories: Option<u64>,
    /// Tables of an instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tables: Option<u64>,
    /// `/data` + `/public`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// `/data` + `/public`, files and directories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_entries: Option<u64>,
    /// Fuel per instance (only in a world that meters fuel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fuel: Option<u64>,
}

impl ActorLimits {
    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        *self == ActorLimits::default()
    }
}

/// What the crash-loop rule needs to remember about the last upgrade
/// (wall-clock milliseconds: they must mean something to the next run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeWatch {
    /// When the new version started.
    pub since_ms: u64,
    /// The version to roll back to.
    pub prev: u32,
    /// Who asked for the upgrade (told of an automatic rollback).
    pub requester: String,
    /// Crashes of the new version since, within the crash window.
    #[serde(default)]
    pub crashes_ms: Vec<u64>,
}

/// The registry: every live actor and the message counter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Registry {
    /// Last `m-<n>` number handed out (as of the last save).
    pub next_msg: u64,
    /// Numbers up to this one may have been handed out since the last save
    /// (the broker reserves them in blocks); a new run starts above it.
    #[serde(default)]
    pub msg_reserved: u64,
    /// Live actors by id.
    pub actors: BTreeMap<String, ActorEntry>,
    /// Subscriptions to native participants (e.g. `agent`) — kept apart so
    /// an actor entry is not needed for them.
    #[serde(default)]
    pub native_subscribers: BTreeMap<String, BTreeSet<String>>,
}

/// Paths of one world directory.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// A layout rooted at `root` (nothing is created).
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        Layout { root: root.into() }
    }
    /// The world directory.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// `broker/registry.json`.
    pub fn registry(&self) -> PathBuf {
        self.root.join("broker").join("registry.json")
    }
    /// `actor/` — the tree every actor sees read-only as `/actor`.
    pub fn actor_root(&self) -> PathBuf {
        self.root.join("actor")
    }
    /// `actor/<id>/`.
    pub fn actor_dir(&self, id: &str) -> PathBuf {
        self.actor_root().join(id)
    }
    /// `actor/<id>/public/`.
    pub fn public(&self, id: &str) -> PathBuf {
        self.actor_dir(id).join("public")
    }
    /// `actor/<id>/source/`.
    pub fn source(&self, id: &str) -> PathBuf {
        self.actor_dir(id).join("source")
    }
    /// `data/<id>/`.
    pub fn data(&self, id: &str) -> PathBuf {
        self.root.join("data").join(id)
    }
    /// `broker/versions/<id>/<n>/`.
    pub fn version(&self, id: &str, n: u32) -> PathBuf {
        self.root.join("broker").join("versions").join(id).join(n.to_string())
    }
    /// `broker/journal.jsonl`: the world's journal (events such as a
    /// live check's verdict, one JSON object a line).
    pub fn journal(&self) -> PathBuf {
        self.root.join("broker").join("journal.jsonl")
    }
    /// `broker/mailbox/<id>.jsonl`.
    pub fn mailbox(&self, id: &str) -> PathBuf {
        self.root.join("broker").join("mailbox").join(format!("{id}.jsonl"))
    }
    /// `archive/`.
    pub fn archive(&self) -> PathBuf {
        self.root.join("archive")
    }

    /// Creates the directories of an empty world (idempotent) and an empty
    /// registry if there is none.
    pub fn init(&self) -> Result<(), LayoutError> {
        for d in [
            self.root.join("broker").join("versions"),
            self.root.join("broker").join("mailbox"),
            self.actor_root(),
            self.root.join("data"),
            self.archive(),
        ] {
            fs::create_dir_all(&d).map_err(io(&d))?;
        }
        if !self.registry().exists() {
            self.save_registry(&Registry::default())?;
        }
        Ok(())
    }

    /// `broker/versions/<id>`: every version of an actor.
    pub fn versions(&self, id: &str) -> PathBuf {
        self.root.join("broker").join("versions").join(id)
    }

    /// The version numbers installed for `id` (directories
    /// `broker/versions/<id>/<n>`), ascending. A version being deleted
    /// (renamed to `.pruned-<n>` first, see [`Layout::delete_version`])
    /// is not one.
    pub fn installed_versions(&self, id: &str) -> Vec<u32> {
        let Ok(rd) = fs::read_dir(self.versions(id)) else { return Vec::new() };
        let mut v: Vec<u32> = rd
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
            .collect();
        v.sort_unstable();
        v
    }

    /// Deletes version `n` of `id` so that a crash at any moment leaves
    /// the version whole or gone: the directory is first renamed out of
    /// the version names (`.pruned-<n>`, one atomic rename, the parent
    /// fsynced), then removed; [`Layout::sweep_pruned`] finishes a removal
    /// a crash cut short.
    pub fn delete_version(&self, id: &str, n: u32) -> Result<(), LayoutError> {
        let from = self.version(id, n);
        let doomed = self.versions(id).join(format!(".pruned-{n}"));
        if doomed.exists() {
            fs::remove_dir_all(&doomed).map_err(io(&doomed))?;
        }
        fs::rename(&from, &doomed).map_err(io(&from))?;
        if let Ok(d) = fs::File::open(self.versions(id)) {
            let _ = d.sync_all();
        }
        fs::remove_dir_all(&doomed).map_err(io(&doomed))
    }

    /// Removes what a deletion of versions of `id` left behind when the
    /// host died in it (`.pruned-<n>` directories).
    pub fn sweep_pruned(&self, id: &str) -> Result<(), LayoutError> {
        let Ok(rd) = fs::read_dir(self.versions(id)) else { return Ok(()) };
        for e in rd.flatten() {
            if e.file_name().to_str().is_some_and(|n| n.starts_with(".pruned-")) {
                fs::remove_dir_all(e.path()).map_err(io(&e.path()))?;
            }
        }
        Ok(())
    }

    /// Creates an actor's directories.
    pub fn init_actor(&self, id: &str) -> Result<(), LayoutError> {
        for d in [self.public(id), self.source(id), self.data(id)] {
            fs::create_dir_all(&d).map_err(io(&d))?;
        }
        Ok(())
    }

    /// Takes the world lock (held as long as the returned file lives): an
    /// exclusive `flock` on the world directory itself, which no one can
    /// delete while it holds the world (deleting `.lock`, a file, let a
    /// second run lock a new file of the same name, issue 48.8). `.lock` is
    /// still created, for whoever looks for it, but proves nothing.
    pub fn lock(&self) -> Result<fs::File, LayoutError> {
        let p = self.root.join(".lock");
        let _ = fs::OpenOptions::new().create(true).truncate(false).write(true).open(&p);
        let d = fs::File::open(&self.root).map_err(io(&self.root))?;
        match d.try_lock() {
            Ok(()) => Ok(d),
            Err(fs::TryLockError::WouldBlock) => Err(LayoutError::Locked(self.root.clone())),
            Err(fs::TryLockError::Error(e)) => Err(LayoutError::Io { path: self.root.clone(), source: e }),
        }
    }

    /// Reads the registry.
    pub fn load_registry(&self) -> Result<Registry, LayoutError> {
        let p = self.registry();
        let text = fs::read_to_string(&p).map_err(io(&p))?;
        serde_json::from_str(&text).map_err(|e| LayoutError::BadRegistry { path: p, msg: e.to_string() })
    }

    /// Writes the registry atomically (temp file, fsync, rename, fsync dir).
    pub fn save_registry(&self, reg: &Registry) -> Result<(), LayoutError> {
        let text = serde_json::to_vec_pretty(reg).unwrap_or_default();
        write_atomic(&self.registry(), &text)
    }
}

/// Replaces `path` with `bytes` so a crash leaves the old or the new file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), LayoutError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".tmp-{}", path.file_name().and_then(|n| n.to_str()).unwrap_or("file")));
    let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(io(path))?;
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Copies a directory tree (files and directories; symlinks are skipped).
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), LayoutError> {
    fs::create_dir_all(to).map_err(io(to))?;
    let Ok(rd) = fs::read_dir(from) else {
        return Ok(());
    };
    for e in rd {
        let e = e.map_err(io(from))?;
        let ft = e.file_type().map_err(io(&e.path()))?;
        let dst = to.join(e.file_name());
        if ft.is_dir() {
            copy_tree(&e.path(), &dst)?;
        } else if ft.is_file() {
            fs::copy(e.path(), &dst).map_err(io(&dst))?;
        }
    }
    Ok(())
}

/// Bytes of the regular files under `dir` and its entries (files,
/// directories and anything else), recursively, symlinks not followed;
/// unreadable entries count one entry and no bytes, a missing `dir` is
/// `(0, 0)`.
pub fn tree_usage(dir: &Path) -> (u64, usize) {
    let Ok(rd) = fs::read_dir(dir) else { return (0, 0) };
    rd.flatten().fold((0, 0), |(bytes, entries), e| {
        let (b, n) = match e.file_type() {
            Ok(t) if t.is_dir() => tree_usage(&e.path()),
            Ok(t) if t.is_file() => (e.metadata().map(|m| m.len()).unwrap_or(0), 0),
            _ => (0, 0),
        };
        (bytes + b, entries + n + 1)
    })
}

/// Bytes and entries under `dir` (recursively, symlinks not followed),
/// stopping with an error as soon as either passes its cap: a source copy
/// is measured before it is made, and never walks a huge tree whole.
pub fn tree_within(dir: &Path, max_bytes: u64, max_entries: usize) -> Result<(u64, usize), String> {
    fn walk(d: &Path, acc: &mut (u64, usize), max_bytes: u64, max_entries: usize) -> Result<(), String> {
        let rd = fs::read_dir(d).map_err(|e| format!("{}: {e}", d.display()))?;
        for e in rd {
            let e = e.map_err(|e| format!("{}: {e}", d.display()))?;
            acc.1 += 1;
            if acc.1 > max_entries {
                return Err(format!("it holds more than {max_entries} files and directories"));
            }
            let ty = e.file_type().map_err(|e| e.to_string())?;
            if ty.is_dir() {
                walk(&e.path(), acc, max_bytes, max_entries)?;
            } else if ty.is_file() {
                acc.0 += e.metadata().map(|m| m.len()).unwrap_or(0);
                if acc.0 > max_bytes {
                    return Err(format!("it holds more than {max_bytes} bytes"));
                }
            }
        }
        Ok(())
    }
    let mut acc = (0, 0);
    if dir.is_dir() {
        walk(dir, &mut acc, max_bytes, max_entries)?;
    } else if dir.exists() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    Ok(acc)
}

/// [`copy_tree`] that stops with [`LayoutError::TooLarge`] once more than
/// `max_bytes` or `max_entries` have been copied (counted while copying,
/// so a tree growing meanwhile cannot pass the cap either).
pub fn copy_tree_within(from: &Path, to: &Path, max_bytes: u64, max_entries: usize) -> Result<(), LayoutError> {
    fn walk(from: &Path, to: &Path, acc: &mut (u64, usize), caps: (u64, usize), top: &Path) -> Result<(), LayoutError> {
        fs::create_dir_all(to).map_err(io(to))?;
        let Ok(rd) = fs::read_dir(from) else {
            return Ok(());
        };
        for e in rd {
            let e = e.map_err(io(from))?;
            acc.1 += 1;
            if acc.1 > caps.1 {
                return Err(LayoutError::TooLarge(top.to_owned(), format!("more than {} entries", caps.1)));
            }
            let ft = e.file_type().map_err(io(&e.path()))?;
            let dst = to.join(e.file_name());
            if ft.is_dir() {
                walk(&e.path(), &dst, acc, caps, top)?;
            } else if ft.is_file() {
                acc.0 += fs::copy(e.path(), &dst).map_err(io(&dst))?;
                if acc.0 > caps.0 {
                    return Err(LayoutError::TooLarge(top.to_owned(), format!("more than {} bytes", caps.0)));
                }
            }
        }
        Ok(())
    }
    walk(from, to, &mut (0, 0), (max_bytes, max_entries), from)
}

/// Replaces the tree `to` with a copy of `from` (an absent `from` leaves an
/// empty directory).
pub fn replace_tree(from: &Path, to: &Path) -> Result<(), LayoutError> {
    if to.exists() {
        fs::remove_dir_all(to).map_err(io(to))?;
    }
    copy_tree(from, to)
}

/// Resolves a path given in a broker request by `sender`:
/// `/actor/...` is global, `/public/...` and `/data/...` are the sender's,
/// `..` is refused; a native sender may also give an absolute host path.
pub fn resolve(layout: &Layout, sender: &str, native: bool, path: &str) -> Result<PathBuf, LayoutError> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(LayoutError::BadPath(path.into(), "must be absolute"));
    }
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(LayoutError::BadPath(path.into(), "'..' is not allowed"));
    }
    let rest = |prefix: &str| p.strip_prefix(prefix).ok().map(Path::to_path_buf);
    if let Some(r) = rest("/actor") {
        return Ok(layout.actor_root().join(r));
    }
    if !native {
        if let Some(r) = rest("/public") {
            return Ok(layout.public(sender).join(r));
        }
        if let Some(r) = rest("/data") {
            return Ok(layout.data(sender).join(r));
        }
        return Err(LayoutError::BadPath(path.into(), "actors may only name /actor/..., /public/... or /data/..."));
    }
    Ok(p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_rules() {
        let l = Layout::new("/w");
        let r = |s: &str, n: bool, p: &str| resolve(&l, s, n, p).ok();
        assert_eq!(r("a", false, "/actor/b/public/x"), Some("/w/actor/b/public/x".into()));
        assert_eq!(r("a", false, "/public/x.wasm"), Some("/w/actor/a/public/x.wasm".into()));
        assert_eq!(r("a", false, "/data/x"), Some("/w/data/a/x".into()));
        assert_eq!(r("a", false, "/data/../../etc/passwd"), None);
        assert_eq!(r("a", false, "/etc/passwd"), None);
        assert_eq!(r("a", false, "data/x"), None);
        assert_eq!(r("console", true, "/tmp/x.wasm"), Some("/tmp/x.wasm".into()));
        assert_eq!(r("console", true, "/tmp/../x"), None);
    }
}
