//! The in-memory index of a session: what a replay of the log builds and
//! what every query reads.
//!
//! It owns the single place where a transaction is validated
//! ([`SessionIndex::plan`], which also checks each register namespace's
//! lifecycle through `registers.rs`) and where a record is applied
//! ([`SessionIndex::apply`]), for every backend and for replay alike, so the
//! in-memory state always equals a replay of the log. It does no I/O.
//!
//! Entries are kept compactly (issue 33: a long session must open in less
//! memory than its file): each entry's id and payload text are appended to
//! one byte arena, its type is interned, its parent is the parent's index,
//! and a fixed 32-byte [`Slot`] (and a byte for its type number) says where
//! the rest is. No allocation per entry. An [`Entry`] is materialised only
//! when a query asks for one
//! (owned, or lent to a visitor); payloads are never re-parsed.

use std::collections::{BTreeMap, HashSet};

/// Entry ids by position in the index: a hash table of indices hashed by
/// the entry's own id (read from the arena), so ids are not stored twice.
/// Ids come from the session's own file, so a fast seeded hasher is
/// enough. Indices are `u32` (4 bytes a slot; a session holds fewer than
/// [`NONE`] entries, which [`SessionIndex::apply`] enforces).
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

    fn get(&self, entries: &Entries, id: &str) -> Option<u32> {
        // Most lookups are of the newest entry (the parent of the entry
        // being added: a turn's steps follow one another), which is in
        // cache: compared before hashing.
        if let Some(last) = (entries.len() as u32).checked_sub(1)
            && entries.id(last) == id
        {
            return Some(last);
        }
        self.table.find(self.hash(id), |&i| entries.id(i) == id).copied()
    }

    /// Insert `index` (whose entry is already in `entries`).
    fn insert(&mut self, entries: &Entries, index: u32) {
        let hash = self.hash(entries.id(index));
        let hasher = &self.hasher;
        self.table.insert_unique(hash, index, |&i| std::hash::BuildHasher::hash_one(hasher, entries.id(i)));
    }
}

/// No entry (in [`Links`] and [`Slot::parent`]); also the most entries one
/// index holds.
const NONE: u32 = u32::MAX;

/// Tree links of one entry, by index into the entries: its first child
/// and its next sibling. A flat vector instead of a map of child lists: no
/// allocation per entry; `u32` indices, 8 bytes an entry. (The last child,
/// which an append needs, is the first one, or for the few entries with
/// more than one child in [`SessionIndex::last_children`].)
#[derive(Debug, Clone, Copy)]
struct Links {
    first_child: u32,
    next_sibling: u32,
}

/// Where one entry's parts are: its fixed fields, its parent's index, its
/// interned type, and its id and payload text in the arena (the id's bytes
/// at `start`, the payload's right after, up to the next entry's `start`:
/// entries are appended to the arena in order and never removed). 32
/// bytes; the type number is kept beside it ([`Entries::type_of`]).
#[derive(Debug, Clone, Copy)]
struct Slot {
    seq: u64,
    timestamp: i64,
    start: usize,
    id_len: u32,
    parent: u32,
}

/// In [`Entries::type_of`]: the entry's type number is in
/// [`Entries::wide_types`] (a session of more than 254 distinct types).
const WIDE_TYPE: u8 = u8::MAX;

/// Every entry of a session, compactly: [`Slot`]s in seq order, one text
/// arena holding ids and payloads, and the distinct entry types.
#[derive(Debug, Clone, Default)]
struct Entries {
    slots: Vec<Slot>,
    /// Ids and payload texts, back to back (payloads are JSON text as
    /// their `RawValue` held it, so every slice is valid JSON).
    arena: String,
    /// Distinct entry types, by first use, and their numbers.
    types: Vec<Box<str>>,
    type_numbers: hashbrown::HashMap<Box<str>, u32, foldhash::fast::RandomState>,
    /// Each entry's type number, one byte an entry ([`WIDE_TYPE`] when it
    /// does not fit: then it is in `wide_types`).
    type_of: Vec<u8>,
    /// Type numbers of 255 and above, by entry index.
    wide_types: hashbrown::HashMap<u32, u32, foldhash::fast::RandomState>,
}

impl Entries {
    fn len(&self) -> usize {
        self.slots.len()
    }

