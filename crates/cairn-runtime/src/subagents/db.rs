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
//! The reads a family makes for every turn (its children, whether a row
//! exists) go over the driving thread's one connection
//! (`cairn_pg::conn::with_thread`), not a new one each, and through
//! cairn-pg's indexed statements (`cairn_pg::catalog`): a worker's claims
//! cost the same with a million finished sessions in the table.
//!
//! Owns: where a database family's sessions are created, read and opened.
//! Must not: decide anything about a child (that is the rest of `subagents/`), or
//! write SQL (every statement is cairn-pg's).

use std::sync::Arc;

use anyhow::{Context as _, Result};
use cairn_core::CancelToken;
use cairn_core::storage::Header;
use cairn_pg::{Hold, PgStore};
use postgres::Client;

use super::Place;
use crate::setup::Setup;

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

    /// `f` over this thread's connection (see the module notes).
    fn with_conn<T>(&self, f: impl FnOnce(&mut cairn_pg::Connection) -> Result<T, cairn_pg::PgError>) -> Result<T> {
        cairn_pg::conn::with_thread(&self.url, self.hold.fence().lease, f)
            .map_err(|e| anyhow::anyhow!("cannot read the family's sessions in the database: {e}"))
    }

    fn row_exists(&self, id: &str) -> Result<bool> {
        self.with_conn(|c| cairn_pg::catalog::exists(c, id))
    }
}

impl Place for Database {
    type Store = PgStore;

    fn create(&self, _: &Setup, header: Header) -> Result<PgStore> {
        let id = header.id.clone();
        PgStore::create_within(self.connect()?, header, &self.hold)
            .with_context(|| format!("cannot create child session {id}"))
    }

    fn open(&self, _: &Setup, id: &str) -> Result<Option<PgStore>> {
        if !self.row_exists(id)? {
            return Ok(None);
        }
        Ok(Some(PgStore::open_within(self.connect()?, id, &self.hold)?))
    }

    fn read(&self, _: &Setup, id: &str) -> Result<Option<PgStore>> {
        if !self.row_exists(id)? {
            return Ok(None);
        }
        // Unfenced: it is only read.
        Ok(Some(PgStore::open(self.connect()?, id)?))
    }

    fn exists(&self, _: &Setup, id: &str) -> Result<bool> {
        self.row_exists(id)
    }

    fn children(&self, _: &Setup, parent: &str) -> Result<Vec<String>> {
        self.with_conn(|c| cairn_pg::catalog::children(c, parent))
    }

    fn ended(&self, store: &mut PgStore) -> Result<()> {
        store.idle_within().context("cannot mark the child session idle")
    }

    fn found_finished(&self, _: &Setup, id: &str) -> Result<()> {
        if self.with_conn(|c| cairn_pg::catalog::is_running(c, id))? {
            let mut client = self.connect()?;
            cairn_pg::store::idle_within(&mut client, id, &self.hold).context("cannot mark the child session idle")?;
        }
        Ok(())
    }

    fn cancel(&self) -> CancelToken {
        self.cancel.clone()
    }

    fn follow(&self, _: &Setup, id: &str) -> Option<Box<dyn crate::peers::Follow>> {
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

    fn written_by_a_family(&self, _: &Setup, id: &str) -> Result<bool> {
        // A child's lines record the lease of its family they were written
        // under; an imported session's lines record no owner.
        self.with_conn(|c| cairn_pg::catalog::written_by_a_family(c, id))
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
