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
#[cfg(test)]
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
#[cfg(test)]
pub(crate) fn tool_result_text(content: &str, is_error: bool) -> String {
    if is_error { format!("[error] {content}") } else { content.to_owned() }
}

/// The text parts of a message, joined, written straight into a body
/// (no joined copy).
pub(crate) struct Joined<'a>(pub(crate) &'a [ContentPart]);

impl std::fmt::Display for Joined<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for part in self.0 {
            if let ContentPart::Text { text } = part {
                f.write_str(text)?;
            }
        }
        Ok(())
    }
}

impl serde::Serialize for Joined<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Whether the joined text parts are non-empty.
pub(crate) fn has_text(parts: &[ContentPart]) -> bool {
    parts.iter().any(|p| matches!(p, ContentPart::Text { text } if !text.is_empty()))
}

/// Whether a message carries an image.
pub(crate) fn has_image(parts: &[ContentPart]) -> bool {
    parts.iter().any(|p| matches!(p, ContentPart::Image { .. }))
}

/// An image as a `data:` URL (how both OpenAI APIs take an inline image).
pub(crate) struct DataUrl<'a> {
    pub(crate) mime_type: &'a str,
    pub(crate) data: &'a str,
}

impl serde::Serialize for DataUrl<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("data:{};base64,{}", self.mime_type, self.data))
    }
}

/// [`tool_result_text`] written straight into a body.
pub(crate) struct ResultText<'a> {
    pub(crate) content: &'a str,
    pub(crate) is_error: bool,
}

impl serde::Serialize for ResultText<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_error {
            s.collect_str(&format_args!("[error] {}", self.content))
        } else {
            s.serialize_str(self.content)
        }
    }
}

/// [`arguments_text`] written straight into a body (a JSON string holding
/// the arguments' JSON text).
pub(crate) struct ArgumentsText<'a>(pub(crate) &'a Value);

impl serde::Serialize for ArgumentsText<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::String(raw) => s.serialize_str(raw),
            other => s.collect_str(other),
        }
    }
}

/// A sequence written from an iterator, for bodies serialised straight
/// from borrowed records (the iterator is taken by the one write).
pub(crate) struct Seq<I>(std::cell::Cell<Option<I>>);

impl<I> Seq<I> {
    pub(crate) fn new(items: I) -> Self {
        Self(std::cell::Cell::new(Some(items)))
    }
}

