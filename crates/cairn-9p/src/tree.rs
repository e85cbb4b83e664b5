//! The file tree: which names exist, what each file shows when read and
//! does when written. Protocol-free (the 9P server and the FUSE mount both
//! speak to it through [`Node`] and these functions).
//!
//! ```text
//! help providers tools
//! s/new s/idx
//! s/<id>/{prompt,enqueue,chat,event,state,usage,ctl,log}
//! s/<id>/approvals/<invocation>
//! b/new b/<job>/{status,result,usage,spec}
//! ```

use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{Result, anyhow, bail};

use crate::batch::{JobFile, valid_job};
use crate::live::{Runtime, new_template, slice, valid_id};

/// The files of a session directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// Write a prompt; the turn starts when the file is closed.
    Prompt,
    /// Write a prompt to run after the running turn (durably queued when
    /// the file is closed); read: the prompts waiting.
    Enqueue,
    /// The transcript (a growing file).
    Chat,
    /// `--json` events (a stream).
    Event,
    /// The phase.
    State,
    /// Token totals.
    Usage,
    /// Commands.
    Ctl,
    /// The raw records (a stream).
    Log,
}

impl FileKind {
    /// Every file of a session directory, in listing order.
    pub const ALL: [FileKind; 8] =
        [Self::Prompt, Self::Enqueue, Self::Chat, Self::Event, Self::State, Self::Usage, Self::Ctl, Self::Log];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Prompt => "prompt",
            Self::Enqueue => "enqueue",
            Self::Chat => "chat",
            Self::Event => "event",
            Self::State => "state",
            Self::Usage => "usage",
            Self::Ctl => "ctl",
            Self::Log => "log",
        }
    }
}

/// One file or directory of the tree.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Node {
    /// `/`.
    Root,
    /// `help`.
    Help,
    /// `providers`.
    Providers,
    /// `tools`.
    Tools,
    /// `s/`.
    Sessions,
    /// `s/new`.
    New,
    /// `s/idx`.
    Idx,
    /// `s/<id>/`.
    Session(String),
    /// `s/<id>/<file>`.
    File(String, FileKind),
    /// `s/<id>/approvals/`.
    Approvals(String),
    /// `s/<id>/approvals/<invocation>`.
    Approval(String, String),
    /// `b/`.
    Batches,
    /// `b/new`.
    BatchNew,
    /// `b/<job>/`.
    Batch(String),
    /// `b/<job>/<file>`.
    JobFile(String, JobFile),
}

/// The `help` file.
pub const HELP: &str = "\
help                  this list
providers             configured providers, one a line
tools                 the tools (as `cairn tools`)
s/new                 read: the template; write key=value pairs (cwd= required); the session is created from the whole spec at the next read (which answers its id) or at close
s/idx                 one line per session, oldest first: id state cwd provider model name
s/ID/prompt           write a prompt; the turn starts when the file is closed (fails with busy while a turn runs)
s/ID/enqueue          write a prompt to run after the running turn (kept durably when closed); read: the prompts waiting
s/ID/chat             the transcript: user:, assistant:, -> tool(args), = result; tail -f follows it
s/ID/event            one JSON event a line (as --json) from the session's start; blocks at the end like a pipe
s/ID/state            idle, thinking, calling: TOOL, awaiting approval: TOOL, interrupted, cancelled, busy elsewhere: PROCESS (another process runs or has the session open); a second line `not started: REASON` when the last prompt could not start (event: startRefused)
s/ID/usage            token totals over every provider attempt
s/ID/ctl              write: stop, resume, compact, rn NAME, model NAME, fork ENTRY [LANE]
s/ID/log              the session file's records, one a line; blocks at the end like `cairn log --follow`
s/ID/approvals/INV    one file per pending approval: read it, write y, n or a (a: allow this Write tool for the session)
rmdir s/ID            archives the session file to $CAIRN_HOME/archive (refused while a turn runs; 9P: remove s/ID); rm -r s/ID too (removing a file inside changes nothing)
b/new                 write a batch spec (key=value lines: cwd= required, provider, model, script, parallel=N, allow; then ---; then the prompt), taken whole: the job is created at the next read (which answers its id) or at close
b/JOB/status          queued, running, done, failed: REASON
b/JOB/result          the answers (parallel=N: one section per session)
b/JOB/usage           token totals over the job's sessions (JOB-0 … JOB-N-1 in s/)
b/JOB/spec            the spec as accepted
rmdir b/JOB           cancels the job durably (running turns are cancelled, never resumed; 9P: remove b/JOB)
";

