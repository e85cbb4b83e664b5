//! Replay of a session file in chunks of whole lines decoded on other
//! threads and applied in file order: what `cairn check` streams a file
//! through, so that the decoding (most of a check's work) uses the
//! machine's second core while the rules that need the file's order stay
//! on one thread.
//!
//! It owns the chunking and the hand-over between threads, nothing of the
//! rules: each line is decoded by `line.rs` exactly as `replay.rs` decodes
//! it, and the applying thread takes the decoded lines in file order and
//! applies `replay.rs`'s rules to them (the header, the line limit, the
//! torn-tail rule, the line and byte offset of an error, the dead bytes),
//! so a file is refused where and as `replay_into` refuses it (the tests
//! hold the two to the same reports). A caller's `read` runs on the
//! decoding threads over each entry (e.g. the lifecycle check's payload
//! parse; for the payloads it reads inline, while their line is parsed:
//! `line.rs`'s one-pass decode) and its answer is handed to the applying
//! side with the entry.
//!
//! The store's own replay (`replay.rs`, an open) does not use it: there
//! the chunks in flight and the decoding threads' allocator arenas add to
//! the peak, for no wall time gained on a loaded machine (and
//! the applying side is lent only an entry's index fields, not its
//! payload, whose text would cost a UTF-8 pass over the chunk).
//!
//! Memory stays bounded: a chunk is ~256 KiB of whole lines (longer only
//! for a longer line, up to the line limit), and at most two chunks per
//! decoding thread are in flight. Files of an older storage version (whose
//! records a migration rewrites) and machines with one core go through
//! the sequential replay instead.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc;

use super::StorageError;
use super::line::{EntryRead, InlineRecord, LineError, LineRecord, decode_line_borrowed, decode_line_inline};
use super::migrate;
use super::record::{EntryView, Record};
use super::replay::{Liveness, ReplayedFile, read_header};

/// Bytes a chunk is read in (whole lines: it is cut after its last `\n`).
pub(crate) const CHUNK: usize = 256 * 1024;

/// Decoding threads a replay uses at most (beside the one that applies
/// the lines; more bring little, the applying being sequential).
const DECODING_THREADS: usize = 2;

/// The decoding threads for this machine: none on one core (a thread
/// would only share it with the applying one).
pub(crate) fn decoding_threads() -> usize {
    match std::thread::available_parallelism().map_or(1, |n| n.get()).min(DECODING_THREADS) {
        0 | 1 => 0,
        n => n,
    }
}

/// Chunks in flight per decoding thread.
const DEPTH: usize = 2;

/// Where a string of a decoded entry is in its chunk's text.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: usize,
    len: usize,
}

/// An entry of a decoded line: where its strings are and what the
/// caller's `read` made of it.
#[derive(Debug)]
struct EntryItem<P> {
    seq: u64,
    timestamp: i64,
    id: Span,
    parent_id: Option<Span>,
    entry_type: Span,
    read: P,
}

#[derive(Debug)]
enum Item<P> {
    Entry(EntryItem<P>),
    Other(Record),
}

/// Why a chunk's decoding stopped at one of its lines.
#[derive(Debug)]
enum LineFault {
    /// Longer than the line limit.
    TooLong,
    /// Not a record line.
    Bad(LineError),
}

/// One chunk decoded: its lines' records, in order.
#[derive(Debug)]
struct Decoded<P> {
    /// The chunk's bytes (given back for the next read).
    bytes: Vec<u8>,
    /// The entries' ids, parents and types, back to back (copied: a view
    /// of the chunk's bytes as text would cost a UTF-8 pass over all of
    /// them, ~10 % of a check's instructions).
    text: String,
    items: Vec<Item<P>>,
    /// Per decoded line: its end in `bytes` (after its `\n`) and the end
    /// of its records in `items`.
    lines: Vec<(usize, usize)>,
    /// The line the decoding stopped at (the one after the last of
    /// `lines`): why, its length, and whether it ends the chunk.
    fault: Option<(LineFault, usize, bool)>,
}

impl<P> Decoded<P> {
    fn str(&self, span: Span) -> &str {
        self.text.get(span.start..span.start + span.len).unwrap_or_default()
    }

    /// An entry's index fields lent as a view (its `payload` is empty:
    /// the caller's `read` saw it on the decoding thread).
    fn view<'a>(&'a self, entry: &EntryItem<P>) -> EntryView<'a> {
        EntryView {
            seq: entry.seq,
            timestamp: entry.timestamp,
            id: self.str(entry.id),
            parent_id: entry.parent_id.map(|p| self.str(p)),
            entry_type: self.str(entry.entry_type),
            payload: "",
        }
    }
}

