//! [`PolicyApprover`]: the approval policy as one approver a host can wire.
//!
//! ReadOnly runs; Write is approved by an allow rule, else by the standing
//! approval of every Write call when the session has one (`--yes`, 9P's
//! `yes=1`, a worker's `--yes`: [`PolicyApprover::approve_writes`]), else
//! asked of the interactive approver, else denied; Destructive is asked of
//! the interactive approver only, never allowlisted, never covered by
//! `--yes`, and denied when no person can answer (the refusal is
//! [`super::gate::gate`]'s, as everywhere). The turn asks the same gate on
//! its own, so a wrong wiring cannot unlock them. Hosts only present
//! questions and relay answers: none of these rules lives in a host.
//!
//! It must not prompt by itself: the interactive part is injected.

use super::gate::{Asker, HEADLESS, gate};
use super::{
    Allowlist, AllowlistApprover, Answer, ApprovalError, ApprovalRequest, Approver, Need, SessionMode, Verdict,
};

/// The policy over an allowlist and an optional interactive approver.
pub struct PolicyApprover {
    allow: AllowlistApprover,
    /// Who approves every Write call no rule covers (`None`: nobody).
    writes: Option<String>,
    interactive: Option<Box<dyn Approver>>,
}

impl std::fmt::Debug for PolicyApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyApprover")
            .field("allow", &self.allow)
            .field("writes", &self.writes)
            .field("interactive", &self.interactive.as_ref().map(|a| a.is_interactive()))
            .finish()
    }
}

impl PolicyApprover {
    /// A policy over `allow`, asking `interactive` (if any) what no rule covers.
    pub fn new(allow: Allowlist, interactive: Option<Box<dyn Approver>>) -> Self {
        Self { allow: AllowlistApprover::new(allow), writes: None, interactive }
    }

    /// Approve every Write call no rule covers, recorded as approved `by`
    /// (`flag:--yes`, `9p:yes=1`, …): the session's standing approval. It
    /// never covers a Destructive call or a sandbox bypass (the gate says
    /// those need a person).
    pub fn approve_writes(mut self, by: impl Into<String>) -> Self {
        self.writes = Some(by.into());
        self
    }

    /// Who approves every Write call no rule covers, if anyone
    /// ([`PolicyApprover::approve_writes`]): a session's children are
    /// given the same standing approval.
    pub fn writes_approved_by(&self) -> Option<&str> {
        self.writes.as_deref()
    }

    /// The allow rules.
    pub fn allowlist(&self) -> &Allowlist {
        self.allow.list()
    }

    /// Ask the injected approver, or deny with `why` when it cannot answer
    /// this (absent, or one that answers no Write call: a host never has to
    /// refuse by itself). What needs a person reaches here only when the
    /// gate found one.
    fn ask(&mut self, request: &ApprovalRequest<'_>, why: String) -> Result<Verdict, ApprovalError> {
        match &mut self.interactive {
            Some(inner) if inner.is_interactive() || inner.answers_writes() => inner.decide(request),
            _ => Ok(Verdict { decision: Answer::Deny { reason: why }, by: HEADLESS.to_owned() }),
        }
    }
}

impl PolicyApprover {
    /// What answers `request`, whose need the gate gave, without asking
    /// anyone: an allow rule, then the standing approval of Write calls.
    fn lookup(&self, need: Need, request: &ApprovalRequest<'_>) -> Option<Verdict> {
        match need {
            Need::Nothing => self.allow.lookup(request),
            Need::RuleOrVerdict => self
                .allow
                .lookup(request)
                .or_else(|| self.writes.as_ref().map(|by| Verdict { decision: Answer::Approve, by: by.clone() })),
            Need::Person => None,
        }
    }
}

impl Approver for PolicyApprover {
    fn is_interactive(&self) -> bool {
        self.interactive.as_ref().is_some_and(|a| a.is_interactive())
    }

    fn answers_writes(&self) -> bool {
        self.writes.is_some() || self.interactive.as_ref().is_some_and(|a| a.answers_writes())
    }

    fn mode(&self) -> SessionMode {
        // The person's: a subagent's policy shares its parent's person, so
        // the parent's plan mode holds for its children too.
        self.interactive.as_ref().map_or(SessionMode::Ask, |a| a.mode())
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        let need = match gate(request.gated(), Asker::of(&*self)) {
            Err(refusal) => return Ok(refusal),
            Ok(Need::Person) => return Ok(Need::Person.bound(self.ask(request, String::new())?)),
            Ok(need) => need,
        };
        if let Some(verdict) = self.lookup(need, request) {
            return Ok(verdict);
        }
        let why = format!(
            "{tool} needs approval: no allow rule covers this call and no person can answer here; allow it \
             (--allow '{tool}' or [approvals] allow), approve every Write call (--yes), or run where a person \
             can answer (a terminal)",
            tool = request.tool
        );
        self.ask(request, why)
    }

