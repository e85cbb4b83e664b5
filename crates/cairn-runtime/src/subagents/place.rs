//! Where a family's sessions live: [`Place`], the one thing the family's
//! code is generic over (create, find, read and open children), with its
//! file implementation [`Files`] (the database's is `db.rs`); which of
//! them a family uses, as a value handed down ([`FamilyPlace`]); and the
//! family's logs as the peer tools read them through the same place.
//!
//! Must not: decide what a child may do or drive one (`tools.rs`,
//! `drive.rs`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use cairn_core::CancelToken;
use cairn_core::storage::{Header, JsonlStore, Record, Storage, Tail};

#[cfg(feature = "postgres")]
use super::db;
use crate::family::{SEP, child_fact};
use crate::setup::Setup;

/// Where a family's sessions live: where its top-level session does.
#[derive(Debug, Clone, Default)]
pub enum FamilyPlace {
    /// Session files in the sessions directory (every face but workers).
    #[default]
    Files,
    /// The database of a session a PostgreSQL worker drives, within that
    /// session's lease (`db.rs`).
    #[cfg(feature = "postgres")]
    Database(Arc<db::Database>),
}

/// Where children are created, found, read and opened to be driven (the
/// one thing the family's code is generic over): [`Files`], or a database
/// (`db::Database`). Ids follow `family::child_id` everywhere.
pub trait Place: Send + Sync + 'static {
    /// A child's store.
    type Store: Storage + Send + 'static;

    /// Create child `header.id`, refused when it exists: the only place a
    /// child is created, so never twice.
    fn create(&self, ctx: &Setup, header: Header) -> Result<Self::Store>;

    /// Child `id` opened to drive it (`None`: it does not exist).
    fn open(&self, ctx: &Setup, id: &str) -> Result<Option<Self::Store>>;

    /// Child `id` read, never written (`None`: it does not exist).
    fn read(&self, ctx: &Setup, id: &str) -> Result<Option<Self::Store>>;

    /// Whether child `id` exists (without reading it).
    fn exists(&self, ctx: &Setup, id: &str) -> Result<bool>;

    /// The ids of `parent`'s children, in any order.
    fn children(&self, ctx: &Setup, parent: &str) -> Result<Vec<String>>;

    /// The token a child's turn runs under (the lease's, in a database).
    fn cancel(&self) -> CancelToken;

    /// A child's turn ended with its answer (a database marks its row
    /// idle; files need nothing: the log says it).
    fn ended(&self, _store: &mut Self::Store) -> Result<()> {
        Ok(())
    }

    /// Child `id` was found finished when attached: what `ended` says, for
    /// a child whose driver was cut off between its answer and `ended`.
    fn found_finished(&self, _ctx: &Setup, _id: &str) -> Result<()> {
        Ok(())
    }

    /// How often a waiting peer looks at the family's logs again.
    fn poll_every(&self) -> Duration {
        Duration::from_millis(50)
    }

    /// A reader of session `id`'s log that reads only what was appended
    /// since its last look, if this place has one (`None`: each look
    /// reads the whole log again and skips what it visited before).
    fn follow(&self, ctx: &Setup, id: &str) -> Option<Box<dyn crate::peers::Follow>> {
        let _ = (ctx, id);
        None
    }

    /// Whether every line of session `id` was written by a family's driver
    /// (a database line records the lease it was written under; an
    /// imported one records none). Files cannot tell: true.
    fn written_by_a_family(&self, _ctx: &Setup, _id: &str) -> Result<bool> {
        Ok(true)
    }

    /// Which drive of the family this process is in: the children this
    /// process knows are keyed by it, so a child stopped when an earlier
    /// drive ended (a lost lease) is re-attached, never taken for a result.
    fn generation(&self) -> String;
}

/// Children as session files in the sessions directory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Files;

impl Files {
    fn path(ctx: &Setup, id: &str) -> PathBuf {
        ctx.paths.sessions().join(format!("{id}.jsonl"))
    }
}

impl Place for Files {
    type Store = JsonlStore;

    fn create(&self, ctx: &Setup, header: Header) -> Result<JsonlStore> {
        let id = header.id.clone();
        JsonlStore::create(&ctx.paths.sessions(), header, ctx.settings.store_options())
            .with_context(|| format!("cannot create child session {id}"))
    }

    fn open(&self, ctx: &Setup, id: &str) -> Result<Option<JsonlStore>> {
        let path = Self::path(ctx, id);
        if !path.exists() {
            return Ok(None);
        }
        crate::parts::open_session(ctx, &path).map(Some)
    }

