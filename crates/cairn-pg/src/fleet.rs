//! The operators' view and levers of a fleet of workers: the registry of
//! workers with their heartbeats and the leases they lost, with why
//! ([`workers`], `cairn workers`); putting a failed session back in the
//! queue once its fault is cleared ([`requeue`]); stopping a session
//! ([`cancel`]: its waiting prompts dropped, a running turn asked to stop
//! through its holder's next renewal).
//!
//! It owns these rows and statements. It must not decide who drives a
//! session (that is `lease.rs`): a requeue or a cancel never touches a live
//! lease's owner or epoch, so the fence holds whatever an operator does.

use cairn_core::storage::FAMILY_SEP;

use crate::PgError;
use crate::conn::Db;
use crate::lease::CHANNEL;

/// A worker process as it registered (`cairn worker` at start).
#[derive(Debug, Clone)]
pub struct Registration<'a> {
    /// The worker's name (`host:pid`; its threads' lease owner names are `NAME/N`).
    pub name: &'a str,
    /// The host it runs on.
    pub host: &'a str,
    /// Its process id.
    pub pid: u32,
    /// Sessions it drives at once.
    pub concurrency: usize,
    /// Its lease length in ms.
    pub lease_ms: u64,
}

/// Record a worker at its start (again after a restart with the same name).
pub fn register(db: &mut impl Db, r: &Registration<'_>) -> Result<(), PgError> {
    const SQL: &str = "INSERT INTO cairn_workers (name, host, pid, concurrency, lease_ms)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (name) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid,
             concurrency = EXCLUDED.concurrency, lease_ms = EXCLUDED.lease_ms, started_at = now(),
             heartbeat_at = now(), held = 0, draining = false, stopped_at = NULL";
    let stmt = db.statement(SQL)?;
    let concurrency = i32::try_from(r.concurrency).unwrap_or(i32::MAX);
    let lease_ms = i64::try_from(r.lease_ms).unwrap_or(i64::MAX);
    db.client().execute(&stmt, &[&r.name, &r.host, &i64::from(r.pid), &concurrency, &lease_ms])?;
    Ok(())
}

/// A worker is alive, holding `held` sessions, draining or not.
pub fn heartbeat(db: &mut impl Db, name: &str, held: usize, draining: bool) -> Result<(), PgError> {
    const SQL: &str = "UPDATE cairn_workers SET heartbeat_at = now(), held = $2, draining = $3 WHERE name = $1";
    let stmt = db.statement(SQL)?;
    db.client().execute(&stmt, &[&name, &i32::try_from(held).unwrap_or(i32::MAX), &draining])?;
    Ok(())
}

/// Sessions any worker could claim now (the claim's own condition,
/// `lease::claim`): the queue's depth, for the worker's telemetry gauge.
pub fn waiting(db: &mut impl Db) -> Result<u64, PgError> {
    const SQL: &str = "SELECT count(*) FROM cairn_sessions
         WHERE status IN ('queued', 'running')
           AND (lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= now())
           AND (not_before IS NULL OR not_before <= now())
           AND strpos(id, $1) = 0 AND app IS NULL";
    let stmt = db.statement(SQL)?;
    let n: i64 = db.client().query_one(&stmt, &[&FAMILY_SEP.to_string()])?.get(0);
    Ok(u64::try_from(n).unwrap_or(0))
}

/// A worker left (its sessions released).
pub fn stopped(db: &mut impl Db, name: &str) -> Result<(), PgError> {
    const SQL: &str = "UPDATE cairn_workers SET stopped_at = now(), held = 0 WHERE name = $1";
    let stmt = db.statement(SQL)?;
    db.client().execute(&stmt, &[&name])?;
    Ok(())
}

/// Worker `worker` lost its lease on `session` at `epoch`, for `reason`.
pub fn lost(db: &mut impl Db, worker: &str, session: &str, epoch: i64, reason: &str) -> Result<(), PgError> {
    const SQL: &str = "INSERT INTO cairn_lease_losses (worker, session_id, epoch, reason) VALUES ($1, $2, $3, $4)";
    let stmt = db.statement(SQL)?;
    db.client().execute(&stmt, &[&worker, &session, &epoch, &reason])?;
    Ok(())
}