impl Node {
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        matches!(
            self,
            Self::Root | Self::Sessions | Self::Session(_) | Self::Approvals(_) | Self::Batches | Self::Batch(_)
        )
    }

    /// Its name in its parent ("/" for the root).
    pub fn name(&self) -> String {
        match self {
            Self::Root => "/".to_owned(),
            Self::Help => "help".to_owned(),
            Self::Providers => "providers".to_owned(),
            Self::Tools => "tools".to_owned(),
            Self::Sessions => "s".to_owned(),
            Self::New => "new".to_owned(),
            Self::Idx => "idx".to_owned(),
            Self::Session(id) => id.clone(),
            Self::File(_, kind) => kind.name().to_owned(),
            Self::Approvals(_) => "approvals".to_owned(),
            Self::Approval(_, inv) => inv.clone(),
            Self::Batches => "b".to_owned(),
            Self::BatchNew => "new".to_owned(),
            Self::Batch(job) => job.clone(),
            Self::JobFile(_, file) => file.name().to_owned(),
        }
    }

    /// Its parent (the root is its own parent, as 9P's `..` says).
    pub fn parent(&self) -> Node {
        match self {
            Self::Root | Self::Help | Self::Providers | Self::Tools | Self::Sessions => Self::Root,
            Self::New | Self::Idx | Self::Session(_) => Self::Sessions,
            Self::File(id, _) | Self::Approvals(id) => Self::Session(id.clone()),
            Self::Approval(id, _) => Self::Approvals(id.clone()),
            Self::Batches => Self::Root,
            Self::BatchNew | Self::Batch(_) => Self::Batches,
            Self::JobFile(job, _) => Self::Batch(job.clone()),
        }
    }

    /// Its path from the root.
    pub fn path(&self) -> String {
        match self {
            Self::Root => "/".to_owned(),
            _ => {
                let parent = self.parent().path();
                format!("{}/{}", parent.trim_end_matches('/'), self.name())
            }
        }
    }

    /// A stable unique number (the 9P qid path): 0 for the root, else a
    /// 64-bit FNV-1a hash of the path with the low bit set.
    pub fn qid_path(&self) -> u64 {
        if *self == Self::Root {
            return 0;
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self.path().bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        hash | 1
    }

    /// The session it belongs to.
    pub fn session(&self) -> Option<&str> {
        match self {
            Self::Session(id) | Self::File(id, _) | Self::Approvals(id) | Self::Approval(id, _) => Some(id),
            _ => None,
        }
    }

    /// Whether the file may be opened for reading / writing.
    pub fn access(&self) -> (bool, bool) {
        match self {
            Self::File(_, FileKind::Prompt | FileKind::Ctl) => (false, true),
            Self::New | Self::Approval(..) | Self::BatchNew | Self::File(_, FileKind::Enqueue) => (true, true),
            _ => (true, false),
        }
    }

    /// Permission bits (owner only).
    pub fn mode(&self) -> u32 {
        if self.is_dir() {
            return 0o700;
        }
        match self.access() {
            (true, true) => 0o600,
            (false, true) => 0o200,
            _ => 0o400,
        }
    }
}

/// The child `name` of `dir`, if it exists now.
pub fn walk(rt: &Runtime, dir: &Node, name: &str) -> Result<Node> {
    if name == ".." {
        return Ok(dir.parent());
    }
    let missing = || anyhow!("{}/{name}: no such file", dir.path().trim_end_matches('/'));
    if !dir.is_dir() {
        bail!("{}: not a directory", dir.path());
    }
    let node = match (dir, name) {
        (Node::Root, "help") => Node::Help,
        (Node::Root, "providers") => Node::Providers,
        (Node::Root, "tools") => Node::Tools,
        (Node::Root, "s") => Node::Sessions,
        (Node::Sessions, "new") => Node::New,
        (Node::Sessions, "idx") => Node::Idx,
        (Node::Root, "b") => Node::Batches,
        (Node::Batches, "new") => Node::BatchNew,
        (Node::Batches, job) if valid_job(job) && rt.batch()?.exists(job) => Node::Batch(job.to_owned()),
        (Node::Batch(job), file) => match JobFile::ALL.into_iter().find(|f| f.name() == file) {
            Some(file) => Node::JobFile(job.clone(), file),
            None => return Err(missing()),
        },
        (Node::Sessions, id) if valid_id(id) && rt.live(id).is_some() => Node::Session(id.to_owned()),
        (Node::Session(id), "approvals") => Node::Approvals(id.clone()),
        (Node::Session(id), file) => match FileKind::ALL.into_iter().find(|k| k.name() == file) {
            Some(kind) => Node::File(id.clone(), kind),
            None => return Err(missing()),
        },
        (Node::Approvals(id), inv) if rt.approvals(id).iter().any(|i| i == inv) => {
            Node::Approval(id.clone(), inv.to_owned())
        }
        _ => return Err(missing()),
    };
    Ok(node)
}