    fn slot(&self, i: u32) -> &Slot {
        &self.slots[i as usize]
    }

    fn id(&self, i: u32) -> &str {
        let s = self.slot(i);
        &self.arena[s.start..s.start + s.id_len as usize]
    }

    fn payload(&self, i: u32) -> &str {
        let s = self.slot(i);
        let from = s.start + s.id_len as usize;
        let to = self.slots.get(i as usize + 1).map_or(self.arena.len(), |next| next.start);
        &self.arena[from..to]
    }

    /// The number of entry `i`'s type.
    fn type_number(&self, i: u32) -> u32 {
        match self.type_of[i as usize] {
            WIDE_TYPE => self.wide_types.get(&i).copied().unwrap_or(u32::MAX),
            t => u32::from(t),
        }
    }

    fn entry_type(&self, i: u32) -> &str {
        self.types.get(self.type_number(i) as usize).map_or("", |t| t)
    }

    fn parent_id(&self, i: u32) -> Option<&str> {
        let parent = self.slot(i).parent;
        (parent != NONE).then(|| self.id(parent))
    }

    /// Append `entry` (its parent, if any, at index `parent`).
    fn push(&mut self, entry: &EntryView<'_>, parent: u32) -> Result<(), String> {
        let payload = entry.payload;
        let too_long =
            |what: &str, len: usize| format!("entry {:?}: its {what} is {len} bytes, more than 4 GiB", entry.id);
        let id_len = u32::try_from(entry.id.len()).map_err(|_| too_long("id", entry.id.len()))?;
        // Not kept (the next entry's start says where it ends), but a
        // payload of 4 GiB or more is refused as before.
        u32::try_from(payload.len()).map_err(|_| too_long("payload", payload.len()))?;
        let entry_type = match self.type_numbers.get(entry.entry_type) {
            Some(&t) => t,
            None => {
                // Fewer types than entries, so fewer than NONE.
                let t = self.types.len() as u32;
                self.types.push(entry.entry_type.into());
                self.type_numbers.insert(entry.entry_type.into(), t);
                t
            }
        };
        let start = self.arena.len();
        self.arena.push_str(entry.id);
        self.arena.push_str(payload);
        let index = self.slots.len() as u32;
        self.slots.push(Slot { seq: entry.seq, timestamp: entry.timestamp, start, id_len, parent });
        match u8::try_from(entry_type) {
            Ok(t) if t != WIDE_TYPE => self.type_of.push(t),
            _ => {
                self.type_of.push(WIDE_TYPE);
                self.wide_types.insert(index, entry_type);
            }
        }
        Ok(())
    }

    /// Entry `i`, lent from the arena.
    fn view(&self, i: u32) -> EntryView<'_> {
        let s = self.slot(i);
        EntryView {
            seq: s.seq,
            timestamp: s.timestamp,
            id: self.id(i),
            parent_id: self.parent_id(i),
            entry_type: self.entry_type(i),
            payload: self.payload(i),
        }
    }

    /// Entry `i`, owned.
    fn get(&self, i: u32) -> Entry {
        let s = self.slot(i);
        Entry {
            seq: s.seq,
            timestamp: s.timestamp,
            id: self.id(i).to_owned(),
            parent_id: self.parent_id(i).map(str::to_owned),
            entry_type: self.entry_type(i).to_owned(),
            payload: RawJson::from_valid(self.payload(i)),
        }
    }

    /// Entry `i` into `into`, reusing its strings' buffers (only the
    /// payload is a new allocation).
    fn fill(&self, i: u32, into: &mut Entry) {
        let s = self.slot(i);
        into.seq = s.seq;
        into.timestamp = s.timestamp;
        into.id.clear();
        into.id.push_str(self.id(i));
        match (self.parent_id(i), &mut into.parent_id) {
            (None, parent) => *parent = None,
            (Some(id), Some(parent)) => {
                parent.clear();
                parent.push_str(id);
            }
            (Some(id), parent) => *parent = Some(id.to_owned()),
        }
        into.entry_type.clear();
        into.entry_type.push_str(self.entry_type(i));
        into.payload = RawJson::from_valid(self.payload(i));
    }

    /// Call `f` on each entry of `indices`, materialised one at a time in
    /// one reused [`Entry`].
    fn visit(&self, indices: impl IntoIterator<Item = u32>, mut f: impl FnMut(&Entry)) {
        let mut scratch: Option<Entry> = None;
        for i in indices {
            match &mut scratch {
                Some(entry) => self.fill(i, entry),
                None => scratch = Some(self.get(i)),
            }
            if let Some(entry) = &scratch {
                f(entry);
            }
        }
    }
}

