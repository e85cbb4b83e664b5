//! The broker: one thread owning the registry, every actor's lifecycle
//! (start, graceful stop, crash restart with backoff, upgrade swap,
//! rollback, remove) and message routing. Actors talk to it only through
//! events; it never runs WASM itself (see `runtime`) and never judges a
//! candidate itself (see `transcript`).
//!
//! This module owns the broker's state and its event loop: routing,
//! delivery, the lifecycle of instances (start, stop, crash, restart,
//! swap, rollback, archive) and the stdin writers. The embedding API
//! lives in `world`, the handling of each request type in `requests`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use wasmtime::component::Component;

use crate::layout::{self, Desired, Layout, Registry, UpgradeWatch};
use crate::mailbox::Mailbox;
use crate::message::{self, AGENT, BROKER, HTTP, Inbound, Outbound};
use crate::runtime::{self, Dirs, Exit, Instance, Limits, Runtime};

mod probation;
mod requests;
mod world;

pub use probation::{FEED_LINES, LIVE_CHECKS, OLD_ANSWERS};

pub use world::{World, init};

/// Message numbers reserved (saved) at a time; see `Broker::new_id`.
/// Each reservation saves the registry (two fsyncs, on the broker
/// thread): with 1,024 a busy world stalled its routing every few hundred
/// messages (issue 48.9). A run that ends without saving skips at most
/// this many numbers, which only makes ids sparser.
const MSG_ID_BLOCK: u64 = 1 << 20;
/// Grace period between `shutdown` + EOF and the kill.
pub const KILL_AFTER: Duration = Duration::from_secs(5);
/// Crashes within this window after an upgrade count towards a crash loop.
pub const CRASH_WINDOW: Duration = Duration::from_secs(30);
/// Crashes in the window that trigger an automatic rollback.
pub const CRASH_LOOP: usize = 3;
/// Uptime after which the backoff counter resets.
pub const BACKOFF_RESET: Duration = Duration::from_secs(60);
/// How long after its kill an instance that was running WASM (so the
/// epoch or its next host call ends it within a tick) and has still not
/// ended is given up: the broker treats it as ended and lets its thread
/// finish alone. One inside a host call at its kill (where the epoch cannot
/// reach it: a long `sleep`) is given up at once, at the kill.
pub const ABANDON_AFTER: Duration = Duration::from_millis(500);
/// Abandoned instances (still in a host call after their kill) one
/// spawner's lineage keeps at once (the default of
/// [`WorldBudget::abandoned_per_spawner`]): each holds its memory until
/// its host call returns, so past this no new instance of that lineage
/// starts (the start fails, and is retried with the crash backoff) until
/// one of them ends. Counted per lineage, not per world: one guest
/// stopping its sleeping children must not stop every start in the world.
pub const MAX_ABANDONED: usize = 4;
/// The largest `.wasm` (or `.wat`) file a spawn or upgrade accepts: C
/// actors are well under 1 MiB, and compiling costs far more memory and
/// time than the file's size (a 12 MB `.wat` of small functions took
/// 800 MB and over a minute on a loaded 2-core machine).
pub const WASM_LIMIT: u64 = 8 << 20;
/// Time a compile may take (a spawn's, an upgrade's, a start's), the
/// default of [`WorldConfig::compile_budget`]: past it the spawn or
/// upgrade is refused, or the start fails (a crash), and the late result is
/// dropped. A module under [`WASM_LIMIT`] compiles in about a minute at
/// worst on a loaded 2-core machine.
pub const COMPILE_BUDGET: Duration = Duration::from_secs(60);
/// Compilations running at once (spawns, upgrades and starts together,
/// each counted until its thread ends, past the budget too: cranelift
/// cannot be interrupted); more spawns and upgrades are refused until one
/// is done, a start waits.
pub const COMPILES_AT_ONCE: usize = 2;
/// The largest `source` directory a spawn or upgrade copies: bytes and
/// entries (files and directories).
pub const SOURCE_LIMIT: (u64, usize) = (16 << 20, 10_000);
/// Versions an actor keeps besides the one it runs, for rollback (the
/// default of [`WorldConfig::versions_kept`]). Each version directory
/// holds a module (at most [`WASM_LIMIT`]), a `source` copy (at most
/// [`SOURCE_LIMIT`]) and a snapshot of `/data` and `/public` (at most
/// the disk quota): without a bound, an actor that upgrades itself again
/// and again grows the world's disk by that much per upgrade.
pub const VERSIONS_KEPT: u32 = 3;

/// One of the [`COMPILES_AT_ONCE`] compile slots, held by a compile's
/// thread until that thread ends, however it ends: past the budget (its
/// thread runs on: cranelift cannot be interrupted) and on a panic inside
/// the compiler (the slot would else be lost for the rest of the run, and
/// two such panics would refuse every later spawn and upgrade, and hold
/// every start).
#[derive(Debug)]
struct CompileSlot(Arc<std::sync::atomic::AtomicUsize>);

impl CompileSlot {
    fn take(count: &Arc<std::sync::atomic::AtomicUsize>) -> CompileSlot {
        count.fetch_add(1, Ordering::SeqCst);
        CompileSlot(count.clone())
    }
}

impl Drop for CompileSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Restart delay after the `n`th consecutive crash (0-based):
/// 0.5 s × 2ⁿ, at most 30 s.
pub fn backoff(n: u32) -> Duration {
    let ms = 500u64.saturating_mul(1u64 << n.min(16));
    Duration::from_millis(ms.min(30_000))
}

/// What the whole world may hold (issue 48): a spawn past any of these is
/// refused with a message naming the budget. Memory, disk and descriptors
/// are counted as the limits each actor was given (its reservation, see
/// [`Broker::limits_of`]), not as what it uses now, so a refusal never
/// depends on timing: an actor that lowers its child's limits fits more
/// children.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorldBudget {
    /// Actors in the registry (running or stopped) plus spawns compiling.
    pub actors: usize,
    /// Actors descending from one actor (its children, theirs, …).
    pub descendants: usize,
    /// The actors' memory limits together, plus those of abandoned
    /// instances (they keep their memory until their host call returns).
    pub memory_bytes: u64,
    /// The actors' disk quotas together (`/data` + `/public`).
    pub disk_bytes: u64,
    /// The actors' descriptor caps together (each instance's own cap is
    /// [`Limits::descriptors`]); keep it under the process's open-file limit.
    pub descriptors: usize,
    /// Abandoned instances one spawner's lineage (an actor the console or
    /// the agent spawned, and everything it spawned) may have at once.
    pub abandoned_per_spawner: usize,
}

impl Default for WorldBudget {
    fn default() -> Self {
        WorldBudget {
            actors: 64,
            descendants: 16,
            memory_bytes: 4 << 30,
            disk_bytes: 16 << 30,
            descriptors: 64 * 64,
            abandoned_per_spawner: MAX_ABANDONED,
        }
    }
}

