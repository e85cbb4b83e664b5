//! Sessions an application drives itself (issue 52: `cairn_embed`'s and
//! the Python package's `database=`). An application's tools (Rust
//! closures, Python callables) exist only in its own processes, so a
//! session it creates must never be driven by a generic `cairn worker`:
//! its row names the application (`app`, schema version 3), the workers'
//! claim ([`crate::lease::claim`]) skips such rows, and the application's
//! process claims exactly its session by id ([`create`], [`claim`]) under
//! the same lease and fencing epoch a worker's claim takes. Every commit
//! is then fenced by `PgStore::write` and every effect asks the store's
//! `may_act`, as for a worker; a [`Keeper`] renews the lease while the
//! process drives the session and cancels the turn when the lease may be
//! ending.
//!
//! After the application's process dies, its lease expires (the server's
//! clock, as for a dead worker) and a new process of the application
//! claims the session by id: [`claim`] says how long the live lease has
//! left, and the caller waits that long, never longer than the lease it
//! saw (a lease renewed meanwhile belongs to a live process).
//!
//! It owns these claims and the renewal of one lease; releasing is
//! [`crate::lease::release`]. It must not change what a turn does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cairn_core::CancelToken;
use cairn_core::storage::{FAMILY_SEP, Header, encode_header};

use crate::PgError;
use crate::conn::{Connection, Db};
use crate::lease::{self, Claim, Fence, LeaseClock};
use crate::store::connect_for;

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Create session `header` for application `app`, already claimed by
/// `owner` for `lease` (epoch 1, recorded in `cairn_claims`): one
/// transaction, so no worker ever sees it unclaimed, and committed
/// synchronously (an effect may follow at once).
pub fn create(db: &mut impl Db, header: &Header, app: &str, owner: &str, lease: Duration) -> Result<Claim, PgError> {
    const INSERT: &str = "INSERT INTO cairn_sessions (id, header, app, status, lease_owner, lease_expires, epoch)
         VALUES ($1, $2, $3, 'running', $4, now() + make_interval(secs => $5), 1)
         ON CONFLICT (id) DO NOTHING RETURNING epoch";
    const RECORD: &str = "INSERT INTO cairn_claims (session_id, epoch, owner) VALUES ($1, $2, $3)";
    let id = &header.id;
    if id.contains(FAMILY_SEP) {
        return Err(PgError::Refused(format!(
            "session id {} names a subagent ({FAMILY_SEP}); an application creates top-level sessions only",
            id.escape_debug()
        )));
    }
    let line = encode_header(header).map_err(|e| PgError::Refused(format!("cannot encode the header: {e}")))?;
    let text = String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(&line)).into_owned();
    let (insert, record) = (db.statement(INSERT)?, db.statement(RECORD)?);
    let mut tx = db.client().transaction()?;
    let Some(row) = tx.query_opt(&insert, &[id, &text, &app, &owner, &secs(lease)])? else {
        return Err(PgError::Refused(format!("session {} exists already", id.escape_debug())));
    };
    let epoch: i64 = row.get(0);
    tx.execute(&record, &[id, &epoch, &owner])?;
    tx.commit()?;
    Ok(Claim { session: id.clone(), fence: Fence { owner: owner.to_owned(), epoch, lease } })
}

/// What [`claim`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claimed {
    /// Claimed: the lease is ours, under a larger epoch than any before.
    Ours(Claim),
    /// Another holder's lease is live (a process of the application that
    /// is driving it, or one that died and whose lease has not expired).
    Held {
        /// Who holds it.
        owner: String,
        /// Under which epoch.
        epoch: i64,
        /// How long it has left by the server's clock.
        left: Duration,
    },
}

