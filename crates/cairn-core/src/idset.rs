//! `IdSet`: a set of string ids, each with a one-byte tag, packed for
//! checks that must remember every id of a long log (entry ids for the
//! parent rule, settled invocation ids for the lifecycle rules) without a
//! heap allocation per id.
//!
//! It owns only the packing: the ids' bytes are appended to one buffer and
//! a hash table holds (offset, length, tag) slots, so an id costs its own
//! bytes plus 16 bytes of slot, instead of a `String` (24 bytes plus an
//! allocation) in a map. Lookups compare the stored bytes, so answers are
//! exact (no fingerprints). It knows nothing of what the ids or tags mean,
//! does no I/O and never panics.

use std::hash::BuildHasher;

/// One id in [`IdSet`]: where its bytes are and its tag.
#[derive(Debug, Clone, Copy)]
struct Slot {
    start: u64,
    len: u32,
    tag: u8,
}

/// A packed set of ids with a tag each (see the module doc).
#[derive(Default)]
pub(crate) struct IdSet {
    bytes: Vec<u8>,
    table: hashbrown::HashTable<Slot>,
    hasher: foldhash::fast::RandomState,
}

impl std::fmt::Debug for IdSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdSet({} ids, {} bytes)", self.table.len(), self.bytes.len())
    }
}

fn bytes_of<'a>(bytes: &'a [u8], slot: &Slot) -> &'a [u8] {
    let start = usize::try_from(slot.start).unwrap_or(usize::MAX);
    bytes.get(start..start.saturating_add(slot.len as usize)).unwrap_or_default()
}

impl IdSet {
    /// The tag of `id`, when it is in the set.
    pub(crate) fn get(&self, id: &str) -> Option<u8> {
        let hash = self.hasher.hash_one(id.as_bytes());
        self.table.find(hash, |slot| bytes_of(&self.bytes, slot) == id.as_bytes()).map(|slot| slot.tag)
    }

    /// Add `id` with `tag`; returns false (and changes nothing) when it is
    /// already there, or when it is longer than 4 GiB (no line is).
    pub(crate) fn insert(&mut self, id: &str, tag: u8) -> bool {
        let Ok(len) = u32::try_from(id.len()) else { return false };
        if self.get(id).is_some() {
            return false;
        }
        let slot = Slot { start: self.bytes.len() as u64, len, tag };
        self.bytes.extend_from_slice(id.as_bytes());
        let (bytes, hasher) = (&self.bytes, &self.hasher);
        let hash = hasher.hash_one(id.as_bytes());
        self.table.insert_unique(hash, slot, |s| hasher.hash_one(bytes_of(bytes, s)));
        true
    }

    /// How many ids the set holds.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_found_exactly_with_their_tags() {
        let mut set = IdSet::default();
        for i in 0..10_000u32 {
            assert!(set.insert(&format!("id-{i}"), (i % 3) as u8));
        }
        assert!(!set.insert("id-7", 9), "a second insert is refused");
        assert_eq!(set.len(), 10_000);
        for i in 0..10_000u32 {
            assert_eq!(set.get(&format!("id-{i}")), Some((i % 3) as u8));
        }
        assert_eq!(set.get("id-10000"), None);
        assert_eq!(set.get("id-1 "), None);
        assert_eq!(set.get(""), None);
        assert!(set.insert("", 1));
        assert_eq!(set.get(""), Some(1));
    }
}
