//! OpenAI Chat Completions (`POST {base}/chat/completions`, streamed), the
//! API Ollama, llama.cpp, vLLM and LM Studio also speak.
//!
//! Owns the request body (messages, tools, `stream_options.include_usage`)
//! and the chunk decoder (text deltas, tool-call deltas assembled by index,
//! `finish_reason`, the usage chunk, `[DONE]`). Reasoning the API cannot take
//! back (it has no pass-back field) is dropped from requests.

use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::provider::{ModelRequest, StopReason, StreamEvent};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::Value;
#[cfg(test)]
use serde_json::json;

use super::{
    ArgumentsText, DataUrl, Decoder, Joined, Options, ResultText, Seq, Settled, StreamError, Usage, has_image,
    has_text, json, parse_arguments, str_of, u64_of,
};
#[cfg(test)]
use super::{arguments_text, text_of};
use crate::sse::SseEvent;

/// The request body, serialised straight from the borrowed request (no
/// intermediate JSON tree: a long history is not held twice). Keys are
/// written in sorted order, as a `serde_json::Value` would print them.
pub(crate) struct Body<'a> {
    pub(crate) model: &'a str,
    pub(crate) request: &'a ModelRequest<'a>,
    pub(crate) options: &'a Options,
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (request, options) = (self.request, self.options);
        let mut map = s.serialize_map(None)?;
        // Always bounded: the turn reserves this much of the window for it.
        let max = request.max_output_tokens.unwrap_or(options.default_max);
        let key = if options.legacy_max_tokens { "max_tokens" } else { "max_completion_tokens" };
        map.serialize_entry(key, &max)?;
        let system = request.system.map(ChatMessage::System);
        let rest = request.messages.iter().flat_map(chat_messages);
        map.serialize_entry("messages", &Seq::new(system.into_iter().chain(rest)))?;
        map.serialize_entry("model", self.model)?;
        if let Some(effort) = &options.reasoning_effort {
            map.serialize_entry("reasoning_effort", effort)?;
        }
        map.serialize_entry("stream", &true)?;
        map.serialize_entry("stream_options", &IncludeUsage)?;
        if !request.tools.is_empty() {
            map.serialize_entry("tools", &Seq::new(request.tools.iter().map(FunctionTool)))?;
        }
        map.end()
    }
}

struct IncludeUsage;

impl Serialize for IncludeUsage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry("include_usage", &true)?;
        map.end()
    }
}

struct FunctionTool<'a>(&'a cairn_core::tool::ToolSpec);

impl Serialize for FunctionTool<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Function<'a>(&'a cairn_core::tool::ToolSpec);
        impl Serialize for Function<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut map = s.serialize_map(Some(3))?;
                map.serialize_entry("description", &self.0.description)?;
                map.serialize_entry("name", &self.0.name)?;
                map.serialize_entry("parameters", &self.0.input_schema)?;
                map.end()
            }
        }
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("function", &Function(self.0))?;
        map.serialize_entry("type", "function")?;
        map.end()
    }
}

/// A user message's content with images: its text as one `text` part,
/// then each image as an `image_url` part holding a `data:` URL.
struct WithImages<'a>(&'a [ContentPart]);

impl Serialize for WithImages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Part<'a>(&'a ContentPart);
        impl Serialize for Part<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut map = s.serialize_map(Some(2))?;
                if let ContentPart::Image { mime_type, data } = self.0 {
                    struct Url<'a>(DataUrl<'a>);
                    impl Serialize for Url<'_> {
                        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                            let mut map = s.serialize_map(Some(1))?;
                            map.serialize_entry("url", &self.0)?;
                            map.end()
                        }
                    }
                    map.serialize_entry("image_url", &Url(DataUrl { mime_type, data }))?;
                    map.serialize_entry("type", "image_url")?;
                }
                map.end()
            }
        }
        let images = self.0.iter().filter(|p| matches!(p, ContentPart::Image { .. })).map(Part);
        let mut seq = s.serialize_seq(None)?;
        if has_text(self.0) {
            seq.serialize_element(&TextPart(self.0))?;
        }
        for image in images {
            seq.serialize_element(&image)?;
        }
        seq.end()
    }
}

