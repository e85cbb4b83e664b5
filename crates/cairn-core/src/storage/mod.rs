//! The durable session store: one append-only session file is the single
//! source of truth for everything a session did.
//!
//! This module owns the record model (header, entries, registers, usage,
//! state), the [`Storage`] trait every backend implements, and the
//! [`SessionIndex`]: the in-memory maps that a replay of the log builds and
//! that every query reads. Backends differ only in how they make a
//! [`Transaction`] durable; validation of a transaction (seq order, write-once
//! entries, known parents, namespaces and their lifecycles, the CAS on the
//! state) happens in one place, [`SessionIndex::plan`], for all of them, and
//! replay applies records through [`SessionIndex::apply`], so in-memory state
//! equals a replay of the log.
//!
//! What hosts call: [`JsonlStore::create`] / [`JsonlStore::open`] /
//! [`JsonlStore::open_read_only`], [`new_session_id`], [`check_file`] (for
//! `cairn check`), [`Tail`] and [`format_record`] (for `cairn log [--follow]`),
//! and the [`Storage`] trait. The file format, the commit protocol and what a
//! crash does at each step are in `docs/storage-format.md`.
//!
//! It must not know what entries *mean* (messages, tool events): that belongs
//! to the turn. Payloads stay raw JSON text until someone asks.

