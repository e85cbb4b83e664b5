//! What a listing needs of a session file, without replaying it: the
//! header, the current state and the current value of a few registers.
//!
//! It owns the backward scan: the header is read from the front, then the
//! file is read from its end towards its start, one block at a time, and
//! only lines that may hold a wanted record are decoded (a line is decoded
//! when it contains the literal name of what is still missing, or a `\u`
//! escape — the only escape that can spell a letter — so a record spelled
//! with escapes is never missed). The scan
//! stops as soon as the last state record and the last record of every
//! wanted register are found. The final line is skipped when it is torn,
//! exactly as replay would. It does not validate the log (seq order,
//! parents, duplicate ids): a file that lists may still fail to open, and
//! `cairn check` is the validator. It never writes.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::StorageError;
use super::jsonl::{Access, open_regular};
use super::line::{decode_header, decode_line};
use super::migrate;
use super::record::{Header, RawJson, Record, RegisterOp, State};
use super::replay::read_line_capped;

/// What [`read_summary`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct FileSummary {
    /// The header (migrated to the current storage version).
    pub header: Header,
    /// The storage version the file declares.
    pub file_version: u32,
    /// The state as a replay would leave it.
    pub state: Option<State>,
    /// The current value of each wanted register, in the order asked
    /// (`None`: never set, or deleted).
    pub registers: Vec<Option<RawJson>>,
}

/// Bytes read per step of the backward scan.
const BLOCK: u64 = 1 << 16;

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io { path: path.display().to_string(), source }
}

