//! OpenAI Responses (`POST {base}/responses`, streamed, `store: false`).
//!
//! Owns the request body (input items, function tools, `include:
//! ["reasoning.encrypted_content"]` so reasoning can be passed back without
//! server-side storage) and the event decoder (`response.output_text.delta`,
//! `response.function_call_arguments.delta`, `response.output_item.done`,
//! `response.completed` with usage, `response.failed`, `error`). The settled
//! message is built from the complete items of `response.output_item.done`
//! (or `response.completed`'s output), never from deltas alone.

use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::provider::{ModelRequest, ProviderErrorKind, StopReason, StreamEvent};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;
#[cfg(test)]
use serde_json::json;

#[cfg(test)]
use super::arguments_text;
use super::{
    ArgumentsText, DataUrl, Decoder, Options, ResultText, Seq, Settled, StreamError, Usage, json, parse_arguments,
    str_of, u64_of,
};
use crate::sse::SseEvent;

/// The tag of reasoning this API produces and accepts back.
pub(crate) const TAG: &str = "openai-responses";

/// The request body, serialised straight from the borrowed request (keys
/// in sorted order, as a `serde_json::Value` prints them).
pub(crate) struct Body<'a> {
    pub(crate) model: &'a str,
    pub(crate) request: &'a ModelRequest<'a>,
    pub(crate) options: &'a Options,
}

impl Serialize for Body<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (request, options) = (self.request, self.options);
        let mut map = s.serialize_map(None)?;
        if options.encrypted_reasoning {
            map.serialize_entry("include", &["reasoning.encrypted_content"])?;
        }
        map.serialize_entry("input", &Seq::new(request.messages.iter().flat_map(items)))?;
        if let Some(system) = request.system {
            map.serialize_entry("instructions", system)?;
        }
        // Always bounded: the turn reserves this much of the window for it.
        map.serialize_entry("max_output_tokens", &request.max_output_tokens.unwrap_or(options.default_max))?;
        map.serialize_entry("model", self.model)?;
        if let Some(effort) = &options.reasoning_effort {
            map.serialize_entry("reasoning", &Effort(effort))?;
        }
        map.serialize_entry("store", &false)?;
        map.serialize_entry("stream", &true)?;
        if !request.tools.is_empty() {
            map.serialize_entry("tools", &Seq::new(request.tools.iter().map(FunctionTool)))?;
        }
        map.end()
    }
}

struct Effort<'a>(&'a str);

impl Serialize for Effort<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("effort", self.0)?;
        map.serialize_entry("summary", "auto")?;
        map.end()
    }
}

struct FunctionTool<'a>(&'a cairn_core::tool::ToolSpec);

impl Serialize for FunctionTool<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(5))?;
        map.serialize_entry("description", &self.0.description)?;
        map.serialize_entry("name", &self.0.name)?;
        map.serialize_entry("parameters", &self.0.input_schema)?;
        map.serialize_entry("strict", &false)?;
        map.serialize_entry("type", "function")?;
        map.end()
    }
}

/// One input item, borrowed from the history.
enum Item<'a> {
    Text {
        role: &'static str,
        kind: &'static str,
        text: &'a str,
    },
    Call(&'a ToolCall),
    Output {
        call_id: &'a str,
        content: &'a str,
        is_error: bool,
    },
    /// A user message of one `input_image` holding a `data:` URL.
    Image {
        mime_type: &'a str,
        data: &'a str,
    },
    Opaque(&'a Value),
}

fn items(message: &Message) -> impl Iterator<Item = Item<'_>> {
    let (role, kind) = match message.role {
        Role::System => ("developer", "input_text"),
        Role::User | Role::Tool => ("user", "input_text"),
        Role::Assistant => ("assistant", "output_text"),
    };
    message.content.iter().filter_map(move |part| match part {
        ContentPart::Text { text } if !text.is_empty() => Some(Item::Text { role, kind, text }),
        ContentPart::Text { .. } => None,
        ContentPart::ToolCall(call) => Some(Item::Call(call)),
        ContentPart::ToolResult { call_id, content, is_error } => {
            Some(Item::Output { call_id, content, is_error: *is_error })
        }
        ContentPart::Reasoning { provider, opaque: Some(item), .. } if provider == TAG => Some(Item::Opaque(item)),
        // Reasoning of another provider kind cannot be passed back.
        ContentPart::Reasoning { .. } => None,
        ContentPart::Image { mime_type, data } => Some(Item::Image { mime_type, data }),
    })
}

