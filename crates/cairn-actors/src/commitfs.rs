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
//!   `loop`, as with `O_NOFOLLOW`).
//!
//! It must not: route messages, decide how an instance ended (the runtime
//! tells [`finish`]), or touch files outside the directories wasmtime-wasi
//! resolved for the guest. All state lives in the store ([`Commits`]).

use std::collections::BTreeMap;
use std::path::Path;
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
    /// The actor's disk quota: its host directories (`/data`, `/public`)
    /// and the bytes they may hold together once a commit is done.
    quota: Option<(Vec<std::path::PathBuf>, u64)>,
}

impl std::fmt::Debug for Commits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Commits({} pending)", self.pending.len())
    }
}

impl Commits {
    /// No pending write yet; every commit is refused if afterwards `dirs`
    /// together would hold more than `bytes` (files not yet committed
    /// count too: they are on the disk already).
    pub fn with_quota(dirs: &[&Path], bytes: u64) -> Commits {
        Commits { pending: BTreeMap::new(), quota: Some((dirs.iter().map(|d| d.to_path_buf()).collect(), bytes)) }
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
    /// one write adds before the next check.
    pub fn pending_over_quota(&self) -> Option<String> {
        let (_, quota) = self.quota.as_ref()?;
        if self.pending.is_empty() {
            return None;
        }
        let bytes: u64 = self.pending.values().map(|p| p.file.metadata().map(|m| m.len()).unwrap_or(0)).sum();
        (bytes > *quota).then(|| {
            format!("over the actor's disk quota: writes not yet committed hold {bytes} bytes, the quota is {quota}")
        })
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
        if let Some((dirs, quota)) = &self.commits.quota {
            // Enforced here, at the commit, because only a commit makes a
            // write last: the temp file replaces the target, so the
            // target's old size no longer counts.
            let old = t::HostDescriptor::stat_at(&mut self.fs, b(&dir), nofollow(), p.target.clone())
                .map(|st| st.size)
                .unwrap_or(0);
            let used: u64 = dirs.iter().map(|d| crate::layout::tree_bytes(d)).sum();
            let after = used.saturating_sub(old);
            if after > *quota {
                return Err(format!(
                    "over the actor's disk quota: /data and /public would hold {after} bytes, the quota is {quota}"
                ));
            }
        }
        p.file.sync_all().map_err(|e| format!("fsync: {e}"))?;
        t::HostDescriptor::rename_at(&mut self.fs, b(&dir), p.tmp.clone(), b(&dir), p.target.clone())
            .map_err(|e| format!("rename: {e}"))?;
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
        let _ = t::HostDescriptor::unlink_file_at(&mut self.fs, dir, p.tmp.clone());
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
        match self.open_temp(&dir, &name, oflags, flags) {
            Ok((tmp, tmp_name, file)) => {
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
        t::HostDescriptor::create_directory_at(&mut self.fs, fd, path)
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
        t::HostDescriptor::link_at(&mut self.fs, fd, old_path_flags, old_path, new_descriptor, new_path)
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
        let writes = create || oflags.contains(t::OpenFlags::TRUNCATE) || flags.contains(t::DescriptorFlags::WRITE);
        let writable_dir = matches!(self.fs.table.get(&fd)?, Descriptor::Dir(d) if !d.perms.write_not_permitted());
        if writes && writable_dir && !oflags.contains(t::OpenFlags::DIRECTORY) {
            return self.open_for_write(fd, path, oflags, flags);
        }
        // Reads, directories, read-only preopens (which refuse writes
        // themselves): as they are, but never through a final symlink.
        t::HostDescriptor::open_at(&mut self.fs, fd, nofollow(), path, oflags, flags)
    }

    fn drop(&mut self, fd: Resource<Descriptor>) -> wasmtime::Result<()> {
        let rep = fd.rep();
        t::HostDescriptor::drop(&mut self.fs, fd)?;
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
        t::HostDescriptor::remove_directory_at(&mut self.fs, fd, path)
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
        t::HostDescriptor::unlink_file_at(&mut self.fs, fd, path)
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
