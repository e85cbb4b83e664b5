//! Running one tool effect with the session's limits: a per-call
//! cancellation token that a watchdog thread sets on the timeout or when the
//! host cancels, output chunks streamed to the observer (never buffered),
//! sandbox-bypass requests put through the approval gate and the approver,
//! each verdict handed to the caller to commit before the tool learns it,
//! and the output cap applied to the receipt.
//!
//! A panicking tool is caught and settled as failed. Timeouts are
//! cooperative: a tool must honour its token (cairn-tools kills the process
//! group). It must not commit anything itself: the caller records bypass
//! verdicts and settles.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::TurnError;
use super::asked::Announced;
use crate::CancelToken;
use crate::approval::gate::PLAN_MODE;
use crate::approval::{Answer, ApprovalRequest, Approver, Asker, Gated, Verdict, gate};
use crate::events::{BypassRecord, ToolStagedPayload, TurnEvent, VerdictRecord};
use crate::staged::{StagedDecision, StagedReview};
use crate::storage::{Storage, now_millis};
use crate::tool::{Preview, Risk, Tool, ToolContext, ToolError, ToolLimits, ToolReceipt, ToolRequest};

/// The precondition of every effect, checked immediately before it starts
/// (a tool's run, a re-run on resume, a staged change set's apply, a
/// command re-run after an approved bypass): the turn is not cancelled,
/// and the store may still act ([`Storage::may_act`]: a worker's lease is
/// held with margin, so a commit whose reply came late cannot be followed
/// by an effect another holder does not know of). `Err` says why not;
/// nothing was started.
pub(crate) fn precondition<S: Storage + ?Sized>(store: &S, cancel: &CancelToken) -> Result<(), String> {
    if cancel.is_cancelled() {
        return Err("the turn was cancelled".to_owned());
    }
    store.may_act().map_err(|e| e.0)
}

/// What running an effect gave.
pub(crate) struct EffectResult {
    pub(crate) result: Result<ToolReceipt, ToolError>,
    pub(crate) bypasses: Vec<BypassRecord>,
    pub(crate) timed_out: bool,
    /// A bypass verdict could not be recorded (the bypass was refused).
    pub(crate) record_error: Option<TurnError>,
    /// The verdict that discarded a staged effect, if one did.
    pub(crate) staged_denial: Option<VerdictRecord>,
}

