//! A call's private temp directory (`TMPDIR`, and `/tmp` inside the
//! sandbox's mount namespace): created for one call or service, removed
//! with it, and — when the cairn that made it was killed before it could
//! remove it — removed by the next cairn that runs a program.
//!
//! Telling a leftover from a directory in use: its owner holds an advisory
//! lock (`flock`) on the directory for as long as it lives, and the kernel
//! drops that lock when the owner dies however it dies. A directory whose
//! lock can be taken, owned by this user and older than a minute (the
//! moment between creating and locking), is a leftover. The programs a
//! call starts die with cairn (`PR_SET_PDEATHSIG`, the PID namespace), so
//! nothing still uses a leftover.
//!
//! Owns: naming, locking, removal and the sweep of these directories, and
//! removing a tree its non-root owner made unreadable (`remove_tree`, for
//! staging too). Must
//! not: touch anything in the temp directory but its own prefixes, follow
//! a link, or remove another user's directory.

use std::fs::{self, File};
use std::path::Path;
use std::time::Duration;

/// The prefixes of call directories (one per kind of owner).
pub(crate) const CALL: &str = "cairn-tool-";
/// A long-lived service's directory.
pub(crate) const SERVICE: &str = "cairn-service-";
/// The overlay probe's directory (`staging::overlay_status`): unlocked,
/// since it lives only for the probe's fork, well under the settle time;
/// swept because cairn before 2026-12-03 left one behind per run as a
/// non-root user.
pub(crate) const PROBE: &str = "cairn-overlay-probe-";

/// How old a directory must be before the sweep takes its lock: longer
/// than any owner takes between creating it and locking it.
const SETTLE: Duration = Duration::from_secs(60);

/// One call's temp directory, locked while this value lives, removed when
/// it is dropped (also where the program made parts of it unreadable).
#[derive(Debug)]
pub(crate) struct CallTemp {
    dir: Option<tempfile::TempDir>,
    _lock: File,
}

impl CallTemp {
    /// Create and lock a directory named `prefix…` in the temp directory,
    /// first sweeping leftovers (once per process).
    pub(crate) fn new(prefix: &str) -> std::io::Result<Self> {
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| {
            sweep(&std::env::temp_dir(), SETTLE);
        });
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let lock = File::open(dir.path())?;
        lock.try_lock().map_err(std::io::Error::from)?;
        Ok(Self { dir: Some(dir), _lock: lock })
    }

    /// Where it is.
    pub(crate) fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }
}

impl Drop for CallTemp {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            remove_tree(&dir.keep());
        }
    }
}

/// Remove the call, service and probe directories in `base` left by cairn
/// processes that died: this user's, real directories (not links), at
/// least `settle` old, whose owner's lock is gone. How many went.
pub(crate) fn sweep(base: &Path, settle: Duration) -> usize {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(entries) = std::fs::read_dir(base) else { return 0 };
    let me = rustix::process::geteuid().as_raw();
    let now = std::time::SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if ![CALL, SERVICE, PROBE].iter().any(|prefix| name.starts_with(prefix)) {
            continue;
        }
        // `DirEntry::metadata` does not follow a link.
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_dir() || meta.uid() != me {
            continue;
        }
        let changed = std::time::UNIX_EPOCH + Duration::from_secs(u64::try_from(meta.ctime()).unwrap_or(0));
        if now.duration_since(changed).unwrap_or_default() < settle {
            continue;
        }
        let path = entry.path();
        let Ok(dir) = File::open(&path) else { continue };
        // The sticky temp directory keeps others from swapping this name
        // for a link since it was read; the open directory is the same.
        if dir.metadata().map(|m| m.ino()).ok() != Some(meta.ino()) {
            continue;
        }
        if dir.try_lock().is_ok() {
            remove_tree(&path);
            removed += 1;
        }
    }
    removed
}

/// `remove_dir_all`, also where overlayfs left a directory without
/// permissions (its `work/work` is mode 000): root removes it anyway, a
/// non-root user (whose overlay ran in a user namespace) must first give
/// the directories back their owner's rights.
pub(crate) fn remove_tree(path: &Path) {
    if fs::remove_dir_all(path).is_ok() {
        return;
    }
    fn open_up(dir: &Path) {
        let _ = fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700));
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A directory whose owner holds the lock from another process stays;
    /// once that process is SIGKILLed it is swept, even where it made a
    /// subdirectory unreadable. A directory not matching the prefixes, and
    /// one younger than the settle time, stay.
    #[test]
    fn the_sweep_removes_only_what_a_killed_owner_left() {
        use std::os::unix::fs::PermissionsExt as _;
        let base = tempfile::tempdir().unwrap();
        let held = base.path().join(format!("{CALL}held"));
        let other = base.path().join("cairn-toolbox");
        for d in [&held, &other] {
            std::fs::create_dir(d).unwrap();
        }
        let locked = std::fs::create_dir(held.join("locked")).map(|()| held.join("locked")).unwrap();
        std::fs::write(locked.join("f"), "x").unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        // The owner: a real process holding the directory's lock, as a
        // cairn running a call does.
        // One process (the shell execs `sleep`) keeps the locked descriptor.
        let mut owner = std::process::Command::new("sh")
            .args(["-c", "exec 9<\"$1\" && flock 9 && exec sleep 60", "sh"])
            .arg(&held)
            .spawn()
            .unwrap();
        // Wait until the owner holds the lock (a second `flock -n` fails).
        let held_now = || {
            let probe = std::process::Command::new("flock").arg("-n").arg(&held).arg("true").status();
            !probe.expect("flock (util-linux) is needed for this test").success()
        };
        let start = std::time::Instant::now();
        while !held_now() {
            assert!(start.elapsed() < Duration::from_secs(30), "flock never took the lock");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(sweep(base.path(), Duration::ZERO), 0, "a directory in use was swept");
        assert!(held.exists());
        owner.kill().unwrap();
        owner.wait().unwrap();
        assert_eq!(sweep(base.path(), Duration::from_secs(3600)), 0, "a young leftover was swept");
        assert_eq!(sweep(base.path(), Duration::ZERO), 1);
        assert!(!held.exists(), "the killed owner's directory is still there");
        assert!(other.exists(), "a directory with another name was swept");
    }

    /// A call's directory is locked while it lives and gone after.
    #[test]
    fn a_call_directory_is_locked_then_removed_whole() {
        use std::os::unix::fs::PermissionsExt as _;
        let temp = CallTemp::new(CALL).unwrap();
        let path = temp.path().to_path_buf();
        let sub = path.join("closed");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o000)).unwrap();
        assert!(File::open(&path).unwrap().try_lock().is_err(), "a live call's directory is not locked");
        drop(temp);
        assert!(!path.exists(), "a call's directory outlived it");
    }
}
