//! [`PgStore`]: one session kept in PostgreSQL behind the [`Storage`] trait.
//!
//! It owns the mapping of a session to rows: the header line in
//! `cairn_sessions`, and every commit as one row of `cairn_lines` holding
//! exactly the line the JSONL backend would append (so an export is
//! byte-identical to a session file). Validation goes through
//! [`SessionIndex::plan`] like every backend; reads answer from the index
//! rebuilt at open by replaying the lines.
//!
//! Each commit is one PostgreSQL transaction that locks the session row,
//! checks the stored last seq against this handle's (the CAS on
//! `state.seq` is then exact: no other writer moved anything in between),
//! checks the lease and its fencing epoch when the handle is fenced, writes
//! the line, and — when the turn took a submitted prompt — deletes that
//! inbox row, all or nothing. A commit whose connection broke is retried on
//! a new connection while the holder's lease clock says the lease is surely
//! still held (the retry recognises its own line when the first attempt did
//! commit). It must not decide who drives a session: that is `lease.rs` and
//! the worker.
//!
//! A session driven within another's lease (a subagent of a database
//! session, [`PgStore::create_within`], [`PgStore::open_within`]) has no
//! lease of its own: each of its commits locks the lease holder's row first
//! and checks the fence there, then its own row, so it commits only while
//! the holder's lease is held by this worker at this epoch, and it extends
//! that lease as the holder's own commits do.
//!
//! [`import_with`] treats a session file as untrusted input: the file
//! backend's id rule and line limit, every line replayed, and calls left
//! unsettled settled without running them.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_core::CancelToken;
use cairn_core::storage::{
    Committed, DEFAULT_MAX_LINE_BYTES, Header, NotHeld, Record, STORAGE_VERSION, SessionIndex, Storage, StorageError,
    Transaction, check_imported_id, decode_header, decode_line_into, encode_header, encode_line, now_millis,
};
use postgres::Client;

use crate::PgError;
use crate::conn::{Connection, Db};
use crate::lease::{Fence, LeaseClock};

/// A session stored in PostgreSQL.
pub struct PgStore {
    /// In a cell so that the worker can read the inbox through the
    /// session's store (one connection per worker thread), with the
    /// statements prepared on it.
    client: RefCell<Connection>,
    header: Header,
    index: SessionIndex,
    fence: Option<Fence>,
    /// Set once a commit was refused because the lease was lost.
    lost: Arc<AtomicBool>,
    /// The inbox row the running turn consumes, deleted by its next commit.
    take: Arc<Mutex<Option<i64>>>,
    /// The holder's lease deadline, extended by each successful commit.
    clock: Option<LeaseClock>,
    /// How to connect again when the connection breaks mid-commit (URL and
    /// lease of [`connect_for`]).
    reconnect: Option<(String, Duration)>,
    /// The session whose lease fences this one (`fence` is that lease):
    /// `None` for a session that holds its own.
    holder: Option<String>,
    /// The turn's token, cancelled when a commit's reply comes with less
    /// than the safety margin of the lease left.
    cancel: Option<CancelToken>,
    /// Something this handle rests on was committed without waiting for
    /// its WAL flush (47.4: the claim, `lease::claim`; a commit taking a
    /// submitted prompt) and no synchronous commit has followed yet:
    /// [`Storage::may_act`] makes it durable before any effect starts.
    /// Cleared by a synchronous commit of a line (it flushes the WAL up to
    /// its own record, which follows the earlier ones).
    unflushed: std::cell::Cell<bool>,
}

/// A lease in hand, as the stores of the sessions driven within it share
/// it (a database session's subagents, [`PgStore::create_within`]): the
/// session whose row holds the lease, its fence, the flag set once a
/// commit was refused because it was lost, the holder's lease clock (every
/// commit within the lease extends it) and how to reconnect.
#[derive(Debug, Clone)]
pub struct Hold {
    session: String,
    fence: Fence,
    lost: Arc<AtomicBool>,
    clock: Option<LeaseClock>,
    reconnect: Option<(String, Duration)>,
    cancel: Option<CancelToken>,
}

impl Hold {
    /// The session whose row holds the lease.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The lease's fence.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("id", &self.header.id).field("fence", &self.fence).finish_non_exhaustive()
    }
}

fn where_(id: &str) -> String {
    format!("postgres session {id}")
}

