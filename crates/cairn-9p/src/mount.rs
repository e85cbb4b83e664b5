//! `cairn mount`: the tree as a FUSE file system, forwarding every
//! operation to a running `cairn serve` over 9P (the mount keeps no state
//! of its own beside open fids, so it shows exactly what 9P clients see).
//!
//! Mapping: inode = the 9P qid path (the root is inode 1); a FUSE open is a
//! 9P walk + open on a fid of its own, clunked at FUSE release (after the
//! last close), so a prompt starts when the shell has closed the file;
//! "busy" is refused at open and write, so `echo` sees it. Reads bypass the page cache (direct I/O) and
//! attributes are never cached, so `tail -f chat` sees it grow. Reads of
//! the streams (`event`, `log`) block on a connection of their own and on
//! a thread of their own (the FUSE workers stay free for other requests);
//! while one waits, a signal pending for the reader (SIGINT, SIGKILL; fuser
//! does not pass FUSE_INTERRUPT on, so the mount looks in /proc) flushes
//! the 9P read (Tflush) and the reader gets EINTR. Writes are split to fit
//! the negotiated msize, and FUSE's max_write is set from it. The
//! server's error text is printed on the mount's stderr; the caller gets
//! an errno (ENOENT, EBUSY, EACCES, else EIO).
//!
//! Must not: hold a FUSE worker while a stream waits, or send a message
//! over msize (the shared connection serves every other operation).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyWrite, Request, WriteFlags,
};
use ninep::sansio::protocol::{NineP as _, RawStat, Rdata, Tdata};

use crate::client::{Conn, mode};
use crate::dial::Dial;
use crate::live::lock;

const TTL: Duration = Duration::ZERO;

struct Open {
    /// A stream (its reads wait on a connection of their own).
    stream: bool,
    /// That connection (taken out while a read waits), else the shared one.
    own: Option<Conn>,
    fid: u32,
    clunked: bool,
}

/// The FUSE side of the tree.
pub struct Mount {
    dial: Dial,
    shared: Mutex<Conn>,
    paths: Mutex<HashMap<u64, String>>,
    open: Arc<Mutex<HashMap<u64, Open>>>,
    /// The largest write one Twrite carries (FUSE's max_write).
    max_write: u32,
    next_fh: AtomicU64,
    uid: u32,
    gid: u32,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount").field("dial", &self.dial).finish_non_exhaustive()
    }
}

fn errno(context: &str, e: &anyhow::Error) -> Errno {
    let text = format!("{e:#}");
    eprintln!("cairn mount: {context}: {text}");
    if text.contains("no such file") || text.contains("no session") {
        Errno::ENOENT
    } else if text.contains("busy") {
        Errno::EBUSY
    } else if text.contains("permission denied") || text.contains("cannot be") {
        Errno::EACCES
    } else {
        Errno::EIO
    }
}

impl Mount {
    /// Connect to the server at `dial`.
    pub fn connect(dial: &Dial, uid: u32, gid: u32) -> Result<Self> {
        let conn = Conn::dial(dial)?;
        let max_write = conn.msize - 24;
        let paths = HashMap::from([(1, String::new())]);
        Ok(Self {
            dial: dial.clone(),
            shared: Mutex::new(conn),
            paths: Mutex::new(paths),
            max_write,
            open: Arc::new(Mutex::new(HashMap::new())),
            next_fh: AtomicU64::new(1),
            uid,
            gid,
        })
    }

    fn path(&self, ino: INodeNo) -> Option<String> {
        lock(&self.paths).get(&ino.0).cloned()
    }

