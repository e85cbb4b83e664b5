//! The three wire APIs: request bodies built from the neutral history, and
//! stream decoders that turn server-sent events into [`StreamEvent`]s and one
//! settled assistant [`Message`].
//!
//! This module owns the shapes of the APIs and nothing else: no sockets, no
//! retries, no timeouts (see `http`). A decoder never emits a settled
//! message before its API's terminal event (or, for Chat Completions, a
//! finish reason), so a cut stream can never settle half an answer.

pub(crate) mod anthropic;
pub(crate) mod chat;
pub(crate) mod responses;

use cairn_core::message::{ContentPart, Message};
use cairn_core::provider::{ProviderErrorKind, StopReason, StreamEvent};
use serde_json::Value;

use crate::sse::SseEvent;

/// Request options that come from the provider's configuration.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Options {
    /// Output bound when the request has none (Anthropic requires one).
    pub(crate) default_max: u32,
    pub(crate) reasoning_effort: Option<String>,
    pub(crate) thinking_budget: Option<u32>,
    pub(crate) encrypted_reasoning: bool,
    /// Chat Completions: send `max_tokens` (what local servers know) instead
    /// of OpenAI's `max_completion_tokens`.
    pub(crate) legacy_max_tokens: bool,
}

/// Token counts reported by the server for one attempt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) input: u64,
    pub(crate) output: u64,
    pub(crate) cached: u64,
}

/// A successful stream.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settled {
    pub(crate) message: Message,
    pub(crate) stop: StopReason,
}

/// A failure found in the stream itself.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StreamError {
    pub(crate) kind: ProviderErrorKind,
    pub(crate) message: String,
    pub(crate) retryable: bool,
}

impl StreamError {
    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Self { kind: ProviderErrorKind::Protocol, message: message.into(), retryable: false }
    }

    /// The stream stopped early: like a broken connection, worth a retry.
    pub(crate) fn cut(message: impl Into<String>) -> Self {
        Self { kind: ProviderErrorKind::Connection, message: message.into(), retryable: true }
    }
}

/// Consumes one API's events.
pub(crate) trait Decoder {
    /// Handle one event; `Ok(true)` when it was the terminal event.
    fn event(&mut self, event: &SseEvent, emit: &mut dyn FnMut(StreamEvent)) -> Result<bool, StreamError>;
    /// The stream is over (`terminal`: the terminal event was seen). Returns
    /// the settled answer or why there is none.
    fn finish(&mut self, terminal: bool) -> Result<Settled, StreamError>;
    /// Usage seen so far (also for failed attempts).
    fn usage(&self) -> Usage;
    /// Bytes of content held for the settled message so far (an upper
    /// bound: text, reasoning, tool-call ids, names and arguments, whole
    /// items where the API sends whole items), so the caller can cap it.
    fn held_bytes(&self) -> usize;
}

/// Parse one event's data as JSON, with a clear error naming the event.
pub(crate) fn json(event: &SseEvent) -> Result<Value, StreamError> {
    serde_json::from_str(&event.data).map_err(|e| {
        let mut shown: String = event.data.chars().take(120).collect();
        if shown.len() < event.data.len() {
            shown.push('…');
        }
        StreamError::protocol(format!("the server sent invalid JSON in a stream event ({e}): {shown}"))
    })
}

/// The arguments a model produced, as JSON: the parsed object, `{}` for no
/// text, or the raw text as a JSON string when it does not parse (so the
/// turn can reject it with a reason instead of losing it).
pub(crate) fn parse_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

/// Arguments as the JSON text the OpenAI APIs expect (raw text kept as is).
pub(crate) fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    }
}

/// A string field of a JSON object, or "".
pub(crate) fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// An unsigned field of a JSON object, or 0.
pub(crate) fn u64_of(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// The text a tool result shows the model; failures are marked because
/// the OpenAI APIs have no error flag.
pub(crate) fn tool_result_text(content: &str, is_error: bool) -> String {
    if is_error { format!("[error] {content}") } else { content.to_owned() }
}

/// Text parts joined, other parts ignored.
pub(crate) fn text_of(parts: &[ContentPart]) -> String {
    let mut out = String::new();
    for part in parts {
        if let ContentPart::Text { text } = part {
            out.push_str(text);
        }
    }
    out
}

/// A provider's own error object (`{"error": {"message", "type", "code"}}`
/// or `{"message"}`), as one line: "message (type, code)".
pub(crate) fn error_object_text(v: &Value) -> Option<String> {
    let obj = match v.get("error") {
        Some(Value::String(s)) => return Some(s.clone()),
        Some(inner @ Value::Object(_)) => inner,
        _ => v,
    };
    let message = obj.get("message").and_then(Value::as_str)?;
    let mut tags: Vec<String> = Vec::new();
    for key in ["type", "code"] {
        match obj.get(key) {
            Some(Value::String(s)) if !s.is_empty() => tags.push(s.clone()),
            Some(Value::Number(n)) => tags.push(n.to_string()),
            _ => {}
        }
    }
    tags.dedup();
    if tags.is_empty() { Some(message.to_owned()) } else { Some(format!("{message} ({})", tags.join(", "))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip() {
        assert_eq!(parse_arguments(""), serde_json::json!({}));
        assert_eq!(parse_arguments("{\"a\":1}"), serde_json::json!({"a": 1}));
        assert_eq!(parse_arguments("{\"a\":"), Value::String("{\"a\":".into()));
        assert_eq!(arguments_text(&serde_json::json!({"a": 1})), "{\"a\":1}");
        assert_eq!(arguments_text(&Value::String("{\"a\":".into())), "{\"a\":");
    }

    #[test]
    fn error_objects() {
        let v = serde_json::json!({"error": {"message": "Bad key", "type": "invalid_request_error", "code": "invalid_api_key"}});
        assert_eq!(error_object_text(&v).unwrap(), "Bad key (invalid_request_error, invalid_api_key)");
        let v = serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        assert_eq!(error_object_text(&v).unwrap(), "Overloaded (overloaded_error)");
        assert_eq!(error_object_text(&serde_json::json!({"error": "boom"})).unwrap(), "boom");
        assert_eq!(error_object_text(&serde_json::json!({"x": 1})), None);
    }
}
