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
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

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
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
        Ok(Self { root, shown: dir.to_path_buf(), modes: Default::default() })
    }

    /// Open cairn's own staging layer for reading. A non-root cairn cannot
    /// enter a directory the command made unreadable to its owner
    /// (`chmod -R 000 d`, staged): every such directory of the layer (its
    /// own, private to cairn) is opened up for the owner first (u+rwx), and
    /// its real mode kept and reported by [`Beneath::node`]. Root reads
    /// whatever the modes say and changes nothing.
    pub fn open_layer(dir: &Path) -> io::Result<Self> {
        let mut layer = Self::open(dir)?;
        if !rustix::process::geteuid().is_root() {
            let mut modes = std::collections::BTreeMap::new();
            open_up(&layer.root, "", &mut modes, 0)?;
            layer.modes = modes;
        }
        Ok(layer)
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
    fn parent<'a>(&self, rel: &'a str) -> io::Result<Option<(OwnedFd, &'a str)>> {
        let (parent, name) = split(rel)?;
        Ok(self.dir(parent)?.map(|fd| (fd, name)))
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
        // Reads of a regular file never block; clear the flag anyway so
        // the descriptor behaves as an ordinary one.
        rustix::fs::fcntl_setfl(&fd, OFlags::empty())?;
        Ok(File::from(fd))
    }

    /// The state of `rel` (content hashed for a file, target hashed for a
    /// link, nothing opened for anything else); `None` when missing.
    pub fn state(&self, rel: &str) -> io::Result<Option<FileState>> {
        let Some(node) = self.node(rel)? else { return Ok(None) };
        let (size, sha256) = match node.kind {
            EntryKind::Dir | EntryKind::Special => {
                (if node.kind == EntryKind::Dir { 0 } else { node.size }, String::new())
            }
            EntryKind::Symlink => {
                let target = self.read_link(rel)?;
                (node.size, hex(&Sha256::digest(target.as_os_str().as_encoded_bytes())))
            }
            EntryKind::File => {
                let file = self.open_file(rel)?;
                let (size, digest) = hash_file(&file)?;
                (size, digest)
            }
        };
        Ok(Some(FileState { kind: node.kind, size, sha256, mode: node.mode }))
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
        let fd = self.dir(rel)?.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, self.show(rel)))?;
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
fn open_own_unreadable(dir: &OwnedFd, name: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
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
fn create_excl(dir: &OwnedFd) -> io::Result<(OwnedFd, String)> {
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

/// Holes are hashed as zeros from here.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// The size and SHA-256 of an open regular file's bytes.
pub fn hash_file(file: &File) -> io::Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let size = rustix::fs::fstat(file)?.st_size as u64;
    let mut buf = vec![0u8; size.clamp(1, CHUNK as u64) as usize];
    let mut offset = 0u64;
    loop {
        let n = rustix::io::pread(file, &mut buf[..], offset)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
    Ok((offset, hex(&hasher.finalize())))
}

/// Copy `src` to the empty file `dst`, data regions only (holes stay
/// holes: `SEEK_DATA`/`SEEK_HOLE`), hashing every byte (holes as zeros);
/// the SHA-256 of what was copied.
pub(crate) fn copy_sparse(src: &File, dst: &File) -> io::Result<String> {
    use rustix::fs::SeekFrom;
    let size = rustix::fs::fstat(src)?.st_size as u64;
    let mut hasher = Sha256::new();
    // Sized to the file: most files a build writes are small, and a
    // 128 KiB buffer zeroed per file cost more than the copy.
    let mut buf = vec![0u8; size.clamp(1, CHUNK as u64) as usize];
    let zeros = &ZEROS[..];
    let mut pos = 0u64;
    while pos < size {
        // The next data region; ENXIO: only a hole is left.
        let data = match rustix::fs::seek(src, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => size,
            Err(rustix::io::Errno::INVAL) => pos, // no SEEK_DATA here: all data
            Err(e) => return Err(e.into()),
        };
        let mut hole = data - pos;
        while hole > 0 {
            let n = hole.min(zeros.len() as u64) as usize;
            hasher.update(&zeros[..n]);
            hole -= n as u64;
        }
        pos = data;
        if pos >= size {
            break;
        }
        let end = match rustix::fs::seek(src, SeekFrom::Hole(pos)) {
            Ok(h) => h.min(size),
            Err(_) => size,
        };
        while pos < end {
            let want = ((end - pos) as usize).min(buf.len());
            let n = rustix::io::pread(src, &mut buf[..want], pos)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the staged file shrank while it was copied"));
            }
            hasher.update(&buf[..n]);
            let mut written = 0;
            while written < n {
                written += rustix::io::pwrite(dst, &buf[written..n], pos + written as u64)?;
            }
            pos += n as u64;
        }
    }
    rustix::fs::ftruncate(dst, size)?;
    Ok(hex(&hasher.finalize()))
}

/// Whether the file `rel` of `tree` begins with the whole content of the
/// file `old_rel` of `old` (so the change only appended).
pub fn starts_with(tree: &Beneath, rel: &str, old: &Beneath, old_rel: &str) -> io::Result<bool> {
    let (new, old) = (tree.open_file(rel)?, old.open_file(old_rel)?);
    let old_size = rustix::fs::fstat(&old)?.st_size as u64;
    if rustix::fs::fstat(&new)?.st_size as u64 <= old_size {
        return Ok(false);
    }
    let (mut a, mut b) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    let mut offset = 0u64;
    while offset < old_size {
        let want = ((old_size - offset) as usize).min(a.len());
        let n = rustix::io::pread(&old, &mut a[..want], offset)?;
        if n == 0 {
            return Ok(false);
        }
        let mut got = 0;
        while got < n {
            let m = rustix::io::pread(&new, &mut b[got..n], offset + got as u64)?;
            if m == 0 {
                return Ok(false);
            }
            got += m;
        }
        if a[..n] != b[..n] {
            return Ok(false);
        }
        offset += n as u64;
    }
    Ok(true)
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
}
