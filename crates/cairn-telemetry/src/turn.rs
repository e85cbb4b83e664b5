//! One turn's spans and metrics, built from the events the turn tells its
//! observer (cairn-core's `TurnEvent`, committed before they are told), so
//! the core stays free of telemetry and every face is covered by the one
//! observer `Equipment::run` wraps.
//!
//! Spans (GenAI semantic conventions): `invoke_agent cairn` per turn (or
//! resume), `chat {model}` per model call, `execute_tool {tool}` per tool
//! call with an `approval` child while a person is asked and a
//! `create_agent cairn` child for a `spawn_agent` call (the child's turns
//! are under it); compaction is an event of the turn's span. Undo and redo
//! are spans of their own (`lib.rs`, [`crate::Operation`]). Attributes of cairn's own are under `cairn.*`.
//!
//! Must not: block (spans end into the batch processor's bounded queue) or
//! export content unless the plan captures it.

use std::collections::HashMap;

use cairn_core::TurnEvent;
use cairn_core::approval::Answer;
use cairn_core::report::UsageTotals;
use cairn_core::{TurnError, TurnOutcome, TurnStop};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId, TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::Span;

use crate::{Telemetry, adopted, global, ids};

/// The tool that spawns a subagent (cairn-runtime's `subagents.rs`).
const SPAWN_TOOL: &str = "spawn_agent";

/// Spans and metrics of one run of a face's step (a turn, a resume).
pub struct TurnTrace {
    t: &'static Telemetry,
    session: String,
    provider: String,
    model: String,
    turn: Option<Span>,
    chat: Option<Span>,
    /// The model call's attempts, summed as every report sums them.
    chat_usage: UsageTotals,
    tools: HashMap<String, Call>,
    approvals: HashMap<String, Span>,
    /// `create_agent` spans of `spawn_agent` calls, by invocation.
    spawns: HashMap<String, Span>,
    /// Each offered tool's replay class (`ToolSpec::replay`).
    replay: HashMap<String, &'static str>,
    /// The PostgreSQL worker holding the session's lease, and its epoch.
    worker: Option<(String, i64)>,
    ended_as: Option<&'static str>,
}

struct Call {
    span: Span,
    tool: String,
    risk: Option<&'static str>,
    verdict: Option<&'static str>,
}

impl std::fmt::Debug for TurnTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnTrace").field("session", &self.session).finish_non_exhaustive()
    }
}

fn risk_name(risk: cairn_core::tool::Risk) -> &'static str {
    use cairn_core::tool::Risk;
    match risk {
        Risk::ReadOnly => "readOnly",
        Risk::Write => "write",
        Risk::Destructive => "destructive",
    }
}

fn replay_name(replay: cairn_core::tool::ReplayPolicy) -> &'static str {
    use cairn_core::tool::ReplayPolicy;
    match replay {
        ReplayPolicy::Idempotent => "idempotent",
        ReplayPolicy::Guarded => "guarded",
        ReplayPolicy::Never => "never",
    }
}

fn finish_reason(stop: cairn_core::provider::StopReason) -> &'static str {
    use cairn_core::provider::StopReason;
    // The conventions' values where one exists.
    match stop {
        StopReason::EndTurn => "stop",
        StopReason::ToolUse => "tool_call",
        StopReason::MaxTokens => "length",
        StopReason::Other => "other",
    }
}

/// `gen_ai.provider.name` for cairn's provider names (the conventions'
/// well-known values where one applies).
fn provider_name(name: &str) -> String {
    match name {
        "openai" | "openai-chat" | "openai-responses" => "openai".to_owned(),
        "anthropic" => "anthropic".to_owned(),
        other => other.to_owned(),
    }
}

/// The trace a session's turns belong to.
pub(crate) fn trace_of(t: &Telemetry, session: &str) -> TraceId {
    match ids::split_child(session) {
        Some((parent, _)) => trace_of(t, parent),
        None => adopted(session)
            .or_else(|| t.parent.clone())
            .map_or_else(|| ids::session_trace(session), |sc| sc.trace_id()),
    }
}