/// What the effect asks the caller to commit while the tool runs.
pub(crate) enum Record<'a> {
    /// A bypass verdict.
    Bypass(&'a BypassRecord),
    /// An approved change set, before it is applied.
    Staged(&'a ToolStagedPayload),
}

/// Run `tool` once. `record` commits each bypass verdict and each approved
/// staged change set; the tool learns the answer only after it returned
/// `Ok`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    tool: &dyn Tool,
    request: &ToolRequest,
    risk: Risk,
    cwd: &Path,
    limits: ToolLimits,
    outer: &CancelToken,
    observer: &mut dyn FnMut(&TurnEvent),
    approver: &mut dyn Approver,
    record: &mut dyn FnMut(Record<'_>) -> Result<(), TurnError>,
) -> EffectResult {
    let call_cancel = CancelToken::new();
    let timed_out = AtomicBool::new(false);
    let mut bypasses = Vec::new();
    let record_error: std::cell::RefCell<Option<TurnError>> = std::cell::RefCell::new(None);
    let record = std::cell::RefCell::new(record);
    let staged_denial: std::cell::RefCell<Option<VerdictRecord>> = std::cell::RefCell::new(None);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    // A timeout too large to represent means no deadline.
    let deadline = Instant::now().checked_add(limits.timeout);
    let result = std::thread::scope(|scope| {
        let watchdog_cancel = call_cancel.clone();
        let timed_out = &timed_out;
        scope.spawn(move || {
            loop {
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    timed_out.store(true, Ordering::SeqCst);
                    watchdog_cancel.cancel();
                    // Keep waiting for the tool to return.
                    let _ = done_rx.recv();
                    return;
                }
                let left = deadline.map_or(Duration::MAX, |d| d.saturating_duration_since(now));
                match done_rx.recv_timeout(left.min(Duration::from_millis(10))) {
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if outer.is_cancelled() {
                            watchdog_cancel.cancel();
                        }
                    }
                }
            }
        });
        let invocation_id = request.invocation_id.clone();
        // The output and the questions go to the one observer, one at a
        // time (a tool asks between chunks, never inside one).
        let observer = std::cell::RefCell::new(observer);
        let mut output = |chunk: &[u8]| {
            if let Ok(mut observer) = observer.try_borrow_mut() {
                (**observer)(&TurnEvent::ToolOutput {
                    invocation_id: invocation_id.clone(),
                    chunk: String::from_utf8_lossy(chunk).into_owned(),
                });
            }
        };
        let mut announce = |event: &TurnEvent| {
            if let Ok(mut observer) = observer.try_borrow_mut() {
                (**observer)(event);
            }
        };
        // Every question a running tool raises is announced like the
        // call's own (`asked.rs`): a bypass, a Destructive staged effect.
        let mut announced = Announced { approver, announce: &mut announce };
        // Both brokers ask the one approver; a tool asks one at a time.
        let approver = std::cell::RefCell::new(&mut announced as &mut dyn Approver);
        let mut approve_bypass = |what: &str| -> bool {
            let Ok(mut approver) = approver.try_borrow_mut() else { return false };
            if record_error.borrow().is_some() {
                // Nothing more can be recorded: nothing more is granted.
                return false;
            }
            let v = decide_bypass(request, cwd, risk, what, &mut **approver);
            let verdict = VerdictRecord { decision: v.decision, by: v.by, at: now_millis() };
            let bypass = BypassRecord { what: what.to_owned(), verdict };
            let recorded = match record.try_borrow_mut() {
                Ok(mut record) => record(Record::Bypass(&bypass)),
                Err(_) => Err(TurnError::Corrupt("the effect recorder is busy".to_owned())),
            };
            if let Err(e) = recorded {
                *record_error.borrow_mut() = Some(e);
                return false;
            }
            let approved = !matches!(bypass.verdict.decision, Answer::Deny { .. });
            bypasses.push(bypass);
            approved
        };
        let mut review_staged = |review: &StagedReview<'_>| -> StagedDecision {
            if record_error.borrow().is_some() {
                return StagedDecision::Discard { reason: "an earlier record of this call failed".to_owned() };
            }
            let (decision, by) = match approver.try_borrow_mut() {
                Ok(mut approver) => review_staged_effect(request, cwd, &mut **approver, review),
                Err(_) => (StagedDecision::Discard { reason: "the approver is busy".to_owned() }, String::new()),
            };
            if let StagedDecision::Discard { reason } = &decision {
                *staged_denial.borrow_mut() =
                    Some(VerdictRecord { decision: Answer::Deny { reason: reason.clone() }, by, at: now_millis() });
                return decision;
            }
            // The change set is durable before any of it is applied.
            let verdict = VerdictRecord { decision: Answer::Approve, by, at: now_millis() };
            let payload = ToolStagedPayload::new(
                request,
                review.changes.clone(),
                review.staging.to_owned(),
                verdict,
                review.preimages.clone(),
            );
            let recorded = match record.try_borrow_mut() {
                Ok(mut record) => record(Record::Staged(&payload)),
                Err(_) => Err(TurnError::Corrupt("the effect recorder is busy".to_owned())),
            };
            match recorded {
                Ok(()) => {
                    if let Ok(mut observer) = observer.try_borrow_mut() {
                        (**observer)(&payload.event());
                    }
                    decision
                }
                Err(e) => {
                    let reason = match &e {
                        TurnError::NotStarted(why) => {
                            format!("the change set was recorded but {why}, so nothing was applied yet")
                        }
                        _ => "the change set could not be recorded, so nothing was applied".to_owned(),
                    };
                    *record_error.borrow_mut() = Some(e);
                    StagedDecision::Discard { reason }
                }
            }
        };
        let mut elicit = |message: &str, ask: crate::elicit::Ask<'_>| -> crate::elicit::ElicitAnswer {
            let question = crate::elicit::Elicitation {
                session_id: &request.session_id,
                invocation_id: &request.invocation_id,
                tool: &request.tool,
                message,
                ask,
            };
            match approver.try_borrow_mut() {
                Ok(mut approver) => approver.elicit(&question),
                Err(_) => crate::elicit::ElicitAnswer::Decline("the approver is busy with another question".to_owned()),
            }
        };
        let mut ctx = ToolContext {
            cwd,
            cancel: &call_cancel,
            limits,
            output: &mut output,
            approve_bypass: &mut approve_bypass,
            review_staged: &mut review_staged,
            elicit: &mut elicit,
        };
        // A tool that panics is settled as failed; the turn goes on.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tool.execute(request, &mut ctx)))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                Err(ToolError::Other(format!("the tool panicked: {what}")))
            });
        let _ = done_tx.send(());
        result
    });
    EffectResult {
        result,
        bypasses,
        timed_out: timed_out.load(Ordering::SeqCst),
        record_error: record_error.into_inner(),
        staged_denial: staged_denial.into_inner(),
    }
}