impl Serialize for Item<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Part<'a>(&'static str, &'a str);
        impl Serialize for Part<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut map = s.serialize_map(Some(2))?;
                map.serialize_entry("text", self.1)?;
                map.serialize_entry("type", self.0)?;
                map.end()
            }
        }
        let mut map = match self {
            Item::Opaque(value) => return value.serialize(s),
            _ => s.serialize_map(None)?,
        };
        match self {
            Item::Text { role, kind, text } => {
                map.serialize_entry("content", &[Part(kind, text)])?;
                map.serialize_entry("role", role)?;
                map.serialize_entry("type", "message")?;
            }
            Item::Call(call) => {
                map.serialize_entry("arguments", &ArgumentsText(&call.arguments))?;
                map.serialize_entry("call_id", &call.id)?;
                map.serialize_entry("name", &call.name)?;
                map.serialize_entry("type", "function_call")?;
            }
            Item::Output { call_id, content, is_error } => {
                map.serialize_entry("call_id", call_id)?;
                map.serialize_entry("output", &ResultText { content, is_error: *is_error })?;
                map.serialize_entry("type", "function_call_output")?;
            }
            Item::Image { mime_type, data } => {
                struct Input<'a>(DataUrl<'a>);
                impl Serialize for Input<'_> {
                    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                        let mut map = s.serialize_map(Some(2))?;
                        map.serialize_entry("image_url", &self.0)?;
                        map.serialize_entry("type", "input_image")?;
                        map.end()
                    }
                }
                map.serialize_entry("content", &[Input(DataUrl { mime_type, data })])?;
                map.serialize_entry("role", "user")?;
                map.serialize_entry("type", "message")?;
            }
            Item::Opaque(_) => {}
        }
        map.end()
    }
}

/// The request body as a JSON tree, built the way it was before [`Body`]
/// (kept as the tests' independent oracle).
#[cfg(test)]
pub(crate) fn body(model: &str, request: &ModelRequest<'_>, options: &Options) -> Value {
    let mut input = Vec::new();
    for message in request.messages {
        push_items(&mut input, message);
    }
    let mut body = json!({
        "model": model,
        "input": input,
        "stream": true,
        "store": false,
    });
    if options.encrypted_reasoning {
        body["include"] = json!(["reasoning.encrypted_content"]);
    }
    if let Some(effort) = &options.reasoning_effort {
        body["reasoning"] = json!({"effort": effort, "summary": "auto"});
    }
    if let Some(system) = request.system {
        body["instructions"] = json!(system);
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "name": t.name, "description": t.description,
                    "parameters": t.input_schema, "strict": false})
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    // Always bounded: the turn reserves this much of the window for it.
    body["max_output_tokens"] = json!(request.max_output_tokens.unwrap_or(options.default_max));
    body
}

#[cfg(test)]
fn text_message(role: &str, kind: &str, text: &str) -> Value {
    json!({"type": "message", "role": role, "content": [{"type": kind, "text": text}]})
}

#[cfg(test)]
fn push_items(out: &mut Vec<Value>, message: &Message) {
    let (role, kind) = match message.role {
        Role::System => ("developer", "input_text"),
        Role::User | Role::Tool => ("user", "input_text"),
        Role::Assistant => ("assistant", "output_text"),
    };
    for part in &message.content {
        match part {
            ContentPart::Text { text } if !text.is_empty() => out.push(text_message(role, kind, text)),
            ContentPart::Text { .. } => {}
            ContentPart::ToolCall(call) => out.push(json!({"type": "function_call", "call_id": call.id,
                "name": call.name, "arguments": arguments_text(&call.arguments)})),
            ContentPart::ToolResult { call_id, content, is_error } => out.push(json!({
                "type": "function_call_output", "call_id": call_id,
                "output": super::tool_result_text(content, *is_error)})),
            ContentPart::Reasoning { provider, opaque: Some(item), .. } if provider == TAG => out.push(item.clone()),
            // Reasoning of another provider kind cannot be passed back.
            ContentPart::Reasoning { .. } => {}
            ContentPart::Image { mime_type, data } => out.push(json!({"type": "message", "role": "user",
                "content": [{"type": "input_image", "image_url": format!("data:{mime_type};base64,{data}")}]})),
        }
    }
}

/// Decoder state for one attempt.
#[derive(Debug, Default)]
pub(crate) struct ResponsesDecoder {
    /// Complete output items by `output_index`.
    items: Vec<(u64, Value)>,
    /// `item_id` → `call_id` of function calls being streamed.
    call_ids: Vec<(String, String)>,
    status: String,
    incomplete_reason: String,
    usage: Usage,
    /// Bytes of the events whose items are kept in `items`.
    held: usize,
}

fn failure(what: &str, error: &Value) -> StreamError {
    let code = str_of(error, "code");
    let message = super::error_object_text(error).unwrap_or_else(|| error.to_string());
    let retryable = matches!(code, "server_error" | "rate_limit_exceeded" | "server_is_overloaded");
    StreamError { kind: ProviderErrorKind::Http, message: format!("{what}: {message}"), retryable }
}