/// The text parts of a message as one `{"text", "type": "text"}` part.
struct TextPart<'a>(&'a [ContentPart]);

impl Serialize for TextPart<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("text", &Joined(self.0))?;
        map.serialize_entry("type", "text")?;
        map.end()
    }
}

/// One message of the body, borrowed from the history.
enum ChatMessage<'a> {
    System(&'a str),
    Tool { call_id: &'a str, content: &'a str, is_error: bool },
    Text { role: &'static str, parts: &'a [ContentPart] },
    Assistant(&'a Message),
}

/// The body's messages for one history message: its tool results as
/// `tool` messages (whatever role carries them), then its text or calls.
fn chat_messages(message: &Message) -> impl Iterator<Item = ChatMessage<'_>> {
    let results = message.content.iter().filter_map(|part| match part {
        ContentPart::ToolResult { call_id, content, is_error } => {
            Some(ChatMessage::Tool { call_id, content, is_error: *is_error })
        }
        _ => None,
    });
    let text = has_text(&message.content);
    let main = match message.role {
        Role::System if text => Some(ChatMessage::Text { role: "system", parts: &message.content }),
        Role::User if text || has_image(&message.content) => {
            Some(ChatMessage::Text { role: "user", parts: &message.content })
        }
        Role::Assistant if text || message.tool_calls().next().is_some() => Some(ChatMessage::Assistant(message)),
        _ => None,
    };
    results.chain(main)
}

impl Serialize for ChatMessage<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        match self {
            ChatMessage::System(text) => {
                map.serialize_entry("content", text)?;
                map.serialize_entry("role", "system")?;
            }
            ChatMessage::Tool { call_id, content, is_error } => {
                map.serialize_entry("content", &ResultText { content, is_error: *is_error })?;
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", call_id)?;
            }
            ChatMessage::Text { role, parts } if *role == "user" && has_image(parts) => {
                map.serialize_entry("content", &WithImages(parts))?;
                map.serialize_entry("role", role)?;
            }
            ChatMessage::Text { role, parts } => {
                map.serialize_entry("content", &Joined(parts))?;
                map.serialize_entry("role", role)?;
            }
            ChatMessage::Assistant(message) => {
                if has_text(&message.content) {
                    map.serialize_entry("content", &Joined(&message.content))?;
                } else {
                    map.serialize_entry("content", &())?;
                }
                map.serialize_entry("role", "assistant")?;
                if message.tool_calls().next().is_some() {
                    let calls = message.tool_calls().map(ChatCall);
                    map.serialize_entry("tool_calls", &Seq::new(calls))?;
                }
            }
        }
        map.end()
    }
}

struct ChatCall<'a>(&'a ToolCall);

impl Serialize for ChatCall<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Function<'a>(&'a ToolCall);
        impl Serialize for Function<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut map = s.serialize_map(Some(2))?;
                map.serialize_entry("arguments", &ArgumentsText(&self.0.arguments))?;
                map.serialize_entry("name", &self.0.name)?;
                map.end()
            }
        }
        let mut map = s.serialize_map(Some(3))?;
        map.serialize_entry("function", &Function(self.0))?;
        map.serialize_entry("id", &self.0.id)?;
        map.serialize_entry("type", "function")?;
        map.end()
    }
}

