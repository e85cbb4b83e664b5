//! The embedding side of a world (`World`): opening it (the lock, the
//! registry, the broker, `cc` and `http` threads), and the native
//! participants' calls (`console` and `agent` send, receive, and wait for
//! the reply to a request of theirs). Owns the console's inbox and the
//! agent's mailbox handle, never the registry or an actor's lifecycle:
//! everything it does to the world goes to the broker thread as an
//! event, and it must never take a reply meant for another request.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

use super::{Broker, Event, KILL_AFTER, WorldConfig};
use crate::layout::{Desired, Layout};
use crate::mailbox::Mailbox;
use crate::message::{AGENT, BROKER, CC, CONSOLE, HTTP, Inbound, Outbound};
use crate::queue::{self, InboxRx};
use crate::runtime::Runtime;

/// The console's inbox on the embedding side. Several threads take from
/// it at once (a printer showing every message as it arrives, a command
/// waiting for the broker's reply to its request), so a message taken off
/// the channel by one thread that another is waiting for is set aside in
/// `held` for it: a reply to a pending request is only ever taken by that
/// request, and everything else by [`World::recv`].
#[derive(Debug)]
struct ConsoleInbox {
    /// Messages set aside in `held` stay counted in the inbox's bytes
    /// until they are handed out: the bound covers both.
    rx: Mutex<InboxRx>,
    held: Mutex<Held>,
    changed: Condvar,
}

/// Messages set aside, and the full ids of requests waiting for a reply.
#[derive(Debug, Default)]
struct Held {
    queue: VecDeque<Inbound>,
    pending: HashSet<String>,
}