/// What both commit paths read back of the session's row, in their
/// columns' order: its stored last seq, epoch, lease owner and whether
/// the lease is live.
fn row_seen(row: &postgres::Row) -> (i64, i64, Option<String>, bool) {
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

/// A commit refused by the fence: the session's lease is not this
/// holder's any more (another epoch or owner, or expired). Both commit
/// paths (the one-statement commit and the transaction) say it alike.
fn lease_lost(id: &str, fence: &Fence, epoch: i64, owner: Option<&str>, live: bool) -> WriteError {
    WriteError::Refused(backend(
        id,
        format!(
            "lease lost: this worker ({}) holds epoch {} but the session is at epoch {epoch}, owner {}, lease {}; nothing was written — the worker must back off",
            fence.owner,
            fence.epoch,
            owner.unwrap_or("none"),
            if live { "live" } else { "expired" }
        ),
    ))
}

fn backend(id: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::Backend { path: where_(id), reason: e.to_string() }
}

fn db(id: &str, e: &postgres::Error) -> StorageError {
    backend(id, crate::describe(e))
}

fn signed(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

fn unsigned(seq: i64) -> u64 {
    u64::try_from(seq).unwrap_or(0)
}

/// The lease length cairn's connections are tuned for when the caller
/// names none (the worker's default lease).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// Connect and make sure the schema is there and not newer than ours, with
/// the connection settings of [`connect_for`] for the default lease.
pub fn connect(url: &str) -> Result<Client, PgError> {
    connect_for(url, DEFAULT_LEASE)
}

/// Connect for a holder of `lease`-long leases: a dead peer is noticed and a
/// half-done transaction cannot hold its locks much longer than a lease.
///
/// - TCP keepalives on both ends (the client's, and the server's
///   `tcp_keepalives_*` for its side of the socket), and `tcp_user_timeout`
///   on both, so a connection into a partition is dropped in seconds, not
///   after the kernel's two hours;
/// - `idle_in_transaction_session_timeout` of about the lease: a worker cut
///   off between two statements of a claim or a commit (row lock held) is
///   rolled back by the server, so `SKIP LOCKED` stops skipping its session
///   about when its lease ends anyway;
/// - a bounded connect.
///
/// Then the schema check ([`crate::schema::ensure`]), which takes no lock
/// when the schema is current.
pub fn connect_for(url: &str, lease: Duration) -> Result<Client, PgError> {
    let mut config: postgres::Config = url.parse()?;
    let lease = lease.max(Duration::from_secs(1));
    let ms = |d: Duration| d.as_millis();
    let idle = (lease / 2).max(Duration::from_secs(1));
    let user_timeout = lease * 2;
    let ours = format!(
        "-c idle_in_transaction_session_timeout={} -c tcp_keepalives_idle={} -c tcp_keepalives_interval=1 -c tcp_keepalives_count=3 -c tcp_user_timeout={}",
        ms(lease),
        idle.as_secs(),
        ms(user_timeout)
    );
    let options = match config.get_options() {
        Some(theirs) if !theirs.trim().is_empty() => format!("{theirs} {ours}"),
        _ => ours,
    };
    config
        .options(&options)
        .keepalives(true)
        .keepalives_idle(idle)
        .keepalives_interval(Duration::from_secs(1))
        .keepalives_retries(3)
        .tcp_user_timeout(user_timeout)
        .connect_timeout(Duration::from_secs(10));
    let mut client = config.connect(postgres::NoTls)?;
    crate::schema::ensure(&mut client)?;
    Ok(client)
}

impl PgStore {
    /// Create a new session row and open it (unfenced).
    pub fn create(mut client: Client, header: Header) -> Result<Self, StorageError> {
        let id = header.id.clone();
        let line = encode_header(&header).map_err(|e| StorageError::Encode(e.to_string()))?;
        let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
        let inserted = client
            .execute(
                "INSERT INTO cairn_sessions (id, header) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                &[&id, &text],
            )
            .map_err(|e| db(&id, &e))?;
        if inserted == 0 {
            return Err(StorageError::Exists { path: where_(&id) });
        }
        Ok(Self::new(client, header, SessionIndex::new(), None))
    }

    fn new(client: impl Into<Connection>, header: Header, index: SessionIndex, fence: Option<Fence>) -> Self {
        Self {
            client: RefCell::new(client.into()),
            header,
            index,
            fence,
            lost: Arc::default(),
            take: Arc::default(),
            clock: None,
            reconnect: None,
            holder: None,
            cancel: None,
            unflushed: std::cell::Cell::new(false),
        }
    }

    /// The lease this handle commits under, to share with the sessions
    /// driven within it; `None` for an unfenced handle.
    pub fn hold(&self) -> Option<Hold> {
        let fence = self.fence.clone()?;
        Some(Hold {
            session: self.holder.clone().unwrap_or_else(|| self.header.id.clone()),
            fence,
            lost: Arc::clone(&self.lost),
            clock: self.clock.clone(),
            reconnect: self.reconnect.clone(),
            cancel: self.cancel.clone(),
        })
    }

    fn within(client: impl Into<Connection>, header: Header, index: SessionIndex, hold: &Hold) -> Self {
        let mut store = Self::new(client, header, index, Some(hold.fence.clone()));
        store.holder = Some(hold.session.clone());
        store.lost = Arc::clone(&hold.lost);
        store.clock = hold.clock.clone();
        store.reconnect = hold.reconnect.clone();
        store.cancel = hold.cancel.clone();
        store
    }

    /// Create a new session row driven within `hold` (a subagent of the
    /// holder's session): created only while the lease is held, in the same
    /// transaction that checks it, and refused when the id exists — so a
    /// session named by a recorded intent is created once.
    pub fn create_within(mut client: Client, header: Header, hold: &Hold) -> Result<Self, StorageError> {
        let id = header.id.clone();
        // Only the holder's own family: `<holder>+<invocation>`, nested.
        let family = format!("{}{}", hold.session, cairn_core::storage::FAMILY_SEP);
        if id.strip_prefix(&family).is_none_or(|rest| rest.is_empty()) {
            return Err(StorageError::Invalid(format!(
                "session {} is not a subagent of {} and cannot be created within its lease",
                id.escape_debug(),
                hold.session.escape_debug()
            )));
        }
        let e = |err: postgres::Error| db(&id, &err);
        let line = encode_header(&header).map_err(|e| StorageError::Encode(e.to_string()))?;
        let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
        let lock = client.prepare(LOCK_ROW).map_err(e)?;
        let mut tx = client.transaction().map_err(e)?;
        check_hold(&mut tx, &lock, &id, hold).map_err(|err| match err {
            HoldError::Db(err) => db(&id, &err),
            HoldError::Refused(err) => err,
        })?;
        let inserted = tx
            .execute(
                "INSERT INTO cairn_sessions (id, header) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                &[&id, &text],
            )
            .map_err(e)?;
        if inserted == 0 {
            return Err(StorageError::Exists { path: where_(&id) });
        }
        tx.commit().map_err(e)?;
        Ok(Self::within(client, header, SessionIndex::new(), hold))
    }

    /// A session driven within another's lease finished its turn: its row
    /// says `idle` (checked under the lease, like a commit). Nothing
    /// happens for a session that holds its own lease (its worker releases
    /// it).
    pub fn idle_within(&mut self) -> Result<(), StorageError> {
        let (Some(holder), Some(fence)) = (self.holder.clone(), self.fence.clone()) else { return Ok(()) };
        let id = self.header.id.clone();
        let hold =
            Hold { session: holder, fence, lost: Arc::clone(&self.lost), clock: None, reconnect: None, cancel: None };
        idle_within(self.client.get_mut().client(), &id, &hold)
    }

    /// Open session `id` to drive it within `hold` (see
    /// [`PgStore::create_within`]).
    pub fn open_within(mut client: Client, id: &str, hold: &Hold) -> Result<Self, StorageError> {
        let (header, index) = load(&mut client, id)?;
        Ok(Self::within(client, header, index, hold))
    }

    /// Open a session for reading and unfenced writing (a commit is refused
    /// while another holder's lease is live).
    pub fn open(client: Client, id: &str) -> Result<Self, StorageError> {
        Self::open_with(Connection::from(client), id, None)
    }

    /// Open a session to drive it under `fence` (a lease claimed by
    /// `lease::claim`).
    pub fn open_fenced(client: Client, id: &str, fence: Fence) -> Result<Self, StorageError> {
        Self::open_with(Connection::from(client), id, Some(fence))
    }

    /// [`PgStore::open_fenced`] on a connection whose prepared statements
    /// it goes on using (a worker thread's, for every session it claims);
    /// [`PgStore::into_connection`] gives it back.
    pub fn open_fenced_on(conn: Connection, id: &str, fence: Fence) -> Result<Self, StorageError> {
        Self::open_with(conn, id, Some(fence))
    }

    fn open_with(mut conn: Connection, id: &str, fence: Option<Fence>) -> Result<Self, StorageError> {
        let (header, index) = load(&mut conn, id)?;
        Ok(Self::new(conn, header, index, fence))
    }

    /// The flag set when a commit was refused because the lease was lost.
    pub fn lease_lost(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.lost)
    }

    /// The slot naming the inbox row the next commit consumes.
    pub fn inbox_slot(&self) -> Arc<Mutex<Option<i64>>> {
        Arc::clone(&self.take)
    }

    /// The fence this handle commits under.
    pub fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    /// Extend `clock` with every successful commit (a commit extends the
    /// lease on the server too).
    pub fn set_lease_clock(&mut self, clock: LeaseClock) {
        self.clock = Some(clock);
    }

    /// Cancel `token` (the turn's) when a commit's reply comes with less
    /// than the safety margin of the lease left: the turn must not go on
    /// toward effects that could outlive the lease (the turn also asks
    /// [`Storage::may_act`] right before each effect).
    pub fn set_cancel(&mut self, token: CancelToken) {
        self.cancel = Some(token);
    }

    /// The claim of this handle's lease may not be flushed yet (a worker's
    /// claim commits asynchronously): the first effect waits for a
    /// synchronous commit that makes it durable, unless a line's commit
    /// did first (see [`Storage::may_act`]).
    pub fn set_claim_unsynced(&mut self) {
        self.unflushed.set(true);
    }

    /// A synchronous commit under the fence (the lease's row touched,
    /// checked to be still ours): it flushes the WAL past every commit
    /// before it, so an effect may follow. Refused when the lease is not
    /// ours any more.
    fn flush(&self) -> Result<(), NotHeld> {
        const TOUCH: &str = "UPDATE cairn_sessions SET updated_at = now()
             WHERE id = $1 AND epoch = $2 AND lease_owner = $3 AND lease_expires > now()";
        let Some(fence) = &self.fence else { return Ok(()) };
        let id = self.holder.as_ref().unwrap_or(&self.header.id);
        let mut conn = self.client.try_borrow_mut().map_err(|_| {
            NotHeld(format!("session {id}: its connection is in use, so its last commit cannot be flushed"))
        })?;
        let touched = conn
            .statement(TOUCH)
            .and_then(|stmt| conn.client().execute(&stmt, &[id, &fence.epoch, &fence.owner]))
            .map_err(|e| {
                NotHeld(format!("session {id}: cannot flush its lease's commits (epoch {}): {e}", fence.epoch))
            })?;
        if touched != 1 {
            self.lost.store(true, Ordering::SeqCst);
            return Err(NotHeld(format!("the lease on session {id} (epoch {}) is not ours any more", fence.epoch)));
        }
        self.unflushed.set(false);
        Ok(())
    }

    /// When a commit fails because the connection broke (a restart, a
    /// terminated backend, a network cut), connect again with
    /// [`connect_for`]`(url, lease)` and retry it — while the lease clock
    /// says the lease is surely held — instead of failing the turn: the
    /// retry either finds the line already committed (the reply was lost)
    /// or commits it under the same fence checks.
    pub fn set_reconnect(&mut self, url: impl Into<String>, lease: Duration) {
        self.reconnect = Some((url.into(), lease));
    }

    /// The connection back (to release the lease, or reuse it).
    pub fn into_client(self) -> Client {
        self.client.into_inner().into_client()
    }

    /// The connection back with its prepared statements.
    pub fn into_connection(self) -> Connection {
        self.client.into_inner()
    }

    /// The connection.
    pub fn client(&mut self) -> &mut Client {
        self.client.get_mut().client()
    }

    /// Whether the connection is known to be closed.
    pub fn is_closed(&self) -> bool {
        self.client.try_borrow().is_ok_and(|c| c.is_closed())
    }

    /// The oldest prompt waiting in this session's inbox (read through the
    /// store's own connection).
    pub fn next_prompt(&self) -> Result<Option<(i64, String)>, PgError> {
        let mut client = self
            .client
            .try_borrow_mut()
            .map_err(|_| PgError::Schema("the session's connection is in use by a commit".to_owned()))?;
        crate::lease::next_prompt(&mut *client, &self.header.id)
    }

    /// Commit `records`, retrying on a broken connection (see
    /// [`PgStore::set_reconnect`]).
    fn write(&mut self, records: &[Record]) -> Result<(), StorageError> {
        let mut attempt = 0u32;
        loop {
            let sent = Instant::now();
            let err = match self.write_once(records, attempt > 0) {
                Ok(flushed) => {
                    if flushed {
                        self.unflushed.set(false);
                    } else {
                        self.unflushed.set(true);
                    }
                    if let Some(clock) = &self.clock {
                        clock.extend(sent);
                        // A reply that came this late (a delayed or cut
                        // connection): the lease may end before anything
                        // the turn would do next.
                        if clock.held_with_margin().is_err()
                            && let Some(cancel) = &self.cancel
                        {
                            cancel.cancel();
                        }
                    }
                    return Ok(());
                }
                Err(WriteError::Refused(e)) => return Err(e),
                Err(WriteError::Connection(e)) => e,
            };
            attempt += 1;
            let Some((url, lease)) = self.reconnect.clone() else { return Err(err) };
            // Only while the lease is surely ours (a fenced handle), or a
            // few times for an unfenced one.
            let time_left = match &self.clock {
                Some(clock) => clock.remaining() > Duration::from_millis(300),
                None => attempt <= 3,
            };
            if !time_left || attempt > 20 {
                return Err(err);
            }
            std::thread::sleep(Duration::from_millis(150 * u64::from(attempt.min(4))));
            if let Ok(client) = connect_for(&url, lease) {
                *self.client.get_mut() = Connection::from(client);
            }
        }
    }

    /// One commit transaction. `again`: an earlier attempt may have
    /// committed before its connection broke, so a stored line identical to
    /// ours at our seq is that commit, not another writer's. True when the
    /// commit waited for its WAL flush.
    ///
    /// The commit taking a submitted prompt (the turn's first line: the
    /// prompt's entry, the provider step about to be asked) does not wait
    /// for its flush (47.4): what follows it is the provider call, no
    /// effect, and the turn's next commit is synchronous. Before an effect
    /// could come first, `may_act` flushes it. Lost in a crash of the
    /// server, it takes the inbox row's deletion with it: the prompt is
    /// queued again, never lost.
    fn write_once(&mut self, records: &[Record], again: bool) -> Result<bool, WriteError> {
        let id = self.header.id.clone();
        let e = |err: postgres::Error| WriteError::from_db(&id, &err);
        let line = encode_line(records).map_err(|err| StorageError::Encode(err.to_string()))?;
        let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
        let first = records.first().map_or(0, Record::seq);
        let last = records.last().map_or(0, Record::seq);
        let take = self.take.lock().ok().and_then(|g| *g);
        let holder = self.holder.clone();
        // A worker's own lease, first attempt: the whole commit in one
        // statement, one round trip (47.4). A retry (is the stored line
        // ours?) and a session driven within another's lease keep the
        // transaction below.
        if !again
            && holder.is_none()
            && let Some(fence) = self.fence.clone()
        {
            return self.write_fenced(&fence, &text, first, last, take);
        }
        let conn = self.client.get_mut();
        // Prepared once per connection (a reconnect prepares them again).
        let [lock_row, lock_own, line_at, insert_line, advance, extend_holder, take_prompt] =
            [LOCK_ROW, LOCK_OWN_ROW, LINE_AT, INSERT_LINE, ADVANCE, EXTEND_HOLDER, TAKE_PROMPT]
                .map(|sql| conn.statement(sql));
        let (lock_row, lock_own, line_at, insert_line, advance, extend_holder, take_prompt) = (
            lock_row.map_err(e)?,
            lock_own.map_err(e)?,
            line_at.map_err(e)?,
            insert_line.map_err(e)?,
            advance.map_err(e)?,
            extend_holder.map_err(e)?,
            take_prompt.map_err(e)?,
        );
        let mut tx = conn.client().transaction().map_err(e)?;
        // Within another session's lease: its row is locked first (every
        // writer of a family locks the holder's row before its own, so they
        // cannot deadlock) and the fence is checked there.
        if let (Some(holder), Some(fence)) = (&holder, &self.fence) {
            let hold = Hold {
                session: holder.clone(),
                fence: fence.clone(),
                lost: Arc::clone(&self.lost),
                clock: None,
                reconnect: None,
                cancel: None,
            };
            check_hold(&mut tx, &lock_row, &id, &hold).map_err(|err| match err {
                HoldError::Db(err) => WriteError::from_db(&id, &err),
                HoldError::Refused(err) => WriteError::Refused(err),
            })?;
        }
        let row = tx
            .query_opt(&lock_own, &[&id])
            .map_err(e)?
            .ok_or_else(|| WriteError::Refused(backend(&id, "the session row is gone")))?;
        let (stored, epoch, owner, live) = row_seen(&row);
        match &self.fence {
            // Driven within the holder's lease (checked above): nobody may
            // hold a lease of this session's own meanwhile.
            Some(_) if holder.is_some() && live && owner.is_some() => {
                return Err(StorageError::Busy { path: where_(&id), pid: None }.into());
            }
            Some(_) if holder.is_some() => {}
            Some(f) if !(live && epoch == f.epoch && owner.as_deref() == Some(f.owner.as_str())) => {
                self.lost.store(true, Ordering::SeqCst);
                return Err(lease_lost(&id, f, epoch, owner.as_deref(), live));
            }
            None if live && owner.is_some() => {
                return Err(StorageError::Busy { path: where_(&id), pid: None }.into());
            }
            _ => {}
        }
        if again && unsigned(stored) == last {
            // The earlier attempt's reply was lost: is the stored line ours?
            let found: Option<String> = tx.query_opt(&line_at, &[&id, &signed(first)]).map_err(e)?.map(|r| r.get(0));
            if found.as_deref() == Some(text.as_str()) {
                tx.commit().map_err(e)?;
                if take.is_some()
                    && let Ok(mut slot) = self.take.lock()
                {
                    *slot = None;
                }
                // The earlier attempt's commit may have been one that did
                // not wait for its flush.
                return Ok(false);
            }
        }
        if unsigned(stored) != self.index.last_seq() {
            return Err(StorageError::Invalid(format!(
                "{}: another writer committed (stored seq {stored}, this handle saw {}); reopen the session",
                where_(&id),
                self.index.last_seq()
            ))
            .into());
        }
        let owner_name = self.fence.as_ref().map(|f| f.owner.clone());
        // A line records the lease it was written under: the holder's epoch
        // for a session driven within another's lease.
        let epoch = match (&holder, &self.fence) {
            (Some(_), Some(f)) => f.epoch,
            _ => epoch,
        };
        tx.execute(&insert_line, &[&id, &signed(first), &signed(last), &text, &epoch, &owner_name]).map_err(e)?;
        let lease_secs = self.fence.as_ref().map(|f| f.lease.as_secs_f64());
        let (own_lease, holder_lease) = if holder.is_some() { (None, lease_secs) } else { (lease_secs, None) };
        // A session driven within another's lease is `running` from its
        // first commit until its driver says its turn ended
        // ([`PgStore::idle_within`]); a crash leaves it `running`, as it
        // leaves its holder.
        let within = holder.is_some();
        tx.execute(&advance, &[&id, &signed(last), &own_lease, &within]).map_err(e)?;
        if let (Some(holder), Some(secs)) = (&holder, holder_lease) {
            // A commit within the holder's lease extends it, as the
            // holder's own commits do.
            tx.execute(&extend_holder, &[holder, &secs]).map_err(e)?;
        }
        if let Some(inbox) = take {
            let n = tx.execute(&take_prompt, &[&inbox, &id]).map_err(e)?;
            if n != 1 {
                return Err(StorageError::Invalid(format!(
                    "{}: the submitted prompt (inbox row {inbox}) was already taken by another writer",
                    where_(&id)
                ))
                .into());
            }
        }
        tx.commit().map_err(e)?;
        if take.is_some()
            && let Ok(mut slot) = self.take.lock()
        {
            *slot = None;
        }
        Ok(take.is_none())
    }
}

impl PgStore {
    /// [`PgStore::write_once`] for a handle holding its own lease, as one
    /// statement ([`FENCED_COMMIT`]): the row locked, the fence and the
    /// seq checked, the submitted prompt taken, the line written and the
    /// lease extended — or, when a check fails, nothing written and the
    /// row's state returned, to say which check failed. True when the
    /// commit waited for its WAL flush.
    fn write_fenced(
        &mut self,
        fence: &Fence,
        text: &str,
        first: u64,
        last: u64,
        take: Option<i64>,
    ) -> Result<bool, WriteError> {
        let id = self.header.id.clone();
        let e = |err: postgres::Error| WriteError::from_db(&id, &err);
        let expected = signed(self.index.last_seq());
        let (first, last, secs) = (signed(first), signed(last), fence.lease.as_secs_f64());
        let conn = self.client.get_mut();
        let stmt = conn.statement(FENCED_COMMIT).map_err(e)?;
        let params: [&(dyn postgres::types::ToSql + Sync); 9] =
            [&id, &first, &last, &text, &fence.epoch, &fence.owner, &secs, &expected, &take];
        let row = conn
            .client()
            .query_opt(&stmt, &params)
            .map_err(e)?
            .ok_or_else(|| WriteError::Refused(backend(&id, "the session row is gone")))?;
        let (stored, epoch, owner, live) = row_seen(&row);
        let wrote: bool = row.get(4);
        if wrote {
            if take.is_some()
                && let Ok(mut slot) = self.take.lock()
            {
                *slot = None;
            }
            return Ok(take.is_none());
        }
        // Nothing was written: say why, checks in the transaction's order.
        if !(live && epoch == fence.epoch && owner.as_deref() == Some(fence.owner.as_str())) {
            self.lost.store(true, Ordering::SeqCst);
            return Err(lease_lost(&id, fence, epoch, owner.as_deref(), live));
        }
        if stored != expected {
            return Err(StorageError::Invalid(format!(
                "{}: another writer committed (stored seq {stored}, this handle saw {expected}); reopen the session",
                where_(&id)
            ))
            .into());
        }
        Err(StorageError::Invalid(format!(
            "{}: the submitted prompt (inbox row {}) was already taken by another writer",
            where_(&id),
            take.unwrap_or_default()
        ))
        .into())
    }
}

/// A fenced commit of a handle holding its own lease, in one statement
/// (one round trip instead of the six of `BEGIN`, lock, insert, advance,
/// take, `COMMIT`; 47.4), atomic by itself: `cur` locks the session row
/// (`FOR UPDATE`: waits for a concurrent claim or commit and reads its
/// result), `ok` is the fence and the seq CAS, `took` deletes the
/// submitted prompt only then, `go` requires that deletion when a prompt
/// is taken, and the line and the row's advance are written only on `go`.
/// Every sub-statement sees the same snapshot, but the lock's row is the
/// latest version and the updates re-check theirs, so a check that fails
/// writes nothing. Returns the locked row's state and whether the line was
/// written. Taking a prompt commits without waiting for its flush (see
/// [`PgStore::write_once`]).
///
/// $1 id, $2 first seq, $3 last seq, $4 line, $5 epoch, $6 owner, $7 lease
/// seconds, $8 the seq this handle saw last, $9 the inbox row taken.
const FENCED_COMMIT: &str = "WITH cur AS (
        SELECT last_seq, epoch, lease_owner, COALESCE(lease_expires > now(), false) AS live
          FROM cairn_sessions WHERE id = $1::text FOR UPDATE),
     ok AS (SELECT 1 FROM cur WHERE live AND epoch = $5::int8 AND lease_owner = $6::text AND last_seq = $8::int8),
     took AS (DELETE FROM cairn_inbox WHERE id = $9::int8 AND session_id = $1 AND EXISTS (SELECT 1 FROM ok)
              RETURNING 1),
     go AS (SELECT 1 FROM ok WHERE $9::int8 IS NULL OR EXISTS (SELECT 1 FROM took)),
     ins AS (INSERT INTO cairn_lines (session_id, first_seq, last_seq, line, epoch, owner)
             SELECT $1, $2::int8, $3::int8, $4::text, $5, $6 FROM go RETURNING 1),
     adv AS (UPDATE cairn_sessions SET last_seq = $3, updated_at = now(),
                    lease_expires = now() + make_interval(secs => $7::float8)
              WHERE id = $1 AND EXISTS (SELECT 1 FROM go) RETURNING 1)
     SELECT last_seq, epoch, lease_owner, live, EXISTS (SELECT 1 FROM ins) AND EXISTS (SELECT 1 FROM adv),
            CASE WHEN $9::int8 IS NOT NULL THEN set_config('synchronous_commit', 'off', true) END
       FROM cur";

