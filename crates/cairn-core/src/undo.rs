//! Undo of file effects: which effects on a stretch of a lane can be
//! reverted (from their `toolStaged` records and the pre-images those
//! name), the net plan that takes the working tree from its state after
//! them back to its state before them ([`plan`]), and the payloads of the
//! `undo`/`undoApplied` entries that make an undo durable and redoable.
//!
//! It only reads entries and computes; it must not touch the file system
//! (the host checks the tree, keeps the current contents, applies the plan
//! and commits the entries through [`crate::turn::Session`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::approval::Answer;
use crate::events::{
    EntryPayload, EntryType, ToolBypassPayload, ToolCompletedPayload, ToolFailedPayload, ToolRejectedPayload,
    ToolRequestedPayload, ToolStagedPayload, ToolStartedPayload, payload_of,
};
use crate::risk::Risk;
use crate::staged::{ChangeKind, FileState};
use crate::storage::Entry;

/// One path of an undo plan: the state it is in now (`from`) and the
/// state the undo puts back (`to`); `None` is "absent".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UndoStep {
    /// Path relative to the working tree, `/`-separated.
    pub path: String,
    /// The state found (or expected) before the undo.
    pub from: Option<FileState>,
    /// The state the undo leaves.
    pub to: Option<FileState>,
}

/// An effect undo cannot revert, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unrevertible {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// The tool.
    pub tool: String,
    /// Why it cannot be undone.
    pub reason: String,
    /// The turn it ran in (1-based along the lane), when the host counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<usize>,
}

/// One effect an undo reverts.
#[derive(Debug, Clone, PartialEq)]
pub struct Revertible {
    /// The `toolStaged` entry.
    pub entry_id: String,
    /// Its payload (the change set).
    pub staged: ToolStagedPayload,
}

/// The effects recorded in a stretch of entries, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Effects {
    /// Effects whose pre-images were kept.
    pub revertible: Vec<Revertible>,
    /// Effects that changed (or may have changed) something undo cannot
    /// put back. An invocation may be in both lists: its files can be
    /// reverted, but not everything it did (network access, a run outside
    /// the sandbox).
    pub unrevertible: Vec<Unrevertible>,
    /// Invocations that started and left nothing to undo (ReadOnly, or a
    /// staged run that changed nothing).
    pub no_effect: Vec<String>,
}

/// Whether one invocation's effect can be undone: what `cairn show
/// --tools` says of it, read from the same [`Effects`] `cairn undo` acts
/// on, so the two cannot disagree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum Undoability {
    /// Undo reverts all of it (its prior state is kept).
    Undoable,
    /// Undo cannot revert it (or not all of it): it refuses a range holding
    /// it unless forced.
    NotUndoable {
        /// Why (several reasons joined by "; ").
        reason: String,
    },
    /// It started and changed nothing undo would revert.
    NoEffect,
}

impl Effects {
    /// What undo makes of `invocation_id`; `None` when it never started in
    /// the entries read (rejected, or not there).
    pub fn undoability(&self, invocation_id: &str) -> Option<Undoability> {
        let reasons: Vec<&str> =
            self.unrevertible.iter().filter(|u| u.invocation_id == invocation_id).map(|u| u.reason.as_str()).collect();
        if !reasons.is_empty() {
            return Some(Undoability::NotUndoable { reason: reasons.join("; ") });
        }
        if self.revertible.iter().any(|r| r.staged.invocation_id == invocation_id) {
            return Some(Undoability::Undoable);
        }
        self.no_effect.iter().any(|i| i == invocation_id).then_some(Undoability::NoEffect)
    }
}

/// What an invocation's records say, gathered before it is judged.
#[derive(Default)]
struct Seen {
    tool: String,
    tier: Option<Risk>,
    staged: bool,
    structured: Option<serde_json::Value>,
    /// Its `toolStarted` says it ran staged.
    ran_staged: bool,
    /// Settled rejected after it started: its staged effect was discarded
    /// (`ToolError::Rejected`: nothing was applied).
    discarded: bool,
    /// Settled failed (cancelled, timed out, an error).
    failed: bool,
    /// A person approved a run outside the sandbox during it.
    bypassed: bool,
}