/// The approval of a staged effect: a Write effect was approved with the
/// call (its pre-run verdict followed the Write rules); a Destructive one
/// goes through the gate (refused headless, whatever `--yes` or a pattern
/// said) and then to the interactive approver, who is shown the diff.
/// The verdict on a tool's request for access outside its sandbox (`what`):
/// the gate first (a bypass always needs a person), then `approver`. The
/// turn records it; a host without a turn (the tool service) asks it too,
/// so no host decides a bypass by itself.
pub fn decide_bypass(
    request: &ToolRequest,
    cwd: &Path,
    risk: Risk,
    what: &str,
    approver: &mut dyn Approver,
) -> Verdict {
    match gate(Gated { tool: &request.tool, risk, bypass: Some(what), hook_asks: None }, Asker::of(&*approver)) {
        Err(refusal) => refusal,
        Ok(need) => {
            let ask = ApprovalRequest {
                session_id: &request.session_id,
                invocation_id: &request.invocation_id,
                tool: &request.tool,
                risk,
                arguments: &request.arguments,
                preview: None,
                cwd,
                bypass: Some(what),
                // A bypass is never covered by a rule, staged or not.
                staged: false,
                why: None,
                hook_asks: None,
            };
            match approver.decide(&ask) {
                Ok(v) => need.bound(v),
                Err(e) => Verdict { decision: Answer::Deny { reason: e.to_string() }, by: "approver:error".to_owned() },
            }
        }
    }
}

