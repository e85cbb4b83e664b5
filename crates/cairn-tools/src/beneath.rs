//! Paths beneath a directory descriptor: every read and write the staging
//! code does on the real working tree or on a staging layer goes through a
//! [`Beneath`] opened on that directory, so no path ever follows a link or
//! leaves the tree, whatever a tool planted there between two calls.
//!
//! It owns the rules of that access:
//! - a relative path is split into plain components (no `.`, `..`, empty
//!   component, `/` or NUL; anything else is refused, not normalised);
//! - the parent directory is opened with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, or one `O_NOFOLLOW |
//!   O_DIRECTORY` component at a time where the kernel has no `openat2`;
//!   for every path of the tree, and once per directory of cairn's own
//!   staging layer ([`Beneath::open_own`] keeps the last one open);
//! - the last component is never followed: it is stat'ed with
//!   `AT_SYMLINK_NOFOLLOW`, opened with `O_NOFOLLOW | O_NONBLOCK` and
//!   checked to be a regular file on the open descriptor before a byte is
//!   read (so a FIFO, socket or device is never opened for reading and
//!   never hangs cairn);
//! - files are created only with `O_CREAT | O_EXCL` under a random name
//!   (`.cairn-apply-<128 random bits>`), renamed within the same directory
//!   descriptor, and copied with their holes kept;
//! - setuid and setgid bits are never set on anything written.
//!
//! It must not decide what a change means (`cairn_core::staged`) or in
//! what order a change set is applied (`staging`).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cairn_core::staged::{EntryKind, FileState};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use sha2::{Digest, Sha256};

/// The prefix of every temporary name the apply step creates in the tree.
pub const TEMP_PREFIX: &str = ".cairn-apply-";

/// Permission bits cairn writes: never setuid or setgid (a tool must not
/// get a setuid copy of a program applied by cairn, possibly as root).
pub const WRITABLE_MODE: u32 = 0o1777;

/// A directory every path is resolved beneath.
#[derive(Debug)]
pub struct Beneath {
    root: OwnedFd,
    shown: PathBuf,
    /// Real modes of the staging layer's directories that
    /// [`Beneath::open_layer`] opened up for the owner (relative path →
    /// mode); [`Beneath::node`] reports these.
    modes: std::collections::BTreeMap<String, u32>,
    /// cairn's own directories only ([`Beneath::open_own`]): the last
    /// directory a path was resolved in, kept open and reused while paths
    /// stay in it (issue 49.10: the change-set reader, the diff and the
    /// apply resolved the same staging directory once per file). `None`:
    /// every path is resolved afresh (the working tree, where anyone may
    /// replace a directory with a link between two operations).
    last_dir: Option<Mutex<Option<LastDir>>>,
}

/// The directory [`Beneath::open_own`] keeps open: its relative path and
/// descriptor.
type LastDir = (String, Arc<OwnedFd>);

/// A directory descriptor [`Beneath`] resolved a path in: opened for this
/// use, or its cached one (cairn's own directories only).
#[derive(Debug)]
pub(crate) enum DirFd {
    /// Opened for this use.
    Owned(OwnedFd),
    /// Shared with the cache of [`Beneath::open_own`].
    Shared(Arc<OwnedFd>),
}

impl AsFd for DirFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Owned(fd) => fd.as_fd(),
            Self::Shared(fd) => fd.as_fd(),
        }
    }
}

/// The deepest directory [`Beneath::open_layer`] descends to (the
/// change-set reader refuses deeper trees anyway).
pub const MAX_DEPTH: usize = 256;

/// What a name in a directory is, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    /// Its kind.
    pub kind: EntryKind,
    /// Permission bits (`& 0o7777`).
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// An overlayfs whiteout (a 0/0 character device).
    pub whiteout: bool,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// The components of a relative path, each a plain name.
fn components(rel: &str) -> io::Result<Vec<&str>> {
    if rel.is_empty() {
        return Ok(Vec::new());
    }
    let parts: Vec<&str> = rel.split('/').collect();
    for p in &parts {
        if p.is_empty() || *p == "." || *p == ".." || p.contains('\0') {
            return Err(invalid(format!("{rel:?} is not a plain relative path")));
        }
    }
    Ok(parts)
}

/// Split `rel` into its parent (possibly empty) and last name.
fn split(rel: &str) -> io::Result<(&str, &str)> {
    components(rel)?;
    match rel.rsplit_once('/') {
        Some((parent, name)) => Ok((parent, name)),
        None if rel.is_empty() => Err(invalid("the tree itself has no parent".into())),
        None => Ok(("", rel)),
    }
}

fn kind_of(ft: FileType) -> EntryKind {
    match ft {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Special,
    }
}

/// `state` with the permission bits cairn would write (never
/// setuid/setgid; a link's are its own).
pub fn writable(mut state: FileState) -> FileState {
    if state.kind != EntryKind::Symlink {
        state.mode &= WRITABLE_MODE;
    }
    state
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    // By table, not a `format!` per byte: a digest is written for every
    // file a change set holds, twice (read, then checked by the apply).
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

fn random_name() -> io::Result<String> {
    let mut bytes = [0u8; 16];
    let mut filled = 0;
    while filled < bytes.len() {
        filled += rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())?;
    }
    Ok(format!("{TEMP_PREFIX}{}", hex(&bytes)))
}

