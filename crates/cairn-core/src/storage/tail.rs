//! Following a session file while a writer appends to it: the reader side
//! of `cairn log [--follow]` and of the 9P `event` file.
//!
//! It owns the rule that a reader only ever sees complete lines: bytes after
//! the last newline are left for a later poll, and a final complete line
//! that is not JSON is held back (it may be a torn write the writer will cut
//! off). It notices a compaction (the path now names another file) or a
//! truncation and re-reads the new file, skipping records it already
//! returned (seqs survive compaction). Like replay it opens only a regular
//! file, refuses a newer storage version and a line longer than its limit,
//! and reports seqs that do not increase within one file as corruption. It
//! never writes and never waits: the caller decides how often to poll.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use super::StorageError;
use super::jsonl::{Access, DEFAULT_MAX_LINE_BYTES, open_regular};
use super::line::{decode_header, decode_line};
use super::migrate;
use super::record::{Header, Record};
use super::replay::read_line_capped;

/// A reader that returns the records appended since its last poll.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    file: File,
    header: Header,
    /// Offset just past the last complete line returned.
    offset: u64,
    /// 1-based number of the next line to read.
    next_line: u64,
    /// Highest seq returned so far.
    last_seq: u64,
    /// Highest seq read from the current file (reset when it is re-read).
    file_seq: u64,
    /// Longest line accepted.
    max_line: u64,
    /// The storage version the current file declares.
    file_version: u32,
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io { path: path.display().to_string(), source }
}

fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        true
    }
}

impl Tail {
    /// Open `path` and read its header. The first [`poll`](Self::poll)
    /// returns every record already in the file.
    pub fn open(path: &Path) -> Result<Self, StorageError> {
        Self::open_with(path, DEFAULT_MAX_LINE_BYTES)
    }

    /// [`open`](Self::open) with a line limit (`StoreOptions::max_line_bytes`).
    pub fn open_with(path: &Path, max_line: u64) -> Result<Self, StorageError> {
        let (file, header, body_start, file_version) = Self::open_file(path, max_line)?;
        Ok(Self {
            file_version,
            path: path.to_owned(),
            file,
            header,
            offset: body_start,
            next_line: 2,
            last_seq: 0,
            file_seq: 0,
            max_line,
        })
    }

    fn open_file(path: &Path, max_line: u64) -> Result<(File, Header, u64, u32), StorageError> {
        let io = io_err(path);
        let file = open_regular(path, Access::Read)?;
        let mut reader = BufReader::new(&file);
        let mut line = Vec::new();
        let (n, long) = read_line_capped(&mut reader, &mut line, max_line).map_err(&io)?;
        if long {
            return Err(StorageError::LineTooLong {
                path: path.display().to_string(),
                line: 1,
                offset: 0,
                limit: max_line,
            });
        }
        if n == 0 || line.last() != Some(&b'\n') {
            return Err(StorageError::BadHeader {
                path: path.display().to_string(),
                reason: "the header line is missing or incomplete".to_owned(),
            });
        }
        let mut header = decode_header(&line[..n - 1])
            .map_err(|e| StorageError::BadHeader { path: path.display().to_string(), reason: e.to_string() })?;
        let file_version = migrate::header(&path.display().to_string(), &mut header)?;
        Ok((file, header, n as u64, file_version))
    }

    /// The session's header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Highest seq returned so far.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Records of every complete line appended since the last poll (empty
    /// when nothing new is there yet).
    pub fn poll(&mut self) -> Result<Vec<Record>, StorageError> {
        let io = io_err(&self.path);
        // Compaction renames a new file over the path; a writer reopening
        // after a crash may cut a torn tail we had not read. Either way,
        // start over on the current file and skip what was returned.
        let ours = self.file.metadata().map_err(&io)?;
        let current = std::fs::metadata(&self.path).map_err(&io)?;
        if !same_file(&ours, &current) || current.len() < self.offset {
            let (file, header, body_start, file_version) = Self::open_file(&self.path, self.max_line)?;
            self.file_version = file_version;
            self.file = file;
            self.header = header;
            self.offset = body_start;
            self.next_line = 2;
            self.file_seq = 0;
        }
        self.file.seek(SeekFrom::Start(self.offset)).map_err(&io)?;
        let mut reader = BufReader::with_capacity(1 << 16, &self.file);
        let mut out = Vec::new();
        let mut line = Vec::new();
        loop {
            line.clear();
            let (n, long) = read_line_capped(&mut reader, &mut line, self.max_line).map_err(&io)?;
            if long {
                return Err(StorageError::LineTooLong {
                    path: self.path.display().to_string(),
                    line: self.next_line,
                    offset: self.offset,
                    limit: self.max_line,
                });
            }
            if n == 0 || line.last() != Some(&b'\n') {
                break; // nothing more, or a line still being written
            }
            let decoded = decode_line(&line[..n - 1])
                .map_err(|e| e.to_string())
                .and_then(|mut records| migrate::records(self.file_version, &mut records).map(|()| records));
            let records = match decoded {
                Ok(records) => records,
                Err(e) => {
                    let at_end = reader.fill_buf().map_err(&io)?.is_empty();
                    if at_end && decode_line(&line[..n - 1]).is_err_and(|e| e.is_syntax()) {
                        break; // maybe a torn write: wait for the writer to cut it
                    }
                    return Err(StorageError::Corrupt {
                        path: self.path.display().to_string(),
                        line: self.next_line,
                        offset: self.offset,
                        reason: e,
                    });
                }
            };
            for record in &records {
                if record.seq() <= self.file_seq {
                    return Err(StorageError::Corrupt {
                        path: self.path.display().to_string(),
                        line: self.next_line,
                        offset: self.offset,
                        reason: format!("seq {} is not greater than the previous seq {}", record.seq(), self.file_seq),
                    });
                }
                self.file_seq = record.seq();
            }
            self.offset += n as u64;
            self.next_line += 1;
            for record in records {
                if record.seq() > self.last_seq {
                    self.last_seq = record.seq();
                    out.push(record);
                }
            }
        }
        Ok(out)
    }
}
