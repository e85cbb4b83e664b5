//! The one place a turn's question to its approver is announced: every
//! `decide` of the approver a turn hands out (the call's approval, a
//! sandbox bypass, a Destructive staged effect) first tells the observer
//! `ApprovalAsked`, so a face can show the question as the question (the
//! terminal stops its spinner, 9P's status says "awaiting approval") —
//! an ask path added later goes through this wrapper and cannot forget.
//!
//! It must not decide anything: it forwards every call to the approver it
//! wraps.

use crate::approval::{ApprovalError, ApprovalRequest, Approver, Verdict};
use crate::events::TurnEvent;

/// `approver`, announcing each question to `announce` before it is put.
pub(crate) struct Announced<'a> {
    /// Who answers.
    pub(crate) approver: &'a mut dyn Approver,
    /// Told `ApprovalAsked` before each `decide`.
    pub(crate) announce: &'a mut dyn FnMut(&TurnEvent),
}

impl Approver for Announced<'_> {
    fn is_interactive(&self) -> bool {
        self.approver.is_interactive()
    }

    fn answers_writes(&self) -> bool {
        self.approver.answers_writes()
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        // Not an entry: a person is being asked right now.
        (self.announce)(&TurnEvent::ApprovalAsked {
            invocation_id: request.invocation_id.to_owned(),
            tool: request.tool.to_owned(),
            risk: request.risk,
            preview: request.preview.cloned(),
        });
        self.approver.decide(request)
    }

    fn pre_approve(&mut self, request: &ApprovalRequest<'_>) -> Option<Verdict> {
        // Answered without asking anyone: nothing to announce.
        self.approver.pre_approve(request)
    }

    fn elicit(&mut self, question: &crate::elicit::Elicitation<'_>) -> crate::elicit::ElicitAnswer {
        self.approver.elicit(question)
    }
}
