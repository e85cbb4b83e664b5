//! Storage wrappers for crash tests: [`HookStore`] calls a hook at a chosen
//! point of the effect sandwich (after the intent commit, before the
//! settlement commit, after commit N) so a child process can stop there and
//! be killed; [`RecordingStore`] keeps a copy of an in-memory session after
//! every commit, so a test can "crash" at every commit boundary in process.

use std::sync::Arc;

use cairn_core::events::EntryType;
use cairn_core::storage::{
    Committed, Entry, Header, MemStore, RawJson, State, Storage, StorageError, Transaction, TxOp, UsageRow,
};

/// Where a crash test stops the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// Right after the commit holding a tool's `toolRequested` intent.
    AfterIntent,
    /// Inside the effect, before it does anything (the tool's hook).
    DuringEffect,
    /// After the effect, right before the settlement commit.
    BeforeSettlement,
    /// Right after the N-th commit of this process (1-based).
    AfterCommit(u64),
    /// Right after the commit of a staged change set (`toolStaged`),
    /// before any of it is applied.
    AfterStaged,
}

impl CrashPoint {
    /// `after_intent`, `during_effect`, `before_settlement`, `after_staged`
    /// or `commit:N`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "after_intent" => Some(Self::AfterIntent),
            "during_effect" => Some(Self::DuringEffect),
            "before_settlement" => Some(Self::BeforeSettlement),
            "after_staged" => Some(Self::AfterStaged),
            other => other.strip_prefix("commit:")?.parse().ok().map(Self::AfterCommit),
        }
    }
}

fn has_entry(tx: &Transaction, wanted: &[EntryType]) -> bool {
    tx.ops.iter().any(
        |op| matches!(op, TxOp::Entry { entry_type, .. } if EntryType::of(entry_type).is_some_and(|t| wanted.contains(&t))),
    )
}

/// A store that calls `hook` at its crash point.
pub struct HookStore<S> {
    inner: S,
    point: Option<CrashPoint>,
    commits: u64,
    hook: Arc<dyn Fn(&str) + Send + Sync>,
}

impl<S> std::fmt::Debug for HookStore<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookStore").field("point", &self.point).field("commits", &self.commits).finish()
    }
}

impl<S: Storage> HookStore<S> {
    /// Wrap `inner`; `hook` is called with the point's name when reached.
    pub fn new(inner: S, point: Option<CrashPoint>, hook: Arc<dyn Fn(&str) + Send + Sync>) -> Self {
        Self { inner, point, commits: 0, hook }
    }
}

impl<S: Storage> Storage for HookStore<S> {
    fn header(&self) -> &Header {
        self.inner.header()
    }

    fn commit(&mut self, tx: Transaction) -> Result<Committed, StorageError> {
        if self.point == Some(CrashPoint::BeforeSettlement)
            && has_entry(&tx, &[EntryType::ToolCompleted, EntryType::ToolFailed])
        {
            (self.hook)("before_settlement");
        }
        let intent = has_entry(&tx, &[EntryType::ToolRequested])
            && tx.ops.iter().any(|op| matches!(op, TxOp::Set { namespace, .. } if namespace == "pending"));
        let staged = has_entry(&tx, &[EntryType::ToolStaged]);
        let committed = self.inner.commit(tx)?;
        self.commits += 1;
        if self.point == Some(CrashPoint::AfterStaged) && staged {
            (self.hook)("after_staged");
        }
        if self.point == Some(CrashPoint::AfterIntent) && intent {
            (self.hook)("after_intent");
        }
        if self.point == Some(CrashPoint::AfterCommit(self.commits)) {
            (self.hook)("after_commit");
        }
        Ok(committed)
    }

    fn last_seq(&self) -> u64 {
        self.inner.last_seq()
    }
    fn entry(&self, id: &str) -> Option<Entry> {
        self.inner.entry(id)
    }
    fn children(&self, parent: Option<&str>) -> Vec<Entry> {
        self.inner.children(parent)
    }
    fn path_to(&self, leaf: &str) -> Result<Vec<Entry>, StorageError> {
        self.inner.path_to(leaf)
    }
    fn entries(&self) -> Vec<Entry> {
        self.inner.entries()
    }
    fn entry_count(&self) -> usize {
        self.inner.entry_count()
    }
    fn register(&self, namespace: &str, key: &str) -> Option<RawJson> {
        self.inner.register(namespace, key)
    }
    fn registers(&self, namespace: &str) -> Vec<(String, RawJson)> {
        self.inner.registers(namespace)
    }
    fn usage(&self) -> Vec<UsageRow> {
        self.inner.usage()
    }
    fn state(&self) -> Option<State> {
        self.inner.state()
    }
    fn sync(&mut self) -> Result<(), StorageError> {
        self.inner.sync()
    }
    fn may_act(&self) -> Result<(), cairn_core::storage::NotHeld> {
        self.inner.may_act()
    }
}

/// An in-memory store that keeps a copy of itself after every commit.
#[derive(Debug)]
pub struct RecordingStore {
    inner: MemStore,
    /// The session after commit 1, 2, ….
    pub snapshots: Vec<MemStore>,
}

impl RecordingStore {
    /// Wrap `inner`.
    pub fn new(inner: MemStore) -> Self {
        Self { inner, snapshots: Vec::new() }
    }
}

impl Storage for RecordingStore {
    fn header(&self) -> &Header {
        self.inner.header()
    }
    fn commit(&mut self, tx: Transaction) -> Result<Committed, StorageError> {
        let committed = self.inner.commit(tx)?;
        self.snapshots.push(self.inner.clone());
        Ok(committed)
    }
    fn last_seq(&self) -> u64 {
        self.inner.last_seq()
    }
    fn entry(&self, id: &str) -> Option<Entry> {
        self.inner.entry(id)
    }
    fn children(&self, parent: Option<&str>) -> Vec<Entry> {
        self.inner.children(parent)
    }
    fn path_to(&self, leaf: &str) -> Result<Vec<Entry>, StorageError> {
        self.inner.path_to(leaf)
    }
    fn entries(&self) -> Vec<Entry> {
        self.inner.entries()
    }
    fn entry_count(&self) -> usize {
        self.inner.entry_count()
    }
    fn register(&self, namespace: &str, key: &str) -> Option<RawJson> {
        self.inner.register(namespace, key)
    }
    fn registers(&self, namespace: &str) -> Vec<(String, RawJson)> {
        self.inner.registers(namespace)
    }
    fn usage(&self) -> Vec<UsageRow> {
        self.inner.usage()
    }
    fn state(&self) -> Option<State> {
        self.inner.state()
    }
    fn sync(&mut self) -> Result<(), StorageError> {
        self.inner.sync()
    }
}
