//! Hooks: what a host's hooks may say about a prompt before its turn starts
//! (`user_prompt`: go on, refuse it, or add context to it) and about a tool
//! call before it is requested (`pre_tool`: go on, refuse it, change its
//! arguments, put it to a person, or stop the turn) and
//! what they are told once it is settled (`post_tool`). The turn asks the
//! registry's hooks ([`crate::registry::ToolRegistry::hooks`]) and records
//! the answer in the call's `toolRequested` entry ([`HookRecord`]) before it
//! takes effect; a refusal settles the call Rejected with the hook's
//! reason, and changed arguments are what the approval, the tool and a
//! resume then see (the model's are kept in the record).
//!
//! `session_start` is asked before a turn too; `subagent_stop` and a
//! session's end are the host's to report (they are not part of a turn).
//!
//! The core only declares the contract; running hook programs (sandboxed,
//! with a time limit, failing closed) is the host's (`cairn-tools`). A hook
//! never approves a call: approvals stay with rules and people. A hook that
//! asks makes the call need a person (the approval gate's rule,
//! [`crate::approval::gate::gate`]).

use serde_json::Value;

use crate::events::EntryType;
pub use crate::events::HookRecord;
use crate::tool::ToolRequest;

/// What `pre_tool` hooks decided about one call.
#[derive(Debug, Clone, PartialEq)]
pub enum PreTool {
    /// No objection: the call goes on to approval as the model made it.
    Continue,
    /// Refuse the call; the reason is shown to the model.
    Deny {
        /// Which hook (for the log).
        by: String,
        /// Why.
        reason: String,
    },
    /// Go on with these arguments instead (still checked against the
    /// tool's schema, then approved as usual).
    Rewrite {
        /// Which hook.
        by: String,
        /// The new arguments object.
        arguments: Value,
    },
    /// A person must approve the call (no rule, `--yes` or remembered
    /// approval answers it; refused where no person can answer).
    Ask {
        /// Which hook asked.
        by: String,
        /// Why, shown to the person.
        reason: String,
        /// Arguments earlier hooks changed, and which hooks changed them.
        rewrite: Option<(String, Value)>,
    },
    /// Refuse the call and end the turn without another provider call
    /// (Claude Code's `continue: false`).
    Stop {
        /// Which hook.
        by: String,
        /// Why (its `stopReason`), shown to the person and the model.
        reason: String,
    },
}

/// What `user_prompt` hooks decided about a prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum UserPrompt {
    /// No objection: the turn starts with the prompt as given.
    Continue,
    /// Refuse the prompt: no turn starts; the refusal is recorded (the
    /// session fact `promptRefused`) and a queued prompt leaves the queue.
    Block {
        /// Which hook.
        by: String,
        /// Why.
        reason: String,
    },
    /// Start the turn with this text added to the user's message (a second
    /// text part of the same recorded message).
    AddContext {
        /// Which hooks.
        by: String,
        /// The text.
        text: String,
    },
}

/// The record of a refused prompt (the session fact `promptRefused`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptRefused {
    /// Which hook.
    pub by: String,
    /// Why.
    pub reason: String,
    /// When (ms since the Unix epoch).
    pub at: i64,
}

/// The session fact holding the last refused prompt's record.
pub const PROMPT_REFUSED_FACT: &str = "promptRefused";

/// The hooks of a session: its prompts and its tool calls.
pub trait Hooks: Send + Sync + std::fmt::Debug {
    /// Before a turn starts with `prompt`. A hook that fails is the host's
    /// to report; it does not refuse the prompt.
    fn user_prompt(&self, session_id: &str, cwd: &std::path::Path, prompt: &str) -> UserPrompt {
        let _ = (session_id, cwd, prompt);
        UserPrompt::Continue
    }

    /// Before a turn of session `session_id` runs (a new prompt or a
    /// resumed turn; `resumed`: the session held entries already). A host
    /// runs its `session_start` hooks the first time a process turns a
    /// session, and context they give goes with the session's next prompt
    /// (through [`Hooks::user_prompt`], so it is recorded before it takes
    /// effect). Nothing it does stops the turn.
    fn session_start(&self, session_id: &str, cwd: &std::path::Path, resumed: bool) {
        let _ = (session_id, cwd, resumed);
    }

    /// A child session (a subagent) of `parent` ended: `answer` is its
    /// final answer, or why it failed (`failed`). Called by the host that
    /// ran it; nothing it does changes the child or its parent.
    fn subagent_stop(&self, parent: &str, child: &str, cwd: &std::path::Path, answer: &str, failed: bool) {
        let _ = (parent, child, cwd, answer, failed);
    }

    /// Before the call is requested, in the session's `mode` now. A hook
    /// that fails or times out must answer [`PreTool::Deny`] (fail closed).
    fn pre_tool(&self, request: &ToolRequest, cwd: &std::path::Path, mode: crate::approval::SessionMode) -> PreTool;

    /// Before a compaction summarises the conversation (`reason`: why);
    /// nothing it does stops the compaction.
    fn pre_compact(&self, session_id: &str, cwd: &std::path::Path, reason: crate::events::CompactionReason) {
        let _ = (session_id, cwd, reason);
    }

    /// After the call is settled and committed: `kind` is the settlement
    /// entry's type and `settlement` its payload (invocation, tool, and the
    /// receipt, the failure or the refusal). Nothing a post hook does
    /// changes the call; a failure is the host's to report.
    fn post_tool(&self, kind: EntryType, settlement: &Value, cwd: &std::path::Path) {
        let _ = (kind, settlement, cwd);
    }
}
