//! The optional SQLite backend (`--features sqlite`): one `.db` file per
//! session, WAL mode, every commit one `BEGIN IMMEDIATE` transaction with
//! `synchronous=FULL`, the seed's three stores (entries `WITHOUT ROWID`,
//! registers, usage ledger) plus the state row and a meta table.
//!
//! It owns only the mapping of records to tables. Validation goes through
//! [`SessionIndex::plan`] like every backend, and the in-memory index is
//! rebuilt at open by applying the stored records in seq order through
//! [`SessionIndex::apply`]. One writer per session, as for JSONL: the same
//! `<file>.lock` sidecar. As a second line of defence, each write
//! transaction re-reads the stored last seq, so a writer that bypassed the
//! lock and committed in between is caught instead of overwritten.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::index::SessionIndex;
use super::record::{
    Committed, Entry, Header, RawJson, Record, RegisterOp, RegisterRecord, STORAGE_VERSION, State, Transaction,
    UsageRow, now_millis,
};
use super::{Storage, StorageError};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS entries (
    id TEXT PRIMARY KEY, parent_id TEXT, seq INTEGER NOT NULL UNIQUE,
    timestamp INTEGER NOT NULL, type TEXT NOT NULL, payload TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS registers (
    namespace TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS usage_ledger (
    seq INTEGER PRIMARY KEY, id TEXT NOT NULL, entry_id TEXT, usage TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS state (
    one INTEGER PRIMARY KEY CHECK (one = 1), seq INTEGER NOT NULL, pc TEXT NOT NULL
);
";

/// A session stored in its own SQLite database.
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    conn: Connection,
    /// The one-writer lock (`<file>.lock`), as for JSONL.
    _lock: std::fs::File,
    header: Header,
    index: SessionIndex,
}

fn db_err(path: &Path) -> impl Fn(rusqlite::Error) -> StorageError + '_ {
    move |e| StorageError::Backend { path: path.display().to_string(), reason: e.to_string() }
}

fn raw(path: &Path, text: String) -> Result<RawJson, StorageError> {
    RawJson::from_json(text).map_err(|e| StorageError::Corrupt {
        path: path.display().to_string(),
        line: 0,
        offset: 0,
        reason: format!("stored value is not JSON: {e}"),
    })
}

fn connect(path: &Path) -> Result<Connection, StorageError> {
    let conn = Connection::open(path).map_err(db_err(path))?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(db_err(path))?;
    conn.pragma_update(None, "synchronous", "FULL").map_err(db_err(path))?;
    conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(db_err(path))?;
    Ok(conn)
}

impl SqliteStore {
    /// Create the session database `dir/<header.id>.db` and open it.
    pub fn create(dir: &Path, header: Header) -> Result<Self, StorageError> {
        std::fs::create_dir_all(dir).map_err(|source| StorageError::Io { path: dir.display().to_string(), source })?;
        let path = dir.join(format!("{}.db", header.id));
        if path.exists() {
            return Err(StorageError::Exists { path: path.display().to_string() });
        }
        let lock = super::jsonl::lock(&path)?;
        let mut conn = connect(&path)?;
        let text = serde_json::to_string(&header).map_err(|e| StorageError::Encode(e.to_string()))?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(db_err(&path))?;
        tx.execute_batch(SCHEMA).map_err(db_err(&path))?;
        tx.execute("INSERT INTO meta (key, value) VALUES ('header', ?1), ('lastSeq', '0')", params![text])
            .map_err(db_err(&path))?;
        tx.commit().map_err(db_err(&path))?;
        Ok(Self { path, conn, _lock: lock, header, index: SessionIndex::new() })
    }

    /// Open an existing session database and rebuild its index.
    pub fn open(path: &Path) -> Result<Self, StorageError> {
        if !path.exists() {
            return Err(StorageError::Io {
                path: path.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such session database"),
            });
        }
        let lock = super::jsonl::lock(path)?;
        let conn = connect(path)?;
        let e = db_err(path);
        let header_text: Option<String> =
            conn.query_row("SELECT value FROM meta WHERE key = 'header'", [], |r| r.get(0)).optional().map_err(&e)?;
        let header: Header = header_text
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|err| StorageError::BadHeader { path: path.display().to_string(), reason: err.to_string() })?
            .ok_or_else(|| StorageError::BadHeader {
                path: path.display().to_string(),
                reason: "no header in the meta table".to_owned(),
            })?;
        if header.storage_version > STORAGE_VERSION {
            return Err(StorageError::NewerVersion {
                path: path.display().to_string(),
                found: header.storage_version,
                supported: STORAGE_VERSION,
            });
        }
        let mut records = load_records(&conn, path)?;
        records.sort_by_key(Record::seq);
        let mut index = SessionIndex::new();
        for record in records {
            index.apply(record).map_err(|reason| StorageError::Corrupt {
                path: path.display().to_string(),
                line: 0,
                offset: 0,
                reason,
            })?;
        }
        index.advance_seq(stored_last_seq(&conn).map_err(&e)?);
        Ok(Self { path: path.to_owned(), conn, _lock: lock, header, index })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, records: &[Record]) -> Result<(), StorageError> {
        let e = db_err(&self.path);
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(&e)?;
        let stored = stored_last_seq(&tx).map_err(&e)?;
        if stored != self.index.last_seq() {
            return Err(StorageError::Invalid(format!(
                "{}: another writer committed (stored seq {stored}, this handle saw {}); reopen the session",
                self.path.display(),
                self.index.last_seq()
            )));
        }
        for record in records {
            match record {
                Record::Entry(en) => tx.execute(
                    "INSERT INTO entries (id, parent_id, seq, timestamp, type, payload) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![en.id, en.parent_id, signed(en.seq), en.timestamp, en.entry_type, en.payload.get()],
                ),
                Record::Register(r) => match &r.value {
                    Some(value) if r.op == RegisterOp::Set => tx.execute(
                        "INSERT OR REPLACE INTO registers (namespace, key, seq, value) VALUES (?1, ?2, ?3, ?4)",
                        params![r.namespace, r.key, signed(r.seq), value.get()],
                    ),
                    _ => tx.execute("DELETE FROM registers WHERE namespace = ?1 AND key = ?2", params![r.namespace, r.key]),
                },
                Record::Usage(u) => tx.execute(
                    "INSERT INTO usage_ledger (seq, id, entry_id, usage) VALUES (?1, ?2, ?3, ?4)",
                    params![signed(u.seq), u.id, u.entry_id, u.usage.get()],
                ),
                Record::State(s) => tx.execute(
                    "INSERT OR REPLACE INTO state (one, seq, pc) VALUES (1, ?1, ?2)",
                    params![signed(s.seq), s.pc.get()],
                ),
            }
            .map_err(&e)?;
        }
        let last = records.last().map_or(stored, Record::seq);
        tx.execute("UPDATE meta SET value = ?1 WHERE key = 'lastSeq'", params![last.to_string()]).map_err(&e)?;
        tx.commit().map_err(&e)
    }
}

