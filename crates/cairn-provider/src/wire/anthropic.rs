//! Anthropic Messages (`POST {base}/v1/messages`, streamed).
//!
//! Owns the request body (system, alternating user/assistant messages,
//! `tool_use` / `tool_result` blocks, thinking blocks with their signatures
//! passed back verbatim) and the event decoder (`message_start`,
//! `content_block_start/delta/stop` with `text_delta`, `input_json_delta`,
//! `thinking_delta`, `signature_delta`, `message_delta`, `message_stop`,
//! `ping`, `error`). Tool-call ids from other providers are mapped to the
//! characters this API accepts.

use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::provider::{ModelRequest, ProviderErrorKind, StopReason, StreamEvent};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value, json};

use super::{Decoder, Options, Seq, Settled, StreamError, Usage, json, parse_arguments, str_of, text_of, u64_of};
use crate::sse::SseEvent;

/// The tag of reasoning this API produces and accepts back.
pub(crate) const TAG: &str = "anthropic";

/// The `anthropic-version` header value.
pub(crate) const VERSION: &str = "2023-06-01";

/// Tool-use ids must match `^[a-zA-Z0-9_-]+$`.
#[cfg(test)]
fn tool_id(id: &str) -> String {
    let cleaned: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect();
    if cleaned.is_empty() { "toolu_unnamed".to_owned() } else { cleaned }
}

/// [`tool_id`] written straight into a body.
struct ToolId<'a>(&'a str);

impl Serialize for ToolId<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Cleaned<'a>(&'a str);
        impl std::fmt::Display for Cleaned<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                use std::fmt::Write;
                for c in self.0.chars() {
                    f.write_char(if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' })?;
                }
                Ok(())
            }
        }
        if self.0.is_empty() { s.serialize_str("toolu_unnamed") } else { s.collect_str(&Cleaned(self.0)) }
    }
}

/// The request body, serialised straight from the borrowed request (keys
/// in sorted order, as a `serde_json::Value` prints them).
/// `options.default_max` is used when the request sets no bound (the API
/// requires one); with a thinking budget, `max_tokens` is raised above it
/// as the API requires.
pub(crate) struct Body<'a> {
    pub(crate) model: &'a str,
    pub(crate) request: &'a ModelRequest<'a>,
    pub(crate) options: &'a Options,
}

/// One content block, borrowed from the history.
enum OutBlock<'a> {
    Text(&'a str),
    ToolUse(&'a ToolCall),
    ToolResult {
        call_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
    /// A base64 image (`{"type": "image", "source": {"type": "base64", …}}`).
    Image {
        mime_type: &'a str,
        data: &'a str,
    },
    Opaque(&'a Value),
}

impl OutBlock<'_> {
    fn is_tool_result(&self) -> bool {
        match self {
            OutBlock::ToolResult { .. } => true,
            OutBlock::Opaque(v) => str_of(v, "type") == "tool_result",
            _ => false,
        }
    }
}

fn block_refs(message: &Message) -> impl Iterator<Item = OutBlock<'_>> {
    message.content.iter().filter_map(|part| match part {
        ContentPart::Text { text } if !text.trim().is_empty() => Some(OutBlock::Text(text)),
        ContentPart::Text { .. } => None,
        ContentPart::ToolCall(call) => Some(OutBlock::ToolUse(call)),
        ContentPart::ToolResult { call_id, content, is_error } => {
            Some(OutBlock::ToolResult { call_id, content, is_error: *is_error })
        }
        ContentPart::Reasoning { provider, opaque: Some(block), .. } if provider == TAG => {
            Some(OutBlock::Opaque(block))
        }
        ContentPart::Reasoning { .. } => None,
        ContentPart::Image { mime_type, data } => Some(OutBlock::Image { mime_type, data }),
    })
}

impl Serialize for OutBlock<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Wrapped<'a>(&'a Value);
        impl Serialize for Wrapped<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut map = s.serialize_map(Some(1))?;
                map.serialize_entry("arguments", self.0)?;
                map.end()
            }
        }
        let mut map = match self {
            OutBlock::Opaque(value) => return value.serialize(s),
            _ => s.serialize_map(None)?,
        };
        match self {
            OutBlock::Text(text) => {
                map.serialize_entry("text", text)?;
                map.serialize_entry("type", "text")?;
            }
            OutBlock::ToolUse(call) => {
                map.serialize_entry("id", &ToolId(&call.id))?;
                match &call.arguments {
                    Value::Object(_) => map.serialize_entry("input", &call.arguments)?,
                    // The API needs an object; keep what the model produced.
                    other => map.serialize_entry("input", &Wrapped(other))?,
                }
                map.serialize_entry("name", &call.name)?;
                map.serialize_entry("type", "tool_use")?;
            }
            OutBlock::ToolResult { call_id, content, is_error } => {
                map.serialize_entry("content", content)?;
                map.serialize_entry("is_error", is_error)?;
                map.serialize_entry("tool_use_id", &ToolId(call_id))?;
                map.serialize_entry("type", "tool_result")?;
            }
            OutBlock::Image { mime_type, data } => {
                struct Source<'a>(&'a str, &'a str);
                impl Serialize for Source<'_> {
                    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                        let mut map = s.serialize_map(Some(3))?;
                        map.serialize_entry("data", self.1)?;
                        map.serialize_entry("media_type", self.0)?;
                        map.serialize_entry("type", "base64")?;
                        map.end()
                    }
                }
                map.serialize_entry("source", &Source(mime_type, data))?;
                map.serialize_entry("type", "image")?;
            }
            OutBlock::Opaque(_) => {}
        }
        map.end()
    }
}