/// World settings.
#[derive(Debug, Clone, Copy)]
pub struct WorldConfig {
    /// Per-instance limits (an actor's own may be lower, never higher).
    pub limits: Limits,
    /// What the whole world may hold ([`WorldBudget`]).
    pub budget: WorldBudget,
    /// How long a message may wait for room in an actor's stdin before it
    /// is dropped and its sender told ([`runtime::STDIN_WAIT`] by default).
    pub stdin_wait: Duration,
    /// Time any compile may take ([`COMPILE_BUDGET`] by default).
    pub compile_budget: Duration,
    /// Versions an actor keeps besides the running one
    /// ([`VERSIONS_KEPT`] by default; at least 1, the version a crash
    /// loop rolls back to); older ones are deleted when an upgrade
    /// commits (see [`versions_to_keep`]).
    pub versions_kept: u32,
    /// Answers of an upgraded version checked live before its old version
    /// is let go ([`LIVE_CHECKS`] by default; 0: none): each is held until
    /// it matches the old version's answer to the same messages (run in
    /// shadow) or an `expect` of the new version's transcripts, and the
    /// first that does not rolls the upgrade back (issue 48.7). Only
    /// upgrades gated by transcripts are checked.
    pub live_checks: usize,
}

impl Default for WorldConfig {
    fn default() -> Self {
        WorldConfig {
            limits: Limits::default(),
            budget: WorldBudget::default(),
            stdin_wait: runtime::STDIN_WAIT,
            compile_budget: COMPILE_BUDGET,
            versions_kept: VERSIONS_KEPT,
            live_checks: LIVE_CHECKS,
        }
    }
}

/// Which of the `installed` versions (ascending) an actor keeps: the one
/// it runs (`current`), the one its crash-loop watch would roll back to
/// (`prev`, the persisted rollback marker: never deleted while it
/// stands), and the newest others, so that at most `kept` (at least 1)
/// besides the running one remain.
pub fn versions_to_keep(installed: &[u32], current: u32, prev: Option<u32>, kept: u32) -> BTreeSet<u32> {
    let others = usize::try_from(kept.max(1)).unwrap_or(usize::MAX);
    let mut keep = BTreeSet::from([current]);
    keep.extend(prev);
    for v in installed.iter().rev() {
        if keep.len() > others {
            break;
        }
        keep.insert(*v);
    }
    keep
}

/// `d` in seconds, for messages (`60 s`, `0.05 s`).
fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// Reads a module, refusing one larger than [`WASM_LIMIT`] before reading
/// it (compiling an 80 MB `.wat` takes seconds and gigabytes).
fn read_wasm(p: &Path) -> anyhow::Result<Vec<u8>> {
    let len = std::fs::metadata(p).with_context(|| format!("reading {}", p.display()))?.len();
    if len > WASM_LIMIT {
        anyhow::bail!("{} is {len} bytes; a module may have at most {WASM_LIMIT} bytes", p.display());
    }
    std::fs::read(p).with_context(|| format!("reading {}", p.display()))
}

enum Event {
    /// A stdout line of an actor, holding credit of its gate until routed
    /// (or dropped).
    Out {
        id: String,
        generation: u64,
        line: String,
        _credit: crate::queue::Ticket,
    },
    /// A stdout line of an upgrade's shadow (the old version during the
    /// live check, `probation`), or its end (`None`); never routed.
    Shadow {
        id: String,
        token: u64,
        line: Option<String>,
    },
    /// A message taken out of `to`'s mailbox that never reached it
    /// (`line` as queued): its sender is told why.
    Undelivered {
        to: String,
        line: String,
        reason: String,
    },
    Exited {
        id: String,
        generation: u64,
        exit: Exit,
    },
    Native {
        from: String,
        msg: Outbound,
    },
    Tested(Box<Tested>),
    /// A compile started by `start_compile` ended (at `ended`): the
    /// module as read and what it compiled to.
    Compiled {
        token: u64,
        result: Result<Component, String>,
        bytes: Vec<u8>,
        ended: Instant,
    },
    /// An instance did not end at its kill: `in_host` if it was inside a
    /// host call then (given up at once), else 0.5 s later.
    Abandon {
        id: String,
        generation: u64,
        in_host: bool,
    },
    Quit(Sender<()>),
}

/// A spawn waiting for its compilation (off the broker thread).
struct Spawning {
    id: String,
    from: String,
    req_id: String,
    wasm: PathBuf,
    source: Option<PathBuf>,
    built_by: Option<String>,
    http: bool,
    limits: layout::ActorLimits,
}

/// What a compile is for: whoever waits for it when it ends, or when it
/// runs past the budget.
enum Purpose {
    Spawn(Box<Spawning>),
    /// Compiled, the module goes through the upgrade's gate.
    Upgrade(Box<Upgrade>),
    /// A start of a version not compiled in this run.
    Load {
        id: String,
        version: u32,
    },
}

/// Where a compile's module comes from.
enum ModuleBytes {
    /// Read already (a spawn's or an upgrade's: the version stores them).
    Read(Vec<u8>),
    /// The module stored in a version directory, read (under
    /// [`WASM_LIMIT`]) on the compile's thread.
    Stored(PathBuf),
}

/// A compile running on a thread of its own.
struct Compile {
    purpose: Purpose,
    /// The module's file, for messages.
    wasm: PathBuf,
    /// Past it the compile's purpose is refused and its result dropped.
    deadline: Instant,
}

struct Tested {
    plan: Upgrade,
    component: Component,
    verdict: Result<usize, String>,
}

#[derive(Clone)]
struct Upgrade {
    id: String,
    requester: String,
    req_id: String,
    wasm: PathBuf,
    /// The module as read (and compiled): what the version stores.
    bytes: Vec<u8>,
    source: Option<PathBuf>,
    built_by: Option<String>,
    new_version: u32,
    tests: usize,
    /// Its key in [`Broker::candidates`].
    candidate: u64,
}

enum AfterStop {
    Swap(Box<Upgrade>, Component),
    Rollback { to: u32, requester: String, req_id: Option<String>, reason: String },
    Stop { requester: String, req_id: String },
    Remove { requester: String, req_id: String },
}

struct Live {
    generation: u64,
    inst: Arc<Instance>,
    started: Instant,
    last_delivered: Arc<Mutex<Option<String>>>,
    writer_done: Arc<AtomicBool>,
    /// Whether the writer holds a message outside the mailbox (the parked
    /// one it starts with): until it is written, nothing may pass it by
    /// [`Broker::write_now`].
    writer_holds: Arc<AtomicBool>,
    stopping: bool,
}

struct ActorRt {
    live: Option<Live>,
    mailbox: Arc<Mailbox>,
    crashes: Vec<Instant>,
    backoff_n: u32,
    restart_at: Option<Instant>,
    parked: Option<String>,
    after_stop: Option<AfterStop>,
    components: HashMap<u32, Component>,
    last_exit: Option<String>,
    /// The version whose module a compile thread is compiling for a start
    /// (a version not compiled in this run: every actor after the world
    /// opens, an older one rolled back to).
    loading: Option<u32>,
    /// A version whose compile for a start failed, and why: the next start
    /// fails with it (then the crash backoff retries, compiling again).
    load_failed: Option<(u32, String)>,
    /// The live check's feed to the old version's shadow, handed to the
    /// next instance's writer (see `probation`).
    feed: Option<probation::Feed>,
}

