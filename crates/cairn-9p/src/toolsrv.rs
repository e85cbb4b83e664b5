//! The tool service's tree (`cairn toolsrv`): the tool registry and executor
//! as a 9P file tree of its own, next to (not inside) the session tree.
//!
//! ```text
//! t/<tool>/meta          the tool's ToolSpec as JSON (read-only)
//! jobs/new               write {"tool","arguments","invocation","session","cwd"}; read on the same fid: the job id
//! jobs/<id>/out          the job's output; a read at its end blocks until more comes or the job ends
//! jobs/<id>/status       running, done, failed: REASON, killed
//! jobs/<id>/receipt      the ToolReceipt as JSON once done
//! jobs/<id>/ctl          write `kill`
//! ```
//!
//! Owns: the job directories under the jobs dir (`<id>/request.json`,
//! `status`, `out`, `receipt.json`), each whole-file record written by a
//! temporary file and a rename so a crash leaves the old or the new
//! version, and the 9P loop serving this tree (it reuses the session
//! server's listener, codec helpers and reply path). The exactly-once
//! invariant lives here: a job's id is derived from the caller's session
//! and invocation ids ([`job_id`]), and `jobs/new` for an id whose
//! directory exists answers that id without running anything again.
//!
//! Must not: build tools or decide policy (the embedding binary supplies
//! the tools, their sandbox, environment and limits through [`ToolHost`]),
//! ask a person anything (the service has no one to ask: a sandbox bypass
//! is refused and a staged Destructive effect is discarded by the host),
//! or panic on any input.

use std::collections::HashMap;
use std::io::{BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, anyhow, bail};
use cairn_core::CancelToken;
use cairn_core::tool::{ToolReceipt, ToolRequest, ToolSpec};
use ninep::fs::{FileType, Qid};
use ninep::sansio::protocol::{NineP, RawStat, Rdata, SharedBuf, Tdata, Tmessage};
use ninep::sync::SyncNineP;
use serde::{Deserialize, Serialize};

use crate::live::lock;
use crate::server::{IOHDRSZ, Input, Limits, Listener, MAXWELEM, Out, data_bytes, dir_chunk, send};

/// What the service needs from the binary embedding it: the tools, run
/// exactly as the binary runs them in-process.
pub trait ToolHost: Send + Sync + 'static {
    /// Every tool's spec, loaded now (a broken tool file is reported by the
    /// host and left out, never an error of the whole list).
    fn specs(&self) -> Vec<ToolSpec>;
    /// Run `request` in `cwd` with the host's sandbox, environment and
    /// limits; `output` receives chunks as they come. `Err` is the reason
    /// the job failed.
    fn run(
        &self,
        request: &ToolRequest,
        cwd: &Path,
        cancel: &CancelToken,
        output: &mut dyn FnMut(&[u8]),
    ) -> std::result::Result<ToolReceipt, String>;
}

/// What `jobs/new` accepts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    /// The tool's name (a directory of `t/`).
    pub tool: String,
    /// Its arguments (a JSON object).
    #[serde(default)]
    pub arguments: serde_json::Value,
    /// The caller's invocation id: the job id is derived from it (with
    /// `session`), so asking again never runs the job twice.
    #[serde(default)]
    pub invocation: String,
    /// The caller's session id (empty for callers without sessions).
    #[serde(default)]
    pub session: String,
    /// Where the tool runs (an absolute, existing directory).
    pub cwd: String,
}

/// The job id for an invocation of a session: `i` and 16 hex digits of a
/// 64-bit FNV-1a hash over both ids. Deterministic so a caller can record
/// the invocation before the job starts and find the job after a crash.
pub fn job_id(session: &str, invocation: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session.bytes().chain([0]).chain(invocation.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("i{h:016x}")
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && !id.starts_with('.') && id.chars().all(|c| c.is_ascii_alphanumeric())
}

/// Write `data` to `path` by a temporary file, fsync and rename.
fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} into place", tmp.display()))?;
    Ok(())
}

