//! Durable per-actor mailboxes: a bounded queue (1,000 messages, 16 MiB)
//! whose content is journaled to `broker/mailbox/<id>.jsonl` so messages
//! accepted for an actor (or for the native `agent`) survive a host crash.
//! Served round-robin across senders (each sender's messages in order),
//! and one actor may hold at most half of a mailbox, so a storm from one
//! sender neither fills another's way in nor waits ahead of it (issue 48).
//! Owns queueing only, not routing.
//!
//! Every message gets a sequence number, increasing for the life of the
//! journal (compaction keeps them), so a reader can name one message (the
//! agent records the number of the message that started its turn).
//!
//! Journal records: `+<line>` a push (the next number), `^<line>` a push
//! to the front (the next number: a message taken but not delivered, put
//! back where it was), `-` a pop of the oldest, `x<n>` the removal of message `n` wherever it is, `#<n>` "the
//! next number is at least `n`", `=<n> <line>` a message with its number
//! (written by compaction). Replayed and compacted when the mailbox is
//! opened. Delivery stays at most once: a message is popped (journaled)
//! before it is written to the actor's stdin.

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Messages a mailbox holds before senders get `undeliverable`.
pub const MAILBOX_LIMIT: usize = 1000;

/// Bytes (of message lines) a mailbox holds before senders get
/// `undeliverable`: 16 MiB, so a stopped actor's mailbox cannot grow the
/// host's memory or its journal without bound (1,000 messages of the
/// 1 MiB message limit would be 1 GiB).
pub const MAILBOX_BYTES: usize = 16 << 20;

/// The journal is rewritten (compacted) while running once it holds this
/// many bytes more than twice what is queued: records of messages long
/// delivered never pile up.
const COMPACT_SLACK: u64 = 4 << 20;

/// Why a push was refused.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// The mailbox holds [`MAILBOX_LIMIT`] messages.
    #[error("mailbox full ({MAILBOX_LIMIT} messages)")]
    Full,
    /// The message would take the mailbox past [`MAILBOX_BYTES`].
    #[error(
        "mailbox full ({queued} bytes queued; a mailbox holds at most {MAILBOX_BYTES} bytes, this message is {size})"
    )]
    FullBytes {
        /// Bytes already queued.
        queued: usize,
        /// The refused message's bytes.
        size: usize,
    },
    /// One sender (an actor) holds half the mailbox already, in messages
    /// or bytes: the other half stays for everyone else.
    #[error(
        "mailbox full for {sender} ({count} messages, {bytes} bytes of it queued; one sender may hold at most half of a mailbox: {} messages, {} bytes)",
        MAILBOX_LIMIT / 2,
        MAILBOX_BYTES / 2
    )]
    SenderFull {
        /// The sender.
        sender: String,
        /// Its messages queued.
        count: usize,
        /// Their bytes.
        bytes: usize,
    },
    /// The message alone is larger than [`crate::message::MESSAGE_LIMIT`].
    #[error("message too large ({0} bytes; the limit is {limit} bytes)", limit = crate::message::MESSAGE_LIMIT)]
    TooLarge(usize),
    /// The journal could not be written.
    #[error("mailbox journal {0}: {1}")]
    Journal(PathBuf, std::io::Error),
}

#[derive(Debug)]
struct Inner {
    queue: VecDeque<(u64, String)>,
    next: u64,
    journal: File,
    /// Bytes of the queued lines.
    bytes: usize,
    /// Bytes of the journal file (as written by this process).
    journal_bytes: u64,
    /// Who sent each queued message, by number.
    who: HashMap<u64, Arc<str>>,
    /// Each sender's queued messages, in queue order, and their bytes.
    by_sender: HashMap<Arc<str>, (VecDeque<u64>, usize)>,
    /// When each sender was last served (`clock` at its last removal):
    /// [`Mailbox::peek_wait`] serves the least recently served first.
    served: HashMap<Arc<str>, u64>,
    clock: u64,
}

