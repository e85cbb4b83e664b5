//! The worker loop behind `cairn worker`: N threads, each claiming one
//! runnable session at a time, driving it with the normal turn until its
//! inbox is empty, and releasing it; a renewal thread keeps the held leases
//! alive; a watchdog thread stops a turn whose lease may be ending; idle
//! threads sleep on `LISTEN cairn_work` (woken by `submit` and `release`),
//! with a timeout no longer than the lease so that sessions of a dead worker
//! are found once their leases expire.
//!
//! It owns claiming, renewing, releasing and backing off, and stopping the
//! effects of a turn whose lease may be lost. What a turn is (provider,
//! tools, approver) is the host's [`Driver`]; the replay policies on
//! takeover are the core's `Session::resume`, exactly as a local resume.
//!
//! Partitions: each thread keeps one connection ([`crate::connect_for`]:
//! keepalives, an idle-in-transaction timeout of about the lease) for all
//! its claims, so a live worker never waits on another's connect. Each held
//! lease has a [`LeaseClock`] (last successful claim, renewal or commit,
//! counted from when it was sent, plus the lease); when less than
//! [`lease::safety_margin`] of it is left, the watchdog cancels the turn's
//! [`CancelToken`]: no tool starts, the running tool and provider call are
//! told to stop, and the session is handed back for another try. A commit
//! refused because the lease was lost makes the thread drop the session
//! without writing anything more and back off before claiming again.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conn::Connection;
use crate::lease::Fence;
use crate::lease::{self, Claim, LeaseClock, Release};
use crate::store::{PgStore, connect_for};
use cairn_core::storage::Storage;
use cairn_core::{CancelToken, Session, SessionConfig, TurnError};

/// What a host plugs into the worker: every face's host contract
/// (`cairn_host::SessionHost`: the settings of turns, the providers, undo),
/// and how to run a turn on a session of the database. A worker opens a
/// claimed session with the host's settings in the session's own working
/// directory (its header's `cwd`).
pub trait Driver: cairn_host::SessionHost {
    /// Run a turn on `prompt`, or resume the interrupted one (`None`).
    /// `cancel` is the turn's token: the worker cancels it when the lease
    /// may be ending, and the driver must hand it to the turn (`TurnEnv`)
    /// and to anything else that waits (an approval). The driver owns the
    /// session for the turn and gives it back ([`Driven`]): it may reopen
    /// it with the turn's own settings (the CLI records discovery's choice
    /// for the turn in the store first, then opens the session with the
    /// chosen skills).
    fn drive(&self, session: Session<PgStore>, prompt: Option<&str>, cancel: &CancelToken) -> Driven;
}

/// A turn driven, and the session given back.
pub struct Driven {
    /// The session after the turn; `None` when the driver could not reopen
    /// it (`result` says why).
    pub session: Option<Session<PgStore>>,
    /// How the turn ended.
    pub result: Result<(), TurnError>,
}

impl std::fmt::Debug for Driven {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driven")
            .field("session", &self.session.as_ref().map(|s| s.store().header().id.clone()))
            .field("result", &self.result)
            .finish()
    }
}

impl Driven {
    /// Run `turn` on `session` and give it back (a driver that does not
    /// reopen the session).
    pub fn by(
        mut session: Session<PgStore>,
        turn: impl FnOnce(&mut Session<PgStore>) -> Result<(), TurnError>,
    ) -> Self {
        let result = turn(&mut session);
        Self { session: Some(session), result }
    }
}

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// The database connection string (URL or key=value).
    pub url: String,
    /// Sessions driven at once.
    pub concurrency: usize,
    /// Lease length.
    pub lease: Duration,
    /// This worker's name (lease owner prefix); unique per process.
    pub name: String,
}

impl WorkerOptions {
    /// Defaults: one session at a time, 10 s leases, named host:pid.
    pub fn new(url: impl Into<String>) -> Self {
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        Self {
            url: url.into(),
            concurrency: 1,
            lease: crate::DEFAULT_LEASE,
            name: format!("{}:{}", host.trim(), std::process::id()),
        }
    }
}