/// The jobs and the tools: the state behind the tree.
pub struct Service {
    host: Arc<dyn ToolHost>,
    dir: PathBuf,
    running: Mutex<HashMap<String, CancelToken>>,
    seq: AtomicU64,
    /// The specs as of the last listing of `t/` (loaded on first use):
    /// walks and `meta` reads do not reload every tool.
    specs: Mutex<Option<Vec<ToolSpec>>>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// The status line of a job whose service died while it ran.
pub const ORPHANED: &str = "failed: the tool service stopped while this job ran (its effect may be partial)";

impl Service {
    /// A service keeping jobs under `dir`. Jobs a previous service left
    /// `running` are marked failed: their process is gone.
    pub fn new(host: Arc<dyn ToolHost>, dir: PathBuf) -> Result<Arc<Self>> {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for entry in std::fs::read_dir(&dir)?.flatten() {
            let status = entry.path().join("status");
            if std::fs::read_to_string(&status).is_ok_and(|s| s.trim() == "running") {
                write_atomic(&status, format!("{ORPHANED}\n").as_bytes())?;
            }
        }
        Ok(Arc::new(Self {
            host,
            dir,
            running: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
            specs: Mutex::new(None),
        }))
    }

    /// Reload the specs (a listing of `t/` does, so new tools appear).
    fn reload_specs(&self) -> Vec<ToolSpec> {
        let specs = self.host.specs();
        *lock(&self.specs) = Some(specs.clone());
        specs
    }

    fn spec(&self, name: &str) -> Option<ToolSpec> {
        let cached = lock(&self.specs).as_ref().map(|s| s.iter().find(|s| s.name == name).cloned());
        match cached {
            Some(Some(spec)) => Some(spec),
            // Unknown to the cache (or no cache yet): it may be new.
            _ => self.reload_specs().into_iter().find(|s| s.name == name),
        }
    }

    fn job_dir(&self, id: &str) -> PathBuf {
        self.dir.join(id)
    }

    fn job_exists(&self, id: &str) -> bool {
        valid_id(id) && self.job_dir(id).join("status").is_file()
    }

    fn status(&self, id: &str) -> String {
        std::fs::read_to_string(self.job_dir(id).join("status")).unwrap_or_default()
    }

    fn is_running(&self, id: &str) -> bool {
        self.status(id).trim() == "running"
    }

    /// Start the job `text` asks for, or answer the id of the one already
    /// started for the same invocation.
    pub fn submit(self: &Arc<Self>, text: &[u8]) -> Result<String> {
        let request: JobRequest = serde_json::from_slice(text).map_err(|e| {
            anyhow!("jobs/new: not a job request ({e}); write {{\"tool\":NAME,\"arguments\":{{…}},\"invocation\":ID,\"cwd\":DIR}}")
        })?;
        let spec = self
            .spec(&request.tool)
            .ok_or_else(|| anyhow!("jobs/new: no tool {:?} here (list t/ for the tools)", request.tool))?;
        let cwd = PathBuf::from(&request.cwd);
        if !cwd.is_absolute() || !cwd.is_dir() {
            bail!("jobs/new: cwd {:?} is not an absolute path of an existing directory", request.cwd);
        }
        let id = if request.invocation.is_empty() {
            let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            format!("j{nanos:x}{}", self.seq.fetch_add(1, Ordering::SeqCst))
        } else {
            job_id(&request.session, &request.invocation)
        };
        let dir = self.job_dir(&id);
        {
            // One creator per id: the directory is the claim.
            let _running = lock(&self.running);
            if dir.join("status").is_file() {
                return Ok(id);
            }
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            write_atomic(&dir.join("request.json"), &serde_json::to_vec(&request)?)?;
            std::fs::File::create(dir.join("out"))?;
            write_atomic(&dir.join("status"), b"running\n")?;
        }
        let cancel = CancelToken::new();
        lock(&self.running).insert(id.clone(), cancel.clone());
        let (service, job) = (Arc::clone(self), id.clone());
        std::thread::Builder::new()
            .name("toolsrv-job".to_owned())
            .spawn(move || service.run_job(&job, &spec, &request, &cancel))
            .context("cannot start the job: no thread available")?;
        Ok(id)
    }