use super::line::EntryRef;
use super::record::{
    Entry, EntryView, NamespaceRoot, RawJson, Record, RegisterOp, RegisterRecord, State, Transaction, TxOp, UsageRow,
};
use super::{Committed, StorageError};

/// Entries, registers, usage and state of one session, in memory.
#[derive(Debug, Default, Clone)]
pub struct SessionIndex {
    entries: Entries,
    by_id: IdTable,
    /// Tree links, parallel to `entries`.
    links: Vec<Links>,
    /// The last child of each entry with two children or more (a fork of
    /// the conversation; most entries have one child or none).
    last_children: hashbrown::HashMap<u32, u32, foldhash::fast::RandomState>,
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
        self.contains(id)
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
                self.add_entry(&entry.view(), parent)?;
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

    /// [`apply`](Self::apply) for an entry borrowed from its line (replay:
    /// its strings and payload are copied once, into the arena).
    pub(crate) fn apply_entry_ref(&mut self, entry: EntryRef<'_>) -> Result<(), String> {
        self.apply_entry_view(&entry.view())
    }

    /// [`apply`](Self::apply) for an entry lent as a view (the chunked
    /// replay: its strings and payload are copied once, into the arena).
    pub(crate) fn apply_entry_view(&mut self, parts: &EntryView<'_>) -> Result<(), String> {
        let parent = check_entry(parts, self.last_seq, |id| self.by_id.get(&self.entries, id))?;
        self.add_entry(parts, parent)?;
        self.last_seq = parts.seq;
        Ok(())
    }

    /// Add a checked entry whose parent (if any) is at index `parent`.
    fn add_entry(&mut self, parts: &EntryView<'_>, parent: Option<u32>) -> Result<(), String> {
        let index = match u32::try_from(self.entries.len()) {
            Ok(index) if index < NONE => index,
            _ => {
                return Err(format!("the session already holds {} entries, the most it can", self.entries.len()));
            }
        };
        self.entries.push(parts, parent.unwrap_or(NONE))?;
        self.links.push(Links { first_child: NONE, next_sibling: NONE });
        match parent {
            None => self.roots.push(index),
            Some(p) => {
                let first = self.links[p as usize].first_child;
                if first == NONE {
                    self.links[p as usize].first_child = index;
                } else {
                    let last = self.last_children.get(&p).copied().unwrap_or(first);
                    self.links[last as usize].next_sibling = index;
                    self.last_children.insert(p, index);
                }
            }
        }
        self.by_id.insert(&self.entries, index);
        Ok(())
    }

    /// Reserve room for `bytes` of entry text (ids and payloads) at once:
    /// replay reserves the file's size, which the text never exceeds, so
    /// the arena is never copied while it grows.
    pub(crate) fn reserve_text(&mut self, bytes: usize) {
        self.entries.arena.reserve(bytes);
    }