impl ResponsesDecoder {
    fn read_response(&mut self, response: &Value) {
        self.status = str_of(response, "status").to_owned();
        if let Some(details) = response.get("incomplete_details") {
            self.incomplete_reason = str_of(details, "reason").to_owned();
        }
        if let Some(usage) = response.get("usage").filter(|u| u.is_object()) {
            self.usage.input = u64_of(usage, "input_tokens");
            self.usage.output = u64_of(usage, "output_tokens");
            self.usage.cached =
                usage.get("input_tokens_details").map(|d| u64_of(d, "cached_tokens")).unwrap_or_default();
        }
        if self.items.is_empty()
            && let Some(output) = response.get("output").and_then(Value::as_array)
        {
            self.items = output.iter().enumerate().map(|(i, item)| (i as u64, item.clone())).collect();
        }
    }

    fn call_id(&self, item_id: &str) -> String {
        self.call_ids.iter().find(|(i, _)| i == item_id).map(|(_, c)| c.clone()).unwrap_or_else(|| item_id.to_owned())
    }
}

impl Decoder for ResponsesDecoder {
    fn event(&mut self, event: &SseEvent, emit: &mut dyn FnMut(StreamEvent)) -> Result<bool, StreamError> {
        let v = json(event)?;
        let kind = v.get("type").and_then(Value::as_str).unwrap_or(&event.event);
        match kind {
            "response.output_item.added" => {
                let item = v.get("item").cloned().unwrap_or(Value::Null);
                if str_of(&item, "type") == "function_call" {
                    let call_id = str_of(&item, "call_id").to_owned();
                    self.call_ids.push((str_of(&item, "id").to_owned(), call_id.clone()));
                    emit(StreamEvent::ToolCallStarted { id: call_id, name: str_of(&item, "name").to_owned() });
                }
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                emit(StreamEvent::TextDelta { text: str_of(&v, "delta").to_owned() });
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                emit(StreamEvent::ReasoningDelta { text: str_of(&v, "delta").to_owned() });
            }
            "response.function_call_arguments.delta" => {
                let id = self.call_id(str_of(&v, "item_id"));
                emit(StreamEvent::ToolCallDelta { id, arguments: str_of(&v, "delta").to_owned() });
            }
            "response.output_item.done" => {
                let index = v.get("output_index").and_then(Value::as_u64).unwrap_or(self.items.len() as u64);
                if let Some(item) = v.get("item") {
                    self.held = self.held.saturating_add(event.data.len());
                    self.items.retain(|(i, _)| *i != index);
                    self.items.push((index, item.clone()));
                }
            }
            "response.completed" | "response.incomplete" => {
                if self.items.is_empty() {
                    // The items will be taken from this event's output.
                    self.held = self.held.saturating_add(event.data.len());
                }
                if let Some(response) = v.get("response") {
                    self.read_response(response);
                }
                return Ok(true);
            }
            "response.failed" => {
                let response = v.get("response").cloned().unwrap_or(Value::Null);
                self.read_response(&response);
                let error = response.get("error").cloned().unwrap_or(Value::Null);
                return Err(failure("the response failed", &error));
            }
            "error" => return Err(failure("the server reported an error mid-stream", &v)),
            // created, in_progress, content_part.*, *.done deltas, …
            _ => {}
        }
        Ok(false)
    }

    fn finish(&mut self, terminal: bool) -> Result<Settled, StreamError> {
        if !terminal {
            return Err(StreamError::cut("the stream ended before response.completed"));
        }
        self.items.sort_by_key(|(i, _)| *i);
        let mut content = Vec::new();
        for (_, item) in self.items.drain(..) {
            match str_of(&item, "type") {
                "message" => {
                    let mut text = String::new();
                    for part in item.get("content").and_then(Value::as_array).into_iter().flatten() {
                        match str_of(part, "type") {
                            "output_text" => text.push_str(str_of(part, "text")),
                            "refusal" => text.push_str(str_of(part, "refusal")),
                            _ => {}
                        }
                    }
                    if !text.is_empty() {
                        content.push(ContentPart::Text { text });
                    }
                }
                "function_call" => content.push(ContentPart::ToolCall(ToolCall {
                    id: str_of(&item, "call_id").to_owned(),
                    name: str_of(&item, "name").to_owned(),
                    arguments: parse_arguments(str_of(&item, "arguments")),
                })),
                "reasoning" => {
                    let summary: Vec<&str> = item
                        .get("summary")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|s| str_of(s, "text"))
                        .collect();
                    // Passed back without its id: with `store: false` the
                    // server has no item to look the id up in.
                    let mut opaque = item.clone();
                    if let Some(obj) = opaque.as_object_mut() {
                        obj.remove("id");
                    }
                    content.push(ContentPart::Reasoning {
                        text: summary.join("\n\n"),
                        provider: TAG.to_owned(),
                        opaque: Some(opaque),
                    });
                }
                _ => {}
            }
        }
        let has_calls = content.iter().any(|p| matches!(p, ContentPart::ToolCall(_)));
        let stop = if self.status == "incomplete" && self.incomplete_reason == "max_output_tokens" {
            StopReason::MaxTokens
        } else if has_calls {
            StopReason::ToolUse
        } else if self.status == "completed" || self.status.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::Other
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