/// Read the header, the state and the registers `wanted` (namespace, key)
/// of the session file at `path`, reading lines backwards from the end and
/// stopping once everything is found. Lines longer than `max_line` are
/// refused, as in replay.
pub fn read_summary(path: &Path, wanted: &[(&str, &str)], max_line: u64) -> Result<FileSummary, StorageError> {
    let io = io_err(path);
    let name = path.display().to_string();
    let file = open_regular(path, Access::Read)?;
    let len = file.metadata().map_err(&io)?.len();
    let (header, file_version, body_start) = read_header(&name, &file, max_line)?;

    let mut summary = FileSummary { header, file_version, state: None, registers: vec![None; wanted.len()] };
    let mut state_found = false;
    let mut found = vec![false; wanted.len()];
    let mut scan = Backward::new(&file, body_start, len, max_line);
    let mut last_line = true;
    while !(state_found && found.iter().all(|f| *f)) {
        let Some((offset, line)) = scan.next_line().map_err(|e| e.into_storage(&name))? else { break };
        let is_last = std::mem::take(&mut last_line);
        let Some(line) = line.strip_suffix(b"\n") else {
            // Bytes after the last newline: a torn tail, never a commit.
            continue;
        };
        if !may_hold(line, state_found, wanted, &found) {
            continue;
        }
        let mut records = match decode_line(line) {
            Ok(records) => records,
            // A final line that is not JSON is a torn tail (replay's rule).
            Err(e) if is_last && e.is_syntax() => continue,
            Err(e) => {
                return Err(StorageError::Corrupt { path: name, line: 0, offset, reason: e.to_string() });
            }
        };
        migrate::records(file_version, &mut records).map_err(|reason| StorageError::Corrupt {
            path: name.clone(),
            line: 0,
            offset,
            reason,
        })?;
        // Within a line, later records win: walk it backwards too.
        for record in records.into_iter().rev() {
            match record {
                Record::State(state) if !state_found => {
                    state_found = true;
                    summary.state = Some(state);
                }
                Record::Register(r) => {
                    for (i, (namespace, key)) in wanted.iter().enumerate() {
                        if !found[i] && r.namespace == *namespace && r.key == *key {
                            found[i] = true;
                            summary.registers[i] = match r.op {
                                RegisterOp::Set => r.value.clone(),
                                RegisterOp::Delete => None,
                            };
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(summary)
}

fn read_header(path: &str, file: &File, max_line: u64) -> Result<(Header, u32, u64), StorageError> {
    let io = |source| StorageError::Io { path: path.to_owned(), source };
    let bad_header = |reason: &str| StorageError::BadHeader { path: path.to_owned(), reason: reason.to_owned() };
    let mut reader = BufReader::with_capacity(1 << 14, file);
    let mut buf = Vec::new();
    let (n, long) = read_line_capped(&mut reader, &mut buf, max_line).map_err(io)?;
    if long {
        return Err(StorageError::LineTooLong { path: path.to_owned(), line: 1, offset: 0, limit: max_line });
    }
    if n == 0 {
        return Err(bad_header("the file is empty (not a cairn session, or its creation never finished)"));
    }
    if buf.last() != Some(&b'\n') {
        return Err(bad_header("the header line is incomplete (its creation never finished)"));
    }
    let mut header = decode_header(&buf[..n - 1]).map_err(|e| bad_header(&e.to_string()))?;
    let version = migrate::header(path, &mut header)?;
    Ok((header, version, n as u64))
}

/// Whether `line` may hold a record the scan still needs. Conservative: a
/// false `true` costs a decode, a false `false` would be a wrong listing.
fn may_hold(line: &[u8], state_found: bool, wanted: &[(&str, &str)], found: &[bool]) -> bool {
    if contains(line, b"\\u") {
        return true; // names may be spelled with \u escapes
    }
    if !state_found && contains(line, b"state") {
        return true;
    }
    wanted.iter().zip(found).any(|((namespace, key), done)| {
        // A name JSON must escape never appears literally: always decode.
        !done
            && (needs_escape(namespace)
                || needs_escape(key)
                || (contains(line, namespace.as_bytes()) && contains(line, key.as_bytes())))
    })
}

fn needs_escape(s: &str) -> bool {
    s.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

/// Why the backward scan stopped.
enum ScanError {
    Io(std::io::Error),
    TooLong { offset: u64, limit: u64 },
}

impl ScanError {
    fn into_storage(self, path: &str) -> StorageError {
        match self {
            ScanError::Io(source) => StorageError::Io { path: path.to_owned(), source },
            ScanError::TooLong { offset, limit } => {
                StorageError::LineTooLong { path: path.to_owned(), line: 0, offset, limit }
            }
        }
    }
}

/// Lines of `file[start..end]`, last first, each with its `\n` (the final
/// one may lack it) and its start offset.
struct Backward<'f> {
    file: &'f File,
    start: u64,
    /// Bytes before this offset are not read yet.
    pos: u64,
    /// Read bytes not yet returned: `buf[..]` covers `pos..pos + buf.len()`.
    buf: Vec<u8>,
    max_line: u64,
    done: bool,
}

impl<'f> Backward<'f> {
    fn new(file: &'f File, start: u64, end: u64, max_line: u64) -> Self {
        Self { file, start, pos: end.max(start), buf: Vec::new(), max_line, done: false }
    }

    fn next_line(&mut self) -> Result<Option<(u64, Vec<u8>)>, ScanError> {
        if self.done {
            return Ok(None);
        }
        loop {
            // The last line in `buf` starts after the last newline that is
            // not `buf`'s final byte.
            let search = if self.buf.last() == Some(&b'\n') { &self.buf[..self.buf.len() - 1] } else { &self.buf[..] };
            if let Some(nl) = memchr::memrchr(b'\n', search) {
                let line = self.buf.split_off(nl + 1);
                let offset = self.pos + self.buf.len() as u64;
                if line.len() as u64 > self.max_line {
                    return Err(ScanError::TooLong { offset, limit: self.max_line });
                }
                return Ok(Some((offset, line)));
            }
            if self.buf.len() as u64 > self.max_line {
                return Err(ScanError::TooLong { offset: self.pos, limit: self.max_line });
            }
            if self.pos == self.start {
                self.done = true;
                if self.buf.is_empty() {
                    return Ok(None);
                }
                if self.buf.len() as u64 > self.max_line {
                    return Err(ScanError::TooLong { offset: self.start, limit: self.max_line });
                }
                return Ok(Some((self.start, std::mem::take(&mut self.buf))));
            }
            let step = BLOCK.min(self.pos - self.start);
            let new_pos = self.pos - step;
            let mut block = vec![0; step as usize];
            let mut file = self.file;
            file.seek(SeekFrom::Start(new_pos)).map_err(ScanError::Io)?;
            file.read_exact(&mut block).map_err(ScanError::Io)?;
            block.extend_from_slice(&self.buf);
            self.buf = block;
            self.pos = new_pos;
        }
    }
}