/// The decision on a staged run's change set, and who made it: one the
/// judge refused (`Judgement::refused`) is discarded without asking; a
/// Write effect is applied by policy; a Destructive one goes through the
/// gate and `approver`. The turn records it; the tool service asks it too.
pub fn review_staged_effect(
    request: &ToolRequest,
    cwd: &Path,
    approver: &mut dyn Approver,
    review: &StagedReview<'_>,
) -> (StagedDecision, String) {
    // A change under cairn's own directories is refused whoever answers
    // (issue 46): no approver is asked, so no `--yes`, rule or person
    // lets a tool rewrite cairn's configuration.
    if !review.judgement.refused.is_empty() {
        let reason = format!(
            "{} was refused: its staged effect {}; no tool may change these, whoever approves. Nothing was applied, \
             the working tree is unchanged. Staged changes:\n{}",
            request.tool,
            review.judgement.refused.join("; "),
            review.changes.listing()
        );
        let by = crate::authority::REFUSED_BY.to_owned();
        return (StagedDecision::Discard { reason }, by);
    }
    if review.judgement.risk != Risk::Destructive {
        return (StagedDecision::Apply { by: "policy:stagedWrite".to_owned() }, "policy:stagedWrite".to_owned());
    }
    let staged = format!(
        "its staged effect is Destructive ({}); nothing was applied, the working tree is unchanged. Staged changes:\n{}",
        review.judgement.reasons_shown(),
        review.changes.listing()
    );
    let ask = match gate(Gated::call(&request.tool, Risk::Destructive), Asker::of(&*approver)) {
        Err(refusal) => {
            let why = match refusal.decision {
                // The session was put in plan mode while the command ran.
                Answer::Deny { reason } if refusal.by == PLAN_MODE => reason,
                _ => "no interactive approver is available: run cairn in a terminal to approve such effects".to_owned(),
            };
            let reason = format!("{} needs a person's approval because {staged}({why})", request.tool);
            return (StagedDecision::Discard { reason }, refusal.by);
        }
        Ok(need) => need,
    };
    let command = request.arguments.get("command").and_then(|c| c.as_str()).unwrap_or("");
    let preview = Preview::Text {
        text: format!(
            "$ {command}\nin {}\nstaged effect (Destructive: {})\n{}\n{}{}",
            cwd.display(),
            review.judgement.reasons_shown(),
            review.changes.listing(),
            review.diff,
            match review.preimages {
                crate::staged::Preimages::Kept { .. } => String::new(),
                crate::staged::Preimages::NotKept { reason } => {
                    format!("\nthis effect cannot be undone: {reason}\n")
                }
            }
        ),
    };
    let question = ApprovalRequest {
        session_id: &request.session_id,
        invocation_id: &request.invocation_id,
        tool: &request.tool,
        risk: Risk::Destructive,
        arguments: &request.arguments,
        preview: Some(&preview),
        cwd,
        bypass: None,
        staged: true,
        // The preview says what the effect does (it is why it asks).
        why: None,
        hook_asks: None,
    };
    match approver.decide(&question).map(|v| ask.bound(v)) {
        Ok(v) => match v.decision {
            Answer::Approve | Answer::ApproveForSession => (StagedDecision::Apply { by: v.by.clone() }, v.by),
            Answer::Deny { reason } => (StagedDecision::Discard { reason: format!("{reason}: {staged}") }, v.by),
        },
        Err(e) => (StagedDecision::Discard { reason: format!("{e}: {staged}") }, "approver:error".to_owned()),
    }
}

/// The largest char boundary ≤ `at`.
fn floor_boundary(s: &str, at: usize) -> usize {
    if at >= s.len() {
        return s.len();
    }
    let mut i = at;
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Cut the receipt's summary at `cap` bytes with a marker; return the full
/// output (itself cut at `stored_cap`) to keep outside the prompt.
pub(crate) fn apply_cap(receipt: &mut ToolReceipt, cap: usize, stored_cap: usize) -> Option<String> {
    if receipt.output_summary.len() <= cap {
        return None;
    }
    let mut full = std::mem::take(&mut receipt.output_summary);
    let total = full.len();
    let cut = floor_boundary(&full, cap);
    receipt.output_summary = format!(
        "{}\n[output truncated: {cut} of {total} bytes shown; the full output is kept out of the prompt in this call's toolCompleted entry (fullOutput)]",
        &full[..cut]
    );
    receipt.truncated = true;
    if total > stored_cap {
        let keep = floor_boundary(&full, stored_cap);
        full.truncate(keep);
        full.push_str(&format!("\n[stored output cut at {keep} of {total} bytes]"));
    }
    Some(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_marks_truncation_on_a_char_boundary() {
        let mut receipt = ToolReceipt {
            exit_code: 0,
            output_summary: "é".repeat(10),
            structured_output: None,
            affected_entities: vec![],
            duration_ms: 0,
            tier: Risk::ReadOnly,
            timestamp: 0,
            truncated: false,
        };
        let full = apply_cap(&mut receipt, 5, 7).unwrap();
        assert!(receipt.truncated);
        assert!(receipt.output_summary.starts_with("éé\n[output truncated: 4 of 20 bytes"));
        assert!(full.starts_with("ééé\n[stored output cut at 6 of 20 bytes]"));
        let mut small = receipt.clone();
        small.output_summary = "ok".to_owned();
        assert!(apply_cap(&mut small, 5, 7).is_none());
    }
}
