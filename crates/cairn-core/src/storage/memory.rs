//! An in-memory [`Storage`]: the reference model for property tests and a
//! store for embedders that want no file at all. Nothing survives the
//! process; it must not be used where durability is promised.

use super::index::SessionIndex;
use super::record::{Committed, Entry, Header, RawJson, State, Transaction, UsageRow, now_millis};
use super::{Storage, StorageError};

/// A session held only in memory.
#[derive(Debug, Clone)]
pub struct MemStore {
    header: Header,
    index: SessionIndex,
}

impl MemStore {
    /// A new, empty session.
    pub fn new(header: Header) -> Self {
        Self { header, index: SessionIndex::new() }
    }

    /// The index (for tests that compare backends).
    pub fn index(&self) -> &SessionIndex {
        &self.index
    }
}

impl Storage for MemStore {
    fn header(&self) -> &Header {
        &self.header
    }

    fn commit(&mut self, tx: Transaction) -> Result<Committed, StorageError> {
        let records = self.index.plan(tx, now_millis())?;
        let committed = SessionIndex::committed(&records);
        for record in records {
            self.index.apply(record).map_err(StorageError::Invalid)?;
        }
        Ok(committed)
    }

    fn last_seq(&self) -> u64 {
        self.index.last_seq()
    }

    fn entry(&self, id: &str) -> Option<Entry> {
        self.index.entry(id).cloned()
    }

    fn children(&self, parent: Option<&str>) -> Vec<Entry> {
        self.index.children(parent).into_iter().cloned().collect()
    }

    fn path_to(&self, leaf: &str) -> Result<Vec<Entry>, StorageError> {
        Ok(self.index.path_to(leaf)?.into_iter().cloned().collect())
    }

    fn entries(&self) -> Vec<Entry> {
        self.index.entries().to_vec()
    }

    fn entry_count(&self) -> usize {
        self.index.entries().len()
    }

    fn register(&self, namespace: &str, key: &str) -> Option<RawJson> {
        self.index.register(namespace, key).cloned()
    }

    fn registers(&self, namespace: &str) -> Vec<(String, RawJson)> {
        self.index.registers(namespace).map(|(k, v)| (k.to_owned(), v.clone())).collect()
    }

    fn usage(&self) -> Vec<UsageRow> {
        self.index.usage().to_vec()
    }

    fn state(&self) -> Option<State> {
        self.index.state().cloned()
    }

    fn sync(&mut self) -> Result<(), StorageError> {
        Ok(())
    }
}