impl Seen {
    /// It started and ended without applying anything: its staged effect
    /// was discarded (refused, declined), or it ran staged and failed
    /// (cancelled, timed out) before a change set was recorded — and it
    /// never ran outside the sandbox.
    fn changed_nothing(&self) -> bool {
        !self.staged && !self.bypassed && (self.discarded || (self.failed && self.ran_staged))
    }
}

/// The file effects of `entries` (a stretch of one lane, oldest first),
/// judged by one rule (the one `cairn undo` and `cairn show --tools` both
/// use), per invocation that started:
///
/// - a call of a `delegating` tool (the host's `spawn_agent`) is not
///   undoable here: its effects are in the child's own session;
/// - a `toolStaged` change set with kept pre-images is revertible; one
///   without them (over `tools.undo_max_bytes`, a FIFO, a read that
///   failed) or recorded before pre-images existed is not;
/// - a call whose receipt says it had network access (`"network": true`)
///   or ran outside the sandbox after an approved bypass
///   (`"bypassApproved": true`) is not (its files, if staged, are still
///   reverted by a forced undo): what it did beyond the working tree's
///   files cannot be put back;
/// - a call with no change set that ran with a Write or Destructive tier
///   is not: an unstaged shell command (its receipt says why), an
///   external tool without `fileWrite`, an MCP server's tool, a network
///   call; cairn does not know what it changed;
/// - everything else (a ReadOnly call, a staged run that changed nothing,
///   a started call whose staged effect was discarded — refused, declined
///   — or that ran staged and failed or was cancelled before its change
///   set was recorded, without a bypass) has no effect to undo.
pub fn effects(entries: &[Entry], delegating: &[&str]) -> Effects {
    let mut out = Effects::default();
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    let mut started: Vec<String> = Vec::new();
    let mut staged: Vec<(String, ToolStagedPayload)> = Vec::new();
    for entry in entries {
        match EntryType::of_entry(entry) {
            Some(EntryType::ToolRequested) => {
                if let Some(p) = payload_of::<ToolRequestedPayload>(entry) {
                    let s = seen.entry(p.invocation_id.clone()).or_default();
                    s.tool = p.request.tool.clone();
                    s.tier = p.tier;
                }
            }
            Some(EntryType::ToolStarted) => {
                if let Some(p) = payload_of::<ToolStartedPayload>(entry) {
                    let s = seen.entry(p.invocation_id.clone()).or_default();
                    if s.tool.is_empty() {
                        s.tool = p.tool.clone();
                    }
                    s.ran_staged = p.staged;
                    started.push(p.invocation_id);
                }
            }
            Some(EntryType::ToolStaged) => {
                let Some(p) = payload_of::<ToolStagedPayload>(entry) else { continue };
                seen.entry(p.invocation_id.clone()).or_default().staged = true;
                staged.push((entry.id.clone(), p));
            }
            Some(EntryType::ToolCompleted) => {
                if let Some(p) = payload_of::<ToolCompletedPayload>(entry) {
                    seen.entry(p.invocation_id.clone()).or_default().structured = p.receipt.structured_output;
                }
            }
            Some(EntryType::ToolRejected) => {
                if let Some(p) = payload_of::<ToolRejectedPayload>(entry) {
                    seen.entry(p.invocation_id).or_default().discarded = true;
                }
            }
            Some(EntryType::ToolFailed) => {
                if let Some(p) = payload_of::<ToolFailedPayload>(entry) {
                    let s = seen.entry(p.invocation_id).or_default();
                    s.failed = true;
                    s.bypassed |= p.bypasses.iter().any(|b| !matches!(b.verdict.decision, Answer::Deny { .. }));
                }
            }
            Some(EntryType::ToolBypass) => {
                if let Some(p) = payload_of::<ToolBypassPayload>(entry) {
                    let approved = !matches!(p.bypass.verdict.decision, Answer::Deny { .. });
                    seen.entry(p.invocation_id).or_default().bypassed |= approved;
                }
            }
            _ => {}
        }
    }
    let not = |invocation: &str, tool: &str, reason: String| Unrevertible {
        invocation_id: invocation.to_owned(),
        tool: tool.to_owned(),
        reason,
        turn: None,
    };
    // Change sets, in the order they were recorded (the plan's order).
    for (entry_id, p) in staged {
        let not_kept = match &p.preimages {
            Some(crate::staged::Preimages::Kept { .. }) => None,
            Some(crate::staged::Preimages::NotKept { reason }) => {
                Some(format!("its prior state was not kept: {reason}"))
            }
            None => Some("it was recorded before cairn kept pre-images".to_owned()),
        };
        match not_kept {
            None => out.revertible.push(Revertible { entry_id, staged: p }),
            Some(reason) => out.unrevertible.push(not(&p.invocation_id, &p.tool, reason)),
        }
    }
    for invocation in started {
        let s = seen.remove(&invocation).unwrap_or_default();
        let tool = s.tool.as_str();
        if delegating.contains(&tool) {
            out.unrevertible.push(not(
                &invocation,
                tool,
                format!(
                    "{tool} ran in another session (a child's calls are its own): undo that session to revert them"
                ),
            ));
            continue;
        }
        let structured = s.structured.as_ref();
        let flag = |key: &str| structured.and_then(|v| v.get(key)).and_then(serde_json::Value::as_bool) == Some(true);
        let mut beyond = Vec::new();
        if flag("network") {
            beyond
                .push(format!("{tool} had network access: what it sent or changed over the network cannot be undone"));
        }
        if flag("bypassApproved") {
            beyond.push(format!(
                "{tool} ran outside the sandbox (an approved bypass): what it changed outside the working tree, \
                 or in processes beyond it, cannot be undone"
            ));
        }
        let has_beyond = !beyond.is_empty();
        for reason in beyond {
            out.unrevertible.push(not(&invocation, tool, reason));
        }
        if s.staged {
            continue;
        }
        if receipt_staged_nothing(structured) || s.tier == Some(Risk::ReadOnly) || s.changed_nothing() {
            if !has_beyond {
                out.no_effect.push(invocation);
            }
            continue;
        }
        let reason = match unstaged_why(structured) {
            Some(why) => {
                format!(
                    "{tool} ran unstaged ({why}), so what it changed (files, processes outside the tree) is not known"
                )
            }
            None => format!(
                "{tool} ran with a Write tier and recorded no change set (a tool without file staging: no \
                 fileWrite capability, an MCP server's tool, a network call), so what it changed is not known"
            ),
        };
        out.unrevertible.push(not(&invocation, tool, reason));
    }
    out
}

