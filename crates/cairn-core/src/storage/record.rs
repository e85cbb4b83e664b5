//! The records of a session log and the transaction builder.
//!
//! Field names are camelCase as on disk (see `docs/storage-format.md`).
//! Payloads and register values are kept as raw JSON text
//! (`RawJson`): they are parsed only when someone asks.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::StorageError;

/// The newest storage version this build writes and reads.
pub const STORAGE_VERSION: u32 = 1;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Encode any serializable value as raw JSON text.
pub fn to_raw<T: Serialize + ?Sized>(value: &T) -> Result<RawJson, StorageError> {
    serde_json::value::to_raw_value(value).map(RawJson).map_err(|e| StorageError::Encode(e.to_string()))
}

/// A JSON value kept as its raw text (parsed only on demand). Two values
/// are equal when their text is equal.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RawJson(pub Box<RawValue>);

impl RawJson {
    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Parse into a typed value.
    pub fn parse<'a, T: Deserialize<'a>>(&'a self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// Raw JSON text from text known to be one valid JSON value (the
    /// text of a `RawValue` kept elsewhere, e.g. in the index's arena),
    /// without parsing it again.
    pub(crate) fn from_valid(text: &str) -> Self {
        let text: Box<str> = text.into();
        // SAFETY: `RawValue` is `#[repr(transparent)]` over `str` (serde_json
        // converts `Box<str>` to `Box<RawValue>` the same way in its private
        // `RawValue::from_owned`), so the layouts agree; and the text is
        // valid JSON because every caller copies it from a `RawValue`.
        Self(unsafe { std::mem::transmute::<Box<str>, Box<RawValue>>(text) })
    }

    /// Raw JSON text from a string that must be valid JSON.
    pub fn from_json(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text.into()).map(RawJson)
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl std::fmt::Debug for RawJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

/// The first line of every session file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Header {
    /// Line-format version (always 1).
    pub v: u32,
    /// Always "header".
    pub kind: String,
    /// Session id.
    pub id: String,
    /// Storage version of the file. A header without the field is storage
    /// version 0 (migrated at open, see `migrate.rs`).
    #[serde(default)]
    pub storage_version: u32,
    /// Creation time, ms since the Unix epoch.
    pub created_at: i64,
    /// The session's working directory.
    pub cwd: String,
}

impl Header {
    /// A header for a new session.
    pub fn new(id: impl Into<String>, cwd: impl Into<String>) -> Self {
        Self {
            v: 1,
            kind: "header".to_owned(),
            id: id.into(),
            storage_version: STORAGE_VERSION,
            created_at: now_millis(),
            cwd: cwd.into(),
        }
    }
}

/// An immutable node of the conversation tree.
///
/// The field order is the on-disk key order of the seed's line format
/// (`kind, seq, timestamp, id, parentId, type, payload`; `kind` comes from
/// [`Record`]'s tag): serde writes fields in declaration order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Seq of the record that created it.
    pub seq: u64,
    /// Commit time, ms since the Unix epoch.
    pub timestamp: i64,
    /// Unique, write-once id.
    pub id: String,
    /// Parent entry (`None` for a root).
    pub parent_id: Option<String>,
    /// What the entry is (e.g. "message", "toolRequested").
    #[serde(rename = "type")]
    pub entry_type: String,
    /// The payload, raw JSON text.
    pub payload: RawJson,
}

impl Entry {
    /// This entry lent as an [`EntryView`].
    pub fn view(&self) -> EntryView<'_> {
        EntryView {
            seq: self.seq,
            timestamp: self.timestamp,
            id: &self.id,
            parent_id: self.parent_id.as_deref(),
            entry_type: &self.entry_type,
            payload: self.payload.get(),
        }
    }
}

/// An entry lent without a copy: its parts borrowed from wherever they
/// are held (the line being replayed, the index's arena, an [`Entry`]).
/// What a reader that looks at every entry once takes (the strict
/// lifecycle check at open and in `cairn check`): no allocation per entry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntryView<'a> {
    /// Seq of the record that created it.
    pub seq: u64,
    /// Commit time, ms since the Unix epoch.
    pub timestamp: i64,
    /// Unique, write-once id.
    pub id: &'a str,
    /// Parent entry (`None` for a root).
    pub parent_id: Option<&'a str>,
    /// What the entry is.
    pub entry_type: &'a str,
    /// The payload's JSON text.
    pub payload: &'a str,
}

impl<'a> EntryView<'a> {
    /// Parse the payload into a typed value (as [`RawJson::parse`] does).
    pub fn parse<T: Deserialize<'a>>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.payload)
    }

    /// An owned copy of the entry (for the few a reader keeps). The
    /// payload is checked as JSON again: a view may be made by anyone.
    pub fn to_entry(&self) -> Result<Entry, serde_json::Error> {
        Ok(Entry {
            seq: self.seq,
            timestamp: self.timestamp,
            id: self.id.to_owned(),
            parent_id: self.parent_id.map(str::to_owned),
            entry_type: self.entry_type.to_owned(),
            payload: RawJson::from_json(self.payload)?,
        })
    }
}

/// Set or delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RegisterOp {
    /// Overwrite the key's value.
    Set,
    /// Remove the key.
    Delete,
}

/// A register change as it stands in the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterRecord {
    /// Set or delete.
    pub op: RegisterOp,
    /// Seq of the record.
    pub seq: u64,
    /// Namespace (`lane`, `op`, `pending`, `fact`, optionally `root.sub`).
    pub namespace: String,
    /// Key within the namespace.
    pub key: String,
    /// The value (absent for delete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<RawJson>,
}

