//! Durable per-actor mailboxes: a bounded FIFO (1,000 messages) whose
//! content is journaled to `broker/mailbox/<id>.jsonl` so messages accepted
//! for an actor survive a host crash. Owns queueing only, not routing.
//!
//! Journal records: `+<line>` for a push, `-` for a pop (FIFO). Replayed and
//! compacted when the mailbox is opened. Delivery stays at most once: a
//! message is popped (journaled) before it is written to the actor's stdin.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Messages a mailbox holds before senders get `undeliverable`.
pub const MAILBOX_LIMIT: usize = 1000;

/// Why a push was refused.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// The mailbox holds [`MAILBOX_LIMIT`] messages.
    #[error("mailbox full ({MAILBOX_LIMIT} messages)")]
    Full,
    /// The journal could not be written.
    #[error("mailbox journal {0}: {1}")]
    Journal(PathBuf, std::io::Error),
}

#[derive(Debug)]
struct Inner {
    queue: VecDeque<String>,
    journal: File,
}

/// One actor's mailbox.
#[derive(Debug)]
pub struct Mailbox {
    path: PathBuf,
    inner: Mutex<Inner>,
    ready: Condvar,
}

impl Mailbox {
    /// Opens (replaying and compacting) the journal at `path`.
    pub fn open(path: &Path) -> Result<Mailbox, MailboxError> {
        let err = |e| MailboxError::Journal(path.to_owned(), e);
        let mut queue = VecDeque::new();
        if let Ok(f) = File::open(path) {
            for line in BufReader::new(f).lines() {
                let line = line.map_err(err)?;
                if let Some(msg) = line.strip_prefix('+') {
                    queue.push_back(msg.to_owned());
                } else if line == "-" {
                    queue.pop_front();
                }
                // A torn last line (crash mid-append) is ignored.
            }
        }
        let tmp = path.with_extension("jsonl.tmp");
        {
            let mut f = File::create(&tmp).map_err(err)?;
            for m in &queue {
                writeln!(f, "+{m}").map_err(err)?;
            }
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(err)?;
        let journal = OpenOptions::new().append(true).open(path).map_err(err)?;
        Ok(Mailbox { path: path.to_owned(), inner: Mutex::new(Inner { queue, journal }), ready: Condvar::new() })
    }

    /// Queues one stdin line (already serialized, without newline).
    pub fn push(&self, line: String) -> Result<(), MailboxError> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.queue.len() >= MAILBOX_LIMIT {
            return Err(MailboxError::Full);
        }
        writeln!(g.journal, "+{line}").map_err(|e| MailboxError::Journal(self.path.clone(), e))?;
        g.queue.push_back(line);
        self.ready.notify_all();
        Ok(())
    }

    /// Takes the oldest message, waiting up to `wait` for one.
    pub fn pop_wait(&self, wait: Duration) -> Option<String> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (mut g, _) =
            self.ready.wait_timeout_while(g, wait, |i| i.queue.is_empty()).unwrap_or_else(|p| p.into_inner());
        let m = g.queue.pop_front()?;
        let _ = writeln!(g.journal, "-");
        Some(m)
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).queue.len()
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
}