/// Claim session `id`, which an application created ([`create`]), for
/// `owner` when its lease is free or expired (the epoch raised, the claim
/// recorded, committed synchronously); otherwise say who holds it and for
/// how long. Refused for a session the workers drive (no `app`) and for a
/// subagent (driven within its parent's lease).
pub fn claim(db: &mut impl Db, id: &str, owner: &str, lease: Duration) -> Result<Claimed, PgError> {
    const LOCK: &str = "SELECT app, lease_owner, epoch, COALESCE(lease_expires > now(), false),
            GREATEST(0, (extract(epoch FROM (lease_expires - now())) * 1000)::bigint)
         FROM cairn_sessions WHERE id = $1 FOR UPDATE";
    const TAKE: &str = "UPDATE cairn_sessions SET lease_owner = $2, lease_expires = now() + make_interval(secs => $3),
             epoch = epoch + 1, status = 'running', updated_at = now(), cancel_requested = NULL
         WHERE id = $1 RETURNING epoch";
    const RECORD: &str = "INSERT INTO cairn_claims (session_id, epoch, owner) VALUES ($1, $2, $3)";
    if let Some((parent, _)) = id.split_once(FAMILY_SEP) {
        return Err(PgError::Refused(format!(
            "session {} is a subagent, driven within its family's session {}; resume that one",
            id.escape_debug(),
            parent.escape_debug()
        )));
    }
    let (lock, take, record) = (db.statement(LOCK)?, db.statement(TAKE)?, db.statement(RECORD)?);
    let mut tx = db.client().transaction()?;
    let row = tx.query_opt(&lock, &[&id])?.ok_or_else(|| PgError::NoSuchSession(id.to_owned()))?;
    let (app, holder, epoch, live, left_ms): (Option<String>, Option<String>, i64, bool, Option<i64>) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    if app.is_none() {
        return Err(PgError::Refused(format!(
            "session {} is driven by cairn workers (it was submitted, not created by an application), \
             so an application cannot claim it; `cairn submit --session` a prompt to it instead",
            id.escape_debug()
        )));
    }
    if live {
        let left = Duration::from_millis(u64::try_from(left_ms.unwrap_or(0)).unwrap_or(0));
        return Ok(Claimed::Held { owner: holder.unwrap_or_default(), epoch, left });
    }
    let epoch: i64 = tx.query_one(&take, &[&id, &owner, &secs(lease)])?.get(0);
    tx.execute(&record, &[&id, &epoch, &owner])?;
    tx.commit()?;
    Ok(Claimed::Ours(Claim { session: id.to_owned(), fence: Fence { owner: owner.to_owned(), epoch, lease } }))
}

/// Keeps one lease of an application's session while its process drives
/// it: a thread renews it every third of the lease on a connection of its
/// own (never reviving an expired one: [`lease::renew_asking`]); another,
/// apart from the renewals that may hang on a dead connection, cancels the
/// turn once less than [`lease::safety_margin`] of it is surely left. A
/// lost lease sets the store's lost flag and cancels the turn; so does an
/// operator's `cairn cancel`. Stopped and joined on drop.
pub struct Keeper {
    done: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper").field("threads", &self.threads.len()).finish()
    }
}

/// What a [`Keeper`] keeps: the claim's fence, its clock and the flag and
/// token the session's store shares.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The database, to renew on a connection of the keeper's own.
    pub url: String,
    /// The session and the lease it was claimed under.
    pub claim: Claim,
    /// The holder's lease clock (the store extends it with each commit).
    pub clock: LeaseClock,
    /// The store's flag, set when the lease is found lost.
    pub lost: Arc<AtomicBool>,
    /// The turn's token.
    pub cancel: CancelToken,
}

impl Keeper {
    /// Start keeping `kept`'s lease.
    pub fn start(kept: Kept) -> Self {
        let done = Arc::new(AtomicBool::new(false));
        let lease = kept.claim.fence.lease;
        let tick = (lease / 20).clamp(Duration::from_millis(10), Duration::from_millis(100));
        let renewer = {
            let (kept, done) = (kept.clone(), Arc::clone(&done));
            std::thread::spawn(move || renew_loop(&kept, &done, tick))
        };
        let watchdog = {
            let (kept, done) = (kept, Arc::clone(&done));
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    std::thread::sleep(tick);
                    if kept.clock.held_with_margin().is_err() {
                        kept.cancel.cancel();
                    }
                }
            })
        };
        Self { done, threads: vec![renewer, watchdog] }
    }
}

fn renew_loop(kept: &Kept, done: &AtomicBool, tick: Duration) {
    let fence = &kept.claim.fence;
    let period = fence.lease / 3;
    let mut client: Option<Connection> = None;
    let mut last = Instant::now();
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        if last.elapsed() < period {
            continue;
        }
        if client.as_ref().is_none_or(Connection::is_closed) {
            client = connect_for(&kept.url, fence.lease).ok().map(Connection::from);
        }
        let Some(c) = client.as_mut() else { continue };
        let sent = Instant::now();
        match lease::renew_asking(c, &kept.claim.session, fence) {
            Ok(lease::Renewed::Held) => {
                kept.clock.extend(sent);
                last = sent;
            }
            Ok(lease::Renewed::CancelRequested(_)) => {
                kept.clock.extend(sent);
                last = sent;
                kept.cancel.cancel();
            }
            Ok(lease::Renewed::Lost) => {
                kept.lost.store(true, Ordering::SeqCst);
                kept.cancel.cancel();
                return;
            }
            // Tried again on a new connection at the next tick; the
            // watchdog stops the turn if that takes too long.
            Err(_) => client = None,
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.done.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
