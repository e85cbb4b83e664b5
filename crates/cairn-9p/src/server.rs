//! The 9P2000 server: listeners, one thread per connection, the fid table,
//! and the dispatch of each message to the tree. Messages are decoded and
//! encoded with the `ninep` crate's codec (every length bounded by the
//! negotiated msize); this loop is ours because cairn needs per-fid state
//! (a prompt is sent when its fid is clunked, `s/new` answers the id on the
//! same fid) and Tflush of one blocked read by its tag, which `ninep`'s
//! `Serve9p` trait (per-qid writes, reads without tags) cannot express.
//!
//! Must not: block a connection on a stream read (blocked reads wait on
//! their own thread until data comes or Tflush cancels them), let one
//! connection's input reach another's, or panic on any input. Limits: the
//! msize, fids per connection, blocked reads per connection, connections,
//! and a write timeout for a client that never reads.
//!
//! Before a connection is served, its peer must pass the rule of
//! [`crate::peer`] (same uid, not a tool). A refused peer gets one `Rerror`
//! with the reason as the answer to its first message (usually Tversion),
//! the server logs one line on stderr, and the connection is closed.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, bail};
use ninep::fs::{FileType, Qid};
use ninep::sansio::protocol::{Data, NineP, RawStat, Rdata, Rmessage, SharedBuf, Tdata, Tmessage};
use ninep::sync::SyncNineP;

use crate::dial::Dial;
use crate::live::{Runtime, lock};
use crate::peer::{Me, Refusal};
use crate::tree::{self, Handle, Node, ReadOutcome};

/// Bytes of a message header around read/write data (9P's IOHDRSZ).
const IOHDRSZ: u32 = 24;
/// The least msize a client may offer: room for a stat and a short read.
const MIN_MSIZE: u32 = 256;
/// The most names one Twalk may carry (9P's MAXWELEM).
const MAXWELEM: usize = 16;

/// Bounds on what one client can make the server hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest msize agreed (and accepted before Tversion).
    pub max_msize: u32,
    /// Fids per connection.
    pub max_fids: usize,
    /// Blocked reads per connection.
    pub max_blocked: usize,
    /// Open connections.
    pub max_connections: usize,
    /// How long a reply may wait for a client that does not read.
    pub write_timeout: Duration,
    /// How long a connection may stay open without negotiating (Tversion):
    /// a peer that connects and says nothing does not hold a slot forever.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_msize: 1 << 20,
            max_fids: 65_536,
            max_blocked: 256,
            max_connections: 1024,
            write_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(30),
        }
    }
}

/// A bound listener.
#[derive(Debug)]
pub enum Listener {
    /// A Unix socket (removed when the server stops).
    Unix(UnixListener, PathBuf),
    /// A TCP socket; `true` when it was opened with `--listen-insecure`
    /// (peers from other hosts are then accepted; local peers are always
    /// checked, see [`crate::peer`]).
    Tcp(TcpListener, bool),
}

impl Listener {
    /// Bind `dial`. A Unix socket is created mode 0600 in a directory that
    /// must not be open to others; TCP on a non-loopback address is refused
    /// unless `insecure`.
    pub fn bind(dial: &Dial, insecure: bool) -> Result<(Self, Dial)> {
        match dial {
            Dial::Unix(path) => bind_unix(path).map(|l| (l, dial.clone())),
            Dial::Tcp { host, .. } => {
                if !insecure && !dial.is_local()? {
                    bail!(
                        "refusing to listen on {dial}: 9P has no authentication here, so anyone who can reach \
                         {host} could drive sessions and run tools as you; listen on a loopback address \
                         (tcp!127.0.0.1!PORT) or a unix socket, or pass --listen-insecure to accept that"
                    );
                }
                let addrs = dial.socket_addrs()?;
                let listener =
                    TcpListener::bind(addrs.as_slice()).with_context(|| format!("cannot listen on {dial}"))?;
                let local = listener.local_addr()?;
                let actual = Dial::Tcp { host: local.ip().to_string(), port: local.port() };
                Ok((Self::Tcp(listener, insecure), actual))
            }
        }
    }
}

