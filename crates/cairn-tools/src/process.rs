//! Process lifecycle for every tool that runs a program (`shell` and the
//! external tools): spawn in its own session and process group with no
//! controlling terminal (and pids cgroup, and PID namespace, when
//! available) under the sandbox, feed stdin, capture
//! stdout/stderr up to a cap while streaming them, and kill the whole group
//! on timeout, on cancellation and when the leader exits. Every process it
//! starts dies with cairn, even on SIGKILL: `PR_SET_PDEATHSIG` on the
//! leader, and the PID namespace's teardown for everything under it. No
//! descriptor of cairn's reaches the program; with a mount namespace, a
//! sandboxed call gets a private `/tmp` and every call has the host's
//! hidden paths covered ([`RunSpec::hidden`]).
//!
//! This module owns the invariant "a call's processes do not outlive the
//! call, and its output never costs more memory than the cap". It does not
//! decide policy (which sandbox, which environment): callers pass it in.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use cairn_core::CancelToken;
use cairn_core::tool::ToolError;

use crate::sandbox::{Prepared, SandboxError, SandboxPolicy};

/// What to run and under which limits.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Program and arguments.
    pub argv: Vec<OsString>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Bytes written to stdin (then closed).
    pub stdin: Vec<u8>,
    /// The complete environment (already scrubbed); `TMPDIR` is added.
    pub env: Vec<(String, String)>,
    /// The sandbox; `None` runs unsandboxed (explicit opt-in only).
    pub sandbox: Option<SandboxPolicy>,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// Bytes kept (and streamed) per stream.
    pub output_cap: usize,
    /// Process cap (pids cgroup) for this call.
    pub max_processes: u32,
    /// Run in a PID and mount namespace of its own with a fresh `/proc`
    /// where the kernel allows it (see `sandbox::isolation_status`); the
    /// tools always ask for it. Off only to test the other layers alone.
    pub pid_namespace: bool,
    /// Paths the tool must not see (cairn's home, its control sockets):
    /// in the call's own mount namespace, an empty read-only tmpfs covers
    /// each directory and `/dev/null` each other file. Without a mount
    /// namespace they stay visible (`cairn tools` says so).
    pub hidden: Vec<PathBuf>,
}

/// Output of one stream: the kept prefix and how many bytes there were.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    /// The first `cap` bytes.
    pub kept: Vec<u8>,
    /// Every byte the stream produced.
    pub total: u64,
}

impl Captured {
    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }
}

/// How the call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The leader exited by itself.
    Exited,
    /// The timeout fired and the group was killed.
    TimedOut,
    /// The cancel token fired and the group was killed.
    Cancelled,
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Exit code (128 + signal when killed by a signal).
    pub exit_code: i32,
    /// Standard output.
    pub stdout: Captured,
    /// Standard error.
    pub stderr: Captured,
    /// How it ended.
    pub end: End,
    /// Wall time.
    pub duration: Duration,
    /// The leader's pid (= process group id).
    pub pid: u32,
    /// Every process the call started is gone: it ran in its own PID
    /// namespace and the waiter outside it exited on its own, which it
    /// does only once it reaped the namespace's first process, and the
    /// kernel reaps that one only after killing and reaping every other
    /// process of the namespace (a background child included). A staged
    /// call's layer may then be moved into the tree (`staging::Writers`).
    pub contained: bool,
}

/// Why a program could not be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The sandbox could not be prepared.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The private temp directory could not be made.
    #[error("cannot create the private temp directory: {0}")]
    TempDir(std::io::Error),
    /// Spawning failed (program missing, not executable, sandbox refused).
    #[error("cannot start '{program}': {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The error.
        source: std::io::Error,
    },
    /// Waiting on the child failed.
    #[error("waiting for the tool process failed: {0}")]
    Wait(std::io::Error),
    /// The cancel token fired before the program was started: nothing ran.
    #[error("cancelled before the program was started; nothing was run")]
    Cancelled,
}

impl From<RunError> for ToolError {
    fn from(e: RunError) -> Self {
        match e {
            RunError::Cancelled => ToolError::Cancelled,
            other => ToolError::Other(other.to_string()),
        }
    }
}

enum Msg {
    Chunk(usize, Vec<u8>),
    Done(usize, u64),
}

const CHUNK: usize = 64 * 1024;

