//! The JSONL backend: one append-only file per session, the default store.
//!
//! It owns the file's life: creation (atomic, through a hard link so a
//! half-written header can never appear under the session's name), the
//! one-writer lock (a `<file>.lock` sidecar holding the writer's pid), the
//! append of one line per commit and its fsync policy, truncation of a torn
//! tail when opening for write, and compaction (temp file, fsync, rename,
//! directory fsync). Replay rules live in `replay.rs`, validation in
//! [`SessionIndex`]. It must never rewrite a committed line in place, and a
//! read-only handle must never modify the file.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::index::SessionIndex;
use super::line::{encode_header, encode_line, encoded_len};
use super::record::{
    Committed, Header, RawJson, Record, RegisterOp, RegisterRecord, State, Transaction, UsageRow, now_millis,
};
use super::replay::{Liveness, replay};
use super::{Storage, StorageError};

/// When commits reach the disk (fdatasync).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Durability {
    /// fdatasync after every commit: a commit that returned survives power
    /// loss. The default.
    EveryCommit,
    /// fdatasync once `max_commits` commits are unsynced or `max_delay` has
    /// passed since the last sync (checked at commit time; there is no
    /// background thread), and on [`Storage::sync`] and drop. A process crash
    /// loses nothing that returned; power loss may lose the unsynced group.
    Grouped {
        /// Sync after this many unsynced commits.
        max_commits: u32,
        /// Sync when a commit comes this long after the last sync.
        max_delay: Duration,
    },
    /// Never sync except on [`Storage::sync`] (tests, benchmarks, scratch
    /// sessions). A process crash still loses nothing that returned.
    None,
}

/// A step of a compaction, reported to [`StoreOptions::on_compact_step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactStep {
    /// The live state is written to the temp file (not yet synced).
    TempWritten,
    /// The temp file is fsynced.
    TempSynced,
    /// The temp file was renamed over the session file.
    Renamed,
    /// The directory is fsynced: the compaction is durable.
    DirSynced,
}

/// The default [`StoreOptions::compact_ratio`]: compact once more than half
/// of a file's bytes are dead, so a file is at most about twice its live size.
pub const DEFAULT_COMPACT_RATIO: f64 = 0.5;

/// The default [`StoreOptions::max_line_bytes`] (64 MiB): far above any line
/// the turn writes (a tool's stored output is capped at 1 MiB, at most 6 MiB
/// once JSON-escaped), far below what would exhaust memory.
pub const DEFAULT_MAX_LINE_BYTES: u64 = 64 << 20;

/// Options of a [`JsonlStore`].
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// Fsync policy.
    pub durability: Durability,
    /// Compact automatically after a commit when the dead-bytes ratio is
    /// above this; `None` never compacts by itself. Default
    /// [`DEFAULT_COMPACT_RATIO`].
    pub compact_ratio: Option<f64>,
    /// Files smaller than this are never compacted automatically (default 1 MiB).
    pub compact_min_bytes: u64,
    /// Longest line (newline included) a read accepts and a commit writes:
    /// a longer line is refused with an error naming it instead of being
    /// buffered whole. Default [`DEFAULT_MAX_LINE_BYTES`].
    pub max_line_bytes: u64,
    /// Called at each step of a compaction (observability, crash tests).
    pub on_compact_step: Option<fn(CompactStep)>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            durability: Durability::EveryCommit,
            compact_ratio: Some(DEFAULT_COMPACT_RATIO),
            compact_min_bytes: 1 << 20,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            on_compact_step: None,
        }
    }
}

impl StoreOptions {
    /// The default options with another durability.
    pub fn with_durability(durability: Durability) -> Self {
        Self { durability, ..Self::default() }
    }

    /// Whether the automatic compaction rule says a file of `len` bytes
    /// with this share of dead bytes is due (what `cairn compact` honours
    /// unless forced).
    pub fn compaction_due(&self, len: u64, dead_bytes_ratio: f64) -> bool {
        self.compact_ratio.is_some_and(|ratio| len >= self.compact_min_bytes && dead_bytes_ratio > ratio)
    }
}