/// A lease row locked and read: epoch, owner, live.
const LOCK_ROW: &str = "SELECT epoch, lease_owner, COALESCE(lease_expires > now(), false)
     FROM cairn_sessions WHERE id = $1 FOR UPDATE";
/// The session row locked and read for a commit: last seq, epoch, owner, live.
const LOCK_OWN_ROW: &str = "SELECT last_seq, epoch, lease_owner, COALESCE(lease_expires > now(), false)
     FROM cairn_sessions WHERE id = $1 FOR UPDATE";
const LINE_AT: &str = "SELECT line FROM cairn_lines WHERE session_id = $1 AND first_seq = $2";
const INSERT_LINE: &str =
    "INSERT INTO cairn_lines (session_id, first_seq, last_seq, line, epoch, owner) VALUES ($1, $2, $3, $4, $5, $6)";
const ADVANCE: &str = "UPDATE cairn_sessions SET last_seq = $2, updated_at = now(),
         lease_expires = CASE WHEN $3::float8 IS NULL THEN lease_expires
                              ELSE now() + make_interval(secs => $3::float8) END,
         status = CASE WHEN $4::bool THEN 'running' ELSE status END
     WHERE id = $1";
const EXTEND_HOLDER: &str =
    "UPDATE cairn_sessions SET lease_expires = now() + make_interval(secs => $2::float8) WHERE id = $1";