impl Beneath {
    /// Open the directory `dir` (the path to it is the caller's: a user's
    /// working directory or cairn's own staging directory).
    pub fn open(dir: &Path) -> io::Result<Self> {
        let root = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Self { root, shown: dir.to_path_buf(), modes: Default::default(), last_dir: None })
    }

    /// Open `dir`, a directory of cairn's own that only cairn changes (a
    /// staging layer once its command is done with it): as [`Beneath::open`],
    /// but the directory the last path was resolved in is kept open and
    /// reused for the next path in the same directory instead of being
    /// resolved again (one `openat2` per directory, not per file; one
    /// descriptor kept). Resolving a path is still beneath `dir` with no
    /// link followed; what is reused is a directory so reached.
    pub fn open_own(dir: &Path) -> io::Result<Self> {
        let mut own = Self::open(dir)?;
        own.last_dir = Some(Mutex::new(None));
        Ok(own)
    }

    /// Open cairn's own staging layer for reading. A non-root cairn cannot
    /// enter a directory the command made unreadable to its owner
    /// (`chmod -R 000 d`, staged): every such directory of the layer (its
    /// own, private to cairn) is opened up for the owner first (u+rwx), and
    /// its real mode kept and reported by [`Beneath::node`]. Root reads
    /// whatever the modes say and changes nothing.
    pub fn open_layer(dir: &Path) -> io::Result<Self> {
        let mut layer = Self::open_own(dir)?;
        if !rustix::process::geteuid().is_root() {
            let mut modes = std::collections::BTreeMap::new();
            open_up(&layer.root, "", &mut modes, 0)?;
            layer.modes = modes;
        }
        Ok(layer)
    }

    /// Where the directory really is now (read from its open descriptor,
    /// not from the path it was opened by).
    pub fn real_path(&self) -> io::Result<PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&self.root)))
    }

    /// The directory's path, for messages.
    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// `rel` joined to the directory's path, for messages only.
    pub fn show(&self, rel: &str) -> String {
        self.shown.join(rel).display().to_string()
    }

    /// Open the directory `rel` (empty: the tree itself) beneath the
    /// tree, following no link on the way; `None` when a component is
    /// missing.
    pub fn dir(&self, rel: &str) -> io::Result<Option<OwnedFd>> {
        let parts = components(rel)?;
        let path = if parts.is_empty() { "." } else { rel };
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
        let opened = match rustix::fs::openat2(&self.root, path, flags, Mode::empty(), resolve) {
            Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => self.dir_by_components(&parts),
            other => other.map_err(io::Error::from),
        };
        match opened {
            Ok(fd) => Ok(Some(fd)),
            // Missing, or not a directory (a file or a link on the way):
            // there is no such directory beneath the tree. Callers that
            // write treat that as "the parent is missing" and stop.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)) => Ok(None),
            Err(e) => {
                Err(io::Error::new(e.kind(), format!("cannot open {} without following a link: {e}", self.show(rel))))
            }
        }
    }

    /// Where `openat2` is missing: one component at a time, none followed.
    fn dir_by_components(&self, parts: &[&str]) -> io::Result<OwnedFd> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW;
        let mut fd = rustix::fs::openat(&self.root, ".", flags, Mode::empty())?;
        for part in parts {
            fd = rustix::fs::openat(&fd, *part, flags, Mode::empty())?;
        }
        Ok(fd)
    }

    /// The parent directory of `rel` and its last name; `None` when the
    /// parent does not exist.
    pub(crate) fn parent<'a>(&self, rel: &'a str) -> io::Result<Option<(DirFd, &'a str)>> {
        let (parent, name) = split(rel)?;
        Ok(self.dir_fd(parent)?.map(|fd| (fd, name)))
    }

    /// [`Beneath::dir`], through the cache of [`Beneath::open_own`] where
    /// there is one.
    pub(crate) fn dir_fd(&self, rel: &str) -> io::Result<Option<DirFd>> {
        let Some(cache) = &self.last_dir else { return Ok(self.dir(rel)?.map(DirFd::Owned)) };
        if let Ok(last) = cache.lock()
            && let Some((at, fd)) = last.as_ref()
            && at == rel
        {
            return Ok(Some(DirFd::Shared(Arc::clone(fd))));
        }
        let Some(fd) = self.dir(rel)? else { return Ok(None) };
        let fd = Arc::new(fd);
        if let Ok(mut last) = cache.lock() {
            *last = Some((rel.to_owned(), Arc::clone(&fd)));
        }
        Ok(Some(DirFd::Shared(fd)))
    }

    /// What `rel` is, not following it; `None` when it does not exist.
    pub fn node(&self, rel: &str) -> io::Result<Option<Node>> {
        if rel.is_empty() {
            let st = rustix::fs::fstat(&self.root)?;
            return Ok(Some(node_of(&st)));
        }
        let Some((dir, name)) = self.parent(rel)? else { return Ok(None) };
        match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                let mut node = node_of(&st);
                if let Some(mode) = self.modes.get(rel) {
                    node.mode = *mode;
                }
                Ok(Some(node))
            }
            Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => Ok(None),
            Err(e) => Err(io::Error::new(io::Error::from(e).kind(), format!("cannot stat {}: {e}", self.show(rel)))),
        }
    }

    /// Open the regular file `rel` for reading, never following a link and
    /// never opening anything else (checked on the open descriptor).
    pub fn open_file(&self, rel: &str) -> io::Result<File> {
        let (file, _) = self.open_regular(rel)?;
        // Reads of a regular file never block; clear the flag anyway so
        // the descriptor behaves as an ordinary one.
        rustix::fs::fcntl_setfl(&file, OFlags::empty())?;
        Ok(file)
    }

    /// [`Beneath::open_file`] for cairn's own reads (`pread`, a digest, a
    /// copy), with the `fstat` that proved it a regular file: the
    /// descriptor keeps `O_NONBLOCK`, which a regular file's reads ignore
    /// (one `fcntl` per file fewer, and the caller needs no second
    /// `fstat`; issue 49.10).
    pub(crate) fn open_regular(&self, rel: &str) -> io::Result<(File, rustix::fs::Stat)> {
        let (dir, name) = self.parent(rel)?.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, self.show(rel)))?;
        let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
        let fd = match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
            Err(rustix::io::Errno::ACCESS) => open_own_unreadable(&dir, name, flags),
            other => other,
        }
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("cannot open {}: {e}", self.show(rel))))?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(invalid(format!("{} is not a regular file", self.show(rel))));
        }
        Ok((File::from(fd), st))
    }

    /// The directory `rel` beneath this one as a [`Beneath`] of its own
    /// (no link followed on the way); `None` when it is missing or not a
    /// directory.
    pub fn sub(&self, rel: &str) -> io::Result<Option<Beneath>> {
        Ok(self.dir(rel)?.map(|root| Self {
            root,
            shown: self.shown.join(rel),
            modes: Default::default(),
            last_dir: None,
        }))
    }

    /// The bytes of the regular file `rel`, at most `cap` of them: `None`
    /// when it is missing; an error when it is a link, not a regular file,
    /// or longer than `cap` (a tree file read this way can never make
    /// cairn follow a link, block on a FIFO, or read without bound).
    pub fn read_capped(&self, rel: &str, cap: u64) -> io::Result<Option<Vec<u8>>> {
        use std::io::Read as _;
        let file = match self.open_file(rel) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        (&file).take(cap + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > cap {
            return Err(invalid(format!("{} is longer than the {cap} bytes cairn reads of it", self.show(rel))));
        }
        Ok(Some(bytes))
    }

    /// The state of `rel` (content hashed for a file, target hashed for a
    /// link, nothing opened for anything else); `None` when missing.
    pub fn state(&self, rel: &str) -> io::Result<Option<FileState>> {
        let Some(node) = self.node(rel)? else { return Ok(None) };
        self.state_of(rel, node).map(Some)
    }

    /// [`Beneath::state`] of `rel` when its [`Node`] was just read (one
    /// lookup fewer per file for the change-set reader, issue 49.10); the
    /// content is read from what is at `rel` now, opened as the regular
    /// file the node says it is.
    pub fn state_of(&self, rel: &str, node: Node) -> io::Result<FileState> {
        self.state_keeping(rel, node, 0).map(|(state, _)| state)
    }

    /// [`Beneath::state_of`], and a regular file's bytes when it holds at
    /// most `keep` of them (read once, for the digest and the caller).
    pub(crate) fn state_keeping(&self, rel: &str, node: Node, keep: u64) -> io::Result<(FileState, Option<Vec<u8>>)> {
        let mut kept = None;
        let (size, sha256) = match node.kind {
            EntryKind::Dir | EntryKind::Special => {
                (if node.kind == EntryKind::Dir { 0 } else { node.size }, String::new())
            }
            EntryKind::Symlink => {
                let target = self.read_link(rel)?;
                (node.size, hex(&Sha256::digest(target.as_os_str().as_encoded_bytes())))
            }
            EntryKind::File => {
                let (file, st) = self.open_regular(rel)?;
                let (size, digest, bytes) = hash_keeping(&file, Some(st.st_size as u64), keep)?;
                kept = bytes;
                (size, digest)
            }
        };
        Ok((FileState { kind: node.kind, size, sha256, mode: node.mode }, kept))
    }

    /// [`Beneath::state`] as a change set records it: the permission bits
    /// cairn would write ([`writable`]).
    pub fn recorded(&self, rel: &str) -> io::Result<Option<FileState>> {
        Ok(self.state(rel)?.map(writable))
    }

    /// The target of the link `rel`.
    pub fn read_link(&self, rel: &str) -> io::Result<PathBuf> {
        let (dir, name) = self.parent(rel)?.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, self.show(rel)))?;
        let target = rustix::fs::readlinkat(&dir, name, Vec::new())?;
        let bytes: Vec<u8> = target.into_bytes();
        Ok(PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(bytes)))
    }

    /// The names in directory `rel`, sorted. A name that is not UTF-8 is an
    /// error: change sets name paths as text, and a lossy name would point
    /// at another file.
    pub fn list(&self, rel: &str) -> io::Result<Vec<String>> {
        let fd = self.dir_fd(rel)?.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, self.show(rel)))?;
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&fd)? {
            let entry = entry?;
            let bytes = entry.file_name().to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let name = std::str::from_utf8(bytes).map_err(|_| {
                invalid(format!(
                    "{} holds a file name that is not UTF-8 ({:?}); cairn cannot name it in a change set",
                    self.show(rel),
                    String::from_utf8_lossy(bytes)
                ))
            })?;
            names.push(name.to_owned());
        }
        names.sort();
        Ok(names)
    }

    /// Whether directory `rel` is an opaque overlayfs directory.
    pub fn is_opaque(&self, rel: &str) -> bool {
        let Ok(Some(fd)) = self.dir(rel) else { return false };
        let mut value = [0u8; 4];
        ["trusted.overlay.opaque", "user.overlay.opaque"].iter().any(
            |name| matches!(rustix::fs::fgetxattr(&fd, *name, &mut value[..]), Ok(n) if n >= 1 && value[0] == b'y'),
        )
    }

    /// Set the mode of directory `rel` (never through a link).
    pub fn set_dir_mode(&self, rel: &str, mode: u32) -> io::Result<()> {
        let fd = self.dir(rel)?.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, self.show(rel)))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & WRITABLE_MODE))?;
        Ok(())
    }

    /// Create directory `rel` (its parent must exist) with `mode`, or set
    /// the mode of the directory already there; never through a link.
    pub fn make_dir(&self, rel: &str, mode: u32) -> io::Result<()> {
        let (dir, name) = self.parent(rel)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("the parent of {} is missing", self.show(rel)))
        })?;
        match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("cannot create {}: {e}", self.show(rel)),
                ));
            }
        }
        let fd = self.dir(rel)?.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, self.show(rel)))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode & WRITABLE_MODE))?;
        Ok(())
    }

    /// Remove `rel`: a file, link or special file is unlinked (a link is
    /// removed, never followed); a directory is emptied depth first
    /// through descriptors, then removed. A missing path is not an error.
    pub fn remove(&self, rel: &str) -> io::Result<()> {
        let Some(node) = self.node(rel)? else { return Ok(()) };
        let Some((dir, name)) = self.parent(rel)? else { return Ok(()) };
        if node.kind == EntryKind::Dir {
            for child in self.list(rel)? {
                self.remove(&format!("{rel}/{child}"))?;
            }
            rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR)
        } else {
            rustix::fs::unlinkat(&dir, name, AtFlags::empty())
        }
        .or_else(|e| if e == rustix::io::Errno::NOENT { Ok(()) } else { Err(e) })
        .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("cannot delete {}: {e}", self.show(rel))))
    }

    /// Write a new file beside `rel` under a random temporary name
    /// (created `O_EXCL`, so nothing planted there is ever opened) holding
    /// `source`'s bytes (holes kept) and `mode` less setuid/setgid; the
    /// bytes must hash to `sha256` (the reviewed content), else the
    /// temporary is removed and the copy refused. Returns the name.
    pub fn write_temp(&self, rel: &str, source: &File, mode: u32, sha256: &str) -> io::Result<String> {
        let (dir, _) = self.parent(rel)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("the parent of {} is missing", self.show(rel)))
        })?;
        let (fd, temp) = create_excl(&dir)?;
        let dst = File::from(fd);
        let copied = copy_sparse(source, &dst).and_then(|digest| {
            if digest != sha256 {
                return Err(invalid(format!(
                    "the staged content of {} changed after it was reviewed; nothing of it was applied",
                    self.show(rel)
                )));
            }
            rustix::fs::fchmod(&dst, Mode::from_raw_mode(mode & WRITABLE_MODE))?;
            Ok(())
        });
        if let Err(e) = copied {
            let _ = rustix::fs::unlinkat(&dir, temp.as_str(), AtFlags::empty());
            return Err(e);
        }
        Ok(temp)
    }

    /// Create a symlink to `target` beside `rel` under a random temporary
    /// name; the name.
    pub fn symlink_temp(&self, rel: &str, target: &Path) -> io::Result<String> {
        let (dir, _) = self.parent(rel)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("the parent of {} is missing", self.show(rel)))
        })?;
        for _ in 0..8 {
            let temp = random_name()?;
            match rustix::fs::symlinkat(target, &dir, temp.as_str()) {
                Ok(()) => return Ok(temp),
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"))
    }

    /// Rename the temporary `temp` (beside `rel`) onto `rel`, within the
    /// same directory descriptor. A directory in the way is removed first
    /// (the change set replaced it; the apply checked that it is the one
    /// the command saw).
    pub fn rename_into(&self, temp: &str, rel: &str) -> io::Result<()> {
        if self.node(rel)?.is_some_and(|n| n.kind == EntryKind::Dir) {
            self.remove(rel)?;
        }
        let (dir, name) = self.parent(rel)?.ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("the parent of {} is missing", self.show(rel)))
        })?;
        rustix::fs::renameat(&dir, temp, &dir, name).map_err(|e| {
            io::Error::new(io::Error::from(e).kind(), format!("cannot rename onto {}: {e}", self.show(rel)))
        })
    }

    /// Remove the temporary `temp` (a name [`Beneath::write_temp`] or
    /// [`Beneath::symlink_temp`] returned) beside `rel`; a missing one is
    /// not an error.
    pub fn remove_temp(&self, rel: &str, temp: &str) -> io::Result<()> {
        if !temp.starts_with(TEMP_PREFIX) || temp.contains('/') {
            return Err(invalid(format!("{temp:?} is not a temporary name of cairn's")));
        }
        let Some((dir, _)) = self.parent(rel)? else { return Ok(()) };
        match rustix::fs::unlinkat(&dir, temp, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Remove temporaries the apply step left in directory `rel` (after
    /// a crash between writing and renaming). Only regular files and
    /// links named with [`TEMP_PREFIX`] and 32 hex digits.
    pub fn remove_temps(&self, rel: &str) -> io::Result<()> {
        let Some(dir) = self.dir(rel)? else { return Ok(()) };
        for name in self.list(rel)? {
            let Some(rest) = name.strip_prefix(TEMP_PREFIX) else { continue };
            if rest.len() != 32 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let st = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            if matches!(FileType::from_raw_mode(st.st_mode), FileType::RegularFile | FileType::Symlink) {
                let _ = rustix::fs::unlinkat(&dir, name.as_str(), AtFlags::empty());
            }
        }
        Ok(())
    }

    /// Flush the file system holding the tree (`syncfs`).
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::syncfs(&self.root).map_err(io::Error::from)
    }
}

/// Open `name` in `dir` for reading when its mode denies that to its
/// owner and the owner is us (a non-root cairn reading a file a command
/// made mode 000, `chmod 000 f` staged, or such a file it applied): read
/// permission is granted for the moment of the `open` (an open descriptor
/// stays readable) and the old mode put back at once. The file is pinned
/// by an `O_PATH | O_NOFOLLOW` descriptor first, so the mode changes can
/// only reach that regular file, never a link's target. Root never gets
/// here (it reads whatever the mode says).
fn open_own_unreadable(dir: &impl AsFd, name: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let pinned = rustix::fs::openat(dir, name, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    let st = rustix::fs::fstat(&pinned)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_uid != rustix::process::geteuid().as_raw()
    {
        return Err(rustix::io::Errno::ACCESS);
    }
    // chmod through the pinned descriptor's /proc entry: the inode itself.
    let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&pinned));
    let mode = st.st_mode & 0o7777;
    rustix::fs::chmod(proc_path.as_str(), Mode::from_raw_mode(mode | 0o400))?;
    let opened = rustix::fs::openat(dir, name, flags, Mode::empty());
    let restored = rustix::fs::chmod(proc_path.as_str(), Mode::from_raw_mode(mode));
    let fd = opened?;
    restored?;
    // The name may have been swapped between the two opens: it must still
    // be the pinned file.
    let now = rustix::fs::fstat(&fd)?;
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) {
        return Err(rustix::io::Errno::ACCESS);
    }
    Ok(fd)
}

