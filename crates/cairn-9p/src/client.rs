//! A small synchronous 9P2000 client over the same codec: what `cairn
//! mount` forwards through and what the benchmark measures. One request at
//! a time unless the caller uses [`Conn::send`]/[`Conn::recv`] itself.
//!
//! Must not: cache fids by path (a prompt must be clunked to be sent).

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;

use anyhow::{Context as _, Result, anyhow, bail};
use ninep::fs::Qid;
use ninep::sansio::protocol::{NineP, RawStat, Rdata, Rmessage, SharedBuf, Tdata, Tmessage};
use ninep::sync::SyncNineP;

use crate::dial::Dial;

/// Open modes.
pub mod mode {
    /// Read.
    pub const READ: u8 = 0;
    /// Write.
    pub const WRITE: u8 = 1;
    /// Read and write.
    pub const RDWR: u8 = 2;
}

/// The socket under a connection (kept to clone a writer for Tflush).
enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// A second writer on a connection: sends a Tflush while the connection's
/// owner waits for a reply on another thread.
pub struct Sender(Box<dyn Write + Send>);

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender").finish_non_exhaustive()
    }
}

impl Sender {
    /// Send one message without waiting.
    pub fn send(&mut self, tag: u16, content: Tdata) -> Result<()> {
        let bytes = Tmessage::new(tag, content).write_9p_bytes().map_err(|e| anyhow!("{e}"))?;
        self.0.write_all(&bytes)?;
        self.0.flush()?;
        Ok(())
    }
}

/// One attached connection (the root is fid 0).
pub struct Conn {
    reader: BufReader<Box<dyn Read + Send>>,
    writer: Box<dyn Write + Send>,
    sock: Sock,
    buf: SharedBuf,
    /// The agreed msize.
    pub msize: u32,
    next_fid: u32,
    next_tag: u16,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("msize", &self.msize).finish_non_exhaustive()
    }
}

impl Conn {
    /// Connect to `dial`, negotiate the version and attach.
    pub fn dial(dial: &Dial) -> Result<Self> {
        let (reader, writer, sock): (Box<dyn Read + Send>, Box<dyn Write + Send>, Sock) = match dial {
            Dial::Unix(path) => {
                let s = UnixStream::connect(path).with_context(|| format!("cannot connect to {dial}"))?;
                (Box::new(s.try_clone()?), Box::new(s.try_clone()?), Sock::Unix(s))
            }
            Dial::Tcp { .. } => {
                let addrs = dial.socket_addrs()?;
                let s = TcpStream::connect(addrs.as_slice()).with_context(|| format!("cannot connect to {dial}"))?;
                s.set_nodelay(true)?;
                (Box::new(s.try_clone()?), Box::new(s.try_clone()?), Sock::Tcp(s))
            }
        };
        let mut conn = Self {
            reader: BufReader::new(reader),
            writer,
            sock,
            buf: SharedBuf::default(),
            msize: 64 * 1024,
            next_fid: 1,
            next_tag: 1,
        };
        match conn.rpc(Tdata::Version { msize: 64 * 1024 + 24, version: "9P2000".to_owned() })? {
            Rdata::Version { msize, version } if version == "9P2000" => conn.msize = msize,
            other => bail!("the server does not speak 9P2000: {other:?}"),
        }
        conn.rpc(Tdata::Attach { fid: 0, afid: u32::MAX, uname: "cairn".to_owned(), aname: String::new() })?;
        Ok(conn)
    }

    /// Send one message without waiting.
    pub fn send(&mut self, tag: u16, content: Tdata) -> Result<()> {
        let bytes = Tmessage::new(tag, content).write_9p_bytes().map_err(|e| anyhow!("{e}"))?;
        self.writer.write_all(&bytes)?;
        self.writer.flush()?;
        Ok(())
    }

    /// Receive one reply.
    pub fn recv(&mut self) -> Result<Rmessage> {
        Ok(Rmessage::read_from(self.msize.max(64 * 1024 + 24), &self.buf, &mut self.reader)?)
    }

    /// A second writer on this connection (see [`Sender`]).
    pub fn sender(&self) -> Result<Sender> {
        Ok(Sender(match &self.sock {
            Sock::Unix(s) => Box::new(s.try_clone()?),
            Sock::Tcp(s) => Box::new(s.try_clone()?),
        }))
    }

    /// A fresh tag.
    pub fn tag(&mut self) -> u16 {
        self.next_tag = if self.next_tag >= 0xfffe { 1 } else { self.next_tag + 1 };
        self.next_tag
    }

    /// A request and its reply; an Rerror becomes an error.
    pub fn rpc(&mut self, content: Tdata) -> Result<Rdata> {
        let tag = if matches!(content, Tdata::Version { .. }) { 0xffff } else { self.tag() };
        self.send(tag, content)?;
        let mut reply = self.recv()?;
        // An Rflush left over from a flush that raced its request's reply.
        while reply.tag != tag && matches!(reply.content, Rdata::Flush {}) {
            reply = self.recv()?;
        }
        if reply.tag != tag {
            bail!("reply tag {} to request tag {tag}", reply.tag);
        }
        match reply.content {
            Rdata::Error { ename } => Err(anyhow!(ename)),
            other => Ok(other),
        }
    }

    /// A fresh fid number.
    pub fn new_fid(&mut self) -> u32 {
        self.next_fid += 1;
        self.next_fid
    }

