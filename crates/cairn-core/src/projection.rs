//! The `ToolState` projection (Correx's reducer): what happened to every tool
//! invocation, rebuilt from the log's entries alone.
//!
//! [`ToolState::apply`] folds one entry; unrelated entries pass through
//! unchanged. It never reads registers or the state: the answer comes from
//! the immutable log. Illegal lifecycle orders (a start without an intent,
//! a second settlement) are recorded as anomalies, and
//! [`ToolState::replay_strict`] turns the first one into an error, which is
//! how the turn re-checks the log at open.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::events::{
    BypassRecord, EntryType, ToolBypassPayload, ToolCompletedPayload, ToolFailedPayload, ToolRejectedPayload,
    ToolRequestedPayload, ToolStartedPayload, VerdictRecord,
};
use crate::storage::{Entry, Record};
use crate::tool::{Risk, ToolReceipt, ToolRequest};

/// Where an invocation is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ToolInvocationStatus {
    /// Intent committed, nothing more.
    Requested,
    /// Approved and running (or interrupted while running).
    Started,
    /// Settled with a receipt.
    Completed,
    /// Settled as failed.
    Failed,
    /// Refused before running.
    Rejected,
}

impl ToolInvocationStatus {
    /// Whether this is a settlement.
    pub fn is_settled(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Rejected)
    }
}

/// The full lifecycle of one invocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolInvocationRecord {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// Tool name.
    pub tool: String,
    /// Risk tier, when known.
    pub tier: Option<Risk>,
    /// The request.
    pub request: ToolRequest,
    /// Current status.
    pub status: ToolInvocationStatus,
    /// The approval verdict, when one was recorded.
    pub verdict: Option<VerdictRecord>,
    /// The receipt, once completed.
    pub receipt: Option<ToolReceipt>,
    /// The failure or rejection reason.
    pub reason: Option<String>,
    /// Settled as failed without knowing whether the effect happened.
    pub uncertain: bool,
    /// When the intent was committed.
    pub requested_at: i64,
    /// When it was settled.
    pub completed_at: Option<i64>,
    /// How many settlement entries the log holds for it (1 when healthy).
    pub settlements: u32,
    /// Sandbox bypasses asked while it ran, with their verdicts (from the
    /// `toolBypass` entries, or from the settlement in logs without them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bypasses: Vec<BypassRecord>,
}

/// The projection: every invocation, in the order of their intents.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolState {
    /// Invocations in request order.
    pub invocations: Vec<ToolInvocationRecord>,
    /// Illegal lifecycle orders seen (empty for a healthy log).
    pub anomalies: Vec<String>,
    #[serde(skip)]
    index: HashMap<String, usize>,
}

/// A log whose tool lifecycle is out of order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool lifecycle in the log is inconsistent: {0}; the file was written by something other than cairn's turn")]
pub struct LifecycleError(pub String);

impl ToolState {
    /// The projection of `entries`.
    pub fn replay<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Self {
        let mut state = Self::default();
        for entry in entries {
            state.apply(entry);
        }
        state
    }

    /// The projection, failing on the first anomaly.
    pub fn replay_strict<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Result<Self, LifecycleError> {
        Self::replay(entries).into_strict()
    }

    /// This projection, or its first anomaly as an error.
    pub fn into_strict(self) -> Result<Self, LifecycleError> {
        match self.anomalies.first() {
            Some(first) => Err(LifecycleError(first.clone())),
            None => Ok(self),
        }
    }

    /// One invocation by id.
    pub fn get(&self, invocation_id: &str) -> Option<&ToolInvocationRecord> {
        self.index.get(invocation_id).map(|&i| &self.invocations[i])
    }

    /// Invocations not settled yet.
    pub fn unsettled(&self) -> impl Iterator<Item = &ToolInvocationRecord> {
        self.invocations.iter().filter(|r| !r.status.is_settled())
    }

    /// Fold one record of the log as it is read or tailed: entries are
    /// folded, registers, usage rows and the state pass through.
    pub fn apply_record(&mut self, record: &Record) {
        if let Record::Entry(entry) = record {
            self.apply(entry);
        }
    }