fn bind_unix(path: &Path) -> Result<Listener> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.exists() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let mode = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        bail!(
            "{} is open to other users (mode {:o}); 9P has no authentication here, so the socket must live in a \
             directory only you can enter: run `chmod 700 {}` or choose another path",
            dir.display(),
            mode & 0o777,
            dir.display()
        );
    }
    if std::fs::symlink_metadata(path).is_ok() {
        if UnixStream::connect(path).is_ok() {
            bail!("{} is in use by another server", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("cannot remove the stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(Listener::Unix(listener, path.to_path_buf()))
}

/// A file tree the 9P loop serves: the session tree ([`Runtime`], below)
/// and the tool service's (`toolsrv::Service`). The loop owns the protocol
/// (fids, opens, directory encoding, blocked reads and their Tflush); the
/// tree owns names and what each file does.
pub trait Tree: Send + Sync + 'static {
    /// One file or directory.
    type Node: Clone + Send + 'static;
    /// What a fid remembers between its reads and writes.
    type Handle: Default + Send + 'static;

    /// The root.
    fn root(&self) -> Self::Node;
    /// Whether `node` is a directory.
    fn is_dir(&self, node: &Self::Node) -> bool;
    /// Its path from the root (for error messages).
    fn path(&self, node: &Self::Node) -> String;
    /// Its qid (stable across connections).
    fn qid(&self, node: &Self::Node) -> Qid;
    /// Its 9P stat.
    fn stat(&self, node: &Self::Node) -> RawStat;
    /// The child `name` of `dir` (`..`: the parent), if it exists now.
    fn walk(self: &Arc<Self>, dir: &Self::Node, name: &str) -> Result<Self::Node>;
    /// The entries of directory `dir`.
    fn list(self: &Arc<Self>, dir: &Self::Node) -> Result<Vec<Self::Node>>;
    /// Check that file `node` may be opened (`read`, `write`).
    fn open(self: &Arc<Self>, node: &Self::Node, read: bool, write: bool) -> Result<()>;
    /// Tcreate of `name` in `dir` with `perm` and `mode`: the node opened
    /// and whether it is open for reading too. Default: refused.
    fn create(self: &Arc<Self>, dir: &Self::Node, name: &str, perm: u32, mode: u8) -> Result<(Self::Node, bool)> {
        let _ = (perm, mode);
        bail!("{}/{name}: files cannot be created here", self.path(dir).trim_end_matches('/'))
    }
    /// Read `count` bytes at `offset` of an open file.
    fn read(
        self: &Arc<Self>,
        node: &Self::Node,
        handle: &mut Self::Handle,
        offset: u64,
        count: usize,
    ) -> Result<ReadOutcome>;
    /// Write `data` to an open file; the bytes taken.
    fn write(self: &Arc<Self>, node: &Self::Node, handle: &mut Self::Handle, data: &[u8]) -> Result<usize>;
    /// An open fid is clunked (or its connection ended).
    fn close(self: &Arc<Self>, node: &Self::Node, handle: &mut Self::Handle) -> Result<()>;
    /// Tremove of `node`.
    fn remove(self: &Arc<Self>, node: &Self::Node) -> Result<()>;
    /// Twstat of `node` (refuse what cannot change).
    fn wstat(&self, node: &Self::Node, stat: &RawStat) -> Result<()>;
    /// A counter of changes, for [`Tree::wait`].
    fn changes(&self) -> u64 {
        0
    }
    /// Between two tries of a blocked read: wait until the counter moves
    /// from `seen` or a short while passes; the counter now.
    fn wait(&self, seen: u64) -> u64;
    /// Whether the server is stopping (blocked reads then end empty).
    fn is_stopping(&self) -> bool {
        false
    }
}

/// The server: listeners over one tree.
#[derive(Debug)]
pub struct NineServer<T> {
    tree: Arc<T>,
    limits: Limits,
    connections: Arc<AtomicUsize>,
}

/// The session tree's server (`cairn serve`).
pub type Server = NineServer<Runtime>;

impl<T: Tree> NineServer<T> {
    /// A server of `tree`.
    pub fn new(tree: Arc<T>, limits: Limits) -> Self {
        Self { tree, limits, connections: Arc::new(AtomicUsize::new(0)) }
    }

    /// Accept connections on `listener` on a thread of its own.
    pub fn spawn(&self, listener: Listener) -> Result<std::thread::JoinHandle<()>> {
        let tree = Arc::clone(&self.tree);
        let limits = self.limits;
        let connections = Arc::clone(&self.connections);
        let thread = std::thread::Builder::new().name("9p-accept".to_owned());
        let me = Arc::new(Me::current());
        Ok(thread.spawn(move || match listener {
            Listener::Unix(l, path) => {
                let name = path.display().to_string();
                for stream in l.incoming() {
                    let Ok(stream) = stream else { continue };
                    let _ = stream.set_write_timeout(Some(limits.write_timeout));
                    let Ok(reader) = stream.try_clone() else { continue };
                    let (me, name) = (Arc::clone(&me), name.clone());
                    let check = move |s: &UnixStream| me.check_unix(s).map_err(|why| (why, name));
                    start_connection(&tree, limits, &connections, reader, stream, check);
                }
            }
            Listener::Tcp(l, remote_ok) => {
                let name = l.local_addr().map_or_else(|_| "tcp".to_owned(), |a| a.to_string());
                for stream in l.incoming() {
                    let Ok(stream) = stream else { continue };
                    let _ = stream.set_nodelay(true);
                    let _ = stream.set_write_timeout(Some(limits.write_timeout));
                    let Ok(reader) = stream.try_clone() else { continue };
                    let (me, name) = (Arc::clone(&me), name.clone());
                    let check = move |s: &TcpStream| me.check_tcp(s, remote_ok).map_err(|why| (why, name));
                    start_connection(&tree, limits, &connections, reader, stream, check);
                }
            }
        })?)
    }

    /// Open connections now.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Something a connection reads requests from.
trait Input: std::io::Read + Send + 'static {
    fn close(&self);
    fn set_read_timeout(&self, timeout: Option<Duration>);
}

impl Input for UnixStream {
    fn close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) {
        let _ = UnixStream::set_read_timeout(self, timeout);
    }
}

impl Input for TcpStream {
    fn close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) {
        let _ = TcpStream::set_read_timeout(self, timeout);
    }
}