struct Broker {
    layout: Layout,
    reg: Registry,
    rt: Runtime,
    cfg: WorldConfig,
    actors: HashMap<String, ActorRt>,
    tx: Sender<Event>,
    /// Native participants without a mailbox (`console`, `cc`, `http`):
    /// messages to them go to these inboxes, each bounded in bytes.
    natives: HashMap<String, crate::queue::Inbox>,
    /// The native `agent`'s durable mailbox (`broker/mailbox/agent.jsonl`):
    /// what waits for it survives a host crash like an actor's mailbox.
    agent_box: Arc<Mailbox>,
    generation: u64,
    quitting: Option<Sender<()>>,
    /// Compiles running (spawns, upgrades, starts), by token; one past its
    /// deadline is taken out (and its purpose refused), so its late result
    /// finds nothing.
    compiles: HashMap<u64, Compile>,
    /// Instances given up in a host call, by actor and generation, until
    /// their thread ends: the lineage they count against and the memory
    /// they may still hold (see [`WorldBudget::abandoned_per_spawner`]).
    abandoned: HashMap<(String, u64), (String, u64)>,
    /// Upgrade candidates from their request to their verdict, by
    /// [`Upgrade::candidate`]: the memory and disk limits each may use (a
    /// candidate runs beside the live version, on copies of its files),
    /// counted in the world's budgets.
    candidates: HashMap<u64, (u64, u64)>,
    /// Compile threads still running (a spawn past its budget included).
    compiling: Arc<std::sync::atomic::AtomicUsize>,
    next_token: u64,
    /// Live checks of upgraded versions, by actor (see `probation`).
    probations: HashMap<String, probation::Probation>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Event")
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// A broker note in an actor's `stderr.log` (capped, rotated, private:
/// see [`runtime::append_note`]).
fn append_log(path: &Path, note: &str) {
    runtime::append_note(path, "broker", note);
}

/// The wasm file stored for a version (`actor.wasm` or `actor.wat`).
fn version_wasm(dir: &Path) -> Option<PathBuf> {
    ["actor.wasm", "actor.wat"].iter().map(|n| dir.join(n)).find(|p| p.exists())
}

impl Broker {
    fn ensure_rt(&mut self, id: &str) -> anyhow::Result<()> {
        if !self.actors.contains_key(id) {
            let mailbox = Arc::new(Mailbox::open(&self.layout.mailbox(id))?);
            self.actors.insert(
                id.to_owned(),
                ActorRt {
                    live: None,
                    mailbox,
                    crashes: Vec::new(),
                    backoff_n: 0,
                    restart_at: None,
                    parked: None,
                    after_stop: None,
                    components: HashMap::new(),
                    last_exit: None,
                    loading: None,
                    load_failed: None,
                    feed: None,
                },
            );
        }
        Ok(())
    }

    /// A message id (see [`message::message_id`]). Numbers are reserved in
    /// blocks saved with the registry before they are handed out, so a run
    /// that ends without saving (a crash) never lets the next run hand out
    /// a number again: ids stay unique in journals and replies.
    fn new_id(&mut self, from: &str, own: Option<&str>) -> String {
        let id = message::message_id(from, own, &mut self.reg.next_msg);
        if self.reg.next_msg >= self.reg.msg_reserved {
            self.reg.msg_reserved = self.reg.next_msg + MSG_ID_BLOCK;
            self.save();
        }
        id
    }

    fn save(&self) {
        if let Err(e) = self.layout.save_registry(&self.reg) {
            eprintln!("cairn-actors: saving the registry failed: {e}");
        }
    }