/// Why a receipt says its call ran unstaged (`staging.mode` is
/// `unstaged`), if it does.
fn unstaged_why(structured: Option<&serde_json::Value>) -> Option<String> {
    let mode = structured?.get("staging")?;
    (mode.get("mode")?.as_str()? == "unstaged")
        .then(|| mode.get("why").and_then(|w| w.as_str()).unwrap_or("no overlay").to_owned())
}

/// Whether a receipt says a staged run changed nothing (`staging` is the
/// overlay and the change set, beside it (shell) or in it (external
/// tools), is empty).
fn receipt_staged_nothing(structured: Option<&serde_json::Value>) -> bool {
    let Some(s) = structured else { return false };
    let Some(staging) = s.get("staging") else { return false };
    let overlay = staging.get("mode").and_then(|m| m.as_str()) == Some("overlay");
    let empty = |v: &serde_json::Value| {
        v.get("changeSet").and_then(|c| c.get("changes")).and_then(|c| c.as_array()).is_some_and(|c| c.is_empty())
    };
    overlay && (empty(s) || empty(staging))
}

/// The net plan that reverts `effects` (oldest first): per path, `from` is
/// the state the newest effect touching it left, `to` the state before the
/// oldest one. Sorted by path; paths an effect left as it found them are
/// dropped.
pub fn plan(effects: &[Revertible]) -> Vec<UndoStep> {
    let mut steps: BTreeMap<String, UndoStep> = BTreeMap::new();
    for effect in effects {
        for change in &effect.staged.change_set.changes {
            let after = if change.kind == ChangeKind::Deleted { None } else { change.after.clone() };
            steps.entry(change.path.clone()).and_modify(|s| s.from = after.clone()).or_insert_with(|| UndoStep {
                path: change.path.clone(),
                from: after,
                to: change.before.clone(),
            });
        }
    }
    steps.into_values().filter(|s| s.from != s.to).collect()
}

