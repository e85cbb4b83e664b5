//! What the turn writes and tells: the payloads of the lifecycle entries it
//! commits to the log (Correx's five tool events plus the turn's own), and
//! the [`TurnEvent`]s it streams to observers.
//!
//! Log entry types ([`EntryType`], the tag in `Entry::entry_type`), each
//! with its own payload type ([`EntryPayload`] ties the two, so a payload
//! is never written under another type's tag):
//! - `message`: a [`crate::message::Message`] (user or assistant).
//! - `toolRequested` ([`ToolRequestedPayload`]): the intent; set with the
//!   `pending` register in the same line.
//! - `toolStarted` ([`ToolStartedPayload`]): approved, the effect may run;
//!   carries the verdict (what, by whom, when).
//! - `toolBypass` ([`ToolBypassPayload`]): a sandbox bypass asked during the
//!   effect and its verdict, committed when the verdict is given.
//! - `toolStaged` ([`ToolStagedPayload`]): a staged call's change set and
//!   the verdict to apply it, committed before anything is applied.
//! - `toolCompleted` ([`ToolCompletedPayload`]) / `toolFailed`
//!   ([`ToolFailedPayload`]): the settlement; the `pending` register is
//!   deleted in the same line.
//! - `toolRejected` ([`ToolRejectedPayload`]): refused before running
//!   (unknown tool, malformed arguments, failed validation, denial); also a
//!   settlement.
//! - `turnCancelled` ([`TurnCancelledPayload`]), `turnEnded`
//!   ([`TurnEndedPayload`]).
//! - `undo` ([`crate::undo::UndoPayload`]): an undo's (or redo's) plan,
//!   committed before any file is touched; `undoApplied`
//!   ([`crate::undo::UndoAppliedPayload`]): it was applied, and the lane
//!   head moved (written by `cairn undo`/`cairn redo`, not by the turn).
//!
//! Each tool payload is built by its one constructor from the call's
//! [`ToolRequest`], and each settlement says which [`TurnEvent`] tells it,
//! so the log and the observers cannot disagree on what a settlement says.
//!
//! This module only defines shapes; it must not write or decide anything.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::Answer;
use crate::message::Message;
use crate::provider::{AttemptUsage, StopReason, StreamEvent};
use crate::storage::Entry;
use crate::tool::{Preview, ReplayPolicy, Risk, ToolReceipt, ToolRequest};

/// The type of an entry the turn writes (its tag is `Entry::entry_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryType {
    /// `message`.
    Message,
    /// `toolRequested`.
    ToolRequested,
    /// `toolStarted`.
    ToolStarted,
    /// `toolBypass`.
    ToolBypass,
    /// `toolStaged`.
    ToolStaged,
    /// `toolCompleted`.
    ToolCompleted,
    /// `toolFailed`.
    ToolFailed,
    /// `toolRejected`.
    ToolRejected,
    /// `turnCancelled`.
    TurnCancelled,
    /// `turnEnded`.
    TurnEnded,
    /// `compaction`: a summary standing in for older entries of the lane
    /// (they stay in the log).
    Compaction,
    /// `undo`: the durable plan of an undo (or redo) of file effects,
    /// committed before any file is touched (off the lane).
    Undo,
    /// `undoApplied`: the plan was applied; the lane head moves to it (its
    /// parent is the entry the undo went back to).
    UndoApplied,
}

impl EntryType {
    /// Every entry type.
    pub const ALL: [EntryType; 13] = [
        Self::Message,
        Self::ToolRequested,
        Self::ToolStarted,
        Self::ToolBypass,
        Self::ToolStaged,
        Self::ToolCompleted,
        Self::ToolFailed,
        Self::ToolRejected,
        Self::TurnCancelled,
        Self::TurnEnded,
        Self::Compaction,
        Self::Undo,
        Self::UndoApplied,
    ];

