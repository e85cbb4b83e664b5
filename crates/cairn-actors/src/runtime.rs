//! Running one actor instance with wasmtime: compiling `.wasm`/`.wat` (WASI
//! p1 modules are turned into p2 command components in-process), wiring
//! stdin/stdout/stderr to OS pipes and files, preopening the actor's
//! directories behind the commit-on-close layer (`commitfs`: this module
//! tells it how the instance ended, and the actor's disk quota), and
//! enforcing limits (epoch ticks every 10 ms, the store's resource limiter,
//! optional fuel). Owns no routing: lines go to a
//! caller-given sink.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use anyhow::{Context, anyhow};
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, ResourceLimiter, Store, UpdateDeadline};
use wasmtime_wasi::filesystem::WasiFilesystemCtxView;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use crate::commitfs::{self, CommitFs, Commits, Quota};

/// How long a message may wait for room in an actor's stdin pipe before it
/// is dropped (and the drop logged).
pub const STDIN_WAIT: Duration = Duration::from_secs(30);

/// Per-actor resource limits. Each is enforced per instance (a live actor
/// or one of its upgrade candidates), in the instance's store (memory,
/// tables, instances, fuel) or by the host threads around it (stdout,
/// stderr, disk). docs/actors.md ("Limits of an actor") lists them
/// with their defaults and where they are enforced.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// All linear memories of an instance together, in bytes (a component
    /// has several: the guest's, the WASI adapter's, and any a module
    /// declares). Default 64 MiB.
    pub memory_bytes: usize,
    /// All table elements of an instance together. Default 100,000.
    pub table_elements: usize,
    /// Core instances per instance (a C actor adapted from WASI p1 uses
    /// about five). Default 32.
    pub instances: usize,
    /// Linear memories per instance. Default 8.
    pub memories: usize,
    /// Tables per instance. Default 32.
    pub tables: usize,
    /// Bytes of `/data` plus `/public`, checked when a write commits.
    /// Default 256 MiB.
    pub disk_bytes: u64,
    /// Files and directories (and anything else) in `/data` plus
    /// `/public` together, temp files of writes not yet committed
    /// included: a call that would make one more fails with `quota`
    /// (`EDQUOT`). Default 10,000 (what a `source` copy may hold).
    pub disk_entries: usize,
    /// Fuel per instance (`None` = unlimited; the epoch still applies).
    pub fuel: Option<u64>,
    /// Descriptors an instance may hold open at once (files and
    /// directories it opened; its preopens and stdio not counted): each is
    /// a host file descriptor, and the process's limit is shared by every
    /// actor, the broker's files and journals included. Default 64.
    pub descriptors: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 64 << 20,
            table_elements: 100_000,
            instances: 32,
            memories: 8,
            tables: 32,
            disk_bytes: 256 << 20,
            disk_entries: 10_000,
            fuel: None,
            descriptors: 64,
        }
    }
}

/// A stdout line longer than this (the message limit, see
/// [`crate::message::MESSAGE_LIMIT`]) ends the instance as a crash: the
/// line is never buffered whole.
pub const STDOUT_LINE_LIMIT: usize = crate::message::MESSAGE_LIMIT;

/// `stderr.log` is rotated (to `stderr.log.1`, replacing the previous
/// one) once it holds this many bytes, so an actor keeps at most twice
/// this on disk for its log.
pub const LOG_LIMIT: u64 = 1 << 20;

/// A note the host adds to `stderr.log` is cut to this many bytes (a
/// dropped stdout line can be as long as the message limit).
const NOTE_LIMIT: usize = 4096;

/// The size the host asks for an actor's stdin pipe (Linux's minimum, one
/// page): what a host crash can lose between the mailbox and the guest is
/// what sits in this pipe, unread.
pub const STDIN_PIPE_BYTES: usize = 4096;

/// Appends a host note (`[tag] note`, cut to 4 KiB) to an actor's log,
/// rotating it past [`LOG_LIMIT`]; the file is private to the world's
/// owner (mode 0600).
pub fn append_note(path: &Path, tag: &str, note: &str) {
    let mut cut = note.len().min(NOTE_LIMIT);
    while !note.is_char_boundary(cut) {
        cut -= 1;
    }
    let more = if cut < note.len() { format!(" … ({} bytes more)", note.len() - cut) } else { String::new() };
    let _ = append_log_bytes(path, format!("[{tag}] {}{more}\n", &note[..cut]).as_bytes());
}

