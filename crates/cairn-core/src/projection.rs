//! The `ToolState` projection (Correx's reducer): what happened to every tool
//! invocation, rebuilt from the log's entries alone.
//!
//! [`ToolState::apply`] folds one entry; unrelated entries pass through
//! unchanged. It never reads registers or the state: the answer comes from
//! the immutable log. Illegal lifecycle orders (a start without an intent,
//! a second settlement) are recorded as anomalies, and
//! [`ToolState::replay_strict`] turns the first one into an error, which is
//! how the turn re-checks the log at open.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::events::{
    BypassRecord, EntryType, ToolBypassPayload, ToolCompletedPayload, ToolFailedPayload, ToolRejectedPayload,
    ToolRequestedPayload, ToolStartedPayload, VerdictRecord,
};
use crate::payload_shape as shape;
use crate::storage::{Entry, EntryRead, EntryView, Record};
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
    /// (Owned entries or borrowed: a store's index materialises them.)
    pub fn replay<E: std::borrow::Borrow<Entry>>(entries: impl IntoIterator<Item = E>) -> Self {
        let mut state = Self::default();
        for entry in entries {
            state.apply(entry.borrow());
        }
        state
    }

    /// The projection, failing on the first anomaly.
    pub fn replay_strict<E: std::borrow::Borrow<Entry>>(
        entries: impl IntoIterator<Item = E>,
    ) -> Result<Self, LifecycleError> {
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
            EntryType::Message
            | EntryType::TurnCancelled
            | EntryType::TurnEnded
            | EntryType::Compaction
            | EntryType::Undo
            | EntryType::UndoApplied => {}
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

/// The lifecycle check of [`ToolState`] without the projection: the same
/// rules and the same anomaly texts, in memory bounded by what is still
/// open. An unsettled invocation keeps its id and status; when it settles,
/// that state is dropped and only its id and final status stay, packed
/// (`idset.rs`: the id's bytes plus 16 bytes, no allocation of its own) —
/// the rules need them to the end of the log, since a second request, a
/// start or a second settlement of a settled invocation is refused however
/// far from its intent it comes. Nothing of a request or receipt is kept
/// (a session's open and `cairn check` run it over every entry; the full
/// projection would hold every request and receipt a second time). Each
/// payload is still checked in full, so a malformed one is refused as
/// [`ToolState`] refuses it; the hot ones (`toolRequested`, `toolStarted`,
/// `toolCompleted`) through shapes that check every field as its type
/// would and keep only the invocation id (`payload_shape.rs`), the rest
/// into their own types.
#[derive(Debug, Default)]
pub struct LifecycleCheck {
    /// Invocations requested and not settled (at most a few at any time).
    open: HashMap<String, ToolInvocationStatus>,
    /// Settled invocations: id and final status ([`settled_tag`]).
    settled: crate::idset::IdSet,
    first: Option<String>,
}

/// A settled status as [`LifecycleCheck`] packs it.
fn settled_tag(status: ToolInvocationStatus) -> u8 {
    match status {
        ToolInvocationStatus::Completed => 0,
        ToolInvocationStatus::Failed => 1,
        _ => 2,
    }
}

fn settled_status(tag: u8) -> ToolInvocationStatus {
    match tag {
        0 => ToolInvocationStatus::Completed,
        1 => ToolInvocationStatus::Failed,
        _ => ToolInvocationStatus::Rejected,
    }
}

/// What [`LifecycleCheck::read`] found in one entry's payload, for
/// [`LifecycleCheck::apply_read`] (owned, so it can cross threads).
#[derive(Debug)]
pub struct LifecycleRead(ToolRead<'static>);

impl LifecycleRead {
    /// The same read with its borrowed invocation id made owned.
    fn owned(read: ToolRead<'_>) -> ToolRead<'static> {
        match read {
            ToolRead::Ignored => ToolRead::Ignored,
            ToolRead::Bad(e) => ToolRead::Bad(e),
            ToolRead::Tool { kind, invocation_id } => {
                ToolRead::Tool { kind, invocation_id: Cow::Owned(invocation_id.into_owned()) }
            }
        }
    }
}

/// An entry's payload as the lifecycle check reads it.
#[derive(Debug)]
enum ToolRead<'a> {
    /// Not a tool event: never changes the verdict.
    Ignored,
    /// A tool event about an invocation.
    Tool { kind: EntryType, invocation_id: Cow<'a, str> },
    /// A tool event whose payload is refused (the anomaly's text).
    Bad(String),
}

impl LifecycleCheck {
    /// Fold one entry; after the first anomaly nothing more is looked at.
    pub fn apply(&mut self, entry: EntryView<'_>) {
        if self.first.is_some() {
            return;
        }
        if let Err(anomaly) = self.step(entry) {
            self.first = Some(anomaly);
        }
    }

    /// [`apply`](Self::apply), answering with the first anomaly (this
    /// entry's or an earlier one's).
    pub fn check(&mut self, entry: EntryView<'_>) -> Result<(), LifecycleError> {
        self.apply(entry);
        match &self.first {
            Some(first) => Err(LifecycleError(first.clone())),
            None => Ok(()),
        }
    }

    /// The first anomaly as an error, or `Ok` for a healthy log.
    pub fn finish(self) -> Result<(), LifecycleError> {
        match self.first {
            Some(first) => Err(LifecycleError(first)),
            None => Ok(()),
        }
    }

    /// Whether entries of `entry_type` are looked at (the tool events);
    /// an entry of any other type never changes the check's verdict.
    pub fn looks_at(entry_type: &str) -> bool {
        EntryType::of(entry_type).is_some_and(Self::looks_at_type)
    }

    fn looks_at_type(entry_type: EntryType) -> bool {
        match entry_type {
            EntryType::ToolRequested
            | EntryType::ToolStarted
            | EntryType::ToolBypass
            | EntryType::ToolStaged
            | EntryType::ToolCompleted
            | EntryType::ToolFailed
            | EntryType::ToolRejected => true,
            EntryType::Message
            | EntryType::TurnCancelled
            | EntryType::TurnEnded
            | EntryType::Compaction
            | EntryType::Undo
            | EntryType::UndoApplied => false,
        }
    }

    /// Invocations requested and not settled so far.
    pub fn unsettled(&self) -> usize {
        self.open.len()
    }

    /// Invocations settled so far.
    pub fn settled(&self) -> usize {
        self.settled.len()
    }

    /// The status of `invocation_id`, if it was requested.
    fn status(&self, invocation_id: &str) -> Option<ToolInvocationStatus> {
        self.open.get(invocation_id).copied().or_else(|| self.settled.get(invocation_id).map(settled_status))
    }

    fn step(&mut self, entry: EntryView<'_>) -> Result<(), String> {
        match Self::read_inner(entry) {
            ToolRead::Ignored => Ok(()),
            ToolRead::Bad(e) => Err(e),
            ToolRead::Tool { kind, invocation_id } => self.transition(entry.id, kind, &invocation_id),
        }
    }

    /// What the check reads of `entry`'s payload, on its own: the entry
    /// type it dispatches on and the invocation id, or the payload's
    /// refusal. Pure (no state of the check), so it may run on another
    /// thread and ahead of the fold ([`LifecycleCheck::apply_read`]), which
    /// takes the reads in file order: `cairn check` reads payloads on its
    /// decoding threads.
    pub fn read(entry: EntryView<'_>) -> LifecycleRead {
        LifecycleRead(LifecycleRead::owned(Self::read_inner(entry)))
    }

    /// [`apply`](Self::apply) of an entry whose payload was read ahead with
    /// [`LifecycleCheck::read`]: the same verdict.
    pub fn apply_read(&mut self, entry_id: &str, read: LifecycleRead) {
        if self.first.is_some() {
            return;
        }
        let verdict = match read.0 {
            ToolRead::Ignored => Ok(()),
            ToolRead::Bad(e) => Err(e),
            ToolRead::Tool { kind, invocation_id } => self.transition(entry_id, kind, &invocation_id),
        };
        if let Err(anomaly) = verdict {
            self.first = Some(anomaly);
        }
    }

    /// [`check`](Self::check) of an entry read ahead ([`LifecycleCheck::read`]).
    pub fn check_read(&mut self, entry_id: &str, read: LifecycleRead) -> Result<(), LifecycleError> {
        self.apply_read(entry_id, read);
        match &self.first {
            Some(first) => Err(LifecycleError(first.clone())),
            None => Ok(()),
        }
    }

    fn read_inner<'a>(entry: EntryView<'a>) -> ToolRead<'a> {
        let Some(kind) = EntryType::of(entry.entry_type).filter(|&t| Self::looks_at_type(t)) else {
            return ToolRead::Ignored;
        };
        let bad = |what: &str, e: &dyn std::fmt::Display| format!("entry {}: bad {what} payload: {e}", entry.id);
        let id = match kind {
            EntryType::ToolRequested => shaped_id(
                entry,
                "toolRequested",
                |p: shape::Requested<'a>| p.invocation_id,
                |p: ToolRequestedPayload| p.invocation_id,
            ),
            EntryType::ToolStarted => shaped_id(
                entry,
                "toolStarted",
                |p: shape::Started<'a>| p.invocation_id,
                |p: ToolStartedPayload| p.invocation_id,
            ),
            EntryType::ToolBypass => entry
                .parse::<ToolBypassPayload>()
                .map(|p| Cow::Owned(p.invocation_id))
                .map_err(|e| bad("toolBypass", &e)),
            EntryType::ToolStaged => entry
                .parse::<crate::events::ToolStagedPayload>()
                .map(|p| Cow::Owned(p.invocation_id))
                .map_err(|e| bad("toolStaged", &e)),
            EntryType::ToolCompleted => shaped_id(
                entry,
                "toolCompleted",
                |p: shape::Completed<'a>| p.invocation_id,
                |p: ToolCompletedPayload| p.invocation_id,
            ),
            EntryType::ToolFailed => entry
                .parse::<ToolFailedPayload>()
                .map(|p| Cow::Owned(p.invocation_id))
                .map_err(|e| bad("toolFailed", &e)),
            EntryType::ToolRejected => entry
                .parse::<ToolRejectedPayload>()
                .map(|p| Cow::Owned(p.invocation_id))
                .map_err(|e| bad("toolRejected", &e)),
            EntryType::Message
            | EntryType::TurnCancelled
            | EntryType::TurnEnded
            | EntryType::Compaction
            | EntryType::Undo
            | EntryType::UndoApplied => return ToolRead::Ignored,
        };
        match id {
            Ok(invocation_id) => ToolRead::Tool { kind, invocation_id },
            Err(e) => ToolRead::Bad(e),
        }
    }

    /// The lifecycle's rules for a tool event of `kind` about `id`.
    fn transition(&mut self, entry_id: &str, kind: EntryType, id: &str) -> Result<(), String> {
        use ToolInvocationStatus as S;
        let (settled, needs_start) = match kind {
            EntryType::ToolRequested => {
                if self.status(id).is_some() {
                    return Err(format!("invocation {id} requested twice"));
                }
                self.open.insert(id.to_owned(), S::Requested);
                return Ok(());
            }
            EntryType::ToolStarted => {
                let status = self.known(entry_id, id)?;
                if status != S::Requested {
                    return Err(format!("invocation {id} started while {status:?}"));
                }
                // Requested, so open (the settled keep only settled states).
                if let Some(open) = self.open.get_mut(id) {
                    *open = S::Started;
                }
                return Ok(());
            }
            EntryType::ToolBypass => {
                let status = self.known(entry_id, id)?;
                if status != S::Started {
                    return Err(format!("invocation {id} asked a bypass while {status:?}"));
                }
                return Ok(());
            }
            EntryType::ToolStaged => {
                let status = self.known(entry_id, id)?;
                if status != S::Started {
                    return Err(format!("invocation {id} staged while {status:?}"));
                }
                return Ok(());
            }
            EntryType::ToolCompleted => (S::Completed, true),
            EntryType::ToolFailed => (S::Failed, true),
            EntryType::ToolRejected => (S::Rejected, false),
            EntryType::Message
            | EntryType::TurnCancelled
            | EntryType::TurnEnded
            | EntryType::Compaction
            | EntryType::Undo
            | EntryType::UndoApplied => return Ok(()),
        };
        let status = self.known(entry_id, id)?;
        if status.is_settled() {
            return Err(format!("invocation {id} settled twice"));
        }
        if needs_start && status != S::Started {
            return Err(format!("invocation {id} settled without being started"));
        }
        // Settled: its open state goes; its id and outcome stay, packed.
        self.open.remove(id);
        self.settled.insert(id, settled_tag(settled));
        Ok(())
    }

    fn known(&self, entry_id: &str, invocation_id: &str) -> Result<ToolInvocationStatus, String> {
        self.status(invocation_id)
            .ok_or_else(|| format!("entry {entry_id}: invocation {invocation_id} was never requested"))
    }
}

/// The invocation id of one of the hot tool payloads, read through its
/// shape (`payload_shape.rs`: the payload checked as its type would check
/// it, nothing of it kept). A payload the shape refuses is parsed into its
/// type for the refusal's text, the same as before; should the type accept
/// it, the type's answer stands (a shape never refuses more than its type).
fn shaped_id<'a, L: Deserialize<'a>, F: serde::de::DeserializeOwned>(
    entry: EntryView<'a>,
    what: &str,
    from_shape: impl FnOnce(L) -> Cow<'a, str>,
    from_type: impl FnOnce(F) -> String,
) -> Result<Cow<'a, str>, String> {
    match serde_json::from_str::<L>(entry.payload) {
        Ok(shape) => Ok(from_shape(shape)),
        Err(_) => match serde_json::from_str::<F>(entry.payload) {
            Ok(full) => Ok(Cow::Owned(from_type(full))),
            Err(e) => Err(format!("entry {}: bad {what} payload: {e}", entry.id)),
        },
    }
}