/// The prompt taken, and this transaction's commit not waiting for its
/// flush (see [`PgStore::write_once`]).
const TAKE_PROMPT: &str = "DELETE FROM cairn_inbox WHERE id = $1 AND session_id = $2
     RETURNING set_config('synchronous_commit', 'off', true)";

/// Session `id`, driven within `hold`, finished its turn: its row says
/// `idle` (checked under the lease, like a commit; see
/// [`PgStore::idle_within`]). Also for a driver that finds a finished
/// session whose row a crash left `running`.
pub fn idle_within(client: &mut Client, id: &str, hold: &Hold) -> Result<(), StorageError> {
    let e = |err: postgres::Error| db(id, &err);
    let lock = client.prepare(LOCK_ROW).map_err(e)?;
    let mut tx = client.transaction().map_err(e)?;
    check_hold(&mut tx, &lock, id, hold).map_err(|err| match err {
        HoldError::Db(err) => db(id, &err),
        HoldError::Refused(err) => err,
    })?;
    tx.execute(
        "UPDATE cairn_sessions SET status = 'idle', updated_at = now() WHERE id = $1 AND status <> 'idle'",
        &[&id],
    )
    .map_err(e)?;
    tx.commit().map_err(e)
}

/// In `tx`, lock the row of `hold`'s session and check that its lease is
/// live and held under `hold`'s fence; when it is not, set the lost flag
/// and refuse (for a write to `id`, driven within that lease).
fn check_hold(
    tx: &mut postgres::Transaction<'_>,
    stmt: &postgres::Statement,
    id: &str,
    hold: &Hold,
) -> Result<(), HoldError> {
    let row = tx.query_opt(stmt, &[&hold.session]).map_err(HoldError::Db)?;
    let Some(row) = row else {
        hold.lost.store(true, Ordering::SeqCst);
        return Err(HoldError::Refused(backend(
            id,
            format!("the session {} whose lease it is driven within is gone", hold.session),
        )));
    };
    let epoch: i64 = row.get(0);
    let owner: Option<String> = row.get(1);
    let live: bool = row.get(2);
    let f = &hold.fence;
    if live && epoch == f.epoch && owner.as_deref() == Some(f.owner.as_str()) {
        return Ok(());
    }
    hold.lost.store(true, Ordering::SeqCst);
    Err(HoldError::Refused(backend(
        id,
        format!(
            "lease lost: it is driven within the lease of {}, where this worker ({}) holds epoch {} but the session is at epoch {epoch}, owner {}, lease {}; nothing was written — the worker must back off",
            hold.session,
            f.owner,
            f.epoch,
            owner.as_deref().unwrap_or("none"),
            if live { "live" } else { "expired" }
        ),
    )))
}