/// The sender of a queued line (a serialized `Inbound`, whose first
/// fields are `id` and `from`); a JSON string never holds `"from":"`
/// unescaped, so the first match is the field. Lines that are not
/// messages share one empty sender.
fn sender_of(line: &str) -> &str {
    const KEY: &str = "\"from\":\"";
    let Some(i) = line.find(KEY) else { return "" };
    let rest = &line[i + KEY.len()..];
    rest.find('"').map_or("", |j| &rest[..j])
}

/// Senders whose share of a mailbox is not capped: the host's own
/// participants (the broker's replies must always fit; the console and
/// the agent are the world's operators), and lines that name no sender
/// (never an actor's: the broker sets `from`).
fn uncapped(sender: &str) -> bool {
    matches!(sender, "" | "broker" | "console" | "agent" | "cc" | "http")
}

impl Inner {
    fn index_add(&mut self, n: u64, line: &str, front: bool) {
        let s: Arc<str> = Arc::from(sender_of(line));
        let e = self.by_sender.entry(s.clone()).or_default();
        if front {
            e.0.push_front(n);
        } else {
            e.0.push_back(n);
        }
        e.1 += line.len();
        self.who.insert(n, s);
    }

    fn index_remove(&mut self, n: u64, len: usize) {
        let Some(s) = self.who.remove(&n) else { return };
        if let Some(e) = self.by_sender.get_mut(&s) {
            if let Some(i) = e.0.iter().position(|x| *x == n) {
                e.0.remove(i);
            }
            e.1 = e.1.saturating_sub(len);
            if e.0.is_empty() {
                self.by_sender.remove(&s);
            }
        }
        self.clock += 1;
        if self.served.len() > 4096 {
            // Senders long gone: forget them (they start level again).
            let live = &self.by_sender;
            self.served.retain(|k, _| live.contains_key(k));
        }
        self.served.insert(s, self.clock);
    }

    /// The number of the oldest message of the least recently served
    /// sender (round-robin across senders; one sender's are in order).
    fn fair_front(&self) -> Option<u64> {
        let turn = |s: &Arc<str>| self.served.get(s).copied().unwrap_or(0);
        self.by_sender.iter().filter_map(|(s, (q, _))| Some((turn(s), *q.front()?))).min().map(|(_, n)| n)
    }
}

/// One actor's mailbox.
#[derive(Debug)]
pub struct Mailbox {
    path: PathBuf,
    inner: Mutex<Inner>,
    ready: Condvar,
}

/// Appends one journal record (`head`, `line`, newline) with one `write`
/// (issue 48.9: `writeln!` on a `File` made a system call of each piece,
/// three per message pushed and two per removal).
fn append_record(f: &mut File, head: &str, line: &str) -> std::io::Result<()> {
    let mut rec = Vec::with_capacity(head.len() + line.len() + 1);
    rec.extend_from_slice(head.as_bytes());
    rec.extend_from_slice(line.as_bytes());
    rec.push(b'\n');
    f.write_all(&rec)
}

/// Replays journal records into a queue and the next number.
fn replay(lines: impl Iterator<Item = String>) -> (VecDeque<(u64, String)>, u64) {
    let mut queue = VecDeque::new();
    let mut next = 1u64;
    for line in lines {
        if let Some(msg) = line.strip_prefix('+') {
            queue.push_back((next, msg.to_owned()));
            next += 1;
        } else if let Some(msg) = line.strip_prefix('^') {
            queue.push_front((next, msg.to_owned()));
            next += 1;
        } else if line == "-" {
            queue.pop_front();
        } else if let Some(n) = line.strip_prefix('x').and_then(|n| n.parse::<u64>().ok()) {
            queue.retain(|(s, _)| *s != n);
        } else if let Some(n) = line.strip_prefix('#').and_then(|n| n.parse::<u64>().ok()) {
            next = next.max(n);
        } else if let Some((n, msg)) = line.strip_prefix('=').and_then(|r| r.split_once(' '))
            && let Ok(n) = n.parse::<u64>()
        {
            queue.push_back((n, msg.to_owned()));
            next = next.max(n + 1);
        }
    }
    (queue, next)
}