impl ConsoleInbox {
    /// The first message (held or arriving within `wait`) that `wanted`
    /// accepts, given the requests pending at that moment. Whoever holds
    /// the channel receives in short slices, so the others see what it set
    /// aside promptly.
    fn take(&self, wait: Duration, wanted: impl Fn(&Inbound, &HashSet<String>) -> bool) -> Option<Inbound> {
        const SLICE: Duration = Duration::from_millis(20);
        let deadline = Instant::now() + wait;
        loop {
            {
                let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(i) = h.queue.iter().position(|m| wanted(m, &h.pending)) {
                    return self.handed(h.queue.remove(i));
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(SLICE);
            match self.rx.try_lock() {
                Ok(rx) => {
                    if let Ok(m) = rx.recv_kept(slice) {
                        drop(rx);
                        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
                        h.queue.push_back(m);
                        self.changed.notify_all();
                    }
                }
                Err(_) => {
                    let h = self.held.lock().unwrap_or_else(|p| p.into_inner());
                    let _ = self.changed.wait_timeout(h, slice);
                }
            }
            if left.is_zero() {
                // One last look at what was set aside meanwhile.
                let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
                let i = h.queue.iter().position(|m| wanted(m, &h.pending))?;
                return self.handed(h.queue.remove(i));
            }
        }
    }

    /// A message leaves the inbox (its bytes no longer counted).
    fn handed(&self, m: Option<Inbound>) -> Option<Inbound> {
        if let Some(m) = &m {
            self.rx.lock().unwrap_or_else(|p| p.into_inner()).done(m);
        }
        m
    }
}

/// A running world: the broker thread, the `cc` worker, plus the native
/// participants' side of it (`console` and `agent`; see [`World::send_as`]).
#[derive(Debug)]
pub struct World {
    tx: Sender<Event>,
    console: ConsoleInbox,
    agent_box: Arc<Mailbox>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
    req: Mutex<u64>,
    /// Milliseconds since the epoch at open (part of request ids).
    run_id: u128,
    root: PathBuf,
    _lock: std::fs::File,
}

/// Creates an empty world in `dir`.
pub fn init(dir: &Path) -> anyhow::Result<()> {
    Layout::new(dir).init()?;
    Ok(())
}

impl World {
    /// Opens the world in `dir` (which must have been initialised), takes its
    /// lock and starts every actor whose desired state is running.
    pub fn open(dir: &Path, cfg: WorldConfig) -> anyhow::Result<World> {
        let layout = Layout::new(dir);
        if !layout.registry().exists() {
            bail!(
                "{} is not a world (no broker/registry.json); run `cairn world init {}` first",
                dir.display(),
                dir.display()
            );
        }
        layout.init()?;
        let lock = layout.lock()?;
        // The descriptor budget must fit under the process's open-file
        // limit, with room for the host's own files (journals, pipes).
        raise_open_files(u64::try_from(cfg.budget.descriptors).unwrap_or(u64::MAX).saturating_add(1024));
        let mut reg = layout.load_registry()?;
        // The last run may have handed out ids up to its reservation.
        reg.next_msg = reg.next_msg.max(reg.msg_reserved);
        let rt = Runtime::new(cfg.limits.fuel.is_some())?;
        let (tx, rx) = mpsc::channel();
        let (ctx, crx) = queue::inbox(CONSOLE, queue::CONSOLE_INBOX_BYTES);
        let (cctx, ccrx) = queue::inbox(CC, queue::CC_INBOX_BYTES);
        let agent_box = Arc::new(Mailbox::open(&layout.mailbox(AGENT))?);
        let cc_tx = tx.clone();
        let cc_layout = layout.clone();
        thread::Builder::new()
            .name("cc".into())
            .spawn(move || {
                crate::cc::run(cc_layout, ccrx, |(to, reply_to, body)| {
                    let msg = Outbound { to: Some(to), id: None, reply_to: Some(reply_to), body };
                    let _ = cc_tx.send(Event::Native { from: CC.into(), msg });
                });
            })
            .context("starting the cc thread")?;
        let (httx, htrx) = queue::inbox(HTTP, queue::HTTP_INBOX_BYTES);
        let http_tx = tx.clone();
        thread::Builder::new()
            .name("http".into())
            .spawn(move || {
                crate::http::run(htrx, move |(to, reply_to, body)| {
                    let msg = Outbound { to: Some(to), id: None, reply_to: Some(reply_to), body };
                    let _ = http_tx.send(Event::Native { from: HTTP.into(), msg });
                });
            })
            .context("starting the http thread")?;
        let mut b = Broker {
            layout,
            reg,
            rt,
            cfg,
            actors: HashMap::new(),
            tx: tx.clone(),
            natives: HashMap::from([(CONSOLE.to_owned(), ctx), (CC.to_owned(), cctx), (HTTP.to_owned(), httx)]),
            agent_box: agent_box.clone(),
            generation: 0,
            quitting: None,
            compiles: HashMap::new(),
            compiling: Arc::default(),
            abandoned: Default::default(),
            candidates: Default::default(),
            next_token: 0,
            probations: HashMap::new(),
        };
        let ids: Vec<String> = b.reg.actors.keys().cloned().collect();
        for id in &ids {
            b.ensure_rt(id)?;
            // Finishes what a host killed while deleting old versions
            // left, and applies this run's `versions_kept`.
            if let Err(e) = b.layout.sweep_pruned(id) {
                super::append_log(&b.layout.actor_dir(id).join("stderr.log"), &format!("deleting old versions: {e}"));
            }
            b.prune_versions(id);
        }
        let thread = thread::Builder::new()
            .name("broker".into())
            .spawn(move || {
                for id in ids {
                    if b.reg.actors.get(&id).is_some_and(|e| e.desired == Desired::Running) {
                        b.start_actor(&id, None);
                    }
                }
                b.run(rx);
            })
            .context("starting the broker thread")?;
        Ok(World {
            tx,
            console: ConsoleInbox { rx: Mutex::new(crx), held: Mutex::default(), changed: Condvar::new() },
            agent_box,
            thread: Mutex::new(Some(thread)),
            req: Mutex::new(0),
            run_id: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0),
            root: dir.to_owned(),
            _lock: lock,
        })
    }

    /// The world directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Sends a message from the console (`to: None` = the console's
    /// subscribers).
    pub fn send(&self, to: Option<&str>, id: Option<&str>, reply_to: Option<&str>, body: Value) {
        self.send_as(CONSOLE, to, id, reply_to, body);
    }

    /// Sends a message from a native participant (`console` or `agent`;
    /// anything else is sent as the console). The broker sets `from`.
    pub fn send_as(&self, from: &str, to: Option<&str>, id: Option<&str>, reply_to: Option<&str>, body: Value) {
        let from = if from == AGENT { AGENT } else { CONSOLE };
        let msg = Outbound {
            to: to.map(str::to_owned),
            id: id.map(str::to_owned),
            reply_to: reply_to.map(str::to_owned),
            body,
        };
        let _ = self.tx.send(Event::Native { from: from.into(), msg });
    }

    /// The next message addressed to the console, waiting up to `wait`.
    pub fn recv(&self, wait: Duration) -> Option<Inbound> {
        self.recv_as(CONSOLE, wait)
    }

    /// The next message addressed to a native participant (`console` or
    /// `agent`), waiting up to `wait`. For `agent` it leaves the durable
    /// mailbox (see [`World::agent_peek`] to keep it until handled).
    pub fn recv_as(&self, who: &str, wait: Duration) -> Option<Inbound> {
        if who == AGENT {
            let deadline = Instant::now() + wait;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                let line = self.agent_box.pop_wait(left)?;
                if let Ok(m) = serde_json::from_str(&line) {
                    return Some(m);
                }
            }
        }
        // Replies to the console's pending requests are theirs.
        self.console.take(wait, |m, pending| m.reply_to.as_ref().is_none_or(|r| !pending.contains(r)))
    }

