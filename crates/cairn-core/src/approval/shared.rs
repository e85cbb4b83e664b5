//! One person's approver shared by a session and the children it spawns
//! (subagents): a child's call that needs a person goes to the same
//! person as its parent's, through the same face (a terminal, a 9P
//! `approvals/` directory, an editor's permission request), one question
//! at a time. Owns only the sharing; it must not decide anything itself
//! (the gate and the policy do, around it).

use std::sync::{Arc, Mutex};

use super::{ApprovalError, ApprovalRequest, Approver, SessionMode, Verdict};

/// An approver behind a lock, cloned into every session of a family.
#[derive(Clone)]
pub struct SharedApprover(Arc<Mutex<Box<dyn Approver + Send>>>);

impl std::fmt::Debug for SharedApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedApprover").field(&self.is_interactive()).finish()
    }
}

impl SharedApprover {
    /// Share `inner`.
    pub fn new(inner: Box<dyn Approver + Send>) -> Self {
        Self(Arc::new(Mutex::new(inner)))
    }
}

impl Approver for SharedApprover {
    fn is_interactive(&self) -> bool {
        self.0.lock().map(|a| a.is_interactive()).unwrap_or(false)
    }

    fn answers_writes(&self) -> bool {
        self.0.lock().map(|a| a.answers_writes()).unwrap_or(false)
    }

    fn mode(&self) -> SessionMode {
        // A poisoned lock: the narrowest mode (nothing is asked then anyway).
        self.0.lock().map(|a| a.mode()).unwrap_or(SessionMode::Plan)
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        match self.0.lock() {
            Ok(mut inner) => inner.decide(request),
            // A panic while another session of the family was asking: no
            // one can be asked safely any more.
            Err(_) => Err(ApprovalError::Unavailable("the approver failed earlier in another session".to_owned())),
        }
    }

    fn elicit(&mut self, question: &crate::elicit::Elicitation<'_>) -> crate::elicit::ElicitAnswer {
        match self.0.lock() {
            Ok(mut inner) => inner.elicit(question),
            Err(_) => crate::elicit::ElicitAnswer::Decline(
                "the approver failed earlier in another session; nobody can answer".to_owned(),
            ),
        }
    }
}