/// Appends `bytes` to the log at `path` (created 0600), first rotating it
/// to `<path>.1` if it already holds [`LOG_LIMIT`] bytes.
pub(crate) fn append_log_bytes(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if std::fs::metadata(path).is_ok_and(|m| m.len() >= LOG_LIMIT) {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        std::fs::rename(path, old)?;
    }
    let mut f = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
    // Logs written before this rule (or by hand) were world-readable.
    if f.metadata().is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
        let _ = f.set_permissions(std::fs::Permissions::from_mode(0o600));
    }
    f.write_all(bytes)
}

/// The shared wasmtime engine plus its 10 ms epoch ticker.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<ActorState>>,
    stop_ticker: Arc<AtomicBool>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Runtime")
    }
}

fn w<T>(r: wasmtime::Result<T>) -> anyhow::Result<T> {
    r.map_err(|e| anyhow!("{e:?}"))
}

impl Runtime {
    /// Builds the engine (epoch interruption on, fuel if `fuel`) and starts
    /// the ticker thread. Files under `/data` and `/public` commit on close.
    pub fn new(fuel: bool) -> anyhow::Result<Runtime> {
        Self::build(fuel, true)
    }

    /// Like [`Runtime::new`] but without the commit-on-close layer: `/data`
    /// and `/public` are plain wasmtime-wasi preopens (writes immediate, a
    /// trap keeps them). Only for measuring what the layer costs (the
    /// benchmark); the broker never uses it.
    pub fn new_plain_files(fuel: bool) -> anyhow::Result<Runtime> {
        Self::build(fuel, false)
    }

    fn build(fuel: bool, commit_on_close: bool) -> anyhow::Result<Runtime> {
        let mut cfg = Config::new();
        cfg.epoch_interruption(true);
        cfg.consume_fuel(fuel);
        cfg.wasm_component_model(true);
        let engine = w(Engine::new(&cfg))?;
        let mut linker = Linker::new(&engine);
        w(wasmtime_wasi::p2::add_to_linker_sync(&mut linker))?;
        if commit_on_close {
            w(commitfs::add_to_linker(&mut linker, commit_fs))?;
        }
        let stop_ticker = Arc::new(AtomicBool::new(false));
        let (e2, stop2) = (engine.clone(), stop_ticker.clone());
        thread::Builder::new()
            .name("actor-epoch".into())
            .spawn(move || {
                while !stop2.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(10));
                    e2.increment_epoch();
                }
            })
            .context("starting the epoch thread")?;
        Ok(Runtime { engine, linker: Arc::new(linker), stop_ticker })
    }

    /// Stops the epoch ticker (instances still running can then no longer be
    /// interrupted; call after they have ended).
    pub fn shutdown(&self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
    }

    /// Compiles actor bytes: a component, a WASI p1 module (adapted to a
    /// command component), or WAT text of either.
    pub fn compile(&self, bytes: &[u8]) -> anyhow::Result<Component> {
        let bin = if bytes.starts_with(b"\0asm") {
            bytes.to_vec()
        } else {
            wat::parse_bytes(bytes).map_err(|e| anyhow!("not a .wasm file and not valid WAT: {e}"))?.into_owned()
        };
        // Byte 4..8: 1,0,0,0 = core module; otherwise a component layer.
        let component = if bin.get(4..8) == Some(&[1, 0, 0, 0]) {
            wit_component::ComponentEncoder::default()
                .module(&bin)
                .map_err(|e| anyhow!("WASI p1 module cannot be adapted: {e:#}"))?
                .adapter(
                    "wasi_snapshot_preview1",
                    wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
                )
                .map_err(|e| anyhow!("adapter: {e:#}"))?
                .validate(true)
                .encode()
                .map_err(|e| anyhow!("WASI p1 module cannot be adapted: {e:#}"))?
        } else {
            bin
        };
        w(Component::new(&self.engine, &component))
    }
}

