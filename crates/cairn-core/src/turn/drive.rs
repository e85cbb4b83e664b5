//! The turn loop and the effect sandwich: one handler per stored phase, each
//! making exactly one durable move (a commit with a CAS on the pc), so the
//! same loop serves a fresh turn and a resumed one.
//!
//! It must not decide policy itself: what a call needs before it runs, and
//! the refusal of what needs a person when none can answer, come from the
//! approval gate ([`crate::approval::gate::gate`]). It must not hold
//! anything in memory that the log does not also say, and it tells
//! observers of an entry only through the [`TxBuilder`] that commits it.
//! Each settlement is written in one place ([`TxBuilder::settle`]).

use std::sync::Arc;

use serde_json::Value;

use super::asked::Announced;
use super::effect;
use super::{
    OP_NS, PENDING_NS, PROVIDER_OP, PendingValue, Phase, ProviderOp, Session, TurnEnv, TurnError, TurnOutcome,
    TurnStop, TxBuilder,
};
use crate::approval::gate::{self, READ_ONLY};
use crate::approval::{AllowRule, Answer, ApprovalRequest, Approver, Asker, Gated, Need, Verdict};
use crate::events::{
    EntryType, ToolBypassPayload, ToolCompletedPayload, ToolFailedPayload, ToolRejectedPayload, ToolRequestedPayload,
    ToolStagedPayload, ToolStartedPayload, TurnCancelledPayload, TurnEndedPayload, TurnEvent, VerdictRecord,
};
use crate::hooks::{HookRecord, PreTool};
use crate::message::{Message, Role, ToolCall};
use crate::provider::{ModelRequest, ModelResponse, ProviderErrorKind, RequestPurpose, StreamEvent};
use crate::registry::ToolRegistry;
use crate::schema;
use crate::storage::registers::AllowFact;
use crate::storage::{Storage, now_millis};
use crate::tool::{GuardVerdict, ReplayPolicy, Risk, Tool, ToolError, ToolLimits, ToolRequest, Validation};

/// How an invocation is settled.
enum Settlement {
    Completed(ToolCompletedPayload),
    Failed(ToolFailedPayload),
    Rejected(ToolRejectedPayload),
}

impl TxBuilder {
    /// Settle an invocation: its settlement entry, the event that tells it,
    /// and (when it has one) the end of its `pending` register, in one line.
    fn settle(&mut self, settlement: &Settlement, pending: bool) -> Result<(), TurnError> {
        let invocation_id = match settlement {
            Settlement::Completed(p) => {
                self.entry(p)?;
                self.tell(p.event());
                &p.invocation_id
            }
            Settlement::Failed(p) => {
                self.entry(p)?;
                self.tell(p.event());
                &p.invocation_id
            }
            Settlement::Rejected(p) => {
                self.entry(p)?;
                self.tell(p.event());
                &p.invocation_id
            }
        };
        if pending {
            self.delete(PENDING_NS, invocation_id);
        }
        Ok(())
    }
}

/// An approver's verdict as recorded now.
fn record(verdict: Verdict) -> VerdictRecord {
    VerdictRecord { decision: verdict.decision, by: verdict.by, at: now_millis() }
}

fn deny(reason: String, by: &str) -> VerdictRecord {
    record(Verdict { decision: Answer::Deny { reason }, by: by.to_owned() })
}

fn is_approve(v: &VerdictRecord) -> bool {
    !matches!(v.decision, Answer::Deny { .. })
}