fn push_str(text: &mut String, s: &str) -> Span {
    let start = text.len();
    text.push_str(s);
    Span { start, len: s.len() }
}

/// Decode the whole lines of `bytes` (each ends with `\n`), stopping at the
/// first that is too long or not a record line.
fn decode_chunk<R: EntryRead>(bytes: Vec<u8>, max_line: u64, read: &R) -> Decoded<R::Out> {
    let mut text = String::new();
    let mut items = Vec::new();
    let mut lines = Vec::new();
    let mut fault = None;
    let mut start = 0usize;
    {
        let bytes = bytes.as_slice();
        let mut records: Vec<LineRecord<'_>> = Vec::new();
        let mut inline: Vec<InlineRecord<'_, R::Out>> = Vec::new();
        while start < bytes.len() {
            let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |at| start + at + 1);
            if (end - start) as u64 > max_line {
                fault = Some((LineFault::TooLong, end - start, end == bytes.len()));
                break;
            }
            let line = &bytes[start..end - 1];
            inline.clear();
            if !decode_line_inline(line, read, &mut inline) {
                // Not a line the one-pass decode answers for: the usual
                // decode says what it holds or why it is refused.
                inline.clear();
                records.clear();
                if let Err(e) = decode_line_borrowed(line, &mut records) {
                    fault = Some((LineFault::Bad(e), end - start, end == bytes.len()));
                    break;
                }
                inline.extend(records.drain(..).map(|record| (record, None)));
            }
            for (record, read_inline) in inline.drain(..) {
                items.push(match record {
                    LineRecord::Entry(entry) => {
                        let got = match read_inline {
                            Some(got) => got,
                            None => read.read(entry.view()),
                        };
                        Item::Entry(EntryItem {
                            seq: entry.seq,
                            timestamp: entry.timestamp,
                            id: push_str(&mut text, &entry.id),
                            parent_id: entry.parent_id.as_deref().map(|p| push_str(&mut text, p)),
                            entry_type: push_str(&mut text, &entry.entry_type),
                            read: got,
                        })
                    }
                    LineRecord::Other(record) => Item::Other(record),
                });
            }
            lines.push((end, items.len()));
            start = end;
        }
    }
    Decoded { bytes, text, items, lines, fault }
}

/// What the applying side does with the records, in file order; an error
/// is the reason the record is refused.
pub(crate) trait ApplyRead<P> {
    /// An entry (lent from its line), with what `read` made of it on a
    /// decoding thread.
    fn entry(&mut self, entry: EntryView<'_>, read: P) -> Result<(), String>;

    /// Any other record.
    fn other(&mut self, record: Record) -> Result<(), String>;
}

/// The file's remaining bytes cut into chunks of whole lines.
struct Chunks<R> {
    reader: BufReader<R>,
    /// The start of a line not yet ended by a `\n`.
    carry: Vec<u8>,
    eof: bool,
    max_line: u64,
    chunk: usize,
}

/// What [`Chunks::next`] found.
enum Next {
    /// Whole lines.
    Lines(Vec<u8>),
    /// The end: a final line without its `\n` (empty if none).
    End(Vec<u8>),
    /// A line longer than the limit starts in the carried bytes.
    TooLong,
}

impl<R: Read> Chunks<R> {
    /// Whether the file has no byte after the chunks given out.
    fn at_end(&mut self) -> std::io::Result<bool> {
        if !self.carry.is_empty() {
            return Ok(false);
        }
        if !self.eof && self.reader.fill_buf()?.is_empty() {
            self.eof = true;
        }
        Ok(self.eof)
    }

