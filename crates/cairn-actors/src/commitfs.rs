//! Commit-on-close files for actors: the `wasi:filesystem/types` an actor
//! is linked with. It wraps wasmtime-wasi's own implementation (every call
//! is delegated to it, so its sandboxing of paths and its read-only
//! preopens stay in force) and changes only what the seed's rules need:
//!
//! - an open that may write a file (`write` flag, `create` or `truncate`)
//!   in a writable directory opens a new hidden temp file
//!   (`.cairn-tmp-<pid>-<n>`) beside the target instead; an existing target
//!   is copied into it first unless the open truncates (append, and edits
//!   without truncate, see the old bytes), and its permissions are kept;
//! - dropping (closing) that descriptor commits: fsync the temp file,
//!   rename it onto the target, fsync the directory; [`finish`] commits
//!   every descriptor still open after a normal exit and discards (deletes
//!   the temp files of) all of them after a trap or a kill;
//! - until the commit the target is untouched, so every other descriptor,
//!   and every other actor reading `/actor/<id>/public`, sees the old
//!   content;
//! - directory operations (mkdir, unlink, rename, rmdir, link) are
//!   delegated as they are, so they take effect immediately;
//! - temp names are hidden from every operation: directory listings skip
//!   them, a path with a temp-name component is "no such entry" for
//!   lookups and "not permitted" for anything that would create it;
//!   [`sweep`] removes those a killed host left behind;
//! - symlinks are refused: `symlink-at` is not permitted, and a path whose
//!   last component is a symlink is never followed (opening it is
//!   `loop`, as with `O_NOFOLLOW`);
//! - the actor's disk quota ([`Quota`]): bytes at every commit (and, for
//!   writes not yet committed, when the runtime asks,
//!   [`Commits::pending_over_quota`]); files and directories together at
//!   every call that makes one (a temp file, `create-directory-at`,
//!   `link-at`: `quota` past the limit) and at every commit.
//!
//! It must not: route messages, decide how an instance ended (the runtime
//! tells [`finish`]), or touch files outside the directories wasmtime-wasi
//! resolved for the guest. All state lives in the store ([`Commits`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView};
use wasmtime_wasi::p2::FsResult;
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::p2::bindings::sync::filesystem::types as t;
use wasmtime_wasi::p2::bindings::sync::io::streams;

/// The prefix of temp file names (hidden from guests).
pub const TMP_PREFIX: &str = ".cairn-tmp-";

/// Temp names are unique within a process; across processes the pid keeps
/// them apart (and an `EXIST` collision is retried).
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Whether a file name is one of ours.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TMP_PREFIX)
}

/// Whether any component of a guest path is a temp name.
fn hides(path: &str) -> bool {
    path.split('/').any(is_temp_name)
}

/// A write in progress: the temp file, the directory it and its target are
/// in (a descriptor of our own in the resource table, never handed to the
/// guest, so a rename of that directory by the guest moves the commit with
/// it), and the names.
struct Pending {
    file: Arc<std::fs::File>,
    dir: u32,
    tmp: String,
    target: String,
    /// The path as the guest gave it, for error messages.
    shown: String,
}

/// Per-instance table of writes not yet committed, keyed by the guest
/// descriptor's resource rep.
#[derive(Default)]
pub struct Commits {
    pending: BTreeMap<u32, Pending>,
    /// The actor's disk quota (none: unlimited, for tests of the layer).
    quota: Option<Quota>,
    /// Descriptors the guest opened (`open-at`) and has not dropped, and
    /// the most it may hold at once (none: unlimited). Each holds a host
    /// file descriptor, and the process's are shared by every actor.
    open: usize,
    max_open: Option<usize>,
    /// Whether the refusal of a descriptor was noted in `stderr.log`.
    open_noted: bool,
}

/// Tells the actor's log why the layer refused something (a host note).
pub type Note = Box<dyn Fn(&str) + Send + Sync>;

