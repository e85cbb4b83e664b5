//! The session's half of an undo or redo: commit its plan (`undo`, off the
//! lane, before any file is touched) and then its completion
//! (`undoApplied`, which moves the lane head back, or forward for a redo,
//! in the same line). The plan itself is [`crate::undo`]'s; checking and
//! changing the working tree is the host's. It must not touch files.

use super::{LANE_NS, OP_NS, PROVIDER_OP, Phase, Session, TurnError, to_raw};
use crate::events::EntryPayload;
use crate::events::{TurnEndedPayload, TurnEvent};
use crate::storage::{Storage, Transaction};
use crate::undo::{UndoAppliedPayload, UndoPayload};

impl<S: Storage> Session<S> {
    /// Whether the turn in progress stands where nothing of a tool is in
    /// flight — cancelled, a provider call outstanding (a failed or killed
    /// one), between calls, a question unanswered — so an undo may end it
    /// first ([`Session::end_interrupted`]) without losing any effect.
    /// False with no turn in progress, and while a call executes (its
    /// effect must be settled by `resume` first).
    pub fn interrupted_at_rest(&self) -> bool {
        matches!(self.pc.phase, Phase::Cancelled | Phase::Planning | Phase::ToolCall | Phase::AwaitingApproval)
    }

    /// End the turn in progress before an undo reverts it, as a new prompt
    /// ends a cancelled turn: the calls it never ran are settled as
    /// rejected, a `turnEnded` entry says why, and the pc is Final, in one
    /// line. No model is asked. Refused while a call executes
    /// ([`Session::interrupted_at_rest`]). Returns whether a turn was ended.
    pub fn end_interrupted(&mut self, why: &str) -> Result<bool, TurnError> {
        if !self.pc.in_progress() {
            return Ok(false);
        }
        if !self.interrupted_at_rest() {
            return Err(TurnError::NeedsResume(self.pc.phase));
        }
        let inner = match self.pc.phase {
            Phase::Cancelled => self.pc.resume.as_deref().cloned(),
            _ => Some(self.pc.clone()),
        };
        let mut b = self.tx();
        if let Some(inner) = &inner {
            self.abandon_calls(inner, &mut b)?;
        }
        if self.pc.phase == Phase::Planning {
            b.delete(OP_NS, PROVIDER_OP);
        }
        b.entry(&TurnEndedPayload { turn_id: self.pc.turn.clone().unwrap_or_default(), reason: why.to_owned() })?;
        let mut pc = self.pc.to(Phase::Final)?;
        pc.assistant = None;
        pc.invocation = None;
        self.commit(b, Some(pc), &mut |_: &TurnEvent| {})?;
        Ok(true)
    }

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
