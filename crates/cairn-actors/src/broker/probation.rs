//! The live check after an upgrade (issue 48.7): a version that passed its
//! transcripts goes live, and its first answers are held by the broker
//! until each is judged against the old version's answer to the same
//! messages (the old version runs in shadow on copies of the snapshot the
//! swap took, fed what the new one reads, its lines never routed) and the
//! transcripts' expectations (`transcript::judge`). An accepted answer is
//! routed; the first one refused is dropped with everything the new
//! version wrote after it, the version is rolled back, and the world's
//! journal and the console are told. Owns the probation state and the
//! shadow's thread only; the rollback itself is `Broker::rollback`.
//!
//! Bounds: the answers held wait in the instance's stdout gate (their
//! credit is held, so a guest writing more waits in its `write`); an
//! answer neither the old version gave nor the transcripts describe waits
//! at most [`EXPECT_WAIT`] for the shadow before it is refused; the
//! shadow's feed holds at most [`FEED_LINES`] messages and its answers
//! kept at most [`OLD_ANSWERS`] (past the feed the shadow is given up, and
//! the check ends unfinished, as when the shadow crashes: nothing is left
//! to compare with); the shadow counts in the world's budgets as the
//! upgrade's candidate did (its reservation is kept until the check ends).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;
use wasmtime::component::Component;

use super::{AfterStop, Broker, Event, append_log, now_ms};
use crate::layout::copy_tree;
use crate::message::{BROKER, CONSOLE, Inbound, Outbound};
use crate::queue::Ticket;
use crate::runtime::{self, Dirs, Exit};
use crate::transcript::{self, EXPECT_WAIT, Expectation, Verdict};

/// Answers of a new version checked by default
/// ([`super::WorldConfig::live_checks`]).
pub const LIVE_CHECKS: usize = 3;
/// Messages the shadow's feed holds before the shadow is given up.
pub const FEED_LINES: usize = 64;
/// The shadow's answers kept for comparison (the oldest go first).
pub const OLD_ANSWERS: usize = 256;

/// The live writer's handle on the shadow's feed: every message written
/// to the new version is offered to it while it is `Some`. The probation
/// empties it when the check ends, which ends the shadow.
pub(super) type Feed = Arc<Mutex<Option<SyncSender<String>>>>;

/// Offers a message the new version read to its shadow; a full feed gives
/// the shadow up (its later answers could no longer be compared in order).
pub(super) fn offer(feed: &Feed, line: &str) {
    let mut g = feed.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(tx) = g.as_ref()
        && tx.try_send(line.to_owned()).is_err()
    {
        g.take();
    }
}

/// How a live check ended.
enum Outcome {
    /// Its answers were accepted.
    Passed,
    /// Its instance ended first (a crash: the crash-loop watch goes on).
    Ended,
    /// The old version's shadow ended (it crashed on a message, or fell
    /// behind): nothing is left to compare with.
    ShadowEnded,
    /// An answer was refused; `dropped` lines were not routed.
    Refused { why: String, dropped: usize },
}

/// One line the new version wrote, held until judged.
pub(super) struct Held {
    line: String,
    _credit: Ticket,
}

/// An actor's live check, from the swap until its answers are checked,
/// one is refused, or its instance ends.
pub(super) struct Probation {
    /// The new version's instance being watched.
    generation: u64,
    version: u32,
    prev: u32,
    requester: String,
    /// The upgrade's key in `Broker::candidates` (the shadow's budget).
    pub(super) candidate: u64,
    /// Answers still to judge.
    left: usize,
    checked: usize,
    expects: Vec<Expectation>,
    held: VecDeque<Held>,
    /// When the first held answer began waiting for the shadow's.
    waiting: Option<Instant>,
    /// The shadow's answers not yet compared, in order.
    old: VecDeque<Outbound>,
    feed: Feed,
    /// An answer was refused: everything else of this instance is dropped
    /// until it ends (the rollback stops it).
    refused: bool,
    /// The shadow's key in its events (a later probation's shadow is
    /// another).
    token: u64,
}