/// An actor's disk quota: what its host directories (`/data`, `/public`)
/// may hold together, in bytes and in entries (files, directories and
/// anything else, temp files of writes not yet committed included: they
/// are on the disk).
pub struct Quota {
    dirs: Vec<PathBuf>,
    bytes: u64,
    entries: usize,
    /// The entries under `dirs` as far as this instance knows: every entry
    /// it makes is counted when made, a removal where the call says so
    /// (unlink, rmdir, a discarded temp file, a commit over an old file),
    /// so this is never below the truth for what the guest does; it is
    /// recounted (a walk) at every commit and before any refusal, so a
    /// refusal is never for entries that are gone.
    entries_now: usize,
    /// Where a refusal is told (once per instance: a guest retrying in a
    /// loop would otherwise fill its log with the same line).
    note: Option<Note>,
    noted: bool,
}

impl std::fmt::Debug for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Quota({} bytes, {} of {} entries)", self.bytes, self.entries_now, self.entries)
    }
}

impl Quota {
    /// A quota of `bytes` and `entries` over `dirs`; counts what they
    /// hold now (a walk).
    pub fn new(dirs: &[&Path], bytes: u64, entries: usize, note: Option<Note>) -> Quota {
        let dirs: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
        let entries_now = dirs.iter().map(|d| crate::layout::tree_usage(d).1).sum();
        Quota { dirs, bytes, entries, entries_now, note, noted: false }
    }

    /// Bytes and entries under the directories now (a walk).
    fn usage(&self) -> (u64, usize) {
        self.dirs.iter().map(|d| crate::layout::tree_usage(d)).fold((0, 0), |a, u| (a.0 + u.0, a.1 + u.1))
    }
}

impl std::fmt::Debug for Commits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Commits({} pending)", self.pending.len())
    }
}

impl Commits {
    /// No pending write yet; a commit is refused if afterwards the quota's
    /// directories would hold more than its bytes or entries (files not
    /// yet committed count too: they are on the disk already), and a call
    /// that would make an entry past its entries fails with `quota`.
    pub fn with_quota(quota: Quota) -> Commits {
        Commits { quota: Some(quota), ..Default::default() }
    }

    /// At most `max` descriptors open at once (preopens not counted):
    /// an `open-at` past it fails with `quota` (`EDQUOT` in C).
    pub fn with_descriptors(mut self, max: usize) -> Commits {
        self.max_open = Some(max);
        self
    }

    /// Refuses one more descriptor past the cap (noting the first refusal).
    fn room_for_descriptor(&mut self, path: &str) -> FsResult<()> {
        let Some(max) = self.max_open.filter(|m| self.open >= *m) else { return Ok(()) };
        if !self.open_noted {
            self.open_noted = true;
            if let Some(note) = self.quota.as_ref().and_then(|q| q.note.as_ref()) {
                note(&format!(
                    "opening {path:?} refused (quota): {} descriptors are open, an instance may hold at most {max}",
                    self.open
                ));
            }
        }
        fail(ErrorCode::Quota)
    }

    /// Number of descriptors whose writes are not committed yet.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Why the writes not yet committed are too much, if they are: their
    /// temp files together hold more than the quota (they are on the disk
    /// already, though no commit would keep them). Committed files are not
    /// walked here (the commit checks them), so an actor's directories
    /// hold at most its quota committed plus its quota pending, and what
    /// one write adds before the next check. (Their number needs no
    /// check here: each temp file is counted against the entries when it
    /// is made.)
    pub fn pending_over_quota(&self) -> Option<String> {
        let quota = self.quota.as_ref()?.bytes;
        if self.pending.is_empty() {
            return None;
        }
        let bytes: u64 = self.pending.values().map(|p| p.file.metadata().map(|m| m.len()).unwrap_or(0)).sum();
        (bytes > quota).then(|| {
            format!("over the actor's disk quota: writes not yet committed hold {bytes} bytes, the quota is {quota}")
        })
    }