/// The span a turn of `session` is a child of: the client's traceparent,
/// the spawning call's `create_agent` span for a child, the process's
/// `TRACEPARENT`, or none (a root whose trace id is the session's).
pub(crate) fn parent_of(t: &Telemetry, session: &str) -> Option<SpanContext> {
    if let Some(sc) = adopted(session) {
        return Some(sc);
    }
    if let Some((parent, invocation)) = ids::split_child(session) {
        return Some(SpanContext::new(
            trace_of(t, parent),
            ids::spawn_span(parent, invocation),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ));
    }
    t.parent.clone()
}

impl TurnTrace {
    /// A trace for one step of `session` run with `provider` / `model`;
    /// `None` when telemetry is off (the turn then pays nothing more).
    pub fn start(session: &str, provider: &str, model: &str) -> Option<Self> {
        let t = global()?;
        Some(TurnTrace {
            t,
            session: session.to_owned(),
            provider: provider_name(provider),
            model: model.to_owned(),
            turn: None,
            chat: None,
            chat_usage: UsageTotals::default(),
            tools: HashMap::new(),
            approvals: HashMap::new(),
            spawns: HashMap::new(),
            replay: HashMap::new(),
            worker: crate::worker_of(session),
            ended_as: None,
        })
    }

    /// The turn's tools, for the replay class of each call
    /// (`cairn.replay` on `execute_tool`).
    #[must_use]
    pub fn with_tools(mut self, specs: &[cairn_core::tool::ToolSpec]) -> Self {
        self.replay = specs.iter().map(|s| (s.name.clone(), replay_name(s.replay))).collect();
        self
    }

    fn replay_attr(&self, tool: &str) -> Option<KeyValue> {
        self.replay.get(tool).map(|r| KeyValue::new("cairn.replay", *r))
    }

    fn span(
        &self,
        name: String,
        kind: SpanKind,
        parent: Option<SpanContext>,
        ids: (Option<TraceId>, Option<opentelemetry::trace::SpanId>),
        attributes: Vec<KeyValue>,
    ) -> Span {
        let cx = match parent {
            Some(sc) => Context::new().with_remote_span_context(sc),
            None => Context::new(),
        };
        let mut attributes = attributes;
        if let Some((worker, epoch)) = &self.worker {
            attributes.push(KeyValue::new("cairn.worker.id", worker.clone()));
            attributes.push(KeyValue::new("cairn.lease.epoch", *epoch));
        }
        let tracer = &self.t.tracer;
        ids::with_ids(ids.0, ids.1, || {
            tracer.span_builder(name).with_kind(kind).with_attributes(attributes).start_with_context(tracer, &cx)
        })
    }

    fn under_turn(&self) -> Option<SpanContext> {
        self.turn.as_ref().map(|s| s.span_context().clone())
    }

    fn content(&self, text: &str) -> Option<Value> {
        self.t.capture.then(|| Value::from((self.t.scrub)(text)))
    }

    fn conversation(&self) -> KeyValue {
        KeyValue::new("gen_ai.conversation.id", self.session.clone())
    }