/// The read half of [`Storage`] for backends that answer every query from
/// a [`SessionIndex`] held in a field named `index` (every backend today,
/// `cairn-pg`'s included), so the reads are written once. Used inside an
/// `impl Storage for …` block: `cairn_core::storage::reads_from_index!();`.
#[macro_export]
#[doc(hidden)]
macro_rules! __storage_reads_from_index {
    () => {
        fn last_seq(&self) -> u64 {
            self.index.last_seq()
        }

        fn entry(&self, id: &str) -> Option<$crate::storage::Entry> {
            self.index.entry(id)
        }

        fn visit_entry(&self, id: &str, f: &mut dyn FnMut(&$crate::storage::Entry)) -> bool {
            self.index.visit_entry(id, f)
        }

        fn children(&self, parent: Option<&str>) -> Vec<$crate::storage::Entry> {
            self.index.children(parent)
        }

        fn path_to(&self, leaf: &str) -> Result<Vec<$crate::storage::Entry>, $crate::storage::StorageError> {
            self.index.path_to(leaf)
        }

        fn visit_path_views(
            &self,
            leaf: &str,
            f: &mut dyn FnMut($crate::storage::EntryView<'_>),
        ) -> Result<(), $crate::storage::StorageError> {
            self.index.visit_path_views(leaf, f)
        }

        fn entries(&self) -> Vec<$crate::storage::Entry> {
            self.index.entries().collect()
        }

        fn visit_entries(&self, f: &mut dyn FnMut(&$crate::storage::Entry)) {
            self.index.visit_entries(f);
        }

        fn visit_entry_views(&self, f: &mut dyn FnMut($crate::storage::EntryView<'_>)) {
            self.index.visit_entry_views(f);
        }

        fn visit_entry_views_from(&self, first: usize, f: &mut dyn FnMut($crate::storage::EntryView<'_>)) {
            self.index.visit_entry_views_from(first, f);
        }

        fn shared_index(&self) -> Option<&$crate::storage::SessionIndex> {
            Some(&self.index)
        }

        fn entry_count(&self) -> usize {
            self.index.entry_count()
        }

        fn register(&self, namespace: &str, key: &str) -> Option<$crate::storage::RawJson> {
            self.index.register(namespace, key).cloned()
        }

        fn registers(&self, namespace: &str) -> Vec<(String, $crate::storage::RawJson)> {
            self.index.registers(namespace).map(|(k, v)| (k.to_owned(), v.clone())).collect()
        }

        fn usage(&self) -> Vec<$crate::storage::UsageRow> {
            self.index.usage().to_vec()
        }

        fn visit_usage_newest_first(&self, f: &mut dyn FnMut(&$crate::storage::UsageRow) -> bool) {
            for row in self.index.usage().iter().rev() {
                if !f(row) {
                    break;
                }
            }
        }

        fn state(&self) -> Option<$crate::storage::State> {
            self.index.state().cloned()
        }
    };
}
pub use crate::__storage_reads_from_index as reads_from_index;

/// Separates a parent session's id from the invocation that spawned a
/// child in the child's id (`<parent>+<invocation>`, nested as deep as the
/// family goes). The one spelling for every backend and face: a file
/// family's ids, a database family's rows, approval question ids and the
/// worker's claim (a child is never claimed on its own).
pub const FAMILY_SEP: char = '+';

/// Whether `target`, given as an id prefix, names session `id`: the id
/// starts with it, and a child's id (`<parent>+<invocation>`) only when the
/// target reaches into the child's part (has [`FAMILY_SEP`]), so a parent's
/// prefix names the parent, not its children. The one rule of every
/// backend's resolver (session files, database rows).
pub fn prefix_names(target: &str, id: &str) -> bool {
    id.starts_with(target) && (target.contains(FAMILY_SEP) || !id.contains(FAMILY_SEP))
}

mod check;
mod chunked;
mod index;
mod jsonl;
mod line;
mod memory;
mod migrate;
mod record;
pub mod registers;
mod replay;
#[cfg(feature = "sqlite")]
mod sqlite;
mod summary;
mod tail;

pub use check::{CheckReport, check_file, check_file_read, check_file_with, header_id_mismatch};
pub use jsonl::{
    CompactStep, DEFAULT_COMPACT_RATIO, DEFAULT_MAX_LINE_BYTES, Durability, JsonlStore, MAX_IMPORTED_ID_BYTES,
    StoreOptions, check_imported_id, check_session_id, lock_path, new_session_id,
};
pub use line::{
    EntryRead, LineError, decode_header, decode_line, decode_line_into, encode_header, encode_line, format_record,
};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use summary::{FileSummary, read_summary};
pub use tail::Tail;

pub use index::SessionIndex;
pub use memory::MemStore;
pub use record::{
    Committed, Entry, EntryView, Header, NamespaceRoot, RawJson, Record, RegisterOp, RegisterRecord, STORAGE_VERSION,
    State, Transaction, TxOp, UsageRow, now_millis, to_raw,
};

/// Errors of the session store. Every message says what was wrong and, where
/// a person can act, what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// An I/O failure on the session file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Another writer holds the session.
    #[error(
        "session is busy: {path} is open for writing by another writer{}; wait for it to finish or open the session read-only",
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Busy {
        /// The session file.
        path: String,
        /// The holder's pid, when known.
        pid: Option<u32>,
    },
    /// A line in the middle of the file is not a valid record.
    #[error(
        "{path}: line {line} (byte offset {offset}) is corrupt: {reason}; the file was not changed — run `cairn check` for details"
    )]
    Corrupt {
        /// The session file.
        path: String,
        /// 1-based line number.
        line: u64,
        /// Byte offset of the line's start.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The file has no valid header line.
    #[error("{path}: missing or invalid header line: {reason}")]
    BadHeader {
        /// The session file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The file was written by a newer cairn.
    #[error(
        "{path}: storage version {found} is newer than this cairn supports (version {supported}); upgrade cairn to open it"
    )]
    NewerVersion {
        /// The session file.
        path: String,
        /// Version found in the header.
        found: u32,
        /// Newest version this build reads.
        supported: u32,
    },
    /// A transaction broke an invariant of the log; nothing was written.
    #[error("invalid transaction: {0}")]
    Invalid(String),
    /// The compare-and-swap on the state failed: someone else moved it.
    #[error("state changed concurrently: expected state seq {expected}, found {actual}")]
    StateConflict {
        /// The seq the caller expected.
        expected: u64,
        /// The seq found.
        actual: u64,
    },
    /// The store was opened read-only.
    #[error("{path}: session is open read-only")]
    ReadOnly {
        /// The session file.
        path: String,
    },
    /// A value could not be encoded as JSON.
    #[error("cannot encode value: {0}")]
    Encode(String),
    /// A session with this id already exists.
    #[error("{path}: a session with this id already exists; open it instead, or create one with a new id")]
    Exists {
        /// The session file.
        path: String,
    },
    /// A database backend (SQLite) failed.
    #[error("{path}: database error: {reason}")]
    Backend {
        /// The database file.
        path: String,
        /// What the database said.
        reason: String,
    },
    /// The entry asked for does not exist.
    #[error("no entry with id {0:?}")]
    NoSuchEntry(String),
    /// The path names something other than a regular file (a FIFO, a
    /// device, a directory, a socket), directly or through a symlink.
    #[error(
        "{path}: is {what}, not a regular file; a session file is a plain file — move it out of the sessions directory"
    )]
    NotRegular {
        /// The path.
        path: String,
        /// What it is ("a FIFO", "a character device", …).
        what: &'static str,
    },
    /// A writable open met a symlink where the session file should be.
    #[error(
        "{path}: is a symlink; cairn refuses to write a session through a symlink — open the file it points to by its own path, or replace the link with the file"
    )]
    Symlink {
        /// The path.
        path: String,
    },
    /// A line is longer than the configured limit.
    #[error(
        "{path}: line {line} (byte offset {offset}) is longer than the limit of {limit} bytes; the file was not changed — if the session is genuine, raise the limit (StoreOptions::max_line_bytes, `storage.max_line_bytes` in cairn's config)"
    )]
    LineTooLong {
        /// The session file.
        path: String,
        /// 1-based line number (0 when reading backwards, where it is unknown).
        line: u64,
        /// Byte offset of the line's start.
        offset: u64,
        /// The limit in bytes.
        limit: u64,
    },
}

/// The logical model of a session, identical across backends.
///
/// Reads return owned values so that backends which do not keep everything
/// in memory (SQLite) can implement them; the JSONL backend answers from its
/// [`SessionIndex`].
pub trait Storage {
    /// The session's header.
    fn header(&self) -> &Header;