/// A lease a worker lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    /// The session.
    pub session: String,
    /// The epoch it was held at.
    pub epoch: i64,
    /// Why (the worker's words).
    pub reason: String,
    /// When, as the server prints it.
    pub at: String,
}

/// A registered worker, as `cairn workers` shows it.
#[derive(Debug, Clone)]
pub struct Worker {
    /// Its name (`host:pid`).
    pub name: String,
    /// Its host.
    pub host: String,
    /// Its process id.
    pub pid: i64,
    /// Sessions it drives at once.
    pub concurrency: i32,
    /// Its lease length in ms.
    pub lease_ms: i64,
    /// When it started, as the server prints it.
    pub started: String,
    /// How long ago its last heartbeat was, in ms (by the server's clock).
    pub heartbeat_age_ms: i64,
    /// Sessions it held at its last heartbeat.
    pub held: i32,
    /// It was told to stop: finishing its running turns, claiming nothing.
    pub draining: bool,
    /// It left (released what it held).
    pub stopped: bool,
    /// Leases it lost in all.
    pub losses: i64,
    /// The latest of them, newest first (at most five).
    pub recent_losses: Vec<Loss>,
}

/// Every registered worker, the most recently started first.
pub fn workers(db: &mut impl Db) -> Result<Vec<Worker>, PgError> {
    const SQL: &str = "SELECT name, host, pid, concurrency, lease_ms,
            to_char(started_at, 'YYYY-MM-DD HH24:MI:SS'),
            (extract(epoch FROM (now() - heartbeat_at)) * 1000)::bigint,
            held, draining, stopped_at IS NOT NULL,
            (SELECT count(*) FROM cairn_lease_losses l WHERE l.worker = w.name)
         FROM cairn_workers w ORDER BY started_at DESC, name";
    const LOSSES: &str = "SELECT session_id, epoch, reason, to_char(at, 'YYYY-MM-DD HH24:MI:SS')
         FROM cairn_lease_losses WHERE worker = $1 ORDER BY id DESC LIMIT 5";
    let (stmt, losses) = (db.statement(SQL)?, db.statement(LOSSES)?);
    let rows = db.client().query(&stmt, &[])?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let name: String = row.get(0);
        let recent_losses = db
            .client()
            .query(&losses, &[&name])?
            .iter()
            .map(|r| Loss { session: r.get(0), epoch: r.get(1), reason: r.get(2), at: r.get(3) })
            .collect();
        out.push(Worker {
            name,
            host: row.get(1),
            pid: row.get(2),
            concurrency: row.get(3),
            lease_ms: row.get(4),
            started: row.get(5),
            heartbeat_age_ms: row.get(6),
            held: row.get(7),
            draining: row.get(8),
            stopped: row.get(9),
            losses: row.get(10),
            recent_losses,
        });
    }
    Ok(out)
}

/// What [`requeue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requeued {
    /// Prompts waiting in its inbox (the first is taken next).
    pub waiting: i64,
}

fn refuse_child(id: &str) -> Result<(), PgError> {
    if let Some((parent, _)) = id.split_once(FAMILY_SEP) {
        return Err(PgError::Refused(format!(
            "session {} is a subagent, driven by the worker that drives its family's session {}; requeue or cancel that one",
            id.escape_debug(),
            parent.escape_debug()
        )));
    }
    Ok(())
}