/// A connection's input with a total deadline for the handshake: each
/// read may wait only for what is left of it (a socket's read timeout is
/// an idle timer, renewed by every byte).
struct Deadline<R> {
    inner: R,
    until: Option<Instant>,
}

impl<R: Input> std::io::Read for Deadline<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(until) = self.until {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.inner.set_read_timeout(Some(left));
        }
        self.inner.read(buf)
    }
}

/// The largest first message a refused peer may send (Tversion is tiny).
const REFUSED_MSIZE: u32 = 8192;
/// How long a refused peer has to send its first message.
const REFUSED_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Tell a refused peer why: log one line, answer its first message with an
/// Rerror carrying the reason, close.
fn refuse_connection<R: Input, W: Write>(reader: R, mut writer: W, why: &Refusal, listener: &str) {
    eprintln!("cairn: refused a connection on {listener}: {why}");
    reader.set_read_timeout(Some(REFUSED_READ_TIMEOUT));
    let mut input = BufReader::new(reader);
    let buf = SharedBuf::default();
    if let Ok(first) = Tmessage::read_from(REFUSED_MSIZE, &buf, &mut input)
        && let Ok(bytes) = Rmessage::new(first.tag, Rdata::error(why.to_string())).write_9p_bytes()
    {
        let _ = writer.write_all(&bytes).and_then(|()| writer.flush());
    }
    input.get_ref().close();
}

/// Start serving one accepted connection on a thread of its own, once its
/// peer passed `check` (which runs on that thread: a TCP check scans /proc).
fn start_connection<T: Tree, R: Input, W: Write + Send + 'static>(
    tree: &Arc<T>,
    limits: Limits,
    connections: &Arc<AtomicUsize>,
    reader: R,
    writer: W,
    check: impl FnOnce(&W) -> std::result::Result<String, (Refusal, String)> + Send + 'static,
) {
    if connections.fetch_add(1, Ordering::SeqCst) >= limits.max_connections {
        connections.fetch_sub(1, Ordering::SeqCst);
        reader.close();
        return;
    }
    let tree = Arc::clone(tree);
    let count = Arc::clone(connections);
    let spawned = std::thread::Builder::new().name("9p-conn".to_owned()).spawn(move || {
        match check(&writer) {
            Ok(_peer) => Connection::new(tree, limits, Box::new(writer)).run(reader),
            Err((why, listener)) => refuse_connection(reader, writer, &why, &listener),
        }
        count.fetch_sub(1, Ordering::SeqCst);
    });
    if spawned.is_err() {
        connections.fetch_sub(1, Ordering::SeqCst);
    }
}