    /// Fold one entry (unrelated entries and undecodable payloads of
    /// unrelated types pass through).
    pub fn apply(&mut self, entry: &Entry) {
        let at = entry.timestamp;
        let Some(entry_type) = EntryType::of(&entry.entry_type) else { return };
        match entry_type {
            EntryType::ToolRequested => match entry.payload.parse::<ToolRequestedPayload>() {
                Ok(p) => {
                    if self.index.contains_key(&p.invocation_id) {
                        self.anomalies.push(format!("invocation {} requested twice", p.invocation_id));
                        return;
                    }
                    self.index.insert(p.invocation_id.clone(), self.invocations.len());
                    self.invocations.push(ToolInvocationRecord {
                        invocation_id: p.invocation_id,
                        tool: p.request.tool.clone(),
                        tier: p.tier,
                        request: p.request,
                        status: ToolInvocationStatus::Requested,
                        verdict: None,
                        receipt: None,
                        reason: None,
                        uncertain: false,
                        requested_at: at,
                        completed_at: None,
                        settlements: 0,
                        bypasses: Vec::new(),
                    });
                }
                Err(e) => self.anomalies.push(format!("entry {}: bad toolRequested payload: {e}", entry.id)),
            },
            EntryType::ToolStarted => match entry.payload.parse::<ToolStartedPayload>() {
                Ok(p) => self.update(&entry.id, &p.invocation_id, |r, anomalies| {
                    if r.status != ToolInvocationStatus::Requested {
                        anomalies.push(format!("invocation {} started while {:?}", r.invocation_id, r.status));
                        return;
                    }
                    r.status = ToolInvocationStatus::Started;
                    r.verdict = Some(p.verdict);
                }),
                Err(e) => self.anomalies.push(format!("entry {}: bad toolStarted payload: {e}", entry.id)),
            },
            EntryType::ToolBypass => match entry.payload.parse::<ToolBypassPayload>() {
                Ok(p) => self.update(&entry.id, &p.invocation_id, |r, anomalies| {
                    if r.status != ToolInvocationStatus::Started {
                        anomalies.push(format!("invocation {} asked a bypass while {:?}", r.invocation_id, r.status));
                        return;
                    }
                    r.bypasses.push(p.bypass);
                }),
                Err(e) => self.anomalies.push(format!("entry {}: bad toolBypass payload: {e}", entry.id)),
            },
            EntryType::ToolStaged => match entry.payload.parse::<crate::events::ToolStagedPayload>() {
                Ok(p) => self.update(&entry.id, &p.invocation_id, |r, anomalies| {
                    if r.status != ToolInvocationStatus::Started {
                        anomalies.push(format!("invocation {} staged while {:?}", r.invocation_id, r.status));
                    }
                }),
                Err(e) => self.anomalies.push(format!("entry {}: bad toolStaged payload: {e}", entry.id)),
            },
            EntryType::ToolCompleted => match entry.payload.parse::<ToolCompletedPayload>() {
                Ok(p) => self.settle(&entry.id, &p.invocation_id, at, true, |r| {
                    r.status = ToolInvocationStatus::Completed;
                    r.receipt = Some(p.receipt);
                    keep_bypasses(r, p.bypasses);
                }),
                Err(e) => self.anomalies.push(format!("entry {}: bad toolCompleted payload: {e}", entry.id)),
            },
            EntryType::ToolFailed => match entry.payload.parse::<ToolFailedPayload>() {
                Ok(p) => self.settle(&entry.id, &p.invocation_id, at, true, |r| {
                    r.status = ToolInvocationStatus::Failed;
                    r.reason = Some(p.reason);
                    r.uncertain = p.uncertain;
                    keep_bypasses(r, p.bypasses);
                }),
                Err(e) => self.anomalies.push(format!("entry {}: bad toolFailed payload: {e}", entry.id)),
            },
            EntryType::ToolRejected => match entry.payload.parse::<ToolRejectedPayload>() {
                Ok(p) => self.settle(&entry.id, &p.invocation_id, at, false, |r| {
                    r.status = ToolInvocationStatus::Rejected;
                    r.reason = Some(p.reason);
                    if p.verdict.is_some() {
                        r.verdict = p.verdict;
                    }
                }),
                Err(e) => self.anomalies.push(format!("entry {}: bad toolRejected payload: {e}", entry.id)),
            },
            EntryType::Message | EntryType::TurnCancelled | EntryType::TurnEnded | EntryType::Compaction => {}
        }
    }

    fn update(
        &mut self,
        entry_id: &str,
        invocation_id: &str,
        f: impl FnOnce(&mut ToolInvocationRecord, &mut Vec<String>),
    ) {
        match self.index.get(invocation_id) {
            Some(&i) => f(&mut self.invocations[i], &mut self.anomalies),
            None => self.anomalies.push(format!("entry {entry_id}: invocation {invocation_id} was never requested")),
        }
    }

    fn settle(
        &mut self,
        entry_id: &str,
        invocation_id: &str,
        at: i64,
        needs_start: bool,
        f: impl FnOnce(&mut ToolInvocationRecord),
    ) {
        self.update(entry_id, invocation_id, |r, anomalies| {
            r.settlements += 1;
            if r.status.is_settled() {
                anomalies.push(format!("invocation {} settled twice", r.invocation_id));
                return;
            }
            if needs_start && r.status != ToolInvocationStatus::Started {
                anomalies.push(format!("invocation {} settled without being started", r.invocation_id));
            }
            r.completed_at = Some(at);
            f(r);
        });
    }
}

/// The settlement repeats the bypasses its `toolBypass` entries already
/// recorded; a log written before those entries existed has them only here.
fn keep_bypasses(r: &mut ToolInvocationRecord, settled: Vec<BypassRecord>) {
    if r.bypasses.is_empty() {
        r.bypasses = settled;
    }
}
