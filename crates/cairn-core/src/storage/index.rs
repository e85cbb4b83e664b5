//! The in-memory index of a session: what a replay of the log builds and
//! what every query reads.
//!
//! It owns the single place where a transaction is validated
//! ([`SessionIndex::plan`], which also checks each register namespace's
//! lifecycle through `registers.rs`) and where a record is applied
//! ([`SessionIndex::apply`]), for every backend and for replay alike, so the
//! in-memory state always equals a replay of the log. It does no I/O.

use std::collections::{BTreeMap, HashSet};

/// Entry ids by position in `entries`: a hash table of indices hashed by
/// the entry's own id, so ids are not stored twice (one allocation less per
/// entry on replay). Ids come from the session's own file, so a fast seeded
/// hasher is enough. Indices are `u32` (4 bytes a slot; a session holds
/// fewer than [`NONE`] entries, which [`SessionIndex::apply`] enforces).
#[derive(Clone, Default)]
struct IdTable {
    table: hashbrown::HashTable<u32>,
    hasher: foldhash::fast::RandomState,
}

impl std::fmt::Debug for IdTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdTable({} ids)", self.table.len())
    }
}

impl IdTable {
    fn hash(&self, id: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, id)
    }

    fn get(&self, entries: &[Entry], id: &str) -> Option<u32> {
        self.table.find(self.hash(id), |&i| entries[i as usize].id == id).copied()
    }

    /// Insert `index` (whose entry is already in `entries`).
    fn insert(&mut self, entries: &[Entry], index: u32) {
        let hash = self.hash(&entries[index as usize].id);
        let hasher = &self.hasher;
        self.table
            .insert_unique(hash, index, |&i| std::hash::BuildHasher::hash_one(hasher, entries[i as usize].id.as_str()));
    }
}

/// No entry (in [`Links`]); also the most entries one index holds.
const NONE: u32 = u32::MAX;

/// Tree links of one entry, by index into `entries`: its first and last
/// child and its next sibling. A flat vector instead of a map of child
/// lists: no allocation per entry; `u32` indices, 12 bytes an entry.
#[derive(Debug, Clone, Copy)]
struct Links {
    first_child: u32,
    last_child: u32,
    next_sibling: u32,
}

use super::record::{
    Entry, NamespaceRoot, RawJson, Record, RegisterOp, RegisterRecord, State, Transaction, TxOp, UsageRow,
};
use super::{Committed, StorageError};

/// Entries, registers, usage and state of one session, in memory.
#[derive(Debug, Default, Clone)]
pub struct SessionIndex {
    entries: Vec<Entry>,
    by_id: IdTable,
    /// Tree links, parallel to `entries`.
    links: Vec<Links>,
    /// Root entries (no parent), in seq order.
    roots: Vec<u32>,
    registers: BTreeMap<String, BTreeMap<String, RawJson>>,
    usage: Vec<UsageRow>,
    state: Option<State>,
    last_seq: u64,
    /// Register records that no longer contribute to the live state
    /// (overwritten sets, deletes and the sets they removed).
    dead_records: u64,
}

impl super::registers::Before for SessionIndex {
    fn is_set(&self, namespace: &str, key: &str) -> bool {
        self.register(namespace, key).is_some()
    }
    fn has_entry(&self, id: &str) -> bool {
        self.entry(id).is_some()
    }
}