    /// The tag stored in the log.
    pub const fn tag(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::ToolRequested => "toolRequested",
            Self::ToolStarted => "toolStarted",
            Self::ToolBypass => "toolBypass",
            Self::ToolStaged => "toolStaged",
            Self::ToolCompleted => "toolCompleted",
            Self::ToolFailed => "toolFailed",
            Self::ToolRejected => "toolRejected",
            Self::TurnCancelled => "turnCancelled",
            Self::TurnEnded => "turnEnded",
            Self::Compaction => "compaction",
            Self::Undo => "undo",
            Self::UndoApplied => "undoApplied",
        }
    }

    /// The type of a stored tag (`None` for a tag the turn does not write).
    pub fn of(tag: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.tag() == tag)
    }

    /// Whether entries of this type settle an invocation.
    pub fn is_settlement(self) -> bool {
        matches!(self, Self::ToolCompleted | Self::ToolFailed | Self::ToolRejected)
    }
}

/// A payload of an entry: its Rust type fixes its entry type.
pub trait EntryPayload: Serialize + DeserializeOwned {
    /// The entry type this payload is written under.
    const TYPE: EntryType;
}

impl EntryType {
    /// The type of a stored entry; `None` for a tag this cairn does not
    /// write (a newer cairn's entry: a reader shows or skips it by name,
    /// never by a catch-all arm that would also hide a type added later).
    pub fn of_entry(entry: &Entry) -> Option<Self> {
        Self::of(&entry.entry_type)
    }
}

/// The payload of `entry` read as `P`, only when the entry is of `P`'s type:
/// the one tag-checked way to read a stored payload, so a payload is never
/// read as another type. `None` for another type or a payload that does not
/// parse (the log's own check reports those; a view must not fail on them).
pub fn payload_of<P: EntryPayload>(entry: &Entry) -> Option<P> {
    if entry.entry_type != P::TYPE.tag() {
        return None;
    }
    entry.payload.parse::<P>().ok()
}

impl EntryPayload for Message {
    const TYPE: EntryType = EntryType::Message;
}

/// A recorded approval verdict: what was decided, by which rule or whom,
/// and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictRecord {
    /// The answer.
    #[serde(flatten)]
    pub decision: Answer,
    /// Which rule or who decided (`policy:readOnly`, `allowlist:…`,
    /// `session:…`, `user:tty`, …).
    pub by: String,
    /// When (ms since the Unix epoch).
    pub at: i64,
}

/// Payload of `toolRequested` (Correx `ToolInvocationRequestedEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolRequestedPayload {
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
    /// What a `pre_tool` hook decided (`None`: no hook objected); with a
    /// rewrite, `request.arguments` are the hook's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<HookRecord>,
}

/// A `pre_tool` hook's decision as recorded in `toolRequested`
/// (`crate::hooks`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "camelCase")]
pub enum HookRecord {
    /// The call was refused.
    #[serde(rename_all = "camelCase")]
    Deny {
        /// Which hook.
        by: String,
        /// Why.
        reason: String,
    },
    /// The arguments were changed; these are the model's.
    #[serde(rename_all = "camelCase")]
    Rewrite {
        /// Which hook.
        by: String,
        /// The arguments as the model gave them.
        original_arguments: Value,
    },
    /// A hook asked that a person approve the call (the gate then needs a
    /// person, on resume too).
    #[serde(rename_all = "camelCase")]
    Ask {
        /// Which hook asked.
        by: String,
        /// Why.
        reason: String,
        /// When earlier hooks changed the arguments: which, and the
        /// model's arguments.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rewritten_by: Option<String>,
        /// The arguments as the model gave them (when changed).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        original_arguments: Option<Value>,
    },
    /// A hook stopped the turn (Claude Code's `continue: false`): the call
    /// was refused and the turn ended.
    #[serde(rename_all = "camelCase")]
    Stop {
        /// Which hook.
        by: String,
        /// Why.
        reason: String,
    },
}

