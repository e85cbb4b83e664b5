//! What an application sees of a turn: typed [`Event`]s while it runs (the
//! core's `TurnEvent`s, as an embedder needs them), and the [`Outcome`]
//! when it ends, with the tool calls the turn settled.
//!
//! Must not: keep anything the session file does not (the outcome is read
//! from the events of this run; the file stays the truth).

use cairn_core::TurnEvent;
use cairn_core::provider::StreamEvent;
use cairn_core::risk::Risk;
use serde::Serialize;
use serde_json::Value;

/// One thing that happened in a turn, in order, each told after the
/// session file recorded it (text deltas excepted: they are the model's
/// answer as it streams).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// More of the model's visible answer (a retried attempt starts over:
    /// see [`Event::Retry`]).
    TextDelta {
        /// The new text.
        text: String,
    },
    /// The model's call failed and is tried again from the start: text
    /// deltas told since the last attempt began are void.
    Retry {
        /// The attempt now starting, 2 or more.
        attempt: u32,
    },
    /// The model asked for a tool call; its intent is recorded.
    ToolRequested {
        /// The call's invocation id.
        invocation_id: String,
        /// The tool.
        tool: String,
        /// Its arguments.
        arguments: Value,
        /// Its risk tier, when the tool is known.
        risk: Option<Risk>,
    },
    /// The approver is being asked about a call.
    ApprovalAsked {
        /// The call's invocation id.
        invocation_id: String,
        /// The tool.
        tool: String,
        /// The call's risk tier.
        risk: Risk,
    },
    /// A call was approved (by policy, a rule or the approver) and starts.
    ToolStarted {
        /// The call's invocation id.
        invocation_id: String,
        /// The tool.
        tool: String,
    },
    /// A call finished; the model sees `output`.
    ToolCompleted {
        /// The call's invocation id.
        invocation_id: String,
        /// The tool.
        tool: String,
        /// What the model sees (capped).
        output: String,
    },
    /// A call failed (the tool's error, or it was cut short and not run
    /// again: then `uncertain`).
    ToolFailed {
        /// The call's invocation id.
        invocation_id: String,
        /// The tool.
        tool: String,
        /// Why, as the model is told.
        reason: String,
        /// Whether its effect is unknown (interrupted, not re-run).
        uncertain: bool,
    },
    /// A call was refused before it ran (denied, unknown tool, bad
    /// arguments).
    ToolRejected {
        /// The call's invocation id.
        invocation_id: String,
        /// The tool.
        tool: String,
        /// Why, as the model is told.
        reason: String,
    },
    /// Tokens of one model call (every attempt, retries included).
    Usage {
        /// Input tokens.
        input_tokens: u64,
        /// Output tokens.
        output_tokens: u64,
    },
    /// The turn's final answer.
    Final {
        /// The answer.
        text: String,
    },
}

impl Event {
    /// The embedder's view of a core event, if it has one.
    pub(crate) fn of(event: &TurnEvent) -> Option<Self> {
        Some(match event {
            TurnEvent::Delta { event: StreamEvent::TextDelta { text } } => Event::TextDelta { text: text.clone() },
            TurnEvent::Delta { event: StreamEvent::AttemptStarted { attempt } } if *attempt > 1 => {
                Event::Retry { attempt: *attempt }
            }
            TurnEvent::ToolRequested { invocation_id, tool, risk, arguments, .. } => Event::ToolRequested {
                invocation_id: invocation_id.clone(),
                tool: tool.clone(),
                arguments: arguments.clone(),
                risk: *risk,
            },
            TurnEvent::ApprovalAsked { invocation_id, tool, risk, .. } => {
                Event::ApprovalAsked { invocation_id: invocation_id.clone(), tool: tool.clone(), risk: *risk }
            }
            TurnEvent::ToolStarted { invocation_id, tool, .. } => {
                Event::ToolStarted { invocation_id: invocation_id.clone(), tool: tool.clone() }
            }
            TurnEvent::ToolCompleted { invocation_id, tool, output_summary, .. } => Event::ToolCompleted {
                invocation_id: invocation_id.clone(),
                tool: tool.clone(),
                output: output_summary.clone(),
            },
            TurnEvent::ToolFailed { invocation_id, tool, reason, uncertain } => Event::ToolFailed {
                invocation_id: invocation_id.clone(),
                tool: tool.clone(),
                reason: reason.clone(),
                uncertain: *uncertain,
            },
            TurnEvent::ToolRejected { invocation_id, tool, reason, .. } => {
                Event::ToolRejected { invocation_id: invocation_id.clone(), tool: tool.clone(), reason: reason.clone() }
            }
            TurnEvent::Usage { usage } => {
                Event::Usage { input_tokens: usage.input_tokens, output_tokens: usage.output_tokens }
            }
            TurnEvent::Final { text, .. } => Event::Final { text: text.clone() },
            _ => return None,
        })
    }
}