    /// Room for one more entry (`what`, the guest's path, for the note):
    /// `quota` if the directories hold the quota's entries already
    /// (recounted first, so removals the count missed are seen).
    fn room_for_entry(&mut self, what: &str) -> FsResult<()> {
        let Some(q) = self.quota.as_mut() else { return Ok(()) };
        if q.entries_now < q.entries {
            return Ok(());
        }
        q.entries_now = q.usage().1;
        if q.entries_now < q.entries {
            return Ok(());
        }
        if !q.noted {
            q.noted = true;
            if let Some(note) = &q.note {
                note(&format!(
                    "creating {what:?} refused (quota): /data and /public hold {} files and directories, the limit is {} (later refusals of this instance are not noted)",
                    q.entries_now, q.entries
                ));
            }
        }
        fail(ErrorCode::Quota)
    }

    /// One entry more (made) or fewer under the quota's directories.
    fn count_entry(&mut self, made: bool) {
        if let Some(q) = self.quota.as_mut() {
            q.entries_now = if made { q.entries_now.saturating_add(1) } else { q.entries_now.saturating_sub(1) };
        }
    }
}

/// The view the linker hands to the filesystem functions: wasmtime-wasi's
/// own view (delegated to) plus the pending commits.
pub struct CommitFs<'a> {
    /// wasmtime-wasi's filesystem context and the store's resource table.
    pub fs: WasiFilesystemCtxView<'a>,
    /// This instance's pending commits.
    pub commits: &'a mut Commits,
}

impl std::fmt::Debug for CommitFs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CommitFs({:?})", self.commits)
    }
}

/// [`HasData`] marker for [`CommitFs`].
#[derive(Debug)]
pub struct CommitFsData;

impl HasData for CommitFsData {
    type Data<'a> = CommitFs<'a>;
}

/// Replaces the `wasi:filesystem/types` that
/// `wasmtime_wasi::p2::add_to_linker_sync` defined with this layer (call it
/// after that function).
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    get: fn(&mut T) -> CommitFs<'_>,
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let r = t::add_to_linker::<T, CommitFsData>(linker, get);
    linker.allow_shadowing(false);
    r
}

/// Ends an instance's writes: after a normal exit (`commit`) every pending
/// descriptor is closed and committed; otherwise (trap, kill) every temp
/// file is deleted. Returns one message per commit that failed (its temp
/// file is deleted too).
pub fn finish(fs: &mut CommitFs<'_>, commit: bool) -> Vec<String> {
    let pending = std::mem::take(&mut fs.commits.pending);
    let mut errors = Vec::new();
    for (rep, p) in pending {
        // Close the guest's descriptor (the table's handle on the temp file).
        let _ = fs.fs.table.delete(Resource::<Descriptor>::new_own(rep));
        if commit {
            if let Err(e) = fs.commit(p) {
                errors.push(e);
            }
        } else {
            fs.discard(p);
        }
    }
    errors
}

/// Removes temp files left under `dir` (recursively, never following
/// symlinks) by a host that died mid-write. Call only while no instance
/// uses `dir` but, at most, an abandoned one that is ending (it writes no
/// more: once killed it returns from no host call). Returns how many were
/// removed; a missing `dir` is 0.
pub fn sweep(dir: &Path) -> std::io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut n = 0;
    for entry in entries {
        let entry = entry?;
        let ty = entry.file_type()?;
        if ty.is_dir() {
            n += sweep(&entry.path())?;
        } else if entry.file_name().to_str().is_some_and(is_temp_name) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => n += 1,
                // An abandoned instance (still ending on its own thread)
                // may discard its own temp file meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(n)
}

fn fail<T>(code: ErrorCode) -> FsResult<T> {
    Err(code.into())
}

