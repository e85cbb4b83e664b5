//! Replay of a JSONL session file into a [`SessionIndex`], streaming one
//! line at a time (memory stays bounded by the largest line plus the index).
//!
//! It owns the replay rules: the header check (missing, invalid, newer
//! storage version), the torn-tail rule (a final line without its newline,
//! or a final line that is not JSON, is discarded whole; anything invalid
//! before the final line is an error naming line and byte offset), the line
//! length limit (a longer line is an error, never buffered whole), the
//! forward migration of older storage versions (through `migrate.rs`), and
//! the accounting of dead bytes used to decide compaction. It never writes:
//! the caller decides whether to truncate a torn tail.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};

use super::StorageError;
use super::index::SessionIndex;
use super::line::{EntryRef, LineRecord, decode_header, decode_line_lent, encoded_len};
use super::migrate;
use super::record::{Header, Record, RegisterOp, RegisterRecord};

/// A register's live record: its seq and encoded size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LiveRecord {
    pub(crate) seq: u64,
    pub(crate) size: u64,
}

/// Which bytes of the file still contribute to the live state.
#[derive(Debug, Default, Clone)]
pub(crate) struct Liveness {
    /// Live register records, by namespace then key.
    pub(crate) registers: HashMap<String, HashMap<String, LiveRecord>>,
    /// The live state record.
    pub(crate) state: Option<LiveRecord>,
    /// Bytes of records that no longer contribute (overwritten or deleted
    /// registers, deletes, superseded states).
    pub(crate) dead_bytes: u64,
    /// The record with the highest seq, when it is a register delete: a
    /// compaction keeps it so that the last seq survives.
    pub(crate) last_delete: Option<RegisterRecord>,
}

impl Liveness {
    /// Account for an entry before it is applied (entries never die).
    pub(crate) fn account_entry(&mut self) {
        self.last_delete = None;
    }

    /// Account for `record` before it is applied. Only register and state
    /// records can die, so only their sizes are computed.
    pub(crate) fn account(&mut self, record: &Record) {
        self.last_delete = None;
        match record {
            Record::Entry(_) | Record::Usage(_) => {}
            Record::State(s) => {
                let size = encoded_len(record);
                if let Some(old) = self.state.replace(LiveRecord { seq: s.seq, size }) {
                    self.dead_bytes += old.size;
                }
            }
            Record::Register(r) => {
                let size = encoded_len(record);
                if !self.registers.contains_key(&r.namespace) {
                    self.registers.insert(r.namespace.clone(), HashMap::new());
                }
                let Some(namespace) = self.registers.get_mut(&r.namespace) else { return };
                match r.op {
                    RegisterOp::Set => {
                        if let Some(old) = namespace.insert(r.key.clone(), LiveRecord { seq: r.seq, size }) {
                            self.dead_bytes += old.size;
                        }
                    }
                    RegisterOp::Delete => {
                        if let Some(old) = namespace.remove(&r.key) {
                            self.dead_bytes += old.size;
                        }
                        self.dead_bytes += size;
                        self.last_delete = Some(r.clone());
                    }
                }
            }
        }
    }

    /// The live register record of `namespace`/`key`.
    pub(crate) fn register(&self, namespace: &str, key: &str) -> Option<LiveRecord> {
        self.registers.get(namespace)?.get(key).copied()
    }
}

/// What a replay found.
#[derive(Debug)]
pub(crate) struct Replayed {
    /// The header as this build reads it (migrated to the current version).
    pub(crate) header: Header,
    /// The storage version the file declares.
    pub(crate) file_version: u32,
    pub(crate) index: SessionIndex,
    pub(crate) liveness: Liveness,
    /// Bytes up to the end of the last valid line (the header included).
    pub(crate) valid_len: u64,
    /// Bytes of a discarded torn final line (0 when there was none).
    pub(crate) torn_bytes: u64,
}

/// Read one line (up to and including its `\n`) into `buf`, reading at most
/// `limit` bytes. Returns the bytes read and whether the line is longer than
/// `limit` (then `buf` holds only its first `limit` bytes, without a `\n`).
pub(crate) fn read_line_capped(
    reader: &mut impl BufRead,
    buf: &mut Vec<u8>,
    limit: u64,
) -> std::io::Result<(usize, bool)> {
    let n = Read::take(&mut *reader, limit).read_until(b'\n', buf)?;
    let too_long = n as u64 == limit && buf.last() != Some(&b'\n') && !reader.fill_buf()?.is_empty();
    Ok((n, too_long))
}

/// What a replay hands its records to: the [`SessionIndex`] (open), or a
/// validator that keeps nothing of them (`cairn check`, `check.rs`). An
/// error is the reason the record is refused.
pub(crate) trait Apply {
    /// Apply one record, in file order.
    fn apply(&mut self, record: Record) -> Result<(), String>;

    /// Apply one entry, borrowed from its line (by default made owned and
    /// applied as a record).
    fn apply_entry(&mut self, entry: EntryRef<'_>) -> Result<(), String> {
        self.apply(Record::Entry(entry.into_owned()))
    }
}

impl Apply for SessionIndex {
    fn apply(&mut self, record: Record) -> Result<(), String> {
        SessionIndex::apply(self, record)
    }

    fn apply_entry(&mut self, entry: EntryRef<'_>) -> Result<(), String> {
        SessionIndex::apply_entry_ref(self, entry)
    }
}

/// What a replay found beside what its [`Apply`] kept.
#[derive(Debug)]
pub(crate) struct ReplayedFile {
    /// The header as this build reads it (migrated to the current version).
    pub(crate) header: Header,
    /// The storage version the file declares.
    pub(crate) file_version: u32,
    pub(crate) liveness: Liveness,
    /// Bytes up to the end of the last valid line (the header included).
    pub(crate) valid_len: u64,
    /// Bytes of a discarded torn final line (0 when there was none).
    pub(crate) torn_bytes: u64,
}