impl Broker {
    /// Starts the live check of `id`, just swapped from `prev` to
    /// `version` (whose transcripts hold `expects`), before its instance
    /// starts: the shadow of `prev` and the feed the new instance's writer
    /// offers every message to.
    pub(super) fn start_probation(
        &mut self,
        id: &str,
        version: u32,
        prev: u32,
        requester: &str,
        candidate: u64,
        expects: Vec<Expectation>,
    ) {
        let (ftx, frx) = mpsc::sync_channel::<String>(FEED_LINES);
        let feed: Feed = Arc::new(Mutex::new(Some(ftx)));
        self.next_token += 1;
        let token = self.next_token;
        // Always compiled after a swap from a running version; a version
        // not compiled in this run is not shadowed (the check is skipped,
        // and the journal says so).
        let started = self.actors.get(id).and_then(|a| a.components.get(&prev)).cloned().map(|c| {
            let s = ShadowRun {
                rt: self.rt.clone(),
                component: c,
                snapshot: self.layout.version(id, prev).join("snapshot"),
                scratch: self.layout.root().join("broker").join("shadows").join(id),
                actor_root: self.layout.actor_root(),
                limits: self.limits_of(id),
                log: self.layout.actor_dir(id).join("stderr.log"),
                id: id.to_owned(),
                token,
                events: self.tx.clone(),
            };
            thread::Builder::new().name("actor-shadow".into()).spawn(move || s.run(frx)).is_ok()
        });
        if started != Some(true) {
            self.candidates.remove(&candidate);
            self.journal(json!({"type": "live_check", "id": id, "version": version, "prev": prev,
                "result": "not checked: the old version could not run in shadow", "answers_checked": 0}));
            return;
        }
        if let Some(a) = self.actors.get_mut(id) {
            a.feed = Some(feed.clone());
        }
        self.probations.insert(
            id.to_owned(),
            Probation {
                generation: 0,
                version,
                prev,
                requester: requester.to_owned(),
                candidate,
                left: self.cfg.live_checks,
                checked: 0,
                expects,
                held: VecDeque::new(),
                waiting: None,
                old: VecDeque::new(),
                feed,
                refused: false,
                token,
            },
        );
    }

    /// The instance the probation watches started (generation known).
    pub(super) fn probation_started(&mut self, id: &str, generation: u64) {
        if let Some(p) = self.probations.get_mut(id)
            && p.generation == 0
        {
            p.generation = generation;
        }
    }

    /// A line of `id`'s instance `generation`: `None` if the live check
    /// took it (held or dropped), else the line back to be routed now.
    pub(super) fn probation_line(
        &mut self,
        id: &str,
        generation: u64,
        line: String,
        credit: Ticket,
    ) -> Option<(String, Ticket)> {
        let Some(p) = self.probations.get_mut(id).filter(|p| p.generation == generation) else {
            return Some((line, credit));
        };
        if p.refused {
            append_log(
                &self.layout.actor_dir(id).join("stderr.log"),
                &format!("dropped (version {} was refused by its live check): {line}", p.version),
            );
            return None;
        }
        if p.held.is_empty() {
            p.waiting = Some(Instant::now());
        }
        p.held.push_back(Held { line, _credit: credit });
        self.probation_step(id, false);
        None
    }

    /// A line of the shadow (the old version), or its end (`None`): the
    /// check ends there (nothing is left to compare with), what it holds
    /// routed once judged by what the shadow gave.
    pub(super) fn shadow_line(&mut self, id: &str, token: u64, line: Option<String>) {
        let Some(p) = self.probations.get_mut(id).filter(|p| p.token == token && !p.refused) else { return };
        match line {
            Some(l) => {
                if let Ok(m) = Outbound::parse(&l)
                    && m.to.as_deref() != Some(BROKER)
                {
                    if p.old.len() >= OLD_ANSWERS {
                        p.old.pop_front();
                    }
                    p.old.push_back(m);
                }
                self.probation_step(id, false);
            }
            None => {
                self.probation_step(id, false);
                if self.probations.get(id).is_some_and(|p| p.token == token && !p.refused) {
                    self.end_probation(id, Outcome::ShadowEnded);
                }
            }
        }
    }