struct Turn<'a>(&'static str, Vec<OutBlock<'a>>);

impl Serialize for Turn<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("content", &self.1)?;
        map.serialize_entry("role", self.0)?;
        map.end()
    }
}

struct Thinking(u32);

impl Serialize for Thinking {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("budget_tokens", &self.0)?;
        map.serialize_entry("type", "enabled")?;
        map.end()
    }
}

struct FunctionTool<'a>(&'a cairn_core::tool::ToolSpec);

impl Serialize for FunctionTool<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("description", &self.0.description)?;
        map.serialize_entry("input_schema", &self.0.input_schema)?;
        map.serialize_entry("name", &self.0.name)?;
        map.end()
    }
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (request, options) = (self.request, self.options);
        let mut system: Vec<String> = request.system.map(str::to_owned).into_iter().collect();
        // Only references to the history's parts: the turns are regrouped
        // (neighbours of one role merged, results first), never copied.
        let mut turns: Vec<Turn<'_>> = Vec::new();
        for message in request.messages {
            let role = match message.role {
                Role::System => {
                    system.push(text_of(&message.content));
                    continue;
                }
                Role::User | Role::Tool => "user",
                Role::Assistant => "assistant",
            };
            let blocks: Vec<OutBlock<'_>> = block_refs(message).collect();
            if blocks.is_empty() {
                continue;
            }
            match turns.last_mut() {
                // The API wants alternating roles: merge neighbours.
                Some(Turn(last, existing)) if *last == role => existing.extend(blocks),
                _ => turns.push(Turn(role, blocks)),
            }
        }
        for Turn(role, blocks) in &mut turns {
            if *role == "user" {
                // tool_result blocks must come first in a user turn.
                blocks.sort_by_key(|b| !b.is_tool_result());
            }
        }
        let mut max_tokens = request.max_output_tokens.unwrap_or(options.default_max);
        if let Some(budget) = options.thinking_budget {
            max_tokens = max_tokens.max(budget.saturating_add(1024));
        }
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("max_tokens", &max_tokens)?;
        map.serialize_entry("messages", &turns)?;
        map.serialize_entry("model", self.model)?;
        map.serialize_entry("stream", &true)?;
        let system: Vec<String> = system.into_iter().filter(|s| !s.is_empty()).collect();
        if !system.is_empty() {
            map.serialize_entry("system", &system.join("\n\n"))?;
        }
        if let Some(budget) = options.thinking_budget {
            map.serialize_entry("thinking", &Thinking(budget))?;
        }
        if !request.tools.is_empty() {
            map.serialize_entry("tools", &Seq::new(request.tools.iter().map(FunctionTool)))?;
        }
        map.end()
    }
}

/// The request body as a JSON tree, built the way it was before [`Body`]
/// (kept as the tests' independent oracle).
#[cfg(test)]
pub(crate) fn body(model: &str, request: &ModelRequest<'_>, options: &Options) -> Value {
    let mut system: Vec<String> = request.system.map(str::to_owned).into_iter().collect();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in request.messages {
        let (role, blocks) = match message.role {
            Role::System => {
                system.push(text_of(&message.content));
                continue;
            }
            Role::User | Role::Tool => ("user", blocks_of(message)),
            Role::Assistant => ("assistant", blocks_of(message)),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            // The API wants alternating roles: merge neighbours.
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, mut blocks)| {
            if role == "user" {
                // tool_result blocks must come first in a user turn.
                blocks.sort_by_key(|b| str_of(b, "type") != "tool_result");
            }
            json!({"role": role, "content": blocks})
        })
        .collect();
    let mut max_tokens = request.max_output_tokens.unwrap_or(options.default_max);
    if let Some(budget) = options.thinking_budget {
        max_tokens = max_tokens.max(budget.saturating_add(1024));
    }
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "messages": messages,
        "stream": true,
    });
    let system: Vec<String> = system.into_iter().filter(|s| !s.is_empty()).collect();
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if let Some(budget) = options.thinking_budget {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
        body["tools"] = Value::Array(tools);
    }
    body
}