/// A new time-ordered session id (UUID v7, text form).
pub fn new_session_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> StorageError + '_ {
    move |source| StorageError::Io { path: path.display().to_string(), source }
}

/// How a session file is opened by [`open_regular`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// Read only; a symlink to a regular file is followed.
    Read,
    /// Read and append; the path itself must not be a symlink.
    Append,
}

/// Open a session file, accepting only a regular file: a FIFO, a device, a
/// socket or a directory (directly or behind a symlink) is refused without
/// blocking or reading from it, and an [`Access::Append`] open refuses a
/// symlink so that nothing is ever written through one.
pub(super) fn open_regular(path: &Path, access: Access) -> Result<File, StorageError> {
    let mut options = OpenOptions::new();
    options.read(true);
    if access == Access::Append {
        options.append(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // O_NONBLOCK: opening a FIFO must not wait for a writer (it has no
        // effect on regular files). O_NOFOLLOW: fail on a final symlink.
        let nofollow = if access == Access::Append { libc::O_NOFOLLOW } else { 0 };
        options.custom_flags(libc::O_NONBLOCK | nofollow);
    }
    #[cfg(not(unix))]
    if access == Access::Append && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(StorageError::Symlink { path: path.display().to_string() });
    }
    let file = match options.open(path) {
        Ok(file) => file,
        #[cfg(unix)]
        Err(e) if access == Access::Append && e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(StorageError::Symlink { path: path.display().to_string() });
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    let kind = file.metadata().map_err(io_err(path))?.file_type();
    if !kind.is_file() {
        return Err(StorageError::NotRegular { path: path.display().to_string(), what: describe_kind(&kind) });
    }
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // Back to blocking I/O for the regular file (harmless either way).
        // SAFETY: fcntl on a descriptor this function owns, with integer
        // arguments only.
        unsafe {
            let fd = file.as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        }
    }
    Ok(file)
}

fn describe_kind(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() { "a directory" } else { "not a regular file" }
}

fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The lock sidecar of a session file: `<file>.lock`.
pub fn lock_path(path: &Path) -> PathBuf {
    sidecar(path, ".lock")
}

/// Take the exclusive writer lock of `path`, or fail with `Busy`.
pub(super) fn lock(path: &Path) -> Result<File, StorageError> {
    let lock_path = lock_path(path);
    let io = io_err(&lock_path);
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // The pid is written into the lock file: never through a symlink,
        // and a FIFO planted under its name must not block the open.
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let mut file = options.open(&lock_path).map_err(&io)?;
    if !file.metadata().map_err(&io)?.is_file() {
        return Err(StorageError::NotRegular { path: lock_path.display().to_string(), what: "not a regular file" });
    }
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let pid = file.read_to_string(&mut text).ok().and_then(|_| text.trim().parse().ok());
            return Err(StorageError::Busy { path: path.display().to_string(), pid });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(&io)?;
    file.write_all(std::process::id().to_string().as_bytes()).map_err(&io)?;
    Ok(file)
}

fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
}

fn parent_dir(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("."))
}

/// The rule a session id must follow to name a session file: not empty, not
/// starting with `.`, no `/`, `\` or NUL. Every backend that takes an id
/// from outside (an import) applies it too, so an id never names a path.
pub fn check_session_id(id: &str) -> Result<(), StorageError> {
    check_id(id)
}

/// The longest session id taken from a file made elsewhere (an import).
pub const MAX_IMPORTED_ID_BYTES: usize = 255;