/// The entries of a directory.
pub fn list(rt: &Runtime, dir: &Node) -> Result<Vec<Node>> {
    Ok(match dir {
        Node::Root => vec![Node::Help, Node::Providers, Node::Tools, Node::Sessions, Node::Batches],
        Node::Batches => {
            let mut nodes = vec![Node::BatchNew];
            nodes.extend(rt.batch()?.jobs().into_iter().map(Node::Batch));
            nodes
        }
        Node::Batch(job) => JobFile::ALL.into_iter().map(|f| Node::JobFile(job.clone(), f)).collect(),
        Node::Sessions => {
            let mut nodes = vec![Node::New, Node::Idx];
            nodes.extend(rt.idx().into_iter().map(|row| Node::Session(row.id)));
            nodes
        }
        Node::Session(id) => {
            exists(rt, id)?;
            let mut nodes: Vec<Node> = FileKind::ALL.into_iter().map(|k| Node::File(id.clone(), k)).collect();
            nodes.push(Node::Approvals(id.clone()));
            nodes
        }
        Node::Approvals(id) => rt.approvals(id).into_iter().map(|inv| Node::Approval(id.clone(), inv)).collect(),
        other => bail!("{}: not a directory", other.path()),
    })
}

fn exists(rt: &Runtime, id: &str) -> Result<()> {
    rt.live(id).map(|_| ()).ok_or_else(|| anyhow!("no session {id:?} (archived or never created)"))
}

/// Size and modification time as a stat reports them.
pub fn size_and_mtime(rt: &Runtime, node: &Node) -> (u64, SystemTime) {
    let now = SystemTime::now();
    let Some(id) = node.session() else {
        // Small files report their length so clients that read by size
        // (fsspec, FUSE) see the content.
        return (content(rt, node, None).and_then(Result::ok).map_or(0, |c| c.len() as u64), now);
    };
    let Some(live) = rt.live(id) else { return (0, now) };
    let mtime = std::fs::metadata(&live.path).and_then(|m| m.modified()).unwrap_or(now);
    match node {
        Node::File(_, FileKind::Chat) => (rt.chat(id).map_or(0, |c| c.len() as u64), mtime),
        Node::File(_, FileKind::Log) => (std::fs::metadata(&live.path).map_or(0, |m| m.len()), mtime),
        Node::File(_, FileKind::Event) => (rt.events_len(id), mtime),
        _ => (content(rt, node, None).and_then(Result::ok).map_or(0, |c| c.len() as u64), mtime),
    }
}

/// What a fid remembers between its reads and writes.
#[derive(Debug, Default)]
pub struct Handle {
    /// Content fixed at the first read (small files read whole, so one
    /// `cat` sees one consistent snapshot).
    pub snapshot: Option<Arc<Vec<u8>>>,
    /// Bytes written so far (a prompt is sent when the file is closed).
    pub written: Vec<u8>,
    /// The id `s/new` (or `b/new`) created through this handle.
    pub created: Option<String>,
    /// Why what was written through this handle will not be used (a
    /// prompt past [`MAX_PROMPT`]): every later write and the clunk fail
    /// with it, and nothing of it runs.
    pub refused: Option<String>,
}

/// The most a prompt may be.
pub const MAX_PROMPT: usize = 1 << 20;

/// The outcome of a read.
#[derive(Debug)]
pub enum ReadOutcome {
    /// Bytes now (empty: end of file).
    Data(Vec<u8>),
    /// A stream at its end: try again when something changes.
    Block,
}