fn is(e: &wasmtime_wasi::p2::FsError, code: ErrorCode) -> bool {
    e.downcast_ref() == Some(&code)
}

/// A second handle on a resource the caller keeps owning.
fn b(r: &Resource<Descriptor>) -> Resource<Descriptor> {
    Resource::new_borrow(r.rep())
}

/// Path flags that never follow a final symlink.
fn nofollow() -> t::PathFlags {
    t::PathFlags::empty()
}

impl CommitFs<'_> {
    fn commit(&mut self, p: Pending) -> Result<(), String> {
        let r = self.rename_durably(&p);
        if r.is_err() {
            self.discard_file(&p);
        }
        let _ = self.fs.table.delete(Resource::<Descriptor>::new_own(p.dir));
        r.map_err(|e| format!("commit of {} failed: {e}", p.shown))
    }

    /// fsync the temp file, rename it onto the target, fsync the directory.
    fn rename_durably(&mut self, p: &Pending) -> Result<(), String> {
        let dir = Resource::<Descriptor>::new_borrow(p.dir);
        // The quota is enforced here, at the commit, because only a commit
        // makes a write last: the temp file replaces the target, so the
        // target's old size (and its entry) no longer count.
        let old =
            t::HostDescriptor::stat_at(&mut self.fs, b(&dir), nofollow(), p.target.clone()).ok().map(|st| st.size);
        let mut entries_after = None;
        if let Some(q) = self.commits.quota.as_mut() {
            let (used, entries) = q.usage();
            q.entries_now = entries;
            let after = used.saturating_sub(old.unwrap_or(0));
            if after > q.bytes {
                return Err(format!(
                    "over the actor's disk quota: /data and /public would hold {after} bytes, the quota is {}",
                    q.bytes
                ));
            }
            // The temp file is counted already (when it was made): the
            // commit adds no entry, and takes one away over an old file.
            let after = entries.saturating_sub(usize::from(old.is_some()));
            if after > q.entries {
                return Err(format!(
                    "over the actor's file quota: /data and /public would hold {after} files and directories, the limit is {}",
                    q.entries
                ));
            }
            entries_after = Some(after);
        }
        p.file.sync_all().map_err(|e| format!("fsync: {e}"))?;
        t::HostDescriptor::rename_at(&mut self.fs, b(&dir), p.tmp.clone(), b(&dir), p.target.clone())
            .map_err(|e| format!("rename: {e}"))?;
        if let (Some(q), Some(n)) = (self.commits.quota.as_mut(), entries_after) {
            q.entries_now = n;
        }
        match self.fs.table.get(&dir) {
            Ok(Descriptor::Dir(d)) => d.dir.sync_all().map_err(|e| format!("fsync of the directory: {e}")),
            _ => Err("the directory handle is gone".into()),
        }
    }

    fn discard(&mut self, p: Pending) {
        self.discard_file(&p);
        let _ = self.fs.table.delete(Resource::<Descriptor>::new_own(p.dir));
    }

    fn discard_file(&mut self, p: &Pending) {
        let dir = Resource::<Descriptor>::new_borrow(p.dir);
        if t::HostDescriptor::unlink_file_at(&mut self.fs, dir, p.tmp.clone()).is_ok() {
            self.commits.count_entry(false);
        }
    }

    /// The write path of `open-at`: `fd` is a writable directory.
    fn open_for_write(
        &mut self,
        fd: Resource<Descriptor>,
        path: String,
        oflags: t::OpenFlags,
        flags: t::DescriptorFlags,
    ) -> FsResult<Resource<Descriptor>> {
        let (parent, name) = match path.rsplit_once('/') {
            Some(("", n)) => ("/", n),
            Some((p, n)) => (p, n),
            None => (".", path.as_str()),
        };
        if name.is_empty() || name == "." || name == ".." {
            return fail(ErrorCode::IsDirectory);
        }
        let dir = t::HostDescriptor::open_at(
            &mut self.fs,
            fd,
            nofollow(),
            parent.to_owned(),
            t::OpenFlags::DIRECTORY,
            t::DescriptorFlags::READ,
        )?;
        let name = name.to_owned();
        // The temp file is an entry on the disk from now on.
        if let Err(e) = self.commits.room_for_entry(&path) {
            let _ = self.fs.table.delete(dir);
            return Err(e);
        }
        match self.open_temp(&dir, &name, oflags, flags) {
            Ok((tmp, tmp_name, file)) => {
                self.commits.count_entry(true);
                self.commits
                    .pending
                    .insert(tmp.rep(), Pending { file, dir: dir.rep(), tmp: tmp_name, target: name, shown: path });
                Ok(tmp)
            }
            Err(e) => {
                let _ = self.fs.table.delete(dir);
                Err(e)
            }
        }
    }

    /// Checks the target, creates the temp file beside it and fills it.
    fn open_temp(
        &mut self,
        dir: &Resource<Descriptor>,
        name: &str,
        oflags: t::OpenFlags,
        flags: t::DescriptorFlags,
    ) -> FsResult<(Resource<Descriptor>, String, Arc<std::fs::File>)> {
        let exists = match t::HostDescriptor::stat_at(&mut self.fs, b(dir), nofollow(), name.to_owned()) {
            Ok(st) => match st.type_ {
                t::DescriptorType::RegularFile => true,
                t::DescriptorType::SymbolicLink => return fail(ErrorCode::Loop),
                t::DescriptorType::Directory => return fail(ErrorCode::IsDirectory),
                // Devices, fifos, sockets: nothing to commit.
                _ => return fail(ErrorCode::NotPermitted),
            },
            Err(e) if is(&e, ErrorCode::NoEntry) => false,
            Err(e) => return Err(e),
        };
        let create = oflags.contains(t::OpenFlags::CREATE);
        if exists && create && oflags.contains(t::OpenFlags::EXCLUSIVE) {
            return fail(ErrorCode::Exist);
        }
        if !exists && !create {
            return fail(ErrorCode::NoEntry);
        }
        let mut attempts = 0;
        let (tmp, tmp_name) = loop {
            let n = format!("{TMP_PREFIX}{:x}-{:x}", std::process::id(), TMP_COUNTER.fetch_add(1, Ordering::Relaxed));
            match t::HostDescriptor::open_at(
                &mut self.fs,
                b(dir),
                nofollow(),
                n.clone(),
                t::OpenFlags::CREATE | t::OpenFlags::EXCLUSIVE,
                flags,
            ) {
                Ok(r) => break (r, n),
                Err(e) if is(&e, ErrorCode::Exist) && attempts < 16 => attempts += 1,
                Err(e) => return Err(e),
            }
        };
        let file = match self.fs.table.get(&tmp) {
            Ok(Descriptor::File(f)) => Some(f.file.clone()),
            _ => None,
        };
        let filled = match &file {
            None => fail(ErrorCode::Io),
            Some(file) if exists => self.copy_old(dir, name, file, oflags.contains(t::OpenFlags::TRUNCATE)),
            Some(_) => Ok(()),
        };
        match (filled, file) {
            (Ok(()), Some(file)) => Ok((tmp, tmp_name, file)),
            (r, _) => {
                let _ = self.fs.table.delete(tmp);
                let _ = t::HostDescriptor::unlink_file_at(&mut self.fs, b(dir), tmp_name);
                Err(r.err().unwrap_or_else(|| ErrorCode::Io.into()))
            }
        }
    }

    /// Gives the temp file the target's permissions and, unless the open
    /// truncates, its content.
    fn copy_old(
        &mut self,
        dir: &Resource<Descriptor>,
        name: &str,
        tmp: &std::fs::File,
        truncate: bool,
    ) -> FsResult<()> {
        let src = t::HostDescriptor::open_at(
            &mut self.fs,
            b(dir),
            nofollow(),
            name.to_owned(),
            t::OpenFlags::empty(),
            t::DescriptorFlags::READ,
        )?;
        let r = match self.fs.table.get(&src) {
            Ok(Descriptor::File(f)) => {
                let old = f.file.clone();
                (|| -> std::io::Result<()> {
                    tmp.set_permissions(old.metadata()?.permissions())?;
                    if !truncate {
                        std::io::copy(&mut &*old, &mut &*tmp)?;
                    }
                    Ok(())
                })()
                .map_err(Into::into)
            }
            _ => fail(ErrorCode::Io),
        };
        let _ = self.fs.table.delete(src);
        r
    }
}