fn reader(mut src: impl Read, idx: usize, cap: usize, tx: mpsc::SyncSender<Msg>) {
    let mut buf = vec![0u8; CHUNK];
    let mut total: u64 = 0;
    let mut sent: usize = 0;
    loop {
        match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                if sent < cap {
                    let take = n.min(cap - sent);
                    sent += take;
                    if tx.send(Msg::Chunk(idx, buf[..take].to_vec())).is_err() {
                        // The caller gave up; keep draining so the writer is
                        // not blocked on a full pipe.
                        sent = cap;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = tx.send(Msg::Done(idx, total));
}

/// Kill the process group `pgid` and every process of the call's cgroup,
/// until none is left (bounded).
pub fn kill_group(pgid: u32, prepared: &Prepared) {
    for _ in 0..200 {
        // SAFETY: kill(2) on the negative pgid of a group we created.
        let rc = unsafe { libc::kill(-(pgid as i32), libc::SIGKILL) };
        let group_gone = rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        let cgroup_empty = prepared.cgroup().is_none_or(|c| c.kill_all());
        if group_gone && cgroup_empty {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Run `spec`, streaming output chunks to `output`, until it exits, times
/// out or `cancel` fires.
pub fn run(spec: &RunSpec, cancel: &CancelToken, output: &mut dyn FnMut(&[u8])) -> Result<RunOutcome, RunError> {
    let tmp = crate::calltemp::CallTemp::new(crate::calltemp::CALL).map_err(RunError::TempDir)?;
    let (mut cmd, prepared) = command(spec, tmp.path())?;
    cmd.stdin(Stdio::piped());
    let program = spec.argv.first().cloned().unwrap_or_default();
    let start = Instant::now();
    // A call cancelled before its spawn (the lease may be ending, the host
    // stopped the turn) starts nothing; checked last, right before it.
    if cancel.is_cancelled() {
        return Err(RunError::Cancelled);
    }
    let mut child =
        cmd.spawn().map_err(|source| RunError::Spawn { program: Path::new(&program).display().to_string(), source })?;
    let pid = child.id();

    let (tx, rx) = mpsc::sync_channel::<Msg>(16);
    let mut readers = 0;
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        let cap = spec.output_cap;
        std::thread::spawn(move || reader(out, 0, cap, tx));
        readers += 1;
    }
    if let Some(err) = child.stderr.take() {
        let tx = tx.clone();
        let cap = spec.output_cap;
        std::thread::spawn(move || reader(err, 1, cap, tx));
        readers += 1;
    }
    drop(tx);
    if let Some(mut stdin) = child.stdin.take() {
        let data = spec.stdin.clone();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }

    let mut captured = [Captured::default(), Captured::default()];
    let mut done = 0;
    let mut status = None;
    let mut end = End::Exited;
    let deadline = start + spec.timeout;
    // Observers get whole UTF-8 characters: a sequence cut by a chunk
    // boundary waits for the next chunk of its stream.
    let mut pending: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut handle = |msg: Msg, captured: &mut [Captured; 2], done: &mut usize| match msg {
        Msg::Chunk(i, bytes) => {
            captured[i].kept.extend_from_slice(&bytes);
            let buf = &mut pending[i];
            buf.extend_from_slice(&bytes);
            let ready = utf8_ready(buf);
            if ready > 0 {
                output(&buf[..ready]);
                buf.drain(..ready);
            }
        }
        Msg::Done(i, total) => {
            if !pending[i].is_empty() {
                output(&pending[i]);
                pending[i].clear();
            }
            captured[i].total = total;
            *done += 1;
        }
    };
    // Phase 1: until the leader exits, the deadline passes or cancel fires.
    loop {
        match rx.recv_timeout(Duration::from_millis(10)) {
            Ok(msg) => handle(msg, &mut captured, &mut done),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {}
        }
        if let Some(s) = child.try_wait().map_err(RunError::Wait)? {
            status = Some(s);
            break;
        }
        if cancel.is_cancelled() {
            end = End::Cancelled;
            break;
        }
        if Instant::now() >= deadline {
            end = End::TimedOut;
            break;
        }
    }
    // Phase 2: nothing of the call outlives it.
    kill_group(pid, &prepared);
    let status = match status {
        Some(s) => s,
        None => child.wait().map_err(RunError::Wait)?,
    };
    kill_group(pid, &prepared);
    // Phase 3: drain what the pipes still hold (bounded wait: a process that
    // escaped both the group and the cgroup must not hang the turn).
    let grace = Instant::now() + Duration::from_secs(2);
    while done < readers && Instant::now() < grace {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(msg) => handle(msg, &mut captured, &mut done),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let exit_code = status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    // Killed by a signal (the deadline, cancel, anything else), the waiter
    // did not wait for the namespace: its processes die, but maybe later.
    let contained = prepared.pid_namespace() && end == End::Exited && status.code().is_some();
    let [stdout, stderr] = captured;
    // The hook's raw pointers into `prepared` die with `cmd`, first.
    drop(cmd);
    drop(prepared);
    Ok(RunOutcome { exit_code, stdout, stderr, end, duration: start.elapsed(), pid, contained })
}

/// The command for `spec` under its sandbox (or the explicit lack of one),
/// with `tmp` as its private temp directory, and the prepared rules that
/// must outlive the child's `exec` (and kill its group later).
fn command(spec: &RunSpec, tmp: &Path) -> Result<(Command, Prepared), RunError> {
    // A sandboxed call with a mount namespace gets a private `/tmp`; an
    // unsandboxed one (bypass, opt-in) keeps the host's. Every call with a
    // mount namespace has `hidden` covered (its program stays visible).
    let program = spec.argv.first().map(Path::new);
    let prepared = match &spec.sandbox {
        Some(policy) if policy.bypass => Prepared::unsandboxed(spec.max_processes, spec.pid_namespace)?
            .with_overlay(policy)?
            .with_mounts(&spec.cwd, Some(policy), program, &spec.hidden, false)?,
        Some(policy) => {
            let mut policy = policy.clone();
            policy.tmp_dir = Some(tmp.to_path_buf());
            policy.max_processes = spec.max_processes;
            Prepared::new(&policy, spec.pid_namespace)?.with_mounts(
                &spec.cwd,
                Some(&policy),
                program,
                &spec.hidden,
                true,
            )?
        }
        None => Prepared::unsandboxed(spec.max_processes, spec.pid_namespace)?.with_mounts(
            &spec.cwd,
            None,
            program,
            &spec.hidden,
            false,
        )?,
    };
    let hook = prepared.hook();
    let program = spec.argv.first().cloned().unwrap_or_default();
    let mut cmd = Command::new(&program);
    cmd.args(spec.argv.iter().skip(1))
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env("TMPDIR", tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // No `process_group(0)`: the hook's `setsid` makes the child the leader
    // of a new session and process group (the group `kill_group` kills),
    // which a process already leading a group could not do.
    // SAFETY: the hook only issues raw syscalls (no allocation, no locks),
    // which is what is allowed between fork and exec.
    unsafe {
        cmd.pre_exec(move || hook.apply());
    }
    Ok((cmd, prepared))
}

/// A long-lived sandboxed program that talks over its pipes (an MCP
/// server): the same sandbox, environment rules, process group, pids
/// cgroup and `PR_SET_PDEATHSIG` as a call, without a timeout or output
/// capture. The caller owns the pipes. Dropping it kills the whole group.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that spawned the leader
/// exits: spawn it from a thread that lives as long as the service.
pub struct Service {
    child: std::process::Child,
    prepared: Prepared,
    _tmp: crate::calltemp::CallTemp,
    /// The program's standard input.
    pub stdin: Option<std::process::ChildStdin>,
    /// The program's standard output.
    pub stdout: Option<std::process::ChildStdout>,
    /// The program's standard error.
    pub stderr: Option<std::process::ChildStderr>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("pid", &self.child.id()).finish_non_exhaustive()
    }
}

impl Service {
    /// Start `spec` (its `stdin`, `timeout` and `output_cap` are not used).
    pub fn spawn(spec: &RunSpec) -> Result<Self, RunError> {
        let tmp = crate::calltemp::CallTemp::new(crate::calltemp::SERVICE).map_err(RunError::TempDir)?;
        let (mut cmd, prepared) = command(spec, tmp.path())?;
        cmd.stdin(Stdio::piped());
        let program = spec.argv.first().cloned().unwrap_or_default();
        let mut child = cmd
            .spawn()
            .map_err(|source| RunError::Spawn { program: Path::new(&program).display().to_string(), source })?;
        // The hook's raw pointers into `prepared` die with `cmd`, first.
        drop(cmd);
        Ok(Self {
            stdin: child.stdin.take(),
            stdout: child.stdout.take(),
            stderr: child.stderr.take(),
            child,
            prepared,
            _tmp: tmp,
        })
    }

    /// The leader's pid (= its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the leader has exited (and how), without waiting.
    pub fn exited(&mut self) -> Option<i32> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))),
            Ok(None) => None,
            Err(_) => Some(-1),
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        kill_group(self.child.id(), &self.prepared);
        let _ = self.child.wait();
    }
}

/// How many leading bytes of `buf` can go out without cutting a UTF-8
/// sequence (invalid bytes go out as they are; only an incomplete sequence
/// at the very end is held back).
fn utf8_ready(buf: &[u8]) -> usize {
    match std::str::from_utf8(buf) {
        Ok(_) => buf.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => {
            // Invalid somewhere: hold back at most an incomplete tail (< 4 bytes).
            let tail_start = buf.len().saturating_sub(3);
            (tail_start..buf.len())
                .find(|&i| buf[i] >= 0xC0 && std::str::from_utf8(&buf[i..]).is_err_and(|e| e.error_len().is_none()))
                .unwrap_or(buf.len())
        }
    }
}

/// Text of a capture with a clear truncation marker when bytes were dropped.
pub fn capped_text(c: &Captured) -> String {
    let mut s = String::from_utf8_lossy(&c.kept).into_owned();
    if c.truncated() {
        s.push_str(&truncation_marker(c.kept.len() as u64, c.total));
    }
    s
}

/// The marker appended when output was cut.
pub fn truncation_marker(kept: u64, total: u64) -> String {
    format!("\n[cairn: output truncated: kept the first {kept} of {total} bytes]\n")
}

#[cfg(test)]
mod tests {
    use super::utf8_ready;

    #[test]
    fn utf8_sequences_are_not_cut_for_observers() {
        let e = "é".as_bytes();
        assert_eq!(utf8_ready(b"abc"), 3);
        assert_eq!(utf8_ready(&[b'a', e[0]]), 1);
        assert_eq!(utf8_ready(&[b'a', e[0], e[1]]), 3);
        assert_eq!(utf8_ready(&[0xff, b'a', e[0]]), 2);
        assert_eq!(utf8_ready(&[0xff, b'a']), 2);
    }
}
