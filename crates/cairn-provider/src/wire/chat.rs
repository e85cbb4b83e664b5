//! OpenAI Chat Completions (`POST {base}/chat/completions`, streamed), the
//! API Ollama, llama.cpp, vLLM and LM Studio also speak.
//!
//! Owns the request body (messages, tools, `stream_options.include_usage`)
//! and the chunk decoder (text deltas, tool-call deltas assembled by index,
//! `finish_reason`, the usage chunk, `[DONE]`). Reasoning the API cannot take
//! back (it has no pass-back field) is dropped from requests.

use cairn_core::message::{ContentPart, Message, Role, ToolCall};
use cairn_core::provider::{ModelRequest, StopReason, StreamEvent};
use serde_json::{Value, json};

use super::{
    Decoder, Options, Settled, StreamError, Usage, arguments_text, json, parse_arguments, str_of, text_of, u64_of,
};
use crate::sse::SseEvent;

/// The request body.
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

fn push_message(out: &mut Vec<Value>, message: &Message) {
    // Tool results become `tool` messages whatever role carries them.
    for part in &message.content {
        if let ContentPart::ToolResult { call_id, content, is_error } = part {
            out.push(json!({"role": "tool", "tool_call_id": call_id,
                "content": super::tool_result_text(content, *is_error)}));
        }
    }
    let text = text_of(&message.content);
    match message.role {
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