impl SessionIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Validate `tx` against the current state and turn it into records with
    /// seqs `last_seq + 1 ..` and the given timestamp. Changes nothing.
    pub fn plan(&self, tx: Transaction, timestamp: i64) -> Result<Vec<Record>, StorageError> {
        if tx.ops.is_empty() {
            return Err(StorageError::Invalid("empty transaction".to_owned()));
        }
        // Each register namespace's lifecycle (lane, op, pending, fact).
        super::registers::check(self, &tx)?;
        let mut seq = self.last_seq;
        let mut new_ids: HashSet<String> = HashSet::new();
        let mut state_seq = self.state.as_ref().map_or(0, |s| s.seq);
        let mut records = Vec::with_capacity(tx.ops.len());
        for op in tx.ops {
            // A wrapped seq would be written (and then refused by every
            // replay): refuse before anything reaches the file.
            seq = seq.checked_add(1).ok_or_else(|| {
                StorageError::Invalid(format!(
                    "the session's seqs are exhausted (last seq {}): it cannot take another commit; nothing was written — continue in a new session",
                    self.last_seq
                ))
            })?;
            let record = match op {
                TxOp::Entry { id, parent_id, entry_type, payload } => {
                    if id.is_empty() {
                        return Err(StorageError::Invalid("entry id is empty".to_owned()));
                    }
                    if self.by_id.get(&self.entries, &id).is_some() || new_ids.contains(&id) {
                        return Err(StorageError::Invalid(format!(
                            "duplicate entry id {id:?} (entries are write-once)"
                        )));
                    }
                    if let Some(parent) = &parent_id
                        && self.by_id.get(&self.entries, parent).is_none()
                        && !new_ids.contains(parent)
                    {
                        return Err(StorageError::Invalid(format!("entry {id:?} has unknown parent {parent:?}")));
                    }
                    new_ids.insert(id.clone());
                    Record::Entry(Entry { id, parent_id, seq, timestamp, entry_type, payload })
                }
                TxOp::Set { namespace, key, value } => {
                    check_namespace(&namespace)?;
                    Record::Register(RegisterRecord { op: RegisterOp::Set, seq, namespace, key, value: Some(value) })
                }
                TxOp::Delete { namespace, key } => {
                    check_namespace(&namespace)?;
                    Record::Register(RegisterRecord { op: RegisterOp::Delete, seq, namespace, key, value: None })
                }
                TxOp::Usage { id, entry_id, usage } => Record::Usage(UsageRow { seq, id, entry_id, usage }),
                TxOp::State { expected, pc } => {
                    if expected != state_seq {
                        return Err(StorageError::StateConflict { expected, actual: state_seq });
                    }
                    state_seq = seq;
                    Record::State(State { seq, pc })
                }
            };
            records.push(record);
        }
        Ok(records)
    }

    /// Apply one record (from a commit just made durable, or from replay).
    /// Re-checks the invariants a file written by someone else might break
    /// ([`check_record`], which `cairn check` also runs without an index).
    pub fn apply(&mut self, record: Record) -> Result<(), String> {
        let seq = record.seq();
        let parent = check_record(&record, self.last_seq, |id| self.by_id.get(&self.entries, id))?;
        match record {
            Record::Entry(entry) => {
                let index = match u32::try_from(self.entries.len()) {
                    Ok(index) if index < NONE => index,
                    _ => {
                        return Err(format!(
                            "the session already holds {} entries, the most it can",
                            self.entries.len()
                        ));
                    }
                };
                self.links.push(Links { first_child: NONE, last_child: NONE, next_sibling: NONE });
                match parent {
                    None => self.roots.push(index),
                    Some(p) => {
                        let p = p as usize;
                        let last = self.links[p].last_child;
                        if last == NONE {
                            self.links[p].first_child = index;
                        } else {
                            self.links[last as usize].next_sibling = index;
                        }
                        self.links[p].last_child = index;
                    }
                }
                self.entries.push(entry);
                self.by_id.insert(&self.entries, index);
            }
            Record::Register(register) => {
                let namespace = self.registers.entry(register.namespace).or_default();
                match (register.op, register.value) {
                    (RegisterOp::Set, Some(value)) => {
                        if namespace.insert(register.key, value).is_some() {
                            self.dead_records += 1;
                        }
                    }
                    (RegisterOp::Set, None) => return Err("register set without a value".to_owned()),
                    (RegisterOp::Delete, _) => {
                        // The delete itself is dead once applied; so is the set it removes.
                        self.dead_records += 1 + u64::from(namespace.remove(&register.key).is_some());
                    }
                }
            }
            Record::Usage(row) => self.usage.push(row),
            Record::State(state) => {
                if self.state.is_some() {
                    self.dead_records += 1;
                }
                self.state = Some(state);
            }
        }
        self.last_seq = seq;
        Ok(())
    }

    /// The seq range a list of planned records covers.
    pub fn committed(records: &[Record]) -> Committed {
        let first_seq = records.first().map_or(0, Record::seq);
        let last_seq = records.last().map_or(0, Record::seq);
        let state_seq = records.iter().rev().find_map(|r| match r {
            Record::State(s) => Some(s.seq),
            _ => None,
        });
        Committed { first_seq, last_seq, state_seq }
    }

    /// Raise the last seq to `seq` without a record (a backend whose log
    /// kept a higher seq than its live records, e.g. after the last record
    /// was a delete). Never lowers it.
    pub fn advance_seq(&mut self, seq: u64) {
        self.last_seq = self.last_seq.max(seq);
    }

    /// Highest seq applied.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Register records (and state records) that a compaction would drop.
    pub fn dead_records(&self) -> u64 {
        self.dead_records
    }

    /// One entry by id.
    pub fn entry(&self, id: &str) -> Option<&Entry> {
        self.by_id.get(&self.entries, id).map(|i| &self.entries[i as usize])
    }

    /// Children of `parent` (roots for `None`), in seq order.
    pub fn children(&self, parent: Option<&str>) -> Vec<&Entry> {
        let Some(id) = parent else {
            return self.roots.iter().map(|&i| &self.entries[i as usize]).collect();
        };
        let Some(p) = self.by_id.get(&self.entries, id) else { return Vec::new() };
        let mut out = Vec::new();
        let mut child = self.links[p as usize].first_child;
        while child != NONE {
            out.push(&self.entries[child as usize]);
            child = self.links[child as usize].next_sibling;
        }
        out
    }

    /// Root-first path to `leaf`.
    pub fn path_to(&self, leaf: &str) -> Result<Vec<&Entry>, StorageError> {
        let mut path = Vec::new();
        let mut current = self.entry(leaf).ok_or_else(|| StorageError::NoSuchEntry(leaf.to_owned()))?;
        loop {
            path.push(current);
            match &current.parent_id {
                None => break,
                Some(parent) => {
                    current = self.entry(parent).ok_or_else(|| StorageError::NoSuchEntry(parent.clone()))?;
                }
            }
        }
        path.reverse();
        Ok(path)
    }

    /// All entries in seq order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// A register's value.
    pub fn register(&self, namespace: &str, key: &str) -> Option<&RawJson> {
        self.registers.get(namespace)?.get(key)
    }

    /// Live keys of a namespace, sorted.
    pub fn registers(&self, namespace: &str) -> impl Iterator<Item = (&str, &RawJson)> {
        self.registers.get(namespace).into_iter().flat_map(|m| m.iter().map(|(k, v)| (k.as_str(), v)))
    }

    /// All live registers: (namespace, key, value).
    pub fn all_registers(&self) -> impl Iterator<Item = (&str, &str, &RawJson)> {
        self.registers.iter().flat_map(|(ns, m)| m.iter().map(move |(k, v)| (ns.as_str(), k.as_str(), v)))
    }

    /// Number of live registers.
    pub fn register_count(&self) -> usize {
        self.registers.values().map(BTreeMap::len).sum()
    }

    /// The usage ledger.
    pub fn usage(&self) -> &[UsageRow] {
        &self.usage
    }

    /// The state.
    pub fn state(&self) -> Option<&State> {
        self.state.as_ref()
    }
}