    fn next(&mut self, mut buf: Vec<u8>) -> std::io::Result<Next> {
        buf.clear();
        buf.append(&mut self.carry);
        loop {
            if buf.len() >= self.chunk || self.eof {
                if let Some(last) = memchr::memrchr(b'\n', &buf) {
                    self.carry.extend_from_slice(&buf[last + 1..]);
                    buf.truncate(last + 1);
                    return Ok(Next::Lines(buf));
                }
                if self.eof {
                    return Ok(Next::End(buf));
                }
                if buf.len() as u64 > self.max_line {
                    return Ok(Next::TooLong);
                }
            }
            let want = self.chunk.max(buf.len() + 1).saturating_sub(buf.len()).max(64 * 1024);
            // Read into the vector's spare room (not zeroed first).
            let got = loop {
                match (&mut self.reader).take(want as u64).read_to_end(&mut buf) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            };
            if got == 0 {
                self.eof = true;
            }
        }
    }
}

/// Replay the session file from `reader` with every rule of
/// [`replay_into`](super::replay::replay_into), in chunks of about `chunk`
/// bytes decoded on `threads` other threads (none: on this one) with
/// `read` run over each entry there, and applied to `sink` here in file
/// order.
pub(crate) fn replay_chunks<R: EntryRead>(
    path: &str,
    reader: impl Read,
    max_line: u64,
    threads: usize,
    chunk: usize,
    read: &R,
    sink: &mut dyn ApplyRead<R::Out>,
) -> Result<ReplayedFile, StorageError> {
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let (header, file_version, header_len) = read_header(path, &mut reader, max_line)?;
    let mut applying = Applying {
        path,
        max_line,
        liveness: Liveness::default(),
        valid_len: header_len,
        lines: 1,
        torn_bytes: 0,
        done: false,
    };
    if migrate::changes_records(file_version) {
        // Rare (files written before the current storage version): the
        // sequential replay, whose records go through the migration.
        let mut sink = ReadEach { read, sink };
        return super::replay::replay_rest(path, reader, max_line, (header, file_version, header_len), &mut sink);
    }
    let threads = threads.min(8);
    let mut chunks = Chunks { reader, carry: Vec::new(), eof: false, max_line, chunk: chunk.max(1) };
    std::thread::scope(|scope| {
        let mut workers = Vec::new();
        let mut handles = Vec::new();
        for n in 0..threads {
            let (to_worker, work) = mpsc::channel::<Vec<u8>>();
            let (done, from_worker) = mpsc::channel::<Decoded<R::Out>>();
            let spawned =
                std::thread::Builder::new().name(format!("cairn-decode-{n}")).spawn_scoped(scope, move || {
                    while let Ok(bytes) = work.recv() {
                        if done.send(decode_chunk(bytes, max_line, read)).is_err() {
                            break;
                        }
                    }
                });
            match spawned {
                Ok(handle) => {
                    workers.push((to_worker, from_worker));
                    handles.push(handle);
                }
                Err(_) => break,
            }
        }
        let result = drive(&mut chunks, &mut applying, &workers, read, sink);
        // Closing the channels ends the threads; each is joined here (so a
        // thread's panic, were there one, is an error, not a panic here).
        drop(workers);
        let mut stopped = false;
        for handle in handles {
            stopped |= handle.join().is_err();
        }
        match result {
            Ok(()) if stopped => Err(StorageError::Invalid("a decoding thread stopped".to_owned())),
            other => other,
        }
    })?;
    Ok(ReplayedFile {
        header,
        file_version,
        liveness: applying.liveness,
        valid_len: applying.valid_len,
        torn_bytes: applying.torn_bytes,
    })
}

/// The workers' channels: chunks to decode, decoded chunks.
type Worker<P> = (mpsc::Sender<Vec<u8>>, mpsc::Receiver<Decoded<P>>);

/// Hand the chunks out round robin (so they come back in file order) with
/// at most [`DEPTH`] per worker in flight, apply them as they come back,
/// and apply how the file ends. Without workers, each chunk is decoded
/// here.
fn drive<F: Read, R: EntryRead>(
    chunks: &mut Chunks<F>,
    applying: &mut Applying<'_>,
    workers: &[Worker<R::Out>],
    read: &R,
    sink: &mut dyn ApplyRead<R::Out>,
) -> Result<(), StorageError> {
    let path = applying.path;
    let io = |source| StorageError::Io { path: path.to_owned(), source };
    let stopped = || StorageError::Invalid("a decoding thread stopped".to_owned());
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let (mut sent, mut received) = (0usize, 0usize);
    let mut end: Option<Next> = None;
    loop {
        while end.is_none() && (workers.is_empty() || sent - received < workers.len() * DEPTH) {
            match chunks.next(spare.pop().unwrap_or_default()).map_err(io)? {
                Next::Lines(bytes) => match workers.get(sent % workers.len().max(1)) {
                    None => {
                        let decoded = decode_chunk(bytes, chunks.max_line, read);
                        let last = chunks.at_end().map_err(io)?;
                        applying.apply(decoded, last, sink, &mut spare)?;
                        if applying.done {
                            return Ok(());
                        }
                    }
                    Some((to_worker, _)) => {
                        to_worker.send(bytes).map_err(|_| stopped())?;
                        sent += 1;
                    }
                },
                other => end = Some(other),
            }
        }
        if received == sent {
            break;
        }
        let Some((_, from_worker)) = workers.get(received % workers.len().max(1)) else { break };
        let decoded = from_worker.recv().map_err(|_| stopped())?;
        received += 1;
        // Whether this chunk's end is the file's end.
        let last = received == sent
            && match &end {
                Some(Next::End(rest)) => rest.is_empty(),
                Some(Next::TooLong) => false,
                Some(Next::Lines(_)) | None => chunks.at_end().map_err(io)?,
            };
        applying.apply(decoded, last, sink, &mut spare)?;
        if applying.done {
            return Ok(());
        }
    }
    let too_long = |applying: &Applying<'_>| StorageError::LineTooLong {
        path: path.to_owned(),
        line: applying.lines + 1,
        offset: applying.valid_len,
        limit: applying.max_line,
    };
    match end {
        Some(Next::TooLong) => Err(too_long(applying)),
        Some(Next::End(rest)) if rest.len() as u64 > applying.max_line => Err(too_long(applying)),
        Some(Next::End(rest)) => {
            // A commit whose write never finished.
            applying.torn_bytes = rest.len() as u64;
            Ok(())
        }
        Some(Next::Lines(_)) | None => Ok(()),
    }
}