    /// Give back what the vectors hold beyond their contents (after a
    /// replay).
    pub(crate) fn shrink_to_fit(&mut self) {
        self.entries.arena.shrink_to_fit();
        self.entries.slots.shrink_to_fit();
        self.entries.type_of.shrink_to_fit();
        self.links.shrink_to_fit();
        self.roots.shrink_to_fit();
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

    /// Whether an entry `id` exists.
    pub fn contains(&self, id: &str) -> bool {
        self.by_id.get(&self.entries, id).is_some()
    }

    /// One entry by id (materialised: an owned copy).
    pub fn entry(&self, id: &str) -> Option<Entry> {
        self.by_id.get(&self.entries, id).map(|i| self.entries.get(i))
    }

    /// Call `f` on the entry `id`, when there is one; returns whether
    /// there was.
    pub fn visit_entry(&self, id: &str, f: impl FnOnce(&Entry)) -> bool {
        match self.by_id.get(&self.entries, id) {
            Some(i) => {
                f(&self.entries.get(i));
                true
            }
            None => false,
        }
    }

    /// Call `f` on every entry, in seq order, one materialised at a time
    /// (the buffers of one [`Entry`] are reused: no copy of the whole
    /// session at once).
    pub fn visit_entries(&self, f: impl FnMut(&Entry)) {
        self.entries.visit(0..self.entries.len() as u32, f);
    }

    /// Call `f` on every entry, in seq order, lent from the arena (no
    /// copy at all: what a reader that looks at every entry once takes).
    pub fn visit_entry_views(&self, mut f: impl FnMut(EntryView<'_>)) {
        for i in 0..self.entries.len() as u32 {
            f(self.entries.view(i));
        }
    }

    /// [`visit_entry_views`](Self::visit_entry_views) from position
    /// `first` on (nothing when there are no more entries).
    pub fn visit_entry_views_from(&self, first: usize, mut f: impl FnMut(EntryView<'_>)) {
        for i in first.min(self.entries.len())..self.entries.len() {
            f(self.entries.view(i as u32));
        }
    }

    /// Call `f` on every entry of type `entry_type`, in seq order; the
    /// others are skipped without being materialised.
    pub fn visit_entries_of_type(&self, entry_type: &str, f: impl FnMut(&Entry)) {
        let Some(&t) = self.entries.type_numbers.get(entry_type) else { return };
        let entries = &self.entries;
        entries.visit((0..entries.len() as u32).filter(|&i| entries.type_number(i) == t), f);
    }

    /// Number of entries.
    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// Every entry in seq order, each materialised (owned) as the iterator
    /// reaches it.
    pub fn entries(&self) -> impl DoubleEndedIterator<Item = Entry> + ExactSizeIterator + '_ {
        (0..self.entries.len() as u32).map(|i| self.entries.get(i))
    }

    /// The entries with a seq above `seq`, in seq order, materialised as
    /// the iterator reaches them (entries' seqs increase with their
    /// position, so the start is found by bisection).
    pub fn entries_since(&self, seq: u64) -> impl DoubleEndedIterator<Item = Entry> + ExactSizeIterator + '_ {
        let from = self.entries.slots.partition_point(|s| s.seq <= seq) as u32;
        (from..self.entries.len() as u32).map(|i| self.entries.get(i))
    }

    /// The seq of the entry at position `i` (seq order); panics past the end.
    pub(crate) fn entry_seq(&self, i: usize) -> u64 {
        self.entries.slots[i].seq
    }

    /// The entry at position `i` (seq order), owned; panics past the end.
    pub(crate) fn entry_at(&self, i: usize) -> Entry {
        self.entries.get(i as u32)
    }

    /// Children of `parent` (roots for `None`), in seq order.
    pub fn children(&self, parent: Option<&str>) -> Vec<Entry> {
        let Some(id) = parent else {
            return self.roots.iter().map(|&i| self.entries.get(i)).collect();
        };
        let Some(p) = self.by_id.get(&self.entries, id) else { return Vec::new() };
        let mut out = Vec::new();
        let mut child = self.links[p as usize].first_child;
        while child != NONE {
            out.push(self.entries.get(child));
            child = self.links[child as usize].next_sibling;
        }
        out
    }

    /// [`children`](Self::children) lent from the arena (no copy): what a
    /// walk of the whole tree takes (`cairn show`).
    pub fn children_views(&self, parent: Option<&str>) -> Vec<EntryView<'_>> {
        let Some(id) = parent else {
            return self.roots.iter().map(|&i| self.entries.view(i)).collect();
        };
        let Some(p) = self.by_id.get(&self.entries, id) else { return Vec::new() };
        let mut out = Vec::new();
        let mut child = self.links[p as usize].first_child;
        while child != NONE {
            out.push(self.entries.view(child));
            child = self.links[child as usize].next_sibling;
        }
        out
    }

    /// Root-first path to `leaf`.
    pub fn path_to(&self, leaf: &str) -> Result<Vec<Entry>, StorageError> {
        let mut at = self.by_id.get(&self.entries, leaf).ok_or_else(|| StorageError::NoSuchEntry(leaf.to_owned()))?;
        let mut path = vec![self.entries.get(at)];
        loop {
            let parent = self.entries.slot(at).parent;
            if parent == NONE {
                break;
            }
            at = parent;
            path.push(self.entries.get(at));
        }
        path.reverse();
        Ok(path)
    }

