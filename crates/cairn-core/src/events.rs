//! What the turn writes and tells: the payloads of the lifecycle entries it
//! commits to the log (Correx's five tool events plus the turn's own), and
//! the [`TurnEvent`]s it streams to observers.
//!
//! Log entry types (`Entry::entry_type`), all camelCase:
//! - `message`: a [`crate::message::Message`] (user or assistant).
//! - `toolRequested` ([`ToolRequested`]): the intent; set with the `pending`
//!   register in the same line.
//! - `toolStarted` ([`ToolStarted`]): approved, the effect may run; carries
//!   the verdict (what, by whom, when).
//! - `toolCompleted` ([`ToolCompleted`]) / `toolFailed` ([`ToolFailed`]): the
//!   settlement; the `pending` register is deleted in the same line.
//! - `toolRejected` ([`ToolRejected`]): refused before running (unknown
//!   tool, malformed arguments, failed validation, denial); also a settlement.
//! - `turnCancelled`, `turnEnded` ([`TurnMark`]).
//!
//! This module only defines shapes; it must not write or decide anything.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::Decision;
use crate::provider::{AttemptUsage, StopReason, StreamEvent};
use crate::tool::{Preview, ReplayPolicy, Risk, ToolReceipt, ToolRequest};

/// Entry type of a conversation message.
pub const MESSAGE: &str = "message";
/// Entry type of a tool intent.
pub const TOOL_REQUESTED: &str = "toolRequested";
/// Entry type of an approved start.
pub const TOOL_STARTED: &str = "toolStarted";
/// Entry type of a successful settlement.
pub const TOOL_COMPLETED: &str = "toolCompleted";
/// Entry type of a failed settlement.
pub const TOOL_FAILED: &str = "toolFailed";
/// Entry type of a rejection (also a settlement).
pub const TOOL_REJECTED: &str = "toolRejected";
/// Entry type marking a cancelled turn.
pub const TURN_CANCELLED: &str = "turnCancelled";
/// Entry type marking a turn that ended without an answer (step limit).
pub const TURN_ENDED: &str = "turnEnded";

/// A recorded approval verdict: what was decided, by which rule or whom,
/// and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictRecord {
    /// The decision.
    #[serde(flatten)]
    pub decision: Decision,
    /// Which rule or who decided (`policy:readOnly`, `allowlist:…`,
    /// `session:…`, `user:tty`, …).
    pub by: String,
    /// When (ms since the Unix epoch).
    pub at: i64,
}

/// Payload of `toolRequested` (Correx `ToolInvocationRequestedEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolRequested {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// The turn it belongs to.
    pub turn_id: String,
    /// The request (call id, tool, arguments as the model gave them).
    pub request: ToolRequest,
    /// The risk tier of this call (`None` when the tool is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Risk>,
    /// The tool's replay policy (`None` when the tool is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<ReplayPolicy>,
}

/// Payload of `toolStarted` (Correx `ToolExecutionStartedEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolStarted {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// The model's call id.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// The verdict that let it run.
    pub verdict: VerdictRecord,
}

/// A sandbox bypass asked for during an effect, and its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BypassRecord {
    /// What access was asked.
    pub what: String,
    /// The verdict.
    pub verdict: VerdictRecord,
}

/// Payload of `toolCompleted` (Correx `ToolExecutionCompletedEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCompleted {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// The model's call id.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// The receipt (its `outputSummary` is what the model sees).
    pub receipt: ToolReceipt,
    /// The output beyond the cap, kept out of the prompt (itself bounded by
    /// the stored-output limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_output: Option<String>,
    /// How it was settled when not by running now (`guard` on resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_by: Option<String>,
    /// Sandbox bypasses asked during the effect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bypasses: Vec<BypassRecord>,
}

/// Payload of `toolFailed` (Correx `ToolExecutionFailedEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolFailed {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// The model's call id.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// Why, as the model sees it.
    pub reason: String,
    /// The effect may or may not have happened (interrupted, not re-run).
    #[serde(default)]
    pub uncertain: bool,
    /// Sandbox bypasses asked during the effect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bypasses: Vec<BypassRecord>,
}

/// Payload of `toolRejected` (Correx `ToolExecutionRejectedEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolRejected {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// The model's call id.
    pub call_id: String,
    /// Tool name as the model called it.
    pub tool: String,
    /// The risk tier, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<Risk>,
    /// Why, as the model sees it.
    pub reason: String,
    /// The denial, when an approver (or the policy) decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<VerdictRecord>,
}