/// [`Beneath::open_layer`]'s walk: below `dir` (at `rel`), every directory
/// of ours whose owner lacks rwx gets it, its mode recorded in `modes`.
fn open_up(
    dir: &OwnedFd,
    rel: &str,
    modes: &mut std::collections::BTreeMap<String, u32>,
    depth: usize,
) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Ok(()); // the reader refuses the tree there
    }
    let me = rustix::process::geteuid().as_raw();
    let mut children = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes != b"." && bytes != b".." {
            children.push(entry.file_name().to_owned());
        }
    }
    for name in children {
        let st = rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory || st.st_uid != me {
            continue;
        }
        let child = if rel.is_empty() {
            name.to_string_lossy().into_owned()
        } else {
            format!("{rel}/{}", name.to_string_lossy())
        };
        let mode = st.st_mode & 0o7777;
        if mode & 0o700 != 0o700 {
            // A directory (just checked) of cairn's private layer: no one
            // else can swap it for a link in between.
            rustix::fs::chmodat(dir, name.as_c_str(), Mode::from_raw_mode(mode | 0o700), AtFlags::empty())?;
            modes.insert(child.clone(), mode);
        }
        let fd = rustix::fs::openat(
            dir,
            name.as_c_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        open_up(&fd, &child, modes, depth + 1)?;
    }
    Ok(())
}