    /// Call `f` on each entry from `leaf` up to its root, leaf first, lent
    /// from the arena (parents followed by index: no lookup by id, no copy).
    pub fn visit_path_views(&self, leaf: &str, mut f: impl FnMut(EntryView<'_>)) -> Result<(), StorageError> {
        let mut at = self.by_id.get(&self.entries, leaf).ok_or_else(|| StorageError::NoSuchEntry(leaf.to_owned()))?;
        loop {
            f(self.entries.view(at));
            let parent = self.entries.slot(at).parent;
            if parent == NONE {
                return Ok(());
            }
            at = parent;
        }
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
        Record::Entry(entry) => check_entry(&entry.view(), last_seq, find),
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

/// [`check_record`]'s rules for an entry.
pub(crate) fn check_entry<T>(
    entry: &EntryView<'_>,
    last_seq: u64,
    find: impl Fn(&str) -> Option<T>,
) -> Result<Option<T>, String> {
    let seq = entry.seq;
    if seq <= last_seq {
        return Err(format!("seq {seq} is not greater than the previous seq {last_seq}"));
    }
    if find(entry.id).is_some() {
        return Err(format!("duplicate entry id {:?} (entries are write-once)", entry.id));
    }
    match entry.parent_id {
        None => Ok(None),
        Some(parent) => match find(parent) {
            Some(handle) => Ok(Some(handle)),
            None => Err(format!("entry {:?} has unknown parent {parent:?}", entry.id)),
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::record::to_raw;

    fn entry(seq: u64, id: &str, parent: Option<&str>, entry_type: &str, payload: serde_json::Value) -> Entry {
        Entry {
            seq,
            timestamp: 1_000 + seq as i64,
            id: id.to_owned(),
            parent_id: parent.map(str::to_owned),
            entry_type: entry_type.to_owned(),
            payload: to_raw(&payload).unwrap(),
        }
    }

    /// A session of more distinct entry types than a byte numbers keeps
    /// every entry's type (and payload, which ends where the next entry
    /// starts).
    #[test]
    fn entries_keep_their_types_past_255_distinct_types() {
        let mut index = SessionIndex::new();
        let given: Vec<Entry> = (0..600u64)
            .map(|n| {
                let parent = n.checked_sub(1).map(|p| format!("e{p}"));
                entry(
                    n + 1,
                    &format!("e{n}"),
                    parent.as_deref(),
                    &format!("type{}", n % 300),
                    serde_json::json!({"n": n}),
                )
            })
            .collect();
        for e in &given {
            index.apply(Record::Entry(e.clone())).unwrap();
        }
        assert_eq!(index.entries().collect::<Vec<_>>(), given);
        for t in [0, 1, 254, 255, 256, 299] {
            let mut seen = Vec::new();
            index.visit_entries_of_type(&format!("type{t}"), |e| seen.push(e.id.clone()));
            assert_eq!(seen, [format!("e{t}"), format!("e{}", t + 300)], "type{t}");
        }
    }

    /// Children come back in seq order however many a parent has and
    /// however their own children interleave with them.
    #[test]
    fn children_keep_their_order_past_the_first_two() {
        let mut index = SessionIndex::new();
        let mut seq = 0;
        let mut add = |index: &mut SessionIndex, id: &str, parent: Option<&str>| {
            seq += 1;
            index.apply(Record::Entry(entry(seq, id, parent, "message", serde_json::json!(seq)))).unwrap();
        };
        add(&mut index, "r", None);
        for c in 0..6 {
            add(&mut index, &format!("c{c}"), Some("r"));
            add(&mut index, &format!("g{c}"), Some(&format!("c{c}")));
            if c % 2 == 0 {
                add(&mut index, &format!("h{c}"), Some(&format!("c{c}")));
            }
        }
        let ids = |v: Vec<Entry>| v.into_iter().map(|e| e.id).collect::<Vec<_>>();
        assert_eq!(ids(index.children(Some("r"))), ["c0", "c1", "c2", "c3", "c4", "c5"]);
        assert_eq!(ids(index.children(Some("c0"))), ["g0", "h0"]);
        assert_eq!(ids(index.children(Some("c1"))), ["g1"]);
        assert_eq!(ids(index.children(Some("g5"))), Vec::<String>::new());
        assert_eq!(ids(index.children(None)), ["r"]);
    }

    /// The compact index hands back exactly the entries it was given, by
    /// every query, whichever way they arrived (owned or borrowed).
    #[test]
    fn materialised_entries_equal_the_applied_ones() {
        let given = vec![
            entry(1, "root", None, "message", serde_json::json!({"text": "hé \"x\"\n🦀"})),
            entry(2, "a", Some("root"), "toolRequested", serde_json::json!([1, 2, {"k": null}])),
            entry(3, "b", Some("root"), "message", serde_json::json!("just a string")),
            entry(5, "ç-long-id-".repeat(20).as_str(), Some("a"), "compaction", serde_json::json!({})),
            entry(6, "second-root", None, "message", serde_json::json!(42)),
            entry(7, "c", Some("b"), "toolCompleted", serde_json::json!({"out": "x".repeat(10_000)})),
        ];
        let mut index = SessionIndex::new();
        for (n, e) in given.iter().enumerate() {
            if n % 2 == 0 {
                index.apply(Record::Entry(e.clone())).unwrap();
            } else {
                let line = super::super::line::encode_line(&[Record::Entry(e.clone())]).unwrap();
                let mut records = Vec::new();
                super::super::line::decode_line_borrowed(&line[..line.len() - 1], &mut records).unwrap();
                let Some(super::super::line::LineRecord::Entry(borrowed)) = records.pop() else {
                    panic!("not an entry: {records:?}")
                };
                index.apply_entry_ref(borrowed).unwrap();
            }
        }
        assert_eq!(index.entry_count(), given.len());
        assert_eq!(index.entries().collect::<Vec<_>>(), given);
        let mut visited = Vec::new();
        index.visit_entries(|e| visited.push(e.clone()));
        assert_eq!(visited, given);
        for e in &given {
            assert_eq!(index.entry(&e.id).as_ref(), Some(e));
            assert!(index.contains(&e.id));
            let mut seen = None;
            assert!(index.visit_entry(&e.id, |v| seen = Some(v.clone())));
            assert_eq!(seen.as_ref(), Some(e));
        }
        assert_eq!(index.entry("nope"), None);
        assert!(!index.visit_entry("nope", |_| panic!("visited a missing entry")));
        assert_eq!(index.children(None), vec![given[0].clone(), given[4].clone()]);
        assert_eq!(index.children(Some("root")), vec![given[1].clone(), given[2].clone()]);
        assert_eq!(index.path_to("c").unwrap(), vec![given[0].clone(), given[2].clone(), given[5].clone()]);
        let mut messages = Vec::new();
        index.visit_entries_of_type("message", |e| messages.push(e.id.clone()));
        assert_eq!(messages, ["root", "b", "second-root"]);
        index.visit_entries_of_type("unknown", |_| panic!("no entry has this type"));
        assert_eq!(index.entries_since(3).collect::<Vec<_>>(), given[3..]);
        assert_eq!(index.entries_since(4).collect::<Vec<_>>(), given[3..]);
        assert_eq!(index.entries_since(0).count(), given.len());
        assert_eq!(index.entries_since(7).count(), 0);
        for first in 0..=given.len() + 2 {
            let mut from = Vec::new();
            index.visit_entry_views_from(first, |v| from.push(v.to_entry().unwrap()));
            assert_eq!(from, given[first.min(given.len())..], "from {first}");
        }
        // Every id is found, newest first or not, and an id that is a
        // prefix of the newest is not taken for it.
        assert_eq!(index.by_id.get(&index.entries, "c"), Some(5));
        assert_eq!(index.by_id.get(&index.entries, "root"), Some(0));
        assert_eq!(index.by_id.get(&index.entries, ""), None);
        // The borrowed path keeps the index's rules.
        let dup = entry(8, "a", None, "message", serde_json::json!(1));
        let line = super::super::line::encode_line(&[Record::Entry(dup)]).unwrap();
        let mut records = Vec::new();
        super::super::line::decode_line_borrowed(&line[..line.len() - 1], &mut records).unwrap();
        let Some(super::super::line::LineRecord::Entry(borrowed)) = records.pop() else { panic!("not an entry") };
        let err = index.apply_entry_ref(borrowed).unwrap_err();
        assert!(err.contains("duplicate entry id"), "{err}");
        assert_eq!(index.entry_count(), given.len());
        assert_eq!(index.last_seq(), 7);
    }
}
