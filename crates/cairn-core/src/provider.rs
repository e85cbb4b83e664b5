//! The `Provider` trait: one model call, streamed to an observer, settled as
//! one assistant message.
//!
//! The core treats a provider call as an effect: the turn commits the intent
//! before calling [`Provider::complete`] and the settled [`ModelResponse`]
//! after it. Only the settled message is ever committed; streamed deltas are
//! for observers (a terminal, a 9P `event` file). Providers never see storage
//! types, and they must be replay-safe: asked the same request again after a
//! crash, they may answer differently, but nothing they did is half-recorded.

use serde::{Deserialize, Serialize};

use crate::CancelToken;
use crate::message::Message;
use crate::tool::ToolSpec;

/// Tool calls of one assistant message that the turn runs when the provider
/// sets no other bound ([`Provider::max_tool_calls`]); the calls past it are
/// settled as rejected, with the reason, so the model sees why.
pub const DEFAULT_MAX_TOOL_CALLS: usize = 64;

/// What the turn asks a provider for.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    /// The system prompt, if any.
    pub system: Option<&'a str>,
    /// The conversation so far, oldest first (path from the root to the
    /// current head of the lane).
    pub messages: &'a [Message],
    /// Tools the model may call.
    pub tools: &'a [ToolSpec],
    /// Upper bound for generated tokens, if the host sets one.
    pub max_output_tokens: Option<u32>,
    /// Assistant messages of the conversation that are not in `messages`
    /// (covered by a compaction summary or left out to fit the window), so
    /// a provider that counts turns (the scripted one) counts them all.
    pub earlier_assistant_messages: usize,
    /// What the call is for.
    pub purpose: RequestPurpose,
}

/// What a provider call is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RequestPurpose {
    /// A step of a turn.
    #[default]
    Turn,
    /// Summarising older messages for a compaction (no tools offered).
    Compaction,
}

/// A streamed piece of the answer, delivered while the call runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum StreamEvent {
    /// A new attempt started (1-based); a retry restarts the stream, so an
    /// observer should discard deltas of the previous attempt.
    AttemptStarted {
        /// Attempt number, 1-based.
        attempt: u32,
    },
    /// Visible text.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// Reasoning text.
    ReasoningDelta {
        /// The new reasoning text.
        text: String,
    },
    /// The model began a tool call.
    ToolCallStarted {
        /// Call id.
        id: String,
        /// Tool name.
        name: String,
    },
    /// More argument text for a tool call.
    ToolCallDelta {
        /// Call id.
        id: String,
        /// Raw JSON text fragment.
        arguments: String,
    },
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StopReason {
    /// The model finished its answer.
    EndTurn,
    /// The model asked for tool calls.
    ToolUse,
    /// The output token limit was reached.
    MaxTokens,
    /// Any other reason the provider gave.
    Other,
}

/// Token accounting for one attempt (one HTTP request, or one local
/// generation). Every attempt, retries included, becomes one usage row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptUsage {
    /// Provider name (e.g. "openai", "anthropic", "local").
    pub provider: String,
    /// Model name.
    pub model: String,
    /// Attempt number, 1-based.
    pub attempt: u32,
    /// Input tokens, when reported.
    pub input_tokens: u64,
    /// Output tokens, when reported.
    pub output_tokens: u64,
    /// Cached input tokens, when reported.
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// Wall time of the attempt in milliseconds.
    pub duration_ms: u64,
    /// Bytes of the request as the turn counts them (messages, system
    /// prompt, tool definitions), recorded by the turn so later estimates
    /// can be calibrated against `input_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<u64>,
    /// HTTP status (or none for local inference / connection errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Why the attempt failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A settled model answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelResponse {
    /// The assistant message (role `Assistant`).
    pub message: Message,
    /// Why it stopped.
    pub stop: StopReason,
    /// One row per attempt, the successful one last.
    pub attempts: Vec<AttemptUsage>,
}