impl HookRecord {
    /// The reason a hook asked a person to approve the call, if it did.
    pub fn asks(&self) -> Option<&str> {
        match self {
            HookRecord::Ask { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

/// Payload of `toolStarted` (Correx `ToolExecutionStartedEvent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolStartedPayload {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// The model's call id.
    pub call_id: String,
    /// Tool name.
    pub tool: String,
    /// The verdict that let it run.
    pub verdict: VerdictRecord,
    /// The call runs staged (`Tool::stages_effect`): nothing of it reaches
    /// the working tree before a `toolStaged` entry records its change set,
    /// so a call that ended without one (discarded, failed, cancelled)
    /// changed nothing undo would revert. Absent (false) in older logs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub staged: bool,
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
pub struct ToolCompletedPayload {
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
pub struct ToolFailedPayload {
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
pub struct ToolRejectedPayload {
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

/// Payload of `toolBypass`: a sandbox bypass asked by a running call and
/// the verdict on it, committed as soon as the verdict is given (so a crash
/// later in the effect keeps it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolBypassPayload {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// Tool name.
    pub tool: String,
    /// The access asked and its verdict.
    pub bypass: BypassRecord,
}

/// Payload of `toolStaged`: the change set of a staged call and the
/// verdict that lets it be applied, committed before any of it touches the
/// working tree. On resume, an invocation with this entry has its change
/// set applied (again: applying is idempotent) and is never re-run; one
/// without it applied nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolStagedPayload {
    /// cairn's invocation id.
    pub invocation_id: String,
    /// Tool name.
    pub tool: String,
    /// Every change, with sizes and hashes.
    pub change_set: crate::staged::ChangeSet,
    /// The staging layer holding the new contents (a host path).
    pub staging: String,
    /// Why it may be applied (`policy:stagedWrite`, or a person for a
    /// Destructive effect).
    pub verdict: VerdictRecord,
    /// Whether the prior state of every changed path was kept, so the
    /// effect can be undone (`cairn undo`); absent in older logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preimages: Option<crate::staged::Preimages>,
}

impl EntryPayload for ToolStagedPayload {
    const TYPE: EntryType = EntryType::ToolStaged;
}

impl ToolStagedPayload {
    /// What observers are told of this record.
    pub fn event(&self) -> TurnEvent {
        TurnEvent::ToolStaged {
            invocation_id: self.invocation_id.clone(),
            tool: self.tool.clone(),
            by: self.verdict.by.clone(),
            changes: self.change_set.changes.len(),
        }
    }

    /// The record of `request`'s approved change set.
    pub fn new(
        request: &ToolRequest,
        change_set: crate::staged::ChangeSet,
        staging: String,
        verdict: VerdictRecord,
        preimages: crate::staged::Preimages,
    ) -> Self {
        Self {
            invocation_id: request.invocation_id.clone(),
            tool: request.tool.clone(),
            change_set,
            staging,
            verdict,
            preimages: Some(preimages),
        }
    }
}

/// Payload of `turnCancelled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnCancelledPayload {
    /// The turn.
    pub turn_id: String,
    /// Why it stopped.
    pub reason: String,
}

/// Payload of `turnEnded` (a turn that ended without an answer).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnEndedPayload {
    /// The turn.
    pub turn_id: String,
    /// Why it stopped.
    pub reason: String,
}

impl EntryPayload for ToolRequestedPayload {
    const TYPE: EntryType = EntryType::ToolRequested;
}
impl EntryPayload for ToolStartedPayload {
    const TYPE: EntryType = EntryType::ToolStarted;
}
impl EntryPayload for ToolBypassPayload {
    const TYPE: EntryType = EntryType::ToolBypass;
}
impl EntryPayload for ToolCompletedPayload {
    const TYPE: EntryType = EntryType::ToolCompleted;
}
impl EntryPayload for ToolFailedPayload {
    const TYPE: EntryType = EntryType::ToolFailed;
}
impl EntryPayload for ToolRejectedPayload {
    const TYPE: EntryType = EntryType::ToolRejected;
}
impl EntryPayload for TurnCancelledPayload {
    const TYPE: EntryType = EntryType::TurnCancelled;
}
impl EntryPayload for TurnEndedPayload {
    const TYPE: EntryType = EntryType::TurnEnded;
}
impl EntryPayload for CompactionPayload {
    const TYPE: EntryType = EntryType::Compaction;
}

/// Why a compaction was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CompactionReason {
    /// The conversation passed the configured share of the window.
    Threshold,
    /// The provider refused a request as too long (the retry follows it).
    ProviderRejected,
    /// Asked for by a person (`cairn compact`).
    Forced,
}

/// Payload of `compaction`: a summary that stands in, in the requests the
/// turn builds, for the lane's messages from the start of the lane (or the
/// previous compaction) through `last_entry`. Nothing is removed: the
/// covered entries stay in the log, and a lane forked before this entry
/// never sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionPayload {
    /// The summary the model sees in place of the covered messages. It
    /// includes the previous compaction's summary, so the latest compaction
    /// on a path is the only one a request needs.
    pub summary: String,
    /// The first entry covered (the lane's first entry, or the one after
    /// the previous compaction's `last_entry`).
    pub first_entry: String,
    /// The last entry covered (inclusive).
    pub last_entry: String,
    /// Messages covered, the previous compaction's included.
    pub messages: u64,
    /// The previous compaction this one subsumes, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// The last entry of the covered range the summariser did not read
    /// (the range was larger than its window; the newest part was read).
    /// `None` when every covered message was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread_through: Option<String>,
    /// Why it was made.
    pub reason: CompactionReason,
    /// Provider that wrote the summary.
    pub provider: String,
    /// Model that wrote the summary.
    pub model: String,
}

impl ToolRequestedPayload {
    /// The intent of `request` in turn `turn_id`; `tier` and `replay` are
    /// `None` when the tool is unknown.
    pub fn new(turn_id: String, request: ToolRequest, tier: Option<Risk>, replay: Option<ReplayPolicy>) -> Self {
        Self { invocation_id: request.invocation_id.clone(), turn_id, request, tier, replay, hook: None }
    }

