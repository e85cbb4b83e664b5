//! Who drives a session: leases with fencing epochs, the inbox of submitted
//! prompts, and the notifications that wake workers.
//!
//! A lease is three columns of the session row: `lease_owner`,
//! `lease_expires` and `epoch`. [`claim`] takes a runnable session whose
//! lease is free or expired (`FOR UPDATE SKIP LOCKED`, so concurrent
//! workers never wait on each other) and increments its epoch; every fenced
//! commit (`store.rs`) checks owner, epoch and expiry in its own
//! transaction, and [`renew`] never revives an expired lease. So once a
//! lease has expired, its holder cannot commit again — not even before a
//! new holder claims it — and a new holder always has a larger epoch.
//!
//! A session an application created and drives itself (its `app` column,
//! `app.rs`) is never claimed here: its tools exist only in that
//! application's processes.
//!
//! Runnable means `status` is `queued` (a prompt is waiting) or `running`
//! with an expired lease (a worker died or stalled mid-turn: an interrupted
//! turn or an unsettled call to resume). A subagent's session (id
//! `<parent>+<invocation>`) is never runnable by itself and takes no
//! prompts: it is driven within its family's top-level lease by the worker
//! that drives its parent (`PgStore::create_within`), and resumed by the
//! worker that resumes its parent.
//!
//! The fence stops a lost holder's commits, not its effects. For those the
//! holder keeps its own [`LeaseClock`]: the instant each successful claim,
//! renewal or commit was *sent* plus the lease length, which is never later
//! than the server's `lease_expires` (the server adds the lease to a `now()`
//! taken after the request left). With less than [`safety_margin`] of it
//! left ([`LeaseClock::held_with_margin`]) no effect starts (the store's
//! `may_act`, asked by the turn right before each one), the turn is
//! cancelled (by the worker's watchdog, and by a commit whose reply came
//! that late), and the running tool is told to stop.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_core::storage::FAMILY_SEP;
use postgres::Client;

use crate::PgError;
use crate::conn::Db;

/// The lease a fenced handle commits under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// Who holds the lease (worker name).
    pub owner: String,
    /// The fencing epoch the lease was claimed with.
    pub epoch: i64,
    /// How long each commit extends the lease.
    pub lease: Duration,
}

/// The notification channel workers LISTEN on.
pub const CHANNEL: &str = "cairn_work";

/// A claimed session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The session id.
    pub session: String,
    /// The lease it was claimed under.
    pub fence: Fence,
}

/// A holder's local view of its lease deadline (see the module notes):
/// shared by the worker's renewal thread, the session's store (each commit
/// extends the lease) and the watchdog that stops the turn.
#[derive(Debug, Clone)]
pub struct LeaseClock {
    deadline: Arc<Mutex<Instant>>,
    lease: Duration,
}

impl LeaseClock {
    /// A lease of `lease` whose claim was sent at `sent`.
    pub fn start(sent: Instant, lease: Duration) -> Self {
        Self { deadline: Arc::new(Mutex::new(sent + lease)), lease }
    }

    /// A renewal or commit sent at `sent` succeeded: the lease runs at least
    /// until `sent + lease`.
    pub fn extend(&self, sent: Instant) {
        if let Ok(mut d) = self.deadline.lock() {
            *d = (*d).max(sent + self.lease);
        }
    }

    /// When the lease ends at the latest, as far as this holder knows.
    pub fn deadline(&self) -> Instant {
        self.deadline.lock().map_or_else(|_| Instant::now(), |d| *d)
    }