impl ToolRejected {
    /// The rejection of a call by an approver's verdict; the reason the
    /// model sees is the denial's.
    pub fn by_verdict(
        invocation_id: String,
        call_id: String,
        tool: String,
        tier: Risk,
        verdict: VerdictRecord,
    ) -> Self {
        let reason = match &verdict.decision {
            Decision::Deny { reason } => reason.clone(),
            _ => String::new(),
        };
        Self { invocation_id, call_id, tool, tier: Some(tier), reason, verdict: Some(verdict) }
    }
}

/// Payload of `turnCancelled` / `turnEnded`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnMark {
    /// The turn.
    pub turn_id: String,
    /// Why it stopped.
    pub reason: String,
}

/// What the turn tells observers while it runs (the CLI prints each as one
/// JSON line with `--json`). Only the log is the truth; these are views.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase", rename_all_fields = "camelCase")]
#[non_exhaustive]
pub enum TurnEvent {
    /// A turn began (or a resume picked one up).
    TurnStarted {
        /// Turn id.
        turn_id: String,
        /// Lane.
        lane: String,
        /// Whether this is a resume.
        resumed: bool,
    },
    /// A provider call is about to be made (its intent is committed).
    ProviderRequested {
        /// Turn id.
        turn_id: String,
        /// Step (1-based provider call within the turn).
        step: u32,
    },
    /// A streamed delta of the provider's answer.
    Delta {
        /// The delta.
        event: StreamEvent,
    },
    /// The provider's answer was settled and committed.
    ProviderSettled {
        /// The assistant message's entry id.
        entry_id: String,
        /// Why it stopped.
        stop: StopReason,
        /// How many tool calls it asks for.
        tool_calls: usize,
    },
    /// The provider call failed after its retries (the turn stays resumable).
    ProviderFailed {
        /// Failure class.
        kind: String,
        /// Message.
        message: String,
    },
    /// Usage of one provider attempt (one per attempt, retries included).
    Usage {
        /// The figures.
        usage: AttemptUsage,
    },
    /// A tool call's intent was committed.
    ToolRequested {
        /// Invocation id.
        invocation_id: String,
        /// Model's call id.
        call_id: String,
        /// Tool.
        tool: String,
        /// Risk of this call, when the tool is known.
        risk: Option<Risk>,
        /// Arguments.
        arguments: Value,
    },
    /// A person is being asked.
    ApprovalAsked {
        /// Invocation id.
        invocation_id: String,
        /// Tool.
        tool: String,
        /// Risk.
        risk: Risk,
        /// Preview.
        preview: Option<Preview>,
    },
    /// A verdict was reached (and recorded).
    ApprovalVerdict {
        /// Invocation id.
        invocation_id: String,
        /// The verdict.
        verdict: VerdictRecord,
    },
    /// The effect starts.
    ToolStarted {
        /// Invocation id.
        invocation_id: String,
        /// Tool.
        tool: String,
        /// Risk.
        risk: Risk,
    },
    /// Output streamed by a running tool (lossy UTF-8).
    ToolOutput {
        /// Invocation id.
        invocation_id: String,
        /// The chunk.
        chunk: String,
    },
    /// Settled: completed.
    ToolCompleted {
        /// Invocation id.
        invocation_id: String,
        /// Tool.
        tool: String,
        /// Exit code.
        exit_code: i32,
        /// What the model sees.
        output_summary: String,
        /// Whether it was truncated at the cap.
        truncated: bool,
    },
    /// Settled: failed.
    ToolFailed {
        /// Invocation id.
        invocation_id: String,
        /// Tool.
        tool: String,
        /// Why.
        reason: String,
        /// Effect unknown (interrupted and not re-run).
        uncertain: bool,
    },
    /// Settled: rejected before running.
    ToolRejected {
        /// Invocation id.
        invocation_id: String,
        /// Tool.
        tool: String,
        /// Risk, when known.
        risk: Option<Risk>,
        /// Why.
        reason: String,
    },
    /// The turn's final answer.
    Final {
        /// Turn id.
        turn_id: String,
        /// The answer text.
        text: String,
        /// Its entry id.
        entry_id: String,
    },
    /// The turn stopped at the step limit.
    StepLimit {
        /// Turn id.
        turn_id: String,
        /// The limit.
        max_steps: u32,
    },
    /// The turn was cancelled and settled as cancelled (resumable).
    TurnCancelled {
        /// Turn id.
        turn_id: String,
    },
}
