//! Tool hooks: what a host's hooks may say about a tool call before it is
//! requested (`pre_tool`: go on, refuse it, or change its arguments) and
//! what they are told once it is settled (`post_tool`). The turn asks the
//! registry's hooks ([`crate::registry::ToolRegistry::hooks`]) and records
//! the answer in the call's `toolRequested` entry ([`HookRecord`]) before it
//! takes effect; a refusal settles the call Rejected with the hook's
//! reason, and changed arguments are what the approval, the tool and a
//! resume then see (the model's are kept in the record).
//!
//! The core only declares the contract; running hook programs (sandboxed,
//! with a time limit, failing closed) is the host's (`cairn-tools`). A hook
//! never approves a call: approvals stay with rules and people.

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
}

/// The hooks of a session's tool calls.
pub trait ToolHooks: Send + Sync + std::fmt::Debug {
    /// Before the call is requested. A hook that fails or times out must
    /// answer [`PreTool::Deny`] (fail closed).
    fn pre_tool(&self, request: &ToolRequest, cwd: &std::path::Path) -> PreTool;

    /// After the call is settled and committed: `kind` is the settlement
    /// entry's type and `settlement` its payload (invocation, tool, and the
    /// receipt, the failure or the refusal). Nothing a post hook does
    /// changes the call; a failure is the host's to report.
    fn post_tool(&self, kind: EntryType, settlement: &Value, cwd: &std::path::Path) {
        let _ = (kind, settlement, cwd);
    }
}