    /// How much of the lease is surely left (zero once it may have ended).
    pub fn remaining(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// The lease length.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The holder's precondition for every effect and for going on with a
    /// turn: at least [`safety_margin`] of the lease is surely left. `Err`
    /// holds how much is left.
    pub fn held_with_margin(&self) -> Result<(), Duration> {
        let left = self.remaining();
        if left < safety_margin(self.lease) { Err(left) } else { Ok(()) }
    }
}

/// The longest lease a worker takes (a day). Its connections' timeouts are
/// derived from the lease (`connect_for`: `tcp_user_timeout` of two leases
/// in milliseconds, `idle_in_transaction_session_timeout` of one), and the
/// server and the kernel refuse them past about 24 days.
pub const MAX_LEASE_SECS: u64 = 86_400;

/// A lease length given in seconds, checked: 1 to [`MAX_LEASE_SECS`].
pub fn lease_from_secs(secs: u64) -> Result<Duration, PgError> {
    if (1..=MAX_LEASE_SECS).contains(&secs) {
        Ok(Duration::from_secs(secs))
    } else {
        Err(PgError::Refused(format!(
            "a lease of {secs} s is out of range: give 1 to {MAX_LEASE_SECS} seconds (a day); a stalled worker's sessions are taken over one lease after it stalls"
        )))
    }
}

/// How much of a lease must be left for a turn to go on: below it, the
/// worker cancels the turn (no tool starts, a running tool and the provider
/// call are told to stop) so that its effects end before the lease does.
pub fn safety_margin(lease: Duration) -> Duration {
    (lease / 4).max(Duration::from_millis(100))
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The claim: the oldest runnable session (through the partial index of
/// runnable rows, so finished sessions cost nothing), its lease taken and
/// its epoch raised, and the claim recorded — one statement, one round
/// trip, atomic by itself.
///
/// Committed without waiting for its WAL flush (`synchronous_commit` off
/// for this transaction alone, 47.4): a claim is no effect, and nothing
/// that rests on it waits on it. Visible at once, it locks other workers
/// out as a flushed one does; lost in a crash of the server before the
/// flush, it was never a lease, and the claimer's fence (epoch *and*
/// owner) refuses its next commit. Before any effect the claimer's store
/// makes it durable: by the first line's commit (synchronous, so the WAL
/// up to it, the claim's record included, is flushed) or, when an effect
/// would come first (a resumed turn's re-run), by a synchronous touch of
/// the row (`PgStore::may_act`). This saves one flush per claimed session.
const CLAIM: &str = "WITH claimed AS (
        UPDATE cairn_sessions SET lease_owner = $1, lease_expires = now() + make_interval(secs => $2),
             epoch = epoch + 1, status = 'running', updated_at = now(), cancel_requested = NULL
         WHERE id = (SELECT id FROM cairn_sessions
                     WHERE status IN ('queued', 'running')
                       AND (lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= now())
                       AND (not_before IS NULL OR not_before <= now())
                       AND strpos(id, $3) = 0
                       AND app IS NULL
                     ORDER BY updated_at LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING id, epoch),
     recorded AS (INSERT INTO cairn_claims (session_id, epoch, owner) SELECT id, epoch, $1 FROM claimed)
     SELECT id, epoch FROM claimed WHERE set_config('synchronous_commit', 'off', true) = 'off'";

/// Claim one runnable session for `owner`, or `None` when there is none.
pub fn claim(db: &mut impl Db, owner: &str, lease: Duration) -> Result<Option<Claim>, PgError> {
    let stmt = db.statement(CLAIM)?;
    let row = db.client().query_opt(&stmt, &[&owner, &secs(lease), &FAMILY_SEP.to_string()])?;
    Ok(row.map(|row| Claim { session: row.get(0), fence: Fence { owner: owner.to_owned(), epoch: row.get(1), lease } }))
}

const RENEW: &str = "UPDATE cairn_sessions SET lease_expires = now() + make_interval(secs => $4)
         WHERE id = $1 AND lease_owner = $2 AND epoch = $3 AND lease_expires > now()
         RETURNING cancel_requested";

/// What a renewal found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewed {
    /// Extended.
    Held,
    /// Extended, and an operator asked to stop the running turn (`cairn
    /// cancel`; who asked).
    CancelRequested(String),
    /// No longer ours, or already expired (never revived: the holder must
    /// back off).
    Lost,
}

/// Extend a live lease; false when it is no longer ours or already expired
/// (an expired lease is never revived: its holder must back off).
pub fn renew(db: &mut impl Db, session: &str, fence: &Fence) -> Result<bool, PgError> {
    Ok(renew_asking(db, session, fence)? != Renewed::Lost)
}

/// [`renew`], also saying whether an operator asked to stop the turn.
pub fn renew_asking(db: &mut impl Db, session: &str, fence: &Fence) -> Result<Renewed, PgError> {
    let stmt = db.statement(RENEW)?;
    let row = db.client().query_opt(&stmt, &[&session, &fence.owner, &fence.epoch, &secs(fence.lease)])?;
    Ok(match row {
        None => Renewed::Lost,
        Some(row) => match row.get::<_, Option<String>>(0) {
            Some(by) => Renewed::CancelRequested(by),
            None => Renewed::Held,
        },
    })
}

/// How many times in a row a session is handed back after a transient
/// failure ([`Release::Transient`]) before it is marked failed.
pub const MAX_TRANSIENT_RETRIES: i32 = 6;

/// The wait before the next try after `retries` transient failures: 1 s,
/// doubling, at most a minute.
pub fn transient_backoff(retries: i32) -> Duration {
    let exp = u32::try_from(retries.clamp(0, 6)).unwrap_or(6);
    Duration::from_secs(2u64.pow(exp)).min(Duration::from_secs(60))
}

/// How a holder leaves a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The turn finished: idle, or queued again when prompts are waiting.
    Done,
    /// The session cannot be driven (an error that retrying will not fix).
    Failed,
    /// Hand it back at once for another try (e.g. after a lost connection).
    Retry,
    /// A transient failure of the database (SQLSTATE classes 53, insufficient
    /// resources such as a full disk, and 58, system errors): handed back
    /// for another try after [`transient_backoff`], at most
    /// [`MAX_TRANSIENT_RETRIES`] times in a row, then failed.
    Transient,
    /// An operator stopped it (`cairn cancel`): idle, its prompts gone.
    Cancelled,
}

/// Give up a lease we still hold (nothing happens when it is not ours any
/// more). Wakes the other workers when work is left.
pub fn release(
    db: &mut impl Db,
    session: &str,
    fence: &Fence,
    how: Release,
    note: Option<&str>,
) -> Result<bool, PgError> {
    // A finished turn's, the hot path: one round trip.
    if how == Release::Done && note.is_none() {
        return release_done(db.client(), session, fence);
    }
    const OURS: &str =
        "SELECT retries FROM cairn_sessions WHERE id = $1 AND lease_owner = $2 AND epoch = $3 FOR UPDATE";
    const WAITING: &str = "SELECT EXISTS (SELECT 1 FROM cairn_inbox WHERE session_id = $1)";
    // retries: kept for a transient failure (counted), else reset;
    // not_before: a transient failure's backoff. $6: commit without
    // waiting for the flush (a finished turn's release, see below).
    const LEAVE: &str =
        "UPDATE cairn_sessions SET lease_owner = NULL, lease_expires = NULL, status = $2, updated_at = now(), note = $3,
             retries = $4, not_before = CASE WHEN $5::float8 IS NULL THEN NULL
                                             ELSE now() + make_interval(secs => $5::float8) END,
             cancel_requested = NULL
         WHERE id = $1
         RETURNING retries, CASE WHEN $6::bool THEN set_config('synchronous_commit', 'off', true) END";
    const NOTIFY: &str = "SELECT pg_notify($1, $2)";
    const DROP_PROMPTS: &str = "DELETE FROM cairn_inbox WHERE session_id = $1";
    let (ours_q, waiting_q, leave_q, notify_q, drop_q) = (
        db.statement(OURS)?,
        db.statement(WAITING)?,
        db.statement(LEAVE)?,
        db.statement(NOTIFY)?,
        db.statement(DROP_PROMPTS)?,
    );
    let mut tx = db.client().transaction()?;
    // Lock the row first, so the inbox check below (a new statement, a new
    // snapshot) sees every prompt submitted before we got the lock.
    let Some(ours) = tx.query_opt(&ours_q, &[&session, &fence.owner, &fence.epoch])? else {
        tx.commit()?;
        return Ok(false);
    };
    let tried: i32 = ours.get(0);
    if how == Release::Cancelled {
        tx.execute(&drop_q, &[&session])?;
    }
    let waiting: bool = tx.query_one(&waiting_q, &[&session])?.get(0);
    let mut note = note.map(str::to_owned);
    let (status, retries, wait) = match how {
        Release::Failed => ("failed", 0, None),
        Release::Retry => ("running", tried, None),
        Release::Transient if tried + 1 >= MAX_TRANSIENT_RETRIES => {
            note = Some(format!(
                "gave up after {} tries of a transient failure: {}; when the fault is cleared, `cairn requeue` it",
                tried + 1,
                note.as_deref().unwrap_or("no reason given")
            ));
            ("failed", 0, None)
        }
        Release::Transient => ("running", tried + 1, Some(transient_backoff(tried).as_secs_f64())),
        Release::Done | Release::Cancelled if waiting => ("queued", 0, None),
        Release::Done | Release::Cancelled => ("idle", 0, None),
    };
    // A finished turn's release is committed without waiting for its
    // flush (47.4): every line of the turn is already durable, and a
    // release lost in a crash only leaves the lease to expire, after
    // which the next holder finds nothing to do and releases again. Any
    // later synchronous commit (a submit, the next claim's first line)
    // flushes it on the way. A failure, a retry or a cancel is flushed.
    let lazy = how == Release::Done;
    tx.query_one(&leave_q, &[&session, &status, &note, &retries, &wait, &lazy])?;
    if status != "idle" && status != "failed" {
        tx.execute(&notify_q, &[&CHANNEL, &session])?;
    }
    tx.commit()?;
    Ok(true)
}

/// [`release`] of a finished turn (the hot path: every trivial session
/// ends here) in one round trip instead of five: one simple-query message
/// of two statements, which PostgreSQL runs as one implicit transaction
/// (all or nothing; an error leaves no transaction open). The first locks
/// the row when the lease is ours; the second, with a snapshot taken
/// after that lock (each statement of the message gets its own under
/// `READ COMMITTED`, the default), so that it sees every prompt submitted
/// before the lock, leaves the lease: `queued` with a notification when
/// a prompt is waiting, `idle` otherwise. Committed without waiting for
/// its flush, as [`release`] says. Parameters cannot be bound in a
/// simple query: the id and the owner go in as escaped literals
/// ([`literal`]), the epoch as a number.
fn release_done(client: &mut Client, session: &str, fence: &Fence) -> Result<bool, PgError> {
    use postgres::SimpleQueryMessage;
    let (id, owner, epoch) = (literal(session), literal(&fence.owner), fence.epoch);
    let sql = format!(
        "SELECT 1 FROM cairn_sessions WHERE id = {id} AND lease_owner = {owner} AND epoch = {epoch} FOR UPDATE;
         WITH gone AS (
             UPDATE cairn_sessions SET lease_owner = NULL, lease_expires = NULL, updated_at = now(), note = NULL,
                    retries = 0, not_before = NULL, cancel_requested = NULL,
                    status = CASE WHEN EXISTS (SELECT 1 FROM cairn_inbox WHERE session_id = {id})
                                  THEN 'queued' ELSE 'idle' END
              WHERE id = {id} AND lease_owner = {owner} AND epoch = {epoch}
              RETURNING status)
         SELECT status, set_config('synchronous_commit', 'off', true),
                CASE WHEN status = 'queued' THEN pg_notify({channel}, {id}) END
           FROM gone",
        channel = literal(CHANNEL)
    );
    let replies = client.simple_query(&sql)?;
    // Rows of both statements come back in order; a row of the second
    // (three columns) says the lease was ours and is left.
    Ok(replies.iter().any(|m| matches!(m, SimpleQueryMessage::Row(row) if row.len() == 3)))
}

/// The refusal for a prompt or a claim aimed at a session application
/// `app` drives: what it is and what to do instead.
pub(crate) fn driven_by_app(session: &str, app: &str) -> PgError {
    PgError::Refused(format!(
        "session {} was created by the application {} and is driven only by it (its tools live there); \
         resume it from that application (`agent.resume(id)`), not with `cairn submit` or a worker",
        session.escape_debug(),
        app.escape_debug()
    ))
}

/// `text` as an SQL string literal in the escape-string syntax (`E'…'`),
/// whose meaning does not depend on `standard_conforming_strings`: a
/// backslash and a quote doubled. PostgreSQL text holds no NUL, so none
/// can reach here from a stored id.
fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    out.push_str("E'");
    for c in text.chars() {
        if c == '\\' || c == '\'' {
            out.push(c);
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// How long until the first live lease of a runnable top-level session
/// ends (`None`: none is held): an idle worker wakes then, not up to half
/// a lease later, to take a dead holder's session over (its lease ends
/// without a notification). Read through the partial index of runnable rows.
pub fn next_expiry(db: &mut impl Db) -> Result<Option<Duration>, PgError> {
    const SQL: &str = "SELECT (extract(epoch FROM (min(lease_expires) - now())) * 1000)::bigint
         FROM cairn_sessions
         WHERE status IN ('queued', 'running') AND lease_expires > now() AND strpos(id, $1) = 0 AND app IS NULL";
    let stmt = db.statement(SQL)?;
    let ms: Option<i64> = db.client().query_one(&stmt, &[&FAMILY_SEP.to_string()])?.get(0);
    Ok(ms.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))))
}