type Out = Arc<Mutex<Box<dyn Write + Send>>>;

struct Fid<T: Tree> {
    node: T::Node,
    /// (read, write) once opened.
    open: Option<(bool, bool)>,
    handle: T::Handle,
    /// A directory listing, encoded, fixed at the read at offset 0.
    dir: Option<Vec<u8>>,
}

impl<T: Tree> Fid<T> {
    fn at(node: T::Node) -> Self {
        Self { node, open: None, handle: T::Handle::default(), dir: None }
    }
}

/// A blocked read: its cancel flag.
type Blocked = Arc<Mutex<HashMap<u16, Arc<AtomicBool>>>>;

struct Connection<T: Tree> {
    tree: Arc<T>,
    limits: Limits,
    out: Out,
    /// Cleared when the connection ends: waiters stop.
    alive: Arc<AtomicBool>,
    msize: u32,
    fids: HashMap<u32, Fid<T>>,
    blocked: Blocked,
    /// Tversion was answered with 9P2000.
    negotiated: bool,
}

impl<T: Tree> Connection<T> {
    fn new(tree: Arc<T>, limits: Limits, out: Box<dyn Write + Send>) -> Self {
        Self {
            tree,
            limits,
            out: Arc::new(Mutex::new(out)),
            alive: Arc::new(AtomicBool::new(true)),
            msize: limits.max_msize,
            fids: HashMap::new(),
            blocked: Arc::new(Mutex::new(HashMap::new())),
            negotiated: false,
        }
    }

    fn run<R: Input>(mut self, reader: R) {
        // A peer that never negotiates is dropped when the handshake
        // timeout has passed since it connected (a total deadline: bytes
        // trickled one at a time do not extend it); once Tversion is
        // answered the connection may idle (a mount does).
        let until = Instant::now() + self.limits.handshake_timeout;
        let mut input = BufReader::new(Deadline { inner: reader, until: Some(until) });
        let buf = SharedBuf::default();
        // Only broken framing (a short size, end of input) ends the
        // connection; a message over msize or one that does not decode is
        // skipped and answered with Rerror, so one bad request cannot take
        // down a connection other requests share.
        while let Ok(frame) = read_frame(&mut input, self.msize) {
            let (tag, reply) = match frame {
                Frame::Whole(bytes) => match Tmessage::read_from(self.msize, &buf, &mut bytes.as_slice()) {
                    Ok(message) => {
                        let tag = message.tag;
                        match self.handle(message) {
                            Ok(Some(rdata)) => {
                                if self.negotiated && input.get_ref().until.is_some() {
                                    input.get_mut().until = None;
                                    input.get_ref().inner.set_read_timeout(None);
                                }
                                (tag, rdata)
                            }
                            Ok(None) => continue,
                            Err(e) => (tag, Rdata::error(format!("{e:#}"))),
                        }
                    }
                    Err(e) => (frame_tag(&bytes), Rdata::error(format!("a message that does not decode: {e}"))),
                },
                Frame::TooBig { tag, size } => (
                    tag,
                    Rdata::error(format!(
                        "a message of {size} bytes exceeds the negotiated msize {}: split it (a write may carry \
                         at most msize-{IOHDRSZ} bytes)",
                        self.msize
                    )),
                ),
            };
            if !send(&self.out, self.msize, tag, reply) {
                break;
            }
        }
        self.alive.store(false, Ordering::SeqCst);
        input.get_ref().inner.close();
        self.clunk_all();
    }

    /// End every blocked read without a reply (Tversion aborts them).
    fn abort_blocked(&self) {
        for (_, flag) in lock(&self.blocked).drain() {
            flag.store(true, Ordering::SeqCst);
        }
    }