/// Why [`check_hold`] failed.
enum HoldError {
    /// The query failed (the connection, perhaps).
    Db(postgres::Error),
    /// The lease is not held (the lost flag is set).
    Refused(StorageError),
}

/// Why a commit attempt failed.
enum WriteError {
    /// Refused or failed for good (fence, CAS, a constraint): not retried.
    Refused(StorageError),
    /// The connection broke: whether it committed is unknown; retried.
    Connection(StorageError),
}

impl From<StorageError> for WriteError {
    fn from(e: StorageError) -> Self {
        Self::Refused(e)
    }
}

impl WriteError {
    fn from_db(id: &str, e: &postgres::Error) -> Self {
        if connection_lost(e) { Self::Connection(db(id, e)) } else { Self::Refused(db(id, e)) }
    }
}

/// Whether `e` says the connection (not the statement) failed: no reply
/// from the server, or the server ending the session (shutdown, a
/// terminated backend, the idle-in-transaction timeout, SQLSTATE class 08).
pub fn connection_lost(e: &postgres::Error) -> bool {
    match e.as_db_error() {
        None => {
            e.is_closed()
                || std::error::Error::source(e).is_some_and(|c| c.is::<std::io::Error>())
                || e.to_string().contains("communicating")
        }
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08") || code.starts_with("57P") || code == "25P03"
        }
    }
}