    /// Walk from the root to `path` ("s/new", "/s/ID/chat").
    pub fn walk(&mut self, path: &str) -> Result<(u32, Qid)> {
        let names: Vec<String> = path.split('/').filter(|n| !n.is_empty()).map(str::to_owned).collect();
        let fid = self.new_fid();
        let mut from = 0;
        let mut last = Qid::dir(0);
        let mut chunks: Vec<&[String]> = names.chunks(16).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        for chunk in chunks {
            match self.rpc(Tdata::Walk { fid: from, new_fid: fid, wnames: chunk.to_vec() })? {
                Rdata::Walk { wqids } if wqids.len() == chunk.len() => {
                    if let Some(q) = wqids.last() {
                        last = *q;
                    }
                }
                _ => {
                    if from == fid {
                        let _ = self.clunk(fid);
                    }
                    bail!("{path}: no such file");
                }
            }
            from = fid;
        }
        Ok((fid, last))
    }

    /// Open a walked fid; returns the iounit.
    pub fn open(&mut self, fid: u32, mode: u8) -> Result<u32> {
        match self.rpc(Tdata::Open { fid, mode })? {
            Rdata::Open { iounit, .. } => Ok(iounit),
            other => bail!("unexpected reply to open: {other:?}"),
        }
    }

    /// Read at `offset`.
    pub fn read_at(&mut self, fid: u32, offset: u64, count: u32) -> Result<Vec<u8>> {
        let count = count.min(self.msize - 24);
        match self.rpc(Tdata::Read { fid, offset, count })? {
            Rdata::Read { data } => Ok(data.write_9p_bytes().map(|mut b| b.split_off(4)).unwrap_or_default()),
            other => bail!("unexpected reply to read: {other:?}"),
        }
    }

    /// Write at `offset`, in as many Twrites as msize needs; the bytes
    /// taken (fewer when the server takes a Twrite short).
    pub fn write_at(&mut self, fid: u32, offset: u64, data: &[u8]) -> Result<u32> {
        let most = (self.msize - 24) as usize;
        let mut done = 0usize;
        let empty: [&[u8]; 1] = [&[]];
        let chunks: Vec<&[u8]> = if data.is_empty() { empty.to_vec() } else { data.chunks(most.max(1)).collect() };
        for chunk in chunks {
            let at = offset + done as u64;
            let count = match self.rpc(Tdata::Write { fid, offset: at, data: chunk.to_vec().into() })? {
                Rdata::Write { count } => count as usize,
                other => bail!("unexpected reply to write: {other:?}"),
            };
            done += count.min(chunk.len());
            if count < chunk.len() {
                break;
            }
        }
        Ok(u32::try_from(done).unwrap_or(u32::MAX))
    }

    /// Clunk (for a prompt: send it).
    pub fn clunk(&mut self, fid: u32) -> Result<()> {
        self.rpc(Tdata::Clunk { fid }).map(|_| ())
    }

    /// Read a whole file (to end of file).
    pub fn read_file(&mut self, path: &str) -> Result<Vec<u8>> {
        let (fid, _) = self.walk(path)?;
        let result = (|| {
            self.open(fid, mode::READ)?;
            let mut out = Vec::new();
            loop {
                let chunk = self.read_at(fid, out.len() as u64, self.msize - 24)?;
                if chunk.is_empty() {
                    return Ok(out);
                }
                out.extend(chunk);
            }
        })();
        let _ = self.clunk(fid);
        result
    }

    /// Read a whole file as text.
    pub fn read_text(&mut self, path: &str) -> Result<String> {
        String::from_utf8(self.read_file(path)?).map_err(|_| anyhow!("{path}: not UTF-8"))
    }

    /// Open, write `data`, clunk; the clunk's error (a prompt refused) is
    /// returned too.
    pub fn write_file(&mut self, path: &str, data: &[u8]) -> Result<()> {
        let (fid, _) = self.walk(path)?;
        let written = self.open(fid, mode::WRITE).and_then(|_| self.write_at(fid, 0, data));
        let clunked = self.clunk(fid);
        written?;
        clunked
    }

    /// `s/new`: write the spec and read the new id on the same fid.
    pub fn create_session(&mut self, spec: &str) -> Result<String> {
        let (fid, _) = self.walk("s/new")?;
        let result = (|| {
            self.open(fid, mode::RDWR)?;
            self.write_at(fid, 0, spec.as_bytes())?;
            let id = self.read_at(fid, 0, 1024)?;
            Ok(String::from_utf8_lossy(&id).trim().to_owned())
        })();
        let _ = self.clunk(fid);
        result
    }

    /// Stat a path.
    pub fn stat(&mut self, path: &str) -> Result<RawStat> {
        let (fid, _) = self.walk(path)?;
        let result = match self.rpc(Tdata::Stat { fid }) {
            Ok(Rdata::Stat { stat, .. }) => Ok(stat),
            Ok(other) => Err(anyhow!("unexpected reply to stat: {other:?}")),
            Err(e) => Err(e),
        };
        let _ = self.clunk(fid);
        result
    }

    /// The entries of a directory.
    pub fn list(&mut self, path: &str) -> Result<Vec<RawStat>> {
        let bytes = self.read_file(path)?;
        let mut cursor = std::io::Cursor::new(bytes);
        let buf = SharedBuf::default();
        let mut out = Vec::new();
        while (cursor.position() as usize) < cursor.get_ref().len() {
            out.push(RawStat::read_from(u32::MAX, &buf, &mut cursor)?);
        }
        Ok(out)
    }

    /// Remove a path.
    pub fn remove(&mut self, path: &str) -> Result<()> {
        let (fid, _) = self.walk(path)?;
        self.rpc(Tdata::Remove { fid }).map(|_| ())
    }
}