    /// The same intent with a `pre_tool` hook's decision recorded.
    pub fn with_hook(mut self, hook: Option<HookRecord>) -> Self {
        self.hook = hook;
        self
    }

    /// What observers are told once the intent is committed.
    pub fn event(&self) -> TurnEvent {
        TurnEvent::ToolRequested {
            invocation_id: self.invocation_id.clone(),
            call_id: self.request.call_id.clone(),
            tool: self.request.tool.clone(),
            risk: self.tier,
            arguments: self.request.arguments.clone(),
        }
    }
}

impl ToolStartedPayload {
    /// The approved start of `request`.
    pub fn new(request: &ToolRequest, verdict: VerdictRecord) -> Self {
        Self {
            invocation_id: request.invocation_id.clone(),
            call_id: request.call_id.clone(),
            tool: request.tool.clone(),
            verdict,
            staged: false,
        }
    }

    /// This start, saying whether the call runs staged.
    #[must_use]
    pub fn staged(mut self, staged: bool) -> Self {
        self.staged = staged;
        self
    }
}

impl ToolBypassPayload {
    /// The bypass `bypass` asked by `request`.
    pub fn new(request: &ToolRequest, bypass: BypassRecord) -> Self {
        Self { invocation_id: request.invocation_id.clone(), tool: request.tool.clone(), bypass }
    }
}

impl ToolCompletedPayload {
    /// The successful settlement of `request`. `settled_by` says how it was
    /// settled when not by running now (`guard` on resume).
    pub fn new(
        request: &ToolRequest,
        receipt: ToolReceipt,
        full_output: Option<String>,
        settled_by: Option<String>,
        bypasses: Vec<BypassRecord>,
    ) -> Self {
        Self {
            invocation_id: request.invocation_id.clone(),
            call_id: request.call_id.clone(),
            tool: request.tool.clone(),
            receipt,
            full_output,
            settled_by,
            bypasses,
        }
    }