/// The risk of one call of `tool`: the declared one, or higher for these
/// arguments.
fn call_risk(tool: &Arc<dyn Tool>, request: &ToolRequest) -> Risk {
    tool.risk(&request.arguments).max(tool.spec().risk)
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
    Ok(call_risk(tool, request))
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
            (_, None) => match &self.pc.stopped {
                Some(reason) => (TurnStop::Stopped, reason.clone(), None),
                None => (TurnStop::StepLimit, String::new(), None),
            },
        };
        TurnOutcome { turn_id: self.turn_id(), stop, text, entry_id, steps: self.pc.step }
    }

    /// Settle the turn as cancelled (resumable from the current pc). A
    /// provider call in flight ends with it (`resume` starts it again).
    fn cancel_turn(&mut self, env: &mut TurnEnv<'_>, mut b: TxBuilder) -> Result<(), TurnError> {
        let turn_id = self.turn_id();
        b.entry(&TurnCancelledPayload { turn_id: turn_id.clone(), reason: "cancelled by the host".to_owned() })?;
        if self.pc.phase == Phase::Planning {
            b.delete(OP_NS, PROVIDER_OP);
        }
        let mut pc = self.pc.to(Phase::Cancelled)?;
        pc.resume = Some(Box::new(self.pc.clone()));
        b.tell(TurnEvent::TurnCancelled { turn_id });
        self.commit(b, Some(pc), env.observer)
    }

    /// The provider call: intent is the `Planning` pc (+ `op/provider`);
    /// the settled assistant message and its usage rows are one commit.
    fn plan(&mut self, env: &mut TurnEnv<'_>) -> Result<(), TurnError> {
        if env.cancel.is_cancelled() {
            let b = self.tx();
            return self.cancel_turn(env, b);
        }
        let turn_id = self.turn_id();
        // The request is the bounded view; a provider that still refuses
        // it as too long gets one compaction and one retry (its refused
        // attempts are recorded as usage rows first).
        let mut rejected: Option<u64> = None;
        let (result, request_bytes) = loop {
            let view = self.request_view(env, rejected)?;
            if env.cancel.is_cancelled() {
                let b = self.tx();
                return self.cancel_turn(env, b);
            }
            (env.observer)(&TurnEvent::ProviderRequested { turn_id: turn_id.clone(), step: self.pc.step });
            let request = ModelRequest {
                system: self.config.system.as_deref(),
                messages: &view.messages,
                tools: env.tools.specs(),
                max_output_tokens: view.max_output_tokens,
                earlier_assistant_messages: view.earlier_assistant_messages,
                purpose: RequestPurpose::Turn,
            };
            let observer = &mut *env.observer;
            let mut forward = |event: &StreamEvent| observer(&TurnEvent::Delta { event: event.clone() });
            let result = env
                .provider
                .complete(&request, &mut forward, env.cancel)
                .and_then(ModelResponse::refuse_duplicate_call_ids);
            match result {
                Err(error)
                    if error.kind == ProviderErrorKind::ContextLength
                        && rejected.is_none()
                        && !env.cancel.is_cancelled() =>
                {
                    let mut b = self.tx();
                    for mut attempt in error.attempts {
                        attempt.request_bytes = view.request_bytes;
                        b.usage(None, &attempt)?;
                        b.tell(TurnEvent::Usage { usage: attempt });
                    }
                    if !b.is_empty() {
                        self.commit(b, None, env.observer)?;
                    }
                    (env.observer)(&TurnEvent::ProviderFailed {
                        kind: "contextLength".to_owned(),
                        message: format!(
                            "{} (estimated {} tokens); compacting and retrying once",
                            error.message, view.tokens
                        ),
                    });
                    rejected = Some(view.tokens + view.max_output_tokens.map_or(0, u64::from));
                }
                other => break (other, view.request_bytes),
            }
        };
        match result {
            Ok(mut response) => {
                for attempt in &mut response.attempts {
                    attempt.request_bytes = request_bytes;
                }
                if let (Some(bytes), Some(last)) = (request_bytes, response.attempts.last()) {
                    let tokens = last.input_tokens;
                    self.observe_usage(env.provider, bytes, tokens);
                }
                let mut b = self.tx();
                let mut message = response.message;
                message.role = Role::Assistant;
                let calls = message.tool_calls().count();
                let id = b.entry(&message)?;
                for attempt in &response.attempts {
                    b.usage(Some(&id), attempt)?;
                }
                b.delete(OP_NS, PROVIDER_OP);
                let mut pc = self.pc.to(if calls == 0 { Phase::Final } else { Phase::ToolCall })?;
                pc.assistant = Some(id.clone());
                pc.call = 0;
                for usage in response.attempts {
                    b.tell(TurnEvent::Usage { usage });
                }
                b.tell(TurnEvent::ProviderSettled { entry_id: id.clone(), stop: response.stop, tool_calls: calls });
                if calls == 0 {
                    b.tell(TurnEvent::Final { turn_id, text: message.joined_text(), entry_id: id });
                }
                self.commit(b, Some(pc), env.observer)
            }
            Err(error) => {
                let mut b = self.tx();
                for attempt in &error.attempts {
                    b.usage(None, attempt)?;
                    b.tell(TurnEvent::Usage { usage: attempt.clone() });
                }
                if error.kind == ProviderErrorKind::Cancelled || env.cancel.is_cancelled() {
                    return self.cancel_turn(env, b);
                }
                if !b.is_empty() {
                    self.commit(b, None, env.observer)?;
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
            b.entry(&TurnEndedPayload {
                turn_id: self.turn_id(),
                reason: format!("step limit of {} provider calls reached", self.config.max_steps),
            })?;
            b.tell(TurnEvent::StepLimit { turn_id: self.turn_id(), max_steps: self.config.max_steps });
            let mut p = base.to(Phase::Final)?;
            p.assistant = None;
            p
        } else {
            let step = base.step.saturating_add(1);
            b.set(OP_NS, PROVIDER_OP, &ProviderOp { step, turn_id: self.turn_id() })?;
            let mut p = base.to(Phase::Planning)?;
            p.step = step;
            p.assistant = None;
            p.call = 0;
            p
        };
        next.invocation = None;
        Ok(next)
    }

    /// Commit the settlement of the current call and move the pc past it.
    fn settle_call(
        &mut self,
        env: &mut TurnEnv<'_>,
        mut b: TxBuilder,
        settlement: &Settlement,
        pending: bool,
        calls: usize,
    ) -> Result<(), TurnError> {
        b.settle(settlement, pending)?;
        let pc = self.after_call(&mut b, calls)?;
        self.commit(b, Some(pc), env.observer)?;
        self.tell_post_tool(env, settlement);
        Ok(())
    }

    /// Tell the `post_tool` hooks a settlement, once it is durable; nothing
    /// they do changes it.
    fn tell_post_tool(&self, env: &TurnEnv<'_>, settlement: &Settlement) {
        if let Some(hooks) = env.tools.hooks() {
            let (kind, payload) = match settlement {
                Settlement::Completed(p) => (EntryType::ToolCompleted, serde_json::to_value(p)),
                Settlement::Failed(p) => (EntryType::ToolFailed, serde_json::to_value(p)),
                Settlement::Rejected(p) => (EntryType::ToolRejected, serde_json::to_value(p)),
            };
            if let Ok(payload) = payload {
                hooks.post_tool(kind, &payload, &self.cwd);
            }
        }
    }

    /// A `pre_tool` hook stopped the turn at the current call (`by`, its
    /// `reason`): the call's refusal, a refusal of each remaining call of
    /// the message, and the end of the turn, in one line; no provider call
    /// follows.
    fn stop_turn(
        &mut self,
        env: &mut TurnEnv<'_>,
        mut b: TxBuilder,
        settlement: &Settlement,
        calls: &[ToolCall],
        by: &str,
        reason: &str,
    ) -> Result<(), TurnError> {
        b.settle(settlement, false)?;
        let rest = format!("not run: {by} stopped the turn before this call ({reason})");
        for call in calls.iter().skip(self.pc.call + 1) {
            let invocation_id = b.next_id("i");
            let request = self.tool_request(&invocation_id, call);
            let requested = ToolRequestedPayload::new(self.turn_id(), request.clone(), None, None);
            b.entry(&requested)?;
            b.tell(requested.event());
            b.settle(&Settlement::Rejected(ToolRejectedPayload::new(&request, None, rest.clone())), false)?;
        }
        b.entry(&TurnEndedPayload { turn_id: self.turn_id(), reason: format!("stopped by {by}: {reason}") })?;
        let mut pc = self.pc.to(Phase::Final)?;
        pc.assistant = None;
        pc.invocation = None;
        pc.stopped = Some(reason.to_owned());
        self.commit(b, Some(pc), env.observer)?;
        self.tell_post_tool(env, settlement);
        Ok(())
    }

    /// Remember a Write call approved "for this session" as an allow rule
    /// (a `fact`); the gate says what may be remembered.
    fn remember(
        &self,
        b: &mut TxBuilder,
        v: &VerdictRecord,
        risk: Risk,
        request: &ToolRequest,
    ) -> Result<Option<AllowRule>, TurnError> {
        if v.decision != Answer::ApproveForSession {
            return Ok(None);
        }
        let Some(rule) = gate::session_rule(&request.tool, risk, &request.arguments) else {
            return Ok(None);
        };
        let parsed = AllowRule::parse(&rule)?;
        let fact = AllowFact { at: v.at, by: v.by.clone(), invocation_id: request.invocation_id.clone() };
        b.allow_fact(&rule, &fact)?;
        Ok(Some(parsed))
    }

    /// Commit the approved start of `request` (with its intent's `pending`
    /// register when the intent is in the same line) and move to Executing.
    fn start(
        &mut self,
        env: &mut TurnEnv<'_>,
        mut b: TxBuilder,
        request: &ToolRequest,
        risk: Risk,
        v: VerdictRecord,
        pending: Option<PendingValue>,
    ) -> Result<(), TurnError> {
        let invocation_id = request.invocation_id.clone();
        let staged = env.tools.get(&request.tool).is_some_and(|t| t.stages_effect(&request.arguments));
        b.entry(&ToolStartedPayload::new(request, v.clone()).staged(staged))?;
        let rule = self.remember(&mut b, &v, risk, request)?;
        if let Some(pending) = &pending {
            b.set(PENDING_NS, &invocation_id, pending)?;
        }
        let mut pc = self.pc.to(Phase::Executing)?;
        pc.invocation = Some(invocation_id.clone());
        b.tell(TurnEvent::ApprovalVerdict { invocation_id: invocation_id.clone(), verdict: v });
        b.tell(TurnEvent::ToolStarted { invocation_id: invocation_id.clone(), tool: request.tool.clone(), risk });
        self.commit(b, Some(pc), env.observer)?;
        if let Some(rule) = rule {
            self.session_allow.push(rule);
        }
        self.started_here = Some(invocation_id);
        Ok(())
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
            return self.commit(b, Some(pc), env.observer);
        };
        let max_calls = env.provider.max_tool_calls().max(1);
        if self.pc.call >= max_calls {
            return self.refuse_excess_calls(env, b, &calls, max_calls);
        }
        let request_entry = b.next_id("e");
        let invocation_id = b.next_id("i");
        let mut request = self.tool_request(&invocation_id, &call);
        // The hooks speak before the intent is committed, and what they
        // said is part of it.
        let mode = env.approver.mode();
        let mut stop = None;
        let (hook, refused) = match env.tools.hooks().map(|h| h.pre_tool(&request, &self.cwd, mode)) {
            None | Some(PreTool::Continue) => (None, None),
            Some(PreTool::Deny { by, reason }) => {
                (Some(HookRecord::Deny { by: by.clone(), reason: reason.clone() }), Some(deny(reason, &by)))
            }
            Some(PreTool::Stop { by, reason }) => {
                let refusal = deny(format!("{by} stopped the turn: {reason}"), &by);
                stop = Some((by.clone(), reason.clone()));
                (Some(HookRecord::Stop { by, reason }), Some(refusal))
            }
            Some(PreTool::Rewrite { by, arguments }) => {
                let original_arguments = std::mem::replace(&mut request.arguments, arguments);
                (Some(HookRecord::Rewrite { by, original_arguments }), None)
            }
            Some(PreTool::Ask { by, reason, rewrite }) => {
                let (rewritten_by, original_arguments) = match rewrite {
                    Some((rewritten_by, arguments)) => {
                        (Some(rewritten_by), Some(std::mem::replace(&mut request.arguments, arguments)))
                    }
                    None => (None, None),
                };
                (Some(HookRecord::Ask { by, reason, rewritten_by, original_arguments }), None)
            }
        };
        let hook_asks = hook.as_ref().and_then(HookRecord::asks).map(str::to_owned);
        let tool = env.tools.get(&request.tool).cloned();
        let requested = ToolRequestedPayload::new(
            self.turn_id(),
            request.clone(),
            tool.as_ref().map(|t| call_risk(t, &request)),
            tool.as_ref().map(|t| t.spec().replay),
        )
        .with_hook(hook);
        b.entry(&requested)?;
        b.tell(requested.event());
        if let Some(v) = refused {
            b.tell(TurnEvent::ApprovalVerdict { invocation_id, verdict: v.clone() });
            let rejected = ToolRejectedPayload::by_verdict(&request, requested.tier.unwrap_or(Risk::Write), v);
            if let Some((by, reason)) = stop {
                return self.stop_turn(env, b, &Settlement::Rejected(rejected), &calls, &by, &reason);
            }
            return self.settle_call(env, b, &Settlement::Rejected(rejected), false, calls.len());
        }
        let risk = match check_call(tool.as_ref(), &request, env.tools) {
            Ok(risk) => risk,
            Err(reason) => {
                let rejected = ToolRejectedPayload::new(&request, requested.tier, reason);
                return self.settle_call(env, b, &Settlement::Rejected(rejected), false, calls.len());
            }
        };
        let staged = tool.as_ref().is_some_and(|t| t.stages_effect(&request.arguments));
        let gated = Gated { hook_asks: hook_asks.as_deref(), ..Gated::call(&request.tool, risk) };
        let quick = match gate::gate(gated, Asker::of(&*env.approver)) {
            Err(refusal) => {
                Some(record(with_why(refusal, tool.as_ref().and_then(|t| t.risk_reason(&request.arguments)))))
            }
            Ok(Need::Nothing) => Some(record(Verdict { decision: Answer::Approve, by: READ_ONLY.to_owned() })),
            Ok(Need::Person) => None,
            Ok(Need::RuleOrVerdict) => {
                match self.session_allow.check_call(&request.tool, risk, &request.arguments, staged) {
                    Ok(rule) => {
                        Some(record(Verdict { decision: Answer::Approve, by: format!("session:{}", rule.text()) }))
                    }
                    Err(_) => {
                        let why = tool.as_ref().and_then(|t| t.risk_reason(&request.arguments));
                        let ask = ApprovalRequest {
                            session_id: &request.session_id,
                            invocation_id: &invocation_id,
                            tool: &request.tool,
                            risk,
                            arguments: &request.arguments,
                            preview: None,
                            cwd: &self.cwd,
                            bypass: None,
                            staged,
                            why: why.as_deref(),
                            hook_asks: None,
                        };
                        env.approver.pre_approve(&ask).map(record)
                    }
                }
            }
        };
        let pending = PendingValue { request_entry, turn_id: self.turn_id() };
        match quick {
            Some(v) if is_approve(&v) => self.start(env, b, &request, risk, v, Some(pending)),
            Some(v) => {
                b.tell(TurnEvent::ApprovalVerdict { invocation_id, verdict: v.clone() });
                let rejected = ToolRejectedPayload::by_verdict(&request, risk, v);
                self.settle_call(env, b, &Settlement::Rejected(rejected), false, calls.len())
            }
            None => {
                b.set(PENDING_NS, &invocation_id, &pending)?;
                let mut pc = self.pc.to(Phase::AwaitingApproval)?;
                pc.invocation = Some(invocation_id);
                self.commit(b, Some(pc), env.observer)
            }
        }
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
        // A hook's question is part of the intent: a resumed turn asks a
        // person too.
        let hook_asks = requested.hook.as_ref().and_then(HookRecord::asks).map(str::to_owned);
        let request = requested.request;
        let risk = requested.tier.unwrap_or(Risk::Write);
        let tool = env.tools.get(&request.tool).cloned();
        let gated = Gated { hook_asks: hook_asks.as_deref(), ..Gated::call(&request.tool, risk) };
        let mut v = match &tool {
            None => deny(format!("tool {:?} is no longer available", request.tool), "policy:unavailable"),
            Some(tool) => match gate::gate(gated, Asker::of(&*env.approver)) {
                Err(refusal) => record(with_why(refusal, tool.risk_reason(&request.arguments))),
                Ok(need) => {
                    let preview = tool.preview(&request, &self.cwd);
                    let why = match &hook_asks {
                        Some(reason) => Some(format!("a pre_tool hook asks for a person's approval: {reason}")),
                        None => tool.risk_reason(&request.arguments),
                    };
                    let ask = ApprovalRequest {
                        session_id: &request.session_id,
                        invocation_id: &invocation_id,
                        tool: &request.tool,
                        risk,
                        arguments: &request.arguments,
                        preview: preview.as_ref(),
                        cwd: &self.cwd,
                        bypass: None,
                        staged: tool.stages_effect(&request.arguments),
                        why: why.as_deref(),
                        hook_asks: hook_asks.as_deref(),
                    };
                    let mut asked = Announced { approver: &mut *env.approver, announce: &mut *env.observer };
                    match asked.decide(&ask) {
                        Ok(answer) => record(need.bound(answer)),
                        Err(e) => deny(format!("the approver failed ({e}); the call was not run"), "approver:error"),
                    }
                }
            },
        };
        if is_approve(&v) && env.cancel.is_cancelled() {
            v = deny("the turn was cancelled while this call awaited approval".to_owned(), "host:cancel");
        }
        let mut b = self.tx();
        if is_approve(&v) {
            self.start(env, b, &request, risk, v, None)
        } else {
            b.tell(TurnEvent::ApprovalVerdict { invocation_id, verdict: v.clone() });
            let rejected = ToolRejectedPayload::by_verdict(&request, risk, v);
            self.settle_call(env, b, &Settlement::Rejected(rejected), true, calls)
        }
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
        let uncertain = |reason: String| Settlement::Failed(ToolFailedPayload::new(&request, reason, true, Vec::new()));
        // A staged call whose change set was committed: finish applying
        // it (idempotent) and never re-run the command.
        let staged = if fresh { None } else { self.staged_record(&invocation_id)? };
        let settlement = match (&tool, staged, fresh, requested.replay.unwrap_or(ReplayPolicy::Never)) {
            (None, _, _, _) => uncertain(format!(
                "interrupted: cairn stopped while {} ran and the tool is no longer registered, so it was not re-run; whether its effect happened is unknown",
                request.tool
            )),
            (Some(tool), Some(staged), _, _) => {
                // Finishing the apply is an effect: not once the lease (or
                // the turn) may be ending; the call stays unsettled.
                effect::precondition(&self.store, env.cancel).map_err(TurnError::NotStarted)?;
                let commit = crate::staged::StagedCommit {
                    changes: &staged.change_set,
                    staging: &staged.staging,
                    approved_by: &staged.verdict.by,
                };
                match tool.resume_staged(&request, &self.cwd, &commit) {
                    GuardVerdict::NotDone | GuardVerdict::Unknown => uncertain(format!(
                        "interrupted: cairn stopped while applying the committed change set of {}, and it could not be finished; the working tree may hold part of it — check before retrying",
                        request.tool
                    )),
                    verdict => self.guarded(verdict, &request, tool.as_ref(), risk, env)?,
                }
            }
            (Some(tool), None, true, _) | (Some(tool), None, false, ReplayPolicy::Idempotent) => {
                self.run_effect(tool.as_ref(), &request, risk, env)?
            }
            (Some(tool), None, false, ReplayPolicy::Guarded) => {
                let verdict = tool.guard(&request, &self.cwd);
                self.guarded(verdict, &request, tool.as_ref(), risk, env)?
            }
            (Some(_), None, false, ReplayPolicy::Never) => uncertain(format!(
                "interrupted: cairn stopped while {} ran; it is not safe to re-run, so it was not, and whether its effect happened is unknown — check before retrying",
                request.tool
            )),
        };
        let b = self.tx();
        self.settle_call(env, b, &settlement, true, calls)
    }

    /// The settlement a guard's verdict leads to (running the effect when
    /// it was not done).
    fn guarded(
        &mut self,
        verdict: GuardVerdict,
        request: &ToolRequest,
        tool: &dyn Tool,
        risk: Risk,
        env: &mut TurnEnv<'_>,
    ) -> Result<Settlement, TurnError> {
        Ok(match verdict {
            GuardVerdict::AlreadyDone(mut receipt) => {
                let full_output =
                    effect::apply_cap(&mut receipt, self.config.output_cap, self.config.stored_output_cap);
                Settlement::Completed(ToolCompletedPayload::new(
                    request,
                    receipt,
                    full_output,
                    Some("guard".to_owned()),
                    Vec::new(),
                ))
            }
            GuardVerdict::NotDone => self.run_effect(tool, request, risk, env)?,
            GuardVerdict::NotApplied(reason) => {
                Settlement::Failed(ToolFailedPayload::new(request, reason, false, Vec::new()))
            }
            GuardVerdict::Unknown => Settlement::Failed(ToolFailedPayload::new(
                request,
                format!(
                    "interrupted: cairn stopped while {} ran and its guard cannot tell whether the effect happened; it was not re-run — check before retrying",
                    request.tool
                ),
                true,
                Vec::new(),
            )),
        })
    }

    /// The committed change set of a staged invocation, if any.
    fn staged_record(&self, invocation: &str) -> Result<Option<ToolStagedPayload>, TurnError> {
        let mut found: Option<Result<ToolStagedPayload, TurnError>> = None;
        // Lent views: no copy of every entry of a long log per staged call.
        self.store.visit_entry_views(&mut |entry| {
            if found.is_none() && entry.entry_type == EntryType::ToolStaged.tag() {
                match entry.parse::<ToolStagedPayload>() {
                    Ok(p) if p.invocation_id == invocation => found = Some(Ok(p)),
                    Ok(_) => {}
                    Err(e) => found = Some(Err(TurnError::Corrupt(format!("toolStaged {}: {e}", entry.id)))),
                }
            }
        });
        found.transpose()
    }

    /// Run the effect once. Each sandbox bypass verdict is committed as its
    /// own `toolBypass` entry the moment it is given; a bypass whose verdict
    /// cannot be recorded is refused, and the turn then stops with the
    /// storage error (the call stays unsettled and resume applies its
    /// replay policy).
    fn run_effect(
        &mut self,
        tool: &dyn Tool,
        request: &ToolRequest,
        risk: Risk,
        env: &mut TurnEnv<'_>,
    ) -> Result<Settlement, TurnError> {
        // Checked right before the tool starts (its toolStarted commit may
        // have been answered late): a call that never started is settled
        // as not run, which is true whoever commits next.
        if let Err(why) = effect::precondition(&self.store, env.cancel) {
            let reason = format!("not run: {why} before it started");
            return Ok(Settlement::Failed(ToolFailedPayload::new(request, reason, false, Vec::new())));
        }
        let limits = ToolLimits { timeout: self.config.tool_timeout, output_cap: self.config.output_cap };
        let cwd = self.cwd.clone();
        let cancel = env.cancel;
        let mut commit_bypass = |what: effect::Record<'_>| -> Result<(), TurnError> {
            let mut b = self.tx();
            match what {
                effect::Record::Bypass(bypass) => b.entry(&ToolBypassPayload::new(request, bypass.clone()))?,
                effect::Record::Staged(staged) => b.entry(staged)?,
            };
            self.commit(b, None, &mut |_: &TurnEvent| {})?;
            // What the record allows (a bypassed re-run, the apply) is an
            // effect of its own, and this commit's reply may have come late.
            effect::precondition(&self.store, cancel).map_err(TurnError::NotStarted)
        };
        let ran = effect::run(
            tool,
            request,
            risk,
            &cwd,
            limits,
            env.cancel,
            &mut *env.observer,
            &mut *env.approver,
            &mut commit_bypass,
        );
        if let Some(error) = ran.record_error {
            return Err(error);
        }
        Ok(match ran.result {
            Ok(mut receipt) => {
                let full_output =
                    effect::apply_cap(&mut receipt, self.config.output_cap, self.config.stored_output_cap);
                Settlement::Completed(ToolCompletedPayload::new(request, receipt, full_output, None, ran.bypasses))
            }
            Err(ToolError::Rejected(reason)) => match ran.staged_denial {
                Some(verdict) => {
                    Settlement::Rejected(ToolRejectedPayload::by_verdict(request, Risk::Destructive, verdict))
                }
                None => Settlement::Rejected(ToolRejectedPayload::new(request, Some(Risk::Destructive), reason)),
            },
            Err(error) => {
                let reason = match error {
                    ToolError::Cancelled if ran.timed_out => {
                        format!("timed out after {:?} (the per-tool time limit)", self.config.tool_timeout)
                    }
                    ToolError::Cancelled => "cancelled by the host".to_owned(),
                    other => other.to_string(),
                };
                Settlement::Failed(ToolFailedPayload::new(request, reason, false, ran.bypasses))
            }
        })
    }

    /// Settle `pending` keys the pc does not point at (only a log written by
    /// something else has them) as failed-uncertain, so nothing is left
    /// without a way forward. Runs before every resume and every new turn.
    pub(super) fn settle_orphans(&mut self, env: &mut TurnEnv<'_>) -> Result<(), TurnError> {
        let current = match self.pc.phase {
            Phase::AwaitingApproval | Phase::Executing => self.pc.invocation.clone(),
            Phase::Cancelled => self.pc.resume.as_ref().and_then(|r| r.invocation.clone()),
            _ => None,
        };
        let mut b = self.tx();
        for (key, _) in self.store.registers(PENDING_NS) {
            if Some(&key) == current.as_ref() {
                continue;
            }
            let requested = self.pending_request(&key)?;
            let reason =
                "found unsettled on resume and not at the turn's position; not re-run, effect unknown".to_owned();
            let failed = ToolFailedPayload::new(&requested.request, reason, true, Vec::new());
            b.settle(&Settlement::Failed(failed), true)?;
        }
        if !b.is_empty() {
            self.commit(b, None, env.observer)?;
        }
        Ok(())
    }

    /// Before a new turn replaces a cancelled one: settle the calls the
    /// cancelled turn never ran as rejected, so every call has a result.
    /// Adds to `b`; observers are told once `b` is committed.
    pub(super) fn abandon_cancelled(&mut self, b: &mut TxBuilder) -> Result<(), TurnError> {
        let Some(inner) = self.pc.resume.clone() else {
            return Ok(());
        };
        self.abandon_calls(&inner, b)
    }

    /// Settle as rejected the calls a turn standing at `inner` never ran
    /// (the one awaiting approval, the rest of its assistant message).
    /// Adds to `b`.
    pub(super) fn abandon_calls(&mut self, inner: &super::Pc, b: &mut TxBuilder) -> Result<(), TurnError> {
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
            let rejected = ToolRejectedPayload::new(&requested.request, requested.tier, reason);
            b.settle(&Settlement::Rejected(rejected), true)?;
            start += 1;
        }
        for call in calls.iter().skip(start) {
            let invocation_id = b.next_id("i");
            let request = self.tool_request(&invocation_id, call);
            b.entry(&ToolRequestedPayload::new(inner.turn.clone().unwrap_or_default(), request.clone(), None, None))?;
            let reason = "the turn was cancelled before this call ran; it was not run".to_owned();
            b.settle(&Settlement::Rejected(ToolRejectedPayload::new(&request, None, reason)), false)?;
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
        for call in calls.iter().skip(self.pc.call) {
            let invocation_id = b.next_id("i");
            let request = self.tool_request(&invocation_id, call);
            b.entry(&ToolRequestedPayload::new(self.turn_id(), request.clone(), None, None))?;
            b.settle(&Settlement::Rejected(ToolRejectedPayload::new(&request, None, reason.clone())), false)?;
        }
        // Every remaining call is settled: move on as after the message's last call.
        let pc = self.after_call(&mut b, self.pc.call + 1)?;
        self.commit(b, Some(pc), env.observer)?;
        Ok(())
    }
}

/// A refusal by the gate with why the tool raised the call's tier (a
/// destructive pattern, an authority path), so the headless reason says
/// what a person would have been shown.
fn with_why(mut refusal: Verdict, why: Option<String>) -> Verdict {
    if let (Answer::Deny { reason }, Some(why)) = (&mut refusal.decision, why) {
        reason.push_str(&format!("; why it is Destructive: {why}"));
    }
    refusal
}
