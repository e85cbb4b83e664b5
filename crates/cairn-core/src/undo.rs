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

use crate::events::{
    EntryPayload, EntryType, ToolCompletedPayload, ToolRequestedPayload, ToolStagedPayload, ToolStartedPayload,
    payload_of,
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
    /// put back.
    pub unrevertible: Vec<Unrevertible>,
}

/// The file effects of `entries` (a stretch of one lane, oldest first):
/// every `toolStaged` change set with kept pre-images is revertible; one
/// without them, and every call that ran with a Write or Destructive tier
/// and recorded no change set (an unstaged shell command, an external
/// tool without staging, a network call), is not. A staged call that
/// changed nothing (its receipt says so) has no effect at all.
pub fn effects(entries: &[Entry]) -> Effects {
    let mut out = Effects::default();
    let mut tiers: BTreeMap<String, (String, Option<Risk>)> = BTreeMap::new();
    let mut started: Vec<String> = Vec::new();
    let mut staged: BTreeMap<String, ()> = BTreeMap::new();
    let mut empty_staged: BTreeMap<String, ()> = BTreeMap::new();
    for entry in entries {
        match EntryType::of_entry(entry) {
            Some(EntryType::ToolRequested) => {
                if let Some(p) = payload_of::<ToolRequestedPayload>(entry) {
                    tiers.insert(p.invocation_id.clone(), (p.request.tool.clone(), p.tier));
                }
            }
            Some(EntryType::ToolStarted) => {
                if let Some(p) = payload_of::<ToolStartedPayload>(entry) {
                    started.push(p.invocation_id);
                }
            }
            Some(EntryType::ToolStaged) => {
                let Some(p) = payload_of::<ToolStagedPayload>(entry) else { continue };
                staged.insert(p.invocation_id.clone(), ());
                match &p.preimages {
                    Some(pre) if pre.kept() => {
                        out.revertible.push(Revertible { entry_id: entry.id.clone(), staged: p });
                    }
                    Some(crate::staged::Preimages::NotKept { reason }) => out.unrevertible.push(Unrevertible {
                        invocation_id: p.invocation_id.clone(),
                        tool: p.tool.clone(),
                        reason: format!("its prior state was not kept: {reason}"),
                    }),
                    _ => out.unrevertible.push(Unrevertible {
                        invocation_id: p.invocation_id.clone(),
                        tool: p.tool.clone(),
                        reason: "it was recorded before cairn kept pre-images".to_owned(),
                    }),
                }
            }
            Some(EntryType::ToolCompleted) => {
                if let Some(p) = payload_of::<ToolCompletedPayload>(entry)
                    && receipt_staged_nothing(p.receipt.structured_output.as_ref())
                {
                    empty_staged.insert(p.invocation_id, ());
                }
            }
            _ => {}
        }
    }
    for invocation in started {
        if staged.contains_key(&invocation) || empty_staged.contains_key(&invocation) {
            continue;
        }
        let (tool, tier) = tiers.get(&invocation).cloned().unwrap_or_default();
        if tier == Some(Risk::ReadOnly) {
            continue;
        }
        out.unrevertible.push(Unrevertible {
            invocation_id: invocation,
            tool: tool.clone(),
            reason: format!(
                "{tool} ran with a Write tier and recorded no change set (unstaged, or a tool without file staging), so \
                 what it changed is not known"
            ),
        });
    }
    out
}

/// Whether a receipt says a staged run changed nothing (`staging` is the
/// overlay and the change set is empty).
fn receipt_staged_nothing(structured: Option<&serde_json::Value>) -> bool {
    let Some(s) = structured else { return false };
    let overlay = s.get("staging").and_then(|m| m.get("mode")).and_then(|m| m.as_str()) == Some("overlay");
    let empty =
        s.get("changeSet").and_then(|c| c.get("changes")).and_then(|c| c.as_array()).is_some_and(|c| c.is_empty());
    overlay && empty
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

    #[test]
    fn a_path_created_then_deleted_drops_out() {
        let one = effect(vec![change("t", ChangeKind::Created, None, file("1"))]);
        let two = effect(vec![change("t", ChangeKind::Deleted, file("1"), None)]);
        assert!(plan(&[one, two]).is_empty());
    }
}