fn node_of(st: &rustix::fs::Stat) -> Node {
    let ft = FileType::from_raw_mode(st.st_mode);
    Node {
        kind: kind_of(ft),
        mode: st.st_mode & 0o7777,
        size: st.st_size as u64,
        whiteout: ft == FileType::CharacterDevice && st.st_rdev == 0,
    }
}

/// A new file in `dir` under a random name, `O_CREAT | O_EXCL`.
fn create_excl(dir: &impl AsFd) -> io::Result<(OwnedFd, String)> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for _ in 0..8 {
        let temp = random_name()?;
        match rustix::fs::openat(dir, temp.as_str(), flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => return Ok((fd, temp)),
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free temporary name"))
}

/// Bytes read or written at a time.
const CHUNK: usize = 128 * 1024;

/// Holes of small files are hashed as zeros from here.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// From this size on, a file's digest is its block digest
/// ([`ContentDigest`]); below it, the SHA-256 of its bytes.
pub const BLOCK_DIGEST_MIN: u64 = 64 << 20;

/// The block of the block digest.
const BLOCK: usize = 4096;

/// The digest cairn records for a regular file's content
/// (`FileState::sha256`, what the apply and the pre-image store check
/// copies against). Below [`BLOCK_DIGEST_MIN`] bytes it is the SHA-256 of
/// the bytes. From there on it is the SHA-256 of the file's block
/// encoding: `cairn-blocks-v1\0` and the size (u64 LE), then for each
/// 4 KiB block from offset 0 either `D` and its bytes, or, for a run of
/// all-zero blocks, `Z` and the run's length (u64 LE), and a short last
/// block as `T`, its length and bytes. The encoding is a function of the
/// bytes alone (a hole and written zeros encode alike) and can be decoded
/// back, so equal digests still mean equal content; and a hole costs a
/// counter, not a hash of every zero (a 4 GiB sparse file took 21–29 s to
/// judge, issue 46).
struct ContentDigest {
    sha: Sha256,
    blocks: bool,
    /// The block being filled (block encoding only).
    block: Vec<u8>,
    zero_run: u64,
}

impl ContentDigest {
    fn new(size: u64) -> Self {
        let blocks = size >= BLOCK_DIGEST_MIN;
        let mut sha = Sha256::new();
        if blocks {
            sha.update(b"cairn-blocks-v1\0");
            sha.update(size.to_le_bytes());
        }
        Self { sha, blocks, block: Vec::with_capacity(if blocks { BLOCK } else { 0 }), zero_run: 0 }
    }

    fn data(&mut self, mut bytes: &[u8]) {
        if !self.blocks {
            self.sha.update(bytes);
            return;
        }
        if !self.block.is_empty() {
            let take = (BLOCK - self.block.len()).min(bytes.len());
            self.block.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            self.flush_full_block();
        }
        while bytes.len() >= BLOCK {
            self.whole_block(&bytes[..BLOCK]);
            bytes = &bytes[BLOCK..];
        }
        self.block.extend_from_slice(bytes);
    }

    fn hole(&mut self, mut len: u64) {
        if !self.blocks {
            while len > 0 {
                let n = len.min(ZEROS.len() as u64) as usize;
                self.sha.update(&ZEROS[..n]);
                len -= n as u64;
            }
            return;
        }
        if !self.block.is_empty() {
            let take = ((BLOCK - self.block.len()) as u64).min(len);
            self.block.resize(self.block.len() + take as usize, 0);
            len -= take;
            self.flush_full_block();
            if !self.block.is_empty() {
                return; // the hole ended inside this block
            }
        }
        self.zero_run += len / BLOCK as u64;
        self.block.resize((len % BLOCK as u64) as usize, 0);
    }

    fn flush_full_block(&mut self) {
        if self.block.len() == BLOCK {
            let block = std::mem::take(&mut self.block);
            self.whole_block(&block);
            self.block = block;
            self.block.clear();
        }
    }

    fn whole_block(&mut self, block: &[u8]) {
        if block.iter().all(|&b| b == 0) {
            self.zero_run += 1;
        } else {
            self.flush_zeros();
            self.sha.update(b"D");
            self.sha.update(block);
        }
    }

    fn flush_zeros(&mut self) {
        if self.zero_run > 0 {
            self.sha.update(b"Z");
            self.sha.update(self.zero_run.to_le_bytes());
            self.zero_run = 0;
        }
    }

    fn finish(mut self) -> String {
        if self.blocks {
            self.flush_zeros();
            if !self.block.is_empty() {
                self.sha.update(b"T");
                self.sha.update((self.block.len() as u64).to_le_bytes());
                self.sha.update(&self.block);
            }
        }
        hex(&self.sha.finalize())
    }
}

/// Walk the first `size` bytes of `file` region by region: `hole(offset,
/// len)` for each hole (`SEEK_HOLE`/`SEEK_DATA`: never read), `data(offset, bytes)`
/// for the data (read in chunks into `buf`). Returns the bytes covered:
/// less than `size` when the file shrank while it was read.
fn regions(
    file: &File,
    size: u64,
    buf: &mut [u8],
    hole: &mut dyn FnMut(u64, u64) -> io::Result<()>,
    data: &mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
) -> io::Result<u64> {
    use rustix::fs::SeekFrom;
    let mut pos = 0u64;
    while pos < size {
        // The next data region; ENXIO: only a hole is left.
        let next = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(d) => d.min(size),
            Err(rustix::io::Errno::NXIO) => size,
            Err(rustix::io::Errno::INVAL) => pos, // no SEEK_DATA here: all data
            Err(e) => return Err(e.into()),
        };
        if next > pos {
            hole(pos, next - pos)?;
            pos = next;
        }
        if pos >= size {
            break;
        }
        let end = match rustix::fs::seek(file, SeekFrom::Hole(pos)) {
            Ok(h) => h.min(size),
            Err(_) => size,
        };
        while pos < end {
            let want = ((end - pos) as usize).min(buf.len());
            let n = rustix::io::pread(file, &mut buf[..want], pos)?;
            if n == 0 {
                return Ok(pos);
            }
            data(pos, &buf[..n])?;
            pos += n as u64;
        }
    }
    Ok(pos)
}