#[cfg(test)]
fn blocks_of(message: &Message) -> Vec<Value> {
    let mut blocks = Vec::new();
    for part in &message.content {
        match part {
            ContentPart::Text { text } if !text.trim().is_empty() => blocks.push(json!({"type": "text", "text": text})),
            ContentPart::Text { .. } => {}
            ContentPart::ToolCall(call) => {
                let input = match &call.arguments {
                    Value::Object(_) => call.arguments.clone(),
                    // The API needs an object; keep what the model produced.
                    other => json!({ "arguments": other }),
                };
                blocks.push(json!({"type": "tool_use", "id": tool_id(&call.id), "name": call.name, "input": input}));
            }
            ContentPart::ToolResult { call_id, content, is_error } => blocks.push(json!({
                "type": "tool_result", "tool_use_id": tool_id(call_id), "content": content, "is_error": is_error})),
            ContentPart::Reasoning { provider, opaque: Some(block), .. } if provider == TAG => {
                blocks.push(block.clone())
            }
            ContentPart::Reasoning { .. } => {}
            ContentPart::Image { mime_type, data } => blocks
                .push(json!({"type": "image", "source": {"type": "base64", "media_type": mime_type, "data": data}})),
        }
    }
    blocks
}

#[derive(Debug)]
enum Block {
    Text(String),
    /// `start` is the input given in `content_block_start` (used when no
    /// `input_json_delta` follows, as some compatible servers do).
    ToolUse {
        id: String,
        name: String,
        json: String,
        start: Value,
    },
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted(Value),
    Other,
}

/// Decoder state for one attempt.
#[derive(Debug, Default)]
pub(crate) struct AnthropicDecoder {
    blocks: Vec<(u64, Block)>,
    stop_reason: Option<String>,
    input: u64,
    cache_read: u64,
    cache_write: u64,
    output: u64,
    /// Bytes of block starts and deltas kept in `blocks`.
    held: usize,
}

impl AnthropicDecoder {
    fn block(&mut self, index: u64) -> Result<&mut Block, StreamError> {
        self.blocks.iter_mut().find(|(i, _)| *i == index).map(|(_, b)| b).ok_or_else(|| {
            StreamError::protocol(format!("a delta arrived for content block {index}, which never started"))
        })
    }

    fn read_usage(&mut self, usage: &Value) {
        // message_delta repeats cumulative counts; keep the largest seen.
        self.input = self.input.max(u64_of(usage, "input_tokens"));
        self.cache_read = self.cache_read.max(u64_of(usage, "cache_read_input_tokens"));
        self.cache_write = self.cache_write.max(u64_of(usage, "cache_creation_input_tokens"));
        self.output = self.output.max(u64_of(usage, "output_tokens"));
    }
}

