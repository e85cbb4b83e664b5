//! The turn loop and the effect sandwich: one handler per stored phase, each
//! making exactly one durable move (a commit with a CAS on the pc), so the
//! same loop serves a fresh turn and a resumed one.
//!
//! It must not decide policy beyond the tole rules written here (ReadOnly
//! runs; Write needs a rule or a verdict; Destructive needs an interactive
//! verdict and is refused headless), and must not hold anything in memory
//! that the log does not also say.

use std::sync::Arc;

use serde_json::{Value, json};

use super::effect;
use super::{
    FACT_NS, OP_NS, PENDING_NS, PendingValue, Phase, Session, TurnEnv, TurnError, TurnOutcome, TurnStop, TxBuilder,
};
use crate::approval::{AllowRule, ApprovalRequest, Decision};
use crate::events::{
    MESSAGE, TOOL_COMPLETED, TOOL_FAILED, TOOL_REJECTED, TOOL_REQUESTED, TOOL_STARTED, TURN_CANCELLED, TURN_ENDED,
    ToolCompleted, ToolFailed, ToolRejected, ToolRequested, ToolStarted, TurnEvent, TurnMark, VerdictRecord,
};
use crate::message::{Message, Role, ToolCall};
use crate::provider::{ModelRequest, ModelResponse, ProviderErrorKind, StreamEvent};
use crate::registry::ToolRegistry;
use crate::schema;
use crate::storage::{Storage, now_millis};
use crate::tool::{GuardVerdict, ReplayPolicy, Risk, Tool, ToolError, ToolLimits, ToolRequest, Validation};

/// How an invocation is settled.
enum Settlement {
    Completed(ToolCompleted),
    Failed(ToolFailed),
}

fn verdict(decision: Decision, by: &str) -> VerdictRecord {
    VerdictRecord { decision, by: by.to_owned(), at: now_millis() }
}

fn deny(reason: String, by: &str) -> VerdictRecord {
    verdict(Decision::Deny { reason }, by)
}

fn is_approve(v: &VerdictRecord) -> bool {
    !matches!(v.decision, Decision::Deny { .. })
}

fn headless_denial(tool: &str) -> VerdictRecord {
    deny(
        format!(
            "{tool} is Destructive here and needs a person's approval, but no interactive approver is available; the call was not run (run cairn in a terminal to approve such calls)"
        ),
        "policy:headless",
    )
}

/// Schema, validation and risk of a call, or why it is rejected.
fn check_call(tool: Option<&Arc<dyn Tool>>, request: &ToolRequest, registry: &ToolRegistry) -> Result<Risk, String> {
    let Some(tool) = tool else {
        let names: Vec<&str> = registry.specs().iter().map(|s| s.name.as_str()).collect();
        return Err(format!("unknown tool {:?}; available tools: {}", request.tool, names.join(", ")));
    };
    match &request.arguments {
        Value::Object(_) => {}
        Value::String(text) => {
            let shown: String = text.chars().take(200).collect();
            return Err(format!(
                "arguments are not valid JSON (got {shown:?}); send a JSON object that matches the tool's schema"
            ));
        }
        other => {
            return Err(format!("arguments must be a JSON object, got {other}"));
        }
    }
    let spec = tool.spec();
    schema::validate(&spec.input_schema, &request.arguments)
        .map_err(|e| format!("arguments do not match the schema of {}: {e}", spec.name))?;
    if let Validation::Invalid(reason) = tool.validate(request) {
        return Err(format!("validation failed: {reason}"));
    }
    Ok(tool.risk(&request.arguments).max(spec.risk))
}