/// The store's resource limiter: unlike wasmtime's `StoreLimits`, whose
/// memory and table caps apply to each memory or table alone (so a module
/// with twenty memories could take twenty times the cap), this one counts
/// every memory and every table of the instance together.
#[derive(Debug)]
struct ActorLimiter {
    limits: Limits,
    memory_used: usize,
    table_used: usize,
}

impl ResourceLimiter for ActorLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        let more = desired.saturating_sub(current);
        let total = self.memory_used.saturating_add(more);
        if total > self.limits.memory_bytes {
            // Refused: `memory.grow` returns -1, and a memory too large at
            // instantiation fails the instantiation (a crash).
            return Ok(false);
        }
        self.memory_used = total;
        Ok(true)
    }

    fn table_growing(&mut self, current: usize, desired: usize, _max: Option<usize>) -> wasmtime::Result<bool> {
        let more = desired.saturating_sub(current);
        let total = self.table_used.saturating_add(more);
        if total > self.limits.table_elements {
            return Ok(false);
        }
        self.table_used = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.limits.instances
    }

    fn tables(&self) -> usize {
        self.limits.tables
    }

    fn memories(&self) -> usize {
        self.limits.memories
    }
}

/// Host state of one instance.
pub struct ActorState {
    ctx: WasiCtx,
    table: ResourceTable,
    limits: ActorLimiter,
    commits: Commits,
}

/// The commit-on-close layer's view of an instance's state.
fn commit_fs(s: &mut ActorState) -> CommitFs<'_> {
    CommitFs { fs: WasiFilesystemCtxView { ctx: s.ctx.filesystem(), table: &mut s.table }, commits: &mut s.commits }
}

impl std::fmt::Debug for ActorState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ActorState")
    }
}

impl WasiView for ActorState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.ctx, table: &mut self.table }
    }
}

/// How an instance ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// Returned from `run` or `exit(0)`.
    Normal,
    /// Exited with a non-zero status.
    Code(i32),
    /// Trapped (including out of memory/fuel, instantiation failures).
    Trap(String),
    /// Interrupted by the host (kill flag seen at an epoch).
    Killed,
}

impl Exit {
    /// Whether this counts as a crash for backoff and rollback.
    pub fn is_crash(&self) -> bool {
        !matches!(self, Exit::Normal | Exit::Killed)
    }
}

/// Directories preopened for an instance.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// Host dir seen as `/data` (read-write).
    pub data: PathBuf,
    /// Host dir seen as `/public` (read-write).
    pub public: PathBuf,
    /// Host dir seen as `/actor` (read-only).
    pub actor_root: PathBuf,
}

/// A running instance: its stdin writer and kill switch.
#[derive(Debug)]
pub struct Instance {
    /// Write end of the guest's stdin; dropping it gives the guest EOF.
    pub stdin: Arc<std::sync::Mutex<Option<std::io::PipeWriter>>>,
    /// Set to make the guest trap at its next epoch check, and at its next
    /// entry into or return from a host call.
    pub kill: Arc<AtomicBool>,
    /// Whether the guest is inside a host call (a WASI call it made, such
    /// as a long `sleep`), where the epoch cannot reach it: a kill then
    /// takes effect only when the call returns. Kept by the store's call
    /// hook; false before the guest first enters WASM and after it left.
    /// Read after setting `kill` (both `SeqCst`): if this is false then, the
    /// guest can no longer enter a host call without seeing the kill.
    pub in_host: Arc<AtomicBool>,
}

impl Instance {
    /// Writes one line to the guest's stdin. The pipe is non-blocking: while
    /// it is full the write waits, and if not one byte of the line found
    /// room within `wait` the line is dropped (`ErrorKind::TimedOut`). A line
    /// once started is finished (a half line would corrupt the framing); a
    /// dead guest ends the wait with `BrokenPipe`.
    pub fn write_line(&self, line: &str, wait: Duration) -> std::io::Result<()> {
        let mut g = self.stdin.lock().map_err(|_| std::io::Error::other("stdin lock poisoned"))?;
        let Some(p) = g.as_mut() else {
            return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdin closed"));
        };
        write_whole_line(p, line, wait)
    }