    /// What observers are told once it is committed.
    pub fn event(&self) -> TurnEvent {
        TurnEvent::ToolCompleted {
            invocation_id: self.invocation_id.clone(),
            tool: self.tool.clone(),
            exit_code: self.receipt.exit_code,
            output_summary: self.receipt.output_summary.clone(),
            truncated: self.receipt.truncated,
        }
    }
}

impl ToolFailedPayload {
    /// The failed settlement of `request`; `uncertain` when the effect may
    /// or may not have happened.
    pub fn new(request: &ToolRequest, reason: String, uncertain: bool, bypasses: Vec<BypassRecord>) -> Self {
        Self {
            invocation_id: request.invocation_id.clone(),
            call_id: request.call_id.clone(),
            tool: request.tool.clone(),
            reason,
            uncertain,
            bypasses,
        }
    }

    /// What observers are told once it is committed.
    pub fn event(&self) -> TurnEvent {
        TurnEvent::ToolFailed {
            invocation_id: self.invocation_id.clone(),
            tool: self.tool.clone(),
            reason: self.reason.clone(),
            uncertain: self.uncertain,
        }
    }
}

impl ToolRejectedPayload {
    /// The rejection of `request` before any verdict (unknown tool, bad
    /// arguments, a cancelled turn).
    pub fn new(request: &ToolRequest, tier: Option<Risk>, reason: String) -> Self {
        Self {
            invocation_id: request.invocation_id.clone(),
            call_id: request.call_id.clone(),
            tool: request.tool.clone(),
            tier,
            reason,
            verdict: None,
        }
    }

    /// The rejection of `request` by an approver's verdict; the reason the
    /// model sees is the denial's.
    pub fn by_verdict(request: &ToolRequest, tier: Risk, verdict: VerdictRecord) -> Self {
        let reason = match &verdict.decision {
            Answer::Deny { reason } => reason.clone(),
            Answer::Approve | Answer::ApproveForSession => String::new(),
        };
        Self { verdict: Some(verdict), ..Self::new(request, Some(tier), reason) }
    }