    /// Tell the trace one of the turn's events.
    pub fn observe(&mut self, event: &TurnEvent) {
        match event {
            TurnEvent::TurnStarted { turn_id, lane, resumed, prompt } => {
                self.end_turn_span(None);
                let mut attrs = vec![
                    KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                    KeyValue::new("gen_ai.agent.name", "cairn"),
                    KeyValue::new("gen_ai.provider.name", self.provider.clone()),
                    KeyValue::new("gen_ai.request.model", self.model.clone()),
                    self.conversation(),
                    KeyValue::new("cairn.turn.id", turn_id.clone()),
                    KeyValue::new("cairn.lane", lane.clone()),
                    KeyValue::new("cairn.resumed", *resumed),
                ];
                if let Some(v) = prompt.as_deref().and_then(|p| self.content(&input_messages(p))) {
                    attrs.push(KeyValue::new("gen_ai.input.messages", v));
                }
                let parent = parent_of(self.t, &self.session);
                let trace = parent.is_none().then(|| trace_of(self.t, &self.session));
                self.turn =
                    Some(self.span("invoke_agent cairn".to_owned(), SpanKind::Internal, parent, (trace, None), attrs));
            }
            TurnEvent::ProviderRequested { step, .. } => {
                self.end_chat(None);
                let attrs = vec![
                    KeyValue::new("gen_ai.operation.name", "chat"),
                    KeyValue::new("gen_ai.provider.name", self.provider.clone()),
                    KeyValue::new("gen_ai.request.model", self.model.clone()),
                    self.conversation(),
                    KeyValue::new("cairn.step", i64::from(*step)),
                ];
                let parent = self.under_turn();
                self.chat =
                    Some(self.span(format!("chat {}", self.model), SpanKind::Client, parent, (None, None), attrs));
                self.chat_usage = UsageTotals::default();
            }
            TurnEvent::Usage { usage } => {
                let i = &self.t.instruments;
                let common = [
                    KeyValue::new("gen_ai.operation.name", "chat"),
                    KeyValue::new("gen_ai.provider.name", provider_name(&usage.provider)),
                    KeyValue::new("gen_ai.request.model", usage.model.clone()),
                ];
                let mut with_error = common.to_vec();
                if let Some(status) = usage.status.filter(|s| *s >= 400) {
                    with_error.push(KeyValue::new("error.type", status.to_string()));
                } else if usage.error.is_some() {
                    with_error.push(KeyValue::new("error.type", "_OTHER"));
                }
                i.duration.record(usage.duration_ms as f64 / 1000.0, &with_error);
                if usage.error.is_none() {
                    let mut input = common.to_vec();
                    input.push(KeyValue::new("gen_ai.token.type", "input"));
                    i.tokens.record(usage.input_tokens, &input);
                    let mut output = common.to_vec();
                    output.push(KeyValue::new("gen_ai.token.type", "output"));
                    i.tokens.record(usage.output_tokens, &output);
                }
                // Every attempt's tokens are paid for, a failed one's too,
                // as the CLI's cost counts them; no price, no point.
                if let Some(usd) = (self.t.price)(usage) {
                    i.cost.add(usd, &common);
                }
                self.chat_usage.add(usage);
                if let Some(chat) = self.chat.as_mut() {
                    chat.set_attribute(KeyValue::new("gen_ai.response.model", usage.model.clone()));
                    chat.set_attribute(KeyValue::new("cairn.attempts", i64::from(usage.attempt)));
                }
            }
            TurnEvent::ProviderSettled { stop, tool_calls, .. } => {
                if let Some(chat) = self.chat.as_mut() {
                    chat.set_attribute(KeyValue::new(
                        "gen_ai.response.finish_reasons",
                        Value::Array(vec![opentelemetry::StringValue::from(finish_reason(*stop))].into()),
                    ));
                    chat.set_attribute(KeyValue::new("cairn.tool_calls", *tool_calls as i64));
                }
                self.end_chat(None);
            }
            TurnEvent::ProviderFailed { kind, message } => {
                self.end_chat(Some((kind.clone(), message.clone())));
            }
            TurnEvent::ToolRequested { invocation_id, call_id, tool, risk, arguments } => {
                let mut attrs = vec![
                    KeyValue::new("gen_ai.operation.name", "execute_tool"),
                    KeyValue::new("gen_ai.tool.name", tool.clone()),
                    KeyValue::new("gen_ai.tool.call.id", call_id.clone()),
                    KeyValue::new("gen_ai.tool.type", "function"),
                    self.conversation(),
                    KeyValue::new("cairn.invocation.id", invocation_id.clone()),
                ];
                let risk = risk.map(risk_name);
                if let Some(r) = risk {
                    attrs.push(KeyValue::new("cairn.risk", r));
                }
                attrs.extend(self.replay_attr(tool));
                if let Some(v) = self.content(&arguments.to_string()) {
                    attrs.push(KeyValue::new("gen_ai.tool.call.arguments", v));
                }
                let parent = self.under_turn();
                // The span id is the call's, so a child session spawned by
                // it finds its parent from its own id (`ids.rs`).
                let id = Some(ids::call_span(&self.session, invocation_id));
                let span = self.span(format!("execute_tool {tool}"), SpanKind::Internal, parent, (None, id), attrs);
                self.tools.insert(invocation_id.clone(), Call { span, tool: tool.clone(), risk, verdict: None });
            }
            TurnEvent::ApprovalAsked { invocation_id, tool, risk, .. } => {
                let parent = self.tools.get(invocation_id).map(|c| c.span.span_context().clone()).or(self.under_turn());
                let attrs = vec![
                    KeyValue::new("gen_ai.tool.name", tool.clone()),
                    KeyValue::new("cairn.risk", risk_name(*risk)),
                    self.conversation(),
                ];
                let span = self.span("approval".to_owned(), SpanKind::Internal, parent, (None, None), attrs);
                self.approvals.insert(invocation_id.clone(), span);
                self.t.instruments.approvals_waiting.add(1, &[KeyValue::new("gen_ai.tool.name", tool.clone())]);
            }
            TurnEvent::ApprovalVerdict { invocation_id, verdict } => {
                let decision = match &verdict.decision {
                    Answer::Approve => "approve",
                    Answer::ApproveForSession => "approveForSession",
                    Answer::Deny { .. } => "deny",
                };
                if let Some(mut span) = self.approvals.remove(invocation_id) {
                    span.set_attribute(KeyValue::new("cairn.approval.verdict", decision));
                    span.set_attribute(KeyValue::new("cairn.approval.by", verdict.by.clone()));
                    span.end();
                    let tool = self.tools.get(invocation_id).map(|c| c.tool.clone()).unwrap_or_default();
                    self.t.instruments.approvals_waiting.add(-1, &[KeyValue::new("gen_ai.tool.name", tool)]);
                }
                if let Some(call) = self.tools.get_mut(invocation_id) {
                    call.span.set_attribute(KeyValue::new("cairn.approval.verdict", decision));
                    call.span.set_attribute(KeyValue::new("cairn.approval.by", verdict.by.clone()));
                    call.verdict = Some(decision);
                }
            }
            TurnEvent::ToolStarted { invocation_id, tool, risk } => {
                if !self.tools.contains_key(invocation_id) {
                    // A resumed call: its intent was told by an earlier process.
                    let mut attrs = vec![
                        KeyValue::new("gen_ai.operation.name", "execute_tool"),
                        KeyValue::new("gen_ai.tool.name", tool.clone()),
                        self.conversation(),
                        KeyValue::new("cairn.invocation.id", invocation_id.clone()),
                        KeyValue::new("cairn.risk", risk_name(*risk)),
                        KeyValue::new("cairn.resumed", true),
                    ];
                    attrs.extend(self.replay_attr(tool));
                    let parent = self.under_turn();
                    let span =
                        self.span(format!("execute_tool {tool}"), SpanKind::Internal, parent, (None, None), attrs);
                    let call = Call { span, tool: tool.clone(), risk: Some(risk_name(*risk)), verdict: None };
                    self.tools.insert(invocation_id.clone(), call);
                }
                if let Some(call) = self.tools.get_mut(invocation_id) {
                    call.span.add_event("started", vec![]);
                }
                if tool == SPAWN_TOOL {
                    self.start_spawn(invocation_id);
                }
            }
            TurnEvent::ToolStaged { invocation_id, by, changes, .. } => {
                if let Some(call) = self.tools.get_mut(invocation_id) {
                    call.span.set_attribute(KeyValue::new("cairn.staged.verdict", "apply"));
                    call.span.set_attribute(KeyValue::new("cairn.staged.by", by.clone()));
                    call.span.set_attribute(KeyValue::new("cairn.staged.changes", *changes as i64));
                }
            }
            TurnEvent::ToolCompleted { invocation_id, tool, exit_code, output_summary, truncated } => {
                self.resumed_call(invocation_id, tool);
                let result = self.content(output_summary);
                self.settle(invocation_id, "done", None, |span| {
                    span.set_attribute(KeyValue::new("cairn.exit_code", i64::from(*exit_code)));
                    span.set_attribute(KeyValue::new("cairn.truncated", *truncated));
                    if let Some(v) = result {
                        span.set_attribute(KeyValue::new("gen_ai.tool.call.result", v));
                    }
                });
            }
            TurnEvent::ToolFailed { invocation_id, tool, reason, uncertain } => {
                // A call settled by a resume (after a crash, on another
                // worker) was started by an earlier process.
                self.resumed_call(invocation_id, tool);
                let settlement = if *uncertain { "uncertain" } else { "failed" };
                self.settle(invocation_id, settlement, Some(reason.clone()), |_| {});
            }
            TurnEvent::ToolRejected { invocation_id, tool, risk, reason } => {
                if !self.tools.contains_key(invocation_id) {
                    let parent = self.under_turn();
                    let attrs = vec![
                        KeyValue::new("gen_ai.operation.name", "execute_tool"),
                        KeyValue::new("gen_ai.tool.name", tool.clone()),
                        self.conversation(),
                    ];
                    let span =
                        self.span(format!("execute_tool {tool}"), SpanKind::Internal, parent, (None, None), attrs);
                    self.tools.insert(
                        invocation_id.clone(),
                        Call { span, tool: tool.clone(), risk: risk.map(risk_name), verdict: None },
                    );
                }
                self.settle(invocation_id, "rejected", Some(reason.clone()), |_| {});
            }
            TurnEvent::Final { text, .. } => {
                self.ended_as = Some("answered");
                if let Some(v) = self.content(&output_messages(text))
                    && let Some(turn) = self.turn.as_mut()
                {
                    turn.set_attribute(KeyValue::new("gen_ai.output.messages", v));
                }
            }
            TurnEvent::StepLimit { max_steps, .. } => {
                self.ended_as = Some("stepLimit");
                if let Some(turn) = self.turn.as_mut() {
                    turn.set_attribute(KeyValue::new("cairn.max_steps", i64::from(*max_steps)));
                }
            }
            TurnEvent::TurnCancelled { .. } => self.ended_as = Some("cancelled"),
            TurnEvent::Compacted { entry_id, messages, reason } => {
                if let Some(turn) = self.turn.as_mut() {
                    turn.add_event(
                        "compaction",
                        vec![
                            KeyValue::new("cairn.entry.id", entry_id.clone()),
                            KeyValue::new("cairn.compaction.messages", *messages as i64),
                            KeyValue::new("cairn.compaction.reason", format!("{reason:?}")),
                        ],
                    );
                }
            }
            // Deltas and output chunks are the face's to show; events added
            // to core later are not traced until named here.
            _ => {}
        }
    }