    fn run(&mut self, rx: Receiver<Event>) {
        loop {
            match rx.recv_timeout(Duration::from_millis(50)) {
                Ok(ev) => self.handle(ev),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
            if self.quitting.is_some() {
                if self.actors.values().all(|a| a.live.is_none()) {
                    self.save();
                    self.rt.shutdown();
                    if let Some(t) = self.quitting.take() {
                        let _ = t.send(());
                    }
                    return;
                }
                continue;
            }
            if !self.probations.is_empty() {
                self.probation_ticks();
            }
            let now = Instant::now();
            let late: Vec<u64> = self.compiles.iter().filter(|(_, c)| c.deadline <= now).map(|(t, _)| *t).collect();
            for t in late {
                if let Some(c) = self.compiles.remove(&t) {
                    self.compile_late(c);
                }
            }
            let due: Vec<String> = self
                .actors
                .iter()
                .filter(|(_, a)| a.live.is_none() && a.restart_at.is_some_and(|t| t <= now))
                .map(|(id, _)| id.clone())
                .collect();
            for id in due {
                if let Some(a) = self.actors.get_mut(&id) {
                    a.restart_at = None;
                }
                if self.reg.actors.get(&id).is_some_and(|e| e.desired == Desired::Running) {
                    self.start_actor(&id, None);
                }
            }
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Out { id, generation, line, _credit } => {
                // An upgraded version's first answers wait for its live check.
                let line = if self.probations.is_empty() {
                    Some((line, _credit))
                } else {
                    self.probation_line(&id, generation, line, _credit)
                };
                if let Some((line, _credit)) = line {
                    self.route_line(&id, line);
                }
            }
            Event::Shadow { id, token, line } => self.shadow_line(&id, token, line),
            Event::Undelivered { to, line, reason } => {
                if let Ok(m) = serde_json::from_str::<Inbound>(&line) {
                    self.undeliverable(&m.from, &m.id, &to, &reason);
                }
            }
            Event::Native { from, msg } => self.route(&from, msg),
            Event::Exited { id, generation, exit } => self.exited(&id, generation, exit),
            Event::Tested(t) => self.tested(*t),
            Event::Compiled { token, result, bytes, ended } => match self.compiles.remove(&token) {
                // Taken out at its deadline: answered already.
                None => {}
                // Compiled after its deadline, before the broker saw the
                // deadline pass: late all the same. (A failed compile is
                // told as it failed: its reason says more.)
                Some(c) if result.is_ok() && ended > c.deadline => self.compile_late(c),
                Some(c) => match c.purpose {
                    Purpose::Spawn(sp) => self.compiled(*sp, result, &bytes),
                    Purpose::Upgrade(plan) => self.upgrade_compiled(*plan, result),
                    Purpose::Load { id, version } => self.loaded(&id, version, result),
                },
            },
            Event::Abandon { id, generation, in_host } => {
                let stuck = self
                    .actors
                    .get(&id)
                    .and_then(|a| a.live.as_ref())
                    .is_some_and(|l| l.generation == generation && l.stopping);
                if stuck {
                    let note = if in_host {
                        "instance was inside a host call at its kill (blocked there, where the epoch cannot reach it): abandoned at the kill, it ends alone when the call returns".to_owned()
                    } else {
                        format!(
                            "instance did not end {} ms after its kill: abandoned, it ends alone",
                            ABANDON_AFTER.as_millis()
                        )
                    };
                    append_log(&self.layout.actor_dir(&id).join("stderr.log"), &note);
                    let held = (self.lineage(&id), self.limits_of(&id).memory_bytes as u64);
                    self.exited(&id, generation, Exit::Killed);
                    // After `exited` (which would take it for the late
                    // end of an abandoned one): its real end comes later.
                    self.abandoned.insert((id.clone(), generation), held);
                }
            }
            Event::Quit(done) => {
                self.quitting = Some(done);
                let ids: Vec<String> = self.actors.keys().cloned().collect();
                for id in ids {
                    self.stop_instance(&id);
                }
            }
        }
    }

    // ---- routing ----

    fn route(&mut self, from: &str, msg: Outbound) {
        let id = self.new_id(from, msg.id.as_deref());
        match msg.to.as_deref() {
            Some(BROKER) => self.request(from, &id, msg.body),
            Some(HTTP) if !self.may_use_http(from) => {
                let reason = format!("{from} did not declare \"http\": true in its spawn request");
                self.undeliverable(from, &id, HTTP, &reason);
            }
            Some(to) => {
                let to = to.to_owned();
                let m = Inbound { id: id.clone(), from: from.into(), reply_to: msg.reply_to, body: msg.body };
                if let Err(reason) = self.deliver(&to, m) {
                    self.undeliverable(from, &id, &to, &reason);
                }
            }
            None => {
                let subs: BTreeSet<String> = match self.reg.actors.get(from) {
                    Some(e) => e.subscribers.clone(),
                    None => self.reg.native_subscribers.get(from).cloned().unwrap_or_default(),
                };
                for s in subs {
                    let m = Inbound {
                        id: id.clone(),
                        from: from.into(),
                        reply_to: msg.reply_to.clone(),
                        body: msg.body.clone(),
                    };
                    if let Err(reason) = self.deliver(&s, m) {
                        self.undeliverable(from, &id, &s, &reason);
                    }
                }
            }
        }
    }

    fn deliver(&mut self, to: &str, m: Inbound) -> Result<(), String> {
        if let Some(tx) = self.natives.get(to) {
            return tx.send(m).map_err(|e| e.to_string());
        }
        if to == AGENT {
            let line = serde_json::to_string(&m).map_err(|e| e.to_string())?;
            return self.agent_box.push(line).map(drop).map_err(|e| e.to_string());
        }
        let Some(a) = self.actors.get(to).filter(|_| self.reg.actors.contains_key(to)) else {
            return Err(format!("no actor {to:?}"));
        };
        let line = serde_json::to_string(&m).map_err(|e| e.to_string())?;
        if self.write_now(to, &line) {
            return Ok(());
        }
        a.mailbox.push(line).map(drop).map_err(|e| e.to_string())
    }

    /// The direct way to an idle actor (issue 48.9): a message for a
    /// running instance whose mailbox is empty, whose writer holds nothing
    /// and whose stdin pipe is empty is written by the broker at once
    /// ([`Instance::write_now`]), without the mailbox's two journal
    /// records (`+` then `x`, which replay to nothing) and without waking
    /// the writer thread. Every guarantee of the writer's way holds:
    /// order (nothing is queued before it, and the writer takes from the
    /// mailbox only with stdin held), one line in the pipe (so a kill -9
    /// of the host still loses at most that line and the one the guest was
    /// handling: a message written here was never journaled, as one the
    /// writer took was journaled as gone), the crash blame
    /// (`last_delivered`) and the stop (none once `stopping`). Not while
    /// an upgrade's live check feeds a shadow (the writer offers it what
    /// it writes). Anything else, or a pipe that is not empty, takes the
    /// mailbox.
    fn write_now(&self, to: &str, line: &str) -> bool {
        if self.probations.contains_key(to) {
            return false;
        }
        let Some(a) = self.actors.get(to) else { return false };
        let Some(live) = a.live.as_ref() else { return false };
        if live.stopping || live.writer_done.load(Ordering::SeqCst) {
            return false;
        }
        let may = || !live.writer_holds.load(Ordering::SeqCst) && a.mailbox.is_empty();
        if !live.inst.write_now(line, may) {
            return false;
        }
        *live.last_delivered.lock().unwrap_or_else(|p| p.into_inner()) = Some(line.to_owned());
        true
    }

    fn undeliverable(&mut self, sender: &str, msg_id: &str, to: &str, reason: &str) {
        if sender == BROKER {
            return; // never bounce the broker's own messages
        }
        let id = self.new_id(BROKER, None);
        let m = Inbound {
            id,
            from: BROKER.into(),
            reply_to: Some(msg_id.into()),
            body: message::undeliverable(reason, to),
        };
        let _ = self.deliver(sender, m);
    }

    fn reply(&mut self, to: &str, req_id: &str, body: Value) {
        let id = self.new_id(BROKER, None);
        let m = Inbound { id, from: BROKER.into(), reply_to: Some(req_id.into()), body };
        let _ = self.deliver(to, m);
    }

    /// Writes version `n`: the module's `bytes` (those compiled, not the
    /// file again: it may have changed since), a capped copy of `source`
    /// and `meta.json`. On failure the version directory is removed.
    #[allow(clippy::too_many_arguments)]
    fn install_version(
        &self,
        id: &str,
        n: u32,
        wasm: &Path,
        bytes: &[u8],
        source: Option<&Path>,
        built_by: Option<&str>,
        requester: &str,
    ) -> anyhow::Result<()> {
        let dir = self.layout.version(id, n);
        let r = self.write_version(&dir, wasm, bytes, source, built_by, requester);
        if r.is_err() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        r
    }

    fn write_version(
        &self,
        dir: &Path,
        wasm: &Path,
        bytes: &[u8],
        source: Option<&Path>,
        built_by: Option<&str>,
        requester: &str,
    ) -> anyhow::Result<()> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        std::fs::create_dir_all(dir)?;
        let name = if wasm.extension().is_some_and(|e| e == "wat") { "actor.wat" } else { "actor.wasm" };
        std::fs::write(dir.join(name), bytes).with_context(|| format!("copying {}", wasm.display()))?;
        if let Some(s) = source {
            let (max_bytes, max_entries) = SOURCE_LIMIT;
            layout::copy_tree_within(s, &dir.join("source"), max_bytes, max_entries)?;
        }
        let meta = json!({"wasm": wasm, "source": source, "built_by": built_by,
            "requested_by": requester, "time": now_secs()});
        layout::write_atomic(&dir.join("meta.json"), &serde_json::to_vec_pretty(&meta)?)?;
        Ok(())
    }

    fn tested(&mut self, t: Tested) {
        let Tested { mut plan, component, verdict } = t;
        // A passed candidate's reservation goes on as its live check's
        // shadow (released when the check ends, or after the swap if none).
        if verdict.is_err() || !self.reg.actors.contains_key(&plan.id) {
            self.candidates.remove(&plan.candidate);
        }
        match verdict {
            Err(why) => {
                let (r, q) = (plan.requester.clone(), plan.req_id.clone());
                self.reply(
                    &r,
                    &q,
                    json!({"type": "error", "request": "upgrade", "id": plan.id,
                    "reason": format!("upgrade refused, the old version keeps running: {why}")}),
                );
            }
            Ok(n) => {
                plan.tests = n;
                if !self.reg.actors.contains_key(&plan.id) {
                    return;
                }
                if let Err(e) = self.install_version(
                    &plan.id,
                    plan.new_version,
                    &plan.wasm,
                    &plan.bytes,
                    plan.source.as_deref(),
                    plan.built_by.as_deref(),
                    &plan.requester,
                ) {
                    self.candidates.remove(&plan.candidate);
                    let (r, q) = (plan.requester.clone(), plan.req_id.clone());
                    self.reply(&r, &q, json!({"type": "error", "reason": format!("{e:#}")}));
                    return;
                }
                if let Some(e) = self.reg.actors.get_mut(&plan.id) {
                    e.latest = plan.new_version;
                }
                self.save();
                let id = plan.id.clone();
                self.after_stop(&id, AfterStop::Swap(Box::new(plan), component));
            }
        }
    }

    /// Runs `after` once the instance has stopped (now if not running).
    fn after_stop(&mut self, id: &str, after: AfterStop) {
        let Some(a) = self.actors.get_mut(id) else { return };
        a.restart_at = None;
        if a.live.is_some() {
            a.after_stop = Some(after);
            self.stop_instance(id);
        } else {
            self.do_after(id, after);
        }
    }