    /// Held answers whose shadow answer is late (every tick).
    pub(super) fn probation_ticks(&mut self) {
        let due: Vec<String> = self
            .probations
            .iter()
            .filter(|(_, p)| p.waiting.is_some_and(|t| t.elapsed() >= EXPECT_WAIT))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            self.probation_step(&id, false);
        }
    }

    /// The watched instance ended (crash, stop): what it still holds is
    /// judged with what the shadow gave, then the check ends. A refused
    /// one is forgotten (its rollback goes on).
    pub(super) fn probation_exited(&mut self, id: &str, generation: u64) {
        let Some(p) = self.probations.get_mut(id).filter(|p| p.generation == generation) else { return };
        if p.refused {
            self.probations.remove(id);
            return;
        }
        self.probation_step(id, true);
        match self.probations.get(id) {
            // Refused by what it held at its end: the rollback waits in
            // `after_stop`.
            Some(p) if p.generation == generation && p.refused => {
                self.probations.remove(id);
            }
            Some(p) if p.generation == generation => self.end_probation(id, Outcome::Ended),
            _ => {}
        }
    }

    /// Judges held answers in order while each can be judged: one the
    /// old version also gave, or one the transcripts describe, at once;
    /// any other once the shadow can no longer explain it (`settle`: the
    /// new instance ended; or [`EXPECT_WAIT`] after it was held).
    fn probation_step(&mut self, id: &str, settle: bool) {
        loop {
            let Some(p) = self.probations.get_mut(id) else { return };
            if p.refused {
                return;
            }
            let Some(h) = p.held.front() else {
                p.waiting = None;
                return;
            };
            let verdict = match Outbound::parse(&h.line) {
                // Requests to the broker are not answers, and a line that
                // is not a message is noted and dropped as always: both
                // pass on in order.
                Ok(m) if m.to.as_deref() != Some(BROKER) && p.left > 0 => {
                    Some(transcript::judge(&m, p.old.make_contiguous(), &p.expects))
                }
                _ => None,
            };
            let late = settle || p.waiting.is_some_and(|t| t.elapsed() >= EXPECT_WAIT);
            match verdict {
                None => {}
                Some(Verdict::Same(i)) => {
                    p.old.remove(i);
                    p.left -= 1;
                    p.checked += 1;
                }
                Some(Verdict::Described) => {
                    p.left -= 1;
                    p.checked += 1;
                }
                // The shadow may still give it.
                Some(Verdict::Unexplained(_)) if !late => return,
                Some(Verdict::Unexplained(why)) => {
                    let dropped = p.held.len();
                    p.held.clear();
                    p.refused = true;
                    p.waiting = None;
                    self.end_probation(id, Outcome::Refused { why, dropped });
                    return;
                }
            }
            let h = p.held.pop_front();
            p.waiting = (!p.held.is_empty()).then(Instant::now);
            let passed = p.left == 0;
            if let Some(h) = h {
                self.route_line(id, h.line);
            }
            if passed {
                self.end_probation(id, Outcome::Passed);
            }
        }
    }

    /// Ends the check: passed or ended with its instance (the rest of
    /// what it held is routed) or refused (the rollback starts). The shadow
    /// ends either way and its budget is released; the journal records the
    /// outcome.
    fn end_probation(&mut self, id: &str, outcome: Outcome) {
        let Some(p) = self.probations.get_mut(id) else { return };
        p.feed.lock().unwrap_or_else(|q| q.into_inner()).take();
        self.candidates.remove(&p.candidate);
        if let Some(a) = self.actors.get_mut(id) {
            a.feed = None;
        }
        let (version, prev, checked, requester) = (p.version, p.prev, p.checked, p.requester.clone());
        let (why, dropped) = match outcome {
            Outcome::Refused { why, dropped } => (why, dropped),
            Outcome::Passed | Outcome::Ended | Outcome::ShadowEnded => {
                let result = match outcome {
                    Outcome::Passed => "passed",
                    Outcome::Ended => "unfinished: the new version's instance ended",
                    _ => "unfinished: the old version's shadow ended (it crashed or fell behind)",
                };
                let Some(p) = self.probations.remove(id) else { return };
                self.journal(json!({"type": "live_check", "id": id, "version": version, "prev": prev,
                    "result": result, "answers_checked": checked}));
                for h in p.held {
                    self.route_line(id, h.line);
                }
                return;
            }
        };
        // Kept (refused) until the instance ends, so its later lines drop.
        let reason = format!(
            "live check of version {version}: answer {} {why}; {dropped} line(s) of it dropped, not routed",
            checked + 1
        );
        append_log(&self.layout.actor_dir(id).join("stderr.log"), &reason);
        let rollback =
            AfterStop::Rollback { to: prev, requester: requester.clone(), req_id: None, reason: reason.clone() };
        // A stop, remove or upgrade asked for meanwhile goes first (its
        // requester waits for its answer); the journal says so.
        let pending = self.actors.get(id).is_some_and(|a| a.after_stop.is_some());
        match self.actors.get_mut(id) {
            Some(a) if !pending => match &a.live {
                Some(live) => {
                    // No more messages to the refused version: the rest
                    // wait in the mailbox for the old one.
                    live.writer_done.store(true, Ordering::SeqCst);
                    self.after_stop(id, rollback);
                }
                // Its instance just ended (`exited` takes this next).
                None => a.after_stop = Some(rollback),
            },
            _ => {}
        }
        self.journal(json!({"type": "live_check", "id": id, "version": version, "prev": prev,
            "result": "refused", "answers_checked": checked, "reason": reason,
            "rollback_to": prev, "rolled_back": !pending}));
        if requester != CONSOLE {
            let mid = self.new_id(BROKER, None);
            let body = json!({"type": "rolled_back", "id": id, "from": version, "to": prev, "reason": reason});
            let _ = self.deliver(CONSOLE, Inbound { id: mid, from: BROKER.into(), reply_to: None, body });
        }
    }

    /// Routes a stdout line as `handle` does.
    pub(super) fn route_line(&mut self, id: &str, line: String) {
        match Outbound::parse(&line) {
            Ok(msg) => self.route(id, msg),
            Err(e) => {
                append_log(&self.layout.actor_dir(id).join("stderr.log"), &format!("dropped stdout line: {e}: {line}"))
            }
        }
    }

    /// Appends an event to the world's journal (`broker/journal.jsonl`,
    /// capped and rotated like `stderr.log`).
    pub(super) fn journal(&self, mut entry: serde_json::Value) {
        if let Some(o) = entry.as_object_mut() {
            o.insert("time_ms".into(), json!(now_ms()));
        }
        let mut line = entry.to_string();
        line.push('\n');
        if let Err(e) = runtime::append_log_bytes(&self.layout.journal(), line.as_bytes()) {
            eprintln!("cairn-actors: writing the world's journal failed: {e}");
        }
    }
}