/// The request body as a JSON tree: the shape [`Body`] writes, built the
/// way it was before (kept as the tests' independent oracle).
#[cfg(test)]
pub(crate) fn body(model: &str, request: &ModelRequest<'_>, options: &Options) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = request.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for message in request.messages {
        push_message(&mut messages, message);
    }
    let mut body = json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.input_schema}})
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    // Always bounded: the turn reserves this much of the window for it.
    let max = request.max_output_tokens.unwrap_or(options.default_max);
    let key = if options.legacy_max_tokens { "max_tokens" } else { "max_completion_tokens" };
    body[key] = json!(max);
    if let Some(effort) = &options.reasoning_effort {
        body["reasoning_effort"] = json!(effort);
    }
    body
}

#[cfg(test)]
fn push_message(out: &mut Vec<Value>, message: &Message) {
    // Tool results become `tool` messages whatever role carries them.
    for part in &message.content {
        if let ContentPart::ToolResult { call_id, content, is_error } = part {
            out.push(json!({"role": "tool", "tool_call_id": call_id,
                "content": super::tool_result_text(content, *is_error)}));
        }
    }
    let text = text_of(&message.content);
    let images: Vec<Value> = message
        .content
        .iter()
        .filter_map(|p| match p {
            ContentPart::Image { mime_type, data } => {
                Some(json!({"type": "image_url", "image_url": {"url": format!("data:{mime_type};base64,{data}")}}))
            }
            _ => None,
        })
        .collect();
    match message.role {
        Role::User if !images.is_empty() => {
            let mut parts = if text.is_empty() { Vec::new() } else { vec![json!({"type": "text", "text": text})] };
            parts.extend(images);
            out.push(json!({"role": "user", "content": parts}));
        }
        Role::System if !text.is_empty() => out.push(json!({"role": "system", "content": text})),
        Role::User if !text.is_empty() => out.push(json!({"role": "user", "content": text})),
        Role::Assistant => {
            let calls: Vec<Value> = message
                .tool_calls()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": arguments_text(&c.arguments)}})
                })
                .collect();
            if text.is_empty() && calls.is_empty() {
                return;
            }
            let mut m =
                json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!(text) }});
            if !calls.is_empty() {
                m["tool_calls"] = Value::Array(calls);
            }
            out.push(m);
        }
        _ => {}
    }
}

#[derive(Debug, Default)]
struct Slot {
    id: String,
    name: String,
    arguments: String,
    announced: bool,
}

/// Decoder state for one attempt.
#[derive(Debug, Default)]
pub(crate) struct ChatDecoder {
    text: String,
    reasoning: String,
    /// Tool calls by the server's `index`, in first-seen order.
    slots: Vec<(u64, Slot)>,
    finish: Option<String>,
    usage: Usage,
    /// Bytes pushed into `text`, `reasoning` and the slots.
    held: usize,
}