/// Which way a plan goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UndoDirection {
    /// Back to the state before the effects.
    Undo,
    /// Forward again, reverting an undo.
    Redo,
}

/// Payload of `undo`: the whole plan, committed before any file is
/// touched, as a child of the lane head it started from (off the lane:
/// the lane moves only with `undoApplied`). An `undo` entry no
/// `undoApplied` names is an interrupted undo: running `cairn undo` (or
/// `cairn redo`) again finishes it (the apply is idempotent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UndoPayload {
    /// Undo or redo.
    pub direction: UndoDirection,
    /// The lane.
    pub lane: String,
    /// The lane head when it started.
    pub from_entry: String,
    /// The entry the lane points back to (`None`: before the first entry).
    pub to_entry: Option<String>,
    /// Per path, the state found and the state to leave.
    pub steps: Vec<UndoStep>,
    /// The invocations reverted (or, for a redo, reapplied).
    pub invocations: Vec<String>,
    /// Effects in the range that could not be reverted (only with
    /// `--force`; otherwise the undo refuses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unrevertible: Vec<Unrevertible>,
    /// Paths changed after the effects, overwritten because of `--force`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forced: Vec<String>,
    /// For a redo: the `undo` entry it reverts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redoes: Option<String>,
}

impl EntryPayload for UndoPayload {
    const TYPE: EntryType = EntryType::Undo;
}

/// Payload of `undoApplied`: the plan of `undo` was applied in full. Its
/// entry's parent is the plan's `to_entry`, and the lane head moves to it
/// in the same commit, so the conversation and the files agree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UndoAppliedPayload {
    /// The `undo` entry.
    pub undo: String,
    /// Undo or redo (repeated for readers of this entry alone).
    pub direction: UndoDirection,
    /// Paths changed.
    pub paths: usize,
}

impl EntryPayload for UndoAppliedPayload {
    const TYPE: EntryType = EntryType::UndoApplied;
}

/// The `undo` entries of `entries` that no `undoApplied` names:
/// interrupted undos, oldest first.
pub fn interrupted<'a>(entries: impl IntoIterator<Item = &'a Entry>) -> Vec<(&'a Entry, UndoPayload)> {
    let mut open: Vec<(&Entry, UndoPayload)> = Vec::new();
    let mut done: Vec<String> = Vec::new();
    for entry in entries {
        if let Some(p) = payload_of::<UndoPayload>(entry) {
            open.push((entry, p));
        } else if let Some(p) = payload_of::<UndoAppliedPayload>(entry) {
            done.push(p.undo);
        }
    }
    open.retain(|(e, _)| !done.contains(&e.id));
    open
}

/// The steps that reverse `steps` (a redo of an undo).
pub fn reversed(steps: &[UndoStep]) -> Vec<UndoStep> {
    steps.iter().map(|s| UndoStep { path: s.path.clone(), from: s.to.clone(), to: s.from.clone() }).collect()
}