/// Visit each entry of session `id` committed with a seq above `after`,
/// in order, reading only the lines past it (`last_seq > after`), and
/// return the last seq read (`after` when nothing was appended): a reader
/// that looks again and again (a peer's wait) reads each line once. A
/// line that does not decode is an error naming the session and the line,
/// as at open.
pub fn entries_after(
    client: &mut Client,
    id: &str,
    after: u64,
    f: &mut dyn FnMut(&cairn_core::storage::Entry),
) -> Result<u64, StorageError> {
    let rows = client
        .query(
            "SELECT line, first_seq, last_seq FROM cairn_lines WHERE session_id = $1 AND last_seq > $2 ORDER BY first_seq",
            &[&id, &signed(after)],
        )
        .map_err(|err| db(id, &err))?;
    // Every new line is decoded before the first entry is handed out, so
    // a failed read hands out nothing and the next one starts at `after`.
    let mut last = after;
    let mut records = Vec::new();
    for row in &rows {
        let (line, first): (&str, i64) = (row.get(0), row.get(1));
        decode_line_into(line.as_bytes(), &mut records).map_err(|err| StorageError::Corrupt {
            path: where_(id),
            line: 0,
            offset: 0,
            reason: format!("the line at seq {first}: {err}"),
        })?;
        last = last.max(unsigned(row.get(2)));
    }
    for record in &records {
        if let Record::Entry(entry) = record
            && entry.seq > after
        {
            f(entry);
        }
    }
    Ok(last)
}

/// The header and the index of session `id`, replayed from its lines.
///
/// One query, one round trip (47.4: it was two): the session row's header
/// and last seq first (`head`), then its lines in order.
fn load(conn: &mut impl Db, id: &str) -> Result<(Header, SessionIndex), StorageError> {
    const LOAD: &str = "SELECT text, seq, head FROM (
             SELECT header AS text, last_seq AS seq, true AS head FROM cairn_sessions WHERE id = $1
             UNION ALL
             SELECT line, first_seq, false FROM cairn_lines WHERE session_id = $1) rows
         ORDER BY head DESC, seq";
    let e = |err: postgres::Error| db(id, &err);
    let load_q = conn.statement(LOAD).map_err(e)?;
    let rows = conn.client().query(&load_q, &[&id]).map_err(e)?;
    let Some((row, lines)) = rows.split_first().filter(|(row, _)| row.get::<_, bool>(2)) else {
        return Err(StorageError::Io {
            path: where_(id),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such session in the database"),
        });
    };
    let header_text: &str = row.get(0);
    let last: i64 = row.get(1);
    let header = decode_header(header_text.as_bytes())
        .map_err(|err| StorageError::BadHeader { path: where_(id), reason: err.to_string() })?;
    if header.storage_version > STORAGE_VERSION {
        return Err(StorageError::NewerVersion {
            path: where_(id),
            found: header.storage_version,
            supported: STORAGE_VERSION,
        });
    }
    let mut index = SessionIndex::new();
    let mut records = Vec::new();
    for (n, row) in lines.iter().enumerate() {
        let line: &str = row.get(0);
        let corrupt =
            |reason: String| StorageError::Corrupt { path: where_(id), line: n as u64 + 2, offset: 0, reason };
        records.clear();
        decode_line_into(line.as_bytes(), &mut records).map_err(|err| corrupt(err.to_string()))?;
        for record in records.drain(..) {
            index.apply(record).map_err(corrupt)?;
        }
    }
    if index.last_seq() != unsigned(last) {
        return Err(StorageError::Corrupt {
            path: where_(id),
            line: 0,
            offset: 0,
            reason: format!("the lines end at seq {} but the session row says {last}", index.last_seq()),
        });
    }
    Ok((header, index))
}

/// The session as a JSONL file: the header line and every line, each
/// followed by a newline — byte for byte what the JSONL backend writes.
pub fn export(client: &mut Client, id: &str) -> Result<Vec<u8>, StorageError> {
    let e = |err: postgres::Error| db(id, &err);
    let mut tx = client
        .build_transaction()
        .read_only(true)
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .start()
        .map_err(e)?;
    let row = tx.query_opt("SELECT header FROM cairn_sessions WHERE id = $1", &[&id]).map_err(e)?.ok_or_else(|| {
        StorageError::Io {
            path: where_(id),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such session in the database"),
        }
    })?;
    let mut out: Vec<u8> = row.get::<_, String>(0).into_bytes();
    out.push(b'\n');
    for row in tx.query("SELECT line FROM cairn_lines WHERE session_id = $1 ORDER BY first_seq", &[&id]).map_err(e)? {
        out.extend_from_slice(row.get::<_, &str>(0).as_bytes());
        out.push(b'\n');
    }
    tx.commit().map_err(e)?;
    Ok(out)
}