/// Replay a whole session file from `reader` into a [`SessionIndex`],
/// refusing lines longer than `max_line` bytes. `path` is only for messages;
/// `size` is the file's size as far as known (the index's text arena is
/// reserved for it once, so it is never copied while it grows: the pages
/// it does not use are never touched, and are given back at the end).
///
/// It stays on this thread: decoding the lines on a second one
/// (`chunked.rs`, as `cairn check` does) gained no wall time on the loaded
/// 2-core machine it was tried on, and its chunks in flight and decoding
/// threads' allocator arenas would add to the peak of every open (issue
/// 33, `docs/benchmarks/long.md`).
pub(crate) fn replay(path: &str, reader: impl Read, max_line: u64, size: u64) -> Result<Replayed, StorageError> {
    let mut index = SessionIndex::new();
    index.reserve_text(usize::try_from(size).unwrap_or(0));
    let file = replay_into(path, reader, max_line, &mut index)?;
    index.shrink_to_fit();
    Ok(Replayed {
        header: file.header,
        file_version: file.file_version,
        index,
        liveness: file.liveness,
        valid_len: file.valid_len,
        torn_bytes: file.torn_bytes,
    })
}

/// Read and check the header line (the first of the file): the header
/// as this build reads it, the storage version the file declares and the
/// line's length.
pub(crate) fn read_header(
    path: &str,
    reader: &mut impl BufRead,
    max_line: u64,
) -> Result<(Header, u32, u64), StorageError> {
    let io = |source| StorageError::Io { path: path.to_owned(), source };
    let bad_header = |reason: String| StorageError::BadHeader { path: path.to_owned(), reason };
    let mut buf = Vec::new();
    let (n, long) = read_line_capped(reader, &mut buf, max_line).map_err(io)?;
    if long {
        return Err(StorageError::LineTooLong { path: path.to_owned(), line: 1, offset: 0, limit: max_line });
    }
    if n == 0 {
        return Err(bad_header("the file is empty (not a cairn session, or its creation never finished)".to_owned()));
    }
    if buf.last() != Some(&b'\n') {
        return Err(bad_header("the header line is incomplete (its creation never finished)".to_owned()));
    }
    let mut header = decode_header(&buf[..buf.len() - 1]).map_err(|e| bad_header(e.to_string()))?;
    let file_version = migrate::header(path, &mut header)?;
    Ok((header, file_version, n as u64))
}

/// Replay a whole session file from `reader` into `sink`, one line at a
/// time, with every rule of [`replay`] (the sink adds its own).
pub(crate) fn replay_into(
    path: &str,
    reader: impl Read,
    max_line: u64,
    sink: &mut impl Apply,
) -> Result<ReplayedFile, StorageError> {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let (header, file_version, n) = read_header(path, &mut reader, max_line)?;
    replay_rest(path, reader, max_line, (header, file_version, n), sink)
}

/// [`replay_into`] after the header line (`read_header`'s answer).
pub(crate) fn replay_rest(
    path: &str,
    mut reader: impl BufRead,
    max_line: u64,
    (header, file_version, header_len): (Header, u32, u64),
    sink: &mut impl Apply,
) -> Result<ReplayedFile, StorageError> {
    let io = |source| StorageError::Io { path: path.to_owned(), source };
    let too_long =
        |line: u64, offset: u64| StorageError::LineTooLong { path: path.to_owned(), line, offset, limit: max_line };
    let mut buf = Vec::new();
    let mut valid_len = header_len;
    let mut lines = 1;
    let mut liveness = Liveness::default();
    let mut torn_bytes = 0;
    loop {
        buf.clear();
        let line_no = lines + 1;
        let (n, long) = read_line_capped(&mut reader, &mut buf, max_line).map_err(io)?;
        if long {
            return Err(too_long(line_no, valid_len));
        }
        if n == 0 {
            break;
        }
        let corrupt =
            |reason: String| StorageError::Corrupt { path: path.to_owned(), line: line_no, offset: valid_len, reason };
        if buf.last() != Some(&b'\n') {
            // Only possible at end of file: a commit whose write never finished.
            torn_bytes = n as u64;
            break;
        }
        // The line's records borrow from `buf` (entries are not copied
        // before the sink takes them); the whole line is decoded before any
        // of it is applied, so a torn line is discarded whole.
        let mut records: Vec<LineRecord<'_>> = Vec::new();
        if let Err(e) = decode_line_lent(&buf[..buf.len() - 1], &mut records) {
            let at_end = reader.fill_buf().map_err(io)?.is_empty();
            if at_end && e.is_syntax() {
                torn_bytes = n as u64;
                break;
            }
            return Err(corrupt(e.to_string()));
        }
        if migrate::changes_records(file_version) {
            let mut owned: Vec<Record> = records.into_iter().map(LineRecord::into_owned).collect();
            migrate::records(file_version, &mut owned).map_err(corrupt)?;
            records = owned.into_iter().map(LineRecord::Other).collect();
        }
        for record in records {
            match record {
                LineRecord::Entry(entry) => {
                    liveness.account_entry();
                    sink.apply_entry(entry).map_err(corrupt)?;
                }
                LineRecord::Other(record) => {
                    liveness.account(&record);
                    sink.apply(record).map_err(corrupt)?;
                }
            }
        }
        valid_len += n as u64;
        lines += 1;
    }
    Ok(ReplayedFile { header, file_version, liveness, valid_len, torn_bytes })
}