/// The applying side's state: `replay_into`'s counters.
struct Applying<'p> {
    path: &'p str,
    max_line: u64,
    liveness: Liveness,
    valid_len: u64,
    lines: u64,
    torn_bytes: u64,
    /// A torn final line was found: nothing more to apply.
    done: bool,
}

impl Applying<'_> {
    /// Apply one decoded chunk; `last` when its end is the file's end.
    fn apply<P>(
        &mut self,
        mut decoded: Decoded<P>,
        last: bool,
        sink: &mut dyn ApplyRead<P>,
        spare: &mut Vec<Vec<u8>>,
    ) -> Result<(), StorageError> {
        let mut start = 0usize;
        let mut items = std::mem::take(&mut decoded.items).into_iter();
        let mut first_item = 0usize;
        for &(end, items_end) in &decoded.lines {
            let line_no = self.lines + 1;
            for item in items.by_ref().take(items_end - first_item) {
                let applied = match item {
                    Item::Entry(entry) => {
                        self.liveness.account_entry();
                        let view = decoded.view(&entry);
                        sink.entry(view, entry.read)
                    }
                    Item::Other(record) => {
                        self.liveness.account(&record);
                        sink.other(record)
                    }
                };
                applied.map_err(|reason| StorageError::Corrupt {
                    path: self.path.to_owned(),
                    line: line_no,
                    offset: self.valid_len,
                    reason,
                })?;
            }
            first_item = items_end;
            self.valid_len += (end - start) as u64;
            self.lines += 1;
            start = end;
        }
        if let Some((fault, line_len, ends_chunk)) = decoded.fault {
            let at_end = last && ends_chunk;
            match fault {
                LineFault::TooLong => {
                    return Err(StorageError::LineTooLong {
                        path: self.path.to_owned(),
                        line: self.lines + 1,
                        offset: self.valid_len,
                        limit: self.max_line,
                    });
                }
                LineFault::Bad(e) if at_end && e.is_syntax() => {
                    self.torn_bytes = line_len as u64;
                    self.done = true;
                }
                LineFault::Bad(e) => {
                    return Err(StorageError::Corrupt {
                        path: self.path.to_owned(),
                        line: self.lines + 1,
                        offset: self.valid_len,
                        reason: e.to_string(),
                    });
                }
            }
        }
        spare.push(decoded.bytes);
        Ok(())
    }
}

/// An [`ApplyRead`] fed by the sequential replay: `read` run here.
struct ReadEach<'r, R: EntryRead> {
    read: &'r R,
    sink: &'r mut dyn ApplyRead<R::Out>,
}

impl<R: EntryRead> super::replay::Apply for ReadEach<'_, R> {
    fn apply(&mut self, record: Record) -> Result<(), String> {
        match record {
            Record::Entry(entry) => {
                let got = self.read.read(entry.view());
                self.sink.entry(entry.view(), got)
            }
            other => self.sink.other(other),
        }
    }
}
