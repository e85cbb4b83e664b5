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
//! version, and this tree's names and semantics ([`Service`] implements
//! `server::Tree`; the 9P loop is the session server's). Tool metadata is
//! the host's and loaded lazily: `t/` lists names without parsing, and a
//! tool's metadata is parsed when its `meta` is read or a job asks for it
//! (a broken file is an error of that read or job, naming the file, never
//! of the service). The exactly-once
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
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, Result, anyhow, bail};
use cairn_core::CancelToken;
use cairn_core::tool::{ToolReceipt, ToolRequest, ToolSpec};
use ninep::fs::Qid;
use ninep::sansio::protocol::RawStat;
use serde::{Deserialize, Serialize};

use crate::live::{lock, slice};
use crate::server::{NineServer, Tree, stat_of};
use crate::tree::ReadOutcome;

/// What the service needs from the binary embedding it: the tools, run
/// exactly as the binary runs them in-process.
pub trait ToolHost: Send + Sync + 'static {
    /// The names of the tools, found without parsing any metadata (the
    /// built-ins and the metadata files' names).
    fn names(&self) -> Vec<String>;
    /// The spec of tool `name`, its metadata parsed now if it was not yet
    /// or its file changed since: `Ok(None)` when there is no such tool,
    /// `Err` (naming the file and what is wrong) when its metadata is broken.
    fn spec(&self, name: &str) -> std::result::Result<Option<ToolSpec>, String>;
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
        Ok(Arc::new(Self { host, dir, running: Mutex::new(HashMap::new()), seq: AtomicU64::new(0) }))
    }

    /// Whether `name` is a tool here (by name only: nothing is parsed).
    fn has_tool(&self, name: &str) -> bool {
        self.host.names().iter().any(|n| n == name)
    }

    /// Tool `name`'s spec, parsed by the host if needed; an error names
    /// the broken file.
    fn spec(&self, name: &str) -> Result<ToolSpec> {
        match self.host.spec(name) {
            Ok(Some(spec)) => Ok(spec),
            Ok(None) => bail!("no tool {name:?} here (list t/ for the tools)"),
            Err(reason) => bail!("tool {name:?} cannot be loaded: {reason}"),
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
        let spec = self.spec(&request.tool).map_err(|e| anyhow!("jobs/new: {e:#}"))?;
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
pub enum Node {
    /// `/`.
    Root,
    /// `t/`.
    Tools,
    /// `t/<tool>/`.
    Tool(String),
    /// `t/<tool>/meta`.
    Meta(String),
    /// `jobs/`.
    Jobs,
    /// `jobs/new`.
    New,
    /// `jobs/<id>/`.
    Job(String),
    /// `jobs/<id>/<file>`.
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

    fn path(&self) -> String {
        match self {
            Self::Root => "/".to_owned(),
            Self::Tools => "/t".to_owned(),
            Self::Tool(t) => format!("/t/{t}"),
            Self::Meta(t) => format!("/t/{t}/meta"),
            Self::Jobs => "/jobs".to_owned(),
            Self::New => "/jobs/new".to_owned(),
            Self::Job(id) => format!("/jobs/{id}"),
            Self::File(id, f) => format!("/jobs/{id}/{}", f.name()),
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

/// What a fid of the tool tree remembers.
#[derive(Debug, Default)]
pub struct JobHandle {
    /// `jobs/new`: the request written so far.
    written: Vec<u8>,
    /// `jobs/new`: the id of the job it started.
    job: Option<String>,
    /// A whole file fixed at its read at offset 0 (one `cat` of `meta`
    /// sees one version).
    snapshot: Option<Vec<u8>>,
}

/// A whole-file read of `node` (not `out`, which streams).
fn contents(svc: &Service, node: &Node) -> Result<Vec<u8>> {
    match node {
        Node::Meta(tool) => {
            let spec = svc.spec(tool)?;
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

/// The tool service's 9P server: the session server's loop over a [`Service`].
pub type ToolServer = NineServer<Service>;

impl Tree for Service {
    type Node = Node;
    type Handle = JobHandle;

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
        node.qid()
    }

    fn stat(&self, node: &Node) -> RawStat {
        let now =
            SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX));
        let mode = if node.is_dir() {
            0o555
        } else if node == &Node::New {
            0o666
        } else if matches!(node, Node::File(_, JobFile::Ctl)) {
            0o222
        } else {
            0o444
        };
        let length = if node.is_dir() { 0 } else { size(self, node) };
        stat_of(node.name(), node.qid(), mode, length, now)
    }

    fn walk(self: &Arc<Self>, node: &Node, name: &str) -> Result<Node> {
        Ok(match (node, name) {
            (_, "..") => match node {
                Node::Tool(_) => Node::Tools,
                Node::Meta(t) => Node::Tool(t.clone()),
                Node::Job(_) | Node::New => Node::Jobs,
                Node::File(id, _) => Node::Job(id.clone()),
                _ => Node::Root,
            },
            (Node::Root, "t") => Node::Tools,
            (Node::Root, "jobs") => Node::Jobs,
            (Node::Tools, tool) if self.has_tool(tool) => Node::Tool(tool.to_owned()),
            (Node::Tool(tool), "meta") => Node::Meta(tool.clone()),
            (Node::Jobs, "new") => Node::New,
            (Node::Jobs, id) if self.job_exists(id) => Node::Job(id.to_owned()),
            (Node::Job(id), file) => match JobFile::ALL.iter().find(|f| f.name() == file) {
                Some(f) => Node::File(id.clone(), *f),
                None => bail!("{file}: no such file in a job (out, status, receipt, ctl)"),
            },
            _ => bail!("{name}: no such file"),
        })
    }

    fn list(self: &Arc<Self>, node: &Node) -> Result<Vec<Node>> {
        Ok(match node {
            Node::Root => vec![Node::Tools, Node::Jobs],
            // Names only: listing parses no metadata.
            Node::Tools => self.host.names().into_iter().map(Node::Tool).collect(),
            Node::Tool(t) => vec![Node::Meta(t.clone())],
            Node::Jobs => std::iter::once(Node::New).chain(self.job_ids().into_iter().map(Node::Job)).collect(),
            Node::Job(id) => JobFile::ALL.iter().map(|f| Node::File(id.clone(), *f)).collect(),
            other => bail!("{}: not a directory", other.path()),
        })
    }

    fn open(self: &Arc<Self>, node: &Node, _read: bool, write: bool) -> Result<()> {
        if write && !node.writable() {
            bail!("{}: is read-only", node.path());
        }
        Ok(())
    }

    fn create(self: &Arc<Self>, _dir: &Node, name: &str, _perm: u32, _mode: u8) -> Result<(Node, bool)> {
        bail!("{name}: files cannot be created here (write jobs/new to start a job)")
    }

    fn read(self: &Arc<Self>, node: &Node, handle: &mut JobHandle, offset: u64, count: usize) -> Result<ReadOutcome> {
        let whole = match node {
            Node::New => {
                if handle.job.is_none() {
                    if handle.written.is_empty() {
                        bail!("jobs/new: write a job request first, then read its id on the same fid");
                    }
                    handle.job = Some(self.submit(&handle.written)?);
                }
                format!("{}\n", handle.job.as_deref().unwrap_or_default()).into_bytes()
            }
            Node::File(id, JobFile::Out) => {
                return Ok(match read_out(self, id, offset, count) {
                    Some(data) => ReadOutcome::Data(data),
                    None => ReadOutcome::Block,
                });
            }
            node => {
                if offset == 0 || handle.snapshot.is_none() {
                    handle.snapshot = Some(contents(self, node)?);
                }
                handle.snapshot.clone().unwrap_or_default()
            }
        };
        Ok(ReadOutcome::Data(slice(&whole, offset, count)))
    }

    fn write(self: &Arc<Self>, node: &Node, handle: &mut JobHandle, data: &[u8]) -> Result<usize> {
        match node {
            Node::New => {
                if handle.job.is_some() {
                    bail!("jobs/new: this fid already started a job; open jobs/new again");
                }
                if handle.written.len() + data.len() > 4 << 20 {
                    bail!("jobs/new: a request may hold at most 4 MiB");
                }
                handle.written.extend_from_slice(data);
            }
            Node::File(id, JobFile::Ctl) => match String::from_utf8_lossy(data).trim() {
                "kill" => self.kill(id)?,
                other => bail!("ctl: unknown command {other:?} (write kill)"),
            },
            node => bail!("{}: is read-only", node.path()),
        }
        Ok(data.len())
    }

    /// Closing `jobs/new` after a write without a read still starts the job.
    fn close(self: &Arc<Self>, node: &Node, handle: &mut JobHandle) -> Result<()> {
        if *node == Node::New && handle.job.is_none() && !handle.written.is_empty() {
            handle.job = Some(self.submit(&handle.written)?);
        }
        Ok(())
    }

    fn remove(self: &Arc<Self>, _node: &Node) -> Result<()> {
        bail!("nothing can be removed here (jobs are kept under the service's jobs directory)")
    }

    fn wstat(&self, node: &Node, stat: &RawStat) -> Result<()> {
        let untouched = stat.mode == u32::MAX && stat.mtime == u32::MAX && stat.name.is_empty();
        if !node.writable() || !untouched {
            bail!("{}: its name, mode and times cannot be changed", node.path());
        }
        Ok(())
    }

    fn wait(&self, seen: u64) -> u64 {
        // Jobs write their output to files; look again shortly.
        std::thread::sleep(Duration::from_millis(20));
        seen
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
