//! The session's half of an undo or redo: commit its plan (`undo`, off the
//! lane, before any file is touched) and then its completion
//! (`undoApplied`, which moves the lane head back, or forward for a redo,
//! in the same line). The plan itself is [`crate::undo`]'s; checking and
//! changing the working tree is the host's. It must not touch files.

use super::{LANE_NS, Session, TurnError, to_raw};
use crate::events::EntryPayload;
use crate::storage::{Storage, Transaction};
use crate::undo::{UndoAppliedPayload, UndoPayload};

impl<S: Storage> Session<S> {
    /// Commit the plan of an undo (or redo) as an `undo` entry, a child of
    /// the current lane head; the lane does not move. Refused while a turn
    /// is in progress. Returns the entry's id.
    pub fn begin_undo(&mut self, plan: &UndoPayload) -> Result<String, TurnError> {
        if self.pc.in_progress() {
            return Err(TurnError::NeedsResume(self.pc.phase));
        }
        let id = format!("e{}", self.store.last_seq().wrapping_add(1));
        let raw = to_raw(plan)?;
        self.store.commit(Transaction::new().entry(id.clone(), self.head.as_deref(), UndoPayload::TYPE.tag(), raw))?;
        Ok(id)
    }

    /// Record that the plan of `undo` was applied: an `undoApplied` entry
    /// whose parent is the plan's `to_entry`, and the plan's lane moved to
    /// it in the same commit. Returns the entry's id.
    pub fn finish_undo(&mut self, undo: &str, plan: &UndoPayload) -> Result<String, TurnError> {
        if self.pc.in_progress() {
            return Err(TurnError::NeedsResume(self.pc.phase));
        }
        let id = format!("e{}", self.store.last_seq().wrapping_add(1));
        let payload = UndoAppliedPayload { undo: undo.to_owned(), direction: plan.direction, paths: plan.steps.len() };
        let tx = Transaction::new()
            .entry(id.clone(), plan.to_entry.as_deref(), UndoAppliedPayload::TYPE.tag(), to_raw(&payload)?)
            .set(LANE_NS, plan.lane.clone(), to_raw(&id)?);
        self.store.commit(tx)?;
        if plan.lane == self.lane {
            self.load_conversation(Some(&id))?;
            self.head = Some(id.clone());
        }
        Ok(id)
    }
}