/// [`LifecycleCheck::read`] as the reader of `cairn check`'s decoding
/// threads ([`check_file_read`](crate::storage::check_file_read)), reading
/// the hot tool payloads (`toolRequested`, `toolStarted`,
/// `toolCompleted`) through their shapes as the line is parsed: each
/// parsed once, not skimmed as raw text and then parsed again. A payload
/// its shape refuses there is not a verdict: the line is decoded again
/// and [`LifecycleCheck::read`] gives the answer (the type's error text).
#[derive(Debug, Clone, Copy, Default)]
pub struct LifecycleReader;

impl EntryRead for LifecycleReader {
    type Out = LifecycleRead;

    fn read(&self, entry: EntryView<'_>) -> LifecycleRead {
        LifecycleCheck::read(entry)
    }

    fn reads_inline(&self, entry_type: &str) -> bool {
        matches!(
            EntryType::of(entry_type),
            Some(EntryType::ToolRequested | EntryType::ToolStarted | EntryType::ToolCompleted)
        )
    }

    fn read_inline<'de, D: serde::Deserializer<'de>>(
        &self,
        entry_type: &str,
        payload: D,
    ) -> Result<LifecycleRead, D::Error> {
        // What `read_inner` keeps when the shape accepts the payload.
        let (kind, invocation_id) = match EntryType::of(entry_type) {
            Some(kind @ EntryType::ToolRequested) => (kind, shape::Requested::deserialize(payload)?.invocation_id),
            Some(kind @ EntryType::ToolStarted) => (kind, shape::Started::deserialize(payload)?.invocation_id),
            Some(kind @ EntryType::ToolCompleted) => (kind, shape::Completed::deserialize(payload)?.invocation_id),
            _ => return Err(serde::de::Error::custom("not read inline")),
        };
        Ok(LifecycleRead(ToolRead::Tool { kind, invocation_id: Cow::Owned(invocation_id.into_owned()) }))
    }
}