impl Decoder for AnthropicDecoder {
    fn event(&mut self, event: &SseEvent, emit: &mut dyn FnMut(StreamEvent)) -> Result<bool, StreamError> {
        let v = json(event)?;
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(&event.event);
        match kind {
            "message_start" => {
                if let Some(usage) = v.get("message").and_then(|m| m.get("usage")) {
                    self.read_usage(usage);
                }
            }
            "content_block_start" => {
                // The whole event bounds what the block holds at its start.
                self.held = self.held.saturating_add(event.data.len());
                let index = u64_of(&v, "index");
                let cb = v.get("content_block").cloned().unwrap_or(Value::Null);
                let block = match str_of(&cb, "type") {
                    "text" => {
                        let text = str_of(&cb, "text").to_owned();
                        if !text.is_empty() {
                            emit(StreamEvent::TextDelta { text: text.clone() });
                        }
                        Block::Text(text)
                    }
                    "tool_use" => {
                        let (id, name) = (str_of(&cb, "id").to_owned(), str_of(&cb, "name").to_owned());
                        emit(StreamEvent::ToolCallStarted { id: id.clone(), name: name.clone() });
                        let start = cb.get("input").cloned().unwrap_or(Value::Null);
                        Block::ToolUse { id, name, json: String::new(), start }
                    }
                    "thinking" => Block::Thinking {
                        thinking: str_of(&cb, "thinking").to_owned(),
                        signature: str_of(&cb, "signature").to_owned(),
                    },
                    "redacted_thinking" => Block::Redacted(cb),
                    _ => Block::Other,
                };
                self.blocks.push((index, block));
            }
            "content_block_delta" => {
                let index = u64_of(&v, "index");
                let delta = v.get("delta").cloned().unwrap_or(Value::Null);
                let piece_len = ["text", "partial_json", "thinking", "signature"]
                    .iter()
                    .map(|k| str_of(&delta, k).len())
                    .fold(0usize, usize::saturating_add);
                self.held = self.held.saturating_add(piece_len);
                let block = self.block(index)?;
                match (str_of(&delta, "type"), block) {
                    ("text_delta", Block::Text(text)) => {
                        let piece = str_of(&delta, "text");
                        text.push_str(piece);
                        emit(StreamEvent::TextDelta { text: piece.to_owned() });
                    }
                    ("input_json_delta", Block::ToolUse { id, json, .. }) => {
                        let piece = str_of(&delta, "partial_json");
                        json.push_str(piece);
                        emit(StreamEvent::ToolCallDelta { id: id.clone(), arguments: piece.to_owned() });
                    }
                    ("thinking_delta", Block::Thinking { thinking, .. }) => {
                        let piece = str_of(&delta, "thinking");
                        thinking.push_str(piece);
                        emit(StreamEvent::ReasoningDelta { text: piece.to_owned() });
                    }
                    ("signature_delta", Block::Thinking { signature, .. }) => {
                        signature.push_str(str_of(&delta, "signature"));
                    }
                    // citations and deltas of blocks cairn does not model.
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = v.get("delta").and_then(|d| d.get("stop_reason")).and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(usage) = v.get("usage") {
                    self.read_usage(usage);
                }
            }
            "message_stop" => return Ok(true),
            "error" => {
                let error = v.get("error").cloned().unwrap_or(Value::Null);
                let retryable = matches!(str_of(&error, "type"), "overloaded_error" | "api_error" | "rate_limit_error");
                let message = super::error_object_text(&v).unwrap_or_else(|| v.to_string());
                return Err(StreamError {
                    kind: ProviderErrorKind::Http,
                    message: format!("the server reported an error mid-stream: {message}"),
                    retryable,
                });
            }
            // ping, content_block_stop, unknown future events.
            _ => {}
        }
        Ok(false)
    }

    fn finish(&mut self, terminal: bool) -> Result<Settled, StreamError> {
        if !terminal {
            return Err(StreamError::cut("the stream ended before message_stop"));
        }
        self.blocks.sort_by_key(|(i, _)| *i);
        let mut content = Vec::new();
        for (_, block) in self.blocks.drain(..) {
            match block {
                Block::Text(text) if !text.is_empty() => content.push(ContentPart::Text { text }),
                Block::ToolUse { id, name, json, start } => {
                    let arguments = match start {
                        Value::Object(map) if json.trim().is_empty() && !map.is_empty() => Value::Object(map),
                        _ => parse_arguments(&json),
                    };
                    content.push(ContentPart::ToolCall(ToolCall { id, name, arguments }))
                }
                Block::Thinking { thinking, signature } => {
                    let mut opaque = Map::new();
                    opaque.insert("type".into(), json!("thinking"));
                    opaque.insert("thinking".into(), json!(thinking));
                    opaque.insert("signature".into(), json!(signature));
                    content.push(ContentPart::Reasoning {
                        text: thinking,
                        provider: TAG.to_owned(),
                        opaque: Some(Value::Object(opaque)),
                    });
                }
                Block::Redacted(block) => content.push(ContentPart::Reasoning {
                    text: String::new(),
                    provider: TAG.to_owned(),
                    opaque: Some(block),
                }),
                Block::Text(_) | Block::Other => {}
            }
        }
        let stop = match self.stop_reason.as_deref() {
            Some("end_turn") | Some("stop_sequence") | None => StopReason::EndTurn,
            Some("tool_use") => StopReason::ToolUse,
            Some("max_tokens") => StopReason::MaxTokens,
            Some(_) => StopReason::Other,
        };
        Ok(Settled { message: Message { role: Role::Assistant, content }, stop })
    }

    fn usage(&self) -> Usage {
        // Anthropic counts cache reads and writes apart from `input_tokens`;
        // cairn's rows count all input, cached reads included, like OpenAI.
        Usage { input: self.input + self.cache_read + self.cache_write, output: self.output, cached: self.cache_read }
    }

    fn held_bytes(&self) -> usize {
        self.held
    }
}
