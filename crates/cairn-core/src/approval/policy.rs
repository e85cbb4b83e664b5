//! [`PolicyApprover`]: the approval policy as one approver a host can wire.
//!
//! ReadOnly runs; Write is approved by an allow rule, else asked of the
//! interactive approver, else denied; Destructive is asked of the
//! interactive approver only, never allowlisted, and denied when no person
//! can answer. The turn enforces the Destructive rules again on its own, so
//! a wrong wiring cannot unlock them.
//!
//! It must not prompt by itself: the interactive part is injected.

use super::{Allowlist, AllowlistApprover, ApprovalError, ApprovalRequest, Approver, Decision, Verdict};
use crate::tool::Risk;

/// The policy over an allowlist and an optional interactive approver.
pub struct PolicyApprover {
    allow: AllowlistApprover,
    interactive: Option<Box<dyn Approver>>,
}

impl std::fmt::Debug for PolicyApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyApprover")
            .field("allow", &self.allow)
            .field("interactive", &self.interactive.as_ref().map(|a| a.is_interactive()))
            .finish()
    }
}

impl PolicyApprover {
    /// A policy over `allow`, asking `interactive` (if any) what no rule covers.
    pub fn new(allow: Allowlist, interactive: Option<Box<dyn Approver>>) -> Self {
        Self { allow: AllowlistApprover::new(allow), interactive }
    }

    fn ask(&mut self, request: &ApprovalRequest<'_>, why: String) -> Result<Verdict, ApprovalError> {
        match &mut self.interactive {
            Some(inner) => inner.decide(request),
            None => Ok(Verdict { decision: Decision::Deny { reason: why }, by: "policy:headless".to_owned() }),
        }
    }
}

impl Approver for PolicyApprover {
    fn is_interactive(&self) -> bool {
        self.interactive.as_ref().is_some_and(|a| a.is_interactive())
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        if request.bypass.is_some() || request.risk == Risk::Destructive {
            if !self.is_interactive() {
                return Ok(Verdict {
                    decision: Decision::Deny {
                        reason: format!(
                            "{} needs a person's approval and no interactive approver is available; run cairn in a terminal to approve it",
                            request.tool
                        ),
                    },
                    by: "policy:headless".to_owned(),
                });
            }
            let mut verdict = self.ask(request, String::new())?;
            if verdict.decision == Decision::ApproveForSession {
                verdict.decision = Decision::Approve;
            }
            return Ok(verdict);
        }
        if let Some(verdict) = self.allow.lookup(request) {
            return Ok(verdict);
        }
        let why = format!(
            "no allow rule covers this {} call and no interactive approver is available; add an allow rule or run in a terminal",
            request.tool
        );
        self.ask(request, why)
    }

    fn pre_approve(&mut self, request: &ApprovalRequest<'_>) -> Option<Verdict> {
        self.allow.lookup(request)
    }
}