/// The size and content digest ([`ContentDigest`]) of an open regular
/// file's bytes; holes are never read. A file that shrinks while it is
/// read is read again (a few times, then it is an error).
pub fn hash_file(file: &File) -> io::Result<(u64, String)> {
    hash_keeping(file, None, 0).map(|(size, digest, _)| (size, digest))
}

/// [`hash_file`], and the bytes themselves when the file holds at most
/// `keep` of them (read once for both: the diff of a created file is
/// made from the bytes that were hashed, issue 49.10). A small file (at
/// most one chunk) is read whole with no `SEEK_DATA`/`SEEK_HOLE` walk: a
/// hole in it reads as zeros, and below [`BLOCK_DIGEST_MIN`] its digest is
/// the SHA-256 of its bytes either way.
/// `known`: its size from an `fstat` the caller just made (else it is
/// asked; asked again whenever the file shrank while it was read).
pub(crate) fn hash_keeping(
    file: &File,
    mut known: Option<u64>,
    keep: u64,
) -> io::Result<(u64, String, Option<Vec<u8>>)> {
    for _ in 0..3 {
        let size = match known.take() {
            Some(size) => size,
            None => rustix::fs::fstat(file)?.st_size as u64,
        };
        if size <= CHUNK as u64 {
            let mut bytes = vec![0u8; size as usize];
            let mut got = 0;
            while got < bytes.len() {
                let n = rustix::io::pread(file, &mut bytes[got..], got as u64)?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            if got < bytes.len() {
                continue; // it shrank while it was read: again
            }
            let mut digest = ContentDigest::new(size);
            digest.data(&bytes);
            return Ok((size, digest.finish(), (keep > 0 && size <= keep).then_some(bytes)));
        }

        let digest = std::cell::RefCell::new(ContentDigest::new(size));
        let mut buf = vec![0u8; size.clamp(1, CHUNK as u64) as usize];
        let covered = regions(
            file,
            size,
            &mut buf,
            &mut |_, len| {
                digest.borrow_mut().hole(len);
                Ok(())
            },
            &mut |_, bytes| {
                digest.borrow_mut().data(bytes);
                Ok(())
            },
        )?;
        if covered == size {
            return Ok((size, digest.into_inner().finish(), None));
        }
    }
    Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file kept shrinking while it was read"))
}

/// Copy `src` to the empty file `dst`, data regions only (holes stay
/// holes), computing the content digest ([`ContentDigest`]) of what was
/// copied without reading a hole.
pub(crate) fn copy_sparse(src: &File, dst: &File) -> io::Result<String> {
    let size = rustix::fs::fstat(src)?.st_size as u64;
    let digest = std::cell::RefCell::new(ContentDigest::new(size));
    // Sized to the file: most files a build writes are small, and a
    // 128 KiB buffer zeroed per file cost more than the copy.
    let mut buf = vec![0u8; size.clamp(1, CHUNK as u64) as usize];
    let covered = regions(
        src,
        size,
        &mut buf,
        &mut |_, len| {
            digest.borrow_mut().hole(len);
            Ok(())
        },
        &mut |at, bytes| {
            digest.borrow_mut().data(bytes);
            let mut written = 0;
            while written < bytes.len() {
                written += rustix::io::pwrite(dst, &bytes[written..], at + written as u64)?;
            }
            Ok(())
        },
    )?;
    if covered < size {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the staged file shrank while it was copied"));
    }
    rustix::fs::ftruncate(dst, size)?;
    Ok(digest.into_inner().finish())
}

/// Whether the file `rel` of `tree` begins with the whole content of the
/// file `old_rel` of `old` (so the change only appended). A hole of the
/// old file is compared without reading it: the new file must hold no
/// data there, or only zeros.
pub fn starts_with(tree: &Beneath, rel: &str, old: &Beneath, old_rel: &str) -> io::Result<bool> {
    use rustix::fs::SeekFrom;
    let (new, old) = (tree.open_file(rel)?, old.open_file(old_rel)?);
    let old_size = rustix::fs::fstat(&old)?.st_size as u64;
    if rustix::fs::fstat(&new)?.st_size as u64 <= old_size {
        return Ok(false);
    }
    // Any difference stops the walk as this error.
    #[derive(Debug)]
    struct Differs;
    impl std::fmt::Display for Differs {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("the files differ")
        }
    }
    impl std::error::Error for Differs {}
    let differs = || io::Error::other(Differs);
    let theirs = std::cell::RefCell::new(vec![0u8; 64 * 1024]);
    let same_bytes = |at: u64, ours: &[u8], zeros: bool| -> io::Result<()> {
        let mut theirs = theirs.borrow_mut();
        let mut got = 0;
        while got < ours.len() {
            let m = rustix::io::pread(&new, &mut theirs[got..ours.len()], at + got as u64)?;
            if m == 0 {
                return Err(differs());
            }
            got += m;
        }
        let same = if zeros { theirs[..got].iter().all(|&b| b == 0) } else { theirs[..got] == *ours };
        if same { Ok(()) } else { Err(differs()) }
    };
    let mut buf = vec![0u8; 64 * 1024];
    let walked = regions(
        &old,
        old_size,
        &mut buf,
        &mut |at, len| {
            // The old file's hole: the new one's data there must be zeros.
            let end = at + len;
            let mut pos = at;
            while pos < end {
                let data = match rustix::fs::seek(&new, SeekFrom::Data(pos)) {
                    Ok(d) => d,
                    Err(rustix::io::Errno::NXIO) => return Ok(()),
                    Err(rustix::io::Errno::INVAL) => pos,
                    Err(e) => return Err(e.into()),
                };
                if data >= end {
                    return Ok(());
                }
                let n = ((end - data) as usize).min(ZEROS.len());
                same_bytes(data, &ZEROS[..n], true)?;
                pos = data + n as u64;
            }
            Ok(())
        },
        &mut |at, ours| same_bytes(at, ours, false),
    );
    match walked {
        Ok(n) => Ok(n == old_size),
        Err(e) if e.get_ref().is_some_and(|inner| inner.is::<Differs>()) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A directory descriptor's file system is flushed (`syncfs`).
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let fd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    rustix::fs::syncfs(fd.as_fd()).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_be_plain() {
        for bad in ["..", "a/../b", "/etc", "a//b", "./a", "a/", "a\0b"] {
            assert!(components(bad).is_err(), "{bad:?}");
        }
        assert_eq!(components("a/b.c/d").unwrap(), ["a", "b.c", "d"]);
        assert_eq!(split("a/b/c").unwrap(), ("a/b", "c"));
        assert_eq!(split("c").unwrap(), ("", "c"));
    }

    #[test]
    fn links_on_the_way_are_never_followed() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        let tree = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), tree.path().join("d")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), tree.path().join("f")).unwrap();
        let b = Beneath::open(tree.path()).unwrap();
        // Through a link there is no such path: not the file beyond it.
        assert_eq!(b.state("d/secret").unwrap(), None, "a link in the middle was followed");
        assert_eq!(b.state("f").unwrap().unwrap().kind, EntryKind::Symlink);
        assert!(b.open_file("f").is_err());
        assert!(b.make_dir("d/x", 0o755).is_err());
        b.remove("d").unwrap();
        assert!(outside.path().join("secret").exists(), "removing the link removed its target");
    }

    #[test]
    fn a_fifo_is_never_opened() {
        let tree = tempfile::tempdir().unwrap();
        let fifo = std::ffi::CString::new(tree.path().join("p").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let b = Beneath::open(tree.path()).unwrap();
        // Would block forever if it were opened for reading.
        assert_eq!(b.state("p").unwrap().unwrap().kind, EntryKind::Special);
        assert!(b.open_file("p").is_err());
    }

    #[test]
    fn copies_keep_holes_and_drop_setuid() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("sparse");
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        rustix::io::pwrite(&f, b"tail", (64 << 20) - 4).unwrap();
        drop(f);
        let (_, digest) = hash_file(&File::open(&src).unwrap()).unwrap();
        let tree = tempfile::tempdir().unwrap();
        let b = Beneath::open(tree.path()).unwrap();
        let temp = b.write_temp("copy", &File::open(&src).unwrap(), 0o4755, &digest).unwrap();
        b.rename_into(&temp, "copy").unwrap();
        let meta = std::fs::metadata(tree.path().join("copy")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(meta.len(), 64 << 20);
        assert!(meta.blocks() * 512 < 1 << 20, "the copy allocated {} bytes", meta.blocks() * 512);
        assert_eq!(meta.mode() & 0o7777, 0o755, "setuid kept");
        assert!(b.write_temp("other", &File::open(&src).unwrap(), 0o644, "00").is_err());
        assert_eq!(std::fs::read_dir(tree.path()).unwrap().count(), 1, "a refused copy left its temporary");
    }

    /// Bytes this thread has read with read-class syscalls so far.
    fn thread_rchar() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().trim().parse().unwrap()
    }

    fn sparse(dir: &Path, name: &str, size: u64, writes: &[(u64, &[u8])]) -> std::path::PathBuf {
        let path = dir.join(name);
        let f = File::create(&path).unwrap();
        f.set_len(size).unwrap();
        for (at, bytes) in writes {
            rustix::io::pwrite(&f, bytes, *at).unwrap();
        }
        path
    }

    /// Issue 46.7: a small file's digest is the SHA-256 of its bytes; a
    /// large one's is its block digest, the same for a hole as for written
    /// zeros, different for any other byte, and computed without reading
    /// a hole (a 4 GiB sparse file: what this thread read is counted).
    #[test]
    fn digests_skip_holes_and_still_tell_contents_apart() {
        let dir = tempfile::tempdir().unwrap();
        let small = sparse(dir.path(), "small", 10_000, &[(9_000, &b"x"[..])]);
        let bytes = std::fs::read(&small).unwrap();
        assert_eq!(hash_file(&File::open(&small).unwrap()).unwrap().1, hex(&Sha256::digest(&bytes)));
        let size = 4u64 << 30;
        let holes = sparse(dir.path(), "holes", size, &[(size / 2, &b"middle"[..]), (size - 3, &b"end"[..])]);
        let before = thread_rchar();
        let (n, digest) = hash_file(&File::open(&holes).unwrap()).unwrap();
        let read = thread_rchar() - before;
        assert_eq!(n, size);
        assert!(read < 1 << 20, "hashing 4 GiB of holes read {read} bytes");
        // The same bytes with a block of zeros written out: the same digest.
        let zeros = [0u8; 8192];
        let written = sparse(
            dir.path(),
            "written",
            size,
            &[(size / 2, &b"middle"[..]), (size - 3, &b"end"[..]), (4096, &zeros[..])],
        );
        assert_eq!(hash_file(&File::open(&written).unwrap()).unwrap().1, digest);
        for (at, byte) in
            [(0u64, &b"y"[..]), (size / 2 - 1, &b"y"[..]), (size - 1, &b"y"[..]), (4096 * 7 + 5, &b"\0"[..])]
        {
            let other =
                sparse(dir.path(), "other", size, &[(size / 2, &b"middle"[..]), (size - 3, &b"end"[..]), (at, byte)]);
            let changed = byte != &b"\0"[..];
            assert_eq!(hash_file(&File::open(&other).unwrap()).unwrap().1 != digest, changed, "a byte at {at}");
        }
        // An append to it is an append; a byte in its hole is not.
        let b = Beneath::open(dir.path()).unwrap();
        let appended =
            sparse(dir.path(), "appended", size + 4, &[(size / 2, &b"middle"[..]), (size - 3, &b"end+"[..])]);
        let before = thread_rchar();
        assert!(starts_with(&b, "appended", &b, "holes").unwrap());
        assert!(thread_rchar() - before < 1 << 20, "comparing holes read them");
        drop(appended);
        let poked = sparse(
            dir.path(),
            "poked",
            size + 4,
            &[(size / 2, &b"middle"[..]), (size - 3, &b"end+"[..]), (4096, &b"p"[..])],
        );
        drop(poked);
        assert!(!starts_with(&b, "poked", &b, "holes").unwrap());
    }

    /// The block digest as its documentation spells it, written from the
    /// bytes (the oracle for `ContentDigest`, which never sees a hole's).
    fn block_digest_of(bytes: &[u8]) -> String {
        let mut sha = Sha256::new();
        sha.update(b"cairn-blocks-v1\0");
        sha.update((bytes.len() as u64).to_le_bytes());
        let mut zeros = 0u64;
        let chunks = bytes.chunks_exact(4096);
        let tail = chunks.remainder();
        for chunk in chunks {
            if chunk.iter().all(|&b| b == 0) {
                zeros += 1;
                continue;
            }
            if zeros > 0 {
                sha.update(b"Z");
                sha.update(zeros.to_le_bytes());
                zeros = 0;
            }
            sha.update(b"D");
            sha.update(chunk);
        }
        if zeros > 0 {
            sha.update(b"Z");
            sha.update(zeros.to_le_bytes());
        }
        if !tail.is_empty() {
            sha.update(b"T");
            sha.update((tail.len() as u64).to_le_bytes());
            sha.update(tail);
        }
        hex(&sha.finalize())
    }

    #[test]
    fn the_block_digest_is_what_its_documentation_says() {
        let dir = tempfile::tempdir().unwrap();
        let size = BLOCK_DIGEST_MIN + 4096 * 3 + 123;
        for writes in [
            vec![],
            vec![(0u64, &b"head"[..])],
            vec![(5000, &b"odd"[..]), (BLOCK_DIGEST_MIN / 2 + 77, &b"mid"[..]), (size - 1, &b"z"[..])],
            vec![(4095, &b"across"[..]), (size - 200, &b"near the end"[..])],
        ] {
            let path = sparse(dir.path(), "f", size, &writes);
            let bytes = std::fs::read(&path).unwrap();
            let (n, digest) = hash_file(&File::open(&path).unwrap()).unwrap();
            assert_eq!(n, size);
            assert_eq!(digest, block_digest_of(&bytes), "{writes:?}");
            let copy = File::create(dir.path().join("copy")).unwrap();
            assert_eq!(copy_sparse(&File::open(&path).unwrap(), &copy).unwrap(), digest);
        }
    }
}
