//! The approver of turns the server runs: a call that needs a person is
//! shown as a file in `s/<id>/approvals/` and waits until someone writes
//! `y`, `n` or `a` to it. It is the only interactive approver of the tree,
//! so it is the only way a Destructive call or a sandbox bypass is
//! approved over 9P.
//!
//! Must not: decide anything itself (the allow rules, `yes=1` and the
//! ReadOnly policy are `PolicyApprover`'s, the Destructive rule and what
//! may be remembered are `approval::gate`'s).

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, sync_channel};
use std::time::Duration;

use cairn_core::CancelToken;
use cairn_core::approval::{Answer, ApprovalError, ApprovalRequest, Approver, Verdict};
use cairn_core::tool::{Preview, Risk};

/// An approval waiting for a person.
#[derive(Debug)]
pub struct PendingApproval {
    /// What reading the file shows.
    pub text: String,
    /// Whether `a` (allow for the session) may be answered.
    pub session_allowed: bool,
    /// Where the answer goes.
    pub answer: std::sync::mpsc::SyncSender<Answer>,
}

/// Where a question is shown and withdrawn: a session's `approvals/`
/// directory (`live.rs` implements it). The approver needs nothing else of
/// the tree.
pub trait ApprovalBoard: std::fmt::Debug {
    /// Show `pending` as `approvals/<invocation_id>`; `phase` is the
    /// session's new state line.
    fn post(&self, invocation_id: &str, pending: PendingApproval, phase: String);
    /// Remove the question.
    fn withdraw(&self, invocation_id: &str);
}

/// Asks through `approvals/`.
#[derive(Debug)]
pub struct TreeApprover {
    board: Arc<dyn ApprovalBoard + Send + Sync>,
    cancel: CancelToken,
    /// The session whose `approvals/` this is (its subagents' questions
    /// are named apart: `ApprovalRequest::question_id`).
    session_id: String,
}

impl TreeApprover {
    /// The approver of session `session_id`'s turns, asking on `board`.
    pub fn new(board: Arc<dyn ApprovalBoard + Send + Sync>, cancel: CancelToken, session_id: String) -> Self {
        Self { board, cancel, session_id }
    }
}

/// What reading an approval file shows.
pub fn describe(request: &ApprovalRequest<'_>, asking: &str) -> String {
    let risk = match request.risk {
        Risk::ReadOnly => "read-only",
        Risk::Write => "write",
        Risk::Destructive => "DESTRUCTIVE",
    };
    let mut out = String::new();
    let _ = writeln!(out, "tool: {}", request.tool);
    let _ = writeln!(out, "risk: {risk}");
    let _ = writeln!(out, "invocation: {}", request.invocation_id);
    if request.session_id != asking {
        // A subagent's call, asked of its parent's person.
        let _ = writeln!(out, "session: {} (a subagent of this session)", request.session_id);
    }
    let _ = writeln!(out, "cwd: {}", request.cwd.display());
    if let Some(bypass) = request.bypass {
        let _ = writeln!(out, "sandbox bypass: {bypass}");
    }
    let _ = writeln!(out, "args: {}", request.arguments);
    match request.preview {
        Some(Preview::Command { command, cwd }) => {
            let _ = writeln!(out, "command: {command}");
            let _ = writeln!(out, "in: {cwd}");
        }
        Some(Preview::Diff { path, diff }) => {
            let _ = writeln!(out, "diff of {path}:");
            out.push_str(diff);
            if !diff.ends_with('\n') {
                out.push('\n');
            }
        }
        Some(Preview::Paths { paths }) => {
            let _ = writeln!(out, "writes: {}", paths.join(", "));
        }
        Some(Preview::Text { text }) => {
            let _ = writeln!(out, "{text}");
        }
        None => {}
    }
    let always = request.may_remember();
    let _ = writeln!(
        out,
        "answer: write {} to this file",
        if always { "y, n or a (allow this tool for the session)" } else { "y or n" }
    );
    out
}

impl Approver for TreeApprover {
    fn is_interactive(&self) -> bool {
        true
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        let (tx, rx) = sync_channel(1);
        let pending = PendingApproval {
            text: describe(request, &self.session_id),
            session_allowed: request.may_remember(),
            answer: tx,
        };
        let name = request.question_id(&self.session_id);
        self.board.post(&name, pending, format!("awaiting approval: {}", request.tool));
        let result = loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(decision) => break Ok(Verdict { decision, by: "user:9p".to_owned() }),
                Err(RecvTimeoutError::Timeout) if self.cancel.is_cancelled() => {
                    break Err(ApprovalError::Unavailable(
                        "the turn was stopped while waiting for approval".to_owned(),
                    ));
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    break Err(ApprovalError::Failed("the approval file went away".to_owned()));
                }
            }
        };
        self.board.withdraw(&name);
        result
    }
}
