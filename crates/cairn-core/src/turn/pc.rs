//! The turn's program counter: the phases of the tole state machine and the
//! table of legal transitions.
//!
//! The pc is the value of the session's singleton state; every change is a
//! compare-and-swap on the state's seq, made in the same commit as the
//! entries that justify it. `Settling` is never stored: it is the settlement
//! commit itself, which moves `Executing` through `Settling` to the next
//! phase in one line (both steps are checked against the table).
//!
//! This module owns no I/O; it only says which moves are legal.

use serde::{Deserialize, Serialize};

use crate::storage::RawJson;

/// A phase of the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// No turn yet.
    Idle,
    /// A provider call is outstanding (its intent is committed).
    Planning,
    /// The next tool call of the settled assistant message is due.
    ToolCall,
    /// The intent of a call is committed; a person is being asked.
    AwaitingApproval,
    /// The call was approved; its effect runs (or ran, unsettled).
    Executing,
    /// The settlement is being written (transient, never stored).
    Settling,
    /// The turn ended.
    Final,
    /// The turn was cancelled; `resume` continues it.
    Cancelled,
}

/// The program counter stored in the session state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pc {
    /// The phase.
    pub phase: Phase,
    /// The turn in progress (or last finished).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<String>,
    /// The lane the turn runs on.
    pub lane: String,
    /// Provider calls made in this turn so far (including the outstanding one).
    #[serde(default)]
    pub step: u32,
    /// The assistant message whose tool calls are being run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assistant: Option<String>,
    /// Index of the next tool call of that message.
    #[serde(default)]
    pub call: usize,
    /// The invocation in flight (AwaitingApproval, Executing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation: Option<String>,
    /// For `Cancelled`: where a resume continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Box<Pc>>,
    /// For `Final`: a `pre_tool` hook stopped the turn (Claude Code's
    /// `continue: false`), with its reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// A move the state machine does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal turn transition {from:?} → {to:?}")]
pub struct TransitionError {
    /// From.
    pub from: Phase,
    /// To.
    pub to: Phase,
}

/// Whether `from → to` is a legal move.
pub fn legal(from: Phase, to: Phase) -> bool {
    use Phase::*;
    matches!(
        (from, to),
        (Idle | Final | Cancelled, Planning)
            | (Planning, ToolCall | Final | Cancelled)
            | (ToolCall, AwaitingApproval | Executing | ToolCall | Planning | Final | Cancelled)
            | (AwaitingApproval, Executing | ToolCall | Planning | Final | Cancelled)
            | (Executing, Settling | Planning)
            | (Settling, ToolCall | Planning | Final | Cancelled)
            | (Cancelled, ToolCall | AwaitingApproval | Final)
    )
}

impl Pc {
    /// The pc of a session that never ran a turn.
    pub fn idle(lane: &str) -> Self {
        Self {
            phase: Phase::Idle,
            turn: None,
            lane: lane.to_owned(),
            step: 0,
            assistant: None,
            call: 0,
            invocation: None,
            resume: None,
            stopped: None,
        }
    }

    /// This pc moved to `to` (other fields unchanged), if legal.
    pub fn to(&self, to: Phase) -> Result<Pc, TransitionError> {
        if !legal(self.phase, to) {
            return Err(TransitionError { from: self.phase, to });
        }
        let mut next = self.clone();
        next.phase = to;
        if to != Phase::Cancelled {
            next.resume = None;
        }
        if to != Phase::Final {
            next.stopped = None;
        }
        Ok(next)
    }

    /// Whether a turn is in progress (anything but Idle and Final).
    pub fn in_progress(&self) -> bool {
        !matches!(self.phase, Phase::Idle | Phase::Final)
    }

    /// Decode from the state's raw JSON.
    pub fn decode(raw: &RawJson) -> Result<Self, serde_json::Error> {
        raw.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_table() {
        use Phase::*;
        let all = [Idle, Planning, ToolCall, AwaitingApproval, Executing, Settling, Final, Cancelled];
        let legal_moves = [
            (Idle, Planning),
            (Planning, ToolCall),
            (Planning, Final),
            (ToolCall, AwaitingApproval),
            (ToolCall, Executing),
            (AwaitingApproval, Executing),
            (AwaitingApproval, Planning),
            (Executing, Settling),
            (Settling, Planning),
            (Final, Planning),
            (Cancelled, Planning),
            (Cancelled, Final),
        ];
        for (from, to) in legal_moves {
            assert!(legal(from, to), "{from:?} → {to:?} should be legal");
        }
        let illegal = [
            (Idle, Executing),
            (Idle, Final),
            (Planning, Executing),
            (Executing, Final),
            (Executing, ToolCall),
            (Executing, Cancelled),
            (Final, Executing),
            (Settling, Executing),
            (ToolCall, Settling),
        ];
        for (from, to) in illegal {
            assert!(!legal(from, to), "{from:?} → {to:?} should be illegal");
        }
        // Nothing moves into Idle, nothing but Executing moves into Settling.
        for from in all {
            assert!(!legal(from, Idle));
            assert_eq!(legal(from, Settling), from == Executing);
        }
        let pc = Pc::idle("main");
        assert_eq!(pc.to(Executing).unwrap_err(), TransitionError { from: Idle, to: Executing });
        assert_eq!(pc.to(Planning).unwrap().phase, Planning);
    }
}
