//! Approvals that wait durably: a headless worker's Write call that no
//! allow rule covers becomes a `cairn_approvals` row, answered by any host
//! (`cairn approve --database …`), while the turn waits with the call's
//! intent committed as `AwaitingApproval`. If the worker dies meanwhile, the
//! worker that takes over resumes the turn, asks again, and finds the same
//! row (answered or still pending): the question is data, not a prompt on
//! some terminal.
//!
//! A subagent's question (its family runs within the top-level session's
//! lease) is a row of the top-level session named as the 9P face names it,
//! `i5+i3`: `cairn approve SESSION i5+i3`.
//!
//! It owns the question rows and [`DbApprover`], which a worker puts under
//! core's `PolicyApprover` (allow rules and `--yes` are decided there). It
//! must never approve a Destructive call or a sandbox bypass: it is not
//! interactive, so core's gate refuses those before asking, and `decide`
//! asks the same gate again should it ever be asked one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cairn_core::approval::{Answer, ApprovalError, ApprovalRequest, Approver, Asker, Verdict, gate};
use postgres::Client;

use crate::PgError;

/// The notification channel of answers.
pub const CHANNEL: &str = "cairn_approvals";

/// A question waiting for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The session.
    pub session: String,
    /// The call's invocation id.
    pub invocation: String,
    /// The tool.
    pub tool: String,
    /// Its arguments (JSON text).
    pub arguments: String,
    /// When it was asked (server time, text).
    pub asked_at: String,
}

/// Every unanswered question, oldest first.
pub fn pending(client: &mut Client) -> Result<Vec<Pending>, PgError> {
    Ok(client
        .query(
            "SELECT session_id, invocation_id, tool, arguments, to_char(asked_at, 'YYYY-MM-DD HH24:MI:SS')
             FROM cairn_approvals WHERE decision IS NULL ORDER BY asked_at, session_id, invocation_id",
            &[],
        )?
        .iter()
        .map(|r| Pending {
            session: r.get(0),
            invocation: r.get(1),
            tool: r.get(2),
            arguments: r.get(3),
            asked_at: r.get(4),
        })
        .collect())
}

/// Answer a pending question; false when there is none (unknown, or
/// answered already: the first answer stands).
pub fn answer(
    client: &mut Client,
    session: &str,
    invocation: &str,
    approve: bool,
    reason: Option<&str>,
    by: &str,
) -> Result<bool, PgError> {
    let mut tx = client.transaction()?;
    let decision = if approve { "approve" } else { "deny" };
    let n = tx.execute(
        "UPDATE cairn_approvals SET decision = $3, reason = $4, answered_by = $5, answered_at = now()
         WHERE session_id = $1 AND invocation_id = $2 AND decision IS NULL",
        &[&session, &invocation, &decision, &reason, &by],
    )?;
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &session])?;
    tx.commit()?;
    Ok(n == 1)
}

/// The person of a headless worker: a durable question answered through
/// any host (allow rules and `--yes` answer first, in `PolicyApprover`).
pub struct DbApprover {
    url: String,
    session: String,
    lost: Arc<AtomicBool>,
    cancel: Option<cairn_core::CancelToken>,
    client: Option<Client>,
}

impl std::fmt::Debug for DbApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbApprover").field("session", &self.session).finish_non_exhaustive()
    }
}

impl DbApprover {
    /// For `session`; stops waiting once `lost` is set (the worker lost its
    /// lease: the turn cannot commit anyway).
    pub fn new(url: impl Into<String>, session: impl Into<String>, lost: Arc<AtomicBool>) -> Self {
        Self { url: url.into(), session: session.into(), lost, cancel: None, client: None }
    }

    /// Also stop waiting once the turn's `cancel` token is set (the worker
    /// cancels a turn whose lease may be ending).
    #[must_use]
    pub fn with_cancel(mut self, cancel: cairn_core::CancelToken) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// One look: ask (once) and read the answer, if any.
    fn poll(&mut self, request: &ApprovalRequest<'_>) -> Result<Option<Verdict>, PgError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            let mut c = crate::connect(&self.url)?;
            c.batch_execute(&format!("LISTEN {CHANNEL}"))?;
            self.client = None;
            self.client = Some(c);
        }
        let Some(c) = self.client.as_mut() else { return Ok(None) };
        let arguments = request.arguments.to_string();
        // A subagent's call is asked as its parent's question `i5+i3` (call
        // i3 of the child spawned by i5), never colliding with the
        // parent's own invocation ids.
        let question = request.question_id(&self.session);
        c.execute(
            "INSERT INTO cairn_approvals (session_id, invocation_id, tool, arguments) VALUES ($1, $2, $3, $4)
             ON CONFLICT (session_id, invocation_id) DO NOTHING",
            &[&self.session, &question, &request.tool, &arguments],
        )?;
        let row = c.query_opt(
            "SELECT decision, reason, answered_by FROM cairn_approvals
             WHERE session_id = $1 AND invocation_id = $2 AND decision IS NOT NULL",
            &[&self.session, &question],
        )?;
        Ok(row.map(|r| {
            let decision: String = r.get(0);
            let reason: Option<String> = r.get(1);
            let by: Option<String> = r.get(2);
            let by = format!("user:{}", by.unwrap_or_else(|| "database".to_owned()));
            if decision == "approve" {
                Verdict { decision: Answer::Approve, by }
            } else {
                Verdict {
                    decision: Answer::Deny { reason: reason.unwrap_or_else(|| "denied by a person".to_owned()) },
                    by,
                }
            }
        }))
    }
}

impl Approver for DbApprover {
    fn is_interactive(&self) -> bool {
        // Not a person at hand: the gate refuses Destructive calls and
        // bypasses before asking.
        false
    }

    fn answers_writes(&self) -> bool {
        // A person answers the question row, later and from any host.
        true
    }

    fn decide(&mut self, request: &ApprovalRequest<'_>) -> Result<Verdict, ApprovalError> {
        if let Err(refusal) = gate(request.gated(), Asker::of(&*self)) {
            return Ok(refusal);
        }
        loop {
            if self.lost.load(Ordering::SeqCst) {
                return Err(ApprovalError::Unavailable("the worker lost its lease while waiting".to_owned()));
            }
            if self.cancel.as_ref().is_some_and(cairn_core::CancelToken::is_cancelled) {
                return Err(ApprovalError::Unavailable("the turn was cancelled while waiting".to_owned()));
            }
            match self.poll(request) {
                Ok(Some(verdict)) => return Ok(verdict),
                Ok(None) => {
                    if let Some(c) = self.client.as_mut()
                        && crate::lease::wait(c, Duration::from_secs(1)).is_err()
                    {
                        self.client = None;
                    }
                }
                Err(_) => {
                    // The database is away (restart): try again shortly.
                    self.client = None;
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
    }
}
