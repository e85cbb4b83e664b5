//! Forward migration of older storage versions, applied in memory at open.
//!
//! It owns the list of storage versions this build reads and how each one
//! is brought to [`STORAGE_VERSION`]: the header first (which version the
//! file declares), then every record of every line as replay reads it. It
//! never writes: a migrated file stays as it is on disk until a compaction
//! rewrites it in the current version. Migrations only go forward; a
//! version newer than this build is refused (no downgrade).
//!
//! Versions (the byte-level description is in `docs/storage-format.md`):
//! - **0** — the header has no `storageVersion` field (the shape before the
//!   field existed). Records are read exactly as in version 1. No released
//!   cairn wrote it; it is defined so that the migration path has a real,
//!   tested case.
//! - **1** — the current version.

use super::StorageError;
use super::record::{Header, Record, STORAGE_VERSION};

/// Check the header's version and bring the header to the current one.
/// Returns the version the file declares.
pub(super) fn header(path: &str, header: &mut Header) -> Result<u32, StorageError> {
    let found = header.storage_version;
    if found > STORAGE_VERSION {
        return Err(StorageError::NewerVersion { path: path.to_owned(), found, supported: STORAGE_VERSION });
    }
    // 0 → 1: only the header changed (it gained `storageVersion`).
    header.storage_version = STORAGE_VERSION;
    Ok(found)
}

/// Whether records read from a file of storage version `from` need
/// [`records`] (replay skips it otherwise, keeping entries borrowed).
pub(super) fn changes_records(from: u32) -> bool {
    !matches!(from, 0 | STORAGE_VERSION)
}

/// Bring the records of one line, read from a file of storage version
/// `from`, to the current version. An error is the reason the line cannot
/// be migrated (replay reports it as a corrupt line).
pub(super) fn records(from: u32, records: &mut [Record]) -> Result<(), String> {
    match from {
        // Version 0 records have the same shape as version 1.
        0 | STORAGE_VERSION => {
            let _ = records;
            Ok(())
        }
        other => Err(format!("no migration from storage version {other}")),
    }
}