    fn pre_approve(&mut self, request: &ApprovalRequest<'_>) -> Option<Verdict> {
        // Whether a person is at hand does not change what a rule covers;
        // the mode does (plan mode refuses what a rule covers).
        let need = gate(request.gated(), Asker { interactive: true, mode: self.mode() }).ok()?;
        self.lookup(need, request)
    }

    fn elicit(&mut self, question: &crate::elicit::Elicitation<'_>) -> crate::elicit::ElicitAnswer {
        // Only a person answers (no rule or flag fills in a form).
        match &mut self.interactive {
            Some(person) if person.is_interactive() => person.elicit(question),
            _ => crate::elicit::nobody(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;
    use crate::tool::Risk;

    /// Records whether it was asked; answers Approve as `user:test`.
    struct Person {
        interactive: bool,
        asked: std::rc::Rc<std::cell::Cell<u32>>,
    }

    impl Approver for Person {
        fn is_interactive(&self) -> bool {
            self.interactive
        }
        fn answers_writes(&self) -> bool {
            true
        }
        fn decide(&mut self, _: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
            self.asked.set(self.asked.get() + 1);
            Ok(Verdict { decision: Answer::Approve, by: "user:test".into() })
        }
    }

    fn request<'a>(risk: Risk, bypass: Option<&'a str>, args: &'a serde_json::Value) -> ApprovalRequest<'a> {
        ApprovalRequest {
            session_id: "s",
            invocation_id: "i",
            tool: "shell",
            risk,
            arguments: args,
            preview: None,
            cwd: Path::new("/"),
            bypass,
            staged: false,
            why: None,
            hook_asks: None,
        }
    }

    #[test]
    fn approving_writes_covers_write_calls_only() {
        let args = json!({"command": "touch x"});
        for interactive in [false, true] {
            let asked = std::rc::Rc::new(std::cell::Cell::new(0));
            let person = Person { interactive, asked: asked.clone() };
            let mut policy = PolicyApprover::new(Allowlist::new(), Some(Box::new(person))).approve_writes("flag:--yes");
            let v = policy.decide(&request(Risk::Write, None, &args)).unwrap();
            assert_eq!(v, Verdict { decision: Answer::Approve, by: "flag:--yes".into() });
            assert_eq!(policy.pre_approve(&request(Risk::Write, None, &args)), Some(v));
            assert_eq!(asked.get(), 0, "--yes answers Write without asking");
            // Destructive and a bypass are never covered: a person answers,
            // or the gate refuses when none can.
            for (risk, bypass) in [(Risk::Destructive, None), (Risk::Write, Some("write /etc"))] {
                assert_eq!(policy.pre_approve(&request(risk, bypass, &args)), None);
                let v = policy.decide(&request(risk, bypass, &args)).unwrap();
                if interactive {
                    assert_eq!(v.by, "user:test");
                } else {
                    assert_eq!(v.by, HEADLESS);
                    assert!(matches!(v.decision, Answer::Deny { .. }));
                }
            }
            assert_eq!(asked.get(), if interactive { 2 } else { 0 });
        }
    }

    /// Answers nothing and is not interactive (a terminal approver without
    /// a terminal).
    struct Nobody;

    impl Approver for Nobody {
        fn is_interactive(&self) -> bool {
            false
        }
        fn decide(&mut self, _: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
            Err(ApprovalError::Failed("asked although it answers nothing".into()))
        }
    }

    #[test]
    fn an_approver_that_answers_nothing_is_never_asked() {
        let args = json!({"path": "a"});
        let mut policy = PolicyApprover::new(Allowlist::new(), Some(Box::new(Nobody)));
        for risk in [Risk::Write, Risk::Destructive] {
            let v = policy.decide(&request(risk, None, &args)).unwrap();
            assert_eq!(v.by, HEADLESS);
            assert!(matches!(v.decision, Answer::Deny { .. }));
        }
        let v = policy.decide(&request(Risk::Write, None, &args)).unwrap();
        assert!(
            matches!(v.decision, Answer::Deny { ref reason } if reason.contains("--yes") && reason.contains("--allow"))
        );
        // A durable asker (answers Write, is no person at hand) is asked
        // for Write and never for Destructive.
        let asked = std::rc::Rc::new(std::cell::Cell::new(0));
        let later = Person { interactive: false, asked: asked.clone() };
        let mut policy = PolicyApprover::new(Allowlist::new(), Some(Box::new(later)));
        assert_eq!(policy.decide(&request(Risk::Write, None, &args)).unwrap().by, "user:test");
        assert_eq!(policy.decide(&request(Risk::Destructive, None, &args)).unwrap().by, HEADLESS);
        assert_eq!(asked.get(), 1);
        // A rule still answers, and ReadOnly runs.
        let mut policy = PolicyApprover::new(Allowlist::parse(["shell"]).unwrap(), None);
        let ls = json!({"command": "ls"});
        assert_eq!(policy.decide(&request(Risk::Write, None, &ls)).unwrap().by, "allowlist:shell");
        assert_eq!(policy.decide(&request(Risk::ReadOnly, None, &ls)).unwrap().by, super::super::gate::READ_ONLY);
    }
}