/// The rules a record read from a file must pass before it is applied,
/// given the highest seq so far and `find`, which entry ids exist (and a
/// handle on each): seqs strictly increase, entry ids are new, a parent
/// exists, a register's namespace is known and a set has a value. Returns
/// the entry's parent handle. The one statement of these rules, for
/// [`SessionIndex::apply`] and for the streaming check (`check.rs`), so
/// both refuse the same files with the same words.
pub(crate) fn check_record<T>(
    record: &Record,
    last_seq: u64,
    find: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>, String> {
    let seq = record.seq();
    if seq <= last_seq {
        return Err(format!("seq {seq} is not greater than the previous seq {last_seq}"));
    }
    match record {
        Record::Entry(entry) => {
            if find(&entry.id).is_some() {
                return Err(format!("duplicate entry id {:?} (entries are write-once)", entry.id));
            }
            match &entry.parent_id {
                None => Ok(None),
                Some(parent) => match find(parent) {
                    Some(handle) => Ok(Some(handle)),
                    None => Err(format!("entry {:?} has unknown parent {parent:?}", entry.id)),
                },
            }
        }
        Record::Register(register) => {
            if NamespaceRoot::of(&register.namespace).is_none() {
                return Err(format!("unknown register namespace {:?}", register.namespace));
            }
            if register.op == RegisterOp::Set && register.value.is_none() {
                return Err("register set without a value".to_owned());
            }
            Ok(None)
        }
        Record::Usage(_) | Record::State(_) => Ok(None),
    }
}

fn check_namespace(namespace: &str) -> Result<(), StorageError> {
    match NamespaceRoot::of(namespace) {
        Some(_) => Ok(()),
        None => Err(StorageError::Invalid(format!(
            "unknown register namespace {namespace:?}: use lane, op, pending or fact (optionally with a .suffix)"
        ))),
    }
}