    fn run_job(&self, id: &str, spec: &ToolSpec, request: &JobRequest, cancel: &CancelToken) {
        let dir = self.job_dir(id);
        let mut out = std::fs::OpenOptions::new().append(true).open(dir.join("out")).ok();
        let tool_request = ToolRequest {
            invocation_id: request.invocation.clone(),
            call_id: request.invocation.clone(),
            session_id: request.session.clone(),
            tool: spec.name.clone(),
            arguments: request.arguments.clone(),
        };
        let mut output = |chunk: &[u8]| {
            if let Some(f) = out.as_mut() {
                let _ = f.write_all(chunk);
            }
        };
        let result = self.host.run(&tool_request, Path::new(&request.cwd), cancel, &mut output);
        let status = match result {
            _ if cancel.is_cancelled() => "killed".to_owned(),
            Ok(receipt) => match serde_json::to_vec_pretty(&receipt)
                .map_err(anyhow::Error::from)
                .and_then(|json| write_atomic(&dir.join("receipt.json"), &json))
            {
                Ok(()) => "done".to_owned(),
                Err(e) => format!("failed: cannot keep the receipt: {e:#}"),
            },
            Err(reason) => format!("failed: {}", reason.replace('\n', " ")),
        };
        // Not killable once it has a final status; the receipt is in place
        // before `done` is, so a reader seeing `done` always finds it.
        lock(&self.running).remove(id);
        let _ = write_atomic(&dir.join("status"), format!("{status}\n").as_bytes());
    }

    fn kill(&self, id: &str) -> Result<()> {
        match lock(&self.running).get(id) {
            Some(cancel) => {
                cancel.cancel();
                Ok(())
            }
            None => bail!("job {id} is not running"),
        }
    }

    fn job_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|rd| rd.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
            .unwrap_or_default();
        ids.retain(|id| self.job_exists(id));
        ids.sort();
        ids
    }
}

/// The files of a job directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobFile {
    /// `out`.
    Out,
    /// `status`.
    Status,
    /// `receipt`.
    Receipt,
    /// `ctl`.
    Ctl,
}

impl JobFile {
    const ALL: [JobFile; 4] = [Self::Out, Self::Status, Self::Receipt, Self::Ctl];

    fn name(self) -> &'static str {
        match self {
            Self::Out => "out",
            Self::Status => "status",
            Self::Receipt => "receipt",
            Self::Ctl => "ctl",
        }
    }
}

/// One node of the tool service's tree.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Root,
    Tools,
    Tool(String),
    Meta(String),
    Jobs,
    New,
    Job(String),
    File(String, JobFile),
}

impl Node {
    fn is_dir(&self) -> bool {
        matches!(self, Self::Root | Self::Tools | Self::Tool(_) | Self::Jobs | Self::Job(_))
    }

    fn name(&self) -> String {
        match self {
            Self::Root => "/".to_owned(),
            Self::Tools => "t".to_owned(),
            Self::Jobs => "jobs".to_owned(),
            Self::New => "new".to_owned(),
            Self::Meta(_) => "meta".to_owned(),
            Self::Tool(n) | Self::Job(n) => n.clone(),
            Self::File(_, f) => f.name().to_owned(),
        }
    }

    fn writable(&self) -> bool {
        matches!(self, Self::New | Self::File(_, JobFile::Ctl))
    }