impl ChatDecoder {
    fn tool_delta(&mut self, position: usize, delta: &Value, emit: &mut dyn FnMut(StreamEvent)) {
        let index = delta.get("index").and_then(Value::as_u64).unwrap_or(position as u64);
        let slot_pos = match self.slots.iter().position(|(i, _)| *i == index) {
            Some(p) => p,
            None => {
                self.slots.push((index, Slot::default()));
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[slot_pos].1;
        let id = str_of(delta, "id");
        if !id.is_empty() {
            slot.id = id.to_owned();
        }
        let function = delta.get("function").cloned().unwrap_or(Value::Null);
        let name = str_of(&function, "name");
        if !name.is_empty() {
            slot.name.push_str(name);
        }
        let args = str_of(&function, "arguments");
        self.held = self.held.saturating_add(id.len() + name.len() + args.len());
        if !slot.announced && !slot.name.is_empty() {
            if slot.id.is_empty() {
                // Some local servers omit ids; make one unique in the session
                // (Anthropic refuses duplicate tool_use ids if the session
                // moves there) so results can refer to it.
                let suffix: String = std::iter::repeat_with(fastrand::alphanumeric).take(12).collect();
                slot.id = format!("call_{index}_{suffix}");
            }
            slot.announced = true;
            emit(StreamEvent::ToolCallStarted { id: slot.id.clone(), name: slot.name.clone() });
            if !slot.arguments.is_empty() {
                emit(StreamEvent::ToolCallDelta { id: slot.id.clone(), arguments: slot.arguments.clone() });
            }
        }
        if !args.is_empty() {
            slot.arguments.push_str(args);
            if slot.announced {
                emit(StreamEvent::ToolCallDelta { id: slot.id.clone(), arguments: args.to_owned() });
            }
        }
    }
}

impl Decoder for ChatDecoder {
    fn event(&mut self, event: &SseEvent, emit: &mut dyn FnMut(StreamEvent)) -> Result<bool, StreamError> {
        if event.data.trim() == "[DONE]" {
            return Ok(true);
        }
        let chunk = json(event)?;
        if chunk.get("error").is_some() {
            let message = super::error_object_text(&chunk).unwrap_or_else(|| chunk.to_string());
            return Err(StreamError::protocol(format!("the server reported an error mid-stream: {message}")));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage.input = u64_of(usage, "prompt_tokens");
            self.usage.output = u64_of(usage, "completion_tokens");
            self.usage.cached =
                usage.get("prompt_tokens_details").map(|d| u64_of(d, "cached_tokens")).unwrap_or_default();
        }
        let Some(choice) = chunk.get("choices").and_then(Value::as_array).and_then(|c| c.first()) else {
            return Ok(false);
        };
        if let Some(delta) = choice.get("delta") {
            if let Some(text) = delta.get("content").and_then(Value::as_str).filter(|t| !t.is_empty()) {
                self.text.push_str(text);
                self.held = self.held.saturating_add(text.len());
                emit(StreamEvent::TextDelta { text: text.to_owned() });
            }
            // llama.cpp, vLLM and DeepSeek stream reasoning under one of these.
            for key in ["reasoning_content", "reasoning"] {
                if let Some(text) = delta.get(key).and_then(Value::as_str).filter(|t| !t.is_empty()) {
                    self.reasoning.push_str(text);
                    self.held = self.held.saturating_add(text.len());
                    emit(StreamEvent::ReasoningDelta { text: text.to_owned() });
                }
            }
            if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
                for (position, call) in calls.iter().enumerate() {
                    self.tool_delta(position, call, emit);
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(reason.to_owned());
        }
        Ok(false)
    }

    fn finish(&mut self, terminal: bool) -> Result<Settled, StreamError> {
        // Without `[DONE]` the answer is still complete once a finish reason
        // arrived (only the usage chunk may be missing).
        if !terminal && self.finish.is_none() {
            return Err(StreamError::cut(
                "the stream ended before the model finished (no finish_reason and no [DONE])",
            ));
        }
        let mut content = Vec::new();
        if !self.reasoning.is_empty() {
            content.push(ContentPart::Reasoning {
                text: std::mem::take(&mut self.reasoning),
                provider: "openai-chat".to_owned(),
                opaque: None,
            });
        }
        if !self.text.is_empty() {
            content.push(ContentPart::Text { text: std::mem::take(&mut self.text) });
        }
        for (_, slot) in self.slots.drain(..) {
            if slot.name.is_empty() {
                return Err(StreamError::protocol("the server sent a tool call without a name"));
            }
            content.push(ContentPart::ToolCall(ToolCall {
                id: slot.id,
                name: slot.name,
                arguments: parse_arguments(&slot.arguments),
            }));
        }
        let has_calls = content.iter().any(|p| matches!(p, ContentPart::ToolCall(_)));
        let stop = match self.finish.as_deref() {
            Some("length") => StopReason::MaxTokens,
            _ if has_calls => StopReason::ToolUse,
            Some("stop") | None => StopReason::EndTurn,
            Some(_) => StopReason::Other,
        };
        Ok(Settled { message: Message { role: Role::Assistant, content }, stop })
    }

    fn usage(&self) -> Usage {
        self.usage
    }

    fn held_bytes(&self) -> usize {
        self.held
    }
}