    /// An `execute_tool` span for a call this process did not see start
    /// (settled on resume), so its settlement is traced too.
    fn resumed_call(&mut self, invocation_id: &str, tool: &str) {
        if self.tools.contains_key(invocation_id) {
            return;
        }
        let mut attrs = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", tool.to_owned()),
            self.conversation(),
            KeyValue::new("cairn.invocation.id", invocation_id.to_owned()),
            KeyValue::new("cairn.resumed", true),
        ];
        attrs.extend(self.replay_attr(tool));
        let parent = self.under_turn();
        let span = self.span(format!("execute_tool {tool}"), SpanKind::Internal, parent, (None, None), attrs);
        self.tools.insert(invocation_id.to_owned(), Call { span, tool: tool.to_owned(), risk: None, verdict: None });
    }

    /// A `create_agent` span for the child a `spawn_agent` call starts,
    /// under the call's span, with the id the child's turns name as their
    /// parent (`ids::spawn_span`).
    fn start_spawn(&mut self, invocation_id: &str) {
        let parent = self.tools.get(invocation_id).map(|c| c.span.span_context().clone()).or(self.under_turn());
        let child = format!("{}+{invocation_id}", self.session);
        let attrs = vec![
            KeyValue::new("gen_ai.operation.name", "create_agent"),
            KeyValue::new("gen_ai.agent.name", "cairn"),
            KeyValue::new("gen_ai.agent.id", child.clone()),
            self.conversation(),
            KeyValue::new("cairn.child.session", child),
            KeyValue::new("cairn.invocation.id", invocation_id.to_owned()),
        ];
        let id = Some(ids::spawn_span(&self.session, invocation_id));
        let span = self.span("create_agent cairn".to_owned(), SpanKind::Internal, parent, (None, id), attrs);
        self.spawns.insert(invocation_id.to_owned(), span);
    }

    fn settle(
        &mut self,
        invocation_id: &str,
        settlement: &'static str,
        error: Option<String>,
        more: impl FnOnce(&mut Span),
    ) {
        if let Some(mut spawn) = self.spawns.remove(invocation_id) {
            spawn.set_attribute(KeyValue::new("cairn.settlement", settlement));
            if error.is_some() {
                spawn.set_status(Status::error("the spawn_agent call did not complete"));
            }
            spawn.end();
        }
        let Some(mut call) = self.tools.remove(invocation_id) else { return };
        call.span.set_attribute(KeyValue::new("cairn.settlement", settlement));
        more(&mut call.span);
        if let Some(reason) = error {
            call.span.set_attribute(KeyValue::new("error.type", settlement));
            call.span.set_status(Status::error(reason));
        }
        call.span.end();
        let mut attrs = vec![
            KeyValue::new("gen_ai.tool.name", call.tool),
            KeyValue::new("cairn.settlement", settlement),
            KeyValue::new("cairn.approval.verdict", call.verdict.unwrap_or("none")),
        ];
        if let Some(r) = call.risk {
            attrs.push(KeyValue::new("cairn.risk", r));
        }
        self.t.instruments.tool_calls.add(1, &attrs);
        if let Some(mut span) = self.approvals.remove(invocation_id) {
            span.end();
        }
    }

    fn end_chat(&mut self, error: Option<(String, String)>) {
        let Some(mut chat) = self.chat.take() else { return };
        let (input, output) = (self.chat_usage.input, self.chat_usage.output);
        chat.set_attribute(KeyValue::new("gen_ai.usage.input_tokens", input as i64));
        chat.set_attribute(KeyValue::new("gen_ai.usage.output_tokens", output as i64));
        if let Some((kind, message)) = error {
            chat.set_attribute(KeyValue::new("error.type", kind));
            chat.set_status(Status::error(message));
        }
        chat.end();
    }

    fn end_turn_span(&mut self, error: Option<String>) {
        self.end_chat(error.clone().map(|e| ("turn_error".to_owned(), e)));
        for (_, mut span) in self.approvals.drain() {
            span.set_attribute(KeyValue::new("cairn.approval.verdict", "unanswered"));
            span.end();
        }
        for (_, mut spawn) in self.spawns.drain() {
            spawn.set_attribute(KeyValue::new("cairn.settlement", "open"));
            spawn.end();
        }
        for (_, mut call) in self.tools.drain() {
            // Still open when the step ended: its settlement is in a later
            // process's resume (or the session's log).
            call.span.set_attribute(KeyValue::new("cairn.settlement", "open"));
            call.span.end();
        }
        let Some(mut turn) = self.turn.take() else { return };
        let ended = if error.is_some() { "error" } else { self.ended_as.take().unwrap_or("open") };
        turn.set_attribute(KeyValue::new("cairn.stop", ended));
        if let Some(e) = error {
            turn.set_attribute(KeyValue::new("error.type", "turn_error"));
            turn.set_status(Status::error(e));
        }
        turn.end();
        self.t.instruments.turns.add(1, &[KeyValue::new("cairn.stop", ended)]);
    }

    /// The step ended with `result`: end every span still open.
    pub fn finish(mut self, result: Result<Option<&TurnOutcome>, &TurnError>) {
        if let Ok(Some(outcome)) = result {
            self.ended_as.get_or_insert(match outcome.stop {
                TurnStop::Answered => "answered",
                TurnStop::StepLimit => "stepLimit",
                TurnStop::Cancelled => "cancelled",
                TurnStop::Stopped => "stopped",
            });
        }
        self.end_turn_span(result.err().map(|e| e.to_string()));
    }
}

impl Drop for TurnTrace {
    fn drop(&mut self) {
        // A panic or an early return: what is open still ends (spans end
        // when dropped, but the turn's attributes are set here).
        if self.turn.is_some() || self.chat.is_some() {
            self.end_turn_span(None);
        }
    }
}

fn input_messages(prompt: &str) -> String {
    serde_json::json!([{"role": "user", "parts": [{"type": "text", "content": prompt}]}]).to_string()
}

fn output_messages(text: &str) -> String {
    serde_json::json!([{"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": "stop"}])
        .to_string()
}