/// The old version in shadow: copies of its snapshot, fed the messages
/// the new version reads, its lines sent to the broker as
/// `Event::Shadow` (never routed), no HTTP (it is never routed at all).
struct ShadowRun {
    rt: runtime::Runtime,
    component: Component,
    snapshot: PathBuf,
    scratch: PathBuf,
    actor_root: PathBuf,
    limits: runtime::Limits,
    log: PathBuf,
    id: String,
    token: u64,
    events: mpsc::Sender<Event>,
}

impl ShadowRun {
    fn run(self, feed: mpsc::Receiver<String>) {
        let ShadowRun { rt, component, snapshot, scratch, actor_root, limits, log, id, token, events } = self;
        let gone = |events: &mpsc::Sender<Event>| {
            let _ = events.send(Event::Shadow { id: id.clone(), token, line: None });
        };
        let _ = std::fs::remove_dir_all(&scratch);
        let dirs = Dirs { data: scratch.join("data"), public: scratch.join("public"), actor_root };
        let copied = copy_tree(&snapshot.join("data"), &dirs.data)
            .and_then(|()| copy_tree(&snapshot.join("public"), &dirs.public));
        if let Err(e) = copied {
            append_log(
                &log,
                &format!("live check: the old version's shadow did not start (copying its snapshot: {e})"),
            );
            let _ = std::fs::remove_dir_all(&scratch);
            return gone(&events);
        }
        let (xtx, xrx) = mpsc::channel::<Exit>();
        let (ev, id2) = (events.clone(), id.clone());
        let inst = runtime::start(
            &rt,
            &component,
            &dirs,
            &scratch.join("stderr.log"),
            limits,
            move |l| {
                let _ = ev.send(Event::Shadow { id: id2.clone(), token, line: Some(l) });
            },
            move |e| {
                let _ = xtx.send(e);
            },
        );
        let inst = match inst {
            Ok(i) => i,
            Err(e) => {
                append_log(&log, &format!("live check: the old version's shadow did not start: {e:#}"));
                let _ = std::fs::remove_dir_all(&scratch);
                return gone(&events);
            }
        };
        let mut ended = false;
        loop {
            if xrx.try_recv().is_ok() {
                ended = true;
                break;
            }
            match feed.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    if inst.write_line(&line, EXPECT_WAIT).is_err() {
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        // The check is over (or the shadow fell behind): no commit of its
        // copies matters, so it is killed, not stopped.
        inst.close_stdin();
        inst.kill.store(true, Ordering::SeqCst);
        if !ended {
            let _ = xrx.recv_timeout(Duration::from_secs(10));
        }
        let _ = std::fs::remove_dir_all(&scratch);
        gone(&events);
    }
}
