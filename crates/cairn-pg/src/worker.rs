//! The worker loop behind `cairn worker`: N threads, each claiming one
//! runnable session at a time, driving it with the normal turn until its
//! inbox is empty, and releasing it; a renewal thread keeps the held leases
//! alive; idle threads sleep on `LISTEN cairn_work` (woken by `submit` and
//! `release`), with a timeout no longer than the lease so that sessions of
//! a dead worker are found once their leases expire.
//!
//! It owns claiming, renewing, releasing and backing off. What a turn is
//! (provider, tools, approver) is the host's [`Driver`]; the replay policies
//! on takeover are the core's `Session::resume`, exactly as a local resume.
//! A commit refused because the lease was lost makes the thread drop the
//! session without writing anything more and back off before claiming again.

use std::collections::HashMap;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::storage::{Header, Storage};
use cairn_core::{Session, SessionConfig, TurnError};
use postgres::Client;

use crate::lease::{self, Claim, Release};
use crate::store::{Fence, PgStore, connect};

/// What a host plugs into the worker: how to run a turn on a session.
pub trait Driver: Send + Sync {
    /// The session settings for a session with this header.
    fn session_config(&self, header: &Header) -> SessionConfig;

    /// Run a turn on `prompt`, or resume the interrupted one (`None`).
    fn drive(&self, session: &mut Session<PgStore>, prompt: Option<&str>) -> Result<(), TurnError>;
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
            lease: Duration::from_secs(10),
            name: format!("{}:{}", host.trim(), std::process::id()),
        }
    }
}

type Held = Arc<Mutex<HashMap<String, (Fence, Arc<AtomicBool>)>>>;

fn say(name: &str, text: &str) {
    let _ = writeln!(std::io::stderr(), "cairn worker {name}: {text}");
}

/// Run until `stop` is set (then finish the sessions in hand, release them
/// and return).
pub fn run(opts: &WorkerOptions, driver: Arc<dyn Driver>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let held: Held = Arc::default();
    let renewer = {
        let (opts, held, stop) = (opts.clone(), Arc::clone(&held), Arc::clone(&stop));
        std::thread::spawn(move || renew_loop(&opts, &held, &stop))
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
    stop.store(true, Ordering::SeqCst);
    let _ = renewer.join();
    Ok(())
}

fn renew_loop(opts: &WorkerOptions, held: &Held, stop: &AtomicBool) {
    let mut client: Option<Client> = None;
    let period = opts.lease / 3;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(period);
        let sessions: Vec<_> = held
            .lock()
            .map(|h| h.iter().map(|(k, (f, l))| (k.clone(), f.clone(), Arc::clone(l))).collect())
            .unwrap_or_default();
        if sessions.is_empty() {
            continue;
        }
        if client.as_ref().is_none_or(Client::is_closed) {
            client = connect(&opts.url).ok();
        }
        let Some(c) = client.as_mut() else { continue };
        let mut broken = false;
        for (session, fence, lost) in sessions {
            match lease::renew(c, &session, &fence) {
                Ok(true) => {}
                Ok(false) => {
                    lost.store(true, Ordering::SeqCst);
                    say(
                        &fence.owner,
                        &format!(
                            "lease on {session} (epoch {}) lost; its turn will stop at its next commit",
                            fence.epoch
                        ),
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
    let mut control: Option<Client> = None;
    while !stop.load(Ordering::SeqCst) {
        if control.as_ref().is_none_or(Client::is_closed) {
            match connect(&opts.url).and_then(|mut c| {
                lease::listen(&mut c)?;
                Ok(c)
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
        match lease::claim(c, &owner, opts.lease) {
            Ok(Some(claim)) => {
                if !drive_claim(opts, &owner, c, claim, driver, held) {
                    // Lost the lease or the connection: back off before
                    // claiming again, so a live holder gets the session.
                    std::thread::sleep(backoff(opts.lease.as_millis().try_into().unwrap_or(1000) / 4));
                }
            }
            Ok(None) => {
                // Sleep until a submit or release notifies, or until a lease
                // may have expired (a dead worker sends no notification).
                if lease::wait(c, opts.lease / 2).is_err() {
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

/// Drive one claimed session until its inbox is empty. False when the thread
/// should back off (lease lost, connection lost).
fn drive_claim(
    opts: &WorkerOptions,
    owner: &str,
    control: &mut Client,
    claim: Claim,
    driver: &dyn Driver,
    held: &Held,
) -> bool {
    let Claim { session: id, fence } = claim;
    say(owner, &format!("claimed {id} (epoch {})", fence.epoch));
    let store = match connect(&opts.url) {
        Err(e) => Err((e.to_string(), true)),
        // A session that does not open (corrupt rows, a newer version) will
        // not open on the next try either: it is marked failed, with why.
        Ok(c) => PgStore::open_fenced(c, &id, fence.clone())
            .map_err(|e| (e.to_string(), matches!(e, cairn_core::storage::StorageError::Backend { .. }))),
    };
    let store = match store {
        Ok(s) => s,
        Err((e, transient)) => {
            let how = if transient { Release::Retry } else { Release::Failed };
            say(owner, &format!("cannot open {id}: {e}; released as {how:?}"));
            let _ = lease::release(control, &id, &fence, how, Some(&e));
            return !transient;
        }
    };
    let lost = store.lease_lost();
    let slot = store.inbox_slot();
    if let Ok(mut h) = held.lock() {
        h.insert(id.clone(), (fence.clone(), Arc::clone(&lost)));
    }
    let config = driver.session_config(store.header());
    let result = (|| -> Result<(), String> {
        let mut session = Session::open(store, config).map_err(|e| e.to_string())?;
        if session.needs_resume() {
            say(owner, &format!("resuming the interrupted turn of {id}"));
            driver.drive(&mut session, None).map_err(|e| e.to_string())?;
        }
        loop {
            if lost.load(Ordering::SeqCst) {
                return Err("lease lost".to_owned());
            }
            let next = lease::next_prompt(control, &id).map_err(|e| e.to_string())?;
            let Some((inbox, prompt)) = next else { return Ok(()) };
            if let Ok(mut s) = slot.lock() {
                *s = Some(inbox);
            }
            driver.drive(&mut session, Some(&prompt)).map_err(|e| e.to_string())?;
            if slot.lock().map(|s| s.is_some()).unwrap_or(true) {
                return Err(format!("the turn on inbox row {inbox} ended without committing anything"));
            }
        }
    })();
    if let Ok(mut h) = held.lock() {
        h.remove(&id);
    }
    match result {
        Ok(()) => {
            let _ = lease::release(control, &id, &fence, Release::Done, None);
            say(owner, &format!("released {id}"));
            true
        }
        Err(_) if lost.load(Ordering::SeqCst) => {
            say(owner, &format!("lease lost on {id} (epoch {}): commit refused; backing off", fence.epoch));
            false
        }
        Err(e) => {
            // A connection error is worth another try by anyone; anything
            // else marks the session failed with the reason.
            // (A restart cuts every connection: "terminating connection",
            // "connection closed", "error communicating with the server".)
            let broken =
                control.is_closed() || e.contains("connection") || e.contains("communicating") || e.contains("closed");
            let how = if broken { Release::Retry } else { Release::Failed };
            let released = match connect(&opts.url) {
                Ok(mut c) => lease::release(&mut c, &id, &fence, how, Some(&e)).unwrap_or(false),
                Err(_) => false,
            };
            say(
                owner,
                &format!(
                    "turn on {id} failed: {e}; {}",
                    if released { format!("released as {how:?}") } else { "lease left to expire".to_owned() }
                ),
            );
            !broken
        }
    }
}