/// The settlement repeats the bypasses its `toolBypass` entries already
/// recorded; a log written before those entries existed has them only here.
fn keep_bypasses(r: &mut ToolInvocationRecord, settled: Vec<BypassRecord>) {
    if r.bypasses.is_empty() {
        r.bypasses = settled;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::storage::to_raw;

    fn entry(n: usize, entry_type: &str, payload: &serde_json::Value) -> Entry {
        Entry {
            seq: n as u64 + 1,
            timestamp: n as i64,
            id: format!("e{n}"),
            parent_id: None,
            entry_type: entry_type.to_owned(),
            payload: to_raw(payload).unwrap(),
        }
    }

    /// Entry `kind` (0–9) about invocation `inv`, with well-formed payloads
    /// except kind 9 (a settlement missing its fields).
    fn make(n: usize, kind: u64, inv: u64) -> Entry {
        let id = format!("i{inv}");
        let verdict = json!({"decision": "approve", "by": "policy:test", "at": 1});
        let receipt = json!({"exitCode": 0, "outputSummary": "x".repeat(50), "durationMs": 1, "tier": "readOnly", "timestamp": 1});
        match kind {
            0 => entry(
                n,
                "toolRequested",
                &json!({"invocationId": id, "turnId": "t", "request":
                {"invocationId": id, "callId": "c", "sessionId": "s", "tool": "echo", "arguments": {"a": 1}}}),
            ),
            1 => {
                entry(n, "toolStarted", &json!({"invocationId": id, "callId": "c", "tool": "echo", "verdict": verdict}))
            }
            2 => entry(
                n,
                "toolBypass",
                &json!({"invocationId": id, "tool": "echo", "bypass": {"what": "net", "verdict": verdict}}),
            ),
            3 => entry(
                n,
                "toolStaged",
                &json!({"invocationId": id, "tool": "echo", "changeSet": {"changes": []}, "staging": "/s", "verdict": verdict}),
            ),
            4 => entry(
                n,
                "toolCompleted",
                &json!({"invocationId": id, "callId": "c", "tool": "echo", "receipt": receipt}),
            ),
            5 => entry(n, "toolFailed", &json!({"invocationId": id, "callId": "c", "tool": "echo", "reason": "r"})),
            6 => entry(n, "toolRejected", &json!({"invocationId": id, "callId": "c", "tool": "echo", "reason": "r"})),
            7 => entry(n, "message", &json!({"role": "user", "content": []})),
            8 => entry(n, "somethingNew", &json!({"invocationId": id})),
            _ => entry(
                n,
                ["toolCompleted", "toolStarted", "toolRequested"][inv as usize % 3],
                &json!({"invocationId": id}),
            ),
        }
    }

    /// A long healthy log (`turns` invocations requested, started and
    /// completed, a message between them), then `tail` appended.
    fn long_log(turns: u64, tail: &[(u64, u64)]) -> Vec<Entry> {
        let mut entries = Vec::new();
        for inv in 0..turns {
            for kind in [7, 0, 1, 4] {
                entries.push(make(entries.len(), kind, inv));
            }
        }
        for &(kind, inv) in tail {
            entries.push(make(entries.len(), kind, inv));
        }
        entries
    }

    fn check_all(entries: &[Entry]) -> (LifecycleCheck, Result<(), LifecycleError>) {
        let mut check = LifecycleCheck::default();
        for e in entries {
            check.apply(e.view());
        }
        let verdict = match &check.first {
            Some(first) => Err(LifecycleError(first.clone())),
            None => Ok(()),
        };
        (check, verdict)
    }

    #[test]
    fn settled_invocations_leave_no_open_state_and_far_anomalies_are_still_found() {
        // Healthy: every invocation settled, nothing open is kept.
        let healthy = long_log(20_000, &[(0, 20_000), (1, 20_000)]);
        let (check, verdict) = check_all(&healthy);
        assert_eq!(verdict, Ok(()));
        assert_eq!((check.unsettled(), check.settled()), (1, 20_000), "only the running invocation is open");
        // Anomalies about the first invocation, 80,000 entries after it
        // settled: refused with the projection's text, as before.
        for (tail, text) in [
            (vec![(0, 0)], "invocation i0 requested twice"),
            (vec![(1, 0)], "invocation i0 started while Completed"),
            (vec![(2, 0)], "invocation i0 asked a bypass while Completed"),
            (vec![(3, 0)], "invocation i0 staged while Completed"),
            (vec![(4, 0)], "invocation i0 settled twice"),
            (vec![(5, 0)], "invocation i0 settled twice"),
            (vec![(6, 0)], "invocation i0 settled twice"),
            (vec![(0, 20_000), (4, 20_000)], "invocation i20000 settled without being started"),
            (vec![(4, 20_001)], "was never requested"),
            // Requested far away and never settled, then requested again.
            (vec![(0, 20_000), (7, 0), (7, 0), (0, 20_000)], "invocation i20000 requested twice"),
        ] {
            let entries = long_log(20_000, &tail);
            let (_, verdict) = check_all(&entries);
            let expected = ToolState::replay_strict(&entries).err();
            assert_eq!(verdict.clone().err(), expected, "{tail:?}");
            let error = verdict.expect_err("refused").0;
            assert!(error.contains(text), "{tail:?}: {error}");
        }
    }

    #[test]
    fn the_lifecycle_check_finds_what_the_projection_finds() {
        // Pseudo-random logs over three invocations, healthy and hostile:
        // the check's verdict is the full projection's, anomaly text and all.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let (mut healthy, mut broken) = (0, 0);
        for round in 0..20_000 {
            let len = 1 + next(12) as usize;
            let entries: Vec<Entry> = (0..len)
                .map(|n| {
                    // Mostly the legal order, so healthy logs occur too.
                    let kind = if round % 2 == 0 { [0, 1, 4, 0, 1, 5, 0, 6, 7, 1][n % 10] } else { next(10) };
                    make(n, kind, if round % 2 == 0 { n as u64 / 3 } else { next(3) })
                })
                .collect();
            let mut check = LifecycleCheck::default();
            for e in &entries {
                check.apply(e.view());
            }
            let expected = ToolState::replay_strict(&entries).err();
            if expected.is_some() {
                broken += 1
            } else {
                healthy += 1
            }
            assert_eq!(check.finish().err(), expected, "{entries:#?}");
        }
        assert!(healthy > 1000 && broken > 1000, "{healthy} healthy, {broken} broken");
    }
}
