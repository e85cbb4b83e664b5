//! [`PolicyApprover`]: the approval policy as one approver a host can wire.
//!
//! ReadOnly runs; Write is approved by an allow rule, else asked of the
//! interactive approver, else denied; Destructive is asked of the
//! interactive approver only, never allowlisted, and denied when no person
//! can answer (the refusal is [`super::gate::gate`]'s, as everywhere). The
//! turn asks the same gate on its own, so a wrong wiring cannot unlock them.
//!
//! It must not prompt by itself: the interactive part is injected.

use super::gate::{HEADLESS, gate};
use super::{Allowlist, AllowlistApprover, Answer, ApprovalError, ApprovalRequest, Approver, Need, Verdict};

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
            None => Ok(Verdict { decision: Answer::Deny { reason: why }, by: HEADLESS.to_owned() }),
        }
    }
}

impl Approver for PolicyApprover {
    fn is_interactive(&self) -> bool {
        self.interactive.as_ref().is_some_and(|a| a.is_interactive())
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        match gate(request.tool, request.risk, request.bypass, self.is_interactive()) {
            Err(refusal) => return Ok(refusal),
            Ok(Need::Person) => return Ok(Need::Person.bound(self.ask(request, String::new())?)),
            Ok(Need::Nothing | Need::RuleOrVerdict) => {}
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