    fn do_after(&mut self, id: &str, after: AfterStop) {
        match after {
            AfterStop::Stop { requester, req_id } => {
                self.write_status(id);
                self.reply(&requester, &req_id, json!({"type": "ok", "request": "stop", "id": id}));
            }
            AfterStop::Remove { requester, req_id } => {
                let r = self.archive(id);
                let body = match r {
                    Ok(to) => json!({"type": "ok", "request": "remove", "id": id, "archive": to}),
                    Err(e) => json!({"type": "error", "reason": format!("{e:#}")}),
                };
                self.reply(&requester, &req_id, body);
            }
            AfterStop::Swap(plan, component) => {
                let r = self.swap(&plan, component);
                if self.probations.get(id).is_none_or(|p| p.candidate != plan.candidate) {
                    self.candidates.remove(&plan.candidate);
                }
                let body = match r {
                    Ok(()) => json!({"type": "ok", "request": "upgrade", "id": plan.id,
                        "version": plan.new_version, "tests": plan.tests}),
                    Err(e) => json!({"type": "error", "reason": format!("{e:#}")}),
                };
                self.reply(&plan.requester, &plan.req_id, body);
            }
            AfterStop::Rollback { to, requester, req_id, reason } => {
                let from_v = self.reg.actors.get(id).map(|e| e.version).unwrap_or(0);
                let r = self.rollback(id, to);
                let body = match r {
                    Ok(()) => json!({"type": "rolled_back", "id": id, "from": from_v, "to": to, "reason": reason}),
                    Err(e) => json!({"type": "error", "reason": format!("rollback failed: {e:#}")}),
                };
                match req_id {
                    Some(q) => self.reply(&requester, &q, body),
                    None => {
                        let mid = self.new_id(BROKER, None);
                        let _ =
                            self.deliver(&requester, Inbound { id: mid, from: BROKER.into(), reply_to: None, body });
                    }
                }
            }
        }
    }

    fn snapshot(&self, id: &str, version: u32) -> anyhow::Result<()> {
        let snap = self.layout.version(id, version).join("snapshot");
        layout::replace_tree(&self.layout.data(id), &snap.join("data"))?;
        layout::replace_tree(&self.layout.public(id), &snap.join("public"))?;
        Ok(())
    }

    /// The swap: (mailbox held: no instance runs) snapshot, install source,
    /// start the new version with the parked message first.
    fn swap(&mut self, plan: &Upgrade, component: Component) -> anyhow::Result<()> {
        let old = self.reg.actors.get(&plan.id).map(|e| e.version).unwrap_or(0);
        self.snapshot(&plan.id, old)?;
        let src = self.layout.version(&plan.id, plan.new_version).join("source");
        layout::replace_tree(&src, &self.layout.source(&plan.id))?;
        if let Some(e) = self.reg.actors.get_mut(&plan.id) {
            e.version = plan.new_version;
            e.desired = Desired::Running;
            e.watch = Some(UpgradeWatch {
                since_ms: now_ms(),
                prev: old,
                requester: plan.requester.clone(),
                crashes_ms: vec![],
            });
        }
        self.save();
        // The registry (the new version and its rollback marker) is saved
        // first: whatever a crash cuts short here, the running version and
        // the marker's stay.
        self.prune_versions(&plan.id);
        let parked = self.actors.get_mut(&plan.id).and_then(|a| {
            a.components.insert(plan.new_version, component);
            a.crashes.clear();
            a.backoff_n = 0;
            a.parked.take()
        });
        // A version gated by transcripts is checked live: the old one
        // stays ready in shadow until its first answers are judged.
        if plan.tests > 0 && self.cfg.live_checks > 0 {
            let tests = self.layout.version(&plan.id, plan.new_version).join("source").join("tests");
            let expects = crate::transcript::expectations(&tests);
            self.start_probation(&plan.id, plan.new_version, old, &plan.requester, plan.candidate, expects);
        }
        self.start_actor(&plan.id, parked);
        Ok(())
    }

    /// Deletes the versions of `id` it no longer keeps (see
    /// [`versions_to_keep`]), each whole or not at all
    /// ([`Layout::delete_version`]); a failure is noted in its
    /// `stderr.log` and tried again at the next upgrade or world open.
    fn prune_versions(&self, id: &str) {
        let Some(e) = self.reg.actors.get(id) else { return };
        let installed = self.layout.installed_versions(id);
        let keep = versions_to_keep(&installed, e.version, e.watch.as_ref().map(|w| w.prev), self.cfg.versions_kept);
        for v in installed.into_iter().filter(|v| !keep.contains(v)) {
            if let Err(err) = self.layout.delete_version(id, v) {
                append_log(
                    &self.layout.actor_dir(id).join("stderr.log"),
                    &format!("deleting version {v} failed: {err}"),
                );
            }
        }
    }

    /// Why a rollback to version `to` of `id` (deleted by
    /// [`Broker::prune_versions`]) is refused, naming the kept ones.
    fn not_kept(&self, id: &str, to: u32) -> String {
        let kept: Vec<String> = self.layout.installed_versions(id).iter().map(u32::to_string).collect();
        format!(
            "version {to} of {id:?} is no longer kept; kept: {} (the running version and up to {} more)",
            kept.join(", "),
            self.cfg.versions_kept.max(1)
        )
    }

    fn rollback(&mut self, id: &str, to: u32) -> anyhow::Result<()> {
        let cur = self.reg.actors.get(id).map(|e| e.version).unwrap_or(0);
        let vdir = self.layout.version(id, to);
        if !vdir.is_dir() {
            // Checked before anything changes (the request was checked
            // too, but a version may go between the request and the stop).
            bail!("{}", self.not_kept(id, to));
        }
        self.snapshot(id, cur)?;
        let snap = vdir.join("snapshot");
        if snap.exists() {
            layout::replace_tree(&snap.join("data"), &self.layout.data(id))?;
            layout::replace_tree(&snap.join("public"), &self.layout.public(id))?;
        }
        layout::replace_tree(&vdir.join("source"), &self.layout.source(id))?;
        if let Some(e) = self.reg.actors.get_mut(id) {
            e.version = to;
            e.desired = Desired::Running;
            e.watch = None;
        }
        self.save();
        if let Some(a) = self.actors.get_mut(id) {
            a.crashes.clear();
            a.backoff_n = 0;
            a.parked = None;
        }
        self.start_actor(id, None);
        Ok(())
    }

    fn archive(&mut self, id: &str) -> anyhow::Result<PathBuf> {
        let mut n = 1;
        let dest = loop {
            let d = self.layout.archive().join(format!("{id}-{n}"));
            if !d.exists() {
                break d;
            }
            n += 1;
        };
        std::fs::create_dir_all(&dest)?;
        for (from, name) in [
            (self.layout.actor_dir(id), "actor"),
            (self.layout.data(id), "data"),
            (self.layout.root().join("broker").join("versions").join(id), "versions"),
            (self.layout.mailbox(id), "mailbox.jsonl"),
        ] {
            if from.exists() {
                std::fs::rename(&from, dest.join(name)).with_context(|| format!("archiving {}", from.display()))?;
            }
        }
        self.reg.actors.remove(id);
        for e in self.reg.actors.values_mut() {
            e.subscribers.remove(id);
        }
        self.actors.remove(id);
        self.save();
        Ok(dest)
    }