/// Check that `node` may be opened (read, write).
pub fn open(rt: &Runtime, node: &Node, read: bool, write: bool) -> Result<()> {
    let (can_read, can_write) = node.access();
    if (read && !can_read) || (write && !can_write) {
        bail!("{}: permission denied ({})", node.path(), if can_write { "write-only" } else { "read-only" });
    }
    if let Some(id) = node.session() {
        exists(rt, id)?;
    }
    // What would refuse the prompt at its clunk (busy, here or in another
    // process; no provider, e.g. a missing key) fails the open instead,
    // where the writer sees it.
    if let Node::File(id, FileKind::Prompt) = node
        && write
    {
        rt.check_start(id)?;
    }
    Ok(())
}

/// The whole content of a small file read as one snapshot (`None` for
/// the growing files, streams and write-only files).
fn content(rt: &Runtime, node: &Node, created: Option<&str>) -> Option<Result<String>> {
    Some(match node {
        Node::Help => Ok(HELP.to_owned()),
        Node::Providers => Ok(rt.host().providers().lines()),
        Node::Tools => Ok(rt.host().tools_text()),
        Node::New => Ok(created.map_or_else(new_template, |id| format!("{id}\n"))),
        Node::Idx => Ok(rt
            .idx()
            .into_iter()
            .map(|r| format!("{} {} {} {} {} {}\n", r.id, r.state, r.cwd, r.provider, r.model, r.name))
            .collect()),
        Node::File(id, FileKind::State) => rt.state(id).map(|s| format!("{s}\n")),
        Node::File(id, FileKind::Usage) => rt.usage(id),
        Node::File(id, FileKind::Enqueue) => rt.queued(id),
        Node::BatchNew => Ok(created.map_or_else(|| "cwd=\nparallel=1\n---\n".to_owned(), |job| format!("{job}\n"))),
        Node::JobFile(job, file) => rt.batch().and_then(|b| b.file(job, *file)),
        Node::Approval(id, inv) => {
            rt.approval_text(id, inv).ok_or_else(|| anyhow!("approval {inv} was answered or abandoned"))
        }
        _ => return None,
    })
}

/// Read `count` bytes at `offset`.
pub fn read(rt: &Runtime, node: &Node, handle: &mut Handle, offset: u64, count: usize) -> Result<ReadOutcome> {
    create_from_spec(rt, node, handle)?;
    if (offset == 0 || handle.snapshot.is_none())
        && let Some(made) = content(rt, node, handle.created.as_deref())
    {
        handle.snapshot = Some(Arc::new(made?.into_bytes()));
    }
    if let Some(snapshot) = &handle.snapshot {
        return Ok(ReadOutcome::Data(slice(snapshot, offset, count)));
    }
    match node {
        Node::File(id, FileKind::Chat) => Ok(ReadOutcome::Data(slice(rt.chat(id)?.as_bytes(), offset, count))),
        Node::File(id, FileKind::Event) => {
            let data = rt.events(id, offset, count)?;
            Ok(if data.is_empty() && count > 0 && rt.live(id).is_some() {
                ReadOutcome::Block
            } else {
                ReadOutcome::Data(data)
            })
        }
        Node::File(id, FileKind::Log) => {
            let data = rt.log(id, offset, count)?;
            Ok(if data.is_empty() && count > 0 && rt.live(id).is_some() {
                ReadOutcome::Block
            } else {
                ReadOutcome::Data(data)
            })
        }
        other => bail!("{}: cannot be read", other.path()),
    }
}

/// Write `data` (at `offset`; the tree's files take whole commands).
pub fn write(rt: &Arc<Runtime>, node: &Node, handle: &mut Handle, data: &[u8]) -> Result<usize> {
    let text = || std::str::from_utf8(data).map_err(|_| anyhow!("{}: the text is not UTF-8", node.path()));
    match node {
        // A spec is taken whole: every write adds to it, and the session or
        // job is created at the first read of the handle (which answers its
        // id, or fails with the reason) or at its clunk.
        Node::New | Node::BatchNew => {
            if let Some(id) = &handle.created {
                bail!("this handle already created {id}; open {} again for another", node.path());
            }
            take(handle, data, MAX_PROMPT, "the spec")?;
        }
        Node::File(id, FileKind::Prompt) => {
            if rt.is_running(id) {
                bail!(
                    "busy: a turn is running in session {id}; write the prompt to enqueue to run it next, or stop to ctl"
                );
            }
            take(handle, data, MAX_PROMPT, "the prompt")?;
        }
        Node::File(_, FileKind::Enqueue) => take(handle, data, MAX_PROMPT, "the prompt")?,
        Node::File(id, FileKind::Ctl) => rt.ctl(id, text()?)?,
        Node::Approval(id, inv) => rt.answer(id, inv, text()?)?,
        other => bail!("{}: permission denied (read-only)", other.path()),
    }
    Ok(data.len())
}