/// A row of the append-only usage ledger (one per provider attempt).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageRow {
    /// Seq of the record.
    pub seq: u64,
    /// Unique id of the row.
    pub id: String,
    /// The entry the usage belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_id: Option<String>,
    /// The usage figures, raw JSON.
    pub usage: RawJson,
}

/// The singleton state: the program counter and the seq it was set at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct State {
    /// Seq of the record that set it; the CAS compares against this.
    pub seq: u64,
    /// The program counter, raw JSON (its meaning belongs to the turn).
    pub pc: RawJson,
}

/// The four register namespaces and their lifecycles.
///
/// - `lane`: the durable head of each branch, key = lane name, value = the
///   entry id of its head. Set when a lane advances or is forked (a fork is a
///   new lane pointing at an existing entry, never a copy); deleted only when
///   a person removes a lane.
/// - `op`: per-operation progress (e.g. the turn's provider-call intent),
///   set while the operation runs, deleted when it settles.
/// - `pending`: an effect whose intent is committed and whose settlement is
///   not. Set in the intent commit, deleted in the settlement commit. A live
///   key at open is exactly an effect that a resume must settle.
/// - `fact`: durable facts about the session (name, model, allow rules);
///   overwritten freely, never deleted implicitly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NamespaceRoot {
    /// Heads of branches.
    Lane,
    /// In-flight operations.
    Op,
    /// Intents awaiting settlement.
    Pending,
    /// Durable session facts.
    Fact,
}

impl NamespaceRoot {
    /// The root of a namespace string (`"lane"` or `"lane.sub"`), if valid.
    pub fn of(namespace: &str) -> Option<Self> {
        let root = namespace.split_once('.').map_or(namespace, |(root, _)| root);
        match root {
            "lane" => Some(Self::Lane),
            "op" => Some(Self::Op),
            "pending" => Some(Self::Pending),
            "fact" => Some(Self::Fact),
            _ => None,
        }
    }
}

/// One operation of a transaction, before seqs are assigned.
#[derive(Debug, Clone, PartialEq)]
pub enum TxOp {
    /// Append an entry.
    Entry {
        /// Unique id.
        id: String,
        /// Parent (must exist, or be created earlier in the same transaction).
        parent_id: Option<String>,
        /// Entry type.
        entry_type: String,
        /// Payload.
        payload: RawJson,
    },
    /// Set a register.
    Set {
        /// Namespace.
        namespace: String,
        /// Key.
        key: String,
        /// Value.
        value: RawJson,
    },
    /// Delete a register.
    Delete {
        /// Namespace.
        namespace: String,
        /// Key.
        key: String,
    },
    /// Append a usage row.
    Usage {
        /// Row id.
        id: String,
        /// The entry it belongs to.
        entry_id: Option<String>,
        /// Figures.
        usage: RawJson,
    },
    /// Set the state, if its seq is still `expected` (CAS).
    State {
        /// The expected current state seq (0 when the state was never set).
        expected: u64,
        /// The new program counter.
        pc: RawJson,
    },
}

/// A group of records committed atomically as one line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Transaction {
    /// The operations, in order.
    pub ops: Vec<TxOp>,
}

impl Transaction {
    /// An empty transaction.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether it holds no operation.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Append an entry.
    pub fn entry(
        mut self,
        id: impl Into<String>,
        parent_id: Option<&str>,
        entry_type: impl Into<String>,
        payload: RawJson,
    ) -> Self {
        self.ops.push(TxOp::Entry {
            id: id.into(),
            parent_id: parent_id.map(str::to_owned),
            entry_type: entry_type.into(),
            payload,
        });
        self
    }

    /// Set a register.
    pub fn set(mut self, namespace: impl Into<String>, key: impl Into<String>, value: RawJson) -> Self {
        self.ops.push(TxOp::Set { namespace: namespace.into(), key: key.into(), value });
        self
    }

    /// Delete a register.
    pub fn delete(mut self, namespace: impl Into<String>, key: impl Into<String>) -> Self {
        self.ops.push(TxOp::Delete { namespace: namespace.into(), key: key.into() });
        self
    }

    /// Append a usage row.
    pub fn usage(mut self, id: impl Into<String>, entry_id: Option<&str>, usage: RawJson) -> Self {
        self.ops.push(TxOp::Usage { id: id.into(), entry_id: entry_id.map(str::to_owned), usage });
        self
    }

    /// Move the state by compare-and-swap on its seq.
    pub fn state(mut self, expected: u64, pc: RawJson) -> Self {
        self.ops.push(TxOp::State { expected, pc });
        self
    }
}

/// What a commit wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// Seq of the first record.
    pub first_seq: u64,
    /// Seq of the last record.
    pub last_seq: u64,
    /// The new state seq, when the transaction moved the state.
    pub state_seq: Option<u64>,
}

/// One record of the log after seqs are assigned: what a line (or an element
/// of an array line) holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Record {
    /// An entry.
    Entry(Entry),
    /// A register change.
    Register(RegisterRecord),
    /// A usage row.
    Usage(UsageRow),
    /// The state.
    State(State),
}

impl Record {
    /// The record's seq.
    pub fn seq(&self) -> u64 {
        match self {
            Record::Entry(e) => e.seq,
            Record::Register(r) => r.seq,
            Record::Usage(u) => u.seq,
            Record::State(s) => s.seq,
        }
    }
}