impl t::Host for CommitFs<'_> {
    fn convert_error_code(&mut self, err: wasmtime_wasi::p2::FsError) -> wasmtime::Result<t::ErrorCode> {
        t::Host::convert_error_code(&mut self.fs, err)
    }

    fn filesystem_error_code(&mut self, err: Resource<streams::Error>) -> wasmtime::Result<Option<t::ErrorCode>> {
        t::Host::filesystem_error_code(&mut self.fs, err)
    }
}

impl t::HostDescriptor for CommitFs<'_> {
    fn advise(
        &mut self,
        fd: Resource<Descriptor>,
        offset: t::Filesize,
        len: t::Filesize,
        advice: t::Advice,
    ) -> FsResult<()> {
        t::HostDescriptor::advise(&mut self.fs, fd, offset, len, advice)
    }

    fn sync_data(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        t::HostDescriptor::sync_data(&mut self.fs, fd)
    }

    fn get_flags(&mut self, fd: Resource<Descriptor>) -> FsResult<t::DescriptorFlags> {
        t::HostDescriptor::get_flags(&mut self.fs, fd)
    }

    fn get_type(&mut self, fd: Resource<Descriptor>) -> FsResult<t::DescriptorType> {
        t::HostDescriptor::get_type(&mut self.fs, fd)
    }

    fn set_size(&mut self, fd: Resource<Descriptor>, size: t::Filesize) -> FsResult<()> {
        t::HostDescriptor::set_size(&mut self.fs, fd, size)
    }

    fn set_times(&mut self, fd: Resource<Descriptor>, atim: t::NewTimestamp, mtim: t::NewTimestamp) -> FsResult<()> {
        t::HostDescriptor::set_times(&mut self.fs, fd, atim, mtim)
    }

    fn read(&mut self, fd: Resource<Descriptor>, len: t::Filesize, offset: t::Filesize) -> FsResult<(Vec<u8>, bool)> {
        t::HostDescriptor::read(&mut self.fs, fd, len, offset)
    }

    fn write(&mut self, fd: Resource<Descriptor>, buf: Vec<u8>, offset: t::Filesize) -> FsResult<t::Filesize> {
        t::HostDescriptor::write(&mut self.fs, fd, buf, offset)
    }

    fn read_directory(&mut self, fd: Resource<Descriptor>) -> FsResult<Resource<t::DirectoryEntryStream>> {
        t::HostDescriptor::read_directory(&mut self.fs, fd)
    }

    fn sync(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        t::HostDescriptor::sync(&mut self.fs, fd)
    }

    fn create_directory_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        if hides(&path) {
            return fail(ErrorCode::NotPermitted);
        }
        self.commits.room_for_entry(&path)?;
        t::HostDescriptor::create_directory_at(&mut self.fs, fd, path)?;
        self.commits.count_entry(true);
        Ok(())
    }

    fn stat(&mut self, fd: Resource<Descriptor>) -> FsResult<t::DescriptorStat> {
        t::HostDescriptor::stat(&mut self.fs, fd)
    }

    fn stat_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: t::PathFlags,
        path: String,
    ) -> FsResult<t::DescriptorStat> {
        if hides(&path) {
            return fail(ErrorCode::NoEntry);
        }
        let st = t::HostDescriptor::stat_at(&mut self.fs, fd, nofollow(), path)?;
        // Following a symlink is refused, not done.
        if path_flags.contains(t::PathFlags::SYMLINK_FOLLOW) && matches!(st.type_, t::DescriptorType::SymbolicLink) {
            return fail(ErrorCode::Loop);
        }
        Ok(st)
    }

    fn set_times_at(
        &mut self,
        fd: Resource<Descriptor>,
        _path_flags: t::PathFlags,
        path: String,
        atim: t::NewTimestamp,
        mtim: t::NewTimestamp,
    ) -> FsResult<()> {
        if hides(&path) {
            return fail(ErrorCode::NoEntry);
        }
        t::HostDescriptor::set_times_at(&mut self.fs, fd, nofollow(), path, atim, mtim)
    }

    fn link_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path_flags: t::PathFlags,
        old_path: String,
        new_descriptor: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        if hides(&old_path) {
            return fail(ErrorCode::NoEntry);
        }
        if hides(&new_path) {
            return fail(ErrorCode::NotPermitted);
        }
        self.commits.room_for_entry(&new_path)?;
        t::HostDescriptor::link_at(&mut self.fs, fd, old_path_flags, old_path, new_descriptor, new_path)?;
        self.commits.count_entry(true);
        Ok(())
    }

    fn open_at(
        &mut self,
        fd: Resource<Descriptor>,
        _path_flags: t::PathFlags,
        path: String,
        oflags: t::OpenFlags,
        flags: t::DescriptorFlags,
    ) -> FsResult<Resource<Descriptor>> {
        let create = oflags.contains(t::OpenFlags::CREATE);
        if hides(&path) {
            return fail(if create { ErrorCode::NotPermitted } else { ErrorCode::NoEntry });
        }
        self.commits.room_for_descriptor(&path)?;
        let writes = create || oflags.contains(t::OpenFlags::TRUNCATE) || flags.contains(t::DescriptorFlags::WRITE);
        let writable_dir = matches!(self.fs.table.get(&fd)?, Descriptor::Dir(d) if !d.perms.write_not_permitted());
        let opened = if writes && writable_dir && !oflags.contains(t::OpenFlags::DIRECTORY) {
            self.open_for_write(fd, path, oflags, flags)
        } else {
            // Reads, directories, read-only preopens (which refuse writes
            // themselves): as they are, but never through a final symlink.
            t::HostDescriptor::open_at(&mut self.fs, fd, nofollow(), path, oflags, flags)
        }?;
        self.commits.open += 1;
        Ok(opened)
    }

    fn drop(&mut self, fd: Resource<Descriptor>) -> wasmtime::Result<()> {
        let rep = fd.rep();
        t::HostDescriptor::drop(&mut self.fs, fd)?;
        // Preopens are dropped too (never counted): never below zero.
        self.commits.open = self.commits.open.saturating_sub(1);
        if let Some(p) = self.commits.pending.remove(&rep) {
            // A commit that cannot be made durable ends the instance (a trap,
            // which discards its other pending writes) rather than losing
            // the write silently.
            self.commit(p).map_err(|e| wasmtime::format_err!("{e}"))?;
        }
        Ok(())
    }

    fn readlink_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<String> {
        if hides(&path) {
            return fail(ErrorCode::NoEntry);
        }
        t::HostDescriptor::readlink_at(&mut self.fs, fd, path)
    }

    fn remove_directory_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        if hides(&path) {
            return fail(ErrorCode::NoEntry);
        }
        t::HostDescriptor::remove_directory_at(&mut self.fs, fd, path)?;
        self.commits.count_entry(false);
        Ok(())
    }

    fn rename_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path: String,
        new_fd: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        if hides(&old_path) {
            return fail(ErrorCode::NoEntry);
        }
        if hides(&new_path) {
            return fail(ErrorCode::NotPermitted);
        }
        t::HostDescriptor::rename_at(&mut self.fs, fd, old_path, new_fd, new_path)
    }

    fn symlink_at(&mut self, _fd: Resource<Descriptor>, _src_path: String, _dest_path: String) -> FsResult<()> {
        fail(ErrorCode::NotPermitted)
    }

    fn unlink_file_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        if hides(&path) {
            return fail(ErrorCode::NoEntry);
        }
        t::HostDescriptor::unlink_file_at(&mut self.fs, fd, path)?;
        self.commits.count_entry(false);
        Ok(())
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: t::Filesize,
    ) -> FsResult<Resource<streams::InputStream>> {
        t::HostDescriptor::read_via_stream(&mut self.fs, fd, offset)
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: t::Filesize,
    ) -> FsResult<Resource<streams::OutputStream>> {
        t::HostDescriptor::write_via_stream(&mut self.fs, fd, offset)
    }

    fn append_via_stream(&mut self, fd: Resource<Descriptor>) -> FsResult<Resource<streams::OutputStream>> {
        t::HostDescriptor::append_via_stream(&mut self.fs, fd)
    }

    fn is_same_object(&mut self, a: Resource<Descriptor>, b: Resource<Descriptor>) -> wasmtime::Result<bool> {
        t::HostDescriptor::is_same_object(&mut self.fs, a, b)
    }

    fn metadata_hash(&mut self, fd: Resource<Descriptor>) -> FsResult<t::MetadataHashValue> {
        t::HostDescriptor::metadata_hash(&mut self.fs, fd)
    }

    fn metadata_hash_at(
        &mut self,
        fd: Resource<Descriptor>,
        _path_flags: t::PathFlags,
        path: String,
    ) -> FsResult<t::MetadataHashValue> {
        if hides(&path) {
            return fail(ErrorCode::NoEntry);
        }
        t::HostDescriptor::metadata_hash_at(&mut self.fs, fd, nofollow(), path)
    }
}