    // ---- instances ----

    fn state(&self, id: &str) -> &'static str {
        let desired = self.reg.actors.get(id).map(|e| e.desired);
        match self.actors.get(id) {
            Some(a) if a.live.as_ref().is_some_and(|l| l.stopping) => "stopping",
            Some(a) if a.live.is_some() => "running",
            Some(a) if a.loading.is_some() => "starting",
            Some(a) if a.restart_at.is_some() => "restarting",
            _ if desired == Some(Desired::Stopped) => "stopped",
            _ => "exited",
        }
    }

    fn write_status(&self, id: &str) {
        let Some(e) = self.reg.actors.get(id) else { return };
        let a = self.actors.get(id);
        let status = json!({
            "id": id,
            "version": e.version,
            "latest": e.latest,
            "state": self.state(id),
            "mailbox": a.map(|a| a.mailbox.len()),
            "crashes": a.map(|a| a.crashes.len()),
            "last_exit": a.and_then(|a| a.last_exit.clone()),
        });
        let _ = layout::write_atomic(
            &self.layout.actor_dir(id).join("status.json"),
            &serde_json::to_vec_pretty(&status).unwrap_or_default(),
        );
    }

    /// Starts `id`'s current version. A version not compiled in this run
    /// is compiled first on a thread of its own (counted in
    /// [`COMPILES_AT_ONCE`]; past it the start waits 0.2 s and tries
    /// again), never on the broker thread: `loaded` starts it when done.
    fn start_actor(&mut self, id: &str, first: Option<String>) {
        let Some(v) = self.reg.actors.get(id).map(|e| e.version) else { return };
        let Some(a) = self.actors.get_mut(id) else { return };
        if a.live.is_some() {
            return;
        }
        let compiled = match a.components.get(&v) {
            Some(c) => Ok(c.clone()),
            None => match a.load_failed.take() {
                Some((fv, why)) if fv == v => Err(anyhow!("compiling version {v} failed: {why}")),
                _ => {
                    if let Some(m) = first {
                        // Never the case (a swap's version is compiled),
                        // but a parked message is never dropped.
                        a.parked = Some(m);
                    }
                    if a.loading.is_none() {
                        self.load(id, v);
                    }
                    return self.write_status(id);
                }
            },
        };
        self.generation += 1;
        let generation = self.generation;
        let log = self.layout.actor_dir(id).join("stderr.log");
        let lineage = self.lineage(id);
        let stuck = self.abandoned.values().filter(|(l, _)| *l == lineage).count();
        let most = self.cfg.budget.abandoned_per_spawner;
        let started = if stuck >= most {
            Err(anyhow!(
                "{stuck} abandoned instances of {lineage:?} and the actors it spawned are still blocked in host calls (the world's budget: at most {most} per spawner); no new instance of them until one ends"
            ))
        } else {
            compiled
        };
        let started = started.and_then(|c| {
            let dirs = Dirs {
                data: self.layout.data(id),
                public: self.layout.public(id),
                actor_root: self.layout.actor_root(),
            };
            let (tx1, tx2, id1, id2) = (self.tx.clone(), self.tx.clone(), id.to_owned(), id.to_owned());
            // Credit per instance: a guest writing faster than the broker
            // routes waits in its own write (see `queue::Gate`).
            let gate = Arc::new(crate::queue::Gate::default());
            runtime::start(
                &self.rt,
                &c,
                &dirs,
                &log,
                self.limits_of(id),
                move |line| {
                    let _credit = gate.acquire(line.len());
                    let _ = tx1.send(Event::Out { id: id1.clone(), generation, line, _credit });
                },
                move |exit| {
                    let _ = tx2.send(Event::Exited { id: id2, generation, exit });
                },
            )
        });
        let inst = match started {
            Ok(i) => Arc::new(i),
            Err(e) => {
                append_log(&log, &format!("start failed: {e:#}"));
                let _ = self.tx.send(Event::Exited {
                    id: id.to_owned(),
                    generation,
                    exit: Exit::Trap(format!("start failed: {e:#}")),
                });
                // Register a placeholder so the Exited event is accepted.
                return self.placeholder(id, generation);
            }
        };
        self.probation_started(id, generation);
        let Some(a) = self.actors.get_mut(id) else { return };
        let last = Arc::new(Mutex::new(None));
        let done = Arc::new(AtomicBool::new(false));
        let holds = Arc::new(AtomicBool::new(first.is_some()));
        spawn_writer(
            inst.clone(),
            a.mailbox.clone(),
            last.clone(),
            done.clone(),
            holds.clone(),
            first,
            log,
            id.to_owned(),
            self.tx.clone(),
            self.cfg.stdin_wait,
            a.feed.take(),
        );
        a.live = Some(Live {
            generation,
            inst,
            started: Instant::now(),
            last_delivered: last,
            writer_done: done,
            writer_holds: holds,
            stopping: false,
        });
        self.write_status(id);
    }