/// Put session `id` back in the queue after its fault was cleared: a
/// failed session (or one whose backoff is running) becomes runnable at
/// once, with its retries forgotten; a worker resumes its interrupted turn,
/// then takes its waiting prompts. Refused for a session a worker holds,
/// one already queued, and an idle one with nothing to do.
pub fn requeue(db: &mut impl Db, id: &str) -> Result<Requeued, PgError> {
    const LOCK: &str = "SELECT status, COALESCE(lease_expires > now(), false), lease_owner,
            (SELECT count(*) FROM cairn_inbox i WHERE i.session_id = s.id), not_before IS NOT NULL, app
         FROM cairn_sessions s WHERE id = $1 FOR UPDATE";
    const QUEUE: &str = "UPDATE cairn_sessions SET status = 'queued', note = NULL, retries = 0, not_before = NULL,
             updated_at = now() WHERE id = $1";
    const NOTIFY: &str = "SELECT pg_notify($1, $2)";
    refuse_child(id)?;
    let (lock, queue, notify) = (db.statement(LOCK)?, db.statement(QUEUE)?, db.statement(NOTIFY)?);
    let mut tx = db.client().transaction()?;
    let row = tx.query_opt(&lock, &[&id])?.ok_or_else(|| PgError::NoSuchSession(id.to_owned()))?;
    let (status, live, owner, waiting, backing_off): (String, bool, Option<String>, i64, bool) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    // No worker takes an application's session: queueing it would only
    // promise what never happens.
    if let Some(app) = row.get::<_, Option<String>>(5) {
        return Err(crate::lease::driven_by_app(id, &app));
    }
    if live {
        return Err(PgError::Refused(format!(
            "session {} is being driven by worker {}; nothing to requeue (`cairn cancel` stops it)",
            id.escape_debug(),
            owner.as_deref().unwrap_or("?").escape_debug()
        )));
    }
    match status.as_str() {
        "failed" => {}
        "running" | "queued" if backing_off => {}
        "queued" => {
            return Err(PgError::Refused(format!(
                "session {} is already queued; a worker will take it",
                id.escape_debug()
            )));
        }
        "running" => {
            return Err(PgError::Refused(format!(
                "session {} is already waiting for a worker to resume it",
                id.escape_debug()
            )));
        }
        _ if waiting > 0 => {}
        _ => {
            return Err(PgError::Refused(format!(
                "session {} is idle with no prompt waiting; submit one instead",
                id.escape_debug()
            )));
        }
    }
    tx.execute(&queue, &[&id])?;
    tx.execute(&notify, &[&CHANNEL, &id])?;
    tx.commit()?;
    Ok(Requeued { waiting })
}

/// What [`cancel`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    /// Nobody was driving it: its waiting prompts (this many) were dropped
    /// and it is idle.
    Stopped {
        /// Prompts dropped from its inbox.
        dropped: u64,
    },
    /// A worker holds it: its running turn is asked to stop at the
    /// holder's next renewal (within a third of its lease); the worker then
    /// drops the waiting prompts and leaves it idle.
    Asked {
        /// The worker (lease owner) that holds it.
        holder: String,
    },
}

/// Stop session `id`, asked by `by` (see [`Cancelled`]). A subagent is
/// stopped through its family's session.
pub fn cancel(db: &mut impl Db, id: &str, by: &str) -> Result<Cancelled, PgError> {
    const LOCK: &str = "SELECT COALESCE(lease_expires > now(), false), lease_owner
         FROM cairn_sessions WHERE id = $1 FOR UPDATE";
    const ASK: &str = "UPDATE cairn_sessions SET cancel_requested = $2 WHERE id = $1";
    const DROP: &str = "DELETE FROM cairn_inbox WHERE session_id = $1";
    const IDLE: &str = "UPDATE cairn_sessions SET status = 'idle', note = $2, retries = 0, not_before = NULL,
             updated_at = now() WHERE id = $1";
    refuse_child(id)?;
    let (lock, ask, drop_q, idle) = (db.statement(LOCK)?, db.statement(ASK)?, db.statement(DROP)?, db.statement(IDLE)?);
    let mut tx = db.client().transaction()?;
    let row = tx.query_opt(&lock, &[&id])?.ok_or_else(|| PgError::NoSuchSession(id.to_owned()))?;
    let (live, owner): (bool, Option<String>) = (row.get(0), row.get(1));
    let out = match owner {
        Some(holder) if live => {
            tx.execute(&ask, &[&id, &by])?;
            Cancelled::Asked { holder }
        }
        _ => {
            let dropped = tx.execute(&drop_q, &[&id])?;
            tx.execute(&idle, &[&id, &format!("cancelled by {by}")])?;
            Cancelled::Stopped { dropped }
        }
    };
    tx.commit()?;
    Ok(out)
}