/// What [`import_with`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    /// The session id (checked by `check_imported_id`).
    pub id: String,
    /// The working directory the session's turns run in (its header's
    /// `cwd`: the file's, or the one the import was given).
    pub cwd: String,
    /// Invocations the file left unsettled, now settled without running
    /// them (failed-uncertain, or rejected when not yet approved): a
    /// verdict recorded elsewhere is not trusted here.
    pub settled: Vec<String>,
}

/// Import a JSONL session file (as `cairn export` or the JSONL backend
/// wrote it) as a new session; see [`import_with`]. Returns the session id.
pub fn import(client: &mut Client, bytes: &[u8]) -> Result<String, StorageError> {
    import_with(client, bytes, DEFAULT_MAX_LINE_BYTES, None).map(|i| i.id)
}

/// Import a JSONL session file as a new session. The file is untrusted:
///
/// - its id must follow the rule for ids from elsewhere
///   ([`check_imported_id`]: the file backend's rule, so no id can later
///   name a path; at most 255 bytes; no control character; and no `+`, so
///   no import names — and answers for — another session's subagent);
/// - no line may be longer than `max_line` bytes (the file backend's limit,
///   so that the export passes `cairn check`);
/// - every line is replayed and checked;
/// - a tool call the file leaves unsettled is settled without running it,
///   by the core's own resume with stand-ins that never run and no model (an approval the
///   file records came from another host and is not trusted: the call ends
///   failed-uncertain, or rejected when it was still waiting for a verdict;
///   the next turn's model sees that).
///
/// With `cwd`, the session works in that directory instead of the one its
/// header names (a file from another host names a directory of that host).
/// Nothing is written to the database unless all of it passes.
pub fn import_with(
    client: &mut Client,
    bytes: &[u8],
    max_line: u64,
    cwd: Option<&str>,
) -> Result<Imported, StorageError> {
    let moved;
    let bytes = match cwd {
        None => bytes,
        Some(dir) => {
            moved = with_cwd(bytes, dir)?;
            &moved
        }
    };
    let (id, mut rows, settled_bytes, settled) = parse_import(bytes, max_line)?;
    let owned;
    if let Some(after) = settled_bytes {
        owned = after;
        let (_, again, _, _) = parse_import(&owned, max_line)?;
        rows = again;
    }
    let e = |err: postgres::Error| db(&id, &err);
    let (header_line, last) = (rows.header.clone(), rows.last);
    let mut tx = client.transaction().map_err(e)?;
    let inserted = tx
        .execute(
            "INSERT INTO cairn_sessions (id, header, last_seq) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
            &[&id, &header_line, &signed(last)],
        )
        .map_err(e)?;
    if inserted == 0 {
        return Err(StorageError::Exists { path: where_(&id) });
    }
    for (first, last, line) in &rows.lines {
        tx.execute(
            "INSERT INTO cairn_lines (session_id, first_seq, last_seq, line, epoch) VALUES ($1, $2, $3, $4, 0)",
            &[&id, &signed(*first), &signed(*last), line],
        )
        .map_err(e)?;
    }
    tx.commit().map_err(e)?;
    let cwd = decode_header(header_line.as_bytes()).map(|h| h.cwd).unwrap_or_default();
    Ok(Imported { id, cwd, settled })
}

/// The file with its header's `cwd` replaced by `dir`.
fn with_cwd(bytes: &[u8], dir: &str) -> Result<Vec<u8>, StorageError> {
    let bad = |reason: String| StorageError::BadHeader { path: "import".to_owned(), reason };
    let end = bytes.iter().position(|b| *b == b'\n').unwrap_or(bytes.len());
    let mut header = decode_header(&bytes[..end]).map_err(|e| bad(e.to_string()))?;
    header.cwd = dir.to_owned();
    let mut out = encode_header(&header).map_err(|e| StorageError::Encode(e.to_string()))?;
    out.extend_from_slice(bytes.get(end + 1..).unwrap_or_default());
    Ok(out)
}

/// An import's rows: the header line, (first seq, last seq, line) of each
/// commit, and the last seq.
struct ImportRows {
    header: String,
    lines: Vec<(u64, u64, String)>,
    last: u64,
}

type Parsed = (String, ImportRows, Option<Vec<u8>>, Vec<String>);

/// Check an import file; when it leaves calls unsettled, also the file
/// with them settled (and their invocation ids).
fn parse_import(bytes: &[u8], max_line: u64) -> Result<Parsed, StorageError> {
    let path = || "import".to_owned();
    let text = std::str::from_utf8(bytes)
        .map_err(|e| StorageError::BadHeader { path: path(), reason: format!("not UTF-8: {e}") })?;
    let mut offset = 0u64;
    for (n, line) in text.split_terminator('\n').enumerate() {
        if line.len() as u64 > max_line {
            return Err(StorageError::LineTooLong { path: path(), line: n as u64 + 1, offset, limit: max_line });
        }
        offset += line.len() as u64 + 1;
    }
    let mut lines = text.split_terminator('\n');
    let header_line = lines.next().unwrap_or_default();
    let header = decode_header(header_line.as_bytes())
        .map_err(|e| StorageError::BadHeader { path: path(), reason: e.to_string() })?;
    if header.storage_version > STORAGE_VERSION {
        return Err(StorageError::NewerVersion {
            path: path(),
            found: header.storage_version,
            supported: STORAGE_VERSION,
        });
    }
    check_imported_id(&header.id)?;
    let mut index = SessionIndex::new();
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        let corrupt = |reason: String| StorageError::Corrupt { path: path(), line: n as u64 + 2, offset: 0, reason };
        let mut records = Vec::new();
        decode_line_into(line.as_bytes(), &mut records).map_err(|err| corrupt(err.to_string()))?;
        let first = records.first().map_or(0, Record::seq);
        for record in records {
            index.apply(record).map_err(corrupt)?;
        }
        rows.push((first, index.last_seq(), line.to_owned()));
    }
    let pending: Vec<(String, String)> = cairn_core::projection::ToolState::replay(index.entries())
        .invocations
        .iter()
        .filter(|inv| inv.settlements == 0)
        .map(|inv| (inv.invocation_id.clone(), inv.tool.clone()))
        .collect();
    let settled = if pending.is_empty() { None } else { Some(settle_untrusted(bytes, max_line, &pending)?) };
    let unsettled: Vec<String> = pending.into_iter().map(|(invocation, _)| invocation).collect();
    let rows = ImportRows { header: header_line.to_owned(), lines: rows, last: index.last_seq() };
    Ok((header.id, rows, settled, unsettled))
}

/// The stand-in for an imported call's tool: the import never runs a tool.
struct NotRunHere(cairn_core::tool::ToolSpec);