/// Start listening for work on this connection (see [`wait`]).
pub fn listen(client: &mut Client) -> Result<(), PgError> {
    client.batch_execute(&format!("LISTEN {CHANNEL}"))?;
    Ok(())
}

/// Sleep until a `submit` or `release` notifies (true) or `timeout` passes
/// (false); notifications already queued are drained.
pub fn wait(client: &mut Client, timeout: Duration) -> Result<bool, PgError> {
    use postgres::fallible_iterator::FallibleIterator as _;
    let mut notes = client.notifications();
    let woke = notes.timeout_iter(timeout).next()?.is_some();
    while notes.iter().next()?.is_some() {}
    Ok(woke)
}

/// The oldest prompt waiting for `session`: (inbox row id, text).
pub fn next_prompt(db: &mut impl Db, session: &str) -> Result<Option<(i64, String)>, PgError> {
    const NEXT: &str = "SELECT id, prompt FROM cairn_inbox WHERE session_id = $1 ORDER BY id LIMIT 1";
    let stmt = db.statement(NEXT)?;
    Ok(db.client().query_opt(&stmt, &[&session])?.map(|row| (row.get(0), row.get(1))))
}

/// Enqueue `prompt` for an existing session and wake a worker.
pub fn submit(db: &mut impl Db, session: &str, prompt: &str) -> Result<i64, PgError> {
    let client = db.client();
    if let Some((parent, _)) = session.split_once(FAMILY_SEP) {
        return Err(PgError::Refused(format!(
            "session {session} is a subagent: it is driven by the worker that drives its family's session {parent}, and takes no prompts of its own; submit to {parent}"
        )));
    }
    let mut tx = client.transaction()?;
    // Touch the row unconditionally: it serialises with `release`.
    let touched = tx.query_opt(
        "UPDATE cairn_sessions SET status = CASE WHEN status = 'running' THEN 'running' ELSE 'queued' END,
             updated_at = now() WHERE id = $1 RETURNING app",
        &[&session],
    )?;
    let Some(touched) = touched else {
        return Err(PgError::NoSuchSession(session.to_owned()));
    };
    // No worker would ever take the prompt (the transaction rolls back).
    if let Some(app) = touched.get::<_, Option<String>>(0) {
        return Err(driven_by_app(session, &app));
    }
    let id: i64 = tx
        .query_one("INSERT INTO cairn_inbox (session_id, prompt) VALUES ($1, $2) RETURNING id", &[&session, &prompt])?
        .get(0);
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &session])?;
    tx.commit()?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::{LeaseClock, safety_margin};
    use std::time::{Duration, Instant};

    #[test]
    fn the_clock_only_moves_forward_from_when_requests_were_sent() {
        let lease = Duration::from_secs(10);
        let t0 = Instant::now();
        let clock = LeaseClock::start(t0, lease);
        assert_eq!(clock.deadline(), t0 + lease);
        // A late reply to an early renewal never moves the deadline back.
        clock.extend(t0 + Duration::from_secs(3));
        clock.extend(t0 + Duration::from_secs(1));
        assert_eq!(clock.deadline(), t0 + Duration::from_secs(13));
        assert!(clock.remaining() <= Duration::from_secs(13));
        let expired = LeaseClock::start(t0.checked_sub(Duration::from_secs(20)).unwrap_or(t0), lease);
        assert!(expired.remaining() < Duration::from_secs(10));
        assert_eq!(safety_margin(lease), Duration::from_millis(2500));
        assert_eq!(safety_margin(Duration::from_millis(200)), Duration::from_millis(100));
    }

    /// The release's literals: a quote or a backslash in an id or a
    /// worker's name (an imported id may hold either) stays inside the
    /// string, whatever `standard_conforming_strings` says.
    #[test]
    fn literals_keep_quotes_and_backslashes_inside_the_string() {
        use super::literal;
        assert_eq!(literal("plain"), "E'plain'");
        assert_eq!(literal("a'b"), "E'a''b'");
        assert_eq!(literal(r"a\b"), r"E'a\\b'");
        assert_eq!(literal(r"x\'; DROP TABLE cairn_sessions; --"), r"E'x\\''; DROP TABLE cairn_sessions; --'");
    }
}