    fn clunk_all(&mut self) {
        for (_, mut fid) in self.fids.drain() {
            if fid.open.is_some() {
                // A prompt (or job request) whose connection ended is still
                // sent: the client wrote it and closed (a crash between
                // write and clunk is indistinguishable here). Errors have no
                // one to go to.
                let _ = self.tree.close(&fid.node, &mut fid.handle);
            }
        }
    }

    fn fid(&mut self, fid: u32) -> Result<&mut Fid<T>> {
        match self.fids.get_mut(&fid) {
            Some(f) => Ok(f),
            None => bail!("unknown fid {fid}"),
        }
    }

    fn handle(&mut self, message: Tmessage) -> Result<Option<Rdata>> {
        let tag = message.tag;
        let tree = Arc::clone(&self.tree);
        Ok(Some(match message.content {
            Tdata::Version { msize, version } => {
                // version(5): Tversion aborts all outstanding I/O and
                // clunks all fids; the answer's msize is at most the
                // client's.
                self.abort_blocked();
                self.clunk_all();
                if msize < MIN_MSIZE {
                    bail!("msize {msize} is below the least this server can work with ({MIN_MSIZE}): offer more");
                }
                if !version.starts_with("9P2000") {
                    self.negotiated = false;
                    return Ok(Some(Rdata::version(msize.min(self.limits.max_msize), "unknown")));
                }
                self.msize = msize.min(self.limits.max_msize);
                self.negotiated = true;
                Rdata::version(self.msize, "9P2000")
            }
            // version(5): Tversion must be the first message; nothing is
            // served on a connection that has not agreed on one.
            _ if !self.negotiated => {
                bail!("no version was negotiated: send Tversion (9P2000) first")
            }
            Tdata::Auth { .. } => bail!("no authentication is required (none is possible: keep the socket private)"),
            Tdata::Attach { fid, .. } => {
                if self.fids.contains_key(&fid) {
                    bail!("fid {fid} is in use");
                }
                self.check_fid_room()?;
                let root = tree.root();
                let qid = tree.qid(&root);
                self.fids.insert(fid, Fid::at(root));
                Rdata::attach(qid)
            }
            Tdata::Flush { old_tag } => {
                // Under the lock: a waiter replying to old_tag either
                // finished (its reply went first) or will find it gone.
                let mut blocked = lock(&self.blocked);
                if let Some(flag) = blocked.remove(&old_tag) {
                    flag.store(true, Ordering::SeqCst);
                }
                send(&self.out, self.msize, tag, Rdata::flush());
                return Ok(None);
            }
            Tdata::Walk { fid, new_fid, wnames } => self.walk(fid, new_fid, &wnames)?,
            Tdata::Open { fid, mode } => {
                let iounit = self.msize - IOHDRSZ;
                let f = self.fid(fid)?;
                if f.open.is_some() {
                    bail!("fid {fid} is already open");
                }
                let (read, write) = match mode & 3 {
                    0 | 3 => (true, false),
                    1 => (false, true),
                    _ => (true, true),
                };
                let is_dir = tree.is_dir(&f.node);
                if is_dir && write {
                    bail!("{}: is a directory", tree.path(&f.node));
                }
                if !is_dir {
                    tree.open(&f.node, read, write)?;
                }
                f.open = Some((read, write));
                Rdata::open(tree.qid(&f.node), iounit)
            }
            Tdata::Create { fid, name, perm, mode } => {
                let iounit = self.msize - IOHDRSZ;
                let f = self.fid(fid)?;
                if f.open.is_some() {
                    bail!("fid {fid} is already open");
                }
                let (node, read) = tree.create(&f.node, &name, perm, mode)?;
                *f = Fid { node, open: Some((read, true)), handle: T::Handle::default(), dir: None };
                Rdata::create(tree.qid(&f.node), iounit)
            }
            Tdata::Read { fid, offset, count } => return self.read(tag, fid, offset, count),
            Tdata::Write { fid, data, .. } => {
                let f = self.fid(fid)?;
                if !matches!(f.open, Some((_, true))) {
                    bail!("fid {fid} is not open for writing");
                }
                let bytes = data_bytes(&data);
                let n = tree.write(&f.node, &mut f.handle, &bytes)?;
                Rdata::write(u32::try_from(n).unwrap_or(u32::MAX))
            }
            Tdata::Clunk { fid } => {
                let Some(mut f) = self.fids.remove(&fid) else { bail!("unknown fid {fid}") };
                if f.open.is_some() {
                    tree.close(&f.node, &mut f.handle)?;
                }
                Rdata::clunk()
            }
            Tdata::Remove { fid } => {
                let Some(f) = self.fids.remove(&fid) else { bail!("unknown fid {fid}") };
                tree.remove(&f.node)?;
                Rdata::remove()
            }
            Tdata::Stat { fid } => {
                let node = self.fid(fid)?.node.clone();
                let stat = tree.stat(&node);
                Rdata::stat(stat.size + 2, stat)
            }
            Tdata::Wstat { fid, stat, .. } => {
                let node = self.fid(fid)?.node.clone();
                tree.wstat(&node, &stat)?;
                Rdata::wstat()
            }
        }))
    }

