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
//! inbox row, all or nothing. It must not decide who drives a session: that
//! is `lease.rs` and the worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn_core::storage::{
    Committed, Header, Record, STORAGE_VERSION, SessionIndex, Storage, StorageError, Transaction, decode_header,
    decode_line_into, encode_header, encode_line, now_millis,
};
use postgres::Client;

use crate::PgError;

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

/// A session stored in PostgreSQL.
pub struct PgStore {
    client: Client,
    header: Header,
    index: SessionIndex,
    fence: Option<Fence>,
    /// Set once a commit was refused because the lease was lost.
    lost: Arc<AtomicBool>,
    /// The inbox row the running turn consumes, deleted by its next commit.
    take: Arc<Mutex<Option<i64>>>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("id", &self.header.id).field("fence", &self.fence).finish_non_exhaustive()
    }
}

fn where_(id: &str) -> String {
    format!("postgres session {id}")
}

fn backend(id: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::Backend { path: where_(id), reason: e.to_string() }
}

fn signed(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

fn unsigned(seq: i64) -> u64 {
    u64::try_from(seq).unwrap_or(0)
}

/// Connect and make sure the schema is there and not newer than ours.
pub fn connect(url: &str) -> Result<Client, PgError> {
    let mut client = Client::connect(url, postgres::NoTls)?;
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
            .map_err(|e| backend(&id, e))?;
        if inserted == 0 {
            return Err(StorageError::Exists { path: where_(&id) });
        }
        Ok(Self::new(client, header, SessionIndex::new(), None))
    }

    fn new(client: Client, header: Header, index: SessionIndex, fence: Option<Fence>) -> Self {
        Self { client, header, index, fence, lost: Arc::default(), take: Arc::default() }
    }

    /// Open a session for reading and unfenced writing (a commit is refused
    /// while another holder's lease is live).
    pub fn open(client: Client, id: &str) -> Result<Self, StorageError> {
        Self::open_with(client, id, None)
    }

    /// Open a session to drive it under `fence` (a lease claimed by
    /// `lease::claim`).
    pub fn open_fenced(client: Client, id: &str, fence: Fence) -> Result<Self, StorageError> {
        Self::open_with(client, id, Some(fence))
    }

    fn open_with(mut client: Client, id: &str, fence: Option<Fence>) -> Result<Self, StorageError> {
        let (header, index) = load(&mut client, id)?;
        Ok(Self::new(client, header, index, fence))
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

    /// The connection back (to release the lease, or reuse it).
    pub fn into_client(self) -> Client {
        self.client
    }

    /// The connection.
    pub fn client(&mut self) -> &mut Client {
        &mut self.client
    }

    fn write(&mut self, records: &[Record]) -> Result<(), StorageError> {
        let id = self.header.id.clone();
        let e = |err: postgres::Error| backend(&id, err);
        let line = encode_line(records).map_err(|err| StorageError::Encode(err.to_string()))?;
        let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
        let first = records.first().map_or(0, Record::seq);
        let last = records.last().map_or(0, Record::seq);
        let take = self.take.lock().ok().and_then(|g| *g);
        let mut tx = self.client.transaction().map_err(e)?;
        let row = tx
            .query_opt(
                "SELECT last_seq, epoch, lease_owner, COALESCE(lease_expires > now(), false)
                 FROM cairn_sessions WHERE id = $1 FOR UPDATE",
                &[&id],
            )
            .map_err(e)?
            .ok_or_else(|| backend(&id, "the session row is gone"))?;
        let stored: i64 = row.get(0);
        let epoch: i64 = row.get(1);
        let owner: Option<String> = row.get(2);
        let live: bool = row.get(3);
        match &self.fence {
            Some(f) if !(live && epoch == f.epoch && owner.as_deref() == Some(f.owner.as_str())) => {
                self.lost.store(true, Ordering::SeqCst);
                return Err(backend(
                    &id,
                    format!(
                        "lease lost: this worker ({}) holds epoch {} but the session is at epoch {epoch}, owner {}, lease {}; nothing was written — the worker must back off",
                        f.owner,
                        f.epoch,
                        owner.as_deref().unwrap_or("none"),
                        if live { "live" } else { "expired" }
                    ),
                ));
            }
            None if live && owner.is_some() => {
                return Err(StorageError::Busy { path: where_(&id), pid: None });
            }
            _ => {}
        }
        if unsigned(stored) != self.index.last_seq() {
            return Err(StorageError::Invalid(format!(
                "{}: another writer committed (stored seq {stored}, this handle saw {}); reopen the session",
                where_(&id),
                self.index.last_seq()
            )));
        }
        let owner_name = self.fence.as_ref().map(|f| f.owner.clone());
        tx.execute(
            "INSERT INTO cairn_lines (session_id, first_seq, last_seq, line, epoch, owner) VALUES ($1, $2, $3, $4, $5, $6)",
            &[&id, &signed(first), &signed(last), &text, &epoch, &owner_name],
        )
        .map_err(e)?;
        let lease_secs = self.fence.as_ref().map(|f| f.lease.as_secs_f64());
        tx.execute(
            "UPDATE cairn_sessions SET last_seq = $2, updated_at = now(),
                 lease_expires = CASE WHEN $3::float8 IS NULL THEN lease_expires
                                      ELSE now() + make_interval(secs => $3::float8) END
             WHERE id = $1",
            &[&id, &signed(last), &lease_secs],
        )
        .map_err(e)?;
        if let Some(inbox) = take {
            let n =
                tx.execute("DELETE FROM cairn_inbox WHERE id = $1 AND session_id = $2", &[&inbox, &id]).map_err(e)?;
            if n != 1 {
                return Err(StorageError::Invalid(format!(
                    "{}: the submitted prompt (inbox row {inbox}) was already taken by another writer",
                    where_(&id)
                )));
            }
        }
        tx.commit().map_err(e)?;
        if take.is_some()
            && let Ok(mut slot) = self.take.lock()
        {
            *slot = None;
        }
        Ok(())
    }
}

/// The header and the index of session `id`, replayed from its lines.
fn load(client: &mut Client, id: &str) -> Result<(Header, SessionIndex), StorageError> {
    let e = |err: postgres::Error| backend(id, err);
    let row = client
        .query_opt("SELECT header, last_seq FROM cairn_sessions WHERE id = $1", &[&id])
        .map_err(e)?
        .ok_or_else(|| StorageError::Io {
            path: where_(id),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such session in the database"),
        })?;
    let header_text: String = row.get(0);
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
    let rows = client
        .query("SELECT line, first_seq FROM cairn_lines WHERE session_id = $1 ORDER BY first_seq", &[&id])
        .map_err(e)?;
    for (n, row) in rows.iter().enumerate() {
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
    let e = |err: postgres::Error| backend(id, err);
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

/// Import a JSONL session file (as `cairn export` or the JSONL backend
/// wrote it) as a new session; every line is replayed and checked first.
/// Returns the session id.
pub fn import(client: &mut Client, bytes: &[u8]) -> Result<String, StorageError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| StorageError::BadHeader { path: "import".to_owned(), reason: format!("not UTF-8: {e}") })?;
    let mut lines = text.split_terminator('\n');
    let header_line = lines.next().unwrap_or_default();
    let header = decode_header(header_line.as_bytes())
        .map_err(|e| StorageError::BadHeader { path: "import".to_owned(), reason: e.to_string() })?;
    if header.storage_version > STORAGE_VERSION {
        return Err(StorageError::NewerVersion {
            path: "import".to_owned(),
            found: header.storage_version,
            supported: STORAGE_VERSION,
        });
    }
    let id = header.id.clone();
    let e = |err: postgres::Error| backend(&id, err);
    let mut index = SessionIndex::new();
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate() {
        let corrupt =
            |reason: String| StorageError::Corrupt { path: "import".to_owned(), line: n as u64 + 2, offset: 0, reason };
        let mut records = Vec::new();
        decode_line_into(line.as_bytes(), &mut records).map_err(|err| corrupt(err.to_string()))?;
        let first = records.first().map_or(0, Record::seq);
        for record in records {
            index.apply(record).map_err(corrupt)?;
        }
        rows.push((first, index.last_seq(), line));
    }
    let mut tx = client.transaction().map_err(e)?;
    let inserted = tx
        .execute(
            "INSERT INTO cairn_sessions (id, header, last_seq) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING",
            &[&id, &header_line, &signed(index.last_seq())],
        )
        .map_err(e)?;
    if inserted == 0 {
        return Err(StorageError::Exists { path: where_(&id) });
    }
    for (first, last, line) in rows {
        tx.execute(
            "INSERT INTO cairn_lines (session_id, first_seq, last_seq, line, epoch) VALUES ($1, $2, $3, $4, 0)",
            &[&id, &signed(first), &signed(last), &line],
        )
        .map_err(e)?;
    }
    tx.commit().map_err(e)?;
    Ok(id)
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
}
