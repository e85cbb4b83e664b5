//! Entries to messages: the conversation a provider sees is the lane's path
//! from the root, where `message` entries are messages and each tool
//! settlement becomes a tool-result message. Other entries (intents,
//! starts, turn marks) are bookkeeping the model does not see.
//!
//! It must not write: the session keeps a cache built incrementally from the
//! same function, so the cache always equals a rebuild.

use crate::context::Ledger;
use crate::events::{EntryType, ToolCompletedPayload, ToolFailedPayload, ToolRejectedPayload};
use crate::message::{ContentPart, Message, Role};
use crate::storage::{Entry, EntryView, Storage};

use super::TurnError;

fn tool_result(call_id: String, content: String, is_error: bool) -> Message {
    Message { role: Role::Tool, content: vec![ContentPart::ToolResult { call_id, content, is_error }] }
}

/// The message an entry contributes to the conversation, if any.
/// (`payload` is the entry's JSON text.)
pub(crate) fn message_of(entry_type: &str, payload: &str) -> Option<Message> {
    match EntryType::of(entry_type)? {
        EntryType::Message => serde_json::from_str::<Message>(payload).ok(),
        EntryType::ToolCompleted => serde_json::from_str::<ToolCompletedPayload>(payload).ok().map(|p| {
            let is_error = p.receipt.exit_code != 0;
            tool_result(p.call_id, p.receipt.output_summary, is_error)
        }),
        EntryType::ToolFailed => serde_json::from_str::<ToolFailedPayload>(payload).ok().map(|p| {
            let text = if p.uncertain {
                format!("error (uncertain whether the effect happened): {}", p.reason)
            } else {
                format!("error: {}", p.reason)
            };
            tool_result(p.call_id, text, true)
        }),
        EntryType::ToolRejected => serde_json::from_str::<ToolRejectedPayload>(payload)
            .ok()
            .map(|p| tool_result(p.call_id, format!("rejected: {}", p.reason), true)),
        EntryType::ToolRequested
        | EntryType::ToolStarted
        | EntryType::ToolBypass
        | EntryType::ToolStaged
        | EntryType::TurnCancelled
        | EntryType::TurnEnded
        | EntryType::Compaction
        | EntryType::Undo
        | EntryType::UndoApplied => None,
    }
}

/// The role and byte costs ([`Ledger::byte_costs`]) of the message an
/// entry contributes, if any, as [`message_of`] would give them: a
/// `toolCompleted`'s from its call id and its output's length
/// (`payload_shape::CompletedResult`, which accepts only what
/// `ToolCompletedPayload` accepts), without building the payload and its
/// message; any other entry (and a payload the shape refuses) through
/// [`message_of`].
pub(crate) fn costs_of(entry_type: &str, payload: &str) -> Option<(Role, (u64, u64))> {
    if EntryType::of(entry_type) == Some(EntryType::ToolCompleted)
        && let Ok(p) = serde_json::from_str::<crate::payload_shape::CompletedResult<'_>>(payload)
    {
        let output = &p.receipt.output_summary;
        return Some((Role::Tool, Ledger::tool_result_byte_costs_of(p.call_id.len(), output.len, output.keep)));
    }
    message_of(entry_type, payload).map(|m| (m.role, Ledger::byte_costs(&m)))
}

/// The message an entry contributes, for readers of the log.
pub fn entry_message(entry: &Entry) -> Option<Message> {
    message_of(&entry.entry_type, entry.payload.get())
}

/// [`entry_message`] of an entry lent as a view.
pub fn entry_view_message(entry: EntryView<'_>) -> Option<Message> {
    message_of(entry.entry_type, entry.payload)
}

/// The conversation ending at `head` (empty for none).
pub(crate) fn rebuild<S: Storage>(store: &S, head: Option<&str>) -> Result<Vec<Message>, TurnError> {
    let Some(head) = head else {
        return Ok(Vec::new());
    };
    let path = store.path_to(head)?;
    Ok(path.iter().filter_map(entry_message).collect())
}