/// A lease in hand: its fence, the flag set when a commit was refused, the
/// local deadline, and the turn's cancel token.
#[derive(Clone)]
struct Holding {
    fence: Fence,
    lost: Arc<AtomicBool>,
    clock: LeaseClock,
    cancel: CancelToken,
    /// Who asked to stop the turn (`cairn cancel`), seen by a renewal.
    cancelled_by: Arc<Mutex<Option<String>>>,
}

type Held = Arc<Mutex<HashMap<String, Holding>>>;

fn say(name: &str, text: &str) {
    let _ = writeln!(std::io::stderr(), "cairn worker {name}: {text}");
}

/// Run until `stop` is set (then finish the sessions in hand, release them
/// and return).
pub fn run(opts: &WorkerOptions, driver: Arc<dyn Driver>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    // Whole seconds or not, a lease past the range breaks the connections'
    // timeouts (and its arithmetic): refused before any thread starts.
    if opts.lease < Duration::from_millis(100) || opts.lease > Duration::from_secs(lease::MAX_LEASE_SECS) {
        anyhow::bail!(
            "a lease of {:?} is out of range: give 100 ms to {} s (a day)",
            opts.lease,
            lease::MAX_LEASE_SECS
        );
    }
    let held: Held = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    // In the registry `cairn workers` reads (best effort: a worker that
    // cannot register still drives sessions; its heartbeats register it).
    register(opts);
    let renewer = {
        let (opts, held, done, stop) = (opts.clone(), Arc::clone(&held), Arc::clone(&done), Arc::clone(&stop));
        std::thread::spawn(move || renew_loop(&opts, &held, &done, &stop))
    };
    let watchdog = {
        let (opts, held, done) = (opts.clone(), Arc::clone(&held), Arc::clone(&done));
        std::thread::spawn(move || watch_loop(&opts, &held, &done))
    };
    let threads: Vec<_> = (0..opts.concurrency.max(1))
        .map(|n| {
            let (opts, held, stop, driver) = (opts.clone(), Arc::clone(&held), Arc::clone(&stop), Arc::clone(&driver));
            std::thread::spawn(move || worker_thread(&opts, n, &*driver, &held, &stop))
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    done.store(true, Ordering::SeqCst);
    let _ = renewer.join();
    let _ = watchdog.join();
    if let Ok(c) = connect_for(&opts.url, opts.lease) {
        let _ = crate::fleet::stopped(&mut Connection::from(c), &opts.name);
    }
    Ok(())
}

fn register(opts: &WorkerOptions) {
    let (host, _) = opts.name.rsplit_once(':').unwrap_or((opts.name.as_str(), ""));
    let lease_ms = u64::try_from(opts.lease.as_millis()).unwrap_or(u64::MAX);
    let registration = crate::fleet::Registration {
        name: &opts.name,
        host,
        pid: std::process::id(),
        concurrency: opts.concurrency,
        lease_ms,
    };
    match connect_for(&opts.url, opts.lease) {
        Ok(mut c) => {
            if let Err(e) = crate::fleet::register(&mut c, &registration) {
                say(&opts.name, &format!("cannot register in cairn_workers ({e}); driving sessions anyway"));
            }
        }
        Err(e) => say(&opts.name, &format!("cannot register in cairn_workers ({e}); driving sessions anyway")),
    }
}

/// Record a lease loss for `cairn workers` (best effort: the database may
/// be what cut the worker off).
fn note_loss(opts: &WorkerOptions, client: Option<&mut Connection>, session: &str, epoch: i64, reason: &str) {
    let owner = &opts.name;
    match client {
        Some(c) => {
            let _ = crate::fleet::lost(c, owner, session, epoch, reason);
        }
        None => {
            if let Ok(mut c) = connect_for(&opts.url, opts.lease) {
                let _ = crate::fleet::lost(&mut c, owner, session, epoch, reason);
            }
        }
    }
}

fn held_now(held: &Held) -> Vec<(String, Holding)> {
    held.lock().map(|h| h.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default()
}

fn renew_loop(opts: &WorkerOptions, held: &Held, done: &AtomicBool, stop: &AtomicBool) {
    let mut client: Option<Connection> = None;
    let period = opts.lease / 3;
    // The registry's heartbeat: about once a second, and with every round
    // of renewals.
    let beat = period.min(Duration::from_secs(1));
    let mut last_renewal = Instant::now();
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(beat);
        let sessions = held_now(held);
        if client.as_ref().is_none_or(Connection::is_closed) {
            client = connect_for(&opts.url, opts.lease).ok().map(Connection::from);
        }
        let Some(c) = client.as_mut() else { continue };
        // A failed heartbeat never stops the renewals, unless the
        // connection itself is gone.
        if let Err(crate::PgError::Db(e)) =
            crate::fleet::heartbeat(c, &opts.name, sessions.len(), stop.load(Ordering::SeqCst))
            && crate::store::connection_lost(&e)
        {
            client = None;
            continue;
        }
        // The fleet's gauges, with each heartbeat; the queue is counted only
        // when telemetry exports it.
        if cairn_telemetry::enabled() {
            let waiting = crate::fleet::waiting(c).ok();
            cairn_telemetry::worker_gauges(&opts.name, sessions.len(), waiting);
        }
        if last_renewal.elapsed() < period || sessions.is_empty() {
            continue;
        }
        last_renewal = Instant::now();
        let mut broken = false;
        for (session, h) in sessions {
            let sent = Instant::now();
            match lease::renew_asking(c, &session, &h.fence) {
                Ok(lease::Renewed::Held) => h.clock.extend(sent),
                Ok(lease::Renewed::CancelRequested(by)) => {
                    h.clock.extend(sent);
                    if !h.cancel.is_cancelled() {
                        if let Ok(mut slot) = h.cancelled_by.lock() {
                            *slot = Some(by.clone());
                        }
                        h.cancel.cancel();
                        say(&h.fence.owner, &format!("{by} cancelled {}; stopping its turn", escape(&session)));
                    }
                }
                Ok(lease::Renewed::Lost) => {
                    h.lost.store(true, Ordering::SeqCst);
                    h.cancel.cancel();
                    say(
                        &h.fence.owner,
                        &format!("lease on {} (epoch {}) lost; stopping its turn", escape(&session), h.fence.epoch),
                    );
                }
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        if broken {
            client = None;
        }
    }
}

/// Cancels the turn of every held lease with less than the safety margin
/// left (the renewals failed: a partition, a stalled database). Runs apart
/// from the renewals, which may be stuck on a dead connection.
fn watch_loop(opts: &WorkerOptions, held: &Held, done: &AtomicBool) {
    let tick = (opts.lease / 20).clamp(Duration::from_millis(10), Duration::from_millis(100));
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        for (session, h) in held_now(held) {
            if h.clock.held_with_margin().is_err() && !h.cancel.is_cancelled() {
                h.cancel.cancel();
                say(
                    &h.fence.owner,
                    &format!(
                        "lease on {} (epoch {}) not renewed in time ({} ms or less left); cancelling its turn",
                        escape(&session),
                        h.fence.epoch,
                        h.clock.remaining().as_millis()
                    ),
                );
            }
        }
    }
}

/// A session id as it may be printed (control characters escaped).
fn escape(id: &str) -> String {
    id.chars().flat_map(char::escape_debug).collect()
}

/// A pseudo-random backoff (no rand dependency: time and thread).
fn backoff(base_ms: u64) -> Duration {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let jitter = (u64::from(nanos) ^ N.fetch_add(7919, Ordering::Relaxed)) % base_ms.max(1);
    Duration::from_millis(base_ms + jitter)
}

fn worker_thread(opts: &WorkerOptions, n: usize, driver: &dyn Driver, held: &Held, stop: &AtomicBool) {
    let owner = format!("{}/{n}", opts.name);
    // One connection for every claim of this thread (reconnected when it
    // breaks): the schema is checked once per connection, not per claim.
    let mut control: Option<Connection> = None;
    while !stop.load(Ordering::SeqCst) {
        if control.as_ref().is_none_or(Connection::is_closed) {
            control = None;
            match connect_for(&opts.url, opts.lease).and_then(|mut c| {
                lease::listen(&mut c)?;
                Ok(Connection::from(c))
            }) {
                Ok(c) => control = Some(c),
                Err(e) => {
                    say(&owner, &format!("cannot connect ({e}); retrying"));
                    std::thread::sleep(backoff(500));
                    continue;
                }
            }
        }
        let Some(c) = control.as_mut() else { continue };
        let sent = Instant::now();
        match lease::claim(c, &owner, opts.lease) {
            Ok(Some(claim)) => {
                let clock = LeaseClock::start(sent, opts.lease);
                if !drive_claim(opts, &owner, &mut control, claim, clock, driver, held, stop) {
                    // Lost the lease or the connection: back off before
                    // claiming again, so a live holder gets the session.
                    std::thread::sleep(backoff(opts.lease.as_millis().try_into().unwrap_or(1000) / 4));
                }
            }
            Ok(None) => {
                // Sleep until a submit or release notifies, or until the
                // first held lease ends (a dead worker sends no
                // notification; a few ms past it, so that it has ended by
                // the server's clock), at most half a lease.
                let wake = match lease::next_expiry(c) {
                    Ok(Some(left)) => (left + Duration::from_millis(20)).min(opts.lease / 2),
                    Ok(None) => opts.lease / 2,
                    Err(_) => {
                        control = None;
                        continue;
                    }
                };
                if lease::wait(c.client(), wake).is_err() {
                    control = None;
                }
            }
            Err(e) => {
                say(&owner, &format!("claim failed ({e}); reconnecting"));
                control = None;
                std::thread::sleep(backoff(300));
            }
        }
    }
}

/// How a claimed session's driving ended.
enum Ending {
    /// The inbox is empty: release as done.
    Done,
    /// Something failed (a turn error, a broken connection).
    Failed(String),
    /// The session's log does not open as a session (its turn data): it
    /// will not on the next try either.
    Unopenable(String),
}

#[allow(clippy::too_many_arguments)] // the worker thread's state, passed down as it is
/// Drive one claimed session until its inbox is empty, on the thread's
/// connection (`control`, put back when still usable). False when the
/// thread should back off (lease lost, connection lost).
fn drive_claim(
    opts: &WorkerOptions,
    owner: &str,
    control: &mut Option<Connection>,
    claim: Claim,
    clock: LeaseClock,
    driver: &dyn Driver,
    held: &Held,
    stop: &AtomicBool,
) -> bool {
    let Claim { session: id, fence } = claim;
    let shown = escape(&id);
    say(owner, &format!("claimed {shown} (epoch {})", fence.epoch));
    let Some(client) = control.take() else { return false };
    // A session that does not open (corrupt rows, a newer version) will not
    // open on the next try either: it is marked failed, with why.
    let mut store = match PgStore::open_fenced_on(client, &id, fence.clone()) {
        Ok(s) => s,
        Err(e) => {
            let transient = matches!(e, cairn_core::storage::StorageError::Backend { .. });
            let how = if transient { Release::Retry } else { Release::Failed };
            let text = e.to_string();
            say(owner, &format!("cannot open {shown}: {text}; released as {how:?}"));
            release_fresh(opts, &id, &fence, how, Some(&text));
            return !transient;
        }
    };
    let cancel = CancelToken::new();
    // The claim was committed without waiting for its flush: the store
    // makes it durable before any effect (`lease::claim`).
    store.set_claim_unsynced();
    store.set_lease_clock(clock.clone());
    store.set_cancel(cancel.clone());
    store.set_reconnect(opts.url.clone(), opts.lease);
    let lost = store.lease_lost();
    let slot = store.inbox_slot();
    let cancelled_by: Arc<Mutex<Option<String>>> = Arc::default();
    if let Ok(mut h) = held.lock() {
        h.insert(
            id.clone(),
            Holding {
                fence: fence.clone(),
                lost: Arc::clone(&lost),
                clock: clock.clone(),
                cancel: cancel.clone(),
                cancelled_by: Arc::clone(&cancelled_by),
            },
        );
    }
    let config = SessionConfig { cwd: Some(std::path::PathBuf::from(&store.header().cwd)), ..driver.session_config() };
    let mut back: Option<Connection> = None;
    let ending = match Session::open(store, config) {
        Err(e) => Ending::Unopenable(e.to_string()),
        Ok(session) => {
            // A turn left unfinished is another worker's, taken over.
            cairn_telemetry::worker_claimed(&id, owner, fence.epoch, session.needs_resume());
            let (ending, session) = drive_session(owner, &id, session, driver, &cancel, &lost, &slot, stop);
            back = session.map(|s| s.into_store().into_connection());
            ending
        }
    };
    if let Ok(mut h) = held.lock() {
        h.remove(&id);
    }
    cairn_telemetry::worker_released(&id);
    let mut client = back.filter(|c| !c.is_closed());
    let by = cancelled_by.lock().ok().and_then(|b| b.clone());
    let ok = match ending {
        Ending::Failed(_) if by.is_some() && !lost.load(Ordering::SeqCst) => {
            // An operator's `cairn cancel`: its prompts dropped, idle.
            let note = format!("cancelled by {}", by.as_deref().unwrap_or("an operator"));
            let released = match client.as_mut() {
                Some(c) => lease::release(c, &id, &fence, Release::Cancelled, Some(&note)).unwrap_or(false),
                None => release_fresh(opts, &id, &fence, Release::Cancelled, Some(&note)),
            };
            say(
                owner,
                &format!(
                    "turn on {shown} stopped: {note}; {}",
                    if released { "released as idle" } else { "lease left to expire" }
                ),
            );
            true
        }
        Ending::Done => {
            let released = client.as_mut().map(|c| lease::release(c, &id, &fence, Release::Done, None));
            match released {
                Some(Ok(_)) => say(owner, &format!("released {shown}")),
                _ => {
                    client = None;
                    if release_fresh(opts, &id, &fence, Release::Done, None) {
                        say(owner, &format!("released {shown} (on a new connection)"));
                    } else {
                        say(owner, &format!("finished {shown} but could not release it; its lease will expire"));
                    }
                }
            }
            true
        }
        Ending::Unopenable(e) => {
            let released = release_fresh(opts, &id, &fence, Release::Failed, Some(&e));
            say(
                owner,
                &format!(
                    "cannot open {shown} as a session: {e}; {}",
                    if released { "released as Failed" } else { "lease left to expire" }
                ),
            );
            true
        }
        Ending::Failed(e) if lost.load(Ordering::SeqCst) => {
            say(owner, &format!("lease lost on {shown} (epoch {}): commit refused; backing off", fence.epoch));
            note_loss(opts, client.as_mut(), &id, fence.epoch, &format!("lease lost: {e}"));
            cairn_telemetry::lease_lost(&id, owner, fence.epoch, "lost");
            false
        }
        Ending::Failed(e) if cancel.is_cancelled() => {
            // The lease may be ending (renewals failed): hand the session
            // back for another try if we still can; otherwise it expires.
            let released =
                client.as_mut().is_some_and(|c| lease::release(c, &id, &fence, Release::Retry, Some(&e)).is_ok());
            note_loss(opts, client.as_mut(), &id, fence.epoch, &format!("lease not renewed in time: {e}"));
            cairn_telemetry::lease_lost(&id, owner, fence.epoch, "notRenewed");
            say(
                owner,
                &format!(
                    "turn on {shown} stopped: {e}; {}",
                    if released { "released for another try" } else { "lease left to expire" }
                ),
            );
            false
        }
        Ending::Failed(e) => {
            // A connection error is worth another try by anyone; anything
            // else marks the session failed with the reason.
            // (A restart cuts every connection: "terminating connection",
            // "connection closed", "error communicating with the server".)
            let broken = client.is_none()
                || e.contains("connection")
                || e.contains("communicating")
                || e.contains("closed")
                || e.contains("SQLSTATE 57P")
                || e.contains("SQLSTATE 08");
            // Insufficient resources (a full disk, out of memory, too many
            // connections) and system errors pass: tried again after a
            // backoff, a few times, then failed (`cairn requeue` after).
            let transient = e.contains("SQLSTATE 53") || e.contains("SQLSTATE 58");
            let how = if broken {
                Release::Retry
            } else if transient {
                Release::Transient
            } else {
                Release::Failed
            };
            let released = match client.as_mut() {
                Some(c) if !broken => lease::release(c, &id, &fence, how, Some(&e)).unwrap_or(false),
                _ => release_fresh(opts, &id, &fence, how, Some(&e)),
            };
            say(
                owner,
                &format!(
                    "turn on {shown} failed: {e}; {}",
                    if released { format!("released as {how:?}") } else { "lease left to expire".to_owned() }
                ),
            );
            !broken
        }
    };
    *control = client;
    ok
}

/// Release over a new connection (the thread's own is gone).
fn release_fresh(opts: &WorkerOptions, id: &str, fence: &Fence, how: Release, note: Option<&str>) -> bool {
    match connect_for(&opts.url, opts.lease) {
        Ok(mut c) => lease::release(&mut c, id, fence, how, note).unwrap_or(false),
        Err(_) => false,
    }
}

#[allow(clippy::too_many_arguments)] // the claim's state, passed down as it is
/// Drive `session`'s interrupted turn and queued prompts until none is
/// left or the lease may be ending; the session is given back unless a
/// driver could not reopen it.
fn drive_session(
    owner: &str,
    id: &str,
    mut session: Session<PgStore>,
    driver: &dyn Driver,
    cancel: &CancelToken,
    lost: &AtomicBool,
    slot: &Mutex<Option<i64>>,
    stop: &AtomicBool,
) -> (Ending, Option<Session<PgStore>>) {
    let stopped = || {
        if lost.load(Ordering::SeqCst) {
            Some(Ending::Failed("lease lost".to_owned()))
        } else if cancel.is_cancelled() {
            Some(Ending::Failed("the lease was not renewed in time; the turn was cancelled".to_owned()))
        } else {
            None
        }
    };
    // One turn through the driver: the session given back, or how driving
    // it ends (with the session, unless the driver could not reopen it).
    enum Next {
        Go(Session<PgStore>),
        End(Ending, Option<Session<PgStore>>),
    }
    let drive = |session: Session<PgStore>, prompt: Option<&str>| match driver.drive(session, prompt, cancel) {
        Driven { session: Some(back), result: Ok(()) } => Next::Go(back),
        Driven { session: back, result: Err(e) } => Next::End(stopped().unwrap_or(Ending::Failed(e.to_string())), back),
        Driven { session: None, result: Ok(()) } => {
            Next::End(stopped().unwrap_or(Ending::Failed("the session could not be reopened".to_owned())), None)
        }
    };
    if session.needs_resume() {
        say(owner, &format!("resuming the interrupted turn of {}", escape(id)));
        session = match drive(session, None) {
            Next::Go(back) => back,
            Next::End(end, back) => return (end, back),
        };
    }
    loop {
        if let Some(end) = stopped() {
            return (end, Some(session));
        }
        if stop.load(Ordering::SeqCst) {
            // Draining: the running turn is finished; the prompts still
            // waiting go to another worker (released as queued).
            return (Ending::Done, Some(session));
        }
        let next = match session.store().next_prompt() {
            Ok(next) => next,
            Err(e) => return (Ending::Failed(e.to_string()), Some(session)),
        };
        let Some((inbox, prompt)) = next else { return (Ending::Done, Some(session)) };
        if let Ok(mut s) = slot.lock() {
            *s = Some(inbox);
        }
        session = match drive(session, Some(&prompt)) {
            Next::Go(back) => back,
            Next::End(end, back) => return (end, back),
        };
        if let Some(end) = stopped() {
            return (end, Some(session));
        }
        if slot.lock().map(|s| s.is_some()).unwrap_or(true) {
            return (
                Ending::Failed(format!("the turn on inbox row {inbox} ended without committing anything")),
                Some(session),
            );
        }
    }
}