    /// What observers are told once it is committed.
    pub fn event(&self) -> TurnEvent {
        TurnEvent::ToolRejected {
            invocation_id: self.invocation_id.clone(),
            tool: self.tool.clone(),
            risk: self.tier,
            reason: self.reason.clone(),
        }
    }
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
        /// The person's prompt that starts it (`None` on a resume).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt: Option<String>,
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
    /// A staged call's change set was recorded as approved to apply (its
    /// `toolStaged` entry): who let it apply and how many paths it changes.
    /// A discarded change set is told by the call's rejection.
    ToolStaged {
        /// Invocation id.
        invocation_id: String,
        /// Tool.
        tool: String,
        /// Who let it apply (`policy:stagedWrite`, or a person).
        by: String,
        /// Paths it changes.
        changes: usize,
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
    /// A compaction summary was committed (the covered entries stay in
    /// the log).
    Compacted {
        /// The `compaction` entry.
        entry_id: String,
        /// Messages it covers.
        messages: u64,
        /// Why it was made.
        reason: CompactionReason,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload is read only as its own entry type: a toolFailed payload
    /// whose fields would also parse as toolRejected is not read as one.
    #[test]
    fn payloads_are_read_only_under_their_own_tag() {
        let payload = r#"{"invocationId":"i","callId":"c","tool":"t","reason":"r","uncertain":false,"bypasses":[]}"#;
        let entry = |tag: &str| Entry {
            seq: 1,
            timestamp: 0,
            id: "e".into(),
            parent_id: None,
            entry_type: tag.into(),
            payload: crate::storage::RawJson::from_json(payload).unwrap(),
        };
        assert!(payload_of::<ToolFailedPayload>(&entry("toolFailed")).is_some());
        assert!(payload_of::<ToolFailedPayload>(&entry("toolRejected")).is_none());
        assert!(payload_of::<ToolFailedPayload>(&entry("toolfailed")).is_none());
        assert_eq!(EntryType::of_entry(&entry("toolFailed")), Some(EntryType::ToolFailed));
        assert_eq!(EntryType::of_entry(&entry("fromTheFuture")), None);
    }

    #[test]
    fn each_entry_type_has_one_tag_and_back() {
        // The tags as they stand in existing session files (the oracle).
        let written = [
            "message",
            "toolRequested",
            "toolStarted",
            "toolBypass",
            "toolStaged",
            "toolCompleted",
            "toolFailed",
            "toolRejected",
            "turnCancelled",
            "turnEnded",
            "compaction",
            "undo",
            "undoApplied",
        ];
        let tags: Vec<&str> = EntryType::ALL.iter().map(|t| t.tag()).collect();
        assert_eq!(tags, written);
        for t in EntryType::ALL {
            assert_eq!(EntryType::of(t.tag()), Some(t));
        }
        for foreign in ["", "Message", "toolrequested", "tool_requested", "toolRequested ", "fork"] {
            assert_eq!(EntryType::of(foreign), None, "{foreign:?}");
        }
        let settlements: Vec<EntryType> = EntryType::ALL.into_iter().filter(|t| t.is_settlement()).collect();
        assert_eq!(settlements, [EntryType::ToolCompleted, EntryType::ToolFailed, EntryType::ToolRejected]);
    }

    #[test]
    fn payloads_are_written_under_their_own_type() {
        assert_eq!(<Message as EntryPayload>::TYPE, EntryType::Message);
        assert_eq!(ToolRequestedPayload::TYPE, EntryType::ToolRequested);
        assert_eq!(ToolStartedPayload::TYPE, EntryType::ToolStarted);
        assert_eq!(ToolBypassPayload::TYPE, EntryType::ToolBypass);
        assert_eq!(ToolStagedPayload::TYPE, EntryType::ToolStaged);
        assert_eq!(ToolCompletedPayload::TYPE, EntryType::ToolCompleted);
        assert_eq!(ToolFailedPayload::TYPE, EntryType::ToolFailed);
        assert_eq!(ToolRejectedPayload::TYPE, EntryType::ToolRejected);
        assert_eq!(TurnCancelledPayload::TYPE, EntryType::TurnCancelled);
        assert_eq!(TurnEndedPayload::TYPE, EntryType::TurnEnded);
    }

    #[test]
    fn a_rejection_by_verdict_tells_the_denial_and_keys_stay_as_written() {
        let request = ToolRequest {
            invocation_id: "i3".into(),
            call_id: "c1".into(),
            session_id: "s".into(),
            tool: "shell".into(),
            arguments: serde_json::json!({"command": "rm -rf /"}),
        };
        let verdict =
            VerdictRecord { decision: Answer::Deny { reason: "no \"way\"".into() }, by: "user:tty".into(), at: 7 };
        let rejected = ToolRejectedPayload::by_verdict(&request, Risk::Destructive, verdict);
        assert_eq!(rejected.reason, "no \"way\"");
        let json = serde_json::to_string(&rejected).unwrap();
        assert_eq!(
            json,
            r#"{"invocationId":"i3","callId":"c1","tool":"shell","tier":"destructive","reason":"no \"way\"","verdict":{"decision":"deny","reason":"no \"way\"","by":"user:tty","at":7}}"#
        );
        assert_eq!(
            rejected.event(),
            TurnEvent::ToolRejected {
                invocation_id: "i3".into(),
                tool: "shell".into(),
                risk: Some(Risk::Destructive),
                reason: "no \"way\"".into()
            }
        );
    }
}
