//! `cairn check`: validate a session file without modifying it and
//! summarize what a replay found.
//!
//! It owns the report's shape (its JSON form is a stable interface:
//! `{"ok","entries","registers","usage","lastSeq","tornTail",
//! "deadBytesRatio","storageVersion","warnings","error"}`) and its human
//! form. Checks of what entries *mean* (the tool lifecycle) belong to the
//! turn and come in through [`check_file_with`]'s `validate`. It must never
//! write to the file: it replays through a read-only handle.

use std::path::Path;

use serde::Serialize;

use super::Storage;
use super::jsonl::{JsonlStore, StoreOptions};

/// What `cairn check` reports about a session file.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    /// Whether the file opens (and passes the caller's validation).
    pub ok: bool,
    /// Number of entries.
    pub entries: u64,
    /// Number of live registers.
    pub registers: u64,
    /// Number of usage rows.
    pub usage: u64,
    /// Highest seq.
    pub last_seq: u64,
    /// Whether a torn final line was found (it is discarded, not an error).
    pub torn_tail: bool,
    /// Share of the file's bytes that a compaction would drop.
    pub dead_bytes_ratio: f64,
    /// The storage version the file declares (older ones are migrated in
    /// memory; a compaction rewrites them in the current version).
    pub storage_version: u32,
    /// Things that do not stop the file from opening but need a person
    /// (e.g. a header id that differs from the file name).
    pub warnings: Vec<String>,
    /// Why the file does not open, when it does not.
    pub error: Option<String>,
}

/// Validate the session file at `path` (read-only) and summarize it.
pub fn check_file(path: &Path) -> CheckReport {
    check_file_with(path, StoreOptions::default(), |_| Ok(()))
}

/// [`check_file`] with options (the line limit) and a further validation
/// of the replayed store (e.g. the turn's tool lifecycle); its error makes
/// the report not ok.
pub fn check_file_with(
    path: &Path,
    opts: StoreOptions,
    validate: impl FnOnce(&JsonlStore) -> Result<(), String>,
) -> CheckReport {
    let failed = |error: String| CheckReport {
        ok: false,
        entries: 0,
        registers: 0,
        usage: 0,
        last_seq: 0,
        torn_tail: false,
        dead_bytes_ratio: 0.0,
        storage_version: 0,
        warnings: Vec::new(),
        error: Some(error),
    };
    let store = match JsonlStore::open_read_only_with(path, opts) {
        Ok(store) => store,
        Err(e) => return failed(e.to_string()),
    };
    let mut warnings = Vec::new();
    if let Some(warning) = header_id_mismatch(path, &store.header().id) {
        warnings.push(warning);
    }
    let error = validate(&store).err();
    CheckReport {
        ok: error.is_none(),
        entries: store.index().entries().len() as u64,
        registers: store.index().register_count() as u64,
        usage: store.index().usage().len() as u64,
        last_seq: store.index().last_seq(),
        torn_tail: store.torn_tail_bytes() > 0,
        dead_bytes_ratio: store.dead_bytes_ratio(),
        storage_version: store.file_storage_version(),
        warnings,
        error,
    }
}

/// A warning when the header's id is not the file's name (`<id>.jsonl`):
/// sessions are looked up by file name, so such a file is listed under an
/// id that finds nothing.
pub fn header_id_mismatch(path: &Path, header_id: &str) -> Option<String> {
    let stem = path.file_stem()?.to_string_lossy();
    (stem != header_id).then(|| {
        format!(
            "{}: the header says session id {header_id:?} but the file is named {stem:?}; cairn looks sessions up by file name — rename the file to {header_id}.jsonl if it is that session",
            path.display()
        )
    })
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(error) = &self.error {
            write!(f, "not ok: {error}")?;
        } else {
            write!(
                f,
                "ok: {} entries, {} live registers, {} usage rows, last seq {}, {:.1}% dead bytes",
                self.entries,
                self.registers,
                self.usage,
                self.last_seq,
                self.dead_bytes_ratio * 100.0
            )?;
            if self.torn_tail {
                write!(
                    f,
                    "; a torn final line (an interrupted commit) is ignored and will be cut off on the next write"
                )?;
            }
            if self.storage_version < super::STORAGE_VERSION && self.error.is_none() {
                write!(
                    f,
                    "; storage version {} is read through a migration (a compaction rewrites it as version {})",
                    self.storage_version,
                    super::STORAGE_VERSION
                )?;
            }
        }
        for warning in &self.warnings {
            write!(f, "\nwarning: {warning}")?;
        }
        Ok(())
    }
}