    /// Append one transaction atomically: either every record of it becomes
    /// part of the log, or none does. Assigns strictly increasing seqs and
    /// timestamps. Fails with [`StorageError::StateConflict`] when the
    /// transaction sets the state and the expected seq is stale.
    fn commit(&mut self, tx: Transaction) -> Result<Committed, StorageError>;

    /// The highest seq in the log (0 for an empty session).
    fn last_seq(&self) -> u64;

    /// One entry by id.
    fn entry(&self, id: &str) -> Option<Entry>;

    /// Call `f` on the entry `id` without copying it, when there is one;
    /// returns whether there was (the backends that hold entries in memory
    /// override the default, which copies through [`entry`](Self::entry)).
    fn visit_entry(&self, id: &str, f: &mut dyn FnMut(&Entry)) -> bool {
        match self.entry(id) {
            Some(entry) => {
                f(&entry);
                true
            }
            None => false,
        }
    }

    /// Entries whose parent is `parent` (roots when `None`), in seq order.
    fn children(&self, parent: Option<&str>) -> Vec<Entry>;

    /// The path from the root to `leaf`, root first.
    fn path_to(&self, leaf: &str) -> Result<Vec<Entry>, StorageError>;

    /// Call `f` on each entry from `leaf` up to its root, leaf first, lent
    /// as an [`EntryView`] (the backends that hold entries in memory
    /// override the default, which copies the path through
    /// [`path_to`](Self::path_to)).
    fn visit_path_views(&self, leaf: &str, f: &mut dyn FnMut(EntryView<'_>)) -> Result<(), StorageError> {
        for entry in self.path_to(leaf)?.iter().rev() {
            f(entry.view());
        }
        Ok(())
    }

    /// Every entry, in seq order.
    fn entries(&self) -> Vec<Entry>;

    /// Call `f` on every entry, in seq order, without copying them (the
    /// backends that hold entries in memory override the default, which
    /// copies through [`entries`](Self::entries)).
    fn visit_entries(&self, f: &mut dyn FnMut(&Entry)) {
        for entry in self.entries() {
            f(&entry);
        }
    }

    /// Call `f` on every entry, in seq order, lent as an [`EntryView`]
    /// (the backends that hold entries in memory override the default,
    /// which lends each entry of [`visit_entries`](Self::visit_entries)).
    fn visit_entry_views(&self, f: &mut dyn FnMut(EntryView<'_>)) {
        self.visit_entries(&mut |entry| f(entry.view()));
    }

    /// [`visit_entry_views`](Self::visit_entry_views) from the entry at
    /// position `first` (0 is the first entry) on: what a reader that
    /// already saw the first `first` entries takes (the backends that hold
    /// entries in memory override the default, which walks past them).
    fn visit_entry_views_from(&self, first: usize, f: &mut dyn FnMut(EntryView<'_>)) {
        let mut at = 0usize;
        self.visit_entry_views(&mut |entry| {
            if at >= first {
                f(entry);
            }
            at += 1;
        });
    }

    /// Number of entries.
    fn entry_count(&self) -> usize;

    /// The in-memory index that answers this store's reads, for a reader
    /// of every entry on another thread (a [`SessionIndex`] is `Sync`, a
    /// store need not be): `Session::open` checks the tool lifecycle there
    /// while it rebuilds the context. `None` (the default) for a backend
    /// that holds no such index.
    fn shared_index(&self) -> Option<&SessionIndex> {
        None
    }

    /// A register's current value.
    fn register(&self, namespace: &str, key: &str) -> Option<RawJson>;

    /// Every live key of a namespace with its value, sorted by key.
    fn registers(&self, namespace: &str) -> Vec<(String, RawJson)>;

    /// The usage ledger, in seq order.
    fn usage(&self) -> Vec<UsageRow>;

    /// Call `f` on the usage rows, newest first, until it returns `false`,
    /// without copying the ledger (the backends that hold it in memory
    /// override the default, which copies through [`usage`](Self::usage)).
    fn visit_usage_newest_first(&self, f: &mut dyn FnMut(&UsageRow) -> bool) {
        for row in self.usage().iter().rev() {
            if !f(row) {
                break;
            }
        }
    }

    /// The singleton state, once set.
    fn state(&self) -> Option<State>;

    /// Make every commit so far durable (for grouped or no durability).
    fn sync(&mut self) -> Result<(), StorageError>;

    /// Whether this handle may let an effect start now (a tool's run, a
    /// re-run on resume, a staged change set's apply, a bypassed command):
    /// a store whose right to write is limited in time (a PostgreSQL
    /// worker's lease) refuses once too little of it is surely left for the
    /// effect to end before it. The turn asks immediately before every
    /// effect (`turn::effect::precondition`); the default always allows.
    fn may_act(&self) -> Result<(), NotHeld> {
        Ok(())
    }
}

/// Why a store refused to let an effect start ([`Storage::may_act`]): the
/// handle's right to write may end before the effect would.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotHeld(pub String);