/// Rewrites the journal at `path` as `#next` plus one `=<n> <line>` per
/// queued message (temp file, fsync, rename), and opens it for appending.
/// Returns the file and its size.
fn compact(path: &Path, queue: &VecDeque<(u64, String)>, next: u64) -> std::io::Result<(File, u64)> {
    let tmp = path.with_extension("jsonl.tmp");
    let mut size = 0u64;
    {
        let mut f = std::io::BufWriter::new(File::create(&tmp)?);
        let head = format!("#{next}\n");
        f.write_all(head.as_bytes())?;
        size += head.len() as u64;
        for (n, m) in queue {
            let rec = format!("={n} {m}\n");
            f.write_all(rec.as_bytes())?;
            size += rec.len() as u64;
        }
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    Ok((OpenOptions::new().append(true).open(path)?, size))
}

impl Mailbox {
    /// Opens (replaying and compacting) the journal at `path`.
    pub fn open(path: &Path) -> Result<Mailbox, MailboxError> {
        let err = |e| MailboxError::Journal(path.to_owned(), e);
        let (queue, next) = match File::open(path) {
            Ok(f) => {
                let mut text = String::new();
                BufReader::new(f).read_to_string(&mut text).map_err(err)?;
                // A last record without its newline was torn by a crash
                // mid-append: it never counted.
                let whole = text.rfind('\n').map_or("", |i| &text[..i]);
                replay(whole.lines().map(str::to_owned))
            }
            Err(_) => (VecDeque::new(), 1),
        };
        let (journal, journal_bytes) = compact(path, &queue, next).map_err(err)?;
        let bytes = queue.iter().map(|(_, m)| m.len()).sum();
        let mut inner = Inner {
            queue,
            next,
            journal,
            bytes,
            journal_bytes,
            who: HashMap::new(),
            by_sender: HashMap::new(),
            served: HashMap::new(),
            clock: 0,
        };
        let queued: Vec<(u64, String)> = inner.queue.iter().cloned().collect();
        for (n, m) in &queued {
            inner.index_add(*n, m, false);
        }
        Ok(Mailbox { path: path.to_owned(), inner: Mutex::new(inner), ready: Condvar::new() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues one stdin line (already serialized, without newline) and
    /// returns its number.
    pub fn push(&self, line: String) -> Result<u64, MailboxError> {
        self.add(line, false)
    }

    /// Puts a message taken but not delivered back at the front (ahead of
    /// everything queued since), under a new number. Never refused for
    /// fullness: it held a place before.
    pub fn push_front(&self, line: String) -> Result<u64, MailboxError> {
        self.add(line, true)
    }

    /// Journals, then queues, `line` under the next number.
    fn add(&self, line: String, front: bool) -> Result<u64, MailboxError> {
        let mut g = self.lock();
        if line.len() > crate::message::MESSAGE_LIMIT {
            return Err(MailboxError::TooLarge(line.len()));
        }
        if !front && g.queue.len() >= MAILBOX_LIMIT {
            return Err(MailboxError::Full);
        }
        if !front && g.bytes + line.len() > MAILBOX_BYTES {
            return Err(MailboxError::FullBytes { queued: g.bytes, size: line.len() });
        }
        let sender = sender_of(&line);
        if !front
            && !uncapped(sender)
            && let Some((q, b)) = g.by_sender.get(sender)
            && (q.len() >= MAILBOX_LIMIT / 2 || b + line.len() > MAILBOX_BYTES / 2)
        {
            return Err(MailboxError::SenderFull { sender: sender.to_owned(), count: q.len(), bytes: *b });
        }
        let record = if front { "^" } else { "+" };
        append_record(&mut g.journal, record, &line).map_err(|e| MailboxError::Journal(self.path.clone(), e))?;
        g.journal_bytes += line.len() as u64 + 2;
        g.bytes += line.len();
        let n = g.next;
        g.next += 1;
        g.index_add(n, &line, front);
        if front {
            g.queue.push_front((n, line));
        } else {
            g.queue.push_back((n, line));
        }
        self.ready.notify_all();
        Ok(n)
    }

    /// Records a removal (`record`, without newline) in the journal, and
    /// compacts the journal once it has grown well past what is queued.
    /// A failed write only loses the record (the message may then come
    /// again after a crash), as before.
    fn journal_removal(&self, g: &mut Inner, record: &str) {
        let _ = append_record(&mut g.journal, record, "");
        g.journal_bytes += record.len() as u64 + 1;
        if g.journal_bytes > 2 * g.bytes as u64 + COMPACT_SLACK
            && let Ok((journal, n)) = compact(&self.path, &g.queue, g.next)
        {
            g.journal = journal;
            g.journal_bytes = n;
        }
    }

    /// Takes the oldest message, waiting up to `wait` for one.
    pub fn pop_wait(&self, wait: Duration) -> Option<String> {
        let g = self.lock();
        let (mut g, _) =
            self.ready.wait_timeout_while(g, wait, |i| i.queue.is_empty()).unwrap_or_else(|p| p.into_inner());
        let (n, m) = g.queue.pop_front()?;
        g.bytes -= m.len();
        g.index_remove(n, m.len());
        self.journal_removal(&mut g, "-");
        Some(m)
    }

    /// The next message to serve and its number, left in the mailbox,
    /// waiting up to `wait` for one: the oldest of the sender served least
    /// recently (round-robin across senders, so one sender's storm delays
    /// another's message by at most one message of the storm per turn;
    /// each sender's messages stay in their order).
    pub fn peek_wait(&self, wait: Duration) -> Option<(u64, String)> {
        let g = self.lock();
        let (g, _) = self.ready.wait_timeout_while(g, wait, |i| i.queue.is_empty()).unwrap_or_else(|p| p.into_inner());
        let n = g.fair_front()?;
        g.queue.iter().find(|(s, _)| *s == n).cloned()
    }

    /// Takes the oldest message for which `pred` holds, waiting up to `wait`
    /// for one; the others stay where they are.
    pub fn take_first(&self, wait: Duration, pred: impl Fn(&str) -> bool) -> Option<(u64, String)> {
        let deadline = Instant::now() + wait;
        let mut g = self.lock();
        loop {
            if let Some(i) = g.queue.iter().position(|(_, m)| pred(m)) {
                let (n, m) = g.queue.remove(i)?;
                g.bytes -= m.len();
                g.index_remove(n, m.len());
                self.journal_removal(&mut g, &format!("x{n}"));
                return Some((n, m));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            g = self.ready.wait_timeout(g, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Removes message `n`; whether it was there.
    pub fn remove(&self, n: u64) -> bool {
        let mut g = self.lock();
        let Some(i) = g.queue.iter().position(|(s, _)| *s == n) else { return false };
        if let Some((_, m)) = g.queue.remove(i) {
            g.bytes -= m.len();
            g.index_remove(n, m.len());
        }
        self.journal_removal(&mut g, &format!("x{n}"));
        true
    }

    /// Every waiting message with its number, oldest first.
    pub fn entries(&self) -> Vec<(u64, String)> {
        self.lock().queue.iter().cloned().collect()
    }

    /// Makes the next number at least `n` (journaled), so numbers another
    /// record already used (the agent's session) are never handed out again.
    pub fn reserve(&self, n: u64) -> Result<(), MailboxError> {
        let mut g = self.lock();
        if g.next < n {
            append_record(&mut g.journal, &format!("#{n}"), "")
                .map_err(|e| MailboxError::Journal(self.path.clone(), e))?;
            g.journal_bytes += 24;
            g.next = n;
        }
        Ok(())
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_survives_reopen_and_limit_holds() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.jsonl");
        let m = Mailbox::open(&p).unwrap();
        for i in 0..MAILBOX_LIMIT {
            m.push(format!("{{\"n\":{i}}}")).unwrap();
        }
        assert!(matches!(m.push("x".into()), Err(MailboxError::Full)));
        assert_eq!(m.pop_wait(Duration::ZERO).as_deref(), Some("{\"n\":0}"));
        drop(m);
        let m = Mailbox::open(&p).unwrap();
        assert_eq!(m.len(), MAILBOX_LIMIT - 1);
        assert_eq!(m.pop_wait(Duration::ZERO).as_deref(), Some("{\"n\":1}"));
    }

    #[test]
    fn numbers_survive_removal_compaction_and_reserve() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("agent.jsonl");
        let m = Mailbox::open(&p).unwrap();
        assert_eq!(m.push("a".into()).unwrap(), 1);
        assert_eq!(m.push("b".into()).unwrap(), 2);
        assert_eq!(m.push("c".into()).unwrap(), 3);
        assert_eq!(m.peek_wait(Duration::ZERO), Some((1, "a".to_owned())));
        assert_eq!(m.take_first(Duration::ZERO, |l| l == "b"), Some((2, "b".to_owned())));
        assert_eq!(m.take_first(Duration::ZERO, |l| l == "zz"), None);
        assert!(m.remove(1));
        assert!(!m.remove(1));
        m.reserve(10).unwrap();
        drop(m);
        // Reopened (replayed and compacted) twice: numbers and order hold.
        for _ in 0..2 {
            let m = Mailbox::open(&p).unwrap();
            assert_eq!(m.entries(), vec![(3, "c".to_owned())]);
        }
        let m = Mailbox::open(&p).unwrap();
        assert_eq!(m.push("d".into()).unwrap(), 10);
        drop(m);
        let m = Mailbox::open(&p).unwrap();
        assert_eq!(m.entries(), vec![(3, "c".to_owned()), (10, "d".to_owned())]);
        assert_eq!(m.pop_wait(Duration::ZERO).as_deref(), Some("c"));
        // A torn last record (crash mid-append) is ignored.
        drop(m);
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"+{\"torn\"").unwrap();
        let m = Mailbox::open(&p).unwrap();
        assert_eq!(m.entries(), vec![(10, "d".to_owned())]);
    }

    #[test]
    fn a_message_put_back_stays_first_through_reopen() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("b.jsonl");
        let m = Mailbox::open(&p).unwrap();
        for l in ["1", "2", "3"] {
            m.push(l.into()).unwrap();
        }
        let first = m.pop_wait(Duration::ZERO).unwrap();
        m.push("4".into()).unwrap();
        m.push_front(first).unwrap();
        let order = |m: &Mailbox| m.entries().into_iter().map(|(_, l)| l).collect::<Vec<_>>();
        assert_eq!(order(&m), ["1", "2", "3", "4"]);
        drop(m);
        let m = Mailbox::open(&p).unwrap();
        assert_eq!(order(&m), ["1", "2", "3", "4"]);
        // Its new number is above every other, so it names it alone.
        assert_eq!(m.entries()[0].0, 5);
    }

    #[test]
    fn bytes_are_capped_and_the_journal_is_compacted_while_running() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.jsonl");
        let m = Mailbox::open(&p).unwrap();
        let big = "b".repeat(crate::message::MESSAGE_LIMIT + 1);
        assert!(matches!(m.push(big), Err(MailboxError::TooLarge(n)) if n == crate::message::MESSAGE_LIMIT + 1));
        let msg = "m".repeat(1 << 20);
        for _ in 0..16 {
            m.push(msg.clone()).unwrap();
        }
        assert!(matches!(m.push("x".into()), Err(MailboxError::FullBytes { queued, size: 1 }) if queued == 16 << 20));
        // Taken one by one (as a stdin writer does): the journal shrinks.
        for _ in 0..16 {
            let (n, _) = m.peek_wait(Duration::ZERO).unwrap();
            assert!(m.remove(n));
        }
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len < COMPACT_SLACK + (2 << 20), "journal {len} bytes");
        m.push("after".into()).unwrap();
        drop(m);
        let m = Mailbox::open(&p).unwrap();
        assert_eq!(m.entries().into_iter().map(|(_, l)| l).collect::<Vec<_>>(), ["after"]);
    }
}