    fn qid_path(&self) -> u64 {
        // FNV-1a of a tag and the names: stable across connections.
        let text = format!("{self:?}");
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    fn qid(&self) -> Qid {
        if self.is_dir() { Qid::dir(self.qid_path()) } else { Qid::file(self.qid_path()) }
    }
}

fn walk(svc: &Service, node: &Node, name: &str) -> Result<Node> {
    Ok(match (node, name) {
        (_, "..") => match node {
            Node::Tool(_) => Node::Tools,
            Node::Job(_) => Node::Jobs,
            _ => Node::Root,
        },
        (Node::Root, "t") => Node::Tools,
        (Node::Root, "jobs") => Node::Jobs,
        (Node::Tools, tool) if svc.spec(tool).is_some() => Node::Tool(tool.to_owned()),
        (Node::Tool(tool), "meta") => Node::Meta(tool.clone()),
        (Node::Jobs, "new") => Node::New,
        (Node::Jobs, id) if svc.job_exists(id) => Node::Job(id.to_owned()),
        (Node::Job(id), file) => match JobFile::ALL.iter().find(|f| f.name() == file) {
            Some(f) => Node::File(id.clone(), *f),
            None => bail!("{file}: no such file in a job (out, status, receipt, ctl)"),
        },
        _ => bail!("{name}: no such file"),
    })
}

fn list(svc: &Service, node: &Node) -> Vec<Node> {
    match node {
        Node::Root => vec![Node::Tools, Node::Jobs],
        Node::Tools => svc.reload_specs().into_iter().map(|s| Node::Tool(s.name)).collect(),
        Node::Tool(t) => vec![Node::Meta(t.clone())],
        Node::Jobs => std::iter::once(Node::New).chain(svc.job_ids().into_iter().map(Node::Job)).collect(),
        Node::Job(id) => JobFile::ALL.iter().map(|f| Node::File(id.clone(), *f)).collect(),
        _ => Vec::new(),
    }
}

/// A whole-file read of `node` (not `out`, which streams).
fn contents(svc: &Service, node: &Node) -> Result<Vec<u8>> {
    match node {
        Node::Meta(tool) => {
            let spec = svc.spec(tool).ok_or_else(|| anyhow!("{tool}: the tool is gone"))?;
            let mut json = serde_json::to_vec_pretty(&spec)?;
            json.push(b'\n');
            Ok(json)
        }
        Node::File(id, JobFile::Status) => Ok(svc.status(id).into_bytes()),
        Node::File(id, JobFile::Receipt) => match std::fs::read(svc.job_dir(id).join("receipt.json")) {
            Ok(bytes) => Ok(bytes),
            Err(_) => bail!("job {id} has no receipt (status: {})", svc.status(id).trim()),
        },
        Node::File(id, JobFile::Out) => Ok(std::fs::read(svc.job_dir(id).join("out")).unwrap_or_default()),
        _ => Ok(Vec::new()),
    }
}

fn size(svc: &Service, node: &Node) -> u64 {
    match node {
        Node::File(id, JobFile::Out) => std::fs::metadata(svc.job_dir(id).join("out")).map_or(0, |m| m.len()),
        Node::Meta(_) | Node::File(_, JobFile::Status | JobFile::Receipt) => {
            contents(svc, node).map_or(0, |c| c.len() as u64)
        }
        _ => 0,
    }
}

/// A read of `out` at `offset`: data, or None while the job runs and
/// nothing more is there (the reader waits).
fn read_out(svc: &Service, id: &str, offset: u64, count: usize) -> Option<Vec<u8>> {
    // Status first: output written before `done` is all there when read after.
    let running = svc.is_running(id);
    let data = contents(svc, &Node::File(id.to_owned(), JobFile::Out)).unwrap_or_default();
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
    let end = start.saturating_add(count).min(data.len());
    if start == end && running { None } else { Some(data[start..end].to_vec()) }
}

/// The tool service's 9P server: listeners over one [`Service`].
#[derive(Debug)]
pub struct ToolServer {
    svc: Arc<Service>,
    limits: Limits,
    connections: Arc<AtomicUsize>,
}

impl ToolServer {
    /// A server of `svc`'s tree.
    pub fn new(svc: Arc<Service>, limits: Limits) -> Self {
        Self { svc, limits, connections: Arc::new(AtomicUsize::new(0)) }
    }