/// The rule for an id taken from a file made elsewhere (`cairn import`):
/// [`check_session_id`], at most [`MAX_IMPORTED_ID_BYTES`] bytes, no
/// control character (ids are printed and typed), and no
/// [`super::FAMILY_SEP`]: such an id names a subagent of another session
/// (`<parent>+<invocation>`), which only that parent's `spawn_agent` call
/// creates — an imported one would answer for it.
pub fn check_imported_id(id: &str) -> Result<(), StorageError> {
    check_id(id)?;
    let shown: String = id.chars().take(80).flat_map(char::escape_debug).collect();
    let shown = if id.chars().count() > 80 { format!("{shown}…") } else { shown };
    if id.len() > MAX_IMPORTED_ID_BYTES {
        return Err(StorageError::Invalid(format!(
            "session id \"{shown}\" is {} bytes long, more than the {MAX_IMPORTED_ID_BYTES} an imported id may have; give the file's header a shorter \"id\"",
            id.len()
        )));
    }
    if id.chars().any(char::is_control) {
        return Err(StorageError::Invalid(format!(
            "session id \"{shown}\" holds a control character; give the file's header an \"id\" of letters, digits, '-' or '_'"
        )));
    }
    if id.contains(super::FAMILY_SEP) {
        return Err(StorageError::Invalid(format!(
            "session id \"{shown}\" contains '{sep}', which names a subagent of another session (<parent>{sep}<invocation>); a subagent is created only by its parent's spawn_agent call and is never imported — import its top-level session, or give the file's header an \"id\" without '{sep}'",
            sep = super::FAMILY_SEP
        )));
    }
    Ok(())
}

fn check_id(id: &str) -> Result<(), StorageError> {
    if id.is_empty() || id.starts_with('.') || id.contains(['/', '\\', '\0']) {
        return Err(StorageError::Invalid(format!(
            "session id {id:?} cannot name a file: use letters, digits, '-' or '_' (e.g. new_session_id())"
        )));
    }
    Ok(())
}

/// The writable side of a store.
#[derive(Debug)]
struct Writer {
    file: File,
    _lock: File,
    unsynced: u32,
    last_sync: Instant,
}

/// A session stored as a JSONL file (see `docs/storage-format.md`).
#[derive(Debug)]
pub struct JsonlStore {
    path: PathBuf,
    header: Header,
    /// The storage version the file's header declares (older ones are
    /// migrated in memory at open; see `migrate.rs`).
    file_version: u32,
    index: SessionIndex,
    liveness: Liveness,
    /// Bytes of valid data in the file.
    len: u64,
    torn_bytes: u64,
    opts: StoreOptions,
    writer: Option<Writer>,
    /// Set when a failed write or sync left the file in an unknown state.
    poisoned: Option<String>,
}