    /// [`Instance::write_line`], if `take` (called while stdin is held, so
    /// no other line can come between it and the write) says the line is
    /// to be written; `None` (nothing written) if it says no or stdin is
    /// already closed. `take` is called only once the pipe has room (the
    /// guest read the line before) or `wait` has passed (the line is then
    /// not written: `TimedOut`): a line taken from a journaled mailbox
    /// goes into the pipe at once, never waits outside both, so a host
    /// crash loses at most the line in the pipe and the one the guest was
    /// handling (taken first and then waited for, a third was lost).
    pub fn write_line_if(
        &self,
        line: &str,
        wait: Duration,
        take: impl FnOnce() -> bool,
    ) -> Option<std::io::Result<()>> {
        let mut g = match self.stdin.lock() {
            Ok(g) => g,
            Err(_) => return Some(Err(std::io::Error::other("stdin lock poisoned"))),
        };
        let p = g.as_mut()?;
        let room = wait_writable(p, wait);
        if !take() {
            return None;
        }
        if !room {
            return Some(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("stdin not drained within {} s", wait.as_secs_f64()),
            )));
        }
        Some(write_into_room(p, line))
    }

    /// Writes `line` at once, without waiting for anything, if nobody else
    /// is writing to stdin now (the lock is free), the pipe is empty (the
    /// guest read every line before: [`writable`]), the line and its
    /// newline fit in one atomic pipe write (at most [`STDIN_PIPE_BYTES`],
    /// Linux's `PIPE_BUF`: all of it goes in or nothing does) and `may`
    /// (called with stdin held, so no other line can come between it and
    /// the write) says yes. Whether it was written; if not, nothing was.
    /// The broker's direct way to an idle actor (issue 48.9): the same
    /// one-line-in-the-pipe rule as [`Instance::write_line_if`], without
    /// a thread between the broker and the pipe.
    pub fn write_now(&self, line: &str, may: impl FnOnce() -> bool) -> bool {
        if line.len() + 1 > STDIN_PIPE_BYTES {
            return false;
        }
        let Ok(mut g) = self.stdin.try_lock() else { return false };
        let Some(p) = g.as_mut() else { return false };
        if !may() || !writable(p, Duration::ZERO) {
            return false;
        }
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        match p.write(&bytes) {
            Ok(n) if n == bytes.len() => true,
            // Not on Linux (a write of at most PIPE_BUF bytes is atomic),
            // but a line once started is finished: the framing needs it.
            // (A guest gone meanwhile never read it: the caller queues it
            // for the next instance, as the writer puts such a line back.)
            Ok(n) if n > 0 => write_bytes_into_room(p, &bytes[n..]).is_ok(),
            // A full pipe after all, or a guest gone (`EPIPE`): the caller
            // queues the line (the writer's way tells or keeps it).
            _ => false,
        }
    }

    /// Closes stdin (EOF for the guest).
    pub fn close_stdin(&self) {
        if let Ok(mut g) = self.stdin.lock() {
            g.take();
        }
    }
}

/// Waits up to `wait` until the pipe `p` is writable; whether it is. With
/// the one-page pipe of [`STDIN_PIPE_BYTES`] (one buffer slot), Linux
/// says a pipe is writable only once its slot is free: when the guest
/// has read everything written before. A hang-up or error counts as
/// writable (the write then says what happened).
fn writable(p: &impl std::os::fd::AsRawFd, wait: Duration) -> bool {
    let ms = libc::c_int::try_from(wait.as_millis()).unwrap_or(libc::c_int::MAX);
    let mut f = libc::pollfd { fd: p.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: poll on one pollfd that lives for the call; the descriptor
    // is owned by the caller.
    let r = unsafe { libc::poll(&mut f, 1, ms) };
    r > 0 || (r < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted)
}

/// Polling slice of the waits on a full stdin pipe.
const SLICE: Duration = Duration::from_millis(100);

/// Waits up to `wait` (in slices, so a signal or a late hang-up is seen)
/// until [`writable`]; whether it became so.
fn wait_writable(p: &impl std::os::fd::AsRawFd, wait: Duration) -> bool {
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if writable(p, left.min(SLICE)) {
            return true;
        }
        if left.is_zero() {
            return false;
        }
    }
}