/// Every content hash `entries` name that the pre-image store may hold
/// for them: the prior and new states (files and links) of every
/// `toolStaged` change set, and the states of every `undo` plan (what an
/// undo puts back, and what a redo puts back). A pre-image store keeps at
/// least these (its garbage collection removes only blobs no session
/// names); naming more than the store holds is harmless.
pub fn named_preimages<E: std::borrow::Borrow<Entry>>(
    entries: impl IntoIterator<Item = E>,
) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let mut add = |state: Option<&FileState>| {
        if let Some(s) = state
            && matches!(s.kind, crate::staged::EntryKind::File | crate::staged::EntryKind::Symlink)
        {
            out.insert(s.sha256.clone());
        }
    };
    for entry in entries {
        let entry = entry.borrow();
        match EntryType::of_entry(entry) {
            Some(EntryType::ToolStaged) => {
                if let Some(p) = payload_of::<ToolStagedPayload>(entry) {
                    for c in &p.change_set.changes {
                        add(c.before.as_ref());
                        add(c.after.as_ref());
                    }
                }
            }
            Some(EntryType::Undo) => {
                if let Some(p) = payload_of::<UndoPayload>(entry) {
                    for step in &p.steps {
                        add(step.from.as_ref());
                        add(step.to.as_ref());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::approval::Answer;
    use crate::events::VerdictRecord;
    use crate::staged::{Change, ChangeSet, EntryKind, Preimages};

    fn file(sha: &str) -> Option<FileState> {
        Some(FileState { kind: EntryKind::File, size: 1, sha256: sha.into(), mode: 0o644 })
    }

    fn effect(changes: Vec<Change>) -> Revertible {
        Revertible {
            entry_id: "e1".into(),
            staged: ToolStagedPayload {
                invocation_id: "i1".into(),
                tool: "shell".into(),
                change_set: ChangeSet { changes },
                staging: String::new(),
                verdict: VerdictRecord { decision: Answer::Approve, by: "t".into(), at: 0 },
                preimages: Some(Preimages::Kept { bytes: 0 }),
            },
        }
    }

    fn change(path: &str, kind: ChangeKind, before: Option<FileState>, after: Option<FileState>) -> Change {
        Change { path: path.into(), kind, before, after, lines: None, appends: false, discards_uncommitted: false }
    }

    #[test]
    fn the_plan_goes_from_the_newest_after_to_the_oldest_before() {
        let one = effect(vec![change("a", ChangeKind::Modified, file("1"), file("2"))]);
        let two = effect(vec![
            change("a", ChangeKind::Modified, file("2"), file("3")),
            change("b", ChangeKind::Created, None, file("9")),
        ]);
        let steps = plan(&[one, two]);
        assert_eq!(
            steps,
            vec![
                UndoStep { path: "a".into(), from: file("3"), to: file("1") },
                UndoStep { path: "b".into(), from: file("9"), to: None },
            ]
        );
        assert_eq!(reversed(&steps)[1], UndoStep { path: "b".into(), from: None, to: file("9") });
    }

    /// An entry of `kind` holding `payload`.
    fn entry<P: serde::Serialize>(id: &str, kind: EntryType, payload: &P) -> Entry {
        Entry {
            seq: 1,
            timestamp: 0,
            id: id.into(),
            parent_id: None,
            entry_type: kind.tag().to_owned(),
            payload: crate::storage::RawJson::from_json(serde_json::to_string(payload).unwrap()).unwrap(),
        }
    }

    /// The records of one call of `tool` at `tier`: requested, started,
    /// optionally staged (with `preimages`), completed with `structured`.
    fn call(
        id: &str,
        tool: &str,
        tier: Risk,
        preimages: Option<Preimages>,
        structured: serde_json::Value,
    ) -> Vec<Entry> {
        let request = crate::tool::ToolRequest {
            invocation_id: id.into(),
            call_id: id.into(),
            session_id: "s".into(),
            tool: tool.into(),
            arguments: serde_json::json!({}),
        };
        let verdict = VerdictRecord { decision: Answer::Approve, by: "t".into(), at: 0 };
        let mut out = vec![
            entry(
                &format!("{id}r"),
                EntryType::ToolRequested,
                &ToolRequestedPayload {
                    invocation_id: id.into(),
                    turn_id: "t1".into(),
                    request,
                    tier: Some(tier),
                    replay: None,
                    hook: None,
                },
            ),
            entry(
                &format!("{id}s"),
                EntryType::ToolStarted,
                &ToolStartedPayload {
                    invocation_id: id.into(),
                    call_id: id.into(),
                    tool: tool.into(),
                    verdict: verdict.clone(),
                    staged: false,
                },
            ),
        ];
        if let Some(pre) = preimages {
            let mut staged = effect(vec![change("a", ChangeKind::Modified, file("1"), file("2"))]).staged;
            staged.invocation_id = id.into();
            staged.tool = tool.into();
            staged.preimages = Some(pre);
            out.push(entry(&format!("{id}g"), EntryType::ToolStaged, &staged));
        }
        out.push(entry(
            &format!("{id}c"),
            EntryType::ToolCompleted,
            &ToolCompletedPayload {
                invocation_id: id.into(),
                call_id: id.into(),
                tool: tool.into(),
                receipt: crate::tool::ToolReceipt {
                    exit_code: 0,
                    output_summary: String::new(),
                    structured_output: Some(structured),
                    affected_entities: Vec::new(),
                    duration_ms: 0,
                    tier,
                    timestamp: 0,
                    truncated: false,
                },
                full_output: None,
                settled_by: None,
                bypasses: Vec::new(),
            },
        ));
        out
    }

    /// One rule for every kind of call: what `undoability` says of each is
    /// what undo reverts (`revertible`) or refuses over (`unrevertible`).
    #[test]
    fn each_kind_of_call_is_judged_by_one_rule() {
        let kept = || Some(Preimages::Kept { bytes: 1 });
        let overlay =
            |n: bool| serde_json::json!({"staging": {"mode": "overlay"}, "network": n, "changeSet": {"changes": [{}]}});
        let empty = serde_json::json!({"staging": {"mode": "overlay"}, "changeSet": {"changes": []}});
        let mut entries = Vec::new();
        entries.extend(call("i1", "write_file", Risk::Write, kept(), serde_json::json!({})));
        entries.extend(call("i2", "shell", Risk::Write, kept(), overlay(true)));
        entries.extend(call(
            "i3",
            "shell",
            Risk::Write,
            None,
            serde_json::json!({"staging": {"mode": "unstaged", "why": "staged = false"}}),
        ));
        entries.extend(call("i4", "mcp__x__send", Risk::Write, None, serde_json::json!({})));
        entries.extend(call("i5", "spawn_agent", Risk::Write, None, serde_json::json!({})));
        entries.extend(call(
            "i6",
            "write_file",
            Risk::Write,
            Some(Preimages::NotKept { reason: "over the undo budget".into() }),
            serde_json::json!({}),
        ));
        entries.extend(call("i7", "read_file", Risk::ReadOnly, None, serde_json::json!({})));
        entries.extend(call("i8", "shell", Risk::Write, None, empty));
        entries.extend(call("i9", "shell", Risk::Write, kept(), {
            let mut v = overlay(false);
            v["bypassApproved"] = serde_json::json!(true);
            v
        }));
        let e = effects(&entries, &["spawn_agent"]);
        let reason = |id: &str| match e.undoability(id) {
            Some(Undoability::NotUndoable { reason }) => reason,
            other => panic!("{id}: {other:?}"),
        };
        assert_eq!(e.undoability("i1"), Some(Undoability::Undoable));
        assert!(reason("i2").contains("network access"), "{}", reason("i2"));
        assert!(reason("i3").contains("ran unstaged (staged = false)"), "{}", reason("i3"));
        assert!(reason("i4").contains("recorded no change set"), "{}", reason("i4"));
        assert!(reason("i5").contains("another session"), "{}", reason("i5"));
        assert!(reason("i6").contains("over the undo budget"), "{}", reason("i6"));
        assert_eq!(e.undoability("i7"), Some(Undoability::NoEffect));
        assert_eq!(e.undoability("i8"), Some(Undoability::NoEffect));
        assert!(reason("i9").contains("outside the sandbox"), "{}", reason("i9"));
        assert_eq!(e.undoability("nope"), None);
        // What undo acts on: the kept change sets are reverted (a call with
        // network access or a bypass among them: its files can be, with
        // --force), and every not-undoable call is refused over.
        let reverted: Vec<&str> = e.revertible.iter().map(|r| r.staged.invocation_id.as_str()).collect();
        assert_eq!(reverted, ["i1", "i2", "i9"]);
        let mut refused: Vec<&str> = e.unrevertible.iter().map(|u| u.invocation_id.as_str()).collect();
        refused.sort_unstable();
        assert_eq!(refused, ["i2", "i3", "i4", "i5", "i6", "i9"]);
    }

    #[test]
    fn a_path_created_then_deleted_drops_out() {
        let one = effect(vec![change("t", ChangeKind::Created, None, file("1"))]);
        let two = effect(vec![change("t", ChangeKind::Deleted, file("1"), None)]);
        assert!(plan(&[one, two]).is_empty());
    }
}