impl JsonlStore {
    /// Create the session file `dir/<header.id>.jsonl` (creating `dir`),
    /// holding only the header, synced along with its directory, and open it
    /// for writing. Fails if the session already exists.
    pub fn create(dir: &Path, header: Header, opts: StoreOptions) -> Result<Self, StorageError> {
        check_id(&header.id)?;
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let path = dir.join(format!("{}.jsonl", header.id));
        let lock = lock(&path)?;
        if path.exists() {
            return Err(StorageError::Exists { path: path.display().to_string() });
        }
        // Write the header to a temp name, sync it, then link it into place:
        // the session name never shows a half-written header.
        let temp = dir.join(format!(".{}.jsonl.new", header.id));
        let line = encode_header(&header).map_err(|e| StorageError::Encode(e.to_string()))?;
        {
            let mut file = File::create(&temp).map_err(io_err(&temp))?;
            file.write_all(&line).map_err(io_err(&temp))?;
            file.sync_all().map_err(io_err(&temp))?;
        }
        let linked = std::fs::hard_link(&temp, &path);
        let _ = std::fs::remove_file(&temp);
        match linked {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(StorageError::Exists { path: path.display().to_string() });
            }
            Err(e) => return Err(io_err(&path)(e)),
        }
        sync_dir(dir)?;
        let file = OpenOptions::new().append(true).open(&path).map_err(io_err(&path))?;
        Ok(Self {
            path,
            file_version: header.storage_version,
            header,
            index: SessionIndex::new(),
            liveness: Liveness::default(),
            len: line.len() as u64,
            torn_bytes: 0,
            opts,
            writer: Some(Writer { file, _lock: lock, unsynced: 0, last_sync: Instant::now() }),
            poisoned: None,
        })
    }

    /// Open an existing session for writing: take the writer lock, replay
    /// the file, and cut a torn final line off (synced) so the next append
    /// starts on a fresh line. Only a regular file is opened, never through
    /// a symlink ([`StorageError::Symlink`]).
    pub fn open(path: &Path, opts: StoreOptions) -> Result<Self, StorageError> {
        let io = io_err(path);
        // Open first, so a wrong path leaves no lock file behind.
        let file = open_regular(path, Access::Append)?;
        let lock = lock(path)?;
        // A compaction that died before its rename leaves its temp file.
        let temp = sidecar(path, ".compact");
        if temp.exists() {
            std::fs::remove_file(&temp).map_err(io_err(&temp))?;
        }
        // Reopen after taking the lock: a compaction by the previous holder
        // may have renamed a new file over the path in between.
        drop(file);
        let file = open_regular(path, Access::Append)?;
        let size = file.metadata().map_or(0, |m| m.len());
        let replayed = replay(&path.display().to_string(), &file, opts.max_line_bytes, size)?;
        if replayed.torn_bytes > 0 {
            file.set_len(replayed.valid_len).map_err(&io)?;
            file.sync_data().map_err(&io)?;
        }
        Ok(Self {
            path: path.to_owned(),
            file_version: replayed.file_version,
            header: replayed.header,
            index: replayed.index,
            liveness: replayed.liveness,
            len: replayed.valid_len,
            torn_bytes: replayed.torn_bytes,
            opts,
            writer: Some(Writer { file, _lock: lock, unsynced: 0, last_sync: Instant::now() }),
            poisoned: None,
        })
    }

    /// Open a session for reading only. Takes no lock (a writer may be
    /// appending) and never modifies the file; a torn tail is skipped.
    pub fn open_read_only(path: &Path) -> Result<Self, StorageError> {
        Self::open_read_only_with(path, StoreOptions::default())
    }

    /// [`open_read_only`](Self::open_read_only) with options (the line
    /// limit is the one that matters to a reader).
    pub fn open_read_only_with(path: &Path, opts: StoreOptions) -> Result<Self, StorageError> {
        let file = open_regular(path, Access::Read)?;
        let size = file.metadata().map_or(0, |m| m.len());
        let replayed = replay(&path.display().to_string(), file, opts.max_line_bytes, size)?;
        Ok(Self {
            path: path.to_owned(),
            file_version: replayed.file_version,
            header: replayed.header,
            index: replayed.index,
            liveness: replayed.liveness,
            len: replayed.valid_len,
            torn_bytes: replayed.torn_bytes,
            opts,
            writer: None,
            poisoned: None,
        })
    }

    /// The session file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The in-memory index (for comparisons and read-heavy callers).
    pub fn index(&self) -> &SessionIndex {
        &self.index
    }

    /// The storage version the file's header declares. [`Storage::header`]
    /// shows the session as this build reads it (the current version); an
    /// older file is migrated in memory and rewritten only by a compaction.
    pub fn file_storage_version(&self) -> u32 {
        self.file_version
    }

    /// The options this handle was opened with.
    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }

    /// Bytes of the torn final line that open discarded (0 if none). A
    /// writable open also cut them off the file.
    pub fn torn_tail_bytes(&self) -> u64 {
        self.torn_bytes
    }

    /// Bytes of valid data in the file.
    pub fn len_bytes(&self) -> u64 {
        self.len
    }

    /// The share of the file's bytes that no longer contribute to the live
    /// state (overwritten or deleted registers, superseded states), 0..=1.
    pub fn dead_bytes_ratio(&self) -> f64 {
        if self.len == 0 { 0.0 } else { self.liveness.dead_bytes as f64 / self.len as f64 }
    }

    fn writer(&mut self) -> Result<&mut Writer, StorageError> {
        if let Some(reason) = &self.poisoned {
            return Err(StorageError::Invalid(format!(
                "{}: an earlier write failed ({reason}); reopen the session",
                self.path.display()
            )));
        }
        self.writer.as_mut().ok_or_else(|| StorageError::ReadOnly { path: self.path.display().to_string() })
    }

    /// Rewrite the file with only its live records (every entry, usage row,
    /// live register and the state), through a synced temp file renamed over
    /// the original, then sync the directory. A crash at any step leaves
    /// either the old or the new file, both complete.
    pub fn compact(&mut self) -> Result<(), StorageError> {
        let _ = self.writer()?;
        let temp = sidecar(&self.path, ".compact");
        let step = |s| {
            if let Some(hook) = self.opts.on_compact_step {
                hook(s);
            }
        };
        // Until the rename, a failure leaves the old file as it was; the
        // temp file is removed here or by the next writer's open.
        let written = match self.write_compacted(&temp) {
            Ok(written) => written,
            Err(e) => {
                let _ = std::fs::remove_file(&temp);
                return Err(e);
            }
        };
        step(CompactStep::TempWritten);
        if let Err(e) = File::open(&temp).and_then(|f| f.sync_all()) {
            let _ = std::fs::remove_file(&temp);
            return Err(io_err(&temp)(e));
        }
        step(CompactStep::TempSynced);
        std::fs::rename(&temp, &self.path).map_err(io_err(&self.path))?;
        // From here on the path names the new file (already synced): account
        // for it before anything else can fail, and reopen the writer on it.
        self.len = written;
        self.file_version = self.header.storage_version;
        self.liveness.dead_bytes =
            self.liveness.last_delete.as_ref().map_or(0, |d| encoded_len(&Record::Register(d.clone())));
        let reopened = OpenOptions::new().append(true).open(&self.path);
        match (reopened, self.writer.as_mut()) {
            (Ok(file), Some(writer)) => {
                writer.file = file;
                writer.unsynced = 0;
                writer.last_sync = Instant::now();
            }
            (Err(e), _) => {
                self.poisoned = Some(format!("cannot reopen after compaction: {e}"));
                return Err(io_err(&self.path)(e));
            }
            (Ok(_), None) => {}
        }
        step(CompactStep::Renamed);
        sync_dir(parent_dir(&self.path))?;
        step(CompactStep::DirSynced);
        Ok(())
    }

    /// Write header and live records, one per line in seq order, to `temp`.
    fn write_compacted(&self, temp: &Path) -> Result<u64, StorageError> {
        enum Live<'a> {
            /// By position in the index.
            Entry(usize),
            Usage(&'a UsageRow),
            Set(&'a str, &'a str, &'a RawJson),
            State(&'a State),
            Delete(&'a RegisterRecord),
        }
        let mut live: Vec<(u64, Live<'_>)> = Vec::with_capacity(self.index.entry_count());
        live.extend((0..self.index.entry_count()).map(|i| (self.index.entry_seq(i), Live::Entry(i))));
        live.extend(self.index.usage().iter().map(|u| (u.seq, Live::Usage(u))));
        for (namespace, key, value) in self.index.all_registers() {
            let seq = self.liveness.register(namespace, key).map_or(0, |l| l.seq);
            live.push((seq, Live::Set(namespace, key, value)));
        }
        if let Some(state) = self.index.state() {
            live.push((state.seq, Live::State(state)));
        }
        if let Some(delete) = &self.liveness.last_delete {
            live.push((delete.seq, Live::Delete(delete)));
        }
        live.sort_by_key(|(seq, _)| *seq);

        let io = io_err(temp);
        let file = OpenOptions::new().write(true).create(true).truncate(true).open(temp).map_err(&io)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let header = encode_header(&self.header).map_err(|e| StorageError::Encode(e.to_string()))?;
        out.write_all(&header).map_err(&io)?;
        let mut written = header.len() as u64;
        for (seq, item) in live {
            let record = match item {
                Live::Entry(i) => Record::Entry(self.index.entry_at(i)),
                Live::Usage(u) => Record::Usage(u.clone()),
                Live::Set(namespace, key, value) => Record::Register(RegisterRecord {
                    op: RegisterOp::Set,
                    seq,
                    namespace: namespace.to_owned(),
                    key: key.to_owned(),
                    value: Some(value.clone()),
                }),
                Live::State(s) => Record::State(s.clone()),
                Live::Delete(d) => Record::Register(d.clone()),
            };
            let line = encode_line(std::slice::from_ref(&record)).map_err(|e| StorageError::Encode(e.to_string()))?;
            out.write_all(&line).map_err(&io)?;
            written += line.len() as u64;
        }
        out.flush().map_err(&io)?;
        Ok(written)
    }

    fn maybe_compact(&mut self) -> Result<(), StorageError> {
        if self.opts.compaction_due(self.len, self.dead_bytes_ratio()) {
            self.compact()?;
        }
        Ok(())
    }

    /// Undo a failed append: cut the file back to its last good byte. When
    /// that fails too, or `sticky` (a failed fsync: the page cache state is
    /// unknown), refuse further commits until the session is reopened.
    fn rollback(&mut self, why: &std::io::Error, sticky: bool) {
        let len = self.len;
        let cut = self.writer.as_mut().map(|w| w.file.set_len(len).and_then(|()| w.file.sync_data()));
        if sticky || !matches!(cut, Some(Ok(()))) {
            self.poisoned = Some(why.to_string());
        }
    }
}

impl Storage for JsonlStore {
    fn header(&self) -> &Header {
        &self.header
    }

    fn commit(&mut self, tx: Transaction) -> Result<Committed, StorageError> {
        self.writer()?;
        let records = self.index.plan(tx, now_millis())?;
        let committed = SessionIndex::committed(&records);
        let line = encode_line(&records).map_err(|e| StorageError::Encode(e.to_string()))?;
        if line.len() as u64 > self.opts.max_line_bytes {
            // Written, it would make the file unreadable under the same limit.
            return Err(StorageError::Invalid(format!(
                "the commit would be a line of {} bytes, longer than the limit of {} bytes (StoreOptions::max_line_bytes); nothing was written",
                line.len(),
                self.opts.max_line_bytes
            )));
        }
        let durability = self.opts.durability;
        let writer = self.writer()?;
        let mut failed = writer.file.write_all(&line).err().map(|e| (e, false));
        if failed.is_none() {
            writer.unsynced += 1;
            let due = match durability {
                Durability::EveryCommit => true,
                Durability::Grouped { max_commits, max_delay } => {
                    writer.unsynced >= max_commits || writer.last_sync.elapsed() >= max_delay
                }
                Durability::None => false,
            };
            if due {
                failed = writer.file.sync_data().err().map(|e| (e, true));
                writer.unsynced = 0;
                writer.last_sync = Instant::now();
            }
        }
        if let Some((e, sticky)) = failed {
            // Cut the line off so nothing half-written stays behind; after a
            // failed fsync (errors are not sticky in the kernel) also refuse
            // further commits until the session is reopened.
            self.rollback(&e, sticky);
            return Err(io_err(&self.path)(e));
        }
        self.len += line.len() as u64;
        for record in records {
            self.liveness.account(&record);
            if let Err(e) = self.index.apply(record) {
                self.poisoned = Some(e.clone());
                return Err(StorageError::Invalid(e));
            }
        }
        // The commit is durable; a failed compaction leaves the old file in
        // place and is reported by the next explicit `compact`.
        let _ = self.maybe_compact();
        Ok(committed)
    }

    super::reads_from_index!();

    fn sync(&mut self) -> Result<(), StorageError> {
        let path = self.path.clone();
        let writer = self.writer()?;
        writer.file.sync_data().map_err(io_err(&path))?;
        writer.unsynced = 0;
        writer.last_sync = Instant::now();
        Ok(())
    }
}

impl Drop for JsonlStore {
    fn drop(&mut self) {
        if let Some(writer) = &self.writer
            && writer.unsynced > 0
            && matches!(self.opts.durability, Durability::Grouped { .. })
        {
            let _ = writer.file.sync_data();
        }
    }
}