/// Writes `line` and a newline to the non-blocking pipe `p` (see
/// [`Instance::write_line`] for the waiting rule). The line waits until
/// the guest has read the one before (see [`writable`]): the pipe holds
/// at most one line, so a host crash loses at most that line and the one
/// the guest was handling, whatever their size (with the kernel's usual
/// sixteen slots, or a 4 KiB pipe filled with lines, it lost every line
/// in the pipe: 79 of 300 small messages).
fn write_whole_line(p: &mut std::io::PipeWriter, line: &str, wait: Duration) -> std::io::Result<()> {
    if !wait_writable(p, wait) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("stdin not drained within {} s", wait.as_secs_f64()),
        ));
    }
    write_into_room(p, line)
}

/// Writes `line` and a newline to `p`, which has room (the guest read
/// everything before): a line once started is finished, waiting for the
/// guest to read it (a half line would corrupt the framing).
fn write_into_room(p: &mut std::io::PipeWriter, line: &str) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    write_bytes_into_room(p, &bytes)
}

/// Writes `bytes` (the rest of a line, newline included) to `p`, waiting
/// for the guest to read where the pipe is full.
fn write_bytes_into_room(p: &mut std::io::PipeWriter, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::ErrorKind;
    let mut off = 0;
    while off < bytes.len() {
        match p.write(&bytes[off..]) {
            Ok(0) => return Err(std::io::Error::new(ErrorKind::WriteZero, "stdin accepted nothing")),
            Ok(n) => off += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                writable(p, SLICE);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Starts an instance on its own thread. `on_line` gets every stdout line
/// (without the newline); `on_exit` runs once, after the last line.
pub fn start(
    rt: &Runtime,
    component: &Component,
    dirs: &Dirs,
    stderr_log: &Path,
    limits: Limits,
    mut on_line: impl FnMut(String) + Send + 'static,
    on_exit: impl FnOnce(Exit) + Send + 'static,
) -> anyhow::Result<Instance> {
    let (stdin_r, stdin_w) = std::io::pipe().context("stdin pipe")?;
    set_nonblocking(&stdin_w).context("stdin pipe")?;
    // Small, so little sits between the journaled mailbox and the guest
    // (lost at a host crash); failing to shrink it only keeps the default.
    set_pipe_size(&stdin_w, STDIN_PIPE_BYTES);
    let (stdout_r, stdout_w) = std::io::pipe().context("stdout pipe")?;
    // stderr goes through a pipe and a thread, not straight to the file:
    // the log is capped and rotated, whatever the guest writes.
    let (stderr_r, stderr_w) = std::io::pipe().context("stderr pipe")?;
    append_log_bytes(stderr_log, b"").with_context(|| format!("opening {}", stderr_log.display()))?;
    // Temp files a killed host left behind (no instance uses these
    // directories now: one instance per actor, candidates get copies).
    for d in [&dirs.data, &dirs.public] {
        commitfs::sweep(d).with_context(|| format!("removing leftover temp files under {}", d.display()))?;
    }
    let mut b = WasiCtx::builder();
    // Before the preopens (they copy it): file calls run on the instance's
    // own thread, which may block.
    b.allow_blocking_current_thread(true);
    b.stdin(wasmtime_wasi::cli::InputFile::new(std::fs::File::from(std::os::fd::OwnedFd::from(stdin_r))));
    b.stdout(wasmtime_wasi::cli::OutputFile::new(std::fs::File::from(std::os::fd::OwnedFd::from(stdout_w))));
    b.stderr(wasmtime_wasi::cli::OutputFile::new(std::fs::File::from(std::os::fd::OwnedFd::from(stderr_w))));
    w(b.preopened_dir(&dirs.data, "/data", FsPerms::ReadWrite))?;
    w(b.preopened_dir(&dirs.public, "/public", FsPerms::ReadWrite))?;
    w(b.preopened_dir(&dirs.actor_root, "/actor", FsPerms::ReadOnly))?;
    let ctx = b.build();
    let log_quota = stderr_log.to_owned();
    let state = ActorState {
        ctx,
        table: ResourceTable::new(),
        limits: ActorLimiter { limits, memory_used: 0, table_used: 0 },
        commits: Commits::with_quota(Quota::new(
            &[&dirs.data, &dirs.public],
            limits.disk_bytes,
            limits.disk_entries,
            Some(Box::new(move |note: &str| append_note(&log_quota, "host", note))),
        ))
        .with_descriptors(limits.descriptors),
    };
    let mut store = Store::new(&rt.engine, state);
    store.limiter(|s| &mut s.limits);
    if let Some(f) = limits.fuel {
        w(store.set_fuel(f))?;
    }
    let kill = Arc::new(AtomicBool::new(false));
    let in_host = Arc::new(AtomicBool::new(false));
    // Why the host ended the instance, when it was not the broker's stop
    // (a kill with a reason is a crash).
    let crashed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let (k2, crashed_disk, log_disk) = (kill.clone(), crashed.clone(), stderr_log.to_owned());
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |ctx| {
        if k2.load(Ordering::Relaxed) {
            return Err(wasmtime::format_err!("killed by the broker"));
        }
        // Writes not yet committed are on the disk already: checked at
        // every tick the guest runs WASM (a write returns to WASM between
        // its chunks), so they never pass the quota by more than one write.
        if let Some(why) = ctx.data().commits.pending_over_quota() {
            append_note(&log_disk, "host", &format!("{why}: instance killed, its pending writes discarded"));
            *crashed_disk.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
            k2.store(true, Ordering::Relaxed);
            return Err(wasmtime::format_err!("{why}"));
        }
        Ok(UpdateDeadline::Continue(1))
    });
    // Host calls: `in_host` says where the guest is (see `Instance`), and
    // once killed it neither enters another host call nor returns into
    // WASM from one. `depth` counts calls into WASM: leaving the outermost
    // one is the host's own code again, not a guest's host call.
    let (k_hook, in_host_hook) = (kill.clone(), in_host.clone());
    let mut depth = 0u32;
    store.call_hook(move |_, hook| {
        use wasmtime::CallHook;
        match hook {
            CallHook::CallingWasm => {
                depth += 1;
                in_host_hook.store(false, Ordering::SeqCst);
            }
            CallHook::ReturningFromWasm => {
                depth = depth.saturating_sub(1);
                in_host_hook.store(depth > 0, Ordering::SeqCst);
            }
            CallHook::CallingHost => {
                in_host_hook.store(true, Ordering::SeqCst);
                if k_hook.load(Ordering::SeqCst) {
                    return Err(wasmtime::format_err!("killed by the broker"));
                }
            }
            CallHook::ReturningFromHost => {
                in_host_hook.store(false, Ordering::SeqCst);
                if k_hook.load(Ordering::SeqCst) {
                    return Err(wasmtime::format_err!("killed by the broker"));
                }
            }
        }
        Ok(())
    });
    let (k_out, crashed_out, log_out) = (kill.clone(), crashed.clone(), stderr_log.to_owned());
    let reader = thread::Builder::new()
        .name("actor-stdout".into())
        .spawn(move || {
            read_lines(stdout_r, STDOUT_LINE_LIMIT, &mut on_line, |seen| {
                let why =
                    format!("stdout line longer than {STDOUT_LINE_LIMIT} bytes (the message limit): instance killed");
                append_note(&log_out, "host", &format!("{why}; its first {seen} bytes were dropped"));
                *crashed_out.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
                k_out.store(true, Ordering::Relaxed);
            });
        })
        .context("starting the stdout thread")?;
    let log_err = stderr_log.to_owned();
    thread::Builder::new()
        .name("actor-stderr".into())
        .spawn(move || {
            use std::io::Read;
            let mut r = stderr_r;
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match r.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let _ = append_log_bytes(&log_err, &buf[..n]);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        })
        .context("starting the stderr thread")?;
    let (linker, component, k3) = (rt.linker.clone(), component.clone(), kill.clone());
    let log = stderr_log.to_owned();
    thread::Builder::new()
        .name("actor-run".into())
        .spawn(move || {
            let mut exit = run(&mut store, &linker, &component, &k3);
            if let Some(why) = crashed.lock().unwrap_or_else(|p| p.into_inner()).take()
                && matches!(exit, Exit::Killed | Exit::Trap(_))
            {
                exit = Exit::Trap(why);
            }
            // A process exit (any status) closes, so commits, its files; a
            // trap or a kill discards what was not closed.
            let commit = matches!(exit, Exit::Normal | Exit::Code(_));
            let failed = commitfs::finish(&mut commit_fs(store.data_mut()), commit);
            for e in failed {
                append_note(&log, "host", &e);
            }
            // Dropping the store closes the guest's stdout: the reader ends
            // after the last line, so `on_exit` comes after every line.
            drop(store);
            let _ = reader.join();
            on_exit(exit);
        })
        .context("starting the instance thread")?;
    Ok(Instance { stdin: Arc::new(std::sync::Mutex::new(Some(stdin_w))), kill, in_host })
}

/// Reads `\n`-separated lines from `r` into `on_line` (without the
/// newline), never holding more than `limit` bytes of one line: at the
/// first longer line `too_long` is told how many bytes it had seen, and
/// everything after is read and dropped (so a guest writing more is not
/// blocked in its write and meets its kill at the next epoch).
fn read_lines(r: impl std::io::Read, limit: usize, on_line: &mut impl FnMut(String), too_long: impl FnOnce(usize)) {
    let mut r = BufReader::with_capacity(64 << 10, r);
    let mut line: Vec<u8> = Vec::new();
    let mut too_long = Some(too_long);
    loop {
        let buf = match r.fill_buf() {
            Ok([]) => break,
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let n = buf.len();
        if too_long.is_none() {
            r.consume(n);
            continue;
        }
        let (chunk, end) = match buf.iter().position(|&c| c == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if line.len() + chunk.len() > limit {
            let seen = line.len() + chunk.len();
            line = Vec::new();
            if let Some(f) = too_long.take() {
                f(seen);
            }
            r.consume(n);
            continue;
        }
        line.extend_from_slice(chunk);
        r.consume(end.unwrap_or(n));
        if end.is_some() {
            on_line(String::from_utf8_lossy(&std::mem::take(&mut line)).into_owned());
        }
    }
}

/// Asks the kernel for a pipe buffer of `bytes` (Linux `F_SETPIPE_SZ`);
/// where that fails the pipe keeps its size.
fn set_pipe_size(fd: &impl std::os::fd::AsRawFd, bytes: usize) {
    let Ok(n) = libc::c_int::try_from(bytes) else { return };
    // SAFETY: fcntl on a descriptor the caller owns; no memory is passed.
    let _ = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, n) };
}

/// Makes the host's write end of a pipe non-blocking (the guest's read end
/// is a separate open file description and stays blocking).
fn set_nonblocking(fd: &impl std::os::fd::AsRawFd) -> std::io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fcntl on a descriptor owned by the caller for this call's
    // duration; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn run(store: &mut Store<ActorState>, linker: &Linker<ActorState>, component: &Component, kill: &AtomicBool) -> Exit {
    let cmd = match wasmtime_wasi::p2::bindings::sync::Command::instantiate(&mut *store, component, linker) {
        Ok(c) => c,
        Err(e) => return Exit::Trap(format!("instantiation failed: {e:?}")),
    };
    match cmd.wasi_cli_run().call_run(&mut *store) {
        Ok(Ok(())) => Exit::Normal,
        Ok(Err(())) => Exit::Code(1),
        Err(e) => {
            if let Some(code) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
                if code.0 == 0 { Exit::Normal } else { Exit::Code(code.0) }
            } else if kill.load(Ordering::Relaxed) {
                Exit::Killed
            } else {
                Exit::Trap(format!("{e:?}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn write_now_writes_only_into_an_empty_pipe_and_only_if_allowed() {
        let (mut r, w) = std::io::pipe().unwrap();
        set_nonblocking(&w).unwrap();
        set_pipe_size(&w, STDIN_PIPE_BYTES);
        let inst =
            Instance { stdin: Arc::new(std::sync::Mutex::new(Some(w))), kill: Arc::default(), in_host: Arc::default() };
        assert!(!inst.write_now("no", || false), "written though refused");
        assert!(inst.write_now("one", || true));
        // The guest has not read it: the next waits (one line in the pipe).
        assert!(!inst.write_now("two", || true), "a second line went into the pipe");
        let mut buf = [0u8; 16];
        let n = r.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"one\n");
        assert!(inst.write_now("two", || true));
        // Longer than one atomic pipe write: never this way.
        assert!(!inst.write_now(&"x".repeat(STDIN_PIPE_BYTES), || true));
        // Held by a writer: not now.
        let _held = inst.stdin.lock().unwrap();
        let n = r.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"two\n");
        assert!(!inst.write_now("three", || true));
    }
}
