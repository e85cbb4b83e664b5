//! The application's approver: a callback that is asked about each call
//! cairn's policy puts to a person ([`Question`] in, yes or no out), as
//! the terminal's y/N prompt is for `cairn run`.
//!
//! Must not: decide which calls reach it. The core's policy does
//! (`cairn_core::approval::PolicyApprover`): ReadOnly calls never ask,
//! Write calls ask unless an allow rule covers them, Destructive calls and
//! Destructive staged effects always ask, whatever the rules say.

use cairn_core::approval::{Answer, ApprovalError, ApprovalRequest, Approver, Verdict};
use cairn_core::risk::Risk;
use cairn_core::tool::Preview;
use serde::Serialize;
use serde_json::Value;

/// One call the application is asked to approve.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Question {
    /// The session whose call it is.
    pub session_id: String,
    /// The call's invocation id within its session.
    pub invocation_id: String,
    /// The tool called.
    pub tool: String,
    /// The call's arguments, validated against the tool's schema.
    pub arguments: Value,
    /// The call's risk tier (a tool may raise it per call, e.g. `shell` for
    /// a recursive delete).
    pub risk: Risk,
    /// What the call would change: a unified diff for a file edit, or a
    /// staged effect's change set and diff (`shell` runs staged: its file
    /// effect is judged by what it did, and is applied only if approved).
    pub diff: Option<String>,
    /// The call runs staged (its effect is held until this answer).
    pub staged: bool,
    /// Why the call is at its tier, when the tool raised it.
    pub reason: Option<String>,
}

impl Question {
    fn of(request: &ApprovalRequest<'_>) -> Self {
        let diff = request.preview.map(|preview| match preview {
            Preview::Diff { path, diff } => format!("{path}\n{diff}"),
            Preview::Command { command, cwd } => format!("$ {command}\nin {cwd}"),
            Preview::Paths { paths } => paths.join("\n"),
            Preview::Text { text } => text.clone(),
        });
        Question {
            session_id: request.session_id.to_owned(),
            invocation_id: request.invocation_id.to_owned(),
            tool: request.tool.to_owned(),
            arguments: request.arguments.clone(),
            risk: request.risk,
            diff,
            staged: request.staged,
            reason: request.why.or(request.hook_asks).map(str::to_owned),
        }
    }
}

/// The approver's callback: `true` approves the call, `false` denies it
/// (the model is told and replans).
pub type ApproveFn = dyn FnMut(&Question) -> bool + Send;

/// The callback as core's `Approver`: interactive, so Destructive calls
/// reach it.
pub(crate) struct CallbackApprover(pub(crate) Box<ApproveFn>);

impl Approver for CallbackApprover {
    fn is_interactive(&self) -> bool {
        true
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        let question = Question::of(request);
        let decision = if (self.0)(&question) {
            Answer::Approve
        } else {
            Answer::Deny { reason: format!("the application denied this {} call", request.tool) }
        };
        Ok(Verdict { decision, by: "embedder:approve".to_owned() })
    }
}