impl<I: Iterator<Item = T>, T: serde::Serialize> serde::Serialize for Seq<I> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.take() {
            Some(items) => s.collect_seq(items),
            None => Err(serde::ser::Error::custom("a body sequence was written twice")),
        }
    }
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

    /// A pseudo-random history of hostile parts: escapes, control
    /// characters, non-ASCII, empty and blank texts, ids the APIs refuse,
    /// arguments that are not objects, reasoning of every provider tag,
    /// neighbours of one role, system messages among the turns.
    fn hostile_messages(seed: u64, n: usize) -> Vec<Message> {
        use cairn_core::message::{Role, ToolCall};
        use serde_json::json;
        let mut x = seed | 1;
        let mut next = move |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let texts =
            ["", "  \n", "plain", "quote \" back \\ slash", "ctl \u{1}\u{1f}\t\r\n", "é 漢字 🦀 \u{2028}", "</script>"];
        let ids = ["call_1", "", "id with spaces/and:colons", "tool-ü-1", "toolu_01A"];
        let args = [
            json!({"a": [1, 2, {"b": null}], "z": "é"}),
            json!("{\"raw\": "),
            json!(7),
            json!([1, "x"]),
            json!(null),
            json!({}),
        ];
        (0..n)
            .map(|_| {
                let role = [Role::User, Role::Assistant, Role::Tool, Role::System][next(4) as usize];
                let content = (0..next(4))
                    .map(|_| match next(6) {
                        5 => ContentPart::Image {
                            mime_type: ["image/png", "image/jpeg"][next(2) as usize].to_owned(),
                            data: ["iVBORw0KGgo=", "/9j/4AAQ"][next(2) as usize].to_owned(),
                        },
                        0 | 1 => ContentPart::Text { text: texts[next(texts.len() as u64) as usize].to_owned() },
                        2 => ContentPart::ToolCall(ToolCall {
                            id: ids[next(ids.len() as u64) as usize].to_owned(),
                            name: ["read_file", "sh\"ell"][next(2) as usize].to_owned(),
                            arguments: args[next(args.len() as u64) as usize].clone(),
                        }),
                        3 => ContentPart::ToolResult {
                            call_id: ids[next(ids.len() as u64) as usize].to_owned(),
                            content: texts[next(texts.len() as u64) as usize].repeat(3),
                            is_error: next(2) == 0,
                        },
                        _ => ContentPart::Reasoning {
                            text: "thinking \"".to_owned(),
                            provider: ["anthropic", "openai-responses", "openai-chat"][next(3) as usize].to_owned(),
                            opaque: [
                                None,
                                Some(json!({"type": "thinking", "thinking": "t", "signature": "s=="})),
                                Some(json!({"type": "reasoning", "id": "rs_1", "encrypted_content": "e"})),
                                Some(json!({"type": "tool_result", "tool_use_id": "x", "content": "odd"})),
                            ][next(4) as usize]
                                .clone(),
                        },
                    })
                    .collect();
                Message { role, content }
            })
            .collect()
    }

    #[test]
    fn bodies_written_straight_equal_the_json_trees() {
        use cairn_core::provider::{ModelRequest, RequestPurpose};
        use cairn_core::tool::{ReplayPolicy, Risk, ToolSpec};
        use serde_json::json;
        // Byte for byte when `serde_json` sorts object keys (its default);
        // as JSON values otherwise.
        let probe = json!({"b": 1, "a": 2}).to_string();
        let sorted = probe.starts_with(r#"{"a""#);
        let tools = vec![ToolSpec {
            name: "shell".into(),
            description: "Run \"it\"".into(),
            input_schema: json!({"type": "object", "properties": {"argv": {"type": "array"}}}),
            risk: Risk::Write,
            capabilities: Default::default(),
            replay: ReplayPolicy::Never,
        }];
        let mut compared = 0;
        for seed in 1..400u64 {
            let messages = hostile_messages(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), (seed % 17) as usize);
            let options = Options {
                default_max: 1000 + seed as u32,
                reasoning_effort: (seed % 3 == 0).then(|| "high".to_owned()),
                thinking_budget: (seed % 4 == 0).then_some(2048),
                encrypted_reasoning: seed % 2 == 0,
                legacy_max_tokens: seed % 5 < 2,
            };
            let request = ModelRequest {
                system: [None, Some(""), Some("Be \"terse\".\n")][(seed % 3) as usize],
                messages: &messages,
                tools: if seed % 2 == 0 { &tools } else { &[] },
                max_output_tokens: (seed % 3 == 1).then_some(512),
                earlier_assistant_messages: 0,
                purpose: RequestPurpose::Turn,
            };
            let model = "m\"odel";
            let pairs: [(Vec<u8>, Value); 3] = [
                (
                    serde_json::to_vec(&chat::Body { model, request: &request, options: &options }).unwrap(),
                    chat::body(model, &request, &options),
                ),
                (
                    serde_json::to_vec(&anthropic::Body { model, request: &request, options: &options }).unwrap(),
                    anthropic::body(model, &request, &options),
                ),
                (
                    serde_json::to_vec(&responses::Body { model, request: &request, options: &options }).unwrap(),
                    responses::body(model, &request, &options),
                ),
            ];
            for (kind, (bytes, tree)) in pairs.into_iter().enumerate() {
                let parsed: Value = serde_json::from_slice(&bytes).unwrap();
                assert_eq!(parsed, tree, "kind {kind}, seed {seed}");
                if sorted {
                    assert_eq!(String::from_utf8(bytes).unwrap(), tree.to_string(), "kind {kind}, seed {seed}");
                }
                compared += 1;
            }
        }
        assert_eq!(compared, 399 * 3);
    }

    /// A user message with an image, as each API documents an inline
    /// image: Chat Completions `image_url` with a `data:` URL beside a
    /// `text` part, Responses `input_image`, Anthropic a `base64` source.
    #[test]
    fn images_take_each_apis_documented_shape() {
        use cairn_core::message::Role;
        use cairn_core::provider::{ModelRequest, RequestPurpose};
        use serde_json::json;
        let messages = vec![Message {
            role: Role::User,
            content: vec![
                ContentPart::Text { text: "what is this?".into() },
                ContentPart::Image { mime_type: "image/png".into(), data: "iVBORw==".into() },
            ],
        }];
        let request = ModelRequest {
            system: None,
            messages: &messages,
            tools: &[],
            max_output_tokens: None,
            earlier_assistant_messages: 0,
            purpose: RequestPurpose::Turn,
        };
        let options = Options {
            default_max: 100,
            reasoning_effort: None,
            thinking_budget: None,
            encrypted_reasoning: false,
            legacy_max_tokens: false,
        };
        let sent = |bytes: Vec<u8>| serde_json::from_slice::<Value>(&bytes).unwrap();
        let chat = sent(serde_json::to_vec(&chat::Body { model: "m", request: &request, options: &options }).unwrap());
        assert_eq!(
            chat["messages"],
            json!([{"role": "user", "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw=="}},
            ]}])
        );
        let responses =
            sent(serde_json::to_vec(&responses::Body { model: "m", request: &request, options: &options }).unwrap());
        assert_eq!(
            responses["input"][1],
            json!({"type": "message", "role": "user",
                "content": [{"type": "input_image", "image_url": "data:image/png;base64,iVBORw=="}]})
        );
        let anthropic =
            sent(serde_json::to_vec(&anthropic::Body { model: "m", request: &request, options: &options }).unwrap());
        assert_eq!(
            anthropic["messages"][0]["content"][1],
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}})
        );
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