/// Every stored record (entries, live registers, usage, state), unsorted.
fn load_records(conn: &Connection, path: &Path) -> Result<Vec<Record>, StorageError> {
    let e = db_err(path);
    let mut records: Vec<Record> = Vec::new();
    let mut stmt =
        conn.prepare("SELECT id, parent_id, seq, timestamp, type, payload FROM entries ORDER BY seq").map_err(&e)?;
    let rows = stmt
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?, r.get(3)?, r.get(4)?, r.get::<_, String>(5)?))
        })
        .map_err(&e)?;
    for row in rows {
        let (id, parent_id, seq, timestamp, entry_type, payload) = row.map_err(&e)?;
        records.push(Record::Entry(Entry {
            id,
            parent_id,
            seq: unsigned(seq),
            timestamp,
            entry_type,
            payload: raw(path, payload)?,
        }));
    }
    let mut stmt = conn.prepare("SELECT namespace, key, seq, value FROM registers").map_err(&e)?;
    let rows =
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?, r.get::<_, String>(3)?))).map_err(&e)?;
    for row in rows {
        let (namespace, key, seq, value) = row.map_err(&e)?;
        records.push(Record::Register(RegisterRecord {
            op: RegisterOp::Set,
            seq: unsigned(seq),
            namespace,
            key,
            value: Some(raw(path, value)?),
        }));
    }
    let mut stmt = conn.prepare("SELECT seq, id, entry_id, usage FROM usage_ledger").map_err(&e)?;
    let rows =
        stmt.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get(1)?, r.get(2)?, r.get::<_, String>(3)?))).map_err(&e)?;
    for row in rows {
        let (seq, id, entry_id, usage) = row.map_err(&e)?;
        records.push(Record::Usage(UsageRow { seq: unsigned(seq), id, entry_id, usage: raw(path, usage)? }));
    }
    let state: Option<(i64, String)> =
        conn.query_row("SELECT seq, pc FROM state", [], |r| Ok((r.get(0)?, r.get(1)?))).optional().map_err(&e)?;
    if let Some((seq, pc)) = state {
        records.push(Record::State(State { seq: unsigned(seq), pc: raw(path, pc)? }));
    }
    Ok(records)
}

/// SQLite integers are signed; seqs never come near `i64::MAX`.
fn signed(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

fn unsigned(seq: i64) -> u64 {
    u64::try_from(seq).unwrap_or(0)
}

fn stored_last_seq(conn: &Connection) -> rusqlite::Result<u64> {
    let text: String = conn.query_row("SELECT value FROM meta WHERE key = 'lastSeq'", [], |r| r.get(0))?;
    Ok(text.parse().unwrap_or(0))
}

impl Storage for SqliteStore {
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

    super::reads_from_index!();

    fn sync(&mut self) -> Result<(), StorageError> {
        // synchronous=FULL: every commit is already durable.
        Ok(())
    }
}
