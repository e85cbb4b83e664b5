//! Test approvers: one that answers from a script (and counts what it was
//! asked), one that always approves, and one that always fails.

use std::collections::VecDeque;

use cairn_core::approval::{Answer, ApprovalError, ApprovalRequest, Approver, Verdict};

/// Answers from a queue of decisions (then denies), recording every ask.
#[derive(Debug, Default)]
pub struct ScriptedApprover {
    answers: VecDeque<Answer>,
    interactive: bool,
    /// Tool names asked about, in order.
    pub asked: Vec<String>,
}

impl ScriptedApprover {
    /// An approver giving `answers` in order; `interactive` says whether it
    /// stands for a person.
    pub fn new(interactive: bool, answers: impl IntoIterator<Item = Answer>) -> Self {
        Self { answers: answers.into_iter().collect(), interactive, asked: Vec::new() }
    }
}

impl Approver for ScriptedApprover {
    fn is_interactive(&self) -> bool {
        self.interactive
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        self.asked.push(request.tool.to_owned());
        let decision = self
            .answers
            .pop_front()
            .unwrap_or(Answer::Deny { reason: "the test approver ran out of answers".to_owned() });
        Ok(Verdict { decision, by: "user:test".to_owned() })
    }
}

/// Fails every decision (an approver whose terminal went away).
#[derive(Debug, Default)]
pub struct ErrApprover {
    /// Whether it claims to be interactive.
    pub interactive: bool,
    /// How many times it was asked.
    pub asked: usize,
}

impl Approver for ErrApprover {
    fn is_interactive(&self) -> bool {
        self.interactive
    }

    fn decide(&mut self, _request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        self.asked += 1;
        Err(ApprovalError::Failed("the approval channel closed".to_owned()))
    }
}

/// Approves everything, standing for a person who always says yes (used by
/// crash tests to separate the intent commit from the start commit).
#[derive(Debug, Default)]
pub struct YesApprover {
    /// How many times it was asked.
    pub asked: usize,
}

impl Approver for YesApprover {
    fn is_interactive(&self) -> bool {
        true
    }

    fn decide(&mut self, _request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        self.asked += 1;
        Ok(Verdict { decision: Answer::Approve, by: "user:yes".to_owned() })
    }
}