    /// Accept connections on `listener` on a thread of its own.
    pub fn spawn(&self, listener: Listener) -> Result<std::thread::JoinHandle<()>> {
        let (svc, limits, connections) = (Arc::clone(&self.svc), self.limits, Arc::clone(&self.connections));
        let thread = std::thread::Builder::new().name("toolsrv-accept".to_owned());
        Ok(thread.spawn(move || match listener {
            Listener::Unix(l, _path) => {
                for stream in l.incoming().flatten() {
                    let _ = stream.set_write_timeout(Some(limits.write_timeout));
                    let Ok(reader) = stream.try_clone() else { continue };
                    start(&svc, limits, &connections, reader, stream);
                }
            }
            Listener::Tcp(l) => {
                for stream in l.incoming().flatten() {
                    let _ = stream.set_nodelay(true);
                    let _ = stream.set_write_timeout(Some(limits.write_timeout));
                    let Ok(reader) = stream.try_clone() else { continue };
                    start(&svc, limits, &connections, reader, stream);
                }
            }
        })?)
    }
}

fn start<R: Input, W: std::io::Write + Send + 'static>(
    svc: &Arc<Service>,
    limits: Limits,
    connections: &Arc<AtomicUsize>,
    reader: R,
    writer: W,
) {
    if connections.fetch_add(1, Ordering::SeqCst) >= limits.max_connections {
        connections.fetch_sub(1, Ordering::SeqCst);
        reader.close();
        return;
    }
    let (svc, count) = (Arc::clone(svc), Arc::clone(connections));
    let spawned = std::thread::Builder::new().name("toolsrv-conn".to_owned()).spawn(move || {
        Conn::new(svc, limits, Box::new(writer)).run(reader);
        count.fetch_sub(1, Ordering::SeqCst);
    });
    if spawned.is_err() {
        connections.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Fid {
    node: Node,
    open: Option<(bool, bool)>,
    /// `jobs/new`: the request written so far, then the id it started.
    written: Vec<u8>,
    job: Option<String>,
    dir: Option<Vec<u8>>,
}

impl Fid {
    fn at(node: Node) -> Self {
        Self { node, open: None, written: Vec::new(), job: None, dir: None }
    }
}

type Blocked = Arc<Mutex<HashMap<u16, Arc<AtomicBool>>>>;

struct Conn {
    svc: Arc<Service>,
    limits: Limits,
    out: Out,
    alive: Arc<AtomicBool>,
    msize: u32,
    fids: HashMap<u32, Fid>,
    blocked: Blocked,
}

impl Conn {
    fn new(svc: Arc<Service>, limits: Limits, out: Box<dyn std::io::Write + Send>) -> Self {
        Self {
            svc,
            limits,
            out: Arc::new(Mutex::new(out)),
            alive: Arc::new(AtomicBool::new(true)),
            msize: limits.max_msize,
            fids: HashMap::new(),
            blocked: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn run<R: Input>(mut self, reader: R) {
        let mut input = BufReader::new(reader);
        let buf = SharedBuf::default();
        while let Ok(message) = Tmessage::read_from(self.msize, &buf, &mut input) {
            let tag = message.tag;
            let reply = match self.handle(message) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => Rdata::error(format!("{e:#}")),
            };
            if !send(&self.out, self.msize, tag, reply) {
                break;
            }
        }
        self.alive.store(false, Ordering::SeqCst);
        input.get_ref().close();
        for (_, mut fid) in self.fids.drain() {
            let _ = close(&self.svc, &mut fid);
        }
    }

    fn fid(&mut self, fid: u32) -> Result<&mut Fid> {
        self.fids.get_mut(&fid).ok_or_else(|| anyhow!("unknown fid {fid}"))
    }

    fn room(&self, new_fid: u32) -> Result<()> {
        if self.fids.contains_key(&new_fid) {
            bail!("fid {new_fid} is in use");
        }
        if self.fids.len() >= self.limits.max_fids {
            bail!("too many fids on this connection (limit {}): clunk some", self.limits.max_fids);
        }
        Ok(())
    }

    fn handle(&mut self, message: Tmessage) -> Result<Option<Rdata>> {
        let tag = message.tag;
        let svc = Arc::clone(&self.svc);
        Ok(Some(match message.content {
            Tdata::Version { msize, version } => {
                self.fids.clear();
                if !version.starts_with("9P2000") {
                    return Ok(Some(Rdata::version(msize.min(self.limits.max_msize), "unknown")));
                }
                self.msize = msize.clamp(256, self.limits.max_msize);
                Rdata::version(self.msize, "9P2000")
            }
            Tdata::Auth { .. } => bail!("no authentication is required (none is possible: keep the socket private)"),
            Tdata::Attach { fid, .. } => {
                self.room(fid)?;
                self.fids.insert(fid, Fid::at(Node::Root));
                Rdata::attach(Node::Root.qid())
            }
            Tdata::Flush { old_tag } => {
                let mut blocked = lock(&self.blocked);
                if let Some(flag) = blocked.remove(&old_tag) {
                    flag.store(true, Ordering::SeqCst);
                }
                send(&self.out, self.msize, tag, Rdata::flush());
                return Ok(None);
            }
            Tdata::Walk { fid, new_fid, wnames } => {
                if wnames.len() > MAXWELEM {
                    bail!("a walk may carry at most {MAXWELEM} names");
                }
                if new_fid != fid {
                    self.room(new_fid)?;
                }
                let f = self.fid(fid)?;
                if f.open.is_some() {
                    bail!("fid {fid} is open; walk from an unopened fid");
                }
                let mut node = f.node.clone();
                let mut qids = Vec::new();
                for name in &wnames {
                    match walk(&svc, &node, name) {
                        Ok(next) => {
                            qids.push(next.qid());
                            node = next;
                        }
                        Err(e) if qids.is_empty() => return Err(e),
                        Err(_) => break,
                    }
                }
                if qids.len() == wnames.len() {
                    self.fids.insert(new_fid, Fid::at(node));
                }
                Rdata::walk(qids)
            }
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
                if write && !f.node.writable() {
                    bail!("{}: is read-only", f.node.name());
                }
                f.open = Some((read, write));
                Rdata::open(f.node.qid(), iounit)
            }
            Tdata::Create { name, .. } => bail!("{name}: files cannot be created here (write jobs/new to start a job)"),
            Tdata::Read { fid, offset, count } => return self.read(tag, fid, offset, count),
            Tdata::Write { fid, data, .. } => {
                let f = self.fid(fid)?;
                if !matches!(f.open, Some((_, true))) {
                    bail!("fid {fid} is not open for writing");
                }
                let bytes = data_bytes(&data);
                match &f.node {
                    Node::New => {
                        if f.job.is_some() {
                            bail!("jobs/new: this fid already started a job; open jobs/new again");
                        }
                        if f.written.len() + bytes.len() > 4 << 20 {
                            bail!("jobs/new: a request may hold at most 4 MiB");
                        }
                        f.written.extend_from_slice(&bytes);
                    }
                    Node::File(id, JobFile::Ctl) => match String::from_utf8_lossy(&bytes).trim() {
                        "kill" => svc.kill(id)?,
                        other => bail!("ctl: unknown command {other:?} (write kill)"),
                    },
                    node => bail!("{}: is read-only", node.name()),
                }
                Rdata::write(u32::try_from(bytes.len()).unwrap_or(u32::MAX))
            }
            Tdata::Clunk { fid } => {
                let mut f = self.fids.remove(&fid).ok_or_else(|| anyhow!("unknown fid {fid}"))?;
                close(&svc, &mut f)?;
                Rdata::clunk()
            }
            Tdata::Remove { fid } => {
                self.fids.remove(&fid);
                bail!("nothing can be removed here (jobs are kept under the service's jobs directory)")
            }
            Tdata::Stat { fid } => {
                let node = self.fid(fid)?.node.clone();
                let stat = raw_stat(&svc, &node);
                Rdata::stat(stat.size + 2, stat)
            }
            Tdata::Wstat { fid, stat, .. } => {
                let node = self.fid(fid)?.node.clone();
                let untouched = stat.mode == u32::MAX && stat.mtime == u32::MAX && stat.name.is_empty();
                if !node.writable() || !untouched {
                    bail!("{}: its name, mode and times cannot be changed", node.name());
                }
                Rdata::wstat()
            }
        }))
    }

    fn read(&mut self, tag: u16, fid: u32, offset: u64, count: u32) -> Result<Option<Rdata>> {
        let count = count.min(self.msize - IOHDRSZ) as usize;
        let svc = Arc::clone(&self.svc);
        let f = self.fid(fid)?;
        if !matches!(f.open, Some((true, _))) {
            bail!("fid {fid} is not open for reading");
        }
        if f.node.is_dir() {
            if offset == 0 || f.dir.is_none() {
                let mut encoded = Vec::new();
                for child in list(&svc, &f.node) {
                    encoded.extend(raw_stat(&svc, &child).write_9p_bytes().map_err(|e| anyhow!("{e}"))?);
                }
                f.dir = Some(encoded);
            }
            return Ok(Some(Rdata::read(dir_chunk(f.dir.as_deref().unwrap_or_default(), offset, count))));
        }
        let whole = match &f.node {
            Node::New => {
                if f.job.is_none() {
                    if f.written.is_empty() {
                        bail!("jobs/new: write a job request first, then read its id on the same fid");
                    }
                    f.job = Some(svc.submit(&f.written)?);
                }
                format!("{}\n", f.job.as_deref().unwrap_or_default()).into_bytes()
            }
            Node::File(id, JobFile::Out) => {
                let id = id.clone();
                return match read_out(&svc, &id, offset, count) {
                    Some(data) => Ok(Some(Rdata::read(data))),
                    None => {
                        self.block(tag, id, offset, count)?;
                        Ok(None)
                    }
                };
            }
            node => contents(&svc, node)?,
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(whole.len());
        let end = start.saturating_add(count).min(whole.len());
        Ok(Some(Rdata::read(whole[start..end].to_vec())))
    }

    /// Wait for more output or the job's end on a thread of its own; reply
    /// then, never if Tflush cancels it first.
    fn block(&mut self, tag: u16, id: String, offset: u64, count: usize) -> Result<()> {
        let flag = Arc::new(AtomicBool::new(false));
        {
            let mut blocked = lock(&self.blocked);
            if blocked.len() >= self.limits.max_blocked {
                bail!("too many blocked reads on this connection (limit {})", self.limits.max_blocked);
            }
            blocked.insert(tag, Arc::clone(&flag));
        }
        let (svc, out, blocked, alive, msize) = (
            Arc::clone(&self.svc),
            Arc::clone(&self.out),
            Arc::clone(&self.blocked),
            Arc::clone(&self.alive),
            self.msize,
        );
        let spawned = std::thread::Builder::new().name("toolsrv-read".to_owned()).spawn(move || {
            loop {
                if flag.load(Ordering::SeqCst) || !alive.load(Ordering::SeqCst) {
                    return;
                }
                if let Some(data) = read_out(&svc, &id, offset, count) {
                    if lock(&blocked).remove(&tag).is_some() {
                        send(&out, msize, tag, Rdata::read(data));
                    }
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        if spawned.is_err() {
            lock(&self.blocked).remove(&tag);
            bail!("cannot wait for output: no thread available");
        }
        Ok(())
    }
}

/// Closing `jobs/new` after a write without a read still starts the job.
fn close(svc: &Arc<Service>, fid: &mut Fid) -> Result<()> {
    if fid.node == Node::New && fid.job.is_none() && !fid.written.is_empty() {
        fid.job = Some(svc.submit(&fid.written)?);
    }
    Ok(())
}

fn raw_stat(svc: &Service, node: &Node) -> RawStat {
    let now =
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
    let qid = node.qid();
    let dir_bit = if qid.ty == FileType::DIRECTORY { 0x8000_0000 } else { 0 };
    let mode = if node.is_dir() {
        0o555
    } else if node == &Node::New {
        0o666
    } else if matches!(node, Node::File(_, JobFile::Ctl)) {
        0o222
    } else {
        0o444
    };
    let (name, uid, gid, muid) = (node.name(), "cairn".to_owned(), "cairn".to_owned(), "cairn".to_owned());
    let strings = [&name, &uid, &gid, &muid].iter().map(|s| 2 + s.len()).sum::<usize>();
    RawStat {
        size: u16::try_from(2 + 4 + 13 + 4 + 4 + 4 + 8 + strings).unwrap_or(u16::MAX),
        ty: 0,
        dev: 0,
        qid,
        mode: dir_bit | mode,
        atime: now,
        mtime: now,
        length: if node.is_dir() { 0 } else { size(svc, node) },
        name,
        uid,
        gid,
        muid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_deterministic_valid_and_distinct() {
        let a = job_id("s1", "inv-1");
        assert_eq!(a, job_id("s1", "inv-1"));
        assert!(valid_id(&a));
        assert_ne!(a, job_id("s2", "inv-1"));
        assert_ne!(a, job_id("s1", "inv-2"));
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(job_id("ab", "c"), job_id("a", "bc"));
        for bad in ["", ".x", "a/b", "..", "a b"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }
}