/// What kind of failure a provider call ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub enum ProviderErrorKind {
    /// Could not connect, or the connection broke.
    Connection,
    /// Connect, first-byte, idle or total-time timeout.
    Timeout,
    /// The server answered with an error status.
    Http,
    /// The stream was malformed (bad SSE, bad JSON, cut mid-event).
    Protocol,
    /// Missing key, unknown model, bad configuration.
    Config,
    /// The call was cancelled through the token.
    Cancelled,
    /// The scripted provider ran out of lines, or another local failure.
    Exhausted,
    /// Anything else (local inference failures included).
    Other,
    /// The server refused the request as longer than the model's context
    /// window (the turn compacts and retries once).
    ContextLength,
}

/// A failed provider call, after retries. Carries the usage rows of every
/// attempt so they can be accounted even though nothing is settled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ProviderError {
    /// Failure class.
    pub kind: ProviderErrorKind,
    /// A message for a person: the provider's own message and, for HTTP
    /// errors, the status. Never contains a secret.
    pub message: String,
    /// HTTP status of the last attempt, if any.
    pub status: Option<u16>,
    /// Usage rows of every attempt made.
    pub attempts: Vec<AttemptUsage>,
}

impl ProviderError {
    /// A new error with no attempts recorded.
    pub fn new(kind: ProviderErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), status: None, attempts: Vec::new() }
    }
}

impl ModelResponse {
    /// Refuse an answer that uses one tool-call id twice: such a message
    /// cannot enter the log, because each result names its call by id and
    /// the APIs refuse a history with duplicate ids, so every later request
    /// of the session would fail. The whole answer is refused as a
    /// `Protocol` error (keeping its usage rows) rather than the duplicates
    /// alone, since the ids are in the assistant message itself.
    pub fn refuse_duplicate_call_ids(self) -> Result<Self, ProviderError> {
        let Some(id) = self.message.duplicate_tool_call_id() else {
            return Ok(self);
        };
        let message = format!(
            "the model's answer uses the tool-call id {id:?} for more than one call; it was not used (ids must be unique within a message) — resume to ask again"
        );
        Err(ProviderError { kind: ProviderErrorKind::Protocol, message, status: None, attempts: self.attempts })
    }
}

/// A language model behind one module boundary.
///
/// Implementations live outside the core (HTTP adapters, the scripted
/// provider, the embedded local model). `complete` blocks until the answer
/// is settled or fails; it delivers deltas to `observer` as they arrive and
/// checks `cancel` between chunks.
pub trait Provider {
    /// The provider's name as users type it (e.g. "openai", "scripted").
    fn name(&self) -> &str;
    /// The model this provider will ask.
    fn model(&self) -> &str;
    /// The most tool calls of one answer the turn runs; the turn settles
    /// the calls past it as rejected, with the reason, without running them.
    fn max_tool_calls(&self) -> usize {
        DEFAULT_MAX_TOOL_CALLS
    }
    /// Whether this provider's model takes images in a user message
    /// (`ContentPart::Image`). A turn with images is refused before
    /// anything is recorded when it does not.
    fn accepts_images(&self) -> bool {
        false
    }
    /// The model's context window in tokens, when known (configuration,
    /// the server's metadata, or a default for a well-known model name).
    /// `None`: unbounded as far as cairn knows; requests are not trimmed.
    fn context_window(&self) -> Option<u32> {
        None
    }
    /// The output token bound this provider sends when the request sets
    /// none; the turn reserves it out of the window.
    fn max_output_tokens(&self) -> Option<u32> {
        None
    }
    /// Tokens of `text` by the model's own tokenizer, where one is
    /// available locally (the embedded model). `None`: the turn estimates
    /// from bytes, calibrated by the usage the API reports.
    fn count_tokens(&self, _text: &str) -> Option<u64> {
        None
    }
    /// A cheaper provider that writes compaction summaries
    /// (`compaction_model`); `None` uses this one.
    fn compaction_provider(&self) -> Option<&dyn Provider> {
        None
    }
    /// Make one model call (with the provider's own retries).
    fn complete(
        &self,
        request: &ModelRequest<'_>,
        observer: &mut dyn FnMut(&StreamEvent),
        cancel: &CancelToken,
    ) -> Result<ModelResponse, ProviderError>;
}