impl NotRunHere {
    fn new(name: &str) -> Self {
        Self(cairn_core::tool::ToolSpec {
            name: name.to_owned(),
            description: "A tool of an imported session; not run by the import.".to_owned(),
            input_schema: serde_json::json!({"type": "object"}),
            risk: cairn_core::tool::Risk::Write,
            capabilities: std::collections::BTreeSet::new(),
            replay: cairn_core::tool::ReplayPolicy::Never,
        })
    }
}

impl cairn_core::tool::Tool for NotRunHere {
    fn spec(&self) -> &cairn_core::tool::ToolSpec {
        &self.0
    }

    fn execute(
        &self,
        _: &cairn_core::tool::ToolRequest,
        _: &mut cairn_core::tool::ToolContext<'_>,
    ) -> Result<cairn_core::tool::ToolReceipt, cairn_core::tool::ToolError> {
        Err(cairn_core::tool::ToolError::Rejected(
            "a call of an imported session is not run on a verdict recorded elsewhere".to_owned(),
        ))
    }
}

/// A model that never answers: the import's resume must settle the
/// imported calls and stop before asking anything.
struct NoModel;

impl cairn_core::provider::Provider for NoModel {
    fn name(&self) -> &str {
        "import"
    }

    fn model(&self) -> &str {
        "none"
    }

    fn complete(
        &self,
        _: &cairn_core::provider::ModelRequest<'_>,
        _: &mut dyn FnMut(&cairn_core::provider::StreamEvent),
        _: &cairn_core::CancelToken,
    ) -> Result<cairn_core::provider::ModelResponse, cairn_core::provider::ProviderError> {
        Err(cairn_core::provider::ProviderError::new(
            cairn_core::provider::ProviderErrorKind::Config,
            "an imported session is not run by the import; submit a prompt to continue it",
        ))
    }
}

/// The file with its unsettled calls settled by the core's resume with
/// stand-in tools whose effect never runs ([`NotRunHere`]: a started call is
/// settled failed — uncertain where the effect may have happened — and one
/// awaiting its verdict is rejected) and no model (the
/// resume stops at the next model call, which a worker makes later). Done
/// on a copy in a temporary directory, named `import.jsonl` (never after
/// the id).
fn settle_untrusted(bytes: &[u8], max_line: u64, pending: &[(String, String)]) -> Result<Vec<u8>, StorageError> {
    let unsettled: Vec<&str> = pending.iter().map(|(invocation, _)| invocation.as_str()).collect();
    use cairn_core::storage::{Durability, JsonlStore, StoreOptions};
    let dir =
        tempfile::tempdir().map_err(|source| StorageError::Io { path: "a temporary directory".to_owned(), source })?;
    let path = dir.path().join("import.jsonl");
    let io = |source| StorageError::Io { path: path.display().to_string(), source };
    std::fs::write(&path, bytes).map_err(io)?;
    let opts = StoreOptions { durability: Durability::None, max_line_bytes: max_line, ..StoreOptions::default() };
    let store = JsonlStore::open(&path, opts)?;
    let failed = |e: cairn_core::TurnError| {
        StorageError::Invalid(format!(
            "the imported session leaves tool calls unsettled ({}) and they could not be settled: {e}",
            unsettled.join(", ")
        ))
    };
    let mut session = cairn_core::Session::open(store, cairn_core::SessionConfig::default()).map_err(failed)?;
    let approver = cairn_core::approval::PolicyApprover::new(cairn_core::approval::Allowlist::default(), None);
    let mut registry = cairn_core::ToolRegistry::new(&approver);
    let mut names: Vec<&str> = pending.iter().map(|(_, tool)| tool.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        // A stand-in whose effect never runs (the core applies the replay
        // policy the log recorded: a started call is settled uncertain, or
        // its stand-in "runs" and refuses; with no allow rule and no person
        // a call still waiting for its verdict is rejected), so that the
        // settlements do not claim the tool is gone.
        let _ = registry.register(std::sync::Arc::new(NotRunHere::new(name)));
    }
    let cancel = cairn_core::CancelToken::new();
    let mut equipment = cairn_host::Equipment { tools: registry, approver };
    match equipment.run(&mut session, &NoModel, cairn_host::Step::Resume, &mut |_| {}, &cancel) {
        Ok(_) | Err(cairn_core::TurnError::Provider(_)) => {}
        Err(e) => return Err(failed(e)),
    }
    let left: Vec<String> = session
        .tool_state()
        .invocations
        .iter()
        .filter(|inv| inv.settlements == 0)
        .map(|inv| inv.invocation_id.clone())
        .collect();
    if !left.is_empty() {
        return Err(StorageError::Invalid(format!(
            "the imported session leaves tool calls unsettled ({}) that cairn could not settle without running them; settle them where the session ran (cairn resume) and export it again",
            left.join(", ")
        )));
    }
    drop(session);
    std::fs::read(&path).map_err(io)
}

impl Storage for PgStore {
    fn header(&self) -> &Header {
        &self.header
    }

    fn commit(&mut self, tx: Transaction) -> Result<Committed, StorageError> {
        let records = self.index.plan(tx, now_millis())?;
        let committed = SessionIndex::committed(&records);
        self.write(&records)?;
        for record in records {
            self.index.apply(record).map_err(StorageError::Invalid)?;
        }
        Ok(committed)
    }

    // Reads answer from the in-memory index, as every backend's do.
    cairn_core::storage::reads_from_index!();

    fn sync(&mut self) -> Result<(), StorageError> {
        // Every commit is a committed PostgreSQL transaction.
        Ok(())
    }

    /// A fenced handle acts only while its lease is held with margin
    /// (`LeaseClock::held_with_margin`), counted from the last claim,
    /// renewal or commit *sent*: so a commit answered late (the reply held
    /// past the lease while another worker took over) is never followed by
    /// an effect. A handle without a lease clock (unfenced, or a test's
    /// fenced handle) is limited by the fence alone.
    fn may_act(&self) -> Result<(), NotHeld> {
        let holder = self.holder.as_deref().unwrap_or(&self.header.id);
        let epoch = self.fence.as_ref().map_or(0, |f| f.epoch);
        if self.fence.is_some() && self.lost.load(Ordering::SeqCst) {
            return Err(NotHeld(format!("the lease on session {holder} (epoch {epoch}) was lost")));
        }
        if let Some(clock) = &self.clock {
            clock.held_with_margin().map_err(|left| {
                NotHeld(format!(
                    "the lease on session {holder} (epoch {epoch}) has {} ms surely left, under the safety margin of {} ms, so nothing that could outlive it starts",
                    left.as_millis(),
                    crate::lease::safety_margin(clock.lease()).as_millis()
                ))
            })?;
        }
        // A claim or a prompt's commit not yet flushed is made durable
        // first: an effect never rests on a commit a crash could undo.
        if self.unflushed.get() { self.flush() } else { Ok(()) }
    }
}