/// Add `data` to what `handle` collects, up to `limit` bytes in all.
/// Past it, everything collected is dropped and refused: nothing of
/// `what` will be used (not its first part without the end).
fn take(handle: &mut Handle, data: &[u8], limit: usize, what: &str) -> Result<()> {
    if let Some(why) = &handle.refused {
        bail!("{why}");
    }
    if handle.written.len() + data.len() > limit {
        let why = format!(
            "{what} is longer than {limit} bytes, so none of it will be used; write it again, shorter (a longer \
             text belongs in a file of the session's working directory, named in the prompt)"
        );
        handle.written = Vec::new();
        handle.refused = Some(why.clone());
        bail!("{why}");
    }
    handle.written.extend_from_slice(data);
    Ok(())
}

/// Create the session (`s/new`) or job (`b/new`) whose spec was written
/// through `handle`, once: from the whole spec, never from a part of it.
fn create_from_spec(rt: &Runtime, node: &Node, handle: &mut Handle) -> Result<()> {
    if !matches!(node, Node::New | Node::BatchNew) || handle.created.is_some() {
        return Ok(());
    }
    if let Some(why) = &handle.refused {
        bail!("{why}");
    }
    if handle.written.is_empty() {
        return Ok(());
    }
    let written = std::mem::take(&mut handle.written);
    let text = String::from_utf8(written).map_err(|_| anyhow!("{}: the spec is not UTF-8", node.path()))?;
    let created = match node {
        Node::New => rt.create(&text),
        _ => rt.batch().and_then(|b| b.submit(&text)),
    };
    match created {
        Ok(id) => {
            handle.created = Some(id);
            handle.snapshot = None;
            Ok(())
        }
        Err(e) => {
            // Said again on every later read and at the clunk.
            handle.refused = Some(format!("{e:#}"));
            Err(e)
        }
    }
}

/// The handle is closed: a written spec creates its session or job (if no
/// read did), a written prompt starts its turn, unless it was refused
/// (then the clunk fails with the reason and nothing runs).
pub fn close(rt: &Arc<Runtime>, node: &Node, handle: &mut Handle) -> Result<()> {
    create_from_spec(rt, node, handle)?;
    if let Some(why) = handle.refused.take() {
        bail!("{why}");
    }
    let Node::File(id, kind @ (FileKind::Prompt | FileKind::Enqueue)) = node else { return Ok(()) };
    let written = std::mem::take(&mut handle.written);
    if written.is_empty() {
        return Ok(());
    }
    let text = String::from_utf8(written).map_err(|_| anyhow!("the prompt is not UTF-8"))?;
    if text.trim().is_empty() {
        bail!("the prompt is empty");
    }
    let text = text.trim_end().to_owned();
    if *kind == FileKind::Prompt { rt.start(id, Some(text)) } else { rt.enqueue(id, text).map(|_| ()) }
}

/// Remove `node` (a session directory: archive it; a batch job: cancel
/// it). What lies inside either is a view of it that goes with it:
/// removing it is accepted and changes nothing, so `rm -r s/ID` (which
/// removes each file before the directory) works as `rmdir s/ID` does.
pub fn remove(rt: &Runtime, node: &Node) -> Result<()> {
    match node {
        Node::Session(id) => rt.archive(id),
        Node::Batch(job) => rt.batch()?.cancel(job),
        Node::File(..) | Node::Approvals(..) | Node::Approval(..) | Node::JobFile(..) => Ok(()),
        other => bail!(
            "{}: cannot be removed (only a session directory, which is archived, or a batch job, which is cancelled)",
            other.path()
        ),
    }
}