    fn read(&self, ctx: &Setup, id: &str) -> Result<Option<JsonlStore>> {
        let path = Self::path(ctx, id);
        if !path.exists() {
            return Ok(None);
        }
        Ok(Some(JsonlStore::open_read_only_with(&path, ctx.settings.store_options())?))
    }

    fn exists(&self, ctx: &Setup, id: &str) -> Result<bool> {
        Ok(Self::path(ctx, id).is_file())
    }

    fn follow(&self, ctx: &Setup, id: &str) -> Option<Box<dyn crate::peers::Follow>> {
        Some(Box::new(FileFollow { path: Self::path(ctx, id), tail: None }))
    }

    fn children(&self, ctx: &Setup, parent: &str) -> Result<Vec<String>> {
        let prefix = format!("{parent}{SEP}");
        Ok(crate::sessions::session_files(&ctx.paths)?
            .iter()
            .filter_map(|p| p.file_stem().and_then(|s| s.to_str()).map(str::to_owned))
            .filter(|stem| stem.strip_prefix(&prefix).is_some_and(|rest| !rest.contains(SEP)))
            .collect())
    }

    fn cancel(&self) -> CancelToken {
        // A child of this process stops with it (and is resumed with its
        // parent).
        CancelToken::new()
    }

    fn generation(&self) -> String {
        // One process drives its files' families; it never loses them.
        String::new()
    }
}

/// The family's logs as the peer tools read them, wherever its sessions
/// live: through the same [`Place`] the family creates and drives them in.
pub(super) struct FamilyLogs<P> {
    pub(super) place: Arc<P>,
    pub(super) ctx: &'static Setup,
}

impl<P: Place> crate::peers::Logs for FamilyLogs<P> {
    fn exists(&self, id: &str) -> bool {
        self.place.exists(self.ctx, id).unwrap_or(false)
    }

    fn children(&self, id: &str) -> Vec<String> {
        let mut ids = self.place.children(self.ctx, id).unwrap_or_default();
        ids.sort();
        ids
    }

    fn peers_allowed(&self, id: &str) -> bool {
        self.place.read(self.ctx, id).ok().flatten().and_then(|s| child_fact(&s)).is_some_and(|f| f.peers)
    }

    fn visit(&self, id: &str, f: &mut dyn FnMut(&cairn_core::storage::Entry)) {
        if let Ok(Some(store)) = self.place.read(self.ctx, id) {
            store.visit_entries(f);
        }
    }

    fn follow(&self, id: &str) -> Box<dyn crate::peers::Follow> {
        self.place.follow(self.ctx, id).unwrap_or_else(|| {
            Box::new(Rescan { place: Arc::clone(&self.place), ctx: self.ctx, id: id.to_owned(), visited: 0 })
        })
    }

    fn poll_every(&self) -> Duration {
        self.place.poll_every()
    }
}

/// A session file followed with core's [`Tail`] (complete lines only;
/// a compaction or a cut torn tail re-read without repeating an entry),
/// opened once the file exists.
struct FileFollow {
    path: PathBuf,
    tail: Option<Tail>,
}

impl crate::peers::Follow for FileFollow {
    fn poll(&mut self, f: &mut dyn FnMut(&cairn_core::storage::Entry)) {
        if self.tail.is_none() {
            self.tail = Tail::open(&self.path).ok();
        }
        // A log that cannot be read now is read at a later look.
        let records = self.tail.as_mut().map(Tail::poll).and_then(Result::ok).unwrap_or_default();
        for record in records {
            if let Record::Entry(entry) = record {
                f(&entry);
            }
        }
    }
}

/// A log followed by reading it whole at each look and visiting only the
/// entries past those visited before (entries are only ever appended), for
/// a place without a reader of its own.
struct Rescan<P> {
    place: Arc<P>,
    ctx: &'static Setup,
    id: String,
    visited: usize,
}

impl<P: Place> crate::peers::Follow for Rescan<P> {
    fn poll(&mut self, f: &mut dyn FnMut(&cairn_core::storage::Entry)) {
        let Ok(Some(store)) = self.place.read(self.ctx, &self.id) else { return };
        let mut n = 0;
        store.visit_entries(&mut |e| {
            if n >= self.visited {
                f(e);
            }
            n += 1;
        });
        self.visited = self.visited.max(n);
    }
}