impl<S: Storage> Session<S> {
    /// Drive the pc until the turn is Final or Cancelled.
    pub(super) fn drive(&mut self, env: &mut TurnEnv<'_>) -> Result<TurnOutcome, TurnError> {
        loop {
            match self.pc.phase {
                Phase::Planning => self.plan(env)?,
                Phase::ToolCall => self.tool_call(env)?,
                Phase::AwaitingApproval => self.await_approval(env)?,
                Phase::Executing => self.execute(env)?,
                Phase::Final | Phase::Cancelled => return Ok(self.outcome()),
                phase @ (Phase::Idle | Phase::Settling) => {
                    return Err(TurnError::Corrupt(format!("cannot drive a turn from phase {phase:?}")));
                }
            }
        }
    }

    fn turn_id(&self) -> String {
        self.pc.turn.clone().unwrap_or_default()
    }

    fn outcome(&self) -> TurnOutcome {
        let (stop, text, entry_id) = match (self.pc.phase, &self.pc.assistant) {
            (Phase::Cancelled, _) => (TurnStop::Cancelled, String::new(), None),
            (_, Some(id)) => {
                let text = self
                    .store
                    .entry(id)
                    .and_then(|e| e.payload.parse::<Message>().ok())
                    .map(|m| m.joined_text())
                    .unwrap_or_default();
                (TurnStop::Answered, text, Some(id.clone()))
            }
            (_, None) => (TurnStop::StepLimit, String::new(), None),
        };
        TurnOutcome { turn_id: self.turn_id(), stop, text, entry_id, steps: self.pc.step }
    }

    /// Settle the turn as cancelled (resumable from the current pc).
    fn cancel_turn(&mut self, env: &mut TurnEnv<'_>, mut b: TxBuilder) -> Result<(), TurnError> {
        let turn_id = self.turn_id();
        b.entry(TURN_CANCELLED, &TurnMark { turn_id: turn_id.clone(), reason: "cancelled by the host".to_owned() })?;
        let mut pc = self.pc.to(Phase::Cancelled)?;
        pc.resume = Some(Box::new(self.pc.clone()));
        self.commit(b, Some(pc))?;
        (env.observer)(&TurnEvent::TurnCancelled { turn_id });
        Ok(())
    }

    /// The provider call: intent is the `Planning` pc (+ `op/provider`);
    /// the settled assistant message and its usage rows are one commit.
    fn plan(&mut self, env: &mut TurnEnv<'_>) -> Result<(), TurnError> {
        if env.cancel.is_cancelled() {
            let b = self.tx();
            return self.cancel_turn(env, b);
        }
        let turn_id = self.turn_id();
        (env.observer)(&TurnEvent::ProviderRequested { turn_id: turn_id.clone(), step: self.pc.step });
        let result = {
            let request = ModelRequest {
                system: self.config.system.as_deref(),
                messages: &self.messages,
                tools: env.tools.specs(),
                max_output_tokens: self.config.max_output_tokens,
            };
            let observer = &mut *env.observer;
            let mut forward = |event: &StreamEvent| observer(&TurnEvent::Delta { event: event.clone() });
            env.provider.complete(&request, &mut forward, env.cancel).and_then(ModelResponse::refuse_duplicate_call_ids)
        };
        match result {
            Ok(response) => {
                let mut b = self.tx();
                let mut message = response.message;
                message.role = Role::Assistant;
                let calls = message.tool_calls().count();
                let id = b.entry(MESSAGE, &message)?;
                for attempt in &response.attempts {
                    b.usage(Some(&id), attempt)?;
                }
                b.delete(OP_NS, "provider");
                let mut pc = self.pc.to(if calls == 0 { Phase::Final } else { Phase::ToolCall })?;
                pc.assistant = Some(id.clone());
                pc.call = 0;
                self.commit(b, Some(pc))?;
                for usage in response.attempts {
                    (env.observer)(&TurnEvent::Usage { usage });
                }
                (env.observer)(&TurnEvent::ProviderSettled {
                    entry_id: id.clone(),
                    stop: response.stop,
                    tool_calls: calls,
                });
                if calls == 0 {
                    (env.observer)(&TurnEvent::Final { turn_id, text: message.joined_text(), entry_id: id });
                }
                Ok(())
            }
            Err(error) => {
                let mut b = self.tx();
                for attempt in &error.attempts {
                    b.usage(None, attempt)?;
                }
                for usage in error.attempts.iter().cloned() {
                    (env.observer)(&TurnEvent::Usage { usage });
                }
                if error.kind == ProviderErrorKind::Cancelled || env.cancel.is_cancelled() {
                    return self.cancel_turn(env, b);
                }
                if !b.is_empty() {
                    self.commit(b, None)?;
                }
                let kind = serde_json::to_value(error.kind)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                (env.observer)(&TurnEvent::ProviderFailed { kind, message: error.message.clone() });
                Err(TurnError::Provider(error))
            }
        }
    }