    /// Sends a request to the broker as the console and waits (up to
    /// `wait`) for its reply; other messages arriving meanwhile stay queued
    /// for [`World::recv`].
    pub fn request(&self, body: Value, wait: Duration) -> anyhow::Result<Value> {
        self.request_as(CONSOLE, body, wait)
    }

    /// [`World::request`] for any native participant.
    pub fn request_as(&self, who: &str, body: Value, wait: Duration) -> anyhow::Result<Value> {
        let (reply, _) = self.ask_as(who, BROKER, body, wait)?;
        Ok(reply.body)
    }

    /// Sends `body` from native `who` to `to` with a fresh own id and waits
    /// up to `wait` for the message answering it (`reply_to` = its id).
    /// Returns the reply and the message id it answered; other messages
    /// stay queued for [`World::recv_as`].
    pub fn ask_as(&self, who: &str, to: &str, body: Value, wait: Duration) -> anyhow::Result<(Inbound, String)> {
        let who = if who == AGENT { AGENT } else { CONSOLE };
        let n = {
            let mut g = self.req.lock().unwrap_or_else(|p| p.into_inner());
            *g += 1;
            *g
        };
        // The run's start time keeps ids of this run apart from stale
        // replies to an earlier run still waiting in the agent's mailbox.
        let own = format!("req-{}-{n}", self.run_id);
        let full = format!("{who}/{own}");
        // A reply counts only from the participant asked: an actor that
        // learned (or guessed) this id cannot answer in another's name.
        // The broker's `undeliverable` is the one other answer (`from` is
        // set by the broker, so no actor can send one).
        let answers = |m: &Inbound| {
            m.reply_to.as_deref() == Some(full.as_str())
                && (m.from == to || (m.from == BROKER && m.body["type"] == "undeliverable"))
        };
        if who == AGENT {
            self.send_as(who, Some(to), Some(&own), None, body);
            // The agent's other messages stay in its durable mailbox.
            let (_, line) = self
                .agent_box
                .take_first(wait, |l| serde_json::from_str::<Inbound>(l).is_ok_and(|m| answers(&m)))
                .ok_or_else(|| anyhow!("no reply from {to} within {wait:?}"))?;
            let m = serde_json::from_str(&line)?;
            return Ok((m, full));
        }
        let set = |on: bool| {
            let mut h = self.console.held.lock().unwrap_or_else(|p| p.into_inner());
            if on {
                h.pending.insert(full.clone());
            } else {
                h.pending.remove(&full);
            }
        };
        // Pending before it is sent, so no other taker can take the reply.
        set(true);
        self.send_as(who, Some(to), Some(&own), None, body);
        let reply = self.console.take(wait, |m, _| answers(m));
        // A reply arriving after the wait gave up goes to `recv`.
        set(false);
        let m = reply.ok_or_else(|| anyhow!("no reply from {to} within {wait:?}"))?;
        Ok((m, full))
    }

    /// The oldest message waiting for the agent and its mailbox number,
    /// left in the (durable) mailbox until [`World::agent_done`]; waits up
    /// to `wait`. A line that is not a message is dropped.
    pub fn agent_peek(&self, wait: Duration) -> Option<(u64, Inbound)> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (n, line) = self.agent_box.peek_wait(left)?;
            match serde_json::from_str(&line) {
                Ok(m) => return Some((n, m)),
                Err(_) => {
                    self.agent_box.remove(n);
                }
            }
        }
    }

    /// Every message waiting for the agent, with its number, oldest first.
    pub fn agent_waiting(&self) -> Vec<(u64, Inbound)> {
        self.agent_box.entries().into_iter().filter_map(|(n, l)| Some((n, serde_json::from_str(&l).ok()?))).collect()
    }

    /// Removes message `n` from the agent's mailbox (handled).
    pub fn agent_done(&self, n: u64) {
        self.agent_box.remove(n);
    }

    /// Makes every later number of the agent's mailbox at least `n`.
    pub fn agent_reserve(&self, n: u64) -> anyhow::Result<()> {
        Ok(self.agent_box.reserve(n)?)
    }

    /// Stops every actor (shutdown, EOF, kill after 5 s) and the broker;
    /// later calls do nothing. Also done on drop.
    pub fn quit(&self) {
        let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        let (tx, rx) = mpsc::channel();
        let done =
            self.tx.send(Event::Quit(tx)).is_ok() && rx.recv_timeout(KILL_AFTER + Duration::from_secs(10)).is_ok();
        {
            // A guest stuck in a host call past its kill would block the
            // join forever: leave the broker thread behind instead.
            if done {
                let _ = t.join();
            }
        }
    }
}

/// Raises this process's soft open-file limit to `want` (at most the hard
/// limit) when it is lower; where it cannot, the budget's refusals still
/// hold each actor to its own cap.
fn raise_open_files(want: u64) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.quit();
    }
}
