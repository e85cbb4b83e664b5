//! Approvals: the [`Approver`] trait through which every non-ReadOnly call
//! passes, in one place.
//!
//! The policy: ReadOnly runs; Write asks unless allowlisted; Destructive
//! always asks an *interactive* approver and is never allowlisted, and so
//! does a sandbox bypass and a call a `pre_tool` hook put to a person; in
//! plan mode ([`SessionMode::Plan`]) only ReadOnly calls run. What a request needs, and the refusal when no
//! person can answer, is decided in one function, [`gate::gate`], which the
//! registry, the turn, the effect and the approvers all call. Interactive
//! approvers (a y/N prompt, a 9P approval file) live in hosts; the core
//! only receives them through this trait.
//!
//! Layout: [`gate`] (the approval gate and what a session may remember),
//! [`cmdline`] parses shell command lines for [`allowlist`], whose rules and
//! [`AllowlistApprover`] answer without asking anyone; [`PolicyApprover`]
//! combines an allowlist with an interactive approver.

pub mod allowlist;
pub mod cmdline;
pub mod gate;
pub mod indirection;
mod policy;
mod shared;

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::storage::FAMILY_SEP;
use crate::tool::{Preview, Risk};

/// What an approver is asked about.
#[derive(Debug, Clone, Copy)]
pub struct ApprovalRequest<'a> {
    /// The session whose call this is (a subagent's, when its parent's
    /// person is asked: `approval::SharedApprover`).
    pub session_id: &'a str,
    /// cairn's invocation id (unique within its session).
    pub invocation_id: &'a str,
    /// Tool name.
    pub tool: &'a str,
    /// The risk of this call.
    pub risk: Risk,
    /// The validated arguments.
    pub arguments: &'a Value,
    /// A preview a person can judge (diff, command, paths).
    pub preview: Option<&'a Preview>,
    /// The session's working directory.
    pub cwd: &'a Path,
    /// For a sandbox bypass request: what access outside the rules is asked.
    pub bypass: Option<&'a str>,
    /// The call runs staged (`Tool::stages_effect`): its file effect is
    /// judged by what it did, and a Destructive effect asks a person, before
    /// anything is applied. A rule naming the whole tool then covers a
    /// command line no pattern can read.
    pub staged: bool,
    /// Why the call is at its risk, when the tool raised it above its
    /// spec's (`Tool::risk_reason`: the destructive pattern it matched, a
    /// command that cannot be classified), for the person asked.
    pub why: Option<&'a str>,
    /// A `pre_tool` hook asked that a person approve this call (its
    /// reason): no rule, flag or remembered approval answers it.
    pub hook_asks: Option<&'a str>,
}

impl<'a> ApprovalRequest<'a> {
    /// How a person asked through `asking`'s face (a terminal, a 9P
    /// `approvals/` file, an editor's permission request) names this call:
    /// the invocation id for `asking`'s own call; for a call of one of its
    /// subagents (ids `<asking>+<invocation>[+…]`), the descendant's part
    /// of its id, `+`, then the invocation (`i5+i3`: call i3 of the child
    /// spawned by i5), so it never collides with the parent's own ids.
    pub fn question_id(&self, asking: &str) -> String {
        match self.session_id.strip_prefix(asking).and_then(|rest| rest.strip_prefix(FAMILY_SEP)) {
            Some(descendant) if !descendant.is_empty() => format!("{descendant}{FAMILY_SEP}{}", self.invocation_id),
            _ => self.invocation_id.to_owned(),
        }
    }

    /// Whether this is a call of a subagent of `asking` (see
    /// [`ApprovalRequest::question_id`]).
    pub fn is_of_descendant(&self, asking: &str) -> bool {
        self.session_id != asking && self.session_id.strip_prefix(asking).is_some_and(|r| r.starts_with(FAMILY_SEP))
    }

    /// Whether the person asked may answer "approve for this session"
    /// ([`gate::may_remember`]).
    pub fn may_remember(&self) -> bool {
        gate::may_remember(self.gated())
    }