impl t::HostDirectoryEntryStream for CommitFs<'_> {
    fn read_directory_entry(
        &mut self,
        stream: Resource<t::DirectoryEntryStream>,
    ) -> FsResult<Option<t::DirectoryEntry>> {
        loop {
            let e =
                t::HostDirectoryEntryStream::read_directory_entry(&mut self.fs, Resource::new_borrow(stream.rep()))?;
            match e {
                Some(e) if is_temp_name(&e.name) => continue,
                other => return Ok(other),
            }
        }
    }

    fn drop(&mut self, stream: Resource<t::DirectoryEntryStream>) -> wasmtime::Result<()> {
        t::HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_are_recognised_in_any_component() {
        assert!(hides(".cairn-tmp-1-2"));
        assert!(hides("a/.cairn-tmp-x/b"));
        assert!(hides("a/b/.cairn-tmp-"));
        assert!(!hides("a/b.cairn-tmp-c"));
        assert!(!hides("cairn-tmp-1"));
    }

    #[test]
    fn sweep_removes_temp_files_at_any_depth_and_nothing_else() {
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let p = d.path();
        std::fs::create_dir_all(p.join("sub/deeper")).unwrap_or_else(|e| panic!("{e}"));
        for f in ["keep.txt", ".cairn-tmp-1-1", "sub/.cairn-tmp-2-9", "sub/deeper/.cairn-tmp-x", "sub/deeper/ok"] {
            std::fs::write(p.join(f), f).unwrap_or_else(|e| panic!("{e}"));
        }
        assert_eq!(sweep(p).unwrap_or_else(|e| panic!("{e}")), 3);
        assert!(p.join("keep.txt").exists() && p.join("sub/deeper/ok").exists());
        assert!(!p.join("sub/.cairn-tmp-2-9").exists());
        assert_eq!(sweep(&p.join("missing")).unwrap_or_else(|e| panic!("{e}")), 0);
    }
}