    fn check_fid_room(&self) -> Result<()> {
        if self.fids.len() >= self.limits.max_fids {
            bail!("too many fids on this connection (limit {}): clunk some", self.limits.max_fids);
        }
        Ok(())
    }

    fn walk(&mut self, fid: u32, new_fid: u32, wnames: &[String]) -> Result<Rdata> {
        if wnames.len() > MAXWELEM {
            bail!("a walk may carry at most {MAXWELEM} names");
        }
        if new_fid != fid {
            if self.fids.contains_key(&new_fid) {
                bail!("fid {new_fid} is in use");
            }
            self.check_fid_room()?;
        }
        let tree = Arc::clone(&self.tree);
        let f = self.fid(fid)?;
        if f.open.is_some() {
            bail!("fid {fid} is open; walk from an unopened fid");
        }
        let mut node = f.node.clone();
        let mut qids = Vec::with_capacity(wnames.len());
        for name in wnames {
            match tree.walk(&node, name) {
                Ok(next) => {
                    qids.push(tree.qid(&next));
                    node = next;
                }
                Err(e) if qids.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        if qids.len() == wnames.len() {
            self.fids.insert(new_fid, Fid::at(node));
        }
        Ok(Rdata::walk(qids))
    }

    fn read(&mut self, tag: u16, fid: u32, offset: u64, count: u32) -> Result<Option<Rdata>> {
        let count = count.min(self.msize - IOHDRSZ) as usize;
        let tree = Arc::clone(&self.tree);
        let f = self.fid(fid)?;
        if !matches!(f.open, Some((true, _))) {
            bail!("fid {fid} is not open for reading");
        }
        if tree.is_dir(&f.node) {
            if offset == 0 || f.dir.is_none() {
                let mut encoded = Vec::new();
                for child in tree.list(&f.node)? {
                    let stat = tree.stat(&child);
                    encoded.extend(stat.write_9p_bytes().map_err(|e| anyhow::anyhow!("{e}"))?);
                }
                f.dir = Some(encoded);
            }
            let dir = f.dir.as_deref().unwrap_or_default();
            return Ok(Some(Rdata::read(dir_chunk(dir, offset, count))));
        }
        match tree.read(&f.node, &mut f.handle, offset, count)? {
            ReadOutcome::Data(data) => Ok(Some(Rdata::read(data))),
            ReadOutcome::Block => {
                let node = f.node.clone();
                self.block(tag, node, offset, count)?;
                Ok(None)
            }
        }
    }

    /// Wait for a stream on a thread of its own; reply when data comes,
    /// never if Tflush cancels it first.
    fn block(&mut self, tag: u16, node: T::Node, offset: u64, count: usize) -> Result<()> {
        let flag = Arc::new(AtomicBool::new(false));
        {
            let mut blocked = lock(&self.blocked);
            if blocked.len() >= self.limits.max_blocked {
                bail!("too many blocked reads on this connection (limit {})", self.limits.max_blocked);
            }
            blocked.insert(tag, Arc::clone(&flag));
        }
        let (tree, out, blocked, alive, msize) = (
            Arc::clone(&self.tree),
            Arc::clone(&self.out),
            Arc::clone(&self.blocked),
            Arc::clone(&self.alive),
            self.msize,
        );
        let spawned = std::thread::Builder::new().name("9p-read".to_owned()).spawn(move || {
            let mut seen = tree.changes();
            let mut handle = T::Handle::default();
            loop {
                if flag.load(Ordering::SeqCst) || !alive.load(Ordering::SeqCst) {
                    return;
                }
                let reply = match tree.read(&node, &mut handle, offset, count) {
                    Ok(ReadOutcome::Data(data)) => Some(Rdata::read(data)),
                    Ok(ReadOutcome::Block) if tree.is_stopping() => Some(Rdata::read(Vec::new())),
                    Ok(ReadOutcome::Block) => None,
                    Err(e) => Some(Rdata::error(format!("{e:#}"))),
                };
                if let Some(reply) = reply {
                    let mut blocked = lock(&blocked);
                    if blocked.remove(&tag).is_some() {
                        send(&out, msize, tag, reply);
                    }
                    return;
                }
                seen = tree.wait(seen);
            }
        });
        if spawned.is_err() {
            lock(&self.blocked).remove(&tag);
            bail!("cannot wait for data: no thread available");
        }
        Ok(())
    }
}

/// The session tree (`tree.rs`) as the loop serves it.
impl Tree for Runtime {
    type Node = Node;
    type Handle = Handle;

    fn root(&self) -> Node {
        Node::Root
    }

    fn is_dir(&self, node: &Node) -> bool {
        node.is_dir()
    }

    fn path(&self, node: &Node) -> String {
        node.path()
    }

    fn qid(&self, node: &Node) -> Qid {
        qid(node)
    }

    fn stat(&self, node: &Node) -> RawStat {
        let (length, mtime) = tree::size_and_mtime(self, node);
        let mtime = mtime.duration_since(UNIX_EPOCH).map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
        stat_of(node.name(), qid(node), node.mode(), length, mtime)
    }

    fn walk(self: &Arc<Self>, dir: &Node, name: &str) -> Result<Node> {
        tree::walk(self, dir, name)
    }

    fn list(self: &Arc<Self>, dir: &Node) -> Result<Vec<Node>> {
        tree::list(self, dir)
    }

    fn open(self: &Arc<Self>, node: &Node, read: bool, write: bool) -> Result<()> {
        tree::open(self, node, read, write)
    }

    fn create(self: &Arc<Self>, dir: &Node, name: &str, perm: u32, mode: u8) -> Result<(Node, bool)> {
        // The tree is fixed; creating a file that exists opens it for
        // writing (what shells, FUSE and fsspec do before a write),
        // anything else is refused.
        let existing = tree::walk(self, dir, name).ok().filter(|n| n.access().1 && name != "..");
        let Some(node) = existing.filter(|_| perm & 0x8000_0000 == 0) else {
            bail!("{name}: files cannot be created here: the tree is fixed (write s/new to create a session)");
        };
        let read = matches!(mode & 3, 0 | 2 | 3) && node.access().0;
        tree::open(self, &node, read, true)?;
        Ok((node, read))
    }

    fn read(self: &Arc<Self>, node: &Node, handle: &mut Handle, offset: u64, count: usize) -> Result<ReadOutcome> {
        tree::read(self, node, handle, offset, count)
    }

    fn write(self: &Arc<Self>, node: &Node, handle: &mut Handle, data: &[u8]) -> Result<usize> {
        tree::write(self, node, handle, data)
    }

    fn close(self: &Arc<Self>, node: &Node, handle: &mut Handle) -> Result<()> {
        tree::close(self, node, handle)
    }

    fn remove(self: &Arc<Self>, node: &Node) -> Result<()> {
        tree::remove(self, node)
    }

    fn wstat(&self, node: &Node, stat: &RawStat) -> Result<()> {
        // Truncation (length 0) and "change nothing" are what shells and
        // FUSE send before writing; accept them, refuse the rest.
        let untouched = stat.mode == u32::MAX && stat.mtime == u32::MAX && stat.name.is_empty();
        if node.is_dir() || !untouched || !(stat.length == 0 || stat.length == u64::MAX) {
            bail!("{}: its name, mode and times cannot be changed", node.path());
        }
        Ok(())
    }

    fn changes(&self) -> u64 {
        self.pulse.now()
    }

    fn wait(&self, seen: u64) -> u64 {
        // Other processes append to session files without a pulse.
        self.pulse.wait(seen, Duration::from_millis(250))
    }

    fn is_stopping(&self) -> bool {
        Runtime::is_stopping(self)
    }
}

/// Whole directory entries from `offset`, at most `count` bytes.
fn dir_chunk(dir: &[u8], offset: u64, count: usize) -> Vec<u8> {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    if start >= dir.len() {
        return Vec::new();
    }
    let mut end = start;
    while end + 2 <= dir.len() {
        let size = usize::from(u16::from_le_bytes([dir[end], dir[end + 1]])) + 2;
        if end + size > dir.len() || end + size - start > count {
            break;
        }
        end += size;
    }
    dir[start..end].to_vec()
}

/// One message read off the wire.
enum Frame {
    /// All its bytes, size included.
    Whole(Vec<u8>),
    /// Over msize: its bytes were read and dropped.
    TooBig { tag: u16, size: u32 },
}

/// The largest message skipped (and answered with Rerror) rather than
/// taken as broken framing.
const SKIP_LIMIT: u32 = 16 << 20;

/// Read one message's bytes by its size prefix. Errors only when the
/// framing itself is lost (end of input, a size below a header's).
fn read_frame(input: &mut impl std::io::Read, msize: u32) -> std::io::Result<Frame> {
    let mut head = [0u8; 7];
    input.read_exact(&mut head)?;
    let size = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if size < 7 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a message shorter than its header"));
    }
    if size > msize {
        if size > SKIP_LIMIT {
            // Not a request gone too big but a stream out of step.
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a message size beyond any client's"));
        }
        let rest = u64::from(size - 7);
        let skipped = std::io::copy(&mut std::io::Read::take(&mut *input, rest), &mut std::io::sink())?;
        if skipped < rest {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        return Ok(Frame::TooBig { tag: u16::from_le_bytes([head[5], head[6]]), size });
    }
    let mut bytes = vec![0u8; size as usize];
    bytes[..7].copy_from_slice(&head);
    input.read_exact(&mut bytes[7..])?;
    Ok(Frame::Whole(bytes))
}

fn frame_tag(bytes: &[u8]) -> u16 {
    u16::from_le_bytes([bytes[5], bytes[6]])
}

/// Encode and send one reply; false when the client is gone.
fn send(out: &Out, msize: u32, tag: u16, content: Rdata) -> bool {
    let mut message = Rmessage::new(tag, content);
    if message.n_bytes() > msize as usize {
        message = Rmessage::new(tag, Rdata::error("the reply would exceed msize; read fewer bytes"));
    }
    let Ok(bytes) = message.write_9p_bytes() else { return false };
    let mut out = lock(out);
    out.write_all(&bytes).and_then(|()| out.flush()).is_ok()
}

fn data_bytes(data: &Data) -> Vec<u8> {
    // `Data` keeps its bytes private; its encoding is a 4-byte count, then them.
    data.write_9p_bytes().map(|mut b| b.split_off(4.min(b.len()))).unwrap_or_default()
}

/// The qid of `node`.
pub fn qid(node: &Node) -> Qid {
    if node.is_dir() { Qid::dir(node.qid_path()) } else { Qid::file(node.qid_path()) }
}

/// A stat entry: `mode` is the permission bits (the directory bit is set
/// from the qid), times in seconds since the epoch.
pub(crate) fn stat_of(name: String, qid: Qid, mode: u32, length: u64, mtime: u32) -> RawStat {
    let atime =
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
    let dir_bit = if qid.ty == FileType::DIRECTORY { 0x8000_0000 } else { 0 };
    let (uid, gid, muid) = ("cairn".to_owned(), "cairn".to_owned(), "cairn".to_owned());
    let strings = [&name, &uid, &gid, &muid].iter().map(|s| 2 + s.len()).sum::<usize>();
    RawStat {
        size: u16::try_from(2 + 4 + 13 + 4 + 4 + 4 + 8 + strings).unwrap_or(u16::MAX),
        ty: 0,
        dev: 0,
        qid,
        mode: dir_bit | mode,
        atime,
        mtime,
        length,
        name,
        uid,
        gid,
        muid,
    }
}
