//! A family in PostgreSQL: the children of a session that a worker drives
//! (`cairn worker`) are sessions of the same database, never files on one
//! worker's disk, so whichever worker later resumes the parent finds them.
//!
//! A child has no lease of its own. It is created and driven within the
//! lease of its family's top-level session, which the worker driving the
//! parent holds (`cairn_pg::Hold`): each of its commits checks that lease
//! (owner, fencing epoch, not expired) on the top-level row, in the same
//! transaction, and extends it; the worker's renewals and watchdog already
//! cover that lease, and the child's turn runs under the lease's cancel
//! token. The worker never claims a child by itself (`lease::claim` skips
//! ids with `+`, `lease::submit` refuses them): a child is driven only by
//! the holder of its parent's lease, on a thread of that worker beside the
//! parent's slot, and the worker waits for it before it leaves the parent's
//! turn (`subagents::finish_children`). When the lease is lost, a takeover
//! of the parent resumes the child where its rows say it stands.
//!
//! Owns: where a database family's sessions are created, read and opened.
//! Must not: decide anything about a child (that is `subagents.rs`).

use std::sync::Arc;

use anyhow::{Context as _, Result};
use cairn_core::CancelToken;
use cairn_core::storage::Header;
use cairn_pg::{Hold, PgStore};
use postgres::Client;

use super::Place;
use crate::context::Context;
use crate::family::SEP;

/// The database of a session a worker drives, within its lease.
pub struct Database {
    url: String,
    hold: Hold,
    cancel: CancelToken,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").field("hold", &self.hold).finish_non_exhaustive()
    }
}

impl Database {
    /// The family of the session whose lease is `hold`, in the database at
    /// `url`, its turns stopped by `cancel` (the lease's token).
    pub fn new(url: impl Into<String>, hold: Hold, cancel: CancelToken) -> Arc<Self> {
        Arc::new(Self { url: url.into(), hold, cancel })
    }

    fn connect(&self) -> Result<Client> {
        cairn_pg::connect_for(&self.url, self.hold.fence().lease)
            .map_err(|e| anyhow::anyhow!("cannot reach the database for a child session: {e}"))
    }

    fn row_exists(client: &mut Client, id: &str) -> Result<bool> {
        let row = client
            .query_opt("SELECT 1 FROM cairn_sessions WHERE id = $1", &[&id])
            .map_err(|e| anyhow::anyhow!("database error: {}", cairn_pg::describe(&e)))?;
        Ok(row.is_some())
    }
}

impl Place for Database {
    type Store = PgStore;

    fn create(&self, _: &Context, header: Header) -> Result<PgStore> {
        let id = header.id.clone();
        PgStore::create_within(self.connect()?, header, &self.hold)
            .with_context(|| format!("cannot create child session {id}"))
    }

    fn open(&self, _: &Context, id: &str) -> Result<Option<PgStore>> {
        let mut client = self.connect()?;
        if !Self::row_exists(&mut client, id)? {
            return Ok(None);
        }
        Ok(Some(PgStore::open_within(client, id, &self.hold)?))
    }

    fn read(&self, _: &Context, id: &str) -> Result<Option<PgStore>> {
        let mut client = self.connect()?;
        if !Self::row_exists(&mut client, id)? {
            return Ok(None);
        }
        // Unfenced: it is only read.
        Ok(Some(PgStore::open(client, id)?))
    }

    fn exists(&self, _: &Context, id: &str) -> Result<bool> {
        Self::row_exists(&mut self.connect()?, id)
    }

    fn children(&self, _: &Context, parent: &str) -> Result<Vec<String>> {
        let prefix = format!("{parent}{SEP}");
        let rows = self
            .connect()?
            .query("SELECT id FROM cairn_sessions WHERE left(id, length($1::text)) = $1::text", &[&prefix])
            .map_err(|e| anyhow::anyhow!("database error: {}", cairn_pg::describe(&e)))?;
        Ok(rows
            .iter()
            .map(|r| r.get::<_, String>(0))
            .filter(|id| id.strip_prefix(&prefix).is_some_and(|rest| !rest.contains(SEP)))
            .collect())
    }

    fn ended(&self, store: &mut PgStore) -> Result<()> {
        store.idle_within().context("cannot mark the child session idle")
    }

    fn found_finished(&self, _: &Context, id: &str) -> Result<()> {
        let mut client = self.connect()?;
        let running = client
            .query_opt("SELECT 1 FROM cairn_sessions WHERE id = $1 AND status = 'running'", &[&id])
            .map_err(|e| anyhow::anyhow!("database error: {}", cairn_pg::describe(&e)))?
            .is_some();
        if running {
            cairn_pg::store::idle_within(&mut client, id, &self.hold).context("cannot mark the child session idle")?;
        }
        Ok(())
    }

    fn cancel(&self) -> CancelToken {
        self.cancel.clone()
    }

    fn follow(&self, _: &Context, id: &str) -> Option<Box<dyn crate::peers::Follow>> {
        Some(Box::new(Follow {
            url: self.url.clone(),
            lease: self.hold.fence().lease,
            id: id.to_owned(),
            client: None,
            seen: 0,
        }))
    }

    fn poll_every(&self) -> std::time::Duration {
        // Each look opens a connection per log it reads: a few looks a
        // second, not twenty.
        std::time::Duration::from_millis(250)
    }

    fn written_by_a_family(&self, _: &Context, id: &str) -> Result<bool> {
        // A child's lines record the lease of its family they were written
        // under; an imported session's lines record no owner.
        let row = self
            .connect()?
            .query_one("SELECT NOT EXISTS (SELECT 1 FROM cairn_lines WHERE session_id = $1 AND owner IS NULL)", &[&id])
            .map_err(|e| anyhow::anyhow!("database error: {}", cairn_pg::describe(&e)))?;
        Ok(row.get(0))
    }

    fn generation(&self) -> String {
        let fence = self.hold.fence();
        format!("{} epoch {} by {}", self.hold.session(), fence.epoch, fence.owner)
    }
}

/// A family member's log followed in the database: each look reads only
/// the lines committed past the last one read (`cairn_pg::store::
/// entries_after`), over one connection kept between looks.
struct Follow {
    url: String,
    lease: std::time::Duration,
    id: String,
    client: Option<Client>,
    /// The last seq handed out.
    seen: u64,
}

impl crate::peers::Follow for Follow {
    fn poll(&mut self, f: &mut dyn FnMut(&cairn_core::storage::Entry)) {
        if self.client.is_none() {
            self.client = cairn_pg::connect_for(&self.url, self.lease).ok();
        }
        let Some(client) = self.client.as_mut() else { return };
        match cairn_pg::store::entries_after(client, &self.id, self.seen, f) {
            Ok(last) => self.seen = last,
            // Read again at the next look, over a new connection (the
            // entries handed out before the failure are not repeated:
            // `seen` moves only with a whole read).
            Err(_) => self.client = None,
        }
    }
}