    /// The pc after the current call is settled: the next call, the next
    /// provider call, or Final at the step limit. Adds what that needs to `b`.
    fn after_call(&self, b: &mut TxBuilder, calls: usize) -> Result<super::Pc, TurnError> {
        let base = if self.pc.phase == Phase::Executing { self.pc.to(Phase::Settling)? } else { self.pc.clone() };
        let mut next = if self.pc.call + 1 < calls {
            let mut p = base.to(Phase::ToolCall)?;
            p.call = self.pc.call + 1;
            p
        } else if base.step >= self.config.max_steps {
            b.entry(
                TURN_ENDED,
                &TurnMark {
                    turn_id: self.turn_id(),
                    reason: format!("step limit of {} provider calls reached", self.config.max_steps),
                },
            )?;
            let mut p = base.to(Phase::Final)?;
            p.assistant = None;
            p
        } else {
            b.set(OP_NS, "provider", &json!({"turnId": self.turn_id(), "step": base.step.saturating_add(1)}))?;
            let mut p = base.to(Phase::Planning)?;
            p.step = p.step.saturating_add(1);
            p.assistant = None;
            p.call = 0;
            p
        };
        next.invocation = None;
        Ok(next)
    }

    fn after_commit_events(&self, env: &mut TurnEnv<'_>) {
        if self.pc.phase == Phase::Final && self.pc.assistant.is_none() {
            (env.observer)(&TurnEvent::StepLimit { turn_id: self.turn_id(), max_steps: self.config.max_steps });
        }
    }

    fn remember(
        &self,
        b: &mut TxBuilder,
        v: &VerdictRecord,
        risk: Risk,
        request: &ToolRequest,
    ) -> Result<Option<AllowRule>, TurnError> {
        if v.decision != Decision::ApproveForSession || risk != Risk::Write {
            return Ok(None);
        }
        let Some(rule) = Self::allow_rule_for(&request.tool, &request.arguments) else {
            return Ok(None);
        };
        let parsed = AllowRule::parse(&rule)?;
        b.set(
            FACT_NS,
            &format!("allow:{rule}"),
            &json!({"by": v.by, "at": v.at, "invocationId": request.invocation_id}),
        )?;
        Ok(Some(parsed))
    }