/// How a settled tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    /// It ran and finished.
    Completed,
    /// It failed, or was cut short and not run again (see
    /// [`ToolCall::uncertain`]).
    Failed,
    /// It was refused before running (denied, invalid).
    Rejected,
}

/// A tool call the run settled.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ToolCall {
    /// The call's invocation id within its session.
    pub invocation_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments (`null` for a call settled on resume whose request
    /// this run did not see).
    pub arguments: Value,
    /// How it ended.
    pub status: CallStatus,
    /// What the model was told: the output, or why it failed or was
    /// refused.
    pub output: String,
    /// Its effect is unknown: it was cut short and, its tool being
    /// `Replay::Never`, not run again.
    pub uncertain: bool,
}

/// Tokens the run's model calls used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Model calls (attempts, retries included).
    pub calls: u64,
}

/// How a run ([`crate::Agent::run`], [`crate::Agent::resume`]) ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Outcome {
    /// The session's id (what `cairn show`, `cairn resume` and
    /// [`crate::Agent::resume`] take).
    pub session_id: String,
    /// The final answer (empty when the turn did not answer).
    pub answer: String,
    /// Why the turn ended.
    pub stop: Stop,
    /// The tool calls this run settled, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Tokens used by this run.
    pub usage: Usage,
    /// What cairn noted while equipping the turn (tools left out, an
    /// untrusted workspace's tools, an undo finished first).
    pub notes: Vec<String>,
}

/// Why a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// The model answered.
    Answered,
    /// The turn reached its step limit (`[limits] max_steps`).
    StepLimit,
    /// The run was cancelled; the session can be resumed.
    Cancelled,
    /// A `pre_tool` hook stopped the turn.
    Stopped,
    /// There was nothing to resume.
    Nothing,
}

impl From<cairn_core::TurnStop> for Stop {
    fn from(stop: cairn_core::TurnStop) -> Self {
        match stop {
            cairn_core::TurnStop::Answered => Stop::Answered,
            cairn_core::TurnStop::StepLimit => Stop::StepLimit,
            cairn_core::TurnStop::Cancelled => Stop::Cancelled,
            cairn_core::TurnStop::Stopped => Stop::Stopped,
        }
    }
}

/// Collects a run's tool calls from its events, and its usage from the
/// core's (summed by `cairn_core::report::UsageTotals`, the one place usage
/// is added up).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) calls: Vec<ToolCall>,
    totals: cairn_core::report::UsageTotals,
    requested: Vec<(String, Value)>,
}

impl Tally {
    /// Count a core event's usage.
    pub(crate) fn see_core(&mut self, event: &TurnEvent) {
        if let TurnEvent::Usage { usage } = event {
            self.totals.add(usage);
        }
    }

    /// The run's usage so far.
    pub(crate) fn usage(&self) -> Usage {
        Usage { input_tokens: self.totals.input, output_tokens: self.totals.output, calls: self.totals.attempts }
    }

    pub(crate) fn see(&mut self, event: &Event) {
        let mut settle = |id: &str, tool: &str, status, output: &str, uncertain| {
            let arguments = self
                .requested
                .iter()
                .find(|(seen, _)| seen == id)
                .map_or(Value::Null, |(_, arguments)| arguments.clone());
            self.calls.push(ToolCall {
                invocation_id: id.to_owned(),
                tool: tool.to_owned(),
                arguments,
                status,
                output: output.to_owned(),
                uncertain,
            });
        };
        match event {
            Event::ToolRequested { invocation_id, arguments, .. } => {
                self.requested.push((invocation_id.clone(), arguments.clone()))
            }
            Event::ToolCompleted { invocation_id, tool, output } => {
                settle(invocation_id, tool, CallStatus::Completed, output, false)
            }
            Event::ToolFailed { invocation_id, tool, reason, uncertain } => {
                settle(invocation_id, tool, CallStatus::Failed, reason, *uncertain)
            }
            Event::ToolRejected { invocation_id, tool, reason } => {
                settle(invocation_id, tool, CallStatus::Rejected, reason, false)
            }
            _ => {}
        }
    }
}