    fn attr(&self, stat: &RawStat) -> FileAttr {
        let dir = stat.mode & 0x8000_0000 != 0;
        let ino = if stat.qid.path == 0 { 1 } else { stat.qid.path };
        let mtime = UNIX_EPOCH + Duration::from_secs(u64::from(stat.mtime));
        FileAttr {
            ino: INodeNo(ino),
            size: stat.length,
            blocks: stat.length.div_ceil(512),
            atime: SystemTime::now(),
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind: if dir { FileType::Directory } else { FileType::RegularFile },
            perm: u16::try_from(stat.mode & 0o777).unwrap_or(0),
            nlink: if dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn stat(&self, path: &str) -> Result<FileAttr> {
        let stat = lock(&self.shared).stat(path)?;
        let attr = self.attr(&stat);
        lock(&self.paths).insert(attr.ino.0, path.to_owned());
        Ok(attr)
    }
}

fn join(parent: &str, name: &OsStr) -> String {
    let name = name.to_string_lossy();
    if parent.is_empty() { name.into_owned() } else { format!("{parent}/{name}") }
}

impl Filesystem for Mount {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Whole pages, at most one Twrite's worth (the client splits anyway).
        let max_write = (self.max_write / 4096 * 4096).max(4096);
        if let Err(nearest) = config.set_max_write(max_write) {
            let _ = config.set_max_write(nearest);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(parent) = self.path(parent) else { return reply.error(Errno::ENOENT) };
        let path = join(&parent, name);
        match self.stat(&path) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            // Lookups of names that do not exist are normal (shells probe).
            Err(_) => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let Some(path) = self.path(ino) else { return reply.error(Errno::ENOENT) };
        match self.stat(&path) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(errno(&path, &e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The shell's O_TRUNC before a write: the tree's files take whole
        // commands, so there is nothing to truncate.
        self.getattr(_req, ino, None, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let Some(path) = self.path(ino) else { return reply.error(Errno::ENOENT) };
        let acc = flags.0 & libc::O_ACCMODE;
        let nine = match acc {
            libc::O_WRONLY => mode::WRITE,
            libc::O_RDWR => mode::RDWR,
            _ => mode::READ,
        };
        let stream = path.ends_with("/event") || path.ends_with("/log");
        let opened = (|| -> Result<Open> {
            if stream {
                let mut conn = Conn::dial(&self.dial)?;
                let (fid, _) = conn.walk(&path)?;
                conn.open(fid, nine)?;
                Ok(Open { stream: true, own: Some(conn), fid, clunked: false })
            } else {
                let mut conn = lock(&self.shared);
                let (fid, _) = conn.walk(&path)?;
                if let Err(e) = conn.open(fid, nine) {
                    let _ = conn.clunk(fid);
                    return Err(e);
                }
                Ok(Open { stream: false, own: None, fid, clunked: false })
            }
        })();
        match opened {
            Ok(open) => {
                let fh = self.next_fh.fetch_add(1, Ordering::SeqCst);
                lock(&self.open).insert(fh, open);
                reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO);
            }
            Err(e) => reply.error(errno(&path, &e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // A stream's connection is taken out while it waits, on a thread
        // of its own, so neither other handles nor FUSE workers are held.
        let taken = {
            let mut open = lock(&self.open);
            let Some(handle) = open.get_mut(&fh.0) else { return reply.error(Errno::EBADF) };
            (handle.fid, handle.stream, handle.own.take())
        };
        match taken {
            (fid, true, Some(conn)) => {
                let open = Arc::clone(&self.open);
                let pid = req.pid();
                let spawned = std::thread::Builder::new().name("mount-read".to_owned()).spawn(move || {
                    let (conn, result) = stream_read(conn, fid, offset, size, pid);
                    if let Some(conn) = conn
                        && let Some(handle) = lock(&open).get_mut(&fh.0)
                    {
                        handle.own = Some(conn);
                    }
                    match result {
                        Ok(data) => reply.data(&data),
                        Err(ReadError::Interrupted) => reply.error(Errno::EINTR),
                        Err(ReadError::Failed(e)) => reply.error(errno("read", &e)),
                    }
                });
                if let Err(e) = spawned {
                    eprintln!("cairn mount: cannot start a reader thread: {e}");
                }
            }
            // Another read of this handle is waiting (one reader at a time).
            (_, true, None) => reply.error(Errno::EBUSY),
            (fid, false, _) => match lock(&self.shared).read_at(fid, offset, size) {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno("read", &e)),
            },
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(fid) = lock(&self.open).get(&fh.0).map(|h| h.fid) else { return reply.error(Errno::EBADF) };
        match lock(&self.shared).write_at(fid, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno("write", &e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // Every close(2) of a duplicate sends a flush (a shell's `>` opens,
        // dup2s and closes once before writing): the fid is clunked at
        // release, when the last descriptor is gone.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _ = self.clunk(fh.0);
        lock(&self.open).remove(&fh.0);
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(path) = self.path(ino) else { return reply.error(Errno::ENOENT) };
        let entries = match lock(&self.shared).list(&path) {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno(&path, &e)),
        };
        let mut all = vec![(ino.0, FileType::Directory, ".".to_owned()), (ino.0, FileType::Directory, "..".to_owned())];
        for stat in &entries {
            let attr = self.attr(stat);
            lock(&self.paths).insert(attr.ino.0, join(&path, OsStr::new(&stat.name)));
            all.push((attr.ino.0, attr.kind, stat.name.clone()));
        }
        for (i, (ino, kind, name)) in all.into_iter().enumerate().skip(usize::try_from(offset).unwrap_or(usize::MAX)) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        // As a 9P client's Tremove: the server decides (a session's files
        // go with their directory, so removing one changes nothing and
        // `rm -r s/ID` reaches the `rmdir` that archives the session).
        let Some(parent) = self.path(parent) else { return reply.error(Errno::ENOENT) };
        let path = join(&parent, name);
        match lock(&self.shared).remove(&path) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&path, &e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let Some(parent) = self.path(parent) else { return reply.error(Errno::ENOENT) };
        let path = join(&parent, name);
        match lock(&self.shared).remove(&path) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&path, &e)),
        }
    }
}

impl Mount {
    fn clunk(&self, fh: u64) -> Result<()> {
        let mut open = lock(&self.open);
        let Some(handle) = open.get_mut(&fh) else { return Ok(()) };
        if handle.clunked {
            return Ok(());
        }
        handle.clunked = true;
        let fid = handle.fid;
        match handle.own.as_mut() {
            Some(conn) => conn.clunk(fid),
            // A stream whose read still holds its connection: closing that
            // connection (when the read hands it back and the handle is
            // gone) ends the fid.
            None if handle.stream => Ok(()),
            None => {
                drop(open);
                lock(&self.shared).clunk(fid)
            }
        }
    }
}

enum ReadError {
    /// A signal came for the reader: the read was flushed.
    Interrupted,
    Failed(anyhow::Error),
}

/// How often a waiting read looks for a signal pending for its reader.
const SIGNAL_POLL: Duration = Duration::from_millis(100);

/// One Tread on a stream's own connection: with direct I/O a short read is
/// what the reader gets (a stream answers as soon as something is there).
/// While it waits, a signal pending for `pid` flushes it. The connection
/// comes back unless it broke.
fn stream_read(
    mut conn: Conn,
    fid: u32,
    offset: u64,
    size: u32,
    pid: u32,
) -> (Option<Conn>, Result<Vec<u8>, ReadError>) {
    let count = size.min(conn.msize - 24);
    let tag = conn.tag();
    let flush_tag = conn.tag();
    let sent = conn.send(tag, Tdata::Read { fid, offset, count });
    let sender = sent.and_then(|()| conn.sender());
    let mut sender = match sender {
        Ok(s) => s,
        Err(e) => return (None, Err(ReadError::Failed(e))),
    };
    // The connection's reader waits on a thread of its own; this one
    // watches for signals.
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new().name("mount-recv".to_owned()).spawn(move || {
        let outcome = loop {
            match conn.recv() {
                Ok(m) if m.tag == tag => break Ok(Some(m.content)),
                Ok(m) if m.tag == flush_tag => break Ok(None),
                Ok(_) => {}
                Err(e) => break Err(e),
            }
        };
        let _ = tx.send((conn, outcome));
    });
    if let Err(e) = spawned {
        return (None, Err(ReadError::Failed(e.into())));
    }
    let mut flushed = false;
    let (conn, outcome) = loop {
        match rx.recv_timeout(SIGNAL_POLL) {
            Ok(done) => break done,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return (None, Err(ReadError::Failed(anyhow::anyhow!("the stream's connection broke"))));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                if !flushed && signal_pending(pid) {
                    flushed = true;
                    if let Err(e) = sender.send(flush_tag, Tdata::Flush { old_tag: tag }) {
                        return (None, Err(ReadError::Failed(e)));
                    }
                }
            }
        }
    };
    let result = match outcome {
        Ok(Some(Rdata::Read { data })) => Ok(data.write_9p_bytes().map(|mut b| b.split_off(4)).unwrap_or_default()),
        Ok(Some(Rdata::Error { ename })) => Err(ReadError::Failed(anyhow::anyhow!(ename))),
        Ok(Some(other)) => Err(ReadError::Failed(anyhow::anyhow!("unexpected reply to read: {other:?}"))),
        Ok(None) => Err(ReadError::Interrupted),
        Err(e) => return (None, Err(ReadError::Failed(e))),
    };
    (Some(conn), result)
}

/// Whether thread `pid` has a signal pending that it does not block (or is
/// gone): what the kernel would have sent as FUSE_INTERRUPT.
fn signal_pending(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return true };
    let mask = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0)
    };
    (mask("SigPnd:") | mask("ShdPnd:")) & !mask("SigBlk:") != 0
}

/// Detach the mount at `dir` even while files on it are open (a reader
/// blocked on a stream): root unmounts lazily, others ask fusermount.
fn detach(dir: &Path) {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return };
    // SAFETY: a valid NUL-terminated path; umount2 has no other preconditions.
    if unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0 {
        return;
    }
    for helper in ["fusermount3", "fusermount"] {
        let status = std::process::Command::new(helper)
            .args(["-u", "-z", "-q"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status();
        if status.is_ok_and(|s| s.success()) {
            return;
        }
    }
}

/// Mount the tree served at `dial` on `dir` until `stop` returns; the
/// mount is removed when this returns (or the process dies: see
/// `fusermount -u`).
pub fn run(dial: &Dial, dir: &Path, stop: impl FnOnce()) -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        anyhow::bail!("/dev/fuse is missing: this kernel or container has no FUSE; use a 9P client instead");
    }
    // SAFETY: plain getters without preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let fs = Mount::connect(dial, uid, gid)?;
    // The mount reads with FUSE_DIRECT_IO: streams block on their own
    // threads, so four workers serve everything else.
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("cairn".to_owned()), MountOption::DefaultPermissions];
    config.n_threads = Some(4);
    let session = fuser::spawn_mount(fs, dir, &config).map_err(|e| {
        anyhow::anyhow!(
            "cannot mount on {}: {e} (FUSE needs /dev/fuse and root or the fusermount3 helper)",
            dir.display()
        )
    })?;
    stop();
    // A reader blocked on a stream keeps the mount busy: a plain unmount
    // would fail and leave a dead mount once this process exits.
    detach(dir);
    drop(session);
    Ok(())
}