    /// Compiles `bytes` on a thread of its own (counted in
    /// [`COMPILES_AT_ONCE`] until it ends), for `purpose`; its result comes
    /// back as [`Event::Compiled`], or, past the world's compile budget,
    /// `compile_late` refuses the purpose first.
    fn start_compile(&mut self, bytes: ModuleBytes, wasm: PathBuf, purpose: Purpose) -> anyhow::Result<()> {
        self.next_token += 1;
        let token = self.next_token;
        let (rt, tx) = (self.rt.clone(), self.tx.clone());
        let slot = CompileSlot::take(&self.compiling);
        let started = thread::Builder::new().name("actor-compile".into()).spawn({
            move || {
                let read = match bytes {
                    ModuleBytes::Read(b) => Ok(b),
                    ModuleBytes::Stored(dir) => version_wasm(&dir)
                        .ok_or_else(|| anyhow!("{} holds no actor.wasm", dir.display()))
                        .and_then(|p| read_wasm(&p)),
                };
                let (result, bytes) = match read {
                    // A compiler panic (a bug, or a module that finds one)
                    // refuses this module only.
                    Ok(b) => {
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.compile(&b)));
                        let r = r.unwrap_or_else(|_| Err(anyhow!("the compiler panicked on this module")));
                        (r.map_err(|e| format!("{e:#}")), b)
                    }
                    Err(e) => (Err(format!("{e:#}")), Vec::new()),
                };
                let ended = Instant::now();
                // Freed before the event: the broker may start the next
                // compile as soon as it sees this one end.
                drop(slot);
                let _ = tx.send(Event::Compiled { token, result, bytes, ended });
            }
        });
        // (A thread that did not start dropped its slot with its closure.)
        if let Err(e) = started {
            return Err(e).context("starting the compile thread");
        }
        let deadline = Instant::now() + self.cfg.compile_budget;
        self.compiles.insert(token, Compile { purpose, wasm, deadline });
        Ok(())
    }

    /// A compile ran past the world's budget: its spawn or upgrade is
    /// refused, its start fails (a crash, retried with the backoff). The
    /// thread runs to its end alone (cranelift cannot be interrupted).
    fn compile_late(&mut self, c: Compile) {
        let why = format!("compiling {} took longer than {}", c.wasm.display(), secs(self.cfg.compile_budget));
        match c.purpose {
            Purpose::Spawn(sp) => {
                let reason = format!("{why}; spawn of {:?} refused", sp.id);
                self.reply(&sp.from, &sp.req_id, json!({"type": "error", "request": "spawn", "reason": reason}));
            }
            Purpose::Upgrade(plan) => {
                self.candidates.remove(&plan.candidate);
                let reason = format!("upgrade refused, the old version keeps running: {why}");
                self.reply(
                    &plan.requester,
                    &plan.req_id,
                    json!({"type": "error", "request": "upgrade", "id": plan.id, "reason": reason}),
                );
            }
            Purpose::Load { id, version } => self.loaded(&id, version, Err(why)),
        }
    }

    /// Compiles version `v` of `id` on a thread of its own for a start, or,
    /// with [`COMPILES_AT_ONCE`] compiles running, tries again in 0.2 s.
    fn load(&mut self, id: &str, v: u32) {
        let busy = self.compiling.load(Ordering::SeqCst) >= COMPILES_AT_ONCE;
        let Some(a) = self.actors.get_mut(id) else { return };
        if busy {
            a.restart_at = Some(Instant::now() + Duration::from_millis(200));
            return;
        }
        let dir = self.layout.version(id, v);
        let wasm = version_wasm(&dir).unwrap_or_else(|| dir.join("actor.wasm"));
        let purpose = Purpose::Load { id: id.to_owned(), version: v };
        let started = self.start_compile(ModuleBytes::Stored(dir), wasm, purpose);
        let Some(a) = self.actors.get_mut(id) else { return };
        match started {
            Ok(()) => a.loading = Some(v),
            Err(e) => {
                a.load_failed = Some((v, format!("{e:#}")));
                a.restart_at = Some(Instant::now());
            }
        }
    }

    /// A start's compile is done: start the actor if it is still to run
    /// (its current version may be another by now: then that one).
    fn loaded(&mut self, id: &str, v: u32, result: Result<Component, String>) {
        let Some(a) = self.actors.get_mut(id) else { return };
        if a.loading == Some(v) {
            a.loading = None;
        }
        match result {
            Ok(c) => {
                a.components.insert(v, c);
            }
            Err(why) => a.load_failed = Some((v, why)),
        }
        let run = self.reg.actors.get(id).is_some_and(|e| e.desired == Desired::Running);
        if run && self.quitting.is_none() {
            self.start_actor(id, None);
        } else {
            self.write_status(id);
        }
    }

    /// The world's limits, lowered where the actor's own are lower (its
    /// spawn request's, or its spawner's: `ActorEntry::limits`). An
    /// actor's fuel applies only in a world that meters fuel.
    fn limits_of(&self, id: &str) -> Limits {
        match self.reg.actors.get(id) {
            Some(e) => self.effective(&e.limits),
            None => self.cfg.limits,
        }
    }

    /// The world's limits, lowered where `a` (an actor's own, as its spawn
    /// gave them) is lower: what an instance of it gets, and what the
    /// world's budgets count for it.
    fn effective(&self, a: &layout::ActorLimits) -> Limits {
        let mut l = self.cfg.limits;
        {
            let low = |world: usize, own: Option<u64>| {
                own.and_then(|o| usize::try_from(o).ok()).map_or(world, |o| o.min(world))
            };
            l.memory_bytes = low(l.memory_bytes, a.memory_bytes);
            l.table_elements = low(l.table_elements, a.table_elements);
            l.instances = low(l.instances, a.instances);
            l.memories = low(l.memories, a.memories);
            l.tables = low(l.tables, a.tables);
            l.disk_entries = low(l.disk_entries, a.disk_entries);
            l.disk_bytes = a.disk_bytes.map_or(l.disk_bytes, |d| d.min(l.disk_bytes));
            l.fuel = l.fuel.map(|world| a.fuel.map_or(world, |f| f.min(world)));
        }
        l
    }

    fn placeholder(&mut self, id: &str, generation: u64) {
        let Ok((_r, w)) = std::io::pipe() else { return };
        if let Some(a) = self.actors.get_mut(id) {
            a.live = Some(Live {
                generation,
                inst: Arc::new(Instance {
                    stdin: Arc::new(Mutex::new(Some(w))),
                    kill: Arc::new(AtomicBool::new(true)),
                    in_host: Arc::new(AtomicBool::new(false)),
                }),
                started: Instant::now(),
                last_delivered: Arc::new(Mutex::new(None)),
                writer_done: Arc::new(AtomicBool::new(true)),
                writer_holds: Arc::new(AtomicBool::new(false)),
                stopping: false,
            });
        }
    }

    /// Graceful stop: hold the mailbox, `{"type":"shutdown"}`, EOF, kill
    /// after 5 s.
    fn stop_instance(&mut self, id: &str) {
        let shutdown_id = self.new_id(BROKER, None);
        let Some(live) = self.actors.get_mut(id).and_then(|a| a.live.as_mut()) else { return };
        if live.stopping {
            return;
        }
        live.stopping = true;
        live.writer_done.store(true, Ordering::SeqCst);
        let inst = live.inst.clone();
        let line = serde_json::to_string(&Inbound {
            id: shutdown_id,
            from: BROKER.into(),
            reply_to: None,
            body: json!({"type": "shutdown"}),
        })
        .unwrap_or_default();
        // The kill timer runs apart from the stdin write: a guest that never
        // drains stdin would otherwise block the shutdown line forever.
        let kill = inst.kill.clone();
        let generation = live.generation;
        let (tx, id_owned) = (self.tx.clone(), id.to_owned());
        let in_host = inst.in_host.clone();
        let _ = thread::Builder::new().name("actor-kill".into()).spawn(move || {
            thread::sleep(KILL_AFTER);
            kill.store(true, Ordering::SeqCst);
            // The epoch (or its next host call) ends a guest running WASM
            // within a tick; one blocked in a host call (a long sleep) never
            // sees it, and would keep the actor `stopping` until the call
            // returns: it is given up now, so the stop is answered at the
            // seed's 5 s. Read after the kill: if the guest was not in a
            // host call then, it cannot enter one without trapping.
            let in_host = in_host.load(Ordering::SeqCst);
            if !in_host {
                thread::sleep(ABANDON_AFTER);
            }
            let _ = tx.send(Event::Abandon { id: id_owned, generation, in_host });
        });
        let _ = thread::Builder::new().name("actor-stop".into()).spawn(move || {
            let _ = inst.write_line(&line, KILL_AFTER);
            inst.close_stdin();
        });
        self.write_status(id);
    }

    fn exited(&mut self, id: &str, generation: u64, exit: Exit) {
        if self.abandoned.remove(&(id.to_owned(), generation)).is_some() {
            let note = format!("an abandoned instance ended at last: {exit:?}");
            append_log(&self.layout.actor_dir(id).join("stderr.log"), &note);
            return;
        }
        let Some(a) = self.actors.get_mut(id) else { return };
        if a.live.as_ref().is_none_or(|l| l.generation != generation) {
            return;
        }
        let Some(live) = a.live.take() else { return };
        live.writer_done.store(true, Ordering::SeqCst);
        if !self.probations.is_empty() {
            // May leave a rollback in `after_stop` (taken below).
            self.probation_exited(id, generation);
        }
        let Some(a) = self.actors.get_mut(id) else { return };
        let log = self.layout.actor_dir(id).join("stderr.log");
        a.last_exit = Some(format!("{exit:?}"));
        if let Some(after) = a.after_stop.take() {
            self.do_after(id, after);
            return;
        }
        if live.stopping || self.quitting.is_some() {
            self.write_status(id);
            return;
        }
        if !exit.is_crash() {
            append_log(&log, &format!("instance ended: {exit:?}"));
            self.write_status(id);
            return;
        }
        append_log(&log, &format!("instance crashed: {exit:?}"));
        let now = Instant::now();
        if live.started.elapsed() >= BACKOFF_RESET {
            a.backoff_n = 0;
        }
        a.crashes.push(now);
        a.parked = live.last_delivered.lock().unwrap_or_else(|p| p.into_inner()).take().or(a.parked.take());
        let delay = backoff(a.backoff_n);
        a.backoff_n += 1;
        a.restart_at = Some(now + delay);
        // The crash-loop count lives in the registry (saved at every crash
        // of a watched version), so it survives a host crash.
        let window = u64::try_from(CRASH_WINDOW.as_millis()).unwrap_or(u64::MAX);
        let at = now_ms();
        let watched = self.reg.actors.get_mut(id).and_then(|e| e.watch.as_mut()).map(|w| {
            w.crashes_ms.retain(|t| *t >= w.since_ms && at.saturating_sub(*t) <= window);
            w.crashes_ms.push(at);
            (w.crashes_ms.len(), w.prev, w.requester.clone())
        });
        if watched.is_some() {
            self.save();
        }
        if let Some((n, prev, requester)) = watched
            && n >= CRASH_LOOP
        {
            if let Some(a) = self.actors.get_mut(id) {
                a.restart_at = None;
            }
            append_log(&log, &format!("{n} crashes within 30 s after an upgrade: rolling back to version {prev}"));
            let after = AfterStop::Rollback {
                to: prev,
                requester,
                req_id: None,
                reason: format!("{n} crashes within 30 s after the upgrade"),
            };
            self.do_after(id, after);
            return;
        }
        self.write_status(id);
    }
}

