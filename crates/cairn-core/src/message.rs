//! The neutral message model: what a session stores and every provider
//! adapter converts to and from its own wire shape.
//!
//! It must stay independent of any one API (OpenAI Chat Completions,
//! Responses, Anthropic Messages), so that switching provider between turns
//! of one session works. Provider-specific data that must be passed back
//! verbatim (reasoning signatures, encrypted reasoning) is kept opaque in
//! [`ContentPart::Reasoning`], tagged with the provider kind that produced it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// Instructions from the host (system prompt).
    System,
    /// The person (or embedding program) driving the agent.
    User,
    /// The model.
    Assistant,
    /// Results of tool calls, fed back to the model.
    Tool,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// Ordered parts (text, tool calls, tool results, reasoning).
    pub content: Vec<ContentPart>,
}

impl Message {
    /// A message with a single text part.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Self { role, content: vec![ContentPart::Text { text: text.into() }] }
    }

    /// The concatenated text parts of this message.
    pub fn joined_text(&self) -> String {
        let mut out = String::new();
        for part in &self.content {
            if let ContentPart::Text { text } = part {
                out.push_str(text);
            }
        }
        out
    }

    /// The tool calls this message asks for, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.content.iter().filter_map(|part| match part {
            ContentPart::ToolCall(call) => Some(call),
            _ => None,
        })
    }

    /// The first tool-call id this message uses for more than one call.
    pub fn duplicate_tool_call_id(&self) -> Option<&str> {
        let mut seen = std::collections::HashSet::new();
        self.tool_calls().map(|c| c.id.as_str()).find(|id| !seen.insert(*id))
    }
}

/// A call the model asks cairn to make.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call; tool results refer to it.
    pub id: String,
    /// The tool's name as offered to the model.
    pub name: String,
    /// The arguments. Kept as the JSON the model produced; when the model's
    /// text was not valid JSON the raw text is kept as a JSON string so the
    /// turn can reject it with a reason instead of losing it.
    pub arguments: Value,
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ContentPart {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call requested by the assistant.
    ToolCall(ToolCall),
    /// The result of a tool call, sent back to the model.
    #[serde(rename_all = "camelCase")]
    ToolResult {
        /// The id of the call this answers.
        call_id: String,
        /// What the model sees (possibly truncated, with a marker).
        content: String,
        /// Whether the call failed or was rejected.
        is_error: bool,
    },
    /// Model reasoning. `text` is the readable summary (may be empty);
    /// `opaque` is provider data passed back verbatim (an Anthropic thinking
    /// signature, an OpenAI encrypted reasoning item) and only to a provider
    /// of the same `provider` kind.
    Reasoning {
        /// Readable reasoning text or summary.
        text: String,
        /// The provider kind that produced `opaque` (e.g. "anthropic").
        provider: String,
        /// Opaque provider data for pass-back.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        opaque: Option<Value>,
    },
}