    /// What the gate judges of this request.
    pub fn gated(&self) -> gate::Gated<'a> {
        gate::Gated { tool: self.tool, risk: self.risk, bypass: self.bypass, hook_asks: self.hook_asks }
    }
}

/// A mode a face put the session in (ACP's `session/set_mode`), which the
/// gate reads on every call ([`gate::gate`]). Only [`SessionMode::Plan`]
/// narrows authority there; `AutoEdit` is the face's approver's to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionMode {
    /// Every call the policy puts to a person is asked.
    #[default]
    Ask,
    /// File edits run without asking (the face's approver decides).
    AutoEdit,
    /// Read only: every call that could change something is refused.
    Plan,
}

impl SessionMode {
    /// The mode as Claude Code names it in a hook's `permission_mode`.
    pub fn claude_code_name(self) -> &'static str {
        match self {
            SessionMode::Ask => "default",
            SessionMode::AutoEdit => "acceptEdits",
            SessionMode::Plan => "plan",
        }
    }
}

/// An approver's answer (recorded under the key `decision`). Not to be
/// confused with the sandbox's decision in cairn-tools, which says how a
/// process is confined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "camelCase")]
pub enum Answer {
    /// Run this call.
    Approve,
    /// Run this call and allow the same tool for the rest of the session
    /// (honoured for Write tools only; Destructive is never remembered).
    ApproveForSession,
    /// Do not run; the model is told the reason and replans.
    Deny {
        /// Why, shown to the model.
        reason: String,
    },
}

/// An answer and who gave it (a rule, a person, a policy), for the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// The answer.
    #[serde(flatten)]
    pub decision: Answer,
    /// Which rule or who decided (e.g. "allowlist:shell(ls *)", "user:tty").
    pub by: String,
}

/// Why an approver could not answer. The turn settles the call as
/// `Rejected` with this reason; it never aborts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// The approver has no way to ask (e.g. no terminal).
    #[error("no interactive approver is available: {0}")]
    Unavailable(String),
    /// The approver failed.
    #[error("approver failed: {0}")]
    Failed(String),
}

/// Decides whether a call may run.
pub trait Approver {
    /// Whether a person answers (required for Destructive calls).
    fn is_interactive(&self) -> bool;
    /// Whether someone answers a Write call no rule covers: a person at
    /// hand, or a durable question a person answers later (a PostgreSQL
    /// worker's). [`PolicyApprover`] asks only an approver that does, so no
    /// host has to refuse by itself. Default: [`Approver::is_interactive`].
    fn answers_writes(&self) -> bool {
        self.is_interactive()
    }
    /// The mode the session is in now ([`SessionMode`]); an approver that
    /// wraps or shares another says that one's. Default: `Ask`.
    fn mode(&self) -> SessionMode {
        SessionMode::Ask
    }
    /// Decide on one request.
    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError>;

    /// A verdict available without asking anyone (a matching allow rule,
    /// the ReadOnly policy). When it returns `Some`, the turn commits the
    /// intent and the start of the call in one line; when `None`, it
    /// commits the intent first (`AwaitingApproval`) and then calls
    /// [`Approver::decide`]. The default knows nothing.
    fn pre_approve(&mut self, request: &ApprovalRequest<'_>) -> Option<Verdict> {
        let _ = request;
        None
    }

    /// Put a running tool's question for structured input to the person
    /// (`crate::elicit`). An approver that wraps another forwards it; one
    /// with nobody to ask declines, saying so (the default).
    fn elicit(&mut self, question: &crate::elicit::Elicitation<'_>) -> crate::elicit::ElicitAnswer {
        let _ = question;
        crate::elicit::nobody()
    }
}

pub use allowlist::{AllowRule, AllowRuleError, Allowlist, AllowlistApprover};
pub use gate::{Asker, Gated, Need, gate};
pub use policy::PolicyApprover;
pub use shared::SharedApprover;
