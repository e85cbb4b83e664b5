//! `cairn check`: validate a session file without modifying it and
//! summarize what a replay found.
//!
//! It owns the report's shape (its JSON form is a stable interface:
//! `{"ok","entries","registers","usage","lastSeq","tornTail",
//! "deadBytesRatio","error"}`) and its human form. It must never write to
//! the file: it replays through a read-only handle.

use std::path::Path;

use serde::Serialize;

use super::jsonl::JsonlStore;

/// What `cairn check` reports about a session file.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    /// Whether the file opens.
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
    /// Why the file does not open, when it does not.
    pub error: Option<String>,
}

/// Validate the session file at `path` (read-only) and summarize it.
pub fn check_file(path: &Path) -> CheckReport {
    match JsonlStore::open_read_only(path) {
        Ok(store) => CheckReport {
            ok: true,
            entries: store.index().entries().len() as u64,
            registers: store.index().register_count() as u64,
            usage: store.index().usage().len() as u64,
            last_seq: store.index().last_seq(),
            torn_tail: store.torn_tail_bytes() > 0,
            dead_bytes_ratio: store.dead_bytes_ratio(),
            error: None,
        },
        Err(e) => CheckReport {
            ok: false,
            entries: 0,
            registers: 0,
            usage: 0,
            last_seq: 0,
            torn_tail: false,
            dead_bytes_ratio: 0.0,
            error: Some(e.to_string()),
        },
    }
}

impl std::fmt::Display for CheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(error) = &self.error {
            return write!(f, "not ok: {error}");
        }
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
            write!(f, "; a torn final line (an interrupted commit) is ignored and will be cut off on the next write")?;
        }
        Ok(())
    }
}