/// Moves messages from the mailbox to the instance's stdin, one at a time.
///
/// A message leaves the mailbox (journaled) just before it is written, so
/// delivery is at most once. It is taken while the instance's stdin is
/// held and only if the instance is not stopping: a stop sets `done`
/// before its shutdown line (written under the same hold), so a message
/// is either written ahead of the shutdown line or left in place, in
/// order, for the next instance. The parked message `first` (not in the
/// mailbox) and a message the guest died before reading go back to the
/// mailbox's front.
#[allow(clippy::too_many_arguments)]
fn spawn_writer(
    inst: Arc<Instance>,
    mailbox: Arc<Mailbox>,
    last: Arc<Mutex<Option<String>>>,
    done: Arc<AtomicBool>,
    holds: Arc<AtomicBool>,
    first: Option<String>,
    log: PathBuf,
    to: String,
    events: Sender<Event>,
    wait: Duration,
    feed: Option<probation::Feed>,
) {
    // Every message that leaves the mailbox and does not reach the guest
    // is told to its sender (`undeliverable`), besides the note here.
    let tell = move |line: &str, reason: String| {
        let _ = events.send(Event::Undelivered { to: to.clone(), line: line.to_owned(), reason });
    };
    let put_back = {
        let (mailbox, log, tell) = (mailbox.clone(), log.clone(), tell.clone());
        move |m: String| {
            if let Err(e) = mailbox.push_front(m.clone()) {
                append_log(&log, &format!("message lost, putting it back failed ({e}): {m}"));
                tell(&m, format!("the instance ended before reading it and putting it back failed: {e}"));
            }
        }
    };
    let _ = thread::Builder::new().name("actor-stdin".into()).spawn(move || {
        let mut parked = first;
        loop {
            if done.load(Ordering::SeqCst) {
                if let Some(m) = parked {
                    put_back(m);
                }
                return;
            }
            // Set once the parked message is written (or dropped): from
            // then on the broker's direct way may pass an empty mailbox.
            if parked.is_none() {
                holds.store(false, Ordering::SeqCst);
            }
            let (n, m) = match parked.take() {
                Some(m) => (None, m),
                None => match mailbox.peek_wait(Duration::from_millis(100)) {
                    Some((n, m)) => (Some(n), m),
                    None => continue,
                },
            };
            // The message last written, in case this one is not: a crash
            // is blamed on the message the guest last read.
            let mut before = None;
            let take = || {
                if done.load(Ordering::SeqCst) || n.is_some_and(|n| !mailbox.remove(n)) {
                    return false;
                }
                before = last.lock().unwrap_or_else(|p| p.into_inner()).replace(m.clone());
                true
            };
            match inst.write_line_if(&m, wait, take) {
                // Not taken: it stays in the mailbox (or, parked, is put
                // back when the loop sees `done`).
                None => {
                    if n.is_none() {
                        parked = Some(m);
                    }
                }
                Some(Ok(())) => {
                    // An upgraded version's live check: its old version
                    // in shadow reads the same message.
                    if let Some(f) = &feed {
                        probation::offer(f, &m);
                    }
                }
                Some(Err(e)) if e.kind() == std::io::ErrorKind::TimedOut => {
                    // Dropped (at most once); the next message gets its own wait.
                    last.lock().unwrap_or_else(|p| p.into_inner()).take();
                    append_log(&log, &format!("message dropped: {e}: {m}"));
                    tell(&m, format!("dropped: the actor did not read its stdin for {}", secs(wait)));
                }
                Some(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    // The guest is gone: it never read the whole line.
                    *last.lock().unwrap_or_else(|p| p.into_inner()) = before;
                    put_back(m);
                    return;
                }
                Some(Err(e)) => {
                    append_log(&log, &format!("message dropped, stdin write failed ({e}): {m}"));
                    tell(&m, format!("dropped: writing it to the actor's stdin failed ({e})"));
                    return;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(1), Duration::from_millis(1000));
        assert_eq!(backoff(5), Duration::from_secs(16));
        assert_eq!(backoff(6), Duration::from_secs(30));
        assert_eq!(backoff(60), Duration::from_secs(30));
    }

    #[test]
    fn a_compile_slot_is_freed_when_its_thread_ends_even_by_a_panic() {
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let slot = CompileSlot::take(&count);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        let t = thread::spawn(move || {
            let _held = slot;
            panic!("a compiler panic");
        });
        assert!(t.join().is_err());
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_running_version_the_marker_and_the_newest_others_are_kept() {
        let keep = |installed: &[u32], cur, prev, kept| -> Vec<u32> {
            versions_to_keep(installed, cur, prev, kept).into_iter().collect()
        };
        let all: Vec<u32> = (1..=9).collect();
        assert_eq!(keep(&all, 9, Some(8), 3), [6, 7, 8, 9]);
        // Rolled back to 5, then upgraded to 10 (marker: 5).
        let after: Vec<u32> = [5, 6, 7, 8, 10].into();
        assert_eq!(keep(&after, 10, Some(5), 3), [5, 7, 8, 10]);
        // Rolled back to 6 (no marker): the newest others.
        assert_eq!(keep(&after, 6, None, 3), [6, 7, 8, 10]);
        // At least one besides the running one: the marker's.
        assert_eq!(keep(&all, 9, Some(4), 0), [4, 9]);
        assert_eq!(keep(&all, 9, None, 0), [8, 9]);
        assert_eq!(keep(&[1], 1, None, 3), [1]);
    }
}