    /// The next call of the assistant message: check it, then commit its
    /// intent (with the start when a rule or the policy already decided).
    fn tool_call(&mut self, env: &mut TurnEnv<'_>) -> Result<(), TurnError> {
        let assistant = self
            .pc
            .assistant
            .clone()
            .ok_or_else(|| TurnError::Corrupt("ToolCall pc without an assistant message".to_owned()))?;
        let calls = self.assistant_calls(&assistant)?;
        if env.cancel.is_cancelled() {
            let b = self.tx();
            return self.cancel_turn(env, b);
        }
        let mut b = self.tx();
        let Some(call) = calls.get(self.pc.call).cloned() else {
            let pc = self.after_call(&mut b, calls.len())?;
            self.commit(b, Some(pc))?;
            self.after_commit_events(env);
            return Ok(());
        };
        let max_calls = env.provider.max_tool_calls().max(1);
        if self.pc.call >= max_calls {
            return self.refuse_excess_calls(env, b, &calls, max_calls);
        }
        let request_entry = b.next_id("e");
        let invocation_id = b.next_id("i");
        let request = self.tool_request(&invocation_id, &call);
        let tool = env.tools.get(&request.tool).cloned();
        let requested = ToolRequested {
            invocation_id: invocation_id.clone(),
            turn_id: self.turn_id(),
            request: request.clone(),
            tier: tool.as_ref().map(|t| t.risk(&request.arguments).max(t.spec().risk)),
            replay: tool.as_ref().map(|t| t.spec().replay),
        };
        let requested_event = TurnEvent::ToolRequested {
            invocation_id: invocation_id.clone(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            risk: requested.tier,
            arguments: call.arguments.clone(),
        };
        let risk = match check_call(tool.as_ref(), &request, env.tools) {
            Ok(risk) => risk,
            Err(reason) => {
                b.entry(TOOL_REQUESTED, &requested)?;
                b.entry(
                    TOOL_REJECTED,
                    &ToolRejected {
                        invocation_id: invocation_id.clone(),
                        call_id: call.id.clone(),
                        tool: call.name.clone(),
                        tier: requested.tier,
                        reason: reason.clone(),
                        verdict: None,
                    },
                )?;
                let pc = self.after_call(&mut b, calls.len())?;
                self.commit(b, Some(pc))?;
                (env.observer)(&requested_event);
                (env.observer)(&TurnEvent::ToolRejected {
                    invocation_id,
                    tool: call.name,
                    risk: requested.tier,
                    reason,
                });
                self.after_commit_events(env);
                return Ok(());
            }
        };
        let quick = match risk {
            Risk::ReadOnly => Some(verdict(Decision::Approve, "policy:readOnly")),
            Risk::Destructive if !env.approver.is_interactive() => Some(headless_denial(&request.tool)),
            Risk::Destructive => None,
            Risk::Write => match self.session_allow.check(&request.tool, risk, &request.arguments) {
                Ok(rule) => Some(verdict(Decision::Approve, &format!("session:{}", rule.text()))),
                Err(_) => {
                    let ask = ApprovalRequest {
                        invocation_id: &invocation_id,
                        tool: &request.tool,
                        risk,
                        arguments: &request.arguments,
                        preview: None,
                        cwd: &self.cwd,
                        bypass: None,
                    };
                    env.approver.pre_approve(&ask).map(|v| verdict(v.decision, &v.by))
                }
            },
        };
        b.entry(TOOL_REQUESTED, &requested)?;
        let pending = PendingValue { request_entry, turn_id: self.turn_id() };
        match quick {
            Some(v) if is_approve(&v) => {
                b.entry(
                    TOOL_STARTED,
                    &ToolStarted {
                        invocation_id: invocation_id.clone(),
                        call_id: call.id.clone(),
                        tool: call.name.clone(),
                        verdict: v.clone(),
                    },
                )?;
                let rule = self.remember(&mut b, &v, risk, &request)?;
                b.set(PENDING_NS, &invocation_id, &pending)?;
                let mut pc = self.pc.to(Phase::Executing)?;
                pc.invocation = Some(invocation_id.clone());
                self.commit(b, Some(pc))?;
                if let Some(rule) = rule {
                    self.session_allow.push(rule);
                }
                self.started_here = Some(invocation_id.clone());
                (env.observer)(&requested_event);
                (env.observer)(&TurnEvent::ApprovalVerdict { invocation_id: invocation_id.clone(), verdict: v });
                (env.observer)(&TurnEvent::ToolStarted { invocation_id, tool: call.name, risk });
            }
            Some(v) => {
                let rejected = ToolRejected::by_verdict(
                    invocation_id.clone(),
                    call.id.clone(),
                    call.name.clone(),
                    risk,
                    v.clone(),
                );
                let reason = rejected.reason.clone();
                b.entry(TOOL_REJECTED, &rejected)?;
                let pc = self.after_call(&mut b, calls.len())?;
                self.commit(b, Some(pc))?;
                (env.observer)(&requested_event);
                (env.observer)(&TurnEvent::ApprovalVerdict { invocation_id: invocation_id.clone(), verdict: v });
                (env.observer)(&TurnEvent::ToolRejected { invocation_id, tool: call.name, risk: Some(risk), reason });
                self.after_commit_events(env);
            }
            None => {
                b.set(PENDING_NS, &invocation_id, &pending)?;
                let mut pc = self.pc.to(Phase::AwaitingApproval)?;
                pc.invocation = Some(invocation_id);
                self.commit(b, Some(pc))?;
                (env.observer)(&requested_event);
            }
        }
        Ok(())
    }

    /// The Correx request for one of the model's tool calls.
    fn tool_request(&self, invocation_id: &str, call: &ToolCall) -> ToolRequest {
        ToolRequest {
            invocation_id: invocation_id.to_owned(),
            call_id: call.id.clone(),
            session_id: self.store.header().id.clone(),
            tool: call.name.clone(),
            arguments: call.arguments.clone(),
        }
    }

    fn current_invocation(&self) -> Result<String, TurnError> {
        self.pc
            .invocation
            .clone()
            .ok_or_else(|| TurnError::Corrupt(format!("{:?} pc without an invocation", self.pc.phase)))
    }

    fn call_count(&self) -> Result<usize, TurnError> {
        match &self.pc.assistant {
            Some(id) => Ok(self.assistant_calls(id)?.len()),
            None => Err(TurnError::Corrupt("pc without an assistant message".to_owned())),
        }
    }

    /// The intent is committed; ask the approver and commit its verdict.
    fn await_approval(&mut self, env: &mut TurnEnv<'_>) -> Result<(), TurnError> {
        let invocation_id = self.current_invocation()?;
        let requested = self.pending_request(&invocation_id)?;
        if env.cancel.is_cancelled() {
            let b = self.tx();
            return self.cancel_turn(env, b);
        }
        let calls = self.call_count()?;
        let request = requested.request;
        let risk = requested.tier.unwrap_or(Risk::Write);
        let tool = env.tools.get(&request.tool).cloned();
        let mut v = match &tool {
            None => deny(format!("tool {:?} is no longer available", request.tool), "policy:unavailable"),
            Some(_) if risk == Risk::Destructive && !env.approver.is_interactive() => headless_denial(&request.tool),
            Some(tool) => {
                let preview = tool.preview(&request, &self.cwd);
                (env.observer)(&TurnEvent::ApprovalAsked {
                    invocation_id: invocation_id.clone(),
                    tool: request.tool.clone(),
                    risk,
                    preview: preview.clone(),
                });
                let ask = ApprovalRequest {
                    invocation_id: &invocation_id,
                    tool: &request.tool,
                    risk,
                    arguments: &request.arguments,
                    preview: preview.as_ref(),
                    cwd: &self.cwd,
                    bypass: None,
                };
                match env.approver.decide(&ask) {
                    Ok(answer) => verdict(answer.decision, &answer.by),
                    Err(e) => deny(format!("the approver failed ({e}); the call was not run"), "approver:error"),
                }
            }
        };
        if risk == Risk::Destructive && v.decision == Decision::ApproveForSession {
            v.decision = Decision::Approve;
        }
        if is_approve(&v) && env.cancel.is_cancelled() {
            v = deny("the turn was cancelled while this call awaited approval".to_owned(), "host:cancel");
        }
        let mut b = self.tx();
        (env.observer)(&TurnEvent::ApprovalVerdict { invocation_id: invocation_id.clone(), verdict: v.clone() });
        if is_approve(&v) {
            b.entry(
                TOOL_STARTED,
                &ToolStarted {
                    invocation_id: invocation_id.clone(),
                    call_id: request.call_id.clone(),
                    tool: request.tool.clone(),
                    verdict: v.clone(),
                },
            )?;
            let rule = self.remember(&mut b, &v, risk, &request)?;
            let pc = self.pc.to(Phase::Executing)?;
            self.commit(b, Some(pc))?;
            if let Some(rule) = rule {
                self.session_allow.push(rule);
            }
            self.started_here = Some(invocation_id.clone());
            (env.observer)(&TurnEvent::ToolStarted { invocation_id, tool: request.tool, risk });
        } else {
            let rejected =
                ToolRejected::by_verdict(invocation_id.clone(), request.call_id.clone(), request.tool.clone(), risk, v);
            let reason = rejected.reason.clone();
            b.entry(TOOL_REJECTED, &rejected)?;
            b.delete(PENDING_NS, &invocation_id);
            let pc = self.after_call(&mut b, calls)?;
            self.commit(b, Some(pc))?;
            (env.observer)(&TurnEvent::ToolRejected { invocation_id, tool: request.tool, risk: Some(risk), reason });
            self.after_commit_events(env);
        }
        Ok(())
    }

    /// Run the effect (fresh) or apply the replay policy (resume), then
    /// commit the settlement.
    fn execute(&mut self, env: &mut TurnEnv<'_>) -> Result<(), TurnError> {
        let invocation_id = self.current_invocation()?;
        let requested = self.pending_request(&invocation_id)?;
        let fresh = self.started_here.take().as_deref() == Some(invocation_id.as_str());
        let calls = self.call_count()?;
        let request = requested.request;
        let risk = requested.tier.unwrap_or(Risk::Write);
        let tool = env.tools.get(&request.tool).cloned();
        let failed = |reason: String, uncertain: bool| {
            Settlement::Failed(ToolFailed {
                invocation_id: invocation_id.clone(),
                call_id: request.call_id.clone(),
                tool: request.tool.clone(),
                reason,
                uncertain,
                bypasses: Vec::new(),
            })
        };
        let settlement = match (&tool, fresh, requested.replay.unwrap_or(ReplayPolicy::Never)) {
            (None, _, _) => failed(
                format!(
                    "interrupted: cairn stopped while {} ran and the tool is no longer registered, so it was not re-run; whether its effect happened is unknown",
                    request.tool
                ),
                true,
            ),
            (Some(tool), true, _) | (Some(tool), false, ReplayPolicy::Idempotent) => {
                self.run_effect(tool.as_ref(), &request, risk, env)
            }
            (Some(tool), false, ReplayPolicy::Guarded) => match tool.guard(&request, &self.cwd) {
                GuardVerdict::AlreadyDone(mut receipt) => {
                    let full_output =
                        effect::apply_cap(&mut receipt, self.config.output_cap, self.config.stored_output_cap);
                    Settlement::Completed(ToolCompleted {
                        invocation_id: invocation_id.clone(),
                        call_id: request.call_id.clone(),
                        tool: request.tool.clone(),
                        receipt,
                        full_output,
                        settled_by: Some("guard".to_owned()),
                        bypasses: Vec::new(),
                    })
                }
                GuardVerdict::NotDone => self.run_effect(tool.as_ref(), &request, risk, env),
                GuardVerdict::Unknown => failed(
                    format!(
                        "interrupted: cairn stopped while {} ran and its guard cannot tell whether the effect happened; it was not re-run — check before retrying",
                        request.tool
                    ),
                    true,
                ),
            },
            (Some(_), false, ReplayPolicy::Never) => failed(
                format!(
                    "interrupted: cairn stopped while {} ran; it is not safe to re-run, so it was not, and whether its effect happened is unknown — check before retrying",
                    request.tool
                ),
                true,
            ),
        };
        let mut b = self.tx();
        let event = match &settlement {
            Settlement::Completed(done) => {
                b.entry(TOOL_COMPLETED, done)?;
                TurnEvent::ToolCompleted {
                    invocation_id: invocation_id.clone(),
                    tool: request.tool.clone(),
                    exit_code: done.receipt.exit_code,
                    output_summary: done.receipt.output_summary.clone(),
                    truncated: done.receipt.truncated,
                }
            }
            Settlement::Failed(failure) => {
                b.entry(TOOL_FAILED, failure)?;
                TurnEvent::ToolFailed {
                    invocation_id: invocation_id.clone(),
                    tool: request.tool.clone(),
                    reason: failure.reason.clone(),
                    uncertain: failure.uncertain,
                }
            }
        };
        b.delete(PENDING_NS, &invocation_id);
        let pc = self.after_call(&mut b, calls)?;
        self.commit(b, Some(pc))?;
        (env.observer)(&event);
        self.after_commit_events(env);
        Ok(())
    }

    fn run_effect(&self, tool: &dyn Tool, request: &ToolRequest, risk: Risk, env: &mut TurnEnv<'_>) -> Settlement {
        let limits = ToolLimits { timeout: self.config.tool_timeout, output_cap: self.config.output_cap };
        let ran =
            effect::run(tool, request, risk, &self.cwd, limits, env.cancel, &mut *env.observer, &mut *env.approver);
        match ran.result {
            Ok(mut receipt) => {
                let full_output =
                    effect::apply_cap(&mut receipt, self.config.output_cap, self.config.stored_output_cap);
                Settlement::Completed(ToolCompleted {
                    invocation_id: request.invocation_id.clone(),
                    call_id: request.call_id.clone(),
                    tool: request.tool.clone(),
                    receipt,
                    full_output,
                    settled_by: None,
                    bypasses: ran.bypasses,
                })
            }
            Err(error) => {
                let reason = match error {
                    ToolError::Cancelled if ran.timed_out => {
                        format!("timed out after {:?} (the per-tool time limit)", self.config.tool_timeout)
                    }
                    ToolError::Cancelled => "cancelled by the host".to_owned(),
                    other => other.to_string(),
                };
                Settlement::Failed(ToolFailed {
                    invocation_id: request.invocation_id.clone(),
                    call_id: request.call_id.clone(),
                    tool: request.tool.clone(),
                    reason,
                    uncertain: false,
                    bypasses: ran.bypasses,
                })
            }
        }
    }

    /// Settle `pending` keys the pc does not point at (only a log written by
    /// something else has them) as failed-uncertain, so nothing is left
    /// without a way forward.
    pub(super) fn settle_orphans(&mut self, env: &mut TurnEnv<'_>) -> Result<(), TurnError> {
        let current = match self.pc.phase {
            Phase::AwaitingApproval | Phase::Executing => self.pc.invocation.clone(),
            Phase::Cancelled => self.pc.resume.as_ref().and_then(|r| r.invocation.clone()),
            _ => None,
        };
        let mut b = self.tx();
        let mut events = Vec::new();
        for (key, _) in self.store.registers(PENDING_NS) {
            if Some(&key) == current.as_ref() {
                continue;
            }
            let requested = self.pending_request(&key)?;
            let reason =
                "found unsettled on resume and not at the turn's position; not re-run, effect unknown".to_owned();
            b.entry(
                TOOL_FAILED,
                &ToolFailed {
                    invocation_id: key.clone(),
                    call_id: requested.request.call_id.clone(),
                    tool: requested.request.tool.clone(),
                    reason: reason.clone(),
                    uncertain: true,
                    bypasses: Vec::new(),
                },
            )?;
            b.delete(PENDING_NS, &key);
            events.push(TurnEvent::ToolFailed {
                invocation_id: key,
                tool: requested.request.tool,
                reason,
                uncertain: true,
            });
        }
        if !b.is_empty() {
            self.commit(b, None)?;
            for event in events {
                (env.observer)(&event);
            }
        }
        Ok(())
    }

    /// Before a new turn replaces a cancelled one: settle the calls the
    /// cancelled turn never ran as rejected, so every call has a result.
    pub(super) fn abandon_cancelled(&mut self, b: &mut TxBuilder, env: &mut TurnEnv<'_>) -> Result<(), TurnError> {
        let Some(inner) = self.pc.resume.clone() else {
            return Ok(());
        };
        let Some(assistant) = inner.assistant.clone() else {
            return Ok(());
        };
        if !matches!(inner.phase, Phase::ToolCall | Phase::AwaitingApproval) {
            return Ok(());
        }
        let calls = self.assistant_calls(&assistant)?;
        let mut start = inner.call;
        if inner.phase == Phase::AwaitingApproval
            && let Some(inv) = &inner.invocation
        {
            let requested = self.pending_request(inv)?;
            let reason = "the turn was cancelled before this call was approved; it was not run".to_owned();
            b.entry(
                TOOL_REJECTED,
                &ToolRejected {
                    invocation_id: inv.clone(),
                    call_id: requested.request.call_id.clone(),
                    tool: requested.request.tool.clone(),
                    tier: requested.tier,
                    reason: reason.clone(),
                    verdict: None,
                },
            )?;
            b.delete(PENDING_NS, inv);
            (env.observer)(&TurnEvent::ToolRejected {
                invocation_id: inv.clone(),
                tool: requested.request.tool,
                risk: requested.tier,
                reason,
            });
            start += 1;
        }
        for call in calls.iter().skip(start) {
            let invocation_id = b.next_id("i");
            let request = self.tool_request(&invocation_id, call);
            b.entry(
                TOOL_REQUESTED,
                &ToolRequested {
                    invocation_id: invocation_id.clone(),
                    turn_id: inner.turn.clone().unwrap_or_default(),
                    request,
                    tier: None,
                    replay: None,
                },
            )?;
            let reason = "the turn was cancelled before this call ran; it was not run".to_owned();
            b.entry(
                TOOL_REJECTED,
                &ToolRejected {
                    invocation_id: invocation_id.clone(),
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    tier: None,
                    reason: reason.clone(),
                    verdict: None,
                },
            )?;
            (env.observer)(&TurnEvent::ToolRejected { invocation_id, tool: call.name.clone(), risk: None, reason });
        }
        Ok(())
    }

    /// The model asked for more tool calls in one message than the provider
    /// allows (`max_tool_calls`): the calls from `self.pc.call` on are not
    /// run; each is settled as rejected, with the reason the model sees, in
    /// one commit (a flood of calls is one line, not one line per call).
    fn refuse_excess_calls(
        &mut self,
        env: &mut TurnEnv<'_>,
        mut b: TxBuilder,
        calls: &[ToolCall],
        max_calls: usize,
    ) -> Result<(), TurnError> {
        let reason = format!(
            "not run: this message asked for {} tool calls and at most {max_calls} run per message; ask for the rest in a later message",
            calls.len()
        );
        let mut events = Vec::new();
        for call in calls.iter().skip(self.pc.call) {
            let invocation_id = b.next_id("i");
            let request = self.tool_request(&invocation_id, call);
            let requested = ToolRequested {
                invocation_id: invocation_id.clone(),
                turn_id: self.turn_id(),
                request,
                tier: None,
                replay: None,
            };
            b.entry(TOOL_REQUESTED, &requested)?;
            b.entry(
                TOOL_REJECTED,
                &ToolRejected {
                    invocation_id: invocation_id.clone(),
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    tier: None,
                    reason: reason.clone(),
                    verdict: None,
                },
            )?;
            events.push(TurnEvent::ToolRejected {
                invocation_id,
                tool: call.name.clone(),
                risk: None,
                reason: reason.clone(),
            });
        }
        // Every remaining call is settled: move on as after the message's last call.
        let pc = self.after_call(&mut b, self.pc.call + 1)?;
        self.commit(b, Some(pc))?;
        for event in &events {
            (env.observer)(event);
        }
        self.after_commit_events(env);
        Ok(())
    }
}
