//! An in-memory [`Storage`]: the reference model for property tests and a
//! store for embedders that want no file at all. Nothing survives the
//! process; it must not be used where durability is promised.

use super::index::SessionIndex;
use super::record::{Committed, Header, Transaction, now_millis};
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

    super::reads_from_index!();

    fn sync(&mut self) -> Result<(), StorageError> {
        Ok(())
    }
}
